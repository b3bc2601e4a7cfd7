/* Maps the spec's optimizer section onto the backend's update kernels.
 *
 * Kept on the host side and free of arithmetic on purpose: the kernels are
 * the single place the update formulas live, so CPU and CUDA replicas can
 * only differ by floating-point rounding, never by formula.
 */
#include <errno.h>

#include "engine/optim/optimizer.h"

struct tr_optim_hp tr_optim_hp_from_spec(const struct tr_spec *spec, float lr, int64_t step)
{
	return (struct tr_optim_hp){
		.lr = lr,
		.weight_decay = spec->optimizer.weight_decay,
		.momentum = spec->optimizer.momentum,
		.dampening = spec->optimizer.dampening,
		.nesterov = spec->optimizer.nesterov,
		.beta1 = spec->optimizer.beta1,
		.beta2 = spec->optimizer.beta2,
		.eps = spec->optimizer.eps,
		.decoupled = spec->optimizer.type == TR_OPT_ADAMW,
		.step = step,
	};
}

int tr_optim_state_buffers(enum tr_optim_type type, const struct tr_spec *spec)
{
	switch (type) {
	case TR_OPT_SGD:
		return spec && spec->optimizer.momentum != 0.0f ? 1 : 0;
	case TR_OPT_ADAM:
	case TR_OPT_ADAMW:
		return 2;
	}
	return -EINVAL;
}

/* The type, not a stale hp, decides Adam's weight-decay coupling. */
static struct tr_optim_hp adam_hp(enum tr_optim_type type, const struct tr_optim_hp *hp)
{
	struct tr_optim_hp h = *hp;
	h.decoupled = type == TR_OPT_ADAMW;
	return h;
}

int tr_optim_apply(tr_backend_t *be, int dev, enum tr_optim_type type, size_t n, float *param, const float *grad,
		   float *state1, float *state2, const struct tr_optim_hp *hp)
{
	switch (type) {
	case TR_OPT_SGD:
		return be->i->sgd_step(be, dev, n, param, grad, state1, hp);
	case TR_OPT_ADAM:
	case TR_OPT_ADAMW: {
		struct tr_optim_hp h = adam_hp(type, hp);
		return be->i->adam_step(be, dev, n, param, grad, state1, state2, &h);
	}
	}
	return -EINVAL;
}

int tr_optim_apply_into(tr_backend_t *be, int dev, enum tr_optim_type type, size_t n, const float *param,
			const float *grad, const float *state1, const float *state2, float *param_out,
			float *state1_out, float *state2_out, const struct tr_optim_hp *hp)
{
	if (!be->i->sgd_step_into || !be->i->adam_step_into)
		return -ENOTSUP;
	switch (type) {
	case TR_OPT_SGD:
		return be->i->sgd_step_into(be, dev, n, param, grad, state1, param_out, state1_out, hp);
	case TR_OPT_ADAM:
	case TR_OPT_ADAMW: {
		struct tr_optim_hp h = adam_hp(type, hp);
		return be->i->adam_step_into(be, dev, n, param, grad, state1, state2, param_out, state1_out, state2_out,
					     &h);
	}
	}
	return -EINVAL;
}
