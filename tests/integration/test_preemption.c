/* Priority preemption on one daemon (docs/design.md, "Preemption"), with
 * a real daemon on 2 CPU devices.
 *
 * A low-priority preemptible job holds both devices and a high-priority
 * job arrives: the low one checkpoints at its next step boundary and shows
 * "preempted" (naming the high one), the high one completes, the low one
 * resumes on its own and completes with a model.safetensors byte-identical
 * to the same job run alone in a second daemon (exact mode, so it may
 * resume on fewer devices too).  Also: a job that does not reach a step
 * boundary within the grace time is cancelled back to its checkpoint
 * ("hard"); the minimum run time holds a preemption off; a job without
 * preemptible=true is never preempted; a preempted job can be cancelled
 * while it waits; and preempted jobs survive a daemon restart.
 *
 * Timing: the jobs sleep in their loaders (synthetic load_cost_us), so
 * they take seconds of wall time but little CPU.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

/* 2000 samples, batch 32, 2 epochs = 126 steps in exact mode, a
 * checkpoint every 10 steps; load_cost_us sets the step time. */
#define JOB_FMT                                                                                                  \
	"{\"name\": \"%s\", \"seed\": %d, \"exact\": true, \"model\": {\"layers\": [{\"type\": \"dense\", "      \
	"\"units\": 32}, {\"type\": \"relu\"}, {\"type\": \"dropout\", \"rate\": 0.2}, {\"type\": \"dense\", "   \
	"\"units\": 4}]}, \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": %d, \"features\": 16, " \
	"\"classes\": 4, \"noise\": 0.5, \"load_cost_us\": %d}, \"shuffle\": true}, \"batch_size\": %d, "        \
	"\"epochs\": 2, \"optimizer\": {\"type\": \"adamw\", \"lr\": 0.01}, \"devices\": %d, "                   \
	"\"prefetch\": {\"workers\": %d, \"depth\": 2}, \"checkpoint\": {\"every_steps\": 10}}"

static struct daemon da, db;

static void cleanup_daemons(void)
{
	daemon_cleanup(&da);
	daemon_cleanup(&db);
}

TestSuite(preemption, .fini = cleanup_daemons, .timeout = 120 * TR_TEST_SLOW);

/* The low job: 2000 samples make 126 steps of about 10 ms. */
static const char *low_spec(int devices, int samples)
{
	static char buf[2048];
	snprintf(buf, sizeof buf, JOB_FMT, "low", 7, samples, 600, 32, devices, 2);
	return buf;
}

/* The high job: 14 steps (200 samples), quick. */
static const char *high_spec(int devices)
{
	static char buf[2048];
	snprintf(buf, sizeof buf, JOB_FMT, "high", 9, 200, 600, 32, devices, 2);
	return buf;
}

/* A job whose every step takes about 4 s (4 samples of 1 s each, one
 * loader): it reaches no step boundary within a short grace. */
static const char *slow_spec(void)
{
	static char buf[2048];
	snprintf(buf, sizeof buf, JOB_FMT, "slow", 3, 40, 1000000, 4, 2, 1);
	return buf;
}

static long long submit(const struct daemon *d, const char *query, const char *spec)
{
	char path[128];
	struct http_reply r;
	snprintf(path, sizeof path, "/jobs%s", query);
	http(d, "POST", path, spec, NULL, NULL, &r);
	cr_assert_eq(r.status, 201, "POST %s: %ld %s", path, r.status, r.body);
	long long id = json_integer_value(json_object_get(r.json, "id"));
	http_free(&r);
	return id;
}

static const char *state_of(const struct daemon *d, long long id)
{
	static char out[32];
	json_t *j = get_job_json(d, id);
	snprintf(out, sizeof out, "%s", json_string_value(json_object_get(j, "state")));
	json_decref(j);
	return out;
}

/* Waits (bounded) until the job runs and has made `step` steps. */
static void wait_step(const struct daemon *d, long long id, long long step, double timeout_s)
{
	double deadline = now_s() + timeout_s * TR_TEST_SLOW;
	for (;;) {
		json_t *j = get_job_json(d, id);
		const char *st = json_string_value(json_object_get(j, "state"));
		long long s = json_integer_value(json_object_get(json_object_get(j, "progress"), "step"));
		bool there = strcmp(st, "running") == 0 && s >= step;
		cr_assert(there || now_s() < deadline, "job %lld: %s at step %lld after %.0f s, waiting for step %lld",
			  id, st, s, timeout_s, step);
		json_decref(j);
		if (there)
			return;
		usleep(10000);
	}
}

/* Asserts that the job stays in `state` for `seconds`. */
static void stays(const struct daemon *d, long long id, const char *state, double seconds)
{
	double until = now_s() + seconds;
	while (now_s() < until) {
		cr_assert_str_eq(state_of(d, id), state, "job %lld left %s", id, state);
		usleep(50000);
	}
}

static void expect_ok(const struct daemon *d, const char *method, const char *path)
{
	struct http_reply r;
	http(d, method, path, NULL, NULL, NULL, &r);
	cr_assert(r.status == 200 || r.status == 202, "%s %s: %ld %s", method, path, r.status, r.body);
	http_free(&r);
}

static unsigned char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	cr_assert_not_null(f, "%s", path);
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	unsigned char *buf = malloc((size_t)n + 1);
	cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	*len = (size_t)n;
	return buf;
}

/* tests/integration/check_safetensors.py FILE REF: 0 when both hold the
 * same names, shapes and bit-identical values (metadata aside). */
static int same_tensors(const char *file, const char *ref)
{
	char cmd[1024];
	snprintf(cmd, sizeof cmd, "%s tests/integration/check_safetensors.py '%s' '%s' 1>&2",
		 access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3", file, ref);
	int rc = system(cmd);
	return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

/* Job id's final model.safetensors in d equals job ref's in dref: byte
 * for byte, header metadata included, or with tensors_only the tensors
 * bit for bit (a run that ended on another device count records that
 * count in the metadata: "devices", and the spec hash over it). */
static void assert_same_model(const struct daemon *dref, long long ref, const struct daemon *d, long long id,
			      bool tensors_only)
{
	char fa[256], fb[256], path[128];
	snprintf(fa, sizeof fa, "%s/reference.safetensors", d->dir);
	snprintf(fb, sizeof fb, "%s/preempted.safetensors", d->dir);
	snprintf(path, sizeof path, "/jobs/%lld/checkpoints/latest/model.safetensors", ref);
	cr_assert_eq(http_download(dref, path, fa, NULL), 200, "GET %s", path);
	snprintf(path, sizeof path, "/jobs/%lld/checkpoints/latest/model.safetensors", id);
	cr_assert_eq(http_download(d, path, fb, NULL), 200, "GET %s", path);
	size_t la, lb;
	unsigned char *a = slurp(fa, &la), *b = slurp(fb, &lb);
	bool same = la == lb && memcmp(a, b, la) == 0;
	free(a);
	free(b);
	if (tensors_only && !same) {
		cr_assert_eq(same_tensors(fb, fa), 0, "the preempted job's tensors differ from the job run alone's");
		return;
	}
	cr_assert(same, "the preempted job's model.safetensors (%zu bytes) differs from the job run alone (%zu bytes)",
		  lb, la);
}

static char *text_of(const struct daemon *d, const char *path)
{
	struct http_reply r;
	http(d, "GET", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200, "GET %s: %ld", path, r.status);
	char *t = strdup(r.body);
	http_free(&r);
	return t;
}

/* The job's "preemption" record (a new reference) after it was preempted. */
static json_t *preemption_of(const struct daemon *d, long long id)
{
	json_t *j = get_job_json(d, id);
	json_t *p = json_incref(json_object_get(j, "preemption"));
	cr_assert(json_is_object(p), "job %lld has no preemption record", id);
	cr_assert(json_is_true(json_object_get(j, "preemptible")));
	json_decref(j);
	return p;
}

/* Submits the job that preempts `victim` (*high gets its id) and waits
 * until the victim shows preempted; returns the seconds that took. */
static double preempt_with(const struct daemon *d, long long victim, const char *query, const char *spec,
			   long long *high)
{
	double t0 = now_s();
	*high = submit(d, query, spec);
	cr_assert_str_eq(wait_state(d, victim, "preempted|completed|failed", 30), "preempted");
	return now_s() - t0;
}

static void start_pair(const char *min_run, const char *grace)
{
	const char *flags[] = {"--preemption-min-run", min_run, "--preemption-grace", grace, NULL};
	daemon_start(&da, 2, flags);
}

Test(preemption, preempts_resumes_and_gives_the_same_bits)
{
	start_pair("0", "30");
	daemon_start(&db, 2, NULL);
	long long ref = submit(&db, "", low_spec(2, 2000)); /* the same job, run alone */
	long long low = submit(&da, "?priority=0&preemptible=true", low_spec(2, 2000));
	wait_step(&da, low, 20, 30);
	long long high;
	double took = preempt_with(&da, low, "?priority=10", high_spec(2), &high);
	/* One step (~10 ms) plus the checkpoint, on a loaded machine. */
	cr_assert_lt(took, 3.0 * TR_TEST_SLOW, "preempted %.2f s after the high job arrived", took);
	json_t *p = preemption_of(&da, low);
	cr_assert_eq(json_integer_value(json_object_get(p, "by")), high);
	cr_assert_eq(json_integer_value(json_object_get(p, "by_priority")), 10);
	cr_assert_str_eq(json_string_value(json_object_get(p, "mode")), "checkpoint");
	long long at = json_integer_value(json_object_get(p, "step"));
	cr_assert_geq(at, 20);
	json_decref(p);
	/* It kept a checkpoint at that step. */
	char path[128], step_key[48];
	snprintf(path, sizeof path, "/jobs/%lld/checkpoints", low);
	snprintf(step_key, sizeof step_key, "\"step\":%lld,", at);
	char *ck = text_of(&da, path);
	cr_assert(strstr(ck, step_key), "no checkpoint at step %lld: %s", at, ck);
	free(ck);

	cr_assert_str_eq(wait_state(&da, high, "completed|failed", 30), "completed");
	cr_assert_str_eq(wait_state(&da, low, "completed|failed|cancelled", 60), "completed");
	cr_assert_str_eq(wait_state(&db, ref, "completed|failed", 60), "completed");
	assert_same_model(&db, ref, &da, low, false);

	/* Who preempted whom: the job's log, the event stream, Prometheus. */
	snprintf(path, sizeof path, "/jobs/%lld/logs", low);
	char *logs = text_of(&da, path), want[64];
	snprintf(want, sizeof want, "preempted by job %lld", high);
	cr_assert(strstr(logs, want), "the log does not say '%s': %s", want, logs);
	free(logs);
	snprintf(path, sizeof path, "/jobs/%lld/events", low);
	char *events = text_of(&da, path);
	snprintf(want, sizeof want, "\"preemption\":{\"by\":%lld", high);
	cr_assert(strstr(events, "\"state\":\"preempted\"") && strstr(events, want),
		  "no preempted state event naming job %lld: %.2000s", high, events);
	free(events);
	char *prom = text_of(&da, "/metrics");
	cr_assert(strstr(prom, "trainerd_preemptions_total{mode=\"checkpoint\"} 1\n"), "%s", prom);
	free(prom);
}

/* The preempted job resumes on the one device the high job leaves free,
 * and exact mode still gives the bits of the run alone on two. */
Test(preemption, resumes_on_fewer_devices_with_the_same_bits)
{
	start_pair("0", "30");
	daemon_start(&db, 2, NULL);
	long long ref = submit(&db, "", low_spec(2, 2000));
	long long low = submit(&da, "?preemptible=true", low_spec(2, 2000));
	wait_step(&da, low, 20, 30);
	long long high = submit(&da, "?priority=5", high_spec(1));
	cr_assert_str_eq(wait_state(&da, high, "running|completed|failed", 30), "running");
	/* Back at once on the device left over, beside the high job. */
	wait_step(&da, low, 21, 30);
	json_t *j = get_job_json(&da, low);
	cr_assert_eq(json_array_size(json_object_get(j, "devices")), 1, "low runs on %zu devices",
		     json_array_size(json_object_get(j, "devices")));
	json_decref(j);
	cr_assert_str_eq(wait_state(&da, low, "completed|failed|cancelled", 60), "completed");
	cr_assert_str_eq(wait_state(&db, ref, "completed|failed", 60), "completed");
	assert_same_model(&db, ref, &da, low, true);
}

Test(preemption, grace_expiry_cancels_back_to_the_checkpoint)
{
	start_pair("0", "1");
	long long slow = submit(&da, "?preemptible=true", slow_spec());
	cr_assert_str_eq(wait_state(&da, slow, "running|failed", 30), "running");
	usleep(300000); /* set up; its first step takes about 4 s */
	long long high;
	double took = preempt_with(&da, slow, "?priority=1", high_spec(2), &high);
	/* The grace (1 s) and the dispatcher's round (1 s), not the step. */
	cr_assert_lt(took, 3.5 * TR_TEST_SLOW, "preempted %.2f s after the high job arrived", took);
	json_t *p = preemption_of(&da, slow);
	cr_assert_str_eq(json_string_value(json_object_get(p, "mode")), "hard");
	cr_assert_eq(json_integer_value(json_object_get(p, "step")), 0);
	json_decref(p);
	char *prom = text_of(&da, "/metrics");
	cr_assert(strstr(prom, "trainerd_preemptions_total{mode=\"hard\"} 1\n"), "%s", prom);
	free(prom);
	cr_assert_str_eq(wait_state(&da, high, "completed|failed", 30), "completed");
	/* Back to running on its own, from the start (it had no checkpoint). */
	cr_assert_str_eq(wait_state(&da, slow, "running|failed|completed", 30), "running");
	char path[64];
	snprintf(path, sizeof path, "/jobs/%lld/cancel", slow);
	expect_ok(&da, "POST", path);
}

Test(preemption, min_run_time_holds_a_preemption_off)
{
	start_pair("2", "30");
	long long low = submit(&da, "?preemptible=true", low_spec(2, 8000));
	cr_assert_str_eq(wait_state(&da, low, "running|failed", 30), "running");
	double started = now_s();
	long long high = submit(&da, "?priority=1", high_spec(2));
	/* Not before it has run 2 s (checked to 1.5 s: the daemon started it
	 * before this test saw it running). */
	while (now_s() - started < 1.5) {
		cr_assert_str_eq(state_of(&da, low), "running");
		cr_assert_str_eq(state_of(&da, high), "queued");
		usleep(50000);
	}
	cr_assert_str_eq(wait_state(&da, low, "preempted|completed|failed", 10), "preempted");
	cr_assert_str_eq(wait_state(&da, high, "completed|failed", 30), "completed");
	cr_assert_str_eq(wait_state(&da, low, "completed|failed", 60), "completed");
}

Test(preemption, a_job_not_preemptible_is_never_preempted)
{
	start_pair("0", "30");
	long long low = submit(&da, "?priority=-5", low_spec(2, 6000));
	wait_step(&da, low, 5, 30);
	long long high = submit(&da, "?priority=100", high_spec(2));
	json_t *j = get_job_json(&da, low);
	cr_assert(json_is_false(json_object_get(j, "preemptible")));
	cr_assert(json_is_null(json_object_get(j, "preemption")));
	json_decref(j);
	stays(&da, high, "queued", 1.0);
	cr_assert_str_eq(state_of(&da, low), "running");
	cr_assert_str_eq(wait_state(&da, low, "completed|failed|preempted", 60), "completed");
	cr_assert_str_eq(wait_state(&da, high, "completed|failed", 30), "completed");
	/* Off in the policy: a preemptible job is not preempted either. */
	daemon_cleanup(&da);
	const char *off[] = {"--preemption-enabled", "off", "--preemption-min-run", "0", NULL};
	daemon_start(&da, 2, off);
	low = submit(&da, "?preemptible=true", low_spec(2, 6000));
	wait_step(&da, low, 5, 30);
	high = submit(&da, "?priority=1", high_spec(2));
	stays(&da, high, "queued", 1.0);
	char path[64];
	snprintf(path, sizeof path, "/jobs/%lld/cancel", low);
	expect_ok(&da, "POST", path);
	cr_assert_str_eq(wait_state(&da, high, "completed|failed", 30), "completed");
}

Test(preemption, a_preempted_job_cancelled_while_queued_stays_cancelled)
{
	start_pair("0", "30");
	/* Submitted with trainctl's --preemptible. */
	char file[256], args[512];
	snprintf(file, sizeof file, "%s/low.json", da.dir);
	FILE *f = fopen(file, "w");
	cr_assert_not_null(f);
	fputs(low_spec(2, 2000), f);
	fclose(f);
	snprintf(args, sizeof args, "submit --preemptible '%s'", file);
	char *out = trainctl_output(&da, args);
	long long low = atoll(out);
	free(out);
	cr_assert_gt(low, 0);
	wait_step(&da, low, 10, 30);
	/* A longer high job (about 6 s of loading), so that the low one
	 * still waits while trainctl is asked about it, also under a
	 * sanitizer on a loaded machine. */
	char spec[2048];
	snprintf(spec, sizeof spec, JOB_FMT, "high", 9, 2000, 3000, 32, 2, 2);
	long long high = submit(&da, "?priority=1", spec);
	cr_assert_str_eq(wait_state(&da, low, "preempted|completed|failed", 30), "preempted");
	/* trainctl names who preempted whom. */
	char want[64];
	out = trainctl_output(&da, "ls");
	snprintf(want, sizeof want, "preempted by %lld", high);
	cr_assert(strstr(out, want), "trainctl ls does not say '%s':\n%s", want, out);
	free(out);
	snprintf(args, sizeof args, "show %lld", low);
	out = trainctl_output(&da, args);
	snprintf(want, sizeof want, "preempted by job %lld (priority 1 > 0)", high);
	cr_assert(strstr(out, want) && strstr(out, "0, preemptible"), "trainctl show does not say '%s':\n%s", want,
		  out);
	free(out);
	char path[64];
	snprintf(path, sizeof path, "/jobs/%lld/cancel", low);
	expect_ok(&da, "POST", path);
	json_t *j = get_job_json(&da, low);
	cr_assert_str_eq(json_string_value(json_object_get(j, "state")), "cancelled");
	cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "error"), "message")),
			 "cancelled while preempted");
	json_decref(j);
	cr_assert_str_eq(wait_state(&da, high, "completed|failed", 60), "completed");
	stays(&da, low, "cancelled", 1.2); /* it does not come back */
}

Test(preemption, preempted_jobs_survive_a_daemon_restart)
{
	start_pair("0", "30");
	daemon_start(&db, 2, NULL);
	long long ref = submit(&db, "", low_spec(2, 2000));
	long long low = submit(&da, "?preemptible=true", low_spec(2, 2000));
	wait_step(&da, low, 20, 30);
	char spec[2048];
	snprintf(spec, sizeof spec, JOB_FMT, "high", 9, 2000, 600, 32, 2, 2);
	long long high = submit(&da, "?priority=1", spec);
	cr_assert_str_eq(wait_state(&da, low, "preempted|completed|failed", 30), "preempted");
	int status;
	daemon_stop(&da, &status);
	const char *flags[] = {"--preemption-min-run", "0", NULL};
	daemon_restart(&da, 2, flags);
	/* Still preempted, with its record, until the high job is done. */
	json_t *p = preemption_of(&da, low);
	cr_assert_eq(json_integer_value(json_object_get(p, "by")), high);
	json_decref(p);
	cr_assert_str_eq(state_of(&da, low), "preempted");
	cr_assert_str_eq(wait_state(&da, high, "completed|failed", 60), "completed");
	cr_assert_str_eq(wait_state(&da, low, "completed|failed|cancelled", 60), "completed");
	cr_assert_str_eq(wait_state(&db, ref, "completed|failed", 60), "completed");
	assert_same_model(&db, ref, &da, low, false);
}

Test(preemption, a_bad_preemptible_value_is_refused)
{
	daemon_start(&da, 2, NULL);
	struct http_reply r;
	http(&da, "POST", "/jobs?preemptible=yes", high_spec(2), NULL, NULL, &r);
	cr_assert_eq(r.status, 400, "%ld %s", r.status, r.body);
	cr_assert(strstr(r.body, "preemptible: must be true or false"), "%s", r.body);
	http_free(&r);
}

/* A PATCH of a running job's priority counts: raised above the queued
 * job's, it is not preempted. */
Test(preemption, a_raised_priority_protects_a_running_job)
{
	start_pair("0", "30");
	long long low = submit(&da, "?preemptible=true", low_spec(2, 6000));
	wait_step(&da, low, 5, 30);
	char path[64];
	snprintf(path, sizeof path, "/jobs/%lld", low);
	struct http_reply r;
	http(&da, "PATCH", path, "{\"priority\": 10}", NULL, NULL, &r);
	cr_assert_eq(r.status, 200, "%ld %s", r.status, r.body);
	http_free(&r);
	long long high = submit(&da, "?priority=5", high_spec(2));
	stays(&da, high, "queued", 1.0);
	json_t *j = get_job_json(&da, low);
	cr_assert_str_eq(json_string_value(json_object_get(j, "state")), "running");
	/* Not preempted and taken back at once either (it would have been
	 * first in the queue with its new priority). */
	cr_assert(json_is_null(json_object_get(j, "preemption")), "job %lld was preempted", low);
	json_decref(j);
	snprintf(path, sizeof path, "/jobs/%lld/cancel", low);
	expect_ok(&da, "POST", path);
	cr_assert_str_eq(wait_state(&da, high, "completed|failed", 30), "completed");
}
