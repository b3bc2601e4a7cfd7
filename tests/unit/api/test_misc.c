/* Unit tests of api/misc.c: liveness, readiness (the daemon's say), version, devices and
 * the OpenAPI document read from disk.
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

Test(api, health_ready_version_devices)
{
	struct tr_test_reply r = http("GET", "/healthz", NULL);
	char h[128];

	expect_status(&r, 200, "healthz");
	cr_assert_str_eq(jstr(r.json, "status"), "ok");
	cr_assert_str_eq(header(&r, "Content-Type", h, sizeof(h)), "application/json");
	resp_free(&r);

	/* HEAD works where GET does, for probes; the body is dropped. */
	r = http_full("HEAD", "/healthz", NULL, NULL, 0);
	cr_assert_eq(r.status, 200);
	cr_assert_eq(r.body.len, 0);
	resp_free(&r);

	r = http("GET", "/readyz", NULL);
	expect_status(&r, 200, "readyz");
	cr_assert(json_is_true(json_object_get(r.json, "ready")));
	resp_free(&r);

	atomic_store(&daemon_ready, false);
	r = http("GET", "/readyz", NULL);
	atomic_store(&daemon_ready, true);
	expect_status(&r, 503, "readyz while not ready");
	cr_assert_str_eq(jstr(r.json, "error.code"), "not_ready");
	resp_free(&r);

	r = http("GET", "/version", NULL);
	expect_status(&r, 200, "version");
	cr_assert_str_eq(jstr(r.json, "version"), "1.2.3-test");
	cr_assert_eq(jint(r.json, "api"), 1);
	resp_free(&r);

	r = http("GET", "/devices", NULL);
	expect_status(&r, 200, "devices");
	cr_assert_eq(json_array_size(json_object_get(r.json, "devices")), 1);
	cr_assert_str_eq(jstr(json_array_get(json_object_get(r.json, "devices"), 0), "name"), "cpu0");
	{
		/* The daemon hands data; the API renders every field of it. */
		json_t *d = json_array_get(json_object_get(r.json, "devices"), 0);
		cr_assert_eq(jint(d, "id"), 0);
		cr_assert_str_eq(jstr(d, "kind"), "cpu");
		cr_assert_eq(jint(d, "memory_total"), 1024);
		cr_assert_eq(jint(d, "memory_free"), 512);
		cr_assert(json_is_null(json_object_get(d, "job")), "a free device's job is null");
	}
	resp_free(&r);

	/* No document configured. */
	r = http("GET", "/openapi.yaml", NULL);
	expect_status(&r, 404, "openapi.yaml unset");
	resp_free(&r);
}

Test(api, openapi_document)
{
	char path[PATH_MAX + 16], h[128];
	const char *text = "openapi: 3.0.3\ninfo:\n  title: trainerd\n";
	struct start_opts o = {0};
	FILE *f;

	snprintf(path, sizeof(path), "%s/openapi.yaml", dir);
	f = fopen(path, "w");
	fputs(text, f);
	fclose(f);
	o.openapi = path;
	restart(&o);

	struct tr_test_reply r = http("GET", "/openapi.yaml", NULL);

	cr_assert_eq(r.status, 200);
	cr_assert_str_eq(r.body.data, text);
	cr_assert_str_eq(header(&r, "Content-Type", h, sizeof(h)), "application/yaml");
	resp_free(&r);
}
