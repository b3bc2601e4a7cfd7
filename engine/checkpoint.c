/* Checkpoint layout and parsing (see checkpoint.h). */
#include "engine/checkpoint.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/optim/optimizer.h"
#include "engine/rng.h"
#include "engine/safetensors.h"

/* One snapshot's worth of spare buffers, all of `n` floats.  A fresh
 * malloc of tens of MB is a fresh mmap, whose every page faults in (and is
 * zeroed) while the training thread copies the model into it: about half
 * of the time a snapshot took.  Periodic checkpoints of a job are all the
 * same size, so the buffers of the last one written are kept for the next;
 * a snapshot of another size replaces them.  Process-wide (several jobs
 * share it; a mismatch just falls back to malloc), locked, never more than
 * SPARE_MAX buffers. */
#define SPARE_MAX 3
static struct {
	pthread_mutex_t lock;
	size_t n;
	int count;
	float *buf[SPARE_MAX];
} spare = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Aligned like the CPU backend's device memory: a spare may become a
 * replica's buffer (zero-copy snapshots) and go back to it. */
#define SPARE_ALIGN 64

static float *spare_take(size_t n)
{
	float *p = NULL;
	pthread_mutex_lock(&spare.lock);
	if (spare.n == n && spare.count > 0)
		p = spare.buf[--spare.count];
	pthread_mutex_unlock(&spare.lock);
	if (p)
		return p;
	if (n > (SIZE_MAX - SPARE_ALIGN) / sizeof(float))
		return NULL;
	size_t bytes = (n * sizeof(float) + SPARE_ALIGN - 1) / SPARE_ALIGN * SPARE_ALIGN;
	return aligned_alloc(SPARE_ALIGN, bytes ? bytes : SPARE_ALIGN);
}

static void spare_put(float *p, size_t n)
{
	if (!p)
		return;
	float *drop[SPARE_MAX + 1];
	int ndrop = 0;
	pthread_mutex_lock(&spare.lock);
	if (spare.n != n) {
		while (spare.count > 0)
			drop[ndrop++] = spare.buf[--spare.count];
		spare.n = n;
	}
	if (spare.count < SPARE_MAX)
		spare.buf[spare.count++] = p;
	else
		drop[ndrop++] = p;
	pthread_mutex_unlock(&spare.lock);
	while (ndrop > 0)
		free(drop[--ndrop]); /* outside the lock: munmap takes a while */
}

struct tr_snapshot *tr_snapshot_alloc(size_t n_params, int n_state)
{
	struct tr_snapshot *s = calloc(1, sizeof *s);
	if (!s)
		return NULL;
	s->n_params = n_params;
	s->n_state = n_state;
	s->params = spare_take(n_params);
	for (int k = 0; k < n_state; k++)
		s->state[k] = spare_take(n_params);
	if (!s->params || (n_state > 0 && !s->state[0]) || (n_state > 1 && !s->state[1])) {
		tr_snapshot_free(s);
		return NULL;
	}
	return s;
}

void tr_snapshot_prepare(size_t n_params, int n_state)
{
	struct tr_snapshot *s = tr_snapshot_alloc(n_params, n_state);
	if (!s)
		return; /* the snapshot itself will report it */
	/* Writing a float per page faults every page in (malloc'd memory is
	 * not backed until first written). */
	long page = sysconf(_SC_PAGESIZE);
	size_t stride = page > 0 ? (size_t)page / sizeof(float) : 1024;
	float *bufs[3] = {s->params, s->state[0], s->state[1]};
	for (int k = 0; k < 3 && n_params > 0; k++) {
		for (size_t i = 0; bufs[k] && i < n_params; i += stride)
			bufs[k][i] = 0.0f;
		if (bufs[k])
			bufs[k][n_params - 1] = 0.0f; /* the last page, when the buffer is not page-aligned */
	}
	tr_snapshot_free(s);
}

float *tr_snapshot_buffer_take(size_t n)
{
	return spare_take(n);
}

void tr_snapshot_buffer_put(float *p, size_t n)
{
	spare_put(p, n);
}

struct tr_snapshot_lease {
	atomic_int refs;
	size_t n;
	int nbuf;
	float *buf[3];
};

struct tr_snapshot_lease *tr_snapshot_lease_new(size_t n, int nbuf, float *const *bufs)
{
	if (nbuf < 1 || nbuf > 3)
		return NULL;
	struct tr_snapshot_lease *l = calloc(1, sizeof *l);
	if (!l)
		return NULL;
	atomic_init(&l->refs, 1);
	l->n = n;
	l->nbuf = nbuf;
	for (int k = 0; k < nbuf; k++)
		l->buf[k] = bufs[k];
	return l;
}

struct tr_snapshot *tr_snapshot_borrow(struct tr_snapshot_lease *l, int n_state)
{
	if (n_state < 0 || 1 + n_state > l->nbuf)
		return NULL;
	struct tr_snapshot *s = calloc(1, sizeof *s);
	if (!s)
		return NULL;
	atomic_fetch_add_explicit(&l->refs, 1, memory_order_relaxed);
	s->lease = l;
	s->n_params = l->n;
	s->n_state = n_state;
	s->params = l->buf[0];
	for (int k = 0; k < n_state; k++)
		s->state[k] = l->buf[1 + k];
	return s;
}

void tr_snapshot_lease_drop(struct tr_snapshot_lease *l)
{
	/* acq_rel: every read of the buffers by either holder happens before
	 * the last holder hands them on. */
	if (!l || atomic_fetch_sub_explicit(&l->refs, 1, memory_order_acq_rel) != 1)
		return;
	for (int k = 0; k < l->nbuf; k++)
		spare_put(l->buf[k], l->n);
	free(l);
}

void tr_snapshot_free(struct tr_snapshot *s)
{
	if (!s)
		return;
	if (s->lease) {
		tr_snapshot_lease_drop(s->lease); /* the buffers are the lease's */
	} else {
		spare_put(s->params, s->n_params);
		spare_put(s->state[0], s->n_params);
		spare_put(s->state[1], s->n_params);
	}
	json_decref(s->meta);
	free(s);
}

void tr_snapshot_trim(void)
{
	float *drop[SPARE_MAX];
	pthread_mutex_lock(&spare.lock);
	int n = spare.count;
	memcpy(drop, spare.buf, sizeof drop);
	spare.count = 0;
	pthread_mutex_unlock(&spare.lock);
	while (n > 0)
		free(drop[--n]);
}

static const char *state_name(enum tr_optim_type opt, int k)
{
	if (opt == TR_OPT_SGD)
		return "momentum_buffer";
	return k == 0 ? "exp_avg" : "exp_avg_sq";
}

/* Builds the tensor list: params (and optionally the state) in the
 * model's tensor order, each with the byte offset its data has in the
 * file's data region (offs[]), which is the buffers verbatim: the
 * parameter buffer, then each state buffer.  That order is not the
 * tensors' when the model has buffers (batchnorm2d's running statistics
 * lie after every parameter), so the offsets come from the layout, never
 * from adding up the sizes in list order.  Names live in names[]
 * (caller-sized). */
static int tensor_list(const tr_model_t *m, enum tr_optim_type opt, const struct tr_snapshot *s, int with_state,
		       struct tr_st_tensor *ts, size_t *offs, char (*names)[96])
{
	int np = tr_model_param_count(m), n = 0;
	int passes = with_state ? 1 + s->n_state : 1;
	for (int pass = 0; pass < passes; pass++) {
		const float *base = pass == 0 ? s->params : s->state[pass - 1];
		for (int i = 0; i < np; i++) {
			struct tr_param_view v;
			tr_model_param_view(m, i, &v);
			if (pass == 0)
				snprintf(names[n], 96, "%s", v.name);
			else
				snprintf(names[n], 96, "optimizer.%s.%s", state_name(opt, pass - 1), v.name);
			ts[n] = (struct tr_st_tensor){.name = names[n], .ndim = v.ndim, .data = base + v.offset};
			offs[n] = ((size_t)pass * s->n_params + v.offset) * sizeof(float);
			for (int d = 0; d < v.ndim; d++)
				ts[n].shape[d] = v.shape[d];
			n++;
		}
	}
	return n;
}

/* Serialises just the header of a tensor list (the data is written from
 * the snapshot's buffers directly). */
static int header_of(struct tr_st_tensor *ts, const size_t *offs, int n, const json_t *meta, uint8_t **out, size_t *len,
		     struct tr_error *err)
{
	/* Only the header: the data is written later straight from the
	 * snapshot's buffers, without a second copy of the model. */
	json_t *h = json_object();
	if (meta)
		json_object_set(h, "__metadata__", (json_t *)meta);
	for (int i = 0; i < n; i++) {
		json_t *shape = json_array();
		size_t elems = 1;
		for (int d = 0; d < ts[i].ndim; d++) {
			json_array_append_new(shape, json_integer(ts[i].shape[d]));
			elems *= (size_t)ts[i].shape[d];
		}
		size_t bytes = elems * sizeof(float);
		json_object_set_new(h, ts[i].name,
				    json_pack("{s:s, s:o, s:[I, I]}", "dtype", "F32", "shape", shape, "data_offsets",
					      (json_int_t)offs[i], (json_int_t)(offs[i] + bytes)));
	}
	char *text = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
	json_decref(h);
	if (!text) {
		tr_error_set(err, 0, 0, NULL, "checkpoint: cannot build the header");
		return -ENOMEM;
	}
	size_t tl = strlen(text), padded = (tl + 7) & ~(size_t)7;
	uint8_t *buf = malloc(8 + padded);
	if (!buf) {
		free(text);
		tr_error_set(err, 0, 0, NULL, "checkpoint: out of memory");
		return -ENOMEM;
	}
	for (int i = 0; i < 8; i++)
		buf[i] = (uint8_t)((uint64_t)padded >> (8 * i));
	memcpy(buf + 8, text, tl);
	memset(buf + 8 + tl, ' ', padded - tl);
	free(text);
	*out = buf;
	*len = 8 + padded;
	return 0;
}

int tr_checkpoint_layout(const tr_model_t *m, enum tr_optim_type opt, const struct tr_snapshot *s,
			 struct tr_checkpoint_layout *out, struct tr_error *err)
{
	memset(out, 0, sizeof *out);
	int np = tr_model_param_count(m);
	int cap = np * 3;
	struct tr_st_tensor *ts = calloc((size_t)cap, sizeof *ts);
	char(*names)[96] = calloc((size_t)cap, sizeof *names);
	size_t *offs = calloc((size_t)cap, sizeof *offs);
	int rc = -ENOMEM;
	if (!ts || !names || !offs) {
		tr_error_set(err, 0, 0, NULL, "checkpoint: out of memory");
		goto out;
	}
	int n_all = tensor_list(m, opt, s, 1, ts, offs, names);
	if ((rc = header_of(ts, offs, n_all, s->meta, &out->header, &out->header_len, err)) < 0)
		goto out;
	json_t *model_meta = json_deep_copy(s->meta);
	if (model_meta)
		json_object_set_new(model_meta, "kind", json_string("model"));
	rc = header_of(ts, offs, np, model_meta, &out->model_header, &out->model_header_len, err);
	json_decref(model_meta);
	if (rc < 0)
		goto out;
	out->params_bytes = s->n_params * sizeof(float);
	out->seg[0] = s->params;
	out->seg_len[0] = out->params_bytes;
	out->nseg = 1;
	for (int k = 0; k < s->n_state; k++) {
		out->seg[out->nseg] = s->state[k];
		out->seg_len[out->nseg++] = out->params_bytes;
	}
	out->total_bytes = out->header_len;
	for (int k = 0; k < out->nseg; k++)
		out->total_bytes += out->seg_len[k];
out:
	free(ts);
	free(names);
	free(offs);
	if (rc < 0)
		tr_checkpoint_layout_finish(out);
	return rc;
}

void tr_checkpoint_layout_finish(struct tr_checkpoint_layout *l)
{
	free(l->header);
	free(l->model_header);
	memset(l, 0, sizeof *l);
}

int tr_checkpoint_parse(const void *data, size_t len, const tr_model_t *m, enum tr_optim_type opt, bool weights_only,
			struct tr_snapshot **out, struct tr_error *err)
{
	tr_st_file_t *f;
	int rc = tr_st_open_mem(data, len, "checkpoint", &f, err);
	if (rc < 0)
		return rc;
	/* How many optimizer buffers the file has is known only below: the
	 * snapshot starts with none. */
	struct tr_snapshot *s = tr_snapshot_alloc(m->n_params, 0);
	if (!s) {
		tr_st_close(f);
		return -ENOMEM;
	}
	const json_t *meta = tr_st_metadata(f);
	s->meta = meta ? json_deep_copy(meta) : json_object();
	const char *step = json_string_value(json_object_get(meta, "step"));
	const char *epoch = json_string_value(json_object_get(meta, "epoch"));
	if (!step || !epoch) {
		tr_error_set(err, 0, 0, NULL, "checkpoint: metadata has no step/epoch");
		rc = -EINVAL;
		goto fail;
	}
	s->step = strtoll(step, NULL, 10);
	s->epoch = strtoll(epoch, NULL, 10);
	/* SGD keeps a momentum buffer only when it uses momentum; the file
	 * says which. */
	int want_state = 2;
	if (weights_only) {
		want_state = 0;
	} else if (opt == TR_OPT_SGD) {
		struct tr_param_view v;
		tr_model_param_view(m, 0, &v);
		char probe[96];
		snprintf(probe, sizeof probe, "optimizer.momentum_buffer.%s", v.name);
		want_state = tr_st_has(f, probe) ? 1 : 0;
	}
	s->n_state = want_state;
	for (int k = 0; k < s->n_state; k++)
		s->state[k] = spare_take(s->n_params);
	if ((s->n_state > 0 && !s->state[0]) || (s->n_state > 1 && !s->state[1])) {
		tr_error_set(err, 0, 0, NULL, "checkpoint: out of memory");
		rc = -ENOMEM;
		goto fail;
	}
	int np = tr_model_param_count(m);
	for (int pass = 0; pass < 1 + s->n_state && rc == 0; pass++) {
		float *base = pass == 0 ? s->params : s->state[pass - 1];
		for (int i = 0; i < np && rc == 0; i++) {
			struct tr_param_view v;
			tr_model_param_view(m, i, &v);
			char name[96];
			if (pass == 0)
				snprintf(name, sizeof name, "%s", v.name);
			else
				snprintf(name, sizeof name, "optimizer.%s.%s", state_name(opt, pass - 1), v.name);
			rc = tr_st_read_f32(f, name, v.ndim, v.shape, base + v.offset, err);
		}
	}
	if (rc < 0)
		goto fail;
	tr_st_close(f);
	*out = s;
	return 0;
fail:
	tr_st_close(f);
	tr_snapshot_free(s);
	return rc;
}

void tr_spec_hash(const struct tr_spec *spec, char out[17])
{
	/* The hash names the computation, not where it ran: the daemon fills
	 * in the ids of the pool devices a job was given, which differ from
	 * run to run (and between a job and its resumption); only their
	 * count affects the result. */
	struct tr_spec c = *spec;
	if (c.n_device_ids > 0) {
		c.device_count = c.n_device_ids;
		c.n_device_ids = 0;
	}
	json_t *j = tr_spec_to_json(&c);
	char *text = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
	json_decref(j);
	uint64_t h = 0x6a09e667f3bcc908ULL;
	for (const char *p = text ? text : ""; *p; p++)
		h = tr_mix64(h ^ (uint8_t)*p);
	free(text);
	snprintf(out, 17, "%016llx", (unsigned long long)h);
}
