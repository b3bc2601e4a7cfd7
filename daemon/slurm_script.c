/* The Slurm allocator's batch script and what it reads back from Slurm
 * (daemon/slurm.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "daemon/slurm.h"

int tr_slurm_signal_lead_s(const struct tr_resources *r)
{
	int lead = 120;
	if (r->time_limit_s > 0 && lead > r->time_limit_s / 2)
		lead = r->time_limit_s / 2;
	return lead > 0 ? lead : 1;
}

/* The path between single quotes for the shell; -1 when it holds a quote
 * (the daemon's own folders never do). */
static int quoted(char *buf, size_t n, const char *s)
{
	if (strchr(s, '\'') || (size_t)snprintf(buf, n, "'%s'", s) >= n)
		return -1;
	return 0;
}

/* The script: each start of the Slurm job (the first, and each after a
 * requeue) runs the worker under srun, one rank per task (MPI through
 * PMIx when there are several), resuming from the folder's checkpoint
 * when there is one.  USR1 (from --signal=B:USR1@S before the
 * time limit, or `scancel --batch --signal=USR1`) reaches the batch shell
 * only: it passes it on to every task with `scancel --signal=USR1` (srun
 * would die of it), whose trainer writes a checkpoint at its next step
 * boundary and exits; the
 * script then requeues the job, which resumes from that checkpoint.  A
 * requeue by Slurm itself (scontrol requeue, preemption) sends TERM,
 * which the worker answers the same way. */
int tr_slurm_write_script(const char *path, int64_t id, const char *dir, const char *worker, const char *bin_dir,
			  const char *report_url)
{
	char qdir[1100], qworker[1100], qbin[1100], url[1100], qurl[1200];
	/* The route of this job, under the URL without its trailing '/'. */
	size_t ul = report_url ? strlen(report_url) : 0;
	while (ul > 0 && report_url[ul - 1] == '/')
		ul--;
	snprintf(url, sizeof url, "%.*s", (int)ul, ul ? report_url : "");
	if (ul)
		snprintf(url + strlen(url), sizeof url - strlen(url), "/jobs/%lld/report", (long long)id);
	if (quoted(qdir, sizeof qdir, dir) < 0 || quoted(qworker, sizeof qworker, worker) < 0 ||
	    quoted(qbin, sizeof qbin, bin_dir && bin_dir[0] ? bin_dir : "") < 0 || quoted(qurl, sizeof qurl, url) < 0)
		return -EINVAL;
	char tmp[1100];
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	FILE *f = fopen(tmp, "w");
	if (!f)
		return -errno;
	fprintf(f,
		"#!/bin/bash\n"
		"# Written by trainerd for its job %lld: the job's worker under srun.\n"
		"set -u\n"
		"dir=%s\n"
		"worker=%s\n"
		"bin=%s\n"
		"report_url=%s\n"
		"cmd() { if [ -n \"$bin\" ]; then \"$bin/$1\" \"${@:2}\"; else \"$@\"; fi; }\n"
		"if [ -f \"$dir/checkpoint.safetensors\" ] && [ -f \"$dir/spec.json\" ]; then\n"
		"\targs=(run --resume \"$dir\" --quiet)\n"
		"else\n"
		"\targs=(run \"$dir/job.json\" --out \"$dir\" --quiet)\n"
		"fi\n"
		"# Rank 0 reports to the daemon with the job's token (a file: never on\n"
		"# a command line).\n"
		"if [ -n \"$report_url\" ]; then\n"
		"\targs+=(--report-url \"$report_url\" --report-token-file \"$dir/report.token\")\n"
		"fi\n"
		"# Several tasks are the job's ranks: Open MPI starts through PMIx, which\n"
		"# Debian's Slurm and Open MPI share (TRAINERD_SLURM_MPI names another plugin).\n"
		"mpi=()\n"
		"if [ \"${SLURM_NTASKS:-1}\" -gt 1 ]; then mpi=(\"--mpi=${TRAINERD_SLURM_MPI:-pmix}\"); fi\n"
		"echo \"trainerd: Slurm job $SLURM_JOB_ID start ${SLURM_RESTART_COUNT:-0}: ${args[*]}\" \\\n"
		"\t\"(${SLURM_NTASKS:-1} tasks${mpi:+, ${mpi[*]}})\"\n"
		"requeue=0\n"
		"usr1_at=\n"
		"# srun itself dies of USR1: Slurm passes it to the tasks (not to this shell).\n"
		"trap 'requeue=1; usr1_at=${usr1_at:-$EPOCHREALTIME}; cmd scancel --signal=USR1 \"$SLURM_JOB_ID\"' USR1\n"
		"cmd srun --kill-on-bad-exit=1 \"${mpi[@]}\" \"$worker\" \"${args[@]}\" &\n"
		"srun_pid=$!\n"
		"# wait returns early when the trap runs: wait again until srun has ended.\n"
		"while :; do\n"
		"\twait \"$srun_pid\"\n"
		"\trc=$?\n"
		"\tkill -0 \"$srun_pid\" 2>/dev/null || break\n"
		"done\n"
		"# A worker that ended its last step anyway has nothing left to run.\n"
		"if [ \"$requeue\" = 1 ] && [ \"$rc\" = 0 ] &&\n"
		"\tgrep -Eq '\"state\": ?\"stopped\"' \"$dir/summary.json\" 2>/dev/null; then\n"
		"\t# How long the warning's lead S must cover (daemon/slurm.h): from USR1\n"
		"\t# to the worker's end, its last step and checkpoint included.\n"
		"\ttook=$(awk -v a=\"$usr1_at\" -v b=\"$EPOCHREALTIME\" 'BEGIN { printf \"%%.2f\", b - a }')\n"
		"\techo \"trainerd: checkpointed for the time limit in $took s after USR1; requeueing\"\n"
		"\tcmd scontrol requeue \"$SLURM_JOB_ID\"\n"
		"fi\n"
		"exit \"$rc\"\n",
		(long long)id, qdir, qworker, qbin, qurl);
	int rc = ferror(f) ? -EIO : 0;
	if (fclose(f) != 0 && rc == 0)
		rc = -EIO;
	if (rc == 0 && chmod(tmp, 0755) < 0)
		rc = -errno;
	if (rc == 0 && rename(tmp, path) < 0)
		rc = -errno;
	if (rc < 0)
		remove(tmp);
	return rc;
}

/* The value of " KEY=" in an `scontrol show job -o` line, up to the next
 * space, into buf. */
static bool field(const char *text, const char *key, char *buf, size_t n)
{
	size_t kl = strlen(key);
	for (const char *p = text; (p = strstr(p, key)) != NULL; p += kl) {
		if ((p != text && p[-1] != ' ') || p[kl] != '=')
			continue;
		p += kl + 1;
		size_t len = strcspn(p, " \n");
		if (len >= n)
			len = n - 1;
		memcpy(buf, p, len);
		buf[len] = 0;
		return true;
	}
	return false;
}

int tr_slurm_parse_job(const char *text, struct tr_slurm_job_state *out)
{
	memset(out, 0, sizeof *out);
	char buf[64];
	if (!field(text, "JobState", out->state, sizeof out->state) || !out->state[0])
		return -EINVAL;
	field(text, "Reason", out->reason, sizeof out->reason);
	if (field(text, "Restarts", buf, sizeof buf))
		out->restarts = atoi(buf);
	if (field(text, "ExitCode", buf, sizeof buf))
		sscanf(buf, "%d:%d", &out->exit_code, &out->exit_signal);
	return 0;
}

bool tr_slurm_state_final(const char *s)
{
	static const char *const fin[] = {"COMPLETED", "CANCELLED", "FAILED",        "TIMEOUT",   "NODE_FAIL",
					  "BOOT_FAIL", "DEADLINE",  "OUT_OF_MEMORY", "PREEMPTED", NULL};
	for (int i = 0; fin[i]; i++)
		if (!strcmp(s, fin[i]))
			return true;
	return false;
}
