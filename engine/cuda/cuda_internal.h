/* Shared between the CUDA backend's translation units (CUDA C++ only),
 * which together make the module trainerd-cuda.so (engine/cuda/module.h).
 *
 * cuda_backend.cu owns the backend object: devices, streams, memory,
 * copies, error reporting and the module's entry point.  The kernels live
 * in one file per op family (kernels_*.cu), each filling its part of the
 * function table; cuda_nccl.cu fills the collectives.  Every entry point
 * makes its device current first (tr_cuda_use), because the trainer calls
 * a device from more than one host thread over a job's life (its rank
 * thread, and the coordinator for evaluation and monitors).
 */
#ifndef TR_CUDA_INTERNAL_H
#define TR_CUDA_INTERNAL_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "engine/backend.h"
#include "engine/cuda/cuda.h"
#include "engine/cuda/module.h"
}

#define TR_CUDA_ERR_LEN 512
/* Blocks of a reduction's first pass; each writes one partial per
 * quantity, the second pass sums them in index order.  The grid depends
 * only on the problem size, so every reduction is deterministic. */
#define TR_CUDA_RED_SLOTS 1024
/* "No bad label": what cudaMemsetAsync with byte 0xff writes; a bad label
 * is recorded as (row << 32 | the label's float bits), the smallest row
 * winning (atomicMin). */
#define TR_CUDA_NO_BAD_LABEL 0xffffffffffffffffull

/* softmax_ce's label check, read on the host only by `sync`
 * (docs/design.md, "Host waits"): the first bad label since the last
 * sync, on the device and its pinned copy. */
struct cuda_result {
	unsigned long long bad_label;
};

struct cuda_dev {
	int ordinal;                  /* CUDA device number */
	cudaStream_t stream;          /* compute: every kernel, copy and cuBLAS call */
	cudaStream_t copy_stream;     /* to_device_async only: the next step's inputs */
	cudaEvent_t copied;           /* copies_fence: recorded on copy_stream */
	cublasHandle_t blas;          /* bound to `stream` */
	double *partials;             /* device: 2 x TR_CUDA_RED_SLOTS */
	struct cuda_result *result;   /* device */
	struct cuda_result *host_res; /* pinned host mirror of `result` */
	/* A softmax_ce was enqueued since the last sync: `sync` then reports
	 * its bad label, if any (classes: its class count, for the message).
	 * Only the thread driving the device touches these. */
	bool label_pending;
	int label_classes;
	char name[256];
	size_t total_mem;
	int cc_major, cc_minor;
	/* Set once (__atomic, release) when a sticky error (an illegal
	 * address, a launch failure, an ECC error...) broke this device's
	 * context: every later call on it fails with "restart needed".
	 * broken_why is written before the flag and never again. */
	int broken;
	char broken_why[256];
};

struct cuda_backend {
	struct tr_backend base; /* first: tr_backend_t * converts to this */
	tr_backend_i table;
	uint64_t id; /* never reused, unlike the address */
	bool tf32;   /* every device's initial math mode; set_tf32 changes one */
	/* TRAINERD_CUDA_SYNC_LAUNCHES=1: synchronise after every kernel
	 * launch, so that a fault is reported by the launch that caused it
	 * (debugging only: it serialises the host with the device). */
	bool sync_launches;
	int ndev;
	struct cuda_dev *dev;
	/* Times the host waited for a device (host_waits in the table). */
	unsigned long long host_waits;
	pthread_mutex_t err_mu;
	char err[TR_CUDA_ERR_LEN]; /* latest error from any thread, under err_mu */
};

static inline struct cuda_backend *cuda_be(tr_backend_t *be)
{
	return (struct cuda_backend *)be;
}

/* Records a formatted reason for the calling thread and the backend and
 * returns `code` (negative). */
int tr_cuda_set_error(tr_backend_t *be, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* 0 for cudaSuccess; otherwise records "what (file:line): name: text",
 * clears the runtime's pending error and returns -ENOMEM for allocation
 * failures, -EIO for everything else. */
int tr_cuda_check_rt(tr_backend_t *be, cudaError_t e, const char *what, const char *file, int line);
/* After a kernel launch (LAUNCH_CHECK): the launch's own error, and with
 * sync_launches also the kernel's, named after `what`. */
int tr_cuda_launch_check(tr_backend_t *be, const char *what, const char *file, int line);
int tr_cuda_check_blas(tr_backend_t *be, cublasStatus_t s, const char *what, const char *file, int line);
/* Counts one host wait (engine/backend.h, host_waits). */
static inline void tr_cuda_count_wait(tr_backend_t *be)
{
	__atomic_add_fetch(&cuda_be(be)->host_waits, 1, __ATOMIC_RELAXED);
}
/* Checks that dev exists and makes it current for the calling thread. */
int tr_cuda_use(tr_backend_t *be, int dev, const char *what);

/* Each kernel family fills its part of the table (kernels_*.cu). */
void tr_cuda_dense_fill(tr_backend_i *t);
void tr_cuda_elementwise_fill(tr_backend_i *t);
void tr_cuda_reduce_fill(tr_backend_i *t);
void tr_cuda_norm_fill(tr_backend_i *t);
void tr_cuda_norm2d_fill(tr_backend_i *t);
void tr_cuda_loss_fill(tr_backend_i *t);
void tr_cuda_optim_fill(tr_backend_i *t);
void tr_cuda_conv_fill(tr_backend_i *t);
void tr_cuda_comm_fill(tr_backend_i *t);
/* Proves that this build's kernels can run on device dev (a binary or a
 * PTX image that the driver accepts); a clear error otherwise. */
int tr_cuda_kernels_probe(tr_backend_t *be, int dev);

#define CUDA_CHECK(be, stmt)                                                         \
	do {                                                                         \
		int rc_ = tr_cuda_check_rt((be), (stmt), #stmt, __FILE__, __LINE__); \
		if (rc_)                                                             \
			return rc_;                                                  \
	} while (0)

#define CUBLAS_CHECK(be, stmt)                                                         \
	do {                                                                           \
		int rc_ = tr_cuda_check_blas((be), (stmt), #stmt, __FILE__, __LINE__); \
		if (rc_)                                                               \
			return rc_;                                                    \
	} while (0)

/* After a kernel launch: configuration errors show up here, faults inside
 * the kernel at the next synchronising call (at once with
 * TRAINERD_CUDA_SYNC_LAUNCHES=1). */
#define LAUNCH_CHECK(be, kernel)                                                            \
	do {                                                                                \
		int rc_ = tr_cuda_launch_check((be), "launch " kernel, __FILE__, __LINE__); \
		if (rc_)                                                                    \
			return rc_;                                                         \
	} while (0)

#endif
