/* Whole-model gradient checks: the backward pass of every layer type and
 * both losses against central finite differences of the forward loss, plus
 * the parameter layout that exported files rely on. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/model.h"
#include "engine/rng.h"
#include "engine/spec.h"

struct fixture {
	struct tr_spec spec;
	tr_model_t model;
	tr_backend_t *be;
	tr_replica_t rep;
	int rows;
};

/* inputs_json: the model's "inputs" as written ("5" or "[2, 4, 4]"),
 * inputs the values per sample. */
static void setup_model_in(struct fixture *f, const char *layers, const char *loss, const char *inputs_json, int inputs,
			   int rows, int label_dim)
{
	char text[4096];
	snprintf(
		text, sizeof text,
		"{\"seed\": 9, \"model\": {\"inputs\": %s, \"layers\": %s, \"loss\": \"%s\"},"
		" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 10, \"features\": %d,"
		" \"classes\": 3}}, \"batch_size\": 4, \"epochs\": 1, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}",
		inputs_json, layers, loss, inputs);
	struct tr_error e;
	cr_assert_eq(tr_spec_parse_text(text, &f->spec, &e), 0, "%s", e.message);
	struct tr_error err;
	cr_assert_eq(tr_model_init(&f->model, &f->spec, inputs, &err), 0, "%s", err.message);
	f->be = tr_cpu_backend_create(1, 1);
	f->rows = rows;
	cr_assert_eq(tr_replica_init(&f->rep, &f->model, f->be, 0, rows, label_dim, 0, &err), 0);
	tr_model_init_params(&f->model, f->rep.params);
	/* Move parameters off their defaults so layernorm's gamma/beta matter. */
	uint64_t key = tr_rng_key(1, 2, 3, TR_RNG_INIT);
	for (size_t i = 0; i < f->model.n_params; i++)
		f->rep.params[i] += 0.3f * (tr_rng_uniform(key, i) - 0.5f);
	for (int i = 0; i < rows * inputs; i++)
		f->rep.input[i] = 2.0f * tr_rng_uniform(key, 1000 + i) - 1.0f;
	for (int i = 0; i < rows * label_dim; i++)
		f->rep.labels[i] = strcmp(loss, "mse") == 0 ? tr_rng_normal(key, 5000 + i)
							    : (float)tr_rng_below(key, 5000 + i, 3);
}

static void setup_model(struct fixture *f, const char *layers, const char *loss, int inputs, int rows, int label_dim)
{
	char in[16];
	snprintf(in, sizeof in, "%d", inputs);
	setup_model_in(f, layers, loss, in, inputs, rows, label_dim);
}

static void teardown_model(struct fixture *f)
{
	tr_replica_finish(&f->rep);
	tr_backend_destroy(f->be);
	tr_spec_finish(&f->spec);
}

/* Loss (mean over rows) for the current parameters; the same step keeps
 * the same dropout mask. */
static double loss_of(struct fixture *f)
{
	double out[2] = {0, 0};
	cr_assert_eq(tr_replica_forward(&f->rep, f->rows, 0, 5, 1), 0);
	cr_assert_eq(tr_replica_loss(&f->rep, f->rows, 1.0f / f->rows, out), 0);
	return out[0] / f->rows;
}

static void gradient_check_in(const char *layers, const char *loss, int label_dim, const char *inputs_json, int inputs)
{
	struct fixture f;
	setup_model_in(&f, layers, loss, inputs_json, inputs, 6, label_dim);
	loss_of(&f);
	/* Backward overwrites every gradient: whatever the buffer held (here
	 * NaN) must not leak into the result. */
	for (size_t i = 0; i < f.model.n_params; i++)
		f.rep.grads[i] = NAN;
	cr_assert_eq(tr_replica_backward(&f.rep, f.rows), 0);
	float *analytic = malloc(f.model.n_params * sizeof(float));
	memcpy(analytic, f.rep.grads, f.model.n_params * sizeof(float));
	const double h = 1e-2;
	int checked = 0;
	for (size_t i = 0; i < f.model.n_params; i++) {
		float orig = f.rep.params[i];
		f.rep.params[i] = orig + (float)h;
		double up = loss_of(&f);
		f.rep.params[i] = orig - (float)h;
		double down = loss_of(&f);
		f.rep.params[i] = orig;
		double numeric = (up - down) / (2 * h);
		double diff = fabs(numeric - analytic[i]);
		cr_assert_leq(diff, 2e-3 + 2e-2 * fabs(numeric), "%s / %s: param %zu: analytic %.6g numeric %.6g",
			      layers, loss, i, analytic[i], numeric);
		checked++;
	}
	cr_assert_gt(checked, 0);
	free(analytic);
	teardown_model(&f);
}

static void gradient_check(const char *layers, const char *loss, int label_dim)
{
	gradient_check_in(layers, loss, label_dim, "5", 5);
}

Test(model, gradcheck_dense_relu_softmax)
{
	gradient_check(
		"[{\"type\": \"dense\", \"units\": 7}, {\"type\": \"relu\"}, {\"type\": \"dense\", \"units\": 3}]",
		"softmax_cross_entropy", 1);
}

Test(model, gradcheck_gelu_both_forms)
{
	gradient_check(
		"[{\"type\": \"dense\", \"units\": 6}, {\"type\": \"gelu\"}, {\"type\": \"dense\", \"units\": 6},"
		" {\"type\": \"gelu\", \"approximate\": \"tanh\"}, {\"type\": \"dense\", \"units\": 3}]",
		"softmax_cross_entropy", 1);
}

Test(model, gradcheck_tanh_sigmoid_mse)
{
	gradient_check(
		"[{\"type\": \"dense\", \"units\": 6}, {\"type\": \"tanh\"}, {\"type\": \"dense\", \"units\": 4},"
		" {\"type\": \"sigmoid\"}, {\"type\": \"dense\", \"units\": 2}]",
		"mse", 2);
}

Test(model, gradcheck_layernorm_dropout)
{
	gradient_check(
		"[{\"type\": \"dense\", \"units\": 8}, {\"type\": \"layernorm\"}, {\"type\": \"dropout\", \"rate\": 0.3},"
		" {\"type\": \"dense\", \"units\": 3, \"bias\": false}]",
		"softmax_cross_entropy", 1);
}

/* The image layers inside whole models: conv2d, both pools, flatten,
 * global_avg_pool and a residual block (whose skip path adds dy to its
 * layers' dx), with odd sizes. */
Test(model, gradcheck_conv_pool_flatten)
{
	gradient_check_in("[{\"type\": \"conv2d\", \"filters\": 3, \"kernel\": [3, 2], \"padding\": [2, 1]},"
			  " {\"type\": \"tanh\"}, {\"type\": \"avgpool2d\", \"kernel\": 2, \"stride\": 1},"
			  " {\"type\": \"conv2d\", \"filters\": 4, \"kernel\": 2, \"stride\": 3, \"groups\": 1},"
			  " {\"type\": \"flatten\"}, {\"type\": \"dense\", \"units\": 3}]",
			  "softmax_cross_entropy", 1, "[2, 5, 4]", 40);
}

Test(model, gradcheck_residual_global_avg_pool)
{
	gradient_check_in(
		"[{\"type\": \"conv2d\", \"filters\": 4, \"kernel\": 3, \"padding\": \"same\"},"
		" {\"type\": \"residual\", \"layers\": [{\"type\": \"conv2d\", \"filters\": 4, \"kernel\": 3,"
		" \"padding\": \"same\", \"groups\": 2}, {\"type\": \"tanh\"},"
		" {\"type\": \"residual\", \"layers\": [{\"type\": \"conv2d\", \"filters\": 4, \"kernel\": 1}]}]},"
		" {\"type\": \"avgpool2d\", \"kernel\": 3, \"stride\": 2, \"padding\": 1},"
		" {\"type\": \"global_avg_pool\"}, {\"type\": \"dense\", \"units\": 2}]",
		"mse", 2, "[1, 5, 5]", 25);
}

Test(model, gradcheck_one_pixel_images)
{
	gradient_check_in("[{\"type\": \"conv2d\", \"filters\": 3, \"kernel\": 1}, {\"type\": \"sigmoid\"},"
			  " {\"type\": \"maxpool2d\", \"kernel\": 1}, {\"type\": \"global_avg_pool\"},"
			  " {\"type\": \"dense\", \"units\": 3}]",
			  "softmax_cross_entropy", 1, "[5, 1, 1]", 5);
}

/* safetensors names and shapes: PyTorch's, a block's inner layers
 * "<block>.<inner>". */
Test(model, image_layout_follows_pytorch_names)
{
	struct fixture f;
	setup_model_in(&f,
		       "[{\"type\": \"conv2d\", \"filters\": 6, \"kernel\": [3, 1], \"groups\": 2},"
		       " {\"type\": \"residual\", \"layers\": [{\"type\": \"relu\"},"
		       " {\"type\": \"conv2d\", \"filters\": 6, \"kernel\": 1, \"bias\": false}]},"
		       " {\"type\": \"global_avg_pool\"}, {\"type\": \"dense\", \"units\": 3}]",
		       "softmax_cross_entropy", "[4, 5, 5]", 100, 2, 1);
	const char *names[] = {"0.weight", "0.bias", "1.1.weight", "3.weight", "3.bias"};
	int64_t shapes[][4] = {{6, 2, 3, 1}, {6}, {6, 6, 1, 1}, {3, 6}, {3}};
	int ndims[] = {4, 1, 4, 2, 1};
	cr_assert_eq(tr_model_param_count(&f.model), 5);
	size_t off = 0;
	for (int i = 0; i < 5; i++) {
		struct tr_param_view v;
		tr_model_param_view(&f.model, i, &v);
		cr_expect_str_eq(v.name, names[i]);
		cr_expect_eq(v.ndim, ndims[i], "%s", v.name);
		for (int d = 0; d < ndims[i]; d++)
			cr_expect_eq(v.shape[d], shapes[i][d], "%s dim %d", v.name, d);
		cr_expect_eq(v.offset, off, "%s", v.name);
		off += v.len;
	}
	cr_expect_eq(off, f.model.n_params);
	teardown_model(&f);
}

Test(model, layout_follows_pytorch_names)
{
	struct fixture f;
	setup_model(&f,
		    "[{\"type\": \"dense\", \"units\": 4}, {\"type\": \"relu\"}, {\"type\": \"layernorm\"},"
		    " {\"type\": \"dense\", \"units\": 3, \"bias\": false}]",
		    "softmax_cross_entropy", 5, 2, 1);
	cr_assert_eq(tr_model_param_count(&f.model), 5);
	struct tr_param_view v;
	tr_model_param_view(&f.model, 0, &v);
	cr_assert_str_eq(v.name, "0.weight");
	cr_assert_eq(v.ndim, 2);
	cr_assert_eq(v.shape[0], 4);
	cr_assert_eq(v.shape[1], 5);
	tr_model_param_view(&f.model, 1, &v);
	cr_assert_str_eq(v.name, "0.bias");
	cr_assert_eq(v.offset, 20);
	tr_model_param_view(&f.model, 2, &v);
	cr_assert_str_eq(v.name, "2.weight");
	cr_assert_eq(v.shape[0], 4);
	tr_model_param_view(&f.model, 3, &v);
	cr_assert_str_eq(v.name, "2.bias");
	/* 3.weight is the last tensor: the bias-free dense layer has no 3.bias. */
	tr_model_param_view(&f.model, 4, &v);
	cr_assert_str_eq(v.name, "3.weight");
	cr_assert_eq(v.shape[0], 3);
	cr_assert_eq(v.shape[1], 4);
	cr_assert_eq(f.model.n_params, 20 + 4 + 8 + 12);
	teardown_model(&f);
}

Test(model, init_matches_pytorch_bounds)
{
	struct fixture f;
	setup_model(&f, "[{\"type\": \"dense\", \"units\": 300}, {\"type\": \"layernorm\"}]", "mse", 16, 1, 300);
	float *p = calloc(f.model.n_params, sizeof(float));
	tr_model_init_params(&f.model, p);
	float bound = 0.25f; /* 1/sqrt(16) */
	double mean = 0;
	for (int i = 0; i < 300 * 16; i++) {
		cr_assert_leq(fabsf(p[i]), bound);
		mean += p[i];
	}
	cr_assert_lt(fabs(mean / 4800), 0.02);
	for (int i = 0; i < 300; i++) {
		cr_assert_eq(p[4800 + 300 + i], 1.0f); /* layernorm weight */
		cr_assert_eq(p[4800 + 600 + i], 0.0f);
	}
	free(p);
	teardown_model(&f);
}

/* A data file's width is known only when the job starts: the model gets the
 * spec's bounds then (widths 2^24, parameters 2^36), not an overflowing
 * layout. */
Test(model, widths_and_parameters_from_data_are_bounded)
{
	const char *text =
		"{\"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 16777216}, {\"type\": \"dense\", \"units\": 2}]},"
		" \"data\": {\"train\": {\"format\": \"csv\", \"path\": \"x.csv\"}}, \"batch_size\": 4, \"epochs\": 1,"
		" \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}";
	struct tr_spec spec;
	struct tr_error e;
	cr_assert_eq(tr_spec_parse_text(text, &spec, &e), 0, "%s", e.message);
	tr_model_t m;
	struct tr_error err;
	cr_assert_eq(tr_model_init(&m, &spec, TR_SPEC_MAX_WIDTH + 1, &err), -EINVAL);
	cr_assert_not_null(strstr(err.message, "/model/inputs"), "%s", err.message);
	cr_assert_eq(tr_model_init(&m, &spec, 4096, &err), -EINVAL);
	cr_assert_not_null(strstr(err.message, "/model/layers"), "%s", err.message);
	cr_assert_eq(tr_model_init(&m, &spec, 4, &err), 0, "%s", err.message);
	tr_spec_finish(&spec);
}

Test(model, parameter_init_observes_cancel)
{
	struct fixture f;
	setup_model(&f, "[{\"type\": \"dense\", \"units\": 300}, {\"type\": \"layernorm\"}]", "mse", 16, 1, 300);
	float *a = calloc(f.model.n_params, sizeof(float)), *b = calloc(f.model.n_params, sizeof(float));
	atomic_bool cancel = false;
	cr_assert_eq(tr_model_init_params_cancellable(&f.model, a, &cancel), 0);
	tr_model_init_params(&f.model, b);
	cr_assert_eq(memcmp(a, b, f.model.n_params * sizeof(float)), 0);
	atomic_store(&cancel, true);
	cr_assert_eq(tr_model_init_params_cancellable(&f.model, a, &cancel), -ECANCELED);
	free(a);
	free(b);
	teardown_model(&f);
}

/* ---- bit-for-bit guard ----
 *
 * Weights after a few training steps of every layer type that existed
 * before the layer registry, hashed.  The constants were computed by the
 * model code before the registry (engine/model/model.c with its type
 * switches); the registry must reproduce them exactly.  The sums depend on
 * OpenBLAS's kernel for the CPU (and on its thread count: the backend here
 * has one), so the test names the kernel it was recorded with and is
 * skipped under another. */
extern char *openblas_get_corename(void) __attribute__((weak));

#define TR_GOLDEN_CORE "Haswell"
#define TR_GOLDEN_A 0xd855248619f11ee1ULL
#define TR_GOLDEN_B 0x84f87d51aa35602eULL

static uint64_t fnv1a(const void *p, size_t n, uint64_t h)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ULL;
	return h;
}

static uint64_t train_hash(const char *layers, const char *loss, int inputs, int label_dim, bool adam)
{
	struct fixture f;
	setup_model(&f, layers, loss, inputs, 16, label_dim);
	float *s1 = calloc(f.model.n_params, sizeof(float)), *s2 = calloc(f.model.n_params, sizeof(float));
	struct tr_optim_hp hp = {.lr = adam ? 0.01f : 0.05f,
				 .momentum = 0.9f,
				 .beta1 = 0.9f,
				 .beta2 = 0.999f,
				 .eps = 1e-8f,
				 .weight_decay = adam ? 0.01f : 0.0f,
				 .decoupled = adam};
	for (int step = 1; step <= 12; step++) {
		double out[2] = {0, 0};
		hp.step = step;
		cr_assert_eq(tr_replica_forward(&f.rep, f.rows, 0, step, 1), 0);
		cr_assert_eq(tr_replica_loss(&f.rep, f.rows, 1.0f / f.rows, out), 0);
		cr_assert_eq(tr_replica_backward(&f.rep, f.rows), 0);
		if (adam)
			cr_assert_eq(f.be->i->adam_step(f.be, 0, f.model.n_params, f.rep.params, f.rep.grads, s1, s2,
							&hp),
				     0);
		else
			cr_assert_eq(f.be->i->sgd_step(f.be, 0, f.model.n_params, f.rep.params, f.rep.grads, s1, &hp),
				     0);
	}
	uint64_t h = fnv1a(f.rep.params, f.model.n_params * sizeof(float), 0xcbf29ce484222325ULL);
	/* the last forward's output too: eval-mode layers */
	cr_assert_eq(tr_replica_forward(&f.rep, f.rows, 0, 13, 0), 0);
	h = fnv1a(f.rep.acts[f.model.n_layers], (size_t)f.rows * f.model.outputs * sizeof(float), h);
	free(s1);
	free(s2);
	teardown_model(&f);
	return h;
}

Test(model, old_layers_train_bit_for_bit)
{
	const char *core = openblas_get_corename ? openblas_get_corename() : "unknown";
	uint64_t a = train_hash(
		"[{\"type\": \"dense\", \"units\": 32}, {\"type\": \"layernorm\"}, {\"type\": \"gelu\"},"
		" {\"type\": \"dropout\", \"rate\": 0.2}, {\"type\": \"dense\", \"units\": 24, \"bias\": false},"
		" {\"type\": \"gelu\", \"approximate\": \"tanh\"}, {\"type\": \"dense\", \"units\": 16},"
		" {\"type\": \"sigmoid\"}, {\"type\": \"dense\", \"units\": 3}]",
		"softmax_cross_entropy", 20, 1, true);
	uint64_t b = train_hash(
		"[{\"type\": \"dense\", \"units\": 16}, {\"type\": \"tanh\"}, {\"type\": \"dense\", \"units\": 16},"
		" {\"type\": \"relu\"}, {\"type\": \"dense\", \"units\": 3}]",
		"mse", 12, 3, false);
	cr_log_info("openblas core %s: hashes %016llx %016llx", core, (unsigned long long)a, (unsigned long long)b);
	if (strcmp(core, TR_GOLDEN_CORE) != 0)
		cr_skip_test("recorded with OpenBLAS's %s kernels, this is %s", TR_GOLDEN_CORE, core);
	cr_expect_eq(a, TR_GOLDEN_A, "%016llx", (unsigned long long)a);
	cr_expect_eq(b, TR_GOLDEN_B, "%016llx", (unsigned long long)b);
}

/* A backend without a layer's kernels (a CUDA build before they exist)
 * refuses the model with the layer named, instead of calling NULL. */
Test(model, backend_without_kernels_refuses_the_layer)
{
	struct fixture f;
	setup_model_in(&f,
		       "[{\"type\": \"conv2d\", \"filters\": 2, \"kernel\": 1}, {\"type\": \"flatten\"},"
		       " {\"type\": \"dense\", \"units\": 3}]",
		       "softmax_cross_entropy", "[1, 2, 2]", 4, 2, 1);
	struct {
		struct tr_backend base;
		tr_backend_i table;
	} lacking;
	lacking.table = *f.be->i;
	lacking.table.conv2d_backward = NULL;
	lacking.base.i = &lacking.table;
	tr_replica_t r;
	struct tr_error err;
	cr_assert_eq(tr_replica_init(&r, &f.model, &lacking.base, 0, 2, 1, 0, &err), -ENOTSUP);
	cr_expect_not_null(strstr(err.message, "conv2d"), "%s", err.message);
	cr_log_info("%s", err.message);
	teardown_model(&f);
}

/* ---- layer_done: the backward pass reports each finished layer ---- */

struct done_log {
	struct fixture *f;
	int layers[TR_MODEL_MAX_NODES], n;
};

/* Layer i is reported once its own gradients are written (NaN before the
 * pass) and before any layer below it has written its own. */
static int record_done(void *ctx, int layer)
{
	struct done_log *d = ctx;
	const tr_model_t *m = &d->f->model;
	d->layers[d->n++] = layer;
	for (int i = 0; i < m->n_layers; i++) {
		const struct tr_layer *l = &m->layers[i];
		size_t end = l->b_len ? l->b_off + l->b_len : l->w_off + l->w_len;
		for (size_t k = l->w_len ? l->w_off : end; k < end; k++)
			cr_assert_eq(isnan(d->f->rep.grads[k]), i < layer,
				     "reporting layer %d: layer %d's gradient %zu is %g", layer, i, k,
				     d->f->rep.grads[k]);
	}
	return 0;
}

Test(model, layer_done_reports_each_top_level_layer_after_its_gradients)
{
	struct fixture f;
	setup_model(&f,
		    "[{\"type\": \"dense\", \"units\": 4}, {\"type\": \"relu\"}, {\"type\": \"residual\", \"layers\":"
		    " [{\"type\": \"dense\", \"units\": 4}, {\"type\": \"tanh\"}]}, {\"type\": \"layernorm\"},"
		    " {\"type\": \"dense\", \"units\": 3}]",
		    "softmax_cross_entropy", 5, 4, 1);
	loss_of(&f);
	cr_assert_eq(tr_replica_backward(&f.rep, f.rows), 0);
	float *plain = malloc(f.model.n_params * sizeof(float));
	cr_assert(plain);
	memcpy(plain, f.rep.grads, f.model.n_params * sizeof(float));

	struct done_log d = {.f = &f};
	for (size_t i = 0; i < f.model.n_params; i++)
		f.rep.grads[i] = NAN;
	f.rep.layer_done = record_done;
	f.rep.layer_done_ctx = &d;
	loss_of(&f);
	cr_assert_eq(tr_replica_backward(&f.rep, f.rows), 0);
	/* the top level's five layers, last to first: not the residual's
	 * inner nodes */
	cr_assert_eq(d.n, f.model.n_layers);
	cr_assert_eq(d.n, 5);
	for (int k = 0; k < d.n; k++)
		cr_assert_eq(d.layers[k], d.n - 1 - k);
	cr_assert_eq(memcmp(plain, f.rep.grads, f.model.n_params * sizeof(float)), 0);
	free(plain);
	teardown_model(&f);
}
