/* One write to a job's own data (internal.h, tr_store_job_write): a
 * statement that names the job by ?1 and takes one text as ?2, run in a
 * write transaction on a connection lent with the caller's struct
 * tr_error, after an optional check in the same transaction.  The info
 * fields (info.c) and an evaluate job's result (results.c) are written
 * this way.
 */
#include "storage/internal.h"

#include <errno.h>

int tr_store_job_write(tr_store_t *s, int64_t id, const struct job_write *w, struct tr_error *e)
{
	struct conn *c = tr_store_conn_lend(s, e);
	int err = tr_store_begin(c, true);
	if (err < 0)
		goto cleanup;
	if (w->check && (err = w->check(c, id, w)) < 0)
		goto rollback;
	sqlite3_stmt *st = tr_store_stmt(c, w->sql);
	if (!st) {
		err = -EIO;
		goto rollback;
	}
	sqlite3_bind_int64(st, 1, id);
	sqlite3_bind_text(st, 2, w->text, -1, SQLITE_STATIC);
	int rc = sqlite3_step(st);
	sqlite3_reset(st);
	if (rc != SQLITE_DONE) {
		/* A row that refers to the job (job_id REFERENCES jobs) cannot
		 * be written once the job is gone. */
		err = rc == SQLITE_CONSTRAINT_FOREIGNKEY
			      ? tr_store_cfail(c, -ENOENT, "job %lld not found", (long long)id)
			      : SQLFAIL(c, rc, w->what);
		goto rollback;
	}
	err = tr_store_commit(c);
	if (err == 0)
		tr_store_job_data_changed(s, id);
	goto cleanup;
rollback:
	tr_store_rollback(c);
cleanup:
	tr_store_conn_put(s, c);
	return err;
}
