/* The JSON field-table interpreter: parsing, defaults, range messages and
 * emitting, driven by `struct tr_field` rows (see engine/spec_fields.h). */
#include "engine/spec_fields.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- errors and JSON pointers ---- */

static void put_char(struct tr_fields_ctx *c, char ch)
{
	if (c->len + 1 < sizeof(c->ptr)) {
		c->ptr[c->len++] = ch;
		c->ptr[c->len] = '\0';
	}
}

/* Appends one reference token, escaped as RFC 6901 asks.  Returns the old
 * length for tr_fields_leave().  A pointer too long for the error struct is cut,
 * which only shortens a message. */
size_t tr_fields_enter(struct tr_fields_ctx *c, const char *token)
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
	tr_error_utf8_trim(c->ptr); /* jansson refuses invalid UTF-8 */
	c->len = strlen(c->ptr);
	return saved;
}

size_t tr_fields_enter_index(struct tr_fields_ctx *c, size_t i)
{
	char buf[24];

	snprintf(buf, sizeof(buf), "%zu", i);
	return tr_fields_enter(c, buf);
}

void tr_fields_leave(struct tr_fields_ctx *c, size_t saved)
{
	c->len = saved;
	c->ptr[saved] = '\0';
}

void tr_fields_set_error(struct tr_error *err, const char *ptr, const char *text)
{
	int n;

	if (!err)
		return;
	err->kind = 0;
	snprintf(err->pointer, sizeof(err->pointer), "%s", ptr);
	if (*ptr)
		n = snprintf(err->message, sizeof(err->message), "%s: %s", ptr, text);
	else
		n = snprintf(err->message, sizeof(err->message), "%s", text);
	if (n >= (int)sizeof(err->message))
		tr_error_utf8_trim(err->message);
}

/* Records an error at the current pointer, or at its child `key` when key
 * is not NULL.  Always returns -EINVAL so callers can `return tr_fields_fail(...)`. */
int tr_fields_fail(struct tr_fields_ctx *c, const char *key, const char *fmt, ...)
{
	char text[sizeof(((struct tr_error *)0)->message)];
	size_t saved = c->len;
	va_list ap;

	if (key)
		tr_fields_enter(c, key);
	va_start(ap, fmt);
	if (vsnprintf(text, sizeof(text), fmt, ap) >= (int)sizeof(text))
		tr_error_utf8_trim(text);
	va_end(ap);
	tr_fields_fail_at(c, c->ptr, text);
	tr_fields_leave(c, saved);
	return -EINVAL;
}

int tr_fields_fail_at(struct tr_fields_ctx *c, const char *ptr, const char *text)
{
	struct tr_error_list *all = c->all;

	if (!all) {
		tr_fields_set_error(c->err, ptr, text);
		return -EINVAL;
	}
	if (all->n == 0 && !all->more)
		tr_fields_set_error(c->err, ptr, text);
	if (all->n < TR_ERROR_LIST_MAX)
		tr_fields_set_error(&all->e[all->n++], ptr, text);
	else
		all->more = 1;
	return -EINVAL;
}

bool tr_fields_keep_going(const struct tr_fields_ctx *c, int rc)
{
	return rc == -EINVAL && c->all && !c->all->more;
}

bool tr_fields_had_problems(const struct tr_fields_ctx *c)
{
	return c->all && (c->all->n > 0 || c->all->more);
}

int tr_fields_fail_oom(struct tr_fields_ctx *c)
{
	tr_fields_set_error(c->err, c->ptr, "out of memory");
	return -ENOMEM;
}

void *tr_fields_at(void *base, size_t off)
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
	memcpy(tr_fields_at(base, off), &v, sizeof(v));
}

bool tr_fields_applies(const struct tr_field *f, int variant)
{
	return !f->only || (f->only & (1u << variant));
}

const struct tr_field *tr_fields_find_field(const struct tr_field *tab, const char *key)
{
	for (; tab->key; tab++)
		if (strcmp(tab->key, key) == 0)
			return tab;
	return NULL;
}

static const struct tr_field *variant_field(const struct tr_field *tab)
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

static int fail_range(struct tr_fields_ctx *c, const struct tr_field *f)
{
	bool integer = is_int_kind(f->kind);
	char lo[32], hi[32];

	bound_text(f->lo, integer, lo, sizeof(lo));
	bound_text(f->hi, integer, hi, sizeof(hi));
	if ((f->flags & F_LO) && (f->flags & F_HI))
		return tr_fields_fail(c, NULL, "must be in %c%s, %s%c", (f->flags & F_LO_OPEN) ? '(' : '[', lo, hi,
				      (f->flags & F_HI_OPEN) ? ')' : ']');
	if (f->flags & F_LO)
		return tr_fields_fail(c, NULL, "must be %s %s", (f->flags & F_LO_OPEN) ? ">" : ">=", lo);
	return tr_fields_fail(c, NULL, "must be %s %s", (f->flags & F_HI_OPEN) ? "<" : "<=", hi);
}

static bool in_range(const struct tr_field *f, double v)
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

static int fail_names(struct tr_fields_ctx *c, const char *const *names)
{
	char list[256] = "";
	size_t len = 0;

	for (int i = 0; names[i] && len < sizeof(list); i++) {
		int n = snprintf(list + len, sizeof(list) - len, "%s\"%s\"", i ? ", " : "", names[i]);

		if (n < 0)
			break;
		len += (size_t)n;
	}
	return tr_fields_fail(c, NULL, "must be one of %s", list);
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
static int check_string(struct tr_fields_ctx *c, const json_t *v, const char **out)
{
	if (!json_is_string(v))
		return tr_fields_fail(c, NULL, "must be a string");
	*out = json_string_value(v);
	if (strlen(*out) != json_string_length(v))
		return tr_fields_fail(c, NULL, "must not contain NUL characters");
	if (!**out)
		return tr_fields_fail(c, NULL, "must not be empty");
	return 0;
}

/* A free string's length and, with F_NOCTRL, its characters: a job name is
 * repeated in every listing and log line, so neither a megabyte nor a line
 * break may ride on it. */
static int check_text(struct tr_fields_ctx *c, const struct tr_field *f, const char *s)
{
	size_t max = f->max > 0 ? (size_t)f->max : TR_SPEC_MAX_PATH, n = strlen(s);

	if (n > max)
		return tr_fields_fail(c, NULL, "must be at most %zu bytes (it has %zu)", max, n);
	if (f->flags & F_NOCTRL) {
		for (size_t i = 0; i < n; i++)
			if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
				return tr_fields_fail(c, NULL,
						      "must not contain control characters (byte %zu is 0x%02x)", i,
						      (unsigned)(unsigned char)s[i]);
	}
	return 0;
}

int tr_fields_check_float(struct tr_fields_ctx *c, const json_t *v, float *out)
{
	double d;

	if (!json_is_number(v))
		return tr_fields_fail(c, NULL, "must be a number");
	d = json_number_value(v);
	if (!isfinite(d))
		return tr_fields_fail(c, NULL, "must be a finite number");
	/* Out-of-range double to float conversion is undefined behaviour. */
	if (fabs(d) > FLT_MAX)
		return tr_fields_fail(c, NULL, "is too large");
	*out = (float)d;
	return 0;
}

static int parse_value(struct tr_fields_ctx *c, const struct tr_field *f, const json_t *v, void *base);

static int set_default(struct tr_fields_ctx *c, const struct tr_field *f, void *base)
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

		memcpy(tr_fields_at(base, f->off), &v, sizeof(v));
		return 0;
	}
	case K_U64: {
		uint64_t v = (uint64_t)f->def;

		memcpy(tr_fields_at(base, f->off), &v, sizeof(v));
		return 0;
	}
	case K_FLOAT: {
		float v = (float)f->def;

		memcpy(tr_fields_at(base, f->off), &v, sizeof(v));
		return 0;
	}
	case K_BOOL:
	case K_BOOLENUM: {
		bool v = f->def != 0;

		memcpy(tr_fields_at(base, f->off), &v, sizeof(v));
		return 0;
	}
	case K_STR: {
		char **p = tr_fields_at(base, f->off);

		free(*p);
		*p = NULL;
		if (f->defstr && !(*p = strdup(f->defstr)))
			return tr_fields_fail_oom(c);
		return 0;
	}
	case K_NAME:
		memset(tr_fields_at(base, f->off), 0, f->size);
		if (f->defstr)
			snprintf(tr_fields_at(base, f->off), f->size, "%s", f->defstr);
		return 0;
	case K_TEXT:
		memset(tr_fields_at(base, f->off), 0, f->size);
		if (f->defstr)
			snprintf(tr_fields_at(base, f->off), f->size, "%s", f->defstr);
		return 0;
	case K_OBJECT:
		return tr_fields_parse_object(c, NULL, f->sub, base);
	case K_ARRAY:
		set_int(base, f->count_off, 0);
		return 0;
	case K_CUSTOM:
		return f->parse(c, NULL, base);
	}
	return 0;
}

static int parse_array(struct tr_fields_ctx *c, const struct tr_field *f, const json_t *v, void *base)
{
	size_t n = json_array_size(v);
	int rc, bad = 0;

	if (!json_is_array(v))
		return tr_fields_fail(c, NULL, "must be an array");
	if (n == 0 && (f->flags & F_NONEMPTY))
		return tr_fields_fail(c, NULL, "must not be empty");
	if (n > (size_t)f->max)
		return tr_fields_fail(c, NULL, "must have at most %d entries", f->max);
	for (size_t i = 0; i < n; i++) {
		size_t saved = tr_fields_enter_index(c, i);

		rc = tr_fields_parse_object(c, json_array_get(v, i), f->sub, tr_fields_at(base, f->off + i * f->size));
		tr_fields_leave(c, saved);
		/* Counted as we go so that a later error still frees what the
		 * earlier elements own (a bad one's too, when the next are
		 * still read). */
		if (rc && !tr_fields_keep_going(c, rc))
			return rc;
		set_int(base, f->count_off, (int)i + 1);
		if (rc)
			bad = rc;
	}
	return bad;
}

/* Parses present value v of field f; the context pointer names it. */
static int parse_value(struct tr_fields_ctx *c, const struct tr_field *f, const json_t *v, void *base)
{
	const char *s = NULL;
	int rc;

	switch (f->kind) {
	case K_INT:
	case K_I64:
	case K_U64: {
		json_int_t x;

		if (!json_is_integer(v))
			return tr_fields_fail(c, NULL, "must be an integer");
		x = json_integer_value(v);
		if (!in_range(f, (double)x))
			return fail_range(c, f);
		if (f->kind == K_INT) {
			if (x > INT_MAX)
				return tr_fields_fail(c, NULL, "must be <= %d", INT_MAX);
			if (x < INT_MIN)
				return tr_fields_fail(c, NULL, "must be >= %d", INT_MIN);
			set_int(base, f->off, (int)x);
		} else if (f->kind == K_I64) {
			int64_t y = x;

			memcpy(tr_fields_at(base, f->off), &y, sizeof(y));
		} else {
			uint64_t y;

			if (x < 0)
				return tr_fields_fail(c, NULL, "must be >= 0");
			y = (uint64_t)x;
			memcpy(tr_fields_at(base, f->off), &y, sizeof(y));
		}
		break;
	}
	case K_FLOAT: {
		float x = 0.0f; /* set by check_float; GCC 12 -O3 cannot see it */

		if ((rc = tr_fields_check_float(c, v, &x)))
			return rc;
		/* Checked after rounding: 0.99999999999 becomes 1.0f, which
		 * would break a [0, 1) contract downstream. */
		if (!in_range(f, (double)x))
			return fail_range(c, f);
		memcpy(tr_fields_at(base, f->off), &x, sizeof(x));
		break;
	}
	case K_BOOL: {
		bool b;

		if (!json_is_boolean(v))
			return tr_fields_fail(c, NULL, "must be true or false");
		b = json_is_true(v);
		memcpy(tr_fields_at(base, f->off), &b, sizeof(b));
		break;
	}
	case K_STR: {
		char **p = tr_fields_at(base, f->off);

		if ((rc = check_string(c, v, &s)) || (rc = check_text(c, f, s)))
			return rc;
		free(*p);
		if (!(*p = strdup(s)))
			return tr_fields_fail_oom(c);
		break;
	}
	case K_ENUM:
	case K_BOOLENUM:
	case K_NAME: {
		int i;

		if (!json_is_string(v))
			return tr_fields_fail(c, NULL, "must be a string");
		i = lookup_name(f->names, json_string_value(v));
		if (i < 0 || strlen(json_string_value(v)) != json_string_length(v))
			return fail_names(c, f->names);
		if (f->kind == K_ENUM) {
			set_int(base, f->off, i);
		} else if (f->kind == K_BOOLENUM) {
			bool b = i != 0;

			memcpy(tr_fields_at(base, f->off), &b, sizeof(b));
		} else {
			memset(tr_fields_at(base, f->off), 0, f->size);
			snprintf(tr_fields_at(base, f->off), f->size, "%s", f->names[i]);
		}
		break;
	}
	case K_TEXT: {
		size_t n;

		if (!json_is_string(v))
			return tr_fields_fail(c, NULL, "must be a string");
		s = json_string_value(v);
		n = json_string_length(v);
		if (strlen(s) != n)
			return tr_fields_fail(c, NULL, "must not contain NUL characters");
		if (!n && (f->flags & F_NONEMPTY))
			return tr_fields_fail(c, NULL, "must not be empty");
		if (n >= f->size)
			return tr_fields_fail(c, NULL, "must be at most %zu bytes (it has %zu)", f->size - 1, n);
		memset(tr_fields_at(base, f->off), 0, f->size);
		memcpy(tr_fields_at(base, f->off), s, n);
		break;
	}
	case K_OBJECT:
		if ((rc = tr_fields_parse_object(c, v, f->sub, base)))
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
int tr_fields_parse_field(struct tr_fields_ctx *c, const json_t *obj, const struct tr_field *f, void *base, bool valid)
{
	const json_t *v = (obj && valid) ? json_object_get(obj, f->key) : NULL;
	size_t saved;
	int rc;

	if (!v) {
		if (obj && valid && (f->flags & F_REQ))
			return tr_fields_fail(c, f->key, "is required");
		saved = tr_fields_enter(c, f->key);
		rc = set_default(c, f, base);
		tr_fields_leave(c, saved);
		return rc;
	}
	saved = tr_fields_enter(c, f->key);
	rc = parse_value(c, f, v, base);
	tr_fields_leave(c, saved);
	return rc;
}

static int check_keys(struct tr_fields_ctx *c, const json_t *obj, const struct tr_field *tab, int variant,
		      const char *vdesc)
{
	const char *key;
	json_t *val;
	int rc = 0, bad = 0;

	json_object_foreach((json_t *)obj, key, val) {
		const struct tr_field *f = tr_fields_find_field(tab, key);

		if (!f)
			rc = tr_fields_fail(c, key, "unknown key '%s'", key);
		else if (!tr_fields_applies(f, variant))
			rc = tr_fields_fail(c, key, "unknown key '%s' for %s", key, vdesc);
		if (rc && !tr_fields_keep_going(c, rc))
			return rc;
		bad = bad ? bad : rc;
		rc = 0;
	}
	return bad;
}

int tr_fields_parse_fields(struct tr_fields_ctx *c, const json_t *obj, const struct tr_field *tab, void *base,
			   int variant, const char *vdesc)
{
	int rc, bad = 0;

	/* An unknown key does not change how the known ones read: they are
	 * still checked when problems are collected. */
	if (obj && (rc = check_keys(c, obj, tab, variant, vdesc))) {
		if (!tr_fields_keep_going(c, rc))
			return rc;
		bad = rc;
	}
	for (const struct tr_field *f = tab; f->key; f++) {
		rc = tr_fields_parse_field(c, obj, f, base, tr_fields_applies(f, variant));
		if (rc && !tr_fields_keep_going(c, rc))
			return rc;
		bad = bad ? bad : rc;
	}
	return bad;
}

/* Text that is a whole JSON integer, number or boolean, for the kinds
 * that want one; NULL otherwise (the caller passes the text as a string,
 * and the row's check names what it expected). */
static json_t *typed_from_text(const struct tr_field *f, const char *text)
{
	char *end;

	if (!*text || isspace((unsigned char)*text))
		return NULL;
	switch (f->kind) {
	case K_INT:
	case K_I64:
	case K_U64: {
		long long x;

		errno = 0;
		x = strtoll(text, &end, 10);
		return errno || *end ? NULL : json_integer((json_int_t)x);
	}
	case K_FLOAT: {
		double d;

		errno = 0;
		d = strtod(text, &end);
		return errno || *end ? NULL : json_real(d);
	}
	case K_BOOL:
		if (strcmp(text, "true") == 0 || strcmp(text, "false") == 0)
			return json_boolean(text[0] == 't');
		return NULL;
	default:
		return NULL;
	}
}

int tr_fields_parse_text(struct tr_fields_ctx *c, const struct tr_field *f, const char *text, void *base)
{
	json_t *v = typed_from_text(f, text);
	size_t saved;
	int rc;

	if (!v && !(v = json_stringn_nocheck(text, strlen(text))))
		return tr_fields_fail_oom(c);
	saved = tr_fields_enter(c, f->key);
	rc = parse_value(c, f, v, base);
	tr_fields_leave(c, saved);
	json_decref(v);
	return rc;
}

/* obj NULL means "absent": every field takes its default.  The variant
 * field is read first because it decides which keys are valid. */
int tr_fields_parse_object(struct tr_fields_ctx *c, const json_t *obj, const struct tr_field *tab, void *base)
{
	const struct tr_field *vf = variant_field(tab);
	char desc[96] = "";
	int variant = 0, rc;

	if (obj && !json_is_object(obj))
		return tr_fields_fail(c, NULL, "must be an object");
	if (vf) {
		if ((rc = tr_fields_parse_field(c, obj, vf, base, true)))
			return rc;
		variant = get_int(base, vf->off);
		snprintf(desc, sizeof(desc), "%s \"%s\"", vf->key, vf->names[variant]);
	}
	return tr_fields_parse_fields(c, obj, tab, base, variant, desc);
}

/* Floats are stored as float; emitting the shortest decimal that reads
 * back to the same float keeps dumps readable ("0.003", not
 * "0.0030000000260770321") when dumped with JSON_REAL_PRECISION(9). */
double tr_fields_short_double(float f)
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

static int emit_field(const struct tr_field *f, const void *base, json_t *obj)
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
		return json_object_set_new(obj, f->key, json_real(tr_fields_short_double(v)));
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

		if (v == 0 && (f->flags & F_OMIT0))
			return 0;
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
	case K_TEXT:
		return json_object_set_new(obj, f->key, json_string(p));
	case K_OBJECT: {
		json_t *sub = tr_fields_emit_object(f->sub, base, -1);

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

			if (json_array_append_new(a, tr_fields_emit_object(f->sub, elem, -1))) {
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
json_t *tr_fields_emit_object(const struct tr_field *tab, const void *base, int variant)
{
	const struct tr_field *vf = variant_field(tab);
	json_t *obj = json_object();

	if (!obj)
		return NULL;
	if (variant < 0)
		variant = vf ? get_int(base, vf->off) : 0;
	for (const struct tr_field *f = tab; f->key; f++) {
		if (!tr_fields_applies(f, variant))
			continue;
		if (emit_field(f, base, obj)) {
			json_decref(obj);
			return NULL;
		}
	}
	return obj;
}
