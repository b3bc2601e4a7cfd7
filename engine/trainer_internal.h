/* What the trainer's files share (engine/trainer.c and its parts).
 *
 * The trainer is split by concern: trainer_setup.c (data, model checks,
 * create/destroy), trainer_step.c (the per-rank step with upload-ahead and
 * the step dispatch), trainer_monitors.c (monitor values after a step),
 * trainer_snapshot.c (snapshot lending and restore) and trainer.c (the run
 * loop, evaluation, control).  Internal to the engine; the public interface
 * is engine/trainer.h.
 */
#ifndef TR_ENGINE_TRAINER_INTERNAL_H
#define TR_ENGINE_TRAINER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine/data/plan.h"
#include "engine/data/prefetch.h"
#include "engine/early_stop.h"
#include "engine/comm.h"
#include "engine/exact.h"
#include "engine/trainer.h"

#define ERRLEN 512

/* A rank's step results, in doubles, kept on its device until the step's
 * final sync (docs/design.md, "Host waits"): the loss sum and correct
 * count, the gradient's sum of squares, per-layer sums of squares (rank 0,
 * one per range of tr_trainer_layer_ranges), exact mode's per-shard loss
 * pairs, and a slot for monitors' reads after the step. */
enum {
	STAT_LOSS = 0,
	STAT_GRAD = 2,
	STAT_LAYERS = 3,
	STAT_SHARDS = STAT_LAYERS + TR_SUMSQ_MAX_RANGES,
	STAT_SCRATCH = STAT_SHARDS + 2 * TR_SPEC_MAX_SHARDS,
	STAT_COUNT = STAT_SCRATCH + 1,
};
_Static_assert(STAT_COUNT == TR_TRAINER_RESULT_DOUBLES, "the estimate's count of the step results");
_Static_assert(TR_SPEC_MAX_SHARDS == TR_SUMSQ_MAX_RANGES / 2, "TR_TRAINER_RESULT_DOUBLES's shard pairs");

struct rank_ctx {
	struct tr_trainer *t;
	int rank;
	tr_replica_t rep;
	/* The other input/label pair (upload-ahead only); swapped with the
	 * replica's when it holds the step about to run. */
	float *spare_input, *spare_labels;
	int64_t ahead_step; /* the step whose share the spare pair holds, or -1 */
	/* STAT_COUNT doubles on the device, and their host_alloc copy, read
	 * only after the sync that follows the to_host of them. */
	double *stats_dev, *stats_host;
	pthread_t thread;
	bool started;
	double loss[2]; /* this step: loss sum, correct count */
	double step_ms;
	double grad_sumsq;
	bool grads_nonfinite; /* stop_on_nan: this step's update was not applied */
	int rc;
	char err[ERRLEN];
	/* Exact mode (trainer_exact.c): a gradient buffer per shard this
	 * rank computes, the views' gradient scratch, collective layers'
	 * per-shard sums, the step's shard set and the exact sum's side. */
	float *shard_grads[TR_SPEC_MAX_SHARDS];
	int n_shard_bufs;
	float *shard_scratch[2];
	float *partials;
	struct tr_shard_set shards;
	struct tr_exact_ctx xctx;
	/* xctx.ov.lo_of's array (trainer_exact.c) */
	size_t bucket_lo[TR_MODEL_MAX_NODES];
};

struct tr_trainer {
	struct tr_trainer_options opt;
	const struct tr_spec *spec;
	tr_backend_t *be;
	int ndev;
	int devs[TR_SPEC_MAX_DEVICES];
	tr_model_t model;
	struct tr_plan plan;
	tr_reader_t *train, *val;         /* in use */
	tr_reader_t *own_train, *own_val; /* opened here, freed here */
	tr_reader_t *val_base;            /* owned base of a validation split slice */
	tr_reader_t *test;                /* data.test, owned; NULL without one */
	/* What the readers opened here hold and the most one get takes
	 * (tr_reader_t's resident_bytes, get_scratch_bytes), for the memory
	 * estimate. */
	int64_t data_bytes, get_scratch_bytes;
	tr_transforms_t *transforms;
	/* The model's description (engine/model_meta.h), put into every
	 * snapshot's and model file's metadata. */
	json_t *model_meta;
	tr_comm_t *comm;
	/* The job's processes (engine/comm.h): this one is process `proc` of
	 * nproc, each with ndev devices, so the job has gdev = nproc * ndev
	 * ranks and this process's device i is global rank proc * ndev + i.
	 * nproc > 1 only in exact mode, on host-memory devices or a backend
	 * with a group communicator: comm_group says comm is one, over every
	 * process's devices (engine/comm_group.h). */
	tr_pcomm_t *pcomm;
	int proc, nproc, gdev;
	bool comm_group;
	struct tr_exact_procs procs;
	/* nproc > 1: the stop and cancel requests the processes agreed on
	 * after the last step (read instead of the flags, which each
	 * process receives at its own time) */
	bool agreed_stop, agreed_cancel;
	struct rank_ctx ranks[TR_SPEC_MAX_DEVICES];
	int opt_buffers;
	bool upload_ahead; /* the backend has a copy stream (to_device_async) */
	/* Zero-copy snapshots (engine/checkpoint.h): possible on host-memory
	 * devices with out-of-place updates.  While a snapshot shares rank
	 * 0's current buffers, `lent` is the trainer's reference on them and
	 * next_bufs the buffers rank 0's next update writes into instead.
	 * Both are touched only by the thread that calls run (rank 0's steps
	 * run on it) and by restore/destroy. */
	struct tr_snapshot_lease *lent;
	float *next_bufs[3];

	/* step dispatch */
	pthread_mutex_t lock;
	pthread_cond_t go, done;
	int64_t gen;
	int finished_ranks;
	bool quit;
	const struct tr_batch *batch;
	int64_t step; /* 0-based index of the step being run */
	float lr;
	bool want_grad_norm;
	bool want_layer_grad_norms;                  /* rank 0 fills layer_grad_sumsq this step */
	double layer_grad_sumsq[TR_SPEC_MAX_LAYERS]; /* before clipping, as grad_norm */
	float *ratio_before, *ratio_after;           /* update_ratio: host copies of rank 0's weights */
	bool ratio_due;                              /* ratio_before holds this step's weights */

	atomic_bool stop_requested, cancel_requested, checkpoint_requested;
	atomic_int stop_reason; /* enum tr_stop_reason of the last stop request */
	int64_t start_step;
	int64_t last_checkpoint_step;
	double last_checkpoint_time;
	tr_prefetch_t *prefetch;

	/* exact mode: each shard's loss sum and correct count this step,
	 * written by the rank that computed it, added in shard order */
	double shard_loss[TR_SPEC_MAX_SHARDS][2];

	struct tr_summary summary;
	double wait_total_ms;

	/* early_stopping (docs/design.md, "Monitors"): the loss metric is the
	 * mean training loss of the steps since the previous evaluation. */
	struct tr_early_stop es;
	double es_loss_sum;
	int64_t es_loss_count;
	bool es_stop; /* patience ran out: end the run before the next step */
};

/* Clocks, the log hook and the metric hook (trainer.c). */
double tr_trainer_mono_s(void);
double tr_trainer_wall_s(void);
void tr_trainer_emit(struct tr_trainer *t, const char *name, int64_t step, int64_t epoch, double value);
void tr_trainer_logf(struct tr_trainer *t, enum tr_log_level lvl, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* trainer_setup.c */
void tr_trainer_stop_rank_threads(struct tr_trainer *t);

/* trainer_step.c */
typedef int (*copy_to_device_fn)(tr_backend_t *be, int dev, void *dst, const void *src, size_t bytes);
bool tr_trainer_can_lend(const tr_backend_t *be);
int tr_trainer_copy_rows(copy_to_device_fn copy, tr_backend_t *be, int dev, float *dx, float *dy, const float *x,
			 const float *y, int off, int len, int F, int L);
/* Each layer's parameters in a parameter-sized buffer as ranges for
 * sumsq_ranges (one per layer where weight and bias are adjacent, as
 * tr_model_build lays them out); layer_of[k] is range k's layer.  Returns
 * the count (0 for a model without parameters). */
int tr_trainer_layer_ranges(const struct tr_trainer *t, size_t *off, size_t *len, int *layer_of);
/* Enqueues the per-layer sums of squares of buf on rank 0's device into
 * its STAT_LAYERS; tr_trainer_layer_sums_read turns their host copy into
 * one sum per layer (0 for layers without parameters). */
int tr_trainer_layer_sums_enqueue(struct tr_trainer *t, const float *buf);
void tr_trainer_layer_sums_read(const struct tr_trainer *t, const double *host, double *out);
/* After a step, on the caller's thread (monitors): the sum of squares of
 * n floats of x on rank 0's device, or each layer's of buf, read at once
 * (one host wait). */
int tr_trainer_read_sumsq(struct tr_trainer *t, size_t n, const float *x, double *out);
int tr_trainer_layer_sumsq(struct tr_trainer *t, const float *buf, double *out);
int tr_trainer_run_step_all(struct tr_trainer *t, struct tr_error *err);
int tr_trainer_start_rank_threads(struct tr_trainer *t, struct tr_error *err);
int tr_trainer_unlend(struct tr_trainer *t, bool keep_values);

/* trainer_exact.c */
/* Rows [off, off + len) of a step of `count` that rank computes. */
void tr_trainer_share(const struct tr_trainer *t, int count, int rank, int *off, int *len);
/* Rows a replica needs for one step; rows of one validation chunk. */
int tr_trainer_max_rows(const struct tr_spec *s, int ndev);
int tr_trainer_eval_rows(const struct tr_trainer *t);
/* Exact mode's buffers of one rank (nothing without exact mode); after
 * the communicator exists. */
int tr_trainer_exact_alloc(struct tr_trainer *t, struct rank_ctx *rc, struct tr_error *err);
void tr_trainer_exact_free(struct tr_trainer *t, struct rank_ctx *rc);
/* This rank's shards' forward and backward passes over its share [off,
 * off + len) of the step, then the exact sum of every shard's gradient
 * into the replica's. */
int tr_trainer_exact_grads(struct tr_trainer *t, struct rank_ctx *rc, int off, int len);
/* After the step's sync: this rank's shards' loss pairs from the host copy
 * of its STAT_SHARDS into the trainer's per-shard table. */
void tr_trainer_exact_losses_read(struct tr_trainer *t, const struct rank_ctx *rc);
/* The step's loss sum, shard by shard in order. */
double tr_trainer_exact_loss(const struct tr_trainer *t);
/* nproc > 1: makes every process's shard losses those of the whole step
 * and agrees on stop and cancel (agreed_*); after each step. */
int tr_trainer_procs_sync(struct tr_trainer *t, struct tr_error *err);
/* tr_prefetch_config.rows of a job of several processes: the rows of this
 * process's shards (ctx is the trainer). */
void tr_trainer_proc_rows(void *ctx, int count, int *begin, int *end);
/* nproc > 1: checks that every process has the same device count, fills
 * t->procs and gives every process process 0's initial weights (host,
 * n_params floats). */
int tr_trainer_procs_setup(struct tr_trainer *t, float *host, struct tr_error *err);

/* Points err at a spec field: its message prefixed with the pointer
 * ("/cpu_dense: this build has no oneDNN ..."). */
void tr_trainer_error_at(struct tr_error *err, const char *pointer);

/* trainer_conv_routes.c: each conv2d layer's route on CPU devices (the
 * spec's, the daemon's, or "auto" measured per layer and per pair of
 * neighbours), logged and shown as the info field conv_routes; then the
 * chains of oneDNN layers in its blocked layout.  A checkpoint keeps the
 * routes (tr_trainer_routes_text), and a resumed run adopts the
 * checkpoint's (logging a warning where it cannot: another model, or
 * oneDNN missing from this build). */
int tr_trainer_conv_routes(struct tr_trainer *t, int rows, struct tr_error *err);
void tr_trainer_conv_chains(struct tr_trainer *t, int rows);
void tr_trainer_conv_routes_adopt(struct tr_trainer *t, const char *text);

/* trainer_routes_text.c: the routes of the model's layers of `type`
 * (TR_LAYER_CONV2D or TR_LAYER_DENSE) as text, "onednn,im2col", one per
 * layer in node order; "" without such layers, off CPU devices, or where
 * the list would not fit n bytes.  tr_trainer_show_routes gives it to the
 * info hook as `key` unless it is "". */
void tr_trainer_routes_text(const struct tr_trainer *t, enum tr_layer_type type, char *buf, size_t n);
void tr_trainer_show_routes(struct tr_trainer *t, enum tr_layer_type type, const char *key);

/* trainer_dense_routes.c: each dense layer's route on CPU devices
 * (tr_cpu_dense_route), logged and shown as the info field dense_routes. */
int tr_trainer_dense_routes(struct tr_trainer *t, struct tr_error *err);

/* trainer_monitors.c */
void tr_trainer_describe_nonfinite(struct tr_trainer *t, int64_t done, double loss, struct tr_error *err);
void tr_trainer_emit_step_metrics(struct tr_trainer *t, int64_t done, int64_t epoch, int count, double loss,
				  double step_ms, double wait_ms);
bool tr_trainer_grad_norm_due(const struct tr_spec *s, int64_t done, bool per_layer);
int tr_trainer_ratio_prepare(struct tr_trainer *t, int64_t done);

#endif
