/* Feature transforms applied by the loader threads after each read.
 *
 * The list runs in spec order.  standardize needs statistics, which are
 * computed once at create time over the whole training reader with the
 * transforms before it applied (noise left out: statistics of a random
 * draw would make them depend on the epoch), in double so a million
 * samples do not drift.  Gaussian noise is keyed by (seed, epoch, sample)
 * and counted by feature, so a sample gets the same noise whichever thread
 * loads it, and fresh noise each epoch.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

#include "engine/data/reader_internal.h"
#include "engine/rng.h"

struct op {
	enum tr_transform_type type;
	float factor;  /* scale */
	float std;     /* gaussian_noise */
	int noise_k;   /* which noise op this is, to keep their draws apart */
	float *mean;   /* standardize: [features] */
	float *sd;     /* standardize: [features], never 0 */
};

struct tr_transforms {
	int n;
	int features; /* of the training reader, for standardize */
	struct op ops[TR_SPEC_MAX_TRANSFORMS];
};

/* Runs ops [0, end) on x. */
static void apply_ops(const tr_transforms_t *t, int end, float *x, int features, uint64_t seed, int64_t epoch,
		      int64_t sample_index, int training)
{
	for (int k = 0; k < end; k++) {
		const struct op *o = &t->ops[k];

		switch (o->type) {
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
static int standardize_stats(tr_transforms_t *t, int k, tr_reader_t *train, const atomic_bool *cancel, char *err,
			     size_t errlen)
{
	struct op *o = &t->ops[k];
	int nf = train->info.features;
	int64_t n = train->info.samples;
	float *x = NULL, *y = NULL;
	double *shift = NULL, *s1 = NULL, *s2 = NULL;
	int ret = 0;

	if (n <= 0 || nf <= 0) {
		tr_data_errorf(err, errlen, "standardize: %s has no samples", train->name);
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
		tr_data_errorf(err, errlen, "standardize: out of memory");
		ret = -ENOMEM;
		goto out;
	}
	/* Sums of (x - first sample) instead of x: the textbook
	 * sum-of-squares formula cancels badly when |mean| >> std. */
	for (int64_t i = 0; i < n; i++) {
		/* A look every 4096 samples: a few ms of reading at most. */
		if ((i & 4095) == 0 && cancel && atomic_load_explicit(cancel, memory_order_relaxed)) {
			tr_data_errorf(err, errlen, "cancelled");
			ret = -ECANCELED;
			goto out;
		}
		ret = tr_reader_get(train, i, x, y, err, errlen);
		if (ret)
			goto out;
		apply_ops(t, k, x, nf, 0, 0, i, 0);
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

int tr_transforms_create(const struct tr_spec *spec, tr_reader_t *train, tr_transforms_t **out, char *err,
			 size_t errlen)
{
	return tr_transforms_create_cancellable(spec, train, NULL, out, err, errlen);
}

int tr_transforms_create_cancellable(const struct tr_spec *spec, tr_reader_t *train, const atomic_bool *cancel,
				     tr_transforms_t **out, char *err, size_t errlen)
{
	tr_transforms_t *t;
	int noise_k = 0, ret;

	*out = NULL;
	if (spec->n_transforms < 0 || spec->n_transforms > TR_SPEC_MAX_TRANSFORMS) {
		tr_data_errorf(err, errlen, "too many transforms (%d)", spec->n_transforms);
		return -EINVAL;
	}
	t = calloc(1, sizeof(*t));
	if (!t) {
		tr_data_errorf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	t->features = train ? train->info.features : 0;
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
		case TR_TF_STANDARDIZE:
			if (!train) {
				tr_data_errorf(err, errlen,
					       "/data/transforms/%d: standardize needs training data", k);
				ret = -EINVAL;
				goto fail;
			}
			ret = standardize_stats(t, k, train, cancel, err, errlen);
			if (ret)
				goto fail;
			break;
		default:
			tr_data_errorf(err, errlen, "/data/transforms/%d: unknown transform type %d", k,
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
		apply_ops(t, t->n, x, features, seed, epoch, sample_index, training);
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
	return type == TR_TF_GAUSSIAN_NOISE;
}

/* Reads n floats from the recorded array `key` of `fitted`; positive
 * (std) when `positive`. */
static int recorded_floats(const json_t *fitted, const char *key, int k, int n, bool positive, float **out,
			   char *err, size_t errlen)
{
	const json_t *a = json_object_get(fitted, key);

	if (!json_is_array(a) || json_array_size(a) != (size_t)n) {
		tr_data_errorf(err, errlen, "transforms/%d: standardize needs \"fitted\": {\"%s\": [%d numbers]}", k,
			       key, n);
		return -EINVAL;
	}
	float *v = malloc((size_t)n * sizeof(float));
	if (!v) {
		tr_data_errorf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (int j = 0; j < n; j++) {
		const json_t *e = json_array_get(a, (size_t)j);
		double d = json_number_value(e);

		if (!json_is_number(e) || !isfinite(d) || (positive && !((float)d > 0.0f))) {
			tr_data_errorf(err, errlen, "transforms/%d/fitted/%s/%d: must be a finite number%s", k, key, j,
				       positive ? " > 0" : "");
			free(v);
			return -EINVAL;
		}
		v[j] = (float)d;
	}
	*out = v;
	return 0;
}

int tr_transforms_create_recorded(const struct tr_spec *spec, const json_t *const *fitted, int features,
				  tr_transforms_t **out, char *err, size_t errlen)
{
	tr_transforms_t *t;
	int noise_k = 0, ret;

	*out = NULL;
	if (spec->n_transforms < 0 || spec->n_transforms > TR_SPEC_MAX_TRANSFORMS || features <= 0) {
		tr_data_errorf(err, errlen, "bad transform list (%d transforms, %d features)", spec->n_transforms,
			       features);
		return -EINVAL;
	}
	t = calloc(1, sizeof(*t));
	if (!t) {
		tr_data_errorf(err, errlen, "out of memory");
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
		if (ts->type == TR_TF_STANDARDIZE) {
			const json_t *f = fitted ? fitted[k] : NULL;

			if ((ret = recorded_floats(f, "mean", k, features, false, &o->mean, err, errlen)) < 0 ||
			    (ret = recorded_floats(f, "std", k, features, true, &o->sd, err, errlen)) < 0)
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
