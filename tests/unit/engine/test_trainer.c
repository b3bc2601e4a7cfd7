/* The trainer's promises: results independent of the device count and the
 * loader thread count, idle devices contribute exact zeros, loader errors
 * name file and sample, and cancel/stop end every thread promptly. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine/backend.h"
#include "engine/spec.h"
#include "engine/safetensors.h"
#include "engine/trainer.h"

#define MAX_STEPS 4096

struct run_result {
	double loss[MAX_STEPS];
	int64_t nloss;
	float *params;
	size_t nparams;
	struct tr_summary summary;
	int rc;
	struct tr_error err;
};

static void collect(void *ctx, const struct tr_metric_point *p)
{
	struct run_result *r = ctx;
	if (strcmp(p->name, "loss") == 0 && p->step - 1 < MAX_STEPS) {
		r->loss[p->step - 1] = p->value;
		if (p->step > r->nloss)
			r->nloss = p->step;
	}
}

static void parse(const char *text, struct tr_spec *spec)
{
	struct tr_error e;
	int rc = tr_spec_parse_text(text, spec, &e);
	cr_assert_eq(rc, 0, "spec: %s", e.message);
}

static void record_run(tr_backend_t *be, bool on);

/* Runs `text` on `devices` devices of be with `workers` loaders. */
static void run_job_on(tr_backend_t *be, const char *text, int devices, int workers, bool poison, tr_reader_t *reader,
		       struct run_result *out)
{
	memset(out, 0, sizeof *out);
	struct tr_spec spec;
	parse(text, &spec);
	struct tr_trainer_options opt = {
		.spec = &spec,
		.backend = be,
		.devices = devices,
		.workers = workers,
		.train_reader = reader,
		.hooks = {.metric = collect, .ctx = out},
		.debug_poison_grads = poison,
	};
	tr_trainer_t *t = NULL;
	out->rc = tr_trainer_create(&opt, &t, &out->err);
	if (out->rc == 0) {
		record_run(be, true);
		out->rc = tr_trainer_run(t, &out->err);
		record_run(be, false);
		tr_trainer_summary(t, &out->summary);
		out->nparams = tr_trainer_model(t)->n_params;
		out->params = malloc(out->nparams * sizeof(float));
		cr_assert_eq(tr_trainer_copy_params(t, 0, out->params), 0);
		/* Every replica must hold the same weights after identical updates
		 * (a failed step may have updated some replicas only). */
		float *other = malloc(out->nparams * sizeof(float));
		for (int r = 1; out->rc == 0 && r < tr_trainer_device_count(t); r++) {
			cr_assert_eq(tr_trainer_copy_params(t, r, other), 0);
			cr_assert_eq(memcmp(other, out->params, out->nparams * sizeof(float)), 0,
				     "replica %d differs from replica 0", r);
		}
		free(other);
	}
	tr_trainer_destroy(t);
	tr_spec_finish(&spec);
}

/* Runs `text` on `devices` CPU devices with `workers` loaders. */
static void run_job(const char *text, int devices, int workers, bool poison, tr_reader_t *reader,
		    struct run_result *out)
{
	tr_backend_t *be = tr_cpu_backend_create(devices, 1);
	cr_assert_not_null(be);
	run_job_on(be, text, devices, workers, poison, reader, out);
	tr_backend_destroy(be);
}

static void free_result(struct run_result *r)
{
	free(r->params);
	r->params = NULL;
}

static double rel(double a, double b)
{
	return fabs(a - b) / fmax(1e-3, fmax(fabs(a), fabs(b)));
}

static void assert_close(const struct run_result *a, const struct run_result *b, double tol, const char *what)
{
	cr_assert_eq(a->rc, 0, "%s: %s", what, a->err.message);
	cr_assert_eq(b->rc, 0, "%s: %s", what, b->err.message);
	cr_assert_eq(a->nloss, b->nloss, "%s: %lld vs %lld steps", what, (long long)a->nloss, (long long)b->nloss);
	cr_assert_gt(a->nloss, 0);
	for (int64_t s = 0; s < a->nloss; s++)
		cr_assert_leq(rel(a->loss[s], b->loss[s]), tol, "%s: step %lld loss %.9g vs %.9g", what,
			      (long long)s + 1, a->loss[s], b->loss[s]);
	cr_assert_eq(a->nparams, b->nparams);
	for (size_t i = 0; i < a->nparams; i++)
		cr_assert_leq(fabs(a->params[i] - b->params[i]), tol * fmax(1.0, fabs(a->params[i])),
			      "%s: weight %zu: %.9g vs %.9g", what, i, a->params[i], b->params[i]);
}

/* 203 samples, batch 16: the last step of each epoch holds 11 samples, so
 * with 4 devices the shares are 3,3,3,2 and with 3 devices 4,4,3. */
static const char *ADAMW_JOB =
	"{\"seed\": 7, \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 24}, {\"type\": \"gelu\"},"
	" {\"type\": \"dropout\", \"rate\": 0.2}, {\"type\": \"layernorm\"}, {\"type\": \"dense\", \"units\": 4}]},"
	" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 203, \"features\": 6, \"classes\": 4,"
	" \"noise\": 0.3}, \"shuffle\": true, \"transforms\": [{\"type\": \"gaussian_noise\", \"std\": 0.05}]},"
	" \"batch_size\": 16, \"epochs\": 3, \"optimizer\": {\"type\": \"adamw\", \"lr\": 0.01},"
	" \"schedule\": {\"type\": \"cosine\", \"warmup_steps\": 5}, \"clip_grad_norm\": 1.0,"
	" \"prefetch\": {\"workers\": 2, \"depth\": 3}}";

static const char *SGD_JOB =
	"{\"seed\": 3, \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 16}, {\"type\": \"tanh\"},"
	" {\"type\": \"dropout\", \"rate\": 0.1}, {\"type\": \"dense\", \"units\": 2}], \"loss\": \"mse\"},"
	" \"data\": {\"train\": {\"format\": \"synthetic\", \"task\": \"regression\", \"samples\": 150,"
	" \"features\": 5, \"outputs\": 2, \"noise\": 0.1}, \"shuffle\": true}, \"batch_size\": 20,"
	" \"epochs\": 4, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.05, \"momentum\": 0.9,"
	" \"weight_decay\": 0.001}}";

static void device_invariance(const char *job)
{
	struct run_result one, many;
	run_job(job, 1, 2, false, NULL, &one);
	cr_assert_eq(one.rc, 0, "%s", one.err.message);
	for (int d = 2; d <= 4; d++) {
		char what[32];
		snprintf(what, sizeof what, "%d devices", d);
		run_job(job, d, 2, false, NULL, &many);
		assert_close(&one, &many, 1e-4, what);
		free_result(&many);
	}
	free_result(&one);
}

Test(trainer, device_count_invariance_adamw_dropout_layernorm)
{
	device_invariance(ADAMW_JOB);
}

Test(trainer, device_count_invariance_sgd_momentum_mse)
{
	device_invariance(SGD_JOB);
}

/* Image models: conv2d, pools, a residual block with dropout inside it
 * (keyed by its node, so the mask does not depend on the split), and a
 * fully convolutional regression net whose mse compares image-shaped
 * outputs with their targets element by element.  117 samples, batch 16:
 * each epoch ends with 5 samples. */
static const char *CONV_JOB =
	"{\"seed\": 11, \"model\": {\"inputs\": [2, 7, 6], \"layers\": [{\"type\": \"conv2d\", \"filters\": 4,"
	" \"kernel\": 3, \"padding\": \"same\"}, {\"type\": \"relu\"}, {\"type\": \"maxpool2d\", \"kernel\": 2,"
	" \"stride\": 1}, {\"type\": \"residual\", \"layers\": [{\"type\": \"conv2d\", \"filters\": 4, \"kernel\": 3,"
	" \"padding\": 1, \"groups\": 2}, {\"type\": \"tanh\"}, {\"type\": \"dropout\", \"rate\": 0.2}]},"
	" {\"type\": \"avgpool2d\", \"kernel\": 2}, {\"type\": \"flatten\"}, {\"type\": \"dense\", \"units\": 3}]},"
	" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 117, \"shape\": [2, 7, 6], \"classes\": 3,"
	" \"noise\": 0.5}, \"shuffle\": true}, \"batch_size\": 16, \"epochs\": 3,"
	" \"optimizer\": {\"type\": \"adamw\", \"lr\": 0.01}, \"checkpoint\": {\"every_steps\": 5}}";

static const char *IMAGE_REGRESSION_JOB =
	"{\"seed\": 4, \"model\": {\"layers\": [{\"type\": \"residual\", \"layers\": [{\"type\": \"conv2d\","
	" \"filters\": 3, \"kernel\": 3, \"padding\": \"same\"}, {\"type\": \"relu\"}, {\"type\": \"conv2d\","
	" \"filters\": 1, \"kernel\": 3, \"padding\": \"same\"}]}], \"loss\": \"mse\"},"
	" \"data\": {\"train\": {\"format\": \"synthetic\", \"task\": \"regression\", \"samples\": 90,"
	" \"shape\": [1, 5, 5], \"outputs\": 25, \"noise\": 0.1}}, \"batch_size\": 16, \"epochs\": 3,"
	" \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.02, \"momentum\": 0.9}}";

Test(trainer, device_count_invariance_conv_residual_dropout)
{
	device_invariance(CONV_JOB);
}

Test(trainer, device_count_invariance_image_regression)
{
	device_invariance(IMAGE_REGRESSION_JOB);
}

/* The MXNet report: 4 devices, the last step holds 2 samples, two devices
 * idle.  Gradient buffers are filled with garbage after every update, so a
 * device that did not clear its buffer would poison the allreduce. */
Test(trainer, idle_devices_contribute_zero)
{
	const char *job =
		"{\"seed\": 11, \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 8}, {\"type\": \"relu\"},"
		" {\"type\": \"layernorm\"}, {\"type\": \"dense\", \"units\": 3}]},"
		" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 18, \"features\": 4, \"classes\": 3}},"
		" \"batch_size\": 8, \"epochs\": 5, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}";
	struct run_result one, four;
	run_job(job, 1, 1, true, NULL, &one);
	run_job(job, 4, 3, true, NULL, &four);
	assert_close(&one, &four, 1e-5, "4 devices with 2 idle on the last step");
	cr_assert_eq(one.summary.samples, 18 * 5);
	free_result(&one);
	free_result(&four);
}

Test(trainer, worker_count_bit_identical)
{
	const char *job =
		"{\"seed\": 5, \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 12}, {\"type\": \"relu\"},"
		" {\"type\": \"dropout\", \"rate\": 0.3}, {\"type\": \"dense\", \"units\": 3}]},"
		" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 97, \"features\": 5, \"classes\": 3,"
		" \"load_cost_us\": 30}, \"transforms\": [{\"type\": \"gaussian_noise\", \"std\": 0.1}],"
		" \"last_batch\": \"rollover\"}, \"batch_size\": 10, \"epochs\": 3,"
		" \"optimizer\": {\"type\": \"adam\", \"lr\": 0.01}, \"prefetch\": {\"depth\": 3}}";
	struct run_result base, other;
	run_job(job, 2, 1, false, NULL, &base);
	cr_assert_eq(base.rc, 0, "%s", base.err.message);
	int counts[] = {2, 7};
	for (int i = 0; i < 2; i++) {
		run_job(job, 2, counts[i], false, NULL, &other);
		cr_assert_eq(other.rc, 0, "%s", other.err.message);
		cr_assert_eq(other.nloss, base.nloss);
		cr_assert_eq(memcmp(other.loss, base.loss, sizeof(double) * (size_t)base.nloss), 0,
			     "losses differ with %d workers", counts[i]);
		cr_assert_eq(memcmp(other.params, base.params, base.nparams * sizeof(float)), 0,
			     "weights differ with %d workers", counts[i]);
		free_result(&other);
	}
	free_result(&base);
}

Test(trainer, last_batch_policies_count_samples)
{
	const char *fmt =
		"{\"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 3}]},"
		" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 25, \"features\": 2, \"classes\": 3},"
		" \"last_batch\": \"%s\"}, \"batch_size\": 10, \"epochs\": 3, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}";
	struct {
		const char *policy;
		int64_t steps, samples;
	} cases[] = {
		{"partial", 9, 75},
		{"drop", 6, 60},
		{"pad", 9, 90},
		{"rollover", 8, 75},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char job[1024];
		snprintf(job, sizeof job, fmt, cases[i].policy);
		struct run_result r;
		run_job(job, 3, 2, false, NULL, &r);
		cr_assert_eq(r.rc, 0, "%s: %s", cases[i].policy, r.err.message);
		cr_assert_eq(r.summary.steps, cases[i].steps, "%s: %lld steps", cases[i].policy,
			     (long long)r.summary.steps);
		cr_assert_eq(r.summary.samples, cases[i].samples, "%s: %lld samples", cases[i].policy,
			     (long long)r.summary.samples);
		free_result(&r);
	}
}

/* ---- a reader that fails at one sample --------------------------------- */

struct failing_reader {
	struct tr_reader base;
	int64_t bad;
};

static int failing_get(tr_reader_t *r, int64_t index, float *x, float *y, struct tr_error *err)
{
	struct failing_reader *f = (struct failing_reader *)r;
	if (index == f->bad) {
		tr_error_set(err, 0, 0, NULL, "%s: sample %lld: unreadable", r->name, (long long)index);
		return -EIO;
	}
	for (int j = 0; j < r->info.features; j++)
		x[j] = (float)((index * 7 + j) % 5) - 2.0f;
	y[0] = (float)(index % 2);
	return 0;
}

static void failing_destroy(tr_reader_t *r)
{
	(void)r;
}

static const struct tr_reader_i failing_i = {.get = failing_get, .destroy = failing_destroy};

Test(trainer, loader_error_names_file_and_sample)
{
	struct failing_reader fr = {.base = {.i = &failing_i, .info = {.samples = 64, .features = 3, .label_dim = 1}},
				    .bad = 41};
	snprintf(fr.base.name, sizeof fr.base.name, "broken.bin");
	const char *job =
		"{\"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 2}]},"
		" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 1, \"features\": 1, \"classes\": 2}},"
		" \"batch_size\": 8, \"epochs\": 2, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1},"
		" \"prefetch\": {\"workers\": 4, \"depth\": 4}}";
	struct run_result r;
	run_job(job, 2, 4, false, &fr.base, &r);
	cr_assert_lt(r.rc, 0);
	cr_assert_not_null(strstr(r.err.message, "broken.bin"), "error: %s", r.err.message);
	cr_assert_not_null(strstr(r.err.message, "sample 41"), "error: %s", r.err.message);
	free_result(&r);
}

Test(trainer, bad_csv_line_fails_create_with_file_and_line)
{
	char dir[] = "/tmp/trainer-csv-XXXXXX";
	cr_assert_not_null(mkdtemp(dir));
	char path[256];
	snprintf(path, sizeof path, "%s/data.csv", dir);
	FILE *f = fopen(path, "w");
	for (int i = 1; i <= 30; i++)
		fprintf(f, i == 23 ? "1.0,oops,1\n" : "%d.5,0.25,%d\n", i, i % 2);
	fclose(f);
	char job[1024];
	snprintf(job, sizeof job,
		 "{\"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 2}]},"
		 " \"data\": {\"train\": {\"format\": \"csv\", \"path\": \"%s\"}},"
		 " \"batch_size\": 8, \"epochs\": 1, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}",
		 path);
	struct run_result r;
	run_job(job, 2, 2, false, NULL, &r);
	cr_assert_lt(r.rc, 0);
	cr_assert_not_null(strstr(r.err.message, "data.csv"), "error: %s", r.err.message);
	cr_assert_not_null(strstr(r.err.message, "23"), "error: %s", r.err.message);
	unlink(path);
	rmdir(dir);
}

/* ---- cancel and stop ---------------------------------------------------- */

struct bg_run {
	tr_trainer_t *t;
	int rc;
	struct tr_error err;
};

static void *bg_main(void *arg)
{
	struct bg_run *b = arg;
	b->rc = tr_trainer_run(b->t, &b->err);
	return NULL;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void cancel_case(const char *job, int devices, bool graceful)
{
	struct tr_spec spec;
	parse(job, &spec);
	tr_backend_t *be = tr_cpu_backend_create(devices, 1);
	struct tr_trainer_options opt = {.spec = &spec, .backend = be, .devices = devices};
	struct tr_error err;
	struct bg_run b = {0};
	cr_assert_eq(tr_trainer_create(&opt, &b.t, &err), 0, "%s", err.message);
	pthread_t th;
	pthread_create(&th, NULL, bg_main, &b);
	usleep(300 * 1000);
	double t0 = now_s();
	if (graceful)
		tr_trainer_stop(b.t);
	else
		tr_trainer_cancel(b.t);
	pthread_join(th, NULL);
	tr_trainer_destroy(b.t);
	double took = now_s() - t0;
	cr_assert_lt(took, 1.0, "run and destroy took %.3f s after the request", took);
	if (graceful)
		cr_assert_eq(b.rc, 0, "%s", b.err.message);
	else
		cr_assert_eq(b.rc, -ECANCELED, "rc %d: %s", b.rc, b.err.message);
	tr_backend_destroy(be);
	tr_spec_finish(&spec);
}

/* Loading is slow (20 ms a sample): the cancel lands while loaders sleep
 * and the trainer waits for data. */
static const char *SLOW_LOAD_JOB =
	"{\"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 2}]},"
	" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 1000, \"features\": 4, \"classes\": 2,"
	" \"load_cost_us\": 20000}}, \"batch_size\": 64, \"epochs\": 2, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1},"
	" \"prefetch\": {\"workers\": 3, \"depth\": 2}}";

/* Loading is free and the model is large: the cancel lands in compute. */
static const char *HEAVY_COMPUTE_JOB =
	"{\"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 512}, {\"type\": \"relu\"},"
	" {\"type\": \"dense\", \"units\": 512}, {\"type\": \"relu\"}, {\"type\": \"dense\", \"units\": 10}]},"
	" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 100000, \"features\": 64, \"classes\": 10}},"
	" \"batch_size\": 256, \"epochs\": 5, \"optimizer\": {\"type\": \"adam\", \"lr\": 0.001},"
	" \"prefetch\": {\"workers\": 2, \"depth\": 4}}";

Test(trainer, cancel_during_loading_joins_threads)
{
	cancel_case(SLOW_LOAD_JOB, 2, false);
}

Test(trainer, cancel_during_compute_joins_threads)
{
	cancel_case(HEAVY_COMPUTE_JOB, 3, false);
}

Test(trainer, stop_is_graceful)
{
	cancel_case(HEAVY_COMPUTE_JOB, 2, true);
}

/* A cancel that lands in the evaluation after an epoch's last step: that
 * step's update and metrics are done, so the progress reported last (the
 * job's final step for the daemon and its dashboard) is that step, not the
 * one before it. */
struct eval_cancel {
	tr_trainer_t *t;
	int64_t cancel_at, last_loss_step, last_progress_step;
};

static void eval_cancel_metric(void *ctx, const struct tr_metric_point *p)
{
	struct eval_cancel *c = ctx;
	if (strcmp(p->name, "loss") != 0)
		return;
	c->last_loss_step = p->step;
	if (p->step == c->cancel_at)
		tr_trainer_cancel(c->t);
}

static void eval_cancel_progress(void *ctx, const struct tr_progress *p)
{
	((struct eval_cancel *)ctx)->last_progress_step = p->step;
}

Test(trainer, cancel_during_evaluation_reports_the_last_step_done)
{
	/* 800 training samples of 1000, batches of 100: 8 steps an epoch. */
	const char *job = "{\"seed\": 1, \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 2}]},"
			  " \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 1000, \"features\": 4,"
			  " \"classes\": 2}, \"validation_split\": 0.2}, \"batch_size\": 100, \"epochs\": 3,"
			  " \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}";
	struct tr_spec spec;
	parse(job, &spec);
	tr_backend_t *be = tr_cpu_backend_create(2, 1);
	struct eval_cancel c = {.cancel_at = 8};
	struct tr_trainer_options opt = {
		.spec = &spec,
		.backend = be,
		.devices = 2,
		.hooks = {.metric = eval_cancel_metric, .progress = eval_cancel_progress, .ctx = &c},
	};
	struct tr_error err;
	cr_assert_eq(tr_trainer_create(&opt, &c.t, &err), 0, "%s", err.message);
	int rc = tr_trainer_run(c.t, &err);
	cr_assert_eq(rc, -ECANCELED, "rc %d: %s", rc, err.message);
	cr_assert_eq(c.last_loss_step, 8);
	cr_assert_eq(c.last_progress_step, 8, "progress reported step %lld, the metrics reached step 8",
		     (long long)c.last_progress_step);
	tr_trainer_destroy(c.t);
	tr_backend_destroy(be);
	tr_spec_finish(&spec);
}

Test(trainer, learns_synthetic_classification)
{
	const char *job =
		"{\"seed\": 1, \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 32}, {\"type\": \"relu\"},"
		" {\"type\": \"dense\", \"units\": 4}]},"
		" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 2000, \"features\": 8, \"classes\": 4,"
		" \"noise\": 0.2}, \"validation_split\": 0.2}, \"batch_size\": 32, \"epochs\": 5,"
		" \"optimizer\": {\"type\": \"adam\", \"lr\": 0.01}}";
	struct run_result r;
	run_job(job, 2, 2, false, NULL, &r);
	cr_assert_eq(r.rc, 0, "%s", r.err.message);
	cr_assert_lt(r.loss[r.nloss - 1], r.loss[0] * 0.5, "loss %g -> %g", r.loss[0], r.loss[r.nloss - 1]);
	cr_assert_gt(r.summary.val_accuracy, 0.9, "val accuracy %g", r.summary.val_accuracy);
	free_result(&r);
}

Test(trainer, model_inputs_mismatch_names_field)
{
	/* The spec alone is consistent; the data it meets at run time is not. */
	struct failing_reader fr = {.base = {.i = &failing_i, .info = {.samples = 10, .features = 3, .label_dim = 1}},
				    .bad = -1};
	snprintf(fr.base.name, sizeof fr.base.name, "other.npy");
	const char *job =
		"{\"model\": {\"inputs\": 7, \"layers\": [{\"type\": \"dense\", \"units\": 2}]},"
		" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 10, \"features\": 7, \"classes\": 2}},"
		" \"batch_size\": 4, \"epochs\": 1, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}";
	struct run_result r;
	run_job(job, 1, 1, false, &fr.base, &r);
	cr_assert_eq(r.rc, -EINVAL);
	cr_assert_not_null(strstr(r.err.message, "/model/inputs"), "%s", r.err.message);
	cr_assert_not_null(strstr(r.err.message, "other.npy"), "%s", r.err.message);
}

/* ---- checkpoints and exact resume --------------------------------------- */

struct ckpt_sink {
	struct tr_snapshot *snaps[64];
	int n;
	bool saw_final;
};

static int keep_snapshot(void *ctx, struct tr_snapshot *snap, bool final)
{
	struct ckpt_sink *k = ctx;
	if (k->n >= 64)
		return -1;
	k->snaps[k->n++] = snap;
	k->saw_final |= final;
	return 0;
}

/* Serialises a snapshot the way the daemon stores it and parses it back. */
static struct tr_snapshot *round_trip(const tr_model_t *m, enum tr_optim_type opt, const struct tr_snapshot *s)
{
	struct tr_checkpoint_layout l;
	struct tr_error err;
	cr_assert_eq(tr_checkpoint_layout(m, opt, s, &l, &err), 0, "%s", err.message);
	uint8_t *img = malloc(l.total_bytes), *p = img;
	memcpy(p, l.header, l.header_len);
	p += l.header_len;
	for (int k = 0; k < l.nseg; k++) {
		memcpy(p, l.seg[k], l.seg_len[k]);
		p += l.seg_len[k];
	}
	struct tr_snapshot *back;
	cr_assert_eq(tr_checkpoint_parse(img, l.total_bytes, m, opt, false, &back, &err), 0, "%s", err.message);
	/* The weights-only file is its own header plus the params prefix. */
	size_t mlen = l.model_header_len + l.params_bytes;
	uint8_t *model = malloc(mlen);
	memcpy(model, l.model_header, l.model_header_len);
	memcpy(model + l.model_header_len, img + l.header_len, l.params_bytes);
	tr_st_file_t *f;
	cr_assert_eq(tr_st_open_mem(model, mlen, "model", &f, &err), 0, "%s", err.message);
	cr_assert_eq(tr_st_count(f), tr_model_param_count(m));
	tr_st_close(f);
	free(model);
	tr_checkpoint_layout_finish(&l);
	free(img);
	return back;
}

static void exact_resume(const char *job, int devices)
{
	struct tr_spec spec;
	parse(job, &spec);
	struct tr_error err;
	tr_backend_t *be = tr_cpu_backend_create(devices, 1);

	/* Uninterrupted run, checkpointing every 7 steps. */
	struct ckpt_sink sink = {0};
	struct tr_trainer_options opt = {.spec = &spec,
					 .backend = be,
					 .devices = devices,
					 .hooks = {.checkpoint = keep_snapshot, .ctx = &sink}};
	tr_trainer_t *t;
	cr_assert_eq(tr_trainer_create(&opt, &t, &err), 0, "%s", err.message);
	cr_assert_eq(tr_trainer_run(t, &err), 0, "%s", err.message);
	size_t n = tr_trainer_model(t)->n_params;
	float *straight = malloc(n * sizeof(float));
	tr_trainer_copy_params(t, 0, straight);
	tr_model_t model = *tr_trainer_model(t);
	tr_trainer_destroy(t);
	cr_assert_geq(sink.n, 3);
	cr_assert(sink.saw_final);
	cr_assert_eq(memcmp(sink.snaps[sink.n - 1]->params, straight, n * sizeof(float)), 0,
		     "the final checkpoint is not the final weights");

	/* Resume from every periodic checkpoint: always the same result. */
	for (int i = 0; i < sink.n - 1; i++) {
		struct tr_snapshot *snap = round_trip(&model, spec.optimizer.type, sink.snaps[i]);
		cr_assert_eq(snap->step, sink.snaps[i]->step);
		opt.hooks = (struct tr_trainer_hooks){0};
		cr_assert_eq(tr_trainer_create(&opt, &t, &err), 0, "%s", err.message);
		cr_assert_eq(tr_trainer_restore(t, snap, false, &err), 0, "%s", err.message);
		cr_assert_eq(tr_trainer_run(t, &err), 0, "%s", err.message);
		float *resumed = malloc(n * sizeof(float));
		tr_trainer_copy_params(t, 0, resumed);
		cr_assert_eq(memcmp(resumed, straight, n * sizeof(float)), 0,
			     "%d devices: resuming at step %lld changed the result", devices, (long long)snap->step);
		free(resumed);
		tr_trainer_destroy(t);
		tr_snapshot_free(snap);
	}
	for (int i = 0; i < sink.n; i++)
		tr_snapshot_free(sink.snaps[i]);
	free(straight);
	tr_backend_destroy(be);
	tr_spec_finish(&spec);
}

static const char *RESUME_JOB =
	"{\"seed\": 21, \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 12}, {\"type\": \"relu\"},"
	" {\"type\": \"dropout\", \"rate\": 0.25}, {\"type\": \"layernorm\"}, {\"type\": \"dense\", \"units\": 3}]},"
	" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 130, \"features\": 5, \"classes\": 3},"
	" \"shuffle\": true, \"transforms\": [{\"type\": \"gaussian_noise\", \"std\": 0.1}]},"
	" \"batch_size\": 16, \"epochs\": 4, \"optimizer\": {\"type\": \"adamw\", \"lr\": 0.01},"
	" \"schedule\": {\"type\": \"cosine\", \"warmup_steps\": 4}, \"checkpoint\": {\"every_steps\": 7}}";

Test(trainer, exact_resume_one_device)
{
	exact_resume(RESUME_JOB, 1);
}

Test(trainer, exact_resume_three_devices)
{
	exact_resume(RESUME_JOB, 3);
}

Test(trainer, exact_resume_conv_residual)
{
	exact_resume(CONV_JOB, 2);
}

Test(trainer, exact_resume_sgd_momentum)
{
	char job[2048];
	snprintf(job, sizeof job, "%.*s, \"checkpoint\": {\"every_steps\": 5}}", (int)strlen(SGD_JOB) - 1, SGD_JOB);
	exact_resume(job, 2);
}

/* batchnorm2d's running statistics are buffers, laid out after every
 * parameter, so the checkpoint's data is not in the tensors' order: the
 * header's offsets must follow the layout (they used to be the sizes
 * added up in tensor order, which put other tensors' bytes into the
 * running statistics of a resumed run). */
Test(trainer, exact_resume_batchnorm)
{
	exact_resume("{\"seed\": 5, \"model\": {\"inputs\": [2, 5, 5], \"layers\": ["
		     "{\"type\": \"conv2d\", \"filters\": 3, \"kernel\": 3, \"padding\": 1},"
		     " {\"type\": \"batchnorm2d\"}, {\"type\": \"relu\"}, {\"type\": \"flatten\"},"
		     " {\"type\": \"dense\", \"units\": 3}]},"
		     " \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 45, \"shape\": [2, 5, 5],"
		     " \"classes\": 3}}, \"batch_size\": 8, \"epochs\": 2,"
		     " \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.05, \"momentum\": 0.9},"
		     " \"checkpoint\": {\"every_steps\": 5}}",
		     2);
}

/* ---- zero-copy snapshots ------------------------------------------------ */

/* On CPU devices a checkpoint's snapshot shares rank 0's buffers until the
 * next update writes elsewhere (engine/checkpoint.h).  The sink either
 * holds every snapshot with a copy of its values taken at once, or frees
 * it at once (a writer that finished before the next update) and then
 * scribbles over the spare buffers the next snapshot would get: buffers
 * handed back too early would be scribbled on while still training. */
struct lend_sink {
	bool scribble;
	int n, lent;
	struct tr_snapshot *snaps[64];
	float *copies[64];
};

static int lend_hook(void *ctx, struct tr_snapshot *snap, bool final)
{
	(void) final;
	struct lend_sink *k = ctx;
	cr_assert_lt(k->n, 64);
	k->lent += snap->lease != NULL;
	size_t n = snap->n_params, bytes = n * sizeof(float);
	int ns = snap->n_state;
	if (!k->scribble) {
		float *c = malloc(bytes * (size_t)(1 + ns));
		memcpy(c, snap->params, bytes);
		for (int b = 0; b < ns; b++)
			memcpy(c + n * (size_t)(1 + b), snap->state[b], bytes);
		k->copies[k->n] = c;
		k->snaps[k->n++] = snap;
		return 0;
	}
	k->n++;
	tr_snapshot_free(snap);
	struct tr_snapshot *other = tr_snapshot_alloc(n, ns);
	cr_assert_not_null(other);
	for (size_t i = 0; i < n; i++) {
		other->params[i] = NAN;
		for (int b = 0; b < ns; b++)
			other->state[b][i] = NAN;
	}
	tr_snapshot_free(other);
	return 0;
}

/* Rank 0's final weights (every replica checked equal); with a sink that
 * holds its snapshots, the trainer is also restored from the first one
 * before it goes, which must not touch the snapshots either. */
static float *train_lending(tr_backend_t *be, const struct tr_spec *spec, int devices, struct lend_sink *sink,
			    size_t *n_params)
{
	struct tr_error err;
	struct tr_trainer_options opt = {.spec = spec,
					 .backend = be,
					 .devices = devices,
					 .hooks = {.checkpoint = sink ? lend_hook : NULL, .ctx = sink}};
	tr_trainer_t *t;
	cr_assert_eq(tr_trainer_create(&opt, &t, &err), 0, "%s", err.message);
	cr_assert_eq(tr_trainer_run(t, &err), 0, "%s", err.message);
	size_t n = tr_trainer_model(t)->n_params;
	float *out = malloc(n * sizeof(float)), *other = malloc(n * sizeof(float));
	cr_assert_eq(tr_trainer_copy_params(t, 0, out), 0);
	for (int r = 1; r < devices; r++) {
		cr_assert_eq(tr_trainer_copy_params(t, r, other), 0);
		cr_assert_eq(memcmp(other, out, n * sizeof(float)), 0, "replica %d differs from replica 0", r);
	}
	free(other);
	if (sink && !sink->scribble && sink->n > 0) {
		/* Weights only: the optimizer state must survive the end of the
		 * loan as it was (the final snapshot's), the weights become the
		 * first snapshot's, and neither snapshot may change. */
		const struct tr_snapshot *first = sink->snaps[0];
		const float *last_copy = sink->copies[sink->n - 1];
		cr_assert_eq(tr_trainer_restore(t, first, true, &err), 0, "%s", err.message);
		struct tr_snapshot *now = tr_trainer_snapshot(t, 0, 0, "test");
		cr_assert_not_null(now);
		cr_assert_eq(memcmp(now->params, sink->copies[0], n * sizeof(float)), 0,
			     "a weights-only restore did not load the weights");
		for (int b = 0; b < now->n_state; b++)
			cr_assert_eq(memcmp(now->state[b], last_copy + n * (size_t)(1 + b), n * sizeof(float)), 0,
				     "optimizer buffer %d changed when the loan ended", b);
		tr_snapshot_free(now);
		cr_assert_eq(tr_trainer_restore(t, first, false, &err), 0, "%s", err.message);
	}
	tr_trainer_destroy(t);
	*n_params = n;
	return out;
}

/* lend = false: the backend without its out-of-place kernels, so the
 * trainer copies its snapshots (as on GPUs); the same promises hold. */
static void zero_copy_snapshots(const char *job, int devices, bool lend)
{
	struct tr_spec spec;
	parse(job, &spec);
	tr_backend_t *be = tr_cpu_backend_create(devices, 1);
	const tr_backend_i *orig = be->i;
	tr_backend_i copying = *orig;
	copying.sgd_step_into = NULL;
	copying.adam_step_into = NULL;
	if (!lend)
		be->i = &copying;
	int every = spec.checkpoint_every_steps;
	cr_assert_gt(every, 0);
	spec.checkpoint_every_steps = 0;
	size_t n;
	float *plain = train_lending(be, &spec, devices, NULL, &n);
	spec.checkpoint_every_steps = every;
	for (int scribble = 0; scribble < 2; scribble++) {
		struct lend_sink sink = {.scribble = scribble};
		float *got = train_lending(be, &spec, devices, &sink, &n);
		cr_assert_geq(sink.n, 3);
		cr_assert_eq(sink.lent, lend ? sink.n : 0, "%d of %d snapshots were lent", sink.lent, sink.n);
		cr_assert_eq(memcmp(got, plain, n * sizeof(float)), 0,
			     "%d devices: checkpoints (%s) changed the result", devices,
			     scribble ? "freed at once, spares reused" : "held");
		/* The trainer is gone: what the held snapshots show is theirs. */
		for (int i = 0; !scribble && i < sink.n; i++) {
			struct tr_snapshot *s = sink.snaps[i];
			size_t bytes = n * sizeof(float);
			cr_assert_eq(memcmp(s->params, sink.copies[i], bytes), 0,
				     "the snapshot at step %lld changed after it was taken", (long long)s->step);
			for (int b = 0; b < s->n_state; b++)
				cr_assert_eq(memcmp(s->state[b], sink.copies[i] + n * (size_t)(1 + b), bytes), 0,
					     "the snapshot at step %lld: optimizer buffer %d changed",
					     (long long)s->step, b);
			tr_snapshot_free(s);
			free(sink.copies[i]);
		}
		free(got);
	}
	free(plain);
	be->i = orig;
	tr_backend_destroy(be);
	tr_spec_finish(&spec);
}

Test(trainer, zero_copy_snapshots_adamw_one_device)
{
	zero_copy_snapshots(RESUME_JOB, 1, true);
}

Test(trainer, zero_copy_snapshots_sgd_momentum_three_devices)
{
	char job[2048];
	snprintf(job, sizeof job, "%.*s, \"checkpoint\": {\"every_steps\": 3}}", (int)strlen(SGD_JOB) - 1, SGD_JOB);
	zero_copy_snapshots(job, 3, true);
}

Test(trainer, zero_copy_snapshots_plain_sgd_two_devices)
{
	const char *job =
		"{\"seed\": 5, \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 8}, {\"type\": \"relu\"},"
		" {\"type\": \"dense\", \"units\": 3}]}, \"data\": {\"train\": {\"format\": \"synthetic\","
		" \"samples\": 90, \"features\": 4, \"classes\": 3}, \"shuffle\": true}, \"batch_size\": 10,"
		" \"epochs\": 2, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}, \"checkpoint\": {\"every_steps\": 4}}";
	zero_copy_snapshots(job, 2, true);
}

Test(trainer, copied_snapshots_without_out_of_place_kernels)
{
	zero_copy_snapshots(RESUME_JOB, 3, false);
}

/* ---- upload-ahead -------------------------------------------------------- */

/* The CPU backend with its function table replaced by a patched copy (the
 * object stays the CPU backend's, so its own functions work unchanged).
 * While a run is recorded, each device logs the calls that show where a
 * step's inputs come from, in order; a device's log is written only by the
 * thread of its rank.  The patch can also hold each device's first upload
 * until the ring is full (so that every later step is loaded ahead), and
 * fail one optimizer call. */
enum ev_kind { EV_TO_DEVICE, EV_ASYNC, EV_FENCE, EV_MEMSET0, EV_GEMM, EV_SYNC, EV_FAIL };

struct ev {
	enum ev_kind kind;
	uint64_t hash; /* of the bytes copied (EV_TO_DEVICE, EV_ASYNC) */
};

#define REC_DEVS 4
#define REC_EVENTS 8192

struct dev_log {
	struct ev ev[REC_EVENTS];
	int n;
	bool held;
	int sgd_calls;
	atomic_int syncs;
};

struct count_reader {
	struct tr_reader base;
	atomic_llong served;
	int lag_batch; /* > 0: sample i waits until every device synced step i / lag_batch - 1 */
};

static struct recorder {
	tr_backend_t *be;
	const tr_backend_i *orig;
	tr_backend_i table;
	int ndev;
	bool on; /* written only while no rank thread runs */
	struct dev_log dev[REC_DEVS];
	atomic_int asyncs;
	struct count_reader *gate; /* first uploads wait until it served gate_samples */
	int64_t gate_samples;
	int fail_dev, fail_call; /* this device's fail_call-th sgd_step (0-based) fails */
} rec;

static uint64_t fnv(const void *p, size_t n)
{
	const unsigned char *b = p;
	uint64_t h = 0xcbf29ce484222325ULL;
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ULL;
	return h;
}

static void log_ev(int dev, enum ev_kind kind, uint64_t hash)
{
	struct dev_log *l = &rec.dev[dev];
	if (rec.on && l->n < REC_EVENTS)
		l->ev[l->n++] = (struct ev){kind, hash};
}

/* Every step of the job is loaded (and marked ready, which follows the
 * last sample within microseconds; 200 ms leaves room for a loader
 * preempted on a loaded machine) before any device starts its first step. */
static void hold_first_upload(int dev)
{
	if (!rec.on || !rec.gate || rec.dev[dev].held)
		return;
	rec.dev[dev].held = true;
	for (int i = 0; i < 10000 && atomic_load(&rec.gate->served) < rec.gate_samples; i++)
		usleep(1000);
	usleep(200 * 1000);
}

static int rec_to_device(tr_backend_t *be, int dev, void *dst, const void *src, size_t bytes)
{
	hold_first_upload(dev);
	log_ev(dev, EV_TO_DEVICE, fnv(src, bytes));
	return rec.orig->to_device(be, dev, dst, src, bytes);
}

static int rec_to_device_async(tr_backend_t *be, int dev, void *dst, const void *src, size_t bytes)
{
	log_ev(dev, EV_ASYNC, fnv(src, bytes));
	if (rec.on)
		atomic_fetch_add(&rec.asyncs, 1);
	return rec.orig->to_device_async(be, dev, dst, src, bytes);
}

static int rec_copies_fence(tr_backend_t *be, int dev)
{
	hold_first_upload(dev);
	log_ev(dev, EV_FENCE, 0);
	return rec.orig->copies_fence(be, dev);
}

static int rec_memset0(tr_backend_t *be, int dev, void *dst, size_t bytes)
{
	log_ev(dev, EV_MEMSET0, 0);
	return rec.orig->memset0(be, dev, dst, bytes);
}

static int rec_gemm(tr_backend_t *be, int dev, bool ta, bool tb, int m, int n, int k, float alpha, const float *a,
		    const float *b, float beta, float *c)
{
	log_ev(dev, EV_GEMM, 0);
	return rec.orig->gemm(be, dev, ta, tb, m, n, k, alpha, a, b, beta, c);
}

/* a dense layer's products on their route (its forward too: the first
 * compute of a step) */
static int rec_gemm_route(tr_backend_t *be, int dev, int route, bool ta, bool tb, int m, int n, int k, const float *a,
			  const float *b, const float *bias, float *c)
{
	log_ev(dev, EV_GEMM, 0);
	return rec.orig->gemm_route(be, dev, route, ta, tb, m, n, k, a, b, bias, c);
}

static int rec_sync(tr_backend_t *be, int dev)
{
	log_ev(dev, EV_SYNC, 0);
	if (rec.on)
		atomic_fetch_add(&rec.dev[dev].syncs, 1);
	return rec.orig->sync(be, dev);
}

/* The failure comes from the CPU backend itself (a device out of range),
 * so that last_error has a real message. */
static int rec_sgd_step(tr_backend_t *be, int dev, size_t n, float *param, const float *grad, float *state1,
			const struct tr_optim_hp *hp)
{
	if (rec.on && dev == rec.fail_dev && rec.dev[dev].sgd_calls++ == rec.fail_call) {
		log_ev(dev, EV_FAIL, 0);
		return rec.orig->sgd_step(be, 99, n, param, grad, state1, hp);
	}
	return rec.orig->sgd_step(be, dev, n, param, grad, state1, hp);
}

/* A CPU backend of `devices` devices recorded as above; ahead = false
 * removes the upload-ahead ops, which gives the trainer's synchronous
 * path (the reference for bit-identity). */
static tr_backend_t *rec_backend(int devices, bool ahead)
{
	cr_assert_leq(devices, REC_DEVS);
	tr_backend_t *be = tr_cpu_backend_create(devices, 1);
	cr_assert_not_null(be);
	memset(&rec, 0, sizeof rec);
	rec.be = be;
	rec.orig = be->i;
	rec.ndev = devices;
	rec.fail_dev = -1;
	rec.table = *be->i;
	rec.table.to_device = rec_to_device;
	rec.table.to_device_async = ahead ? rec_to_device_async : NULL;
	rec.table.copies_fence = ahead ? rec_copies_fence : NULL;
	rec.table.memset0 = rec_memset0;
	rec.table.gemm = rec_gemm;
	rec.table.gemm_route = rec_gemm_route;
	rec.table.sync = rec_sync;
	rec.table.sgd_step = rec_sgd_step;
	/* Rank 0's update after a checkpoint would go through sgd_step_into,
	 * around rec_sgd_step's fault injection: snapshots are copied here. */
	rec.table.sgd_step_into = NULL;
	rec.table.adam_step_into = NULL;
	be->i = &rec.table;
	return be;
}

static void rec_backend_destroy(tr_backend_t *be)
{
	be->i = rec.orig;
	tr_backend_destroy(be);
	rec.be = NULL;
}

static void record_run(tr_backend_t *be, bool on)
{
	if (be == rec.be)
		rec.on = on;
}

/* The smallest number of steps every device has finished (synced). */
static int steps_synced(void)
{
	int low = INT32_MAX;
	for (int d = 0; d < rec.ndev; d++) {
		int n = atomic_load(&rec.dev[d].syncs);
		low = n < low ? n : low;
	}
	return low;
}

/* Sample i: features and a class (of 3) that are a function of i alone. */
static int count_get(tr_reader_t *r, int64_t index, float *x, float *y, struct tr_error *err)
{
	struct count_reader *c = (struct count_reader *)r;
	if (c->lag_batch > 0) {
		int64_t step = index / c->lag_batch;
		int i = 0;
		for (; i < 10000 && steps_synced() < step; i++)
			usleep(1000);
		if (i == 10000) {
			tr_error_set(err, 0, 0, NULL, "sample %lld: step %lld never finished", (long long)index,
				     (long long)step);
			return -ETIMEDOUT;
		}
	}
	for (int j = 0; j < r->info.features; j++)
		x[j] = (float)((index * 31 + j * 7) % 17) / 8.0f - 1.0f;
	y[0] = (float)(index % 3);
	atomic_fetch_add(&c->served, 1);
	return 0;
}

static const struct tr_reader_i count_i = {.get = count_get, .destroy = failing_destroy};

static void count_reader_init(struct count_reader *c, int64_t samples, int features)
{
	memset(c, 0, sizeof *c);
	c->base.i = &count_i;
	c->base.info = (struct tr_reader_info){.samples = samples, .features = features, .label_dim = 1};
	snprintf(c->base.name, sizeof c->base.name, "counting");
	atomic_init(&c->served, 0);
}

/* One step of one device's log: the events up to and including the
 * step's final sync. */
struct seg {
	int begin, end; /* [begin, end) in the device's log */
	int uploads, asyncs, fences, memsets;
	uint64_t up_hash[2], async_hash[2];
	int first_fence, first_gemm; /* log positions, -1 when absent */
};

static int split_steps(const struct dev_log *l, struct seg *segs, int max)
{
	int n = 0, begin = 0;
	for (int i = 0; i < l->n && n < max; i++) {
		if (l->ev[i].kind != EV_SYNC)
			continue;
		struct seg *g = &segs[n++];
		*g = (struct seg){.begin = begin, .end = i + 1, .first_fence = -1, .first_gemm = -1};
		for (int k = begin; k <= i; k++) {
			const struct ev *e = &l->ev[k];
			if (e->kind == EV_TO_DEVICE && g->uploads < 2)
				g->up_hash[g->uploads] = e->hash;
			if (e->kind == EV_ASYNC && g->asyncs < 2)
				g->async_hash[g->asyncs] = e->hash;
			g->uploads += e->kind == EV_TO_DEVICE;
			g->asyncs += e->kind == EV_ASYNC;
			g->fences += e->kind == EV_FENCE;
			g->memsets += e->kind == EV_MEMSET0;
			if (e->kind == EV_FENCE && g->first_fence < 0)
				g->first_fence = k;
			if (e->kind == EV_GEMM && g->first_gemm < 0)
				g->first_gemm = k;
		}
		begin = i + 1;
	}
	return n;
}

static void assert_bit_identical(const struct run_result *a, const struct run_result *b, const char *what)
{
	cr_assert_eq(a->rc, 0, "%s: %s", what, a->err.message);
	cr_assert_eq(b->rc, 0, "%s: %s", what, b->err.message);
	cr_assert_eq(a->nloss, b->nloss, "%s", what);
	cr_assert_eq(memcmp(a->loss, b->loss, sizeof(double) * (size_t)a->nloss), 0, "%s: losses differ", what);
	cr_assert_eq(a->nparams, b->nparams);
	cr_assert_eq(memcmp(a->params, b->params, a->nparams * sizeof(float)), 0, "%s: weights differ", what);
	cr_assert(memcmp(&a->summary.val_loss, &b->summary.val_loss, sizeof(double)) == 0,
		  "%s: val_loss %.17g vs %.17g", what, a->summary.val_loss, b->summary.val_loss);
}

/* 18 samples, batch 8: steps of 8, 8 and 2 in each of 3 epochs.  With 3
 * devices the shares are 3,3,2 and on the last step 1,1,0 (rank 2 idle);
 * with 2 devices 4,4 and 1,1.  A ring of 16 slots holds all 9 steps. */
/* The float path: the test counts the clearing of an idle rank's
 * gradient, which exact mode's sum makes unnecessary. */
static const char *AHEAD_JOB =
	"{\"seed\": 13, \"exact\": false, \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 10}, {\"type\": \"tanh\"},"
	" {\"type\": \"dropout\", \"rate\": 0.2}, {\"type\": \"dense\", \"units\": 3}]},"
	" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 18, \"features\": 5, \"classes\": 3},"
	" \"shuffle\": true, \"transforms\": [{\"type\": \"gaussian_noise\", \"std\": 0.1}]},"
	" \"batch_size\": 8, \"epochs\": 3, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1},"
	" \"prefetch\": {\"workers\": 2, \"depth\": 16}}";
#define AHEAD_STEPS 9

/* Runs AHEAD_JOB on the counting reader with the ring full before step 1
 * starts; `log` receives each device's log. */
static void run_ahead_job(int devices, bool ahead, struct run_result *out, struct dev_log *logs)
{
	struct count_reader cr;
	count_reader_init(&cr, 18, 5);
	tr_backend_t *be = rec_backend(devices, ahead);
	rec.gate = &cr;
	rec.gate_samples = 18 * 3;
	run_job_on(be, AHEAD_JOB, devices, 2, false, &cr.base, out);
	for (int d = 0; d < devices; d++)
		logs[d] = rec.dev[d];
	rec_backend_destroy(be);
}

/* When step s+1 is loaded while step s runs, every device with a share of
 * s+1 enqueues it (the same bytes the synchronous path copies at the start
 * of s+1) on the copy stream before step s's final sync; step s+1 then
 * copies nothing itself and fences before its first kernel.  The first
 * step copies synchronously, the last step looks at nothing beyond the
 * end, an idle rank neither copies nor fences, and every result is bit for
 * bit that of the synchronous path. */
Test(upload_ahead, next_share_enqueued_before_final_sync)
{
	static struct dev_log old_logs[REC_DEVS], new_logs[REC_DEVS];
	for (int devices = 1; devices <= 3; devices++) {
		struct run_result old, neu;
		run_ahead_job(devices, false, &old, old_logs);
		run_ahead_job(devices, true, &neu, new_logs);
		char what[64];
		snprintf(what, sizeof what, "%d device(s)", devices);
		assert_bit_identical(&old, &neu, what);
		int idle_steps = 0;
		for (int d = 0; d < devices; d++) {
			struct seg o[AHEAD_STEPS + 1], n[AHEAD_STEPS + 1];
			cr_assert_eq(split_steps(&old_logs[d], o, AHEAD_STEPS + 1), AHEAD_STEPS, "%s", what);
			cr_assert_eq(split_steps(&new_logs[d], n, AHEAD_STEPS + 1), AHEAD_STEPS, "%s", what);
			for (int s = 0; s < AHEAD_STEPS; s++) {
				bool idle = o[s].uploads == 0;
				cr_assert_eq(o[s].asyncs + o[s].fences, 0, "the synchronous path used the copy stream");
				/* every step clears its results block; an idle
				 * one its gradient too */
				cr_assert(idle ? o[s].memsets == 2 : o[s].uploads == 2 && o[s].memsets == 1,
					  "%s dev %d step %d", what, d, s);
				idle_steps += idle;
				/* what this step was given ahead, and how it started */
				bool given = s > 0 && !idle;
				cr_assert_eq(s > 0 ? n[s - 1].asyncs : 0, given ? 2 : 0,
					     "%s dev %d: %d async copies of step %d during step %d", what, d,
					     n[s - 1].asyncs, s + 1, s);
				if (given) {
					cr_assert(n[s - 1].async_hash[0] == o[s].up_hash[0] &&
							  n[s - 1].async_hash[1] == o[s].up_hash[1],
						  "%s dev %d: step %d's async copies are not its share", what, d,
						  s + 1);
					cr_assert_eq(n[s].uploads, 0, "%s dev %d step %d copied synchronously", what, d,
						     s + 1);
					cr_assert_eq(n[s].fences, 1, "%s dev %d step %d", what, d, s + 1);
					cr_assert(n[s].first_gemm > n[s].first_fence,
						  "%s dev %d step %d computes before its fence", what, d, s + 1);
				} else {
					cr_assert_eq(n[s].fences, 0, "%s dev %d step %d", what, d, s + 1);
					cr_assert_eq(n[s].uploads, o[s].uploads, "%s dev %d step %d", what, d, s + 1);
				}
			}
			cr_assert_eq(n[AHEAD_STEPS - 1].asyncs, 0, "%s: the last step copied beyond the end", what);
		}
		cr_assert_eq(idle_steps, devices == 3 ? 3 : 0, "%s: %d idle device-steps", what, idle_steps);
		free_result(&old);
		free_result(&neu);
	}
}

/* Results do not depend on whether a step's share was uploaded ahead, at
 * whatever timing: epoch ends, the short last step, idle ranks,
 * validation passes between steps (rank 0's spare buffers hold the next
 * step meanwhile), rollover, and 1 to 3 devices against the synchronous
 * path. */
Test(upload_ahead, bit_identical_to_synchronous_uploads)
{
	const char *jobs[] = {
		"{\"seed\": 17, \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 12}, {\"type\": \"gelu\"},"
		" {\"type\": \"dropout\", \"rate\": 0.25}, {\"type\": \"layernorm\"}, {\"type\": \"dense\", \"units\": 3}]},"
		" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 80, \"features\": 6, \"classes\": 3},"
		" \"validation_split\": 0.25, \"transforms\": [{\"type\": \"gaussian_noise\", \"std\": 0.05}]},"
		" \"batch_size\": 8, \"epochs\": 3, \"optimizer\": {\"type\": \"adamw\", \"lr\": 0.01},"
		" \"clip_grad_norm\": 1.0, \"prefetch\": {\"workers\": 2, \"depth\": 4}}",
		"{\"seed\": 19, \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 8}, {\"type\": \"relu\"},"
		" {\"type\": \"dense\", \"units\": 2}], \"loss\": \"mse\"},"
		" \"data\": {\"train\": {\"format\": \"synthetic\", \"task\": \"regression\", \"samples\": 41,"
		" \"features\": 4, \"outputs\": 2}, \"last_batch\": \"rollover\"}, \"batch_size\": 6, \"epochs\": 4,"
		" \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.05, \"momentum\": 0.9}, \"prefetch\": {\"depth\": 2}}",
		/* one slot: step s+1 can never be loaded while s holds the ring */
		"{\"seed\": 29, \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 5}, {\"type\": \"relu\"},"
		" {\"type\": \"dense\", \"units\": 3}]},"
		" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 29, \"features\": 3, \"classes\": 3}},"
		" \"batch_size\": 7, \"epochs\": 2, \"optimizer\": {\"type\": \"adam\", \"lr\": 0.02},"
		" \"prefetch\": {\"workers\": 3, \"depth\": 1}}",
	};
	for (size_t j = 0; j < sizeof jobs / sizeof jobs[0]; j++) {
		for (int devices = 1; devices <= 3; devices++) {
			struct run_result old, neu;
			tr_backend_t *be = rec_backend(devices, false);
			run_job_on(be, jobs[j], devices, 2, false, NULL, &old);
			rec_backend_destroy(be);
			be = rec_backend(devices, true);
			run_job_on(be, jobs[j], devices, 3, false, NULL, &neu);
			int asyncs = atomic_load(&rec.asyncs);
			rec_backend_destroy(be);
			char what[64];
			snprintf(what, sizeof what, "job %zu, %d device(s)", j, devices);
			assert_bit_identical(&old, &neu, what);
			if (j == 2)
				cr_assert_eq(asyncs, 0, "%s: a step was copied ahead from a one-slot ring", what);
			free_result(&old);
			free_result(&neu);
		}
	}
}

/* A step is never held up waiting for the next one's data: step s+1's
 * samples can only load once every device has finished step s, so a
 * trainer that waited for s+1 inside step s would never finish (the
 * reader gives up after 10 s and fails the job).  Every step then copies
 * its own share when it starts, and the results are those of the
 * synchronous path. */
Test(upload_ahead, slow_ring_never_blocks_the_step)
{
	const char *job =
		"{\"seed\": 23, \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 6}, {\"type\": \"relu\"},"
		" {\"type\": \"dense\", \"units\": 3}]},"
		" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 30, \"features\": 4, \"classes\": 3},"
		" \"shuffle\": false}, \"batch_size\": 8, \"epochs\": 1, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1},"
		" \"prefetch\": {\"workers\": 2, \"depth\": 4}}";
	for (int devices = 1; devices <= 3; devices++) {
		struct count_reader cr;
		struct run_result old, neu;
		count_reader_init(&cr, 30, 4);
		cr.lag_batch = 8;
		tr_backend_t *be = rec_backend(devices, false);
		run_job_on(be, job, devices, 2, false, &cr.base, &old);
		rec_backend_destroy(be);
		count_reader_init(&cr, 30, 4);
		cr.lag_batch = 8;
		be = rec_backend(devices, true);
		run_job_on(be, job, devices, 2, false, &cr.base, &neu);
		int asyncs = atomic_load(&rec.asyncs);
		rec_backend_destroy(be);
		char what[64];
		snprintf(what, sizeof what, "%d device(s)", devices);
		assert_bit_identical(&old, &neu, what);
		cr_assert_eq(neu.summary.steps, 4);
		cr_assert_eq(asyncs, 0, "%s: %d copies of a step that was not loaded", what, asyncs);
		free_result(&old);
		free_result(&neu);
	}
}

/* A step that fails after its device enqueued the next step's share waits
 * for that copy (a sync after the failure) before the job ends and the
 * ring frees the slot it reads; the error names the device and step, and
 * nothing leaks (ASan). */
Test(upload_ahead, failed_step_waits_for_copies_in_flight)
{
	static struct dev_log logs[REC_DEVS];
	struct count_reader cr;
	struct run_result r;
	count_reader_init(&cr, 18, 5);
	tr_backend_t *be = rec_backend(2, true);
	rec.gate = &cr;
	rec.gate_samples = 18 * 3;
	rec.fail_dev = 1;
	rec.fail_call = 3; /* step 4 */
	run_job_on(be, AHEAD_JOB, 2, 2, false, &cr.base, &r);
	for (int d = 0; d < 2; d++)
		logs[d] = rec.dev[d];
	rec_backend_destroy(be);
	cr_assert_lt(r.rc, 0);
	cr_assert_not_null(strstr(r.err.message, "step 4"), "%s", r.err.message);
	cr_assert_not_null(strstr(r.err.message, "device 1"), "%s", r.err.message);
	cr_assert_not_null(strstr(r.err.message, "device 99 out of range"), "%s", r.err.message);
	cr_assert_eq(r.summary.steps, 3);
	const struct dev_log *l = &logs[1];
	int fail = -1, async_before = 0, sync_after = 0;
	for (int i = 0; i < l->n; i++) {
		if (l->ev[i].kind == EV_FAIL)
			fail = i;
	}
	cr_assert_geq(fail, 0, "the injected failure did not happen");
	for (int i = fail - 1; i >= 0 && l->ev[i].kind != EV_SYNC; i--)
		async_before += l->ev[i].kind == EV_ASYNC;
	for (int i = fail + 1; i < l->n; i++)
		sync_after += l->ev[i].kind == EV_SYNC;
	cr_assert_eq(async_before, 2, "step 4 did not enqueue step 5's share before failing");
	cr_assert_eq(sync_after, 1, "the failed step did not wait for its copies");
	free_result(&r);
}

/* A cancel that lands while shares are uploaded ahead ends the run with
 * -ECANCELED and joins every thread promptly; a copy in flight is waited
 * for (ASan/TSan see no use of a freed slot, no leak). */
Test(upload_ahead, cancel_mid_run_joins_cleanly)
{
	struct tr_spec spec;
	parse(HEAVY_COMPUTE_JOB, &spec);
	tr_backend_t *be = rec_backend(3, true);
	struct tr_trainer_options opt = {.spec = &spec, .backend = be, .devices = 3};
	struct tr_error err;
	struct bg_run b = {0};
	cr_assert_eq(tr_trainer_create(&opt, &b.t, &err), 0, "%s", err.message);
	rec.on = true;
	pthread_t th;
	pthread_create(&th, NULL, bg_main, &b);
	for (int i = 0; i < 10000 && atomic_load(&rec.asyncs) < 6; i++)
		usleep(1000);
	double t0 = now_s();
	tr_trainer_cancel(b.t);
	pthread_join(th, NULL);
	rec.on = false;
	tr_trainer_destroy(b.t);
	double took = now_s() - t0;
	int asyncs = atomic_load(&rec.asyncs);
	rec_backend_destroy(be);
	tr_spec_finish(&spec);
	cr_assert_geq(asyncs, 6, "no share was uploaded ahead in 10 s (%d copies)", asyncs);
	cr_assert_lt(took, 1.0, "run and destroy took %.3f s after the cancel", took);
	cr_assert_eq(b.rc, -ECANCELED, "rc %d: %s", b.rc, b.err.message);
}

/* ---- opening the data: cancel flag, confinement of init.from ------------ */

static void write_lines(const char *path, int lines)
{
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f, "%s", path);
	for (int i = 1; i <= lines; i++)
		fprintf(f, "%d.5,0.25,%d\n", i, i % 2);
	fclose(f);
}

Test(trainer, a_set_cancel_flag_stops_create_before_the_data_is_read)
{
	char dir[] = "/tmp/trainer-cancel-XXXXXX", path[256], job[1024];
	struct tr_error err;
	cr_assert_not_null(mkdtemp(dir));
	snprintf(path, sizeof path, "%s/data.csv", dir);
	write_lines(path, 30);
	snprintf(job, sizeof job,
		 "{\"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 2}]},"
		 " \"data\": {\"train\": {\"format\": \"csv\", \"path\": \"%s\"}},"
		 " \"batch_size\": 8, \"epochs\": 1, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}",
		 path);
	struct tr_spec spec;
	parse(job, &spec);
	tr_backend_t *be = tr_cpu_backend_create(1, 1);
	atomic_bool cancel = true;
	struct tr_trainer_options opt = {.spec = &spec, .backend = be, .cancel = &cancel};
	tr_trainer_t *t = NULL;
	cr_assert_eq(tr_trainer_create(&opt, &t, &err), -ECANCELED, "%s", err.message);
	cr_assert_null(t);
	atomic_store(&cancel, false);
	cr_assert_eq(tr_trainer_create(&opt, &t, &err), 0, "%s", err.message);
	tr_trainer_destroy(t);
	tr_backend_destroy(be);
	tr_spec_finish(&spec);
	unlink(path);
	rmdir(dir);
}

Test(trainer, init_from_opens_beneath_the_data_roots)
{
	char dir[] = "/tmp/trainer-roots-XXXXXX", root[256], path[300], link[300], job[1024];
	struct tr_error err;
	cr_assert_not_null(mkdtemp(dir));
	snprintf(root, sizeof root, "%s/root", dir);
	cr_assert_eq(mkdir(root, 0700), 0);
	snprintf(path, sizeof path, "%s/data.csv", root);
	write_lines(path, 30);
	/* A weights file next to the root, reachable only by a symlink out. */
	snprintf(path, sizeof path, "%s/w.safetensors", dir);
	write_lines(path, 1);
	snprintf(link, sizeof link, "%s/w.safetensors", root);
	cr_assert_eq(symlink("../w.safetensors", link), 0);
	snprintf(job, sizeof job,
		 "{\"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 2}]},"
		 " \"data\": {\"train\": {\"format\": \"csv\", \"path\": \"data.csv\"}},"
		 " \"init\": {\"from\": \"w.safetensors\"},"
		 " \"batch_size\": 8, \"epochs\": 1, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}");
	struct tr_spec spec;
	parse(job, &spec);
	const char *dirs[] = {root, NULL};
	tr_data_roots_t *roots;
	cr_assert_eq(tr_data_roots_create(dirs, &roots, &err), 0, "%s", err.message);
	tr_backend_t *be = tr_cpu_backend_create(1, 1);
	struct tr_trainer_options opt = {.spec = &spec, .backend = be, .data_roots = roots};
	tr_trainer_t *t = NULL;
	cr_assert_eq(tr_trainer_create(&opt, &t, &err), -ENOENT, "%s", err.message);
	cr_assert(strstr(err.message, "/init/from: 'w.safetensors' is not a file in the data roots"), "%s",
		  err.message);
	tr_backend_destroy(be);
	tr_data_roots_destroy(roots);
	tr_spec_finish(&spec);
	unlink(link);
	unlink(path);
	snprintf(path, sizeof path, "%s/data.csv", root);
	unlink(path);
	rmdir(root);
	rmdir(dir);
}

/* ---- cancel during set-up ------------------------------------------------ */

struct delayed_flag {
	atomic_bool *flag;
	int delay_ms;
	double set_at;
};

static void *set_flag_later(void *arg)
{
	struct delayed_flag *d = arg;
	usleep((useconds_t)d->delay_ms * 1000);
	d->set_at = now_s();
	atomic_store(d->flag, true);
	return NULL;
}

/* standardize reads the whole training set at create time: with 2^40
 * synthetic samples (the most a spec may ask for) that is days of work, so
 * before set-up watched the caller's cancel flag a job in set-up could be
 * neither cancelled nor shut down. */
Test(trainer, cancel_during_setup_returns_promptly, .timeout = 60)
{
	char job[1024];
	snprintf(
		job, sizeof job,
		"{\"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 2}]},"
		" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": %lld, \"features\": 4, \"classes\": 2},"
		" \"transforms\": [{\"type\": \"standardize\"}]}, \"batch_size\": 64, \"epochs\": 1,"
		" \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}",
		(long long)TR_SPEC_MAX_SAMPLES);
	struct tr_spec spec;
	parse(job, &spec);
	tr_backend_t *be = tr_cpu_backend_create(1, 1);
	atomic_bool cancel = false;
	struct tr_trainer_options opt = {.spec = &spec, .backend = be, .devices = 1, .cancel = &cancel};
	struct delayed_flag d = {.flag = &cancel, .delay_ms = 300};
	pthread_t th;
	pthread_create(&th, NULL, set_flag_later, &d);
	tr_trainer_t *t = NULL;
	struct tr_error err;
	int rc = tr_trainer_create(&opt, &t, &err);
	double returned_at = now_s();
	/* set_at is the other thread's until the join: set-up reads the flag
	 * relaxed, so seeing it set orders nothing else */
	pthread_join(th, NULL);
	double took = returned_at - d.set_at;
	cr_assert_eq(rc, -ECANCELED, "rc %d: %s", rc, err.message);
	cr_assert_null(t);
	cr_assert_lt(took, 2.0, "create returned %.2f s after the cancel", took);

	/* A flag already set stops set-up before it opens anything. */
	t = NULL;
	cr_assert_eq(tr_trainer_create(&opt, &t, &err), -ECANCELED, "%s", err.message);
	cr_assert_null(t);
	tr_backend_destroy(be);
	tr_spec_finish(&spec);
}

/* ---- stop_on_nan ---------------------------------------------------------- */

/* Ordinary samples, except sample `bad`: its features are 1e30 (finite, but
 * the weight gradient x * dpred overflows float) or, with nan_label, its
 * label is NaN (the loss and every gradient go NaN). */
struct blowup_reader {
	struct tr_reader base;
	int64_t bad;
	bool nan_label;
};

static int blowup_get(tr_reader_t *r, int64_t index, float *x, float *y, struct tr_error *err)
{
	struct blowup_reader *b = (struct blowup_reader *)r;
	(void)err;
	for (int j = 0; j < r->info.features; j++)
		x[j] = index == b->bad && !b->nan_label ? 1e30f : (float)((index * 7 + j) % 5) - 2.0f;
	y[0] = index == b->bad && b->nan_label ? NAN : (float)(index % 3);
	return 0;
}

static const struct tr_reader_i blowup_i = {.get = blowup_get, .destroy = failing_destroy};

/* shuffle off, batch 4: sample 10 lies in step 3 (1-based). */
static const char *NAN_JOB_FMT =
	"{\"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 1}], \"loss\": \"mse\"},"
	" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 40, \"features\": 3, \"classes\": 2},"
	" \"shuffle\": false}, \"batch_size\": 4, \"epochs\": 1, \"optimizer\": {\"type\": \"adam\", \"lr\": 0.01},"
	" \"checkpoint\": {\"every_steps\": 1}%s}";

static void nan_case(bool nan_label, int devices, const char *want)
{
	struct blowup_reader br = {
		.base = {.i = &blowup_i, .info = {.samples = 40, .features = 3, .label_dim = 1}},
		.bad = 10,
		.nan_label = nan_label,
	};
	snprintf(br.base.name, sizeof br.base.name, "blowup");
	char job[1024];
	snprintf(job, sizeof job, NAN_JOB_FMT, "");
	struct tr_spec spec;
	parse(job, &spec);
	cr_assert(spec.stop_on_nan, "stop_on_nan defaults to true");
	tr_backend_t *be = tr_cpu_backend_create(devices, 1);
	struct ckpt_sink sink = {0};
	struct tr_trainer_options opt = {.spec = &spec,
					 .backend = be,
					 .devices = devices,
					 .train_reader = &br.base,
					 .hooks = {.checkpoint = keep_snapshot, .ctx = &sink}};
	tr_trainer_t *t = NULL;
	struct tr_error err;
	cr_assert_eq(tr_trainer_create(&opt, &t, &err), 0, "%s", err.message);
	int rc = tr_trainer_run(t, &err);
	cr_assert_eq(rc, -EDOM, "rc %d: %s", rc, err.message);
	cr_log_info("%s", err.message);
	cr_assert_not_null(strstr(err.message, "step 3:"), "%s", err.message);
	cr_assert_not_null(strstr(err.message, want), "%s", err.message);
	cr_assert_not_null(strstr(err.message, "0.weight"), "%s", err.message);
	struct tr_summary sum;
	tr_trainer_summary(t, &sum);
	cr_assert_eq(sum.steps, 2, "steps done: %lld", (long long)sum.steps);
	/* The checkpoints are the good steps only, with finite weights; and the
	 * update of the bad step was not applied on any replica. */
	cr_assert_eq(sink.n, 2, "%d checkpoints", sink.n);
	cr_assert(!sink.saw_final);
	for (int k = 0; k < sink.n; k++) {
		cr_assert_eq(sink.snaps[k]->step, k + 1);
		for (size_t i = 0; i < sink.snaps[k]->n_params; i++)
			cr_assert(isfinite(sink.snaps[k]->params[i]), "checkpoint %d weight %zu", k, i);
	}
	size_t np = tr_trainer_model(t)->n_params;
	float *w = malloc(np * sizeof(float));
	for (int r = 0; r < devices; r++) {
		cr_assert_eq(tr_trainer_copy_params(t, r, w), 0);
		for (size_t i = 0; i < np; i++)
			cr_assert(isfinite(w[i]), "replica %d weight %zu", r, i);
	}
	free(w);
	tr_trainer_destroy(t);
	for (int k = 0; k < sink.n; k++)
		tr_snapshot_free(sink.snaps[k]);
	tr_backend_destroy(be);
	tr_spec_finish(&spec);
}

Test(trainer, stop_on_nan_names_step_and_first_bad_gradient)
{
	nan_case(false, 1, "the gradient of 0.weight is not finite");
	nan_case(false, 3, "the gradient of 0.weight is not finite");
}

Test(trainer, stop_on_nan_names_a_nan_loss)
{
	nan_case(true, 2, "the loss is NaN");
}

Test(trainer, stop_on_nan_false_trains_through)
{
	struct blowup_reader br = {
		.base = {.i = &blowup_i, .info = {.samples = 40, .features = 3, .label_dim = 1}},
		.bad = 10,
		.nan_label = true,
	};
	snprintf(br.base.name, sizeof br.base.name, "blowup");
	char job[1024];
	snprintf(job, sizeof job, NAN_JOB_FMT, ", \"stop_on_nan\": false");
	struct run_result r;
	run_job(job, 1, 1, false, &br.base, &r);
	cr_assert_eq(r.rc, 0, "%s", r.err.message);
	cr_assert_eq(r.summary.steps, 10);
	cr_assert(isnan(r.loss[2]), "step 3's loss %g", r.loss[2]);
	free_result(&r);
}

/* ---- per-layer monitors ------------------------------------------------- */

struct named_points {
	char names[32][32];
	double values[32];
	int n;
};

static void collect_named(void *ctx, const struct tr_metric_point *p)
{
	struct named_points *np = ctx;
	if (p->step == 1 && np->n < 32 &&
	    (strncmp(p->name, "grad_norm", 9) == 0 || strncmp(p->name, "weight_norm", 11) == 0)) {
		snprintf(np->names[np->n], sizeof np->names[0], "%s", p->name);
		np->values[np->n++] = p->value;
	}
}

static double named(const struct named_points *np, const char *name)
{
	for (int i = 0; i < np->n; i++)
		if (strcmp(np->names[i], name) == 0)
			return np->values[i];
	cr_assert_fail("no point %s", name);
	return NAN;
}

static double slice_norm(const float *a, const float *b, float scale, size_t off, size_t len)
{
	double s = 0;
	for (size_t i = 0; i < len; i++) {
		double v = b ? ((double)a[off + i] - (double)b[off + i]) / scale : (double)a[off + i];
		s += v * v;
	}
	return s;
}

/* One plain SGD step (lr 0.5, no momentum or decay) gives the gradient
 * back as (before - after) / lr: each layer's grad_norm.<i> and
 * weight_norm.<i> are checked against that direct computation, on two
 * devices (the allreduced gradient), and the layers' squares add up to
 * the global grad_norm. */
Test(trainer, per_layer_norms_match_direct_computation)
{
	const char *job =
		"{\"seed\": 5, \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 12}, {\"type\": \"tanh\"},"
		" {\"type\": \"layernorm\"}, {\"type\": \"dense\", \"units\": 3, \"bias\": false}]},"
		" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 64, \"features\": 5, \"classes\": 3}},"
		" \"batch_size\": 32, \"max_steps\": 1, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.5},"
		" \"monitors\": [{\"metric\": \"grad_norm\", \"every_steps\": 1, \"per_layer\": true},"
		" {\"metric\": \"weight_norm\", \"every_steps\": 1, \"per_layer\": true}]}";
	struct tr_spec spec;
	parse(job, &spec);
	tr_backend_t *be = tr_cpu_backend_create(2, 1);
	struct named_points pts = {0};
	struct tr_trainer_options opt = {.spec = &spec,
					 .backend = be,
					 .devices = 2,
					 .hooks = {.metric = collect_named, .ctx = &pts}};
	tr_trainer_t *t = NULL;
	struct tr_error err;
	cr_assert_eq(tr_trainer_create(&opt, &t, &err), 0, "%s", err.message);
	const tr_model_t *m = tr_trainer_model(t);
	float *before = malloc(m->n_params * sizeof(float)), *after = malloc(m->n_params * sizeof(float));
	cr_assert_eq(tr_trainer_copy_params(t, 0, before), 0);
	cr_assert_eq(tr_trainer_run(t, &err), 0, "%s", err.message);
	cr_assert_eq(tr_trainer_copy_params(t, 0, after), 0);

	double total = 0;
	int layers_with_params = 0;
	for (int i = 0; i < m->n_layers; i++) {
		const struct tr_layer *l = &m->layers[i];
		char name[32];
		snprintf(name, sizeof name, "grad_norm.%d", i);
		if (!l->w_len && !l->b_len) {
			for (int k = 0; k < pts.n; k++)
				cr_assert_str_neq(pts.names[k], name, "a layer without parameters has a norm");
			continue;
		}
		layers_with_params++;
		double g = slice_norm(before, after, 0.5f, l->w_off, l->w_len) +
			   slice_norm(before, after, 0.5f, l->b_off, l->b_len);
		double w =
			slice_norm(after, NULL, 1, l->w_off, l->w_len) + slice_norm(after, NULL, 1, l->b_off, l->b_len);
		cr_assert_leq(rel(named(&pts, name), sqrt(g)), 1e-4, "%s: %g vs direct %g", name, named(&pts, name),
			      sqrt(g));
		snprintf(name, sizeof name, "weight_norm.%d", i);
		cr_assert_leq(rel(named(&pts, name), sqrt(w)), 1e-6, "%s: %g vs direct %g", name, named(&pts, name),
			      sqrt(w));
		total += g;
	}
	cr_assert_eq(layers_with_params, 3);
	cr_assert_leq(rel(named(&pts, "grad_norm"), sqrt(total)), 1e-4);
	free(before);
	free(after);
	tr_trainer_destroy(t);
	tr_backend_destroy(be);
	tr_spec_finish(&spec);
}

static void collect_ratio(void *ctx, const struct tr_metric_point *p)
{
	struct named_points *np = ctx;
	if (strncmp(p->name, "update_ratio", 12) == 0 && np->n < 32) {
		snprintf(np->names[np->n], sizeof np->names[0], "%s@%lld", p->name, (long long)p->step);
		np->values[np->n++] = p->value;
	}
}

/* update_ratio.<i> against ||after - before|| / ||before|| of layer i,
 * from the weights around step 3 (every_steps 3 of 4 steps, Adam, two
 * devices throughout). */
Test(trainer, update_ratio_matches_direct_computation)
{
	const char *job =
		"{\"seed\": 2, \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 10}, {\"type\": \"relu\"},"
		" {\"type\": \"layernorm\"}, {\"type\": \"dense\", \"units\": 3}]},"
		" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 64, \"features\": 4, \"classes\": 3}},"
		" \"batch_size\": 16, \"max_steps\": 4, \"optimizer\": {\"type\": \"adam\", \"lr\": 0.01},"
		" \"monitors\": [{\"metric\": \"update_ratio\", \"every_steps\": 3}]}";
	/* The weights before and after step 3: the same job stopped after
	 * steps 2 and 3 (runs are deterministic). */
	struct run_result r2, r3;
	char j2[1024];
	char j3[1024];
	snprintf(j2, sizeof j2, "%.*s2%s", (int)(strstr(job, "\"max_steps\": 4") - job + 13), job,
		 strstr(job, "\"max_steps\": 4") + 14);
	snprintf(j3, sizeof j3, "%.*s3%s", (int)(strstr(job, "\"max_steps\": 4") - job + 13), job,
		 strstr(job, "\"max_steps\": 4") + 14);
	run_job(j2, 2, 1, false, NULL, &r2);
	run_job(j3, 2, 1, false, NULL, &r3);
	cr_assert_eq(r2.rc, 0, "%s", r2.err.message);
	cr_assert_eq(r3.rc, 0, "%s", r3.err.message);

	struct tr_spec spec;
	parse(job, &spec);
	tr_backend_t *be = tr_cpu_backend_create(2, 1);
	struct named_points pts = {0};
	struct tr_trainer_options opt = {.spec = &spec,
					 .backend = be,
					 .devices = 2,
					 .hooks = {.metric = collect_ratio, .ctx = &pts}};
	tr_trainer_t *t = NULL;
	struct tr_error err;
	cr_assert_eq(tr_trainer_create(&opt, &t, &err), 0, "%s", err.message);
	cr_assert_eq(tr_trainer_run(t, &err), 0, "%s", err.message);
	const tr_model_t *m = tr_trainer_model(t);
	int checked = 0;
	for (int i = 0; i < m->n_layers; i++) {
		const struct tr_layer *l = &m->layers[i];
		char name[48];
		snprintf(name, sizeof name, "update_ratio.%d@3", i);
		if (!l->w_len && !l->b_len)
			continue;
		double du = 0, w = 0;
		size_t offs[2] = {l->w_off, l->b_off}, lens[2] = {l->w_len, l->b_len};
		for (int k = 0; k < 2; k++)
			for (size_t j = offs[k]; j < offs[k] + lens[k]; j++) {
				double d = (double)r3.params[j] - r2.params[j];
				du += d * d;
				w += (double)r2.params[j] * r2.params[j];
			}
		double want = sqrt(du) / sqrt(w);
		cr_assert_leq(rel(named(&pts, name), want), 1e-5, "%s: %g vs direct %g", name, named(&pts, name), want);
		checked++;
	}
	cr_assert_eq(checked, 3);
	cr_assert_eq(pts.n, 3, "points only at step 3: %d", pts.n);
	tr_trainer_destroy(t);
	tr_backend_destroy(be);
	tr_spec_finish(&spec);
	free_result(&r2);
	free_result(&r3);
}

/* ---- early_stopping --------------------------------------------------------- */

/* 40 samples, batch 4, shuffle off: 10 steps an epoch, evaluations after
 * steps 10, 20, ...  The learning rate is far below what changes a float
 * weight, so every epoch's mean loss is the same: the first evaluation is
 * the best and each later one misses. */
static const char *ES_FLAT_JOB =
	"{\"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 2}]},"
	" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 40, \"features\": 3, \"classes\": 2},"
	" \"shuffle\": false}, \"batch_size\": 4, \"epochs\": 10, \"optimizer\": {\"type\": \"sgd\", \"lr\": 1e-30},"
	" \"early_stopping\": %s}";

struct es_run {
	struct tr_summary sum;
	struct ckpt_sink sink;
	int rc;
	struct tr_error err;
	char log[4096];
};

static void es_log(void *ctx, enum tr_log_level level, const char *msg)
{
	struct es_run *r = ctx;
	(void)level;
	size_t n = strlen(r->log);
	snprintf(r->log + n, sizeof r->log - n, "%s\n", msg);
}

static int es_checkpoint(void *ctx, struct tr_snapshot *snap, bool final)
{
	struct es_run *r = ctx;
	return keep_snapshot(&r->sink, snap, final);
}

static void es_run_job(const char *text, struct es_run *r)
{
	struct tr_spec spec;
	parse(text, &spec);
	memset(r, 0, sizeof *r);
	tr_backend_t *be = tr_cpu_backend_create(1, 1);
	struct tr_trainer_options opt = {.spec = &spec,
					 .backend = be,
					 .devices = 1,
					 .hooks = {.checkpoint = es_checkpoint, .log = es_log, .ctx = r}};
	tr_trainer_t *t = NULL;
	cr_assert_eq(tr_trainer_create(&opt, &t, &r->err), 0, "%s", r->err.message);
	r->rc = tr_trainer_run(t, &r->err);
	tr_trainer_summary(t, &r->sum);
	tr_trainer_destroy(t);
	tr_backend_destroy(be);
	tr_spec_finish(&spec);
}

static void es_free(struct es_run *r)
{
	for (int k = 0; k < r->sink.n; k++)
		tr_snapshot_free(r->sink.snaps[k]);
}

static const char *snap_reason(const struct tr_snapshot *s)
{
	return json_string_value(json_object_get(s->meta, "reason"));
}

Test(trainer, early_stopping_counts_patience_in_evaluations)
{
	char job[1024];
	struct es_run r;
	snprintf(job, sizeof job, ES_FLAT_JOB, "{\"metric\": \"loss\", \"patience\": 2}");
	es_run_job(job, &r);
	cr_assert_eq(r.rc, 0, "%s", r.err.message);
	cr_assert(r.sum.early_stopped);
	cr_assert(!r.sum.stopped, "early stopping completes the run; it is not a stop request");
	/* Best at the first evaluation (step 10); misses at 20 and 30: stop. */
	cr_assert_eq(r.sum.steps, 30, "steps %lld", (long long)r.sum.steps);
	cr_assert_eq(r.sum.best_step, 10);
	cr_assert(isfinite(r.sum.best_value));
	/* The best checkpoint (even with no periodic ones), then the final. */
	cr_assert_eq(r.sink.n, 2, "%d checkpoints", r.sink.n);
	cr_assert_eq(r.sink.snaps[0]->step, 10);
	cr_assert_str_eq(snap_reason(r.sink.snaps[0]), "best");
	cr_assert_eq(r.sink.snaps[1]->step, 30);
	cr_assert_str_eq(snap_reason(r.sink.snaps[1]), "early_stopping");
	cr_assert_not_null(strstr(r.log, "early stopping after step 30: loss has not improved"), "%s", r.log);
	cr_assert_not_null(strstr(r.log, "at step 10"), "%s", r.log);
	es_free(&r);

	/* patience 4: two more epochs. */
	snprintf(job, sizeof job, ES_FLAT_JOB, "{\"metric\": \"loss\", \"patience\": 4}");
	es_run_job(job, &r);
	cr_assert_eq(r.rc, 0, "%s", r.err.message);
	cr_assert(r.sum.early_stopped);
	cr_assert_eq(r.sum.steps, 50);
	es_free(&r);
}

/* A learning job: loss falls every epoch, so in mode min nothing stops it;
 * in mode max, or with a min_delta larger than any gain, every evaluation
 * after the first misses. */
static const char *ES_LEARN_JOB =
	"{\"seed\": 5, \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 8}, {\"type\": \"relu\"},"
	" {\"type\": \"dense\", \"units\": 3}]},"
	" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 120, \"features\": 4, \"classes\": 3,"
	" \"noise\": 0.1}, \"validation_split\": 0.25, \"shuffle\": false}, \"batch_size\": 10, \"epochs\": 6,"
	" \"optimizer\": {\"type\": \"adam\", \"lr\": 0.01}, \"early_stopping\": %s}";

Test(trainer, early_stopping_mode_and_min_delta)
{
	char job[1024];
	struct es_run r;

	snprintf(job, sizeof job, ES_LEARN_JOB, "{\"metric\": \"val_loss\", \"patience\": 1}");
	es_run_job(job, &r);
	cr_assert_eq(r.rc, 0, "%s", r.err.message);
	cr_assert(!r.sum.early_stopped, "val_loss fell every epoch: %s", r.log);
	cr_assert_eq(r.sum.steps, 54, "9 steps x 6 epochs");
	cr_assert_eq(r.sum.best_step, 54);
	cr_assert_eq(r.sum.best_value, r.sum.val_loss, "the last val_loss is the best");
	int best = 0;
	for (int k = 0; k < r.sink.n; k++)
		best += strcmp(snap_reason(r.sink.snaps[k]), "best") == 0;
	cr_assert_eq(best, 6, "a best checkpoint per improving evaluation: %d", best);
	es_free(&r);

	snprintf(job, sizeof job, ES_LEARN_JOB, "{\"metric\": \"val_loss\", \"mode\": \"max\", \"patience\": 2}");
	es_run_job(job, &r);
	cr_assert_eq(r.rc, 0, "%s", r.err.message);
	cr_assert(r.sum.early_stopped);
	cr_assert_eq(r.sum.steps, 27);
	cr_assert_eq(r.sum.best_step, 9);
	es_free(&r);

	snprintf(job, sizeof job, ES_LEARN_JOB, "{\"metric\": \"loss\", \"min_delta\": 1000, \"patience\": 3}");
	es_run_job(job, &r);
	cr_assert_eq(r.rc, 0, "%s", r.err.message);
	cr_assert(r.sum.early_stopped);
	cr_assert_eq(r.sum.steps, 36);
	cr_assert_eq(r.sum.best_step, 9);
	es_free(&r);
}

/* ---- activation_stats ------------------------------------------------------- */

struct act_points {
	char names[64][48];
	double values[64];
	int n;
};

static void act_collect(void *ctx, const struct tr_metric_point *p)
{
	struct act_points *a = ctx;
	if (p->step == 1 && strncmp(p->name, "activation_stats.", 17) == 0 && a->n < 64) {
		snprintf(a->names[a->n], sizeof a->names[0], "%s", p->name);
		a->values[a->n++] = p->value;
	}
}

static double act_get(const struct act_points *a, const char *name)
{
	for (int i = 0; i < a->n; i++)
		if (strcmp(a->names[i], name) == 0)
			return a->values[i];
	cr_assert_fail("no point %s", name);
	return NAN;
}

static const char *ACT_JOB =
	"{\"seed\": 9, \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 4}, {\"type\": \"relu\"},"
	" {\"type\": \"dense\", \"units\": 1}], \"loss\": \"mse\"},"
	" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 40, \"features\": 3, \"classes\": 2},"
	" \"shuffle\": false}, \"batch_size\": 4, \"max_steps\": 2, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1},"
	" \"monitors\": [{\"metric\": \"activation_stats\", \"every_steps\": 1}]}";

/* Runs ACT_JOB on `devices` and returns step 1's points and the initial
 * weights (what step 1's forward pass used). */
static void act_run(int devices, struct act_points *pts, float **w0, const tr_model_t **model_out, tr_model_t *copy)
{
	struct blowup_reader br = {
		.base = {.i = &blowup_i, .info = {.samples = 40, .features = 3, .label_dim = 1}},
		.bad = -1,
	};
	snprintf(br.base.name, sizeof br.base.name, "plain");
	struct tr_spec spec;
	parse(ACT_JOB, &spec);
	tr_backend_t *be = tr_cpu_backend_create(devices, 1);
	memset(pts, 0, sizeof *pts);
	struct tr_trainer_options opt = {.spec = &spec,
					 .backend = be,
					 .devices = devices,
					 .train_reader = &br.base,
					 .hooks = {.metric = act_collect, .ctx = pts}};
	tr_trainer_t *t = NULL;
	struct tr_error err;
	cr_assert_eq(tr_trainer_create(&opt, &t, &err), 0, "%s", err.message);
	size_t np = tr_trainer_model(t)->n_params;
	*w0 = malloc(np * sizeof(float));
	cr_assert_eq(tr_trainer_copy_params(t, 0, *w0), 0);
	*copy = *tr_trainer_model(t);
	*model_out = copy;
	cr_assert_eq(tr_trainer_run(t, &err), 0, "%s", err.message);
	tr_trainer_destroy(t);
	tr_backend_destroy(be);
	tr_spec_finish(&spec);
}

Test(trainer, activation_stats_match_direct_computation)
{
	struct act_points pts;
	float *w;
	const tr_model_t *m;
	tr_model_t mcopy;
	act_run(1, &pts, &w, &m, &mcopy);
	cr_assert_eq(pts.n, 9, "mean, std, zeros for 3 layers: %d", pts.n);

	/* Step 1: samples 0..3 (shuffle off), x as the reader makes them. */
	double out[3][4][4]; /* layer, row, unit */
	int width[3] = {4, 4, 1};
	for (int r = 0; r < 4; r++) {
		double x[3];
		for (int j = 0; j < 3; j++)
			x[j] = (double)((r * 7 + j) % 5) - 2.0;
		const struct tr_layer *l0 = &m->layers[0], *l2 = &m->layers[2];
		for (int u = 0; u < 4; u++) {
			double y = w[l0->b_off + u];
			for (int j = 0; j < 3; j++)
				y += (double)w[l0->w_off + (size_t)u * 3 + j] * x[j];
			out[0][r][u] = y;
			out[1][r][u] = y > 0 ? y : 0;
		}
		double y = w[l2->b_off];
		for (int u = 0; u < 4; u++)
			y += (double)w[l2->w_off + u] * out[1][r][u];
		out[2][r][0] = y;
	}
	for (int i = 0; i < 3; i++) {
		double sum = 0, n = 0, zeros = 0;
		for (int r = 0; r < 4; r++)
			for (int u = 0; u < width[i]; u++) {
				sum += out[i][r][u];
				zeros += out[i][r][u] == 0.0;
				n++;
			}
		double mean = sum / n, var = 0;
		for (int r = 0; r < 4; r++)
			for (int u = 0; u < width[i]; u++)
				var += (out[i][r][u] - mean) * (out[i][r][u] - mean);
		double sd = sqrt(var / n);
		char name[64];
		snprintf(name, sizeof name, "activation_stats.%d.mean", i);
		cr_expect_leq(fabs(act_get(&pts, name) - mean), 1e-5 * fmax(1, fabs(mean)), "%s: %.9g vs %.9g", name,
			      act_get(&pts, name), mean);
		snprintf(name, sizeof name, "activation_stats.%d.std", i);
		cr_expect_leq(fabs(act_get(&pts, name) - sd), 1e-5 * fmax(1, sd), "%s: %.9g vs %.9g", name,
			      act_get(&pts, name), sd);
		snprintf(name, sizeof name, "activation_stats.%d.zeros", i);
		cr_expect_eq(act_get(&pts, name), zeros / n, "%s: %.9g vs %.9g", name, act_get(&pts, name), zeros / n);
	}
	cr_expect_gt(act_get(&pts, "activation_stats.1.zeros"), 0, "the relu zeroes some outputs here");

	/* The whole step, whatever the device count (3 devices: shares 2,1,1). */
	struct act_points many;
	float *w3;
	tr_model_t mcopy3;
	act_run(3, &many, &w3, &m, &mcopy3);
	cr_assert_eq(many.n, pts.n);
	for (int i = 0; i < pts.n; i++)
		cr_expect_leq(fabs(act_get(&many, pts.names[i]) - pts.values[i]), 1e-5 * fmax(1, fabs(pts.values[i])),
			      "%s: 3 devices %.9g, 1 device %.9g", pts.names[i], act_get(&many, pts.names[i]),
			      pts.values[i]);
	free(w);
	free(w3);
}

/* ---- lr, samples_per_sec, data_wait_ms as monitors ---------------------------- */

struct sched_points {
	int n_lr, n_sps, n_wait;
	int lr_count[16], sps_count[16], wait_count[16];
	double lr[16], sps[16], step_ms[16], wait[16];
};

static void sched_collect(void *ctx, const struct tr_metric_point *p)
{
	struct sched_points *a = ctx;
	if (p->step < 1 || p->step >= 16)
		return;
	if (strcmp(p->name, "lr") == 0) {
		a->lr[p->step] = p->value;
		a->lr_count[p->step]++;
	} else if (strcmp(p->name, "samples_per_sec") == 0) {
		a->sps[p->step] = p->value;
		a->sps_count[p->step]++;
	} else if (strcmp(p->name, "step_ms") == 0) {
		a->step_ms[p->step] = p->value;
	} else if (strcmp(p->name, "data_wait_ms") == 0) {
		a->wait[p->step] = p->value;
		a->wait_count[p->step]++;
	}
}

/* log_every_steps 3 records them at 3, 6, 9 and the last step (10); the
 * monitors add every second step, and a step that has both gets one point. */
Test(trainer, lr_throughput_and_wait_monitors_between_log_steps)
{
	static const char *job =
		"{\"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 2}]},"
		" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 40, \"features\": 3, \"classes\": 2},"
		" \"shuffle\": false}, \"batch_size\": 4, \"max_steps\": 10, \"log_every_steps\": 3,"
		" \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1},"
		" \"schedule\": {\"type\": \"step\", \"step_size\": 3, \"gamma\": 0.5},"
		" \"monitors\": [{\"metric\": \"lr\", \"every_steps\": 2}, {\"metric\": \"samples_per_sec\","
		" \"every_steps\": 2}, {\"metric\": \"data_wait_ms\", \"every_steps\": 2}]}";
	struct tr_spec spec;
	parse(job, &spec);
	tr_backend_t *be = tr_cpu_backend_create(1, 1);
	struct sched_points pts = {0};
	struct tr_trainer_options opt = {.spec = &spec,
					 .backend = be,
					 .devices = 1,
					 .hooks = {.metric = sched_collect, .ctx = &pts}};
	tr_trainer_t *t = NULL;
	struct tr_error err;
	cr_assert_eq(tr_trainer_create(&opt, &t, &err), 0, "%s", err.message);
	cr_assert_eq(tr_trainer_run(t, &err), 0, "%s", err.message);
	tr_trainer_destroy(t);
	tr_backend_destroy(be);
	tr_spec_finish(&spec);
	for (int s = 1; s <= 10; s++) {
		bool logged = s % 3 == 0 || s == 10, due = logged || s % 2 == 0;
		cr_expect_eq(pts.lr_count[s], due ? 1 : 0, "lr points at step %d: %d", s, pts.lr_count[s]);
		cr_expect_eq(pts.sps_count[s], due ? 1 : 0, "samples_per_sec points at step %d", s);
		cr_expect_eq(pts.wait_count[s], due ? 1 : 0, "data_wait_ms points at step %d", s);
		if (!due)
			continue;
		/* StepLR: the update of 0-based step k uses 0.1 * 0.5^floor(k / 3). */
		double want = 0.1 * pow(0.5, (double)((s - 1) / 3));
		cr_expect_leq(fabs(pts.lr[s] - want), 1e-7, "lr at step %d: %.9g, want %.9g", s, pts.lr[s], want);
		cr_expect(isfinite(pts.wait[s]) && pts.wait[s] >= 0, "data_wait_ms at step %d: %g", s, pts.wait[s]);
		cr_expect(isfinite(pts.sps[s]) && pts.sps[s] > 0, "samples_per_sec at step %d: %g", s, pts.sps[s]);
		if (logged) /* 4 samples a step over that step's time */
			cr_expect_leq(fabs(pts.sps[s] * pts.step_ms[s] / 1e3 - 4.0), 1e-6, "step %d: %g x %g ms", s,
				      pts.sps[s], pts.step_ms[s]);
	}
}
