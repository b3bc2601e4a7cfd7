/* The experiment's states (docs/experiments.md), named as the store keeps
 * them and the API shows them, and which control request is legal in
 * which state.  An experiment's trials are ordinary jobs (core/job.h).
 */
#ifndef TR_CORE_EXPERIMENT_H
#define TR_CORE_EXPERIMENT_H

#include <stdbool.h>

#include "core/job.h"

enum tr_experiment_state {
	TR_EXP_QUEUED,  /* no trial has started yet */
	TR_EXP_RUNNING, /* the searcher goes on */
	TR_EXP_PAUSED,  /* by request: its trials paused, no new one started */
	TR_EXP_COMPLETED,
	TR_EXP_FAILED,
	TR_EXP_CANCELLED,
	TR_EXP_NSTATES
};

/* "queued", ...; NULL out of range. */
const char *tr_experiment_state_name(enum tr_experiment_state state);
/* The state named `name`, or -1. */
int tr_experiment_state_parse(const char *name);
/* "queued, running, paused, completed, failed, cancelled", for messages. */
const char *tr_experiment_state_list(void);
/* completed, failed and cancelled are ends: nothing changes after them. */
bool tr_experiment_state_terminal(enum tr_experiment_state state);
/* Whether `req` (TR_JOB_PAUSE, _RESUME or _CANCEL) is legal in `state`:
 * pause from queued or running, resume from paused, cancel from any state
 * that is not an end. */
bool tr_experiment_request_legal(enum tr_experiment_state state, enum tr_job_request req);

#endif
