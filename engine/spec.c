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
#include "engine/spec_fields.h"

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

static const char *const layer_names[] = {"dense", "relu", "gelu", "tanh", "sigmoid", "dropout", "layernorm",
					  NULL};
static const char *const approx_names[] = {"none", "tanh", NULL};
static const char *const loss_names[] = {"softmax_cross_entropy", "mse", NULL};
static const char *const format_names[] = {"csv", "npy", "idx", "synthetic", NULL};
static const char *const task_names[] = {"classification", "regression", NULL};
static const char *const transform_names[] = {"scale", "standardize", "gaussian_noise", NULL};
static const char *const last_batch_names[] = {"partial", "drop", "pad", "rollover", NULL};
static const char *const optim_names[] = {"sgd", "adam", "adamw", NULL};
static const char *const sched_names[] = {"constant", "step", "cosine", "linear", NULL};
static const char *const backend_names[] = {"auto", "cpu", "cuda", NULL};
static const char *const precision_names[] = {"fp32", "tf32", NULL};
static const char *const es_metric_names[] = {"loss", "val_loss", "val_accuracy", NULL};
static const char *const es_mode_names[] = {"min", "max", NULL};
static const char *const metric_names[] = {"grad_norm", "weight_norm", "device_step_ms", "update_ratio",
					   "activation_stats", "lr", "samples_per_sec", "data_wait_ms", NULL};

/* How a list of distinct integers names its items in error messages. */
struct int_list_words {
	const char *plural;  /* "must have at most %d <plural>" */
	const char *item;    /* "duplicate <item> %d" */
	bool show_range;     /* out of range: "must be in [lo, hi]" rather than "is out of range" */
};

/* A non-empty array of at most `max` distinct integers in [lo, hi] into
 * `out`; returns the count or -EINVAL with the offending element's pointer. */
static int parse_distinct_ints(struct tr_fields_ctx *c, const json_t *v, int *out, size_t max, json_int_t lo, json_int_t hi,
			       const struct int_list_words *w)
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
			return w->show_range ? tr_fields_fail(c, idx, "must be in [%lld, %lld]", (long long)lo, (long long)hi)
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
};

#define SRC(m) offsetof(struct tr_source_spec, m)

static const struct tr_field source_fields[] = {
	{.key = "format", .kind = K_ENUM, .off = SRC(format), .flags = F_REQ, .names = format_names},
	{.key = "path", .kind = K_STR, .off = SRC(path), .only = V_CSV, .flags = F_REQ},
	{.key = "label", .kind = K_CUSTOM, .only = V_CSV, .parse = parse_label, .emit = emit_label},
	{.key = "header", .kind = K_BOOL, .off = SRC(header), .only = V_CSV},
	{.key = "x", .kind = K_STR, .off = SRC(x_path), .only = V_NPY, .flags = F_REQ},
	{.key = "y", .kind = K_STR, .off = SRC(y_path), .only = V_NPY, .flags = F_REQ},
	{.key = "images", .kind = K_STR, .off = SRC(images_path), .only = V_IDX, .flags = F_REQ},
	{.key = "labels", .kind = K_STR, .off = SRC(labels_path), .only = V_IDX, .flags = F_REQ},
	{.key = "task", .kind = K_ENUM, .off = SRC(task), .only = V_SYN, .names = task_names},
	{.key = "samples", .kind = K_I64, .off = SRC(samples), .only = V_SYN, .flags = F_REQ | POSITIVE | F_HI,
	 .hi = (double)TR_SPEC_MAX_SAMPLES},
	{.key = "features", .kind = K_INT, .off = SRC(features), .only = V_SYN, .flags = F_REQ | POSITIVE | F_HI,
	 .hi = TR_SPEC_MAX_WIDTH},
	{.key = "classes", .kind = K_INT, .off = SRC(classes), .only = V_SYN_CLS, .flags = F_REQ | F_LO | F_HI, .lo = 2,
	 .hi = TR_SPEC_MAX_WIDTH},
	{.key = "outputs", .kind = K_INT, .off = SRC(outputs), .only = V_SYN_REG, .flags = POSITIVE | F_HI,
	 .hi = TR_SPEC_MAX_WIDTH, .def = 1},
	{.key = "noise", .kind = K_FLOAT, .off = SRC(noise), .only = V_SYN, .flags = NONNEG, .def = 0.1},
	{.key = "load_cost_us", .kind = K_I64, .off = SRC(load_cost_us), .only = V_SYN, .flags = NONNEG | F_HI,
	 .hi = TR_SPEC_MAX_LOAD_COST_US},
	{.key = "seed", .kind = K_U64, .off = SRC(data_seed), .only = V_SYN, .flags = NONNEG | F_NODEF},
	{0},
};

static int source_variant(const struct tr_source_spec *src)
{
	if (src->format == TR_DATA_SYNTHETIC)
		return src->task == TR_SYNTH_REGRESSION ? 4 : 3;
	return (int)src->format;
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
	return tr_fields_parse_fields(c, v, source_fields, src, source_variant(src), desc);
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
	if (json_is_string(v) && strcmp(json_string_value(v), "all") == 0 &&
	    json_string_length(v) == strlen("all")) {
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

/* ---- post checks ---- */

static int post_model(struct tr_fields_ctx *c, const json_t *v, void *base)
{
	const struct tr_spec *spec = base;

	(void)v;
	for (int i = 0; i < spec->n_layers; i++)
		if (spec->layers[i].type == TR_LAYER_DENSE)
			return 0;
	return tr_fields_fail(c, "layers", "must contain at least one dense layer");
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
				int rc = tr_fields_fail(c, "metric", "duplicate monitor for %s", spec->monitors[i].name);

				tr_fields_leave(c, saved);
				return rc;
			}
		}
	}
	return 0;
}

/* ---- tables ---- */

#define LAY(m) offsetof(struct tr_layer_spec, m)
#define TF(m) offsetof(struct tr_transform_spec, m)
#define MON(m) offsetof(struct tr_monitor_spec, m)
#define SPEC(m) offsetof(struct tr_spec, m)

static const struct tr_field layer_fields[] = {
	{.key = "type", .kind = K_ENUM, .off = LAY(type), .flags = F_REQ | F_VARIANT, .names = layer_names},
	{.key = "units", .kind = K_INT, .off = LAY(units), .only = 1u << TR_LAYER_DENSE,
	 .flags = F_REQ | POSITIVE | F_HI, .hi = TR_SPEC_MAX_WIDTH},
	{.key = "bias", .kind = K_BOOL, .off = LAY(bias), .only = 1u << TR_LAYER_DENSE, .def = 1},
	{.key = "approximate", .kind = K_BOOLENUM, .off = LAY(gelu_tanh), .only = 1u << TR_LAYER_GELU,
	 .names = approx_names},
	{.key = "rate", .kind = K_FLOAT, .off = LAY(rate), .only = 1u << TR_LAYER_DROPOUT, .flags = F_REQ | UNIT_OPEN,
	 .lo = 0, .hi = 1},
	{.key = "eps", .kind = K_FLOAT, .off = LAY(eps), .only = 1u << TR_LAYER_LAYERNORM, .flags = POSITIVE,
	 .def = 1e-5},
	{0},
};

static const struct tr_field model_fields[] = {
	{.key = "inputs", .kind = K_INT, .off = SPEC(inputs), .flags = POSITIVE | F_HI | F_OMIT0,
	 .hi = TR_SPEC_MAX_WIDTH},
	{.key = "layers", .kind = K_ARRAY, .off = SPEC(layers), .flags = F_REQ | F_NONEMPTY, .sub = layer_fields,
	 .size = sizeof(struct tr_layer_spec), .count_off = SPEC(n_layers), .max = TR_SPEC_MAX_LAYERS},
	{.key = "loss", .kind = K_ENUM, .off = SPEC(loss), .names = loss_names},
	{0},
};

static const struct tr_field transform_fields[] = {
	{.key = "type", .kind = K_ENUM, .off = TF(type), .flags = F_REQ | F_VARIANT, .names = transform_names},
	{.key = "factor", .kind = K_FLOAT, .off = TF(factor), .only = 1u << TR_TF_SCALE, .flags = F_REQ},
	{.key = "std", .kind = K_FLOAT, .off = TF(std), .only = 1u << TR_TF_GAUSSIAN_NOISE, .flags = F_REQ | NONNEG},
	{0},
};

static const struct tr_field data_fields[] = {
	{.key = "train", .kind = K_CUSTOM, .flags = F_REQ, .parse = parse_train, .emit = emit_train},
	{.key = "validation", .kind = K_CUSTOM, .parse = parse_validation, .emit = emit_validation},
	{.key = "validation_split", .kind = K_FLOAT, .off = SPEC(validation_split),
	 .flags = F_LO | F_LO_OPEN | F_HI | F_HI_OPEN | F_OMIT0, .lo = 0, .hi = 1},
	{.key = "shuffle", .kind = K_BOOL, .off = SPEC(shuffle), .def = 1},
	{.key = "last_batch", .kind = K_ENUM, .off = SPEC(last_batch), .names = last_batch_names},
	{.key = "transforms", .kind = K_ARRAY, .off = SPEC(transforms), .sub = transform_fields,
	 .size = sizeof(struct tr_transform_spec), .count_off = SPEC(n_transforms), .max = TR_SPEC_MAX_TRANSFORMS},
	{0},
};

#define OPT_SGD (1u << TR_OPT_SGD)
#define OPT_ADAMS ((1u << TR_OPT_ADAM) | (1u << TR_OPT_ADAMW))

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

#define SCH_STEP (1u << TR_SCHED_STEP)
#define SCH_DECAY ((1u << TR_SCHED_COSINE) | (1u << TR_SCHED_LINEAR))

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

static const struct tr_field prefetch_fields[] = {
	{.key = "workers", .kind = K_INT, .off = SPEC(prefetch_workers), .flags = F_LO | F_HI, .lo = 1, .hi = 64,
	 .def = 2},
	{.key = "depth", .kind = K_INT, .off = SPEC(prefetch_depth), .flags = F_LO | F_HI, .lo = 1, .hi = 256,
	 .def = 4},
	{0},
};

static const struct tr_field checkpoint_fields[] = {
	{.key = "every_steps", .kind = K_INT, .off = SPEC(checkpoint_every_steps), .flags = NONNEG},
	{.key = "every_seconds", .kind = K_INT, .off = SPEC(checkpoint_every_seconds), .flags = NONNEG},
	{.key = "keep", .kind = K_INT, .off = SPEC(checkpoint_keep), .flags = F_LO | F_HI, .lo = 1,
	 .hi = TR_SPEC_MAX_CHECKPOINT_KEEP, .def = 3},
	{0},
};

static const struct tr_field monitor_fields[] = {
	{.key = "metric", .kind = K_NAME, .off = MON(name), .flags = F_REQ, .names = metric_names,
	 .size = sizeof(((struct tr_monitor_spec *)0)->name)},
	{.key = "every_steps", .kind = K_INT, .off = MON(every_steps), .flags = POSITIVE, .def = 10},
	{.key = "per_layer", .kind = K_BOOL, .off = MON(per_layer)},
	{0},
};

#define ES(m) offsetof(struct tr_spec, early_stopping.m)
static const struct tr_field early_stop_fields[] = {
	{.key = "metric", .kind = K_NAME, .off = ES(metric), .flags = F_REQ, .names = es_metric_names,
	 .size = sizeof(((struct tr_early_stop_spec *)0)->metric)},
	{.key = "mode", .kind = K_BOOLENUM, .off = ES(mode_max), .names = es_mode_names},
	{.key = "patience", .kind = K_INT, .off = ES(patience), .flags = F_LO | F_HI, .lo = 1,
	 .hi = TR_SPEC_MAX_PATIENCE, .def = 5},
	{.key = "min_delta", .kind = K_FLOAT, .off = ES(min_delta), .flags = NONNEG},
	{0},
};

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
	if (strncmp(es->metric, "val_", 4) == 0 && !spec->validation.present && spec->validation_split <= 0)
		return tr_fields_fail(c, "metric", "%s needs validation data (data.validation or data.validation_split)",
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
	json_object_foreach((json_t *)v, key, e)
	{
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

static const struct tr_field init_fields[] = {
	{.key = "from", .kind = K_CUSTOM, .flags = F_REQ, .parse = parse_init_from, .emit = emit_init_from},
	{0},
};

/* "seed" comes before "data": sources default their seed to it. */
static const struct tr_field root_fields[] = {
	{.key = "name", .kind = K_STR, .off = SPEC(name), .flags = F_NOCTRL, .defstr = "job", .max = TR_SPEC_MAX_NAME},
	{.key = "seed", .kind = K_U64, .off = SPEC(seed), .flags = NONNEG},
	{.key = "model", .kind = K_OBJECT, .flags = F_REQ, .sub = model_fields, .post = post_model},
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
	{.key = "devices", .kind = K_CUSTOM, .parse = parse_devices, .emit = emit_devices},
	{.key = "backend", .kind = K_ENUM, .off = SPEC(backend), .names = backend_names},
	{.key = "precision", .kind = K_BOOLENUM, .off = SPEC(tf32), .names = precision_names},
	{.key = "prefetch", .kind = K_OBJECT, .sub = prefetch_fields},
	{.key = "log_every_steps", .kind = K_INT, .off = SPEC(log_every_steps), .flags = POSITIVE, .def = 1},
	{.key = "eval_every_epochs", .kind = K_INT, .off = SPEC(eval_every_epochs), .flags = POSITIVE, .def = 1},
	{.key = "checkpoint", .kind = K_OBJECT, .sub = checkpoint_fields},
	{.key = "monitors", .kind = K_ARRAY, .off = SPEC(monitors), .sub = monitor_fields,
	 .size = sizeof(struct tr_monitor_spec), .count_off = SPEC(n_monitors), .max = TR_SPEC_MAX_MONITORS,
	 .post = post_monitors},
	{.key = "early_stopping", .kind = K_CUSTOM, .parse = parse_early_stopping, .emit = emit_early_stopping},
	{.key = "init", .kind = K_OBJECT, .sub = init_fields},
	{0},
};

/* ---- checks across sections ---- */

static int last_dense(const struct tr_spec *spec)
{
	for (int i = spec->n_layers - 1; i >= 0; i--)
		if (spec->layers[i].type == TR_LAYER_DENSE)
			return i;
	return -1;
}

/* Synthetic sources know their shapes at parse time, so a model that
 * cannot fit them is reported here, with a pointer, rather than as a shape
 * error once the job runs.  The cross checks tr_fields_enter() the pointer of what
 * they blame without leaving it: the first error ends parsing. */
static int check_synthetic(struct tr_fields_ctx *c, const struct tr_spec *spec)
{
	const struct tr_source_spec *tr = &spec->train, *va = &spec->validation;
	int last = last_dense(spec);

	if (tr->format != TR_DATA_SYNTHETIC)
		return 0;
	/* The regression generator holds an outputs x features weight matrix. */
	if (tr->task == TR_SYNTH_REGRESSION &&
	    (int64_t)tr->outputs * tr->features > (int64_t)TR_SPEC_MAX_SYNTH_WEIGHTS) {
		tr_fields_enter(c, "data");
		tr_fields_enter(c, "train");
		return tr_fields_fail(c, "outputs", "outputs x features (%d x %d) must be at most %d", tr->outputs, tr->features,
			    TR_SPEC_MAX_SYNTH_WEIGHTS);
	}
	if (spec->inputs && spec->inputs != tr->features) {
		tr_fields_enter(c, "model");
		return tr_fields_fail(c, "inputs", "must equal the train source's features (%d)", tr->features);
	}
	if (spec->loss == TR_LOSS_SOFTMAX_CE && tr->task == TR_SYNTH_REGRESSION) {
		tr_fields_enter(c, "model");
		return tr_fields_fail(c, "loss",
			    "softmax_cross_entropy needs class labels but the train source is a regression task");
	}
	if (last >= 0) {
		int want = 0;

		if (spec->loss == TR_LOSS_SOFTMAX_CE)
			want = tr->classes;
		else if (tr->task == TR_SYNTH_REGRESSION)
			want = tr->outputs;
		if (want && spec->layers[last].units != want) {
			tr_fields_enter(c, "model");
			tr_fields_enter(c, "layers");
			tr_fields_enter_index(c, (size_t)last);
			return tr_fields_fail(c, "units",
				    "the last dense layer must have %d units to match the train source's %s", want,
				    spec->loss == TR_LOSS_SOFTMAX_CE ? "classes" : "outputs");
		}
	}
	if (va->present && va->format == TR_DATA_SYNTHETIC) {
		const char *key = NULL;

		if (va->task != tr->task)
			key = "task";
		else if (va->features != tr->features)
			key = "features";
		else if (va->task == TR_SYNTH_CLASSIFICATION && va->classes != tr->classes)
			key = "classes";
		else if (va->task == TR_SYNTH_REGRESSION && va->outputs != tr->outputs)
			key = "outputs";
		if (key) {
			tr_fields_enter(c, "data");
			tr_fields_enter(c, "validation");
			return tr_fields_fail(c, key, "must match the train source");
		}
	}
	return 0;
}

/* The model's parameter count, where the input width is known (given, or
 * a synthetic source's features); files only tell it when the job starts,
 * where tr_model_init applies the same bound.  Each term is below 2^49
 * (widths <= 2^24) and there are at most 64 layers: no overflow. */
static int check_params(struct tr_fields_ctx *c, const struct tr_spec *spec)
{
	int64_t width = spec->inputs, total = 0;

	if (!width && spec->train.format == TR_DATA_SYNTHETIC)
		width = spec->train.features;
	if (!width)
		return 0;
	for (int i = 0; i < spec->n_layers; i++) {
		const struct tr_layer_spec *l = &spec->layers[i];

		if (l->type == TR_LAYER_DENSE) {
			total += width * l->units + (l->bias ? l->units : 0);
			width = l->units;
		} else if (l->type == TR_LAYER_LAYERNORM) {
			total += 2 * width;
		}
		if (total > TR_SPEC_MAX_PARAMS) {
			tr_fields_enter(c, "model");
			tr_fields_enter(c, "layers");
			tr_fields_enter_index(c, (size_t)i);
			return tr_fields_fail(c, NULL, "the model reaches %lld parameters here, more than the %lld the engine takes",
				    (long long)total, (long long)TR_SPEC_MAX_PARAMS);
		}
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
	if ((rc = check_synthetic(c, spec)))
		return rc;
	if ((rc = check_params(c, spec)))
		return rc;
	return 0;
}

/* ---- API ---- */

int tr_spec_parse(const json_t *doc, struct tr_spec *spec, struct tr_spec_error *err)
{
	struct tr_fields_ctx c = {.err = err, .user = spec};
	int rc;

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

int tr_spec_parse_text(const char *text, struct tr_spec *spec, struct tr_spec_error *err)
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
	src->path = src->x_path = src->y_path = src->images_path = src->labels_path = NULL;
}

void tr_spec_finish(struct tr_spec *spec)
{
	if (!spec)
		return;
	free(spec->name);
	spec->name = NULL;
	free(spec->init_from);
	spec->init_from = NULL;
	finish_source(&spec->train);
	finish_source(&spec->validation);
}


json_t *tr_spec_to_json(const struct tr_spec *spec)
{
	if (!spec)
		return NULL;
	return tr_fields_emit_object(root_fields, spec, -1);
}

int tr_spec_output_dim(const struct tr_spec *spec)
{
	int last;

	if (!spec)
		return 0;
	last = last_dense(spec);
	return last < 0 ? 0 : spec->layers[last].units;
}
