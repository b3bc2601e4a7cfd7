/* maxpool2d, avgpool2d, global_avg_pool: pooling over NCHW images, as
 * PyTorch's nn.MaxPool2d, nn.AvgPool2d (floor mode, padding counted in the
 * average) and AdaptiveAvgPool2d(1) followed by a flatten: global_avg_pool
 * gives the flat [C] a dense layer takes.  No parameters. */
#include <errno.h>
#include <stdio.h>

#include "engine/model/layer.h"
#include "engine/model/layer_spec.h"
#include "engine/model/model.h"

static int setup_window(struct tr_layer *l, const struct tr_layer_spec *s, const char *what, char *err,
			size_t errlen)
{
	if (tr_layer_image_input(l, what, err, errlen) < 0)
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
	/* PyTorch refuses more, and max pooling's windows would then be
	 * padding only. */
	if (2 * d->ph > d->kh || 2 * d->pw > d->kw) {
		snprintf(err, errlen, "padding [%d, %d] must be at most half the kernel [%d, %d]", d->ph, d->pw, d->kh,
			 d->kw);
		return -EINVAL;
	}
	if (d->kh > d->h + 2 * d->ph || d->kw > d->w + 2 * d->pw) {
		char in[48];
		tr_shape_format(l->in_shape, in, sizeof in);
		snprintf(err, errlen, "the kernel [%d, %d] (padding [%d, %d]) does not fit the input %s", d->kh, d->kw,
			 d->ph, d->pw, in);
		return -EINVAL;
	}
	d->ho = (d->h + 2 * d->ph - d->kh) / d->sh + 1;
	d->wo = (d->w + 2 * d->pw - d->kw) / d->sw + 1;
	l->out_shape = (struct tr_shape){.ndim = 3, .d = {d->c, d->ho, d->wo}};
	return 0;
}

static int setup_max(struct tr_layer *l, const struct tr_layer_spec *s, char *err, size_t errlen)
{
	return setup_window(l, s, "maxpool2d", err, errlen);
}

static int setup_avg(struct tr_layer *l, const struct tr_layer_spec *s, char *err, size_t errlen)
{
	return setup_window(l, s, "avgpool2d", err, errlen);
}

static int setup_global(struct tr_layer *l, const struct tr_layer_spec *s, char *err, size_t errlen)
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

static bool supported_max(const tr_backend_i *bi)
{
	return bi->maxpool2d_forward && bi->maxpool2d_backward;
}

static bool supported_avg(const tr_backend_i *bi)
{
	return bi->avgpool2d_forward && bi->avgpool2d_backward;
}

static int forward_max(const struct tr_pass *p, const struct tr_layer *l, const float *x, float *y)
{
	tr_replica_t *r = p->r;
	return r->be->i->maxpool2d_forward(r->be, r->dev, &l->pool, p->rows, x, y);
}

static int backward_max(const struct tr_pass *p, const struct tr_layer *l, const float *x, const float *y,
			const float *dy, float *dx)
{
	tr_replica_t *r = p->r;
	(void)y;
	return dx ? r->be->i->maxpool2d_backward(r->be, r->dev, &l->pool, p->rows, x, dy, dx) : 0;
}

static int forward_avg(const struct tr_pass *p, const struct tr_layer *l, const float *x, float *y)
{
	tr_replica_t *r = p->r;
	return r->be->i->avgpool2d_forward(r->be, r->dev, &l->pool, p->rows, x, y);
}

static int backward_avg(const struct tr_pass *p, const struct tr_layer *l, const float *x, const float *y,
			const float *dy, float *dx)
{
	tr_replica_t *r = p->r;
	(void)x, (void)y;
	return dx ? r->be->i->avgpool2d_backward(r->be, r->dev, &l->pool, p->rows, dy, dx) : 0;
}

static const struct tr_field window_fields[] = {
	{.key = "kernel", .kind = K_CUSTOM, .flags = F_REQ, .parse = tr_layer_spec_parse_kernel,
	 .emit = tr_layer_spec_emit_kernel},
	{.key = "stride", .kind = K_CUSTOM, .parse = tr_layer_spec_parse_stride_kernel,
	 .emit = tr_layer_spec_emit_stride},
	{.key = "padding", .kind = K_CUSTOM, .parse = tr_layer_spec_parse_padding, .emit = tr_layer_spec_emit_padding},
	{0},
};

const tr_layer_ops tr_layer_maxpool2d = {
	.fields = window_fields,
	.name = "maxpool2d",
	.type = TR_LAYER_MAXPOOL2D,
	.setup = setup_max,
	.supported = supported_max,
	.forward = forward_max,
	.backward = backward_max,
};

const tr_layer_ops tr_layer_avgpool2d = {
	.fields = window_fields,
	.name = "avgpool2d",
	.type = TR_LAYER_AVGPOOL2D,
	.setup = setup_avg,
	.supported = supported_avg,
	.forward = forward_avg,
	.backward = backward_avg,
};

const tr_layer_ops tr_layer_global_avg_pool = {
	.name = "global_avg_pool",
	.type = TR_LAYER_GLOBAL_AVG_POOL,
	.setup = setup_global,
	.supported = supported_avg,
	.forward = forward_avg,
	.backward = backward_avg,
};
