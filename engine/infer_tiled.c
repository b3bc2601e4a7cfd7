/* Tiled inference of a fully convolutional model (infer_tiled.h).
 *
 * Along each axis the image of n pixels is cut into cores of
 * core = T - 2R pixels (T the tile side, R the radius), core k being
 * [k * core, min(n, (k + 1) * core)); its tile starts at
 * clamp(k * core - R, 0, n - T).  Then a core pixel is at least R from
 * its tile's edges, or the tile's edge is the image's: where the clamp
 * moved the tile, it moved it onto the image edge.  An image of at most T
 * pixels along an axis is one tile of the whole length.
 */
#include "engine/infer_tiled.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/infer.h"

struct axis {
	int n, t, core, count;
};

static void axis_init(struct axis *a, int n, int tile, int radius)
{
	a->n = n;
	a->t = n <= tile ? n : tile;
	a->core = n <= tile ? n : tile - 2 * radius;
	a->count = (n + a->core - 1) / a->core;
}

static int axis_start(const struct axis *a, int k, int radius)
{
	int s = k * a->core - radius;
	if (a->t == a->n || s < 0)
		return 0;
	return s > a->n - a->t ? a->n - a->t : s;
}

struct tile_reader {
	tr_reader_t base;
	const float *img;
	int c, radius;
	struct axis y, x;
};

static int tile_get(tr_reader_t *r, int64_t index, float *x, float *y, struct tr_error *err)
{
	(void)y;
	(void)err;
	const struct tile_reader *t = (const struct tile_reader *)r;
	int top = axis_start(&t->y, (int)(index / t->x.count), t->radius);
	int left = axis_start(&t->x, (int)(index % t->x.count), t->radius);
	for (int c = 0; c < t->c; c++)
		for (int yy = 0; yy < t->y.t; yy++)
			memcpy(x + ((size_t)c * t->y.t + yy) * t->x.t,
			       t->img + ((size_t)c * t->y.n + top + yy) * t->x.n + left,
			       (size_t)t->x.t * sizeof(float));
	return 0;
}

static void tile_destroy(tr_reader_t *r)
{
	(void)r; /* on the caller's stack */
}

static const struct tr_reader_i tile_i = {.get = tile_get, .destroy = tile_destroy};

struct stitch {
	const struct tile_reader *t;
	int k; /* output channels */
	float *out;
};

/* Each tile's core into the output. */
static int stitch_batch(void *ctx, int64_t first, int rows, const float *outputs, const float *labels, int label_dim)
{
	(void)labels;
	(void)label_dim;
	const struct stitch *s = ctx;
	const struct tile_reader *t = s->t;
	size_t per = (size_t)s->k * t->y.t * t->x.t;
	for (int r = 0; r < rows; r++) {
		int ky = (int)((first + r) / t->x.count), kx = (int)((first + r) % t->x.count);
		int top = axis_start(&t->y, ky, t->radius), left = axis_start(&t->x, kx, t->radius);
		int y0 = ky * t->y.core, y1 = y0 + t->y.core < t->y.n ? y0 + t->y.core : t->y.n;
		int x0 = kx * t->x.core, x1 = x0 + t->x.core < t->x.n ? x0 + t->x.core : t->x.n;
		const float *tile = outputs + (size_t)r * per;
		for (int c = 0; c < s->k; c++)
			for (int yy = y0; yy < y1; yy++)
				memcpy(s->out + ((size_t)c * t->y.n + yy) * t->x.n + x0,
				       tile + ((size_t)c * t->y.t + (yy - top)) * t->x.t + (x0 - left),
				       (size_t)(x1 - x0) * sizeof(float));
	}
	return 0;
}

int tr_infer_tiled_out_channels(const struct tr_model_desc *d)
{
	return d->model.n_layers > 0 ? d->model.layers[d->model.n_layers - 1].out_shape.d[0] : 0;
}

int tr_infer_tiled(const struct tr_tiled_options *o, const float *img, int h, int w, float *out, struct tr_error *err)
{
	const struct tr_model_desc *d = o->desc;
	int c = d->model.in_shape.d[0], radius = d->radius, field = 2 * d->radius + 1;
	if (!d->free_hw) {
		tr_error_set(err, 0, 0, NULL, "the model is not fully convolutional");
		return -EINVAL;
	}
	if (h < field || w < field) {
		tr_error_set(err, 0, 0, NULL, "%dx%d is smaller than the model's receptive field %dx%d", w, h, field,
			     field);
		return -EINVAL;
	}
	int tile = o->tile > 0 ? o->tile : TR_TILE_DEFAULT;
	if (tile < 2 * radius + 16)
		tile = 2 * radius + 16;
	struct tile_reader t = {.base.i = &tile_i, .img = img, .c = c, .radius = radius};
	snprintf(t.base.name, sizeof t.base.name, "image tiles");
	axis_init(&t.y, h, tile, radius);
	axis_init(&t.x, w, tile, radius);
	t.base.info.samples = (int64_t)t.y.count * t.x.count;
	t.base.info.features = c * t.y.t * t.x.t;
	t.base.info.shape[0] = c;
	t.base.info.shape[1] = t.y.t;
	t.base.info.shape[2] = t.x.t;

	/* The same layers on the tile's shape: the weights' layout does not
	 * depend on it (convolutions and per-channel layers only). */
	struct tr_spec shaped = d->spec; /* shallow: only read */
	shaped.input_ndim = 3;
	shaped.input_shape[0] = c;
	shaped.input_shape[1] = t.y.t;
	shaped.input_shape[2] = t.x.t;
	shaped.inputs = t.base.info.features;
	tr_model_t *m = malloc(sizeof *m);
	if (!m) {
		tr_error_set(err, 0, 0, NULL, "out of memory");
		return -ENOMEM;
	}
	int rc = tr_model_init(m, &shaped, shaped.inputs, err);
	if (rc == 0 && m->n_params != d->model.n_params) {
		tr_error_set(err, 0, 0, NULL, "the model on %dx%d tiles has %zu parameters, not %zu", t.x.t, t.y.t,
			     m->n_params, d->model.n_params);
		rc = -EINVAL;
	}
	struct stitch s = {.t = &t, .k = tr_infer_tiled_out_channels(d), .out = out};
	if (rc == 0) {
		struct tr_infer_options io = {
			.model = m,
			.params = d->params,
			.backend = o->backend,
			.count = o->count,
			.reader = &t.base,
			.transforms = d->transforms,
			.batch = o->batch > 0 ? o->batch : 8,
			.workers = o->workers,
			.on_batch = stitch_batch,
			.ctx = &s,
		};
		rc = tr_infer_run(&io, err);
	}
	free(m);
	return rc;
}
