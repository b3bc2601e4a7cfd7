/* A job the daemon runs outside its own threads, as worker processes
 * (`trainerd run`) writing into a job folder: the Slurm allocator's jobs
 * (daemon/slurm_runner.c) and local multi-process jobs
 * (daemon/procs_runner.c).  What their runners share: the folder, the
 * job's log and info fields, the tail of the worker's metrics.jsonl into
 * the store, the worker's summary.json and its final checkpoint stored as
 * the job's (docs/design.md, "Slurm allocator" and "Multi-process jobs"). */
#ifndef TR_DAEMON_WORKER_JOB_H
#define TR_DAEMON_WORKER_JOB_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "core/error.h"

struct running_job;

/* In the job's folder once its worker has reported over the API
 * (daemon/report.c): the file tail then reads no metric points, after a
 * daemon restart too. */
#define TR_WJOB_REPORTED_FILE "reported"

struct tr_worker_job {
	struct running_job *j;
	char dir[1100]; /* STATE_DIR/KIND/job-ID */
	/* The metrics tail. */
	ino_t metrics_ino;
	off_t metrics_off;
	double last_progress_store;
};

double tr_wjob_mono_s(void);
/* A line in the job's log (and the daemon's). */
void tr_wjob_log(struct tr_worker_job *w, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Merges one info field into the job's (value's reference is taken). */
void tr_wjob_set_info(struct tr_worker_job *w, const char *key, json_t *value);
/* Writes a whole file through a temporary (created with mode, less the
 * umask) and a rename.  0 or -errno. */
int tr_wjob_write_file(const char *path, const void *data, size_t len, mode_t mode);
/* The same for text, mode 0666 (less the umask). */
int tr_wjob_write_text(const char *path, const char *text);
/* Makes the job's folder STATE_DIR/kind/job-ID into w->dir.  0, or -errno
 * with msg saying why. */
int tr_wjob_make_dir(struct tr_worker_job *w, const char *kind, char *msg, size_t msglen);
/* Writes the job's stored spec to DIR/job.json.  0 or -errno with err. */
int tr_wjob_write_spec(struct tr_worker_job *w, struct tr_error *err);
/* The trainerd executable to run as the worker (this one, or its
 * successor at the same path after an upgrade).  0 or -errno with err. */
int tr_wjob_worker_path(char *buf, size_t n, struct tr_error *err);
/* Reads the worker's new metric points into the store and the job's
 * live progress. */
void tr_wjob_tail_metrics(struct tr_worker_job *w);
/* The summary.json the worker wrote as it ended: its state and, for a
 * failure, the error.  False when there is none. */
bool tr_wjob_read_summary(struct tr_worker_job *w, char *state, size_t n, char *error, size_t en, int64_t *steps);
/* Takes the job's live progress (which the runner's end stores in its
 * row) from the summary.json the worker wrote as it ended: its last step,
 * epoch and loss, with total_steps from plan.json.  metrics.jsonl has a
 * loss only every log_every_steps (and at the last step), so a run
 * stopped or paused between two would otherwise show the last logged
 * step, or step 0 before the first.  Nothing changes without a summary. */
void tr_wjob_final_progress(struct tr_worker_job *w);
/* Stores the worker's final checkpoint as the job's; *step its step. */
int tr_wjob_store_checkpoint(struct tr_worker_job *w, int64_t *step, struct tr_error *err);

#endif
