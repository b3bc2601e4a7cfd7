/* trainerd: the training daemon's executable.
 *
 *   trainerd run JOB.json [options]   one job in the foreground
 *   trainerd run --resume DIR         continue a stopped one
 *   trainerd eval MODEL DATA_SPEC     a trained model's figures on labelled data
 *   trainerd predict MODEL INPUT --out FILE|DIR/
 *   trainerd degrade IN OUT --factor F   the training degradation, on images
 *   trainerd version
 *   trainerd serve [options]          the daemon (HTTP API, job queue)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/cli.h"
#include "engine/backend.h"
#include "engine/cpu/cpu_dnnl_conv.h"

static void usage(FILE *out)
{
	fprintf(out, "usage: trainerd run JOB.json [--set /POINTER=VALUE]... [--devices N] [--backend cpu|cuda]\n"
		     "                              [--workers W] [--out DIR] [--quiet]   (trainerd run --help)\n"
		     "       trainerd run --resume DIR [options]\n"
		     "       trainerd eval MODEL DATA_SPEC [--json] [options]   (trainerd eval --help)\n"
		     "       trainerd predict MODEL INPUT --out FILE|DIR/ [options]  (trainerd predict --help)\n"
		     "       trainerd degrade IN OUT --factor F | --noise SIGMA  (trainerd degrade --help)\n"
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
 *
 * OpenBLAS reads OPENBLAS_THREAD_TIMEOUT when it loads, before main, and
 * starts its workers with it.  It exports what it takes to apply it again:
 * openblas_read_env re-reads the environment, blas_thread_shutdown_ joins
 * the workers (what it does before a fork) and blas_thread_init starts
 * them again, reading the timeout anew.  The pool is started again at
 * once rather than lazily by the first threaded call, because
 * openblas_set_num_threads adds workers without looking whether the pool
 * runs, and a lazy start would then set up those workers a second time.
 * This used to be done by starting the executable a second time, which
 * cost a whole start-up (dynamic linking and OpenBLAS's initialisation
 * twice, bench/startup/RESULTS.md).  A value already in the environment is
 * the user's and is left alone; `trainerd serve` logs the value in force
 * (openblas_thread_timeout). */
#define BLAS_THREAD_TIMEOUT "4"

/* Weak: a build against another BLAS has no such functions (nor the
 * spinning workers). */
extern int openblas_get_parallel(void) __attribute__((weak));
extern void openblas_read_env(void) __attribute__((weak));
extern int blas_thread_shutdown_(void) __attribute__((weak));
extern int blas_thread_init(void) __attribute__((weak));

static void set_blas_spin(void)
{
	/* Only OpenBLAS's pthreads build reads the variable (1); the OpenMP
	 * build (2) has OMP_WAIT_POLICY instead. */
	if (!openblas_get_parallel || openblas_get_parallel() != 1 || !openblas_read_env || !blas_thread_shutdown_ ||
	    !blas_thread_init || getenv("OPENBLAS_THREAD_TIMEOUT"))
		return;
	if (setenv("OPENBLAS_THREAD_TIMEOUT", BLAS_THREAD_TIMEOUT, 0) != 0)
		return;
	openblas_read_env();
	blas_thread_shutdown_();
	blas_thread_init();
}

int main(int argc, char **argv)
{
	if (argc >= 2 && (strcmp(argv[1], "run") == 0 || strcmp(argv[1], "serve") == 0 ||
			  strcmp(argv[1], "eval") == 0 || strcmp(argv[1], "predict") == 0))
		set_blas_spin();
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
	if (strcmp(cmd, "degrade") == 0)
		return tr_cmd_degrade(argc - 1, argv + 1);
	if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
		printf("trainerd %s (backends: cpu%s; cpu conv2d: im2col%s)\n", TR_VERSION,
		       tr_cuda_available() ? ", cuda" : "", tr_dnnl_available() ? ", onednn" : "");
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
