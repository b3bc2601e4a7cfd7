/* Unit tests of api/jobs.c: submit with Location and Idempotency-Key, list with
 * pagination and filters, a job with its live progress, control, PATCH and
 * DELETE, and concurrent submits.
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
#include <sqlite3.h>
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

Test(api, submit_returns_job_with_location)
{
	regex_t re;
	char h[128];
	struct tr_test_reply r = http_full("POST", "/jobs?priority=5", "{\"name\": \"mlp\", \"epochs\": 3}",
					   (const char *const[]){"Content-Type: application/json; charset=utf-8", NULL},
					   0);

	expect_status(&r, 201, "submit");
	int64_t id = jint(r.json, "id");

	cr_assert_gt(id, 0);
	snprintf(h, sizeof(h), "/jobs/%" PRId64, id);
	char loc[128];

	cr_assert_str_eq(header(&r, "Location", loc, sizeof(loc)), h);
	cr_assert_str_eq(jstr(r.json, "name"), "mlp");
	cr_assert_str_eq(jstr(r.json, "state"), "queued");
	cr_assert_eq(jint(r.json, "priority"), 5);
	cr_assert_eq(jint(json_object_get(r.json, "spec"), "epochs"), 3);
	cr_assert(json_is_array(json_object_get(r.json, "devices")));
	cr_assert(json_is_null(json_object_get(r.json, "error")));
	json_t *progress = json_object_get(r.json, "progress");

	cr_assert(json_is_object(progress));
	cr_assert(json_is_integer(json_object_get(progress, "step")));
	cr_assert(json_is_null(json_object_get(progress, "loss")), "loss is null before any step");
	cr_assert_eq(regcomp(&re, "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z$",
			     REG_EXTENDED | REG_NOSUB),
		     0);
	cr_assert_eq(regexec(&re, jstr(r.json, "submitted_at"), 0, NULL, 0), 0, "%s", jstr(r.json, "submitted_at"));
	regfree(&re);
	cr_assert(json_is_null(json_object_get(r.json, "started_at")));
	cr_assert(json_is_null(json_object_get(r.json, "finished_at")));
	resp_free(&r);
}

Test(api, idempotency_key_replays_and_conflicts)
{
	const char *const key[] = {"Idempotency-Key: abc-123", NULL};
	struct tr_test_reply a = http_full("POST", "/jobs", "{\"name\": \"x\"}", key, 0);
	struct tr_test_reply b = http_full("POST", "/jobs", "{\"name\": \"x\"}", key, 0);
	struct tr_test_reply c = http_full("POST", "/jobs", "{\"name\": \"y\"}", key, 0);
	char h[64];

	expect_status(&a, 201, "first");
	expect_status(&b, 200, "replay");
	cr_assert_str_eq(header(&b, "Idempotent-Replayed", h, sizeof(h)), "true");
	cr_assert_eq(jint(a.json, "id"), jint(b.json, "id"));
	cr_assert_str_eq(header(&a, "Idempotent-Replayed", h, sizeof(h)), "");
	expect_status(&c, 409, "same key, other body");
	cr_assert_str_eq(jstr(c.json, "error.code"), "idempotency_conflict");
	resp_free(&a);
	resp_free(&b);
	resp_free(&c);
}

Test(api, list_paginates_and_filters)
{
	int64_t ids[5];
	char path[128];
	struct tr_test_reply r;

	for (int i = 0; i < 5; i++)
		ids[i] = submit("j");
	cr_assert_eq(tr_store_job_set_state(store, ids[3], TR_JOB_CANCELLED, NULL, NULL, NULL), 0);

	r = http("GET", "/jobs?limit=2", NULL);
	expect_status(&r, 200, "page 1");
	cr_assert_eq(json_array_size(json_object_get(r.json, "jobs")), 2);
	cr_assert_eq(jint(json_array_get(json_object_get(r.json, "jobs"), 0), "id"), ids[0]);
	cr_assert(json_is_string(json_object_get(r.json, "next")));
	snprintf(path, sizeof(path), "/jobs?limit=2&after=%s", jstr(r.json, "next"));
	resp_free(&r);

	r = http("GET", path, NULL);
	expect_status(&r, 200, "page 2");
	cr_assert_eq(jint(json_array_get(json_object_get(r.json, "jobs"), 0), "id"), ids[2]);
	resp_free(&r);

	r = http("GET", "/jobs", NULL);
	expect_status(&r, 200, "all");
	cr_assert_eq(json_array_size(json_object_get(r.json, "jobs")), 5);
	cr_assert(json_is_null(json_object_get(r.json, "next")), "fewer than limit: no next page");
	resp_free(&r);

	r = http("GET", "/jobs?state=cancelled", NULL);
	expect_status(&r, 200, "by state");
	cr_assert_eq(json_array_size(json_object_get(r.json, "jobs")), 1);
	cr_assert_eq(jint(json_array_get(json_object_get(r.json, "jobs"), 0), "id"), ids[3]);
	resp_free(&r);
}

/* ?state= is parsed once, at the edge: an unknown name is the client's
 * 400 naming the parameter and the states there are. */
Test(api, list_refuses_an_unknown_state_filter)
{
	struct tr_test_reply r = http("GET", "/jobs?state=sleeping", NULL);

	expect_status(&r, 400, "unknown state");
	cr_assert_str_eq(jstr(r.json, "error.code"), "invalid_parameter");
	cr_assert_str_eq(jstr(r.json, "error.message"),
			 "state: must be one of queued, running, stopping, paused, "
			 "stopped, completed, failed, cancelled, interrupted, preempted");
	resp_free(&r);
}

/* A state the store cannot read (a database changed by hand) is the
 * daemon's 500 naming the job and the text, and the API keeps serving. */
Test(api, unknown_state_in_database_is_a_clear_500)
{
	int64_t id = submit("odd"), other = submit("fine");
	char path[PATH_MAX + 16], sql[96];
	sqlite3 *db;
	struct tr_test_reply r;

	snprintf(path, sizeof(path), "%s/state.db", dir);
	cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
	snprintf(sql, sizeof(sql), "UPDATE jobs SET state = 'sleeping' WHERE id = %" PRId64, id);
	cr_assert_eq(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK, "%s", sqlite3_errmsg(db));
	sqlite3_close(db);

	snprintf(path, sizeof(path), "/jobs/%" PRId64, id);
	r = http("GET", path, NULL);
	expect_status(&r, 500, "unknown stored state");
	cr_assert_str_eq(jstr(r.json, "error.code"), "internal");
	snprintf(sql, sizeof(sql), "job %" PRId64 " has an unknown state \"sleeping\" in the state database", id);
	cr_assert_not_null(strstr(jstr(r.json, "error.message"), sql), "%s", jstr(r.json, "error.message"));
	resp_free(&r);

	snprintf(path, sizeof(path), "/jobs/%" PRId64, other);
	r = http("GET", path, NULL);
	expect_status(&r, 200, "another job");
	cr_assert_str_eq(jstr(r.json, "state"), "queued");
	resp_free(&r);
}

Test(api, get_merges_live_progress)
{
	int64_t id = submit("live");
	char path[64];
	struct tr_test_reply r;

	cr_assert_eq(tr_store_job_set_state(store, id, TR_JOB_RUNNING, NULL, "[0]", NULL), 0);
	cr_assert_eq(tr_store_job_set_progress(store, id, 40, 100, 1, 0.25, NULL), 0);
	snprintf(path, sizeof(path), "/jobs/%" PRId64, id);
	r = http("GET", path, NULL);
	expect_status(&r, 200, "get");
	json_t *p = json_object_get(r.json, "progress");

	cr_assert_str_eq(jstr(r.json, "state"), "running");
	cr_assert_eq(jint(p, "step"), 40);
	cr_assert_eq(jint(p, "total_steps"), 100);
	cr_assert_eq(jint(p, "epoch"), 1);
	cr_assert_float_eq(json_real_value(json_object_get(p, "loss")), 0.25, 1e-12);
	cr_assert_float_eq(json_real_value(json_object_get(p, "eta_s")), 12.5, 1e-12);
	cr_assert_eq(json_integer_value(json_array_get(json_object_get(r.json, "devices"), 0)), 0);
	cr_assert(json_is_string(json_object_get(r.json, "started_at")));
	resp_free(&r);
}

Test(api, control_patch_delete)
{
	int64_t id = submit("ctl"), other = submit("other");
	char path[64];
	struct tr_test_reply r;

	snprintf(path, sizeof(path), "/jobs/%" PRId64 "/pause", id);
	r = http("POST", path, NULL);
	expect_status(&r, 202, "pause");
	cr_assert_str_eq(jstr(r.json, "state"), "paused");
	resp_free(&r);

	snprintf(path, sizeof(path), "/jobs/%" PRId64 "/resume", id);
	r = http("POST", path, NULL);
	expect_status(&r, 202, "resume");
	cr_assert_str_eq(jstr(r.json, "state"), "queued");
	resp_free(&r);

	cr_assert_eq(tr_store_job_set_state(store, other, TR_JOB_RUNNING, NULL, NULL, NULL), 0);
	snprintf(path, sizeof(path), "/jobs/%" PRId64 "/stop", other);
	r = http("POST", path, NULL);
	expect_status(&r, 202, "stop");
	cr_assert_str_eq(jstr(r.json, "state"), "stopping");
	resp_free(&r);

	snprintf(path, sizeof(path), "/jobs/%" PRId64, id);
	r = http("PATCH", path, "{\"priority\": -7}");
	expect_status(&r, 200, "patch");
	cr_assert_eq(jint(r.json, "priority"), -7);
	resp_free(&r);

	snprintf(path, sizeof(path), "/jobs/%" PRId64 "/cancel", id);
	r = http("POST", path, NULL);
	expect_status(&r, 202, "cancel");
	cr_assert_str_eq(jstr(r.json, "state"), "cancelled");
	cr_assert(json_is_string(json_object_get(r.json, "finished_at")));
	resp_free(&r);

	snprintf(path, sizeof(path), "/jobs/%" PRId64, id);
	r = http("DELETE", path, NULL);
	cr_assert_eq(r.status, 204);
	cr_assert_eq(r.body.len, 0);
	resp_free(&r);

	r = http("GET", path, NULL);
	expect_status(&r, 404, "deleted");
	resp_free(&r);
}

static void *submit_many(void *cls)
{
	int64_t *ids = cls;

	for (int i = 0; i < 10; i++)
		ids[i] = submit("concurrent");
	return NULL;
}

Test(api, concurrent_submits)
{
	pthread_t th[8];
	int64_t ids[80];
	struct tr_test_reply r;

	for (int t = 0; t < 8; t++)
		pthread_create(&th[t], NULL, submit_many, ids + 10 * t);
	for (int t = 0; t < 8; t++)
		pthread_join(th[t], NULL);
	for (int i = 0; i < 80; i++)
		for (int j = 0; j < i; j++)
			cr_assert_neq(ids[i], ids[j]);
	r = http("GET", "/jobs?limit=1000", NULL);
	expect_status(&r, 200, "list");
	cr_assert_eq(json_array_size(json_object_get(r.json, "jobs")), 80);
	resp_free(&r);
}

/* POST /jobs/{id}/resume: the body is optional (an empty one is taken
 * whatever its Content-Type), and when given it is {"epochs": N} or
 * {"max_steps": N}, refused with its pointer otherwise. */
Test(api, resume_takes_an_optional_new_end)
{
	int64_t id = submit("resumable");
	char path[64];
	struct tr_test_reply r;
	static const char *const form[] = {"Content-Type: application/x-www-form-urlencoded", NULL};
	/* clang-format off */
	static const struct {
		const char *body, *pointer;
	} bad[] = {
		{"{\"epochs\": 0}", "/epochs"},
		{"{\"epochs\": \"4\"}", "/epochs"},
		{"{\"max_steps\": -3}", "/max_steps"},
		{"{\"epochs\": 2, \"max_steps\": 10}", "/epochs"},
		{"{\"epoch\": 2}", "/epoch"},
		{"{\"epochs\": 2000000}", "/epochs"},
	};
	/* clang-format on */

	snprintf(path, sizeof(path), "/jobs/%" PRId64 "/resume", id);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		r = http("POST", path, bad[i].body);
		expect_status(&r, 400, bad[i].body);
		cr_assert_str_eq(jstr(json_object_get(r.json, "error"), "code"), "invalid_request", "%s", bad[i].body);
		cr_assert_str_eq(jstr(json_object_get(r.json, "error"), "pointer"), bad[i].pointer, "%s", bad[i].body);
		resp_free(&r);
	}
	/* A body that is not JSON, with a JSON type or without. */
	r = http("POST", path, "epochs=4");
	expect_status(&r, 400, "not JSON");
	resp_free(&r);
	r = http_full("POST", path, "{\"epochs\": 4}", form, 0);
	expect_status(&r, 415, "a form body");
	resp_free(&r);
	/* Legal bodies reach the daemon, whose table refuses a queued job. */
	r = http("POST", path, "{\"epochs\": 4}");
	expect_status(&r, 409, "queued");
	cr_assert(strstr(jstr(json_object_get(r.json, "error"), "message"),
			 "only a paused or stopped job can be resumed"),
		  "%s", r.body);
	resp_free(&r);
	cr_assert_eq(tr_store_job_set_state(store, id, TR_JOB_STOPPED, NULL, NULL, NULL), 0);
	r = http_full("POST", path, "", form, 0); /* empty, with a form type: no body */
	expect_status(&r, 202, "stopped, empty body");
	cr_assert_str_eq(jstr(r.json, "state"), "queued");
	resp_free(&r);
	cr_assert_eq(tr_store_job_set_state(store, id, TR_JOB_STOPPED, NULL, NULL, NULL), 0);
	r = http("POST", path, "{\"max_steps\": 500}");
	expect_status(&r, 202, "stopped, new end");
	resp_free(&r);
}
