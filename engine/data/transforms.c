/* Feature transforms applied by the loader threads after each read.
 *
 * The list runs in spec order.  standardize needs statistics, which are
 * computed once at create time over the whole training reader with the
 * transforms before it applied (noise left out: statistics of a random
 * draw would make them depend on the epoch), in double so a million
 * samples do not drift.  Gaussian noise is keyed by (seed, epoch, sample)
 * and counted by feature, so a sample gets the same noise whichever thread
 * loads it, and fresh noise each epoch.
 *
 * The image transforms need the reader's [C, H, W] shape: normalize
 * (per-channel mean and std, as torchvision's Normalize) and the training
 * augmentations random_crop (zero padding, then a crop back to H x W at a
 * random offset, as torchvision's RandomCrop(size, padding)), flip and
 * rot90.  Their draws are keyed like the noise (seed, epoch, sample), one
 * counter per transform, and they move an image-shaped label row (patches)
 * with the input so the pair stays aligned.  Evaluation applies none of
 * them.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "engine/data/reader_internal.h"
#include "engine/rng.h"

struct op {
	enum tr_transform_type type;
	float factor; /* scale */
	float std;    /* gaussian_noise */
	int noise_k;  /* which noise op this is, to keep their draws apart */
	float *mean;  /* standardize: [features] */
	float *sd;    /* standardize: [features], never 0 */
	float mean_c[TR_SPEC_MAX_CHANNELS], std_c[TR_SPEC_MAX_CHANNELS]; /* normalize */
	int padding;                                                     /* random_crop */
	bool vertical;                                                   /* flip */
};

struct tr_transforms {
	int n;
	int features; /* of the training reader, for standardize */
	int c, h, w;  /* its image shape (0 when flat) */
	struct op ops[TR_SPEC_MAX_TRANSFORMS];
};

/* Mirrors each channel plane of img left-right (or up-down). */
static void flip_planes(float *img, int c, int h, int w, int vertical)
{
	for (int ch = 0; ch < c; ch++) {
		float *p = img + (size_t)ch * h * w;

		if (vertical) {
			for (int y = 0; y < h / 2; y++)
				for (int x = 0; x < w; x++) {
					float t = p[(size_t)y * w + x];

					p[(size_t)y * w + x] = p[(size_t)(h - 1 - y) * w + x];
					p[(size_t)(h - 1 - y) * w + x] = t;
				}
		} else {
			for (int y = 0; y < h; y++)
				for (int x = 0; x < w / 2; x++) {
					float t = p[(size_t)y * w + x];

					p[(size_t)y * w + x] = p[(size_t)y * w + w - 1 - x];
					p[(size_t)y * w + w - 1 - x] = t;
				}
		}
	}
}

/* Rotates each square plane (n x n) by k quarter turns counterclockwise
 * (numpy's rot90), in place, one ring of four pixels at a time. */
static void rot90_planes(float *img, int c, int n, int k)
{
	for (; k > 0; k--)
		for (int ch = 0; ch < c; ch++) {
			float *p = img + (size_t)ch * n * n;

			for (int y = 0; y < n / 2; y++)
				for (int x = y; x < n - 1 - y; x++) {
					/* (y, x) <- (x, n-1-y) <- (n-1-y, n-1-x) <- (n-1-x, y) */
					float t = p[(size_t)y * n + x];

					p[(size_t)y * n + x] = p[(size_t)x * n + (n - 1 - y)];
					p[(size_t)x * n + (n - 1 - y)] = p[(size_t)(n - 1 - y) * n + (n - 1 - x)];
					p[(size_t)(n - 1 - y) * n + (n - 1 - x)] = p[(size_t)(n - 1 - x) * n + y];
					p[(size_t)(n - 1 - x) * n + y] = t;
				}
		}
}

/* Shifts each plane so that pixel (y, x) takes (y + dy, x + dx), zero
 * outside: the crop at offset (padding + dy, padding + dx) of the image
 * padded by `padding` zeros, without the padded copy.  Through `tmp`
 * (h * w floats). */
static void shift_planes(float *img, int c, int h, int w, int dy, int dx, float *tmp)
{
	for (int ch = 0; ch < c; ch++) {
		float *p = img + (size_t)ch * h * w;

		memcpy(tmp, p, (size_t)h * w * sizeof(float));
		for (int y = 0; y < h; y++)
			for (int x = 0; x < w; x++) {
				int sy = y + dy, sx = x + dx;

				p[(size_t)y * w + x] = sy >= 0 && sy < h && sx >= 0 && sx < w ? tmp[(size_t)sy * w + sx]
											      : 0.0f;
			}
	}
}

/* One spatial augmentation on x and, when given, the label image y. */
static void augment(const tr_transforms_t *t, const struct op *o, int k, float *x, float *y, uint64_t key)
{
	uint64_t ctr = (uint64_t)k << 8;

	switch (o->type) {
	case TR_TF_RANDOM_CROP: {
		uint64_t span = 2 * (uint64_t)o->padding + 1;
		int dy = (int)tr_rng_below(key, ctr, span) - o->padding;
		int dx = (int)tr_rng_below(key, ctr + 1, span) - o->padding;
		float *tmp;

		if (!dy && !dx)
			break;
		tmp = malloc((size_t)t->h * t->w * sizeof(float));
		if (!tmp)
			break; /* cannot happen in practice; an unaugmented sample is still a sample */
		shift_planes(x, t->c, t->h, t->w, dy, dx, tmp);
		if (y)
			shift_planes(y, t->c, t->h, t->w, dy, dx, tmp);
		free(tmp);
		break;
	}
	case TR_TF_FLIP:
		if (tr_rng_u64(key, ctr) & 1) {
			flip_planes(x, t->c, t->h, t->w, 0);
			if (y)
				flip_planes(y, t->c, t->h, t->w, 0);
		}
		if (o->vertical && (tr_rng_u64(key, ctr + 1) & 1)) {
			flip_planes(x, t->c, t->h, t->w, 1);
			if (y)
				flip_planes(y, t->c, t->h, t->w, 1);
		}
		break;
	case TR_TF_ROT90: {
		int q = (int)tr_rng_below(key, ctr, 4);

		rot90_planes(x, t->c, t->h, q);
		if (y)
			rot90_planes(y, t->c, t->h, q);
		break;
	}
	default:
		break;
	}
}

/* Runs ops [0, end) on x (and the spatial ones on y, may be NULL). */
static void apply_ops(const tr_transforms_t *t, int end, float *x, int features, float *y, uint64_t seed, int64_t epoch,
		      int64_t sample_index, int training)
{
	for (int k = 0; k < end; k++) {
		const struct op *o = &t->ops[k];

		switch (o->type) {
		case TR_TF_NORMALIZE: {
			size_t plane;

			/* Channel planes of features / C values each: the shape's
			 * H * W, or for recorded transforms (no reader) the same
			 * split of the model's input width. */
			if (t->c <= 0 || features % t->c != 0)
				break;
			plane = (size_t)(features / t->c);
			for (int ch = 0; ch < t->c; ch++) {
				float m = o->mean_c[ch], s = o->std_c[ch];

				for (size_t j = 0; j < plane; j++)
					x[ch * plane + j] = (x[ch * plane + j] - m) / s;
			}
			break;
		}
		case TR_TF_RANDOM_CROP:
		case TR_TF_FLIP:
		case TR_TF_ROT90:
			if (training && features == t->c * t->h * t->w)
				augment(t, o, k, x, y,
					tr_rng_key(seed, (uint64_t)epoch, (uint64_t)sample_index, TR_RNG_AUGMENT));
			break;
		case TR_TF_SCALE:
			for (int j = 0; j < features; j++)
				x[j] *= o->factor;
			break;
		case TR_TF_STANDARDIZE: {
			int n = features < t->features ? features : t->features;

			for (int j = 0; j < n; j++)
				x[j] = (x[j] - o->mean[j]) / o->sd[j];
			break;
		}
		case TR_TF_GAUSSIAN_NOISE: {
			uint64_t key;

			if (!training || o->std == 0.0f)
				break;
			key = tr_rng_key(seed, (uint64_t)epoch, (uint64_t)sample_index, TR_RNG_NOISE);
			for (int j = 0; j < features; j++)
				x[j] += o->std * tr_rng_normal(key, ((uint64_t)o->noise_k << 32) + (uint64_t)j);
			break;
		}
		}
	}
}

/* Fills ops[k].mean/sd from `train` as seen through ops [0, k). */
static int standardize_stats(tr_transforms_t *t, int k, tr_reader_t *train, const atomic_bool *cancel,
			     struct tr_error *err)
{
	struct op *o = &t->ops[k];
	int nf = train->info.features;
	int64_t n = train->info.samples;
	float *x = NULL, *y = NULL;
	double *shift = NULL, *s1 = NULL, *s2 = NULL;
	int ret = 0;

	if (n <= 0 || nf <= 0) {
		tr_error_set(err, 0, 0, NULL, "standardize: %s has no samples", train->name);
		return -EINVAL;
	}
	o->mean = malloc((size_t)nf * sizeof(float));
	o->sd = malloc((size_t)nf * sizeof(float));
	x = malloc((size_t)nf * sizeof(float));
	y = malloc((size_t)(train->info.label_dim > 0 ? train->info.label_dim : 1) * sizeof(float));
	shift = malloc((size_t)nf * sizeof(double));
	s1 = calloc((size_t)nf, sizeof(double));
	s2 = calloc((size_t)nf, sizeof(double));
	if (!o->mean || !o->sd || !x || !y || !shift || !s1 || !s2) {
		tr_error_set(err, 0, 0, NULL, "standardize: out of memory");
		ret = -ENOMEM;
		goto out;
	}
	/* Sums of (x - first sample) instead of x: the textbook
	 * sum-of-squares formula cancels badly when |mean| >> std. */
	for (int64_t i = 0; i < n; i++) {
		/* A look every 4096 samples: a few ms of reading at most. */
		if ((i & 4095) == 0 && cancel && atomic_load_explicit(cancel, memory_order_relaxed)) {
			tr_error_set(err, 0, 0, NULL, "cancelled");
			ret = -ECANCELED;
			goto out;
		}
		ret = tr_reader_get(train, i, x, y, err);
		if (ret)
			goto out;
		apply_ops(t, k, x, nf, NULL, 0, 0, i, 0);
		for (int j = 0; j < nf; j++) {
			double d;

			if (i == 0)
				shift[j] = x[j];
			d = (double)x[j] - shift[j];
			s1[j] += d;
			s2[j] += d * d;
		}
	}
	for (int j = 0; j < nf; j++) {
		double m = s1[j] / (double)n;
		double var = s2[j] / (double)n - m * m;
		double sd = var > 0.0 ? sqrt(var) : 0.0;

		o->mean[j] = (float)(shift[j] + m);
		o->sd[j] = sd > 0.0 && (float)sd > 0.0f ? (float)sd : 1.0f;
	}
out:
	free(x);
	free(y);
	free(shift);
	free(s1);
	free(s2);
	return ret;
}

static const char *const tf_names[] = {
	[TR_TF_NORMALIZE] = "normalize",
	[TR_TF_RANDOM_CROP] = "random_crop",
	[TR_TF_FLIP] = "flip",
	[TR_TF_ROT90] = "rot90",
};

/* Sets up an image transform, which needs the data's [C, H, W]. */
static int image_op(const tr_transforms_t *t, const struct tr_transform_spec *ts, struct op *o, int k,
		    struct tr_error *err)
{
	if (!t->c) {
		tr_error_set(err, 0, 0, NULL,
			     "/data/transforms/%d: %s needs image data (idx, images or patches), "
			     "the training data is flat",
			     k, tf_names[ts->type]);
		return -EINVAL;
	}
	switch (ts->type) {
	case TR_TF_NORMALIZE:
		if (ts->n_channels != t->c) {
			tr_error_set(err, 0, 0, NULL,
				     "/data/transforms/%d: normalize gives %d mean/std value%s, the images have %d "
				     "channel%s",
				     k, ts->n_channels, ts->n_channels == 1 ? "" : "s", t->c, t->c == 1 ? "" : "s");
			return -EINVAL;
		}
		for (int c = 0; c < t->c; c++) {
			if (!(ts->std_c[c] > 0.0f)) {
				tr_error_set(err, 0, 0, NULL, "/data/transforms/%d/std/%d: must be > 0", k, c);
				return -EINVAL;
			}
			o->mean_c[c] = ts->mean_c[c];
			o->std_c[c] = ts->std_c[c];
		}
		break;
	case TR_TF_RANDOM_CROP:
		o->padding = ts->padding;
		break;
	case TR_TF_FLIP:
		o->vertical = ts->vertical;
		break;
	case TR_TF_ROT90:
		if (t->h != t->w) {
			tr_error_set(err, 0, 0, NULL, "/data/transforms/%d: rot90 needs square images, these are %dx%d",
				     k, t->w, t->h);
			return -EINVAL;
		}
		break;
	default:
		break;
	}
	return 0;
}

int tr_transforms_create(const struct tr_spec *spec, tr_reader_t *train, tr_transforms_t **out, struct tr_error *err)
{
	return tr_transforms_create_cancellable(spec, train, NULL, out, err);
}

int tr_transforms_create_cancellable(const struct tr_spec *spec, tr_reader_t *train, const atomic_bool *cancel,
				     tr_transforms_t **out, struct tr_error *err)
{
	tr_transforms_t *t;
	int noise_k = 0, ret;

	*out = NULL;
	if (spec->n_transforms < 0 || spec->n_transforms > TR_SPEC_MAX_TRANSFORMS) {
		tr_error_set(err, 0, 0, NULL, "too many transforms (%d)", spec->n_transforms);
		return -EINVAL;
	}
	t = calloc(1, sizeof(*t));
	if (!t) {
		tr_error_set(err, 0, 0, NULL, "out of memory");
		return -ENOMEM;
	}
	t->features = train ? train->info.features : 0;
	if (train) {
		t->c = train->info.shape[0];
		t->h = train->info.shape[1];
		t->w = train->info.shape[2];
	}
	for (int k = 0; k < spec->n_transforms; k++) {
		const struct tr_transform_spec *ts = &spec->transforms[k];
		struct op *o = &t->ops[k];

		o->type = ts->type;
		o->factor = ts->factor;
		o->std = ts->std;
		switch (ts->type) {
		case TR_TF_SCALE:
			break;
		case TR_TF_GAUSSIAN_NOISE:
			o->noise_k = noise_k++;
			break;
		case TR_TF_NORMALIZE:
		case TR_TF_RANDOM_CROP:
		case TR_TF_FLIP:
		case TR_TF_ROT90:
			ret = image_op(t, ts, o, k, err);
			if (ret)
				goto fail;
			break;
		case TR_TF_STANDARDIZE:
			if (!train) {
				tr_error_set(err, 0, 0, NULL, "/data/transforms/%d: standardize needs training data",
					     k);
				ret = -EINVAL;
				goto fail;
			}
			ret = standardize_stats(t, k, train, cancel, err);
			if (ret)
				goto fail;
			break;
		default:
			tr_error_set(err, 0, 0, NULL, "/data/transforms/%d: unknown transform type %d", k,
				     (int)ts->type);
			ret = -EINVAL;
			goto fail;
		}
		t->n = k + 1;
	}
	*out = t;
	return 0;
fail:
	tr_transforms_destroy(t);
	return ret;
}

void tr_transforms_apply(const tr_transforms_t *t, float *x, int features, uint64_t seed, int64_t epoch,
			 int64_t sample_index, int training)
{
	if (t)
		apply_ops(t, t->n, x, features, NULL, seed, epoch, sample_index, training);
}

void tr_transforms_apply_pair(const tr_transforms_t *t, float *x, int features, float *y, uint64_t seed, int64_t epoch,
			      int64_t sample_index, int training)
{
	if (t)
		apply_ops(t, t->n, x, features, y, seed, epoch, sample_index, training);
}

void tr_transforms_destroy(tr_transforms_t *t)
{
	if (!t)
		return;
	/* All slots, not just t->n: a failed create leaves arrays past it. */
	for (int k = 0; k < TR_SPEC_MAX_TRANSFORMS; k++) {
		free(t->ops[k].mean);
		free(t->ops[k].sd);
	}
	free(t);
}

/* ---- recorded values (docs/model-format.md) -------------------------------- */

/* Floats as JSON numbers that read back to the same float: a double holds
 * every float exactly, and jansson prints doubles to round trip. */
static json_t *float_array(const float *v, int n)
{
	json_t *a = json_array();

	for (int j = 0; a && j < n; j++) {
		if (json_array_append_new(a, json_real((double)v[j])) < 0) {
			json_decref(a);
			return NULL;
		}
	}
	return a;
}

json_t *tr_transforms_fitted(const tr_transforms_t *t, int k)
{
	if (!t || k < 0 || k >= t->n)
		return NULL;
	const struct op *o = &t->ops[k];
	if (o->type != TR_TF_STANDARDIZE)
		return NULL;
	json_t *mean = float_array(o->mean, t->features), *sd = float_array(o->sd, t->features);
	if (!mean || !sd) {
		json_decref(mean);
		json_decref(sd);
		return NULL;
	}
	return json_pack("{s:o, s:o}", "mean", mean, "std", sd);
}

bool tr_transforms_train_only(enum tr_transform_type type)
{
	return type == TR_TF_GAUSSIAN_NOISE || type == TR_TF_RANDOM_CROP || type == TR_TF_FLIP || type == TR_TF_ROT90;
}

/* Reads n floats from the recorded array `key` of `fitted`; positive
 * (std) when `positive`. */
static int recorded_floats(const json_t *fitted, const char *key, int k, int n, bool positive, float **out,
			   struct tr_error *err)
{
	const json_t *a = json_object_get(fitted, key);

	if (!json_is_array(a) || json_array_size(a) != (size_t)n) {
		tr_error_set(err, 0, 0, NULL, "transforms/%d: standardize needs \"fitted\": {\"%s\": [%d numbers]}", k,
			     key, n);
		return -EINVAL;
	}
	float *v = malloc((size_t)n * sizeof(float));
	if (!v) {
		tr_error_set(err, 0, 0, NULL, "out of memory");
		return -ENOMEM;
	}
	for (int j = 0; j < n; j++) {
		const json_t *e = json_array_get(a, (size_t)j);
		double d = json_number_value(e);

		if (!json_is_number(e) || !isfinite(d) || (positive && !((float)d > 0.0f))) {
			tr_error_set(err, 0, 0, NULL, "transforms/%d/fitted/%s/%d: must be a finite number%s", k, key,
				     j, positive ? " > 0" : "");
			free(v);
			return -EINVAL;
		}
		v[j] = (float)d;
	}
	*out = v;
	return 0;
}

int tr_transforms_create_recorded(const struct tr_spec *spec, const json_t *const *fitted, int features,
				  tr_transforms_t **out, struct tr_error *err)
{
	tr_transforms_t *t;
	int noise_k = 0, ret;

	*out = NULL;
	if (spec->n_transforms < 0 || spec->n_transforms > TR_SPEC_MAX_TRANSFORMS || features <= 0) {
		tr_error_set(err, 0, 0, NULL, "bad transform list (%d transforms, %d features)", spec->n_transforms,
			     features);
		return -EINVAL;
	}
	t = calloc(1, sizeof(*t));
	if (!t) {
		tr_error_set(err, 0, 0, NULL, "out of memory");
		return -ENOMEM;
	}
	t->features = features;
	for (int k = 0; k < spec->n_transforms; k++) {
		const struct tr_transform_spec *ts = &spec->transforms[k];
		struct op *o = &t->ops[k];

		o->type = ts->type;
		o->factor = ts->factor;
		o->std = ts->std;
		if (ts->type == TR_TF_GAUSSIAN_NOISE)
			o->noise_k = noise_k++;
		if (ts->type == TR_TF_NORMALIZE) {
			/* The spec holds the values; the channel count splits the
			 * input width into planes. */
			if (ts->n_channels < 1 || ts->n_channels > TR_SPEC_MAX_CHANNELS || features % ts->n_channels) {
				tr_error_set(err, 0, 0, NULL,
					     "transforms/%d: normalize has %d channels, which do not divide "
					     "the %d inputs",
					     k, ts->n_channels, features);
				ret = -EINVAL;
				goto fail;
			}
			t->c = ts->n_channels;
			for (int c = 0; c < t->c; c++) {
				o->mean_c[c] = ts->mean_c[c];
				o->std_c[c] = ts->std_c[c] > 0.0f ? ts->std_c[c] : 1.0f;
			}
		}
		if (ts->type == TR_TF_STANDARDIZE) {
			const json_t *f = fitted ? fitted[k] : NULL;

			if ((ret = recorded_floats(f, "mean", k, features, false, &o->mean, err)) < 0 ||
			    (ret = recorded_floats(f, "std", k, features, true, &o->sd, err)) < 0)
				goto fail;
		}
		t->n = k + 1;
	}
	*out = t;
	return 0;
fail:
	tr_transforms_destroy(t);
	return ret;
}
