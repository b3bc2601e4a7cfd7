/* Checkpoints in the store: chunked blobs with a SHA-256, streamed in and
 * out so a checkpoint of any size is never held in memory twice.
 *
 * Tables: checkpoints (job_id, step, epoch, created_at, bytes, sha256,
 * meta JSON, model_header BLOB, params_offset, params_bytes, complete) and
 * checkpoint_chunks (checkpoint_id, seq, data BLOB, 4 MiB each), both ON
 * DELETE CASCADE from jobs.  A checkpoint is written chunk by chunk in
 * short transactions on its own connection, so the metrics writer is never
 * blocked for the length of a large checkpoint; it becomes visible only
 * when tr_store_ckpt_commit marks it complete (with its SHA-256) in one
 * transaction, which also prunes older checkpoints beyond `keep`.  An
 * incomplete checkpoint (crash, disk full) is never listed and is removed
 * by tr_store_ckpt_abort or at the next open.
 *
 * The weights-only file of a checkpoint (model.safetensors) is its
 * model_header followed by bytes [params_offset, params_offset +
 * params_bytes) of the blob.
 */
#ifndef TR_STORE_CHECKPOINTS_H
#define TR_STORE_CHECKPOINTS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "storage/store.h"

struct tr_ckpt_row {
	int64_t id, job_id, step, epoch;
	double created_at; /* Unix seconds */
	int64_t bytes;     /* blob size */
	char sha256[65];   /* lowercase hex */
	int64_t params_offset, params_bytes;
	int64_t model_header_len;
	char *meta; /* JSON text (malloc'd) or NULL */
};
void tr_ckpt_row_finish(struct tr_ckpt_row *row); /* accepts zeroed rows */

typedef struct tr_ckpt_writer tr_ckpt_writer_t;

/* Starts a checkpoint of job_id at step.  meta_json may be NULL. */
int tr_store_ckpt_begin(tr_store_t *s, int64_t job_id, int64_t step, int64_t epoch, const char *meta_json,
			tr_ckpt_writer_t **out);
/* Appends bytes (any sizes; chunked internally) and feeds the SHA-256.
 * -ENOSPC when the database is full (SQLITE_FULL), -EIO otherwise. */
int tr_store_ckpt_write(tr_ckpt_writer_t *w, const void *data, size_t len);
/* Marks the checkpoint complete, keeps the newest `keep` complete ones of
 * the job (older ones deleted), frees w.  *out (may be NULL) receives the
 * row.  On failure the checkpoint is aborted. */
int tr_store_ckpt_commit(tr_ckpt_writer_t *w, const void *model_header, size_t model_header_len,
			 int64_t params_offset, int64_t params_bytes, int keep, struct tr_ckpt_row *out);
/* Deletes the partial checkpoint and frees w.  Accepts NULL. */
void tr_store_ckpt_abort(tr_ckpt_writer_t *w);

/* Complete checkpoints of a job, newest (highest step, then id) first. */
int tr_store_ckpt_list(tr_store_t *s, int64_t job_id, struct tr_ckpt_row **rows, int *count);
void tr_ckpt_rows_free(struct tr_ckpt_row *rows, int count);
/* One complete checkpoint: step >= 0 exact, step < 0 the newest.
 * -ENOENT when there is none. */
int tr_store_ckpt_get(tr_store_t *s, int64_t job_id, int64_t step, struct tr_ckpt_row *out);
int tr_store_ckpt_delete(tr_store_t *s, int64_t ckpt_id);

typedef struct tr_ckpt_reader tr_ckpt_reader_t;

/* Random-access reads over a checkpoint's blob, a chunk at a time. */
int tr_store_ckpt_open(tr_store_t *s, int64_t ckpt_id, tr_ckpt_reader_t **out);
/* Reads up to len bytes at offset; returns the count (0 at the end) or a
 * negative code. */
ssize_t tr_store_ckpt_read(tr_ckpt_reader_t *r, uint64_t offset, void *buf, size_t len);
void tr_store_ckpt_close(tr_ckpt_reader_t *r); /* accepts NULL */

/* Reads the whole blob into memory (malloc'd *data, *len) and checks its
 * SHA-256: -EBADMSG on a mismatch, with nothing returned. */
int tr_store_ckpt_load(tr_store_t *s, const struct tr_ckpt_row *row, void **data, size_t *len);

/* SHA-256 (FIPS 180-4), for the store and for tests. */
void tr_sha256_hex(const void *data, size_t len, char out[65]);

#endif
