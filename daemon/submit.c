/* The API operations that change the queue: submit, control, priority,
 * delete, plus the read-only device and live-progress views.  Every
 * refusal carries an HTTP status, a code and, for spec problems, the JSON
 * pointer of the offending value. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/log.h"
#include "daemon/scheduler_internal.h"
#include "engine/rng.h"
#include "storage/checkpoints.h"

static int refuse(struct tr_api_error *e, int status, const char *code, const char *pointer, const char *fmt, ...)
{
	e->status = status;
	snprintf(e->code, sizeof e->code, "%s", code);
	snprintf(e->pointer, sizeof e->pointer, "%s", pointer ? pointer : "");
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(e->message, sizeof e->message, fmt, ap);
	va_end(ap);
	return -1;
}

bool tr_state_is_terminal(const char *state)
{
	return strcmp(state, "completed") == 0 || strcmp(state, "failed") == 0 || strcmp(state, "cancelled") == 0;
}

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

static int check_devices(struct tr_scheduler *s, const struct tr_spec *spec, struct tr_api_error *err)
{
	if (spec->n_device_ids > 0) {
		for (int i = 0; i < spec->n_device_ids; i++) {
			if (spec->device_ids[i] >= s->ndev) {
				char ptr[32];
				snprintf(ptr, sizeof ptr, "/devices/%d", i);
				return refuse(err, 422, "unsatisfiable", ptr,
					      "%s: device %d does not exist; this daemon has devices 0..%d", ptr,
					      spec->device_ids[i], s->ndev - 1);
			}
		}
	} else if (spec->device_count > s->ndev) {
		return refuse(err, 422, "unsatisfiable", "/devices",
			      "/devices: %d devices requested, this daemon has %d", spec->device_count, s->ndev);
	}
	const char *have = s->cfg.backend->i->name;
	/* Only on refusal: asking the driver costs a few milliseconds. */
	if (spec->backend == TR_BACKEND_CUDA && strcmp(have, "cuda") != 0)
		return refuse(err, 422, "backend_unavailable", "/backend",
			      "/backend: cuda requested, but this daemon runs on %s devices (%s)", have,
			      tr_cuda_available() ? "a GPU is visible, but the daemon was started with --backend cpu or "
						    "could not use it: see its log"
						  : "no usable GPU");
	if (spec->backend == TR_BACKEND_CPU && strcmp(have, "cpu") != 0)
		return refuse(err, 422, "backend_unavailable", "/backend",
			      "/backend: cpu requested, but this daemon's devices are %s", have);
	return 0;
}

static int op_submit(void *ctx, const struct tr_api_submit *req, int64_t *job_id, bool *replayed,
		     struct tr_api_error *err)
{
	struct tr_scheduler *s = ctx;
	struct tr_spec spec;
	struct tr_spec_error serr;
	*replayed = false;
	if (tr_spec_parse(req->spec, &spec, &serr) < 0)
		return refuse(err, 400, "invalid_spec", serr.pointer, "%s", serr.message);
	char pointer[256], msg[768];
	int rc = check_devices(s, &spec, err);
	if (rc == 0 && tr_resolve_spec_paths(s, &spec, pointer, sizeof pointer, msg, sizeof msg) < 0)
		rc = refuse(err, 422, "invalid_path", pointer, "%s", msg);
	if (rc == 0 && spec.init_job > 0) {
		struct tr_ckpt_row ck = {0};
		if (tr_store_ckpt_get(s->cfg.store, spec.init_job, spec.init_step, &ck) < 0) {
			if (spec.init_step >= 0)
				rc = refuse(err, 422, "invalid_init", "/init/from",
					    "/init/from: job %lld has no checkpoint at step %lld", (long long)spec.init_job,
					    (long long)spec.init_step);
			else
				rc = refuse(err, 422, "invalid_init", "/init/from",
					    "/init/from: job %lld does not exist or has no checkpoint yet",
					    (long long)spec.init_job);
		}
		tr_ckpt_row_finish(&ck);
	}
	if (rc < 0) {
		tr_spec_finish(&spec);
		return rc;
	}
	json_t *norm = tr_spec_to_json(&spec);
	char *norm_text = json_dumps(norm, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(9));
	/* "The spec as given": the request's own text when it is there. */
	char *spec_text = req->body ? strndup(req->body, req->body_len)
				    : json_dumps(req->spec, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
	json_decref(norm);
	char digest[33];
	body_digest(req->body ? req->body : "", req->body_len, digest);
	struct tr_job_row row = {
		.name = spec.name,
		.state = "queued",
		.priority = req->priority,
		.spec = spec_text,
		.normalized = norm_text,
		.devices = "[]",
		.idempotency_key = (char *)req->idempotency_key,
		.request_hash = digest,
		.loss = NAN,
	};
	int64_t existing = 0;
	rc = tr_store_job_insert_bounded(s->cfg.store, &row, s->cfg.max_queued, &existing);
	if (rc == -EAGAIN) {
		tr_log(TR_LOG_WARNING, "submit refused: %s", tr_store_error(s->cfg.store));
		rc = refuse(err, 503, "queue_full", "", "%s; retry when some have started", tr_store_error(s->cfg.store));
	} else if (rc == -EEXIST) {
		struct tr_job_row old = {0};
		rc = tr_store_job_get(s->cfg.store, existing, &old);
		if (rc == 0 && old.request_hash && strcmp(old.request_hash, digest) == 0) {
			*job_id = existing;
			*replayed = true;
		} else if (rc == 0) {
			rc = refuse(err, 409, "idempotency_conflict", "",
				    "Idempotency-Key '%s' was used for job %lld with a different request body",
				    req->idempotency_key, (long long)existing);
		} else {
			rc = refuse(err, 500, "internal", "", "store: %s", tr_store_error(s->cfg.store));
		}
		tr_job_row_finish(&old);
	} else if (rc < 0) {
		rc = refuse(err, 503, "storage_unavailable", "", "cannot store the job: %s",
			    tr_store_error(s->cfg.store));
	} else {
		*job_id = row.id;
		tr_store_log_append(s->cfg.store, row.id, TR_LOG_INF, "submitted");
		tr_log(TR_LOG_INF, "job %lld (%s) submitted", (long long)row.id, spec.name ? spec.name : "job");
		tr_sched_kick(s);
	}
	free(spec_text);
	free(norm_text);
	tr_spec_finish(&spec);
	return rc < 0 ? -1 : 0;
}

/* Reads job id into row; refuses with 404 or 503 when it cannot. */
static int load_job(struct tr_scheduler *s, int64_t id, struct tr_job_row *row, struct tr_api_error *err)
{
	int rc = tr_store_job_get(s->cfg.store, id, row);
	if (rc == -ENOENT)
		return refuse(err, 404, "not_found", "", "job %lld not found", (long long)id);
	if (rc < 0)
		return refuse(err, 503, "storage_unavailable", "", "%s", tr_store_error(s->cfg.store));
	return 0;
}

static struct running_job *find_running(struct tr_scheduler *s, int64_t id)
{
	for (struct running_job *j = s->running; j; j = j->next)
		if (j->id == id)
			return j;
	return NULL;
}

static int op_control(void *ctx, int64_t id, enum tr_job_control op, struct tr_api_error *err)
{
	struct tr_scheduler *s = ctx;
	static const char *names[] = {"cancelled", "stopped", "paused", "resumed"};
	pthread_mutex_lock(&s->lock);
	struct tr_job_row row = {0};
	int rc = load_job(s, id, &row, err);
	if (rc < 0) {
		/* refused by load_job */
	} else if (tr_state_is_terminal(row.state)) {
		rc = refuse(err, 409, "conflict", "", "job %lld is %s; it cannot be %s", (long long)id, row.state,
			    names[op]);
	} else if (op == TR_CONTROL_RESUME) {
		if (strcmp(row.state, "paused") != 0)
			rc = refuse(err, 409, "conflict", "", "job %lld is %s, not paused", (long long)id, row.state);
		else if (tr_store_job_set_state(s->cfg.store, id, "queued", NULL, "[]") < 0)
			rc = refuse(err, 503, "storage_unavailable", "", "%s", tr_store_error(s->cfg.store));
		else {
			tr_store_log_append(s->cfg.store, id, TR_LOG_NOTICE,
					    "resumed: queued; it continues from its newest checkpoint");
			s->dirty = true;
			pthread_cond_broadcast(&s->wake);
		}
	} else if (strcmp(row.state, "paused") == 0) {
		if (op == TR_CONTROL_CANCEL) {
			/* Held and shown when storage refuses it (the job must
			 * not come back), like every cancel below. */
			rc = tr_store_job_record_state(s->cfg.store, id, "cancelled",
						       "{\"code\":\"cancelled\",\"message\":\"cancelled while paused\"}",
						       NULL);
			if (rc < 0)
				rc = refuse(err, 503, "storage_unavailable", "", "%s", tr_store_error(s->cfg.store));
		} else {
			rc = refuse(err, 409, "conflict", "", "job %lld is already paused", (long long)id);
		}
	} else if (op == TR_CONTROL_PAUSE &&
		   (strcmp(row.state, "queued") == 0 || strcmp(row.state, "interrupted") == 0)) {
		/* Not running: it simply waits out of the queue. */
		if (tr_store_job_set_state(s->cfg.store, id, "paused", NULL, NULL) < 0)
			rc = refuse(err, 503, "storage_unavailable", "", "%s", tr_store_error(s->cfg.store));
		else
			tr_store_log_append(s->cfg.store, id, TR_LOG_NOTICE, "paused while queued");
	} else if (strcmp(row.state, "queued") == 0 || strcmp(row.state, "interrupted") == 0) {
		/* Cancel or stop before it ran: nothing to wind down. */
		rc = tr_store_job_record_state(s->cfg.store, id, "cancelled",
					       "{\"code\":\"cancelled\",\"message\":\"cancelled before it started\"}",
					       NULL);
		if (rc >= 0)
			tr_store_log_append(s->cfg.store, id, TR_LOG_NOTICE, "cancelled while queued");
		else
			rc = refuse(err, 503, "storage_unavailable", "", "%s", tr_store_error(s->cfg.store));
	} else {
		struct running_job *j = find_running(s, id);
		if (!j) {
			rc = refuse(err, 409, "conflict", "", "job %lld is %s and not running here", (long long)id,
				    row.state);
		} else if (op == TR_CONTROL_PAUSE) {
			/* A stop whose final checkpoint is the resume point; the runner
			 * records the job as paused and frees its devices. */
			atomic_store(&j->pause_requested, true);
			atomic_store(&j->stop_requested, true);
			if (j->trainer)
				tr_trainer_stop_for(j->trainer, TR_STOP_PAUSE);
			tr_store_log_append(s->cfg.store, id, TR_LOG_NOTICE,
					    "pause requested: checkpointing at the next step boundary");
		} else if (op == TR_CONTROL_CANCEL) {
			atomic_store(&j->cancel_requested, true);
			if (j->trainer)
				tr_trainer_cancel(j->trainer);
			tr_store_log_append(s->cfg.store, id, TR_LOG_NOTICE, "cancel requested");
		} else {
			if (strcmp(row.state, "stopping") != 0) {
				atomic_store(&j->stop_requested, true);
				if (j->trainer)
					tr_trainer_stop(j->trainer);
				tr_store_job_record_state(s->cfg.store, id, "stopping", NULL, NULL);
				tr_store_log_append(s->cfg.store, id, TR_LOG_NOTICE,
						    "stop requested: finishing the current step");
			}
		}
	}
	pthread_mutex_unlock(&s->lock);
	tr_job_row_finish(&row);
	return rc < 0 ? -1 : 0;
}

static int op_checkpoint_now(void *ctx, int64_t id, struct tr_api_error *err)
{
	struct tr_scheduler *s = ctx;
	int rc = 0;
	pthread_mutex_lock(&s->lock);
	struct running_job *j = find_running(s, id);
	if (j && j->trainer) {
		tr_trainer_request_checkpoint(j->trainer);
	} else {
		struct tr_job_row row = {0};
		if (tr_store_job_get(s->cfg.store, id, &row) == -ENOENT)
			rc = refuse(err, 404, "not_found", "", "job %lld not found", (long long)id);
		else
			rc = refuse(err, 409, "conflict", "", "job %lld is %s; only a running job can take a checkpoint",
				    (long long)id, row.state ? row.state : "not running");
		tr_job_row_finish(&row);
	}
	pthread_mutex_unlock(&s->lock);
	if (rc == 0)
		tr_store_log_append(s->cfg.store, id, TR_LOG_INF, "checkpoint requested");
	return rc < 0 ? -1 : 0;
}

static int op_set_priority(void *ctx, int64_t id, int priority, struct tr_api_error *err)
{
	struct tr_scheduler *s = ctx;
	struct tr_job_row row = {0};
	int rc = load_job(s, id, &row, err);
	if (rc == 0 && tr_state_is_terminal(row.state))
		rc = refuse(err, 409, "conflict", "/priority", "job %lld is %s; its priority no longer matters",
			    (long long)id, row.state);
	if (rc == 0 && tr_store_job_set_priority(s->cfg.store, id, priority) < 0)
		rc = refuse(err, 503, "storage_unavailable", "", "%s", tr_store_error(s->cfg.store));
	tr_job_row_finish(&row);
	if (rc == 0)
		tr_sched_kick(s);
	return rc < 0 ? -1 : 0;
}

static int op_remove(void *ctx, int64_t id, struct tr_api_error *err)
{
	struct tr_scheduler *s = ctx;
	struct tr_job_row row = {0};
	int rc = load_job(s, id, &row, err);
	if (rc == 0 && !tr_state_is_terminal(row.state))
		rc = refuse(err, 409, "conflict", "", "job %lld is %s; cancel it before deleting it", (long long)id,
			    row.state);
	if (rc == 0 && tr_store_job_delete(s->cfg.store, id) < 0)
		rc = refuse(err, 503, "storage_unavailable", "", "%s", tr_store_error(s->cfg.store));
	tr_job_row_finish(&row);
	return rc < 0 ? -1 : 0;
}

static json_t *op_devices(void *ctx)
{
	struct tr_scheduler *s = ctx;
	tr_backend_t *be = s->cfg.backend;
	json_t *list = json_array();
	pthread_mutex_lock(&s->lock);
	for (int d = 0; d < s->ndev; d++) {
		char name[128];
		size_t total = 0, free_bytes = 0;
		be->i->device_name(be, d, name, sizeof name);
		bool mem = be->i->memory_info && be->i->memory_info(be, d, &total, &free_bytes) == 0 && total > 0;
		json_array_append_new(list, json_pack("{s:i, s:s, s:s, s:o, s:o, s:o}", "id", d, "name", name, "kind",
						       be->i->name, "memory_total",
						       mem ? json_integer((json_int_t)total) : json_null(), "memory_free",
						       mem ? json_integer((json_int_t)free_bytes) : json_null(), "job",
						       s->owner[d] ? json_integer(s->owner[d]) : json_null()));
	}
	pthread_mutex_unlock(&s->lock);
	return list;
}

static json_t *op_live_progress(void *ctx, int64_t id)
{
	struct tr_scheduler *s = ctx;
	json_t *out = NULL;
	pthread_mutex_lock(&s->lock);
	struct running_job *j = find_running(s, id);
	if (j && j->have_progress) {
		const struct tr_progress *p = &j->progress;
		out = json_pack("{s:I, s:I, s:I, s:f, s:f, s:f, s:f}", "step", (json_int_t)p->step, "total_steps",
				(json_int_t)p->total_steps, "epoch", (json_int_t)p->epoch, "samples_per_sec",
				p->samples_per_sec, "elapsed_s", p->elapsed_s, "eta_s", p->eta_s, "data_wait_fraction",
				p->data_wait_fraction);
		if (out && p->epochs > 0)
			json_object_set_new(out, "epochs", json_integer(p->epochs));
		if (out && isfinite(p->loss))
			json_object_set_new(out, "loss", json_real(p->loss));
	}
	pthread_mutex_unlock(&s->lock);
	return out;
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
	};
	*ctx = s;
}

int tr_scheduler_submit_if_empty(tr_scheduler_t *s, const char *path, char *err, size_t errlen)
{
	struct tr_job_row *rows = NULL;
	int n = 0;
	if (tr_store_job_list(s->cfg.store, NULL, 0, 1, &rows, &n) < 0) {
		snprintf(err, errlen, "store: %s", tr_store_error(s->cfg.store));
		return -1;
	}
	for (int i = 0; i < n; i++)
		tr_job_row_finish(&rows[i]);
	free(rows);
	if (n > 0)
		return 0;
	json_error_t jerr;
	json_t *doc = json_load_file(path, 0, &jerr);
	if (!doc) {
		snprintf(err, errlen, "%s:%d:%d: %s", path, jerr.line, jerr.column, jerr.text);
		return -1;
	}
	char *body = json_dumps(doc, JSON_COMPACT);
	struct tr_api_submit req = {.spec = doc, .body = body, .body_len = body ? strlen(body) : 0};
	struct tr_api_error aerr = {0};
	int64_t id;
	bool replayed;
	int rc = op_submit(s, &req, &id, &replayed, &aerr);
	if (rc < 0)
		snprintf(err, errlen, "%s: %s", path, aerr.message);
	else
		tr_log(TR_LOG_NOTICE, "the queue was empty: submitted %s as job %lld", path, (long long)id);
	free(body);
	json_decref(doc);
	return rc;
}
