/* `trainerd run --processes N`: the job as N ranks through mpirun on this
 * machine (docs/design.md, "Processes and the communicator").
 *
 * The command replaces itself with `mpirun -n N TRAINERD run ARGS...`, the
 * same arguments, so that each rank parses the same spec and options and
 * finds its rank in the environment mpirun gives it (engine/comm.h,
 * tr_pcomm_launched).  mpirun then owns the group: a rank that fails ends
 * the others, and a signal to mpirun reaches every rank.  TRAINERD_MPIRUN
 * names another launcher with mpirun's `-n N` (a wrapper, an absolute
 * path).  Under srun or another MPI launcher nothing is started here: the
 * ranks are already there.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/cli.h"

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
	execvp(mpirun, args);
	fprintf(stderr,
		"trainerd run: --processes %d: cannot start %s: %s (install openmpi-bin, or set TRAINERD_MPIRUN)\n",
		nproc, mpirun, strerror(errno));
	free(args);
	return 1;
}
