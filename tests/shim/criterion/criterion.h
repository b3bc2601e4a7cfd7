/* Self-written stand-in for the subset of Criterion that tests/unit uses, for
 * builds where real Criterion cannot run (ThreadSanitizer, Criterion #274).
 * Tests register through constructors and run one by one, each in a fork()ed
 * child; the runner (tests/shim/criterion_shim.c) prints Criterion's
 * "Synthesis" line.  Assertion macros take an optional printf-style message
 * that must start with a string literal, as with Criterion. */
#ifndef TR_CRITERION_SHIM_H
#define TR_CRITERION_SHIM_H

/* Like the real header, which lives in /usr/include: no -Wsign-compare and
 * friends from comparisons written in the macros below. */
#pragma GCC system_header

/* What the real <criterion/criterion.h> brings in with it. */
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wchar.h>

#define CRITERION_SHIM 1

/* Options of Test(...) and TestSuite(...), as in Criterion. */
#define SHIM_OPTION_FIELDS_                                       \
	void (*init)(void);                                       \
	void (*fini)(void);                                       \
	double timeout; /* seconds, 0 = none */                   \
	bool disabled;                                            \
	const char *description;                                  \
	int signal;    /* the test passes only if killed by it */ \
	int exit_code; /* the exit status the test must end with */

struct shim_suite {
	const char *shim_name_;
	SHIM_OPTION_FIELDS_
};

struct criterion_test_params {
	size_t size;
	void *params;
	size_t length;
	void (*cleanup)(struct criterion_test_params *);
};

struct shim_test {
	const char *shim_suite_;
	const char *shim_name_;
	const char *shim_file_;
	void (*shim_fn_)(void);
	void (*shim_pfn_)(void *);                          /* parameterized */
	struct criterion_test_params (*shim_params_)(void); /* parameterized */
	SHIM_OPTION_FIELDS_
};

void shim_register_suite(const struct shim_suite *s);
void shim_register_test(const struct shim_test *t);
/* Report a failed check: shim_assert_failed ends the test (its fini still
 * runs), shim_expect_failed marks it failed and returns. */
void shim_assert_failed(const char *file, int line, const char *dflt, const char *fmt, ...)
	__attribute__((format(printf, 4, 5), noreturn));
void shim_expect_failed(const char *file, int line, const char *dflt, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
void shim_skip(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4), noreturn));
void shim_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
bool shim_float_eq(long double a, long double b, long double eps);
bool shim_str_cmp(const char *a, const char *b, int *out);

/* clang-format off */
#define SHIM_ID_(a, s, n) shim_##a##__##s##__##n

#define TestSuite(s, ...) \
	static const struct shim_suite SHIM_ID_(suite, s, s) = {.shim_name_ = #s, __VA_ARGS__}; \
	__attribute__((constructor)) static void SHIM_ID_(regsuite, s, s)(void) \
	{ \
		shim_register_suite(&SHIM_ID_(suite, s, s)); \
	}

#define Test(s, n, ...) \
	static void SHIM_ID_(fn, s, n)(void); \
	static const struct shim_test SHIM_ID_(test, s, n) = { \
		.shim_suite_ = #s, .shim_name_ = #n, .shim_file_ = __FILE__, .shim_fn_ = SHIM_ID_(fn, s, n), \
		__VA_ARGS__}; \
	__attribute__((constructor)) static void SHIM_ID_(reg, s, n)(void) \
	{ \
		shim_register_test(&SHIM_ID_(test, s, n)); \
	} \
	static void SHIM_ID_(fn, s, n)(void)

/* ParameterizedTestParameters(s, n) { return cr_make_param_array(...); }
 * ParameterizedTest(type *p, s, n, ...) { ... } runs once per element. */
#define ParameterizedTestParameters(s, n) \
	static struct criterion_test_params SHIM_ID_(params, s, n)(void)

#define ParameterizedTest(param, s, n, ...) \
	static struct criterion_test_params SHIM_ID_(params, s, n)(void); \
	static void SHIM_ID_(pfn, s, n)(param); \
	static void SHIM_ID_(pwrap, s, n)(void *p) \
	{ \
		SHIM_ID_(pfn, s, n)(p); \
	} \
	static const struct shim_test SHIM_ID_(test, s, n) = { \
		.shim_suite_ = #s, .shim_name_ = #n, .shim_file_ = __FILE__, \
		.shim_pfn_ = SHIM_ID_(pwrap, s, n), .shim_params_ = SHIM_ID_(params, s, n), __VA_ARGS__}; \
	__attribute__((constructor)) static void SHIM_ID_(reg, s, n)(void) \
	{ \
		shim_register_test(&SHIM_ID_(test, s, n)); \
	} \
	static void SHIM_ID_(pfn, s, n)(param)

#define cr_make_param_array(type, array, len, ...) \
	((struct criterion_test_params){.size = sizeof(type), .params = (void *)(array), .length = (len), __VA_ARGS__})

/* ---- checks ----
 * SHIM_CHECK_ evaluates `cond` once; the message, if any, is formatted only
 * on failure.  The leading " " keeps a format string present (and checked)
 * when the caller gives none; the runner drops it. */
#define SHIM_CHECK_(f, cond, dflt, ...) \
	do { \
		if (!(cond)) \
			f(__FILE__, __LINE__, (dflt), " " __VA_ARGS__); \
	} while (0)

#define SHIM_A_ shim_assert_failed
#define SHIM_E_ shim_expect_failed
#define SHIM_OP_(f, op, a, b, ...) SHIM_CHECK_(f, (a) op (b), "The expression " #a " " #op " " #b " is false.", __VA_ARGS__)
#define SHIM_STR_(f, op, a, b, ...) \
	do { \
		int shim_c_; \
		SHIM_CHECK_(f, shim_str_cmp((a), (b), &shim_c_) && shim_c_ op 0, \
			    "The expression " #a " " #op " " #b " is false (as strings).", __VA_ARGS__); \
	} while (0)

#define cr_assert(cond, ...) SHIM_CHECK_(SHIM_A_, cond, "The expression " #cond " is false.", __VA_ARGS__)
#define cr_expect(cond, ...) SHIM_CHECK_(SHIM_E_, cond, "The expression " #cond " is false.", __VA_ARGS__)
#define cr_assert_not(cond, ...) SHIM_CHECK_(SHIM_A_, !(cond), "The expression " #cond " is true.", __VA_ARGS__)
#define cr_expect_not(cond, ...) SHIM_CHECK_(SHIM_E_, !(cond), "The expression " #cond " is true.", __VA_ARGS__)
#define cr_assert_fail(...) shim_assert_failed(__FILE__, __LINE__, "The conditions for this assertion were not met.", " " __VA_ARGS__)
#define cr_expect_fail(...) shim_expect_failed(__FILE__, __LINE__, "The conditions for this assertion were not met.", " " __VA_ARGS__)
#define cr_fail(...) cr_assert_fail(__VA_ARGS__)

#define cr_assert_eq(a, b, ...) SHIM_OP_(SHIM_A_, ==, a, b, __VA_ARGS__)
#define cr_assert_neq(a, b, ...) SHIM_OP_(SHIM_A_, !=, a, b, __VA_ARGS__)
#define cr_assert_lt(a, b, ...) SHIM_OP_(SHIM_A_, <, a, b, __VA_ARGS__)
#define cr_assert_leq(a, b, ...) SHIM_OP_(SHIM_A_, <=, a, b, __VA_ARGS__)
#define cr_assert_gt(a, b, ...) SHIM_OP_(SHIM_A_, >, a, b, __VA_ARGS__)
#define cr_assert_geq(a, b, ...) SHIM_OP_(SHIM_A_, >=, a, b, __VA_ARGS__)
#define cr_expect_eq(a, b, ...) SHIM_OP_(SHIM_E_, ==, a, b, __VA_ARGS__)
#define cr_expect_neq(a, b, ...) SHIM_OP_(SHIM_E_, !=, a, b, __VA_ARGS__)
#define cr_expect_lt(a, b, ...) SHIM_OP_(SHIM_E_, <, a, b, __VA_ARGS__)
#define cr_expect_leq(a, b, ...) SHIM_OP_(SHIM_E_, <=, a, b, __VA_ARGS__)
#define cr_expect_gt(a, b, ...) SHIM_OP_(SHIM_E_, >, a, b, __VA_ARGS__)
#define cr_expect_geq(a, b, ...) SHIM_OP_(SHIM_E_, >=, a, b, __VA_ARGS__)

#define cr_assert_null(a, ...) SHIM_CHECK_(SHIM_A_, (a) == NULL, "The expression " #a " is not null.", __VA_ARGS__)
#define cr_assert_not_null(a, ...) SHIM_CHECK_(SHIM_A_, (a) != NULL, "The expression " #a " is null.", __VA_ARGS__)
#define cr_expect_null(a, ...) SHIM_CHECK_(SHIM_E_, (a) == NULL, "The expression " #a " is not null.", __VA_ARGS__)
#define cr_expect_not_null(a, ...) SHIM_CHECK_(SHIM_E_, (a) != NULL, "The expression " #a " is null.", __VA_ARGS__)
#define cr_assert_zero(a, ...) SHIM_CHECK_(SHIM_A_, (a) == 0, "The value " #a " is not zero.", __VA_ARGS__)
#define cr_assert_not_zero(a, ...) SHIM_CHECK_(SHIM_A_, (a) != 0, "The value " #a " is zero.", __VA_ARGS__)
#define cr_expect_zero(a, ...) SHIM_CHECK_(SHIM_E_, (a) == 0, "The value " #a " is not zero.", __VA_ARGS__)
#define cr_expect_not_zero(a, ...) SHIM_CHECK_(SHIM_E_, (a) != 0, "The value " #a " is zero.", __VA_ARGS__)

#define cr_assert_float_eq(a, b, eps, ...) \
	SHIM_CHECK_(SHIM_A_, shim_float_eq((a), (b), (eps)), "The expression " #a " == " #b " is false (epsilon " #eps ").", __VA_ARGS__)
#define cr_assert_float_neq(a, b, eps, ...) \
	SHIM_CHECK_(SHIM_A_, !shim_float_eq((a), (b), (eps)), "The expression " #a " != " #b " is false (epsilon " #eps ").", __VA_ARGS__)
#define cr_expect_float_eq(a, b, eps, ...) \
	SHIM_CHECK_(SHIM_E_, shim_float_eq((a), (b), (eps)), "The expression " #a " == " #b " is false (epsilon " #eps ").", __VA_ARGS__)
#define cr_expect_float_neq(a, b, eps, ...) \
	SHIM_CHECK_(SHIM_E_, !shim_float_eq((a), (b), (eps)), "The expression " #a " != " #b " is false (epsilon " #eps ").", __VA_ARGS__)

#define cr_assert_str_eq(a, b, ...) SHIM_STR_(SHIM_A_, ==, a, b, __VA_ARGS__)
#define cr_assert_str_neq(a, b, ...) SHIM_STR_(SHIM_A_, !=, a, b, __VA_ARGS__)
#define cr_assert_str_lt(a, b, ...) SHIM_STR_(SHIM_A_, <, a, b, __VA_ARGS__)
#define cr_assert_str_leq(a, b, ...) SHIM_STR_(SHIM_A_, <=, a, b, __VA_ARGS__)
#define cr_assert_str_gt(a, b, ...) SHIM_STR_(SHIM_A_, >, a, b, __VA_ARGS__)
#define cr_assert_str_geq(a, b, ...) SHIM_STR_(SHIM_A_, >=, a, b, __VA_ARGS__)
#define cr_expect_str_eq(a, b, ...) SHIM_STR_(SHIM_E_, ==, a, b, __VA_ARGS__)
#define cr_expect_str_neq(a, b, ...) SHIM_STR_(SHIM_E_, !=, a, b, __VA_ARGS__)
#define cr_expect_str_lt(a, b, ...) SHIM_STR_(SHIM_E_, <, a, b, __VA_ARGS__)
#define cr_expect_str_leq(a, b, ...) SHIM_STR_(SHIM_E_, <=, a, b, __VA_ARGS__)
#define cr_expect_str_gt(a, b, ...) SHIM_STR_(SHIM_E_, >, a, b, __VA_ARGS__)
#define cr_expect_str_geq(a, b, ...) SHIM_STR_(SHIM_E_, >=, a, b, __VA_ARGS__)
#define cr_assert_str_empty(a, ...) SHIM_STR_(SHIM_A_, ==, a, "", __VA_ARGS__)
#define cr_assert_str_not_empty(a, ...) SHIM_STR_(SHIM_A_, !=, a, "", __VA_ARGS__)
#define cr_expect_str_empty(a, ...) SHIM_STR_(SHIM_E_, ==, a, "", __VA_ARGS__)
#define cr_expect_str_not_empty(a, ...) SHIM_STR_(SHIM_E_, !=, a, "", __VA_ARGS__)

#define cr_assert_arr_eq(a, b, size, ...) \
	SHIM_CHECK_(SHIM_A_, memcmp((a), (b), (size)) == 0, "The arrays " #a " and " #b " differ.", __VA_ARGS__)
#define cr_assert_arr_neq(a, b, size, ...) \
	SHIM_CHECK_(SHIM_A_, memcmp((a), (b), (size)) != 0, "The arrays " #a " and " #b " are equal.", __VA_ARGS__)
#define cr_expect_arr_eq(a, b, size, ...) \
	SHIM_CHECK_(SHIM_E_, memcmp((a), (b), (size)) == 0, "The arrays " #a " and " #b " differ.", __VA_ARGS__)
#define cr_expect_arr_neq(a, b, size, ...) \
	SHIM_CHECK_(SHIM_E_, memcmp((a), (b), (size)) != 0, "The arrays " #a " and " #b " are equal.", __VA_ARGS__)
/* clang-format on */

/* Ends the test as skipped (not counted in "Tested", like Criterion). */
#define cr_skip_test(...) shim_skip(__FILE__, __LINE__, " " __VA_ARGS__)

/* ---- logging (info only with --verbose, as in Criterion) ---- */
enum criterion_severity { CR_LOG_INFO, CR_LOG_WARNING, CR_LOG_ERROR };
#define cr_log(severity, ...) shim_log((severity), __VA_ARGS__)
#define cr_log_info(...) shim_log(CR_LOG_INFO, __VA_ARGS__)
#define cr_log_warn(...) shim_log(CR_LOG_WARNING, __VA_ARGS__)
#define cr_log_error(...) shim_log(CR_LOG_ERROR, __VA_ARGS__)

#endif
