/* CPU kernels: the compute half of the backend table.
 *
 * These are the reference every other backend is tested against, so they
 * favour clarity and PyTorch's formulas over cleverness: reductions that
 * decide a loss or a norm accumulate in double, elementwise loops stay
 * plain so that -O2 vectorises them (small models spend most of their time
 * here, not in gemm).  Elementwise kernels accept exact in-place use
 * (output == input); partially overlapping buffers are not supported.
 * Matrices are row-major; gemm goes to cblas_sgemm, in fixed tiles over
 * the device's threads.
 */

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include "engine/cpu/cpu_dnnl_gemm.h"
#include "engine/cpu/cpu_internal.h"
#include "engine/rng.h"

/* ---- linear algebra ---------------------------------------------------- */

/* A gemm of at least 2 GEMM_TILE_MNK multiply-adds is cut into an even
 * number of tiles of about that much work (at most GEMM_MAX_TILES), along
 * the longer of C's dimensions, in multiples of 16 rows or columns; each
 * tile is one single-threaded sgemm over the whole K, and the device's
 * threads take the tiles (cpu_pool.c).  The tiles follow from the shape
 * alone, so the bits do not depend on how many threads there are.  K is
 * never split: a sum over K must stay in one call to keep its order fixed.
 * Every tile packs the whole of the other operand again (OpenBLAS packs
 * per call), so tiles must be large: with 4M multiply-adds (0.1 ms on one
 * AVX2 core) packing took a quarter of the MLP 784-1024-1024-10's step;
 * 32M (about 0.8 ms) cut its CPU time per step by a quarter (measured on
 * one core, bench/README.md, "Development measurements").
 *
 * What a tile packs again is the other operand, (other side) x K, against
 * (tile's span) x (other side) x K multiply-adds: its cost relative to the
 * tile's work is 1 / span, whatever M, N and K are.  So a gemm too small
 * for two GEMM_TILE_MNK tiles still gets tiles of at least GEMM_TILE_SPAN
 * rows or columns and GEMM_MIN_TILE_MNK multiply-adds: exact mode's shard
 * products (32 rows against the MLP's 1024 x 1024 weights, 33M
 * multiply-adds) ran on one thread of two with the first rule alone, which
 * made its step twice the float path's (docs/design.md, "Exact mode").
 * The float path's large gemms are cut by the first rule as before. */
#define GEMM_TILE_MNK ((int64_t)1 << 25)
#define GEMM_MIN_TILE_MNK ((int64_t)1 << 23)
#define GEMM_TILE_SPAN 256
#define GEMM_MAX_TILES 64

int tr_cpu_gemm_tiles(int m, int n, int k)
{
	int64_t mnk = (int64_t)m * n * k, span = m > n ? m : n;
	int64_t tiles = mnk / GEMM_TILE_MNK, thin = mnk / GEMM_MIN_TILE_MNK;
	if (thin > span / GEMM_TILE_SPAN)
		thin = span / GEMM_TILE_SPAN;
	if (tiles < thin)
		tiles = thin;
	if (tiles > GEMM_MAX_TILES)
		tiles = GEMM_MAX_TILES;
	if (tiles > span / 16)
		tiles = span / 16;
	if (tiles > 1 && tiles % 2)
		tiles++; /* an even count: two threads get equal shares */
	if (tiles > span / 16)
		tiles = span / 16;
	return tiles > 1 ? (int)tiles : 1;
}

struct gemm_job {
	tr_backend_t *be;
	bool onednn; /* tiles through tr_dnnl_gemm (alpha 1, beta 0), not sgemm */
	bool ta, tb, by_rows;
	bool zero_c; /* C is cleared first (beta 0), tile by tile */
	int m, n, k, tiles;
	float alpha, beta;
	const float *a, *b;
	const float *bias; /* gemm_bias: added to every row of the tile's C, or NULL */
	float *c;
};

/* c[r, j] += bias[j] over a rows x cols block of a matrix with row stride
 * ld: add_bias's arithmetic, shared with gemm_bias's tiles so that both
 * give the same bits. */
static void add_bias_block(float *c, size_t ld, int rows, int cols, const float *bias)
{
	for (int r = 0; r < rows; r++) {
		float *restrict cr = c + (size_t)r * ld;
		const float *restrict br = bias;
		for (int j = 0; j < cols; j++)
			cr[j] += br[j];
	}
}

/* Tile t of `tiles` starts here: the span's 16-row units spread evenly
 * (tiles differ by at most one unit; the last takes the rows past the
 * last whole unit), so the device's threads get even shares. */
static int tile_start(int span, int tiles, int t)
{
	if (t >= tiles)
		return span;
	return (int)((int64_t)t * (span / 16) / tiles) * 16;
}

/* gemm_tile's oneDNN route: the matmul overwrites C, so no clearing;
 * the bias is added as on the sgemm route. */
static int gemm_tile_onednn(const struct gemm_job *g, int lo, int len)
{
	int lda = g->ta ? g->m : g->k, ldb = g->tb ? g->k : g->n, rc;
	struct tr_error err;
	if (g->by_rows) {
		const float *a = g->a + (g->ta ? (size_t)lo : (size_t)lo * lda);
		float *c = g->c + (size_t)lo * g->n;
		rc = tr_dnnl_gemm(g->ta, g->tb, len, g->n, g->k, a, lda, g->b, ldb, c, g->n, &err);
		if (rc == 0 && g->bias)
			add_bias_block(c, (size_t)g->n, len, g->n, g->bias);
	} else {
		const float *b = g->b + (g->tb ? (size_t)lo * ldb : (size_t)lo);
		rc = tr_dnnl_gemm(g->ta, g->tb, g->m, len, g->k, g->a, lda, b, ldb, g->c + lo, g->n, &err);
		if (rc == 0 && g->bias)
			add_bias_block(g->c + lo, (size_t)g->n, g->m, len, g->bias + lo);
	}
	return rc < 0 ? tr_cpu_set_error(g->be, rc, "gemm: %s", err.message) : 0;
}

static int gemm_tile(void *arg, int t, int slot)
{
	const struct gemm_job *g = arg;
	int lda = g->ta ? g->m : g->k, ldb = g->tb ? g->k : g->n;
	int span = g->by_rows ? g->m : g->n, lo = tile_start(span, g->tiles, t);
	int len = tile_start(span, g->tiles, t + 1) - lo;

	(void)slot;
	if (len <= 0)
		return 0;
	if (g->onednn)
		return gemm_tile_onednn(g, lo, len);
	if (g->by_rows) {
		/* rows lo.. of op(A) and C */
		if (g->zero_c)
			memset(g->c + (size_t)lo * g->n, 0, (size_t)len * g->n * sizeof(float));
		const float *a = g->a + (g->ta ? (size_t)lo : (size_t)lo * lda);
		cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans, len,
			    g->n, g->k, g->alpha, a, lda, g->b, ldb, g->beta, g->c + (size_t)lo * g->n, g->n);
		if (g->bias)
			add_bias_block(g->c + (size_t)lo * g->n, (size_t)g->n, len, g->n, g->bias);
	} else {
		/* columns lo.. of op(B) and C */
		if (g->zero_c)
			for (int r = 0; r < g->m; r++)
				memset(g->c + (size_t)r * g->n + lo, 0, (size_t)len * sizeof(float));
		const float *b = g->b + (g->tb ? (size_t)lo * ldb : (size_t)lo);
		cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans, g->m,
			    len, g->k, g->alpha, g->a, lda, b, ldb, g->beta, g->c + lo, g->n);
		if (g->bias)
			add_bias_block(g->c + lo, (size_t)g->n, g->m, len, g->bias + lo);
	}
	return 0;
}

/* gemm, and gemm_bias when bias is set (then beta is 0): the bias is added
 * by each tile right after its sgemm, while its part of C is in cache,
 * and on the device's threads; a separate add_bias was one more pass over
 * C, on one thread. */
static int gemm_run(tr_backend_t *be, int dev, bool onednn, bool trans_a, bool trans_b, int m, int n, int k,
		    float alpha, const float *a, const float *b, float beta, const float *bias, float *c)
{
	ENSURE(m >= 0 && n >= 0 && k >= 0, "gemm: negative size m=%d n=%d k=%d", m, n, k);
	if (m == 0 || n == 0)
		return 0;
	ENSURE(c && (k == 0 || (a && b)), "gemm: NULL matrix");
	if (k == 0) {
		/* BLAS rejects a zero leading dimension; the product is empty,
		 * only the beta term remains (beta == 0 must not read C). */
		size_t mn = (size_t)m * n;
		for (size_t i = 0; i < mn; i++)
			c[i] = beta == 0.0f ? 0.0f : beta * c[i];
		if (bias)
			add_bias_block(c, (size_t)n, m, n, bias);
		return 0;
	}
	/* OpenBLAS implements beta 0 as a zeroing pass (sgemm_beta) and then
	 * accumulates; its loop is several times slower than memset (measured:
	 * 6 us of a 90 us step of the 64-128-10 MLP), and the sum is the same
	 * bits either way.  Each tile clears its own part of C (zero_c): one
	 * memset of all of C on the device's thread, before the tiles, had
	 * the other core wait for 11 MB a step of the MLP 784-1024-1024-10. */
	bool zero_c = beta == 0.0f;
	if (zero_c)
		beta = 1.0f;
	struct gemm_job g = {.be = be,
			     .onednn = onednn,
			     .ta = trans_a,
			     .zero_c = zero_c,
			     .tb = trans_b,
			     .by_rows = m > n,
			     .m = m,
			     .n = n,
			     .k = k,
			     .alpha = alpha,
			     .beta = beta,
			     .a = a,
			     .b = b,
			     .bias = bias,
			     .c = c};
	g.tiles = tr_cpu_gemm_tiles(m, n, k);
	if (g.tiles == 1)
		return gemm_tile(&g, 0, 0);
	return tr_cpu_parallel(be, dev, g.tiles, gemm_tile, &g);
}

static int cpu_gemm(tr_backend_t *be, int dev, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
		    const float *a, const float *b, float beta, float *c)
{
	ENSURE_DEV("gemm");
	return gemm_run(be, dev, false, trans_a, trans_b, m, n, k, alpha, a, b, beta, NULL, c);
}

static int cpu_gemm_bias(tr_backend_t *be, int dev, bool trans_a, bool trans_b, int m, int n, int k, const float *a,
			 const float *b, const float *bias, float *c)
{
	ENSURE_DEV("gemm_bias");
	ENSURE(bias, "gemm_bias: NULL bias");
	return gemm_run(be, dev, false, trans_a, trans_b, m, n, k, 1.0f, a, b, 0.0f, bias, c);
}

/* A dense layer's product through its route: the same tiles on either,
 * each one call of one thread, so neither route's bits depend on the
 * thread count. */
static int cpu_gemm_route(tr_backend_t *be, int dev, int route, bool trans_a, bool trans_b, int m, int n, int k,
			  const float *a, const float *b, const float *bias, float *c)
{
	ENSURE_DEV("gemm_route");
	ENSURE(route == TR_CPU_GEMM_OPENBLAS || route == TR_CPU_GEMM_ONEDNN, "gemm_route: route %d is not a route",
	       route);
	/* k == 0 is gemm_run's, on either route */
	return gemm_run(be, dev, route == TR_CPU_GEMM_ONEDNN && k > 0, trans_a, trans_b, m, n, k, 1.0f, a, b, 0.0f,
			bias, c);
}

/* gemm with beta 1 equals gemm into zeros then `add` (backend.h,
 * gemm_accumulate_max_k) when sgemm reads and writes C once, adding the
 * whole sum over K: OpenBLAS's driver cuts K into blocks of its GEMM_Q
 * (a few hundred on its x86-64 sgemm kernels) and adds each block's sum
 * to C, so a K of one block qualifies.  That is OpenBLAS's inside, not
 * its contract, so the first call checks it on the kernels this process
 * got: a probe at K = 256, else 128, 64, 32, on random values (a second
 * pass over C would round twice and differ), promising the largest K that
 * passes, or nothing.  The shape is past OpenBLAS's small-matrix path,
 * whose kernels add to C once anyway. */
#define GEMM_ACCUMULATE_PROBE_K 256

static int gemm_accumulate_k;
static pthread_once_t gemm_accumulate_once = PTHREAD_ONCE_INIT;

/* Whether gemm with beta 1 is gemm into zeros then `add` at K = k, in the
 * dense weight gradient's form dW = dy^T x; a, b hold k x 256 values
 * each, c and p 256 x 256. */
static bool gemm_accumulates_at(int k, const float *a, const float *b, float *c, float *p)
{
	enum { M = 256, N = 256 };
	memset(p, 0, sizeof(float) * M * N);
	cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, M, N, k, 1.0f, a, M, b, N, 1.0f, p, N);
	for (size_t i = 0; i < (size_t)M * N; i++)
		p[i] = c[i] + p[i];
	cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, M, N, k, 1.0f, a, M, b, N, 1.0f, c, N);
	return memcmp(c, p, sizeof(float) * M * N) == 0;
}

static void gemm_accumulate_probe(void)
{
	enum { M = 256, N = 256, K = GEMM_ACCUMULATE_PROBE_K };
	size_t na = (size_t)K * M, nb = (size_t)K * N, nc = (size_t)M * N;
	float *v = malloc(sizeof(float) * (na + nb + 2 * nc));
	uint32_t x = 12345u;
	for (int k = K; v && k >= 32 && !gemm_accumulate_k; k /= 2) {
		for (size_t i = 0; i < na + nb + nc; i++) {
			x = x * 1664525u + 1013904223u;
			v[i] = ((float)(x >> 8) / (float)(1u << 24) - 0.5f) * (i < na + nb ? 1.0f : 8.0f);
		}
		if (gemm_accumulates_at(k, v, v + na, v + na + nb, v + na + nb + nc))
			gemm_accumulate_k = k;
	}
	free(v);
}

static int cpu_gemm_accumulate_max_k(tr_backend_t *be)
{
	(void)be;
	pthread_once(&gemm_accumulate_once, gemm_accumulate_probe);
	return gemm_accumulate_k;
}

static int cpu_add_bias(tr_backend_t *be, int dev, int rows, int cols, float *y, const float *bias)
{
	ENSURE_DEV("add_bias");
	ENSURE(rows >= 0 && cols >= 0, "add_bias: negative size %dx%d", rows, cols);
	add_bias_block(y, (size_t)cols, rows, cols, bias);
	return 0;
}

/* Sums over more than COLSUM_CHUNK elements are cut into column blocks
 * (multiples of 16 columns, from the shape alone) that the device's
 * threads take: on one thread, the bias gradients of the MLP
 * 784-1024-1024-10 left the other core idle.  Every column is still summed
 * over the rows in order, so any split gives the same bits. */
#define COLSUM_CHUNK ((int64_t)1 << 16)
#define COLSUM_MAX_TASKS 64

struct colsum_job {
	int rows, cols, tasks;
	const float *x;
	float *out;
};

/* Row by row so the inner loop runs along memory and vectorises. */
static int colsum_task(void *arg, int t, int slot)
{
	const struct colsum_job *j = arg;
	int lo = tile_start(j->cols, j->tasks, t), hi = tile_start(j->cols, j->tasks, t + 1);
	float *restrict o = j->out + lo;
	(void)slot;
	for (int c = 0; c < hi - lo; c++)
		o[c] = 0.0f;
	for (int r = 0; r < j->rows; r++) {
		const float *restrict xr = j->x + (size_t)r * j->cols + lo;
		for (int c = 0; c < hi - lo; c++)
			o[c] += xr[c];
	}
	return 0;
}

static int cpu_col_sum(tr_backend_t *be, int dev, int rows, int cols, const float *x, float *out)
{
	ENSURE_DEV("col_sum");
	ENSURE(rows >= 0 && cols >= 0, "col_sum: negative size %dx%d", rows, cols);
	int64_t tasks = (int64_t)rows * cols / COLSUM_CHUNK;
	if (tasks > cols / 16)
		tasks = cols / 16;
	if (tasks > COLSUM_MAX_TASKS)
		tasks = COLSUM_MAX_TASKS;
	struct colsum_job j = {.rows = rows, .cols = cols, .tasks = tasks > 1 ? (int)tasks : 1, .x = x, .out = out};
	if (j.tasks == 1)
		return colsum_task(&j, 0, 0);
	return tr_cpu_parallel(be, dev, j.tasks, colsum_task, &j);
}

/* ---- activations ------------------------------------------------------- */

/* Constants as PyTorch's GeluKernel spells them. */
#define GELU_ALPHA 0.70710678118654752440f /* 1/sqrt(2) */
#define GELU_PDF 0.39894228040143267794f   /* 1/sqrt(2 pi) */
#define GELU_BETA 0.79788456080286535588f  /* sqrt(2/pi) */
#define GELU_KAPPA 0.044715f

static int act_forward(enum tr_act act, size_t n, const float *x, float *y)
{
	switch (act) {
	case TR_ACT_RELU:
		/* x <= 0 (not x > 0) so that NaN propagates, as torch.relu */
		for (size_t i = 0; i < n; i++)
			y[i] = x[i] <= 0.0f ? 0.0f : x[i];
		break;
	case TR_ACT_GELU:
		for (size_t i = 0; i < n; i++)
			y[i] = x[i] * 0.5f * (1.0f + erff(x[i] * GELU_ALPHA));
		break;
	case TR_ACT_GELU_TANH:
		for (size_t i = 0; i < n; i++) {
			float v = x[i];
			float inner = GELU_BETA * (v + GELU_KAPPA * (v * v * v));
			y[i] = 0.5f * v * (1.0f + tanhf(inner));
		}
		break;
	case TR_ACT_TANH:
		for (size_t i = 0; i < n; i++)
			y[i] = tanhf(x[i]);
		break;
	case TR_ACT_SIGMOID:
		for (size_t i = 0; i < n; i++)
			y[i] = 1.0f / (1.0f + expf(-x[i]));
		break;
	default:
		return -EINVAL;
	}
	return 0;
}

static int act_backward(enum tr_act act, size_t n, const float *x, const float *y, const float *dy, float *dx)
{
	switch (act) {
	case TR_ACT_RELU:
		/* The derivative at 0 is taken as 0, as PyTorch.  dy is loaded
		 * unconditionally so the select vectorises: a conditional load
		 * (dx may alias dy) stays a mispredicting branch, 14x slower. */
		for (size_t i = 0; i < n; i++) {
			float d = dy[i];
			dx[i] = x[i] > 0.0f ? d : 0.0f;
		}
		break;
	case TR_ACT_GELU:
		for (size_t i = 0; i < n; i++) {
			float v = x[i];
			float cdf = 0.5f * (1.0f + erff(v * GELU_ALPHA));
			float pdf = expf(-0.5f * v * v) * GELU_PDF;
			dx[i] = dy[i] * (cdf + v * pdf);
		}
		break;
	case TR_ACT_GELU_TANH:
		for (size_t i = 0; i < n; i++) {
			float v = x[i];
			float v2 = v * v;
			float t = tanhf(GELU_BETA * (v + GELU_KAPPA * (v2 * v)));
			float left = 0.5f * v;
			float dleft = 0.5f * (1.0f + t);
			float dright = left * (1.0f - t * t) * GELU_BETA * (1.0f + 3.0f * GELU_KAPPA * v2);
			dx[i] = dy[i] * (dleft + dright);
		}
		break;
	case TR_ACT_TANH:
		for (size_t i = 0; i < n; i++)
			dx[i] = dy[i] * (1.0f - y[i] * y[i]);
		break;
	case TR_ACT_SIGMOID:
		for (size_t i = 0; i < n; i++)
			dx[i] = dy[i] * (1.0f - y[i]) * y[i];
		break;
	default:
		return -EINVAL;
	}
	return 0;
}

/* Activations over more than ACT_CHUNK elements are cut into chunks of
 * that many, which the device's threads take; each element depends on
 * its own inputs only, so any split gives the same bits. */
#define ACT_CHUNK ((size_t)1 << 16)

struct act_job {
	enum tr_act act;
	bool backward;
	size_t n;
	const float *x, *y, *dy;
	float *out;
};

static int act_task(void *arg, int t, int slot)
{
	const struct act_job *j = arg;
	size_t lo = (size_t)t * ACT_CHUNK, len = j->n - lo < ACT_CHUNK ? j->n - lo : ACT_CHUNK;
	(void)slot;
	if (!j->backward)
		return act_forward(j->act, len, j->x + lo, j->out + lo);
	return act_backward(j->act, len, j->x ? j->x + lo : NULL, j->y ? j->y + lo : NULL, j->dy + lo, j->out + lo);
}

static int act_run(tr_backend_t *be, int dev, const struct act_job *j, const char *what)
{
	if (act_forward(j->act, 0, NULL, NULL) < 0)
		return tr_cpu_set_error(be, -EINVAL, "%s: unknown activation %d", what, (int)j->act);
	if (j->n <= ACT_CHUNK)
		return act_task((void *)j, 0, 0);
	return tr_cpu_parallel(be, dev, (int)((j->n + ACT_CHUNK - 1) / ACT_CHUNK), act_task, (void *)j);
}

static int cpu_act_forward(tr_backend_t *be, int dev, enum tr_act act, size_t n, const float *x, float *y)
{
	ENSURE_DEV("act_forward");
	struct act_job j = {.act = act, .n = n, .x = x, .out = y};
	return act_run(be, dev, &j, "act_forward");
}

static int cpu_act_backward(tr_backend_t *be, int dev, enum tr_act act, size_t n, const float *x, const float *y,
			    const float *dy, float *dx)
{
	ENSURE_DEV("act_backward");
	struct act_job j = {.act = act, .backward = true, .n = n, .x = x, .y = y, .dy = dy, .out = dx};
	return act_run(be, dev, &j, "act_backward");
}

/* ---- dropout and elementwise ------------------------------------------ */

static int cpu_dropout_forward(tr_backend_t *be, int dev, int rows, int cols, float rate, uint64_t key, int64_t row0,
			       const float *x, float *y, float *mask)
{
	ENSURE_DEV("dropout_forward");
	ENSURE(rows >= 0 && cols >= 0 && row0 >= 0, "dropout_forward: bad shape %dx%d at row %lld", rows, cols,
	       (long long)row0);
	ENSURE(rate >= 0.0f && rate < 1.0f, "dropout_forward: rate %g outside [0, 1)", (double)rate);
	float keep_scale = 1.0f / (1.0f - rate);
	for (int r = 0; r < rows; r++) {
		size_t off = (size_t)r * cols;
		uint64_t base = (uint64_t)(row0 + r) * (uint64_t)cols;
		for (int c = 0; c < cols; c++) {
			float mk = tr_rng_uniform(key, base + (uint64_t)c) >= rate ? keep_scale : 0.0f;
			mask[off + c] = mk;
			y[off + c] = x[off + c] * mk;
		}
	}
	return 0;
}

static int cpu_mul(tr_backend_t *be, int dev, size_t n, const float *a, const float *b, float *out)
{
	ENSURE_DEV("mul");
	for (size_t i = 0; i < n; i++)
		out[i] = a[i] * b[i];
	return 0;
}

static int cpu_scale(tr_backend_t *be, int dev, size_t n, float *x, float alpha)
{
	ENSURE_DEV("scale");
	for (size_t i = 0; i < n; i++)
		x[i] *= alpha;
	return 0;
}

/* Eight partial sums, then combined in a fixed order: one chain of
 * dependent adds ran at ~6 GB/s, a quarter of what the memory gives, and
 * stop_on_nan takes this sum every step.  The order is fixed, so the
 * result is the same on every run and every rank. */
static double sumsq_span(const float *x, size_t n)
{
	double p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
	size_t i = 0;
	for (; i + 8 <= n; i += 8)
		for (int k = 0; k < 8; k++)
			p[k] += (double)x[i + k] * (double)x[i + k];
	for (int k = 0; i < n; i++, k++)
		p[k] += (double)x[i] * (double)x[i];
	return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

/* Over more than SUMSQ_CHUNK elements the sum is cut into at most
 * SUMSQ_MAX_CHUNKS chunks (sizes from n alone, multiples of 8) that the
 * device's threads take, and the chunks' sums are added in order: on one
 * thread, the sum over the MLP 784-1024-1024-10's gradients every step
 * left the other core idle.  Up to SUMSQ_CHUNK elements the sum is one
 * span, as before. */
#define SUMSQ_CHUNK ((size_t)1 << 16)
#define SUMSQ_MAX_CHUNKS 256

struct sumsq_job {
	const float *x;
	size_t n, chunk;
	double part[SUMSQ_MAX_CHUNKS];
};

static int sumsq_task(void *arg, int t, int slot)
{
	struct sumsq_job *j = arg;
	size_t lo = (size_t)t * j->chunk;
	(void)slot;
	j->part[t] = sumsq_span(j->x + lo, j->n - lo < j->chunk ? j->n - lo : j->chunk);
	return 0;
}

static int cpu_sumsq(tr_backend_t *be, int dev, size_t n, const float *x, double *out)
{
	ENSURE_DEV("sumsq");
	ENSURE(out, "sumsq: NULL output");
	if (n <= SUMSQ_CHUNK) {
		*out = sumsq_span(x, n);
		return 0;
	}
	struct sumsq_job j = {.x = x, .n = n, .chunk = SUMSQ_CHUNK};
	size_t even = (n + SUMSQ_MAX_CHUNKS - 1) / SUMSQ_MAX_CHUNKS;
	if (even > j.chunk)
		j.chunk = (even + 7) / 8 * 8;
	int chunks = (int)((n + j.chunk - 1) / j.chunk);
	int rc = tr_cpu_parallel(be, dev, chunks, sumsq_task, &j);
	if (rc < 0)
		return rc;
	double sum = 0;
	for (int t = 0; t < chunks; t++)
		sum += j.part[t];
	*out = sum;
	return 0;
}

/* Each range as cpu_sumsq, so a range's sum has the same bits as sumsq's
 * over it. */
static int cpu_sumsq_ranges(tr_backend_t *be, int dev, int nranges, const size_t *off, const size_t *len,
			    const float *x, double *out)
{
	ENSURE_DEV("sumsq_ranges");
	ENSURE(nranges > 0 && nranges <= TR_SUMSQ_MAX_RANGES, "sumsq_ranges: %d ranges (1 to %d)", nranges,
	       TR_SUMSQ_MAX_RANGES);
	ENSURE(off && len && out, "sumsq_ranges: NULL pointer");
	for (int k = 0; k < nranges; k++) {
		int rc = cpu_sumsq(be, dev, len[k], x + off[k], &out[k]);
		if (rc < 0)
			return rc;
	}
	return 0;
}

static int cpu_clip_scale(tr_backend_t *be, int dev, size_t n, float *x, float max_norm, const double *sumsq)
{
	ENSURE_DEV("clip_scale");
	ENSURE(sumsq, "clip_scale: NULL sum of squares");
	double coef = max_norm / (sqrt(*sumsq) + 1e-6);
	if (coef < 1.0)
		return cpu_scale(be, dev, n, x, (float)coef);
	return 0;
}

/* stop_on_nan's gate (struct tr_optim_hp): true when the update must leave
 * everything as it was; an out-of-place update then copies its inputs. */
static bool update_skipped(const struct tr_optim_hp *hp)
{
	return hp->skip_unless_finite && !isfinite(*hp->skip_unless_finite);
}

static void copy_if_apart(float *dst, const float *src, size_t n)
{
	if (dst && src && dst != src)
		memcpy(dst, src, n * sizeof(float));
}

/* ---- layernorm ---------------------------------------------------------- */

/* Biased variance with eps inside the square root, as torch.nn.LayerNorm.
 * Two passes in double: the one-pass E[x^2]-E[x]^2 form loses everything
 * when |mean| >> std. */
static int cpu_layernorm_forward(tr_backend_t *be, int dev, int rows, int cols, float eps, const float *x,
				 const float *gamma, const float *beta, float *y, float *mean, float *rstd)
{
	ENSURE_DEV("layernorm_forward");
	ENSURE(rows >= 0 && cols >= 1, "layernorm_forward: bad shape %dx%d", rows, cols);
	ENSURE(gamma && beta, "layernorm_forward: gamma and beta are required");
	for (int r = 0; r < rows; r++) {
		const float *xr = x + (size_t)r * cols;
		float *yr = y + (size_t)r * cols;
		double s = 0.0, ss = 0.0;
		for (int c = 0; c < cols; c++)
			s += xr[c];
		double mu = s / cols;
		for (int c = 0; c < cols; c++) {
			double d = xr[c] - mu;
			ss += d * d;
		}
		float m = (float)mu;
		float rs = (float)(1.0 / sqrt(ss / cols + (double)eps));
		/* y from the stored float statistics, so that backward sees
		 * exactly the normalisation forward applied */
		for (int c = 0; c < cols; c++)
			yr[c] = (xr[c] - m) * rs * gamma[c] + beta[c];
		mean[r] = m;
		rstd[r] = rs;
	}
	return 0;
}

/* dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * gamma. */
static int cpu_layernorm_backward(tr_backend_t *be, int dev, int rows, int cols, const float *x, const float *gamma,
				  const float *mean, const float *rstd, const float *dy, float *dx, float *dgamma,
				  float *dbeta)
{
	ENSURE_DEV("layernorm_backward");
	ENSURE(rows >= 0 && cols >= 1, "layernorm_backward: bad shape %dx%d", rows, cols);
	ENSURE(gamma && dgamma && dbeta, "layernorm_backward: gamma, dgamma and dbeta are required");
	for (int r = 0; r < rows; r++) {
		const float *xr = x + (size_t)r * cols;
		const float *dyr = dy + (size_t)r * cols;
		float *dxr = dx + (size_t)r * cols;
		float m = mean[r], rs = rstd[r];
		double sg = 0.0, sgx = 0.0;
		for (int c = 0; c < cols; c++) {
			float xh = (xr[c] - m) * rs;
			float g = dyr[c] * gamma[c];
			sg += g;
			sgx += (double)g * xh;
		}
		for (int c = 0; c < cols; c++) {
			float xh = (xr[c] - m) * rs;
			dgamma[c] += dyr[c] * xh;
			dbeta[c] += dyr[c];
		}
		float a = (float)(sg / cols), b = (float)(sgx / cols);
		for (int c = 0; c < cols; c++) {
			float xh = (xr[c] - m) * rs;
			dxr[c] = rs * (dyr[c] * gamma[c] - a - xh * b);
		}
	}
	return 0;
}

/* ---- losses ------------------------------------------------------------- */

/* Checked before any output is touched, so a bad batch leaves out[] and
 * dlogits as they were. */
static int check_labels(tr_backend_t *be, int rows, int classes, const float *labels)
{
	for (int r = 0; r < rows; r++) {
		float l = labels[r];
		if (!(l >= 0.0f && l < (float)classes) || l != floorf(l))
			return tr_cpu_set_error(be, -EINVAL,
						"softmax_ce: row %d: label %g is not an integer class in [0, %d)", r,
						(double)l, classes);
	}
	return 0;
}

/* log-sum-exp around the row maximum; dlogits may be NULL (evaluation). */
static int cpu_softmax_ce(tr_backend_t *be, int dev, int rows, int classes, const float *logits, const float *labels,
			  float scale, float *dlogits, double *out)
{
	ENSURE_DEV("softmax_ce");
	ENSURE(rows >= 0 && classes >= 1, "softmax_ce: bad shape %dx%d", rows, classes);
	int rc = check_labels(be, rows, classes, labels);
	if (rc)
		return rc;
	double loss = 0.0, correct = 0.0;
	for (int r = 0; r < rows; r++) {
		const float *z = logits + (size_t)r * classes;
		int label = (int)labels[r];
		int arg = 0;
		float mx = z[0];
		for (int c = 1; c < classes; c++) {
			if (z[c] > mx) {
				mx = z[c];
				arg = c;
			}
		}
		double sum = 0.0;
		for (int c = 0; c < classes; c++)
			sum += expf(z[c] - mx);
		loss += (double)mx + log(sum) - (double)z[label];
		correct += arg == label;
		if (dlogits) {
			float *d = dlogits + (size_t)r * classes;
			float inv = (float)(1.0 / sum);
			for (int c = 0; c < classes; c++)
				d[c] = scale * (expf(z[c] - mx) * inv);
			d[label] -= scale;
		}
	}
	if (out) {
		out[0] += loss;
		out[1] += correct;
	}
	return 0;
}

static int cpu_mse(tr_backend_t *be, int dev, int rows, int cols, const float *pred, const float *target, float scale,
		   float *dpred, double *out)
{
	ENSURE_DEV("mse");
	ENSURE(rows >= 0 && cols >= 1, "mse: bad shape %dx%d", rows, cols);
	float coef = scale * 2.0f / (float)cols;
	double loss = 0.0;
	for (int r = 0; r < rows; r++) {
		const float *p = pred + (size_t)r * cols;
		const float *t = target + (size_t)r * cols;
		double s = 0.0;
		for (int c = 0; c < cols; c++) {
			double d = (double)p[c] - (double)t[c];
			s += d * d;
		}
		loss += s / cols;
		if (dpred) {
			float *restrict d = dpred + (size_t)r * cols;
			for (int c = 0; c < cols; c++)
				d[c] = coef * (p[c] - t[c]);
		}
	}
	if (out)
		out[0] += loss;
	return 0;
}

/* ---- optimizers --------------------------------------------------------- */

/* Each update is written once, with separate input and output buffers, and
 * serves both the in-place kernels (outputs == inputs, the usual case) and
 * the _into ones (other buffers, for a zero-copy snapshot: see
 * engine/backend.h).  So the pointers cannot be `restrict`; instead every
 * iteration reads its element's inputs before it writes, touches no other
 * element, and IVDEP tells the compiler that nothing carries over between
 * iterations, which keeps the loops vectorised.  Out-of-place use with
 * partially overlapping buffers is rejected by the _into kernels. */
#if defined(__clang__)
#define IVDEP _Pragma("clang loop vectorize(assume_safety)")
#elif defined(__GNUC__)
#define IVDEP _Pragma("GCC ivdep")
#else
#define IVDEP
#endif

/* Whether the n-float buffers a and b share an element (NULL shares
 * nothing). */
static bool overlap(const float *a, const float *b, size_t n)
{
	uintptr_t x = (uintptr_t)a, y = (uintptr_t)b, len = n * sizeof(float);
	return a && b && n > 0 && x < y + len && y < x + len;
}

/* The _into kernels' promise: every output is apart from every input and
 * from the other outputs (the loops below would otherwise mix old and new
 * values without a word). */
static bool outputs_apart(const float *const *in, int nin, float *const *out, int nout, size_t n)
{
	for (int o = 0; o < nout; o++) {
		for (int i = 0; i < nin; i++)
			if (overlap(out[o], in[i], n))
				return false;
		for (int p = o + 1; p < nout; p++)
			if (overlap(out[o], out[p], n))
				return false;
	}
	return true;
}

/* Optimizer updates over more than UPD_CHUNK elements are cut into chunks
 * that the device's threads take: on one thread, the SGD update of the
 * MLP 784-1024-1024-10's 1.9M parameters (37 MB read and written) left
 * the other core idle.  Each element's update depends on its own inputs
 * only, so any split gives the same bits. */
#define UPD_CHUNK ((size_t)1 << 16)

struct upd_job {
	size_t n;
	const float *p, *gr, *s1, *s2; /* s1, s2: the optimizer's state (NULL when it has none) */
	float *p_out, *s1_out, *s2_out;
	const struct tr_optim_hp *hp;
	void (*span)(const struct upd_job *j, size_t lo, size_t len);
};

static int upd_task(void *arg, int t, int slot)
{
	const struct upd_job *j = arg;
	size_t lo = (size_t)t * UPD_CHUNK;
	(void)slot;
	j->span(j, lo, j->n - lo < UPD_CHUNK ? j->n - lo : UPD_CHUNK);
	return 0;
}

static int upd_run(tr_backend_t *be, int dev, const struct upd_job *j)
{
	if (update_skipped(j->hp)) {
		copy_if_apart(j->p_out, j->p, j->n);
		copy_if_apart(j->s1_out, j->s1, j->n);
		copy_if_apart(j->s2_out, j->s2, j->n);
		return 0;
	}
	if (j->n <= UPD_CHUNK) {
		j->span(j, 0, j->n);
		return 0;
	}
	return tr_cpu_parallel(be, dev, (int)((j->n + UPD_CHUNK - 1) / UPD_CHUNK), upd_task, (void *)j);
}

/* torch.optim.SGD, _single_tensor_sgd:
 *   g = grad + wd * p
 *   buf = g (first step) | buf = momentum * buf + (1 - dampening) * g
 *   g = nesterov ? g + momentum * buf : buf
 *   p -= lr * g                                                          */
static void sgd_span(const struct upd_job *j, size_t lo, size_t n)
{
	const struct tr_optim_hp *hp = j->hp;
	const float lr = hp->lr, wd = hp->weight_decay, mom = hp->momentum;
	const float damp1 = (float)(1.0 - (double)hp->dampening);
	const float *p = j->p + lo, *gr = j->gr + lo;
	float *p_out = j->p_out + lo;

	if (mom == 0.0f) {
		IVDEP
		for (size_t i = 0; i < n; i++) {
			float pi = p[i];
			float g = gr[i] + wd * pi;
			p_out[i] = pi + -lr * g;
		}
		return;
	}
	const float *buf = j->s1 + lo;
	float *buf_out = j->s1_out + lo;
	if (hp->step == 1) {
		IVDEP
		for (size_t i = 0; i < n; i++) {
			float pi = p[i];
			float g = gr[i] + wd * pi;
			buf_out[i] = g;
			g = hp->nesterov ? g + mom * g : g;
			p_out[i] = pi + -lr * g;
		}
	} else if (hp->nesterov) {
		IVDEP
		for (size_t i = 0; i < n; i++) {
			float pi = p[i];
			float g = gr[i] + wd * pi;
			float b = buf[i] * mom + damp1 * g;
			buf_out[i] = b;
			p_out[i] = pi + -lr * (g + mom * b);
		}
	} else {
		IVDEP
		for (size_t i = 0; i < n; i++) {
			float pi = p[i];
			float g = gr[i] + wd * pi;
			float b = buf[i] * mom + damp1 * g;
			buf_out[i] = b;
			p_out[i] = pi + -lr * b;
		}
	}
}

static int sgd_update(tr_backend_t *be, int dev, size_t n, const float *p, const float *gr, const float *buf,
		      float *p_out, float *buf_out, const struct tr_optim_hp *hp)
{
	ENSURE_DEV("sgd_step");
	ENSURE(hp && hp->step >= 1, "sgd_step: step must be >= 1");
	ENSURE(hp->momentum == 0.0f || (buf && buf_out), "sgd_step: momentum needs a state buffer");
	if (n == 0)
		return 0;
	struct upd_job j = {
		.n = n, .p = p, .gr = gr, .s1 = buf, .p_out = p_out, .s1_out = buf_out, .hp = hp, .span = sgd_span};
	return upd_run(be, dev, &j);
}

static int cpu_sgd_step(tr_backend_t *be, int dev, size_t n, float *param, const float *grad, float *state1,
			const struct tr_optim_hp *hp)
{
	return sgd_update(be, dev, n, param, grad, state1, param, state1, hp);
}

static int cpu_sgd_step_into(tr_backend_t *be, int dev, size_t n, const float *param, const float *grad,
			     const float *state1, float *param_out, float *state1_out, const struct tr_optim_hp *hp)
{
	const float *in[] = {param, grad, state1};
	float *out[] = {param_out, state1_out};
	ENSURE(outputs_apart(in, 3, out, 2, n), "sgd_step_into: the output buffers overlap the inputs or each other");
	return sgd_update(be, dev, n, param, grad, state1, param_out, state1_out, hp);
}

/* torch.optim.Adam / AdamW, _single_tensor_adam(w) (foreach=False):
 *   adamw: p *= 1 - lr * wd      adam: g = grad + wd * p
 *   m.lerp_(g, 1 - b1)           (m + (1 - b1) * (g - m))
 *   v = v * b2 + ((1 - b2) * g) * g
 *   denom = sqrt(v) / sqrt(1 - b2^t) + eps
 *   p += -(lr / (1 - b1^t)) * (m / denom)
 * Scalars are formed in double, as Python does, then rounded to float. */
static void adam_span(const struct upd_job *j, size_t lo, size_t n)
{
	const struct tr_optim_hp *hp = j->hp;
	const double b1 = hp->beta1, b2 = hp->beta2, lr = hp->lr, wd = hp->weight_decay;
	const float wd_g = hp->decoupled ? 0.0f : (float)wd;
	const float p_keep = hp->decoupled ? (float)(1.0 - lr * wd) : 1.0f;
	const float w1 = (float)(1.0 - b1), beta2 = (float)b2, w2 = (float)(1.0 - b2);
	const float neg_step = (float)(-(lr / (1.0 - pow(b1, (double)hp->step))));
	const float bc2_sqrt = (float)sqrt(1.0 - pow(b2, (double)hp->step));
	const float eps = hp->eps;
	const float *p = j->p + lo, *gr = j->gr + lo, *m = j->s1 + lo, *v = j->s2 + lo;
	float *p_out = j->p_out + lo, *m_out = j->s1_out + lo, *v_out = j->s2_out + lo;

	IVDEP
	for (size_t i = 0; i < n; i++) {
		float pi = p[i] * p_keep;
		float g = gr[i] + wd_g * pi;
		float m0 = m[i];
		float mi = m0 + w1 * (g - m0);
		float vi = v[i] * beta2 + w2 * g * g;
		float denom = sqrtf(vi) / bc2_sqrt + eps;
		m_out[i] = mi;
		v_out[i] = vi;
		p_out[i] = pi + neg_step * (mi / denom);
	}
}

static int adam_update(tr_backend_t *be, int dev, size_t n, const float *p, const float *gr, const float *m,
		       const float *v, float *p_out, float *m_out, float *v_out, const struct tr_optim_hp *hp)
{
	ENSURE_DEV("adam_step");
	ENSURE(hp && hp->step >= 1, "adam_step: step must be >= 1");
	ENSURE(n == 0 || (m && v && m_out && v_out), "adam_step: needs two state buffers");
	if (n == 0)
		return 0;
	struct upd_job j = {.n = n,
			    .p = p,
			    .gr = gr,
			    .s1 = m,
			    .s2 = v,
			    .p_out = p_out,
			    .s1_out = m_out,
			    .s2_out = v_out,
			    .hp = hp,
			    .span = adam_span};
	return upd_run(be, dev, &j);
}

static int cpu_adam_step(tr_backend_t *be, int dev, size_t n, float *param, const float *grad, float *m, float *v,
			 const struct tr_optim_hp *hp)
{
	return adam_update(be, dev, n, param, grad, m, v, param, m, v, hp);
}

static int cpu_adam_step_into(tr_backend_t *be, int dev, size_t n, const float *param, const float *grad,
			      const float *m, const float *v, float *param_out, float *m_out, float *v_out,
			      const struct tr_optim_hp *hp)
{
	const float *in[] = {param, grad, m, v};
	float *out[] = {param_out, m_out, v_out};
	ENSURE(outputs_apart(in, 4, out, 3, n), "adam_step_into: the output buffers overlap the inputs or each other");
	return adam_update(be, dev, n, param, grad, m, v, param_out, m_out, v_out, hp);
}

void tr_cpu_kernels_fill(tr_backend_i *t)
{
	t->gemm = cpu_gemm;
	t->gemm_bias = cpu_gemm_bias;
	t->gemm_route = cpu_gemm_route;
	t->gemm_accumulate_max_k = cpu_gemm_accumulate_max_k;
	t->add_bias = cpu_add_bias;
	t->col_sum = cpu_col_sum;
	t->act_forward = cpu_act_forward;
	t->act_backward = cpu_act_backward;
	t->dropout_forward = cpu_dropout_forward;
	t->mul = cpu_mul;
	t->layernorm_forward = cpu_layernorm_forward;
	t->layernorm_backward = cpu_layernorm_backward;
	t->softmax_ce = cpu_softmax_ce;
	t->mse = cpu_mse;
	t->scale = cpu_scale;
	t->sumsq = cpu_sumsq;
	t->sumsq_ranges = cpu_sumsq_ranges;
	t->clip_scale = cpu_clip_scale;
	t->sgd_step = cpu_sgd_step;
	t->adam_step = cpu_adam_step;
	t->sgd_step_into = cpu_sgd_step_into;
	t->adam_step_into = cpu_adam_step_into;
}
