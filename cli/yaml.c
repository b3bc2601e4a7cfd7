/* JSON to block-style YAML (cli/yaml.h). */
#include "cli/yaml.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Words that YAML 1.1 reads as booleans or null when plain. */
static bool special_word(const char *s)
{
	static const char *const words[] = {"true", "false", "yes", "no", "y", "n", "on", "off", "null", NULL};
	for (int i = 0; words[i]; i++)
		if (strcasecmp(s, words[i]) == 0)
			return true;
	return false;
}

/* Plain is safe for a letter or '/' first, then letters, digits and
 * ". _ / -": no indicator, no number (a digit first is quoted), no
 * special word. */
static bool plain_ok(const char *s)
{
	if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || *s == '/'))
		return false;
	for (const char *p = s; *p; p++)
		if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
		      strchr("._/-", *p)))
			return false;
	return !special_word(s);
}

/* A literal block keeps every character but leading blanks on its first
 * line (they would set the indentation), control characters other than
 * tab, and trailing blank lines (the chomping indicator keeps at most one
 * line break).  A tab after the indentation is content. */
static bool block_ok(const char *s)
{
	size_t n = strlen(s);
	if (!strchr(s, '\n') || s[0] == ' ' || s[0] == '\n')
		return false;
	for (const char *p = s; *p; p++)
		if (((unsigned char)*p < 0x20 && *p != '\n' && *p != '\t') || *p == 0x7f)
			return false;
	return !(n >= 2 && s[n - 1] == '\n' && s[n - 2] == '\n');
}

static void indent(FILE *out, int n)
{
	fprintf(out, "%*s", n, "");
}

static void quoted(FILE *out, const char *s)
{
	json_t *j = json_string(s);
	char *q = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
	fputs(q ? q : "\"\"", out);
	free(q);
	json_decref(j);
}

/* A scalar after "key: " or "- "; a block scalar's lines at depth. */
static void scalar(FILE *out, const json_t *v, int depth)
{
	switch (json_typeof(v)) {
	case JSON_STRING: {
		const char *s = json_string_value(v);
		if (plain_ok(s)) {
			fputs(s, out);
		} else if (block_ok(s)) {
			size_t n = strlen(s);
			fputs(s[n - 1] == '\n' ? "|\n" : "|-\n", out);
			for (const char *p = s; *p;) {
				size_t len = strcspn(p, "\n");
				if (len > 0)
					indent(out, depth);
				fwrite(p, 1, len, out);
				if (p[len] == '\n' || !p[len])
					fputc('\n', out);
				p += len + (p[len] == '\n');
			}
			return; /* the block ends its own line */
		} else {
			quoted(out, s);
		}
		break;
	}
	case JSON_INTEGER:
		fprintf(out, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
		break;
	case JSON_REAL: {
		char *d = json_dumps(v, JSON_ENCODE_ANY);
		fputs(d ? d : "0.0", out);
		free(d);
		break;
	}
	case JSON_TRUE:
		fputs("true", out);
		break;
	case JSON_FALSE:
		fputs("false", out);
		break;
	case JSON_NULL:
		fputs("null", out);
		break;
	case JSON_OBJECT:
		fputs("{}", out);
		break;
	case JSON_ARRAY:
		fputs("[]", out);
		break;
	}
	fputc('\n', out);
}

static bool is_block(const json_t *v)
{
	return (json_is_object(v) && json_object_size(v) > 0) || (json_is_array(v) && json_array_size(v) > 0);
}

static void node(FILE *out, const json_t *v, int depth, bool inline_first);

/* The members of an object at depth; the first on the current line when
 * inline_first (after "- "). */
static void mapping(FILE *out, const json_t *obj, int depth, bool inline_first)
{
	const char *key;
	json_t *val;
	bool first = true;
	json_object_foreach((json_t *)obj, key, val) {
		if (!(first && inline_first))
			indent(out, depth);
		first = false;
		if (plain_ok(key))
			fputs(key, out);
		else
			quoted(out, key);
		if (is_block(val)) {
			fputs(":\n", out);
			node(out, val, depth + 2, false);
		} else {
			fputs(": ", out);
			scalar(out, val, depth + 2);
		}
	}
}

static void node(FILE *out, const json_t *v, int depth, bool inline_first)
{
	if (json_is_object(v)) {
		mapping(out, v, depth, inline_first);
		return;
	}
	size_t i;
	json_t *item;
	json_array_foreach(v, i, item) {
		indent(out, depth);
		fputs("- ", out);
		if (json_is_object(item) && json_object_size(item) > 0)
			mapping(out, item, depth + 2, true);
		else if (is_block(item)) {
			fputc('\n', out);
			node(out, item, depth + 2, false);
		} else
			scalar(out, item, depth + 2);
	}
}

int tr_yaml_write(FILE *out, const json_t *doc)
{
	node(out, doc, 0, false);
	return ferror(out) ? -1 : 0;
}
