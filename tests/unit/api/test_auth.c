/* Unit tests of api/auth.c: bearer tokens, the role each route needs (as docs/design.md
 * says), every route against every role, and tokens swapped at run time.
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

Test(api, bearer_tokens)
{
	const char *const tokens[] = {"s3cret", "other-token", NULL};
	struct start_opts o = {.tokens = tokens};
	char h[128];
	struct tr_test_reply r;

	restart(&o);
	r = http("GET", "/healthz", NULL);
	expect_status(&r, 200, "healthz needs no token");
	resp_free(&r);

	r = http("GET", "/version", NULL);
	expect_status(&r, 401, "no token");
	cr_assert_str_eq(jstr(r.json, "error.code"), "unauthorized");
	cr_assert(!strncmp(header(&r, "WWW-Authenticate", h, sizeof(h)), "Bearer", 6), "%s", h);
	resp_free(&r);

	r = http("GET", "/nope", NULL);
	expect_status(&r, 401, "unknown route without a token");
	resp_free(&r);

	r = http_full("GET", "/jobs", NULL, (const char *const[]){"Authorization: Basic dXNlcjpwdw==", NULL}, 0);
	expect_status(&r, 401, "not a bearer token");
	resp_free(&r);

	token = "s3cre";
	r = http("GET", "/jobs", NULL);
	expect_status(&r, 403, "wrong token");
	cr_assert_str_eq(jstr(r.json, "error.code"), "forbidden");
	resp_free(&r);

	token = "s3cret!";
	r = http("GET", "/jobs", NULL);
	expect_status(&r, 403, "longer token");
	resp_free(&r);

	token = "other-token";
	r = http("GET", "/jobs", NULL);
	expect_status(&r, 200, "second token");
	resp_free(&r);
	token = "s3cret";
	r = http("POST", "/jobs", "{\"name\": \"authed\"}");
	expect_status(&r, 201, "submit with token");
	resp_free(&r);
}

/* The role each route needs, as the design gives it: read = every GET,
 * write = submitting, controlling jobs and pushing metrics (and deleting a
 * pushed series), admin = every other DELETE and /reload. */
Test(api, route_roles_follow_the_design)
{
	size_t n;
	const struct tr_api_route *routes = tr_api_routes(&n);

	for (size_t i = 0; i < n; i++) {
		const struct tr_api_route *rt = &routes[i];
		enum tr_api_role want = TR_ROLE_WRITE;

		if (!strcmp(rt->method, "GET"))
			want = TR_ROLE_READ;
		else if ((!strcmp(rt->method, "DELETE") && strcmp(rt->path, "/jobs/{id}/metrics/{name}")) ||
			 !strcmp(rt->path, "/reload"))
			want = TR_ROLE_ADMIN;
		cr_assert_eq(tr_api_route_role(rt), want, "%s %s needs %s, the table says %s", rt->method, rt->path,
			     tr_api_role_name(want), tr_api_role_name(tr_api_route_role(rt)));
	}
}

/* Every route of the table against a token of every role: a role at or
 * above the route's passes auth (whatever the handler then says), a role
 * below is 403 with a message naming both roles; no token is 401. */
Test(api, every_route_against_every_role)
{
	const struct tr_api_token rt[] = {{TR_ROLE_READ, "token-read"},
					  {TR_ROLE_WRITE, "token-write"},
					  {TR_ROLE_ADMIN, "token-admin"}};
	struct start_opts o = {.role_tokens = rt, .n_role_tokens = 3};
	size_t n;
	const struct tr_api_route *routes = tr_api_routes(&n);
	int refused = 0, allowed = 0;

	restart(&o);
	for (size_t i = 0; i < n; i++) {
		const struct tr_api_route *route = &routes[i];
		char path[256] = "";
		const char *p = route->path;

		/* {id} -> a job that does not exist, {step} -> 1. */
		while (*p) {
			if (*p == '{') {
				strcat(path, strncmp(p, "{id}", 4) == 0 ? "987654" : "1");
				p = strchr(p, '}') + 1;
			} else {
				strncat(path, p++, 1);
			}
		}
		const char *body = (route->flags & TR_ROUTE_JSON_BODY) ? "{}" : NULL;
		enum tr_api_role need = tr_api_route_role(route);

		for (int role = TR_ROLE_READ; role <= TR_ROLE_ADMIN; role++) {
			token = rt[role - 1].token;
			struct tr_test_reply r = http(route->method, path, body);
			bool public = route->flags & TR_ROUTE_PUBLIC;

			if (public || role >= (int)need) {
				cr_assert(r.status != 401 && r.status != 403, "%s %s with a %s token: %ld",
					  route->method, path, tr_api_role_name(role), r.status);
				allowed++;
			} else {
				char want[128];

				expect_status(&r, 403, path);
				cr_assert_str_eq(jstr(r.json, "error.code"), "forbidden");
				snprintf(want, sizeof(want),
					 "needs a token with the %s role; this token has the %s role",
					 tr_api_role_name(need), tr_api_role_name(role));
				cr_assert(strstr(jstr(r.json, "error.message"), want), "%s %s: %s", route->method, path,
					  jstr(r.json, "error.message"));
				/* The token itself is never echoed. */
				cr_assert(!strstr(r.body.data, "token-"), "%s", r.body.data);
				refused++;
			}
			resp_free(&r);
		}
		token = NULL;
		struct tr_test_reply r = http(route->method, path, body);
		if (!(route->flags & TR_ROUTE_PUBLIC))
			expect_status(&r, 401, path);
		resp_free(&r);
	}
	cr_assert_gt(refused, 0);
	cr_assert_gt(allowed, 0);
}

Test(api, tokens_swap_at_run_time)
{
	const struct tr_api_token before[] = {{TR_ROLE_WRITE, "old-token"}};
	const struct tr_api_token after[] = {{TR_ROLE_READ, "new-token"}};
	struct start_opts o = {.role_tokens = before, .n_role_tokens = 1};
	struct tr_error err = {0};
	struct tr_test_reply r;

	restart(&o);
	token = "old-token";
	r = http("POST", "/jobs/5/cancel", NULL);
	cr_assert_neq(r.status, 403);
	resp_free(&r);
	cr_assert_eq(tr_api_set_tokens(api, NULL, after, 1, &err), 0, "%s", err.message);
	r = http("GET", "/jobs", NULL);
	expect_status(&r, 403, "the old token after the swap");
	resp_free(&r);
	token = "new-token";
	r = http("GET", "/jobs", NULL);
	expect_status(&r, 200, "the new token");
	resp_free(&r);
	r = http("POST", "/jobs/5/cancel", NULL);
	expect_status(&r, 403, "a read token on a control route");
	resp_free(&r);
	/* An empty token is refused and changes nothing. */
	const struct tr_api_token empty[] = {{TR_ROLE_ADMIN, ""}};
	cr_assert_lt(tr_api_set_tokens(api, NULL, empty, 1, &err), 0);
	r = http("GET", "/jobs", NULL);
	expect_status(&r, 200, "after a refused swap");
	resp_free(&r);
	token = NULL;
}
