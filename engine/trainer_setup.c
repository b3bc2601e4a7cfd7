/* Trainer set-up and tear-down: opening the data, checking the model
 * against it, loading initial weights, the device-memory check, and
 * tr_trainer_create/destroy (docs/design.md §4). */
#include "engine/trainer_internal.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/comm_group.h"
#include "engine/data/plan.h"
#include "engine/data/prefetch.h"
#include "engine/model_meta.h"
#include "engine/optim/optimizer.h"
#include "engine/optim/schedule.h"
#include "engine/safetensors.h"

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
static bool setup_cancelled(struct tr_trainer *t, struct tr_error *err)
{
	if (!atomic_load(&t->cancel_requested) && !(t->opt.cancel && atomic_load(t->opt.cancel)))
		return false;
	tr_error_set(err, 0, 0, NULL, "cancelled");
	return true;
}

/* A reader opened here: what it holds, for the memory estimate. */
static void note_reader(struct tr_trainer *t, const tr_reader_t *r)
{
	t->data_bytes += r->resident_bytes;
	if (r->get_scratch_bytes > t->get_scratch_bytes)
		t->get_scratch_bytes = r->get_scratch_bytes;
}

static int open_data(struct tr_trainer *t, struct tr_error *err)
{
	const struct tr_spec *s = t->spec;
	int rc;
	if (t->opt.train_reader) {
		t->train = t->opt.train_reader;
	} else {
		rc = tr_reader_open(&s->train, s->seed, t->opt.data_roots, t->opt.cancel, &t->own_train, err);
		if (rc < 0)
			return rc;
		note_reader(t, t->own_train);
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
		rc = tr_reader_open(&both, s->seed, t->opt.data_roots, t->opt.cancel, &t->val_base, err);
		if (rc < 0)
			return rc;
		note_reader(t, t->val_base);
		t->own_val = t->val = tr_reader_slice(t->val_base, s->train.samples, both.samples);
		if (!t->val) {
			tr_error_set(err, 0, 0, NULL, "out of memory");
			return -ENOMEM;
		}
	} else if (s->validation.present) {
		rc = tr_reader_open(&s->validation, s->seed, t->opt.data_roots, t->opt.cancel, &t->own_val, err);
		if (rc < 0)
			return rc;
		note_reader(t, t->own_val);
		t->val = t->own_val;
	} else if (s->validation_split > 0.0f) {
		/* The last fraction of the file, in file order, as Keras does:
		 * predictable and independent of the seed. */
		int64_t n = t->train->info.samples;
		int64_t nval = (int64_t)floor((double)n * s->validation_split);
		if (nval < 1 || nval >= n) {
			tr_error_set(err, 0, 0, "/data/validation_split",
				     "/data/validation_split: %g of %lld samples leaves an empty %s set",
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
			tr_error_set(err, 0, 0, NULL, "out of memory");
			return -ENOMEM;
		}
	}
	if (t->val &&
	    (t->val->info.features != t->train->info.features || t->val->info.label_dim != t->train->info.label_dim)) {
		tr_error_set(err, 0, 0, "/data/validation",
			     "/data/validation: %d features and %d label columns, the training data has %d and %d",
			     t->val->info.features, t->val->info.label_dim, t->train->info.features,
			     t->train->info.label_dim);
		return -EINVAL;
	}
	if (s->test.present) {
		rc = tr_reader_open(&s->test, s->seed, t->opt.data_roots, t->opt.cancel, &t->test, err);
		if (rc < 0)
			return rc;
		note_reader(t, t->test);
		if (t->test->info.features != t->train->info.features ||
		    t->test->info.label_dim != t->train->info.label_dim) {
			tr_error_set(err, 0, 0, "/data/test",
				     "/data/test: %d features and %d label columns, the training data has %d and %d",
				     t->test->info.features, t->test->info.label_dim, t->train->info.features,
				     t->train->info.label_dim);
			return -EINVAL;
		}
	}
	if (setup_cancelled(t, err))
		return -ECANCELED;
	return tr_transforms_create_cancellable(s, t->train, t->opt.cancel, &t->transforms, err);
}

/* ---- model ------------------------------------------------------------- */

/* model.inputs against the data, before the model is built on the data's
 * width: a [C, H, W] must be the data's own shape (images, patches, a
 * gzip IDX file) or, for flat data, its element count
 * (tr_reader_check_shape); a number must be the data's width. */
static int check_inputs_against_data(const struct tr_spec *s, tr_reader_t *train, struct tr_error *err)
{
	const struct tr_reader_info *info = &train->info;
	if (s->input_ndim == 3)
		return tr_reader_check_shape(train, s->input_shape, err);
	if (s->inputs > 0 && s->inputs != info->features) {
		tr_error_set(err, 0, 0, "/model/inputs", "/model/inputs: %d does not match the %d features of %s",
			     s->inputs, info->features, train->name);
		return -EINVAL;
	}
	return 0;
}

/* The loss against the data, on the model as built for it. */
static int check_model_against_data(const struct tr_spec *s, tr_reader_t *train, const tr_model_t *model,
				    struct tr_error *err)
{
	const struct tr_reader_info *info = &train->info;
	int out = model->outputs;
	if (s->loss == TR_LOSS_SOFTMAX_CE && info->label_dim != 1) {
		tr_error_set(err, 0, 0, "/model/loss",
			     "/model/loss: softmax_cross_entropy needs one class-index label column, %s has %d%s",
			     train->name, info->label_dim, info->shape[0] ? " (its targets are images: use mse)" : "");
		return -EINVAL;
	}
	if (s->loss == TR_LOSS_SOFTMAX_CE && out < 2) {
		tr_error_set(err, 0, 0, "/model/layers",
			     "/model/layers: softmax_cross_entropy needs at least 2 outputs, the model has %d", out);
		return -EINVAL;
	}
	if (s->loss == TR_LOSS_MSE && out != info->label_dim) {
		tr_error_set(err, 0, 0, "/model/layers",
			     "/model/layers: mse needs %d outputs to match the label columns of %s, the "
			     "model has %d",
			     info->label_dim, train->name, out);
		return -EINVAL;
	}
	return 0;
}

int tr_trainer_check_data(const struct tr_spec *s, const tr_data_roots_t *roots, const atomic_bool *cancel,
			  struct tr_error *err)
{
	tr_reader_t *train = NULL;
	tr_model_t *model = calloc(1, sizeof *model); /* large: not on the stack */
	if (!model)
		return tr_error_set(err, -ENOMEM, 0, NULL, "out of memory");
	int rc = tr_reader_open(&s->train, s->seed, roots, cancel, &train, err);
	if (rc < 0 && !err->pointer[0] && rc != -ECANCELED && rc != -ENOMEM) {
		/* The reader names the file; the answer names the source. */
		char msg[sizeof err->message];
		snprintf(msg, sizeof msg, "%s", err->message);
		tr_error_set(err, rc, 0, "/data/train", "/data/train: %s", msg);
	}
	if (rc == 0 && (rc = check_inputs_against_data(s, train, err)) == 0 &&
	    (rc = tr_model_init_shaped(model, s, train->info.features, train->info.shape, err)) == 0)
		rc = check_model_against_data(s, train, model, err);
	tr_reader_destroy(train);
	free(model);
	return rc;
}

/* Every label checked once before the first step, so a bad one names its
 * file and line instead of failing a step (docs/design.md, "Label checks").
 * With validation_split both slices are of the training file. */
static int check_labels(struct tr_trainer *t, struct tr_error *err)
{
	const struct tr_spec *s = t->spec;
	int classes = s->loss == TR_LOSS_SOFTMAX_CE ? t->model.outputs : 0;
	struct {
		tr_reader_t *r;
		const char *pointer;
	} src[] = {
		{t->train, "/data/train"},
		{t->val, s->validation.present ? "/data/validation" : "/data/validation_split"},
		{t->test, "/data/test"},
	};
	for (size_t i = 0; i < sizeof src / sizeof src[0]; i++) {
		char warn[512];
		if (!src[i].r)
			continue;
		int rc = tr_data_check_labels(src[i].r, src[i].pointer, classes, warn, sizeof warn, err);
		if (rc < 0)
			return rc;
		if (warn[0])
			tr_trainer_logf(t, TR_LOG_WARNING, "%s", warn);
	}
	return 0;
}

/* Batchnorm's step counter: a scalar buffer PyTorch stores as int64. */
static bool is_counter(const struct tr_param_view *v)
{
	const char *dot = strrchr(v->name, '.');
	return v->ndim == 0 && dot && strcmp(dot + 1, "num_batches_tracked") == 0;
}

static int load_init(struct tr_trainer *t, float *host, struct tr_error *err)
{
	char path[4096];
	struct tr_error msg;
	int fd = tr_data_open(t->opt.data_roots, t->spec->init_from, NULL, path, sizeof path, &msg);
	if (fd < 0) {
		tr_error_set(err, 0, 0, "/init/from", "/init/from: %s", msg.message);
		return fd;
	}
	tr_st_file_t *f;
	int rc = tr_st_open_fd(fd, path, &f, err);
	if (rc < 0)
		return rc;
	int n = tr_model_param_count(&t->model), missing = 0;
	for (int i = 0; i < n && rc == 0; i++) {
		struct tr_param_view v;
		tr_model_param_view(&t->model, i, &v);
		if (is_counter(&v)) {
			/* A PyTorch state_dict's counter is I64, and one saved
			 * without it (older PyTorch, hand-made) starts at 0. */
			if (!tr_st_has(f, v.name)) {
				host[v.offset] = 0;
				missing++;
				continue;
			}
			rc = tr_st_read_count(f, v.name, host + v.offset, err);
		} else {
			rc = tr_st_read_f32(f, v.name, v.ndim, v.shape, host + v.offset, err);
		}
	}
	if (rc == 0 && tr_st_count(f) != n - missing) {
		tr_error_set(err, 0, 0, "/init/from", "/init/from: %s has %d tensors, the model has %d", path,
			     tr_st_count(f), n - missing);
		rc = -EINVAL;
	}
	tr_st_close(f);
	return rc;
}

/* A GPU job that cannot fit is refused before anything is allocated, with
 * the estimate and the free memory, instead of failing halfway through
 * replica set-up.  Backends whose devices share host memory (CPU) have no
 * estimate and are not checked (engine/backend.h, memory_estimate). */
static int check_device_memory(struct tr_trainer *t, int max_rows, struct tr_error *err)
{
	tr_backend_t *be = t->be;
	if (!be->i->memory_info || !be->i->memory_estimate)
		return 0;
	size_t need = be->i->memory_estimate(&t->model, max_rows, t->train->info.label_dim, t->opt_buffers, t->ndev);
	for (int i = 0; i < t->ndev; i++) {
		size_t total, free_bytes;
		if (be->i->memory_info(be, t->devs[i], &total, &free_bytes) < 0)
			continue;
		/* The estimate includes the runtime's context, which a device
		 * in use already has: compare against free memory plus that. */
		if (need > free_bytes + be->i->memory_context_bytes) {
			tr_error_set(err, 0, 0, NULL,
				     "device %d: this job needs an estimated %.0f MiB per device (batch %d over %d "
				     "devices, %zu parameters), the device has %.0f MiB free of %.0f MiB",
				     t->devs[i], need / 1048576.0, t->spec->batch_size, t->ndev, t->model.n_params,
				     free_bytes / 1048576.0, total / 1048576.0);
			return -ENOMEM;
		}
	}
	return 0;
}

/* What the job's host memory will hold (engine/memory.h), from the
 * model's own list of replica buffers (as the GPU estimate), the ring and
 * the readers.  The fixed part covers what no list names: the BLAS and
 * oneDNN buffers, the loader and rank threads' stacks and the allocator's
 * slack (measured: tests/memory/check_estimate.py). */
#define HOST_FIXED_BYTES ((uint64_t)48 << 20)
#define HOST_PER_DEVICE_BYTES ((uint64_t)8 << 20)

static void host_estimate(struct tr_trainer *t, int max_rows, struct tr_mem_estimate *e)
{
	const struct tr_spec *s = t->spec;
	tr_backend_t *be = t->be;
	uint64_t params = t->model.n_params * sizeof(float);
	memset(e, 0, sizeof *e);
	if (be->i->memory_is_host) {
		size_t sizes[TR_MODEL_MAX_NODES * 4 + 16];
		int n = tr_replica_buffer_sizes(&t->model, max_rows, t->train->info.label_dim, t->opt_buffers, sizes,
						(int)(sizeof sizes / sizeof sizes[0]));
		uint64_t replica = 0;
		for (int i = 0; i < n && i < (int)(sizeof sizes / sizeof sizes[0]); i++)
			replica += (sizes[i] ? sizes[i] : 1) * sizeof(float);
		uint64_t model = params * (uint64_t)(2 + t->opt_buffers);
		e->model = model * (uint64_t)t->ndev;
		e->activations = (replica > model ? replica - model : 0) * (uint64_t)t->ndev;
	}
	uint64_t sample = (uint64_t)(t->model.inputs + t->train->info.label_dim) * sizeof(float);
	int workers = t->opt.workers > 0 ? t->opt.workers : s->prefetch_workers;
	e->ring = (uint64_t)(s->prefetch_depth > 0 ? s->prefetch_depth : 1) * (uint64_t)s->batch_size * sample;
	e->loaders = (uint64_t)(workers > 0 ? workers : 1) * (uint64_t)t->get_scratch_bytes;
	e->data = (uint64_t)t->data_bytes;
	/* The set-up copy of the parameters, and a checkpoint's snapshot:
	 * the parameters and the optimizer state, copied to host memory. */
	e->scratch = params + params * (uint64_t)(1 + t->opt_buffers) + HOST_FIXED_BYTES +
		     HOST_PER_DEVICE_BYTES * (uint64_t)t->ndev;
	e->total = e->model + e->activations + e->ring + e->loaders + e->data + e->scratch;
}

/* The estimate, logged and admitted (trainer.h, admit_memory). */
static int admit_host_memory(struct tr_trainer *t, int max_rows, struct tr_error *err)
{
	struct tr_mem_estimate e;
	char what[256];
	host_estimate(t, max_rows, &e);
	tr_mem_describe(&e, what, sizeof what);
	tr_trainer_logf(t, TR_LOG_INFO, "memory estimate: %s", what);
	return t->opt.admit_memory ? t->opt.admit_memory(t->opt.hooks.ctx, &e, err) : tr_mem_admit_alone(&e, err);
}

/* ---- create / destroy ------------------------------------------------- */

/* The second input/label pair, sized like the replica's. */
static int alloc_spare(struct tr_trainer *t, struct rank_ctx *r, struct tr_error *err)
{
	tr_backend_t *be = t->be;
	size_t rows = (size_t)r->rep.max_rows;
	size_t label_floats = rows * (size_t)r->rep.label_dim;
	r->spare_input = be->i->alloc(be, r->rep.dev, rows * (size_t)t->model.inputs * sizeof(float));
	r->spare_labels = be->i->alloc(be, r->rep.dev, (label_floats ? label_floats : 1) * sizeof(float));
	if (!r->spare_input || !r->spare_labels) {
		tr_error_set(err, 0, 0, NULL, "device %d: out of memory for the second input buffers of %d rows: %s",
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

/* The rank's step results on its device and their host copy. */
static int alloc_stats(struct tr_trainer *t, struct rank_ctx *r, struct tr_error *err)
{
	tr_backend_t *be = t->be;
	r->stats_dev = be->i->alloc(be, r->rep.dev, STAT_COUNT * sizeof(double));
	r->stats_host = be->i->host_alloc(be, STAT_COUNT * sizeof(double));
	if (!r->stats_dev || !r->stats_host) {
		tr_error_set(err, 0, 0, NULL, "device %d: out of memory for the step's results: %s", r->rep.dev,
			     be->i->last_error(be));
		return -ENOMEM;
	}
	return 0;
}

static void free_stats(struct tr_trainer *t, int rank)
{
	struct rank_ctx *r = &t->ranks[rank];
	if (r->stats_dev)
		t->be->i->free(t->be, t->devs[rank], r->stats_dev);
	if (r->stats_host)
		t->be->i->host_free(t->be, r->stats_host);
	r->stats_dev = r->stats_host = NULL;
}

void tr_trainer_error_at(struct tr_error *err, const char *pointer)
{
	char why[sizeof err->message]; /* not formatted into itself */
	snprintf(why, sizeof why, "%s", err->message);
	tr_error_set(err, 0, 0, pointer, "%s: %s", pointer, why);
}

/* Several processes take process 0's conv2d and dense routes: each
 * measures its own, and routes that differ would give shards different
 * bits.  Two per node: conv.route, gemm_route. */
static int share_routes(struct tr_trainer *t, struct tr_error *err)
{
	tr_model_t *m = &t->model;
	if (t->nproc <= 1 || m->n_nodes == 0)
		return 0;
	int *routes = calloc(2 * (size_t)m->n_nodes, sizeof *routes);
	if (!routes) {
		tr_error_set(err, 0, 0, NULL, "out of memory");
		return -ENOMEM;
	}
	for (int i = 0; i < m->n_nodes; i++) {
		routes[2 * i] = m->layers[i].conv.route;
		routes[2 * i + 1] = (int)m->layers[i].gemm_route;
	}
	int rc = t->pcomm->i->bcast(t->pcomm, routes, 2 * (size_t)m->n_nodes * sizeof *routes, 0);
	for (int i = 0; i < m->n_nodes && rc == 0; i++) {
		if (m->layers[i].type == TR_LAYER_CONV2D)
			m->layers[i].conv.route = routes[2 * i];
		m->layers[i].gemm_route = (enum tr_cpu_gemm)routes[2 * i + 1];
	}
	if (rc < 0)
		tr_error_set(err, 0, 0, NULL, "processes: layer routes: %s", t->pcomm->i->last_error(t->pcomm));
	free(routes);
	return rc;
}

/* The job's processes (engine/comm.h): one unless the caller passes a
 * communicator of several, which only exact mode can use: on host-memory
 * devices its sum gathers each process's shard slots (engine/exact.c),
 * on a backend with a group communicator (GPUs: NCCL) the sum goes
 * through that (engine/comm_group.h), over the process's own devices:
 * those of its local rank on the machine, when devices are counted. */
static int join_processes(struct tr_trainer *t, const struct tr_trainer_options *opt, struct tr_error *err)
{
	t->pcomm = opt->pcomm ? opt->pcomm : tr_pcomm_single();
	t->nproc = t->pcomm->i->size(t->pcomm);
	t->proc = t->pcomm->i->rank(t->pcomm);
	t->gdev = t->nproc * t->ndev;
	t->comm_group = tr_comm_group_used(t->be, t->nproc);
	if (t->comm_group && t->spec->n_device_ids == 0) {
		int first =
			tr_comm_group_first_device(tr_pcomm_local_rank(), t->ndev, t->be->i->device_count(t->be), err);
		if (first < 0)
			return first;
		for (int i = 0; i < t->ndev; i++)
			t->devs[i] = first + i;
	}
	if (t->nproc <= 1)
		return 0;
	if (t->nproc > TR_MAX_PROCESSES) {
		tr_error_set(err, 0, 0, "/processes", "/processes: %d processes, at most %d", t->nproc,
			     TR_MAX_PROCESSES);
		return -EINVAL;
	}
	if (!t->spec->exact_shards) {
		tr_error_set(err, 0, 0, "/exact",
			     "/exact: a job of %d processes needs exact mode (\"exact\": true): only the exact sum "
			     "crosses processes",
			     t->nproc);
		return -EINVAL;
	}
	if (!t->be->i->memory_is_host && !t->comm_group) {
		tr_error_set(err, 0, 0, "/processes",
			     "/processes: %d processes on %s devices need the backend's communicator across "
			     "processes (the CUDA module's NCCL), which this one lacks",
			     t->nproc, t->be->i->name);
		return -EINVAL;
	}
	return 0;
}

int tr_trainer_create(const struct tr_trainer_options *opt, tr_trainer_t **out, struct tr_error *err)
{
	const struct tr_spec *s = opt->spec;
	tr_backend_t *be = opt->backend;
	struct tr_trainer *t = calloc(1, sizeof *t);
	if (!t) {
		tr_error_set(err, 0, 0, NULL, "out of memory");
		return -ENOMEM;
	}
	t->opt = *opt;
	t->spec = s;
	t->be = be;
	pthread_mutex_init(&t->lock, NULL);
	pthread_cond_init(&t->go, NULL);
	pthread_cond_init(&t->done, NULL);
	t->summary.val_loss = t->summary.val_accuracy = NAN;
	t->summary.test_loss = t->summary.test_accuracy = NAN;
	t->summary.test_mse = t->summary.test_mae = t->summary.test_r2 = NAN;
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
				tr_error_set(err, 0, 0, NULL, "/devices/%d: device %d does not exist (%d available)", i,
					     s->device_ids[i], avail);
				rc = -EINVAL;
				goto fail;
			}
			t->devs[i] = s->device_ids[i];
		}
	} else {
		t->ndev = opt->devices > 0 ? opt->devices : (s->device_count > 0 ? s->device_count : avail);
		if (t->ndev > avail) {
			tr_error_set(err, 0, 0, "/devices", "/devices: %d requested, %d available on backend %s",
				     t->ndev, avail, be->i->name);
			rc = -EINVAL;
			goto fail;
		}
		for (int i = 0; i < t->ndev; i++)
			t->devs[i] = i;
	}

	if ((rc = join_processes(t, opt, err)) < 0)
		goto fail;
	if (setup_cancelled(t, err)) {
		rc = -ECANCELED;
		goto fail;
	}
	/* A model without model.inputs takes the data's [C, H, W] (flat
	 * data has none: shape[0] is 0). */
	if ((rc = open_data(t, err)) < 0 || (rc = check_inputs_against_data(s, t->train, err)) < 0 ||
	    (rc = tr_model_init_shaped(&t->model, s, t->train->info.features, t->train->info.shape, err)) < 0 ||
	    (rc = check_model_against_data(s, t->train, &t->model, err)) < 0 || (rc = check_labels(t, err)) < 0)
		goto fail;
	/* What a model file needs to be used (docs/model-format.md): known
	 * now, with the transforms fitted and the input width found. */
	if (!(t->model_meta = json_object())) {
		tr_error_set(err, 0, 0, NULL, "out of memory");
		rc = -ENOMEM;
		goto fail;
	}
	if ((rc = tr_model_meta_describe(t->model_meta, s, &t->model, t->transforms, t->train, err)) < 0)
		goto fail;
	if ((rc = tr_plan_init(&t->plan, t->train->info.samples, s->batch_size, s->last_batch, s->shuffle, s->seed,
			       s->epochs, s->max_steps, err)) < 0)
		goto fail;

	t->opt_buffers = tr_optim_state_buffers(s->optimizer.type, s);
	int max_rows = tr_trainer_max_rows(s, t->gdev);
	if ((rc = admit_host_memory(t, max_rows, err)) < 0)
		goto fail;
	float *host = malloc(t->model.n_params * sizeof(float));
	if (!host) {
		tr_error_set(err, 0, 0, NULL, "out of memory for %zu parameters", t->model.n_params);
		rc = -ENOMEM;
		goto fail;
	}
	if (tr_model_init_params_cancellable(&t->model, host, t->opt.cancel) < 0 || setup_cancelled(t, err)) {
		tr_error_set(err, 0, 0, NULL, "cancelled");
		free(host);
		rc = -ECANCELED;
		goto fail;
	}
	if ((s->init_from && (rc = load_init(t, host, err)) < 0) || (rc = tr_trainer_procs_setup(t, host, err)) < 0) {
		free(host);
		goto fail;
	}
	if ((rc = check_device_memory(t, max_rows, err)) < 0 || (rc = tr_trainer_conv_routes(t, max_rows, err)) < 0 ||
	    (rc = tr_trainer_dense_routes(t, err)) < 0 || (rc = share_routes(t, err)) < 0) {
		free(host);
		goto fail;
	}
	tr_trainer_conv_chains(t, max_rows);
	for (int i = 0; i < t->ndev; i++) {
		struct rank_ctx *r = &t->ranks[i];
		r->t = t;
		r->rank = i;
		rc = tr_replica_init(&r->rep, &t->model, be, t->devs[i], max_rows, t->train->info.label_dim,
				     t->opt_buffers, err);
		/* Before the sync below: it also finishes the spare pair's zeroing,
		 * which the copy stream is not ordered with. */
		if (rc == 0 && t->upload_ahead)
			rc = alloc_spare(t, r, err);
		if (rc == 0)
			rc = alloc_stats(t, r, err);
		if (rc == 0)
			rc = be->i->to_device(be, t->devs[i], r->rep.params, host, t->model.n_params * sizeof(float));
		if (rc == 0)
			rc = be->i->sync(be, t->devs[i]);
		if (rc == 0 && setup_cancelled(t, err))
			rc = -ECANCELED;
		if (rc < 0) {
			free(host);
			goto fail;
		}
	}
	free(host);
	/* exact mode's sum is a collective of the backend's even on one
	 * device, where it has one (engine/exact.h) */
	if (t->comm_group) {
		if (!(t->comm = tr_comm_group_open(be, t->pcomm, t->ndev, t->devs, err))) {
			rc = -EIO;
			goto fail;
		}
	} else if (t->ndev > 1 || (s->exact_shards && be->i->exact_sum)) {
		t->comm = be->i->comm_create(be, t->ndev, t->devs);
		if (!t->comm) {
			tr_error_set(err, 0, 0, NULL, "cannot create a communicator over %d devices: %s", t->ndev,
				     be->i->last_error(be));
			rc = -EIO;
			goto fail;
		}
	}
	for (int i = 0; i < t->ndev; i++) {
		t->ranks[i].rep.comm = t->comm;
		t->ranks[i].rep.rank = i;
		t->ranks[i].rep.ndev = t->ndev;
		if ((rc = tr_trainer_exact_alloc(t, &t->ranks[i], err)) < 0)
			goto fail;
	}
	*out = t;
	return 0;
fail:
	tr_trainer_destroy(t);
	return rc;
}

void tr_trainer_stop_rank_threads(struct tr_trainer *t)
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
	tr_trainer_stop_rank_threads(t);
	tr_prefetch_destroy(t->prefetch);
	tr_trainer_unlend(t, false);
	for (int i = 0; i < t->ndev; i++) {
		free_spare(t, i);
		free_stats(t, i);
		tr_trainer_exact_free(t, &t->ranks[i]);
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
	tr_reader_destroy(t->test);
	json_decref(t->model_meta);
	pthread_cond_destroy(&t->go);
	pthread_cond_destroy(&t->done);
	pthread_mutex_destroy(&t->lock);
	free(t);
}
