/* flatten: [C, H, W] to [C x H x W] (PyTorch's nn.Flatten); the data does
 * not move, but the layer keeps its own output buffer like every other,
 * so the copy is its whole cost. */
#include "engine/model/layer.h"
#include "engine/model/model.h"

static int setup(struct tr_layer *l, const struct tr_layer_spec *s, struct tr_error *err)
{
	(void)s, (void)err;
	l->out_shape = (struct tr_shape){.ndim = 1, .d = {l->in}};
	return 0;
}

static int forward(const struct tr_pass *p, const struct tr_layer *l, const float *x, float *y)
{
	tr_replica_t *r = p->r;
	return r->be->i->copy(r->be, r->dev, y, x, (size_t)p->rows * l->out * sizeof(float));
}

static int backward(const struct tr_pass *p, const struct tr_layer *l, const float *x, const float *y, const float *dy,
		    float *dx)
{
	tr_replica_t *r = p->r;
	(void)x, (void)y;
	return dx ? r->be->i->copy(r->be, r->dev, dx, dy, (size_t)p->rows * l->out * sizeof(float)) : 0;
}

const tr_layer_i tr_layer_flatten = {
	.name = "flatten",
	.type = TR_LAYER_FLATTEN,
	.setup = setup,
	.forward = forward,
	.backward = backward,
};
