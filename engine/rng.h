/* Counter-based random numbers.
 *
 * Every random draw in trainerd is a pure function of a key and a counter:
 * key = tr_rng_key(seed, a, b, purpose) where a/b are e.g. (epoch, sample)
 * or (step, layer), counter = the element index.  Nothing depends on which
 * thread or device asks, which is what makes results independent of the
 * device and loader counts and lets a resumed job draw exactly what the
 * uninterrupted one would have.  The mixer is SplitMix64's finaliser; it is
 * cheap enough for GPU kernels and passes the usual avalanche tests.
 */
#ifndef TR_RNG_H
#define TR_RNG_H

#include <math.h>
#include <stdint.h>

enum tr_rng_purpose {
	TR_RNG_INIT = 1,
	TR_RNG_SHUFFLE = 2,
	TR_RNG_DROPOUT = 3,
	TR_RNG_NOISE = 4,
	TR_RNG_SYNTH = 5,
	TR_RNG_SPLIT = 6,
	TR_RNG_PATCH = 7,   /* where a patch sits (patches reader) */
	TR_RNG_AUGMENT = 8, /* random_crop, flip, rot90 */
};

static inline uint64_t tr_mix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ULL;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static inline uint64_t tr_rng_key(uint64_t seed, uint64_t a, uint64_t b, enum tr_rng_purpose purpose)
{
	uint64_t k = tr_mix64(seed ^ ((uint64_t)purpose << 56));
	k = tr_mix64(k ^ a);
	return tr_mix64(k ^ (b * 0xd6e8feb86659fd93ULL));
}

static inline uint64_t tr_rng_u64(uint64_t key, uint64_t counter)
{
	return tr_mix64(key ^ tr_mix64(counter));
}

/* Uniform in [0, 1) with 24 random bits (exactly representable in float). */
static inline float tr_rng_uniform(uint64_t key, uint64_t counter)
{
	return (float)(tr_rng_u64(key, counter) >> 40) * 0x1p-24f;
}

/* Standard normal via Box-Muller on two independent draws. */
static inline float tr_rng_normal(uint64_t key, uint64_t counter)
{
	uint64_t r = tr_rng_u64(key, counter);
	double u1 = ((double)(r >> 11) + 1.0) * 0x1p-53; /* (0, 1] */
	double u2 = (double)(tr_rng_u64(key ^ 0x5bd1e995ULL, counter) >> 11) * 0x1p-53;
	return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* Uniform integer in [0, n) without modulo bias worth caring about
 * (n is far below 2^32 for any dataset we permute). */
static inline uint64_t tr_rng_below(uint64_t key, uint64_t counter, uint64_t n)
{
	return (uint64_t)(((unsigned __int128)tr_rng_u64(key, counter) * n) >> 64);
}

#endif
