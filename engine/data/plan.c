/* Batch plan: epoch permutations and step composition (see plan.h). */
#include "engine/data/plan.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>

#include "engine/rng.h"

#define FEISTEL_ROUNDS 6

/* The round function is tr_rng_u64(key, round << 40 | right), i.e.
 * mix(key ^ mix(round << 40 | right)); the inner mix does not depend on the
 * key, so for half-widths up to TABLE_BITS (data sets up to 16M samples)
 * it is looked up: one mix per round instead of two, same permutation. */
#define TABLE_BITS 12
static uint64_t round_input[FEISTEL_ROUNDS][1 << TABLE_BITS];
static pthread_once_t round_input_once = PTHREAD_ONCE_INIT;

static void fill_round_input(void)
{
	for (uint64_t r = 0; r < FEISTEL_ROUNDS; r++)
		for (uint64_t x = 0; x < (1u << TABLE_BITS); x++)
			round_input[r][x] = tr_mix64((r << 40) | x);
}

int tr_plan_init(struct tr_plan *plan, int64_t samples, int batch, enum tr_last_batch last_batch, bool shuffle,
		 uint64_t seed, int epochs, int64_t max_steps, struct tr_error *err)
{
	if (samples <= 0) {
		tr_error_set(err, 0, 0, NULL, "the training set is empty");
		return -EINVAL;
	}
	if (batch <= 0 || (epochs <= 0 && max_steps <= 0)) {
		tr_error_set(err, 0, 0, NULL, "batch_size and one of epochs or max_steps must be positive");
		return -EINVAL;
	}
	/* The spec bounds samples, epochs, max_steps and the batch far below
	 * this (engine/spec.h); readers of files and callers other than the
	 * daemon are held here to what the arithmetic below can take: the
	 * Feistel domain 4^bits must fit 64 bits, and epochs x samples and
	 * max_steps x batch must fit int64. */
	if (samples > TR_PLAN_MAX_SAMPLES || epochs > TR_SPEC_MAX_EPOCHS || max_steps > TR_SPEC_MAX_STEPS ||
	    batch > TR_SPEC_MAX_BATCH) {
		tr_error_set(err, 0, 0, NULL,
			     "%lld samples, %d epochs, %lld max_steps or batch_size %d: more than the engine can index",
			     (long long)samples, epochs, (long long)max_steps, batch);
		return -EINVAL;
	}
	*plan = (struct tr_plan){
		.samples = samples,
		.batch = batch,
		.last_batch = last_batch,
		.shuffle = shuffle,
		.seed = seed,
		.epochs = epochs > 0 ? epochs : 0,
	};
	/* samples <= 2^62, so this ends by bits = 31 without shifting past 63. */
	int bits = 1;
	while (((uint64_t)1 << (2 * bits)) < (uint64_t)samples)
		bits++;
	plan->feistel_bits = bits;
	if (bits <= TABLE_BITS)
		pthread_once(&round_input_once, fill_round_input);

	switch (last_batch) {
	case TR_LAST_DROP:
		plan->steps_per_epoch = samples / batch;
		if (plan->steps_per_epoch == 0) {
			tr_error_set(err, 0, 0, "/data/last_batch",
				     "/data/last_batch: \"drop\" with batch_size %d and only %lld training samples "
				     "leaves no step",
				     batch, (long long)samples);
			return -EINVAL;
		}
		break;
	case TR_LAST_PARTIAL:
	case TR_LAST_PAD:
	case TR_LAST_ROLLOVER:
		plan->steps_per_epoch = (samples + batch - 1) / batch;
		break;
	}

	int64_t total = 0;
	if (plan->epochs > 0) {
		if (last_batch == TR_LAST_ROLLOVER)
			total = (plan->epochs * samples + batch - 1) / batch;
		else
			total = plan->epochs * plan->steps_per_epoch;
	}
	if (max_steps > 0 && (total == 0 || max_steps < total))
		total = max_steps;
	plan->total_steps = total;
	return 0;
}

/* One balanced Feistel pass over 2*bits bits; a bijection for any key. */
static uint64_t feistel(uint64_t x, int bits, uint64_t key)
{
	uint64_t mask = (1ULL << bits) - 1;
	uint64_t left = x >> bits, right = x & mask;
	for (int round = 0; round < FEISTEL_ROUNDS; round++) {
		uint64_t f = (bits <= TABLE_BITS ? tr_mix64(key ^ round_input[round][right])
						 : tr_rng_u64(key, ((uint64_t)round << 40) | right)) &
			     mask;
		uint64_t next = left ^ f;
		left = right;
		right = next;
	}
	return (left << bits) | right;
}

static uint64_t epoch_key(const struct tr_plan *plan, int64_t epoch)
{
	return tr_rng_key(plan->seed, (uint64_t)epoch, 0, TR_RNG_SHUFFLE);
}

/* tr_plan_sample with the epoch's key already derived (three mixes, as
 * much as the permutation itself for small data sets). */
static int64_t sample_keyed(const struct tr_plan *plan, uint64_t key, int64_t pos)
{
	if (!plan->shuffle)
		return pos;
	/* Cycle walking: re-apply until the value lands inside [0, n).  The
	 * domain is at most 4n, so this takes a few rounds on average. */
	uint64_t x = (uint64_t)pos;
	do
		x = feistel(x, plan->feistel_bits, key);
	while (x >= (uint64_t)plan->samples);
	return (int64_t)x;
}

int64_t tr_plan_sample(const struct tr_plan *plan, int64_t epoch, int64_t pos)
{
	return plan->shuffle ? sample_keyed(plan, epoch_key(plan, epoch), pos) : pos;
}

int64_t tr_plan_step_epoch(const struct tr_plan *plan, int64_t step)
{
	if (plan->last_batch == TR_LAST_ROLLOVER) {
		int64_t end = (step + 1) * plan->batch;
		if (plan->epochs > 0 && end > plan->epochs * plan->samples)
			end = plan->epochs * plan->samples;
		return (end - 1) / plan->samples;
	}
	return step / plan->steps_per_epoch;
}

int tr_plan_step_count(const struct tr_plan *plan, int64_t step, int64_t *epoch)
{
	int64_t n = plan->samples, b = plan->batch;
	if (plan->last_batch == TR_LAST_ROLLOVER) {
		int64_t begin = step * b, end = begin + b;
		if (plan->epochs > 0 && end > plan->epochs * n)
			end = plan->epochs * n;
		*epoch = (end - 1) / n;
		return (int)(end - begin);
	}
	int64_t begin = (step % plan->steps_per_epoch) * b;
	int64_t count = b;
	if (plan->last_batch == TR_LAST_PARTIAL && begin + count > n)
		count = n - begin;
	*epoch = step / plan->steps_per_epoch;
	return (int)count;
}

void tr_plan_step_range(const struct tr_plan *plan, int64_t step, int begin, int end, int64_t *idx)
{
	int64_t n = plan->samples, b = plan->batch;
	if (plan->last_batch == TR_LAST_ROLLOVER) {
		int64_t e = -1;
		uint64_t key = 0;
		for (int j = begin; j < end; j++) {
			int64_t p = step * b + j;
			if (p / n != e) {
				e = p / n;
				key = epoch_key(plan, e);
			}
			idx[j] = sample_keyed(plan, key, p % n);
		}
		return;
	}
	int64_t e = step / plan->steps_per_epoch;
	int64_t first = (step % plan->steps_per_epoch) * b;
	uint64_t key = epoch_key(plan, e);
	for (int j = begin; j < end; j++)
		idx[j] = sample_keyed(plan, key, (first + j) % n);
}

int tr_plan_step(const struct tr_plan *plan, int64_t step, int64_t *idx, int64_t *epoch)
{
	int count = tr_plan_step_count(plan, step, epoch);
	tr_plan_step_range(plan, step, 0, count, idx);
	return count;
}
