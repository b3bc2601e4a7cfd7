/* Sequential model: layout, initialisation, forward and backward (model.h).
 *
 * Every operation goes through the backend table, so the same code drives
 * CPU threads and GPUs.  A replica keeps one output buffer per layer because
 * the backward pass needs each layer's input (and activations their output).
 */
#include "engine/model/model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine/rng.h"

int tr_model_init(tr_model_t *m, const struct tr_spec *spec, int inputs, char *err, size_t errlen)
{
	memset(m, 0, sizeof *m);
	/* The spec bounds widths it knows; a data file's width is known only
	 * now and gets the same bound (engine/spec.h). */
	if (inputs < 1 || inputs > TR_SPEC_MAX_WIDTH) {
		snprintf(err, errlen, "/model/inputs: the data has %d features; the engine takes 1 to %d", inputs,
			 TR_SPEC_MAX_WIDTH);
		return -EINVAL;
	}
	m->inputs = inputs;
	m->loss = spec->loss;
	m->seed = spec->seed;
	int width = inputs;
	int max_width = inputs;
	size_t off = 0;
	for (int i = 0; i < spec->n_layers; i++) {
		const struct tr_layer_spec *ls = &spec->layers[i];
		struct tr_layer *l = &m->layers[i];
		l->type = ls->type;
		l->in = width;
		l->out = width;
		switch (ls->type) {
		case TR_LAYER_DENSE:
			l->out = ls->units;
			l->w_off = off;
			l->w_len = (size_t)ls->units * width;
			off += l->w_len;
			if (ls->bias) {
				l->b_off = off;
				l->b_len = (size_t)ls->units;
				off += l->b_len;
			}
			break;
		case TR_LAYER_LAYERNORM:
			l->eps = ls->eps;
			l->w_off = off;
			l->w_len = (size_t)width;
			off += l->w_len;
			l->b_off = off;
			l->b_len = (size_t)width;
			off += l->b_len;
			break;
		case TR_LAYER_RELU:
			l->act = TR_ACT_RELU;
			break;
		case TR_LAYER_GELU:
			l->act = ls->gelu_tanh ? TR_ACT_GELU_TANH : TR_ACT_GELU;
			break;
		case TR_LAYER_TANH:
			l->act = TR_ACT_TANH;
			break;
		case TR_LAYER_SIGMOID:
			l->act = TR_ACT_SIGMOID;
			break;
		case TR_LAYER_DROPOUT:
			l->rate = ls->rate;
			break;
		}
		width = l->out;
		if (width > max_width)
			max_width = width;
	}
	m->n_layers = spec->n_layers;
	m->outputs = width;
	m->max_width = max_width;
	m->n_params = off;
	if (off > (size_t)TR_SPEC_MAX_PARAMS) {
		snprintf(err, errlen, "/model/layers: the model has %zu parameters, more than the %lld the engine takes",
			 off, (long long)TR_SPEC_MAX_PARAMS);
		return -EINVAL;
	}
	if (off == 0) {
		snprintf(err, errlen, "/model/layers: the model has no parameters");
		return -EINVAL;
	}
	return 0;
}

/* Elements filled between two looks at the cancel flag (a few ms). */
#define INIT_CHUNK ((size_t)1 << 20)

static bool cancelled(const atomic_bool *cancel)
{
	return cancel && atomic_load_explicit(cancel, memory_order_relaxed);
}

int tr_model_init_params_cancellable(const tr_model_t *m, float *p, const atomic_bool *cancel)
{
	for (int i = 0; i < m->n_layers; i++) {
		const struct tr_layer *l = &m->layers[i];
		if (l->type == TR_LAYER_DENSE) {
			float bound = 1.0f / sqrtf((float)l->in);
			uint64_t kw = tr_rng_key(m->seed, (uint64_t)i, 0, TR_RNG_INIT);
			uint64_t kb = tr_rng_key(m->seed, (uint64_t)i, 1, TR_RNG_INIT);
			for (size_t j = 0; j < l->w_len; j++) {
				if (j % INIT_CHUNK == 0 && cancelled(cancel))
					return -ECANCELED;
				p[l->w_off + j] = (2.0f * tr_rng_uniform(kw, j) - 1.0f) * bound;
			}
			for (size_t j = 0; j < l->b_len; j++)
				p[l->b_off + j] = (2.0f * tr_rng_uniform(kb, j) - 1.0f) * bound;
		} else if (l->type == TR_LAYER_LAYERNORM) {
			for (size_t j = 0; j < l->w_len; j++)
				p[l->w_off + j] = 1.0f;
			for (size_t j = 0; j < l->b_len; j++)
				p[l->b_off + j] = 0.0f;
		}
	}
	return cancelled(cancel) ? -ECANCELED : 0;
}

void tr_model_init_params(const tr_model_t *m, float *p)
{
	tr_model_init_params_cancellable(m, p, NULL);
}

int tr_model_param_count(const tr_model_t *m)
{
	int n = 0;
	for (int i = 0; i < m->n_layers; i++)
		n += (m->layers[i].w_len > 0) + (m->layers[i].b_len > 0);
	return n;
}

void tr_model_param_view(const tr_model_t *m, int idx, struct tr_param_view *v)
{
	memset(v, 0, sizeof *v);
	for (int i = 0; i < m->n_layers; i++) {
		const struct tr_layer *l = &m->layers[i];
		for (int which = 0; which < 2; which++) {
			size_t len = which ? l->b_len : l->w_len;
			if (len == 0)
				continue;
			if (idx-- > 0)
				continue;
			snprintf(v->name, sizeof v->name, "%d.%s", i, which ? "bias" : "weight");
			v->offset = which ? l->b_off : l->w_off;
			v->len = len;
			if (l->type == TR_LAYER_DENSE && !which) {
				v->ndim = 2;
				v->shape[0] = l->out;
				v->shape[1] = l->in;
			} else {
				v->ndim = 1;
				v->shape[0] = (int64_t)len;
			}
			return;
		}
	}
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
		    int opt_state_buffers, char *err, size_t errlen)
{
	memset(r, 0, sizeof *r);
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
	for (int i = 0; i < m->n_layers; i++) {
		const struct tr_layer *l = &m->layers[i];
		r->acts[i + 1] = dev_alloc(r, rows * l->out, &failed);
		if (l->type == TR_LAYER_DROPOUT)
			r->aux[i] = dev_alloc(r, rows * l->out, &failed);
		if (l->type == TR_LAYER_LAYERNORM) {
			r->aux[i] = dev_alloc(r, rows, &failed);
			r->aux2[i] = dev_alloc(r, rows, &failed);
		}
	}
	r->dbuf[0] = dev_alloc(r, rows * m->max_width, &failed);
	r->dbuf[1] = dev_alloc(r, rows * m->max_width, &failed);
	if (failed) {
		snprintf(err, errlen, "device %d: out of memory for a replica of %zu parameters and %d rows", dev,
			 m->n_params, r->max_rows);
		tr_replica_finish(r);
		return -ENOMEM;
	}
	return 0;
}

void tr_replica_finish(tr_replica_t *r)
{
	if (!r->be)
		return;
	float **bufs[] = {&r->params, &r->grads, &r->state1, &r->state2, &r->labels, &r->input,
			  &r->dbuf[0], &r->dbuf[1]};
	for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
		if (*bufs[i])
			r->be->i->free(r->be, r->dev, *bufs[i]);
		*bufs[i] = NULL;
	}
	for (int i = 0; i < TR_SPEC_MAX_LAYERS; i++) {
		if (r->acts[i + 1])
			r->be->i->free(r->be, r->dev, r->acts[i + 1]);
		if (r->aux[i])
			r->be->i->free(r->be, r->dev, r->aux[i]);
		if (r->aux2[i])
			r->be->i->free(r->be, r->dev, r->aux2[i]);
		r->acts[i + 1] = r->aux[i] = r->aux2[i] = NULL;
	}
	r->acts[0] = NULL;
	r->be = NULL;
}

#define TRY(expr)                      \
	do {                           \
		int rc_ = (expr);      \
		if (rc_ < 0)           \
			return rc_;    \
	} while (0)

int tr_replica_forward(tr_replica_t *r, int rows, int64_t row0, int64_t step, int training)
{
	const tr_model_t *m = r->model;
	tr_backend_t *be = r->be;
	const tr_backend_i *bi = be->i;
	for (int i = 0; i < m->n_layers; i++) {
		const struct tr_layer *l = &m->layers[i];
		const float *x = r->acts[i];
		float *y = r->acts[i + 1];
		size_t n = (size_t)rows * l->out;
		switch (l->type) {
		case TR_LAYER_DENSE:
			TRY(bi->gemm(be, r->dev, false, true, rows, l->out, l->in, 1.0f, x, r->params + l->w_off,
				     0.0f, y));
			if (l->b_len)
				TRY(bi->add_bias(be, r->dev, rows, l->out, y, r->params + l->b_off));
			break;
		case TR_LAYER_RELU:
		case TR_LAYER_GELU:
		case TR_LAYER_TANH:
		case TR_LAYER_SIGMOID:
			TRY(bi->act_forward(be, r->dev, l->act, n, x, y));
			break;
		case TR_LAYER_DROPOUT:
			if (training && l->rate > 0.0f) {
				uint64_t key = tr_rng_key(m->seed, (uint64_t)step, (uint64_t)i, TR_RNG_DROPOUT);
				TRY(bi->dropout_forward(be, r->dev, rows, l->out, l->rate, key, row0, x, y, r->aux[i]));
			} else {
				TRY(bi->copy(be, r->dev, y, x, n * sizeof(float)));
			}
			break;
		case TR_LAYER_LAYERNORM:
			TRY(bi->layernorm_forward(be, r->dev, rows, l->out, l->eps, x, r->params + l->w_off,
						  r->params + l->b_off, y, r->aux[i], r->aux2[i]));
			break;
		}
	}
	return 0;
}

int tr_replica_loss(tr_replica_t *r, int rows, float scale, double *out)
{
	const tr_model_t *m = r->model;
	const float *pred = r->acts[m->n_layers];
	if (m->loss == TR_LOSS_SOFTMAX_CE)
		return r->be->i->softmax_ce(r->be, r->dev, rows, m->outputs, pred, r->labels, scale, r->dbuf[0], out);
	return r->be->i->mse(r->be, r->dev, rows, m->outputs, pred, r->labels, scale, r->dbuf[0], out);
}

int tr_replica_backward(tr_replica_t *r, int rows)
{
	const tr_model_t *m = r->model;
	tr_backend_t *be = r->be;
	const tr_backend_i *bi = be->i;
	int cur = 0; /* dbuf[cur] holds dL/d(output of layer i) */
	for (int i = m->n_layers - 1; i >= 0; i--) {
		const struct tr_layer *l = &m->layers[i];
		const float *x = r->acts[i];
		const float *dy = r->dbuf[cur];
		float *dx = r->dbuf[cur ^ 1];
		size_t n = (size_t)rows * l->out;
		bool need_dx = i > 0;
		switch (l->type) {
		case TR_LAYER_DENSE:
			/* dW[out,in] = dy^T x ; db = sum over rows of dy ; dx = dy W */
			TRY(bi->gemm(be, r->dev, true, false, l->out, l->in, rows, 1.0f, dy, x, 0.0f,
				     r->grads + l->w_off));
			if (l->b_len)
				TRY(bi->col_sum(be, r->dev, rows, l->out, dy, r->grads + l->b_off));
			if (need_dx)
				TRY(bi->gemm(be, r->dev, false, false, rows, l->in, l->out, 1.0f, dy,
					     r->params + l->w_off, 0.0f, dx));
			break;
		case TR_LAYER_RELU:
		case TR_LAYER_GELU:
		case TR_LAYER_TANH:
		case TR_LAYER_SIGMOID:
			if (need_dx)
				TRY(bi->act_backward(be, r->dev, l->act, n, x, r->acts[i + 1], dy, dx));
			break;
		case TR_LAYER_DROPOUT:
			/* The forward mask is only valid if the forward used it; eval
			 * passes never reach backward. */
			if (need_dx) {
				if (l->rate > 0.0f)
					TRY(bi->mul(be, r->dev, n, dy, r->aux[i], dx));
				else
					TRY(bi->copy(be, r->dev, dx, dy, n * sizeof(float)));
			}
			break;
		case TR_LAYER_LAYERNORM:
			/* the kernel adds into dgamma/dbeta (adjacent, see tr_model_init) */
			TRY(bi->memset0(be, r->dev, r->grads + l->w_off, 2 * (size_t)l->out * sizeof(float)));
			TRY(bi->layernorm_backward(be, r->dev, rows, l->out, x, r->params + l->w_off, r->aux[i],
						   r->aux2[i], dy, dx, r->grads + l->w_off, r->grads + l->b_off));
			break;
		}
		if (need_dx)
			cur ^= 1;
	}
	return 0;
}
