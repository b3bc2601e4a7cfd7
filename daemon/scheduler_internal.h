/* Shared by the scheduler's files: the running-job record and the
 * scheduler's state.  Not for use outside daemon/scheduler*.c,
 * daemon/runner.c and daemon/submit.c. */
#ifndef TR_DAEMON_SCHEDULER_INTERNAL_H
#define TR_DAEMON_SCHEDULER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "daemon/checkpointer.h"
#include "daemon/scheduler.h"
#include "engine/spec.h"
#include "engine/trainer.h"

#define TR_MAX_POOL_DEVICES 64
/* More data roots than the configuration allows (daemon/config.h). */
#define TR_MAX_ROOTS 64

struct running_job {
	struct tr_scheduler *sched;
	int64_t id;
	struct tr_spec spec;
	/* Whether spec's paths were opened in the data roots when it was
	 * parsed (at submit); a spec parsed from the store (after a restart,
	 * or a resume with a new end) has them checked by the runner. */
	bool paths_resolved;
	int devices[TR_MAX_POOL_DEVICES];
	int ndev;
	pthread_t thread;
	bool finished; /* runner done; the dispatcher joins it */
	/* Control requested through the API; read by the runner. */
	atomic_bool cancel_requested, stop_requested, pause_requested;
	tr_trainer_t *trainer;           /* set while the trainer runs (under sched lock) */
	tr_trainer_t *trainer_for_hooks; /* the runner's own: set from create to destroy */
	/* Live progress, guarded by sched lock. */
	struct tr_progress progress;
	bool have_progress;
	bool crashes_cleared; /* its first step in this run cleared the stored crash count */
	bool slurm;           /* run by the Slurm allocator (daemon/slurm_runner.c): no devices here */
	bool procs;           /* several processes the daemon starts (daemon/procs_runner.c) */
	/* Its worker reports over the API (daemon/report.c): the file tail
	 * then reads no metric points, so that each point has one source. */
	atomic_bool reported;
	/* Set while the file tail appends points: the first report waits
	 * for the round to end (daemon/report.c), so that no point of the
	 * file lands after the API's point of the same step. */
	atomic_bool tailing;
	/* Memory admission (daemon/admission.c), guarded by sched lock: the
	 * job's admitted estimate (0 until admitted), and whether its memory
	 * is allocated (its first step is made), so that MemAvailable already
	 * shows it. */
	uint64_t mem_estimate;
	bool mem_settled;
	double last_store_progress;
	/* An experiment's trial pauses itself here, its ASHA rung (in the
	 * spec's unit: steps, or epochs when the spec ends by epochs); 0 =
	 * never.  Read from its row when the runner starts; training thread
	 * only. */
	int64_t pause_at;
	bool pause_at_asked;
	int64_t planned_steps; /* the row's total_steps when the runner started (0 before a first run) */
	int64_t resumed_step;  /* the checkpoint's step this run continues from (0: from the start) */
	/* An evaluate job (daemon/evaluate.c): its normalized spec; NULL for
	 * a training job.  Its `spec` then only holds the device count. */
	json_t *eval;
	/* Priority preemption (daemon/preemption.c).  priority and
	 * preemptible are the row's when the job started (a PATCH of the
	 * priority updates it, under sched lock); started_at is
	 * monotonic seconds.  preempt_requested: a higher-priority job asked
	 * for its devices (by preempted_by, priority by_priority, at asked_at,
	 * all guarded by sched lock); preempt_hard: its grace ran out and it
	 * was cancelled back to its newest checkpoint. */
	int priority;
	bool preemptible;
	double started_at;
	atomic_bool preempt_requested, preempt_hard;
	int64_t preempted_by;
	int by_priority;
	double asked_at;
	struct running_job *next;
};

struct tr_scheduler {
	struct tr_scheduler_config cfg;
	tr_data_roots_t *roots; /* every data file opens beneath these */
	int ndev;
	pthread_mutex_t lock;
	pthread_cond_t wake;
	bool dirty; /* the queue may have changed */
	bool shutting_down;
	bool started;
	atomic_bool ready;
	atomic_llong beat_ns; /* the dispatcher's last round (CLOCK_MONOTONIC) */
	/* Test hook: while this file exists the dispatcher stalls (so the
	 * watchdog test can see the pings stop).  From
	 * TRAINERD_TEST_STALL_FILE; NULL in normal runs. */
	char *stall_file;
	tr_checkpointer_t *checkpointer;
	int64_t owner[TR_MAX_POOL_DEVICES]; /* job id per device, 0 = free */
	struct running_job *running;
	/* Specs parsed (and resolved) at submit, kept until the job starts:
	 * the scheduler and the runner use them instead of parsing the
	 * stored text again.  Guarded by lock. */
	struct kept_spec *kept;
	pthread_t dispatcher;
	/* The experiments' driver (daemon/experiments.c); NULL when none. */
	struct tr_experiments *experiments;
	/* Memory admission (daemon/admission.c): the job sent back to the
	 * queue to wait for memory, which is not tried again until a job has
	 * ended (ended counts them) or MEM_RETRY_S have passed; 0 = none. */
	int64_t mem_wait_id;
	uint64_t mem_wait_ended;
	double mem_wait_since;
	uint64_t ended;
};

struct kept_spec {
	int64_t id;
	struct tr_spec spec;
	bool paths_resolved;
	struct kept_spec *next;
};

/* The kept specs; all with the scheduler lock held.  keep moves *spec
 * into the scheduler (leaving *spec zeroed); take moves the kept one out
 * into *spec (true) or finds none (false); drop frees it if any. */
void tr_sched_keep_spec(struct tr_scheduler *s, int64_t id, struct tr_spec *spec, bool paths_resolved);
bool tr_sched_take_spec(struct tr_scheduler *s, int64_t id, struct tr_spec *spec, bool *paths_resolved);
void tr_sched_drop_spec(struct tr_scheduler *s, int64_t id);

/* An experiment's trial (daemon/experiments.c): submits spec as a job
 * carrying tag's experiment, trial, pause_at and preemptible flag, with
 * the checks of POST /jobs; a trial whose job exists already is refused
 * (TR_JOB_E_CONFLICT).
 * tr_sched_control applies a control request as POST
 * /jobs/{id}/<request> does. */
int tr_sched_submit_trial(struct tr_scheduler *s, const json_t *spec, int priority, const struct tr_job_row *tag,
			  int64_t *job_id, struct tr_error_list *problems, struct tr_error *err);
int tr_sched_control(struct tr_scheduler *s, int64_t id, enum tr_job_request op, struct tr_error *err);
/* The checks of a submit without storing anything (a spec refused as
 * POST /jobs would refuse it, 400 or 422); 0 or -1 with err filled. */
int tr_sched_check_spec(struct tr_scheduler *s, const json_t *doc, struct tr_error *err);

/* How many of the pool's devices a job of `spec` holds (a multi-process
 * job: processes x devices). */
int tr_sched_wanted_devices(const struct tr_scheduler *s, const struct tr_spec *spec);
/* Whether the Slurm allocator runs this job (its spec says so, or it
 * leaves the allocator to the daemon's --allocator slurm): its devices
 * and processes are then the cluster's, not this daemon's. */
bool tr_sched_runs_on_slurm(const struct tr_scheduler *s, const struct tr_spec *spec);
/* Wakes the dispatcher to look at the queue again. */
void tr_sched_kick(struct tr_scheduler *s);
/* Starts a job's runner thread; devices already reserved.  0, or a
 * negative code with err filled. */
int tr_runner_start(struct running_job *job, struct tr_error *err);
/* Checks that every data and init path of the spec opens in the data roots
 * (tr_data_open) and rewrites each to the absolute name it opened as.
 * Returns 0, or -1 (a file that does not open) or -2 (a malformed
 * "dataset:" reference, a spec error) with e's pointer and message
 * filled. */
int tr_resolve_spec_paths(struct tr_scheduler *s, struct tr_spec *spec, struct tr_error *e);
/* daemon/submit_data.c: the trainer's data checks at submit, for data
 * small enough to open then (paths resolved first).  0, or -1 with an
 * invalid-spec error naming the pointer. */
int tr_submit_check_data(struct tr_scheduler *s, const struct tr_spec *spec, struct tr_error *err);
/* Records how a job ended (runner.c): metrics flushed first, then the
 * state, then the scheduler is told its devices are free. */
void tr_runner_finish(struct running_job *j, enum tr_job_state state, const char *code, const char *message,
		      int64_t step);

/* Priority preemption (preemption.c), all with the scheduler lock held.
 * tr_preempt_for: the first queued job (row r, wanting `spec`'s devices)
 * cannot start: asks the fewest lower-priority preemptible jobs whose
 * devices let it start to let go at their next step boundary, unless
 * enough are being freed already.  tr_preempt_enforce_grace: cancels the
 * preempted jobs whose grace ran out.  tr_preempt_resize: the devices a
 * preempted job may resume on when fewer than it asks for are free (exact
 * mode makes the count not matter); 0 = wait. */
void tr_preempt_for(struct tr_scheduler *s, const struct tr_job_row *r, const struct tr_spec *spec);
void tr_preempt_enforce_grace(struct tr_scheduler *s);
int tr_preempt_resize(struct tr_scheduler *s, const struct tr_job_row *r, const struct tr_spec *spec, int *devs);
/* The runner's side: records the job's preemption (who, how, at which
 * step) and logs it, before the state change to preempted. */
void tr_preempt_record(struct running_job *j, int64_t step);
double tr_sched_mono_now(void);

/* Memory admission (admission.c).  tr_admit_memory: trainer.h's
 * admit_memory hook (ctx: the running job): 0 and the estimate reserved,
 * -ENOMEM when it cannot fit even with no other job running, -EBUSY when
 * it can once others end; err has both figures.  tr_wait_for_memory: the
 * runner's answer to -EBUSY, the job back in the queue with its reason
 * (info field queued_reason) and ended like a runner.  tr_memory_blocks:
 * whether queued job `id` still waits (lock held). */
int tr_admit_memory(void *ctx, const struct tr_mem_estimate *e, struct tr_error *err);
void tr_wait_for_memory(struct running_job *j, const char *reason);
bool tr_memory_blocks(struct tr_scheduler *s, int64_t id);
void tr_memory_admitted(struct running_job *j);

/* Evaluate jobs (evaluate.c).  tr_eval_spec_is: whether a stored
 * normalized spec is one.  tr_eval_prepare: fills j->eval and the device
 * count from it.  tr_eval_op: the API's evaluate operation (ctx: the
 * scheduler). */
bool tr_eval_spec_is(const char *normalized);
int tr_eval_prepare(struct running_job *j, const char *normalized, struct tr_error *err);
int tr_eval_runner_start(struct running_job *j, struct tr_error *err);

/* Slurm jobs (slurm_runner.c): the runner that submits and follows one. */
int tr_slurm_runner_start(struct running_job *j, struct tr_error *err);
/* Jobs of several processes (procs_runner.c): the runner that starts and
 * supervises their group. */
int tr_procs_runner_start(struct running_job *j, struct tr_error *err);
int tr_eval_op(void *ctx, int64_t job_id, const json_t *body, int64_t *eval_id, struct tr_error *err);
/* Worker reports over the API (report.c): the API's report operation
 * (ctx: the scheduler). */
int tr_report_op(void *ctx, int64_t job_id, const struct tr_api_report *r, struct tr_error *err);
int tr_report_folder_op(void *ctx, int64_t job_id, char *dir, size_t n, struct tr_error *err);

#endif
