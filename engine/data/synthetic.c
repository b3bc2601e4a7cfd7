/* Synthetic datasets: every sample is a pure function of (seed, index).
 *
 * They let examples, tests and benchmarks run offline, and because nothing
 * is stored or streamed, any loader thread may produce any sample in any
 * order and get the same bytes.  Classification draws a class per sample
 * and scatters it around a class center in [-1, 1]^features, so it is
 * learnable whenever the noise is small next to the distance between
 * centers; regression is a fixed random linear map plus noise.
 * load_cost_us makes each sample cost that much wall time, to model slow
 * storage when measuring how well the prefetch pool hides it.  The wait is
 * owed per sample but slept in slices (see owed_us), as slow storage serves
 * a loader's run of samples in few requests.
 *
 * Generation has to be cheap: loaders share the cores with compute, and a
 * benchmark on synthetic data should measure the engine, not this file.
 * So the class centers are computed once at open, and feature noise is an
 * Irwin-Hall approximation of the normal (four 16-bit uniforms from one
 * 64-bit draw) rather than Box-Muller's log and cos in double: about 25x
 * cheaper per feature, exact unit variance, tails cut at +-3.46 sigma.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "engine/data/reader_internal.h"
#include "engine/rng.h"

/* Second key word per stream: samples, class centers and regression
 * weights must never share a key even when an index equals a class. */
enum { STREAM_SAMPLE = 0, STREAM_CENTER = 1, STREAM_WEIGHT = 2 };

struct synth_reader {
	tr_reader_t base;
	enum tr_synth_task task;
	uint64_t seed;
	int classes;
	float noise;
	int64_t load_cost_us;
	float *w;       /* regression: [features, outputs], see synth_targets */
	float *centers; /* classification: [classes, features], NULL when too large */
};

/* Centers cost classes x features floats; above this they are recomputed
 * per sample instead (same values, slower). */
#define MAX_CENTER_FLOATS ((size_t)1 << 22)

/* Irwin-Hall: the sum of four uniforms on {0.5, ..., 65535.5}/65536 has
 * mean 2 and variance 1/3 (less 2^-32); centred and scaled to unit
 * variance.  Integer sum and one float multiply: exact and the same on
 * every path the compiler may vectorise. */
static inline float noise_normal(uint64_t key, uint64_t counter)
{
	uint64_t r = tr_rng_u64(key, counter);
	int32_t sum = (int32_t)(r & 0xffff) + (int32_t)((r >> 16) & 0xffff) + (int32_t)((r >> 32) & 0xffff) +
		      (int32_t)(r >> 48);
	return (float)(sum - 131070) * 0x1.bb67ae8584caap-16f; /* sqrt(3) / 65536 */
}

static float center_value(uint64_t ckey, int j)
{
	return 2.0f * tr_rng_uniform(ckey, (uint64_t)j) - 1.0f;
}

static void sleep_us(int64_t us)
{
	struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000};

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

/* load_cost_us this thread owes but has not slept yet.  A sleep per sample
 * of a few hundred microseconds measured the scheduler more than storage:
 * each wake-up preempts a compute thread, and on a small machine the ~250
 * wake-ups of a batch slowed every step by ~10%.  So the cost accumulates
 * and is slept once it reaches a slice, and whatever is left at the end of
 * a run of samples (tr_data_pay_deferred_wait, called by the prefetch
 * loaders after each row range): a range is ready no sooner than its
 * samples' full cost, and a cancel is still noticed within a slice. */
enum { WAIT_SLICE_US = 20000 };
static _Thread_local int64_t owed_us;

void tr_data_pay_deferred_wait(void)
{
	if (owed_us > 0)
		sleep_us(owed_us);
	owed_us = 0;
}

/* y = W x + noise, each target summed in double over the features in
 * order.  W lies transposed ([features, outputs]) so that a block of
 * outputs is summed side by side: each target's sum is the same sequence
 * of the same operations as one dot product at a time (the same bits),
 * but the block's independent sums vectorise and do not wait on each
 * other's additions.  The product and the sum are two statements, and
 * the build is ISO C, so no compiler fuses them into one rounding (an
 * FMA) on the clones for CPUs that have one.  One dot product at a time,
 * VDSR-sized targets (1,681 x 1,681) took ~78 ms of CPU time a batch of
 * 32 (a quarter of a training step, taken from the cores the step runs
 * on); in blocks of 64, ~13 ms with AVX-512, ~17 ms with AVX2 (measured
 * on a loaded machine; the baseline x86-64 clone, short of registers for
 * 64 sums, is the slowest). */
enum { TARGET_BLOCK = 64 };

/* Not under ThreadSanitizer: the clones' resolver runs while the dynamic
 * linker relocates the program, before TSan's runtime is up, and TSan's
 * instrumentation of it crashed every TSan binary at start-up. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__SANITIZE_THREAD__)
#define VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define VECTOR_CLONES
#endif

static VECTOR_CLONES void synth_targets(const struct synth_reader *s, uint64_t key, const float *x, float *y)
{
	int nf = s->base.info.features, no = s->base.info.label_dim;

	for (int o0 = 0; o0 < no; o0 += TARGET_BLOCK) {
		int nb = no - o0 < TARGET_BLOCK ? no - o0 : TARGET_BLOCK;
		double acc[TARGET_BLOCK] = {0};

		for (int j = 0; j < nf; j++) {
			const float *wj = s->w + (size_t)j * (size_t)no + (size_t)o0;
			double xj = x[j];

			for (int k = 0; k < nb; k++) {
				double p = (double)wj[k] * xj;
				acc[k] += p;
			}
		}
		for (int k = 0; k < nb; k++)
			y[o0 + k] = (float)acc[k] + s->noise * noise_normal(key, 1 + (uint64_t)nf + (uint64_t)(o0 + k));
	}
}

static int synth_get(tr_reader_t *r, int64_t index, float *x, float *y, struct tr_error *err)
{
	struct synth_reader *s = (struct synth_reader *)r;
	int nf = r->info.features;
	uint64_t key;

	if (index < 0 || index >= r->info.samples) {
		tr_error_set(err, 0, 0, NULL, "%s: sample %lld out of range (%lld samples)", r->name, (long long)index,
			     (long long)r->info.samples);
		return -ERANGE;
	}
	if (s->load_cost_us > 0 && (owed_us += s->load_cost_us) >= WAIT_SLICE_US)
		tr_data_pay_deferred_wait();
	/* Counter 0 picks the class, 1..features the feature noise,
	 * features+1.. the target noise. */
	key = tr_rng_key(s->seed, (uint64_t)index, STREAM_SAMPLE, TR_RNG_SYNTH);
	if (s->task == TR_SYNTH_CLASSIFICATION) {
		uint64_t c = tr_rng_below(key, 0, (uint64_t)s->classes);
		const float noise = s->noise;

		if (s->centers) {
			const float *ctr = s->centers + (size_t)c * (size_t)nf;
			for (int j = 0; j < nf; j++)
				x[j] = ctr[j] + noise * noise_normal(key, 1 + (uint64_t)j);
		} else {
			uint64_t ckey = tr_rng_key(s->seed, c, STREAM_CENTER, TR_RNG_SYNTH);
			for (int j = 0; j < nf; j++)
				x[j] = center_value(ckey, j) + noise * noise_normal(key, 1 + (uint64_t)j);
		}
		y[0] = (float)c;
	} else {
		for (int j = 0; j < nf; j++)
			x[j] = noise_normal(key, 1 + (uint64_t)j);
		synth_targets(s, key, x, y);
	}
	return 0;
}

static int init_centers(struct synth_reader *s)
{
	int nf = s->base.info.features;

	s->centers = malloc((size_t)s->classes * (size_t)nf * sizeof(float));
	if (!s->centers)
		return -ENOMEM;
	for (int c = 0; c < s->classes; c++) {
		uint64_t ckey = tr_rng_key(s->seed, (uint64_t)c, STREAM_CENTER, TR_RNG_SYNTH);
		for (int j = 0; j < nf; j++)
			s->centers[(size_t)c * (size_t)nf + (size_t)j] = center_value(ckey, j);
	}
	return 0;
}

static void synth_destroy(tr_reader_t *r)
{
	struct synth_reader *s = (struct synth_reader *)r;

	free(s->w);
	free(s->centers);
	free(s);
}

static const struct tr_reader_i synth_i = {
	.get = synth_get,
	.destroy = synth_destroy,
};

int tr_synthetic_open(const struct tr_source_spec *src, uint64_t seed, tr_reader_t **out, struct tr_error *err)
{
	struct synth_reader *s;
	int outputs = src->outputs > 0 ? src->outputs : 1;

	if (src->samples <= 0 || src->features <= 0) {
		tr_error_set(err, 0, 0, NULL, "synthetic: samples (%lld) and features (%d) must be > 0",
			     (long long)src->samples, src->features);
		return -EINVAL;
	}
	if (src->task == TR_SYNTH_CLASSIFICATION && src->classes <= 0) {
		tr_error_set(err, 0, 0, NULL, "synthetic: classes (%d) must be > 0", src->classes);
		return -EINVAL;
	}
	if (src->task != TR_SYNTH_CLASSIFICATION && src->task != TR_SYNTH_REGRESSION) {
		tr_error_set(err, 0, 0, NULL, "synthetic: unknown task %d", (int)src->task);
		return -EINVAL;
	}
	if (!(src->noise >= 0.0f) || !isfinite(src->noise) || src->load_cost_us < 0 || src->outputs < 0 ||
	    src->load_cost_us > TR_SPEC_MAX_LOAD_COST_US) {
		tr_error_set(err, 0, 0, NULL,
			     "synthetic: noise, outputs and load_cost_us must be >= 0, load_cost_us at most %d",
			     TR_SPEC_MAX_LOAD_COST_US);
		return -EINVAL;
	}
	if (src->task == TR_SYNTH_REGRESSION &&
	    (size_t)outputs * (size_t)src->features > (size_t)TR_SPEC_MAX_SYNTH_WEIGHTS) {
		tr_error_set(err, 0, 0, NULL, "synthetic: outputs x features (%d x %d) is too large", outputs,
			     src->features);
		return -EINVAL;
	}
	s = calloc(1, sizeof(*s));
	if (!s)
		goto oom;
	s->base.i = &synth_i;
	s->base.info.samples = src->samples;
	s->base.info.features = src->features;
	s->base.info.label_dim = src->task == TR_SYNTH_CLASSIFICATION ? 1 : outputs;
	snprintf(s->base.name, sizeof(s->base.name), "synthetic");
	s->task = src->task;
	s->seed = seed;
	s->classes = src->classes;
	s->noise = src->noise;
	s->load_cost_us = src->load_cost_us;
	if (s->task == TR_SYNTH_CLASSIFICATION && (size_t)s->classes * (size_t)src->features <= MAX_CENTER_FLOATS &&
	    init_centers(s) < 0)
		goto oom;
	if (s->task == TR_SYNTH_REGRESSION) {
		size_t nw = (size_t)outputs * (size_t)src->features;
		/* 1/sqrt(features) keeps each target's variance near 1
		 * whatever the width, so default learning rates work. */
		float gain = 1.0f / sqrtf((float)src->features);
		uint64_t wkey = tr_rng_key(seed, 0, STREAM_WEIGHT, TR_RNG_SYNTH);

		s->w = malloc(nw * sizeof(float));
		if (!s->w)
			goto oom;
		/* draw i is W[o][j] with i = o * features + j, stored at [j][o] */
		for (size_t i = 0; i < nw; i++)
			s->w[i % (size_t)src->features * (size_t)outputs + i / (size_t)src->features] =
				gain * tr_rng_normal(wkey, i);
	}
	*out = &s->base;
	return 0;
oom:
	if (s)
		synth_destroy(&s->base);
	tr_error_set(err, 0, 0, NULL, "synthetic: out of memory");
	return -ENOMEM;
}
