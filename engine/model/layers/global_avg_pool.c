/* global_avg_pool: the mean of each channel, [C, H, W] to the flat [C] a
 * dense layer takes (PyTorch: AdaptiveAvgPool2d(1) then Flatten, one
 * nn.Sequential at this index).  It is the backend's average pool with the
 * whole image as its window.  No parameters. */
#include <errno.h>

#include "engine/model/layer.h"
#include "engine/model/model.h"

static int setup(struct tr_layer *l, const struct tr_layer_spec *s, char *err, size_t errlen)
{
	(void)s;
	if (tr_layer_image_input(l, "global_avg_pool", err, errlen) < 0)
		return -EINVAL;
	struct tr_pool2d_desc *d = &l->pool;
	d->c = l->in_shape.d[0];
	d->h = d->kh = l->in_shape.d[1];
	d->w = d->kw = l->in_shape.d[2];
	d->sh = d->sw = 1;
	d->ho = d->wo = 1;
	l->out_shape = (struct tr_shape){.ndim = 1, .d = {d->c}};
	return 0;
}

static bool supported(const tr_backend_i *bi)
{
	return bi->avgpool2d_forward && bi->avgpool2d_backward;
}

static int forward(const struct tr_pass *p, const struct tr_layer *l, const float *x, float *y)
{
	tr_replica_t *r = p->r;
	return r->be->i->avgpool2d_forward(r->be, r->dev, &l->pool, p->rows, x, y);
}

static int backward(const struct tr_pass *p, const struct tr_layer *l, const float *x, const float *y,
		    const float *dy, float *dx)
{
	tr_replica_t *r = p->r;
	(void)x, (void)y;
	return dx ? r->be->i->avgpool2d_backward(r->be, r->dev, &l->pool, p->rows, dy, dx) : 0;
}

const tr_layer_i tr_layer_global_avg_pool = {
	.name = "global_avg_pool",
	.type = TR_LAYER_GLOBAL_AVG_POOL,
	.setup = setup,
	.supported = supported,
	.forward = forward,
	.backward = backward,
};
