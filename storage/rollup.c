/* The min/max pyramid behind fast downsampling.
 *
 * Scanning a million rows costs SQLite ~160 ms, far too slow for a
 * dashboard that polls.  So for every series, level k holds one row per
 * aligned block of 16^k steps that has points: count, min point, max
 * point and last point (a downsampled bucket is shown as its last point:
 * kept here, a bucket made of whole blocks needs no seek into the raw
 * points).  A downsampling query then reads a few thousand rows of the level
 * that fits its bucket width and descends only at bucket edges
 * (metrics_read.c).  Rows are merged in C, not SQL, because the value order has
 * to place NaN (stored as NULL) above +inf and break ties by step, and the
 * merge must give the same answer however points were grouped.
 */
#include "storage/internal.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

int tr_store_value_cmp(double a, double b)
{
	if (isnan(a))
		return isnan(b) ? 0 : 1;
	if (isnan(b))
		return -1;
	return (a > b) - (a < b);
}

/* Ties go to the earliest step, so the answer does not depend on how the
 * points were split into blocks. */
static bool better_min(const struct mpoint *p, const struct mpoint *q)
{
	int c = tr_store_value_cmp(p->value, q->value);
	return c < 0 || (c == 0 && p->step < q->step);
}

static bool better_max(const struct mpoint *p, const struct mpoint *q)
{
	int c = tr_store_value_cmp(p->value, q->value);
	return c > 0 || (c == 0 && p->step < q->step);
}

/* Points come in step order or in the order they were written, so among
 * equal steps the one added last is the latest written. */
void tr_store_msum_add(struct msum *m, const struct mpoint *p)
{
	if (m->n++ == 0) {
		m->min = m->max = m->last = *p;
		m->last_known = true;
		return;
	}
	if (better_min(p, &m->min))
		m->min = *p;
	if (better_max(p, &m->max))
		m->max = *p;
	if (p->step >= m->last.step)
		m->last = *p;
}

/* o is the later part: its points were written after m's (a stored block
 * and a commit's new points) or its steps follow m's (blocks in order). */
void tr_store_msum_merge(struct msum *m, const struct msum *o)
{
	if (o->n == 0)
		return;
	if (m->n == 0) {
		*m = *o;
		return;
	}
	if (better_min(&o->min, &m->min))
		m->min = o->min;
	if (better_max(&o->max, &m->max))
		m->max = o->max;
	if (o->last.step >= m->last.step)
		m->last = o->last;
	m->last_known = m->last_known && o->last_known;
	m->n += o->n;
}

bool tr_store_mpoint_same(const struct mpoint *a, const struct mpoint *b)
{
	return a->step == b->step && tr_store_value_cmp(a->value, b->value) == 0;
}

int64_t tr_store_rollup_width(int level)
{
	int64_t w = 1;
	for (int i = 0; i < level; i++)
		w *= ROLLUP_FANOUT;
	return w;
}

int64_t tr_store_floordiv(int64_t a, int64_t b)
{
	int64_t q = a / b;
	return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

double tr_store_col_value(sqlite3_stmt *st, int col)
{
	return sqlite3_column_type(st, col) == SQLITE_NULL ? NAN : sqlite3_column_double(st, col);
}

#define SUM_COLS                                                                                             \
	"n, min_step, min_epoch, min_wall, min_value, max_step, max_epoch, max_wall, max_value, last_step, " \
	"last_epoch, last_wall, last_value"

static void read_sum(sqlite3_stmt *st, int col, struct msum *m)
{
	m->n = sqlite3_column_int64(st, col);
	m->min = (struct mpoint){sqlite3_column_int64(st, col + 1), sqlite3_column_int64(st, col + 2),
				 sqlite3_column_double(st, col + 3), tr_store_col_value(st, col + 4)};
	m->max = (struct mpoint){sqlite3_column_int64(st, col + 5), sqlite3_column_int64(st, col + 6),
				 sqlite3_column_double(st, col + 7), tr_store_col_value(st, col + 8)};
	/* NULL in a row written before the rollup kept the last point. */
	m->last_known = sqlite3_column_type(st, col + 9) != SQLITE_NULL;
	m->last = (struct mpoint){sqlite3_column_int64(st, col + 9), sqlite3_column_int64(st, col + 10),
				  sqlite3_column_double(st, col + 11), tr_store_col_value(st, col + 12)};
}

static const char sql_get[] = "SELECT " SUM_COLS " FROM metrics_rollup"
			      " WHERE job_id = ?1 AND name = ?2 AND level = ?3 AND block = ?4";
static const char sql_put[] = "INSERT OR REPLACE INTO metrics_rollup (job_id, name, level, block, " SUM_COLS
			      ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)";
static const char sql_del[] = "DELETE FROM metrics_rollup WHERE job_id = ?1 AND name = ?2 AND level = ?3"
			      " AND block = ?4";

static void bind_key(sqlite3_stmt *st, int64_t job_id, const char *name, int level, int64_t block)
{
	sqlite3_bind_int64(st, 1, job_id);
	sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
	sqlite3_bind_int(st, 3, level);
	sqlite3_bind_int64(st, 4, block);
}

static int put_row(struct conn *c, int64_t job_id, const char *name, int level, int64_t block, const struct msum *m)
{
	sqlite3_stmt *st = tr_store_stmt(c, m->n ? sql_put : sql_del);
	if (!st)
		return -EIO;
	bind_key(st, job_id, name, level, block);
	if (m->n) {
		const struct mpoint *p[3] = {&m->min, &m->max, &m->last};
		sqlite3_bind_int64(st, 5, m->n);
		for (int i = 0; i < 3; i++) {
			if (i == 2 && !m->last_known) {
				/* All NULL: a last point not known (read_sum). */
				for (int k = 14; k <= 17; k++)
					sqlite3_bind_null(st, k);
				break;
			}
			sqlite3_bind_int64(st, 6 + 4 * i, p[i]->step);
			sqlite3_bind_int64(st, 7 + 4 * i, p[i]->epoch);
			sqlite3_bind_double(st, 8 + 4 * i, p[i]->wall);
			sqlite3_bind_double(st, 9 + 4 * i, p[i]->value);
		}
	}
	int rc = sqlite3_step(st);
	sqlite3_reset(st);
	return rc == SQLITE_DONE ? 0 : SQLFAIL(c, rc, "write metrics_rollup");
}

/* Merges m into the stored block. */
static int merge_row(struct conn *c, int64_t job_id, const char *name, int level, int64_t block, const struct msum *m)
{
	sqlite3_stmt *st = tr_store_stmt(c, sql_get);
	if (!st)
		return -EIO;
	bind_key(st, job_id, name, level, block);
	struct msum sum = {0};
	int rc = sqlite3_step(st);
	if (rc == SQLITE_ROW)
		read_sum(st, 0, &sum);
	sqlite3_reset(st);
	if (rc != SQLITE_ROW && rc != SQLITE_DONE)
		return SQLFAIL(c, rc, "read metrics_rollup");
	tr_store_msum_merge(&sum, m);
	return put_row(c, job_id, name, level, block, &sum);
}

struct agg {
	int64_t block;
	struct msum sum;
};

int tr_store_rollup_add(struct conn *c, int64_t job_id, const char *name, const struct mpoint *pts, size_t n)
{
	if (n == 0)
		return 0;
	struct agg *a = malloc(n * sizeof *a);
	if (!a)
		return tr_store_cfail(c, -ENOMEM, "out of memory");
	/* Level 1 from the points, each higher level from the one below:
	 * blocks nest, and sorted points give sorted blocks. */
	size_t na = 0;
	for (size_t i = 0; i < n; i++) {
		int64_t b = tr_store_floordiv(pts[i].step, ROLLUP_FANOUT);
		if (na == 0 || a[na - 1].block != b)
			a[na++] = (struct agg){.block = b};
		tr_store_msum_add(&a[na - 1].sum, &pts[i]);
	}
	int err = 0;
	for (int level = 1; level <= ROLLUP_LEVELS && !err; level++) {
		if (level > 1) {
			size_t m = 0;
			for (size_t i = 0; i < na; i++) {
				int64_t b = tr_store_floordiv(a[i].block, ROLLUP_FANOUT);
				if (m == 0 || a[m - 1].block != b) {
					struct msum s = a[i].sum;
					a[m++] = (struct agg){.block = b, .sum = s};
				} else {
					tr_store_msum_merge(&a[m - 1].sum, &a[i].sum);
				}
			}
			na = m;
		}
		for (size_t i = 0; i < na && !err; i++)
			err = merge_row(c, job_id, name, level, a[i].block, &a[i].sum);
	}
	free(a);
	return err;
}

int tr_store_rollup_fetch(struct conn *c, int64_t job_id, const char *name, int level, int64_t b0, int64_t b1,
			  struct rollup_row **rows, size_t *count)
{
	*rows = NULL;
	*count = 0;
	sqlite3_stmt *st = tr_store_stmt(c, "SELECT block, " SUM_COLS " FROM metrics_rollup"
					    " WHERE job_id = ?1 AND name = ?2 AND level = ?3"
					    " AND block BETWEEN ?4 AND ?5 ORDER BY block");
	if (!st)
		return -EIO;
	bind_key(st, job_id, name, level, b0);
	sqlite3_bind_int64(st, 5, b1);
	struct rollup_row *v = NULL;
	size_t n = 0, cap = 0;
	int rc, err = 0;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		if (n == cap) {
			cap = cap ? 2 * cap : 64;
			struct rollup_row *nv = realloc(v, cap * sizeof *nv);
			if (!nv) {
				err = tr_store_cfail(c, -ENOMEM, "out of memory");
				break;
			}
			v = nv;
		}
		v[n].block = sqlite3_column_int64(st, 0);
		read_sum(st, 1, &v[n].sum);
		n++;
	}
	if (!err && rc != SQLITE_DONE)
		err = SQLFAIL(c, rc, "read metrics_rollup");
	sqlite3_reset(st);
	if (err < 0) {
		free(v);
		return err;
	}
	*rows = v;
	*count = n;
	return 0;
}

int tr_store_rollup_rebuild(struct conn *c, int64_t job_id, const char *name, int level, int64_t block)
{
	struct msum sum = {0};
	int64_t first = block * ROLLUP_FANOUT; /* first child, or first step at level 1 */
	int64_t last = first + ROLLUP_FANOUT - 1;
	if (level == 1) {
		sqlite3_stmt *st = tr_store_stmt(c, "SELECT step, epoch, wall, value FROM metrics"
						    " WHERE job_id = ?1 AND name = ?2 AND step BETWEEN ?3 AND ?4"
						    " ORDER BY step, rowid");
		if (!st)
			return -EIO;
		sqlite3_bind_int64(st, 1, job_id);
		sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
		sqlite3_bind_int64(st, 3, first);
		sqlite3_bind_int64(st, 4, last);
		int rc;
		while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
			struct mpoint p = {sqlite3_column_int64(st, 0), sqlite3_column_int64(st, 1),
					   sqlite3_column_double(st, 2), tr_store_col_value(st, 3)};
			tr_store_msum_add(&sum, &p);
		}
		sqlite3_reset(st);
		if (rc != SQLITE_DONE)
			return SQLFAIL(c, rc, "read metrics");
	} else {
		struct rollup_row *rows;
		size_t n;
		int err = tr_store_rollup_fetch(c, job_id, name, level - 1, first, last, &rows, &n);
		if (err < 0)
			return err;
		for (size_t i = 0; i < n; i++)
			tr_store_msum_merge(&sum, &rows[i].sum);
		free(rows);
	}
	return put_row(c, job_id, name, level, block, &sum);
}
