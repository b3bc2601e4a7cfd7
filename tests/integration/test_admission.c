/* Memory admission (docs/design.md, "Memory admission") on a real daemon
 * with CPU devices and a fixed figure for the memory available
 * (--memory-available, so that the answers do not depend on the
 * machine): a job that can never fit fails at once with insufficient_memory
 * and both figures, and the daemon serves on; a job that fits only once
 * another ends waits queued with its reason, and starts when the other
 * ends.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

/* An MLP over 8192 features: with SGD and `units` 1024 its estimate is
 * about 160 MiB, with Adam and 2048 about 440 MiB (the sample count does
 * not change it).  load_cost_us slows its steps.  The jobs that must
 * complete have 16 steps: a step of this size takes 0.3-0.8 s under
 * AddressSanitizer on a loaded machine, and the waits for them are
 * TR_TEST_SLOW times longer under ThreadSanitizer (harness.h), where 120 s
 * did not suffice at a load of 20 on two cores. */
#define JOB(units, optimizer, samples, load_cost_us)                                                              \
	"{\"name\": \"admission\", \"seed\": 1, \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": " units \
	"}, {\"type\": \"relu\"}, {\"type\": \"dense\", \"units\": 4}]}, \"data\": {\"train\": {\"format\":"      \
	" \"synthetic\", \"samples\": " samples                                                                   \
	", \"features\": 8192, \"classes\": 4, \"load_cost_us\": " load_cost_us                                   \
	"}}, \"batch_size\": 32, \"epochs\": 1, \"optimizer\": {\"type\": \"" optimizer "\", \"lr\": 0.01},"      \
	" \"devices\": 1}"

static struct daemon d;
static const char *const flags[] = {"--memory-available", "262144000", NULL}; /* 250 MiB */

static void cleanup(void)
{
	daemon_cleanup(&d);
}

TestSuite(admission, .fini = cleanup, .timeout = 240);

static json_t *job(long long id)
{
	return get_job_json(&d, id);
}

static void assert_healthy(void)
{
	struct http_reply r;

	http(&d, "GET", "/healthz", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	http_free(&r);
}

Test(admission, job_that_can_never_fit_fails_at_once_with_both_figures)
{
	daemon_start(&d, 2, flags);
	long long id = submit_job(&d, JOB("2048", "adam", "512", "0"));
	cr_assert_str_eq(wait_state(&d, id, "failed|completed", 30 * TR_TEST_SLOW), "failed");
	json_t *j = job(id);
	json_t *e = json_object_get(j, "error");
	const char *msg = json_string_value(json_object_get(e, "message"));
	cr_assert_str_eq(json_string_value(json_object_get(e, "code")), "insufficient_memory");
	cr_assert(strstr(msg, "this job needs an estimated "), "%s", msg);
	cr_assert(strstr(msg, "more than the 250 MiB there is for jobs (memory-available)"), "%s", msg);
	json_decref(j);
	/* The daemon serves on, and a job that fits runs. */
	assert_healthy();
	long long ok = submit_job(&d, JOB("1024", "sgd", "512", "0"));
	cr_assert_str_eq(wait_state(&d, ok, "failed|completed", 120 * TR_TEST_SLOW), "completed");
}

Test(admission, job_that_fits_once_another_ends_waits_queued_with_its_reason)
{
	daemon_start(&d, 2, flags);
	/* A: about 160 MiB, 64 steps of 32 x 5 ms (cancelled below). */
	long long a = submit_job(&d, JOB("1024", "sgd", "2048", "5000"));
	cr_assert_str_eq(wait_state(&d, a, "running", 30 * TR_TEST_SLOW), "running");
	/* B: another 160 MiB; 320 do not fit in 250, though a device is free. */
	long long b = submit_job(&d, JOB("1024", "sgd", "512", "0"));
	double deadline = now_s() + 30 * TR_TEST_SLOW;
	const char *reason = NULL;
	json_t *j = NULL;
	while (now_s() < deadline) {
		json_decref(j);
		j = job(b);
		reason = json_string_value(json_object_get(json_object_get(j, "info"), "queued_reason"));
		if (reason)
			break;
		usleep(20000);
	}
	cr_assert_not_null(reason, "job B never said why it waits");
	cr_assert_str_eq(json_string_value(json_object_get(j, "state")), "queued");
	cr_assert(strstr(reason, "waiting for memory: this job needs an estimated "), "%s", reason);
	cr_assert(strstr(reason, "while 1 other job runs, 250 MiB once they end"), "%s", reason);
	json_decref(j);
	/* A is still running: B does not start meanwhile. */
	usleep(300000);
	cr_assert_str_eq(wait_state(&d, b, "queued", 1), "queued");
	/* A ends: B starts, its reason goes, and it completes. */
	struct http_reply r;
	char path[64];
	snprintf(path, sizeof path, "/jobs/%lld/cancel", a);
	http(&d, "POST", path, NULL, NULL, NULL, &r);
	cr_assert_lt(r.status, 300, "%s", r.body);
	http_free(&r);
	cr_assert_str_eq(wait_state(&d, b, "failed|completed", 120 * TR_TEST_SLOW), "completed");
	j = job(b);
	cr_assert_null(json_object_get(json_object_get(j, "info"), "queued_reason"));
	json_decref(j);
	assert_healthy();
}
