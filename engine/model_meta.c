/* Writing and reading a model file's self-description (model_meta.h,
 * docs/model-format.md).
 *
 * The reading side rebuilds the spec's model section and transforms by
 * putting them into a minimal job spec and parsing that: the one parser
 * then checks a file's description exactly as it checks a job, and a layer
 * type added to the spec is understood here without a second list.
 */
#include "engine/model_meta.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_text.h"
#include "engine/safetensors.h"

static int set_json(json_t *meta, const char *key, json_t *value)
{
	/* Compact, ordered as written, reals in their shortest exact form so
	 * that every recorded float reads back to the same float. */
	char *text = value ? tr_json_dumps(value, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
	json_decref(value);
	if (!text)
		return -ENOMEM;
	int rc = json_object_set_new(meta, key, json_string(text));
	free(text);
	return rc == 0 ? 0 : -ENOMEM;
}

static json_t *describe_labels(const struct tr_spec *spec, const tr_model_t *m, tr_reader_t *train)
{
	if (spec->loss != TR_LOSS_SOFTMAX_CE)
		return json_pack("{s:s, s:i}", "task", "regression", "outputs", m->outputs);
	json_t *names = json_null();
	if (train && train->i->class_name && train->i->class_name(train, 0)) {
		json_decref(names);
		names = json_array();
		for (int c = 0; names && c < m->outputs; c++) {
			const char *n = train->i->class_name(train, c);
			json_array_append_new(names, json_string(n ? n : ""));
		}
	}
	return json_pack("{s:s, s:i, s:o}", "task", "classification", "classes", m->outputs, "class_names", names);
}

static bool conv_layers(const struct tr_layer_spec *l, int n, int *radius)
{
	for (int i = 0; i < n; i++, l++) {
		switch (l->type) {
		case TR_LAYER_RELU:
		case TR_LAYER_GELU:
		case TR_LAYER_TANH:
		case TR_LAYER_SIGMOID:
		case TR_LAYER_DROPOUT:
		case TR_LAYER_BATCHNORM2D: /* at inference: per channel, running statistics */
			break;
		case TR_LAYER_RESIDUAL: /* the skip sees no further than its layers */
			if (!conv_layers(l->inner, l->n_inner, radius))
				return false;
			break;
		case TR_LAYER_CONV2D: {
			int reach = 0;
			for (int a = 0; a < 2; a++) {
				int span = (l->dilation[a] ? l->dilation[a] : 1) * (l->kernel[a] - 1);
				if ((l->stride[a] ? l->stride[a] : 1) != 1 ||
				    (!l->pad_same && 2 * l->padding[a] != span))
					return false;
				/* "same" pads the odd pixel of an even span on one side */
				reach = (span + 1) / 2 > reach ? (span + 1) / 2 : reach;
			}
			*radius += reach;
			break;
		}
		default: /* dense, flatten, pools, layernorm and groupnorm see the whole image */
			return false;
		}
	}
	return true;
}

bool tr_model_fully_conv(const struct tr_spec *spec, int *radius)
{
	*radius = 0;
	for (int k = 0; k < spec->n_transforms; k++)
		if (spec->transforms[k].type == TR_TF_STANDARDIZE)
			return false;
	return spec->input_ndim == 3 && spec->n_layers > 0 && conv_layers(spec->layers, spec->n_layers, radius);
}

/* preprocessing.pixels for a model trained on image files, else NULL. */
static json_t *describe_pixels(const struct tr_spec *spec, const tr_model_t *m)
{
	const struct tr_source_spec *s = &spec->train;
	int c = m->in_shape.ndim == 3 ? m->in_shape.d[0] : 1;
	if (s->format == TR_DATA_IMAGES || s->format == TR_DATA_IDX)
		return json_pack("{s:f, s:i}", "scale", 1.0, "channels", c);
	if (s->format != TR_DATA_PATCHES)
		return NULL;
	json_t *deg = tr_degrade_to_json(&s->degrade);
	/* The patches reader's scale, as the float it multiplies by. */
	return json_pack("{s:f, s:i, s:o, s:s}", "scale", (double)(1.0f / 255.0f), "channels", c, "degrade",
			 deg ? deg : json_null(), "response", s->residual ? "residual" : "clean");
}

int tr_model_meta_describe(json_t *meta, const struct tr_spec *spec, const tr_model_t *m, const tr_transforms_t *tf,
			   tr_reader_t *train, struct tr_error *err)
{
	json_t *full = tr_spec_to_json(spec);
	json_t *model = full ? json_deep_copy(json_object_get(full, "model")) : NULL;
	json_t *tfs = full ? json_object_get(json_object_get(full, "data"), "transforms") : NULL;
	json_t *pre = json_pack("{s:i, s:[]}", "features", m->inputs, "transforms");
	int rc = -ENOMEM;
	if (!model || !pre)
		goto out;
	/* A width or [C, H, W] taken from the data is recorded as the
	 * model's. */
	if (!json_object_get(model, "inputs"))
		json_object_set_new(model, "inputs",
				    m->in_shape.ndim == 3 ? json_pack("[iii]", (int)m->in_shape.d[0],
								      (int)m->in_shape.d[1], (int)m->in_shape.d[2])
							  : json_integer(m->inputs));
	/* A fully convolutional model takes any H x W. */
	struct tr_spec shaped = *spec; /* shallow: only read */
	int radius;
	if (m->in_shape.ndim == 3) {
		shaped.input_ndim = 3;
		memcpy(shaped.input_shape, m->in_shape.d, sizeof shaped.input_shape);
	}
	if (tr_model_fully_conv(&shaped, &radius) && m->n_layers > 0 &&
	    m->layers[m->n_layers - 1].out_shape.ndim == 3 &&
	    m->layers[m->n_layers - 1].out_shape.d[1] == m->in_shape.d[1] &&
	    m->layers[m->n_layers - 1].out_shape.d[2] == m->in_shape.d[2]) {
		json_object_set_new(model, "input_shape", json_pack("[inn]", (int)m->in_shape.d[0]));
		json_object_set_new(model, "receptive_field", json_integer(2 * radius + 1));
	}
	json_t *list = json_object_get(pre, "transforms");
	for (size_t k = 0; k < json_array_size(tfs); k++) {
		json_t *e = json_deep_copy(json_array_get(tfs, k));
		if (!e)
			goto out;
		json_t *fitted = tr_transforms_fitted(tf, (int)k);
		if (fitted)
			json_object_set_new(e, "fitted", fitted);
		if (k < (size_t)spec->n_transforms && tr_transforms_train_only(spec->transforms[k].type))
			json_object_set_new(e, "train_only", json_true());
		json_array_append_new(list, e);
	}
	if (spec->n_transforms > 0 && json_array_size(list) != (size_t)spec->n_transforms)
		goto out;
	/* An image folder's resize and center_crop make the model's input
	 * from an image of any size: predict and eval apply them too. */
	const json_t *src = json_object_get(json_object_get(full, "data"), "train");
	if (spec->train.format == TR_DATA_IMAGES && (spec->train.resize[0] || spec->train.center_crop[0])) {
		json_t *img = json_object();
		const char *keys[] = {"resize", "center_crop"};
		for (int i = 0; img && i < 2; i++)
			if (json_object_get(src, keys[i]))
				json_object_set(img, keys[i], json_object_get(src, keys[i]));
		if (!img || json_object_set_new(pre, "images", img) < 0)
			goto out;
	}
	json_t *px = describe_pixels(spec, m);
	if (px && json_object_set_new(pre, "pixels", px) < 0)
		goto out;
	json_object_set_new(meta, "trainerd_model_format", json_string(TR_MODEL_FORMAT_VERSION));
	json_object_set_new(meta, "trainerd_version", json_string(TR_VERSION));
	/* set_json takes the value whatever it returns. */
	rc = set_json(meta, "model", model);
	model = NULL;
	if (rc == 0)
		rc = set_json(meta, "preprocessing", pre);
	pre = NULL;
	if (rc == 0)
		rc = set_json(meta, "labels", describe_labels(spec, m, train));
out:
	if (rc < 0)
		tr_error_set(err, 0, 0, NULL, "model description: out of memory");
	json_decref(model);
	json_decref(pre);
	json_decref(full);
	return rc;
}

/* ---- reading ---- */

static json_t *get_json(const json_t *meta, const char *key, struct tr_error *err)
{
	const char *text = json_string_value(json_object_get(meta, key));
	if (!text) {
		tr_error_set(
			err, 0, 0, NULL,
			"model file: no \"%s\" in its metadata (written before trainerd described its models, or by "
			"another program)",
			key);
		return NULL;
	}
	json_error_t jerr;
	json_t *v = json_loads(text, 0, &jerr);
	if (!json_is_object(v)) {
		tr_error_set(err, 0, 0, NULL, "model file: metadata \"%s\" is not a JSON object", key);
		json_decref(v);
		return NULL;
	}
	return v;
}

void tr_model_desc_finish(struct tr_model_desc *d)
{
	if (!d)
		return;
	tr_spec_finish(&d->spec);
	tr_transforms_destroy(d->transforms);
	if (d->class_names)
		for (int c = 0; c < d->outputs; c++)
			free(d->class_names[c]);
	free(d->class_names);
	free(d->params);
	memset(d, 0, sizeof *d);
}

static int parse_pixels(const json_t *px, struct tr_model_desc *d, struct tr_error *err)
{
	struct tr_pixels *p = &d->pixels;
	if (!px)
		return 0;
	const json_t *scale = json_object_get(px, "scale"), *ch = json_object_get(px, "channels");
	const json_t *deg = json_object_get(px, "degrade"), *resp = json_object_get(px, "response");
	int want = d->model.in_shape.ndim == 3 ? d->model.in_shape.d[0] : 1;
	if (!json_is_object(px) || !json_is_number(scale) || !(json_number_value(scale) > 0.0)) {
		tr_error_set(err, 0, 0, NULL, "model file: preprocessing.pixels.scale must be a number > 0");
		return -EINVAL;
	}
	if (!json_is_integer(ch) || json_integer_value(ch) != want) {
		tr_error_set(err, 0, 0, NULL,
			     "model file: preprocessing.pixels.channels must be %d (the model's input)", want);
		return -EINVAL;
	}
	p->scale = (float)json_number_value(scale);
	p->channels = want;
	if (resp) {
		const char *r = json_string_value(resp);
		if (!r || (strcmp(r, "clean") != 0 && strcmp(r, "residual") != 0)) {
			tr_error_set(err, 0, 0, NULL,
				     "model file: preprocessing.pixels.response must be \"clean\" or \"residual\"");
			return -EINVAL;
		}
		p->image_to_image = true;
		p->residual = strcmp(r, "residual") == 0;
	}
	const char *field;
	char msg[256];
	if (deg && !json_is_null(deg) && tr_degrade_from_json(deg, &p->degrade, &field, msg, sizeof msg) < 0) {
		tr_error_set(err, 0, 0, NULL, "model file: preprocessing.pixels.degrade%s%s: %s", field ? "." : "",
			     field ? field : "", msg);
		return -EINVAL;
	}
	p->present = true;
	return 0;
}

int tr_model_desc_need_pixels(const struct tr_model_desc *d, struct tr_error *err)
{
	if (d->pixels.present || d->model.in_shape.ndim != 3)
		return 0;
	tr_error_set(err, 0, 0, NULL,
		     "model file: no preprocessing.pixels (the pixel scale, channel count, degradation and response "
		     "of its training images; written by a trainerd before they were recorded): it is not run on "
		     "images with a guess; train it again with this trainerd, or add the entry (docs/model-format.md)");
	return -EINVAL;
}

int tr_model_desc_from_meta(const json_t *meta, struct tr_model_desc *d, struct tr_error *err)
{
	memset(d, 0, sizeof *d);
	json_t *model = NULL, *pre = NULL, *labels = NULL, *doc = NULL, *stripped = NULL;
	const json_t *fitted[TR_SPEC_MAX_TRANSFORMS] = {0};
	int rc = -EINVAL;
	const char *fmt = json_string_value(json_object_get(meta, "trainerd_model_format"));
	if (fmt && strcmp(fmt, TR_MODEL_FORMAT_VERSION) != 0) {
		tr_error_set(err, 0, 0, NULL,
			     "model file: trainerd_model_format %.16s is not one this build reads (%s)", fmt,
			     TR_MODEL_FORMAT_VERSION);
		return -EINVAL;
	}
	if (!(model = get_json(meta, "model", err)) || !(pre = get_json(meta, "preprocessing", err)) ||
	    !(labels = get_json(meta, "labels", err)))
		goto out;
	/* What trainerd adds to the spec's model section: free H and W
	 * (checked against the layers below) and the receptive field. */
	const json_t *ishape = json_object_get(model, "input_shape");
	bool free_recorded = json_is_array(ishape) && json_array_size(ishape) == 3 &&
			     json_is_null(json_array_get(ishape, 1)) && json_is_null(json_array_get(ishape, 2));
	json_object_del(model, "input_shape");
	json_object_del(model, "receptive_field");
	snprintf(d->version, sizeof d->version, "%s",
		 json_string_value(json_object_get(meta, "trainerd_version")) ?: "");

	/* The transforms as a spec lists them: without what trainerd added. */
	const json_t *tfs = json_object_get(pre, "transforms");
	if (tfs && (!json_is_array(tfs) || json_array_size(tfs) > TR_SPEC_MAX_TRANSFORMS)) {
		tr_error_set(err, 0, 0, NULL, "model file: preprocessing: transforms must be an array of at most %d",
			     TR_SPEC_MAX_TRANSFORMS);
		goto out;
	}
	stripped = json_array();
	for (size_t k = 0; k < json_array_size(tfs); k++) {
		const json_t *e = json_array_get(tfs, k);
		json_t *c = json_is_object(e) ? json_deep_copy(e) : NULL;
		if (!c) {
			tr_error_set(err, 0, 0, NULL, "model file: preprocessing: transforms/%zu must be an object", k);
			goto out;
		}
		fitted[k] = json_object_get(e, "fitted");
		json_object_del(c, "fitted");
		json_object_del(c, "train_only");
		json_array_append_new(stripped, c);
	}
	/* A minimal job around them; the data source is never opened.  An
	 * image folder's resize and crop ride on an images source, so the
	 * parser checks them as a job's and leaves them in d->spec.train. */
	const json_t *img = json_object_get(pre, "images");
	if (img && !json_is_object(img)) {
		tr_error_set(err, 0, 0, NULL, "model file: preprocessing: images must be an object");
		goto out;
	}
	json_t *train = img ? json_deep_copy(img) : json_object();
	if (!train || json_object_set_new(train, "format", json_string(img ? "images" : "csv")) < 0 ||
	    json_object_set_new(train, "path", json_string("-")) < 0 ||
	    (img && json_object_set_new(train, "labels", json_string("folders")) < 0)) {
		json_decref(train);
		tr_error_set(err, 0, 0, NULL, "model file: out of memory");
		goto out;
	}
	doc = json_pack("{s:O, s:{s:o, s:O}, s:i, s:i, s:{s:s, s:f}}", "model", model, "data", "train", train,
			"transforms", stripped, "batch_size", 1, "epochs", 1, "optimizer", "type", "sgd", "lr", 0.1);
	struct tr_error serr;
	if (!doc || tr_spec_parse(doc, &d->spec, &serr) < 0) {
		tr_error_set(err, 0, 0, NULL, "model file: %s", doc ? serr.message : "out of memory");
		goto out;
	}
	int features = (int)json_integer_value(json_object_get(pre, "features"));
	if (d->spec.inputs <= 0 || features != d->spec.inputs) {
		tr_error_set(err, 0, 0, NULL,
			     "model file: model.inputs (%d) and preprocessing.features (%d) must be equal and > 0",
			     d->spec.inputs, features);
		goto out;
	}
	struct tr_error why;
	if ((rc = tr_model_init(&d->model, &d->spec, d->spec.inputs, &why)) < 0) {
		tr_error_set(err, 0, 0, NULL, "model file: %s", why.message);
		goto out;
	}
	if (d->spec.n_transforms > 0 &&
	    (rc = tr_transforms_create_recorded(&d->spec, fitted, features, &d->transforms, &why)) < 0) {
		tr_error_set(err, 0, 0, NULL, "model file: preprocessing: %s", why.message);
		goto out;
	}
	rc = -EINVAL;
	if (parse_pixels(json_object_get(pre, "pixels"), d, err) < 0)
		goto out;
	const struct tr_layer *last = &d->model.layers[d->model.n_layers > 0 ? d->model.n_layers - 1 : 0];
	d->free_hw = free_recorded && d->model.n_layers > 0 && tr_model_fully_conv(&d->spec, &d->radius) &&
		     last->out_shape.ndim == 3 && last->out_shape.d[1] == d->model.in_shape.d[1] &&
		     last->out_shape.d[2] == d->model.in_shape.d[2];
	const char *task = json_string_value(json_object_get(labels, "task"));
	d->classification = d->spec.loss == TR_LOSS_SOFTMAX_CE;
	d->outputs = d->model.outputs;
	if (!task || strcmp(task, d->classification ? "classification" : "regression") != 0) {
		tr_error_set(err, 0, 0, NULL, "model file: labels.task must be \"%s\" for the loss %s",
			     d->classification ? "classification" : "regression",
			     d->classification ? "softmax_cross_entropy" : "mse");
		goto out;
	}
	const json_t *names = json_object_get(labels, "class_names");
	if (d->classification && json_is_array(names)) {
		if (json_array_size(names) != (size_t)d->outputs) {
			tr_error_set(err, 0, 0, NULL, "model file: labels.class_names has %zu names for %d classes",
				     json_array_size(names), d->outputs);
			goto out;
		}
		d->class_names = calloc((size_t)d->outputs, sizeof *d->class_names);
		for (int c = 0; d->class_names && c < d->outputs; c++) {
			const char *n = json_string_value(json_array_get(names, (size_t)c));
			d->class_names[c] = strdup(n ? n : "");
			if (!d->class_names[c])
				break;
		}
	}
	rc = 0;
out:
	json_decref(model);
	json_decref(pre);
	json_decref(labels);
	json_decref(doc);
	json_decref(stripped);
	return rc;
}

static int load_params(tr_st_file_t *f, struct tr_model_desc *d, struct tr_error *err)
{
	const tr_model_t *m = &d->model;
	d->params = malloc((m->n_params ? m->n_params : 1) * sizeof(float));
	if (!d->params) {
		tr_error_set(err, 0, 0, NULL, "model file: out of memory for %zu parameters", m->n_params);
		return -ENOMEM;
	}
	int rc = 0;
	for (int i = 0; i < tr_model_param_count(m) && rc == 0; i++) {
		struct tr_param_view v;
		tr_model_param_view(m, i, &v);
		rc = tr_st_read_f32(f, v.name, v.ndim, v.shape, d->params + v.offset, err);
	}
	return rc;
}

static int load_file(tr_st_file_t *f, struct tr_model_desc *d, struct tr_error *err)
{
	const json_t *meta = tr_st_metadata(f);
	int rc = tr_model_desc_from_meta(meta, d, err);
	if (rc == 0)
		rc = load_params(f, d, err);
	tr_st_close(f);
	return rc;
}

int tr_model_desc_load_mem(const void *data, size_t len, const char *label, struct tr_model_desc *d,
			   struct tr_error *err)
{
	tr_st_file_t *f;
	memset(d, 0, sizeof *d);
	int rc = tr_st_open_mem(data, len, label, &f, err);
	return rc < 0 ? rc : load_file(f, d, err);
}

int tr_model_desc_load(const char *path, struct tr_model_desc *d, struct tr_error *err)
{
	tr_st_file_t *f;
	memset(d, 0, sizeof *d);
	int rc = tr_st_open(path, &f, err);
	return rc < 0 ? rc : load_file(f, d, err);
}

static void strip_prefix(char *s, size_t cap, const char *prefix)
{
	size_t k = strlen(prefix), n = strnlen(s, cap);
	if (n == cap || n < k || strncmp(s, prefix, k) != 0)
		return;
	memmove(s, s + k, n - k + 1); /* with the NUL at s[n] */
}

int tr_model_source_parse(const json_t *model, const struct tr_model_desc *d, const json_t *src, struct tr_spec *out,
			  struct tr_error *err)
{
	json_t *full = model ? NULL : tr_spec_to_json(&d->spec);
	const json_t *m = model ? model : json_object_get(full, "model");
	json_t *doc = json_pack("{s:I, s:O, s:{s:O}, s:i, s:i, s:{s:s, s:f}}", "seed",
				(json_int_t)(d ? d->spec.seed : 0), "model", m, "data", "train", src, "batch_size", 1,
				"epochs", 1, "optimizer", "type", "sgd", "lr", 0.1);
	int rc = -ENOMEM;
	memset(out, 0, sizeof *out);
	memset(err, 0, sizeof *err);
	if (doc && m && src)
		rc = tr_spec_parse(doc, out, err);
	else
		snprintf(err->message, sizeof err->message, "out of memory");
	if (rc < 0) {
		/* "/data/train/path: ..." is "/path" of the source. */
		strip_prefix(err->pointer, sizeof err->pointer, "/data/train");
		strip_prefix(err->message, sizeof err->message, "/data/train");
	}
	json_decref(doc);
	json_decref(full);
	return rc;
}

void tr_model_desc_want_shape(const struct tr_model_desc *d, struct tr_source_spec *src)
{
	if (src->format != TR_DATA_IMAGES)
		return;
	/* The training folder's resize and crop, unless the source has its own. */
	if (d->spec.train.format == TR_DATA_IMAGES && !src->resize[0] && !src->center_crop[0]) {
		memcpy(src->resize, d->spec.train.resize, sizeof src->resize);
		memcpy(src->center_crop, d->spec.train.center_crop, sizeof src->center_crop);
	}
	if (d->model.in_shape.ndim == 3)
		memcpy(src->want_shape, d->model.in_shape.d, sizeof src->want_shape);
}

static bool same_degrade(const struct tr_degrade *a, const struct tr_degrade *b)
{
	return a->type == b->type && (a->type != TR_DEGRADE_DOWNSCALE || a->factor == b->factor) &&
	       (a->type != TR_DEGRADE_NOISE || a->sigma == b->sigma);
}

static void degrade_text(const struct tr_degrade *g, char *buf, size_t len)
{
	json_t *j = tr_degrade_to_json(g);
	char *t = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
	snprintf(buf, len, "%s", t ? t : "none");
	free(t);
	json_decref(j);
}

int tr_model_desc_source(const struct tr_model_desc *d, struct tr_source_spec *src, struct tr_error *err)
{
	tr_model_desc_want_shape(d, src);
	if (src->format != TR_DATA_IMAGES && src->format != TR_DATA_IDX && src->format != TR_DATA_PATCHES)
		return 0;
	if (tr_model_desc_need_pixels(d, err) < 0)
		return -EINVAL;
	const struct tr_pixels *p = &d->pixels;
	if (src->format == TR_DATA_IMAGES)
		src->pixel_scale = p->present ? p->scale : 1.0f;
	if (src->format == TR_DATA_IDX && p->present && p->scale != 1.0f) {
		tr_error_set(err, 0, 0, NULL,
			     "the model takes pixels times %g and an IDX file's are taken as they are: give the images "
			     "as a folder of PNG files",
			     (double)p->scale);
		return -EINVAL;
	}
	if (src->format != TR_DATA_PATCHES)
		return 0;
	/* The patches reader scales, degrades and makes the response itself:
	 * as the model was trained, or the figures would mean nothing. */
	char want[96], have[96];
	if (!p->image_to_image || p->scale != 1.0f / 255.0f) {
		tr_error_set(err, 0, 0, NULL, "patches: the model was not trained on patches");
		return -EINVAL;
	}
	if (!same_degrade(&src->degrade, &p->degrade)) {
		degrade_text(&src->degrade, have, sizeof have);
		degrade_text(&p->degrade, want, sizeof want);
		tr_error_set(err, 0, 0, NULL, "/degrade: %s, the model was trained with %s", have, want);
		return -EINVAL;
	}
	if (src->residual != p->residual) {
		tr_error_set(err, 0, 0, NULL, "/response: \"%s\", the model was trained on \"%s\"",
			     src->residual ? "residual" : "clean", p->residual ? "residual" : "clean");
		return -EINVAL;
	}
	return 0;
}

int tr_model_desc_check_classes(const struct tr_model_desc *d, tr_reader_t *rd, struct tr_error *err)
{
	if (!d->class_names || !rd->i->class_name)
		return 0;
	char diff[1024] = "";
	size_t used = 0;
	int bad = 0;
	for (int k = 0;; k++) {
		const char *have = tr_images_class_name(rd, k);
		const char *want = k < d->outputs ? d->class_names[k] : NULL;
		if (!have)
			break;
		if (want && strcmp(have, want) == 0)
			continue;
		if (bad++ < 8 && used < sizeof diff)
			used += (size_t)snprintf(diff + used, sizeof diff - used,
						 "%sclass %d is '%s' in the data, %s%s%s", used ? "; " : "", k, have,
						 want ? "'" : "", want ? want : "absent",
						 want ? "' in the model" : " from the model");
	}
	if (!bad)
		return 0;
	tr_error_set(err, 0, 0, NULL, "the class folders do not match the model's classes: %s%s", diff,
		     bad > 8 ? "; ..." : "");
	return -EINVAL;
}
