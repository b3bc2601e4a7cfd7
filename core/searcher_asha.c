/* The searcher's decisions (core/searcher.h): asynchronous successive
 * halving, with grid and random as its one-rung case.  Everything is
 * computed from the reports and promotions passed in; sizes are bounded by
 * max_trials (at most 1000 trials x 32 rungs), so the quadratic scans
 * stay small and need no allocation beyond one ranking.
 */
#include "core/searcher.h"

#include <math.h>
#include <stdlib.h>

/* A trial's latest report at a rung, or NULL. */
static const struct tr_search_report *report_at(const struct tr_search_state *st, int trial, int rung)
{
	const struct tr_search_report *found = NULL;

	for (int i = 0; i < st->nreports; i++)
		if (st->reports[i].trial == trial && st->reports[i].rung == rung)
			found = &st->reports[i];
	return found;
}

static bool valid(const struct tr_search_report *r)
{
	return r && !r->failed && !isnan(r->metric);
}

static bool promoted(const struct tr_search_state *st, int trial, int rung)
{
	for (int i = 0; i < st->npromotions; i++)
		if (st->promotions[i].trial == trial && st->promotions[i].rung == rung)
			return true;
	return false;
}

/* Whether report a ranks before report b. */
static bool ranks_before(const struct tr_search_config *cfg, const struct tr_search_report *a,
			 const struct tr_search_report *b)
{
	bool va = valid(a), vb = valid(b);

	if (va != vb)
		return va;
	if (va && a->metric != b->metric)
		return cfg->maximize ? a->metric > b->metric : a->metric < b->metric;
	return a->trial < b->trial;
}

int tr_search_rank(const struct tr_search_config *cfg, const struct tr_search_state *st, int rung, int *out, int max)
{
	int n = 0;

	/* One entry per trial: its latest report at the rung. */
	for (int i = 0; i < st->nreports && n < max; i++) {
		const struct tr_search_report *r = &st->reports[i];
		bool seen = false;

		if (r->rung != rung || report_at(st, r->trial, rung) != r)
			continue;
		for (int j = 0; j < n; j++)
			seen |= out[j] == r->trial;
		if (seen)
			continue;
		/* Insertion sort: n is at most max_trials. */
		int at = n++;
		while (at > 0 && ranks_before(cfg, r, report_at(st, out[at - 1], rung))) {
			out[at] = out[at - 1];
			at--;
		}
		out[at] = r->trial;
	}
	return n;
}

/* The best trial of `rung` that reported a metric and was not promoted
 * from it, among the first `top` ranked; -1 when none. */
static int promotable(const struct tr_search_config *cfg, const struct tr_search_state *st, int rung, bool quota,
		      int *ranked)
{
	int n = tr_search_rank(cfg, st, rung, ranked, cfg->max_trials);
	int top = quota ? n / cfg->reduction_factor : n;

	for (int i = 0; i < top; i++)
		if (valid(report_at(st, ranked[i], rung)) && !promoted(st, ranked[i], rung))
			return ranked[i];
	return -1;
}

static bool top_rung_reported(const struct tr_search_config *cfg, const struct tr_search_state *st)
{
	for (int i = 0; i < st->nreports; i++)
		if (st->reports[i].rung == cfg->nrungs - 1 && valid(&st->reports[i]))
			return true;
	return false;
}

static struct tr_search_decision decide(const struct tr_search_config *cfg, const struct tr_search_state *st,
					int *ranked)
{
	/* Rungs from the top down: the further a trial has come, the
	 * sooner its devices' time pays off. */
	for (int k = cfg->nrungs - 2; k >= 0; k--) {
		int t = promotable(cfg, st, k, true, ranked);
		if (t >= 0)
			return (struct tr_search_decision){TR_SEARCH_PROMOTE, t, k};
	}
	if (st->started < cfg->max_trials)
		return (struct tr_search_decision){TR_SEARCH_START, st->started, 0};
	/* Everything started and settled, and no trial reached the last
	 * rung (trial counts that are not a power of r can leave it empty):
	 * the best waiting trial of the highest rung goes on, so the best
	 * result is a full-length one. */
	if (st->active == 0 && !top_rung_reported(cfg, st)) {
		for (int k = cfg->nrungs - 2; k >= 0; k--) {
			int t = promotable(cfg, st, k, false, ranked);
			if (t >= 0)
				return (struct tr_search_decision){TR_SEARCH_PROMOTE, t, k};
		}
	}
	if (st->active == 0)
		return (struct tr_search_decision){TR_SEARCH_DONE, -1, -1};
	return (struct tr_search_decision){TR_SEARCH_WAIT, -1, -1};
}

struct tr_search_decision tr_search_next(const struct tr_search_config *cfg, const struct tr_search_state *st,
					 bool slot_free)
{
	struct tr_search_decision d = {TR_SEARCH_WAIT, -1, -1};
	int *ranked = calloc(cfg->max_trials > 0 ? (size_t)cfg->max_trials : 1, sizeof *ranked);

	if (!ranked)
		return d; /* asked again on the driver's next round */
	d = decide(cfg, st, ranked);
	free(ranked);
	if (!slot_free && (d.action == TR_SEARCH_START || d.action == TR_SEARCH_PROMOTE))
		return (struct tr_search_decision){TR_SEARCH_WAIT, -1, -1};
	return d;
}

int tr_search_best(const struct tr_search_config *cfg, const struct tr_search_state *st, int *rung)
{
	int *ranked = calloc(cfg->max_trials > 0 ? (size_t)cfg->max_trials : 1, sizeof *ranked);
	int best = -1;

	for (int k = cfg->nrungs - 1; ranked && k >= 0 && best < 0; k--) {
		int n = tr_search_rank(cfg, st, k, ranked, cfg->max_trials);
		if (n > 0 && valid(report_at(st, ranked[0], k))) {
			best = ranked[0];
			if (rung)
				*rung = k;
		}
	}
	free(ranked);
	return best;
}

int tr_search_rungs(int64_t max_length, int64_t min_length, int reduction_factor, int64_t *out)
{
	int k = 1;
	int64_t len = max_length;

	if (min_length < 1)
		min_length = 1;
	/* Count rungs top down: each one r times shorter, down to min_length. */
	while (k < TR_SEARCH_MAX_RUNGS && len / reduction_factor >= min_length) {
		len /= reduction_factor;
		k++;
	}
	len = max_length;
	for (int i = k - 1; i >= 0; i--) {
		out[i] = len > 0 ? len : 1;
		len /= reduction_factor;
	}
	return k;
}

int64_t tr_search_default_min_length(int64_t max_length, int reduction_factor, int max_trials)
{
	int64_t len = max_length, n = 1;

	while (n * reduction_factor <= max_trials && len / reduction_factor >= 1) {
		n *= reduction_factor;
		len /= reduction_factor;
	}
	return len;
}

/* splitmix64's finalizer: a bijective mix of 64 bits. */
static uint64_t mix(uint64_t z)
{
	z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
	return z ^ (z >> 31);
}

double tr_search_uniform(uint64_t seed, int trial, const char *key)
{
	/* FNV-1a of the key, then the counters mixed in one at a time. */
	uint64_t h = UINT64_C(0xcbf29ce484222325);

	for (const unsigned char *p = (const unsigned char *)key; *p; p++)
		h = (h ^ *p) * UINT64_C(0x100000001b3);
	h = mix(h ^ mix(seed ^ mix((uint64_t)(uint32_t)trial + UINT64_C(0x9e3779b97f4a7c15))));
	return (double)(h >> 11) * 0x1.0p-53;
}
