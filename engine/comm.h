/* The communicator between a job's processes (docs/design.md, "Processes
 * and the communicator").
 *
 * The backend interface (engine/backend.h) connects the devices of one
 * process: threads that share memory.  This one connects the processes of
 * a job that runs as several ranks (`trainerd run --processes N`, or ranks
 * an MPI launcher or srun started).  The trainer calls it from one thread
 * of each process (the run thread, which drives the process's first
 * device), never from two threads at once, so an engine needs no thread
 * support beyond that (MPI_THREAD_SERIALIZED).
 *
 * Engines:
 *   - single: one process, every operation a no-op (tr_pcomm_single);
 *   - mpi: Open MPI, in the module trainerd-mpi.so (engine/mpi/), which
 *     tr_pcomm_open loads only when the environment says an MPI launcher
 *     started this process, so that the daemon and a one-process run never
 *     map libmpi;
 *   - nccl: GPU ranks are no engine of this interface (TR_PCOMM_NCCL is
 *     unused): they keep mpi for the host's values, and the device sums
 *     cross processes through the backend's group communicator (NCCL,
 *     whose ncclUniqueId process 0 makes and bcast sends:
 *     engine/comm_group.h).
 *
 * Every operation returns 0 or a negative errno-style code with the reason
 * in the communicator's last_error.  A failure of one rank is the whole
 * group's: the caller then calls abort, which ends every rank.
 */
#ifndef TR_ENGINE_COMM_H
#define TR_ENGINE_COMM_H

#include <stdbool.h>
#include <stddef.h>

#include "core/error.h"

/* The most processes of one job. */
#define TR_MAX_PROCESSES 64

/* The most gathers gather_start keeps in flight; one more waits for them
 * first. */
#define TR_PCOMM_MAX_PENDING 64

enum tr_pcomm_engine { TR_PCOMM_SINGLE, TR_PCOMM_MPI, TR_PCOMM_NCCL /* unused: engine/comm_group.h */ };

typedef struct tr_pcomm tr_pcomm_t;

typedef struct tr_pcomm_i {
	const char *name;
	enum tr_pcomm_engine engine;
	int (*rank)(tr_pcomm_t *c);
	int (*size)(tr_pcomm_t *c);
	/* Exact mode's gather of shard partials: buf holds `shards` slots of
	 * n floats; process p has filled slots first[p] .. first[p] +
	 * count[p] - 1 (its own shards, contiguous) and afterwards every
	 * process holds every slot, bit for bit as written. */
	int (*gather_shards)(tr_pcomm_t *c, float *buf, size_t n, const int *first, const int *count);
	/* buf[i] = the sum over processes of buf[i], in double.  Exact where
	 * each element has at most one non-zero contributor, or the values
	 * are small integers (flags, counts): that is how the trainer uses it. */
	int (*sum_f64)(tr_pcomm_t *c, double *buf, size_t n);
	/* root's bytes into every process's buf. */
	int (*bcast)(tr_pcomm_t *c, void *buf, size_t bytes, int root);
	int (*barrier)(tr_pcomm_t *c);
	/* Ends every process of the group with exit status `code`; does not
	 * return where the engine can end them (mpi). */
	void (*abort)(tr_pcomm_t *c, int code);
	/* The last call: leaves the group (MPI_Finalize) and frees c. */
	void (*finish)(tr_pcomm_t *c);
	const char *(*last_error)(tr_pcomm_t *c);
	/* Optional, NULL where the engine cannot (single): gather_shards in
	 * buckets that overlap the backward pass.  gather_start starts the
	 * gather of floats [off, off + len) of every slot (slots n floats
	 * apart) and returns without waiting; buf's range must stay
	 * untouched until gather_wait.  gather_test lets started gathers
	 * advance (Open MPI progresses them only inside its calls) and never
	 * waits; gather_wait waits for every started one.  Every process
	 * starts the same ranges in the same order. */
	int (*gather_start)(tr_pcomm_t *c, float *buf, size_t n, size_t off, size_t len, const int *first,
			    const int *count);
	int (*gather_test)(tr_pcomm_t *c);
	int (*gather_wait)(tr_pcomm_t *c);
} tr_pcomm_i;

struct tr_pcomm {
	const tr_pcomm_i *i;
};

/* The one-process communicator: rank 0 of 1, a static object (finish
 * frees nothing). */
tr_pcomm_t *tr_pcomm_single(void);

/* Whether an MPI launcher (mpirun, or srun) started this process as one
 * of several ranks: OMPI_COMM_WORLD_SIZE > 1, or PMIX_RANK or
 * SLURM_PROCID with SLURM_STEP_NUM_TASKS > 1 (srun's, which a batch
 * script lacks).  *size receives the rank count the environment gives (1
 * when none); the communicator's own size is the truth once open. */
bool tr_pcomm_launched(int *size);

/* This process's index among the job's processes on its machine (the
 * launcher's local rank: OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID or
 * MPI_LOCALRANKID), 0 when none says: which GPUs are its own
 * (engine/comm_group.h). */
int tr_pcomm_local_rank(void);

/* The communicator of this process: the mpi engine when tr_pcomm_launched,
 * else the single one.  Loads trainerd-mpi.so (TRAINERD_MPI_MODULE, else
 * beside the executable, else TR_MPI_MODULE_DIR) and initialises MPI;
 * argc/argv are MPI_Init's.  NULL with the reason in err when the module
 * is missing (a build without MPI) or MPI cannot start. */
tr_pcomm_t *tr_pcomm_open(int *argc, char ***argv, struct tr_error *err);
/* Whether this build can run several processes: 0 when the MPI module
 * loads (nothing is initialised), else a negative code with the reason
 * in err.  For a launcher that should not start ranks that cannot work. */
int tr_pcomm_probe(struct tr_error *err);

/* The interface between the loader (engine/comm.c) and the module. */
#define TR_MPI_MODULE_FILE "trainerd-mpi.so"
#define TR_MPI_MODULE_ENTRY "tr_mpi_module_v1"
#define TR_MPI_MODULE_ABI 1
struct tr_mpi_module {
	int abi;           /* TR_MPI_MODULE_ABI */
	size_t table_size; /* sizeof(tr_pcomm_i) */
	tr_pcomm_t *(*open)(int *argc, char ***argv, char *err, size_t errlen);
};
typedef const struct tr_mpi_module *(*tr_mpi_module_entry_fn)(void);

#endif
