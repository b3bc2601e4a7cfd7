/* What the CPU backend's files share (engine/cpu/): each kernel file fills
 * its part of the backend table, and all of them report argument errors the
 * same way.  Internal to the CPU backend; engine/backend.h is its public
 * interface. */
#ifndef TR_ENGINE_CPU_INTERNAL_H
#define TR_ENGINE_CPU_INTERNAL_H

#include <errno.h>

#include "engine/backend.h"
#include "engine/cpu/cpu_dnnl_conv.h"

/* The parts of the table, one per file. */
void tr_cpu_kernels_fill(tr_backend_i *t);
void tr_cpu_comm_fill(tr_backend_i *t);
void tr_cpu_conv_fill(tr_backend_i *t);
void tr_cpu_norm2d_fill(tr_backend_i *t);
void tr_cpu_dnnl_fill(tr_backend_i *t);
void tr_cpu_auto_conv_fill(tr_backend_i *t);

/* Records the backend's error text and returns code. */
int tr_cpu_set_error(tr_backend_t *be, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* 0, or an error naming `what` when dev is not one of the backend's. */
int tr_cpu_check_dev(tr_backend_t *be, int dev, const char *what);
/* Sets the BLAS thread count an m x n x k gemm gets (cpu_backend.c). */
void tr_cpu_blas_threads_for(tr_backend_t *be, int m, int n, int k);
/* The oneDNN state of one device (cpu_backend.c). */
tr_dnnl_conv_t *tr_cpu_dnnl_for(tr_backend_t *be, int dev);

/* Argument checks share one shape: record what was wrong, return -EINVAL.
 * Both expect `be` (and ENSURE_DEV `dev`) in scope. */
#define ENSURE(cond, ...)                                                   \
	do {                                                                \
		if (!(cond))                                                \
			return tr_cpu_set_error(be, -EINVAL, __VA_ARGS__); \
	} while (0)

#define ENSURE_DEV(what)                                   \
	do {                                               \
		int rc_ = tr_cpu_check_dev(be, dev, what); \
		if (rc_)                                   \
			return rc_;                        \
	} while (0)

#endif
