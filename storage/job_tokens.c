/* Per-job report tokens (store.h, tr_store_job_token_*): one row per job
 * in job_tokens holding the SHA-256 of the token, never the token itself,
 * so a copy of the database grants nothing. */
#include "storage/internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static const char sql_set[] = "INSERT OR REPLACE INTO job_tokens (job_id, hash) VALUES (?1, ?2)";
static const char sql_clear[] = "DELETE FROM job_tokens WHERE job_id = ?1";
static const char sql_hash_of[] = "SELECT hash FROM job_tokens WHERE job_id = ?1";
static const char sql_job_of[] = "SELECT job_id FROM job_tokens WHERE hash = ?1";

int tr_store_job_token_set(tr_store_t *s, int64_t id, const char *hash_hex, struct tr_error *e)
{
	const struct job_write w = {.sql = sql_set, .text = hash_hex, .what = "store a job's report token"};
	return tr_store_job_write(s, id, &w, e);
}

int tr_store_job_token_clear(tr_store_t *s, int64_t id, struct tr_error *e)
{
	const struct job_write w = {.sql = sql_clear, .text = "", .what = "revoke a job's report token"};
	return tr_store_job_write(s, id, &w, e);
}

/* One row of one column by an integer or a text key. */
static int lookup(tr_store_t *s, const char *sql, int64_t key_int, const char *key_text, char *text, size_t n,
		  int64_t *out, struct tr_error *e)
{
	struct conn *c = tr_store_conn_lend(s, e);
	int err = 0;
	sqlite3_stmt *st = tr_store_stmt(c, sql);
	if (!st) {
		err = -EIO;
		goto cleanup;
	}
	if (key_text)
		sqlite3_bind_text(st, 1, key_text, -1, SQLITE_STATIC);
	else
		sqlite3_bind_int64(st, 1, key_int);
	int rc = sqlite3_step(st);
	if (rc == SQLITE_ROW) {
		if (text)
			snprintf(text, n, "%s", (const char *)sqlite3_column_text(st, 0));
		if (out)
			*out = sqlite3_column_int64(st, 0);
	} else if (rc == SQLITE_DONE) {
		err = -ENOENT;
	} else {
		err = SQLFAIL(c, rc, "read a report token");
	}
	sqlite3_reset(st);
cleanup:
	tr_store_conn_put(s, c);
	return err;
}

int tr_store_job_token_hash_of(tr_store_t *s, int64_t id, char hash_hex[65], struct tr_error *e)
{
	hash_hex[0] = 0;
	return lookup(s, sql_hash_of, id, NULL, hash_hex, 65, NULL, e);
}

int tr_store_job_token_job_of(tr_store_t *s, const char *hash_hex, int64_t *id, struct tr_error *e)
{
	*id = 0;
	return lookup(s, sql_job_of, 0, hash_hex, NULL, 0, id, e);
}
