/* Events for SSE: insertion (inside the caller's transaction), paging by id,
 * and the condition variable that SSE handlers sleep on.  Every commit that
 * adds events (a state change, a writer flush) reports its highest new id
 * through tr_store_events_committed, which wakes all waiters; a waiter then
 * re-checks its own job in the database, so a wake-up is never lost and a
 * spurious one only costs an indexed lookup.
 */
#include "storage/internal.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int tr_store_event_insert(struct conn *c, int64_t job_id, const char *type, const char *data, double at, int64_t *id)
{
	sqlite3_stmt *st = tr_store_stmt(c, "INSERT INTO events (job_id, type, data, at) VALUES (?1, ?2, ?3, ?4)");
	if (!st)
		return -EIO;
	sqlite3_bind_int64(st, 1, job_id);
	sqlite3_bind_text(st, 2, type, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 3, data, -1, SQLITE_STATIC);
	sqlite3_bind_double(st, 4, at);
	int rc = sqlite3_step(st);
	sqlite3_reset(st);
	if (rc != SQLITE_DONE)
		return SQLFAIL(c, rc, "INSERT INTO events");
	*id = sqlite3_last_insert_rowid(c->db);
	/* Every event is written on one of the store's own connections
	 * (c->store set); the others never hold an events table. */
	if (c->store && strcmp(type, "metrics") != 0) {
		int64_t seen = atomic_load(&c->store->last_other_event_id);
		while (seen < *id && !atomic_compare_exchange_weak(&c->store->last_other_event_id, &seen, *id))
			;
	}
	return 0;
}

int64_t tr_store_last_other_event_id(tr_store_t *s)
{
	return atomic_load(&s->last_other_event_id);
}

/* ---- data generations ----------------------------------------------------
 *
 * Response caches keep an answer while the generation they read before
 * computing it is unchanged, so a generation must change after (never
 * before) every commit the answer could see.  Every change takes a new
 * value of the store-wide counter data_gen.  A job's generation is the
 * value of its last change, kept in a direct-mapped table: a job that
 * loses its slot to another is answered with the slot's `evicted`, the
 * newest change of any job that left it, and all_jobs_gen is the newest
 * change not tied to one job.  Both only grow, so what a job reads never
 * goes back, and its next change takes a value larger than anything read
 * before.  One job's commits leave other jobs' values alone, unless two
 * live jobs share a slot (ids 1,024 apart), which costs cache hits only. */

static struct job_gen *job_slot(tr_store_t *s, int64_t job_id)
{
	return &s->job_gens[(uint64_t)job_id % STORE_JOB_GEN_SLOTS];
}

/* The value a job's readers get now; ev_lock held. */
static uint64_t job_readable(tr_store_t *s, int64_t job_id)
{
	const struct job_gen *slot = job_slot(s, job_id);
	uint64_t g = slot->job == job_id ? slot->gen : slot->evicted;
	return s->all_jobs_gen > g ? s->all_jobs_gen : g;
}

/* Gives a job the value gen, or keeps what its readers get now when that
 * is newer; ev_lock held. */
static void job_changed_to(tr_store_t *s, int64_t job_id, uint64_t gen)
{
	struct job_gen *g = job_slot(s, job_id);
	uint64_t now = job_readable(s, job_id);
	if (g->job != job_id) {
		if (g->gen > g->evicted)
			g->evicted = g->gen;
		g->job = job_id;
	}
	g->gen = now > gen ? now : gen;
}

/* ev_lock held. */
static void job_changed(tr_store_t *s, int64_t job_id)
{
	job_changed_to(s, job_id, s->data_gen);
}

/* ev_lock held; jobs NULL: every job. */
static void jobs_changed(tr_store_t *s, const int64_t *jobs, size_t njobs)
{
	s->data_gen++;
	if (!jobs) {
		s->all_jobs_gen = s->data_gen;
		return;
	}
	for (size_t i = 0; i < njobs; i++)
		job_changed(s, jobs[i]);
}

void tr_store_events_committed(tr_store_t *s, int64_t max_id, const int64_t *jobs, size_t njobs)
{
	pthread_mutex_lock(&s->ev_lock);
	if (max_id > s->last_event_id)
		s->last_event_id = max_id;
	s->ev_gen++;
	jobs_changed(s, jobs, njobs);
	pthread_cond_broadcast(&s->ev_cond);
	pthread_mutex_unlock(&s->ev_lock);
}

void tr_store_data_changed(tr_store_t *s)
{
	pthread_mutex_lock(&s->ev_lock);
	jobs_changed(s, NULL, 0);
	pthread_mutex_unlock(&s->ev_lock);
}

void tr_store_job_data_changed(tr_store_t *s, int64_t job_id)
{
	pthread_mutex_lock(&s->ev_lock);
	jobs_changed(s, &job_id, 1);
	pthread_mutex_unlock(&s->ev_lock);
}

uint64_t tr_store_data_generation(tr_store_t *s)
{
	pthread_mutex_lock(&s->ev_lock);
	uint64_t g = s->data_gen;
	pthread_mutex_unlock(&s->ev_lock);
	return g;
}

uint64_t tr_store_job_data_generation(tr_store_t *s, int64_t job_id)
{
	pthread_mutex_lock(&s->ev_lock);
	uint64_t g = job_readable(s, job_id);
	pthread_mutex_unlock(&s->ev_lock);
	return g;
}

/* ---- commit hook ----------------------------------------------------------
 *
 * A running job's commits come five times a second and each one makes the
 * cached answers of its dashboards' queries outdated; the first request
 * after a commit would compute the new answer while others wait for it.
 * The hook lets the API compute those answers on the writer thread before
 * anyone can ask for them: the writer reserves the new value g (every
 * value from g on is taken after the commit, so whatever is computed under
 * it includes the commit), calls the hook for each job written, and only
 * then publishes g as the job's generation.  Until then readers keep the
 * old value and the old answers, as they would have a moment earlier. */

void tr_store_set_commit_hook(tr_store_t *s, tr_store_commit_hook_fn fn, void *ctx)
{
	pthread_mutex_lock(&s->ev_lock);
	s->commit_hook = fn;
	s->commit_hook_ctx = ctx;
	pthread_mutex_unlock(&s->ev_lock);
}

void tr_store_commit_hook_run(tr_store_t *s, int64_t max_id, const int64_t *jobs, size_t njobs)
{
	pthread_mutex_lock(&s->ev_lock);
	tr_store_commit_hook_fn fn = s->commit_hook;
	void *ctx = s->commit_hook_ctx;
	uint64_t gen = fn && jobs ? ++s->data_gen : 0;
	pthread_mutex_unlock(&s->ev_lock);
	if (!gen) {
		tr_store_events_committed(s, max_id, jobs, njobs);
		return;
	}
	for (size_t i = 0; i < njobs; i++)
		fn(ctx, s, jobs[i], gen);
	pthread_mutex_lock(&s->ev_lock);
	if (max_id > s->last_event_id)
		s->last_event_id = max_id;
	s->ev_gen++;
	for (size_t i = 0; i < njobs; i++)
		job_changed_to(s, jobs[i], gen);
	pthread_cond_broadcast(&s->ev_cond);
	pthread_mutex_unlock(&s->ev_lock);
}

void tr_events_free(struct tr_event *events, int count)
{
	if (!events)
		return;
	for (int i = 0; i < count; i++) {
		free(events[i].type);
		free(events[i].data);
	}
	free(events);
}

int tr_store_events_after(tr_store_t *s, int64_t job_id, int64_t after, int limit, struct tr_event **events, int *count,
			  struct tr_error *e)
{
	return tr_store_events_after_max(s, job_id, after, limit, 0, events, count, e);
}

int tr_store_events_after_max(tr_store_t *s, int64_t job_id, int64_t after, int limit, size_t max_bytes,
			      struct tr_event **events, int *count, struct tr_error *e)
{
	return tr_store_events_read(s, job_id, after, limit, max_bytes, TR_EVENT_ALL, events, count, NULL, e);
}

/* The newest event id of job_id (0 when it has none), by the (job_id, id)
 * index. */
static int last_job_event(struct conn *c, int64_t job_id, int64_t *last)
{
	sqlite3_stmt *st = tr_store_stmt(c, "SELECT max(id) FROM events WHERE job_id = ?1");
	if (!st)
		return -EIO;
	sqlite3_bind_int64(st, 1, job_id);
	int rc = sqlite3_step(st);
	if (rc != SQLITE_ROW)
		return SQLFAIL(c, rc, "SELECT max(id) FROM events");
	*last = sqlite3_column_int64(st, 0);
	return 0;
}

int tr_store_events_read(tr_store_t *s, int64_t job_id, int64_t after, int limit, size_t max_bytes, unsigned types,
			 struct tr_event **events, int *count, int64_t *scanned_to, struct tr_error *e)
{
	*events = NULL;
	*count = 0;
	if (scanned_to)
		*scanned_to = after;
	struct conn *c = tr_store_conn_lend(s, e);
	struct tr_event *v = NULL;
	int n = 0, cap = 0, rc, err = 0;
	size_t bytes = 0;
	bool filtered = job_id && (types & TR_EVENT_ALL) != TR_EVENT_ALL;
	bool cut = false;
	int64_t upto = INT64_MAX;
	sqlite3_stmt *st;
	/* A filtered read skips rows, so it says how far it looked: up to the
	 * newest event at its start (ids are given in commit order, so none
	 * at or below it can come later).  A reader that waits for new
	 * events then does not scan the skipped ones again, however long no
	 * wanted one comes.  The type is read before the data: a skipped
	 * event's text (on overflow pages) is not. */
	if (filtered) {
		if ((err = last_job_event(c, job_id, &upto)) < 0)
			goto cleanup;
		st = tr_store_stmt(c, "SELECT id, job_id, type, data, at FROM events"
				      " WHERE job_id = ?1 AND id > ?2 AND id <= ?4 AND (?5 & CASE type"
				      " WHEN 'state' THEN 1 WHEN 'log' THEN 2 WHEN 'metrics' THEN 4 ELSE 0 END) != 0"
				      " ORDER BY id LIMIT ?3");
	} else {
		/* job_id 0 pages through all jobs' events (a global feed).  Two
		 * statements rather than "(?1 = 0 OR job_id = ?1)", which would
		 * keep SQLite from using the (job_id, id) index. */
		st = job_id ? tr_store_stmt(c, "SELECT id, job_id, type, data, at FROM events"
					       " WHERE job_id = ?1 AND id > ?2 ORDER BY id LIMIT ?3")
			    : tr_store_stmt(c, "SELECT id, job_id, type, data, at FROM events"
					       " WHERE ?1 = 0 AND id > ?2 ORDER BY id LIMIT ?3");
	}
	if (!st) {
		err = -EIO;
		goto cleanup;
	}
	sqlite3_bind_int64(st, 1, job_id);
	sqlite3_bind_int64(st, 2, after);
	sqlite3_bind_int(st, 3, limit > 0 ? limit : -1);
	if (filtered) {
		sqlite3_bind_int64(st, 4, upto);
		sqlite3_bind_int(st, 5, (int)types);
	}
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		/* The size is known before the text is copied: an event that
		 * would go past the budget is left for the next call. */
		size_t len = (size_t)sqlite3_column_bytes(st, 3);
		if (max_bytes && n > 0 && bytes + len > max_bytes) {
			rc = SQLITE_DONE;
			cut = true;
			break;
		}
		bytes += len;
		if (n == cap) {
			cap = cap ? 2 * cap : 16;
			struct tr_event *nv = realloc(v, (size_t)cap * sizeof *nv);
			if (!nv) {
				err = tr_store_cfail(c, -ENOMEM, "out of memory");
				goto cleanup;
			}
			v = nv;
		}
		struct tr_event *ev = &v[n];
		ev->id = sqlite3_column_int64(st, 0);
		ev->job_id = sqlite3_column_int64(st, 1);
		ev->type = strdup((const char *)sqlite3_column_text(st, 2));
		ev->data = strdup((const char *)sqlite3_column_text(st, 3));
		ev->at = sqlite3_column_double(st, 4);
		n++;
		if (!ev->type || !ev->data) {
			err = tr_store_cfail(c, -ENOMEM, "out of memory");
			goto cleanup;
		}
	}
	if (rc != SQLITE_DONE)
		err = SQLFAIL(c, rc, "SELECT events");
cleanup:
	tr_store_conn_put(s, c);
	if (err < 0) {
		tr_events_free(v, n);
		return err;
	}
	*events = v;
	*count = n;
	if (scanned_to) {
		/* Whole up to upto unless the limit or the byte budget cut it. */
		bool whole = filtered && !cut && (limit <= 0 || n < limit);
		*scanned_to = whole ? (upto > after ? upto : after) : n ? v[n - 1].id : after;
	}
	return 0;
}

int64_t tr_store_last_event_id(tr_store_t *s)
{
	pthread_mutex_lock(&s->ev_lock);
	int64_t id = s->last_event_id;
	pthread_mutex_unlock(&s->ev_lock);
	return id;
}

/* 1 when job_id has an event with id > after, 0 when not, <0 on error. */
static int job_has_event_after(tr_store_t *s, int64_t job_id, int64_t after)
{
	struct conn *c = tr_store_conn_lend(s, NULL); /* callers read no message */
	int ret = -EIO;
	sqlite3_stmt *st = tr_store_stmt(c, "SELECT 1 FROM events WHERE job_id = ?1 AND id > ?2 LIMIT 1");
	if (st) {
		sqlite3_bind_int64(st, 1, job_id);
		sqlite3_bind_int64(st, 2, after);
		int rc = sqlite3_step(st);
		ret = rc == SQLITE_ROW ? 1 : rc == SQLITE_DONE ? 0 : SQLFAIL(c, rc, "SELECT events");
	}
	tr_store_conn_put(s, c);
	return ret;
}

/* timeout_ms < 0 waits without a deadline (until an event or a wake). */
int tr_store_wait_events(tr_store_t *s, int64_t job_id, int64_t after, int timeout_ms)
{
	return tr_store_wait_events_types(s, job_id, after, TR_EVENT_ALL, timeout_ms);
}

int tr_store_wait_events_types(tr_store_t *s, int64_t job_id, int64_t after, unsigned types, int timeout_ms)
{
	struct timespec deadline;
	clock_gettime(CLOCK_MONOTONIC, &deadline);
	if (timeout_ms > 0) {
		deadline.tv_sec += timeout_ms / 1000;
		deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
		if (deadline.tv_nsec >= 1000000000L) {
			deadline.tv_sec++;
			deadline.tv_nsec -= 1000000000L;
		}
	}
	pthread_mutex_lock(&s->ev_lock);
	uint64_t wake0 = s->wake_gen;
	for (;;) {
		/* Read the generation before checking, so a commit that lands
		 * between the check and the wait changes it and is not missed. */
		uint64_t gen = s->ev_gen;
		int64_t last = s->last_event_id;
		/* Without metrics events, a commit of only those is no news: no
		 * query, back to waiting (a training job's five a second). */
		if (!(types & TR_EVENT_METRICS)) {
			int64_t other = atomic_load(&s->last_other_event_id);
			if (other < last)
				last = other;
		}
		if (last > after) {
			if (job_id == 0) {
				pthread_mutex_unlock(&s->ev_lock);
				return 1;
			}
			pthread_mutex_unlock(&s->ev_lock);
			int has = job_has_event_after(s, job_id, after);
			if (has != 0)
				return has;
			pthread_mutex_lock(&s->ev_lock);
		}
		int rc = 0;
		while (rc == 0 && s->ev_gen == gen && s->wake_gen == wake0) {
			if (timeout_ms < 0)
				rc = pthread_cond_wait(&s->ev_cond, &s->ev_lock);
			else if (timeout_ms == 0)
				rc = ETIMEDOUT;
			else
				rc = pthread_cond_timedwait(&s->ev_cond, &s->ev_lock, &deadline);
		}
		/* A commit that raced the deadline is still checked. */
		if (s->wake_gen != wake0 || (rc == ETIMEDOUT && s->ev_gen == gen)) {
			pthread_mutex_unlock(&s->ev_lock);
			return 0;
		}
	}
}

void tr_store_wake_all(tr_store_t *s)
{
	pthread_mutex_lock(&s->ev_lock);
	s->wake_gen++;
	pthread_cond_broadcast(&s->ev_cond);
	pthread_mutex_unlock(&s->ev_lock);
}
