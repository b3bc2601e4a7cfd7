/* The job: its states, the requests a client makes of it, which request
 * is legal in which state, and the domain errors of job operations
 * (docs/design.md, "The job").
 *
 * Everything that asks "is this job finished?", "may it be paused now?"
 * or "which states exist?" asks here: the store (finished_at stamps), the
 * API (state filters, live progress, the HTTP status of a refusal), the
 * daemon's operations and runner, and trainctl.  The store keeps a state
 * as its name (tr_job_state_name), so names are a contract: the API shows
 * them, databases hold them.
 */
#ifndef TR_CORE_JOB_H
#define TR_CORE_JOB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

enum tr_job_state {
	TR_JOB_QUEUED, /* waiting for devices */
	TR_JOB_RUNNING,
	TR_JOB_STOPPING,  /* a stop was asked; the final checkpoint is being taken */
	TR_JOB_PAUSED,    /* out of the queue until resumed; continues from its checkpoint */
	TR_JOB_STOPPED,   /* ended by a stop request before its end; resumable, with more steps too */
	TR_JOB_COMPLETED, /* ran to its end (max_steps, epochs or early stopping) */
	TR_JOB_FAILED,
	TR_JOB_CANCELLED,
	TR_JOB_INTERRUPTED, /* the daemon stopped while it ran; queued again at start */
	TR_JOB_PREEMPTED,   /* checkpointed and set aside for a higher-priority job; in the queue,
			       resumed on its own (daemon/preemption.c) */
	TR_JOB_NSTATES
};

/* What a client asks of a job (the control routes, PATCH, DELETE, a
 * checkpoint request). */
enum tr_job_request {
	TR_JOB_CANCEL,
	TR_JOB_STOP,
	TR_JOB_PAUSE,
	TR_JOB_RESUME,
	TR_JOB_SET_PRIORITY,
	TR_JOB_DELETE,
	TR_JOB_CHECKPOINT,
	TR_JOB_NREQUESTS
};

/* What a legal request does in a state. */
enum tr_job_action {
	TR_JOB_REFUSE, /* illegal here: 409 */
	TR_JOB_SET,    /* the job goes to `to` at once (it is not running) */
	TR_JOB_SIGNAL, /* the job's runner is asked; it records the outcome (to:
			   the state shown meanwhile, or the same state) */
	TR_JOB_KEEP,   /* legal, and the state stays (priority, delete, a
			   repeated stop) */
};

struct tr_job_transition {
	enum tr_job_action action;
	enum tr_job_state to;
};

/* Domain errors of job operations, carried in struct tr_error.kind.  The
 * API maps each to an HTTP status and code in one table (api/errors.c). */
enum tr_job_err {
	TR_JOB_OK = 0,
	TR_JOB_E_INVALID_SPEC,    /* the job spec is wrong (pointer set) */
	TR_JOB_E_INVALID_REQUEST, /* a request body or parameter is wrong */
	TR_JOB_E_INVALID_PATH,    /* a data path does not open in the data roots */
	TR_JOB_E_INVALID_INIT,    /* init.from names no usable checkpoint */
	TR_JOB_E_CANNOT_FIT,      /* asks for devices this daemon does not have */
	TR_JOB_E_NO_BACKEND,      /* asks for a backend this daemon does not run */
	TR_JOB_E_NOT_FOUND,
	TR_JOB_E_ILLEGAL,       /* the request is not legal in the job's state */
	TR_JOB_E_NO_CHECKPOINT, /* the job has no checkpoint of the kind asked for */
	TR_JOB_E_CONFLICT,      /* an idempotency key reused with another body */
	TR_JOB_E_QUEUE_FULL,
	TR_JOB_E_STORAGE,     /* storage refuses the change now; retry later */
	TR_JOB_E_UNSUPPORTED, /* the daemon does not offer the operation */
	TR_JOB_E_INTERNAL,
	TR_JOB_NERRS
};

/* "queued", ...; NULL for a value out of range. */
const char *tr_job_state_name(enum tr_job_state state);
/* The state named `name`; -1 when it names none. */
int tr_job_state_parse(const char *name);
/* The names in enum order, NULL-terminated (for lists and counts). */
extern const char *const tr_job_state_names[TR_JOB_NSTATES + 1];
/* "queued, running, ..., interrupted": every name, for messages. */
const char *tr_job_state_list(void);

/* A job in a terminal state has ended: it holds no devices and will not
 * run again unless a client resumes it (stopped) or it is deleted.  Its
 * finished_at is set, its event stream ends, it may be deleted. */
bool tr_job_state_terminal(enum tr_job_state state);
/* The same for a state's name; false for an unknown name. */
bool tr_job_state_name_terminal(const char *name);

/* "cancel", "stop", ... (the route's last segment). */
const char *tr_job_request_name(enum tr_job_request req);
/* The transition table: what `req` does in `state`. */
struct tr_job_transition tr_job_transition(enum tr_job_state state, enum tr_job_request req);
/* Looks `req` up for job `id` in `state`: 0 with *out set when legal,
 * else -EBUSY with e (kind TR_JOB_E_ILLEGAL) saying which states allow
 * it.  A state or request out of range is -EINVAL, TR_JOB_E_INTERNAL. */
int tr_job_check(int64_t id, enum tr_job_state state, enum tr_job_request req, struct tr_job_transition *out,
		 struct tr_error *e);

/* Fills e with a domain error; returns -1 (the ops' failure value). */
int tr_job_fail(struct tr_error *e, enum tr_job_err kind, const char *pointer, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* Epochs: 0-based wherever a program reads them (the API's progress and
 * metric points, checkpoints, metrics.jsonl), shown 1-based to people
 * (trainctl, the dashboard, log lines, progress bars): epoch 0 is "epoch
 * 1".  This is the one conversion. */
static inline int64_t tr_job_epoch_shown(int64_t epoch)
{
	return epoch + 1;
}

#endif
