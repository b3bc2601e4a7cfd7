/* The result of an evaluate job (store.h, tr_store_job_result_set): one
 * JSON object per job in job_results, deleted with its job. */
#include "storage/internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char sql_set[] = "INSERT OR REPLACE INTO job_results (job_id, result) VALUES (?1, ?2)";
static const char sql_get[] = "SELECT result FROM job_results WHERE job_id = ?1";

int tr_store_job_result_set(tr_store_t *s, int64_t id, const char *result_json, struct tr_error *e)
{
	const struct job_write w = {.sql = sql_set, .text = result_json, .what = "store a job's result"};
	return tr_store_job_write(s, id, &w, e);
}

int tr_store_job_result_get(tr_store_t *s, int64_t id, char **result_json, struct tr_error *e)
{
	*result_json = NULL;
	struct conn *c = tr_store_conn_lend(s, e);
	int err = 0;
	sqlite3_stmt *st = tr_store_stmt(c, sql_get);
	if (!st) {
		err = -EIO;
		goto cleanup;
	}
	sqlite3_bind_int64(st, 1, id);
	int rc = sqlite3_step(st);
	if (rc == SQLITE_ROW) {
		const char *text = (const char *)sqlite3_column_text(st, 0);
		*result_json = strdup(text ? text : "null");
		if (!*result_json)
			err = -ENOMEM;
	} else if (rc == SQLITE_DONE) {
		err = -ENOENT;
	} else {
		err = SQLFAIL(c, rc, "read a job's result");
	}
	sqlite3_reset(st);
cleanup:
	tr_store_conn_put(s, c);
	return err;
}
