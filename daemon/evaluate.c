/* Evaluate jobs: a job's checkpoint on a data source, as a short job of
 * its own kind (POST /jobs/{id}/evaluate).
 *
 * An evaluate job is a row of the jobs table like any other, so it has a
 * state, a log, devices from the scheduler, cancel and delete; its spec is
 * {"kind": "evaluate", "job": ID, "checkpoint": ..., "step": S, "data":
 * SOURCE, "devices": N, "batch_size": B}, the checkpoint being resolved to
 * its step when the request comes, so that the job evaluates what was
 * asked for even if the trained job goes on.  Its runner reads the
 * checkpoint's model description (engine/model_meta.h), runs the data
 * through tr_infer_run on its devices, and stores the figures as the
 * job's result (storage: job_results) and as metric points at the
 * checkpoint's step.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/json_text.h"
#include "daemon/log.h"
#include "daemon/scheduler_internal.h"
#include "engine/infer.h"
#include "engine/model_meta.h"
#include "storage/checkpoints.h"

#define EVAL_MAX_DEVICES 64
#define EVAL_MAX_BATCH (1 << 20)

bool tr_eval_spec_is(const char *normalized)
{
	/* A training spec has no "kind" (unknown keys are refused). */
	if (!normalized || !strstr(normalized, "\"kind\""))
		return false;
	json_t *j = json_loads(normalized, 0, NULL);
	const char *kind = json_string_value(json_object_get(j, "kind"));
	bool yes = kind && strcmp(kind, "evaluate") == 0;
	json_decref(j);
	return yes;
}

static int get_int(const json_t *body, const char *key, int lo, int hi, int def, int *out, struct tr_error *err)
{
	const json_t *v = json_object_get(body, key);
	if (!v) {
		*out = def;
		return 0;
	}
	if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
		return tr_job_fail(err, TR_JOB_E_INVALID_REQUEST, key[0] == 'd' ? "/devices" : "/batch_size",
				   "/%s: must be an integer from %d to %d", key, lo, hi);
	*out = (int)json_integer_value(v);
	return 0;
}

int tr_eval_submit(struct tr_scheduler *s, int64_t job_id, const json_t *body, int64_t *eval_id, struct tr_error *err)
{
	tr_store_t *st = s->cfg.store;
	const char *key;
	const json_t *v;
	json_object_foreach((json_t *)body, key, v) {
		if (strcmp(key, "data") && strcmp(key, "checkpoint") && strcmp(key, "devices") &&
		    strcmp(key, "batch_size") && strcmp(key, "name")) {
			char ptr[300];
			snprintf(ptr, sizeof ptr, "/%s", key);
			return tr_job_fail(err, TR_JOB_E_INVALID_REQUEST, ptr,
					   "%s: unknown key (expected data, checkpoint, devices, batch_size, name)",
					   ptr);
		}
	}
	const json_t *data = json_object_get(body, "data");
	if (!json_is_object(data))
		return tr_job_fail(
			err, TR_JOB_E_INVALID_REQUEST, "/data",
			"/data: required: a data source as in a job's data.train, e.g. {\"format\": \"csv\", "
			"\"path\": \"test.csv\"}");
	int devices = 0, batch = 0; /* set by the parse below before any use */
	if (get_int(body, "devices", 1, s->ndev < EVAL_MAX_DEVICES ? s->ndev : EVAL_MAX_DEVICES, 1, &devices, err) <
		    0 ||
	    get_int(body, "batch_size", 1, EVAL_MAX_BATCH, 256, &batch, err) < 0)
		return -1;
	const json_t *name = json_object_get(body, "name");
	if (name &&
	    (!json_is_string(name) || json_string_length(name) < 1 || json_string_length(name) > TR_SPEC_MAX_NAME))
		return tr_job_fail(err, TR_JOB_E_INVALID_REQUEST, "/name", "/name: must be a string of 1 to %d bytes",
				   TR_SPEC_MAX_NAME);

	/* Which checkpoint: resolved to a step now. */
	const json_t *ck = json_object_get(body, "checkpoint");
	int64_t want = -1;
	const char *ck_name = "latest";
	if (json_is_string(ck) && strcmp(json_string_value(ck), "best") == 0) {
		want = TR_CKPT_BEST;
		ck_name = "best";
	} else if (json_is_integer(ck) && json_integer_value(ck) >= 0) {
		want = json_integer_value(ck);
		ck_name = NULL;
	} else if (ck && !(json_is_string(ck) && strcmp(json_string_value(ck), "latest") == 0)) {
		return tr_job_fail(err, TR_JOB_E_INVALID_REQUEST, "/checkpoint",
				   "/checkpoint: must be \"latest\", \"best\" or a step (an integer >= 0)");
	}
	struct tr_job_row target = {0};
	struct tr_error se = {0};
	int rc = tr_store_job_get(st, job_id, &target, &se);
	if (rc == -ENOENT)
		return tr_job_fail(err, TR_JOB_E_NOT_FOUND, "", "job %lld not found", (long long)job_id);
	if (rc < 0)
		return tr_job_fail(err, TR_JOB_E_STORAGE, "", "%s", se.message);
	if (tr_eval_spec_is(target.normalized)) {
		tr_job_row_finish(&target);
		return tr_job_fail(err, TR_JOB_E_ILLEGAL, "", "job %lld is an evaluate job; it has no checkpoints",
				   (long long)job_id);
	}
	struct tr_ckpt_row row = {0};
	rc = tr_store_ckpt_get(st, job_id, want, &row, &se);
	int64_t step = row.step;
	tr_ckpt_row_finish(&row);
	if (rc < 0) {
		tr_job_row_finish(&target);
		if (rc != -ENOENT)
			return tr_job_fail(err, TR_JOB_E_STORAGE, "", "%s", se.message);
		if (ck_name)
			return tr_job_fail(err, TR_JOB_E_NO_CHECKPOINT, "/checkpoint",
					   "/checkpoint: job %lld has no %s checkpoint%s", (long long)job_id, ck_name,
					   want == TR_CKPT_BEST ? " (best needs early_stopping)" : " yet");
		return tr_job_fail(err, TR_JOB_E_NO_CHECKPOINT, "/checkpoint",
				   "/checkpoint: job %lld has no checkpoint at step %lld", (long long)job_id,
				   (long long)want);
	}

	/* The source is checked as a job's data.train would be, against the
	 * trained job's model, and its files must open in the data roots. */
	json_t *tnorm = json_loads(target.normalized ? target.normalized : "{}", 0, NULL);
	struct tr_spec spec;
	struct tr_error serr;
	rc = tr_model_source_parse(json_object_get(tnorm, "model"), NULL, data, &spec, &serr);
	json_decref(tnorm);
	if (rc < 0) {
		char ptr[300];
		snprintf(ptr, sizeof ptr, "/data%s", serr.pointer);
		tr_job_row_finish(&target);
		return tr_job_fail(err, TR_JOB_E_INVALID_SPEC, ptr, "/data%s", serr.message);
	}
	struct tr_error perr;
	if (tr_resolve_spec_paths(s, &spec, &perr) < 0) {
		tr_spec_finish(&spec);
		tr_job_row_finish(&target);
		/* "/data/train/path" of the spec parser is "/data/path" here. */
		const char *p = strncmp(perr.pointer, "/data/train", 11) == 0 ? perr.pointer + 11 : perr.pointer;
		const char *m = strncmp(perr.message, "/data/train", 11) == 0 ? perr.message + 11 : perr.message;
		char ptr[300];
		snprintf(ptr, sizeof ptr, "/data%.255s", p);
		return tr_job_fail(err, TR_JOB_E_INVALID_PATH, ptr, "/data%s", m);
	}
	tr_spec_finish(&spec);

	char gen_name[TR_SPEC_MAX_NAME + 32];
	snprintf(gen_name, sizeof gen_name, "%.*s-eval", TR_SPEC_MAX_NAME - 5, target.name ? target.name : "job");
	tr_job_row_finish(&target);
	json_t *norm = json_pack("{s:s, s:I, s:s?, s:I, s:O, s:i, s:i}", "kind", "evaluate", "job", (json_int_t)job_id,
				 "checkpoint", ck_name, "step", (json_int_t)step, "data", data, "devices", devices,
				 "batch_size", batch);
	if (norm && !ck_name)
		json_object_set_new(norm, "checkpoint", json_integer(step));
	json_t *given = json_deep_copy(body);
	if (given) {
		json_object_set_new(given, "kind", json_string("evaluate"));
		json_object_set_new(given, "job", json_integer(job_id));
	}
	char *norm_text = norm ? json_dumps(norm, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(9)) : NULL;
	char *spec_text = given ? tr_json_dumps(given, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
	json_decref(norm);
	json_decref(given);
	if (!norm_text || !spec_text) {
		free(norm_text);
		free(spec_text);
		return tr_job_fail(err, TR_JOB_E_INTERNAL, "", "out of memory");
	}
	struct tr_job_row jr = {
		.name = name ? (char *)json_string_value(name) : gen_name,
		.state = TR_JOB_QUEUED,
		.spec = spec_text,
		.normalized = norm_text,
		.devices = "[]",
		.loss = NAN,
	};
	int64_t existing = 0;
	rc = tr_store_job_insert_bounded(st, &jr, s->cfg.max_queued, &existing, &se);
	free(norm_text);
	free(spec_text);
	if (rc == -EAGAIN)
		return tr_job_fail(err, TR_JOB_E_QUEUE_FULL, "", "%s; retry when some have started", se.message);
	if (rc < 0)
		return tr_job_fail(err, TR_JOB_E_STORAGE, "", "cannot store the job: %s", se.message);
	*eval_id = jr.id;
	char line[160];
	snprintf(line, sizeof line, "submitted: evaluate job %lld's checkpoint at step %lld", (long long)job_id,
		 (long long)step);
	tr_store_log_append(st, jr.id, TR_LOG_INF, line, NULL);
	tr_log(TR_LOG_INF, "job %lld (evaluate job %lld, step %lld) submitted", (long long)jr.id, (long long)job_id,
	       (long long)step);
	tr_sched_kick(s);
	return 0;
}

int tr_eval_prepare(struct running_job *j, const char *normalized, struct tr_error *err)
{
	memset(&j->spec, 0, sizeof j->spec);
	j->eval = json_loads(normalized, 0, NULL);
	int devices = (int)json_integer_value(json_object_get(j->eval, "devices"));
	if (!json_is_object(j->eval) || devices < 1 || !json_is_object(json_object_get(j->eval, "data"))) {
		snprintf(err->message, sizeof err->message, "not a valid evaluate job");
		json_decref(j->eval);
		j->eval = NULL;
		return -EINVAL;
	}
	/* What the scheduler reads to reserve devices. */
	j->spec.device_count = devices;
	return 0;
}

/* ---- the runner ---------------------------------------------------------- */

struct eval_run {
	struct running_job *j;
	struct tr_eval_acc acc;
	int64_t batches, total;
	double started;
	char err[768]; /* a struct tr_error message fits */
};

static double mono_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int on_batch(void *ctx, int64_t first, int rows, const float *out, const float *labels, int label_dim)
{
	struct eval_run *e = ctx;
	if (!labels || label_dim != (e->acc.classification ? 1 : e->acc.outputs)) {
		snprintf(e->err, sizeof e->err, "/data: the data has %d label column(s), the model needs %d", label_dim,
			 e->acc.classification ? 1 : e->acc.outputs);
		return -EINVAL;
	}
	struct tr_error why;
	int rc = tr_eval_acc_add(&e->acc, first, rows, out, labels, &why);
	if (rc < 0) {
		snprintf(e->err, sizeof e->err, "%s", why.message);
		return rc;
	}
	/* Progress in batches, for GET /jobs/{id} while it runs. */
	struct tr_scheduler *s = e->j->sched;
	e->batches++;
	pthread_mutex_lock(&s->lock);
	e->j->progress.step = e->batches;
	e->j->progress.total_steps = e->total;
	e->j->progress.elapsed_s = mono_s() - e->started;
	e->j->have_progress = true;
	pthread_mutex_unlock(&s->lock);
	return 0;
}

/* Stores the figures: the result object, and each number as a metric
 * point at the checkpoint's step. */
static void store_result(struct running_job *j, json_t *figures, int64_t step)
{
	tr_store_t *st = j->sched->cfg.store;
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	double wall = now.tv_sec + now.tv_nsec / 1e9;
	const char *key;
	json_t *v;
	json_object_foreach(figures, key, v) {
		if (json_is_real(v))
			tr_store_metric_append(st, j->id, key, step, 0, wall, json_real_value(v), NULL);
	}
	char *text = json_dumps(figures, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
	struct tr_error e = {.message = "out of memory"};
	if (!text || tr_store_job_result_set(st, j->id, text, &e) < 0)
		tr_log(TR_LOG_WARN, "job %lld: cannot store its result: %s", (long long)j->id, e.message);
	free(text);
}

static void *eval_main(void *arg)
{
	struct running_job *j = arg;
	struct tr_scheduler *s = j->sched;
	tr_store_t *st = s->cfg.store;
	struct eval_run e = {.j = j, .started = mono_s()};
	struct tr_model_desc d;
	struct tr_spec spec;
	struct tr_ckpt_row row = {0};
	tr_reader_t *rd = NULL;
	void *blob = NULL;
	size_t len = 0;
	char err[1536] = "", line[256];
	struct tr_error why;      /* the engine's, copied into err */
	struct tr_error se = {0}; /* the store's, likewise */
	const char *code = "evaluation_failed";
	memset(&d, 0, sizeof d);
	memset(&spec, 0, sizeof spec);
	char tname[16];
	snprintf(tname, sizeof tname, "tr-eval%lld", (long long)j->id);
	pthread_setname_np(pthread_self(), tname);

	int64_t target = json_integer_value(json_object_get(j->eval, "job"));
	int64_t step = json_integer_value(json_object_get(j->eval, "step"));
	int rc = tr_store_ckpt_get(st, target, step, &row, &se);
	if (rc == 0)
		rc = tr_store_ckpt_load(st, &row, &blob, &len, &se);
	if (rc < 0) {
		snprintf(err, sizeof err, "job %lld's checkpoint at step %lld cannot be read: %s", (long long)target,
			 (long long)step, rc == -ENOENT ? "it was deleted" : se.message);
		code = "no_checkpoint";
		goto fail;
	}
	char label[64];
	snprintf(label, sizeof label, "job %lld step %lld", (long long)target, (long long)step);
	if ((rc = tr_model_desc_load_mem(blob, len, label, &d, &why)) < 0) {
		snprintf(err, sizeof err, "%s", why.message);
		code = "invalid_model";
		goto fail;
	}
	free(blob);
	blob = NULL;
	struct tr_error serr;
	if ((rc = tr_model_source_parse(NULL, &d, json_object_get(j->eval, "data"), &spec, &serr)) < 0) {
		snprintf(err, sizeof err, "/data%s", serr.message);
		code = "invalid_spec";
		goto fail;
	}
	if (tr_resolve_spec_paths(s, &spec, &serr) < 0) {
		snprintf(err, sizeof err, "%s", serr.message);
		code = "invalid_path";
		rc = -ENOENT;
		goto fail;
	}
	if ((rc = tr_model_desc_source(&d, &spec.train, &why)) < 0) {
		/* "/degrade: ..." is the data spec's; the rest the model's */
		snprintf(err, sizeof err, "%s%s", why.message[0] == '/' ? "/data" : "", why.message);
		code = why.message[0] == '/' ? "invalid_spec" : "invalid_model";
		goto fail;
	}
	if ((rc = tr_reader_open(&spec.train, d.spec.seed, s->roots, &j->cancel_requested, &rd, &why)) < 0) {
		snprintf(err, sizeof err, "%s", why.message);
		code = rc == -ECANCELED ? "cancelled" : "invalid_data";
		goto fail;
	}
	if ((rc = tr_model_desc_check_classes(&d, rd, &why)) < 0) {
		snprintf(err, sizeof err, "%s: %s", rd->name, why.message);
		code = "invalid_data";
		goto fail;
	}
	snprintf(line, sizeof line, "evaluating job %lld's checkpoint at step %lld on %lld samples, %d %s device(s)",
		 (long long)target, (long long)step, (long long)rd->info.samples, j->ndev, s->cfg.backend->i->name);
	tr_store_log_append(st, j->id, TR_LOG_INF, line, NULL);
	if ((rc = tr_eval_acc_init(&e.acc, d.classification, d.outputs)) < 0) {
		snprintf(err, sizeof err, "out of memory");
		goto fail;
	}
	int batch = (int)json_integer_value(json_object_get(j->eval, "batch_size"));
	e.total = (rd->info.samples + batch - 1) / batch;
	struct tr_infer_options io = {
		.model = &d.model,
		.params = d.params,
		.backend = s->cfg.backend,
		.device_ids = j->devices,
		.n_device_ids = j->ndev,
		.reader = rd,
		.transforms = d.transforms,
		.batch = batch,
		.cancel = &j->cancel_requested,
		.on_batch = on_batch,
		.ctx = &e,
	};
	rc = tr_infer_run(&io, &why);
	if (rc < 0) {
		snprintf(err, sizeof err, "%s", why.message);
		if (e.err[0])
			snprintf(err, sizeof err, "%s: %s", rd->name, e.err);
		code = rc == -ECANCELED ? "cancelled" : rc == -EINVAL ? "invalid_data" : "evaluation_failed";
		goto fail;
	}
	json_t *figures = tr_eval_acc_json(&e.acc, NULL);
	if (figures) {
		json_t *res = json_pack("{s:I, s:I, s:O?}", "job", (json_int_t)target, "step", (json_int_t)step,
					"checkpoint", json_object_get(j->eval, "checkpoint"));
		json_object_update(res, figures);
		store_result(j, res, step);
		json_decref(res);
		const json_t *loss = json_object_get(figures, "loss"), *acc = json_object_get(figures, "accuracy");
		snprintf(line, sizeof line, "done in %.2f s: loss %.6g", mono_s() - e.started, json_number_value(loss));
		if (acc)
			snprintf(line + strlen(line), sizeof line - strlen(line), ", accuracy %.4f",
				 json_number_value(acc));
		tr_store_log_append(st, j->id, TR_LOG_INF, line, NULL);
		tr_store_job_set_progress(st, j->id, e.batches, e.total, 0, json_number_value(loss), NULL);
	}
	json_decref(figures);
	tr_runner_finish(j, TR_JOB_COMPLETED, NULL, NULL, e.batches);
	goto out;
fail:
	if (rc == -ECANCELED || atomic_load(&j->cancel_requested)) {
		pthread_mutex_lock(&s->lock);
		bool shutdown = s->shutting_down;
		pthread_mutex_unlock(&s->lock);
		if (shutdown)
			tr_runner_finish(j, TR_JOB_INTERRUPTED, NULL, NULL, e.batches);
		else
			tr_runner_finish(j, TR_JOB_CANCELLED, "cancelled", "cancelled by request", e.batches);
	} else {
		tr_runner_finish(j, TR_JOB_FAILED, code, err, e.batches);
	}
out:
	free(blob);
	tr_ckpt_row_finish(&row);
	tr_reader_destroy(rd);
	tr_eval_acc_finish(&e.acc);
	tr_spec_finish(&spec);
	tr_model_desc_finish(&d);
	return NULL;
}

int tr_eval_runner_start(struct running_job *j, struct tr_error *err)
{
	if (pthread_create(&j->thread, NULL, eval_main, j) != 0)
		return tr_error_set(err, -EAGAIN, 0, NULL, "cannot start the job's thread");
	return 0;
}

int tr_eval_op(void *ctx, int64_t job_id, const json_t *body, int64_t *eval_id, struct tr_error *err)
{
	return tr_eval_submit(ctx, job_id, body, eval_id, err);
}
