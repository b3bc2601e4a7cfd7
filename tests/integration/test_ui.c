/* The dashboard's routes over HTTP (api/ui.c): GET / and GET /ui/{asset}
 * serve the files compiled into the binary, with a strong ETag that a
 * conditional request turns into 304, Cache-Control: no-cache and a
 * Content-Security-Policy that keeps the page on this daemon; both answer
 * without a token when the API needs one (the page asks for it), and the
 * API behind them still does not.  The browser test (tests/browser/)
 * checks what the page does with them. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "harness.h"

static struct daemon d;

static void start_plain(void)
{
	daemon_start(&d, 1, NULL);
}

static void start_token(void)
{
	static const char *const extra[] = {"--token", "ui-test-token", NULL};

	daemon_start(&d, 1, extra);
}

static void stop(void)
{
	daemon_cleanup(&d);
}

/* The value of header name in r (static buffer), or NULL. */
static const char *header(const struct http_reply *r, const char *name)
{
	static char value[512];
	size_t n = strlen(name);

	for (const char *p = r->headers; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
		if (strncasecmp(p, name, n) == 0 && p[n] == ':') {
			const char *v = p + n + 1;
			size_t len;

			while (*v == ' ')
				v++;
			len = strcspn(v, "\r\n");
			if (len >= sizeof value)
				len = sizeof value - 1;
			memcpy(value, v, len);
			value[len] = '\0';
			return value;
		}
	}
	return NULL;
}

static void expect_asset(const char *path, const char *type_prefix, const char *needle)
{
	struct http_reply r;
	const char *v;

	http(&d, "GET", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200, "%s: %ld %s", path, r.status, r.body);
	v = header(&r, "Content-Type");
	cr_assert(v && strncmp(v, type_prefix, strlen(type_prefix)) == 0, "%s: Content-Type %s", path, v);
	cr_assert(header(&r, "ETag"), "%s: no ETag", path);
	v = header(&r, "Cache-Control");
	cr_assert(v && strcmp(v, "no-cache") == 0, "%s: Cache-Control %s", path, v);
	v = header(&r, "Content-Security-Policy");
	cr_assert(v && strstr(v, "connect-src 'self'"), "%s: CSP %s", path, v);
	cr_assert(r.body && strstr(r.body, needle), "%s: no %s in the body", path, needle);
	http_free(&r);
}

Test(ui, page_and_assets_with_etags, .init = start_plain, .fini = stop, .timeout = 60)
{
	struct http_reply r, again;
	char etag[128], inm[160];

	expect_asset("/", "text/html", "/ui/app.js");
	expect_asset("/ui/app.js", "text/javascript", "apiFetch");
	expect_asset("/ui/app.css", "text/css", "--accent");
	expect_asset("/ui/uplot.js", "text/javascript", "uPlot");
	expect_asset("/ui/uplot.css", "text/css", ".uplot");

	/* Every file the page names is served, and none is fetched from
	 * elsewhere. */
	http(&d, "GET", "/", NULL, NULL, NULL, &r);
	cr_assert_null(strstr(r.body, "://"), "the page loads something from another origin");
	for (const char *p = strstr(r.body, "\"/ui/"); p; p = strstr(p + 1, "\"/ui/")) {
		char path[64];
		size_t len = strcspn(p + 1, "\"");
		struct http_reply a;

		cr_assert_lt(len, sizeof path);
		memcpy(path, p + 1, len);
		path[len] = '\0';
		http(&d, "GET", path, NULL, NULL, NULL, &a);
		cr_assert_eq(a.status, 200, "%s named by the page: %ld", path, a.status);
		http_free(&a);
	}
	http_free(&r);

	/* A matching If-None-Match is 304 without a body; another ETag is a
	 * full answer. */
	http(&d, "GET", "/ui/app.js", NULL, NULL, NULL, &r);
	snprintf(etag, sizeof etag, "%s", header(&r, "ETag"));
	cr_assert(strlen(etag) == 18 && etag[0] == '"', "ETag %s", etag);
	snprintf(inm, sizeof inm, "If-None-Match: %s", etag);
	http(&d, "GET", "/ui/app.js", NULL, NULL, inm, &again);
	cr_assert_eq(again.status, 304, "If-None-Match %s: %ld", etag, again.status);
	cr_assert_eq(again.len, 0);
	cr_assert_str_eq(header(&again, "ETag"), etag);
	http_free(&again);
	http(&d, "GET", "/ui/app.js", NULL, NULL, "If-None-Match: \"0000000000000000\"", &again);
	cr_assert_eq(again.status, 200);
	cr_assert_eq(again.len, r.len);
	http_free(&again);
	http(&d, "GET", "/ui/app.css", NULL, NULL, inm, &again);
	cr_assert_eq(again.status, 200, "app.js's ETag matched app.css");
	http_free(&again);
	http_free(&r);

	/* HEAD: the same headers, no body. */
	http(&d, "HEAD", "/", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200);
	cr_assert(header(&r, "ETag"));
	http_free(&r);
}

Test(ui, unknown_files_and_methods, .init = start_plain, .fini = stop, .timeout = 60)
{
	struct http_reply r;

	http(&d, "GET", "/ui/missing.js", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 404);
	cr_assert_str_eq(json_string_value(json_object_get(json_object_get(r.json, "error"), "code")), "not_found");
	http_free(&r);
	/* The page has one address. */
	http(&d, "GET", "/ui/index.html", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 404);
	http_free(&r);
	http(&d, "GET", "/ui/", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 404);
	http_free(&r);
	http(&d, "POST", "/", "{}", NULL, NULL, &r);
	cr_assert_eq(r.status, 405);
	http_free(&r);
	/* An encoded NUL used to end the name early and serve app.js. */
	const char *nul[] = {"/ui/app.js%00", "/ui/app.js%00.png", "/jobs?limit=1%00", "/ui/app%01.js"};
	for (size_t i = 0; i < sizeof nul / sizeof nul[0]; i++) {
		http(&d, "GET", nul[i], NULL, NULL, NULL, &r);
		cr_assert_eq(r.status, 400, "%s: %ld %s", nul[i], r.status, r.body);
		cr_assert(strstr(r.body, "control character"), "%s: %s", nul[i], r.body);
		http_free(&r);
	}
}

Test(ui, open_without_token_while_the_api_is_not, .init = start_token, .fini = stop, .timeout = 60)
{
	struct http_reply r;

	http(&d, "GET", "/", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200, "GET / with tokens configured: %ld", r.status);
	http_free(&r);
	http(&d, "GET", "/ui/app.js", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200);
	http_free(&r);
	http(&d, "GET", "/jobs", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 401, "the API must still want the token: %ld", r.status);
	http_free(&r);
	http(&d, "GET", "/jobs", NULL, NULL, "Authorization: Bearer ui-test-token", &r);
	cr_assert_eq(r.status, 200);
	http_free(&r);
}
