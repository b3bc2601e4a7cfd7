/* The Slurm allocator's pieces that need no cluster (daemon/slurm_*.c):
 * reading `scontrol show job -o`, the final states, the USR1 lead before
 * the time limit, the batch script (run by bash with stub srun and
 * scontrol), the command runner's bounds, and a requeue seen as a
 * preemption (when, at which checkpoint step, the record). */
#include <criterion/criterion.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/slurm.h"

Test(slurm, parses_scontrol_show_job)
{
	struct tr_slurm_job_state st;
	const char *line = "JobId=12 JobName=trainerd-3 UserId=root(0) JobState=PENDING Reason=BeginTime "
			   "Dependency=(null) Requeue=1 Restarts=2 BatchFlag=1 ExitCode=0:15 RunTime=00:00:00\n";
	cr_assert_eq(tr_slurm_parse_job(line, &st), 0);
	cr_expect_str_eq(st.state, "PENDING");
	cr_expect_str_eq(st.reason, "BeginTime");
	cr_expect_eq(st.restarts, 2);
	cr_expect_eq(st.exit_code, 0);
	cr_expect_eq(st.exit_signal, 15);
	/* A key inside another key's value or name is not the key. */
	cr_assert_eq(tr_slurm_parse_job("OldJobState=RUNNING JobState=COMPLETED", &st), 0);
	cr_expect_str_eq(st.state, "COMPLETED");
	cr_expect_eq(tr_slurm_parse_job("slurm_load_jobs error: Invalid job id specified", &st), -EINVAL);
}

Test(slurm, final_states)
{
	cr_expect(tr_slurm_state_final("COMPLETED"));
	cr_expect(tr_slurm_state_final("CANCELLED"));
	cr_expect(tr_slurm_state_final("TIMEOUT"));
	cr_expect(tr_slurm_state_final("FAILED"));
	cr_expect_not(tr_slurm_state_final("PENDING"));
	cr_expect_not(tr_slurm_state_final("RUNNING"));
	cr_expect_not(tr_slurm_state_final("REQUEUED"));
	cr_expect_not(tr_slurm_state_final("COMPLETING"));
}

Test(slurm, signal_lead)
{
	struct tr_resources r = {.time_limit_s = 0};
	cr_expect_eq(tr_slurm_signal_lead_s(&r), 120);
	r.time_limit_s = 3600;
	cr_expect_eq(tr_slurm_signal_lead_s(&r), 120);
	r.time_limit_s = 60;
	cr_expect_eq(tr_slurm_signal_lead_s(&r), 30);
	r.time_limit_s = 1;
	cr_expect_eq(tr_slurm_signal_lead_s(&r), 1);
}

Test(slurm, command_output_status_and_timeout)
{
	char out[64];
	char *ok[] = {"sh", "-c", "echo 123';'cluster; exit 3", NULL};
	cr_expect_eq(tr_slurm_command(NULL, ok, out, sizeof out, 10), 3);
	cr_expect_str_eq(out, "123;cluster\n");
	char *slow[] = {"sleep", "5", NULL};
	cr_expect_eq(tr_slurm_command(NULL, slow, out, sizeof out, 1), -ETIMEDOUT);
	char *none[] = {"no-such-slurm-command", NULL};
	cr_expect_lt(tr_slurm_command("/nonexistent", none, out, sizeof out, 5), 0);
	cr_expect_not_null(strstr(out, "/nonexistent/no-such-slurm-command"), "%s", out);
	/* Output past the buffer is read to the end and cut. */
	char *big[] = {"sh", "-c", "yes | head -c 100000", NULL};
	cr_expect_eq(tr_slurm_command(NULL, big, out, sizeof out, 10), 0);
	cr_expect_eq(strlen(out), sizeof out - 1);
}

/* Runs the batch script with stub srun/scancel/scontrol in bin (they log
 * their arguments) and returns the log. */
static const char *report_url;

static char *run_script(const char *tmp, bool checkpoint, const char *srun_body)
{
	char path[512], cmd[1024];
	snprintf(path, sizeof path, "%s/bin", tmp);
	mkdir(path, 0700);
	/* curl (from PATH) answers with the code in TMPD/curl-code (404 when
	 * none), writing a checkpoint into its -o file on a 200. */
	const char *stubs[][2] = {
		{"srun", srun_body},
		{"scancel", "echo scancel \"$@\" >>\"$LOG\"; kill -USR1 $(cat \"$TMPD/worker.pid\")"},
		{"scontrol", "echo scontrol \"$@\" >>\"$LOG\""},
		{"curl",
		 "echo curl \"$@\" >>\"$LOG\"; code=$(cat \"$TMPD/curl-code\" 2>/dev/null || echo 404);"
		 " while [ $# -gt 0 ]; do [ \"$1\" = -o ] && o=$2; [ \"$1\" = -H ] && cp \"${2#@}\" \"$TMPD/header\";"
		 " shift; done; [ \"$code\" = 200 ] && echo fetched >\"$o\"; printf %s \"$code\""}};
	for (int i = 0; i < 4; i++) {
		snprintf(path, sizeof path, "%s/bin/%s", tmp, stubs[i][0]);
		FILE *f = fopen(path, "w");
		fprintf(f, "#!/bin/bash\n%s\n", stubs[i][1]);
		fclose(f);
		chmod(path, 0755);
	}
	snprintf(path, sizeof path, "%s/job.sh", tmp);
	char bin[512];
	snprintf(bin, sizeof bin, "%s/bin", tmp);
	cr_assert_eq(tr_slurm_write_script(path, 7, tmp, "/opt/trainerd", bin, report_url), 0);
	snprintf(cmd, sizeof cmd, "rm -f %s/checkpoint.safetensors %s/spec.json %s/log; %s", tmp, tmp, tmp,
		 checkpoint ? "" : "true");
	if (checkpoint)
		snprintf(cmd + strlen(cmd), sizeof cmd - strlen(cmd), "touch %s/checkpoint.safetensors %s/spec.json",
			 tmp, tmp);
	cr_assert_eq(system(cmd), 0);
	/* The batch shell's pid in shell.pid, for a stub to signal. */
	snprintf(cmd, sizeof cmd,
		 "cd %s && rm -f shell.pid && { PATH=$PWD/bin:$PATH SLURM_JOB_ID=41 TMPD=%s LOG=%s/log bash %s/job.sh "
		 ">%s/out 2>&1 & "
		 "echo $! >shell.pid.tmp; mv shell.pid.tmp shell.pid; wait $!; echo $? >>%s/log; }",
		 tmp, tmp, tmp, tmp, tmp, tmp);
	system(cmd);
	snprintf(path, sizeof path, "%s/log", tmp);
	FILE *f = fopen(path, "r");
	static char buf[4096];
	size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
	buf[n] = 0;
	if (f)
		fclose(f);
	return buf;
}

Test(slurm, batch_script_starts_resumes_and_requeues_after_usr1)
{
	char tmp[] = "/tmp/tr-slurm-XXXXXX";
	cr_assert_not_null(mkdtemp(tmp));
	/* A first start runs the spec into the folder. */
	char *log = run_script(tmp, false, "echo srun \"$@\" >>\"$LOG\"");
	cr_expect_not_null(strstr(log, "srun --kill-on-bad-exit=1 /opt/trainerd run "), "%s", log);
	cr_expect_not_null(strstr(log, "/job.json --out "), "%s", log);
	cr_expect_null(strstr(log, "scontrol"), "%s", log);
	cr_expect_null(strstr(log, "--mpi"), "one task needs no MPI plugin: %s", log);
	cr_expect_null(strstr(log, "--report"), "no report URL, no reports: %s", log);
	/* Several tasks are ranks that Open MPI starts through PMIx. */
	setenv("SLURM_NTASKS", "2", 1);
	log = run_script(tmp, false, "echo srun \"$@\" >>\"$LOG\"");
	cr_expect_not_null(strstr(log, "srun --kill-on-bad-exit=1 --mpi=pmix /opt/trainerd run "), "%s", log);
	setenv("TRAINERD_SLURM_MPI", "pmi2", 1);
	log = run_script(tmp, false, "echo srun \"$@\" >>\"$LOG\"");
	cr_expect_not_null(strstr(log, "srun --kill-on-bad-exit=1 --mpi=pmi2 /opt/trainerd run "), "%s", log);
	unsetenv("TRAINERD_SLURM_MPI");
	unsetenv("SLURM_NTASKS");
	/* With a checkpoint it resumes. */
	log = run_script(tmp, true, "echo srun \"$@\" >>\"$LOG\"");
	cr_expect_not_null(strstr(log, "run --resume "), "%s", log);
	/* USR1 to the shell: passed on with scancel, the worker stops
	 * ("stopped" summary), then the job is requeued. */
	/* The worker stub: as Slurm before a time limit, it signals the
	 * batch shell, then waits for the USR1 that scancel passes on. */
	const char *worker =
		"echo $$ >\"$TMPD/worker.pid\"; stop=0; trap stop=1 USR1;"
		" for i in $(seq 50); do [ -s \"$TMPD/shell.pid\" ] && break; sleep 0.05; done;"
		" kill -USR1 $(cat \"$TMPD/shell.pid\");"
		" for i in $(seq 100); do [ $stop = 1 ] && break; sleep 0.05; done;"
		" echo '{\"state\": \"stopped\"}' >\"$TMPD/summary.json\"; echo worker-stopped-$stop >>\"$LOG\"";
	char cmd[600];
	snprintf(cmd, sizeof cmd, "rm -f %s/worker.pid %s/summary.json", tmp, tmp);
	cr_assert_eq(system(cmd), 0);
	log = run_script(tmp, false, worker);
	cr_expect_not_null(strstr(log, "scancel --signal=USR1 41"), "%s", log);
	cr_expect_not_null(strstr(log, "worker-stopped-1"), "%s", log);
	cr_expect_not_null(strstr(log, "scontrol requeue 41"), "%s", log);
	/* It says how long the worker took from USR1 to its end (the lead
	 * S must cover that). */
	snprintf(cmd, sizeof cmd, "grep -Eq 'checkpointed for the time limit in [0-9]+\\.[0-9]{2} s after USR1' %s/out",
		 tmp);
	cr_expect_eq(system(cmd), 0, "the script's output does not give the time from USR1 to the worker's end");
	snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
	system(cmd);
}

#define TOKEN "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

/* With a report URL the node need not see the job's folder: the script
 * carries the spec and the token into a private folder of its own on the
 * node, fetches the job's checkpoint from the daemon with the token (a
 * header file, never an argument) and resumes from it when there is one;
 * the folder is gone at exit, and the script is 0600. */
/* The node-local folder the worker ran in, which the stand-in srun
 * wrote to TMP/local; log is the script's, for the message. */
static void worker_folder(const char *tmp, const char *log, char *local, size_t n)
{
	char path[256];
	snprintf(path, sizeof path, "%s/local", tmp);
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f, "the worker did not run: %s", log);
	cr_assert(fgets(local, (int)n, f));
	fclose(f);
	local[strcspn(local, "\n")] = 0;
}

Test(slurm, batch_script_with_a_report_url_runs_in_a_node_local_folder)
{
	char tmp[] = "/tmp/tr-slurm-XXXXXX", path[600], cmd[1200];
	cr_assert_not_null(mkdtemp(tmp));
	snprintf(path, sizeof path, "%s/job.json", tmp);
	FILE *f = fopen(path, "w");
	fputs("{\"name\": \"it's $HOME `x`\"}\n", f);
	fclose(f);
	snprintf(path, sizeof path, "%s/report.token", tmp);
	f = fopen(path, "w");
	fputs(TOKEN "\n", f);
	fclose(f);
	chmod(path, 0600);
	/* The worker stub logs its arguments and the spec and token it finds. */
	const char *worker =
		"echo srun \"$@\" >>\"$LOG\"; for a; do case $a in */report.token) cat \"$a\" >>\"$LOG\";;"
		" */job.json) cat \"$a\" >>\"$LOG\"; echo \"${a%/job.json}\" >\"$TMPD/local\";; esac; done";
	report_url = "https://head:8443/";
	char *log = run_script(tmp, false, worker);
	cr_expect_not_null(strstr(log, "curl "), "%s", log);
	cr_expect_not_null(strstr(log, " https://head:8443/jobs/7/report/checkpoint.safetensors"), "%s", log);
	cr_expect_not_null(strstr(log, " --report-url https://head:8443/jobs/7/report --report-token-file "), "%s",
			   log);
	cr_expect_not_null(strstr(log, "{\"name\": \"it's $HOME `x`\"}"), "the spec, verbatim: %s", log);
	/* No checkpoint on the daemon (404): a first start, into the node's
	 * folder, not the daemon's. */
	cr_expect_not_null(strstr(log, "/job.json --out "), "%s", log);
	char local[300];
	worker_folder(tmp, log, local, sizeof local);
	cr_expect_neq(strncmp(local, tmp, strlen(tmp)), 0, "the worker runs in the daemon's folder %s", local);
	cr_expect_eq(access(local, F_OK), -1, "%s is not removed at exit", local);
	/* The token reached the worker's file and curl's header file, never
	 * an argument. */
	cr_expect_not_null(strstr(log, TOKEN "\n"), "%s", log);
	cr_expect_not_null(strstr(log, "curl "), "%s", log);
	for (const char *line = log; *line; line += strcspn(line, "\n") + (line[strcspn(line, "\n")] != 0)) {
		size_t len = strcspn(line, "\n");
		bool command = !strncmp(line, "curl ", 5) || !strncmp(line, "srun ", 5);
		cr_expect(!command || !memmem(line, len, TOKEN, strlen(TOKEN)), "the token is on a command line: %.*s",
			  (int)len, line);
	}
	snprintf(cmd, sizeof cmd, "grep -qx 'Authorization: Bearer " TOKEN "' %s/header", tmp);
	cr_expect_eq(system(cmd), 0, "curl did not get the token as a header file");
	struct stat sb;
	snprintf(path, sizeof path, "%s/job.sh", tmp);
	cr_assert_eq(stat(path, &sb), 0);
	cr_expect_eq(sb.st_mode & 0777, 0600, "the script holds the token: %o", sb.st_mode & 0777);
	/* A checkpoint on the daemon (200): the worker resumes from it. */
	snprintf(cmd, sizeof cmd, "echo 200 >%s/curl-code", tmp);
	cr_assert_eq(system(cmd), 0);
	log = run_script(tmp, false, worker);
	cr_expect_not_null(strstr(log, "run --resume /"), "%s", log);
	cr_expect_null(strstr(log, " --out "), "%s", log);
	/* TERM to the batch shell (a requeue): it waits for the worker, which
	 * checkpoints and uploads from the folder, and removes it after, also
	 * when a task outlives srun. */
	const char *termed = "for a; do case $a in */job.json) l=${a%/job.json};; esac; done;"
			     " for i in $(seq 50); do [ -s \"$TMPD/shell.pid\" ] && break; sleep 0.05; done;"
			     " kill -TERM $(cat \"$TMPD/shell.pid\"); sleep 0.5;"
			     " [ -d \"$l\" ] && echo folder-kept >>\"$LOG\"; echo \"$l\" >\"$TMPD/local\";"
			     " bash -c 'sleep 0.6; [ -d \"$1\" ] && echo late-kept >>\"$LOG\"' x \"$l/\" &";
	log = run_script(tmp, false, termed);
	cr_expect_not_null(strstr(log, "folder-kept\n"), "the shell ended under its worker: %s", log);
	/* A task that outlives srun (as after a requeue's TERM) keeps it too. */
	cr_expect_not_null(strstr(log, "late-kept\n0\n"), "the folder went under a task still in it: %s", log);
	worker_folder(tmp, log, local, sizeof local);
	cr_expect_eq(access(local, F_OK), -1, "%s is not removed at exit", local);
	/* The daemon does not answer: the job fails, saying why, and no
	 * worker starts from the beginning as if nothing had been lost. */
	snprintf(cmd, sizeof cmd, "echo 000 >%s/curl-code", tmp);
	cr_assert_eq(system(cmd), 0);
	log = run_script(tmp, false, worker);
	cr_expect_null(strstr(log, "srun"), "%s", log);
	cr_expect_not_null(strstr(log, "\n1\n"), "the script's exit status: %s", log);
	snprintf(cmd, sizeof cmd,
		 "grep -q 'cannot fetch the job.s checkpoint from https://head:8443/jobs/7/report' %s/out", tmp);
	cr_expect_eq(system(cmd), 0, "the script does not say why it failed");
	/* A folder without the token file: no script. */
	snprintf(path, sizeof path, "%s/report.token", tmp);
	unlink(path);
	snprintf(path, sizeof path, "%s/job.sh", tmp);
	cr_expect_lt(tr_slurm_write_script(path, 7, tmp, "/opt/trainerd", NULL, report_url), 0);
	report_url = NULL;
	snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
	system(cmd);
}

static struct tr_slurm_job_state job_state(const char *state, int restarts)
{
	struct tr_slurm_job_state st = {.restarts = restarts};
	snprintf(st.state, sizeof st.state, "%s", state);
	snprintf(st.reason, sizeof st.reason, "BeginTime");
	return st;
}

Test(slurm, held_after_requeue_is_preempted)
{
	struct tr_slurm_job_state st = job_state("PENDING", 1);
	cr_expect(tr_slurm_held_after_requeue(&st));
	st = job_state("REQUEUED", 2);
	cr_expect(tr_slurm_held_after_requeue(&st));
	st = job_state("REQUEUE_HOLD", 1);
	cr_expect(tr_slurm_held_after_requeue(&st));
	/* Pending before any start is waiting, not preempted. */
	st = job_state("PENDING", 0);
	cr_expect_not(tr_slurm_held_after_requeue(&st));
	/* Started again, or ending for good after a restart. */
	st = job_state("RUNNING", 1);
	cr_expect_not(tr_slurm_held_after_requeue(&st));
	st = job_state("COMPLETING", 1);
	cr_expect_not(tr_slurm_held_after_requeue(&st));
	st = job_state("COMPLETED", 1);
	cr_expect_not(tr_slurm_held_after_requeue(&st));
}

/* A checkpoint file with this header JSON and some bytes of data. */
static void write_checkpoint(const char *dir, const char *header)
{
	char path[512];
	snprintf(path, sizeof path, "%s/checkpoint.safetensors", dir);
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f);
	uint64_t n = strlen(header);
	for (int i = 0; i < 8; i++)
		fputc((int)(n >> (8 * i) & 0xff), f);
	fputs(header, f);
	fputs("12345678", f);
	fclose(f);
}

Test(slurm, checkpoint_step_from_the_header)
{
	char tmp[] = "/tmp/tr-slurm-ckpt-XXXXXX";
	cr_assert_not_null(mkdtemp(tmp));
	cr_expect_eq(tr_slurm_checkpoint_step(tmp), -1);
	write_checkpoint(tmp, "{\"__metadata__\":{\"step\":\"150\",\"epoch\":\"2\"},\"w\":{}}");
	cr_expect_eq(tr_slurm_checkpoint_step(tmp), 150);
	write_checkpoint(tmp, "{\"__metadata__\":{\"step\":\"15x\"}}");
	cr_expect_eq(tr_slurm_checkpoint_step(tmp), -1);
	write_checkpoint(tmp, "not json");
	cr_expect_eq(tr_slurm_checkpoint_step(tmp), -1);
	char cmd[600];
	snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
	system(cmd);
}

Test(slurm, preemption_record_names_slurm)
{
	struct tr_slurm_job_state st = job_state("PENDING", 1);
	char *text = tr_slurm_preemption_json("41", &st, 3, 150, "2026-01-02T03:04:05Z");
	cr_assert_not_null(text);
	json_t *o = json_loads(text, 0, NULL);
	cr_assert_not_null(o, "%s", text);
	cr_expect_str_eq(json_string_value(json_object_get(o, "by")), "slurm");
	cr_expect_eq(json_integer_value(json_object_get(o, "priority")), 3);
	cr_expect_eq(json_integer_value(json_object_get(o, "step")), 150);
	cr_expect_str_eq(json_string_value(json_object_get(o, "mode")), "checkpoint");
	cr_expect_str_eq(json_string_value(json_object_get(o, "at")), "2026-01-02T03:04:05Z");
	cr_expect_str_eq(json_string_value(json_object_get(o, "slurm_job_id")), "41");
	cr_expect_eq(json_integer_value(json_object_get(o, "restarts")), 1);
	cr_expect_str_eq(json_string_value(json_object_get(o, "reason")), "BeginTime");
	const char *m = json_string_value(json_object_get(o, "message"));
	cr_expect_not_null(strstr(m, "preempted by Slurm: Slurm job 41 was requeued"), "%s", m);
	cr_expect_not_null(strstr(m, "after step 150"), "%s", m);
	cr_expect_null(json_object_get(o, "by_priority"));
	json_decref(o);
	free(text);
	/* Requeued before its first checkpoint: its steps are lost. */
	text = tr_slurm_preemption_json("41", &st, 0, -1, "2026-01-02T03:04:05Z");
	o = json_loads(text, 0, NULL);
	cr_expect_str_eq(json_string_value(json_object_get(o, "mode")), "hard");
	cr_expect_eq(json_integer_value(json_object_get(o, "step")), 0);
	cr_expect_not_null(strstr(json_string_value(json_object_get(o, "message")), "from step 0"));
	json_decref(o);
	free(text);
}
