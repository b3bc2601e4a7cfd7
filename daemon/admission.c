/* Memory admission (docs/design.md, "Memory admission").
 *
 * Every job's trainer forms its host memory estimate once its data is
 * open and before it allocates its replicas and ring (engine/memory.h),
 * and asks here.  The memory there is for it: with an override
 * (memory-available), that figure less every other running job's
 * estimate; else MemAvailable, plus the job's own data (already read in,
 * so already out of MemAvailable), less the estimates of the jobs that
 * were admitted but have not made a step yet (what they will still
 * allocate; the others' memory is out of MemAvailable already).  A job
 * that would fit once the others end goes back to the queue, first in
 * line, with its reason in the info field queued_reason, and is tried
 * again when a job ends (or after MEM_RETRY_S, as MemAvailable moves
 * with the rest of the machine); one that cannot fit even alone fails
 * with insufficient_memory and both figures.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "daemon/log.h"
#include "daemon/scheduler_internal.h"

#define MEM_RETRY_S 30.0

static double mono_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double mib(uint64_t b)
{
	return (double)b / 1048576.0;
}

static void set_queued_reason(struct running_job *j, const char *reason)
{
	/* A null value deletes the key (the store merges with json_patch). */
	json_t *o = json_object();
	char *text = NULL;
	if (o && json_object_set_new(o, "queued_reason", reason ? json_string(reason) : json_null()) == 0)
		text = json_dumps(o, JSON_COMPACT);
	if (text)
		tr_store_job_info_merge(j->sched->cfg.store, j->id, text, TR_INFO_MAX_FIELDS + TR_INFO_ENGINE_FIELDS,
					NULL);
	free(text);
	json_decref(o);
}

int tr_admit_memory(void *ctx, const struct tr_mem_estimate *e, struct tr_error *err)
{
	struct running_job *j = ctx;
	struct tr_scheduler *s = j->sched;
	int source;
	uint64_t avail = tr_mem_available(&source);
	bool overridden = source == TR_MEM_OVERRIDE;
	uint64_t pending = 0, settled = 0;
	int others = 0;
	char what[256];
	tr_mem_describe(e, what, sizeof what);
	pthread_mutex_lock(&s->lock);
	for (struct running_job *r = s->running; r; r = r->next) {
		if (r == j || r->finished || !r->mem_estimate)
			continue;
		others++;
		if (r->mem_settled)
			settled += r->mem_estimate;
		else
			pending += r->mem_estimate;
	}
	/* now: what this job may take at once; alone: with no other job.  A
	 * job admitted without a step yet has allocated part of its estimate
	 * (out of MemAvailable already) and will take the rest: counting all
	 * of it back errs towards waiting, and a job that waits is judged
	 * again, alone, once the others end. */
	uint64_t base = overridden ? avail : avail + e->data;
	uint64_t held = overridden ? pending + settled : pending;
	uint64_t now = base > held ? base - held : 0;
	uint64_t alone = overridden ? avail : base + settled + pending;
	int rc = 0;
	if (e->total <= now) {
		j->mem_estimate = e->total;
	} else if (e->total > alone) {
		tr_error_set(err, 0, 0, NULL,
			     "this job needs an estimated %s of memory, more than the %.0f MiB there is for jobs (%s) "
			     "even with no other job running",
			     what, mib(alone), tr_mem_source_name(source));
		rc = -ENOMEM;
	} else {
		tr_error_set(err, 0, 0, NULL,
			     "waiting for memory: this job needs an estimated %s, %.0f MiB is free for it now (%s) "
			     "while %d other job%s run%s, %.0f MiB once they end",
			     what, mib(now), tr_mem_source_name(source), others, others == 1 ? "" : "s",
			     others == 1 ? "s" : "", mib(alone));
		rc = -EBUSY;
	}
	pthread_mutex_unlock(&s->lock);
	if (rc == 0)
		set_queued_reason(j, NULL);
	return rc;
}

void tr_memory_admitted(struct running_job *j)
{
	pthread_mutex_lock(&j->sched->lock);
	j->mem_settled = true;
	pthread_mutex_unlock(&j->sched->lock);
}

void tr_wait_for_memory(struct running_job *j, const char *reason)
{
	struct tr_scheduler *s = j->sched;
	pthread_mutex_lock(&s->lock);
	s->mem_wait_id = j->id;
	s->mem_wait_ended = s->ended;
	s->mem_wait_since = mono_s();
	pthread_mutex_unlock(&s->lock);
	/* The state first, then its reason: a reader never sees a running
	 * job with a queued_reason (briefly a queued one without it). */
	tr_store_job_record_state(s->cfg.store, j->id, TR_JOB_QUEUED, NULL, "[]", NULL);
	set_queued_reason(j, reason);
	tr_store_log_append(s->cfg.store, j->id, TR_LOG_NOTICE, reason, NULL);
	tr_log_job(TR_LOG_INF, (long long)j->id, "%s", reason);
	pthread_mutex_lock(&s->lock);
	j->finished = true; /* the dispatcher joins the thread and frees the devices */
	j->trainer = NULL;
	s->dirty = true;
	pthread_cond_broadcast(&s->wake);
	pthread_mutex_unlock(&s->lock);
}

bool tr_memory_blocks(struct tr_scheduler *s, int64_t id)
{
	if (s->mem_wait_id != id)
		return false;
	if (s->ended != s->mem_wait_ended || mono_s() - s->mem_wait_since >= MEM_RETRY_S) {
		s->mem_wait_id = 0;
		return false;
	}
	return true;
}
