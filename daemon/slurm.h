/* The Slurm allocator (docs/design.md, "Slurm allocator"; docs/slurm.md).
 *
 * A job whose spec says "resources": {"allocator": "slurm", ...} (or any
 * job of a daemon started with --allocator slurm) is not run on the
 * daemon's devices: its runner writes the job's folder,
 * STATE_DIR/slurm/job-ID (job.json, the spec; job.sh, the batch script),
 * submits the script with `sbatch --parsable --requeue --signal=B:USR1@S`
 * and follows the Slurm job until it ends.  The script runs the worker,
 * `srun trainerd run`, into that folder, one rank per task (several in
 * exact mode only, started through PMIx); the runner tails its
 * metrics.jsonl into the store and, when it ends, stores its final
 * checkpoint as the job's.  With the daemon's report-url the worker runs
 * in a private folder on the node instead and sends all of that over the
 * API (docs/design.md, "Worker reports"), so the nodes need not see the
 * folder.  The Slurm job's id and state are the job's
 * info fields slurm_job_id, slurm_state and slurm_restarts.  Only Slurm's
 * commands are used, never libslurm. */
#ifndef TR_DAEMON_SLURM_H
#define TR_DAEMON_SLURM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/spec.h"

/* Runs Slurm command argv[0] (from bin_dir when not empty, else PATH) with
 * stdin from /dev/null; its stdout and stderr together go to out (NUL
 * terminated, cut at out_len - 1).  Killed after timeout_s.  Returns the
 * exit status (128 + N for signal N), or a negative errno when it could
 * not run (-ETIMEDOUT: killed), with out saying why. */
int tr_slurm_command(const char *bin_dir, char *const argv[], char *out, size_t out_len, int timeout_s);

/* Seconds before the time limit at which Slurm sends USR1 to the batch
 * script (--signal=B:USR1@S): time for the step in progress, the
 * checkpoint and Slurm's own lateness (it may signal up to 60 s early
 * or late), at most half the limit.  The first two are measured by the
 * script at each warning ("checkpointed for the time limit in X s");
 * they are not known before a job's first run, so S is fixed at 120 s,
 * which leaves a minute for them (docs/design.md, "Slurm allocator"). */
int tr_slurm_signal_lead_s(const struct tr_resources *r);

/* The batch script of job `id`, for `dir` (its folder) and `worker` (the
 * trainerd executable).  With report_url (the daemon's URL as the nodes
 * reach it; NULL or "" for none) the worker reports to
 * REPORT_URL/jobs/ID/report with the job's token
 * (docs/design.md, "Worker reports"): the script then carries DIR/job.json
 * and DIR/report.token (it is written 0600), and the worker runs in a
 * node-local folder, resuming from the checkpoint it fetches from
 * REPORT_URL/jobs/ID/report/checkpoint.safetensors.  Returns 0 or -errno. */
int tr_slurm_write_script(const char *path, int64_t id, const char *dir, const char *worker, const char *bin_dir,
			  const char *report_url);

/* What `scontrol show job -o ID` says of a job. */
struct tr_slurm_job_state {
	char state[32]; /* PENDING, RUNNING, COMPLETED, CANCELLED, FAILED, TIMEOUT, ... */
	char reason[64];
	int restarts;
	int exit_code, exit_signal; /* ExitCode=C:S */
};
/* Parses one line of `scontrol show job -o`; -EINVAL when it has no
 * JobState. */
int tr_slurm_parse_job(const char *text, struct tr_slurm_job_state *out);
/* Whether a JobState is final (the job will not run again by itself). */
bool tr_slurm_state_final(const char *state);

/* A requeue seen as a preemption (daemon/slurm_preempt.c).  While Slurm
 * holds a requeued job back (restarts > 0 and PENDING or REQUEUED*), the
 * daemon shows it `preempted`; when Slurm starts it again, `running`.
 * tr_slurm_checkpoint_step: the step of the checkpoint in the job's
 * folder that the next start resumes from (its header only), -1 when
 * there is none.  tr_slurm_preemption_json: the job's preemption record
 * (malloc'd JSON text): daemon/preemption.c's shape with "by": "slurm",
 * no by_priority, and the Slurm job id, restart count and reason; step
 * < 0 (no checkpoint) makes it mode "hard". */
bool tr_slurm_held_after_requeue(const struct tr_slurm_job_state *st);
int64_t tr_slurm_checkpoint_step(const char *dir);
char *tr_slurm_preemption_json(const char *slurm_id, const struct tr_slurm_job_state *st, int priority, int64_t step,
			       const char *at);

#endif
