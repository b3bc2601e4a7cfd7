/* The exact sum of exact mode (exact.h). */
#include "engine/exact.h"

#include <errno.h>
#include <time.h>

#include "engine/spec.h"

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

size_t tr_exact_slot_floats(const tr_backend_t *be, int ndev, int nproc, int shards, size_t n)
{
	if (nproc <= 1 && (be->i->exact_sum || ndev <= 1))
		return 0;
	return (size_t)shards * n;
}

/* out = ((0 + parts[0]) + parts[1]) + ..., with the backend's elementwise
 * add. */
static int fold(tr_backend_t *be, int dev, const float *const *parts, int nparts, float *out, size_t n)
{
	int rc = be->i->memset0(be, dev, out, n * sizeof(float));
	for (int k = 0; k < nparts && rc == 0; k++)
		rc = be->i->add(be, dev, n, out, parts[k], out);
	return rc;
}

/* A barrier of the process's ranks: an allreduce of nothing. */
static int local_barrier(struct tr_exact_ctx *x)
{
	float none = 0.0f;
	return x->ndev > 1 ? x->be->i->allreduce_sum(x->comm, x->rank, &none, 0) : 0;
}

/* Several processes: the process's ranks put their parts into their
 * slots and add their slots over the process's shards (one non-zero
 * contributor each: exact), its rank 0 gathers the other processes'
 * slots, and every rank folds all of rank 0's slots in order.  The last
 * barrier keeps rank 0 from clearing its slots for the next sum while
 * another rank still reads them. */
static int cross_process_sum(struct tr_exact_ctx *x, const float *const *parts, int nparts, float *out, size_t n)
{
	tr_backend_t *be = x->be;
	const struct tr_exact_procs *pr = x->procs;
	const int pf = pr->first[pr->proc], pc = pr->count[pr->proc];
	if (!x->slots || n > x->slot_floats || x->first + nparts > x->shards || x->first < pf ||
	    x->first + nparts > pf + pc)
		return -EINVAL;
	float *mine = x->slots + (size_t)pf * n;
	int rc = be->i->memset0(be, x->dev, mine, (size_t)pc * n * sizeof(float));
	for (int k = 0; k < nparts && rc == 0; k++)
		rc = be->i->copy(be, x->dev, x->slots + (size_t)(x->first + k) * n, parts[k], n * sizeof(float));
	if (rc == 0 && x->ndev > 1)
		rc = be->i->allreduce_sum(x->comm, x->rank, mine, (size_t)pc * n);
	if (rc == 0 && x->rank == 0) {
		double t0 = now_ms();
		rc = pr->pcomm->i->gather_shards(pr->pcomm, x->slots, n, pr->first, pr->count);
		double ms = now_ms() - t0; /* all of it waited for */
		x->comm_ms += ms;
		x->wait_ms += ms;
	}
	if (rc == 0)
		rc = local_barrier(x);
	if (rc < 0)
		return rc;
	const float *all = x->rank == 0 ? x->slots : *x->leader_slots;
	const float *slot[TR_SPEC_MAX_SHARDS];
	for (int k = 0; k < x->shards; k++)
		slot[k] = all + (size_t)k * n;
	rc = fold(be, x->dev, slot, x->shards, out, n);
	if (rc == 0)
		rc = local_barrier(x);
	return rc;
}

int tr_exact_sum(void *arg, const float *const *parts, int nparts, float *out, size_t n)
{
	struct tr_exact_ctx *x = arg;
	tr_backend_t *be = x->be;
	if (x->procs)
		return cross_process_sum(x, parts, nparts, out, n);
	if (be->i->exact_sum && !x->group)
		return be->i->exact_sum(x->comm, x->rank, parts, nparts, out, n);
	if (x->ndev <= 1 && !x->group)
		return fold(be, x->dev, parts, nparts, out, n);
	if (!x->slots || n > x->slot_floats || x->first + nparts > x->shards)
		return -EINVAL;
	size_t all = (size_t)x->shards * n;
	int rc = be->i->memset0(be, x->dev, x->slots, all * sizeof(float));
	for (int k = 0; k < nparts && rc == 0; k++)
		rc = be->i->copy(be, x->dev, x->slots + (size_t)(x->first + k) * n, parts[k], n * sizeof(float));
	if (rc == 0)
		rc = be->i->allreduce_sum(x->comm, x->rank, x->slots, all);
	if (rc < 0)
		return rc;
	const float *slot[TR_SPEC_MAX_SHARDS];
	for (int k = 0; k < x->shards; k++)
		slot[k] = x->slots + (size_t)k * n;
	return fold(be, x->dev, slot, x->shards, out, n);
}

/* ---- overlap (one device per process) ------------------------------------ */

void tr_exact_overlap_begin(struct tr_exact_ctx *x, const float *const *parts, int nparts, const float *add, size_t n)
{
	struct tr_exact_overlap *ov = &x->ov;
	for (int k = 0; k < nparts; k++)
		ov->parts[k] = parts[k];
	ov->nparts = nparts;
	ov->add = nparts ? add : NULL;
	ov->n = n;
	ov->hi = ov->params_end;
	ov->next = ov->n_layers - 1;
	ov->nb = 0;
}

/* Floats [lo, hi) of the sum, one bucket: this process's parts written
 * into the bucket's slots (zeros for its empty shards), as
 * cross_process_sum does for whole slots, then their gather started.
 * The bucket's S slots lie together (tr_exact_overlap.b_lo), so that a
 * process's shards of it are one contiguous block for MPI rather than S
 * strided pieces. */
static int send_bucket(struct tr_exact_ctx *x, size_t lo, size_t hi)
{
	tr_backend_t *be = x->be;
	struct tr_exact_overlap *ov = &x->ov;
	const struct tr_exact_procs *pr = x->procs;
	const int pf = pr->first[pr->proc], pc = pr->count[pr->proc];
	const size_t len = hi - lo;
	float *base = x->slots + (size_t)x->shards * lo;
	int rc = 0;
	if (len == 0)
		return 0;
	if (ov->nb == (int)(sizeof ov->b_lo / sizeof ov->b_lo[0]))
		return -EINVAL;
	if (ov->add)
		rc = be->i->add(be, x->dev, len, ov->parts[0] + lo, ov->add + lo, (float *)ov->parts[0] + lo);
	for (int s = pf; s < pf + pc && rc == 0; s++) {
		float *slot = base + (size_t)s * len;
		int k = s - x->first;
		rc = k >= 0 && k < ov->nparts ? be->i->copy(be, x->dev, slot, ov->parts[k] + lo, len * sizeof(float))
					      : be->i->memset0(be, x->dev, slot, len * sizeof(float));
	}
	if (rc < 0)
		return rc;
	ov->b_lo[ov->nb] = lo;
	ov->b_len[ov->nb++] = len;
	double t0 = now_ms();
	rc = pr->pcomm->i->gather_start(pr->pcomm, base, len, 0, len, pr->first, pr->count);
	x->comm_ms += now_ms() - t0;
	return rc;
}

int tr_exact_overlap_layer(void *ctx, int layer)
{
	struct tr_exact_ctx *x = ctx;
	struct tr_exact_overlap *ov = &x->ov;
	const struct tr_exact_procs *pr = x->procs;
	size_t lo = ov->lo_of[layer];
	int rc = 0;
	ov->next = layer - 1;
	if (lo < ov->hi) {
		rc = send_bucket(x, lo, ov->hi);
		ov->hi = lo;
	}
	if (rc == 0) {
		/* beside compute: Open MPI moves data only inside its calls */
		double t0 = now_ms();
		rc = pr->pcomm->i->gather_test(pr->pcomm);
		x->comm_ms += now_ms() - t0;
	}
	return rc;
}

int tr_exact_overlap_end(struct tr_exact_ctx *x, float *out)
{
	struct tr_exact_overlap *ov = &x->ov;
	const struct tr_exact_procs *pr = x->procs;
	const size_t n = ov->n;
	int rc = 0;
	if (!x->slots || n > x->slot_floats)
		return -EINVAL;
	/* the layers a pass did not report (a process without rows this
	 * step runs none), so that every process starts the same buckets */
	for (int i = ov->next; i >= 0 && rc == 0; i--)
		rc = tr_exact_overlap_layer(x, i);
	if (rc == 0)
		rc = send_bucket(x, 0, ov->hi);
	if (rc == 0)
		rc = send_bucket(x, ov->params_end, n); /* past the layers' parameters */
	ov->hi = 0;
	if (rc < 0)
		return rc;
	double t0 = now_ms();
	rc = pr->pcomm->i->gather_wait(pr->pcomm);
	double ms = now_ms() - t0;
	x->comm_ms += ms;
	x->wait_ms += ms;
	/* bucket by bucket, the same chain of additions per element */
	for (int b = 0; b < ov->nb && rc == 0; b++) {
		const float *slot[TR_SPEC_MAX_SHARDS];
		const float *base = x->slots + (size_t)x->shards * ov->b_lo[b];
		for (int k = 0; k < x->shards; k++)
			slot[k] = base + (size_t)k * ov->b_len[b];
		rc = fold(x->be, x->dev, slot, x->shards, out + ov->b_lo[b], ov->b_len[b]);
	}
	return rc;
}
