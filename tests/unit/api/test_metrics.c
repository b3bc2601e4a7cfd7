/* Unit tests of api/metrics.c: pushing and querying series, and the freshness of the
 * response cache: a point is in the first answer after the flush that
 * wrote it, alone and under concurrent polling, and a polled curve is
 * computed when the store commits, before the commit shows.
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

Test(api, metrics_push_and_query)
{
	int64_t id = submit("m");
	char path[128];
	struct tr_test_reply r;

	snprintf(path, sizeof(path), "/jobs/%" PRId64 "/metrics", id);
	r = http("POST", path,
		 "{\"points\": [{\"name\": \"eval/bleu\", \"step\": 1, \"value\": 0.5, \"epoch\": 0},"
		 " {\"name\": \"eval/bleu\", \"step\": 2, \"value\": 0.75},"
		 " {\"name\": \"gpu:temp\", \"step\": 2, \"value\": 61}]}");
	expect_status(&r, 202, "push");
	cr_assert_eq(jint(r.json, "accepted"), 3);
	resp_free(&r);
	for (int s = 1; s <= 50; s++)
		tr_store_metric_append(store, id, "loss", s, 0, now_s(), 1.0 / s, NULL);
	cr_assert_eq(tr_store_flush(store, NULL), 0);

	snprintf(path, sizeof(path), "/jobs/%" PRId64 "/metrics?names=eval/bleu&epochs=true&times=true", id);
	r = http("GET", path, NULL);
	expect_status(&r, 200, "query");
	cr_assert_eq(jint(r.json, "job"), id);
	json_t *series = json_object_get(r.json, "series");
	json_t *bleu = json_object_get(series, "eval/bleu");

	cr_assert_eq(json_object_size(series), 1);
	cr_assert_eq(json_array_size(json_object_get(bleu, "steps")), 2);
	cr_assert_float_eq(json_number_value(json_array_get(json_object_get(bleu, "values"), 1)), 0.75, 1e-12);
	cr_assert_eq(json_array_size(json_object_get(bleu, "epochs")), 2);
	cr_assert_eq(json_array_size(json_object_get(bleu, "times")), 2);
	resp_free(&r);

	snprintf(path, sizeof(path), "/jobs/%" PRId64 "/metrics?names=loss&from_step=10&to_step=19", id);
	r = http("GET", path, NULL);
	expect_status(&r, 200, "range");
	json_t *loss = json_object_get(json_object_get(r.json, "series"), "loss");

	cr_assert_eq(json_array_size(json_object_get(loss, "steps")), 10);
	cr_assert_eq(json_integer_value(json_array_get(json_object_get(loss, "steps"), 0)), 10);
	cr_assert_null(json_object_get(loss, "epochs"));
	resp_free(&r);

	snprintf(path, sizeof(path), "/jobs/%" PRId64 "/metrics?names=loss&max_points=10", id);
	r = http("GET", path, NULL);
	expect_status(&r, 200, "downsampled");
	loss = json_object_get(json_object_get(r.json, "series"), "loss");
	cr_assert_leq(json_array_size(json_object_get(loss, "steps")), 10);
	cr_assert_gt(json_array_size(json_object_get(loss, "steps")), 0);
	resp_free(&r);

	/* All names, in name order. */
	snprintf(path, sizeof(path), "/jobs/%" PRId64 "/metrics", id);
	r = http("GET", path, NULL);
	expect_status(&r, 200, "all");
	cr_assert_eq(json_object_size(json_object_get(r.json, "series")), 3);
	resp_free(&r);

	/* Late monitors: pushing to a finished job is fine. */
	cr_assert_eq(tr_store_job_set_state(store, id, TR_JOB_COMPLETED, NULL, NULL, NULL), 0);
	snprintf(path, sizeof(path), "/jobs/%" PRId64 "/metrics", id);
	r = http("POST", path, "{\"points\": [{\"name\": \"late\", \"step\": 3, \"value\": 1e-3}]}");
	expect_status(&r, 202, "push to finished job");
	resp_free(&r);
}

/* The last step of a series in a metrics answer, -1 when absent. */
static int64_t last_step(const json_t *answer, const char *name)
{
	json_t *steps = json_object_get(json_object_get(json_object_get(answer, "series"), name), "steps");
	size_t n = json_array_size(steps);

	return n ? json_integer_value(json_array_get(steps, n - 1)) : -1;
}

/* A point is in the first answer after the flush that wrote it, however
 * often the query was answered before; another job's flushes do not make
 * a finished job's cached answer be computed again. */
Test(api, metrics_cache_fresh_and_per_job)
{
	int64_t done = submit("finished"), live = submit("running");
	char pd[128], pl[128];
	struct tr_rcache_stats s0, s1;

	for (int i = 0; i < 2000; i++)
		cr_assert_eq(tr_store_metric_append(store, done, "x", i, 0, now_s(), sin(i * 0.01), NULL), 0);
	cr_assert_eq(tr_store_flush(store, NULL), 0);
	cr_assert_eq(tr_store_job_set_state(store, done, TR_JOB_COMPLETED, NULL, NULL, NULL), 0);
	cr_assert_eq(tr_store_job_set_state(store, live, TR_JOB_RUNNING, NULL, NULL, NULL), 0);
	snprintf(pd, sizeof(pd), "/jobs/%" PRId64 "/metrics?max_points=100", done);
	snprintf(pl, sizeof(pl), "/jobs/%" PRId64 "/metrics?names=loss&max_points=100", live);
	struct tr_test_reply first = http("GET", pd, NULL);
	expect_status(&first, 200, "finished job");
	cr_assert_eq(last_step(first.json, "x"), 1999);

	for (int step = 0; step < 20; step++) {
		cr_assert_eq(tr_store_metric_append(store, live, "loss", step, 0, now_s(), 1.0 / (step + 1), NULL), 0);
		cr_assert_eq(tr_store_flush(store, NULL), 0);
		/* The second answer comes from the cache. */
		for (int k = 0; k < 2; k++) {
			struct tr_test_reply r = http("GET", pl, NULL);

			expect_status(&r, 200, "running job");
			cr_assert_eq(last_step(r.json, "loss"), step, "answer %d after the flush of step %d is stale",
				     k, step);
			resp_free(&r);
		}
		tr_rcache_stats(&s0);
		struct tr_test_reply r = http("GET", pd, NULL);
		tr_rcache_stats(&s1);
		expect_status(&r, 200, "finished job");
		cr_assert_str_eq(r.body.data, first.body.data);
		cr_assert_eq(s1.computed, s0.computed, "the flush of step %d made the finished job's answer recomputed",
			     step);
		cr_assert_eq(s1.hits, s0.hits + 1);
		resp_free(&r);
	}
	/* A resume from an earlier checkpoint truncates: also seen at once. */
	cr_assert_eq(tr_store_metrics_truncate(store, live, 9, NULL), 0);
	struct tr_test_reply r = http("GET", pl, NULL);
	expect_status(&r, 200, "truncated");
	cr_assert_eq(last_step(r.json, "loss"), 9, "a cached answer outlived the truncation");
	resp_free(&r);
	resp_free(&first);
}

struct poller {
	const char *path;
	atomic_bool *stop;
	int64_t max_written; /* read after the join */
	int bad, answers;
	int64_t highest;
};

static void *poll_metrics(void *cls)
{
	struct poller *p = cls;

	while (!atomic_load(p->stop)) {
		struct tr_test_reply r = http("GET", p->path, NULL);

		if (r.status != 200 || !r.json)
			p->bad++;
		else if (last_step(r.json, "loss") > p->highest)
			p->highest = last_step(r.json, "loss");
		p->answers++;
		resp_free(&r);
	}
	return NULL;
}

/* The same, with other clients asking the same query all the time, so
 * the writer's flushes race cache fills and shared computations. */
Test(api, metrics_cache_fresh_under_concurrent_polling)
{
	int64_t id = submit("polled");
	char path[128];
	atomic_bool stop = false;
	struct poller p[4];
	pthread_t th[4];

	/* Enough points that a computation takes a while. */
	for (int i = 0; i < 20000; i++)
		cr_assert_eq(tr_store_metric_append(store, id, "loss", i, 0, now_s(), cos(i * 0.001), NULL), 0);
	cr_assert_eq(tr_store_flush(store, NULL), 0);
	snprintf(path, sizeof(path), "/jobs/%" PRId64 "/metrics?names=loss&max_points=500", id);
	for (int t = 0; t < 4; t++) {
		p[t] = (struct poller){.path = path, .stop = &stop, .highest = -1};
		pthread_create(&th[t], NULL, poll_metrics, &p[t]);
	}
	/* Each new point is the largest value so far, so it is the maximum
	 * of the last bucket and must be in the downsampled answer. */
	int64_t stale = -1, seen = -1;
	for (int step = 20000; step < 20030 && stale < 0; step++) {
		int rc = tr_store_metric_append(store, id, "loss", step, 0, now_s(), 2.0 + step, NULL);

		if (rc == 0)
			rc = tr_store_flush(store, NULL);
		struct tr_test_reply r = http("GET", path, NULL);

		seen = r.status == 200 && r.json ? last_step(r.json, "loss") : -2;
		if (rc != 0 || seen != step)
			stale = step;
		resp_free(&r);
	}
	atomic_store(&stop, true);
	for (int t = 0; t < 4; t++)
		pthread_join(th[t], NULL);
	cr_assert_lt(stale, 0, "the answer after the flush of step %" PRId64 " ends at step %" PRId64, stale, seen);
	for (int t = 0; t < 4; t++) {
		cr_assert_eq(p[t].bad, 0);
		cr_assert_gt(p[t].answers, 0);
		cr_assert_leq(p[t].highest, 20029);
	}
}

/* The running job's curve that a dashboard keeps polling is computed
 * when the store commits the job's points, before the commit shows: the
 * first request after the flush is answered from the cache, with the new
 * point; an incremental poll's answer (asked once) is not recomputed. */
Test(api, metrics_polled_curve_is_ready_at_commit)
{
	int64_t id = submit("watched");
	char path[128], inc[160];
	struct tr_rcache_stats s0, s1;

	for (int i = 0; i < 3000; i++)
		cr_assert_eq(tr_store_metric_append(store, id, "loss", i, 0, now_s(), 1.0 / (i + 1), NULL), 0);
	cr_assert_eq(tr_store_flush(store, NULL), 0);
	cr_assert_eq(tr_store_job_set_state(store, id, TR_JOB_RUNNING, NULL, NULL, NULL), 0);
	snprintf(path, sizeof(path), "/jobs/%" PRId64 "/metrics?max_points=500", id);
	for (int k = 0; k < 2; k++) { /* computed, then served: now polled */
		struct tr_test_reply r = http("GET", path, NULL);
		expect_status(&r, 200, "curve");
		resp_free(&r);
	}
	for (int step = 3000; step < 3010; step++) {
		snprintf(inc, sizeof(inc), "/jobs/%" PRId64 "/metrics?max_points=500&from_step=%d", id, step);
		cr_assert_eq(tr_store_metric_append(store, id, "loss", step, 0, now_s(), 5.0 + step, NULL), 0);
		cr_assert_eq(tr_store_flush(store, NULL), 0);
		tr_rcache_stats(&s0);
		struct tr_test_reply r = http("GET", path, NULL);
		tr_rcache_stats(&s1);
		expect_status(&r, 200, "curve after a flush");
		cr_assert_eq(last_step(r.json, "loss"), step, "the answer after the flush of step %d is stale", step);
		cr_assert_eq(s1.computed, s0.computed, "the first request after the flush of step %d computed it",
			     step);
		cr_assert_eq(s1.hits, s0.hits + 1);
		resp_free(&r);
		r = http("GET", inc, NULL);
		expect_status(&r, 200, "incremental poll");
		cr_assert_eq(last_step(r.json, "loss"), step);
		resp_free(&r);
	}
	/* Ten flushes, one refresh each: the incremental answers were not. */
	tr_rcache_stats(&s0);
	cr_assert_eq(tr_store_metric_append(store, id, "loss", 3010, 0, now_s(), 1.0, NULL), 0);
	cr_assert_eq(tr_store_flush(store, NULL), 0);
	tr_rcache_stats(&s1);
	cr_assert_eq(s1.refreshed, s0.refreshed + 1, "%" PRIu64 " answers refreshed", s1.refreshed - s0.refreshed);
}

/* Pages that poll the same job at the same moment ask the same incremental
 * query (from_step just past the step they have) and share its answer
 * from the cache; that answer is not asked again after the next commit
 * (every page's from_step moves on), so the commit does not recompute it. */
Test(api, metrics_shared_incremental_poll_is_not_recomputed_at_commit)
{
	int64_t id = submit("watched by two pages");
	char inc[160];
	struct tr_rcache_stats s0, s1;

	for (int i = 0; i < 5000; i++)
		cr_assert_eq(tr_store_metric_append(store, id, "loss", i, 0, now_s(), 1.0 / (i + 1), NULL), 0);
	cr_assert_eq(tr_store_flush(store, NULL), 0);
	cr_assert_eq(tr_store_job_set_state(store, id, TR_JOB_RUNNING, NULL, NULL, NULL), 0);
	snprintf(inc, sizeof(inc), "/jobs/%" PRId64 "/metrics?max_points=16&epochs=true&times=true&from_step=1000", id);
	tr_rcache_stats(&s0);
	for (int page = 0; page < 2; page++) {
		struct tr_test_reply r = http("GET", inc, NULL);
		expect_status(&r, 200, "incremental poll");
		cr_assert_eq(last_step(r.json, "loss"), 4999);
		resp_free(&r);
	}
	tr_rcache_stats(&s1);
	cr_assert_eq(s1.hits, s0.hits + 1, "the second page's poll is served from the cache");
	cr_assert_eq(tr_store_metric_append(store, id, "loss", 5000, 0, now_s(), 1.0, NULL), 0);
	cr_assert_eq(tr_store_flush(store, NULL), 0);
	tr_rcache_stats(&s0);
	cr_assert_eq(s0.refreshed, s1.refreshed, "%" PRIu64 " incremental answers recomputed at commit",
		     s0.refreshed - s1.refreshed);
}
