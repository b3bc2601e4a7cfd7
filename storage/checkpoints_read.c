/* Reading checkpoints (storage/checkpoints.h): rows, lists, the model
 * header, and the blob streamed out of its file by a reader.
 *
 * A reader reads the checkpoint's row from the store, then opens its file
 * read-only (registering the id first, so the pruner never makes that file
 * the spare: storage/checkpoints_files.c) and holds a read transaction on
 * it; it checks the chunk layout once and then reads with incremental blob
 * I/O (sqlite3_blob_reopen moves the handle between chunks without
 * compiling a statement), straight into the caller's buffer.  An open file
 * stays readable if the checkpoint is pruned meanwhile.
 *
 * tr_store_ckpt_load hashes each chunk on a helper thread while the next
 * one is read.
 */
#include "storage/checkpoints_internal.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char sql_list[] = "SELECT " CKPT_COLS " FROM checkpoints WHERE job_id = ?1 AND complete = 1"
			       " ORDER BY step DESC, id DESC";
static const char sql_get_step[] = "SELECT " CKPT_COLS " FROM checkpoints"
				   " WHERE job_id = ?1 AND step = ?2 AND complete = 1 ORDER BY id DESC LIMIT 1";
static const char sql_get_best[] = "SELECT " CKPT_COLS " FROM checkpoints WHERE job_id = ?1 AND complete = 1"
				   " AND best = 1 ORDER BY step DESC, id DESC LIMIT 1";
static const char sql_get_newest[] = "SELECT " CKPT_COLS " FROM checkpoints WHERE job_id = ?1 AND complete = 1"
				     " ORDER BY step DESC, id DESC LIMIT 1";
static const char sql_header[] = "SELECT model_header FROM checkpoints WHERE id = ?1 AND complete = 1";
static const char sql_reader_row[] =
	"SELECT job_id, step, bytes, sha256 FROM checkpoints WHERE id = ?1 AND complete = 1";
static const char sql_reader_file_chunks[] = "SELECT seq, length(data) FROM chunks ORDER BY seq";

struct tr_ckpt_reader {
	struct conn c; /* the store: its row, until the file is open */
	struct conn f; /* the checkpoint's file, with a read transaction */
	sqlite3_blob *blob;
	int64_t cur; /* the chunk (its seq, which is its rowid) blob points at; -1 = none */
	int64_t id, job_id, step, bytes, nchunks;
	char sha256[65];
	bool registered; /* in the readers table (its file must not become the spare) */
};

/* ---- rows ------------------------------------------------------------------ */

void tr_ckpt_row_finish(struct tr_ckpt_row *row)
{
	if (!row)
		return;
	free(row->meta);
	memset(row, 0, sizeof *row);
}

void tr_ckpt_rows_free(struct tr_ckpt_row *rows, int count)
{
	if (!rows)
		return;
	for (int i = 0; i < count; i++)
		tr_ckpt_row_finish(&rows[i]);
	free(rows);
}

int tr_ckpt_read_row(struct conn *c, sqlite3_stmt *st, struct tr_ckpt_row *r)
{
	memset(r, 0, sizeof *r);
	r->id = sqlite3_column_int64(st, 0);
	r->job_id = sqlite3_column_int64(st, 1);
	r->step = sqlite3_column_int64(st, 2);
	r->epoch = sqlite3_column_int64(st, 3);
	r->created_at = sqlite3_column_double(st, 4);
	r->bytes = sqlite3_column_int64(st, 5);
	const unsigned char *sha = sqlite3_column_text(st, 6);
	snprintf(r->sha256, sizeof r->sha256, "%s", sha ? (const char *)sha : "");
	r->params_offset = sqlite3_column_int64(st, 7);
	r->params_bytes = sqlite3_column_int64(st, 8);
	r->model_header_len = sqlite3_column_int64(st, 9);
	const unsigned char *meta = sqlite3_column_text(st, 10);
	if (meta && !(r->meta = strdup((const char *)meta)))
		return tr_store_cfail(c, -ENOMEM, "out of memory");
	r->best = sqlite3_column_int(st, 11) != 0;
	return 0;
}

/* ---- listing ------------------------------------------------------------------- */

int tr_store_ckpt_list(tr_store_t *s, int64_t job_id, struct tr_ckpt_row **rows, int *count, struct tr_error *e)
{
	*rows = NULL;
	*count = 0;
	struct conn *c = tr_store_conn_lend(s, e);
	struct tr_ckpt_row *v = NULL;
	int n = 0, cap = 0, err = -EIO, rc;
	sqlite3_stmt *st = tr_store_stmt(c, sql_list);
	if (!st)
		goto cleanup;
	sqlite3_bind_int64(st, 1, job_id);
	err = 0;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		if (n == cap) {
			cap = cap ? 2 * cap : 8;
			struct tr_ckpt_row *nv = realloc(v, (size_t)cap * sizeof *nv);
			if (!nv) {
				err = tr_store_cfail(c, -ENOMEM, "out of memory");
				goto cleanup;
			}
			v = nv;
		}
		err = tr_ckpt_read_row(c, st, &v[n]);
		n++; /* a failed row is zeroed or holds what to free */
		if (err < 0)
			goto cleanup;
	}
	if (rc != SQLITE_DONE)
		err = SQLFAIL(c, rc, "list checkpoints");
cleanup:
	tr_store_conn_put(s, c);
	if (err < 0) {
		tr_ckpt_rows_free(v, n);
		return err;
	}
	*rows = v;
	*count = n;
	return 0;
}

int tr_store_ckpt_get(tr_store_t *s, int64_t job_id, int64_t step, struct tr_ckpt_row *out, struct tr_error *e)
{
	memset(out, 0, sizeof *out);
	struct conn *c = tr_store_conn_lend(s, e);
	int err = -EIO;
	sqlite3_stmt *st = tr_store_stmt(c, step >= 0              ? sql_get_step
					    : step == TR_CKPT_BEST ? sql_get_best
								   : sql_get_newest);
	if (!st)
		goto cleanup;
	sqlite3_bind_int64(st, 1, job_id);
	if (step >= 0)
		sqlite3_bind_int64(st, 2, step);
	int rc = sqlite3_step(st);
	if (rc == SQLITE_ROW)
		err = tr_ckpt_read_row(c, st, out);
	else if (rc == SQLITE_DONE && step >= 0)
		err = tr_store_cfail(c, -ENOENT, "job %lld has no checkpoint at step %lld", (long long)job_id,
				     (long long)step);
	else if (rc == SQLITE_DONE && step == TR_CKPT_BEST)
		err = tr_store_cfail(c, -ENOENT, "job %lld has no best checkpoint", (long long)job_id);
	else if (rc == SQLITE_DONE)
		err = tr_store_cfail(c, -ENOENT, "job %lld has no checkpoint", (long long)job_id);
	else
		err = SQLFAIL(c, rc, "get a checkpoint");
cleanup:
	tr_store_conn_put(s, c);
	if (err < 0)
		tr_ckpt_row_finish(out);
	return err;
}

int tr_store_ckpt_model_header(tr_store_t *s, int64_t ckpt_id, void **data, size_t *len, struct tr_error *e)
{
	*data = NULL;
	*len = 0;
	struct conn *c = tr_store_conn_lend(s, e);
	int err = -EIO;
	sqlite3_stmt *st = tr_store_stmt(c, sql_header);
	if (!st)
		goto cleanup;
	sqlite3_bind_int64(st, 1, ckpt_id);
	int rc = sqlite3_step(st);
	if (rc == SQLITE_DONE) {
		err = tr_store_cfail(c, -ENOENT, "checkpoint %lld does not exist", (long long)ckpt_id);
		goto cleanup;
	}
	if (rc != SQLITE_ROW) {
		err = SQLFAIL(c, rc, "read a model header");
		goto cleanup;
	}
	const void *p = sqlite3_column_blob(st, 0);
	size_t n = (size_t)sqlite3_column_bytes(st, 0);
	/* One byte at least, so that an empty header is still a pointer the
	 * caller frees. */
	void *copy = malloc(n ? n : 1);
	if (!copy) {
		err = tr_store_cfail(c, -ENOMEM, "out of memory");
		goto cleanup;
	}
	if (n)
		memcpy(copy, p, n);
	*data = copy;
	*len = n;
	err = 0;
cleanup:
	tr_store_conn_put(s, c);
	return err;
}
/* ---- readers ------------------------------------------------------------------- */

/* Opens the reader's checkpoint file (which then reports into e).  A file
 * that cannot be opened is damage if the row is still there, a race with
 * a prune if it is not. */
static int reader_open_file(tr_store_t *s, struct tr_ckpt_reader *r, struct tr_error *e)
{
	char *dir = tr_ckpt_files_dir(s), *path = dir ? tr_ckpt_file_path(dir, r->id) : NULL;
	free(dir);
	if (!path)
		return tr_error_set(e, -ENOMEM, 0, NULL, "out of memory");
	int err = tr_ckpt_reader_register(r->id, e);
	if (err < 0) {
		free(path);
		return err;
	}
	r->registered = true;
	struct tr_error cause = {0}; /* the file's failure, worded below */
	err = tr_ckpt_open_file(&r->f, path, false, false, &cause);
	if (err == 0)
		err = tr_store_begin(&r->f, false);
	r->f.err = e;
	/* Only a missing file is damage (or a prune): any other failure (out of
	 * descriptors, a permission) says nothing about the checkpoint, and a
	 * resume must not give up on a good checkpoint for it. */
	if (err < 0 && err != -ENOENT) {
		err = tr_error_set(e, err, 0, NULL, "checkpoint %lld of job %lld (step %lld): %s", (long long)r->id,
				   (long long)r->job_id, (long long)r->step, cause.message);
	} else if (err < 0) {
		tr_store_rollback(&r->c); /* a fresh look at the row */
		sqlite3_stmt *st = tr_store_stmt(&r->c, sql_reader_row);
		if (st)
			sqlite3_bind_int64(st, 1, r->id);
		int rc = st ? sqlite3_step(st) : SQLITE_ERROR;
		if (st)
			sqlite3_reset(st);
		if (rc == SQLITE_DONE)
			err = tr_error_set(e, -ENOENT, 0, NULL, "checkpoint %lld was deleted", (long long)r->id);
		else
			err = tr_error_set(e, -EBADMSG, 0, NULL,
					   "checkpoint %lld of job %lld (step %lld) is damaged: %s", (long long)r->id,
					   (long long)r->job_id, (long long)r->step, cause.message);
	}
	free(path);
	return err;
}

static int reader_layout(tr_store_t *s, struct tr_ckpt_reader *r, struct tr_error *e)
{
	sqlite3_stmt *st = tr_store_stmt(&r->c, sql_reader_row);
	if (!st)
		return -EIO;
	sqlite3_bind_int64(st, 1, r->id);
	int rc = sqlite3_step(st);
	if (rc != SQLITE_ROW) {
		int err = rc == SQLITE_DONE
				  ? tr_store_cfail(&r->c, -ENOENT, "checkpoint %lld does not exist", (long long)r->id)
				  : SQLFAIL(&r->c, rc, "open a checkpoint");
		sqlite3_reset(st);
		return err;
	}
	r->job_id = sqlite3_column_int64(st, 0);
	r->step = sqlite3_column_int64(st, 1);
	r->bytes = sqlite3_column_int64(st, 2);
	const unsigned char *sha = sqlite3_column_text(st, 3);
	snprintf(r->sha256, sizeof r->sha256, "%s", sha ? (const char *)sha : "");
	sqlite3_reset(st);
	int err = reader_open_file(s, r, e);
	if (err < 0)
		return err;
	struct conn *c = &r->f;
	/* The store's connection is not needed any more: the open file stays
	 * readable even if the checkpoint is deleted. */
	tr_store_rollback(&r->c);
	tr_store_conn_close(&r->c);

	r->nchunks = r->bytes ? (r->bytes - 1) / (int64_t)CHUNK_BYTES + 1 : 0;
	st = tr_store_stmt(c, sql_reader_file_chunks);
	if (!st)
		return -EIO;
	int64_t i = 0;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		int64_t seq = sqlite3_column_int64(st, 0), len = sqlite3_column_int64(st, 1);
		int64_t want = i < r->nchunks - 1 ? (int64_t)CHUNK_BYTES : r->bytes - i * (int64_t)CHUNK_BYTES;
		if (i >= r->nchunks || seq != i || len != want) {
			err = tr_store_cfail(
				c, -EBADMSG,
				"checkpoint %lld of job %lld (step %lld) is damaged: chunk %lld has %lld bytes, expected chunk %lld of %lld bytes",
				(long long)r->id, (long long)r->job_id, (long long)r->step, (long long)seq,
				(long long)len, (long long)i, (long long)want);
			break;
		}
		i++;
	}
	if (err == 0 && rc != SQLITE_DONE)
		err = (rc & 0xff) == SQLITE_NOTADB || (rc & 0xff) == SQLITE_CORRUPT
			      ? tr_store_cfail(c, -EBADMSG, "checkpoint %lld of job %lld (step %lld) is damaged: %s",
					       (long long)r->id, (long long)r->job_id, (long long)r->step,
					       sqlite3_errmsg(c->db))
			      : SQLFAIL(c, rc, "read checkpoint chunks");
	else if (err == 0 && i != r->nchunks)
		err = tr_store_cfail(c, -EBADMSG,
				     "checkpoint %lld of job %lld (step %lld) is damaged: %lld of %lld chunks present",
				     (long long)r->id, (long long)r->job_id, (long long)r->step, (long long)i,
				     (long long)r->nchunks);
	sqlite3_reset(st);
	return err;
}

int tr_store_ckpt_open(tr_store_t *s, int64_t ckpt_id, tr_ckpt_reader_t **out, struct tr_error *e)
{
	*out = NULL;
	struct tr_ckpt_reader *r = calloc(1, sizeof *r);
	if (!r)
		return tr_error_set(e, -ENOMEM, 0, NULL, "out of memory");
	r->id = ckpt_id;
	r->cur = -1;
	int err = tr_ckpt_open_own(s, &r->c, false, e);
	if (err < 0) {
		free(r);
		return err;
	}
	/* The row is read in a transaction of its own; then the file is
	 * opened, with a read transaction for the reader's life. */
	err = tr_store_begin(&r->c, false);
	if (err == 0)
		err = reader_layout(s, r, e);
	/* Each read lends the file's connection its caller's struct. */
	r->c.err = r->f.err = NULL;
	if (err < 0) {
		tr_store_ckpt_close(r);
		return err;
	}
	*out = r;
	return 0;
}

ssize_t tr_store_ckpt_read(tr_ckpt_reader_t *r, uint64_t offset, void *buf, size_t len, struct tr_error *e)
{
	if (!r || (len && !buf))
		return tr_error_set(e, -EINVAL, 0, NULL, "checkpoint read: bad arguments");
	if (offset >= (uint64_t)r->bytes)
		return 0;
	if (len > (uint64_t)r->bytes - offset)
		len = (size_t)((uint64_t)r->bytes - offset);
	if (len > SSIZE_MAX)
		len = SSIZE_MAX;
	size_t done = 0;
	while (done < len) {
		uint64_t at = offset + done;
		int64_t seq = (int64_t)(at / CHUNK_BYTES);
		size_t in = (size_t)(at % CHUNK_BYTES);
		int rc = SQLITE_OK;
		struct conn *c = &r->f;
		if (seq != r->cur) {
			if (r->blob)
				rc = sqlite3_blob_reopen(r->blob, seq);
			else
				rc = sqlite3_blob_open(c->db, "main", "chunks", "data", seq, 0, &r->blob);
			r->cur = rc == SQLITE_OK ? seq : -1;
		}
		size_t n = CHUNK_BYTES - in < len - done ? CHUNK_BYTES - in : len - done;
		if (rc == SQLITE_OK)
			rc = sqlite3_blob_read(r->blob, (char *)buf + done, (int)n, (int)in);
		if (rc != SQLITE_OK) {
			c->err = e;
			int err = SQLFAIL(c, rc, "read a checkpoint chunk");
			c->err = NULL;
			/* A handle that failed is aborted for good: start over. */
			sqlite3_blob_close(r->blob);
			r->blob = NULL;
			r->cur = -1;
			return err;
		}
		done += n;
	}
	return (ssize_t)done;
}

void tr_store_ckpt_close(tr_ckpt_reader_t *r)
{
	if (!r)
		return;
	if (r->blob)
		sqlite3_blob_close(r->blob);
	if (r->f.db)
		tr_store_rollback(&r->f);
	tr_store_conn_close(&r->f);
	if (r->registered)
		tr_ckpt_reader_unregister(r->id);
	if (r->c.db)
		tr_store_rollback(&r->c); /* ends the read transaction */
	tr_store_conn_close(&r->c);
	free(r);
}

int tr_store_ckpt_load(tr_store_t *s, const struct tr_ckpt_row *row, void **data, size_t *len, struct tr_error *e)
{
	*data = NULL;
	*len = 0;
	if (!row)
		return tr_error_set(e, -EINVAL, 0, NULL, "checkpoint load: no row");
	tr_ckpt_reader_t *r;
	int err = tr_store_ckpt_open(s, row->id, &r, e);
	if (err < 0)
		return err;
	unsigned char *buf = NULL;
	if ((uint64_t)r->bytes > SIZE_MAX - 1) {
		err = tr_error_set(e, -EFBIG, 0, NULL, "checkpoint %lld: %lld bytes do not fit in memory",
				   (long long)r->id, (long long)r->bytes);
		goto fail;
	}
	if (row->sha256[0] && strcmp(row->sha256, r->sha256) != 0) {
		err = tr_error_set(e, -EBADMSG, 0, NULL, "checkpoint %lld: the row's SHA-256 %s is not the stored %s",
				   (long long)r->id, row->sha256, r->sha256);
		goto fail;
	}
	buf = malloc(r->bytes ? (size_t)r->bytes : 1);
	if (!buf) {
		err = tr_error_set(e, -ENOMEM, 0, NULL, "checkpoint %lld: cannot allocate %lld bytes", (long long)r->id,
				   (long long)r->bytes);
		goto fail;
	}
	/* Chunk by chunk: each is hashed while the next one is read. */
	struct tr_sha256 sha;
	tr_sha256_init(&sha);
	struct tr_ckpt_hash hash = {0};
	for (uint64_t off = 0; off < (uint64_t)r->bytes;) {
		ssize_t n = tr_store_ckpt_read(r, off, buf + off, CHUNK_BYTES, e);
		tr_ckpt_hash_wait(&hash);
		if (n <= 0) {
			err = n < 0 ? (int)n
				    : tr_error_set(e, -EIO, 0, NULL, "checkpoint %lld: short read", (long long)r->id);
			goto fail;
		}
		tr_ckpt_hash_start(&hash, &sha, buf + off, (size_t)n);
		off += (uint64_t)n;
	}
	tr_ckpt_hash_wait(&hash);
	char hex[65];
	tr_sha256_final_hex(&sha, hex);
	if (strcmp(hex, r->sha256) != 0) {
		err = tr_error_set(e, -EBADMSG, 0, NULL,
				   "checkpoint %lld of job %lld (step %lld) is corrupt: its SHA-256 is %s, expected %s",
				   (long long)r->id, (long long)r->job_id, (long long)r->step, hex,
				   r->sha256[0] ? r->sha256 : "(none stored)");
		goto fail;
	}
	*data = buf;
	*len = (size_t)r->bytes;
	tr_store_ckpt_close(r);
	return 0;
fail:
	free(buf);
	tr_store_ckpt_close(r);
	return err;
}
