/* Unit tests of api/server.c: request body limits (declared, chunked, slow) and the
 * configurations tr_api_start refuses.
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

Test(api, body_limits)
{
	size_t big = (size_t)2 << 20;
	char *body = malloc(big + 1);
	struct tr_test_reply r;

	memset(body, ' ', big);
	body[0] = '{';
	body[big - 1] = '}';
	body[big] = '\0';
	r = http("POST", "/jobs", body);
	expect_status(&r, 413, "declared Content-Length over the cap");
	cr_assert_str_eq(jstr(r.json, "error.code"), "payload_too_large");
	resp_free(&r);

	/* A client that sends at once, without waiting for "100 Continue",
	 * and slowly: answered after its body is read, not with the
	 * connection closed under it mid-upload (curl: "Failed sending data
	 * to the peer").  The message names the size. */
	const char *no_expect[] = {"Expect:", "Content-Length: 2097152", NULL};
	r = http_full("POST", "/jobs", NULL, no_expect, big);
	expect_status(&r, 413, "declared Content-Length over the cap, no Expect, slow");
	cr_assert_str_eq(jstr(r.json, "error.code"), "payload_too_large");
	cr_assert(strstr(jstr(r.json, "error.message"), "2097152 bytes"), "%s", jstr(r.json, "error.message"));
	cr_assert_eq(r.uploaded, (curl_off_t)big, "the 413 came after %lld of %zu bytes: the rest would be reset",
		     (long long)r.uploaded, big);
	resp_free(&r);

	r = http_full("POST", "/jobs", NULL, NULL, big);
	expect_status(&r, 413, "chunked body over the cap");
	cr_assert_str_eq(jstr(r.json, "error.code"), "payload_too_large");
	resp_free(&r);

	/* Just under the cap is fine (a spec padded with whitespace). */
	memset(body, ' ', (size_t)1 << 20);
	memcpy(body, "{\"name\": \"pad\"}", 15);
	body[(size_t)1 << 20] = '\0';
	r = http("POST", "/jobs", body);
	expect_status(&r, 201, "body at the cap");
	resp_free(&r);
	free(body);

	r = http("GET", "/healthz", NULL);
	expect_status(&r, 200, "healthz after big bodies");
	resp_free(&r);
}

Test(api, start_refuses_bad_configs)
{
	struct tr_error e = {0};
	struct start_opts o = {.host = "0.0.0.0"};
	const char *const empty[] = {NULL};

	cr_assert_null(start_with(&o, &e));
	cr_assert(strstr(e.message, "token"), "%s", e.message);

	o = (struct start_opts){.tokens = empty};
	e.message[0] = '\0';
	cr_assert_null(start_with(&o, &e));
	cr_assert(strstr(e.message, "empty"), "%s", e.message);

	o = (struct start_opts){.port = port};
	e.message[0] = '\0';
	cr_assert_null(start_with(&o, &e));
	cr_assert(strstr(e.message, "in use"), "%s", e.message);

	o = (struct start_opts){.host = "not-an-address.invalid"};
	e.message[0] = '\0';
	cr_assert_null(start_with(&o, &e));
	cr_assert_neq(e.message[0], '\0');

	/* Loopback IPv6 without tokens is fine (when the host has IPv6). */
	o = (struct start_opts){.host = "::1"};
	tr_api_t *v6 = start_with(&o, &e);

	if (v6)
		cr_assert_gt(tr_api_port(v6), 0);
	tr_api_stop(v6);
	tr_api_stop(NULL);
}
