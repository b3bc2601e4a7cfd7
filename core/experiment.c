/* Experiment states and their control table (core/experiment.h). */
#include "core/experiment.h"

#include <string.h>

static const char *const names[TR_EXP_NSTATES] = {
	[TR_EXP_QUEUED] = "queued",       [TR_EXP_RUNNING] = "running", [TR_EXP_PAUSED] = "paused",
	[TR_EXP_COMPLETED] = "completed", [TR_EXP_FAILED] = "failed",   [TR_EXP_CANCELLED] = "cancelled",
};

const char *tr_experiment_state_name(enum tr_experiment_state state)
{
	return (unsigned)state < TR_EXP_NSTATES ? names[state] : NULL;
}

int tr_experiment_state_parse(const char *name)
{
	for (int i = 0; name && i < TR_EXP_NSTATES; i++)
		if (strcmp(name, names[i]) == 0)
			return i;
	return -1;
}

const char *tr_experiment_state_list(void)
{
	return "queued, running, paused, completed, failed, cancelled";
}

bool tr_experiment_state_terminal(enum tr_experiment_state state)
{
	return state == TR_EXP_COMPLETED || state == TR_EXP_FAILED || state == TR_EXP_CANCELLED;
}

bool tr_experiment_request_legal(enum tr_experiment_state state, enum tr_job_request req)
{
	switch (req) {
	case TR_JOB_PAUSE:
		return state == TR_EXP_QUEUED || state == TR_EXP_RUNNING;
	case TR_JOB_RESUME:
		return state == TR_EXP_PAUSED;
	case TR_JOB_CANCEL:
		return !tr_experiment_state_terminal(state);
	default:
		return false;
	}
}
