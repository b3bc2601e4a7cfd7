/* Checkpoints (storage/checkpoints.h): a blob split into 4 MiB chunks,
 * streamed in by a writer and out by a reader.
 *
 * Where the bytes live: each checkpoint's chunks are the rows of a SQLite
 * database of its own, "<store path>-checkpoints/<id>.sqlite" (table
 * chunks: seq, data), while its row in the store (checkpoints: step, size,
 * SHA-256, complete flag) says whether it exists.  Such a file is written
 * once and never changed, so it needs no journal: it is created with
 * journal_mode=OFF and 64 KiB pages, and a failed or crashed write is
 * simply deleted.  That writes every byte once (SQLite's page, the page
 * cache, the disk); through the store's WAL it went there, then into the
 * database file, and cost the training steps beside it about twice the
 * memory traffic and CPU (bench/checkpoint/RESULTS.md).  Pruning deletes a
 * file instead of freeing thousands of pages inside a transaction.
 * Checkpoints written before (chunk_file = 0) keep their chunks in the
 * store's checkpoint_chunks table and are read and deleted as before.
 *
 * Writing: begin inserts the checkpoint row with complete = 0 in one short
 * transaction, then creates the file; every full chunk is committed in the
 * file as it comes.  The commit stores the last partial chunk, checks what
 * the file holds against what was written, syncs the file (and its
 * directory), then in one store transaction stores the SHA-256 (computed
 * as the bytes came in), flips complete and hides the checkpoints it
 * prunes; then deletes the pruned ones.  So a visible checkpoint is a
 * durable one.  Any failure discards the partial checkpoint at once, so a
 * full disk is given back its space before the caller even calls abort;
 * a failed discard is finished by the next tr_store_open, which deletes
 * incomplete rows and files without a row (tr_store_ckpt_sweep).
 *
 * Space: tr_store_options.max_bytes caps the store and the checkpoint
 * files together: a new file may take what the others and the database
 * leave (SQLITE_FULL past that, like a full disk).
 *
 * Deleting: a checkpoint leaves in two steps.  One short transaction hides
 * it (complete = 0: the commit does this for the checkpoints it prunes,
 * atomically with completing the new one); then its file is unlinked (a
 * reader that has it open keeps reading) or, for an older checkpoint, its
 * chunks are deleted a few per transaction; the row goes last.  What a
 * crash leaves hidden is deleted at the next open.
 *
 * Reading: a reader opens the file read-only (or, for an older checkpoint,
 * holds a read transaction on the store), checks the chunk layout once and
 * then reads with incremental blob I/O (sqlite3_blob_reopen moves the
 * handle between chunks without compiling a statement), straight into the
 * caller's buffer.
 *
 * Hashing: a chunk is hashed on a short-lived helper thread while the
 * calling thread inserts it (or, in tr_store_ckpt_load, reads the next
 * one): both only read the bytes, and the join orders the digest state.
 * With the SHA extensions (storage/sha256.c) the hash takes a fraction of
 * SQLite's time on a chunk; without them it is the slower of the two.
 */
#include "storage/checkpoints.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storage/internal.h"
#include "storage/sha256.h"

#define CHUNK_BYTES ((size_t)4 << 20)
/* Below this a helper thread costs more than it saves. */
#define BG_HASH_MIN ((size_t)256 << 10)
/* Chunks of an older (chunk_file = 0) checkpoint deleted per transaction:
 * freeing a chunk reads each of its overflow pages (about 20 ms per
 * 4 MiB), and the write lock is held meanwhile. */
#define PURGE_CHUNKS 2
/* Checkpoint files: large pages make SQLite's work per chunk small (64
 * overflow pages per 4 MiB); a cache of 8 MiB holds one chunk's pages with
 * room to spare, so no page is spilled before the chunk's commit and then
 * written again. */
#define FILE_PAGE_SIZE 65536
#define FILE_PAGE_SIZE_SQL "65536" /* the same, for the pragma below */
#define FILE_SETTINGS                                                                     \
	"PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF; PRAGMA cache_size=-8192;" \
	" PRAGMA secure_delete=OFF;"
/* secure_delete=OFF: rows of a reused file that are replaced or left over
 * are freed without zeroing their pages (Debian's SQLite zeroes them). */
static const char file_settings[] = FILE_SETTINGS;
static const char file_setup[] = "PRAGMA page_size=" FILE_PAGE_SIZE_SQL "; " FILE_SETTINGS
				 " CREATE TABLE chunks (seq INTEGER PRIMARY KEY, data BLOB NOT NULL)";
static const char sql_chunk_len[] = "SELECT length(data) FROM chunks WHERE seq = ?1";
static const char sql_drop_chunk[] = "DELETE FROM chunks WHERE seq = ?1";
static const char sql_drop_chunks_from[] = "DELETE FROM chunks WHERE seq >= ?1";

/* length(model_header) rather than the header itself: rows are listed
 * often and the header is only needed for a weights-only download. */
#define CKPT_COLS                                                                                        \
	"id, job_id, step, epoch, created_at, bytes, sha256, params_offset, params_bytes, " \
	"length(model_header), meta, best"

static const char sql_insert_ckpt[] = "INSERT INTO checkpoints (job_id, step, epoch, created_at, meta, complete, chunk_file)"
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
static const char sql_set_best[] = "UPDATE checkpoints SET best = (id = ?2) WHERE job_id = ?1 AND (best = 1 OR id = ?2)";
/* The best checkpoint is kept whatever `keep` says. */
static const char sql_prunable[] = "SELECT id FROM checkpoints WHERE job_id = ?1 AND complete = 1 AND id <> ?2"
				   " AND best = 0"
				   " ORDER BY step DESC, id DESC LIMIT -1 OFFSET ?3";
static const char sql_hide[] = "UPDATE checkpoints SET complete = 0 WHERE id = ?1";
static const char sql_purge_chunks[] = "DELETE FROM checkpoint_chunks WHERE id IN"
				       " (SELECT id FROM checkpoint_chunks WHERE checkpoint_id = ?1 ORDER BY seq LIMIT ?2)";
static const char sql_purge_row[] = "DELETE FROM checkpoints WHERE id = ?1 AND complete = 0";
static const char sql_incomplete[] = "SELECT id FROM checkpoints WHERE complete = 0";
static const char sql_has_file[] = "SELECT 1 FROM checkpoints WHERE id = ?1 AND chunk_file = 1";
static const char sql_row_by_id[] = "SELECT " CKPT_COLS " FROM checkpoints WHERE id = ?1";
static const char sql_list[] = "SELECT " CKPT_COLS " FROM checkpoints WHERE job_id = ?1 AND complete = 1"
			       " ORDER BY step DESC, id DESC";
static const char sql_get_step[] = "SELECT " CKPT_COLS " FROM checkpoints"
				   " WHERE job_id = ?1 AND step = ?2 AND complete = 1 ORDER BY id DESC LIMIT 1";
static const char sql_get_best[] = "SELECT " CKPT_COLS " FROM checkpoints WHERE job_id = ?1 AND complete = 1"
				   " AND best = 1 ORDER BY step DESC, id DESC LIMIT 1";
static const char sql_get_newest[] = "SELECT " CKPT_COLS " FROM checkpoints WHERE job_id = ?1 AND complete = 1"
				     " ORDER BY step DESC, id DESC LIMIT 1";
static const char sql_header[] = "SELECT model_header FROM checkpoints WHERE id = ?1 AND complete = 1";
static const char sql_reader_row[] = "SELECT job_id, step, bytes, sha256, chunk_file FROM checkpoints"
				     " WHERE id = ?1 AND complete = 1";
static const char sql_reader_chunks[] = "SELECT seq, id, length(data) FROM checkpoint_chunks"
					" WHERE checkpoint_id = ?1 ORDER BY seq";
static const char sql_reader_file_chunks[] = "SELECT seq, seq, length(data) FROM chunks ORDER BY seq";

struct tr_ckpt_writer {
	struct conn c; /* the store: the checkpoint's row; opened at begin, closed at commit or abort */
	struct conn f; /* the checkpoint's file */
	char *dir;     /* of the store's checkpoint files (the writer never touches the store object after begin) */
	char *path;    /* of the file */
	int fd;        /* the file, for writeback hints and the final sync; -1 = none */
	bool reused;   /* the file was the spare: its rows are overwritten */
	int64_t id;    /* the incomplete row; 0 once committed or discarded */
	int64_t job_id, step;
	int64_t bytes;   /* appended so far */
	int64_t nchunks; /* chunks stored */
	unsigned char *buf; /* the chunk being filled; allocated when first needed */
	size_t nbuf;
	struct tr_sha256 sha;
	bool best; /* meta says "reason": "best" */
	int err; /* first failure: every later call repeats it */
	char errmsg[512];
};

struct tr_ckpt_reader {
	struct conn c; /* the store: a read transaction while f is unused */
	struct conn f; /* the checkpoint's file, when it has one */
	sqlite3_blob *blob;
	int64_t cur; /* the chunk blob points at; -1 = none */
	int64_t id, job_id, step, bytes, nchunks;
	int64_t *rowids; /* of chunk 0 .. nchunks-1 */
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

/* Reads a row selected with CKPT_COLS. */
static int read_row(sqlite3_stmt *st, struct tr_ckpt_row *r)
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
		return tr_store_fail(-ENOMEM, "out of memory");
	r->best = sqlite3_column_int(st, 11) != 0;
	return 0;
}

/* ---- hashing beside I/O ---------------------------------------------------- */

struct bg_hash {
	pthread_t thread;
	bool running;
	struct tr_sha256 *sha;
	const void *p;
	size_t n;
};

static void *bg_hash_main(void *arg)
{
	struct bg_hash *h = arg;
	pthread_setname_np(pthread_self(), "tr-ckpt-hash");
	tr_sha256_update(h->sha, h->p, h->n);
	return NULL;
}

/* Feeds p[0, n) to sha, on a helper thread when that is worth it (and
 * possible: without one the bytes are hashed here).  Until bg_hash_wait,
 * the bytes must not change and sha must not be touched. */
static void bg_hash_start(struct bg_hash *h, struct tr_sha256 *sha, const void *p, size_t n)
{
	*h = (struct bg_hash){.sha = sha, .p = p, .n = n};
	if (n >= BG_HASH_MIN && pthread_create(&h->thread, NULL, bg_hash_main, h) == 0)
		h->running = true;
	else
		tr_sha256_update(sha, p, n);
}

static void bg_hash_wait(struct bg_hash *h)
{
	if (h->running)
		pthread_join(h->thread, NULL);
	h->running = false;
}

/* ---- connections ------------------------------------------------------------- */

/* Opens a connection of the checkpoint code's own on the store, with the
 * store's settings (tr_store_conn_open) and, when it writes, its size cap.
 * Readers never allocate pages and skip that. */
static int open_own(tr_store_t *s, struct conn *c, bool writes)
{
	int err = tr_store_conn_open(c, s->path);
	if (err < 0 || !writes)
		return err;
	err = tr_store_set_max_bytes(c, s->max_bytes);
	if (err < 0)
		tr_store_conn_close(c);
	return err;
}

/* The directory of the store's checkpoint files, "<store path>-checkpoints"
 * (malloc'd; NULL when out of memory). */
static char *files_dir(const tr_store_t *s)
{
	char *p = NULL;
	return asprintf(&p, "%s-checkpoints", s->path) < 0 ? NULL : p;
}

/* Checkpoint id's file in dir (malloc'd; NULL when out of memory). */
static char *file_path(const char *dir, int64_t id)
{
	char *p = NULL;
	return asprintf(&p, "%s/%lld.sqlite", dir, (long long)id) < 0 ? NULL : p;
}

/* A failed sync's errno as a result code: out of space or quota reads
 * as a full disk (the "database is full" message). */
static int sync_fail(const char *path)
{
	int e = errno == EDQUOT ? ENOSPC : errno ? errno : EIO;
	return tr_store_fail(-e, "%s: cannot sync: %s", path, strerror(errno));
}

/* Syncs directory dir: the names it holds. */
static int sync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int err = fd >= 0 && fsync(fd) == 0 ? 0 : sync_fail(dir);
	if (fd >= 0)
		close(fd);
	return err;
}

/* Syncs the directory that holds path. */
static int sync_dir_of(const char *path)
{
	char *parent = strdup(path);
	if (!parent)
		return tr_store_fail(-ENOMEM, "out of memory");
	char *slash = strrchr(parent, '/');
	if (slash == parent)
		slash[1] = 0; /* "/x": the root */
	else if (slash)
		*slash = 0;
	else
		strcpy(parent, ".");
	int err = sync_dir(parent);
	free(parent);
	return err;
}

/* Opens a checkpoint file: read-only for readers (it never changes once
 * complete), created empty with file_setup for the writer, or (create
 * false, write true) an existing one for the writer to overwrite. */
static int open_file(struct conn *c, const char *path, bool create, bool write)
{
	int flags = create  ? SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE
		    : write ? SQLITE_OPEN_READWRITE
			    : SQLITE_OPEN_READONLY;
	int err = tr_store_db_open(c, path, flags);
	if (err == 0 && create)
		err = tr_store_exec(c, file_setup);
	if (err < 0)
		tr_store_conn_close(c);
	return err;
}

/* Bytes the store's database, its WAL and its checkpoint files take now. */
static int64_t state_bytes(const tr_store_t *s)
{
	int64_t total = 0;
	struct stat st;
	char *wal = NULL;
	if (stat(s->path, &st) == 0)
		total += st.st_size;
	if (asprintf(&wal, "%s-wal", s->path) >= 0 && stat(wal, &st) == 0)
		total += st.st_size;
	free(wal);
	char *dir = files_dir(s);
	DIR *d = dir ? opendir(dir) : NULL;
	struct dirent *e;
	while (d && (e = readdir(d)))
		if (e->d_name[0] != '.' && fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0)
			total += st.st_size;
	if (d)
		closedir(d);
	free(dir);
	return total;
}

/* ---- deleting ------------------------------------------------------------------ */

/* Runs a statement that returns no rows with ?1 = id (and ?2 = arg when
 * it has a second parameter). */
static int run_id(struct conn *c, const char *sql, int64_t id, int64_t arg)
{
	sqlite3_stmt *st = tr_store_stmt(c, sql);
	if (!st)
		return -EIO;
	sqlite3_bind_int64(st, 1, id);
	if (sqlite3_bind_parameter_count(st) >= 2)
		sqlite3_bind_int64(st, 2, arg);
	int rc = sqlite3_step(st);
	sqlite3_reset(st);
	return rc == SQLITE_DONE ? 0 : SQLFAIL(c, rc, sql);
}

/* run_id in a write transaction of its own; *changes (may be NULL)
 * receives the row count. */
static int exec_id(struct conn *c, const char *sql, int64_t id, int64_t arg, int *changes)
{
	int err = tr_store_begin(c, true);
	if (err < 0)
		return err;
	err = run_id(c, sql, id, arg);
	if (changes)
		*changes = sqlite3_changes(c->db);
	if (err == 0)
		err = tr_store_commit(c);
	if (err < 0)
		tr_store_rollback(c);
	return err;
}

/* Unlinks checkpoint id's file in dir; one that is not there is fine. */
static int unlink_file(const char *dir, int64_t id)
{
	char *path = file_path(dir, id);
	if (!path)
		return tr_store_fail(-ENOMEM, "out of memory");
	int err = unlink(path) == 0 || errno == ENOENT ? 0 : tr_store_fail(-errno, "%s: cannot delete: %s", path, strerror(errno));
	free(path);
	return err;
}

/* ---- the spare file ---------------------------------------------------------------- */

/* A pruned checkpoint's file is not deleted but kept as "spare.sqlite",
 * and the next checkpoint is written over it in place: its page-cache
 * pages and disk blocks are reused instead of fresh ones allocated (and
 * the old ones freed).  For a job writing the same size every time that
 * saves a good part of the kernel's work per checkpoint (on the
 * benchmark's VM, where fresh memory is dear: ~15-25 ms of CPU and half the
 * wall time per 100 MB; bench/checkpoint/RESULTS.md).  One spare at most;
 * it holds no checkpoint (its row is gone), and it goes when the
 * checkpointer idles (tr_store_ckpt_drop_spare) or at the next open.
 *
 * A file a reader has open is never made the spare (a download must not
 * see its bytes overwritten): readers register the id before they open
 * the file and until they close it, and the pruner looks under the same
 * lock.  The table is process-wide and keyed by id alone: a daemon has one
 * store, and an id of another store only makes the pruner delete a file it
 * could have kept. */
static pthread_mutex_t readers_lock = PTHREAD_MUTEX_INITIALIZER;
struct reader_count {
	int64_t id;
	int count;
};
static struct reader_count *readers;
static size_t nreaders, capreaders;

/* id's entry in the readers table, or nreaders (under readers_lock). */
static size_t reader_index(int64_t id)
{
	size_t i = 0;
	while (i < nreaders && readers[i].id != id)
		i++;
	return i;
}

static int reader_register(int64_t id)
{
	int err = 0;
	pthread_mutex_lock(&readers_lock);
	size_t i = reader_index(id);
	if (i == nreaders) {
		if (nreaders == capreaders) {
			size_t cap = capreaders ? 2 * capreaders : 8;
			void *v = realloc(readers, cap * sizeof *readers);
			if (!v)
				err = tr_store_fail(-ENOMEM, "out of memory");
			else
				readers = v, capreaders = cap;
		}
		if (err == 0)
			readers[nreaders++] = (struct reader_count){.id = id, .count = 0};
	}
	if (err == 0)
		readers[i].count++;
	pthread_mutex_unlock(&readers_lock);
	return err;
}

static void reader_unregister(int64_t id)
{
	pthread_mutex_lock(&readers_lock);
	size_t i = reader_index(id);
	if (i < nreaders && --readers[i].count == 0)
		readers[i] = readers[--nreaders];
	pthread_mutex_unlock(&readers_lock);
}

static char *spare_path(const char *dir)
{
	char *p = NULL;
	return asprintf(&p, "%s/spare.sqlite", dir) < 0 ? NULL : p;
}

/* Makes checkpoint id's file (its row hidden) the spare, or deletes it
 * when a reader has it open. */
static int retire_file(const char *dir, int64_t id)
{
	char *path = file_path(dir, id), *spare = spare_path(dir);
	int err = 0;
	if (!path || !spare) {
		err = tr_store_fail(-ENOMEM, "out of memory");
	} else {
		pthread_mutex_lock(&readers_lock);
		bool open = reader_index(id) < nreaders;
		if (open || rename(path, spare) < 0)
			err = unlink_file(dir, id);
		pthread_mutex_unlock(&readers_lock);
	}
	free(path);
	free(spare);
	return err;
}

void tr_store_ckpt_drop_spare(tr_store_t *s)
{
	char *dir = files_dir(s), *spare = dir ? spare_path(dir) : NULL;
	if (spare)
		unlink(spare);
	free(spare);
	free(dir);
}

/* Deletes a hidden (complete = 0) checkpoint: its file (or, retire = true,
 * makes it the spare), or its chunks in the store PURGE_CHUNKS per
 * transaction, then the row.  A file that cannot be deleted keeps its row,
 * so that the next open tries again. */
static int purge(const char *dir, struct conn *c, int64_t id, bool retire)
{
	int err = !dir ? tr_store_fail(-ENOMEM, "out of memory") : retire ? retire_file(dir, id) : unlink_file(dir, id);
	if (err < 0)
		return err;
	for (;;) {
		int n = 0;
		err = exec_id(c, sql_purge_chunks, id, PURGE_CHUNKS, &n);
		if (err < 0)
			return err;
		if (n == 0)
			return exec_id(c, sql_purge_row, id, 0, NULL);
	}
}

/* Unlinks the checkpoint files no row names (a file is only created after
 * its row is committed, so a file without a row is never one being
 * written). */
void tr_store_ckpt_sweep_files(tr_store_t *s, struct conn *c)
{
	char *dir = files_dir(s);
	DIR *d = dir ? opendir(dir) : NULL;
	struct dirent *e;
	while (d && (e = readdir(d))) {
		char *end;
		errno = 0;
		long long id = strtoll(e->d_name, &end, 10);
		if (errno || id <= 0 || strcmp(end, ".sqlite") != 0)
			continue; /* not ours */
		sqlite3_stmt *st = tr_store_stmt(c, sql_has_file);
		if (!st)
			break;
		sqlite3_bind_int64(st, 1, id);
		int rc = sqlite3_step(st);
		sqlite3_reset(st);
		if (rc == SQLITE_DONE)
			unlinkat(dirfd(d), e->d_name, 0);
	}
	if (d)
		closedir(d);
	free(dir);
}

int tr_store_ckpt_sweep(tr_store_t *s, struct conn *c)
{
	sqlite3_stmt *st = tr_store_stmt(c, sql_incomplete);
	if (!st)
		return -EIO;
	char *dir = files_dir(s);
	if (!dir) {
		sqlite3_reset(st);
		return tr_store_fail(-ENOMEM, "out of memory");
	}
	int rc;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW)
		unlink_file(dir, sqlite3_column_int64(st, 0));
	sqlite3_reset(st);
	free(dir);
	if (rc != SQLITE_DONE)
		return SQLFAIL(c, rc, "find incomplete checkpoints");
	/* The chunks of older checkpoints cascade. */
	int err = tr_store_exec(c, "DELETE FROM checkpoints WHERE complete = 0");
	if (err == 0)
		tr_store_ckpt_sweep_files(s, c);
	tr_store_ckpt_drop_spare(s);
	return err;
}

/* ---- writing ------------------------------------------------------------------- */

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

/* Deletes the incomplete checkpoint.  Keeps the calling thread's error
 * message: it runs on failure paths, where that message is the one the
 * caller needs. */
static int discard(struct tr_ckpt_writer *w)
{
	drop_file(w);
	if (!w->id || !w->c.db)
		return 0;
	char saved[512];
	tr_store_errcpy(saved, sizeof saved);
	tr_store_rollback(&w->c);
	/* A failed commit may have left FULL. */
	tr_store_exec(&w->c, "PRAGMA synchronous=NORMAL");
	int err = purge(w->dir, &w->c, w->id, false);
	/* Not retried: tr_store_open deletes what is left. */
	w->id = 0;
	tr_store_fail(0, "%s", saved);
	return err;
}

/* Every failure of a writer ends here: discards the partial checkpoint,
 * words the message (a full disk or cap says so), and makes the failure
 * sticky.  Returns err. */
static int writer_fail(struct tr_ckpt_writer *w, int err)
{
	char cause[512];
	tr_store_errcpy(cause, sizeof cause);
	bool discarded = discard(w) == 0;
	const char *fate = discarded ? "the partial checkpoint was deleted"
				     : "the partial checkpoint will be deleted at the next open";
	if (err == -ENOSPC)
		tr_store_fail(err, "checkpoint of job %lld at step %lld: the database is full (%s); %s, earlier checkpoints are intact",
			      (long long)w->job_id, (long long)w->step, cause, fate);
	else
		tr_store_fail(err, "checkpoint of job %lld at step %lld: %s; %s", (long long)w->job_id,
			      (long long)w->step, cause, fate);
	w->err = err;
	tr_store_errcpy(w->errmsg, sizeof w->errmsg);
	return err;
}

/* Maps a failed step on the store's checkpoint tables: a foreign key
 * failure means the row it hangs from is gone. */
static int step_fail(struct tr_ckpt_writer *w, int rc, const char *what)
{
	if (rc == SQLITE_CONSTRAINT_FOREIGNKEY)
		return tr_store_fail(-ENOENT, "the checkpoint was deleted while being written (was job %lld deleted?)",
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
	return len < 0 ? 0 : run_id(&w->f, sql_drop_chunk, w->nchunks, 0);
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
	struct bg_hash hash;
	bg_hash_start(&hash, &w->sha, p, n);
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
	bg_hash_wait(&hash);
	if (err == 0)
		w->nchunks++;
	return err;
}

static int check_meta(const char *meta, bool *best)
{
	*best = false;
	if (!meta)
		return 0;
	if (!tr_store_utf8_valid(meta))
		return tr_store_fail(-EINVAL, "checkpoint meta is not valid UTF-8");
	json_error_t jerr;
	json_t *j = json_loads(meta, 0, &jerr);
	if (!j)
		return tr_store_fail(-EINVAL, "checkpoint meta is not valid JSON: %s (column %d)", jerr.text,
				     jerr.column);
	bool object = json_is_object(j);
	const char *reason = json_string_value(json_object_get(j, "reason"));
	*best = reason && strcmp(reason, "best") == 0;
	json_decref(j);
	return object ? 0 : tr_store_fail(-EINVAL, "checkpoint meta must be a JSON object");
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
		err = rc == SQLITE_CONSTRAINT_FOREIGNKEY ? tr_store_fail(-ENOENT, "job %lld does not exist", (long long)w->job_id)
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
	char *spare = spare_path(w->dir);
	if (!spare)
		return tr_store_fail(-ENOMEM, "out of memory");
	int moved = rename(spare, w->path);
	free(spare);
	if (moved < 0)
		return 0; /* none (or another writer took it) */
	int64_t page = 0;
	int err = open_file(&w->f, w->path, false, true);
	if (err == 0)
		err = tr_store_exec(&w->f, file_settings);
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

/* Creates the checkpoint's file (after its row: a file without one is
 * garbage to tr_store_ckpt_sweep_files) with the room the cap leaves. */
static int create_file(tr_store_t *s, struct tr_ckpt_writer *w)
{
	w->path = file_path(w->dir, w->id);
	if (!w->path)
		return tr_store_fail(-ENOMEM, "out of memory");
	if (mkdir(w->dir, 0700) == 0) {
		/* The new directory's own name, in the store's directory. */
		int err = sync_dir_of(w->dir);
		if (err < 0)
			return err;
	} else if (errno != EEXIST) {
		return tr_store_fail(-errno, "%s: cannot create: %s", w->dir, strerror(errno));
	}
	unlink(w->path); /* ids are never reused (AUTOINCREMENT); in case */
	int err = take_spare(w);
	if (err == 0 && !w->reused)
		err = open_file(&w->f, w->path, true, true);
	if (err < 0)
		return err;
	if (s->max_bytes > 0) {
		/* What the database and the other files leave (a spare taken
		 * over counts as room); this file's own two header pages count
		 * too. */
		struct stat st;
		int64_t own = w->reused && stat(w->path, &st) == 0 ? (int64_t)st.st_size : 0;
		int64_t room = s->max_bytes - (state_bytes(s) - own);
		char sql[64];
		snprintf(sql, sizeof sql, "PRAGMA max_page_count=%lld",
			 (long long)(room > 2 * FILE_PAGE_SIZE ? room / FILE_PAGE_SIZE : 2));
		err = tr_store_exec(&w->f, sql);
		if (err < 0)
			return err;
	}
	w->fd = open(w->path, O_RDONLY | O_CLOEXEC);
	if (w->fd < 0)
		return tr_store_fail(-errno, "%s: cannot open: %s", w->path, strerror(errno));
	return 0;
}

int tr_store_ckpt_begin(tr_store_t *s, int64_t job_id, int64_t step, int64_t epoch, const char *meta_json,
			tr_ckpt_writer_t **out)
{
	if (!out)
		return tr_store_fail(-EINVAL, "checkpoint begin: no output pointer");
	*out = NULL;
	if (!s)
		return tr_store_fail(-EINVAL, "checkpoint begin: no store");
	/* Negative steps are refused: tr_store_ckpt_get reads step < 0 as
	 * "the newest", so such a checkpoint could never be fetched. */
	if (step < 0 || step > STORE_STEP_LIMIT || epoch < 0 || epoch > STORE_STEP_LIMIT)
		return tr_store_fail(-EINVAL, "checkpoint of job %lld: step %lld and epoch %lld must be in [0, 2^62]",
				     (long long)job_id, (long long)step, (long long)epoch);
	bool best;
	int err = check_meta(meta_json, &best);
	if (err < 0)
		return err;

	struct tr_ckpt_writer *w = calloc(1, sizeof *w);
	if (!w)
		return tr_store_fail(-ENOMEM, "out of memory");
	w->job_id = job_id;
	w->step = step;
	w->best = best;
	w->fd = -1;
	tr_sha256_init(&w->sha);
	w->dir = files_dir(s);
	err = w->dir ? open_own(s, &w->c, true) : tr_store_fail(-ENOMEM, "out of memory");
	if (err == 0)
		err = insert_row(w, epoch, meta_json);
	if (err == 0)
		err = create_file(s, w);
	if (err < 0) {
		char cause[512];
		tr_store_errcpy(cause, sizeof cause);
		tr_store_ckpt_abort(w);
		if (err == -ENOSPC)
			return tr_store_fail(err, "checkpoint of job %lld at step %lld: the database is full (%s)",
					     (long long)job_id, (long long)step, cause);
		return tr_store_fail(err, "%s", cause);
	}
	*out = w;
	return 0;
}

int tr_store_ckpt_write(tr_ckpt_writer_t *w, const void *data, size_t len)
{
	if (!w)
		return tr_store_fail(-EINVAL, "checkpoint write: no writer");
	if (w->err)
		return tr_store_fail(w->err, "%s", w->errmsg);
	if (len && !data)
		return tr_store_fail(-EINVAL, "checkpoint write: NULL data");
	if ((uint64_t)len > (uint64_t)(INT64_MAX - w->bytes))
		return writer_fail(w, tr_store_fail(-EFBIG, "a checkpoint cannot exceed 2^63 bytes"));
	const unsigned char *p = data;
	w->bytes += (int64_t)len;
	while (len) {
		int err;
		if (w->nbuf == 0 && len >= CHUNK_BYTES) {
			/* Whole chunks go from the caller's memory to SQLite. */
			err = store_chunk(w, p, CHUNK_BYTES);
			if (err < 0)
				return writer_fail(w, err);
			p += CHUNK_BYTES;
			len -= CHUNK_BYTES;
			continue;
		}
		if (!w->buf && !(w->buf = malloc(CHUNK_BYTES)))
			return writer_fail(w, tr_store_fail(-ENOMEM, "out of memory"));
		size_t n = CHUNK_BYTES - w->nbuf < len ? CHUNK_BYTES - w->nbuf : len;
		memcpy(w->buf + w->nbuf, p, n);
		w->nbuf += n;
		p += n;
		len -= n;
		if (w->nbuf == CHUNK_BYTES) {
			err = store_chunk(w, w->buf, CHUNK_BYTES);
			if (err < 0)
				return writer_fail(w, err);
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
		return tr_store_fail(-EIO, "%s holds %lld bytes in %lld chunks (last %lld), but %lld bytes in %lld chunks were written",
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
		return sync_fail(w->path);
	return sync_dir(w->dir);
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
				err = tr_store_fail(-ENOMEM, "out of memory");
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

int tr_store_ckpt_commit(tr_ckpt_writer_t *w, const void *model_header, size_t model_header_len,
			 int64_t params_offset, int64_t params_bytes, int keep, struct tr_ckpt_row *out)
{
	if (out)
		memset(out, 0, sizeof *out);
	if (!w)
		return tr_store_fail(-EINVAL, "checkpoint commit: no writer");
	int64_t *pruned = NULL;
	size_t npruned = 0;
	int err;
	if (w->err) {
		err = tr_store_fail(w->err, "%s", w->errmsg);
		goto cleanup;
	}
	if (params_offset < 0 || params_bytes < 0 || params_offset > w->bytes || params_bytes > w->bytes - params_offset) {
		err = writer_fail(w, tr_store_fail(-EINVAL, "parameter range [%lld, +%lld) is outside the %lld-byte blob",
						   (long long)params_offset, (long long)params_bytes,
						   (long long)w->bytes));
		goto cleanup;
	}
	if ((model_header_len && !model_header) || model_header_len > INT_MAX) {
		err = writer_fail(w, tr_store_fail(-EINVAL, "bad model header (%zu bytes)", model_header_len));
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
	err = w->reused ? run_id(&w->f, sql_drop_chunks_from, w->nchunks, 0) : 0;
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
		err = tr_store_fail(-ENOENT, "the checkpoint was deleted while being written (was job %lld deleted?)",
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
		err = rc == SQLITE_ROW ? read_row(st, out) : SQLFAIL(&w->c, rc, "read the checkpoint back");
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
		purge(w->dir, &w->c, pruned[i], true);
	goto cleanup;

fail:
	tr_store_rollback(&w->c);
	if (out)
		tr_ckpt_row_finish(out);
	err = writer_fail(w, err);
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

/* ---- listing ------------------------------------------------------------------- */

int tr_store_ckpt_list(tr_store_t *s, int64_t job_id, struct tr_ckpt_row **rows, int *count)
{
	*rows = NULL;
	*count = 0;
	struct conn *c = tr_store_conn_get(s);
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
				err = tr_store_fail(-ENOMEM, "out of memory");
				goto cleanup;
			}
			v = nv;
		}
		err = read_row(st, &v[n]);
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

int tr_store_ckpt_get(tr_store_t *s, int64_t job_id, int64_t step, struct tr_ckpt_row *out)
{
	memset(out, 0, sizeof *out);
	struct conn *c = tr_store_conn_get(s);
	int err = -EIO;
	sqlite3_stmt *st = tr_store_stmt(c, step >= 0		    ? sql_get_step
					    : step == TR_CKPT_BEST ? sql_get_best
								   : sql_get_newest);
	if (!st)
		goto cleanup;
	sqlite3_bind_int64(st, 1, job_id);
	if (step >= 0)
		sqlite3_bind_int64(st, 2, step);
	int rc = sqlite3_step(st);
	if (rc == SQLITE_ROW)
		err = read_row(st, out);
	else if (rc == SQLITE_DONE && step >= 0)
		err = tr_store_fail(-ENOENT, "job %lld has no checkpoint at step %lld", (long long)job_id,
				    (long long)step);
	else if (rc == SQLITE_DONE && step == TR_CKPT_BEST)
		err = tr_store_fail(-ENOENT, "job %lld has no best checkpoint", (long long)job_id);
	else if (rc == SQLITE_DONE)
		err = tr_store_fail(-ENOENT, "job %lld has no checkpoint", (long long)job_id);
	else
		err = SQLFAIL(c, rc, "get a checkpoint");
cleanup:
	tr_store_conn_put(s, c);
	if (err < 0)
		tr_ckpt_row_finish(out);
	return err;
}

int tr_store_ckpt_delete(tr_store_t *s, int64_t ckpt_id)
{
	/* Its own connection: the purge may take several transactions. */
	struct conn c;
	int err = open_own(s, &c, true);
	if (err < 0)
		return err;
	int n = 0;
	/* The hide must be durable before the file goes: after a power cut a
	 * complete row without its file would be listed as damaged. */
	err = tr_store_exec(&c, "PRAGMA synchronous=FULL");
	if (err == 0)
		err = exec_id(&c, sql_hide, ckpt_id, 0, &n);
	if (err == 0 && n == 0)
		err = tr_store_fail(-ENOENT, "checkpoint %lld does not exist", (long long)ckpt_id);
	/* Hidden now: a failed purge is finished by the next open. */
	if (err == 0) {
		char *dir = files_dir(s);
		purge(dir, &c, ckpt_id, false);
		free(dir);
	}
	tr_store_conn_close(&c);
	return err;
}

int tr_store_ckpt_model_header(tr_store_t *s, int64_t ckpt_id, void **data, size_t *len)
{
	*data = NULL;
	*len = 0;
	struct conn *c = tr_store_conn_get(s);
	int err = -EIO;
	sqlite3_stmt *st = tr_store_stmt(c, sql_header);
	if (!st)
		goto cleanup;
	sqlite3_bind_int64(st, 1, ckpt_id);
	int rc = sqlite3_step(st);
	if (rc == SQLITE_DONE) {
		err = tr_store_fail(-ENOENT, "checkpoint %lld does not exist", (long long)ckpt_id);
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
		err = tr_store_fail(-ENOMEM, "out of memory");
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

/* ---- reading ------------------------------------------------------------------- */

/* Opens the reader's checkpoint file.  A file that cannot be opened is
 * damage if the row is still there, a race with a prune if it is not. */
static int reader_open_file(tr_store_t *s, struct tr_ckpt_reader *r)
{
	char *dir = files_dir(s), *path = dir ? file_path(dir, r->id) : NULL;
	free(dir);
	if (!path)
		return tr_store_fail(-ENOMEM, "out of memory");
	int err = reader_register(r->id);
	if (err < 0) {
		free(path);
		return err;
	}
	r->registered = true;
	err = open_file(&r->f, path, false, false);
	if (err == 0)
		err = tr_store_begin(&r->f, false);
	/* Only a missing file is damage (or a prune): any other failure (out of
	 * descriptors, a permission) says nothing about the checkpoint, and a
	 * resume must not give up on a good checkpoint for it. */
	if (err < 0 && err != -ENOENT) {
		char cause[512];
		tr_store_errcpy(cause, sizeof cause);
		err = tr_store_fail(err, "checkpoint %lld of job %lld (step %lld): %s", (long long)r->id,
				    (long long)r->job_id, (long long)r->step, cause);
	} else if (err < 0) {
		char cause[512];
		tr_store_errcpy(cause, sizeof cause);
		tr_store_rollback(&r->c); /* a fresh look at the row */
		sqlite3_stmt *st = tr_store_stmt(&r->c, sql_reader_row);
		if (st)
			sqlite3_bind_int64(st, 1, r->id);
		int rc = st ? sqlite3_step(st) : SQLITE_ERROR;
		if (st)
			sqlite3_reset(st);
		if (rc == SQLITE_DONE)
			err = tr_store_fail(-ENOENT, "checkpoint %lld was deleted", (long long)r->id);
		else
			err = tr_store_fail(-EBADMSG, "checkpoint %lld of job %lld (step %lld) is damaged: %s",
					    (long long)r->id, (long long)r->job_id, (long long)r->step, cause);
	}
	free(path);
	return err;
}

static int reader_layout(tr_store_t *s, struct tr_ckpt_reader *r)
{
	sqlite3_stmt *st = tr_store_stmt(&r->c, sql_reader_row);
	if (!st)
		return -EIO;
	sqlite3_bind_int64(st, 1, r->id);
	int rc = sqlite3_step(st);
	if (rc != SQLITE_ROW) {
		int err = rc == SQLITE_DONE ? tr_store_fail(-ENOENT, "checkpoint %lld does not exist", (long long)r->id)
					    : SQLFAIL(&r->c, rc, "open a checkpoint");
		sqlite3_reset(st);
		return err;
	}
	r->job_id = sqlite3_column_int64(st, 0);
	r->step = sqlite3_column_int64(st, 1);
	r->bytes = sqlite3_column_int64(st, 2);
	const unsigned char *sha = sqlite3_column_text(st, 3);
	snprintf(r->sha256, sizeof r->sha256, "%s", sha ? (const char *)sha : "");
	bool in_file = sqlite3_column_int64(st, 4) != 0;
	sqlite3_reset(st);
	struct conn *c = &r->c;
	if (in_file) {
		int err = reader_open_file(s, r);
		if (err < 0)
			return err;
		c = &r->f;
		/* The store's connection is not needed any more: the open file
		 * stays readable even if the checkpoint is deleted. */
		tr_store_rollback(&r->c);
		tr_store_conn_close(&r->c);
	}

	r->nchunks = r->bytes ? (r->bytes - 1) / (int64_t)CHUNK_BYTES + 1 : 0;
	if (r->nchunks && !(r->rowids = malloc((size_t)r->nchunks * sizeof *r->rowids)))
		return tr_store_fail(-ENOMEM, "out of memory");
	st = tr_store_stmt(c, in_file ? sql_reader_file_chunks : sql_reader_chunks);
	if (!st)
		return -EIO;
	if (!in_file)
		sqlite3_bind_int64(st, 1, r->id);
	int64_t i = 0;
	int err = 0;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		int64_t seq = sqlite3_column_int64(st, 0), len = sqlite3_column_int64(st, 2);
		int64_t want = i < r->nchunks - 1 ? (int64_t)CHUNK_BYTES : r->bytes - i * (int64_t)CHUNK_BYTES;
		if (i >= r->nchunks || seq != i || len != want) {
			err = tr_store_fail(-EBADMSG,
					    "checkpoint %lld of job %lld (step %lld) is damaged: chunk %lld has %lld bytes, expected chunk %lld of %lld bytes",
					    (long long)r->id, (long long)r->job_id, (long long)r->step, (long long)seq,
					    (long long)len, (long long)i, (long long)want);
			break;
		}
		r->rowids[i++] = sqlite3_column_int64(st, 1);
	}
	if (err == 0 && rc != SQLITE_DONE)
		err = (rc & 0xff) == SQLITE_NOTADB || (rc & 0xff) == SQLITE_CORRUPT
			      ? tr_store_fail(-EBADMSG, "checkpoint %lld of job %lld (step %lld) is damaged: %s",
					      (long long)r->id, (long long)r->job_id, (long long)r->step,
					      sqlite3_errmsg(c->db))
			      : SQLFAIL(c, rc, "read checkpoint chunks");
	else if (err == 0 && i != r->nchunks)
		err = tr_store_fail(-EBADMSG, "checkpoint %lld of job %lld (step %lld) is damaged: %lld of %lld chunks present",
				    (long long)r->id, (long long)r->job_id, (long long)r->step, (long long)i,
				    (long long)r->nchunks);
	sqlite3_reset(st);
	return err;
}

int tr_store_ckpt_open(tr_store_t *s, int64_t ckpt_id, tr_ckpt_reader_t **out)
{
	*out = NULL;
	struct tr_ckpt_reader *r = calloc(1, sizeof *r);
	if (!r)
		return tr_store_fail(-ENOMEM, "out of memory");
	r->id = ckpt_id;
	r->cur = -1;
	int err = open_own(s, &r->c, false);
	if (err < 0) {
		free(r);
		return err;
	}
	/* A read transaction (on the file, or for an older checkpoint on the
	 * store) for the reader's life: every read sees the checkpoint as it
	 * was at open, even if it is pruned meanwhile. */
	err = tr_store_begin(&r->c, false);
	if (err == 0)
		err = reader_layout(s, r);
	if (err < 0) {
		tr_store_ckpt_close(r);
		return err;
	}
	*out = r;
	return 0;
}

ssize_t tr_store_ckpt_read(tr_ckpt_reader_t *r, uint64_t offset, void *buf, size_t len)
{
	if (!r || (len && !buf))
		return tr_store_fail(-EINVAL, "checkpoint read: bad arguments");
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
		struct conn *c = r->f.db ? &r->f : &r->c;
		if (seq != r->cur) {
			if (r->blob)
				rc = sqlite3_blob_reopen(r->blob, r->rowids[seq]);
			else
				rc = sqlite3_blob_open(c->db, "main", r->f.db ? "chunks" : "checkpoint_chunks", "data",
						       r->rowids[seq], 0, &r->blob);
			r->cur = rc == SQLITE_OK ? seq : -1;
		}
		size_t n = CHUNK_BYTES - in < len - done ? CHUNK_BYTES - in : len - done;
		if (rc == SQLITE_OK)
			rc = sqlite3_blob_read(r->blob, (char *)buf + done, (int)n, (int)in);
		if (rc != SQLITE_OK) {
			int err = SQLFAIL(c, rc, "read a checkpoint chunk");
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
		reader_unregister(r->id);
	if (r->c.db)
		tr_store_rollback(&r->c); /* ends the read transaction */
	tr_store_conn_close(&r->c);
	free(r->rowids);
	free(r);
}

int tr_store_ckpt_load(tr_store_t *s, const struct tr_ckpt_row *row, void **data, size_t *len)
{
	*data = NULL;
	*len = 0;
	if (!row)
		return tr_store_fail(-EINVAL, "checkpoint load: no row");
	tr_ckpt_reader_t *r;
	int err = tr_store_ckpt_open(s, row->id, &r);
	if (err < 0)
		return err;
	unsigned char *buf = NULL;
	if ((uint64_t)r->bytes > SIZE_MAX - 1) {
		err = tr_store_fail(-EFBIG, "checkpoint %lld: %lld bytes do not fit in memory", (long long)r->id,
				    (long long)r->bytes);
		goto fail;
	}
	if (row->sha256[0] && strcmp(row->sha256, r->sha256) != 0) {
		err = tr_store_fail(-EBADMSG, "checkpoint %lld: the row's SHA-256 %s is not the stored %s",
				    (long long)r->id, row->sha256, r->sha256);
		goto fail;
	}
	buf = malloc(r->bytes ? (size_t)r->bytes : 1);
	if (!buf) {
		err = tr_store_fail(-ENOMEM, "checkpoint %lld: cannot allocate %lld bytes", (long long)r->id,
				    (long long)r->bytes);
		goto fail;
	}
	/* Chunk by chunk: each is hashed while the next one is read. */
	struct tr_sha256 sha;
	tr_sha256_init(&sha);
	struct bg_hash hash = {0};
	for (uint64_t off = 0; off < (uint64_t)r->bytes;) {
		ssize_t n = tr_store_ckpt_read(r, off, buf + off, CHUNK_BYTES);
		bg_hash_wait(&hash);
		if (n <= 0) {
			err = n < 0 ? (int)n : tr_store_fail(-EIO, "checkpoint %lld: short read", (long long)r->id);
			goto fail;
		}
		bg_hash_start(&hash, &sha, buf + off, (size_t)n);
		off += (uint64_t)n;
	}
	bg_hash_wait(&hash);
	char hex[65];
	tr_sha256_final_hex(&sha, hex);
	if (strcmp(hex, r->sha256) != 0) {
		err = tr_store_fail(-EBADMSG, "checkpoint %lld of job %lld (step %lld) is corrupt: its SHA-256 is %s, expected %s",
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
