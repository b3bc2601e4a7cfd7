/* Info fields of a job (store.h, tr_store_job_info_merge): a JSON object
 * of short strings in jobs.info, merged with SQLite's json_patch inside one
 * write transaction, so concurrent writers (the API and the job's runner)
 * never lose each other's keys and the key limit holds after every merge. */
#include "storage/internal.h"

#include <errno.h>

static const char sql_count[] = "SELECT (SELECT count(*) FROM json_each(json_patch(info, ?2))) FROM jobs WHERE id = ?1";
static const char sql_merge[] = "UPDATE jobs SET info = json_patch(info, ?2) WHERE id = ?1";

int tr_store_job_info_merge(tr_store_t *s, int64_t id, const char *fields_json, int max_keys, struct tr_error *e)
{
	struct conn *c = tr_store_conn_lend(s, e);
	int err = tr_store_begin(c, true);
	if (err < 0)
		goto cleanup;
	sqlite3_stmt *st = tr_store_stmt(c, sql_count);
	if (!st) {
		err = -EIO;
		goto rollback;
	}
	sqlite3_bind_int64(st, 1, id);
	sqlite3_bind_text(st, 2, fields_json, -1, SQLITE_STATIC);
	int rc = sqlite3_step(st);
	int64_t keys = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
	sqlite3_reset(st);
	if (rc == SQLITE_DONE) {
		err = tr_store_cfail(c, -ENOENT, "job %lld not found", (long long)id);
		goto rollback;
	}
	if (rc != SQLITE_ROW) {
		err = SQLFAIL(c, rc, "count info fields");
		goto rollback;
	}
	if (keys > max_keys) {
		err = tr_store_cfail(c, -E2BIG, "job %lld would have %lld info fields, at most %d are kept",
				     (long long)id, (long long)keys, max_keys);
		goto rollback;
	}
	st = tr_store_stmt(c, sql_merge);
	if (!st) {
		err = -EIO;
		goto rollback;
	}
	sqlite3_bind_int64(st, 1, id);
	sqlite3_bind_text(st, 2, fields_json, -1, SQLITE_STATIC);
	rc = sqlite3_step(st);
	sqlite3_reset(st);
	if (rc != SQLITE_DONE) {
		err = SQLFAIL(c, rc, "merge info fields");
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
