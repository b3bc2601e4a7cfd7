/* batchnorm2d over the global batch (norm2d.h).
 *
 * Forward takes two collectives: the per-channel sums give the mean, then
 * the sums of squared deviations from that mean give the variance.  One
 * collective of sum and sum of squares (E[x^2] - E[x]^2) would be cheaper,
 * but in float it loses every digit when |mean| >> std, and the allreduce
 * is float; the second pass costs one more barrier per layer (a few us on
 * CPU devices).  Backward takes one, of sum(dy) and sum(dy (x - mean)).
 * With one device there is nothing to exchange and the sums are this
 * device's.
 */
#include "engine/model/norm2d.h"

#include <errno.h>
#include <stdio.h>

#include "engine/model/model.h"

static int allreduce(const struct tr_norm_ctx *nc, float *buf, size_t len)
{
	if (nc->ndev <= 1)
		return 0;
	return nc->be->i->allreduce_sum(nc->comm, nc->rank, buf, len);
}

static int have_kernels(const struct tr_norm_ctx *nc)
{
	const tr_backend_i *bi = nc->be->i;
	if (!bi->bn_sums || !bi->bn_apply || !bi->bn_running_update || !bi->bn_backward_sums || !bi->bn_backward_apply)
		return -ENOTSUP;
	return 0;
}

/* Exact mode: kernel `sums` over each shard of this rank into its own
 * partial (at most partial_stride floats, len of them), then the exact sum
 * over every shard of the step into out. */
typedef int (*shard_sums_fn)(const struct tr_norm_ctx *nc, int n, const float *x, const float *dy, float *part,
			     float *dgamma, float *dbeta, const void *arg);

struct shard_args {
	int c, hw;
	float eps;
	const float *mean, *var;
	size_t goff, boff; /* dgamma, dbeta in the gradient buffers */
	bool weights;
};

static int sums_of(const struct tr_norm_ctx *nc, int n, const float *x, const float *dy, float *part, float *dgamma,
		   float *dbeta, const void *arg)
{
	const struct shard_args *a = arg;
	(void)dy, (void)dgamma, (void)dbeta;
	return nc->be->i->bn_sums(nc->be, nc->dev, n, a->c, a->hw, x, a->mean, part);
}

static int backward_sums_of(const struct tr_norm_ctx *nc, int n, const float *x, const float *dy, float *part,
			    float *dgamma, float *dbeta, const void *arg)
{
	const struct shard_args *a = arg;
	return nc->be->i->bn_backward_sums(nc->be, nc->dev, n, a->c, a->hw, a->eps, x, a->mean, a->var, dy, part,
					   dgamma, dbeta);
}

static int shard_sums(const struct tr_norm_ctx *nc, shard_sums_fn fn, const struct shard_args *a, const float *x,
		      const float *dy, float *out, size_t len)
{
	const struct tr_shard_set *sh = nc->shards;
	const float *parts[TR_SPEC_MAX_SHARDS];
	size_t per = (size_t)a->c * a->hw;
	for (int k = 0; k < sh->count; k++) {
		float *part = sh->partials + (size_t)k * sh->partial_stride;
		float *g = sh->views[k].grads;
		size_t off = (size_t)sh->off[k] * per;
		int rc = fn(nc, sh->len[k], x + off, dy ? dy + off : NULL, part, a->weights ? g + a->goff : NULL,
			    a->weights ? g + a->boff : NULL, a);
		if (rc < 0)
			return rc;
		parts[k] = part;
	}
	return sh->sum(sh->sum_ctx, parts, sh->count, out, len);
}

/* The step's sums of this rank's samples: per shard and exactly combined
 * in exact mode, else the kernel over all n and the float allreduce. */
static int step_sums(const struct tr_norm_ctx *nc, int n, const struct shard_args *a, const float *x, float *out)
{
	int rc;
	if (nc->shards)
		return shard_sums(nc, sums_of, a, x, NULL, out, (size_t)a->c);
	if ((rc = nc->be->i->bn_sums(nc->be, nc->dev, n, a->c, a->hw, x, a->mean, out)) < 0)
		return rc;
	return allreduce(nc, out, (size_t)a->c);
}

int tr_bn_forward_train(const struct tr_norm_ctx *nc, int n, int c, int hw, int64_t step_rows, float eps,
			float momentum, const float *x, const float *gamma, const float *beta, float *y, float *mean,
			float *var, float *run_mean, float *run_var, float *batches)
{
	tr_backend_t *be = nc->be;
	const tr_backend_i *bi = be->i;
	int rc;
	if ((rc = have_kernels(nc)) < 0)
		return rc;
	/* A step with a single value per channel fails in
	 * bn_running_update (torch refuses it too: the unbiased running
	 * variance would divide by zero), after both collectives and on
	 * every rank alike, so no rank is left waiting. */
	double count = (double)step_rows * hw;
	struct shard_args a = {.c = c, .hw = hw};
	if ((rc = step_sums(nc, n, &a, x, mean)) < 0 ||
	    (rc = bi->scale(be, nc->dev, (size_t)c, mean, (float)(1.0 / count))) < 0)
		return rc;
	a.mean = mean;
	if ((rc = step_sums(nc, n, &a, x, var)) < 0 ||
	    (rc = bi->scale(be, nc->dev, (size_t)c, var, (float)(1.0 / count))) < 0)
		return rc;
	if ((rc = bi->bn_running_update(be, nc->dev, c, momentum, count, mean, var, run_mean, run_var, batches)) < 0)
		return rc;
	if (!nc->shards)
		return n > 0 ? bi->bn_apply(be, nc->dev, n, c, hw, eps, x, mean, var, gamma, beta, y) : 0;
	/* per shard, so that every shard sees the kernel with its own shape */
	for (int k = 0; k < nc->shards->count; k++) {
		size_t off = (size_t)nc->shards->off[k] * c * hw;
		if ((rc = bi->bn_apply(be, nc->dev, nc->shards->len[k], c, hw, eps, x + off, mean, var, gamma, beta,
				       y + off)) < 0)
			return rc;
	}
	return 0;
}

int tr_bn_forward_eval(const struct tr_norm_ctx *nc, int n, int c, int hw, float eps, const float *x,
		       const float *gamma, const float *beta, const float *run_mean, const float *run_var, float *y)
{
	int rc;
	if ((rc = have_kernels(nc)) < 0)
		return rc;
	if (n == 0)
		return 0;
	return nc->be->i->bn_apply(nc->be, nc->dev, n, c, hw, eps, x, run_mean, run_var, gamma, beta, y);
}

int tr_bn_backward(const struct tr_norm_ctx *nc, int n, int c, int hw, int64_t step_rows, float eps, const float *x,
		   const float *gamma, const float *mean, const float *var, const float *dy, float *dx, float *scratch,
		   float *dgamma, float *dbeta)
{
	tr_backend_t *be = nc->be;
	const tr_backend_i *bi = be->i;
	double count = (double)step_rows * hw;
	int rc;
	if ((rc = have_kernels(nc)) < 0)
		return rc;
	if (nc->shards) {
		/* each shard's weight gradients in its own buffer, which the
		 * trainer's exact sum adds as it adds every other gradient */
		struct shard_args a = {.c = c,
				       .hw = hw,
				       .eps = eps,
				       .mean = mean,
				       .var = var,
				       .goff = (size_t)(dgamma - nc->grads),
				       .boff = (size_t)(dbeta - nc->grads),
				       .weights = true};
		if ((rc = shard_sums(nc, backward_sums_of, &a, x, dy, scratch, TR_BN_SCRATCH(c))) < 0 || !dx)
			return rc;
		for (int k = 0; k < nc->shards->count; k++) {
			size_t off = (size_t)nc->shards->off[k] * c * hw;
			if ((rc = bi->bn_backward_apply(be, nc->dev, nc->shards->len[k], c, hw, eps, count, x + off,
							mean, var, gamma, scratch, dy + off, dx + off)) < 0)
				return rc;
		}
		return 0;
	}
	/* dgamma/dbeta get this rank's sums before the exchange: the
	 * trainer's gradient allreduce adds the ranks' shares, as DDP does
	 * with SyncBatchNorm's weight gradients. */
	if ((rc = bi->bn_backward_sums(be, nc->dev, n, c, hw, eps, x, mean, var, dy, scratch, dgamma, dbeta)) < 0 ||
	    (rc = allreduce(nc, scratch, TR_BN_SCRATCH(c))) < 0)
		return rc;
	if (n == 0 || !dx)
		return 0;
	return bi->bn_backward_apply(be, nc->dev, n, c, hw, eps, count, x, mean, var, gamma, scratch, dy, dx);
}
