/* Shared by storage/checkpoints_write.c, checkpoints_read.c and
 * checkpoints_files.c (the three parts of storage/checkpoints.h): the
 * chunk size, the checkpoint files' settings, and the helpers for paths,
 * connections, syncing, deleting and hashing that more than one part
 * uses.  Not part of the store's contract.
 */
#ifndef TR_STORE_CHECKPOINTS_INTERNAL_H
#define TR_STORE_CHECKPOINTS_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "storage/checkpoints.h"
#include "storage/internal.h"
#include "storage/sha256.h"

#define CHUNK_BYTES ((size_t)4 << 20)
/* Below this a helper thread costs more than it saves. */
#define BG_HASH_MIN ((size_t)256 << 10)
/* Checkpoint files: large pages make SQLite's work per chunk small (64
 * overflow pages per 4 MiB); a cache of 8 MiB holds one chunk's pages with
 * room to spare, so no page is spilled before the chunk's commit and then
 * written again. */
#define FILE_PAGE_SIZE 65536
#define FILE_PAGE_SIZE_SQL "65536" /* the same, for the pragma below */
#define FILE_SETTINGS                                                               \
	"PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF; PRAGMA cache_size=-8192;" \
	" PRAGMA secure_delete=OFF;"
/* secure_delete=OFF: rows of a reused file that are replaced or left over
 * are freed without zeroing their pages (Debian's SQLite zeroes them). */
extern const char tr_ckpt_file_settings[]; /* FILE_SETTINGS */
/* A new checkpoint file: the page size, the settings and the chunks table. */
extern const char tr_ckpt_file_setup[];

/* length(model_header) rather than the header itself: rows are listed
 * often and the header is only needed for a weights-only download. */
#define CKPT_COLS                                                                           \
	"id, job_id, step, epoch, created_at, bytes, sha256, params_offset, params_bytes, " \
	"length(model_header), meta, best"

/* Reads a row selected with CKPT_COLS (checkpoints_read.c); out of
 * memory is reported on c, the connection st belongs to. */
int tr_ckpt_read_row(struct conn *c, sqlite3_stmt *st, struct tr_ckpt_row *r);

/* ---- checkpoints_files.c ----
 *
 * Errors (docs/design.md, "Errors"): the helpers that work on a
 * connection report on it (its err); the others, and those that open one,
 * fill the struct tr_error they are given (e may be NULL). */

/* Opens a connection of the checkpoint code's own on the store, with the
 * store's settings and, when it writes, its size cap; it reports into e. */
int tr_ckpt_open_own(tr_store_t *s, struct conn *c, bool writes, struct tr_error *e);
/* "<store path>-checkpoints" and "<dir>/<id>.sqlite" (malloc'd; NULL when
 * out of memory). */
char *tr_ckpt_files_dir(const tr_store_t *s);
char *tr_ckpt_file_path(const char *dir, int64_t id);
/* "<dir>/spare.sqlite" (malloc'd; NULL when out of memory). */
char *tr_ckpt_spare_path(const char *dir);
/* A failed sync's errno as a result code (out of space or quota reads as
 * a full disk), filling e. */
int tr_ckpt_sync_fail(const char *path, struct tr_error *e);
/* Syncs directory dir, or the directory that holds path. */
int tr_ckpt_sync_dir(const char *dir, struct tr_error *e);
int tr_ckpt_sync_dir_of(const char *path, struct tr_error *e);
/* Opens a checkpoint file: read-only (create and write false), created
 * empty with tr_ckpt_file_setup (create), or an existing one to overwrite
 * (write only). */
int tr_ckpt_open_file(struct conn *c, const char *path, bool create, bool write, struct tr_error *e);
/* Bytes the store's database, its WAL and its checkpoint files take now. */
int64_t tr_ckpt_state_bytes(const tr_store_t *s);
/* Runs a statement that returns no rows with ?1 = id (and ?2 = arg when
 * it has a second parameter); exec_id does so in a write transaction of
 * its own, *changes (may be NULL) receiving the row count. */
int tr_ckpt_run_id(struct conn *c, const char *sql, int64_t id, int64_t arg);
int tr_ckpt_exec_id(struct conn *c, const char *sql, int64_t id, int64_t arg, int *changes);
/* Unlinks checkpoint id's file in dir; one that is not there is fine. */
int tr_ckpt_unlink_file(const char *dir, int64_t id, struct tr_error *e);
/* Readers register a checkpoint's id while its file is open, so that the
 * pruner never makes that file the spare. */
int tr_ckpt_reader_register(int64_t id, struct tr_error *e);
void tr_ckpt_reader_unregister(int64_t id);
/* Deletes a hidden (complete = 0) checkpoint: its file (retire: makes it
 * the spare), then its row. */
int tr_ckpt_purge(const char *dir, struct conn *c, int64_t id, bool retire);

/* Hashing beside I/O: feeds p[0, n) to sha, on a helper thread when that
 * is worth it (and possible: without one the bytes are hashed at once).
 * Until tr_ckpt_hash_wait, the bytes must not change and sha must not be
 * touched. */
struct tr_ckpt_hash {
	pthread_t thread;
	bool running;
	struct tr_sha256 *sha;
	const void *p;
	size_t n;
};
void tr_ckpt_hash_start(struct tr_ckpt_hash *h, struct tr_sha256 *sha, const void *p, size_t n);
void tr_ckpt_hash_wait(struct tr_ckpt_hash *h);

#endif
