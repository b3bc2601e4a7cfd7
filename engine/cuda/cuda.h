/* CUDA backend extras beyond engine/backend.h: creation options and a
 * device-memory estimate for admission control.
 *
 * Everything here is plain C and is available in every build.  The
 * backend itself is a module, trainerd-cuda.so, that engine/cuda/loader.c
 * loads on the first call that needs a GPU (engine/cuda/module.h says
 * where it looks); the estimate is host arithmetic over the model and
 * stays in the engine, which hands it to the module for its table.
 */
#ifndef TR_CUDA_H
#define TR_CUDA_H

#include <stdbool.h>
#include <stddef.h>

#include "core/error.h"
#include "engine/backend.h"

struct tr_model; /* engine/model/model.h */

struct tr_cuda_options {
	/* Let cuBLAS round gemm inputs to TF32 (10-bit mantissa) on tensor
	 * cores: several times faster on A100/H100, relative error ~1e-3
	 * instead of ~1e-6.  Off by default, so that CUDA results match the
	 * CPU reference; only gemm is affected, never the other kernels. */
	bool tf32;
	/* Use at most this many of the visible devices (in CUDA order, which
	 * CUDA_VISIBLE_DEVICES controls); 0 = all. */
	int max_devices;
	/* The module to load; NULL or "" = TRAINERD_CUDA_MODULE, else next to
	 * the executable, else the install's libdir (engine/cuda/module.h). */
	const char *module_path;
};

/* Creates the CUDA backend over the visible devices.  opt may be NULL
 * (defaults: no TF32, all devices).  Returns NULL with a reason in err
 * when there is no driver, no device, no module, or a device cannot run
 * the module's kernels; never exits.  Free with tr_backend_destroy.
 * Commands open backends with tr_backend_open (engine/backend.h). */
tr_backend_t *tr_cuda_backend_create_opts(const struct tr_cuda_options *opt, struct tr_error *err);

/* Loads the CUDA module (path NULL = search as for module_path) and fills
 * *t with its function table, without touching a GPU: for checking a
 * module (tests, tr_backend_check_ops).  0, or a negative code with the
 * reason; -ENOENT when no module was found. */
int tr_cuda_module_table(const char *path, tr_backend_i *t, struct tr_error *err);

/* Bytes of device memory one device of a job will need: the replica's
 * buffers exactly as tr_replica_init allocates them and the trainer's
 * second input and label buffers (upload-ahead), rounded to the
 * allocator's granularity, plus this backend's fixed costs (reduction
 * scratch, cuBLAS workspace) and, when ndev > 1, an allowance for NCCL's
 * buffers.  The CUDA context itself (a few hundred MiB, outside
 * cudaMalloc) is included as TR_CUDA_CONTEXT_BYTES so that the result can
 * be compared with cudaMemGetInfo's total.  An estimate, not a promise:
 * fragmentation and driver versions move it by a few MiB. */
#define TR_CUDA_CONTEXT_BYTES ((size_t)512 << 20)
size_t tr_cuda_estimate_bytes(const struct tr_model *m, int max_rows, int label_dim, int opt_state_buffers, int ndev);

#endif
