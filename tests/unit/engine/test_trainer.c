/* The trainer's promises: results independent of the device count and the
 * loader thread count, idle devices contribute exact zeros, loader errors
 * name file and sample, and cancel/stop end every thread promptly. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
	char err[1024];
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
	struct tr_spec_error e;
	int rc = tr_spec_parse_text(text, spec, &e);
	cr_assert_eq(rc, 0, "spec: %s", e.message);
}

/* Runs `text` on `devices` CPU devices with `workers` loaders. */
static void run_job(const char *text, int devices, int workers, bool poison, tr_reader_t *reader,
		    struct run_result *out)
{
	memset(out, 0, sizeof *out);
	struct tr_spec spec;
	parse(text, &spec);
	tr_backend_t *be = tr_cpu_backend_create(devices, 1);
	cr_assert_not_null(be);
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
	out->rc = tr_trainer_create(&opt, &t, out->err, sizeof out->err);
	if (out->rc == 0) {
		out->rc = tr_trainer_run(t, out->err, sizeof out->err);
		tr_trainer_summary(t, &out->summary);
		out->nparams = tr_trainer_model(t)->n_params;
		out->params = malloc(out->nparams * sizeof(float));
		cr_assert_eq(tr_trainer_copy_params(t, 0, out->params), 0);
		/* Every replica must hold the same weights after identical updates. */
		float *other = malloc(out->nparams * sizeof(float));
		for (int r = 1; r < tr_trainer_device_count(t); r++) {
			cr_assert_eq(tr_trainer_copy_params(t, r, other), 0);
			cr_assert_eq(memcmp(other, out->params, out->nparams * sizeof(float)), 0,
				     "replica %d differs from replica 0", r);
		}
		free(other);
	}
	tr_trainer_destroy(t);
	tr_backend_destroy(be);
	tr_spec_finish(&spec);
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
	cr_assert_eq(a->rc, 0, "%s: %s", what, a->err);
	cr_assert_eq(b->rc, 0, "%s: %s", what, b->err);
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
	cr_assert_eq(one.rc, 0, "%s", one.err);
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
	cr_assert_eq(base.rc, 0, "%s", base.err);
	int counts[] = {2, 7};
	for (int i = 0; i < 2; i++) {
		run_job(job, 2, counts[i], false, NULL, &other);
		cr_assert_eq(other.rc, 0, "%s", other.err);
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
		cr_assert_eq(r.rc, 0, "%s: %s", cases[i].policy, r.err);
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

static int failing_get(tr_reader_t *r, int64_t index, float *x, float *y, char *err, size_t errlen)
{
	struct failing_reader *f = (struct failing_reader *)r;
	if (index == f->bad) {
		snprintf(err, errlen, "%s: sample %lld: unreadable", r->name, (long long)index);
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
	cr_assert_not_null(strstr(r.err, "broken.bin"), "error: %s", r.err);
	cr_assert_not_null(strstr(r.err, "sample 41"), "error: %s", r.err);
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
	cr_assert_not_null(strstr(r.err, "data.csv"), "error: %s", r.err);
	cr_assert_not_null(strstr(r.err, "23"), "error: %s", r.err);
	unlink(path);
	rmdir(dir);
}

/* ---- cancel and stop ---------------------------------------------------- */

struct bg_run {
	tr_trainer_t *t;
	int rc;
	char err[512];
};

static void *bg_main(void *arg)
{
	struct bg_run *b = arg;
	b->rc = tr_trainer_run(b->t, b->err, sizeof b->err);
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
	char err[512];
	struct bg_run b = {0};
	cr_assert_eq(tr_trainer_create(&opt, &b.t, err, sizeof err), 0, "%s", err);
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
		cr_assert_eq(b.rc, 0, "%s", b.err);
	else
		cr_assert_eq(b.rc, -ECANCELED, "rc %d: %s", b.rc, b.err);
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
	cr_assert_eq(r.rc, 0, "%s", r.err);
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
	cr_assert_not_null(strstr(r.err, "/model/inputs"), "%s", r.err);
	cr_assert_not_null(strstr(r.err, "other.npy"), "%s", r.err);
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
	char err[256];
	cr_assert_eq(tr_checkpoint_layout(m, opt, s, &l, err, sizeof err), 0, "%s", err);
	uint8_t *img = malloc(l.total_bytes), *p = img;
	memcpy(p, l.header, l.header_len);
	p += l.header_len;
	for (int k = 0; k < l.nseg; k++) {
		memcpy(p, l.seg[k], l.seg_len[k]);
		p += l.seg_len[k];
	}
	struct tr_snapshot *back;
	cr_assert_eq(tr_checkpoint_parse(img, l.total_bytes, m, opt, false, &back, err, sizeof err), 0, "%s", err);
	/* The weights-only file is its own header plus the params prefix. */
	size_t mlen = l.model_header_len + l.params_bytes;
	uint8_t *model = malloc(mlen);
	memcpy(model, l.model_header, l.model_header_len);
	memcpy(model + l.model_header_len, img + l.header_len, l.params_bytes);
	tr_st_file_t *f;
	cr_assert_eq(tr_st_open_mem(model, mlen, "model", &f, err, sizeof err), 0, "%s", err);
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
	char err[512];
	tr_backend_t *be = tr_cpu_backend_create(devices, 1);

	/* Uninterrupted run, checkpointing every 7 steps. */
	struct ckpt_sink sink = {0};
	struct tr_trainer_options opt = {.spec = &spec, .backend = be, .devices = devices,
					 .hooks = {.checkpoint = keep_snapshot, .ctx = &sink}};
	tr_trainer_t *t;
	cr_assert_eq(tr_trainer_create(&opt, &t, err, sizeof err), 0, "%s", err);
	cr_assert_eq(tr_trainer_run(t, err, sizeof err), 0, "%s", err);
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
		cr_assert_eq(tr_trainer_create(&opt, &t, err, sizeof err), 0, "%s", err);
		cr_assert_eq(tr_trainer_restore(t, snap, false, err, sizeof err), 0, "%s", err);
		cr_assert_eq(tr_trainer_run(t, err, sizeof err), 0, "%s", err);
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

Test(trainer, exact_resume_sgd_momentum)
{
	char job[2048];
	snprintf(job, sizeof job, "%.*s, \"checkpoint\": {\"every_steps\": 5}}", (int)strlen(SGD_JOB) - 1, SGD_JOB);
	exact_resume(job, 2);
}
