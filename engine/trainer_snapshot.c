/* Snapshots for checkpoints: lending rank 0's buffers without a copy
 * where the backend allows it, copying otherwise, and restoring a
 * snapshot into the replicas (engine/checkpoint.h). */
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

static struct tr_snapshot *lend_snapshot(struct tr_trainer *t)
{
	tr_replica_t *r = &t->ranks[0].rep;
	size_t n = t->model.n_params;
	int nbuf = 1 + t->opt_buffers;
	if (!t->lent) {
		float *next[3] = {NULL, NULL, NULL};
		float *cur[3] = {r->params, r->state1, r->state2};
		bool ok = true;
		for (int k = 0; k < nbuf; k++)
			ok = ok && (next[k] = tr_snapshot_buffer_take(n)) != NULL;
		struct tr_snapshot_lease *l = ok ? tr_snapshot_lease_new(n, nbuf, cur) : NULL;
		if (!l) {
			for (int k = 0; k < nbuf; k++)
				tr_snapshot_buffer_put(next[k], n);
			return NULL;
		}
		t->lent = l;
		memcpy(t->next_bufs, next, sizeof next);
	}
	return tr_snapshot_borrow(t->lent, t->opt_buffers);
}

/* A snapshot copied from rank 0, into buffers recycled from the previous
 * checkpoint when there is one (see tr_snapshot_alloc): the copy then
 * faults no page in. */
static struct tr_snapshot *copy_snapshot(struct tr_trainer *t)
{
	size_t n = t->model.n_params;
	struct tr_snapshot *snap = tr_snapshot_alloc(n, t->opt_buffers);
	if (!snap)
		return NULL;
	tr_replica_t *r = &t->ranks[0].rep;
	tr_backend_t *be = t->be;
	bool ok = be->i->to_host(be, r->dev, snap->params, r->params, n * sizeof(float)) == 0;
	for (int k = 0; ok && k < snap->n_state; k++)
		ok = be->i->to_host(be, r->dev, snap->state[k], k == 0 ? r->state1 : r->state2, n * sizeof(float)) == 0;
	ok = ok && be->i->sync(be, r->dev) == 0;
	if (!ok) {
		tr_snapshot_free(snap);
		return NULL;
	}
	return snap;
}

static void save_early_stop(const struct tr_trainer *t, json_t *meta);

struct tr_snapshot *tr_trainer_snapshot(tr_trainer_t *t, int64_t step, int64_t epoch, const char *reason)
{
	/* The out-of-place update writes the parameters only, not the
	 * buffers after them (batchnorm2d's running statistics, which the
	 * forward pass updates in place): such models copy. */
	bool lend = tr_trainer_can_lend(t->be) && t->model.n_trainable == t->model.n_params;
	struct tr_snapshot *snap = lend ? lend_snapshot(t) : copy_snapshot(t);
	if (!snap)
		return NULL;
	snap->step = step;
	snap->epoch = epoch;
	tr_backend_t *be = t->be;
	char hash[17], buf[32];
	tr_spec_hash(t->spec, hash);
	snap->meta = json_pack("{s:s, s:s, s:s, s:s}", "format", "pt", "kind", "checkpoint", "producer",
			       "trainerd " TR_VERSION, "spec_hash", hash);
	snprintf(buf, sizeof buf, "%lld", (long long)step);
	json_object_set_new(snap->meta, "step", json_string(buf));
	snprintf(buf, sizeof buf, "%lld", (long long)epoch);
	json_object_set_new(snap->meta, "epoch", json_string(buf));
	snprintf(buf, sizeof buf, "%d", t->ndev);
	json_object_set_new(snap->meta, "devices", json_string(buf));
	json_object_set_new(snap->meta, "backend", json_string(be->i->name));
	static const char *opt_names[] = {"sgd", "adam", "adamw"};
	json_object_set_new(snap->meta, "optimizer", json_string(opt_names[t->spec->optimizer.type]));
	json_object_set_new(snap->meta, "reason", json_string(reason));
	save_early_stop(t, snap->meta);
	/* so that a resumed run computes as this one did */
	char routes[TR_ROUTES_TEXT];
	tr_trainer_routes_text(t, TR_LAYER_CONV2D, routes, sizeof routes);
	if (routes[0])
		json_object_set_new(snap->meta, "conv_routes", json_string(routes));
	/* The model's description: a checkpoint is usable on its own. */
	json_object_update(snap->meta, t->model_meta);
	return snap;
}

/* A checkpoint carries the early-stopping state (best, its step, the
 * evaluations since) so a resumed job counts patience on from where it
 * was; a checkpoint without it starts the count afresh. */
static void save_early_stop(const struct tr_trainer *t, json_t *meta)
{
	char buf[40];

	if (!t->spec->early_stopping.enabled || !t->es.have_best)
		return;
	snprintf(buf, sizeof buf, "%.17g", t->es.best);
	json_object_set_new(meta, "early_stopping_best", json_string(buf));
	snprintf(buf, sizeof buf, "%lld", (long long)t->es.best_step);
	json_object_set_new(meta, "early_stopping_best_step", json_string(buf));
	snprintf(buf, sizeof buf, "%d", t->es.bad);
	json_object_set_new(meta, "early_stopping_bad", json_string(buf));
}

static void restore_early_stop(struct tr_trainer *t, const struct tr_snapshot *snap)
{
	const char *best = json_string_value(json_object_get(snap->meta, "early_stopping_best"));
	const char *step = json_string_value(json_object_get(snap->meta, "early_stopping_best_step"));
	const char *bad = json_string_value(json_object_get(snap->meta, "early_stopping_bad"));
	char *end;

	if (!t->spec->early_stopping.enabled || !best || !step || !bad)
		return;
	double b = strtod(best, &end);
	if (*end || !isfinite(b))
		return;
	t->es.have_best = true;
	t->es.best = b;
	t->es.best_step = strtoll(step, NULL, 10);
	t->es.bad = atoi(bad);
	t->summary.best_value = b;
	t->summary.best_step = t->es.best_step;
}

int tr_trainer_restore(tr_trainer_t *t, const struct tr_snapshot *snap, bool weights_only, struct tr_error *err)
{
	const struct tr_spec *s = t->spec;
	int want_state = tr_optim_state_buffers(s->optimizer.type, s);
	if (snap->n_params != t->model.n_params) {
		tr_error_set(err, 0, 0, NULL, "the checkpoint has %zu parameters, this model %zu", snap->n_params,
			     t->model.n_params);
		return -EINVAL;
	}
	if (!weights_only && (snap->n_state != want_state || snap->step < 0 || snap->step > t->plan.total_steps)) {
		tr_error_set(err, 0, 0, NULL,
			     "the checkpoint (%d optimizer buffers, step %lld) does not fit this job (%d "
			     "buffers, %lld steps)",
			     snap->n_state, (long long)snap->step, want_state, (long long)t->plan.total_steps);
		return -EINVAL;
	}
	tr_backend_t *be = t->be;
	size_t bytes = t->model.n_params * sizeof(float);
	/* Writes below must not reach buffers a snapshot still reads. */
	if (tr_trainer_unlend(t, true) < 0) {
		tr_error_set(err, 0, 0, NULL, "device %d: %s", t->ranks[0].rep.dev, be->i->last_error(be));
		return -EIO;
	}
	for (int i = 0; i < t->ndev; i++) {
		tr_replica_t *r = &t->ranks[i].rep;
		int rc = be->i->to_device(be, r->dev, r->params, snap->params, bytes);
		for (int k = 0; rc == 0 && !weights_only && k < snap->n_state; k++)
			rc = be->i->to_device(be, r->dev, k == 0 ? r->state1 : r->state2, snap->state[k], bytes);
		if (rc == 0)
			rc = be->i->sync(be, r->dev);
		if (rc < 0) {
			tr_error_set(err, 0, 0, NULL, "device %d: %s", r->dev, be->i->last_error(be));
			return rc;
		}
	}
	if (!weights_only) {
		t->start_step = snap->step;
		restore_early_stop(t, snap);
		tr_trainer_conv_routes_adopt(t, json_string_value(json_object_get(snap->meta, "conv_routes")));
	}
	return 0;
}

void tr_trainer_request_checkpoint(tr_trainer_t *t)
{
	atomic_store(&t->checkpoint_requested, true);
}
