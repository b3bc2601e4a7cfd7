/* 2-D convolution on CPU devices through oneDNN's convolution primitives
 * (libdnnl 2.x C API), the alternative to im2col + OpenBLAS sgemm
 * (docs/design.md, "Convolution on CPU devices").
 *
 * Tensors are trainerd's: NCHW activations, OIHW weights ([out,
 * in/groups, kh, kw], PyTorch's layout), plain float arrays.  oneDNN runs
 * fastest on its own blocked layouts, so each call reorders into blocked
 * scratch buffers, runs the primitive there, and reorders the result back;
 * primitives and scratch are cached per device and shape.  Inside a chain
 * of convolutions the activations already lie in nChw16c
 * (tr_conv2d_geom.x_blocked, y_blocked) and are not reordered.  oneDNN's
 * threads are OpenMP's: each call sets the calling device thread's OpenMP
 * team size to the device's share of the thread budget, so the thread
 * count (and with it the order of every sum) follows from the backend and
 * the shape alone, as for gemm.
 *
 * Built only when libdnnl is found (meson option `dnnl`); otherwise
 * tr_dnnl_available() is false and the other functions return -ENOTSUP.
 */
#ifndef TR_CPU_DNNL_CONV_H
#define TR_CPU_DNNL_CONV_H

#include <stdbool.h>
#include <stddef.h>

#include "core/error.h"

struct tr_conv2d_geom {
	int n, c, h, w; /* input */
	int k, kh, kw;  /* filters and kernel */
	int sh, sw, ph, pw, dh, dw, groups;
	int oh, ow; /* output, as PyTorch computes it */
	/* 1: x and dx (x_blocked), y and dy (y_blocked) lie in oneDNN's
	 * blocked layout nChw16c (channels a multiple of 16) instead of NCHW,
	 * so a chain of convolutions needs no reorder between its layers
	 * (tr_cpu_conv_chain_ok).  ints, not bools: the struct is a cache key
	 * compared with memcmp, so it must have no padding. */
	int x_blocked, y_blocked;
};

typedef struct tr_dnnl_conv tr_dnnl_conv_t;

bool tr_dnnl_available(void);

/* Whether oneDNN's forward convolution of g, asked for its preferred
 * layouts, takes its input (src) or gives its output (dst) in nChw16c:
 * where both sides of a tensor between two convolutions do, it can stay
 * blocked.  false on any failure. */
bool tr_dnnl_conv_prefers_blocked(const struct tr_conv2d_geom *g, bool dst);

/* Reorders of activations (x, y, dx, dy; not weights) between the
 * caller's layout and the primitive's, run by this process so far
 * (tests count them). */
unsigned long long tr_dnnl_conv_activation_reorders(void);

/* One per device; threads is the OpenMP team size for its calls.  NULL
 * with a reason in err when oneDNN is missing or fails to start. */
tr_dnnl_conv_t *tr_dnnl_conv_create(int threads, struct tr_error *err);
void tr_dnnl_conv_destroy(tr_dnnl_conv_t *dc);

/* y = conv(x, w) + b (b may be NULL). */
int tr_dnnl_conv_forward(tr_dnnl_conv_t *dc, const struct tr_conv2d_geom *g, const float *x, const float *w,
			 const float *b, float *y, struct tr_error *err);
/* dx = conv_transpose(dy, w) (overwritten). */
int tr_dnnl_conv_backward_data(tr_dnnl_conv_t *dc, const struct tr_conv2d_geom *g, const float *w, const float *dy,
			       float *dx, struct tr_error *err);
/* dw and db (db may be NULL) overwritten with this batch's gradients. */
int tr_dnnl_conv_backward_weights(tr_dnnl_conv_t *dc, const struct tr_conv2d_geom *g, const float *x, const float *dy,
				  float *dw, float *db, struct tr_error *err);

#endif
