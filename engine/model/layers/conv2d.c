/* conv2d: PyTorch's nn.Conv2d on NCHW images: weight [filters, C / groups,
 * kh, kw], bias [filters], both U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with
 * fan_in = C / groups * kh * kw, as PyTorch initialises them.  The
 * backend computes it as im2col + GEMM over chunks of samples with a
 * workspace shared by all layers of a replica. */
#include <errno.h>
#include <stdio.h>

#include "engine/model/layer.h"
#include "engine/model/layer_spec.h"
#include "engine/model/model.h"

/* Output side for input n, kernel k, stride s, padding p, dilation d. */
static int out_side(int n, int k, int s, int p, int d)
{
	long span = (long)d * (k - 1) + 1, room = (long)n + 2L * p - span;
	return room < 0 ? 0 : (int)(room / s + 1);
}

static int setup(struct tr_layer *l, const struct tr_layer_spec *s, struct tr_error *err)
{
	if (tr_layer_image_input(l, "conv2d", err) < 0)
		return -EINVAL;
	struct tr_conv2d_desc *d = &l->conv;
	d->c = l->in_shape.d[0];
	d->h = l->in_shape.d[1];
	d->w = l->in_shape.d[2];
	d->f = s->filters;
	d->kh = s->kernel[0];
	d->kw = s->kernel[1];
	d->sh = s->stride[0] ? s->stride[0] : 1;
	d->sw = s->stride[1] ? s->stride[1] : 1;
	d->dh = s->dilation[0] ? s->dilation[0] : 1;
	d->dw = s->dilation[1] ? s->dilation[1] : 1;
	d->groups = s->groups ? s->groups : 1;
	if (d->c % d->groups || d->f % d->groups) {
		tr_error_set(err, 0, 0, NULL, "groups (%d) must divide the input channels (%d) and filters (%d)",
			     d->groups, d->c, d->f);
		return -EINVAL;
	}
	if (s->pad_same) {
		/* PyTorch: "same" only with stride 1; the total padding
		 * d (k - 1) splits evenly only when it is even. */
		if (d->sh != 1 || d->sw != 1) {
			tr_error_set(err, 0, 0, NULL, "padding \"same\" needs stride 1");
			return -EINVAL;
		}
		int th = d->dh * (d->kh - 1), tw = d->dw * (d->kw - 1);
		if (th % 2 || tw % 2) {
			tr_error_set(
				err, 0, 0, NULL,
				"padding \"same\" needs an odd kernel (dilation x (kernel - 1) even), got kernel [%d, %d]",
				d->kh, d->kw);
			return -EINVAL;
		}
		d->ph = th / 2;
		d->pw = tw / 2;
	} else {
		d->ph = s->padding[0];
		d->pw = s->padding[1];
	}
	d->ho = out_side(d->h, d->kh, d->sh, d->ph, d->dh);
	d->wo = out_side(d->w, d->kw, d->sw, d->pw, d->dw);
	if (d->ho < 1 || d->wo < 1) {
		char in[48];
		tr_shape_format(l->in_shape, in, sizeof in);
		tr_error_set(err, 0, 0, NULL,
			     "the kernel [%d, %d] (dilation [%d, %d], padding [%d, %d]) does not fit the input %s",
			     d->kh, d->kw, d->dh, d->dw, d->ph, d->pw, in);
		return -EINVAL;
	}
	l->out_shape = (struct tr_shape){.ndim = 3, .d = {d->f, d->ho, d->wo}};
	size_t fan_in = (size_t)(d->c / d->groups) * d->kh * d->kw;
	tr_layer_param(l, "weight", TR_INIT_UNIFORM_FAN_IN, fan_in, 4,
		       (int64_t[]){d->f, d->c / d->groups, d->kh, d->kw});
	if (s->bias)
		tr_layer_param(l, "bias", TR_INIT_UNIFORM_FAN_IN, fan_in, 1, (int64_t[]){d->f});
	return 0;
}

static size_t workspace(const struct tr_layer *l, int rows)
{
	return tr_conv2d_workspace(&l->conv, rows);
}

static bool supported(const tr_backend_i *bi)
{
	return bi->conv2d_forward && bi->conv2d_backward;
}

static int forward(const struct tr_pass *p, const struct tr_layer *l, const float *x, float *y)
{
	tr_replica_t *r = p->r;
	const float *b = l->n_tensors > 1 ? r->params + l->tensors[1].off : NULL;
	return r->be->i->conv2d_forward(r->be, r->dev, &l->conv, p->rows, x, r->params + l->tensors[0].off, b, y,
					r->work);
}

static int backward(const struct tr_pass *p, const struct tr_layer *l, const float *x, const float *y, const float *dy,
		    float *dx)
{
	tr_replica_t *r = p->r;
	float *db = l->n_tensors > 1 ? r->grads + l->tensors[1].off : NULL;
	(void)y;
	return r->be->i->conv2d_backward(r->be, r->dev, &l->conv, p->rows, x, r->params + l->tensors[0].off, dy, dx,
					 r->grads + l->tensors[0].off, db, r->work);
}

#define LAY(m) offsetof(struct tr_layer_spec, m)

/* clang-format off */
static const struct tr_field tr_layer_conv2d_fields[] = {
	{.key = "filters", .kind = K_INT, .off = LAY(filters), .flags = F_REQ | POSITIVE | F_HI, .hi = TR_SPEC_MAX_WIDTH},
	{.key = "kernel", .kind = K_CUSTOM, .flags = F_REQ, .parse = tr_layer_spec_parse_kernel,
	 .emit = tr_layer_spec_emit_kernel},
	{.key = "stride", .kind = K_CUSTOM, .parse = tr_layer_spec_parse_stride, .emit = tr_layer_spec_emit_stride},
	{.key = "padding", .kind = K_CUSTOM, .parse = tr_layer_spec_parse_padding_same,
	 .emit = tr_layer_spec_emit_padding},
	{.key = "dilation", .kind = K_CUSTOM, .parse = tr_layer_spec_parse_dilation, .emit = tr_layer_spec_emit_dilation},
	{.key = "groups", .kind = K_INT, .off = LAY(groups), .flags = POSITIVE | F_HI, .hi = TR_SPEC_MAX_WIDTH, .def = 1},
	{.key = "bias", .kind = K_BOOL, .off = LAY(bias), .def = 1},
	{0},
};
/* clang-format on */

const tr_layer_i tr_layer_conv2d = {
	.fields = tr_layer_conv2d_fields,
	.width_key = "filters",
	.name = "conv2d",
	.type = TR_LAYER_CONV2D,
	.setup = setup,
	.workspace = workspace,
	.supported = supported,
	.forward = forward,
	.backward = backward,
};
