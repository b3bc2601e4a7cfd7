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
	if ((rc = bi->bn_sums(be, nc->dev, n, c, hw, x, NULL, mean)) < 0 || (rc = allreduce(nc, mean, (size_t)c)) < 0 ||
	    (rc = bi->scale(be, nc->dev, (size_t)c, mean, (float)(1.0 / count))) < 0)
		return rc;
	if ((rc = bi->bn_sums(be, nc->dev, n, c, hw, x, mean, var)) < 0 || (rc = allreduce(nc, var, (size_t)c)) < 0 ||
	    (rc = bi->scale(be, nc->dev, (size_t)c, var, (float)(1.0 / count))) < 0)
		return rc;
	if ((rc = bi->bn_running_update(be, nc->dev, c, momentum, count, mean, var, run_mean, run_var, batches)) < 0)
		return rc;
	if (n > 0 && (rc = bi->bn_apply(be, nc->dev, n, c, hw, eps, x, mean, var, gamma, beta, y)) < 0)
		return rc;
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
	int rc;
	if ((rc = have_kernels(nc)) < 0)
		return rc;
	/* dgamma/dbeta get this rank's sums before the exchange: the
	 * trainer's gradient allreduce adds the ranks' shares, as DDP does
	 * with SyncBatchNorm's weight gradients. */
	if ((rc = bi->bn_backward_sums(be, nc->dev, n, c, hw, eps, x, mean, var, dy, scratch, dgamma, dbeta)) < 0 ||
	    (rc = allreduce(nc, scratch, TR_BN_SCRATCH(c))) < 0)
		return rc;
	if (n == 0 || !dx)
		return 0;
	return bi->bn_backward_apply(be, nc->dev, n, c, hw, eps, (double)step_rows * hw, x, mean, var, gamma, scratch,
				     dy, dx);
}
