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
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
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

/* ---- the rank's watchdog -------------------------------------------------- */

/* A rank that hangs (stopped, stuck in I/O) leaves the others waiting in
 * their next collective for ever, and MPI has no timeout for that.  So
 * each rank of several watches its own steps: when none has finished for
 * the timeout, it says so and exits, and mpirun, seeing a rank fail, ends
 * every rank, the hung one included (SIGKILL reaches a stopped process).
 * It exits rather than calling MPI_Abort, which may not be called while
 * the run thread is inside a collective (MPI_THREAD_SERIALIZED). */
static _Atomic double last_beat;
static atomic_bool watch_on;
static pthread_t watch_thread;
static struct {
	int timeout_s, rank, nproc;
} watch;

void tr_run_watchdog_beat(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	atomic_store(&last_beat, ts.tv_sec + ts.tv_nsec / 1e9);
}

static void *watch_main(void *arg)
{
	(void)arg;
	const struct timespec tick = {0, 100 * 1000 * 1000};
	while (atomic_load(&watch_on)) {
		nanosleep(&tick, NULL);
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		double idle = ts.tv_sec + ts.tv_nsec / 1e9 - atomic_load(&last_beat);
		if (atomic_load(&watch_on) && idle > watch.timeout_s) {
			fprintf(stderr,
				"trainerd run: process %d of %d: no step finished in %d s (collective_timeout_s): "
				"another process hung or died; ending the group\n",
				watch.rank, watch.nproc, watch.timeout_s);
			_exit(1);
		}
	}
	return NULL;
}

int tr_run_watchdog_start(int timeout_s, int rank, int nproc)
{
	watch.timeout_s = timeout_s;
	watch.rank = rank;
	watch.nproc = nproc;
	tr_run_watchdog_beat();
	atomic_store(&watch_on, true);
	if (pthread_create(&watch_thread, NULL, watch_main, NULL) != 0) {
		atomic_store(&watch_on, false);
		return -EAGAIN;
	}
	return 0;
}

void tr_run_watchdog_stop(void)
{
	if (!atomic_exchange(&watch_on, false))
		return;
	pthread_join(watch_thread, NULL);
}
