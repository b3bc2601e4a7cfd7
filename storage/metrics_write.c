/* The metrics writer's writing: one batch of queued points and log lines
 * into the database (the writer thread of metrics_queue.c only).
 *
 * Each transaction inserts the points, the log lines, their events (one
 * "log" event per line, one "metrics" event per job with that job's points
 * in queue order) and the rollup updates, so a client paging events by id
 * sees every point exactly once, and a query never sees raw points without
 * their rollup.  Points of jobs that no longer exist (deleted while queued)
 * are skipped: the existence check runs inside the write transaction, so no
 * delete can slip in between, and no foreign-key failure can abort the
 * batch.
 */
#include "storage/internal.h"

#include "core/rfc3339.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bounds the time the writer holds SQLite's write lock (request writers
 * wait on it, up to the busy timeout) and the size of one transaction. */
#define TX_ITEMS 50000
/* Bound one event's JSON text (SSE frames, memory of readers): an event
 * stream holds a few hundred KB at a time, and a single event may not be
 * split across fetches (docs/design.md, "Event streams"). */
#define EVENT_POINTS 10000
#define EVENT_BYTES (64 * 1024)
/* Each waits the busy timeout (5 s) first. */
#define BUSY_RETRIES 5

struct batch_job {
	int64_t id;
	bool exists;
	int npoints;
	struct jbuf buf;
};

static const char *item_text(const struct qitem *it)
{
	return it->heap ? it->heap : it->inl;
}

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return (x > y) - (x < y);
}

static int cmp_job(const void *key, const void *elem)
{
	int64_t k = *(const int64_t *)key, e = ((const struct batch_job *)elem)->id;
	return (k > e) - (k < e);
}

static int cmp_name(const struct qitem *x, const struct qitem *y)
{
	if (x->job_id != y->job_id)
		return x->job_id < y->job_id ? -1 : 1;
	return strcmp(item_text(x), item_text(y));
}

/* Series order for the rollup: job, name, step, then queue order. */
static int cmp_series(const void *a, const void *b)
{
	const struct qitem *x = *(const struct qitem *const *)a, *y = *(const struct qitem *const *)b;
	int c = cmp_name(x, y);
	if (c)
		return c;
	if (x->step != y->step)
		return x->step < y->step ? -1 : 1;
	return (x > y) - (x < y);
}

/* Distinct jobs of the batch, sorted by id, with their existence. */
static int load_jobs(struct conn *c, const struct qitem *items, size_t n, struct batch_job **out, size_t *nout)
{
	int64_t *ids = malloc(n * sizeof *ids);
	if (!ids)
		return tr_store_cfail(c, -ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++)
		ids[i] = items[i].job_id;
	qsort(ids, n, sizeof *ids, cmp_i64);
	size_t nj = 0;
	for (size_t i = 0; i < n; i++)
		if (i == 0 || ids[i] != ids[i - 1])
			ids[nj++] = ids[i];
	struct batch_job *jobs = calloc(nj, sizeof *jobs);
	if (!jobs) {
		free(ids);
		return tr_store_cfail(c, -ENOMEM, "out of memory");
	}
	int err = 0;
	sqlite3_stmt *st = tr_store_stmt(c, "SELECT 1 FROM jobs WHERE id = ?1");
	if (!st)
		err = -EIO;
	for (size_t j = 0; j < nj && !err; j++) {
		jobs[j].id = ids[j];
		sqlite3_reset(st);
		sqlite3_bind_int64(st, 1, ids[j]);
		int rc = sqlite3_step(st);
		if (rc == SQLITE_ROW)
			jobs[j].exists = true;
		else if (rc != SQLITE_DONE)
			err = SQLFAIL(c, rc, "SELECT job");
	}
	if (st)
		sqlite3_reset(st);
	free(ids);
	*out = jobs;
	*nout = nj;
	return err;
}

static int emit_metrics_event(struct conn *c, struct batch_job *j, double now, int64_t *max_event)
{
	JBUF_LIT(&j->buf, "]}");
	tr_store_jbuf_raw(&j->buf, "", 1); /* NUL */
	if (j->buf.oom)
		return tr_store_cfail(c, -ENOMEM, "out of memory building a metrics event");
	int err = tr_store_event_insert(c, j->id, "metrics", j->buf.p, now, max_event);
	j->buf.n = 0;
	j->npoints = 0;
	return err;
}

/* Deletes the point a pushed point replaces; *replaced tells whether there
 * was one (its rollup blocks must then be rebuilt, not merged into). */
static int delete_replaced(struct conn *c, const struct qitem *it, bool *replaced)
{
	sqlite3_stmt *st = tr_store_stmt(c, "DELETE FROM metrics WHERE job_id = ?1 AND name = ?2 AND step = ?3");
	if (!st)
		return -EIO;
	sqlite3_bind_int64(st, 1, it->job_id);
	sqlite3_bind_text(st, 2, item_text(it), -1, SQLITE_STATIC);
	sqlite3_bind_int64(st, 3, it->step);
	int rc = sqlite3_step(st);
	sqlite3_reset(st);
	if (rc != SQLITE_DONE)
		return SQLFAIL(c, rc, "DELETE FROM metrics");
	*replaced = sqlite3_changes(c->db) > 0;
	return 0;
}

static int insert_point(struct conn *c, struct batch_job *j, const struct qitem *it, double now, int64_t *max_event,
			bool *replaced)
{
	*replaced = false;
	if (it->replace) {
		int err = delete_replaced(c, it, replaced);
		if (err < 0)
			return err;
	}
	sqlite3_stmt *st = tr_store_stmt(
		c, "INSERT INTO metrics (job_id, name, step, epoch, wall, value) VALUES (?1, ?2, ?3, ?4, ?5, ?6)");
	if (!st)
		return -EIO;
	const char *name = item_text(it);
	sqlite3_bind_int64(st, 1, it->job_id);
	sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
	sqlite3_bind_int64(st, 3, it->step);
	sqlite3_bind_int64(st, 4, it->epoch);
	sqlite3_bind_double(st, 5, it->wall);
	sqlite3_bind_double(st, 6, it->value); /* NaN binds as NULL */
	int rc = sqlite3_step(st);
	sqlite3_reset(st);
	if (rc != SQLITE_DONE)
		return SQLFAIL(c, rc, "INSERT INTO metrics");

	struct jbuf *b = &j->buf;
	if (j->npoints == 0)
		JBUF_LIT(b, "{\"points\":[{\"name\":");
	else
		JBUF_LIT(b, ",{\"name\":");
	tr_store_jbuf_str(b, name);
	JBUF_LIT(b, ",\"step\":");
	tr_store_jbuf_int(b, it->step);
	JBUF_LIT(b, ",\"epoch\":");
	tr_store_jbuf_int(b, it->epoch);
	JBUF_LIT(b, ",\"wall\":");
	tr_store_jbuf_num(b, it->wall);
	JBUF_LIT(b, ",\"value\":");
	tr_store_jbuf_num(b, it->value);
	JBUF_LIT(b, "}");
	if (++j->npoints == EVENT_POINTS || j->buf.n >= EVENT_BYTES)
		return emit_metrics_event(c, j, now, max_event);
	return 0;
}

static int insert_log(struct conn *c, const struct qitem *it, double now, int64_t *max_event)
{
	sqlite3_stmt *st = tr_store_stmt(c, "INSERT INTO logs (job_id, time, level, message) VALUES (?1, ?2, ?3, ?4)");
	if (!st)
		return -EIO;
	const char *msg = item_text(it);
	sqlite3_bind_int64(st, 1, it->job_id);
	sqlite3_bind_double(st, 2, it->wall);
	sqlite3_bind_int(st, 3, it->level);
	sqlite3_bind_text(st, 4, msg, -1, SQLITE_STATIC);
	int rc = sqlite3_step(st);
	sqlite3_reset(st);
	if (rc != SQLITE_DONE)
		return SQLFAIL(c, rc, "INSERT INTO logs");
	int64_t id = sqlite3_last_insert_rowid(c->db);

	/* Same shape as tr_store_logs_query's entries. */
	struct jbuf b = {0};
	JBUF_LIT(&b, "{\"id\":");
	tr_store_jbuf_int(&b, id);
	char when[TR_RFC3339_LEN];
	JBUF_LIT(&b, ",\"time\":");
	if (tr_rfc3339_format(it->wall, when, sizeof when))
		tr_store_jbuf_str(&b, when);
	else
		JBUF_LIT(&b, "null");
	JBUF_LIT(&b, ",\"level\":");
	tr_store_jbuf_int(&b, it->level);
	JBUF_LIT(&b, ",\"message\":");
	tr_store_jbuf_str(&b, msg);
	tr_store_jbuf_raw(&b, "}", 2); /* with the NUL */
	int err = b.oom ? tr_store_cfail(c, -ENOMEM, "out of memory building a log event")
			: tr_store_event_insert(c, it->job_id, "log", b.p, now, max_event);
	free(b.p);
	return err;
}

/* Rebuilds, bottom-up, the blocks of every level that hold a point which
 * replaced another: merging would count both. */
static int rebuild_replaced(struct conn *c, const struct qitem *items, size_t n, const bool *replaced)
{
	int err = 0;
	for (size_t i = 0; i < n && !err; i++) {
		if (!replaced[i])
			continue;
		for (int level = 1; level <= ROLLUP_LEVELS && !err; level++)
			err = tr_store_rollup_rebuild(c, items[i].job_id, item_text(&items[i]), level,
						      tr_store_floordiv(items[i].step, tr_store_rollup_width(level)));
	}
	return err;
}

/* Merges the chunk's points of existing jobs into the rollup, per series;
 * the points that replaced others are left to rebuild_replaced. */
static int update_rollups(struct conn *c, const struct qitem *items, size_t n, struct batch_job *jobs, size_t nj,
			  const bool *replaced)
{
	const struct qitem **order = malloc(n * sizeof *order);
	struct mpoint *pts = malloc(n * sizeof *pts);
	int err = 0;
	if (!order || !pts) {
		err = tr_store_cfail(c, -ENOMEM, "out of memory");
		goto cleanup;
	}
	size_t m = 0;
	for (size_t i = 0; i < n; i++) {
		if (items[i].level >= 0 || replaced[i])
			continue;
		const struct batch_job *j = bsearch(&items[i].job_id, jobs, nj, sizeof *jobs, cmp_job);
		if (j && j->exists)
			order[m++] = &items[i];
	}
	qsort(order, m, sizeof *order, cmp_series);
	for (size_t i = 0; i < m;) {
		size_t k = i;
		for (; k < m && cmp_name(order[k], order[i]) == 0; k++)
			pts[k - i] = (struct mpoint){order[k]->step, order[k]->epoch, order[k]->wall, order[k]->value};
		err = tr_store_rollup_add(c, order[i]->job_id, item_text(order[i]), pts, k - i);
		if (err < 0)
			goto cleanup;
		i = k;
	}
cleanup:
	free(order);
	free(pts);
	return err;
}

/* touched (room for n) receives the ids of the jobs the chunk wrote to;
 * NULL when the caller could not make room. */
static int write_tx(tr_store_t *s, const struct qitem *items, size_t n, int64_t *max_event, int64_t *touched,
		    size_t *ntouched)
{
	struct conn *c = &s->wconn;
	struct batch_job *jobs = NULL;
	size_t nj = 0, nreplaced = 0;
	double now = tr_store_now();
	*max_event = 0; /* ids of a rolled-back try do not count */
	bool *replaced = calloc(n, sizeof *replaced);
	if (!replaced)
		return tr_store_cfail(c, -ENOMEM, "out of memory");
	int err = tr_store_begin(c, true);
	if (err < 0) {
		free(replaced);
		return err;
	}
	err = load_jobs(c, items, n, &jobs, &nj);
	if (err < 0)
		goto cleanup;
	for (size_t i = 0; i < n && !err; i++) {
		struct batch_job *j = bsearch(&items[i].job_id, jobs, nj, sizeof *jobs, cmp_job);
		if (!j->exists)
			continue;
		if (items[i].level < 0) {
			err = insert_point(c, j, &items[i], now, max_event, &replaced[i]);
			nreplaced += replaced[i];
		} else
			err = insert_log(c, &items[i], now, max_event);
	}
	for (size_t j = 0; j < nj && !err; j++)
		if (jobs[j].npoints)
			err = emit_metrics_event(c, &jobs[j], now, max_event);
	if (!err)
		err = update_rollups(c, items, n, jobs, nj, replaced);
	if (!err && nreplaced)
		err = rebuild_replaced(c, items, n, replaced);
	if (!err)
		err = tr_store_commit(c);
	if (!err && nreplaced)
		tr_store_metrics_rewritten();
	*ntouched = 0;
	for (size_t j = 0; j < nj && !err && touched; j++)
		if (jobs[j].exists)
			touched[(*ntouched)++] = jobs[j].id;
cleanup:
	if (err < 0)
		tr_store_rollback(c);
	for (size_t j = 0; j < nj; j++)
		free(jobs[j].buf.p);
	free(jobs);
	free(replaced);
	return err;
}

size_t tr_store_write_batch(tr_store_t *s, struct qitem *items, size_t n)
{
	/* Only the jobs written to get a new data generation, so a running
	 * job's flushes leave other jobs' cached answers valid; without room
	 * for the list, every job does. */
	int64_t *touched = malloc((n < TX_ITEMS ? n : TX_ITEMS) * sizeof *touched);
	/* Why a chunk failed, for the next tr_store_flush: the writer's
	 * connection reports into it (only this thread uses that connection
	 * while the writer runs). */
	struct tr_error e = {0};
	s->wconn.err = &e;
	size_t i;
	for (i = 0; i < n; i += TX_ITEMS) {
		size_t m = n - i < TX_ITEMS ? n - i : TX_ITEMS, ntouched = 0;
		int64_t max_event = 0;
		int err = write_tx(s, items + i, m, &max_event, touched, &ntouched);
		/* Busy means another connection held the write lock past the
		 * busy timeout (a huge cascade delete): the chunk was rolled
		 * back whole, so trying again is safe, and beats dropping. */
		for (int tries = 0; err == -EBUSY && tries < BUSY_RETRIES; tries++)
			err = write_tx(s, items + i, m, &max_event, touched, &ntouched);
		if (err == 0) {
			if (max_event)
				tr_store_commit_hook_run(s, max_event, touched, ntouched);
			continue;
		}
		pthread_mutex_lock(&s->q_lock);
		s->err_code = err;
		snprintf(s->err_msg, sizeof s->err_msg, "%s", e.message);
		if (tr_store_err_transient(err)) {
			/* Storage will take it later (a full disk freed, a
			 * read-only directory fixed): keep this chunk and
			 * everything after it, in order, for the next try. */
			pthread_mutex_unlock(&s->q_lock);
			break;
		}
		/* Nothing of this chunk was written and never will be: count
		 * it as dropped and let the next tr_store_flush report why. */
		s->err_from = s->seq_done + i;
		s->err_to = s->seq_done + i + m;
		for (size_t k = i; k < i + m; k++)
			tr_store_drops_add(s, items[k].job_id, 1);
		pthread_mutex_unlock(&s->q_lock);
	}
	s->wconn.err = NULL;
	free(touched);
	return i < n ? i : n;
}
