/* Batch plan: permutations are bijections, every policy covers the data
 * as documented, and device shares are even. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine/data/plan.h"
#include "engine/rng.h"

static struct tr_plan make(int64_t n, int b, enum tr_last_batch lb, bool shuffle, int epochs)
{
	struct tr_plan p;
	struct tr_error err;
	cr_assert_eq(tr_plan_init(&p, n, b, lb, shuffle, 42, epochs, 0, &err), 0, "%s", err.message);
	return p;
}

Test(plan, permutation_is_bijection_and_depends_on_epoch)
{
	int64_t sizes[] = {1, 2, 3, 7, 100, 1000, 4097};
	for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
		int64_t n = sizes[k];
		struct tr_plan p = make(n, 4, TR_LAST_PARTIAL, true, 1);
		char *seen = calloc((size_t)n, 1);
		int64_t same_as_next_epoch = 0;
		for (int64_t i = 0; i < n; i++) {
			int64_t s = tr_plan_sample(&p, 0, i);
			cr_assert(s >= 0 && s < n);
			cr_assert_eq(seen[s], 0, "n=%lld: %lld appears twice", (long long)n, (long long)s);
			seen[s] = 1;
			same_as_next_epoch += s == tr_plan_sample(&p, 1, i);
		}
		if (n >= 100)
			cr_assert_lt(same_as_next_epoch, n / 10, "epochs 0 and 1 share %lld positions",
				     (long long)same_as_next_epoch);
		free(seen);
	}
}

Test(plan, no_shuffle_keeps_file_order)
{
	struct tr_plan p = make(10, 4, TR_LAST_PARTIAL, false, 2);
	int64_t idx[4], epoch;
	cr_assert_eq(tr_plan_step(&p, 3, idx, &epoch), 4);
	cr_assert_eq(epoch, 1);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(idx[i], i);
	cr_assert_eq(tr_plan_step(&p, 5, idx, &epoch), 2);
	cr_assert_eq(idx[0], 8);
	cr_assert_eq(idx[1], 9);
}

static void check_epoch_cover(struct tr_plan *p, int64_t first, int64_t steps, int64_t expect_each)
{
	int64_t n = p->samples;
	int *count = calloc((size_t)n, sizeof *count);
	int64_t *idx = calloc((size_t)p->batch, sizeof *idx);
	for (int64_t s = first; s < first + steps; s++) {
		int64_t e;
		int c = tr_plan_step(p, s, idx, &e);
		for (int i = 0; i < c; i++)
			count[idx[i]]++;
	}
	for (int64_t i = 0; i < n; i++)
		cr_assert_eq(count[i], expect_each, "sample %lld seen %d times", (long long)i, count[i]);
	free(count);
	free(idx);
}

Test(plan, partial_covers_each_sample_once_per_epoch)
{
	struct tr_plan p = make(103, 10, TR_LAST_PARTIAL, true, 3);
	cr_assert_eq(p.total_steps, 33);
	check_epoch_cover(&p, 11, 11, 1);
	int64_t idx[10], e;
	cr_assert_eq(tr_plan_step(&p, 10, idx, &e), 3);
}

Test(plan, drop_skips_remainder_and_refuses_empty)
{
	struct tr_plan p = make(103, 10, TR_LAST_DROP, true, 2);
	cr_assert_eq(p.total_steps, 20);
	struct tr_plan q;
	struct tr_error err;
	cr_assert_lt(tr_plan_init(&q, 5, 10, TR_LAST_DROP, true, 1, 1, 0, &err), 0);
	cr_assert_not_null(strstr(err.message, "/data/last_batch"));
}

Test(plan, pad_wraps_to_start_of_epoch)
{
	struct tr_plan p = make(25, 10, TR_LAST_PAD, true, 1);
	int64_t idx[10], e;
	cr_assert_eq(tr_plan_step(&p, 2, idx, &e), 10);
	for (int i = 5; i < 10; i++)
		cr_assert_eq(idx[i], tr_plan_sample(&p, 0, i - 5));
}

Test(plan, rollover_is_one_stream_over_epochs)
{
	struct tr_plan p = make(25, 10, TR_LAST_ROLLOVER, true, 3);
	cr_assert_eq(p.total_steps, 8);
	check_epoch_cover(&p, 0, 8, 3);
	int64_t idx[10], e;
	/* Step 2 takes positions 20..29: 5 from epoch 0 and 5 from epoch 1. */
	cr_assert_eq(tr_plan_step(&p, 2, idx, &e), 10);
	cr_assert_eq(e, 1);
	cr_assert_eq(idx[4], tr_plan_sample(&p, 0, 24));
	cr_assert_eq(idx[5], tr_plan_sample(&p, 1, 0));
	cr_assert_eq(tr_plan_step(&p, 7, idx, &e), 5);
	cr_assert_eq(tr_plan_step_epoch(&p, 7), 2);
}

Test(plan, max_steps_caps_and_extends)
{
	struct tr_plan p;
	struct tr_error err;
	cr_assert_eq(tr_plan_init(&p, 50, 10, TR_LAST_PARTIAL, true, 1, 0, 17, &err), 0);
	cr_assert_eq(p.total_steps, 17);
	cr_assert_eq(tr_plan_step_epoch(&p, 16), 3);
	cr_assert_eq(tr_plan_init(&p, 50, 10, TR_LAST_PARTIAL, true, 1, 1, 17, &err), 0);
	cr_assert_eq(p.total_steps, 5);
}

Test(plan, shares_are_even_and_contiguous)
{
	for (int count = 0; count <= 20; count++) {
		for (int ndev = 1; ndev <= 8; ndev++) {
			int next = 0, lo = count, hi = 0;
			for (int r = 0; r < ndev; r++) {
				int off, len;
				tr_plan_share(count, ndev, r, &off, &len);
				cr_assert_eq(off, next);
				next += len;
				lo = len < lo ? len : lo;
				hi = len > hi ? len : hi;
			}
			cr_assert_eq(next, count);
			cr_assert_leq(hi - lo, 1);
		}
	}
}

/* Loaders fill a step in row ranges: any cut gives the step's samples, and
 * the count and epoch need no sample list. */
Test(plan, step_in_ranges_matches_whole_step)
{
	enum tr_last_batch policies[] = {TR_LAST_PARTIAL, TR_LAST_DROP, TR_LAST_PAD, TR_LAST_ROLLOVER};
	for (size_t k = 0; k < 4; k++) {
		struct tr_plan p = make(23, 5, policies[k], true, 3);
		for (int64_t s = 0; s < p.total_steps; s++) {
			int64_t whole[5], parts[5], epoch, epoch2;
			int n = tr_plan_step(&p, s, whole, &epoch);
			cr_assert_eq(tr_plan_step_count(&p, s, &epoch2), n);
			cr_assert_eq(epoch2, epoch);
			memset(parts, 0xff, sizeof parts);
			int cut = (int)(s % (n + 1));
			tr_plan_step_range(&p, s, cut, n, parts);
			tr_plan_step_range(&p, s, 0, cut, parts);
			cr_assert_arr_eq(parts, whole, (size_t)n * sizeof whole[0], "policy %zu step %lld", k,
					 (long long)s);
		}
	}
}

/* The shuffle order is part of what a resumed job relies on: pin it to the
 * documented construction (6-round Feistel on tr_rng_u64 with cycle
 * walking), for half-widths inside and outside the round-input table. */
static int64_t reference_sample(uint64_t seed, int bits, int64_t n, int64_t epoch, int64_t pos)
{
	uint64_t key = tr_rng_key(seed, (uint64_t)epoch, 0, TR_RNG_SHUFFLE), mask = (1ULL << bits) - 1;
	uint64_t x = (uint64_t)pos;
	do {
		uint64_t left = x >> bits, right = x & mask;
		for (int round = 0; round < 6; round++) {
			uint64_t f = tr_rng_u64(key, ((uint64_t)round << 40) | right) & mask;
			uint64_t next = left ^ f;
			left = right;
			right = next;
		}
		x = (left << bits) | right;
	} while (x >= (uint64_t)n);
	return (int64_t)x;
}

Test(plan, shuffle_order_is_the_documented_feistel)
{
	int64_t sizes[] = {5, 1000, 16777216, 16777217};
	for (size_t k = 0; k < 4; k++) {
		struct tr_plan p = make(sizes[k], 4, TR_LAST_PARTIAL, true, 2);
		for (int64_t i = 0; i < 500; i++) {
			int64_t pos = (i * 7919) % sizes[k];
			cr_assert_eq(tr_plan_sample(&p, 1, pos), reference_sample(42, p.feistel_bits, sizes[k], 1, pos),
				     "n %lld pos %lld", (long long)sizes[k], (long long)pos);
		}
	}
}

/* 2^62 + 1 samples once spun forever here (the width loop shifted 1 by 64
 * bits); sizes the engine cannot index are refused at once, the largest it
 * takes get a Feistel network that still permutes. */
Test(plan, sizes_beyond_indexing_are_refused, .timeout = 10)
{
	struct tr_plan p;
	struct tr_error err;
	int64_t huge[] = {(INT64_C(1) << 62) + 1, INT64_MAX, TR_PLAN_MAX_SAMPLES + 1};
	for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
		cr_assert_eq(tr_plan_init(&p, huge[i], 32, TR_LAST_PARTIAL, true, 1, 1, 0, &err), -EINVAL,
			     "%lld samples", (long long)huge[i]);
		cr_assert_not_null(strstr(err.message, "more than the engine can index"), "%s", err.message);
	}
	cr_assert_eq(tr_plan_init(&p, 1000, TR_SPEC_MAX_BATCH + 1, TR_LAST_PARTIAL, true, 1, 1, 0, &err), -EINVAL);
	cr_assert_eq(tr_plan_init(&p, 1000, 10, TR_LAST_PARTIAL, true, 1, 0, TR_SPEC_MAX_STEPS + 1, &err), -EINVAL);

	/* The largest: epochs x samples in rollover stays exact. */
	cr_assert_eq(tr_plan_init(&p, TR_PLAN_MAX_SAMPLES, TR_SPEC_MAX_BATCH, TR_LAST_ROLLOVER, true, 1,
				  TR_SPEC_MAX_EPOCHS, 0, &err),
		     0, "%s", err.message);
	cr_assert_eq(p.feistel_bits, 21);
	cr_assert_eq(p.total_steps, (TR_PLAN_MAX_SAMPLES / TR_SPEC_MAX_BATCH) * TR_SPEC_MAX_EPOCHS);
	int64_t last = p.total_steps - 1, epoch;
	cr_assert_eq(tr_plan_step_count(&p, last, &epoch), TR_SPEC_MAX_BATCH);
	cr_assert_eq(epoch, TR_SPEC_MAX_EPOCHS - 1);
	int64_t a = tr_plan_sample(&p, 3, 0), b = tr_plan_sample(&p, 3, TR_PLAN_MAX_SAMPLES - 1);
	cr_assert(a >= 0 && a < TR_PLAN_MAX_SAMPLES && b >= 0 && b < TR_PLAN_MAX_SAMPLES && a != b);
}
