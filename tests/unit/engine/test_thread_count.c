/* Results do not depend on the CPU backend's thread count
 * (docs/design.md, "Convolution and pooling on the CPU"): conv2d forward
 * and backward (y, dx, dW, db) on both convolution routes, the dense
 * layers' gemm, and a few training steps of a small conv net give the same
 * bits with a budget of 1, 2 and 3 threads per device, also in exact mode
 * (whose sum the device's threads share).  The shapes are
 * large enough that every GEMM is above the size where the backend would
 * run it on one thread anyway.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/cpu/cpu_dnnl_conv.h"
#include "engine/rng.h"
#include "engine/spec.h"
#include "engine/trainer.h"

TestSuite(thread_count, .timeout = 300);

static const int budgets[] = {1, 2, 3};

static float *frand(size_t n, uint64_t seed)
{
	float *p = malloc((n ? n : 1) * sizeof *p);
	cr_assert(p);
	for (size_t i = 0; i < n; i++) {
		seed = tr_mix64(seed + i);
		p[i] = (float)((double)(seed >> 11) * 0x1p-52 - 1.0);
	}
	return p;
}

struct conv_out {
	float *y, *dx, *dw, *db;
};

static void conv_run(enum tr_cpu_conv route, int devices, int budget, const struct tr_conv2d_desc *d, int rows,
		     struct conv_out *o)
{
	size_t nx = (size_t)rows * d->c * d->h * d->w, ny = (size_t)rows * d->f * d->ho * d->wo;
	size_t nw = (size_t)d->f * (d->c / d->groups) * d->kh * d->kw;
	float *x = frand(nx, 1), *w = frand(nw, 2), *b = frand((size_t)d->f, 3), *dy = frand(ny, 4);
	float *work = malloc(tr_conv2d_workspace(d, rows) * sizeof(float));
	struct tr_error err;
	tr_backend_t *be = tr_cpu_backend_create(devices, budget);

	cr_assert(be && work);
	cr_assert_eq(tr_cpu_backend_set_conv(be, route, &err), 0, "%s", err.message);
	o->y = malloc(ny * sizeof(float));
	o->dx = malloc(nx * sizeof(float));
	o->dw = malloc(nw * sizeof(float));
	o->db = malloc((size_t)d->f * sizeof(float));
	cr_assert(o->y && o->dx && o->dw && o->db);
	int dev = devices - 1;
	cr_assert_eq(be->i->conv2d_forward(be, dev, d, rows, x, w, b, o->y, work), 0, "%s", be->i->last_error(be));
	cr_assert_eq(be->i->conv2d_backward(be, dev, d, rows, x, w, dy, o->dx, o->dw, o->db, work), 0, "%s",
		     be->i->last_error(be));
	tr_backend_destroy(be);
	free(x);
	free(w);
	free(b);
	free(dy);
	free(work);
}

static void conv_free(struct conv_out *o)
{
	free(o->y);
	free(o->dx);
	free(o->dw);
	free(o->db);
}

static void conv_same_bits(enum tr_cpu_conv route, const struct tr_conv2d_desc *d, int rows)
{
	size_t nx = (size_t)rows * d->c * d->h * d->w, ny = (size_t)rows * d->f * d->ho * d->wo;
	size_t nw = (size_t)d->f * (d->c / d->groups) * d->kh * d->kw;
	struct conv_out ref, o;

	conv_run(route, 1, 1, d, rows, &ref);
	for (int k = 1; k < 4; k++) {
		/* budgets 2 and 3 on one device; then 3 per device on the
		 * second of two devices */
		int devices = k < 3 ? 1 : 2, budget = k < 3 ? budgets[k] : 6;
		conv_run(route, devices, budget, d, rows, &o);
		const char *what = devices == 1 ? "one device" : "two devices";
		cr_expect_eq(memcmp(o.y, ref.y, ny * sizeof(float)), 0, "%s, budget %d: y differs from 1 thread's",
			     what, budget);
		cr_expect_eq(memcmp(o.dx, ref.dx, nx * sizeof(float)), 0, "%s, budget %d: dx differs from 1 thread's",
			     what, budget);
		cr_expect_eq(memcmp(o.dw, ref.dw, nw * sizeof(float)), 0, "%s, budget %d: dW differs from 1 thread's",
			     what, budget);
		cr_expect_eq(memcmp(o.db, ref.db, (size_t)d->f * sizeof(float)), 0,
			     "%s, budget %d: db differs from 1 thread's", what, budget);
		conv_free(&o);
	}
	conv_free(&ref);
}

/* 32 -> 64 channels, 3x3, padding 1, on 28x28 images, 24 samples: every
 * GEMM is far above the one-thread size. */
static const struct tr_conv2d_desc mid = {.c = 32,
					  .h = 28,
					  .w = 28,
					  .f = 64,
					  .ho = 28,
					  .wo = 28,
					  .kh = 3,
					  .kw = 3,
					  .sh = 1,
					  .sw = 1,
					  .ph = 1,
					  .pw = 1,
					  .dh = 1,
					  .dw = 1,
					  .groups = 1};
/* Two groups, stride 2, 5x5 on 33x33: odd sizes everywhere. */
static const struct tr_conv2d_desc odd = {.c = 16,
					  .h = 33,
					  .w = 33,
					  .f = 48,
					  .ho = 16,
					  .wo = 16,
					  .kh = 5,
					  .kw = 5,
					  .sh = 2,
					  .sw = 2,
					  .ph = 1,
					  .pw = 1,
					  .dh = 1,
					  .dw = 1,
					  .groups = 2};

Test(thread_count, im2col_conv_is_independent_of_threads)
{
	conv_same_bits(TR_CPU_CONV_IM2COL, &mid, 24);
	conv_same_bits(TR_CPU_CONV_IM2COL, &odd, 13);
}

Test(thread_count, onednn_conv_is_independent_of_threads)
{
	struct tr_error err;
	tr_backend_t *be = tr_cpu_backend_create(1, 1);
	int rc = tr_cpu_backend_set_conv(be, TR_CPU_CONV_ONEDNN, &err);
	tr_backend_destroy(be);
	if (rc == -ENOTSUP)
		cr_skip_test("this build has no oneDNN route");
	conv_same_bits(TR_CPU_CONV_ONEDNN, &mid, 24);
	conv_same_bits(TR_CPU_CONV_ONEDNN, &odd, 13);
	/* batches of exact mode's shard size: slices of even sizes */
	conv_same_bits(TR_CPU_CONV_ONEDNN, &mid, 4);
	conv_same_bits(TR_CPU_CONV_ONEDNN, &odd, 7);
}

/* The dense layers' products: forward x W^T, dW = dY^T x, dx = dY W, of
 * b rows. */
static void dense_same_bits(int B, int IN, int OUT)
{
	float *x = frand((size_t)B * IN, 5), *w = frand((size_t)OUT * IN, 6), *dy = frand((size_t)B * OUT, 7);
	float *ref[3] = {0}, *got[3] = {0};
	size_t n[3] = {(size_t)B * OUT, (size_t)OUT * IN, (size_t)B * IN};

	for (int k = 0; k < 3; k++) {
		tr_backend_t *be = tr_cpu_backend_create(1, budgets[k]);
		float **o = k == 0 ? ref : got;
		cr_assert(be);
		for (int j = 0; j < 3; j++) {
			free(o[j]);
			o[j] = malloc(n[j] * sizeof(float));
			/* beta 1 on a non-zero C as well: the accumulate path */
			for (size_t i = 0; i < n[j]; i++)
				o[j][i] = 0.25f;
		}
		cr_assert_eq(be->i->gemm(be, 0, false, true, B, OUT, IN, 1.0f, x, w, 0.0f, o[0]), 0);
		cr_assert_eq(be->i->gemm(be, 0, true, false, OUT, IN, B, 1.0f, dy, x, 1.0f, o[1]), 0);
		cr_assert_eq(be->i->gemm(be, 0, false, false, B, IN, OUT, 1.0f, dy, w, 0.0f, o[2]), 0);
		tr_backend_destroy(be);
		if (k == 0)
			continue;
		for (int j = 0; j < 3; j++)
			cr_expect_eq(memcmp(o[j], ref[j], n[j] * sizeof(float)), 0,
				     "%dx%dx%d, budget %d: gemm %d differs from 1 thread's", B, IN, OUT, budgets[k], j);
	}
	for (int j = 0; j < 3; j++) {
		free(ref[j]);
		free(got[j]);
	}
	free(x);
	free(w);
	free(dy);
}

Test(thread_count, dense_gemm_is_independent_of_threads)
{
	dense_same_bits(160, 384, 320);
	/* an exact-mode shard of the bench MLP: 32 rows, cut into tiles
	 * (tr_cpu_gemm_tiles) that the threads share */
	dense_same_bits(32, 784, 1024);
	dense_same_bits(32, 1024, 1024);
}

/* A few steps of a small conv net through the whole trainer. */
#define MAX_STEPS 64

struct run_result {
	double loss[MAX_STEPS];
	int64_t nloss;
	float *params;
	size_t nparams;
};

static void collect(void *ctx, const struct tr_metric_point *p)
{
	struct run_result *r = ctx;

	if (strcmp(p->name, "loss") == 0 && p->step >= 1 && p->step - 1 < MAX_STEPS) {
		r->loss[p->step - 1] = p->value;
		if (p->step > r->nloss)
			r->nloss = p->step;
	}
}

/* 34x34 outputs (oneDNN under "auto"), then 17x17 and 8x8 (im2col), a
 * dense layer of 2,048 inputs. */
static const char job[] =
	"{\"name\": \"threads\", \"seed\": 3,"
	" \"model\": {\"inputs\": [3, 34, 34], \"layers\": ["
	"  {\"type\": \"conv2d\", \"filters\": 16, \"kernel\": 3, \"padding\": 1}, {\"type\": \"relu\"},"
	"  {\"type\": \"maxpool2d\", \"kernel\": 2},"
	"  {\"type\": \"conv2d\", \"filters\": 32, \"kernel\": 3, \"padding\": 1}, {\"type\": \"relu\"},"
	"  {\"type\": \"maxpool2d\", \"kernel\": 2},"
	"  {\"type\": \"conv2d\", \"filters\": 32, \"kernel\": 3, \"padding\": 1}, {\"type\": \"relu\"},"
	"  {\"type\": \"flatten\"}, {\"type\": \"dense\", \"units\": 64}, {\"type\": \"relu\"},"
	"  {\"type\": \"dense\", \"units\": 5}],"
	"  \"loss\": \"softmax_cross_entropy\"},"
	" \"data\": {\"train\": {\"format\": \"synthetic\", \"task\": \"classification\", \"samples\": 192,"
	"  \"shape\": [3, 34, 34], \"classes\": 5}, \"last_batch\": \"drop\"},"
	" \"batch_size\": 48, \"epochs\": 2,"
	" \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.05, \"momentum\": 0.9}}";

static void run_job(const char *text, enum tr_cpu_conv route, int budget, struct run_result *out)
{
	struct tr_spec spec;
	struct tr_error e;
	tr_backend_t *be = tr_cpu_backend_create(1, budget);
	tr_trainer_t *t = NULL;
	struct tr_error err;

	memset(out, 0, sizeof *out);
	cr_assert_not_null(be);
	cr_assert_eq(tr_cpu_backend_set_conv(be, route, &err), 0, "%s", err.message);
	cr_assert_eq(tr_spec_parse_text(text, &spec, &e), 0, "spec: %s", e.message);
	struct tr_trainer_options opt = {
		.spec = &spec,
		.backend = be,
		.devices = 1,
		.workers = 1,
		.hooks = {.metric = collect, .ctx = out},
	};
	cr_assert_eq(tr_trainer_create(&opt, &t, &err), 0, "%s", err.message);
	cr_assert_eq(tr_trainer_run(t, &err), 0, "%s", err.message);
	out->nparams = tr_trainer_model(t)->n_params;
	out->params = malloc(out->nparams * sizeof(float));
	cr_assert_eq(tr_trainer_copy_params(t, 0, out->params), 0);
	tr_trainer_destroy(t);
	tr_spec_finish(&spec);
	tr_backend_destroy(be);
}

static void job_same_bits(const char *text, enum tr_cpu_conv route)
{
	struct run_result *ref = malloc(sizeof *ref), *o = malloc(sizeof *o);

	cr_assert(ref && o);
	run_job(text, route, 1, ref);
	cr_assert_eq(ref->nloss, 8);
	for (int k = 1; k < 3; k++) {
		run_job(text, route, budgets[k], o);
		cr_assert_eq(o->nloss, ref->nloss);
		cr_expect_eq(memcmp(o->loss, ref->loss, (size_t)ref->nloss * sizeof(double)), 0,
			     "budget %d: losses differ from 1 thread's (last %.9g vs %.9g)", budgets[k],
			     o->loss[o->nloss - 1], ref->loss[ref->nloss - 1]);
		cr_expect_eq(memcmp(o->params, ref->params, ref->nparams * sizeof(float)), 0,
			     "budget %d: weights differ from 1 thread's", budgets[k]);
		free(o->params);
	}
	free(ref->params);
	free(ref);
	free(o);
}

Test(thread_count, conv_net_steps_default_route)
{
	job_same_bits(job, TR_CPU_CONV_AUTO);
}

Test(thread_count, conv_net_steps_im2col_route)
{
	job_same_bits(job, TR_CPU_CONV_IM2COL);
}

/* An MLP whose dense products are cut into tiles (784 x 512 x 64: two),
 * on the oneDNN route (cpu_dense), as float and as exact mode. */
static const char mlp_job[] =
	"{\"name\": \"threads-mlp\", \"seed\": 4, \"cpu_dense\": \"onednn\","
	" \"model\": {\"inputs\": 784, \"layers\": [{\"type\": \"dense\", \"units\": 512}, {\"type\": \"relu\"},"
	"  {\"type\": \"dense\", \"units\": 10}], \"loss\": \"softmax_cross_entropy\"},"
	" \"data\": {\"train\": {\"format\": \"synthetic\", \"task\": \"classification\", \"samples\": 256,"
	"  \"features\": 784, \"classes\": 10}, \"last_batch\": \"drop\"},"
	" \"batch_size\": 64, \"epochs\": 2,"
	" \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.05, \"momentum\": 0.9}}";

Test(thread_count, mlp_steps_onednn_dense_route)
{
	if (!tr_dnnl_available())
		cr_skip_test("this build has no oneDNN (libdnnl-dev)");
	job_same_bits(mlp_job, TR_CPU_CONV_AUTO);
	char text[sizeof mlp_job + 32];
	snprintf(text, sizeof text, "{\"exact\": true, %s", mlp_job + 1);
	job_same_bits(text, TR_CPU_CONV_AUTO);
}

/* Exact mode: each shard's passes, and the exact sum, which the device's
 * threads share in tasks cut by size (engine/cpu/cpu_comm.c). */
Test(thread_count, conv_net_steps_exact_mode)
{
	char text[sizeof job + 32];
	snprintf(text, sizeof text, "{\"exact\": true, %s", job + 1);
	job_same_bits(text, TR_CPU_CONV_AUTO);
}
