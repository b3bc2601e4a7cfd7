/* Training on image data through the whole trainer: "images" and
 * "patches" jobs give bit-identical results for 1 and 4 loader threads
 * and the same results (to rounding) on 1 and 3 devices; a gzip IDX file
 * trains a flat-input model (the reader's [1, H, W] shape does not get in
 * its way); and an image truncated under a running job fails it with the
 * file named.  The PNG files are written here with libpng.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "engine/backend.h"
#include "engine/spec.h"
#include "engine/trainer.h"
#include "tests/unit/engine/fixtures.h"

#define MAX_STEPS 1024

TestSuite(trainer_images, .init = fixture_setup, .fini = fixture_teardown, .timeout = 300);

/* An 8-bit w x h PNG of `channels`, pixel values from a small hash of
 * (seed, y, x, c) with a class-dependent brightness so classes are
 * learnable. */
static void write_noise_png(const char *name, int w, int h, int channels, int seed, int bright)
{
	unsigned char *px = malloc((size_t)w * h * channels);

	cr_assert_not_null(px);
	for (int y = 0; y < h; y++) {
		for (int x = 0; x < w * channels; x++) {
			unsigned v = (unsigned)(seed * 2654435761u) ^ (unsigned)(y * 40503 + x * 9973);

			px[(size_t)y * w * channels + x] = (unsigned char)((v >> 7) % 128 + (bright ? 100 : 20));
		}
	}
	write_png(name, w, h, channels, px);
	free(px);
}

struct run_result {
	double loss[MAX_STEPS];
	int64_t nloss;
	float *params;
	size_t nparams;
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

static void run_job(const char *text, int devices, int workers, struct run_result *out)
{
	struct tr_spec spec;
	struct tr_error e;
	tr_backend_t *be = tr_cpu_backend_create(devices, 1);
	tr_trainer_t *t = NULL;

	memset(out, 0, sizeof *out);
	cr_assert_not_null(be);
	cr_assert_eq(tr_spec_parse_text(text, &spec, &e), 0, "spec: %s", e.message);
	struct tr_trainer_options opt = {
		.spec = &spec,
		.backend = be,
		.devices = devices,
		.workers = workers,
		.hooks = {.metric = collect, .ctx = out},
	};
	out->rc = tr_trainer_create(&opt, &t, &out->err);
	if (out->rc == 0) {
		out->rc = tr_trainer_run(t, &out->err);
		out->nparams = tr_trainer_model(t)->n_params;
		out->params = malloc(out->nparams * sizeof(float));
		cr_assert_eq(tr_trainer_copy_params(t, 0, out->params), 0);
	}
	tr_trainer_destroy(t);
	tr_spec_finish(&spec);
	tr_backend_destroy(be);
}

static void assert_identical(const struct run_result *a, const struct run_result *b, const char *what)
{
	cr_assert_eq(a->rc, 0, "%s: %s", what, a->err.message);
	cr_assert_eq(b->rc, 0, "%s: %s", what, b->err.message);
	cr_assert_gt(a->nloss, 0);
	cr_assert_eq(a->nloss, b->nloss);
	cr_assert_eq(memcmp(a->loss, b->loss, (size_t)a->nloss * sizeof(double)), 0, "%s: loss curves differ", what);
	cr_assert_eq(a->nparams, b->nparams);
	cr_assert_eq(memcmp(a->params, b->params, a->nparams * sizeof(float)), 0, "%s: weights differ", what);
}

static void assert_close(const struct run_result *a, const struct run_result *b, double tol, const char *what)
{
	cr_assert_eq(a->rc, 0, "%s: %s", what, a->err.message);
	cr_assert_eq(b->rc, 0, "%s: %s", what, b->err.message);
	cr_assert_eq(a->nloss, b->nloss);
	for (int64_t s = 0; s < a->nloss; s++)
		cr_assert_leq(fabs(a->loss[s] - b->loss[s]), tol * fmax(1.0, fabs(a->loss[s])),
			      "%s: step %lld loss %.9g vs %.9g", what, (long long)s + 1, a->loss[s], b->loss[s]);
	for (size_t i = 0; i < a->nparams; i++)
		cr_assert_leq(fabs(a->params[i] - b->params[i]), tol * fmax(1.0, fabs(a->params[i])),
			      "%s: weight %zu: %.9g vs %.9g", what, i, a->params[i], b->params[i]);
}

/* The same job on 1 and 4 loaders (identical) and 1 and 3 devices (close). */
static void loaders_and_devices(const char *job)
{
	struct run_result *one = malloc(sizeof *one), *four = malloc(sizeof *four), *dev3 = malloc(sizeof *dev3);

	run_job(job, 1, 1, one);
	cr_assert_eq(one->rc, 0, "%s", one->err.message);
	run_job(job, 1, 4, four);
	assert_identical(one, four, "1 vs 4 loader threads");
	run_job(job, 3, 2, dev3);
	assert_close(one, dev3, 1e-4, "1 vs 3 devices");
	cr_assert(one->loss[one->nloss - 1] < one->loss[0], "the loss does not fall: %g -> %g", one->loss[0],
		  one->loss[one->nloss - 1]);
	free(one->params);
	free(four->params);
	free(dev3->params);
	free(one);
	free(four);
	free(dev3);
}

/* 37 images of 3x7x6 in two classes, resized to 8x8 and cropped to 6x6;
 * batches of 8 leave a last step of 5 (idle devices on 3). */
Test(trainer_images, images_job_is_loader_and_device_count_invariant)
{
	char job[2048];
	char name[64];

	mkdir_in("set");
	mkdir_in("set/dark");
	mkdir_in("set/light");
	for (int i = 0; i < 37; i++) {
		snprintf(name, sizeof name, "set/%s/%03d.png", i % 2 ? "light" : "dark", i);
		write_noise_png(name, 6, 7, 3, i, i % 2);
	}
	snprintf(
		job, sizeof job,
		"{\"seed\": 3, \"model\": {\"inputs\": 108, \"layers\": [{\"type\": \"dense\", \"units\": 16},"
		" {\"type\": \"relu\"}, {\"type\": \"dense\", \"units\": 2}]},"
		" \"data\": {\"train\": {\"format\": \"images\", \"path\": \"%s\", \"resize\": 8, \"center_crop\": 6},"
		" \"transforms\": [{\"type\": \"normalize\", \"mean\": [120, 120, 120], \"std\": [60, 60, 60]},"
		" {\"type\": \"random_crop\", \"padding\": 1}, {\"type\": \"flip\"}, {\"type\": \"rot90\"}]},"
		" \"batch_size\": 8, \"epochs\": 4, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.05, \"momentum\": 0.9}}",
		tmp_path("set"));
	loaders_and_devices(job);
}

/* Residual patches of three grey images, with flips and rotations that
 * move input and response together. */
Test(trainer_images, patches_job_is_loader_and_device_count_invariant)
{
	char job[2048];

	mkdir_in("pics");
	write_noise_png("pics/a.png", 30, 24, 1, 1, 0);
	write_noise_png("pics/b.png", 25, 25, 1, 2, 1);
	write_noise_png("pics/c.png", 40, 16, 1, 3, 0);
	snprintf(job, sizeof job,
		 "{\"seed\": 4, \"model\": {\"inputs\": 36, \"layers\": [{\"type\": \"dense\", \"units\": 36}],"
		 " \"loss\": \"mse\"},"
		 " \"data\": {\"train\": {\"format\": \"patches\", \"path\": \"%s\", \"patch_size\": 6,"
		 " \"patches_per_image\": 13, \"response\": \"residual\"},"
		 " \"transforms\": [{\"type\": \"flip\", \"vertical\": true}, {\"type\": \"rot90\"}]},"
		 " \"batch_size\": 8, \"epochs\": 3, \"optimizer\": {\"type\": \"adam\", \"lr\": 0.01}}",
		 tmp_path("pics"));
	loaders_and_devices(job);
}

/* A gzip IDX file gives [1, 5, 4] images; a model with flat inputs (20)
 * takes them as before, and a wrong count is refused naming the field. */
Test(trainer_images, gzip_idx_trains_a_flat_model)
{
	unsigned char img[16 + 60 * 20], lab[8 + 60];
	char job[2048];
	struct run_result *r = malloc(sizeof *r);
	gzFile g;

	memcpy(img, "\0\0\x08\x03\0\0\0\x3c\0\0\0\x05\0\0\0\x04", 16);
	memcpy(lab, "\0\0\x08\x01\0\0\0\x3c", 8);
	for (int i = 0; i < 60; i++) {
		lab[8 + i] = (unsigned char)(i % 3);
		for (int j = 0; j < 20; j++)
			img[16 + i * 20 + j] = (unsigned char)(j == i % 3 ? 200 : (i * 31 + j * 7) % 50);
	}
	g = gzopen(tmp_path("img.gz"), "wb");
	gzwrite(g, img, sizeof img);
	gzclose(g);
	g = gzopen(tmp_path("lab.gz"), "wb");
	gzwrite(g, lab, sizeof lab);
	gzclose(g);
	for (int inputs = 20; inputs <= 21; inputs++) {
		snprintf(job, sizeof job,
			 "{\"seed\": 1, \"model\": {\"inputs\": %d, \"layers\": [{\"type\": \"dense\", \"units\": 3}]},"
			 " \"data\": {\"train\": {\"format\": \"idx\", \"images\": \"%s\", \"labels\": \"%s\"},"
			 " \"transforms\": [{\"type\": \"scale\", \"factor\": 0.00392156863}]},"
			 " \"batch_size\": 10, \"epochs\": 5, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.5}}",
			 inputs, tmp_path("img.gz"), tmp_path("lab.gz"));
		run_job(job, 1, 2, r);
		if (inputs == 20) {
			cr_assert_eq(r->rc, 0, "%s", r->err.message);
			cr_assert_lt(r->loss[r->nloss - 1], r->loss[0]);
		} else {
			cr_assert_lt(r->rc, 0);
			cr_assert_not_null(strstr(r->err.message, "/model/inputs"), "%s", r->err.message);
		}
		free(r->params);
	}
	free(r);
}

/* A PNG truncated after the job opened the folder: the loader's decode
 * fails, and the job with it, naming the file. */
Test(trainer_images, truncated_image_fails_the_job_naming_it)
{
	char job[2048];
	char name[64];
	struct run_result *r = malloc(sizeof *r);
	struct stat st;

	mkdir_in("set");
	mkdir_in("set/a");
	mkdir_in("set/b");
	for (int i = 0; i < 12; i++) {
		snprintf(name, sizeof name, "set/%c/%02d.png", i % 2 ? 'a' : 'b', i);
		write_noise_png(name, 5, 5, 1, i, i % 2);
	}
	/* The header is whole (so open accepts it), the pixels are cut. */
	cr_assert_eq(stat(tmp_path("set/b/04.png"), &st), 0);
	cr_assert_eq(truncate(tmp_path("set/b/04.png"), st.st_size - 20), 0);
	snprintf(job, sizeof job,
		 "{\"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 2}]},"
		 " \"data\": {\"train\": {\"format\": \"images\", \"path\": \"%s\"}},"
		 " \"batch_size\": 4, \"epochs\": 2, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}",
		 tmp_path("set"));
	run_job(job, 2, 2, r);
	cr_assert_lt(r->rc, 0, "the job should fail");
	cr_assert_not_null(strstr(r->err.message, "set/b/04.png"), "error does not name the file: %s", r->err.message);
	free(r->params);
	free(r);
}

/* A conv model without model.inputs takes the images' [C, H, W] from the
 * data (after resize and center_crop), records it in the model file's
 * description, and a model.inputs that differs from the images' shape
 * fails the job naming /model/inputs and both shapes. */
Test(trainer_images, conv_model_takes_its_input_shape_from_the_data)
{
	char job[2048], name[64];
	struct run_result *r = malloc(sizeof *r);
	static const char *const inputs[] = {"", "\"inputs\": [3, 6, 6], ", "\"inputs\": [1, 6, 6], ",
					     "\"inputs\": [3, 4, 9], "};

	mkdir_in("set");
	mkdir_in("set/dark");
	mkdir_in("set/light");
	for (int i = 0; i < 16; i++) {
		snprintf(name, sizeof name, "set/%s/%03d.png", i % 2 ? "light" : "dark", i);
		write_noise_png(name, 9, 7, 3, i, i % 2);
	}
	for (int k = 0; k < 4; k++) {
		snprintf(
			job, sizeof job,
			"{\"seed\": 3, \"model\": {%s\"layers\": [{\"type\": \"conv2d\", \"filters\": 4, \"kernel\": 3},"
			" {\"type\": \"relu\"}, {\"type\": \"global_avg_pool\"}, {\"type\": \"flatten\"},"
			" {\"type\": \"dense\", \"units\": 2}]},"
			" \"data\": {\"train\": {\"format\": \"images\", \"path\": \"%s\", \"resize\": 8,"
			" \"center_crop\": 6}},"
			" \"batch_size\": 4, \"epochs\": 2, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.05}}",
			inputs[k], tmp_path("set"));
		run_job(job, 1, 2, r);
		if (k < 2) {
			cr_assert_eq(r->rc, 0, "%s: %s", inputs[k], r->err.message);
			/* conv 4 x 3 x 3 x 3 + 4, dense 2 x 4 + 2 */
			cr_assert_eq(r->nparams, (size_t)(4 * 27 + 4 + 2 * 4 + 2));
		} else {
			cr_assert_lt(r->rc, 0, "%s: the job should fail", inputs[k]);
			cr_assert_not_null(strstr(r->err.message, "/model/inputs"), "%s", r->err.message);
			cr_assert_not_null(strstr(r->err.message, k == 2 ? "[1, 6, 6]" : "[3, 4, 9]"), "%s",
					   r->err.message);
			cr_assert_not_null(strstr(r->err.message, "[3, 6, 6]"), "%s", r->err.message);
		}
		free(r->params);
	}
	free(r);
}

/* ---- exact resume of a patches job ---- */

struct sink {
	struct tr_snapshot *snaps[64];
	int n;
};

static int keep(void *ctx, struct tr_snapshot *snap, bool final)
{
	struct sink *k = ctx;

	(void) final;
	if (k->n >= 64)
		return -1;
	k->snaps[k->n++] = snap;
	return 0;
}

/* Patch positions and flips are drawn from (seed, epoch, sample): resuming
 * from any checkpoint, mid-epoch or not, gives the uninterrupted weights
 * bit for bit. */
Test(trainer_images, patches_job_resumes_bit_identically)
{
	char job[2048];
	struct tr_error err;
	struct tr_spec spec;
	struct tr_error e;
	struct sink sink = {0};
	tr_backend_t *be = tr_cpu_backend_create(2, 1);
	tr_trainer_t *t;
	float *straight, *resumed;
	size_t n;

	mkdir_in("pics");
	write_noise_png("pics/a.png", 30, 24, 1, 1, 0);
	write_noise_png("pics/b.png", 25, 25, 1, 2, 1);
	snprintf(job, sizeof job,
		 "{\"seed\": 8, \"model\": {\"inputs\": 25, \"layers\": [{\"type\": \"dense\", \"units\": 25}],"
		 " \"loss\": \"mse\"},"
		 " \"data\": {\"train\": {\"format\": \"patches\", \"path\": \"%s\", \"patch_size\": 5,"
		 " \"patches_per_image\": 9, \"response\": \"residual\"},"
		 " \"transforms\": [{\"type\": \"flip\"}, {\"type\": \"rot90\"}]},"
		 " \"batch_size\": 4, \"epochs\": 3, \"optimizer\": {\"type\": \"adam\", \"lr\": 0.01},"
		 " \"checkpoint\": {\"every_steps\": 4}}",
		 tmp_path("pics"));
	cr_assert_eq(tr_spec_parse_text(job, &spec, &e), 0, "%s", e.message);
	struct tr_trainer_options opt = {
		.spec = &spec, .backend = be, .devices = 2, .workers = 2, .hooks = {.checkpoint = keep, .ctx = &sink}};
	cr_assert_eq(tr_trainer_create(&opt, &t, &err), 0, "%s", err.message);
	cr_assert_eq(tr_trainer_run(t, &err), 0, "%s", err.message);
	n = tr_trainer_model(t)->n_params;
	straight = malloc(n * sizeof(float));
	resumed = malloc(n * sizeof(float));
	tr_trainer_copy_params(t, 0, straight);
	tr_trainer_destroy(t);
	cr_assert_geq(sink.n, 4, "%d checkpoints", sink.n);
	for (int i = 0; i < sink.n - 1; i++) {
		opt.hooks = (struct tr_trainer_hooks){0};
		cr_assert_eq(tr_trainer_create(&opt, &t, &err), 0, "%s", err.message);
		cr_assert_eq(tr_trainer_restore(t, sink.snaps[i], false, &err), 0, "%s", err.message);
		cr_assert_eq(tr_trainer_run(t, &err), 0, "%s", err.message);
		tr_trainer_copy_params(t, 0, resumed);
		cr_assert_eq(memcmp(resumed, straight, n * sizeof(float)), 0,
			     "resuming at step %lld changed the result", (long long)sink.snaps[i]->step);
		tr_trainer_destroy(t);
	}
	for (int i = 0; i < sink.n; i++)
		tr_snapshot_free(sink.snaps[i]);
	free(straight);
	free(resumed);
	tr_spec_finish(&spec);
	tr_backend_destroy(be);
}
