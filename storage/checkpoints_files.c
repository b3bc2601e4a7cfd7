/* Checkpoint files (storage/checkpoints.h): where a checkpoint's bytes
 * live, and everything that deletes them.
 *
 * Each checkpoint's chunks are the rows of a SQLite database of its own,
 * "<store path>-checkpoints/<id>.sqlite" (table chunks: seq, data), while
 * its row in the store (checkpoints: step, size, SHA-256, complete flag)
 * says whether it exists.  Such a file is written once and never changed,
 * so it needs no journal: it is created with journal_mode=OFF and 64 KiB
 * pages, and a failed or crashed write is simply deleted.  That writes
 * every byte once (SQLite's page, the page cache, the disk); through the
 * store's WAL it went there, then into the database file, and cost the
 * training steps beside it about twice the memory traffic and CPU
 * (bench/checkpoint/RESULTS.md).  Pruning deletes a file instead of
 * freeing thousands of pages inside a transaction.
 *
 * Deleting: a checkpoint leaves in two steps.  One short transaction hides
 * it (complete = 0: the commit does this for the checkpoints it prunes,
 * atomically with completing the new one); then its file is unlinked (a
 * reader that has it open keeps reading) or kept as the spare (below), and
 * the row goes last.  What a crash leaves hidden is deleted at the next
 * open (tr_store_ckpt_sweep), with files that no row names.
 *
 * Older checkpoints: trainerd once kept every checkpoint's chunks in the
 * store's own checkpoint_chunks table (rows with chunk_file = 0).  The
 * sweep at open moves each such checkpoint into a file of its own, once
 * (move_old_checkpoints), so that one format is left to read and delete.
 *
 * Also here, as the other two parts use them: paths, connections, syncing,
 * the readers' registry and the hashing helper thread.
 */
#include "storage/checkpoints_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char tr_ckpt_file_settings[] = FILE_SETTINGS;
const char tr_ckpt_file_setup[] = "PRAGMA page_size=" FILE_PAGE_SIZE_SQL "; " FILE_SETTINGS
				  " CREATE TABLE chunks (seq INTEGER PRIMARY KEY, data BLOB NOT NULL)";

static const char sql_hide[] = "UPDATE checkpoints SET complete = 0 WHERE id = ?1";
static const char sql_purge_row[] = "DELETE FROM checkpoints WHERE id = ?1 AND complete = 0";
static const char sql_incomplete[] = "SELECT id FROM checkpoints WHERE complete = 0";
static const char sql_has_file[] = "SELECT 1 FROM checkpoints WHERE id = ?1 AND chunk_file = 1";
/* The move of older checkpoints into files. */
static const char sql_old_ckpts[] = "SELECT id FROM checkpoints WHERE complete = 1 AND chunk_file = 0 ORDER BY id";
static const char sql_old_chunks[] = "SELECT seq, data FROM checkpoint_chunks WHERE checkpoint_id = ?1 ORDER BY seq";
static const char sql_insert_chunk[] = "INSERT INTO chunks (seq, data) VALUES (?1, ?2)";
static const char sql_moved[] = "UPDATE checkpoints SET chunk_file = 1 WHERE id = ?1 AND chunk_file = 0";
static const char sql_drop_old_chunks[] = "DELETE FROM checkpoint_chunks WHERE checkpoint_id = ?1";

/* ---- hashing beside I/O ---------------------------------------------------- */

static void *bg_hash_main(void *arg)
{
	struct tr_ckpt_hash *h = arg;
	pthread_setname_np(pthread_self(), "tr-ckpt-hash");
	tr_sha256_update(h->sha, h->p, h->n);
	return NULL;
}

void tr_ckpt_hash_start(struct tr_ckpt_hash *h, struct tr_sha256 *sha, const void *p, size_t n)
{
	*h = (struct tr_ckpt_hash){.sha = sha, .p = p, .n = n};
	if (n >= BG_HASH_MIN && pthread_create(&h->thread, NULL, bg_hash_main, h) == 0)
		h->running = true;
	else
		tr_sha256_update(sha, p, n);
}

void tr_ckpt_hash_wait(struct tr_ckpt_hash *h)
{
	if (h->running)
		pthread_join(h->thread, NULL);
	h->running = false;
}

/* ---- connections ------------------------------------------------------------- */

/* Readers never allocate pages and skip the size cap. */
int tr_ckpt_open_own(tr_store_t *s, struct conn *c, bool writes, struct tr_error *e)
{
	int err = tr_store_conn_open(c, s->path, e);
	if (err < 0 || !writes)
		return err;
	err = tr_store_set_max_bytes(c, s->max_bytes);
	if (err < 0)
		tr_store_conn_close(c);
	return err;
}

/* The directory of the store's checkpoint files, "<store path>-checkpoints"
 * (malloc'd; NULL when out of memory). */
char *tr_ckpt_files_dir(const tr_store_t *s)
{
	char *p = NULL;
	return asprintf(&p, "%s-checkpoints", s->path) < 0 ? NULL : p;
}

/* Checkpoint id's file in dir (malloc'd; NULL when out of memory). */
char *tr_ckpt_file_path(const char *dir, int64_t id)
{
	char *p = NULL;
	return asprintf(&p, "%s/%lld.sqlite", dir, (long long)id) < 0 ? NULL : p;
}

/* A failed sync's errno as a result code: out of space or quota reads
 * as a full disk (the "database is full" message). */
int tr_ckpt_sync_fail(const char *path, struct tr_error *e)
{
	int code = errno == EDQUOT ? ENOSPC : errno ? errno : EIO;
	return tr_error_set(e, -code, 0, NULL, "%s: cannot sync: %s", path, strerror(errno));
}

/* Syncs directory dir: the names it holds. */
int tr_ckpt_sync_dir(const char *dir, struct tr_error *e)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int err = fd >= 0 && fsync(fd) == 0 ? 0 : tr_ckpt_sync_fail(dir, e);
	if (fd >= 0)
		close(fd);
	return err;
}

/* Syncs the directory that holds path. */
int tr_ckpt_sync_dir_of(const char *path, struct tr_error *e)
{
	char *parent = strdup(path);
	if (!parent)
		return tr_error_set(e, -ENOMEM, 0, NULL, "out of memory");
	char *slash = strrchr(parent, '/');
	if (slash == parent)
		slash[1] = 0; /* "/x": the root */
	else if (slash)
		*slash = 0;
	else
		strcpy(parent, ".");
	int err = tr_ckpt_sync_dir(parent, e);
	free(parent);
	return err;
}

/* Opens a checkpoint file: read-only for readers (it never changes once
 * complete), created empty with tr_ckpt_file_setup for the writer, or (create
 * false, write true) an existing one for the writer to overwrite. */
int tr_ckpt_open_file(struct conn *c, const char *path, bool create, bool write, struct tr_error *e)
{
	int flags = create  ? SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE
		    : write ? SQLITE_OPEN_READWRITE
			    : SQLITE_OPEN_READONLY;
	int err = tr_store_db_open(c, path, flags, e);
	if (err == 0 && create)
		err = tr_store_exec(c, tr_ckpt_file_setup);
	if (err < 0)
		tr_store_conn_close(c);
	return err;
}

/* Bytes the store's database, its WAL and its checkpoint files take now. */
int64_t tr_ckpt_state_bytes(const tr_store_t *s)
{
	int64_t total = 0;
	struct stat st;
	char *wal = NULL;
	if (stat(s->path, &st) == 0)
		total += st.st_size;
	if (asprintf(&wal, "%s-wal", s->path) >= 0 && stat(wal, &st) == 0)
		total += st.st_size;
	free(wal);
	char *dir = tr_ckpt_files_dir(s);
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
int tr_ckpt_run_id(struct conn *c, const char *sql, int64_t id, int64_t arg)
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
int tr_ckpt_exec_id(struct conn *c, const char *sql, int64_t id, int64_t arg, int *changes)
{
	int err = tr_store_begin(c, true);
	if (err < 0)
		return err;
	err = tr_ckpt_run_id(c, sql, id, arg);
	if (changes)
		*changes = sqlite3_changes(c->db);
	if (err == 0)
		err = tr_store_commit(c);
	if (err < 0)
		tr_store_rollback(c);
	return err;
}

/* Unlinks checkpoint id's file in dir; one that is not there is fine. */
int tr_ckpt_unlink_file(const char *dir, int64_t id, struct tr_error *e)
{
	char *path = tr_ckpt_file_path(dir, id);
	if (!path)
		return tr_error_set(e, -ENOMEM, 0, NULL, "out of memory");
	int err = unlink(path) == 0 || errno == ENOENT
			  ? 0
			  : tr_error_set(e, -errno, 0, NULL, "%s: cannot delete: %s", path, strerror(errno));
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

int tr_ckpt_reader_register(int64_t id, struct tr_error *e)
{
	int err = 0;
	pthread_mutex_lock(&readers_lock);
	size_t i = reader_index(id);
	if (i == nreaders) {
		if (nreaders == capreaders) {
			size_t cap = capreaders ? 2 * capreaders : 8;
			void *v = realloc(readers, cap * sizeof *readers);
			if (!v)
				err = tr_error_set(e, -ENOMEM, 0, NULL, "out of memory");
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

void tr_ckpt_reader_unregister(int64_t id)
{
	pthread_mutex_lock(&readers_lock);
	size_t i = reader_index(id);
	if (i < nreaders && --readers[i].count == 0)
		readers[i] = readers[--nreaders];
	pthread_mutex_unlock(&readers_lock);
}

char *tr_ckpt_spare_path(const char *dir)
{
	char *p = NULL;
	return asprintf(&p, "%s/spare.sqlite", dir) < 0 ? NULL : p;
}

/* Makes checkpoint id's file (its row hidden) the spare, or deletes it
 * when a reader has it open. */
static int retire_file(const char *dir, int64_t id, struct tr_error *e)
{
	char *path = tr_ckpt_file_path(dir, id), *spare = tr_ckpt_spare_path(dir);
	int err = 0;
	if (!path || !spare) {
		err = tr_error_set(e, -ENOMEM, 0, NULL, "out of memory");
	} else {
		pthread_mutex_lock(&readers_lock);
		bool open = reader_index(id) < nreaders;
		if (open || rename(path, spare) < 0)
			err = tr_ckpt_unlink_file(dir, id, e);
		pthread_mutex_unlock(&readers_lock);
	}
	free(path);
	free(spare);
	return err;
}

void tr_store_ckpt_drop_spare(tr_store_t *s)
{
	char *dir = tr_ckpt_files_dir(s), *spare = dir ? tr_ckpt_spare_path(dir) : NULL;
	if (spare)
		unlink(spare);
	free(spare);
	free(dir);
}

/* A file that cannot be deleted keeps its row, so that the next open
 * tries again. */
int tr_ckpt_purge(const char *dir, struct conn *c, int64_t id, bool retire)
{
	int err = !dir     ? tr_store_cfail(c, -ENOMEM, "out of memory")
		  : retire ? retire_file(dir, id, tr_store_conn_err(c))
			   : tr_ckpt_unlink_file(dir, id, tr_store_conn_err(c));
	if (err < 0)
		return err;
	return tr_ckpt_exec_id(c, sql_purge_row, id, 0, NULL);
}

/* ---- older checkpoints ------------------------------------------------------------ */

/* Copies checkpoint id's chunks from the store's checkpoint_chunks into a
 * new file at path, as they are (a damaged checkpoint stays damaged, and
 * its reader says so), and makes the file durable. */
static int copy_old_chunks(struct conn *c, int64_t id, const char *path)
{
	struct conn f = {0};
	int err = tr_ckpt_open_file(&f, path, true, true, tr_store_conn_err(c));
	if (err < 0)
		return err;
	sqlite3_stmt *st = tr_store_stmt(c, sql_old_chunks);
	if (!st) {
		tr_store_conn_close(&f);
		return -EIO;
	}
	sqlite3_bind_int64(st, 1, id);
	int rc = SQLITE_DONE;
	while (err == 0 && (rc = sqlite3_step(st)) == SQLITE_ROW) {
		/* One transaction per chunk, as the writer does: the file's page
		 * cache never holds more than one. */
		err = tr_store_begin(&f, true);
		sqlite3_stmt *ins = err == 0 ? tr_store_stmt(&f, sql_insert_chunk) : NULL;
		if (err == 0 && !ins)
			err = -EIO;
		if (err == 0) {
			sqlite3_bind_int64(ins, 1, sqlite3_column_int64(st, 0));
			sqlite3_bind_blob64(ins, 2, sqlite3_column_blob(st, 1),
					    (sqlite3_uint64)sqlite3_column_bytes(st, 1), SQLITE_STATIC);
			int irc = sqlite3_step(ins);
			sqlite3_reset(ins);
			sqlite3_clear_bindings(ins);
			err = irc == SQLITE_DONE ? tr_store_commit(&f) : SQLFAIL(&f, irc, "copy a checkpoint chunk");
		}
	}
	if (err == 0 && rc != SQLITE_DONE)
		err = SQLFAIL(c, rc, "read an older checkpoint's chunks");
	sqlite3_reset(st);
	tr_store_conn_close(&f);
	int fd = err == 0 ? open(path, O_RDONLY | O_CLOEXEC) : -1;
	if (err == 0 && (fd < 0 || fdatasync(fd) < 0))
		err = tr_ckpt_sync_fail(path, tr_store_conn_err(c));
	if (fd >= 0)
		close(fd);
	return err;
}

/* Moves every complete checkpoint whose chunks are still in the store
 * (chunk_file = 0) into a file of its own: the file is written and synced
 * first, then one transaction flips chunk_file and deletes the chunks.  A
 * crash in between leaves a file for a row with chunk_file = 0, which the
 * sweep deletes at the next open before the move starts again.  The move
 * is not held to the size cap (it frees as much in the database as it
 * writes, though the database file does not shrink); a disk too full for
 * it fails the open with a message that says so, and the chunks stay
 * where they were. */
static int move_old_checkpoints(tr_store_t *s, struct conn *c)
{
	int64_t *ids = NULL;
	size_t n = 0, cap = 0;
	int err = 0, rc;
	sqlite3_stmt *st = tr_store_stmt(c, sql_old_ckpts);
	if (!st)
		return -EIO;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		if (n == cap) {
			cap = cap ? 2 * cap : 8;
			int64_t *v = realloc(ids, cap * sizeof *v);
			if (!v) {
				err = tr_store_cfail(c, -ENOMEM, "out of memory");
				break;
			}
			ids = v;
		}
		ids[n++] = sqlite3_column_int64(st, 0);
	}
	if (err == 0 && rc != SQLITE_DONE)
		err = SQLFAIL(c, rc, "find older checkpoints");
	sqlite3_reset(st);
	char *dir = n && err == 0 ? tr_ckpt_files_dir(s) : NULL;
	if (n && err == 0 && !dir)
		err = tr_store_cfail(c, -ENOMEM, "out of memory");
	if (dir && mkdir(dir, 0700) == 0)
		err = tr_ckpt_sync_dir_of(dir, tr_store_conn_err(c));
	else if (dir && errno != EEXIST)
		err = tr_store_cfail(c, -errno, "%s: cannot create: %s", dir, strerror(errno));
	for (size_t i = 0; err == 0 && i < n; i++) {
		char *path = tr_ckpt_file_path(dir, ids[i]);
		if (!path) {
			err = tr_store_cfail(c, -ENOMEM, "out of memory");
			break;
		}
		unlink(path);
		err = copy_old_chunks(c, ids[i], path);
		if (err == 0)
			err = tr_ckpt_sync_dir(dir, tr_store_conn_err(c));
		if (err == 0)
			err = tr_store_begin(c, true);
		if (err == 0) {
			err = tr_ckpt_run_id(c, sql_moved, ids[i], 0);
			if (err == 0)
				err = tr_ckpt_run_id(c, sql_drop_old_chunks, ids[i], 0);
			err = err == 0 ? tr_store_commit(c) : err;
			if (err < 0)
				tr_store_rollback(c);
		}
		if (err < 0) {
			char cause[sizeof c->sink.message];
			snprintf(cause, sizeof cause, "%s", tr_store_conn_err(c)->message);
			unlink(path);
			err = tr_store_cfail(c, err, "cannot move checkpoint %lld out of the database into %s: %s%s",
					     (long long)ids[i], path, cause,
					     err == -ENOSPC ? " (free some space and start again)" : "");
		}
		free(path);
	}
	free(dir);
	free(ids);
	return err;
}

/* Unlinks the checkpoint files no row names (a file is only created after
 * its row is committed, so a file without a row is never one being
 * written). */
void tr_store_ckpt_sweep_files(tr_store_t *s, struct conn *c)
{
	char *dir = tr_ckpt_files_dir(s);
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
	char *dir = tr_ckpt_files_dir(s);
	if (!dir) {
		sqlite3_reset(st);
		return tr_store_cfail(c, -ENOMEM, "out of memory");
	}
	int rc;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW)
		tr_ckpt_unlink_file(dir, sqlite3_column_int64(st, 0), NULL); /* what stays is tried again next open */
	sqlite3_reset(st);
	free(dir);
	if (rc != SQLITE_DONE)
		return SQLFAIL(c, rc, "find incomplete checkpoints");
	/* The chunks of an incomplete older checkpoint cascade. */
	int err = tr_store_exec(c, "DELETE FROM checkpoints WHERE complete = 0");
	if (err == 0)
		tr_store_ckpt_sweep_files(s, c);
	/* After the sweep: it deletes what an interrupted move left. */
	if (err == 0)
		err = move_old_checkpoints(s, c);
	tr_store_ckpt_drop_spare(s);
	return err;
}

/* ---- deleting one ---------------------------------------------------------------- */

int tr_store_ckpt_delete(tr_store_t *s, int64_t ckpt_id, struct tr_error *e)
{
	/* Its own connection: the purge may take several transactions. */
	struct conn c;
	int err = tr_ckpt_open_own(s, &c, true, e);
	if (err < 0)
		return err;
	int n = 0;
	/* The hide must be durable before the file goes: after a power cut a
	 * complete row without its file would be listed as damaged. */
	err = tr_store_exec(&c, "PRAGMA synchronous=FULL");
	if (err == 0)
		err = tr_ckpt_exec_id(&c, sql_hide, ckpt_id, 0, &n);
	if (err == 0 && n == 0)
		err = tr_store_cfail(&c, -ENOENT, "checkpoint %lld does not exist", (long long)ckpt_id);
	/* Hidden now: a failed purge is finished by the next open (its
	 * message is not the caller's). */
	if (err == 0) {
		char *dir = tr_ckpt_files_dir(s);
		c.err = NULL;
		tr_ckpt_purge(dir, &c, ckpt_id, false);
		free(dir);
	}
	tr_store_conn_close(&c);
	return err;
}
