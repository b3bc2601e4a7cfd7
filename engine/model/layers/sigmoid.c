/* sigmoid: the logistic function, elementwise on any shape (no parameters). */
#include "engine/model/layer.h"
#include "engine/model/model.h"

static int setup(struct tr_layer *l, const struct tr_layer_spec *s, struct tr_error *err)
{
	(void)s, (void)err;
	l->out_shape = l->in_shape;
	l->act = TR_ACT_SIGMOID;
	return 0;
}

const tr_layer_i tr_layer_sigmoid = {
	.name = "sigmoid",
	.type = TR_LAYER_SIGMOID,
	.setup = setup,
	.forward = tr_layer_act_forward,
	.backward = tr_layer_act_backward,
};
