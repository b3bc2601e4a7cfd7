/* Tests of the CPU backend, the reference every other backend is compared
 * with: each kernel against a straightforward double-precision computation
 * on random inputs of awkward sizes, gradients against central finite
 * differences, dropout's split invariance, and the collectives' exact
 * rank-order sums and abort path.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/backend.h"
#include "engine/cpu/cpu_internal.h"
#include "engine/rng.h"

#define NDEV 7

static tr_backend_t *be;

static void setup(void)
{
	/* one BLAS thread per device: deterministic and sanitizer-friendly */
	be = tr_cpu_backend_create(NDEV, NDEV);
	cr_assert(be, "tr_cpu_backend_create failed");
}

static void teardown(void)
{
	tr_backend_destroy(be);
	be = NULL;
}

TestSuite(cpu, .init = setup, .fini = teardown);

/* ---- helpers ------------------------------------------------------------- */

static uint64_t rng_state = 0x1234567887654321ULL;

static double rnd(void) /* uniform in [-1, 1) */
{
	rng_state = tr_mix64(rng_state);
	return (double)(rng_state >> 11) * 0x1p-52 - 1.0;
}

static float *frand(size_t n, double lo, double hi)
{
	float *p = malloc((n ? n : 1) * sizeof(*p));
	cr_assert(p);
	for (size_t i = 0; i < n; i++)
		p[i] = (float)(lo + (hi - lo) * (rnd() + 1.0) / 2.0);
	return p;
}

static float *fdup(const float *x, size_t n)
{
	float *p = malloc((n ? n : 1) * sizeof(*p));
	cr_assert(p);
	memcpy(p, x, n * sizeof(*p));
	return p;
}

static double *dalloc(size_t n)
{
	double *p = calloc(n ? n : 1, sizeof(*p));
	cr_assert(p);
	return p;
}

/* Asserts |got - want| <= atol + rtol * |want| everywhere, naming the first
 * offender. */
static void check_close(const char *what, const float *got, const double *want, size_t n, double rtol, double atol)
{
	for (size_t i = 0; i < n; i++) {
		double err = fabs((double)got[i] - want[i]);
		cr_assert(err <= atol + rtol * fabs(want[i]), "%s[%zu]: got %.9g want %.9g (err %.3g)", what, i,
			  (double)got[i], want[i], err);
	}
}

/* Central difference of f at x[i] in double; the step actually taken is
 * the float-rounded one. */
static double central_diff(float *x, size_t i, double h, double (*f)(void *), void *ctx)
{
	float x0 = x[i];
	float xp = (float)(x0 + h), xm = (float)(x0 - h);
	x[i] = xp;
	double fp = f(ctx);
	x[i] = xm;
	double fm = f(ctx);
	x[i] = x0;
	return (fp - fm) / ((double)xp - (double)xm);
}

static void check_grad(const char *what, const float *got, const double *fd, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		double a = got[i], b = fd[i];
		double tol = 1e-2 * fmax(fabs(a), fabs(b)) + 2e-3;
		cr_assert(fabs(a - b) <= tol, "%s[%zu]: analytic %.7g vs finite difference %.7g", what, i, a, b);
	}
}

static const int odd_sizes[] = {1, 7, 33, 1023};
#define N_ODD (sizeof(odd_sizes) / sizeof(odd_sizes[0]))

/* ---- lifecycle and memory ------------------------------------------------ */

Test(cpu_create, bad_arguments)
{
	cr_assert_null(tr_cpu_backend_create(0, 0));
	cr_assert_null(tr_cpu_backend_create(65, 0));
	cr_assert_null(tr_cpu_backend_create(1, -1));
	tr_backend_destroy(NULL);
	tr_backend_t *b = tr_cpu_backend_create(64, 0);
	cr_assert(b);
	cr_assert_eq(b->i->device_count(b), 64);
	tr_backend_destroy(b);
}

extern int openblas_get_num_threads(void) __attribute__((weak));

/* OpenBLAS runs on one thread whatever the budget: the backend splits the
 * work over its own threads, in pieces that follow from the shapes, so
 * that results do not depend on the thread count (test_thread_count.c
 * checks the bits). */
Test(cpu_create, openblas_runs_on_one_thread)
{
	static const int cases[][2] = {{1, 2}, {4, 3}, {2, 8}, {3, 8}};
	enum { M = 256, N = 256, K = 256 };
	if (!openblas_get_num_threads)
		cr_skip_test("not linked against OpenBLAS");
	float *a = calloc((size_t)M * K, sizeof(float)), *w = calloc((size_t)N * K, sizeof(float));
	float *c = calloc((size_t)M * N, sizeof(float));
	cr_assert(a && w && c);
	for (size_t k = 0; k < 4; k++) {
		tr_backend_t *b = tr_cpu_backend_create(cases[k][0], cases[k][1]);
		cr_assert(b);
		cr_assert_eq(b->i->gemm(b, 0, false, true, M, N, K, 1.0f, a, w, 0.0f, c), 0);
		cr_assert_eq(openblas_get_num_threads(), 1, "devices %d budget %d: %d threads", cases[k][0],
			     cases[k][1], openblas_get_num_threads());
		tr_backend_destroy(b);
	}
	free(a);
	free(w);
	free(c);
}

Test(cpu, names_and_errors)
{
	char buf[32];
	cr_assert_str_eq(be->i->name, "cpu");
	cr_assert_eq(be->i->device_count(be), NDEV);
	be->i->device_name(be, 0, buf, sizeof(buf));
	cr_assert_str_eq(buf, "cpu0");
	be->i->device_name(be, 6, buf, sizeof(buf));
	cr_assert_str_eq(buf, "cpu6");
	cr_assert_eq(be->i->sync(be, 0), 0);
	cr_assert_eq(be->i->sync(be, NDEV), -EINVAL);
	cr_assert(strstr(be->i->last_error(be), "device 7"), "last_error: %s", be->i->last_error(be));
	cr_assert_null(be->i->alloc(be, -1, 16));
}

Test(cpu, memory)
{
	for (size_t bytes = 0; bytes < 300; bytes += 37) {
		unsigned char *p = be->i->alloc(be, 3, bytes);
		cr_assert(p);
		cr_assert_eq((uintptr_t)p % 64, 0);
		for (size_t i = 0; i < bytes; i++)
			cr_assert_eq(p[i], 0);
		be->i->free(be, 3, p);
	}
	float *h = be->i->host_alloc(be, 100 * sizeof(float));
	float *d = be->i->alloc(be, 1, 100 * sizeof(float));
	float *d2 = be->i->alloc(be, 1, 100 * sizeof(float));
	cr_assert(h && d && d2);
	cr_assert_eq((uintptr_t)h % 64, 0);
	for (int i = 0; i < 100; i++)
		h[i] = (float)i * 0.5f;
	cr_assert_eq(be->i->to_device(be, 1, d, h, 100 * sizeof(float)), 0);
	cr_assert_eq(be->i->copy(be, 1, d2, d, 100 * sizeof(float)), 0);
	cr_assert_eq(be->i->memset0(be, 1, h, 100 * sizeof(float)), 0);
	cr_assert_eq(h[99], 0.0f);
	cr_assert_eq(be->i->to_host(be, 1, h, d2, 100 * sizeof(float)), 0);
	cr_assert_eq(be->i->sync(be, 1), 0);
	for (int i = 0; i < 100; i++)
		cr_assert_eq(h[i], (float)i * 0.5f);
	be->i->free(be, 1, d);
	be->i->free(be, 1, d2);
	be->i->free(be, 1, NULL);
	be->i->host_free(be, h);
}

/* ---- gemm ------------------------------------------------------------------ */

static void gemm_case(bool ta, bool tb, int m, int n, int k, float alpha, float beta)
{
	float *a = frand((size_t)m * k, -1, 1), *b = frand((size_t)k * n, -1, 1);
	float *c = frand((size_t)m * n, -1, 1);
	double *want = dalloc((size_t)m * n);
	double *bound = dalloc((size_t)m * n);

	for (int i = 0; i < m; i++) {
		for (int j = 0; j < n; j++) {
			double s = 0, sa = 0;
			for (int p = 0; p < k; p++) {
				double av = ta ? a[(size_t)p * m + i] : a[(size_t)i * k + p];
				double bv = tb ? b[(size_t)j * k + p] : b[(size_t)p * n + j];
				s += av * bv;
				sa += fabs(av * bv);
			}
			double cv = beta == 0.0f ? 0.0 : (double)beta * c[(size_t)i * n + j];
			want[(size_t)i * n + j] = alpha * s + cv;
			bound[(size_t)i * n + j] = 1e-6 * (k + 2) * (fabs(alpha) * sa + fabs(cv)) + 1e-7;
		}
	}
	if (beta == 0.0f) /* beta == 0 must not read C */
		for (size_t i = 0; i < (size_t)m * n; i++)
			c[i] = NAN;
	cr_assert_eq(be->i->gemm(be, 0, ta, tb, m, n, k, alpha, a, b, beta, c), 0);
	for (size_t i = 0; i < (size_t)m * n; i++)
		cr_assert(fabs(c[i] - want[i]) <= bound[i], "gemm ta=%d tb=%d %dx%dx%d beta=%g [%zu]: %.9g vs %.9g", ta,
			  tb, m, n, k, (double)beta, i, (double)c[i], want[i]);
	free(a);
	free(b);
	free(c);
	free(want);
	free(bound);
}

Test(cpu, gemm_transposes_and_beta)
{
	static const int shapes[][3] = {
		{1, 1, 1}, {7, 33, 1}, {33, 7, 1023}, {1023, 7, 33}, {1, 1023, 7}, {33, 1, 1023}, {7, 7, 7},
	};
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
		for (int t = 0; t < 4; t++)
			for (int bz = 0; bz < 2; bz++)
				gemm_case(t & 1, t & 2, shapes[s][0], shapes[s][1], shapes[s][2], bz ? 0.75f : 1.0f,
					  bz ? 1.0f : 0.0f);
}

/* Products large enough to be cut into tiles, along C's rows and along its
 * columns: with beta 0 each tile clears its own part of C (NaN here), so
 * a tile that missed part of C or cleared another's shows. */
Test(cpu, gemm_tiles_clear_their_own_part_of_c)
{
	static const int shapes[][3] = {{48, 1040, 1400}, {1040, 48, 1400}};
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
		for (int t = 0; t < 4; t += 3)
			gemm_case(t & 1, t & 2, shapes[s][0], shapes[s][1], shapes[s][2], 1.0f, 0.0f);
}

Test(cpu, gemm_degenerate)
{
	float c[6] = {1, 2, 3, 4, 5, 6};
	cr_assert_eq(be->i->gemm(be, 0, false, false, 2, 3, 0, 1.0f, NULL, NULL, 2.0f, c), 0);
	cr_assert_eq(c[5], 12.0f);
	cr_assert_eq(be->i->gemm(be, 0, false, false, 2, 3, 0, 1.0f, NULL, NULL, 0.0f, c), 0);
	cr_assert_eq(c[5], 0.0f);
	cr_assert_eq(be->i->gemm(be, 0, false, false, 0, 3, 4, 1.0f, NULL, NULL, 0.0f, c), 0);
	cr_assert_eq(be->i->gemm(be, 0, false, false, -1, 3, 4, 1.0f, c, c, 0.0f, c), -EINVAL);
}

/* gemm_accumulate_max_k's promise at the shapes exact mode folds (the
 * dense weight gradient dW = dy^T x over a shard's rows, in one tile or
 * several): gemm with beta 1 into C has the bits of gemm into zeros and
 * then add.  The bench MLP's shards (32 rows) must qualify, or exact mode
 * falls back to a buffer per shard there. */
Test(cpu, gemm_accumulates_exactly)
{
	static const int shapes[][2] = {{1024, 784}, {1024, 1024}, {10, 1024}, {33, 7}};
	int kmax = be->i->gemm_accumulate_max_k(be);
	cr_assert_geq(kmax, 32, "gemm_accumulate_max_k %d: exact mode's fold would not cover 32-row shards", kmax);
	const int ks[] = {1, 7, 32, kmax};
	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
		for (size_t j = 0; j < sizeof ks / sizeof ks[0]; j++) {
			int m = shapes[s][0], n = shapes[s][1], k = ks[j];
			size_t mn = (size_t)m * n;
			float *dy = frand((size_t)k * m, -1, 1), *x = frand((size_t)k * n, -1, 1);
			float *sum = frand(mn, -4, 4), *fused = malloc(mn * sizeof(float)),
			      *p = malloc(mn * sizeof(float));
			cr_assert(fused && p);
			memcpy(fused, sum, mn * sizeof(float));
			cr_assert_eq(be->i->gemm(be, 0, true, false, m, n, k, 1.0f, dy, x, 0.0f, p), 0);
			cr_assert_eq(be->i->add(be, 0, mn, sum, p, sum), 0);
			cr_assert_eq(be->i->gemm(be, 0, true, false, m, n, k, 1.0f, dy, x, 1.0f, fused), 0);
			for (size_t i = 0; i < mn; i++)
				cr_assert(memcmp(&sum[i], &fused[i], sizeof(float)) == 0,
					  "%dx%dx%d [%zu]: gemm then add %.9g, gemm with beta 1 %.9g", m, n, k, i,
					  (double)sum[i], (double)fused[i]);
			free(dy);
			free(x);
			free(sum);
			free(fused);
			free(p);
		}
	}
}

/* Exact mode's shard products (docs/design.md, "Exact mode": 32-row
 * shards of the bench MLP 784-1024-1024-10 at batch 256, forward, weight
 * and data gradients) are cut into tiles for the device's threads; with
 * the first rule alone (two tiles of 32M multiply-adds) they ran on one
 * thread of two.  A float-path product keeps the first rule's tiles, and
 * no tile is narrower than 16 rows or columns. */
Test(cpu, gemm_tiles_share_shard_products)
{
	static const int shard[][3] = {{32, 1024, 784}, {32, 1024, 1024}, {1024, 1024, 32}, {1024, 784, 32}};
	for (size_t s = 0; s < sizeof shard / sizeof shard[0]; s++) {
		int t = tr_cpu_gemm_tiles(shard[s][0], shard[s][1], shard[s][2]);
		cr_expect_geq(t, 2, "%dx%dx%d: %d tile", shard[s][0], shard[s][1], shard[s][2], t);
		cr_expect_eq(t % 2, 0, "%dx%dx%d: %d tiles, not an even count", shard[s][0], shard[s][1], shard[s][2],
			     t);
	}
	/* the float path's 256-row products: 268M multiply-adds, 8 tiles */
	cr_expect_eq(tr_cpu_gemm_tiles(256, 1024, 1024), 8);
	cr_expect_eq(tr_cpu_gemm_tiles(1024, 1024, 256), 8);
	/* small products stay on one thread */
	cr_expect_eq(tr_cpu_gemm_tiles(32, 128, 64), 1);
	cr_expect_eq(tr_cpu_gemm_tiles(256, 10, 1024), 1);
	for (int m = 1; m <= 4096; m *= 4)
		for (int n = 1; n <= 4096; n *= 4) {
			int t = tr_cpu_gemm_tiles(m, n, 1024), span = m > n ? m : n;
			cr_expect(t == 1 || span / t >= 16, "%dx%dx1024: %d tiles of %d", m, n, t, span / t);
		}
}

/* ---- bias and column sums ------------------------------------------------ */

Test(cpu, add_bias_and_col_sum)
{
	for (size_t ri = 0; ri < N_ODD; ri++) {
		for (size_t ci = 0; ci < N_ODD; ci++) {
			int rows = odd_sizes[ri], cols = odd_sizes[ci];
			if ((size_t)rows * cols > 100000)
				continue;
			size_t n = (size_t)rows * cols;
			float *y = frand(n, -1, 1), *bias = frand(cols, -1, 1), *out = frand(cols, 5, 6);
			double *want = dalloc(n), *wsum = dalloc(cols);
			for (size_t i = 0; i < n; i++)
				want[i] = (double)(y[i] + bias[i % cols]);
			cr_assert_eq(be->i->add_bias(be, 2, rows, cols, y, bias), 0);
			check_close("add_bias", y, want, n, 0, 0);
			for (size_t i = 0; i < n; i++)
				wsum[i % cols] += y[i];
			cr_assert_eq(be->i->col_sum(be, 2, rows, cols, y, out), 0);
			check_close("col_sum", out, wsum, cols, 1e-5, 1e-5);
			free(y);
			free(bias);
			free(out);
			free(want);
			free(wsum);
		}
	}
}

/* gemm_bias is gemm (beta 0) then add_bias, bit for bit, whether the
 * product is one tile or cut along C's rows or columns (each tile adds its
 * own part of the bias: a tile that added another's, or missed its own,
 * shows), and with k = 0 (the bias alone). */
Test(cpu, gemm_bias_is_gemm_then_add_bias)
{
	static const int shapes[][3] = {{7, 33, 5}, {48, 1040, 1400}, {1040, 48, 1400}, {3, 5, 0}};
	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
		for (int t = 0; t < 4; t++) {
			bool ta = t & 1, tb = t & 2;
			int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
			size_t mn = (size_t)m * n;
			float *a = frand((size_t)m * k + 1, -1, 1), *b = frand((size_t)k * n + 1, -1, 1);
			float *bias = frand((size_t)n, -1, 1), *want = malloc(mn * sizeof(float));
			float *got = malloc(mn * sizeof(float));
			cr_assert(want && got);
			for (size_t i = 0; i < mn; i++)
				got[i] = NAN; /* beta 0: C is not read */
			cr_assert_eq(be->i->gemm(be, 1, ta, tb, m, n, k, 1.0f, a, b, 0.0f, want), 0);
			cr_assert_eq(be->i->add_bias(be, 1, m, n, want, bias), 0);
			cr_assert_eq(be->i->gemm_bias(be, 1, ta, tb, m, n, k, a, b, bias, got), 0);
			for (size_t i = 0; i < mn; i++)
				cr_assert(memcmp(&want[i], &got[i], sizeof(float)) == 0,
					  "gemm_bias ta=%d tb=%d %dx%dx%d [%zu]: %.9g, gemm then add_bias %.9g", ta, tb,
					  m, n, k, i, (double)got[i], (double)want[i]);
			free(a);
			free(b);
			free(bias);
			free(want);
			free(got);
		}
	}
}

/* Long column sums are cut into column blocks that the device's threads
 * take: every column is still the float sum over the rows in order, so
 * one thread and two give those bits exactly, for widths that are and
 * are not multiples of the blocks. */
Test(cpu, long_col_sum_in_blocks)
{
	static const int shapes[][2] = {{256, 1024}, {300, 1000}, {70000, 1}, {1, 70000}, {129, 517}};
	tr_backend_t *one = tr_cpu_backend_create(1, 1), *two = tr_cpu_backend_create(1, 2);
	cr_assert(one && two);
	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
		int rows = shapes[s][0], cols = shapes[s][1];
		float *x = frand((size_t)rows * cols, -1, 1), *want = calloc((size_t)cols, sizeof(float));
		float *got1 = frand((size_t)cols, 5, 6), *got2 = frand((size_t)cols, 5, 6);
		cr_assert(want);
		for (int r = 0; r < rows; r++)
			for (int c = 0; c < cols; c++)
				want[c] += x[(size_t)r * cols + c];
		cr_assert_eq(one->i->col_sum(one, 0, rows, cols, x, got1), 0);
		cr_assert_eq(two->i->col_sum(two, 0, rows, cols, x, got2), 0);
		cr_assert(!memcmp(want, got1, (size_t)cols * sizeof(float)), "col_sum %dx%d on one thread", rows, cols);
		cr_assert(!memcmp(want, got2, (size_t)cols * sizeof(float)), "col_sum %dx%d on two threads", rows,
			  cols);
		free(x);
		free(want);
		free(got1);
		free(got2);
	}
	tr_backend_destroy(one);
	tr_backend_destroy(two);
}

/* ---- activations ---------------------------------------------------------- */

static double act_ref(enum tr_act act, double x)
{
	switch (act) {
	case TR_ACT_RELU:
		return x > 0 ? x : 0;
	case TR_ACT_GELU:
		return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
	case TR_ACT_GELU_TANH:
		return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
	case TR_ACT_TANH:
		return tanh(x);
	case TR_ACT_SIGMOID:
		return 1.0 / (1.0 + exp(-x));
	}
	return NAN;
}

static const enum tr_act all_acts[] = {TR_ACT_RELU, TR_ACT_GELU, TR_ACT_GELU_TANH, TR_ACT_TANH, TR_ACT_SIGMOID};
static const char *const act_names[] = {"relu", "gelu", "gelu_tanh", "tanh", "sigmoid"};

Test(cpu, act_forward_reference)
{
	for (size_t a = 0; a < 5; a++) {
		for (size_t s = 0; s < N_ODD; s++) {
			size_t n = (size_t)odd_sizes[s];
			float *x = frand(n, -6, 6), *y = frand(n, 0, 1);
			double *want = dalloc(n);
			x[0] = 0.0f;
			for (size_t i = 0; i < n; i++)
				want[i] = act_ref(all_acts[a], x[i]);
			cr_assert_eq(be->i->act_forward(be, 0, all_acts[a], n, x, y), 0);
			check_close(act_names[a], y, want, n, 2e-6, 2e-7);
			/* in place gives the same */
			cr_assert_eq(be->i->act_forward(be, 0, all_acts[a], n, x, x), 0);
			cr_assert_eq(memcmp(x, y, n * sizeof(float)), 0, "%s in place", act_names[a]);
			free(x);
			free(y);
			free(want);
		}
	}
	float x = 1.0f, y;
	cr_assert_eq(be->i->act_forward(be, 0, (enum tr_act)99, 1, &x, &y), -EINVAL);
}

struct act_ctx {
	enum tr_act act;
	const float *x;
	float *y;
	size_t i; /* element under test */
};

static double act_at(void *p)
{
	struct act_ctx *c = p;
	cr_assert_eq(be->i->act_forward(be, 0, c->act, 1, c->x + c->i, c->y), 0);
	return c->y[0];
}

Test(cpu, act_backward_finite_differences)
{
	const size_t n = 257;
	for (size_t a = 0; a < 5; a++) {
		float *x = frand(n, -4, 4), *y = frand(n, 0, 1), *dy = frand(n, -1, 1), *dx = frand(n, 0, 1);
		double *fd = dalloc(n);
		float ytmp;
		if (all_acts[a] == TR_ACT_RELU) /* keep away from the kink */
			for (size_t i = 0; i < n; i++)
				if (fabsf(x[i]) < 0.01f)
					x[i] = 0.5f;
		cr_assert_eq(be->i->act_forward(be, 0, all_acts[a], n, x, y), 0);
		cr_assert_eq(be->i->act_backward(be, 0, all_acts[a], n, x, y, dy, dx), 0);
		for (size_t i = 0; i < n; i++) {
			struct act_ctx c = {all_acts[a], x, &ytmp, i};
			fd[i] = dy[i] * central_diff(x, i, 1e-3, act_at, &c);
		}
		check_grad(act_names[a], dx, fd, n);
		free(x);
		free(y);
		free(dy);
		free(dx);
		free(fd);
	}
}

Test(cpu, relu_derivative_at_zero)
{
	float x[3] = {0.0f, -0.0f, 1e-30f}, y[3], dy[3] = {1, 1, 1}, dx[3];
	cr_assert_eq(be->i->act_forward(be, 0, TR_ACT_RELU, 3, x, y), 0);
	cr_assert_eq(be->i->act_backward(be, 0, TR_ACT_RELU, 3, x, y, dy, dx), 0);
	cr_assert(dx[0] == 0.0f && dx[1] == 0.0f && dx[2] == 1.0f);
}

/* ---- dropout and elementwise ---------------------------------------------- */

Test(cpu, dropout_split_invariance)
{
	const int rows = 10, cols = 33;
	const uint64_t key = tr_rng_key(42, 3, 7, TR_RNG_DROPOUT);
	float *x = frand((size_t)rows * cols, -1, 1);
	float *y = frand((size_t)rows * cols, 0, 1), *mask = frand((size_t)rows * cols, 0, 1);
	float *y2 = frand((size_t)rows * cols, 0, 1), *mask2 = frand((size_t)rows * cols, 0, 1);
	const float rate = 0.3f;

	cr_assert_eq(be->i->dropout_forward(be, 0, rows, cols, rate, key, 0, x, y, mask), 0);
	cr_assert_eq(be->i->dropout_forward(be, 1, 4, cols, rate, key, 0, x, y2, mask2), 0);
	cr_assert_eq(be->i->dropout_forward(be, 2, 6, cols, rate, key, 4, x + 4 * cols, y2 + 4 * cols,
					    mask2 + 4 * cols),
		     0);
	cr_assert_eq(memcmp(mask, mask2, sizeof(float) * rows * cols), 0);
	cr_assert_eq(memcmp(y, y2, sizeof(float) * rows * cols), 0);
	for (int r = 0; r < rows; r++) {
		for (int c = 0; c < cols; c++) {
			size_t i = (size_t)r * cols + c;
			float want = tr_rng_uniform(key, i) >= rate ? 1.0f / (1.0f - rate) : 0.0f;
			cr_assert_eq(mask[i], want);
			cr_assert_eq(y[i], x[i] * want);
		}
	}
	free(x);
	free(y);
	free(mask);
	free(y2);
	free(mask2);
}

Test(cpu, dropout_keep_fraction_and_edges)
{
	const int rows = 100, cols = 1000;
	const size_t n = (size_t)rows * cols;
	float *x = frand(n, -1, 1), *y = frand(n, 0, 1), *mask = frand(n, 0, 1);
	const float rates[] = {0.1f, 0.5f, 0.9f};

	for (size_t k = 0; k < 3; k++) {
		cr_assert_eq(be->i->dropout_forward(be, 0, rows, cols, rates[k], 99, 123, x, y, mask), 0);
		size_t kept = 0;
		for (size_t i = 0; i < n; i++)
			kept += mask[i] != 0.0f;
		double frac = (double)kept / n, want = 1.0 - rates[k];
		/* 5 binomial standard deviations */
		cr_assert(fabs(frac - want) < 5 * sqrt(want * (1 - want) / n), "rate %g kept %g", (double)rates[k],
			  frac);
	}
	cr_assert_eq(be->i->dropout_forward(be, 0, rows, cols, 0.0f, 99, 0, x, y, mask), 0);
	for (size_t i = 0; i < n; i++)
		cr_assert(mask[i] == 1.0f && y[i] == x[i]);
	cr_assert_eq(be->i->dropout_forward(be, 0, rows, cols, 1.0f, 99, 0, x, y, mask), -EINVAL);
	cr_assert_eq(be->i->dropout_forward(be, 0, rows, cols, -0.1f, 99, 0, x, y, mask), -EINVAL);
	free(x);
	free(y);
	free(mask);
}

/* Long sums are cut into chunks that the device's threads take: the sum
 * matches a direct one, is the same bits on one thread and on two, and
 * sees a NaN in the last chunk (stop_on_nan relies on it). */
Test(cpu, long_sumsq_in_chunks)
{
	size_t sizes[] = {((size_t)1 << 16) + 1, 3 * ((size_t)1 << 16) + 5};
	tr_backend_t *one = tr_cpu_backend_create(1, 1), *two = tr_cpu_backend_create(1, 2);
	cr_assert(one && two);
	for (size_t s = 0; s < 2; s++) {
		size_t n = sizes[s];
		float *a = frand(n, -2, 2);
		double ss = 0, got1 = -1, got2 = -1;
		for (size_t i = 0; i < n; i++)
			ss += (double)a[i] * a[i];
		cr_assert_eq(one->i->sumsq(one, 0, n, a, &got1), 0);
		cr_assert_eq(two->i->sumsq(two, 0, n, a, &got2), 0);
		cr_assert(fabs(got1 - ss) <= 1e-12 * ss, "sumsq of %zu: %.17g vs %.17g", n, got1, ss);
		cr_assert(!memcmp(&got1, &got2, sizeof got1), "sumsq of %zu: %.17g on one thread, %.17g on two", n,
			  got1, got2);
		a[n - 1] = NAN;
		cr_assert_eq(two->i->sumsq(two, 0, n, a, &got2), 0);
		cr_assert(isnan(got2), "a NaN in the last chunk gave %g", got2);
		free(a);
	}
	tr_backend_destroy(one);
	tr_backend_destroy(two);
}

static double cpu_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A device with nothing to do must not keep burning a core: its pool's
 * threads sleep between runs (cpu_pool.c; a watch for work before
 * sleeping, tried for faster handoffs, must stay short).  Runs back to
 * back still give the right sums. */
Test(cpu, idle_pool_sleeps)
{
	size_t n = 4 * ((size_t)1 << 16);
	float *a = frand(n, -1, 1);
	double want = 0, got = 0;
	for (size_t i = 0; i < n; i++)
		want += (double)a[i] * a[i];
	tr_backend_t *two = tr_cpu_backend_create(1, 2);
	cr_assert(two);
	for (int i = 0; i < 200; i++) {
		cr_assert_eq(two->i->sumsq(two, 0, n, a, &got), 0);
		cr_assert(fabs(got - want) <= 1e-12 * want, "run %d: sumsq %.17g vs %.17g", i, got, want);
	}
	/* OpenBLAS's own threads, once woken (with OPENBLAS_NUM_THREADS=1
	 * this test measured nothing before the wait), watch for work for
	 * about 0.1 s before they sleep (its thread timeout): let that pass
	 * before measuring the pool's. */
	struct timespec settle = {.tv_nsec = 500 * 1000 * 1000};
	nanosleep(&settle, NULL);
	double c0 = cpu_s();
	struct timespec pause = {.tv_nsec = 300 * 1000 * 1000};
	nanosleep(&pause, NULL);
	double idle_ms = (cpu_s() - c0) * 1e3;
	/* Spinning for the whole pause would take about 300 ms of CPU on an
	 * idle machine. */
	cr_assert(idle_ms < 5.0, "an idle pool used %.1f ms of CPU in 300 ms", idle_ms);
	tr_backend_destroy(two);
	free(a);
}

Test(cpu, mul_scale_sumsq)
{
	for (size_t s = 0; s < N_ODD; s++) {
		size_t n = (size_t)odd_sizes[s] * 3;
		float *a = frand(n, -2, 2), *b = frand(n, -2, 2), *o = frand(n, 0, 1);
		double *want = dalloc(n);
		for (size_t i = 0; i < n; i++)
			want[i] = (double)(a[i] * b[i]);
		cr_assert_eq(be->i->mul(be, 0, n, a, b, o), 0);
		check_close("mul", o, want, n, 0, 0);
		for (size_t i = 0; i < n; i++)
			want[i] = (double)(o[i] * -1.5f);
		cr_assert_eq(be->i->scale(be, 0, n, o, -1.5f), 0);
		check_close("scale", o, want, n, 0, 0);
		double ss = 0, got = -1;
		for (size_t i = 0; i < n; i++)
			ss += (double)a[i] * a[i];
		cr_assert_eq(be->i->sumsq(be, 0, n, a, &got), 0);
		cr_assert(fabs(got - ss) <= 1e-12 * ss, "sumsq %.17g vs %.17g", got, ss);
		free(a);
		free(b);
		free(o);
		free(want);
	}
	double got = -1;
	cr_assert_eq(be->i->sumsq(be, 0, 0, NULL, &got), 0);
	cr_assert_eq(got, 0.0);
}

/* ---- layernorm -------------------------------------------------------------- */

Test(cpu, layernorm_forward_reference)
{
	for (size_t ri = 0; ri < 3; ri++) {
		for (size_t ci = 0; ci < N_ODD; ci++) {
			int rows = odd_sizes[ri], cols = odd_sizes[ci];
			size_t n = (size_t)rows * cols;
			float *x = frand(n, -3, 5), *g = frand(cols, 0.5, 1.5), *bt = frand(cols, -1, 1);
			float *y = frand(n, 0, 1), *mean = frand(rows, 0, 1), *rstd = frand(rows, 0, 1);
			double *want = dalloc(n), *wm = dalloc(rows), *wr = dalloc(rows);
			const double eps = 1e-5;
			for (int r = 0; r < rows; r++) {
				double s = 0, v = 0;
				for (int c = 0; c < cols; c++)
					s += x[(size_t)r * cols + c];
				s /= cols;
				for (int c = 0; c < cols; c++)
					v += pow(x[(size_t)r * cols + c] - s, 2);
				v /= cols;
				wm[r] = s;
				wr[r] = 1.0 / sqrt(v + eps);
				for (int c = 0; c < cols; c++)
					want[(size_t)r * cols + c] =
						(x[(size_t)r * cols + c] - s) * wr[r] * g[c] + bt[c];
			}
			cr_assert_eq(be->i->layernorm_forward(be, 0, rows, cols, (float)eps, x, g, bt, y, mean, rstd),
				     0);
			check_close("layernorm y", y, want, n, 1e-5, 1e-5);
			check_close("layernorm mean", mean, wm, rows, 1e-6, 1e-6);
			check_close("layernorm rstd", rstd, wr, rows, 1e-6, 0);
			free(x);
			free(g);
			free(bt);
			free(y);
			free(mean);
			free(rstd);
			free(want);
			free(wm);
			free(wr);
		}
	}
}

/* L = sum w * layernorm(x; gamma, beta), evaluated in double over float y. */
struct ln_ctx {
	int rows, cols;
	float *x, *g, *b, *y, *mean, *rstd;
	const float *w;
};

static double ln_loss(void *p)
{
	struct ln_ctx *c = p;
	cr_assert_eq(be->i->layernorm_forward(be, 0, c->rows, c->cols, 1e-5f, c->x, c->g, c->b, c->y, c->mean, c->rstd),
		     0);
	double l = 0;
	for (size_t i = 0; i < (size_t)c->rows * c->cols; i++)
		l += (double)c->w[i] * c->y[i];
	return l;
}

Test(cpu, layernorm_backward_finite_differences)
{
	static const int shapes[][2] = {{1, 7}, {3, 7}, {2, 33}, {4, 1}};
	for (size_t s = 0; s < 4; s++) {
		int rows = shapes[s][0], cols = shapes[s][1];
		size_t n = (size_t)rows * cols;
		struct ln_ctx c = {rows,
				   cols,
				   frand(n, -2, 2),
				   frand(cols, 0.5, 1.5),
				   frand(cols, -1, 1),
				   frand(n, 0, 1),
				   frand(rows, 0, 1),
				   frand(rows, 0, 1),
				   frand(n, -1, 1)};
		float *dx = frand(n, 0, 1), *dg = frand(cols, -1, 1), *db = frand(cols, -1, 1);
		float *dg0 = fdup(dg, cols), *db0 = fdup(db, cols);
		double *fd = dalloc(n + 2 * (size_t)cols);

		ln_loss(&c);
		cr_assert_eq(be->i->layernorm_backward(be, 0, rows, cols, c.x, c.g, c.mean, c.rstd, c.w, dx, dg, db),
			     0);
		for (size_t i = 0; i < n; i++)
			fd[i] = central_diff(c.x, i, 1e-3, ln_loss, &c);
		check_grad("layernorm dx", dx, fd, n);
		/* dgamma/dbeta were added to the prefilled values */
		for (int k = 0; k < cols; k++) {
			fd[k] = dg0[k] + central_diff(c.g, k, 1e-3, ln_loss, &c);
			fd[cols + k] = db0[k] + central_diff(c.b, k, 1e-3, ln_loss, &c);
		}
		check_grad("layernorm dgamma", dg, fd, cols);
		check_grad("layernorm dbeta", db, fd + cols, cols);
		free(c.x);
		free(c.g);
		free(c.b);
		free(c.y);
		free(c.mean);
		free(c.rstd);
		free((void *)c.w);
		free(dx);
		free(dg);
		free(db);
		free(dg0);
		free(db0);
		free(fd);
	}
}

/* ---- losses ------------------------------------------------------------------ */

Test(cpu, softmax_ce_reference)
{
	for (size_t ri = 0; ri < N_ODD; ri++) {
		for (size_t ci = 0; ci < 3; ci++) {
			int rows = odd_sizes[ri], classes = odd_sizes[ci];
			size_t n = (size_t)rows * classes;
			float *z = frand(n, -5, 5), *d = frand(n, 0, 1), *lab = malloc(rows * sizeof(float));
			double *want = dalloc(n), wl = 0, wc = 0, out[2] = {1.5, 2.0};
			const float scale = 0.25f;
			for (int r = 0; r < rows; r++) {
				int l = (int)((rnd() + 1) / 2 * classes);
				lab[r] = (float)(l < classes ? l : classes - 1);
				const float *zr = z + (size_t)r * classes;
				double mx = zr[0], s = 0;
				int arg = 0;
				for (int c = 1; c < classes; c++)
					if (zr[c] > mx) {
						mx = zr[c];
						arg = c;
					}
				for (int c = 0; c < classes; c++)
					s += exp(zr[c] - mx);
				wl += log(s) + mx - zr[(int)lab[r]];
				wc += arg == (int)lab[r];
				for (int c = 0; c < classes; c++)
					want[(size_t)r * classes + c] =
						scale * (exp(zr[c] - mx) / s - (c == (int)lab[r]));
			}
			cr_assert_eq(be->i->softmax_ce(be, 0, rows, classes, z, lab, scale, d, out), 0);
			check_close("softmax_ce dlogits", d, want, n, 1e-5, 1e-7);
			cr_assert(fabs(out[0] - 1.5 - wl) <= 1e-5 * (fabs(wl) + 1), "loss %.9g vs %.9g", out[0] - 1.5,
				  wl);
			cr_assert_eq(out[1], 2.0 + wc);
			free(z);
			free(d);
			free(lab);
			free(want);
		}
	}
}

Test(cpu, softmax_ce_stable_and_ties)
{
	float z[6] = {1000.0f, 0.0f, -1000.0f, 3.0f, 3.0f, 3.0f}, lab[2] = {1, 1}, d[6];
	double out[2] = {0, 0};
	cr_assert_eq(be->i->softmax_ce(be, 0, 2, 3, z, lab, 1.0f, d, out), 0);
	/* row 0: loss 1000, row 1: log 3; argmax ties go to the first class */
	cr_assert(fabs(out[0] - (1000.0 + log(3.0))) < 1e-4, "loss %.9g", out[0]);
	cr_assert_eq(out[1], 0.0);
	cr_assert(isfinite(d[0]) && fabsf(d[0] - 1.0f) < 1e-6f && fabsf(d[1] + 1.0f) < 1e-6f);
	lab[1] = 0;
	cr_assert_eq(be->i->softmax_ce(be, 0, 2, 3, z, lab, 1.0f, NULL, out), 0);
	cr_assert_eq(out[1], 1.0);
}

struct ce_ctx {
	int rows, classes;
	float *z;
	const float *lab;
	float scale;
	bool mse;
};

static double loss_at(void *p)
{
	struct ce_ctx *c = p;
	double out[2] = {0, 0};
	if (c->mse)
		cr_assert_eq(be->i->mse(be, 0, c->rows, c->classes, c->z, c->lab, c->scale, NULL, out), 0);
	else
		cr_assert_eq(be->i->softmax_ce(be, 0, c->rows, c->classes, c->z, c->lab, c->scale, NULL, out), 0);
	return c->scale * out[0];
}

Test(cpu, loss_gradients_finite_differences)
{
	for (int mse = 0; mse < 2; mse++) {
		const int rows = 5, cols = 7;
		size_t n = (size_t)rows * cols;
		float *z = frand(n, -2, 2), *d = frand(n, 0, 1);
		float *lab = mse ? frand(n, -1, 1) : malloc(rows * sizeof(float));
		double *fd = dalloc(n);
		if (!mse)
			for (int r = 0; r < rows; r++)
				lab[r] = (float)((r * 3) % cols);
		struct ce_ctx c = {rows, cols, z, lab, 0.5f, mse};
		double out[2] = {0, 0};
		if (mse)
			cr_assert_eq(be->i->mse(be, 0, rows, cols, z, lab, c.scale, d, out), 0);
		else
			cr_assert_eq(be->i->softmax_ce(be, 0, rows, cols, z, lab, c.scale, d, out), 0);
		for (size_t i = 0; i < n; i++)
			fd[i] = central_diff(z, i, 1e-3, loss_at, &c);
		check_grad(mse ? "mse dpred" : "softmax_ce dlogits", d, fd, n);
		free(z);
		free(d);
		free(lab);
		free(fd);
	}
}

Test(cpu, softmax_ce_bad_labels)
{
	float z[9] = {0}, d[9], lab[3] = {0, 1, 2};
	const float bad[] = {1.5f, -1.0f, 3.0f, NAN, INFINITY};
	for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
		double out[2] = {7, 8};
		lab[2] = bad[k];
		cr_assert_eq(be->i->softmax_ce(be, 0, 3, 3, z, lab, 1.0f, d, out), -EINVAL);
		cr_assert(out[0] == 7 && out[1] == 8, "outputs touched on error");
		const char *msg = be->i->last_error(be);
		cr_assert(strstr(msg, "row 2"), "message: %s", msg);
	}
	lab[2] = 1.5f;
	be->i->softmax_ce(be, 0, 3, 3, z, lab, 1.0f, d, NULL);
	cr_assert(strstr(be->i->last_error(be), "1.5"), "message: %s", be->i->last_error(be));
}

Test(cpu, mse_reference)
{
	for (size_t ri = 0; ri < N_ODD; ri++) {
		for (size_t ci = 0; ci < 3; ci++) {
			int rows = odd_sizes[ri], cols = odd_sizes[ci];
			size_t n = (size_t)rows * cols;
			float *p = frand(n, -2, 2), *t = frand(n, -2, 2), *d = frand(n, 0, 1);
			double *want = dalloc(n), wl = 0, out[2] = {3.0, 0};
			const float scale = 0.125f;
			for (int r = 0; r < rows; r++) {
				double s = 0;
				for (int c = 0; c < cols; c++) {
					size_t i = (size_t)r * cols + c;
					double df = (double)p[i] - t[i];
					s += df * df;
					want[i] = scale * 2.0 * df / cols;
				}
				wl += s / cols;
			}
			cr_assert_eq(be->i->mse(be, 0, rows, cols, p, t, scale, d, out), 0);
			check_close("mse dpred", d, want, n, 1e-6, 1e-8);
			cr_assert(fabs(out[0] - 3.0 - wl) <= 1e-9 * (wl + 1), "mse %.12g vs %.12g", out[0] - 3, wl);
			free(p);
			free(t);
			free(d);
			free(want);
		}
	}
}

/* ---- errors from concurrent device threads ------------------------------------- */

struct err_arg {
	int dev;
	bool ok;
};

static void *err_thread(void *p)
{
	struct err_arg *a = p;
	char want[32];
	float z[2] = {0, 0}, lab = (float)(10 + a->dev);
	a->ok = true;
	snprintf(want, sizeof(want), "label %d ", 10 + a->dev);
	for (int k = 0; k < 200 && a->ok; k++) {
		if (be->i->softmax_ce(be, a->dev, 1, 2, z, &lab, 1.0f, NULL, NULL) != -EINVAL)
			a->ok = false;
		if (!strstr(be->i->last_error(be), want))
			a->ok = false;
	}
	return NULL;
}

Test(cpu, last_error_is_per_thread)
{
	pthread_t th[4];
	struct err_arg args[4];
	for (int i = 0; i < 4; i++) {
		args[i].dev = i;
		cr_assert_eq(pthread_create(&th[i], NULL, err_thread, &args[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		cr_assert(args[i].ok, "thread %d saw another thread's error", i);
	}
	/* a thread that raised nothing sees the latest error of any thread */
	cr_assert(strstr(be->i->last_error(be), "softmax_ce"), "%s", be->i->last_error(be));
}

/* ---- collectives --------------------------------------------------------------- */

struct ar_arg {
	tr_comm_t *comm;
	int rank;
	float *buf;
	size_t n;
	int rounds;
	int rc;
	float *const *inputs; /* per round * ndev, to reload the buffer */
	float **results;      /* per round: copy of the buffer after the call */
	int ndev;
};

static void *ar_thread(void *p)
{
	struct ar_arg *a = p;
	for (int k = 0; k < a->rounds; k++) {
		memcpy(a->buf, a->inputs[k * a->ndev + a->rank], a->n * sizeof(float));
		a->rc = be->i->allreduce_sum(a->comm, a->rank, a->buf, a->n);
		if (a->rc)
			return NULL;
		memcpy(a->results[k], a->buf, a->n * sizeof(float));
	}
	return NULL;
}

static void allreduce_case(int ndev, size_t n)
{
	const int rounds = 3;
	tr_comm_t *comm = be->i->comm_create(be, ndev, NULL);
	cr_assert(comm, "comm_create(%d): %s", ndev, be->i->last_error(be));
	float **inputs = calloc((size_t)rounds * ndev, sizeof(*inputs));
	struct ar_arg *args = calloc(ndev, sizeof(*args));
	pthread_t *th = calloc(ndev, sizeof(*th));
	float *want = frand(n, 0, 1);
	for (int i = 0; i < rounds * ndev; i++)
		inputs[i] = frand(n, -1000, 1000);
	for (int r = 0; r < ndev; r++) {
		args[r] = (struct ar_arg){comm, r,   be->i->alloc(be, r, n * sizeof(float)), n, rounds, -1, inputs,
					  NULL, ndev};
		args[r].results = calloc(rounds, sizeof(float *));
		for (int k = 0; k < rounds; k++)
			args[r].results[k] = frand(n, 0, 1);
		cr_assert_eq(pthread_create(&th[r], NULL, ar_thread, &args[r]), 0);
	}
	for (int r = 0; r < ndev; r++)
		pthread_join(th[r], NULL);
	for (int k = 0; k < rounds; k++) {
		/* the rank-order float sum, bit for bit */
		for (size_t i = 0; i < n; i++) {
			float s = inputs[k * ndev][i];
			for (int r = 1; r < ndev; r++)
				s += inputs[k * ndev + r][i];
			want[i] = s;
		}
		for (int r = 0; r < ndev; r++) {
			cr_assert_eq(args[r].rc, 0, "ndev %d rank %d rc %d", ndev, r, args[r].rc);
			cr_assert_eq(memcmp(args[r].results[k], want, n * sizeof(float)), 0,
				     "ndev %d n %zu round %d rank %d differs from the rank-order sum", ndev, n, k, r);
		}
	}
	for (int r = 0; r < ndev; r++) {
		be->i->free(be, r, args[r].buf);
		for (int k = 0; k < rounds; k++)
			free(args[r].results[k]);
		free(args[r].results);
	}
	for (int i = 0; i < rounds * ndev; i++)
		free(inputs[i]);
	free(inputs);
	free(args);
	free(th);
	free(want);
	be->i->comm_destroy(comm);
}

Test(cpu, allreduce_rank_order_sum)
{
	static const int ndevs[] = {1, 2, 3, 4, 7};
	static const size_t ns[] = {0, 1, 5, 1023, 100003};
	for (size_t d = 0; d < 5; d++)
		for (size_t k = 0; k < 5; k++)
			allreduce_case(ndevs[d], ns[k]);
}

Test(cpu, comm_create_bad_arguments)
{
	int dup[2] = {1, 1}, range[2] = {0, NDEV};
	cr_assert_null(be->i->comm_create(be, 0, NULL));
	cr_assert_null(be->i->comm_create(be, NDEV + 1, NULL));
	cr_assert_null(be->i->comm_create(be, 2, dup));
	cr_assert(strstr(be->i->last_error(be), "twice"));
	cr_assert_null(be->i->comm_create(be, 2, range));
	be->i->comm_destroy(NULL);
	be->i->comm_abort(NULL);
}

struct block_arg {
	tr_comm_t *comm;
	int rank;
	size_t n;
	int rc;
	bool null_buf;
};

static void *block_thread(void *p)
{
	struct block_arg *a = p;
	float buf[4] = {1, 2, 3, 4};
	a->rc = be->i->allreduce_sum(a->comm, a->rank, a->null_buf ? NULL : buf, a->n);
	return NULL;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

Test(cpu, comm_abort_wakes_blocked_rank)
{
	tr_comm_t *comm = be->i->comm_create(be, 2, NULL);
	struct block_arg a = {comm, 0, 4, 1, false};
	pthread_t th;
	struct timespec deadline;
	cr_assert(comm);
	cr_assert_eq(pthread_create(&th, NULL, block_thread, &a), 0);
	/* rank 1 never arrives */
	nanosleep(&(struct timespec){0, 100 * 1000 * 1000}, NULL);
	double t0 = now_s();
	be->i->comm_abort(comm);
	clock_gettime(CLOCK_REALTIME, &deadline);
	deadline.tv_sec += 1;
	cr_assert_eq(pthread_timedjoin_np(th, NULL, &deadline), 0, "rank 0 still blocked 1 s after abort");
	cr_assert(now_s() - t0 < 1.0);
	cr_assert_eq(a.rc, -ECANCELED);
	/* later calls fail at once, for every rank count */
	float buf[4] = {0};
	cr_assert_eq(be->i->allreduce_sum(comm, 1, buf, 4), -ECANCELED);
	be->i->comm_destroy(comm);

	comm = be->i->comm_create(be, 1, NULL);
	cr_assert_eq(be->i->allreduce_sum(comm, 0, buf, 4), 0);
	be->i->comm_abort(comm);
	cr_assert_eq(be->i->allreduce_sum(comm, 0, buf, 4), -ECANCELED);
	cr_assert_eq(be->i->allreduce_sum(comm, 1, buf, 4), -EINVAL);
	be->i->comm_destroy(comm);
}

Test(cpu, allreduce_length_mismatch)
{
	tr_comm_t *comm = be->i->comm_create(be, 2, NULL);
	struct block_arg a = {comm, 0, 4, 1, false}, b = {comm, 1, 3, 1, false};
	pthread_t ta, tb;
	cr_assert(comm);
	cr_assert_eq(pthread_create(&ta, NULL, block_thread, &a), 0);
	cr_assert_eq(pthread_create(&tb, NULL, block_thread, &b), 0);
	pthread_join(ta, NULL);
	pthread_join(tb, NULL);
	cr_assert_eq(a.rc, -EINVAL);
	cr_assert_eq(b.rc, -EINVAL);
	cr_assert(strstr(be->i->last_error(be), "different lengths"), "%s", be->i->last_error(be));
	/* the comm stays usable; a NULL buffer fails every rank alike */
	a.null_buf = true;
	b.n = 4;
	cr_assert_eq(pthread_create(&ta, NULL, block_thread, &a), 0);
	cr_assert_eq(pthread_create(&tb, NULL, block_thread, &b), 0);
	pthread_join(ta, NULL);
	pthread_join(tb, NULL);
	cr_assert_eq(a.rc, -EINVAL);
	cr_assert_eq(b.rc, -EINVAL);
	a.null_buf = false;
	cr_assert_eq(pthread_create(&ta, NULL, block_thread, &a), 0);
	cr_assert_eq(pthread_create(&tb, NULL, block_thread, &b), 0);
	pthread_join(ta, NULL);
	pthread_join(tb, NULL);
	cr_assert_eq(a.rc, 0);
	cr_assert_eq(b.rc, 0);
	be->i->comm_destroy(comm);
}

/* Device threads call BLAS at the same time; each must get its own result. */
struct gemm_arg {
	int dev;
	bool ok;
};

static void *gemm_thread(void *p)
{
	struct gemm_arg *a = p;
	const int m = 65, n = 47, k = 129;
	float *x = malloc(sizeof(float) * m * k), *w = malloc(sizeof(float) * k * n),
	      *c = malloc(sizeof(float) * m * n);
	for (int i = 0; i < m * k; i++)
		x[i] = (float)((i * 7 + a->dev) % 13) - 6.0f;
	for (int i = 0; i < k * n; i++)
		w[i] = (float)((i * 5 + 2 * a->dev) % 11) - 5.0f;
	a->ok = true;
	for (int rep = 0; rep < 5 && a->ok; rep++) {
		if (be->i->gemm(be, a->dev, false, false, m, n, k, 1.0f, x, w, 0.0f, c))
			a->ok = false;
		/* small integers: the product is exact in float */
		for (int i = 0; i < m && a->ok; i += 8)
			for (int j = 0; j < n; j += 5) {
				float s = 0;
				for (int q = 0; q < k; q++)
					s += x[i * k + q] * w[q * n + j];
				if (s != c[i * n + j])
					a->ok = false;
			}
	}
	free(x);
	free(w);
	free(c);
	return NULL;
}

Test(cpu, concurrent_gemm_from_device_threads)
{
	pthread_t th[4];
	struct gemm_arg args[4];
	for (int i = 0; i < 4; i++) {
		args[i].dev = i;
		cr_assert_eq(pthread_create(&th[i], NULL, gemm_thread, &args[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		cr_assert(args[i].ok, "device %d got a wrong product", i);
	}
}

/* ---- a step's device-side results (docs/design.md, "Host waits") -------- */

/* Per-layer norms in one call: each range's sum as sumsq's over it. */
Test(cpu, sumsq_ranges_as_sumsq)
{
	float x[40];
	for (int i = 0; i < 40; i++)
		x[i] = (float)(i % 7) - 3.5f;
	size_t off[3] = {0, 10, 33}, len[3] = {10, 0, 7};
	double got[3] = {-1, -1, -1};
	cr_assert_eq(be->i->sumsq_ranges(be, 0, 3, off, len, x, got), 0);
	for (int k = 0; k < 3; k++) {
		double want = -1;
		cr_assert_eq(be->i->sumsq(be, 0, len[k], x + off[k], &want), 0);
		cr_assert(memcmp(&got[k], &want, sizeof want) == 0, "range %d: %.17g vs %.17g", k, got[k], want);
	}
	cr_assert_eq(got[1], 0.0);
	cr_assert_eq(be->i->sumsq_ranges(be, 0, 0, off, len, x, got), -EINVAL);
	cr_assert_eq(be->i->sumsq_ranges(be, 0, TR_SUMSQ_MAX_RANGES + 1, off, len, x, got), -EINVAL);
}

/* torch.nn.utils.clip_grad_norm_: scaled by max / (norm + 1e-6) below the
 * norm, untouched at or above it and when the sum is not finite. */
Test(cpu, clip_scale_as_torch)
{
	float x[4] = {3, 4, 0, 0}; /* norm 5 */
	double ss = 25.0;
	cr_assert_eq(be->i->clip_scale(be, 0, 4, x, 1.0f, &ss), 0);
	float coef = (float)(1.0 / (5.0 + 1e-6));
	cr_assert(x[0] == 3 * coef && x[1] == 4 * coef && x[2] == 0, "%g %g", x[0], x[1]);
	float y[2] = {3, 4};
	cr_assert_eq(be->i->clip_scale(be, 0, 2, y, 10.0f, &ss), 0);
	cr_assert(y[0] == 3 && y[1] == 4, "scaled above the norm");
	double bad = NAN;
	cr_assert_eq(be->i->clip_scale(be, 0, 2, y, 1.0f, &bad), 0);
	cr_assert(y[0] == 3 && y[1] == 4, "scaled by a NaN norm");
}

/* stop_on_nan's gate: a sum that is not finite leaves param and state as
 * they were (an _into update copies them to its outputs); a finite one
 * updates as without the gate. */
Test(cpu, optimizer_gate)
{
	const size_t n = 5;
	for (int adam = 0; adam < 2; adam++) {
		for (int finite = 0; finite < 2; finite++) {
			float p[5] = {1, -2, 3, -4, 5}, g[5] = {0.5f, 0.25f, -1, 2, 0}, m[5] = {0}, v[5] = {0};
			float p0[5], po[5] = {0}, mo[5] = {0}, vo[5] = {0};
			memcpy(p0, p, sizeof p);
			double gate = finite ? 1.0 : INFINITY;
			struct tr_optim_hp hp = {.lr = 0.1f,
						 .momentum = 0.9f,
						 .beta1 = 0.9f,
						 .beta2 = 0.999f,
						 .eps = 1e-8f,
						 .step = 1,
						 .skip_unless_finite = &gate};
			struct tr_optim_hp plain = hp;
			plain.skip_unless_finite = NULL;
			float pp[5], pm[5] = {0}, pv[5] = {0};
			memcpy(pp, p, sizeof p);
			if (adam) {
				cr_assert_eq(be->i->adam_step_into(be, 0, n, p, g, m, v, po, mo, vo, &hp), 0);
				cr_assert_eq(be->i->adam_step(be, 0, n, p, g, m, v, &hp), 0);
				cr_assert_eq(be->i->adam_step(be, 0, n, pp, g, pm, pv, &plain), 0);
			} else {
				cr_assert_eq(be->i->sgd_step_into(be, 0, n, p, g, m, po, mo, &hp), 0);
				cr_assert_eq(be->i->sgd_step(be, 0, n, p, g, m, &hp), 0);
				cr_assert_eq(be->i->sgd_step(be, 0, n, pp, g, pm, &plain), 0);
			}
			cr_assert(memcmp(po, p, sizeof p) == 0, "adam %d finite %d: _into differs", adam, finite);
			if (finite)
				cr_assert(memcmp(p, pp, sizeof p) == 0, "adam %d: a finite gate changed the update",
					  adam);
			else
				cr_assert(memcmp(p, p0, sizeof p) == 0 && memcmp(mo, m, sizeof m) == 0,
					  "adam %d: updated behind a gate that is not finite", adam);
		}
	}
}
