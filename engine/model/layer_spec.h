/* Reading and writing layers in a job spec, for the spec parser and the
 * layer files' field tables (engine/model/layer_spec.c).  Internal to the
 * engine, as engine/spec_fields.h. */
#ifndef TR_LAYER_SPEC_H
#define TR_LAYER_SPEC_H

#include <jansson.h>

#include "engine/spec.h"
#include "engine/spec_fields.h"

/* Parses the JSON array v of layers into out[0..len) (at most max), at the
 * context's pointer.  *n is set to the array's length before any element
 * is read, so that tr_layer_specs_free releases a partial result.  Counts
 * every layer (blocks' inner layers too) against TR_MODEL_MAX_NODES. */
int tr_layer_specs_parse(struct tr_fields_ctx *c, const json_t *v, struct tr_layer_spec *out, int max, int *n);
/* New reference: the layers in normalized form, NULL when out of memory. */
json_t *tr_layer_specs_emit(const struct tr_layer_spec *l, int n);
/* Frees what parsing allocated inside l[0..n) (blocks' inner layers). */
void tr_layer_specs_free(struct tr_layer_spec *l, int n);

/* Custom fields shared by the image layers' tables: "kernel" (required),
 * "stride", "padding", "dilation" (a number or [h, w]; conv2d's padding
 * also "same"), and a block's "layers". */
int tr_layer_spec_parse_kernel(struct tr_fields_ctx *c, const json_t *v, void *base);
int tr_layer_spec_emit_kernel(const void *base, json_t *obj, const char *key);
int tr_layer_spec_parse_stride(struct tr_fields_ctx *c, const json_t *v, void *base);
int tr_layer_spec_parse_stride_kernel(struct tr_fields_ctx *c, const json_t *v, void *base);
int tr_layer_spec_emit_stride(const void *base, json_t *obj, const char *key);
int tr_layer_spec_parse_padding(struct tr_fields_ctx *c, const json_t *v, void *base);
int tr_layer_spec_parse_padding_same(struct tr_fields_ctx *c, const json_t *v, void *base);
int tr_layer_spec_emit_padding(const void *base, json_t *obj, const char *key);
int tr_layer_spec_parse_dilation(struct tr_fields_ctx *c, const json_t *v, void *base);
int tr_layer_spec_emit_dilation(const void *base, json_t *obj, const char *key);
/* maxpool2d's and avgpool2d's keys: kernel, stride, padding. */
extern const struct tr_field tr_layer_pool_window_fields[];

int tr_layer_spec_parse_inner(struct tr_fields_ctx *c, const json_t *v, void *base);
int tr_layer_spec_emit_inner(const void *base, json_t *obj, const char *key);

#endif
