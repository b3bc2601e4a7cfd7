/* Learning-rate schedules.
 *
 * tr_schedule_lr(spec, step, total) gives the learning rate of the update
 * with 0-based index `step` out of `total_steps`.  With base = optimizer.lr,
 * W = schedule.warmup_steps, min = schedule.min_lr:
 *
 *   warmup (all types), step < W:   lr = base * (step + 1) / W
 *
 * afterwards, with t = step - W and T = total_steps - W (t clamped to
 * [0, T] for cosine and linear, so the rate stays at min after the end):
 *
 *   constant:  lr = base
 *   step:      lr = base * gamma ^ floor(t / step_size)   (step_size <= 0: base)
 *   cosine:    lr = min + (base - min) * (1 + cos(pi * t / T)) / 2   (T <= 0: base)
 *   linear:    lr = base + (min - base) * t / T                       (T <= 0: base)
 *
 * Cosine matches torch's CosineAnnealingLR (T_max = T, eta_min = min) in
 * closed form; the warmup reaches base on its last step, so the first
 * post-warmup step runs at exactly base.  Computed in double, returned as
 * float.
 */
#ifndef TR_OPTIM_SCHEDULE_H
#define TR_OPTIM_SCHEDULE_H

#include <stdint.h>

#include "engine/spec.h"

float tr_schedule_lr(const struct tr_spec *spec, int64_t step, int64_t total_steps);

#endif
