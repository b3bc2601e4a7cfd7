/* The experiments' driver (docs/experiments.md): one thread that, for
 * every experiment that has not ended, turns what its trial jobs did into
 * the searcher's reports, asks the searcher (core/searcher.h) what to do
 * and does it: submits trials as jobs, resumes promoted ones, ends the
 * experiment.  Everything it knows is in the store, so a restarted daemon
 * continues where the last one stopped.  It also implements the API's
 * experiment operations.
 */
#ifndef TR_DAEMON_EXPERIMENTS_H
#define TR_DAEMON_EXPERIMENTS_H

#include "api/api.h"
#include "daemon/scheduler.h"

typedef struct tr_experiments tr_experiments_t;

/* Starts the driver for the scheduler's store and queue.  NULL with err
 * filled. */
tr_experiments_t *tr_experiments_start(tr_scheduler_t *sched, struct tr_error *err);
/* Fills the experiment_* operations of ops (their ctx is the
 * scheduler's, as for every op). */
void tr_experiments_api_ops(struct tr_api_ops *ops);
/* Stops and joins the driver (before the scheduler shuts down, so that
 * trials interrupted by the shutdown are not taken for ended ones).
 * Accepts NULL. */
void tr_experiments_stop(tr_experiments_t *x);

#endif
