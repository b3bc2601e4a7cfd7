/* One data-parallel step on every rank (see trainer.h).
 *
 * Step protocol: the coordinator (rank 0's thread) takes the batch, bumps a
 * generation counter that releases ranks 1..D-1, runs rank 0's share itself,
 * then waits for the others.  The allreduce inside the step is the only
 * point where ranks wait on each other; an error on any rank aborts the
 * communicator so no rank can block forever.  Control flags (stop, cancel)
 * are read between steps; cancel additionally wakes the prefetch ring and
 * the communicator.
 *
 * Upload-ahead (backends with to_device_async): while step s runs, each
 * rank looks whether step s+1 is loaded already and, if so, enqueues its
 * share of s+1 on the device's copy stream into a second pair of input
 * buffers; step s+1 then swaps the pairs and only fences.  The look never
 * waits, so a slow ring costs nothing (step s+1 copies at its start, as
 * without the feature).  Slot s+1 stays valid throughout: the run loop
 * releases a step only after running it, and step s's final sync (or the
 * failure path's) waits for the copy stream before any slot can be freed.
 */
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

/* ---- one step on one rank --------------------------------------------- */

/* The forward pass reads acts[0], the loss reads labels: after the swap
 * both point at the pair that holds this step's share. */
static void swap_inputs(struct rank_ctx *rc)
{
	tr_replica_t *r = &rc->rep;
	float *x = r->input, *y = r->labels;
	r->input = r->acts[0] = rc->spare_input;
	r->labels = rc->spare_labels;
	rc->spare_input = x;
	rc->spare_labels = y;
}

/* Copies rows [off, off + len) of host inputs x (F wide) and labels y (L
 * wide) into device buffers dx, dy with `copy` (to_device or
 * to_device_async). */
int tr_trainer_copy_rows(copy_to_device_fn copy, tr_backend_t *be, int dev, float *dx, float *dy, const float *x,
			 const float *y, int off, int len, int F, int L)
{
	int ret = copy(be, dev, dx, x + (size_t)off * F, (size_t)len * F * sizeof(float));
	if (ret == 0)
		ret = copy(be, dev, dy, y + (size_t)off * L, (size_t)len * L * sizeof(float));
	return ret;
}

/* Puts this rank's share of the current step (len > 0 rows from off) in
 * the replica's input buffers: uploaded ahead during the previous step,
 * then the compute stream only waits for that copy, or copied now. */
static int upload_share(struct tr_trainer *t, struct rank_ctx *rc, int off, int len)
{
	tr_backend_t *be = t->be;
	tr_replica_t *r = &rc->rep;
	const struct tr_batch *b = t->batch;
	const int F = t->model.inputs, L = r->label_dim;
	if (rc->ahead_step == t->step) {
		rc->ahead_step = -1;
		swap_inputs(rc);
		return be->i->copies_fence(be, r->dev);
	}
	return tr_trainer_copy_rows(be->i->to_device, be, r->dev, r->input, r->labels, b->x, b->y, off, len, F, L);
}

/* When the ring holds step s+1 already, enqueues this rank's share of it
 * into the spare pair on the copy stream, so that it travels while step s
 * computes.  Never waits for data (nor counts in data_wait_ms): a step not
 * loaded yet copies its share itself when it runs; a cancel or a loading
 * error is the run loop's to report.  The spare pair is idle: its last
 * reader was an earlier step, finished by that step's sync. */
static int upload_ahead(struct tr_trainer *t, struct rank_ctx *rc)
{
	int64_t next = t->step + 1;
	if (!t->upload_ahead || rc->ahead_step == next || next >= t->plan.total_steps)
		return 0;
	const struct tr_batch *b;
	if (tr_prefetch_try_next(t->prefetch, next, &b) < 0)
		return 0;
	tr_backend_t *be = t->be;
	const int F = t->model.inputs, L = rc->rep.label_dim;
	int off, len;
	tr_trainer_share(t, b->count, rc->rank, &off, &len);
	if (len == 0)
		return 0; /* idle next step: it clears its gradient, nothing to copy */
	/* Set first: after a failed enqueue the other copy may be in flight,
	 * and the failure path must wait for it (see rank_step). */
	rc->ahead_step = next;
	return tr_trainer_copy_rows(be->i->to_device_async, be, rc->rep.dev, rc->spare_input, rc->spare_labels, b->x,
				    b->y, off, len, F, L);
}

/* Whether snapshots can share rank 0's buffers (engine/backend.h). */
bool tr_trainer_can_lend(const tr_backend_t *be)
{
	return be->i->memory_is_host && be->i->sgd_step_into && be->i->adam_step_into;
}

/* Ends the loan: rank 0's replica takes next_bufs as its buffers (adopt;
 * they hold its values by now), or lets go of the lent ones and hands
 * next_bufs back (it is going away).  The lent buffers stay the
 * snapshot's. */
static void end_loan(struct tr_trainer *t, bool adopt)
{
	tr_replica_t *r = &t->ranks[0].rep;
	float **cur[3] = {&r->params, &r->state1, &r->state2};
	for (int k = 0; k <= t->opt_buffers; k++) {
		if (!adopt)
			tr_snapshot_buffer_put(t->next_bufs[k], t->model.n_params);
		*cur[k] = adopt ? t->next_bufs[k] : NULL;
		t->next_bufs[k] = NULL;
	}
	tr_snapshot_lease_drop(t->lent);
	t->lent = NULL;
}

/* Rank 0's update while a snapshot shares its buffers: the results go to
 * next_bufs, which become the replica's. */
static int update_lent(struct tr_trainer *t, tr_replica_t *r, const struct tr_optim_hp *hp)
{
	float **nb = t->next_bufs;
	int ret = tr_optim_apply_into(t->be, r->dev, t->spec->optimizer.type, t->model.n_params, r->params, r->grads,
				      r->state1, r->state2, nb[0], nb[1], nb[2], hp);
	if (ret == 0)
		end_loan(t, true);
	return ret;
}

/* Ends a loan early (the trainer is going away or being restored).
 * keep_values: the replica's values are copied into buffers of its own;
 * otherwise they are about to be freed anyway. */
int tr_trainer_unlend(struct tr_trainer *t, bool keep_values)
{
	if (!t->lent)
		return 0;
	tr_replica_t *r = &t->ranks[0].rep;
	float *cur[3] = {r->params, r->state1, r->state2};
	size_t bytes = t->model.n_params * sizeof(float);
	for (int k = 0; keep_values && k <= t->opt_buffers; k++) {
		int rc = t->be->i->copy(t->be, r->dev, t->next_bufs[k], cur[k], bytes);
		if (rc < 0)
			return rc;
	}
	end_loan(t, keep_values);
	return 0;
}

int tr_trainer_layer_ranges(const struct tr_trainer *t, size_t *off, size_t *len, int *layer_of)
{
	const tr_model_t *m = &t->model;
	int n = 0;
	for (int i = 0; i < m->n_layers; i++) {
		const struct tr_layer *l = &m->layers[i];
		if (l->w_len && l->b_len && l->b_off == l->w_off + l->w_len) {
			off[n] = l->w_off, len[n] = l->w_len + l->b_len, layer_of[n++] = i;
			continue;
		}
		if (l->w_len)
			off[n] = l->w_off, len[n] = l->w_len, layer_of[n++] = i;
		if (l->b_len)
			off[n] = l->b_off, len[n] = l->b_len, layer_of[n++] = i;
	}
	return n;
}

/* One sumsq_ranges call for every layer: per-layer norms were one sumsq
 * (and on CUDA one host wait) per layer. */
int tr_trainer_layer_sums_enqueue(struct tr_trainer *t, const float *buf)
{
	size_t off[TR_SUMSQ_MAX_RANGES], len[TR_SUMSQ_MAX_RANGES];
	int layer_of[TR_SUMSQ_MAX_RANGES];
	struct rank_ctx *rc = &t->ranks[0];
	int n = tr_trainer_layer_ranges(t, off, len, layer_of);
	if (n == 0)
		return 0;
	return t->be->i->sumsq_ranges(t->be, rc->rep.dev, n, off, len, buf, rc->stats_dev + STAT_LAYERS);
}

void tr_trainer_layer_sums_read(const struct tr_trainer *t, const double *host, double *out)
{
	size_t off[TR_SUMSQ_MAX_RANGES], len[TR_SUMSQ_MAX_RANGES];
	int layer_of[TR_SUMSQ_MAX_RANGES];
	int n = tr_trainer_layer_ranges(t, off, len, layer_of);
	for (int i = 0; i < t->model.n_layers; i++)
		out[i] = 0.0;
	for (int k = 0; k < n; k++)
		out[layer_of[k]] += host[STAT_LAYERS + k];
}

/* Brings rank 0's results [first, first + count) to its host copy: one
 * host wait, for reads after a step (monitors, stop_on_nan's message). */
static int read_stats_now(struct tr_trainer *t, int first, int count)
{
	struct rank_ctx *rc = &t->ranks[0];
	tr_backend_t *be = t->be;
	int ret = be->i->to_host(be, rc->rep.dev, rc->stats_host + first, rc->stats_dev + first,
				 (size_t)count * sizeof(double));
	return ret < 0 ? ret : be->i->sync(be, rc->rep.dev);
}

int tr_trainer_read_sumsq(struct tr_trainer *t, size_t n, const float *x, double *out)
{
	struct rank_ctx *rc = &t->ranks[0];
	int ret = t->be->i->sumsq(t->be, rc->rep.dev, n, x, rc->stats_dev + STAT_SCRATCH);
	if (ret == 0 && (ret = read_stats_now(t, STAT_SCRATCH, 1)) == 0)
		*out = rc->stats_host[STAT_SCRATCH];
	return ret;
}

int tr_trainer_layer_sumsq(struct tr_trainer *t, const float *buf, double *out)
{
	int ret = tr_trainer_layer_sums_enqueue(t, buf);
	if (ret == 0 && (ret = read_stats_now(t, STAT_LAYERS, TR_SUMSQ_MAX_RANGES)) == 0)
		tr_trainer_layer_sums_read(t, t->ranks[0].stats_host, out);
	return ret;
}

static int rank_step(struct tr_trainer *t, struct rank_ctx *rc)
{
	double t0 = tr_trainer_mono_s();
	tr_replica_t *r = &rc->rep;
	tr_backend_t *be = t->be;
	const struct tr_batch *b = t->batch;
	size_t np = t->model.n_params;
	int off, len, ret;
	bool exact = t->spec->exact_shards > 0;
	tr_trainer_share(t, b->count, rc->rank, &off, &len);
	rc->loss[0] = rc->loss[1] = 0.0;
	double *stats = rc->stats_dev;
	/* The losses add into their slots; nothing is read before the final
	 * sync (docs/design.md, "Host waits"). */
	if ((ret = be->i->memset0(be, r->dev, stats, STAT_COUNT * sizeof(double))) < 0)
		goto fail;

	/* Never reused from the last step: the backward pass overwrites every
	 * gradient, and an idle rank clears its buffer so that its contribution
	 * to the allreduce is exactly zero (the stale-gradient bug).  In exact
	 * mode the exact sum overwrites it. */
	if (!exact && len == 0 && (ret = be->i->memset0(be, r->dev, r->grads, np * sizeof(float))) < 0)
		goto fail;
	if (len > 0 && (ret = upload_share(t, rc, off, len)) < 0)
		goto fail;
	/* Looked for twice: from here the copy overlaps the whole step; before
	 * the final sync the ring has had the step's time to load s+1. */
	if ((ret = upload_ahead(t, rc)) < 0)
		goto fail;
	/* A model whose layers synchronise within the passes (batchnorm2d's
	 * global statistics) runs them on a rank without rows too, with 0
	 * rows: its collectives must meet the other ranks'.  Its gradients
	 * then come out zero as above. */
	r->step_rows = b->count;
	if (exact) {
		if ((ret = tr_trainer_exact_grads(t, rc, off, len)) < 0)
			goto fail;
	} else {
		if ((len > 0 || t->model.collective) &&
		    ((ret = tr_replica_forward(r, len, off, t->step, 1)) < 0 ||
		     (ret = tr_replica_loss(r, len, 1.0f / (float)b->count, stats + STAT_LOSS)) < 0 ||
		     (ret = tr_replica_backward(r, len)) < 0))
			goto fail;
		if (t->ndev > 1 && (ret = be->i->allreduce_sum(t->comm, rc->rank, r->grads, np)) < 0)
			goto fail;
	}

	float clip = t->spec->clip_grad_norm;
	bool stop_on_nan = t->spec->stop_on_nan;
	bool want_norm = clip > 0.0f || t->want_grad_norm || stop_on_nan;
	bool want_layers = rc->rank == 0 && t->want_layer_grad_norms;
	if (want_norm && (ret = be->i->sumsq(be, r->dev, np, r->grads, stats + STAT_GRAD)) < 0)
		goto fail;
	/* Per layer, before clipping like the global norm (the allreduced
	 * gradient is the same on every rank, so rank 0's serves). */
	if (want_layers && (ret = tr_trainer_layer_sums_enqueue(t, r->grads)) < 0)
		goto fail;
	/* torch.nn.utils.clip_grad_norm_, its coefficient formed on the device */
	if (clip > 0.0f && (ret = be->i->clip_scale(be, r->dev, np, r->grads, clip, stats + STAT_GRAD)) < 0)
		goto fail;
	struct tr_optim_hp hp = tr_optim_hp_from_spec(t->spec, t->lr, t->step + 1);
	/* The sum of squares (in double: no overflow from finite floats) is
	 * finite exactly when every gradient is.  After the allreduce every
	 * rank holds the same gradient and reaches the same verdict on its
	 * device, so all skip the update together and the replicas stay
	 * equal; the run loop then fails the job before any checkpoint can
	 * take the bad step. */
	if (stop_on_nan)
		hp.skip_unless_finite = stats + STAT_GRAD;
	if (rc->rank == 0 && t->lent)
		ret = update_lent(t, r, &hp);
	else
		ret = tr_optim_apply(be, r->dev, t->spec->optimizer.type, t->model.n_trainable, r->params, r->grads,
				     r->state1, r->state2, &hp);
	if (ret < 0)
		goto fail;
	if (t->opt.debug_poison_grads) {
		float *garbage = malloc(np * sizeof(float));
		if (garbage) {
			for (size_t i = 0; i < np; i++)
				garbage[i] = 1e3f + (float)(i % 7);
			be->i->to_device(be, r->dev, r->grads, garbage, np * sizeof(float));
			be->i->sync(be, r->dev);
			free(garbage);
		}
	}
	if ((ret = be->i->to_host(be, r->dev, rc->stats_host, stats, STAT_COUNT * sizeof(double))) < 0)
		goto fail;
	if ((ret = upload_ahead(t, rc)) < 0)
		goto fail;
	/* The step's one host wait: only now are its results read. */
	if ((ret = be->i->sync(be, r->dev)) < 0)
		goto fail;
	rc->loss[0] = rc->stats_host[STAT_LOSS];
	rc->loss[1] = rc->stats_host[STAT_LOSS + 1];
	rc->grad_sumsq = want_norm ? rc->stats_host[STAT_GRAD] : 0.0;
	rc->grads_nonfinite = stop_on_nan && !isfinite(rc->grad_sumsq);
	if (want_layers)
		tr_trainer_layer_sums_read(t, rc->stats_host, t->layer_grad_sumsq);
	if (exact)
		tr_trainer_exact_losses_read(t, rc);
	rc->step_ms = (tr_trainer_mono_s() - t0) * 1e3;
	return 0;
fail:
	snprintf(rc->err, sizeof rc->err, "device %d (rank %d), step %lld: %s", r->dev, rc->rank,
		 (long long)t->step + 1, ret == -ECANCELED ? "cancelled" : be->i->last_error(be));
	if (t->comm)
		be->i->comm_abort(t->comm);
	/* A copy of step s+1 may still read its prefetch slot, which the run
	 * loop frees once this failure has ended the job.  After the abort, so
	 * that no collective holds the device. */
	if (rc->ahead_step == t->step + 1)
		(void)be->i->sync(be, r->dev);
	return ret;
}

static void *rank_main(void *arg)
{
	struct rank_ctx *rc = arg;
	struct tr_trainer *t = rc->t;
	int64_t seen = 0;
	char name[16];
	snprintf(name, sizeof name, "tr-rank%d", rc->rank);
	pthread_setname_np(pthread_self(), name); /* for top -H and perf */
	for (;;) {
		pthread_mutex_lock(&t->lock);
		while (t->gen == seen && !t->quit)
			pthread_cond_wait(&t->go, &t->lock);
		if (t->quit) {
			pthread_mutex_unlock(&t->lock);
			break;
		}
		seen = t->gen;
		pthread_mutex_unlock(&t->lock);

		rc->rc = rank_step(t, rc);

		pthread_mutex_lock(&t->lock);
		t->finished_ranks++;
		pthread_cond_signal(&t->done);
		pthread_mutex_unlock(&t->lock);
	}
	return NULL;
}

int tr_trainer_start_rank_threads(struct tr_trainer *t, struct tr_error *err)
{
	for (int i = 1; i < t->ndev; i++) {
		if (pthread_create(&t->ranks[i].thread, NULL, rank_main, &t->ranks[i]) != 0) {
			tr_error_set(err, 0, 0, NULL, "cannot start the thread of device %d", t->devs[i]);
			return -EAGAIN;
		}
		t->ranks[i].started = true;
	}
	return 0;
}

/* Runs one step on every rank; returns the first rank error. */
int tr_trainer_run_step_all(struct tr_trainer *t, struct tr_error *err)
{
	pthread_mutex_lock(&t->lock);
	t->finished_ranks = 0;
	t->gen++;
	pthread_cond_broadcast(&t->go);
	pthread_mutex_unlock(&t->lock);

	t->ranks[0].rc = rank_step(t, &t->ranks[0]);

	pthread_mutex_lock(&t->lock);
	while (t->finished_ranks < t->ndev - 1)
		pthread_cond_wait(&t->done, &t->lock);
	pthread_mutex_unlock(&t->lock);

	/* Report the root cause, not the ranks woken by the abort. */
	int first = 0;
	for (int i = 0; i < t->ndev; i++) {
		if (t->ranks[i].rc < 0 && t->ranks[i].rc != -ECANCELED) {
			tr_error_set(err, 0, 0, NULL, "%s", t->ranks[i].err);
			return t->ranks[i].rc;
		}
		if (t->ranks[i].rc < 0 && !first)
			first = t->ranks[i].rc;
	}
	if (first)
		tr_error_set(err, 0, 0, NULL, "cancelled");
	return first;
}
