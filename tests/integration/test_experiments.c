/* Experiments on a real daemon (docs/experiments.md): a 9-trial ASHA
 * sweep of the learning rate on digits with reduction factor 3 and 2 CPU
 * devices, killed (SIGKILL) and restarted mid-sweep, against the full grid
 * of the same learning rates; validation errors with their JSON pointers;
 * pause, resume and cancel of a whole experiment.
 *
 * The model is tiny (64-32-10) and an epoch of digits is 12 steps of 128,
 * so a trial's 9 epochs take about a second: the sweep and the grid take
 * seconds each.  The learning rates are listed best first for SGD on this
 * data, so asynchronous promotions happen exactly at 3, 6 and 9 reports
 * of rung 0 and the bottom 6 trials stop there.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define SPEC                                                                                                  \
	"{\"seed\": 1, \"model\": {\"inputs\": 64, \"layers\": [{\"type\": \"dense\", \"units\": 32},"        \
	" {\"type\": \"relu\"}, {\"type\": \"dense\", \"units\": 10}], \"loss\": \"softmax_cross_entropy\"}," \
	" \"data\": {\"train\": {\"format\": \"csv\", \"path\": \"digits-train.csv\", \"label\": -1},"        \
	" \"validation\": {\"format\": \"csv\", \"path\": \"digits-val.csv\", \"label\": -1},"                \
	" \"transforms\": [{\"type\": \"scale\", \"factor\": 0.0625}]}, \"batch_size\": 128, \"epochs\": 9,"  \
	" \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1, \"momentum\": 0.9}, \"devices\": 1,"                \
	" \"prefetch\": {\"workers\": 1}}"
#define LRS "[0.1, 0.05, 0.03, 0.02, 0.01, 0.005, 0.002, 0.001, 0.0005]"
#define STEPS_PER_EPOCH 12 /* 1497 rows / 128, the last step short */

/* Writes digits-train.csv and digits-val.csv into the daemon's data root
 * (examples/digits_csv.py, from python3-sklearn's copy). */
static void write_digits(const struct daemon *d)
{
	char cmd[512];
	snprintf(cmd, sizeof cmd, "python3 examples/digits_csv.py %s >/dev/null", d->dir);
	cr_assert_eq(system(cmd), 0, "examples/digits_csv.py failed (python3-sklearn installed?)");
}

static long long submit_experiment(const struct daemon *d, const char *body)
{
	struct http_reply r;
	http(d, "POST", "/experiments", body, NULL, NULL, &r);
	cr_assert_eq(r.status, 201, "POST /experiments: %ld %s", r.status, r.body);
	cr_assert(strstr(r.headers, "Location: /experiments/"), "no Location: %s", r.headers);
	long long id = json_integer_value(json_object_get(r.json, "id"));
	http_free(&r);
	return id;
}

static json_t *get_experiment(const struct daemon *d, long long id)
{
	struct http_reply r;
	char path[64];
	snprintf(path, sizeof path, "/experiments/%lld", id);
	http(d, "GET", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200, "GET %s: %ld %s", path, r.status, r.body);
	json_t *e = json_incref(r.json);
	http_free(&r);
	return e;
}

/* Polls until the experiment is terminal or until `reports` trials
 * reported at rung 0 (0: only the end), at most timeout_s. */
static json_t *wait_experiment(const struct daemon *d, long long id, size_t reports, double timeout_s)
{
	double until = now_s() + timeout_s * TR_TEST_SLOW;
	for (;;) {
		json_t *e = get_experiment(d, id);
		size_t n = json_array_size(json_object_get(json_array_get(json_object_get(e, "rungs"), 0), "results"));
		if (json_is_true(json_object_get(e, "terminal")) || (reports && n >= reports))
			return e;
		if (now_s() > until) {
			char *text = json_dumps(e, JSON_INDENT(1));
			daemon_dump_log(d);
			cr_assert_fail("experiment %lld not done after %.0f s: %s", id, timeout_s, text);
		}
		json_decref(e);
		usleep(100 * 1000);
	}
}

static double lr_of(const json_t *trial)
{
	return json_number_value(json_object_get(json_object_get(trial, "parameters"), "/optimizer/lr"));
}

static const json_t *trial_with_lr(const json_t *e, double lr)
{
	size_t i;
	json_t *t;
	json_array_foreach(json_object_get(e, "trials"), i, t)
		if (lr_of(t) == lr)
			return t;
	return NULL;
}

Test(experiments, asha_sweep_survives_a_restart_and_matches_the_grid, .timeout = 400)
{
	struct daemon d;
	daemon_start(&d, 2, NULL);
	write_digits(&d);

	const char *asha_body = "{\"name\": \"lr-asha\", \"spec\": " SPEC ","
				" \"search\": {\"method\": \"asha\", \"max_length\": {\"epochs\": 9},"
				" \"reduction_factor\": 3, \"max_concurrent\": 2},"
				" \"parameters\": {\"/optimizer/lr\": {\"grid\": " LRS "}}}";
	long long asha = submit_experiment(&d, asha_body);

	/* Mid-sweep: some trials have reported at the first rung, others
	 * have not started.  SIGKILL: nothing is written on the way out. */
	json_decref(wait_experiment(&d, asha, 4, 120));
	daemon_kill(&d);
	daemon_restart(&d, 2, NULL);
	json_t *e = wait_experiment(&d, asha, 0, 180);
	cr_assert_str_eq(json_string_value(json_object_get(e, "state")), "completed");

	/* No trial lost or doubled: 9 trials, each with its own job, and the
	 * daemon holds exactly 9 jobs of this experiment. */
	json_t *trials = json_object_get(e, "trials");
	cr_assert_eq(json_array_size(trials), 9);
	struct http_reply r;
	http(&d, "GET", "/jobs?limit=1000&fields=experiment,trial", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200);
	size_t i, jobs_of_experiment = 0;
	json_t *job, *t;
	json_array_foreach(json_object_get(r.json, "jobs"), i, job) {
		if (json_integer_value(json_object_get(job, "experiment")) != asha)
			continue;
		jobs_of_experiment++;
		int trial = (int)json_integer_value(json_object_get(job, "trial"));
		cr_assert(trial >= 0 && trial < 9);
		cr_assert_eq(json_integer_value(json_object_get(json_array_get(trials, (size_t)trial), "job")),
			     json_integer_value(json_object_get(job, "id")), "trial %d names another job", trial);
	}
	http_free(&r);
	cr_assert_eq(jobs_of_experiment, 9, "%zu jobs carry experiment %lld", jobs_of_experiment, asha);

	/* Rung lengths 1, 3, 9 epochs; rung 0 promotes its best 3, rung 1
	 * its best 1; the bottom 6 stopped at rung 0 after one epoch. */
	json_t *rungs = json_object_get(e, "rungs");
	cr_assert_eq(json_array_size(rungs), 3);
	cr_assert_eq(json_integer_value(json_object_get(json_array_get(rungs, 0), "length")), 1);
	cr_assert_eq(json_integer_value(json_object_get(json_array_get(rungs, 2), "length")), 9);
	json_t *r0 = json_array_get(rungs, 0);
	cr_assert_eq(json_array_size(json_object_get(r0, "results")), 9);
	cr_assert_eq(json_array_size(json_object_get(r0, "promoted")), 3);
	int stopped_at_first = 0;
	json_array_foreach(trials, i, t) {
		if (json_integer_value(json_object_get(t, "rung")) != 0)
			continue;
		stopped_at_first++;
		cr_assert_str_eq(json_string_value(json_object_get(t, "state")), "stopped");
		cr_assert_eq(json_integer_value(json_object_get(t, "steps")), STEPS_PER_EPOCH,
			     "trial %zu trained %lld steps, not one epoch", i,
			     (long long)json_integer_value(json_object_get(t, "steps")));
	}
	cr_assert_eq(stopped_at_first, 6);
	/* The three promoted from rung 0 are its three best. */
	for (size_t k = 0; k < 3; k++) {
		json_int_t best_k =
			json_integer_value(json_object_get(json_array_get(json_object_get(r0, "results"), k), "trial"));
		bool promoted = false;
		json_t *p;
		size_t j;
		json_array_foreach(json_object_get(r0, "promoted"), j, p)
			promoted |= json_integer_value(p) == best_k;
		cr_assert(promoted, "rung 0's #%zu (trial %lld) was not promoted", k + 1, (long long)best_k);
	}

	/* The full grid of the same learning rates. */
	const char *grid_body = "{\"name\": \"lr-grid\", \"spec\": " SPEC ","
				" \"search\": {\"method\": \"grid\", \"max_concurrent\": 2},"
				" \"parameters\": {\"/optimizer/lr\": {\"grid\": " LRS "}}}";
	long long grid = submit_experiment(&d, grid_body);
	json_t *g = wait_experiment(&d, grid, 0, 240);
	cr_assert_str_eq(json_string_value(json_object_get(g, "state")), "completed");
	const json_t *ab = json_object_get(e, "best"), *gb = json_object_get(g, "best");
	cr_assert(json_is_object(ab) && json_is_object(gb));
	double asha_lr = lr_of(json_array_get(trials, (size_t)json_integer_value(json_object_get(ab, "trial"))));
	double grid_lr = lr_of(
		json_array_get(json_object_get(g, "trials"), (size_t)json_integer_value(json_object_get(gb, "trial"))));
	cr_assert_eq(asha_lr, grid_lr, "ASHA picked lr %g, the grid %g", asha_lr, grid_lr);
	/* Paused at two rungs and resumed (once across a SIGKILL), the best
	 * trial ends bit-identically to the grid's uninterrupted run. */
	double am = json_real_value(json_object_get(ab, "metric")), gm = json_real_value(json_object_get(gb, "metric"));
	cr_assert(am == gm, "best %s: ASHA %.17g, grid %.17g", json_string_value(json_object_get(e, "name")), am, gm);
	const json_t *gt = trial_with_lr(g, asha_lr);
	cr_assert_not_null(gt);

	/* The sweep's cost against the grid's. */
	long long asha_steps = json_integer_value(json_object_get(e, "steps"));
	long long grid_steps = json_integer_value(json_object_get(g, "steps"));
	fprintf(stderr, "experiments: ASHA trained %lld steps, the full grid %lld (%.0f%%)\n", asha_steps, grid_steps,
		100.0 * (double)asha_steps / (double)grid_steps);
	cr_assert_eq(grid_steps, 9 * 9 * STEPS_PER_EPOCH);
	cr_assert_eq(asha_steps, (6 * 1 + 2 * 3 + 1 * 9) * STEPS_PER_EPOCH);

	/* The best trial's checkpoint downloads. */
	const char *url = json_string_value(json_object_get(json_object_get(ab, "checkpoint"), "url"));
	cr_assert_not_null(url);
	char file[256];
	snprintf(file, sizeof file, "%s/best.safetensors", d.dir);
	size_t len = 0;
	cr_assert_eq(http_download(&d, url, file, &len), 200);
	cr_assert_gt(len, 1000);
	json_decref(e);
	json_decref(g);
	daemon_stop(&d, NULL);
	daemon_cleanup(&d);
}

static void expect_400(const struct daemon *d, const char *body, const char *pointer, const char *needle)
{
	struct http_reply r;
	http(d, "POST", "/experiments", body, NULL, NULL, &r);
	cr_assert_eq(r.status, 400, "%s: %ld %s", pointer, r.status, r.body);
	json_t *err = json_object_get(r.json, "error");
	cr_assert_str_eq(json_string_value(json_object_get(err, "code")), "invalid_spec", "%s", r.body);
	cr_assert_str_eq(json_string_value(json_object_get(err, "pointer")), pointer, "%s", r.body);
	cr_assert(strstr(json_string_value(json_object_get(err, "message")), needle), "%s", r.body);
	http_free(&r);
}

Test(experiments, bad_requests_name_their_pointer, .timeout = 120)
{
	struct daemon d;
	daemon_start(&d, 1, NULL);
	write_digits(&d);
#define BODY(search, params) "{\"spec\": " SPEC ", \"search\": " search ", \"parameters\": " params "}"
#define LR_GRID "{\"/optimizer/lr\": {\"grid\": [0.1]}}"
	expect_400(&d,
		   BODY("{\"method\": \"asha\", \"max_length\": {\"epochs\": 9}, \"reduction_factor\": 1}", LR_GRID),
		   "/search/reduction_factor", "[2, 100]");
	expect_400(&d, BODY("{\"method\": \"hyperband\"}", LR_GRID), "/search/method", "grid, random or asha");
	expect_400(&d, BODY("{\"method\": \"grid\", \"colour\": 1}", LR_GRID), "/search/colour", "unknown key");
	expect_400(&d, BODY("{\"method\": \"asha\"}", LR_GRID), "/search/max_length", "required");
	expect_400(&d, BODY("{\"method\": \"random\"}", "{\"/optimizer/lr\": {\"log_uniform\": [0.001, 1]}}"),
		   "/search/max_trials", "required");
	expect_400(&d,
		   BODY("{\"method\": \"random\", \"max_trials\": 2}",
			"{\"/optimizer/lr\": {\"log_uniform\": [0, 1]}}"),
		   "/parameters/~1optimizer~1lr/log_uniform", "0 < low < high");
	expect_400(&d, BODY("{\"method\": \"grid\"}", "{\"/optimizer/lr\": {\"uniform\": [0.1, 1]}}"),
		   "/parameters/~1optimizer~1lr/uniform", "only grid or choice");
	expect_400(&d, BODY("{\"method\": \"grid\"}", "{\"/optimizer/lr\": {\"grid\": [0.1, -1]}}"),
		   "/parameters/~1optimizer~1lr", "trial 1");
	expect_400(&d, BODY("{\"method\": \"grid\"}", "{\"/optimiser/lr\": {\"grid\": [0.1]}}"),
		   "/parameters/~1optimiser~1lr", "parent");
	expect_400(&d, BODY("{\"method\": \"grid\"}", "{\"/model/layers/7/units\": {\"grid\": [4]}}"),
		   "/parameters/~1model~1layers~17~1units", "parent");
	expect_400(&d,
		   "{\"spec\": " SPEC ", \"search\": {\"method\": \"grid\"}, \"parameters\": " LR_GRID ", \"x\": 1}",
		   "/x", "unknown key");
	/* The base spec's own error, at its place under /spec. */
	expect_400(&d,
		   "{\"spec\": {\"model\": {\"layers\": []}}, \"search\": {\"method\": \"grid\"}, \"parameters\": "
		   "{\"/seed\": {\"grid\": [1]}}}",
		   "/spec/model/layers", "");
	/* A data file outside the roots is the daemon's 422, at submit. */
	struct http_reply r;
	http(&d, "POST", "/experiments",
	     "{\"spec\": {\"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 2}]}, \"data\": {\"train\": {\"format\": "
	     "\"csv\", \"path\": \"missing.csv\", \"label\": -1}}, \"batch_size\": 4, \"epochs\": 1, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}, \"search\": "
	     "{\"method\": \"grid\"}, \"parameters\": {\"/seed\": {\"grid\": [1, 2]}}}",
	     NULL, NULL, &r);
	cr_assert_eq(r.status, 422, "%ld %s", r.status, r.body);
	cr_assert(strstr(r.body, "/spec/data/train"), "%s", r.body);
	http_free(&r);
	http(&d, "GET", "/experiments/99", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 404);
	http_free(&r);
	http(&d, "GET", "/experiments?state=sleeping", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 400);
	http_free(&r);
	daemon_stop(&d, NULL);
	daemon_cleanup(&d);
}

static long control(const struct daemon *d, long long id, const char *what)
{
	struct http_reply r;
	char path[96];
	snprintf(path, sizeof path, "/experiments/%lld/%s", id, what);
	http(d, "POST", path, NULL, NULL, NULL, &r);
	long status = r.status;
	http_free(&r);
	return status;
}

/* Pause stops every trial at a step boundary and starts none; resume
 * continues them; cancel ends the experiment and its trials. */
Test(experiments, pause_resume_cancel_act_on_every_trial, .timeout = 200)
{
	struct daemon d;
	daemon_start(&d, 2, NULL);
	write_digits(&d);
	/* Long trials (90 epochs each) so that they are still running. */
	long long id = submit_experiment(
		&d,
		"{\"name\": \"ctl\", \"spec\": " SPEC ", \"search\": {\"method\": \"random\", \"max_trials\": 4,"
		" \"max_concurrent\": 2, \"seed\": 3}, \"parameters\": {\"/optimizer/lr\": {\"log_uniform\": [0.001, 0.1]},"
		" \"/epochs\": {\"grid\": [90]}}}");
	cr_assert_eq(control(&d, id, "resume"), 409);
	double until = now_s() + 60 * TR_TEST_SLOW;
	json_t *e = NULL;
	for (;;) { /* both running trials are under way */
		e = get_experiment(&d, id);
		int running = 0;
		size_t i;
		json_t *t;
		json_array_foreach(json_object_get(e, "trials"), i, t)
			running += strcmp(json_string_value(json_object_get(t, "state")), "running") == 0 &&
				   json_integer_value(json_object_get(t, "steps")) > 0;
		if (running == 2)
			break;
		cr_assert(now_s() < until, "trials did not start");
		json_decref(e);
		usleep(100 * 1000);
	}
	json_decref(e);
	cr_assert_eq(control(&d, id, "pause"), 202);
	cr_assert_eq(control(&d, id, "pause"), 409);
	const char *st;
	for (int trial = 0; trial < 2; trial++) {
		e = get_experiment(&d, id);
		long long job = json_integer_value(
			json_object_get(json_array_get(json_object_get(e, "trials"), (size_t)trial), "job"));
		json_decref(e);
		st = wait_state(&d, job, "paused", 60);
		cr_assert_str_eq(st, "paused");
	}
	usleep(600 * 1000); /* rounds of the driver: no new trial while paused */
	e = get_experiment(&d, id);
	cr_assert_str_eq(json_string_value(json_object_get(e, "state")), "paused");
	cr_assert(json_is_null(json_object_get(json_array_get(json_object_get(e, "trials"), 2), "job")));
	long long job0 = json_integer_value(json_object_get(json_array_get(json_object_get(e, "trials"), 0), "job"));
	json_decref(e);
	cr_assert_eq(control(&d, id, "resume"), 202);
	st = wait_state(&d, job0, "running|queued", 30);
	cr_assert(strcmp(st, "running") == 0 || strcmp(st, "queued") == 0, "%s", st);
	cr_assert_eq(control(&d, id, "cancel"), 202);
	cr_assert_str_eq(wait_state(&d, job0, "cancelled", 60), "cancelled");
	e = get_experiment(&d, id);
	cr_assert_str_eq(json_string_value(json_object_get(e, "state")), "cancelled");
	cr_assert_eq(control(&d, id, "cancel"), 409);
	json_decref(e);
	usleep(600 * 1000);
	e = get_experiment(&d, id);
	cr_assert(json_is_null(json_object_get(json_array_get(json_object_get(e, "trials"), 3), "job")),
		  "a trial started after the cancel");
	json_decref(e);
	daemon_stop(&d, NULL);
	daemon_cleanup(&d);
}
