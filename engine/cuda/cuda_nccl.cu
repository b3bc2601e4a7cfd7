/* Collectives between a job's GPUs through NCCL; the only file that calls
 * NCCL.
 *
 * comm_create builds one communicator per rank from the creating thread
 * (ncclGetUniqueId, then every ncclCommInitRankConfig inside one group).
 * Each rank then calls allreduce_sum from its own device thread: the
 * collective runs on a per-rank NCCL stream that first waits for
 * everything already on the compute stream (event `ready`), and the
 * compute stream waits for the collective (event `done`), so the caller
 * keeps enqueueing without blocking and sync covers the collective.
 *
 * Aborting.  A rank that fails must not leave the others waiting inside
 * NCCL forever.  The communicators are non-blocking (config.blocking = 0):
 * no NCCL call blocks for long (a call that must wait for peers, such as
 * the first collective, which connects lazily, returns ncclInProgress and
 * is polled), so a rank never holds its mutex while waiting.  comm_abort
 * sets a flag that pollers check and calls ncclCommAbort on every rank
 * under that rank's mutex; NCCL's abort also stops collective kernels
 * already running, which releases a rank blocked in cudaStreamSynchronize
 * (in sync or sumsq) waiting for a peer that will never come.  Ranks that
 * call allreduce_sum afterwards get -ECANCELED.
 *
 * One rank needs no NCCL (the allreduce is the identity), so a one-GPU
 * machine would never run it.  TRAINERD_CUDA_NCCL_ONE_RANK=1 (for tests:
 * tests/unit/engine/test_cuda_backend.c, suite cuda_alone) makes a
 * one-rank communicator a real NCCL one, so that its creation, allreduce,
 * finalize and abort run there too.
 *
 * GPU ranks of several processes (engine/comm_group.h):
 * comm_group_create builds this process's ranks of a group whose
 * ncclUniqueId another process made (comm_group_id) and the caller
 * carried over MPI; everything else is as above.  The trainer sums
 * exact mode's disjoint shard slots through it, so the order NCCL adds in
 * does not matter there (each element has one non-zero contributor).
 *
 * Determinism: NCCL's sum order is fixed for a given device count,
 * topology and NCCL version (ring or tree, chosen by size) and every rank
 * receives the same bits, so replicas stay identical and runs repeat; but
 * the order is not the CPU backend's rank order, so CUDA results with
 * D > 1 match the CPU's only to rounding.
 */
#include <errno.h>
#include <nccl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/cuda/cuda_internal.h"

#define INIT_TIMEOUT_S 120.0    /* all ranks are local: seconds at most */
#define FINALIZE_TIMEOUT_S 30.0 /* then fall back to ncclCommAbort */

struct nccl_rank {
	ncclComm_t nc;       /* NULL once aborted or destroyed, under mu */
	int dev;             /* backend device index */
	cudaStream_t stream; /* collectives run here */
	cudaEvent_t ready;   /* compute work before the collective */
	cudaEvent_t done;    /* the collective itself */
	pthread_mutex_t mu;  /* orders NCCL calls on nc against comm_abort */
	bool mu_ok;
	long long calls; /* allreduces issued, under tr_comm.check_mu */
	size_t last_n;   /* length of the latest one, ditto */
};

struct tr_comm {
	tr_backend_t *be; /* borrowed, for errors and streams */
	int ndev;
	bool nccl;   /* ranks have NCCL communicators (ndev > 1, or forced) */
	int aborted; /* __atomic access: set once, never cleared */
	pthread_mutex_t check_mu;
	struct nccl_rank *ranks;
};

static int nccl_error(tr_backend_t *be, ncclResult_t r, ncclComm_t nc, const char *what, const char *file, int line)
{
	const char *detail = ncclGetLastError(nc);
	return tr_cuda_set_error(be, r == ncclInvalidArgument || r == ncclInvalidUsage ? -EINVAL : -EIO,
				 "%s (%s:%d): %s%s%s", what, file, line, ncclGetErrorString(r),
				 detail && detail[0] ? ": " : "", detail ? detail : "");
}

/* For calls that complete at once; collectives and initialisation may
 * also answer ncclInProgress on these non-blocking communicators and are
 * handled where they are made. */
#define NCCL_CHECK(be, nc, stmt)                                                      \
	do {                                                                          \
		ncclResult_t r_ = (stmt);                                             \
		if (r_ != ncclSuccess)                                                \
			return nccl_error((be), r_, (nc), #stmt, __FILE__, __LINE__); \
	} while (0)

#define NCCL_FAILED(r) ((r) != ncclSuccess && (r) != ncclInProgress)

static bool is_aborted(const struct tr_comm *cm)
{
	return __atomic_load_n(&cm->aborted, __ATOMIC_ACQUIRE) != 0;
}

static double mono_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Yield first (a collective usually settles within microseconds), then
 * sleep briefly so that a long wait for a slow peer does not burn a core. */
static void backoff(unsigned *spins)
{
	if (++*spins < 64) {
		sched_yield();
	} else {
		struct timespec ts = {0, 50 * 1000};
		nanosleep(&ts, NULL);
	}
}

/* Polls every rank's communicator until none is in progress; returns the
 * first failure, ncclInProgress on timeout, or ncclSuccess. */
static ncclResult_t settle_all(struct tr_comm *cm, double timeout_s, int *failed_rank)
{
	double deadline = mono_s() + timeout_s;
	unsigned spins = 0;

	for (int r = 0; r < cm->ndev; r++) {
		ncclResult_t st = ncclSuccess; /* a rank without a communicator has nothing pending */
		while (cm->ranks[r].nc) {
			ncclResult_t q = ncclCommGetAsyncError(cm->ranks[r].nc, &st);
			if (q != ncclSuccess)
				st = q;
			if (st != ncclInProgress)
				break;
			if (mono_s() > deadline)
				break;
			backoff(&spins);
		}
		if (st != ncclSuccess) {
			*failed_rank = r;
			return st;
		}
	}
	return ncclSuccess;
}

/* Polls s until it is idle: false on a stream error or past deadline (a
 * collective whose peer never came), where cudaStreamSynchronize would
 * wait forever. */
static bool stream_idle_by(cudaStream_t s, double deadline)
{
	unsigned spins = 0;

	for (;;) {
		cudaError_t e = cudaStreamQuery(s);
		if (e == cudaSuccess)
			return true;
		if (e != cudaErrorNotReady || mono_s() > deadline) {
			(void)cudaGetLastError();
			return false;
		}
		backoff(&spins);
	}
}

static void abort_all(struct tr_comm *cm)
{
	for (int r = 0; r < cm->ndev; r++) {
		struct nccl_rank *rk = &cm->ranks[r];
		pthread_mutex_lock(&rk->mu);
		if (rk->nc)
			ncclCommAbort(rk->nc); /* nothing useful to do with a failure here */
		rk->nc = NULL;
		pthread_mutex_unlock(&rk->mu);
	}
}

/* Frees the streams, events and mutexes; the communicators must be gone. */
static void free_comm(struct tr_comm *cm)
{
	struct cuda_backend *b = cuda_be(cm->be);

	for (int r = 0; cm->ranks && r < cm->ndev; r++) {
		struct nccl_rank *rk = &cm->ranks[r];
		if (rk->dev >= 0 && rk->dev < b->ndev && cudaSetDevice(b->dev[rk->dev].ordinal) == cudaSuccess) {
			if (rk->stream)
				cudaStreamSynchronize(rk->stream);
			if (rk->ready)
				cudaEventDestroy(rk->ready);
			if (rk->done)
				cudaEventDestroy(rk->done);
			if (rk->stream)
				cudaStreamDestroy(rk->stream);
		}
		(void)cudaGetLastError();
		if (rk->mu_ok)
			pthread_mutex_destroy(&rk->mu);
	}
	pthread_mutex_destroy(&cm->check_mu);
	free(cm->ranks);
	free(cm);
}

static int init_rank(struct tr_comm *cm, int r, int dev)
{
	tr_backend_t *be = cm->be;
	struct nccl_rank *rk = &cm->ranks[r];
	int rc;

	rk->dev = dev;
	if (pthread_mutex_init(&rk->mu, NULL) != 0)
		return tr_cuda_set_error(be, -ENOMEM, "comm_create: cannot create a mutex");
	rk->mu_ok = true;
	if ((rc = tr_cuda_use(be, dev, "comm_create")) < 0)
		return rc;
	CUDA_CHECK(be, cudaStreamCreateWithFlags(&rk->stream, cudaStreamNonBlocking));
	CUDA_CHECK(be, cudaEventCreateWithFlags(&rk->ready, cudaEventDisableTiming));
	CUDA_CHECK(be, cudaEventCreateWithFlags(&rk->done, cudaEventDisableTiming));
	return 0;
}

/* All of this process's ranks from this thread, in one group:
 * ncclCommInitRank would otherwise wait for the other ranks inside the
 * call.  They are ranks first_rank .. first_rank + ndev - 1 of nranks
 * (other processes hold the rest: comm_group_create), id the group's. */
static int init_nccl(struct tr_comm *cm, const ncclUniqueId *id, int nranks, int first_rank)
{
	tr_backend_t *be = cm->be;
	struct cuda_backend *b = cuda_be(be);
	ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
	ncclResult_t r, first = ncclSuccess;
	int bad = -1;

	cfg.blocking = 0;
	cfg.commName = "trainerd";
	NCCL_CHECK(be, NULL, ncclGroupStart());
	for (int i = 0; i < cm->ndev; i++) {
		struct nccl_rank *rk = &cm->ranks[i];
		if (cudaSetDevice(b->dev[rk->dev].ordinal) != cudaSuccess) {
			(void)cudaGetLastError();
			first = ncclUnhandledCudaError;
			bad = i;
			break;
		}
		r = ncclCommInitRankConfig(&rk->nc, nranks, *id, first_rank + i, &cfg);
		if (NCCL_FAILED(r)) {
			first = r;
			bad = i;
			break;
		}
	}
	r = ncclGroupEnd();
	if (!NCCL_FAILED(first) && NCCL_FAILED(r))
		first = r;
	if (!NCCL_FAILED(first))
		first = settle_all(cm, INIT_TIMEOUT_S, &bad);
	if (first == ncclSuccess)
		return 0;
	if (first == ncclInProgress)
		tr_cuda_set_error(be, -ETIMEDOUT,
				  "comm_create: NCCL initialisation of ranks %d .. %d of %d did not finish in %.0f s",
				  first_rank, first_rank + cm->ndev - 1, nranks, INIT_TIMEOUT_S);
	else
		nccl_error(be, first, bad >= 0 ? cm->ranks[bad].nc : NULL, "comm_create: ncclCommInitRankConfig",
			   __FILE__, __LINE__);
	abort_all(cm);
	return first == ncclInProgress ? -ETIMEDOUT : -EIO;
}

static bool one_rank_nccl_forced(void)
{
	const char *v = getenv("TRAINERD_CUDA_NCCL_ONE_RANK");
	return v && strcmp(v, "1") == 0;
}

/* devs may be NULL (devices 0..ndev-1); otherwise distinct valid ids.
 * id NULL: the process's own communicator, which makes its id and holds
 * every rank (NCCL only when ndev > 1 or forced); else ranks first_rank ..
 * of nranks of the group id names, always NCCL. */
static tr_comm_t *create(tr_backend_t *be, int ndev, const int *devs, const ncclUniqueId *id, int nranks,
			 int first_rank)
{
	int count = cuda_be(be)->ndev;
	struct tr_comm *cm;

	if (ndev < 1 || ndev > count) {
		tr_cuda_set_error(be, -EINVAL, "comm_create: %d ranks on a backend with %d devices", ndev, count);
		return NULL;
	}
	for (int r = 0; devs && r < ndev; r++) {
		if (devs[r] < 0 || devs[r] >= count) {
			tr_cuda_set_error(be, -EINVAL, "comm_create: rank %d: device %d out of range", r, devs[r]);
			return NULL;
		}
		for (int q = 0; q < r; q++) {
			if (devs[q] == devs[r]) {
				tr_cuda_set_error(be, -EINVAL, "comm_create: device %d given twice", devs[r]);
				return NULL;
			}
		}
	}

	cm = (struct tr_comm *)calloc(1, sizeof(*cm));
	if (!cm) {
		tr_cuda_set_error(be, -ENOMEM, "comm_create: out of memory");
		return NULL;
	}
	cm->be = be;
	cm->ndev = ndev;
	cm->ranks = (struct nccl_rank *)calloc((size_t)ndev, sizeof(*cm->ranks));
	if (!cm->ranks || pthread_mutex_init(&cm->check_mu, NULL) != 0) {
		free(cm->ranks);
		free(cm);
		tr_cuda_set_error(be, -ENOMEM, "comm_create: out of memory");
		return NULL;
	}
	for (int r = 0; r < ndev; r++)
		cm->ranks[r].dev = -1;
	for (int r = 0; r < ndev; r++) {
		if (init_rank(cm, r, devs ? devs[r] : r) < 0)
			goto fail;
	}
	/* one rank needs no NCCL: allreduce is the identity */
	cm->nccl = id || ndev > 1 || one_rank_nccl_forced();
	if (cm->nccl && !id) {
		ncclUniqueId own;
		ncclResult_t r = ncclGetUniqueId(&own);
		if (r != ncclSuccess) {
			nccl_error(be, r, NULL, "comm_create: ncclGetUniqueId", __FILE__, __LINE__);
			goto fail;
		}
		if (init_nccl(cm, &own, ndev, 0) < 0)
			goto fail;
	} else if (id && init_nccl(cm, id, nranks, first_rank) < 0) {
		goto fail;
	}
	return cm;
fail:
	free_comm(cm);
	return NULL;
}

static tr_comm_t *cuda_comm_create(tr_backend_t *be, int ndev, const int *devs)
{
	return create(be, ndev, devs, NULL, ndev, 0);
}

/* GPU ranks of a job's processes (engine/comm_group.h): the id is NCCL's,
 * made here by one process and carried to the others by the caller. */
static_assert(sizeof(ncclUniqueId) <= TR_COMM_GROUP_ID_BYTES, "ncclUniqueId fits the group id");

static int cuda_comm_group_id(tr_backend_t *be, void *id)
{
	ncclUniqueId u;
	memset(id, 0, TR_COMM_GROUP_ID_BYTES);
	NCCL_CHECK(be, NULL, ncclGetUniqueId(&u));
	memcpy(id, &u, sizeof u);
	return 0;
}

static tr_comm_t *cuda_comm_group_create(tr_backend_t *be, int ndev, const int *devs, const void *id, int nranks,
					 int first_rank)
{
	ncclUniqueId u;
	if (!id || nranks < ndev || first_rank < 0 || first_rank > nranks - ndev) {
		tr_cuda_set_error(be, -EINVAL, "comm_group_create: ranks %d .. %d of %d", first_rank,
				  first_rank + ndev - 1, nranks);
		return NULL;
	}
	memcpy(&u, id, sizeof u);
	return create(be, ndev, devs, &u, nranks, first_rank);
}

/* Lengths are compared among ranks at the same call count.  The trainer
 * runs ranks in lockstep (one allreduce per step, all ranks finish a step
 * before the next starts), so the later of any two ranks sees the other's
 * entry.  NCCL itself would hang or read out of bounds. */
static int check_length(struct tr_comm *cm, int rank, size_t n, int *other, size_t *other_n)
{
	struct nccl_rank *me = &cm->ranks[rank];
	int bad = 0;

	pthread_mutex_lock(&cm->check_mu);
	me->calls++;
	me->last_n = n;
	for (int q = 0; q < cm->ndev && !bad; q++) {
		if (q != rank && cm->ranks[q].calls == me->calls && cm->ranks[q].last_n != n) {
			*other = q;
			*other_n = cm->ranks[q].last_n;
			bad = 1;
		}
	}
	pthread_mutex_unlock(&cm->check_mu);
	return bad;
}

static void cuda_comm_abort(tr_comm_t *cm);

static int cuda_allreduce_sum(tr_comm_t *cm, int rank, float *buf, size_t n)
{
	if (!cm || rank < 0 || rank >= cm->ndev)
		return -EINVAL;
	tr_backend_t *be = cm->be;
	struct nccl_rank *rk = &cm->ranks[rank];
	struct cuda_dev *d;
	ncclResult_t r;
	unsigned spins = 0;
	int other = -1, rc;
	size_t other_n = 0;

	if (is_aborted(cm))
		return -ECANCELED;
	if (!cm->nccl)
		return 0;
	if (check_length(cm, rank, n, &other, &other_n)) {
		tr_cuda_set_error(be, -EINVAL, "allreduce_sum: rank %d passed %zu elements, rank %d passed %zu", rank,
				  n, other, other_n);
		cuda_comm_abort(cm);
		return -EINVAL;
	}
	if (n == 0)
		return 0;
	if (!buf) {
		tr_cuda_set_error(be, -EINVAL, "allreduce_sum: rank %d: NULL buffer", rank);
		cuda_comm_abort(cm);
		return -EINVAL;
	}
	if ((rc = tr_cuda_use(be, rk->dev, "allreduce_sum")) < 0)
		return rc;
	d = &cuda_be(be)->dev[rk->dev];

	pthread_mutex_lock(&rk->mu);
	if (!rk->nc || is_aborted(cm)) {
		pthread_mutex_unlock(&rk->mu);
		return -ECANCELED;
	}
	rc = tr_cuda_check_rt(be, cudaEventRecord(rk->ready, d->stream), "cudaEventRecord(ready)", __FILE__, __LINE__);
	if (!rc)
		rc = tr_cuda_check_rt(be, cudaStreamWaitEvent(rk->stream, rk->ready, 0), "cudaStreamWaitEvent(nccl)",
				      __FILE__, __LINE__);
	if (rc) {
		pthread_mutex_unlock(&rk->mu);
		return rc;
	}
	r = ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, rk->nc, rk->stream);
	/* In progress: NCCL is connecting to peers (first use) on its own
	 * threads.  Poll without holding the mutex in between, so that an
	 * abort can get in. */
	while (r == ncclInProgress) {
		pthread_mutex_unlock(&rk->mu);
		backoff(&spins);
		pthread_mutex_lock(&rk->mu);
		if (!rk->nc || is_aborted(cm)) {
			pthread_mutex_unlock(&rk->mu);
			return -ECANCELED;
		}
		ncclResult_t q = ncclCommGetAsyncError(rk->nc, &r);
		if (q != ncclSuccess)
			r = q;
	}
	if (r != ncclSuccess) {
		rc = nccl_error(be, r, rk->nc, "ncclAllReduce", __FILE__, __LINE__);
		pthread_mutex_unlock(&rk->mu);
		cuda_comm_abort(cm);
		return rc;
	}
	rc = tr_cuda_check_rt(be, cudaEventRecord(rk->done, rk->stream), "cudaEventRecord(done)", __FILE__, __LINE__);
	if (!rc)
		rc = tr_cuda_check_rt(be, cudaStreamWaitEvent(d->stream, rk->done, 0), "cudaStreamWaitEvent(compute)",
				      __FILE__, __LINE__);
	pthread_mutex_unlock(&rk->mu);
	return rc;
}

/* Safe from any thread, any number of times; the first call does the work.
 * Waiters return -ECANCELED without touching last_error: whoever failed
 * first recorded the reason. */
static void cuda_comm_abort(tr_comm_t *cm)
{
	if (!cm || __atomic_exchange_n(&cm->aborted, 1, __ATOMIC_ACQ_REL))
		return;
	if (cm->nccl)
		abort_all(cm);
}

/* After every rank has stopped calling.  A clean shutdown waits for the
 * last collectives, finalizes all communicators (non-blocking, so all of
 * them from this thread, inside one group as NCCL's documentation asks of
 * a thread that finalizes several) and then destroys them; if any of that fails or
 * stalls past FINALIZE_TIMEOUT_S, abort instead, so that teardown always
 * ends. */
static void cuda_comm_destroy(tr_comm_t *cm)
{
	if (!cm)
		return;
	if (cm->nccl && !is_aborted(cm)) {
		struct cuda_backend *b = cuda_be(cm->be);
		ncclResult_t st = ncclSuccess;
		double deadline = mono_s() + FINALIZE_TIMEOUT_S;
		int bad = -1;
		for (int r = 0; r < cm->ndev && st == ncclSuccess; r++) {
			struct nccl_rank *rk = &cm->ranks[r];
			if (cudaSetDevice(b->dev[rk->dev].ordinal) != cudaSuccess ||
			    !stream_idle_by(rk->stream, deadline))
				st = ncclUnhandledCudaError;
			(void)cudaGetLastError();
		}
		if (st == ncclSuccess) {
			ncclResult_t g = ncclGroupStart();
			if (g != ncclSuccess)
				st = g;
			for (int r = 0; r < cm->ndev && st == ncclSuccess; r++) {
				ncclResult_t q = ncclCommFinalize(cm->ranks[r].nc);
				if (NCCL_FAILED(q))
					st = q;
			}
			/* a started group is always ended; in progress is settled below */
			if (g == ncclSuccess) {
				g = ncclGroupEnd();
				if (st == ncclSuccess && NCCL_FAILED(g))
					st = g;
			}
		}
		if (st == ncclSuccess)
			st = settle_all(cm, FINALIZE_TIMEOUT_S, &bad);
		if (st == ncclSuccess) {
			for (int r = 0; r < cm->ndev; r++) {
				ncclCommDestroy(cm->ranks[r].nc);
				cm->ranks[r].nc = NULL;
			}
		} else {
			abort_all(cm);
		}
	}
	free_comm(cm);
}

void tr_cuda_comm_fill(tr_backend_i *t)
{
	t->comm_create = cuda_comm_create;
	t->allreduce_sum = cuda_allreduce_sum;
	t->comm_abort = cuda_comm_abort;
	t->comm_destroy = cuda_comm_destroy;
	t->comm_group_id = cuda_comm_group_id;
	t->comm_group_create = cuda_comm_group_create;
}
