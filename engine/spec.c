/* Job spec parsing, validation and normalization (docs/design.md §5).
 *
 * Every JSON object of the spec is described by one table of fields, read
 * by the field-table interpreter (engine/spec_fields.c): the same tables
 * drive parsing, defaults, range messages and tr_spec_to_json, so the
 * normalized form cannot drift from what the parser accepts.  Values
 * that are more than one scalar or object (sources, devices, labels, betas)
 * are custom fields with their own parse and emit functions.  The first
 * problem stops parsing and is reported with the JSON pointer of the value.
 */
#include "engine/spec.h"

#include "engine/data/degrade.h"
#include "engine/model/layer_spec.h"
#include "engine/model/model.h"
#include "engine/spec_fields.h"
#include "engine/spec_resources.h"

#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Enum fields are read and written as int through memcpy. */
_Static_assert(sizeof(enum tr_layer_type) == sizeof(int), "enum size");
_Static_assert(sizeof(enum tr_loss) == sizeof(int), "enum size");
_Static_assert(sizeof(enum tr_data_format) == sizeof(int), "enum size");
_Static_assert(sizeof(enum tr_optim_type) == sizeof(int), "enum size");

/* ---- custom fields ---- */

static const char *const loss_names[] = {"softmax_cross_entropy", "mse", NULL};
static const char *const format_names[] = {"csv", "npy", "idx", "synthetic", "images", "patches", NULL};
static const char *const task_names[] = {"classification", "regression", NULL};
static const char *const transform_names[] = {"scale",       "standardize", "gaussian_noise", "normalize",
					      "random_crop", "flip",        "rot90",          NULL};
static const char *const response_names[] = {"clean", "residual", NULL};
static const char *const last_batch_names[] = {"partial", "drop", "pad", "rollover", NULL};
static const char *const optim_names[] = {"sgd", "adam", "adamw", NULL};
static const char *const sched_names[] = {"constant", "step", "cosine", "linear", NULL};
static const char *const backend_names[] = {"auto", "cpu", "cuda", NULL};
static const char *const cpu_conv_names[] = {"default", "auto", "im2col", "onednn", NULL};
static const char *const cpu_dense_names[] = {"auto", "openblas", "onednn", NULL};
static const char *const precision_names[] = {"fp32", "tf32", NULL};
static const char *const es_metric_names[] = {"loss", "val_loss", "val_accuracy", NULL};
static const char *const es_mode_names[] = {"min", "max", NULL};
static const char *const metric_names[] = {"grad_norm",       "weight_norm",      "device_step_ms",
					   "update_ratio",    "activation_stats", "lr",
					   "samples_per_sec", "data_wait_ms",     NULL};

/* How a list of distinct integers names its items in error messages. */
struct int_list_words {
	const char *plural; /* "must have at most %d <plural>" */
	const char *item;   /* "duplicate <item> %d" */
	bool show_range;    /* out of range: "must be in [lo, hi]" rather than "is out of range" */
};

/* A non-empty array of at most `max` distinct integers in [lo, hi] into
 * `out`; returns the count or -EINVAL with the offending element's pointer. */
static int parse_distinct_ints(struct tr_fields_ctx *c, const json_t *v, int *out, size_t max, json_int_t lo,
			       json_int_t hi, const struct int_list_words *w)
{
	size_t n = json_array_size(v);

	if (n == 0)
		return tr_fields_fail(c, NULL, "must not be empty");
	if (n > max)
		return tr_fields_fail(c, NULL, "must have at most %zu %s", max, w->plural);
	for (size_t i = 0; i < n; i++) {
		const json_t *e = json_array_get(v, i);
		char idx[24];
		json_int_t x;

		snprintf(idx, sizeof(idx), "%zu", i);
		if (!json_is_integer(e))
			return tr_fields_fail(c, idx, "must be an integer");
		x = json_integer_value(e);
		if (x < lo || x > hi)
			return w->show_range
				       ? tr_fields_fail(c, idx, "must be in [%lld, %lld]", (long long)lo, (long long)hi)
				       : tr_fields_fail(c, idx, "is out of range");
		for (size_t j = 0; j < i; j++)
			if (out[j] == (int)x)
				return tr_fields_fail(c, idx, "duplicate %s %d", w->item, (int)x);
		out[i] = (int)x;
	}
	return (int)n;
}

/* csv "label": one column or a list of columns, negative from the end. */
static int parse_label(struct tr_fields_ctx *c, const json_t *v, void *base)
{
	struct tr_source_spec *src = base;
	int rc;

	if (!v) {
		src->label_cols[0] = -1;
		src->n_label_cols = 1;
		return 0;
	}
	if (json_is_integer(v)) {
		json_int_t x = json_integer_value(v);

		if (x < INT_MIN || x > INT_MAX)
			return tr_fields_fail(c, NULL, "is out of range");
		src->label_cols[0] = (int)x;
		src->n_label_cols = 1;
		return 0;
	}
	if (!json_is_array(v))
		return tr_fields_fail(c, NULL, "must be a column index or an array of column indices");
	rc = parse_distinct_ints(c, v, src->label_cols, TR_SPEC_MAX_LABEL_COLS, INT_MIN, INT_MAX,
				 &(struct int_list_words){"columns", "label column", false});
	if (rc < 0)
		return rc;
	src->n_label_cols = rc;
	return 0;
}

static int emit_label(const void *base, json_t *obj, const char *key)
{
	const struct tr_source_spec *src = base;
	json_t *a;

	if (src->n_label_cols == 1)
		return json_object_set_new(obj, key, json_integer(src->label_cols[0]));
	if (!(a = json_array()))
		return -1;
	for (int i = 0; i < src->n_label_cols; i++) {
		if (json_array_append_new(a, json_integer(src->label_cols[i]))) {
			json_decref(a);
			return -1;
		}
	}
	return json_object_set_new(obj, key, a);
}

enum {
	V_CSV = 1u << 0,
	V_NPY = 1u << 1,
	V_IDX = 1u << 2,
	V_SYN_CLS = 1u << 3,
	V_SYN_REG = 1u << 4,
	V_SYN = V_SYN_CLS | V_SYN_REG,
	V_IMAGES = 1u << 5,
	V_PATCHES = 1u << 6,
};

#define SRC(m) offsetof(struct tr_source_spec, m)

static int parse_chw(struct tr_fields_ctx *c, const json_t *v, int *out);

/* synthetic "shape": [C, H, W] samples instead of "features" (which, if
 * also given, must be C x H x W: the normalized form has both). */
static int parse_shape(struct tr_fields_ctx *c, const json_t *v, void *base)
{
	struct tr_source_spec *src = base;
	int rc;

	if (!v)
		return 0;
	if (!json_is_array(v))
		return tr_fields_fail(c, NULL, "must be [C, H, W]");
	if ((rc = parse_chw(c, v, src->shape)))
		return rc;
	src->shape_ndim = 3;
	int n = src->shape[0] * src->shape[1] * src->shape[2];
	if (src->features && src->features != n)
		return tr_fields_fail(c, NULL, "is %d values per sample, but features says %d", n, src->features);
	src->features = n;
	return 0;
}

static int emit_shape(const void *base, json_t *obj, const char *key)
{
	const struct tr_source_spec *src = base;

	if (src->shape_ndim != 3)
		return 0;
	return json_object_set_new(obj, key, json_pack("[iii]", src->shape[0], src->shape[1], src->shape[2]));
}

/* "labels": the labels file of idx, "folders" for images (one subfolder
 * per class, the only labelling images have so far). */
static int parse_labels(struct tr_fields_ctx *c, const json_t *v, void *base)
{
	struct tr_source_spec *src = base;

	if (src->format == TR_DATA_IMAGES) {
		if (v && !(json_is_string(v) && strcmp(json_string_value(v), "folders") == 0))
			return tr_fields_fail(c, NULL, "must be \"folders\" (one subfolder per class)");
		return 0;
	}
	if (src->format != TR_DATA_IDX)
		return 0;
	if (!v)
		return tr_fields_fail(c, NULL, "is required");
	if (!json_is_string(v) || json_string_length(v) == 0)
		return tr_fields_fail(c, NULL, "must be a non-empty string");
	if (strlen(json_string_value(v)) != json_string_length(v))
		return tr_fields_fail(c, NULL, "must not contain NUL characters");
	if (json_string_length(v) > TR_SPEC_MAX_PATH)
		return tr_fields_fail(c, NULL, "must be at most %d bytes", TR_SPEC_MAX_PATH);
	free(src->labels_path);
	src->labels_path = strdup(json_string_value(v));
	return src->labels_path ? 0 : tr_fields_fail_oom(c);
}

static int emit_labels(const void *base, json_t *obj, const char *key)
{
	const struct tr_source_spec *src = base;

	if (src->format == TR_DATA_IMAGES)
		return json_object_set_new(obj, key, json_string("folders"));
	return json_object_set_new(obj, key, json_string(src->labels_path ? src->labels_path : ""));
}

/* A size: one number n (n x n, or for resize the shorter side) or
 * [height, width], each in [1, TR_IMAGE_SIDE]. */
#define IMAGE_SIDE 16384
static int parse_size(struct tr_fields_ctx *c, const json_t *v, int out[2], bool square_number)
{
	if (json_is_integer(v)) {
		json_int_t x = json_integer_value(v);

		if (x < 1 || x > IMAGE_SIDE)
			return tr_fields_fail(c, NULL, "must be in [1, %d]", IMAGE_SIDE);
		out[0] = (int)x;
		out[1] = square_number ? (int)x : 0;
		return 0;
	}
	if (!json_is_array(v) || json_array_size(v) != 2)
		return tr_fields_fail(c, NULL, "must be a number or [height, width]");
	for (size_t i = 0; i < 2; i++) {
		const json_t *e = json_array_get(v, i);
		char idx[4];

		snprintf(idx, sizeof idx, "%zu", i);
		if (!json_is_integer(e) || json_integer_value(e) < 1 || json_integer_value(e) > IMAGE_SIDE)
			return tr_fields_fail(c, idx, "must be an integer in [1, %d]", IMAGE_SIDE);
		out[i] = (int)json_integer_value(e);
	}
	return 0;
}

static int emit_size(const int v[2], bool square_number, json_t *obj, const char *key)
{
	if (!v[0])
		return 0;
	if (!v[1] || (square_number && v[0] == v[1]))
		return json_object_set_new(obj, key, json_integer(v[0]));
	return json_object_set_new(obj, key, json_pack("[ii]", v[0], v[1]));
}

static int parse_resize(struct tr_fields_ctx *c, const json_t *v, void *base)
{
	return v ? parse_size(c, v, ((struct tr_source_spec *)base)->resize, false) : 0;
}

static int emit_resize(const void *base, json_t *obj, const char *key)
{
	return emit_size(((const struct tr_source_spec *)base)->resize, false, obj, key);
}

static int parse_center_crop(struct tr_fields_ctx *c, const json_t *v, void *base)
{
	return v ? parse_size(c, v, ((struct tr_source_spec *)base)->center_crop, true) : 0;
}

static int emit_center_crop(const void *base, json_t *obj, const char *key)
{
	return emit_size(((const struct tr_source_spec *)base)->center_crop, true, obj, key);
}

static int parse_patch_size(struct tr_fields_ctx *c, const json_t *v, void *base)
{
	struct tr_source_spec *src = base;

	if (!v)
		return src->format == TR_DATA_PATCHES ? tr_fields_fail(c, NULL, "is required") : 0;
	return parse_size(c, v, src->patch_size, true);
}

static int emit_patch_size(const void *base, json_t *obj, const char *key)
{
	return emit_size(((const struct tr_source_spec *)base)->patch_size, true, obj, key);
}

/* "degrade": {"type": "downscale", "factor": F} (F defaults to 2) or
 * {"type": "noise", "sigma": S}, the built-in degradation of patches from
 * one folder (engine/data/degrade.h); downscale by 2 when absent. */
static int parse_degrade(struct tr_fields_ctx *c, const json_t *v, void *base)
{
	struct tr_source_spec *src = base;
	const char *field;
	char msg[256];

	if (src->format != TR_DATA_PATCHES)
		return 0;
	if (!v) {
		src->degrade = (struct tr_degrade){.type = src->path ? TR_DEGRADE_DOWNSCALE : TR_DEGRADE_NONE,
						   .factor = src->path ? 2 : 0};
		return 0;
	}
	if (!src->path)
		return tr_fields_fail(c, NULL,
				      "applies to patches from one folder (path); input_path and "
				      "response_path give the pairs themselves");
	if (tr_degrade_from_json(v, &src->degrade, &field, msg, sizeof msg) < 0)
		return tr_fields_fail(c, field, "%s", msg);
	return 0;
}

static int emit_degrade(const void *base, json_t *obj, const char *key)
{
	json_t *v = tr_degrade_to_json(&((const struct tr_source_spec *)base)->degrade);
	return v ? json_object_set_new(obj, key, v) : 0;
}

/* clang-format off */
static const struct tr_field source_fields[] = {
	{.key = "format", .kind = K_ENUM, .off = SRC(format), .flags = F_REQ, .names = format_names},
	/* Required for csv and images, and for patches without input_path:
	 * checked in parse_source. */
	{.key = "path", .kind = K_STR, .off = SRC(path), .only = V_CSV | V_IMAGES | V_PATCHES},
	{.key = "label", .kind = K_CUSTOM, .only = V_CSV, .parse = parse_label, .emit = emit_label},
	{.key = "header", .kind = K_BOOL, .off = SRC(header), .only = V_CSV},
	{.key = "x", .kind = K_STR, .off = SRC(x_path), .only = V_NPY, .flags = F_REQ},
	{.key = "y", .kind = K_STR, .off = SRC(y_path), .only = V_NPY, .flags = F_REQ},
	{.key = "images", .kind = K_STR, .off = SRC(images_path), .only = V_IDX, .flags = F_REQ},
	{.key = "labels", .kind = K_CUSTOM, .only = V_IDX | V_IMAGES, .parse = parse_labels, .emit = emit_labels},
	{.key = "resize", .kind = K_CUSTOM, .only = V_IMAGES, .parse = parse_resize, .emit = emit_resize},
	{.key = "center_crop", .kind = K_CUSTOM, .only = V_IMAGES, .parse = parse_center_crop,
	 .emit = emit_center_crop},
	{.key = "input_path", .kind = K_STR, .off = SRC(input_path), .only = V_PATCHES},
	{.key = "response_path", .kind = K_STR, .off = SRC(response_path), .only = V_PATCHES},
	{.key = "patch_size", .kind = K_CUSTOM, .only = V_PATCHES, .parse = parse_patch_size,
	 .emit = emit_patch_size},
	{.key = "patches_per_image", .kind = K_INT, .off = SRC(patches_per_image), .only = V_PATCHES,
	 .flags = POSITIVE | F_HI, .hi = 1 << 20, .def = 128},
	{.key = "degrade", .kind = K_CUSTOM, .only = V_PATCHES, .parse = parse_degrade, .emit = emit_degrade},
	{.key = "response", .kind = K_BOOLENUM, .off = SRC(residual), .only = V_PATCHES, .names = response_names},
	{.key = "task", .kind = K_ENUM, .off = SRC(task), .only = V_SYN, .names = task_names},
	{.key = "samples", .kind = K_I64, .off = SRC(samples), .only = V_SYN, .flags = F_REQ | POSITIVE | F_HI,
	 .hi = (double)TR_SPEC_MAX_SAMPLES},
	{.key = "features", .kind = K_INT, .off = SRC(features), .only = V_SYN, .flags = POSITIVE | F_HI,
	 .hi = TR_SPEC_MAX_WIDTH},
	{.key = "shape", .kind = K_CUSTOM, .only = V_SYN, .parse = parse_shape, .emit = emit_shape},
	{.key = "classes", .kind = K_INT, .off = SRC(classes), .only = V_SYN_CLS, .flags = F_REQ | F_LO | F_HI, .lo = 2,
	 .hi = TR_SPEC_MAX_WIDTH},
	{.key = "outputs", .kind = K_INT, .off = SRC(outputs), .only = V_SYN_REG, .flags = POSITIVE | F_HI,
	 .hi = TR_SPEC_MAX_WIDTH, .def = 1},
	{.key = "noise", .kind = K_FLOAT, .off = SRC(noise), .only = V_SYN, .flags = NONNEG, .def = 0.1},
	{.key = "load_cost_us", .kind = K_I64, .off = SRC(load_cost_us), .only = V_SYN, .flags = NONNEG | F_HI,
	 .hi = TR_SPEC_MAX_LOAD_COST_US},
	{.key = "seed", .kind = K_U64, .off = SRC(data_seed), .only = V_SYN | V_PATCHES, .flags = NONNEG | F_NODEF},
	{0},
};
/* clang-format on */

static int source_variant(const struct tr_source_spec *src)
{
	if (src->format == TR_DATA_SYNTHETIC)
		return src->task == TR_SYNTH_REGRESSION ? 4 : 3;
	/* Synthetic takes two variant bits, so the formats after it move up. */
	return src->format > TR_DATA_SYNTHETIC ? (int)src->format + 1 : (int)src->format;
}

/* Which folders a source names: csv and images need "path"; patches
 * "path" or both of "input_path" and "response_path". */
static int check_source_paths(struct tr_fields_ctx *c, const json_t *v, const struct tr_source_spec *src)
{
	if (src->format == TR_DATA_CSV || src->format == TR_DATA_IMAGES) {
		if (!src->path)
			return tr_fields_fail(c, "path", "is required");
		return 0;
	}
	if (src->format != TR_DATA_PATCHES)
		return 0;
	if (src->path && (src->input_path || src->response_path))
		return tr_fields_fail(c, src->input_path ? "input_path" : "response_path",
				      "cannot be used together with path (path makes the pairs by degrade)");
	if (!src->path && !src->input_path)
		return tr_fields_fail(c, "path", "is required (or input_path and response_path)");
	if (!src->path && !src->response_path)
		return tr_fields_fail(c, "response_path", "is required with input_path");
	(void)v;
	return 0;
}

/* Sources have two discriminators (format, and task for synthetic), so
 * they do by hand what parse_object does for one. */
static int parse_source(struct tr_fields_ctx *c, const json_t *v, struct tr_source_spec *src)
{
	char desc[96];
	int rc;

	if (!json_is_object(v))
		return tr_fields_fail(c, NULL, "must be an object");
	src->present = true;
	src->data_seed = ((const struct tr_spec *)c->user)->seed;
	if ((rc = tr_fields_parse_field(c, v, tr_fields_find_field(source_fields, "format"), src, true)))
		return rc;
	if (src->format == TR_DATA_SYNTHETIC) {
		if ((rc = tr_fields_parse_field(c, v, tr_fields_find_field(source_fields, "task"), src, true)))
			return rc;
		snprintf(desc, sizeof(desc), "format \"synthetic\" with task \"%s\"", task_names[src->task]);
	} else {
		snprintf(desc, sizeof(desc), "format \"%s\"", format_names[src->format]);
	}
	if ((rc = tr_fields_parse_fields(c, v, source_fields, src, source_variant(src), desc)))
		return rc;
	if (src->format == TR_DATA_SYNTHETIC && !src->features)
		return tr_fields_fail(c, "features", "is required (or shape)");
	return check_source_paths(c, v, src);
}

static int emit_source(const struct tr_source_spec *src, json_t *obj, const char *key)
{
	if (!src->present)
		return 0;
	return json_object_set_new(obj, key, tr_fields_emit_object(source_fields, src, source_variant(src)));
}

static int parse_train(struct tr_fields_ctx *c, const json_t *v, void *base)
{
	return v ? parse_source(c, v, &((struct tr_spec *)base)->train) : 0;
}

static int parse_validation(struct tr_fields_ctx *c, const json_t *v, void *base)
{
	return v ? parse_source(c, v, &((struct tr_spec *)base)->validation) : 0;
}

/* data.test: evaluated once when training has completed (test_loss,
 * test_accuracy, ... in the job's metrics and summary). */
static int parse_test(struct tr_fields_ctx *c, const json_t *v, void *base)
{
	return v ? parse_source(c, v, &((struct tr_spec *)base)->test) : 0;
}

static int emit_test(const void *base, json_t *obj, const char *key)
{
	return emit_source(&((const struct tr_spec *)base)->test, obj, key);
}

static int emit_train(const void *base, json_t *obj, const char *key)
{
	return emit_source(&((const struct tr_spec *)base)->train, obj, key);
}

static int emit_validation(const void *base, json_t *obj, const char *key)
{
	return emit_source(&((const struct tr_spec *)base)->validation, obj, key);
}

/* "devices": a count, a list of distinct ids, or "all". */
static int parse_devices(struct tr_fields_ctx *c, const json_t *v, void *base)
{
	struct tr_spec *spec = base;
	int rc;

	spec->n_device_ids = 0;
	if (!v) {
		spec->device_count = 1;
		return 0;
	}
	if (json_is_integer(v)) {
		json_int_t x = json_integer_value(v);

		if (x < 1 || x > TR_SPEC_MAX_DEVICES)
			return tr_fields_fail(c, NULL, "must be in [1, %d]", TR_SPEC_MAX_DEVICES);
		spec->device_count = (int)x;
		return 0;
	}
	if (json_is_string(v) && strcmp(json_string_value(v), "all") == 0 && json_string_length(v) == strlen("all")) {
		spec->device_count = 0;
		return 0;
	}
	if (!json_is_array(v))
		return tr_fields_fail(c, NULL, "must be a device count, an array of device ids or \"all\"");
	rc = parse_distinct_ints(c, v, spec->device_ids, TR_SPEC_MAX_DEVICES, 0, TR_SPEC_MAX_DEVICES - 1,
				 &(struct int_list_words){"device ids", "device id", true});
	if (rc < 0)
		return rc;
	spec->n_device_ids = rc;
	spec->device_count = rc;
	return 0;
}

static int emit_devices(const void *base, json_t *obj, const char *key)
{
	const struct tr_spec *spec = base;
	json_t *a;

	if (spec->n_device_ids == 0) {
		if (spec->device_count == 0)
			return json_object_set_new(obj, key, json_string("all"));
		return json_object_set_new(obj, key, json_integer(spec->device_count));
	}
	if (!(a = json_array()))
		return -1;
	for (int i = 0; i < spec->n_device_ids; i++) {
		if (json_array_append_new(a, json_integer(spec->device_ids[i]))) {
			json_decref(a);
			return -1;
		}
	}
	return json_object_set_new(obj, key, a);
}

static int parse_betas(struct tr_fields_ctx *c, const json_t *v, void *base)
{
	struct tr_spec *spec = base;
	float b[2];
	int rc;

	if (!v) {
		spec->optimizer.beta1 = 0.9f;
		spec->optimizer.beta2 = 0.999f;
		return 0;
	}
	if (!json_is_array(v) || json_array_size(v) != 2)
		return tr_fields_fail(c, NULL, "must be an array of two numbers");
	for (size_t i = 0; i < 2; i++) {
		size_t saved = tr_fields_enter_index(c, i);

		rc = tr_fields_check_float(c, json_array_get(v, i), &b[i]);
		if (rc == 0 && !(b[i] >= 0.0f && b[i] < 1.0f))
			rc = tr_fields_fail(c, NULL, "must be in [0, 1)");
		tr_fields_leave(c, saved);
		if (rc)
			return rc;
	}
	spec->optimizer.beta1 = b[0];
	spec->optimizer.beta2 = b[1];
	return 0;
}

static int emit_betas(const void *base, json_t *obj, const char *key)
{
	const struct tr_spec *spec = base;

	return json_object_set_new(obj, key,
				   json_pack("[ff]", tr_fields_short_double(spec->optimizer.beta1),
					     tr_fields_short_double(spec->optimizer.beta2)));
}

/* "layers": each layer's keys come from its registry entry
 * (engine/model/layer_spec.c). */
static int parse_layers(struct tr_fields_ctx *c, const json_t *v, void *base)
{
	struct tr_spec *spec = base;

	return tr_layer_specs_parse(c, v, spec->layers, TR_SPEC_MAX_LAYERS, &spec->n_layers);
}

static int emit_layers(const void *base, json_t *obj, const char *key)
{
	const struct tr_spec *spec = base;
	json_t *arr = tr_layer_specs_emit(spec->layers, spec->n_layers);

	return arr ? json_object_set_new(obj, key, arr) : -1;
}

/* A [C, H, W] triple of positive sides, their product a width. */
static int parse_chw(struct tr_fields_ctx *c, const json_t *v, int *out)
{
	int64_t n = 1;

	if (json_array_size(v) != 3)
		return tr_fields_fail(c, NULL, "must be a number or [C, H, W]");
	for (size_t i = 0; i < 3; i++) {
		const json_t *e = json_array_get(v, i);
		size_t saved = tr_fields_enter_index(c, i);

		if (!json_is_integer(e) || json_integer_value(e) < 1 || json_integer_value(e) > TR_SPEC_MAX_SIDE)
			return tr_fields_fail(c, NULL, "must be an integer from 1 to %d", TR_SPEC_MAX_SIDE);
		out[i] = (int)json_integer_value(e);
		n *= out[i];
		tr_fields_leave(c, saved);
	}
	if (n > TR_SPEC_MAX_WIDTH)
		return tr_fields_fail(c, NULL, "C x H x W = %lld is more than the %d values a sample may have",
				      (long long)n, TR_SPEC_MAX_WIDTH);
	return 0;
}

/* "inputs": a width, or an image shape [C, H, W]. */
static int parse_inputs(struct tr_fields_ctx *c, const json_t *v, void *base)
{
	struct tr_spec *spec = base;

	if (!v)
		return 0;
	if (json_is_array(v)) {
		int rc = parse_chw(c, v, spec->input_shape);

		if (rc)
			return rc;
		spec->input_ndim = 3;
		spec->inputs = spec->input_shape[0] * spec->input_shape[1] * spec->input_shape[2];
		return 0;
	}
	if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > TR_SPEC_MAX_WIDTH)
		return tr_fields_fail(c, NULL, "must be an integer from 1 to %d, or [C, H, W]", TR_SPEC_MAX_WIDTH);
	spec->inputs = (int)json_integer_value(v);
	return 0;
}

static int emit_inputs(const void *base, json_t *obj, const char *key)
{
	const struct tr_spec *spec = base;

	if (spec->input_ndim == 3)
		return json_object_set_new(obj, key,
					   json_pack("[iii]", spec->input_shape[0], spec->input_shape[1],
						     spec->input_shape[2]));
	return spec->inputs ? json_object_set_new(obj, key, json_integer(spec->inputs)) : 0;
}

static int post_data(struct tr_fields_ctx *c, const json_t *v, void *base)
{
	const struct tr_spec *spec = base;

	(void)v;
	if (spec->validation.present && spec->validation_split > 0)
		return tr_fields_fail(c, "validation_split", "cannot be used together with validation");
	return 0;
}

static int post_optimizer(struct tr_fields_ctx *c, const json_t *v, void *base)
{
	struct tr_spec *spec = base;

	/* torch.optim.AdamW defaults weight_decay to 0.01, the others to 0. */
	if (spec->optimizer.type == TR_OPT_ADAMW && !json_object_get(v, "weight_decay"))
		spec->optimizer.weight_decay = 0.01f;
	/* As torch.optim.SGD: Nesterov needs momentum and no dampening. */
	if (spec->optimizer.nesterov && (spec->optimizer.momentum <= 0 || spec->optimizer.dampening != 0))
		return tr_fields_fail(c, "nesterov", "requires momentum > 0 and dampening = 0");
	return 0;
}

static int post_monitors(struct tr_fields_ctx *c, const json_t *v, void *base)
{
	const struct tr_spec *spec = base;

	(void)v;
	for (int i = 0; i < spec->n_monitors; i++) {
		if (spec->monitors[i].per_layer && strcmp(spec->monitors[i].name, "grad_norm") != 0 &&
		    strcmp(spec->monitors[i].name, "weight_norm") != 0) {
			size_t saved = tr_fields_enter_index(c, (size_t)i);
			int rc = tr_fields_fail(c, "per_layer", "applies to grad_norm and weight_norm only");

			tr_fields_leave(c, saved);
			return rc;
		}
	}
	for (int i = 1; i < spec->n_monitors; i++) {
		for (int j = 0; j < i; j++) {
			if (strcmp(spec->monitors[i].name, spec->monitors[j].name) == 0) {
				size_t saved = tr_fields_enter_index(c, (size_t)i);
				int rc =
					tr_fields_fail(c, "metric", "duplicate monitor for %s", spec->monitors[i].name);

				tr_fields_leave(c, saved);
				return rc;
			}
		}
	}
	return 0;
}

/* ---- tables ---- */

#define TF(m) offsetof(struct tr_transform_spec, m)
#define MON(m) offsetof(struct tr_monitor_spec, m)
#define SPEC(m) offsetof(struct tr_spec, m)

static const struct tr_field model_fields[] = {
	{.key = "inputs", .kind = K_CUSTOM, .parse = parse_inputs, .emit = emit_inputs},
	{.key = "layers", .kind = K_CUSTOM, .flags = F_REQ, .parse = parse_layers, .emit = emit_layers},
	{.key = "loss", .kind = K_ENUM, .off = SPEC(loss), .names = loss_names},
	{0},
};

/* normalize's "mean" and "std": one number per channel. */
static int parse_channels(struct tr_fields_ctx *c, const json_t *v, float *out, int *n, bool positive)
{
	size_t len;

	if (!json_is_array(v) || (len = json_array_size(v)) < 1 || len > TR_SPEC_MAX_CHANNELS)
		return tr_fields_fail(c, NULL, "must be an array of 1 to %d numbers, one per channel",
				      TR_SPEC_MAX_CHANNELS);
	if (*n && (size_t)*n != len)
		return tr_fields_fail(c, NULL, "must have as many values as mean (%d)", *n);
	for (size_t i = 0; i < len; i++) {
		size_t saved = tr_fields_enter_index(c, i);
		int rc = tr_fields_check_float(c, json_array_get(v, i), &out[i]);

		if (rc == 0 && positive && !(out[i] > 0.0f))
			rc = tr_fields_fail(c, NULL, "must be > 0");
		tr_fields_leave(c, saved);
		if (rc)
			return rc;
	}
	*n = (int)len;
	return 0;
}

static int parse_tf_mean(struct tr_fields_ctx *c, const json_t *v, void *base)
{
	struct tr_transform_spec *t = base;

	if (t->type != TR_TF_NORMALIZE)
		return 0;
	if (!v)
		return tr_fields_fail(c, NULL, "is required");
	t->n_channels = 0;
	return parse_channels(c, v, t->mean_c, &t->n_channels, false);
}

/* "std": a number for gaussian_noise, one per channel for normalize. */
static int parse_tf_std(struct tr_fields_ctx *c, const json_t *v, void *base)
{
	struct tr_transform_spec *t = base;

	if (t->type != TR_TF_NORMALIZE && t->type != TR_TF_GAUSSIAN_NOISE)
		return 0;
	if (!v)
		return tr_fields_fail(c, NULL, "is required");
	if (t->type == TR_TF_NORMALIZE)
		return parse_channels(c, v, t->std_c, &t->n_channels, true);
	if (tr_fields_check_float(c, v, &t->std))
		return -EINVAL;
	if (!(t->std >= 0.0f))
		return tr_fields_fail(c, NULL, "must be >= 0");
	return 0;
}

static json_t *channels_json(const float *v, int n)
{
	json_t *a = json_array();

	for (int i = 0; a && i < n; i++)
		if (json_array_append_new(a, json_real(tr_fields_short_double(v[i])))) {
			json_decref(a);
			return NULL;
		}
	return a;
}

static int emit_tf_mean(const void *base, json_t *obj, const char *key)
{
	const struct tr_transform_spec *t = base;

	return json_object_set_new(obj, key, channels_json(t->mean_c, t->n_channels));
}

static int emit_tf_std(const void *base, json_t *obj, const char *key)
{
	const struct tr_transform_spec *t = base;

	if (t->type == TR_TF_NORMALIZE)
		return json_object_set_new(obj, key, channels_json(t->std_c, t->n_channels));
	return json_object_set_new(obj, key, json_real(tr_fields_short_double(t->std)));
}

/* clang-format off */
static const struct tr_field transform_fields[] = {
	{.key = "type", .kind = K_ENUM, .off = TF(type), .flags = F_REQ | F_VARIANT, .names = transform_names},
	{.key = "factor", .kind = K_FLOAT, .off = TF(factor), .only = 1u << TR_TF_SCALE, .flags = F_REQ},
	{.key = "mean", .kind = K_CUSTOM, .only = 1u << TR_TF_NORMALIZE, .parse = parse_tf_mean, .emit = emit_tf_mean},
	{.key = "std", .kind = K_CUSTOM, .only = (1u << TR_TF_GAUSSIAN_NOISE) | (1u << TR_TF_NORMALIZE),
	 .parse = parse_tf_std, .emit = emit_tf_std},
	{.key = "padding", .kind = K_INT, .off = TF(padding), .only = 1u << TR_TF_RANDOM_CROP,
	 .flags = F_REQ | POSITIVE | F_HI, .hi = 1024},
	{.key = "vertical", .kind = K_BOOL, .off = TF(vertical), .only = 1u << TR_TF_FLIP},
	{0},
};
/* clang-format on */

/* clang-format off */
static const struct tr_field data_fields[] = {
	{.key = "train", .kind = K_CUSTOM, .flags = F_REQ, .parse = parse_train, .emit = emit_train},
	{.key = "validation", .kind = K_CUSTOM, .parse = parse_validation, .emit = emit_validation},
	{.key = "test", .kind = K_CUSTOM, .parse = parse_test, .emit = emit_test},
	{.key = "validation_split", .kind = K_FLOAT, .off = SPEC(validation_split),
	 .flags = F_LO | F_LO_OPEN | F_HI | F_HI_OPEN | F_OMIT0, .lo = 0, .hi = 1},
	{.key = "shuffle", .kind = K_BOOL, .off = SPEC(shuffle), .def = 1},
	{.key = "last_batch", .kind = K_ENUM, .off = SPEC(last_batch), .names = last_batch_names},
	{.key = "transforms", .kind = K_ARRAY, .off = SPEC(transforms), .sub = transform_fields,
	 .size = sizeof(struct tr_transform_spec), .count_off = SPEC(n_transforms), .max = TR_SPEC_MAX_TRANSFORMS},
	{0},
};
/* clang-format on */

#define OPT_SGD (1u << TR_OPT_SGD)
#define OPT_ADAMS ((1u << TR_OPT_ADAM) | (1u << TR_OPT_ADAMW))

/* clang-format off */
static const struct tr_field optimizer_fields[] = {
	{.key = "type", .kind = K_ENUM, .off = SPEC(optimizer.type), .flags = F_REQ | F_VARIANT, .names = optim_names},
	{.key = "lr", .kind = K_FLOAT, .off = SPEC(optimizer.lr), .flags = F_REQ | POSITIVE},
	{.key = "momentum", .kind = K_FLOAT, .off = SPEC(optimizer.momentum), .only = OPT_SGD, .flags = UNIT_OPEN,
	 .hi = 1},
	{.key = "dampening", .kind = K_FLOAT, .off = SPEC(optimizer.dampening), .only = OPT_SGD, .flags = UNIT_OPEN,
	 .hi = 1},
	{.key = "nesterov", .kind = K_BOOL, .off = SPEC(optimizer.nesterov), .only = OPT_SGD},
	{.key = "weight_decay", .kind = K_FLOAT, .off = SPEC(optimizer.weight_decay), .flags = NONNEG},
	{.key = "betas", .kind = K_CUSTOM, .only = OPT_ADAMS, .parse = parse_betas, .emit = emit_betas},
	{.key = "eps", .kind = K_FLOAT, .off = SPEC(optimizer.eps), .only = OPT_ADAMS, .flags = POSITIVE, .def = 1e-8},
	{0},
};
/* clang-format on */

#define SCH_STEP (1u << TR_SCHED_STEP)
#define SCH_DECAY ((1u << TR_SCHED_COSINE) | (1u << TR_SCHED_LINEAR))

/* clang-format off */
static const struct tr_field schedule_fields[] = {
	{.key = "type", .kind = K_ENUM, .off = SPEC(schedule.type), .flags = F_VARIANT, .names = sched_names},
	{.key = "warmup_steps", .kind = K_I64, .off = SPEC(schedule.warmup_steps), .flags = NONNEG | F_HI,
	 .hi = (double)TR_SPEC_MAX_STEPS},
	{.key = "step_size", .kind = K_I64, .off = SPEC(schedule.step_size), .only = SCH_STEP,
	 .flags = F_REQ | POSITIVE | F_HI, .hi = (double)TR_SPEC_MAX_STEPS},
	{.key = "gamma", .kind = K_FLOAT, .off = SPEC(schedule.gamma), .only = SCH_STEP,
	 .flags = F_LO | F_LO_OPEN | F_HI, .lo = 0, .hi = 1, .def = 0.1},
	{.key = "min_lr", .kind = K_FLOAT, .off = SPEC(schedule.min_lr), .only = SCH_DECAY, .flags = NONNEG},
	{0},
};
/* clang-format on */

/* clang-format off */
static const struct tr_field prefetch_fields[] = {
	{.key = "workers", .kind = K_INT, .off = SPEC(prefetch_workers), .flags = F_LO | F_HI, .lo = 1, .hi = 64,
	 .def = 2},
	{.key = "depth", .kind = K_INT, .off = SPEC(prefetch_depth), .flags = F_LO | F_HI, .lo = 1, .hi = 256,
	 .def = 4},
	{0},
};
/* clang-format on */

/* clang-format off */
static const struct tr_field checkpoint_fields[] = {
	{.key = "every_steps", .kind = K_INT, .off = SPEC(checkpoint_every_steps), .flags = NONNEG},
	{.key = "every_seconds", .kind = K_INT, .off = SPEC(checkpoint_every_seconds), .flags = NONNEG},
	{.key = "keep", .kind = K_INT, .off = SPEC(checkpoint_keep), .flags = F_LO | F_HI, .lo = 1,
	 .hi = TR_SPEC_MAX_CHECKPOINT_KEEP, .def = 3},
	{0},
};
/* clang-format on */

/* clang-format off */
static const struct tr_field monitor_fields[] = {
	{.key = "metric", .kind = K_NAME, .off = MON(name), .flags = F_REQ, .names = metric_names,
	 .size = sizeof(((struct tr_monitor_spec *)0)->name)},
	{.key = "every_steps", .kind = K_INT, .off = MON(every_steps), .flags = POSITIVE, .def = 10},
	{.key = "per_layer", .kind = K_BOOL, .off = MON(per_layer)},
	{0},
};
/* clang-format on */

#define ES(m) offsetof(struct tr_spec, early_stopping.m)
/* clang-format off */
static const struct tr_field early_stop_fields[] = {
	{.key = "metric", .kind = K_NAME, .off = ES(metric), .flags = F_REQ, .names = es_metric_names,
	 .size = sizeof(((struct tr_early_stop_spec *)0)->metric)},
	{.key = "mode", .kind = K_BOOLENUM, .off = ES(mode_max), .names = es_mode_names},
	{.key = "patience", .kind = K_INT, .off = ES(patience), .flags = F_LO | F_HI, .lo = 1,
	 .hi = TR_SPEC_MAX_PATIENCE, .def = 5},
	{.key = "min_delta", .kind = K_FLOAT, .off = ES(min_delta), .flags = NONNEG},
	{0},
};
/* clang-format on */

/* early_stopping: absent means off (and nothing in the normalized form).
 * The metric must be one the job computes at its evaluations: val_* need
 * validation data, val_accuracy class labels.  The mode defaults to the
 * metric's good direction. */
static int parse_early_stopping(struct tr_fields_ctx *c, const json_t *v, void *base)
{
	struct tr_spec *spec = base;
	struct tr_early_stop_spec *es = &spec->early_stopping;
	int rc;

	if (!v) {
		memset(es, 0, sizeof(*es));
		return 0;
	}
	if (!json_is_object(v))
		return tr_fields_fail(c, NULL, "must be an object");
	if ((rc = tr_fields_parse_object(c, v, early_stop_fields, base)))
		return rc;
	es->enabled = true;
	if (!json_object_get(v, "mode"))
		es->mode_max = strcmp(es->metric, "val_accuracy") == 0;
	if (tr_fields_had_problems(c))
		return 0; /* what follows reads data and loss, which may be the bad ones */
	if (strncmp(es->metric, "val_", 4) == 0 && !spec->validation.present && spec->validation_split <= 0)
		return tr_fields_fail(c, "metric",
				      "%s needs validation data (data.validation or data.validation_split)",
				      es->metric);
	if (strcmp(es->metric, "val_accuracy") == 0 && spec->loss != TR_LOSS_SOFTMAX_CE)
		return tr_fields_fail(c, "metric", "val_accuracy needs the softmax_cross_entropy loss");
	return 0;
}

static int emit_early_stopping(const void *base, json_t *obj, const char *key)
{
	const struct tr_spec *spec = base;
	json_t *o;

	if (!spec->early_stopping.enabled)
		return 0;
	if (!(o = tr_fields_emit_object(early_stop_fields, base, -1)))
		return -1;
	return json_object_set_new(obj, key, o);
}

/* init.from: a safetensors path, or {"job": ID, "step": S | "latest"} to
 * fine-tune from an earlier job's checkpoint. */
static int parse_init_from(struct tr_fields_ctx *c, const json_t *v, void *base)
{
	struct tr_spec *spec = base;

	spec->init_job = 0;
	spec->init_step = -1;
	if (!v)
		return 0; /* F_REQ reports a missing "from" inside a present "init" */
	if (json_is_string(v)) {
		if (json_string_length(v) == 0)
			return tr_fields_fail(c, NULL, "must not be empty");
		if (strlen(json_string_value(v)) != json_string_length(v))
			return tr_fields_fail(c, NULL, "must not contain NUL characters");
		if (json_string_length(v) > TR_SPEC_MAX_PATH)
			return tr_fields_fail(c, NULL, "must be at most %d bytes (it has %zu)", TR_SPEC_MAX_PATH,
					      json_string_length(v));
		spec->init_from = strdup(json_string_value(v));
		return spec->init_from ? 0 : tr_fields_fail_oom(c);
	}
	if (!json_is_object(v))
		return tr_fields_fail(c, NULL, "must be a file path or {\"job\": ID, \"step\": STEP or \"latest\"}");
	const char *key;
	const json_t *e;
	json_object_foreach((json_t *)v, key, e) {
		if (strcmp(key, "job") != 0 && strcmp(key, "step") != 0)
			return tr_fields_fail(c, key, "unknown key '%s'", key);
	}
	const json_t *job = json_object_get(v, "job"), *step = json_object_get(v, "step");
	if (!job)
		return tr_fields_fail(c, "job", "is required");
	if (!json_is_integer(job) || json_integer_value(job) < 1)
		return tr_fields_fail(c, "job", "must be a job id (an integer >= 1)");
	spec->init_job = json_integer_value(job);
	if (step && json_is_string(step) && strcmp(json_string_value(step), "latest") == 0)
		spec->init_step = -1;
	else if (step && (!json_is_integer(step) || json_integer_value(step) < 0))
		return tr_fields_fail(c, "step", "must be a step (an integer >= 0) or \"latest\"");
	else if (step)
		spec->init_step = json_integer_value(step);
	return 0;
}

static int emit_init_from(const void *base, json_t *obj, const char *key)
{
	const struct tr_spec *spec = base;

	if (spec->init_from)
		return json_object_set_new(obj, key, json_string(spec->init_from));
	if (spec->init_job > 0) {
		json_t *o = json_pack("{s:I}", "job", (json_int_t)spec->init_job);
		if (!o)
			return -1;
		json_object_set_new(o, "step",
				    spec->init_step < 0 ? json_string("latest") : json_integer(spec->init_step));
		return json_object_set_new(obj, key, o);
	}
	return 0;
}

/* "exact": false (the default), true (the default shard count) or
 * {"shards": S, "overlap": B}.  Off by default: it cost more than 10% of the step time
 * of the bench MLP (docs/design.md, "Exact mode"). */
static int parse_exact(struct tr_fields_ctx *c, const json_t *v, void *base)
{
	struct tr_spec *spec = base;

	spec->exact_shards = 0;
	spec->exact_no_overlap = false;
	if (!v || json_is_false(v))
		return 0;
	spec->exact_shards = TR_SPEC_DEFAULT_SHARDS;
	if (json_is_true(v))
		return 0;
	if (!json_is_object(v))
		return tr_fields_fail(c, NULL, "must be false, true or {\"shards\": S, \"overlap\": true|false}");
	const char *key;
	const json_t *e;
	json_object_foreach((json_t *)v, key, e) {
		if (strcmp(key, "shards") != 0 && strcmp(key, "overlap") != 0)
			return tr_fields_fail(c, key, "unknown key '%s'", key);
	}
	const json_t *ov = json_object_get(v, "overlap");
	if (ov && !json_is_boolean(ov))
		return tr_fields_fail(c, "overlap", "must be true or false");
	spec->exact_no_overlap = ov && json_is_false(ov);
	const json_t *n = json_object_get(v, "shards");
	if (!n)
		return 0;
	if (!json_is_integer(n) || json_integer_value(n) < 1 || json_integer_value(n) > TR_SPEC_MAX_SHARDS)
		return tr_fields_fail(c, "shards", "must be an integer from 1 to %d", TR_SPEC_MAX_SHARDS);
	spec->exact_shards = (int)json_integer_value(n);
	return 0;
}

static int emit_exact(const void *base, json_t *obj, const char *key)
{
	const struct tr_spec *spec = base;

	if (!spec->exact_shards)
		return json_object_set_new(obj, key, json_false());
	if (spec->exact_no_overlap)
		return json_object_set_new(obj, key,
					   json_pack("{s:i,s:b}", "shards", spec->exact_shards, "overlap", 0));
	return json_object_set_new(obj, key, json_pack("{s:i}", "shards", spec->exact_shards));
}

static int parse_max_restarts(struct tr_fields_ctx *c, const json_t *v, void *base)
{
	struct tr_spec *spec = base;

	spec->max_restarts_given = v != NULL;
	spec->max_restarts = TR_SPEC_DEFAULT_MAX_RESTARTS;
	if (!v)
		return 0;
	if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > TR_SPEC_MAX_RESTARTS)
		return tr_fields_fail(c, NULL, "must be an integer from 0 to %d", TR_SPEC_MAX_RESTARTS);
	spec->max_restarts = (int)json_integer_value(v);
	return 0;
}

/* Left out of the normalized form when not given, like the other
 * multi-process fields. */
static int emit_max_restarts(const void *base, json_t *obj, const char *key)
{
	const struct tr_spec *spec = base;

	if (!spec->max_restarts_given)
		return 0;
	return json_object_set_new(obj, key, json_integer(spec->max_restarts));
}

static const struct tr_field init_fields[] = {
	{.key = "from", .kind = K_CUSTOM, .flags = F_REQ, .parse = parse_init_from, .emit = emit_init_from},
	{0},
};

/* "seed" comes before "data": sources default their seed to it. */
/* clang-format off */
static const struct tr_field root_fields[] = {
	{.key = "name", .kind = K_STR, .off = SPEC(name), .flags = F_NOCTRL, .defstr = "job", .max = TR_SPEC_MAX_NAME},
	{.key = "seed", .kind = K_U64, .off = SPEC(seed), .flags = NONNEG},
	{.key = "model", .kind = K_OBJECT, .flags = F_REQ, .sub = model_fields},
	{.key = "data", .kind = K_OBJECT, .flags = F_REQ, .sub = data_fields, .post = post_data},
	{.key = "batch_size", .kind = K_INT, .off = SPEC(batch_size), .flags = F_REQ | POSITIVE | F_HI,
	 .hi = TR_SPEC_MAX_BATCH},
	{.key = "epochs", .kind = K_INT, .off = SPEC(epochs), .flags = POSITIVE | F_HI | F_OMIT0,
	 .hi = TR_SPEC_MAX_EPOCHS},
	{.key = "max_steps", .kind = K_I64, .off = SPEC(max_steps), .flags = POSITIVE | F_HI | F_OMIT0,
	 .hi = (double)TR_SPEC_MAX_STEPS},
	{.key = "optimizer", .kind = K_OBJECT, .flags = F_REQ, .sub = optimizer_fields, .post = post_optimizer},
	{.key = "schedule", .kind = K_OBJECT, .sub = schedule_fields},
	{.key = "clip_grad_norm", .kind = K_FLOAT, .off = SPEC(clip_grad_norm), .flags = NONNEG},
	{.key = "stop_on_nan", .kind = K_BOOL, .off = SPEC(stop_on_nan), .def = 1},
	{.key = "exact", .kind = K_CUSTOM, .parse = parse_exact, .emit = emit_exact},
	{.key = "devices", .kind = K_CUSTOM, .parse = parse_devices, .emit = emit_devices},
	{.key = "processes", .kind = K_INT, .off = SPEC(processes), .flags = F_LO | F_HI | F_OMIT0, .lo = 1,
	 .hi = TR_MAX_PROCESSES},
	{.key = "collective_timeout_s", .kind = K_INT, .off = SPEC(collective_timeout_s),
	 .flags = F_LO | F_HI | F_OMIT0, .lo = 1, .hi = 86400},
	{.key = "max_restarts", .kind = K_CUSTOM, .parse = parse_max_restarts, .emit = emit_max_restarts},
	{.key = "backend", .kind = K_ENUM, .off = SPEC(backend), .names = backend_names},
	{.key = "precision", .kind = K_BOOLENUM, .off = SPEC(tf32), .names = precision_names},
	{.key = "cpu_conv", .kind = K_ENUM, .off = SPEC(cpu_conv), .flags = F_OMIT0, .names = cpu_conv_names},
	{.key = "cpu_dense", .kind = K_ENUM, .off = SPEC(cpu_dense), .flags = F_OMIT0, .names = cpu_dense_names},
	{.key = "prefetch", .kind = K_OBJECT, .sub = prefetch_fields},
	{.key = "log_every_steps", .kind = K_INT, .off = SPEC(log_every_steps), .flags = POSITIVE, .def = 1},
	{.key = "eval_every_epochs", .kind = K_INT, .off = SPEC(eval_every_epochs), .flags = POSITIVE, .def = 1},
	{.key = "eval_every_steps", .kind = K_INT, .off = SPEC(eval_every_steps), .flags = POSITIVE | F_OMIT0},
	{.key = "checkpoint", .kind = K_OBJECT, .sub = checkpoint_fields},
	{.key = "monitors", .kind = K_ARRAY, .off = SPEC(monitors), .sub = monitor_fields,
	 .size = sizeof(struct tr_monitor_spec), .count_off = SPEC(n_monitors), .max = TR_SPEC_MAX_MONITORS,
	 .post = post_monitors},
	{.key = "early_stopping", .kind = K_CUSTOM, .parse = parse_early_stopping, .emit = emit_early_stopping},
	{.key = "init", .kind = K_OBJECT, .sub = init_fields},
	{.key = "resources", .kind = K_CUSTOM, .parse = tr_spec_parse_resources, .emit = tr_spec_emit_resources},
	{0},
};
/* clang-format on */

/* ---- checks across sections ---- */

/* The layer nearest the output whose spec sets a width ("units",
 * "filters"): what a spec whose output does not fit its data should
 * change.  -1 when none. */
static int last_width_layer(const struct tr_spec *spec)
{
	for (int i = spec->n_layers - 1; i >= 0; i--) {
		const tr_layer_i *ops = tr_layer_ops_for(spec->layers[i].type);

		if (ops && ops->width_key)
			return i;
	}
	return -1;
}

/* Synthetic sources know their shapes at parse time, so a model that
 * cannot fit them is reported here, with a pointer, rather than as a shape
 * error once the job runs.  The cross checks tr_fields_enter() the pointer of what
 * they blame without leaving it: the first error ends parsing. */
static int check_synthetic(struct tr_fields_ctx *c, const struct tr_spec *spec)
{
	const struct tr_source_spec *tr = &spec->train, *va = &spec->validation;

	if (tr->format != TR_DATA_SYNTHETIC)
		return 0;
	/* The regression generator holds an outputs x features weight matrix. */
	if (tr->task == TR_SYNTH_REGRESSION &&
	    (int64_t)tr->outputs * tr->features > (int64_t)TR_SPEC_MAX_SYNTH_WEIGHTS) {
		tr_fields_enter(c, "data");
		tr_fields_enter(c, "train");
		return tr_fields_fail(c, "outputs", "outputs x features (%d x %d) must be at most %d", tr->outputs,
				      tr->features, TR_SPEC_MAX_SYNTH_WEIGHTS);
	}
	if (spec->inputs && spec->inputs != tr->features) {
		tr_fields_enter(c, "model");
		return tr_fields_fail(c, "inputs", "must equal the train source's features (%d)", tr->features);
	}
	if (spec->input_ndim == 3 && tr->shape_ndim == 3 && memcmp(spec->input_shape, tr->shape, sizeof tr->shape)) {
		tr_fields_enter(c, "model");
		return tr_fields_fail(c, "inputs", "must equal the train source's shape [%d, %d, %d]", tr->shape[0],
				      tr->shape[1], tr->shape[2]);
	}
	if (spec->loss == TR_LOSS_SOFTMAX_CE && tr->task == TR_SYNTH_REGRESSION) {
		tr_fields_enter(c, "model");
		return tr_fields_fail(
			c, "loss",
			"softmax_cross_entropy needs class labels but the train source is a regression task");
	}
	const struct {
		const struct tr_source_spec *src;
		const char *name;
	} others[] = {{va, "validation"}, {&spec->test, "test"}};
	for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
		const struct tr_source_spec *o = others[i].src;
		const char *key = NULL;

		if (!o->present || o->format != TR_DATA_SYNTHETIC)
			continue;
		if (o->task != tr->task)
			key = "task";
		else if (o->features != tr->features)
			key = "features";
		else if (o->shape_ndim != tr->shape_ndim || memcmp(o->shape, tr->shape, sizeof tr->shape))
			key = "shape";
		else if (o->task == TR_SYNTH_CLASSIFICATION && o->classes != tr->classes)
			key = "classes";
		else if (o->task == TR_SYNTH_REGRESSION && o->outputs != tr->outputs)
			key = "outputs";
		if (key) {
			tr_fields_enter(c, "data");
			tr_fields_enter(c, others[i].name);
			return tr_fields_fail(c, key, "must match the train source");
		}
	}
	return 0;
}

/* Where the input width is known (given, or a synthetic source's), the
 * model is laid out now, so that every layer's output shape, the
 * parameter bound and a synthetic source's classes or outputs are checked
 * at submit with a pointer; files only tell their width when the job
 * starts, where tr_model_init applies the same checks. */
static int check_model(struct tr_fields_ctx *c, const struct tr_spec *spec)
{
	const struct tr_source_spec *tr = &spec->train;
	int width = spec->inputs;
	char ptr[256], msg[512];
	int rc = 0;

	if (!width && tr->format == TR_DATA_SYNTHETIC)
		width = tr->features;
	if (!width)
		return 0;
	tr_model_t *m = malloc(sizeof *m);
	if (!m)
		return tr_fields_fail_oom(c);
	if (tr_model_build(m, spec, width, ptr, sizeof ptr, msg, sizeof msg) < 0) {
		rc = tr_fields_fail_at(c, ptr, msg);
		goto done;
	}
	if (tr->format == TR_DATA_SYNTHETIC) {
		int want = 0, last = last_width_layer(spec);

		if (spec->loss == TR_LOSS_SOFTMAX_CE)
			want = tr->classes;
		else if (tr->task == TR_SYNTH_REGRESSION)
			want = tr->outputs;
		if (want && m->outputs != want) {
			char shape[48];

			tr_shape_format(m->layers[m->n_layers - 1].out_shape, shape, sizeof shape);
			tr_fields_enter(c, "model");
			tr_fields_enter(c, "layers");
			if (last >= 0)
				tr_fields_enter_index(c, (size_t)last);
			rc = tr_fields_fail(c, last >= 0 ? tr_layer_ops_for(spec->layers[last].type)->width_key : NULL,
					    "the model's output %s has %d values; the train source's %s need %d", shape,
					    m->outputs, spec->loss == TR_LOSS_SOFTMAX_CE ? "classes" : "outputs", want);
		}
	}
done:
	free(m);
	return rc;
}

/* A Slurm job's tasks are its processes (srun starts one rank each):
 * several need exact mode, and a "processes" count must agree. */
static int check_slurm_tasks(struct tr_fields_ctx *c, const struct tr_spec *spec)
{
	const struct tr_resources *r = &spec->resources;
	int tasks = r->nodes * r->tasks_per_node;
	if (r->allocator != TR_ALLOC_SLURM)
		return 0;
	if (spec->processes > 0 && spec->processes != tasks)
		return tr_fields_fail(c, "processes",
				      "must be nodes x tasks_per_node (%d) with the Slurm allocator, or left out",
				      tasks);
	if (tasks > 1 && !spec->exact_shards) {
		tr_fields_enter(c, "resources");
		return tr_fields_fail(c, r->tasks_per_node > 1 ? "tasks_per_node" : "nodes",
				      "%d tasks (nodes x tasks_per_node) need exact mode (\"exact\": true): only the "
				      "exact sum crosses processes",
				      tasks);
	}
	return 0;
}

static int check_cross(struct tr_fields_ctx *c, const struct tr_spec *spec)
{
	int rc;

	if (spec->epochs == 0 && spec->max_steps == 0)
		return tr_fields_fail(c, "epochs", "one of epochs or max_steps is required");
	if ((spec->schedule.type == TR_SCHED_COSINE || spec->schedule.type == TR_SCHED_LINEAR) &&
	    spec->schedule.min_lr > spec->optimizer.lr) {
		tr_fields_enter(c, "schedule");
		return tr_fields_fail(c, "min_lr", "must be <= the optimizer's lr (%g)", (double)spec->optimizer.lr);
	}
	/* only the exact sum crosses processes (docs/design.md, "Processes") */
	if (spec->processes > 1 && !spec->exact_shards)
		return tr_fields_fail(c, "processes", "more than one process needs exact mode (\"exact\": true)");
	if ((rc = check_slurm_tasks(c, spec)))
		return rc;
	if ((rc = check_synthetic(c, spec)))
		return rc;
	if ((rc = check_model(c, spec)))
		return rc;
	return 0;
}

/* ---- API ---- */

int tr_spec_parse(const json_t *doc, struct tr_spec *spec, struct tr_error *err)
{
	return tr_spec_parse_all(doc, spec, err, NULL);
}

int tr_spec_parse_all(const json_t *doc, struct tr_spec *spec, struct tr_error *err, struct tr_error_list *all)
{
	struct tr_fields_ctx c = {.err = err, .all = all, .user = spec};
	int rc;

	if (all)
		memset(all, 0, sizeof(*all));
	if (err)
		memset(err, 0, sizeof(*err));
	if (!spec) {
		tr_fields_set_error(err, "", "no spec to fill");
		return -EINVAL;
	}
	memset(spec, 0, sizeof(*spec));
	if (!doc)
		return tr_fields_fail(&c, NULL, "no spec");
	if (!json_is_object(doc))
		return tr_fields_fail(&c, NULL, "the spec must be a JSON object");
	rc = tr_fields_parse_object(&c, doc, root_fields, spec);
	if (rc == 0)
		rc = check_cross(&c, spec);
	if (rc) {
		tr_spec_finish(spec);
		memset(spec, 0, sizeof(*spec));
	}
	return rc;
}

int tr_spec_parse_text(const char *text, struct tr_spec *spec, struct tr_error *err)
{
	json_error_t jerr;
	char msg[sizeof(jerr.text) + 64];
	json_t *doc;
	int rc;

	if (spec)
		memset(spec, 0, sizeof(*spec));
	if (err)
		memset(err, 0, sizeof(*err));
	if (!text) {
		tr_fields_set_error(err, "", "no spec text");
		return -EINVAL;
	}
	/* Duplicate keys are refused: the second would silently win. */
	doc = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
	if (!doc) {
		snprintf(msg, sizeof(msg), "line %d, column %d: %s", jerr.line, jerr.column, jerr.text);
		tr_fields_set_error(err, "", msg);
		return -EINVAL;
	}
	rc = tr_spec_parse(doc, spec, err);
	json_decref(doc);
	return rc;
}

static void finish_source(struct tr_source_spec *src)
{
	free(src->path);
	free(src->x_path);
	free(src->y_path);
	free(src->images_path);
	free(src->labels_path);
	free(src->input_path);
	free(src->response_path);
	src->path = src->x_path = src->y_path = src->images_path = src->labels_path = NULL;
	src->input_path = src->response_path = NULL;
}

void tr_spec_finish(struct tr_spec *spec)
{
	if (!spec)
		return;
	free(spec->name);
	spec->name = NULL;
	free(spec->init_from);
	spec->init_from = NULL;
	tr_layer_specs_free(spec->layers, spec->n_layers);
	finish_source(&spec->train);
	finish_source(&spec->validation);
	finish_source(&spec->test);
}

json_t *tr_spec_to_json(const struct tr_spec *spec)
{
	if (!spec)
		return NULL;
	return tr_fields_emit_object(root_fields, spec, -1);
}

int tr_spec_output_dim(const struct tr_spec *spec)
{
	int width, out = 0;
	char ptr[8], msg[8];
	tr_model_t *m;

	if (!spec)
		return 0;
	/* Width unknown (a data file's): a model of flat layers whose output
	 * does not depend on it (a dense head) is laid out on a width of 1;
	 * one that needs an image shape has no answer here. */
	width = spec->inputs ? spec->inputs : spec->train.format == TR_DATA_SYNTHETIC ? spec->train.features : 1;
	m = malloc(sizeof *m);
	if (m && tr_model_build(m, spec, width, ptr, sizeof ptr, msg, sizeof msg) == 0)
		out = m->outputs;
	free(m);
	return out;
}
