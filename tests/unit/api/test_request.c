/* Unit tests of api/request.c (and the error shape of api/errors.c): a table of bad
 * requests across the routes, each with its status, error code and
 * pointer.
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

struct bad {
	const char *method, *path, *body;
	const char *hdr; /* one extra header or NULL */
	long status;
	const char *code;
	const char *pointer;    /* expected error.pointer, or NULL for none */
	const char *msg_prefix; /* expected start of error.message, or NULL */
};

static char *points_json(int n)
{
	size_t cap = (size_t)n * 48 + 32, len = 0;
	char *s = malloc(cap);

	len += (size_t)snprintf(s + len, cap - len, "{\"points\": [");
	for (int i = 0; i < n; i++)
		len += (size_t)snprintf(s + len, cap - len, "%s{\"name\": \"m\", \"step\": %d, \"value\": 1}",
					i ? "," : "", i);
	snprintf(s + len, cap - len, "]}");
	return s;
}

Test(api, bad_requests)
{
	int64_t id = submit("victim"), running = submit("busy");
	char *too_many = points_json(10001);
	char long_key[300] = "Idempotency-Key: ";

	memset(long_key + strlen(long_key), 'k', 256);
	cr_assert_eq(tr_store_job_set_state(store, id, TR_JOB_CANCELLED, NULL, NULL, NULL), 0);
	cr_assert_eq(tr_store_job_set_state(store, running, TR_JOB_RUNNING, NULL, NULL, NULL), 0);
	cr_assert_eq(id, 1, "the table below uses job 1 (cancelled) and 2 (running)");
	/* Burn an idempotency key so the conflict case has one. */
	struct tr_test_reply k =
		http_full("POST", "/jobs", "{\"name\":\"a\"}", (const char *const[]){"Idempotency-Key: K", NULL}, 0);

	resp_free(&k);

	const struct bad cases[] = {
		{"POST", "/jobs", "{\"name\": ", NULL, 400, "invalid_json", NULL, "line 1, column"},
		{"POST", "/jobs", "", NULL, 400, "invalid_json", NULL, "line 1, column"},
		{"POST", "/jobs", "[1, 2]", NULL, 400, "invalid_request", NULL, NULL},
		{"POST", "/jobs", "\"spec\"", NULL, 400, "invalid_request", NULL, NULL},
		{"POST", "/jobs", "{\"a\": 1, \"a\": 2}", NULL, 400, "invalid_json", NULL, NULL},
		{"POST", "/jobs", "{}", "Content-Type: text/plain", 415, "unsupported_media_type", NULL, NULL},
		{"POST", "/jobs", "{}", "Content-Type: application/jsonx", 415, "unsupported_media_type", NULL, NULL},
		{"POST", "/jobs", "{}", "Content-Type:", 415, "unsupported_media_type", NULL, NULL},
		{"POST", "/jobs?priority=2000", "{}", NULL, 400, "invalid_parameter", NULL, "priority:"},
		{"POST", "/jobs?priority=x", "{}", NULL, 400, "invalid_parameter", NULL, "priority:"},
		{"POST", "/jobs", "{\"bad\": 1}", NULL, 400, "invalid_spec", "/bad", NULL},
		{"POST", "/jobs", "{\"name\":\"b\"}", "Idempotency-Key: K", 409, "idempotency_conflict", NULL, NULL},
		{"POST", "/jobs", "{}", long_key, 400, "invalid_parameter", NULL, "Idempotency-Key"},
		{"POST", "/jobs", "{}", "Idempotency-Key: caf\xc3\xa9", 400, "invalid_parameter", NULL, NULL},
		{"GET", "/jobs/999", NULL, NULL, 404, "not_found", NULL, "job 999 not found"},
		{"GET", "/jobs/abc", NULL, NULL, 400, "invalid_parameter", NULL, "id:"},
		{"GET", "/jobs/0", NULL, NULL, 400, "invalid_parameter", NULL, NULL},
		{"GET", "/jobs/-1", NULL, NULL, 400, "invalid_parameter", NULL, NULL},
		{"GET", "/jobs/99999999999999999999", NULL, NULL, 400, "invalid_parameter", NULL, NULL},
		{"GET", "/jobs?limit=0", NULL, NULL, 400, "invalid_parameter", NULL,
		 "limit: must be an integer in [1, 1000]"},
		{"GET", "/jobs?limit=abc", NULL, NULL, 400, "invalid_parameter", NULL, "limit:"},
		{"GET", "/jobs?limit=1001", NULL, NULL, 400, "invalid_parameter", NULL, "limit:"},
		{"GET", "/jobs?after=-5", NULL, NULL, 400, "invalid_parameter", NULL, "after:"},
		{"GET", "/jobs?state=done", NULL, NULL, 400, "invalid_parameter", NULL, "state:"},
		{"GET", "/jobs/1/metrics?max_points=-1", NULL, NULL, 400, "invalid_parameter", NULL,
		 "max_points: must be an integer in [0, 100000]"},
		{"GET", "/jobs/1/metrics?max_points=100001", NULL, NULL, 400, "invalid_parameter", NULL, "max_points:"},
		{"GET", "/jobs/1/metrics?from_step=10&to_step=5", NULL, NULL, 400, "invalid_parameter", NULL,
		 "from_step:"},
		{"GET", "/jobs/1/metrics?epochs=yes", NULL, NULL, 400, "invalid_parameter", NULL, "epochs:"},
		{"GET", "/jobs/1/metrics?names=a,,b", NULL, NULL, 400, "invalid_parameter", NULL, "names:"},
		{"GET", "/jobs/77/metrics", NULL, NULL, 404, "not_found", NULL, NULL},
		{"POST", "/jobs/1/cancel", NULL, NULL, 409, "conflict", NULL, NULL},
		{"POST", "/jobs/1/resume", NULL, NULL, 409, "conflict", NULL, NULL},
		{"POST", "/jobs/42/cancel", NULL, NULL, 404, "not_found", NULL, "job 42 not found"},
		{"DELETE", "/jobs/2", NULL, NULL, 409, "conflict", NULL, NULL},
		{"PATCH", "/jobs/1", "{\"colour\": \"red\"}", NULL, 400, "invalid_request", "/colour", NULL},
		{"PATCH", "/jobs/1", "{\"a/b\": 1}", NULL, 400, "invalid_request", "/a~1b", NULL},
		{"PATCH", "/jobs/1", "{\"priority\": 5000}", NULL, 400, "invalid_request", "/priority", NULL},
		{"PATCH", "/jobs/1", "{\"priority\": \"high\"}", NULL, 400, "invalid_request", "/priority", NULL},
		{"PATCH", "/jobs/1", "{\"priority\": 1.5}", NULL, 400, "invalid_request", "/priority", NULL},
		{"PATCH", "/jobs/1", "{}", NULL, 400, "invalid_request", "/priority", NULL},
		{"PATCH", "/jobs/1", "{\"priority\": 1}", "Content-Type: text/json", 415, "unsupported_media_type",
		 NULL, NULL},
		{"POST", "/jobs/1/metrics", "{\"points\": [{\"name\": \"loss\", \"step\": 1, \"value\": 1}]}", NULL,
		 400, "invalid_request", "/points/0/name", NULL},
		{"POST", "/jobs/1/metrics",
		 "{\"points\": [{\"name\": \"device3_step_ms\", \"step\": 1, \"value\": 1}]}", NULL, 400,
		 "invalid_request", "/points/0/name", NULL},
		{"POST", "/jobs/1/metrics",
		 "{\"points\": [{\"name\":\"a\",\"step\":1,\"value\":1}, {\"name\":\"b\",\"step\":1,\"value\":1},"
		 " {\"name\": \"bad name!\", \"step\": 1, \"value\": 1}]}",
		 NULL, 400, "invalid_request", "/points/2/name", NULL},
		{"POST", "/jobs/1/metrics",
		 "{\"points\": [{\"name\": \"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\", "
		 "\"step\": 1, \"value\": 1}]}",
		 NULL, 400, "invalid_request", "/points/0/name", NULL},
		{"POST", "/jobs/1/metrics", "{\"points\": [{\"name\": \"a\", \"step\": 1, \"value\": \"1\"}]}", NULL,
		 400, "invalid_request", "/points/0/value", NULL},
		{"POST", "/jobs/1/metrics", "{\"points\": [{\"name\": \"a\", \"step\": -1, \"value\": 1}]}", NULL, 400,
		 "invalid_request", "/points/0/step", NULL},
		{"POST", "/jobs/1/metrics",
		 "{\"points\": [{\"name\": \"a\", \"step\": 1, \"value\": 1, \"epoch\": -2}]}", NULL, 400,
		 "invalid_request", "/points/0/epoch", NULL},
		{"POST", "/jobs/1/metrics", "{\"points\": [{\"name\": \"a\", \"step\": 1, \"value\": 1, \"x\": 0}]}",
		 NULL, 400, "invalid_request", "/points/0/x", NULL},
		{"POST", "/jobs/1/metrics", "{\"points\": []}", NULL, 400, "invalid_request", "/points", NULL},
		{"POST", "/jobs/1/metrics", "{\"points\": 3}", NULL, 400, "invalid_request", "/points", NULL},
		{"POST", "/jobs/1/metrics", too_many, NULL, 400, "invalid_request", "/points", NULL},
		{"POST", "/jobs/1/metrics", "{\"pts\": []}", NULL, 400, "invalid_request", "/pts", NULL},
		{"POST", "/jobs/77/metrics", "{\"points\": [{\"name\": \"a\", \"step\": 1, \"value\": 1}]}", NULL, 404,
		 "not_found", NULL, NULL},
		{"GET", "/jobs/1/events", NULL, "Last-Event-ID: x", 400, "invalid_parameter", NULL, "Last-Event-ID:"},
		{"GET", "/jobs/1/events?last_event_id=-1", NULL, NULL, 400, "invalid_parameter", NULL,
		 "last_event_id:"},
		{"GET", "/jobs/1/logs?limit=10001", NULL, NULL, 400, "invalid_parameter", NULL, "limit:"},
		{"GET", "/jobs/1/logs?after=z", NULL, NULL, 400, "invalid_parameter", NULL, "after:"},
		{"GET", "/jobs/77/checkpoints", NULL, NULL, 404, "not_found", NULL, "job 77 not found"},
		{"GET", "/jobs/x/checkpoints", NULL, NULL, 400, "invalid_parameter", NULL, "id:"},
		{"POST", "/jobs/77/checkpoints", NULL, NULL, 404, "not_found", NULL, "job 77 not found"},
		{"POST", "/jobs/1/checkpoints", NULL, NULL, 409, "conflict", NULL, NULL},
		{"GET", "/jobs/1/checkpoints/latest/model.safetensors", NULL, NULL, 404, "not_found", NULL,
		 "job 1 has no checkpoint"},
		{"GET", "/jobs/1/checkpoints/5/checkpoint.safetensors", NULL, NULL, 404, "not_found", NULL,
		 "job 1 has no checkpoint at step 5"},
		{"GET", "/jobs/77/checkpoints/5/checkpoint.safetensors", NULL, NULL, 404, "not_found", NULL,
		 "job 77 not found"},
		{"GET", "/jobs/1/checkpoints/abc/model.safetensors", NULL, NULL, 400, "invalid_parameter", NULL,
		 "step:"},
		{"GET", "/jobs/1/checkpoints/-1/model.safetensors", NULL, NULL, 400, "invalid_parameter", NULL,
		 "step:"},
		{"GET", "/jobs/1/checkpoints/05/model.safetensors", NULL, NULL, 400, "invalid_parameter", NULL,
		 "step:"},
		{"GET", "/jobs/1/checkpoints/LATEST/model.safetensors", NULL, NULL, 400, "invalid_parameter", NULL,
		 "step:"},
		{"GET", "/jobs/1/checkpoints/99999999999999999999/model.safetensors", NULL, NULL, 400,
		 "invalid_parameter", NULL, "step:"},
		{"GET", "/jobs/1/checkpoints/0000000000000000000000000000000000000001/model.safetensors", NULL, NULL,
		 400, "invalid_parameter", NULL, "step:"},
		{"GET", "/jobs/1/checkpoints/5/weights.bin", NULL, NULL, 404, "not_found", NULL, NULL},
		{"GET", "/jobs/1/checkpoints/5", NULL, NULL, 404, "not_found", NULL, NULL},
		{"POST", "/jobs/1/checkpoints/5/model.safetensors", NULL, NULL, 405, "method_not_allowed", NULL, NULL},
		{"DELETE", "/jobs/1/checkpoints", NULL, NULL, 405, "method_not_allowed", NULL, NULL},
		{"GET", "/nope", NULL, NULL, 404, "not_found", NULL, NULL},
		{"GET", "/jobs/1/nope", NULL, NULL, 404, "not_found", NULL, NULL},
		{"GET", "/jobs/", NULL, NULL, 404, "not_found", NULL, NULL},
		{"DELETE", "/jobs", NULL, NULL, 405, "method_not_allowed", NULL, NULL},
		{"PUT", "/jobs/1", "{}", NULL, 405, "method_not_allowed", NULL, NULL},
		{"GET", "/jobs/1/cancel", NULL, NULL, 405, "method_not_allowed", NULL, NULL},
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct bad *c = &cases[i];
		const char *hdrs[] = {c->hdr, NULL};
		struct tr_test_reply r = http_full(c->method, c->path, c->body, hdrs, 0);
		char what[160];

		snprintf(what, sizeof(what), "case %zu: %s %s", i, c->method, c->path);
		expect_status(&r, c->status, what);
		cr_assert_str_eq(jstr(r.json, "error.code"), c->code, "%s: %s", what, r.body.data);
		cr_assert(json_is_string(json_object_get(json_object_get(r.json, "error"), "message")), "%s", what);
		if (c->pointer)
			cr_assert_str_eq(jstr(r.json, "error.pointer"), c->pointer, "%s: %s", what, r.body.data);
		else
			cr_assert_null(json_object_get(json_object_get(r.json, "error"), "pointer"), "%s: %s", what,
				       r.body.data);
		if (c->msg_prefix)
			cr_assert(!strncmp(jstr(r.json, "error.message"), c->msg_prefix, strlen(c->msg_prefix)),
				  "%s: message %s", what, jstr(r.json, "error.message"));
		resp_free(&r);
	}
	free(too_many);

	/* 405 names what is allowed. */
	struct tr_test_reply r = http("DELETE", "/jobs", NULL);
	char allow[64];

	header(&r, "Allow", allow, sizeof(allow));
	cr_assert(strstr(allow, "GET") && strstr(allow, "POST"), "Allow: %s", allow);
	resp_free(&r);

	r = http("GET", "/healthz", NULL);
	expect_status(&r, 200, "healthz after the abuse");
	resp_free(&r);
}
