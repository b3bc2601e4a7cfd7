/* Unit tests of api/prometheus.c: GET /metrics in the text exposition
 * format 0.0.4: every line a HELP, a TYPE or a sample of a declared
 * family, histograms cumulative with +Inf equal to _count (and, where
 * Debian's promtool is installed, `promtool check metrics` agrees); the
 * request and checkpoint counters as tr_prom_request_done and
 * tr_prom_checkpoint_written feed them, a route's codes past the table's
 * room counted as "other"; jobs by state and the running job's gauges;
 * experiments by state where the daemon offers them;
 * label values escaped.  Over real HTTP against the in-process API of
 * tests/unit/api/fixture.h.  The counters are process-wide, so the tests
 * compare before and after.
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/prometheus.h"
#include "api/routes.h"
#include "tests/unit/api/fixture.h"

TestSuite(api, .init = api_fixture_setup, .fini = api_fixture_teardown, .timeout = 60);

static char *scrape(void)
{
	struct tr_test_reply r = http("GET", "/metrics", NULL);
	char *text;

	cr_assert_eq(r.status, 200, "GET /metrics: %ld %s", r.status, r.body.data ? r.body.data : "");
	cr_assert_str_eq(r.content_type, "text/plain; version=0.0.4; charset=utf-8");
	text = r.body.data;
	r.body.data = NULL;
	resp_free(&r);
	return text;
}

/* The value of the sample whose name and labels are exactly series
 * ("name" or "name{...}"), or NAN when there is none. */
static double sample(const char *text, const char *series)
{
	size_t n = strlen(series);

	for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
		if (strncmp(p, series, n) == 0 && p[n] == ' ')
			return strtod(p + n + 1, NULL);
	return NAN;
}

static const struct tr_api_route *route(const char *method, const char *path)
{
	size_t n;
	const struct tr_api_route *t = tr_api_routes(&n);

	for (size_t i = 0; i < n; i++)
		if (strcmp(t[i].method, method) == 0 && strcmp(t[i].path, path) == 0)
			return &t[i];
	cr_assert_fail("no route %s %s", method, path);
	return NULL;
}

/* The format's rules, checked line by line: a family's TYPE once and
 * before its samples, sample names and labels well formed, values Go's
 * ParseFloat reads, histogram buckets cumulative and ending in +Inf equal
 * to _count. */
static void check_format(const char *text)
{
	regex_t sample_re, help_re, type_re;
	char families[256][96], types[256][16], *copy = strdup(text), *save = NULL;
	int nfam = 0, line_no = 0;
	char hist_series[512] = "";
	double hist_last = -1;

	cr_assert_eq(regcomp(&sample_re,
			     "^([a-zA-Z_:][a-zA-Z0-9_:]*)(\\{[a-zA-Z_][a-zA-Z0-9_]*=\"([^\"\\\\]|\\\\[\\\\\"n])*\""
			     "(,[a-zA-Z_][a-zA-Z0-9_]*=\"([^\"\\\\]|\\\\[\\\\\"n])*\")*\\})? "
			     "(NaN|[+-]Inf|-?[0-9]+(\\.[0-9]+)?([eE][+-]?[0-9]+)?)$",
			     REG_EXTENDED),
		     0);
	cr_assert_eq(regcomp(&help_re, "^# HELP [a-zA-Z_:][a-zA-Z0-9_:]* .+$", REG_EXTENDED), 0);
	cr_assert_eq(regcomp(&type_re, "^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram)$", REG_EXTENDED),
		     0);
	cr_assert(strlen(text) > 0 && text[strlen(text) - 1] == '\n', "the text ends with a newline");
	for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		regmatch_t m[3];

		line_no++;
		if (strncmp(line, "# HELP ", 7) == 0) {
			cr_assert_eq(regexec(&help_re, line, 0, NULL, 0), 0, "line %d: %s", line_no, line);
			continue;
		}
		if (strncmp(line, "# TYPE ", 7) == 0) {
			cr_assert_eq(regexec(&type_re, line, 3, m, 0), 0, "line %d: %s", line_no, line);
			cr_assert_lt(nfam, 256);
			snprintf(families[nfam], sizeof families[nfam], "%.*s", (int)(m[1].rm_eo - m[1].rm_so),
				 line + m[1].rm_so);
			snprintf(types[nfam], sizeof types[nfam], "%.*s", (int)(m[2].rm_eo - m[2].rm_so),
				 line + m[2].rm_so);
			for (int i = 0; i < nfam; i++)
				cr_assert_str_neq(families[i], families[nfam], "line %d: %s declared twice", line_no,
						  families[i]);
			nfam++;
			continue;
		}
		cr_assert_eq(regexec(&sample_re, line, 2, m, 0), 0, "line %d is no sample: %s", line_no, line);
		char name[96];
		snprintf(name, sizeof name, "%.*s", (int)(m[1].rm_eo - m[1].rm_so), line + m[1].rm_so);
		/* The sample belongs to the last family declared. */
		cr_assert_gt(nfam, 0, "line %d: a sample before any TYPE", line_no);
		const char *fam = families[nfam - 1], *type = types[nfam - 1];
		size_t fl = strlen(fam);
		if (strcmp(type, "histogram") == 0) {
			cr_assert(strncmp(name, fam, fl) == 0 &&
					  (!strcmp(name + fl, "_bucket") || !strcmp(name + fl, "_sum") ||
					   !strcmp(name + fl, "_count")),
				  "line %d: %s in histogram %s", line_no, name, fam);
			double v = strtod(strrchr(line, ' ') + 1, NULL);
			char *le = strstr(line, "le=\"");
			if (le) {
				/* The series is the line up to le; buckets climb. */
				char series[512];
				snprintf(series, sizeof series, "%.*s", (int)(le - line), line);
				if (strcmp(series, hist_series) != 0) {
					snprintf(hist_series, sizeof hist_series, "%s", series);
					hist_last = -1;
				}
				cr_assert_geq(v, hist_last, "line %d: buckets must be cumulative: %s", line_no, line);
				hist_last = v;
			} else if (!strcmp(name + fl, "_count")) {
				cr_assert_eq(v, hist_last, "line %d: _count must equal the +Inf bucket", line_no);
			}
		} else {
			cr_assert_str_eq(name, fam, "line %d: sample %s under TYPE %s", line_no, name, fam);
		}
		if (strstr(line, "le=\"+Inf\""))
			cr_assert(strstr(line, "_bucket{"), "line %d", line_no);
	}
	regfree(&sample_re);
	regfree(&help_re);
	regfree(&type_re);
	free(copy);
}

/* promtool's own check and lint, when Debian's prometheus package is
 * installed (tests/e2e/prometheus.sh needs it anyway). */
static void promtool_check(const char *text)
{
	char path[PATH_MAX + 32], cmd[PATH_MAX + 128], out[4096] = "";
	FILE *f, *p;
	size_t n;

	if (system("command -v promtool >/dev/null 2>&1") != 0) {
		cr_log_warn("promtool is not installed: only the built-in format check ran");
		return;
	}
	snprintf(path, sizeof path, "%s/metrics.txt", dir);
	f = fopen(path, "w");
	cr_assert_not_null(f);
	fputs(text, f);
	fclose(f);
	snprintf(cmd, sizeof cmd, "promtool check metrics < '%s' 2>&1", path);
	p = popen(cmd, "r");
	cr_assert_not_null(p);
	n = fread(out, 1, sizeof out - 1, p);
	out[n] = '\0';
	cr_assert_eq(pclose(p), 0, "promtool check metrics: %s", out);
}

Test(api, text_is_valid_exposition_format)
{
	int64_t a = submit("a"), b = submit("b");
	char *text;

	(void)a;
	cr_assert_eq(tr_store_job_set_state(store, b, TR_JOB_RUNNING, NULL, NULL, NULL), 0);
	cr_assert_eq(tr_store_job_set_progress(store, b, 7, 100, 0, 0.25, NULL), 0);
	tr_prom_request_done(route("GET", "/jobs"), 200, 0.002);
	tr_prom_request_done(NULL, 404, 0.0001);
	tr_prom_checkpoint_written(0.3, 4096);
	text = scrape();
	check_format(text);
	promtool_check(text);
	free(text);
}

Test(api, jobs_by_state_and_the_running_jobs_gauges)
{
	int64_t q = submit("queued"), r = submit("running"), d = submit("done");
	char series[128], *text;

	(void)q;
	cr_assert_eq(tr_store_job_set_state(store, r, TR_JOB_RUNNING, NULL, NULL, NULL), 0);
	cr_assert_eq(tr_store_job_set_progress(store, r, 42, 100, 1, 0.5, NULL), 0);
	cr_assert_eq(tr_store_job_set_state(store, d, TR_JOB_RUNNING, NULL, NULL, NULL), 0);
	cr_assert_eq(tr_store_job_set_state(store, d, TR_JOB_COMPLETED, NULL, NULL, NULL), 0);
	text = scrape();
	cr_assert_eq(sample(text, "trainerd_jobs{state=\"queued\"}"), 1, "%s", text);
	cr_assert_eq(sample(text, "trainerd_jobs{state=\"running\"}"), 1);
	cr_assert_eq(sample(text, "trainerd_jobs{state=\"completed\"}"), 1);
	cr_assert_eq(sample(text, "trainerd_jobs{state=\"failed\"}"), 0, "every state has its line");
	cr_assert_eq(sample(text, "trainerd_jobs_submitted_total"), 3);
	snprintf(series, sizeof series, "trainerd_job_step{job_id=\"%" PRId64 "\"}", r);
	cr_assert_eq(sample(text, series), 42, "%s", text);
	snprintf(series, sizeof series, "trainerd_job_loss{job_id=\"%" PRId64 "\"}", r);
	cr_assert_float_eq(sample(text, series), 0.5, 1e-12);
	/* Only running jobs have per-job series: a finished job's vanish. */
	snprintf(series, sizeof series, "job_id=\"%" PRId64 "\"", d);
	cr_assert_null(strstr(text, series), "%s", text);
	cr_assert_eq(sample(text, "trainerd_device_info{device=\"0\",name=\"cpu0\",job_id=\"\"}"), 1, "%s", text);
	cr_assert_eq(sample(text, "trainerd_build_info{version=\"1.2.3-test\"}"), 1);
	free(text);
}

/* A sample of POST /reload's latency histogram (0 when absent):
 * part "bucket" with le, "count" or "sum". */
static double reload_hist(const char *text, const char *part, const char *le)
{
	char s[256];
	double v;

	if (le)
		snprintf(s, sizeof s,
			 "trainerd_http_request_duration_seconds_%s{method=\"POST\",route=\"/reload\",le=\"%s\"}", part,
			 le);
	else
		snprintf(s, sizeof s, "trainerd_http_request_duration_seconds_%s{method=\"POST\",route=\"/reload\"}",
			 part);
	v = sample(text, s);
	return isnan(v) ? 0 : v;
}

static double or0(double v)
{
	return isnan(v) ? 0 : v;
}

Test(api, request_counters_and_latency_histogram)
{
	const struct tr_api_route *rt = route("POST", "/reload");
	const char *c299 = "trainerd_http_requests_total{method=\"POST\",route=\"/reload\",code=\"299\"}";
	const char *c418 = "trainerd_http_requests_total{method=\"POST\",route=\"/reload\",code=\"418\"}";
	const char *unm = "trainerd_http_requests_total{method=\"other\",route=\"unmatched\",code=\"404\"}";
	static const char *const les[] = {"0.0025", "0.005", "10", "+Inf"};
	/* What the requests below add to each bucket: the NaN one (as 0 s)
	 * in all, 0.003 s and 0.005 s (a bound is in its own bucket: le)
	 * from 0.005, 20 s (past the last bound) in +Inf only. */
	static const double added[] = {1, 3, 3, 4};
	double before_b[4], before_count, before_sum, b299, bunm;
	char *before, *after;

	before = scrape();
	for (int i = 0; i < 4; i++)
		before_b[i] = reload_hist(before, "bucket", les[i]);
	before_count = reload_hist(before, "count", NULL);
	before_sum = reload_hist(before, "sum", NULL);
	b299 = or0(sample(before, c299));
	bunm = or0(sample(before, unm));

	tr_prom_request_done(rt, 299, 0.003);
	tr_prom_request_done(rt, 299, 0.005);
	tr_prom_request_done(rt, 418, 20);
	tr_prom_request_done(rt, 418, NAN);
	tr_prom_request_done(NULL, 404, 0.001);
	after = scrape();
	cr_assert_eq(sample(after, c299) - b299, 2, "%s", after);
	cr_assert_eq(sample(after, c418), 2, "%s", after);
	cr_assert_eq(sample(after, unm) - bunm, 1, "%s", after);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(reload_hist(after, "bucket", les[i]) - before_b[i], added[i], "le=%s: %s", les[i], after);
	cr_assert_eq(reload_hist(after, "count", NULL) - before_count, 4);
	cr_assert_float_eq(reload_hist(after, "sum", NULL) - before_sum, 20.008, 1e-9);
	check_format(after);
	free(before);
	free(after);
}

Test(api, codes_past_the_room_are_counted_as_other)
{
	const struct tr_api_route *rt = route("DELETE", "/datasets/{name}");
	const char *pre = "trainerd_http_requests_total{method=\"DELETE\",route=\"/datasets/{name}\",code=";
	char s[256], *text;
	int named = 0;

	/* 20 distinct codes, the first one twice. */
	for (int c = 0; c < 20; c++)
		tr_prom_request_done(rt, 520 + c, 0.01);
	tr_prom_request_done(rt, 520, 0.01);
	text = scrape();
	for (int c = 0; c < 20; c++) {
		snprintf(s, sizeof s, "%s\"%d\"}", pre, 520 + c);
		if (!isnan(sample(text, s)))
			named++;
	}
	cr_assert_eq(named, 15, "15 codes keep their own series: %s", text);
	snprintf(s, sizeof s, "%s\"520\"}", pre);
	cr_assert_eq(sample(text, s), 2);
	snprintf(s, sizeof s, "%s\"other\"}", pre);
	cr_assert_eq(sample(text, s), 5, "the other 5 codes: %s", text);
	check_format(text);
	free(text);
}

Test(api, checkpoint_counters)
{
	const char *h = "trainerd_checkpoint_write_duration_seconds";
	char s[160], *before, *after;
	double b[4];

	before = scrape();
	snprintf(s, sizeof s, "%s_bucket{le=\"0.25\"}", h);
	b[0] = sample(before, s);
	snprintf(s, sizeof s, "%s_bucket{le=\"120\"}", h);
	b[1] = sample(before, s);
	snprintf(s, sizeof s, "%s_count", h);
	b[2] = sample(before, s);
	b[3] = sample(before, "trainerd_checkpoint_bytes_total");
	tr_prom_checkpoint_written(0.2, 1000);
	tr_prom_checkpoint_written(100, 24);
	after = scrape();
	snprintf(s, sizeof s, "%s_bucket{le=\"0.25\"}", h);
	cr_assert_eq(sample(after, s) - b[0], 1, "%s", after);
	snprintf(s, sizeof s, "%s_bucket{le=\"120\"}", h);
	cr_assert_eq(sample(after, s) - b[1], 2);
	snprintf(s, sizeof s, "%s_count", h);
	cr_assert_eq(sample(after, s) - b[2], 2);
	cr_assert_eq(sample(after, "trainerd_checkpoint_bytes_total") - b[3], 1024);
	free(before);
	free(after);
}

Test(api, label_values_are_escaped)
{
	struct start_opts o = {.version = "1.0 \"beta\"\\x\nnext"};
	char *text;

	restart(&o);
	text = scrape();
	cr_assert_eq(sample(text, "trainerd_build_info{version=\"1.0 \\\"beta\\\"\\\\x\\nnext\"}"), 1, "%s", text);
	check_format(text);
	free(text);
}

/* ---- experiments by state ---- */

/* What the fake experiment_counts op answers: counts by state, or a
 * failure. */
static int64_t exp_counts[TR_EXP_NSTATES];
static bool exp_fail;

static int fake_experiment_counts(void *ctx, int64_t *counts, struct tr_error *err)
{
	(void)ctx;
	if (exp_fail) {
		snprintf(err->message, sizeof err->message, "experiments unreadable");
		return -1;
	}
	memcpy(counts, exp_counts, sizeof exp_counts);
	return 0;
}

static void with_experiments(struct tr_api_config *cfg)
{
	cfg->ops.experiment_counts = fake_experiment_counts;
}

Test(api, experiments_by_state)
{
	struct start_opts o = {.tweak = with_experiments};
	char series[128], *text;
	struct tr_test_reply r;

	/* A daemon without experiments leaves the family out. */
	text = scrape();
	cr_assert_null(strstr(text, "trainerd_experiments"), "%s", text);
	free(text);

	restart(&o);
	for (int i = 0; i < TR_EXP_NSTATES; i++)
		exp_counts[i] = 10 * i + 3;
	text = scrape();
	check_format(text);
	promtool_check(text);
	/* Every state on its own line, with its own count. */
	for (int i = 0; i < TR_EXP_NSTATES; i++) {
		snprintf(series, sizeof series, "trainerd_experiments{state=\"%s\"}",
			 tr_experiment_state_name((enum tr_experiment_state)i));
		cr_assert_eq(sample(text, series), 10 * i + 3, "%s in %s", series, text);
	}
	cr_assert_not_null(strstr(text, "# TYPE trainerd_experiments gauge\n"), "%s", text);
	free(text);

	/* Unreadable counts fail the scrape (as unreadable jobs do), saying why. */
	exp_fail = true;
	r = http("GET", "/metrics", NULL);
	exp_fail = false;
	expect_status(&r, 500, "experiments unreadable");
	cr_assert_not_null(strstr(jstr(r.json, "error.message"), "experiments unreadable"), "%s", r.body.data);
	resp_free(&r);
}
