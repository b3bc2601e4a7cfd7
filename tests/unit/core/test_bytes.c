/* Byte counts for people (core/bytes.h): the unit steps, the rounding at
 * each boundary, and that a small checkpoint is not shown as "0.0 MB". */
#include <criterion/criterion.h>

#include <string.h>

#include "core/bytes.h"

Test(bytes, units_and_boundaries)
{
	static const struct {
		double bytes;
		const char *shown;
	} cases[] = {
		{0, "0 B"},           {1, "1 B"},      {999, "999 B"},    {1000, "1.0 kB"}, {29300, "29.3 kB"},
		{999949, "999.9 kB"}, {1e6, "1.0 MB"}, {2.5e9, "2.5 GB"}, {1e12, "1.0 TB"}, {5e15, "5000.0 TB"},
	};
	char buf[TR_BYTES_LEN];
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		tr_fmt_bytes(buf, sizeof buf, cases[i].bytes);
		cr_assert_str_eq(buf, cases[i].shown, "%.0f bytes", cases[i].bytes);
	}
}

Test(bytes, always_fits_and_truncates_safely)
{
	char buf[TR_BYTES_LEN], tiny[4];
	tr_fmt_bytes(buf, sizeof buf, 1e30);
	cr_assert_lt(strlen(buf), sizeof buf);
	tr_fmt_bytes(tiny, sizeof tiny, 29300);
	cr_assert_str_eq(tiny, "29.");
}
