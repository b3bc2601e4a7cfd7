/* Sizes and free strings at their bounds, over HTTP against a real daemon.
 *
 * A synthetic data set of 2^62 + 1 samples once made the batch plan spin
 * forever in set-up, where neither a cancel, a delete nor SIGTERM reached
 * it, and a restart spun again; megabyte job names made every listing
 * huge; a pushed metric step past the store's limit was answered as a full
 * queue.  Each is replayed here: the request is refused with 400 and the
 * JSON pointer of the value, nothing is stored, and the daemon keeps
 * serving and training.  A set-up that is long but legal (standardize over
 * 2^40 samples) is cancelled, deleted and interrupted by SIGTERM.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static struct daemon d;

static const char *const fast_shutdown[] = {"--shutdown-grace", "1", NULL};

static void start(void)
{
	daemon_start(&d, 2, fast_shutdown);
}

static void stop(void)
{
	daemon_cleanup(&d);
}

/* ~1 s of training. */
#define SMALL_JOB                                                                                                     \
	"{\"name\": \"small\", \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 8}, {\"type\": \"relu\"},"   \
	" {\"type\": \"dense\", \"units\": 3}]}, \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 640," \
	" \"features\": 6, \"classes\": 3}}, \"batch_size\": 32, \"epochs\": 2, \"optimizer\": {\"type\": \"adam\","  \
	" \"lr\": 0.01}}"

/* SMALL_JOB with the value at a JSON pointer (objects only) replaced by
 * `value` (JSON text).  Returns a malloc'd spec. */
static char *small_with(const char *pointer, const char *value)
{
	json_t *doc = json_loads(SMALL_JOB, 0, NULL), *cur = doc;
	char buf[256], *tok, *next;
	cr_assert_not_null(doc);
	snprintf(buf, sizeof buf, "%s", pointer + 1);
	tok = buf;
	while ((next = strchr(tok, '/'))) {
		*next = '\0';
		cur = json_object_get(cur, tok);
		cr_assert_not_null(cur, "no %s in the small job", tok);
		tok = next + 1;
	}
	json_t *v = json_loads(value, JSON_DECODE_ANY, NULL);
	cr_assert_not_null(v, "bad value %.80s", value);
	json_object_set_new(cur, tok, v);
	char *text = json_dumps(doc, JSON_COMPACT);
	json_decref(doc);
	return text;
}

static void expect_error(const struct http_reply *r, long status, const char *code, const char *pointer)
{
	cr_assert_eq(r->status, status, "expected %ld, got %ld: %.300s", status, r->status, r->body);
	json_t *e = json_object_get(r->json, "error");
	cr_assert_str_eq(json_string_value(json_object_get(e, "code")), code, "%.300s", r->body);
	const char *got = json_string_value(json_object_get(e, "pointer"));
	/* No pointer in the body means the request as a whole. */
	cr_assert_str_eq(got ? got : "", pointer, "%.300s", r->body);
}

static void expect_healthy_and_training(void)
{
	struct http_reply r;
	http(&d, "GET", "/healthz", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	http_free(&r);
	long long id = submit_job(&d, SMALL_JOB);
	cr_assert_str_eq(wait_state(&d, id, "completed|failed|cancelled", 60), "completed");
}

static long long job_count(void)
{
	struct http_reply r;
	http(&d, "GET", "/jobs?limit=1000", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200);
	long long n = (long long)json_array_size(json_object_get(r.json, "jobs"));
	http_free(&r);
	return n;
}

Test(bounds, sizes_past_what_the_engine_indexes_are_refused, .init = start, .fini = stop, .timeout = 120)
{
	static const struct {
		const char *pointer, *value;
	} cases[] = {
		/* the attack: 2^62 + 1 samples */
		{"/data/train/samples", "4611686018427387905"},
		{"/data/train/samples", "9223372036854775807"},
		{"/data/train/features", "16777217"},
		{"/data/train/classes", "16777217"},
		{"/data/train/load_cost_us", "1000000000000"},
		{"/batch_size", "1048577"},
		{"/epochs", "1048577"},
		{"/max_steps", "1099511627777"},
		{"/model/inputs", "16777217"},
		{"/checkpoint", "{\"keep\": 1000000}"},
		{"/schedule", "{\"type\": \"step\", \"step_size\": 4611686018427387905}"},
	};
	struct http_reply r;
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char *spec = small_with(cases[i].pointer, cases[i].value);
		http(&d, "POST", "/jobs", spec, NULL, NULL, &r);
		const char *ptr = strcmp(cases[i].pointer, "/checkpoint") == 0 ? "/checkpoint/keep"
				  : strcmp(cases[i].pointer, "/schedule") == 0 ? "/schedule/step_size"
									       : cases[i].pointer;
		expect_error(&r, 400, "invalid_spec", ptr);
		http_free(&r);
		free(spec);
	}
	cr_assert_eq(job_count(), 0, "a refused spec was stored");
	expect_healthy_and_training();
}

/* "processes" (docs/design.md, "Processes and the communicator"): out of
 * range or without exact mode it is a bad spec; a legal count the daemon
 * cannot run (docs/design.md, "Multi-process jobs") is refused too: more
 * devices than it has (processes x devices), or a device list instead of
 * a count per process. */
static void expect_processes_refused(int processes, const char *devices, long status, const char *code,
				     const char *pointer)
{
	json_t *doc = json_loads(SMALL_JOB, 0, NULL);
	json_object_set_new(doc, "exact", json_true());
	json_object_set_new(doc, "processes", json_integer(processes));
	json_object_set_new(doc, "devices", json_loads(devices, JSON_DECODE_ANY, NULL));
	char *spec = json_dumps(doc, JSON_COMPACT);
	json_decref(doc);
	struct http_reply r;
	http(&d, "POST", "/jobs", spec, NULL, NULL, &r);
	expect_error(&r, status, code, pointer);
	http_free(&r);
	free(spec);
}

Test(bounds, processes_the_daemon_cannot_run_are_refused_naming_the_field, .init = start, .fini = stop, .timeout = 120)
{
	static const char *const values[] = {"0", "65", "2", "{\"p\": 2}"};
	struct http_reply r;
	for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
		char *spec = small_with("/processes", values[i]);
		http(&d, "POST", "/jobs", spec, NULL, NULL, &r);
		expect_error(&r, 400, "invalid_spec", "/processes");
		http_free(&r);
		free(spec);
	}
	expect_processes_refused(3, "1", 422, "unsatisfiable", "/processes");
	expect_processes_refused(2, "2", 422, "unsatisfiable", "/processes");
	expect_processes_refused(2, "[0, 1]", 400, "invalid_spec", "/devices");
	cr_assert_eq(job_count(), 0, "a refused spec was stored");
	expect_healthy_and_training();
}

Test(bounds, free_strings_are_bounded, .init = start, .fini = stop, .timeout = 120)
{
	struct http_reply r;
	/* 900 KB of name fits the 1 MiB body cap: it is the name that is
	 * refused, not the body. */
	size_t n = 900 * 1000;
	char *name = malloc(n + 3);
	cr_assert_not_null(name);
	name[0] = '"';
	memset(name + 1, 'n', n);
	name[n + 1] = '"';
	name[n + 2] = '\0';
	char *spec = small_with("/name", name);
	http(&d, "POST", "/jobs", spec, NULL, NULL, &r);
	expect_error(&r, 400, "invalid_spec", "/name");
	cr_assert_lt(r.len, 2000, "the error echoes the name: %zu bytes", r.len);
	http_free(&r);
	free(spec);

	/* 256 bytes is the most; 257 is refused; so is a line break. */
	memset(name + 1, 'n', 256);
	name[257] = '"';
	name[258] = '\0';
	spec = small_with("/name", name);
	long long id = submit_job(&d, spec);
	free(spec);
	name[257] = 'n';
	name[258] = '"';
	name[259] = '\0';
	spec = small_with("/name", name);
	http(&d, "POST", "/jobs", spec, NULL, NULL, &r);
	expect_error(&r, 400, "invalid_spec", "/name");
	http_free(&r);
	free(spec);
	spec = small_with("/name", "\"a\\nforged log line\"");
	http(&d, "POST", "/jobs", spec, NULL, NULL, &r);
	expect_error(&r, 400, "invalid_spec", "/name");
	http_free(&r);
	free(spec);
	free(name);

	/* A path longer than PATH_MAX. */
	char *path = malloc(4100 + 64);
	int len = snprintf(path, 64, "{\"format\": \"csv\", \"path\": \"");
	memset(path + len, 'p', 4097);
	snprintf(path + len + 4097, 16, "\"}");
	spec = small_with("/data/train", path);
	http(&d, "POST", "/jobs", spec, NULL, NULL, &r);
	expect_error(&r, 400, "invalid_spec", "/data/train/path");
	http_free(&r);
	free(spec);
	free(path);

	/* Idempotency keys were bounded already; still are. */
	char header[400] = "Idempotency-Key: ";
	memset(header + strlen(header), 'k', 256);
	http(&d, "POST", "/jobs", SMALL_JOB, NULL, header, &r);
	expect_error(&r, 400, "invalid_parameter", "");
	http_free(&r);

	cr_assert_str_eq(wait_state(&d, id, "completed|failed|cancelled", 60), "completed");
	cr_assert_eq(job_count(), 1);
	expect_healthy_and_training();
}

Test(bounds, job_listing_has_a_default_and_a_maximum_page, .init = start, .fini = stop, .timeout = 120)
{
	long long ids[3];
	for (int i = 0; i < 3; i++)
		ids[i] = submit_job(&d, SMALL_JOB);
	struct http_reply r;
	http(&d, "GET", "/jobs?limit=1001", NULL, NULL, NULL, &r);
	expect_error(&r, 400, "invalid_parameter", "");
	http_free(&r);
	http(&d, "GET", "/jobs?limit=0", NULL, NULL, NULL, &r);
	expect_error(&r, 400, "invalid_parameter", "");
	http_free(&r);
	/* Pages of two: the cursor leads to the rest, and the last page has
	 * none. */
	http(&d, "GET", "/jobs?limit=2", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200);
	cr_assert_eq(json_array_size(json_object_get(r.json, "jobs")), 2);
	char next[64];
	snprintf(next, sizeof next, "/jobs?limit=2&after=%s", json_string_value(json_object_get(r.json, "next")));
	http_free(&r);
	http(&d, "GET", next, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	cr_assert_eq(json_array_size(json_object_get(r.json, "jobs")), 1, "%s", r.body);
	cr_assert(json_is_null(json_object_get(r.json, "next")), "%s", r.body);
	http_free(&r);
	for (int i = 0; i < 3; i++)
		cr_assert_str_eq(wait_state(&d, ids[i], "completed|failed|cancelled", 60), "completed");
}

Test(bounds, metric_step_past_the_store_limit_is_a_400_naming_the_point, .init = start, .fini = stop, .timeout = 60)
{
	long long id = submit_job(&d, SMALL_JOB);
	char path[64];
	snprintf(path, sizeof path, "/jobs/%lld/metrics", id);
	struct http_reply r;
	http(&d, "POST", path,
	     "{\"points\": [{\"name\": \"ok\", \"step\": 1, \"value\": 1},"
	     " {\"name\": \"far\", \"step\": 4611686018427387905, \"value\": 1}]}",
	     NULL, NULL, &r);
	expect_error(&r, 400, "invalid_request", "/points/1/step");
	http_free(&r);
	http(&d, "POST", path,
	     "{\"points\": [{\"name\": \"far\", \"step\": 1, \"epoch\": 9223372036854775807, \"value\": 1}]}", NULL,
	     NULL, &r);
	expect_error(&r, 400, "invalid_request", "/points/0/epoch");
	http_free(&r);
	/* Per-layer monitor names belong to the engine, like grad_norm. */
	http(&d, "POST", path,
	     "{\"points\": [{\"name\": \"bleu\", \"step\": 1, \"value\": 1},"
	     " {\"name\": \"grad_norm.3\", \"step\": 1, \"value\": 1}]}",
	     NULL, NULL, &r);
	expect_error(&r, 400, "invalid_request", "/points/1/name");
	http_free(&r);
	http(&d, "POST", path, "{\"points\": [{\"name\": \"update_ratio.0\", \"step\": 1, \"value\": 1}]}", NULL, NULL,
	     &r);
	expect_error(&r, 400, "invalid_request", "/points/0/name");
	http_free(&r);
	/* 2^62 itself is the store's last step. */
	http(&d, "POST", path, "{\"points\": [{\"name\": \"far\", \"step\": 4611686018427387904, \"value\": 1}]}", NULL,
	     NULL, &r);
	cr_assert_eq(r.status, 202, "%s", r.body);
	http_free(&r);
	cr_assert_str_eq(wait_state(&d, id, "completed|failed|cancelled", 60), "completed");
	expect_healthy_and_training();
}

/* Standardize over 2^40 synthetic samples: a set-up of days that is legal,
 * so it has to answer cancel, delete and shutdown while it runs. */
#define LONG_SETUP_JOB                                                                                         \
	"{\"name\": \"long-setup\", \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 2}]},"           \
	" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 1099511627776, \"features\": 4,"      \
	" \"classes\": 2}, \"transforms\": [{\"type\": \"standardize\"}]}, \"batch_size\": 64, \"epochs\": 1," \
	" \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}, \"devices\": 2}"

static void cancel_job(long long id)
{
	char path[64];
	struct http_reply r;
	snprintf(path, sizeof path, "/jobs/%lld/cancel", id);
	http(&d, "POST", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 202, "%s", r.body);
	http_free(&r);
}

Test(bounds, long_setup_answers_cancel_delete_and_sigterm, .init = start, .fini = stop, .timeout = 180)
{
	long long id = submit_job(&d, LONG_SETUP_JOB);
	cr_assert_str_eq(wait_state(&d, id, "running|completed|failed|cancelled", 20), "running");
	usleep(500 * 1000);
	double t0 = now_s();
	cancel_job(id);
	cr_assert_str_eq(wait_state(&d, id, "cancelled|completed|failed", 10), "cancelled");
	cr_log_info("cancelled in set-up after %.2f s", now_s() - t0);
	char path[64];
	struct http_reply r;
	snprintf(path, sizeof path, "/jobs/%lld", id);
	http(&d, "DELETE", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 204, "%s", r.body);
	http_free(&r);

	/* SIGTERM while a job is in set-up: the grace (1 s) passes, the job is
	 * interrupted, the daemon exits. */
	id = submit_job(&d, LONG_SETUP_JOB);
	cr_assert_str_eq(wait_state(&d, id, "running|completed|failed|cancelled", 20), "running");
	usleep(300 * 1000);
	int status;
	double took = daemon_stop(&d, &status);
	cr_assert_lt(took, 10.0, "SIGTERM took %.1f s", took);
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "exit status %d", status);

	/* After a restart the job starts its set-up again, and still answers. */
	daemon_restart(&d, 2, fast_shutdown);
	cr_assert_str_eq(wait_state(&d, id, "running|completed|failed|cancelled", 20), "running");
	cancel_job(id);
	cr_assert_str_eq(wait_state(&d, id, "cancelled|completed|failed", 10), "cancelled");
	expect_healthy_and_training();
}

/* ---- stop_on_nan through the daemon ------------------------------------- */

/* A float32 .npy of rows x cols (cols 0: a vector) in the data root. */
static void write_npy(const char *name, const float *v, int rows, int cols)
{
	char path[256], header[128];
	snprintf(path, sizeof path, "%s/%s", d.dir, name);
	int n = cols ? snprintf(header, sizeof header, "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }",
				rows, cols)
		     : snprintf(header, sizeof header, "{'descr': '<f4', 'fortran_order': False, 'shape': (%d,), }",
				rows);
	int total = 10 + n + 1, pad = (64 - total % 64) % 64;
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f);
	unsigned short hlen = (unsigned short)(n + pad + 1);
	fwrite("\x93NUMPY\x01\x00", 1, 8, f);
	fputc(hlen & 0xff, f);
	fputc(hlen >> 8, f);
	fwrite(header, 1, (size_t)n, f);
	for (int i = 0; i < pad; i++)
		fputc(' ', f);
	fputc('\n', f);
	fwrite(v, sizeof(float), (size_t)rows * (size_t)(cols ? cols : 1), f);
	fclose(f);
}

/* Sample 10 has features of 1e30: finite, but its weight gradient
 * overflows float in step 3 (batch 4, no shuffle).  The job fails there,
 * naming the step and 0.weight, and no checkpoint follows step 2. */
Test(bounds, stop_on_nan_fails_at_the_step_and_keeps_good_checkpoints, .init = start, .fini = stop, .timeout = 60)
{
	float x[40 * 3], y[40];
	for (int i = 0; i < 40; i++) {
		for (int j = 0; j < 3; j++)
			x[i * 3 + j] = i == 10 ? 1e30f : (float)((i * 7 + j) % 5) - 2.0f;
		y[i] = (float)(i % 3);
	}
	write_npy("nan_x.npy", x, 40, 3);
	write_npy("nan_y.npy", y, 40, 0);
	long long id = submit_job(
		&d,
		"{\"name\": \"blows-up\", \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 1}], \"loss\": \"mse\"},"
		" \"data\": {\"train\": {\"format\": \"npy\", \"x\": \"nan_x.npy\", \"y\": \"nan_y.npy\"},"
		" \"shuffle\": false}, \"batch_size\": 4, \"epochs\": 1, \"optimizer\": {\"type\": \"adam\", \"lr\": 0.01},"
		" \"checkpoint\": {\"every_steps\": 1, \"keep\": 10}}");
	cr_assert_str_eq(wait_state(&d, id, "completed|failed|cancelled", 30), "failed");
	char path[96];
	struct http_reply r;
	snprintf(path, sizeof path, "/jobs/%lld", id);
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	json_t *e = json_object_get(r.json, "error");
	const char *msg = json_string_value(json_object_get(e, "message"));
	cr_assert_not_null(msg, "%s", r.body);
	cr_log_info("%s", msg);
	cr_assert_not_null(strstr(msg, "step 3:"), "%s", msg);
	cr_assert_not_null(strstr(msg, "0.weight"), "%s", msg);
	cr_assert_eq(json_integer_value(json_object_get(e, "step")), 3, "%s", r.body);
	http_free(&r);

	snprintf(path, sizeof path, "/jobs/%lld/checkpoints", id);
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	json_t *list = json_object_get(r.json, "checkpoints"), *c;
	size_t i;
	cr_assert_gt(json_array_size(list), 0, "no good checkpoint kept: %s", r.body);
	json_array_foreach(list, i, c)
		cr_assert_leq(json_integer_value(json_object_get(c, "step")), 2, "a checkpoint after the bad step: %s",
			      r.body);
	http_free(&r);
	expect_healthy_and_training();
}

/* Queued jobs per daemon (--max-queued-jobs): a submit past the bound is
 * 503 queue_full with nothing stored, a retried submit with a stored key
 * still gets its job, and the queue takes jobs again once one starts. */
#define BLOCKER_JOB                                                                                           \
	"{\"name\": \"blocker\", \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 2}]}, \"data\":"   \
	" {\"train\": {\"format\": \"synthetic\", \"samples\": 100000000, \"features\": 4, \"classes\": 2}}," \
	" \"batch_size\": 8, \"epochs\": 1, \"devices\": \"all\", \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}"

Test(bounds, queued_jobs_past_the_bound_are_refused, .fini = stop, .timeout = 120)
{
	static const char *const limit[] = {"--shutdown-grace", "1", "--max-queued-jobs", "2", NULL};
	daemon_start(&d, 2, limit);
	long long blocker = submit_job(&d, BLOCKER_JOB);
	cr_assert_str_eq(wait_state(&d, blocker, "running", 30), "running");
	submit_job(&d, SMALL_JOB);
	struct http_reply r;
	http(&d, "POST", "/jobs", SMALL_JOB, NULL, "Idempotency-Key: second", &r);
	cr_assert_eq(r.status, 201, "%ld %s", r.status, r.body);
	http_free(&r);

	http(&d, "POST", "/jobs", SMALL_JOB, NULL, NULL, &r);
	cr_assert_eq(r.status, 503, "%ld %s", r.status, r.body);
	cr_assert(strstr(r.body, "\"queue_full\"") && strstr(r.body, "max-queued-jobs"), "%s", r.body);
	http_free(&r);
	/* Nothing was stored for the refused submit. */
	http(&d, "GET", "/jobs?state=queued", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200);
	cr_assert(strstr(r.body, "\"id\":4") == NULL, "%s", r.body);
	http_free(&r);
	/* A retry of a stored submit is its job, full queue or not. */
	http(&d, "POST", "/jobs", SMALL_JOB, NULL, "Idempotency-Key: second", &r);
	cr_assert(r.status == 200 || r.status == 201, "%ld %s", r.status, r.body);
	cr_assert(strstr(r.body, "\"id\":3"), "%s", r.body);
	http_free(&r);

	/* Room again once the blocker is gone and a queued job starts. */
	char url[64];
	snprintf(url, sizeof url, "/jobs/%lld/cancel", blocker);
	http(&d, "POST", url, NULL, NULL, NULL, &r);
	http_free(&r);
	cr_assert_str_eq(wait_state(&d, blocker, "cancelled", 30), "cancelled");
	const char *st = wait_state(&d, 2, "running|completed", 30);
	cr_assert(strcmp(st, "running") == 0 || strcmp(st, "completed") == 0, "job 2 is %s", st);
	http(&d, "POST", "/jobs", SMALL_JOB, NULL, NULL, &r);
	cr_assert_eq(r.status, 201, "%ld %s", r.status, r.body);
	http_free(&r);
}
