/* Priority preemption on one daemon (docs/design.md, "Preemption").
 *
 * Jobs start in strict queue order (scheduler.h): the first queued job
 * waits until its devices are free.  When lower-priority jobs submitted
 * with preemptible=true hold them, that job preempts the fewest of them
 * whose devices let it start.  A preempted job stops at its next step
 * boundary with a checkpoint (the pause machinery, stop reason
 * "preempt"), goes back to the queue as "preempted", and resumes on its
 * own from that checkpoint when devices free up: bit-identically, since
 * resume is exact.  One that does not reach a step boundary within the
 * policy's grace time is cancelled ("hard"): the step in progress is
 * lost, and it resumes from its newest earlier checkpoint (or from step
 * 0 without one), still exactly.  A job that has run less than the
 * policy's minimum since it last started is not preempted, so two jobs
 * cannot take turns forever.
 *
 * Everything here runs with the scheduler lock held, in the dispatcher,
 * except tr_preempt_record (the job's runner, as it ends).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/prometheus.h"
#include "core/rfc3339.h"
#include "daemon/log.h"
#include "daemon/scheduler_internal.h"

double tr_sched_mono_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Whether j's devices are on their way back: it ends, or lets go. */
static bool letting_go(const struct running_job *j)
{
	return j->finished || atomic_load(&j->preempt_requested) || atomic_load(&j->stop_requested) ||
	       atomic_load(&j->cancel_requested);
}

/* Whether the queued job (priority prio) may preempt j now.  A Slurm
 * job holds no devices here: Slurm preempts it (daemon/slurm_preempt.c). */
static bool may_preempt(const struct tr_scheduler *s, const struct running_job *j, int prio, double now)
{
	return j->preemptible && !j->eval && !j->slurm && j->priority < prio && !letting_go(j) &&
	       now - j->started_at >= s->cfg.preemption.min_run_s;
}

/* The fewest candidates first: most devices, then lowest priority, then
 * the most recently started (it loses the least work). */
static int by_preference(const void *pa, const void *pb)
{
	const struct running_job *a = *(struct running_job *const *)pa, *b = *(struct running_job *const *)pb;
	if (a->ndev != b->ndev)
		return a->ndev > b->ndev ? -1 : 1;
	if (a->priority != b->priority)
		return a->priority < b->priority ? -1 : 1;
	return a->started_at > b->started_at ? -1 : a->started_at < b->started_at ? 1 : 0;
}

static void ask(struct tr_scheduler *s, struct running_job *j, const struct tr_job_row *r, double now)
{
	j->preempted_by = r->id;
	j->by_priority = r->priority;
	j->asked_at = now;
	atomic_store(&j->preempt_requested, true);
	atomic_store(&j->stop_requested, true);
	if (j->trainer)
		tr_trainer_stop_for(j->trainer, TR_STOP_PREEMPT);
	char line[256];
	snprintf(line, sizeof line,
		 "preempted by job %lld (priority %d > %d): checkpointing at the next step boundary (grace %d s)",
		 (long long)r->id, r->priority, j->priority, s->cfg.preemption.grace_s);
	tr_store_log_append(s->cfg.store, j->id, TR_LOG_NOTICE, line, NULL);
	snprintf(line, sizeof line, "preempting job %lld (priority %d) for its %d device(s)", (long long)j->id,
		 j->priority, j->ndev);
	tr_store_log_append(s->cfg.store, r->id, TR_LOG_NOTICE, line, NULL);
	tr_log_job(TR_LOG_NOTICE, (long long)j->id, "preempted by job %lld (priority %d > %d)", (long long)r->id,
		   r->priority, j->priority);
}

void tr_preempt_for(struct tr_scheduler *s, const struct tr_job_row *r, const struct tr_spec *spec)
{
	if (!s->cfg.preemption.enabled)
		return;
	double now = tr_sched_mono_now();
	struct running_job *cand[TR_MAX_POOL_DEVICES];
	int ncand = 0;
	if (spec->n_device_ids > 0) {
		/* Named devices: every job holding one of them must go. */
		for (int i = 0; i < spec->n_device_ids; i++) {
			int d = spec->device_ids[i];
			if (d < 0 || d >= s->ndev || !s->owner[d])
				continue;
			struct running_job *j = s->running;
			while (j && j->id != s->owner[d])
				j = j->next;
			if (!j)
				return; /* ended, not reaped yet: its devices come back */
			if (letting_go(j))
				continue;
			if (!may_preempt(s, j, r->priority, now))
				return;
			bool listed = false;
			for (int k = 0; k < ncand; k++)
				listed |= cand[k] == j;
			if (!listed)
				cand[ncand++] = j;
		}
	} else {
		int want = tr_sched_wanted_devices(s, spec), coming = 0;
		for (int d = 0; d < s->ndev; d++)
			coming += !s->owner[d];
		for (struct running_job *j = s->running; j; j = j->next) {
			if (letting_go(j))
				coming += j->ndev;
			else if (may_preempt(s, j, r->priority, now) && ncand < TR_MAX_POOL_DEVICES)
				cand[ncand++] = j;
		}
		int need = want - coming;
		if (need <= 0)
			return; /* enough devices are on their way */
		qsort(cand, (size_t)ncand, sizeof cand[0], by_preference);
		int freed = 0, take = 0;
		while (take < ncand && freed < need)
			freed += cand[take++]->ndev;
		if (freed < need)
			return; /* preempting would not let it start: nobody is */
		ncand = take;
	}
	for (int k = 0; k < ncand; k++)
		ask(s, cand[k], r, now);
}

void tr_preempt_enforce_grace(struct tr_scheduler *s)
{
	double now = tr_sched_mono_now();
	for (struct running_job *j = s->running; j; j = j->next) {
		if (j->finished || !atomic_load(&j->preempt_requested) || atomic_load(&j->preempt_hard) ||
		    now - j->asked_at < s->cfg.preemption.grace_s)
			continue;
		atomic_store(&j->preempt_hard, true);
		if (j->trainer)
			tr_trainer_cancel(j->trainer);
		char line[200];
		snprintf(line, sizeof line,
			 "no step boundary within the %d s grace: cancelled; it resumes from its newest checkpoint",
			 s->cfg.preemption.grace_s);
		tr_store_log_append(s->cfg.store, j->id, TR_LOG_WARN, line, NULL);
		tr_log_job(TR_LOG_NOTICE, (long long)j->id,
			   "preemption grace expired: cancelled back to its checkpoint");
	}
}

int tr_preempt_resize(struct tr_scheduler *s, const struct tr_job_row *r, const struct tr_spec *spec, int *devs)
{
	/* A multi-process job's ranks take a fixed share each. */
	if (r->state != TR_JOB_PREEMPTED || spec->exact_shards <= 0 || spec->n_device_ids > 0 || spec->processes > 1)
		return 0;
	int got = 0;
	for (int d = 0; d < s->ndev; d++)
		if (!s->owner[d])
			devs[got++] = d;
	for (int i = 0; i < got; i++)
		s->owner[devs[i]] = r->id;
	return got;
}

void tr_preempt_record(struct running_job *j, int64_t step)
{
	struct tr_scheduler *s = j->sched;
	bool hard = atomic_load(&j->preempt_hard);
	char at[40] = "";
	tr_rfc3339_format((double)time(NULL), at, sizeof at);
	pthread_mutex_lock(&s->lock);
	int64_t by = j->preempted_by;
	int by_priority = j->by_priority, priority = j->priority;
	pthread_mutex_unlock(&s->lock);
	char message[256];
	if (hard)
		snprintf(message, sizeof message,
			 "preempted by job %lld (priority %d > %d); no step boundary within the grace time, so it was "
			 "cancelled at step %lld and resumes from its newest checkpoint",
			 (long long)by, by_priority, priority, (long long)step);
	else
		snprintf(message, sizeof message,
			 "preempted by job %lld (priority %d > %d) after step %lld, with a checkpoint; it resumes when "
			 "devices free up",
			 (long long)by, by_priority, priority, (long long)step);
	json_t *o = json_pack("{s:I, s:i, s:i, s:s, s:I, s:s, s:s}", "by", (json_int_t)by, "by_priority", by_priority,
			      "priority", priority, "at", at, "step", (json_int_t)step, "mode",
			      hard ? "hard" : "checkpoint", "message", message);
	char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	struct tr_error e = {0};
	if (text && tr_store_job_set_preemption(s->cfg.store, j->id, text, &e) < 0)
		tr_log(TR_LOG_WARN, "job %lld: its preemption record is not stored: %s", (long long)j->id, e.message);
	free(text);
	tr_store_log_append(s->cfg.store, j->id, TR_LOG_NOTICE, message, NULL);
	tr_prom_preemption(hard);
}
