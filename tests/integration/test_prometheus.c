/* GET /metrics and ranged checkpoint downloads over HTTP, through the
 * harness, so that tests/openapi/validate_responses.py checks these
 * responses (text format, 206 with Content-Range, 416) against
 * openapi/openapi.yaml.  tests/e2e/prometheus.sh checks the exposition
 * with promtool and a real Prometheus; tests/e2e/trainctl.sh resumes
 * downloads with trainctl. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define JOB                                                                                                       \
	"{\"name\": \"prom\", \"seed\": 3, \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 16},"        \
	" {\"type\": \"relu\"}, {\"type\": \"dense\", \"units\": 3}]}, \"data\": {\"train\": {\"format\":"        \
	" \"synthetic\", \"samples\": 640, \"features\": 6, \"classes\": 3}}, \"batch_size\": 32, \"epochs\": 2," \
	" \"optimizer\": {\"type\": \"adam\", \"lr\": 0.01}, \"checkpoint\": {\"every_steps\": 10}}"

static struct daemon d;

static void start1(void)
{
	daemon_start(&d, 1, NULL);
}

static void stop1(void)
{
	daemon_cleanup(&d);
}

Test(prometheus, metrics_after_a_job, .init = start1, .fini = stop1, .timeout = 120)
{
	long long id = submit_job(&d, JOB);
	struct http_reply r;
	char line[128];

	cr_assert_str_eq(wait_state(&d, id, "completed|failed|cancelled", 60), "completed");
	http(&d, "GET", "/metrics", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200);
	cr_assert_not_null(strstr(r.headers, "text/plain; version=0.0.4"), "%s", r.headers);
	cr_assert_not_null(strstr(r.body, "\ntrainerd_jobs{state=\"completed\"} 1\n"), "%s", r.body);
	cr_assert_not_null(strstr(r.body, "\ntrainerd_jobs_submitted_total 1\n"));
	/* The job is over: none of its series is left. */
	snprintf(line, sizeof line, "job_id=\"%lld\"", id);
	cr_assert_null(strstr(r.body, line), "%s", r.body);
	/* Requests are counted under the route pattern. */
	cr_assert_not_null(strstr(r.body, "route=\"/jobs/{id}\",code=\"200\"}"), "%s", r.body);
	http_free(&r);
}

Test(prometheus, ranged_download, .init = start1, .fini = stop1, .timeout = 120)
{
	long long id = submit_job(&d, JOB);
	struct http_reply r, whole;
	char path[128], want[96];

	cr_assert_str_eq(wait_state(&d, id, "completed|failed|cancelled", 60), "completed");
	snprintf(path, sizeof path, "/jobs/%lld/checkpoints/latest/checkpoint.safetensors", id);
	http(&d, "GET", path, NULL, NULL, NULL, &whole);
	cr_assert_eq(whole.status, 200);
	cr_assert_not_null(strstr(whole.headers, "Accept-Ranges: bytes"), "%s", whole.headers);
	cr_assert_gt(whole.len, 100);

	http(&d, "GET", path, NULL, NULL, "Range: bytes=10-109", &r);
	cr_assert_eq(r.status, 206);
	snprintf(want, sizeof want, "Content-Range: bytes 10-109/%zu", whole.len);
	cr_assert_not_null(strstr(r.headers, want), "%s", r.headers);
	cr_assert_eq(r.len, 100);
	cr_assert_eq(memcmp(r.body, whole.body + 10, 100), 0);
	http_free(&r);

	snprintf(want, sizeof want, "Range: bytes=%zu-", whole.len);
	http(&d, "GET", path, NULL, NULL, want, &r);
	cr_assert_eq(r.status, 416);
	snprintf(want, sizeof want, "Content-Range: bytes */%zu", whole.len);
	cr_assert_not_null(strstr(r.headers, want), "%s", r.headers);
	http_free(&r);

	/* The weights file takes ranges too. */
	snprintf(path, sizeof path, "/jobs/%lld/checkpoints/latest/model.safetensors", id);
	http(&d, "GET", path, NULL, NULL, "Range: bytes=0-7", &r);
	cr_assert_eq(r.status, 206);
	cr_assert_eq(r.len, 8);
	http_free(&r);
	http_free(&whole);
}
