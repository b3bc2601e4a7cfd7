/* stderr logging with syslog priority prefixes (see log.h).  One fprintf
 * per line keeps lines from different threads whole. */
#include "daemon/log.h"

#include <stdarg.h>
#include <stdio.h>

static int max_level = TR_LOG_INF;

void tr_log_set_level(int level)
{
	max_level = level;
}

void tr_log(int level, const char *fmt, ...)
{
	if (level > max_level)
		return;
	char buf[2048];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	fprintf(stderr, "<%d>trainerd: %s\n", level, buf);
}
