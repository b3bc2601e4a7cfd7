/* Scheduler core: device pool, dispatcher thread, recovery and shutdown
 * (see scheduler.h).  The scheduler lock guards the device owners, the
 * running list and every queued->running transition, so an API control
 * request never races with a job being started. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "daemon/log.h"
#include "daemon/scheduler_internal.h"
#include "engine/data/reader.h"

void tr_sched_kick(struct tr_scheduler *s)
{
	pthread_mutex_lock(&s->lock);
	s->dirty = true;
	pthread_cond_broadcast(&s->wake);
	pthread_mutex_unlock(&s->lock);
}

int tr_scheduler_create(const struct tr_scheduler_config *cfg, tr_scheduler_t **out, struct tr_error *err)
{
	struct tr_scheduler *s = calloc(1, sizeof *s);
	if (!s)
		return tr_error_set(err, -ENOMEM, 0, NULL, "out of memory");
	s->cfg = *cfg;
	const char *stall = getenv("TRAINERD_TEST_STALL_FILE");
	if (stall && *stall)
		s->stall_file = strdup(stall);
	pthread_mutex_init(&s->lock, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&s->wake, &ca);
	pthread_condattr_destroy(&ca);
	s->checkpointer = tr_checkpointer_create(cfg->store);
	if (!s->checkpointer) {
		tr_scheduler_destroy(s);
		return tr_error_set(err, -ENOMEM, 0, NULL, "cannot start the checkpoint writer");
	}
	s->ndev = cfg->backend->i->device_count(cfg->backend);
	if (s->ndev > TR_MAX_POOL_DEVICES)
		s->ndev = TR_MAX_POOL_DEVICES;
	char cwd[PATH_MAX];
	const char *here[] = {getcwd(cwd, sizeof cwd) ? cwd : "/", NULL};
	const char *const *dirs = cfg->data_roots && cfg->data_roots[0] ? cfg->data_roots : here;
	/* The datasets directory is one more root, the last: "dataset:" paths
	 * are mapped to files beneath it (daemon/paths.c), and the readers open
	 * them again when the job starts. */
	const char *with[TR_MAX_ROOTS + 2];
	if (cfg->datasets_dir) {
		size_t n = 0;
		while (dirs[n] && n < TR_MAX_ROOTS)
			with[n] = dirs[n], n++;
		with[n++] = cfg->datasets_dir;
		with[n] = NULL;
		dirs = with;
	}
	struct tr_error msg;
	if (tr_data_roots_create(dirs, &s->roots, &msg) < 0) {
		tr_scheduler_destroy(s);
		return tr_error_set(err, -EINVAL, 0, NULL, "--data-root %s", msg.message);
	}
	*out = s;
	return 0;
}

void tr_sched_keep_spec(struct tr_scheduler *s, int64_t id, struct tr_spec *spec, bool paths_resolved)
{
	struct kept_spec *k = calloc(1, sizeof *k);
	if (!k) {
		/* The job's spec is parsed from the store when it starts. */
		tr_spec_finish(spec);
		memset(spec, 0, sizeof *spec);
		return;
	}
	k->id = id;
	k->spec = *spec;
	k->paths_resolved = paths_resolved;
	memset(spec, 0, sizeof *spec);
	k->next = s->kept;
	s->kept = k;
}

bool tr_sched_take_spec(struct tr_scheduler *s, int64_t id, struct tr_spec *spec, bool *paths_resolved)
{
	for (struct kept_spec **pp = &s->kept; *pp; pp = &(*pp)->next) {
		struct kept_spec *k = *pp;
		if (k->id != id)
			continue;
		*spec = k->spec;
		*paths_resolved = k->paths_resolved;
		*pp = k->next;
		free(k);
		return true;
	}
	return false;
}

void tr_sched_drop_spec(struct tr_scheduler *s, int64_t id)
{
	struct tr_spec spec;
	bool resolved;
	if (tr_sched_take_spec(s, id, &spec, &resolved))
		tr_spec_finish(&spec);
}

/* How many devices a spec asks for, and which when it names them. */
bool tr_sched_runs_on_slurm(const struct tr_scheduler *s, const struct tr_spec *spec)
{
	return spec->resources.allocator == TR_ALLOC_SLURM ||
	       (spec->resources.allocator == TR_ALLOC_DEFAULT && s->cfg.allocator_slurm);
}

int tr_sched_wanted_devices(const struct tr_scheduler *s, const struct tr_spec *spec)
{
	/* A job of several processes holds every rank's devices, so that
	 * the pool is not overcommitted: processes x devices (a count; 1
	 * when not given, docs/design.md "Multi-process jobs"). */
	if (spec->processes > 1)
		return spec->processes * (spec->device_count > 0 ? spec->device_count : 1);
	if (spec->n_device_ids > 0)
		return spec->n_device_ids;
	return spec->device_count > 0 ? spec->device_count : s->ndev;
}

/* Reserves devices for `spec` when free; returns the count or 0. */
static int reserve(struct tr_scheduler *s, const struct tr_spec *spec, int64_t id, int *devs)
{
	int want = tr_sched_wanted_devices(s, spec);
	if (spec->n_device_ids > 0) {
		for (int i = 0; i < spec->n_device_ids; i++)
			if (spec->device_ids[i] >= s->ndev || s->owner[spec->device_ids[i]])
				return 0;
		for (int i = 0; i < spec->n_device_ids; i++)
			devs[i] = spec->device_ids[i];
	} else {
		int got = 0;
		for (int d = 0; d < s->ndev && got < want; d++)
			if (!s->owner[d])
				devs[got++] = d;
		if (got < want)
			return 0;
	}
	for (int i = 0; i < want; i++)
		s->owner[devs[i]] = id;
	return want;
}

static void fail_job(struct tr_scheduler *s, int64_t id, const char *code, const char *message)
{
	json_t *e = json_pack("{s:s, s:s, s:I}", "code", code, "message", message, "step", (json_int_t)0);
	char *text = json_dumps(e, JSON_COMPACT);
	tr_store_job_set_state(s->cfg.store, id, TR_JOB_FAILED, text, NULL, NULL);
	tr_store_log_append(s->cfg.store, id, TR_LOG_ERR, message, NULL);
	tr_log_job(TR_LOG_WARN, (long long)id, "failed: %s", message);
	free(text);
	json_decref(e);
}

/* A job that cannot start now gives its parsed spec back: a training spec
 * is kept for the next look, an evaluate job's description is freed (it is
 * read again from its short text).  Lock held. */
static void release_spec(struct tr_scheduler *s, int64_t id, struct running_job *job)
{
	if (job->eval) {
		json_decref(job->eval);
		job->eval = NULL;
		tr_spec_finish(&job->spec);
		return;
	}
	tr_sched_keep_spec(s, id, &job->spec, job->paths_resolved);
}

static bool has_runner(const struct tr_scheduler *s, int64_t id)
{
	for (const struct running_job *j = s->running; j; j = j->next)
		if (j->id == id && !j->finished)
			return true;
	return false;
}

/* Starts queued jobs in order until the first that does not fit.  Called
 * with the lock held. */
static void start_queued(struct tr_scheduler *s)
{
	/* Preempted jobs wait in the same queue, in priority order. */
	static const enum tr_job_state queued[] = {TR_JOB_QUEUED, TR_JOB_PREEMPTED};
	struct tr_job_row *rows = NULL;
	int n = 0;
	struct tr_error se = {0};
	if (tr_store_job_list_states(s->cfg.store, queued, 2, &rows, &n, &se) < 0) {
		tr_log(TR_LOG_ERR, "cannot read the queue: %s", se.message);
		return;
	}
	bool blocked = false;
	for (int i = 0; i < n && !blocked; i++) {
		struct tr_job_row *r = &rows[i];
		/* A Slurm job that Slurm holds after a requeue is preempted but
		 * still has its runner (daemon/slurm_runner.c): it needs no
		 * start here, and holds up nobody. */
		if (r->state == TR_JOB_PREEMPTED && has_runner(s, r->id))
			continue;
		struct running_job *job = calloc(1, sizeof *job);
		struct tr_error serr;
		if (!job)
			break;
		/* A training spec is parsed once at submit; the stored text
		 * only after a restart or a resume that changed the job's end.
		 * An evaluate job's small spec is read from its text. */
		if (tr_eval_spec_is(r->normalized) ? tr_eval_prepare(job, r->normalized, &serr) < 0
						   : !tr_sched_take_spec(s, r->id, &job->spec, &job->paths_resolved) &&
							     tr_spec_parse_text(r->normalized, &job->spec, &serr) < 0) {
			fail_job(s, r->id, "invalid_spec", serr.message);
			free(job);
			continue;
		}
		/* A Slurm job's devices are the cluster's: it holds none here
		 * and never waits for them. */
		job->slurm = !job->eval && tr_sched_runs_on_slurm(s, &job->spec);
		job->procs = !job->eval && !job->slurm && job->spec.processes > 1;
		bool mem_blocked = !job->slurm && tr_memory_blocks(s, r->id);
		job->ndev = job->slurm || mem_blocked ? 0 : reserve(s, &job->spec, r->id, job->devices);
		if (job->ndev == 0 && !job->slurm && !mem_blocked)
			job->ndev = tr_preempt_resize(s, r, &job->spec, job->devices);
		if (job->ndev == 0 && !job->slurm) {
			/* Strict order: nothing overtakes the first job that
			 * waits, but it may preempt lower-priority jobs that
			 * hold its devices.  Its spec is kept for the next look. */
			if (!mem_blocked)
				tr_preempt_for(s, r, &job->spec);
			release_spec(s, r->id, job);
			free(job);
			blocked = true;
			break;
		}
		job->sched = s;
		job->id = r->id;
		job->priority = r->priority;
		job->preemptible = r->preemptible;
		job->started_at = tr_sched_mono_now();
		if (r->state == TR_JOB_PREEMPTED)
			tr_log_job(TR_LOG_NOTICE, (long long)r->id, "resumes after its preemption on %d device(s)",
				   job->ndev);
		json_t *devs = json_array();
		for (int d = 0; d < job->ndev; d++)
			json_array_append_new(devs, json_integer(job->devices[d]));
		char *devs_text = json_dumps(devs, JSON_COMPACT);
		json_decref(devs);
		struct tr_error err = {0};
		int rc = tr_store_job_set_state(s->cfg.store, r->id, TR_JOB_RUNNING, NULL, devs_text, &se);
		free(devs_text);
		if (rc < 0 && rc != -ENOENT && rc != -EINVAL) {
			/* Storage refuses the start (full, read-only): the job
			 * stays queued, first in line, and starts once storage
			 * works (the dispatcher looks again every second). */
			tr_log(TR_LOG_DBG, "job %lld cannot start yet: %s", (long long)r->id, se.message);
			for (int d = 0; d < job->ndev; d++)
				s->owner[job->devices[d]] = 0;
			release_spec(s, r->id, job);
			free(job);
			blocked = true;
			break;
		}
		if (rc == 0)
			rc = job->eval    ? tr_eval_runner_start(job, &err)
			     : job->slurm ? tr_slurm_runner_start(job, &err)
			     : job->procs ? tr_procs_runner_start(job, &err)
					  : tr_runner_start(job, &err);
		else
			tr_error_set(&err, rc, 0, NULL, "store: %s", se.message);
		if (rc < 0) {
			for (int d = 0; d < job->ndev; d++)
				s->owner[job->devices[d]] = 0;
			fail_job(s, r->id, "start_failed", err.message);
			tr_spec_finish(&job->spec);
			json_decref(job->eval);
			free(job);
			continue;
		}
		job->next = s->running;
		s->running = job;
	}
	for (int i = 0; i < n; i++)
		tr_job_row_finish(&rows[i]);
	free(rows);
}

/* Joins runners that have finished and frees their devices.  Lock held. */
static void reap(struct tr_scheduler *s)
{
	struct running_job **pp = &s->running;
	while (*pp) {
		struct running_job *j = *pp;
		if (!j->finished) {
			pp = &j->next;
			continue;
		}
		*pp = j->next;
		pthread_mutex_unlock(&s->lock);
		pthread_join(j->thread, NULL);
		pthread_mutex_lock(&s->lock);
		for (int d = 0; d < j->ndev; d++)
			s->owner[j->devices[d]] = 0;
		tr_spec_finish(&j->spec);
		json_decref(j->eval);
		free(j);
		s->dirty = true;
	}
}

static long long mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The test hook (scheduler_internal.h): stands still, without checking in
 * and without the lock, until the file goes or shutdown begins.  Lock
 * held on entry and exit. */
static void stall_if_asked(struct tr_scheduler *s)
{
	struct stat st;
	if (!s->stall_file || stat(s->stall_file, &st) < 0)
		return;
	tr_log(TR_LOG_WARN, "test hook: the dispatcher stalls while %s exists", s->stall_file);
	while (!s->shutting_down && stat(s->stall_file, &st) == 0) {
		pthread_mutex_unlock(&s->lock);
		usleep(50 * 1000);
		pthread_mutex_lock(&s->lock);
	}
}

static void *dispatcher_main(void *arg)
{
	struct tr_scheduler *s = arg;
	pthread_setname_np(pthread_self(), "tr-dispatch");
	pthread_mutex_lock(&s->lock);
	while (!s->shutting_down) {
		atomic_store(&s->beat_ns, mono_ns());
		stall_if_asked(s);
		reap(s);
		tr_preempt_enforce_grace(s);
		if (s->dirty && !s->shutting_down) {
			s->dirty = false;
			start_queued(s);
		}
		if (s->dirty || s->shutting_down)
			continue;
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_sec += 1; /* also a safety net against a missed wake-up */
		pthread_cond_timedwait(&s->wake, &s->lock, &ts);
		s->dirty = true;
	}
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

/* Counts one more daemon death at job `r` (start-up, before the queue
 * runs); true when that makes max-job-crashes and the job is failed. */
static bool crashed_too_often(struct tr_scheduler *s, const struct tr_job_row *r)
{
	int crashes = r->crashes + 1;
	int max = s->cfg.max_job_crashes;
	if (max <= 0 || crashes < max) {
		tr_store_job_set_crashes(s->cfg.store, r->id, crashes, NULL);
		return false;
	}
	char msg[300];
	snprintf(msg, sizeof msg,
		 "the daemon died %d times in a row while this job was running, without the job making a step in "
		 "between (max-job-crashes is %d); it is not queued again",
		 crashes, max);
	json_t *e = json_pack("{s:s, s:s, s:I}", "code", "crashed_daemon", "message", msg, "step", (json_int_t)r->step);
	char *text = json_dumps(e, JSON_COMPACT);
	tr_store_job_set_crashes(s->cfg.store, r->id, crashes, NULL);
	tr_store_job_record_state(s->cfg.store, r->id, TR_JOB_FAILED, text, "[]", NULL);
	tr_store_log_append(s->cfg.store, r->id, TR_LOG_ERR, msg, NULL);
	tr_log_job(TR_LOG_WARN, (long long)r->id, "failed: %s", msg);
	free(text);
	json_decref(e);
	return true;
}

int tr_scheduler_start(tr_scheduler_t *s, struct tr_error *err)
{
	/* Jobs a previous run left running died with it (crash, kill -9) or
	 * were interrupted by a shutdown: they go back to the queue and resume
	 * from their newest valid checkpoint when they start again. */
	static const enum tr_job_state stale[] = {TR_JOB_RUNNING, TR_JOB_STOPPING, TR_JOB_INTERRUPTED};
	struct tr_job_row *rows = NULL;
	int n = 0;
	struct tr_error se = {0};
	int rc = tr_store_job_list_states(s->cfg.store, stale, 3, &rows, &n, &se);
	if (rc < 0)
		return tr_error_set(err, rc, 0, NULL, "store: %s", se.message);
	for (int i = 0; i < n; i++) {
		int64_t id = rows[i].id;
		/* Held when storage refuses them (and shown): the job then
		 * waits in the queue until its start can be written. */
		if (rows[i].state != TR_JOB_INTERRUPTED)
			tr_store_job_record_state(s->cfg.store, id, TR_JOB_INTERRUPTED, NULL, NULL, NULL);
		/* Still running or stopping: the daemon died under it (a clean
		 * shutdown records interrupted).  A job that takes the daemon
		 * down with it (a decoder bomb, memory beyond the machine's)
		 * would do so at every restart, forever under
		 * Restart=on-failure: count the deaths, and fail it once they
		 * reach max-job-crashes without a step in between. */
		if (rows[i].state != TR_JOB_INTERRUPTED && crashed_too_often(s, &rows[i])) {
			tr_job_row_finish(&rows[i]);
			continue;
		}
		tr_store_job_record_state(s->cfg.store, id, TR_JOB_QUEUED, NULL, "[]", NULL);
		tr_store_log_append(s->cfg.store, id, TR_LOG_NOTICE,
				    "queued again after the daemon restarted; it resumes from its newest valid "
				    "checkpoint",
				    NULL);
		tr_log_job(TR_LOG_NOTICE, (long long)id, "was interrupted; queued again");
		tr_job_row_finish(&rows[i]);
	}
	free(rows);
	s->dirty = true;
	atomic_store(&s->beat_ns, mono_ns());
	if (pthread_create(&s->dispatcher, NULL, dispatcher_main, s) != 0)
		return tr_error_set(err, -EAGAIN, 0, NULL, "cannot start the dispatcher thread");
	s->started = true;
	atomic_store(&s->ready, true);
	return 0;
}

static double mono_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

void tr_scheduler_shutdown(tr_scheduler_t *s, int grace_s)
{
	atomic_store(&s->ready, false);
	pthread_mutex_lock(&s->lock);
	s->shutting_down = true;
	pthread_cond_broadcast(&s->wake);
	for (struct running_job *j = s->running; j; j = j->next) {
		atomic_store(&j->stop_requested, true);
		if (j->trainer)
			tr_trainer_stop_for(j->trainer, TR_STOP_SHUTDOWN);
	}
	pthread_mutex_unlock(&s->lock);
	if (s->started)
		pthread_join(s->dispatcher, NULL);
	s->started = false;

	/* Give runners the grace period to reach a step boundary, then cancel
	 * whatever still runs (a slow loader, a long step). */
	double deadline = mono_now() + grace_s;
	bool cancelled = false;
	pthread_mutex_lock(&s->lock);
	for (;;) {
		bool any = false;
		for (struct running_job *j = s->running; j; j = j->next)
			any |= !j->finished;
		if (!any)
			break;
		if (!cancelled && mono_now() >= deadline) {
			for (struct running_job *j = s->running; j; j = j->next) {
				atomic_store(&j->cancel_requested, true);
				if (j->trainer)
					tr_trainer_cancel(j->trainer);
			}
			cancelled = true;
		}
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_nsec += 50 * 1000 * 1000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&s->wake, &s->lock, &ts);
	}
	reap(s);
	pthread_mutex_unlock(&s->lock);
}

void tr_scheduler_destroy(tr_scheduler_t *s)
{
	if (!s)
		return;
	if (s->started || s->running)
		tr_scheduler_shutdown(s, 1);
	while (s->kept)
		tr_sched_drop_spec(s, s->kept->id);
	tr_checkpointer_destroy(s->checkpointer);
	tr_data_roots_destroy(s->roots);
	pthread_cond_destroy(&s->wake);
	pthread_mutex_destroy(&s->lock);
	free(s->stall_file);
	free(s);
}

void tr_scheduler_counts(tr_scheduler_t *s, int *running, int *queued)
{
	static const enum tr_job_state states[] = {TR_JOB_QUEUED, TR_JOB_PREEMPTED};
	struct tr_job_row *rows = NULL;
	int n = 0;
	*running = 0;
	pthread_mutex_lock(&s->lock);
	for (struct running_job *j = s->running; j; j = j->next)
		*running += !j->finished;
	pthread_mutex_unlock(&s->lock);
	if (tr_store_job_list_states(s->cfg.store, states, 2, &rows, &n, NULL) < 0)
		n = 0;
	/* A Slurm job that Slurm holds after a requeue is preempted, but its
	 * runner counts it as running already. */
	*queued = n;
	pthread_mutex_lock(&s->lock);
	for (int i = 0; i < n; i++)
		*queued -= rows[i].state == TR_JOB_PREEMPTED && has_runner(s, rows[i].id);
	pthread_mutex_unlock(&s->lock);
	for (int i = 0; i < n; i++)
		tr_job_row_finish(&rows[i]);
	free(rows);
}

double tr_scheduler_last_beat(tr_scheduler_t *s)
{
	return (double)atomic_load(&s->beat_ns) * 1e-9;
}
