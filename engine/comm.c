/* The process communicator's single engine and the loader of its mpi
 * engine (engine/comm.h).
 *
 * The mpi engine is a module, as the CUDA backend is: the trainerd
 * executable links no MPI library, so the daemon and every one-process
 * command start without it; only a process that an MPI launcher started
 * as one of several ranks maps libmpi.  The module is opened with
 * RTLD_GLOBAL: Open MPI loads its own components with dlopen, and they
 * resolve libmpi's symbols from the global scope.
 */
#include "engine/comm.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef TR_MPI_MODULE_DIR
#define TR_MPI_MODULE_DIR "/usr/local/lib/trainerd"
#endif

/* ---- single ------------------------------------------------------------- */

static int single_rank(tr_pcomm_t *c)
{
	(void)c;
	return 0;
}

static int single_size(tr_pcomm_t *c)
{
	(void)c;
	return 1;
}

/* One process holds every shard already. */
static int single_gather(tr_pcomm_t *c, float *buf, size_t n, const int *first, const int *count)
{
	(void)c, (void)buf, (void)n, (void)first, (void)count;
	return 0;
}

static int single_sum(tr_pcomm_t *c, double *buf, size_t n)
{
	(void)c, (void)buf, (void)n;
	return 0;
}

static int single_bcast(tr_pcomm_t *c, void *buf, size_t bytes, int root)
{
	(void)c, (void)buf, (void)bytes;
	return root == 0 ? 0 : -EINVAL;
}

static int single_barrier(tr_pcomm_t *c)
{
	(void)c;
	return 0;
}

static void single_abort(tr_pcomm_t *c, int code)
{
	(void)c, (void)code;
}

static void single_finish(tr_pcomm_t *c)
{
	(void)c;
}

static const char *single_error(tr_pcomm_t *c)
{
	(void)c;
	return "";
}

static const tr_pcomm_i single_i = {
	.name = "single",
	.engine = TR_PCOMM_SINGLE,
	.rank = single_rank,
	.size = single_size,
	.gather_shards = single_gather,
	.sum_f64 = single_sum,
	.bcast = single_bcast,
	.barrier = single_barrier,
	.abort = single_abort,
	.finish = single_finish,
	.last_error = single_error,
};

static struct tr_pcomm single = {.i = &single_i};

tr_pcomm_t *tr_pcomm_single(void)
{
	return &single;
}

/* ---- launch environment --------------------------------------------------- */

static int env_int(const char *name)
{
	const char *v = getenv(name);
	char *end;
	if (!v || !*v)
		return -1;
	long n = strtol(v, &end, 10);
	return *end || n < 0 || n > INT_MAX ? -1 : (int)n;
}

bool tr_pcomm_launched(int *size)
{
	/* srun sets SLURM_STEP_NUM_TASKS for the ranks of a step; a batch
	 * script has SLURM_NTASKS and SLURM_PROCID too, but it is one
	 * process, not a rank of several */
	int n = env_int("OMPI_COMM_WORLD_SIZE");
	if (n < 0 && (env_int("PMIX_RANK") >= 0 || env_int("SLURM_PROCID") >= 0))
		n = env_int("SLURM_STEP_NUM_TASKS");
	*size = n > 1 ? n : 1;
	return n > 1;
}

int tr_pcomm_local_rank(void)
{
	int l = env_int("OMPI_COMM_WORLD_LOCAL_RANK");
	if (l < 0)
		l = env_int("SLURM_LOCALID");
	if (l < 0)
		l = env_int("MPI_LOCALRANKID"); /* MPICH's Hydra */
	return l > 0 ? l : 0;
}

/* ---- the mpi module ----------------------------------------------------------- */

/* 1: not there (try the next place); 0: loaded into *out; < 0: there but
 * unusable (reported, not skipped). */
static int try_load(const char *path, const struct tr_mpi_module **out, struct tr_error *err)
{
	if (access(path, F_OK) != 0)
		return 1;
	void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
	if (!h) {
		tr_error_set(err, 0, 0, NULL, "cannot load the MPI module %s: %s", path, dlerror());
		return -ELIBACC;
	}
	tr_mpi_module_entry_fn entry;
	*(void **)&entry = dlsym(h, TR_MPI_MODULE_ENTRY);
	const struct tr_mpi_module *m = entry ? entry() : NULL;
	if (!m || m->abi != TR_MPI_MODULE_ABI || m->table_size != sizeof(tr_pcomm_i)) {
		tr_error_set(err, 0, 0, NULL, "%s is not the MPI module of this trainerd %s (interface %d)", path,
			     TR_VERSION, TR_MPI_MODULE_ABI);
		dlclose(h);
		return -ELIBBAD;
	}
	*out = m;
	return 0;
}

static int find_module(const struct tr_mpi_module **out, struct tr_error *err)
{
	char cand[PATH_MAX + 64], self[PATH_MAX];
	const char *path = getenv("TRAINERD_MPI_MODULE");
	int rc;
	if (path && path[0]) {
		rc = try_load(path, out, err);
		if (rc > 0)
			tr_error_set(err, 0, 0, NULL, "the MPI module %s does not exist", path);
		return rc > 0 ? -ENOENT : rc;
	}
	ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
	if (n > 0) {
		self[n] = '\0';
		char *slash = strrchr(self, '/');
		if (slash)
			*slash = '\0';
		snprintf(cand, sizeof cand, "%s/%s", self, TR_MPI_MODULE_FILE);
		if ((rc = try_load(cand, out, err)) <= 0)
			return rc;
	} else {
		snprintf(self, sizeof self, "(unknown)");
	}
	snprintf(cand, sizeof cand, "%s/%s", TR_MPI_MODULE_DIR, TR_MPI_MODULE_FILE);
	if ((rc = try_load(cand, out, err)) <= 0)
		return rc;
	tr_error_set(err, 0, 0, NULL,
		     "several processes need the MPI module %s, which is in neither %s (beside the executable) nor %s: "
		     "this trainerd was built without MPI (-Dmpi=disabled, or no libopenmpi-dev), or set "
		     "TRAINERD_MPI_MODULE to its path",
		     TR_MPI_MODULE_FILE, self, TR_MPI_MODULE_DIR);
	return -ENOENT;
}

int tr_pcomm_probe(struct tr_error *err)
{
	const struct tr_mpi_module *m;
	return find_module(&m, err);
}

tr_pcomm_t *tr_pcomm_open(int *argc, char ***argv, struct tr_error *err)
{
	int size;
	if (!tr_pcomm_launched(&size))
		return tr_pcomm_single();
	const struct tr_mpi_module *m;
	if (find_module(&m, err) < 0)
		return NULL;
	char why[512] = "";
	tr_pcomm_t *c = m->open(argc, argv, why, sizeof why);
	if (!c)
		tr_error_set(err, 0, 0, NULL, "MPI: %s", why);
	return c;
}
