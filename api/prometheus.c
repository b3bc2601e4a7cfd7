/* GET /metrics: the daemon in the Prometheus text exposition format 0.0.4,
 * written by hand (the format is a few rules; the C client libraries are
 * not packaged in Debian).
 *
 * Names follow Prometheus conventions: one trainerd_ prefix, base units
 * (seconds, bytes), _total on counters, _info for metadata, and no label
 * with unbounded values (a job's id appears only while it runs, so a
 * finished job's series disappear; routes are the route table's patterns,
 * never raw paths).  Request and checkpoint counters live here, fed by
 * server.c and the checkpoint writer (api/prometheus.h); job counts come
 * from one store query, running jobs' numbers, experiment counts and
 * devices from the daemon's operations, process_* from /proc/self.  A scrape takes one
 * short lock for the counters and never waits on a job.
 */
#include "api/prometheus.h"

#include <dirent.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "api/api_internal.h"

/* More routes than the table has; the last slot counts unmatched requests. */
#define MAX_ROUTES 64
/* Distinct status codes per route; more is a bug, counted as code "other". */
#define MAX_CODES 16

static const double request_buckets[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
					 0.1,    0.25,  0.5,    1,     2.5,  5,     10};
#define N_REQ_BUCKETS (sizeof(request_buckets) / sizeof(request_buckets[0]))
static const double ckpt_buckets[] = {0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};
#define N_CKPT_BUCKETS (sizeof(ckpt_buckets) / sizeof(ckpt_buckets[0]))

struct code_count {
	int code; /* 0 = "other" */
	uint64_t n;
};

struct route_stats {
	struct code_count codes[MAX_CODES];
	int ncodes;
	uint64_t buckets[N_REQ_BUCKETS]; /* non-cumulative; summed when rendered */
	uint64_t count;
	double sum;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct route_stats routes[MAX_ROUTES + 1];
static uint64_t ckpt_buckets_n[N_CKPT_BUCKETS], ckpt_count, ckpt_bytes;
static double ckpt_sum;
static uint64_t preemptions[2]; /* [0] at a step boundary, [1] hard (grace expired) */

/* Every state, from the job module (core/job.h). */
#define job_states tr_job_state_names
#define N_STATES TR_JOB_NSTATES

double tr_prom_clock(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static size_t bucket_of(const double *bounds, size_t n, double v)
{
	size_t i = 0;

	while (i < n && v > bounds[i])
		i++;
	return i; /* n = only in +Inf */
}

void tr_prom_request_done(const struct tr_api_route *route, int status, double seconds)
{
	size_t nroutes, slot = MAX_ROUTES;
	const struct tr_api_route *table = tr_api_routes(&nroutes);
	struct route_stats *r;
	size_t b;

	if (route && route >= table && route < table + nroutes && (size_t)(route - table) < MAX_ROUTES)
		slot = (size_t)(route - table);
	if (!(seconds >= 0))
		seconds = 0;
	b = bucket_of(request_buckets, N_REQ_BUCKETS, seconds);
	pthread_mutex_lock(&lock);
	r = &routes[slot];
	int i = 0;

	while (i < r->ncodes && r->codes[i].code != status)
		i++;
	if (i == r->ncodes) {
		if (r->ncodes < MAX_CODES - 1) {
			r->codes[r->ncodes++].code = status;
		} else {
			/* The last slot collects any further codes. */
			i = MAX_CODES - 1;
			r->ncodes = MAX_CODES;
			r->codes[i].code = 0;
		}
	}
	r->codes[i].n++;
	if (b < N_REQ_BUCKETS)
		r->buckets[b]++;
	r->count++;
	r->sum += seconds;
	pthread_mutex_unlock(&lock);
}

void tr_prom_preemption(bool hard)
{
	pthread_mutex_lock(&lock);
	preemptions[hard ? 1 : 0]++;
	pthread_mutex_unlock(&lock);
}

void tr_prom_checkpoint_written(double seconds, uint64_t bytes)
{
	size_t b;

	if (!(seconds >= 0))
		seconds = 0;
	b = bucket_of(ckpt_buckets, N_CKPT_BUCKETS, seconds);
	pthread_mutex_lock(&lock);
	if (b < N_CKPT_BUCKETS)
		ckpt_buckets_n[b]++;
	ckpt_count++;
	ckpt_sum += seconds;
	ckpt_bytes += bytes;
	pthread_mutex_unlock(&lock);
}

/* ---- text output ---- */

struct out {
	char *p;
	size_t n, cap;
	bool oom;
};

static void put(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct out *o, const char *fmt, ...)
{
	va_list ap;
	int len;

	if (o->oom)
		return;
	for (;;) {
		va_start(ap, fmt);
		len = vsnprintf(o->p + o->n, o->cap - o->n, fmt, ap);
		va_end(ap);
		if (len < 0) {
			o->oom = true;
			return;
		}
		if ((size_t)len < o->cap - o->n) {
			o->n += (size_t)len;
			return;
		}
		size_t ncap = o->cap * 2;

		while (ncap - o->n <= (size_t)len)
			ncap *= 2;
		char *np = realloc(o->p, ncap);

		if (!np) {
			o->oom = true;
			return;
		}
		o->p = np;
		o->cap = ncap;
	}
}

/* A label value with \, " and newline escaped as the format asks;
 * written into buf (cut to len). */
static const char *esc(char *buf, size_t len, const char *v)
{
	size_t j = 0;

	for (; v && *v && j + 3 < len; v++) {
		if (*v == '\\' || *v == '"') {
			buf[j++] = '\\';
			buf[j++] = *v;
		} else if (*v == '\n') {
			buf[j++] = '\\';
			buf[j++] = 'n';
		} else {
			buf[j++] = *v;
		}
	}
	buf[j] = '\0';
	return buf;
}

/* A sample value: Go's ParseFloat reads "NaN", "+Inf" and "-Inf". */
static const char *num(char *buf, size_t len, double v)
{
	if (isnan(v))
		snprintf(buf, len, "NaN");
	else if (isinf(v))
		snprintf(buf, len, "%sInf", v > 0 ? "+" : "-");
	else
		snprintf(buf, len, "%.15g", v);
	return buf;
}

static void head(struct out *o, const char *name, const char *type, const char *help)
{
	put(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void histogram(struct out *o, const char *name, const char *labels, const double *bounds, size_t nb,
		      const uint64_t *counts, uint64_t count, double sum)
{
	uint64_t cum = 0;
	char v[64];

	for (size_t i = 0; i < nb; i++) {
		cum += counts[i];
		put(o, "%s_bucket{%s%sle=\"%s\"} %" PRIu64 "\n", name, labels, *labels ? "," : "",
		    num(v, sizeof v, bounds[i]), cum);
	}
	put(o, "%s_bucket{%s%sle=\"+Inf\"} %" PRIu64 "\n", name, labels, *labels ? "," : "", count);
	put(o, "%s_sum%s%s%s %s\n", name, *labels ? "{" : "", labels, *labels ? "}" : "", num(v, sizeof v, sum));
	put(o, "%s_count%s%s%s %" PRIu64 "\n", name, *labels ? "{" : "", labels, *labels ? "}" : "", count);
}

static void put_counters(struct out *o)
{
	static struct route_stats snap[MAX_ROUTES + 1];
	static pthread_mutex_t snap_lock = PTHREAD_MUTEX_INITIALIZER;
	uint64_t cb[N_CKPT_BUCKETS], cc, cbytes;
	double csum;
	size_t nroutes;
	const struct tr_api_route *table = tr_api_routes(&nroutes);
	char labels[256], code[16], route[160];

	if (nroutes > MAX_ROUTES)
		nroutes = MAX_ROUTES;
	/* Copied under the lock, rendered outside it, so requests are never
	 * held up by a scrape's formatting.  The copy is static (it is
	 * large) and has its own lock for concurrent scrapes. */
	pthread_mutex_lock(&snap_lock);
	pthread_mutex_lock(&lock);
	memcpy(snap, routes, sizeof(snap));
	memcpy(cb, ckpt_buckets_n, sizeof(cb));
	cc = ckpt_count;
	csum = ckpt_sum;
	cbytes = ckpt_bytes;
	uint64_t preempted[2] = {preemptions[0], preemptions[1]};
	pthread_mutex_unlock(&lock);

	head(o, "trainerd_http_requests_total", "counter", "HTTP requests answered, by route pattern and status.");
	for (size_t r = 0; r <= MAX_ROUTES; r++) {
		if (r >= nroutes && r != MAX_ROUTES)
			continue;
		for (int i = 0; i < snap[r].ncodes; i++) {
			if (snap[r].codes[i].code)
				snprintf(code, sizeof code, "%d", snap[r].codes[i].code);
			else
				snprintf(code, sizeof code, "other");
			put(o, "trainerd_http_requests_total{method=\"%s\",route=\"%s\",code=\"%s\"} %" PRIu64 "\n",
			    r < nroutes ? table[r].method : "other",
			    r < nroutes ? esc(route, sizeof route, table[r].path) : "unmatched", code,
			    snap[r].codes[i].n);
		}
	}
	head(o, "trainerd_http_request_duration_seconds", "histogram",
	     "Time from a request's headers to its response being queued (an event stream's or a download's "
	     "first byte), by route pattern.");
	for (size_t r = 0; r <= MAX_ROUTES; r++) {
		if ((r >= nroutes && r != MAX_ROUTES) || snap[r].count == 0)
			continue;
		snprintf(labels, sizeof labels, "method=\"%s\",route=\"%s\"", r < nroutes ? table[r].method : "other",
			 r < nroutes ? esc(route, sizeof route, table[r].path) : "unmatched");
		histogram(o, "trainerd_http_request_duration_seconds", labels, request_buckets, N_REQ_BUCKETS,
			  snap[r].buckets, snap[r].count, snap[r].sum);
	}
	pthread_mutex_unlock(&snap_lock);

	head(o, "trainerd_checkpoint_write_duration_seconds", "histogram",
	     "Time to write and commit one checkpoint, in the background writer.");
	histogram(o, "trainerd_checkpoint_write_duration_seconds", "", ckpt_buckets, N_CKPT_BUCKETS, cb, cc, csum);
	head(o, "trainerd_checkpoint_bytes_total", "counter", "Bytes of checkpoints written.");
	put(o, "trainerd_checkpoint_bytes_total %" PRIu64 "\n", cbytes);
	head(o, "trainerd_preemptions_total", "counter",
	     "Jobs preempted for higher-priority ones, by how they let go: at a step boundary with a checkpoint, "
	     "or hard when the grace time ran out (back to the newest checkpoint); the log and the jobs' "
	     "preemption records name who preempted whom.");
	put(o, "trainerd_preemptions_total{mode=\"checkpoint\"} %" PRIu64 "\n", preempted[0]);
	put(o, "trainerd_preemptions_total{mode=\"hard\"} %" PRIu64 "\n", preempted[1]);
}

/* Jobs by state and ever submitted; -1 when the store fails. */
static int put_jobs(struct out *o, tr_api_t *api, struct tr_error *e)
{
	int64_t counts[N_STATES], submitted;

	if (tr_store_job_counts(api->cfg.store, counts, &submitted, e) < 0)
		return -1;
	head(o, "trainerd_jobs", "gauge", "Jobs in the store, by state.");
	for (size_t i = 0; i < N_STATES; i++)
		put(o, "trainerd_jobs{state=\"%s\"} %" PRId64 "\n", job_states[i], counts[i]);
	head(o, "trainerd_jobs_submitted_total", "counter",
	     "Jobs ever submitted to this store, deleted ones included.");
	put(o, "trainerd_jobs_submitted_total %" PRId64 "\n", submitted);
	head(o, "trainerd_metric_points_dropped_total", "counter",
	     "Metric points and log lines dropped because the store's write queue was full.");
	put(o, "trainerd_metric_points_dropped_total %" PRId64 "\n", tr_store_metric_drops(api->cfg.store, 0));
	return 0;
}

/* Experiments by state (docs/experiments.md), every state on its line
 * so a dashboard's query finds zeros rather than nothing; left out
 * where the daemon offers no experiments.  -1 when they cannot be read. */
static int put_experiments(struct out *o, tr_api_t *api, struct tr_error *e)
{
	int64_t counts[TR_EXP_NSTATES] = {0};

	if (!api->cfg.ops.experiment_counts)
		return 0;
	if (api->cfg.ops.experiment_counts(api->cfg.ctx, counts, e) < 0)
		return -1;
	head(o, "trainerd_experiments", "gauge", "Experiments (hyperparameter sweeps) in the store, by state.");
	for (int i = 0; i < TR_EXP_NSTATES; i++)
		put(o, "trainerd_experiments{state=\"%s\"} %" PRId64 "\n",
		    tr_experiment_state_name((enum tr_experiment_state)i), counts[i]);
	return 0;
}

struct job_sample {
	int64_t id;
	double step, sps, loss, wait;
};

static double num_field(const json_t *o, const char *key, double def)
{
	const json_t *v = json_object_get(o, key);

	return json_is_number(v) ? json_number_value(v) : def;
}

/* Per running job: step, throughput, loss and input stall.  Jobs come
 * from the store (the states that run), numbers from the daemon's live
 * progress, falling back to the stored progress. */
static int put_running(struct out *o, tr_api_t *api, struct tr_error *e)
{
	static const enum tr_job_state run_states[] = {TR_JOB_RUNNING, TR_JOB_STOPPING};
	struct tr_job_row *rows = NULL;
	struct job_sample *js = NULL;
	int n = 0;
	char v[64];

	if (tr_store_job_list_states(api->cfg.store, run_states, 2, &rows, &n, e) < 0)
		return -1;
	if (n > 0 && !(js = calloc((size_t)n, sizeof(*js)))) {
		n = 0;
		o->oom = true;
	}
	for (int i = 0; i < n; i++) {
		json_t *live = tr_api_live_json(api, &rows[i]);

		js[i].id = rows[i].id;
		js[i].step = num_field(live, "step", (double)rows[i].step);
		js[i].sps = num_field(live, "samples_per_sec", NAN);
		js[i].loss = num_field(live, "loss", rows[i].loss);
		js[i].wait = num_field(live, "data_wait_fraction", NAN);
		json_decref(live);
		tr_job_row_finish(&rows[i]);
	}
	free(rows);
	head(o, "trainerd_job_step", "gauge", "The running job's last completed step.");
	for (int i = 0; i < n; i++)
		put(o, "trainerd_job_step{job_id=\"%" PRId64 "\"} %s\n", js[i].id, num(v, sizeof v, js[i].step));
	head(o, "trainerd_job_samples_per_second", "gauge", "The running job's training throughput.");
	for (int i = 0; i < n; i++)
		if (!isnan(js[i].sps))
			put(o, "trainerd_job_samples_per_second{job_id=\"%" PRId64 "\"} %s\n", js[i].id,
			    num(v, sizeof v, js[i].sps));
	head(o, "trainerd_job_loss", "gauge", "The running job's latest training loss.");
	for (int i = 0; i < n; i++)
		if (!isnan(js[i].loss))
			put(o, "trainerd_job_loss{job_id=\"%" PRId64 "\"} %s\n", js[i].id,
			    num(v, sizeof v, js[i].loss));
	head(o, "trainerd_job_data_wait_ratio", "gauge",
	     "Share of the running job's step time spent waiting for input data (0 to 1).");
	for (int i = 0; i < n; i++)
		if (!isnan(js[i].wait))
			put(o, "trainerd_job_data_wait_ratio{job_id=\"%" PRId64 "\"} %s\n", js[i].id,
			    num(v, sizeof v, js[i].wait));
	free(js);
	return 0;
}

static void put_devices(struct out *o, tr_api_t *api)
{
	struct tr_api_device devs[TR_API_MAX_DEVICES];
	int n = tr_api_devices_read(api, devs, TR_API_MAX_DEVICES);
	char name[160], job[32];

	head(o, "trainerd_device_info", "gauge",
	     "A training device, its name and the job that holds it (\"\" when free).");
	for (int i = 0; i < n; i++) {
		if (devs[i].job)
			snprintf(job, sizeof job, "%" PRId64, devs[i].job);
		else
			job[0] = '\0';
		put(o, "trainerd_device_info{device=\"%d\",name=\"%s\",job_id=\"%s\"} 1\n", devs[i].id,
		    esc(name, sizeof name, devs[i].name), job);
	}
}

/* ---- process_* from /proc/self ---- */

/* Unix time the process started: its start in clock ticks after boot
 * (/proc/self/stat field 22) plus the boot time (/proc/stat btime). */
static double start_time(void)
{
	char buf[1024], *p;
	unsigned long long ticks = 0, btime = 0;
	FILE *f = fopen("/proc/self/stat", "r");
	size_t n;

	if (!f)
		return NAN;
	n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = '\0';
	/* The command name may hold spaces and parentheses: fields count
	 * from the last ')'. */
	p = strrchr(buf, ')');
	if (!p)
		return NAN;
	p++;
	for (int field = 3; field < 22 && p; field++)
		p = strchr(p + 1, ' ');
	if (!p || sscanf(p, " %llu", &ticks) != 1)
		return NAN;
	f = fopen("/proc/stat", "r");
	if (!f)
		return NAN;
	while (fgets(buf, sizeof buf, f))
		if (sscanf(buf, "btime %llu", &btime) == 1)
			break;
	fclose(f);
	if (!btime)
		return NAN;
	return (double)btime + (double)ticks / (double)sysconf(_SC_CLK_TCK);
}

static void put_process(struct out *o)
{
	static double started; /* constant: read once */
	struct rusage ru;
	struct rlimit rl;
	unsigned long long vsize = 0, rss = 0;
	long page = sysconf(_SC_PAGESIZE);
	int fds = 0;
	char v[64];
	FILE *f;
	DIR *dir;
	struct dirent *de;

	if (started == 0)
		started = start_time();
	if (getrusage(RUSAGE_SELF, &ru) == 0) {
		head(o, "process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.");
		put(o, "process_cpu_seconds_total %s\n",
		    num(v, sizeof v,
			(double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
				((double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_usec) * 1e-6));
	}
	f = fopen("/proc/self/statm", "r");
	if (f && fscanf(f, "%llu %llu", &vsize, &rss) == 2) {
		head(o, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.");
		put(o, "process_resident_memory_bytes %llu\n", rss * (unsigned long long)page);
		head(o, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.");
		put(o, "process_virtual_memory_bytes %llu\n", vsize * (unsigned long long)page);
	}
	if (f)
		fclose(f);
	dir = opendir("/proc/self/fd");
	if (dir) {
		while ((de = readdir(dir)))
			if (de->d_name[0] != '.')
				fds++;
		closedir(dir);
		head(o, "process_open_fds", "gauge", "Number of open file descriptors.");
		put(o, "process_open_fds %d\n", fds - 1); /* not the directory's own */
	}
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
		head(o, "process_max_fds", "gauge", "Maximum number of open file descriptors.");
		put(o, "process_max_fds %llu\n", (unsigned long long)rl.rlim_cur);
	}
	if (!isnan(started)) {
		head(o, "process_start_time_seconds", "gauge",
		     "Start time of the process since unix epoch in seconds.");
		put(o, "process_start_time_seconds %s\n", num(v, sizeof v, started));
	}
}

void tr_api_prometheus(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	tr_api_t *api = rq->api;
	struct out o = {.cap = 16384};
	char ver[128];
	struct tr_error e = {0};

	o.p = malloc(o.cap);
	if (!o.p) {
		tr_api_fail(rp, 500, "internal", NULL, "out of memory");
		return;
	}
	head(&o, "trainerd_build_info", "gauge", "The daemon's version; always 1.");
	put(&o, "trainerd_build_info{version=\"%s\"} 1\n", esc(ver, sizeof ver, api->cfg.version));
	if (put_jobs(&o, api, &e) < 0 || put_running(&o, api, &e) < 0) {
		free(o.p);
		tr_api_fail_store_err(rp, &e, "reading jobs for /metrics");
		return;
	}
	if (put_experiments(&o, api, &e) < 0) {
		free(o.p);
		tr_api_fail_store_err(rp, &e, "reading experiments for /metrics");
		return;
	}
	put_devices(&o, api);
	put_counters(&o);
	put_process(&o);
	if (o.oom) {
		free(o.p);
		tr_api_fail(rp, 500, "internal", NULL, "out of memory rendering /metrics");
		return;
	}
	rp->status = 200;
	rp->text = o.p;
	rp->text_len = o.n;
	rp->content_type = "text/plain; version=0.0.4; charset=utf-8";
}
