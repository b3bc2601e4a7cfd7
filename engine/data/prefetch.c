/* Prefetch pool: loader threads, a bounded ring of step slots (prefetch.h). */
#include "engine/data/prefetch.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

enum slot_state { SLOT_FREE, SLOT_LOADING, SLOT_READY, SLOT_FAILED };

/* A step is cut into `chunks` row ranges so that several loaders can fill
 * it at once; a chunk never has fewer than MIN_CHUNK_ROWS rows, because
 * every chunk costs a lock round trip. */
#define MIN_CHUNK_ROWS 8

struct slot {
	enum slot_state state;
	int chunks; /* row ranges of this step */
	int done;   /* chunks finished */
	int lo, hi; /* the rows loaded (cfg.rows; else all) */
	struct tr_batch batch;
};

struct tr_prefetch {
	struct tr_prefetch_config cfg;
	int features, label_dim;
	bool label_image;
	int wake_free; /* free slots that make it worth waking sleeping loaders */
	pthread_mutex_t lock;
	pthread_cond_t ready; /* consumer: a slot became ready or failed; cancel */
	pthread_cond_t space; /* loaders: slots were released; cancel, error */
	struct slot *slots;
	int64_t claim_step;    /* the step loaders are claiming chunks of */
	int claim_chunk;       /* its next unclaimed chunk */
	int64_t next_free;     /* steps below this (mod depth) have been released */
	int sleeping;          /* loaders waiting on `space` */
	atomic_bool cancelled; /* also polled between samples, without the lock */
	bool failed;
	char error[512];
	pthread_t *threads;
	int nthreads;
};

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void *slot_alloc(tr_backend_t *be, size_t bytes)
{
	if (bytes == 0)
		bytes = 8;
	return be ? be->i->host_alloc(be, bytes) : calloc(1, bytes);
}

static void slot_free(tr_backend_t *be, void *p)
{
	if (be)
		be->i->host_free(be, p);
	else
		free(p);
}

/* Loads rows [begin, end) of a step without holding the lock.  Rows are a
 * pure function of (step, row), so who loads which range changes nothing. */
static int fill_rows(struct tr_prefetch *pf, struct tr_batch *b, int64_t step, int64_t epoch, int begin, int end,
		     struct tr_error *err)
{
	const struct tr_prefetch_config *c = &pf->cfg;
	tr_plan_step_range(c->plan, step, begin, end, b->index);
	for (int i = begin; i < end; i++) {
		/* A step of slow samples can take seconds: notice a cancel between
		 * samples so destroy joins promptly. */
		if (atomic_load_explicit(&pf->cancelled, memory_order_relaxed)) {
			tr_error_set(err, 0, 0, NULL, "cancelled");
			return -ECANCELED;
		}
		float *x = b->x + (size_t)i * pf->features;
		float *y = pf->label_dim > 0 ? b->y + (size_t)i * pf->label_dim : NULL;
		int rc = tr_reader_get_epoch(c->reader, b->index[i], epoch, x, y, err);
		if (rc < 0)
			return rc;
		if (c->transforms)
			tr_transforms_apply_pair(c->transforms, x, pf->features, pf->label_image ? y : NULL, c->seed,
						 epoch, b->index[i], !c->inference);
	}
	/* After the reads: rows read from a file rewritten under the job fail
	 * the step instead of being trained on (reader.h, check). */
	int rc = tr_reader_check(c->reader, err);
	if (rc < 0)
		return rc;
	tr_data_pay_deferred_wait();
	return 0;
}

/* Opens claim_step's slot for loading (under the lock): its size and how
 * many chunks it is cut into. */
static void open_slot(struct tr_prefetch *pf, struct slot *s, int64_t step)
{
	int count = tr_plan_step_count(pf->cfg.plan, step, &s->batch.epoch);
	s->lo = 0;
	s->hi = count;
	if (pf->cfg.rows)
		pf->cfg.rows(pf->cfg.rows_ctx, count, &s->lo, &s->hi);
	int chunks = (s->hi - s->lo) / MIN_CHUNK_ROWS;
	if (chunks > pf->cfg.workers)
		chunks = pf->cfg.workers;
	s->state = SLOT_LOADING;
	s->batch.step = step;
	s->batch.count = count;
	s->chunks = chunks > 1 ? chunks : 1;
	s->done = 0;
}

/* Steps loaders may start now without waiting for a release. */
static int64_t free_slots(const struct tr_prefetch *pf)
{
	return pf->next_free + pf->cfg.depth - pf->claim_step;
}

static void record_failure(struct tr_prefetch *pf, struct slot *s, const char *err)
{
	s->state = SLOT_FAILED;
	if (!pf->failed) {
		pf->failed = true;
		snprintf(pf->error, sizeof pf->error, "%s", err[0] ? err : "loading failed");
	}
	pthread_cond_broadcast(&pf->ready);
	pthread_cond_broadcast(&pf->space);
}

static void *loader_main(void *arg)
{
	struct tr_prefetch *pf = arg;
	struct tr_error err;
	pthread_setname_np(pthread_self(), "tr-loader");
	/* Loaders sleep on slow storage (and synthetic load_cost_us); the
	 * default 50 us timer slack would stretch every short wait. */
	prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
	pthread_mutex_lock(&pf->lock);
	for (;;) {
		if (pf->cancelled || pf->failed || pf->claim_step >= pf->cfg.end_step)
			break;
		/* The slot is free once the consumer has released step - depth. */
		if (free_slots(pf) <= 0) {
			pf->sleeping++;
			pthread_cond_wait(&pf->space, &pf->lock);
			pf->sleeping--;
			continue;
		}
		int64_t step = pf->claim_step;
		struct slot *s = &pf->slots[step % pf->cfg.depth];
		if (pf->claim_chunk == 0)
			open_slot(pf, s, step);
		int chunk = pf->claim_chunk++;
		if (pf->claim_chunk == s->chunks) {
			pf->claim_step++;
			pf->claim_chunk = 0;
		}
		int64_t rows = s->hi - s->lo, epoch = s->batch.epoch;
		int begin = s->lo + (int)(rows * chunk / s->chunks),
		    end = s->lo + (int)(rows * (chunk + 1) / s->chunks);
		pthread_mutex_unlock(&pf->lock);

		err.message[0] = 0;
		int rc = fill_rows(pf, &s->batch, step, epoch, begin, end, &err);

		pthread_mutex_lock(&pf->lock);
		if (rc < 0) {
			record_failure(pf, s, err.message);
		} else if (++s->done == s->chunks && s->state == SLOT_LOADING) {
			s->state = SLOT_READY;
			pthread_cond_signal(&pf->ready);
		}
	}
	pthread_mutex_unlock(&pf->lock);
	return NULL;
}

int tr_prefetch_create(const struct tr_prefetch_config *cfg, tr_prefetch_t **out, struct tr_error *err)
{
	if (cfg->workers < 1 || cfg->depth < 1 || !cfg->reader || !cfg->plan) {
		tr_error_set(err, 0, 0, NULL, "prefetch: workers and depth must be at least 1");
		return -EINVAL;
	}
	struct tr_prefetch *pf = calloc(1, sizeof *pf);
	if (!pf)
		goto fail_alloc;
	pf->cfg = *cfg;
	pf->features = cfg->reader->info.features;
	pf->label_dim = cfg->reader->info.label_dim;
	/* A label row that is the input's image (patches) moves with it. */
	pf->label_image = cfg->reader->info.label_shape[0] &&
			  memcmp(cfg->reader->info.label_shape, cfg->reader->info.shape, sizeof(int[3])) == 0;
	pf->claim_step = cfg->first_step;
	pf->next_free = cfg->first_step;
	/* Waking a loader per released slot costs a futex round trip per
	 * step; waking it once half the ring is free amortises that. */
	pf->wake_free = cfg->depth / 2 > 1 ? cfg->depth / 2 : 1;
	pthread_mutex_init(&pf->lock, NULL);
	pthread_cond_init(&pf->ready, NULL);
	pthread_cond_init(&pf->space, NULL);

	pf->slots = calloc((size_t)cfg->depth, sizeof *pf->slots);
	if (!pf->slots)
		goto fail_slots;
	size_t b = (size_t)cfg->plan->batch;
	for (int i = 0; i < cfg->depth; i++) {
		struct tr_batch *tb = &pf->slots[i].batch;
		tb->x = slot_alloc(cfg->backend, b * pf->features * sizeof(float));
		tb->y = slot_alloc(cfg->backend, b * pf->label_dim * sizeof(float));
		tb->index = calloc(b, sizeof *tb->index);
		if (!tb->x || !tb->y || !tb->index)
			goto fail_threads;
	}

	pf->threads = calloc((size_t)cfg->workers, sizeof *pf->threads);
	if (!pf->threads)
		goto fail_threads;
	for (int i = 0; i < cfg->workers; i++) {
		if (pthread_create(&pf->threads[i], NULL, loader_main, pf) != 0) {
			tr_error_set(err, 0, 0, NULL, "prefetch: cannot start loader thread %d", i);
			tr_prefetch_destroy(pf);
			return -EAGAIN;
		}
		pf->nthreads++;
	}
	*out = pf;
	return 0;

fail_threads:
	tr_prefetch_destroy(pf);
	tr_error_set(err, 0, 0, NULL, "prefetch: out of memory for %d slots of %d samples", cfg->depth,
		     cfg->plan->batch);
	return -ENOMEM;
fail_slots:
	pthread_cond_destroy(&pf->ready);
	pthread_cond_destroy(&pf->space);
	pthread_mutex_destroy(&pf->lock);
	free(pf);
fail_alloc:
	tr_error_set(err, 0, 0, NULL, "prefetch: out of memory");
	return -ENOMEM;
}

int tr_prefetch_next(tr_prefetch_t *pf, int64_t step, const struct tr_batch **batch, double *wait_ms)
{
	double t0 = now_ms();
	int rc = 0;
	struct slot *s = &pf->slots[step % pf->cfg.depth];
	pthread_mutex_lock(&pf->lock);
	for (;;) {
		if (pf->cancelled) {
			rc = -ECANCELED;
			break;
		}
		bool ours = s->batch.step == step;
		if (ours && s->state == SLOT_READY)
			break;
		if (ours && s->state == SLOT_FAILED) {
			rc = -EIO;
			break;
		}
		/* Loaders held back by release's hysteresis must not sleep
		 * while the consumer waits for them. */
		if (pf->sleeping && free_slots(pf) > 0)
			pthread_cond_broadcast(&pf->space);
		pthread_cond_wait(&pf->ready, &pf->lock);
	}
	pthread_mutex_unlock(&pf->lock);
	if (wait_ms)
		*wait_ms = now_ms() - t0;
	if (rc == 0)
		*batch = &s->batch;
	return rc;
}

/* Loaders that release's hysteresis keeps asleep are not woken here, as
 * tr_prefetch_next does: nobody waits, and a look-ahead made every step
 * would cost the futex round trip per step the hysteresis saves. */
int tr_prefetch_try_next(tr_prefetch_t *pf, int64_t step, const struct tr_batch **batch)
{
	struct slot *s = &pf->slots[step % pf->cfg.depth];
	int rc = -EAGAIN;
	pthread_mutex_lock(&pf->lock);
	if (pf->cancelled)
		rc = -ECANCELED;
	else if (s->batch.step == step && s->state == SLOT_READY)
		rc = 0;
	else if (s->batch.step == step && s->state == SLOT_FAILED)
		rc = -EIO;
	pthread_mutex_unlock(&pf->lock);
	if (rc == 0)
		*batch = &s->batch;
	return rc;
}

void tr_prefetch_release(tr_prefetch_t *pf, int64_t step)
{
	pthread_mutex_lock(&pf->lock);
	pf->slots[step % pf->cfg.depth].state = SLOT_FREE;
	if (step + 1 > pf->next_free)
		pf->next_free = step + 1;
	if (pf->sleeping && free_slots(pf) >= pf->wake_free)
		pthread_cond_broadcast(&pf->space);
	pthread_mutex_unlock(&pf->lock);
}

void tr_prefetch_cancel(tr_prefetch_t *pf)
{
	pthread_mutex_lock(&pf->lock);
	pf->cancelled = true;
	pthread_cond_broadcast(&pf->ready);
	pthread_cond_broadcast(&pf->space);
	pthread_mutex_unlock(&pf->lock);
}

const char *tr_prefetch_error(tr_prefetch_t *pf)
{
	return pf->error;
}

void tr_prefetch_destroy(tr_prefetch_t *pf)
{
	if (!pf)
		return;
	tr_prefetch_cancel(pf);
	for (int i = 0; i < pf->nthreads; i++)
		pthread_join(pf->threads[i], NULL);
	free(pf->threads);
	if (pf->slots) {
		for (int i = 0; i < pf->cfg.depth; i++) {
			slot_free(pf->cfg.backend, pf->slots[i].batch.x);
			slot_free(pf->cfg.backend, pf->slots[i].batch.y);
			free(pf->slots[i].batch.index);
		}
		free(pf->slots);
	}
	pthread_cond_destroy(&pf->ready);
	pthread_cond_destroy(&pf->space);
	pthread_mutex_destroy(&pf->lock);
	free(pf);
}
