/* Prefetch pool: same batches for any worker count and depth, never more
 * than `depth` steps loaded ahead, and every wait wakes on cancel/error. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/data/prefetch.h"

struct test_reader {
	struct tr_reader base;
	atomic_long loaded; /* samples loaded minus samples consumed */
	long max_ahead;
	pthread_mutex_t lock;
	int64_t fail_at;
	int sleep_us;
	/* meet: the first sample read waits (up to 5 s) until a second
	 * thread is reading too; met tells whether one came */
	bool meet, met;
	int inside;
	pthread_cond_t arrived;
};

static void meet_another_thread(struct test_reader *t)
{
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 5;
	pthread_mutex_lock(&t->lock);
	if (t->meet && ++t->inside >= 2) {
		t->met = true;
		pthread_cond_broadcast(&t->arrived);
	}
	while (t->meet && !t->met && pthread_cond_timedwait(&t->arrived, &t->lock, &until) == 0)
		;
	t->meet = false;
	pthread_mutex_unlock(&t->lock);
}

static int test_get(tr_reader_t *r, int64_t index, float *x, float *y, struct tr_error *err)
{
	struct test_reader *t = (struct test_reader *)r;
	meet_another_thread(t);
	if (t->sleep_us)
		usleep((useconds_t)t->sleep_us);
	if (index == t->fail_at) {
		tr_error_set(err, 0, 0, NULL, "%s: sample %lld: bad", r->name, (long long)index);
		return -EIO;
	}
	long now = atomic_fetch_add(&t->loaded, 1) + 1;
	pthread_mutex_lock(&t->lock);
	if (now > t->max_ahead)
		t->max_ahead = now;
	pthread_mutex_unlock(&t->lock);
	for (int j = 0; j < r->info.features; j++)
		x[j] = (float)index + 0.5f * (float)j;
	y[0] = (float)(index % 3);
	return 0;
}

static void test_destroy(tr_reader_t *r)
{
	(void)r;
}

static const struct tr_reader_i test_i = {.get = test_get, .destroy = test_destroy};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void reader_init(struct test_reader *t, int64_t n)
{
	memset(t, 0, sizeof *t);
	t->base.i = &test_i;
	t->base.info = (struct tr_reader_info){.samples = n, .features = 3, .label_dim = 1};
	snprintf(t->base.name, sizeof t->base.name, "test.bin");
	pthread_mutex_init(&t->lock, NULL);
	pthread_cond_init(&t->arrived, NULL);
	t->fail_at = -1;
}

/* Runs the plan through prefetch rings of each {workers, depth} and checks
 * every batch against the plan: indices, epoch, every feature and label,
 * and that no more than the ring's slots plus the one being consumed
 * (of `batch` samples each) were ever loaded ahead. */
static void check_batches_match_plan(const struct tr_plan *plan, const int (*configs)[2], size_t nconfigs)
{
	struct tr_error err;
	for (size_t c = 0; c < nconfigs; c++) {
		struct test_reader tr;
		reader_init(&tr, plan->samples);
		struct tr_prefetch_config cfg = {.reader = &tr.base,
						 .plan = plan,
						 .workers = configs[c][0],
						 .depth = configs[c][1],
						 .end_step = plan->total_steps};
		tr_prefetch_t *pf;
		cr_assert_eq(tr_prefetch_create(&cfg, &pf, &err), 0, "%s", err.message);
		int64_t *idx = malloc((size_t)plan->batch * sizeof *idx);
		cr_assert_not_null(idx);
		for (int64_t s = 0; s < plan->total_steps; s++) {
			const struct tr_batch *b;
			double wait;
			cr_assert_eq(tr_prefetch_next(pf, s, &b, &wait), 0);
			int64_t epoch;
			int n = tr_plan_step(plan, s, idx, &epoch);
			cr_assert_eq(b->count, n);
			cr_assert_eq(b->epoch, epoch);
			cr_assert_arr_eq(b->index, idx, (size_t)n * sizeof idx[0]);
			for (int i = 0; i < n; i++) {
				float want[3] = {(float)idx[i], (float)idx[i] + 0.5f, (float)idx[i] + 1.0f};
				cr_assert_arr_eq(b->x + i * 3, want, sizeof want, "workers %d step %lld row %d",
						 configs[c][0], (long long)s, i);
				cr_assert_eq(b->y[i], (float)(idx[i] % 3));
			}
			atomic_fetch_sub(&tr.loaded, n);
			tr_prefetch_release(pf, s);
		}
		free(idx);
		tr_prefetch_destroy(pf);
		cr_assert_leq(tr.max_ahead, (long)(configs[c][1] + 1) * plan->batch, "workers %d depth %d: %ld ahead",
			      configs[c][0], configs[c][1], tr.max_ahead);
	}
}

/* Steps of 37 and 64 rows are cut into chunks of >= 8 rows, one per loader
 * at most: every worker count and depth gives the plan's batches. */
Test(prefetch, chunked_steps_match_plan_for_any_workers)
{
	struct tr_plan plan;
	struct tr_error err;
	cr_assert_eq(tr_plan_init(&plan, 677, 64, TR_LAST_PARTIAL, true, 5, 2, 0, &err), 0);
	const int configs[][2] = {{1, 2}, {2, 1}, {2, 4}, {7, 3}, {7, 14}};
	check_batches_match_plan(&plan, configs, 5);
}

/* With one slot, only step 0 can be loading at first: several loaders must
 * share it (one loader per step would leave the first reader alone). */
Test(prefetch, loaders_share_a_step)
{
	struct tr_plan plan;
	struct tr_error err;
	cr_assert_eq(tr_plan_init(&plan, 256, 32, TR_LAST_DROP, false, 1, 1, 0, &err), 0);
	struct test_reader tr;
	reader_init(&tr, 256);
	tr.meet = true;
	struct tr_prefetch_config cfg = {
		.reader = &tr.base, .plan = &plan, .workers = 4, .depth = 1, .end_step = plan.total_steps};
	tr_prefetch_t *pf;
	cr_assert_eq(tr_prefetch_create(&cfg, &pf, &err), 0);
	const struct tr_batch *b;
	cr_assert_eq(tr_prefetch_next(pf, 0, &b, NULL), 0);
	tr_prefetch_release(pf, 0);
	tr_prefetch_destroy(pf);
	cr_assert(tr.met, "step 0 was loaded by one thread");
}

/* A failing sample in a later chunk of a step fails that step, with the
 * reader's message, and the pool still shuts down. */
Test(prefetch, chunk_error_names_the_sample)
{
	struct tr_plan plan;
	struct tr_error err;
	cr_assert_eq(tr_plan_init(&plan, 320, 32, TR_LAST_DROP, false, 1, 1, 0, &err), 0);
	struct test_reader tr;
	reader_init(&tr, 320);
	tr.fail_at = 2 * 32 + 27; /* step 2, last chunk */
	struct tr_prefetch_config cfg = {
		.reader = &tr.base, .plan = &plan, .workers = 4, .depth = 3, .end_step = plan.total_steps};
	tr_prefetch_t *pf;
	cr_assert_eq(tr_prefetch_create(&cfg, &pf, &err), 0);
	const struct tr_batch *b;
	for (int64_t s = 0; s < 2; s++) {
		cr_assert_eq(tr_prefetch_next(pf, s, &b, NULL), 0, "step %lld", (long long)s);
		tr_prefetch_release(pf, s);
	}
	cr_assert_eq(tr_prefetch_next(pf, 2, &b, NULL), -EIO);
	cr_assert_not_null(strstr(tr_prefetch_error(pf), "test.bin: sample 91"), "%s", tr_prefetch_error(pf));
	double t0 = now_s();
	tr_prefetch_destroy(pf);
	cr_assert_lt(now_s() - t0, 1.0);
}

Test(prefetch, batches_match_plan_for_any_workers_and_depth)
{
	struct tr_plan plan;
	struct tr_error err;
	cr_assert_eq(tr_plan_init(&plan, 91, 8, TR_LAST_PARTIAL, true, 9, 3, 0, &err), 0);
	const int configs[][2] = {{1, 1}, {3, 2}, {8, 5}, {2, 8}};
	check_batches_match_plan(&plan, configs, 4);
}

/* Synthetic load_cost_us below a slice is slept when a loader finishes its
 * row range: the step is not ready before its samples' full cost. */
Test(prefetch, a_step_is_ready_after_its_full_load_cost)
{
	struct tr_plan plan;
	struct tr_error err;
	cr_assert_eq(tr_plan_init(&plan, 64, 8, TR_LAST_DROP, false, 1, 1, 0, &err), 0);
	struct tr_source_spec src = {.format = TR_DATA_SYNTHETIC,
				     .task = TR_SYNTH_CLASSIFICATION,
				     .samples = 64,
				     .features = 3,
				     .classes = 2,
				     .load_cost_us = 1500};
	tr_reader_t *r = NULL;
	cr_assert_eq(tr_reader_open(&src, 1, NULL, NULL, &r, &err), 0, "%s", err.message);
	struct tr_prefetch_config cfg = {
		.reader = r, .plan = &plan, .workers = 1, .depth = 1, .end_step = plan.total_steps};
	double t0 = now_s();
	tr_prefetch_t *pf;
	cr_assert_eq(tr_prefetch_create(&cfg, &pf, &err), 0);
	const struct tr_batch *b;
	cr_assert_eq(tr_prefetch_next(pf, 0, &b, NULL), 0);
	double took = now_s() - t0;
	tr_prefetch_release(pf, 0);
	tr_prefetch_destroy(pf);
	tr_reader_destroy(r);
	cr_assert_geq(took, 8 * 1500e-6 - 1e-4, "step 0 ready after %.1f ms", took * 1e3);
}

struct waiter {
	tr_prefetch_t *pf;
	int rc;
};

static void *wait_step(void *arg)
{
	struct waiter *w = arg;
	const struct tr_batch *b;
	w->rc = tr_prefetch_next(w->pf, 0, &b, NULL);
	return NULL;
}

Test(prefetch, cancel_wakes_a_blocked_consumer)
{
	struct tr_plan plan;
	struct tr_error err;
	cr_assert_eq(tr_plan_init(&plan, 1000, 100, TR_LAST_PARTIAL, true, 1, 1, 0, &err), 0);
	struct test_reader tr;
	reader_init(&tr, 1000);
	tr.sleep_us = 20000; /* 2 s per step */
	struct tr_prefetch_config cfg = {
		.reader = &tr.base, .plan = &plan, .workers = 2, .depth = 2, .end_step = plan.total_steps};
	tr_prefetch_t *pf;
	cr_assert_eq(tr_prefetch_create(&cfg, &pf, &err), 0);
	struct waiter w = {.pf = pf};
	pthread_t th;
	pthread_create(&th, NULL, wait_step, &w);
	usleep(100000);
	double t0 = now_s();
	tr_prefetch_cancel(pf);
	pthread_join(th, NULL);
	tr_prefetch_destroy(pf);
	cr_assert_eq(w.rc, -ECANCELED);
	/* A loader mid-step finishes its current sample (20 ms) and stops. */
	cr_assert_lt(now_s() - t0, 1.0);
}

Test(prefetch, loader_error_reaches_the_consumer_at_that_step)
{
	struct tr_plan plan;
	struct tr_error err;
	cr_assert_eq(tr_plan_init(&plan, 40, 4, TR_LAST_PARTIAL, false, 1, 1, 0, &err), 0);
	struct test_reader tr;
	reader_init(&tr, 40);
	tr.fail_at = 13; /* step 3 */
	struct tr_prefetch_config cfg = {
		.reader = &tr.base, .plan = &plan, .workers = 4, .depth = 4, .end_step = plan.total_steps};
	tr_prefetch_t *pf;
	cr_assert_eq(tr_prefetch_create(&cfg, &pf, &err), 0);
	for (int64_t s = 0; s < 3; s++) {
		const struct tr_batch *b;
		cr_assert_eq(tr_prefetch_next(pf, s, &b, NULL), 0, "step %lld", (long long)s);
		tr_prefetch_release(pf, s);
	}
	const struct tr_batch *b;
	cr_assert_eq(tr_prefetch_next(pf, 3, &b, NULL), -EIO);
	cr_assert_not_null(strstr(tr_prefetch_error(pf), "test.bin: sample 13"), "%s", tr_prefetch_error(pf));
	tr_prefetch_destroy(pf);
}
