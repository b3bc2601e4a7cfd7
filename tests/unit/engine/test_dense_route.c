/* A dense layer's products on CPU devices through either route
 * (engine/cpu/cpu_dnnl_gemm.c, cpu_dense_choice.c): the oneDNN route's
 * bits do not depend on the thread budget, agree with the OpenBLAS route
 * and a double-precision reference within float rounding, and "auto" is
 * measured once per layer shape, then remembered in the process and in
 * the per-machine file.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/backend.h"
#include "engine/cpu/cpu_dnnl_conv.h"
#include "engine/cpu/cpu_dnnl_gemm.h"
#include "engine/trainer_internal.h"

#define NEED_DNNL()                                                             \
	do {                                                                    \
		if (!tr_dnnl_available())                                       \
			cr_skip_test("this build has no oneDNN (libdnnl-dev)"); \
	} while (0)

TestSuite(dense_route, .timeout = 120);

/* A product C[m,n] = op(A) op(B) (+ bias) as a dense layer makes them:
 * forward (N,T), weight gradient (T,N), data gradient (N,N). */
struct product {
	bool ta, tb, bias;
	int m, n, k;
};

/* Sizes past the tiling thresholds (2 and 4 tiles, cut by columns and by
 * rows), a small one-tile product and ragged sizes. */
static const struct product products[] = {
	{false, true, true, 96, 640, 400},    /* forward: 2 column tiles */
	{true, false, false, 640, 96, 400},   /* weight gradient: 2 row tiles */
	{false, false, false, 64, 1024, 520}, /* data gradient: 4 column tiles */
	{false, true, true, 37, 19, 5},       /* one tile */
	{true, false, false, 19, 23, 37},
};

static float *values(size_t n, unsigned seed)
{
	float *v = malloc(n * sizeof *v);
	cr_assert(v);
	for (size_t i = 0; i < n; i++) {
		seed = seed * 1664525u + 1013904223u;
		v[i] = (float)((double)(seed >> 8) / (double)(1u << 24) - 0.5);
	}
	return v;
}

struct operands {
	float *a, *b, *bias;
};

static struct operands operands(const struct product *p)
{
	return (struct operands){values((size_t)p->m * p->k, 1), values((size_t)p->k * p->n, 2),
				 p->bias ? values((size_t)p->n, 3) : NULL};
}

static void operands_free(struct operands *o)
{
	free(o->a);
	free(o->b);
	free(o->bias);
}

/* C on `route` with a backend of one device and `threads` threads. */
static float *run(const struct product *p, const struct operands *o, int route, int threads)
{
	tr_backend_t *be = tr_cpu_backend_create(1, threads);
	cr_assert(be);
	cr_assert(be->i->gemm_route, "the CPU backend has gemm_route");
	float *c = malloc((size_t)p->m * p->n * sizeof *c);
	cr_assert(c);
	for (size_t i = 0; i < (size_t)p->m * p->n; i++)
		c[i] = NAN; /* beta 0: nothing of C may be read */
	int rc = be->i->gemm_route(be, 0, route, p->ta, p->tb, p->m, p->n, p->k, o->a, o->b, o->bias, c);
	cr_assert_eq(rc, 0, "gemm_route: %s", be->i->last_error(be));
	tr_backend_destroy(be);
	return c;
}

/* Element (i, j) of op(X), X stored row-major as cblas reads it. */
static double at(const float *x, bool trans, int rows, int cols, int i, int j)
{
	return trans ? x[(size_t)j * rows + i] : x[(size_t)i * cols + j];
}

static void expect_near_reference(const struct product *p, const struct operands *o, const float *c, const char *what)
{
	for (int i = 0; i < p->m; i++)
		for (int j = 0; j < p->n; j++) {
			double sum = 0, mag = 0;
			for (int l = 0; l < p->k; l++) {
				double t = at(o->a, p->ta, p->m, p->k, i, l) * at(o->b, p->tb, p->k, p->n, l, j);
				sum += t;
				mag += fabs(t);
			}
			if (o->bias) {
				sum += o->bias[j];
				mag += fabs(o->bias[j]);
			}
			double got = c[(size_t)i * p->n + j];
			/* float rounding of a sum of k terms: a few ulps of the
			 * sum of magnitudes */
			cr_assert(fabs(got - sum) <= 1e-6 * (mag + 1) * (1 + sqrt(p->k)),
				  "%s %dx%dx%d: C[%d,%d] = %.9g, reference %.9g", what, p->m, p->n, p->k, i, j, got,
				  sum);
		}
}

Test(dense_route, onednn_bits_do_not_depend_on_the_thread_budget)
{
	NEED_DNNL();
	for (size_t t = 0; t < sizeof products / sizeof products[0]; t++) {
		const struct product *p = &products[t];
		struct operands o = operands(p);
		float *one = run(p, &o, TR_CPU_GEMM_ONEDNN, 1);
		for (int threads = 2; threads <= 3; threads++) {
			float *c = run(p, &o, TR_CPU_GEMM_ONEDNN, threads);
			cr_assert_eq(memcmp(one, c, (size_t)p->m * p->n * sizeof *c), 0,
				     "%dx%dx%d: %d threads' bits differ from 1 thread's", p->m, p->n, p->k, threads);
			free(c);
		}
		free(one);
		operands_free(&o);
	}
}

/* Primitives are made once per tile shape: repeating the products (the
 * steps of a job) on the same backend makes none. */
Test(dense_route, steps_make_no_primitives)
{
	NEED_DNNL();
	tr_backend_t *be = tr_cpu_backend_create(1, 2);
	cr_assert(be);
	const struct product *p = &products[0];
	struct operands o = operands(p);
	float *c = malloc((size_t)p->m * p->n * sizeof *c);
	cr_assert(c);
	unsigned long long made = 0;
	for (int step = 0; step < 4; step++) {
		if (step == 1)
			made = tr_dnnl_gemm_primitives_made();
		cr_assert_eq(be->i->gemm_route(be, 0, TR_CPU_GEMM_ONEDNN, p->ta, p->tb, p->m, p->n, p->k, o.a, o.b,
					       o.bias, c),
			     0, "%s", be->i->last_error(be));
	}
	/* the first call made one per tile shape and thread at most */
	cr_expect_gt(made, 0);
	cr_expect_eq(tr_dnnl_gemm_primitives_made(), made, "steps 2-4 made %llu primitives",
		     tr_dnnl_gemm_primitives_made() - made);
	free(c);
	operands_free(&o);
	tr_backend_destroy(be);
}

Test(dense_route, both_routes_agree_with_a_double_reference)
{
	NEED_DNNL();
	for (size_t t = 0; t < sizeof products / sizeof products[0]; t++) {
		const struct product *p = &products[t];
		struct operands o = operands(p);
		float *dnnl = run(p, &o, TR_CPU_GEMM_ONEDNN, 2);
		float *blas = run(p, &o, TR_CPU_GEMM_OPENBLAS, 2);
		expect_near_reference(p, &o, dnnl, "oneDNN");
		expect_near_reference(p, &o, blas, "OpenBLAS");
		for (size_t i = 0; i < (size_t)p->m * p->n; i++)
			cr_assert(fabsf(dnnl[i] - blas[i]) <= 1e-5f * (1 + fabsf(blas[i])) * sqrtf((float)p->k),
				  "%dx%dx%d: element %zu: oneDNN %.9g, OpenBLAS %.9g", p->m, p->n, p->k, i, dnnl[i],
				  blas[i]);
		free(dnnl);
		free(blas);
		operands_free(&o);
	}
}

/* The OpenBLAS route is gemm_bias's (or gemm's) bits: jobs that take it
 * train exactly as before the routes existed. */
Test(dense_route, openblas_route_is_gemm_bias)
{
	const struct product *p = &products[0];
	struct operands o = operands(p);
	float *routed = run(p, &o, TR_CPU_GEMM_OPENBLAS, 2);
	tr_backend_t *be = tr_cpu_backend_create(1, 2);
	cr_assert(be);
	float *c = malloc((size_t)p->m * p->n * sizeof *c);
	cr_assert(c);
	cr_assert_eq(be->i->gemm_bias(be, 0, p->ta, p->tb, p->m, p->n, p->k, o.a, o.b, o.bias, c), 0);
	cr_assert_eq(memcmp(routed, c, (size_t)p->m * p->n * sizeof *c), 0);
	tr_backend_destroy(be);
	free(c);
	free(routed);
	operands_free(&o);
}

Test(dense_route, a_bad_route_is_an_error)
{
	tr_backend_t *be = tr_cpu_backend_create(1, 1);
	cr_assert(be);
	float a[4] = {1, 2, 3, 4}, c[4];
	cr_assert_lt(be->i->gemm_route(be, 0, TR_CPU_GEMM_AUTO, false, false, 2, 2, 2, a, a, NULL, c), 0);
	cr_assert(strstr(be->i->last_error(be), "route"), "%s", be->i->last_error(be));
	tr_backend_destroy(be);
}

/* auto is a fixed rule, the same for every ask (rows, device counts,
 * processes, daemons): oneDNN's tiles where the build has oneDNN. */
Test(dense_route, auto_is_onednn_where_the_build_has_it)
{
	tr_backend_t *be = tr_cpu_backend_create(1, 1);
	cr_assert(be);
	struct tr_dense_choice c;
	struct tr_error err;
	cr_assert_eq(tr_cpu_dense_route(be, TR_CPU_GEMM_AUTO, &c, &err), 0, "%s", err.message);
	cr_expect_eq(c.route, tr_dnnl_available() ? TR_CPU_GEMM_ONEDNN : TR_CPU_GEMM_OPENBLAS);
	cr_expect(!c.asked);
	tr_backend_destroy(be);
}

Test(dense_route, fixed_routes_are_taken_as_asked)
{
	tr_backend_t *be = tr_cpu_backend_create(1, 1);
	cr_assert(be);
	struct tr_dense_choice c;
	struct tr_error err;
	cr_assert_eq(tr_cpu_dense_route(be, TR_CPU_GEMM_OPENBLAS, &c, &err), 0, "%s", err.message);
	cr_expect(c.asked && c.route == TR_CPU_GEMM_OPENBLAS);
	if (tr_dnnl_available()) {
		cr_assert_eq(tr_cpu_dense_route(be, TR_CPU_GEMM_ONEDNN, &c, &err), 0, "%s", err.message);
		cr_expect(c.asked && c.route == TR_CPU_GEMM_ONEDNN);
	} else {
		cr_expect_eq(tr_cpu_dense_route(be, TR_CPU_GEMM_ONEDNN, &c, &err), -ENOTSUP);
		cr_expect(strstr(err.message, "oneDNN"), "%s", err.message);
	}
	tr_backend_destroy(be);
}

/* A route the build cannot take fails the job naming the spec's field,
 * with the backend's reason after it (the message is not formatted into
 * itself). */
Test(dense_route, a_refused_route_names_the_field)
{
	struct tr_error err = {0};
	snprintf(err.message, sizeof err.message, "this build has no oneDNN matmul");
	tr_trainer_error_at(&err, "/cpu_dense");
	cr_expect_str_eq(err.pointer, "/cpu_dense");
	cr_expect_str_eq(err.message, "/cpu_dense: this build has no oneDNN matmul");
}
