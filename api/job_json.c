/* The API's job object (docs/design.md §8), built from a store row plus the
 * daemon's live progress.  The row keeps spec, devices and error as JSON
 * text; they are parsed back so clients get objects, not strings.  Times
 * are RFC 3339 UTC with milliseconds, null until they happen.
 */
#include "api/api_internal.h"
#include "api/rcache.h"
#include "core/rfc3339.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

json_t *tr_api_time_json(double t)
{
	char buf[TR_RFC3339_LEN];

	return tr_rfc3339_format(t, buf, sizeof(buf)) ? json_string(buf) : json_null();
}

/* Text the store holds as JSON; a row that is somehow not JSON (a bug
 * elsewhere) is shown as its text rather than hiding the whole job. */
static json_t *parsed(const char *text, json_t *fallback)
{
	json_t *j;

	if (!text)
		return fallback;
	j = json_loads(text, JSON_DECODE_ANY, NULL);
	if (!j) {
		j = json_string(text);
		if (!j)
			return fallback;
	}
	json_decref(fallback);
	return j;
}

static json_t *number_or_null(double v)
{
	json_t *j = isfinite(v) ? json_real(v) : NULL;

	return j ? j : json_null();
}

json_t *tr_api_job_json(const struct tr_job_row *row, const json_t *live)
{
	json_t *job, *progress;

	progress = json_pack("{s:I, s:I, s:I, s:o}", "step", (json_int_t)row->step, "total_steps",
			     (json_int_t)row->total_steps, "epoch", (json_int_t)row->epoch, "loss",
			     number_or_null(row->loss));
	if (!progress)
		return NULL;
	/* Training time over every run that ended (a resumed job's earlier
	 * ones too, without the time it sat paused); a live run adds its own
	 * in tr_api_live_json. */
	if (row->train_s > 0)
		json_object_set_new(progress, "elapsed_s", json_real(row->train_s));
	/* Live values (ETA, throughput, a fresher step) win over the row,
	 * which the runner only writes now and then. */
	if (json_is_object(live))
		json_object_update(progress, (json_t *)live);

	job = json_pack("{s:I, s:s?, s:s?, s:i, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "id", (json_int_t)row->id, "name",
			row->name, "state", tr_job_state_name(row->state), "priority", row->priority, "spec",
			parsed(row->spec, json_null()), "devices", parsed(row->devices, json_array()), "progress",
			progress, "error", parsed(row->error, json_null()), "submitted_at",
			tr_api_time_json(row->submitted_at), "started_at", tr_api_time_json(row->started_at),
			"finished_at", tr_api_time_json(row->finished_at));
	/* Whether the state is an end (core/job.c decides), so that clients
	 * need no list of states of their own. */
	if (job)
		json_object_set_new(job, "terminal", json_boolean(tr_job_state_terminal(row->state)));
	/* What the trainer runs with, as it resolved it: null until then. */
	if (job)
		json_object_set_new(job, "loader_threads",
				    row->loader_threads > 0 ? json_integer(row->loader_threads) : json_null());
	/* Daemon deaths in a row while it ran without a step (max-job-crashes). */
	if (job)
		json_object_set_new(job, "crashes", json_integer(row->crashes));
	/* Priority preemption (daemon/preemption.c): whether the job may be
	 * preempted, and its newest preemption (who, when, how) or null. */
	if (job) {
		json_object_set_new(job, "preemptible", json_boolean(row->preemptible));
		json_object_set_new(job, "preemption", parsed(row->preemption, json_null()));
	}
	/* An experiment's trial names its experiment and index
	 * (docs/experiments.md); plain jobs carry neither. */
	if (job && row->experiment > 0) {
		json_object_set_new(job, "experiment", json_integer(row->experiment));
		json_object_set_new(job, "trial", json_integer(row->trial));
	}
	/* Info fields (api/info.c): named short strings, {} when none. */
	if (job)
		json_object_set_new(job, "info", parsed(row->info, json_object()));
	/* What the job does: "train", or "evaluate" (POST /jobs/{id}/evaluate,
	 * whose spec says so). */
	if (job) {
		const char *kind = json_string_value(json_object_get(json_object_get(job, "spec"), "kind"));
		json_object_set_new(job, "kind",
				    json_string(kind && strcmp(kind, "evaluate") == 0 ? "evaluate" : "train"));
	}
	/* The state shown has happened but is not written yet (storage
	 * fails); only then, so that the usual object is unchanged. */
	if (job && row->state_pending)
		json_object_set_new(job, "state_pending", json_true());
	return job;
}

/* ---- summary ---- */

/* The mean loss of the job's newest epoch (so far, while it runs): a
 * figure for the run, where the last step's loss is one batch's (a
 * 2-sample last step can be far off).  null without loss points. */
static json_t *epoch_loss(tr_store_t *store, int64_t id)
{
	int64_t epoch, n;
	double mean;

	return tr_store_metric_epoch_mean(store, id, "loss", &epoch, &mean, &n, NULL) > 0 && n > 0
		       ? number_or_null(mean)
		       : json_null();
}

/* What the store can tell of a job that is not running here: throughput
 * over the whole run (samples over the recorded steps' time, not the last
 * step's: that one may hold 2 samples), the share of its recorded step
 * time spent waiting for data, and the last epoch's mean loss.  Reads
 * every data_wait_ms and step_ms point, so the rendered answer is kept in
 * the response cache under the job's data generation (a finished job's
 * never changes). */
struct stored_summary {
	tr_store_t *store;
	int64_t id;
};

static int compute_stored(void *ctx, char **out, size_t *len)
{
	struct stored_summary *ss = ctx;
	double wait = 0, step_ms = 0, samples_ms = 0, timed_ms = 0;
	int64_t nw = 0, ns = 0;
	json_t *fraction, *obj;

	if (tr_store_metric_sum(ss->store, ss->id, "data_wait_ms", &wait, &nw, NULL) < 0 ||
	    tr_store_metric_sum(ss->store, ss->id, "step_ms", &step_ms, &ns, NULL) < 0 ||
	    tr_store_metric_dot(ss->store, ss->id, "samples_per_sec", "step_ms", &samples_ms, &timed_ms, NULL) < 0)
		return -EIO;
	fraction = nw > 0 && ns > 0 && step_ms > 0 ? json_real(fmin(1.0, wait / step_ms)) : json_null();
	obj = json_pack("{s:o, s:o, s:o}", "samples_per_sec",
			timed_ms > 0 ? number_or_null(samples_ms / timed_ms) : json_null(), "data_wait_fraction",
			fraction, "epoch_loss", epoch_loss(ss->store, ss->id));
	int rc = obj ? tr_api_render_json(obj, out, len) : -ENOMEM;
	json_decref(obj);
	return rc < 0 ? -ENOMEM : 0;
}

json_t *tr_api_job_summary(tr_api_t *api, const struct tr_job_row *row, const json_t *live)
{
	tr_store_t *store = api->cfg.store;
	json_t *sum, *v;

	/* The stored figures in one read (a dashboard asks for the job
	 * every second): validation's, data_wait_ms (the page shows the
	 * latest beside the share), and data.test's once the job has them
	 * (docs/model-format.md): not looked for while it runs here, since
	 * they are written once its run is complete. */
	static const char *const stored_names[] = {"val_loss",      "val_accuracy", "data_wait_ms", "test_loss",
						   "test_accuracy", "test_mse",     "test_mae",     "test_r2"};
	enum { N_STORED = sizeof stored_names / sizeof stored_names[0], N_ALWAYS = 3 };
	bool running_here = json_is_object(live) && json_object_get(live, "step");
	size_t n_read = running_here ? N_ALWAYS : N_STORED;
	struct tr_metric_last last[N_STORED] = {0};
	if (tr_store_metrics_last(store, row->id, stored_names, n_read, last, NULL) < 0)
		memset(last, 0, sizeof last); /* shown as not known: null */
	sum = json_pack("{s:o}", "loss", number_or_null(row->loss));
	if (!sum)
		return NULL;
	for (size_t i = 0; i < N_STORED; i++)
		if (i < N_ALWAYS || last[i].found)
			json_object_set_new(sum, stored_names[i],
					    last[i].found ? number_or_null(last[i].value) : json_null());
	json_object_set_new(sum, "step", row->started_at > 0 ? json_integer(row->step) : json_null());
	if (running_here) {
		/* Running here: the trainer's own figures, computed as
		 * summary.json's are (samples and waiting over the run's wall
		 * time so far). */
		static const char *const keys[] = {"step", "loss", "samples_per_sec", "data_wait_fraction"};
		json_object_set_new(sum, "samples_per_sec", json_null());
		json_object_set_new(sum, "data_wait_fraction", json_null());
		json_object_set_new(sum, "epoch_loss", epoch_loss(store, row->id));
		for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
			if ((v = json_object_get(live, keys[i])) && json_is_number(v))
				json_object_set(sum, keys[i], v);
		return sum;
	}
	char query[] = "#summary", *text = NULL;
	size_t len;
	struct stored_summary ss = {store, row->id};
	struct tr_rcache_key key = {store, row->id, query, tr_store_job_data_generation(store, row->id)};
	json_t *stored = NULL;
	if (tr_rcache_get(&key, 2000, compute_stored, &ss, &text, &len) == 0)
		stored = json_loadb(text, len, 0, NULL);
	free(text);
	json_object_set_new(sum, "samples_per_sec", json_null());
	json_object_set_new(sum, "data_wait_fraction", json_null());
	json_object_set_new(sum, "epoch_loss", json_null());
	if (json_is_object(stored))
		json_object_update(sum, stored);
	json_decref(stored);
	return sum;
}

json_t *tr_api_live_json(tr_api_t *api, const struct tr_job_row *row)
{
	struct tr_api_live l;
	json_t *out;

	if (!api->cfg.ops.live_progress || tr_job_state_terminal(row->state))
		return NULL;
	memset(&l, 0, sizeof(l));
	l.loss = NAN;
	if (!api->cfg.ops.live_progress(api->cfg.ctx, row->id, &l))
		return NULL;
	out = json_pack("{s:I, s:I, s:I, s:f, s:f, s:f, s:f}", "step", (json_int_t)l.step, "total_steps",
			(json_int_t)l.total_steps, "epoch", (json_int_t)l.epoch, "samples_per_sec", l.samples_per_sec,
			"elapsed_s", l.elapsed_s + row->train_s, "eta_s", l.eta_s, "data_wait_fraction",
			l.data_wait_fraction);
	if (out && l.epochs > 0)
		json_object_set_new(out, "epochs", json_integer(l.epochs));
	if (out && isfinite(l.loss))
		json_object_set_new(out, "loss", json_real(l.loss));
	return out;
}

int tr_api_load_job(tr_api_t *api, struct tr_api_reply *rp, int64_t id, struct tr_job_row *row)
{
	int rc;
	struct tr_error e = {0};

	memset(row, 0, sizeof(*row));
	rc = tr_store_job_get(api->cfg.store, id, row, &e);
	if (rc == 0)
		return 0;
	tr_job_row_finish(row);
	memset(row, 0, sizeof(*row));
	if (rc == -ENOENT)
		tr_api_fail_kind(rp, TR_JOB_E_NOT_FOUND, NULL, "job %" PRId64 " not found", id);
	else
		tr_api_fail_store_err(rp, &e, "reading the job");
	return -1;
}

void tr_api_reply_job(tr_api_t *api, struct tr_api_reply *rp, int status, int64_t id)
{
	struct tr_job_row row;
	json_t *live = NULL, *job;

	if (tr_api_load_job(api, rp, id, &row) < 0)
		return;
	live = tr_api_live_json(api, &row);
	job = tr_api_job_json(&row, live);
	if (job && json_object_set_new(job, "summary", tr_api_job_summary(api, &row, live)) != 0) {
		json_decref(job);
		job = NULL;
	}
	/* An evaluate job's figures, null until it completed. */
	if (job && strcmp(json_string_value(json_object_get(job, "kind")), "evaluate") == 0) {
		char *text = NULL;
		json_t *result = tr_store_job_result_get(api->cfg.store, id, &text, NULL) == 0
					 ? json_loads(text, 0, NULL)
					 : NULL;
		free(text);
		json_object_set_new(job, "result", result ? result : json_null());
	}
	json_decref(live);
	tr_job_row_finish(&row);
	if (!job) {
		tr_api_fail(rp, 500, "internal", NULL, "job %" PRId64 " cannot be rendered as JSON", id);
		return;
	}
	tr_api_reply_json(rp, status, job);
}
