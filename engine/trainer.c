/* The trainer's run loop: steps, evaluation, checkpoints when due, early
 * stopping, and the control requests (stop, cancel) read between steps.
 * The step itself is in trainer_step.c (see trainer_internal.h for how the
 * files divide the work). */
#include "engine/trainer_internal.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/data/plan.h"
#include "engine/data/prefetch.h"
#include "engine/image_metrics.h"
#include "engine/optim/optimizer.h"
#include "engine/optim/schedule.h"
#include "engine/infer.h"
#include "engine/safetensors.h"

double tr_trainer_mono_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

double tr_trainer_wall_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

void tr_trainer_logf(struct tr_trainer *t, enum tr_log_level lvl, const char *fmt, ...)
{
	if (!t->opt.hooks.log)
		return;
	char buf[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	t->opt.hooks.log(t->opt.hooks.ctx, lvl, buf);
}

void tr_trainer_emit(struct tr_trainer *t, const char *name, int64_t step, int64_t epoch, double value)
{
	if (!t->opt.hooks.metric)
		return;
	struct tr_metric_point p = {
		.name = name, .step = step, .epoch = epoch, .wall = tr_trainer_wall_s(), .value = value};
	t->opt.hooks.metric(t->opt.hooks.ctx, &p);
}

/* ---- evaluation -------------------------------------------------------- */

/* Image regression (mse on image-shaped labels: patches): the mean SSIM
 * of the rows' restored images against the clean ones, added to *ssim_sum.
 * x_raw is the input before the transforms; a residual is added back to
 * it on both sides. */
static int add_ssim(struct tr_trainer *t, int rows, const float *x_raw, float *y, float *out, double *ssim_sum,
		    struct tr_error *err)
{
	tr_replica_t *r = &t->ranks[0].rep;
	tr_backend_t *be = t->be;
	const int *sh = t->val->info.label_shape, L = r->label_dim;
	const struct tr_source_spec *src = t->spec->validation.present ? &t->spec->validation : &t->spec->train;
	if (be->i->to_host(be, r->dev, out, r->acts[t->model.n_layers], (size_t)rows * L * sizeof(float)) < 0 ||
	    be->i->sync(be, r->dev) < 0) {
		tr_error_set(err, 0, 0, NULL, "validation: %s", be->i->last_error(be));
		return -EIO;
	}
	for (int i = 0; i < rows; i++) {
		float *o = out + (size_t)i * L;
		const float *xx = x_raw + (size_t)i * L;
		/* the clean images in place of the residuals, o + x and y + x,
		 * in the rows already used for the loss */
		float *clean = y + (size_t)i * L;
		if (src->residual)
			for (int k = 0; k < L; k++) {
				o[k] += xx[k];
				clean[k] += xx[k];
			}
		*ssim_sum += tr_ssim(o, clean, sh[0], sh[1], sh[2], 1.0);
	}
	return 0;
}

static int evaluate(struct tr_trainer *t, double *loss, double *acc, double *ssim, struct tr_error *err)
{
	tr_replica_t *r = &t->ranks[0].rep;
	tr_backend_t *be = t->be;
	const int F = t->model.inputs, L = r->label_dim, chunk = tr_trainer_eval_rows(t);
	int64_t n = t->val->info.samples;
	bool image = t->spec->loss == TR_LOSS_MSE && t->val->info.label_shape[0] > 0 && L == F;
	float *x = malloc((size_t)chunk * F * sizeof(float));
	float *y = malloc((size_t)chunk * L * sizeof(float));
	float *x_raw = image ? malloc((size_t)chunk * F * sizeof(float)) : NULL;
	float *out = image ? malloc((size_t)chunk * L * sizeof(float)) : NULL;
	double sums[2] = {0, 0}, ssim_sum = 0.0;
	int rc = 0;
	*ssim = NAN;
	if (!x || !y || (image && (!x_raw || !out))) {
		rc = -ENOMEM;
		tr_error_set(err, 0, 0, NULL, "out of memory for validation");
		goto out;
	}
	for (int64_t base = 0; base < n && rc == 0; base += chunk) {
		int rows = (int)(n - base < chunk ? n - base : chunk);
		/* A validation set may be as large as a training set. */
		if (atomic_load(&t->cancel_requested)) {
			tr_error_set(err, 0, 0, NULL, "cancelled");
			rc = -ECANCELED;
			break;
		}
		for (int i = 0; i < rows && rc == 0; i++) {
			rc = tr_reader_get(t->val, base + i, x + (size_t)i * F, y + (size_t)i * L, err);
			if (rc == 0 && x_raw)
				memcpy(x_raw + (size_t)i * F, x + (size_t)i * F, (size_t)F * sizeof(float));
			if (rc == 0 && t->transforms)
				tr_transforms_apply(t->transforms, x + (size_t)i * F, F, t->spec->seed, 0, base + i, 0);
		}
		if (rc == 0)
			rc = tr_reader_check(t->val, err);
		if (rc < 0)
			break;
		tr_data_pay_deferred_wait(); /* the chunk is ready after its full loading cost */
		if ((rc = tr_trainer_copy_rows(be->i->to_device, be, r->dev, r->input, r->labels, x, y, 0, rows, F,
					       L)) < 0 ||
		    (rc = tr_replica_forward(r, rows, 0, 0, 0)) < 0 ||
		    (rc = tr_replica_loss(r, rows, 0.0f, sums)) < 0 || (rc = be->i->sync(be, r->dev)) < 0)
			tr_error_set(err, 0, 0, NULL, "validation: %s", be->i->last_error(be));
		if (rc == 0 && image)
			rc = add_ssim(t, rows, x_raw, y, out, &ssim_sum, err);
	}
	*loss = sums[0] / (double)n;
	*acc = sums[1] / (double)n;
	if (image)
		*ssim = ssim_sum / (double)n;
out:
	free(x);
	free(y);
	free(x_raw);
	free(out);
	return rc;
}

/* data.test: once, after a completed run, with the final weights, on rank
 * 0.  The figures are tr_eval_acc's (engine/infer.h), the same code as
 * `trainerd eval` and evaluate jobs, emitted as test_* metrics at the last
 * step and kept in the summary. */
static int evaluate_test(struct tr_trainer *t, int64_t step, int64_t epoch, struct tr_error *err)
{
	tr_replica_t *r = &t->ranks[0].rep;
	tr_backend_t *be = t->be;
	const tr_model_t *m = &t->model;
	const int F = m->inputs, L = t->test->info.label_dim, K = m->outputs, chunk = tr_trainer_eval_rows(t);
	int64_t n = t->test->info.samples;
	float *x = malloc((size_t)chunk * F * sizeof(float));
	float *y = malloc((size_t)chunk * L * sizeof(float));
	float *out = malloc((size_t)chunk * K * sizeof(float));
	struct tr_eval_acc acc;
	struct tr_error why;
	int rc = tr_eval_acc_init(&acc, m->loss == TR_LOSS_SOFTMAX_CE, K);
	if (rc < 0 || !x || !y || !out) {
		rc = -ENOMEM;
		tr_error_set(err, 0, 0, NULL, "out of memory for the test data");
		goto out;
	}
	for (int64_t base = 0; base < n && rc == 0; base += chunk) {
		int rows = (int)(n - base < chunk ? n - base : chunk);
		if (atomic_load(&t->cancel_requested)) {
			tr_error_set(err, 0, 0, NULL, "cancelled");
			rc = -ECANCELED;
			break;
		}
		for (int i = 0; i < rows && rc == 0; i++) {
			rc = tr_reader_get(t->test, base + i, x + (size_t)i * F, y + (size_t)i * L, &why);
			if (rc == 0 && t->transforms)
				tr_transforms_apply(t->transforms, x + (size_t)i * F, F, t->spec->seed, 0, base + i, 0);
		}
		if (rc == 0)
			rc = tr_reader_check(t->test, &why);
		if (rc < 0) {
			tr_error_set(err, 0, 0, "/data/test", "/data/test: %s", why.message);
			break;
		}
		tr_data_pay_deferred_wait();
		if ((rc = be->i->to_device(be, r->dev, r->input, x, (size_t)rows * F * sizeof(float))) < 0 ||
		    (rc = tr_replica_forward(r, rows, 0, 0, 0)) < 0 ||
		    (rc = be->i->to_host(be, r->dev, out, r->acts[m->n_layers], (size_t)rows * K * sizeof(float))) <
			    0 ||
		    (rc = be->i->sync(be, r->dev)) < 0) {
			tr_error_set(err, 0, 0, NULL, "test: %s", be->i->last_error(be));
			break;
		}
		if ((rc = tr_eval_acc_add(&acc, base, rows, out, y, &why)) < 0)
			tr_error_set(err, 0, 0, "/data/test", "/data/test: %s: %s", t->test->name, why.message);
	}
	if (rc == 0) {
		json_t *fig = tr_eval_acc_json(&acc, "test_");
		static const char *const names[] = {"test_loss", "test_accuracy", "test_mse", "test_mae", "test_r2"};
		double *dst[] = {&t->summary.test_loss, &t->summary.test_accuracy, &t->summary.test_mse,
				 &t->summary.test_mae, &t->summary.test_r2};
		for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
			const json_t *v = json_object_get(fig, names[k]);
			if (!json_is_real(v))
				continue;
			*dst[k] = json_real_value(v);
			tr_trainer_emit(t, names[k], step, epoch, *dst[k]);
		}
		json_decref(fig);
	}
out:
	tr_eval_acc_finish(&acc);
	free(x);
	free(y);
	free(out);
	return rc;
}

/* ---- the loop ---------------------------------------------------------- */

static const char *stop_reason_name(int why)
{
	switch (why) {
	case TR_STOP_PAUSE:
		return "pause";
	case TR_STOP_SHUTDOWN:
		return "shutdown";
	case TR_STOP_PREEMPT:
		return "preempt";
	default:
		return "stop";
	}
}

/* Takes a checkpoint after step `done` when one is due (or final). */
static void maybe_checkpoint(struct tr_trainer *t, int64_t done, int64_t epoch, bool final)
{
	if (!t->opt.hooks.checkpoint)
		return;
	const struct tr_spec *s = t->spec;
	double now = tr_trainer_mono_s();
	const char *reason = NULL;
	if (final)
		reason = t->summary.stopped         ? stop_reason_name(atomic_load(&t->stop_reason))
			 : t->summary.early_stopped ? "early_stopping"
						    : "final";
	else if (atomic_exchange(&t->checkpoint_requested, false))
		reason = "request";
	else if (s->checkpoint_every_steps > 0 && done % s->checkpoint_every_steps == 0)
		reason = "every_steps";
	else if (s->checkpoint_every_seconds > 0 && now - t->last_checkpoint_time >= s->checkpoint_every_seconds)
		reason = "every_seconds";
	if (!reason)
		return;
	/* A checkpoint at a step that is already saved (final, or after the
	 * best checkpoint of this step's evaluation) adds nothing. */
	if ((final || done > t->start_step) && done == t->last_checkpoint_step && done > 0)
		return;
	if (!final && t->opt.hooks.checkpoint_busy && t->opt.hooks.checkpoint_busy(t->opt.hooks.ctx)) {
		if (strcmp(reason, "request") == 0)
			atomic_store(&t->checkpoint_requested, true); /* keep asking */
		return;
	}
	struct tr_snapshot *snap = tr_trainer_snapshot(t, done, epoch, reason);
	if (!snap) {
		tr_trainer_logf(t, TR_LOG_WARNING, "step %lld: cannot snapshot the model for a checkpoint",
				(long long)done);
		return;
	}
	if (t->opt.hooks.checkpoint(t->opt.hooks.ctx, snap, final) != 0) {
		tr_snapshot_free(snap);
		return;
	}
	t->last_checkpoint_step = done;
	t->last_checkpoint_time = now;
}

static void set_info(struct tr_trainer *t, const char *key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void set_info(struct tr_trainer *t, const char *key, const char *fmt, ...)
{
	char value[160];
	va_list ap;

	if (!t->opt.hooks.info)
		return;
	va_start(ap, fmt);
	vsnprintf(value, sizeof value, fmt, ap);
	va_end(ap);
	t->opt.hooks.info(t->opt.hooks.ctx, key, value);
}

/* The checkpoint of a new best evaluation: never skipped (the hook waits
 * for a busy writer), since the best weights exist only now. */
static void best_checkpoint(struct tr_trainer *t, int64_t done, int64_t epoch)
{
	if (!t->opt.hooks.checkpoint)
		return;
	struct tr_snapshot *snap = tr_trainer_snapshot(t, done, epoch, "best");
	if (!snap) {
		tr_trainer_logf(t, TR_LOG_WARNING, "step %lld: cannot snapshot the model for the best checkpoint",
				(long long)done);
		return;
	}
	if (t->opt.hooks.checkpoint(t->opt.hooks.ctx, snap, true) != 0) {
		tr_snapshot_free(snap);
		return;
	}
	t->last_checkpoint_step = done;
	t->last_checkpoint_time = tr_trainer_mono_s();
}

/* One evaluation of early_stopping's metric after step `done`. */
static void early_stop_eval(struct tr_trainer *t, int64_t done, int64_t epoch, double val_loss, double val_acc)
{
	const struct tr_early_stop_spec *es = &t->spec->early_stopping;
	double value;

	if (strcmp(es->metric, "val_loss") == 0)
		value = val_loss;
	else if (strcmp(es->metric, "val_accuracy") == 0)
		value = val_acc;
	else
		value = t->es_loss_count > 0 ? t->es_loss_sum / (double)t->es_loss_count : NAN;
	t->es_loss_sum = 0;
	t->es_loss_count = 0;
	switch (tr_early_stop_update(&t->es, value, done)) {
	case TR_ES_IMPROVED:
		t->summary.best_value = t->es.best;
		t->summary.best_step = done;
		tr_trainer_logf(t, TR_LOG_INFO, "step %lld: new best %s %.6g", (long long)done, es->metric, value);
		best_checkpoint(t, done, epoch);
		break;
	case TR_ES_STOP:
		t->es_stop = true;
		set_info(t, "stop_reason", "early_stopping: %s has not improved for %d evaluation(s)", es->metric,
			 es->patience);
		tr_trainer_logf(
			t, TR_LOG_INFO,
			"early stopping after step %lld: %s has not improved by more than %g for %d evaluation(s); "
			"best %.6g at step %lld",
			(long long)done, es->metric, (double)es->min_delta, es->patience, t->es.best,
			(long long)t->es.best_step);
		break;
	case TR_ES_WAIT:
		break;
	}
}

int tr_trainer_run(tr_trainer_t *t, struct tr_error *err)
{
	const struct tr_spec *s = t->spec;
	int workers = tr_trainer_loader_threads(t);
	int64_t total = t->plan.total_steps;
	int rc;
	struct tr_prefetch_config pc = {
		.reader = t->train,
		.transforms = t->transforms,
		.plan = &t->plan,
		.backend = t->be,
		.seed = s->seed,
		.workers = workers,
		.depth = s->prefetch_depth,
		.first_step = t->start_step,
		.end_step = total,
		.rows = t->nproc > 1 ? tr_trainer_proc_rows : NULL,
		.rows_ctx = t,
	};
	tr_prefetch_t *pf;
	if ((rc = tr_prefetch_create(&pc, &pf, err)) < 0)
		return rc;
	pthread_mutex_lock(&t->lock);
	t->prefetch = pf;
	pthread_mutex_unlock(&t->lock);
	for (int i = 0; i < t->ndev; i++)
		t->ranks[i].ahead_step = -1;
	/* The first periodic checkpoint's snapshot would otherwise fault its
	 * buffers in between two steps (~80 ms for 100 MB here, against ~15
	 * ms for a copy into recycled ones). */
	if (s->checkpoint_every_steps > 0 || s->checkpoint_every_seconds > 0)
		tr_snapshot_prepare(t->model.n_params, t->opt_buffers);
	if ((rc = tr_trainer_start_rank_threads(t, err)) < 0)
		return rc;
	tr_trainer_logf(t, TR_LOG_INFO, "training %zu parameters on %d %s device(s), %lld steps, %d loader thread(s)",
			t->model.n_params, t->ndev, t->be->i->name, (long long)total, workers);

	double start = tr_trainer_mono_s();
	double samples = 0;
	int64_t step;
	t->summary.first_step = t->start_step;
	t->summary.steps = t->start_step;
	t->last_checkpoint_step = t->start_step;
	t->last_checkpoint_time = start;
	if (t->start_step > 0)
		tr_trainer_logf(t, TR_LOG_INFO, "resuming at step %lld of %lld", (long long)t->start_step,
				(long long)total);
	double best_val_loss = INFINITY; /* of this run: a resumed run starts afresh */
	set_info(t, "phase", "training");
	for (step = t->start_step; step < total; step++) {
		if (t->es_stop) {
			t->summary.early_stopped = true;
			break;
		}
		/* Several processes stop together, at the step they agreed on. */
		if (t->nproc > 1 ? t->agreed_stop : atomic_load(&t->stop_requested)) {
			t->summary.stopped = true;
			break;
		}
		if (t->nproc > 1 ? t->agreed_cancel : atomic_load(&t->cancel_requested)) {
			rc = -ECANCELED;
			tr_error_set(err, 0, 0, NULL, "cancelled");
			break;
		}
		/* Before the step's slot is taken, so a failure here holds none. */
		if ((rc = tr_trainer_ratio_prepare(t, step + 1)) < 0) {
			tr_error_set(err, 0, 0, NULL, "update_ratio: cannot copy the weights before step %lld",
				     (long long)step + 1);
			break;
		}
		const struct tr_batch *b;
		double wait_ms = 0;
		double t0 = tr_trainer_mono_s();
		rc = tr_prefetch_next(t->prefetch, step, &b, &wait_ms);
		if (rc < 0) {
			if (rc == -ECANCELED)
				tr_error_set(err, 0, 0, NULL, "cancelled");
			else
				tr_error_set(err, 0, 0, NULL, "%s", tr_prefetch_error(t->prefetch));
			break;
		}
		t->wait_total_ms += wait_ms;
		t->batch = b;
		t->step = step;
		t->lr = tr_schedule_lr(s, step, total);
		t->want_grad_norm = tr_trainer_grad_norm_due(s, step + 1, false);
		t->want_layer_grad_norms = tr_trainer_grad_norm_due(s, step + 1, true);
		rc = tr_trainer_run_step_all(t, err);
		int count = b->count;
		int64_t epoch = b->epoch;
		tr_prefetch_release(t->prefetch, step);
		if (rc < 0) {
			if (atomic_load(&t->cancel_requested)) {
				rc = -ECANCELED;
				tr_error_set(err, 0, 0, NULL, "cancelled");
			}
			break;
		}
		if ((rc = tr_trainer_procs_sync(t, err)) < 0)
			break;
		double loss_sum = s->exact_shards ? tr_trainer_exact_loss(t) : 0;
		for (int i = 0; i < t->ndev && !s->exact_shards; i++)
			loss_sum += t->ranks[i].loss[0];
		double loss = loss_sum / count;
		if (s->stop_on_nan && (!isfinite(loss) || t->ranks[0].grads_nonfinite)) {
			tr_trainer_describe_nonfinite(t, step + 1, loss, err);
			rc = -EDOM;
			break;
		}
		double step_ms = (tr_trainer_mono_s() - t0) * 1e3;
		samples += count;
		t->summary.steps = step + 1;
		t->summary.samples = (int64_t)samples;
		t->summary.final_loss = loss;
		t->summary.epochs = epoch + 1;
		if (t->nproc > 1) {
			t->summary.comm_ms += t->ranks[0].xctx.comm_ms;
			t->summary.comm_wait_ms += t->ranks[0].xctx.wait_ms;
		}
		tr_trainer_emit_step_metrics(t, step + 1, epoch, count, loss, step_ms, wait_ms);
		/* The step is done once its update is applied: reported before
		 * the evaluation that may follow, so that a job cancelled or failed
		 * during it reports the step its metrics reached. */
		if (t->opt.hooks.progress) {
			double el = tr_trainer_mono_s() - start;
			struct tr_progress p = {
				.step = step + 1,
				.total_steps = total,
				.epoch = epoch,
				.epochs = t->plan.epochs,
				.loss = loss,
				.samples_per_sec = el > 0 ? samples / el : 0,
				.elapsed_s = el,
				.eta_s = el / (double)(step + 1 - t->start_step) * (double)(total - step - 1),
				.data_wait_fraction = el > 0 ? t->wait_total_ms / 1e3 / el : 0,
			};
			t->opt.hooks.progress(t->opt.hooks.ctx, &p);
		}

		bool epoch_end = step + 1 == total || tr_plan_step_epoch(&t->plan, step + 1) != epoch;
		bool eval_due = (epoch_end && ((epoch + 1) % s->eval_every_epochs == 0 || step + 1 == total)) ||
				(s->eval_every_steps > 0 && (step + 1) % s->eval_every_steps == 0);
		double vl = NAN, va = NAN, vs = NAN;
		if (s->early_stopping.enabled) {
			t->es_loss_sum += loss;
			t->es_loss_count++;
		}
		if (epoch_end)
			set_info(t, "epoch", "%lld", (long long)epoch + 1);
		if (eval_due && t->val) {
			set_info(t, "phase", "evaluating");
			rc = evaluate(t, &vl, &va, &vs, err);
			if (rc < 0)
				break;
			if (isfinite(vl) && !(vl >= best_val_loss)) {
				best_val_loss = vl;
				set_info(t, "best_val_loss", "%.6g", vl);
				set_info(t, "best_val_loss_step", "%lld", (long long)step + 1);
			}
			if (step + 1 < total)
				set_info(t, "phase", "training");
			t->summary.val_loss = vl;
			tr_trainer_emit(t, "val_loss", step + 1, epoch, vl);
			if (s->loss == TR_LOSS_SOFTMAX_CE) {
				t->summary.val_accuracy = va;
				tr_trainer_emit(t, "val_accuracy", step + 1, epoch, va);
			}
			if (!isnan(vs)) { /* image regression: val_loss is the mse on [0, 1] */
				tr_trainer_emit(t, "val_psnr", step + 1, epoch, tr_psnr(vl, 1.0));
				tr_trainer_emit(t, "val_ssim", step + 1, epoch, vs);
			}
		}
		if (eval_due && s->early_stopping.enabled)
			early_stop_eval(t, step + 1, epoch, vl, va);
		maybe_checkpoint(t, step + 1, epoch, false);
	}
	/* The end of a completed or stopped run is always kept: for a completed
	 * job it is the result, for a stopped one the place to resume. */
	if (rc == 0)
		maybe_checkpoint(t, t->summary.steps, t->summary.epochs > 0 ? t->summary.epochs - 1 : 0, true);
	/* After the final checkpoint, so that its figures are those of the
	 * stored weights (docs/model-format.md); a stopped run is not over. */
	if (rc == 0 && !t->summary.stopped && t->test) {
		set_info(t, "phase", "testing");
		rc = evaluate_test(t, t->summary.steps, t->summary.epochs > 0 ? t->summary.epochs - 1 : 0, err);
	}
	set_info(t, "phase", rc == 0 && !t->summary.stopped ? "finished" : rc == 0 ? "stopped" : "ended");
	double el = tr_trainer_mono_s() - start;
	t->summary.wall_s = el;
	t->summary.samples_per_sec = el > 0 ? samples / el : 0;
	t->summary.data_wait_fraction = el > 0 ? t->wait_total_ms / 1e3 / el : 0;
	tr_trainer_stop_rank_threads(t);
	pthread_mutex_lock(&t->lock);
	t->prefetch = NULL;
	pthread_mutex_unlock(&t->lock);
	tr_prefetch_destroy(pf);
	if (rc < 0)
		tr_trainer_logf(t, rc == -ECANCELED ? TR_LOG_WARNING : TR_LOG_ERROR, "%s", err ? err->message : "");
	return rc < 0 ? rc : 0;
}

void tr_trainer_stop_for(tr_trainer_t *t, enum tr_stop_reason why)
{
	atomic_store(&t->stop_reason, (int)why);
	atomic_store(&t->stop_requested, true);
}

void tr_trainer_stop(tr_trainer_t *t)
{
	tr_trainer_stop_for(t, TR_STOP_STOP);
}

void tr_trainer_cancel(tr_trainer_t *t)
{
	atomic_store(&t->cancel_requested, true);
	/* The lock keeps the prefetch pointer alive while we use it: the run
	 * thread clears it under the same lock before destroying the pool. */
	pthread_mutex_lock(&t->lock);
	if (t->prefetch)
		tr_prefetch_cancel(t->prefetch);
	if (t->comm)
		t->be->i->comm_abort(t->comm);
	pthread_mutex_unlock(&t->lock);
}

void tr_trainer_summary(const tr_trainer_t *t, struct tr_summary *out)
{
	*out = t->summary;
}

const tr_model_t *tr_trainer_model(const tr_trainer_t *t)
{
	return &t->model;
}

int tr_trainer_device_count(const tr_trainer_t *t)
{
	return t->ndev;
}

int tr_trainer_loader_threads(const tr_trainer_t *t)
{
	return t->opt.workers > 0 ? t->opt.workers : t->spec->prefetch_workers;
}

int tr_trainer_copy_params(tr_trainer_t *t, int rank, float *host)
{
	tr_replica_t *r = &t->ranks[rank].rep;
	int rc = t->be->i->to_host(t->be, r->dev, host, r->params, t->model.n_params * sizeof(float));
	return rc < 0 ? rc : t->be->i->sync(t->be, r->dev);
}

int tr_trainer_save_weights(tr_trainer_t *t, const char *path, struct tr_error *err)
{
	const tr_model_t *m = &t->model;
	int n = tr_model_param_count(m);
	float *host = malloc(m->n_params * sizeof(float));
	struct tr_st_tensor *ts = calloc((size_t)n, sizeof *ts);
	struct tr_param_view *vs = calloc((size_t)n, sizeof *vs);
	int rc = -ENOMEM;
	if (!host || !ts || !vs) {
		tr_error_set(err, 0, 0, NULL, "out of memory");
		goto out;
	}
	if ((rc = tr_trainer_copy_params(t, 0, host)) < 0) {
		tr_error_set(err, 0, 0, NULL, "cannot read the weights: %s", t->be->i->last_error(t->be));
		goto out;
	}
	for (int i = 0; i < n; i++) {
		tr_model_param_view(m, i, &vs[i]);
		ts[i] = (struct tr_st_tensor){.name = vs[i].name, .ndim = vs[i].ndim, .data = host + vs[i].offset};
		for (int d = 0; d < vs[i].ndim; d++)
			ts[i].shape[d] = vs[i].shape[d];
	}
	json_t *meta = json_pack("{s:s, s:s, s:s}", "format", "pt", "producer", "trainerd " TR_VERSION, "step", "");
	json_object_update(meta, t->model_meta); /* docs/model-format.md */
	char step[32];
	snprintf(step, sizeof step, "%lld", (long long)t->summary.steps);
	json_object_set_new(meta, "step", json_string(step));
	rc = tr_st_write(path, ts, n, meta, err);
	json_decref(meta);
out:
	free(host);
	free(ts);
	free(vs);
	return rc;
}
