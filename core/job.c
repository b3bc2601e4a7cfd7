/* The job's states, requests and transition table (core/job.h).  The
 * table is the one place that says which request is legal in which
 * state; refusals are worded from it, so a message never disagrees with
 * what the daemon does. */
#include "core/job.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *const tr_job_state_names[TR_JOB_NSTATES + 1] = {
	[TR_JOB_QUEUED] = "queued",       [TR_JOB_RUNNING] = "running",     [TR_JOB_STOPPING] = "stopping",
	[TR_JOB_PAUSED] = "paused",       [TR_JOB_STOPPED] = "stopped",     [TR_JOB_COMPLETED] = "completed",
	[TR_JOB_FAILED] = "failed",       [TR_JOB_CANCELLED] = "cancelled", [TR_JOB_INTERRUPTED] = "interrupted",
	[TR_JOB_PREEMPTED] = "preempted", [TR_JOB_NSTATES] = NULL,
};

static const char *const request_names[TR_JOB_NREQUESTS] = {
	[TR_JOB_CANCEL] = "cancel",         [TR_JOB_STOP] = "stop",
	[TR_JOB_PAUSE] = "pause",           [TR_JOB_RESUME] = "resume",
	[TR_JOB_SET_PRIORITY] = "priority", [TR_JOB_DELETE] = "delete",
	[TR_JOB_CHECKPOINT] = "checkpoint",
};

/* What a refusal says the job cannot do ("only a paused job can ..."). */
static const char *const request_phrase[TR_JOB_NREQUESTS] = {
	[TR_JOB_CANCEL] = "be cancelled",
	[TR_JOB_STOP] = "be stopped",
	[TR_JOB_PAUSE] = "be paused",
	[TR_JOB_RESUME] = "be resumed",
	[TR_JOB_SET_PRIORITY] = "change its priority",
	[TR_JOB_DELETE] = "be deleted (cancel it first)",
	[TR_JOB_CHECKPOINT] = "take a checkpoint",
};

/* clang-format off */
#define R {TR_JOB_REFUSE, 0}
#define K(s) {TR_JOB_KEEP, TR_JOB_##s}
#define SET(s) {TR_JOB_SET, TR_JOB_##s}
#define SIG(s) {TR_JOB_SIGNAL, TR_JOB_##s}

/* Rows: states; columns: cancel, stop, pause, resume, priority, delete,
 * checkpoint.  Why the less obvious cells are so:
 * - stop before a job ran (queued, interrupted) has nothing to wind down
 *   and no checkpoint to keep: it cancels;
 * - a paused job is already at rest with its checkpoint: stop and pause
 *   are refused, cancel ends it;
 * - stopped and paused jobs resume the same way (queued again, continuing
 *   from their newest checkpoint); a stopped one may be given more steps;
 * - a stopped job's priority still matters, since it may run again;
 * - a repeated stop while stopping is accepted and changes nothing;
 * - a preempted job waits in the queue like an interrupted one: cancel or
 *   stop end it, pause takes it out of the queue (resume puts it back). */
static const struct tr_job_transition table[TR_JOB_NSTATES][TR_JOB_NREQUESTS] = {
	/*                     cancel          stop             pause          resume       prio         delete       ckpt */
	[TR_JOB_QUEUED]      = {SET(CANCELLED), SET(CANCELLED), SET(PAUSED),   R,           K(QUEUED),   R,           R},
	[TR_JOB_RUNNING]     = {SIG(RUNNING),   SIG(STOPPING),  SIG(RUNNING),  R,           K(RUNNING),  R,           SIG(RUNNING)},
	[TR_JOB_STOPPING]    = {SIG(STOPPING),  K(STOPPING),    SIG(STOPPING), R,           K(STOPPING), R,           SIG(STOPPING)},
	[TR_JOB_PAUSED]      = {SET(CANCELLED), R,              R,             SET(QUEUED), K(PAUSED),   R,           R},
	[TR_JOB_STOPPED]     = {R,              R,              R,             SET(QUEUED), K(STOPPED),  K(STOPPED),  R},
	[TR_JOB_COMPLETED]   = {R,              R,              R,             R,           R,           K(COMPLETED), R},
	[TR_JOB_FAILED]      = {R,              R,              R,             R,           R,           K(FAILED),   R},
	[TR_JOB_CANCELLED]   = {R,              R,              R,             R,           R,           K(CANCELLED), R},
	[TR_JOB_INTERRUPTED] = {SET(CANCELLED), SET(CANCELLED), SET(PAUSED),   R,           K(INTERRUPTED), R,        R},
	[TR_JOB_PREEMPTED]   = {SET(CANCELLED), SET(CANCELLED), SET(PAUSED),   R,           K(PREEMPTED), R,          R},
};
/* clang-format on */

#undef R
#undef K
#undef SET
#undef SIG

const char *tr_job_state_name(enum tr_job_state state)
{
	return (unsigned)state < TR_JOB_NSTATES ? tr_job_state_names[state] : NULL;
}

int tr_job_state_parse(const char *name)
{
	for (int i = 0; name && i < TR_JOB_NSTATES; i++)
		if (strcmp(tr_job_state_names[i], name) == 0)
			return i;
	return -1;
}

const char *tr_job_state_list(void)
{
	/* Kept equal to tr_job_state_names by a unit test (tests/unit/core). */
	return "queued, running, stopping, paused, stopped, completed, failed, cancelled, interrupted, preempted";
}

bool tr_job_state_terminal(enum tr_job_state state)
{
	return state == TR_JOB_STOPPED || state == TR_JOB_COMPLETED || state == TR_JOB_FAILED ||
	       state == TR_JOB_CANCELLED;
}

bool tr_job_state_name_terminal(const char *name)
{
	int s = tr_job_state_parse(name);
	return s >= 0 && tr_job_state_terminal((enum tr_job_state)s);
}

const char *tr_job_request_name(enum tr_job_request req)
{
	return (unsigned)req < TR_JOB_NREQUESTS ? request_names[req] : NULL;
}

struct tr_job_transition tr_job_transition(enum tr_job_state state, enum tr_job_request req)
{
	if ((unsigned)state >= TR_JOB_NSTATES || (unsigned)req >= TR_JOB_NREQUESTS)
		return (struct tr_job_transition){TR_JOB_REFUSE, 0};
	return table[state][req];
}

int tr_job_fail(struct tr_error *e, enum tr_job_err kind, const char *pointer, const char *fmt, ...)
{
	if (!e)
		return -1;
	va_list ap;
	e->kind = (int)kind;
	snprintf(e->pointer, sizeof e->pointer, "%s", pointer ? pointer : "");
	va_start(ap, fmt);
	vsnprintf(e->message, sizeof e->message, fmt, ap);
	va_end(ap);
	tr_error_escape_controls(e->message, sizeof e->message);
	return -1;
}

int tr_job_check(int64_t id, enum tr_job_state state, enum tr_job_request req, struct tr_job_transition *out,
		 struct tr_error *e)
{
	if ((unsigned)state >= TR_JOB_NSTATES || (unsigned)req >= TR_JOB_NREQUESTS) {
		tr_job_fail(e, TR_JOB_E_INTERNAL, NULL, "job %lld: no state %d or request %d", (long long)id,
			    (int)state, (int)req);
		return -EINVAL;
	}
	struct tr_job_transition t = table[state][req];
	if (out)
		*out = t;
	if (t.action != TR_JOB_REFUSE)
		return 0;
	/* "only a queued, running or paused job can be cancelled" */
	const char *legal[TR_JOB_NSTATES];
	int n = 0;
	for (int i = 0; i < TR_JOB_NSTATES; i++)
		if (table[i][req].action != TR_JOB_REFUSE)
			legal[n++] = tr_job_state_names[i];
	char list[192];
	size_t used = 0;
	list[0] = '\0';
	for (int i = 0; i < n; i++)
		used += (size_t)snprintf(list + used, sizeof list - used, "%s%s",
					 i == 0       ? ""
					 : i == n - 1 ? " or "
						      : ", ",
					 legal[i]);
	/* A finished job's weights are kept: say how to train on from them. */
	char hint[160] = "";
	if (req == TR_JOB_RESUME && state == TR_JOB_COMPLETED)
		snprintf(hint, sizeof hint,
			 "; to train it further, submit a new job with \"init\": {\"from\": {\"job\": %lld, "
			 "\"step\": \"latest\"}}",
			 (long long)id);
	tr_job_fail(e, TR_JOB_E_ILLEGAL, NULL, "job %lld is %s; only a%s %s job can %s%s", (long long)id,
		    tr_job_state_names[state], n > 0 && strchr("aeiou", list[0]) ? "n" : "", list, request_phrase[req],
		    hint);
	return -EBUSY;
}
