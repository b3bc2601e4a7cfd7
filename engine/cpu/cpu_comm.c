/* Collectives between CPU devices, which are threads of one process.
 *
 * allreduce_sum is a two-barrier exchange through shared memory: every rank
 * publishes its buffer, then rank r reduces the r-th contiguous chunk of the
 * elements over all buffers in rank order 0..ndev-1 and writes the sum back
 * into every buffer.  Each element is summed in the same order whichever
 * rank handles it, so the result is deterministic for a device count and
 * identical on all ranks.  The second barrier keeps any rank from returning
 * (and reusing its buffer) while others still read or write it.
 *
 * exact_sum (exact mode) has the same two barriers around a different
 * reduction: every rank publishes its list of parts, then rank r sums its
 * chunk over all ranks' parts in the global order, starting from +0.0,
 * and writes the sum into every rank's out.  Each element is the same
 * chain of float additions whatever the device count, so the result is
 * identical for any number of ranks.
 *
 * The barrier is a mutex/condvar pair with a generation counter rather than
 * pthread_barrier_t, because a job that fails on one device must be able to
 * wake the others: comm_abort makes every current and future wait return
 * -ECANCELED.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cpu/cpu_internal.h"

struct tr_comm {
	tr_backend_t *be; /* borrowed, for error messages */
	int ndev;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int arrived;  /* ranks waiting in the current barrier */
	uint64_t gen; /* completed barriers */
	atomic_bool aborted;
	bool mismatch; /* set by the last arriver of the publish barrier */
	float **bufs;  /* published by each rank, read between barriers */
	size_t *lens;
	/* exact_sum: each rank's parts and their count (out goes to bufs) */
	const float *const **parts;
	int *nparts;
	int *devs; /* each rank's device, whose threads share its slice */
};

/* Called with mu held.  The last rank to arrive also runs `on_full`, still
 * under the lock, so its result is visible to every rank it wakes. */
static int barrier(struct tr_comm *cm, void (*on_full)(struct tr_comm *))
{
	uint64_t gen = cm->gen;

	if (atomic_load(&cm->aborted))
		return -ECANCELED;
	if (++cm->arrived == cm->ndev) {
		cm->arrived = 0;
		if (on_full)
			on_full(cm);
		cm->gen++;
		pthread_cond_broadcast(&cm->cv);
		return 0;
	}
	while (cm->gen == gen && !atomic_load(&cm->aborted))
		pthread_cond_wait(&cm->cv, &cm->mu);
	return cm->gen == gen ? -ECANCELED : 0;
}

/* Bad arguments are judged after everyone has arrived, so that all ranks
 * fail together instead of one leaving the others stuck in the barrier. */
static void check_published(struct tr_comm *cm)
{
	cm->mismatch = false;
	for (int r = 0; r < cm->ndev; r++)
		if (cm->lens[r] != cm->lens[0] || (!cm->bufs[r] && cm->lens[r]))
			cm->mismatch = true;
}

/* The first barrier of both collectives: rank publishes its buffer (and
 * exact_sum's parts), and all ranks learn together whether the lengths
 * agree.  With one rank the barrier only checks. */
static int publish(struct tr_comm *cm, int rank, float *buf, size_t n, const float *const *parts, int nparts,
		   const char *what)
{
	pthread_mutex_lock(&cm->mu);
	cm->bufs[rank] = buf;
	cm->lens[rank] = n;
	cm->parts[rank] = parts;
	cm->nparts[rank] = nparts;
	int rc = barrier(cm, check_published);
	if (rc == 0 && cm->mismatch)
		rc = -EINVAL;
	pthread_mutex_unlock(&cm->mu);
	/* every rank records it: last_error is read per device thread */
	if (rc == -EINVAL)
		return tr_cpu_set_error(cm->be, rc, "%s: rank %d: ranks passed different lengths or a NULL buffer",
					what, rank);
	return rc;
}

/* Sums chunk [lo, hi) into rank 0's buffer in rank order, then copies the
 * result out.  Ranks own disjoint chunks, so no locking is needed. */
static void reduce_chunk(float *const *bufs, int ndev, size_t lo, size_t hi)
{
	float *restrict acc = bufs[0];

	for (int k = 1; k < ndev; k++) {
		const float *restrict src = bufs[k];
		for (size_t i = lo; i < hi; i++)
			acc[i] += src[i];
	}
	for (int k = 1; k < ndev; k++) {
		float *restrict dst = bufs[k];
		for (size_t i = lo; i < hi; i++)
			dst[i] = acc[i];
	}
}

static int cpu_allreduce_sum(tr_comm_t *cm, int rank, float *buf, size_t n)
{
	int rc;

	if (!cm || rank < 0 || rank >= cm->ndev)
		return -EINVAL;
	if (cm->ndev == 1)
		return atomic_load(&cm->aborted) ? -ECANCELED : 0;

	if ((rc = publish(cm, rank, buf, n, NULL, 0, "allreduce_sum")) < 0)
		return rc;

	/* chunk boundaries n*r/ndev: sizes differ by at most one element */
	size_t lo = (size_t)((unsigned __int128)n * rank / cm->ndev);
	size_t hi = (size_t)((unsigned __int128)n * (rank + 1) / cm->ndev);
	reduce_chunk(cm->bufs, cm->ndev, lo, hi);

	pthread_mutex_lock(&cm->mu);
	rc = barrier(cm, NULL);
	pthread_mutex_unlock(&cm->mu);
	return rc;
}

/* Elements [lo, hi) of every out: the sum of all ranks' parts in order
 * from +0.0 (so a lone -0.0 part gives +0.0 on any rank count), a block
 * at a time so that the partial sums stay in cache. */
static void exact_chunk(struct tr_comm *cm, size_t lo, size_t hi)
{
	enum { BLOCK = 1024 };
	float acc[BLOCK];
	for (size_t b = lo; b < hi; b += BLOCK) {
		size_t len = hi - b < BLOCK ? hi - b : BLOCK;
		for (size_t i = 0; i < len; i++)
			acc[i] = 0.0f;
		for (int r = 0; r < cm->ndev; r++) {
			for (int k = 0; k < cm->nparts[r]; k++) {
				const float *restrict p = cm->parts[r][k] + b;
				for (size_t i = 0; i < len; i++)
					acc[i] += p[i];
			}
		}
		for (int r = 0; r < cm->ndev; r++)
			memcpy(cm->bufs[r] + b, acc, len * sizeof(float));
	}
}

/* A rank's slice is cut by size alone into tasks for its device's
 * threads; the sum is elementwise, so the cut changes no bit. */
#define EXACT_TASK ((size_t)1 << 16)

struct exact_work {
	struct tr_comm *cm;
	size_t lo, hi;
};

static int exact_task(void *arg, int task, int slot)
{
	const struct exact_work *w = arg;
	size_t lo = w->lo + (size_t)task * EXACT_TASK;
	(void)slot;
	exact_chunk(w->cm, lo, w->hi - lo < EXACT_TASK ? w->hi : lo + EXACT_TASK);
	return 0;
}

static int cpu_exact_sum(tr_comm_t *cm, int rank, const float *const *parts, int nparts, float *out, size_t n)
{
	int rc;

	if (!cm || rank < 0 || rank >= cm->ndev || nparts < 0 || (nparts > 0 && !parts))
		return -EINVAL;
	if ((rc = publish(cm, rank, out, n, parts, nparts, "exact_sum")) < 0)
		return rc;
	size_t lo = (size_t)((unsigned __int128)n * rank / cm->ndev);
	size_t hi = (size_t)((unsigned __int128)n * (rank + 1) / cm->ndev);
	struct exact_work w = {.cm = cm, .lo = lo, .hi = hi};
	if (hi > lo && (rc = tr_cpu_parallel(cm->be, cm->devs[rank], (int)((hi - lo + EXACT_TASK - 1) / EXACT_TASK),
					     exact_task, &w)) < 0)
		return rc; /* the caller aborts the communicator (as after any failure) */
	if (cm->ndev == 1)
		return 0;
	pthread_mutex_lock(&cm->mu);
	rc = barrier(cm, NULL);
	pthread_mutex_unlock(&cm->mu);
	return rc;
}

/* Waiters return -ECANCELED without touching last_error: the reason for
 * the abort was recorded by whoever failed first. */
static void cpu_comm_abort(tr_comm_t *cm)
{
	if (!cm)
		return;
	pthread_mutex_lock(&cm->mu);
	atomic_store(&cm->aborted, true);
	pthread_cond_broadcast(&cm->cv);
	pthread_mutex_unlock(&cm->mu);
}

static void cpu_comm_destroy(tr_comm_t *cm)
{
	if (!cm)
		return;
	pthread_cond_destroy(&cm->cv);
	pthread_mutex_destroy(&cm->mu);
	free(cm->bufs);
	free(cm->lens);
	free(cm->parts);
	free(cm->nparts);
	free(cm->devs);
	free(cm);
}

/* devs may be NULL (devices 0..ndev-1); otherwise distinct valid ids.  The
 * CPU reduction does not depend on which devices take part, only on the
 * rank order. */
static tr_comm_t *cpu_comm_create(tr_backend_t *be, int ndev, const int *devs)
{
	int count = be->i->device_count(be);
	struct tr_comm *cm;

	if (ndev < 1 || ndev > count) {
		tr_cpu_set_error(be, -EINVAL, "comm_create: %d ranks on a backend with %d devices", ndev, count);
		return NULL;
	}
	for (int r = 0; devs && r < ndev; r++) {
		if (devs[r] < 0 || devs[r] >= count) {
			tr_cpu_set_error(be, -EINVAL, "comm_create: rank %d: device %d out of range", r, devs[r]);
			return NULL;
		}
		for (int q = 0; q < r; q++) {
			if (devs[q] == devs[r]) {
				tr_cpu_set_error(be, -EINVAL, "comm_create: device %d given twice", devs[r]);
				return NULL;
			}
		}
	}

	cm = calloc(1, sizeof(*cm));
	if (!cm)
		goto fail_alloc;
	cm->be = be;
	cm->ndev = ndev;
	atomic_init(&cm->aborted, false);
	cm->bufs = calloc((size_t)ndev, sizeof(*cm->bufs));
	cm->lens = calloc((size_t)ndev, sizeof(*cm->lens));
	cm->parts = calloc((size_t)ndev, sizeof(*cm->parts));
	cm->nparts = calloc((size_t)ndev, sizeof(*cm->nparts));
	cm->devs = calloc((size_t)ndev, sizeof(*cm->devs));
	if (!cm->bufs || !cm->lens || !cm->parts || !cm->nparts || !cm->devs)
		goto fail_arrays;
	for (int r = 0; r < ndev; r++)
		cm->devs[r] = devs ? devs[r] : r;
	if (pthread_mutex_init(&cm->mu, NULL) != 0)
		goto fail_arrays;
	if (pthread_cond_init(&cm->cv, NULL) != 0)
		goto fail_cond;
	return cm;

fail_cond:
	pthread_mutex_destroy(&cm->mu);
fail_arrays:
	free(cm->bufs);
	free(cm->lens);
	free(cm->parts);
	free(cm->nparts);
	free(cm->devs);
	free(cm);
fail_alloc:
	tr_cpu_set_error(be, -ENOMEM, "comm_create: out of memory");
	return NULL;
}

void tr_cpu_comm_fill(tr_backend_i *t)
{
	t->comm_create = cpu_comm_create;
	t->allreduce_sum = cpu_allreduce_sum;
	t->comm_abort = cpu_comm_abort;
	t->comm_destroy = cpu_comm_destroy;
	t->exact_sum = cpu_exact_sum;
}
