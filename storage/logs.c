/* Reading a job's log lines (written by the metrics writer, metrics_write.c), paged
 * by log id like events are.
 */
#include "storage/internal.h"

#include "core/rfc3339.h"

#include <errno.h>

json_t *tr_store_logs_query(tr_store_t *s, int64_t job_id, int64_t after, int limit, struct tr_error *e)
{
	json_t *a = json_array();
	if (!a) {
		tr_error_set(e, -ENOMEM, 0, NULL, "out of memory");
		return NULL;
	}
	struct conn *c = tr_store_conn_lend(s, e);
	int rc = SQLITE_DONE;
	bool oom = false;
	sqlite3_stmt *st = tr_store_stmt(c, "SELECT id, time, level, message FROM logs"
					    " WHERE job_id = ?1 AND id > ?2 ORDER BY id LIMIT ?3");
	if (!st)
		goto fail;
	sqlite3_bind_int64(st, 1, job_id);
	sqlite3_bind_int64(st, 2, after);
	sqlite3_bind_int(st, 3, limit > 0 ? limit : -1);
	while (!oom && (rc = sqlite3_step(st)) == SQLITE_ROW) {
		/* Messages were made valid UTF-8 when queued; times are RFC 3339
		 * like every time in the API (core/rfc3339.h). */
		char when[TR_RFC3339_LEN];
		bool have = tr_rfc3339_format(sqlite3_column_double(st, 1), when, sizeof when);
		json_t *line = json_pack("{s:I, s:s?, s:i, s:s}", "id", (json_int_t)sqlite3_column_int64(st, 0), "time",
					 have ? when : NULL, "level", sqlite3_column_int(st, 2), "message",
					 (const char *)sqlite3_column_text(st, 3));
		oom = !line || json_array_append_new(a, line) != 0;
	}
	if (oom) {
		tr_store_cfail(c, -ENOMEM, "out of memory");
		goto fail;
	}
	if (rc != SQLITE_DONE) {
		SQLFAIL(c, rc, "SELECT logs");
		goto fail;
	}
	tr_store_conn_put(s, c);
	return a;
fail:
	tr_store_conn_put(s, c);
	json_decref(a);
	return NULL;
}
