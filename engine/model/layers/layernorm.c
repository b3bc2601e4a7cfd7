/* layernorm: normalisation over a flat sample's features with a learned
 * scale (weight, starts at 1) and shift (bias, 0), PyTorch's
 * nn.LayerNorm(features).  Mean and rstd per sample are kept for backward. */
#include "engine/model/layer.h"
#include "engine/model/layer_spec.h"
#include "engine/model/model.h"

static int setup(struct tr_layer *l, const struct tr_layer_spec *s, struct tr_error *err)
{
	int rc = tr_layer_want_flat(l, "layernorm", err);
	if (rc < 0)
		return rc;
	l->out_shape = l->in_shape;
	l->eps = s->eps;
	tr_layer_param(l, "weight", TR_INIT_ONES, 0, 1, (int64_t[]){l->in});
	tr_layer_param(l, "bias", TR_INIT_ZEROS, 0, 1, (int64_t[]){l->in});
	l->saved[0] = 1; /* mean */
	l->saved[1] = 1; /* rstd */
	return 0;
}

static int forward(const struct tr_pass *p, const struct tr_layer *l, const float *x, float *y)
{
	tr_replica_t *r = p->r;
	return r->be->i->layernorm_forward(r->be, r->dev, p->rows, l->out, l->eps, x, r->params + l->tensors[0].off,
					   r->params + l->tensors[1].off, y, r->aux[l->index], r->aux2[l->index]);
}

static int backward(const struct tr_pass *p, const struct tr_layer *l, const float *x, const float *y, const float *dy,
		    float *dx)
{
	tr_replica_t *r = p->r;
	const tr_backend_i *bi = r->be->i;
	(void)y;
	/* the kernel adds into dgamma/dbeta, which lie next to each other */
	int rc = bi->memset0(r->be, r->dev, r->grads + l->tensors[0].off, 2 * (size_t)l->out * sizeof(float));
	if (rc < 0)
		return rc;
	/* The kernel always writes dx; without a caller's buffer it goes to
	 * the other half of the gradient ping-pong, as it always did. */
	if (!dx)
		dx = dy == r->dbuf[0] ? r->dbuf[1] : r->dbuf[0];
	return bi->layernorm_backward(r->be, r->dev, p->rows, l->out, x, r->params + l->tensors[0].off,
				      r->aux[l->index], r->aux2[l->index], dy, dx, r->grads + l->tensors[0].off,
				      r->grads + l->tensors[1].off);
}

#define LAY(m) offsetof(struct tr_layer_spec, m)

static const struct tr_field tr_layer_layernorm_fields[] = {
	{.key = "eps", .kind = K_FLOAT, .off = LAY(eps), .flags = POSITIVE, .def = 1e-5},
	{0},
};

const tr_layer_i tr_layer_layernorm = {
	.fields = tr_layer_layernorm_fields,
	.name = "layernorm",
	.type = TR_LAYER_LAYERNORM,
	.setup = setup,
	.forward = forward,
	.backward = backward,
};
