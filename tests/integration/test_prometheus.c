/* GET /metrics (jobs and experiments by state) and ranged checkpoint
 * downloads over HTTP, through the
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

/* Experiments by state: a two-trial sweep of JOB's learning rate, counted
 * as running while it runs and as completed once it has ended. */
Test(prometheus, experiments_by_state, .init = start1, .fini = stop1, .timeout = 120)
{
	const char *x = "{\"name\": \"prom-sweep\", \"spec\": " JOB ", \"search\": {\"method\": \"random\","
			" \"metric\": \"loss\", \"max_trials\": 2, \"max_concurrent\": 1},"
			" \"parameters\": {\"/optimizer/lr\": {\"uniform\": [0.001, 0.01]}}}";
	struct http_reply r;
	bool ended = false;

	http(&d, "POST", "/experiments", x, "application/json", NULL, &r);
	cr_assert_eq(r.status, 201, "%s", r.body);
	http_free(&r);
	http(&d, "GET", "/metrics", NULL, NULL, NULL, &r);
	cr_assert(strstr(r.body, "\ntrainerd_experiments{state=\"queued\"} 1\n") ||
			  strstr(r.body, "\ntrainerd_experiments{state=\"running\"} 1\n"),
		  "%s", r.body);
	http_free(&r);
	for (int i = 0; i < 600 && !ended; i++) {
		http(&d, "GET", "/experiments/1", NULL, NULL, NULL, &r);
		cr_assert_eq(r.status, 200, "%s", r.body);
		ended = strstr(r.body, "\"terminal\": true") || strstr(r.body, "\"terminal\":true");
		http_free(&r);
		if (!ended)
			usleep(100000);
	}
	cr_assert(ended, "the sweep did not end in 60 s");
	http(&d, "GET", "/metrics", NULL, NULL, NULL, &r);
	cr_assert_not_null(strstr(r.body, "\ntrainerd_experiments{state=\"completed\"} 1\n"), "%s", r.body);
	cr_assert_not_null(strstr(r.body, "\ntrainerd_experiments{state=\"running\"} 0\n"), "%s", r.body);
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
