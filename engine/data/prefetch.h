/* The prefetch pool: W loader threads fill a ring of `depth` step slots
 * ahead of the compute devices.
 *
 * Loaders claim work in order from a shared cursor: each step is cut into
 * up to W row ranges ("chunks", at least 8 rows each), so W loaders fill
 * one step together and the first step waits for 1/W of a step's loading,
 * not all of it.  A step's slot is (step mod depth); loaders wait for the
 * consumer to release its previous occupant, and are woken only once half
 * the ring is free (or when the consumer would otherwise wait), so a
 * loader that runs ahead costs one wake-up per few steps, not per step.
 * Because every sample is a pure function of its index and the plan, the
 * slot contents do not depend on which loader filled which rows or when:
 * batches are bit-identical for any worker count.  Memory is exactly
 * `depth` slots.  Every wait (loader or consumer) also wakes on cancel and
 * on a loader error; destroy joins every thread.
 */
#ifndef TR_DATA_PREFETCH_H
#define TR_DATA_PREFETCH_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/backend.h"
#include "engine/data/plan.h"
#include "engine/data/reader.h"

struct tr_batch {
	int64_t step;
	int64_t epoch;
	int count;      /* real samples in this step */
	float *x;       /* count x features */
	float *y;       /* count x label_dim */
	int64_t *index; /* count sample indices */
};

struct tr_prefetch_config {
	tr_reader_t *reader;               /* borrowed */
	const tr_transforms_t *transforms; /* borrowed, may be NULL */
	const struct tr_plan *plan;        /* borrowed */
	tr_backend_t *backend;             /* for pinned slot memory; may be NULL */
	uint64_t seed;                     /* keys augmentation noise */
	int workers;
	int depth;
	int64_t first_step; /* resume position */
	int64_t end_step;   /* one past the last step to load */
	/* Evaluation and prediction: transforms run as at inference time
	 * (training-only ones such as noise are skipped). */
	bool inference;
	/* Optional: rows [*begin, *end) of a step of `count` rows are the
	 * ones to load (a process of a job of several loads its own shards'
	 * rows alone); the others' x, y and index are left as they were.
	 * NULL: every row. */
	void (*rows)(void *ctx, int count, int *begin, int *end);
	void *rows_ctx;
};

typedef struct tr_prefetch tr_prefetch_t;

/* Starts the loader threads.  Returns 0 or a negative code with err set. */
int tr_prefetch_create(const struct tr_prefetch_config *cfg, tr_prefetch_t **out, struct tr_error *err);

/* Blocks until `step` is loaded.  Steps must be requested in order and each
 * released before step + depth is requested.  *wait_ms receives the time
 * spent blocked.  Returns 0, -ECANCELED after cancel, or -EIO when loading
 * this step failed (tr_prefetch_error tells why, naming file and sample). */
int tr_prefetch_next(tr_prefetch_t *pf, int64_t step, const struct tr_batch **batch, double *wait_ms);
/* The same without waiting: 0 with *batch when `step` is loaded, -EAGAIN
 * when it is not (yet), -ECANCELED or -EIO as above.  For looking one step
 * ahead while the previous one is still held (so with depth >= 2; with
 * depth 1 the answer is always -EAGAIN).  A step seen here is consumed
 * like one from tr_prefetch_next: the caller still calls next for it in
 * order (which then returns at once) and releases it once. */
int tr_prefetch_try_next(tr_prefetch_t *pf, int64_t step, const struct tr_batch **batch);
void tr_prefetch_release(tr_prefetch_t *pf, int64_t step);
/* Wakes every waiter; later calls return -ECANCELED.  Safe from any thread. */
void tr_prefetch_cancel(tr_prefetch_t *pf);
const char *tr_prefetch_error(tr_prefetch_t *pf);
/* Cancels, joins all loader threads and frees everything.  Accepts NULL. */
void tr_prefetch_destroy(tr_prefetch_t *pf);

#endif
