/* storage/jbuf.c: the JSON text of numbers in metrics answers and events.
 * A real is written as its shortest of %.15g and %.17g that reads back as
 * the same double; the writer decides from the %.17g text when the
 * %.15g attempt can be skipped, which must never change the text.  Checked
 * against the plain rule over values of every kind a curve holds. */
#include <criterion/criterion.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage/internal.h"

/* The rule, done the slow way. */
static void reference(double v, char *out, size_t cap)
{
	if (!isfinite(v)) {
		snprintf(out, cap, "null");
		return;
	}
	snprintf(out, cap, "%.15g", v);
	if (strtod(out, NULL) != v)
		snprintf(out, cap, "%.17g", v);
}

static void check_num(double v)
{
	struct jbuf b = {0};
	char want[40];
	tr_store_jbuf_num(&b, v);
	cr_assert(!b.oom);
	reference(v, want, sizeof want);
	cr_assert(b.n == strlen(want) && memcmp(b.p, want, b.n) == 0, "%.17g: \"%.*s\", want \"%s\"", v, (int)b.n, b.p,
		  want);
	free(b.p);
}

static uint64_t rng = 88172645463325252ull;

static uint64_t next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

Test(jbuf, reals_are_the_shortest_form_that_reads_back)
{
	static const double fixed[] = {0.0,
				       -0.0,
				       0.1,
				       0.2,
				       0.3,
				       1.0 / 3,
				       2.0 / 3,
				       1e15,
				       1e16,
				       1e17,
				       1e-5,
				       1e-4,
				       123456789012345.0,
				       999999999999999.0,
				       9999999999999998.0,
				       0.999999999999999,
				       1.000000000000001,
				       DBL_MAX,
				       DBL_MIN,
				       DBL_MIN / 3,
				       5e-324,
				       NAN,
				       INFINITY,
				       -INFINITY,
				       1764633600.123456,
				       0.002,
				       2.5e-3};
	for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++)
		check_num(fixed[i]);
	for (int i = 0; i < 100000; i++) {
		uint64_t r = next();
		double bits;
		memcpy(&bits, &r, sizeof bits);
		check_num(bits);                                      /* any double */
		check_num((double)(float)((double)(r >> 11) / 9e15)); /* a float result */
		check_num(1.7e9 + (double)(r % 100000000) / 1e6);     /* a wall time */
		/* Short decimals, and their neighbours one ulp away. */
		double d = (double)(int64_t)(r % 2000000 - 1000000) / pow(10, (double)(next() % 30) - 8);
		check_num(d);
		check_num(nextafter(d, INFINITY));
		check_num(nextafter(d, -INFINITY));
		/* Around powers of ten, where the exponent of the shorter form
		 * and of the full one differ. */
		double p = pow(10, (double)(next() % 600) - 300);
		check_num(p);
		check_num(nextafter(p, 0));
		check_num(nextafter(nextafter(p, 0), 0));
		check_num(nextafter(p, INFINITY));
	}
}

Test(jbuf, integers)
{
	const int64_t v[] = {0, 1, -1, 9, 10, -10, 1234567890123, INT64_MAX, INT64_MIN, INT64_MIN + 1};
	for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
		struct jbuf b = {0};
		char want[32];
		tr_store_jbuf_int(&b, v[i]);
		snprintf(want, sizeof want, "%" PRId64, v[i]);
		cr_assert(b.n == strlen(want) && memcmp(b.p, want, b.n) == 0, "%s: \"%.*s\"", want, (int)b.n, b.p);
		free(b.p);
	}
}
