/* Early stopping and info fields with a real daemon.  Early stopping: a job whose metric stops improving
 * ends early as completed with the reason in its log; its best checkpoint
 * survives pruning by `keep`, downloads at /checkpoints/best/..., and
 * holds exactly the weights of the best step (the same spec run to that
 * step alone gives the same bytes: training is deterministic on the same
 * devices, docs/design.md section 2).  Info fields: PUT /jobs/{id}/info
 * merges into what GET /jobs/{id} shows, beside the engine's own (phase,
 * epoch, best validation loss and its step, stop reason), with 400 and a
 * pointer for each bad field, 409 past 64 fields, 404 for no job.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static struct daemon d;

static void start1(void)
{
	daemon_start(&d, 1, NULL);
}

static void stop1(void)
{
	daemon_cleanup(&d);
}

/* 400 samples, a quarter held out: 300 to train, batch 30, 10 steps an
 * epoch.  In mode max a falling val_loss never improves on the first
 * evaluation (step 10): with patience 2 the job ends after step 30 of 80.
 * A checkpoint every 5 steps with keep 1 would have pruned step 10. */
#define ES_JOB(name, extra)                                                                                     \
	"{\"name\": \"" name "\", \"seed\": 11, \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 16}," \
	" {\"type\": \"relu\"}, {\"type\": \"dense\", \"units\": 3}]}, \"data\": {\"train\": {\"format\":"      \
	" \"synthetic\", \"samples\": 400, \"features\": 8, \"classes\": 3, \"noise\": 0.2},"                   \
	" \"validation_split\": 0.25}, \"batch_size\": 30, \"optimizer\": {\"type\": \"adam\", \"lr\": 0.02},"  \
	" \"devices\": 1" extra "}"

static char *read_file(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	cr_assert_not_null(f, "%s", path);
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *buf = malloc((size_t)n + 1);
	cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	*len = (size_t)n;
	return buf;
}

/* The tensor bytes of a safetensors file (after its header, whose
 * metadata names the job's spec hash and so differs between jobs). */
static const char *tensor_bytes(const char *file, size_t len, size_t *n)
{
	uint64_t hlen = 0;
	cr_assert_geq(len, 8);
	for (int i = 7; i >= 0; i--)
		hlen = hlen << 8 | (unsigned char)file[i];
	cr_assert_leq(8 + hlen, len);
	*n = len - 8 - hlen;
	return file + 8 + hlen;
}

static char *get_text(const char *path)
{
	struct http_reply r;
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200, "GET %s: %ld %s", path, r.status, r.body);
	char *text = strdup(r.body);
	http_free(&r);
	return text;
}

Test(monitors, early_stopping_ends_the_job_and_keeps_the_best, .init = start1, .fini = stop1, .timeout = 120)
{
	long long es = submit_job(&d, ES_JOB("es", ", \"epochs\": 8, \"checkpoint\": {\"every_steps\": 5, \"keep\": 1},"
						   " \"early_stopping\": {\"metric\": \"val_loss\", \"mode\": \"max\","
						   " \"patience\": 2}"));
	cr_assert_str_eq(wait_state(&d, es, "completed|failed|cancelled", 90), "completed");
	char path[128];
	struct http_reply r;

	snprintf(path, sizeof path, "/jobs/%lld", es);
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200);
	json_t *progress = json_object_get(r.json, "progress");
	cr_assert_eq(json_integer_value(json_object_get(progress, "step")), 30, "%s", r.body);
	http_free(&r);

	snprintf(path, sizeof path, "/jobs/%lld/logs", es);
	char *log = get_text(path);
	cr_assert_not_null(strstr(log, "early stopping after step 30: val_loss has not improved by more than 0 for 2"),
			   "%s", log);
	cr_assert_not_null(strstr(log, "at step 10"), "%s", log);
	free(log);

	/* keep 1 plus the best. */
	snprintf(path, sizeof path, "/jobs/%lld/checkpoints", es);
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200);
	json_t *list = json_object_get(r.json, "checkpoints");
	cr_assert_eq(json_array_size(list), 2, "%s", r.body);
	cr_assert_eq(json_integer_value(json_object_get(json_array_get(list, 0), "step")), 30, "%s", r.body);
	cr_assert(json_is_false(json_object_get(json_array_get(list, 0), "best")), "%s", r.body);
	cr_assert_eq(json_integer_value(json_object_get(json_array_get(list, 1), "step")), 10, "%s", r.body);
	cr_assert(json_is_true(json_object_get(json_array_get(list, 1), "best")), "%s", r.body);
	http_free(&r);

	char best_file[256], ref_file[256], ckpt_file[256];
	snprintf(best_file, sizeof best_file, "%s/best-model.safetensors", d.dir);
	snprintf(ckpt_file, sizeof ckpt_file, "%s/best-checkpoint.safetensors", d.dir);
	snprintf(ref_file, sizeof ref_file, "%s/ref-model.safetensors", d.dir);
	snprintf(path, sizeof path, "/jobs/%lld/checkpoints/best/model.safetensors", es);
	cr_assert_eq(http_download(&d, path, best_file, NULL), 200, "GET %s", path);
	snprintf(path, sizeof path, "/jobs/%lld/checkpoints/best/checkpoint.safetensors", es);
	cr_assert_eq(http_download(&d, path, ckpt_file, NULL), 200, "GET %s", path);

	/* The same job run to step 10 alone. */
	long long ref = submit_job(&d, ES_JOB("ref", ", \"max_steps\": 10"));
	cr_assert_str_eq(wait_state(&d, ref, "completed|failed|cancelled", 90), "completed");
	snprintf(path, sizeof path, "/jobs/%lld/checkpoints/latest/model.safetensors", ref);
	cr_assert_eq(http_download(&d, path, ref_file, NULL), 200, "GET %s", path);
	size_t la, lb, na, nb;
	char *a = read_file(best_file, &la), *b = read_file(ref_file, &lb);
	const char *ta = tensor_bytes(a, la, &na), *tb = tensor_bytes(b, lb, &nb);
	cr_assert_eq(na, nb);
	cr_assert_gt(na, 0);
	cr_assert_eq(memcmp(ta, tb, na), 0, "the best checkpoint holds step 10's weights");
	cr_assert_not_null(memmem(a + 8, (size_t)(ta - a) - 8, "\"reason\":\"best\"", 15), "header: %.300s", a + 8);
	free(a);
	free(b);

	/* A job without early stopping has no best. */
	snprintf(path, sizeof path, "/jobs/%lld/checkpoints/best/model.safetensors", ref);
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 404, "%s", r.body);
	cr_assert_not_null(strstr(r.body, "no best checkpoint"), "%s", r.body);
	http_free(&r);
	snprintf(path, sizeof path, "/jobs/%lld/checkpoints/bestest/model.safetensors", ref);
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 400, "%s", r.body);
	http_free(&r);

	/* The engine's info fields: best_val_loss is the lowest val_loss point. */
	snprintf(path, sizeof path, "/jobs/%lld/metrics?names=val_loss", es);
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	json_t *vals = json_object_get(json_object_get(json_object_get(r.json, "series"), "val_loss"), "values");
	json_t *steps = json_object_get(json_object_get(json_object_get(r.json, "series"), "val_loss"), "steps");
	cr_assert_eq(json_array_size(vals), 3, "%s", r.body);
	double lo = 1e300;
	long long lo_step = -1;
	for (size_t i = 0; i < json_array_size(vals); i++)
		if (json_number_value(json_array_get(vals, i)) < lo) {
			lo = json_number_value(json_array_get(vals, i));
			lo_step = json_integer_value(json_array_get(steps, i));
		}
	http_free(&r);
	snprintf(path, sizeof path, "/jobs/%lld", es);
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	json_t *info = json_object_get(r.json, "info");
	cr_assert(json_is_object(info), "%s", r.body);
	cr_assert_str_eq(json_string_value(json_object_get(info, "phase")), "finished", "%s", r.body);
	cr_assert_str_eq(json_string_value(json_object_get(info, "epoch")), "3", "%s", r.body);
	const char *bvl = json_string_value(json_object_get(info, "best_val_loss"));
	cr_assert_not_null(bvl, "%s", r.body);
	cr_assert_leq(fabs(atof(bvl) - lo), 1e-5 * fabs(lo), "%s vs %.9g", bvl, lo);
	cr_assert_eq(atoll(json_string_value(json_object_get(info, "best_val_loss_step"))), lo_step, "%s", r.body);
	cr_assert_not_null(strstr(json_string_value(json_object_get(info, "stop_reason")), "early_stopping: val_loss"),
			   "%s", r.body);
	http_free(&r);

	/* A bad section is refused at submit with its pointer. */
	http(&d, "POST", "/jobs",
	     ES_JOB("bad", ", \"epochs\": 2, \"early_stopping\": {\"metric\": \"loss\", \"patience\": 0}"), NULL, NULL,
	     &r);
	cr_assert_eq(r.status, 400, "%s", r.body);
	cr_assert_str_eq(json_string_value(json_object_get(json_object_get(r.json, "error"), "pointer")),
			 "/early_stopping/patience", "%s", r.body);
	http_free(&r);
}

static void put_info(long long id, const char *body, long want, const char *pointer)
{
	char path[64];
	struct http_reply r;
	snprintf(path, sizeof path, "/jobs/%lld/info", id);
	http(&d, "PUT", path, body, NULL, NULL, &r);
	cr_assert_eq(r.status, want, "PUT %s: %ld %s", body, r.status, r.body);
	if (pointer)
		cr_assert_str_eq(json_string_value(json_object_get(json_object_get(r.json, "error"), "pointer")),
				 pointer, "%s", r.body);
	http_free(&r);
}

Test(monitors, info_fields_through_the_api, .init = start1, .fini = stop1, .timeout = 60)
{
	long long id = submit_job(&d, ES_JOB("info", ", \"max_steps\": 3"));
	cr_assert_str_eq(wait_state(&d, id, "completed|failed|cancelled", 60), "completed");
	char path[64];
	struct http_reply r;

	snprintf(path, sizeof path, "/jobs/%lld/info", id);
	http(&d, "PUT", path, "{\"owner\": \"ana\", \"note\": \"lr sweep 3\"}", NULL, NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	json_t *info = json_object_get(r.json, "info");
	cr_assert_str_eq(json_string_value(json_object_get(info, "owner")), "ana", "%s", r.body);
	cr_assert_str_eq(json_string_value(json_object_get(info, "phase")), "finished", "engine fields stay: %s",
			 r.body);
	http_free(&r);
	/* Merged: a key replaced, others kept. */
	put_info(id, "{\"note\": \"lr sweep 4\"}", 200, NULL);
	snprintf(path, sizeof path, "/jobs/%lld", id);
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	info = json_object_get(r.json, "info");
	cr_assert_str_eq(json_string_value(json_object_get(info, "note")), "lr sweep 4", "%s", r.body);
	cr_assert_str_eq(json_string_value(json_object_get(info, "owner")), "ana", "%s", r.body);
	size_t have = json_object_size(info);
	http_free(&r);

	put_info(id, "{\"owner\": 3}", 400, "/owner");
	put_info(id, "{\"a/b\": null}", 400, "/a~1b");
	put_info(id, "{\"\": \"x\"}", 400, "/");
	put_info(id, "{\"k\": \"two\\nlines\"}", 400, "/k");
	put_info(id, "[\"x\"]", 400, NULL);
	char big[1200];
	int n = snprintf(big, sizeof big, "{\"%065d\": \"x\"}", 0);
	cr_assert_lt(n, (int)sizeof big);
	put_info(id, big, 400, NULL);
	snprintf(big, sizeof big, "{\"v\": \"%0257d\"}", 0);
	put_info(id, big, 400, "/v");
	/* 65 fields in one body: 400; enough to pass 64 with what is there: 409. */
	json_t *o = json_object();
	for (int i = 0; i < 65; i++) {
		char k[16];
		snprintf(k, sizeof k, "k%d", i);
		json_object_set_new(o, k, json_string("v"));
	}
	char *text = json_dumps(o, JSON_COMPACT);
	put_info(id, text, 400, NULL);
	free(text);
	json_object_clear(o);
	for (size_t i = 0; i + have < 65; i++) {
		char k[16];
		snprintf(k, sizeof k, "k%zu", i);
		json_object_set_new(o, k, json_string("v"));
	}
	text = json_dumps(o, JSON_COMPACT);
	put_info(id, text, 409, NULL);
	free(text);
	json_object_del(o, "k0");
	text = json_dumps(o, JSON_COMPACT);
	put_info(id, text, 200, NULL);
	free(text);
	json_decref(o);
	put_info(999999, "{\"a\": \"b\"}", 404, NULL);
}
