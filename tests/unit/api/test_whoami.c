/* Unit tests of api/whoami.c: GET /whoami names the role of the token
 * sent (the best role when a token is listed twice), admin for everyone
 * when the daemon has no tokens, and is refused like any read without a
 * valid token.  Over real HTTP against the in-process API of
 * tests/unit/api/fixture.h.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "api/routes.h"
#include "tests/unit/api/fixture.h"

TestSuite(api, .init = api_fixture_setup, .fini = api_fixture_teardown, .timeout = 60);

static void expect_role(const char *tok, const char *role, bool tokens)
{
	struct tr_test_reply r;

	token = tok;
	r = http("GET", "/whoami", NULL);
	expect_status(&r, 200, "whoami");
	cr_assert_str_eq(jstr(r.json, "role"), role, "token %s", tok ? tok : "(none)");
	cr_assert_eq(json_is_true(json_object_get(r.json, "tokens")), tokens);
	cr_assert_eq(json_object_size(r.json), 2, "role and tokens only: %s", r.body.data);
	resp_free(&r);
}

Test(api, whoami_without_tokens_is_admin)
{
	expect_role(NULL, "admin", false);
}

Test(api, whoami_names_each_tokens_role)
{
	const struct tr_api_token rt[] = {{TR_ROLE_READ, "token-read"},
					  {TR_ROLE_WRITE, "token-write"},
					  {TR_ROLE_ADMIN, "token-admin"},
					  {TR_ROLE_READ, "token-twice"},
					  {TR_ROLE_WRITE, "token-twice"}};
	const char *const plain[] = {"plain-token", NULL};
	struct start_opts o = {.tokens = plain, .role_tokens = rt, .n_role_tokens = 5};
	struct tr_test_reply r;

	restart(&o);
	expect_role("token-read", "read", true);
	expect_role("token-write", "write", true);
	expect_role("token-admin", "admin", true);
	expect_role("token-twice", "write", true);
	expect_role("plain-token", "admin", true);

	token = NULL;
	r = http("GET", "/whoami", NULL);
	expect_status(&r, 401, "whoami without a token");
	resp_free(&r);
	token = "token-wrong";
	r = http("GET", "/whoami", NULL);
	expect_status(&r, 403, "whoami with a wrong token");
	cr_assert(!strstr(r.body.data, "token-"), "the answer names no token: %s", r.body.data);
	resp_free(&r);
}
