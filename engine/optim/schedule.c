/* Learning-rate schedules: pure functions of (spec, step, total steps).
 *
 * Being stateless (unlike torch's chained schedulers) is what makes resume
 * exact: a job restarted at step s gets the rate the uninterrupted run used
 * at s without replaying anything.  Formulas are in schedule.h.
 */
#include <math.h>

#include "engine/optim/schedule.h"

float tr_schedule_lr(const struct tr_spec *spec, int64_t step, int64_t total_steps)
{
	const double base = spec->optimizer.lr;
	const double min_lr = spec->schedule.min_lr;
	const int64_t warmup = spec->schedule.warmup_steps > 0 ? spec->schedule.warmup_steps : 0;

	if (step < 0)
		step = 0;
	if (step < warmup)
		return (float)(base * (double)(step + 1) / (double)warmup);

	int64_t t = step - warmup;
	int64_t T = total_steps - warmup;

	switch (spec->schedule.type) {
	case TR_SCHED_CONSTANT:
		return (float)base;
	case TR_SCHED_STEP:
		if (spec->schedule.step_size <= 0)
			return (float)base;
		return (float)(base * pow((double)spec->schedule.gamma, (double)(t / spec->schedule.step_size)));
	case TR_SCHED_COSINE:
		if (T <= 0)
			return (float)base;
		if (t > T)
			t = T;
		return (float)(min_lr + (base - min_lr) * (1.0 + cos(M_PI * (double)t / (double)T)) / 2.0);
	case TR_SCHED_LINEAR:
		if (T <= 0)
			return (float)base;
		if (t > T)
			t = T;
		return (float)(base + (min_lr - base) * (double)t / (double)T);
	}
	return (float)base;
}
