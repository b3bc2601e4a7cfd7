/* Optimizer glue between the job spec and the backend's update kernels.
 *
 * The trainer keeps one parameter buffer, one gradient buffer and up to two
 * optimizer state buffers per replica; every replica applies the identical
 * update after the gradient allreduce.  The update formulas are PyTorch's
 * (torch.optim.SGD, Adam, AdamW with foreach=False) and are documented at
 * the kernels in engine/cpu/cpu_kernels.c.
 */
#ifndef TR_OPTIM_OPTIMIZER_H
#define TR_OPTIM_OPTIMIZER_H

#include <stddef.h>
#include <stdint.h>

#include "engine/backend.h"
#include "engine/spec.h"

/* Hyper-parameters for the update numbered `step` (1-based) at learning
 * rate `lr` (from the schedule); the rest comes from spec->optimizer.
 * decoupled is set for adamw. */
struct tr_optim_hp tr_optim_hp_from_spec(const struct tr_spec *spec, float lr, int64_t step);

/* Number of state buffers of n floats the optimizer needs, each zeroed
 * before the first step: sgd 1 with momentum, else 0; adam/adamw 2
 * (first and second moments).  Negative -EINVAL for an unknown type. */
int tr_optim_state_buffers(enum tr_optim_type type, const struct tr_spec *spec);

/* Applies one update of n parameters on device `dev`.  state1/state2 are
 * the buffers counted by tr_optim_state_buffers (unused ones may be NULL).
 * Returns 0 or the backend's negative error code (reason in last_error). */
int tr_optim_apply(tr_backend_t *be, int dev, enum tr_optim_type type, size_t n, float *param, const float *grad,
		   float *state1, float *state2, const struct tr_optim_hp *hp);

/* The same update written to other buffers (*_out), leaving the inputs as
 * they were; bit-identical to tr_optim_apply.  -ENOTSUP where the backend
 * has no out-of-place kernels. */
int tr_optim_apply_into(tr_backend_t *be, int dev, enum tr_optim_type type, size_t n, const float *param,
			const float *grad, const float *state1, const float *state2, float *param_out,
			float *state1_out, float *state2_out, const struct tr_optim_hp *hp);

#endif
