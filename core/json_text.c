/* Reals in their shortest exact form (core/json_text.h).  jansson prints
 * every real of a document at one precision: at 17 digits each reads back
 * exactly, but 0.1 shows as 0.10000000000000001; at 15 it shows as 0.1,
 * but a value that needs 16 or 17 digits changes.  So the document is
 * printed at 17 and each real token (outside strings) rewritten. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_text.h"

/* The shortest of %.15g..%.17g of v that reads back as v, kept a real. */
static void shortest(double v, char *out, size_t len)
{
	for (int p = 15; p <= 17; p++) {
		snprintf(out, len, "%.*g", p, v);
		if (strtod(out, NULL) == v)
			break;
	}
	char *e = strchr(out, 'e');
	if (e) { /* as jansson writes exponents: "1e-8", "1e16" (not "1e-08", "1e+16") */
		char *digits = e + 1 + (e[1] == '-'), *from = e + 1 + (e[1] == '-' || e[1] == '+');
		while (*from == '0' && from[1])
			from++;
		memmove(digits, from, strlen(from) + 1);
	} else if (!strchr(out, '.')) { /* a whole number: read back as an integer otherwise */
		strncat(out, ".0", len - strlen(out) - 1);
	}
}

static bool number_char(char c)
{
	return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E';
}

char *tr_json_dumps(const json_t *j, size_t flags)
{
	char *text = json_dumps(j, (flags & ~(size_t)JSON_REAL_PRECISION(31)) | JSON_REAL_PRECISION(17));
	char *out = NULL;
	size_t out_len = 0;
	FILE *f = text ? open_memstream(&out, &out_len) : NULL;
	if (!f) {
		free(text);
		return NULL;
	}
	bool in_string = false;
	for (const char *t = text; *t;) {
		if (in_string || *t == '"' || (*t != '-' && (*t < '0' || *t > '9'))) {
			if (*t == '"')
				in_string = !in_string;
			else if (in_string && *t == '\\' && t[1])
				fputc(*t++, f); /* an escaped quote ends nothing */
			fputc(*t++, f);
			continue;
		}
		size_t len = 0;
		while (number_char(t[len]))
			len++;
		char token[40];
		bool real = false;
		for (size_t i = 0; i < len; i++)
			real |= t[i] == '.' || t[i] == 'e' || t[i] == 'E';
		if (real && len < sizeof token) {
			memcpy(token, t, len);
			token[len] = 0;
			shortest(strtod(token, NULL), token, sizeof token);
			fputs(token, f);
		} else {
			fwrite(t, 1, len, f); /* an integer, as it is */
		}
		t += len;
	}
	free(text);
	if (fclose(f) != 0) {
		free(out);
		return NULL;
	}
	return out;
}

int tr_json_dumpf(const json_t *j, FILE *f, size_t flags)
{
	char *text = tr_json_dumps(j, flags);
	int rc = text && fputs(text, f) >= 0 ? 0 : -1;
	free(text);
	return rc;
}
