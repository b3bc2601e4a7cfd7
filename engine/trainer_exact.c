/* Exact mode's part of the step (docs/design.md, "Exact mode").
 *
 * A step's batch of `count` rows is cut into S virtual shards (even sizes,
 * tr_plan_share(count, S, k)), and the shards into the devices
 * (tr_plan_share(S, ndev, rank)): rank r computes shards k0 .. k0 + m - 1,
 * whose rows are one contiguous range, its share.  Both cuts depend on
 * the spec alone (and the device count only through which rank holds a
 * shard), so every shard is computed with the same kernels and shapes on
 * any device count and its gradient has the same bits.  Each shard's
 * gradient goes to a buffer of its own; the exact sum (engine/exact.h)
 * adds every shard's buffer in shard order into every rank's gradient,
 * and the shards' losses are added in shard order too.  Shards past a
 * short last batch's rows are empty: skipped, which is the same as
 * adding their zeros (the sum starts from +0.0).
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/trainer_internal.h"

static int shard_rows(const struct tr_spec *s);

/* The shards of this process's rank `rank`: the first and how many.  The
 * shards are cut over the job's ranks in all its processes (global rank
 * proc * ndev + rank), so a process's shards are contiguous. */
static void rank_shards(const struct tr_trainer *t, int rank, int *first, int *count)
{
	tr_plan_share(t->spec->exact_shards, t->gdev, t->proc * t->ndev + rank, first, count);
}

/* Whether rank rc folds its shards as it computes them: it holds the first
 * shards, and its passes run shard after shard (no collective layers). */
static bool folds_prefix(const struct tr_trainer *t, const struct rank_ctx *rc)
{
	int k0, m;
	rank_shards(t, rc->rank, &k0, &m);
	return k0 == 0 && m > 0 && !t->model.collective;
}

/* Whether rank rc, folding its shards as it computes them, lets the dense
 * layers add their gradients to the running sum themselves (model.h,
 * grad_sum): every layer with parameters is dense, and the backend's
 * gemm accumulates exactly over a shard's rows. */
static bool folds_in_gemm(const struct tr_trainer *t, const struct rank_ctx *rc)
{
	const tr_backend_i *bi = t->be->i;
	if (!folds_prefix(t, rc) || !bi->gemm_accumulate_max_k ||
	    bi->gemm_accumulate_max_k(t->be) < shard_rows(t->spec))
		return false;
	for (int i = 0; i < t->model.n_nodes; i++)
		if (t->model.layers[i].n_tensors && t->model.layers[i].ops->type != TR_LAYER_DENSE)
			return false;
	return true;
}

/* Overlap's buckets (exact.h): for each top-level layer, the lowest
 * offset of its parameters and those of the layers after it.  False
 * where a layer's parameters do not all lie below the next ones' (then a
 * finished layer would not be a finished range). */
static bool bucket_bounds(const tr_model_t *m, size_t *lo_of, size_t *params_end)
{
	size_t lo = 0;
	for (int i = 0; i < m->n_layers; i++) {
		const struct tr_layer *l = &m->layers[i];
		if (l->w_len)
			lo = l->w_off + l->w_len > lo ? l->w_off + l->w_len : lo;
		if (l->b_len)
			lo = l->b_off + l->b_len > lo ? l->b_off + l->b_len : lo;
	}
	*params_end = lo; /* layers after the last with parameters finish nothing */
	for (int i = m->n_layers - 1; i >= 0; i--) {
		const struct tr_layer *l = &m->layers[i];
		size_t a = SIZE_MAX, b = 0;
		if (l->w_len)
			a = l->w_off, b = l->w_off + l->w_len;
		if (l->b_len) {
			a = l->b_off < a ? l->b_off : a;
			b = l->b_off + l->b_len > b ? l->b_off + l->b_len : b;
		}
		if (a != SIZE_MAX) {
			if (b > lo)
				return false;
			lo = a;
		}
		lo_of[i] = lo;
	}
	return true;
}

/* Whether rank rc's gather overlaps its backward pass (exact.h): several
 * processes of one device each, an engine that can, a model without
 * collective layers (whose sums cross mid-pass) and not switched off. */
static bool overlaps(const struct tr_trainer *t, const struct rank_ctx *rc)
{
	return rc->xctx.procs && t->ndev == 1 && rc->xctx.ov.lo_of && !t->model.collective &&
	       !t->spec->exact_no_overlap && t->pcomm->i->gather_start;
}

/* The view of the process's last shard reports its finished layers to
 * the overlapped gather. */
static void report_layers(struct rank_ctx *rc, tr_replica_t *view)
{
	view->layer_done = tr_exact_overlap_layer;
	view->layer_done_ctx = &rc->xctx;
}

/* Shard k's whole forward and backward pass, through its view. */
static int shard_pass(struct tr_trainer *t, struct tr_shard_set *set, int k, int off, float scale, double *loss)
{
	tr_replica_t *v = &set->views[k];
	int rows = set->len[k], ret;
	if ((ret = tr_replica_forward(v, rows, off + set->off[k], t->step, 1)) == 0 &&
	    (ret = tr_replica_loss(v, rows, scale, loss)) == 0)
		ret = tr_replica_backward(v, rows);
	return ret;
}

void tr_trainer_share(const struct tr_trainer *t, int count, int rank, int *off, int *len)
{
	if (!t->spec->exact_shards) {
		tr_plan_share(count, t->ndev, rank, off, len);
		return;
	}
	int k0, m, o, l;
	rank_shards(t, rank, &k0, &m);
	tr_plan_share(count, t->spec->exact_shards, k0 < t->spec->exact_shards ? k0 : 0, off, &l);
	*len = 0;
	for (int k = k0; k < k0 + m; k++) {
		tr_plan_share(count, t->spec->exact_shards, k, &o, &l);
		*len += l;
	}
}

/* The most rows of one shard, of a batch_size step. */
static int shard_rows(const struct tr_spec *s)
{
	return (s->batch_size + s->exact_shards - 1) / s->exact_shards;
}

int tr_trainer_max_rows(const struct tr_spec *s, int ndev)
{
	if (!s->exact_shards)
		return (s->batch_size + ndev - 1) / ndev;
	int most = (s->exact_shards + ndev - 1) / ndev;
	return most * shard_rows(s);
}

int tr_trainer_eval_rows(const struct tr_trainer *t)
{
	/* A fixed chunk, so that validation figures do not depend on the
	 * device count either. */
	return t->spec->exact_shards ? shard_rows(t->spec) : t->ranks[0].rep.max_rows;
}

int tr_trainer_exact_alloc(struct tr_trainer *t, struct rank_ctx *rc, struct tr_error *err)
{
	tr_backend_t *be = t->be;
	const tr_model_t *m = &t->model;
	int dev = rc->rep.dev, k0, count;
	if (!t->spec->exact_shards)
		return 0;
	rank_shards(t, rc->rank, &k0, &count);
	size_t scratch = (size_t)shard_rows(t->spec) * (size_t)m->max_width;
	size_t stride = tr_model_partial_floats(m);
	size_t width = m->n_params > stride ? m->n_params : stride;
	/* a group communicator sums every process's slots itself */
	size_t slots = t->comm_group ? (size_t)t->spec->exact_shards * width
				     : tr_exact_slot_floats(be, t->ndev, t->nproc, t->spec->exact_shards, width);
	bool failed = false;
	rc->n_shard_bufs = folds_prefix(t, rc) ? 1 : count;
	for (int k = 0; k < rc->n_shard_bufs; k++)
		failed |=
			!(rc->shard_grads[k] = be->i->alloc(be, dev, (m->n_params ? m->n_params : 1) * sizeof(float)));
	for (int k = 0; k < 2; k++)
		failed |= !(rc->shard_scratch[k] = be->i->alloc(be, dev, (scratch ? scratch : 1) * sizeof(float)));
	if (stride && count)
		failed |= !(rc->partials = be->i->alloc(be, dev, (size_t)count * stride * sizeof(float)));
	if (slots)
		failed |= !(rc->xctx.slots = be->i->alloc(be, dev, slots * sizeof(float)));
	rc->shards.views = calloc(count ? (size_t)count : 1, sizeof *rc->shards.views);
	failed |= !rc->shards.views;
	if (failed) {
		tr_error_set(err, 0, 0, NULL,
			     "device %d: out of memory for exact mode's %d shard gradients of %zu parameters: %s", dev,
			     count, m->n_params, be->i->last_error(be));
		return -ENOMEM;
	}
	rc->xctx = (struct tr_exact_ctx){.be = be,
					 .comm = t->comm,
					 .rank = rc->rank,
					 .dev = dev,
					 .ndev = t->ndev,
					 .shards = t->spec->exact_shards,
					 .first = k0,
					 .slots = rc->xctx.slots,
					 .slot_floats = slots ? slots / t->spec->exact_shards : 0,
					 .procs = t->nproc > 1 && !t->comm_group ? &t->procs : NULL,
					 .leader_slots = &t->ranks[0].xctx.slots,
					 .group = t->comm_group};
	size_t end = 0;
	if (t->nproc > 1 && !t->comm_group && bucket_bounds(m, rc->bucket_lo, &end))
		rc->xctx.ov =
			(struct tr_exact_overlap){.lo_of = rc->bucket_lo, .params_end = end, .n_layers = m->n_layers};
	rc->shards.sum = tr_exact_sum;
	rc->shards.sum_ctx = &rc->xctx;
	rc->shards.partials = rc->partials;
	rc->shards.partial_stride = stride;
	return 0;
}

void tr_trainer_exact_free(struct tr_trainer *t, struct rank_ctx *rc)
{
	tr_backend_t *be = t->be;
	int dev = rc->rep.dev;
	float **bufs[] = {&rc->shard_scratch[0], &rc->shard_scratch[1], &rc->partials, &rc->xctx.slots};
	for (int k = 0; k < rc->n_shard_bufs; k++) {
		if (rc->shard_grads[k])
			be->i->free(be, dev, rc->shard_grads[k]);
		rc->shard_grads[k] = NULL;
	}
	for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
		if (*bufs[i])
			be->i->free(be, dev, *bufs[i]);
		*bufs[i] = NULL;
	}
	free(rc->shards.views);
	rc->shards.views = NULL;
	rc->n_shard_bufs = 0;
}

int tr_trainer_exact_grads(struct tr_trainer *t, struct rank_ctx *rc, int off, int len)
{
	tr_replica_t *r = &rc->rep;
	struct tr_shard_set *set = &rc->shards;
	const int S = t->spec->exact_shards, count = t->batch->count;
	const float scale = 1.0f / (float)count;
	int k0, m, ret = 0;
	bool ov = overlaps(t, rc);
	rank_shards(t, rc->rank, &k0, &m);
	rc->xctx.comm_ms = rc->xctx.wait_ms = 0.0;
	set->count = 0;
	for (int k = k0; k < k0 + m; k++) {
		int o, l;
		tr_plan_share(count, S, k, &o, &l);
		t->shard_loss[k][0] = t->shard_loss[k][1] = 0.0; /* read after the sync */
		if (l == 0)
			continue; /* the empty shards are the last ones */
		set->off[set->count] = o - off;
		set->len[set->count] = l;
		set->count++;
	}
	tr_shard_views(r, set, rc->shard_grads, rc->shard_scratch);
	const float *parts[TR_SPEC_MAX_SHARDS];
	for (int k = 0; k < set->count; k++)
		parts[k] = rc->shard_grads[k];
	if (t->model.collective) {
		/* node by node: batchnorm2d needs every shard's sums before
		 * any shard can go on (engine/model/model.h) */
		r->shards = set;
		ret = tr_replica_forward(r, len, off, t->step, 1);
		for (int k = 0; k < set->count && ret == 0; k++)
			ret = tr_replica_shard_loss(r, k, scale, rc->stats_dev + STAT_SHARDS + 2 * k);
		if (ret == 0)
			ret = tr_replica_backward(r, len);
		r->shards = NULL;
	} else if (folds_prefix(t, rc)) {
		/* The first shards are the start of the ordered sum: folded
		 * into the replica's gradient as each is done, through one
		 * shard buffer that stays in cache, they make one part, the
		 * prefix, and ((0 + prefix) + g_m) + ... is the same chain of
		 * additions (the prefix, summed from +0.0, is never -0.0). */
		tr_backend_t *be = t->be;
		float *g = rc->shard_grads[0];
		bool in_gemm = folds_in_gemm(t, rc);
		const float *prefix[1] = {r->grads};
		/* overlapped: the last shard's gradient is added bucket by
		 * bucket as its layers finish (the same additions) */
		if (ov)
			tr_exact_overlap_begin(&rc->xctx, prefix, set->count ? 1 : 0, in_gemm ? NULL : g,
					       t->model.n_params);
		ret = be->i->memset0(be, r->dev, r->grads, t->model.n_params * sizeof(float));
		for (int k = 0; k < set->count && ret == 0; k++) {
			bool last = k == set->count - 1;
			set->views[k].grads = g;
			set->views[k].grad_sum = in_gemm ? r->grads : NULL;
			if (ov && last)
				report_layers(rc, &set->views[k]);
			if ((ret = shard_pass(t, set, k, off, scale, rc->stats_dev + STAT_SHARDS + 2 * k)) == 0 &&
			    !in_gemm && !(ov && last))
				ret = be->i->add(be, r->dev, t->model.n_params, r->grads, g, r->grads);
		}
		if (ret < 0)
			return ret;
		if (ov)
			return tr_exact_overlap_end(&rc->xctx, r->grads);
		return tr_exact_sum(&rc->xctx, prefix, set->count ? 1 : 0, r->grads, t->model.n_params);
	} else {
		if (ov)
			tr_exact_overlap_begin(&rc->xctx, parts, set->count, NULL, t->model.n_params);
		for (int k = 0; k < set->count && ret == 0; k++) {
			if (ov && k == set->count - 1)
				report_layers(rc, &set->views[k]);
			ret = shard_pass(t, set, k, off, scale, rc->stats_dev + STAT_SHARDS + 2 * k);
		}
		if (ret == 0 && ov)
			return tr_exact_overlap_end(&rc->xctx, r->grads);
	}
	if (ret < 0)
		return ret;
	/* The whole buffer, as the float path's allreduce: the buffers'
	 * part (batchnorm2d's running statistics) is zero in every shard, and
	 * the sum keeps it zero whatever was written there before. */
	return tr_exact_sum(&rc->xctx, parts, set->count, r->grads, t->model.n_params);
}

void tr_trainer_exact_losses_read(struct tr_trainer *t, const struct rank_ctx *rc)
{
	int k0, m;
	rank_shards(t, rc->rank, &k0, &m);
	for (int k = 0; k < m; k++) {
		t->shard_loss[k0 + k][0] = rc->stats_host[STAT_SHARDS + 2 * k];
		t->shard_loss[k0 + k][1] = rc->stats_host[STAT_SHARDS + 2 * k + 1];
	}
}

double tr_trainer_exact_loss(const struct tr_trainer *t)
{
	double sum = 0.0;
	for (int k = 0; k < t->spec->exact_shards; k++)
		sum += t->shard_loss[k][0];
	return sum;
}

int tr_trainer_procs_setup(struct tr_trainer *t, float *host, struct tr_error *err)
{
	tr_pcomm_t *pc = t->pcomm;
	const int S = t->spec->exact_shards;
	if (t->nproc <= 1)
		return 0;
	/* Every process must cut the shards the same way: equal device
	 * counts (the sum and the sum of squares agree only then). */
	double n[2] = {t->ndev, (double)t->ndev * t->ndev};
	int rc = pc->i->sum_f64(pc, n, 2);
	if (rc < 0) {
		tr_error_set(err, 0, 0, NULL, "processes: %s", pc->i->last_error(pc));
		return rc;
	}
	if (n[0] != (double)t->nproc * t->ndev || n[1] != (double)t->nproc * t->ndev * t->ndev) {
		tr_error_set(err, 0, 0, "/devices",
			     "/devices: every process needs the same device count (process %d has %d, the %d "
			     "processes %g in all)",
			     t->proc, t->ndev, t->nproc, n[0]);
		return -EINVAL;
	}
	t->procs.pcomm = pc;
	t->procs.proc = t->proc;
	t->procs.nproc = t->nproc;
	for (int p = 0; p < t->nproc; p++) {
		int f0, c0, f1, c1;
		tr_plan_share(S, t->gdev, p * t->ndev, &f0, &c0);
		tr_plan_share(S, t->gdev, p * t->ndev + t->ndev - 1, &f1, &c1);
		t->procs.first[p] = f0;
		t->procs.count[p] = f1 + c1 - f0;
	}
	/* The same seed gives the same weights everywhere; process 0's are
	 * sent anyway, so that no local difference (an init.from file read
	 * differently) can split the processes' models. */
	size_t bytes = t->model.n_params * sizeof(float);
	for (size_t off = 0; off < bytes && rc == 0; off += (size_t)1 << 30)
		rc = pc->i->bcast(pc, (char *)host + off,
				  bytes - off < ((size_t)1 << 30) ? bytes - off : (size_t)1 << 30, 0);
	if (rc < 0)
		tr_error_set(err, 0, 0, NULL, "processes: the initial weights: %s", pc->i->last_error(pc));
	return rc;
}

int tr_trainer_procs_sync(struct tr_trainer *t, struct tr_error *err)
{
	enum { STOP = 2 * TR_SPEC_MAX_SHARDS, CANCEL, REASON };
	double buf[REASON + 3];
	const int S = t->spec->exact_shards, pf = t->procs.first[t->proc], pc = t->procs.count[t->proc];
	if (t->nproc <= 1)
		return 0;
	memset(buf, 0, sizeof buf);
	/* this process's shards only: every element has one contributor */
	for (int k = pf; k < pf + pc; k++) {
		buf[2 * k] = t->shard_loss[k][0];
		buf[2 * k + 1] = t->shard_loss[k][1];
	}
	bool stop = atomic_load(&t->stop_requested);
	buf[STOP] = stop;
	buf[CANCEL] = atomic_load(&t->cancel_requested);
	if (stop)
		buf[REASON + atomic_load(&t->stop_reason)] = 1;
	int rc = t->pcomm->i->sum_f64(t->pcomm, buf, sizeof buf / sizeof buf[0]);
	if (rc < 0) {
		tr_error_set(err, 0, 0, NULL, "processes: after step %lld: %s", (long long)t->step + 1,
			     t->pcomm->i->last_error(t->pcomm));
		return rc;
	}
	for (int k = 0; k < S; k++) {
		t->shard_loss[k][0] = buf[2 * k];
		t->shard_loss[k][1] = buf[2 * k + 1];
	}
	t->agreed_stop = buf[STOP] > 0;
	t->agreed_cancel = buf[CANCEL] > 0;
	/* a process that was not asked stops for the reason of one that was
	 * (the highest: shutdown over pause over stop) */
	for (int why = 2; why >= 0 && t->agreed_stop; why--)
		if (buf[REASON + why] > 0) {
			tr_trainer_stop_for(t, (enum tr_stop_reason)why);
			break;
		}
	return 0;
}

void tr_trainer_proc_rows(void *ctx, int count, int *begin, int *end)
{
	const struct tr_trainer *t = ctx;
	const int S = t->spec->exact_shards, pf = t->procs.first[t->proc], pc = t->procs.count[t->proc];
	int off, len;
	*begin = *end = 0;
	if (pc == 0)
		return; /* more ranks than shards: this process has none */
	tr_plan_share(count, S, pf, &off, &len);
	*begin = off;
	tr_plan_share(count, S, pf + pc - 1, &off, &len);
	*end = off + len;
}
