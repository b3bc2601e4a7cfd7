/* Info fields of a job (store.h, tr_store_job_info_merge): a JSON object
 * of short strings in jobs.info, merged with SQLite's json_patch inside one
 * write transaction, so concurrent writers (the API and the job's runner)
 * never lose each other's keys and the key limit holds after every merge. */
#include "storage/internal.h"

#include <errno.h>

static const char sql_count[] = "SELECT (SELECT count(*) FROM json_each(json_patch(info, ?2))) FROM jobs WHERE id = ?1";
static const char sql_merge[] = "UPDATE jobs SET info = json_patch(info, ?2) WHERE id = ?1";

/* tr_store_job_write's check: the merge would leave at most max_keys
 * (ctx) fields, and the job exists. */
static int check_keys(struct conn *c, int64_t id, const struct job_write *w)
{
	int max_keys = *(const int *)w->ctx;
	sqlite3_stmt *st = tr_store_stmt(c, sql_count);
	if (!st)
		return -EIO;
	sqlite3_bind_int64(st, 1, id);
	sqlite3_bind_text(st, 2, w->text, -1, SQLITE_STATIC);
	int rc = sqlite3_step(st);
	int64_t keys = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
	sqlite3_reset(st);
	if (rc == SQLITE_DONE)
		return tr_store_cfail(c, -ENOENT, "job %lld not found", (long long)id);
	if (rc != SQLITE_ROW)
		return SQLFAIL(c, rc, "count info fields");
	if (keys > max_keys)
		return tr_store_cfail(c, -E2BIG, "job %lld would have %lld info fields, at most %d are kept",
				      (long long)id, (long long)keys, max_keys);
	return 0;
}

int tr_store_job_info_merge(tr_store_t *s, int64_t id, const char *fields_json, int max_keys, struct tr_error *e)
{
	const struct job_write w = {.sql = sql_merge,
				    .text = fields_json,
				    .what = "merge info fields",
				    .check = check_keys,
				    .ctx = &max_keys};
	return tr_store_job_write(s, id, &w, e);
}
