/* Unit tests of api/ui.c: the dashboard's compiled-in files: each served
 * byte for byte with its content type, a strong ETag, Cache-Control:
 * no-cache, nosniff and the Content-Security-Policy; If-None-Match
 * answered 304 only for the file's own tag (in a list, or "*"); unknown
 * names and /ui/index.html are 404; both routes open without a token.
 * Over real HTTP against the in-process API of tests/unit/api/fixture.h.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "api/ui_assets.h"
#include "tests/unit/api/fixture.h"

TestSuite(api, .init = api_fixture_setup, .fini = api_fixture_teardown, .timeout = 60);

static const struct tr_ui_asset *asset(const char *name)
{
	for (size_t i = 0; i < tr_ui_asset_count; i++)
		if (strcmp(tr_ui_assets[i].name, name) == 0)
			return &tr_ui_assets[i];
	cr_assert_fail("the dashboard has no %s", name);
	return NULL;
}

static struct tr_test_reply get_if(const char *path, const char *if_none_match)
{
	char h[320];
	const char *hdrs[] = {h, NULL};

	snprintf(h, sizeof h, "If-None-Match: %s", if_none_match);
	return http_full("GET", path, NULL, if_none_match ? hdrs : NULL, 0);
}

static void expect_headers(const struct tr_test_reply *r, const struct tr_ui_asset *a)
{
	char h[512];

	cr_assert_str_eq(header(r, "ETag", h, sizeof h), a->etag, "%s", a->name);
	cr_assert_str_eq(header(r, "Cache-Control", h, sizeof h), "no-cache", "%s", a->name);
	cr_assert_str_eq(header(r, "X-Content-Type-Options", h, sizeof h), "nosniff", "%s", a->name);
	header(r, "Content-Security-Policy", h, sizeof h);
	cr_assert(strstr(h, "default-src 'self'") && strstr(h, "connect-src 'self'") &&
			  strstr(h, "frame-ancestors 'none'"),
		  "%s: CSP %s", a->name, h);
}

Test(api, every_asset_served_whole_with_its_type_and_tag)
{
	cr_assert_geq(tr_ui_asset_count, 3);
	for (size_t i = 0; i < tr_ui_asset_count; i++) {
		const struct tr_ui_asset *a = &tr_ui_assets[i];
		char path[160];
		struct tr_test_reply r;

		if (strcmp(a->name, "index.html") == 0)
			snprintf(path, sizeof path, "/");
		else
			snprintf(path, sizeof path, "/ui/%s", a->name);
		r = http("GET", path, NULL);
		cr_assert_eq(r.status, 200, "%s: %ld", path, r.status);
		cr_assert_str_eq(r.content_type, a->content_type, "%s", path);
		cr_assert_eq(r.body.len, a->len, "%s: %zu bytes, not %zu", path, r.body.len, a->len);
		cr_assert(memcmp(r.body.data, a->data, a->len) == 0, "%s: the bytes differ", path);
		/* A strong tag: quoted, no W/ prefix. */
		cr_assert(a->etag[0] == '"' && a->etag[strlen(a->etag) - 1] == '"', "%s", a->etag);
		expect_headers(&r, a);
		resp_free(&r);
	}
}

Test(api, if_none_match_gives_304_only_for_the_own_tag)
{
	const struct tr_ui_asset *a = asset("app.js"), *b = asset("app.css");
	char list[200], near[64];
	struct tr_test_reply r;

	r = get_if("/ui/app.js", a->etag);
	cr_assert_eq(r.status, 304, "own tag: %ld", r.status);
	cr_assert_eq(r.body.len, 0, "a 304 has no body");
	expect_headers(&r, a);
	resp_free(&r);

	snprintf(list, sizeof list, "\"0000\", %s, %s", b->etag, a->etag);
	r = get_if("/ui/app.js", list);
	cr_assert_eq(r.status, 304, "tag at the end of a list: %ld", r.status);
	resp_free(&r);
	snprintf(list, sizeof list, "%s,%s", a->etag, b->etag);
	r = get_if("/ui/app.js", list);
	cr_assert_eq(r.status, 304, "tag at the start of a list: %ld", r.status);
	resp_free(&r);

	r = get_if("/ui/app.js", "*");
	cr_assert_eq(r.status, 304, "*: %ld", r.status);
	resp_free(&r);

	/* Another file's tag, or this tag's text inside a longer one, is no
	 * match: the file is sent. */
	r = get_if("/ui/app.js", b->etag);
	cr_assert_eq(r.status, 200, "another file's tag: %ld", r.status);
	cr_assert_eq(r.body.len, a->len);
	resp_free(&r);
	snprintf(near, sizeof near, "%.*sff\"", (int)strlen(a->etag) - 1, a->etag);
	r = get_if("/ui/app.js", near);
	cr_assert_eq(r.status, 200, "a longer tag %s: %ld", near, r.status);
	resp_free(&r);
	snprintf(list, sizeof list, "%sx", a->etag);
	r = get_if("/ui/app.js", list);
	cr_assert_eq(r.status, 200, "the tag followed by more text %s: %ld", list, r.status);
	resp_free(&r);

	/* The page at / revalidates the same way. */
	r = get_if("/", asset("index.html")->etag);
	cr_assert_eq(r.status, 304, "index: %ld", r.status);
	resp_free(&r);
}

Test(api, unknown_files_are_404_and_index_has_one_address)
{
	const char *paths[] = {"/ui/index.html", "/ui/nope.js", "/ui/.hidden", "/ui/app.js.map"};

	for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
		struct tr_test_reply r = http("GET", paths[i], NULL);

		expect_status(&r, 404, paths[i]);
		cr_assert_str_eq(jstr(r.json, "error.code"), "not_found", "%s", paths[i]);
		resp_free(&r);
	}
	struct tr_test_reply r = http("POST", "/ui/app.js", NULL);

	cr_assert_eq(r.status, 405, "POST to an asset: %ld", r.status);
	resp_free(&r);
}

Test(api, open_without_a_token)
{
	const char *tokens[] = {"sekrit", NULL};
	struct start_opts o = {.tokens = tokens};
	struct tr_test_reply r;

	restart(&o);
	r = http("GET", "/jobs", NULL);
	cr_assert_eq(r.status, 401, "the API itself needs the token: %ld", r.status);
	resp_free(&r);
	r = http("GET", "/", NULL);
	cr_assert_eq(r.status, 200, "the page: %ld", r.status);
	resp_free(&r);
	r = http("GET", "/ui/app.css", NULL);
	cr_assert_eq(r.status, 200, "an asset: %ld", r.status);
	resp_free(&r);
}
