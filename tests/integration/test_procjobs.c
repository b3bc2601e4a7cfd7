/* Jobs of several processes run by the daemon (docs/design.md,
 * "Multi-process jobs"), with a real daemon of 2 CPU devices: a job with
 * "processes": 2 runs as `mpirun -n 2 trainerd run` in its folder
 * STATE_DIR/procs/job-ID, ends with the bits of the same job on one
 * process, restarts from its checkpoint when a rank is killed (and still
 * ends with those bits), fails naming the rank once max_restarts is spent,
 * and is cancelled, paused and resumed through the API like any job; a
 * daemon killed under it leaves no process behind once the job is run
 * again.  Open MPI's settings for running as root and for more ranks than
 * cores are set in this test's environment only (the daemon inherits
 * them).  Skipped in a build without the MPI module or without mpirun. */
#include <criterion/criterion.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

/* An MLP on synthetic data, exact mode: 640 samples / 32 = 20 steps an
 * epoch, 4 epochs = 80 steps, a checkpoint every 10.  The loader sleeps
 * (load_cost_us), so a run takes a few seconds of wall time but little
 * CPU.  Jobs compared share their name (the checkpoint's metadata holds a
 * hash of the spec). */
#define STEPS 80
#define JOB_FMT                                                                                                 \
	"{\"name\": \"procs\", \"seed\": 11, \"exact\": true, \"model\": {\"layers\": [{\"type\": \"dense\","   \
	" \"units\": 16}, {\"type\": \"relu\"}, {\"type\": \"dense\", \"units\": 4}]},"                         \
	" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 640, \"features\": 8, \"classes\": 4," \
	" \"load_cost_us\": %d}, \"shuffle\": true}, \"batch_size\": 32, \"epochs\": 4,"                        \
	" \"optimizer\": {\"type\": \"adamw\", \"lr\": 0.01}, \"checkpoint\": {\"every_steps\": 10},"           \
	" \"devices\": 1%s}"

static struct daemon d;

static const char *job(int load_cost_us, const char *extra)
{
	static char out[2][2048];
	static int next;
	char *slot = out[next++ % 2];
	snprintf(slot, sizeof out[0], JOB_FMT, load_cost_us, extra ? extra : "");
	return slot;
}

/* Whether this build can run several processes; the reason when not. */
static const char *cannot_run(void)
{
	const char *bin = getenv("TR_TRAINERD");
	static char path[PATH_MAX];
	if (!bin)
		return "TR_TRAINERD is not set";
	snprintf(path, sizeof path, "%s", bin);
	char module[PATH_MAX + 32];
	snprintf(module, sizeof module, "%s/trainerd-mpi.so", dirname(path));
	if (access(module, R_OK) != 0)
		return "this build has no MPI module (trainerd-mpi.so; libopenmpi-dev)";
	if (system("command -v mpirun >/dev/null 2>&1") != 0)
		return "no mpirun (openmpi-bin)";
	return NULL;
}

/* name=value appended to a ':'-separated variable, as sanitizers read it */
static void append_env(const char *name, const char *value)
{
	const char *old = getenv(name);
	char buf[2048];
	snprintf(buf, sizeof buf, "%s%s%s", old && *old ? old : "", old && *old ? ":" : "", value);
	setenv(name, buf, 1);
}

static void setup(void)
{
	const char *why = cannot_run();
	if (why)
		cr_skip_test("multi-process jobs: %s", why);
	setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
	setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
	setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 1);
	/* shared memory between ranks of one machine; no network probing */
	setenv("OMPI_MCA_btl", "self,vader", 1);
	setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 1);
	/* Under AddressSanitizer: Open MPI's allocations that outlive
	 * MPI_Finalize are suppressed by library (tests/lsan.supp), which
	 * needs its components kept loaded and full stacks (as in
	 * tests/e2e/processes_bits.sh).  No effect otherwise. */
	setenv("OMPI_MCA_mca_base_component_disable_dlclose", "1", 1);
	setenv("PMIX_MCA_mca_base_component_disable_dlclose", "1", 1);
	append_env("ASAN_OPTIONS", "fast_unwind_on_malloc=0");
	append_env("LSAN_OPTIONS", "fast_unwind_on_malloc=0");
	daemon_start(&d, 2, NULL);
}

static void teardown(void)
{
	daemon_cleanup(&d);
}

static json_t *job_json(long long id)
{
	return get_job_json(&d, id);
}

static long long progress_step(long long id)
{
	json_t *j = job_json(id);
	long long step = json_integer_value(json_object_get(json_object_get(j, "progress"), "step"));
	json_decref(j);
	return step;
}

/* Waits until job id has made at least `step` steps (running). */
static void wait_step(long long id, long long step, double timeout_s)
{
	double until = now_s() + timeout_s * TR_TEST_SLOW;
	long long at = 0;
	while (now_s() < until && (at = progress_step(id)) < step)
		usleep(50 * 1000);
	cr_assert_geq(at, step, "job %lld is at step %lld after %.0f s, waiting for %lld", id, at, timeout_s, step);
}

static void post(long long id, const char *op)
{
	char path[96];
	snprintf(path, sizeof path, "/jobs/%lld/%s", id, op);
	struct http_reply r;
	http(&d, "POST", path, NULL, NULL, NULL, &r);
	cr_assert(r.status >= 200 && r.status < 300, "POST %s: %ld %s", path, r.status, r.body);
	http_free(&r);
}

static const char *info(json_t *j, const char *key)
{
	const char *v = json_string_value(json_object_get(json_object_get(j, "info"), key));
	return v ? v : "";
}

static const char *sha256_of(const char *file)
{
	static char out[2][65];
	static int next;
	char *sha = out[next++ % 2];
	char cmd[400], line[256] = "";
	snprintf(cmd, sizeof cmd, "sha256sum '%s'", file);
	FILE *p = popen(cmd, "r");
	cr_assert_not_null(p);
	cr_assert_not_null(fgets(line, sizeof line, p), "sha256sum %s", file);
	pclose(p);
	memcpy(sha, line, 64);
	sha[64] = 0;
	return sha;
}

/* Downloads job id's final weights into FILE (d.dir/final-ID.safetensors). */
static const char *download_final(long long id)
{
	static char file[2][256];
	static int next;
	char *f = file[next++ % 2], path[96];
	snprintf(path, sizeof path, "/jobs/%lld/checkpoints/latest/model.safetensors", id);
	snprintf(f, sizeof file[0], "%s/final-%lld.safetensors", d.dir, id);
	cr_assert_eq(http_download(&d, path, f, NULL), 200, "GET %s", path);
	return f;
}

/* The final weights' SHA-256 (static buffer). */
static const char *final_sha(long long id)
{
	return sha256_of(download_final(id));
}

/* A safetensors file's tensor data (after its header), malloc'd. */
static unsigned char *tensor_data(const char *file, size_t *len)
{
	FILE *f = fopen(file, "rb");
	cr_assert_not_null(f, "%s", file);
	unsigned char head[8];
	cr_assert_eq(fread(head, 1, 8, f), 8u);
	uint64_t n = 0;
	for (int i = 7; i >= 0; i--)
		n = n << 8 | head[i];
	fseek(f, 0, SEEK_END);
	long size = ftell(f);
	cr_assert(size >= 8 && n <= (uint64_t)size - 8, "%s: not safetensors", file);
	*len = (size_t)size - 8 - (size_t)n;
	unsigned char *buf = malloc(*len + 1);
	fseek(f, (long)(8 + n), SEEK_SET);
	cr_assert_eq(fread(buf, 1, *len, f), *len);
	fclose(f);
	return buf;
}

/* The session of the job's group (its launcher's pid), from its folder. */
static int group_session(long long id)
{
	char path[256];
	snprintf(path, sizeof path, "%s/procs/job-%lld/launcher.pid", d.dir, id);
	int sid = 0;
	for (int i = 0; i < 100 && sid <= 0; i++) {
		FILE *f = fopen(path, "r");
		if (f) {
			if (fscanf(f, "%d", &sid) != 1)
				sid = 0;
			fclose(f);
		}
		if (sid <= 0)
			usleep(50 * 1000);
	}
	cr_assert_gt(sid, 0, "no %s", path);
	return sid;
}

/* The live processes of session sid named `comm` ("" = any), up to max. */
static int session_procs(int sid, const char *comm, int *pids, int max)
{
	DIR *dir = opendir("/proc");
	cr_assert_not_null(dir);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(dir)) != NULL && n < max) {
		if (!isdigit((unsigned char)e->d_name[0]))
			continue;
		char path[300], buf[512];
		snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
		FILE *f = fopen(path, "r");
		if (!f)
			continue;
		size_t len = fread(buf, 1, sizeof buf - 1, f);
		fclose(f);
		buf[len] = 0;
		char *open = strchr(buf, '('), *close = strrchr(buf, ')');
		char state;
		int ppid, pgrp, session;
		if (!open || !close || sscanf(close + 1, " %c %d %d %d", &state, &ppid, &pgrp, &session) != 4 ||
		    session != sid || state == 'Z')
			continue;
		*close = 0;
		if (!comm[0] || !strcmp(open + 1, comm))
			pids[n++] = atoi(e->d_name);
	}
	closedir(dir);
	return n;
}

/* Waits (bounded) until session sid has no live process. */
static void assert_group_gone(int sid, double timeout_s)
{
	int pids[16], n = 0;
	double until = now_s() + timeout_s;
	while ((n = session_procs(sid, "", pids, 16)) > 0 && now_s() < until)
		usleep(50 * 1000);
	cr_assert_eq(n, 0, "%d process(es) of the group (session %d) still run, e.g. pid %d", n, sid, n ? pids[0] : 0);
}

/* SIGKILL to one rank (the second found) of the job's group. */
static void kill_one_rank(long long id)
{
	int sid = group_session(id), pids[16], n = 0;
	double until = now_s() + 10;
	while ((n = session_procs(sid, "trainerd", pids, 16)) < 2 && now_s() < until)
		usleep(50 * 1000);
	cr_assert_eq(n, 2, "job %lld: %d ranks found in session %d", id, n, sid);
	cr_assert_eq(kill(pids[1], SIGKILL), 0);
}

/* Whether job id's log has a line holding `text`. */
static bool log_has(long long id, const char *text)
{
	char path[96];
	snprintf(path, sizeof path, "/jobs/%lld/logs?limit=1000", id);
	struct http_reply r;
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200, "GET %s: %ld", path, r.status);
	bool found = false;
	size_t i;
	json_t *line;
	json_array_foreach(json_object_get(r.json, "logs"), i, line) {
		const char *m = json_string_value(json_object_get(line, "message"));
		found = found || (m && strstr(m, text));
	}
	http_free(&r);
	return found;
}

static const char *error_message(json_t *j)
{
	const char *m = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
	return m ? m : "";
}

/* Restarts the daemon with TRAINERD_MPIRUN naming a launcher script
 * `name` (in the daemon's folder) whose text is `script`. */
static void restart_with_launcher(const char *name, const char *script)
{
	char wrapper[256];
	snprintf(wrapper, sizeof wrapper, "%s/%s", d.dir, name);
	FILE *f = fopen(wrapper, "w");
	cr_assert_not_null(f);
	fputs(script, f);
	fclose(f);
	cr_assert_eq(chmod(wrapper, 0755), 0);
	int status = 0;
	daemon_stop(&d, &status);
	setenv("TRAINERD_MPIRUN", wrapper, 1);
	daemon_restart(&d, 2, NULL);
	unsetenv("TRAINERD_MPIRUN");
}

TestSuite(procjobs, .init = setup, .fini = teardown, .timeout = 240);

/* 2 processes x 1 device give the bits of 1 process x 1 device: the
 * weights served are `trainerd run`'s model.safetensors on one process,
 * byte for byte (as for a Slurm job), and their tensors those of the job
 * run in the daemon itself.  A spec the daemon cannot run is refused
 * naming the field. */
Test(procjobs, two_processes_give_the_bits_of_one)
{
	char spec[256], out[256], cmd[1200];
	snprintf(spec, sizeof spec, "%s/job.json", d.dir);
	snprintf(out, sizeof out, "%s/local", d.dir);
	FILE *f = fopen(spec, "w");
	cr_assert_not_null(f);
	fputs(job(0, ""), f);
	fclose(f);
	snprintf(cmd, sizeof cmd, "'%s' run '%s' --out '%s' --backend cpu --quiet", getenv("TR_TRAINERD"), spec, out);
	cr_assert_eq(system(cmd), 0, "%s", cmd);
	strcat(out, "/model.safetensors");

	long long one = submit_job(&d, job(0, ""));
	cr_assert_str_eq(wait_state(&d, one, "completed|failed|cancelled", 60 * TR_TEST_SLOW), "completed");
	long long two = submit_job(&d, job(0, ", \"processes\": 2"));
	const char *state = wait_state(&d, two, "completed|failed|cancelled", 90 * TR_TEST_SLOW);
	json_t *j = job_json(two);
	cr_assert_str_eq(state, "completed", "job %lld: %s", two, error_message(j));
	cr_assert_str_eq(info(j, "process_restarts"), "0");
	cr_assert_eq(json_integer_value(json_object_get(json_object_get(j, "progress"), "step")), STEPS);
	/* From the worker's plan.json (metrics.jsonl does not say it). */
	cr_assert_eq(json_integer_value(json_object_get(json_object_get(j, "progress"), "total_steps")), STEPS, "%s",
		     json_dumps(json_object_get(j, "progress"), 0));
	json_decref(j);
	const char *served = download_final(two);
	cr_assert_str_eq(sha256_of(served), sha256_of(out),
			 "2 processes in the daemon and `trainerd run` on 1 process end with different weights");
	size_t la, lb;
	unsigned char *a = tensor_data(served, &la), *b = tensor_data(download_final(one), &lb);
	cr_assert(la == lb && memcmp(a, b, la) == 0, "the tensors of 2 processes and of 1 in the daemon differ");
	free(a);
	free(b);

	struct http_reply r;
	http(&d, "POST", "/jobs", job(0, ", \"processes\": 3"), NULL, NULL, &r);
	cr_assert_eq(r.status, 422, "3 processes of 1 device on 2 devices: %ld %s", r.status, r.body);
	cr_assert(strstr(r.body, "/processes"), "%s", r.body);
	http_free(&r);
	http(&d, "POST", "/jobs", job(0, ", \"processes\": 2, \"max_restarts\": -1"), NULL, NULL, &r);
	cr_assert_eq(r.status, 400, "%ld %s", r.status, r.body);
	cr_assert(strstr(r.body, "/max_restarts"), "%s", r.body);
	http_free(&r);
}

/* SIGKILL of one rank mid-run: the group ends, the job restarts from its
 * last checkpoint and ends with the undisturbed run's bits; no process of
 * the killed group is left. */
Test(procjobs, a_killed_rank_restarts_the_group_from_its_checkpoint)
{
	long long ref = submit_job(&d, job(0, ", \"processes\": 2"));
	cr_assert_str_eq(wait_state(&d, ref, "completed|failed|cancelled", 90 * TR_TEST_SLOW), "completed");
	long long id = submit_job(&d, job(2000, ", \"processes\": 2"));
	wait_step(id, 25, 60);
	int sid = group_session(id);
	kill_one_rank(id);
	assert_group_gone(sid, 15);
	/* A daemon restart meanwhile keeps the count (it was shown as 0):
	 * once the group has restarted (the step seen before the kill may
	 * already be past any step to wait for). */
	double until = now_s() + 60 * TR_TEST_SLOW;
	while (!log_has(id, "resumed from its checkpoint as 2 process") && now_s() < until)
		usleep(100 * 1000);
	cr_assert(log_has(id, "resumed from its checkpoint as 2 process"), "the group did not restart");
	int status = 0;
	daemon_stop(&d, &status);
	daemon_restart(&d, 2, NULL);
	const char *state = wait_state(&d, id, "completed|failed|cancelled", 120 * TR_TEST_SLOW);
	json_t *j = job_json(id);
	cr_assert_str_eq(state, "completed", "job %lld: %s", id, error_message(j));
	cr_assert_str_eq(info(j, "process_restarts"), "1");
	json_decref(j);
	cr_assert(log_has(id, "restart 1 of 2") && log_has(id, "resumed from its checkpoint as 2 process"),
		  "no restart from the checkpoint logged");
	cr_assert_str_eq(final_sha(id), final_sha(ref),
			 "the restarted job's weights differ from the undisturbed run's");
}

/* max_restarts 0: the first failure fails the job, naming the rank and
 * how it died. */
Test(procjobs, max_restarts_spent_fails_naming_the_rank)
{
	long long id = submit_job(&d, job(2000, ", \"processes\": 2, \"max_restarts\": 0"));
	wait_step(id, 5, 60);
	int sid = group_session(id);
	kill_one_rank(id);
	const char *state = wait_state(&d, id, "completed|failed|cancelled", 30 * TR_TEST_SLOW);
	json_t *j = job_json(id);
	const char *msg = error_message(j);
	cr_assert_str_eq(state, "failed");
	cr_assert(strstr(msg, "rank 1") && strstr(msg, "signal 9"), "the error names no rank and cause: %s", msg);
	cr_assert_str_eq(info(j, "process_restarts"), "0");
	json_decref(j);
	assert_group_gone(sid, 10);
}

/* A rank that hangs (SIGSTOP) ends the group once no step has finished
 * for collective_timeout_s, the stopped rank included; with max_restarts
 * 0 the job fails naming the timeout. */
Test(procjobs, a_hung_rank_ends_the_group_within_collective_timeout_s)
{
	long long id =
		submit_job(&d, job(2000, ", \"processes\": 2, \"max_restarts\": 0, \"collective_timeout_s\": 2"));
	wait_step(id, 5, 60);
	int sid = group_session(id), pids[16], n = session_procs(sid, "trainerd", pids, 16);
	cr_assert_eq(n, 2, "%d ranks", n);
	cr_assert_eq(kill(pids[1], SIGSTOP), 0);
	double stopped_at = now_s();
	const char *state = wait_state(&d, id, "completed|failed|cancelled", 30 * TR_TEST_SLOW);
	double took = now_s() - stopped_at;
	json_t *j = job_json(id);
	const char *msg = error_message(j);
	cr_assert_str_eq(state, "failed", "job %lld: %s", id, msg);
	cr_assert(strstr(msg, "collective_timeout_s"), "the error does not name the timeout: %s", msg);
	json_decref(j);
	cr_assert_lt(took, 2 + 8 * TR_TEST_SLOW, "the group took %.1f s to end", took);
	assert_group_gone(sid, 5);
}

/* Cancel ends the whole group; pause checkpoints every rank at one step,
 * and resume continues from it to the undisturbed run's bits. */
Test(procjobs, cancel_pause_and_resume_through_the_api)
{
	/* Slow enough that the group would run on for a minute. */
	long long id = submit_job(&d, job(20000, ", \"processes\": 2"));
	wait_step(id, 2, 60);
	int sid = group_session(id);
	post(id, "cancel");
	cr_assert_str_eq(wait_state(&d, id, "cancelled|completed|failed", 20 * TR_TEST_SLOW), "cancelled");
	assert_group_gone(sid, 5);

	long long ref = submit_job(&d, job(0, ", \"processes\": 2"));
	cr_assert_str_eq(wait_state(&d, ref, "completed|failed|cancelled", 90 * TR_TEST_SLOW), "completed");
	id = submit_job(&d, job(2000, ", \"processes\": 2"));
	wait_step(id, 15, 60);
	sid = group_session(id);
	post(id, "pause");
	const char *state = wait_state(&d, id, "paused|completed|failed|cancelled", 30 * TR_TEST_SLOW);
	json_t *j = job_json(id);
	cr_assert_str_eq(state, "paused", "job %lld: %s", id, error_message(j));
	long long at = json_integer_value(json_object_get(json_object_get(j, "progress"), "step"));
	json_decref(j);
	cr_assert(at >= 15 && at < STEPS, "paused at step %lld", at);
	assert_group_gone(sid, 10);
	post(id, "resume");
	state = wait_state(&d, id, "completed|failed|cancelled", 90 * TR_TEST_SLOW);
	j = job_json(id);
	cr_assert_str_eq(state, "completed", "job %lld: %s", id, error_message(j));
	json_decref(j);
	cr_assert_str_eq(final_sha(id), final_sha(ref), "the paused and resumed job's weights differ");
}

/* A job stopped between two logged steps (log_every_steps beyond its
 * end: metrics.jsonl has no loss yet) shows where it stopped, as its
 * worker's summary.json says, not step 0. */
Test(procjobs, a_stopped_job_shows_its_last_step_not_its_last_logged_one)
{
	long long id = submit_job(&d, job(20000, ", \"processes\": 2, \"log_every_steps\": 1000"));
	/* The worker writes plan.json at its first step. */
	char plan[PATH_MAX], summary[PATH_MAX];
	snprintf(plan, sizeof plan, "%s/procs/job-%lld/plan.json", d.dir, id);
	snprintf(summary, sizeof summary, "%s/procs/job-%lld/summary.json", d.dir, id);
	double until = now_s() + 60 * TR_TEST_SLOW;
	while (access(plan, F_OK) != 0 && now_s() < until)
		usleep(50 * 1000);
	cr_assert_eq(access(plan, F_OK), 0, "job %lld made no step", id);
	post(id, "stop");
	const char *state = wait_state(&d, id, "stopped|completed|failed|cancelled", 30 * TR_TEST_SLOW);
	json_t *j = job_json(id);
	cr_assert_str_eq(state, "stopped", "job %lld: %s", id, error_message(j));
	json_t *sum = json_load_file(summary, 0, NULL);
	cr_assert_not_null(sum, "%s", summary);
	long long steps = json_integer_value(json_object_get(sum, "steps"));
	cr_assert(steps > 0 && steps < STEPS, "the worker stopped at step %lld", steps);
	json_t *progress = json_object_get(j, "progress");
	char *text = json_dumps(progress, JSON_COMPACT);
	cr_assert_eq(json_integer_value(json_object_get(progress, "step")), steps, "%s", text);
	cr_assert_eq(json_integer_value(json_object_get(progress, "total_steps")), STEPS, "%s", text);
	cr_assert_eq(json_integer_value(json_object_get(progress, "epoch")),
		     json_integer_value(json_object_get(sum, "epochs")) - 1, "%s", text);
	/* Replies print 15 digits. */
	double loss = json_number_value(json_object_get(sum, "final_loss"));
	cr_assert(json_is_number(json_object_get(progress, "loss")) &&
			  fabs(json_number_value(json_object_get(progress, "loss")) - loss) <= 1e-13 * fabs(loss),
		  "%s; summary.json's final_loss %.17g", text, loss);
	free(text);
	json_decref(sum);
	json_decref(j);
}

/* A daemon killed (SIGKILL) under a running group: the group ends with it
 * (the launcher dies with the daemon), and the restarted daemon runs the
 * job again from its checkpoint.  A daemon stopped (SIGTERM) under one
 * has every rank checkpoint at one step and end before it exits; the next
 * resumes from there.  Nothing of either group is left running, and the
 * job ends with the undisturbed run's bits. */
Test(procjobs, a_daemon_killed_or_stopped_under_the_group_leaves_nothing_running)
{
	long long ref = submit_job(&d, job(0, ", \"processes\": 2"));
	cr_assert_str_eq(wait_state(&d, ref, "completed|failed|cancelled", 90 * TR_TEST_SLOW), "completed");
	/* Slow enough that the group would run on for 20 s or more. */
	long long id = submit_job(&d, job(8000, ", \"processes\": 2"));
	wait_step(id, 8, 60);
	int sid = group_session(id);
	daemon_kill(&d);
	assert_group_gone(sid, 5);
	daemon_restart(&d, 2, NULL);
	wait_step(id, 25, 60);
	int sid2 = group_session(id);
	cr_assert_neq(sid2, sid);
	int status = 0;
	daemon_stop(&d, &status);
	cr_assert_eq(status, 0, "the daemon exited %d", status);
	assert_group_gone(sid2, 1);
	daemon_restart(&d, 2, NULL);
	const char *state = wait_state(&d, id, "completed|failed|cancelled", 120 * TR_TEST_SLOW);
	json_t *j = job_json(id);
	cr_assert_str_eq(state, "completed", "job %lld: %s", id, error_message(j));
	json_decref(j);
	cr_assert_str_eq(final_sha(id), final_sha(ref), "the job's weights differ from the undisturbed run's");
	assert_group_gone(sid, 1);
	assert_group_gone(sid2, 1);
}

/* A group that outlives its daemon (here a launcher wrapper that ignores
 * the SIGTERM the daemon's death sends it) is ended by the next daemon
 * before it runs the job again, which then completes. */
Test(procjobs, a_group_left_by_a_killed_daemon_is_ended_at_restart)
{
	restart_with_launcher("mpirun-deaf", "#!/bin/bash\ntrap '' TERM\nmpirun \"$@\" &\nwait $!\n");
	long long id = submit_job(&d, job(8000, ", \"processes\": 2"));
	wait_step(id, 8, 60);
	int sid = group_session(id), pids[16];
	daemon_kill(&d);
	usleep(1000 * 1000);
	cr_assert_geq(session_procs(sid, "trainerd", pids, 16), 1, "the group did not outlive the daemon");
	daemon_restart(&d, 2, NULL);
	assert_group_gone(sid, 10);
	const char *state = wait_state(&d, id, "completed|failed|cancelled", 120 * TR_TEST_SLOW);
	json_t *j = job_json(id);
	cr_assert_str_eq(state, "completed", "job %lld: %s", id, error_message(j));
	json_decref(j);
	cr_assert(log_has(id, "were still running"), "the leftover group's end is not logged");
}

/* A launcher that refuses to start (here a stand-in that says what
 * Open MPI's mpirun says when run as root without its two variables)
 * fails the job with the remedy in words, not only the launcher's exit
 * status. */
Test(procjobs, a_launcher_refusing_root_is_named_with_its_remedy)
{
	restart_with_launcher("mpirun-root",
			      "#!/bin/sh\necho 'mpirun has detected an attempt to run as root.' >&2\nexit 1\n");
	long long id = submit_job(&d, job(0, ", \"processes\": 2, \"max_restarts\": 0"));
	const char *state = wait_state(&d, id, "completed|failed|cancelled", 60 * TR_TEST_SLOW);
	cr_assert_str_eq(state, "failed");
	json_t *j = job_json(id);
	const char *msg = error_message(j);
	cr_assert(strstr(msg, "OMPI_ALLOW_RUN_AS_ROOT=1") && strstr(msg, "launcher.out"),
		  "the error does not name the remedy: %s", msg);
	json_decref(j);
}
