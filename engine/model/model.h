/* The sequential model: parameter layout, initialisation and one replica's
 * forward and backward pass on a backend device.
 *
 * The layout (tr_model_t) is shared by all replicas: every parameter lives
 * at a fixed offset in one contiguous buffer, gradients mirror it, so a step
 * needs a single allreduce.  Names and shapes follow PyTorch's
 * nn.Sequential ("<layer index>.weight", dense weight [out, in]) so exported
 * weights load into the equivalent torch model.
 */
#ifndef TR_MODEL_H
#define TR_MODEL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "engine/backend.h"
#include "engine/model/layer.h"
#include "engine/spec.h"

/* Every layer, top-level or inside a block, is a node; layers[0 ..
 * n_layers) are the top-level ones in order (what per-layer monitors and
 * the loss see), nested nodes follow (engine/model/layer.h). */
typedef struct tr_model {
	struct tr_layer layers[TR_MODEL_MAX_NODES];
	int n_layers; /* top level */
	int n_nodes;  /* all */
	int inputs, outputs, max_width;
	struct tr_shape in_shape;
	enum tr_loss loss;
	size_t n_params;
	/* Parameters come first, buffers (tr_param_slot.buffer) after them:
	 * the optimizer updates [0, n_trainable) only. */
	size_t n_trainable;
	/* Some layer's training passes are collectives (tr_layer_ops
	 * .collective): ranks without rows still run them. */
	bool collective;
	uint64_t seed;
} tr_model_t;

/* Builds the layout for `inputs` features per sample (the spec's [C, H, W]
 * when it gives one, whose product must equal inputs).  Every layer's
 * output shape is checked here.  Returns 0 or -EINVAL with "<JSON
 * pointer>: message" in err. */
int tr_model_init(tr_model_t *m, const struct tr_spec *spec, int inputs, struct tr_error *err);
/* The same for the trainer, which knows the data: a spec without
 * model.inputs takes the data's [C, H, W] (data_shape, {0} or NULL for
 * flat data) as its input shape. */
int tr_model_init_shaped(tr_model_t *m, const struct tr_spec *spec, int inputs, const int data_shape[3],
			 struct tr_error *err);
/* The same with the pointer and the message apart (the spec parser). */
int tr_model_build(tr_model_t *m, const struct tr_spec *spec, int inputs, char *ptr, size_t ptrlen, char *msg,
		   size_t msglen);

/* PyTorch default initialisation from the counter-based generator:
 * dense weight and bias U(-1/sqrt(in), 1/sqrt(in)), layernorm 1 and 0. */
void tr_model_init_params(const tr_model_t *m, float *host_params);
/* The same, returning -ECANCELED (host_params partly written) as soon as
 * *cancel is set; a model may hold billions of parameters.  cancel may be
 * NULL.  Returns 0 otherwise. */
int tr_model_init_params_cancellable(const tr_model_t *m, float *host_params, const atomic_bool *cancel);

/* One named tensor of the layout, for export and import.  Returns the
 * number of tensors when idx is out of range (call with idx 0.. until it
 * returns 0). */
struct tr_param_view {
	char name[48];
	int64_t shape[4];
	int ndim;
	size_t offset, len;
};
int tr_model_param_count(const tr_model_t *m);
void tr_model_param_view(const tr_model_t *m, int idx, struct tr_param_view *out);

struct tr_replica;

/* Exact mode (docs/design.md, "Exact mode"): the step's batch is cut into
 * virtual shards independent of the device count, and each device computes
 * whole shards, every one with the same kernels and shapes wherever it
 * runs, into a gradient buffer of its own.  A shard set describes one
 * replica's non-empty shards of the current step, set by the trainer.
 *
 * Each shard has a view: a copy of the replica whose per-sample buffers
 * (input, labels, outputs, saved buffers) start at the shard's first row,
 * whose gradient buffer is the shard's and whose two gradient buffers are
 * scratch of one shard's size.  A model without collective layers runs
 * each view's whole forward and backward pass in turn.  A model with them
 * (batchnorm2d's statistics over the global batch) runs node by node: a
 * collective node once over the replica's rows, with the shard set in
 * r->shards (it computes per-shard sums and combines them with `sum`),
 * every other node once per shard through the views. */
struct tr_shard_set {
	int count;                   /* non-empty shards on this replica */
	int off[TR_SPEC_MAX_SHARDS]; /* first row, from the replica's first */
	int len[TR_SPEC_MAX_SHARDS]; /* rows */
	struct tr_replica *views;    /* count views (tr_shard_views) */
	/* The exact sum over every shard of the step on every replica, in
	 * shard order: parts are this replica's shards' n floats each (device
	 * memory), out receives the sum on every replica. */
	int (*sum)(void *ctx, const float *const *parts, int nparts, float *out, size_t n);
	void *sum_ctx;
	/* count x partial_stride floats of device memory: collective layers'
	 * per-shard sums (tr_model_partial_floats). */
	float *partials;
	size_t partial_stride;
};

/* One device's copy of the model and its work buffers. */
typedef struct tr_replica {
	const tr_model_t *model;
	tr_backend_t *be;
	int dev;
	int max_rows;
	float *params, *grads, *state1, *state2;
	float *input, *labels;
	float *acts[TR_MODEL_MAX_NODES + 1]; /* acts[0] = input, acts[i + 1] = node i's output */
	float *aux[TR_MODEL_MAX_NODES];      /* saved[0] of node i: dropout mask, layernorm mean */
	float *aux2[TR_MODEL_MAX_NODES];     /* saved[1]: layernorm rstd */
	float *dbuf[2];
	float *work;                     /* the largest workspace any layer asks for */
	float *kept[TR_MODEL_MAX_NODES]; /* tr_layer.kept floats of node i */
	int label_dim;
	/* For layers whose passes are collectives: this replica's rank among
	 * the job's ndev devices, their communicator (NULL with one device),
	 * and the step's sample count on all of them together, set by the
	 * trainer before each training pass. */
	tr_comm_t *comm;
	int rank, ndev;
	int64_t step_rows;
	/* Exact mode, a model with collective layers, during a training
	 * step: this replica's shards (above); NULL otherwise. */
	const struct tr_shard_set *shards;
	/* Exact mode, a shard view of the device holding the first shards,
	 * when the backend's gemm accumulates exactly (backend.h,
	 * gemm_accumulate_max_k): the running sum of the shards before this
	 * one, r->grads' layout.  Dense layers add their weight gradient to
	 * it, and their bias gradient after writing it to grads, instead of
	 * leaving both in grads; NULL otherwise. */
	float *grad_sum;
	/* Exact mode across processes, the view of the last shard a process
	 * computes (engine/exact.h, overlap): called after the backward pass
	 * of each of the model's top-level layers, last to first, so that
	 * the gradients it has finished can travel while the pass goes on;
	 * NULL otherwise.  A negative return ends the pass with it. */
	int (*layer_done)(void *ctx, int layer);
	void *layer_done_ctx;
} tr_replica_t;

/* The float counts of every buffer tr_replica_init allocates, in its
 * order, for memory estimates (engine/cuda/cuda_estimate.c).  Writes at
 * most cap sizes and returns the number there are. */
int tr_replica_buffer_sizes(const tr_model_t *m, int max_rows, int label_dim, int opt_state_buffers, size_t *floats,
			    int cap);

int tr_replica_init(tr_replica_t *r, const tr_model_t *m, tr_backend_t *be, int dev, int max_rows, int label_dim,
		    int opt_state_buffers, struct tr_error *err);
void tr_replica_finish(tr_replica_t *r);

/* Forward pass over r->input (rows x inputs).  training enables dropout,
 * keyed by (seed, step, layer) with row positions starting at row0 in the
 * step's global sample list. */
int tr_replica_forward(tr_replica_t *r, int rows, int64_t row0, int64_t step, int training);

/* Loss of the last forward against r->labels; writes the output gradient
 * scaled by `scale` into the first dbuf and ADDS (loss sum, correct count)
 * to out[0..1], DEVICE memory of r's device (read it after a sync). */
int tr_replica_loss(tr_replica_t *r, int rows, float scale, double *out);

/* Backward pass after tr_replica_loss (rows >= 1).  Overwrites every entry
 * of r->grads (dense dW with beta 0, bias sums, layernorm's after a
 * clear), so the caller need not clear it first; a device with no rows
 * this step does not call this and must zero r->grads itself. */
int tr_replica_backward(tr_replica_t *r, int rows);

/* Exact mode. */
/* Floats of per-shard partial sums one shard needs for the collective
 * layers (0 without any). */
size_t tr_model_partial_floats(const tr_model_t *m);
/* Points set->views[0 .. set->count) at the shards of r described by
 * set->off and set->len, with grads[k] as shard k's gradient buffer and
 * scratch[0..1] (each shard_rows x max_width floats) as their gradient
 * buffers. */
void tr_shard_views(tr_replica_t *r, struct tr_shard_set *set, float *const *grads, float *const *scratch);
/* Loss of shard k of r->shards after a forward pass over all of them;
 * its output gradient goes to the shard's rows of r->dbuf[0].  ADDS to
 * out[0..1] as tr_replica_loss. */
int tr_replica_shard_loss(tr_replica_t *r, int k, float scale, double *out);

#endif
