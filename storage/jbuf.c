/* A growable text buffer for JSON written directly as text: a flush can
 * carry a million points, and a json_t per number would cost far more
 * memory and time than the text itself.  Errors are sticky (oom), checked
 * once at the end.
 */
#include "storage/internal.h"

#include <float.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool reserve(struct jbuf *b, size_t more)
{
	if (b->oom)
		return false;
	if (b->n + more <= b->cap)
		return true;
	size_t cap = b->cap ? b->cap : 256;
	while (cap < b->n + more)
		cap *= 2;
	char *p = realloc(b->p, cap);
	if (!p) {
		b->oom = true;
		return false;
	}
	b->p = p;
	b->cap = cap;
	return true;
}

void tr_store_jbuf_raw(struct jbuf *b, const char *s, size_t len)
{
	if (!reserve(b, len))
		return;
	memcpy(b->p + b->n, s, len);
	b->n += len;
}

void tr_store_jbuf_str(struct jbuf *b, const char *s)
{
	static const char hex[] = "0123456789abcdef";
	tr_store_jbuf_raw(b, "\"", 1);
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		char esc[6];
		if (*p == '"' || *p == '\\') {
			esc[0] = '\\';
			esc[1] = (char)*p;
			tr_store_jbuf_raw(b, esc, 2);
		} else if (*p < 0x20) {
			/* Control characters must be escaped; bytes >= 0x80 pass
			 * through (UTF-8 from the caller). */
			memcpy(esc, "\\u00", 4);
			esc[4] = hex[*p >> 4];
			esc[5] = hex[*p & 15];
			tr_store_jbuf_raw(b, esc, 6);
		} else {
			tr_store_jbuf_raw(b, (const char *)p, 1);
		}
	}
	tr_store_jbuf_raw(b, "\"", 1);
}

/* By hand: a dashboard's answer formats two integers per point, and
 * snprintf costs several times the digits' own work. */
void tr_store_jbuf_int(struct jbuf *b, int64_t v)
{
	char tmp[24], *end = tmp + sizeof tmp, *p = end;
	uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
	do {
		*--p = (char)('0' + u % 10);
		u /= 10;
	} while (u);
	if (v < 0)
		*--p = '-';
	tr_store_jbuf_raw(b, p, (size_t)(end - p));
}

/* %.<p>g of v (p <= 17) into out by integer arithmetic, exactly as
 * printf writes it: v = m * 2^e is scaled by 10^k to p digits and
 * rounded half to even on the exact product, which 128 bits hold for
 * 1e-5 <= |v| < 1e17 (k <= 21).  Returns the length, or -1 outside that
 * range (zero, subnormals, huge or tiny values: the caller asks printf),
 * as glibc's printf of a double costs ten times this (multi-precision
 * arithmetic), and a dashboard's answer is mostly such numbers. */
__extension__ typedef unsigned __int128 u128;

static int fmt_g(double v, int p, char *out)
{
	double a = fabs(v);
	if (!(a >= 1e-5 && a < 1e17))
		return -1;
	int ex;
	double f = frexp(a, &ex); /* a = f * 2^ex, 0.5 <= f < 1 */
	uint64_t m = (uint64_t)ldexp(f, 53);
	int e = ex - 53;
	uint64_t lo = 1, hi;
	for (int i = 1; i < p; i++)
		lo *= 10;
	hi = lo * 10;
	int x = (int)floor(log10(a)); /* the decimal exponent, fixed below */
	uint64_t d = 0;
	for (int tries = 0; tries < 4; tries++) {
		int k = p - 1 - x;
		if (k < 0 || k > 21)
			return -1;
		u128 num = m;
		for (int i = 0; i < k; i++)
			num *= 10;
		if (e >= 0) {
			num <<= e;
		} else {
			u128 q = num >> -e, rem = num - (q << -e), half = (u128)1 << (-e - 1);
			num = q + (rem > half || (rem == half && (q & 1)));
		}
		if (num < lo) {
			x--;
		} else if (num >= hi) {
			x++;
		} else {
			d = (uint64_t)num;
			break;
		}
	}
	if (!d)
		return -1;
	char dig[20];
	for (int i = p - 1; i >= 0; i--, d /= 10)
		dig[i] = (char)('0' + d % 10);
	int nd = p;
	while (nd > 1 && dig[nd - 1] == '0')
		nd--;
	char *o = out;
	if (v < 0)
		*o++ = '-';
	if (x < -4 || x >= p) {
		*o++ = dig[0];
		if (nd > 1) {
			*o++ = '.';
			memcpy(o, dig + 1, (size_t)nd - 1);
			o += nd - 1;
		}
		o += sprintf(o, "e%c%02d", x < 0 ? '-' : '+', x < 0 ? -x : x);
	} else if (x >= 0) {
		memcpy(o, dig, (size_t)x + 1);
		o += x + 1;
		if (nd > x + 1) {
			*o++ = '.';
			memcpy(o, dig + x + 1, (size_t)(nd - x - 1));
			o += nd - x - 1;
		}
	} else {
		*o++ = '0';
		*o++ = '.';
		for (int i = 0; i < -x - 1; i++)
			*o++ = '0';
		memcpy(o, dig, (size_t)nd);
		o += nd;
	}
	*o = '\0';
	return (int)(o - out);
}

static int fmt_or_printf(double v, int p, char *out, size_t cap)
{
	int len = fmt_g(v, p, out);
	return len >= 0 ? len : snprintf(out, cap, "%.*g", p, v);
}

/* Whether the %.17g text t of a normal double has 17 significant digits
 * ending far from a multiple of 100 units of its last digit: then no
 * 15-digit form reads back as the same double.  (If d15 reads back as v,
 * v is the double nearest d15, so |v - d15| <= ulp(v)/2 < 11.1 units of
 * the 17th digit, and the 17-digit form of v ends in 00-11 or 89-99; the
 * margins below are wider.) */
static bool seventeen_needed(const char *t)
{
	int digits = 0, last2 = 0;
	bool lead = true;
	for (; *t && *t != 'e'; t++) {
		if (*t < '0' || *t > '9')
			continue; /* sign, point */
		if (lead && *t == '0')
			continue;
		lead = false;
		digits++;
		last2 = (last2 * 10 + (*t - '0')) % 100;
	}
	return digits == 17 && last2 >= 13 && last2 <= 86;
}

void tr_store_jbuf_num(struct jbuf *b, double v)
{
	if (!isfinite(v)) {
		tr_store_jbuf_raw(b, "null", 4); /* JSON has no NaN or infinity */
		return;
	}
	if (v == 0) {
		tr_store_jbuf_raw(b, signbit(v) ? "-0" : "0", signbit(v) ? 2 : 1); /* as %.15g writes it */
		return;
	}
	char tmp[32];
	/* The shorter form when it reads back exactly (0.1, not
	 * 0.10000000000000001); %.17g always does.  Most values of a curve
	 * (float results, wall times) need all 17 digits, which one look at
	 * the %.17g text tells: only the others try %.15g and read it back
	 * (the same text as trying it for every value).  Subnormals have less
	 * precision: they always try. */
	int len = fmt_or_printf(v, 17, tmp, sizeof tmp);
	if (fabs(v) < DBL_MIN || !seventeen_needed(tmp)) {
		len = fmt_or_printf(v, 15, tmp, sizeof tmp);
		if (strtod(tmp, NULL) != v)
			len = fmt_or_printf(v, 17, tmp, sizeof tmp);
	}
	tr_store_jbuf_raw(b, tmp, (size_t)len);
}

/* Length of the valid UTF-8 sequence at p, 0 when invalid (overlong
 * forms, surrogates and code points above U+10FFFF included). */
static size_t utf8_len(const unsigned char *p)
{
	if (p[0] < 0x80)
		return 1;
	size_t n;
	uint32_t cp;
	if ((p[0] & 0xe0) == 0xc0) {
		n = 2;
		cp = p[0] & 0x1f;
	} else if ((p[0] & 0xf0) == 0xe0) {
		n = 3;
		cp = p[0] & 0x0f;
	} else if ((p[0] & 0xf8) == 0xf0) {
		n = 4;
		cp = p[0] & 0x07;
	} else {
		return 0;
	}
	for (size_t i = 1; i < n; i++) {
		if ((p[i] & 0xc0) != 0x80)
			return 0; /* also stops at the NUL */
		cp = (cp << 6) | (p[i] & 0x3f);
	}
	static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
	if (cp < min_cp[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return n;
}

bool tr_store_utf8_valid(const char *s)
{
	for (const unsigned char *p = (const unsigned char *)s; *p;) {
		size_t n = utf8_len(p);
		if (!n)
			return false;
		p += n;
	}
	return true;
}

void tr_store_utf8_fix(char *s)
{
	for (unsigned char *p = (unsigned char *)s; *p;) {
		size_t n = utf8_len(p);
		if (n) {
			p += n;
		} else {
			*p++ = '?';
		}
	}
}
