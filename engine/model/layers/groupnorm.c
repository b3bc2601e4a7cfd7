/* groupnorm: PyTorch's nn.GroupNorm(groups, C, eps) on NCHW images:
 * statistics per sample over each group of C / groups channels, so the
 * result does not depend on how a step is split between devices; weight
 * [C] (starts at 1) and bias [C] (0) as a per-channel affine.  Mean and
 * rstd per sample and group are kept for backward. */
#include <errno.h>
#include <stdio.h>

#include "engine/model/layer.h"
#include "engine/model/layer_spec.h"
#include "engine/model/model.h"

static int setup(struct tr_layer *l, const struct tr_layer_spec *s, struct tr_error *err)
{
	if (tr_layer_image_input(l, "groupnorm", err) < 0)
		return -EINVAL;
	int c = l->in_shape.d[0];
	if (s->groups < 1 || c % s->groups) {
		tr_error_set(err, 0, 0, NULL, "groups (%d) must divide the input channels (%d)", s->groups, c);
		return -EINVAL;
	}
	l->out_shape = l->in_shape;
	l->eps = s->eps;
	l->conv.groups = s->groups;
	tr_layer_param(l, "weight", TR_INIT_ONES, 0, 1, (int64_t[]){c});
	tr_layer_param(l, "bias", TR_INIT_ZEROS, 0, 1, (int64_t[]){c});
	l->saved[0] = (size_t)s->groups; /* mean per sample and group */
	l->saved[1] = (size_t)s->groups; /* rstd */
	return 0;
}

static bool supported(const tr_backend_i *bi)
{
	return bi->groupnorm_forward && bi->groupnorm_backward;
}

static int forward(const struct tr_pass *p, const struct tr_layer *l, const float *x, float *y)
{
	tr_replica_t *r = p->r;
	int c = l->in_shape.d[0], hw = l->in_shape.d[1] * l->in_shape.d[2];
	return r->be->i->groupnorm_forward(r->be, r->dev, p->rows, c, hw, l->conv.groups, l->eps, x,
					   r->params + l->tensors[0].off, r->params + l->tensors[1].off, y,
					   r->aux[l->index], r->aux2[l->index]);
}

static int backward(const struct tr_pass *p, const struct tr_layer *l, const float *x, const float *y, const float *dy,
		    float *dx)
{
	tr_replica_t *r = p->r;
	int c = l->in_shape.d[0], hw = l->in_shape.d[1] * l->in_shape.d[2];
	(void)y;
	return r->be->i->groupnorm_backward(r->be, r->dev, p->rows, c, hw, l->conv.groups, x,
					    r->params + l->tensors[0].off, r->aux[l->index], r->aux2[l->index], dy, dx,
					    r->grads + l->tensors[0].off, r->grads + l->tensors[1].off);
}

#define LAY(m) offsetof(struct tr_layer_spec, m)

static const struct tr_field tr_layer_groupnorm_fields[] = {
	{.key = "groups", .kind = K_INT, .off = LAY(groups), .flags = F_REQ | POSITIVE | F_HI, .hi = TR_SPEC_MAX_WIDTH},
	{.key = "eps", .kind = K_FLOAT, .off = LAY(eps), .flags = POSITIVE, .def = 1e-5},
	{0},
};

const tr_layer_i tr_layer_groupnorm = {
	.fields = tr_layer_groupnorm_fields,
	.name = "groupnorm",
	.type = TR_LAYER_GROUPNORM,
	.setup = setup,
	.supported = supported,
	.forward = forward,
	.backward = backward,
};
