/* The checkpoint writer: one background thread that turns host snapshots
 * into stored checkpoints, so training goes on while a checkpoint of any
 * size is written.  A periodic checkpoint that finds the job's previous
 * one still being written is skipped (the next one comes soon); a final
 * checkpoint (completion, stop, pause, shutdown) waits for its turn and
 * for its own write. */
#ifndef TR_DAEMON_CHECKPOINTER_H
#define TR_DAEMON_CHECKPOINTER_H

#include <stdbool.h>

#include "engine/checkpoint.h"
#include "engine/model/model.h"
#include "storage/store.h"

typedef struct tr_checkpointer tr_checkpointer_t;

tr_checkpointer_t *tr_checkpointer_create(tr_store_t *store);
/* wait = false: queues snap and returns 0 (it now owns snap), or -EBUSY
 * when the job already has a checkpoint queued or being written (the
 * caller keeps snap).  wait = true: always takes snap and returns the
 * write's result. */
int tr_checkpointer_submit(tr_checkpointer_t *cp, int64_t job_id, const tr_model_t *model, enum tr_optim_type opt,
			   int keep, struct tr_snapshot *snap, bool wait);
/* Whether job_id has a checkpoint queued or being written. */
bool tr_checkpointer_busy(tr_checkpointer_t *cp, int64_t job_id);
/* Returns once nothing of job_id is queued or being written: a job's state
 * may say "completed" only when its last checkpoint is durable.  When no
 * job has anything left to write, frees the spare snapshot buffers
 * (tr_snapshot_trim). */
void tr_checkpointer_wait_idle(tr_checkpointer_t *cp, int64_t job_id);
/* Writes what is queued, then stops the thread.  Accepts NULL. */
void tr_checkpointer_destroy(tr_checkpointer_t *cp);

#endif
