/* trainerd: the training daemon's executable.
 *
 *   trainerd run JOB.json [options]   one job in the foreground
 *   trainerd version
 *   trainerd serve [options]          the daemon (HTTP API, job queue)
 */
#include <stdio.h>
#include <string.h>

#include "daemon/cli.h"
#include "engine/backend.h"

static void usage(FILE *out)
{
	fprintf(out, "usage: trainerd run JOB.json [--devices N] [--backend cpu|cuda] [--workers W] [--out DIR]\n"
		     "                              [--quiet]\n"
		     "       trainerd version\n"
		     "       trainerd serve [options]   (see README)\n");
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	const char *cmd = argv[1];
	if (strcmp(cmd, "run") == 0)
		return tr_cmd_run(argc - 1, argv + 1);
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
