/* dense: y = x W^T + b, PyTorch's nn.Linear (weight [out, in]). */
#include <stdio.h>

#include "engine/model/layer.h"
#include "engine/model/layer_spec.h"
#include "engine/model/model.h"

static int setup(struct tr_layer *l, const struct tr_layer_spec *s, struct tr_error *err)
{
	int rc = tr_layer_want_flat(l, "dense", err);
	if (rc < 0)
		return rc;
	l->out_shape = (struct tr_shape){.ndim = 1, .d = {s->units}};
	tr_layer_param(l, "weight", TR_INIT_UNIFORM_FAN_IN, (size_t)l->in, 2, (int64_t[]){s->units, l->in});
	if (s->bias)
		tr_layer_param(l, "bias", TR_INIT_UNIFORM_FAN_IN, (size_t)l->in, 1, (int64_t[]){s->units});
	return 0;
}

static int forward(const struct tr_pass *p, const struct tr_layer *l, const float *x, float *y)
{
	tr_replica_t *r = p->r;
	const tr_backend_i *bi = r->be->i;
	const float *w = r->params + l->tensors[0].off;
	const float *bias = l->n_tensors > 1 ? r->params + l->tensors[1].off : NULL;
	if (l->gemm_route && bi->gemm_route)
		return bi->gemm_route(r->be, r->dev, l->gemm_route, false, true, p->rows, l->out, l->in, x, w, bias, y);
	if (bias && bi->gemm_bias)
		return bi->gemm_bias(r->be, r->dev, false, true, p->rows, l->out, l->in, x, w, bias, y);
	int rc = bi->gemm(r->be, r->dev, false, true, p->rows, l->out, l->in, 1.0f, x, w, 0.0f, y);
	if (rc == 0 && bias)
		rc = bi->add_bias(r->be, r->dev, p->rows, l->out, y, bias);
	return rc;
}

/* dW on the oneDNN route (gemm_route, beta 0): with r->grad_sum into
 * grads and then added to it, gemm_accumulate_max_k's promise being
 * gemm's, the OpenBLAS route's, alone. */
static int routed_dw(const struct tr_pass *p, const struct tr_layer *l, const float *x, const float *dy)
{
	tr_replica_t *r = p->r;
	const tr_backend_i *bi = r->be->i;
	size_t w = l->tensors[0].off;
	int rc = bi->gemm_route(r->be, r->dev, l->gemm_route, true, false, l->out, l->in, p->rows, dy, x, NULL,
				r->grads + w);
	if (rc == 0 && r->grad_sum)
		rc = bi->add(r->be, r->dev, (size_t)l->out * l->in, r->grad_sum + w, r->grads + w, r->grad_sum + w);
	return rc;
}

/* dW[out,in] = dy^T x ; db = sum over rows of dy ; dx = dy W.  With
 * r->grad_sum (exact mode, model.h) dW and db are added to it instead:
 * dW by gemm with beta 1, the same bits as dW into grads and then `add`
 * (the trainer checks gemm_accumulate_max_k), without writing and
 * reading a whole gradient buffer per shard. */
static int backward(const struct tr_pass *p, const struct tr_layer *l, const float *x, const float *y, const float *dy,
		    float *dx)
{
	tr_replica_t *r = p->r;
	const tr_backend_i *bi = r->be->i;
	float *dw = r->grad_sum ? r->grad_sum : r->grads;
	bool routed = l->gemm_route && bi->gemm_route;
	(void)y;
	/* the OpenBLAS route's dW is gemm's (with beta 1 into grad_sum) */
	int rc = routed && l->gemm_route == TR_CPU_GEMM_ONEDNN
			 ? routed_dw(p, l, x, dy)
			 : bi->gemm(r->be, r->dev, true, false, l->out, l->in, p->rows, 1.0f, dy, x,
				    r->grad_sum ? 1.0f : 0.0f, dw + l->tensors[0].off);
	if (rc == 0 && l->n_tensors > 1) {
		size_t b = l->tensors[1].off;
		rc = bi->col_sum(r->be, r->dev, p->rows, l->out, dy, r->grads + b);
		if (rc == 0 && r->grad_sum)
			rc = bi->add(r->be, r->dev, (size_t)l->out, r->grad_sum + b, r->grads + b, r->grad_sum + b);
	}
	if (rc == 0 && dx && routed)
		rc = bi->gemm_route(r->be, r->dev, l->gemm_route, false, false, p->rows, l->in, l->out, dy,
				    r->params + l->tensors[0].off, NULL, dx);
	else if (rc == 0 && dx)
		rc = bi->gemm(r->be, r->dev, false, false, p->rows, l->in, l->out, 1.0f, dy,
			      r->params + l->tensors[0].off, 0.0f, dx);
	return rc;
}

#define LAY(m) offsetof(struct tr_layer_spec, m)

static const struct tr_field tr_layer_dense_fields[] = {
	{.key = "units", .kind = K_INT, .off = LAY(units), .flags = F_REQ | POSITIVE | F_HI, .hi = TR_SPEC_MAX_WIDTH},
	{.key = "bias", .kind = K_BOOL, .off = LAY(bias), .def = 1},
	{0},
};

const tr_layer_i tr_layer_dense = {
	.fields = tr_layer_dense_fields,
	.width_key = "units",
	.name = "dense",
	.type = TR_LAYER_DENSE,
	.setup = setup,
	.forward = forward,
	.backward = backward,
};
