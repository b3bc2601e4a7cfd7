/* gelu: x Phi(x), exact or with PyTorch's tanh approximation
 * ("approximate"), elementwise on any shape (no parameters). */
#include "engine/model/layer.h"
#include "engine/model/layer_spec.h"
#include "engine/model/model.h"

static const char *const approx_names[] = {"none", "tanh", NULL};

/* clang-format off */
static const struct tr_field fields[] = {
	{.key = "approximate", .kind = K_BOOLENUM, .off = offsetof(struct tr_layer_spec, gelu_tanh),
	 .names = approx_names},
	{0},
};
/* clang-format on */

static int setup(struct tr_layer *l, const struct tr_layer_spec *s, struct tr_error *err)
{
	(void)err;
	l->out_shape = l->in_shape;
	l->act = s->gelu_tanh ? TR_ACT_GELU_TANH : TR_ACT_GELU;
	return 0;
}

const tr_layer_i tr_layer_gelu = {
	.name = "gelu",
	.type = TR_LAYER_GELU,
	.fields = fields,
	.setup = setup,
	.forward = tr_layer_act_forward,
	.backward = tr_layer_act_backward,
};
