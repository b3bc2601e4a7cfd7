/* The state directory against real daemons: a second daemon on one
 * directory refuses to start and names the first one's pid (it used to
 * queue the first one's running job again and run it too); a directory
 * that others can write is refused with how to fix it; links planted
 * where the daemon writes (listen.addr.tmp, datasets) are not followed.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static struct daemon d;

static void stop(void)
{
	daemon_cleanup(&d);
}

TestSuite(state_dir, .fini = stop, .timeout = 120);

/* Runs `trainerd serve` on dir with its output in log, and returns its exit
 * status, or -1 when it was still running after 10 s (then killed). */
static int serve_exit_status(const char *dir, const char *log)
{
	const char *bin = getenv("TR_TRAINERD");
	cr_assert_not_null(bin);
	pid_t pid = fork();
	cr_assert_neq(pid, -1);
	if (pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		execl(bin, bin, "serve", "--listen", "127.0.0.1:0", "--state-dir", dir, "--data-root", dir,
		      "--cpu-devices", "1", "--backend", "cpu", (char *)NULL);
		_exit(127);
	}
	double deadline = now_s() + 10;
	int st;
	while (waitpid(pid, &st, WNOHANG) == 0) {
		if (now_s() > deadline) {
			kill(pid, SIGTERM);
			waitpid(pid, &st, 0);
			return -1;
		}
		usleep(20000);
	}
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static bool file_has(const char *path, const char *text)
{
	static char buf[65536];
	FILE *f = fopen(path, "r");
	if (!f)
		return false;
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	buf[n] = 0;
	fclose(f);
	return strstr(buf, text) != NULL;
}

static const char *long_job =
	"{\"name\": \"long\", \"seed\": 1, \"model\": {\"inputs\": 4, \"layers\": [{\"type\": \"dense\", \"units\": 2}]},"
	" \"data\": {\"train\": {\"format\": \"synthetic\", \"task\": \"classification\", \"samples\": 64,"
	" \"features\": 4, \"classes\": 2}}, \"batch_size\": 16, \"epochs\": 1000000,"
	" \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}, \"devices\": 1}";

Test(state_dir, second_daemon_refuses_and_names_the_first)
{
	daemon_start(&d, 1, NULL);
	long long id = submit_job(&d, long_job);
	cr_assert_str_eq(wait_state(&d, id, "running", 30), "running");

	char log[256], want[64];
	snprintf(log, sizeof log, "%s/second.log", d.dir);
	int st = serve_exit_status(d.dir, log);
	cr_assert(st > 0, "a second daemon on the same state directory kept running or exited 0 (%d)", st);
	snprintf(want, sizeof want, "in use by another trainerd (pid %d)", (int)d.pid);
	cr_assert(file_has(log, want), "the second daemon's log does not say '%s'", want);

	/* The first one's job ran on, untouched, and it still serves. */
	char path[64];
	snprintf(path, sizeof path, "/jobs/%lld", id);
	struct http_reply r;
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200);
	cr_assert_str_eq(json_string_value(json_object_get(r.json, "state")), "running", "%s", r.body);
	http_free(&r);

	/* Once the first one is gone, a daemon starts there again. */
	daemon_stop(&d, NULL);
	daemon_restart(&d, 1, NULL);
}

Test(state_dir, writable_by_others_is_refused)
{
	daemon_start(&d, 1, NULL);
	daemon_stop(&d, NULL);
	char log[256];
	snprintf(log, sizeof log, "%s.log", d.dir);
	cr_assert_eq(chmod(d.dir, 01777), 0);
	int st = serve_exit_status(d.dir, log);
	chmod(d.dir, 0700);
	cr_assert(st > 0, "a state directory of mode 1777 was accepted (%d)", st);
	cr_assert(file_has(log, "mode 1777 lets group or others write in it"), "no reason in the log");
	cr_assert(file_has(log, "chmod go-w"), "the log does not say how to fix it");
	unlink(log);
	/* Fixed as told, it starts. */
	daemon_restart(&d, 1, NULL);
}

/* A victim file with known contents, outside the state directory. */
static void make_victim(char *path, size_t len, const char *text)
{
	snprintf(path, len, "/tmp/trainerd-victim-XXXXXX");
	int fd = mkstemp(path);
	cr_assert_geq(fd, 0);
	cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
}

Test(state_dir, planted_links_are_not_followed)
{
	daemon_start(&d, 1, NULL);
	daemon_stop(&d, NULL);

	/* listen.addr.tmp pointing at a victim file: written through once. */
	char victim[64], link[300];
	make_victim(victim, sizeof victim, "precious\n");
	snprintf(link, sizeof link, "%s/listen.addr.tmp", d.dir);
	cr_assert_eq(symlink(victim, link), 0);

	/* datasets pointing at a victim folder: its files were deleted at
	 * start and replaced by uploads. */
	char vdir[64], vfile[128], vtmp[128], dlink[300];
	snprintf(vdir, sizeof vdir, "/tmp/trainerd-victim-XXXXXX");
	cr_assert_not_null(mkdtemp(vdir));
	snprintf(vfile, sizeof vfile, "%s/etc", vdir);
	cr_assert_eq(mkdir(vfile, 0700), 0);
	snprintf(vfile, sizeof vfile, "%s/etc/passwd", vdir);
	snprintf(vtmp, sizeof vtmp, "%s/etc/.upload-keep", vdir);
	FILE *f = fopen(vfile, "w");
	fputs("root:x:0:0\n", f);
	fclose(f);
	f = fopen(vtmp, "w");
	fputs("mine\n", f);
	fclose(f);
	char dsdir[300];
	snprintf(dsdir, sizeof dsdir, "%s/datasets", d.dir);
	tr_test_rmtree(dsdir);
	snprintf(dlink, sizeof dlink, "%s/datasets", d.dir);
	cr_assert_eq(symlink(vdir, dlink), 0);

	char log[256];
	snprintf(log, sizeof log, "%s.log", d.dir);
	int st = serve_exit_status(d.dir, log);
	cr_assert(file_has(vfile, "root:x:0:0"), "the victim's etc/passwd changed");
	cr_assert_eq(access(vtmp, F_OK), 0, "start-up cleanup deleted a file in the victim's folder");
	cr_assert(st > 0, "a datasets link out of the state directory was accepted (exit %d)", st);
	cr_assert(file_has(log, "datasets"), "the refusal does not name the datasets directory");
	unlink(log);
	tr_test_rmtree(vdir);
	unlink(dlink);

	/* Without the datasets link it starts, and listen.addr.tmp's link
	 * is replaced, not written through. */
	daemon_restart(&d, 1, NULL);
	cr_assert(file_has(victim, "precious"), "listen.addr.tmp's target was overwritten");
	unlink(victim);
}

/* The mode bits group and others have on path (-1: no such file). */
static int others_bits(const char *dir, const char *name)
{
	char path[300];
	struct stat st;
	snprintf(path, sizeof path, "%s/%s", dir, name);
	return stat(path, &st) == 0 ? (int)(st.st_mode & 077) : -1;
}

/* Under umask 022 the database was made 0644: another local user read
 * jobs and logs with sqlite3 while the API answered 401.  Now it and its
 * -wal and -shm files are 0600, also when an older daemon left them 0644. */
Test(state_dir, database_files_are_private)
{
	mode_t old = umask(022);
	daemon_start(&d, 1, NULL);
	umask(old);
	long long id = submit_job(&d, long_job);
	cr_assert_str_eq(wait_state(&d, id, "running", 30), "running");
	const char *files[] = {"trainerd.db", "trainerd.db-wal", "trainerd.db-shm"};
	for (size_t i = 0; i < 3; i++)
		cr_assert_eq(others_bits(d.dir, files[i]), 0, "%s: group/other mode bits %03o", files[i],
			     others_bits(d.dir, files[i]));
	daemon_stop(&d, NULL);

	char path[300];
	for (size_t i = 0; i < 3; i++) {
		snprintf(path, sizeof path, "%s/%s", d.dir, files[i]);
		chmod(path, 0644);
	}
	daemon_restart(&d, 1, NULL);
	for (size_t i = 0; i < 3; i++) {
		int bits = others_bits(d.dir, files[i]);
		cr_assert(bits == 0 || bits == -1, "%s left by an older daemon: group/other mode bits %03o", files[i],
			  bits);
	}
}
