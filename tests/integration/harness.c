/* Integration test harness (see harness.h): starting and stopping a real
 * daemon; HTTP goes through the shared client (tests/common/http_client.h). */
#include "harness.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

double now_s(void)
{
	return tr_test_now();
}

/* Every daemon this test process started and has not stopped, and every
 * state dir not yet cleaned up.  A failed assertion leaves its test
 * without running the daemon_cleanup at its end, and Criterion's worker
 * then exits: the atexit handler ends what is left here, by pid, and
 * removes the dirs.  A worker killed outright (a timeout, a crash) runs no
 * handler, so each daemon also asks the kernel to kill it when its parent
 * dies (PR_SET_PDEATHSIG).  One test per worker process; its threads
 * are HTTP clients that never start daemons, so no lock. */
#define MAX_LIVE 16
static pid_t live_pids[MAX_LIVE];
static char live_dirs[MAX_LIVE][128];
static bool reaper_registered;

/* The end of a left-over daemon's log, before its dir goes: the failed
 * test's evidence. */
static void dump_log_tail(const char *dir)
{
	char path[192], line[1024];
	snprintf(path, sizeof path, "%s/daemon.log", dir);
	FILE *f = fopen(path, "r");
	if (!f)
		return;
	long keep = 0;
	if (fseek(f, 0, SEEK_END) == 0 && (keep = ftell(f)) > 8192)
		fseek(f, keep - 8192, SEEK_SET);
	else
		rewind(f);
	fprintf(stderr, "---- end of the daemon log left in %s ----\n", dir);
	while (fgets(line, sizeof line, f))
		fputs(line, stderr);
	fclose(f);
}

static void reap_leftovers(void)
{
	bool left_running = false;
	for (int i = 0; i < MAX_LIVE; i++) {
		/* Only a child of this process still running: one that a test
		 * reaped itself is no longer ours (ECHILD), and its pid may be
		 * someone else's by now. */
		if (live_pids[i] > 0 && waitpid(live_pids[i], NULL, WNOHANG) == 0) {
			fprintf(stderr, "harness: ending daemon %d that the test left running\n", (int)live_pids[i]);
			kill(live_pids[i], SIGKILL);
			waitpid(live_pids[i], NULL, 0);
			left_running = true;
		}
		live_pids[i] = 0;
	}
	for (int i = 0; i < MAX_LIVE; i++) {
		if (live_dirs[i][0]) {
			if (left_running)
				dump_log_tail(live_dirs[i]);
			tr_test_rmtree(live_dirs[i]);
			live_dirs[i][0] = 0;
		}
	}
}

static void reaper_register(void)
{
	if (!reaper_registered && atexit(reap_leftovers) == 0)
		reaper_registered = true;
}

static void live_pid_add(pid_t pid)
{
	reaper_register();
	for (int i = 0; i < MAX_LIVE; i++) {
		if (live_pids[i] <= 0) {
			live_pids[i] = pid;
			return;
		}
	}
	/* More than MAX_LIVE at once: the death signal still covers it. */
}

static void live_pid_drop(pid_t pid)
{
	for (int i = 0; i < MAX_LIVE; i++)
		if (live_pids[i] == pid)
			live_pids[i] = 0;
}

static void live_dir_set(const char *dir, bool live)
{
	reaper_register();
	int free_slot = -1;
	for (int i = 0; i < MAX_LIVE; i++) {
		if (strcmp(live_dirs[i], dir) == 0) {
			if (!live)
				live_dirs[i][0] = 0;
			return;
		}
		if (!live_dirs[i][0] && free_slot < 0)
			free_slot = i;
	}
	if (live && free_slot >= 0)
		snprintf(live_dirs[free_slot], sizeof live_dirs[free_slot], "%s", dir);
}

static void spawn(struct daemon *d, int cpu_devices, const char *const *extra)
{
	const char *bin = getenv("TR_TRAINERD");
	cr_assert_not_null(bin, "TR_TRAINERD is not set (run through meson test)");
	char addr_file[192];
	snprintf(addr_file, sizeof addr_file, "%s/listen.addr", d->dir);
	unlink(addr_file);
	char devs[16];
	snprintf(devs, sizeof devs, "%d", cpu_devices);
	const char *argv[64] = {bin,         "serve",       "--listen",    "127.0.0.1:0",   "--state-dir",
				d->dir,      "--data-root", d->dir,        "--cpu-devices", devs,
				"--backend", "cpu",         "--log-level", "debug"};
	int argc = 14;
	for (int i = 0; extra && extra[i] && argc < 62; i++)
		argv[argc++] = extra[i];
	argv[argc] = NULL;
	pid_t parent = getpid();
	pid_t pid = fork();
	cr_assert_neq(pid, -1);
	if (pid == 0) {
		/* Killed with the test process, whatever ends it; a parent
		 * already gone before the prctl is checked for. */
		if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
			_exit(127);
		int fd = open(d->log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		execv(bin, (char *const *)argv);
		_exit(127);
	}
	d->pid = pid;
	live_pid_add(pid);
	/* 15 s; TSan's start-up of a daemon with jobs to recover took longer
	 * at a load of 20 on two cores. */
	double deadline = now_s() + 15 * TR_TEST_SLOW;
	while (now_s() < deadline) {
		FILE *f = fopen(addr_file, "r");
		if (f) {
			char line[128] = "";
			if (fgets(line, sizeof line, f)) {
				line[strcspn(line, "\n")] = 0;
				snprintf(d->base_url, sizeof d->base_url, "%s", line);
			}
			fclose(f);
			if (d->base_url[0])
				return;
		}
		int st;
		if (waitpid(pid, &st, WNOHANG) == pid) {
			daemon_dump_log(d);
			cr_assert_fail("trainerd exited during start-up (status %d)", st);
		}
		usleep(20000);
	}
	daemon_dump_log(d);
	cr_assert_fail("trainerd did not write %s within %d s", addr_file, 15 * TR_TEST_SLOW);
}

void daemon_start(struct daemon *d, int cpu_devices, const char *const *extra)
{
	memset(d, 0, sizeof *d);
	snprintf(d->dir, sizeof d->dir, "/tmp/trainerd-it-XXXXXX");
	cr_assert_not_null(mkdtemp(d->dir));
	live_dir_set(d->dir, true);
	snprintf(d->log_path, sizeof d->log_path, "%s/daemon.log", d->dir);
	spawn(d, cpu_devices, extra);
}

void daemon_restart(struct daemon *d, int cpu_devices, const char *const *extra)
{
	d->base_url[0] = 0;
	spawn(d, cpu_devices, extra);
}

double daemon_stop(struct daemon *d, int *status)
{
	double t0 = now_s();
	if (d->pid <= 0)
		return 0;
	kill(d->pid, SIGTERM);
	int st = 0;
	/* Bounded: after 20 s the test fails rather than hangs. */
	while (waitpid(d->pid, &st, WNOHANG) == 0) {
		if (now_s() - t0 > 20) {
			kill(d->pid, SIGKILL);
			waitpid(d->pid, &st, 0);
			break;
		}
		usleep(10000);
	}
	live_pid_drop(d->pid);
	d->pid = 0;
	if (status)
		*status = st;
	return now_s() - t0;
}

void daemon_kill(struct daemon *d)
{
	if (d->pid > 0) {
		kill(d->pid, SIGKILL);
		waitpid(d->pid, NULL, 0);
		live_pid_drop(d->pid);
	}
	d->pid = 0;
}

/* A sanitizer's report from the daemon lands in its log (its stderr),
 * which goes with the state dir: it is shown here, in the test's output,
 * where tests/run_tests.py (make test-asan, make test-tsan) counts it as a
 * failure. */
static void show_sanitizer_reports(const struct daemon *d)
{
	static const char *const marks[] = {"WARNING: ThreadSanitizer", "ERROR: AddressSanitizer",
					    "ERROR: LeakSanitizer", "runtime error:"};
	FILE *f = fopen(d->log_path, "r");
	char line[1024];
	bool found = false;
	if (!f)
		return;
	while (!found && fgets(line, sizeof line, f))
		for (size_t i = 0; i < sizeof marks / sizeof marks[0]; i++)
			found = found || strstr(line, marks[i]) != NULL;
	fclose(f);
	if (found)
		daemon_dump_log(d);
}

void daemon_cleanup(struct daemon *d)
{
	if (d->pid > 0)
		daemon_stop(d, NULL);
	if (d->log_path[0])
		show_sanitizer_reports(d);
	tr_test_rmtree(d->dir);
	live_dir_set(d->dir, false);
}

void daemon_dump_log(const struct daemon *d)
{
	FILE *f = fopen(d->log_path, "r");
	if (!f)
		return;
	char line[1024];
	fprintf(stderr, "---- daemon log (%s) ----\n", d->log_path);
	while (fgets(line, sizeof line, f))
		fputs(line, stderr);
	fclose(f);
}

void http(const struct daemon *d, const char *method, const char *path, const char *body, const char *content_type,
	  const char *extra_header, struct http_reply *r)
{
	char ct[160];
	const char *hdrs[3] = {NULL};
	int n = 0;
	if (body && content_type) {
		snprintf(ct, sizeof ct, "Content-Type: %s", content_type);
		hdrs[n++] = ct;
	}
	if (extra_header)
		hdrs[n++] = extra_header;
	struct tr_test_request rq = {.base_url = d->base_url,
				     .method = method,
				     .path = path,
				     .body = body,
				     .headers = hdrs,
				     .no_expect = true,
				     .timeout_s = 30};
	struct tr_test_reply tr;
	tr_test_http(&rq, &tr);
	http_reply_take(r, &tr);
}

void http_reply_take(struct http_reply *r, struct tr_test_reply *tr)
{
	memset(r, 0, sizeof *r);
	r->status = tr->status;
	r->body = tr->body.data ? tr->body.data : calloc(1, 1);
	r->len = tr->body.len;
	r->json = tr->json;
	/* Kept whole up to the array's size, as tests search it with strstr. */
	if (tr->headers.data)
		snprintf(r->headers, sizeof r->headers, "%.*s",
			 (int)(tr->headers.len < sizeof r->headers ? tr->headers.len : sizeof r->headers - 1),
			 tr->headers.data);
	free(tr->headers.data);
}

void http_free(struct http_reply *r)
{
	free(r->body);
	json_decref(r->json);
	memset(r, 0, sizeof *r);
}

long http_download(const struct daemon *d, const char *path, const char *file, size_t *len)
{
	struct http_reply r;
	http(d, "GET", path, NULL, NULL, NULL, &r);
	long status = r.status;
	if (len)
		*len = r.len;
	if (status == 200) {
		FILE *f = fopen(file, "wb");
		cr_assert_not_null(f, "cannot create %s: %s", file, strerror(errno));
		cr_assert_eq(fwrite(r.body, 1, r.len, f), r.len, "cannot write %s", file);
		cr_assert_eq(fclose(f), 0, "cannot write %s", file);
	}
	http_free(&r);
	return status;
}

long long submit_job(const struct daemon *d, const char *spec_json)
{
	struct http_reply r;
	http(d, "POST", "/jobs", spec_json, NULL, NULL, &r);
	cr_assert_eq(r.status, 201, "POST /jobs: %ld %s", r.status, r.body);
	long long id = json_integer_value(json_object_get(r.json, "id"));
	cr_assert_gt(id, 0);
	http_free(&r);
	return id;
}

json_t *get_job_json(const struct daemon *d, long long id)
{
	char path[64];
	struct http_reply r;
	snprintf(path, sizeof path, "/jobs/%lld", id);
	http(d, "GET", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	json_t *j = json_incref(r.json);
	http_free(&r);
	return j;
}

void job_info_and_loss(const struct daemon *d, long long id, const char *key, char *out, size_t n, double *loss)
{
	cr_assert_str_eq(wait_state(d, id, "completed|failed|cancelled", 120), "completed");
	json_t *j = get_job_json(d, id);
	const char *v = json_string_value(json_object_get(json_object_get(j, "info"), key));
	cr_assert(v, "job %lld has no info.%s", id, key);
	snprintf(out, n, "%s", v);
	json_t *l = json_object_get(json_object_get(j, "summary"), "loss");
	cr_assert(json_is_number(l), "job %lld has no summary.loss", id);
	*loss = json_number_value(l);
	json_decref(j);
}

const char *wait_state(const struct daemon *d, long long id, const char *states, double timeout_s)
{
	static char state[32];
	char path[64];
	snprintf(path, sizeof path, "/jobs/%lld", id);
	double deadline = now_s() + timeout_s;
	for (;;) {
		struct http_reply r;
		http(d, "GET", path, NULL, NULL, NULL, &r);
		const char *s = json_string_value(json_object_get(r.json, "state"));
		snprintf(state, sizeof state, "%s", s ? s : "?");
		http_free(&r);
		char want[256];
		snprintf(want, sizeof want, "|%s|", states);
		char probe[40];
		snprintf(probe, sizeof probe, "|%s|", state);
		if (strstr(want, probe) || now_s() > deadline)
			return state;
		usleep(20000);
	}
}

char *trainctl_output(const struct daemon *d, const char *args)
{
	const char *exe = getenv("TR_TRAINCTL");
	cr_assert_not_null(exe, "TR_TRAINCTL is not set");
	char cmd[1024];
	snprintf(cmd, sizeof cmd, "'%s' --url %s %s 2>&1", exe, d->base_url, args);
	FILE *p = popen(cmd, "r");
	cr_assert_not_null(p);
	size_t cap = 1 << 16, n = 0, got;
	char *out = malloc(cap);
	while (n + 1 < cap && (got = fread(out + n, 1, cap - 1 - n, p)) > 0)
		n += got;
	out[n] = 0;
	cr_assert_eq(pclose(p), 0, "trainctl %s: %s", args, out);
	return out;
}
