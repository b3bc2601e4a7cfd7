/* trainerd's persistent state in one SQLite database.
 *
 * Tables: jobs (spec as given, normalized spec, state, timestamps, devices,
 * error, priority, progress), events (per-job, monotonically numbered:
 * state changes, log lines, metric batches), metrics (name, step, epoch,
 * wall, value; indexed for name/step-range queries), logs.
 *
 * The database runs in WAL mode with synchronous=NORMAL, foreign keys on,
 * a busy timeout, and a schema versioned by PRAGMA user_version with
 * forward-only migrations.  Metric points and log lines are appended to a
 * bounded in-memory queue and written by a background writer thread in
 * batches (one transaction per flush -- a flush above 50,000 items takes
 * several -- at most every 200 ms), so training
 * never waits for a disk; a full queue drops points and counts the drops.
 *
 * Storage failures (a full disk, a read-only state directory, I/O errors):
 * queued points and log lines that could not be written stay queued, in
 * order, and are tried again every second (they still count against the
 * queue's bound, so a long failure ends in counted drops, not unbounded
 * memory); a job state change that must not be lost is held the same way
 * (tr_store_job_record_state) and every job query shows the job as that
 * change leaves it, with state_pending set; tr_store_health reports the
 * failure until a write succeeds again.
 *
 * All functions are thread-safe (one connection per thread role, guarded
 * internally: the writer thread's own, and a small pool for requests).
 * They return 0 or a negative errno-style code and fill the caller's
 * struct tr_error (the last argument; NULL when only the code is wanted)
 * with why (docs/design.md, "Errors"); storage health and the save of
 * held state changes word a report into a buffer instead.  A limit <= 0
 * in the paging calls means no limit.  Strings in output structs are
 * malloc'd and owned by the caller (tr_job_row_finish frees them); json_t
 * results are new references.
 */
#ifndef TR_STORE_H
#define TR_STORE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "core/experiment.h"
#include "core/job.h"

typedef struct tr_store tr_store_t;

struct tr_store_options {
	size_t metrics_queue_max; /* points buffered before drops; default 1,000,000 */
	int flush_interval_ms;    /* default 200 */
	/* Caps the state: when > 0, every connection to the database (pool,
	 * metrics writer, checkpoint writers) sets PRAGMA max_page_count =
	 * max_bytes / page_size, so a write that would grow the file past the
	 * cap fails with SQLITE_FULL (-ENOSPC), as on a full disk; and a new
	 * checkpoint file may only take what the database, its WAL and the
	 * other checkpoint files leave of the cap (measured when it begins).
	 * The database alone may still grow to the whole cap.  For operators
	 * who want a bound, and for tests that provoke a full disk.  A cap
	 * below the current size holds the database at its current size.  0 =
	 * no cap (SQLite's own limit); negative is refused. */
	int64_t max_bytes;
};

/* Opens (creating if needed) and migrates `path`.  opts may be NULL; zero
 * fields take the defaults.  A database written by a newer trainerd
 * (higher schema version) is refused with -ENOTSUP, naming both versions.
 * Incomplete checkpoints (storage/checkpoints.h) left by a crash are
 * deleted: one database belongs to one daemon, so none can be in progress. */
int tr_store_open(const char *path, const struct tr_store_options *opts, tr_store_t **out, struct tr_error *e);
/* Flushes the queue, stops the writer, closes.  Accepts NULL. */
void tr_store_close(tr_store_t *s);
/* Runs PRAGMA integrity_check; 0 when "ok". */
int tr_store_integrity_check(tr_store_t *s, struct tr_error *e);

/* ---- jobs ---------------------------------------------------------------- */

struct tr_job_row {
	int64_t id;
	char *name;
	enum tr_job_state state;                      /* kept in the database as its name (tr_job_state_name) */
	int priority;                                 /* higher runs first */
	char *spec;                                   /* JSON text as submitted */
	char *normalized;                             /* JSON text with defaults filled */
	char *devices;                                /* JSON array text, "[]" when none */
	char *error;                                  /* JSON object text {"code","message","step"} or NULL */
	char *idempotency_key;                        /* or NULL */
	char *request_hash;                           /* hex digest of the request body, with the key */
	double submitted_at, started_at, finished_at; /* Unix seconds, 0 = not yet */
	int64_t step, total_steps, epoch;
	double loss;        /* latest, NAN when none */
	double updated_at;  /* last progress update */
	bool state_pending; /* state/error/devices/stamps shown are not written yet */
	char *info;         /* JSON object text of info fields, "{}" when none */
	int loader_threads; /* the loader threads its trainer runs (ran) with; 0 until it started */
	int crashes;        /* daemon deaths in a row while it ran without making a step */
	double train_s;     /* seconds of training of its runs that ended (a running one's not yet) */
	bool preemptible;   /* a higher-priority job may preempt it (daemon/preemption.c) */
	char *preemption;   /* JSON object text of its newest preemption, NULL when never preempted */
	/* An experiment's trial (docs/experiments.md): its experiment's id (0
	 * for a plain job) and index; pause_at, the step or epoch (the spec's
	 * own unit) where it pauses itself at its rung, 0 = none.  Written
	 * by the insert. */
	int64_t experiment;
	int trial;
	int64_t pause_at;
};

void tr_job_row_finish(struct tr_job_row *row); /* frees strings; accepts zeroed rows */

/* Info fields: named short strings shown with a job (PUT /jobs/{id}/info,
 * and the engine's own: phase, epoch, best validation loss).  Merges the
 * JSON object `fields_json` (keys and values strings, checked by the
 * caller) into the job's info in one transaction: existing keys are
 * replaced, others added.  -E2BIG (nothing changed) when the result would
 * hold more than max_keys keys; -ENOENT for an unknown job. */
int tr_store_job_info_merge(tr_store_t *s, int64_t id, const char *fields_json, int max_keys, struct tr_error *e);
/* The result of an evaluate job: a JSON object (text) stored once it
 * finished, replaced by a later call, deleted with the job.  get: *json
 * is malloc'd (caller frees); -ENOENT when the job has none. */
int tr_store_job_result_set(tr_store_t *s, int64_t id, const char *result_json, struct tr_error *e);
int tr_store_job_result_get(tr_store_t *s, int64_t id, char **result_json, struct tr_error *e);
/* A job's report token (docs/design.md, "Worker reports"), stored only as
 * its SHA-256 in hex (64 digits).  set replaces the job's; clear deletes
 * it (0 also when there was none); hash_of reads the job's (-ENOENT when
 * it has none); job_of finds the job whose token has this hash (-ENOENT
 * when none). */
int tr_store_job_token_set(tr_store_t *s, int64_t id, const char *hash_hex, struct tr_error *e);
int tr_store_job_token_clear(tr_store_t *s, int64_t id, struct tr_error *e);
int tr_store_job_token_hash_of(tr_store_t *s, int64_t id, char hash_hex[65], struct tr_error *e);
int tr_store_job_token_job_of(tr_store_t *s, const char *hash_hex, int64_t *id, struct tr_error *e);
/* What PUT /jobs/{id}/info may leave a job with; the engine's own fields
 * (TR_INFO_ENGINE_FIELDS at most) always fit on top. */
#define TR_INFO_MAX_FIELDS 64
#define TR_INFO_ENGINE_FIELDS 8
#define TR_INFO_MAX_KEY 64
#define TR_INFO_MAX_VALUE 256

/* Counts jobs by state: counts[st] receives the number of jobs in state
 * st, for every state.  *submitted (may be NULL)
 * receives the number of jobs ever submitted to this store, deleted ones
 * included (the jobs table's AUTOINCREMENT sequence), which only grows.
 * One query over the table: cheap enough for every Prometheus scrape. */
int tr_store_job_counts(tr_store_t *s, int64_t counts[TR_JOB_NSTATES], int64_t *submitted, struct tr_error *e);

/* Inserts a new job in state queued (row->state is not read); sets
 * row->id.  When
 * idempotency_key is set and a job with that key exists, inserts nothing,
 * stores the existing job's id in *existing_id and returns -EEXIST (the
 * caller compares request_hash). */
int tr_store_job_insert(tr_store_t *s, struct tr_job_row *row, int64_t *existing_id, struct tr_error *e);
/* The same, refusing with -EAGAIN (nothing inserted) when max_queued > 0
 * and that many jobs are queued already. */
int tr_store_job_insert_bounded(tr_store_t *s, struct tr_job_row *row, int64_t max_queued, int64_t *existing_id,
				struct tr_error *e);
int tr_store_job_get(tr_store_t *s, int64_t id, struct tr_job_row *out, struct tr_error *e); /* -ENOENT */
/* The trials of experiment `experiment`, by trial index (same ownership
 * as tr_store_job_list). */
int tr_store_job_list_trials(tr_store_t *s, int64_t experiment, struct tr_job_row **rows, int *count,
			     struct tr_error *e);
/* Sets a trial's pause_at (its next rung; 0 = none). */
int tr_store_job_set_pause_at(tr_store_t *s, int64_t id, int64_t pause_at, struct tr_error *e);
/* Jobs with id > after (0 = from the start), ascending id, at most limit;
 * state NULL = any, else the one state *state.  *rows is malloc'd (free
 * each with tr_job_row_finish, then free the array). */
int tr_store_job_list(tr_store_t *s, const enum tr_job_state *state, int64_t after, int limit, struct tr_job_row **rows,
		      int *count, struct tr_error *e);
/* Jobs in any of the nstates `states` (nstates 0: any state), ordered by
 * priority desc, submitted_at asc, id asc: the scheduler's queue and
 * restart scan. */
int tr_store_job_list_states(tr_store_t *s, const enum tr_job_state *states, int nstates, struct tr_job_row **rows,
			     int *count, struct tr_error *e);
/* Reading a job whose stored state names no state of core/job.h (a
 * database edited by hand, or damaged) fails with -EBADMSG, the message
 * naming the job and the text: every function above that returns rows,
 * tr_store_job_counts and the state changes below. */
/* Sets state (and error JSON or NULL, devices JSON or NULL = unchanged),
 * stamps started_at when entering running the first time and
 * finished_at when entering a terminal state, and appends a "state" event
 * {"state":..,"error":..} in the same transaction. */
int tr_store_job_set_state(tr_store_t *s, int64_t id, enum tr_job_state state, const char *error_json,
			   const char *devices_json, struct tr_error *e);
/* The same for a change that has happened and must not be lost (a job
 * ended, was cancelled): when storage fails for a reason that may pass
 * (full, read-only, I/O error, busy), the change is held in memory, in
 * order after any earlier held change, and written by the metrics writer
 * thread as soon as storage works (tried every second); meanwhile
 * tr_store_job_get and the lists show it, with state_pending set.  Returns
 * 0 when written, 1 when held (e says why), or a negative code (unknown job or state,
 * invalid JSON, STORE_PENDING_STATES_MAX changes already held).
 * tr_store_job_set_state on a job with held changes writes them first, or
 * fails as they do, so a job's changes are always written in order. */
int tr_store_job_record_state(tr_store_t *s, int64_t id, enum tr_job_state state, const char *error_json,
			      const char *devices_json, struct tr_error *e);
/* Held state changes that are not written yet. */
size_t tr_store_job_states_pending(tr_store_t *s);
/* Called at shutdown (tr_store_close does it too): tries the held state
 * changes once more, and saves what still cannot be written to a side
 * file beside the database (<path>-unrecorded-states), which the next
 * tr_store_open applies (and deletes once written).  Returns how many were
 * saved (0: nothing was held), or a negative code with msg (may be NULL)
 * saying which changes are lost when even the side file cannot be
 * written. */
int tr_store_job_states_save(tr_store_t *s, char *msg, size_t msglen);

/* Storage health: 0 when the state database takes writes (as far as the
 * last write knows), else the negative code of the failing write with
 * msg (may be NULL) saying what fails and since when.  While failing,
 * the metrics writer probes the database every second, so the answer
 * recovers without other traffic. */
int tr_store_health(tr_store_t *s, char *msg, size_t msglen);

int tr_store_job_set_progress(tr_store_t *s, int64_t id, int64_t step, int64_t total_steps, int64_t epoch, double loss,
			      struct tr_error *e);
int tr_store_job_set_priority(tr_store_t *s, int64_t id, int priority, struct tr_error *e);
/* Where a resumed run continues (its checkpoint's step and epoch), written
 * as it resumes: the row held the killed run's last throttled progress. */
int tr_store_job_set_position(tr_store_t *s, int64_t id, int64_t step, int64_t epoch, struct tr_error *e);
/* Records a job's newest preemption (a JSON object; daemon/preemption.c
 * says its keys), shown with the job and carried by the "state" event of
 * its next change to preempted. */
int tr_store_job_set_preemption(tr_store_t *s, int64_t id, const char *preemption_json, struct tr_error *e);
/* What the job's trainer resolved its loader thread count to (the spec's
 * prefetch.workers or its default), set by the runner as it starts. */
int tr_store_job_set_loader_threads(tr_store_t *s, int64_t id, int threads, struct tr_error *e);
/* The count of daemon deaths a job was running at without making a step
 * in between (the scheduler's start-up sets it, the runner's first step
 * of a run clears it). */
int tr_store_job_set_crashes(tr_store_t *s, int64_t id, int crashes, struct tr_error *e);
/* Adds a run's seconds of training to the job's train_s, as the run ends
 * (a resumed job's elapsed time counts every run).  Ignores seconds <= 0. */
int tr_store_job_add_train_s(tr_store_t *s, int64_t id, double seconds, struct tr_error *e);
/* Replaces a job's spec as given and its normalized spec (a resume that
 * gives it a new end); both JSON object texts.  -ENOENT for an unknown
 * job. */
int tr_store_job_set_spec(tr_store_t *s, int64_t id, const char *spec, const char *normalized, struct tr_error *e);
/* Deletes a job and all its events, metrics and logs (ON DELETE CASCADE). */
int tr_store_job_delete(tr_store_t *s, int64_t id, struct tr_error *e);

/* ---- events (for SSE) --------------------------------------------------- */

/* Event ids are global and increasing (INTEGER PRIMARY KEY). */
struct tr_event {
	int64_t id;
	int64_t job_id;
	char *type; /* "state", "log", "metrics" */
	char *data; /* JSON text */
	double at;
};
/* Events of job with id > after, ascending, at most limit (job_id 0: all
 * jobs).  "metrics" events are written by the metrics writer once per
 * flush per job, with data {"points": [{"name","step","epoch","wall",
 * "value"}, ...]} (a flush of more than 10,000 points or about 64 KiB of
 * text for one job is split over several events), so an SSE client that resumes from Last-Event-ID
 * sees every point exactly once.  "log" events carry the same object as
 * tr_store_logs_query's entries.  Non-finite numbers are written as null. */
int tr_store_events_after(tr_store_t *s, int64_t job_id, int64_t after, int limit, struct tr_event **events, int *count,
			  struct tr_error *e);
/* The same, stopping before the event whose data would take the total
 * past max_bytes (0: no byte limit); the first event is always returned,
 * whatever its size. */
int tr_store_events_after_max(tr_store_t *s, int64_t job_id, int64_t after, int limit, size_t max_bytes,
			      struct tr_event **events, int *count, struct tr_error *e);
/* Event types, for tr_store_events_read's filter. */
enum {
	TR_EVENT_STATE = 1,
	TR_EVENT_LOG = 2,
	TR_EVENT_METRICS = 4,
	TR_EVENT_ALL = 7,
};
/* tr_store_events_after_max with only the types in the mask (TR_EVENT_*;
 * job_id != 0 for a filter to apply).  *scanned_to (may be NULL) gets the
 * id the read looked up to, skipped events included: the next read goes
 * on after it (>= the last returned id; after, when nothing was read). */
int tr_store_events_read(tr_store_t *s, int64_t job_id, int64_t after, int limit, size_t max_bytes, unsigned types,
			 struct tr_event **events, int *count, int64_t *scanned_to, struct tr_error *e);
void tr_events_free(struct tr_event *events, int count);
/* An id at or above the newest event that is not a "metrics" one: a
 * reader that has looked at every event up to it and wants no metrics
 * events has nothing to read. */
int64_t tr_store_last_other_event_id(tr_store_t *s);
/* A counter that changes whenever anything a metrics or job query could
 * return may have changed (every commit that adds events, truncation,
 * deletion).  Equal values mean an earlier answer is still right, which
 * lets the API cache rendered responses. */
uint64_t tr_store_data_generation(tr_store_t *s);
/* The same for one job: changes after every commit of that job's metrics,
 * logs, events or state, its truncation and any deletion; other jobs'
 * commits leave it unchanged (but for jobs whose ids are a multiple of
 * 1,024 apart).  A value is only comparable with the same job's. */
uint64_t tr_store_job_data_generation(tr_store_t *s, int64_t job_id);
/* Called on the writer thread after it committed points or log lines of
 * job_id and before that job's generation becomes gen: readers still get
 * the old value, and an answer read now (it sees the commit) may be kept
 * under gen.  It must not wait for the writer (no tr_store_flush).  One
 * hook per store; fn NULL removes it.  A hook already running finishes. */
typedef void (*tr_store_commit_hook_fn)(void *ctx, tr_store_t *s, int64_t job_id, uint64_t gen);
void tr_store_set_commit_hook(tr_store_t *s, tr_store_commit_hook_fn fn, void *ctx);
/* Highest event id so far (0 when none). */
int64_t tr_store_last_event_id(tr_store_t *s);
/* Blocks until an event with id > after exists for job_id (any job when
 * job_id == 0), or timeout_ms passes, or tr_store_wake_all is called.
 * Returns 1 when there is something new, 0 on timeout/wake.  timeout_ms
 * < 0 waits without a deadline. */
int tr_store_wait_events(tr_store_t *s, int64_t job_id, int64_t after, int timeout_ms);
/* The same for a reader that wants only the event types in the mask
 * (TR_EVENT_*): without TR_EVENT_METRICS, commits of only metrics events
 * do not end the wait. */
int tr_store_wait_events_types(tr_store_t *s, int64_t job_id, int64_t after, unsigned types, int timeout_ms);
void tr_store_wake_all(tr_store_t *s);

/* ---- experiments (storage/experiments.c) ---------------------------------- */

struct tr_experiment_row {
	int64_t id;
	char *name;
	enum tr_experiment_state state; /* kept as its name */
	int priority;
	bool preemptible;                 /* its trials are submitted preemptible (daemon/preemption.c) */
	char *request;                    /* JSON text: {"spec", "search" (defaults filled), "parameters"} */
	char *error;                      /* JSON object text {"code","message"} or NULL */
	double submitted_at, finished_at; /* Unix seconds; finished_at 0 until an end */
};
void tr_experiment_row_finish(struct tr_experiment_row *row); /* frees strings; accepts zeroed rows */

/* One input of the searcher, in arrival order: a report (failed or with
 * its metric, NaN for none) or a promotion of trial from rung. */
struct tr_experiment_event {
	int64_t seq;
	bool promotion;
	int trial, rung;
	double metric;
	bool failed;
};

/* Inserts row (state as given), setting id and submitted_at. */
int tr_store_experiment_insert(tr_store_t *s, struct tr_experiment_row *row, struct tr_error *e);
int tr_store_experiment_get(tr_store_t *s, int64_t id, struct tr_experiment_row *out, struct tr_error *e); /* -ENOENT */
/* Experiments with id > after, ascending, at most limit (<= 0: all), of
 * one state (NULL: any).  *rows malloc'd: finish each, free the array. */
int tr_store_experiment_list(tr_store_t *s, const enum tr_experiment_state *state, int64_t after, int limit,
			     struct tr_experiment_row **rows, int *count, struct tr_error *e);
/* Sets state and error (NULL = none); stamps finished_at on an end. */
int tr_store_experiment_set_state(tr_store_t *s, int64_t id, enum tr_experiment_state state, const char *error_json,
				  struct tr_error *e);
/* Appends one searcher input. */
int tr_store_experiment_event_add(tr_store_t *s, int64_t id, const struct tr_experiment_event *ev, struct tr_error *e);
/* Every input of experiment id in order; *events malloc'd (may be NULL
 * when *count is 0). */
int tr_store_experiment_events(tr_store_t *s, int64_t id, struct tr_experiment_event **events, int *count,
			       struct tr_error *e);
/* Experiments by state, counts indexed by enum tr_experiment_state
 * (storage/experiment_counts.c); -EBADMSG naming a state the store does
 * not know. */
int tr_store_experiment_counts(tr_store_t *s, int64_t counts[TR_EXP_NSTATES], struct tr_error *e);

/* ---- metrics ------------------------------------------------------------- */

/* Steps a metric point may carry: within +-2^62, so that
 * block and bucket arithmetic on them never overflows int64.  Public so
 * that callers can refuse a point with their own message instead of
 * having it dropped. */
#define TR_STORE_STEP_LIMIT (INT64_C(1) << 62)

/* Queues one point; never blocks on I/O.  Returns -ENOBUFS (and counts a
 * drop) when the queue is full.  name: non-empty UTF-8; |step| <= 2^62.
 * Points of a job deleted before they are written vanish silently. */
int tr_store_metric_append(tr_store_t *s, int64_t job_id, const char *name, int64_t step, int64_t epoch, double wall,
			   double value, struct tr_error *e);
/* As tr_store_metric_append, for a point pushed through the API: it
 * replaces the series' point at the same step, if any, so that a client
 * that re-posts (a retry) never makes a duplicate (docs/design.md,
 * "Pushed metrics"). */
int tr_store_metric_put(tr_store_t *s, int64_t job_id, const char *name, int64_t step, int64_t epoch, double wall,
			double value, struct tr_error *e);
/* Points dropped for job_id since it started (0 = total); log lines
 * dropped from the shared queue count too. */
int64_t tr_store_metric_drops(tr_store_t *s, int64_t job_id);
/* Writes everything queued now and waits for it to be committed. */
int tr_store_flush(tr_store_t *s, struct tr_error *e);

struct tr_metrics_query {
	const char *const *names; /* NULL-terminated, NULL = all names */
	int64_t from_step;        /* inclusive, default 0 */
	int64_t to_step;          /* inclusive, default INT64_MAX */
	int max_points;           /* per series; 0 = no downsampling */
	/* With max_points 0: a series with more points in range fails the
	 * read with -E2BIG (message names it); 0 = no limit. */
	int64_t max_raw;
	bool with_epochs, with_times;
	bool count_only; /* series come with total set and no points */
	/* Series may come as text only (text set, no points): a whole-curve
	 * downsampled query (to_step >= 2^62, 2 <= max_points <= 10,000) is
	 * then answered incrementally from the previous answer. */
	bool want_text;
};

/* One series of an answer.  Downsampled: point i stands for bucket i and
 * is that bucket's last point (step, epoch, wall, value), min/max are the
 * extremes of the bucket's values; otherwise the raw points, min == max
 * == value. */
struct tr_metrics_point {
	int64_t step, epoch;
	double wall, value, min, max;
};
struct tr_metrics_series {
	const char *name; /* borrowed, valid during the callback */
	bool downsampled;
	int64_t total; /* points of the series in range */
	size_t n;
	struct tr_metrics_point *pts; /* malloc'd */
	char *text;                   /* malloc'd, tr_metrics_series_text's form, or NULL */
	size_t text_len;
};
void tr_metrics_series_finish(struct tr_metrics_series *s); /* frees pts and text */
/* Called per series; a nonzero return stops the read and is returned. */
typedef int (*tr_metrics_series_fn)(void *ctx, const struct tr_metrics_series *s);

/* Reads the series of a query in one read transaction, in name order,
 * calling fn for each that has points in range (names without any are
 * left out), points in step order.  Returns 0, fn's nonzero return, or a
 * negative code (-EINVAL for max_points < 0, -E2BIG for max_raw).
 *
 * Downsampling, with max_points m > 0 and more than m points in
 * [lo, hi] (the first and last steps of the series within
 * [from_step, to_step]):
 *  - every point belongs to exactly one bucket; each non-empty bucket
 *    gives one point: its last point (the latest written among equal
 *    steps), with the min and max value over the bucket;
 *  - m >= 2: step lo is a bucket of its own, so the first point is kept;
 *    the steps in [lo + 1, hi] fall into aligned buckets
 *    [k*w, k*w + w - 1], w the smallest power of two that makes at most
 *    m - 1 buckets (so at most m points come back, and the last one is the
 *    series' last point);
 *  - m == 1: one bucket, the series' last point with the overall extremes.
 * Values order NaN above +inf (a diverged loss is a bucket's max).  The
 * edges depend only on lo, hi and m: a series that grows keeps them until
 * w doubles. */
int tr_store_metrics_read(tr_store_t *s, int64_t job_id, const struct tr_metrics_query *q, tr_metrics_series_fn fn,
			  void *ctx, struct tr_error *e);
/* The same as JSON: {"series": {"loss": {"downsampled": bool, "steps":
 * [...], "values": [...], ["min": [...], "max": [...]] (downsampled
 * only), ["epochs": [...]], ["times": [...]]}, ...}}, a new reference, or
 * NULL on error.  Non-finite values come out as null. */
json_t *tr_store_metrics_query(tr_store_t *s, int64_t job_id, const struct tr_metrics_query *q, struct tr_error *e);
/* One series as JSON text, `"name":{...}` as above (reals always with a
 * '.' or an exponent; s->text copied when set); *text malloc'd.  0 or
 * -ENOMEM. */
int tr_metrics_series_text(const struct tr_metrics_series *s, bool with_epochs, bool with_times, char **text,
			   size_t *len, struct tr_error *e);
/* The last point of a series (the latest written among equal steps):
 * 1 and *step / *value (NaN for a NaN point), 0 when it has none, or a
 * negative code. */
int tr_store_metric_last(tr_store_t *s, int64_t job_id, const char *name, int64_t *step, double *value,
			 struct tr_error *e);
/* The last points of several series of a job at once, in one read
 * transaction (a job's summary reads a handful per request): out[i] for
 * names[i], found false when it has none.  0 or a negative code. */
struct tr_metric_last {
	bool found;
	int64_t step;
	double value; /* NaN for a NaN point */
};
int tr_store_metrics_last(tr_store_t *s, int64_t job_id, const char *const *names, size_t n, struct tr_metric_last *out,
			  struct tr_error *e);
/* Sum and number of a series' non-NaN values (reads every point). */
int tr_store_metric_sum(tr_store_t *s, int64_t job_id, const char *name, double *sum, int64_t *count,
			struct tr_error *e);
/* Over the steps where both series have a point: *dot the sum of
 * a * b and *sum_b the sum of b (non-NaN pairs only; 0 and 0 when none).
 * A job's whole-run throughput is dot(samples_per_sec, step_ms) /
 * sum(step_ms): samples over training time.  Reads every point of a. */
int tr_store_metric_dot(tr_store_t *s, int64_t job_id, const char *a, const char *b, double *dot, double *sum_b,
			struct tr_error *e);
/* The mean of a series' points in its newest epoch (the epoch of its last
 * point): 1 with *epoch, *mean and *count, 0 when the series is empty.
 * Reads that epoch's points only, newest first (epochs grow with steps). */
int tr_store_metric_epoch_mean(tr_store_t *s, int64_t job_id, const char *name, int64_t *epoch, double *mean,
			       int64_t *count, struct tr_error *e);
/* Drops what the store keeps between metrics reads (the whole-curve
 * memo); tr_store_close calls it. */
void tr_store_metrics_memo_forget(const tr_store_t *s);
/* Distinct metric names of a job, as a JSON array (new reference). */
json_t *tr_store_metric_names(tr_store_t *s, int64_t job_id, struct tr_error *e);
/* Deletes a job's points with step > step (used when a job resumes from an
 * earlier checkpoint, so replayed steps replace rather than double).
 * Flushes first, so points appended before the call are deleted too. */
int tr_store_metrics_truncate(tr_store_t *s, int64_t job_id, int64_t step, struct tr_error *e);
/* Deletes a job's series name, its points and its rollup.  Flushes first,
 * so points queued before the call are deleted too.  *deleted: the number
 * of points removed (0: the job has no such series). */
int tr_store_metric_series_delete(tr_store_t *s, int64_t job_id, const char *name, int64_t *deleted,
				  struct tr_error *e);

/* ---- logs ---------------------------------------------------------------- */

/* Queued like metrics (also emits a "log" event on flush).  level: syslog
 * priority 0..7.  Invalid UTF-8 bytes in message become '?'. */
int tr_store_log_append(tr_store_t *s, int64_t job_id, int level, const char *message, struct tr_error *e);
/* Log lines with id > after, ascending, at most limit: JSON array of
 * {"id","time","level","message"} (new reference). */
json_t *tr_store_logs_query(tr_store_t *s, int64_t job_id, int64_t after, int limit, struct tr_error *e);

#endif
