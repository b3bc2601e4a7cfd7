/* Job runner: one thread per running job.  It builds the trainer, forwards
 * its metrics, progress and log lines to the store, and records how the
 * job ended: completed (ran to its end), stopped (by request, before its
 * end), paused, failed (with code, message and step), cancelled, or
 * interrupted when the daemon is shutting down. */
#include <errno.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/log.h"
#include "daemon/scheduler_internal.h"
#include "storage/checkpoints.h"

static double mono_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void on_metric(void *ctx, const struct tr_metric_point *p)
{
	struct running_job *j = ctx;
	tr_store_metric_append(j->sched->cfg.store, j->id, p->name, p->step, p->epoch, p->wall, p->value, NULL);
}

static void on_progress(void *ctx, const struct tr_progress *p)
{
	struct running_job *j = ctx;
	struct tr_scheduler *s = j->sched;
	/* A step made: deaths of the daemon before it were not this job's
	 * doing, or not every time (max-job-crashes counts them in a row).
	 * Written before the step is shown, so that a client that sees a
	 * step of this run and kills the daemon finds the count cleared. */
	if (!j->crashes_cleared) {
		j->crashes_cleared = true;
		tr_store_job_set_crashes(s->cfg.store, j->id, 0, NULL);
		tr_memory_admitted(j); /* its memory is allocated now */
	}
	pthread_mutex_lock(&s->lock);
	j->progress = *p;
	j->have_progress = true;
	pthread_mutex_unlock(&s->lock);
	/* An experiment's trial at its rung: paused as POST /jobs/{id}/pause
	 * would, after this step (the trainer checks the flag before the
	 * next one, after this step's evaluation), with its checkpoint. */
	if (j->pause_at > 0 && !j->pause_at_asked && p->step < p->total_steps) {
		int64_t at = j->pause_at;
		if (j->spec.max_steps == 0 && p->epochs > 0) /* epochs: each epoch has the same steps */
			at = p->total_steps / p->epochs * j->pause_at;
		if (p->step >= at) {
			j->pause_at_asked = true;
			char line[128];
			snprintf(line, sizeof line, "experiment rung reached at step %lld: pausing",
				 (long long)p->step);
			tr_store_log_append(s->cfg.store, j->id, TR_LOG_NOTICE, line, NULL);
			pthread_mutex_lock(&s->lock);
			atomic_store(&j->pause_requested, true);
			atomic_store(&j->stop_requested, true);
			pthread_mutex_unlock(&s->lock);
			tr_trainer_stop_for(j->trainer_for_hooks, TR_STOP_PAUSE);
		}
	}
	/* The row is for listings and restarts; the live view comes from
	 * memory, so once a second is plenty and keeps SQLite off the step. */
	double now = mono_now();
	if (now - j->last_store_progress >= 1.0 || p->step == p->total_steps) {
		j->last_store_progress = now;
		tr_store_job_set_progress(s->cfg.store, j->id, p->step, p->total_steps, p->epoch, p->loss, NULL);
	}
}

static void on_log(void *ctx, enum tr_log_level level, const char *msg)
{
	struct running_job *j = ctx;
	tr_store_log_append(j->sched->cfg.store, j->id, (int)level, msg, NULL);
	tr_log(TR_LOG_DBG, "job %lld: %s", (long long)j->id, msg);
}

static int on_checkpoint(void *ctx, struct tr_snapshot *snap, bool final)
{
	struct running_job *j = ctx;
	int rc = tr_checkpointer_submit(j->sched->checkpointer, j->id, tr_trainer_model(j->trainer_for_hooks),
					j->spec.optimizer.type, j->spec.checkpoint_keep, snap, final);
	/* A final checkpoint always hands the snapshot over (and waited for its
	 * write, whose failure the writer logs); a periodic one the writer was
	 * too busy for stays with the trainer, which frees it. */
	return final ? 0 : rc;
}

static void on_info(void *ctx, const char *key, const char *value)
{
	struct running_job *j = ctx;
	json_t *o = json_pack("{s:s}", key, value);
	char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
	/* The engine's few fields always fit beside the API's. */
	struct tr_error e = {0};
	if (text && tr_store_job_info_merge(j->sched->cfg.store, j->id, text,
					    TR_INFO_MAX_FIELDS + TR_INFO_ENGINE_FIELDS, &e) < 0)
		tr_log(TR_LOG_DBG, "job %lld: info %s not stored: %s", (long long)j->id, key, e.message);
	free(text);
	json_decref(o);
}

static bool on_checkpoint_busy(void *ctx)
{
	struct running_job *j = ctx;
	return tr_checkpointer_busy(j->sched->checkpointer, j->id);
}

/* Loads the newest checkpoint of `job_id` (step < 0) or the one at `step`
 * whose checksum verifies, skipping corrupt ones with a log line.  NULL
 * when there is none.  *unreadable: whether the list or a checkpoint could
 * not be read for a reason other than damage (out of descriptors, an I/O
 * error): such a checkpoint may be good. */
static struct tr_snapshot *load_checkpoint(struct running_job *j, int64_t job_id, int64_t step, bool weights_only,
					   int64_t *found_step, bool *unreadable)
{
	tr_store_t *st = j->sched->cfg.store;
	const tr_model_t *m = tr_trainer_model(j->trainer_for_hooks);
	struct tr_ckpt_row *rows = NULL;
	int n = 0;
	char line[1024];
	struct tr_error err;
	*unreadable = false;
	if (tr_store_ckpt_list(st, job_id, &rows, &n, NULL) < 0) {
		*unreadable = true;
		return NULL;
	}
	struct tr_snapshot *snap = NULL;
	for (int i = 0; i < n && !snap; i++) {
		if (step >= 0 && rows[i].step != step)
			continue;
		void *data = NULL;
		size_t len = 0;
		int rc = tr_store_ckpt_load(st, &rows[i], &data, &len, &err);
		if (rc == -EBADMSG) {
			snprintf(line, sizeof line,
				 "checkpoint at step %lld of job %lld is corrupt (SHA-256 mismatch); skipped",
				 (long long)rows[i].step, (long long)job_id);
			tr_store_log_append(st, j->id, TR_LOG_WARN, line, NULL);
			continue;
		}
		if (rc < 0) {
			snprintf(line, sizeof line, "checkpoint at step %lld of job %lld cannot be read: %s; skipped",
				 (long long)rows[i].step, (long long)job_id, err.message);
			tr_store_log_append(st, j->id, TR_LOG_WARN, line, NULL);
			*unreadable = true;
			continue;
		}
		rc = tr_checkpoint_parse(data, len, m, j->spec.optimizer.type, weights_only, &snap, &err);
		free(data);
		if (rc < 0) {
			snprintf(line, sizeof line, "checkpoint at step %lld of job %lld does not fit this model: %s",
				 (long long)rows[i].step, (long long)job_id, err.message);
			tr_store_log_append(st, j->id, TR_LOG_WARN, line, NULL);
			snap = NULL;
			continue;
		}
		*found_step = rows[i].step;
	}
	tr_ckpt_rows_free(rows, n);
	return snap;
}

static void drop_checkpoints_after(tr_store_t *st, int64_t job_id, int64_t step)
{
	struct tr_ckpt_row *rows = NULL;
	int n = 0;
	if (tr_store_ckpt_list(st, job_id, &rows, &n, NULL) < 0)
		return;
	for (int i = 0; i < n; i++)
		if (rows[i].step > step)
			tr_store_ckpt_delete(st, rows[i].id, NULL);
	tr_ckpt_rows_free(rows, n);
}

static bool earlier_attempt_wrote(tr_store_t *st, int64_t id)
{
	static const char *const loss[] = {"loss", NULL};
	struct tr_metrics_query q = {.names = loss, .to_step = INT64_MAX, .max_points = 2};
	json_t *r = tr_store_metrics_query(st, id, &q, NULL);
	bool any = json_object_size(json_object_get(r, "series")) > 0;
	json_decref(r);
	return any;
}

/* Resumes from the job's own newest valid checkpoint, or sets up init.from
 * another job's.  Returns 0, or -1 with err set when init.from cannot be
 * honoured (a fresh job must not silently start from random weights). */
static int restore(struct running_job *j, tr_trainer_t *t, struct tr_error *err)
{
	tr_store_t *st = j->sched->cfg.store;
	char line[256];
	int64_t step = 0;
	bool unreadable = false;
	struct tr_snapshot *snap = load_checkpoint(j, j->id, -1, false, &step, &unreadable);
	/* Checkpoints beyond the resume point (corrupt ones, or from an
	 * abandoned run) would otherwise shadow the new ones as "latest".
	 * Not when one could not be read at all: it may be good, and since
	 * resumed training is exact it holds what this run will reach anyway. */
	if (!unreadable)
		drop_checkpoints_after(st, j->id, snap ? step : -1);
	if (snap) {
		int64_t epoch = snap->epoch;
		int rc = tr_trainer_restore(t, snap, false, err);
		tr_snapshot_free(snap);
		if (rc < 0)
			return -1;
		j->resumed_step = step;
		/* The row shows the killed run's last progress (written once a
		 * second, maybe past this checkpoint or short of it); a run that
		 * pauses again before its first step (a trial at its rung) must
		 * show the step its weights are at. */
		tr_store_job_set_position(st, j->id, step, epoch, NULL);
		snprintf(line, sizeof line, "resuming from the checkpoint at step %lld", (long long)step);
		tr_store_log_append(st, j->id, TR_LOG_NOTICE, line, NULL);
		/* Points the interrupted run wrote after the checkpoint are
		 * replayed, not doubled. */
		tr_store_metrics_truncate(st, j->id, step, NULL);
		return 0;
	}
	/* Nothing to resume: whatever an earlier attempt wrote starts over.
	 * Only an earlier attempt writes "loss"; points a client pushed before
	 * the first start are left alone. */
	if (earlier_attempt_wrote(st, j->id)) {
		tr_store_metrics_truncate(st, j->id, 0, NULL);
		tr_store_log_append(st, j->id, TR_LOG_NOTICE, "no valid checkpoint: restarting from step 0", NULL);
	}
	if (j->spec.init_job > 0) {
		snap = load_checkpoint(j, j->spec.init_job, j->spec.init_step, true, &step, &unreadable);
		if (!snap) {
			tr_error_set(err, 0, 0, "/init/from", "/init/from: job %lld has no valid checkpoint%s",
				     (long long)j->spec.init_job, j->spec.init_step >= 0 ? " at that step" : "");
			return -1;
		}
		int rc = tr_trainer_restore(t, snap, true, err);
		tr_snapshot_free(snap);
		if (rc < 0)
			return -1;
		snprintf(line, sizeof line, "initialised from job %lld's checkpoint at step %lld",
			 (long long)j->spec.init_job, (long long)step);
		tr_store_log_append(st, j->id, TR_LOG_INF, line, NULL);
	}
	return 0;
}

static void finish(struct running_job *j, enum tr_job_state state, const char *code, const char *message, int64_t step)
{
	struct tr_scheduler *s = j->sched;
	char *error_text = NULL;
	if (code) {
		json_t *e = json_pack("{s:s, s:s, s:I}", "code", code, "message", message, "step", (json_int_t)step);
		error_text = json_dumps(e, JSON_COMPACT);
		json_decref(e);
	}
	/* The row's progress is throttled while running: make it exact now.
	 * Points first, then the state: a client that sees "completed" can
	 * read every metric. */
	tr_checkpointer_wait_idle(s->checkpointer, j->id);
	pthread_mutex_lock(&s->lock);
	struct tr_progress last = j->progress;
	bool have = j->have_progress;
	pthread_mutex_unlock(&s->lock);
	if (have)
		tr_store_job_set_progress(s->cfg.store, j->id, last.step, last.total_steps, last.epoch, last.loss,
					  NULL);
	tr_store_flush(s->cfg.store, NULL);
	/* The job has ended whatever the disk says: a change storage refuses
	 * now is held and written when it can be, and shown meanwhile. */
	struct tr_error se = {0};
	int rc = tr_store_job_record_state(s->cfg.store, j->id, state, error_text, NULL, &se);
	if (rc > 0)
		tr_log(TR_LOG_WARN, "job %lld: state %s not written yet, held until storage takes it: %s",
		       (long long)j->id, tr_job_state_name(state), se.message);
	else if (rc < 0)
		tr_log(TR_LOG_ERR, "job %lld: cannot record state %s: %s", (long long)j->id, tr_job_state_name(state),
		       se.message);
	free(error_text);
	int64_t drops = tr_store_metric_drops(s->cfg.store, j->id);
	if (drops > 0) {
		char line[128];
		snprintf(line, sizeof line, "%lld metric points were dropped because the database fell behind",
			 (long long)drops);
		tr_store_log_append(s->cfg.store, j->id, TR_LOG_WARN, line, NULL);
	}
	tr_log(code && state == TR_JOB_FAILED ? TR_LOG_WARN : TR_LOG_INF, "job %lld %s%s%s", (long long)j->id,
	       tr_job_state_name(state), message ? ": " : "", message ? message : "");
	pthread_mutex_lock(&s->lock);
	j->finished = true;
	j->trainer = NULL;
	s->ended++; /* a job waiting for memory may fit now */
	s->dirty = true;
	pthread_cond_broadcast(&s->wake);
	pthread_mutex_unlock(&s->lock);
}

/* "completed" promises that the job's final weights are stored (a
 * download of its latest model.safetensors gives them).  A final checkpoint
 * that could not be written (a full disk, the --state-max-bytes cap), or a
 * periodic one at the last step that failed after the trainer counted it
 * as taken (its write is asynchronous, so the trainer then skips the final
 * one as a duplicate), used to leave a "completed" job with older weights
 * or none at all, said only in a warning of its log.  Such a job fails
 * instead, naming the cause; its earlier checkpoints stay.  True when the
 * newest stored checkpoint is not at `steps` (err says why). */
static bool final_weights_missing(struct running_job *j, int64_t steps, struct tr_error *err)
{
	tr_store_t *st = j->sched->cfg.store;
	tr_checkpointer_wait_idle(j->sched->checkpointer, j->id);
	struct tr_ckpt_row row = {0};
	struct tr_error se = {0};
	int rc = tr_store_ckpt_get(st, j->id, -1, &row, &se);
	int64_t newest = rc == 0 ? row.step : -1;
	tr_ckpt_row_finish(&row);
	if (rc == 0 && newest == steps)
		return false;
	if (rc < 0 && rc != -ENOENT) {
		/* The list could not be read: the weights may well be there. */
		tr_log(TR_LOG_WARN, "job %lld: cannot check that its final checkpoint is stored: %s", (long long)j->id,
		       se.message);
		return false;
	}
	char older[64] = "no earlier checkpoint exists";
	if (newest >= 0)
		snprintf(older, sizeof older, "the newest stored checkpoint is at step %lld", (long long)newest);
	tr_error_set(err, 0, 0, NULL,
		     "training ended at step %lld, but its final weights could not be stored (see the job's log for "
		     "the checkpoint's error); %s",
		     (long long)steps, older);
	return true;
}

/* The spec's "precision", on the job's devices: they are the job's alone
 * until it ends.  fp32 is set too, so that a TF32 job leaves nothing
 * behind for the next job on the same devices.  Where gemm is FP32 only
 * (CPU devices) tf32 has no effect: the job runs in FP32 and says so in
 * its log.  Returns the precision in effect, or NULL with err filled. */
static const char *apply_precision(struct running_job *j, struct tr_error *err)
{
	tr_backend_t *be = j->sched->cfg.backend;
	bool tf32 = j->spec.tf32 && be->i->set_tf32;

	for (int i = 0; be->i->set_tf32 && i < j->ndev; i++) {
		int rc = be->i->set_tf32(be, j->devices[i], tf32);
		if (rc == -ENOTSUP && tf32) {
			tf32 = false; /* FP32 on every device, from the first */
			i = -1;
			continue;
		}
		if (rc < 0) {
			tr_error_set(err, 0, 0, "/precision", "/precision: device %d: %s", j->devices[i],
				     be->i->last_error(be));
			return NULL;
		}
	}
	if (j->spec.tf32 && !tf32) {
		char line[160];
		snprintf(line, sizeof line, "precision tf32 has no effect on %s devices: matrix products run in FP32",
			 be->i->name);
		tr_store_log_append(j->sched->cfg.store, j->id, TR_LOG_NOTICE, line, NULL);
	}
	return tf32 ? "tf32" : "fp32";
}

static void *runner_main(void *arg)
{
	struct running_job *j = arg;
	struct tr_scheduler *s = j->sched;
	struct tr_error err = {0};
	char name[16];
	snprintf(name, sizeof name, "tr-job%lld", (long long)j->id); /* also rank 0's thread */
	pthread_setname_np(pthread_self(), name);
	char line[256];
	const char *precision = apply_precision(j, &err);
	if (!precision) {
		finish(j, TR_JOB_FAILED, "start_failed", err.message, 0);
		return NULL;
	}
	struct tr_job_row row = {0};
	if (tr_store_job_get(s->cfg.store, j->id, &row, NULL) == 0) {
		j->pause_at = row.pause_at;
		j->planned_steps = row.total_steps;
	}
	tr_job_row_finish(&row);
	snprintf(line, sizeof line, "started on %d %s device(s), %s matrix products", j->ndev, s->cfg.backend->i->name,
		 precision);
	tr_store_log_append(s->cfg.store, j->id, TR_LOG_INF, line, NULL);

	/* A spec parsed at submit had its paths opened in the data roots
	 * then; one parsed from the store (after a restart) has them checked
	 * here, once.  Either way the readers open every file through the
	 * same confined open, so a file moved since is refused the same. */
	struct tr_error perr;
	if (!j->paths_resolved && tr_resolve_spec_paths(s, &j->spec, &perr) < 0) {
		finish(j, TR_JOB_FAILED, "invalid_path", perr.message, 0);
		return NULL;
	}
	/* The job's ranks are the pool's devices it was given. */
	if (j->spec.n_device_ids == 0 || j->spec.n_device_ids != j->ndev) {
		j->spec.n_device_ids = j->ndev;
		memcpy(j->spec.device_ids, j->devices, sizeof(int) * (size_t)j->ndev);
	}
	struct tr_trainer_options opt = {
		.spec = &j->spec,
		.backend = s->cfg.backend,
		.data_roots = s->roots,
		.hooks = {.metric = on_metric,
			  .progress = on_progress,
			  .log = on_log,
			  .checkpoint = on_checkpoint,
			  .checkpoint_busy = on_checkpoint_busy,
			  .info = on_info,
			  .ctx = j},
		/* No trainer exists yet for a cancel to reach: set-up watches
		 * the job's own flag (a cancel, or shutdown after its grace). */
		.cancel = &j->cancel_requested,
		.admit_memory = tr_admit_memory,
	};
	tr_trainer_t *t = NULL;
	int rc = tr_trainer_create(&opt, &t, &err);
	if (rc == -EBUSY) { /* it fits once other jobs end: back to the queue */
		tr_wait_for_memory(j, err.message);
		return NULL;
	}
	if (rc == -ECANCELED) {
		pthread_mutex_lock(&s->lock);
		bool shutdown = s->shutting_down;
		pthread_mutex_unlock(&s->lock);
		if (shutdown)
			finish(j, TR_JOB_INTERRUPTED, NULL, NULL, 0);
		else
			finish(j, TR_JOB_CANCELLED, "cancelled", "cancelled by request during set-up", 0);
		return NULL;
	}
	/* A file gone from the roots since submit: the same answer, naming
	 * the pointer and the roots, as a check at submit gives (resolving
	 * again only now that something is wrong). */
	if (rc == -ENOENT && j->paths_resolved && tr_resolve_spec_paths(s, &j->spec, &perr) < 0)
		err = perr;
	if (rc < 0) {
		finish(j, TR_JOB_FAILED,
		       rc == -EINVAL || rc == -E2BIG ? "invalid_data" /* E2BIG: too large to read (an image bomb) */
		       : rc == -ENOENT               ? "invalid_path" /* gone from the roots since the check above */
		       : rc == -ENOMEM               ? "insufficient_memory"
						     : "start_failed",
		       err.message, 0);
		return NULL;
	}
	j->trainer_for_hooks = t;
	/* What it runs with, for GET /jobs/{id} (a lost write only leaves the
	 * figure unknown there). */
	tr_store_job_set_loader_threads(s->cfg.store, j->id, tr_trainer_loader_threads(t), NULL);
	if (restore(j, t, &err) < 0) {
		tr_trainer_destroy(t);
		finish(j, TR_JOB_FAILED, "invalid_init", err.message, 0);
		return NULL;
	}
	/* A trial resumed from the checkpoint of its rung (its pause was
	 * written, then the daemon died before the state was): paused again
	 * before any step, so the rung's weights stay exactly the rung's. */
	if (j->pause_at > 0 && j->resumed_step > 0) {
		int64_t at = j->pause_at;
		if (j->spec.max_steps == 0 && j->spec.epochs > 0)
			at = j->planned_steps > 0 ? j->planned_steps / j->spec.epochs * j->pause_at : INT64_MAX;
		if (j->resumed_step >= at) {
			j->pause_at_asked = true;
			atomic_store(&j->pause_requested, true);
			atomic_store(&j->stop_requested, true);
		}
	}
	pthread_mutex_lock(&s->lock);
	j->trainer = t;
	/* A control request may have arrived while the trainer was built. */
	if (atomic_load(&j->cancel_requested) || atomic_load(&j->preempt_hard))
		tr_trainer_cancel(t);
	else if (atomic_load(&j->stop_requested) && s->shutting_down)
		tr_trainer_stop_for(t, TR_STOP_SHUTDOWN);
	else if (atomic_load(&j->stop_requested))
		tr_trainer_stop_for(t, atomic_load(&j->pause_requested)     ? TR_STOP_PAUSE
				       : atomic_load(&j->preempt_requested) ? TR_STOP_PREEMPT
									    : TR_STOP_STOP);
	pthread_mutex_unlock(&s->lock);

	rc = tr_trainer_run(t, &err);

	pthread_mutex_lock(&s->lock);
	j->trainer = NULL; /* control requests stop reaching it before it is freed */
	bool shutdown = s->shutting_down;
	pthread_mutex_unlock(&s->lock);
	struct tr_summary sum;
	tr_trainer_summary(t, &sum);
	j->trainer_for_hooks = NULL;
	tr_trainer_destroy(t);
	/* This run's training time, before the state that ends it: a
	 * resumed job's elapsed time counts every run (docs/design.md,
	 * "Summary figures"). */
	pthread_mutex_lock(&s->lock);
	double ran = j->have_progress ? j->progress.elapsed_s : 0;
	pthread_mutex_unlock(&s->lock);
	tr_store_job_add_train_s(s->cfg.store, j->id, ran, NULL);

	bool cancelled = atomic_load(&j->cancel_requested);
	bool paused = atomic_load(&j->pause_requested);
	/* Preempted (daemon/preemption.c): at a step boundary with its
	 * checkpoint, or cancelled when its grace ran out; a client's cancel,
	 * pause or stop meanwhile wins. */
	bool preempted = atomic_load(&j->preempt_requested) && !shutdown && !cancelled && !paused &&
			 ((rc == 0 && sum.stopped) || (rc == -ECANCELED && atomic_load(&j->preempt_hard)));
	bool ends_completed = rc == 0 && (!sum.stopped || (!shutdown && !paused && !preempted)); /* as below */
	if (ends_completed && final_weights_missing(j, sum.steps, &err)) {
		finish(j, TR_JOB_FAILED, "checkpoint_failed", err.message, sum.steps);
	} else if (rc == 0 && !sum.stopped) {
		finish(j, TR_JOB_COMPLETED, NULL, NULL, sum.steps);
	} else if (shutdown && (rc == 0 || rc == -ECANCELED)) {
		snprintf(line, sizeof line, "interrupted by daemon shutdown at step %lld", (long long)sum.steps);
		tr_store_log_append(s->cfg.store, j->id, TR_LOG_NOTICE, line, NULL);
		finish(j, TR_JOB_INTERRUPTED, NULL, NULL, sum.steps);
	} else if (preempted) {
		tr_preempt_record(j, sum.steps);
		finish(j, TR_JOB_PREEMPTED, NULL, NULL, sum.steps);
	} else if (rc == 0 && paused) {
		snprintf(line, sizeof line, "paused at step %lld", (long long)sum.steps);
		tr_store_log_append(s->cfg.store, j->id, TR_LOG_NOTICE, line, NULL);
		finish(j, TR_JOB_PAUSED, NULL, NULL, sum.steps);
	} else if (rc == 0) {
		/* Ended before its end: "stopped", resumable (with more steps
		 * too); "completed" is kept for a job that ran to its end. */
		snprintf(line, sizeof line, "stopped by request after step %lld of %lld", (long long)sum.steps,
			 (long long)j->progress.total_steps);
		tr_store_log_append(s->cfg.store, j->id, TR_LOG_NOTICE, line, NULL);
		finish(j, TR_JOB_STOPPED, NULL, NULL, sum.steps);
	} else if (rc == -ECANCELED || cancelled) {
		finish(j, TR_JOB_CANCELLED, "cancelled", "cancelled by request", sum.steps);
	} else {
		finish(j, TR_JOB_FAILED, "training_failed", err.message, sum.steps + 1);
	}
	return NULL;
}

int tr_runner_start(struct running_job *j, struct tr_error *err)
{
	if (pthread_create(&j->thread, NULL, runner_main, j) != 0)
		return tr_error_set(err, -EAGAIN, 0, NULL, "cannot start the job's thread");
	return 0;
}

void tr_runner_finish(struct running_job *j, enum tr_job_state state, const char *code, const char *message,
		      int64_t step)
{
	finish(j, state, code, message, step);
}
