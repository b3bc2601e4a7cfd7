/* JSON text with each real in its shortest exact form (core/json_text.h):
 * short where 15 digits read back, 16 or 17 digits where they are needed,
 * reals kept reals, integers and strings untouched, and every real of a
 * document (spread over many magnitudes) reading back bit for bit. */
#include <criterion/criterion.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_text.h"

static char *dump_real(double v)
{
	json_t *j = json_real(v);
	char *text = tr_json_dumps(j, JSON_ENCODE_ANY);
	json_decref(j);
	cr_assert_not_null(text);
	return text;
}

Test(json_text, the_shortest_form_that_reads_back)
{
	static const struct {
		double v;
		const char *text;
	} cases[] = {
		{0.1, "0.1"},
		{0.3, "0.3"},
		{1e-4, "0.0001"},
		{-2.5, "-2.5"},
		{1.0, "1.0"},
		{0.0, "0.0"},
		{1e300, "1e300"},
		{1e-8, "1e-8"},
		{-2.5e-300, "-2.5e-300"},
		{1e16, "1e16"},
		{0.1 + 0.2, "0.30000000000000004"},         /* 17 digits needed */
		{1.0 / 3.0, "0.3333333333333333"},          /* 16 are enough */
		{1.3607502212899067, "1.3607502212899067"}, /* a loss as it came */
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char *text = dump_real(cases[i].v);
		cr_assert_str_eq(text, cases[i].text, "%.17g printed as %s", cases[i].v, text);
		free(text);
	}
}

Test(json_text, a_document_keeps_its_integers_strings_and_order)
{
	json_t *doc = json_pack("{s:s, s:i, s:f, s:[f, I, s], s:{s:f}}", "name", "lr 0.10000000000000001 \"x\" -1.5",
				"seed", 7, "lr", 0.1, "list", 0.25, (json_int_t)INT64_MAX, "2.0", "optimizer",
				"momentum", 0.9);
	char *text = tr_json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
	cr_assert_str_eq(text, "{\"name\":\"lr 0.10000000000000001 \\\"x\\\" -1.5\",\"seed\":7,\"lr\":0.1,"
			       "\"list\":[0.25,9223372036854775807,\"2.0\"],\"optimizer\":{\"momentum\":0.9}}");
	json_t *back = json_loads(text, 0, NULL);
	cr_assert(json_equal(doc, back), "%s", text);
	cr_assert(json_is_real(json_object_get(back, "lr")));
	free(text);
	json_decref(back);
	json_decref(doc);
}

/* Doubles of every magnitude (a fixed generator): each reads back the same. */
Test(json_text, every_real_reads_back_bit_for_bit)
{
	json_t *a = json_array();
	uint64_t x = 0x9e3779b97f4a7c15u;
	for (int i = 0; i < 20000; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		double v;
		uint64_t bits = x;
		memcpy(&v, &bits, sizeof v);
		if (!isfinite(v))
			continue;
		json_array_append_new(a, json_real(v));
	}
	json_array_append_new(a, json_real(DBL_MIN / 3)); /* subnormal */
	json_array_append_new(a, json_real(DBL_MAX));
	json_array_append_new(a, json_real(-0.0));
	char *text = tr_json_dumps(a, JSON_COMPACT);
	json_t *back = json_loads(text, 0, NULL);
	cr_assert_not_null(back);
	cr_assert_eq(json_array_size(back), json_array_size(a));
	for (size_t i = 0; i < json_array_size(a); i++) {
		double v = json_real_value(json_array_get(a, i)), w = json_real_value(json_array_get(back, i));
		cr_assert(json_is_real(json_array_get(back, i)) && memcmp(&v, &w, sizeof v) == 0,
			  "%.17g read back as %.17g", v, w);
	}
	free(text);
	json_decref(back);
	json_decref(a);
}
