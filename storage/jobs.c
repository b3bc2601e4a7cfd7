/* Job rows: insert (with idempotency keys), get, list (cursor pages and the
 * scheduler's priority order), state changes with their "state" events,
 * progress, priority and delete.  Every write is one IMMEDIATE transaction
 * on a pooled request connection.
 */
#include "storage/internal.h"

#include "core/job.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JOB_COLS                                                                                                                      \
	"id, name, state, priority, spec, normalized, devices, error, idempotency_key, request_hash, "                                \
	"submitted_at, started_at, finished_at, step, total_steps, epoch, loss, updated_at, info, loader_threads, crashes, train_s, " \
	"preemptible, preemption, experiment_id, trial, pause_at"

void tr_job_row_finish(struct tr_job_row *row)
{
	if (!row)
		return;
	free(row->name);
	free(row->spec);
	free(row->normalized);
	free(row->devices);
	free(row->error);
	free(row->idempotency_key);
	free(row->request_hash);
	free(row->info);
	free(row->preemption);
	memset(row, 0, sizeof *row);
}

static int col_strdup(sqlite3_stmt *st, int col, char **out)
{
	const unsigned char *t = sqlite3_column_text(st, col);
	if (!t) {
		*out = NULL;
		return 0;
	}
	*out = strdup((const char *)t);
	return *out ? 0 : -ENOMEM;
}

/* A state the database holds, as the enum.  Only a database changed by
 * hand (or damaged) holds another name: that is an error naming the job
 * and the text, never a state guessed at. */
static int col_state(struct conn *c, sqlite3_stmt *st, int col, int64_t id, enum tr_job_state *out)
{
	const char *name = (const char *)sqlite3_column_text(st, col);
	int state = tr_job_state_parse(name);
	if (state < 0)
		return tr_store_cfail(c, -EBADMSG,
				      "job %lld has an unknown state \"%s\" in the state database (not one of %s)",
				      (long long)id, name ? name : "(null)", tr_job_state_list());
	*out = (enum tr_job_state)state;
	return 0;
}

/* Reads a row selected with JOB_COLS. */
static int read_row(struct conn *c, sqlite3_stmt *st, struct tr_job_row *r)
{
	memset(r, 0, sizeof *r);
	r->id = sqlite3_column_int64(st, 0);
	r->priority = sqlite3_column_int(st, 3);
	r->submitted_at = sqlite3_column_double(st, 10);
	r->started_at = sqlite3_column_double(st, 11);
	r->finished_at = sqlite3_column_double(st, 12);
	r->step = sqlite3_column_int64(st, 13);
	r->total_steps = sqlite3_column_int64(st, 14);
	r->epoch = sqlite3_column_int64(st, 15);
	r->loss = sqlite3_column_type(st, 16) == SQLITE_NULL ? NAN : sqlite3_column_double(st, 16);
	r->updated_at = sqlite3_column_double(st, 17);
	r->loader_threads = sqlite3_column_int(st, 19); /* NULL reads 0: not started */
	r->crashes = sqlite3_column_int(st, 20);
	r->train_s = sqlite3_column_double(st, 21);
	r->preemptible = sqlite3_column_int(st, 22) != 0;
	r->experiment = sqlite3_column_int64(st, 24); /* NULL reads 0: a plain job */
	r->trial = sqlite3_column_int(st, 25);
	r->pause_at = sqlite3_column_int64(st, 26);
	int err = col_state(c, st, 2, r->id, &r->state);
	if (err < 0) {
		memset(r, 0, sizeof *r);
		return err;
	}
	err |= col_strdup(st, 1, &r->name);
	err |= col_strdup(st, 4, &r->spec);
	err |= col_strdup(st, 5, &r->normalized);
	err |= col_strdup(st, 6, &r->devices);
	err |= col_strdup(st, 7, &r->error);
	err |= col_strdup(st, 8, &r->idempotency_key);
	err |= col_strdup(st, 9, &r->request_hash);
	err |= col_strdup(st, 18, &r->info);
	err |= col_strdup(st, 23, &r->preemption);
	if (err) {
		tr_job_row_finish(r);
		return tr_store_cfail(c, -ENOMEM, "out of memory");
	}
	return 0;
}

/* Steps st to the end, appending each row to a malloc'd array. */
static int read_rows(struct conn *c, sqlite3_stmt *st, struct tr_job_row **rows, int *count)
{
	struct tr_job_row *v = NULL;
	int n = 0, cap = 0, rc, err = 0;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		if (n == cap) {
			cap = cap ? 2 * cap : 16;
			struct tr_job_row *nv = realloc(v, (size_t)cap * sizeof *nv);
			if (!nv) {
				err = tr_store_cfail(c, -ENOMEM, "out of memory");
				goto fail;
			}
			v = nv;
		}
		err = read_row(c, st, &v[n]);
		if (err < 0)
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
		tr_job_row_finish(&v[i]);
	free(v);
	return err;
}

static int check_json(struct tr_error *e, const char *text, json_type type, const char *what)
{
	if (!text)
		return 0;
	json_error_t jerr;
	json_t *j = json_loads(text, JSON_DECODE_ANY, &jerr);
	if (!j)
		return tr_error_set(e, -EINVAL, 0, NULL, "%s is not valid JSON: %s (column %d)", what, jerr.text,
				    jerr.column);
	int ok = json_typeof(j) == type;
	json_decref(j);
	if (!ok)
		return tr_error_set(e, -EINVAL, 0, NULL, "%s must be a JSON %s", what,
				    type == JSON_ARRAY ? "array" : "object");
	return 0;
}

static char *state_event_data(enum tr_job_state state, const char *error_json)
{
	json_t *err = error_json ? json_loads(error_json, 0, NULL) : json_null();
	json_t *o = json_pack("{s:s, s:o, s:b}", "state", tr_job_state_name(state), "error", err ? err : json_null(),
			      "terminal", tr_job_state_terminal(state));
	char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	return text;
}

/* A state event's data with one more key holding JSON text; NULL when
 * either text is not JSON (the event is then sent without it). */
static char *state_event_with(const char *data, const char *key, const char *json_text)
{
	json_t *o = json_loads(data, 0, NULL), *v = json_loads(json_text, 0, NULL);
	char *text = NULL;
	if (json_is_object(o) && v && json_object_set(o, key, v) == 0)
		text = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	json_decref(v);
	return text;
}

int tr_store_job_insert(tr_store_t *s, struct tr_job_row *row, int64_t *existing_id, struct tr_error *e)
{
	return tr_store_job_insert_bounded(s, row, 0, existing_id, e);
}

int tr_store_job_insert_bounded(tr_store_t *s, struct tr_job_row *row, int64_t max_queued, int64_t *existing_id,
				struct tr_error *e)
{
	if (!row || !row->spec)
		return tr_error_set(e, -EINVAL, 0, NULL, "job insert: spec is required");
	int err = check_json(e, row->devices, JSON_ARRAY, "devices");
	if (err < 0)
		return err;
	err = check_json(e, row->error, JSON_OBJECT, "error");
	if (err < 0)
		return err;
	if (existing_id)
		*existing_id = 0;

	struct conn *c = tr_store_conn_lend(s, e);
	sqlite3_stmt *st;
	int64_t event_id = 0;
	/* The key lookup and the insert share one write transaction, so two
	 * concurrent submissions with one key cannot both insert. */
	err = tr_store_begin(c, true);
	if (err < 0)
		goto cleanup;
	if (row->idempotency_key) {
		st = tr_store_stmt(c, "SELECT id FROM jobs WHERE idempotency_key = ?1");
		if (!st) {
			err = -EIO;
			goto cleanup;
		}
		sqlite3_bind_text(st, 1, row->idempotency_key, -1, SQLITE_STATIC);
		int rc = sqlite3_step(st);
		if (rc == SQLITE_ROW) {
			if (existing_id)
				*existing_id = sqlite3_column_int64(st, 0);
			err = tr_store_cfail(c, -EEXIST, "a job with idempotency key \"%s\" exists (id %lld)",
					     row->idempotency_key, (long long)sqlite3_column_int64(st, 0));
			goto cleanup;
		}
		if (rc != SQLITE_DONE) {
			err = SQLFAIL(c, rc, "SELECT job by idempotency key");
			goto cleanup;
		}
	}
	/* Counted inside the insert's write transaction, so concurrent
	 * submits cannot all pass the bound; after the key lookup, so a
	 * retried submit still finds its job when the queue is full. */
	if (max_queued > 0) {
		st = tr_store_stmt(c, "SELECT COUNT(*) FROM jobs WHERE state = 'queued'");
		if (!st) {
			err = -EIO;
			goto cleanup;
		}
		int rc = sqlite3_step(st);
		int64_t queued = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
		sqlite3_reset(st);
		if (rc != SQLITE_ROW) {
			err = SQLFAIL(c, rc, "SELECT queued job count");
			goto cleanup;
		}
		if (queued >= max_queued) {
			err = tr_store_cfail(c, -EAGAIN,
					     "%lld jobs are queued, the most this daemon takes (max-queued-jobs)",
					     (long long)queued);
			goto cleanup;
		}
	}
	double now = tr_store_now();
	double submitted = row->submitted_at > 0 ? row->submitted_at : now;
	static const char insert_sql[] =
		"INSERT INTO jobs (name, state, priority, spec, normalized, devices, error, idempotency_key,"
		" request_hash, submitted_at, updated_at, preemptible, experiment_id, trial, pause_at)"
		" VALUES (?1, 'queued', ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9, ?10, ?11, ?12, ?13)";
	st = tr_store_stmt(c, insert_sql);
	if (!st) {
		err = -EIO;
		goto cleanup;
	}
	sqlite3_bind_text(st, 1, row->name ? row->name : "", -1, SQLITE_STATIC);
	sqlite3_bind_int(st, 2, row->priority);
	sqlite3_bind_text(st, 3, row->spec, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 4, row->normalized, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 5, row->devices ? row->devices : "[]", -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 6, row->error, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 7, row->idempotency_key, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 8, row->request_hash, -1, SQLITE_STATIC);
	sqlite3_bind_double(st, 9, submitted);
	sqlite3_bind_int(st, 10, row->preemptible);
	if (row->experiment > 0) {
		sqlite3_bind_int64(st, 11, row->experiment);
		sqlite3_bind_int(st, 12, row->trial);
	}
	sqlite3_bind_int64(st, 13, row->pause_at);
	int rc = sqlite3_step(st);
	if (rc == SQLITE_CONSTRAINT_UNIQUE && row->experiment > 0) {
		err = tr_store_cfail(c, -EEXIST, "experiment %lld has a job for trial %d already",
				     (long long)row->experiment, row->trial);
		goto cleanup;
	}
	if (rc != SQLITE_DONE) {
		err = SQLFAIL(c, rc, "INSERT INTO jobs");
		goto cleanup;
	}
	int64_t id = sqlite3_last_insert_rowid(c->db);
	/* A job's event stream starts with its "queued" state, in the insert's
	 * transaction: an SSE client always sees the state first, whatever the
	 * batched log writer (which carries "submitted") does meanwhile. */
	char *data = state_event_data(TR_JOB_QUEUED, NULL);
	if (!data) {
		err = tr_store_cfail(c, -ENOMEM, "out of memory");
		goto cleanup;
	}
	err = tr_store_event_insert(c, id, "state", data, submitted, &event_id);
	free(data);
	if (err < 0)
		goto cleanup;
	err = tr_store_commit(c);
	if (err < 0)
		goto cleanup;
	row->id = id;
	row->submitted_at = submitted;
cleanup:
	tr_store_conn_put(s, c); /* rolls back an unfinished transaction */
	if (err == 0)
		tr_store_events_committed(s, event_id, &row->id, 1);
	return err;
}

int tr_store_job_get(tr_store_t *s, int64_t id, struct tr_job_row *out, struct tr_error *e)
{
	memset(out, 0, sizeof *out);
	struct conn *c = tr_store_conn_lend(s, e);
	int err;
	sqlite3_stmt *st = tr_store_stmt(c, "SELECT " JOB_COLS " FROM jobs WHERE id = ?1");
	if (!st) {
		err = -EIO;
		goto cleanup;
	}
	sqlite3_bind_int64(st, 1, id);
	int rc = sqlite3_step(st);
	if (rc == SQLITE_ROW)
		err = read_row(c, st, out);
	else if (rc == SQLITE_DONE)
		err = tr_store_cfail(c, -ENOENT, "job %lld not found", (long long)id);
	else
		err = SQLFAIL(c, rc, "SELECT job");
cleanup:
	tr_store_conn_put(s, c);
	if (err == 0)
		tr_store_job_overlay(s, out);
	return err;
}

/* ---- held state changes in lists ------------------------------------------- */

struct held_job {
	int64_t id;
	enum tr_job_state state; /* the state its held changes leave it in */
};

/* Jobs with held changes (storage/pending.c), once each. */
static int held_jobs(tr_store_t *s, struct held_job **out, size_t *n, struct tr_error *e)
{
	*out = NULL;
	*n = 0;
	int err = 0;
	if (tr_store_states_pending(s) == 0)
		return 0; /* the common case, without waiting for st_lock */
	pthread_mutex_lock(&s->st_lock);
	struct held_job *v = s->npst ? calloc(s->npst, sizeof *v) : NULL;
	if (s->npst && !v)
		err = tr_error_set(e, -ENOMEM, 0, NULL, "out of memory");
	for (size_t i = 0; v && i < s->npst; i++) {
		size_t k = 0;
		while (k < *n && v[k].id != s->pst[i].job_id)
			k++;
		if (k == *n)
			v[(*n)++].id = s->pst[i].job_id;
		v[k].state = s->pst[i].state; /* the last one wins */
	}
	pthread_mutex_unlock(&s->st_lock);
	if (err < 0)
		return err;
	*out = v;
	return 0;
}

/* A set of states: bit (1 << state). */
static bool in_states(enum tr_job_state state, unsigned states)
{
	return states & (1u << state);
}

/* The set of the nstates states; -EINVAL for one out of range. */
static int state_set(const enum tr_job_state *states, int nstates, unsigned *set, struct tr_error *e)
{
	*set = 0;
	for (int i = 0; i < nstates; i++) {
		if ((unsigned)states[i] >= TR_JOB_NSTATES)
			return tr_error_set(e, -EINVAL, 0, NULL, "unknown job state %d", (int)states[i]);
		*set |= 1u << states[i];
	}
	return 0;
}

/* Makes a list the database answered show the held changes: overlays
 * each row, drops rows whose shown state is not wanted (states: a set, 0
 * = no filter), and adds the jobs a held change brings into the wanted
 * states (id > after).  rows grows as needed. */
static int apply_held(tr_store_t *s, unsigned states, int64_t after, struct tr_job_row **rows, int *count,
		      struct tr_error *e)
{
	struct held_job *held = NULL;
	size_t nheld = 0;
	int err = held_jobs(s, &held, &nheld, e);
	if (err < 0 || nheld == 0)
		return err;
	struct tr_job_row *v = *rows;
	int n = *count, kept = 0;
	for (int i = 0; i < n; i++) {
		tr_store_job_overlay(s, &v[i]);
		if (!states || in_states(v[i].state, states))
			v[kept++] = v[i];
		else
			tr_job_row_finish(&v[i]);
	}
	n = kept;
	for (size_t k = 0; states && k < nheld && !err; k++) {
		if (held[k].id <= after || !in_states(held[k].state, states))
			continue;
		bool present = false;
		for (int i = 0; i < n && !present; i++)
			present = v[i].id == held[k].id;
		if (present)
			continue;
		struct tr_job_row row;
		int rc = tr_store_job_get(s, held[k].id, &row, e);
		if (rc == -ENOENT)
			continue;
		if (rc < 0) {
			err = rc;
			break;
		}
		if (!in_states(row.state, states)) {
			tr_job_row_finish(&row);
			continue;
		}
		struct tr_job_row *nv = realloc(v, (size_t)(n + 1) * sizeof *nv);
		if (!nv) {
			tr_job_row_finish(&row);
			err = tr_error_set(e, -ENOMEM, 0, NULL, "out of memory");
			break;
		}
		v = nv;
		v[n++] = row;
	}
	free(held);
	*rows = v;
	*count = n;
	return err;
}

static void rows_free(struct tr_job_row *rows, int n)
{
	for (int i = 0; i < n; i++)
		tr_job_row_finish(&rows[i]);
	free(rows);
}

static int cmp_row_id(const void *a, const void *b)
{
	int64_t x = ((const struct tr_job_row *)a)->id, y = ((const struct tr_job_row *)b)->id;
	return (x > y) - (x < y);
}

static int cmp_row_queue(const void *a, const void *b)
{
	const struct tr_job_row *x = a, *y = b;
	if (x->priority != y->priority)
		return x->priority > y->priority ? -1 : 1;
	if (x->submitted_at != y->submitted_at)
		return x->submitted_at < y->submitted_at ? -1 : 1;
	return (x->id > y->id) - (x->id < y->id);
}

int tr_store_job_list_trials(tr_store_t *s, int64_t experiment, struct tr_job_row **rows, int *count,
			     struct tr_error *e)
{
	*rows = NULL;
	*count = 0;
	struct conn *c = tr_store_conn_lend(s, e);
	int err = -EIO;
	sqlite3_stmt *st = tr_store_stmt(c, "SELECT " JOB_COLS " FROM jobs WHERE experiment_id = ?1 ORDER BY trial");
	if (st) {
		sqlite3_bind_int64(st, 1, experiment);
		err = read_rows(c, st, rows, count);
	}
	tr_store_conn_put(s, c);
	return err;
}

int tr_store_job_list(tr_store_t *s, const enum tr_job_state *state, int64_t after, int limit, struct tr_job_row **rows,
		      int *count, struct tr_error *e)
{
	*rows = NULL;
	*count = 0;
	unsigned want = 0;
	int err = state ? state_set(state, 1, &want, e) : 0;
	if (err < 0)
		return err;
	/* Held changes can take jobs out of the page: ask for that many
	 * more, so a page is only short at the end. */
	size_t held = state ? tr_store_states_pending(s) : 0;
	struct conn *c = tr_store_conn_lend(s, e);
	sqlite3_stmt *st = tr_store_stmt(c, "SELECT " JOB_COLS " FROM jobs"
					    " WHERE id > ?1 AND (?2 IS NULL OR state = ?2) ORDER BY id LIMIT ?3");
	if (!st) {
		err = -EIO;
		goto cleanup;
	}
	sqlite3_bind_int64(st, 1, after);
	sqlite3_bind_text(st, 2, state ? tr_job_state_name(*state) : NULL, -1, SQLITE_STATIC);
	sqlite3_bind_int64(st, 3, limit > 0 ? (int64_t)limit + (int64_t)held : -1); /* LIMIT -1: no limit */
	err = read_rows(c, st, rows, count);
cleanup:
	tr_store_conn_put(s, c);
	if (err == 0) {
		err = apply_held(s, want, after, rows, count, e);
		if (err == 0 && *count > 1)
			qsort(*rows, (size_t)*count, sizeof **rows, cmp_row_id);
		if (err == 0 && limit > 0 && *count > limit) {
			for (int i = limit; i < *count; i++)
				tr_job_row_finish(&(*rows)[i]);
			*count = limit;
		}
		if (err < 0) {
			rows_free(*rows, *count);
			*rows = NULL;
			*count = 0;
		}
	}
	return err;
}

int tr_store_job_list_states(tr_store_t *s, const enum tr_job_state *states, int nstates, struct tr_job_row **rows,
			     int *count, struct tr_error *e)
{
	*rows = NULL;
	*count = 0;
	if (nstates < 0 || nstates > 32)
		return tr_error_set(e, -EINVAL, 0, NULL, "too many states (%d, at most 32)", nstates);
	unsigned want;
	int err = state_set(states, nstates, &want, e);
	if (err < 0)
		return err;
	char sql[512];
	int len = snprintf(sql, sizeof sql, "SELECT " JOB_COLS " FROM jobs");
	for (int i = 0; i < nstates; i++)
		len += snprintf(sql + len, sizeof sql - (size_t)len, "%s?%d", i ? ", " : " WHERE state IN (", i + 1);
	snprintf(sql + len, sizeof sql - (size_t)len, "%s ORDER BY priority DESC, submitted_at, id",
		 nstates ? ")" : "");

	struct conn *c = tr_store_conn_lend(s, e);
	sqlite3_stmt *st = NULL;
	/* Not cached: the text depends on the number of states. */
	int rc = sqlite3_prepare_v2(c->db, sql, -1, &st, NULL);
	if (rc != SQLITE_OK) {
		err = SQLFAIL(c, rc, sql);
		goto cleanup;
	}
	for (int i = 0; i < nstates; i++)
		sqlite3_bind_text(st, i + 1, tr_job_state_name(states[i]), -1, SQLITE_STATIC);
	err = read_rows(c, st, rows, count);
cleanup:
	sqlite3_finalize(st);
	tr_store_conn_put(s, c);
	/* A job whose cancellation is held must not be started again; one
	 * held as queued (resumed) must be. */
	if (err == 0) {
		err = apply_held(s, want, 0, rows, count, e);
		if (err == 0 && *count > 1)
			qsort(*rows, (size_t)*count, sizeof **rows, cmp_row_queue);
		else if (err < 0) {
			rows_free(*rows, *count);
			*rows = NULL;
			*count = 0;
		}
	}
	return err;
}

int tr_store_job_counts(tr_store_t *s, int64_t counts[TR_JOB_NSTATES], int64_t *submitted, struct tr_error *e)
{
	for (int i = 0; i < TR_JOB_NSTATES; i++)
		counts[i] = 0;
	if (submitted)
		*submitted = 0;
	struct conn *c = tr_store_conn_lend(s, e);
	int err = 0, rc;
	sqlite3_stmt *st = tr_store_stmt(c, "SELECT state, COUNT(*) FROM jobs GROUP BY state");
	if (!st) {
		err = -EIO;
		goto cleanup;
	}
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		const char *name = (const char *)sqlite3_column_text(st, 0);
		int state = tr_job_state_parse(name);
		if (state < 0) {
			err = tr_store_cfail(
				c, -EBADMSG,
				"%lld job(s) have an unknown state \"%s\" in the state database (not one of %s)",
				(long long)sqlite3_column_int64(st, 1), name ? name : "(null)", tr_job_state_list());
			sqlite3_reset(st);
			goto cleanup;
		}
		counts[state] = sqlite3_column_int64(st, 1);
	}
	sqlite3_reset(st);
	if (rc != SQLITE_DONE) {
		err = SQLFAIL(c, rc, "SELECT job counts");
		goto cleanup;
	}
	if (!submitted)
		goto cleanup;
	/* No row until the first insert. */
	st = tr_store_stmt(c, "SELECT seq FROM sqlite_sequence WHERE name = 'jobs'");
	if (!st) {
		err = -EIO;
		goto cleanup;
	}
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW)
		*submitted = sqlite3_column_int64(st, 0);
	else if (rc != SQLITE_DONE)
		err = SQLFAIL(c, rc, "SELECT job sequence");
	sqlite3_reset(st);
cleanup:
	tr_store_conn_put(s, c);
	return err;
}

int tr_store_job_write_state(struct conn *c, int64_t id, enum tr_job_state state, const char *error_json,
			     const char *devices_json, double now, int64_t *event_id)
{
	char *data = state_event_data(state, error_json);
	if (!data)
		return tr_store_cfail(c, -ENOMEM, "out of memory");
	*event_id = 0;
	int err = tr_store_begin(c, true);
	if (err < 0)
		goto cleanup;
	sqlite3_stmt *st = tr_store_stmt(c, "SELECT state, finished_at, preemption FROM jobs WHERE id = ?1");
	if (!st) {
		err = -EIO;
		goto cleanup;
	}
	sqlite3_bind_int64(st, 1, id);
	int rc = sqlite3_step(st);
	if (rc == SQLITE_DONE) {
		err = tr_store_cfail(c, -ENOENT, "job %lld not found", (long long)id);
		goto cleanup;
	}
	if (rc != SQLITE_ROW) {
		err = SQLFAIL(c, rc, "SELECT job state");
		goto cleanup;
	}
	enum tr_job_state was = TR_JOB_QUEUED; /* set by col_state on success */
	err = col_state(c, st, 0, id, &was);
	double finished_at = sqlite3_column_double(st, 1);
	/* A change to preempted says who preempted the job (its preemption
	 * record, written just before), so the event stream names both. */
	if (err == 0 && state == TR_JOB_PREEMPTED && sqlite3_column_type(st, 2) == SQLITE_TEXT) {
		char *with = state_event_with(data, "preemption", (const char *)sqlite3_column_text(st, 2));
		if (with) {
			free(data);
			data = with;
		}
	}
	sqlite3_reset(st);
	if (err < 0)
		goto cleanup;
	bool was_terminal = tr_job_state_terminal(was);
	/* "0 = not yet": a job that leaves a terminal state (re-queued) is
	 * not finished any more; re-entering one re-stamps. */
	if (!tr_job_state_terminal(state))
		finished_at = 0;
	else if (!was_terminal || finished_at == 0)
		finished_at = now;

	st = tr_store_stmt(c, "UPDATE jobs SET state = ?2, error = ?3, devices = coalesce(?4, devices),"
			      " started_at = CASE WHEN ?2 = 'running' AND started_at = 0 THEN ?5 ELSE started_at END,"
			      " finished_at = ?6 WHERE id = ?1");
	if (!st) {
		err = -EIO;
		goto cleanup;
	}
	sqlite3_bind_int64(st, 1, id);
	sqlite3_bind_text(st, 2, tr_job_state_name(state), -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 3, error_json, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 4, devices_json, -1, SQLITE_STATIC);
	sqlite3_bind_double(st, 5, now);
	sqlite3_bind_double(st, 6, finished_at);
	rc = sqlite3_step(st);
	if (rc != SQLITE_DONE) {
		err = SQLFAIL(c, rc, "UPDATE job state");
		goto cleanup;
	}
	err = tr_store_event_insert(c, id, "state", data, now, event_id);
	if (err < 0)
		goto cleanup;
	err = tr_store_commit(c);
cleanup:
	if (err < 0)
		tr_store_rollback(c);
	free(data);
	return err;
}

/* {"state":..,"error":..,"terminal":..} with the error embedded as JSON, not as a string. */
int tr_store_job_set_state(tr_store_t *s, int64_t id, enum tr_job_state state, const char *error_json,
			   const char *devices_json, struct tr_error *e)
{
	if ((unsigned)state >= TR_JOB_NSTATES)
		return tr_error_set(e, -EINVAL, 0, NULL, "unknown job state %d", (int)state);
	int err = check_json(e, error_json, JSON_OBJECT, "error");
	if (err < 0)
		return err;
	err = check_json(e, devices_json, JSON_ARRAY, "devices");
	if (err < 0)
		return err;

	int64_t event_id = 0;
	/* st_lock orders this write after every held change
	 * (storage/pending.c): they are written first, or this fails as they
	 * do. */
	pthread_mutex_lock(&s->st_lock);
	struct conn *c = tr_store_conn_lend(s, e);
	if (s->npst)
		err = tr_store_states_drain_locked(s, c);
	if (err == 0)
		err = tr_store_job_write_state(c, id, state, error_json, devices_json, tr_store_now(), &event_id);
	tr_store_conn_put(s, c);
	pthread_mutex_unlock(&s->st_lock);
	if (err == 0)
		tr_store_events_committed(s, event_id, &id, 1);
	return err;
}

/* Runs a one-row UPDATE; -ENOENT when no job has that id. */
static int update_one(tr_store_t *s, struct conn *c, sqlite3_stmt *st, int64_t id)
{
	(void)s;
	int rc = sqlite3_step(st);
	if (rc != SQLITE_DONE)
		return SQLFAIL(c, rc, sqlite3_sql(st));
	if (sqlite3_changes(c->db) == 0)
		return tr_store_cfail(c, -ENOENT, "job %lld not found", (long long)id);
	return 0;
}

int tr_store_job_set_progress(tr_store_t *s, int64_t id, int64_t step, int64_t total_steps, int64_t epoch, double loss,
			      struct tr_error *e)
{
	struct conn *c = tr_store_conn_lend(s, e);
	int err = -EIO;
	sqlite3_stmt *st = tr_store_stmt(c, "UPDATE jobs SET step = ?2, total_steps = ?3, epoch = ?4, loss = ?5,"
					    " updated_at = ?6 WHERE id = ?1");
	if (st) {
		sqlite3_bind_int64(st, 1, id);
		sqlite3_bind_int64(st, 2, step);
		sqlite3_bind_int64(st, 3, total_steps);
		sqlite3_bind_int64(st, 4, epoch);
		if (isnan(loss))
			sqlite3_bind_null(st, 5); /* read back as NAN: "none" */
		else
			sqlite3_bind_double(st, 5, loss);
		sqlite3_bind_double(st, 6, tr_store_now());
		err = update_one(s, c, st, id);
	}
	tr_store_conn_put(s, c);
	return err;
}

/* A resumed run's position: the row said where the killed run had got to
 * (written once a second), but training goes on from its checkpoint. */
int tr_store_job_set_position(tr_store_t *s, int64_t id, int64_t step, int64_t epoch, struct tr_error *e)
{
	struct conn *c = tr_store_conn_lend(s, e);
	int err = -EIO;
	sqlite3_stmt *st = tr_store_stmt(c, "UPDATE jobs SET step = ?2, epoch = ?3, updated_at = ?4 WHERE id = ?1");
	if (st) {
		sqlite3_bind_int64(st, 1, id);
		sqlite3_bind_int64(st, 2, step);
		sqlite3_bind_int64(st, 3, epoch);
		sqlite3_bind_double(st, 4, tr_store_now());
		err = update_one(s, c, st, id);
	}
	tr_store_conn_put(s, c);
	return err;
}

/* UPDATE jobs SET <one integer column> = ?2 WHERE id = ?1, as sql says. */
static int set_int_column(tr_store_t *s, int64_t id, const char *sql, int64_t value, struct tr_error *e)
{
	struct conn *c = tr_store_conn_lend(s, e);
	int err = -EIO;
	sqlite3_stmt *st = tr_store_stmt(c, sql);
	if (st) {
		sqlite3_bind_int64(st, 1, id);
		sqlite3_bind_int64(st, 2, value);
		err = update_one(s, c, st, id);
	}
	tr_store_conn_put(s, c);
	return err;
}

int tr_store_job_set_loader_threads(tr_store_t *s, int64_t id, int threads, struct tr_error *e)
{
	return set_int_column(s, id, "UPDATE jobs SET loader_threads = ?2 WHERE id = ?1", threads, e);
}

int tr_store_job_set_pause_at(tr_store_t *s, int64_t id, int64_t pause_at, struct tr_error *e)
{
	return set_int_column(s, id, "UPDATE jobs SET pause_at = ?2 WHERE id = ?1", pause_at, e);
}

int tr_store_job_set_crashes(tr_store_t *s, int64_t id, int crashes, struct tr_error *e)
{
	return set_int_column(s, id, "UPDATE jobs SET crashes = ?2 WHERE id = ?1", crashes, e);
}

int tr_store_job_add_train_s(tr_store_t *s, int64_t id, double seconds, struct tr_error *e)
{
	if (!(seconds > 0) || !isfinite(seconds))
		return 0;
	struct conn *c = tr_store_conn_lend(s, e);
	int err = -EIO;
	sqlite3_stmt *st = tr_store_stmt(c, "UPDATE jobs SET train_s = train_s + ?2 WHERE id = ?1");
	if (st) {
		sqlite3_bind_int64(st, 1, id);
		sqlite3_bind_double(st, 2, seconds);
		err = update_one(s, c, st, id);
	}
	tr_store_conn_put(s, c);
	return err;
}

int tr_store_job_set_priority(tr_store_t *s, int64_t id, int priority, struct tr_error *e)
{
	return set_int_column(s, id, "UPDATE jobs SET priority = ?2 WHERE id = ?1", priority, e);
}

int tr_store_job_set_preemption(tr_store_t *s, int64_t id, const char *preemption_json, struct tr_error *e)
{
	int err = check_json(e, preemption_json, JSON_OBJECT, "preemption");
	if (err < 0)
		return err;
	struct conn *c = tr_store_conn_lend(s, e);
	err = -EIO;
	sqlite3_stmt *st = tr_store_stmt(c, "UPDATE jobs SET preemption = ?2 WHERE id = ?1");
	if (st) {
		sqlite3_bind_int64(st, 1, id);
		sqlite3_bind_text(st, 2, preemption_json, -1, SQLITE_STATIC);
		err = update_one(s, c, st, id);
	}
	tr_store_conn_put(s, c);
	return err;
}

int tr_store_job_set_spec(tr_store_t *s, int64_t id, const char *spec, const char *normalized, struct tr_error *e)
{
	int err = check_json(e, spec, JSON_OBJECT, "spec");
	if (err == 0)
		err = check_json(e, normalized, JSON_OBJECT, "normalized spec");
	if (err < 0)
		return err;
	if (!spec || !normalized)
		return tr_error_set(e, -EINVAL, 0, NULL, "job spec: both texts are required");
	struct conn *c = tr_store_conn_lend(s, e);
	err = -EIO;
	sqlite3_stmt *st = tr_store_stmt(c, "UPDATE jobs SET spec = ?2, normalized = ?3 WHERE id = ?1");
	if (st) {
		sqlite3_bind_int64(st, 1, id);
		sqlite3_bind_text(st, 2, spec, -1, SQLITE_STATIC);
		sqlite3_bind_text(st, 3, normalized, -1, SQLITE_STATIC);
		err = update_one(s, c, st, id);
	}
	tr_store_conn_put(s, c);
	if (err == 0)
		tr_store_data_changed(s);
	return err;
}

int tr_store_job_delete(tr_store_t *s, int64_t id, struct tr_error *e)
{
	struct conn *c = tr_store_conn_lend(s, e);
	int err = -EIO;
	/* Foreign keys cascade to events, metrics, rollups and logs; points
	 * still queued for the job are dropped by the writer. */
	sqlite3_stmt *st = tr_store_stmt(c, "DELETE FROM jobs WHERE id = ?1");
	/* Durable before its checkpoint files are unlinked below: after a
	 * power cut the job must not come back without them. */
	if (st && tr_store_exec(c, "PRAGMA synchronous=FULL") == 0) {
		sqlite3_bind_int64(st, 1, id);
		err = update_one(s, c, st, id);
		tr_store_exec(c, "PRAGMA synchronous=NORMAL");
	}
	if (err == 0)
		tr_store_ckpt_sweep_files(s, c); /* the job's checkpoint files */
	tr_store_conn_put(s, c);
	if (err == 0) {
		tr_store_states_forget(s, id);
		tr_store_drops_forget(s, id);
		tr_store_data_changed(s);
	}
	return err;
}
