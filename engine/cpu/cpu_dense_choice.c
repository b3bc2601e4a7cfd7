/* The measured route of a dense layer's products on CPU devices
 * (tr_cpu_dense_route, docs/design.md "Dense layers on CPU devices").
 *
 * The first time a layer shape (inputs, units) is asked about, each route
 * runs the layer's three products (forward with bias, weight gradient,
 * data gradient) once to warm up (oneDNN makes its primitives, OpenBLAS
 * its buffers) and then three times, alternating, at the rows of the
 * asking job; the lower best time wins.  The routes give different bits,
 * so the decision is kept for the process and in the per-machine file of
 * the conv2d choices (cpu_choice_store.h), keyed by shape alone: every
 * device count and every repeat of a job on the machine takes the same
 * route.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "engine/cpu/cpu_choice_store.h"
#include "engine/cpu/cpu_internal.h"

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

enum { X, W, BIAS, Y, DY, DW, DX, NBUF };

/* One route's three products: milliseconds, or a negative errno. */
static double time_route(tr_backend_t *be, int dev, int route, int in, int out, int rows, float *const *buf)
{
	const tr_backend_i *bi = be->i;
	double t0 = now_ms();
	int rc = bi->gemm_route(be, dev, route, false, true, rows, out, in, buf[X], buf[W], buf[BIAS], buf[Y]);
	if (rc == 0)
		rc = bi->gemm_route(be, dev, route, true, false, out, in, rows, buf[DY], buf[X], NULL, buf[DW]);
	if (rc == 0)
		rc = bi->gemm_route(be, dev, route, false, false, rows, in, out, buf[DY], buf[W], NULL, buf[DX]);
	return rc < 0 ? rc : now_ms() - t0;
}

#define TIMED_ROUNDS 3
static int measure(tr_backend_t *be, int dev, int in, int out, int rows, double *ms)
{
	size_t n[NBUF] = {
		[X] = (size_t)rows * in,   [W] = (size_t)out * in,  [BIAS] = (size_t)out,    [Y] = (size_t)rows * out,
		[DY] = (size_t)rows * out, [DW] = (size_t)out * in, [DX] = (size_t)rows * in};
	float *buf[NBUF] = {0};
	int rc = 0;
	for (int i = 0; i < NBUF && rc == 0; i++) {
		buf[i] = malloc(n[i] * sizeof(float));
		if (!buf[i])
			rc = tr_cpu_set_error(be, -ENOMEM, "dense: out of memory to measure the routes");
		else
			for (size_t e = 0; e < n[i]; e++) /* small values of both signs, no denormals */
				buf[i][e] = (float)((int)(e * 2654435761u % 17) - 8) * 0.01f;
	}
	for (int round = 0; round <= TIMED_ROUNDS && rc == 0; round++)
		for (int r = 0; r < 2 && rc == 0; r++) {
			double t =
				time_route(be, dev, r ? TR_CPU_GEMM_ONEDNN : TR_CPU_GEMM_OPENBLAS, in, out, rows, buf);
			if (t < 0)
				rc = (int)t;
			else if (round == 1 || (round > 1 && t < ms[r]))
				ms[r] = t;
		}
	for (int i = 0; i < NBUF; i++)
		free(buf[i]);
	return rc;
}

int tr_cpu_dense_route(tr_backend_t *be, int dev, int in, int out, int rows, enum tr_cpu_gemm want,
		       struct tr_dense_choice *choice, struct tr_error *err)
{
	struct tr_dense_choice c = {.route = want};
	bool have_dnnl = tr_dnnl_available() && be->i->gemm_route;
	if (want == TR_CPU_GEMM_ONEDNN && !have_dnnl) {
		tr_error_set(err, 0, 0, NULL, "this build has no oneDNN matmul (install libdnnl-dev and rebuild)");
		return -ENOTSUP;
	}
	if (want == TR_CPU_GEMM_AUTO && !have_dnnl)
		c.route = TR_CPU_GEMM_OPENBLAS;
	if (c.route == TR_CPU_GEMM_AUTO) {
		char shape[64];
		int route;
		double ms[2];
		snprintf(shape, sizeof shape, "dense in%d out%d", in, out);
		c.measured = !tr_cpu_choice_find(shape, &route, ms);
		if (c.measured) {
			int rc = measure(be, dev, in, out, rows < 1 ? 1 : rows, ms);
			if (rc < 0) {
				tr_error_set(err, 0, 0, NULL, "dense: measuring the routes failed: %s",
					     be->i->last_error(be));
				return rc;
			}
			/* a tie goes to OpenBLAS, the route of builds without oneDNN */
			route = tr_cpu_choice_keep(shape, ms[1] < ms[0] ? TR_CPU_GEMM_ONEDNN : TR_CPU_GEMM_OPENBLAS,
						   ms);
		}
		c.route = (enum tr_cpu_gemm)route;
		c.openblas_ms = ms[0];
		c.onednn_ms = ms[1];
	}
	if (choice)
		*choice = c;
	return 0;
}

const char *tr_cpu_dense_route_name(enum tr_cpu_gemm route)
{
	return route == TR_CPU_GEMM_ONEDNN ? "onednn" : route == TR_CPU_GEMM_OPENBLAS ? "openblas" : "auto";
}
