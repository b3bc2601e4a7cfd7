/* Jobs the daemon dies under (docs/design.md, "Daemon", max-job-crashes):
 * a real daemon is SIGKILLed while a job runs and restarted on the same
 * state.  A job that never makes a step between the deaths (what a job
 * that takes the daemon down with it looks like) is failed with
 * crashed_daemon at the restart that makes max-job-crashes, instead of
 * being queued again forever; a job that makes steps in between is queued
 * again every time, however often the daemon dies.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

/* load_cost_us: what one sample costs to load, so that a step takes
 * batch_size times it. */
#define JOB(load_cost_us, samples)                                                                                   \
	"{\"name\": \"crashes\", \"seed\": 5, \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 8},"         \
	" {\"type\": \"relu\"}, {\"type\": \"dense\", \"units\": 3}]}, \"data\": {\"train\": {\"format\":"           \
	" \"synthetic\", \"samples\": " samples ", \"features\": 4, \"classes\": 3, \"load_cost_us\": " load_cost_us \
	"}}, \"batch_size\": 8, \"epochs\": 1, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.01},"                    \
	" \"prefetch\": {\"workers\": 1, \"depth\": 1}}"

static struct daemon d;

static void cleanup(void)
{
	daemon_cleanup(&d);
}

TestSuite(crashes, .fini = cleanup, .timeout = 120);

static json_t *job(long long id)
{
	return get_job_json(&d, id);
}

static long long job_int(long long id, const char *key)
{
	json_t *j = job(id);
	long long v = json_integer_value(json_object_get(j, key));
	json_decref(j);
	return v;
}

static long long job_step(long long id)
{
	json_t *j = job(id);
	long long v = json_integer_value(json_object_get(json_object_get(j, "progress"), "step"));
	json_decref(j);
	return v;
}

Test(crashes, job_the_daemon_dies_under_without_a_step_fails_with_crashed_daemon)
{
	/* A step takes 8 x 1 s of loading: the kills land before the first. */
	daemon_start(&d, 1, NULL);
	long long id = submit_job(&d, JOB("1000000", "64"));
	for (int death = 1; death <= 2; death++) {
		cr_assert_str_eq(wait_state(&d, id, "running", 30), "running");
		cr_assert_eq(job_step(id), 0);
		daemon_kill(&d);
		daemon_restart(&d, 1, NULL);
		cr_assert_eq(job_int(id, "crashes"), death);
	}
	/* The default max-job-crashes (2) is reached: failed, not queued. */
	json_t *j = job(id);
	json_t *e = json_object_get(j, "error");
	cr_assert_str_eq(json_string_value(json_object_get(j, "state")), "failed");
	cr_assert_str_eq(json_string_value(json_object_get(e, "code")), "crashed_daemon");
	cr_assert(strstr(json_string_value(json_object_get(e, "message")), "died 2 times in a row"), "%s",
		  json_string_value(json_object_get(e, "message")));
	json_decref(j);
	/* It stays failed at the next start, and the daemon serves on. */
	daemon_kill(&d);
	daemon_restart(&d, 1, NULL);
	cr_assert_str_eq(wait_state(&d, id, "failed", 5), "failed");
	long long next = submit_job(&d, JOB("0", "64"));
	cr_assert_str_eq(wait_state(&d, next, "completed|failed", 60), "completed");
}

Test(crashes, limit_is_configurable_and_zero_never_fails)
{
	const char *three[] = {"--max-job-crashes", "3", NULL};
	daemon_start(&d, 1, three);
	long long id = submit_job(&d, JOB("1000000", "64"));
	for (int death = 1; death <= 3; death++) {
		cr_assert_str_eq(wait_state(&d, id, "running", 30), "running");
		daemon_kill(&d);
		daemon_restart(&d, 1, death < 3 ? three : (const char *const[]){"--max-job-crashes", "0", NULL});
	}
	/* The third death under max-job-crashes 0: counted, queued again. */
	cr_assert_eq(job_int(id, "crashes"), 3);
	cr_assert_str_eq(wait_state(&d, id, "running", 30), "running");
}

Test(crashes, job_making_steps_between_deaths_is_queued_again_every_time)
{
	/* 8 x 20 ms a step. */
	daemon_start(&d, 1, NULL);
	long long id = submit_job(&d, JOB("20000", "4000"));
	for (int death = 1; death <= 3; death++) {
		cr_assert_str_eq(wait_state(&d, id, "running", 30), "running");
		/* The first step of this run clears the count of the deaths
		 * before it. */
		double deadline = now_s() + 30;
		while ((job_int(id, "crashes") != 0 || job_step(id) == 0) && now_s() < deadline)
			usleep(20000);
		cr_assert_eq(job_int(id, "crashes"), 0);
		daemon_kill(&d);
		daemon_restart(&d, 1, NULL);
		cr_assert_eq(job_int(id, "crashes"), 1);
	}
	cr_assert_str_eq(wait_state(&d, id, "running", 30), "running");
}
