/* The exact sum of exact mode (exact.h). */
#include "engine/exact.h"

#include <errno.h>

#include "engine/spec.h"

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
	if (rc == 0 && x->rank == 0)
		rc = pr->pcomm->i->gather_shards(pr->pcomm, x->slots, n, pr->first, pr->count);
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
