/* maxpool2d: PyTorch's nn.MaxPool2d on NCHW images (floor mode, -inf
 * padding).  Backward finds each window's maximum again from x (the
 * backend's rule: the first in row-major order), so nothing is kept. */
#include "engine/model/layer.h"
#include "engine/model/layer_spec.h"
#include "engine/model/model.h"

static int setup(struct tr_layer *l, const struct tr_layer_spec *s, struct tr_error *err)
{
	return tr_layer_pool_window(l, s, "maxpool2d", err);
}

static bool supported(const tr_backend_i *bi)
{
	return bi->maxpool2d_forward && bi->maxpool2d_backward;
}

static int forward(const struct tr_pass *p, const struct tr_layer *l, const float *x, float *y)
{
	tr_replica_t *r = p->r;
	return r->be->i->maxpool2d_forward(r->be, r->dev, &l->pool, p->rows, x, y);
}

static int backward(const struct tr_pass *p, const struct tr_layer *l, const float *x, const float *y, const float *dy,
		    float *dx)
{
	tr_replica_t *r = p->r;
	(void)y;
	return dx ? r->be->i->maxpool2d_backward(r->be, r->dev, &l->pool, p->rows, x, dy, dx) : 0;
}

const tr_layer_i tr_layer_maxpool2d = {
	.name = "maxpool2d",
	.type = TR_LAYER_MAXPOOL2D,
	.fields = tr_layer_pool_window_fields,
	.setup = setup,
	.supported = supported,
	.forward = forward,
	.backward = backward,
};
