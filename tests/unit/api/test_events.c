/* Unit tests of api/events.c: the SSE stream: history, live events, resume by
 * Last-Event-ID without duplicates, heartbeats, the end of a stream when
 * its job is deleted, and the prompt end of open streams on tr_api_stop.
 * Over real HTTP against the in-process API of tests/unit/api/fixture.h.
 */
#include <criterion/criterion.h>
#include <curl/curl.h>
#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <regex.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "api/rcache.h"
#include "api/routes.h"
#include "engine/safetensors.h"
#include "tests/unit/api/fixture.h"

TestSuite(api, .init = api_fixture_setup, .fini = api_fixture_teardown, .timeout = 60);

struct frame {
	int64_t id;
	char type[32];
	char *data;
};

struct sse_client {
	char path[256];
	char last_event_id[32];
	struct tr_test_buf got;
	pthread_mutex_t lock;
	long status;
	CURLcode rc;
	char content_type[256];
	double elapsed;
};

static size_t sse_on_data(char *p, size_t size, size_t n, void *cls)
{
	struct sse_client *c = cls;
	size_t rc;

	pthread_mutex_lock(&c->lock);
	rc = tr_test_curl_write(p, size, n, &c->got);
	pthread_mutex_unlock(&c->lock);
	return rc;
}

/* Reads the stream until the server ends it (or 30 s), from a thread of
 * its own: the transfer's result is kept for the test to check. */
static void *sse_run(void *cls)
{
	struct sse_client *c = cls;
	char base[64], h[64];
	const char *hdrs[] = {h, NULL};
	double t0 = now_s();
	struct tr_test_reply r;

	snprintf(base, sizeof(base), "http://127.0.0.1:%d", port);
	snprintf(h, sizeof(h), "Last-Event-ID: %s", c->last_event_id);
	struct tr_test_request rq = {.base_url = base,
				     .method = "GET",
				     .path = c->path,
				     .headers = c->last_event_id[0] ? hdrs : NULL,
				     .token = token,
				     .recv_fn = sse_on_data,
				     .recv_cls = c,
				     .timeout_s = 30,
				     .result = &c->rc};
	tr_test_http(&rq, &r);
	c->status = r.status;
	snprintf(c->content_type, sizeof(c->content_type), "%s", r.content_type);
	c->elapsed = now_s() - t0;
	tr_test_reply_free(&r);
	return NULL;
}

static void sse_init(struct sse_client *c, int64_t job, const char *last_id)
{
	memset(c, 0, sizeof(*c));
	snprintf(c->path, sizeof(c->path), "/jobs/%" PRId64 "/events", job);
	snprintf(c->last_event_id, sizeof(c->last_event_id), "%s", last_id ? last_id : "");
	pthread_mutex_init(&c->lock, NULL);
}

/* Parses "id:/event:/data:" frames; comments and retry lines are skipped. */
static int parse_frames(const char *text, struct frame *out, int max)
{
	int n = 0;
	const char *p = text;

	while (p && *p && n < max) {
		const char *end = strstr(p, "\n\n");
		size_t len = end ? (size_t)(end - p) : strlen(p);
		char *blk = strndup(p, len), *save = NULL;
		struct frame f = {0};
		bool any = false;

		for (char *line = strtok_r(blk, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
			if (!strncmp(line, "id: ", 4)) {
				f.id = strtoll(line + 4, NULL, 10);
				any = true;
			} else if (!strncmp(line, "event: ", 7)) {
				snprintf(f.type, sizeof(f.type), "%s", line + 7);
			} else if (!strncmp(line, "data: ", 6)) {
				f.data = strdup(line + 6);
			}
		}
		free(blk);
		if (any)
			out[n++] = f;
		else
			free(f.data);
		p = end ? end + 2 : NULL;
	}
	return n;
}

static void frames_free(struct frame *f, int n)
{
	for (int i = 0; i < n; i++)
		free(f[i].data);
}

static bool wait_for(struct sse_client *c, const char *needle, double seconds)
{
	double until = now_s() + seconds;

	while (now_s() < until) {
		bool found;

		pthread_mutex_lock(&c->lock);
		found = c->got.data && strstr(c->got.data, needle);
		pthread_mutex_unlock(&c->lock);
		if (found)
			return true;
		usleep(10000);
	}
	return false;
}

static int count_type(const struct frame *f, int n, const char *type)
{
	int k = 0;

	for (int i = 0; i < n; i++)
		k += !strcmp(f[i].type, type);
	return k;
}

Test(api, sse_live_then_resume_without_duplicates)
{
	int64_t id = submit("sse");
	struct sse_client c, again;
	struct frame f[64], g[64];
	pthread_t th;
	int n, m;
	char last[32];

	sse_init(&c, id, NULL);
	pthread_create(&th, NULL, sse_run, &c);
	cr_assert(wait_for(&c, "retry:", 5), "stream opened");
	cr_assert_eq(tr_store_job_set_state(store, id, TR_JOB_RUNNING, NULL, NULL, NULL), 0);
	cr_assert_eq(tr_store_metric_append(store, id, "loss", 1, 0, now_s(), 0.5, NULL), 0);
	cr_assert_eq(tr_store_log_append(store, id, 6, "step 1 done", NULL), 0);
	cr_assert_eq(tr_store_flush(store, NULL), 0);
	cr_assert(wait_for(&c, "step 1 done", 5), "live log event arrives");
	cr_assert_eq(tr_store_job_set_state(store, id, TR_JOB_COMPLETED, NULL, NULL, NULL), 0);
	pthread_join(th, NULL);

	cr_assert_eq(c.rc, CURLE_OK, "%s", curl_easy_strerror(c.rc));
	cr_assert_eq(c.status, 200);
	cr_assert_str_eq(c.content_type, "text/event-stream");
	n = parse_frames(c.got.data, f, 64);
	cr_assert_geq(count_type(f, n, "state"), 2, "%s", c.got.data);
	cr_assert_eq(count_type(f, n, "metrics"), 1, "%s", c.got.data);
	cr_assert_eq(count_type(f, n, "log"), 1, "%s", c.got.data);
	cr_assert_str_eq(f[n - 1].type, "state", "the stream ends on the terminal state");
	json_t *d = json_loads(f[n - 1].data, 0, NULL);

	cr_assert_str_eq(jstr(d, "state"), "completed");
	json_decref(d);
	for (int i = 1; i < n; i++)
		cr_assert_gt(f[i].id, f[i - 1].id, "ids increase");

	/* Monitors may arrive after the end; a reconnect picks them up,
	 * and only them. */
	cr_assert_eq(tr_store_metric_append(store, id, "late", 5, 0, now_s(), 1.0, NULL), 0);
	cr_assert_eq(tr_store_flush(store, NULL), 0);
	snprintf(last, sizeof(last), "%" PRId64, f[n - 1].id);
	sse_init(&again, id, last);
	sse_run(&again);
	m = parse_frames(again.got.data, g, 64);
	cr_assert_eq(m, 1, "%s", again.got.data);
	cr_assert_str_eq(g[0].type, "metrics");
	cr_assert(strstr(g[0].data, "late"));

	/* Resuming from the middle of the history gives exactly the rest. */
	int k = n / 2;

	frames_free(g, m);
	free(again.got.data);
	snprintf(last, sizeof(last), "%" PRId64, f[k].id);
	sse_init(&again, id, last);
	sse_run(&again);
	m = parse_frames(again.got.data, g, 64);
	cr_assert_eq(m, n - k - 1 + 1, "rest of history plus the late metrics: %s", again.got.data);
	for (int i = 0; i < n - k - 1; i++) {
		cr_assert_eq(g[i].id, f[k + 1 + i].id);
		cr_assert_str_eq(g[i].data, f[k + 1 + i].data);
	}
	frames_free(g, m);
	free(again.got.data);

	/* The query parameter works like the header. */
	char path[128];
	struct tr_test_reply r;

	snprintf(path, sizeof(path), "/jobs/%" PRId64 "/events?last_event_id=%" PRId64, id, f[n - 2].id);
	r = http("GET", path, NULL);
	cr_assert_eq(r.status, 200);
	m = parse_frames(r.body.data, g, 64);
	cr_assert_eq(m, 2, "%s", r.body.data);
	cr_assert_eq(g[0].id, f[n - 1].id);
	frames_free(g, m);
	resp_free(&r);

	frames_free(f, n);
	free(c.got.data);
}

Test(api, sse_heartbeat)
{
	struct start_opts o = {.heartbeat_s = 1};
	int64_t id;
	struct sse_client c;
	pthread_t th;

	restart(&o);
	id = submit("hb");
	cr_assert_eq(tr_store_job_set_state(store, id, TR_JOB_RUNNING, NULL, NULL, NULL), 0);
	sse_init(&c, id, NULL);
	pthread_create(&th, NULL, sse_run, &c);
	cr_assert(wait_for(&c, ": keepalive\n\n", 5), "a keepalive comment within the heartbeat");
	cr_assert_eq(tr_store_job_set_state(store, id, TR_JOB_FAILED, "{\"code\":\"x\",\"message\":\"y\"}", NULL, NULL),
		     0);
	pthread_join(th, NULL);
	cr_assert_eq(c.rc, CURLE_OK);
	free(c.got.data);
}

Test(api, sse_ends_when_job_is_deleted)
{
	struct start_opts o = {.heartbeat_s = 1};
	struct sse_client c;
	pthread_t th;
	int64_t id;

	restart(&o);
	id = submit("gone");
	struct tr_test_reply r = http("GET", "/jobs/999/events", NULL);

	expect_status(&r, 404, "events of an unknown job");
	resp_free(&r);
	cr_assert_eq(tr_store_job_set_state(store, id, TR_JOB_RUNNING, NULL, NULL, NULL), 0);
	sse_init(&c, id, NULL);
	pthread_create(&th, NULL, sse_run, &c);
	cr_assert(wait_for(&c, "event: state", 5));
	cr_assert_eq(tr_store_job_delete(store, id, NULL), 0);
	pthread_join(th, NULL);
	cr_assert_eq(c.rc, CURLE_OK);
	cr_assert_lt(c.elapsed, 5.0);
	free(c.got.data);
}

Test(api, stop_ends_open_streams_promptly)
{
	int64_t id = submit("long");
	struct sse_client c;
	pthread_t th;
	double t0;

	cr_assert_eq(tr_store_job_set_state(store, id, TR_JOB_RUNNING, NULL, NULL, NULL), 0);
	sse_init(&c, id, NULL);
	pthread_create(&th, NULL, sse_run, &c);
	cr_assert(wait_for(&c, "event: state", 5), "history replayed: %s", c.got.data ? c.got.data : "");
	t0 = now_s();
	tr_api_stop(api);
	api = NULL;
	cr_assert_lt(now_s() - t0, 2.0, "tr_api_stop took %.2f s", now_s() - t0);
	pthread_join(th, NULL);
	cr_assert_lt(c.elapsed, 10.0);
	free(c.got.data);
}
