/* struct tr_error (core/error.h): the one way an error message travels
 * from where it happened to the person who reads it. */
#include "core/error.h"

#include <stdarg.h>
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
	tr_error_utf8_trim(e->message);
	return ret;
}
