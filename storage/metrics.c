/* Metric reads: series queries with min/max downsampling, the list of
 * names, and truncation on resume.
 *
 * Downsampling.  The series' step range [lo, hi] (its first and last point
 * within [from_step, to_step]) is cut into nb = max_points/2 buckets; bucket
 * k starts at lo + floor(k * (hi - lo + 1) / nb).  Each bucket keeps its min
 * and max points (NaN counts as the largest value, ties go to the earliest
 * step).  Rather than scanning every point, the query reads the rollup
 * level whose blocks are no wider than a bucket (a few thousand rows), takes
 * whole blocks that fall inside one bucket as they are, and descends a
 * level only for the blocks cut by a bucket edge or by the range ends -- a
 * few dozen rows per edge.  The result is exactly what a scan over all
 * points would give.
 */
#include "storage/internal.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char sql_first[] = "SELECT step FROM metrics WHERE job_id = ?1 AND name = ?2 AND step >= ?3"
				" ORDER BY step LIMIT 1";
static const char sql_last[] = "SELECT step FROM metrics WHERE job_id = ?1 AND name = ?2 AND step <= ?3"
			       " ORDER BY step DESC LIMIT 1";
static const char sql_range[] = "SELECT step, epoch, wall, value FROM metrics"
				" WHERE job_id = ?1 AND name = ?2 AND step BETWEEN ?3 AND ?4 ORDER BY step";
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

static int names_push(struct names *ns, const char *name)
{
	if (ns->n == ns->cap) {
		size_t cap = ns->cap ? 2 * ns->cap : 16;
		char **v = realloc(ns->v, cap * sizeof *v);
		if (!v)
			return tr_store_fail(-ENOMEM, "out of memory");
		ns->v = v;
		ns->cap = cap;
	}
	if (!(ns->v[ns->n] = strdup(name)))
		return tr_store_fail(-ENOMEM, "out of memory");
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
		int err = names_push(ns, (const char *)sqlite3_column_text(st, 0));
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

/* ---- output --------------------------------------------------------------------- */

struct series {
	json_t *obj, *steps, *values, *epochs, *times;
	bool oom;
};

static int series_init(struct series *o, const struct tr_metrics_query *q)
{
	memset(o, 0, sizeof *o);
	o->obj = json_object();
	o->steps = json_array();
	o->values = json_array();
	if (q->with_epochs)
		o->epochs = json_array();
	if (q->with_times)
		o->times = json_array();
	if (!o->obj || !o->steps || !o->values || (q->with_epochs && !o->epochs) || (q->with_times && !o->times))
		o->oom = true;
	return o->oom ? tr_store_fail(-ENOMEM, "out of memory") : 0;
}

static json_t *num_or_null(double v)
{
	return isfinite(v) ? json_real(v) : json_null(); /* JSON has no NaN or infinity */
}

static void series_add(struct series *o, const struct mpoint *p)
{
	if (json_array_append_new(o->steps, json_integer(p->step)) ||
	    json_array_append_new(o->values, num_or_null(p->value)) ||
	    (o->epochs && json_array_append_new(o->epochs, json_integer(p->epoch))) ||
	    (o->times && json_array_append_new(o->times, num_or_null(p->wall))))
		o->oom = true;
}

/* Moves the arrays into o->obj and that into `into` under name. */
static int series_finish(struct series *o, json_t *into, const char *name)
{
	if (!o->oom) {
		o->oom |= json_object_set_new(o->obj, "steps", o->steps) != 0;
		o->oom |= json_object_set_new(o->obj, "values", o->values) != 0;
		if (o->epochs)
			o->oom |= json_object_set_new(o->obj, "epochs", o->epochs) != 0;
		if (o->times)
			o->oom |= json_object_set_new(o->obj, "times", o->times) != 0;
		o->steps = o->values = o->epochs = o->times = NULL;
		if (!o->oom) {
			o->oom = json_object_set_new(into, name, o->obj) != 0;
			o->obj = NULL;
		}
	}
	json_decref(o->obj);
	json_decref(o->steps);
	json_decref(o->values);
	json_decref(o->epochs);
	json_decref(o->times);
	return o->oom ? tr_store_fail(-ENOMEM, "out of memory") : 0;
}

static int raw_points(struct conn *c, int64_t job_id, const char *name, int64_t lo, int64_t hi, struct series *o)
{
	sqlite3_stmt *st = tr_store_stmt(c, sql_range);
	if (!st)
		return -EIO;
	sqlite3_bind_int64(st, 1, job_id);
	sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
	sqlite3_bind_int64(st, 3, lo);
	sqlite3_bind_int64(st, 4, hi);
	int rc;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		struct mpoint p = {sqlite3_column_int64(st, 0), sqlite3_column_int64(st, 1),
				   sqlite3_column_double(st, 2), tr_store_col_value(st, 3)};
		series_add(o, &p);
	}
	sqlite3_reset(st);
	return rc == SQLITE_DONE ? 0 : SQLFAIL(c, rc, "SELECT metrics");
}

/* ---- downsampling -------------------------------------------------------------- */

struct ds {
	struct conn *c;
	int64_t job_id;
	const char *name;
	int64_t lo;
	uint64_t span, q, r; /* span = q * nb + r steps */
	uint64_t nb;
	struct msum *b;
};

/* First step of bucket k (k == nb gives hi + 1), as an offset from lo.
 * k*q <= span and k*r < nb^2 <= 2^60: no overflow. */
static uint64_t bucket_start(const struct ds *d, uint64_t k)
{
	return k * d->q + (k * d->r) / d->nb;
}

static uint64_t bucket_of(const struct ds *d, int64_t step)
{
	uint64_t off = (uint64_t)step - (uint64_t)d->lo;
	uint64_t k = (uint64_t)((long double)off * (long double)d->nb / (long double)d->span);
	if (k >= d->nb)
		k = d->nb - 1;
	/* The float estimate is off by at most one either way. */
	while (k > 0 && bucket_start(d, k) > off)
		k--;
	while (k + 1 < d->nb && bucket_start(d, k + 1) <= off)
		k++;
	return k;
}

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
		uint64_t k = bucket_of(d, a), end = bucket_start(d, k + 1);
		while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
			struct mpoint p = {sqlite3_column_int64(st, 0), sqlite3_column_int64(st, 1),
					   sqlite3_column_double(st, 2), tr_store_col_value(st, 3)};
			while ((uint64_t)p.step - (uint64_t)d->lo >= end)
				end = bucket_start(d, ++k + 1);
			tr_store_msum_add(&d->b[k], &p);
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
			uint64_t k = bucket_of(d, start);
			if ((uint64_t)end - (uint64_t)d->lo < bucket_start(d, k + 1)) {
				tr_store_msum_merge(&d->b[k], &rows[i].sum);
				continue;
			}
		}
		err = scan(d, level - 1, start > a ? start : a, end < b ? end : b);
	}
	free(rows);
	return err;
}

/* Fills o with the series' points in [lo, hi], downsampled when it has
 * more than max_points. */
static int downsample(struct conn *c, int64_t job_id, const char *name, int64_t lo, int64_t hi, int max_points,
		      struct series *o)
{
	struct ds d = {.c = c, .job_id = job_id, .name = name, .lo = lo};
	d.span = (uint64_t)hi - (uint64_t)lo + 1;
	/* max_points 1: one bucket that keeps only its max (below). */
	d.nb = max_points > 1 ? (uint64_t)max_points / 2 : 1;
	if (d.nb > d.span)
		d.nb = d.span; /* never an empty bucket by construction */
	d.q = d.span / d.nb;
	d.r = d.span % d.nb;
	d.b = calloc(d.nb, sizeof *d.b);
	if (!d.b)
		return tr_store_fail(-ENOMEM, "out of memory");
	/* Coarsest level whose blocks fit in the narrowest bucket. */
	int level = 0;
	while (level < ROLLUP_LEVELS && (uint64_t)tr_store_rollup_width(level + 1) <= d.q)
		level++;
	int err = scan(&d, level, lo, hi);
	if (err < 0)
		goto cleanup;
	int64_t total = 0;
	for (uint64_t k = 0; k < d.nb; k++)
		total += d.b[k].n;
	if (total <= max_points) {
		err = raw_points(c, job_id, name, lo, hi, o);
		goto cleanup;
	}
	for (uint64_t k = 0; k < d.nb; k++) {
		const struct msum *m = &d.b[k];
		if (m->n == 0)
			continue;
		if (max_points == 1 || tr_store_mpoint_same(&m->min, &m->max)) {
			series_add(o, &m->max);
		} else if (m->max.step < m->min.step) {
			series_add(o, &m->max);
			series_add(o, &m->min);
		} else {
			series_add(o, &m->min);
			series_add(o, &m->max);
		}
	}
cleanup:
	free(d.b);
	return err;
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

static int query_series(struct conn *c, int64_t job_id, const char *name, const struct tr_metrics_query *q,
			json_t *into)
{
	int64_t from = q->from_step < -STORE_STEP_LIMIT ? -STORE_STEP_LIMIT : q->from_step;
	int64_t to = q->to_step > STORE_STEP_LIMIT ? STORE_STEP_LIMIT : q->to_step;
	int64_t lo, hi;
	int found = edge_step(c, job_id, name, 1, from, &lo);
	if (found > 0)
		found = edge_step(c, job_id, name, -1, to, &hi);
	if (found <= 0 || lo > hi)
		return found < 0 ? found : 0; /* no points in range: no series */
	struct series o;
	int err = series_init(&o, q);
	if (err == 0)
		err = q->max_points > 0 ? downsample(c, job_id, name, lo, hi, q->max_points, &o)
					: raw_points(c, job_id, name, lo, hi, &o);
	int ferr = series_finish(&o, into, name);
	return err < 0 ? err : ferr;
}

json_t *tr_store_metrics_query(tr_store_t *s, int64_t job_id, const struct tr_metrics_query *q)
{
	static const struct tr_metrics_query defaults = {.from_step = 0, .to_step = INT64_MAX};
	if (!q)
		q = &defaults;
	if (q->max_points < 0) {
		tr_store_fail(-EINVAL, "max_points must be >= 0, not %d", q->max_points);
		return NULL;
	}
	struct names ns = {0};
	json_t *series = json_object(), *result = NULL;
	struct conn *c = tr_store_conn_get(s);
	/* One read transaction: the rollup and the raw points must come
	 * from the same snapshot. */
	int err = series ? tr_store_begin(c, false) : tr_store_fail(-ENOMEM, "out of memory");
	if (err < 0)
		goto cleanup;
	if (q->names) {
		for (const char *const *n = q->names; *n && !err; n++)
			err = names_push(&ns, *n);
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
		err = query_series(c, job_id, ns.v[i], q, series);
	}
	if (err < 0)
		goto cleanup;
	result = json_pack("{s:O}", "series", series);
	if (!result)
		tr_store_fail(-ENOMEM, "out of memory");
cleanup:
	tr_store_conn_put(s, c); /* ends the read transaction */
	names_free(&ns);
	json_decref(series);
	return result;
}

json_t *tr_store_metric_names(tr_store_t *s, int64_t job_id)
{
	struct names ns = {0};
	struct conn *c = tr_store_conn_get(s);
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
		tr_store_fail(-ENOMEM, "out of memory");
	names_free(&ns);
	return a;
}

int tr_store_metrics_truncate(tr_store_t *s, int64_t job_id, int64_t step)
{
	/* Points queued before the call belong to the run being replaced:
	 * write them first so that they are truncated too. */
	int err = tr_store_flush(s);
	if (err < 0)
		return err;
	if (step >= STORE_STEP_LIMIT)
		return 0; /* no point can be above */
	if (step < -STORE_STEP_LIMIT)
		step = -STORE_STEP_LIMIT;
	struct names ns = {0};
	struct conn *c = tr_store_conn_get(s);
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
	if (err == 0)
		tr_store_job_data_changed(s, job_id);
	return err;
}
