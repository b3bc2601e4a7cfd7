/* Unit tests of storage/experiment_counts.c: experiments counted by state
 * (zeros for states none is in, a state change moves one), and a state
 * the store does not know refused with its name and the known ones.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "storage/store.h"

static char dir[64], db_path[128];
static tr_store_t *store;

static void setup(void)
{
	struct tr_error e = {0};

	snprintf(dir, sizeof dir, "/tmp/trexpc-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	snprintf(db_path, sizeof db_path, "%s/state.db", dir);
	cr_assert_eq(tr_store_open(db_path, NULL, &store, &e), 0, "%s", e.message);
}

static void teardown(void)
{
	const char *suffix[] = {"", "-wal", "-shm"};
	char p[160];

	tr_store_close(store);
	for (int i = 0; i < 3; i++) {
		snprintf(p, sizeof p, "%s%s", db_path, suffix[i]);
		unlink(p);
	}
	rmdir(dir);
}

TestSuite(experiment_counts, .init = setup, .fini = teardown, .timeout = 30);

static int64_t add(enum tr_experiment_state state)
{
	struct tr_experiment_row row = {.name = "x", .state = state, .request = "{}"};
	struct tr_error e = {0};

	cr_assert_eq(tr_store_experiment_insert(store, &row, &e), 0, "%s", e.message);
	return row.id;
}

Test(experiment_counts, by_state)
{
	int64_t counts[TR_EXP_NSTATES];
	struct tr_error e = {0};
	int64_t moved;

	cr_assert_eq(tr_store_experiment_counts(store, counts, &e), 0, "%s", e.message);
	for (int i = 0; i < TR_EXP_NSTATES; i++)
		cr_assert_eq(counts[i], 0, "an empty store: %s", tr_experiment_state_name((enum tr_experiment_state)i));
	add(TR_EXP_QUEUED);
	moved = add(TR_EXP_RUNNING);
	add(TR_EXP_RUNNING);
	add(TR_EXP_COMPLETED);
	cr_assert_eq(tr_store_experiment_set_state(store, moved, TR_EXP_CANCELLED, NULL, &e), 0, "%s", e.message);
	cr_assert_eq(tr_store_experiment_counts(store, counts, &e), 0, "%s", e.message);
	const int64_t want[TR_EXP_NSTATES] = {
		[TR_EXP_QUEUED] = 1, [TR_EXP_RUNNING] = 1, [TR_EXP_COMPLETED] = 1, [TR_EXP_CANCELLED] = 1};
	for (int i = 0; i < TR_EXP_NSTATES; i++)
		cr_assert_eq(counts[i], want[i], "%s: %lld, want %lld",
			     tr_experiment_state_name((enum tr_experiment_state)i), (long long)counts[i],
			     (long long)want[i]);
}

Test(experiment_counts, an_unknown_state_is_named)
{
	int64_t counts[TR_EXP_NSTATES];
	struct tr_error e = {0};
	sqlite3 *db;

	add(TR_EXP_RUNNING);
	cr_assert_eq(sqlite3_open(db_path, &db), SQLITE_OK);
	cr_assert_eq(sqlite3_exec(db, "UPDATE experiments SET state = 'sideways'", NULL, NULL, NULL), SQLITE_OK);
	sqlite3_close(db);
	cr_assert_eq(tr_store_experiment_counts(store, counts, &e), -EBADMSG);
	cr_assert(strstr(e.message, "\"sideways\"") && strstr(e.message, "queued"), "%s", e.message);
}
