/* The scheduler: the job queue, device allocation and job runner threads.
 *
 * The queue lives in the store (state queued, ordered by priority, then
 * submit time); the scheduler keeps in memory only what runs.  Jobs start
 * in strict queue order: when the first queued job does not fit the free
 * devices, nothing behind it starts, so priorities are never overtaken.
 * Each running job has one runner thread that owns its trainer; its
 * devices are disjoint from every other job's.
 */
#ifndef TR_DAEMON_SCHEDULER_H
#define TR_DAEMON_SCHEDULER_H

#include "api/api.h"
#include "engine/backend.h"
#include "storage/store.h"

typedef struct tr_scheduler tr_scheduler_t;

/* Priority preemption (daemon/preemption.c; the config's "preemption"
 * section). */
struct tr_preemption_policy {
	bool enabled;
	/* Seconds a preempted job has to reach a step boundary and write its
	 * checkpoint; past it the job is cancelled back to its newest
	 * checkpoint (a "hard" preemption). */
	int grace_s;
	/* Seconds a job must have run (since it last started) before it may
	 * be preempted (again): no thrashing. */
	int min_run_s;
};

struct tr_scheduler_config {
	tr_store_t *store;             /* borrowed */
	tr_backend_t *backend;         /* borrowed: its devices are the pool */
	const char *const *data_roots; /* NULL-terminated absolute directories */
	/* Where "dataset:NAME/FILE" paths resolve (storage/datasets.h): an
	 * absolute directory, a data root besides data_roots; NULL = none. */
	const char *datasets_dir;
	int max_queued; /* queued jobs at once; 0 = no limit */
	/* Daemon deaths in a row a job may be running at (without making a
	 * step in between) before it is failed with crashed_daemon instead
	 * of queued again; 0 = no limit. */
	int max_job_crashes;
	struct tr_preemption_policy preemption;
	/* Jobs without "resources" go to Slurm (daemon/slurm.c). */
	bool allocator_slurm;
	const char *slurm_bin_dir; /* Slurm's commands; "" or NULL = PATH */
	/* The daemon's URL as Slurm's nodes reach it, where a Slurm job's
	 * worker reports (docs/design.md, "Worker reports"); "" or NULL: the
	 * worker's files are tailed instead. */
	const char *report_url;
	const char *state_dir; /* Slurm jobs' folders are STATE_DIR/slurm/job-ID */
};

/* 0, or a negative code with err filled (docs/design.md, "Errors"). */
int tr_scheduler_create(const struct tr_scheduler_config *cfg, tr_scheduler_t **out, struct tr_error *err);
/* Fills the API's operation table with this scheduler (ops.ctx = s). */
void tr_scheduler_api_ops(tr_scheduler_t *s, struct tr_api_ops *ops, void **ctx);
/* Recovers jobs a previous run left running (they become interrupted and
 * are queued again) and starts dispatching. */
int tr_scheduler_start(tr_scheduler_t *s, struct tr_error *err);
/* Submits a spec file unless the store already has jobs (make run). */
int tr_scheduler_submit_if_empty(tr_scheduler_t *s, const char *path, struct tr_error *err);
/* Stops running jobs at a step boundary and records them as interrupted;
 * after grace_s cancels what is still running.  Joins every thread. */
void tr_scheduler_shutdown(tr_scheduler_t *s, int grace_s);
void tr_scheduler_destroy(tr_scheduler_t *s);
/* Jobs running now and queued (for the service status line). */
void tr_scheduler_counts(tr_scheduler_t *s, int *running, int *queued);
/* Monotonic time (seconds) the dispatcher last went round its loop: the
 * scheduler's check-in for the service watchdog. */
double tr_scheduler_last_beat(tr_scheduler_t *s);

#endif
