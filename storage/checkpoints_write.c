/* Writing a checkpoint (storage/checkpoints.h): a blob streamed in by a
 * writer, 4 MiB chunks at a time, into a file of its own
 * (storage/checkpoints_files.c).
 *
 * Begin inserts the checkpoint row with complete = 0 in one short
 * transaction, then creates the file (or takes over the spare); every
 * full chunk is committed in the file as it comes.  The commit stores the
 * last partial chunk, checks what the file holds against what was
 * written, syncs the file (and its directory), then in one store
 * transaction stores the SHA-256 (computed as the bytes came in), flips
 * complete and hides the checkpoints it prunes; then deletes the pruned
 * ones.  So a visible checkpoint is a durable one.  Any failure discards
 * the partial checkpoint at once, so a full disk is given back its space
 * before the caller even calls abort; a failed discard is finished by the
 * next tr_store_open, which deletes incomplete rows and files without a
 * row (tr_store_ckpt_sweep).
 *
 * Space: tr_store_options.max_bytes caps the store and the checkpoint
 * files together: a new file may take what the others and the database
 * leave (SQLITE_FULL past that, like a full disk).
 *
 * Hashing: a chunk is hashed on a short-lived helper thread while the
 * calling thread inserts it: both only read the bytes, and the join orders
 * the digest state.  With the SHA extensions (storage/sha256.c) the hash
 * takes a fraction of SQLite's time on a chunk; without them it is the
 * slower of the two.
 */
#include "storage/checkpoints_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char sql_chunk_len[] = "SELECT length(data) FROM chunks WHERE seq = ?1";
static const char sql_drop_chunk[] = "DELETE FROM chunks WHERE seq = ?1";
static const char sql_drop_chunks_from[] = "DELETE FROM chunks WHERE seq >= ?1";
static const char sql_insert_ckpt[] =
	"INSERT INTO checkpoints (job_id, step, epoch, created_at, meta, complete, chunk_file)"
	" VALUES (?1, ?2, ?3, ?4, ?5, 0, 1)";
static const char sql_insert_chunk[] = "INSERT INTO chunks (seq, data) VALUES (?1, ?2)";
/* length() of a blob column is read from the record header: the chunks'
 * overflow pages are not touched. */
static const char sql_chunk_totals[] = "SELECT count(*), coalesce(sum(length(data)), 0), coalesce(max(seq), -1)"
				       " FROM chunks";
static const char sql_complete[] = "UPDATE checkpoints SET bytes = ?2, sha256 = ?3, model_header = ?4,"
				   " params_offset = ?5, params_bytes = ?6, complete = 1"
				   " WHERE id = ?1 AND complete = 0";
/* The checkpoint just committed always stays, even when an older-step
 * checkpoint is written after newer ones (a job resumed from an earlier
 * step): keep - 1 others survive beside it. */
static const char sql_set_best[] =
	"UPDATE checkpoints SET best = (id = ?2) WHERE job_id = ?1 AND (best = 1 OR id = ?2)";
/* The best checkpoint is kept whatever `keep` says. */
static const char sql_prunable[] = "SELECT id FROM checkpoints WHERE job_id = ?1 AND complete = 1 AND id <> ?2"
				   " AND best = 0"
				   " ORDER BY step DESC, id DESC LIMIT -1 OFFSET ?3";
static const char sql_hide[] = "UPDATE checkpoints SET complete = 0 WHERE id = ?1";
static const char sql_row_by_id[] = "SELECT " CKPT_COLS " FROM checkpoints WHERE id = ?1";

struct tr_ckpt_writer {
	struct conn c; /* the store: the checkpoint's row; opened at begin, closed at commit or abort */
	struct conn f; /* the checkpoint's file */
	char *dir;     /* of the store's checkpoint files (the writer never touches the store object after begin) */
	char *path;    /* of the file */
	int fd;        /* the file, for writeback hints and the final sync; -1 = none */
	bool reused;   /* the file was the spare: its rows are overwritten */
	int64_t id;    /* the incomplete row; 0 once committed or discarded */
	int64_t job_id, step;
	int64_t bytes;      /* appended so far */
	int64_t nchunks;    /* chunks stored */
	unsigned char *buf; /* the chunk being filled; allocated when first needed */
	size_t nbuf;
	struct tr_sha256 sha;
	bool best; /* meta says "reason": "best" */
	/* Where c and f (and the helpers working for the writer) report a
	 * failure: the cause, which writer_fail words into the caller's
	 * struct tr_error (docs/design.md, "Errors"). */
	struct tr_error cause;
	int err;              /* first failure: every later call repeats it */
	struct tr_error fail; /* its message */
};

/* Closes the writer's file (its connection and descriptor). */
static void close_file(struct tr_ckpt_writer *w)
{
	tr_store_conn_close(&w->f);
	if (w->fd >= 0)
		close(w->fd);
	w->fd = -1;
}

/* Closes and deletes the writer's file. */
static void drop_file(struct tr_ckpt_writer *w)
{
	close_file(w);
	if (w->path)
		unlink(w->path);
}

/* Deletes the incomplete checkpoint.  Keeps w->cause: it runs on failure
 * paths, where that is what the caller needs to read (its own failures
 * go to the connection's sink). */
static int discard(struct tr_ckpt_writer *w)
{
	drop_file(w);
	if (!w->id || !w->c.db)
		return 0;
	w->c.err = NULL;
	tr_store_rollback(&w->c);
	/* A failed commit may have left FULL. */
	tr_store_exec(&w->c, "PRAGMA synchronous=NORMAL");
	int err = tr_ckpt_purge(w->dir, &w->c, w->id, false);
	/* Not retried: tr_store_open deletes what is left. */
	w->id = 0;
	w->c.err = &w->cause;
	return err;
}

/* The writer's sticky failure into e; returns its code. */
static int writer_report(const struct tr_ckpt_writer *w, struct tr_error *e)
{
	if (e)
		*e = w->fail;
	return w->err;
}

/* Every failure of a writer ends here: discards the partial checkpoint,
 * words the message from w->cause (a full disk or cap says so) into e,
 * and makes the failure sticky.  Returns err. */
static int writer_fail(struct tr_ckpt_writer *w, int err, struct tr_error *e)
{
	bool discarded = discard(w) == 0;
	const char *fate = discarded ? "the partial checkpoint was deleted"
				     : "the partial checkpoint will be deleted at the next open";
	if (err == -ENOSPC)
		tr_error_set(
			&w->fail, err, 0, NULL,
			"checkpoint of job %lld at step %lld: the database is full (%s); %s, earlier checkpoints are intact",
			(long long)w->job_id, (long long)w->step, w->cause.message, fate);
	else
		tr_error_set(&w->fail, err, 0, NULL, "checkpoint of job %lld at step %lld: %s; %s",
			     (long long)w->job_id, (long long)w->step, w->cause.message, fate);
	w->err = err;
	return writer_report(w, e);
}

/* Maps a failed step on the store's checkpoint tables: a foreign key
 * failure means the row it hangs from is gone. */
static int step_fail(struct tr_ckpt_writer *w, int rc, const char *what)
{
	if (rc == SQLITE_CONSTRAINT_FOREIGNKEY)
		return tr_store_cfail(&w->c, -ENOENT,
				      "the checkpoint was deleted while being written (was job %lld deleted?)",
				      (long long)w->job_id);
	return SQLFAIL(&w->c, rc, what);
}

/* A chunk's commit (synchronous=OFF) leaves its pages dirty in the page
 * cache, so without a hint the disk would start on them only at the final
 * sync, and a checkpoint would take the time to write it plus the time to
 * sync it.  After each chunk the kernel is asked to start writing what is
 * dirty (without waiting for it), so the disk works while the next chunks
 * come in and the final sync waits only for the tail.  A hint: nothing
 * depends on it working. */
static void start_writeback(struct tr_ckpt_writer *w)
{
#ifdef SYNC_FILE_RANGE_WRITE
	if (w->fd >= 0)
		sync_file_range(w->fd, 0, 0, SYNC_FILE_RANGE_WRITE);
#else
	(void)w;
#endif
}

/* Inside the chunk's transaction in a reused file: overwrites row
 * w->nchunks in place when it holds n bytes (returns 1), or deletes it (if
 * any) so that it is inserted anew (returns 0). */
static int overwrite_chunk(struct tr_ckpt_writer *w, const void *p, size_t n)
{
	sqlite3_stmt *st = tr_store_stmt(&w->f, sql_chunk_len);
	if (!st)
		return -EIO;
	sqlite3_bind_int64(st, 1, w->nchunks);
	int rc = sqlite3_step(st);
	int64_t len = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
	sqlite3_reset(st);
	if (rc != SQLITE_ROW && rc != SQLITE_DONE)
		return SQLFAIL(&w->f, rc, "read a checkpoint chunk's size");
	if (len == (int64_t)n) {
		sqlite3_blob *blob;
		rc = sqlite3_blob_open(w->f.db, "main", "chunks", "data", w->nchunks, 1, &blob);
		if (rc == SQLITE_OK) {
			rc = sqlite3_blob_write(blob, p, (int)n, 0);
			int closed = sqlite3_blob_close(blob);
			if (rc == SQLITE_OK)
				rc = closed;
		}
		return rc == SQLITE_OK ? 1 : SQLFAIL(&w->f, rc, "overwrite a checkpoint chunk");
	}
	return len < 0 ? 0 : tr_ckpt_run_id(&w->f, sql_drop_chunk, w->nchunks, 0);
}

/* Inserts row w->nchunks with the chunk's bytes (inside its transaction). */
static int insert_chunk(struct tr_ckpt_writer *w, const void *p, size_t n)
{
	sqlite3_stmt *st = tr_store_stmt(&w->f, sql_insert_chunk);
	if (!st)
		return -EIO;
	sqlite3_bind_int64(st, 1, w->nchunks);
	/* SQLITE_STATIC: SQLite copies the bytes into its pages anyway; a
	 * transient copy would be a second 4 MiB memcpy. */
	sqlite3_bind_blob64(st, 2, p, n, SQLITE_STATIC);
	int rc = sqlite3_step(st);
	sqlite3_reset(st);
	sqlite3_clear_bindings(st); /* drops the pointer to the caller's bytes */
	return rc == SQLITE_DONE ? 0 : SQLFAIL(&w->f, rc, "insert a checkpoint chunk");
}

/* Stores chunk number w->nchunks in the file, in a transaction of its
 * own, and feeds it to the digest on a helper thread meanwhile.  (Hashing
 * each 256 KiB piece on this thread right before SQLite copies it into a
 * zeroblob row took ~15% less CPU but ~15% longer per checkpoint, and the
 * training steps beside it did not measurably gain: bench/checkpoint/
 * RESULTS.md.) */
static int store_chunk(struct tr_ckpt_writer *w, const void *p, size_t n)
{
	struct tr_ckpt_hash hash;
	tr_ckpt_hash_start(&hash, &w->sha, p, n);
	int err = tr_store_begin(&w->f, true);
	int done = err == 0 && w->reused ? overwrite_chunk(w, p, n) : 0;
	if (done < 0)
		err = done;
	if (err == 0 && !done)
		err = insert_chunk(w, p, n);
	if (err == 0)
		err = tr_store_commit(&w->f);
	/* No rollback on failure: the file is deleted (without a journal,
	 * SQLite cannot roll it back anyway). */
	if (err == 0)
		start_writeback(w);
	tr_ckpt_hash_wait(&hash);
	if (err == 0)
		w->nchunks++;
	return err;
}

static int check_meta(const char *meta, bool *best, struct tr_error *e)
{
	*best = false;
	if (!meta)
		return 0;
	if (!tr_store_utf8_valid(meta))
		return tr_error_set(e, -EINVAL, 0, NULL, "checkpoint meta is not valid UTF-8");
	json_error_t jerr;
	json_t *j = json_loads(meta, 0, &jerr);
	if (!j)
		return tr_error_set(e, -EINVAL, 0, NULL, "checkpoint meta is not valid JSON: %s (column %d)", jerr.text,
				    jerr.column);
	bool object = json_is_object(j);
	const char *reason = json_string_value(json_object_get(j, "reason"));
	*best = reason && strcmp(reason, "best") == 0;
	json_decref(j);
	return object ? 0 : tr_error_set(e, -EINVAL, 0, NULL, "checkpoint meta must be a JSON object");
}

/* Inserts the incomplete row (w->id). */
static int insert_row(struct tr_ckpt_writer *w, int64_t epoch, const char *meta_json)
{
	int err = tr_store_begin(&w->c, true);
	if (err < 0)
		return err;
	sqlite3_stmt *st = tr_store_stmt(&w->c, sql_insert_ckpt);
	if (!st) {
		tr_store_rollback(&w->c);
		return -EIO;
	}
	sqlite3_bind_int64(st, 1, w->job_id);
	sqlite3_bind_int64(st, 2, w->step);
	sqlite3_bind_int64(st, 3, epoch);
	sqlite3_bind_double(st, 4, tr_store_now());
	if (meta_json)
		sqlite3_bind_text(st, 5, meta_json, -1, SQLITE_STATIC);
	int rc = sqlite3_step(st);
	sqlite3_reset(st);
	if (rc != SQLITE_DONE)
		err = rc == SQLITE_CONSTRAINT_FOREIGNKEY
			      ? tr_store_cfail(&w->c, -ENOENT, "job %lld does not exist", (long long)w->job_id)
			      : SQLFAIL(&w->c, rc, "insert a checkpoint");
	if (err == 0) {
		int64_t id = sqlite3_last_insert_rowid(w->c.db);
		err = tr_store_commit(&w->c);
		if (err == 0)
			w->id = id;
	}
	if (err < 0)
		tr_store_rollback(&w->c);
	return err;
}

/* Takes the spare over as the writer's file when there is one that is a
 * checkpoint file of this format (w->reused); anything else is deleted. */
static int take_spare(struct tr_ckpt_writer *w)
{
	char *spare = tr_ckpt_spare_path(w->dir);
	if (!spare)
		return tr_error_set(&w->cause, -ENOMEM, 0, NULL, "out of memory");
	int moved = rename(spare, w->path);
	free(spare);
	if (moved < 0)
		return 0; /* none (or another writer took it) */
	int64_t page = 0;
	int err = tr_ckpt_open_file(&w->f, w->path, false, true, &w->cause);
	if (err == 0)
		err = tr_store_exec(&w->f, tr_ckpt_file_settings);
	if (err == 0)
		err = tr_store_pragma_int(&w->f, "PRAGMA page_size", &page);
	sqlite3_stmt *st = err == 0 && page == FILE_PAGE_SIZE ? tr_store_stmt(&w->f, sql_chunk_totals) : NULL;
	if (st) {
		w->reused = sqlite3_step(st) == SQLITE_ROW;
		sqlite3_reset(st);
	}
	if (!w->reused) {
		tr_store_conn_close(&w->f);
		unlink(w->path);
	}
	return 0;
}

/* How long truncate_wal waits for readers on older snapshots, in 1 ms
 * polls: it holds off the store's writers meanwhile, and they wait at most
 * STORE_BUSY_TIMEOUT_MS. */
#define WAL_TRUNCATE_WAIT_MS 200

static int truncate_wait(void *arg, int tries)
{
	(void)arg;
	if (tries >= WAL_TRUNCATE_WAIT_MS)
		return 0;
	struct timespec ms = {0, 1000000};
	nanosleep(&ms, NULL);
	return 1;
}

/* The WAL counts against the cap, but it holds only copies of pages and
 * grows with every commit until it is reset at 64 MiB (storage/store.c):
 * measured as it is, the room for a checkpoint would depend on how long
 * the daemon has run since then, not on what the state holds.  So it is
 * copied into the database and truncated first, on a connection of its
 * own with a short wait; best effort: when a reader holds an older
 * snapshot longer, the WAL stays as it is and counts. */
static void truncate_wal(tr_store_t *s)
{
	struct conn c;
	if (tr_store_db_open(&c, s->path, SQLITE_OPEN_READWRITE, NULL) < 0)
		return;
	sqlite3_busy_handler(c.db, truncate_wait, NULL);
	/* A connection finds the WAL at its first read; until then its
	 * checkpoint does nothing. */
	sqlite3_exec(c.db, "PRAGMA schema_version", NULL, NULL, NULL);
	sqlite3_wal_checkpoint_v2(c.db, NULL, SQLITE_CHECKPOINT_TRUNCATE, NULL, NULL);
	tr_store_conn_close(&c);
}

/* Creates the checkpoint's file (after its row: a file without one is
 * garbage to tr_store_ckpt_sweep_files) with the room the cap leaves. */
static int create_file(tr_store_t *s, struct tr_ckpt_writer *w)
{
	w->path = tr_ckpt_file_path(w->dir, w->id);
	if (!w->path)
		return tr_error_set(&w->cause, -ENOMEM, 0, NULL, "out of memory");
	if (mkdir(w->dir, 0700) == 0) {
		/* The new directory's own name, in the store's directory. */
		int err = tr_ckpt_sync_dir_of(w->dir, &w->cause);
		if (err < 0)
			return err;
	} else if (errno != EEXIST) {
		return tr_error_set(&w->cause, -errno, 0, NULL, "%s: cannot create: %s", w->dir, strerror(errno));
	}
	unlink(w->path); /* ids are never reused (AUTOINCREMENT); in case */
	int err = take_spare(w);
	if (err == 0 && !w->reused)
		err = tr_ckpt_open_file(&w->f, w->path, true, true, &w->cause);
	if (err < 0)
		return err;
	if (s->max_bytes > 0) {
		/* What the database and the other files leave (a spare taken
		 * over counts as room); this file's own two header pages count
		 * too. */
		truncate_wal(s);
		struct stat st;
		int64_t own = w->reused && stat(w->path, &st) == 0 ? (int64_t)st.st_size : 0;
		int64_t room = s->max_bytes - (tr_ckpt_state_bytes(s) - own);
		char sql[64];
		snprintf(sql, sizeof sql, "PRAGMA max_page_count=%lld",
			 (long long)(room > 2 * FILE_PAGE_SIZE ? room / FILE_PAGE_SIZE : 2));
		err = tr_store_exec(&w->f, sql);
		if (err < 0)
			return err;
	}
	w->fd = open(w->path, O_RDONLY | O_CLOEXEC);
	if (w->fd < 0)
		return tr_error_set(&w->cause, -errno, 0, NULL, "%s: cannot open: %s", w->path, strerror(errno));
	return 0;
}

int tr_store_ckpt_begin(tr_store_t *s, int64_t job_id, int64_t step, int64_t epoch, const char *meta_json,
			tr_ckpt_writer_t **out, struct tr_error *e)
{
	if (!out)
		return tr_error_set(e, -EINVAL, 0, NULL, "checkpoint begin: no output pointer");
	*out = NULL;
	if (!s)
		return tr_error_set(e, -EINVAL, 0, NULL, "checkpoint begin: no store");
	/* Negative steps are refused: tr_store_ckpt_get reads step < 0 as
	 * "the newest", so such a checkpoint could never be fetched. */
	if (step < 0 || step > STORE_STEP_LIMIT || epoch < 0 || epoch > STORE_STEP_LIMIT)
		return tr_error_set(e, -EINVAL, 0, NULL,
				    "checkpoint of job %lld: step %lld and epoch %lld must be in [0, 2^62]",
				    (long long)job_id, (long long)step, (long long)epoch);
	bool best;
	int err = check_meta(meta_json, &best, e);
	if (err < 0)
		return err;

	struct tr_ckpt_writer *w = calloc(1, sizeof *w);
	if (!w)
		return tr_error_set(e, -ENOMEM, 0, NULL, "out of memory");
	w->job_id = job_id;
	w->step = step;
	w->best = best;
	w->fd = -1;
	tr_sha256_init(&w->sha);
	w->dir = tr_ckpt_files_dir(s);
	err = w->dir ? tr_ckpt_open_own(s, &w->c, true, &w->cause)
		     : tr_error_set(&w->cause, -ENOMEM, 0, NULL, "out of memory");
	if (err == 0)
		err = insert_row(w, epoch, meta_json);
	if (err == 0)
		err = create_file(s, w);
	if (err < 0) {
		if (err == -ENOSPC)
			tr_error_set(e, err, 0, NULL, "checkpoint of job %lld at step %lld: the database is full (%s)",
				     (long long)job_id, (long long)step, w->cause.message);
		else
			tr_error_set(e, err, 0, NULL, "%s", w->cause.message);
		tr_store_ckpt_abort(w);
		return err;
	}
	*out = w;
	return 0;
}

int tr_store_ckpt_write(tr_ckpt_writer_t *w, const void *data, size_t len, struct tr_error *e)
{
	if (!w)
		return tr_error_set(e, -EINVAL, 0, NULL, "checkpoint write: no writer");
	if (w->err)
		return writer_report(w, e);
	if (len && !data)
		return tr_error_set(e, -EINVAL, 0, NULL, "checkpoint write: NULL data");
	if ((uint64_t)len > (uint64_t)(INT64_MAX - w->bytes))
		return writer_fail(w, tr_error_set(&w->cause, -EFBIG, 0, NULL, "a checkpoint cannot exceed 2^63 bytes"),
				   e);
	const unsigned char *p = data;
	w->bytes += (int64_t)len;
	while (len) {
		int err;
		if (w->nbuf == 0 && len >= CHUNK_BYTES) {
			/* Whole chunks go from the caller's memory to SQLite. */
			err = store_chunk(w, p, CHUNK_BYTES);
			if (err < 0)
				return writer_fail(w, err, e);
			p += CHUNK_BYTES;
			len -= CHUNK_BYTES;
			continue;
		}
		if (!w->buf && !(w->buf = malloc(CHUNK_BYTES)))
			return writer_fail(w, tr_error_set(&w->cause, -ENOMEM, 0, NULL, "out of memory"), e);
		size_t n = CHUNK_BYTES - w->nbuf < len ? CHUNK_BYTES - w->nbuf : len;
		memcpy(w->buf + w->nbuf, p, n);
		w->nbuf += n;
		p += n;
		len -= n;
		if (w->nbuf == CHUNK_BYTES) {
			err = store_chunk(w, w->buf, CHUNK_BYTES);
			if (err < 0)
				return writer_fail(w, err, e);
			w->nbuf = 0;
		}
	}
	return 0;
}

static void writer_free(struct tr_ckpt_writer *w)
{
	close_file(w);
	tr_store_conn_close(&w->c);
	free(w->dir);
	free(w->path);
	free(w->buf);
	free(w);
}

/* What the file holds must be what was written: chunks 0..n-1, their
 * lengths summing to the byte count. */
static int check_chunks(struct tr_ckpt_writer *w)
{
	sqlite3_stmt *st = tr_store_stmt(&w->f, sql_chunk_totals);
	if (!st)
		return -EIO;
	int rc = sqlite3_step(st);
	if (rc != SQLITE_ROW) {
		int err = SQLFAIL(&w->f, rc, "count checkpoint chunks");
		sqlite3_reset(st);
		return err;
	}
	int64_t n = sqlite3_column_int64(st, 0), total = sqlite3_column_int64(st, 1), max = sqlite3_column_int64(st, 2);
	sqlite3_reset(st);
	if (n != w->nchunks || max != w->nchunks - 1 || total != w->bytes)
		return tr_store_cfail(
			&w->f, -EIO,
			"%s holds %lld bytes in %lld chunks (last %lld), but %lld bytes in %lld chunks were written",
			w->path, (long long)total, (long long)n, (long long)max, (long long)w->bytes,
			(long long)w->nchunks);
	return 0;
}

/* Closes the file and makes it durable: its bytes, then its name in the
 * directory (a new file's entry is not synced with its data). */
static int seal_file(struct tr_ckpt_writer *w)
{
	tr_store_conn_close(&w->f);
	if (fdatasync(w->fd) < 0)
		return tr_ckpt_sync_fail(w->path, &w->cause);
	return tr_ckpt_sync_dir(w->dir, &w->cause);
}

/* Hides (complete = 0) the job's complete checkpoints beyond the newest
 * keep - 1 other than w's own, inside the commit's transaction; their ids
 * go to *ids (malloc'd) for the purge after the commit. */
static int hide_pruned(struct tr_ckpt_writer *w, int keep, int64_t **ids, size_t *n)
{
	sqlite3_stmt *st = tr_store_stmt(&w->c, sql_prunable);
	if (!st)
		return -EIO;
	sqlite3_bind_int64(st, 1, w->job_id);
	sqlite3_bind_int64(st, 2, w->id);
	sqlite3_bind_int(st, 3, keep - 1);
	size_t cap = 0;
	int rc, err = 0;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		if (*n == cap) {
			cap = cap ? 2 * cap : 8;
			int64_t *v = realloc(*ids, cap * sizeof *v);
			if (!v) {
				err = tr_store_cfail(&w->c, -ENOMEM, "out of memory");
				break;
			}
			*ids = v;
		}
		(*ids)[(*n)++] = sqlite3_column_int64(st, 0);
	}
	if (err == 0 && rc != SQLITE_DONE)
		err = SQLFAIL(&w->c, rc, "find checkpoints to prune");
	sqlite3_reset(st);
	for (size_t i = 0; err == 0 && i < *n; i++) {
		st = tr_store_stmt(&w->c, sql_hide);
		if (!st)
			return -EIO;
		sqlite3_bind_int64(st, 1, (*ids)[i]);
		rc = sqlite3_step(st);
		sqlite3_reset(st);
		if (rc != SQLITE_DONE)
			err = SQLFAIL(&w->c, rc, "prune a checkpoint");
	}
	return err;
}

int tr_store_ckpt_commit(tr_ckpt_writer_t *w, const void *model_header, size_t model_header_len, int64_t params_offset,
			 int64_t params_bytes, int keep, struct tr_ckpt_row *out, struct tr_error *e)
{
	if (out)
		memset(out, 0, sizeof *out);
	if (!w)
		return tr_error_set(e, -EINVAL, 0, NULL, "checkpoint commit: no writer");
	int64_t *pruned = NULL;
	size_t npruned = 0;
	int err;
	if (w->err) {
		err = writer_report(w, e);
		goto cleanup;
	}
	if (params_offset < 0 || params_bytes < 0 || params_offset > w->bytes ||
	    params_bytes > w->bytes - params_offset) {
		err = writer_fail(w,
				  tr_error_set(&w->cause, -EINVAL, 0, NULL,
					       "parameter range [%lld, +%lld) is outside the %lld-byte blob",
					       (long long)params_offset, (long long)params_bytes, (long long)w->bytes),
				  e);
		goto cleanup;
	}
	if ((model_header_len && !model_header) || model_header_len > INT_MAX) {
		err = writer_fail(w,
				  tr_error_set(&w->cause, -EINVAL, 0, NULL, "bad model header (%zu bytes)",
					       model_header_len),
				  e);
		goto cleanup;
	}
	if (w->nbuf) {
		err = store_chunk(w, w->buf, w->nbuf);
		if (err < 0)
			goto fail;
		w->nbuf = 0;
	}
	/* A reused file's rows past this checkpoint's end (the spare held a
	 * larger one) go. */
	err = w->reused ? tr_ckpt_run_id(&w->f, sql_drop_chunks_from, w->nchunks, 0) : 0;
	if (err == 0)
		err = check_chunks(w);
	if (err == 0)
		err = seal_file(w);
	/* synchronous=FULL for the one transaction that makes the checkpoint
	 * visible: visible means durable. */
	if (err == 0)
		err = tr_store_exec(&w->c, "PRAGMA synchronous=FULL");
	if (err == 0)
		err = tr_store_begin(&w->c, true);
	if (err < 0)
		goto fail;
	char hex[65];
	tr_sha256_final_hex(&w->sha, hex);

	sqlite3_stmt *st = tr_store_stmt(&w->c, sql_complete);
	if (!st) {
		err = -EIO;
		goto fail;
	}
	sqlite3_bind_int64(st, 1, w->id);
	sqlite3_bind_int64(st, 2, w->bytes);
	sqlite3_bind_text(st, 3, hex, 64, SQLITE_STATIC);
	/* An empty header is stored as X'' (not NULL): length() is then 0. */
	sqlite3_bind_blob(st, 4, model_header_len ? model_header : "", (int)model_header_len, SQLITE_STATIC);
	sqlite3_bind_int64(st, 5, params_offset);
	sqlite3_bind_int64(st, 6, params_bytes);
	int rc = sqlite3_step(st);
	sqlite3_reset(st);
	if (rc != SQLITE_DONE) {
		err = step_fail(w, rc, "complete a checkpoint");
		goto fail;
	}
	if (sqlite3_changes(w->c.db) != 1) {
		err = tr_store_cfail(&w->c, -ENOENT,
				     "the checkpoint was deleted while being written (was job %lld deleted?)",
				     (long long)w->job_id);
		goto fail;
	}

	/* Before pruning: the previous best becomes prunable. */
	if (w->best) {
		st = tr_store_stmt(&w->c, sql_set_best);
		if (!st) {
			err = -EIO;
			goto fail;
		}
		sqlite3_bind_int64(st, 1, w->job_id);
		sqlite3_bind_int64(st, 2, w->id);
		rc = sqlite3_step(st);
		sqlite3_reset(st);
		if (rc != SQLITE_DONE) {
			err = step_fail(w, rc, "mark the best checkpoint");
			goto fail;
		}
	}
	if (keep > 0) {
		err = hide_pruned(w, keep, &pruned, &npruned);
		if (err < 0)
			goto fail;
	}

	if (out) {
		st = tr_store_stmt(&w->c, sql_row_by_id);
		if (!st) {
			err = -EIO;
			goto fail;
		}
		sqlite3_bind_int64(st, 1, w->id);
		rc = sqlite3_step(st);
		err = rc == SQLITE_ROW ? tr_ckpt_read_row(&w->c, st, out)
				       : SQLFAIL(&w->c, rc, "read the checkpoint back");
		sqlite3_reset(st);
		if (err < 0)
			goto fail;
	}
	err = tr_store_commit(&w->c);
	if (err < 0)
		goto fail;
	w->id = 0; /* committed: nothing left to discard */
	/* The commit has succeeded whatever happens here: what a failed purge
	 * leaves is hidden, and deleted at the next open.  Its short
	 * transactions need no sync each. */
	tr_store_exec(&w->c, "PRAGMA synchronous=NORMAL");
	for (size_t i = 0; i < npruned; i++)
		tr_ckpt_purge(w->dir, &w->c, pruned[i], true);
	goto cleanup;

fail:
	tr_store_rollback(&w->c);
	if (out)
		tr_ckpt_row_finish(out);
	err = writer_fail(w, err, e);
cleanup:
	free(pruned);
	writer_free(w);
	return err;
}

void tr_store_ckpt_abort(tr_ckpt_writer_t *w)
{
	if (!w)
		return;
	discard(w);
	writer_free(w);
}
