/* The CPU backend's own threads: one small pool per device that runs a
 * fixed list of tasks (docs/design.md, "Backend").
 *
 * The backend computes with single-threaded OpenBLAS calls and splits the
 * work itself, so that results never depend on how many threads run it:
 * the caller cuts the work into tasks by shape alone (column tiles of a
 * gemm, slices of samples of a convolution), each task writes its own
 * output or its own partial sum, and partial sums are added in task order
 * afterwards.  Which thread runs which task depends on timing; what a task
 * computes does not.  The device's own thread takes tasks too, so a pool
 * of T threads has T - 1 workers; a budget of one thread has none and runs
 * every task in order on the caller.
 *
 * A step hands work to the pool a dozen times or more (each gemm, each
 * activation, the update), often a few tens of microseconds apart.  A
 * worker that went to sleep on the condition variable must be woken by
 * the kernel for each (a futex wake, and in a virtual machine an
 * interrupt to an idle virtual CPU), and so must a caller that waits for
 * the last task.  So both first watch the atomics for up to SPIN_NS and
 * only then sleep: the handoffs inside a step cost no system call, and
 * a pool with nothing to do stops burning CPU after SPIN_NS.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

#include "engine/cpu/cpu_internal.h"

/* How long a thread watches for its wake-up before it sleeps: longer than
 * the gaps between a step's parallel calls (the small serial kernels
 * between them), short enough that an idle device gives its cores back
 * at once, and a loaded machine loses little to the watching. */
#define SPIN_NS 100000

struct tr_cpu_pool {
	pthread_mutex_t mu;
	pthread_cond_t go, done;
	pthread_t *th;
	int workers;
	atomic_bool stop;
	/* bumped (under mu) for each run; workers wait for a new value */
	_Atomic uint64_t gen;
	atomic_int busy; /* workers not yet finished with this run */
	/* the current run */
	tr_cpu_task_fn fn;
	void *arg;
	int n;
	atomic_int next;
	atomic_int rc;
};

/* Takes tasks until none is left; slot names the thread for per-thread
 * scratch. */
static void drain(struct tr_cpu_pool *p, int slot)
{
	for (;;) {
		int t = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
		if (t >= p->n)
			return;
		int rc = p->fn(p->arg, t, slot);
		if (rc < 0) {
			int zero = 0;
			atomic_compare_exchange_strong(&p->rc, &zero, rc);
		}
	}
}

struct worker_arg {
	struct tr_cpu_pool *p;
	int slot;
};

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

/* Watches until done(p, ctx) or SPIN_NS have passed; returns done's last
 * answer.  The clock is read every 64 rounds only. */
static bool spin_until(struct tr_cpu_pool *p, bool (*done)(struct tr_cpu_pool *p, uint64_t ctx), uint64_t ctx)
{
	int64_t t0 = now_ns();
	for (unsigned i = 1;; i++) {
		if (done(p, ctx))
			return true;
		if (i % 64 == 0 && now_ns() - t0 > SPIN_NS)
			return false;
		cpu_relax();
	}
}

static bool new_run_or_stop(struct tr_cpu_pool *p, uint64_t seen)
{
	return atomic_load_explicit(&p->gen, memory_order_acquire) != seen ||
	       atomic_load_explicit(&p->stop, memory_order_acquire);
}

static bool workers_done(struct tr_cpu_pool *p, uint64_t unused)
{
	(void)unused;
	return atomic_load_explicit(&p->busy, memory_order_acquire) == 0;
}

static void *worker(void *v)
{
	struct worker_arg wa = *(struct worker_arg *)v;
	struct tr_cpu_pool *p = wa.p;
	uint64_t seen = 0;

	free(v);
	for (;;) {
		if (!spin_until(p, new_run_or_stop, seen)) {
			pthread_mutex_lock(&p->mu);
			while (!new_run_or_stop(p, seen))
				pthread_cond_wait(&p->go, &p->mu);
			pthread_mutex_unlock(&p->mu);
		}
		if (atomic_load_explicit(&p->stop, memory_order_acquire))
			break;
		seen = atomic_load_explicit(&p->gen, memory_order_acquire);
		drain(p, wa.slot);
		/* The last worker wakes a caller that went to sleep: under mu,
		 * so the caller's check of busy and its wait are one step. */
		if (atomic_fetch_sub_explicit(&p->busy, 1, memory_order_acq_rel) == 1) {
			pthread_mutex_lock(&p->mu);
			pthread_cond_signal(&p->done);
			pthread_mutex_unlock(&p->mu);
		}
	}
	return NULL;
}

void tr_cpu_pool_destroy(struct tr_cpu_pool *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	atomic_store(&p->stop, true);
	pthread_cond_broadcast(&p->go);
	pthread_mutex_unlock(&p->mu);
	for (int i = 0; i < p->workers; i++)
		pthread_join(p->th[i], NULL);
	pthread_cond_destroy(&p->go);
	pthread_cond_destroy(&p->done);
	pthread_mutex_destroy(&p->mu);
	free(p->th);
	free(p);
}

/* A pool of `threads` (the caller included).  Workers that cannot be
 * started are simply fewer workers: the results stay the same. */
struct tr_cpu_pool *tr_cpu_pool_create(int threads)
{
	struct tr_cpu_pool *p = calloc(1, sizeof *p);

	if (!p)
		return NULL;
	if (threads < 1)
		threads = 1;
	p->th = calloc((size_t)threads, sizeof *p->th);
	if (!p->th || pthread_mutex_init(&p->mu, NULL) != 0) {
		free(p->th);
		free(p);
		return NULL;
	}
	pthread_cond_init(&p->go, NULL);
	pthread_cond_init(&p->done, NULL);
	for (int i = 1; i < threads; i++) {
		struct worker_arg *wa = malloc(sizeof *wa);
		if (!wa)
			break;
		wa->p = p;
		wa->slot = i;
		if (pthread_create(&p->th[p->workers], NULL, worker, wa) != 0) {
			free(wa);
			break;
		}
		p->workers++;
	}
	return p;
}

int tr_cpu_pool_run(struct tr_cpu_pool *p, int n, tr_cpu_task_fn fn, void *arg)
{
	if (n <= 0)
		return 0;
	if (!p || p->workers == 0 || n == 1) {
		for (int t = 0; t < n; t++) {
			int rc = fn(arg, t, 0);
			if (rc < 0)
				return rc;
		}
		return 0;
	}
	/* Every worker has finished the last run (busy was 0), so none reads
	 * these until it sees the new gen, which publishes them. */
	p->fn = fn;
	p->arg = arg;
	p->n = n;
	atomic_store(&p->next, 0);
	atomic_store(&p->rc, 0);
	atomic_store(&p->busy, p->workers);
	pthread_mutex_lock(&p->mu);
	atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
	pthread_cond_broadcast(&p->go);
	pthread_mutex_unlock(&p->mu);
	drain(p, 0);
	if (!spin_until(p, workers_done, 0)) {
		pthread_mutex_lock(&p->mu);
		while (!workers_done(p, 0))
			pthread_cond_wait(&p->done, &p->mu);
		pthread_mutex_unlock(&p->mu);
	}
	return atomic_load(&p->rc);
}
