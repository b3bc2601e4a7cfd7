/* Experiments and plain jobs in one queue (docs/experiments.md, "Priority
 * and preemption"), on a real daemon with 2 CPU devices.
 *
 * A plain blocker job holds both devices while two experiments of the
 * same 2-trial grid (priority 1, preemptible; priority 5, not) and a
 * plain 2-device job of priority 3 queue up.  Once the blocker is
 * cancelled they start in priority order: the priority-5 trials, then
 * the plain job, then the priority-1 trials.  While those run, a plain
 * job of priority 10 preempts one of them: the trial shows "preempted"
 * (the experiment neither counts it failed nor reports it), resumes on
 * its own and the experiment completes with every trial's metric, the
 * best one included, bit-identical to the other experiment's, which was
 * never preempted.
 *
 * A trial's 150 steps take about 1.5 s.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

/* 1000 synthetic samples (a fifth for validation), batch 32: 25 steps
 * an epoch; the loaders sleep (load_cost_us), so a step takes about 10 ms
 * of wall time but little CPU, on a fast machine as on a loaded one. */
#define SPEC_FMT                                                                                                 \
	"{\"name\": \"%s\", \"seed\": 5, \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 16}, "        \
	"{\"type\": \"relu\"}, {\"type\": \"dense\", \"units\": 4}]}, \"data\": {\"train\": {\"format\": "       \
	"\"synthetic\", \"samples\": 1000, \"features\": 16, \"classes\": 4, \"noise\": 0.5, \"load_cost_us\": " \
	"600}, \"validation_split\": 0.2, \"shuffle\": true}, \"batch_size\": 32, \"epochs\": %d, "              \
	"\"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}, \"devices\": %d, \"prefetch\": {\"workers\": 2, "      \
	"\"depth\": 2}}"

static struct daemon d;

static void cleanup_daemon(void)
{
	daemon_cleanup(&d);
}

TestSuite(experiment_queue, .fini = cleanup_daemon, .timeout = 180 * TR_TEST_SLOW);

static const char *spec(const char *name, int epochs, int devices)
{
	static char buf[2048];
	snprintf(buf, sizeof buf, SPEC_FMT, name, epochs, devices);
	return buf;
}

/* A 2-trial grid of 6-epoch trials (150 steps). */
static const char *sweep(const char *name)
{
	static char buf[4096];
	char base[2048];
	snprintf(base, sizeof base, "%s", spec("t", 6, 1));
	snprintf(buf, sizeof buf,
		 "{\"name\": \"%s\", \"spec\": %s, \"search\": {\"method\": \"grid\", \"max_concurrent\": 2},"
		 " \"parameters\": {\"/optimizer/lr\": {\"grid\": [0.1, 0.02]}}}",
		 name, base);
	return buf;
}

static long long post(const char *path, const char *body)
{
	struct http_reply r;
	http(&d, "POST", path, body, NULL, NULL, &r);
	cr_assert_eq(r.status, 201, "POST %s: %ld %s", path, r.status, r.body);
	long long id = json_integer_value(json_object_get(r.json, "id"));
	http_free(&r);
	return id;
}

static json_t *get(const char *fmt, long long id)
{
	struct http_reply r;
	char path[96];
	snprintf(path, sizeof path, fmt, id);
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200, "GET %s: %ld %s", path, r.status, r.body);
	json_t *j = json_incref(r.json);
	http_free(&r);
	return j;
}

static const json_t *trial(const json_t *e, size_t i)
{
	return json_array_get(json_object_get(e, "trials"), i);
}

static long long trial_job(const json_t *e, size_t i)
{
	return json_integer_value(json_object_get(trial(e, i), "job"));
}

/* Waits (bounded) until both trials of experiment id have their jobs;
 * returns the experiment (a new reference). */
static json_t *wait_trial_jobs(long long id)
{
	double until = now_s() + 30 * TR_TEST_SLOW;
	for (;;) {
		json_t *e = get("/experiments/%lld", id);
		if (trial_job(e, 0) > 0 && trial_job(e, 1) > 0)
			return e;
		cr_assert(now_s() < until, "experiment %lld: its trials were not submitted", id);
		json_decref(e);
		usleep(50 * 1000);
	}
}

/* The job's started_at (fixed-width RFC 3339 with milliseconds, so the
 * strings order as the times do). */
static char *started_at(long long job)
{
	json_t *j = get("/jobs/%lld", job);
	const char *t = json_string_value(json_object_get(j, "started_at"));
	cr_assert_not_null(t, "job %lld never started", job);
	char *out = strdup(t);
	json_decref(j);
	return out;
}

static long long step_of(long long job, const char **state)
{
	static char st[32];
	json_t *j = get("/jobs/%lld", job);
	snprintf(st, sizeof st, "%s", json_string_value(json_object_get(j, "state")));
	long long step = json_integer_value(json_object_get(json_object_get(j, "progress"), "step"));
	json_decref(j);
	*state = st;
	return step;
}

static json_t *wait_experiment_end(long long id, double timeout_s)
{
	double until = now_s() + timeout_s * TR_TEST_SLOW;
	for (;;) {
		json_t *e = get("/experiments/%lld", id);
		if (json_is_true(json_object_get(e, "terminal")))
			return e;
		if (now_s() > until) {
			char *text = json_dumps(e, JSON_INDENT(1));
			daemon_dump_log(&d);
			cr_assert_fail("experiment %lld not done after %.0f s: %s", id, timeout_s, text);
		}
		json_decref(e);
		usleep(100 * 1000);
	}
}

Test(experiment_queue, experiments_and_jobs_share_the_queue_and_trials_are_preempted_and_resume)
{
	const char *flags[] = {"--preemption-min-run", "0", "--preemption-grace", "30", NULL};
	daemon_start(&d, 2, flags);

	/* A bad preemptible value is refused as for jobs. */
	struct http_reply r;
	http(&d, "POST", "/experiments?preemptible=yes", sweep("bad"), NULL, NULL, &r);
	cr_assert_eq(r.status, 400, "%ld %s", r.status, r.body);
	cr_assert(strstr(r.body, "preemptible: must be true or false"), "%s", r.body);
	http_free(&r);

	/* The blocker holds both devices while everything else queues. */
	long long blocker = post("/jobs?priority=100", spec("blocker", 1000, 2));
	cr_assert_str_eq(wait_state(&d, blocker, "running|failed", 30), "running");
	long long lo = post("/experiments?priority=1&preemptible=true", sweep("lo"));
	long long hi = post("/experiments?priority=5", sweep("hi"));
	long long plain = post("/jobs?priority=3", spec("plain", 2, 2));
	json_t *elo = wait_trial_jobs(lo), *ehi = wait_trial_jobs(hi);
	cr_assert(json_is_true(json_object_get(elo, "preemptible")));
	cr_assert(json_is_false(json_object_get(ehi, "preemptible")));
	cr_assert_eq(json_integer_value(json_object_get(elo, "priority")), 1);
	long long lo_jobs[2] = {trial_job(elo, 0), trial_job(elo, 1)},
		  hi_jobs[2] = {trial_job(ehi, 0), trial_job(ehi, 1)};
	json_decref(elo);
	json_decref(ehi);
	/* Every trial is a job of its experiment's priority and flag. */
	for (int i = 0; i < 2; i++) {
		json_t *j = get("/jobs/%lld", lo_jobs[i]);
		cr_assert(json_is_true(json_object_get(j, "preemptible")), "trial %d of lo is not preemptible", i);
		cr_assert_eq(json_integer_value(json_object_get(j, "priority")), 1);
		cr_assert_str_eq(json_string_value(json_object_get(j, "state")), "queued");
		json_decref(j);
		j = get("/jobs/%lld", hi_jobs[i]);
		cr_assert(json_is_false(json_object_get(j, "preemptible")));
		cr_assert_eq(json_integer_value(json_object_get(j, "priority")), 5);
		json_decref(j);
	}
	struct http_reply c;
	char path[64];
	snprintf(path, sizeof path, "/jobs/%lld/cancel", blocker);
	http(&d, "POST", path, NULL, NULL, NULL, &c);
	cr_assert_eq(c.status, 202, "%ld %s", c.status, c.body);
	http_free(&c);

	/* The low trials run: a plain job of priority 10 preempts one. */
	double until = now_s() + 120 * TR_TEST_SLOW;
	const char *st;
	while (step_of(lo_jobs[0], &st) < 10 || strcmp(st, "running") != 0 || step_of(lo_jobs[1], &st) < 10 ||
	       strcmp(st, "running") != 0) {
		cr_assert(now_s() < until, "the low trials did not both run");
		cr_assert(strcmp(st, "completed") != 0, "a low trial completed before it could be preempted");
		usleep(10 * 1000);
	}
	/* As long as a trial: the victim waits preempted for several of
	 * the experiment driver's rounds (200 ms). */
	long long urgent = post("/jobs?priority=10", spec("urgent", 6, 1));
	/* The victim: the trial whose job records the preemption (it may
	 * have resumed already when this poll sees it). */
	int victim = -1;
	until = now_s() + 30 * TR_TEST_SLOW;
	while (victim < 0) {
		for (int i = 0; i < 2 && victim < 0; i++) {
			json_t *j = get("/jobs/%lld", lo_jobs[i]);
			json_t *p = json_object_get(j, "preemption");
			if (json_is_object(p)) {
				cr_assert_eq(json_integer_value(json_object_get(p, "by")), urgent);
				victim = i;
			}
			json_decref(j);
		}
		if (now_s() > until) {
			daemon_dump_log(&d);
			cr_assert_fail("no low trial was preempted");
		}
		usleep(10 * 1000);
	}
	/* Preempted is neither a failure nor a report: the trial is still
	 * under way in its experiment, after a few of the driver's rounds. */
	usleep(700 * 1000);
	json_t *e = get("/experiments/%lld", lo);
	const json_t *vt = trial(e, (size_t)victim);
	const char *vs = json_string_value(json_object_get(vt, "state"));
	step_of(urgent, &st);
	cr_assert(strcmp(vs, "preempted") == 0 || strcmp(st, "running") != 0,
		  "the preempted trial shows %s while the job that preempted it runs", vs);
	cr_assert(json_is_null(json_object_get(vt, "metric")), "the preempted trial was reported");
	cr_assert_eq(json_array_size(json_object_get(vt, "rung_metrics")), 0);
	cr_assert(json_is_false(json_object_get(e, "terminal")));
	json_decref(e);
	cr_assert_str_eq(wait_state(&d, urgent, "completed|failed", 60), "completed");

	elo = wait_experiment_end(lo, 120);
	ehi = wait_experiment_end(hi, 60);
	cr_assert_str_eq(json_string_value(json_object_get(elo, "state")), "completed");
	cr_assert_str_eq(json_string_value(json_object_get(ehi, "state")), "completed");
	cr_assert_str_eq(wait_state(&d, plain, "completed|failed", 30), "completed");

	/* Priority order: both high trials, then the plain job, then the
	 * low trials. */
	char *hs[2] = {started_at(hi_jobs[0]), started_at(hi_jobs[1])}, *ps = started_at(plain);
	json_t *pj = get("/jobs/%lld", lo_jobs[1 - victim]);
	char *ls = strdup(json_string_value(json_object_get(pj, "started_at"))); /* never preempted */
	json_decref(pj);
	for (int i = 0; i < 2; i++)
		cr_assert(strcmp(hs[i], ps) < 0, "high trial %d started %s, the plain job %s", i, hs[i], ps);
	cr_assert(strcmp(ps, ls) < 0, "the plain job started %s, a low trial %s", ps, ls);
	free(hs[0]);
	free(hs[1]);
	free(ps);
	free(ls);

	/* The preempted trial ran to its end and every trial's metric (so
	 * the best) equals, bit for bit, the unpreempted experiment's. */
	for (size_t i = 0; i < 2; i++) {
		cr_assert_str_eq(json_string_value(json_object_get(trial(elo, i), "state")), "completed");
		double ml = json_real_value(json_object_get(trial(elo, i), "metric"));
		double mh = json_real_value(json_object_get(trial(ehi, i), "metric"));
		cr_assert(ml == mh, "trial %zu: %.17g with preemption, %.17g without", i, ml, mh);
		cr_assert_eq(json_integer_value(json_object_get(trial(elo, i), "steps")),
			     json_integer_value(json_object_get(trial(ehi, i), "steps")));
	}
	const json_t *bl = json_object_get(elo, "best"), *bh = json_object_get(ehi, "best");
	cr_assert_eq(json_integer_value(json_object_get(bl, "trial")),
		     json_integer_value(json_object_get(bh, "trial")));
	cr_assert(json_real_value(json_object_get(bl, "metric")) == json_real_value(json_object_get(bh, "metric")));
	json_decref(elo);
	json_decref(ehi);
	daemon_stop(&d, NULL);
}
