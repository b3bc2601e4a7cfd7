/* Experiment rows and the searcher's inputs (docs/experiments.md).  The
 * trials themselves are job rows (storage/jobs.c); this file keeps what
 * the daemon's driver needs besides: the experiment (its request with
 * defaults filled, its state) and the reports and promotions in arrival
 * order, from which core/searcher.h decides again after a restart.
 */
#include "storage/internal.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define EXP_COLS "id, name, state, priority, request, error, submitted_at, finished_at, preemptible"

void tr_experiment_row_finish(struct tr_experiment_row *row)
{
	if (!row)
		return;
	free(row->name);
	free(row->request);
	free(row->error);
	memset(row, 0, sizeof *row);
}

static char *col_text(sqlite3_stmt *st, int col)
{
	const unsigned char *t = sqlite3_column_text(st, col);
	return t ? strdup((const char *)t) : NULL;
}

static int read_row(struct conn *c, sqlite3_stmt *st, struct tr_experiment_row *r)
{
	memset(r, 0, sizeof *r);
	r->id = sqlite3_column_int64(st, 0);
	const char *state = (const char *)sqlite3_column_text(st, 2);
	int k = tr_experiment_state_parse(state);
	if (k < 0)
		return tr_store_cfail(c, -EBADMSG, "experiment %lld has an unknown state \"%s\" in the state database",
				      (long long)r->id, state ? state : "(null)");
	r->state = (enum tr_experiment_state)k;
	r->priority = sqlite3_column_int(st, 3);
	r->submitted_at = sqlite3_column_double(st, 6);
	r->finished_at = sqlite3_column_double(st, 7);
	r->preemptible = sqlite3_column_int(st, 8) != 0;
	r->name = col_text(st, 1);
	r->request = col_text(st, 4);
	r->error = col_text(st, 5);
	if (!r->name || !r->request) {
		tr_experiment_row_finish(r);
		return tr_store_cfail(c, -ENOMEM, "out of memory");
	}
	return 0;
}

int tr_store_experiment_insert(tr_store_t *s, struct tr_experiment_row *row, struct tr_error *e)
{
	struct conn *c = tr_store_conn_lend(s, e);
	int err = -EIO;
	double now = tr_store_now();
	sqlite3_stmt *st = tr_store_stmt(c, "INSERT INTO experiments (name, state, priority, request, submitted_at,"
					    " preemptible) VALUES (?1, ?2, ?3, ?4, ?5, ?6)");
	if (st) {
		sqlite3_bind_text(st, 1, row->name ? row->name : "experiment", -1, SQLITE_STATIC);
		sqlite3_bind_text(st, 2, tr_experiment_state_name(row->state), -1, SQLITE_STATIC);
		sqlite3_bind_int(st, 3, row->priority);
		sqlite3_bind_text(st, 4, row->request, -1, SQLITE_STATIC);
		sqlite3_bind_double(st, 5, now);
		sqlite3_bind_int(st, 6, row->preemptible);
		int rc = sqlite3_step(st);
		if (rc == SQLITE_DONE) {
			row->id = sqlite3_last_insert_rowid(c->db);
			row->submitted_at = now;
			err = 0;
		} else {
			err = SQLFAIL(c, rc, "INSERT INTO experiments");
		}
	}
	tr_store_conn_put(s, c);
	return err;
}

/* Steps st to the end into a malloc'd array. */
static int read_rows(struct conn *c, sqlite3_stmt *st, struct tr_experiment_row **rows, int *count)
{
	struct tr_experiment_row *v = NULL;
	int n = 0, cap = 0, rc, err = 0;

	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		if (n == cap) {
			cap = cap ? 2 * cap : 8;
			struct tr_experiment_row *nv = realloc(v, (size_t)cap * sizeof *nv);
			if (!nv) {
				err = tr_store_cfail(c, -ENOMEM, "out of memory");
				goto fail;
			}
			v = nv;
		}
		if ((err = read_row(c, st, &v[n])) < 0)
			goto fail;
		n++;
	}
	if (rc != SQLITE_DONE) {
		err = SQLFAIL(c, rc, sqlite3_sql(st));
		goto fail;
	}
	*rows = v;
	*count = n;
	return 0;
fail:
	for (int i = 0; i < n; i++)
		tr_experiment_row_finish(&v[i]);
	free(v);
	return err;
}

int tr_store_experiment_get(tr_store_t *s, int64_t id, struct tr_experiment_row *out, struct tr_error *e)
{
	struct tr_experiment_row *rows = NULL;
	int count = 0, err = -EIO;
	struct conn *c = tr_store_conn_lend(s, e);
	sqlite3_stmt *st = tr_store_stmt(c, "SELECT " EXP_COLS " FROM experiments WHERE id = ?1");

	memset(out, 0, sizeof *out);
	if (st) {
		sqlite3_bind_int64(st, 1, id);
		err = read_rows(c, st, &rows, &count);
		if (err == 0 && count == 0)
			err = tr_store_cfail(c, -ENOENT, "experiment %lld not found", (long long)id);
	}
	tr_store_conn_put(s, c);
	if (err == 0)
		*out = rows[0];
	free(rows);
	return err;
}

int tr_store_experiment_list(tr_store_t *s, const enum tr_experiment_state *state, int64_t after, int limit,
			     struct tr_experiment_row **rows, int *count, struct tr_error *e)
{
	int err = -EIO;
	struct conn *c = tr_store_conn_lend(s, e);
	sqlite3_stmt *st = tr_store_stmt(c, "SELECT " EXP_COLS " FROM experiments"
					    " WHERE id > ?1 AND (?2 IS NULL OR state = ?2) ORDER BY id LIMIT ?3");

	*rows = NULL;
	*count = 0;
	if (st) {
		sqlite3_bind_int64(st, 1, after);
		sqlite3_bind_text(st, 2, state ? tr_experiment_state_name(*state) : NULL, -1, SQLITE_STATIC);
		sqlite3_bind_int64(st, 3, limit > 0 ? limit : -1);
		err = read_rows(c, st, rows, count);
	}
	tr_store_conn_put(s, c);
	return err;
}

int tr_store_experiment_set_state(tr_store_t *s, int64_t id, enum tr_experiment_state state, const char *error_json,
				  struct tr_error *e)
{
	int err = -EIO;
	struct conn *c = tr_store_conn_lend(s, e);
	sqlite3_stmt *st = tr_store_stmt(c, "UPDATE experiments SET state = ?2, error = ?3,"
					    " finished_at = CASE WHEN ?4 THEN ?5 ELSE 0 END WHERE id = ?1");

	if (st) {
		sqlite3_bind_int64(st, 1, id);
		sqlite3_bind_text(st, 2, tr_experiment_state_name(state), -1, SQLITE_STATIC);
		sqlite3_bind_text(st, 3, error_json, -1, SQLITE_STATIC);
		sqlite3_bind_int(st, 4, tr_experiment_state_terminal(state));
		sqlite3_bind_double(st, 5, tr_store_now());
		int rc = sqlite3_step(st);
		if (rc != SQLITE_DONE)
			err = SQLFAIL(c, rc, "UPDATE experiments");
		else if (sqlite3_changes(c->db) == 0)
			err = tr_store_cfail(c, -ENOENT, "experiment %lld not found", (long long)id);
		else
			err = 0;
	}
	tr_store_conn_put(s, c);
	return err;
}

int tr_store_experiment_event_add(tr_store_t *s, int64_t id, const struct tr_experiment_event *ev, struct tr_error *e)
{
	int err = -EIO;
	struct conn *c = tr_store_conn_lend(s, e);
	sqlite3_stmt *st = tr_store_stmt(c, "INSERT INTO experiment_events (experiment_id, kind, trial, rung, metric,"
					    " failed) VALUES (?1, ?2, ?3, ?4, ?5, ?6)");

	if (st) {
		sqlite3_bind_int64(st, 1, id);
		sqlite3_bind_text(st, 2, ev->promotion ? "promote" : "report", -1, SQLITE_STATIC);
		sqlite3_bind_int(st, 3, ev->trial);
		sqlite3_bind_int(st, 4, ev->rung);
		if (isnan(ev->metric) || ev->promotion)
			sqlite3_bind_null(st, 5); /* NULL = none (SQLite cannot store NaN) */
		else
			sqlite3_bind_double(st, 5, ev->metric);
		sqlite3_bind_int(st, 6, ev->failed);
		int rc = sqlite3_step(st);
		err = rc == SQLITE_DONE ? 0 : SQLFAIL(c, rc, "INSERT INTO experiment_events");
	}
	tr_store_conn_put(s, c);
	return err;
}

int tr_store_experiment_events(tr_store_t *s, int64_t id, struct tr_experiment_event **events, int *count,
			       struct tr_error *e)
{
	struct tr_experiment_event *v = NULL;
	int n = 0, cap = 0, rc, err = -EIO;
	struct conn *c = tr_store_conn_lend(s, e);
	sqlite3_stmt *st = tr_store_stmt(c, "SELECT seq, kind, trial, rung, metric, failed FROM experiment_events"
					    " WHERE experiment_id = ?1 ORDER BY seq");

	*events = NULL;
	*count = 0;
	if (!st)
		goto cleanup;
	sqlite3_bind_int64(st, 1, id);
	err = 0;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		if (n == cap) {
			cap = cap ? 2 * cap : 32;
			struct tr_experiment_event *nv = realloc(v, (size_t)cap * sizeof *nv);
			if (!nv) {
				err = tr_store_cfail(c, -ENOMEM, "out of memory");
				goto cleanup;
			}
			v = nv;
		}
		const char *kind = (const char *)sqlite3_column_text(st, 1);
		v[n] = (struct tr_experiment_event){
			.seq = sqlite3_column_int64(st, 0),
			.promotion = kind && strcmp(kind, "promote") == 0,
			.trial = sqlite3_column_int(st, 2),
			.rung = sqlite3_column_int(st, 3),
			.metric = sqlite3_column_type(st, 4) == SQLITE_NULL ? NAN : sqlite3_column_double(st, 4),
			.failed = sqlite3_column_int(st, 5) != 0,
		};
		n++;
	}
	if (rc != SQLITE_DONE)
		err = SQLFAIL(c, rc, "SELECT experiment_events");
cleanup:
	tr_store_conn_put(s, c);
	if (err < 0) {
		free(v);
		return err;
	}
	*events = v;
	*count = n;
	return 0;
}
