/* Storage: schema versions, jobs, events, the metrics queue and writer,
 * downsampling (checked against a brute-force computation, and timed on a
 * million points), truncation, logs and concurrent use. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/rfc3339.h"
#include "storage/store.h"

/* ---- helpers ------------------------------------------------------------------- */

static char dir[64], db_path[128];

static void make_dir(void)
{
	snprintf(dir, sizeof dir, "/tmp/trstore-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	snprintf(db_path, sizeof db_path, "%s/state.db", dir);
}

static void remove_dir(void)
{
	const char *suffix[] = {"", "-wal", "-shm"};
	char p[160];
	for (int i = 0; i < 3; i++) {
		snprintf(p, sizeof p, "%s%s", db_path, suffix[i]);
		unlink(p);
	}
	rmdir(dir);
}

TestSuite(schema, .init = make_dir, .fini = remove_dir);
TestSuite(jobs, .init = make_dir, .fini = remove_dir);
TestSuite(events, .init = make_dir, .fini = remove_dir);
TestSuite(metrics, .init = make_dir, .fini = remove_dir);
TestSuite(logs, .init = make_dir, .fini = remove_dir);
TestSuite(store, .init = make_dir, .fini = remove_dir);

static tr_store_t *open_store(const struct tr_store_options *opts)
{
	tr_store_t *s = NULL;
	struct tr_error err = {0};
	int rc = tr_store_open(db_path, opts, &s, &err);
	cr_assert_eq(rc, 0, "open: %d %s", rc, err.message);
	return s;
}

static int64_t add_job(tr_store_t *s, const char *name, int priority)
{
	struct tr_job_row r = {.name = (char *)name, .spec = "{\"epochs\":1}", .priority = priority};
	struct tr_error e = {0};
	int rc = tr_store_job_insert(s, &r, NULL, &e);
	cr_assert_eq(rc, 0, "insert: %s", e.message);
	cr_assert_gt(r.id, 0);
	return r.id;
}

/* A single integer from SQL run on a separate raw connection. */
static int64_t sql_int(const char *sql)
{
	sqlite3 *db;
	cr_assert_eq(sqlite3_open(db_path, &db), SQLITE_OK);
	sqlite3_stmt *st;
	cr_assert_eq(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK, "%s: %s", sql, sqlite3_errmsg(db));
	cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
	int64_t v = sqlite3_column_int64(st, 0);
	sqlite3_finalize(st);
	sqlite3_close(db);
	return v;
}

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static json_t *series_of(json_t *result, const char *name)
{
	return json_object_get(json_object_get(result, "series"), name);
}

static size_t count_events(tr_store_t *s, int64_t job, const char *type)
{
	struct tr_event *ev;
	int n;
	cr_assert_eq(tr_store_events_after(s, job, 0, 0, &ev, &n, NULL), 0);
	size_t k = 0;
	for (int i = 0; i < n; i++)
		k += strcmp(ev[i].type, type) == 0;
	tr_events_free(ev, n);
	return k;
}

/* ---- schema -------------------------------------------------------------------- */

Test(schema, open_migrate_reopen)
{
	tr_store_t *s = open_store(NULL);
	int64_t id = add_job(s, "a", 0);
	cr_assert_eq(tr_store_integrity_check(s, NULL), 0);
	tr_store_close(s);
	int64_t v = sql_int("PRAGMA user_version");
	cr_assert_geq(v, 1);

	s = open_store(NULL);
	struct tr_job_row r;
	cr_assert_eq(tr_store_job_get(s, id, &r, NULL), 0);
	cr_assert_str_eq(r.name, "a");
	tr_job_row_finish(&r);
	tr_store_close(s);
	cr_assert_eq(sql_int("PRAGMA user_version"), v, "reopening must not migrate again");

	sqlite3 *db;
	sqlite3_open(db_path, &db);
	sqlite3_stmt *st;
	sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &st, NULL);
	cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
	cr_assert_str_eq((const char *)sqlite3_column_text(st, 0), "wal");
	sqlite3_finalize(st);
	sqlite3_close(db);
}

Test(schema, refuses_newer_version)
{
	tr_store_close(open_store(NULL));
	int64_t v = sql_int("PRAGMA user_version");
	sqlite3 *db;
	sqlite3_open(db_path, &db);
	cr_assert_eq(sqlite3_exec(db, "PRAGMA user_version=99", NULL, NULL, NULL), SQLITE_OK);
	sqlite3_close(db);

	tr_store_t *s = NULL;
	struct tr_error err = {0};
	int rc = tr_store_open(db_path, NULL, &s, &err);
	cr_assert_lt(rc, 0);
	cr_assert_null(s);
	char known[16];
	snprintf(known, sizeof known, "%lld", (long long)v);
	cr_assert_not_null(strstr(err.message, "99"), "%s", err.message);
	cr_assert_not_null(strstr(err.message, known), "%s", err.message);
	cr_assert_eq(sql_int("PRAGMA user_version"), 99, "a refused database is left alone");
}

Test(schema, bad_path_is_an_error)
{
	tr_store_t *s = NULL;
	struct tr_error err = {0};
	cr_assert_lt(tr_store_open("/nonexistent-dir/x/state.db", NULL, &s, &err), 0);
	cr_assert_null(s);
	cr_assert_not_null(strstr(err.message, "/nonexistent-dir/x/state.db"), "%s", err.message);
	cr_assert_str_eq(err.pointer, "");
	tr_store_close(NULL);
}

/* A store failure's message reaches the caller in its struct tr_error
 * (core/error.h, docs/design.md "Errors"), whatever it held before. */
Test(schema, open_error_arrives_in_the_callers_struct_tr_error)
{
	tr_store_t *s = NULL;
	struct tr_store_options bad = {.max_bytes = -1};
	struct tr_error err = {.kind = 99, .pointer = "/stale", .message = "stale"};

	cr_assert_eq(tr_store_open(db_path, &bad, &s, &err), -EINVAL);
	cr_assert_null(s);
	cr_expect_str_eq(err.message, "max_bytes must be >= 0 (0 = no cap)");
	cr_expect_str_eq(err.pointer, "");
	cr_expect_eq(err.kind, 0);
}

/* ---- jobs ---------------------------------------------------------------------- */

Test(jobs, insert_and_get)
{
	tr_store_t *s = open_store(NULL);
	struct tr_job_row in = {.name = "mlp",
				.spec = "{\"a\":1}",
				.normalized = "{\"a\":1,\"b\":2}",
				.priority = 3,
				.idempotency_key = "k1",
				.request_hash = "abc"};
	cr_assert_eq(tr_store_job_insert(s, &in, NULL, NULL), 0);
	struct tr_job_row r;
	cr_assert_eq(tr_store_job_get(s, in.id, &r, NULL), 0);
	cr_assert_eq(r.id, in.id);
	cr_assert_str_eq(r.name, "mlp");
	cr_assert_eq(r.state, TR_JOB_QUEUED);
	cr_assert_eq(r.priority, 3);
	cr_assert_str_eq(r.spec, "{\"a\":1}");
	cr_assert_str_eq(r.normalized, "{\"a\":1,\"b\":2}");
	cr_assert_str_eq(r.devices, "[]");
	cr_assert_null(r.error);
	cr_assert_str_eq(r.idempotency_key, "k1");
	cr_assert_str_eq(r.request_hash, "abc");
	cr_assert_gt(r.submitted_at, 1.6e9);
	cr_assert_eq(r.started_at, 0);
	cr_assert_eq(r.finished_at, 0);
	cr_assert(isnan(r.loss));
	tr_job_row_finish(&r);
	tr_job_row_finish(&r); /* a finished row is a zeroed row */

	struct tr_error e = {0};
	cr_assert_eq(tr_store_job_get(s, 9999, &r, &e), -ENOENT);
	cr_assert_str_eq(e.message, "job 9999 not found");
	struct tr_job_row bad = {.name = "x"};
	cr_assert_eq(tr_store_job_insert(s, &bad, NULL, NULL), -EINVAL);
	tr_store_close(s);
}

Test(jobs, list_filter_and_cursor)
{
	tr_store_t *s = open_store(NULL);
	int64_t ids[7];
	for (int i = 0; i < 7; i++)
		ids[i] = add_job(s, "j", 0);
	cr_assert_eq(tr_store_job_set_state(s, ids[1], TR_JOB_RUNNING, NULL, NULL, NULL), 0);
	cr_assert_eq(tr_store_job_set_state(s, ids[4], TR_JOB_RUNNING, NULL, NULL, NULL), 0);

	/* Pages of 3 cover every job once, in id order. */
	int64_t after = 0, seen = 0;
	for (;;) {
		struct tr_job_row *rows;
		int n;
		cr_assert_eq(tr_store_job_list(s, NULL, after, 3, &rows, &n, NULL), 0);
		cr_assert_leq(n, 3);
		for (int i = 0; i < n; i++) {
			cr_assert_eq(rows[i].id, ids[seen++]);
			tr_job_row_finish(&rows[i]);
		}
		if (n)
			after = ids[seen - 1];
		free(rows);
		if (n < 3)
			break;
	}
	cr_assert_eq(seen, 7);

	struct tr_job_row *rows;
	int n;
	enum tr_job_state running = TR_JOB_RUNNING, failed = TR_JOB_FAILED;
	cr_assert_eq(tr_store_job_list(s, &running, 0, 10, &rows, &n, NULL), 0);
	cr_assert_eq(n, 2);
	cr_assert_eq(rows[0].id, ids[1]);
	cr_assert_eq(rows[1].id, ids[4]);
	for (int i = 0; i < n; i++)
		tr_job_row_finish(&rows[i]);
	free(rows);
	cr_assert_eq(tr_store_job_list(s, &running, ids[1], 10, &rows, &n, NULL), 0);
	cr_assert_eq(n, 1);
	tr_job_row_finish(&rows[0]);
	free(rows);
	cr_assert_eq(tr_store_job_list(s, &failed, 0, 10, &rows, &n, NULL), 0);
	cr_assert_eq(n, 0);
	free(rows);
	tr_store_close(s);
}

Test(jobs, idempotency_key)
{
	tr_store_t *s = open_store(NULL);
	struct tr_job_row a = {.name = "a", .spec = "{}", .idempotency_key = "key-1", .request_hash = "h1"};
	cr_assert_eq(tr_store_job_insert(s, &a, NULL, NULL), 0);
	struct tr_job_row b = {.name = "b", .spec = "{}", .idempotency_key = "key-1", .request_hash = "h2"};
	int64_t existing = 0;
	cr_assert_eq(tr_store_job_insert(s, &b, &existing, NULL), -EEXIST);
	cr_assert_eq(existing, a.id);
	cr_assert_eq(b.id, 0);
	struct tr_job_row c = {.name = "c", .spec = "{}", .idempotency_key = "key-2"};
	cr_assert_eq(tr_store_job_insert(s, &c, &existing, NULL), 0);
	cr_assert_neq(c.id, a.id);
	/* Jobs without a key never collide. */
	add_job(s, "d", 0);
	add_job(s, "e", 0);
	tr_store_close(s);
}

/* Preemptible experiments (migration 13): an experiment keeps its
 * priority and preemptible flag, which its trials are submitted with; the
 * default is not preemptible. */
Test(store, an_experiment_keeps_its_preemptible_flag)
{
	tr_store_t *s = open_store(NULL);
	struct tr_experiment_row a = {.name = "a",
				      .state = TR_EXP_QUEUED,
				      .priority = 3,
				      .preemptible = true,
				      .request = "{}"},
				 b = {.name = "b", .state = TR_EXP_QUEUED, .request = "{}"};
	cr_assert_eq(tr_store_experiment_insert(s, &a, NULL), 0);
	cr_assert_eq(tr_store_experiment_insert(s, &b, NULL), 0);
	struct tr_experiment_row got;
	cr_assert_eq(tr_store_experiment_get(s, a.id, &got, NULL), 0);
	cr_assert(got.preemptible);
	cr_assert_eq(got.priority, 3);
	tr_experiment_row_finish(&got);
	cr_assert_eq(tr_store_experiment_get(s, b.id, &got, NULL), 0);
	cr_assert(!got.preemptible);
	tr_experiment_row_finish(&got);
	struct tr_experiment_row *rows = NULL;
	int n = 0;
	cr_assert_eq(tr_store_experiment_list(s, NULL, 0, 0, &rows, &n, NULL), 0);
	cr_assert_eq(n, 2);
	cr_assert(rows[0].preemptible && !rows[1].preemptible);
	for (int i = 0; i < n; i++)
		tr_experiment_row_finish(&rows[i]);
	free(rows);
	tr_store_close(s);
}

/* Priority preemption (migration 11): a job's preemptible flag and its
 * preemption record are stored, and the change to preempted carries the
 * record in its state event (the other changes do not). */
Test(jobs, preemptible_and_the_preemption_record)
{
	tr_store_t *s = open_store(NULL);
	struct tr_job_row r = {.name = "low", .spec = "{\"epochs\":1}", .preemptible = true};
	cr_assert_eq(tr_store_job_insert(s, &r, NULL, NULL), 0);
	int64_t id = r.id, other = add_job(s, "high", 5);
	const char *rec = "{\"by\":2,\"by_priority\":5,\"priority\":0,\"step\":30,\"mode\":\"checkpoint\"}";
	cr_assert_eq(tr_store_job_set_preemption(s, id, "[1]", NULL), -EINVAL, "not an object");
	cr_assert_eq(tr_store_job_set_state(s, id, TR_JOB_RUNNING, NULL, "[0,1]", NULL), 0);
	cr_assert_eq(tr_store_job_set_preemption(s, id, rec, NULL), 0);
	cr_assert_eq(tr_store_job_set_state(s, id, TR_JOB_PREEMPTED, NULL, NULL, NULL), 0);
	cr_assert_eq(tr_store_job_set_state(s, id, TR_JOB_RUNNING, NULL, NULL, NULL), 0);
	struct tr_job_row got;
	cr_assert_eq(tr_store_job_get(s, id, &got, NULL), 0);
	cr_assert(got.preemptible);
	cr_assert_str_eq(got.preemption, rec);
	cr_assert_eq(got.state, TR_JOB_RUNNING);
	tr_job_row_finish(&got);
	cr_assert_eq(tr_store_job_get(s, other, &got, NULL), 0);
	cr_assert(!got.preemptible);
	cr_assert_null(got.preemption);
	tr_job_row_finish(&got);

	struct tr_event *ev;
	int n;
	cr_assert_eq(tr_store_events_after(s, id, 0, 0, &ev, &n, NULL), 0);
	cr_assert_eq(n, 4); /* queued, running, preempted, running */
	for (int i = 0; i < n; i++) {
		json_t *d = json_loads(ev[i].data, 0, NULL);
		json_t *p = json_object_get(d, "preemption");
		if (i == 2) {
			cr_assert_str_eq(json_string_value(json_object_get(d, "state")), "preempted");
			cr_assert_eq(json_integer_value(json_object_get(p, "by")), 2, "%s", ev[i].data);
		} else {
			cr_assert_null(p, "event %d: %s", i, ev[i].data);
		}
		json_decref(d);
	}
	tr_events_free(ev, n);
	tr_store_close(s);
}

Test(jobs, set_state_stamps_times_and_adds_events)
{
	tr_store_t *s = open_store(NULL);
	int64_t id = add_job(s, "a", 0);
	cr_assert_eq(tr_store_job_set_state(s, id, TR_JOB_RUNNING, NULL, "[0,1]", NULL), 0);
	struct tr_job_row r;
	cr_assert_eq(tr_store_job_get(s, id, &r, NULL), 0);
	cr_assert_eq(r.state, TR_JOB_RUNNING);
	cr_assert_str_eq(r.devices, "[0,1]");
	double started = r.started_at;
	cr_assert_gt(started, 0);
	cr_assert_eq(r.finished_at, 0);
	tr_job_row_finish(&r);

	usleep(20000);
	cr_assert_eq(tr_store_job_set_state(s, id, TR_JOB_PAUSED, NULL, NULL, NULL), 0);
	cr_assert_eq(tr_store_job_set_state(s, id, TR_JOB_RUNNING, NULL, NULL, NULL), 0);
	const char *error = "{\"code\":\"loader\",\"message\":\"x.csv:3: bad\",\"step\":7}";
	cr_assert_eq(tr_store_job_set_state(s, id, TR_JOB_FAILED, error, NULL, NULL), 0);
	cr_assert_eq(tr_store_job_get(s, id, &r, NULL), 0);
	cr_assert_eq(r.started_at, started, "started_at is stamped the first time only");
	cr_assert_gt(r.finished_at, started);
	cr_assert_str_eq(r.devices, "[0,1]", "NULL devices leaves them unchanged");
	cr_assert_str_eq(r.error, error);
	tr_job_row_finish(&r);

	struct tr_event *ev;
	int n;
	cr_assert_eq(tr_store_events_after(s, id, 0, 0, &ev, &n, NULL), 0);
	cr_assert_eq(n, 5);
	const char *want[] = {"queued", "running", "paused", "running", "failed"};
	for (int i = 0; i < n; i++) {
		cr_assert_str_eq(ev[i].type, "state");
		cr_assert_eq(ev[i].job_id, id);
		if (i)
			cr_assert_gt(ev[i].id, ev[i - 1].id);
		json_t *d = json_loads(ev[i].data, 0, NULL);
		cr_assert_not_null(d);
		cr_assert_str_eq(json_string_value(json_object_get(d, "state")), want[i]);
		json_t *e = json_object_get(d, "error");
		if (i < 4)
			cr_assert(json_is_null(e));
		else
			cr_assert_eq(json_integer_value(json_object_get(e, "step")), 7);
		json_decref(d);
	}
	cr_assert_eq(tr_store_last_event_id(s), ev[n - 1].id);
	tr_events_free(ev, n);

	cr_assert_eq(tr_store_job_set_state(s, id, TR_JOB_NSTATES, NULL, NULL, NULL), -EINVAL);
	cr_assert_eq(tr_store_job_set_state(s, id, TR_JOB_FAILED, "{not json", NULL, NULL), -EINVAL);
	cr_assert_eq(tr_store_job_set_state(s, 12345, TR_JOB_RUNNING, NULL, NULL, NULL), -ENOENT);
	tr_store_close(s);
}

/* The store takes and returns enum tr_job_state and keeps each state as
 * its name: every state goes in through set_state, comes back from get,
 * the filtered lists and the counts, and sits in the database as the same
 * text as before (the schema and the API's JSON do not change). */
Test(jobs, every_state_round_trips)
{
	tr_store_t *s = open_store(NULL);
	int64_t id = add_job(s, "a", 0), other = add_job(s, "b", 0);
	for (int i = 0; i < TR_JOB_NSTATES; i++) {
		enum tr_job_state st = (enum tr_job_state)i;
		const char *name = tr_job_state_name(st);
		struct tr_error e = {0};
		cr_assert_eq(tr_store_job_set_state(s, id, st, NULL, NULL, &e), 0, "%s: %s", name, e.message);
		struct tr_job_row r;
		cr_assert_eq(tr_store_job_get(s, id, &r, NULL), 0);
		cr_assert_eq(r.state, st, "%s came back as %d", name, (int)r.state);
		cr_assert_eq(r.finished_at > 0, tr_job_state_terminal(st), "%s: finished_at %f", name, r.finished_at);
		tr_job_row_finish(&r);

		char sql[96];
		snprintf(sql, sizeof sql, "SELECT count(*) FROM jobs WHERE id = %lld AND state = '%s'", (long long)id,
			 name);
		cr_assert_eq(sql_int(sql), 1, "the database holds \"%s\"", name);

		struct tr_job_row *rows;
		int n;
		cr_assert_eq(tr_store_job_list(s, &st, 0, 10, &rows, &n, NULL), 0);
		cr_assert_eq(n, st == TR_JOB_QUEUED ? 2 : 1, "%s: %d listed", name, n);
		cr_assert_eq(rows[n - 1].id, st == TR_JOB_QUEUED ? other : id);
		cr_assert_eq(rows[n - 1].state, st);
		for (int k = 0; k < n; k++)
			tr_job_row_finish(&rows[k]);
		free(rows);
		cr_assert_eq(tr_store_job_list_states(s, &st, 1, &rows, &n, NULL), 0);
		cr_assert_eq(n, st == TR_JOB_QUEUED ? 2 : 1, "%s: %d in list_states", name, n);
		for (int k = 0; k < n; k++)
			tr_job_row_finish(&rows[k]);
		free(rows);

		int64_t counts[TR_JOB_NSTATES], submitted = 0;
		cr_assert_eq(tr_store_job_counts(s, counts, &submitted, NULL), 0);
		for (int k = 0; k < TR_JOB_NSTATES; k++)
			cr_assert_eq(counts[k], (k == i) + (k == TR_JOB_QUEUED), "%s: counts[%s] = %lld", name,
				     tr_job_state_names[k], (long long)counts[k]);
		cr_assert_eq(submitted, 2);
	}
	/* Every change's event names its state: queued at insert, then each. */
	struct tr_event *ev;
	int n;
	cr_assert_eq(tr_store_events_after(s, id, 0, 0, &ev, &n, NULL), 0);
	cr_assert_eq(n, 1 + TR_JOB_NSTATES);
	for (int i = 0; i < n; i++) {
		json_t *d = json_loads(ev[i].data, 0, NULL);
		cr_assert_str_eq(json_string_value(json_object_get(d, "state")),
				 tr_job_state_name(i == 0 ? TR_JOB_QUEUED : (enum tr_job_state)(i - 1)));
		json_decref(d);
	}
	tr_events_free(ev, n);
	/* A value out of range is refused, not written. */
	enum tr_job_state bad = TR_JOB_NSTATES;
	struct tr_job_row *rows;
	struct tr_error e = {0};
	cr_assert_eq(tr_store_job_set_state(s, id, bad, NULL, NULL, &e), -EINVAL);
	cr_assert_not_null(strstr(e.message, "unknown job state"), "%s", e.message);
	cr_assert_eq(tr_store_job_record_state(s, id, bad, NULL, NULL, NULL), -EINVAL);
	cr_assert_eq(tr_store_job_list(s, &bad, 0, 10, &rows, &n, NULL), -EINVAL);
	cr_assert_eq(tr_store_job_list_states(s, &bad, 1, &rows, &n, NULL), -EINVAL);
	tr_store_close(s);
}

/* A state name the store does not know can only come from a database
 * changed by hand or damaged: every read of it is an error naming the job
 * and the text (-EBADMSG), never a guessed state, and the other jobs and
 * the store stay usable. */
Test(jobs, unknown_state_in_database_is_an_error)
{
	tr_store_t *s = open_store(NULL);
	int64_t id = add_job(s, "a", 0), other = add_job(s, "b", 0);
	sqlite3 *db;
	cr_assert_eq(sqlite3_open(db_path, &db), SQLITE_OK);
	char sql[96];
	snprintf(sql, sizeof sql, "UPDATE jobs SET state = 'sleeping' WHERE id = %lld", (long long)id);
	cr_assert_eq(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK, "%s", sqlite3_errmsg(db));
	sqlite3_close(db);

	char want[64];
	snprintf(want, sizeof want, "job %lld has an unknown state \"sleeping\"", (long long)id);
	struct tr_job_row r, *rows = NULL;
	int n = -1;
	struct tr_error e = {0};
	cr_assert_eq(tr_store_job_get(s, id, &r, &e), -EBADMSG);
	cr_assert_not_null(strstr(e.message, want), "%s", e.message);
	cr_assert_not_null(strstr(e.message, "state database"), "%s", e.message);
	tr_job_row_finish(&r); /* zeroed: nothing to free */

	memset(&e, 0, sizeof e);
	cr_assert_eq(tr_store_job_list(s, NULL, 0, 10, &rows, &n, &e), -EBADMSG);
	cr_assert_not_null(strstr(e.message, want), "%s", e.message);
	cr_assert_null(rows);
	cr_assert_eq(n, 0);
	const enum tr_job_state queued = TR_JOB_QUEUED;
	cr_assert_eq(tr_store_job_list_states(s, NULL, 0, &rows, &n, &e), -EBADMSG);
	/* A filter that leaves it out does not read it. */
	cr_assert_eq(tr_store_job_list_states(s, &queued, 1, &rows, &n, NULL), 0);
	cr_assert_eq(n, 1);
	cr_assert_eq(rows[0].id, other);
	tr_job_row_finish(&rows[0]);
	free(rows);

	int64_t counts[TR_JOB_NSTATES];
	memset(&e, 0, sizeof e);
	cr_assert_eq(tr_store_job_counts(s, counts, NULL, &e), -EBADMSG);
	cr_assert_not_null(strstr(e.message, "unknown state \"sleeping\""), "%s", e.message);

	/* A state change reads the old state (for the finished_at stamp). */
	memset(&e, 0, sizeof e);
	cr_assert_eq(tr_store_job_set_state(s, id, TR_JOB_CANCELLED, NULL, NULL, &e), -EBADMSG);
	cr_assert_not_null(strstr(e.message, want), "%s", e.message);

	cr_assert_eq(tr_store_job_get(s, other, &r, NULL), 0);
	cr_assert_eq(r.state, TR_JOB_QUEUED);
	tr_job_row_finish(&r);
	cr_assert_eq(tr_store_job_set_state(s, other, TR_JOB_RUNNING, NULL, NULL, NULL), 0);
	tr_store_close(s);
}

Test(jobs, list_states_priority_order)
{
	tr_store_t *s = open_store(NULL);
	int64_t low = add_job(s, "low", 0);
	int64_t high = add_job(s, "high", 10);
	int64_t mid1 = add_job(s, "mid1", 5);
	int64_t mid2 = add_job(s, "mid2", 5);
	int64_t done = add_job(s, "done", 100);
	int64_t intr = add_job(s, "interrupted", 1);
	cr_assert_eq(tr_store_job_set_state(s, done, TR_JOB_COMPLETED, NULL, NULL, NULL), 0);
	cr_assert_eq(tr_store_job_set_state(s, intr, TR_JOB_INTERRUPTED, NULL, NULL, NULL), 0);

	const enum tr_job_state states[] = {TR_JOB_QUEUED, TR_JOB_INTERRUPTED};
	struct tr_job_row *rows;
	int n;
	cr_assert_eq(tr_store_job_list_states(s, states, 2, &rows, &n, NULL), 0);
	int64_t want[] = {high, mid1, mid2, intr, low};
	cr_assert_eq(n, 5);
	for (int i = 0; i < n; i++) {
		cr_assert_eq(rows[i].id, want[i], "position %d", i);
		tr_job_row_finish(&rows[i]);
	}
	free(rows);

	cr_assert_eq(tr_store_job_set_priority(s, low, 50, NULL), 0);
	cr_assert_eq(tr_store_job_set_priority(s, 999, 1, NULL), -ENOENT);
	const enum tr_job_state queued[] = {TR_JOB_QUEUED};
	cr_assert_eq(tr_store_job_list_states(s, queued, 1, &rows, &n, NULL), 0);
	cr_assert_eq(n, 4);
	cr_assert_eq(rows[0].id, low);
	for (int i = 0; i < n; i++)
		tr_job_row_finish(&rows[i]);
	free(rows);
	tr_store_close(s);
}

Test(jobs, progress)
{
	tr_store_t *s = open_store(NULL);
	int64_t id = add_job(s, "a", 0);
	cr_assert_eq(tr_store_job_set_progress(s, id, 40, 100, 2, 0.25, NULL), 0);
	struct tr_job_row r;
	cr_assert_eq(tr_store_job_get(s, id, &r, NULL), 0);
	cr_assert_eq(r.step, 40);
	cr_assert_eq(r.total_steps, 100);
	cr_assert_eq(r.epoch, 2);
	cr_assert_float_eq(r.loss, 0.25, 1e-12);
	cr_assert_gt(r.updated_at, 0);
	tr_job_row_finish(&r);
	cr_assert_eq(tr_store_job_set_progress(s, id, 41, 100, 2, NAN, NULL), 0);
	cr_assert_eq(tr_store_job_get(s, id, &r, NULL), 0);
	cr_assert(isnan(r.loss));
	tr_job_row_finish(&r);
	cr_assert_eq(tr_store_job_set_progress(s, 777, 1, 1, 1, 1, NULL), -ENOENT);
	tr_store_close(s);
}

Test(jobs, delete_cascades)
{
	tr_store_t *s = open_store(NULL);
	int64_t a = add_job(s, "a", 0), b = add_job(s, "b", 0);
	for (int64_t job = a; job <= b; job++) {
		cr_assert_eq(tr_store_job_set_state(s, job, TR_JOB_RUNNING, NULL, NULL, NULL), 0);
		for (int i = 0; i < 100; i++)
			cr_assert_eq(tr_store_metric_append(s, job, "loss", i, 0, 1.0, i * 0.5, NULL), 0);
		cr_assert_eq(tr_store_log_append(s, job, 6, "hello", NULL), 0);
	}
	cr_assert_eq(tr_store_flush(s, NULL), 0);
	cr_assert_gt(sql_int("SELECT count(*) FROM metrics_rollup"), 0);
	cr_assert_eq(tr_store_job_delete(s, a, NULL), 0);
	cr_assert_eq(tr_store_job_delete(s, a, NULL), -ENOENT);

	char sql[128];
	const char *tables[] = {"metrics", "metrics_rollup", "events", "logs"};
	for (int t = 0; t < 4; t++) {
		snprintf(sql, sizeof sql, "SELECT count(*) FROM %s WHERE job_id = %lld", tables[t], (long long)a);
		cr_assert_eq(sql_int(sql), 0, "%s", tables[t]);
		snprintf(sql, sizeof sql, "SELECT count(*) FROM %s WHERE job_id = %lld", tables[t], (long long)b);
		cr_assert_gt(sql_int(sql), 0, "%s of the other job", tables[t]);
	}
	struct tr_job_row r;
	cr_assert_eq(tr_store_job_get(s, a, &r, NULL), -ENOENT);
	/* Ids are never reused: URLs and Last-Event-IDs stay unambiguous. */
	int64_t c = add_job(s, "c", 0);
	cr_assert_gt(c, b);
	cr_assert_eq(tr_store_integrity_check(s, NULL), 0);
	tr_store_close(s);
}

/* The writes of a job's info fields and of its result: each in one
 * transaction that commits and marks the job's data changed, or rolls
 * back with a message that says why and leaves the job as it was. */
Test(jobs, info_and_result_writes)
{
	tr_store_t *s = open_store(NULL);
	int64_t id = add_job(s, "a", 0);
	struct tr_error e = {0};
	uint64_t gen = tr_store_job_data_generation(s, id);

	cr_assert_eq(tr_store_job_result_set(s, id, "{\"accuracy\":0.5}", &e), 0, "%s", e.message);
	cr_assert_gt(tr_store_job_data_generation(s, id), gen);
	char *text = NULL;
	cr_assert_eq(tr_store_job_result_get(s, id, &text, &e), 0, "%s", e.message);
	cr_assert_str_eq(text, "{\"accuracy\":0.5}");
	free(text);
	cr_assert_eq(tr_store_job_result_set(s, 777, "{}", &e), -ENOENT);
	cr_assert_str_eq(e.message, "job 777 not found");

	gen = tr_store_job_data_generation(s, id);
	cr_assert_eq(tr_store_job_info_merge(s, id, "{\"a\":\"1\",\"b\":\"2\"}", 2, &e), 0, "%s", e.message);
	cr_assert_gt(tr_store_job_data_generation(s, id), gen);
	gen = tr_store_job_data_generation(s, id);
	cr_assert_eq(tr_store_job_info_merge(s, id, "{\"c\":\"3\"}", 2, &e), -E2BIG);
	char want[128];
	snprintf(want, sizeof want, "job %lld would have 3 info fields, at most 2 are kept", (long long)id);
	cr_assert_str_eq(e.message, want);
	cr_assert_eq(tr_store_job_data_generation(s, id), gen, "a refused write changed nothing");
	cr_assert_eq(tr_store_job_info_merge(s, 777, "{}", 2, &e), -ENOENT);
	cr_assert_str_eq(e.message, "job 777 not found");
	struct tr_job_row r;
	cr_assert_eq(tr_store_job_get(s, id, &r, &e), 0, "%s", e.message);
	cr_assert_str_eq(r.info, "{\"a\":\"1\",\"b\":\"2\"}");
	tr_job_row_finish(&r);
	tr_store_close(s);
}

/* ---- metrics ------------------------------------------------------------------- */

Test(metrics, append_flush_query)
{
	tr_store_t *s = open_store(NULL);
	int64_t id = add_job(s, "a", 0);
	for (int i = 0; i < 50; i++) {
		cr_assert_eq(tr_store_metric_append(s, id, "loss", i, i / 10, 1000.0 + i, 1.0 / (i + 1), NULL), 0);
		if (i % 5 == 0)
			cr_assert_eq(tr_store_metric_append(s, id, "val_loss", i, i / 10, 2000.0 + i, 2.0 * i, NULL),
				     0);
	}
	cr_assert_eq(tr_store_metric_append(s, id, "lr", 3, 0, 1, NAN, NULL), 0);
	cr_assert_eq(tr_store_metric_append(s, id, "lr", 4, 0, 1, INFINITY, NULL), 0);
	cr_assert_eq(tr_store_metric_append(s, id, "", 4, 0, 1, 1, NULL), -EINVAL);
	cr_assert_eq(tr_store_metric_append(s, 0, "x", 4, 0, 1, 1, NULL), -EINVAL);
	cr_assert_eq(tr_store_flush(s, NULL), 0);

	json_t *names = tr_store_metric_names(s, id, NULL);
	cr_assert_eq(json_array_size(names), 3);
	cr_assert_str_eq(json_string_value(json_array_get(names, 0)), "loss");
	cr_assert_str_eq(json_string_value(json_array_get(names, 1)), "lr");
	cr_assert_str_eq(json_string_value(json_array_get(names, 2)), "val_loss");
	json_decref(names);

	struct tr_metrics_query q = {.from_step = 0, .to_step = INT64_MAX};
	json_t *res = tr_store_metrics_query(s, id, &q, NULL);
	cr_assert_not_null(res);
	const char *key;
	json_t *val;
	const char *order[] = {"loss", "lr", "val_loss"};
	int k = 0;
	json_object_foreach(json_object_get(res, "series"), key, val)
		cr_assert_str_eq(key, order[k++], "series in name order");
	cr_assert_eq(k, 3);
	json_t *loss = series_of(res, "loss");
	cr_assert_eq(json_array_size(json_object_get(loss, "steps")), 50);
	cr_assert_null(json_object_get(loss, "epochs"));
	cr_assert_null(json_object_get(loss, "times"));
	for (int i = 0; i < 50; i++) {
		cr_assert_eq(json_integer_value(json_array_get(json_object_get(loss, "steps"), i)), i);
		cr_assert_eq(json_real_value(json_array_get(json_object_get(loss, "values"), i)), 1.0 / (i + 1));
	}
	json_t *lr = json_object_get(series_of(res, "lr"), "values");
	cr_assert(json_is_null(json_array_get(lr, 0)), "NaN comes out as null");
	cr_assert(json_is_null(json_array_get(lr, 1)), "inf comes out as null");
	json_decref(res);

	const char *const only[] = {"val_loss", "nope", NULL};
	q = (struct tr_metrics_query){
		.names = only, .from_step = 10, .to_step = 30, .with_epochs = true, .with_times = true};
	res = tr_store_metrics_query(s, id, &q, NULL);
	cr_assert_not_null(res);
	cr_assert_eq(json_object_size(json_object_get(res, "series")), 1);
	json_t *vl = series_of(res, "val_loss");
	json_t *steps = json_object_get(vl, "steps"), *epochs = json_object_get(vl, "epochs"),
	       *times = json_object_get(vl, "times");
	cr_assert_eq(json_array_size(steps), 5); /* 10 15 20 25 30 */
	for (int i = 0; i < 5; i++) {
		int step = 10 + 5 * i;
		cr_assert_eq(json_integer_value(json_array_get(steps, i)), step);
		cr_assert_eq(json_integer_value(json_array_get(epochs, i)), step / 10);
		cr_assert_eq(json_real_value(json_array_get(times, i)), 2000.0 + step);
	}
	json_decref(res);

	q = (struct tr_metrics_query){.to_step = INT64_MAX, .max_points = -1};
	struct tr_error e = {0};
	cr_assert_null(tr_store_metrics_query(s, id, &q, &e));
	cr_assert_not_null(strstr(e.message, "max_points"), "%s", e.message);
	/* Other jobs see nothing. */
	q.max_points = 0;
	res = tr_store_metrics_query(s, id + 100, &q, NULL);
	cr_assert_eq(json_object_size(json_object_get(res, "series")), 0);
	json_decref(res);
	tr_store_close(s);
}

/* A summary's several last points in one read: each name its own,
 * absent ones not found, a NaN point as NaN, the latest written among
 * equal steps, another job's points not seen. */
Test(metrics, last_points_of_several_series_at_once)
{
	tr_store_t *s = open_store(NULL);
	int64_t id = add_job(s, "a", 0), other = add_job(s, "b", 0);
	for (int i = 0; i < 20; i++)
		cr_assert_eq(tr_store_metric_append(s, id, "loss", i, 0, 1000.0 + i, 1.0 / (i + 1), NULL), 0);
	cr_assert_eq(tr_store_metric_append(s, id, "val_loss", 9, 0, 1, 0.5, NULL), 0);
	cr_assert_eq(tr_store_metric_append(s, id, "val_loss", 9, 0, 2, 0.25, NULL), 0); /* same step, later */
	cr_assert_eq(tr_store_metric_append(s, id, "lr", 3, 0, 1, NAN, NULL), 0);
	cr_assert_eq(tr_store_metric_append(s, other, "val_accuracy", 30, 0, 1, 0.9, NULL), 0);
	cr_assert_eq(tr_store_flush(s, NULL), 0);

	const char *const names[] = {"val_loss", "val_accuracy", "loss", "lr"};
	struct tr_metric_last last[4];
	cr_assert_eq(tr_store_metrics_last(s, id, names, 4, last, NULL), 0);
	cr_assert(last[0].found && last[0].step == 9 && last[0].value == 0.25, "val_loss: %d %lld %g", last[0].found,
		  (long long)last[0].step, last[0].value);
	cr_assert(!last[1].found, "val_accuracy is the other job's");
	cr_assert(last[2].found && last[2].step == 19 && last[2].value == 1.0 / 20, "loss: %lld %g",
		  (long long)last[2].step, last[2].value);
	cr_assert(last[3].found && last[3].step == 3 && isnan(last[3].value), "lr");

	int64_t step;
	double v;
	cr_assert_eq(tr_store_metric_last(s, id, "loss", &step, &v, NULL), 1);
	cr_assert(step == 19 && v == 1.0 / 20);
	cr_assert_eq(tr_store_metric_last(s, id, "nope", &step, &v, NULL), 0);
	tr_store_close(s);
}

Test(metrics, queryable_within_a_second_without_flush)
{
	tr_store_t *s = open_store(NULL);
	int64_t id = add_job(s, "a", 0);
	double t0 = now_ms();
	cr_assert_eq(tr_store_metric_append(s, id, "loss", 1, 0, 1, 0.5, NULL), 0);
	const char *const loss[] = {"loss", NULL};
	struct tr_metrics_query q = {.names = loss, .to_step = INT64_MAX};
	double seen = -1;
	while (now_ms() - t0 < 2000) {
		json_t *res = tr_store_metrics_query(s, id, &q, NULL);
		bool found = series_of(res, "loss") != NULL;
		json_decref(res);
		if (found) {
			seen = now_ms() - t0;
			break;
		}
		usleep(5000);
	}
	cr_assert(seen >= 0 && seen < 1000, "visible after %.0f ms", seen);
	tr_store_close(s);
}

/* Brute force for the contract in store.h: every point of [lo, hi] in
 * step order (ties in insertion order); the first step a bucket of its
 * own, the rest in aligned buckets of the smallest power-of-two width
 * that makes at most max_points - 1; each bucket shown as its last point
 * with its min and max. */
struct bpt {
	int64_t step;
	double value;
};

struct bout {
	int64_t step;
	double value, min, max;
};

static int vcmp(double a, double b)
{
	if (isnan(a))
		return isnan(b) ? 0 : 1;
	if (isnan(b))
		return -1;
	return (a > b) - (a < b);
}

static int cmp_bpt(const void *a, const void *b)
{
	const struct bpt *x = a, *y = b;
	return (x->step > y->step) - (x->step < y->step);
}

static int64_t floor_div(int64_t a, int64_t b)
{
	int64_t q = a / b;
	return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

/* One bucket: pts[i0, i1). */
static struct bout bucket_out(const struct bpt *pts, size_t i0, size_t i1)
{
	struct bout o = {pts[i1 - 1].step, pts[i1 - 1].value, pts[i0].value, pts[i0].value};
	for (size_t i = i0; i < i1; i++) {
		if (vcmp(pts[i].value, o.min) < 0)
			o.min = pts[i].value;
		if (vcmp(pts[i].value, o.max) > 0)
			o.max = pts[i].value;
	}
	return o;
}

/* Expected output for pts (sorted by step) within [from, to]; *down says
 * whether it is downsampled. */
static size_t brute(const struct bpt *pts, size_t n, int64_t from, int64_t to, int max_points, struct bout *out,
		    bool *down)
{
	size_t i0 = 0, i1 = n, m = 0;
	while (i0 < n && pts[i0].step < from)
		i0++;
	while (i1 > i0 && pts[i1 - 1].step > to)
		i1--;
	*down = false;
	if (i0 == i1)
		return 0;
	size_t total = i1 - i0;
	if (max_points == 0 || total <= (size_t)max_points) {
		for (size_t i = i0; i < i1; i++)
			out[m++] = (struct bout){pts[i].step, pts[i].value, pts[i].value, pts[i].value};
		return m;
	}
	*down = true;
	if (max_points == 1) {
		out[0] = bucket_out(pts, i0, i1);
		return 1;
	}
	int64_t lo = pts[i0].step, hi = pts[i1 - 1].step, w = 1;
	size_t i = i0;
	while (i < i1 && pts[i].step == lo)
		i++;
	out[m++] = bucket_out(pts, i0, i);
	if (hi == lo)
		return m;
	while (floor_div(hi, w) - floor_div(lo + 1, w) + 1 > max_points - 1)
		w *= 2;
	while (i < i1) {
		size_t j = i;
		while (j < i1 && floor_div(pts[j].step, w) == floor_div(pts[i].step, w))
			j++;
		out[m++] = bucket_out(pts, i, j);
		i = j;
	}
	return m;
}

static double num_at(json_t *a, size_t i)
{
	json_t *v = json_array_get(a, i);
	return json_is_null(v) ? NAN : json_real_value(v);
}

static bool same_value(double got, double want)
{
	return vcmp(got, want) == 0 || (!isfinite(got) && !isfinite(want));
}

static void check_against_brute(tr_store_t *s, int64_t job, const char *name, const struct bpt *pts, size_t n,
				int64_t from, int64_t to, int max_points)
{
	struct bout *want = malloc((n + 1) * sizeof *want);
	bool down;
	size_t nw = brute(pts, n, from, to, max_points, want, &down);
	const char *const names[] = {name, NULL};
	struct tr_metrics_query q = {.names = names, .from_step = from, .to_step = to, .max_points = max_points};
	json_t *res = tr_store_metrics_query(s, job, &q, NULL);
	cr_assert_not_null(res);
	json_t *ser = series_of(res, name);
	if (nw == 0) {
		cr_assert_null(ser);
		goto done;
	}
	json_t *steps = json_object_get(ser, "steps"), *values = json_object_get(ser, "values");
	json_t *mins = json_object_get(ser, "min"), *maxs = json_object_get(ser, "max");
	cr_assert_eq(json_array_size(steps), nw, "[%lld, %lld] max %d: %zu points, want %zu", (long long)from,
		     (long long)to, max_points, json_array_size(steps), nw);
	cr_assert_eq(json_array_size(values), nw);
	cr_assert(json_is_boolean(json_object_get(ser, "downsampled")));
	cr_assert_eq(json_is_true(json_object_get(ser, "downsampled")), down, "[%lld, %lld] max %d: downsampled",
		     (long long)from, (long long)to, max_points);
	if (down) {
		cr_assert_eq(json_array_size(mins), nw);
		cr_assert_eq(json_array_size(maxs), nw);
	} else {
		cr_assert_null(mins, "a series that is not downsampled has no min array");
		cr_assert_null(maxs);
	}
	if (max_points)
		cr_assert_leq(nw, (size_t)max_points);
	for (size_t i = 0; i < nw; i++) {
		cr_assert_eq(json_integer_value(json_array_get(steps, i)), want[i].step,
			     "[%lld, %lld] max %d: point %zu", (long long)from, (long long)to, max_points, i);
		cr_assert(same_value(num_at(values, i), want[i].value), "[%lld, %lld] max %d: point %zu: %g, want %g",
			  (long long)from, (long long)to, max_points, i, num_at(values, i), want[i].value);
		if (down) {
			cr_assert(same_value(num_at(mins, i), want[i].min), "[%lld, %lld] max %d: min %zu: %g, want %g",
				  (long long)from, (long long)to, max_points, i, num_at(mins, i), want[i].min);
			cr_assert(same_value(num_at(maxs, i), want[i].max), "[%lld, %lld] max %d: max %zu: %g, want %g",
				  (long long)from, (long long)to, max_points, i, num_at(maxs, i), want[i].max);
		}
	}
done:
	json_decref(res);
	free(want);
}

/* A spike and a dip survive in the bucket envelope; the first and last
 * points are kept. */
Test(metrics, downsample_keeps_bucket_extremes)
{
	tr_store_t *s = open_store(NULL);
	int64_t id = add_job(s, "a", 0);
	int n = 10000;
	struct bpt *pts = malloc(n * sizeof *pts);
	for (int i = 0; i < n; i++) {
		double v = sin(i * 0.01);
		if (i == 1234)
			v = 100;
		if (i == 8765)
			v = -100;
		pts[i] = (struct bpt){i, v};
		cr_assert_eq(tr_store_metric_append(s, id, "loss", i, 0, 0, v, NULL), 0);
	}
	cr_assert_eq(tr_store_flush(s, NULL), 0);
	const char *const loss[] = {"loss", NULL};
	struct tr_metrics_query q = {.names = loss, .to_step = INT64_MAX, .max_points = 100};
	json_t *res = tr_store_metrics_query(s, id, &q, NULL);
	json_t *ser = series_of(res, "loss");
	json_t *steps = json_object_get(ser, "steps");
	size_t m = json_array_size(steps);
	cr_assert_leq(m, 100);
	cr_assert_geq(m, 50);
	cr_assert(json_is_true(json_object_get(ser, "downsampled")));
	cr_assert_eq(json_integer_value(json_array_get(steps, 0)), 0);
	cr_assert_eq(json_integer_value(json_array_get(steps, m - 1)), n - 1);
	bool spike = false, dip = false;
	for (size_t i = 0; i < m; i++) {
		if (i)
			cr_assert_gt(json_integer_value(json_array_get(steps, i)),
				     json_integer_value(json_array_get(steps, i - 1)), "step order");
		spike |= num_at(json_object_get(ser, "max"), i) == 100;
		dip |= num_at(json_object_get(ser, "min"), i) == -100;
	}
	cr_assert(spike && dip);
	json_decref(res);
	check_against_brute(s, id, "loss", pts, n, 0, INT64_MAX, 100);
	free(pts);
	tr_store_close(s);
}

/* The newest value is never dropped: a 2,600-step series whose maximum
 * is early (as val_accuracy's is not, but any series may be) ends at its
 * last step whatever max_points is (max_points=3 once ended at step 988). */
Test(metrics, downsample_keeps_first_and_last_points)
{
	tr_store_t *s = open_store(NULL);
	int64_t id = add_job(s, "a", 0);
	for (int i = 0; i <= 2600; i += 13) {
		double v = i == 988 ? 0.99 : 0.5 + (i % 7) * 0.01;
		cr_assert_eq(tr_store_metric_append(s, id, "val_accuracy", i, 0, 0, v, NULL), 0);
	}
	cr_assert_eq(tr_store_flush(s, NULL), 0);
	const char *const names[] = {"val_accuracy", NULL};
	for (int m = 1; m <= 40; m++) {
		struct tr_metrics_query q = {.names = names, .to_step = INT64_MAX, .max_points = m};
		json_t *res = tr_store_metrics_query(s, id, &q, NULL);
		json_t *ser = series_of(res, "val_accuracy");
		json_t *steps = json_object_get(ser, "steps");
		size_t k = json_array_size(steps);
		cr_assert(k >= 1 && k <= (size_t)m, "max_points %d: %zu points", m, k);
		cr_assert_eq(json_integer_value(json_array_get(steps, k - 1)), 2600, "max_points %d: ends at %lld", m,
			     (long long)json_integer_value(json_array_get(steps, k - 1)));
		if (m >= 2)
			cr_assert_eq(json_integer_value(json_array_get(steps, 0)), 0, "max_points %d", m);
		/* The 0.99 at step 988 is in some bucket's max. */
		bool found = false;
		for (size_t i = 0; i < k; i++)
			found |= num_at(json_object_get(ser, "max"), i) == 0.99;
		cr_assert(found, "max_points %d lost the maximum", m);
		json_decref(res);
	}
	tr_store_close(s);
}

/* A poll from the last step seen + 1 gets only the new points, raw. */
Test(metrics, incremental_poll_returns_only_new_points)
{
	tr_store_t *s = open_store(NULL);
	int64_t id = add_job(s, "a", 0);
	const char *const names[] = {"loss", NULL};
	int64_t seen = -1;
	for (int round = 0; round < 5; round++) {
		for (int i = 0; i < 300; i++)
			cr_assert_eq(tr_store_metric_append(s, id, "loss", round * 300 + i, 0, 0, 1.0 / (1 + i), NULL),
				     0);
		cr_assert_eq(tr_store_flush(s, NULL), 0);
		struct tr_metrics_query q = {.names = names,
					     .from_step = seen + 1,
					     .to_step = INT64_MAX,
					     .max_points = 2000};
		json_t *res = tr_store_metrics_query(s, id, &q, NULL);
		json_t *ser = series_of(res, "loss");
		json_t *steps = json_object_get(ser, "steps");
		cr_assert_eq(json_array_size(steps), 300, "round %d", round);
		cr_assert_eq(json_integer_value(json_array_get(steps, 0)), seen + 1);
		cr_assert(json_is_false(json_object_get(ser, "downsampled")));
		seen = json_integer_value(json_array_get(steps, 299));
		json_decref(res);
	}
	/* Nothing new: no series. */
	struct tr_metrics_query q = {.names = names, .from_step = seen + 1, .to_step = INT64_MAX, .max_points = 2000};
	json_t *res = tr_store_metrics_query(s, id, &q, NULL);
	cr_assert_eq(json_object_size(json_object_get(res, "series")), 0);
	json_decref(res);
	tr_store_close(s);
}

/* The whole-curve memo (want_text) answers exactly as a full computation
 * while a series grows, also across backfilled points, truncations and
 * bucket widths that double. */
static int collect_text(void *ctx, const struct tr_metrics_series *ser)
{
	json_t *into = ctx;
	char *text, *wrapped;
	size_t len;
	cr_assert_eq(tr_metrics_series_text(ser, false, true, &text, &len, NULL), 0);
	wrapped = malloc(len + 3);
	wrapped[0] = '{';
	memcpy(wrapped + 1, text, len);
	wrapped[len + 1] = '}';
	wrapped[len + 2] = 0;
	json_error_t e;
	json_t *one = json_loads(wrapped, 0, &e);
	cr_assert_not_null(one, "series text is not JSON: %s: %.200s", e.text, wrapped);
	json_object_update(into, one);
	json_decref(one);
	free(text);
	free(wrapped);
	return 0;
}

Test(metrics, whole_curve_memo_matches_full_computation, .timeout = 300)
{
	struct tr_store_options o = {.flush_interval_ms = 60000};
	tr_store_t *s = open_store(&o);
	int64_t id = add_job(s, "a", 0);
	int64_t step = 5, unique = 0;
	srand(5);
	int maxes[] = {2, 3, 17, 500, 5000};
	int64_t froms[] = {0, 1000};
	for (int round = 0; round < 60; round++) {
		int n = 1 + rand() % (round < 20 ? 200 : 3000);
		for (int i = 0; i < n; i++) {
			step += rand() % 10 == 0 ? rand() % 50 : rand() % 3 ? 1 : 0;
			double v = (rand() % 1000) / 10.0;
			if (rand() % 3000 == 0)
				v = NAN;
			cr_assert_eq(tr_store_metric_append(s, id, "m", step, round, 1e9 + step, v, NULL), 0);
			/* And a series without repeated steps or gaps (read raw
			 * from the memo while short). */
			cr_assert_eq(tr_store_metric_append(s, id, "u", unique++, round, 1e9, v, NULL), 0);
		}
		if (round % 11 == 5) /* a point pushed into the past */
			cr_assert_eq(tr_store_metric_append(s, id, "m", rand() % step, 0, 0, -5.0, NULL), 0);
		if (round == 33) {
			cr_assert_eq(tr_store_metrics_truncate(s, id, step - 700, NULL), 0);
			step -= 700;
			/* The same number of points again: only the truncation
			 * count tells the memo it is stale. */
		}
		cr_assert_eq(tr_store_flush(s, NULL), 0);
		for (size_t k = 0; k < sizeof maxes / sizeof maxes[0]; k++) {
			for (size_t f = 0; f < 2; f++) {
				struct tr_metrics_query q = {.from_step = froms[f],
							     .to_step = INT64_MAX,
							     .max_points = maxes[k],
							     .with_times = true};
				json_t *want = tr_store_metrics_query(s, id, &q, NULL);
				cr_assert_not_null(want);
				json_t *got = json_object();
				q.want_text = true;
				cr_assert_eq(tr_store_metrics_read(s, id, &q, collect_text, got, NULL), 0);
				if (!json_equal(got, json_object_get(want, "series"))) {
					char *a = json_dumps(got, JSON_COMPACT), *b = json_dumps(want, JSON_COMPACT);
					cr_assert_fail("round %d max %d from %lld: memo %.300s\nfull %.300s", round,
						       maxes[k], (long long)froms[f], a, b);
				}
				json_decref(got);
				json_decref(want);
			}
		}
	}
	tr_store_close(s);
}

/* max_raw bounds an undownsampled read; count_only reads no points. */
Test(metrics, undownsampled_reads_are_capped)
{
	tr_store_t *s = open_store(NULL);
	int64_t id = add_job(s, "a", 0);
	for (int i = 0; i < 1000; i++)
		cr_assert_eq(tr_store_metric_append(s, id, "loss", i, 0, 0, i, NULL), 0);
	cr_assert_eq(tr_store_flush(s, NULL), 0);
	struct tr_metrics_query q = {.to_step = INT64_MAX, .max_raw = 999};
	struct tr_error e = {0};
	cr_assert_null(tr_store_metrics_query(s, id, &q, &e));
	cr_assert_not_null(strstr(e.message, "\"loss\" has 1000 points"), "%s", e.message);
	q.from_step = 1;
	json_t *res = tr_store_metrics_query(s, id, &q, &e);
	cr_assert_not_null(res, "%s", e.message);
	cr_assert_eq(json_array_size(json_object_get(series_of(res, "loss"), "steps")), 999);
	json_decref(res);
	q.count_only = true;
	q.from_step = 0;
	q.max_raw = 0;
	res = tr_store_metrics_query(s, id, &q, NULL);
	cr_assert_eq(json_array_size(json_object_get(series_of(res, "loss"), "steps")), 0);
	json_decref(res);
	tr_store_close(s);
}

Test(metrics, downsample_matches_brute_force_1e5)
{
	tr_store_t *s = open_store(NULL);
	int64_t id = add_job(s, "a", 0);
	size_t n = 100000;
	struct bpt *pts = malloc(n * sizeof *pts);
	srand(7);
	int64_t step = 3;
	for (size_t i = 0; i < n; i++) {
		/* Gaps, repeated steps, ties, a few NaNs and infinities. */
		int r = rand() % 100;
		step += r < 70 ? 1 : r < 80 ? 0 : r < 97 ? rand() % 40 : 5000;
		double v = (rand() % 2000) / 100.0;
		if (rand() % 5000 == 0)
			v = NAN;
		else if (rand() % 7000 == 0)
			v = rand() % 2 ? INFINITY : -INFINITY;
		pts[i] = (struct bpt){step, v};
		cr_assert_eq(tr_store_metric_append(s, id, "m", step, 0, 0, v, NULL), 0);
		if (i % 25000 == 24999)
			cr_assert_eq(tr_store_flush(s, NULL), 0); /* rollups merge across flushes */
	}
	cr_assert_eq(tr_store_flush(s, NULL), 0);
	qsort(pts, n, sizeof *pts, cmp_bpt); /* steps were non-decreasing: a no-op, kept for clarity */
	int64_t last = pts[n - 1].step;
	int maxes[] = {1, 2, 3, 10, 100, 500, 999, 5000, 200000};
	for (size_t k = 0; k < sizeof maxes / sizeof maxes[0]; k++)
		check_against_brute(s, id, "m", pts, n, 0, INT64_MAX, maxes[k]);
	srand(11);
	for (int t = 0; t < 40; t++) {
		int64_t a = rand() % (last + 10) - 5, b = a + rand() % (last / (1 + rand() % 50) + 1);
		check_against_brute(s, id, "m", pts, n, a, b, 2 + rand() % 700);
	}
	free(pts);
	tr_store_close(s);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

Test(metrics, downsample_1e6_points_is_fast, .timeout = 300)
{
	tr_store_t *s = open_store(NULL);
	int64_t id = add_job(s, "a", 0);
	size_t n = 1000000;
	double t0 = now_ms();
	for (size_t i = 0; i < n; i++)
		cr_assert_eq(tr_store_metric_append(s, id, "loss", (int64_t)i, 0, 0, sin(i * 1e-4) + (i % 977) * 1e-3,
						    NULL),
			     0);
	cr_assert_eq(tr_store_flush(s, NULL), 0);
	double t_write = now_ms() - t0;
	const char *const loss[] = {"loss", NULL};
	struct tr_metrics_query q = {.names = loss, .to_step = INT64_MAX, .max_points = 500};
	double times[21];
	for (int r = 0; r < 22; r++) {
		double t = now_ms();
		json_t *res = tr_store_metrics_query(s, id, &q, NULL);
		double dt = now_ms() - t;
		cr_assert_not_null(res);
		size_t m = json_array_size(json_object_get(series_of(res, "loss"), "steps"));
		cr_assert(m > 250 && m <= 500, "%zu points", m);
		json_decref(res);
		if (r > 0)
			times[r - 1] = dt; /* the first run warms the page cache */
	}
	qsort(times, 21, sizeof times[0], cmp_double);
	/* Also a window in the middle, which cuts blocks at both ends. */
	q.from_step = 123457;
	q.to_step = 876543;
	double tw = now_ms();
	json_t *res = tr_store_metrics_query(s, id, &q, NULL);
	tw = now_ms() - tw;
	json_decref(res);
	cr_log_info("1e6 points: write+flush %.0f ms, downsample to 500: median %.2f ms (min %.2f, max %.2f),"
		    " window %.2f ms",
		    t_write, times[10], times[0], times[20], tw);
	fprintf(stderr,
		"[storage] 1e6 points: write+flush %.0f ms; downsample max_points=500 median %.2f ms (min %.2f, max "
		"%.2f); window query %.2f ms\n",
		t_write, times[10], times[0], times[20], tw);
	/* Generous: sanitizer builds run this too.  ThreadSanitizer checks
	 * every memory access of the query (5-15 times slower; about 190 ms
	 * measured on a loaded machine), so its bound is ten times this one. */
#ifdef __SANITIZE_THREAD__
	const double bound_ms = 1000.0;
#else
	const double bound_ms = 100.0;
#endif
	cr_assert_lt(times[10], bound_ms, "median %.2f ms", times[10]);
	tr_store_close(s);
}

Test(metrics, queue_full_drops_are_counted)
{
	struct tr_store_options o = {.metrics_queue_max = 10, .flush_interval_ms = 60000};
	tr_store_t *s = open_store(&o);
	int64_t a = add_job(s, "a", 0), b = add_job(s, "b", 0);
	int ok = 0, dropped = 0;
	for (int i = 0; i < 15; i++) {
		int rc = tr_store_metric_append(s, i < 12 ? a : b, "loss", i, 0, 0, i, NULL);
		if (rc == 0)
			ok++;
		else {
			cr_assert_eq(rc, -ENOBUFS);
			dropped++;
		}
	}
	cr_assert_eq(ok, 10);
	cr_assert_eq(dropped, 5);
	cr_assert_eq(tr_store_metric_drops(s, a), 2);
	cr_assert_eq(tr_store_metric_drops(s, b), 3);
	cr_assert_eq(tr_store_metric_drops(s, 0), 5);
	cr_assert_eq(tr_store_flush(s, NULL), 0);
	/* Room again after the flush. */
	cr_assert_eq(tr_store_metric_append(s, a, "loss", 100, 0, 0, 1, NULL), 0);
	cr_assert_eq(tr_store_flush(s, NULL), 0);
	cr_assert_eq(sql_int("SELECT count(*) FROM metrics"), 11);
	tr_store_close(s);
}

Test(metrics, points_of_a_deleted_job_are_dropped_silently)
{
	struct tr_store_options o = {.flush_interval_ms = 60000};
	tr_store_t *s = open_store(&o);
	int64_t a = add_job(s, "a", 0), b = add_job(s, "b", 0);
	for (int i = 0; i < 10; i++) {
		cr_assert_eq(tr_store_metric_append(s, a, "loss", i, 0, 0, i, NULL), 0);
		cr_assert_eq(tr_store_metric_append(s, b, "loss", i, 0, 0, i, NULL), 0);
		cr_assert_eq(tr_store_metric_append(s, 999, "loss", i, 0, 0, i, NULL), 0); /* never existed */
	}
	cr_assert_eq(tr_store_log_append(s, a, 3, "gone", NULL), 0);
	cr_assert_eq(tr_store_job_delete(s, a, NULL), 0);
	cr_assert_eq(tr_store_flush(s, NULL), 0);
	cr_assert_eq(sql_int("SELECT count(*) FROM metrics"), 10);
	cr_assert_eq(sql_int("SELECT count(*) FROM logs"), 0);
	cr_assert_eq(count_events(s, b, "metrics"), 1);
	cr_assert_eq(tr_store_integrity_check(s, NULL), 0);
	tr_store_close(s);
}

Test(metrics, truncate_replaces_replayed_steps)
{
	tr_store_t *s = open_store(NULL);
	int64_t id = add_job(s, "a", 0);
	size_t n = 0;
	struct bpt *pts = malloc(6000 * sizeof *pts);
	for (int i = 0; i < 3000; i++) {
		cr_assert_eq(tr_store_metric_append(s, id, "loss", i, 0, 0, cos(i * 0.37) * 10, NULL), 0);
		cr_assert_eq(tr_store_metric_append(s, id, "lr", i, 0, 0, i, NULL), 0);
	}
	/* Queued, not flushed: truncate must still remove them. */
	cr_assert_eq(tr_store_metrics_truncate(s, id, 1999, NULL), 0);
	for (int i = 0; i < 2000; i++)
		pts[n++] = (struct bpt){i, cos(i * 0.37) * 10};
	cr_assert_eq(sql_int("SELECT max(step) FROM metrics"), 1999);
	check_against_brute(s, id, "loss", pts, n, 0, INT64_MAX, 64);
	check_against_brute(s, id, "loss", pts, n, 0, INT64_MAX, 0);
	/* The resumed run writes the steps again, with other values. */
	for (int i = 2000; i < 5000; i++) {
		cr_assert_eq(tr_store_metric_append(s, id, "loss", i, 0, 0, sin(i * 0.11), NULL), 0);
		pts[n++] = (struct bpt){i, sin(i * 0.11)};
	}
	cr_assert_eq(tr_store_flush(s, NULL), 0);
	for (int m = 2; m < 400; m += 37)
		check_against_brute(s, id, "loss", pts, n, 0, INT64_MAX, m);
	check_against_brute(s, id, "loss", pts, n, 1500, 2500, 40);
	cr_assert_eq(tr_store_metrics_truncate(s, id, -1, NULL), 0);
	cr_assert_eq(sql_int("SELECT count(*) FROM metrics"), 0);
	cr_assert_eq(sql_int("SELECT count(*) FROM metrics_rollup"), 0);
	free(pts);
	tr_store_close(s);
}

/* Rows of metrics_rollup whose last point is not the raw last point of
 * their block (in step order, the latest written among equal steps), and
 * (*unknown) the rows that do not know theirs. */
static int64_t rollup_last_mismatches(int64_t *unknown)
{
#define BLOCK_LAST                                                                                                         \
	"(SELECT m.rowid FROM metrics m WHERE m.job_id = r.job_id AND m.name = r.name"                                     \
	" AND m.step BETWEEN r.block * (1 << (4 * r.level)) AND r.block * (1 << (4 * r.level)) + (1 << (4 * r.level)) - 1" \
	" ORDER BY m.step DESC, m.rowid DESC LIMIT 1)"
	*unknown = sql_int("SELECT count(*) FROM metrics_rollup WHERE last_step IS NULL");
	return sql_int("SELECT count(*) FROM metrics_rollup r WHERE r.last_step IS NOT NULL AND NOT EXISTS"
		       " (SELECT 1 FROM metrics m WHERE m.rowid = " BLOCK_LAST " AND m.step = r.last_step"
		       " AND m.epoch = r.last_epoch AND m.wall = r.last_wall AND m.value IS r.last_value)");
#undef BLOCK_LAST
}

/* Appends one point to the store and to the brute-force copy. */
static void put_pt(tr_store_t *s, int64_t id, struct bpt *pts, size_t *n, int64_t step, double value)
{
	cr_assert_eq(tr_store_metric_append(s, id, "m", step, step / 1000, 1e9 + (double)*n, value, NULL), 0);
	pts[(*n)++] = (struct bpt){step, value};
}

/* Sorts the brute-force copy by step, equal steps in the order written. */
static void sort_pts(struct bpt *pts, size_t n)
{
	for (size_t i = 1; i < n; i++) /* insertion sort: stable, and the copy is nearly sorted */
		for (size_t j = i; j > 0 && pts[j - 1].step > pts[j].step; j--) {
			struct bpt t = pts[j];
			pts[j] = pts[j - 1];
			pts[j - 1] = t;
		}
}

/* Every rollup row keeps its block's last point, through commits that cut
 * blocks anywhere, steps written again (the later write is the last),
 * points written below a block's last step, NaN, and truncation. */
Test(metrics, rollup_rows_keep_their_last_point)
{
	tr_store_t *s = open_store(NULL);
	int64_t id = add_job(s, "a", 0);
	struct bpt *pts = malloc(20000 * sizeof *pts);
	size_t n = 0;
	int64_t unknown;
	for (int64_t step = 0; step < 5000; step++) {
		put_pt(s, id, pts, &n, step, step == 777 ? NAN : sin(step * 0.05));
		if (step % 333 == 0)
			cr_assert_eq(tr_store_flush(s, NULL), 0);
	}
	cr_assert_eq(tr_store_flush(s, NULL), 0);
	/* Steps written again in later commits (as a pushed series may), and
	 * points below blocks' last steps. */
	for (int64_t step = 15; step < 5000; step += 256) {
		put_pt(s, id, pts, &n, step, 1000.0 + step);
		put_pt(s, id, pts, &n, step - 7, -1000.0 - step);
		cr_assert_eq(tr_store_flush(s, NULL), 0);
	}
	cr_assert_eq(rollup_last_mismatches(&unknown), 0);
	cr_assert_eq(unknown, 0);
	sort_pts(pts, n);
	check_against_brute(s, id, "m", pts, n, 0, INT64_MAX, 50);
	check_against_brute(s, id, "m", pts, n, 100, 4000, 7);

	/* A resumed run cuts inside blocks of every level. */
	cr_assert_eq(tr_store_metrics_truncate(s, id, 4100, NULL), 0);
	while (n && pts[n - 1].step > 4100)
		n--;
	cr_assert_eq(rollup_last_mismatches(&unknown), 0);
	for (int64_t step = 4101; step < 9000; step++)
		put_pt(s, id, pts, &n, step, cos(step * 0.01));
	cr_assert_eq(tr_store_flush(s, NULL), 0);
	cr_assert_eq(rollup_last_mismatches(&unknown), 0);
	cr_assert_eq(unknown, 0);
	check_against_brute(s, id, "m", pts, n, 0, INT64_MAX, 100);
	free(pts);
	tr_store_close(s);
}

/* Incremental polls of a fast job's series (a dashboard's: from_step past
 * the last step seen, a few points for many new steps) are downsampled
 * from the rollup exactly as the contract says: the first and last
 * points kept, each bucket's envelope (a spike in the middle of a bucket
 * survives), also when the poll starts or ends just before, at or after
 * a block boundary of any rollup level. */
Test(metrics, incremental_polls_downsample_from_the_rollup, .timeout = 300)
{
	tr_store_t *s = open_store(NULL);
	int64_t id = add_job(s, "a", 0);
	size_t cap = 70000;
	struct bpt *pts = malloc(cap * sizeof *pts);
	size_t n = 0;
	for (int64_t step = 0; step < (int64_t)cap; step++) {
		double v = 2 * exp(-step / 20000.0) + 0.01 * sin(step * 0.3);
		if (step == 65540 || step == 4100 || step == 300)
			v = 50; /* spikes inside buckets of a poll */
		if (step == 65534)
			v = -50;
		put_pt(s, id, pts, &n, step, v);
		if (step % 5003 == 0)
			cr_assert_eq(tr_store_flush(s, NULL), 0);
	}
	cr_assert_eq(tr_store_flush(s, NULL), 0);

	/* The spike at 65540 and the dip at 65534 in a 16-point poll of the
	 * last 4,470 steps, which straddles a 65,536-step block; the poll ends
	 * at the newest step. */
	const char *const names[] = {"m", NULL};
	struct tr_metrics_query q = {.names = names, .from_step = 65530, .to_step = INT64_MAX, .max_points = 16};
	json_t *res = tr_store_metrics_query(s, id, &q, NULL);
	json_t *ser = series_of(res, "m"), *steps = json_object_get(ser, "steps");
	size_t k = json_array_size(steps);
	cr_assert(json_is_true(json_object_get(ser, "downsampled")));
	cr_assert(k >= 2 && k <= 16);
	cr_assert_eq(json_integer_value(json_array_get(steps, 0)), 65530);
	cr_assert_eq(json_integer_value(json_array_get(steps, k - 1)), (int64_t)cap - 1, "the newest step is kept");
	bool spike = false, dip = false;
	for (size_t i = 0; i < k; i++) {
		spike |= num_at(json_object_get(ser, "max"), i) == 50;
		dip |= num_at(json_object_get(ser, "min"), i) == -50;
	}
	cr_assert(spike && dip, "the envelope lost the spike or the dip");
	json_decref(res);

	int64_t froms[] = {1,    15,   16,   17,   255,  256,   257,   299,   301,   4095,
			   4096, 4097, 4101, 8191, 8192, 60000, 65535, 65536, 65537, 69990};
	int maxes[] = {2, 3, 16, 17, 200};
	for (size_t i = 0; i < sizeof froms / sizeof *froms; i++)
		for (size_t j = 0; j < sizeof maxes / sizeof *maxes; j++)
			check_against_brute(s, id, "m", pts, n, froms[i], INT64_MAX, maxes[j]);
	/* Bounded polls ending around boundaries too. */
	int64_t tos[] = {4095, 4096, 4097, 65535, 65536, 65537};
	for (size_t i = 0; i < sizeof tos / sizeof *tos; i++) {
		check_against_brute(s, id, "m", pts, n, 17, tos[i], 16);
		check_against_brute(s, id, "m", pts, n, tos[i] - 3000, tos[i], 200);
	}
	free(pts);
	tr_store_close(s);
}

/* Rollup rows written before the rollup kept last points (NULL there)
 * still give the contract's answer, by a seek into the raw points, also
 * after new points merge into them. */
Test(metrics, rollup_rows_without_a_last_point_are_read_from_the_points)
{
	tr_store_t *s = open_store(NULL);
	int64_t id = add_job(s, "a", 0);
	struct bpt *pts = malloc(12000 * sizeof *pts);
	size_t n = 0;
	int64_t unknown;
	for (int64_t step = 0; step < 10000; step++)
		put_pt(s, id, pts, &n, step, step % 1000 == 500 ? 9.0 : cos(step * 0.02));
	cr_assert_eq(tr_store_flush(s, NULL), 0);
	sqlite3 *db;
	cr_assert_eq(sqlite3_open(db_path, &db), SQLITE_OK);
	cr_assert_eq(sqlite3_exec(db,
				  "UPDATE metrics_rollup SET last_step = NULL, last_epoch = NULL, last_wall = NULL,"
				  " last_value = NULL WHERE block % 3 = 0",
				  NULL, NULL, NULL),
		     SQLITE_OK, "%s", sqlite3_errmsg(db));
	sqlite3_close(db);
	cr_assert_gt(rollup_last_mismatches(&unknown) + unknown, 0);
	check_against_brute(s, id, "m", pts, n, 0, INT64_MAX, 100);
	check_against_brute(s, id, "m", pts, n, 4000, INT64_MAX, 16);
	check_against_brute(s, id, "m", pts, n, 1, 9000, 300);
	/* New points into those blocks, and past them. */
	for (int64_t step = 9990; step < 11000; step++)
		put_pt(s, id, pts, &n, step, sin(step * 0.7));
	cr_assert_eq(tr_store_flush(s, NULL), 0);
	sort_pts(pts, n);
	cr_assert_eq(rollup_last_mismatches(&unknown), 0, "a row merged with one that did not know its last point");
	check_against_brute(s, id, "m", pts, n, 0, INT64_MAX, 100);
	check_against_brute(s, id, "m", pts, n, 9000, INT64_MAX, 16);
	free(pts);
	tr_store_close(s);
}

/* ---- events -------------------------------------------------------------------- */

/* Every job's event stream opens with its "queued" state, written with the
 * job: checks that and returns its id, to read what follows. */
static int64_t queued_event_id(tr_store_t *s, int64_t job)
{
	struct tr_event *ev;
	int n;
	cr_assert_eq(tr_store_events_after(s, job, 0, 1, &ev, &n, NULL), 0);
	cr_assert_eq(n, 1);
	cr_assert_str_eq(ev[0].type, "state");
	cr_assert_str_eq(ev[0].data, "{\"state\":\"queued\",\"error\":null,\"terminal\":false}");
	int64_t id = ev[0].id;
	tr_events_free(ev, n);
	return id;
}

/* A filtered read returns only the wanted types and says how far it
 * looked, so a reader waiting for a state change does not read the same
 * metrics events again on every commit. */
Test(events, filtered_read_skips_types_and_reports_scanned_to)
{
	struct tr_store_options o = {.flush_interval_ms = 60000};
	tr_store_t *s = open_store(&o);
	int64_t a = add_job(s, "a", 0), first = queued_event_id(s, a);
	for (int f = 0; f < 3; f++) {
		cr_assert_eq(tr_store_metric_append(s, a, "loss", f, 0, 1.5, 1, NULL), 0);
		cr_assert_eq(tr_store_flush(s, NULL), 0);
	}
	struct tr_event *ev;
	int n;
	int64_t scanned = -1;
	cr_assert_eq(tr_store_events_read(s, a, first, 0, 0, TR_EVENT_STATE, &ev, &n, &scanned, NULL), 0);
	cr_assert_eq(n, 0, "%d events, all of them metrics", n);
	int64_t last = tr_store_last_event_id(s);
	cr_assert_eq(scanned, last, "scanned to %lld, the newest event is %lld", (long long)scanned, (long long)last);
	tr_events_free(ev, n);
	/* Metrics events leave the newest other event where it was, and do
	 * not end a wait for the other types. */
	cr_assert_eq(tr_store_last_other_event_id(s), first);
	cr_assert_eq(tr_store_wait_events(s, a, first, 2000), 1);
	cr_assert_eq(tr_store_wait_events_types(s, a, first, TR_EVENT_STATE | TR_EVENT_LOG, 100), 0,
		     "a wait for state and log events ended on metrics events");

	cr_assert_eq(tr_store_job_set_state(s, a, TR_JOB_RUNNING, NULL, NULL, NULL), 0);
	cr_assert_eq(tr_store_metric_append(s, a, "loss", 9, 0, 1.5, 1, NULL), 0);
	cr_assert_eq(tr_store_flush(s, NULL), 0);
	cr_assert_eq(tr_store_events_read(s, a, scanned, 0, 0, TR_EVENT_STATE, &ev, &n, &scanned, NULL), 0);
	cr_assert_eq(n, 1);
	cr_assert_str_eq(ev[0].type, "state");
	cr_assert_eq(tr_store_last_other_event_id(s), ev[0].id, "the state event is the newest other one");
	cr_assert_eq(scanned, tr_store_last_event_id(s), "past the metrics event after the state change");
	tr_events_free(ev, n);

	/* Unfiltered and limited reads say the last id returned. */
	cr_assert_eq(tr_store_events_read(s, a, first, 2, 0, TR_EVENT_ALL, &ev, &n, &scanned, NULL), 0);
	cr_assert_eq(n, 2);
	cr_assert_eq(scanned, ev[1].id);
	tr_events_free(ev, n);
	cr_assert_eq(tr_store_events_read(s, a, first, 1, 0, TR_EVENT_METRICS, &ev, &n, &scanned, NULL), 0);
	cr_assert_eq(n, 1);
	cr_assert_str_eq(ev[0].type, "metrics");
	cr_assert_eq(scanned, ev[0].id, "a read cut by its limit looked no further than its last event");
	tr_events_free(ev, n);
	tr_store_close(s);
}

Test(events, paging_and_metrics_exactly_once)
{
	/* Only forced flushes, so that each one makes exactly one event. */
	struct tr_store_options o = {.flush_interval_ms = 60000};
	tr_store_t *s = open_store(&o);
	int64_t a = add_job(s, "a", 0), b = add_job(s, "b", 0);
	int per_flush = 7, flushes = 5;
	for (int f = 0; f < flushes; f++) {
		for (int i = 0; i < per_flush; i++) {
			int step = f * per_flush + i;
			cr_assert_eq(tr_store_metric_append(s, a, "loss", step, 0, 1.5, step * 0.25, NULL), 0);
			cr_assert_eq(tr_store_metric_append(s, a, "acc", step, 0, 1.5, 1, NULL), 0);
			cr_assert_eq(tr_store_metric_append(s, b, "loss", step, 0, 1.5, 9, NULL), 0);
		}
		cr_assert_eq(tr_store_flush(s, NULL), 0);
		cr_assert_eq(tr_store_job_set_state(s, a, f % 2 ? TR_JOB_PAUSED : TR_JOB_RUNNING, NULL, NULL, NULL), 0);
	}
	/* Pages of 2, resuming from the last id seen, as an SSE client would. */
	int64_t after = 0;
	int metrics_events = 0, state_events = 0, loss_points = 0, acc_points = 0;
	bool seen[35] = {0};
	for (;;) {
		struct tr_event *ev;
		int n;
		cr_assert_eq(tr_store_events_after(s, a, after, 2, &ev, &n, NULL), 0);
		for (int i = 0; i < n; i++) {
			cr_assert_gt(ev[i].id, after);
			after = ev[i].id;
			cr_assert_eq(ev[i].job_id, a);
			if (strcmp(ev[i].type, "state") == 0) {
				state_events++;
				continue;
			}
			cr_assert_str_eq(ev[i].type, "metrics");
			metrics_events++;
			json_t *d = json_loads(ev[i].data, 0, NULL);
			cr_assert_not_null(d, "%s", ev[i].data);
			size_t k;
			json_t *p;
			json_array_foreach(json_object_get(d, "points"), k, p) {
				const char *name = json_string_value(json_object_get(p, "name"));
				int64_t step = json_integer_value(json_object_get(p, "step"));
				cr_assert_eq(json_number_value(json_object_get(p, "wall")), 1.5);
				cr_assert_not_null(json_object_get(p, "epoch"));
				if (strcmp(name, "loss") == 0) {
					cr_assert_not(seen[step], "step %lld twice", (long long)step);
					seen[step] = true;
					cr_assert_eq(json_number_value(json_object_get(p, "value")), step * 0.25);
					loss_points++;
				} else {
					acc_points++;
				}
			}
			json_decref(d);
		}
		tr_events_free(ev, n);
		if (n < 2)
			break;
	}
	cr_assert_eq(metrics_events, flushes, "one metrics event per flush per job");
	cr_assert_eq(state_events, flushes + 1, "one per state change, and \"queued\" first");
	cr_assert_eq(loss_points, flushes * per_flush);
	cr_assert_eq(acc_points, flushes * per_flush);
	cr_assert_eq(count_events(s, b, "metrics"), (size_t)flushes);

	/* job 0: every job's events. */
	struct tr_event *ev;
	int n;
	cr_assert_eq(tr_store_events_after(s, 0, 0, 0, &ev, &n, NULL), 0);
	cr_assert_eq(n, 3 * flushes + 2);
	cr_assert_eq(ev[n - 1].id, tr_store_last_event_id(s));
	tr_events_free(ev, n);
	tr_store_close(s);
}

Test(events, large_flush_is_split_but_complete)
{
	struct tr_store_options o = {.flush_interval_ms = 60000};
	tr_store_t *s = open_store(&o);
	int64_t id = add_job(s, "a", 0);
	/* Two transactions (50,000 + 10,000); events of <= 10,000 points and
	 * about 64 KiB of text at most, for the memory of event streams. */
	int n = 60000;
	for (int i = 0; i < n; i++)
		cr_assert_eq(tr_store_metric_append(s, id, "loss", i, 0, 0, i, NULL), 0);
	cr_assert_eq(tr_store_flush(s, NULL), 0);
	struct tr_event *ev;
	int ne;
	cr_assert_eq(tr_store_events_after(s, id, queued_event_id(s, id), 0, &ev, &ne, NULL), 0);
	cr_assert_geq(ne, 6);
	bool *seen = calloc((size_t)n, 1);
	int total = 0;
	for (int i = 0; i < ne; i++) {
		json_t *d = json_loads(ev[i].data, 0, NULL);
		json_t *pts = json_object_get(d, "points");
		cr_assert_leq(json_array_size(pts), 10000);
		cr_assert_leq(strlen(ev[i].data), 64 * 1024 + 256, "event %d has %zu bytes", i, strlen(ev[i].data));
		size_t k;
		json_t *p;
		json_array_foreach(pts, k, p) {
			int64_t step = json_integer_value(json_object_get(p, "step"));
			cr_assert_not(seen[step]);
			seen[step] = true;
			total++;
		}
		json_decref(d);
	}
	cr_assert_eq(total, n);
	free(seen);
	tr_events_free(ev, ne);

	/* A byte budget stops before the event that would pass it, but
	 * always returns one. */
	int64_t after = queued_event_id(s, id);
	cr_assert_eq(tr_store_events_after_max(s, id, after, 0, 100000, &ev, &ne, NULL), 0);
	size_t bytes = 0;
	for (int i = 0; i < ne; i++)
		bytes += strlen(ev[i].data);
	cr_assert_geq(ne, 1);
	cr_assert_leq(bytes, 100000, "%d events, %zu bytes", ne, bytes);
	tr_events_free(ev, ne);
	cr_assert_eq(tr_store_events_after_max(s, id, after, 0, 10, &ev, &ne, NULL), 0);
	cr_assert_eq(ne, 1, "an event larger than the budget still comes alone");
	tr_events_free(ev, ne);
	tr_store_close(s);
}

struct waiter {
	tr_store_t *s;
	int64_t job, after;
	int timeout_ms, result;
	double waited_ms;
	atomic_int started;
};

static void *wait_main(void *arg)
{
	struct waiter *w = arg;
	atomic_store(&w->started, 1);
	double t = now_ms();
	w->result = tr_store_wait_events(w->s, w->job, w->after, w->timeout_ms);
	w->waited_ms = now_ms() - t;
	return NULL;
}

static void start_waiter(struct waiter *w, pthread_t *th)
{
	cr_assert_eq(pthread_create(th, NULL, wait_main, w), 0);
	while (!atomic_load(&w->started))
		usleep(1000);
	usleep(50000); /* let it block */
}

Test(events, wait_wakes_on_flush_timeout_and_wake_all)
{
	struct tr_store_options o = {.flush_interval_ms = 60000};
	tr_store_t *s = open_store(&o);
	int64_t a = add_job(s, "a", 0), b = add_job(s, "b", 0);

	/* A flush of job a's points wakes a waiter on job a. */
	struct waiter w = {.s = s, .job = a, .after = tr_store_last_event_id(s), .timeout_ms = 10000};
	pthread_t th;
	start_waiter(&w, &th);
	cr_assert_eq(tr_store_metric_append(s, a, "loss", 1, 0, 0, 1, NULL), 0);
	cr_assert_eq(tr_store_flush(s, NULL), 0);
	pthread_join(th, NULL);
	cr_assert_eq(w.result, 1);
	cr_assert_lt(w.waited_ms, 5000);

	/* Events of another job do not end the wait; the timeout does. */
	w = (struct waiter){.s = s, .job = a, .after = tr_store_last_event_id(s), .timeout_ms = 400};
	start_waiter(&w, &th);
	cr_assert_eq(tr_store_job_set_state(s, b, TR_JOB_RUNNING, NULL, NULL, NULL), 0);
	pthread_join(th, NULL);
	cr_assert_eq(w.result, 0);
	cr_assert_geq(w.waited_ms, 350);

	/* Any job (0): the state change is enough. */
	w = (struct waiter){.s = s, .job = 0, .after = tr_store_last_event_id(s), .timeout_ms = 10000};
	start_waiter(&w, &th);
	cr_assert_eq(tr_store_job_set_state(s, b, TR_JOB_PAUSED, NULL, NULL, NULL), 0);
	pthread_join(th, NULL);
	cr_assert_eq(w.result, 1);

	/* Something already there: no wait at all. */
	cr_assert_eq(tr_store_wait_events(s, a, 0, 10000), 1);

	w = (struct waiter){.s = s, .job = a, .after = tr_store_last_event_id(s), .timeout_ms = -1};
	start_waiter(&w, &th);
	tr_store_wake_all(s);
	pthread_join(th, NULL);
	cr_assert_eq(w.result, 0);
	tr_store_close(s);
}

/* ---- logs ---------------------------------------------------------------------- */

Test(logs, query_and_events)
{
	tr_store_t *s = open_store(NULL);
	int64_t id = add_job(s, "a", 0);
	for (int i = 0; i < 10; i++) {
		char msg[64];
		snprintf(msg, sizeof msg, "line %d with \"quotes\"\tand a tab and a long tail to go off-struct", i);
		cr_assert_eq(tr_store_log_append(s, id, i % 8, msg, NULL), 0);
	}
	cr_assert_eq(tr_store_log_append(s, id, 6, "bad \xff byte", NULL), 0);
	cr_assert_eq(tr_store_log_append(s, id, 8, "x", NULL), -EINVAL);
	cr_assert_eq(tr_store_flush(s, NULL), 0);

	json_t *all = tr_store_logs_query(s, id, 0, 0, NULL);
	cr_assert_eq(json_array_size(all), 11);
	json_t *l3 = json_array_get(all, 3);
	cr_assert_eq(json_integer_value(json_object_get(l3, "level")), 3);
	cr_assert_not_null(strstr(json_string_value(json_object_get(l3, "message")), "line 3 with \"quotes\"\t"));
	/* RFC 3339, like every time in the API (core/rfc3339.h). */
	double when = 0;
	cr_assert(tr_rfc3339_parse(json_string_value(json_object_get(l3, "time")), &when), "time: %s",
		  json_string_value(json_object_get(l3, "time")));
	cr_assert_gt(when, 1.6e9);
	cr_assert_str_eq(json_string_value(json_object_get(json_array_get(all, 10), "message")), "bad ? byte");
	int64_t after = json_integer_value(json_object_get(json_array_get(all, 4), "id"));
	json_t *page = tr_store_logs_query(s, id, after, 3, NULL);
	cr_assert_eq(json_array_size(page), 3);
	cr_assert_eq(json_integer_value(json_object_get(json_array_get(page, 0), "id")),
		     json_integer_value(json_object_get(json_array_get(all, 5), "id")));
	json_decref(page);

	/* One "log" event per line, with the same object as the query. */
	struct tr_event *ev;
	int n;
	cr_assert_eq(tr_store_events_after(s, id, queued_event_id(s, id), 0, &ev, &n, NULL), 0);
	cr_assert_eq(n, 11);
	for (int i = 0; i < n; i++) {
		cr_assert_str_eq(ev[i].type, "log");
		json_t *d = json_loads(ev[i].data, 0, NULL);
		cr_assert_not_null(d, "%s", ev[i].data);
		cr_assert(json_equal(d, json_array_get(all, (size_t)i)), "%s", ev[i].data);
		json_decref(d);
	}
	tr_events_free(ev, n);
	json_decref(all);
	tr_store_close(s);
}

/* ---- store --------------------------------------------------------------------- */

Test(store, integrity_check)
{
	tr_store_t *s = open_store(NULL);
	int64_t id = add_job(s, "a", 0);
	for (int i = 0; i < 1000; i++)
		tr_store_metric_append(s, id, "loss", i, 0, 0, i, NULL);
	cr_assert_eq(tr_store_flush(s, NULL), 0);
	cr_assert_eq(tr_store_integrity_check(s, NULL), 0);
	tr_store_close(s);
}

static void *fail_main(void *arg)
{
	tr_store_t *s = arg;
	struct tr_job_row r;
	for (int i = 0; i < 200; i++) {
		struct tr_error e = {0};
		cr_assert_eq(tr_store_job_get(s, 424242, &r, &e), -ENOENT);
		cr_assert_not_null(strstr(e.message, "424242"), "%s", e.message);
	}
	return NULL;
}

Test(store, error_message_is_per_call)
{
	tr_store_t *s = open_store(NULL);
	pthread_t th;
	pthread_create(&th, NULL, fail_main, s);
	for (int i = 0; i < 200; i++) {
		struct tr_error e = {0};
		cr_assert_eq(tr_store_job_set_state(s, 1717, TR_JOB_RUNNING, NULL, NULL, &e), -ENOENT);
		cr_assert_not_null(strstr(e.message, "1717"), "%s", e.message);
	}
	pthread_join(th, NULL);
	tr_store_close(s);
}

struct flush_arg {
	tr_store_t *s;
	int rc;
};

static void *flush_main(void *arg)
{
	struct flush_arg *f = arg;
	f->rc = tr_store_flush(f->s, NULL);
	return NULL;
}

struct worker {
	tr_store_t *s;
	int64_t job;
	int index, points;
	atomic_int *stop;
	int queries;
};

static void *append_main(void *arg)
{
	struct worker *w = arg;
	char name[16];
	snprintf(name, sizeof name, "m%d", w->index);
	for (int i = 0; i < w->points; i++) {
		int rc = tr_store_metric_append(w->s, w->job, name, i, 0, 0, i % 100, NULL);
		cr_assert(rc == 0 || rc == -ENOBUFS);
		if (i % 1000 == 0)
			tr_store_log_append(w->s, w->job, 6, "progress", NULL);
		if (i % 5000 == 0)
			tr_store_job_set_progress(w->s, w->job, i, w->points, 0, i, NULL);
	}
	return NULL;
}

static void *query_main(void *arg)
{
	struct worker *w = arg;
	int64_t after = 0;
	while (!atomic_load(w->stop)) {
		struct tr_metrics_query q = {.to_step = INT64_MAX, .max_points = 100, .with_times = true};
		json_t *res = tr_store_metrics_query(w->s, w->job, &q, NULL);
		cr_assert_not_null(res);
		json_t *v;
		const char *k;
		json_object_foreach(json_object_get(res, "series"), k, v)
			cr_assert_leq(json_array_size(json_object_get(v, "steps")), 100);
		json_decref(res);
		struct tr_event *ev;
		int n;
		cr_assert_eq(tr_store_events_after(w->s, w->job, after, 50, &ev, &n, NULL), 0);
		for (int i = 0; i < n; i++) {
			cr_assert_gt(ev[i].id, after, "events come once, in order");
			after = ev[i].id;
		}
		tr_events_free(ev, n);
		struct tr_job_row r;
		cr_assert_eq(tr_store_job_get(w->s, w->job, &r, NULL), 0);
		tr_job_row_finish(&r);
		w->queries++;
	}
	return NULL;
}

Test(store, concurrent_appends_and_queries, .timeout = 300)
{
	struct tr_store_options o = {.flush_interval_ms = 20};
	tr_store_t *s = open_store(&o);
	int64_t a = add_job(s, "a", 0), b = add_job(s, "b", 0);
	atomic_int stop = 0;
	struct worker ws[6];
	pthread_t th[6];
	for (int i = 0; i < 6; i++) {
		ws[i] = (struct worker){.s = s, .job = i % 2 ? b : a, .index = i, .points = 20000, .stop = &stop};
		cr_assert_eq(pthread_create(&th[i], NULL, i < 4 ? append_main : query_main, &ws[i]), 0);
	}
	for (int i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	cr_assert_eq(tr_store_flush(s, NULL), 0);
	atomic_store(&stop, 1);
	for (int i = 4; i < 6; i++)
		pthread_join(th[i], NULL);
	cr_assert_gt(ws[4].queries + ws[5].queries, 0);
	int64_t drops = tr_store_metric_drops(s, 0);
	/* Log lines share the queue. */
	cr_assert_eq(sql_int("SELECT count(*) FROM metrics") + sql_int("SELECT count(*) FROM logs") + drops,
		     4 * 20000 + 4 * 20, "drops %lld", (long long)drops);
	cr_assert_eq(tr_store_integrity_check(s, NULL), 0);
	/* Every point shows up in exactly one metrics event. */
	int64_t in_events = 0;
	for (int64_t job = a; job <= b; job++) {
		struct tr_event *ev;
		int n;
		cr_assert_eq(tr_store_events_after(s, job, 0, 0, &ev, &n, NULL), 0);
		for (int i = 0; i < n; i++) {
			if (strcmp(ev[i].type, "metrics"))
				continue;
			json_t *d = json_loads(ev[i].data, 0, NULL);
			in_events += (int64_t)json_array_size(json_object_get(d, "points"));
			json_decref(d);
		}
		tr_events_free(ev, n);
	}
	cr_assert_eq(in_events, sql_int("SELECT count(*) FROM metrics"));
	tr_store_close(s);
}

Test(store, writer_outlasts_a_long_write_lock)
{
	struct tr_store_options o = {.flush_interval_ms = 60000};
	tr_store_t *s = open_store(&o);
	int64_t id = add_job(s, "a", 0);
	/* Another connection holds the write lock past the 5 s busy timeout. */
	sqlite3 *db;
	cr_assert_eq(sqlite3_open(db_path, &db), SQLITE_OK);
	cr_assert_eq(sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
	for (int i = 0; i < 100; i++)
		cr_assert_eq(tr_store_metric_append(s, id, "loss", i, 0, 0, i, NULL), 0);
	struct flush_arg wf = {s, -1};
	pthread_t th;
	double t0 = now_ms();
	cr_assert_eq(pthread_create(&th, NULL, flush_main, &wf), 0);
	sleep(7);
	sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
	sqlite3_close(db);
	pthread_join(th, NULL);
	cr_assert_eq(wf.rc, 0);
	cr_assert_geq(now_ms() - t0, 7000);
	cr_assert_eq(sql_int("SELECT count(*) FROM metrics"), 100);
	cr_assert_eq(tr_store_metric_drops(s, 0), 0);
	tr_store_close(s);
}

Test(store, close_flushes_the_queue)
{
	struct tr_store_options o = {.flush_interval_ms = 60000};
	tr_store_t *s = open_store(&o);
	int64_t id = add_job(s, "a", 0);
	for (int i = 0; i < 500; i++)
		cr_assert_eq(tr_store_metric_append(s, id, "loss", i, 0, 0, i, NULL), 0);
	tr_store_close(s);
	cr_assert_eq(sql_int("SELECT count(*) FROM metrics"), 500);
}

/* ---- data generations ------------------------------------------------------------ */

/* Response caches keep an answer while its job's generation holds: it must
 * change after each of that job's commits and stay put for other jobs'. */
Test(events, job_data_generation_is_per_job)
{
	tr_store_t *s = open_store(NULL);
	int64_t a = add_job(s, "a", 0), b = add_job(s, "b", 0);
	uint64_t ga = tr_store_job_data_generation(s, a), gb = tr_store_job_data_generation(s, b);
	uint64_t all = tr_store_data_generation(s);

	/* b trains: its points, logs and state move b and the store, not a. */
	for (int step = 0; step < 5; step++) {
		cr_assert_eq(tr_store_metric_append(s, b, "loss", step, 0, 0, 1.0, NULL), 0);
		cr_assert_eq(tr_store_flush(s, NULL), 0);
		uint64_t g = tr_store_job_data_generation(s, b);
		cr_assert_gt(g, gb, "b's flush %d left b's generation", step);
		gb = g;
	}
	cr_assert_eq(tr_store_log_append(s, b, 6, "hello", NULL), 0);
	cr_assert_eq(tr_store_flush(s, NULL), 0);
	cr_assert_gt(tr_store_job_data_generation(s, b), gb);
	gb = tr_store_job_data_generation(s, b);
	cr_assert_eq(tr_store_job_set_state(s, b, TR_JOB_RUNNING, NULL, NULL, NULL), 0);
	cr_assert_gt(tr_store_job_data_generation(s, b), gb);
	cr_assert_gt(tr_store_data_generation(s), all);
	cr_assert_eq(tr_store_job_data_generation(s, a), ga, "b's commits changed a's generation");

	/* a's own changes, truncation included. */
	cr_assert_eq(tr_store_metric_append(s, a, "loss", 1, 0, 0, 1.0, NULL), 0);
	cr_assert_eq(tr_store_flush(s, NULL), 0);
	cr_assert_gt(tr_store_job_data_generation(s, a), ga);
	ga = tr_store_job_data_generation(s, a);
	gb = tr_store_job_data_generation(s, b);
	cr_assert_eq(tr_store_metrics_truncate(s, a, 0, NULL), 0);
	cr_assert_gt(tr_store_job_data_generation(s, a), ga);
	cr_assert_eq(tr_store_job_data_generation(s, b), gb);

	/* Nothing committed, nothing changes: flushing an empty queue. */
	ga = tr_store_job_data_generation(s, a);
	cr_assert_eq(tr_store_flush(s, NULL), 0);
	cr_assert_eq(tr_store_job_data_generation(s, a), ga);

	/* A deletion moves every job (it is not tied to one answer). */
	cr_assert_eq(tr_store_job_delete(s, b, NULL), 0);
	cr_assert_gt(tr_store_job_data_generation(s, a), ga);
	tr_store_close(s);
}

/* Jobs whose ids share a slot of the generation table push each other out
 * of it: an evicted job's generation must still change with its commits
 * and never go back. */
Test(events, job_data_generation_survives_eviction, .timeout = 120)
{
	tr_store_t *s = open_store(NULL);
	int64_t first = add_job(s, "first", 0), other = 0;
	for (int i = 0; i < 1024; i++)
		other = add_job(s, "filler", 0);
	cr_assert_eq(other - first, 1024, "ids are not consecutive");

	uint64_t gf = tr_store_job_data_generation(s, first), go = tr_store_job_data_generation(s, other);
	for (int round = 0; round < 4; round++) {
		int64_t j = round % 2 ? other : first;
		cr_assert_eq(tr_store_metric_append(s, j, "loss", round, 0, 0, 1.0, NULL), 0);
		cr_assert_eq(tr_store_flush(s, NULL), 0);
		uint64_t nf = tr_store_job_data_generation(s, first), no = tr_store_job_data_generation(s, other);
		cr_assert_geq(nf, gf, "first went back in round %d", round);
		cr_assert_geq(no, go, "other went back in round %d", round);
		if (j == first)
			cr_assert_gt(nf, gf, "first's commit left its generation in round %d", round);
		else
			cr_assert_gt(no, go, "other's commit left its generation in round %d", round);
		gf = nf;
		go = no;
	}
	tr_store_close(s);
}

/* Report tokens (migration 14): only a hash is kept, one per job, found
 * by job and by hash, cleared when the job ends and gone with its job. */
Test(jobs, report_token_hashes)
{
	tr_store_t *s = open_store(NULL);
	int64_t a = add_job(s, "a", 0), b = add_job(s, "b", 0), found = 0;
	char ha[65] = "", hb[65] = "", got[65];
	memset(ha, 'a', 64);
	memset(hb, 'b', 64);
	cr_assert_eq(tr_store_job_token_hash_of(s, a, got, NULL), -ENOENT);
	cr_assert_eq(tr_store_job_token_set(s, a, ha, NULL), 0);
	cr_assert_eq(tr_store_job_token_set(s, b, hb, NULL), 0);
	cr_assert_eq(tr_store_job_token_hash_of(s, a, got, NULL), 0);
	cr_assert_str_eq(got, ha);
	cr_assert_eq(tr_store_job_token_job_of(s, hb, &found, NULL), 0);
	cr_assert_eq(found, b);
	cr_assert_eq(tr_store_job_token_set(s, 999, ha, NULL), -ENOENT, "no token for a job that is not there");
	cr_assert_eq(tr_store_job_token_clear(s, a, NULL), 0);
	cr_assert_eq(tr_store_job_token_job_of(s, ha, &found, NULL), -ENOENT, "a cleared token finds no job");
	cr_assert_eq(tr_store_job_token_clear(s, a, NULL), 0, "clearing twice is no error");
	cr_assert_eq(tr_store_job_delete(s, b, NULL), 0);
	cr_assert_eq(tr_store_job_token_job_of(s, hb, &found, NULL), -ENOENT, "gone with its job");
	tr_store_close(s);
}
