/* The Slurm allocator's batch script and what it reads back from Slurm
 * (daemon/slurm.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* A file of the job's folder, whole, into a malloc'd string (NULL when
 * it cannot be read). */
static char *slurp(const char *dir, const char *name)
{
	char path[1200];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	FILE *f = fopen(path, "r");
	if (!f)
		return NULL;
	char *text = NULL;
	size_t len = 0;
	FILE *m = open_memstream(&text, &len);
	char buf[4096];
	size_t n;
	while (m && (n = fread(buf, 1, sizeof buf, f)) > 0)
		fwrite(buf, 1, n, m);
	bool bad = ferror(f) || !m;
	fclose(f);
	if (m)
		fclose(m);
	if (bad) {
		free(text);
		return NULL;
	}
	return text;
}

#define SPEC_END "TRAINERD_SPEC_END"

/* The node-local part of the script (with a report URL): the worker's
 * folder is a private temporary folder on the node, removed at exit,
 * which this script fills with the spec and the token it carries and
 * with the checkpoint it fetches from the daemon, if one was uploaded.
 * On several nodes, srun makes the same folder on each and sbcast copies
 * the files there. */
static int write_node_local(FILE *f, int64_t id, const char *dir)
{
	char *spec = slurp(dir, "job.json"), *token = slurp(dir, "report.token");
	int rc = 0;
	if (!spec || !token)
		rc = errno ? -errno : -EIO;
	else if (strstr(spec, SPEC_END) || strspn(token, "0123456789abcdef") != 64)
		rc = -EINVAL; /* the daemon's own files never are */
	if (rc == 0) {
		token[64] = 0;
		fprintf(f,
			"# The node need not see the daemon's folder: the worker writes into a\n"
			"# private folder on the node, which this script fills with the spec and\n"
			"# the job's report token it carries, and with the checkpoint the job\n"
			"# uploaded before (a requeue), fetched from the daemon.\n"
			"nodes=${SLURM_JOB_NUM_NODES:-1}\n"
			"out=$(umask 077 && mktemp -d \"${TMPDIR:-/tmp}/trainerd-job-%lld.XXXXXX\") ||\n"
			"\t{ echo \"trainerd: cannot make a folder on node $(hostname)\"; exit 1; }\n"
			"# The tasks may outlive srun (the TERM of a requeue ends srun first)\n"
			"# while the worker writes and uploads its checkpoint from the folder:\n"
			"# it goes once no process runs from it (60 s at most).\n"
			"cleanup() {\n"
			"\tfor _ in $(seq 600); do pgrep -f -- \"$out/\" >/dev/null 2>&1 || break; sleep 0.1; done\n"
			"\trm -rf \"$out\"\n"
			"\tif [ \"$nodes\" -gt 1 ]; then cmd srun --ntasks-per-node=1 --ntasks=\"$nodes\" rm -rf \"$out\"; fi\n"
			"}\n"
			"trap cleanup EXIT\n"
			"(\n"
			"\tumask 077\n"
			"\tcat >\"$out/job.json\" <<'" SPEC_END "'\n"
			"%s%s" SPEC_END "\n"
			"\tprintf '%%s\\n' '%s' >\"$out/report.token\"\n"
			"\tprintf 'Authorization: Bearer %%s\\n' '%s' >\"$out/auth.header\"\n"
			") || exit 1\n"
			"code=$(curl -sS --retry 5 --retry-connrefused --connect-timeout 10 -H @\"$out/auth.header\" \\\n"
			"\t-o \"$out/checkpoint.safetensors\" -w '%%{http_code}' \"$report_url/checkpoint.safetensors\")\n"
			"case \"$code\" in\n"
			"200) args=(run --resume \"$out\" \"$out/job.json\" --quiet) ;;\n"
			"404)\n"
			"\trm -f \"$out/checkpoint.safetensors\"\n"
			"\targs=(run \"$out/job.json\" --out \"$out\" --quiet)\n"
			"\t;;\n"
			"*)\n"
			"\techo \"trainerd: cannot fetch the job's checkpoint from $report_url/checkpoint.safetensors\" \\\n"
			"\t\t\"(HTTP ${code:-none}): $(head -c 300 \"$out/checkpoint.safetensors\" 2>/dev/null)\"\n"
			"\texit 1\n"
			"\t;;\n"
			"esac\n"
			"rm -f \"$out/auth.header\"\n"
			"if [ \"$nodes\" -gt 1 ]; then\n"
			"\tcmd srun --ntasks-per-node=1 --ntasks=\"$nodes\" mkdir -p -m 700 \"$out\" || exit 1\n"
			"\tfor file in \"$out\"/*; do cmd sbcast -f \"$file\" \"$file\" || exit 1; done\n"
			"fi\n",
			(long long)id, spec, spec[0] && spec[strlen(spec) - 1] == '\n' ? "" : "\n", token, token);
	}
	if (token)
		explicit_bzero(token, strlen(token));
	free(spec);
	free(token);
	return rc;
}

/* The script: each start of the Slurm job (the first, and each after a
 * requeue) runs the worker under srun, one rank per task (MPI through
 * PMIx when there are several), resuming from its checkpoint when there
 * is one: the folder's, or with a report URL the one the job uploaded to
 * the daemon.  USR1 (from --signal=B:USR1@S before the
 * time limit, or `scancel --batch --signal=USR1`) reaches the batch shell
 * only: it passes it on to every task with `scancel --signal=USR1` (srun
 * would die of it), whose trainer writes a checkpoint at its next step
 * boundary and exits (rank 0 uploads it with a report URL); the
 * script then requeues the job, which resumes from that checkpoint.  A
 * requeue by Slurm itself (scontrol requeue, preemption) sends TERM,
 * which the worker answers the same way.  With a report URL the script
 * holds the job's token: it is written 0600. */
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
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
	if (!f) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		return -e;
	}
	fprintf(f,
		"#!/bin/bash\n"
		"# Written by trainerd for its job %lld: the job's worker under srun.\n"
		"set -u\n"
		"dir=%s\n"
		"worker=%s\n"
		"bin=%s\n"
		"report_url=%s\n"
		"cmd() { if [ -n \"$bin\" ]; then \"$bin/$1\" \"${@:2}\"; else \"$@\"; fi; }\n",
		(long long)id, qdir, qworker, qbin, qurl);
	int rc = 0;
	if (ul) {
		rc = write_node_local(f, id, dir);
		fprintf(f, "# Rank 0 reports to the daemon with the job's token (a file: never on\n"
			   "# a command line).\n"
			   "args+=(--report-url \"$report_url\" --report-token-file \"$out/report.token\")\n");
	} else {
		fprintf(f, "out=$dir\n"
			   "if [ -f \"$dir/checkpoint.safetensors\" ] && [ -f \"$dir/spec.json\" ]; then\n"
			   "\targs=(run --resume \"$dir\" --quiet)\n"
			   "else\n"
			   "\targs=(run \"$dir/job.json\" --out \"$dir\" --quiet)\n"
			   "fi\n");
	}
	fprintf(f,
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
		"# TERM (a requeue, scancel) reaches the tasks too, which checkpoint and\n"
		"# upload: this shell waits for them rather than end (and remove a\n"
		"# node-local folder) under them.\n"
		"trap 'echo \"trainerd: TERM: waiting for the worker to checkpoint\"' TERM\n"
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
		"\tgrep -Eq '\"state\": ?\"stopped\"' \"$out/summary.json\" 2>/dev/null; then\n"
		"\t# How long the warning's lead S must cover (daemon/slurm.h): from USR1\n"
		"\t# to the worker's end, its last step and checkpoint included.\n"
		"\ttook=$(awk -v a=\"$usr1_at\" -v b=\"$EPOCHREALTIME\" 'BEGIN { printf \"%%.2f\", b - a }')\n"
		"\techo \"trainerd: checkpointed for the time limit in $took s after USR1; requeueing\"\n"
		"\tcmd scontrol requeue \"$SLURM_JOB_ID\"\n"
		"fi\n"
		"exit \"$rc\"\n");
	if (rc == 0 && ferror(f))
		rc = -EIO;
	if (fclose(f) != 0 && rc == 0)
		rc = -EIO;
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
