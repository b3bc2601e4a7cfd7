/* Sequential model: layout, initialisation, forward and backward (model.h).
 *
 * The model knows no layer type: it walks the spec's layers, asks each
 * one's registry entry (engine/model/layer.h) for its output shape, its
 * parameter tensors and its buffers, lays the parameters out in one
 * buffer in order, and runs the entries' forward and backward.  Every
 * operation goes through the backend table, so the same code drives CPU
 * threads and GPUs.  A replica keeps one output buffer per node because
 * the backward pass needs each layer's input (and activations their
 * output).
 */
#include "engine/model/model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine/rng.h"

void tr_shape_format(struct tr_shape s, char *buf, size_t len)
{
	if (s.ndim == 3)
		snprintf(buf, len, "[%d, %d, %d]", s.d[0], s.d[1], s.d[2]);
	else
		snprintf(buf, len, "[%d]", s.d[0]);
}

int tr_layer_want_flat(const struct tr_layer *l, const char *what, struct tr_error *err)
{
	char got[48];

	if (l->in_shape.ndim == 1)
		return 0;
	tr_shape_format(l->in_shape, got, sizeof got);
	tr_error_set(err, 0, 0, NULL, "%s takes a flat input, not %s; put {\"type\": \"flatten\"} before it", what,
		     got);
	return -EINVAL;
}

int tr_layer_image_input(const struct tr_layer *l, const char *what, struct tr_error *err)
{
	char got[48];

	if (l->in_shape.ndim == 3)
		return 0;
	tr_shape_format(l->in_shape, got, sizeof got);
	tr_error_set(err, 0, 0, NULL,
		     "%s takes an image [C, H, W], not the flat input %s; give model.inputs as [C, H, W]", what, got);
	return -EINVAL;
}

int tr_layer_act_forward(const struct tr_pass *p, const struct tr_layer *l, const float *x, float *y)
{
	tr_replica_t *r = p->r;
	return r->be->i->act_forward(r->be, r->dev, l->act, (size_t)p->rows * l->out, x, y);
}

int tr_layer_act_backward(const struct tr_pass *p, const struct tr_layer *l, const float *x, const float *y,
			  const float *dy, float *dx)
{
	tr_replica_t *r = p->r;
	if (!dx)
		return 0;
	return r->be->i->act_backward(r->be, r->dev, l->act, (size_t)p->rows * l->out, x, y, dy, dx);
}

void tr_layer_param(struct tr_layer *l, const char *name, enum tr_init init, size_t fan_in, int ndim,
		    const int64_t *shape)
{
	struct tr_param_slot *t = &l->tensors[l->n_tensors];

	memset(t, 0, sizeof *t);
	t->name = name;
	t->init = init;
	t->fan_in = fan_in;
	t->rng_sub = (uint64_t)l->n_tensors;
	t->ndim = ndim;
	t->len = 1;
	for (int d = 0; d < ndim; d++) {
		t->shape[d] = shape[d];
		t->len *= (size_t)shape[d];
	}
	l->n_tensors++;
}

/* Building state: the pointer of the layer being built, for errors. */
struct build {
	tr_model_t *m;
	size_t off;
	char *ptr, *msg;
	size_t ptrlen, msglen;
};

static int fail(struct build *b, const char *ptr, const char *fmt, const char *text)
{
	snprintf(b->ptr, b->ptrlen, "%s", ptr);
	snprintf(b->msg, b->msglen, fmt, text);
	return -EINVAL;
}

static void widen(tr_model_t *m, int w)
{
	if (w > m->max_width)
		m->max_width = w;
}

/* Sets up nodes first .. first+n-1 from specs[0..n) (their slots already
 * reserved) on input `shape`; *shape becomes the sequence's output. */
static int build_seq(struct build *b, const struct tr_layer_spec *specs, int n, int first, const char *ptr,
		     const char *path, struct tr_shape *shape, int depth)
{
	tr_model_t *m = b->m;
	for (int k = 0; k < n; k++) {
		const struct tr_layer_spec *ls = &specs[k];
		struct tr_layer *l = &m->layers[first + k];
		char lptr[256];
		struct tr_error err;
		if (snprintf(lptr, sizeof lptr, "%s/%d", ptr, k) >= (int)sizeof lptr)
			lptr[sizeof lptr - 1] = '\0';
		memset(l, 0, sizeof *l);
		l->ops = tr_layer_ops_for(ls->type);
		if (!l->ops)
			return fail(b, lptr, "%s", "unknown layer type");
		l->type = ls->type;
		l->index = first + k;
		if ((*path ? snprintf(l->path, sizeof l->path, "%s.%d", path, k)
			   : snprintf(l->path, sizeof l->path, "%d", k)) >= (int)sizeof l->path)
			return fail(b, lptr, "%s", "residual blocks nest too deep");
		l->in_shape = *shape;
		l->in = (int)tr_shape_numel(*shape);
		err.message[0] = '\0';
		if (l->ops->holds_layers) {
			/* inner layers take consecutive nodes, reserved before
			 * any of them reserves its own */
			if (depth >= TR_SPEC_MAX_DEPTH)
				return fail(b, lptr, "%s", "residual blocks nest too deep");
			if (ls->n_inner < 1)
				return fail(b, lptr, "%s", "a residual block needs at least one layer");
			if (m->n_nodes + ls->n_inner > TR_MODEL_MAX_NODES) {
				snprintf(b->ptr, b->ptrlen, "%s", lptr);
				snprintf(b->msg, b->msglen,
					 "the model has more than %d layers in all, blocks' layers included",
					 TR_MODEL_MAX_NODES);
				return -EINVAL;
			}
			l->first = m->n_nodes;
			l->count = ls->n_inner;
			m->n_nodes += ls->n_inner;
			size_t w0 = b->off;
			struct tr_shape inner = *shape;
			char iptr[256];
			if (snprintf(iptr, sizeof iptr, "%s/layers", lptr) >= (int)sizeof iptr)
				iptr[sizeof iptr - 1] = '\0';
			int rc = build_seq(b, ls->inner, ls->n_inner, l->first, iptr, l->path, &inner, depth + 1);
			if (rc < 0)
				return rc;
			l->w_off = w0;
			l->w_len = b->off - w0;
			l->inner_shape = inner;
		}
		int rc = l->ops->setup(l, ls, &err);
		if (rc < 0)
			return fail(b, lptr, "%s", err.message);
		l->collective = l->ops->collective;
		for (int k = 0; l->ops->holds_layers && k < l->count; k++)
			l->collective |= m->layers[l->first + k].collective;
		/* buffers get their offsets after every parameter
		 * (tr_model_build), so that the optimizer's range is one
		 * prefix; weight and bias stay adjacent */
		for (int t = 0; t < l->n_tensors; t++) {
			if (l->tensors[t].buffer)
				continue;
			l->tensors[t].off = b->off;
			b->off += l->tensors[t].len;
		}
		if (l->ops->collective)
			m->collective = true;
		if (l->n_tensors > 0) {
			l->w_off = l->tensors[0].off;
			l->w_len = l->tensors[0].len;
		}
		if (l->n_tensors > 1) {
			l->b_off = l->tensors[1].off;
			l->b_len = 0;
			for (int t = 1; t < l->n_tensors; t++)
				if (!l->tensors[t].buffer)
					l->b_len += l->tensors[t].len;
		}
		size_t out = tr_shape_numel(l->out_shape);
		if (out > TR_SPEC_MAX_WIDTH || out < 1) {
			char sh[48];
			tr_shape_format(l->out_shape, sh, sizeof sh);
			return fail(b, lptr, "the output %s is too large for the engine", sh);
		}
		l->out = (int)out;
		widen(m, l->in);
		widen(m, l->out);
		if (b->off > (size_t)TR_SPEC_MAX_PARAMS) {
			snprintf(b->ptr, b->ptrlen, "%s", lptr);
			snprintf(b->msg, b->msglen,
				 "the model reaches %zu parameters here, more than the %lld the engine takes", b->off,
				 (long long)TR_SPEC_MAX_PARAMS);
			return -EINVAL;
		}
		*shape = l->out_shape;
	}
	return 0;
}

static int build_model(tr_model_t *m, const struct tr_spec *spec, int inputs, const int data_shape[3], char *ptr,
		       size_t ptrlen, char *msg, size_t msglen)
{
	struct build b = {.m = m, .ptr = ptr, .ptrlen = ptrlen, .msg = msg, .msglen = msglen};

	memset(m, 0, sizeof *m);
	/* The spec bounds widths it knows; a data file's width is known only
	 * now and gets the same bound (engine/spec.h). */
	if (inputs < 1 || inputs > TR_SPEC_MAX_WIDTH) {
		snprintf(ptr, ptrlen, "/model/inputs");
		snprintf(msg, msglen, "the data has %d features; the engine takes 1 to %d", inputs, TR_SPEC_MAX_WIDTH);
		return -EINVAL;
	}
	struct tr_shape shape = {.ndim = 1, .d = {inputs}};
	/* The spec's [C, H, W]; without one, a synthetic source's shape or
	 * the data's (unless inputs was given as a plain width). */
	const int *chw = NULL;
	if (spec->input_ndim == 3)
		chw = spec->input_shape;
	else if (!spec->inputs && spec->train.format == TR_DATA_SYNTHETIC && spec->train.shape_ndim == 3)
		chw = spec->train.shape;
	else if (!spec->inputs && data_shape && data_shape[0] > 0)
		chw = data_shape;
	if (chw) {
		shape = (struct tr_shape){.ndim = 3, .d = {chw[0], chw[1], chw[2]}};
		if (tr_shape_numel(shape) != (size_t)inputs) {
			char sh[48];
			tr_shape_format(shape, sh, sizeof sh);
			snprintf(ptr, ptrlen, "/model/inputs");
			snprintf(msg, msglen, "%s is %zu values per sample but the data has %d", sh,
				 tr_shape_numel(shape), inputs);
			return -EINVAL;
		}
	}
	m->inputs = inputs;
	m->in_shape = shape;
	m->loss = spec->loss;
	m->seed = spec->seed;
	m->max_width = inputs;
	if (spec->n_layers > TR_MODEL_MAX_NODES) {
		snprintf(ptr, ptrlen, "/model/layers");
		snprintf(msg, msglen, "too many layers");
		return -EINVAL;
	}
	m->n_layers = spec->n_layers;
	m->n_nodes = spec->n_layers;
	int rc = build_seq(&b, spec->layers, spec->n_layers, 0, "/model/layers", "", &shape, 0);
	if (rc < 0)
		return rc;
	m->outputs = m->n_layers ? m->layers[m->n_layers - 1].out : inputs;
	m->n_trainable = b.off;
	for (int i = 0; i < m->n_nodes; i++) {
		struct tr_layer *l = &m->layers[i];
		for (int t = 0; t < l->n_tensors; t++) {
			if (!l->tensors[t].buffer)
				continue;
			l->tensors[t].off = b.off;
			b.off += l->tensors[t].len;
		}
	}
	m->n_params = b.off;
	if (b.off > (size_t)TR_SPEC_MAX_PARAMS) {
		snprintf(ptr, ptrlen, "/model/layers");
		snprintf(msg, msglen, "the model has %zu parameters and buffers, more than the %lld the engine takes",
			 b.off, (long long)TR_SPEC_MAX_PARAMS);
		return -EINVAL;
	}
	if (b.off == 0) {
		snprintf(ptr, ptrlen, "/model/layers");
		snprintf(msg, msglen, "the model has no parameters");
		return -EINVAL;
	}
	return 0;
}

int tr_model_build(tr_model_t *m, const struct tr_spec *spec, int inputs, char *ptr, size_t ptrlen, char *msg,
		   size_t msglen)
{
	return build_model(m, spec, inputs, NULL, ptr, ptrlen, msg, msglen);
}

int tr_model_init_shaped(tr_model_t *m, const struct tr_spec *spec, int inputs, const int data_shape[3],
			 struct tr_error *err)
{
	char ptr[256], msg[512], ptr2[8], msg2[8];
	int rc = build_model(m, spec, inputs, data_shape, ptr, sizeof ptr, msg, sizeof msg);
	/* A model of flat layers (a dense first layer) on image data reads
	 * the images flat, as before the data had a shape; the error of the
	 * shaped layout is the one reported when neither fits. */
	if (rc < 0 && data_shape && data_shape[0] > 0 && !spec->inputs &&
	    build_model(m, spec, inputs, NULL, ptr2, sizeof ptr2, msg2, sizeof msg2) == 0)
		return 0;
	if (rc < 0)
		tr_error_set(err, 0, 0, ptr, "%s: %s", ptr, msg);
	return rc;
}

int tr_model_init(tr_model_t *m, const struct tr_spec *spec, int inputs, struct tr_error *err)
{
	return tr_model_init_shaped(m, spec, inputs, NULL, err);
}

/* Elements filled between two looks at the cancel flag (a few ms). */
#define INIT_CHUNK ((size_t)1 << 20)

static bool cancelled(const atomic_bool *cancel)
{
	return cancel && atomic_load_explicit(cancel, memory_order_relaxed);
}

int tr_model_init_params_cancellable(const tr_model_t *m, float *p, const atomic_bool *cancel)
{
	for (int i = 0; i < m->n_nodes; i++) {
		const struct tr_layer *l = &m->layers[i];
		for (int t = 0; t < l->n_tensors; t++) {
			const struct tr_param_slot *s = &l->tensors[t];
			float *dst = p + s->off;
			if (s->init == TR_INIT_UNIFORM_FAN_IN) {
				float bound = 1.0f / sqrtf((float)s->fan_in);
				uint64_t key = tr_rng_key(m->seed, (uint64_t)i, s->rng_sub, TR_RNG_INIT);
				for (size_t j = 0; j < s->len; j++) {
					if (j % INIT_CHUNK == 0 && cancelled(cancel))
						return -ECANCELED;
					dst[j] = (2.0f * tr_rng_uniform(key, j) - 1.0f) * bound;
				}
			} else {
				float v = s->init == TR_INIT_ONES ? 1.0f : 0.0f;
				for (size_t j = 0; j < s->len; j++)
					dst[j] = v;
			}
		}
	}
	return cancelled(cancel) ? -ECANCELED : 0;
}

void tr_model_init_params(const tr_model_t *m, float *p)
{
	tr_model_init_params_cancellable(m, p, NULL);
}

/* Tensors in parameter-buffer order: nodes are laid out depth first (a
 * block's inner layers before the block's own tensors), which is not node
 * order, so walk as build_seq did. */
static int walk_tensors(const tr_model_t *m, int first, int count, int *idx, struct tr_param_view *v)
{
	for (int i = first; i < first + count; i++) {
		const struct tr_layer *l = &m->layers[i];
		int n = 0;
		if (l->count > 0) {
			n = walk_tensors(m, l->first, l->count, idx, v);
			if (n < 0)
				return n;
		}
		for (int t = 0; t < l->n_tensors; t++) {
			if ((*idx)-- > 0)
				continue;
			const struct tr_param_slot *s = &l->tensors[t];
			snprintf(v->name, sizeof v->name, "%s.%s", l->path, s->name);
			v->offset = s->off;
			v->len = s->len;
			v->ndim = s->ndim;
			for (int d = 0; d < s->ndim; d++)
				v->shape[d] = s->shape[d];
			return -1; /* found */
		}
	}
	return 0;
}

int tr_model_param_count(const tr_model_t *m)
{
	int n = 0;
	for (int i = 0; i < m->n_nodes; i++)
		n += m->layers[i].n_tensors;
	return n;
}

void tr_model_param_view(const tr_model_t *m, int idx, struct tr_param_view *v)
{
	memset(v, 0, sizeof *v);
	walk_tensors(m, 0, m->n_layers, &idx, v);
}

/* ---- replicas ---- */

/* Every allocation of a replica, in order; `take` sees each size (floats,
 * before the at-least-one rule).  tr_replica_init and the memory estimate
 * both come through here, so they cannot drift apart. */
struct buf_visit {
	size_t *sizes;
	int n, cap;
};

static void visit(struct buf_visit *v, size_t floats)
{
	if (v->n < v->cap)
		v->sizes[v->n] = floats;
	v->n++;
}

static size_t workspace_floats(const tr_model_t *m, int rows)
{
	size_t w = 0;
	for (int i = 0; i < m->n_nodes; i++) {
		const struct tr_layer *l = &m->layers[i];
		if (l->ops->workspace) {
			size_t k = l->ops->workspace(l, rows);
			if (k > w)
				w = k;
		}
	}
	return w;
}

int tr_replica_buffer_sizes(const tr_model_t *m, int max_rows, int label_dim, int opt_state_buffers, size_t *floats,
			    int cap)
{
	struct buf_visit v = {.sizes = floats, .cap = cap};
	size_t rows = (size_t)(max_rows < 1 ? 1 : max_rows);
	visit(&v, m->n_params); /* params */
	visit(&v, m->n_params); /* grads */
	if (opt_state_buffers >= 1)
		visit(&v, m->n_params);
	if (opt_state_buffers >= 2)
		visit(&v, m->n_params);
	visit(&v, rows * label_dim);
	visit(&v, rows * m->inputs);
	for (int i = 0; i < m->n_nodes; i++) {
		const struct tr_layer *l = &m->layers[i];
		visit(&v, rows * l->out);
		for (int k = 0; k < 2; k++)
			if (l->saved[k])
				visit(&v, rows * l->saved[k]);
		if (l->kept)
			visit(&v, l->kept);
	}
	visit(&v, rows * m->max_width); /* dbuf[0] */
	visit(&v, rows * m->max_width); /* dbuf[1] */
	size_t w = workspace_floats(m, (int)rows);
	if (w)
		visit(&v, w);
	return v.n;
}

static void *dev_alloc(tr_replica_t *r, size_t floats, int *failed)
{
	if (floats == 0)
		floats = 1;
	void *p = r->be->i->alloc(r->be, r->dev, floats * sizeof(float));
	if (!p)
		*failed = 1;
	return p;
}

int tr_replica_init(tr_replica_t *r, const tr_model_t *m, tr_backend_t *be, int dev, int max_rows, int label_dim,
		    int opt_state_buffers, struct tr_error *err)
{
	memset(r, 0, sizeof *r);
	for (int i = 0; i < m->n_nodes; i++) {
		const struct tr_layer *l = &m->layers[i];
		if (l->ops->supported && !l->ops->supported(be->i)) {
			tr_error_set(err, 0, 0, NULL, "the %s backend has no kernels for %s layers (%s)", be->i->name,
				     l->ops->name, l->path);
			return -ENOTSUP;
		}
	}
	r->model = m;
	r->be = be;
	r->dev = dev;
	r->max_rows = max_rows < 1 ? 1 : max_rows;
	r->label_dim = label_dim;
	int failed = 0;
	size_t rows = (size_t)r->max_rows;
	r->params = dev_alloc(r, m->n_params, &failed);
	r->grads = dev_alloc(r, m->n_params, &failed);
	if (opt_state_buffers >= 1)
		r->state1 = dev_alloc(r, m->n_params, &failed);
	if (opt_state_buffers >= 2)
		r->state2 = dev_alloc(r, m->n_params, &failed);
	r->labels = dev_alloc(r, rows * label_dim, &failed);
	r->input = dev_alloc(r, rows * m->inputs, &failed);
	r->acts[0] = r->input;
	for (int i = 0; i < m->n_nodes; i++) {
		const struct tr_layer *l = &m->layers[i];
		r->acts[i + 1] = dev_alloc(r, rows * l->out, &failed);
		if (l->saved[0])
			r->aux[i] = dev_alloc(r, rows * l->saved[0], &failed);
		if (l->saved[1])
			r->aux2[i] = dev_alloc(r, rows * l->saved[1], &failed);
		if (l->kept)
			r->kept[i] = dev_alloc(r, l->kept, &failed);
	}
	r->ndev = 1;
	r->dbuf[0] = dev_alloc(r, rows * m->max_width, &failed);
	r->dbuf[1] = dev_alloc(r, rows * m->max_width, &failed);
	size_t w = workspace_floats(m, r->max_rows);
	if (w)
		r->work = dev_alloc(r, w, &failed);
	if (failed) {
		tr_error_set(err, 0, 0, NULL, "device %d: out of memory for a replica of %zu parameters and %d rows",
			     dev, m->n_params, r->max_rows);
		tr_replica_finish(r);
		return -ENOMEM;
	}
	return 0;
}

void tr_replica_finish(tr_replica_t *r)
{
	if (!r->be)
		return;
	float **bufs[] = {&r->params, &r->grads,   &r->state1,  &r->state2, &r->labels,
			  &r->input,  &r->dbuf[0], &r->dbuf[1], &r->work};
	for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
		if (*bufs[i])
			r->be->i->free(r->be, r->dev, *bufs[i]);
		*bufs[i] = NULL;
	}
	for (int i = 0; i < TR_MODEL_MAX_NODES; i++) {
		if (r->acts[i + 1])
			r->be->i->free(r->be, r->dev, r->acts[i + 1]);
		if (r->aux[i])
			r->be->i->free(r->be, r->dev, r->aux[i]);
		if (r->aux2[i])
			r->be->i->free(r->be, r->dev, r->aux2[i]);
		if (r->kept[i])
			r->be->i->free(r->be, r->dev, r->kept[i]);
		r->acts[i + 1] = r->aux[i] = r->aux2[i] = r->kept[i] = NULL;
	}
	r->acts[0] = NULL;
	r->be = NULL;
}

/* ---- passes ---- */

/* The pass of shard k of a collective node's pass p (exact mode). */
static struct tr_pass shard_pass(const struct tr_pass *p, int k)
{
	const struct tr_shard_set *sh = p->r->shards;
	return (struct tr_pass){.r = &sh->views[k],
				.rows = sh->len[k],
				.row0 = p->row0 + sh->off[k],
				.step = p->step,
				.training = p->training};
}

int tr_model_seq_forward(const struct tr_pass *p, int first, int count, const float *x)
{
	tr_replica_t *r = p->r;
	const tr_model_t *m = r->model;
	const struct tr_shard_set *sh = r->shards;
	for (int i = first; i < first + count; i++) {
		const struct tr_layer *l = &m->layers[i];
		int rc = 0;
		if (!sh || l->collective) {
			rc = l->ops->forward(p, l, x, r->acts[i + 1]);
		} else {
			for (int k = 0; k < sh->count && rc == 0; k++) {
				struct tr_pass sp = shard_pass(p, k);
				rc = l->ops->forward(&sp, l, x + (size_t)sh->off[k] * l->in, sp.r->acts[i + 1]);
			}
		}
		if (rc < 0)
			return rc;
		x = r->acts[i + 1];
	}
	return 0;
}

/* Node l's backward over shard k of a collective pass (exact mode): dy
 * and dx are the replica's, whose rows the shard's start at its offset.
 * A node holding layers runs its own on the view's gradient buffers
 * (scratch of one shard), so its dy travels there and its dx back. */
static int shard_backward(const struct tr_pass *p, const struct tr_layer *l, int k, const float *x, const float *dy,
			  float *dx)
{
	struct tr_pass sp = shard_pass(p, k);
	tr_replica_t *v = sp.r;
	tr_backend_t *be = v->be;
	size_t off = (size_t)p->r->shards->off[k], rows = (size_t)sp.rows;
	const float *xk = x + off * l->in;
	if (!l->ops->holds_layers)
		return l->ops->backward(&sp, l, xk, v->acts[l->index + 1], dy + off * l->out,
					dx ? dx + off * l->in : NULL);
	int rc = be->i->copy(be, v->dev, v->dbuf[0], dy + off * l->out, rows * l->out * sizeof(float));
	if (rc == 0)
		rc = l->ops->backward(&sp, l, xk, v->acts[l->index + 1], v->dbuf[0], dx ? v->dbuf[1] : NULL);
	if (rc == 0 && dx)
		rc = be->i->copy(be, v->dev, dx + off * l->in, v->dbuf[1], rows * l->in * sizeof(float));
	return rc;
}

int tr_model_seq_backward(const struct tr_pass *p, int first, int count, const float *x, int *cur, bool need_dx)
{
	tr_replica_t *r = p->r;
	const tr_model_t *m = r->model;
	const struct tr_shard_set *sh = r->shards;
	for (int i = first + count - 1; i >= first; i--) {
		const struct tr_layer *l = &m->layers[i];
		const float *xi = i == first ? x : r->acts[i];
		bool want = i > first || need_dx;
		float *dy = r->dbuf[*cur], *dx = want ? r->dbuf[*cur ^ 1] : NULL;
		int rc = 0;
		if (!sh || l->collective) {
			rc = l->ops->backward(p, l, xi, r->acts[i + 1], dy, dx);
		} else {
			for (int k = 0; k < sh->count && rc == 0; k++)
				rc = shard_backward(p, l, k, xi, dy, dx);
		}
		/* the top level's layers only (inner nodes come after them) */
		if (rc == 0 && first == 0 && r->layer_done)
			rc = r->layer_done(r->layer_done_ctx, i);
		if (rc < 0)
			return rc;
		if (want)
			*cur ^= 1;
	}
	return 0;
}

size_t tr_model_partial_floats(const tr_model_t *m)
{
	size_t most = 0;
	for (int i = 0; i < m->n_nodes; i++)
		if (m->layers[i].ops->collective && m->layers[i].kept > most)
			most = m->layers[i].kept;
	return most;
}

void tr_shard_views(tr_replica_t *r, struct tr_shard_set *set, float *const *grads, float *const *scratch)
{
	const tr_model_t *m = r->model;
	for (int k = 0; k < set->count; k++) {
		tr_replica_t *v = &set->views[k];
		size_t off = (size_t)set->off[k];
		*v = *r;
		v->shards = NULL;
		v->grads = grads[k];
		v->dbuf[0] = scratch[0];
		v->dbuf[1] = scratch[1];
		v->input = v->acts[0] = r->input + off * m->inputs;
		v->labels = r->labels + off * r->label_dim;
		for (int i = 0; i < m->n_nodes; i++) {
			const struct tr_layer *l = &m->layers[i];
			v->acts[i + 1] = r->acts[i + 1] + off * l->out;
			if (r->aux[i])
				v->aux[i] = r->aux[i] + off * l->saved[0];
			if (r->aux2[i])
				v->aux2[i] = r->aux2[i] + off * l->saved[1];
		}
	}
}

int tr_replica_forward(tr_replica_t *r, int rows, int64_t row0, int64_t step, int training)
{
	struct tr_pass p = {.r = r, .rows = rows, .row0 = row0, .step = step, .training = training};
	return tr_model_seq_forward(&p, 0, r->model->n_layers, r->acts[0]);
}

static int loss_rows(tr_replica_t *r, int rows, const float *pred, const float *labels, float scale, float *dpred,
		     double *out)
{
	const tr_model_t *m = r->model;
	if (m->loss == TR_LOSS_SOFTMAX_CE)
		return r->be->i->softmax_ce(r->be, r->dev, rows, m->outputs, pred, labels, scale, dpred, out);
	return r->be->i->mse(r->be, r->dev, rows, m->outputs, pred, labels, scale, dpred, out);
}

int tr_replica_loss(tr_replica_t *r, int rows, float scale, double *out)
{
	return loss_rows(r, rows, r->acts[r->model->n_layers], r->labels, scale, r->dbuf[0], out);
}

int tr_replica_shard_loss(tr_replica_t *r, int k, float scale, double *out)
{
	const tr_model_t *m = r->model;
	const struct tr_shard_set *sh = r->shards;
	size_t off = (size_t)sh->off[k];
	return loss_rows(r, sh->len[k], r->acts[m->n_layers] + off * m->outputs, r->labels + off * r->label_dim, scale,
			 r->dbuf[0] + off * m->outputs, out);
}

int tr_replica_backward(tr_replica_t *r, int rows)
{
	struct tr_pass p = {.r = r, .rows = rows};
	int cur = 0; /* dbuf[cur] holds dL/d(output of the layer at hand) */
	return tr_model_seq_backward(&p, 0, r->model->n_layers, r->acts[0], &cur, false);
}
