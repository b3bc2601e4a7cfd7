/* The experiments' driver and operations (daemon/experiments.h).
 *
 * Each round looks at every experiment that has not ended: a trial job
 * that paused at its rung, completed, failed or was cancelled becomes a
 * report (once: a report is stored with the rung it is for); then, while
 * the experiment runs, the searcher decides with a free slot (fewer than
 * max_concurrent trials training) until it says wait or done.  The order
 * of the writes makes every step safe to repeat after a crash: a trial's
 * job is unique per (experiment, trial), so submitting it twice stores
 * nothing; a promotion sets the job's next rung and resumes it before the
 * promotion is recorded, and a second resume of a running job is refused
 * and ignored.  One lock serialises rounds and the control operations.
 * The trials of an experiment submitted preemptible are preemptible jobs
 * (daemon/preemption.c): a preempted one waits in the queue and resumes
 * on its own, so the driver just waits for it.
 */
#include "daemon/experiments.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/api.h"
#include "core/json_text.h"
#include "core/rfc3339.h"
#include "core/searcher.h"
#include "daemon/experiment_spec.h"
#include "daemon/log.h"
#include "daemon/scheduler_internal.h"
#include "storage/checkpoints.h"

#define ROUND_MS 200
#define ACTIONS_PER_ROUND 64

struct tr_experiments {
	struct tr_scheduler *sched;
	pthread_mutex_t lock; /* one round or one control operation at a time */
	pthread_mutex_t wake_lock;
	pthread_cond_t wake;
	bool stopping; /* under wake_lock */
	pthread_t thread;
};

/* One experiment as the store holds it, with the searcher's view. */
struct view {
	struct tr_experiment_row row;
	json_t *request;
	struct tr_exp_search search;
	struct tr_search_config cfg;
	struct tr_job_row *trials; /* by trial index; trials[i].trial == i unless a row is missing */
	int ntrials;
	struct tr_experiment_event *events;
	int nevents;
	struct tr_search_report *reports;
	struct tr_search_promotion *promotions;
	struct tr_search_state st;
};

static void view_finish(struct view *v)
{
	tr_experiment_row_finish(&v->row);
	json_decref(v->request);
	for (int i = 0; i < v->ntrials; i++)
		tr_job_row_finish(&v->trials[i]);
	free(v->trials);
	free(v->events);
	free(v->reports);
	free(v->promotions);
	memset(v, 0, sizeof *v);
}

static int store_fail(struct tr_error *err, const struct tr_error *se)
{
	return tr_job_fail(err, TR_JOB_E_STORAGE, "", "%s", se->message);
}

/* The reports and promotions of v->events as the searcher's arrays. */
static int view_searcher_state(struct view *v, struct tr_error *err)
{
	int n = v->nevents > 0 ? v->nevents : 1;
	v->reports = calloc((size_t)n, sizeof *v->reports);
	v->promotions = calloc((size_t)n, sizeof *v->promotions);
	if (!v->reports || !v->promotions)
		return tr_job_fail(err, TR_JOB_E_INTERNAL, "", "out of memory");
	v->st = (struct tr_search_state){.reports = v->reports, .promotions = v->promotions};
	for (int i = 0; i < v->nevents; i++) {
		const struct tr_experiment_event *e = &v->events[i];
		if (e->promotion)
			v->promotions[v->st.npromotions++] = (struct tr_search_promotion){e->trial, e->rung};
		else
			v->reports[v->st.nreports++] =
				(struct tr_search_report){e->trial, e->rung, e->metric, e->failed};
	}
	return 0;
}

static int view_load(struct tr_scheduler *s, int64_t id, struct view *v, struct tr_error *err)
{
	struct tr_error se = {0};
	json_error_t jerr;
	int rc;

	memset(v, 0, sizeof *v);
	rc = tr_store_experiment_get(s->cfg.store, id, &v->row, &se);
	if (rc == -ENOENT)
		return tr_job_fail(err, TR_JOB_E_NOT_FOUND, "", "experiment %lld not found", (long long)id);
	if (rc < 0)
		return store_fail(err, &se);
	v->request = json_loads(v->row.request, 0, &jerr);
	if (!v->request || tr_exp_search_read(v->request, &v->search, err) < 0) {
		if (!v->request)
			tr_job_fail(err, TR_JOB_E_INTERNAL, "", "experiment %lld: stored request: %s", (long long)id,
				    jerr.text);
		goto fail;
	}
	v->cfg = (struct tr_search_config){.max_trials = v->search.max_trials,
					   .reduction_factor =
						   v->search.reduction_factor > 1 ? v->search.reduction_factor : 2,
					   .nrungs = v->search.nrungs,
					   .maximize = v->search.maximize};
	if (tr_store_job_list_trials(s->cfg.store, id, &v->trials, &v->ntrials, &se) < 0 ||
	    tr_store_experiment_events(s->cfg.store, id, &v->events, &v->nevents, &se) < 0) {
		store_fail(err, &se);
		goto fail;
	}
	if (view_searcher_state(v, err) < 0)
		goto fail;
	return 0;
fail:
	view_finish(v);
	return -1;
}

/* The rung a trial trains towards: how often it was promoted. */
static int target_rung(const struct view *v, int trial)
{
	int k = 0;
	for (int i = 0; i < v->st.npromotions; i++)
		k += v->promotions[i].trial == trial;
	return k;
}

static const struct tr_search_report *report_at(const struct view *v, int trial, int rung)
{
	const struct tr_search_report *r = NULL;
	for (int i = 0; i < v->st.nreports; i++)
		if (v->reports[i].trial == trial && v->reports[i].rung == rung)
			r = &v->reports[i];
	return r;
}

static bool promoted_from(const struct view *v, int trial, int rung)
{
	for (int i = 0; i < v->st.npromotions; i++)
		if (v->promotions[i].trial == trial && v->promotions[i].rung == rung)
			return true;
	return false;
}

/* The step at which rung k ends for a trial (INT64_MAX while unknown:
 * epochs before the job has reported its planned steps). */
static int64_t rung_step(const struct view *v, const struct tr_job_row *job, int k)
{
	if (!v->search.epochs)
		return v->search.rungs[k];
	if (job->total_steps <= 0 || v->search.max_length <= 0)
		return INT64_MAX;
	return job->total_steps / v->search.max_length * v->search.rungs[k];
}

/* The pause_at a trial gets for training towards rung k: that rung's
 * length, or 0 (none) for the last. */
static int64_t pause_for(const struct view *v, int k)
{
	return k < v->search.nrungs - 1 ? v->search.rungs[k] : 0;
}

/* Whether a trial is waiting at its rung: reported there, not promoted. */
static bool waiting(const struct view *v, const struct tr_job_row *job)
{
	return report_at(v, job->trial, target_rung(v, job->trial)) != NULL;
}

/* Turns what the trial jobs did into reports.  Returns how many it added
 * (the view is stale then), or -1. */
static int sync_reports(struct tr_scheduler *s, struct view *v, struct tr_error *err)
{
	int added = 0;
	for (int i = 0; i < v->ntrials; i++) {
		const struct tr_job_row *job = &v->trials[i];
		int k = target_rung(v, job->trial);
		if (report_at(v, job->trial, k))
			continue;
		struct tr_experiment_event ev = {.trial = job->trial, .rung = k, .metric = NAN};
		bool at_rung = job->state == TR_JOB_PAUSED && k < v->search.nrungs - 1 &&
			       job->step >= rung_step(v, job, k);
		if (job->state == TR_JOB_COMPLETED || at_rung) {
			int64_t step;
			double value;
			if (tr_store_metric_last(s->cfg.store, job->id, v->search.metric, &step, &value, NULL) == 1)
				ev.metric = value;
		} else if (job->state == TR_JOB_FAILED || job->state == TR_JOB_CANCELLED ||
			   job->state == TR_JOB_STOPPED) {
			ev.failed = true;
		} else {
			/* Still under way: queued, running, or preempted or
			 * interrupted (back in the queue, it resumes from its
			 * checkpoint bit-identically and reports then).  A
			 * preempted trial is no rung pause and no failure. */
			continue;
		}
		struct tr_error se = {0};
		if (tr_store_experiment_event_add(s->cfg.store, v->row.id, &ev, &se) < 0)
			return store_fail(err, &se);
		tr_log(TR_LOG_INF, "experiment %lld: trial %d (job %lld) %s at rung %d%s", (long long)v->row.id,
		       job->trial, (long long)job->id, ev.failed ? "failed" : "reported", k,
		       ev.failed          ? ""
		       : isnan(ev.metric) ? " without a metric"
					  : "");
		added++;
	}
	return added;
}

/* Trials training now: not waiting at a rung and not ended.  A
 * preempted trial counts: it holds its slot until it resumes. */
static int active_trials(const struct view *v)
{
	int n = 0;
	for (int i = 0; i < v->ntrials; i++)
		n += !waiting(v, &v->trials[i]) && !tr_job_state_terminal(v->trials[i].state);
	return n;
}

static int set_state(struct tr_scheduler *s, struct view *v, enum tr_experiment_state state, const char *code,
		     const char *message)
{
	char *error = NULL;
	struct tr_error se = {0};
	if (code) {
		json_t *e = json_pack("{s:s, s:s}", "code", code, "message", message);
		error = e ? json_dumps(e, JSON_COMPACT) : NULL;
		json_decref(e);
	}
	int rc = tr_store_experiment_set_state(s->cfg.store, v->row.id, state, error, &se);
	free(error);
	if (rc < 0) {
		tr_log(TR_LOG_WARN, "experiment %lld: cannot record state %s: %s", (long long)v->row.id,
		       tr_experiment_state_name(state), se.message);
		return rc;
	}
	tr_log(TR_LOG_NOTICE, "experiment %lld: %s%s%s", (long long)v->row.id, tr_experiment_state_name(state),
	       message ? ": " : "", message ? message : "");
	v->row.state = state;
	return 0;
}

static int start_trial(struct tr_scheduler *s, struct view *v, int trial, struct tr_error *err)
{
	json_t *params = NULL, *spec = NULL;
	if (tr_exp_trial(v->request, &v->search, trial, &params, &spec, err) < 0)
		return -1;
	char name[256];
	snprintf(name, sizeof name, "%.200s-%d", v->row.name, trial);
	json_object_set_new(spec, "name", json_string(name));
	struct tr_job_row tag = {.experiment = v->row.id,
				 .trial = trial,
				 .pause_at = pause_for(v, 0),
				 .preemptible = v->row.preemptible};
	int64_t id = 0;
	int rc = tr_sched_submit_trial(s, spec, v->row.priority, &tag, &id, NULL, err);
	json_decref(params);
	json_decref(spec);
	if (rc == 0)
		tr_log(TR_LOG_INF, "experiment %lld: trial %d submitted as job %lld", (long long)v->row.id, trial,
		       (long long)id);
	if (rc < 0 && err->kind == TR_JOB_E_CONFLICT)
		return 0; /* its job exists (a round before a crash stored it) */
	return rc;
}

static const struct tr_job_row *trial_job(const struct view *v, int trial)
{
	for (int i = 0; i < v->ntrials; i++)
		if (v->trials[i].trial == trial)
			return &v->trials[i];
	return NULL;
}

static int promote(struct tr_scheduler *s, struct view *v, int trial, int rung, struct tr_error *err)
{
	const struct tr_job_row *job = trial_job(v, trial);
	struct tr_error se = {0}, ce = {0};
	if (!job)
		return tr_job_fail(err, TR_JOB_E_INTERNAL, "", "trial %d has no job", trial);
	if (tr_store_job_set_pause_at(s->cfg.store, job->id, pause_for(v, rung + 1), &se) < 0)
		return store_fail(err, &se);
	/* A resume refused because the job runs already is a repeat after a
	 * crash: the promotion below is what was not recorded. */
	if (tr_sched_control(s, job->id, TR_JOB_RESUME, &ce) < 0 && ce.kind != TR_JOB_E_ILLEGAL)
		tr_log(TR_LOG_WARN, "experiment %lld: cannot resume trial %d (job %lld): %s", (long long)v->row.id,
		       trial, (long long)job->id, ce.message);
	struct tr_experiment_event ev = {.promotion = true, .trial = trial, .rung = rung, .metric = NAN};
	if (tr_store_experiment_event_add(s->cfg.store, v->row.id, &ev, &se) < 0)
		return store_fail(err, &se);
	tr_log(TR_LOG_INF, "experiment %lld: trial %d promoted from rung %d", (long long)v->row.id, trial, rung);
	return 0;
}

/* One experiment's round.  The view is reloaded after every change. */
static void drive(struct tr_scheduler *s, int64_t id)
{
	struct tr_error err = {0};
	for (int n = 0; n < ACTIONS_PER_ROUND; n++) {
		struct view v;
		if (view_load(s, id, &v, &err) < 0) {
			tr_log(TR_LOG_WARN, "experiment %lld: %s", (long long)id, err.message);
			return;
		}
		int added = tr_experiment_state_terminal(v.row.state) ? 0 : sync_reports(s, &v, &err);
		if (added != 0 || tr_experiment_state_terminal(v.row.state) || v.row.state == TR_EXP_PAUSED) {
			view_finish(&v);
			if (added > 0)
				continue;
			return;
		}
		if (v.row.state == TR_EXP_QUEUED)
			for (int i = 0; i < v.ntrials; i++)
				if (v.trials[i].started_at > 0) {
					set_state(s, &v, TR_EXP_RUNNING, NULL, NULL);
					break;
				}
		/* Trials start in index order; rows come by index.  A trial whose
		 * job was deleted by hand is not started again. */
		v.st.started = v.ntrials > 0 ? v.trials[v.ntrials - 1].trial + 1 : 0;
		v.st.active = active_trials(&v);
		struct tr_search_decision d = tr_search_next(&v.cfg, &v.st, v.st.active < v.search.max_concurrent);
		int rc = 0;
		if (d.action == TR_SEARCH_START) {
			rc = start_trial(s, &v, d.trial, &err);
			if (rc < 0)
				set_state(s, &v, TR_EXP_FAILED, "trial_refused", err.message);
		} else if (d.action == TR_SEARCH_PROMOTE) {
			rc = promote(s, &v, d.trial, d.rung, &err);
		} else if (d.action == TR_SEARCH_DONE) {
			int best = tr_search_best(&v.cfg, &v.st, NULL);
			char msg[256];
			snprintf(msg, sizeof msg, "no trial reported %s", v.search.metric);
			if (best >= 0)
				set_state(s, &v, TR_EXP_COMPLETED, NULL, NULL);
			else
				set_state(s, &v, TR_EXP_FAILED, "no_result", msg);
		}
		view_finish(&v);
		if (rc < 0) {
			tr_log(TR_LOG_WARN, "experiment %lld: %s", (long long)id, err.message);
			return;
		}
		if (d.action == TR_SEARCH_WAIT || d.action == TR_SEARCH_DONE)
			return;
	}
}

static void round_all(struct tr_experiments *x)
{
	struct tr_scheduler *s = x->sched;
	struct tr_experiment_row *rows = NULL;
	int n = 0;
	static const enum tr_experiment_state live[] = {TR_EXP_QUEUED, TR_EXP_RUNNING, TR_EXP_PAUSED};
	for (size_t k = 0; k < sizeof live / sizeof live[0]; k++) {
		if (tr_store_experiment_list(s->cfg.store, &live[k], 0, 0, &rows, &n, NULL) < 0)
			continue;
		for (int i = 0; i < n; i++) {
			pthread_mutex_lock(&x->lock);
			drive(s, rows[i].id);
			pthread_mutex_unlock(&x->lock);
			tr_experiment_row_finish(&rows[i]);
		}
		free(rows);
	}
}

static void *driver_main(void *arg)
{
	struct tr_experiments *x = arg;
	pthread_setname_np(pthread_self(), "tr-experiments");
	pthread_mutex_lock(&x->wake_lock);
	while (!x->stopping) {
		pthread_mutex_unlock(&x->wake_lock);
		if (atomic_load(&x->sched->ready))
			round_all(x);
		pthread_mutex_lock(&x->wake_lock);
		struct timespec until;
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_nsec += ROUND_MS * 1000000L;
		if (until.tv_nsec >= 1000000000L) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000L;
		}
		if (!x->stopping)
			pthread_cond_timedwait(&x->wake, &x->wake_lock, &until);
	}
	pthread_mutex_unlock(&x->wake_lock);
	return NULL;
}

static void kick(struct tr_experiments *x)
{
	pthread_mutex_lock(&x->wake_lock);
	pthread_cond_signal(&x->wake);
	pthread_mutex_unlock(&x->wake_lock);
}

tr_experiments_t *tr_experiments_start(tr_scheduler_t *sched, struct tr_error *err)
{
	struct tr_experiments *x = calloc(1, sizeof *x);
	if (!x) {
		tr_error_set(err, -ENOMEM, 0, NULL, "out of memory");
		return NULL;
	}
	x->sched = sched;
	pthread_mutex_init(&x->lock, NULL);
	pthread_mutex_init(&x->wake_lock, NULL);
	pthread_cond_init(&x->wake, NULL);
	if (pthread_create(&x->thread, NULL, driver_main, x) != 0) {
		tr_error_set(err, -EAGAIN, 0, NULL, "cannot start the experiments' thread");
		pthread_cond_destroy(&x->wake);
		pthread_mutex_destroy(&x->wake_lock);
		pthread_mutex_destroy(&x->lock);
		free(x);
		return NULL;
	}
	pthread_mutex_lock(&sched->lock);
	sched->experiments = x;
	pthread_mutex_unlock(&sched->lock);
	return x;
}

void tr_experiments_stop(tr_experiments_t *x)
{
	if (!x)
		return;
	pthread_mutex_lock(&x->wake_lock);
	x->stopping = true;
	pthread_cond_signal(&x->wake);
	pthread_mutex_unlock(&x->wake_lock);
	pthread_join(x->thread, NULL);
	pthread_mutex_lock(&x->sched->lock);
	x->sched->experiments = NULL;
	pthread_mutex_unlock(&x->sched->lock);
	pthread_cond_destroy(&x->wake);
	pthread_mutex_destroy(&x->wake_lock);
	pthread_mutex_destroy(&x->lock);
	free(x);
}

/* ---- rendering -------------------------------------------------------- */

static json_t *metric_json(double m)
{
	return isnan(m) ? json_null() : json_real(m);
}

static const char *trial_state(const struct view *v, const struct tr_job_row *job)
{
	int k = target_rung(v, job->trial);
	const struct tr_search_report *r = report_at(v, job->trial, k);
	if (r && !r->failed && k < v->search.nrungs - 1 && !promoted_from(v, job->trial, k))
		return tr_experiment_state_terminal(v->row.state) ? "stopped" : "paused";
	return tr_job_state_name(job->state);
}

static json_t *trial_json(const struct view *v, int trial)
{
	const struct tr_job_row *job = trial_job(v, trial);
	json_t *params = NULL, *spec = NULL, *rm = json_array();
	struct tr_error e = {0};
	int rung = -1;
	double metric = NAN;
	if (tr_exp_trial(v->request, &v->search, trial, &params, &spec, &e) < 0)
		params = json_object();
	json_decref(spec);
	for (int k = 0; k < v->search.nrungs; k++) {
		const struct tr_search_report *r = report_at(v, trial, k);
		if (!r)
			break;
		json_array_append_new(rm, metric_json(r->failed ? NAN : r->metric));
		if (!r->failed) {
			rung = k;
			metric = r->metric;
		}
	}
	return json_pack("{s:i, s:o, s:o, s:s, s:o, s:o, s:o, s:I}", "trial", trial, "job",
			 job ? json_integer(job->id) : json_null(), "parameters", params, "state",
			 job ? trial_state(v, job) : "pending", "rung", rung >= 0 ? json_integer(rung) : json_null(),
			 "metric", metric_json(metric), "rung_metrics", rm, "steps", (json_int_t)(job ? job->step : 0));
}

static json_t *best_json(struct tr_scheduler *s, const struct view *v)
{
	int rung = -1;
	int best = tr_search_best(&v->cfg, &v->st, &rung);
	const struct tr_job_row *job = best >= 0 ? trial_job(v, best) : NULL;
	if (!job)
		return json_null();
	const struct tr_search_report *r = report_at(v, best, rung);
	struct tr_ckpt_row ck = {0};
	json_t *checkpoint = json_null();
	if (tr_store_ckpt_get(s->cfg.store, job->id, -1, &ck, NULL) == 0) {
		char url[128];
		snprintf(url, sizeof url, "/jobs/%lld/checkpoints/%lld/model.safetensors", (long long)job->id,
			 (long long)ck.step);
		checkpoint = json_pack("{s:I, s:I, s:s}", "job", (json_int_t)job->id, "step", (json_int_t)ck.step,
				       "url", url);
	}
	tr_ckpt_row_finish(&ck);
	return json_pack("{s:i, s:I, s:f, s:o}", "trial", best, "job", (json_int_t)job->id, "metric", r->metric,
			 "checkpoint", checkpoint);
}

static json_t *rungs_json(const struct view *v)
{
	json_t *out = json_array();
	int *ranked = calloc((size_t)(v->cfg.max_trials > 0 ? v->cfg.max_trials : 1), sizeof *ranked);
	for (int k = 0; ranked && k < v->search.nrungs; k++) {
		int n = tr_search_rank(&v->cfg, &v->st, k, ranked, v->cfg.max_trials);
		json_t *results = json_array(), *promoted = json_array();
		for (int i = 0; i < n; i++) {
			const struct tr_search_report *r = report_at(v, ranked[i], k);
			json_array_append_new(results, json_pack("{s:i, s:o}", "trial", ranked[i], "metric",
								 metric_json(r->failed ? NAN : r->metric)));
		}
		for (int i = 0; i < v->st.npromotions; i++)
			if (v->promotions[i].rung == k)
				json_array_append_new(promoted, json_integer(v->promotions[i].trial));
		json_array_append_new(out, json_pack("{s:i, s:I, s:o, s:o}", "rung", k, "length",
						     (json_int_t)v->search.rungs[k], "results", results, "promoted",
						     promoted));
	}
	free(ranked);
	return out;
}

static json_t *time_json(double t)
{
	char buf[40];
	if (t <= 0 || !tr_rfc3339_format(t, buf, sizeof buf))
		return json_null();
	return json_string(buf);
}

static json_t *experiment_json(struct tr_scheduler *s, const struct view *v)
{
	json_t *trials = json_array();
	int64_t steps = 0;
	for (int t = 0; t < v->search.max_trials; t++)
		json_array_append_new(trials, trial_json(v, t));
	for (int i = 0; i < v->ntrials; i++)
		steps += v->trials[i].step;
	json_t *error = v->row.error ? json_loads(v->row.error, 0, NULL) : NULL;
	return json_pack("{s:I, s:s, s:s, s:b, s:i, s:b, s:O, s:O, s:O, s:o, s:o, s:o, s:I, s:o, s:o, s:o}", "id",
			 (json_int_t)v->row.id, "name", v->row.name, "state", tr_experiment_state_name(v->row.state),
			 "terminal", tr_experiment_state_terminal(v->row.state), "priority", v->row.priority,
			 "preemptible", v->row.preemptible, "spec", json_object_get(v->request, "spec"), "search",
			 json_object_get(v->request, "search"), "parameters", json_object_get(v->request, "parameters"),
			 "trials", trials, "best", best_json(s, v), "rungs", rungs_json(v), "steps", (json_int_t)steps,
			 "error", error ? error : json_null(), "submitted_at", time_json(v->row.submitted_at),
			 "finished_at", time_json(v->row.finished_at));
}

/* ---- operations --------------------------------------------------------- */

static struct tr_experiments *driver_of(struct tr_scheduler *s)
{
	pthread_mutex_lock(&s->lock);
	struct tr_experiments *x = s->experiments;
	pthread_mutex_unlock(&s->lock);
	return x;
}

static int op_get(void *ctx, int64_t id, json_t **out, struct tr_error *err)
{
	struct tr_scheduler *s = ctx;
	struct view v;
	*out = NULL;
	if (view_load(s, id, &v, err) < 0)
		return -1;
	*out = experiment_json(s, &v);
	view_finish(&v);
	return *out ? 0 : tr_job_fail(err, TR_JOB_E_INTERNAL, "", "out of memory");
}

static int op_list(void *ctx, const char *state, int64_t after, int limit, json_t **out, struct tr_error *err)
{
	struct tr_scheduler *s = ctx;
	struct tr_experiment_row *rows = NULL;
	struct tr_error se = {0};
	int n = 0, k = state ? tr_experiment_state_parse(state) : -1;
	enum tr_experiment_state want = k < 0 ? TR_EXP_QUEUED : (enum tr_experiment_state)k;
	*out = NULL;
	if (tr_store_experiment_list(s->cfg.store, state ? &want : NULL, after, limit, &rows, &n, &se) < 0)
		return store_fail(err, &se);
	json_t *list = json_array();
	for (int i = 0; i < n; i++) {
		json_t *e = NULL;
		if (op_get(ctx, rows[i].id, &e, err) == 0)
			json_array_append_new(list, e);
		tr_experiment_row_finish(&rows[i]);
	}
	free(rows);
	*out = list;
	return 0;
}

static int op_submit(void *ctx, const json_t *body, int priority, bool preemptible, int64_t *id,
		     struct tr_error_list *problems, struct tr_error *err)
{
	struct tr_scheduler *s = ctx;
	struct tr_error se = {0};
	(void)problems;
	json_t *request = tr_exp_request_check(body, err);
	if (!request)
		return -1;
	/* The daemon's own checks (devices, data paths, the data), on trial
	 * 0's spec: a 422 now rather than a failed experiment later. */
	struct tr_exp_search search;
	json_t *params = NULL, *spec = NULL;
	int rc = tr_exp_search_read(request, &search, err);
	if (rc == 0)
		rc = tr_exp_trial(request, &search, 0, &params, &spec, err);
	if (rc == 0 && tr_sched_check_spec(s, spec, err) < 0) {
		/* The pointer is into the spec: make it one into the body. */
		char ptr[sizeof err->pointer + 8];
		snprintf(ptr, sizeof ptr, "/spec%s", err->pointer);
		snprintf(err->pointer, sizeof err->pointer, "%.250s", ptr);
		rc = -1;
	}
	json_decref(params);
	json_decref(spec);
	char *text = rc == 0 ? tr_json_dumps(request, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
	if (rc == 0 && !text)
		rc = tr_job_fail(err, TR_JOB_E_INTERNAL, "", "out of memory");
	if (rc == 0) {
		struct tr_experiment_row row = {.name = (char *)json_string_value(json_object_get(request, "name")),
						.state = TR_EXP_QUEUED,
						.priority = priority,
						.preemptible = preemptible,
						.request = text};
		if (tr_store_experiment_insert(s->cfg.store, &row, &se) < 0)
			rc = tr_job_fail(err, TR_JOB_E_STORAGE, "", "cannot store the experiment: %s", se.message);
		*id = row.id;
	}
	free(text);
	json_decref(request);
	if (rc < 0)
		return -1;
	tr_log(TR_LOG_INF, "experiment %lld submitted", (long long)*id);
	struct tr_experiments *x = driver_of(s);
	if (x)
		kick(x);
	return 0;
}

/* Experiments by state, for GET /metrics. */
static int op_counts(void *ctx, int64_t *counts, struct tr_error *err)
{
	struct tr_scheduler *s = ctx;
	struct tr_error se = {0};

	if (tr_store_experiment_counts(s->cfg.store, counts, &se) < 0)
		return store_fail(err, &se);
	return 0;
}

static int op_control(void *ctx, int64_t id, enum tr_job_request op, struct tr_error *err)
{
	struct tr_scheduler *s = ctx;
	struct tr_experiments *x = driver_of(s);
	struct view v;
	int rc = 0;
	if (!x)
		return tr_job_fail(err, TR_JOB_E_UNSUPPORTED, "", "the daemon is shutting down");
	pthread_mutex_lock(&x->lock);
	if (view_load(s, id, &v, err) < 0) {
		pthread_mutex_unlock(&x->lock);
		return -1;
	}
	if (!tr_experiment_request_legal(v.row.state, op)) {
		rc = tr_job_fail(err, TR_JOB_E_ILLEGAL, "", "experiment %lld is %s; %s", (long long)id,
				 tr_experiment_state_name(v.row.state),
				 op == TR_JOB_RESUME  ? "only a paused experiment can be resumed"
				 : op == TR_JOB_PAUSE ? "only a queued or running experiment can be paused"
						      : "only an experiment that has not ended can be cancelled");
		goto out;
	}
	/* Reports first: a trial that reached its rung just now is waiting
	 * there, not paused by this request. */
	if (sync_reports(s, &v, err) > 0) {
		view_finish(&v);
		if (view_load(s, id, &v, err) < 0) {
			pthread_mutex_unlock(&x->lock);
			return -1;
		}
	}
	enum tr_experiment_state to = op == TR_JOB_PAUSE    ? TR_EXP_PAUSED
				      : op == TR_JOB_CANCEL ? TR_EXP_CANCELLED
							    : (v.ntrials > 0 ? TR_EXP_RUNNING : TR_EXP_QUEUED);
	if (set_state(s, &v, to, op == TR_JOB_CANCEL ? "cancelled" : NULL,
		      op == TR_JOB_CANCEL ? "cancelled by request" : NULL) < 0) {
		rc = tr_job_fail(err, TR_JOB_E_STORAGE, "", "cannot record the experiment's state");
		goto out;
	}
	for (int i = 0; i < v.ntrials; i++) {
		const struct tr_job_row *job = &v.trials[i];
		struct tr_error ce = {0};
		bool act = op == TR_JOB_CANCEL  ? !tr_job_state_terminal(job->state)
			   : op == TR_JOB_PAUSE ? !waiting(&v, job) && !tr_job_state_terminal(job->state) &&
							  job->state != TR_JOB_PAUSED
						: !waiting(&v, job) && job->state == TR_JOB_PAUSED;
		if (act && tr_sched_control(s, job->id, op, &ce) < 0)
			tr_log(TR_LOG_WARN, "experiment %lld: trial %d (job %lld): %s", (long long)id, job->trial,
			       (long long)job->id, ce.message);
	}
out:
	view_finish(&v);
	pthread_mutex_unlock(&x->lock);
	kick(x);
	return rc;
}

void tr_experiments_api_ops(struct tr_api_ops *ops)
{
	ops->experiment_submit = op_submit;
	ops->experiment_get = op_get;
	ops->experiment_list = op_list;
	ops->experiment_control = op_control;
	ops->experiment_counts = op_counts;
}
