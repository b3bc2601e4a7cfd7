/* The searcher (core/searcher.h) against hand-computed ASHA rungs:
 * quotas of floor(n_k / r), early (asynchronous) promotions, ties by trial
 * index, failed and NaN trials, the finishing promotion, grid/random as
 * one rung, rung lengths, and the seeded sampling. */
#include <criterion/criterion.h>
#include <math.h>

#include "core/searcher.h"

#define MAXR 64

struct sim {
	struct tr_search_config cfg;
	struct tr_search_report reports[MAXR];
	struct tr_search_promotion promotions[MAXR];
	struct tr_search_state st;
};

static void sim_init(struct sim *s, int max_trials, int r, int nrungs)
{
	*s = (struct sim){.cfg = {.max_trials = max_trials, .reduction_factor = r, .nrungs = nrungs}};
	s->st.reports = s->reports;
	s->st.promotions = s->promotions;
}

static void report(struct sim *s, int trial, int rung, double metric)
{
	cr_assert_lt(s->st.nreports, MAXR);
	s->reports[s->st.nreports++] = (struct tr_search_report){trial, rung, metric, false};
}

static void fail(struct sim *s, int trial, int rung)
{
	s->reports[s->st.nreports++] = (struct tr_search_report){trial, rung, NAN, true};
}

/* Asks for one decision with a free slot and applies it to the state. */
static struct tr_search_decision step(struct sim *s)
{
	struct tr_search_decision d = tr_search_next(&s->cfg, &s->st, true);
	if (d.action == TR_SEARCH_PROMOTE)
		s->promotions[s->st.npromotions++] = (struct tr_search_promotion){d.trial, d.rung};
	if (d.action == TR_SEARCH_START)
		s->st.started++;
	return d;
}

static void expect(struct tr_search_decision d, enum tr_search_action a, int trial, int rung)
{
	cr_assert_eq(d.action, a, "action %d, want %d (trial %d rung %d)", d.action, a, d.trial, d.rung);
	if (a == TR_SEARCH_PROMOTE || a == TR_SEARCH_START)
		cr_assert_eq(d.trial, trial, "trial %d, want %d", d.trial, trial);
	if (a == TR_SEARCH_PROMOTE)
		cr_assert_eq(d.rung, rung, "rung %d, want %d", d.rung, rung);
}

Test(searcher, starts_trials_in_order_until_max)
{
	struct sim s;
	sim_init(&s, 3, 3, 3);
	for (int t = 0; t < 3; t++)
		expect(step(&s), TR_SEARCH_START, t, 0);
	s.st.active = 3;
	expect(step(&s), TR_SEARCH_WAIT, -1, -1);
}

/* 9 trials, r = 3: rung 0 keeps the best 3 (floor(9/3)), rung 1 the best
 * one (floor(3/3)), which trains to the last rung. */
Test(searcher, nine_trials_halve_by_three)
{
	static const double m0[9] = {.5, .3, .9, .1, .7, .2, .8, .4, .6};
	struct sim s;
	sim_init(&s, 9, 3, 3);
	s.st.started = 9;
	for (int t = 0; t < 9; t++)
		report(&s, t, 0, m0[t]);
	/* Ranked: 3 (.1), 5 (.2), 1 (.3), then 7, 0, 8, 4, 6, 2. */
	expect(step(&s), TR_SEARCH_PROMOTE, 3, 0);
	expect(step(&s), TR_SEARCH_PROMOTE, 5, 0);
	expect(step(&s), TR_SEARCH_PROMOTE, 1, 0);
	s.st.active = 3;
	expect(step(&s), TR_SEARCH_WAIT, -1, -1);
	report(&s, 3, 1, .05);
	report(&s, 5, 1, .15);
	s.st.active = 1;
	/* floor(2/3) = 0: nothing to promote from rung 1 yet. */
	expect(step(&s), TR_SEARCH_WAIT, -1, -1);
	report(&s, 1, 1, .02);
	s.st.active = 0;
	expect(step(&s), TR_SEARCH_PROMOTE, 1, 1);
	s.st.active = 1;
	expect(step(&s), TR_SEARCH_WAIT, -1, -1);
	report(&s, 1, 2, .01);
	s.st.active = 0;
	expect(step(&s), TR_SEARCH_DONE, -1, -1);
	int rung = -1;
	cr_assert_eq(tr_search_best(&s.cfg, &s.st, &rung), 1);
	cr_assert_eq(rung, 2);
	int ranked[9];
	cr_assert_eq(tr_search_rank(&s.cfg, &s.st, 0, ranked, 9), 9);
	static const int want[9] = {3, 5, 1, 7, 0, 8, 4, 6, 2};
	for (int i = 0; i < 9; i++)
		cr_assert_eq(ranked[i], want[i], "rank %d: trial %d, want %d", i, ranked[i], want[i]);
}

/* Asynchronous: after 3 reports of 9 the best of them goes on at once;
 * after 2 (floor(2/3) = 0) a new trial starts instead. */
Test(searcher, promotes_before_the_rung_is_full)
{
	struct sim s;
	sim_init(&s, 9, 3, 3);
	s.st.started = 3;
	report(&s, 0, 0, .5);
	report(&s, 1, 0, .3);
	expect(step(&s), TR_SEARCH_START, 3, 0);
	report(&s, 2, 0, .9);
	expect(step(&s), TR_SEARCH_PROMOTE, 1, 0);
	/* floor(3/3) = 1 and that one is promoted: start more. */
	expect(step(&s), TR_SEARCH_START, 4, 0);
	/* A fourth report, better than all: the quota is still floor(4/3) =
	 * 1, but the top one is now trial 3, not promoted yet: it goes on
	 * too (ASHA never takes a promotion back). */
	report(&s, 3, 0, .1);
	expect(step(&s), TR_SEARCH_PROMOTE, 3, 0);
}

Test(searcher, ties_rank_by_trial_index)
{
	struct sim s;
	sim_init(&s, 3, 3, 2);
	s.st.started = 3;
	report(&s, 2, 0, .5);
	report(&s, 1, 0, .5);
	report(&s, 0, 0, .5);
	expect(step(&s), TR_SEARCH_PROMOTE, 0, 0);
}

Test(searcher, goal_max_ranks_high_first)
{
	struct sim s;
	sim_init(&s, 3, 3, 2);
	s.cfg.maximize = true;
	s.st.started = 3;
	report(&s, 0, 0, .2);
	report(&s, 1, 0, .9);
	report(&s, 2, 0, .5);
	expect(step(&s), TR_SEARCH_PROMOTE, 1, 0);
}

/* A failed trial counts in its rung's n_k as the worst and is never
 * promoted; NaN ranks with failures. */
Test(searcher, failed_trials_count_but_never_go_on)
{
	struct sim s;
	sim_init(&s, 3, 3, 2);
	s.st.started = 3;
	s.st.active = 1;
	fail(&s, 0, 0);
	report(&s, 1, 0, NAN);
	expect(step(&s), TR_SEARCH_WAIT, -1, -1); /* 2 of 3 reported, quota 0, trial 2 active */
	report(&s, 2, 0, .7);
	expect(step(&s), TR_SEARCH_PROMOTE, 2, 0); /* quota floor(3/3) = 1: the only valid one */
	int ranked[3];
	cr_assert_eq(tr_search_rank(&s.cfg, &s.st, 0, ranked, 3), 3);
	cr_assert_eq(ranked[0], 2);
	cr_assert_eq(ranked[1], 0);
	cr_assert_eq(ranked[2], 1);
}

Test(searcher, all_failed_is_done_without_best)
{
	struct sim s;
	sim_init(&s, 2, 3, 2);
	s.st.started = 2;
	fail(&s, 0, 0);
	fail(&s, 1, 0);
	expect(step(&s), TR_SEARCH_DONE, -1, -1);
	cr_assert_eq(tr_search_best(&s.cfg, &s.st, NULL), -1);
}

/* 5 trials, r = 3: rung 0 promotes one (floor(5/3)); rung 1 holds one
 * trial (floor(1/3) = 0), so the finishing rule takes it to the end. */
Test(searcher, finishing_promotion_reaches_the_last_rung)
{
	struct sim s;
	sim_init(&s, 5, 3, 3);
	s.st.started = 5;
	static const double m0[5] = {.4, .2, .6, .3, .5};
	for (int t = 0; t < 5; t++)
		report(&s, t, 0, m0[t]);
	expect(step(&s), TR_SEARCH_PROMOTE, 1, 0);
	s.st.active = 1;
	expect(step(&s), TR_SEARCH_WAIT, -1, -1);
	report(&s, 1, 1, .1);
	s.st.active = 0;
	expect(step(&s), TR_SEARCH_PROMOTE, 1, 1);
	report(&s, 1, 2, .05);
	expect(step(&s), TR_SEARCH_DONE, -1, -1);
	/* The last rung filled, the runner-up of rung 0 is not taken on. */
	cr_assert_eq(s.st.npromotions, 2);
}

Test(searcher, no_free_slot_only_waits_or_ends)
{
	struct sim s;
	sim_init(&s, 2, 3, 1);
	struct tr_search_decision d = tr_search_next(&s.cfg, &s.st, false);
	cr_assert_eq(d.action, TR_SEARCH_WAIT);
	s.st.started = 2;
	report(&s, 0, 0, 1);
	report(&s, 1, 0, 2);
	d = tr_search_next(&s.cfg, &s.st, false);
	cr_assert_eq(d.action, TR_SEARCH_DONE);
}

/* grid and random: one rung, no promotions; best by metric. */
Test(searcher, one_rung_runs_every_trial_to_the_end)
{
	struct sim s;
	sim_init(&s, 4, 3, 1);
	for (int t = 0; t < 4; t++)
		expect(step(&s), TR_SEARCH_START, t, 0);
	s.st.active = 4;
	for (int t = 0; t < 4; t++) {
		report(&s, t, 0, 4 - t);
		s.st.active--;
		expect(step(&s), t < 3 ? TR_SEARCH_WAIT : TR_SEARCH_DONE, -1, -1);
	}
	cr_assert_eq(tr_search_best(&s.cfg, &s.st, NULL), 3);
}

Test(searcher, rung_lengths)
{
	int64_t out[TR_SEARCH_MAX_RUNGS];
	cr_assert_eq(tr_search_rungs(9, 1, 3, out), 3);
	cr_assert(out[0] == 1 && out[1] == 3 && out[2] == 9);
	cr_assert_eq(tr_search_rungs(100, 11, 3, out), 3);
	cr_assert(out[0] == 11 && out[1] == 33 && out[2] == 100);
	cr_assert_eq(tr_search_rungs(5, 5, 3, out), 1);
	cr_assert_eq(out[0], 5);
	cr_assert_eq(tr_search_rungs(64, 4, 2, out), 5);
	cr_assert(out[0] == 4 && out[4] == 64);
	cr_assert_eq(tr_search_default_min_length(9, 3, 9), 1);
	cr_assert_eq(tr_search_default_min_length(90, 3, 9), 10);
	cr_assert_eq(tr_search_default_min_length(90, 3, 8), 30);
	cr_assert_eq(tr_search_default_min_length(2, 3, 9), 2);
}

Test(searcher, sampling_is_a_pure_function_of_seed_trial_and_key)
{
	double a = tr_search_uniform(7, 3, "/optimizer/lr");
	cr_assert_eq(a, tr_search_uniform(7, 3, "/optimizer/lr"));
	cr_assert_neq(a, tr_search_uniform(8, 3, "/optimizer/lr"));
	cr_assert_neq(a, tr_search_uniform(7, 4, "/optimizer/lr"));
	cr_assert_neq(a, tr_search_uniform(7, 3, "/optimizer/momentum"));
	double sum = 0;
	for (int t = 0; t < 1000; t++) {
		double u = tr_search_uniform(1, t, "/x");
		cr_assert(u >= 0 && u < 1);
		sum += u;
	}
	cr_assert(fabs(sum / 1000 - 0.5) < 0.05, "mean %g", sum / 1000);
}
