/* Store lifecycle and plumbing: open (pragmas, migration, connection pool,
 * writer thread), close, where a connection's failures are reported, the
 * statement cache and the transaction helpers every other storage file
 * uses.
 *
 * Connections: one belongs to the writer thread; STORE_POOL_SIZE more serve
 * requests, each lent to one thread for one call.  WAL lets the readers run
 * while the writer commits; SQLite itself runs serialized as a second line
 * of defence.
 */
#include "storage/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "storage/checkpoints.h"

/* The page size of new databases, chosen when checkpoint chunks (4 MiB
 * blobs in overflow pages) were stored here: SQLite's work per chunk grows
 * with the number of pages (at 4 KiB 1024, at 16 KiB 256).  They have
 * files of their own now (storage/checkpoints_files.c; older checkpoints'
 * chunks are moved out at open).  Every metrics flush rewrites the pages it
 * touches in full, so larger pages cost metrics writes bytes:
 * docs/design.md has the figures behind 16 KiB. */
#define STORE_PAGE_SIZE_NEW "16384"
/* Address space, not memory: the kernel's page cache backs it. */
#define STORE_READ_MMAP "1073741824"

static int errno_of(sqlite3 *db, int rc)
{
	int sys = db ? sqlite3_system_errno(db) : 0;
	switch (rc & 0xff) {
	case SQLITE_BUSY:
	case SQLITE_LOCKED:
		return -EBUSY;
	case SQLITE_NOMEM:
		return -ENOMEM;
	case SQLITE_FULL:
		return -ENOSPC;
	case SQLITE_READONLY:
		return -EROFS;
	case SQLITE_PERM:
	case SQLITE_AUTH:
		return -EACCES;
	case SQLITE_TOOBIG:
		return -E2BIG;
	case SQLITE_CONSTRAINT:
	case SQLITE_MISMATCH:
	case SQLITE_RANGE:
		return -EINVAL;
	case SQLITE_CANTOPEN:
	case SQLITE_IOERR:
		return sys > 0 ? -sys : -EIO;
	default:
		return -EIO;
	}
}

struct tr_error *tr_store_conn_err(struct conn *c)
{
	return c->err ? c->err : &c->sink;
}

int tr_store_cfail(struct conn *c, int code, const char *fmt, ...)
{
	char msg[sizeof c->sink.message];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	return tr_error_set(tr_store_conn_err(c), code, 0, NULL, "%s", msg);
}

int tr_store_sqlfail_c(struct conn *c, int rc, const char *what, const char *file, int line)
{
	/* meson compiles with paths relative to the build dir ("../storage/x.c"). */
	while (strncmp(file, "../", 3) == 0)
		file += 3;
	char msg[sizeof c->sink.message];
	snprintf(msg, sizeof msg, "%s:%d: %s: %s", file, line, what,
		 c->db ? sqlite3_errmsg(c->db) : sqlite3_errstr(rc));
	int err = tr_store_cfail(c, errno_of(c->db, rc), "%s", msg);
	if (c->store && tr_store_err_storage(err))
		tr_store_health_fail(c->store, err, msg);
	return err;
}

bool tr_store_err_storage(int err)
{
	return err == -ENOSPC || err == -EROFS || err == -EIO || err == -EACCES || err == -EPERM || err == -EDQUOT;
}

bool tr_store_err_transient(int err)
{
	return tr_store_err_storage(err) || err == -EBUSY || err == -ENOMEM || err == -EAGAIN;
}

/* ---- storage health --------------------------------------------------------------- */

void tr_store_health_fail(tr_store_t *s, int err, const char *msg)
{
	pthread_mutex_lock(&s->h_lock);
	bool was = atomic_load(&s->h_failing);
	if (!was)
		s->h_since = tr_store_now();
	s->h_err = err;
	snprintf(s->h_msg, sizeof s->h_msg, "%s", msg);
	atomic_store(&s->h_failing, 1);
	pthread_mutex_unlock(&s->h_lock);
	if (!was && s->writer_started) {
		/* The writer probes until a write succeeds again. */
		pthread_mutex_lock(&s->q_lock);
		pthread_cond_signal(&s->q_work);
		pthread_mutex_unlock(&s->q_lock);
	}
}

void tr_store_health_ok(tr_store_t *s)
{
	if (!atomic_load(&s->h_failing))
		return;
	pthread_mutex_lock(&s->h_lock);
	atomic_store(&s->h_failing, 0);
	pthread_mutex_unlock(&s->h_lock);
}

int tr_store_health(tr_store_t *s, char *msg, size_t msglen)
{
	int err = 0;
	/* Held points or state changes mean a write is still refused, even
	 * when a smaller one has fit since (a size cap). */
	pthread_mutex_lock(&s->q_lock);
	bool held = s->write_failing;
	pthread_mutex_unlock(&s->q_lock);
	held = held || atomic_load(&s->pst_count) > 0;
	pthread_mutex_lock(&s->h_lock);
	if (atomic_load(&s->h_failing) || (held && s->h_err)) {
		err = s->h_err;
		if (msg && msglen)
			snprintf(msg, msglen, "writes to the state database fail for %.0f s: %s",
				 tr_store_now() - s->h_since, s->h_msg);
	}
	pthread_mutex_unlock(&s->h_lock);
	return err;
}

double tr_store_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* ---- statements and transactions --------------------------------------------- */

sqlite3_stmt *tr_store_stmt(struct conn *c, const char *sql)
{
	for (int i = 0; i < c->ncache; i++) {
		if (c->cache[i].sql == sql) {
			sqlite3_reset(c->cache[i].st);
			sqlite3_clear_bindings(c->cache[i].st);
			return c->cache[i].st;
		}
	}
	if (c->ncache == c->capcache) {
		int cap = c->capcache ? 2 * c->capcache : 32;
		struct stmt_cache_entry *n = realloc(c->cache, (size_t)cap * sizeof *n);
		if (!n) {
			tr_store_cfail(c, -ENOMEM, "out of memory");
			return NULL;
		}
		c->cache = n;
		c->capcache = cap;
	}
	sqlite3_stmt *st = NULL;
	int rc = sqlite3_prepare_v3(c->db, sql, -1, SQLITE_PREPARE_PERSISTENT, &st, NULL);
	if (rc != SQLITE_OK) {
		SQLFAIL(c, rc, sql);
		return NULL;
	}
	c->cache[c->ncache++] = (struct stmt_cache_entry){sql, st};
	return st;
}

static int step_done(struct conn *c, const char *sql)
{
	sqlite3_stmt *st = tr_store_stmt(c, sql);
	if (!st)
		return -EIO;
	int rc = sqlite3_step(st);
	sqlite3_reset(st);
	return rc == SQLITE_DONE ? 0 : SQLFAIL(c, rc, sql);
}

int tr_store_begin(struct conn *c, bool write)
{
	return step_done(c, write ? "BEGIN IMMEDIATE" : "BEGIN");
}

int tr_store_commit(struct conn *c)
{
	int err = step_done(c, "COMMIT");
	if (err == 0 && c->store)
		tr_store_health_ok(c->store);
	return err;
}

void tr_store_rollback(struct conn *c)
{
	/* Keeps the caller's error message: the rollback's own outcome does
	 * not matter (SQLite may already have rolled back). */
	if (!sqlite3_get_autocommit(c->db))
		sqlite3_exec(c->db, "ROLLBACK", NULL, NULL, NULL);
}

int tr_store_exec(struct conn *c, const char *sql)
{
	int rc = sqlite3_exec(c->db, sql, NULL, NULL, NULL);
	return rc == SQLITE_OK ? 0 : SQLFAIL(c, rc, sql);
}

/* ---- connections ---------------------------------------------------------------- */

void tr_store_conn_close(struct conn *c)
{
	for (int i = 0; i < c->ncache; i++)
		sqlite3_finalize(c->cache[i].st);
	free(c->cache);
	c->cache = NULL;
	c->ncache = c->capcache = 0;
	if (c->db)
		sqlite3_close(c->db);
	c->db = NULL;
}

/* The WAL is copied into the database file (auto-checkpointed) by the
 * connection whose commit makes it hold WAL_AUTOCHECKPOINT_BYTES, whatever
 * the page size (SQLite's default of 1000 pages is 4 MB at 4 KiB pages).
 * Checkpoint payloads do not pass through this WAL (they have files of
 * their own: storage/checkpoints_files.c), so it only ever holds metadata and
 * metrics.  64 MiB is also journal_size_limit: the log's size after a
 * restart. */
#define WAL_AUTOCHECKPOINT_BYTES (64 << 20)

/* SQLite's own auto-checkpoint hook, at a size in bytes. */
static int wal_hook(void *arg, sqlite3 *db, const char *name, int frames)
{
	int limit = (int)(intptr_t)arg;
	if (frames >= limit)
		sqlite3_wal_checkpoint_v2(db, name, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
	return SQLITE_OK;
}

int tr_store_pragma_int(struct conn *c, const char *sql, int64_t *value)
{
	sqlite3_stmt *st = tr_store_stmt(c, sql);
	if (!st)
		return -EIO;
	int rc = sqlite3_step(st);
	int err = rc == SQLITE_ROW ? 0 : SQLFAIL(c, rc, sql);
	*value = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
	sqlite3_reset(st);
	return err;
}

static int set_autocheckpoint(struct conn *c)
{
	int64_t page;
	int rc = tr_store_pragma_int(c, "PRAGMA page_size", &page);
	if (rc < 0)
		return rc;
	intptr_t frames = page > 0 ? WAL_AUTOCHECKPOINT_BYTES / page : 1000;
	sqlite3_wal_hook(c->db, wal_hook, (void *)frames);
	return 0;
}

/* Waits for the write lock in 1 ms polls, up to STORE_BUSY_TIMEOUT_MS.
 * SQLite's own busy timeout backs off to 100 ms sleeps, so a waiter keeps
 * missing short gaps between other writers' transactions (a purge of an
 * older checkpoint's chunks takes many) and could wait out all of them. */
static int busy_wait(void *arg, int tries)
{
	(void)arg;
	if (tries >= STORE_BUSY_TIMEOUT_MS)
		return 0;
	struct timespec ms = {0, 1000000};
	nanosleep(&ms, NULL);
	return 1;
}

/* Settings that SQLite keeps per connection, not in the file. */
int tr_store_db_open(struct conn *c, const char *path, int flags, struct tr_error *e)
{
	memset(c, 0, sizeof *c);
	c->err = e;
	/* NOMUTEX: a connection is only ever used by one thread at a time (the
	 * pool hands each out exclusively; the writer and checkpoint
	 * connections have one owner), and serialized mode's per-call mutex
	 * cost ~20% of a downsampling query. */
	int rc = sqlite3_open_v2(path, &c->db, flags | SQLITE_OPEN_NOMUTEX, NULL);
	if (rc != SQLITE_OK) {
		int err = tr_store_cfail(c, errno_of(c->db, rc), "%s: cannot open: %s", path,
					 c->db ? sqlite3_errmsg(c->db) : sqlite3_errstr(rc));
		tr_store_conn_close(c);
		return err;
	}
	sqlite3_extended_result_codes(c->db, 1);
	return 0;
}

int tr_store_conn_open(struct conn *c, const char *path, struct tr_error *e)
{
	int rc = tr_store_db_open(c, path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, e);
	if (rc < 0)
		return rc;
	sqlite3_busy_handler(c->db, busy_wait, NULL);
	/* secure_delete=FAST: Debian's SQLite zero-fills freed pages, which
	 * makes deleting a job with large checkpoints hold the write lock for
	 * ~0.5 s per 100 MB; FAST only clears what is cheap to clear. */
	int err = tr_store_exec(c, "PRAGMA foreign_keys=ON; PRAGMA synchronous=NORMAL;"
				   "PRAGMA journal_size_limit=67108864; PRAGMA secure_delete=FAST");
	if (err == 0)
		err = set_autocheckpoint(c);
	if (err < 0)
		tr_store_conn_close(c);
	return err;
}

/* WAL is a property of the file; setting it needs a moment of exclusive
 * access, so it is done once, on the first connection. */
static int enable_wal(struct conn *c, const char *path)
{
	sqlite3_stmt *st = NULL;
	int rc = sqlite3_prepare_v2(c->db, "PRAGMA journal_mode=WAL", -1, &st, NULL);
	if (rc != SQLITE_OK)
		return SQLFAIL(c, rc, "PRAGMA journal_mode=WAL");
	rc = sqlite3_step(st);
	int err = 0;
	if (rc != SQLITE_ROW) {
		err = SQLFAIL(c, rc, "PRAGMA journal_mode=WAL");
	} else {
		const char *mode = (const char *)sqlite3_column_text(st, 0);
		if (!mode || strcmp(mode, "wal") != 0)
			err = tr_store_cfail(c, -ENOTSUP, "%s: cannot use write-ahead logging (journal mode is %s)",
					     path, mode ? mode : "unknown");
	}
	sqlite3_finalize(st);
	return err;
}

struct conn *tr_store_conn_get(tr_store_t *s)
{
	pthread_mutex_lock(&s->pool_lock);
	for (;;) {
		for (int i = 0; i < STORE_POOL_SIZE; i++) {
			if (!s->pool[i].busy) {
				s->pool[i].busy = true;
				pthread_mutex_unlock(&s->pool_lock);
				return &s->pool[i];
			}
		}
		pthread_cond_wait(&s->pool_cond, &s->pool_lock);
	}
}

struct conn *tr_store_conn_lend(tr_store_t *s, struct tr_error *e)
{
	struct conn *c = tr_store_conn_get(s);
	c->err = e ? e : &c->sink;
	return c;
}

void tr_store_conn_put(tr_store_t *s, struct conn *c)
{
	/* A statement left mid-result would pin a read snapshot and stall
	 * WAL checkpoints; a transaction left open would block the writer. */
	for (int i = 0; i < c->ncache; i++)
		sqlite3_reset(c->cache[i].st);
	tr_store_rollback(c);
	c->err = NULL;
	pthread_mutex_lock(&s->pool_lock);
	c->busy = false;
	pthread_cond_signal(&s->pool_cond);
	pthread_mutex_unlock(&s->pool_lock);
}

/* tr_store_options.max_bytes.  max_page_count is kept per connection, not
 * in the file, so every connection that may write sets it. */
int tr_store_set_max_bytes(struct conn *c, int64_t max_bytes)
{
	if (max_bytes <= 0)
		return 0;
	int64_t page;
	int rc = tr_store_pragma_int(c, "PRAGMA page_size", &page);
	if (rc < 0)
		return rc;
	int64_t pages = page > 0 ? max_bytes / page : 0;
	char sql[64];
	snprintf(sql, sizeof sql, "PRAGMA max_page_count=%lld", (long long)(pages > 0 ? pages : 1));
	return tr_store_exec(c, sql);
}

static int64_t read_last_event_id(struct conn *c)
{
	/* AUTOINCREMENT keeps the high-water mark in sqlite_sequence even when
	 * the newest events were deleted with their job. */
	sqlite3_stmt *st = tr_store_stmt(c, "SELECT seq FROM sqlite_sequence WHERE name = 'events'");
	int64_t id = 0;
	if (st && sqlite3_step(st) == SQLITE_ROW)
		id = sqlite3_column_int64(st, 0);
	if (st)
		sqlite3_reset(st);
	return id;
}

static void init_cond_monotonic(pthread_cond_t *cv)
{
	pthread_condattr_t a;
	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	pthread_cond_init(cv, &a);
	pthread_condattr_destroy(&a);
}

/* The database holds every job's spec, logs and metrics: under umask 022
 * SQLite made it 0644, and another local user read it with sqlite3 while
 * the API answered 401.  So the file is made (or set) 0600 before SQLite
 * opens it; SQLite gives its -wal and -shm files the database's mode, and
 * ones an older daemon left are set 0600 too. */
static int make_private(const char *path, struct tr_error *e)
{
	/* A file that cannot be opened or changed here (a read-only state
	 * directory or file system) is left to SQLite, whose open names the
	 * problem as before; nobody can have widened its mode then either. */
	int fd = open(path, O_RDONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return 0;
	int rc = 0;
	if (fchmod(fd, 0600) < 0 && errno != EROFS && errno != EPERM)
		rc = tr_error_set(e, -errno, 0, NULL, "%s: chmod 600: %s", path, strerror(errno));
	close(fd);
	const char *sides[] = {"-wal", "-shm"};
	for (size_t i = 0; rc == 0 && i < 2; i++) {
		char side[PATH_MAX];
		snprintf(side, sizeof side, "%s%s", path, sides[i]);
		if (chmod(side, 0600) < 0 && errno != ENOENT && errno != EROFS && errno != EPERM)
			rc = tr_error_set(e, -errno, 0, NULL, "%s: chmod 600: %s", side, strerror(errno));
	}
	return rc;
}

int tr_store_open(const char *path, const struct tr_store_options *opts, tr_store_t **out, struct tr_error *e)
{
	int rc;
	tr_store_t *s = NULL;
	/* The steps' failures, named after the file below; the connections
	 * report here until the store is open. */
	struct tr_error oe = {0};
	*out = NULL;
	if (!path || !*path)
		return tr_error_set(e, -EINVAL, 0, NULL, "store path is empty");
	if (!sqlite3_threadsafe())
		return tr_error_set(e, -ENOTSUP, 0, NULL, "SQLite was built without thread support");
	if (opts && opts->flush_interval_ms < 0)
		return tr_error_set(e, -EINVAL, 0, NULL, "flush_interval_ms must be >= 0 (0 = default 200)");
	if (opts && opts->max_bytes < 0)
		return tr_error_set(e, -EINVAL, 0, NULL, "max_bytes must be >= 0 (0 = no cap)");
	int64_t max_bytes = opts ? opts->max_bytes : 0;
	s = calloc(1, sizeof *s);
	if (!s)
		return tr_error_set(e, -ENOMEM, 0, NULL, "out of memory");
	s->path = strdup(path);
	s->max_bytes = max_bytes;
	s->queue_max = opts && opts->metrics_queue_max ? opts->metrics_queue_max : STORE_DEFAULT_QUEUE_MAX;
	s->flush_ms = opts && opts->flush_interval_ms ? opts->flush_interval_ms : STORE_DEFAULT_FLUSH_MS;
	pthread_mutex_init(&s->pool_lock, NULL);
	pthread_cond_init(&s->pool_cond, NULL);
	pthread_mutex_init(&s->q_lock, NULL);
	init_cond_monotonic(&s->q_work);
	pthread_cond_init(&s->q_done, NULL);
	pthread_mutex_init(&s->ev_lock, NULL);
	init_cond_monotonic(&s->ev_cond);
	pthread_mutex_init(&s->st_lock, NULL);
	pthread_mutex_init(&s->h_lock, NULL);
	tr_store_fault_install();
	if (!s->path) {
		rc = tr_error_set(&oe, -ENOMEM, 0, NULL, "out of memory");
		goto fail;
	}

	rc = make_private(path, &oe);
	if (rc < 0)
		goto fail;
	rc = tr_store_conn_open(&s->wconn, path, &oe);
	if (rc < 0)
		goto fail;
	/* Only a new, empty database takes the page size (SQLite ignores the
	 * pragma once the file has pages, and WAL mode then fixes it): older
	 * databases keep theirs and work as before. */
	rc = tr_store_exec(&s->wconn, "PRAGMA page_size=" STORE_PAGE_SIZE_NEW);
	if (rc < 0)
		goto fail;
	rc = enable_wal(&s->wconn, path);
	if (rc == 0)
		rc = set_autocheckpoint(&s->wconn); /* the page size is final now */
	if (rc < 0)
		goto fail;
	rc = tr_store_set_max_bytes(&s->wconn, max_bytes);
	if (rc < 0)
		goto fail;
	rc = tr_store_migrate(&s->wconn);
	if (rc < 0)
		goto fail;
	/* Checkpoints still incomplete were being written when a previous run
	 * died; checkpoint files without a row were being deleted. */
	rc = tr_store_ckpt_sweep(s, &s->wconn);
	if (rc < 0)
		goto fail;
	for (int i = 0; i < STORE_POOL_SIZE; i++) {
		rc = tr_store_conn_open(&s->pool[i], path, &oe);
		if (rc < 0)
			goto fail;
		rc = tr_store_set_max_bytes(&s->pool[i], max_bytes);
		if (rc < 0)
			goto fail;
		/* Request connections read the database through a mapping: in WAL
		 * mode every commit of the writer empties a reader's page cache, and
		 * a downsampling query then copied each page in again with pread
		 * (most of its time for a running job's series).  Reads only: the
		 * writer keeps plain I/O. */
		rc = tr_store_exec(&s->pool[i], "PRAGMA mmap_size=" STORE_READ_MMAP);
		if (rc < 0)
			goto fail;
		s->pool[i].err = NULL; /* lent to each call from now on */
	}
	s->last_event_id = read_last_event_id(&s->wconn);
	atomic_store(&s->last_other_event_id, s->last_event_id);
	/* From here on, failures of these connections' writes are the
	 * state's health (the open's own failures are the open's). */
	s->wconn.store = s;
	for (int i = 0; i < STORE_POOL_SIZE; i++)
		s->pool[i].store = s;
	/* State changes a previous run could not write: shown (and kept from
	 * the queue) from the start, written as soon as storage allows. */
	rc = tr_store_states_load(s, &oe);
	if (rc < 0)
		goto fail;
	/* The writer thread lends its connection to each batch. */
	s->wconn.err = NULL;
	rc = tr_store_writer_start(s, &oe);
	if (rc < 0)
		goto fail;
	*out = s;
	return 0;

fail:
	/* Name the file in every open failure ("file is not a database"). */
	if (strncmp(oe.message, path, strlen(path)) != 0)
		tr_error_set(e, rc, 0, NULL, "%s: %s", path, oe.message);
	else
		tr_error_set(e, rc, 0, NULL, "%s", oe.message);
	/* Nothing may report into oe once it is gone. */
	s->wconn.err = NULL;
	for (int i = 0; i < STORE_POOL_SIZE; i++)
		s->pool[i].err = NULL;
	tr_store_close(s);
	return rc;
}

void tr_store_close(tr_store_t *s)
{
	if (!s)
		return;
	tr_store_writer_stop(s);
	tr_store_metrics_memo_forget(s);
	if (s->wconn.db)
		tr_store_job_states_save(s, NULL, 0);
	tr_store_states_free(s);
	for (int i = 0; i < STORE_POOL_SIZE; i++)
		tr_store_conn_close(&s->pool[i]);
	/* Closed last: the last connection to close checkpoints the WAL. */
	tr_store_conn_close(&s->wconn);
	for (size_t i = 0; i < s->pending.n; i++)
		free(s->pending.v[i].heap);
	free(s->pending.v);
	free(s->drops);
	pthread_mutex_destroy(&s->pool_lock);
	pthread_cond_destroy(&s->pool_cond);
	pthread_mutex_destroy(&s->q_lock);
	pthread_cond_destroy(&s->q_work);
	pthread_cond_destroy(&s->q_done);
	pthread_mutex_destroy(&s->ev_lock);
	pthread_cond_destroy(&s->ev_cond);
	pthread_mutex_destroy(&s->st_lock);
	pthread_mutex_destroy(&s->h_lock);
	free(s->path);
	free(s);
}

int tr_store_integrity_check(tr_store_t *s, struct tr_error *e)
{
	struct conn *c = tr_store_conn_lend(s, e);
	int err = 0;
	sqlite3_stmt *st = tr_store_stmt(c, "PRAGMA integrity_check");
	if (!st) {
		err = -EIO;
		goto cleanup;
	}
	int rc = sqlite3_step(st);
	if (rc != SQLITE_ROW) {
		err = SQLFAIL(c, rc, "PRAGMA integrity_check");
		goto cleanup;
	}
	const char *first = (const char *)sqlite3_column_text(st, 0);
	if (!first || strcmp(first, "ok") != 0) {
		err = tr_store_cfail(c, -EIO, "%s: integrity check failed: %s", s->path, first ? first : "?");
		goto cleanup;
	}
	sqlite3_reset(st);
	/* integrity_check does not look at foreign keys. */
	st = tr_store_stmt(c, "PRAGMA foreign_key_check");
	if (!st) {
		err = -EIO;
		goto cleanup;
	}
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW)
		err = tr_store_cfail(c, -EIO, "%s: foreign key violation in table %s, rowid %lld", s->path,
				     (const char *)sqlite3_column_text(st, 0), (long long)sqlite3_column_int64(st, 1));
	else if (rc != SQLITE_DONE)
		err = SQLFAIL(c, rc, "PRAGMA foreign_key_check");
cleanup:
	tr_store_conn_put(s, c);
	return err;
}
