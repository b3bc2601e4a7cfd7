/* The batch plan: which samples form global step s, and how a step is split
 * across devices.
 *
 * Everything here is a pure function of (seed, epoch, step), so loader
 * threads can compute any step in any order, a resumed job recomputes the
 * same steps, and the split across D devices never changes the step's
 * sample list (docs/design.md §1).
 *
 * Epoch permutations come from a keyed Feistel network with cycle walking:
 * a bijection on [0, n) that costs O(1) per lookup and no memory, so no
 * permutation table has to be shared or rebuilt between threads.
 *
 * last_batch policies, with n samples and global batch B:
 *   partial  ceil(n/B) steps per epoch; the last one holds n mod B samples.
 *   drop     floor(n/B) steps per epoch; the remainder is skipped.
 *   pad      ceil(n/B) steps; the last is filled by wrapping to the start of
 *            the same epoch's order (duplicates, for fixed shapes).
 *   rollover the epochs form one stream; step s takes stream positions
 *            [sB, sB+B), so an epoch's remainder opens the next epoch's first
 *            step.  The very last remainder of the run is a short final step,
 *            so every sample of every epoch is seen exactly once.  A step
 *            belongs to the epoch in which its last sample lies.
 */
#ifndef TR_DATA_PLAN_H
#define TR_DATA_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "engine/spec.h"

/* The most samples a plan takes: with epochs <= TR_SPEC_MAX_EPOCHS (2^20),
 * epochs x samples stays below 2^62.  The spec's own bound is lower. */
#define TR_PLAN_MAX_SAMPLES (INT64_C(1) << 42)

struct tr_plan {
	int64_t samples;
	int batch;
	enum tr_last_batch last_batch;
	bool shuffle;
	uint64_t seed;
	int64_t epochs;          /* 0 = unbounded (max_steps decides) */
	int64_t steps_per_epoch; /* not meaningful for rollover */
	int64_t total_steps;
	int feistel_bits; /* half-width of the Feistel network */
};

/* Returns 0, or -EINVAL with a message (for example a batch larger than the
 * data set with last_batch "drop"). */
int tr_plan_init(struct tr_plan *plan, int64_t samples, int batch, enum tr_last_batch last_batch, bool shuffle,
		 uint64_t seed, int epochs, int64_t max_steps, struct tr_error *err);

/* Position `pos` of epoch `epoch`'s order -> sample index. */
int64_t tr_plan_sample(const struct tr_plan *plan, int64_t epoch, int64_t pos);

/* Fills idx (room for plan->batch entries) with step `step`'s samples;
 * returns the count and stores the step's epoch. */
int tr_plan_step(const struct tr_plan *plan, int64_t step, int64_t *idx, int64_t *epoch);

/* The same in parts, so loaders can share one step: the step's sample count
 * and epoch, and its samples [begin, end) written to idx[begin..end). */
int tr_plan_step_count(const struct tr_plan *plan, int64_t step, int64_t *epoch);
void tr_plan_step_range(const struct tr_plan *plan, int64_t step, int begin, int end, int64_t *idx);

/* Epoch of a step without listing its samples. */
int64_t tr_plan_step_epoch(const struct tr_plan *plan, int64_t step);

/* Even split of `count` rows over `ndev` devices: sizes differ by at most
 * one, lower ranks get the extra rows, a device may get zero. */
static inline void tr_plan_share(int count, int ndev, int rank, int *offset, int *len)
{
	int base = count / ndev, extra = count % ndev;
	*len = base + (rank < extra ? 1 : 0);
	*offset = rank * base + (rank < extra ? rank : extra);
}

#endif
