/* residual: y = x + layers(x), a block of layers whose output shape must
 * equal its input's.  Its inner layers are nodes of their own (the model
 * builds them from the spec's "layers"), named "<block>.<inner>.weight" as
 * in a torch.nn.Sequential subclass whose forward adds its input.
 * Backward keeps dy (the skip path's gradient) while the inner layers use
 * the two gradient buffers, then adds it to their dx. */
#include <errno.h>
#include <stdio.h>

#include "engine/model/layer.h"
#include "engine/model/layer_spec.h"
#include "engine/model/model.h"

static int setup(struct tr_layer *l, const struct tr_layer_spec *s, struct tr_error *err)
{
	(void)s;
	struct tr_shape a = l->in_shape, b = l->inner_shape;
	bool same = a.ndim == b.ndim;
	for (int i = 0; same && i < a.ndim; i++)
		same = a.d[i] == b.d[i];
	if (!same) {
		char in[48], out[48];
		tr_shape_format(a, in, sizeof in);
		tr_shape_format(b, out, sizeof out);
		tr_error_set(err, 0, 0, NULL,
			     "the block's layers turn its input %s into %s; a residual block must keep the shape", in,
			     out);
		return -EINVAL;
	}
	l->out_shape = a;
	l->saved[0] = (size_t)l->in; /* dy, kept across the inner backward */
	return 0;
}

static bool supported(const tr_backend_i *bi)
{
	return bi->add != NULL;
}

static int forward(const struct tr_pass *p, const struct tr_layer *l, const float *x, float *y)
{
	tr_replica_t *r = p->r;
	int rc = tr_model_seq_forward(p, l->first, l->count, x);
	if (rc < 0)
		return rc;
	return r->be->i->add(r->be, r->dev, (size_t)p->rows * l->out, r->acts[l->first + l->count], x, y);
}

static int backward(const struct tr_pass *p, const struct tr_layer *l, const float *x, const float *y, const float *dy,
		    float *dx)
{
	tr_replica_t *r = p->r;
	const tr_backend_i *bi = r->be->i;
	size_t n = (size_t)p->rows * l->out;
	float *keep = r->aux[l->index];
	(void)y;
	int rc = bi->copy(r->be, r->dev, keep, dy, n * sizeof(float));
	if (rc < 0)
		return rc;
	int cur = dy == r->dbuf[0] ? 0 : 1;
	rc = tr_model_seq_backward(p, l->first, l->count, x, &cur, dx != NULL);
	if (rc < 0 || !dx)
		return rc;
	return bi->add(r->be, r->dev, n, r->dbuf[cur], keep, dx);
}

/* clang-format off */
static const struct tr_field tr_layer_residual_fields[] = {
	{.key = "layers", .kind = K_CUSTOM, .flags = F_REQ, .parse = tr_layer_spec_parse_inner,
	 .emit = tr_layer_spec_emit_inner},
	{0},
};
/* clang-format on */

const tr_layer_i tr_layer_residual = {
	.fields = tr_layer_residual_fields,
	.name = "residual",
	.type = TR_LAYER_RESIDUAL,
	.holds_layers = true,
	.setup = setup,
	.supported = supported,
	.forward = forward,
	.backward = backward,
};
