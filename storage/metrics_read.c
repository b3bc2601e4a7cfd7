/* Reading metrics: series queries with min/max downsampling, the list of
 * names, the last value and sum of a series; and truncation on resume,
 * which deletes what a resumed run will write again (it shares the name
 * walk and invalidates the memo of whole-curve answers kept here).  The
 * points are written by the metrics writer (metrics_queue.c,
 * metrics_write.c).
 *
 * Downsampling (the contract is in store.h).  The series' first step is a
 * bucket of its own; the rest of its range is cut into aligned buckets of
 * a power-of-two width w, the smallest that gives at most max_points - 1
 * of them.  Aligned buckets keep their edges while a running job's series
 * grows (a dashboard's envelope does not shift under the user), and since
 * rollup blocks are aligned powers of two as well, the query reads the
 * coarsest rollup level whose blocks fit in a bucket and takes every whole
 * block as it is: only the blocks cut by the range ends are read one
 * level down.  A bucket is shown as its last point, so the newest value
 * is always there: the last point of its latest block, kept in the rollup
 * (one index seek into the raw points only for rows written before the
 * rollup kept it), so a query reads O(points returned) rows, whatever the
 * number of raw points in range.
 */
#include "storage/internal.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static const char sql_first[] = "SELECT step FROM metrics WHERE job_id = ?1 AND name = ?2 AND step >= ?3"
				" ORDER BY step LIMIT 1";
static const char sql_last[] = "SELECT step FROM metrics WHERE job_id = ?1 AND name = ?2 AND step <= ?3"
			       " ORDER BY step DESC LIMIT 1";
static const char sql_range[] = "SELECT step, epoch, wall, value FROM metrics"
				" WHERE job_id = ?1 AND name = ?2 AND step BETWEEN ?3 AND ?4 ORDER BY step, rowid";
static const char sql_last_point[] = "SELECT step, epoch, wall, value FROM metrics"
				     " WHERE job_id = ?1 AND name = ?2 AND step <= ?3"
				     " ORDER BY step DESC, rowid DESC LIMIT 1";
/* One index seek per name instead of a DISTINCT over every point. */
static const char sql_next_name[] = "SELECT name FROM metrics WHERE job_id = ?1 AND name > ?2"
				    " ORDER BY name LIMIT 1";

struct names {
	char **v;
	size_t n, cap;
};

static void names_free(struct names *ns)
{
	for (size_t i = 0; i < ns->n; i++)
		free(ns->v[i]);
	free(ns->v);
	*ns = (struct names){0};
}

static int names_push(struct names *ns, const char *name, struct tr_error *e)
{
	if (ns->n == ns->cap) {
		size_t cap = ns->cap ? 2 * ns->cap : 16;
		char **v = realloc(ns->v, cap * sizeof *v);
		if (!v)
			return tr_error_set(e, -ENOMEM, 0, NULL, "out of memory");
		ns->v = v;
		ns->cap = cap;
	}
	if (!(ns->v[ns->n] = strdup(name)))
		return tr_error_set(e, -ENOMEM, 0, NULL, "out of memory");
	ns->n++;
	return 0;
}

/* The job's metric names in name order. */
static int load_names(struct conn *c, int64_t job_id, struct names *ns)
{
	sqlite3_stmt *st = tr_store_stmt(c, sql_next_name);
	if (!st)
		return -EIO;
	for (;;) {
		sqlite3_reset(st);
		sqlite3_bind_int64(st, 1, job_id);
		/* Names are never empty, so "" starts before the first. */
		sqlite3_bind_text(st, 2, ns->n ? ns->v[ns->n - 1] : "", -1, SQLITE_STATIC);
		int rc = sqlite3_step(st);
		if (rc == SQLITE_DONE)
			break;
		if (rc != SQLITE_ROW) {
			int err = SQLFAIL(c, rc, "SELECT metric names");
			sqlite3_reset(st);
			return err;
		}
		int err = names_push(ns, (const char *)sqlite3_column_text(st, 0), c->err);
		if (err < 0) {
			sqlite3_reset(st);
			return err;
		}
	}
	sqlite3_reset(st);
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* ---- reading points ------------------------------------------------------------ */

struct pts {
	struct tr_metrics_point *v;
	size_t n, cap;
};

static int pts_push(struct pts *o, const struct mpoint *p, double min, double max, struct tr_error *e)
{
	if (o->n == o->cap) {
		size_t cap = o->cap ? 2 * o->cap : 64;
		struct tr_metrics_point *v = realloc(o->v, cap * sizeof *v);
		if (!v)
			return tr_error_set(e, -ENOMEM, 0, NULL, "out of memory");
		o->v = v;
		o->cap = cap;
	}
	o->v[o->n++] = (struct tr_metrics_point){p->step, p->epoch, p->wall, p->value, min, max};
	return 0;
}

static struct mpoint row_point(sqlite3_stmt *st)
{
	return (struct mpoint){sqlite3_column_int64(st, 0), sqlite3_column_int64(st, 1), sqlite3_column_double(st, 2),
			       tr_store_col_value(st, 3)};
}

static int raw_points(struct conn *c, int64_t job_id, const char *name, int64_t lo, int64_t hi, int64_t count,
		      struct pts *o)
{
	/* Sized once from the count the caller has (points may still come
	 * beyond it: the array grows then). */
	if (count > 0 && !o->v) {
		o->v = malloc((size_t)count * sizeof *o->v);
		if (!o->v)
			return tr_store_cfail(c, -ENOMEM, "out of memory");
		o->cap = (size_t)count;
	}
	sqlite3_stmt *st = tr_store_stmt(c, sql_range);
	if (!st)
		return -EIO;
	sqlite3_bind_int64(st, 1, job_id);
	sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
	sqlite3_bind_int64(st, 3, lo);
	sqlite3_bind_int64(st, 4, hi);
	int rc, err = 0;
	while (!err && (rc = sqlite3_step(st)) == SQLITE_ROW) {
		struct mpoint p = row_point(st);
		err = pts_push(o, &p, p.value, p.value, c->err);
	}
	sqlite3_reset(st);
	return err ? err : rc == SQLITE_DONE ? 0 : SQLFAIL(c, rc, "SELECT metrics");
}

/* The last point (in step order, the latest written among equal steps)
 * at or below bound; the caller knows there is one. */
static int last_point(struct conn *c, int64_t job_id, const char *name, int64_t bound, struct mpoint *p)
{
	sqlite3_stmt *st = tr_store_stmt(c, sql_last_point);
	if (!st)
		return -EIO;
	sqlite3_bind_int64(st, 1, job_id);
	sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
	sqlite3_bind_int64(st, 3, bound);
	int rc = sqlite3_step(st);
	if (rc == SQLITE_ROW)
		*p = row_point(st);
	sqlite3_reset(st);
	return rc == SQLITE_ROW ? 0 : SQLFAIL(c, rc == SQLITE_DONE ? SQLITE_CORRUPT : rc, "SELECT last metric");
}

/* ---- downsampling -------------------------------------------------------------- */

struct bucket {
	struct msum sum;
	struct mpoint last; /* valid when last_known */
	bool last_known;
};

/* Buckets of [a, b]: absolute step ranges [k*w, k*w + w - 1] (w a power
 * of two), bucket k at b[k - k0].  With w at least a rollup block's width
 * and both powers of two, a block never straddles two buckets. */
struct ds {
	struct conn *c;
	int64_t job_id;
	const char *name;
	int64_t w, k0;
	struct bucket *b;
};

static struct bucket *bucket_for(const struct ds *d, int64_t step)
{
	return &d->b[tr_store_floordiv(step, d->w) - d->k0];
}

/* Adds the points of [a, b] to their buckets: whole blocks of `level`
 * as they are, blocks cut by the range ends one level down. */
static int scan(struct ds *d, int level, int64_t a, int64_t b)
{
	if (level == 0) {
		sqlite3_stmt *st = tr_store_stmt(d->c, sql_range);
		if (!st)
			return -EIO;
		sqlite3_bind_int64(st, 1, d->job_id);
		sqlite3_bind_text(st, 2, d->name, -1, SQLITE_STATIC);
		sqlite3_bind_int64(st, 3, a);
		sqlite3_bind_int64(st, 4, b);
		int rc;
		while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
			struct mpoint p = row_point(st);
			struct bucket *k = bucket_for(d, p.step);
			tr_store_msum_add(&k->sum, &p);
			/* Rows come in step order: the last one seen is the
			 * bucket's last unless a later block is merged. */
			k->last = p;
			k->last_known = true;
		}
		sqlite3_reset(st);
		return rc == SQLITE_DONE ? 0 : SQLFAIL(d->c, rc, "SELECT metrics");
	}
	int64_t w = tr_store_rollup_width(level);
	struct rollup_row *rows;
	size_t n;
	int err = tr_store_rollup_fetch(d->c, d->job_id, d->name, level, tr_store_floordiv(a, w),
					tr_store_floordiv(b, w), &rows, &n);
	if (err < 0)
		return err;
	for (size_t i = 0; i < n && !err; i++) {
		int64_t start = rows[i].block * w, end = start + w - 1;
		if (start >= a && end <= b) {
			/* Blocks come in step order: a known last point of the
			 * latest one is its bucket's so far (unknown in rows
			 * from before the rollup kept it: emit_buckets seeks). */
			struct bucket *k = bucket_for(d, start);
			tr_store_msum_merge(&k->sum, &rows[i].sum);
			k->last = rows[i].sum.last;
			k->last_known = rows[i].sum.last_known;
			continue;
		}
		err = scan(d, level - 1, start > a ? start : a, end < b ? end : b);
	}
	free(rows);
	return err;
}

/* Coarsest rollup level whose blocks fit in a bucket of width w. */
static int level_for(int64_t w)
{
	int level = 0;
	while (level < ROLLUP_LEVELS && tr_store_rollup_width(level + 1) <= w)
		level++;
	return level;
}

/* Sums [a, b] into buckets of width w; d->b is calloc'd (the caller frees). */
static int bucketize(struct ds *d, int64_t a, int64_t b, int64_t w)
{
	d->w = w;
	d->k0 = tr_store_floordiv(a, w);
	d->b = calloc((size_t)(tr_store_floordiv(b, w) - d->k0 + 1), sizeof *d->b);
	if (!d->b)
		return tr_store_cfail(d->c, -ENOMEM, "out of memory");
	return scan(d, level_for(w), a, b);
}

/* Emits one point per non-empty bucket: its last point, with the
 * bucket's extremes. */
static int emit_buckets(struct ds *d, int64_t b, struct pts *o)
{
	int64_t nb = tr_store_floordiv(b, d->w) - d->k0 + 1;
	for (int64_t i = 0; i < nb; i++) {
		struct bucket *k = &d->b[i];
		if (k->sum.n == 0)
			continue;
		if (!k->last_known) {
			int64_t end = (d->k0 + i) * d->w + d->w - 1;
			int err = last_point(d->c, d->job_id, d->name, end < b ? end : b, &k->last);
			if (err < 0)
				return err;
		}
		int err = pts_push(o, &k->last, k->sum.min.value, k->sum.max.value, d->c->err);
		if (err < 0)
			return err;
	}
	return 0;
}

/* Number of buckets of width w that [a, b] touches. */
static int64_t buckets_touched(int64_t a, int64_t b, int64_t w)
{
	return tr_store_floordiv(b, w) - tr_store_floordiv(a, w) + 1;
}

static int64_t bucket_total(const struct ds *d, int64_t a, int64_t b)
{
	int64_t total = 0;
	for (int64_t i = 0; i < buckets_touched(a, b, d->w); i++)
		total += d->b[i].sum.n;
	return total;
}

/* The series' points in [lo, hi] (its first and last steps in range):
 * raw when there are at most max_points (or max_points is 0), else one
 * point per bucket as store.h describes. */
static int series_points(struct conn *c, int64_t job_id, const char *name, int64_t lo, int64_t hi,
			 const struct tr_metrics_query *q, struct tr_metrics_series *out)
{
	struct ds d = {.c = c, .job_id = job_id, .name = name};
	struct ds head = {.c = c, .job_id = job_id, .name = name};
	struct pts o = {0};
	int64_t m = q->max_points, total;
	int err;

	if (m == 0 || m == 1) {
		/* m == 0: only the count, from one bucket per 2^62 steps. */
		int64_t w = m == 0 ? INT64_C(1) << 62 : 1;
		while (buckets_touched(lo, hi, w) > 1 && m == 1)
			w *= 2;
		err = bucketize(&d, lo, hi, w);
		total = err < 0 ? 0 : bucket_total(&d, lo, hi);
		out->total = total;
		if (err == 0 && m == 0 && q->max_raw > 0 && total > q->max_raw)
			err = tr_store_cfail(
				c, -E2BIG,
				"series \"%s\" has %lld points in range, more than the %lld an undownsampled "
				"answer may hold",
				name, (long long)total, (long long)q->max_raw);
		if (err < 0 || q->count_only)
			goto done;
		if (m == 0 || total <= 1) {
			err = raw_points(c, job_id, name, lo, hi, total, &o);
			goto done;
		}
		/* m == 1: the last point, with the extremes of the whole range. */
		out->downsampled = true;
		err = emit_buckets(&d, hi, &o);
		goto done;
	}
	/* The first step is a bucket of its own; the rest of the range is
	 * cut into at most m - 1 aligned buckets of the smallest power-of-two
	 * width that fits. */
	err = bucketize(&head, lo, lo, 1);
	if (err < 0)
		goto done;
	total = head.b[0].sum.n;
	int64_t w = 1;
	if (hi > lo) {
		while (buckets_touched(lo + 1, hi, w) > m - 1)
			w *= 2;
		err = bucketize(&d, lo + 1, hi, w);
		if (err < 0)
			goto done;
		total += bucket_total(&d, lo + 1, hi);
	}
	out->total = total;
	if (total <= m || q->count_only) {
		if (!q->count_only)
			err = raw_points(c, job_id, name, lo, hi, total, &o);
		goto done;
	}
	out->downsampled = true;
	err = emit_buckets(&head, lo, &o);
	if (err == 0 && hi > lo)
		err = emit_buckets(&d, hi, &o);
done:
	free(d.b);
	free(head.b);
	if (err < 0) {
		free(o.v);
		return err;
	}
	out->pts = o.v;
	out->n = o.n;
	return 0;
}

/* ---- text, and the running curve's memo ------------------------------------------ */

/* A number as jansson writes a real: always with a '.' or an exponent,
 * so that it reads back as a real. */
static void text_real(struct jbuf *b, double v)
{
	size_t at = b->n;
	tr_store_jbuf_num(b, v);
	if (b->oom || !isfinite(v))
		return;
	for (size_t i = at; i < b->n; i++)
		if (b->p[i] == '.' || b->p[i] == 'e')
			return;
	JBUF_LIT(b, ".0");
}

enum col { COL_STEP, COL_VALUE, COL_MIN, COL_MAX, COL_EPOCH, COL_TIME, NCOLS };
static const char *const col_keys[NCOLS] = {"steps", "values", "min", "max", "epochs", "times"};

static bool col_wanted(enum col col, bool downsampled, bool epochs, bool times)
{
	return col == COL_STEP || col == COL_VALUE || ((col == COL_MIN || col == COL_MAX) && downsampled) ||
	       (col == COL_EPOCH && epochs) || (col == COL_TIME && times);
}

/* Appends one point's entry to a column's text (comma-separated): steps
 * and epochs as integers, the rest as reals. */
static void col_put(struct jbuf *b, enum col col, const struct tr_metrics_point *p)
{
	if (b->n)
		JBUF_LIT(b, ",");
	if (col == COL_STEP || col == COL_EPOCH) {
		tr_store_jbuf_int(b, col == COL_STEP ? p->step : p->epoch);
		return;
	}
	text_real(b, col == COL_VALUE ? p->value : col == COL_MIN ? p->min : col == COL_MAX ? p->max : p->wall);
}

/* Sizes a buffer for what is about to be written: no doubling copies of
 * a large series' text (pages reserved but not written cost no memory). */
static void jbuf_reserve(struct jbuf *b, size_t cap)
{
	if (b->oom || b->cap >= cap)
		return;
	char *p = realloc(b->p, cap);
	if (!p) {
		b->oom = true;
		return;
	}
	b->p = p;
	b->cap = cap;
}

/* `"name":{"downsampled":..,"steps":[..],..}` from each column's text in
 * two parts (a and b, either may be empty). */
static int series_text_join(const char *name, bool downsampled, bool epochs, bool times, const struct jbuf *a,
			    const struct jbuf *b, char **text, size_t *len, struct tr_error *e)
{
	struct jbuf o = {0};
	size_t need = 6 * strlen(name) + 64;
	for (int c = 0; c < NCOLS; c++)
		need += (a ? a[c].n : 0) + (b ? b[c].n : 0) + 16;
	jbuf_reserve(&o, need);
	tr_store_jbuf_str(&o, name);
	JBUF_LIT(&o, ":{\"downsampled\":");
	if (downsampled)
		JBUF_LIT(&o, "true");
	else
		JBUF_LIT(&o, "false");
	for (int c = 0; c < NCOLS; c++) {
		if (!col_wanted(c, downsampled, epochs, times))
			continue;
		JBUF_LIT(&o, ",\"");
		tr_store_jbuf_raw(&o, col_keys[c], strlen(col_keys[c]));
		JBUF_LIT(&o, "\":[");
		if (a && a[c].n)
			tr_store_jbuf_raw(&o, a[c].p, a[c].n);
		if (a && a[c].n && b && b[c].n)
			JBUF_LIT(&o, ",");
		if (b && b[c].n)
			tr_store_jbuf_raw(&o, b[c].p, b[c].n);
		JBUF_LIT(&o, "]");
	}
	JBUF_LIT(&o, "}");
	if (o.oom) {
		free(o.p);
		return tr_error_set(e, -ENOMEM, 0, NULL, "out of memory");
	}
	*text = o.p;
	*len = o.n;
	return 0;
}

static void cols_free(struct jbuf *c)
{
	for (int i = 0; i < NCOLS; i++)
		free(c[i].p);
	memset(c, 0, NCOLS * sizeof *c);
}

static bool cols_oom(const struct jbuf *c)
{
	for (int i = 0; i < NCOLS; i++)
		if (c[i].oom)
			return true;
	return false;
}

static struct tr_metrics_point out_point(const struct bucket *k)
{
	return (struct tr_metrics_point){k->last.step,  k->last.epoch,    k->last.wall,
					 k->last.value, k->sum.min.value, k->sum.max.value};
}

/* A dashboard re-reads a running job's whole downsampled curve after
 * every commit of its points, and computing it whole costs milliseconds
 * per series (rollup rows, one seek per bucket, number formatting).  Yet
 * between two commits only the end of a series changes: aligned buckets
 * keep their edges, and a coarser width only merges whole buckets.  So the
 * last answer of each whole-curve query (to_step open) is kept: its
 * buckets and the text of the points before its last bucket, which no
 * append can change.  The next answer scans only the steps after the
 * previous last one.  The memo is used only while the series grew by
 * appends alone: the same first step, a later or equal last step, the
 * same number of points up to the previous last step, and no truncation
 * since (truncations count in trunc_gen). */
#define MEMO_SLOTS 32
#define MEMO_MAX_POINTS 10000

static atomic_uint_fast64_t trunc_gen;

struct memo {
	const void *store;
	int64_t job, from;
	char *name;
	int max_points;
	bool epochs, times;
	uint64_t gen; /* trunc_gen read before the snapshot */
	uint64_t used;
	int64_t lo, hi, w, total;
	struct bucket head;
	struct bucket *b; /* tail buckets of [lo + 1, hi]: k0 .. k0 + nb - 1 */
	int64_t k0, nb;
	/* Text of the head and of the non-empty tail buckets before index
	 * closed (relative to k0), as raw points (no min/max) or downsampled. */
	struct jbuf text[NCOLS];
	int64_t closed;
	bool raw;
};

static pthread_mutex_t memo_lock = PTHREAD_MUTEX_INITIALIZER;
static struct memo *memos[MEMO_SLOTS];
static uint64_t memo_tick;

static void memo_free(struct memo *m)
{
	if (!m)
		return;
	free(m->name);
	free(m->b);
	cols_free(m->text);
	free(m);
}

static bool memo_same(const struct memo *m, const void *store, int64_t job, const char *name,
		      const struct tr_metrics_query *q)
{
	return m->store == store && m->job == job && m->from == q->from_step && m->max_points == q->max_points &&
	       m->epochs == q->with_epochs && m->times == q->with_times && strcmp(m->name, name) == 0;
}

/* Takes the memo of a query out of the table (the caller owns it). */
static struct memo *memo_take(const void *store, int64_t job, const char *name, const struct tr_metrics_query *q)
{
	struct memo *m = NULL;
	pthread_mutex_lock(&memo_lock);
	for (int i = 0; i < MEMO_SLOTS && !m; i++)
		if (memos[i] && memo_same(memos[i], store, job, name, q)) {
			m = memos[i];
			memos[i] = NULL;
		}
	pthread_mutex_unlock(&memo_lock);
	return m;
}

static bool memo_same_query(const struct memo *a, const struct memo *b)
{
	return a->store == b->store && a->job == b->job && a->from == b->from && a->max_points == b->max_points &&
	       a->epochs == b->epochs && a->times == b->times && strcmp(a->name, b->name) == 0;
}

/* Puts m back (or drops it when a newer one of the same query is there);
 * a full table loses its least recently used memo. */
static void memo_put(struct memo *m)
{
	struct memo *drop = m;
	int same = -1, empty = -1, lru = -1;
	pthread_mutex_lock(&memo_lock);
	for (int i = 0; i < MEMO_SLOTS; i++) {
		if (!memos[i]) {
			if (empty < 0)
				empty = i;
		} else if (memo_same_query(memos[i], m)) {
			same = i;
		} else if (lru < 0 || memos[i]->used < memos[lru]->used) {
			lru = i;
		}
	}
	int slot = same >= 0 ? same : empty >= 0 ? empty : lru;
	if (slot >= 0 && !(same >= 0 && memos[same]->hi > m->hi)) {
		drop = memos[slot];
		memos[slot] = m;
		m->used = ++memo_tick;
	}
	pthread_mutex_unlock(&memo_lock);
	memo_free(drop);
}

void tr_store_metrics_memo_forget(const tr_store_t *s)
{
	pthread_mutex_lock(&memo_lock);
	for (int i = 0; i < MEMO_SLOTS; i++)
		if (memos[i] && memos[i]->store == s) {
			memo_free(memos[i]);
			memos[i] = NULL;
		}
	pthread_mutex_unlock(&memo_lock);
}

/* Appends the text of the non-empty tail buckets [i0, i1) to cols. */
static void memo_render(const struct memo *m, int64_t i0, int64_t i1, struct jbuf *cols)
{
	for (int64_t i = i0; i < i1; i++) {
		if (m->b[i].sum.n == 0)
			continue;
		struct tr_metrics_point p = out_point(&m->b[i]);
		for (int c = 0; c < NCOLS; c++)
			if (col_wanted(c, !m->raw, m->epochs, m->times))
				col_put(&cols[c], c, &p);
	}
}

/* Resolves the last points of buckets [i0, nb) of m. */
static int memo_resolve(struct conn *c, struct memo *m, int64_t i0)
{
	for (int64_t i = i0; i < m->nb; i++) {
		struct bucket *k = &m->b[i];
		if (k->sum.n == 0 || k->last_known)
			continue;
		int64_t end = (m->k0 + i) * m->w + m->w - 1;
		int err = last_point(c, m->job, m->name, end < m->hi ? end : m->hi, &k->last);
		if (err < 0)
			return err;
		k->last_known = true;
	}
	return 0;
}

/* Brings m (valid for [lo, m->hi]) to hi: coarser buckets when needed,
 * then the new steps scanned into them. */
static int memo_extend(struct conn *c, struct memo *m, int64_t hi, int64_t w)
{
	int64_t k0 = tr_store_floordiv(m->lo + 1, w), nb = tr_store_floordiv(hi, w) - k0 + 1;
	struct bucket *b = calloc((size_t)nb, sizeof *b);
	if (!b)
		return tr_store_cfail(c, -ENOMEM, "out of memory");
	/* Old buckets merge into the new ones in step order, so the last
	 * point of the latest non-empty one is the merged bucket's. */
	for (int64_t i = 0; i < m->nb; i++) {
		if (m->b[i].sum.n == 0)
			continue;
		struct bucket *k = &b[tr_store_floordiv((m->k0 + i) * m->w, w) - k0];
		tr_store_msum_merge(&k->sum, &m->b[i].sum);
		k->last = m->b[i].last;
		k->last_known = true;
	}
	if (w != m->w) {
		cols_free(m->text);
		m->closed = 0;
	}
	free(m->b);
	m->b = b;
	m->k0 = k0;
	m->nb = nb;
	m->w = w;
	if (hi > m->hi) {
		struct ds d = {.c = c, .job_id = m->job, .name = m->name, .w = w, .k0 = k0, .b = b};
		int err = scan(&d, level_for(w), m->hi + 1, hi);
		if (err < 0)
			return err;
	}
	m->hi = hi;
	return 0;
}

/* The series' text from m: the head, the kept text, the rest rendered;
 * the kept text then grows to just before the new last bucket. */
static int memo_text(struct memo *m, bool raw, char **text, size_t *len, struct tr_error *e)
{
	struct jbuf tail[NCOLS] = {{0}};
	int64_t last = tr_store_floordiv(m->hi, m->w) - m->k0;
	if (raw != m->raw) {
		cols_free(m->text);
		m->closed = 0;
		m->raw = raw;
	}
	if (m->closed == 0 && m->text[COL_STEP].n == 0) {
		struct tr_metrics_point p = out_point(&m->head);
		for (int c = 0; c < NCOLS; c++)
			if (col_wanted(c, !raw, m->epochs, m->times))
				col_put(&m->text[c], c, &p);
	}
	memo_render(m, m->closed, last, m->text);
	m->closed = last;
	memo_render(m, last, m->nb, tail);
	int err = cols_oom(m->text) || cols_oom(tail)
			  ? tr_error_set(e, -ENOMEM, 0, NULL, "out of memory")
			  : series_text_join(m->name, !raw, m->epochs, m->times, m->text, tail, text, len, e);
	cols_free(tail);
	return err;
}

/* The downsampled text of a whole-curve query through the memo: 1 done,
 * 0 when the series is not downsampled at this size (the caller reads it
 * raw), <0 error. */
static int memo_series(struct conn *c, const void *store, int64_t job_id, const char *name, int64_t lo, int64_t hi,
		       const struct tr_metrics_query *q, uint64_t gen, struct tr_metrics_series *out)
{
	int64_t m_pts = q->max_points, w = 1;
	if (hi == lo)
		return 0; /* one step: nothing to keep */
	while (buckets_touched(lo + 1, hi, w) > m_pts - 1)
		w *= 2;
	struct memo *m = memo_take(store, job_id, name, q);
	if (m && (m->gen != gen || m->lo != lo || m->hi > hi || w < m->w)) {
		memo_free(m);
		m = NULL;
	}
	if (m) {
		/* Appends only: the points up to the old last step are as many
		 * as before. */
		struct ds d = {.c = c, .job_id = job_id, .name = name};
		int err = bucketize(&d, lo, m->hi, INT64_C(1) << 62);
		int64_t n = err < 0 ? -1 : bucket_total(&d, lo, m->hi);
		free(d.b);
		if (err < 0) {
			memo_free(m);
			return err;
		}
		if (n != m->total) {
			memo_free(m);
			m = NULL;
		}
	}
	int err = 0;
	bool raw = false;
	if (!m) {
		m = calloc(1, sizeof *m);
		if (!m || !(m->name = strdup(name))) {
			memo_free(m);
			return tr_store_cfail(c, -ENOMEM, "out of memory");
		}
		m->store = store;
		m->job = job_id;
		m->from = q->from_step;
		m->max_points = q->max_points;
		m->epochs = q->with_epochs;
		m->times = q->with_times;
		m->gen = gen;
		m->lo = m->hi = lo;
		m->w = w;
		struct ds head = {.c = c, .job_id = job_id, .name = name};
		err = bucketize(&head, lo, lo, 1);
		if (err == 0)
			m->head = head.b[0];
		free(head.b);
		m->total = m->head.sum.n;
		m->k0 = tr_store_floordiv(lo + 1, w);
		m->nb = 0;
	}
	if (err == 0)
		err = memo_extend(c, m, hi, w);
	if (err == 0) {
		int64_t total = m->head.sum.n;
		for (int64_t i = 0; i < m->nb; i++)
			total += m->b[i].sum.n;
		m->total = total;
		out->total = total;
		raw = total <= m_pts;
		/* Not downsampled: the buckets are the raw points when each holds
		 * one (width 1, no repeated step); otherwise read them raw. */
		bool single = m->w == 1 && m->head.sum.n == 1;
		for (int64_t i = 0; raw && single && i < m->nb; i++)
			single = m->b[i].sum.n <= 1;
		if (raw && !single) {
			memo_free(m);
			return 0;
		}
		err = memo_resolve(c, m, 0);
	}
	if (err == 0)
		err = memo_text(m, raw, &out->text, &out->text_len, c->err);
	if (err < 0) {
		memo_free(m);
		return err;
	}
	out->downsampled = !raw;
	memo_put(m);
	return 1;
}

/* ---- queries ------------------------------------------------------------------- */

/* First (dir > 0) or last (dir < 0) step of a series within a bound;
 * 1 found, 0 none, <0 error. */
static int edge_step(struct conn *c, int64_t job_id, const char *name, int dir, int64_t bound, int64_t *step)
{
	sqlite3_stmt *st = tr_store_stmt(c, dir > 0 ? sql_first : sql_last);
	if (!st)
		return -EIO;
	sqlite3_bind_int64(st, 1, job_id);
	sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
	sqlite3_bind_int64(st, 3, bound);
	int rc = sqlite3_step(st);
	if (rc == SQLITE_ROW)
		*step = sqlite3_column_int64(st, 0);
	sqlite3_reset(st);
	return rc == SQLITE_ROW ? 1 : rc == SQLITE_DONE ? 0 : SQLFAIL(c, rc, "SELECT metrics");
}

/* 1 and *out filled, 0 when the series has no points in range. */
static int query_series(struct conn *c, const void *store, int64_t job_id, const char *name,
			const struct tr_metrics_query *q, uint64_t gen, struct tr_metrics_series *out)
{
	int64_t from = q->from_step < -STORE_STEP_LIMIT ? -STORE_STEP_LIMIT : q->from_step;
	int64_t to = q->to_step > STORE_STEP_LIMIT ? STORE_STEP_LIMIT : q->to_step;
	int64_t lo, hi;
	memset(out, 0, sizeof *out);
	out->name = name;
	int found = edge_step(c, job_id, name, 1, from, &lo);
	if (found > 0)
		found = edge_step(c, job_id, name, -1, to, &hi);
	if (found <= 0 || lo > hi)
		return found < 0 ? found : 0; /* no points in range: no series */
	/* An incremental poll (from_step just past what a client has, a new
	 * one each time, over however many steps the job made since) would
	 * only fill the memo table with queries never asked again and push
	 * out the whole curves': a range starting past 0 is read directly,
	 * which costs as much as a first memo would. */
	bool whole = q->from_step <= 0;
	if (q->want_text && !q->count_only && q->to_step >= STORE_STEP_LIMIT && q->max_points >= 2 &&
	    q->max_points <= MEMO_MAX_POINTS && whole) {
		int done = memo_series(c, store, job_id, name, lo, hi, q, gen, out);
		if (done != 0)
			return done;
	}
	int err = series_points(c, job_id, name, lo, hi, q, out);
	return err < 0 ? err : 1;
}

void tr_metrics_series_finish(struct tr_metrics_series *s)
{
	if (!s)
		return;
	free(s->pts);
	free(s->text);
	s->pts = NULL;
	s->text = NULL;
	s->n = 0;
}

int tr_store_metrics_read(tr_store_t *s, int64_t job_id, const struct tr_metrics_query *q, tr_metrics_series_fn fn,
			  void *ctx, struct tr_error *e)
{
	if (q->max_points < 0)
		return tr_error_set(e, -EINVAL, 0, NULL, "max_points must be >= 0, not %d", q->max_points);
	struct names ns = {0};
	struct conn *c = tr_store_conn_lend(s, e);
	/* Read before the snapshot, so a truncation that commits meanwhile
	 * makes memos of this read outdated (see memo_series). */
	uint64_t gen = atomic_load(&trunc_gen);
	/* One read transaction: every series, the rollup and the raw points
	 * come from the same snapshot. */
	int err = tr_store_begin(c, false);
	if (err < 0)
		goto cleanup;
	if (q->names) {
		for (const char *const *n = q->names; *n && !err; n++)
			err = names_push(&ns, *n, c->err);
		if (err < 0)
			goto cleanup;
		qsort(ns.v, ns.n, sizeof *ns.v, cmp_str);
	} else {
		err = load_names(c, job_id, &ns);
		if (err < 0)
			goto cleanup;
	}
	for (size_t i = 0; i < ns.n && !err; i++) {
		if (i > 0 && strcmp(ns.v[i], ns.v[i - 1]) == 0)
			continue;
		struct tr_metrics_series ser;
		err = query_series(c, s, job_id, ns.v[i], q, gen, &ser);
		if (err > 0) {
			err = fn ? fn(ctx, &ser) : 0;
			tr_metrics_series_finish(&ser);
		}
	}
cleanup:
	tr_store_conn_put(s, c); /* ends the read transaction */
	names_free(&ns);
	return err;
}

/* ---- the JSON forms ----------------------------------------------------------- */

static json_t *num_or_null(double v)
{
	return isfinite(v) ? json_real(v) : json_null(); /* JSON has no NaN or infinity */
}

static int add_json(void *ctx, const struct tr_metrics_series *s)
{
	const struct tr_metrics_query *q = ((void **)ctx)[1];
	json_t *into = ((void **)ctx)[0];
	struct tr_error *e = ((void **)ctx)[2];
	json_t *steps = json_array(), *values = json_array(), *mins = NULL, *maxs = NULL, *epochs = NULL, *times = NULL,
	       *obj = json_object();
	bool oom = !steps || !values || !obj;
	if (s->downsampled) {
		mins = json_array();
		maxs = json_array();
		oom |= !mins || !maxs;
	}
	if (q->with_epochs)
		oom |= !(epochs = json_array());
	if (q->with_times)
		oom |= !(times = json_array());
	for (size_t i = 0; i < s->n && !oom; i++) {
		const struct tr_metrics_point *p = &s->pts[i];
		oom |= json_array_append_new(steps, json_integer(p->step)) != 0;
		oom |= json_array_append_new(values, num_or_null(p->value)) != 0;
		if (mins) {
			oom |= json_array_append_new(mins, num_or_null(p->min)) != 0;
			oom |= json_array_append_new(maxs, num_or_null(p->max)) != 0;
		}
		if (epochs)
			oom |= json_array_append_new(epochs, json_integer(p->epoch)) != 0;
		if (times)
			oom |= json_array_append_new(times, num_or_null(p->wall)) != 0;
	}
	if (!oom) {
		oom |= json_object_set_new(obj, "downsampled", json_boolean(s->downsampled)) != 0;
		oom |= json_object_set(obj, "steps", steps) != 0;
		oom |= json_object_set(obj, "values", values) != 0;
		if (mins) {
			oom |= json_object_set(obj, "min", mins) != 0;
			oom |= json_object_set(obj, "max", maxs) != 0;
		}
		if (epochs)
			oom |= json_object_set(obj, "epochs", epochs) != 0;
		if (times)
			oom |= json_object_set(obj, "times", times) != 0;
		oom |= json_object_set(into, s->name, obj) != 0;
	}
	json_decref(steps);
	json_decref(values);
	json_decref(mins);
	json_decref(maxs);
	json_decref(epochs);
	json_decref(times);
	json_decref(obj);
	return oom ? tr_error_set(e, -ENOMEM, 0, NULL, "out of memory") : 0;
}

json_t *tr_store_metrics_query(tr_store_t *s, int64_t job_id, const struct tr_metrics_query *q, struct tr_error *e)
{
	static const struct tr_metrics_query defaults = {.from_step = 0, .to_step = INT64_MAX};
	if (!q)
		q = &defaults;
	json_t *series = json_object();
	if (!series) {
		tr_error_set(e, -ENOMEM, 0, NULL, "out of memory");
		return NULL;
	}
	void *ctx[3] = {series, (void *)q, e};
	int err = tr_store_metrics_read(s, job_id, q, add_json, ctx, e);
	json_t *result = err < 0 ? NULL : json_pack("{s:O}", "series", series);
	if (!result && err == 0)
		tr_error_set(e, -ENOMEM, 0, NULL, "out of memory");
	json_decref(series);
	return result;
}

int tr_metrics_series_text(const struct tr_metrics_series *s, bool with_epochs, bool with_times, char **text,
			   size_t *len, struct tr_error *e)
{
	if (s->text) {
		*text = malloc(s->text_len ? s->text_len : 1);
		if (!*text)
			return tr_error_set(e, -ENOMEM, 0, NULL, "out of memory");
		memcpy(*text, s->text, s->text_len);
		*len = s->text_len;
		return 0;
	}
	struct jbuf cols[NCOLS] = {{0}};
	/* At most 25 characters a number, and a comma. */
	for (int c = 0; c < NCOLS && s->n > 64; c++)
		if (col_wanted(c, s->downsampled, with_epochs, with_times))
			jbuf_reserve(&cols[c], s->n * 26);
	for (size_t i = 0; i < s->n; i++)
		for (int c = 0; c < NCOLS; c++)
			if (col_wanted(c, s->downsampled, with_epochs, with_times))
				col_put(&cols[c], c, &s->pts[i]);
	int err = cols_oom(cols) ? tr_error_set(e, -ENOMEM, 0, NULL, "out of memory")
				 : series_text_join(s->name, s->downsampled, with_epochs, with_times, cols, NULL, text,
						    len, e);
	cols_free(cols);
	return err;
}

int tr_store_metrics_last(tr_store_t *s, int64_t job_id, const char *const *names, size_t n, struct tr_metric_last *out,
			  struct tr_error *e)
{
	memset(out, 0, n * sizeof *out);
	struct conn *c = tr_store_conn_lend(s, e);
	/* One read transaction for them all: the statements share one
	 * snapshot, and the connection's page cache is checked against the
	 * log once instead of once a name. */
	int rc = tr_store_begin(c, false);
	sqlite3_stmt *st = rc < 0 ? NULL : tr_store_stmt(c, sql_last_point);
	if (rc == 0 && !st)
		rc = -EIO;
	for (size_t i = 0; i < n && rc == 0; i++) {
		sqlite3_bind_int64(st, 1, job_id);
		sqlite3_bind_text(st, 2, names[i], -1, SQLITE_STATIC);
		sqlite3_bind_int64(st, 3, STORE_STEP_LIMIT);
		int r = sqlite3_step(st);
		if (r == SQLITE_ROW) {
			out[i].found = true;
			out[i].step = sqlite3_column_int64(st, 0);
			out[i].value = tr_store_col_value(st, 3);
		} else if (r != SQLITE_DONE) {
			rc = SQLFAIL(c, r, "SELECT last metric");
		}
		sqlite3_reset(st);
	}
	tr_store_conn_put(s, c); /* ends the read transaction */
	return rc;
}

int tr_store_metric_last(tr_store_t *s, int64_t job_id, const char *name, int64_t *step, double *value,
			 struct tr_error *e)
{
	struct tr_metric_last last;
	int rc = tr_store_metrics_last(s, job_id, &name, 1, &last, e);
	if (rc < 0 || !last.found)
		return rc < 0 ? rc : 0;
	*step = last.step;
	*value = last.value;
	return 1;
}

/* Runs sql, one row of two numbers over a job's series a (?2) and b (?3,
 * unbound when NULL), into out[0] and out[1]. */
static int aggregate_pair(tr_store_t *s, const char *sql, int64_t job_id, const char *a, const char *b, double out[2],
			  struct tr_error *e)
{
	struct conn *c = tr_store_conn_lend(s, e);
	sqlite3_stmt *st = tr_store_stmt(c, sql);
	int rc = -EIO;
	out[0] = out[1] = 0;
	if (st) {
		sqlite3_bind_int64(st, 1, job_id);
		sqlite3_bind_text(st, 2, a, -1, SQLITE_STATIC);
		if (b)
			sqlite3_bind_text(st, 3, b, -1, SQLITE_STATIC);
		int r = sqlite3_step(st);
		if (r == SQLITE_ROW) {
			out[0] = sqlite3_column_double(st, 0);
			out[1] = sqlite3_column_double(st, 1);
		}
		rc = r == SQLITE_ROW ? 0 : SQLFAIL(c, r, "SELECT an aggregate of metrics");
		sqlite3_reset(st);
	}
	tr_store_conn_put(s, c);
	return rc;
}

int tr_store_metric_sum(tr_store_t *s, int64_t job_id, const char *name, double *sum, int64_t *count,
			struct tr_error *e)
{
	double out[2];
	int rc = aggregate_pair(s, "SELECT total(value), count(value) FROM metrics WHERE job_id = ?1 AND name = ?2",
				job_id, name, NULL, out, e);
	if (rc == 0) {
		*sum = out[0];
		*count = (int64_t)out[1];
	}
	return rc;
}

int tr_store_metric_dot(tr_store_t *s, int64_t job_id, const char *a, const char *b, double *dot, double *sum_b,
			struct tr_error *e)
{
	/* total() of NULL (a NaN point) products skips them, and the sum of
	 * b only counts where the product is known. */
	double out[2];
	int rc = aggregate_pair(s,
				"SELECT total(x.value * y.value),"
				" total(CASE WHEN x.value IS NULL THEN NULL ELSE y.value END)"
				" FROM metrics x JOIN metrics y ON y.job_id = x.job_id AND y.name = ?3"
				" AND y.step = x.step WHERE x.job_id = ?1 AND x.name = ?2",
				job_id, a, b, out, e);
	*dot = out[0];
	*sum_b = out[1];
	return rc;
}

int tr_store_metric_epoch_mean(tr_store_t *s, int64_t job_id, const char *name, int64_t *epoch, double *mean,
			       int64_t *count, struct tr_error *e)
{
	*count = 0;
	*mean = NAN;
	struct conn *c = tr_store_conn_lend(s, e);
	sqlite3_stmt *st = tr_store_stmt(c, "SELECT epoch, value FROM metrics WHERE job_id = ?1 AND name = ?2"
					    " ORDER BY step DESC");
	int rc = -EIO, r = SQLITE_DONE;
	if (st) {
		double sum = 0;
		int64_t seen = 0;
		sqlite3_bind_int64(st, 1, job_id);
		sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
		while ((r = sqlite3_step(st)) == SQLITE_ROW) {
			int64_t ep = sqlite3_column_int64(st, 0);
			if (seen++ == 0)
				*epoch = ep;
			else if (ep != *epoch)
				break;
			if (sqlite3_column_type(st, 1) != SQLITE_NULL) { /* NaN points are left out */
				sum += sqlite3_column_double(st, 1);
				(*count)++;
			}
		}
		rc = r == SQLITE_ROW || r == SQLITE_DONE ? (seen > 0) : SQLFAIL(c, r, "SELECT epoch of metric");
		if (*count > 0)
			*mean = sum / (double)*count;
		sqlite3_reset(st);
	}
	tr_store_conn_put(s, c);
	return rc;
}

json_t *tr_store_metric_names(tr_store_t *s, int64_t job_id, struct tr_error *e)
{
	struct names ns = {0};
	struct conn *c = tr_store_conn_lend(s, e);
	int err = load_names(c, job_id, &ns);
	tr_store_conn_put(s, c);
	json_t *a = err < 0 ? NULL : json_array();
	for (size_t i = 0; a && i < ns.n; i++) {
		if (json_array_append_new(a, json_string(ns.v[i]))) {
			json_decref(a);
			a = NULL;
		}
	}
	if (!a && err == 0)
		tr_error_set(e, -ENOMEM, 0, NULL, "out of memory");
	names_free(&ns);
	return a;
}

int tr_store_metrics_truncate(tr_store_t *s, int64_t job_id, int64_t step, struct tr_error *e)
{
	/* Points queued before the call belong to the run being replaced:
	 * write them first so that they are truncated too. */
	int err = tr_store_flush(s, e);
	if (err < 0)
		return err;
	if (step >= STORE_STEP_LIMIT)
		return 0; /* no point can be above */
	if (step < -STORE_STEP_LIMIT)
		step = -STORE_STEP_LIMIT;
	struct names ns = {0};
	struct conn *c = tr_store_conn_lend(s, e);
	err = tr_store_begin(c, true);
	if (err == 0)
		err = load_names(c, job_id, &ns);
	for (size_t i = 0; i < ns.n && !err; i++) {
		const char *name = ns.v[i];
		sqlite3_stmt *st =
			tr_store_stmt(c, "DELETE FROM metrics WHERE job_id = ?1 AND name = ?2 AND step > ?3");
		if (!st) {
			err = -EIO;
			break;
		}
		sqlite3_bind_int64(st, 1, job_id);
		sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
		sqlite3_bind_int64(st, 3, step);
		int rc = sqlite3_step(st);
		sqlite3_reset(st);
		if (rc != SQLITE_DONE) {
			err = SQLFAIL(c, rc, "DELETE FROM metrics");
			break;
		}
		/* Bottom-up: each level's edge block is rebuilt from the level
		 * below, already cut. */
		for (int level = 1; level <= ROLLUP_LEVELS && !err; level++) {
			int64_t w = tr_store_rollup_width(level), blk = tr_store_floordiv(step, w);
			st = tr_store_stmt(c, "DELETE FROM metrics_rollup WHERE job_id = ?1 AND name = ?2"
					      " AND level = ?3 AND block > ?4");
			if (!st) {
				err = -EIO;
				break;
			}
			sqlite3_bind_int64(st, 1, job_id);
			sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
			sqlite3_bind_int(st, 3, level);
			sqlite3_bind_int64(st, 4, blk);
			rc = sqlite3_step(st);
			sqlite3_reset(st);
			if (rc != SQLITE_DONE)
				err = SQLFAIL(c, rc, "DELETE FROM metrics_rollup");
			else if (blk * w + w - 1 > step)
				err = tr_store_rollup_rebuild(c, job_id, name, level, blk);
		}
	}
	if (err == 0)
		err = tr_store_commit(c);
	tr_store_conn_put(s, c);
	names_free(&ns);
	atomic_fetch_add(&trunc_gen, 1);
	if (err == 0)
		tr_store_job_data_changed(s, job_id);
	return err;
}

void tr_store_metrics_rewritten(void)
{
	atomic_fetch_add(&trunc_gen, 1);
}

int tr_store_metric_series_delete(tr_store_t *s, int64_t job_id, const char *name, int64_t *deleted, struct tr_error *e)
{
	*deleted = 0;
	/* Points queued before the call are deleted too, not written after. */
	int err = tr_store_flush(s, e);
	if (err < 0)
		return err;
	struct conn *c = tr_store_conn_lend(s, e);
	err = tr_store_begin(c, true);
	static const char *const sql[] = {"DELETE FROM metrics WHERE job_id = ?1 AND name = ?2",
					  "DELETE FROM metrics_rollup WHERE job_id = ?1 AND name = ?2"};
	for (size_t i = 0; i < sizeof sql / sizeof sql[0] && !err; i++) {
		sqlite3_stmt *st = tr_store_stmt(c, sql[i]);
		if (!st) {
			err = -EIO;
			break;
		}
		sqlite3_bind_int64(st, 1, job_id);
		sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
		int rc = sqlite3_step(st);
		sqlite3_reset(st);
		if (rc != SQLITE_DONE)
			err = SQLFAIL(c, rc, "DELETE a metric series");
		else if (i == 0)
			*deleted = sqlite3_changes(c->db);
	}
	if (err == 0)
		err = tr_store_commit(c);
	tr_store_conn_put(s, c); /* rolls back what failed */
	if (err == 0 && *deleted) {
		atomic_fetch_add(&trunc_gen, 1);
		tr_store_job_data_changed(s, job_id);
	}
	return err;
}
