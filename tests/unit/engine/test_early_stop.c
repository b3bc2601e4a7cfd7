/* Tests for early stopping's rules (engine/early_stop.c): improvement in
 * each mode, min_delta as a strict margin, patience counting that restarts
 * on every improvement, and non-finite values never counting. */
#include <criterion/criterion.h>
#include <math.h>

#include "engine/early_stop.h"

static struct tr_early_stop make(bool max, int patience, float min_delta)
{
	struct tr_early_stop_spec spec = {.enabled = true,
					  .mode_max = max,
					  .patience = patience,
					  .min_delta = min_delta};
	struct tr_early_stop es;

	tr_early_stop_init(&es, &spec);
	return es;
}

Test(early_stop, first_value_is_the_best)
{
	struct tr_early_stop es = make(false, 1, 0);

	cr_assert_eq(es.best_step, -1);
	cr_assert_eq(tr_early_stop_update(&es, 5.0, 10), TR_ES_IMPROVED);
	cr_assert(es.have_best);
	cr_assert_eq(es.best, 5.0);
	cr_assert_eq(es.best_step, 10);
}

Test(early_stop, min_mode_counts_patience_and_restarts_on_improvement)
{
	struct tr_early_stop es = make(false, 3, 0);

	cr_assert_eq(tr_early_stop_update(&es, 1.0, 1), TR_ES_IMPROVED);
	cr_assert_eq(tr_early_stop_update(&es, 1.0, 2), TR_ES_WAIT, "equal is no improvement");
	cr_assert_eq(tr_early_stop_update(&es, 1.5, 3), TR_ES_WAIT);
	cr_assert_eq(es.bad, 2);
	cr_assert_eq(tr_early_stop_update(&es, 0.9, 4), TR_ES_IMPROVED);
	cr_assert_eq(es.bad, 0);
	cr_assert_eq(es.best_step, 4);
	cr_assert_eq(tr_early_stop_update(&es, 2.0, 5), TR_ES_WAIT);
	cr_assert_eq(tr_early_stop_update(&es, 2.0, 6), TR_ES_WAIT);
	cr_assert_eq(tr_early_stop_update(&es, 2.0, 7), TR_ES_STOP, "the third evaluation without improvement");
	cr_assert_eq(es.best, 0.9);
	cr_assert_eq(es.best_step, 4);
}

Test(early_stop, max_mode_wants_higher_values)
{
	struct tr_early_stop es = make(true, 2, 0);

	cr_assert_eq(tr_early_stop_update(&es, 0.5, 1), TR_ES_IMPROVED);
	cr_assert_eq(tr_early_stop_update(&es, 0.4, 2), TR_ES_WAIT, "lower is worse in max mode");
	cr_assert_eq(tr_early_stop_update(&es, 0.6, 3), TR_ES_IMPROVED);
	cr_assert_eq(tr_early_stop_update(&es, 0.1, 4), TR_ES_WAIT);
	cr_assert_eq(tr_early_stop_update(&es, 0.6, 5), TR_ES_STOP);
	cr_assert_eq(es.best, 0.6);
	cr_assert_eq(es.best_step, 3);
}

Test(early_stop, min_delta_is_a_strict_margin)
{
	/* 0.25 and its multiples are exact in binary: no rounding at the edge. */
	struct tr_early_stop es = make(false, 10, 0.25f);

	cr_assert_eq(tr_early_stop_update(&es, 1.0, 1), TR_ES_IMPROVED);
	cr_assert_eq(tr_early_stop_update(&es, 0.8, 2), TR_ES_WAIT, "0.2 better is within min_delta");
	cr_assert_eq(tr_early_stop_update(&es, 0.75, 3), TR_ES_WAIT, "exactly min_delta better is not enough");
	cr_assert_eq(es.best, 1.0, "a value within min_delta does not become the best");
	cr_assert_eq(tr_early_stop_update(&es, 0.7, 4), TR_ES_IMPROVED);
	cr_assert_eq(es.best, 0.7);

	struct tr_early_stop up = make(true, 10, 0.25f);
	cr_assert_eq(tr_early_stop_update(&up, 1.0, 1), TR_ES_IMPROVED);
	cr_assert_eq(tr_early_stop_update(&up, 1.25, 2), TR_ES_WAIT);
	cr_assert_eq(tr_early_stop_update(&up, 1.5, 3), TR_ES_IMPROVED);
}

Test(early_stop, non_finite_values_never_improve)
{
	struct tr_early_stop es = make(false, 2, 0);

	cr_assert_eq(tr_early_stop_update(&es, NAN, 1), TR_ES_WAIT, "no best from a NaN");
	cr_assert(!es.have_best);
	cr_assert_eq(tr_early_stop_update(&es, 3.0, 2), TR_ES_IMPROVED);
	cr_assert_eq(tr_early_stop_update(&es, -INFINITY, 3), TR_ES_WAIT);
	cr_assert_eq(tr_early_stop_update(&es, NAN, 4), TR_ES_STOP);
	cr_assert_eq(es.best, 3.0);
}

Test(early_stop, patience_one_stops_at_the_first_miss)
{
	struct tr_early_stop es = make(false, 1, 0);

	cr_assert_eq(tr_early_stop_update(&es, 2.0, 1), TR_ES_IMPROVED);
	cr_assert_eq(tr_early_stop_update(&es, 1.0, 2), TR_ES_IMPROVED);
	cr_assert_eq(tr_early_stop_update(&es, 1.0, 3), TR_ES_STOP);
}
