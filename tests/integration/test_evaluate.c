/* Evaluating a trained model through a real daemon: a job's data.test
 * figures in its summary and metrics, and POST /jobs/{id}/evaluate as a
 * job of kind "evaluate" whose result holds the figures, with the same
 * numbers as the test source (two paths through the engine: the trainer's
 * own evaluation and tr_infer_run over the stored checkpoint).  Bad
 * requests get their status and pointer; the daemon keeps serving.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static struct daemon d;

static void start2(void)
{
	daemon_start(&d, 2, NULL);
}

static void stop2(void)
{
	daemon_cleanup(&d);
}

/* The daemon stops cleanly: under a sanitizer build an error or a leak is
 * a non-zero exit. */
static void stop_cleanly(void)
{
	int st = -1;
	daemon_stop(&d, &st);
	if (st != 0)
		daemon_dump_log(&d);
	cr_assert_eq(st, 0, "the daemon exited with status %d", st);
}

TestSuite(evaluate, .init = start2, .fini = stop2);

/* rows of 3 features on very different scales (so standardize matters)
 * and a class label 0..2 last. */
static void write_csv(const char *name, int rows, int seed, int cols)
{
	char path[256];
	snprintf(path, sizeof path, "%s/%s", d.dir, name);
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f, "%s", path);
	unsigned s = (unsigned)seed * 2654435761u + 1;
	for (int r = 0; r < rows; r++) {
		int cls = r % 3;
		for (int c = 0; c < cols - 1; c++) {
			s = s * 1103515245u + 12345u;
			double noise = ((s >> 8) % 1000) / 1000.0 - 0.5;
			double scale = c == 0 ? 1000.0 : c == 1 ? 0.01 : 1.0;
			fprintf(f, "%.6g,", scale * (cls * (c + 1) * 0.7 + noise));
		}
		fprintf(f, "%d\n", cls);
	}
	cr_assert_eq(fclose(f), 0);
}

static json_t *get_job(long long id)
{
	char path[64];
	struct http_reply r;
	snprintf(path, sizeof path, "/jobs/%lld", id);
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	json_t *j = json_incref(r.json);
	http_free(&r);
	return j;
}

static double num(const json_t *o, const char *key)
{
	const json_t *v = json_object_get(o, key);
	cr_assert(json_is_number(v), "%s is not a number", key);
	return json_number_value(v);
}

static const char *const job_spec =
	"{\"name\": \"clf\", \"seed\": 5, \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 16},"
	" {\"type\": \"relu\"}, {\"type\": \"dense\", \"units\": 3}]},"
	" \"data\": {\"train\": {\"format\": \"csv\", \"path\": \"train.csv\"},"
	"          \"test\": {\"format\": \"csv\", \"path\": \"test.csv\"},"
	"          \"transforms\": [{\"type\": \"standardize\"}]},"
	" \"batch_size\": 32, \"epochs\": 3, \"optimizer\": {\"type\": \"adam\", \"lr\": 0.01},"
	" \"devices\": 2, \"prefetch\": {\"workers\": 1, \"depth\": 2}}";

Test(evaluate, test_source_and_evaluate_job_agree, .timeout = 120)
{
	write_csv("train.csv", 240, 1, 4);
	write_csv("test.csv", 90, 2, 4);
	long long id = submit_job(&d, job_spec);
	cr_assert_str_eq(wait_state(&d, id, "completed|failed|cancelled", 60), "completed");

	/* data.test: in the summary and the metrics. */
	json_t *job = get_job(id);
	cr_assert_str_eq(json_string_value(json_object_get(job, "kind")), "train");
	json_t *sum = json_object_get(job, "summary");
	double test_loss = num(sum, "test_loss"), test_acc = num(sum, "test_accuracy");
	cr_assert(test_loss > 0 && test_acc >= 0 && test_acc <= 1, "%g %g", test_loss, test_acc);
	int64_t steps = json_integer_value(json_object_get(json_object_get(job, "progress"), "step"));
	json_decref(job);
	char path[128];
	struct http_reply r;
	snprintf(path, sizeof path, "/jobs/%lld/metrics?names=test_loss,test_accuracy", id);
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	json_t *series = json_object_get(json_object_get(r.json, "series"), "test_loss");
	cr_assert_eq(json_array_size(json_object_get(series, "steps")), 1, "%s", r.body);
	cr_assert_eq(json_integer_value(json_array_get(json_object_get(series, "steps"), 0)), steps);
	http_free(&r);

	/* The same checkpoint and data through an evaluate job. */
	snprintf(path, sizeof path, "/jobs/%lld/evaluate", id);
	http(&d, "POST", path,
	     "{\"data\": {\"format\": \"csv\", \"path\": \"test.csv\"}, \"devices\": 2, \"batch_size\": 7}", NULL, NULL,
	     &r);
	cr_assert_eq(r.status, 202, "%s", r.body);
	cr_assert_str_eq(json_string_value(json_object_get(r.json, "kind")), "evaluate");
	cr_assert(strstr(r.headers, "Location: /jobs/"), "%s", r.headers);
	long long eid = (long long)json_integer_value(json_object_get(r.json, "id"));
	cr_assert_eq(json_integer_value(json_object_get(json_object_get(r.json, "spec"), "job")), id);
	http_free(&r);
	cr_assert_str_eq(wait_state(&d, eid, "completed|failed|cancelled", 60), "completed");
	job = get_job(eid);
	json_t *res = json_object_get(job, "result");
	cr_assert(json_is_object(res), "no result");
	cr_assert_eq(json_integer_value(json_object_get(res, "samples")), 90);
	cr_assert_eq(json_integer_value(json_object_get(res, "step")), steps);
	cr_assert_eq(json_integer_value(json_object_get(res, "job")), id);
	cr_assert_str_eq(json_string_value(json_object_get(res, "checkpoint")), "latest");
	double loss = num(res, "loss"), acc = num(res, "accuracy");
	cr_assert(fabs(loss - test_loss) <= 1e-5 * fabs(test_loss), "evaluate %.9g, data.test %.9g", loss, test_loss);
	cr_assert(fabs(acc - test_acc) < 1e-9, "evaluate %.9g, data.test %.9g", acc, test_acc);
	/* The confusion matrix counts every sample; its diagonal is the accuracy. */
	json_t *cm = json_object_get(res, "confusion_matrix");
	cr_assert_eq(json_array_size(cm), 3);
	long long total = 0, diag = 0;
	for (size_t i = 0; i < 3; i++)
		for (size_t k = 0; k < 3; k++) {
			long long v = json_integer_value(json_array_get(json_array_get(cm, i), k));
			total += v;
			diag += i == k ? v : 0;
		}
	cr_assert_eq(total, 90);
	cr_assert(fabs((double)diag / 90 - acc) < 1e-12);
	json_decref(job);
	/* The figures are metric points at the checkpoint's step too. */
	snprintf(path, sizeof path, "/jobs/%lld/metrics?names=accuracy", eid);
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200);
	series = json_object_get(json_object_get(r.json, "series"), "accuracy");
	cr_assert_eq(json_integer_value(json_array_get(json_object_get(series, "steps"), 0)), steps, "%s", r.body);
	http_free(&r);

	/* Bad requests, each with its status, code and pointer. */
	static const struct {
		const char *body;
		long status;
		const char *code, *pointer;
	} bad[] = {
		{"{\"checkpoint\": \"latest\"}", 400, "invalid_request", "/data"},
		{"{\"data\": {\"format\": \"parquet\", \"path\": \"test.csv\"}}", 400, "invalid_spec", "/data/format"},
		{"{\"data\": {\"format\": \"csv\", \"path\": \"test.csv\"}, \"checkpoint\": \"first\"}", 400,
		 "invalid_request", "/checkpoint"},
		{"{\"data\": {\"format\": \"csv\", \"path\": \"test.csv\"}, \"colour\": 1}", 400, "invalid_request",
		 "/colour"},
		{"{\"data\": {\"format\": \"csv\", \"path\": \"test.csv\"}, \"devices\": 3}", 400, "invalid_request",
		 "/devices"},
		{"{\"data\": {\"format\": \"csv\", \"path\": \"../outside.csv\"}}", 422, "invalid_path", "/data/path"},
		{"{\"data\": {\"format\": \"csv\", \"path\": \"test.csv\"}, \"checkpoint\": \"best\"}", 409,
		 "no_checkpoint", "/checkpoint"},
		{"{\"data\": {\"format\": \"csv\", \"path\": \"test.csv\"}, \"checkpoint\": 999999}", 409,
		 "no_checkpoint", "/checkpoint"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		snprintf(path, sizeof path, "/jobs/%lld/evaluate", id);
		http(&d, "POST", path, bad[i].body, NULL, NULL, &r);
		cr_assert_eq(r.status, bad[i].status, "%s: %ld %s", bad[i].body, r.status, r.body);
		json_t *e = json_object_get(r.json, "error");
		cr_assert_str_eq(json_string_value(json_object_get(e, "code")), bad[i].code, "%s", r.body);
		cr_assert_str_eq(json_string_value(json_object_get(e, "pointer")), bad[i].pointer, "%s", r.body);
		http_free(&r);
	}
	http(&d, "POST", "/jobs/999999/evaluate", "{\"data\": {\"format\": \"csv\", \"path\": \"test.csv\"}}", NULL,
	     NULL, &r);
	cr_assert_eq(r.status, 404, "%s", r.body);
	http_free(&r);
	snprintf(path, sizeof path, "/jobs/%lld/evaluate", eid);
	http(&d, "POST", path, "{\"data\": {\"format\": \"csv\", \"path\": \"test.csv\"}}", NULL, NULL, &r);
	cr_assert_eq(r.status, 409, "an evaluate job has no checkpoints: %s", r.body);
	http_free(&r);
	stop_cleanly();
}

Test(evaluate, data_that_does_not_fit_fails_the_evaluate_job, .timeout = 120)
{
	write_csv("train.csv", 120, 1, 4);
	write_csv("test.csv", 30, 2, 4);
	write_csv("wide.csv", 30, 3, 6); /* 5 features: the model takes 3 */
	long long id = submit_job(&d, job_spec);
	cr_assert_str_eq(wait_state(&d, id, "completed|failed|cancelled", 60), "completed");
	char path[64];
	struct http_reply r;
	snprintf(path, sizeof path, "/jobs/%lld/evaluate", id);
	http(&d, "POST", path, "{\"data\": {\"format\": \"csv\", \"path\": \"wide.csv\"}}", NULL, NULL, &r);
	cr_assert_eq(r.status, 202, "%s", r.body);
	long long eid = (long long)json_integer_value(json_object_get(r.json, "id"));
	http_free(&r);
	cr_assert_str_eq(wait_state(&d, eid, "completed|failed|cancelled", 60), "failed");
	json_t *job = get_job(eid);
	json_t *e = json_object_get(job, "error");
	cr_assert_str_eq(json_string_value(json_object_get(e, "code")), "invalid_data");
	const char *msg = json_string_value(json_object_get(e, "message"));
	cr_assert(strstr(msg, "wide.csv: 5 features per sample, the model takes 3"), "%s", msg);
	cr_assert(json_is_null(json_object_get(job, "result")));
	json_decref(job);
	http(&d, "GET", "/healthz", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200);
	http_free(&r);
	stop_cleanly();
}
