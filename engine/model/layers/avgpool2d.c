/* avgpool2d: PyTorch's nn.AvgPool2d on NCHW images (floor mode; the zero
 * padding counts in the average, count_include_pad). */
#include "engine/model/layer.h"
#include "engine/model/layer_spec.h"
#include "engine/model/model.h"

static int setup(struct tr_layer *l, const struct tr_layer_spec *s, struct tr_error *err)
{
	return tr_layer_pool_window(l, s, "avgpool2d", err);
}

bool tr_layer_avgpool_supported(const tr_backend_i *bi)
{
	return bi->avgpool2d_forward && bi->avgpool2d_backward;
}

int tr_layer_avgpool_forward(const struct tr_pass *p, const struct tr_layer *l, const float *x, float *y)
{
	tr_replica_t *r = p->r;
	return r->be->i->avgpool2d_forward(r->be, r->dev, &l->pool, p->rows, x, y);
}

int tr_layer_avgpool_backward(const struct tr_pass *p, const struct tr_layer *l, const float *x, const float *y,
			      const float *dy, float *dx)
{
	tr_replica_t *r = p->r;
	(void)x, (void)y;
	return dx ? r->be->i->avgpool2d_backward(r->be, r->dev, &l->pool, p->rows, dy, dx) : 0;
}

const tr_layer_i tr_layer_avgpool2d = {
	.name = "avgpool2d",
	.type = TR_LAYER_AVGPOOL2D,
	.fields = tr_layer_pool_window_fields,
	.setup = setup,
	.supported = tr_layer_avgpool_supported,
	.forward = tr_layer_avgpool_forward,
	.backward = tr_layer_avgpool_backward,
};
