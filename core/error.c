/* struct tr_error (core/error.h): the one way an error message travels
 * from where it happened to the person who reads it. */
#include "core/error.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

void tr_error_utf8_trim(char *s)
{
	size_t len = strlen(s), j = len, need;
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

size_t tr_escape_controls(const char *in, char *out, size_t cap)
{
	static const char hex[] = "0123456789abcdef";
	size_t o = 0;

	if (!cap)
		return 0;
	for (; *in; in++) {
		unsigned char c = (unsigned char)*in;
		bool ctl = (c < 0x20 && c != '\t') || c == 0x7f;
		size_t need = ctl ? 4 : 1;
		if (o + need >= cap)
			break;
		if (ctl) {
			out[o++] = '\\';
			out[o++] = 'x';
			out[o++] = hex[c >> 4];
			out[o++] = hex[c & 15];
		} else {
			out[o++] = (char)c;
		}
	}
	out[o] = '\0';
	tr_error_utf8_trim(out);
	return strlen(out);
}

void tr_error_escape_controls(char *s, size_t cap)
{
	char copy[4096];

	snprintf(copy, sizeof copy, "%s", s);
	tr_escape_controls(copy, s, cap);
}

int tr_error_set(struct tr_error *e, int ret, int kind, const char *pointer, const char *fmt, ...)
{
	va_list ap;

	if (!e)
		return ret;
	e->kind = kind;
	snprintf(e->pointer, sizeof e->pointer, "%s", pointer ? pointer : "");
	va_start(ap, fmt);
	vsnprintf(e->message, sizeof e->message, fmt, ap);
	va_end(ap);
	tr_error_escape_controls(e->message, sizeof e->message);
	return ret;
}
