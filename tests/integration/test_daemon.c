/* The daemon over HTTP: a real `trainerd serve` on an ephemeral port.
 * Job lifecycle, metrics, logs, SSE with resumption, bad requests,
 * concurrency with priorities on shared devices, and SIGTERM. */
#include <criterion/criterion.h>
#include <curl/curl.h>
#include <math.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

/* ~1-2 s of training with visible progress: 40 steps, loading costs 10 ms
 * a step. */
#define SMALL_JOB(name, extra)                                                                                 \
	"{\"name\": \"" name "\", \"seed\": 3, \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 16}," \
	" {\"type\": \"relu\"}, {\"type\": \"dense\", \"units\": 3}]}, \"data\": {\"train\": {\"format\":"     \
	" \"synthetic\", \"samples\": 640, \"features\": 6, \"classes\": 3, \"load_cost_us\": 300},"           \
	" \"validation_split\": 0.1}, \"batch_size\": 32, \"epochs\": 2, \"optimizer\": {\"type\": \"adam\","  \
	" \"lr\": 0.01}, \"prefetch\": {\"workers\": 2, \"depth\": 2}" extra "}"

static struct daemon d;

/* SMALL_JOB with top-level keys replaced (JSON object text). */
static const char *spec_with(const char *overrides)
{
	static char out[8][4096];
	static int next;
	json_t *base = json_loads(SMALL_JOB("x", ""), 0, NULL);
	json_t *over = json_loads(overrides, 0, NULL);
	cr_assert_not_null(over, "bad override %s", overrides);
	json_object_update(base, over);
	char *text = json_dumps(base, JSON_COMPACT);
	char *slot = out[next++ % 8];
	snprintf(slot, sizeof out[0], "%s", text);
	free(text);
	json_decref(base);
	json_decref(over);
	return slot;
}

static void start1(void)
{
	daemon_start(&d, 2, NULL);
}

static void stop1(void)
{
	daemon_cleanup(&d);
}

/* ---- SSE ---------------------------------------------------------------- */

struct sse_event {
	long long id;
	char type[16];
	char *data;
};

struct sse_stream {
	char *buf;
	size_t len;
	struct sse_event ev[20000];
	int n;
};

static size_t sse_body(char *p, size_t size, size_t n, void *ud)
{
	struct sse_stream *s = ud;
	size_t len = size * n;
	s->buf = realloc(s->buf, s->len + len + 1);
	memcpy(s->buf + s->len, p, len);
	s->len += len;
	s->buf[s->len] = 0;
	return len;
}

/* Reads /jobs/{id}/events for at most ms milliseconds (0 = until the
 * server ends the stream) and parses the complete frames. */
static void sse_read_query(long long job, const char *query, long long last_id, long ms, struct sse_stream *s)
{
	memset(s, 0, sizeof *s);
	char path[160], hdr[64];
	const char *hdrs[] = {hdr, NULL};
	snprintf(path, sizeof path, "/jobs/%lld/events%s", job, query);
	snprintf(hdr, sizeof hdr, "Last-Event-ID: %lld", last_id);
	/* Read until the time is up is the usual end here: the result is
	 * not checked, the frames are. */
	CURLcode rc;
	struct tr_test_request rq = {.base_url = d.base_url,
				     .method = "GET",
				     .path = path,
				     .headers = last_id > 0 ? hdrs : NULL,
				     .recv_fn = sse_body,
				     .recv_cls = s,
				     .timeout_ms = ms ? ms : 60000L,
				     .result = &rc};
	struct tr_test_reply r;
	tr_test_http(&rq, &r);
	tr_test_reply_free(&r);
	/* Only frames terminated by a blank line count: a cut-off frame is
	 * exactly what Last-Event-ID resumption must re-send. */
	char *p = s->buf;
	while (p && *p) {
		char *end = strstr(p, "\n\n");
		if (!end)
			break;
		*end = 0;
		struct sse_event e = {0};
		bool has_id = false;
		for (char *line = strtok(p, "\n"); line; line = strtok(NULL, "\n")) {
			if (strncmp(line, "id: ", 4) == 0) {
				e.id = atoll(line + 4);
				has_id = true;
			} else if (strncmp(line, "event: ", 7) == 0) {
				snprintf(e.type, sizeof e.type, "%s", line + 7);
			} else if (strncmp(line, "data: ", 6) == 0) {
				e.data = strdup(line + 6);
			}
		}
		if (has_id && s->n < 20000)
			s->ev[s->n++] = e;
		else
			free(e.data);
		p = end + 2;
	}
}

static void sse_read(long long job, long long last_id, long ms, struct sse_stream *s)
{
	sse_read_query(job, "", last_id, ms, s);
}

static void sse_free(struct sse_stream *s)
{
	for (int i = 0; i < s->n; i++)
		free(s->ev[i].data);
	free(s->buf);
}

static int count_points(const struct sse_stream *s, const char *name)
{
	int n = 0;
	for (int i = 0; i < s->n; i++) {
		if (strcmp(s->ev[i].type, "metrics") != 0)
			continue;
		json_t *j = json_loads(s->ev[i].data, 0, NULL);
		json_t *pts = json_object_get(j, "points");
		size_t k;
		json_t *pt;
		json_array_foreach(pts, k, pt) {
			if (strcmp(json_string_value(json_object_get(pt, "name")), name) == 0)
				n++;
		}
		json_decref(j);
	}
	return n;
}

Test(daemon, lifecycle_metrics_logs_and_sse, .init = start1, .fini = stop1, .timeout = 120)
{
	long long id =
		submit_job(&d, SMALL_JOB("life", ", \"monitors\": [{\"metric\": \"grad_norm\", \"every_steps\": 5}]"));
	cr_assert_str_eq(wait_state(&d, id, "running|completed", 20), "running");

	/* Watch the live stream for a while, then drop the connection. */
	struct sse_stream first;
	sse_read(id, 0, 700, &first);
	cr_assert_gt(first.n, 0, "no events in the first 700 ms");
	cr_assert_str_eq(first.ev[0].type, "state");

	/* Metrics and logs are readable during the run. */
	char path[128];
	struct http_reply r;
	snprintf(path, sizeof path, "/jobs/%lld/metrics?names=loss", id);
	double t0 = now_s();
	int during = 0;
	while (now_s() - t0 < 10 && during == 0) {
		http(&d, "GET", path, NULL, NULL, NULL, &r);
		cr_assert_eq(r.status, 200, "%s", r.body);
		during = (int)json_array_size(
			json_object_get(json_object_get(json_object_get(r.json, "series"), "loss"), "steps"));
		http_free(&r);
		usleep(100000);
	}
	cr_assert_gt(during, 0, "no loss points visible while running");

	/* Resume exactly after the last complete frame we saw. */
	struct sse_stream rest;
	sse_read(id, first.ev[first.n - 1].id, 0, &rest);
	cr_assert_str_eq(wait_state(&d, id, "completed|failed|cancelled", 60), "completed");

	struct sse_stream all;
	sse_read(id, 0, 0, &all);
	cr_assert_eq(first.n + rest.n, all.n, "%d + %d events after resuming, %d in a full replay", first.n, rest.n,
		     all.n);
	for (int i = 0; i < all.n; i++) {
		const struct sse_event *e = i < first.n ? &first.ev[i] : &rest.ev[i - first.n];
		cr_assert_eq(e->id, all.ev[i].id, "event %d: id %lld vs %lld", i, e->id, all.ev[i].id);
		if (i > 0)
			cr_assert_gt(all.ev[i].id, all.ev[i - 1].id);
	}
	cr_assert_str_eq(all.ev[all.n - 1].type, "state");
	cr_assert_not_null(strstr(all.ev[all.n - 1].data, "completed"));

	/* Every step's loss arrived through SSE exactly once: 576 training
	 * samples / 32 = 18 steps an epoch, 2 epochs. */
	cr_assert_eq(count_points(&all, "loss"), 36);
	cr_assert_eq(count_points(&all, "grad_norm"), 7);
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	json_t *loss = json_object_get(json_object_get(r.json, "series"), "loss");
	cr_assert_eq(json_array_size(json_object_get(loss, "steps")), 36);
	cr_assert_eq(json_integer_value(json_array_get(json_object_get(loss, "steps"), 35)), 36);
	http_free(&r);

	snprintf(path, sizeof path, "/jobs/%lld", id);
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	json_t *prog = json_object_get(r.json, "progress");
	cr_assert_eq(json_integer_value(json_object_get(prog, "step")), 36);
	cr_assert(json_is_null(json_object_get(r.json, "error")));
	cr_assert_eq(json_array_size(json_object_get(r.json, "devices")), 1);
	http_free(&r);

	snprintf(path, sizeof path, "/jobs/%lld/logs", id);
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200);
	cr_assert_not_null(strstr(r.body, "submitted"), "%s", r.body);
	cr_assert_not_null(strstr(r.body, "started on"), "%s", r.body);
	http_free(&r);

	/* Downsampling keeps at most max_points and the extremes. */
	snprintf(path, sizeof path, "/jobs/%lld/metrics?names=loss&max_points=10", id);
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	json_t *ds = json_object_get(json_object_get(json_object_get(r.json, "series"), "loss"), "values");
	cr_assert_leq(json_array_size(ds), 10);
	cr_assert_gt(json_array_size(ds), 0);
	http_free(&r);
	sse_free(&first);
	sse_free(&rest);
	sse_free(&all);
}

/* types= leaves out the other event types (the dashboard's stream has no
 * metrics events: it polls the curves downsampled), keeps every state
 * event, resumes by the same ids, and names a wrong word. */
Test(daemon, sse_types_filter, .init = start1, .fini = stop1, .timeout = 120)
{
	long long id = submit_job(&d, SMALL_JOB("types", ""));
	cr_assert_str_eq(wait_state(&d, id, "completed|failed|cancelled", 60), "completed");

	struct sse_stream all, some, after;
	sse_read(id, 0, 0, &all);
	sse_read_query(id, "?types=log", 0, 0, &some);
	int states = 0, logs = 0, metrics = 0, k = 0;
	for (int i = 0; i < all.n; i++) {
		if (strcmp(all.ev[i].type, "metrics") == 0) {
			metrics++;
			continue;
		}
		states += strcmp(all.ev[i].type, "state") == 0;
		logs += strcmp(all.ev[i].type, "log") == 0;
		/* The filtered stream holds exactly the others, in order. */
		cr_assert_lt(k, some.n, "event %lld (%s) missing from the filtered stream", all.ev[i].id,
			     all.ev[i].type);
		cr_assert_eq(some.ev[k].id, all.ev[i].id, "filtered event %d: id %lld, want %lld", k, some.ev[k].id,
			     all.ev[i].id);
		cr_assert_str_eq(some.ev[k].type, all.ev[i].type);
		k++;
	}
	cr_assert_gt(metrics, 0, "the job wrote no metrics events");
	cr_assert_gt(states, 1);
	cr_assert_gt(logs, 0);
	cr_assert_eq(k, some.n, "%d events in the filtered stream, %d expected", some.n, k);
	cr_assert_str_eq(some.ev[some.n - 1].type, "state", "the stream still ends with the terminal state");

	/* Resuming a filtered stream past a metrics event's id. */
	long long mid = 0;
	for (int i = 0; i < all.n && !mid; i++)
		if (strcmp(all.ev[i].type, "metrics") == 0)
			mid = all.ev[i].id;
	sse_read_query(id, "?types=state,metrics", mid, 0, &after);
	cr_assert_gt(after.n, 0);
	for (int i = 0; i < after.n; i++) {
		cr_assert_gt(after.ev[i].id, mid);
		cr_assert(strcmp(after.ev[i].type, "log") != 0, "a log event in a state,metrics stream");
	}
	sse_free(&all);
	sse_free(&some);
	sse_free(&after);

	struct http_reply r;
	char path[128];
	snprintf(path, sizeof path, "/jobs/%lld/events?types=state,points", id);
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 400, "%ld %s", r.status, r.body);
	cr_assert_not_null(strstr(r.body, "types: \\\"points\\\""), "%s", r.body);
	http_free(&r);
}

Test(daemon, custom_monitor_points, .init = start1, .fini = stop1, .timeout = 60)
{
	long long id = submit_job(&d, SMALL_JOB("mon", ""));
	char path[128];
	snprintf(path, sizeof path, "/jobs/%lld/metrics", id);
	struct http_reply r;
	http(&d, "POST", path,
	     "{\"points\": [{\"name\": \"bleu\", \"step\": 1, \"value\": 0.25},"
	     " {\"name\": \"bleu\", \"step\": 2, \"value\": 0.5}]}",
	     NULL, NULL, &r);
	cr_assert_eq(r.status, 202, "%ld %s", r.status, r.body);
	http_free(&r);
	snprintf(path, sizeof path, "/jobs/%lld/metrics?names=bleu", id);
	double t0 = now_s();
	size_t n = 0;
	while (n < 2 && now_s() - t0 < 3) {
		http(&d, "GET", path, NULL, NULL, NULL, &r);
		n = json_array_size(
			json_object_get(json_object_get(json_object_get(r.json, "series"), "bleu"), "values"));
		http_free(&r);
		usleep(50000);
	}
	cr_assert_eq(n, 2, "pushed points not readable within 3 s");

	/* The same query again, answered from the cache, must still see a
	 * point pushed after it was cached. */
	snprintf(path, sizeof path, "/jobs/%lld/metrics", id);
	http(&d, "POST", path, "{\"points\": [{\"name\": \"bleu\", \"step\": 3, \"value\": 0.75}]}", NULL, NULL, &r);
	cr_assert_eq(r.status, 202, "%ld %s", r.status, r.body);
	http_free(&r);
	snprintf(path, sizeof path, "/jobs/%lld/metrics?names=bleu", id);
	t0 = now_s();
	while (n < 3 && now_s() - t0 < 3) {
		http(&d, "GET", path, NULL, NULL, NULL, &r);
		n = json_array_size(
			json_object_get(json_object_get(json_object_get(r.json, "series"), "bleu"), "values"));
		http_free(&r);
		usleep(50000);
	}
	cr_assert_eq(n, 3, "a cached answer hid a newer point");
}

/* ---- bad requests --------------------------------------------------------- */

struct bad {
	const char *method, *path, *body, *ctype, *header;
	long status;
	const char *code;
};

Test(daemon, bad_requests_get_clear_errors, .init = start1, .fini = stop1, .timeout = 120)
{
	long long id = submit_job(&d, SMALL_JOB("target", ""));
	cr_assert_str_eq(wait_state(&d, id, "completed|failed", 60), "completed");
	char big[1200000];
	memset(big, ' ', sizeof big - 1);
	big[0] = '{';
	big[sizeof big - 3] = '}';
	big[sizeof big - 2] = 0;
	char jp[64], jm[64], jc[64];
	snprintf(jp, sizeof jp, "/jobs/%lld", id);
	snprintf(jm, sizeof jm, "/jobs/%lld/metrics", id);
	snprintf(jc, sizeof jc, "/jobs/%lld/cancel", id);
	struct bad cases[] = {
		{"POST", "/jobs", "{\"seed\": ", NULL, NULL, 400, "invalid_json"},
		{"POST", "/jobs", "[1, 2]", NULL, NULL, 400, NULL},
		{"POST", "/jobs", "{}", "text/plain", NULL, 415, "unsupported_media_type"},
		{"POST", "/jobs", big, NULL, NULL, 413, "payload_too_large"},
		{"POST", "/jobs", spec_with("{\"colour\": 1}"), NULL, NULL, 400, "invalid_spec"},
		{"POST", "/jobs", spec_with("{\"batch_size\": -4}"), NULL, NULL, 400, "invalid_spec"},
		{"POST", "/jobs", spec_with("{\"epochs\": \"ten\"}"), NULL, NULL, 400, "invalid_spec"},
		{"POST", "/jobs", SMALL_JOB("x", ", \"devices\": 3"), NULL, NULL, 422, "unsatisfiable"},
		{"POST", "/jobs", SMALL_JOB("x", ", \"devices\": [0, 5]"), NULL, NULL, 422, "unsatisfiable"},
		{"POST", "/jobs", SMALL_JOB("x", ", \"backend\": \"cuda\""), NULL, NULL, 422, "backend_unavailable"},
		{"POST", "/jobs",
		 "{\"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 2}]}, \"data\": {\"train\": {\"format\":"
		 " \"csv\", \"path\": \"../../etc/passwd\"}}, \"batch_size\": 4, \"epochs\": 1, \"optimizer\":"
		 " {\"type\": \"sgd\", \"lr\": 0.1}}",
		 NULL, NULL, 422, "invalid_path"},
		{"POST", "/jobs",
		 "{\"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 2}]}, \"data\": {\"train\": {\"format\":"
		 " \"csv\", \"path\": \"missing.csv\"}}, \"batch_size\": 4, \"epochs\": 1, \"optimizer\":"
		 " {\"type\": \"sgd\", \"lr\": 0.1}}",
		 NULL, NULL, 422, "invalid_path"},
		{"GET", "/jobs/999999", NULL, NULL, NULL, 404, "not_found"},
		{"GET", "/jobs/abc", NULL, NULL, NULL, 400, NULL},
		{"POST", "/jobs/999999/cancel", NULL, NULL, NULL, 404, "not_found"},
		{"POST", jc, NULL, NULL, NULL, 409, "conflict"},
		{"GET", "/jobs?limit=0", NULL, NULL, NULL, 400, "invalid_parameter"},
		{"GET", "/jobs?limit=abc", NULL, NULL, NULL, 400, "invalid_parameter"},
		{"GET", "/jobs?state=sleeping", NULL, NULL, NULL, 400, "invalid_parameter"},
		{"GET", "/jobs?after=-3", NULL, NULL, NULL, 400, "invalid_parameter"},
		{"GET", "/jobs/1/metrics?max_points=-1", NULL, NULL, NULL, 400, "invalid_parameter"},
		{"GET", "/jobs/1/metrics?from_step=10&to_step=5", NULL, NULL, NULL, 400, "invalid_parameter"},
		{"PATCH", jp, "{\"priority\": \"high\"}", NULL, NULL, 400, NULL},
		{"PATCH", jp, "{\"prio\": 1}", NULL, NULL, 400, NULL},
		{"POST", jm, "{\"points\": [{\"name\": \"loss\", \"step\": 1, \"value\": 1}]}", NULL, NULL, 400, NULL},
		{"POST", jm, "{\"points\": [{\"name\": \"a b\", \"step\": 1, \"value\": 1}]}", NULL, NULL, 400, NULL},
		{"POST", jm, "{\"points\": [{\"name\": \"ok\", \"step\": -1, \"value\": 1}]}", NULL, NULL, 400, NULL},
		{"POST", jm, "{\"points\": []}", NULL, NULL, 400, NULL},
		{"DELETE", "/jobs/999999", NULL, NULL, NULL, 404, "not_found"},
		{"GET", "/nowhere", NULL, NULL, NULL, 404, "not_found"},
		{"DELETE", "/healthz", NULL, NULL, NULL, 405, "method_not_allowed"},
		{"POST", "/jobs/1/pause", NULL, NULL, NULL, 0, NULL}, /* 409 or 501: never 2xx for a finished job */
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		struct bad *b = &cases[i];
		struct http_reply r;
		http(&d, b->method, b->path, b->body, b->ctype, b->header, &r);
		if (b->status)
			cr_expect_eq(r.status, b->status, "case %zu: %s %s -> %ld %s", i, b->method, b->path, r.status,
				     r.body);
		else
			cr_expect_geq(r.status, 400, "case %zu: %s %s -> %ld", i, b->method, b->path, r.status);
		json_t *err = json_object_get(r.json, "error");
		cr_expect(json_is_object(err), "case %zu: no error object in %s", i, r.body);
		cr_expect(json_is_string(json_object_get(err, "message")), "case %zu: no message", i);
		if (b->code)
			cr_expect_str_eq(json_string_value(json_object_get(err, "code")), b->code, "case %zu: %s", i,
					 r.body);
		http_free(&r);
	}
	/* A spec error names its JSON pointer. */
	struct http_reply r;
	http(&d, "POST", "/jobs", spec_with("{\"optimizer\": {\"type\": \"sgd\", \"lr\": 0}}"), NULL, NULL, &r);
	cr_assert_eq(r.status, 400);
	cr_assert_str_eq(json_string_value(json_object_get(json_object_get(r.json, "error"), "pointer")),
			 "/optimizer/lr");
	http_free(&r);
	/* Idempotency: same key and body -> same job; another body -> 409. */
	const char *key = "Idempotency-Key: abc-123";
	http(&d, "POST", "/jobs", SMALL_JOB("idem", ""), NULL, key, &r);
	cr_assert_eq(r.status, 201);
	long long first = json_integer_value(json_object_get(r.json, "id"));
	http_free(&r);
	http(&d, "POST", "/jobs", SMALL_JOB("idem", ""), NULL, key, &r);
	cr_assert_lt(r.status, 300);
	cr_assert_eq(json_integer_value(json_object_get(r.json, "id")), first);
	http_free(&r);
	http(&d, "POST", "/jobs", SMALL_JOB("idem2", ""), NULL, key, &r);
	cr_assert_eq(r.status, 409);
	http_free(&r);
	/* Still healthy. */
	http(&d, "GET", "/healthz", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200);
	http_free(&r);
}

/* ---- concurrency --------------------------------------------------------- */

#define NJOBS 30
#define NCLIENTS 50

static long long job_ids[NJOBS];
static int job_prio[NJOBS];

struct client {
	int index;
};

static void *client_main(void *arg)
{
	struct client *c = arg;
	if (c->index < NJOBS) {
		static const int prios[] = {-5, 0, 5, 10};
		int p = prios[(c->index * 7) % 4];
		bool two = c->index % 5 == 0;
		char body[2048], path[64];
		snprintf(body, sizeof body,
			 "{\"name\": \"c%d\", \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 2}]},"
			 " \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 64, \"features\": 3,"
			 " \"classes\": 2, \"load_cost_us\": 500}}, \"batch_size\": 16, \"epochs\": 2,"
			 " \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}, \"devices\": %d}",
			 c->index, two ? 2 : 1);
		snprintf(path, sizeof path, "/jobs?priority=%d", p);
		struct http_reply r;
		http(&d, "POST", path, body, NULL, NULL, &r);
		if (r.status == 201) {
			job_ids[c->index] = json_integer_value(json_object_get(r.json, "id"));
			job_prio[c->index] = p;
		}
		http_free(&r);
	} else {
		/* Dashboards: bounded polling while jobs are submitted. */
		for (int i = 0; i < 20; i++) {
			struct http_reply r;
			http(&d, "GET", i % 2 ? "/jobs?limit=50" : "/devices", NULL, NULL, NULL, &r);
			http_free(&r);
		}
	}
	return NULL;
}

static double parse_time(json_t *v)
{
	const char *s = json_string_value(v);
	if (!s)
		return NAN;
	struct tm tm = {0};
	int ms = 0;
	if (sscanf(s, "%d-%d-%dT%d:%d:%d.%dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
		   &tm.tm_sec, &ms) < 6)
		return NAN;
	tm.tm_year -= 1900;
	tm.tm_mon -= 1;
	return (double)timegm(&tm) + ms / 1000.0;
}

/* A refused spec lists every problem at its pointer ("errors"), the first
 * being "error"'s; a job says whether its state is an end ("terminal", in
 * its state events too) and the loader threads its trainer resolved
 * ("loader_threads": the spec's prefetch.workers, or the default 2). */
Test(daemon, spec_problems_terminal_and_loader_threads, .init = start1, .fini = stop1, .timeout = 120)
{
	struct http_reply r;
	http(&d, "POST", "/jobs", spec_with("{\"batch_size\": -4, \"prefetch\": {\"workers\": 0}}"), NULL, NULL, &r);
	cr_assert_eq(r.status, 400, "%s", r.body);
	json_t *err = json_object_get(r.json, "error"), *errors = json_object_get(r.json, "errors");
	cr_expect_str_eq(json_string_value(json_object_get(err, "code")), "invalid_spec");
	cr_expect_str_eq(json_string_value(json_object_get(err, "pointer")), "/batch_size");
	cr_assert_eq(json_array_size(errors), 2, "%s", r.body);
	cr_expect_str_eq(json_string_value(json_object_get(json_array_get(errors, 0), "pointer")), "/batch_size");
	cr_expect_str_eq(json_string_value(json_object_get(json_array_get(errors, 0), "message")),
			 json_string_value(json_object_get(err, "message")));
	cr_expect_str_eq(json_string_value(json_object_get(json_array_get(errors, 1), "pointer")), "/prefetch/workers");
	http_free(&r);
	/* One problem: a list of one. */
	http(&d, "POST", "/jobs", spec_with("{\"colour\": 1}"), NULL, NULL, &r);
	cr_assert_eq(r.status, 400);
	errors = json_object_get(r.json, "errors");
	cr_assert_eq(json_array_size(errors), 1, "%s", r.body);
	cr_expect_str_eq(json_string_value(json_object_get(json_array_get(errors, 0), "pointer")), "/colour");
	http_free(&r);

	json_t *doc = json_loads(SMALL_JOB("default-loaders", ""), 0, NULL);
	json_object_del(doc, "prefetch");
	char *text = json_dumps(doc, JSON_COMPACT);
	long long ids[2] = {submit_job(&d, text), submit_job(&d, spec_with("{\"prefetch\": {\"workers\": 3}}"))};
	free(text);
	json_decref(doc);
	const long want[2] = {2, 3};
	char path[64];
	for (int i = 0; i < 2; i++) {
		cr_assert_str_eq(wait_state(&d, ids[i], "completed|failed", 60), "completed");
		snprintf(path, sizeof path, "/jobs/%lld", ids[i]);
		http(&d, "GET", path, NULL, NULL, NULL, &r);
		cr_expect(json_is_true(json_object_get(r.json, "terminal")), "%s", r.body);
		cr_expect_eq(json_integer_value(json_object_get(r.json, "loader_threads")), want[i], "%s", r.body);
		http_free(&r);
	}
	struct sse_stream ev;
	sse_read(ids[0], 0, 0, &ev);
	int ends = 0, others = 0;
	for (int i = 0; i < ev.n; i++) {
		if (strcmp(ev.ev[i].type, "state") != 0)
			continue;
		json_t *data = json_loads(ev.ev[i].data, 0, NULL);
		bool end = strcmp(json_string_value(json_object_get(data, "state")), "completed") == 0;
		cr_expect(json_is_boolean(json_object_get(data, "terminal")), "%s", ev.ev[i].data);
		cr_expect_eq(json_is_true(json_object_get(data, "terminal")), end, "%s", ev.ev[i].data);
		ends += end;
		others += !end;
		json_decref(data);
	}
	cr_expect_eq(ends, 1);
	cr_expect_geq(others, 2, "queued and running");
	sse_free(&ev);
	/* The list's jobs carry terminal too. */
	http(&d, "GET", "/jobs?fields=terminal,loader_threads", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	cr_expect(json_is_true(json_object_get(json_array_get(json_object_get(r.json, "jobs"), 0), "terminal")), "%s",
		  r.body);
	http_free(&r);
}

Test(daemon, fifty_clients_thirty_jobs_two_devices, .init = start1, .fini = stop1, .timeout = 240)
{
	/* A blocker holds both devices so the whole queue forms before anything
	 * else starts; then the order of starts is the queue order. */
	long long blocker = submit_job(
		&d,
		"{\"name\": \"blocker\", \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 2}]},"
		" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 100000, \"features\": 3, \"classes\": 2,"
		" \"load_cost_us\": 100}}, \"batch_size\": 16, \"epochs\": 5, \"optimizer\": {\"type\": \"sgd\","
		" \"lr\": 0.1}, \"devices\": 2}");
	cr_assert_str_eq(wait_state(&d, blocker, "running", 20), "running");

	pthread_t th[NCLIENTS];
	struct client cl[NCLIENTS];
	for (int i = 0; i < NCLIENTS; i++) {
		cl[i].index = i;
		pthread_create(&th[i], NULL, client_main, &cl[i]);
	}
	for (int i = 0; i < NCLIENTS; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < NJOBS; i++)
		cr_assert_gt(job_ids[i], 0, "job %d was not accepted", i);

	char path[64];
	snprintf(path, sizeof path, "/jobs/%lld/cancel", blocker);
	struct http_reply r;
	http(&d, "POST", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 202, "%s", r.body);
	http_free(&r);

	double start[NJOBS], end[NJOBS];
	int devs[NJOBS][2], ndevs[NJOBS];
	for (int i = 0; i < NJOBS; i++) {
		cr_assert_str_eq(wait_state(&d, job_ids[i], "completed|failed|cancelled", 120), "completed", "job %d",
				 i);
		snprintf(path, sizeof path, "/jobs/%lld", job_ids[i]);
		http(&d, "GET", path, NULL, NULL, NULL, &r);
		start[i] = parse_time(json_object_get(r.json, "started_at"));
		end[i] = parse_time(json_object_get(r.json, "finished_at"));
		json_t *dv = json_object_get(r.json, "devices");
		ndevs[i] = (int)json_array_size(dv);
		for (int k = 0; k < ndevs[i] && k < 2; k++)
			devs[i][k] = (int)json_integer_value(json_array_get(dv, (size_t)k));
		http_free(&r);
		cr_assert(isfinite(start[i]) && isfinite(end[i]), "job %d has no start/finish time", i);
		cr_assert_eq(ndevs[i], i % 5 == 0 ? 2 : 1);

		/* Exactly one run: one "running" state event in its history. */
		snprintf(path, sizeof path, "/jobs/%lld/events", job_ids[i]);
		http(&d, "GET", path, NULL, NULL, NULL, &r);
		int runs = 0;
		for (char *p = r.body; (p = strstr(p, "\"state\":\"running\"")) != NULL; p++)
			runs++;
		cr_assert_eq(runs, 1, "job %d ran %d times", i, runs);
		http_free(&r);
	}
	/* Never two jobs on one device at once. */
	for (int a = 0; a < NJOBS; a++)
		for (int b = a + 1; b < NJOBS; b++)
			for (int x = 0; x < ndevs[a]; x++)
				for (int y = 0; y < ndevs[b]; y++)
					if (devs[a][x] == devs[b][y])
						cr_assert(end[a] <= start[b] + 1e-3 || end[b] <= start[a] + 1e-3,
							  "jobs %d and %d overlap on device %d", a, b, devs[a][x]);
	/* Queue order: higher priority first, then submission order. */
	for (int a = 0; a < NJOBS; a++)
		for (int b = 0; b < NJOBS; b++)
			if (job_prio[a] > job_prio[b] || (job_prio[a] == job_prio[b] && job_ids[a] < job_ids[b]))
				cr_assert_leq(start[a], start[b] + 1e-3,
					      "job %lld (prio %d) started after job %lld (prio %d)", job_ids[a],
					      job_prio[a], job_ids[b], job_prio[b]);
}

/* ---- SIGTERM -------------------------------------------------------------- */

static int sql_count(const char *db, const char *sql)
{
	sqlite3 *h;
	cr_assert_eq(sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
	sqlite3_stmt *st;
	cr_assert_eq(sqlite3_prepare_v2(h, sql, -1, &st, NULL), SQLITE_OK, "%s", sqlite3_errmsg(h));
	int n = -1;
	if (sqlite3_step(st) == SQLITE_ROW)
		n = sqlite3_column_int(st, 0);
	sqlite3_finalize(st);
	sqlite3_close(h);
	return n;
}

Test(daemon, sigterm_interrupts_and_restart_requeues, .init = start1, .fini = stop1, .timeout = 120)
{
	const char *slow =
		"{\"name\": \"slow\", \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 8}, {\"type\": \"relu\"},"
		" {\"type\": \"dense\", \"units\": 2}]}, \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 30000,"
		" \"features\": 4, \"classes\": 2, \"load_cost_us\": 200}}, \"batch_size\": 32, \"epochs\": 1,"
		" \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}";
	long long a = submit_job(&d, slow), b = submit_job(&d, slow);
	cr_assert_str_eq(wait_state(&d, a, "running", 20), "running");
	cr_assert_str_eq(wait_state(&d, b, "running", 20), "running");
	usleep(500000);
	int status;
	double took = daemon_stop(&d, &status);
	cr_assert_lt(took, 10.0, "SIGTERM took %.1f s", took);
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "exit status %d", status);

	char db[256];
	snprintf(db, sizeof db, "%s/trainerd.db", d.dir);
	sqlite3 *h;
	cr_assert_eq(sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
	sqlite3_stmt *st;
	sqlite3_prepare_v2(h, "PRAGMA integrity_check", -1, &st, NULL);
	cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
	cr_assert_str_eq((const char *)sqlite3_column_text(st, 0), "ok");
	sqlite3_finalize(st);
	sqlite3_close(h);
	cr_assert_eq(sql_count(db, "SELECT count(*) FROM jobs WHERE state = 'interrupted'"), 2);

	/* A restart queues them again and they finish. */
	daemon_restart(&d, 2, NULL);
	cr_assert_str_eq(wait_state(&d, a, "completed|failed", 60), "completed");
	cr_assert_str_eq(wait_state(&d, b, "completed|failed", 60), "completed");
	char path[64];
	snprintf(path, sizeof path, "/jobs/%lld/metrics?names=loss", a);
	struct http_reply r;
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	json_t *steps = json_object_get(json_object_get(json_object_get(r.json, "series"), "loss"), "steps");
	cr_assert_eq(json_array_size(steps), 938, "loss points after restart: %zu", json_array_size(steps));
	http_free(&r);
}

/* The text of one column of one row (malloc'd), read from the daemon's
 * database while it runs. */
static char *sql_text(const char *db, const char *sql)
{
	sqlite3 *h;
	cr_assert_eq(sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
	sqlite3_stmt *st;
	cr_assert_eq(sqlite3_prepare_v2(h, sql, -1, &st, NULL), SQLITE_OK, "%s", sqlite3_errmsg(h));
	cr_assert_eq(sqlite3_step(st), SQLITE_ROW, "%s", sql);
	char *text = strdup((const char *)sqlite3_column_text(st, 0));
	sqlite3_finalize(st);
	sqlite3_close(h);
	return text;
}

/* A spec's 0.1 reads back as 0.1 (core/json_text.h), not as
 * 0.10000000000000001: in trainctl's JSON of a job, and in the texts the
 * daemon keeps of an experiment's request and of its trial's spec. */
Test(daemon, a_submitted_0_1_reads_back_as_0_1, .init = start1, .fini = stop1, .timeout = 60)
{
#define TENTH_SPEC                                                                                                    \
	"{\"name\": \"tenth\", \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 2}]}, \"data\": {\"train\":" \
	" {\"format\": \"synthetic\", \"samples\": 64, \"features\": 4, \"classes\": 2}}, \"batch_size\": 32,"        \
	" \"epochs\": 1, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1, \"momentum\": 0.9}}"
	long long id = submit_job(&d, TENTH_SPEC);
	char args[64];
	snprintf(args, sizeof args, "show %lld --json", id);
	char *out = trainctl_output(&d, args);
	cr_assert(strstr(out, "\"lr\": 0.1,") && strstr(out, "\"momentum\": 0.9\n"), "%s", out);
	free(out);

	struct http_reply r;
	http(&d, "POST", "/experiments",
	     "{\"name\": \"tenths\", \"spec\": " TENTH_SPEC ", \"search\": {\"method\": \"grid\"},"
	     " \"parameters\": {\"/optimizer/lr\": {\"grid\": [0.1]}}}",
	     NULL, NULL, &r);
	cr_assert_eq(r.status, 201, "%ld %s", r.status, r.body);
	long long eid = json_integer_value(json_object_get(r.json, "id"));
	http_free(&r);
	/* Its one trial becomes a job. */
	char path[64];
	snprintf(path, sizeof path, "/experiments/%lld", eid);
	long long trial = 0;
	for (int i = 0; i < 200 && !trial; i++) {
		http(&d, "GET", path, NULL, NULL, NULL, &r);
		trial = json_integer_value(
			json_object_get(json_array_get(json_object_get(r.json, "trials"), 0), "job"));
		http_free(&r);
		if (!trial)
			usleep(50 * 1000);
	}
	cr_assert_gt(trial, 0, "experiment %lld made no trial job in 10 s", eid);
	snprintf(args, sizeof args, "show %lld --json", trial);
	out = trainctl_output(&d, args);
	cr_assert(strstr(out, "\"lr\": 0.1,"), "%s", out);
	free(out);
	char db[256], sql[96];
	snprintf(db, sizeof db, "%s/trainerd.db", d.dir);
	snprintf(sql, sizeof sql, "SELECT spec FROM jobs WHERE id = %lld", trial);
	char *text = sql_text(db, sql);
	cr_assert(strstr(text, "\"lr\":0.1,") && strstr(text, "\"momentum\":0.9}"), "the trial's spec: %s", text);
	free(text);
	snprintf(sql, sizeof sql, "SELECT request FROM experiments WHERE id = %lld", eid);
	text = sql_text(db, sql);
	cr_assert(strstr(text, "\"lr\":0.1,") && strstr(text, "\"momentum\":0.9}"), "the experiment's request: %s",
		  text);
	free(text);
#undef TENTH_SPEC
}

Test(daemon, health_version_devices, .init = start1, .fini = stop1)
{
	struct http_reply r;
	http(&d, "GET", "/healthz", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200);
	http_free(&r);
	http(&d, "GET", "/readyz", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200);
	http_free(&r);
	http(&d, "GET", "/version", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200);
	cr_assert(json_is_string(json_object_get(r.json, "version")));
	http_free(&r);
	http(&d, "GET", "/devices", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200);
	json_t *devs = json_object_get(r.json, "devices");
	cr_assert_eq(json_array_size(devs), 2);
	/* CPU devices report the host's memory. */
	json_t *d0 = json_array_get(devs, 0);
	cr_assert_gt(json_integer_value(json_object_get(d0, "memory_total")), 0);
	cr_assert_gt(json_integer_value(json_object_get(d0, "memory_free")), 0);
	cr_assert_leq(json_integer_value(json_object_get(d0, "memory_free")),
		      json_integer_value(json_object_get(d0, "memory_total")));
	http_free(&r);
	http(&d, "GET", "/openapi.yaml", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200);
	cr_assert_not_null(strstr(r.body, "openapi:"));
	http_free(&r);
}

/* ---- backend and precision ------------------------------------------------ */

static char *read_text(const char *path)
{
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f, "%s", path);
	static char buf[1 << 16];
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	buf[n] = 0;
	fclose(f);
	return buf;
}

static int count_substr(const char *s, const char *needle)
{
	int n = 0;
	for (const char *p = s; (p = strstr(p, needle)) != NULL; p += strlen(needle))
		n++;
	return n;
}

static char *job_logs(long long id)
{
	char path[64];
	struct http_reply r;
	snprintf(path, sizeof path, "/jobs/%lld/logs", id);
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	char *text = strdup(r.body);
	http_free(&r);
	return text;
}

/* "precision": "tf32" is a permission: CPU devices, whose matrix products
 * are FP32 only, run the job in FP32 and its log says so; fp32 jobs get
 * no such line.  The runner applies the precision per job. */
Test(daemon, precision_tf32_on_cpu_runs_fp32_and_says_so, .init = start1, .fini = stop1, .timeout = 120)
{
	long long tf = submit_job(&d, SMALL_JOB("tf32", ", \"precision\": \"tf32\""));
	long long fp = submit_job(&d, SMALL_JOB("fp32", ", \"precision\": \"fp32\""));
	cr_assert_str_eq(wait_state(&d, tf, "completed|failed|cancelled", 60), "completed");
	cr_assert_str_eq(wait_state(&d, fp, "completed|failed|cancelled", 60), "completed");
	char *log = job_logs(tf);
	cr_assert_not_null(strstr(log, "precision tf32 has no effect on cpu devices: matrix products run in FP32"),
			   "%s", log);
	cr_assert_not_null(strstr(log, "cpu device(s), fp32 matrix products"), "%s", log);
	free(log);
	log = job_logs(fp);
	cr_assert_null(strstr(log, "no effect"), "%s", log);
	cr_assert_not_null(strstr(log, "cpu device(s), fp32 matrix products"), "%s", log);
	free(log);
}

static json_t *get_devices(struct http_reply *r)
{
	http(&d, "GET", "/devices", NULL, NULL, NULL, r);
	cr_assert_eq(r->status, 200, "%s", r->body);
	json_t *devs = json_object_get(r->json, "devices");
	cr_assert(json_is_array(devs), "%s", r->body);
	return devs;
}

/* The default backend (auto) on a machine without a usable GPU: CPU
 * devices with exactly one log line giving the reason; a spec that insists
 * on cuda is refused at submit with 422; /devices lists the CPU devices
 * with the host's memory and the job that owns each. */
Test(daemon, auto_backend_without_gpu_uses_cpu_and_refuses_cuda, .fini = stop1, .timeout = 120)
{
	const char *const extra[] = {"--backend", "auto", NULL};
	daemon_start(&d, 2, extra);
	/* logged while choosing the backend, before the address file exists */
	const char *log = read_text(d.log_path);
	struct http_reply r;
	if (!strstr(log, "no usable GPU")) {
		json_t *devs = get_devices(&r);
		cr_assert_str_eq(json_string_value(json_object_get(json_array_get(devs, 0), "kind")), "cuda",
				 "neither GPUs nor a fallback line:\n%s", log);
		http_free(&r);
		cr_skip_test("this machine has a usable GPU: the fallback is not exercised");
	}
	cr_assert_eq(count_substr(log, "no usable GPU"), 1, "%s", log);
	cr_assert_eq(count_substr(log, "; using 2 CPU devices"), 1, "%s", log);

	http(&d, "POST", "/jobs", SMALL_JOB("x", ", \"backend\": \"cuda\""), NULL, NULL, &r);
	cr_assert_eq(r.status, 422, "%s", r.body);
	json_t *err = json_object_get(r.json, "error");
	cr_assert_str_eq(json_string_value(json_object_get(err, "code")), "backend_unavailable", "%s", r.body);
	cr_assert_not_null(strstr(json_string_value(json_object_get(err, "message")), "no usable GPU"), "%s", r.body);
	http_free(&r);

	json_t *devs = get_devices(&r);
	cr_assert_eq(json_array_size(devs), 2);
	for (size_t i = 0; i < 2; i++) {
		json_t *dv = json_array_get(devs, i);
		char name[16];
		snprintf(name, sizeof name, "cpu%zu", i);
		cr_assert_eq(json_integer_value(json_object_get(dv, "id")), (json_int_t)i);
		cr_assert_str_eq(json_string_value(json_object_get(dv, "name")), name);
		cr_assert_str_eq(json_string_value(json_object_get(dv, "kind")), "cpu");
		cr_assert_gt(json_integer_value(json_object_get(dv, "memory_total")), 0);
		cr_assert(json_is_null(json_object_get(dv, "job")), "device %zu owned while idle: %s", i, r.body);
	}
	http_free(&r);

	/* ~20 s of training on device 1 only: long enough to look at it */
	long long id = submit_job(&d, spec_with("{\"epochs\": 20, \"devices\": [1]}"));
	cr_assert_str_eq(wait_state(&d, id, "running|completed|failed", 30), "running");
	devs = get_devices(&r);
	cr_assert(json_is_null(json_object_get(json_array_get(devs, 0), "job")), "%s", r.body);
	cr_assert_eq(json_integer_value(json_object_get(json_array_get(devs, 1), "job")), id, "%s", r.body);
	http_free(&r);
	char path[64];
	snprintf(path, sizeof path, "/jobs/%lld/cancel", id);
	http(&d, "POST", path, NULL, NULL, NULL, &r);
	cr_assert_lt(r.status, 300, "%s", r.body);
	http_free(&r);
	cr_assert_str_eq(wait_state(&d, id, "cancelled|completed|failed", 30), "cancelled");
	devs = get_devices(&r);
	cr_assert(json_is_null(json_object_get(json_array_get(devs, 1), "job")), "still owned: %s", r.body);
	http_free(&r);
}

/* On a GPU (skipped elsewhere, visibly): one CUDA backend serves jobs of
 * both precisions, each applied to the job's own device at its start. */
Test(daemon, precision_is_per_job_on_gpu, .fini = stop1, .timeout = 120)
{
	char cmd[600], line[256] = "";
	snprintf(cmd, sizeof cmd, "'%s' --version", getenv("TR_TRAINERD"));
	FILE *p = popen(cmd, "r");
	cr_assert_not_null(p);
	if (!fgets(line, sizeof line, p))
		line[0] = 0;
	pclose(p);
	line[strcspn(line, "\n")] = 0;
	if (!strstr(line, "cuda")) {
		fprintf(stderr, "[SKIP] daemon::precision_is_per_job_on_gpu: no usable GPU (%s)\n", line);
		cr_skip_test("no usable GPU");
	}
	const char *const extra[] = {"--backend", "cuda", NULL};
	daemon_start(&d, 1, extra);
	long long tf = submit_job(&d, SMALL_JOB("tf32", ", \"precision\": \"tf32\""));
	long long fp = submit_job(&d, SMALL_JOB("fp32", ""));
	cr_assert_str_eq(wait_state(&d, tf, "completed|failed|cancelled", 60), "completed");
	cr_assert_str_eq(wait_state(&d, fp, "completed|failed|cancelled", 60), "completed");
	char *log = job_logs(tf);
	cr_assert_not_null(strstr(log, "cuda device(s), tf32 matrix products"), "%s", log);
	free(log);
	log = job_logs(fp);
	cr_assert_not_null(strstr(log, "cuda device(s), fp32 matrix products"), "%s", log);
	free(log);
}

/* Whether /proc/PID/environ holds the entry `kv` (NAME=value). */
static bool environ_has(pid_t pid, const char *kv)
{
	char path[64], buf[65536];
	snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
	FILE *f = fopen(path, "rb");
	cr_assert_not_null(f, "%s", path);
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = '\0';
	for (size_t i = 0; i < n; i += strlen(buf + i) + 1)
		if (strcmp(buf + i, kv) == 0)
			return true;
	return false;
}

static void assert_named_trainerd(pid_t pid)
{
	char path[64], comm[32] = "";
	snprintf(path, sizeof path, "/proc/%d/comm", (int)pid);
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f, "%s", path);
	cr_assert_not_null(fgets(comm, sizeof comm, f));
	fclose(f);
	cr_assert_str_eq(comm, "trainerd\n", "the process is named %s", comm);
}

/* OpenBLAS's workers would spin ~0.1 s after every threaded gemm and keep a
 * core from the checkpoint writer; the executable has OpenBLAS read
 * OPENBLAS_THREAD_TIMEOUT=4 again and restart its workers (daemon/main.c),
 * in the same process (it used to start itself a second time, which
 * doubled its start-up): the daemon logs the value OpenBLAS read back,
 * its name is its own, and a value the user chose is kept. */
Test(daemon, blas_workers_told_to_sleep_between_gemms, .fini = stop1, .timeout = 60)
{
	unsetenv("OPENBLAS_THREAD_TIMEOUT");
	daemon_start(&d, 1, NULL);
	const char *log = read_text(d.log_path);
	cr_assert_not_null(strstr(log, "BLAS workers sleep after 2^4 cycles"), "%s", log);
	assert_named_trainerd(d.pid);
	struct http_reply r;
	http(&d, "GET", "/healthz", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200);
	http_free(&r);
	int status;
	daemon_stop(&d, &status);
	setenv("OPENBLAS_THREAD_TIMEOUT", "12", 1);
	daemon_restart(&d, 1, NULL);
	unsetenv("OPENBLAS_THREAD_TIMEOUT");
	log = read_text(d.log_path);
	cr_assert_not_null(strstr(log, "BLAS workers sleep after 2^12 cycles"), "the user's value was replaced: %s",
			   log);
	cr_assert(environ_has(d.pid, "OPENBLAS_THREAD_TIMEOUT=12"));
	assert_named_trainerd(d.pid);
}

/* Whether the daemon's address space maps a file whose name holds `what`. */
static bool maps_file(pid_t pid, const char *what, char *line, size_t len)
{
	char path[64];
	snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f, "%s", path);
	bool found = false;
	while (!found && fgets(line, (int)len, f))
		found = strstr(line, what) != NULL;
	fclose(f);
	return found;
}

/* The CUDA backend is a module loaded on demand (engine/cuda/module.h): a
 * daemon on a machine without a GPU maps no CUDA library, not at start
 * with --backend auto, nor when a submit asking for cuda makes it look
 * for a GPU again.  (cuBLAS alone was ~150 MB of its resident memory.) */
Test(daemon, no_cuda_library_is_mapped_without_a_gpu, .fini = stop1, .timeout = 120)
{
	const char *const extra[] = {"--backend", "auto", NULL};
	daemon_start(&d, 2, extra);
	const char *log = read_text(d.log_path);
	bool fallback = strstr(log, "no usable GPU") != NULL;
	if (!fallback) {
		fprintf(stderr, "[SKIP] daemon::no_cuda_library_is_mapped_without_a_gpu: this machine has a GPU\n");
		cr_skip_test("this machine has a usable GPU");
	}
	static const char *const libs[] = {"libcublas", "libcudart", "libnccl", "libcuda.so", "trainerd-cuda"};
	char line[1024];
	for (size_t i = 0; i < sizeof libs / sizeof libs[0]; i++)
		cr_assert(!maps_file(d.pid, libs[i], line, sizeof line), "mapped at start: %s", line);
	struct http_reply r;
	http(&d, "POST", "/jobs", SMALL_JOB("x", ", \"backend\": \"cuda\""), NULL, NULL, &r);
	cr_assert_eq(r.status, 422, "%s", r.body);
	http_free(&r);
	for (size_t i = 0; i < sizeof libs / sizeof libs[0]; i++)
		cr_assert(!maps_file(d.pid, libs[i], line, sizeof line), "mapped after a cuda submit: %s", line);
}
