/* Early stopping: the bookkeeping behind the spec's "early_stopping".
 *
 * At each evaluation the trainer hands the monitored value to
 * tr_early_stop_update, which says whether it improved on the best so far
 * (the trainer then takes a checkpoint marked best) and whether `patience`
 * evaluations in a row have gone by without one (the trainer then stops
 * gracefully).  Improvement follows Keras' EarlyStopping: in mode min a
 * value counts when it is below best - min_delta, in mode max when it is
 * above best + min_delta; the first finite value always counts; a NaN or
 * infinite value never does.  Kept apart from the trainer so the rules are
 * unit-tested without a model (docs/design.md, "Monitors").
 */
#ifndef TR_EARLY_STOP_H
#define TR_EARLY_STOP_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/spec.h"

struct tr_early_stop {
	bool max;         /* mode "max" */
	int patience;     /* evaluations without improvement before stopping */
	double min_delta; /* >= 0 */
	bool have_best;
	double best; /* the best value so far (valid when have_best) */
	int64_t best_step;
	int bad; /* evaluations since the last improvement */
};

enum tr_early_stop_verdict {
	TR_ES_IMPROVED, /* a new best: checkpoint it */
	TR_ES_WAIT,     /* no improvement, patience left */
	TR_ES_STOP,     /* no improvement for `patience` evaluations */
};

/* Initialises es from the spec's early_stopping section (caller memory). */
void tr_early_stop_init(struct tr_early_stop *es, const struct tr_early_stop_spec *spec);

/* Records the evaluation at `step` with `value`. */
enum tr_early_stop_verdict tr_early_stop_update(struct tr_early_stop *es, double value, int64_t step);

#endif
