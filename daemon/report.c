/* The daemon's side of worker reports (docs/design.md, "Worker reports"):
 * rank 0 of a Slurm job's worker, whose files the daemon may not see (no
 * shared file system), posts its progress, metric points and summary to
 * POST /jobs/{id}/report (api/report.c).  This takes them into the job
 * the runner follows: the live progress (total_steps included), the
 * stored progress, and the summary written into the job's folder as the
 * worker's own summary.json, which the runner reads as the job ends
 * (daemon/worker_job.c).  The first report marks the folder: from then
 * on the file tail reads no metric points, so each point has one source. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "daemon/log.h"
#include "daemon/scheduler_internal.h"
#include "daemon/worker_job.h"

static void folder(const struct running_job *j, char *buf, size_t n)
{
	const char *state_dir = j->sched->cfg.state_dir;
	snprintf(buf, n, "%s/%s/job-%lld", state_dir ? state_dir : ".", j->slurm ? "slurm" : "procs", (long long)j->id);
}

static int not_a_worker_job(int64_t id, struct tr_error *err)
{
	return tr_job_fail(err, TR_JOB_E_ILLEGAL, "",
			   "job %lld is not a worker job running here (Slurm or several processes): "
			   "only their workers report",
			   (long long)id);
}

int tr_report_folder_op(void *ctx, int64_t id, char *dir, size_t n, struct tr_error *err)
{
	struct tr_scheduler *s = ctx;
	pthread_mutex_lock(&s->lock);
	struct running_job *j = s->running;
	while (j && j->id != id)
		j = j->next;
	bool ok = j && (j->slurm || j->procs);
	if (ok)
		folder(j, dir, n);
	pthread_mutex_unlock(&s->lock);
	return ok ? 0 : not_a_worker_job(id, err);
}

int tr_report_op(void *ctx, int64_t id, const struct tr_api_report *r, struct tr_error *err)
{
	struct tr_scheduler *s = ctx;
	char dir[PATH_MAX], path[PATH_MAX + 32];
	pthread_mutex_lock(&s->lock);
	struct running_job *j = s->running;
	while (j && j->id != id)
		j = j->next;
	if (!j || !(j->slurm || j->procs)) {
		pthread_mutex_unlock(&s->lock);
		return not_a_worker_job(id, err);
	}
	struct tr_progress p = j->progress;
	if (r->have_progress) {
		p.step = r->step;
		p.epoch = r->epoch;
		if (r->total_steps > 0)
			p.total_steps = r->total_steps;
		if (!isnan(r->loss))
			p.loss = r->loss;
		j->progress = p;
		j->have_progress = true;
	}
	bool first = !atomic_exchange(&j->reported, true);
	/* A round of the file tail under way appends its points first
	 * (worker_job.c; it takes no scheduler lock meanwhile): the API's
	 * points then replace them by step instead of the other way round.
	 * Bounded: a round reads at most 100000 lines. */
	for (int i = 0; first && atomic_load(&j->tailing) && i < 10000; i++)
		nanosleep(&(struct timespec){.tv_nsec = 1000 * 1000}, NULL);
	folder(j, dir, sizeof dir);
	pthread_mutex_unlock(&s->lock);

	tr_store_t *st = s->cfg.store;
	if (first) {
		snprintf(path, sizeof path, "%s/%s", dir, TR_WJOB_REPORTED_FILE);
		int rc = tr_wjob_write_text(path, "api\n");
		if (rc < 0)
			tr_log(TR_LOG_WARN, "job %lld: cannot write %s (a restarted daemon tails its files again): %s",
			       (long long)id, path, strerror(-rc));
	}
	struct tr_error e = {0};
	if (r->have_progress && tr_store_job_set_progress(st, id, p.step, p.total_steps, p.epoch, p.loss, &e) < 0)
		return tr_job_fail(err, TR_JOB_E_STORAGE, "", "%s", e.message);
	if (r->summary) {
		snprintf(path, sizeof path, "%s/summary.json", dir);
		int rc = tr_wjob_write_text(path, r->summary);
		if (rc < 0)
			return tr_job_fail(err, TR_JOB_E_STORAGE, "", "cannot write %s: %s", path, strerror(-rc));
	}
	return 0;
}
