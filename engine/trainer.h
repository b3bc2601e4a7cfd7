/* The data-parallel trainer: one replica per device, exact uneven steps.
 *
 * For each step the trainer takes the step's batch from the prefetch ring,
 * gives every device an even share (sizes differ by at most one; a device
 * may get none), has each device compute the sum of its samples' gradients
 * scaled by 1/N_step into a freshly cleared buffer, allreduces (SUM), and
 * applies the identical optimizer update on every replica.  The result is
 * the gradient one device would compute on the whole step, whatever the
 * device count (docs/design.md §1).
 *
 * Rank 0 runs on the thread that calls tr_trainer_run; ranks 1..D-1 have a
 * host thread each.  Metrics, progress and log lines go to caller hooks from
 * the tr_trainer_run thread.  The trainer knows nothing of HTTP or SQLite.
 */
#ifndef TR_TRAINER_H
#define TR_TRAINER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/error.h"
#include "engine/backend.h"
#include "engine/checkpoint.h"
#include "engine/data/reader.h"
#include "engine/memory.h"
#include "engine/model/model.h"
#include "engine/spec.h"

/* Device memory the trainer keeps per device for a step's results (its
 * loss and sums of squares, read after the step's sync: docs/design.md,
 * "Host waits"), in doubles, for the device-memory estimate. */
#define TR_TRAINER_RESULT_DOUBLES (4 + 2 * TR_SUMSQ_MAX_RANGES)

struct tr_metric_point {
	const char *name;
	int64_t step;  /* 1-based count of updates done */
	int64_t epoch; /* 0-based epoch of that step */
	double wall;   /* seconds since the Unix epoch */
	double value;
};

struct tr_progress {
	int64_t step, total_steps; /* steps done, steps planned */
	int64_t epoch, epochs;     /* epochs: 0 when only max_steps bounds the run */
	double loss;
	double samples_per_sec;
	double elapsed_s, eta_s;
	double data_wait_fraction;
};

/* The longest conv_routes or dense_routes info value, with its NUL: one
 * route name and a comma per layer; a model with more layers than fit
 * shows none. */
#define TR_ROUTES_TEXT 1024

enum tr_log_level { TR_LOG_ERROR = 3, TR_LOG_WARNING = 4, TR_LOG_INFO = 6, TR_LOG_DEBUG = 7 };

struct tr_trainer_hooks {
	void (*metric)(void *ctx, const struct tr_metric_point *p);
	void (*progress)(void *ctx, const struct tr_progress *p);
	void (*log)(void *ctx, enum tr_log_level level, const char *msg);
	/* A checkpoint is due (periodic, requested, or `final` at the end of a
	 * completed or stopped run).  The hook owns snap when it returns 0;
	 * otherwise the trainer frees it (a busy writer may skip a periodic
	 * checkpoint, never a final one: it should wait instead). */
	int (*checkpoint)(void *ctx, struct tr_snapshot *snap, bool final);
	/* Optional: true while a periodic checkpoint would be refused anyway
	 * (the writer is still busy with the previous one), so the trainer
	 * skips copying the model for nothing. */
	bool (*checkpoint_busy)(void *ctx);
	/* Optional: an info field changed (docs/design.md, "Info fields"):
	 * phase, epoch, best_val_loss, best_val_loss_step, stop_reason, and
	 * once conv_routes and dense_routes (at most TR_ROUTES_TEXT bytes
	 * with the NUL).  A few calls per epoch; both strings are borrowed. */
	void (*info)(void *ctx, const char *key, const char *value);
	void *ctx;
};

/* The checks of the data against the spec that tr_trainer_create makes
 * first, without a trainer: opens data.train (through roots, as the
 * trainer would), checks model.inputs against it, builds the model on its
 * shape (a dense layer after a convolution without a flatten fails here)
 * and checks the loss against its labels (softmax_cross_entropy on image
 * targets).  For a submit that can open the data (docs/design.md, "Data
 * checks at submit").  Returns 0 or a negative code with err's pointer
 * and message set. */
int tr_trainer_check_data(const struct tr_spec *spec, const tr_data_roots_t *roots, const atomic_bool *cancel,
			  struct tr_error *err);

struct tr_trainer_options {
	const struct tr_spec *spec; /* borrowed; must outlive the trainer */
	tr_backend_t *backend;      /* borrowed */
	int devices;                /* ranks to use; 0 = spec's count, capped by the backend */
	int workers;                /* loader threads; 0 = spec's prefetch.workers */
	/* Data and init.from files open through tr_data_open(data_roots, ...);
	 * NULL: as written, relative to the working directory. */
	const tr_data_roots_t *data_roots; /* borrowed */
	tr_reader_t *train_reader;         /* optional, borrowed: replaces spec's data.train */
	tr_reader_t *val_reader;           /* optional, borrowed */
	struct tr_trainer_hooks hooks;
	/* Optional, borrowed: the caller's cancel flag.  tr_trainer_create
	 * looks at it between phases, while it opens and parses the data and
	 * inside its long loops (standardize statistics, parameter
	 * initialisation) and returns -ECANCELED once
	 * it is set, since no trainer exists yet for tr_trainer_cancel. */
	const atomic_bool *cancel;
	/* Optional: admits the job's host memory estimate (engine/memory.h),
	 * formed once its data is open and before its parameters, replicas
	 * and prefetch ring are allocated; called with hooks.ctx.  Returns 0
	 * to go on, or a negative code with err filled that create returns
	 * (-ENOMEM: it can never fit; -EBUSY: not now).  NULL: the job is
	 * checked alone against the memory available (tr_mem_admit_alone). */
	int (*admit_memory)(void *ctx, const struct tr_mem_estimate *e, struct tr_error *err);
	/* Optional, borrowed: the communicator of the job's processes
	 * (engine/comm.h; NULL: this process alone).  With several, every
	 * process creates its trainer with the same spec and device count and
	 * runs it in step: the exact sum and the step's losses cross
	 * processes, each process computes its own shards, and stop and
	 * cancel take effect at the step the processes agree on.  Hooks are
	 * the caller's: only process 0 should write outputs. */
	struct tr_pcomm *pcomm;
	/* Tests only: after every update fill each gradient buffer with garbage,
	 * so a device that does not clear its buffer corrupts the next step. */
	bool debug_poison_grads;
};

struct tr_summary {
	int64_t steps, epochs, samples;
	double final_loss;
	double wall_s, samples_per_sec, data_wait_fraction;
	double val_loss, val_accuracy; /* NAN when there is no validation */
	/* data.test's figures after a completed run; NAN without one (and
	 * those that do not apply: accuracy for regression, mse/mae/r2 for
	 * classification). */
	double test_loss, test_accuracy, test_mse, test_mae, test_r2;
	bool stopped;       /* ended early by tr_trainer_stop */
	bool early_stopped; /* ended by early_stopping (not "stopped": the run is complete) */
	double best_value;  /* early_stopping: best metric value, NAN before the first */
	int64_t best_step;  /* its step, -1 before the first */
	int64_t first_step; /* 0, or the step a resumed run started at */
	/* Several processes: milliseconds of this run's steps inside the
	 * gathers between processes, and of those waiting for them to end
	 * (the rest overlapped the backward pass; docs/design.md, "Processes
	 * and the communicator"); 0 with one process. */
	double comm_ms, comm_wait_ms;
};

typedef struct tr_trainer tr_trainer_t;

/* Opens the data, builds the model and replicas, starts nothing yet.
 * Errors name the spec field, file or line. */
int tr_trainer_create(const struct tr_trainer_options *opt, tr_trainer_t **out, struct tr_error *err);

/* Trains to the end of the plan.  Returns 0 when it completed or was
 * stopped (summary.stopped), -ECANCELED when cancelled, or another negative
 * code with err set (a loader error names file and sample). */
int tr_trainer_run(tr_trainer_t *t, struct tr_error *err);

/* Why a trainer was stopped early: names its last checkpoint's reason. */
enum tr_stop_reason {
	TR_STOP_STOP,     /* "stop": asked to stop */
	TR_STOP_PAUSE,    /* "pause": to be resumed later */
	TR_STOP_SHUTDOWN, /* "shutdown": the process is going away */
	TR_STOP_PREEMPT,  /* "preempt": set aside for a higher-priority job, resumed later */
};

/* Graceful: finish the current step, then return.  Async-signal-safe. */
void tr_trainer_stop(tr_trainer_t *t);
/* The same, saying why (the last stop request's reason wins). */
void tr_trainer_stop_for(tr_trainer_t *t, enum tr_stop_reason why);
/* Before run: continue from a snapshot (weights, optimizer state and
 * position), or with weights_only take just its weights (init.from another
 * job's checkpoint; optimizer and position start fresh).  The snapshot is
 * only read. */
int tr_trainer_restore(tr_trainer_t *t, const struct tr_snapshot *snap, bool weights_only, struct tr_error *err);
/* Asks for a checkpoint at the next step boundary.  Safe from any thread. */
void tr_trainer_request_checkpoint(tr_trainer_t *t);
/* A host snapshot of rank 0 now (between runs or from a hook).  NULL on
 * failure. */
struct tr_snapshot *tr_trainer_snapshot(tr_trainer_t *t, int64_t step, int64_t epoch, const char *reason);
/* Immediate: wakes every wait (loaders, collectives); run returns
 * -ECANCELED.  Safe from any thread. */
void tr_trainer_cancel(tr_trainer_t *t);

void tr_trainer_summary(const tr_trainer_t *t, struct tr_summary *out);
const tr_model_t *tr_trainer_model(const tr_trainer_t *t);
/* Copies rank `rank`'s parameters to host memory (model n_params floats). */
int tr_trainer_copy_params(tr_trainer_t *t, int rank, float *host);
/* Writes the weights as safetensors with PyTorch names. */
int tr_trainer_save_weights(tr_trainer_t *t, const char *path, struct tr_error *err);
int tr_trainer_device_count(const tr_trainer_t *t);
/* The loader threads it runs with: the options' count, else the spec's
 * prefetch.workers (its default filled in by the parser). */
int tr_trainer_loader_threads(const tr_trainer_t *t);

/* Joins every thread and frees everything.  Accepts NULL. */
void tr_trainer_destroy(tr_trainer_t *t);

#endif
