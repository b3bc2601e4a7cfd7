/* Byte counts for people (core/bytes.h). */
#include "core/bytes.h"

#include <stdio.h>

void tr_fmt_bytes(char *buf, size_t len, double b)
{
	static const char *const units[] = {"B", "kB", "MB", "GB", "TB"};
	int u = 0;

	while (b >= 1000 && u < 4)
		b /= 1000, u++;
	if (u == 0)
		snprintf(buf, len, "%.0f B", b);
	else
		snprintf(buf, len, "%.1f %s", b, units[u]);
}
