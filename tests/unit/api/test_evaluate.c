/* Unit tests of api/evaluate.c: POST /jobs/{id}/evaluate hands the body to
 * the daemon's evaluate op and answers 202 with the new job and its
 * Location; the op's refusal keeps its status, code and pointer; an
 * unknown job, a bad id or a body that is no object never reach the op;
 * a daemon without the op answers 503.  Over real HTTP against the
 * in-process API of tests/unit/api/fixture.h, with a fake op that queues
 * a job row of kind "evaluate".
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/unit/api/fixture.h"

TestSuite(api, .init = api_fixture_setup, .fini = api_fixture_teardown, .timeout = 60);

static atomic_int calls;
static int64_t seen_job;
static char *seen_body;

/* Refuses {"checkpoint": "none"} as the daemon refuses a missing
 * checkpoint, {"data": 5} with a pointer; queues anything else. */
static int fake_evaluate(void *ctx, int64_t job_id, const json_t *body, int64_t *eval_id, struct tr_error *err)
{
	struct tr_job_row row = {0};
	int64_t existing = 0;
	int rc;

	(void)ctx;
	atomic_fetch_add(&calls, 1);
	seen_job = job_id;
	free(seen_body);
	seen_body = json_dumps(body, JSON_COMPACT | JSON_SORT_KEYS);
	if (json_is_integer(json_object_get(body, "data"))) {
		tr_job_fail(err, TR_JOB_E_INVALID_SPEC, "/data", "/data: must be a data source object");
		return -EINVAL;
	}
	if (json_is_string(json_object_get(body, "checkpoint")) &&
	    !strcmp(json_string_value(json_object_get(body, "checkpoint")), "none")) {
		tr_job_fail(err, TR_JOB_E_NOT_FOUND, "/checkpoint", "job %" PRId64 " has no such checkpoint", job_id);
		return -ENOENT;
	}
	row.name = strdup("eval");
	row.spec = strdup("{\"kind\": \"evaluate\"}");
	row.normalized = strdup(row.spec);
	row.devices = strdup("[]");
	row.submitted_at = now_s();
	row.loss = NAN;
	rc = tr_store_job_insert(store, &row, &existing, err);
	*eval_id = row.id;
	tr_job_row_finish(&row);
	return rc;
}

static void start_with_op(void)
{
	struct start_opts o = {.evaluate = fake_evaluate};

	restart(&o);
}

static struct tr_test_reply evaluate(int64_t id, const char *body)
{
	char path[64];

	snprintf(path, sizeof path, "/jobs/%" PRId64 "/evaluate", id);
	return http("POST", path, body);
}

Test(api, evaluate_queues_a_job_with_its_location)
{
	int64_t id = submit("train");
	struct tr_test_reply r;
	char h[64], want[64];

	start_with_op();
	r = evaluate(id, "{\"checkpoint\": \"best\", \"data\": {\"kind\": \"synthetic\"}}");
	expect_status(&r, 202, "evaluate");
	cr_assert_eq(atomic_load(&calls), 1);
	cr_assert_eq(seen_job, id, "the op is asked about the path's job");
	cr_assert_str_eq(seen_body, "{\"checkpoint\":\"best\",\"data\":{\"kind\":\"synthetic\"}}");
	int64_t eval_id = jint(r.json, "id");
	cr_assert_neq(eval_id, id);
	cr_assert_str_eq(jstr(r.json, "kind"), "evaluate", "the answer is the new job: %s", r.body.data);
	snprintf(want, sizeof want, "/jobs/%" PRId64, eval_id);
	cr_assert_str_eq(header(&r, "Location", h, sizeof h), want);
	resp_free(&r);
}

Test(api, refusals_keep_status_code_and_pointer)
{
	int64_t id = submit("train");
	struct tr_test_reply r;

	start_with_op();
	r = evaluate(id, "{\"data\": 5}");
	expect_status(&r, 400, "bad data");
	cr_assert_str_eq(jstr(r.json, "error.code"), "invalid_spec");
	cr_assert_str_eq(jstr(r.json, "error.pointer"), "/data");
	resp_free(&r);
	r = evaluate(id, "{\"checkpoint\": \"none\"}");
	expect_status(&r, 404, "no checkpoint");
	cr_assert_str_eq(jstr(r.json, "error.pointer"), "/checkpoint");
	resp_free(&r);
	cr_assert_eq(atomic_load(&calls), 2);

	/* These never reach the op. */
	r = evaluate(id, "[1]");
	expect_status(&r, 400, "not an object");
	cr_assert_str_eq(jstr(r.json, "error.code"), "invalid_request");
	resp_free(&r);
	r = evaluate(id, "{");
	expect_status(&r, 400, "not JSON");
	cr_assert_str_eq(jstr(r.json, "error.code"), "invalid_json");
	resp_free(&r);
	r = evaluate(4242, "{}");
	expect_status(&r, 404, "unknown job");
	cr_assert_str_eq(jstr(r.json, "error.code"), "not_found");
	resp_free(&r);
	r = http("POST", "/jobs/0/evaluate", "{}");
	expect_status(&r, 400, "id 0");
	cr_assert_str_eq(jstr(r.json, "error.code"), "invalid_parameter");
	resp_free(&r);
	cr_assert_eq(atomic_load(&calls), 2, "refused before the op");
}

Test(api, without_the_op_it_is_unavailable)
{
	int64_t id = submit("train");
	struct tr_test_reply r = evaluate(id, "{}");

	expect_status(&r, 503, "no op");
	cr_assert_str_eq(jstr(r.json, "error.code"), "unavailable");
	resp_free(&r);
	/* An unknown job is still 404 first. */
	r = evaluate(4242, "{}");
	expect_status(&r, 404, "unknown job without the op");
	resp_free(&r);
}
