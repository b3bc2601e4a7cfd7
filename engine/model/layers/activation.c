/* relu, gelu, tanh, sigmoid: elementwise activations of any shape.
 *
 * Four registry entries over one pair of backend kernels (act_forward,
 * act_backward); the entry's setup picks the function. */
#include "engine/model/layer.h"
#include "engine/model/layer_spec.h"
#include "engine/model/model.h"

static int setup_common(struct tr_layer *l, enum tr_act act)
{
	l->out_shape = l->in_shape;
	l->act = act;
	return 0;
}

static int setup_relu(struct tr_layer *l, const struct tr_layer_spec *s, char *err, size_t errlen)
{
	(void)s, (void)err, (void)errlen;
	return setup_common(l, TR_ACT_RELU);
}

static int setup_gelu(struct tr_layer *l, const struct tr_layer_spec *s, char *err, size_t errlen)
{
	(void)err, (void)errlen;
	return setup_common(l, s->gelu_tanh ? TR_ACT_GELU_TANH : TR_ACT_GELU);
}

static int setup_tanh(struct tr_layer *l, const struct tr_layer_spec *s, char *err, size_t errlen)
{
	(void)s, (void)err, (void)errlen;
	return setup_common(l, TR_ACT_TANH);
}

static int setup_sigmoid(struct tr_layer *l, const struct tr_layer_spec *s, char *err, size_t errlen)
{
	(void)s, (void)err, (void)errlen;
	return setup_common(l, TR_ACT_SIGMOID);
}

static int forward(const struct tr_pass *p, const struct tr_layer *l, const float *x, float *y)
{
	tr_replica_t *r = p->r;
	return r->be->i->act_forward(r->be, r->dev, l->act, (size_t)p->rows * l->out, x, y);
}

static int backward(const struct tr_pass *p, const struct tr_layer *l, const float *x, const float *y,
		    const float *dy, float *dx)
{
	tr_replica_t *r = p->r;
	if (!dx)
		return 0;
	return r->be->i->act_backward(r->be, r->dev, l->act, (size_t)p->rows * l->out, x, y, dy, dx);
}

static const char *const approx_names[] = {"none", "tanh", NULL};

static const struct tr_field gelu_fields[] = {
	{.key = "approximate", .kind = K_BOOLENUM, .off = offsetof(struct tr_layer_spec, gelu_tanh),
	 .names = approx_names},
	{0},
};

#define ACT(var, nm, ty, fn, tab)                                                                             \
	const tr_layer_ops var = {                                                                            \
		.name = nm, .type = ty, .fields = tab, .setup = fn, .forward = forward, .backward = backward}

ACT(tr_layer_relu, "relu", TR_LAYER_RELU, setup_relu, NULL);
ACT(tr_layer_gelu, "gelu", TR_LAYER_GELU, setup_gelu, gelu_fields);
ACT(tr_layer_tanh, "tanh", TR_LAYER_TANH, setup_tanh, NULL);
ACT(tr_layer_sigmoid, "sigmoid", TR_LAYER_SIGMOID, setup_sigmoid, NULL);
