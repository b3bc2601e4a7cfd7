/* Storage that refuses writes (a full disk, a size cap, a read-only state
 * directory): job state changes that happened are held in order and shown
 * by every query, metric points and log lines are held rather than
 * dropped, health reports the failure, and all of it is written once
 * storage works, or saved beside the database at close and written at the
 * next open.  The failures come from the store's test-only fault switch
 * (TRAINERD_TEST_STORE_FAULT, storage/fault.c), which works for root too,
 * and from the real size cap (max_bytes). */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "storage/checkpoints.h"
#include "storage/store.h"

static char dir[64], db_path[128], fault_path[128], side_path[160];

static void setup(void)
{
	snprintf(dir, sizeof dir, "/tmp/trfault-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	snprintf(db_path, sizeof db_path, "%s/state.db", dir);
	snprintf(fault_path, sizeof fault_path, "%s/fault", dir);
	snprintf(side_path, sizeof side_path, "%s-unrecorded-states", db_path);
	/* Read at the first open in this (forked) test process. */
	setenv("TRAINERD_TEST_STORE_FAULT", fault_path, 1);
}

static void teardown(void)
{
	const char *suffix[] = {"", "-wal", "-shm", "-unrecorded-states"};
	char p[200];
	for (int i = 0; i < 4; i++) {
		snprintf(p, sizeof p, "%s%s", db_path, suffix[i]);
		unlink(p);
	}
	unlink(fault_path);
	snprintf(p, sizeof p, "%s-checkpoints", db_path);
	rmdir(p);
	rmdir(dir);
}

TestSuite(faults, .init = setup, .fini = teardown, .timeout = 60);

static void fault(const char *kind)
{
	if (!kind) {
		cr_assert(unlink(fault_path) == 0 || errno == ENOENT);
		return;
	}
	FILE *f = fopen(fault_path, "w");
	cr_assert_not_null(f);
	fputs(kind, f);
	fclose(f);
}

static tr_store_t *open_store(const struct tr_store_options *opts)
{
	tr_store_t *s = NULL;
	struct tr_error err = {0};
	int rc = tr_store_open(db_path, opts, &s, &err);
	cr_assert_eq(rc, 0, "open: %d %s", rc, err.message);
	return s;
}

static int64_t add_job(tr_store_t *s)
{
	struct tr_job_row r = {.name = "j", .spec = "{\"epochs\":1}"};
	struct tr_error e = {0};
	cr_assert_eq(tr_store_job_insert(s, &r, NULL, &e), 0, "insert: %s", e.message);
	return r.id;
}

static void get(tr_store_t *s, int64_t id, char *state, size_t len, bool *pending)
{
	struct tr_job_row r;
	struct tr_error e = {0};
	cr_assert_eq(tr_store_job_get(s, id, &r, &e), 0, "%s", e.message);
	snprintf(state, len, "%s", tr_job_state_name(r.state));
	*pending = r.state_pending;
	tr_job_row_finish(&r);
}

/* The state the database file itself holds, read without the store. */
static void db_state(int64_t id, char *state, size_t len)
{
	sqlite3 *db = NULL;
	cr_assert_eq(sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
	sqlite3_stmt *st = NULL;
	cr_assert_eq(sqlite3_prepare_v2(db, "SELECT state FROM jobs WHERE id = ?1", -1, &st, NULL), SQLITE_OK);
	sqlite3_bind_int64(st, 1, id);
	state[0] = '\0';
	if (sqlite3_step(st) == SQLITE_ROW)
		snprintf(state, len, "%s", (const char *)sqlite3_column_text(st, 0));
	sqlite3_finalize(st);
	sqlite3_close(db);
}

/* Waits (bounded) for the held changes to be written. */
static void wait_written(tr_store_t *s)
{
	for (int i = 0; i < 100 && tr_store_job_states_pending(s) > 0; i++)
		usleep(50000);
	cr_assert_eq(tr_store_job_states_pending(s), 0, "held state changes were not written");
}

static bool in_list(struct tr_job_row *rows, int n, int64_t id)
{
	bool found = false;
	for (int i = 0; i < n; i++) {
		found |= rows[i].id == id;
		tr_job_row_finish(&rows[i]);
	}
	free(rows);
	return found;
}

Test(faults, cancel_held_shown_kept_from_queue_and_written_after_recovery)
{
	tr_store_t *s = open_store(NULL);
	int64_t id = add_job(s), other = add_job(s);
	cr_assert_eq(tr_store_job_set_state(s, id, TR_JOB_RUNNING, NULL, "[0]", NULL), 0);
	char msg[1024];
	cr_assert_eq(tr_store_health(s, msg, sizeof msg), 0);

	fault("full");
	struct tr_error e = {0};
	int rc = tr_store_job_record_state(s, id, TR_JOB_CANCELLED, "{\"code\":\"cancelled\",\"message\":\"m\"}", NULL,
					   &e);
	cr_assert_eq(rc, 1, "record_state: %d %s", rc, e.message);
	cr_assert_not_null(strstr(e.message, "full"), "why it is held: %s", e.message);
	cr_assert_eq(tr_store_job_states_pending(s), 1);
	/* Cancelling a queued job is held the same way. */
	cr_assert_eq(tr_store_job_record_state(s, other, TR_JOB_CANCELLED, NULL, NULL, NULL), 1);

	char state[32];
	bool pending;
	get(s, id, state, sizeof state, &pending);
	cr_assert_str_eq(state, "cancelled");
	cr_assert(pending);
	struct tr_job_row r;
	cr_assert_eq(tr_store_job_get(s, id, &r, NULL), 0);
	cr_assert(r.finished_at > 0, "a held terminal state is shown finished");
	cr_assert_not_null(r.error);
	cr_assert_not_null(strstr(r.error, "cancelled"));
	cr_assert_str_eq(r.devices, "[0]");
	tr_job_row_finish(&r);
	db_state(id, state, sizeof state);
	cr_assert_str_eq(state, "running", "the database already has it");

	/* The scheduler's scans and the API's filtered lists agree with it. */
	static const enum tr_job_state live[] = {TR_JOB_QUEUED, TR_JOB_RUNNING, TR_JOB_STOPPING, TR_JOB_INTERRUPTED};
	static const enum tr_job_state cancelled = TR_JOB_CANCELLED, running = TR_JOB_RUNNING;
	struct tr_job_row *rows;
	int n;
	cr_assert_eq(tr_store_job_list_states(s, live, 4, &rows, &n, NULL), 0);
	cr_assert_not(in_list(rows, n, id), "a held cancel must keep the job from being started again");
	cr_assert_eq(tr_store_job_list_states(s, live, 4, &rows, &n, NULL), 0);
	cr_assert_not(in_list(rows, n, other));
	cr_assert_eq(tr_store_job_list(s, &cancelled, 0, 10, &rows, &n, NULL), 0);
	cr_assert_eq(n, 2, "%d cancelled jobs listed", n);
	cr_assert(in_list(rows, n, id));
	cr_assert_eq(tr_store_job_list(s, &running, 0, 10, &rows, &n, NULL), 0);
	cr_assert_eq(n, 0);
	free(rows);

	/* Health says why, while it lasts. */
	rc = tr_store_health(s, msg, sizeof msg);
	cr_assert_eq(rc, -ENOSPC, "health %d: %s", rc, msg);
	cr_assert_not_null(strstr(msg, "full"), "%s", msg);

	fault(NULL);
	wait_written(s);
	get(s, id, state, sizeof state, &pending);
	cr_assert_str_eq(state, "cancelled");
	cr_assert_not(pending);
	db_state(id, state, sizeof state);
	cr_assert_str_eq(state, "cancelled");
	db_state(other, state, sizeof state);
	cr_assert_str_eq(state, "cancelled");
	cr_assert_eq(tr_store_health(s, msg, sizeof msg), 0, "%s", msg);

	/* Its state event was written with it. */
	struct tr_event *ev;
	int ne;
	cr_assert_eq(tr_store_events_after(s, id, 0, 0, &ev, &ne, NULL), 0);
	cr_assert_not_null(strstr(ev[ne - 1].data, "\"cancelled\""), "%s", ev[ne - 1].data);
	tr_events_free(ev, ne);
	tr_store_close(s);
}

Test(faults, held_changes_are_written_in_order_and_direct_writes_wait_for_them)
{
	tr_store_t *s = open_store(NULL);
	int64_t id = add_job(s);
	cr_assert_eq(tr_store_job_set_state(s, id, TR_JOB_RUNNING, NULL, NULL, NULL), 0);
	fault("readonly");
	cr_assert_eq(tr_store_job_record_state(s, id, TR_JOB_STOPPING, NULL, NULL, NULL), 1);
	cr_assert_eq(tr_store_job_record_state(s, id, TR_JOB_COMPLETED, NULL, NULL, NULL), 1);
	/* A direct write cannot overtake them: it fails as they do. */
	struct tr_error e = {0};
	int rc = tr_store_job_set_state(s, id, TR_JOB_FAILED, NULL, NULL, &e);
	cr_assert_eq(rc, -EROFS, "set_state: %d %s", rc, e.message);
	char msg[512];
	cr_assert_eq(tr_store_health(s, msg, sizeof msg), -EROFS, "%s", msg);
	fault(NULL);
	wait_written(s);
	struct tr_event *ev;
	int ne;
	cr_assert_eq(tr_store_events_after(s, id, 0, 0, &ev, &ne, NULL), 0);
	cr_assert_eq(ne, 4, "%d events", ne);
	cr_assert_not_null(strstr(ev[1].data, "\"running\""));
	cr_assert_not_null(strstr(ev[2].data, "\"stopping\""));
	cr_assert_not_null(strstr(ev[3].data, "\"completed\""));
	tr_events_free(ev, ne);
	tr_store_close(s);
}

Test(faults, metrics_and_logs_are_held_not_dropped)
{
	tr_store_t *s = open_store(NULL);
	int64_t id = add_job(s);
	fault("ioerr");
	for (int i = 0; i < 100; i++)
		cr_assert_eq(tr_store_metric_append(s, id, "loss", i, 0, 0, 1.0 / (i + 1), NULL), 0);
	cr_assert_eq(tr_store_log_append(s, id, 6, "while the disk was full", NULL), 0);
	int rc = tr_store_flush(s, NULL);
	cr_assert_lt(rc, 0, "flush while storage fails must say so");
	cr_assert_eq(tr_store_metric_drops(s, id), 0, "points were dropped");
	char msg[512];
	cr_assert_lt(tr_store_health(s, msg, sizeof msg), 0);
	/* More points arrive while it fails; order is kept. */
	for (int i = 100; i < 150; i++)
		cr_assert_eq(tr_store_metric_append(s, id, "loss", i, 0, 0, 1.0 / (i + 1), NULL), 0);

	fault(NULL);
	cr_assert_eq(tr_store_flush(s, NULL), 0);
	struct tr_metrics_query q = {.to_step = INT64_MAX};
	json_t *r = tr_store_metrics_query(s, id, &q, NULL);
	json_t *steps = json_object_get(json_object_get(json_object_get(r, "series"), "loss"), "steps");
	cr_assert_eq(json_array_size(steps), 150, "%zu points stored", json_array_size(steps));
	for (size_t i = 0; i < 150; i++)
		cr_assert_eq(json_integer_value(json_array_get(steps, i)), (json_int_t)i);
	json_decref(r);
	json_t *logs = tr_store_logs_query(s, id, 0, 0, NULL);
	char *text = json_dumps(logs, 0);
	cr_assert_not_null(strstr(text, "while the disk was full"), "%s", text);
	free(text);
	json_decref(logs);
	cr_assert_eq(tr_store_metric_drops(s, id), 0);
	cr_assert_eq(tr_store_health(s, msg, sizeof msg), 0, "%s", msg);
	tr_store_close(s);
}

Test(faults, held_points_are_bounded_by_the_queue)
{
	struct tr_store_options o = {.metrics_queue_max = 64};
	tr_store_t *s = open_store(&o);
	int64_t id = add_job(s);
	fault("full");
	int accepted = 0, refused = 0;
	for (int i = 0; i < 200; i++) {
		if (tr_store_metric_append(s, id, "loss", i, 0, 0, 1, NULL) == 0)
			accepted++;
		else
			refused++;
		if (i % 20 == 0)
			tr_store_flush(s, NULL); /* the writer tries, fails, holds */
	}
	cr_assert_leq(accepted, 64, "%d points held past the bound", accepted);
	cr_assert_eq(tr_store_metric_drops(s, id), refused);
	fault(NULL);
	cr_assert_eq(tr_store_flush(s, NULL), 0);
	struct tr_metrics_query q = {.to_step = INT64_MAX};
	json_t *r = tr_store_metrics_query(s, id, &q, NULL);
	json_t *steps = json_object_get(json_object_get(json_object_get(r, "series"), "loss"), "steps");
	cr_assert_eq((int)json_array_size(steps), accepted);
	json_decref(r);
	tr_store_close(s);
}

Test(faults, health_recovers_without_other_writes)
{
	tr_store_t *s = open_store(NULL);
	fault("full");
	/* A failed insert (a submit) is the only write. */
	struct tr_job_row r = {.name = "j", .spec = "{}"};
	struct tr_error e = {0};
	cr_assert_eq(tr_store_job_insert(s, &r, NULL, &e), -ENOSPC, "%s", e.message);
	cr_assert_lt(tr_store_health(s, NULL, 0), 0);
	fault(NULL);
	int rc = -1;
	for (int i = 0; i < 100 && (rc = tr_store_health(s, NULL, 0)) != 0; i++)
		usleep(50000);
	cr_assert_eq(rc, 0, "health did not recover: the writer must probe");
	tr_store_close(s);
}

Test(faults, held_cancel_survives_close_and_is_written_at_the_next_open)
{
	tr_store_t *s = open_store(NULL);
	int64_t id = add_job(s);
	cr_assert_eq(tr_store_job_set_state(s, id, TR_JOB_RUNNING, NULL, NULL, NULL), 0);
	fault("full");
	cr_assert_eq(tr_store_job_record_state(s, id, TR_JOB_CANCELLED, NULL, NULL, NULL), 1);
	char msg[512];
	int n = tr_store_job_states_save(s, msg, sizeof msg);
	cr_assert_eq(n, 1, "save: %d %s", n, msg);
	cr_assert_not_null(strstr(msg, "saved to"), "%s", msg);
	tr_store_close(s);
	struct stat sb;
	cr_assert_eq(stat(side_path, &sb), 0, "no side file");

	/* Still failing at the next open: shown, kept from the queue. */
	s = open_store(NULL);
	char state[32];
	bool pending;
	get(s, id, state, sizeof state, &pending);
	cr_assert_str_eq(state, "cancelled");
	cr_assert(pending);
	static const enum tr_job_state stale[] = {TR_JOB_RUNNING, TR_JOB_STOPPING, TR_JOB_INTERRUPTED};
	struct tr_job_row *rows;
	int nr;
	cr_assert_eq(tr_store_job_list_states(s, stale, 3, &rows, &nr, NULL), 0);
	cr_assert_not(in_list(rows, nr, id), "the restart scan would queue the cancelled job again");
	tr_store_close(s);

	/* Storage works again: the next open writes it and deletes the file. */
	fault(NULL);
	s = open_store(NULL);
	cr_assert_eq(tr_store_job_states_pending(s), 0);
	get(s, id, state, sizeof state, &pending);
	cr_assert_str_eq(state, "cancelled");
	cr_assert_not(pending);
	cr_assert_neq(stat(side_path, &sb), 0, "the side file outlived its changes");
	tr_store_close(s);
	db_state(id, state, sizeof state);
	cr_assert_str_eq(state, "cancelled");
}

/* The side file is read back as text: a state it names that the store
 * does not know refuses the open, naming the file, the line and the
 * state, instead of writing the name into the database. */
Test(faults, side_file_with_an_unknown_state_is_refused)
{
	tr_store_t *s = open_store(NULL);
	int64_t id = add_job(s);
	tr_store_close(s);
	FILE *f = fopen(side_path, "w");
	cr_assert_not_null(f);
	fprintf(f, "{\"job\": %lld, \"state\": \"sleeping\", \"at\": 1.5}\n", (long long)id);
	fclose(f);

	struct tr_error e = {0};
	int rc = tr_store_open(db_path, NULL, &s, &e);
	cr_assert_eq(rc, -EINVAL, "open: %d %s", rc, e.message);
	cr_assert_not_null(strstr(e.message, "-unrecorded-states:1: not a state change: unknown state \"sleeping\""),
			   "%s", e.message);
	char state[32];
	db_state(id, state, sizeof state);
	cr_assert_str_eq(state, "queued");
}

Test(faults, side_file_is_deleted_once_the_writer_writes_its_changes)
{
	tr_store_t *s = open_store(NULL);
	int64_t id = add_job(s);
	fault("full");
	cr_assert_eq(tr_store_job_record_state(s, id, TR_JOB_CANCELLED, NULL, NULL, NULL), 1);
	tr_store_close(s); /* saves by itself */
	s = open_store(NULL);
	cr_assert_eq(tr_store_job_states_pending(s), 1);
	fault(NULL);
	wait_written(s);
	struct stat sb;
	cr_assert_neq(stat(side_path, &sb), 0, "the side file outlived its changes");
	tr_store_close(s);
	char state[32];
	db_state(id, state, sizeof state);
	cr_assert_str_eq(state, "cancelled");
}

/* The real thing: the size cap (SQLITE_FULL), freed by deleting a job. */
Test(faults, size_cap_full_then_freed_by_a_delete)
{
	tr_store_t *s = open_store(NULL);
	int64_t big = add_job(s), id = add_job(s);
	cr_assert_eq(tr_store_job_set_state(s, id, TR_JOB_RUNNING, NULL, NULL, NULL), 0);
	tr_store_close(s);
	struct stat sb;
	cr_assert_eq(stat(db_path, &sb), 0);
	/* Room for some points, not many: the cap is reached mid-way. */
	struct tr_store_options o = {.max_bytes = sb.st_size + (1 << 20)};
	s = open_store(&o);
	int rc = 0;
	struct tr_error e = {0};
	for (int round = 0; round < 200 && rc == 0; round++) {
		for (int i = 0; i < 2000; i++)
			tr_store_metric_append(s, big, "filler", round * 2000 + i, 0, 0, i, NULL);
		rc = tr_store_flush(s, &e);
	}
	cr_assert_eq(rc, -ENOSPC, "the cap was never reached: %d %s", rc, e.message);
	cr_assert_lt(tr_store_health(s, NULL, 0), 0);
	/* A small write may still fit under the cap, or be held. */
	rc = tr_store_job_record_state(s, id, TR_JOB_CANCELLED, NULL, NULL, &e);
	cr_assert(rc == 0 || rc == 1, "%d %s", rc, e.message);
	cr_assert_lt(tr_store_health(s, NULL, 0), 0, "points are still held: storage still fails");
	/* The held filler points are the big job's: deleting it frees its
	 * pages and lets them go (they are skipped: their job is gone). */
	rc = tr_store_job_delete(s, big, &e);
	cr_assert_eq(rc, 0, "delete on a full database: %d %s", rc, e.message);
	wait_written(s);
	char state[32];
	bool pending;
	get(s, id, state, sizeof state, &pending);
	cr_assert_str_eq(state, "cancelled");
	cr_assert_not(pending);
	cr_assert_eq(tr_store_flush(s, NULL), 0);
	cr_assert_eq(tr_store_health(s, NULL, 0), 0);
	tr_store_close(s);
}

/* Even the side file cannot be written (here its name is taken by a
 * directory, which fails for root too): the caller is told which changes
 * are lost, so the daemon's log can name them. */
Test(faults, lost_changes_are_named_when_the_side_file_cannot_be_written)
{
	tr_store_t *s = open_store(NULL);
	int64_t id = add_job(s);
	fault("readonly");
	cr_assert_eq(tr_store_job_record_state(s, id, TR_JOB_CANCELLED, NULL, NULL, NULL), 1);
	cr_assert_eq(mkdir(side_path, 0700), 0);
	char msg[512], want[64];
	int rc = tr_store_job_states_save(s, msg, sizeof msg);
	cr_assert_lt(rc, 0, "save: %d %s", rc, msg);
	snprintf(want, sizeof want, "job %lld cancelled", (long long)id);
	cr_assert_not_null(strstr(msg, want), "%s", msg);
	cr_assert_not_null(strstr(msg, "lost"), "%s", msg);
	/* and why: the side file's own failure */
	cr_assert_not_null(strstr(msg, side_path), "%s", msg);
	tr_store_close(s);
	rmdir(side_path);
}

/* A store function reports a failed write through the caller's struct
 * tr_error (docs/design.md, "Errors"): the SQLite message with where it
 * failed, leaving another call's struct alone; storage health keeps its
 * own copy. */
Test(faults, store_function_reports_through_callers_struct)
{
	tr_store_t *s = open_store(NULL);
	int64_t id = add_job(s);
	/* An earlier call's struct, which the next failure must not touch. */
	tr_ckpt_writer_t *w;
	struct tr_error earlier = {0};
	cr_assert_eq(tr_store_ckpt_begin(s, id + 100, 1, 0, NULL, &w, &earlier), -ENOENT);
	cr_assert_not_null(strstr(earlier.message, "does not exist"), "%s", earlier.message);

	fault("full");
	struct tr_error e = {0};
	int rc = tr_store_job_info_merge(s, id, "{\"a\":\"b\"}", 8, &e);
	cr_assert_eq(rc, -ENOSPC, "%d %s", rc, e.message);
	cr_assert_eq(strncmp(e.message, "storage/", 8), 0, "%s", e.message); /* file:line: what: why */
	cr_assert_not_null(strstr(e.message, "full"), "%s", e.message);
	cr_assert_not_null(strstr(earlier.message, "does not exist"), "another call's struct changed: %s",
			   earlier.message);
	char msg[1024];
	cr_assert_eq(tr_store_health(s, msg, sizeof msg), -ENOSPC);
	cr_assert_not_null(strstr(msg, e.message), "%s", msg);

	/* A check made on the connection fills the struct as well. */
	fault(NULL);
	struct tr_error nf = {0};
	cr_assert_eq(tr_store_job_info_merge(s, 777, "{}", 8, &nf), -ENOENT);
	cr_assert_str_eq(nf.message, "job 777 not found");
	cr_assert_eq(tr_store_job_result_get(s, id, &(char *){NULL}, &nf), -ENOENT);
	tr_store_close(s);
}

/* A checkpoint-store failure arrives in the caller's struct tr_error, each
 * call's in its own (docs/design.md, "Errors"): a begin that cannot
 * insert its row, a chunk write that fails (and stays failed for the
 * later write and the commit, each told again), and a delete. */
Test(faults, checkpoint_failures_fill_the_callers_struct)
{
	tr_store_t *s = open_store(NULL);
	int64_t id = add_job(s);
	char want[96];
	snprintf(want, sizeof want, "checkpoint of job %lld at step 5: the database is full (", (long long)id);

	fault("full");
	tr_ckpt_writer_t *w = NULL;
	struct tr_error be = {0};
	int rc = tr_store_ckpt_begin(s, id, 5, 0, NULL, &w, &be);
	cr_assert_eq(rc, -ENOSPC, "%d %s", rc, be.message);
	cr_assert_null(w);
	cr_assert_eq(strncmp(be.message, want, strlen(want)), 0, "%s", be.message);
	cr_assert_not_null(strstr(be.message, "storage/"), "the SQLite failure and where: %s", be.message);

	fault(NULL);
	struct tr_error ok = {0};
	cr_assert_eq(tr_store_ckpt_begin(s, id, 5, 0, NULL, &w, &ok), 0, "%s", ok.message);
	fault("full");
	size_t n = (size_t)4 << 20; /* one whole chunk: written at once */
	unsigned char *data = calloc(1, n);
	cr_assert_not_null(data);
	struct tr_error we = {0}, again = {0}, ce = {0};
	rc = tr_store_ckpt_write(w, data, n, &we);
	cr_assert_eq(rc, -ENOSPC, "%d %s", rc, we.message);
	cr_assert_eq(strncmp(we.message, want, strlen(want)), 0, "%s", we.message);
	cr_assert_not_null(strstr(we.message, "earlier checkpoints are intact"), "%s", we.message);
	cr_assert_eq(tr_store_ckpt_write(w, data, 1, &again), -ENOSPC);
	cr_assert_str_eq(again.message, we.message);
	cr_assert_eq(tr_store_ckpt_commit(w, NULL, 0, 0, 0, 1, NULL, &ce), -ENOSPC);
	cr_assert_str_eq(ce.message, we.message);
	cr_assert_eq(ok.message[0], '\0', "the successful begin's struct was written: %s", ok.message);
	free(data);

	/* A delete on read-only storage: the write's failure, as it happened. */
	fault(NULL);
	cr_assert_eq(tr_store_ckpt_begin(s, id, 6, 0, NULL, &w, &ok), 0, "%s", ok.message);
	cr_assert_eq(tr_store_ckpt_write(w, "abc", 3, &ok), 0, "%s", ok.message);
	struct tr_ckpt_row row = {0};
	cr_assert_eq(tr_store_ckpt_commit(w, NULL, 0, 0, 0, 1, &row, &ok), 0, "%s", ok.message);
	fault("readonly");
	struct tr_error de = {0};
	rc = tr_store_ckpt_delete(s, row.id, &de);
	cr_assert_eq(rc, -EROFS, "%d %s", rc, de.message);
	cr_assert_eq(strncmp(de.message, "storage/", 8), 0, "%s", de.message);
	cr_assert_not_null(strstr(de.message, "readonly"), "%s", de.message);
	fault(NULL);
	struct tr_error ge = {0};
	cr_assert_eq(tr_store_ckpt_get(s, id, 6, &row, &ge), 0, "the checkpoint stays: %s", ge.message);
	tr_ckpt_row_finish(&row);
	cr_assert_eq(tr_store_ckpt_get(s, id, 7, &row, &ge), -ENOENT);
	snprintf(want, sizeof want, "job %lld has no checkpoint at step 7", (long long)id);
	cr_assert_str_eq(ge.message, want);
	tr_store_close(s);
}

/* Under the size cap, the room for a checkpoint file is what the state
 * holds, not how far the WAL has grown since its last reset: it grows
 * with every commit (time, not data), and was counted as it stood, so a
 * checkpoint that fits failed once the daemon had run long enough.  Here
 * the WAL holds more than the room left beside the checkpoint. */
Test(faults, checkpoint_room_under_the_cap_does_not_count_a_grown_wal)
{
	tr_store_t *s = open_store(NULL);
	int64_t id = add_job(s);
	tr_store_close(s);
	struct stat sb;
	cr_assert_eq(stat(db_path, &sb), 0);
	const size_t ckpt = (size_t)2 << 20;
	struct tr_store_options o = {.max_bytes = sb.st_size + (int64_t)ckpt + (1 << 20)};
	s = open_store(&o);
	/* Small commits that rewrite the same pages: the WAL grows, the
	 * database does not. */
	char wal[160], fields[64];
	snprintf(wal, sizeof wal, "%s-wal", db_path);
	struct stat ws = {0};
	for (int i = 0; i < 20000 && (stat(wal, &ws) != 0 || ws.st_size < (off_t)(2 << 20)); i++) {
		snprintf(fields, sizeof fields, "{\"phase\":\"p%d\"}", i);
		struct tr_error e = {0};
		cr_assert_eq(tr_store_job_info_merge(s, id, fields, 8, &e), 0, "%s", e.message);
	}
	cr_assert_geq(ws.st_size, (off_t)(2 << 20), "the WAL holds %lld bytes", (long long)ws.st_size);

	tr_ckpt_writer_t *w = NULL;
	struct tr_error e = {0};
	cr_assert_eq(tr_store_ckpt_begin(s, id, 5, 0, NULL, &w, &e), 0, "%s", e.message);
	unsigned char *data = calloc(1, ckpt);
	cr_assert_not_null(data);
	int rc = tr_store_ckpt_write(w, data, ckpt, &e);
	if (rc == 0)
		rc = tr_store_ckpt_commit(w, NULL, 0, 0, 0, 1, NULL, &e);
	else
		tr_store_ckpt_abort(w);
	free(data);
	cr_assert_eq(rc, 0, "a %zu-byte checkpoint under a cap %lld bytes above the database: %d %s", ckpt,
		     (long long)(o.max_bytes - sb.st_size), rc, e.message);
	struct tr_ckpt_row row = {0};
	cr_assert_eq(tr_store_ckpt_get(s, id, 5, &row, &e), 0, "%s", e.message);
	cr_assert_eq(row.bytes, (int64_t)ckpt);
	tr_ckpt_row_finish(&row);
	tr_store_close(s);
}
