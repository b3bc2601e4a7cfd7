/* Schema and forward-only migrations.  PRAGMA user_version holds the number
 * of migrations applied; each migration runs in its own write transaction
 * together with the version bump, so a crash leaves the database at one
 * version or the next, never between.  A database from a newer trainerd is
 * refused rather than guessed at.
 */
#include "storage/internal.h"

#include <errno.h>
#include <stdio.h>

/* Append new migrations at the end; never edit a released one. */
static const char *const migrations[] = {
	/* 1: initial schema.
	 * AUTOINCREMENT on jobs and events: ids are handed to clients (URLs,
	 * Last-Event-ID), so a deleted job's ids must never come back.
	 * metrics_rollup is the min/max pyramid behind downsampling (rollup.c):
	 * it is derived data, written in the same transactions as metrics. */
	"CREATE TABLE jobs ("
	"  id INTEGER PRIMARY KEY AUTOINCREMENT,"
	"  name TEXT NOT NULL DEFAULT '',"
	"  state TEXT NOT NULL,"
	"  priority INTEGER NOT NULL DEFAULT 0,"
	"  spec TEXT NOT NULL,"
	"  normalized TEXT,"
	"  devices TEXT NOT NULL DEFAULT '[]',"
	"  error TEXT,"
	"  idempotency_key TEXT UNIQUE,"
	"  request_hash TEXT,"
	"  submitted_at REAL NOT NULL,"
	"  started_at REAL NOT NULL DEFAULT 0,"
	"  finished_at REAL NOT NULL DEFAULT 0,"
	"  step INTEGER NOT NULL DEFAULT 0,"
	"  total_steps INTEGER NOT NULL DEFAULT 0,"
	"  epoch INTEGER NOT NULL DEFAULT 0,"
	"  loss REAL,"
	"  updated_at REAL NOT NULL DEFAULT 0"
	");"
	"CREATE INDEX jobs_by_state ON jobs(state, priority DESC, submitted_at, id);"
	"CREATE TABLE events ("
	"  id INTEGER PRIMARY KEY AUTOINCREMENT,"
	"  job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,"
	"  type TEXT NOT NULL,"
	"  data TEXT NOT NULL,"
	"  at REAL NOT NULL"
	");"
	"CREATE INDEX events_by_job ON events(job_id, id);"
	"CREATE TABLE metrics ("
	"  job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,"
	"  name TEXT NOT NULL,"
	"  step INTEGER NOT NULL,"
	"  epoch INTEGER NOT NULL,"
	"  wall REAL NOT NULL,"
	"  value REAL" /* NULL = NaN (SQLite cannot store NaN) */
	");"
	"CREATE INDEX metrics_series ON metrics(job_id, name, step);"
	"CREATE TABLE metrics_rollup ("
	"  job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,"
	"  name TEXT NOT NULL,"
	"  level INTEGER NOT NULL,"
	"  block INTEGER NOT NULL,"
	"  n INTEGER NOT NULL,"
	"  min_step INTEGER NOT NULL, min_epoch INTEGER NOT NULL, min_wall REAL NOT NULL, min_value REAL,"
	"  max_step INTEGER NOT NULL, max_epoch INTEGER NOT NULL, max_wall REAL NOT NULL, max_value REAL,"
	"  PRIMARY KEY (job_id, name, level, block)"
	") WITHOUT ROWID;"
	"CREATE TABLE logs ("
	"  id INTEGER PRIMARY KEY AUTOINCREMENT,"
	"  job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,"
	"  time REAL NOT NULL,"
	"  level INTEGER NOT NULL,"
	"  message TEXT NOT NULL"
	");"
	"CREATE INDEX logs_by_job ON logs(job_id, id);",

	/* 2: checkpoints (storage/checkpoints_*.c).  A checkpoint row is
	 * inserted with complete = 0 and flipped to 1 by the commit, so a
	 * crash mid-write leaves a row that readers skip and the next open
	 * deletes.  Chunks are a rowid table (sqlite3_blob_open needs one) with
	 * the blob as the last column, so the few small columns sit on the
	 * leaf page and length(data) is read without touching the blob's
	 * overflow pages.  The explicit INTEGER PRIMARY KEY keeps rowids
	 * stable across VACUUM. */
	"CREATE TABLE checkpoints ("
	"  id INTEGER PRIMARY KEY AUTOINCREMENT,"
	"  job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,"
	"  step INTEGER NOT NULL,"
	"  epoch INTEGER NOT NULL,"
	"  created_at REAL NOT NULL,"
	"  bytes INTEGER NOT NULL DEFAULT 0,"
	"  sha256 TEXT,"
	"  meta TEXT,"
	"  model_header BLOB,"
	"  params_offset INTEGER NOT NULL DEFAULT 0,"
	"  params_bytes INTEGER NOT NULL DEFAULT 0,"
	"  complete INTEGER NOT NULL DEFAULT 0"
	");"
	"CREATE INDEX checkpoints_by_job ON checkpoints(job_id, step, id);"
	"CREATE TABLE checkpoint_chunks ("
	"  id INTEGER PRIMARY KEY,"
	"  checkpoint_id INTEGER NOT NULL REFERENCES checkpoints(id) ON DELETE CASCADE,"
	"  seq INTEGER NOT NULL,"
	"  data BLOB NOT NULL,"
	"  UNIQUE (checkpoint_id, seq)"
	");",

	/* 3: checkpoint files.  chunk_file = 1: the checkpoint's chunks are in
	 * a SQLite file of its own (storage/checkpoints_files.c), so its bytes are
	 * written once instead of into this database's WAL and then again
	 * into this file.  Rows from before keep 0 and their chunks in
	 * checkpoint_chunks until the open moves them into files
	 * (storage/checkpoints_files.c). */
	"ALTER TABLE checkpoints ADD COLUMN chunk_file INTEGER NOT NULL DEFAULT 0;",

	/* 4: the best checkpoint of early stopping.  best = 1 on at most one
	 * row per job (the newest checkpoint whose meta reason is "best");
	 * pruning by `keep` leaves it alone. */
	"ALTER TABLE checkpoints ADD COLUMN best INTEGER NOT NULL DEFAULT 0;",

	/* 5: info fields, a JSON object of short strings (storage/info.c). */
	"ALTER TABLE jobs ADD COLUMN info TEXT NOT NULL DEFAULT '{}';",

	/* 6: the figures an evaluate job found (storage/results.c), one JSON
	 * object per job; a table of its own so that job rows and their
	 * queries stay as they are. */
	"CREATE TABLE job_results ("
	"  job_id INTEGER PRIMARY KEY REFERENCES jobs(id) ON DELETE CASCADE,"
	"  result TEXT NOT NULL"
	");",

	/* 7: each rollup block's last point (storage/rollup.c), so that a
	 * downsampled bucket made of whole blocks is answered from the rollup
	 * alone.  Rows from before keep NULL there: their buckets seek the
	 * last point in metrics, as all did before. */
	"ALTER TABLE metrics_rollup ADD COLUMN last_step INTEGER;"
	"ALTER TABLE metrics_rollup ADD COLUMN last_epoch INTEGER;"
	"ALTER TABLE metrics_rollup ADD COLUMN last_wall REAL;"
	"ALTER TABLE metrics_rollup ADD COLUMN last_value REAL;",

	/* 8: the loader threads a job's trainer runs with, NULL until it
	 * started (GET /jobs/{id} "loader_threads"). */
	"ALTER TABLE jobs ADD COLUMN loader_threads INTEGER;",

	/* 9: how many times in a row the daemon died while the job ran
	 * without the job making a step in between (daemon/scheduler.c,
	 * max-job-crashes). */
	"ALTER TABLE jobs ADD COLUMN crashes INTEGER NOT NULL DEFAULT 0;",

	/* 10: the seconds of training of a job's earlier runs (a run ended by
	 * a pause, stop or shutdown adds its own), so a resumed job's
	 * elapsed time counts every run and no paused gap. */
	"ALTER TABLE jobs ADD COLUMN train_s REAL NOT NULL DEFAULT 0;",

	/* 11: priority preemption (daemon/preemption.c): whether a job may be
	 * preempted (submit's ?preemptible=true), and its newest preemption
	 * as a JSON object (who preempted it, when, how), NULL when never. */
	"ALTER TABLE jobs ADD COLUMN preemptible INTEGER NOT NULL DEFAULT 0;"
	"ALTER TABLE jobs ADD COLUMN preemption TEXT;",
	/* 12: experiments (storage/experiments.c, docs/experiments.md).  A
	 * trial is a job row carrying its experiment and index; the unique
	 * index makes a trial's job exist at most once, so a daemon that dies
	 * between deciding and recording never starts a trial twice.
	 * pause_at: the step or epoch (the spec's own unit) at which the job
	 * pauses itself, its ASHA rung; 0 = none.  experiment_events holds the
	 * searcher's inputs in arrival order (reports and promotions), from
	 * which core/searcher.h decides again after a restart. */
	"ALTER TABLE jobs ADD COLUMN experiment_id INTEGER;"
	"ALTER TABLE jobs ADD COLUMN trial INTEGER;"
	"ALTER TABLE jobs ADD COLUMN pause_at INTEGER NOT NULL DEFAULT 0;"
	"CREATE UNIQUE INDEX jobs_by_trial ON jobs(experiment_id, trial) WHERE experiment_id IS NOT NULL;"
	"CREATE TABLE experiments ("
	"  id INTEGER PRIMARY KEY AUTOINCREMENT,"
	"  name TEXT NOT NULL,"
	"  state TEXT NOT NULL,"
	"  priority INTEGER NOT NULL DEFAULT 0,"
	"  request TEXT NOT NULL,"
	"  error TEXT,"
	"  submitted_at REAL NOT NULL,"
	"  finished_at REAL NOT NULL DEFAULT 0"
	");"
	"CREATE TABLE experiment_events ("
	"  seq INTEGER PRIMARY KEY AUTOINCREMENT,"
	"  experiment_id INTEGER NOT NULL REFERENCES experiments(id) ON DELETE CASCADE,"
	"  kind TEXT NOT NULL,"
	"  trial INTEGER NOT NULL,"
	"  rung INTEGER NOT NULL,"
	"  metric REAL,"
	"  failed INTEGER NOT NULL DEFAULT 0"
	");"
	"CREATE INDEX experiment_events_by_experiment ON experiment_events(experiment_id, seq);",

	/* 13: preemptible experiments (docs/experiments.md): submit's
	 * ?preemptible=true, which every trial job of the experiment carries
	 * (jobs.preemptible), so a higher-priority job may preempt a trial. */
	"ALTER TABLE experiments ADD COLUMN preemptible INTEGER NOT NULL DEFAULT 0;",

	/* 14: per-job report tokens (storage/job_tokens.c, docs/design.md,
	 * "Worker reports"): the SHA-256 (hex) of the token a Slurm job's
	 * worker reports with, never the token; the row is deleted when the
	 * job ends (and with its job). */
	"CREATE TABLE job_tokens ("
	"  job_id INTEGER PRIMARY KEY REFERENCES jobs(id) ON DELETE CASCADE,"
	"  hash TEXT NOT NULL UNIQUE"
	");",
};

#define NMIGRATIONS ((int)(sizeof migrations / sizeof migrations[0]))

int tr_store_schema_version(void)
{
	return NMIGRATIONS;
}

int tr_store_migrate(struct conn *c)
{
	for (;;) {
		/* The version is read inside the write transaction, so two
		 * processes opening a fresh file cannot both apply a step. */
		int err = tr_store_begin(c, true);
		if (err < 0)
			return err;
		int64_t version = 0;
		err = tr_store_pragma_int(c, "PRAGMA user_version", &version);
		if (err < 0)
			goto fail;
		if (version > NMIGRATIONS) {
			err = tr_store_cfail(c, -ENOTSUP,
					     "%s: database schema version %lld is newer than this trainerd supports "
					     "(version %d); use a newer trainerd",
					     sqlite3_db_filename(c->db, "main"), (long long)version, NMIGRATIONS);
			goto fail;
		}
		if (version == NMIGRATIONS)
			return tr_store_commit(c);
		err = tr_store_exec(c, migrations[version]);
		if (err < 0)
			goto fail;
		char sql[64];
		snprintf(sql, sizeof sql, "PRAGMA user_version=%lld", (long long)version + 1);
		err = tr_store_exec(c, sql);
		if (err < 0)
			goto fail;
		err = tr_store_commit(c);
		if (err < 0)
			goto fail;
		continue;
	fail:
		tr_store_rollback(c);
		return err;
	}
}
