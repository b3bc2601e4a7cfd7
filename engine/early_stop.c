/* Early stopping rules (see engine/early_stop.h): improvement by more than
 * min_delta in the chosen direction, and patience counting. */
#include "engine/early_stop.h"

#include <math.h>
#include <string.h>

void tr_early_stop_init(struct tr_early_stop *es, const struct tr_early_stop_spec *spec)
{
	memset(es, 0, sizeof *es);
	es->max = spec->mode_max;
	es->patience = spec->patience;
	es->min_delta = spec->min_delta;
	es->best_step = -1;
}

static bool improves(const struct tr_early_stop *es, double value)
{
	if (!isfinite(value))
		return false;
	if (!es->have_best)
		return true;
	return es->max ? value > es->best + es->min_delta : value < es->best - es->min_delta;
}

enum tr_early_stop_verdict tr_early_stop_update(struct tr_early_stop *es, double value, int64_t step)
{
	if (improves(es, value)) {
		es->have_best = true;
		es->best = value;
		es->best_step = step;
		es->bad = 0;
		return TR_ES_IMPROVED;
	}
	es->bad++;
	return es->bad >= es->patience ? TR_ES_STOP : TR_ES_WAIT;
}
