/* Running Slurm's commands (sbatch, scontrol, scancel, sacct) for the
 * Slurm allocator: a child with its output captured, bounded in time and
 * size.  No libslurm: its licence and its coupling to one Slurm version
 * are what the commands spare us. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "daemon/slurm.h"

extern char **environ;

static double mono_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int tr_slurm_command(const char *bin_dir, char *const argv[], char *out, size_t out_len, int timeout_s)
{
	char exe[1200];
	if (bin_dir && bin_dir[0])
		snprintf(exe, sizeof exe, "%s/%s", bin_dir, argv[0]);
	else
		snprintf(exe, sizeof exe, "%s", argv[0]);
	int fds[2];
	if (pipe2(fds, O_CLOEXEC) < 0)
		return -errno;
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t at;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
	posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
	posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
	posix_spawnattr_init(&at);
	/* The daemon blocks every signal in its threads (sigwaitinfo takes
	 * them): the command gets an empty mask and default handlers. */
	sigset_t none, all;
	sigemptyset(&none);
	sigfillset(&all);
	posix_spawnattr_setsigmask(&at, &none);
	posix_spawnattr_setsigdefault(&at, &all);
	posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
	pid_t pid;
	int rc = bin_dir && bin_dir[0] ? posix_spawn(&pid, exe, &fa, &at, argv, environ)
				       : posix_spawnp(&pid, exe, &fa, &at, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	posix_spawnattr_destroy(&at);
	close(fds[1]);
	if (rc != 0) {
		close(fds[0]);
		if (out_len)
			snprintf(out, out_len, "cannot run %s: %s", exe, strerror(rc));
		return -rc;
	}
	size_t got = 0;
	double end = mono_s() + timeout_s;
	bool timed_out = false;
	for (;;) {
		int left_ms = (int)((end - mono_s()) * 1000);
		if (left_ms <= 0) {
			timed_out = true;
			break;
		}
		struct pollfd p = {.fd = fds[0], .events = POLLIN};
		int n = poll(&p, 1, left_ms);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			timed_out = n == 0;
			break;
		}
		char buf[1024];
		ssize_t r = read(fds[0], buf, sizeof buf);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		/* Keep the first out_len - 1 bytes; read on to the end so the
		 * command never blocks on a full pipe. */
		size_t take = got + 1 < out_len ? out_len - 1 - got : 0;
		if (take > (size_t)r)
			take = (size_t)r;
		memcpy(out + got, buf, take);
		got += take;
	}
	close(fds[0]);
	if (out_len)
		out[got < out_len ? got : out_len - 1] = 0;
	if (timed_out)
		kill(pid, SIGKILL);
	int status = 0;
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (timed_out) {
		if (out_len)
			snprintf(out, out_len, "%s did not answer within %d s", argv[0], timeout_s);
		return -ETIMEDOUT;
	}
	if (WIFEXITED(status))
		return WEXITSTATUS(status);
	return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}
