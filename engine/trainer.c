/* The data-parallel step loop (see trainer.h).
 *
 * Step protocol: the coordinator (rank 0's thread) takes the batch, bumps a
 * generation counter that releases ranks 1..D-1, runs rank 0's share itself,
 * then waits for the others.  The allreduce inside the step is the only
 * point where ranks wait on each other; an error on any rank aborts the
 * communicator so no rank can block forever.  Control flags (stop, cancel)
 * are read between steps; cancel additionally wakes the prefetch ring and
 * the communicator.
 *
 * Upload-ahead (backends with to_device_async): while step s runs, each
 * rank looks whether step s+1 is loaded already and, if so, enqueues its
 * share of s+1 on the device's copy stream into a second pair of input
 * buffers; step s+1 then swaps the pairs and only fences.  The look never
 * waits, so a slow ring costs nothing (step s+1 copies at its start, as
 * without the feature).  Slot s+1 stays valid throughout: the run loop
 * releases a step only after running it, and step s's final sync (or the
 * failure path's) waits for the copy stream before any slot can be freed.
 */
#include "engine/trainer.h"
#include "engine/early_stop.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/cuda/cuda.h"
#include "engine/data/plan.h"
#include "engine/data/prefetch.h"
#include "engine/optim/optimizer.h"
#include "engine/optim/schedule.h"
#include "engine/safetensors.h"

#define ERRLEN 512

struct rank_ctx {
	struct tr_trainer *t;
	int rank;
	tr_replica_t rep;
	/* The other input/label pair (upload-ahead only); swapped with the
	 * replica's when it holds the step about to run. */
	float *spare_input, *spare_labels;
	int64_t ahead_step; /* the step whose share the spare pair holds, or -1 */
	pthread_t thread;
	bool started;
	double loss[2];   /* this step: loss sum, correct count */
	double step_ms;
	double grad_sumsq;
	bool grads_nonfinite; /* stop_on_nan: this step's update was not applied */
	int rc;
	char err[ERRLEN];
};

struct tr_trainer {
	struct tr_trainer_options opt;
	const struct tr_spec *spec;
	tr_backend_t *be;
	int ndev;
	int devs[TR_SPEC_MAX_DEVICES];
	tr_model_t model;
	struct tr_plan plan;
	tr_reader_t *train, *val;          /* in use */
	tr_reader_t *own_train, *own_val;  /* opened here, freed here */
	tr_reader_t *val_base;             /* owned base of a validation split slice */
	tr_transforms_t *transforms;
	tr_comm_t *comm;
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
	bool want_layer_grad_norms;                 /* rank 0 fills layer_grad_sumsq this step */
	double layer_grad_sumsq[TR_SPEC_MAX_LAYERS]; /* before clipping, as grad_norm */
	float *ratio_before, *ratio_after;         /* update_ratio: host copies of rank 0's weights */
	bool ratio_due;                             /* ratio_before holds this step's weights */

	atomic_bool stop_requested, cancel_requested, checkpoint_requested;
	atomic_int stop_reason; /* enum tr_stop_reason of the last stop request */
	int64_t start_step;
	int64_t last_checkpoint_step;
	double last_checkpoint_time;
	tr_prefetch_t *prefetch;

	struct tr_summary summary;
	double wait_total_ms;

	/* early_stopping (docs/design.md, "Monitors"): the loss metric is the
	 * mean training loss of the steps since the previous evaluation. */
	struct tr_early_stop es;
	double es_loss_sum;
	int64_t es_loss_count;
	bool es_stop; /* patience ran out: end the run before the next step */
};

static double mono_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double wall_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void logf_(struct tr_trainer *t, enum tr_log_level lvl, const char *fmt, ...)
{
	if (!t->opt.hooks.log)
		return;
	char buf[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	t->opt.hooks.log(t->opt.hooks.ctx, lvl, buf);
}

static void emit(struct tr_trainer *t, const char *name, int64_t step, int64_t epoch, double value)
{
	if (!t->opt.hooks.metric)
		return;
	struct tr_metric_point p = {.name = name, .step = step, .epoch = epoch, .wall = wall_s(), .value = value};
	t->opt.hooks.metric(t->opt.hooks.ctx, &p);
}

/* ---- data -------------------------------------------------------------- */

/* Both sources synthetic from the same generator (task, shape and seed). */
static bool synthetic_pair(const struct tr_spec *s)
{
	const struct tr_source_spec *a = &s->train, *b = &s->validation;
	return a->format == TR_DATA_SYNTHETIC && b->format == TR_DATA_SYNTHETIC && a->task == b->task &&
	       a->features == b->features && a->classes == b->classes && a->outputs == b->outputs &&
	       a->data_seed == b->data_seed;
}

/* Set-up gives up once the caller's flag or tr_trainer_cancel says so. */
static bool setup_cancelled(struct tr_trainer *t, char *err, size_t errlen)
{
	if (!atomic_load(&t->cancel_requested) && !(t->opt.cancel && atomic_load(t->opt.cancel)))
		return false;
	snprintf(err, errlen, "cancelled");
	return true;
}

static int open_data(struct tr_trainer *t, char *err, size_t errlen)
{
	const struct tr_spec *s = t->spec;
	int rc;
	if (t->opt.train_reader) {
		t->train = t->opt.train_reader;
	} else {
		rc = tr_reader_open(&s->train, s->seed, t->opt.data_roots, t->opt.cancel, &t->own_train, err, errlen);
		if (rc < 0)
			return rc;
		t->train = t->own_train;
	}
	if (t->opt.val_reader) {
		t->val = t->opt.val_reader;
	} else if (s->validation.present && synthetic_pair(s)) {
		/* Synthetic sample i is a pure function of (seed, i): the same
		 * indices would repeat the training samples.  Validation takes the
		 * indices after the training set's from one generator instead. */
		struct tr_source_spec both = s->validation;
		both.samples = s->train.samples + s->validation.samples;
		rc = tr_reader_open(&both, s->seed, t->opt.data_roots, t->opt.cancel, &t->val_base, err, errlen);
		if (rc < 0)
			return rc;
		t->own_val = t->val = tr_reader_slice(t->val_base, s->train.samples, both.samples);
		if (!t->val) {
			snprintf(err, errlen, "out of memory");
			return -ENOMEM;
		}
	} else if (s->validation.present) {
		rc = tr_reader_open(&s->validation, s->seed, t->opt.data_roots, t->opt.cancel, &t->own_val, err, errlen);
		if (rc < 0)
			return rc;
		t->val = t->own_val;
	} else if (s->validation_split > 0.0f) {
		/* The last fraction of the file, in file order, as Keras does:
		 * predictable and independent of the seed. */
		int64_t n = t->train->info.samples;
		int64_t nval = (int64_t)floor((double)n * s->validation_split);
		if (nval < 1 || nval >= n) {
			snprintf(err, errlen, "/data/validation_split: %g of %lld samples leaves an empty %s set",
				 s->validation_split, (long long)n, nval < 1 ? "validation" : "training");
			return -EINVAL;
		}
		tr_reader_t *base = t->train;
		t->train = tr_reader_slice(base, 0, n - nval);
		t->val = tr_reader_slice(base, n - nval, n);
		/* The slices borrow the base: keep it until they are gone, and free
		 * it only when it was opened here. */
		if (t->own_train == base)
			t->val_base = base;
		t->own_train = t->train;
		t->own_val = t->val;
		if (!t->train || !t->val) {
			snprintf(err, errlen, "out of memory");
			return -ENOMEM;
		}
	}
	if (t->val && (t->val->info.features != t->train->info.features ||
		       t->val->info.label_dim != t->train->info.label_dim)) {
		snprintf(err, errlen,
			 "/data/validation: %d features and %d label columns, the training data has %d and %d",
			 t->val->info.features, t->val->info.label_dim, t->train->info.features,
			 t->train->info.label_dim);
		return -EINVAL;
	}
	if (setup_cancelled(t, err, errlen))
		return -ECANCELED;
	return tr_transforms_create_cancellable(s, t->train, t->opt.cancel, &t->transforms, err, errlen);
}

/* ---- model ------------------------------------------------------------- */

static int check_model_against_data(struct tr_trainer *t, char *err, size_t errlen)
{
	const struct tr_spec *s = t->spec;
	const struct tr_reader_info *info = &t->train->info;
	if (s->inputs > 0 && s->inputs != info->features) {
		snprintf(err, errlen, "/model/inputs: %d does not match the %d features of %s", s->inputs,
			 info->features, t->train->name);
		return -EINVAL;
	}
	int out = tr_spec_output_dim(s);
	if (s->loss == TR_LOSS_SOFTMAX_CE && info->label_dim != 1) {
		snprintf(err, errlen,
			 "/model/loss: softmax_cross_entropy needs one class-index label column, %s has %d",
			 t->train->name, info->label_dim);
		return -EINVAL;
	}
	if (s->loss == TR_LOSS_SOFTMAX_CE && out < 2) {
		snprintf(err, errlen, "/model/layers: softmax_cross_entropy needs at least 2 outputs, the model has %d",
			 out);
		return -EINVAL;
	}
	if (s->loss == TR_LOSS_MSE && out != info->label_dim) {
		snprintf(err, errlen, "/model/layers: mse needs %d outputs to match the label columns of %s, the "
				      "model has %d",
			 info->label_dim, t->train->name, out);
		return -EINVAL;
	}
	return 0;
}

/* Every label checked once before the first step, so a bad one names its
 * file and line instead of failing a step (docs/design.md, "Label checks").
 * With validation_split both slices are of the training file. */
static int check_labels(struct tr_trainer *t, char *err, size_t errlen)
{
	const struct tr_spec *s = t->spec;
	int classes = s->loss == TR_LOSS_SOFTMAX_CE ? tr_spec_output_dim(s) : 0;
	struct {
		tr_reader_t *r;
		const char *pointer;
	} src[] = {
		{t->train, "/data/train"},
		{t->val, s->validation.present ? "/data/validation" : "/data/validation_split"},
	};
	for (size_t i = 0; i < sizeof src / sizeof src[0]; i++) {
		char warn[512];
		if (!src[i].r)
			continue;
		int rc = tr_data_check_labels(src[i].r, src[i].pointer, classes, warn, sizeof warn, err, errlen);
		if (rc < 0)
			return rc;
		if (warn[0])
			logf_(t, TR_LOG_WARNING, "%s", warn);
	}
	return 0;
}

static int load_init(struct tr_trainer *t, float *host, char *err, size_t errlen)
{
	char path[4096], msg[1024];
	int fd = tr_data_open(t->opt.data_roots, t->spec->init_from, NULL, path, sizeof path, msg, sizeof msg);
	if (fd < 0) {
		snprintf(err, errlen, "/init/from: %s", msg);
		return fd;
	}
	tr_st_file_t *f;
	int rc = tr_st_open_fd(fd, path, &f, err, errlen);
	if (rc < 0)
		return rc;
	int n = tr_model_param_count(&t->model);
	for (int i = 0; i < n && rc == 0; i++) {
		struct tr_param_view v;
		tr_model_param_view(&t->model, i, &v);
		rc = tr_st_read_f32(f, v.name, v.ndim, v.shape, host + v.offset, err, errlen);
	}
	if (rc == 0 && tr_st_count(f) != n) {
		snprintf(err, errlen, "/init/from: %s has %d tensors, the model has %d", path, tr_st_count(f), n);
		rc = -EINVAL;
	}
	tr_st_close(f);
	return rc;
}

/* A GPU job that cannot fit is refused before anything is allocated, with
 * the estimate and the free memory, instead of failing halfway through
 * replica set-up.  CPU devices share host memory and are not checked. */
static int check_device_memory(struct tr_trainer *t, int max_rows, char *err, size_t errlen)
{
	tr_backend_t *be = t->be;
	if (!be->i->memory_info || strcmp(be->i->name, "cuda") != 0)
		return 0;
	size_t need = tr_cuda_estimate_bytes(&t->model, max_rows, t->train->info.label_dim, t->opt_buffers, t->ndev);
	for (int i = 0; i < t->ndev; i++) {
		size_t total, free_bytes;
		if (be->i->memory_info(be, t->devs[i], &total, &free_bytes) < 0)
			continue;
		/* The estimate includes the CUDA context, which a device in use
		 * already has: compare against free memory plus that share. */
		if (need > free_bytes + TR_CUDA_CONTEXT_BYTES) {
			snprintf(err, errlen,
				 "device %d: this job needs an estimated %.0f MiB per device (batch %d over %d "
				 "devices, %zu parameters), the device has %.0f MiB free of %.0f MiB",
				 t->devs[i], need / 1048576.0, t->spec->batch_size, t->ndev, t->model.n_params,
				 free_bytes / 1048576.0, total / 1048576.0);
			return -ENOMEM;
		}
	}
	return 0;
}

/* ---- one step on one rank --------------------------------------------- */

/* The forward pass reads acts[0], the loss reads labels: after the swap
 * both point at the pair that holds this step's share. */
static void swap_inputs(struct rank_ctx *rc)
{
	tr_replica_t *r = &rc->rep;
	float *x = r->input, *y = r->labels;
	r->input = r->acts[0] = rc->spare_input;
	r->labels = rc->spare_labels;
	rc->spare_input = x;
	rc->spare_labels = y;
}

typedef int (*copy_to_device_fn)(tr_backend_t *be, int dev, void *dst, const void *src, size_t bytes);

/* Copies rows [off, off + len) of host inputs x (F wide) and labels y (L
 * wide) into device buffers dx, dy with `copy` (to_device or
 * to_device_async). */
static int copy_rows(copy_to_device_fn copy, tr_backend_t *be, int dev, float *dx, float *dy, const float *x,
		     const float *y, int off, int len, int F, int L)
{
	int ret = copy(be, dev, dx, x + (size_t)off * F, (size_t)len * F * sizeof(float));
	if (ret == 0)
		ret = copy(be, dev, dy, y + (size_t)off * L, (size_t)len * L * sizeof(float));
	return ret;
}

/* Puts this rank's share of the current step (len > 0 rows from off) in
 * the replica's input buffers: uploaded ahead during the previous step,
 * then the compute stream only waits for that copy, or copied now. */
static int upload_share(struct tr_trainer *t, struct rank_ctx *rc, int off, int len)
{
	tr_backend_t *be = t->be;
	tr_replica_t *r = &rc->rep;
	const struct tr_batch *b = t->batch;
	const int F = t->model.inputs, L = r->label_dim;
	if (rc->ahead_step == t->step) {
		rc->ahead_step = -1;
		swap_inputs(rc);
		return be->i->copies_fence(be, r->dev);
	}
	return copy_rows(be->i->to_device, be, r->dev, r->input, r->labels, b->x, b->y, off, len, F, L);
}

/* When the ring holds step s+1 already, enqueues this rank's share of it
 * into the spare pair on the copy stream, so that it travels while step s
 * computes.  Never waits for data (nor counts in data_wait_ms): a step not
 * loaded yet copies its share itself when it runs; a cancel or a loading
 * error is the run loop's to report.  The spare pair is idle: its last
 * reader was an earlier step, finished by that step's sync. */
static int upload_ahead(struct tr_trainer *t, struct rank_ctx *rc)
{
	int64_t next = t->step + 1;
	if (!t->upload_ahead || rc->ahead_step == next || next >= t->plan.total_steps)
		return 0;
	const struct tr_batch *b;
	if (tr_prefetch_try_next(t->prefetch, next, &b) < 0)
		return 0;
	tr_backend_t *be = t->be;
	const int F = t->model.inputs, L = rc->rep.label_dim;
	int off, len;
	tr_plan_share(b->count, t->ndev, rc->rank, &off, &len);
	if (len == 0)
		return 0; /* idle next step: it clears its gradient, nothing to copy */
	/* Set first: after a failed enqueue the other copy may be in flight,
	 * and the failure path must wait for it (see rank_step). */
	rc->ahead_step = next;
	return copy_rows(be->i->to_device_async, be, rc->rep.dev, rc->spare_input, rc->spare_labels, b->x, b->y, off,
			 len, F, L);
}

/* Whether snapshots can share rank 0's buffers (engine/backend.h). */
static bool can_lend(const tr_backend_t *be)
{
	return be->i->memory_is_host && be->i->sgd_step_into && be->i->adam_step_into;
}

/* Ends the loan: rank 0's replica takes next_bufs as its buffers (adopt;
 * they hold its values by now), or lets go of the lent ones and hands
 * next_bufs back (it is going away).  The lent buffers stay the
 * snapshot's. */
static void end_loan(struct tr_trainer *t, bool adopt)
{
	tr_replica_t *r = &t->ranks[0].rep;
	float **cur[3] = {&r->params, &r->state1, &r->state2};
	for (int k = 0; k <= t->opt_buffers; k++) {
		if (!adopt)
			tr_snapshot_buffer_put(t->next_bufs[k], t->model.n_params);
		*cur[k] = adopt ? t->next_bufs[k] : NULL;
		t->next_bufs[k] = NULL;
	}
	tr_snapshot_lease_drop(t->lent);
	t->lent = NULL;
}

/* Rank 0's update while a snapshot shares its buffers: the results go to
 * next_bufs, which become the replica's. */
static int update_lent(struct tr_trainer *t, tr_replica_t *r, const struct tr_optim_hp *hp)
{
	float **nb = t->next_bufs;
	int ret = tr_optim_apply_into(t->be, r->dev, t->spec->optimizer.type, t->model.n_params, r->params, r->grads,
				      r->state1, r->state2, nb[0], nb[1], nb[2], hp);
	if (ret == 0)
		end_loan(t, true);
	return ret;
}

/* Ends a loan early (the trainer is going away or being restored).
 * keep_values: the replica's values are copied into buffers of its own;
 * otherwise they are about to be freed anyway. */
static int unlend(struct tr_trainer *t, bool keep_values)
{
	if (!t->lent)
		return 0;
	tr_replica_t *r = &t->ranks[0].rep;
	float *cur[3] = {r->params, r->state1, r->state2};
	size_t bytes = t->model.n_params * sizeof(float);
	for (int k = 0; keep_values && k <= t->opt_buffers; k++) {
		int rc = t->be->i->copy(t->be, r->dev, t->next_bufs[k], cur[k], bytes);
		if (rc < 0)
			return rc;
	}
	end_loan(t, keep_values);
	return 0;
}

/* Sum of squares of each layer's parameters (weight and bias together) in
 * buf, a parameter-sized buffer on rank 0's device; 0 for layers without
 * parameters. */
static int layer_sumsq(struct tr_trainer *t, const float *buf, double *out)
{
	const tr_model_t *m = &t->model;
	tr_backend_t *be = t->be;
	int dev = t->ranks[0].rep.dev;
	for (int i = 0; i < m->n_layers; i++) {
		const struct tr_layer *l = &m->layers[i];
		double w = 0, b = 0;
		int ret;
		if (l->w_len && (ret = be->i->sumsq(be, dev, l->w_len, buf + l->w_off, &w)) < 0)
			return ret;
		if (l->b_len && (ret = be->i->sumsq(be, dev, l->b_len, buf + l->b_off, &b)) < 0)
			return ret;
		out[i] = w + b;
	}
	return 0;
}

static int rank_step(struct tr_trainer *t, struct rank_ctx *rc)
{
	double t0 = mono_s();
	tr_replica_t *r = &rc->rep;
	tr_backend_t *be = t->be;
	const struct tr_batch *b = t->batch;
	size_t np = t->model.n_params;
	int off, len, ret;
	tr_plan_share(b->count, t->ndev, rc->rank, &off, &len);
	rc->loss[0] = rc->loss[1] = 0.0;

	/* Never reused from the last step: the backward pass overwrites every
	 * gradient, and an idle rank clears its buffer so that its contribution
	 * to the allreduce is exactly zero (the stale-gradient bug). */
	if (len == 0 && (ret = be->i->memset0(be, r->dev, r->grads, np * sizeof(float))) < 0)
		goto fail;
	if (len > 0 && (ret = upload_share(t, rc, off, len)) < 0)
		goto fail;
	/* Looked for twice: from here the copy overlaps the whole step; before
	 * the final sync the ring has had the step's time to load s+1. */
	if ((ret = upload_ahead(t, rc)) < 0)
		goto fail;
	/* A model whose layers synchronise within the passes (batchnorm2d's
	 * global statistics) runs them on a rank without rows too, with 0
	 * rows: its collectives must meet the other ranks'.  Its gradients
	 * then come out zero as above. */
	r->step_rows = b->count;
	if (len > 0 || t->model.collective) {
		if ((ret = tr_replica_forward(r, len, off, t->step, 1)) < 0 ||
		    (ret = tr_replica_loss(r, len, 1.0f / (float)b->count, rc->loss)) < 0 ||
		    (ret = tr_replica_backward(r, len)) < 0)
			goto fail;
	}
	if (t->ndev > 1 && (ret = be->i->allreduce_sum(t->comm, rc->rank, r->grads, np)) < 0)
		goto fail;

	float clip = t->spec->clip_grad_norm;
	bool stop_on_nan = t->spec->stop_on_nan;
	rc->grad_sumsq = 0.0;
	rc->grads_nonfinite = false;
	if (clip > 0.0f || t->want_grad_norm || stop_on_nan) {
		if ((ret = be->i->sumsq(be, r->dev, np, r->grads, &rc->grad_sumsq)) < 0)
			goto fail;
	}
	/* The sum of squares (in double: no overflow from finite floats) is
	 * finite exactly when every gradient is.  After the allreduce every
	 * rank holds the same gradient and reaches the same verdict, so all
	 * skip the update together and the replicas stay equal; the run loop
	 * then fails the job before any checkpoint can take the bad step. */
	if (stop_on_nan && !isfinite(rc->grad_sumsq)) {
		rc->grads_nonfinite = true;
		goto synced;
	}
	/* Per layer, before clipping like the global norm (the allreduced
	 * gradient is the same on every rank, so rank 0's serves). */
	if (rc->rank == 0 && t->want_layer_grad_norms &&
	    (ret = layer_sumsq(t, r->grads, t->layer_grad_sumsq)) < 0)
		goto fail;
	if (clip > 0.0f) {
		/* torch.nn.utils.clip_grad_norm_: coef = max/(norm+1e-6), clamped at 1 */
		double coef = clip / (sqrt(rc->grad_sumsq) + 1e-6);
		if (coef < 1.0 && (ret = be->i->scale(be, r->dev, np, r->grads, (float)coef)) < 0)
			goto fail;
	}
	struct tr_optim_hp hp = tr_optim_hp_from_spec(t->spec, t->lr, t->step + 1);
	if (rc->rank == 0 && t->lent)
		ret = update_lent(t, r, &hp);
	else
		ret = tr_optim_apply(be, r->dev, t->spec->optimizer.type, t->model.n_trainable, r->params, r->grads,
				     r->state1, r->state2, &hp);
	if (ret < 0)
		goto fail;
	if (t->opt.debug_poison_grads) {
		float *garbage = malloc(np * sizeof(float));
		if (garbage) {
			for (size_t i = 0; i < np; i++)
				garbage[i] = 1e3f + (float)(i % 7);
			be->i->to_device(be, r->dev, r->grads, garbage, np * sizeof(float));
			be->i->sync(be, r->dev);
			free(garbage);
		}
	}
synced:
	if ((ret = upload_ahead(t, rc)) < 0)
		goto fail;
	if ((ret = be->i->sync(be, r->dev)) < 0)
		goto fail;
	rc->step_ms = (mono_s() - t0) * 1e3;
	return 0;
fail:
	snprintf(rc->err, sizeof rc->err, "device %d (rank %d), step %lld: %s", r->dev, rc->rank,
		 (long long)t->step + 1, ret == -ECANCELED ? "cancelled" : be->i->last_error(be));
	if (t->comm)
		be->i->comm_abort(t->comm);
	/* A copy of step s+1 may still read its prefetch slot, which the run
	 * loop frees once this failure has ended the job.  After the abort, so
	 * that no collective holds the device. */
	if (rc->ahead_step == t->step + 1)
		(void)be->i->sync(be, r->dev);
	return ret;
}

static void *rank_main(void *arg)
{
	struct rank_ctx *rc = arg;
	struct tr_trainer *t = rc->t;
	int64_t seen = 0;
	char name[16];
	snprintf(name, sizeof name, "tr-rank%d", rc->rank);
	pthread_setname_np(pthread_self(), name); /* for top -H and perf */
	for (;;) {
		pthread_mutex_lock(&t->lock);
		while (t->gen == seen && !t->quit)
			pthread_cond_wait(&t->go, &t->lock);
		if (t->quit) {
			pthread_mutex_unlock(&t->lock);
			break;
		}
		seen = t->gen;
		pthread_mutex_unlock(&t->lock);

		rc->rc = rank_step(t, rc);

		pthread_mutex_lock(&t->lock);
		t->finished_ranks++;
		pthread_cond_signal(&t->done);
		pthread_mutex_unlock(&t->lock);
	}
	return NULL;
}

/* ---- create / destroy ------------------------------------------------- */

/* The second input/label pair, sized like the replica's. */
static int alloc_spare(struct tr_trainer *t, struct rank_ctx *r, char *err, size_t errlen)
{
	tr_backend_t *be = t->be;
	size_t rows = (size_t)r->rep.max_rows;
	size_t label_floats = rows * (size_t)r->rep.label_dim;
	r->spare_input = be->i->alloc(be, r->rep.dev, rows * (size_t)t->model.inputs * sizeof(float));
	r->spare_labels = be->i->alloc(be, r->rep.dev, (label_floats ? label_floats : 1) * sizeof(float));
	if (!r->spare_input || !r->spare_labels) {
		snprintf(err, errlen, "device %d: out of memory for the second input buffers of %d rows: %s",
			 r->rep.dev, r->rep.max_rows, be->i->last_error(be));
		return -ENOMEM;
	}
	return 0;
}

static void free_spare(struct tr_trainer *t, int rank)
{
	struct rank_ctx *r = &t->ranks[rank];
	if (r->spare_input)
		t->be->i->free(t->be, t->devs[rank], r->spare_input);
	if (r->spare_labels)
		t->be->i->free(t->be, t->devs[rank], r->spare_labels);
	r->spare_input = r->spare_labels = NULL;
}

int tr_trainer_create(const struct tr_trainer_options *opt, tr_trainer_t **out, char *err, size_t errlen)
{
	const struct tr_spec *s = opt->spec;
	tr_backend_t *be = opt->backend;
	struct tr_trainer *t = calloc(1, sizeof *t);
	if (!t) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	t->opt = *opt;
	t->spec = s;
	t->be = be;
	pthread_mutex_init(&t->lock, NULL);
	pthread_cond_init(&t->go, NULL);
	pthread_cond_init(&t->done, NULL);
	t->summary.val_loss = t->summary.val_accuracy = NAN;
	t->summary.best_value = NAN;
	t->summary.best_step = -1;
	if (t->spec->early_stopping.enabled)
		tr_early_stop_init(&t->es, &t->spec->early_stopping);
	t->upload_ahead = be->i->to_device_async && be->i->copies_fence;
	int rc;

	int avail = be->i->device_count(be);
	if (s->n_device_ids > 0 && opt->devices == 0) {
		t->ndev = s->n_device_ids;
		for (int i = 0; i < t->ndev; i++) {
			if (s->device_ids[i] >= avail) {
				snprintf(err, errlen, "/devices/%d: device %d does not exist (%d available)", i,
					 s->device_ids[i], avail);
				rc = -EINVAL;
				goto fail;
			}
			t->devs[i] = s->device_ids[i];
		}
	} else {
		t->ndev = opt->devices > 0 ? opt->devices : (s->device_count > 0 ? s->device_count : avail);
		if (t->ndev > avail) {
			snprintf(err, errlen, "/devices: %d requested, %d available on backend %s", t->ndev, avail,
				 be->i->name);
			rc = -EINVAL;
			goto fail;
		}
		for (int i = 0; i < t->ndev; i++)
			t->devs[i] = i;
	}

	if (setup_cancelled(t, err, errlen)) {
		rc = -ECANCELED;
		goto fail;
	}
	if ((rc = open_data(t, err, errlen)) < 0 || (rc = check_model_against_data(t, err, errlen)) < 0 ||
	    (rc = check_labels(t, err, errlen)) < 0)
		goto fail;
	if ((rc = tr_model_init(&t->model, s, t->train->info.features, err, errlen)) < 0)
		goto fail;
	if ((rc = tr_plan_init(&t->plan, t->train->info.samples, s->batch_size, s->last_batch, s->shuffle, s->seed,
			       s->epochs, s->max_steps, err, errlen)) < 0)
		goto fail;

	float *host = malloc(t->model.n_params * sizeof(float));
	if (!host) {
		snprintf(err, errlen, "out of memory for %zu parameters", t->model.n_params);
		rc = -ENOMEM;
		goto fail;
	}
	if (tr_model_init_params_cancellable(&t->model, host, t->opt.cancel) < 0 || setup_cancelled(t, err, errlen)) {
		snprintf(err, errlen, "cancelled");
		free(host);
		rc = -ECANCELED;
		goto fail;
	}
	if (s->init_from && (rc = load_init(t, host, err, errlen)) < 0) {
		free(host);
		goto fail;
	}
	t->opt_buffers = tr_optim_state_buffers(s->optimizer.type, s);
	int max_rows = (s->batch_size + t->ndev - 1) / t->ndev;
	if ((rc = check_device_memory(t, max_rows, err, errlen)) < 0) {
		free(host);
		goto fail;
	}
	for (int i = 0; i < t->ndev; i++) {
		struct rank_ctx *r = &t->ranks[i];
		r->t = t;
		r->rank = i;
		rc = tr_replica_init(&r->rep, &t->model, be, t->devs[i], max_rows, t->train->info.label_dim,
				     t->opt_buffers, err, errlen);
		/* Before the sync below: it also finishes the spare pair's zeroing,
		 * which the copy stream is not ordered with. */
		if (rc == 0 && t->upload_ahead)
			rc = alloc_spare(t, r, err, errlen);
		if (rc == 0)
			rc = be->i->to_device(be, t->devs[i], r->rep.params, host, t->model.n_params * sizeof(float));
		if (rc == 0)
			rc = be->i->sync(be, t->devs[i]);
		if (rc == 0 && setup_cancelled(t, err, errlen))
			rc = -ECANCELED;
		if (rc < 0) {
			free(host);
			goto fail;
		}
	}
	free(host);
	if (t->ndev > 1) {
		t->comm = be->i->comm_create(be, t->ndev, t->devs);
		if (!t->comm) {
			snprintf(err, errlen, "cannot create a communicator over %d devices: %s", t->ndev,
				 be->i->last_error(be));
			rc = -EIO;
			goto fail;
		}
	}
	for (int i = 0; i < t->ndev; i++) {
		t->ranks[i].rep.comm = t->comm;
		t->ranks[i].rep.rank = i;
		t->ranks[i].rep.ndev = t->ndev;
	}
	*out = t;
	return 0;
fail:
	tr_trainer_destroy(t);
	return rc;
}

static void stop_rank_threads(struct tr_trainer *t)
{
	pthread_mutex_lock(&t->lock);
	t->quit = true;
	pthread_cond_broadcast(&t->go);
	pthread_mutex_unlock(&t->lock);
	for (int i = 1; i < t->ndev; i++) {
		if (t->ranks[i].started)
			pthread_join(t->ranks[i].thread, NULL);
		t->ranks[i].started = false;
	}
}

void tr_trainer_destroy(tr_trainer_t *t)
{
	if (!t)
		return;
	stop_rank_threads(t);
	tr_prefetch_destroy(t->prefetch);
	unlend(t, false);
	for (int i = 0; i < t->ndev; i++) {
		free_spare(t, i);
		tr_replica_finish(&t->ranks[i].rep);
	}
	if (t->comm)
		t->be->i->comm_destroy(t->comm);
	free(t->ratio_before);
	free(t->ratio_after);
	tr_transforms_destroy(t->transforms);
	tr_reader_destroy(t->own_val);
	tr_reader_destroy(t->own_train);
	tr_reader_destroy(t->val_base);
	pthread_cond_destroy(&t->go);
	pthread_cond_destroy(&t->done);
	pthread_mutex_destroy(&t->lock);
	free(t);
}

/* ---- evaluation -------------------------------------------------------- */

static int evaluate(struct tr_trainer *t, double *loss, double *acc, char *err, size_t errlen)
{
	tr_replica_t *r = &t->ranks[0].rep;
	tr_backend_t *be = t->be;
	const int F = t->model.inputs, L = r->label_dim, chunk = r->max_rows;
	int64_t n = t->val->info.samples;
	float *x = malloc((size_t)chunk * F * sizeof(float));
	float *y = malloc((size_t)chunk * L * sizeof(float));
	double sums[2] = {0, 0};
	int rc = 0;
	if (!x || !y) {
		rc = -ENOMEM;
		snprintf(err, errlen, "out of memory for validation");
		goto out;
	}
	for (int64_t base = 0; base < n && rc == 0; base += chunk) {
		int rows = (int)(n - base < chunk ? n - base : chunk);
		/* A validation set may be as large as a training set. */
		if (atomic_load(&t->cancel_requested)) {
			snprintf(err, errlen, "cancelled");
			rc = -ECANCELED;
			break;
		}
		for (int i = 0; i < rows && rc == 0; i++) {
			rc = tr_reader_get(t->val, base + i, x + (size_t)i * F, y + (size_t)i * L, err, errlen);
			if (rc == 0 && t->transforms)
				tr_transforms_apply(t->transforms, x + (size_t)i * F, F, t->spec->seed, 0, base + i, 0);
		}
		if (rc == 0)
			rc = tr_reader_check(t->val, err, errlen);
		if (rc < 0)
			break;
		tr_data_pay_deferred_wait(); /* the chunk is ready after its full loading cost */
		if ((rc = copy_rows(be->i->to_device, be, r->dev, r->input, r->labels, x, y, 0, rows, F, L)) < 0 ||
		    (rc = tr_replica_forward(r, rows, 0, 0, 0)) < 0 ||
		    (rc = tr_replica_loss(r, rows, 0.0f, sums)) < 0 || (rc = be->i->sync(be, r->dev)) < 0)
			snprintf(err, errlen, "validation: %s", be->i->last_error(be));
	}
	*loss = sums[0] / (double)n;
	*acc = sums[1] / (double)n;
out:
	free(x);
	free(y);
	return rc;
}

/* ---- the loop ---------------------------------------------------------- */

static int start_rank_threads(struct tr_trainer *t, char *err, size_t errlen)
{
	for (int i = 1; i < t->ndev; i++) {
		if (pthread_create(&t->ranks[i].thread, NULL, rank_main, &t->ranks[i]) != 0) {
			snprintf(err, errlen, "cannot start the thread of device %d", t->devs[i]);
			return -EAGAIN;
		}
		t->ranks[i].started = true;
	}
	return 0;
}

/* Runs one step on every rank; returns the first rank error. */
static int run_step_all(struct tr_trainer *t, char *err, size_t errlen)
{
	pthread_mutex_lock(&t->lock);
	t->finished_ranks = 0;
	t->gen++;
	pthread_cond_broadcast(&t->go);
	pthread_mutex_unlock(&t->lock);

	t->ranks[0].rc = rank_step(t, &t->ranks[0]);

	pthread_mutex_lock(&t->lock);
	while (t->finished_ranks < t->ndev - 1)
		pthread_cond_wait(&t->done, &t->lock);
	pthread_mutex_unlock(&t->lock);

	/* Report the root cause, not the ranks woken by the abort. */
	int first = 0;
	for (int i = 0; i < t->ndev; i++) {
		if (t->ranks[i].rc < 0 && t->ranks[i].rc != -ECANCELED) {
			snprintf(err, errlen, "%s", t->ranks[i].err);
			return t->ranks[i].rc;
		}
		if (t->ranks[i].rc < 0 && !first)
			first = t->ranks[i].rc;
	}
	if (first)
		snprintf(err, errlen, "cancelled");
	return first;
}

static bool monitor_due(const struct tr_spec *s, const char *name, int64_t done)
{
	for (int m = 0; m < s->n_monitors; m++)
		if (strcmp(s->monitors[m].name, name) == 0 && done % s->monitors[m].every_steps == 0)
			return true;
	return false;
}

/* update_ratio: before a due step, rank 0's weights to the host (lazily
 * allocated, only jobs that ask pay for the two copies). */
static int ratio_prepare(struct tr_trainer *t, int64_t done)
{
	t->ratio_due = monitor_due(t->spec, "update_ratio", done);
	if (!t->ratio_due)
		return 0;
	size_t bytes = t->model.n_params * sizeof(float);
	if (!t->ratio_before && !(t->ratio_before = malloc(bytes)))
		return -ENOMEM;
	if (!t->ratio_after && !(t->ratio_after = malloc(bytes)))
		return -ENOMEM;
	return tr_trainer_copy_params(t, 0, t->ratio_before);
}

/* update_ratio.<i> = ||w_after - w_before|| / ||w_before|| over layer i's
 * weight and bias, in double on the host: the step's relative change, the
 * ~1e-3 rule of thumb's quantity.  A layer whose weights were all zero
 * gets no point for the step (the ratio has no value). */
static void emit_update_ratio(struct tr_trainer *t, int64_t done, int64_t epoch)
{
	if (!t->ratio_due || tr_trainer_copy_params(t, 0, t->ratio_after) < 0)
		return;
	for (int i = 0; i < t->model.n_layers; i++) {
		const struct tr_layer *l = &t->model.layers[i];
		size_t offs[2] = {l->w_off, l->b_off}, lens[2] = {l->w_len, l->b_len};
		double du = 0, w = 0;
		for (int k = 0; k < 2; k++) {
			for (size_t j = offs[k]; j < offs[k] + lens[k]; j++) {
				double b = t->ratio_before[j], d = (double)t->ratio_after[j] - b;
				du += d * d;
				w += b * b;
			}
		}
		if (!l->w_len && !l->b_len)
			continue;
		if (w > 0) {
			char key[80];
			snprintf(key, sizeof key, "update_ratio.%d", i);
			emit(t, key, done, epoch, sqrt(du) / sqrt(w));
		}
	}
}

/* "<name>.<layer index>" for each layer that has parameters (docs/design.md:
 * per-layer names follow the safetensors names' layer index). */
static void emit_per_layer(struct tr_trainer *t, const char *name, int64_t done, int64_t epoch, const double *sumsq)
{
	for (int i = 0; i < t->model.n_layers; i++) {
		if (!t->model.layers[i].w_len && !t->model.layers[i].b_len)
			continue;
		char key[80];
		snprintf(key, sizeof key, "%s.%d", name, i);
		emit(t, key, done, epoch, sqrt(sumsq[i]));
	}
}

/* activation_stats: per layer, the mean, standard deviation (population)
 * and fraction of exact zeros of the layer's outputs over the whole step
 * (every device's share), read from the forward pass's buffers, which
 * backward leaves intact.  Only on due steps: it copies every output. */
static void emit_activation_stats(struct tr_trainer *t, int64_t done, int64_t epoch, int count)
{
	const tr_model_t *m = &t->model;
	tr_backend_t *be = t->be;
	size_t cap = (size_t)t->ranks[0].rep.max_rows * (size_t)m->max_width;
	float *host = malloc(cap * sizeof(float));
	if (!host) {
		logf_(t, TR_LOG_WARNING, "step %lld: activation_stats: out of memory", (long long)done);
		return;
	}
	for (int i = 0; i < m->n_layers; i++) {
		double sum = 0, sumsq = 0, zeros = 0, n = 0;
		for (int k = 0; k < t->ndev; k++) {
			int off, len;
			tr_plan_share(count, t->ndev, k, &off, &len);
			size_t elems = (size_t)len * (size_t)m->layers[i].out;
			tr_replica_t *r = &t->ranks[k].rep;
			if (len == 0 || elems > cap)
				continue;
			if (be->i->to_host(be, r->dev, host, r->acts[i + 1], elems * sizeof(float)) < 0 ||
			    be->i->sync(be, r->dev) < 0) {
				free(host);
				return;
			}
			for (size_t e = 0; e < elems; e++) {
				sum += host[e];
				sumsq += (double)host[e] * host[e];
				zeros += host[e] == 0.0f;
			}
			n += (double)elems;
		}
		if (n == 0)
			continue;
		double mean = sum / n, var = sumsq / n - mean * mean;
		char name[64];
		snprintf(name, sizeof name, "activation_stats.%d.mean", i);
		emit(t, name, done, epoch, mean);
		snprintf(name, sizeof name, "activation_stats.%d.std", i);
		emit(t, name, done, epoch, sqrt(var > 0 ? var : 0));
		snprintf(name, sizeof name, "activation_stats.%d.zeros", i);
		emit(t, name, done, epoch, zeros / n);
	}
	free(host);
}

static void emit_step_metrics(struct tr_trainer *t, int64_t done, int64_t epoch, int count, double loss,
			      double step_ms, double wait_ms)
{
	const struct tr_spec *s = t->spec;
	bool last = done == t->plan.total_steps;
	bool logged = done % s->log_every_steps == 0 || last;
	if (logged) {
		emit(t, "loss", done, epoch, loss);
		emit(t, "lr", done, epoch, t->lr);
		emit(t, "step_ms", done, epoch, step_ms);
		emit(t, "data_wait_ms", done, epoch, wait_ms);
		emit(t, "samples_per_sec", done, epoch, step_ms > 0 ? count / (step_ms / 1e3) : 0.0);
	}
	for (int m = 0; m < s->n_monitors; m++) {
		const struct tr_monitor_spec *mon = &s->monitors[m];
		if (done % mon->every_steps != 0)
			continue;
		if (strcmp(mon->name, "grad_norm") == 0) {
			emit(t, "grad_norm", done, epoch, sqrt(t->ranks[0].grad_sumsq));
			if (mon->per_layer)
				emit_per_layer(t, "grad_norm", done, epoch, t->layer_grad_sumsq);
		} else if (strcmp(mon->name, "weight_norm") == 0) {
			double ss = 0, layers[TR_SPEC_MAX_LAYERS];
			tr_replica_t *r = &t->ranks[0].rep;
			if (t->be->i->sumsq(t->be, r->dev, t->model.n_params, r->params, &ss) == 0)
				emit(t, "weight_norm", done, epoch, sqrt(ss));
			if (mon->per_layer && layer_sumsq(t, r->params, layers) == 0)
				emit_per_layer(t, "weight_norm", done, epoch, layers);
		} else if (strcmp(mon->name, "update_ratio") == 0) {
			emit_update_ratio(t, done, epoch);
		} else if (logged && (strcmp(mon->name, "lr") == 0 || strcmp(mon->name, "samples_per_sec") == 0 ||
				      strcmp(mon->name, "data_wait_ms") == 0)) {
			continue; /* recorded above at this step already */
		} else if (strcmp(mon->name, "lr") == 0) {
			emit(t, "lr", done, epoch, t->lr);
		} else if (strcmp(mon->name, "samples_per_sec") == 0) {
			emit(t, "samples_per_sec", done, epoch, step_ms > 0 ? count / (step_ms / 1e3) : 0.0);
		} else if (strcmp(mon->name, "data_wait_ms") == 0) {
			emit(t, "data_wait_ms", done, epoch, wait_ms);
		} else if (strcmp(mon->name, "activation_stats") == 0) {
			emit_activation_stats(t, done, epoch, count);
		} else if (strcmp(mon->name, "device_step_ms") == 0) {
			for (int k = 0; k < t->ndev; k++) {
				char name[32];
				snprintf(name, sizeof name, "device%d_step_ms", k);
				emit(t, name, done, epoch, t->ranks[k].step_ms);
			}
		}
	}
}

/* stop_on_nan's message: the step, then the first tensor that went bad, in
 * the order the step computes them: the loss (forward), then the
 * gradients in parameter order (PyTorch names).  Only on failure, so the
 * per-tensor sums cost nothing in a healthy run. */
static void describe_nonfinite(struct tr_trainer *t, int64_t done, double loss, char *err, size_t errlen)
{
	const char *hint = "lower /optimizer/lr, set /clip_grad_norm or check the data";
	tr_replica_t *r = &t->ranks[0].rep;
	char first[64] = "";

	for (int i = 0; t->ranks[0].grads_nonfinite && i < tr_model_param_count(&t->model) && !first[0]; i++) {
		struct tr_param_view v;
		double ss = 0;
		tr_model_param_view(&t->model, i, &v);
		if (t->be->i->sumsq(t->be, r->dev, v.len, r->grads + v.offset, &ss) == 0 && !isfinite(ss))
			snprintf(first, sizeof first, "%s", v.name);
	}
	if (!isfinite(loss))
		snprintf(err, errlen,
			 "/stop_on_nan: step %lld: the loss is %s%s%s; the job stopped before the step's checkpoint "
			 "(%s)",
			 (long long)done, isnan(loss) ? "NaN" : "infinite",
			 first[0] ? ", and so is the gradient of " : "", first, hint);
	else
		snprintf(err, errlen,
			 "/stop_on_nan: step %lld: the gradient of %s is not finite (NaN or infinite); the update was "
			 "not applied and the job stopped before the step's checkpoint (%s)",
			 (long long)done, first[0] ? first : "the model", hint);
}

static bool grad_norm_due(const struct tr_spec *s, int64_t done, bool per_layer)
{
	for (int m = 0; m < s->n_monitors; m++)
		if (strcmp(s->monitors[m].name, "grad_norm") == 0 && done % s->monitors[m].every_steps == 0 &&
		    (!per_layer || s->monitors[m].per_layer))
			return true;
	return false;
}

/* A snapshot sharing rank 0's buffers (zero-copy): the buffers the next
 * update will write into are taken now, so that the update cannot fail
 * for want of memory.  A second snapshot before that update shares the
 * same lease. */
static struct tr_snapshot *lend_snapshot(struct tr_trainer *t)
{
	tr_replica_t *r = &t->ranks[0].rep;
	size_t n = t->model.n_params;
	int nbuf = 1 + t->opt_buffers;
	if (!t->lent) {
		float *next[3] = {NULL, NULL, NULL};
		float *cur[3] = {r->params, r->state1, r->state2};
		bool ok = true;
		for (int k = 0; k < nbuf; k++)
			ok = ok && (next[k] = tr_snapshot_buffer_take(n)) != NULL;
		struct tr_snapshot_lease *l = ok ? tr_snapshot_lease_new(n, nbuf, cur) : NULL;
		if (!l) {
			for (int k = 0; k < nbuf; k++)
				tr_snapshot_buffer_put(next[k], n);
			return NULL;
		}
		t->lent = l;
		memcpy(t->next_bufs, next, sizeof next);
	}
	return tr_snapshot_borrow(t->lent, t->opt_buffers);
}

/* A snapshot copied from rank 0, into buffers recycled from the previous
 * checkpoint when there is one (see tr_snapshot_alloc): the copy then
 * faults no page in. */
static struct tr_snapshot *copy_snapshot(struct tr_trainer *t)
{
	size_t n = t->model.n_params;
	struct tr_snapshot *snap = tr_snapshot_alloc(n, t->opt_buffers);
	if (!snap)
		return NULL;
	tr_replica_t *r = &t->ranks[0].rep;
	tr_backend_t *be = t->be;
	bool ok = be->i->to_host(be, r->dev, snap->params, r->params, n * sizeof(float)) == 0;
	for (int k = 0; ok && k < snap->n_state; k++)
		ok = be->i->to_host(be, r->dev, snap->state[k], k == 0 ? r->state1 : r->state2, n * sizeof(float)) == 0;
	ok = ok && be->i->sync(be, r->dev) == 0;
	if (!ok) {
		tr_snapshot_free(snap);
		return NULL;
	}
	return snap;
}

static void save_early_stop(const struct tr_trainer *t, json_t *meta);

struct tr_snapshot *tr_trainer_snapshot(tr_trainer_t *t, int64_t step, int64_t epoch, const char *reason)
{
	/* The out-of-place update writes the parameters only, not the
	 * buffers after them (batchnorm2d's running statistics, which the
	 * forward pass updates in place): such models copy. */
	bool lend = can_lend(t->be) && t->model.n_trainable == t->model.n_params;
	struct tr_snapshot *snap = lend ? lend_snapshot(t) : copy_snapshot(t);
	if (!snap)
		return NULL;
	snap->step = step;
	snap->epoch = epoch;
	tr_backend_t *be = t->be;
	char hash[17], buf[32];
	tr_spec_hash(t->spec, hash);
	snap->meta = json_pack("{s:s, s:s, s:s, s:s}", "format", "pt", "kind", "checkpoint", "producer",
			       "trainerd " TR_VERSION, "spec_hash", hash);
	snprintf(buf, sizeof buf, "%lld", (long long)step);
	json_object_set_new(snap->meta, "step", json_string(buf));
	snprintf(buf, sizeof buf, "%lld", (long long)epoch);
	json_object_set_new(snap->meta, "epoch", json_string(buf));
	snprintf(buf, sizeof buf, "%d", t->ndev);
	json_object_set_new(snap->meta, "devices", json_string(buf));
	json_object_set_new(snap->meta, "backend", json_string(be->i->name));
	static const char *opt_names[] = {"sgd", "adam", "adamw"};
	json_object_set_new(snap->meta, "optimizer", json_string(opt_names[t->spec->optimizer.type]));
	json_object_set_new(snap->meta, "reason", json_string(reason));
	save_early_stop(t, snap->meta);
	return snap;
}

/* A checkpoint carries the early-stopping state (best, its step, the
 * evaluations since) so a resumed job counts patience on from where it
 * was; a checkpoint without it starts the count afresh. */
static void save_early_stop(const struct tr_trainer *t, json_t *meta)
{
	char buf[40];

	if (!t->spec->early_stopping.enabled || !t->es.have_best)
		return;
	snprintf(buf, sizeof buf, "%.17g", t->es.best);
	json_object_set_new(meta, "early_stopping_best", json_string(buf));
	snprintf(buf, sizeof buf, "%lld", (long long)t->es.best_step);
	json_object_set_new(meta, "early_stopping_best_step", json_string(buf));
	snprintf(buf, sizeof buf, "%d", t->es.bad);
	json_object_set_new(meta, "early_stopping_bad", json_string(buf));
}

static void restore_early_stop(struct tr_trainer *t, const struct tr_snapshot *snap)
{
	const char *best = json_string_value(json_object_get(snap->meta, "early_stopping_best"));
	const char *step = json_string_value(json_object_get(snap->meta, "early_stopping_best_step"));
	const char *bad = json_string_value(json_object_get(snap->meta, "early_stopping_bad"));
	char *end;

	if (!t->spec->early_stopping.enabled || !best || !step || !bad)
		return;
	double b = strtod(best, &end);
	if (*end || !isfinite(b))
		return;
	t->es.have_best = true;
	t->es.best = b;
	t->es.best_step = strtoll(step, NULL, 10);
	t->es.bad = atoi(bad);
	t->summary.best_value = b;
	t->summary.best_step = t->es.best_step;
}

int tr_trainer_restore(tr_trainer_t *t, const struct tr_snapshot *snap, bool weights_only, char *err, size_t errlen)
{
	const struct tr_spec *s = t->spec;
	int want_state = tr_optim_state_buffers(s->optimizer.type, s);
	if (snap->n_params != t->model.n_params) {
		snprintf(err, errlen, "the checkpoint has %zu parameters, this model %zu", snap->n_params,
			 t->model.n_params);
		return -EINVAL;
	}
	if (!weights_only && (snap->n_state != want_state || snap->step < 0 || snap->step > t->plan.total_steps)) {
		snprintf(err, errlen, "the checkpoint (%d optimizer buffers, step %lld) does not fit this job (%d "
				      "buffers, %lld steps)",
			 snap->n_state, (long long)snap->step, want_state, (long long)t->plan.total_steps);
		return -EINVAL;
	}
	tr_backend_t *be = t->be;
	size_t bytes = t->model.n_params * sizeof(float);
	/* Writes below must not reach buffers a snapshot still reads. */
	if (unlend(t, true) < 0) {
		snprintf(err, errlen, "device %d: %s", t->ranks[0].rep.dev, be->i->last_error(be));
		return -EIO;
	}
	for (int i = 0; i < t->ndev; i++) {
		tr_replica_t *r = &t->ranks[i].rep;
		int rc = be->i->to_device(be, r->dev, r->params, snap->params, bytes);
		for (int k = 0; rc == 0 && !weights_only && k < snap->n_state; k++)
			rc = be->i->to_device(be, r->dev, k == 0 ? r->state1 : r->state2, snap->state[k], bytes);
		if (rc == 0)
			rc = be->i->sync(be, r->dev);
		if (rc < 0) {
			snprintf(err, errlen, "device %d: %s", r->dev, be->i->last_error(be));
			return rc;
		}
	}
	if (!weights_only) {
		t->start_step = snap->step;
		restore_early_stop(t, snap);
	}
	return 0;
}

void tr_trainer_request_checkpoint(tr_trainer_t *t)
{
	atomic_store(&t->checkpoint_requested, true);
}

static const char *stop_reason_name(int why)
{
	switch (why) {
	case TR_STOP_PAUSE:
		return "pause";
	case TR_STOP_SHUTDOWN:
		return "shutdown";
	default:
		return "stop";
	}
}

/* Takes a checkpoint after step `done` when one is due (or final). */
static void maybe_checkpoint(struct tr_trainer *t, int64_t done, int64_t epoch, bool final)
{
	if (!t->opt.hooks.checkpoint)
		return;
	const struct tr_spec *s = t->spec;
	double now = mono_s();
	const char *reason = NULL;
	if (final)
		reason = t->summary.stopped	  ? stop_reason_name(atomic_load(&t->stop_reason))
			 : t->summary.early_stopped ? "early_stopping"
						    : "final";
	else if (atomic_exchange(&t->checkpoint_requested, false))
		reason = "request";
	else if (s->checkpoint_every_steps > 0 && done % s->checkpoint_every_steps == 0)
		reason = "every_steps";
	else if (s->checkpoint_every_seconds > 0 && now - t->last_checkpoint_time >= s->checkpoint_every_seconds)
		reason = "every_seconds";
	if (!reason)
		return;
	/* A checkpoint at a step that is already saved (final, or after the
	 * best checkpoint of this step's evaluation) adds nothing. */
	if ((final || done > t->start_step) && done == t->last_checkpoint_step && done > 0)
		return;
	if (!final && t->opt.hooks.checkpoint_busy && t->opt.hooks.checkpoint_busy(t->opt.hooks.ctx)) {
		if (strcmp(reason, "request") == 0)
			atomic_store(&t->checkpoint_requested, true); /* keep asking */
		return;
	}
	struct tr_snapshot *snap = tr_trainer_snapshot(t, done, epoch, reason);
	if (!snap) {
		logf_(t, TR_LOG_WARNING, "step %lld: cannot snapshot the model for a checkpoint", (long long)done);
		return;
	}
	if (t->opt.hooks.checkpoint(t->opt.hooks.ctx, snap, final) != 0) {
		tr_snapshot_free(snap);
		return;
	}
	t->last_checkpoint_step = done;
	t->last_checkpoint_time = now;
}

static void set_info(struct tr_trainer *t, const char *key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void set_info(struct tr_trainer *t, const char *key, const char *fmt, ...)
{
	char value[160];
	va_list ap;

	if (!t->opt.hooks.info)
		return;
	va_start(ap, fmt);
	vsnprintf(value, sizeof value, fmt, ap);
	va_end(ap);
	t->opt.hooks.info(t->opt.hooks.ctx, key, value);
}

/* The checkpoint of a new best evaluation: never skipped (the hook waits
 * for a busy writer), since the best weights exist only now. */
static void best_checkpoint(struct tr_trainer *t, int64_t done, int64_t epoch)
{
	if (!t->opt.hooks.checkpoint)
		return;
	struct tr_snapshot *snap = tr_trainer_snapshot(t, done, epoch, "best");
	if (!snap) {
		logf_(t, TR_LOG_WARNING, "step %lld: cannot snapshot the model for the best checkpoint", (long long)done);
		return;
	}
	if (t->opt.hooks.checkpoint(t->opt.hooks.ctx, snap, true) != 0) {
		tr_snapshot_free(snap);
		return;
	}
	t->last_checkpoint_step = done;
	t->last_checkpoint_time = mono_s();
}

/* One evaluation of early_stopping's metric after step `done`. */
static void early_stop_eval(struct tr_trainer *t, int64_t done, int64_t epoch, double val_loss, double val_acc)
{
	const struct tr_early_stop_spec *es = &t->spec->early_stopping;
	double value;

	if (strcmp(es->metric, "val_loss") == 0)
		value = val_loss;
	else if (strcmp(es->metric, "val_accuracy") == 0)
		value = val_acc;
	else
		value = t->es_loss_count > 0 ? t->es_loss_sum / (double)t->es_loss_count : NAN;
	t->es_loss_sum = 0;
	t->es_loss_count = 0;
	switch (tr_early_stop_update(&t->es, value, done)) {
	case TR_ES_IMPROVED:
		t->summary.best_value = t->es.best;
		t->summary.best_step = done;
		logf_(t, TR_LOG_INFO, "step %lld: new best %s %.6g", (long long)done, es->metric, value);
		best_checkpoint(t, done, epoch);
		break;
	case TR_ES_STOP:
		t->es_stop = true;
		set_info(t, "stop_reason", "early_stopping: %s has not improved for %d evaluation(s)", es->metric,
			 es->patience);
		logf_(t, TR_LOG_INFO,
		      "early stopping after step %lld: %s has not improved by more than %g for %d evaluation(s); "
		      "best %.6g at step %lld",
		      (long long)done, es->metric, (double)es->min_delta, es->patience, t->es.best,
		      (long long)t->es.best_step);
		break;
	case TR_ES_WAIT:
		break;
	}
}

int tr_trainer_run(tr_trainer_t *t, char *err, size_t errlen)
{
	const struct tr_spec *s = t->spec;
	int workers = t->opt.workers > 0 ? t->opt.workers : s->prefetch_workers;
	int64_t total = t->plan.total_steps;
	int rc;
	struct tr_prefetch_config pc = {
		.reader = t->train,
		.transforms = t->transforms,
		.plan = &t->plan,
		.backend = t->be,
		.seed = s->seed,
		.workers = workers,
		.depth = s->prefetch_depth,
		.first_step = t->start_step,
		.end_step = total,
	};
	tr_prefetch_t *pf;
	if ((rc = tr_prefetch_create(&pc, &pf, err, errlen)) < 0)
		return rc;
	pthread_mutex_lock(&t->lock);
	t->prefetch = pf;
	pthread_mutex_unlock(&t->lock);
	for (int i = 0; i < t->ndev; i++)
		t->ranks[i].ahead_step = -1;
	/* The first periodic checkpoint's snapshot would otherwise fault its
	 * buffers in between two steps (~80 ms for 100 MB here, against ~15
	 * ms for a copy into recycled ones). */
	if (s->checkpoint_every_steps > 0 || s->checkpoint_every_seconds > 0)
		tr_snapshot_prepare(t->model.n_params, t->opt_buffers);
	if ((rc = start_rank_threads(t, err, errlen)) < 0)
		return rc;
	logf_(t, TR_LOG_INFO, "training %zu parameters on %d %s device(s), %lld steps, %d loader thread(s)",
	      t->model.n_params, t->ndev, t->be->i->name, (long long)total, workers);

	double start = mono_s();
	double samples = 0;
	int64_t step;
	t->summary.first_step = t->start_step;
	t->summary.steps = t->start_step;
	t->last_checkpoint_step = t->start_step;
	t->last_checkpoint_time = start;
	if (t->start_step > 0)
		logf_(t, TR_LOG_INFO, "resuming at step %lld of %lld", (long long)t->start_step, (long long)total);
	double best_val_loss = INFINITY; /* of this run: a resumed run starts afresh */
	set_info(t, "phase", "training");
	for (step = t->start_step; step < total; step++) {
		if (t->es_stop) {
			t->summary.early_stopped = true;
			break;
		}
		if (atomic_load(&t->stop_requested)) {
			t->summary.stopped = true;
			break;
		}
		if (atomic_load(&t->cancel_requested)) {
			rc = -ECANCELED;
			snprintf(err, errlen, "cancelled");
			break;
		}
		/* Before the step's slot is taken, so a failure here holds none. */
		if ((rc = ratio_prepare(t, step + 1)) < 0) {
			snprintf(err, errlen, "update_ratio: cannot copy the weights before step %lld", (long long)step + 1);
			break;
		}
		const struct tr_batch *b;
		double wait_ms = 0;
		double t0 = mono_s();
		rc = tr_prefetch_next(t->prefetch, step, &b, &wait_ms);
		if (rc < 0) {
			if (rc == -ECANCELED)
				snprintf(err, errlen, "cancelled");
			else
				snprintf(err, errlen, "%s", tr_prefetch_error(t->prefetch));
			break;
		}
		t->wait_total_ms += wait_ms;
		t->batch = b;
		t->step = step;
		t->lr = tr_schedule_lr(s, step, total);
		t->want_grad_norm = grad_norm_due(s, step + 1, false);
		t->want_layer_grad_norms = grad_norm_due(s, step + 1, true);
		rc = run_step_all(t, err, errlen);
		int count = b->count;
		int64_t epoch = b->epoch;
		tr_prefetch_release(t->prefetch, step);
		if (rc < 0) {
			if (atomic_load(&t->cancel_requested)) {
				rc = -ECANCELED;
				snprintf(err, errlen, "cancelled");
			}
			break;
		}
		double loss_sum = 0;
		for (int i = 0; i < t->ndev; i++)
			loss_sum += t->ranks[i].loss[0];
		double loss = loss_sum / count;
		if (s->stop_on_nan && (!isfinite(loss) || t->ranks[0].grads_nonfinite)) {
			describe_nonfinite(t, step + 1, loss, err, errlen);
			rc = -EDOM;
			break;
		}
		double step_ms = (mono_s() - t0) * 1e3;
		samples += count;
		t->summary.steps = step + 1;
		t->summary.samples = (int64_t)samples;
		t->summary.final_loss = loss;
		t->summary.epochs = epoch + 1;
		emit_step_metrics(t, step + 1, epoch, count, loss, step_ms, wait_ms);

		bool epoch_end = step + 1 == total || tr_plan_step_epoch(&t->plan, step + 1) != epoch;
		bool eval_due = epoch_end && ((epoch + 1) % s->eval_every_epochs == 0 || step + 1 == total);
		double vl = NAN, va = NAN;
		if (s->early_stopping.enabled) {
			t->es_loss_sum += loss;
			t->es_loss_count++;
		}
		if (epoch_end)
			set_info(t, "epoch", "%lld", (long long)epoch + 1);
		if (eval_due && t->val) {
			set_info(t, "phase", "evaluating");
			rc = evaluate(t, &vl, &va, err, errlen);
			if (rc < 0)
				break;
			if (isfinite(vl) && !(vl >= best_val_loss)) {
				best_val_loss = vl;
				set_info(t, "best_val_loss", "%.6g", vl);
				set_info(t, "best_val_loss_step", "%lld", (long long)step + 1);
			}
			if (step + 1 < total)
				set_info(t, "phase", "training");
			t->summary.val_loss = vl;
			emit(t, "val_loss", step + 1, epoch, vl);
			if (s->loss == TR_LOSS_SOFTMAX_CE) {
				t->summary.val_accuracy = va;
				emit(t, "val_accuracy", step + 1, epoch, va);
			}
		}
		if (eval_due && s->early_stopping.enabled)
			early_stop_eval(t, step + 1, epoch, vl, va);
		if (t->opt.hooks.progress) {
			double el = mono_s() - start;
			struct tr_progress p = {
				.step = step + 1,
				.total_steps = total,
				.epoch = epoch,
				.epochs = t->plan.epochs,
				.loss = loss,
				.samples_per_sec = el > 0 ? samples / el : 0,
				.elapsed_s = el,
				.eta_s = el / (double)(step + 1 - t->start_step) * (double)(total - step - 1),
				.data_wait_fraction = el > 0 ? t->wait_total_ms / 1e3 / el : 0,
			};
			t->opt.hooks.progress(t->opt.hooks.ctx, &p);
		}
		maybe_checkpoint(t, step + 1, epoch, false);
	}
	/* The end of a completed or stopped run is always kept: for a completed
	 * job it is the result, for a stopped one the place to resume. */
	if (rc == 0)
		maybe_checkpoint(t, t->summary.steps, t->summary.epochs > 0 ? t->summary.epochs - 1 : 0, true);
	set_info(t, "phase", rc == 0 && !t->summary.stopped ? "finished" : rc == 0 ? "stopped" : "ended");
	double el = mono_s() - start;
	t->summary.wall_s = el;
	t->summary.samples_per_sec = el > 0 ? samples / el : 0;
	t->summary.data_wait_fraction = el > 0 ? t->wait_total_ms / 1e3 / el : 0;
	stop_rank_threads(t);
	pthread_mutex_lock(&t->lock);
	t->prefetch = NULL;
	pthread_mutex_unlock(&t->lock);
	tr_prefetch_destroy(pf);
	if (rc < 0)
		logf_(t, rc == -ECANCELED ? TR_LOG_WARNING : TR_LOG_ERROR, "%s", err);
	return rc < 0 ? rc : 0;
}

void tr_trainer_stop_for(tr_trainer_t *t, enum tr_stop_reason why)
{
	atomic_store(&t->stop_reason, (int)why);
	atomic_store(&t->stop_requested, true);
}

void tr_trainer_stop(tr_trainer_t *t)
{
	tr_trainer_stop_for(t, TR_STOP_STOP);
}

void tr_trainer_cancel(tr_trainer_t *t)
{
	atomic_store(&t->cancel_requested, true);
	/* The lock keeps the prefetch pointer alive while we use it: the run
	 * thread clears it under the same lock before destroying the pool. */
	pthread_mutex_lock(&t->lock);
	if (t->prefetch)
		tr_prefetch_cancel(t->prefetch);
	if (t->comm)
		t->be->i->comm_abort(t->comm);
	pthread_mutex_unlock(&t->lock);
}

void tr_trainer_summary(const tr_trainer_t *t, struct tr_summary *out)
{
	*out = t->summary;
}

const tr_model_t *tr_trainer_model(const tr_trainer_t *t)
{
	return &t->model;
}

int tr_trainer_device_count(const tr_trainer_t *t)
{
	return t->ndev;
}

int tr_trainer_copy_params(tr_trainer_t *t, int rank, float *host)
{
	tr_replica_t *r = &t->ranks[rank].rep;
	int rc = t->be->i->to_host(t->be, r->dev, host, r->params, t->model.n_params * sizeof(float));
	return rc < 0 ? rc : t->be->i->sync(t->be, r->dev);
}

int tr_trainer_save_weights(tr_trainer_t *t, const char *path, char *err, size_t errlen)
{
	const tr_model_t *m = &t->model;
	int n = tr_model_param_count(m);
	float *host = malloc(m->n_params * sizeof(float));
	struct tr_st_tensor *ts = calloc((size_t)n, sizeof *ts);
	struct tr_param_view *vs = calloc((size_t)n, sizeof *vs);
	int rc = -ENOMEM;
	if (!host || !ts || !vs) {
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	if ((rc = tr_trainer_copy_params(t, 0, host)) < 0) {
		snprintf(err, errlen, "cannot read the weights: %s", t->be->i->last_error(t->be));
		goto out;
	}
	for (int i = 0; i < n; i++) {
		tr_model_param_view(m, i, &vs[i]);
		ts[i] = (struct tr_st_tensor){.name = vs[i].name, .ndim = vs[i].ndim, .data = host + vs[i].offset};
		for (int d = 0; d < vs[i].ndim; d++)
			ts[i].shape[d] = vs[i].shape[d];
	}
	json_t *meta = json_pack("{s:s, s:s, s:s}", "format", "pt", "producer", "trainerd " TR_VERSION, "step", "");
	char step[32];
	snprintf(step, sizeof step, "%lld", (long long)t->summary.steps);
	json_object_set_new(meta, "step", json_string(step));
	rc = tr_st_write(path, ts, n, meta, err, errlen);
	json_decref(meta);
out:
	free(host);
	free(ts);
	free(vs);
	return rc;
}
