/* batchnorm2d with statistics over the step's global batch, synchronised
 * between the job's devices as PyTorch's SyncBatchNorm does, built from the
 * backend's bn_* kernels and its allreduce (docs/design.md, "Normalisation
 * over the global batch").
 *
 * Every rank of a job calls the same functions in the same order for every
 * batchnorm2d layer, also a rank that has no rows in this step (n = 0):
 * the allreduces inside are collectives, and a rank that skipped one would
 * leave the others waiting.  Such a rank contributes zero sums and still
 * updates its running statistics, so every replica keeps the same ones.
 */
#ifndef TR_MODEL_NORM2D_H
#define TR_MODEL_NORM2D_H

#include <stdint.h>

#include "engine/backend.h"

struct tr_shard_set; /* engine/model/model.h */

/* Where a layer runs and whom it synchronises with.  comm may be NULL
 * when ndev is 1.  In exact mode (shards not NULL) the sums are taken per
 * shard and combined by the shard set's exact sum instead of the
 * allreduce, and the weight gradients go to each shard's own buffer at
 * the offsets dgamma and dbeta have in `grads`, the replica's. */
struct tr_norm_ctx {
	tr_backend_t *be;
	int dev;
	tr_comm_t *comm;
	int rank, ndev;
	const struct tr_shard_set *shards;
	const float *grads;
};

/* Floats of device scratch a batchnorm2d layer needs per replica beside
 * its saved statistics: the backward pass's 2c sums. */
#define TR_BN_SCRATCH(c) (2 * (size_t)(c))

/* Training forward over this rank's n samples (n >= 0) of a step that has
 * step_rows samples on all ranks together.  Writes the batch mean and
 * biased variance (c floats each, kept for backward), y (n samples), and
 * updates the running statistics and the batch counter.  Fails with
 * -EINVAL (the backend's last_error says why) when the step has a single
 * value per channel, as torch does. */
int tr_bn_forward_train(const struct tr_norm_ctx *nc, int n, int c, int hw, int64_t step_rows, float eps,
			float momentum, const float *x, const float *gamma, const float *beta, float *y, float *mean,
			float *var, float *run_mean, float *run_var, float *batches);

/* Evaluation forward: normalises with the running statistics; no
 * collective. */
int tr_bn_forward_eval(const struct tr_norm_ctx *nc, int n, int c, int hw, float eps, const float *x,
		       const float *gamma, const float *beta, const float *run_mean, const float *run_var, float *y);

/* Backward after tr_bn_forward_train of the same step: overwrites dgamma
 * and dbeta with this rank's share (the trainer's gradient allreduce adds
 * the shares), and writes dx (may be NULL) from the step's global sums.
 * scratch holds TR_BN_SCRATCH(c) floats. */
int tr_bn_backward(const struct tr_norm_ctx *nc, int n, int c, int hw, int64_t step_rows, float eps, const float *x,
		   const float *gamma, const float *mean, const float *var, const float *dy, float *dx, float *scratch,
		   float *dgamma, float *dbeta);

#endif
