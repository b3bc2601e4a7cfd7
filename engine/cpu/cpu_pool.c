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
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "engine/cpu/cpu_internal.h"

struct tr_cpu_pool {
	pthread_mutex_t mu;
	pthread_cond_t go, done;
	pthread_t *th;
	int workers;
	bool stop;
	uint64_t gen; /* bumped for each run; workers wait for a new value */
	int busy;     /* workers not yet finished with this run */
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

static void *worker(void *v)
{
	struct worker_arg wa = *(struct worker_arg *)v;
	struct tr_cpu_pool *p = wa.p;
	uint64_t seen = 0;

	free(v);
	pthread_mutex_lock(&p->mu);
	for (;;) {
		while (!p->stop && p->gen == seen)
			pthread_cond_wait(&p->go, &p->mu);
		if (p->stop)
			break;
		seen = p->gen;
		pthread_mutex_unlock(&p->mu);
		drain(p, wa.slot);
		pthread_mutex_lock(&p->mu);
		if (--p->busy == 0)
			pthread_cond_signal(&p->done);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

void tr_cpu_pool_destroy(struct tr_cpu_pool *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	p->stop = true;
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
	pthread_mutex_lock(&p->mu);
	p->fn = fn;
	p->arg = arg;
	p->n = n;
	atomic_store(&p->next, 0);
	atomic_store(&p->rc, 0);
	p->busy = p->workers;
	p->gen++;
	pthread_cond_broadcast(&p->go);
	pthread_mutex_unlock(&p->mu);
	drain(p, 0);
	pthread_mutex_lock(&p->mu);
	while (p->busy > 0)
		pthread_cond_wait(&p->done, &p->mu);
	pthread_mutex_unlock(&p->mu);
	return atomic_load(&p->rc);
}
