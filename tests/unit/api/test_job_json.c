/* Unit tests of api/job_json.c: a job's JSON from its stored row.
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

Test(api, job_json_from_row)
{
	struct tr_job_row row = {
		.id = 9,
		.name = "n",
		.state = TR_JOB_FAILED,
		.priority = 3,
		.spec = "{\"epochs\": 2}",
		.devices = "[0, 1]",
		.error = "{\"code\": \"loader\", \"message\": \"x.csv line 3\", \"step\": 7}",
		.submitted_at = 1700000000.1234,
		.started_at = 1700000001.9996,
		.finished_at = 0,
		.step = 7,
		.total_steps = 10,
		.epoch = 0,
		.loss = NAN,
	};
	json_t *live = json_pack("{s:I, s:f}", "step", (json_int_t)8, "eta_s", 3.0);
	json_t *j = tr_api_job_json(&row, live);

	cr_assert_not_null(j);
	cr_assert_eq(jint(j, "id"), 9);
	cr_assert_str_eq(jstr(j, "state"), "failed");
	cr_assert_eq(jint(json_object_get(j, "spec"), "epochs"), 2);
	cr_assert_eq(json_array_size(json_object_get(j, "devices")), 2);
	cr_assert_str_eq(jstr(j, "error.code"), "loader");
	cr_assert_str_eq(jstr(j, "submitted_at"), "2023-11-14T22:13:20.123Z");
	cr_assert_str_eq(jstr(j, "started_at"), "2023-11-14T22:13:22.000Z");
	cr_assert(json_is_null(json_object_get(j, "finished_at")));
	cr_assert_eq(jint(json_object_get(j, "progress"), "step"), 8, "live values win");
	cr_assert(json_is_null(json_object_get(json_object_get(j, "progress"), "loss")));
	json_decref(j);
	json_decref(live);
}

/* Whether the state is an end comes from core/job.c, for every state;
 * loader_threads is the runner's stored figure, null until it started. */
Test(api, job_json_terminal_and_loader_threads)
{
	for (int st = 0; st < TR_JOB_NSTATES; st++) {
		struct tr_job_row row = {.id = 1, .state = (enum tr_job_state)st, .loss = NAN};
		json_t *j = tr_api_job_json(&row, NULL);

		cr_assert_not_null(j);
		cr_expect(json_is_boolean(json_object_get(j, "terminal")), "state %s", tr_job_state_name(st));
		cr_expect_eq(json_is_true(json_object_get(j, "terminal")), tr_job_state_terminal(st), "state %s",
			     tr_job_state_name(st));
		cr_expect(json_is_null(json_object_get(j, "loader_threads")), "not started: null");
		json_decref(j);
	}
	struct tr_job_row row = {.id = 2, .state = TR_JOB_RUNNING, .loss = NAN, .loader_threads = 3};
	json_t *j = tr_api_job_json(&row, NULL);
	cr_assert_eq(jint(j, "loader_threads"), 3);
	cr_assert(json_is_false(json_object_get(j, "terminal")));
	json_decref(j);
}
