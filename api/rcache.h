/* Rendered responses kept per (owner, job, query) and data generation,
 * with one computation per key at a time.
 *
 * An answer is served from the cache while the generation the caller read
 * (before asking) is not newer than the one it was computed under, so the
 * owner's generations must only grow and change after every commit.  Requests
 * that miss a key whose answer another thread is computing under the same
 * generation wait for that answer instead of computing it again; a wait
 * is bounded, and a failed computation sends its waiters to compute on
 * their own, so a stuck or failing request never blocks the others for
 * longer than the bound.  Process-wide; every function is thread-safe.
 */
#ifndef TR_API_RCACHE_H
#define TR_API_RCACHE_H

#include <stddef.h>
#include <stdint.h>

/* Computes the answer to a query from its key alone, for
 * tr_rcache_refresh: 0 and a malloc'd body, or a negative code. */
typedef int (*tr_rcache_refresh_fn)(const void *owner, int64_t job, const char *query, char **body, size_t *len);

struct tr_rcache_key {
	const void *owner; /* what the data belongs to (a store) */
	int64_t job;
	const char *query; /* the normalized query text */
	uint64_t gen;      /* the data generation, read before asking */
};

/* Computes an answer: 0 and a malloc'd body of *len bytes, or a negative
 * code (the caller's reply is then up to the callback's ctx). */
typedef int (*tr_rcache_compute_fn)(void *ctx, char **body, size_t *len);

/* 0 and a malloc'd copy of the answer to key in *body / *len, or the
 * error compute returned in this thread.  wait_ms bounds the wait for
 * another thread's computation of the same key and generation. */
int tr_rcache_get(const struct tr_rcache_key *key, int wait_ms, tr_rcache_compute_fn compute, void *ctx, char **body,
		  size_t *len);
/* The same for an answer that tr_rcache_refresh may recompute with
 * refresh (kept with the entry) while clients poll it. */
int tr_rcache_get_refreshable(const struct tr_rcache_key *key, tr_rcache_refresh_fn refresh, int wait_ms,
			      tr_rcache_compute_fn compute, void *ctx, char **body, size_t *len);
/* Recomputes, under gen, the answers of (owner, job) that have a refresh
 * function, are older than gen and were served from the cache within the
 * last REFRESH_WINDOW_MS (api/rcache.c): the queries some client keeps
 * polling.  At most a few per call, most recently served first.  Returns
 * how many were recomputed.  Meant for the store's commit hook, which
 * runs before gen is published: the next requests then find the answer. */
int tr_rcache_refresh(const void *owner, int64_t job, uint64_t gen);
/* Drops the entries of an owner that is going away. */
void tr_rcache_forget(const void *owner);

/* Counters since the process started, for tests and profiling. */
struct tr_rcache_stats {
	uint64_t hits;          /* answered from an entry */
	uint64_t shared;        /* answered by another thread's computation */
	uint64_t computed;      /* computations run (successful or not) */
	uint64_t wait_timeouts; /* waits that ran past wait_ms */
	uint64_t refreshed;     /* answers recomputed by tr_rcache_refresh */
};
void tr_rcache_stats(struct tr_rcache_stats *out);

#endif
