/* Image data against a real daemon: an "images" job over a folder of PNG
 * files in the data root and a "patches" job complete; an image with the
 * wrong channel count fails its job with the file named; a folder path
 * outside the roots or naming a file is refused at submit with its JSON
 * pointer; and the daemon keeps serving throughout.
 */
#include <criterion/criterion.h>
#include <png.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

static struct daemon d;

static void start(void)
{
	daemon_start(&d, 2, NULL);
}

static void stop(void)
{
	daemon_cleanup(&d);
}

TestSuite(imagedata, .init = start, .fini = stop, .timeout = 180);

static const char *in_root(const char *name)
{
	static char bufs[8][512];
	static int next;
	char *b = bufs[next++ % 8];

	snprintf(b, 512, "%s/%s", d.dir, name);
	return b;
}

static void mkdir_in(const char *name)
{
	cr_assert_eq(mkdir(in_root(name), 0755), 0, "mkdir %s", name);
}

static void write_png(const char *name, int w, int h, int channels, int seed)
{
	FILE *f = fopen(in_root(name), "wb");
	png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
	png_infop info = png_create_info_struct(png);
	unsigned char *row = malloc((size_t)w * channels);

	cr_assert(f && png && info && row);
	cr_assert_eq(setjmp(png_jmpbuf(png)), 0);
	png_init_io(png, f);
	png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, 8,
		     channels == 1 ? PNG_COLOR_TYPE_GRAY : PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
		     PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
	png_write_info(png, info);
	for (int y = 0; y < h; y++) {
		for (int x = 0; x < w * channels; x++)
			row[x] = (unsigned char)(seed * 37 + y * 11 + x * 5);
		png_write_row(png, row);
	}
	png_write_end(png, NULL);
	png_destroy_write_struct(&png, &info);
	free(row);
	cr_assert_eq(fclose(f), 0);
}

static const char *job_error(long long id)
{
	static char msg[2048];
	char path[64];
	struct http_reply r;

	snprintf(path, sizeof path, "/jobs/%lld", id);
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200);
	snprintf(msg, sizeof msg, "%s",
		 json_string_value(json_object_get(json_object_get(r.json, "error"), "message")) ?: "");
	http_free(&r);
	return msg;
}

static void write_classes(void)
{
	char name[64];

	mkdir_in("pets");
	mkdir_in("pets/cat");
	mkdir_in("pets/dog");
	for (int i = 0; i < 24; i++) {
		snprintf(name, sizeof name, "pets/%s/%02d.png", i % 2 ? "cat" : "dog", i);
		write_png(name, 8, 8, 3, i);
	}
}

static const char *images_job(const char *path)
{
	static char buf[1024];

	snprintf(buf, sizeof buf,
		 "{\"name\": \"pets\", \"seed\": 2, \"model\": {\"inputs\": 192, \"layers\": [{\"type\": \"dense\","
		 " \"units\": 8}, {\"type\": \"relu\"}, {\"type\": \"dense\", \"units\": 2}]},"
		 " \"data\": {\"train\": {\"format\": \"images\", \"path\": \"%s\", \"labels\": \"folders\"},"
		 " \"transforms\": [{\"type\": \"normalize\", \"mean\": [128, 128, 128], \"std\": [64, 64, 64]},"
		 " {\"type\": \"flip\"}, {\"type\": \"random_crop\", \"padding\": 1}]},"
		 " \"batch_size\": 6, \"epochs\": 3, \"devices\": 2, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.05},"
		 " \"prefetch\": {\"workers\": 3, \"depth\": 2}}",
		 path);
	return buf;
}

Test(imagedata, images_and_patches_jobs_complete)
{
	long long id;

	write_classes();
	id = submit_job(&d, images_job("pets"));
	cr_assert_str_eq(wait_state(&d, id, "completed|failed|cancelled", 90), "completed", "%s", job_error(id));
	mkdir_in("photos");
	write_png("photos/a.png", 30, 20, 1, 1);
	write_png("photos/b.png", 24, 24, 1, 2);
	id = submit_job(&d, "{\"name\": \"sr\", \"seed\": 5, \"model\": {\"inputs\": 64, \"layers\": [{\"type\":"
			    " \"dense\", \"units\": 64}], \"loss\": \"mse\"}, \"data\": {\"train\": {\"format\":"
			    " \"patches\", \"path\": \"photos\", \"patch_size\": 8, \"patches_per_image\": 16,"
			    " \"degrade\": {\"type\": \"downscale\", \"factor\": 2}, \"response\": \"residual\"},"
			    " \"transforms\": [{\"type\": \"rot90\"}]}, \"batch_size\": 8, \"epochs\": 2,"
			    " \"optimizer\": {\"type\": \"adam\", \"lr\": 0.001}}");
	cr_assert_str_eq(wait_state(&d, id, "completed|failed|cancelled", 90), "completed", "%s", job_error(id));
}

/* An evaluate job on an image folder: the model's own folder evaluates;
 * one whose class folders are not the model's classes (recorded from the
 * training folder) fails with invalid_data naming the class that differs. */
Test(imagedata, evaluate_checks_class_folders_against_the_model)
{
	char path[64];
	struct http_reply r;
	long long id, eid;

	write_classes();
	mkdir_in("zoo");
	mkdir_in("zoo/cat");
	mkdir_in("zoo/fox");
	write_png("zoo/cat/a.png", 8, 8, 3, 1);
	write_png("zoo/fox/b.png", 8, 8, 3, 2);
	id = submit_job(&d, images_job("pets"));
	cr_assert_str_eq(wait_state(&d, id, "completed|failed|cancelled", 90), "completed", "%s", job_error(id));
	snprintf(path, sizeof path, "/jobs/%lld/evaluate", id);
	http(&d, "POST", path, "{\"data\": {\"format\": \"images\", \"path\": \"pets\", \"labels\": \"folders\"}}",
	     NULL, NULL, &r);
	cr_assert_eq(r.status, 202, "%s", r.body);
	eid = (long long)json_integer_value(json_object_get(r.json, "id"));
	http_free(&r);
	cr_assert_str_eq(wait_state(&d, eid, "completed|failed|cancelled", 60), "completed", "%s", job_error(eid));
	http(&d, "POST", path, "{\"data\": {\"format\": \"images\", \"path\": \"zoo\", \"labels\": \"folders\"}}", NULL,
	     NULL, &r);
	cr_assert_eq(r.status, 202, "%s", r.body);
	eid = (long long)json_integer_value(json_object_get(r.json, "id"));
	http_free(&r);
	cr_assert_str_eq(wait_state(&d, eid, "completed|failed|cancelled", 60), "failed");
	cr_assert(strstr(job_error(eid), "zoo: the class folders do not match the model's classes: class 1 is 'fox' "
					 "in the data, 'dog' in the model"),
		  "%s", job_error(eid));
}

Test(imagedata, bad_image_fails_the_job_naming_the_file)
{
	long long id;
	struct http_reply r;

	write_classes();
	write_png("pets/dog/zz-grey.png", 8, 8, 1, 0);
	/* Found at submit (the folder is small enough to open then), naming
	 * both the odd image and the first. */
	http(&d, "POST", "/jobs", images_job("pets"), NULL, NULL, &r);
	cr_assert_eq(r.status, 400, "%ld %s", r.status, r.body);
	cr_assert(strstr(r.body, "pets/dog/zz-grey.png: 1 channel, the first image ") &&
			  strstr(r.body, "pets/cat/01.png has 3"),
		  "%s", r.body);
	cr_assert_str_eq(json_string_value(json_object_get(json_object_get(r.json, "error"), "pointer")),
			 "/data/train");
	http_free(&r);

	/* A file where the folder should be, and a folder outside the roots:
	 * refused at submit, with the pointer. */
	http(&d, "POST", "/jobs", images_job("pets/cat/01.png"), NULL, NULL, &r);
	cr_assert_eq(r.status, 422, "%ld %s", r.status, r.body);
	cr_assert(strstr(r.body, "/data/train/path"), "%s", r.body);
	http_free(&r);
	http(&d, "POST", "/jobs", images_job("/usr/share"), NULL, NULL, &r);
	cr_assert_eq(r.status, 422, "%ld %s", r.status, r.body);
	cr_assert(strstr(r.body, "no folder '/usr/share' in the daemon's data roots"), "%s", r.body);
	http_free(&r);

	/* Still serving: the good folder trains. */
	remove(in_root("pets/dog/zz-grey.png"));
	id = submit_job(&d, images_job("pets"));
	cr_assert_str_eq(wait_state(&d, id, "completed|failed|cancelled", 90), "completed", "%s", job_error(id));
}

/* ---- errors that depend on the data, found at submit ---- */

/* A patches job on small images: each mistake is a 400 with its pointer
 * at submit, not a job that fails once it leaves the queue. */
Test(imagedata, data_errors_are_found_at_submit)
{
	struct http_reply r;
	static const struct {
		const char *model, *patch, *pointer, *says;
	} cases[] = {
		/* a patch larger than an image: the image named */
		{"\"layers\": [{\"type\": \"conv2d\", \"filters\": 1, \"kernel\": 3, \"padding\": 1}], \"loss\": "
		 "\"mse\"",
		 "32", "/data/train", "small/b.png: 24x24 is smaller than the 32x32 patch_size"},
		/* softmax on an image target */
		{"\"layers\": [{\"type\": \"conv2d\", \"filters\": 2, \"kernel\": 3, \"padding\": 1}], \"loss\": "
		 "\"softmax_cross_entropy\"",
		 "8", "/model/loss", "its targets are images: use mse"},
		/* a dense layer after a convolution, with no flatten */
		{"\"layers\": [{\"type\": \"conv2d\", \"filters\": 2, \"kernel\": 3}, {\"type\": \"dense\", "
		 "\"units\": 64}], \"loss\": \"mse\"",
		 "8", "/model/layers/1", "flatten"},
	};
	mkdir_in("small");
	write_png("small/a.png", 40, 40, 1, 1);
	write_png("small/b.png", 24, 24, 1, 2);
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char spec[1024];
		snprintf(spec, sizeof spec,
			 "{\"name\": \"early\", \"model\": {%s}, \"data\": {\"train\": {\"format\": \"patches\","
			 " \"path\": \"small\", \"patch_size\": %s, \"degrade\": {\"type\": \"downscale\","
			 " \"factor\": 2}}}, \"batch_size\": 4, \"epochs\": 1,"
			 " \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.01}}",
			 cases[i].model, cases[i].patch);
		http(&d, "POST", "/jobs", spec, NULL, NULL, &r);
		cr_assert_eq(r.status, 400, "case %zu: %ld %s", i, r.status, r.body);
		json_t *e = json_object_get(r.json, "error");
		cr_assert_str_eq(json_string_value(json_object_get(e, "code")), "invalid_spec", "%s", r.body);
		cr_assert_str_eq(json_string_value(json_object_get(e, "pointer")), cases[i].pointer, "case %zu: %s", i,
				 r.body);
		cr_assert(strstr(json_string_value(json_object_get(e, "message")), cases[i].says), "case %zu: %s", i,
			  r.body);
		http_free(&r);
	}
	/* Nothing was queued. */
	http(&d, "GET", "/jobs", NULL, NULL, NULL, &r);
	cr_assert_eq(json_array_size(json_object_get(r.json, "jobs")), 0, "%s", r.body);
	http_free(&r);
}

/* ---- SIGKILL and resume of a patches job ---- */

static long long live_step(long long id, char state[32])
{
	char path[64];
	struct http_reply r;
	long long step;
	json_t *p;

	snprintf(path, sizeof path, "/jobs/%lld", id);
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200);
	snprintf(state, 32, "%s", json_string_value(json_object_get(r.json, "state")) ?: "?");
	p = json_object_get(r.json, "progress");
	/* Only this daemon run's own progress (it has elapsed_s), not the
	 * stored row a restart shows first. */
	step = json_object_get(p, "elapsed_s") ? json_integer_value(json_object_get(p, "step")) : -1;
	http_free(&r);
	return step;
}

static unsigned char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	unsigned char *b;
	long n;

	cr_assert_not_null(f, "%s", path);
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	b = malloc((size_t)n + 1);
	cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	*len = (size_t)n;
	return b;
}

/* Patch positions and flips come from (seed, epoch, sample), and the
 * images are decoded again when the job restarts: a job killed mid-run
 * and resumed from its checkpoint ends with the uninterrupted job's
 * weights, byte for byte. */
Test(imagedata, patches_job_resumes_exactly_after_sigkill)
{
	const char *job =
		"{\"name\": \"sr-resume\", \"seed\": 3, \"model\": {\"inputs\": 1024, \"layers\": [{\"type\": \"dense\","
		" \"units\": 1024}], \"loss\": \"mse\"}, \"data\": {\"train\": {\"format\": \"patches\", \"path\":"
		" \"photos\", \"patch_size\": 32, \"patches_per_image\": 200, \"response\": \"residual\"},"
		" \"transforms\": [{\"type\": \"flip\"}, {\"type\": \"rot90\"}]}, \"batch_size\": 16, \"epochs\": 8,"
		" \"optimizer\": {\"type\": \"adam\", \"lr\": 0.0005}, \"checkpoint\": {\"every_steps\": 30}}";
	char fa[256], fb[256], path[128], state[32];
	long long ref, id, s = -1;
	size_t la, lb;
	unsigned char *a, *b;
	double deadline;

	mkdir_in("photos");
	write_png("photos/a.png", 64, 64, 1, 1);
	write_png("photos/b.png", 70, 60, 1, 2);
	ref = submit_job(&d, job);
	cr_assert_str_eq(wait_state(&d, ref, "completed|failed|cancelled", 120 * TR_TEST_SLOW), "completed", "%s",
			 job_error(ref));

	id = submit_job(&d, job);
	deadline = now_s() + 60 * TR_TEST_SLOW;
	while ((s = live_step(id, state)) < 70) {
		cr_assert(strcmp(state, "completed") != 0 && strcmp(state, "failed") != 0, "job %lld %s at step %lld",
			  id, state, s);
		cr_assert_lt(now_s(), deadline, "job %lld: still %s at step %lld", id, state, s);
		usleep(2000);
	}
	/* The checkpoint of step 30 or 60 is written in the background; a
	 * fast step can reach 70 before it is on disk, so wait for it to be
	 * logged (bounded) before the kill. */
	for (;;) {
		struct http_reply r;
		bool written;

		snprintf(path, sizeof path, "/jobs/%lld/logs?limit=10000", id);
		http(&d, "GET", path, NULL, NULL, NULL, &r);
		written = r.status == 200 && strstr(r.body, "checkpoint at step ") != NULL;
		http_free(&r);
		if (written)
			break;
		cr_assert_lt(now_s(), deadline, "job %lld: no checkpoint logged by step %lld", id, s);
		usleep(2000);
	}
	daemon_kill(&d);
	daemon_restart(&d, 2, NULL);
	cr_assert_str_eq(wait_state(&d, id, "completed|failed|cancelled", 120 * TR_TEST_SLOW), "completed", "%s",
			 job_error(id));
	/* It resumed from a checkpoint (every 30 steps, so the last step, 200,
	 * writes a "final" one in both runs), not from the start. */
	{
		struct http_reply r;
		const char *hit;

		snprintf(path, sizeof path, "/jobs/%lld/logs?limit=10000", id);
		http(&d, "GET", path, NULL, NULL, NULL, &r);
		cr_assert_eq(r.status, 200);
		hit = strstr(r.body, "resuming from the checkpoint at step ");
		cr_assert_not_null(hit, "killed at step %lld, no resume from a checkpoint in the log: %s", s, r.body);
		cr_assert_geq(atoll(hit + strlen("resuming from the checkpoint at step ")), 20, "%s", r.body);
		http_free(&r);
	}

	snprintf(fa, sizeof fa, "%s/ref.safetensors", d.dir);
	snprintf(fb, sizeof fb, "%s/resumed.safetensors", d.dir);
	snprintf(path, sizeof path, "/jobs/%lld/checkpoints/latest/model.safetensors", ref);
	cr_assert_eq(http_download(&d, path, fa, NULL), 200);
	snprintf(path, sizeof path, "/jobs/%lld/checkpoints/latest/model.safetensors", id);
	cr_assert_eq(http_download(&d, path, fb, NULL), 200);
	a = slurp(fa, &la);
	b = slurp(fb, &lb);
	if (la >= 8 && lb >= 8 && (la != lb || memcmp(a, b, la) != 0)) {
		/* Say what differs: the headers (their JSON) or the data. */
		uint64_t ha, hb;

		memcpy(&ha, a, 8);
		memcpy(&hb, b, 8);
		cr_assert(ha < la && hb < lb && (ha != hb || memcmp(a, b, 8 + ha) != 0) == 0,
			  "killed at step %lld, the resumed job's model.safetensors header differs:\n%.*s\nthe "
			  "uninterrupted job's:\n%.*s",
			  s, (int)(hb < 4000 ? hb : 4000), b + 8, (int)(ha < 4000 ? ha : 4000), a + 8);
	}
	cr_assert(la == lb && memcmp(a, b, la) == 0,
		  "killed at step %lld, the resumed job's weights (%zu bytes) differ from the uninterrupted job's "
		  "(%zu bytes)",
		  s, lb, la);
	free(a);
	free(b);
}
