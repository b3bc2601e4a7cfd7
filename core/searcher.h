/* The experiment searcher (docs/experiments.md): which trial to start,
 * promote or stop next, as a pure function of what the trials reported.
 *
 * grid and random are the one-rung case of ASHA: every trial trains to
 * its full length and reports once; the searcher only starts trials.
 * For asha, trials report at every rung; whenever a slot is free the
 * searcher looks at the rungs from the top down and promotes a trial
 * that is among the best floor(n_k / r) of rung k and was not promoted
 * yet, else starts a new trial (asynchronous successive halving, Li et
 * al. 2018).  Nothing here keeps state: the daemon stores the reports and
 * the promotions, in order, and asks again; a restart asks the same
 * question and gets the same answer.
 */
#ifndef TR_CORE_SEARCHER_H
#define TR_CORE_SEARCHER_H

#include <stdbool.h>
#include <stdint.h>

#define TR_SEARCH_MAX_RUNGS 32

struct tr_search_config {
	int max_trials;       /* >= 1 */
	int reduction_factor; /* >= 2 */
	int nrungs;           /* 1 for grid and random */
	bool maximize;        /* goal "max" */
};

/* Trial `trial` reached rung `rung` and reported `metric`; or it failed
 * while training towards `rung` (failed: it counts in that rung as the
 * worst, and is never promoted).  A NaN metric ranks with failures. */
struct tr_search_report {
	int trial;
	int rung;
	double metric;
	bool failed;
};

/* Trial `trial` was promoted from rung `rung` to the next. */
struct tr_search_promotion {
	int trial;
	int rung;
};

struct tr_search_state {
	const struct tr_search_report *reports; /* in arrival order */
	int nreports;
	const struct tr_search_promotion *promotions;
	int npromotions;
	int started; /* trials started so far: 0 .. max_trials (trial ids 0 .. started-1) */
	int active;  /* trials training now (queued or running, not waiting at a rung) */
};

enum tr_search_action {
	TR_SEARCH_WAIT,    /* nothing to do until a trial reports */
	TR_SEARCH_START,   /* start trial `trial` (= started) */
	TR_SEARCH_PROMOTE, /* promote `trial` from `rung` to rung + 1 */
	TR_SEARCH_DONE,    /* the search is over */
};

struct tr_search_decision {
	enum tr_search_action action;
	int trial;
	int rung;
};

/* What to do with one free slot.  Without a free slot call it anyway
 * to learn whether the search is DONE: pass slot_free = false and only
 * WAIT or DONE come back. */
struct tr_search_decision tr_search_next(const struct tr_search_config *cfg, const struct tr_search_state *st,
					 bool slot_free);

/* The trials that reported at `rung` ranked best first (ties by trial
 * index, failed and NaN last, by index): fills out[0..n) with trial ids
 * and returns n (at most max).  A trial's latest report at a rung counts. */
int tr_search_rank(const struct tr_search_config *cfg, const struct tr_search_state *st, int rung, int *out, int max);

/* The best trial: the first of the highest rung with a trial that
 * reported a (non-NaN) metric; -1 when none has.  *rung gets that rung. */
int tr_search_best(const struct tr_search_config *cfg, const struct tr_search_state *st, int *rung);

/* Rung lengths for asha: K = 1 + floor(log_r(max_length / min_length))
 * rungs, rung k = max_length / r^(K-1-k) (at least 1).  Fills
 * out[0..K) and returns K (capped at TR_SEARCH_MAX_RUNGS). */
int tr_search_rungs(int64_t max_length, int64_t min_length, int reduction_factor, int64_t *out);

/* The default min_length: max_length / r^k for the largest k with r^k <=
 * max_trials and a result >= 1. */
int64_t tr_search_default_min_length(int64_t max_length, int reduction_factor, int max_trials);

/* A uniform number in [0, 1) that depends only on (seed, trial, key):
 * the sampled value of parameter `key` for a trial (a counter-based
 * hash, so no trial's values depend on another's or on order). */
double tr_search_uniform(uint64_t seed, int trial, const char *key);

#endif
