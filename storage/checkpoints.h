/* Checkpoints in the store: chunked blobs with a SHA-256, streamed in and
 * out so a checkpoint of any size is never held in memory twice.
 *
 * Where: a checkpoints row (job_id, step, epoch, created_at, bytes,
 * sha256, meta JSON, model_header BLOB, params_offset, params_bytes,
 * complete, chunk_file; ON DELETE CASCADE from jobs) in the store's
 * database, and the blob's 4 MiB chunks in a SQLite file of the
 * checkpoint's own, "<store path>-checkpoints/<id>.sqlite" (checkpoints
 * written before chunk_file existed kept theirs in the store's
 * checkpoint_chunks table; tr_store_open moves them into files once).
 * Written in checkpoints_write.c, read in checkpoints_read.c, files,
 * deletion and the move at open in checkpoints_files.c.  A checkpoint
 * is written chunk by chunk into its file, without touching the store's
 * write lock; it becomes visible (and durable: the file is synced first)
 * only when tr_store_ckpt_commit marks it complete (with its SHA-256) in
 * one transaction, which also prunes older checkpoints beyond `keep`.  An
 * incomplete checkpoint (crash, disk full) is never listed and is removed
 * with its file by tr_store_ckpt_abort (on a failed write or commit, at
 * once) or at the next tr_store_open, which also deletes checkpoint files
 * that no row names.  A full disk (SQLITE_FULL), or a new file reaching
 * what tr_store_options.max_bytes leaves (store.h), gives -ENOSPC with a
 * message that says so; the checkpoints committed before stay valid.
 *
 * The weights-only file of a checkpoint (model.safetensors) is its
 * model_header followed by bytes [params_offset, params_offset +
 * params_bytes) of the blob.
 *
 * Errors (docs/design.md, "Errors"): every function that can fail returns
 * 0 (or a count) or a negative errno-style code and fills the caller's
 * struct tr_error (e; NULL when only the code is wanted) with why.
 */
#ifndef TR_STORE_CHECKPOINTS_H
#define TR_STORE_CHECKPOINTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "storage/sha256.h" /* tr_sha256_hex, for the store and for tests */
#include "storage/store.h"

struct tr_ckpt_row {
	int64_t id, job_id, step, epoch;
	double created_at; /* Unix seconds */
	int64_t bytes;     /* blob size */
	char sha256[65];   /* lowercase hex */
	int64_t params_offset, params_bytes;
	int64_t model_header_len;
	char *meta; /* JSON text (malloc'd) or NULL */
	bool best;  /* the job's best checkpoint (early stopping) */
};
void tr_ckpt_row_finish(struct tr_ckpt_row *row); /* accepts zeroed rows */

typedef struct tr_ckpt_writer tr_ckpt_writer_t;

/* Starts a checkpoint of job_id at step (0 <= step, epoch <= 2^62).
 * meta_json: a JSON object or NULL.  Opens a connection for the writer.
 * -ENOENT when the job does not exist.  The writer is used by one thread
 * at a time and must be committed or aborted before the store is closed. */
int tr_store_ckpt_begin(tr_store_t *s, int64_t job_id, int64_t step, int64_t epoch, const char *meta_json,
			tr_ckpt_writer_t **out, struct tr_error *e);
/* Appends bytes (any sizes; chunked internally) and feeds the SHA-256.
 * -ENOSPC when the database is full (SQLITE_FULL), -EIO otherwise.  Any
 * failure deletes the partial checkpoint at once (earlier checkpoints stay
 * valid) and sticks: later writes and the commit return it again; the
 * caller still calls tr_store_ckpt_abort (or commit) to free w. */
int tr_store_ckpt_write(tr_ckpt_writer_t *w, const void *data, size_t len, struct tr_error *e);
/* Marks the checkpoint complete, keeps the newest `keep` complete ones of
 * the job (older ones deleted) and its best one, frees w.  A checkpoint
 * whose meta has "reason": "best" becomes the job's best (the previous best
 * is then pruned like any other).  The checkpoint just committed is
 * always one of the `keep`, even when others have higher steps; keep <= 0
 * prunes nothing.  [params_offset, params_offset + params_bytes) must lie
 * within the blob.  *out (may be NULL) receives the row (free it with
 * tr_ckpt_row_finish).  On failure the checkpoint is aborted (and w freed). */
int tr_store_ckpt_commit(tr_ckpt_writer_t *w, const void *model_header, size_t model_header_len, int64_t params_offset,
			 int64_t params_bytes, int keep, struct tr_ckpt_row *out, struct tr_error *e);
/* Deletes the partial checkpoint and frees w.  Accepts NULL.  Reports
 * nothing: what it cannot delete, the next open does. */
void tr_store_ckpt_abort(tr_ckpt_writer_t *w);

/* Deletes the spare file (a pruned checkpoint's file kept to be written
 * over by the next checkpoint: see storage/checkpoints_files.c), if any.  For
 * when no checkpoint is expected soon; the next open does it too. */
void tr_store_ckpt_drop_spare(tr_store_t *s);

/* Complete checkpoints of a job, newest (highest step, then id) first.
 * *rows is malloc'd (NULL when there are none); free with tr_ckpt_rows_free. */
int tr_store_ckpt_list(tr_store_t *s, int64_t job_id, struct tr_ckpt_row **rows, int *count, struct tr_error *e);
void tr_ckpt_rows_free(struct tr_ckpt_row *rows, int count);
/* step of tr_store_ckpt_get: the job's best checkpoint. */
#define TR_CKPT_BEST (-2)
/* One complete checkpoint: step >= 0 exact (the newest of several at that
 * step), TR_CKPT_BEST the best, another step < 0 the newest.  -ENOENT when
 * there is none. */
int tr_store_ckpt_get(tr_store_t *s, int64_t job_id, int64_t step, struct tr_ckpt_row *out, struct tr_error *e);
/* Deletes a checkpoint; -ENOENT when there is none.  It disappears from
 * lists at once; then its file is unlinked, as for checkpoints pruned by a
 * commit. */
int tr_store_ckpt_delete(tr_store_t *s, int64_t ckpt_id, struct tr_error *e);
/* A complete checkpoint's model_header (malloc'd *data, at least 1 byte
 * even when *len is 0; the caller frees).  -ENOENT when there is none. */
int tr_store_ckpt_model_header(tr_store_t *s, int64_t ckpt_id, void **data, size_t *len, struct tr_error *e);

typedef struct tr_ckpt_reader tr_ckpt_reader_t;

/* Random-access reads over a complete checkpoint's blob (-ENOENT when
 * there is none; -EBADMSG when its file or chunks are missing or of the
 * wrong size).  The reader has its own connection to the checkpoint's
 * file, so it sees the checkpoint as it was at open even if it is deleted
 * meanwhile.  One thread at a time per reader. */
int tr_store_ckpt_open(tr_store_t *s, int64_t ckpt_id, tr_ckpt_reader_t **out, struct tr_error *e);
/* Reads up to len bytes at offset; returns the count (0 at the end) or a
 * negative code. */
ssize_t tr_store_ckpt_read(tr_ckpt_reader_t *r, uint64_t offset, void *buf, size_t len, struct tr_error *e);
void tr_store_ckpt_close(tr_ckpt_reader_t *r); /* accepts NULL */

/* Reads the whole blob of row->id into memory (malloc'd *data, at least 1
 * byte; *len) and checks its SHA-256 against the stored one (and row's,
 * when set): -EBADMSG on a mismatch, with nothing returned. */
int tr_store_ckpt_load(tr_store_t *s, const struct tr_ckpt_row *row, void **data, size_t *len, struct tr_error *e);

#endif
