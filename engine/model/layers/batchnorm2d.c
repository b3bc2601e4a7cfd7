/* batchnorm2d: PyTorch's nn.BatchNorm2d(C, eps, momentum) on NCHW images,
 * with its statistics taken over the step's global batch on all devices
 * together, as nn.SyncBatchNorm does (engine/model/norm2d.h), so a job
 * gives the same results on any device count.  Tensors, with PyTorch's
 * names: weight [C] (starts at 1), bias [C] (0), and the buffers
 * running_mean [C] (0), running_var [C] (1) and num_batches_tracked []
 * (0; a float here, exact to 2^24 steps), which are saved and loaded with
 * the weights and never trained.  Evaluation normalises with the running
 * statistics.  The batch mean, variance and backward sums live in the
 * replica's kept memory for this layer: mean [C], var [C], sums [2C]. */
#include <errno.h>
#include <stdio.h>

#include "engine/model/layer.h"
#include "engine/model/layer_spec.h"
#include "engine/model/model.h"
#include "engine/model/norm2d.h"

static int setup(struct tr_layer *l, const struct tr_layer_spec *s, struct tr_error *err)
{
	if (tr_layer_image_input(l, "batchnorm2d", err) < 0)
		return -EINVAL;
	int c = l->in_shape.d[0];
	l->out_shape = l->in_shape;
	l->eps = s->eps;
	l->rate = s->momentum; /* the running statistics' update factor */
	tr_layer_param(l, "weight", TR_INIT_ONES, 0, 1, (int64_t[]){c});
	tr_layer_param(l, "bias", TR_INIT_ZEROS, 0, 1, (int64_t[]){c});
	tr_layer_param(l, "running_mean", TR_INIT_ZEROS, 0, 1, (int64_t[]){c});
	tr_layer_param(l, "running_var", TR_INIT_ONES, 0, 1, (int64_t[]){c});
	tr_layer_param(l, "num_batches_tracked", TR_INIT_ZEROS, 0, 0, NULL);
	for (int t = 2; t < 5; t++)
		l->tensors[t].buffer = true;
	l->kept = 2 * (size_t)c + TR_BN_SCRATCH(c);
	return 0;
}

static bool supported(const tr_backend_i *bi)
{
	return bi->bn_sums && bi->bn_apply && bi->bn_running_update && bi->bn_backward_sums && bi->bn_backward_apply;
}

static struct tr_norm_ctx ctx_of(const tr_replica_t *r)
{
	return (struct tr_norm_ctx){.be = r->be,
				    .dev = r->dev,
				    .comm = r->comm,
				    .rank = r->rank,
				    .ndev = r->ndev,
				    .shards = r->shards,
				    .grads = r->grads};
}

/* One device: this pass's rows are the step.  Several: the trainer's
 * count of the step's samples on all of them. */
static int64_t step_rows(const tr_replica_t *r, int rows)
{
	return r->ndev > 1 || r->shards ? r->step_rows : rows;
}

static int forward(const struct tr_pass *p, const struct tr_layer *l, const float *x, float *y)
{
	tr_replica_t *r = p->r;
	struct tr_norm_ctx nc = ctx_of(r);
	int c = l->in_shape.d[0], hw = l->in_shape.d[1] * l->in_shape.d[2];
	const float *w = r->params + l->tensors[0].off, *b = r->params + l->tensors[1].off;
	float *rm = r->params + l->tensors[2].off, *rv = r->params + l->tensors[3].off;
	float *nb = r->params + l->tensors[4].off;
	float *mean = r->kept[l->index], *var = mean + c;
	if (!p->training)
		return tr_bn_forward_eval(&nc, p->rows, c, hw, l->eps, x, w, b, rm, rv, y);
	return tr_bn_forward_train(&nc, p->rows, c, hw, step_rows(r, p->rows), l->eps, l->rate, x, w, b, y, mean, var,
				   rm, rv, nb);
}

static int backward(const struct tr_pass *p, const struct tr_layer *l, const float *x, const float *y, const float *dy,
		    float *dx)
{
	tr_replica_t *r = p->r;
	struct tr_norm_ctx nc = ctx_of(r);
	int c = l->in_shape.d[0], hw = l->in_shape.d[1] * l->in_shape.d[2];
	float *mean = r->kept[l->index], *var = mean + c, *sums = var + c;
	(void)y;
	return tr_bn_backward(&nc, p->rows, c, hw, step_rows(r, p->rows), l->eps, x, r->params + l->tensors[0].off,
			      mean, var, dy, dx, sums, r->grads + l->tensors[0].off, r->grads + l->tensors[1].off);
}

#define LAY(m) offsetof(struct tr_layer_spec, m)

static const struct tr_field tr_layer_batchnorm2d_fields[] = {
	{.key = "momentum", .kind = K_FLOAT, .off = LAY(momentum), .flags = F_LO | F_HI, .lo = 0, .hi = 1, .def = 0.1},
	{.key = "eps", .kind = K_FLOAT, .off = LAY(eps), .flags = POSITIVE, .def = 1e-5},
	{0},
};

const tr_layer_i tr_layer_batchnorm2d = {
	.fields = tr_layer_batchnorm2d_fields,
	.name = "batchnorm2d",
	.type = TR_LAYER_BATCHNORM2D,
	.collective = true,
	.setup = setup,
	.supported = supported,
	.forward = forward,
	.backward = backward,
};
