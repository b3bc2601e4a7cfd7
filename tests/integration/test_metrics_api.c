/* The read side a dashboard uses, over HTTP against a real daemon:
 * downsampled series (first and last points kept, per-bucket min/max,
 * "downsampled"), the default and the cap on series sizes, streamed large
 * answers with bounded memory, incremental polls, the job summary and
 * GET /jobs?fields=. */
#include <criterion/criterion.h>
#include <curl/curl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define SMALL_JOB(name)                                                                                        \
	"{\"name\": \"" name "\", \"seed\": 3, \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 16}," \
	" {\"type\": \"relu\"}, {\"type\": \"dense\", \"units\": 3}]}, \"data\": {\"train\": {\"format\":"     \
	" \"synthetic\", \"samples\": 640, \"features\": 6, \"classes\": 3},"                                  \
	" \"validation_split\": 0.1}, \"batch_size\": 32, \"epochs\": 2, \"optimizer\": {\"type\": \"adam\","  \
	" \"lr\": 0.01}}"

static struct daemon d;

static void start1(void)
{
	daemon_start(&d, 1, NULL);
}

static void stop1(void)
{
	daemon_cleanup(&d);
}

/* Pushes value(i) at steps first, first + stride, ... (n points), 10,000
 * per request, and waits until the last one is readable. */
static void push_series(long long id, const char *name, long long first, long long stride, long n,
			double (*value)(long i))
{
	size_t cap = 64 * 10000 + 64;
	char *body = malloc(cap), path[96];
	snprintf(path, sizeof path, "/jobs/%lld/metrics", id);
	for (long at = 0; at < n; at += 10000) {
		size_t len = (size_t)snprintf(body, cap, "{\"points\":[");
		for (long i = at; i < n && i < at + 10000; i++)
			len += (size_t)snprintf(body + len, cap - len,
						"%s{\"name\":\"%s\",\"step\":%lld,\"value\":%.9g}", i > at ? "," : "",
						name, first + i * stride, value(i));
		snprintf(body + len, cap - len, "]}");
		/* Bodies this size are not worth recording. */
		struct tr_test_request rq = {.base_url = d.base_url,
					     .method = "POST",
					     .path = path,
					     .body = body,
					     .no_expect = true,
					     .timeout_s = 60,
					     .no_record = true};
		struct tr_test_reply r;
		tr_test_http(&rq, &r);
		cr_assert_eq(r.status, 202, "push of %s at %ld: %s", name, at, r.body.data ? r.body.data : "");
		tr_test_reply_free(&r);
	}
	free(body);
	/* Visible after the writer's next flush. */
	snprintf(path, sizeof path, "/jobs/%lld/metrics?names=%s&from_step=%lld", id, name, first + (n - 1) * stride);
	double t0 = now_s();
	for (;;) {
		struct http_reply r;
		http(&d, "GET", path, NULL, NULL, NULL, &r);
		json_t *steps = json_object_get(json_object_get(json_object_get(r.json, "series"), name), "steps");
		long long last = json_integer_value(json_array_get(steps, 0));
		size_t k = json_array_size(steps);
		http_free(&r);
		if (k == 1 && last == first + (n - 1) * stride)
			break;
		cr_assert_lt(now_s() - t0, 20 * TR_TEST_SLOW, "%s: pushed points not visible (%s)", name, path);
		usleep(50000);
	}
}

static double wave(long i)
{
	return sin(i * 0.001) + (i % 97) * 1e-3;
}

static double accuracy(long i)
{
	return i == 76 ? 0.99 : 0.5 + (i % 7) * 0.01; /* the best at step 988 */
}

static json_t *series(const struct http_reply *r, const char *name)
{
	return json_object_get(json_object_get(r->json, "series"), name);
}

static long long step_at(json_t *ser, size_t i)
{
	return json_integer_value(json_array_get(json_object_get(ser, "steps"), i));
}

static size_t npoints(json_t *ser)
{
	return json_array_size(json_object_get(ser, "steps"));
}

static long long finished_job(void)
{
	long long id = submit_job(&d, SMALL_JOB("holder"));
	cr_assert_str_eq(wait_state(&d, id, "completed|failed", 60), "completed");
	return id;
}

/* The contract the dashboard draws from: every downsampled series keeps
 * its first and last points (max_points=3 of a 2,600-step val_accuracy
 * once ended at step 988), carries min/max arrays as long as its steps,
 * and says whether it was downsampled. */
Test(metrics_api, downsampled_series_keep_ends_and_envelope, .init = start1, .fini = stop1, .timeout = 120)
{
	long long id = finished_job();
	char path[160];
	/* Steps 0, 13, ..., 2600 (201 points), the best value at step 988. */
	push_series(id, "eval.accuracy", 0, 13, 201, accuracy);
	for (int m = 1; m <= 12; m++) {
		struct http_reply r;
		snprintf(path, sizeof path, "/jobs/%lld/metrics?names=eval.accuracy&max_points=%d", id, m);
		http(&d, "GET", path, NULL, NULL, NULL, &r);
		cr_assert_eq(r.status, 200);
		json_t *ser = series(&r, "eval.accuracy");
		size_t n = npoints(ser);
		cr_assert(n >= 1 && n <= (size_t)m, "max_points=%d: %zu points", m, n);
		cr_assert_eq(step_at(ser, n - 1), 2600, "max_points=%d ends at step %lld", m, step_at(ser, n - 1));
		if (m >= 2)
			cr_assert_eq(step_at(ser, 0), 0, "max_points=%d starts at %lld", m, step_at(ser, 0));
		cr_assert(json_is_true(json_object_get(ser, "downsampled")));
		json_t *mins = json_object_get(ser, "min"), *maxs = json_object_get(ser, "max");
		cr_assert_eq(json_array_size(mins), n);
		cr_assert_eq(json_array_size(maxs), n);
		bool best = false;
		for (size_t i = 0; i < n; i++) {
			double v = json_number_value(json_array_get(json_object_get(ser, "values"), i));
			double lo = json_number_value(json_array_get(mins, i));
			double hi = json_number_value(json_array_get(maxs, i));
			cr_assert(lo <= v && v <= hi, "max_points=%d point %zu: %g outside [%g, %g]", m, i, v, lo, hi);
			best |= hi == 0.99;
		}
		cr_assert(best, "max_points=%d: the best value (step 988) is in no bucket's max", m);
		http_free(&r);
	}
	/* Not downsampled: all points, no min/max. */
	struct http_reply r;
	snprintf(path, sizeof path, "/jobs/%lld/metrics?names=eval.accuracy&max_points=201", id);
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	json_t *ser = series(&r, "eval.accuracy");
	cr_assert_eq(npoints(ser), 201);
	cr_assert(json_is_false(json_object_get(ser, "downsampled")));
	cr_assert_null(json_object_get(ser, "min"));
	cr_assert_null(json_object_get(ser, "max"));
	http_free(&r);
	/* Zoom: a step range at full resolution. */
	snprintf(path, sizeof path, "/jobs/%lld/metrics?names=eval.accuracy&from_step=900&to_step=1100", id);
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	ser = series(&r, "eval.accuracy");
	cr_assert_eq(npoints(ser), 15); /* 910, 923, ..., 1092 */
	cr_assert_eq(step_at(ser, 0), 910);
	http_free(&r);
}

/* Without max_points a series comes downsampled to 2,000 points; polling
 * from the last step seen + 1 returns only the new points. */
Test(metrics_api, default_size_and_incremental_polls, .init = start1, .fini = stop1, .timeout = 120)
{
	long long id = finished_job();
	char path[160];
	push_series(id, "big", 0, 1, 30000, wave);
	struct http_reply r;
	snprintf(path, sizeof path, "/jobs/%lld/metrics?names=big", id);
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200);
	cr_assert_eq(json_integer_value(json_object_get(r.json, "max_points")), 2000);
	json_t *ser = series(&r, "big");
	cr_assert(npoints(ser) > 1000 && npoints(ser) <= 2000, "%zu points", npoints(ser));
	cr_assert_eq(step_at(ser, npoints(ser) - 1), 29999);
	cr_assert(json_is_true(json_object_get(ser, "downsampled")));
	http_free(&r);
	long long seen = 29999;
	for (int round = 0; round < 3; round++) {
		push_series(id, "big", seen + 1, 1, 500, wave);
		snprintf(path, sizeof path, "/jobs/%lld/metrics?names=big&from_step=%lld", id, seen + 1);
		http(&d, "GET", path, NULL, NULL, NULL, &r);
		ser = series(&r, "big");
		cr_assert_eq(npoints(ser), 500, "round %d", round);
		cr_assert_eq(step_at(ser, 0), seen + 1);
		cr_assert(json_is_false(json_object_get(ser, "downsampled")));
		seen = step_at(ser, 499);
		http_free(&r);
	}
	snprintf(path, sizeof path, "/jobs/%lld/metrics?names=big&from_step=%lld", id, seen + 1);
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200);
	cr_assert_eq(json_object_size(json_object_get(r.json, "series")), 0, "nothing new, no series");
	http_free(&r);
}

/* ---- large answers ---- */

struct big_get {
	const char *url;
	long status;
	size_t bytes;
	json_t *json;
	char *buf;
	size_t len;
	bool keep;
};

static size_t big_body(char *p, size_t size, size_t n, void *ud)
{
	struct big_get *g = ud;
	size_t len = size * n;
	g->bytes += len;
	if (g->keep) {
		g->buf = realloc(g->buf, g->len + len + 1);
		memcpy(g->buf + g->len, p, len);
		g->len += len;
		g->buf[g->len] = 0;
	}
	return len;
}

static void *big_get_run(void *cls)
{
	struct big_get *g = cls;
	/* Run from threads of their own: the result is checked by status.
	 * The whole URL is the base (its body goes to big_body, so the
	 * exchange is not recorded under that empty path). */
	CURLcode rc;
	struct tr_test_request rq = {.base_url = g->url,
				     .method = "GET",
				     .path = "",
				     .recv_fn = big_body,
				     .recv_cls = g,
				     .timeout_s = 120,
				     .result = &rc};
	struct tr_test_reply r;
	tr_test_http(&rq, &r);
	if (rc == CURLE_OK)
		g->status = r.status;
	tr_test_reply_free(&r);
	if (g->keep && g->buf)
		g->json = json_loadb(g->buf, g->len, 0, NULL);
	return NULL;
}

/* The daemon's anonymous resident memory (RssAnon), in MiB: what the
 * process itself holds.  Its file-backed pages (the database read through
 * a mapping) are the kernel's page cache and not counted. */
static double anon_mib(pid_t pid)
{
	char path[64], line[256];
	double kib = -1;
	snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f);
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "RssAnon: %lf", &kib) == 1)
			break;
	fclose(f);
	return kib / 1024;
}

struct sampler {
	pid_t pid;
	atomic_bool stop;
	double peak;
};

/* Samples RssAnon every 2 ms until told to stop: its peak meanwhile. */
static void *sample_anon(void *cls)
{
	struct sampler *sm = cls;
	while (!atomic_load(&sm->stop)) {
		double v = anon_mib(sm->pid);
		if (v > sm->peak)
			sm->peak = v;
		usleep(2000);
	}
	return NULL;
}

/* max_points=0 means every point only up to 100,000 per series (400
 * naming the series above); such answers are streamed, so eight at once
 * do not hold eight whole answers in memory (before: 265 MB of RSS for one
 * 61 MB answer, 1.5 GB for eight). */
Test(metrics_api, every_point_is_capped_and_streamed, .init = start1, .fini = stop1, .timeout = 300)
{
	long long id = finished_job();
	char path[200], url[300];
	push_series(id, "a", 0, 1, 100000, wave);
	push_series(id, "b", 0, 1, 100000, wave);
	push_series(id, "c", 0, 1, 100001, wave);

	struct http_reply r;
	snprintf(path, sizeof path, "/jobs/%lld/metrics?max_points=0", id);
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 400);
	const char *msg = json_string_value(json_object_get(json_object_get(r.json, "error"), "message"));
	cr_assert(msg && strstr(msg, "max_points") && strstr(msg, "\"c\" has 100001 points"), "%s", msg);
	http_free(&r);
	snprintf(path, sizeof path, "/jobs/%lld/metrics?max_points=100001", id);
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 400);
	http_free(&r);

	/* One whole answer, checked point by point. */
	snprintf(url, sizeof url, "%s/jobs/%lld/metrics?names=a,b,c&max_points=0&to_step=99999", d.base_url, id);
	struct big_get one = {.url = url, .keep = true};
	big_get_run(&one);
	cr_assert_eq(one.status, 200);
	cr_assert_not_null(one.json, "the streamed body is not JSON (%zu bytes)", one.len);
	const char *names[] = {"a", "b", "c"};
	for (int k = 0; k < 3; k++) {
		json_t *ser = json_object_get(json_object_get(one.json, "series"), names[k]);
		cr_assert_eq(npoints(ser), 100000, "%s", names[k]);
		cr_assert(json_is_false(json_object_get(ser, "downsampled")));
		json_t *values = json_object_get(ser, "values");
		for (long i = 0; i < 100000; i += 997) {
			cr_assert_eq(step_at(ser, (size_t)i), i);
			cr_assert_float_eq(json_number_value(json_array_get(values, (size_t)i)), wave(i), 1e-8);
		}
	}
	double bytes_one = (double)one.len;
	json_decref(one.json);
	free(one.buf);

	/* Eight at once: the daemon's memory grows by far less than eight
	 * answers built whole (as JSON values, ~40 MiB each for these 300,000
	 * points, 300 MiB or more for eight; streamed, a request holds one
	 * series' text, and at most two read a series at a time: 54-66 MiB
	 * measured, allocator slack included). */
	struct sampler sm = {.pid = d.pid};
	pthread_t sth;
	double before = anon_mib(d.pid);
	atomic_init(&sm.stop, false);
	sm.peak = before;
	pthread_create(&sth, NULL, sample_anon, &sm);
	/* Eight different queries (distinct to_step), as eight clients would
	 * send: identical ones would share one computation. */
	struct big_get g[8];
	pthread_t th[8];
	char urls[8][300];
	for (int i = 0; i < 8; i++) {
		snprintf(urls[i], sizeof urls[i], "%s/jobs/%lld/metrics?names=a,b,c&max_points=0&to_step=%d",
			 d.base_url, id, 99999 - i);
		g[i] = (struct big_get){.url = urls[i]};
		pthread_create(&th[i], NULL, big_get_run, &g[i]);
	}
	for (int i = 0; i < 8; i++)
		pthread_join(th[i], NULL);
	atomic_store(&sm.stop, true);
	pthread_join(sth, NULL);
	for (int i = 0; i < 8; i++) {
		cr_assert_eq(g[i].status, 200);
		cr_assert((double)g[i].bytes > 0.99 * bytes_one && (double)g[i].bytes <= bytes_one, "%zu bytes",
			  g[i].bytes);
	}
	fprintf(stderr, "[metrics_api] 8 x %.1f MB answers: anonymous RSS %.0f MiB, peak %.0f MiB\n", bytes_one / 1e6,
		before, sm.peak);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
	/* (A sanitizer build's daemon keeps freed memory in quarantine.) */
	cr_assert_lt(sm.peak - before, 160, "anonymous RSS grew %.0f MiB for 8 answers of %.1f MiB", sm.peak - before,
		     bytes_one / (1 << 20));
#endif
	struct http_reply h;
	http(&d, "GET", "/healthz", NULL, NULL, NULL, &h);
	cr_assert_eq(h.status, 200);
	http_free(&h);
}

/* ---- the job's summary and lists without the spec ---- */

static bool is_num_or_null(json_t *v)
{
	return v && (json_is_number(v) || json_is_null(v));
}

Test(metrics_api, summary_and_fields, .init = start1, .fini = stop1, .timeout = 120)
{
	long long id = finished_job();
	char path[160];
	struct http_reply r;
	snprintf(path, sizeof path, "/jobs/%lld", id);
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200);
	json_t *sum = json_object_get(r.json, "summary");
	cr_assert(json_is_object(sum), "%s", r.body);
	const char *keys[] = {"loss", "epoch_loss", "val_loss", "val_accuracy", "samples_per_sec", "data_wait_fraction",
			      "step"};
	for (size_t i = 0; i < 7; i++)
		cr_assert(is_num_or_null(json_object_get(sum, keys[i])), "summary.%s", keys[i]);
	/* A completed classification job with validation knows them all. */
	cr_assert_eq(json_integer_value(json_object_get(sum, "step")),
		     json_integer_value(json_object_get(json_object_get(r.json, "progress"), "total_steps")));
	cr_assert(json_number_value(json_object_get(sum, "loss")) > 0);
	double acc = json_number_value(json_object_get(sum, "val_accuracy"));
	cr_assert(acc >= 0 && acc <= 1 && json_is_real(json_object_get(sum, "val_accuracy")));
	cr_assert(json_is_real(json_object_get(sum, "val_loss")));
	cr_assert(json_number_value(json_object_get(sum, "samples_per_sec")) > 0);
	double wait = json_number_value(json_object_get(sum, "data_wait_fraction"));
	cr_assert(json_is_real(json_object_get(sum, "data_wait_fraction")) && wait >= 0 && wait <= 1);
	/* The stored figures (read together in one transaction) are each
	 * their own series' last point. */
	json_t *stored = json_deep_copy(sum);
	http_free(&r);
	const char *last_of[] = {"val_loss", "val_accuracy", "data_wait_ms"};
	for (size_t i = 0; i < 3; i++) {
		snprintf(path, sizeof path, "/jobs/%lld/metrics?names=%s&max_points=2", id, last_of[i]);
		http(&d, "GET", path, NULL, NULL, NULL, &r);
		cr_assert_eq(r.status, 200, "%s", r.body);
		json_t *values =
			json_object_get(json_object_get(json_object_get(r.json, "series"), last_of[i]), "values");
		cr_assert_gt(json_array_size(values), 0, "%s: %s", last_of[i], r.body);
		double want = json_number_value(json_array_get(values, json_array_size(values) - 1));
		cr_assert(json_is_real(json_object_get(stored, last_of[i])), "summary.%s", last_of[i]);
		cr_assert_float_eq(json_number_value(json_object_get(stored, last_of[i])), want,
				   1e-9 * (1 + fabs(want)), "summary.%s is not the series' last point %g", last_of[i],
				   want);
		http_free(&r);
	}
	/* Whole-run figures: samples over the recorded steps' time, not the
	 * last step's throughput; the newest epoch's mean loss. */
	snprintf(path, sizeof path, "/jobs/%lld/metrics?names=samples_per_sec,step_ms,loss&max_points=0&epochs=true",
		 id);
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	json_t *sps = json_object_get(series(&r, "samples_per_sec"), "values");
	json_t *ms = json_object_get(series(&r, "step_ms"), "values");
	json_t *loss = json_object_get(series(&r, "loss"), "values");
	json_t *loss_epochs = json_object_get(series(&r, "loss"), "epochs");
	cr_assert_eq(json_array_size(sps), json_array_size(ms));
	double samples = 0, time_ms = 0, last_epoch_sum = 0;
	for (size_t k = 0; k < json_array_size(sps); k++) {
		samples += json_number_value(json_array_get(sps, k)) * json_number_value(json_array_get(ms, k));
		time_ms += json_number_value(json_array_get(ms, k));
	}
	json_int_t last_epoch = json_integer_value(json_array_get(loss_epochs, json_array_size(loss_epochs) - 1));
	int in_last = 0;
	for (size_t k = 0; k < json_array_size(loss); k++)
		if (json_integer_value(json_array_get(loss_epochs, k)) == last_epoch) {
			last_epoch_sum += json_number_value(json_array_get(loss, k));
			in_last++;
		}
	cr_assert_gt(in_last, 1, "%s", r.body);
	http_free(&r);
	double want_sps = samples / time_ms, want_loss = last_epoch_sum / in_last;
	cr_assert_float_eq(json_number_value(json_object_get(stored, "samples_per_sec")), want_sps, 1e-9 * want_sps,
			   "summary.samples_per_sec is not the whole run's %g", want_sps);
	cr_assert(json_is_real(json_object_get(stored, "epoch_loss")), "no summary.epoch_loss");
	cr_assert_float_eq(json_number_value(json_object_get(stored, "epoch_loss")), want_loss,
			   1e-9 * (1 + fabs(want_loss)), "summary.epoch_loss is not the last epoch's mean %g",
			   want_loss);
	json_decref(stored);

	/* A queued job knows nothing yet. */
	long long q = submit_job(&d,
				 "{\"name\": \"later\", \"seed\": 1, \"model\": {\"layers\": [{\"type\": \"dense\","
				 " \"units\": 2}]}, \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 64,"
				 " \"features\": 2, \"classes\": 2}}, \"batch_size\": 8, \"epochs\": 1,"
				 " \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}");
	(void)q;

	http(&d, "GET", "/jobs?fields=name,state", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200);
	json_t *jobs = json_object_get(r.json, "jobs"), *job;
	size_t i;
	cr_assert_geq(json_array_size(jobs), 2);
	json_array_foreach(jobs, i, job) {
		cr_assert_eq(json_object_size(job), 3, "job %zu has other keys than id, name, state", i);
		cr_assert(json_object_get(job, "id") && json_object_get(job, "name") && json_object_get(job, "state"));
	}
	http_free(&r);
	http(&d, "GET", "/jobs?fields=summary,progress", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200);
	job = json_array_get(json_object_get(r.json, "jobs"), 0);
	cr_assert(json_is_object(json_object_get(job, "summary")));
	cr_assert_null(json_object_get(job, "spec"));
	http_free(&r);
	/* Without fields=, lists keep every key but the summary. */
	http(&d, "GET", "/jobs", NULL, NULL, NULL, &r);
	job = json_array_get(json_object_get(r.json, "jobs"), 0);
	cr_assert_not_null(json_object_get(job, "spec"));
	http_free(&r);
	http(&d, "GET", "/jobs?fields=name,bogus", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 400);
	const char *msg = json_string_value(json_object_get(json_object_get(r.json, "error"), "message"));
	cr_assert(msg && strncmp(msg, "fields:", 7) == 0 && strstr(msg, "bogus"), "%s", msg);
	http_free(&r);
}

/* ---- re-posted points replace, pushed series can be deleted ---- */

static double ramp(long i)
{
	return (double)i;
}

static double sunk(long i)
{
	(void)i;
	return -5;
}

/* Re-posting a step replaces its point: no duplicate in the raw series,
 * and the downsampled envelope (the rollup) forgets the old value. */
Test(metrics_api, repost_replaces_and_series_delete, .init = start1, .fini = stop1, .timeout = 120)
{
	long long id = finished_job();
	char path[160];
	struct http_reply r;
	push_series(id, "eval.psnr", 0, 1, 100, ramp); /* steps 0..99, the max 99 at step 99 */
	push_series(id, "eval.psnr", 99, 1, 1, sunk);  /* step 99 again: -5 */
	snprintf(path, sizeof path, "/jobs/%lld/metrics?names=eval.psnr&max_points=0", id);
	json_t *ser;
	/* push_series saw step 99 already there: wait for the new value. */
	for (double t0 = now_s();; usleep(50000)) {
		http(&d, "GET", path, NULL, NULL, NULL, &r);
		ser = series(&r, "eval.psnr");
		json_t *values = json_object_get(ser, "values");
		if (json_number_value(json_array_get(values, json_array_size(values) - 1)) == -5)
			break;
		cr_assert_lt(now_s() - t0, 20 * TR_TEST_SLOW, "the re-posted point never arrived: %s", r.body);
		http_free(&r);
	}
	cr_assert_eq(npoints(ser), 100, "%s", r.body);
	cr_assert_eq(step_at(ser, 99), 99);
	cr_assert_float_eq(json_number_value(json_array_get(json_object_get(ser, "values"), 99)), -5, 1e-12);
	http_free(&r);
	snprintf(path, sizeof path, "/jobs/%lld/metrics?names=eval.psnr&max_points=2", id);
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	ser = series(&r, "eval.psnr");
	json_t *maxs = json_object_get(ser, "max");
	cr_assert_eq(npoints(ser), 2, "%s", r.body);
	cr_assert_float_eq(json_number_value(json_array_get(maxs, 1)), 98, 1e-12, "old value kept: %s", r.body);
	http_free(&r);

	/* Deleting: write role route; the engine's own series are refused. */
	snprintf(path, sizeof path, "/jobs/%lld/metrics/loss", id);
	http(&d, "DELETE", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 400, "%s", r.body);
	http_free(&r);
	snprintf(path, sizeof path, "/jobs/%lld/metrics/eval.psnr", id);
	http(&d, "DELETE", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 204, "%s", r.body);
	http_free(&r);
	http(&d, "DELETE", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 404, "%s", r.body);
	http_free(&r);
	snprintf(path, sizeof path, "/jobs/%lld/metrics?names=eval.psnr,loss&max_points=2", id);
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	cr_assert_null(series(&r, "eval.psnr"), "%s", r.body);
	cr_assert_not_null(series(&r, "loss"));
	http_free(&r);
	/* A series pushed again after a delete starts afresh (no rollup left). */
	push_series(id, "eval.psnr", 7, 1, 1, ramp);
	snprintf(path, sizeof path, "/jobs/%lld/metrics?names=eval.psnr&max_points=1", id);
	http(&d, "GET", path, NULL, NULL, NULL, &r);
	ser = series(&r, "eval.psnr");
	cr_assert_eq(npoints(ser), 1, "%s", r.body);
	cr_assert_eq(step_at(ser, 0), 7);
	http_free(&r);
}

/* ---- elapsed time across a resume ---- */

static json_t *job_progress(long long id, struct http_reply *r)
{
	char path[64];
	snprintf(path, sizeof path, "/jobs/%lld", id);
	http(&d, "GET", path, NULL, NULL, NULL, r);
	cr_assert_eq(r->status, 200, "%s", r->body);
	return json_object_get(r->json, "progress");
}

/* A job paused for 2 s and resumed: its elapsed time counts the training
 * of both runs (more than the first run's), and not the pause. */
Test(metrics_api, elapsed_counts_every_run_not_the_pause, .init = start1, .fini = stop1, .timeout = 120)
{
	struct http_reply r;
	char path[64];
	double t0 = now_s();
	long long id =
		submit_job(&d, "{\"name\": \"slow\", \"seed\": 3, \"model\": {\"layers\": [{\"type\": \"dense\","
			       " \"units\": 3}]}, \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 640,"
			       " \"features\": 6, \"classes\": 3, \"load_cost_us\": 2000}}, \"batch_size\": 32,"
			       " \"epochs\": 3, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.01}}");
	double first = 0;
	for (;;) {
		json_t *p = job_progress(id, &r);
		first = json_number_value(json_object_get(p, "elapsed_s"));
		bool far = json_integer_value(json_object_get(p, "step")) >= 5;
		http_free(&r);
		if (far && first > 0)
			break;
		cr_assert_lt(now_s() - t0, 30 * TR_TEST_SLOW, "the job did not reach step 5");
		usleep(20000);
	}
	snprintf(path, sizeof path, "/jobs/%lld/pause", id);
	http(&d, "POST", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 202, "%s", r.body);
	http_free(&r);
	cr_assert_str_eq(wait_state(&d, id, "paused|completed", 30), "paused");
	json_t *p = job_progress(id, &r);
	double ran = json_number_value(json_object_get(p, "elapsed_s"));
	cr_assert(ran >= first, "a paused job shows %g s of training, it had %g before the pause: %s", ran, first,
		  r.body);
	http_free(&r);
	sleep(2);
	snprintf(path, sizeof path, "/jobs/%lld/resume", id);
	http(&d, "POST", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 202, "%s", r.body);
	http_free(&r);
	cr_assert_str_eq(wait_state(&d, id, "completed|failed", 60), "completed");
	double wall = now_s() - t0;
	p = job_progress(id, &r);
	double total = json_number_value(json_object_get(p, "elapsed_s"));
	cr_assert(total > ran, "elapsed %g s does not count the second run (the first had %g): %s", total, ran, r.body);
	cr_assert(total < wall - 1.5, "elapsed %g s counts the 2 s pause (all took %g s)", total, wall);
	http_free(&r);
}
