/* Experiments by state, for GET /metrics (trainerd_experiments): one
 * GROUP BY over the experiments table, as tr_store_job_counts does for
 * jobs, so a scrape does not read every experiment's request.
 */
#include "storage/internal.h"

#include <errno.h>

int tr_store_experiment_counts(tr_store_t *s, int64_t counts[TR_EXP_NSTATES], struct tr_error *e)
{
	for (int i = 0; i < TR_EXP_NSTATES; i++)
		counts[i] = 0;
	struct conn *c = tr_store_conn_lend(s, e);
	int err = 0, rc;
	sqlite3_stmt *st = tr_store_stmt(c, "SELECT state, COUNT(*) FROM experiments GROUP BY state");
	if (!st) {
		err = -EIO;
		goto cleanup;
	}
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		const char *name = (const char *)sqlite3_column_text(st, 0);
		int state = tr_experiment_state_parse(name);
		if (state < 0) {
			err = tr_store_cfail(
				c, -EBADMSG,
				"%lld experiment(s) have an unknown state \"%s\" in the state database (not one of %s)",
				(long long)sqlite3_column_int64(st, 1), name ? name : "(null)",
				tr_experiment_state_list());
			sqlite3_reset(st);
			goto cleanup;
		}
		counts[state] = sqlite3_column_int64(st, 1);
	}
	sqlite3_reset(st);
	if (rc != SQLITE_DONE)
		err = SQLFAIL(c, rc, "SELECT experiment counts");
cleanup:
	tr_store_conn_put(s, c);
	return err;
}
