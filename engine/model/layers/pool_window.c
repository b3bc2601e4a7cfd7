/* What maxpool2d and avgpool2d share: their spec keys and the window
 * sweep's shapes (PyTorch's floor mode; padding at most half the kernel,
 * as PyTorch requires, so no max-pool window is padding only). */
#include <errno.h>
#include <stdio.h>

#include "engine/model/layer.h"
#include "engine/model/layer_spec.h"

/* clang-format off */
const struct tr_field tr_layer_pool_window_fields[] = {
	{.key = "kernel", .kind = K_CUSTOM, .flags = F_REQ, .parse = tr_layer_spec_parse_kernel,
	 .emit = tr_layer_spec_emit_kernel},
	{.key = "stride", .kind = K_CUSTOM, .parse = tr_layer_spec_parse_stride_kernel,
	 .emit = tr_layer_spec_emit_stride},
	{.key = "padding", .kind = K_CUSTOM, .parse = tr_layer_spec_parse_padding, .emit = tr_layer_spec_emit_padding},
	{0},
};
/* clang-format on */

int tr_layer_pool_window(struct tr_layer *l, const struct tr_layer_spec *s, const char *what, struct tr_error *err)
{
	if (tr_layer_image_input(l, what, err) < 0)
		return -EINVAL;
	struct tr_pool2d_desc *d = &l->pool;
	d->c = l->in_shape.d[0];
	d->h = l->in_shape.d[1];
	d->w = l->in_shape.d[2];
	d->kh = s->kernel[0];
	d->kw = s->kernel[1];
	d->sh = s->stride[0] ? s->stride[0] : d->kh;
	d->sw = s->stride[1] ? s->stride[1] : d->kw;
	d->ph = s->padding[0];
	d->pw = s->padding[1];
	if (2 * d->ph > d->kh || 2 * d->pw > d->kw) {
		tr_error_set(err, 0, 0, NULL, "padding [%d, %d] must be at most half the kernel [%d, %d]", d->ph, d->pw,
			     d->kh, d->kw);
		return -EINVAL;
	}
	if (d->kh > d->h + 2 * d->ph || d->kw > d->w + 2 * d->pw) {
		char in[48];
		tr_shape_format(l->in_shape, in, sizeof in);
		tr_error_set(err, 0, 0, NULL, "the kernel [%d, %d] (padding [%d, %d]) does not fit the input %s", d->kh,
			     d->kw, d->ph, d->pw, in);
		return -EINVAL;
	}
	d->ho = (d->h + 2 * d->ph - d->kh) / d->sh + 1;
	d->wo = (d->w + 2 * d->pw - d->kw) / d->sw + 1;
	l->out_shape = (struct tr_shape){.ndim = 3, .d = {d->c, d->ho, d->wo}};
	return 0;
}
