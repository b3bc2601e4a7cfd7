/* Layers in a job spec (layer_spec.h): the "layers" arrays and the pair
 * fields image layers share.
 *
 * A layer object is its "type" plus the keys its registry entry's field
 * table lists (engine/model/layer.h), so a new layer brings its own keys
 * and the parser needs no change.  Pairs ([h, w]) accept one number for
 * both sides, as PyTorch does, and are written out as pairs.
 */
#include "engine/model/layer_spec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/layer.h"

/* Depth of residual nesting and layers counted so far in the spec being
 * parsed, per thread: the field interpreter's parse functions see only
 * their value and base. */
static _Thread_local int nest_depth;
static _Thread_local int nodes_seen;

static int parse_one(struct tr_fields_ctx *c, const json_t *v, struct tr_layer_spec *l)
{
	char desc[64];
	int rc;

	if (!json_is_object(v))
		return tr_fields_fail(c, NULL, "must be an object");
	const json_t *t = json_object_get(v, "type");
	if (!t)
		return tr_fields_fail(c, "type", "is required");
	const tr_layer_i *ops = json_is_string(t) ? tr_layer_ops_named(json_string_value(t)) : NULL;
	if (!ops) {
		char list[320] = "";
		size_t len = 0;
		for (int i = 0; tr_layer_ops_at(i) && len < sizeof list; i++) {
			int k = snprintf(list + len, sizeof list - len, "%s\"%s\"", i ? ", " : "",
					 tr_layer_ops_at(i)->name);
			if (k < 0)
				break;
			len += (size_t)k;
		}
		return tr_fields_fail(c, "type", "must be one of %s", list);
	}
	l->type = ops->type;
	if (!ops->fields) {
		if (json_object_size(v) > 1) {
			const char *key;
			const json_t *val;
			json_object_foreach((json_t *)v, key, val) {
				if (strcmp(key, "type") != 0)
					return tr_fields_fail(c, key, "unknown key '%s' for type \"%s\"", key,
							      ops->name);
			}
		}
		return 0;
	}
	/* The table has no "type" row: parse the object without it. */
	json_t *rest = json_copy((json_t *)v);
	if (!rest)
		return tr_fields_fail_oom(c);
	json_object_del(rest, "type");
	snprintf(desc, sizeof desc, "type \"%s\"", ops->name);
	rc = tr_fields_parse_fields(c, rest, ops->fields, l, 0, desc);
	json_decref(rest);
	return rc;
}

int tr_layer_specs_parse(struct tr_fields_ctx *c, const json_t *v, struct tr_layer_spec *out, int max, int *n)
{
	if (!v)
		return tr_fields_fail(c, NULL, "is required");
	if (!json_is_array(v))
		return tr_fields_fail(c, NULL, "must be an array of layers");
	size_t len = json_array_size(v);
	if (len == 0)
		return tr_fields_fail(c, NULL, "must not be empty");
	if (len > (size_t)max)
		return tr_fields_fail(c, NULL, "must have at most %d layers", max);
	if (nest_depth == 0)
		nodes_seen = 0;
	nodes_seen += (int)len;
	if (nodes_seen > TR_MODEL_MAX_NODES)
		return tr_fields_fail(c, NULL, "the model has more than %d layers in all, blocks' layers included",
				      TR_MODEL_MAX_NODES);
	*n = (int)len;
	int bad = 0;
	for (size_t i = 0; i < len; i++) {
		size_t saved = tr_fields_enter_index(c, i);
		int rc = parse_one(c, json_array_get(v, i), &out[i]);
		tr_fields_leave(c, saved);
		/* One bad layer does not hide the next one's problems. */
		if (rc && !tr_fields_keep_going(c, rc))
			return rc;
		bad = bad ? bad : rc;
	}
	return bad;
}

json_t *tr_layer_specs_emit(const struct tr_layer_spec *l, int n)
{
	json_t *arr = json_array();
	for (int i = 0; arr && i < n; i++) {
		const tr_layer_i *ops = tr_layer_ops_for(l[i].type);
		/* "type" first, for people reading the normalized form */
		json_t *o = json_pack("{s:s}", "type", ops ? ops->name : "?");
		json_t *keys = ops && ops->fields ? tr_fields_emit_object(ops->fields, &l[i], 0) : json_object();
		int bad = !o || !keys || json_object_update(o, keys);
		json_decref(keys);
		if (bad || json_array_append_new(arr, o)) {
			if (bad)
				json_decref(o);
			json_decref(arr);
			return NULL;
		}
	}
	return arr;
}

void tr_layer_specs_free(struct tr_layer_spec *l, int n)
{
	for (int i = 0; l && i < n; i++) {
		tr_layer_specs_free(l[i].inner, l[i].n_inner);
		free(l[i].inner);
		l[i].inner = NULL;
		l[i].n_inner = 0;
	}
}

/* ---- pairs ---- */

static int parse_side(struct tr_fields_ctx *c, const json_t *v, int lo, int *out)
{
	if (!json_is_integer(v))
		return tr_fields_fail(c, NULL, "must be an integer or a pair [h, w] of integers");
	json_int_t k = json_integer_value(v);
	if (k < lo || k > TR_SPEC_MAX_SIDE)
		return tr_fields_fail(c, NULL, "must be %d to %d", lo, TR_SPEC_MAX_SIDE);
	*out = (int)k;
	return 0;
}

static int parse_pair(struct tr_fields_ctx *c, const json_t *v, int lo, int *out)
{
	if (json_is_array(v)) {
		if (json_array_size(v) != 2)
			return tr_fields_fail(c, NULL, "must be a number or a pair [h, w]");
		for (size_t i = 0; i < 2; i++) {
			size_t saved = tr_fields_enter_index(c, i);
			int rc = parse_side(c, json_array_get(v, i), lo, &out[i]);
			if (rc)
				return rc;
			tr_fields_leave(c, saved);
		}
		return 0;
	}
	int rc = parse_side(c, v, lo, &out[0]);
	out[1] = out[0];
	return rc;
}

static int emit_pair(json_t *obj, const char *key, const int *p)
{
	return json_object_set_new(obj, key, json_pack("[ii]", p[0], p[1]));
}

#define LS(base) ((struct tr_layer_spec *)(base))
#define CLS(base) ((const struct tr_layer_spec *)(base))

int tr_layer_spec_parse_kernel(struct tr_fields_ctx *c, const json_t *v, void *base)
{
	if (!v)
		return tr_fields_fail(c, NULL, "is required");
	return parse_pair(c, v, 1, LS(base)->kernel);
}

int tr_layer_spec_emit_kernel(const void *base, json_t *obj, const char *key)
{
	return emit_pair(obj, key, CLS(base)->kernel);
}

/* conv2d: absent is 1. */
int tr_layer_spec_parse_stride(struct tr_fields_ctx *c, const json_t *v, void *base)
{
	if (!v) {
		LS(base)->stride[0] = LS(base)->stride[1] = 1;
		return 0;
	}
	return parse_pair(c, v, 1, LS(base)->stride);
}

/* Pooling: absent is the kernel, as in PyTorch ("kernel" comes first in
 * the table, so it is known here). */
int tr_layer_spec_parse_stride_kernel(struct tr_fields_ctx *c, const json_t *v, void *base)
{
	if (!v) {
		LS(base)->stride[0] = LS(base)->kernel[0];
		LS(base)->stride[1] = LS(base)->kernel[1];
		return 0;
	}
	return parse_pair(c, v, 1, LS(base)->stride);
}

int tr_layer_spec_emit_stride(const void *base, json_t *obj, const char *key)
{
	return emit_pair(obj, key, CLS(base)->stride);
}

int tr_layer_spec_parse_padding(struct tr_fields_ctx *c, const json_t *v, void *base)
{
	return v ? parse_pair(c, v, 0, LS(base)->padding) : 0;
}

int tr_layer_spec_parse_padding_same(struct tr_fields_ctx *c, const json_t *v, void *base)
{
	if (json_is_string(v)) {
		if (strcmp(json_string_value(v), "same") != 0)
			return tr_fields_fail(c, NULL, "must be a number, a pair [h, w] or \"same\"");
		LS(base)->pad_same = true;
		return 0;
	}
	return tr_layer_spec_parse_padding(c, v, base);
}

int tr_layer_spec_emit_padding(const void *base, json_t *obj, const char *key)
{
	if (CLS(base)->pad_same)
		return json_object_set_new(obj, key, json_string("same"));
	return emit_pair(obj, key, CLS(base)->padding);
}

int tr_layer_spec_parse_dilation(struct tr_fields_ctx *c, const json_t *v, void *base)
{
	if (!v) {
		LS(base)->dilation[0] = LS(base)->dilation[1] = 1;
		return 0;
	}
	return parse_pair(c, v, 1, LS(base)->dilation);
}

int tr_layer_spec_emit_dilation(const void *base, json_t *obj, const char *key)
{
	return emit_pair(obj, key, CLS(base)->dilation);
}

/* ---- a block's layers ---- */

int tr_layer_spec_parse_inner(struct tr_fields_ctx *c, const json_t *v, void *base)
{
	struct tr_layer_spec *l = base;
	if (!v)
		return tr_fields_fail(c, NULL, "is required");
	if (nest_depth + 1 >= TR_SPEC_MAX_DEPTH)
		return tr_fields_fail(c, NULL, "residual blocks nest at most %d deep", TR_SPEC_MAX_DEPTH - 1);
	size_t len = json_is_array(v) ? json_array_size(v) : 0;
	if (len > 0 && len <= TR_SPEC_MAX_LAYERS) {
		l->inner = calloc(len, sizeof *l->inner);
		if (!l->inner)
			return tr_fields_fail_oom(c);
	}
	nest_depth++;
	int rc = tr_layer_specs_parse(c, v, l->inner, l->inner ? (int)len : TR_SPEC_MAX_LAYERS, &l->n_inner);
	nest_depth--;
	if (rc && !l->inner)
		l->n_inner = 0;
	return rc;
}

int tr_layer_spec_emit_inner(const void *base, json_t *obj, const char *key)
{
	json_t *arr = tr_layer_specs_emit(CLS(base)->inner, CLS(base)->n_inner);
	return arr ? json_object_set_new(obj, key, arr) : -1;
}
