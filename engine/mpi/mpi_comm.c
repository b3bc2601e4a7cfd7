/* The process communicator's mpi engine (engine/comm.h), built as the
 * module trainerd-mpi.so: Open MPI's collectives, never a transport of
 * this project's own.
 *
 * gather_shards is MPI_Allgatherv in place, with one shard (n floats) as
 * the datatype, so that counts stay small whatever the model's size and
 * each slot arrives as the bytes its process wrote.
 * gather_start is its non-blocking form for one bucket, a range of
 * every slot (MPI_Iallgatherv with that range, resized to a slot's
 * extent, as the datatype: contiguous where the trainer's buckets keep
 * their slots together), progressed by gather_test (MPI_Testall) and
 * ended by gather_wait (MPI_Waitall).  MPI is started with
 * MPI_THREAD_SERIALIZED: the trainer calls from one thread at a time,
 * not always the one that started it.  Errors return instead of aborting
 * (MPI_ERRORS_RETURN), so that the caller can name the failed step before
 * it ends the group with abort.
 */
#include <errno.h>
#include <limits.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "engine/comm.h"

struct mpi_comm {
	struct tr_pcomm base;
	MPI_Comm world;
	int rank, size;
	/* gather_start's gathers not yet waited for */
	MPI_Request pending[TR_PCOMM_MAX_PENDING];
	int n_pending;
	char err[MPI_MAX_ERROR_STRING + 64];
};

static struct mpi_comm *of(tr_pcomm_t *c)
{
	return (struct mpi_comm *)c;
}

static int fail(struct mpi_comm *m, int code, const char *what)
{
	char msg[MPI_MAX_ERROR_STRING];
	int len = 0;
	if (MPI_Error_string(code, msg, &len) != MPI_SUCCESS)
		snprintf(msg, sizeof msg, "error %d", code);
	snprintf(m->err, sizeof m->err, "rank %d of %d: %.40s: %s", m->rank, m->size, what, msg);
	return -EIO;
}

static int mpi_rank(tr_pcomm_t *c)
{
	return of(c)->rank;
}

static int mpi_size(tr_pcomm_t *c)
{
	return of(c)->size;
}

static int mpi_gather_shards(tr_pcomm_t *c, float *buf, size_t n, const int *first, const int *count)
{
	struct mpi_comm *m = of(c);
	MPI_Datatype shard;
	if (n > INT_MAX) {
		snprintf(m->err, sizeof m->err, "a shard of %zu floats is larger than MPI's counts", n);
		return -E2BIG;
	}
	if (n == 0)
		return 0;
	int rc = MPI_Type_contiguous((int)n, MPI_FLOAT, &shard);
	if (rc == MPI_SUCCESS && (rc = MPI_Type_commit(&shard)) == MPI_SUCCESS) {
		rc = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, count, first, shard, m->world);
		MPI_Type_free(&shard);
	}
	return rc == MPI_SUCCESS ? 0 : fail(m, rc, "MPI_Allgatherv of the shard partials");
}

/* One bucket of the shard gather: floats [off, off + len) of each slot.
 * The datatype is that range with a slot's extent, so that the counts
 * and displacements are in shards as in gather_shards. */
static int mpi_gather_start(tr_pcomm_t *c, float *buf, size_t n, size_t off, size_t len, const int *first,
			    const int *count)
{
	struct mpi_comm *m = of(c);
	MPI_Datatype range, slot;
	if (len == 0)
		return 0;
	if (n > (size_t)INT_MAX / sizeof(float) || off + len > n) {
		snprintf(m->err, sizeof m->err, "a bucket [%zu, %zu) of a %zu-float shard is out of MPI's range", off,
			 off + len, n);
		return -E2BIG;
	}
	if (m->n_pending == TR_PCOMM_MAX_PENDING) {
		int rc = MPI_Waitall(m->n_pending, m->pending, MPI_STATUSES_IGNORE);
		if (rc != MPI_SUCCESS)
			return fail(m, rc, "MPI_Waitall of the shard buckets");
		m->n_pending = 0;
	}
	int rc = MPI_Type_contiguous((int)len, MPI_FLOAT, &range);
	if (rc == MPI_SUCCESS) {
		rc = MPI_Type_create_resized(range, 0, (MPI_Aint)(n * sizeof(float)), &slot);
		MPI_Type_free(&range);
	}
	if (rc == MPI_SUCCESS && (rc = MPI_Type_commit(&slot)) == MPI_SUCCESS) {
		rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf + off, count, first, slot, m->world,
				     &m->pending[m->n_pending]);
		/* freed now, kept by MPI until the gather ends */
		MPI_Type_free(&slot);
	}
	if (rc != MPI_SUCCESS)
		return fail(m, rc, "MPI_Iallgatherv of a shard bucket");
	m->n_pending++;
	return 0;
}

static int mpi_gather_test(tr_pcomm_t *c)
{
	struct mpi_comm *m = of(c);
	int done = 0;
	if (m->n_pending == 0)
		return 0;
	int rc = MPI_Testall(m->n_pending, m->pending, &done, MPI_STATUSES_IGNORE);
	if (rc != MPI_SUCCESS)
		return fail(m, rc, "MPI_Testall of the shard buckets");
	if (done)
		m->n_pending = 0;
	return 0;
}

static int mpi_gather_wait(tr_pcomm_t *c)
{
	struct mpi_comm *m = of(c);
	int rc = m->n_pending ? MPI_Waitall(m->n_pending, m->pending, MPI_STATUSES_IGNORE) : MPI_SUCCESS;
	m->n_pending = 0;
	return rc == MPI_SUCCESS ? 0 : fail(m, rc, "MPI_Waitall of the shard buckets");
}

static int mpi_sum_f64(tr_pcomm_t *c, double *buf, size_t n)
{
	struct mpi_comm *m = of(c);
	if (n > INT_MAX)
		return -E2BIG;
	int rc = MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_DOUBLE, MPI_SUM, m->world);
	return rc == MPI_SUCCESS ? 0 : fail(m, rc, "MPI_Allreduce");
}

static int mpi_bcast(tr_pcomm_t *c, void *buf, size_t bytes, int root)
{
	struct mpi_comm *m = of(c);
	if (bytes > INT_MAX)
		return -E2BIG;
	int rc = MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, m->world);
	return rc == MPI_SUCCESS ? 0 : fail(m, rc, "MPI_Bcast");
}

static int mpi_barrier(tr_pcomm_t *c)
{
	struct mpi_comm *m = of(c);
	int rc = MPI_Barrier(m->world);
	return rc == MPI_SUCCESS ? 0 : fail(m, rc, "MPI_Barrier");
}

static void mpi_abort(tr_pcomm_t *c, int code)
{
	MPI_Abort(of(c)->world, code);
}

static void mpi_finish(tr_pcomm_t *c)
{
	struct mpi_comm *m = of(c);
	MPI_Comm_free(&m->world);
	MPI_Finalize();
	free(m);
}

static const char *mpi_last_error(tr_pcomm_t *c)
{
	return of(c)->err;
}

static const tr_pcomm_i mpi_i = {
	.name = "mpi",
	.engine = TR_PCOMM_MPI,
	.rank = mpi_rank,
	.size = mpi_size,
	.gather_shards = mpi_gather_shards,
	.sum_f64 = mpi_sum_f64,
	.bcast = mpi_bcast,
	.barrier = mpi_barrier,
	.abort = mpi_abort,
	.finish = mpi_finish,
	.last_error = mpi_last_error,
	.gather_start = mpi_gather_start,
	.gather_test = mpi_gather_test,
	.gather_wait = mpi_gather_wait,
};

static tr_pcomm_t *mpi_open(int *argc, char ***argv, char *err, size_t errlen)
{
	int provided = 0;
	int rc = MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
	if (rc != MPI_SUCCESS) {
		snprintf(err, errlen, "MPI_Init_thread failed (error %d)", rc);
		return NULL;
	}
	if (provided < MPI_THREAD_SERIALIZED) {
		snprintf(err, errlen, "this MPI library gives thread level %d, trainerd needs MPI_THREAD_SERIALIZED",
			 provided);
		MPI_Finalize();
		return NULL;
	}
	struct mpi_comm *m = calloc(1, sizeof *m);
	if (!m || MPI_Comm_dup(MPI_COMM_WORLD, &m->world) != MPI_SUCCESS) {
		snprintf(err, errlen, "out of memory");
		free(m);
		MPI_Finalize();
		return NULL;
	}
	MPI_Comm_set_errhandler(m->world, MPI_ERRORS_RETURN);
	MPI_Comm_rank(m->world, &m->rank);
	MPI_Comm_size(m->world, &m->size);
	m->base.i = &mpi_i;
	return &m->base;
}

static const struct tr_mpi_module module = {
	.abi = TR_MPI_MODULE_ABI,
	.table_size = sizeof(tr_pcomm_i),
	.open = mpi_open,
};

__attribute__((visibility("default"))) const struct tr_mpi_module *tr_mpi_module_v1(void);

const struct tr_mpi_module *tr_mpi_module_v1(void)
{
	return &module;
}
