/* Unit tests of api/metrics_stream.c: the buffered answer (exact head and
 * tail, valid JSON, refused -EFBIG past the points limit and nothing
 * kept) and the streamed one, which must be byte for byte the buffered
 * one for the same query: undownsampled series larger than one response
 * block, many small series (the commas between them), duplicate and
 * unknown names, epochs and times, a job without metrics.  The buffered
 * answer is rendered by calling tr_api_metrics_render on the fixture's
 * store; the streamed one is read over real HTTP (GET
 * /jobs/{id}/metrics?max_points=0 streams) from the in-process API of
 * tests/unit/api/fixture.h.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/metrics_stream.h"
#include "tests/unit/api/fixture.h"

TestSuite(api, .init = api_fixture_setup, .fini = api_fixture_teardown, .timeout = 60);

/* n points of name for job, steps 1..n, then written. */
static void points(int64_t job, const char *name, int n)
{
	for (int i = 1; i <= n; i++) {
		cr_assert_eq(tr_store_metric_append(store, job, name, i, i / 100, 1.7e9 + i, 1.0 / i, NULL), 0);
		if (i % 500 == 0)
			cr_assert_eq(tr_store_flush(store, NULL), 0);
	}
	cr_assert_eq(tr_store_flush(store, NULL), 0);
	cr_assert_eq(tr_store_metric_drops(store, job), 0, "no point was dropped");
}

static char *render(int64_t job, const char *const *names, int max_points, bool epochs, bool times, size_t max_total,
		    int *rc, size_t *len)
{
	struct tr_metrics_query q = {.names = names,
				     .to_step = INT64_MAX,
				     .max_points = max_points,
				     .with_epochs = epochs,
				     .with_times = times};
	struct tr_error e = {0};
	char *text = NULL;

	*rc = tr_api_metrics_render(store, job, &q, max_total, &text, len, &e);
	return text;
}

/* The streamed answer of GET path, which must be 200 JSON. */
static struct tr_test_reply streamed(const char *path)
{
	struct tr_test_reply r = http("GET", path, NULL);

	expect_status(&r, 200, path);
	cr_assert_str_eq(r.content_type, "application/json", "%s", path);
	return r;
}

static void expect_same(const char *path, const char *const *names, bool epochs, bool times)
{
	struct tr_test_reply r = streamed(path);
	size_t len = 0;
	int rc;
	int64_t job = strtoll(path + strlen("/jobs/"), NULL, 10);
	char *want = render(job, names, 0, epochs, times, 0, &rc, &len);

	cr_assert_eq(rc, 0);
	cr_assert_eq(r.body.len, len, "%s: %zu bytes streamed, %zu buffered", path, r.body.len, len);
	cr_assert(memcmp(r.body.data, want, len) == 0, "%s: streamed\n%.300s\nbuffered\n%.*s", path, r.body.data,
		  (int)(len < 300 ? len : 300), want);
	free(want);
	resp_free(&r);
}

Test(api, buffered_answer_head_tail_and_json)
{
	int64_t empty = submit("empty"), job = submit("m");
	char want[128];
	size_t len;
	int rc;
	char *text = render(empty, NULL, 7, false, false, 0, &rc, &len);

	cr_assert_eq(rc, 0);
	snprintf(want, sizeof want, "{\"job\":%" PRId64 ",\"max_points\":7,\"series\":{}}\n", empty);
	/* The text is len bytes, not NUL-terminated. */
	cr_assert(len == strlen(want) && memcmp(text, want, len) == 0, "%.*s", (int)len, text);
	free(text);

	points(job, "loss", 3);
	points(job, "acc", 2);
	text = render(job, NULL, 100, false, false, 0, &rc, &len);
	cr_assert_eq(rc, 0);
	cr_assert_eq(text[len - 1], '\n');
	json_error_t je;
	json_t *j = json_loadb(text, len, 0, &je);
	cr_assert_not_null(j, "not JSON (%s): %.*s", je.text, (int)len, text);
	cr_assert_eq(jint(j, "job"), job);
	cr_assert_eq(jint(j, "max_points"), 100);
	json_t *series = json_object_get(j, "series");
	cr_assert_eq(json_object_size(series), 2, "%.*s", (int)len, text);
	cr_assert_not_null(json_object_get(series, "loss"));
	cr_assert_not_null(json_object_get(series, "acc"));
	/* Name order, as the streamed answer has. */
	const char *acc = memmem(text, len, "\"acc\"", 5), *loss = memmem(text, len, "\"loss\"", 6);
	cr_assert(acc && loss && acc < loss, "%.*s", (int)len, text);
	json_decref(j);
	free(text);
}

Test(api, buffered_answer_refuses_past_the_points_limit)
{
	int64_t job = submit("m");
	size_t len = 0;
	int rc;
	char *text;

	points(job, "a", 3);
	points(job, "b", 2);
	text = render(job, NULL, 0, false, false, 4, &rc, &len);
	cr_assert_eq(rc, -EFBIG, "5 points past a limit of 4: %d", rc);
	cr_assert_null(text, "nothing is handed back");
	text = render(job, NULL, 0, false, false, 5, &rc, &len);
	cr_assert_eq(rc, 0, "5 points at a limit of 5");
	free(text);
}

Test(api, streamed_equals_buffered_for_large_series)
{
	int64_t job = submit("big");
	char path[160];

	/* About 100 KiB of text per series: several response blocks each. */
	points(job, "loss", 4000);
	points(job, "val_loss", 2500);
	points(job, "lr", 1);
	snprintf(path, sizeof path, "/jobs/%" PRId64 "/metrics?max_points=0", job);
	expect_same(path, NULL, false, false);
	snprintf(path, sizeof path, "/jobs/%" PRId64 "/metrics?max_points=0&epochs=true&times=true", job);
	expect_same(path, NULL, true, true);
}

Test(api, streamed_equals_buffered_for_many_small_series)
{
	int64_t job = submit("many");
	char path[160], name[16];

	for (int i = 0; i < 40; i++) {
		snprintf(name, sizeof name, "m%02d", 39 - i);
		points(job, name, 1 + i % 3);
	}
	snprintf(path, sizeof path, "/jobs/%" PRId64 "/metrics?max_points=0", job);
	expect_same(path, NULL, false, false);
	struct tr_test_reply r = streamed(path);
	json_t *series = json_object_get(r.json, "series");
	cr_assert_eq(json_object_size(series), 40, "%.400s", r.body.data);
	resp_free(&r);
}

Test(api, streamed_names_deduplicated_sorted_unknown_skipped)
{
	int64_t job = submit("names"), none = submit("none");
	const char *const sorted[] = {"acc", "loss", "nope", NULL};
	char path[160];

	points(job, "loss", 5);
	points(job, "acc", 5);
	points(job, "lr", 5);
	snprintf(path, sizeof path, "/jobs/%" PRId64 "/metrics?max_points=0&names=loss,nope,acc,loss", job);
	expect_same(path, sorted, false, false);
	struct tr_test_reply r = streamed(path);
	json_t *series = json_object_get(r.json, "series");
	cr_assert_eq(json_object_size(series), 2, "loss once, acc, and no unknown name: %s", r.body.data);
	resp_free(&r);

	/* A job without metrics: the bare object. */
	char want[128];
	snprintf(path, sizeof path, "/jobs/%" PRId64 "/metrics?max_points=0", none);
	r = streamed(path);
	snprintf(want, sizeof want, "{\"job\":%" PRId64 ",\"max_points\":0,\"series\":{}}\n", none);
	cr_assert_str_eq(r.body.data, want);
	resp_free(&r);
}
