/* The Slurm allocator (docs/design.md, "Slurm allocator"; docs/slurm.md).
 *
 * A job whose spec says "resources": {"allocator": "slurm", ...} (or any
 * job of a daemon started with --allocator slurm) is not run on the
 * daemon's devices: its runner writes the job's folder,
 * STATE_DIR/slurm/job-ID (job.json, the spec; job.sh, the batch script),
 * submits the script with `sbatch --parsable --requeue --signal=B:USR1@S`
 * and follows the Slurm job until it ends.  The script runs the worker,
 * `srun trainerd run`, into that folder; the runner tails its
 * metrics.jsonl into the store and, when it ends, stores its final
 * checkpoint as the job's.  The Slurm job's id and state are the job's
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
 * or late), at most half the limit. */
int tr_slurm_signal_lead_s(const struct tr_resources *r);

/* The batch script of job `id`, for `dir` (its folder) and `worker` (the
 * trainerd executable).  Returns 0 or -errno. */
int tr_slurm_write_script(const char *path, int64_t id, const char *dir, const char *worker, const char *bin_dir);

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

#endif
