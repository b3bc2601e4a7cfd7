/* trainerd: the training daemon's executable.
 *
 *   trainerd run JOB.json [options]   one job in the foreground
 *   trainerd run --resume DIR         continue a stopped one
 *   trainerd eval MODEL DATA_SPEC     a trained model's figures on labelled data
 *   trainerd predict MODEL INPUT --out FILE
 *   trainerd version
 *   trainerd serve [options]          the daemon (HTTP API, job queue)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <unistd.h>

#include "daemon/cli.h"
#include "engine/backend.h"

static void usage(FILE *out)
{
	fprintf(out, "usage: trainerd run JOB.json [--set /POINTER=VALUE]... [--devices N] [--backend cpu|cuda]\n"
		     "                              [--workers W] [--out DIR] [--quiet]   (trainerd run --help)\n"
		     "       trainerd run --resume DIR [options]\n"
		     "       trainerd eval MODEL DATA_SPEC [--json] [options]   (trainerd eval --help)\n"
		     "       trainerd predict MODEL INPUT --out FILE [options]  (trainerd predict --help)\n"
		     "       trainerd version\n"
		     "       trainerd serve [options]   (see README)\n");
}

/* OpenBLAS's worker threads spin (sched_yield) for 2^28 cycles, ~0.1 s,
 * after each threaded gemm before they sleep: longer than a whole training
 * step, so a worker never sleeps and keeps a core busy through every
 * single-threaded phase (the optimizer update, activations, loss).  That
 * core is the one the checkpoint writer, the loaders and the API need: at
 * a checkpoint every 100 steps the steps lost 5.9% beside the spinning
 * worker and 4.1% with it asleep (bench/checkpoint/RESULTS.md), and
 * training alone ran as fast within the noise on ~20% less CPU.  The
 * price is a wake-up (tens of us) per threaded gemm; gemms small enough
 * to stay on one thread never wake it (engine/cpu/cpu_backend.c).
 * OpenBLAS reads OPENBLAS_THREAD_TIMEOUT (log2 of the cycles) only when it
 * loads, before main, so the executable sets it and starts itself again;
 * a value already in the environment is the user's and is left alone. */
#define BLAS_THREAD_TIMEOUT "4"

/* Weak: a build against another BLAS has no such function (nor the
 * spinning workers). */
extern int openblas_get_parallel(void) __attribute__((weak));

static void set_blas_spin(char **argv)
{
	/* Only OpenBLAS's pthreads build reads the variable (1); the OpenMP
	 * build (2) has OMP_WAIT_POLICY instead. */
	if (!openblas_get_parallel || openblas_get_parallel() != 1 || getenv("OPENBLAS_THREAD_TIMEOUT"))
		return;
	/* Started as `ld.so trainerd ...` (no program interpreter of its
	 * own: AT_BASE 0), /proc/self/exe is the loader, not this program. */
	if (getauxval(AT_BASE) == 0)
		return;
	/* By its own path, not /proc/self/exe: the process's name (ps,
	 * pgrep, top) is the executed file's. */
	char self[4096];
	ssize_t n = readlink("/proc/self/exe", self, sizeof self);
	if (n <= 0 || (size_t)n >= sizeof self)
		return;
	self[n] = '\0';
	if (setenv("OPENBLAS_THREAD_TIMEOUT", BLAS_THREAD_TIMEOUT, 0) != 0)
		return;
	execv(self, argv);
	unsetenv("OPENBLAS_THREAD_TIMEOUT"); /* not in effect: do not pass it on as if it were */
	/* Without /proc, or once the file was replaced, this process keeps
	 * OpenBLAS's default: slower beside checkpoints, otherwise the same. */
}

int main(int argc, char **argv)
{
	if (argc >= 2 && (strcmp(argv[1], "run") == 0 || strcmp(argv[1], "serve") == 0 ||
			  strcmp(argv[1], "eval") == 0 || strcmp(argv[1], "predict") == 0))
		set_blas_spin(argv);
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	const char *cmd = argv[1];
	if (strcmp(cmd, "run") == 0)
		return tr_cmd_run(argc - 1, argv + 1);
	if (strcmp(cmd, "eval") == 0)
		return tr_cmd_eval(argc - 1, argv + 1);
	if (strcmp(cmd, "predict") == 0)
		return tr_cmd_predict(argc - 1, argv + 1);
	if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
		printf("trainerd %s (backends: cpu%s)\n", TR_VERSION, tr_cuda_available() ? ", cuda" : "");
		return 0;
	}
	if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
		usage(stdout);
		return 0;
	}
	if (strcmp(cmd, "serve") == 0) {
		return tr_cmd_serve(argc - 1, argv + 1);
	}
	fprintf(stderr, "trainerd: unknown command '%s'\n", cmd);
	usage(stderr);
	return 2;
}
