/* A dense layer's products on CPU devices through oneDNN's matmul
 * primitive (libdnnl 2.x C API), the alternative to OpenBLAS sgemm for
 * gemm's tiles (docs/design.md, "Dense layers on CPU devices").
 *
 * Each call computes one tile on the calling thread alone (an OpenMP team
 * of one), so the tiles' cut, fixed by the product's shape, decides every
 * sum's order and the bits do not depend on the thread count.  Primitives
 * are made once per shape and strides by each thread that asks and kept
 * for the thread's life; a call only points the primitive's memory at the
 * caller's arrays, so a step allocates nothing.
 *
 * Built only when libdnnl is found (meson option `dnnl`); otherwise
 * tr_dnnl_gemm returns -ENOTSUP.
 */
#ifndef TR_CPU_DNNL_GEMM_H
#define TR_CPU_DNNL_GEMM_H

#include <stdbool.h>

#include "core/error.h"

/* C[m,n] (row stride ldc) = op(A) op(B), overwritten; op(A) is m x k,
 * A and B row-major with row strides lda and ldb as for cblas_sgemm.
 * 0, or a negative errno with the reason in err. */
int tr_dnnl_gemm(bool trans_a, bool trans_b, int m, int n, int k, const float *a, int lda, const float *b, int ldb,
		 float *c, int ldc, struct tr_error *err);

/* Matmul primitives made by this process so far (tests check that a
 * step makes none once the shapes are known). */
unsigned long long tr_dnnl_gemm_primitives_made(void);

#endif
