/* Job spec parsing, validation and normalization (docs/design.md §5).
 *
 * Every JSON object of the spec is described by one table of fields: key,
 * kind, where the value lands in the struct, range, default, and for which
 * variant of the object ("type", "format") the key is valid.  The same
 * tables drive parsing, defaults, range messages and tr_spec_to_json, so
 * the normalized form cannot drift from what the parser accepts.  Values
 * that are more than one scalar or object (sources, devices, labels, betas)
 * are custom fields with their own parse and emit functions.  The first
 * problem stops parsing and is reported with the JSON pointer of the value.
 */
#include "engine/spec.h"

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

struct ctx {
	struct tr_spec_error *err;
	struct tr_spec *spec;
	char ptr[sizeof(((struct tr_spec_error *)0)->pointer)];
	size_t len;
};

/* ---- errors and JSON pointers ---- */

/* Cuts a trailing incomplete UTF-8 sequence left by truncation: the API
 * puts pointers and messages into JSON, and jansson refuses invalid UTF-8. */
static void utf8_trim(char *s, size_t len)
{
	size_t j = len, need;
	unsigned char lead;

	while (j > 0 && ((unsigned char)s[j - 1] & 0xC0) == 0x80)
		j--;
	if (j == 0)
		return;
	lead = (unsigned char)s[j - 1];
	if (lead < 0xC0)
		return;
	need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
	if (len - (j - 1) < need)
		s[j - 1] = '\0';
}

static void put_char(struct ctx *c, char ch)
{
	if (c->len + 1 < sizeof(c->ptr)) {
		c->ptr[c->len++] = ch;
		c->ptr[c->len] = '\0';
	}
}

/* Appends one reference token, escaped as RFC 6901 asks.  Returns the old
 * length for leave().  A pointer too long for the error struct is cut,
 * which only shortens a message. */
static size_t enter(struct ctx *c, const char *token)
{
	size_t saved = c->len;

	put_char(c, '/');
	for (const char *p = token; *p; p++) {
		if (*p == '~') {
			put_char(c, '~');
			put_char(c, '0');
		} else if (*p == '/') {
			put_char(c, '~');
			put_char(c, '1');
		} else {
			put_char(c, *p);
		}
	}
	utf8_trim(c->ptr, c->len);
	c->len = strlen(c->ptr);
	return saved;
}

static size_t enter_index(struct ctx *c, size_t i)
{
	char buf[24];

	snprintf(buf, sizeof(buf), "%zu", i);
	return enter(c, buf);
}

static void leave(struct ctx *c, size_t saved)
{
	c->len = saved;
	c->ptr[saved] = '\0';
}

static void set_error(struct tr_spec_error *err, const char *ptr, const char *text)
{
	int n;

	if (!err)
		return;
	snprintf(err->pointer, sizeof(err->pointer), "%s", ptr);
	if (*ptr)
		n = snprintf(err->message, sizeof(err->message), "%s: %s", ptr, text);
	else
		n = snprintf(err->message, sizeof(err->message), "%s", text);
	if (n >= (int)sizeof(err->message))
		utf8_trim(err->message, strlen(err->message));
}

/* Records an error at the current pointer, or at its child `key` when key
 * is not NULL.  Always returns -EINVAL so callers can `return fail(...)`. */
static int fail(struct ctx *c, const char *key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(struct ctx *c, const char *key, const char *fmt, ...)
{
	char text[sizeof(((struct tr_spec_error *)0)->message)];
	size_t saved = c->len;
	va_list ap;

	if (key)
		enter(c, key);
	va_start(ap, fmt);
	if (vsnprintf(text, sizeof(text), fmt, ap) >= (int)sizeof(text))
		utf8_trim(text, strlen(text));
	va_end(ap);
	set_error(c->err, c->ptr, text);
	leave(c, saved);
	return -EINVAL;
}

static int fail_oom(struct ctx *c)
{
	set_error(c->err, c->ptr, "out of memory");
	return -ENOMEM;
}

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
	F_NOCTRL = 1 << 9,  /* K_STR: no control characters (it goes into logs) */
};

#define POSITIVE (F_LO | F_LO_OPEN)
#define NONNEG F_LO
#define UNIT_OPEN (F_LO | F_HI | F_HI_OPEN) /* [0, 1) */

/* v is NULL when the key is absent (apply the default).  The context
 * pointer names the field. */
typedef int (*parse_fn)(struct ctx *c, const json_t *v, void *base);
/* Adds `key` to obj (or nothing); returns 0, or -1 when out of memory. */
typedef int (*emit_fn)(const void *base, json_t *obj, const char *key);
/* Runs after a present object or array was parsed, at its pointer. */
typedef int (*post_fn)(struct ctx *c, const json_t *v, void *base);

struct field {
	const char *key;
	enum kind kind;
	size_t off;
	unsigned only;  /* bit mask of variants where the key is valid; 0 = all */
	unsigned flags;
	double lo, hi, def;
	const char *defstr;
	const char *const *names;
	const struct field *sub; /* K_OBJECT, K_ARRAY */
	size_t size;             /* K_ARRAY element size, K_NAME buffer size */
	size_t count_off;        /* K_ARRAY */
	int max;                 /* K_ARRAY: most elements; K_STR: most bytes (0: TR_SPEC_MAX_PATH) */
	parse_fn parse;
	emit_fn emit;
	post_fn post;
};

static void *at(void *base, size_t off)
{
	return (char *)base + off;
}

static const void *cat(const void *base, size_t off)
{
	return (const char *)base + off;
}

static int get_int(const void *base, size_t off)
{
	int v;

	memcpy(&v, cat(base, off), sizeof(v));
	return v;
}

static void set_int(void *base, size_t off, int v)
{
	memcpy(at(base, off), &v, sizeof(v));
}

static bool applies(const struct field *f, int variant)
{
	return !f->only || (f->only & (1u << variant));
}

static const struct field *find_field(const struct field *tab, const char *key)
{
	for (; tab->key; tab++)
		if (strcmp(tab->key, key) == 0)
			return tab;
	return NULL;
}

static const struct field *variant_field(const struct field *tab)
{
	for (; tab->key; tab++)
		if (tab->flags & F_VARIANT)
			return tab;
	return NULL;
}

static bool is_int_kind(enum kind k)
{
	return k == K_INT || k == K_I64 || k == K_U64;
}

static void bound_text(double v, bool integer, char *buf, size_t n)
{
	if (integer)
		snprintf(buf, n, "%lld", (long long)v);
	else
		snprintf(buf, n, "%g", v);
}

static int fail_range(struct ctx *c, const struct field *f)
{
	bool integer = is_int_kind(f->kind);
	char lo[32], hi[32];

	bound_text(f->lo, integer, lo, sizeof(lo));
	bound_text(f->hi, integer, hi, sizeof(hi));
	if ((f->flags & F_LO) && (f->flags & F_HI))
		return fail(c, NULL, "must be in %c%s, %s%c", (f->flags & F_LO_OPEN) ? '(' : '[', lo, hi,
			    (f->flags & F_HI_OPEN) ? ')' : ']');
	if (f->flags & F_LO)
		return fail(c, NULL, "must be %s %s", (f->flags & F_LO_OPEN) ? ">" : ">=", lo);
	return fail(c, NULL, "must be %s %s", (f->flags & F_HI_OPEN) ? "<" : "<=", hi);
}

static bool in_range(const struct field *f, double v)
{
	if (f->flags & F_LO) {
		if ((f->flags & F_LO_OPEN) ? !(v > f->lo) : !(v >= f->lo))
			return false;
	}
	if (f->flags & F_HI) {
		if ((f->flags & F_HI_OPEN) ? !(v < f->hi) : !(v <= f->hi))
			return false;
	}
	return true;
}

static int fail_names(struct ctx *c, const char *const *names)
{
	char list[256] = "";
	size_t len = 0;

	for (int i = 0; names[i] && len < sizeof(list); i++) {
		int n = snprintf(list + len, sizeof(list) - len, "%s\"%s\"", i ? ", " : "", names[i]);

		if (n < 0)
			break;
		len += (size_t)n;
	}
	return fail(c, NULL, "must be one of %s", list);
}

static int lookup_name(const char *const *names, const char *s)
{
	for (int i = 0; names[i]; i++)
		if (strcmp(names[i], s) == 0)
			return i;
	return -1;
}

static int count_names(const char *const *names)
{
	int n = 0;

	while (names[n])
		n++;
	return n;
}

/* A string value: no embedded NUL (json_stringn can make one) and not
 * empty, since every string in the spec names something. */
static int check_string(struct ctx *c, const json_t *v, const char **out)
{
	if (!json_is_string(v))
		return fail(c, NULL, "must be a string");
	*out = json_string_value(v);
	if (strlen(*out) != json_string_length(v))
		return fail(c, NULL, "must not contain NUL characters");
	if (!**out)
		return fail(c, NULL, "must not be empty");
	return 0;
}

/* A free string's length and, with F_NOCTRL, its characters: a job name is
 * repeated in every listing and log line, so neither a megabyte nor a line
 * break may ride on it. */
static int check_text(struct ctx *c, const struct field *f, const char *s)
{
	size_t max = f->max > 0 ? (size_t)f->max : TR_SPEC_MAX_PATH, n = strlen(s);

	if (n > max)
		return fail(c, NULL, "must be at most %zu bytes (it has %zu)", max, n);
	if (f->flags & F_NOCTRL) {
		for (size_t i = 0; i < n; i++)
			if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
				return fail(c, NULL, "must not contain control characters (byte %zu is 0x%02x)", i,
					    (unsigned)(unsigned char)s[i]);
	}
	return 0;
}

static int check_float(struct ctx *c, const json_t *v, float *out)
{
	double d;

	if (!json_is_number(v))
		return fail(c, NULL, "must be a number");
	d = json_number_value(v);
	if (!isfinite(d))
		return fail(c, NULL, "must be a finite number");
	/* Out-of-range double to float conversion is undefined behaviour. */
	if (fabs(d) > FLT_MAX)
		return fail(c, NULL, "is too large");
	*out = (float)d;
	return 0;
}

static int parse_object(struct ctx *c, const json_t *obj, const struct field *tab, void *base);
static int parse_value(struct ctx *c, const struct field *f, const json_t *v, void *base);

static int set_default(struct ctx *c, const struct field *f, void *base)
{
	if (f->flags & F_NODEF)
		return 0;
	switch (f->kind) {
	case K_INT:
	case K_ENUM:
		set_int(base, f->off, (int)f->def);
		return 0;
	case K_I64: {
		int64_t v = (int64_t)f->def;

		memcpy(at(base, f->off), &v, sizeof(v));
		return 0;
	}
	case K_U64: {
		uint64_t v = (uint64_t)f->def;

		memcpy(at(base, f->off), &v, sizeof(v));
		return 0;
	}
	case K_FLOAT: {
		float v = (float)f->def;

		memcpy(at(base, f->off), &v, sizeof(v));
		return 0;
	}
	case K_BOOL:
	case K_BOOLENUM: {
		bool v = f->def != 0;

		memcpy(at(base, f->off), &v, sizeof(v));
		return 0;
	}
	case K_STR: {
		char **p = at(base, f->off);

		free(*p);
		*p = NULL;
		if (f->defstr && !(*p = strdup(f->defstr)))
			return fail_oom(c);
		return 0;
	}
	case K_NAME:
		memset(at(base, f->off), 0, f->size);
		if (f->defstr)
			snprintf(at(base, f->off), f->size, "%s", f->defstr);
		return 0;
	case K_OBJECT:
		return parse_object(c, NULL, f->sub, base);
	case K_ARRAY:
		set_int(base, f->count_off, 0);
		return 0;
	case K_CUSTOM:
		return f->parse(c, NULL, base);
	}
	return 0;
}

static int parse_array(struct ctx *c, const struct field *f, const json_t *v, void *base)
{
	size_t n = json_array_size(v);
	int rc;

	if (!json_is_array(v))
		return fail(c, NULL, "must be an array");
	if (n == 0 && (f->flags & F_NONEMPTY))
		return fail(c, NULL, "must not be empty");
	if (n > (size_t)f->max)
		return fail(c, NULL, "must have at most %d entries", f->max);
	for (size_t i = 0; i < n; i++) {
		size_t saved = enter_index(c, i);

		rc = parse_object(c, json_array_get(v, i), f->sub, at(base, f->off + i * f->size));
		leave(c, saved);
		if (rc)
			return rc;
		/* Counted as we go so that a later error still frees what the
		 * earlier elements own. */
		set_int(base, f->count_off, (int)i + 1);
	}
	return 0;
}

/* Parses present value v of field f; the context pointer names it. */
static int parse_value(struct ctx *c, const struct field *f, const json_t *v, void *base)
{
	const char *s = NULL;
	int rc;

	switch (f->kind) {
	case K_INT:
	case K_I64:
	case K_U64: {
		json_int_t x;

		if (!json_is_integer(v))
			return fail(c, NULL, "must be an integer");
		x = json_integer_value(v);
		if (!in_range(f, (double)x))
			return fail_range(c, f);
		if (f->kind == K_INT) {
			if (x > INT_MAX)
				return fail(c, NULL, "must be <= %d", INT_MAX);
			if (x < INT_MIN)
				return fail(c, NULL, "must be >= %d", INT_MIN);
			set_int(base, f->off, (int)x);
		} else if (f->kind == K_I64) {
			int64_t y = x;

			memcpy(at(base, f->off), &y, sizeof(y));
		} else {
			uint64_t y;

			if (x < 0)
				return fail(c, NULL, "must be >= 0");
			y = (uint64_t)x;
			memcpy(at(base, f->off), &y, sizeof(y));
		}
		break;
	}
	case K_FLOAT: {
		float x = 0.0f; /* set by check_float; GCC 12 -O3 cannot see it */

		if ((rc = check_float(c, v, &x)))
			return rc;
		/* Checked after rounding: 0.99999999999 becomes 1.0f, which
		 * would break a [0, 1) contract downstream. */
		if (!in_range(f, (double)x))
			return fail_range(c, f);
		memcpy(at(base, f->off), &x, sizeof(x));
		break;
	}
	case K_BOOL: {
		bool b;

		if (!json_is_boolean(v))
			return fail(c, NULL, "must be true or false");
		b = json_is_true(v);
		memcpy(at(base, f->off), &b, sizeof(b));
		break;
	}
	case K_STR: {
		char **p = at(base, f->off);

		if ((rc = check_string(c, v, &s)) || (rc = check_text(c, f, s)))
			return rc;
		free(*p);
		if (!(*p = strdup(s)))
			return fail_oom(c);
		break;
	}
	case K_ENUM:
	case K_BOOLENUM:
	case K_NAME: {
		int i;

		if (!json_is_string(v))
			return fail(c, NULL, "must be a string");
		i = lookup_name(f->names, json_string_value(v));
		if (i < 0 || strlen(json_string_value(v)) != json_string_length(v))
			return fail_names(c, f->names);
		if (f->kind == K_ENUM) {
			set_int(base, f->off, i);
		} else if (f->kind == K_BOOLENUM) {
			bool b = i != 0;

			memcpy(at(base, f->off), &b, sizeof(b));
		} else {
			memset(at(base, f->off), 0, f->size);
			snprintf(at(base, f->off), f->size, "%s", f->names[i]);
		}
		break;
	}
	case K_OBJECT:
		if ((rc = parse_object(c, v, f->sub, base)))
			return rc;
		break;
	case K_ARRAY:
		if ((rc = parse_array(c, f, v, base)))
			return rc;
		break;
	case K_CUSTOM:
		if ((rc = f->parse(c, v, base)))
			return rc;
		break;
	}
	return f->post ? f->post(c, v, base) : 0;
}

/* Parses field f of obj (NULL: the whole object is absent, so defaults
 * only).  A key not valid for the variant was rejected already; it gets
 * its default so the struct never holds garbage. */
static int parse_field(struct ctx *c, const json_t *obj, const struct field *f, void *base, bool valid)
{
	const json_t *v = (obj && valid) ? json_object_get(obj, f->key) : NULL;
	size_t saved;
	int rc;

	if (!v) {
		if (obj && valid && (f->flags & F_REQ))
			return fail(c, f->key, "is required");
		saved = enter(c, f->key);
		rc = set_default(c, f, base);
		leave(c, saved);
		return rc;
	}
	saved = enter(c, f->key);
	rc = parse_value(c, f, v, base);
	leave(c, saved);
	return rc;
}

static int check_keys(struct ctx *c, const json_t *obj, const struct field *tab, int variant, const char *vdesc)
{
	const char *key;
	json_t *val;

	json_object_foreach((json_t *)obj, key, val) {
		const struct field *f = find_field(tab, key);

		if (!f)
			return fail(c, key, "unknown key '%s'", key);
		if (!applies(f, variant))
			return fail(c, key, "unknown key '%s' for %s", key, vdesc);
	}
	return 0;
}

static int parse_fields(struct ctx *c, const json_t *obj, const struct field *tab, void *base, int variant,
			const char *vdesc)
{
	int rc;

	if (obj && (rc = check_keys(c, obj, tab, variant, vdesc)))
		return rc;
	for (const struct field *f = tab; f->key; f++)
		if ((rc = parse_field(c, obj, f, base, applies(f, variant))))
			return rc;
	return 0;
}

/* obj NULL means "absent": every field takes its default.  The variant
 * field is read first because it decides which keys are valid. */
static int parse_object(struct ctx *c, const json_t *obj, const struct field *tab, void *base)
{
	const struct field *vf = variant_field(tab);
	char desc[96] = "";
	int variant = 0, rc;

	if (obj && !json_is_object(obj))
		return fail(c, NULL, "must be an object");
	if (vf) {
		if ((rc = parse_field(c, obj, vf, base, true)))
			return rc;
		variant = get_int(base, vf->off);
		snprintf(desc, sizeof(desc), "%s \"%s\"", vf->key, vf->names[variant]);
	}
	return parse_fields(c, obj, tab, base, variant, desc);
}

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
static int parse_distinct_ints(struct ctx *c, const json_t *v, int *out, size_t max, json_int_t lo, json_int_t hi,
			       const struct int_list_words *w)
{
	size_t n = json_array_size(v);

	if (n == 0)
		return fail(c, NULL, "must not be empty");
	if (n > max)
		return fail(c, NULL, "must have at most %zu %s", max, w->plural);
	for (size_t i = 0; i < n; i++) {
		const json_t *e = json_array_get(v, i);
		char idx[24];
		json_int_t x;

		snprintf(idx, sizeof(idx), "%zu", i);
		if (!json_is_integer(e))
			return fail(c, idx, "must be an integer");
		x = json_integer_value(e);
		if (x < lo || x > hi)
			return w->show_range ? fail(c, idx, "must be in [%lld, %lld]", (long long)lo, (long long)hi)
					     : fail(c, idx, "is out of range");
		for (size_t j = 0; j < i; j++)
			if (out[j] == (int)x)
				return fail(c, idx, "duplicate %s %d", w->item, (int)x);
		out[i] = (int)x;
	}
	return (int)n;
}

/* csv "label": one column or a list of columns, negative from the end. */
static int parse_label(struct ctx *c, const json_t *v, void *base)
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
			return fail(c, NULL, "is out of range");
		src->label_cols[0] = (int)x;
		src->n_label_cols = 1;
		return 0;
	}
	if (!json_is_array(v))
		return fail(c, NULL, "must be a column index or an array of column indices");
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

static const struct field source_fields[] = {
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
static int parse_source(struct ctx *c, const json_t *v, struct tr_source_spec *src)
{
	char desc[96];
	int rc;

	if (!json_is_object(v))
		return fail(c, NULL, "must be an object");
	src->present = true;
	src->data_seed = c->spec->seed;
	if ((rc = parse_field(c, v, find_field(source_fields, "format"), src, true)))
		return rc;
	if (src->format == TR_DATA_SYNTHETIC) {
		if ((rc = parse_field(c, v, find_field(source_fields, "task"), src, true)))
			return rc;
		snprintf(desc, sizeof(desc), "format \"synthetic\" with task \"%s\"", task_names[src->task]);
	} else {
		snprintf(desc, sizeof(desc), "format \"%s\"", format_names[src->format]);
	}
	return parse_fields(c, v, source_fields, src, source_variant(src), desc);
}

static json_t *emit_object(const struct field *tab, const void *base, int variant);

static int emit_source(const struct tr_source_spec *src, json_t *obj, const char *key)
{
	if (!src->present)
		return 0;
	return json_object_set_new(obj, key, emit_object(source_fields, src, source_variant(src)));
}

static int parse_train(struct ctx *c, const json_t *v, void *base)
{
	return v ? parse_source(c, v, &((struct tr_spec *)base)->train) : 0;
}

static int parse_validation(struct ctx *c, const json_t *v, void *base)
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
static int parse_devices(struct ctx *c, const json_t *v, void *base)
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
			return fail(c, NULL, "must be in [1, %d]", TR_SPEC_MAX_DEVICES);
		spec->device_count = (int)x;
		return 0;
	}
	if (json_is_string(v) && strcmp(json_string_value(v), "all") == 0 &&
	    json_string_length(v) == strlen("all")) {
		spec->device_count = 0;
		return 0;
	}
	if (!json_is_array(v))
		return fail(c, NULL, "must be a device count, an array of device ids or \"all\"");
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

static int parse_betas(struct ctx *c, const json_t *v, void *base)
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
		return fail(c, NULL, "must be an array of two numbers");
	for (size_t i = 0; i < 2; i++) {
		size_t saved = enter_index(c, i);

		rc = check_float(c, json_array_get(v, i), &b[i]);
		if (rc == 0 && !(b[i] >= 0.0f && b[i] < 1.0f))
			rc = fail(c, NULL, "must be in [0, 1)");
		leave(c, saved);
		if (rc)
			return rc;
	}
	spec->optimizer.beta1 = b[0];
	spec->optimizer.beta2 = b[1];
	return 0;
}

/* Floats are stored as float; emitting the shortest decimal that reads
 * back to the same float keeps dumps readable ("0.003", not
 * "0.0030000000260770321") when dumped with JSON_REAL_PRECISION(9). */
static double short_double(float f)
{
	char buf[32];

	for (int prec = 6; prec <= 9; prec++) {
		double d;

		snprintf(buf, sizeof(buf), "%.*g", prec, (double)f);
		d = strtod(buf, NULL);
		if ((float)d == f)
			return d;
	}
	return (double)f;
}

static int emit_betas(const void *base, json_t *obj, const char *key)
{
	const struct tr_spec *spec = base;

	return json_object_set_new(obj, key,
				   json_pack("[ff]", short_double(spec->optimizer.beta1),
					     short_double(spec->optimizer.beta2)));
}

/* ---- post checks ---- */

static int post_model(struct ctx *c, const json_t *v, void *base)
{
	const struct tr_spec *spec = base;

	(void)v;
	for (int i = 0; i < spec->n_layers; i++)
		if (spec->layers[i].type == TR_LAYER_DENSE)
			return 0;
	return fail(c, "layers", "must contain at least one dense layer");
}

static int post_data(struct ctx *c, const json_t *v, void *base)
{
	const struct tr_spec *spec = base;

	(void)v;
	if (spec->validation.present && spec->validation_split > 0)
		return fail(c, "validation_split", "cannot be used together with validation");
	return 0;
}

static int post_optimizer(struct ctx *c, const json_t *v, void *base)
{
	struct tr_spec *spec = base;

	/* torch.optim.AdamW defaults weight_decay to 0.01, the others to 0. */
	if (spec->optimizer.type == TR_OPT_ADAMW && !json_object_get(v, "weight_decay"))
		spec->optimizer.weight_decay = 0.01f;
	/* As torch.optim.SGD: Nesterov needs momentum and no dampening. */
	if (spec->optimizer.nesterov && (spec->optimizer.momentum <= 0 || spec->optimizer.dampening != 0))
		return fail(c, "nesterov", "requires momentum > 0 and dampening = 0");
	return 0;
}

static int post_monitors(struct ctx *c, const json_t *v, void *base)
{
	const struct tr_spec *spec = base;

	(void)v;
	for (int i = 0; i < spec->n_monitors; i++) {
		if (spec->monitors[i].per_layer && strcmp(spec->monitors[i].name, "grad_norm") != 0 &&
		    strcmp(spec->monitors[i].name, "weight_norm") != 0) {
			size_t saved = enter_index(c, (size_t)i);
			int rc = fail(c, "per_layer", "applies to grad_norm and weight_norm only");

			leave(c, saved);
			return rc;
		}
	}
	for (int i = 1; i < spec->n_monitors; i++) {
		for (int j = 0; j < i; j++) {
			if (strcmp(spec->monitors[i].name, spec->monitors[j].name) == 0) {
				size_t saved = enter_index(c, (size_t)i);
				int rc = fail(c, "metric", "duplicate monitor for %s", spec->monitors[i].name);

				leave(c, saved);
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

static const struct field layer_fields[] = {
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

static const struct field model_fields[] = {
	{.key = "inputs", .kind = K_INT, .off = SPEC(inputs), .flags = POSITIVE | F_HI | F_OMIT0,
	 .hi = TR_SPEC_MAX_WIDTH},
	{.key = "layers", .kind = K_ARRAY, .off = SPEC(layers), .flags = F_REQ | F_NONEMPTY, .sub = layer_fields,
	 .size = sizeof(struct tr_layer_spec), .count_off = SPEC(n_layers), .max = TR_SPEC_MAX_LAYERS},
	{.key = "loss", .kind = K_ENUM, .off = SPEC(loss), .names = loss_names},
	{0},
};

static const struct field transform_fields[] = {
	{.key = "type", .kind = K_ENUM, .off = TF(type), .flags = F_REQ | F_VARIANT, .names = transform_names},
	{.key = "factor", .kind = K_FLOAT, .off = TF(factor), .only = 1u << TR_TF_SCALE, .flags = F_REQ},
	{.key = "std", .kind = K_FLOAT, .off = TF(std), .only = 1u << TR_TF_GAUSSIAN_NOISE, .flags = F_REQ | NONNEG},
	{0},
};

static const struct field data_fields[] = {
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

static const struct field optimizer_fields[] = {
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

static const struct field schedule_fields[] = {
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

static const struct field prefetch_fields[] = {
	{.key = "workers", .kind = K_INT, .off = SPEC(prefetch_workers), .flags = F_LO | F_HI, .lo = 1, .hi = 64,
	 .def = 2},
	{.key = "depth", .kind = K_INT, .off = SPEC(prefetch_depth), .flags = F_LO | F_HI, .lo = 1, .hi = 256,
	 .def = 4},
	{0},
};

static const struct field checkpoint_fields[] = {
	{.key = "every_steps", .kind = K_INT, .off = SPEC(checkpoint_every_steps), .flags = NONNEG},
	{.key = "every_seconds", .kind = K_INT, .off = SPEC(checkpoint_every_seconds), .flags = NONNEG},
	{.key = "keep", .kind = K_INT, .off = SPEC(checkpoint_keep), .flags = F_LO | F_HI, .lo = 1,
	 .hi = TR_SPEC_MAX_CHECKPOINT_KEEP, .def = 3},
	{0},
};

static const struct field monitor_fields[] = {
	{.key = "metric", .kind = K_NAME, .off = MON(name), .flags = F_REQ, .names = metric_names,
	 .size = sizeof(((struct tr_monitor_spec *)0)->name)},
	{.key = "every_steps", .kind = K_INT, .off = MON(every_steps), .flags = POSITIVE, .def = 10},
	{.key = "per_layer", .kind = K_BOOL, .off = MON(per_layer)},
	{0},
};

#define ES(m) offsetof(struct tr_spec, early_stopping.m)
static const struct field early_stop_fields[] = {
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
static int parse_early_stopping(struct ctx *c, const json_t *v, void *base)
{
	struct tr_spec *spec = base;
	struct tr_early_stop_spec *es = &spec->early_stopping;
	int rc;

	if (!v) {
		memset(es, 0, sizeof(*es));
		return 0;
	}
	if (!json_is_object(v))
		return fail(c, NULL, "must be an object");
	if ((rc = parse_object(c, v, early_stop_fields, base)))
		return rc;
	es->enabled = true;
	if (!json_object_get(v, "mode"))
		es->mode_max = strcmp(es->metric, "val_accuracy") == 0;
	if (strncmp(es->metric, "val_", 4) == 0 && !spec->validation.present && spec->validation_split <= 0)
		return fail(c, "metric", "%s needs validation data (data.validation or data.validation_split)",
			    es->metric);
	if (strcmp(es->metric, "val_accuracy") == 0 && spec->loss != TR_LOSS_SOFTMAX_CE)
		return fail(c, "metric", "val_accuracy needs the softmax_cross_entropy loss");
	return 0;
}

static int emit_early_stopping(const void *base, json_t *obj, const char *key)
{
	const struct tr_spec *spec = base;
	json_t *o;

	if (!spec->early_stopping.enabled)
		return 0;
	if (!(o = emit_object(early_stop_fields, base, -1)))
		return -1;
	return json_object_set_new(obj, key, o);
}

/* init.from: a safetensors path, or {"job": ID, "step": S | "latest"} to
 * fine-tune from an earlier job's checkpoint. */
static int parse_init_from(struct ctx *c, const json_t *v, void *base)
{
	struct tr_spec *spec = base;

	spec->init_job = 0;
	spec->init_step = -1;
	if (!v)
		return 0; /* F_REQ reports a missing "from" inside a present "init" */
	if (json_is_string(v)) {
		if (json_string_length(v) == 0)
			return fail(c, NULL, "must not be empty");
		if (strlen(json_string_value(v)) != json_string_length(v))
			return fail(c, NULL, "must not contain NUL characters");
		if (json_string_length(v) > TR_SPEC_MAX_PATH)
			return fail(c, NULL, "must be at most %d bytes (it has %zu)", TR_SPEC_MAX_PATH,
				    json_string_length(v));
		spec->init_from = strdup(json_string_value(v));
		return spec->init_from ? 0 : fail_oom(c);
	}
	if (!json_is_object(v))
		return fail(c, NULL, "must be a file path or {\"job\": ID, \"step\": STEP or \"latest\"}");
	const char *key;
	const json_t *e;
	json_object_foreach((json_t *)v, key, e)
	{
		if (strcmp(key, "job") != 0 && strcmp(key, "step") != 0)
			return fail(c, key, "unknown key '%s'", key);
	}
	const json_t *job = json_object_get(v, "job"), *step = json_object_get(v, "step");
	if (!job)
		return fail(c, "job", "is required");
	if (!json_is_integer(job) || json_integer_value(job) < 1)
		return fail(c, "job", "must be a job id (an integer >= 1)");
	spec->init_job = json_integer_value(job);
	if (step && json_is_string(step) && strcmp(json_string_value(step), "latest") == 0)
		spec->init_step = -1;
	else if (step && (!json_is_integer(step) || json_integer_value(step) < 0))
		return fail(c, "step", "must be a step (an integer >= 0) or \"latest\"");
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

static const struct field init_fields[] = {
	{.key = "from", .kind = K_CUSTOM, .flags = F_REQ, .parse = parse_init_from, .emit = emit_init_from},
	{0},
};

/* "seed" comes before "data": sources default their seed to it. */
static const struct field root_fields[] = {
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
 * error once the job runs.  The cross checks enter() the pointer of what
 * they blame without leaving it: the first error ends parsing. */
static int check_synthetic(struct ctx *c, const struct tr_spec *spec)
{
	const struct tr_source_spec *tr = &spec->train, *va = &spec->validation;
	int last = last_dense(spec);

	if (tr->format != TR_DATA_SYNTHETIC)
		return 0;
	/* The regression generator holds an outputs x features weight matrix. */
	if (tr->task == TR_SYNTH_REGRESSION &&
	    (int64_t)tr->outputs * tr->features > (int64_t)TR_SPEC_MAX_SYNTH_WEIGHTS) {
		enter(c, "data");
		enter(c, "train");
		return fail(c, "outputs", "outputs x features (%d x %d) must be at most %d", tr->outputs, tr->features,
			    TR_SPEC_MAX_SYNTH_WEIGHTS);
	}
	if (spec->inputs && spec->inputs != tr->features) {
		enter(c, "model");
		return fail(c, "inputs", "must equal the train source's features (%d)", tr->features);
	}
	if (spec->loss == TR_LOSS_SOFTMAX_CE && tr->task == TR_SYNTH_REGRESSION) {
		enter(c, "model");
		return fail(c, "loss",
			    "softmax_cross_entropy needs class labels but the train source is a regression task");
	}
	if (last >= 0) {
		int want = 0;

		if (spec->loss == TR_LOSS_SOFTMAX_CE)
			want = tr->classes;
		else if (tr->task == TR_SYNTH_REGRESSION)
			want = tr->outputs;
		if (want && spec->layers[last].units != want) {
			enter(c, "model");
			enter(c, "layers");
			enter_index(c, (size_t)last);
			return fail(c, "units",
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
			enter(c, "data");
			enter(c, "validation");
			return fail(c, key, "must match the train source");
		}
	}
	return 0;
}

/* The model's parameter count, where the input width is known (given, or
 * a synthetic source's features); files only tell it when the job starts,
 * where tr_model_init applies the same bound.  Each term is below 2^49
 * (widths <= 2^24) and there are at most 64 layers: no overflow. */
static int check_params(struct ctx *c, const struct tr_spec *spec)
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
			enter(c, "model");
			enter(c, "layers");
			enter_index(c, (size_t)i);
			return fail(c, NULL, "the model reaches %lld parameters here, more than the %lld the engine takes",
				    (long long)total, (long long)TR_SPEC_MAX_PARAMS);
		}
	}
	return 0;
}

static int check_cross(struct ctx *c, const struct tr_spec *spec)
{
	int rc;

	if (spec->epochs == 0 && spec->max_steps == 0)
		return fail(c, "epochs", "one of epochs or max_steps is required");
	if ((spec->schedule.type == TR_SCHED_COSINE || spec->schedule.type == TR_SCHED_LINEAR) &&
	    spec->schedule.min_lr > spec->optimizer.lr) {
		enter(c, "schedule");
		return fail(c, "min_lr", "must be <= the optimizer's lr (%g)", (double)spec->optimizer.lr);
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
	struct ctx c = {.err = err, .spec = spec};
	int rc;

	if (err)
		memset(err, 0, sizeof(*err));
	if (!spec) {
		set_error(err, "", "no spec to fill");
		return -EINVAL;
	}
	memset(spec, 0, sizeof(*spec));
	if (!doc)
		return fail(&c, NULL, "no spec");
	if (!json_is_object(doc))
		return fail(&c, NULL, "the spec must be a JSON object");
	rc = parse_object(&c, doc, root_fields, spec);
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
		set_error(err, "", "no spec text");
		return -EINVAL;
	}
	/* Duplicate keys are refused: the second would silently win. */
	doc = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
	if (!doc) {
		snprintf(msg, sizeof(msg), "line %d, column %d: %s", jerr.line, jerr.column, jerr.text);
		set_error(err, "", msg);
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

static int emit_field(const struct field *f, const void *base, json_t *obj)
{
	const void *p = cat(base, f->off);

	switch (f->kind) {
	case K_INT: {
		int v = get_int(base, f->off);

		if (v == 0 && (f->flags & F_OMIT0))
			return 0;
		return json_object_set_new(obj, f->key, json_integer(v));
	}
	case K_I64: {
		int64_t v;

		memcpy(&v, p, sizeof(v));
		if (v == 0 && (f->flags & F_OMIT0))
			return 0;
		return json_object_set_new(obj, f->key, json_integer(v));
	}
	case K_U64: {
		uint64_t v;

		memcpy(&v, p, sizeof(v));
		if (v > (uint64_t)INT64_MAX)
			return -1;
		return json_object_set_new(obj, f->key, json_integer((json_int_t)v));
	}
	case K_FLOAT: {
		float v;

		memcpy(&v, p, sizeof(v));
		if (v == 0 && (f->flags & F_OMIT0))
			return 0;
		return json_object_set_new(obj, f->key, json_real(short_double(v)));
	}
	case K_BOOL: {
		bool v;

		memcpy(&v, p, sizeof(v));
		return json_object_set_new(obj, f->key, json_boolean(v));
	}
	case K_STR: {
		const char *s;

		memcpy(&s, p, sizeof(s));
		return s ? json_object_set_new(obj, f->key, json_string(s)) : 0;
	}
	case K_ENUM: {
		int v = get_int(base, f->off);

		if (v < 0 || v >= count_names(f->names))
			return -1;
		return json_object_set_new(obj, f->key, json_string(f->names[v]));
	}
	case K_BOOLENUM: {
		bool v;

		memcpy(&v, p, sizeof(v));
		return json_object_set_new(obj, f->key, json_string(f->names[v ? 1 : 0]));
	}
	case K_NAME:
		return json_object_set_new(obj, f->key, json_string(p));
	case K_OBJECT: {
		json_t *sub = emit_object(f->sub, base, -1);

		if (!sub)
			return -1;
		if (json_object_size(sub) == 0) {
			/* An optional section with nothing set, like "init". */
			json_decref(sub);
			return 0;
		}
		return json_object_set_new(obj, f->key, sub);
	}
	case K_ARRAY: {
		int n = get_int(base, f->count_off);
		json_t *a = json_array();

		if (!a)
			return -1;
		for (int i = 0; i < n; i++) {
			const void *elem = cat(base, f->off + (size_t)i * f->size);

			if (json_array_append_new(a, emit_object(f->sub, elem, -1))) {
				json_decref(a);
				return -1;
			}
		}
		return json_object_set_new(obj, f->key, a);
	}
	case K_CUSTOM:
		return f->emit(base, obj, f->key);
	}
	return -1;
}

/* variant < 0: read it from the table's variant field. */
static json_t *emit_object(const struct field *tab, const void *base, int variant)
{
	const struct field *vf = variant_field(tab);
	json_t *obj = json_object();

	if (!obj)
		return NULL;
	if (variant < 0)
		variant = vf ? get_int(base, vf->off) : 0;
	for (const struct field *f = tab; f->key; f++) {
		if (!applies(f, variant))
			continue;
		if (emit_field(f, base, obj)) {
			json_decref(obj);
			return NULL;
		}
	}
	return obj;
}

json_t *tr_spec_to_json(const struct tr_spec *spec)
{
	if (!spec)
		return NULL;
	return emit_object(root_fields, spec, -1);
}

int tr_spec_output_dim(const struct tr_spec *spec)
{
	int last;

	if (!spec)
		return 0;
	last = last_dense(spec);
	return last < 0 ? 0 : spec->layers[last].units;
}
