/* RFC 3339 text for Unix times (core/rfc3339.h).  Formatting rounds to
 * the millisecond and carries into the second, so 59.9996 s reads as the
 * next second, never as ".1000". */
#include "core/rfc3339.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

bool tr_rfc3339_format(double t, char *buf, size_t len)
{
	struct tm tm;
	if (len)
		buf[0] = '\0';
	if (!(t > 0) || !isfinite(t) || t >= 253402300800.0 /* year 10000 */ || len < 25)
		return false;
	time_t sec = (time_t)floor(t);
	long ms = lround((t - (double)sec) * 1000.0);
	if (ms >= 1000) {
		sec++;
		ms -= 1000;
	}
	if (!gmtime_r(&sec, &tm))
		return false;
	size_t n = strftime(buf, len, "%Y-%m-%dT%H:%M:%S", &tm);
	if (n == 0)
		return false;
	snprintf(buf + n, len - n, ".%03ldZ", ms);
	return true;
}

static bool digits(const char *p, int n, int *out)
{
	int v = 0;
	for (int i = 0; i < n; i++) {
		if (!isdigit((unsigned char)p[i]))
			return false;
		v = v * 10 + (p[i] - '0');
	}
	*out = v;
	return true;
}

/* Days from 1970-01-01 to y-m-d in the proleptic Gregorian calendar
 * (Howard Hinnant's days_from_civil). */
static long long days_from_civil(int y, int m, int d)
{
	y -= m <= 2;
	long long era = (y >= 0 ? y : y - 399) / 400;
	unsigned yoe = (unsigned)(y - era * 400);
	unsigned doy = (153u * (unsigned)(m + (m > 2 ? -3 : 9)) + 2) / 5 + (unsigned)d - 1;
	unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
	return era * 146097 + (long long)doe - 719468;
}

bool tr_rfc3339_parse(const char *s, double *t)
{
	int y, mo, d, h, mi, sec;
	if (!s || strlen(s) < 20 || !digits(s, 4, &y) || s[4] != '-' || !digits(s + 5, 2, &mo) || s[7] != '-' ||
	    !digits(s + 8, 2, &d) || (s[10] != 'T' && s[10] != 't' && s[10] != ' ') || !digits(s + 11, 2, &h) ||
	    s[13] != ':' || !digits(s + 14, 2, &mi) || s[16] != ':' || !digits(s + 17, 2, &sec))
		return false;
	if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60)
		return false;
	const char *p = s + 19;
	double frac = 0;
	if (*p == '.') {
		double scale = 0.1;
		p++;
		if (!isdigit((unsigned char)*p))
			return false;
		while (isdigit((unsigned char)*p)) {
			frac += (*p - '0') * scale;
			scale /= 10;
			p++;
		}
	}
	int offset = 0;
	if (*p == 'Z' || *p == 'z') {
		p++;
	} else if (*p == '+' || *p == '-') {
		int oh, om;
		if (!digits(p + 1, 2, &oh) || p[3] != ':' || !digits(p + 4, 2, &om) || oh > 23 || om > 59)
			return false;
		offset = (oh * 60 + om) * 60 * (*p == '-' ? -1 : 1);
		p += 6;
	} else {
		return false;
	}
	if (*p)
		return false;
	long long days = days_from_civil(y, mo, d);
	*t = (double)(days * 86400 + h * 3600 + mi * 60 + sec - offset) + frac;
	return true;
}
