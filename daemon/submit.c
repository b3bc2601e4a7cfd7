/* The API operations that change the queue: submit, control, priority,
 * delete, plus the read-only device and live-progress views.  What a
 * request may do in a job's state is core/job.h's transition table; every
 * refusal is a domain error (struct tr_error with a tr_job_err kind and,
 * for spec problems, the JSON pointer of the offending value), which the
 * API turns into an HTTP status in one place (api/errors.c). */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/job.h"
#include "core/json_text.h"
#include "daemon/log.h"
#include "daemon/scheduler_internal.h"
#include "engine/rng.h"
#include "storage/checkpoints.h"

/* A 128-bit digest of the body for idempotency comparisons: two SplitMix
 * lanes over the bytes.  Not cryptographic; it only has to tell two
 * requests under the same key apart. */
static void body_digest(const char *body, size_t len, char out[33])
{
	uint64_t a = 0x243f6a8885a308d3ULL ^ len, b = 0x13198a2e03707344ULL;
	for (size_t i = 0; i < len; i += 8) {
		uint64_t w = 0;
		for (size_t j = 0; j < 8 && i + j < len; j++)
			w |= (uint64_t)(unsigned char)body[i + j] << (8 * j);
		a = tr_mix64(a ^ w);
		b = tr_mix64(b + w + a);
	}
	snprintf(out, 33, "%016llx%016llx", (unsigned long long)a, (unsigned long long)b);
}

static int check_devices(struct tr_scheduler *s, const struct tr_spec *spec, struct tr_error *err)
{
	if (spec->n_device_ids > 0) {
		for (int i = 0; i < spec->n_device_ids; i++) {
			if (spec->device_ids[i] >= s->ndev) {
				char ptr[32];
				snprintf(ptr, sizeof ptr, "/devices/%d", i);
				return tr_job_fail(err, TR_JOB_E_CANNOT_FIT, ptr,
						   "%s: device %d does not exist; this daemon has devices 0..%d", ptr,
						   spec->device_ids[i], s->ndev - 1);
			}
		}
	} else if (spec->device_count > s->ndev) {
		return tr_job_fail(err, TR_JOB_E_CANNOT_FIT, "/devices",
				   "/devices: %d devices requested, this daemon has %d", spec->device_count, s->ndev);
	}
	const tr_backend_i *have = s->cfg.backend->i;
	/* Only on refusal: asking the driver costs a few milliseconds. */
	if (spec->backend == TR_BACKEND_CUDA && have->kind != TR_BACKEND_KIND_CUDA)
		return tr_job_fail(err, TR_JOB_E_NO_BACKEND, "/backend",
				   "/backend: cuda requested, but this daemon runs on %s devices (%s)", have->name,
				   tr_cuda_available()
					   ? "a GPU is visible, but the daemon was started with --backend cpu or "
					     "could not use it: see its log"
					   : "no usable GPU");
	if (spec->backend == TR_BACKEND_CPU && have->kind != TR_BACKEND_KIND_CPU)
		return tr_job_fail(err, TR_JOB_E_NO_BACKEND, "/backend",
				   "/backend: cpu requested, but this daemon's devices are %s", have->name);
	return 0;
}

/* A job of several processes runs as CPU ranks the daemon starts
 * (daemon/procs_runner.c), each on `devices` devices (a count) of the
 * daemon's: processes x devices must fit its pool. */
static int check_processes(struct tr_scheduler *s, const struct tr_spec *spec, struct tr_error *err)
{
	if (spec->n_device_ids > 0)
		return tr_job_fail(err, TR_JOB_E_INVALID_SPEC, "/devices",
				   "/devices: a job of %d processes takes a device count per process, not a list",
				   spec->processes);
	if (s->cfg.backend->i->kind != TR_BACKEND_KIND_CPU || spec->backend == TR_BACKEND_CUDA)
		return tr_job_fail(err, TR_JOB_E_NO_BACKEND, "/processes",
				   "/processes: jobs of several processes run on CPU devices only; this daemon's "
				   "are %s",
				   s->cfg.backend->i->name);
	int per = spec->device_count > 0 ? spec->device_count : 1;
	if (spec->processes * per > s->ndev)
		return tr_job_fail(err, TR_JOB_E_CANNOT_FIT, "/processes",
				   "/processes: %d processes of %d device(s) hold %d devices, this daemon has %d",
				   spec->processes, per, spec->processes * per, s->ndev);
	return 0;
}

static int op_control(void *ctx, int64_t id, const struct tr_api_control *req, struct tr_error *err);

/* Every check of a submit before anything is stored: the spec, the
 * devices, the data paths and data, init.from.  0 with *spec parsed
 * (release it), or -1 with err filled and nothing to release. */
static int check_spec(struct tr_scheduler *s, const json_t *doc, struct tr_spec *spec, struct tr_error_list *problems,
		      struct tr_error *err)
{
	struct tr_error serr;
	if (tr_spec_parse_all(doc, spec, &serr, problems) < 0)
		return tr_job_fail(err, TR_JOB_E_INVALID_SPEC, serr.pointer, "%s", serr.message);
	int rc = check_devices(s, spec, err);
	if (rc == 0 && spec->processes > 1 && !tr_sched_runs_on_slurm(s, spec))
		rc = check_processes(s, spec, err);
	int paths = rc == 0 ? tr_resolve_spec_paths(s, spec, &serr) : 0;
	if (paths < 0)
		rc = tr_job_fail(err, paths == -2 ? TR_JOB_E_INVALID_SPEC : TR_JOB_E_INVALID_PATH, serr.pointer, "%s",
				 serr.message);
	if (rc == 0)
		rc = tr_submit_check_data(s, spec, err);
	if (rc == 0 && spec->init_job > 0) {
		struct tr_ckpt_row ck = {0};
		if (tr_store_ckpt_get(s->cfg.store, spec->init_job, spec->init_step, &ck, NULL) < 0) {
			if (spec->init_step >= 0)
				rc = tr_job_fail(err, TR_JOB_E_INVALID_INIT, "/init/from",
						 "/init/from: job %lld has no checkpoint at step %lld",
						 (long long)spec->init_job, (long long)spec->init_step);
			else
				rc = tr_job_fail(err, TR_JOB_E_INVALID_INIT, "/init/from",
						 "/init/from: job %lld does not exist or has no checkpoint yet",
						 (long long)spec->init_job);
		}
		tr_ckpt_row_finish(&ck);
	}
	if (rc < 0)
		tr_spec_finish(spec);
	return rc < 0 ? -1 : 0;
}

int tr_sched_check_spec(struct tr_scheduler *s, const json_t *doc, struct tr_error *err)
{
	struct tr_spec spec;
	if (check_spec(s, doc, &spec, NULL, err) < 0)
		return -1;
	tr_spec_finish(&spec);
	return 0;
}

/* Submits a job; tag (NULL for a plain job) makes it an experiment's
 * trial: its experiment, trial index and pause_at are stored with it
 * (its preemptible flag is the request's, set from the tag). */
static int submit_job(struct tr_scheduler *s, const struct tr_api_submit *req, const struct tr_job_row *tag,
		      int64_t *job_id, bool *replayed, struct tr_error *err)
{
	struct tr_spec spec;
	*replayed = false;
	int rc = check_spec(s, req->spec, &spec, req->problems, err);
	if (rc < 0)
		return rc;
	json_t *norm = tr_spec_to_json(&spec);

	char *norm_text = json_dumps(norm, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(9));
	/* "The spec as given": the request's own text when it is there. */
	char *spec_text = req->body ? strndup(req->body, req->body_len)
				    : tr_json_dumps(req->spec, JSON_COMPACT | JSON_PRESERVE_ORDER);
	json_decref(norm);
	char digest[33];
	body_digest(req->body ? req->body : "", req->body_len, digest);
	struct tr_job_row row = {
		.name = spec.name,
		.state = TR_JOB_QUEUED,
		.priority = req->priority,
		.preemptible = req->preemptible,
		.spec = spec_text,
		.normalized = norm_text,
		.devices = "[]",
		.idempotency_key = (char *)req->idempotency_key,
		.request_hash = digest,
		.loss = NAN,
		.experiment = tag ? tag->experiment : 0,
		.trial = tag ? tag->trial : 0,
		.pause_at = tag ? tag->pause_at : 0,
	};
	int64_t existing = 0;
	struct tr_error se = {0};
	/* The insert and keeping the parsed spec happen under the scheduler
	 * lock, so the dispatcher (which starts jobs under it) finds the spec
	 * kept as soon as it can see the job. */
	pthread_mutex_lock(&s->lock);
	rc = tr_store_job_insert_bounded(s->cfg.store, &row, s->cfg.max_queued, &existing, &se);
	if (rc == 0) {
		tr_log(TR_LOG_INF, "job %lld (%s) submitted", (long long)row.id, spec.name ? spec.name : "job");
		tr_sched_keep_spec(s, row.id, &spec, true);
	}
	pthread_mutex_unlock(&s->lock);
	if (rc == -EAGAIN) {
		tr_log(TR_LOG_WARNING, "submit refused: %s", se.message);
		rc = tr_job_fail(err, TR_JOB_E_QUEUE_FULL, "", "%s; retry when some have started", se.message);
	} else if (rc == -EEXIST && req->idempotency_key) {
		struct tr_job_row old = {0};
		rc = tr_store_job_get(s->cfg.store, existing, &old, &se);
		if (rc == 0 && old.request_hash && strcmp(old.request_hash, digest) == 0) {
			*job_id = existing;
			*replayed = true;
		} else if (rc == 0) {
			rc = tr_job_fail(err, TR_JOB_E_CONFLICT, "",
					 "Idempotency-Key '%s' was used for job %lld with a different request body",
					 req->idempotency_key, (long long)existing);
		} else {
			rc = tr_job_fail(err, TR_JOB_E_INTERNAL, "", "store: %s", se.message);
		}
		tr_job_row_finish(&old);
	} else if (rc == -EEXIST) { /* the trial's job exists: it never runs twice */
		rc = tr_job_fail(err, TR_JOB_E_CONFLICT, "", "%s", se.message);
	} else if (rc < 0) {
		rc = tr_job_fail(err, TR_JOB_E_STORAGE, "", "cannot store the job: %s", se.message);
	} else {
		*job_id = row.id;
		tr_store_log_append(s->cfg.store, row.id, TR_LOG_INF, "submitted", NULL);
		tr_sched_kick(s);
	}
	free(spec_text);
	free(norm_text);
	tr_spec_finish(&spec);
	return rc < 0 ? -1 : 0;
}

static int op_submit(void *ctx, const struct tr_api_submit *req, int64_t *job_id, bool *replayed, struct tr_error *err)
{
	return submit_job(ctx, req, NULL, job_id, replayed, err);
}

int tr_sched_submit_trial(struct tr_scheduler *s, const json_t *spec, int priority, const struct tr_job_row *tag,
			  int64_t *job_id, struct tr_error_list *problems, struct tr_error *err)
{
	char *body = tr_json_dumps(spec, JSON_COMPACT | JSON_PRESERVE_ORDER);
	struct tr_api_submit req = {.spec = spec,
				    .body = body,
				    .body_len = body ? strlen(body) : 0,
				    .priority = priority,
				    .preemptible = tag && tag->preemptible,
				    .problems = problems};
	bool replayed = false;
	int rc = submit_job(s, &req, tag, job_id, &replayed, err);
	free(body);
	return rc;
}

int tr_sched_control(struct tr_scheduler *s, int64_t id, enum tr_job_request op, struct tr_error *err)
{
	struct tr_api_control req = {.op = op};
	return op_control(s, id, &req, err);
}

/* Reads job id into row; refuses with not found or storage errors. */
static int load_job(struct tr_scheduler *s, int64_t id, struct tr_job_row *row, struct tr_error *err)
{
	struct tr_error se = {0};
	int rc = tr_store_job_get(s->cfg.store, id, row, &se);
	if (rc == -ENOENT)
		return tr_job_fail(err, TR_JOB_E_NOT_FOUND, "", "job %lld not found", (long long)id);
	if (rc < 0)
		return tr_job_fail(err, TR_JOB_E_STORAGE, "", "%s", se.message);
	return 0;
}

static struct running_job *find_running(struct tr_scheduler *s, int64_t id)
{
	for (struct running_job *j = s->running; j; j = j->next)
		if (j->id == id)
			return j;
	return NULL;
}

/* A resume that gives the job a new end ({"max_steps": N} or {"epochs":
 * N}): the field replaces the job's end in its spec (the other bound is
 * dropped, so the new one decides) and in the spec as shown.  Refused
 * when the job is already past it.  The job then continues from its
 * newest checkpoint to the new end; with a schedule that does not depend
 * on the total (constant, warm-up only) the result is the run of that
 * length that was never stopped. */
static int extend(struct tr_scheduler *s, const struct tr_job_row *row, const struct tr_api_control *req,
		  struct tr_error *err)
{
	const char *key = req->epochs ? "epochs" : "max_steps";
	int64_t value = req->epochs ? req->epochs : req->max_steps;
	/* epoch is the 0-based epoch of the job's last step: epochs must
	 * still include it (docs/design.md, "Epochs"). */
	if (req->epochs && req->epochs < row->epoch + 1)
		return tr_job_fail(err, TR_JOB_E_INVALID_REQUEST, "/epochs",
				   "/epochs: job %lld is in epoch %lld (1-based) already; give at least %lld",
				   (long long)row->id, (long long)tr_job_epoch_shown(row->epoch),
				   (long long)row->epoch + 1);
	if (req->max_steps && req->max_steps < row->step)
		return tr_job_fail(err, TR_JOB_E_INVALID_REQUEST, "/max_steps",
				   "/max_steps: job %lld is at step %lld already; give at least that",
				   (long long)row->id, (long long)row->step);
	const char *texts[2] = {row->spec, row->normalized};
	char *out[2] = {NULL, NULL};
	int rc = 0;
	for (int i = 0; i < 2 && rc == 0; i++) {
		json_t *doc = texts[i] ? json_loads(texts[i], 0, NULL) : NULL;
		if (!json_is_object(doc)) {
			rc = tr_job_fail(err, TR_JOB_E_INTERNAL, "", "job %lld: its stored spec is not a JSON object",
					 (long long)row->id);
		} else {
			json_object_del(doc, "epochs");
			json_object_del(doc, "max_steps");
			json_object_set_new(doc, key, json_integer(value));
			/* The normalized spec keeps its 9 digits (its floats are
			 * floats, shortened already: tr_fields_short_double). */
			out[i] = i ? json_dumps(doc, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(9))
				   : tr_json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER);
			if (!out[i])
				rc = tr_job_fail(err, TR_JOB_E_INTERNAL, "", "out of memory");
		}
		json_decref(doc);
	}
	/* The normalized spec must still be a valid one (bounds: epochs x
	 * samples, max_steps x batch_size). */
	if (rc == 0) {
		struct tr_spec spec;
		struct tr_error serr;
		if (tr_spec_parse_text(out[1], &spec, &serr) < 0)
			rc = tr_job_fail(err, TR_JOB_E_INVALID_REQUEST, req->epochs ? "/epochs" : "/max_steps", "%s",
					 serr.message);
		else
			tr_spec_finish(&spec);
	}
	struct tr_error se = {0};
	if (rc == 0 && tr_store_job_set_spec(s->cfg.store, row->id, out[0], out[1], &se) < 0)
		rc = tr_job_fail(err, TR_JOB_E_STORAGE, "", "%s", se.message);
	if (rc == 0) {
		char line[160];
		snprintf(line, sizeof line, "its end is now %s %lld", key, (long long)value);
		tr_store_log_append(s->cfg.store, row->id, TR_LOG_NOTICE, line, NULL);
		tr_sched_drop_spec(s, row->id); /* parsed again from the store when it starts */
	}
	free(out[0]);
	free(out[1]);
	return rc;
}

/* A request the table says takes effect at once (the job is not
 * running): writes the new state. */
static int set_now(struct tr_scheduler *s, const struct tr_job_row *row, const struct tr_api_control *req,
		   enum tr_job_state to, struct tr_error *err)
{
	int64_t id = row->id;
	int rc = 0;
	struct tr_error se = {0};
	if (to == TR_JOB_QUEUED) { /* resume */
		if ((req->epochs || req->max_steps) && extend(s, row, req, err) < 0)
			return -1;
		if (tr_store_job_set_state(s->cfg.store, id, TR_JOB_QUEUED, NULL, "[]", &se) < 0)
			return tr_job_fail(err, TR_JOB_E_STORAGE, "", "%s", se.message);
		tr_store_log_append(s->cfg.store, id, TR_LOG_NOTICE,
				    "resumed: queued; it continues from its newest checkpoint", NULL);
		s->dirty = true;
		pthread_cond_broadcast(&s->wake);
	} else if (to == TR_JOB_PAUSED) {
		/* Not running: it simply waits out of the queue. */
		if (tr_store_job_set_state(s->cfg.store, id, TR_JOB_PAUSED, NULL, NULL, &se) < 0)
			return tr_job_fail(err, TR_JOB_E_STORAGE, "", "%s", se.message);
		tr_store_log_append(s->cfg.store, id, TR_LOG_NOTICE, "paused while queued", NULL);
	} else if (to == TR_JOB_CANCELLED) {
		/* Held and shown when storage refuses it: the job must not
		 * come back.  Cancel or stop before it ran: nothing to wind
		 * down. */
		bool paused = row->state == TR_JOB_PAUSED, preempted = row->state == TR_JOB_PREEMPTED;
		rc = tr_store_job_record_state(
			s->cfg.store, id, TR_JOB_CANCELLED,
			paused      ? "{\"code\":\"cancelled\",\"message\":\"cancelled while paused\"}"
			: preempted ? "{\"code\":\"cancelled\",\"message\":\"cancelled while preempted\"}"
				    : "{\"code\":\"cancelled\",\"message\":\"cancelled before it started\"}",
			NULL, &se);
		if (rc < 0)
			return tr_job_fail(err, TR_JOB_E_STORAGE, "", "%s", se.message);
		if (!paused)
			tr_store_log_append(s->cfg.store, id, TR_LOG_NOTICE,
					    preempted ? "cancelled while preempted (in the queue)"
						      : "cancelled while queued",
					    NULL);
		tr_sched_drop_spec(s, id);
	} else {
		return tr_job_fail(err, TR_JOB_E_INTERNAL, "", "job %lld: no way to set %s", (long long)id,
				   tr_job_state_name(to));
	}
	return 0;
}

/* A request the table hands to the job's runner. */
static int signal_runner(struct tr_scheduler *s, const struct tr_job_row *row, enum tr_job_request op,
			 struct tr_error *err)
{
	int64_t id = row->id;
	struct running_job *j = find_running(s, id);
	if (!j)
		return tr_job_fail(err, TR_JOB_E_ILLEGAL, "", "job %lld is %s and not running here", (long long)id,
				   tr_job_state_name(row->state));
	if (op == TR_JOB_PAUSE) {
		/* A stop whose final checkpoint is the resume point; the runner
		 * records the job as paused and frees its devices. */
		atomic_store(&j->pause_requested, true);
		atomic_store(&j->stop_requested, true);
		atomic_store(&j->preempt_requested, false); /* the client's pause wins */
		if (j->trainer)
			tr_trainer_stop_for(j->trainer, TR_STOP_PAUSE);
		tr_store_log_append(s->cfg.store, id, TR_LOG_NOTICE,
				    "pause requested: checkpointing at the next step boundary", NULL);
	} else if (op == TR_JOB_CANCEL) {
		atomic_store(&j->cancel_requested, true);
		if (j->trainer)
			tr_trainer_cancel(j->trainer);
		tr_store_log_append(s->cfg.store, id, TR_LOG_NOTICE, "cancel requested", NULL);
	} else if (op == TR_JOB_STOP) {
		atomic_store(&j->stop_requested, true);
		atomic_store(&j->preempt_requested, false); /* the client's stop wins */
		if (j->trainer)
			tr_trainer_stop(j->trainer);
		tr_store_job_record_state(s->cfg.store, id, TR_JOB_STOPPING, NULL, NULL, NULL);
		tr_store_log_append(s->cfg.store, id, TR_LOG_NOTICE, "stop requested: finishing the current step",
				    NULL);
	} else if (op == TR_JOB_CHECKPOINT) {
		if (!j->trainer)
			return tr_job_fail(err, TR_JOB_E_ILLEGAL, "",
					   "job %lld is still setting up; ask again once it runs", (long long)id);
		tr_trainer_request_checkpoint(j->trainer);
	}
	return 0;
}

/* A preempted job whose runner still follows it is a Slurm job that
 * Slurm holds after a requeue (daemon/slurm_preempt.c): the table's "at
 * once" answers for a preempted job in the queue do not fit it.  Cancel
 * and stop (which cancels a job that is not running, as the table says)
 * go to its runner, which runs scancel; a pause is refused, since no
 * worker runs to checkpoint (its newest checkpoint is already its resume
 * point).  Lock held. */
static int slurm_held_request(struct tr_scheduler *s, const struct tr_job_row *row, enum tr_job_request op,
			      struct tr_job_transition *t, struct tr_error *err)
{
	struct running_job *j = row->state == TR_JOB_PREEMPTED ? find_running(s, row->id) : NULL;
	if (!j || j->finished || !j->slurm || t->action != TR_JOB_SET)
		return 0;
	if (op == TR_JOB_PAUSE)
		return tr_job_fail(
			err, TR_JOB_E_ILLEGAL, "",
			"job %lld is preempted by Slurm and waits for Slurm to start it again; pause it once "
			"it runs, or cancel it",
			(long long)row->id);
	if (op == TR_JOB_CANCEL || op == TR_JOB_STOP) {
		*t = (struct tr_job_transition){TR_JOB_KEEP, TR_JOB_PREEMPTED}; /* done here */
		return signal_runner(s, row, TR_JOB_CANCEL, err);
	}
	return 0;
}

static int op_control(void *ctx, int64_t id, const struct tr_api_control *req, struct tr_error *err)
{
	struct tr_scheduler *s = ctx;
	pthread_mutex_lock(&s->lock);
	struct tr_job_row row = {0};
	struct tr_job_transition t;
	int rc = load_job(s, id, &row, err);
	if (rc == 0)
		rc = tr_job_check(id, row.state, req->op, &t, err);
	if (rc == 0 && (req->epochs || req->max_steps) && req->op != TR_JOB_RESUME)
		rc = tr_job_fail(err, TR_JOB_E_INVALID_REQUEST, "", "only a resume takes a new end");
	if (rc == 0)
		rc = slurm_held_request(s, &row, req->op, &t, err);
	if (rc == 0 && t.action == TR_JOB_SET)
		rc = set_now(s, &row, req, t.to, err);
	else if (rc == 0 && t.action == TR_JOB_SIGNAL)
		rc = signal_runner(s, &row, req->op, err);
	/* TR_JOB_KEEP: legal and nothing to do (a repeated stop). */
	pthread_mutex_unlock(&s->lock);
	tr_job_row_finish(&row);
	return rc < 0 ? -1 : 0;
}

static int op_checkpoint_now(void *ctx, int64_t id, struct tr_error *err)
{
	struct tr_api_control req = {.op = TR_JOB_CHECKPOINT};
	int rc = op_control(ctx, id, &req, err);
	if (rc == 0)
		tr_store_log_append(((struct tr_scheduler *)ctx)->cfg.store, id, TR_LOG_INF, "checkpoint requested",
				    NULL);
	return rc;
}

static int op_set_priority(void *ctx, int64_t id, int priority, struct tr_error *err)
{
	struct tr_scheduler *s = ctx;
	struct tr_job_row row = {0};
	int rc = load_job(s, id, &row, err);
	if (rc == 0 && (rc = tr_job_check(id, row.state, TR_JOB_SET_PRIORITY, NULL, err)) < 0)
		snprintf(err->pointer, sizeof err->pointer, "/priority"); /* the body's field at fault */
	struct tr_error se = {0};
	if (rc == 0 && tr_store_job_set_priority(s->cfg.store, id, priority, &se) < 0)
		rc = tr_job_fail(err, TR_JOB_E_STORAGE, "", "%s", se.message);
	tr_job_row_finish(&row);
	if (rc == 0) {
		/* Preemption compares the priorities of running jobs too. */
		pthread_mutex_lock(&s->lock);
		struct running_job *j = find_running(s, id);
		if (j)
			j->priority = priority;
		pthread_mutex_unlock(&s->lock);
		tr_sched_kick(s);
	}
	return rc < 0 ? -1 : 0;
}

static int op_remove(void *ctx, int64_t id, struct tr_error *err)
{
	struct tr_scheduler *s = ctx;
	struct tr_job_row row = {0};
	int rc = load_job(s, id, &row, err);
	if (rc == 0)
		rc = tr_job_check(id, row.state, TR_JOB_DELETE, NULL, err);
	struct tr_error se = {0};
	if (rc == 0 && tr_store_job_delete(s->cfg.store, id, &se) < 0)
		rc = tr_job_fail(err, TR_JOB_E_STORAGE, "", "%s", se.message);
	tr_job_row_finish(&row);
	return rc < 0 ? -1 : 0;
}

static int op_devices(void *ctx, struct tr_api_device *out, int max)
{
	struct tr_scheduler *s = ctx;
	tr_backend_t *be = s->cfg.backend;
	/* Only the owners are read under the lock, which every training step
	 * takes (on_progress): the memory query (a file read for CPU devices,
	 * cudaMemGetInfo for GPUs) is done without it, so a dashboard's poll
	 * never holds up a step. */
	int64_t owner[TR_MAX_POOL_DEVICES] = {0};
	pthread_mutex_lock(&s->lock);
	int ndev = s->ndev < TR_MAX_POOL_DEVICES ? s->ndev : TR_MAX_POOL_DEVICES;
	if (ndev > max)
		ndev = max;
	for (int d = 0; d < ndev; d++)
		owner[d] = s->owner[d];
	pthread_mutex_unlock(&s->lock);
	for (int d = 0; d < ndev; d++) {
		struct tr_api_device *dev = &out[d];
		size_t total = 0, free_bytes = 0;
		*dev = (struct tr_api_device){.id = d, .kind = be->i->name, .job = owner[d]};
		be->i->device_name(be, d, dev->name, sizeof dev->name);
		dev->have_memory = be->i->memory_info && be->i->memory_info(be, d, &total, &free_bytes) == 0 &&
				   total > 0;
		if (dev->have_memory) {
			dev->memory_total = total;
			dev->memory_free = free_bytes;
		}
	}
	return ndev;
}

static bool op_live_progress(void *ctx, int64_t id, struct tr_api_live *out)
{
	struct tr_scheduler *s = ctx;
	pthread_mutex_lock(&s->lock);
	struct running_job *j = find_running(s, id);
	bool have = j && j->have_progress;
	if (have) {
		const struct tr_progress *p = &j->progress;
		*out = (struct tr_api_live){
			.step = p->step,
			.total_steps = p->total_steps,
			.epoch = p->epoch,
			.epochs = p->epochs,
			.samples_per_sec = p->samples_per_sec,
			.elapsed_s = p->elapsed_s,
			.eta_s = p->eta_s,
			.data_wait_fraction = p->data_wait_fraction,
			.loss = p->loss,
		};
	}
	pthread_mutex_unlock(&s->lock);
	return have;
}

static bool op_ready(void *ctx)
{
	struct tr_scheduler *s = ctx;
	return atomic_load(&s->ready);
}

void tr_scheduler_api_ops(tr_scheduler_t *s, struct tr_api_ops *ops, void **ctx)
{
	*ops = (struct tr_api_ops){
		.submit = op_submit,
		.control = op_control,
		.set_priority = op_set_priority,
		.remove = op_remove,
		.devices = op_devices,
		.live_progress = op_live_progress,
		.ready = op_ready,
		.checkpoint_now = op_checkpoint_now,
		.evaluate = tr_eval_op,
		.report = tr_report_op,
		.report_folder = tr_report_folder_op,
	};
	*ctx = s;
}

int tr_scheduler_submit_if_empty(tr_scheduler_t *s, const char *path, struct tr_error *err)
{
	struct tr_job_row *rows = NULL;
	int n = 0;
	struct tr_error se = {0};
	int rc = tr_store_job_list(s->cfg.store, NULL, 0, 1, &rows, &n, &se);
	if (rc < 0)
		return tr_error_set(err, rc, 0, NULL, "store: %s", se.message);
	for (int i = 0; i < n; i++)
		tr_job_row_finish(&rows[i]);
	free(rows);
	if (n > 0)
		return 0;
	json_error_t jerr;
	json_t *doc = json_load_file(path, 0, &jerr);
	if (!doc)
		return tr_error_set(err, -EINVAL, 0, NULL, "%s:%d:%d: %s", path, jerr.line, jerr.column, jerr.text);
	char *body = tr_json_dumps(doc, JSON_COMPACT);
	struct tr_api_submit req = {.spec = doc, .body = body, .body_len = body ? strlen(body) : 0};
	struct tr_error aerr = {0};
	int64_t id;
	bool replayed;
	rc = op_submit(s, &req, &id, &replayed, &aerr);
	if (rc < 0)
		tr_error_set(err, rc, 0, NULL, "%s: %s", path, aerr.message);
	else
		tr_log(TR_LOG_NOTICE, "the queue was empty: submitted %s as job %lld", path, (long long)id);
	free(body);
	json_decref(doc);
	return rc;
}
