/* Requests a browser sends on another site's behalf (api/origin.c),
 * against a real daemon: without tokens a foreign Host (DNS rebinding) is
 * refused 403 while loopback names are answered; a POST with another
 * origin, or marked cross-site by the browser, is refused 403 and changes
 * nothing, while the daemon's own origin and clients that send no Origin
 * (curl, trainctl) go through.  tests/browser/test_dashboard.mjs does the
 * same from a real page of another origin. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

static struct daemon d;

static void stop(void)
{
	daemon_cleanup(&d);
}

TestSuite(cross_site, .fini = stop, .timeout = 90);

/* method path with up to two extra header lines; returns the status and
 * leaves the body in r.  Not recorded: the refusals are not per-route
 * answers of the OpenAPI document. */
static long request(const char *method, const char *path, const char *h1, const char *h2, struct http_reply *r)
{
	const char *hdrs[3] = {h1, h1 ? h2 : NULL, NULL};
	struct tr_test_request rq = {.base_url = d.base_url,
				     .method = method,
				     .path = path,
				     .headers = hdrs,
				     .no_expect = true,
				     .timeout_s = 30,
				     .no_record = true};
	struct tr_test_reply tr;
	tr_test_http(&rq, &tr);
	http_reply_take(r, &tr);
	return r->status;
}

static const char *long_job =
	"{\"name\": \"long\", \"seed\": 1, \"model\": {\"inputs\": 4, \"layers\": [{\"type\": \"dense\", \"units\": 2}]},"
	" \"data\": {\"train\": {\"format\": \"synthetic\", \"task\": \"classification\", \"samples\": 64,"
	" \"features\": 4, \"classes\": 2}}, \"batch_size\": 16, \"epochs\": 1000000,"
	" \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}, \"devices\": 1}";

Test(cross_site, foreign_host_is_refused_without_tokens)
{
	daemon_start(&d, 1, NULL);
	int port = 0;
	cr_assert_eq(sscanf(d.base_url, "http://127.0.0.1:%d", &port), 1);
	struct http_reply r;
	const char *foreign[] = {"Host: attacker.example", "Host: attacker.example:80", "Host: 10.0.0.1",
				 "Host: localhost.attacker.example", "Host: 127.0.0.1.nip.io"};
	for (size_t i = 0; i < sizeof foreign / sizeof foreign[0]; i++) {
		cr_assert_eq(request("GET", "/jobs", foreign[i], NULL, &r), 403, "%s: %ld %s", foreign[i], r.status,
			     r.body);
		cr_assert(strstr(r.body, "is not a loopback name"), "%s", r.body);
		http_free(&r);
	}
	char h[64];
	const char *loop[] = {"localhost", "LOCALHOST", "127.0.0.1", "127.1.2.3", "[::1]"};
	for (size_t i = 0; i < sizeof loop / sizeof loop[0]; i++) {
		snprintf(h, sizeof h, "Host: %s:%d", loop[i], port);
		cr_assert_eq(request("GET", "/jobs", h, NULL, &r), 200, "%s: %ld %s", h, r.status, r.body);
		http_free(&r);
	}
}

Test(cross_site, foreign_host_is_answered_with_tokens)
{
	/* With tokens a rebinding page has no token: the Host does not matter. */
	const char *flags[] = {"--token", "cross-site-token", NULL};
	daemon_start(&d, 1, flags);
	struct http_reply r;
	cr_assert_eq(request("GET", "/jobs", "Host: trainerd.example", "Authorization: Bearer cross-site-token", &r),
		     200, "%s", r.body);
	http_free(&r);
}

Test(cross_site, post_from_another_origin_changes_nothing)
{
	daemon_start(&d, 1, NULL);
	long long id = submit_job(&d, long_job);
	cr_assert_str_eq(wait_state(&d, id, "running", 30), "running");
	char path[64], own[160];
	snprintf(path, sizeof path, "/jobs/%lld/pause", id);
	snprintf(own, sizeof own, "Origin: %s", d.base_url);
	struct http_reply r;

	const char *refused[][2] = {
		{"Origin: http://attacker.example", NULL}, {"Origin: null", NULL}, {"Sec-Fetch-Site: cross-site", NULL},
		{"Origin: https://127.0.0.1", NULL}, /* another scheme and port */
		{own, "Sec-Fetch-Site: cross-site"},
	};
	for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
		cr_assert_eq(request("POST", path, refused[i][0], refused[i][1], &r), 403, "%s: %ld %s", refused[i][0],
			     r.status, r.body);
		cr_assert(strstr(r.body, "is refused"), "%s", r.body);
		http_free(&r);
	}
	/* A cross-origin DELETE too (the job is not deleted). */
	snprintf(path, sizeof path, "/jobs/%lld", id);
	cr_assert_eq(request("DELETE", path, "Origin: http://attacker.example", NULL, &r), 403, "%s", r.body);
	http_free(&r);
	usleep(300000);
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	cr_assert_str_eq(json_string_value(json_object_get(r.json, "state")), "running", "%s", r.body);
	http_free(&r);

	/* Reading stays open to any origin's GET (the answers are not
	 * readable cross-origin without CORS, which the daemon never sends). */
	cr_assert_eq(request("GET", path, "Origin: http://attacker.example", NULL, &r), 200, "%s", r.body);
	http_free(&r);

	/* The daemon's own page, and a client without Origin, may. */
	snprintf(path, sizeof path, "/jobs/%lld/pause", id);
	cr_assert_lt(request("POST", path, own, "Sec-Fetch-Site: same-origin", &r), 300, "%s", r.body);
	http_free(&r);
	cr_assert_str_eq(wait_state(&d, id, "paused", 30), "paused");
	snprintf(path, sizeof path, "/jobs/%lld/cancel", id);
	cr_assert_lt(request("POST", path, NULL, NULL, &r), 300, "%s", r.body);
	http_free(&r);
}
