/* Library-internal declarations shared by the storage/ files: the store
 * struct, the connection pool, the error helpers, the metric
 * summary ("rollup") arithmetic and the event notification hook.  Nothing
 * here is part of the store.h contract; names keep the tr_store_ prefix only
 * so that a static link with the other libraries cannot clash.
 */
#ifndef TR_STORE_INTERNAL_H
#define TR_STORE_INTERNAL_H

#include <pthread.h>
#include <sqlite3.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "storage/store.h"

#define STORE_DEFAULT_QUEUE_MAX 1000000
#define STORE_DEFAULT_FLUSH_MS 200
#define STORE_BUSY_TIMEOUT_MS 5000
#define STORE_POOL_SIZE 4
/* Steps are kept within +-2^62 so that block and bucket arithmetic on them
 * can never overflow int64. */
#define STORE_STEP_LIMIT TR_STORE_STEP_LIMIT

/* Metric rollup pyramid: level k (1..ROLLUP_LEVELS) holds, per series and
 * per aligned block of ROLLUP_FANOUT^k steps, the point count and the min
 * and max points.  Level 0 is the raw metrics table. */
#define ROLLUP_FANOUT 16
#define ROLLUP_LEVELS 5

/* ---- connections ---------------------------------------------------------- */

struct stmt_cache_entry {
	const char *sql; /* keyed by pointer: only static SQL strings are cached */
	sqlite3_stmt *st;
};

struct conn {
	sqlite3 *db;
	/* The store whose state database this connection writes, for the
	 * storage health (tr_store_health); NULL for checkpoint files and
	 * other connections whose failures say nothing about it. */
	struct tr_store *store;
	struct stmt_cache_entry *cache;
	int ncache, capcache;
	bool busy; /* handed out by the pool */
	/* The struct tr_error of the call it is lent to (tr_store_conn_lend),
	 * or of its owner for a connection of its own (the checkpoint writer's,
	 * the open's): SQLFAIL and tr_store_cfail fill it (docs/design.md,
	 * "Errors").  NULL: sink, for a caller that only wants the code. */
	struct tr_error *err;
	struct tr_error sink; /* err of a call whose caller passed none */
};

/* One queued metric point or log line. */
struct qitem {
	int64_t job_id, step, epoch;
	double wall, value;
	int level;    /* syslog level of a log line; -1 for a metric point */
	bool replace; /* a pushed point: it replaces the series' point at its step */
	char *heap;   /* name or message when it does not fit in inl */
	char inl[24];
};

struct qvec {
	struct qitem *v;
	size_t n, cap;
};

struct drop_count {
	int64_t job_id, count;
};

/* A job state change that could not be written yet (storage/pending.c). */
struct pending_state {
	int64_t job_id;
	enum tr_job_state state;
	char *error, *devices; /* JSON text or NULL */
	double at;             /* when it happened: its event's and its stamps' time */
};

/* Bounds the state changes held in memory while storage fails: far more
 * than a daemon's live jobs can make (each makes a handful). */
#define STORE_PENDING_STATES_MAX 4096
/* How often held writes are tried again while storage fails. */
#define STORE_RETRY_MS 1000

/* A slot of the per-job generation table: the job it holds and that
 * job's last change, or, for jobs it does not hold, `evicted`: the newest
 * change of any job that has left the slot. */
#define STORE_JOB_GEN_SLOTS 1024
struct job_gen {
	int64_t job;
	uint64_t gen, evicted;
};

struct tr_store {
	char *path;
	int64_t max_bytes; /* tr_store_options.max_bytes: database plus checkpoint files; 0 = no cap */
	size_t queue_max;
	int flush_ms;

	/* Request connections: any thread takes a free one for one call. */
	pthread_mutex_t pool_lock;
	pthread_cond_t pool_cond;
	struct conn pool[STORE_POOL_SIZE];

	/* Writer thread and its queue; all fields below under q_lock. */
	struct conn wconn; /* used by the writer thread only */
	pthread_t writer;
	bool writer_started;
	pthread_mutex_t q_lock;
	pthread_cond_t q_work; /* writer: data, flush request or stop */
	pthread_cond_t q_done; /* flushers: seq_done advanced */
	struct qvec pending;
	size_t inflight;           /* items taken by the writer, not yet committed */
	uint64_t seq_in, seq_done; /* items accepted / items written (or failed) */
	bool flush_req, stopping;
	uint64_t err_from, err_to; /* seq range (from, to] of the last failed chunk */
	int err_code;
	char err_msg[sizeof(((struct tr_error *)0)->message)];
	uint64_t rounds_started, rounds_done; /* the writer's rounds, for flushes */
	bool write_failing;                   /* the last batch kept items back for a retry */
	struct drop_count *drops;
	size_t ndrops, capdrops;
	int64_t drops_total;

	/* State changes not written yet, in the order they happened; all
	 * under st_lock, which also orders every job state write. */
	pthread_mutex_t st_lock;
	struct pending_state *pst;
	size_t npst, cappst;
	_Atomic size_t pst_count; /* npst, for the writer's wake-up test */
	bool pst_saved;           /* the side file holds them: delete it once all are written */

	/* Storage health: the last write to the state database failed for
	 * want of storage and none has succeeded since.  Under h_lock;
	 * h_failing is read without it as a hint. */
	pthread_mutex_t h_lock;
	_Atomic int h_failing;
	int h_err;
	double h_since;
	char h_msg[512];

	/* Event notification for tr_store_wait_events. */
	pthread_mutex_t ev_lock;
	pthread_cond_t ev_cond;
	int64_t last_event_id;
	/* The newest event that is not a "metrics" one, set at its insert
	 * (before its commit, so it may run ahead: readers only use it to
	 * skip reads that could find nothing but metrics events); every event
	 * before the store was opened counts as one. */
	_Atomic int64_t last_other_event_id;
	uint64_t ev_gen, wake_gen;
	uint64_t data_gen; /* bumped by every change a metrics query could see */
	/* Per-job generations (tr_store_job_data_generation): direct-mapped by
	 * job id, values drawn from data_gen; all under ev_lock. */
	uint64_t all_jobs_gen;
	struct job_gen job_gens[STORE_JOB_GEN_SLOTS];
	/* tr_store_set_commit_hook's, under ev_lock. */
	tr_store_commit_hook_fn commit_hook;
	void *commit_hook_ctx;
};

/* Takes a free request connection, waiting for one; never NULL.  Its
 * failures fill its sink (a caller that only wants the code). */
struct conn *tr_store_conn_get(tr_store_t *s);
/* The same for a call that reports through a struct tr_error: failures on
 * the connection fill e (may be NULL) until it is put back. */
struct conn *tr_store_conn_lend(tr_store_t *s, struct tr_error *e);
/* Resets its statements (releasing read snapshots) and returns it. */
void tr_store_conn_put(tr_store_t *s, struct conn *c);
/* Where the connection's failures go: its err, else its sink. */
struct tr_error *tr_store_conn_err(struct conn *c);
/* A prepared statement for a static SQL string, cached per connection,
 * reset and with bindings cleared.  NULL on error (message set). */
sqlite3_stmt *tr_store_stmt(struct conn *c, const char *sql);
/* Runs a PRAGMA that returns one integer (sql: a static string, as for
 * tr_store_stmt, e.g. "PRAGMA page_size") into *value. */
int tr_store_pragma_int(struct conn *c, const char *sql, int64_t *value);
/* Opens a connection with the per-connection settings (foreign keys,
 * synchronous=NORMAL, busy timeout); for a module that needs its own,
 * e.g. to stream large blobs without holding a pooled one.  The
 * connection reports into e (its err) from then on: its owner points err
 * elsewhere when e does not live as long. */
int tr_store_conn_open(struct conn *c, const char *path, struct tr_error *e);
/* Just the open (sqlite3_open_v2 flags, NOMUTEX added), with extended
 * result codes and a message that names the file; for databases other than
 * the store's own (checkpoint files).  Sets err = e as conn_open does. */
int tr_store_db_open(struct conn *c, const char *path, int flags, struct tr_error *e);
void tr_store_conn_close(struct conn *c);
/* Applies tr_store_options.max_bytes (0 = none) to a connection that may
 * write: PRAGMA max_page_count is a setting of each connection. */
int tr_store_set_max_bytes(struct conn *c, int64_t max_bytes);

/* Checkpoint files (storage/checkpoints_files.c).  At open, with no
 * writer running: deletes checkpoints left incomplete by a previous run,
 * then any checkpoint file without a row, then moves checkpoints whose
 * chunks are still in the database (an older trainerd's) into files.  tr_store_ckpt_sweep_files does the
 * second part alone (after a job's rows were deleted).  Failures fill c's
 * err. */
int tr_store_ckpt_sweep(tr_store_t *s, struct conn *c);
void tr_store_ckpt_sweep_files(tr_store_t *s, struct conn *c);

/* "BEGIN IMMEDIATE" for writes (so a read-to-write upgrade can never fail
 * with SQLITE_BUSY mid-transaction), "BEGIN" for consistent reads. */
int tr_store_begin(struct conn *c, bool write);
int tr_store_commit(struct conn *c);
void tr_store_rollback(struct conn *c);
/* Runs SQL without results (no caching). */
int tr_store_exec(struct conn *c, const char *sql);

/* ---- errors ----------------------------------------------------------------- */

/* Sets the message where the connection's call reports it (c's err, else
 * its sink); returns code (a negative errno). */
int tr_store_cfail(struct conn *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Records "file:line: what: sqlite message" where c's call reports it,
 * maps rc to a negative errno and notes a storage failure of the
 * connection's store. */
#define SQLFAIL(c, rc, what) tr_store_sqlfail_c((c), (rc), (what), __FILE__, __LINE__)
int tr_store_sqlfail_c(struct conn *c, int rc, const char *what, const char *file, int line);
/* A write failed for want of storage (full, read-only, I/O error). */
bool tr_store_err_storage(int err);
/* A write failed for a reason that may pass: storage, a lock held too
 * long, memory.  Such writes are kept and tried again, not dropped. */
bool tr_store_err_transient(int err);
/* Storage health bookkeeping (storage/store.c): a write to the state
 * database failed (err, msg: what failed; the store keeps a copy), or one
 * succeeded. */
void tr_store_health_fail(tr_store_t *s, int err, const char *msg);
void tr_store_health_ok(tr_store_t *s);
/* Test-only fault switch (storage/fault.c); a no-op unless the
 * environment asks for it. */
void tr_store_fault_install(void);

/* ---- schema ------------------------------------------------------------------ */

/* Highest schema version this binary knows. */
int tr_store_schema_version(void);
/* Applies forward migrations on c; refuses a newer database. */
int tr_store_migrate(struct conn *c);

/* ---- events ------------------------------------------------------------------ */

/* Called after every commit that added events, max_id the highest new id;
 * jobs[0..njobs) are the jobs whose data it changed (NULL: unknown, any). */
void tr_store_events_committed(tr_store_t *s, int64_t max_id, const int64_t *jobs, size_t njobs);
/* The same for the writer's commits of points and log lines: runs the
 * commit hook for each job before publishing (storage/events.c). */
void tr_store_commit_hook_run(tr_store_t *s, int64_t max_id, const int64_t *jobs, size_t njobs);
int tr_store_event_insert(struct conn *c, int64_t job_id, const char *type, const char *data, double at, int64_t *id);

/* ---- writer ------------------------------------------------------------------ */

int tr_store_writer_start(tr_store_t *s, struct tr_error *e);
void tr_store_writer_stop(tr_store_t *s);
/* Writes items to the database on the writer connection, in transactions
 * of bounded size.  Returns how many leading items are done with: written,
 * or dropped (and counted) for a failure that cannot pass.  The rest, from
 * the first chunk that failed for a transient reason (a full disk), are
 * the caller's to try again. */
size_t tr_store_write_batch(tr_store_t *s, struct qitem *items, size_t n);
void tr_store_drops_add(tr_store_t *s, int64_t job_id, int64_t n); /* q_lock held */
void tr_store_drops_forget(tr_store_t *s, int64_t job_id);

/* ---- metric summaries -------------------------------------------------------- */

struct mpoint {
	int64_t step, epoch;
	double wall, value;
};

struct msum {
	int64_t n;
	struct mpoint min, max; /* valid when n > 0 */
	/* The last point in step order, the latest written among equal steps
	 * (valid when last_known: rows from before the rollup kept it, and
	 * sums merged with them, do not know it). */
	struct mpoint last;
	bool last_known;
};

/* Order of values for min/max: NaN counts as larger than +inf, so a
 * diverged loss shows up as a bucket's max. */
int tr_store_value_cmp(double a, double b);
void tr_store_msum_add(struct msum *m, const struct mpoint *p);
void tr_store_msum_merge(struct msum *m, const struct msum *o);
bool tr_store_mpoint_same(const struct mpoint *a, const struct mpoint *b);

int64_t tr_store_rollup_width(int level); /* ROLLUP_FANOUT^level */
int64_t tr_store_floordiv(int64_t a, int64_t b);
/* Merges the points of one series, sorted by step, into the rollup. */
int tr_store_rollup_add(struct conn *c, int64_t job_id, const char *name, const struct mpoint *pts, size_t n);
/* Recomputes one block from the level below (raw points for level 1);
 * deletes the row when the block became empty. */
int tr_store_rollup_rebuild(struct conn *c, int64_t job_id, const char *name, int level, int64_t block);
/* Tells the metrics reads' memo (metrics_read.c) that points changed other
 * than by appends (a pushed point replaced another), so memos taken
 * before are outdated. */
void tr_store_metrics_rewritten(void);
/* Fetches blocks [b0, b1] of one level, ascending; *rows malloc'd. */
struct rollup_row {
	int64_t block;
	struct msum sum;
};
int tr_store_rollup_fetch(struct conn *c, int64_t job_id, const char *name, int level, int64_t b0, int64_t b1,
			  struct rollup_row **rows, size_t *count);

/* Point values: SQLite stores NaN as NULL, so NULL reads back as NaN. */
double tr_store_col_value(sqlite3_stmt *st, int col);
double tr_store_now(void); /* Unix seconds */

/* ---- JSON text building (for event data, without a json_t per point) --------- */

struct jbuf {
	char *p;
	size_t n, cap;
	bool oom;
};
void tr_store_jbuf_raw(struct jbuf *b, const char *s, size_t len);
void tr_store_jbuf_str(struct jbuf *b, const char *s); /* quoted and escaped */
void tr_store_jbuf_int(struct jbuf *b, int64_t v);
void tr_store_jbuf_num(struct jbuf *b, double v); /* null when not finite */
/* JSON text must be UTF-8 (jansson refuses anything else). */
bool tr_store_utf8_valid(const char *s);
void tr_store_utf8_fix(char *s); /* invalid bytes become '?', in place */
#define JBUF_LIT(b, lit) tr_store_jbuf_raw((b), (lit), sizeof(lit) - 1)

/* ---- pending state changes (storage/pending.c) ------------------------------- */

/* Writes one state change on c in its own transaction, stamping with
 * `at`; *event_id receives the state event's id.  No events_committed. */
int tr_store_job_write_state(struct conn *c, int64_t id, enum tr_job_state state, const char *error_json,
			     const char *devices_json, double at, int64_t *event_id);
/* With st_lock held: writes the pending changes in order on c until one
 * fails for a transient reason (returned; the rest stay); changes that
 * can never be written (their job was deleted) are dropped. 0 = none left. */
int tr_store_states_drain_locked(tr_store_t *s, struct conn *c);
/* Takes st_lock and drains on c (the writer's retry). */
int tr_store_states_retry(tr_store_t *s, struct conn *c);
size_t tr_store_states_pending(tr_store_t *s);
/* Forgets a deleted job's pending changes. */
void tr_store_states_forget(tr_store_t *s, int64_t job_id);
/* Shows a row as its pending changes will leave it. */
void tr_store_job_overlay(tr_store_t *s, struct tr_job_row *row);
/* At open: loads changes a previous run could not write (the side file)
 * and tries them; a side file that cannot be read fills e. */
int tr_store_states_load(tr_store_t *s, struct tr_error *e);
void tr_store_states_free(tr_store_t *s);

/* ---- one job's own data (storage/job_write.c) ------------------------------- */

/* A write of tr_store_job_write: sql (static, cached per connection) with
 * ?1 the job's id and ?2 text (borrowed); what names it in a failure's
 * message.  check (NULL: none) runs first in the same transaction, e.g. a
 * bound on what the write would leave: 0 to go on, else a negative errno
 * with the message set on c (tr_store_cfail, SQLFAIL). */
struct job_write {
	const char *sql, *text, *what;
	int (*check)(struct conn *c, int64_t id, const struct job_write *w);
	void *ctx; /* check's */
};
/* Runs w in a write transaction on a connection lent with e: commits and
 * marks the job's data changed when check and the statement succeed, else
 * rolls back.  A statement refused by its foreign key to jobs is "job <id>
 * not found" (-ENOENT); other failures give SQLFAIL's message. */
int tr_store_job_write(tr_store_t *s, int64_t id, const struct job_write *w, struct tr_error *e);

/* Marks stored data as changed for response caches, after the commit:
 * of every job (a deletion), or of one. */
void tr_store_data_changed(tr_store_t *s);
void tr_store_job_data_changed(tr_store_t *s, int64_t job_id);

#endif
