/* The JSON field-table interpreter behind the job spec (docs/design.md §5).
 *
 * An object is described by a table of `struct tr_field` rows: key, kind,
 * where the value lands in a C struct, range, default, and for which
 * variant of the object ("type", "format") the key is valid.  The same
 * rows drive parsing, defaults, range messages and emitting the normalized
 * JSON, so what is written out cannot drift from what the parser accepts.
 * The first problem stops parsing and is reported in a struct tr_error with
 * the JSON pointer of the offending value.  With a problem list in the
 * context, parsing goes on past a bad value to its siblings (other keys of
 * the object, other elements of the array) and records each problem; a
 * value whose meaning depends on a bad one (the keys of an object whose
 * "type" is wrong, an object's cross-field checks) is not looked at.
 *
 * This header is internal to the engine's parsers (engine/spec.c holds the
 * job spec's tables); it is not part of the engine's public interface.
 * Not thread-safe per context; tables are read-only and may be shared.
 */
#ifndef TR_ENGINE_SPEC_FIELDS_H
#define TR_ENGINE_SPEC_FIELDS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "engine/spec.h"

/* The state of one parse: where errors go and the JSON pointer of the
 * value being read.  Custom parse functions extend the pointer with
 * tr_fields_enter and restore it with tr_fields_leave. */
struct tr_fields_ctx {
	struct tr_error *err;      /* the first problem */
	struct tr_error_list *all; /* NULL: stop at the first; else every problem, bounded */
	void *user;                /* the caller's own state, e.g. the spec being filled */
	char ptr[sizeof(((struct tr_error *)0)->pointer)];
	size_t len;
};

/* ---- field tables ---- */

enum kind {
	K_INT,      /* int */
	K_I64,      /* int64_t */
	K_U64,      /* uint64_t, parsed from a non-negative JSON integer */
	K_FLOAT,    /* float */
	K_BOOL,     /* bool */
	K_STR,      /* char *, owned */
	K_ENUM,     /* int-sized enum, by name */
	K_BOOLENUM, /* bool chosen by one of two names */
	K_NAME,     /* char[size], one of `names` */
	K_TEXT,     /* char[size], free text shorter than size; may be empty unless F_NONEMPTY */
	K_OBJECT,   /* nested object stored in the same base struct */
	K_ARRAY,    /* array of objects: elements of `size` bytes at off, count at count_off */
	K_CUSTOM,   /* parse and emit functions */
};

enum {
	F_REQ = 1 << 0,     /* must be present where valid */
	F_LO = 1 << 1,      /* lo is a bound ... */
	F_LO_OPEN = 1 << 2, /* ... an exclusive one */
	F_HI = 1 << 3,
	F_HI_OPEN = 1 << 4,
	F_OMIT0 = 1 << 5,   /* 0 means "not given": left out of the normalized form */
	F_NODEF = 1 << 6,   /* the caller presets the default */
	F_VARIANT = 1 << 7, /* this enum picks which other keys are valid */
	F_NONEMPTY = 1 << 8,
	F_NOCTRL = 1 << 9, /* K_STR: no control characters (it goes into logs) */
};

#define POSITIVE (F_LO | F_LO_OPEN)
#define NONNEG F_LO
#define UNIT_OPEN (F_LO | F_HI | F_HI_OPEN) /* [0, 1) */

/* v is NULL when the key is absent (apply the default).  The context
 * pointer names the field. */
typedef int (*parse_fn)(struct tr_fields_ctx *c, const json_t *v, void *base);
/* Adds `key` to obj (or nothing); returns 0, or -1 when out of memory. */
typedef int (*emit_fn)(const void *base, json_t *obj, const char *key);
/* Runs after a present object or array was parsed, at its pointer. */
typedef int (*post_fn)(struct tr_fields_ctx *c, const json_t *v, void *base);

struct tr_field {
	const char *key;
	enum kind kind;
	size_t off;
	unsigned only; /* bit mask of variants where the key is valid; 0 = all */
	unsigned flags;
	double lo, hi, def;
	const char *defstr;
	const char *const *names;
	const struct tr_field *sub; /* K_OBJECT, K_ARRAY */
	size_t size;                /* K_ARRAY element size, K_NAME buffer size */
	size_t count_off;           /* K_ARRAY */
	int max;                    /* K_ARRAY: most elements; K_STR: most bytes (0: TR_SPEC_MAX_PATH) */
	parse_fn parse;
	emit_fn emit;
	post_fn post;
	const char *help; /* one line for a --help listing (configuration tables) */
};

/* Pointer arithmetic on a table's base struct. */
void *tr_fields_at(void *base, size_t off);
/* Whether row f is valid for the object's variant. */
bool tr_fields_applies(const struct tr_field *f, int variant);
int tr_fields_check_float(struct tr_fields_ctx *c, const json_t *v, float *out);
json_t *tr_fields_emit_object(const struct tr_field *tab, const void *base, int variant);
size_t tr_fields_enter(struct tr_fields_ctx *c, const char *token);
size_t tr_fields_enter_index(struct tr_fields_ctx *c, size_t i);
int tr_fields_fail(struct tr_fields_ctx *c, const char *key, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
int tr_fields_fail_oom(struct tr_fields_ctx *c);
/* Records a problem at pointer ptr (tr_fields_fail's message form);
 * returns -EINVAL. */
int tr_fields_fail_at(struct tr_fields_ctx *c, const char *ptr, const char *text);
/* Whether parsing goes on past a problem that returned rc: only where a
 * list collects problems, until one more than it holds was found, and
 * when rc is a bad value (-EINVAL), not a failure of the parser itself. */
bool tr_fields_keep_going(const struct tr_fields_ctx *c, int rc);
/* Whether problems were recorded already: a check across fields skips
 * itself then, as the fields it reads may be the bad ones. */
bool tr_fields_had_problems(const struct tr_fields_ctx *c);
const struct tr_field *tr_fields_find_field(const struct tr_field *tab, const char *key);
void tr_fields_leave(struct tr_fields_ctx *c, size_t saved);
int tr_fields_parse_field(struct tr_fields_ctx *c, const json_t *obj, const struct tr_field *f, void *base, bool valid);
int tr_fields_parse_fields(struct tr_fields_ctx *c, const json_t *obj, const struct tr_field *tab, void *base,
			   int variant, const char *vdesc);
/* Parses one value given as text (a command-line flag, a 'name = value'
 * line): integers, numbers and true/false become JSON numbers and
 * booleans where the row's kind wants them, anything else a string, and
 * the row then checks it as it checks JSON.  The context pointer names the
 * row's key. */
int tr_fields_parse_text(struct tr_fields_ctx *c, const struct tr_field *f, const char *text, void *base);
int tr_fields_parse_object(struct tr_fields_ctx *c, const json_t *obj, const struct tr_field *tab, void *base);
void tr_fields_set_error(struct tr_error *err, const char *ptr, const char *text);
double tr_fields_short_double(float f);

#endif
