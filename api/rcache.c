/* The response cache (api/rcache.h).
 *
 * Bodies are reference-counted blobs, so an entry can be replaced or
 * evicted while other threads still copy it out, and copies of large
 * bodies happen outside the lock.  A computation in progress is a
 * "flight" on a list; the threads waiting for it hold references to it,
 * and whoever drops the last one frees it, so neither the computing
 * thread nor a waiter that gave up depends on the other's timing.
 *
 * Refresh: a running job's answers go out of date with each commit of its
 * data (five a second), and without help the first request after each
 * commit computes the new answer while the requests behind it wait: on a
 * machine whose cores training keeps busy, that computation is preempted
 * and the waits make the tail of the latency.  An entry that clients keep
 * asking for is therefore recomputed by tr_rcache_refresh, from the
 * store's commit hook, before the commit's generation is published
 * (docs/design.md, "Response cache").
 */
#include "api/rcache.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Dashboards poll a few queries per job; entries are small (a downsampled
 * answer is ~10 kB), and a body above the cap (an undownsampled dump) is
 * shared with its waiters but not kept. */
#define SLOTS 64
#define ENTRY_MAX_BYTES ((size_t)8 << 20)
/* An entry served within this long is polled: refresh it.  An incremental
 * poll's query (a new from_step each time) is computed once and never
 * served again, so it is not refreshed. */
#define REFRESH_WINDOW_MS 3000
/* Bounds the writer's time per job and commit. */
#define REFRESH_MAX 8

struct blob {
	atomic_uint refs;
	size_t len;
	char data[];
};

struct entry {
	const void *owner;
	int64_t job;
	char *query;
	uint64_t gen;
	uint64_t used; /* tick of the last hit, for eviction */
	struct blob *body;
	tr_rcache_refresh_fn refresh;
	double served_at; /* CLOCK_MONOTONIC seconds of the last hit, 0 = none */
};

struct flight {
	struct flight *next;
	const void *owner;
	int64_t job;
	const char *query; /* the computing thread's key, valid while listed */
	uint64_t gen;
	pthread_cond_t done_cond;
	bool done;
	struct blob *body; /* NULL when the computation failed */
	unsigned refs;     /* the computing thread and its waiters */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct entry entries[SLOTS];
static struct flight *flights;
static uint64_t tick;
static struct tr_rcache_stats stats;

static struct blob *blob_new(const char *data, size_t len)
{
	struct blob *b = malloc(sizeof *b + len);
	if (!b)
		return NULL;
	atomic_init(&b->refs, 1);
	b->len = len;
	memcpy(b->data, data, len);
	return b;
}

static struct blob *blob_ref(struct blob *b)
{
	if (b)
		atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
	return b;
}

static void blob_unref(struct blob *b)
{
	if (b && atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1)
		free(b);
}

/* Copies b out and drops the caller's reference; 0 or -ENOMEM. */
static int blob_take(struct blob *b, char **body, size_t *len)
{
	char *p = malloc(b->len ? b->len : 1);
	if (p)
		memcpy(p, b->data, b->len);
	*body = p;
	*len = p ? b->len : 0;
	blob_unref(b);
	return p ? 0 : -ENOMEM;
}

static bool same_key(const void *owner, int64_t job, const char *query, const struct tr_rcache_key *k)
{
	return owner == k->owner && job == k->job && strcmp(query, k->query) == 0;
}

/* lock held */
static struct entry *entry_find(const struct tr_rcache_key *k)
{
	for (int i = 0; i < SLOTS; i++)
		if (entries[i].body && same_key(entries[i].owner, entries[i].job, entries[i].query, k))
			return &entries[i];
	return NULL;
}

static void entry_clear(struct entry *e)
{
	blob_unref(e->body);
	free(e->query);
	*e = (struct entry){0};
}

/* Keeps b (taking a new reference) for k, unless a newer answer is kept
 * already; lock held. */
static void entry_put(const struct tr_rcache_key *k, tr_rcache_refresh_fn refresh, struct blob *b)
{
	struct entry *e = entry_find(k);
	if (e && e->gen > k->gen)
		return;
	if (!e) {
		e = &entries[0];
		for (int i = 0; i < SLOTS && e->body; i++)
			if (!entries[i].body || entries[i].used < e->used)
				e = &entries[i];
		entry_clear(e);
		e->query = strdup(k->query);
		if (!e->query)
			return;
		e->owner = k->owner;
		e->job = k->job;
	}
	blob_unref(e->body);
	e->body = blob_ref(b);
	e->gen = k->gen;
	e->used = ++tick;
	if (refresh)
		e->refresh = refresh;
}

static double mono_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* lock held */
static struct flight *flight_find(const struct tr_rcache_key *k)
{
	for (struct flight *f = flights; f; f = f->next)
		if (f->gen == k->gen && same_key(f->owner, f->job, f->query, k))
			return f;
	return NULL;
}

static struct flight *flight_start(const struct tr_rcache_key *k)
{
	struct flight *f = calloc(1, sizeof *f);
	pthread_condattr_t attr;
	if (!f)
		return NULL;
	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	int rc = pthread_cond_init(&f->done_cond, &attr);
	pthread_condattr_destroy(&attr);
	if (rc != 0) {
		free(f);
		return NULL;
	}
	f->owner = k->owner;
	f->job = k->job;
	f->query = k->query;
	f->gen = k->gen;
	f->refs = 1;
	f->next = flights;
	flights = f;
	return f;
}

/* lock held */
static void flight_unlink(struct flight *f)
{
	for (struct flight **p = &flights; *p; p = &(*p)->next)
		if (*p == f) {
			*p = f->next;
			return;
		}
}

/* lock held */
static void flight_unref(struct flight *f)
{
	if (--f->refs > 0)
		return;
	blob_unref(f->body);
	pthread_cond_destroy(&f->done_cond);
	free(f);
}

/* Waits for f (lock held, the caller holding a reference) until it is
 * done or wait_ms passes; a new reference to its body, or NULL when it
 * failed or took too long. */
static struct blob *flight_wait(struct flight *f, int wait_ms)
{
	struct timespec deadline;
	clock_gettime(CLOCK_MONOTONIC, &deadline);
	deadline.tv_sec += wait_ms / 1000;
	deadline.tv_nsec += (long)(wait_ms % 1000) * 1000000L;
	if (deadline.tv_nsec >= 1000000000L) {
		deadline.tv_sec++;
		deadline.tv_nsec -= 1000000000L;
	}
	int rc = 0;
	while (!f->done && rc != ETIMEDOUT)
		rc = pthread_cond_timedwait(&f->done_cond, &lock, &deadline);
	if (!f->done)
		stats.wait_timeouts++;
	return f->done ? blob_ref(f->body) : NULL;
}

/* Runs compute in the calling thread and keeps a successful answer. */
static int compute_and_keep(const struct tr_rcache_key *k, tr_rcache_refresh_fn refresh, tr_rcache_compute_fn compute,
			    void *ctx, struct flight *f, char **body, size_t *len)
{
	int rc = compute(ctx, body, len);
	struct blob *b = rc == 0 ? blob_new(*body, *len) : NULL;
	pthread_mutex_lock(&lock);
	stats.computed++;
	if (b && *len <= ENTRY_MAX_BYTES)
		entry_put(k, refresh, b);
	if (f) {
		flight_unlink(f);
		f->done = true;
		f->body = blob_ref(b);
		pthread_cond_broadcast(&f->done_cond);
		flight_unref(f);
	}
	pthread_mutex_unlock(&lock);
	blob_unref(b);
	return rc;
}

int tr_rcache_get(const struct tr_rcache_key *key, int wait_ms, tr_rcache_compute_fn compute, void *ctx, char **body,
		  size_t *len)
{
	return tr_rcache_get_refreshable(key, NULL, wait_ms, compute, ctx, body, len);
}

int tr_rcache_get_refreshable(const struct tr_rcache_key *key, tr_rcache_refresh_fn refresh, int wait_ms,
			      tr_rcache_compute_fn compute, void *ctx, char **body, size_t *len)
{
	struct blob *b = NULL;
	struct flight *f = NULL;

	*body = NULL;
	*len = 0;
	pthread_mutex_lock(&lock);
	struct entry *e = entry_find(key);
	/* A newer generation's answer is fresh enough too: generations only
	 * grow, so it was read after the caller's. */
	if (e && e->gen >= key->gen) {
		e->used = ++tick;
		e->served_at = mono_s();
		stats.hits++;
		b = blob_ref(e->body);
	} else if ((f = flight_find(key))) {
		f->refs++;
		b = flight_wait(f, wait_ms);
		if (b)
			stats.shared++;
		flight_unref(f);
		f = NULL; /* a failed or slow flight: compute alone */
	} else {
		f = flight_start(key); /* NULL without memory: compute alone */
	}
	pthread_mutex_unlock(&lock);
	if (b)
		return blob_take(b, body, len);
	return compute_and_keep(key, refresh, compute, ctx, f, body, len);
}

int tr_rcache_refresh(const void *owner, int64_t job, uint64_t gen)
{
	struct todo {
		char *query;
		tr_rcache_refresh_fn fn;
		double served_at;
	} todo[REFRESH_MAX];
	int n = 0, done = 0;

	pthread_mutex_lock(&lock);
	double since = mono_s() - REFRESH_WINDOW_MS / 1000.0;
	for (int i = 0; i < SLOTS; i++) {
		struct entry *e = &entries[i];
		if (!e->body || e->owner != owner || e->job != job || !e->refresh || e->gen >= gen ||
		    e->served_at < since)
			continue;
		/* Full: the most recently served ones win. */
		int at = n;
		if (n == REFRESH_MAX) {
			at = 0;
			for (int j = 1; j < n; j++)
				if (todo[j].served_at < todo[at].served_at)
					at = j;
			if (todo[at].served_at >= e->served_at)
				continue;
			free(todo[at].query);
		} else {
			n++;
		}
		todo[at] = (struct todo){strdup(e->query), e->refresh, e->served_at};
	}
	pthread_mutex_unlock(&lock);
	for (int i = 0; i < n; i++) {
		char *body;
		size_t len;
		if (todo[i].query && todo[i].fn(owner, job, todo[i].query, &body, &len) == 0) {
			struct blob *b = blob_new(body, len);
			struct tr_rcache_key k = {owner, job, todo[i].query, gen};
			free(body);
			pthread_mutex_lock(&lock);
			stats.refreshed++;
			if (b && len <= ENTRY_MAX_BYTES)
				entry_put(&k, todo[i].fn, b);
			pthread_mutex_unlock(&lock);
			blob_unref(b);
			done++;
		}
		free(todo[i].query);
	}
	return done;
}

void tr_rcache_forget(const void *owner)
{
	pthread_mutex_lock(&lock);
	for (int i = 0; i < SLOTS; i++)
		if (entries[i].body && entries[i].owner == owner)
			entry_clear(&entries[i]);
	pthread_mutex_unlock(&lock);
}

void tr_rcache_stats(struct tr_rcache_stats *out)
{
	pthread_mutex_lock(&lock);
	*out = stats;
	pthread_mutex_unlock(&lock);
}
