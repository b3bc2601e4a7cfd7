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
/* conv2d's entries, which pick each call's route (cpu_conv_choice.c) */
void tr_cpu_conv_route_fill(tr_backend_i *t);

/* The two conv2d routes: im2col + OpenBLAS (cpu_conv.c) and oneDNN
 * (cpu_dnnl_conv.c), with the table's conv2d_forward/backward signatures. */
int tr_cpu_im2col_conv2d_forward(tr_backend_t *be, int dev, const struct tr_conv2d_desc *d, int rows, const float *x,
				 const float *w, const float *bias, float *y, float *work);
int tr_cpu_im2col_conv2d_backward(tr_backend_t *be, int dev, const struct tr_conv2d_desc *d, int rows, const float *x,
				  const float *w, const float *dy, float *dx, float *dw, float *dbias, float *work);
int tr_cpu_dnnl_conv2d_forward(tr_backend_t *be, int dev, const struct tr_conv2d_desc *d, int rows, const float *x,
			       const float *w, const float *bias, float *y, float *work);
int tr_cpu_dnnl_conv2d_backward(tr_backend_t *be, int dev, const struct tr_conv2d_desc *d, int rows, const float *x,
				const float *w, const float *dy, float *dx, float *dw, float *dbias, float *work);

/* Records the backend's error text and returns code. */
int tr_cpu_set_error(tr_backend_t *be, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* 0, or an error naming `what` when dev is not one of the backend's. */
int tr_cpu_check_dev(tr_backend_t *be, int dev, const char *what);
/* The oneDNN state of one device's thread `slot` (cpu_backend.c). */
tr_dnnl_conv_t *tr_cpu_dnnl_for(tr_backend_t *be, int dev, int slot);

/* Parallel work (cpu_pool.c, docs/design.md "Backend"): fn(arg, task, slot)
 * runs once for every task in [0, n), on the device's threads; slot in
 * [0, tr_cpu_threads) names the thread (for per-thread state), and which
 * thread gets which task depends on timing, so a task's result must not
 * depend on its slot.  The first negative return is the run's. */
typedef int (*tr_cpu_task_fn)(void *arg, int task, int slot);
struct tr_cpu_pool;
struct tr_cpu_pool *tr_cpu_pool_create(int threads);
void tr_cpu_pool_destroy(struct tr_cpu_pool *p);
int tr_cpu_pool_run(struct tr_cpu_pool *p, int n, tr_cpu_task_fn fn, void *arg);
/* Threads per device: the backend's budget split over its devices. */
int tr_cpu_threads(tr_backend_t *be);
/* Runs the tasks on device dev's pool (made on first use by the device's
 * thread, the only one that calls this for dev). */
/* The window of pooling output (oh, ow) clipped to the plane: rows [*i0,
 * *i1), columns [*j0, *j1); false when it holds no element.  Every
 * pooling kernel walks its windows by this. */
static inline bool tr_cpu_pool_window(const struct tr_pool2d_desc *d, int oh, int ow, int *i0, int *i1, int *j0,
				      int *j1)
{
	int h0 = oh * d->sh - d->ph, w0 = ow * d->sw - d->pw;
	*i0 = h0 < 0 ? 0 : h0;
	*i1 = h0 + d->kh < d->h ? h0 + d->kh : d->h;
	*j0 = w0 < 0 ? 0 : w0;
	*j1 = w0 + d->kw < d->w ? w0 + d->kw : d->w;
	return *i0 < *i1 && *j0 < *j1;
}

/* Max pooling with x (and dx) in nChw16c and y (and dy) in nChw16c or
 * NCHW as d says (cpu_pool_blocked.c): forward when dy is NULL (writes
 * y), else backward (writes dx).  The same bits as the NCHW kernel. */
int tr_cpu_maxpool_blocked(tr_backend_t *be, int dev, const struct tr_pool2d_desc *d, int rows, const float *x,
			   float *y, const float *dy, float *dx);
int tr_cpu_parallel(tr_backend_t *be, int dev, int n, tr_cpu_task_fn fn, void *arg);
/* How many tiles gemm cuts an m x n x k product into, along the longer of
 * C's dimensions (cpu_kernels.c): a function of the shape alone, so the
 * bits do not depend on the thread count. */
int tr_cpu_gemm_tiles(int m, int n, int k);
/* How many slices the oneDNN route cuts a batch of rows into for the
 * device's threads (cpu_dnnl_conv.c), and the samples of the largest: a
 * function of the shape alone. */
int tr_cpu_dnnl_slices(const struct tr_conv2d_desc *d, int rows, int *largest);
/* Device dev's scratch of at least `bytes`, 64-byte aligned, kept until
 * the next call for dev; NULL (error recorded) when out of memory. */
void *tr_cpu_scratch(tr_backend_t *be, int dev, size_t bytes);

/* Argument checks share one shape: record what was wrong, return -EINVAL.
 * Both expect `be` (and ENSURE_DEV `dev`) in scope. */
#define ENSURE(cond, ...)                                                  \
	do {                                                               \
		if (!(cond))                                               \
			return tr_cpu_set_error(be, -EINVAL, __VA_ARGS__); \
	} while (0)

#define ENSURE_DEV(what)                                   \
	do {                                               \
		int rc_ = tr_cpu_check_dev(be, dev, what); \
		if (rc_)                                   \
			return rc_;                        \
	} while (0)

#endif
