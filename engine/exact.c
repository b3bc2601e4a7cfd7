/* The exact sum of exact mode (exact.h). */
#include "engine/exact.h"

#include <errno.h>

#include "engine/spec.h"

size_t tr_exact_slot_floats(const tr_backend_t *be, int ndev, int shards, size_t n)
{
	if (be->i->exact_sum || ndev <= 1)
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

int tr_exact_sum(void *arg, const float *const *parts, int nparts, float *out, size_t n)
{
	struct tr_exact_ctx *x = arg;
	tr_backend_t *be = x->be;
	if (be->i->exact_sum)
		return be->i->exact_sum(x->comm, x->rank, parts, nparts, out, n);
	if (x->ndev <= 1)
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
