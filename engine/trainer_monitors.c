/* Monitor values after a step: grad/weight norms, update ratios,
 * activation statistics and the per-step metrics (docs/design.md,
 * "Monitors").  Run on the coordinating thread between steps. */
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
#include "engine/optim/optimizer.h"
#include "engine/optim/schedule.h"
#include "engine/safetensors.h"

static bool monitor_due(const struct tr_spec *s, const char *name, int64_t done)
{
	for (int m = 0; m < s->n_monitors; m++)
		if (strcmp(s->monitors[m].name, name) == 0 && done % s->monitors[m].every_steps == 0)
			return true;
	return false;
}

/* update_ratio: before a due step, rank 0's weights to the host (lazily
 * allocated, only jobs that ask pay for the two copies). */
int tr_trainer_ratio_prepare(struct tr_trainer *t, int64_t done)
{
	t->ratio_due = monitor_due(t->spec, "update_ratio", done);
	if (!t->ratio_due)
		return 0;
	size_t bytes = t->model.n_params * sizeof(float);
	if (!t->ratio_before && !(t->ratio_before = malloc(bytes)))
		return -ENOMEM;
	if (!t->ratio_after && !(t->ratio_after = malloc(bytes)))
		return -ENOMEM;
	return tr_trainer_copy_params(t, 0, t->ratio_before);
}

/* update_ratio.<i> = ||w_after - w_before|| / ||w_before|| over layer i's
 * weight and bias, in double on the host: the step's relative change, the
 * ~1e-3 rule of thumb's quantity.  A layer whose weights were all zero
 * gets no point for the step (the ratio has no value). */
static void emit_update_ratio(struct tr_trainer *t, int64_t done, int64_t epoch)
{
	if (!t->ratio_due || tr_trainer_copy_params(t, 0, t->ratio_after) < 0)
		return;
	for (int i = 0; i < t->model.n_layers; i++) {
		const struct tr_layer *l = &t->model.layers[i];
		size_t offs[2] = {l->w_off, l->b_off}, lens[2] = {l->w_len, l->b_len};
		double du = 0, w = 0;
		for (int k = 0; k < 2; k++) {
			for (size_t j = offs[k]; j < offs[k] + lens[k]; j++) {
				double b = t->ratio_before[j], d = (double)t->ratio_after[j] - b;
				du += d * d;
				w += b * b;
			}
		}
		if (!l->w_len && !l->b_len)
			continue;
		if (w > 0) {
			char key[80];
			snprintf(key, sizeof key, "update_ratio.%d", i);
			tr_trainer_emit(t, key, done, epoch, sqrt(du) / sqrt(w));
		}
	}
}

/* "<name>.<layer index>" for each layer that has parameters (docs/design.md:
 * per-layer names follow the safetensors names' layer index). */
static void emit_per_layer(struct tr_trainer *t, const char *name, int64_t done, int64_t epoch, const double *sumsq)
{
	for (int i = 0; i < t->model.n_layers; i++) {
		if (!t->model.layers[i].w_len && !t->model.layers[i].b_len)
			continue;
		char key[80];
		snprintf(key, sizeof key, "%s.%d", name, i);
		tr_trainer_emit(t, key, done, epoch, sqrt(sumsq[i]));
	}
}

/* activation_stats: per layer, the mean, standard deviation (population)
 * and fraction of exact zeros of the layer's outputs over the whole step
 * (every device's share), read from the forward pass's buffers, which
 * backward leaves intact.  Only on due steps: it copies every output. */
static void emit_activation_stats(struct tr_trainer *t, int64_t done, int64_t epoch, int count)
{
	const tr_model_t *m = &t->model;
	tr_backend_t *be = t->be;
	size_t cap = (size_t)t->ranks[0].rep.max_rows * (size_t)m->max_width;
	float *host = malloc(cap * sizeof(float));
	if (!host) {
		tr_trainer_logf(t, TR_LOG_WARNING, "step %lld: activation_stats: out of memory", (long long)done);
		return;
	}
	for (int i = 0; i < m->n_layers; i++) {
		double sum = 0, sumsq = 0, zeros = 0, n = 0;
		for (int k = 0; k < t->ndev; k++) {
			int off, len;
			tr_trainer_share(t, count, k, &off, &len);
			size_t elems = (size_t)len * (size_t)m->layers[i].out;
			tr_replica_t *r = &t->ranks[k].rep;
			if (len == 0 || elems > cap)
				continue;
			if (be->i->to_host(be, r->dev, host, r->acts[i + 1], elems * sizeof(float)) < 0 ||
			    be->i->sync(be, r->dev) < 0) {
				free(host);
				return;
			}
			for (size_t e = 0; e < elems; e++) {
				sum += host[e];
				sumsq += (double)host[e] * host[e];
				zeros += host[e] == 0.0f;
			}
			n += (double)elems;
		}
		if (n == 0)
			continue;
		double mean = sum / n, var = sumsq / n - mean * mean;
		char name[64];
		snprintf(name, sizeof name, "activation_stats.%d.mean", i);
		tr_trainer_emit(t, name, done, epoch, mean);
		snprintf(name, sizeof name, "activation_stats.%d.std", i);
		tr_trainer_emit(t, name, done, epoch, sqrt(var > 0 ? var : 0));
		snprintf(name, sizeof name, "activation_stats.%d.zeros", i);
		tr_trainer_emit(t, name, done, epoch, zeros / n);
	}
	free(host);
}

void tr_trainer_emit_step_metrics(struct tr_trainer *t, int64_t done, int64_t epoch, int count, double loss,
				  double step_ms, double wait_ms)
{
	const struct tr_spec *s = t->spec;
	bool last = done == t->plan.total_steps;
	bool logged = done % s->log_every_steps == 0 || last;
	if (logged) {
		tr_trainer_emit(t, "loss", done, epoch, loss);
		tr_trainer_emit(t, "lr", done, epoch, t->lr);
		tr_trainer_emit(t, "step_ms", done, epoch, step_ms);
		tr_trainer_emit(t, "data_wait_ms", done, epoch, wait_ms);
		tr_trainer_emit(t, "samples_per_sec", done, epoch, step_ms > 0 ? count / (step_ms / 1e3) : 0.0);
		if (t->nproc > 1) { /* this step's gathers between processes */
			tr_trainer_emit(t, "comm_ms", done, epoch, t->ranks[0].xctx.comm_ms);
			tr_trainer_emit(t, "comm_wait_ms", done, epoch, t->ranks[0].xctx.wait_ms);
		}
	}
	for (int m = 0; m < s->n_monitors; m++) {
		const struct tr_monitor_spec *mon = &s->monitors[m];
		if (done % mon->every_steps != 0)
			continue;
		if (strcmp(mon->name, "grad_norm") == 0) {
			tr_trainer_emit(t, "grad_norm", done, epoch, sqrt(t->ranks[0].grad_sumsq));
			if (mon->per_layer)
				emit_per_layer(t, "grad_norm", done, epoch, t->layer_grad_sumsq);
		} else if (strcmp(mon->name, "weight_norm") == 0) {
			double ss = 0, layers[TR_SPEC_MAX_LAYERS];
			tr_replica_t *r = &t->ranks[0].rep;
			if (tr_trainer_read_sumsq(t, t->model.n_params, r->params, &ss) == 0)
				tr_trainer_emit(t, "weight_norm", done, epoch, sqrt(ss));
			if (mon->per_layer && tr_trainer_layer_sumsq(t, r->params, layers) == 0)
				emit_per_layer(t, "weight_norm", done, epoch, layers);
		} else if (strcmp(mon->name, "update_ratio") == 0) {
			emit_update_ratio(t, done, epoch);
		} else if (logged && (strcmp(mon->name, "lr") == 0 || strcmp(mon->name, "samples_per_sec") == 0 ||
				      strcmp(mon->name, "data_wait_ms") == 0)) {
			continue; /* recorded above at this step already */
		} else if (strcmp(mon->name, "lr") == 0) {
			tr_trainer_emit(t, "lr", done, epoch, t->lr);
		} else if (strcmp(mon->name, "samples_per_sec") == 0) {
			tr_trainer_emit(t, "samples_per_sec", done, epoch, step_ms > 0 ? count / (step_ms / 1e3) : 0.0);
		} else if (strcmp(mon->name, "data_wait_ms") == 0) {
			tr_trainer_emit(t, "data_wait_ms", done, epoch, wait_ms);
		} else if (strcmp(mon->name, "activation_stats") == 0) {
			emit_activation_stats(t, done, epoch, count);
		} else if (strcmp(mon->name, "device_step_ms") == 0) {
			for (int k = 0; k < t->ndev; k++) {
				char name[32];
				snprintf(name, sizeof name, "device%d_step_ms", k);
				tr_trainer_emit(t, name, done, epoch, t->ranks[k].step_ms);
			}
		}
	}
}

/* stop_on_nan's message: the step, then the first tensor that went bad, in
 * the order the step computes them: the loss (forward), then the
 * gradients in parameter order (PyTorch names).  Only on failure, so the
 * per-tensor sums cost nothing in a healthy run. */
void tr_trainer_describe_nonfinite(struct tr_trainer *t, int64_t done, double loss, struct tr_error *err)
{
	const char *hint = "lower /optimizer/lr, set /clip_grad_norm or check the data";
	tr_replica_t *r = &t->ranks[0].rep;
	char first[64] = "";

	for (int i = 0; t->ranks[0].grads_nonfinite && i < tr_model_param_count(&t->model) && !first[0]; i++) {
		struct tr_param_view v;
		double ss = 0;
		tr_model_param_view(&t->model, i, &v);
		if (tr_trainer_read_sumsq(t, v.len, r->grads + v.offset, &ss) == 0 && !isfinite(ss))
			snprintf(first, sizeof first, "%s", v.name);
	}
	if (!isfinite(loss))
		tr_error_set(
			err, 0, 0, "/stop_on_nan",
			"/stop_on_nan: step %lld: the loss is %s%s%s; the job stopped before the step's checkpoint "
			"(%s)",
			(long long)done, isnan(loss) ? "NaN" : "infinite",
			first[0] ? ", and so is the gradient of " : "", first, hint);
	else
		tr_error_set(
			err, 0, 0, "/stop_on_nan",
			"/stop_on_nan: step %lld: the gradient of %s is not finite (NaN or infinite); the update was "
			"not applied and the job stopped before the step's checkpoint (%s)",
			(long long)done, first[0] ? first : "the model", hint);
}

bool tr_trainer_grad_norm_due(const struct tr_spec *s, int64_t done, bool per_layer)
{
	for (int m = 0; m < s->n_monitors; m++)
		if (strcmp(s->monitors[m].name, "grad_norm") == 0 && done % s->monitors[m].every_steps == 0 &&
		    (!per_layer || s->monitors[m].per_layer))
			return true;
	return false;
}

/* A snapshot sharing rank 0's buffers (zero-copy): the buffers the next
 * update will write into are taken now, so that the update cannot fail
 * for want of memory.  A second snapshot before that update shares the
 * same lease. */
