/* The layer registry: what every layer type is, in one table per type.
 *
 * A layer is a unit (docs/design.md, "Layer registry"): one file under
 * engine/model/layers/ holds its ops table (struct tr_layer_i) -- its
 * output shape from its input shape, its parameter tensors with PyTorch's
 * names, shapes and initialisation, the buffers it keeps from forward to
 * backward, its workspace, and its forward and backward passes -- and
 * registry.c lists the tables.  The spec parser, the model, the memory
 * estimate and the checkpoint code read the registry; nothing else
 * switches on the layer type.
 *
 * Shapes are per sample: a flat vector [n] or an image [C, H, W]; a batch
 * adds a leading row dimension (NCHW).
 */
#ifndef TR_LAYER_H
#define TR_LAYER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "engine/backend.h"
#include "engine/spec.h"

/* Nodes of one model: top-level layers plus the layers inside residual
 * blocks, at any depth. */
#define TR_MODEL_MAX_NODES 256
/* Parameter tensors of one layer (weight, bias, and room for more). */
#define TR_LAYER_MAX_TENSORS 5

struct tr_shape {
	int ndim; /* 1 (flat) or 3 (C, H, W) */
	int d[3];
};

static inline size_t tr_shape_numel(struct tr_shape s)
{
	size_t n = 1;
	for (int i = 0; i < s.ndim; i++)
		n *= (size_t)s.d[i];
	return n;
}

/* "[1, 8, 8]" or "[64]" */
void tr_shape_format(struct tr_shape s, char *buf, size_t len);

/* How a parameter tensor starts. */
enum tr_init {
	TR_INIT_UNIFORM_FAN_IN, /* U(-1/sqrt(fan_in), 1/sqrt(fan_in)), PyTorch's Linear and Conv2d */
	TR_INIT_ONES,
	TR_INIT_ZEROS,
};

/* One parameter tensor of a layer: "<node path>.<name>" in safetensors. */
struct tr_param_slot {
	const char *name; /* "weight", "bias" (static strings) */
	int ndim;
	int64_t shape[4];
	size_t off, len; /* floats; off is set by the model */
	enum tr_init init;
	size_t fan_in;    /* TR_INIT_UNIFORM_FAN_IN */
	uint64_t rng_sub; /* generator key: (seed, node index, rng_sub) */
	/* A buffer, not a parameter (batchnorm2d's running statistics):
	 * saved and loaded with the parameters, never trained.  The model
	 * lays buffers out after every parameter (tr_model_t.n_trainable). */
	bool buffer;
};

struct tr_layer_i;
struct tr_field;

/* One node of the model's layout, shared by all replicas. */
struct tr_layer {
	const struct tr_layer_i *ops;
	enum tr_layer_type type;
	int index;     /* node index: generator key, buffer index */
	char path[32]; /* safetensors prefix: "3" or "3.1" */
	struct tr_shape in_shape, out_shape;
	int in, out; /* elements per sample */
	/* Every parameter of the layer (a residual block's: all of its inner
	 * layers') lies in [w_off, b_off + b_len) or [w_off, w_off + w_len):
	 * weight and bias of plain layers, the whole block for a residual
	 * one, whose b_len is 0.  Per-layer monitors read these. */
	size_t w_off, b_off;
	size_t w_len, b_len;
	struct tr_param_slot tensors[TR_LAYER_MAX_TENSORS];
	int n_tensors;
	/* Floats per sample of the buffers kept from forward to backward
	 * (dropout's mask, layernorm's mean and rstd, ...): aux and aux2. */
	size_t saved[2];
	/* Floats of device memory the layer keeps per replica whatever the
	 * rows (batchnorm2d's batch statistics and sums): r->kept[index]. */
	size_t kept;
	/* A layer that holds layers (residual): its inner layers are nodes
	 * first .. first + count - 1, and inner_shape is their output shape,
	 * set by the model before setup. */
	int first, count;
	struct tr_shape inner_shape;
	/* Its passes, or an inner layer's, are collectives (tr_layer_i
	 * .collective): in exact mode it runs once over all of a replica's
	 * shards, every other node once per shard (engine/model/model.h). */
	bool collective;
	/* per type */
	enum tr_act act;
	float rate, eps;
	struct tr_conv2d_desc conv;
	struct tr_pool2d_desc pool;
	/* dense on CPU devices: the route of its products (enum tr_cpu_gemm,
	 * set by the job: tr_trainer_dense_routes); AUTO: gemm_bias and gemm */
	enum tr_cpu_gemm gemm_route;
};

struct tr_replica;

/* One pass over one device's share of a step (in exact mode, over one
 * shard, or over all of the device's shards for a collective node). */
struct tr_pass {
	struct tr_replica *r;
	int rows;
	int64_t row0, step; /* dropout keys */
	int training;
};

typedef struct tr_layer_i {
	const char *name; /* the spec's "type" */
	enum tr_layer_type type;
	/* Its spec's "layers" (tr_layer_spec.inner) are built as nodes of
	 * their own, on this layer's input shape. */
	bool holds_layers;
	/* Its training passes take part in collectives between the job's
	 * devices (batchnorm2d's statistics over the global batch), so every
	 * rank must run forward and backward in every step, with rows = 0
	 * when it has no samples (tr_model_t.collective). */
	bool collective;
	/* Its spec keys besides "type": a field table (engine/spec_fields.h)
	 * over struct tr_layer_spec, parsed, defaulted and emitted by the
	 * spec parser (engine/model/layer_spec.c).  NULL: no keys. */
	const struct tr_field *fields;
	/* The key that sets its output width ("units", "filters"), which a
	 * spec whose output does not match its data is told to fix; NULL
	 * when none does. */
	const char *width_key;
	/* From s and l->in_shape (set by the model), fills l->out_shape, the
	 * parameter tensors' names, shapes and init (not their offsets),
	 * saved sizes and the per-type fields.  Returns 0, or -EINVAL with a
	 * message for the layer's JSON pointer (the model prefixes it). */
	int (*setup)(struct tr_layer *l, const struct tr_layer_spec *s, struct tr_error *err);
	/* Workspace floats a pass over `rows` samples needs (shared by all
	 * layers of a replica, clobbered by each).  NULL: none. */
	size_t (*workspace)(const struct tr_layer *l, int rows);
	/* Whether the backend implements what this layer calls.  NULL: the
	 * kernels every backend has. */
	bool (*supported)(const tr_backend_i *bi);
	/* y = layer(x) for p->rows samples. */
	int (*forward)(const struct tr_pass *p, const struct tr_layer *l, const float *x, float *y);
	/* From dy (and x, y of the forward pass): writes this layer's
	 * parameter gradients (overwriting them) and dx, unless dx is NULL
	 * (the first layer's input needs no gradient). */
	int (*backward)(const struct tr_pass *p, const struct tr_layer *l, const float *x, const float *y,
			const float *dy, float *dx);
} tr_layer_i;

/* The registry (engine/model/layers/registry.c). */
const tr_layer_i *tr_layer_ops_for(enum tr_layer_type type);
const tr_layer_i *tr_layer_ops_named(const char *name);
/* The i-th registered type, NULL past the end (for the parser's names). */
const tr_layer_i *tr_layer_ops_at(int i);

/* Sequences of nodes, for layers that hold layers (residual).  forward:
 * nodes first .. first+count-1 in order from x; the result is the last
 * node's output buffer.  backward: dy of the last node is in
 * r->dbuf[*cur]; afterwards, when need_dx, dx of x is in r->dbuf[*cur]. */
int tr_model_seq_forward(const struct tr_pass *p, int first, int count, const float *x);
int tr_model_seq_backward(const struct tr_pass *p, int first, int count, const float *x, int *cur, bool need_dx);

/* Shared by the layer files. */
/* -EINVAL with a message unless the input is flat / an image. */
int tr_layer_want_flat(const struct tr_layer *l, const char *what, struct tr_error *err);
int tr_layer_image_input(const struct tr_layer *l, const char *what, struct tr_error *err);
/* forward/backward of the elementwise activations (l->act). */
int tr_layer_act_forward(const struct tr_pass *p, const struct tr_layer *l, const float *x, float *y);
int tr_layer_act_backward(const struct tr_pass *p, const struct tr_layer *l, const float *x, const float *y,
			  const float *dy, float *dx);
/* Fills l->pool and l->out_shape for a kh x kw window sweep (maxpool2d,
 * avgpool2d): stride default the kernel, padding at most half of it. */
int tr_layer_pool_window(struct tr_layer *l, const struct tr_layer_spec *s, const char *what, struct tr_error *err);
/* The backend's average pool over l->pool (avgpool2d, and
 * global_avg_pool, whose window is the whole image). */
bool tr_layer_avgpool_supported(const tr_backend_i *bi);
int tr_layer_avgpool_forward(const struct tr_pass *p, const struct tr_layer *l, const float *x, float *y);
int tr_layer_avgpool_backward(const struct tr_pass *p, const struct tr_layer *l, const float *x, const float *y,
			      const float *dy, float *dx);
void tr_layer_param(struct tr_layer *l, const char *name, enum tr_init init, size_t fan_in, int ndim,
		    const int64_t *shape);

extern const tr_layer_i tr_layer_dense, tr_layer_relu, tr_layer_gelu, tr_layer_tanh, tr_layer_sigmoid, tr_layer_dropout,
	tr_layer_layernorm, tr_layer_conv2d, tr_layer_maxpool2d, tr_layer_avgpool2d, tr_layer_global_avg_pool,
	tr_layer_flatten, tr_layer_residual, tr_layer_groupnorm, tr_layer_batchnorm2d;

#endif
