/* Runner of the Criterion stand-in (tests/shim/criterion/criterion.h): runs
 * every registered test in its own fork()ed child, one after another, and
 * ends with Criterion's "[====] Synthesis: ..." line.  The parent never
 * starts a thread, so children may fork safely under ThreadSanitizer.
 *
 * Options: --verbose (also show cr_log_info and the start of each test),
 * --filter=GLOB or --filter GLOB (fnmatch on "suite/name"). */
#include <criterion/criterion.h>

#include <errno.h>
#include <fnmatch.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const struct shim_suite **suites;
static size_t nsuites;
static const struct shim_test **tests;
static size_t ntests;

/* Written by the child, read by the parent once the child is gone. */
struct shim_status {
	atomic_int failed;
	atomic_int skipped;
};
static struct shim_status *status;

static bool verbose;
static bool in_child;
static pthread_t test_thread; /* the child's thread that runs init/test/fini */
static jmp_buf abort_jb;

/* Grows a registration array (called from constructors only). */
static void *grow(void *arr, size_t n, size_t *cap, size_t size)
{
	if (n < *cap)
		return arr;
	*cap = *cap ? *cap * 2 : 16;
	arr = realloc(arr, *cap * size);
	if (!arr) {
		perror("criterion shim");
		exit(2);
	}
	return arr;
}

void shim_register_suite(const struct shim_suite *s)
{
	static size_t cap;

	suites = grow(suites, nsuites, &cap, sizeof(*suites));
	suites[nsuites++] = s;
}

void shim_register_test(const struct shim_test *t)
{
	static size_t cap;

	tests = grow(tests, ntests, &cap, sizeof(*tests));
	tests[ntests++] = t;
}

static void report(const char *file, int line, const char *kind, const char *dflt, const char *fmt, va_list ap)
{
	char *msg = NULL;

	/* The macros prefix the caller's format with one space. */
	if (fmt[0] && fmt[1]) {
		if (vasprintf(&msg, fmt + 1, ap) < 0)
			msg = NULL;
	}
	fprintf(stderr, "[----] %s:%d: %s\n[----]   %s\n", file, line, kind, msg ? msg : dflt);
	free(msg);
}

/* Ends the running test: back to the child's runner on its own thread, a
 * plain exit on any other (the parent reads the outcome from `status`). */
static __attribute__((noreturn)) void abort_test(void)
{
	if (in_child && pthread_equal(pthread_self(), test_thread))
		longjmp(abort_jb, 1);
	fflush(NULL);
	_exit(status && atomic_load(&status->failed) ? 1 : 0);
}

void shim_assert_failed(const char *file, int line, const char *dflt, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	report(file, line, "Assertion Failed", dflt, fmt, ap);
	va_end(ap);
	if (status)
		atomic_store(&status->failed, 1);
	abort_test();
}

void shim_expect_failed(const char *file, int line, const char *dflt, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	report(file, line, "Expectation Failed", dflt, fmt, ap);
	va_end(ap);
	if (status)
		atomic_store(&status->failed, 1);
}

void shim_skip(const char *file, int line, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	report(file, line, "Test skipped", "(no reason given)", fmt, ap);
	va_end(ap);
	if (status)
		atomic_store(&status->skipped, 1);
	abort_test();
}

void shim_log(int level, const char *fmt, ...)
{
	static const char *const tag[] = {"----", "WARN", "ERR "};
	va_list ap;

	if (level == CR_LOG_INFO && !verbose)
		return;
	if (level < CR_LOG_INFO || level > CR_LOG_ERROR)
		level = CR_LOG_ERROR;
	flockfile(stderr);
	fprintf(stderr, "[%s] ", tag[level]);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	funlockfile(stderr);
}

bool shim_float_eq(long double a, long double b, long double eps)
{
	/* Criterion's definition: false for NaNs. */
	return b - a <= eps && a - b <= eps;
}

bool shim_str_cmp(const char *a, const char *b, int *out)
{
	*out = 0;
	if (!a || !b) {
		fprintf(stderr, "[----] string check on a null pointer (%s vs %s)\n", a ? "string" : "NULL",
			b ? "string" : "NULL");
		return false;
	}
	*out = strcmp(a, b);
	return true;
}

static const struct shim_suite *find_suite(const char *name)
{
	const struct shim_suite *s = NULL;

	for (size_t k = 0; k < nsuites; k++)
		if (!strcmp(suites[k]->shim_name_, name))
			s = suites[k];
	return s;
}

static int by_name(const void *a, const void *b)
{
	const struct shim_test *x = *(const struct shim_test *const *)a, *y = *(const struct shim_test *const *)b;
	int c = strcmp(x->shim_suite_, y->shim_suite_);

	return c ? c : strcmp(x->shim_name_, y->shim_name_);
}

/* What the child runs; statics rather than locals because of setjmp. */
static const struct shim_test *cur_test;
static const struct shim_suite *cur_suite;
static void *cur_param;

static __attribute__((noreturn)) void child_main(double timeout)
{
	in_child = true;
	test_thread = pthread_self();
	if (timeout > 0) {
		struct itimerval it = {0};
		it.it_value.tv_sec = (time_t)timeout;
		it.it_value.tv_usec = (suseconds_t)((timeout - (double)(time_t)timeout) * 1e6);
		if (it.it_value.tv_sec == 0 && it.it_value.tv_usec == 0)
			it.it_value.tv_usec = 1;
		signal(SIGALRM, SIG_DFL);
		setitimer(ITIMER_REAL, &it, NULL);
	}
	if (setjmp(abort_jb) == 0) {
		if (cur_suite && cur_suite->init)
			cur_suite->init();
		if (cur_test->init)
			cur_test->init();
		if (cur_test->shim_pfn_)
			cur_test->shim_pfn_(cur_param);
		else
			cur_test->shim_fn_();
	}
	if (setjmp(abort_jb) == 0) {
		if (cur_test->fini)
			cur_test->fini();
		if (cur_suite && cur_suite->fini)
			cur_suite->fini();
	}
	fflush(NULL);
	exit(0);
}

enum outcome { PASSED, FAILED, CRASHED, SKIPPED };

/* The stand-in runs only in ThreadSanitizer builds, where instrumented code
 * runs 5-15 times slower: a test's .timeout, written for the plain build,
 * is given this many times over (the plain build keeps it as written). */
#define TIMEOUT_SCALE 5

static enum outcome run_one(const struct shim_test *t, const struct shim_suite *s, void *param, const char *label)
{
	double timeout = TIMEOUT_SCALE * (t->timeout > 0 ? t->timeout : (s && s->timeout > 0 ? s->timeout : 0));
	int expect_sig = t->signal ? t->signal : (s ? s->signal : 0);
	int expect_code = t->exit_code ? t->exit_code : (s ? s->exit_code : 0);
	struct timespec t0, t1;
	enum outcome res;
	int st;
	pid_t pid;

	atomic_store(&status->failed, 0);
	atomic_store(&status->skipped, 0);
	cur_test = t;
	cur_suite = s;
	cur_param = param;
	if (verbose)
		fprintf(stderr, "[RUN ] %s\n", label);
	fflush(NULL);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	pid = fork();
	if (pid < 0) {
		perror("criterion shim: fork");
		exit(2);
	}
	if (pid == 0)
		child_main(timeout);
	while (waitpid(pid, &st, 0) < 0) {
		if (errno != EINTR) {
			perror("criterion shim: waitpid");
			exit(2);
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	bool failed = atomic_load(&status->failed);

	if (WIFSIGNALED(st)) {
		int sig = WTERMSIG(st);
		if (sig == expect_sig && !failed) {
			res = PASSED;
		} else if (sig == SIGALRM && timeout > 0) {
			fprintf(stderr, "[----] %s: timed out after %gs\n", label, timeout);
			res = CRASHED;
		} else {
			fprintf(stderr, "[----] %s: killed by signal %d (%s)\n", label, sig, strsignal(sig));
			res = CRASHED;
		}
	} else {
		int code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
		if (failed) {
			res = FAILED;
		} else if (atomic_load(&status->skipped)) {
			res = SKIPPED;
		} else if (expect_sig) {
			fprintf(stderr, "[----] %s: exited with status %d, expected signal %d\n", label, code,
				expect_sig);
			res = FAILED;
		} else if (code != expect_code) {
			fprintf(stderr, "[----] %s: exited with status %d%s\n", label, code,
				code == 66 ? " (ThreadSanitizer found a problem, see above)" : "");
			res = FAILED;
		} else {
			res = PASSED;
		}
	}
	static const char *const tag[] = {"PASS", "FAIL", "CRASH", "SKIP"};
	fprintf(stderr, "[%s] %s: (%.2fs)\n", tag[res], label, took);
	return res;
}

int main(int argc, char **argv)
{
	const char *filter = NULL;
	size_t count[4] = {0};
	char label[512];

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--verbose") || !strncmp(argv[i], "--verbose=", 10) || !strcmp(argv[i], "-v"))
			verbose = true;
		else if (!strncmp(argv[i], "--filter=", 9))
			filter = argv[i] + 9;
		else if (!strcmp(argv[i], "--filter") && i + 1 < argc)
			filter = argv[++i];
		else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			printf("usage: %s [--verbose] [--filter=SUITE/NAME-GLOB]\n", argv[0]);
			return 0;
		} else
			fprintf(stderr, "criterion shim: ignoring option %s\n", argv[i]);
	}
	status = mmap(NULL, sizeof(*status), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (status == MAP_FAILED) {
		perror("criterion shim: mmap");
		return 2;
	}
	if (ntests > 1)
		qsort(tests, ntests, sizeof(*tests), by_name);
	for (size_t i = 0; i < ntests; i++) {
		const struct shim_test *t = tests[i];
		const struct shim_suite *s = find_suite(t->shim_suite_);

		snprintf(label, sizeof label, "%s/%s", t->shim_suite_, t->shim_name_);
		if (filter && fnmatch(filter, label, 0) != 0)
			continue;
		snprintf(label, sizeof label, "%s::%s", t->shim_suite_, t->shim_name_);
		if (t->disabled || (s && s->disabled)) {
			fprintf(stderr, "[SKIP] %s: test is disabled\n", label);
			count[SKIPPED]++;
			continue;
		}
		if (!t->shim_params_) {
			count[run_one(t, s, NULL, label)]++;
			continue;
		}
		struct criterion_test_params p = t->shim_params_();
		for (size_t k = 0; k < p.length; k++) {
			snprintf(label, sizeof label, "%s::%s[%zu]", t->shim_suite_, t->shim_name_, k);
			count[run_one(t, s, (char *)p.params + k * p.size, label)]++;
		}
		if (p.cleanup)
			p.cleanup(&p);
	}
	fprintf(stderr, "[====] Synthesis: Tested: %zu | Passing: %zu | Failing: %zu | Crashing: %zu \n",
		count[PASSED] + count[FAILED] + count[CRASHED], count[PASSED], count[FAILED], count[CRASHED]);
	return count[FAILED] + count[CRASHED] ? 1 : 0;
}
