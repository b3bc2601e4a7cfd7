/* `trainerd run --processes N`: the job as N ranks through mpirun on this
 * machine (docs/design.md, "Processes and the communicator").
 *
 * The command starts `mpirun -n N TRAINERD run ARGS...`, the same
 * arguments, so that each rank parses the same spec and options and finds
 * its rank in the environment mpirun gives it (engine/comm.h,
 * tr_pcomm_launched), and waits for it.  mpirun owns the group: a rank
 * that fails ends the others.  Ctrl-C or SIGTERM here becomes SIGUSR1 to
 * mpirun, which forwards it to every rank, where it asks for a stop: the
 * ranks agree on the step, process 0 keeps its checkpoint, and the exit
 * status is 0 as for one process (mpirun itself, sent SIGTERM, kills the
 * ranks after forwarding it and exits 1).  A second one is SIGTERM to
 * mpirun.  TRAINERD_MPIRUN names another launcher with mpirun's `-n N`
 * (a wrapper, an absolute path).  Under srun or another MPI launcher
 * nothing is started here: the ranks are already there.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/cli.h"

static volatile pid_t launcher;
static volatile sig_atomic_t signals_seen;

static void on_signal(int sig)
{
	(void)sig;
	if (launcher > 0)
		kill(launcher, signals_seen++ ? SIGTERM : SIGUSR1);
}

int tr_run_launch(int nproc, int argc, char **argv)
{
	char self[PATH_MAX], count[16];
	ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
	if (n <= 0) {
		fprintf(stderr, "trainerd run: --processes: cannot find this executable: %s\n", strerror(errno));
		return 1;
	}
	self[n] = '\0';
	const char *mpirun = getenv("TRAINERD_MPIRUN");
	if (!mpirun || !*mpirun)
		mpirun = "mpirun";
	snprintf(count, sizeof count, "%d", nproc);
	/* mpirun -n N SELF run ARGS... NULL; argv[0] is "run" */
	char **args = calloc((size_t)argc + 6, sizeof *args);
	if (!args) {
		fprintf(stderr, "trainerd run: out of memory\n");
		return 1;
	}
	int k = 0;
	args[k++] = (char *)mpirun;
	args[k++] = "-n";
	args[k++] = count;
	args[k++] = self;
	for (int i = 0; i < argc; i++)
		args[k++] = argv[i];
	args[k] = NULL;
	fflush(NULL);
	/* the child tells the parent through this pipe's close-on-exec
	 * whether exec worked, so that a missing launcher is named */
	int fds[2];
	if (pipe2(fds, O_CLOEXEC) < 0) {
		fprintf(stderr, "trainerd run: pipe: %s\n", strerror(errno));
		free(args);
		return 1;
	}
	pid_t pid = fork();
	if (pid == 0) {
		close(fds[0]);
		execvp(mpirun, args);
		int e = errno;
		(void)!write(fds[1], &e, sizeof e);
		_exit(127);
	}
	close(fds[1]);
	free(args);
	if (pid < 0) {
		fprintf(stderr, "trainerd run: fork: %s\n", strerror(errno));
		close(fds[0]);
		return 1;
	}
	launcher = pid;
	struct sigaction sa = {.sa_handler = on_signal};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	int e = 0;
	ssize_t got;
	while ((got = read(fds[0], &e, sizeof e)) < 0 && errno == EINTR)
		;
	close(fds[0]);
	int status = 0;
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (got == (ssize_t)sizeof e) {
		fprintf(stderr,
			"trainerd run: --processes %d: cannot start %s: %s (install openmpi-bin, or set "
			"TRAINERD_MPIRUN)\n",
			nproc, mpirun, strerror(e));
		return 1;
	}
	if (WIFEXITED(status))
		return WEXITSTATUS(status);
	return 128 + WTERMSIG(status);
}
