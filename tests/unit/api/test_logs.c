/* Unit tests of api/logs.c: a job's log lines, paginated.
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

Test(api, logs_paginate)
{
	int64_t id = submit("l");
	char path[128];
	struct tr_test_reply r;

	for (int i = 0; i < 5; i++) {
		char msg[32];

		snprintf(msg, sizeof(msg), "line %d", i);
		cr_assert_eq(tr_store_log_append(store, id, 6, msg, NULL), 0);
	}
	cr_assert_eq(tr_store_flush(store, NULL), 0);
	snprintf(path, sizeof(path), "/jobs/%" PRId64 "/logs?limit=3", id);
	r = http("GET", path, NULL);
	expect_status(&r, 200, "logs");
	cr_assert_eq(json_array_size(json_object_get(r.json, "logs")), 3);
	cr_assert_str_eq(jstr(json_array_get(json_object_get(r.json, "logs"), 0), "message"), "line 0");
	cr_assert(json_is_string(json_object_get(r.json, "next")));
	snprintf(path, sizeof(path), "/jobs/%" PRId64 "/logs?after=%s", id, jstr(r.json, "next"));
	resp_free(&r);

	r = http("GET", path, NULL);
	expect_status(&r, 200, "logs page 2");
	cr_assert_eq(json_array_size(json_object_get(r.json, "logs")), 2);
	cr_assert_str_eq(jstr(json_array_get(json_object_get(r.json, "logs"), 0), "message"), "line 3");
	cr_assert(json_is_null(json_object_get(r.json, "next")));
	resp_free(&r);
}
