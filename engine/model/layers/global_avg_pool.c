/* global_avg_pool: the mean of each channel, [C, H, W] to the flat [C] a
 * dense layer takes (PyTorch: AdaptiveAvgPool2d(1) then Flatten, one
 * nn.Sequential at this index).  It is the backend's average pool with the
 * whole image as its window.  No parameters. */
#include <errno.h>

#include "engine/model/layer.h"
#include "engine/model/model.h"

static int setup(struct tr_layer *l, const struct tr_layer_spec *s, struct tr_error *err)
{
	(void)s;
	if (tr_layer_image_input(l, "global_avg_pool", err) < 0)
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

const tr_layer_i tr_layer_global_avg_pool = {
	.name = "global_avg_pool",
	.type = TR_LAYER_GLOBAL_AVG_POOL,
	.setup = setup,
	.supported = tr_layer_avgpool_supported,
	.forward = tr_layer_avgpool_forward,
	.backward = tr_layer_avgpool_backward,
};
