/* Unit tests of api/info.c: PUT /jobs/{id}/info merges short strings into
 * a job's info fields; a bad key or value is refused 400 with its JSON
 * pointer (RFC 6901 escaped), too many fields in one body 400, too many
 * after the merge 409, an unknown job 404.  Over real HTTP against the
 * in-process API of tests/unit/api/fixture.h.
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/unit/api/fixture.h"

TestSuite(api, .init = api_fixture_setup, .fini = api_fixture_teardown, .timeout = 60);

static struct tr_test_reply put_info(int64_t id, const char *body)
{
	char path[64];

	snprintf(path, sizeof path, "/jobs/%" PRId64 "/info", id);
	return http("PUT", path, body);
}

static void expect_refused(int64_t id, const char *body, long status, const char *code, const char *pointer)
{
	struct tr_test_reply r = put_info(id, body);

	expect_status(&r, status, body);
	cr_assert_str_eq(jstr(r.json, "error.code"), code, "%s: %s", body, r.body.data);
	if (pointer) {
		cr_assert_not_null(jstr(r.json, "error.pointer"), "%s: no pointer in %s", body, r.body.data);
		cr_assert_str_eq(jstr(r.json, "error.pointer"), pointer, "%s", body);
		cr_assert_not_null(strstr(jstr(r.json, "error.message"), pointer), "the message names the field: %s",
				   r.body.data);
	}
	resp_free(&r);
}

Test(api, info_merges_and_shows_on_the_job)
{
	int64_t id = submit("info");
	struct tr_test_reply r;
	char path[64];

	r = put_info(id, "{\"phase\": \"warmup\", \"note\": \"first\"}");
	expect_status(&r, 200, "put");
	cr_assert_eq(jint(r.json, "id"), id, "the answer is the job");
	cr_assert_str_eq(jstr(r.json, "info.phase"), "warmup", "%s", r.body.data);
	resp_free(&r);
	/* A second PUT merges: new keys add, existing ones change, others stay. */
	r = put_info(id, "{\"note\": \"second\", \"owner\": \"ana\"}");
	expect_status(&r, 200, "merge");
	resp_free(&r);
	snprintf(path, sizeof path, "/jobs/%" PRId64, id);
	r = http("GET", path, NULL);
	expect_status(&r, 200, "get");
	cr_assert_str_eq(jstr(r.json, "info.phase"), "warmup", "%s", r.body.data);
	cr_assert_str_eq(jstr(r.json, "info.note"), "second");
	cr_assert_str_eq(jstr(r.json, "info.owner"), "ana");
	resp_free(&r);
	/* An empty object changes nothing and is fine. */
	r = put_info(id, "{}");
	expect_status(&r, 200, "empty");
	cr_assert_str_eq(jstr(r.json, "info.owner"), "ana");
	resp_free(&r);
}

Test(api, bad_keys_and_values_name_their_pointer)
{
	int64_t id = submit("info");
	char body[1024], key[TR_INFO_MAX_KEY + 2], value[TR_INFO_MAX_VALUE + 2], ptr[TR_INFO_MAX_KEY + 4];

	expect_refused(id, "{\"n\": 3}", 400, "invalid_request", "/n");
	expect_refused(id, "{\"ok\": \"x\", \"n\": null}", 400, "invalid_request", "/n");
	expect_refused(id, "{\"a/b~c\": 1}", 400, "invalid_request", "/a~1b~0c");
	expect_refused(id, "{\"\": \"x\"}", 400, "invalid_request", "/");
	expect_refused(id, "{\"tab\\tkey\": \"x\"}", 400, "invalid_request", NULL);
	expect_refused(id, "{\"v\": \"line\\nbreak\"}", 400, "invalid_request", "/v");
	/* The body parser refuses an embedded NUL before info.c sees it. */
	expect_refused(id, "{\"v\": \"nul\\u0000inside\"}", 400, "invalid_json", NULL);
	expect_refused(id, "{\"v\": \"del\\u007f\"}", 400, "invalid_request", "/v");

	memset(key, 'k', TR_INFO_MAX_KEY + 1);
	key[TR_INFO_MAX_KEY + 1] = '\0';
	snprintf(body, sizeof body, "{\"%s\": \"x\"}", key);
	snprintf(ptr, sizeof ptr, "/%s", key);
	expect_refused(id, body, 400, "invalid_request", ptr);
	key[TR_INFO_MAX_KEY] = '\0'; /* at the limit: fine */
	memset(value, 'v', TR_INFO_MAX_VALUE + 1);
	value[TR_INFO_MAX_VALUE + 1] = '\0';
	snprintf(body, sizeof body, "{\"%s\": \"%s\"}", key, value);
	snprintf(ptr, sizeof ptr, "/%s", key);
	expect_refused(id, body, 400, "invalid_request", ptr);
	value[TR_INFO_MAX_VALUE] = '\0';
	snprintf(body, sizeof body, "{\"%s\": \"%s\"}", key, value);
	struct tr_test_reply r = put_info(id, body);
	expect_status(&r, 200, "key and value at their limits");
	resp_free(&r);

	/* Not an object, not JSON. */
	expect_refused(id, "[\"a\"]", 400, "invalid_request", NULL);
	expect_refused(id, "{\"a\": ", 400, "invalid_json", NULL);
	/* Nothing of a refused body was stored. */
	char path[64];
	snprintf(path, sizeof path, "/jobs/%" PRId64, id);
	r = http("GET", path, NULL);
	cr_assert_null(jstr(r.json, "info.ok"), "%s", r.body.data);
	resp_free(&r);
}

static char *fields_body(int from, int count)
{
	size_t cap = (size_t)count * 32 + 8;
	char *b = malloc(cap);
	size_t n = 0;

	n += (size_t)snprintf(b + n, cap - n, "{");
	for (int i = 0; i < count; i++)
		n += (size_t)snprintf(b + n, cap - n, "%s\"k%d\": \"v\"", i ? ", " : "", from + i);
	snprintf(b + n, cap - n, "}");
	return b;
}

Test(api, field_limit_per_body_and_after_the_merge)
{
	int64_t id = submit("info");
	struct tr_test_reply r;
	char *body;

	body = fields_body(0, TR_INFO_MAX_FIELDS + 1);
	expect_refused(id, body, 400, "invalid_request", NULL);
	free(body);

	/* Half now, then a body that would go past the limit: 409, and the
	 * job keeps what it had. */
	body = fields_body(0, TR_INFO_MAX_FIELDS / 2);
	r = put_info(id, body);
	expect_status(&r, 200, "half");
	resp_free(&r);
	free(body);
	body = fields_body(TR_INFO_MAX_FIELDS, TR_INFO_MAX_FIELDS / 2 + 1);
	expect_refused(id, body, 409, "conflict", NULL);
	free(body);
	/* Rewriting existing keys adds none: fine at the limit. */
	body = fields_body(TR_INFO_MAX_FIELDS, TR_INFO_MAX_FIELDS / 2);
	r = put_info(id, body);
	expect_status(&r, 200, "up to the limit");
	cr_assert_eq(json_object_size(json_object_get(r.json, "info")), TR_INFO_MAX_FIELDS, "%s", r.body.data);
	resp_free(&r);
	free(body);
	body = fields_body(0, 3);
	r = put_info(id, body);
	expect_status(&r, 200, "existing keys at the limit");
	resp_free(&r);
	free(body);
}

Test(api, unknown_job_and_bad_id)
{
	struct tr_test_reply r;

	expect_refused(999, "{\"a\": \"b\"}", 404, "not_found", NULL);
	r = http("PUT", "/jobs/abc/info", "{\"a\": \"b\"}");
	expect_status(&r, 400, "bad id");
	cr_assert_str_eq(jstr(r.json, "error.code"), "invalid_parameter");
	resp_free(&r);
}
