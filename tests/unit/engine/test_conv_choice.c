/* The CPU backend's conv2d route choice (engine/cpu/cpu_conv_choice.c):
 * "auto" is measured once per shape and then remembered, in the process
 * and in the per-machine file, which a later process reads instead of
 * measuring; fixed routes are not measured; a layer's own route
 * (tr_conv2d_desc.route) wins over the backend's setting.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/backend.h"
#include "engine/cpu/cpu_dnnl_conv.h"
#include "engine/rng.h"

#define NEED_DNNL()                                                             \
	do {                                                                    \
		if (!tr_dnnl_available())                                       \
			cr_skip_test("this build has no oneDNN (libdnnl-dev)"); \
	} while (0)

TestSuite(conv_choice, .timeout = 120);

/* a small layer: measuring it takes milliseconds */
static const struct tr_conv2d_desc small = {.c = 2,
					    .h = 9,
					    .w = 9,
					    .f = 3,
					    .ho = 7,
					    .wo = 7,
					    .kh = 3,
					    .kw = 3,
					    .sh = 1,
					    .sw = 1,
					    .dh = 1,
					    .dw = 1,
					    .groups = 1};

static tr_backend_t *backend(enum tr_cpu_conv route)
{
	struct tr_error err;
	tr_backend_t *be = tr_cpu_backend_create(1, 1);
	cr_assert(be);
	cr_assert_eq(tr_cpu_backend_set_conv(be, route, &err), 0, "%s", err.message);
	return be;
}

static void tmp_path(char *buf, size_t n)
{
	snprintf(buf, n, "/tmp/trainerd-conv-choice-%ld.json", (long)getpid());
	unlink(buf);
}

Test(conv_choice, auto_is_measured_once_then_remembered)
{
	NEED_DNNL();
	tr_cpu_conv_choices_forget();
	tr_backend_t *be = backend(TR_CPU_CONV_AUTO);
	struct tr_conv_choice a, b;
	struct tr_error err;
	cr_assert_eq(tr_cpu_conv_route(be, 0, &small, 8, TR_CPU_CONV_AUTO, &a, &err), 0, "%s", err.message);
	cr_expect(a.measured, "the first ask measures");
	cr_expect(a.im2col_ms > 0 && a.onednn_ms > 0, "both routes timed: %g, %g", a.im2col_ms, a.onednn_ms);
	cr_expect(a.route == TR_CPU_CONV_IM2COL || a.route == TR_CPU_CONV_ONEDNN);
	cr_expect_eq(a.route, a.onednn_ms < a.im2col_ms ? TR_CPU_CONV_ONEDNN : TR_CPU_CONV_IM2COL, "the faster wins");
	/* other rows (another device count): the same decision, not measured */
	cr_assert_eq(tr_cpu_conv_route(be, 0, &small, 3, TR_CPU_CONV_AUTO, &b, &err), 0, "%s", err.message);
	cr_expect(!b.measured, "the second ask remembers");
	cr_expect_eq(b.route, a.route);
	tr_backend_destroy(be);
}

Test(conv_choice, fixed_routes_are_not_measured)
{
	NEED_DNNL();
	tr_cpu_conv_choices_forget();
	tr_backend_t *be = backend(TR_CPU_CONV_AUTO);
	struct tr_conv_choice c;
	struct tr_error err;
	cr_assert_eq(tr_cpu_conv_route(be, 0, &small, 8, TR_CPU_CONV_IM2COL, &c, &err), 0, "%s", err.message);
	cr_expect_eq(c.route, TR_CPU_CONV_IM2COL);
	cr_expect(!c.measured && c.im2col_ms == 0);
	cr_assert_eq(tr_cpu_conv_route(be, 0, &small, 8, TR_CPU_CONV_ONEDNN, &c, &err), 0, "%s", err.message);
	cr_expect_eq(c.route, TR_CPU_CONV_ONEDNN);
	cr_expect(!c.measured);
	tr_backend_destroy(be);
}

/* The file is written on a measurement and read by a later process (here:
 * after forgetting), whose decision is the file's, not a new measurement:
 * an entry rewritten to the other route is taken as written. */
Test(conv_choice, the_machine_file_decides_repeats)
{
	NEED_DNNL();
	char path[128];
	tmp_path(path, sizeof path);
	tr_cpu_conv_choices_forget();
	tr_cpu_conv_cache_open(path);
	tr_backend_t *be = backend(TR_CPU_CONV_AUTO);
	struct tr_conv_choice a, b;
	struct tr_error err;
	cr_assert_eq(tr_cpu_conv_route(be, 0, &small, 8, TR_CPU_CONV_AUTO, &a, &err), 0, "%s", err.message);
	cr_assert(a.measured);

	json_error_t je;
	json_t *doc = json_load_file(path, 0, &je);
	cr_assert(doc, "%s not written: %s", path, je.text);
	json_t *e = json_array_get(json_object_get(doc, "entries"), 0);
	cr_assert(e);
	cr_expect_str_eq(json_string_value(json_object_get(e, "shape")), "c2 h9 w9 f3 k3x3 s1x1 p0x0 d1x1 g1");
	cr_expect(strstr(json_string_value(json_object_get(e, "cpu")), "family"), "keyed by the CPU model");
	const char *other = a.route == TR_CPU_CONV_ONEDNN ? "im2col" : "onednn";
	json_object_set_new(e, "route", json_string(other));
	cr_assert_eq(json_dump_file(doc, path, 0), 0);

	tr_cpu_conv_choices_forget();
	tr_cpu_conv_cache_open(path);
	cr_assert_eq(tr_cpu_conv_route(be, 0, &small, 8, TR_CPU_CONV_AUTO, &b, &err), 0, "%s", err.message);
	cr_expect(!b.measured, "read from the file, not measured");
	cr_expect_str_eq(tr_cpu_conv_route_name(b.route), other);

	/* another CPU's entry is not this machine's decision */
	json_object_set_new(e, "cpu", json_string("another CPU (family 0 model 0 stepping 0)"));
	cr_assert_eq(json_dump_file(doc, path, 0), 0);
	tr_cpu_conv_choices_forget();
	tr_cpu_conv_cache_open(path);
	cr_assert_eq(tr_cpu_conv_route(be, 0, &small, 8, TR_CPU_CONV_AUTO, &b, &err), 0, "%s", err.message);
	cr_expect(b.measured, "another CPU's entry is ignored");
	json_decref(doc);
	tr_cpu_conv_choices_forget();
	unlink(path);
	tr_backend_destroy(be);
}

static float *frand(size_t n, uint64_t seed)
{
	float *p = malloc(n * sizeof *p);
	cr_assert(p);
	for (size_t i = 0; i < n; i++) {
		seed = tr_mix64(seed + i);
		p[i] = (float)((double)(seed >> 11) * 0x1p-52 - 1.0);
	}
	return p;
}

/* dW of `d` on a backend set to `setting` */
static float *dw_of(enum tr_cpu_conv setting, const struct tr_conv2d_desc *d, int rows)
{
	size_t nx = (size_t)rows * d->c * d->h * d->w, ny = (size_t)rows * d->f * d->ho * d->wo;
	size_t nw = (size_t)d->f * d->c * d->kh * d->kw;
	float *x = frand(nx, 1), *w = frand(nw, 2), *dy = frand(ny, 3), *dx = malloc(nx * sizeof(float));
	float *dw = malloc(nw * sizeof(float)), *db = malloc((size_t)d->f * sizeof(float));
	float *work = malloc(tr_conv2d_workspace(d, rows) * sizeof(float));
	cr_assert(dx && dw && db && work);
	tr_backend_t *be = backend(setting);
	cr_assert_eq(be->i->conv2d_backward(be, 0, d, rows, x, w, dy, dx, dw, db, work), 0, "%s",
		     be->i->last_error(be));
	tr_backend_destroy(be);
	free(x), free(w), free(dy), free(dx), free(db), free(work);
	return dw;
}

Test(conv_choice, a_layers_route_wins_over_the_backends)
{
	NEED_DNNL();
	struct tr_conv2d_desc d = {.c = 8,
				   .h = 20,
				   .w = 20,
				   .f = 16,
				   .ho = 18,
				   .wo = 18,
				   .kh = 3,
				   .kw = 3,
				   .sh = 1,
				   .sw = 1,
				   .dh = 1,
				   .dw = 1,
				   .groups = 1};
	size_t nw = (size_t)d.f * d.c * d.kh * d.kw;
	float *im2col = dw_of(TR_CPU_CONV_IM2COL, &d, 16), *onednn = dw_of(TR_CPU_CONV_ONEDNN, &d, 16);
	/* the routes sum in different orders: their bits tell them apart */
	cr_assert_neq(memcmp(im2col, onednn, nw * sizeof(float)), 0, "the two routes gave the same bits");
	d.route = TR_CPU_CONV_ONEDNN;
	float *got = dw_of(TR_CPU_CONV_IM2COL, &d, 16);
	cr_expect_eq(memcmp(got, onednn, nw * sizeof(float)), 0, "a layer asking for oneDNN got another route");
	free(got);
	d.route = TR_CPU_CONV_IM2COL;
	got = dw_of(TR_CPU_CONV_ONEDNN, &d, 16);
	cr_expect_eq(memcmp(got, im2col, nw * sizeof(float)), 0, "a layer asking for im2col got another route");
	free(got);
	free(im2col);
	free(onednn);
}
