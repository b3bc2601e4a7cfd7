/* Worker reports from `trainerd run` (daemon/run_report.h). */
#include "daemon/run_report.h"

#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define BATCH_MAX 5000 /* points per post (the route takes up to 10000) */
#define BACKOFF_MAX_S 30.0
#define INTERVAL_S 1.0

struct point {
	char name[64];
	int64_t step, epoch;
	double value;
};

struct tr_run_report {
	char *url;
	char auth[160]; /* "Authorization: Bearer TOKEN" */
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t wake;
	/* Under lock: the queue (a ring), the newest progress, the summary. */
	struct point *q;
	size_t head, count;
	uint64_t dropped;
	struct tr_progress progress;
	bool have_progress, progress_sent;
	char *summary;
	bool summary_sent;
	int stop; /* 1: finish asked (send the rest now), 2: give up */
	/* A periodic checkpoint to upload (its path), and whether the thread
	 * is uploading one: finish waits for it, as two uploads of one file
	 * at once would interleave in the daemon's temporary file. */
	char *ckpt_path;
	bool ckpt_due, ckpt_busy;
	char last_error[CURL_ERROR_SIZE + 64];
};

static double mono_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static size_t discard(char *p, size_t size, size_t n, void *ctx)
{
	(void)p;
	(void)ctx;
	return size * n;
}

/* Sends a request c holds (its URL and body set) with the token, the
 * content type and the CA; frees c.  0 on 2xx, -1 otherwise with why. */
static int perform(struct tr_run_report *r, CURL *c, const char *content_type, const char *what, char *why,
		   size_t whylen)
{
	char ebuf[CURL_ERROR_SIZE] = "", type[80];
	snprintf(type, sizeof type, "Content-Type: %s", content_type);
	struct curl_slist *h = curl_slist_append(NULL, type);
	h = curl_slist_append(h, r->auth);
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 5L);
	/* Slow is fine (a large checkpoint), stalled is not. */
	curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
	curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, discard);
	curl_easy_setopt(c, CURLOPT_ERRORBUFFER, ebuf);
	curl_easy_setopt(c, CURLOPT_USERAGENT, "trainerd-run/" TR_VERSION);
	const char *ca = getenv("CURL_CA_BUNDLE");
	if (ca && ca[0])
		curl_easy_setopt(c, CURLOPT_CAINFO, ca);
	CURLcode rc = curl_easy_perform(c);
	long status = 0;
	curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
	curl_slist_free_all(h);
	curl_easy_cleanup(c);
	if (rc != CURLE_OK)
		snprintf(why, whylen, "%s: %s", what, ebuf[0] ? ebuf : curl_easy_strerror(rc));
	else if (status < 200 || status > 299)
		snprintf(why, whylen, "%s: HTTP %ld", what, status);
	return rc == CURLE_OK && status >= 200 && status <= 299 ? 0 : -1;
}

/* One POST of a report; 0 on 2xx. */
static int post(struct tr_run_report *r, const char *body, char *why, size_t whylen)
{
	CURL *c = curl_easy_init();
	if (!c) {
		snprintf(why, whylen, "cannot start libcurl");
		return -1;
	}
	curl_easy_setopt(c, CURLOPT_URL, r->url);
	curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
	curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
	curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
	return perform(r, c, "application/json", "POST", why, whylen);
}

/* One PUT of a file to URL/NAME (the report route's file upload); 0 on
 * 2xx. */
static int put_file(struct tr_run_report *r, const char *path, const char *name, char *why, size_t whylen)
{
	FILE *f = fopen(path, "rb");
	struct stat sb;
	if (!f || fstat(fileno(f), &sb) < 0) {
		snprintf(why, whylen, "%.200s: %s", path, strerror(errno));
		if (f)
			fclose(f);
		return -1;
	}
	CURL *c = curl_easy_init();
	if (!c) {
		snprintf(why, whylen, "cannot start libcurl");
		fclose(f);
		return -1;
	}
	char url[2048], what[64];
	snprintf(url, sizeof url, "%s/%s", r->url, name);
	snprintf(what, sizeof what, "PUT %s", name);
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
	curl_easy_setopt(c, CURLOPT_READDATA, f);
	curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, (curl_off_t)sb.st_size);
	int rc = perform(r, c, "application/octet-stream", what, why, whylen);
	fclose(f);
	return rc;
}

/* Uploads the run's final files, retrying with backoff until end. */
static bool upload_files(struct tr_run_report *r, const char *out_dir, double end)
{
	static const char *const names[] = {"model.safetensors", "checkpoint.safetensors"};
	for (size_t i = 0; i < 2; i++) {
		char path[4096], why[CURL_ERROR_SIZE + 64] = "";
		snprintf(path, sizeof path, "%s/%s", out_dir, names[i]);
		if (access(path, R_OK) != 0)
			continue; /* a run that failed early has none */
		double backoff = 1;
		while (put_file(r, path, names[i], why, sizeof why) < 0) {
			if (mono_s() + backoff > end) {
				snprintf(r->last_error, sizeof r->last_error, "%s", why);
				return false;
			}
			nanosleep(&(struct timespec){.tv_sec = (time_t)backoff}, NULL);
			backoff = fmin(backoff * 2, BACKOFF_MAX_S);
		}
	}
	return true;
}

/* Builds the next report from what is queued (under lock); *npoints how
 * many of the queue's points it holds.  NULL when there is nothing new. */
static char *next_report(struct tr_run_report *r, size_t *npoints, bool *with_summary)
{
	json_t *body = json_object();
	size_t n = r->count < BATCH_MAX ? r->count : BATCH_MAX;
	if (n > 0) {
		json_t *a = json_array();
		for (size_t i = 0; i < n; i++) {
			const struct point *p = &r->q[(r->head + i) % TR_RUN_REPORT_QUEUE];
			json_array_append_new(a, json_pack("{s:s, s:I, s:I, s:f}", "name", p->name, "step",
							   (json_int_t)p->step, "epoch", (json_int_t)p->epoch, "value",
							   p->value));
		}
		json_object_set_new(body, "points", a);
	}
	if (r->have_progress && !r->progress_sent) {
		json_t *p = json_pack("{s:I, s:I, s:I}", "step", (json_int_t)r->progress.step, "total_steps",
				      (json_int_t)r->progress.total_steps, "epoch", (json_int_t)r->progress.epoch);
		if (isfinite(r->progress.loss))
			json_object_set_new(p, "loss", json_real(r->progress.loss));
		json_object_set_new(body, "progress", p);
	}
	/* The summary last, once every point went: the daemon records the
	 * end from it. */
	*with_summary = r->summary && !r->summary_sent && n == r->count;
	if (*with_summary)
		json_object_set_new(body, "summary", json_loads(r->summary, 0, NULL));
	*npoints = n;
	char *text = json_object_size(body) ? json_dumps(body, JSON_COMPACT) : NULL;
	json_decref(body);
	return text;
}

static void *report_main(void *arg)
{
	struct tr_run_report *r = arg;
	double backoff = 0;
	pthread_mutex_lock(&r->lock);
	for (;;) {
		if (r->ckpt_due && !r->stop) {
			/* The newest periodic checkpoint, so that a requeue on a
			 * node without it resumes from it (one try: the next
			 * checkpoint tries again). */
			char *path = strdup(r->ckpt_path), why[CURL_ERROR_SIZE + 64] = "";
			r->ckpt_due = false;
			r->ckpt_busy = true;
			pthread_mutex_unlock(&r->lock);
			int rc = path ? put_file(r, path, "checkpoint.safetensors", why, sizeof why) : -1;
			free(path);
			pthread_mutex_lock(&r->lock);
			r->ckpt_busy = false;
			if (rc < 0)
				snprintf(r->last_error, sizeof r->last_error, "%s", why[0] ? why : "out of memory");
			pthread_cond_broadcast(&r->wake);
			continue;
		}
		size_t n;
		bool with_summary;
		char *body = next_report(r, &n, &with_summary);
		if (!body) {
			if (r->stop)
				break;
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_sec += (time_t)INTERVAL_S;
			pthread_cond_timedwait(&r->wake, &r->lock, &ts);
			continue;
		}
		struct tr_progress sent = r->progress;
		uint64_t dropped = r->dropped;
		pthread_mutex_unlock(&r->lock);
		char why[CURL_ERROR_SIZE + 32] = "";
		int rc = post(r, body, why, sizeof why);
		free(body);
		pthread_mutex_lock(&r->lock);
		if (rc == 0) {
			/* The points sent are the queue's oldest n, less those
			 * the queue dropped meanwhile (from its head). */
			uint64_t gone = r->dropped - dropped;
			size_t done = gone >= n ? 0 : n - (size_t)gone;
			done = done < r->count ? done : r->count;
			r->head = (r->head + done) % TR_RUN_REPORT_QUEUE;
			r->count -= done;
			r->progress_sent = r->progress.step == sent.step;
			r->summary_sent |= with_summary;
			r->last_error[0] = 0;
			backoff = 0;
			/* A full batch: send the next at once; else wait for more. */
			if (n == BATCH_MAX || r->stop)
				continue;
		} else {
			snprintf(r->last_error, sizeof r->last_error, "%s", why);
			backoff = backoff > 0 ? fmin(backoff * 2, BACKOFF_MAX_S) : 1.0;
		}
		if (r->stop && r->summary_sent && r->count == 0)
			break;
		/* The next round after INTERVAL_S (a finish asked sends the rest
		 * at once), or after the backoff of a failure. */
		double until = mono_s() + (rc == 0 ? INTERVAL_S : backoff);
		while (r->stop != 2 && !(rc == 0 && r->stop) && mono_s() < until) {
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_nsec += 200 * 1000 * 1000;
			if (ts.tv_nsec >= 1000000000L) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000L;
			}
			pthread_cond_timedwait(&r->wake, &r->lock, &ts);
		}
		if (r->stop == 2)
			break;
	}
	pthread_mutex_unlock(&r->lock);
	return NULL;
}

tr_run_report_t *tr_run_report_start(const char *url, const char *token_file, struct tr_error *err)
{
	FILE *f = fopen(token_file, "r");
	if (!f) {
		tr_error_set(err, -errno, 0, NULL, "--report-token-file %s: %s", token_file, strerror(errno));
		return NULL;
	}
	struct stat sb;
	char token[128] = "";
	bool private = fstat(fileno(f), &sb) == 0 && (sb.st_mode & 077) == 0;
	bool read = fgets(token, sizeof token, f) != NULL;
	fclose(f);
	token[strcspn(token, "\r\n")] = 0;
	if (!private || !read || !token[0]) {
		tr_error_set(err, -EINVAL, 0, NULL, "--report-token-file %s: %s", token_file,
			     !private ? "others may read it (chmod 600)" : "holds no token");
		explicit_bzero(token, sizeof token);
		return NULL;
	}
	struct tr_run_report *r = calloc(1, sizeof *r);
	if (r)
		r->q = calloc(TR_RUN_REPORT_QUEUE, sizeof *r->q);
	if (!r || !r->q || !(r->url = strdup(url))) {
		if (r)
			free(r->q);
		free(r);
		tr_error_set(err, -ENOMEM, 0, NULL, "out of memory");
		return NULL;
	}
	snprintf(r->auth, sizeof r->auth, "Authorization: Bearer %s", token);
	explicit_bzero(token, sizeof token);
	curl_global_init(CURL_GLOBAL_DEFAULT);
	pthread_mutex_init(&r->lock, NULL);
	pthread_cond_init(&r->wake, NULL);
	if (pthread_create(&r->thread, NULL, report_main, r) != 0) {
		explicit_bzero(r->auth, sizeof r->auth);
		free(r->url);
		free(r->q);
		free(r);
		tr_error_set(err, -EAGAIN, 0, NULL, "cannot start the report thread");
		return NULL;
	}
	return r;
}

void tr_run_report_metric(tr_run_report_t *r, const struct tr_metric_point *p)
{
	if (!r || !isfinite(p->value))
		return;
	pthread_mutex_lock(&r->lock);
	if (r->count == TR_RUN_REPORT_QUEUE) { /* full: the oldest goes (it is in metrics.jsonl) */
		r->head = (r->head + 1) % TR_RUN_REPORT_QUEUE;
		r->count--;
		r->dropped++;
	}
	struct point *q = &r->q[(r->head + r->count) % TR_RUN_REPORT_QUEUE];
	snprintf(q->name, sizeof q->name, "%s", p->name);
	q->step = p->step;
	q->epoch = p->epoch;
	q->value = p->value;
	r->count++;
	pthread_mutex_unlock(&r->lock);
}

void tr_run_report_checkpoint(tr_run_report_t *r, const char *out_dir)
{
	if (!r)
		return;
	pthread_mutex_lock(&r->lock);
	if (!r->ckpt_path && asprintf(&r->ckpt_path, "%s/checkpoint.safetensors", out_dir) < 0)
		r->ckpt_path = NULL;
	r->ckpt_due = r->ckpt_path != NULL;
	pthread_cond_signal(&r->wake);
	pthread_mutex_unlock(&r->lock);
}

void tr_run_report_progress(tr_run_report_t *r, const struct tr_progress *p)
{
	if (!r)
		return;
	pthread_mutex_lock(&r->lock);
	r->progress = *p;
	r->have_progress = true;
	r->progress_sent = false;
	pthread_mutex_unlock(&r->lock);
}

int tr_run_report_finish(tr_run_report_t *r, const char *out_dir, const char *summary_json, double timeout_s)
{
	if (!r)
		return 0;
	double end = mono_s() + timeout_s;
	/* No periodic upload from now on, and none left running: the final
	 * files replace it. */
	pthread_mutex_lock(&r->lock);
	r->ckpt_due = false;
	while (r->ckpt_busy && mono_s() < end) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 1;
		pthread_cond_timedwait(&r->wake, &r->lock, &ts);
	}
	pthread_mutex_unlock(&r->lock);
	/* The weights first: the daemon stores them when the job ends,
	 * which follows the worker's exit. */
	bool files = !out_dir || upload_files(r, out_dir, end);
	pthread_mutex_lock(&r->lock);
	r->summary = summary_json ? strdup(summary_json) : NULL;
	r->summary_sent = !r->summary;
	r->stop = 1;
	pthread_cond_signal(&r->wake);
	pthread_mutex_unlock(&r->lock);
	/* Bounded: a daemon that cannot be reached does not keep the worker. */
	for (;;) {
		pthread_mutex_lock(&r->lock);
		bool done = r->summary_sent && r->count == 0 && (!r->have_progress || r->progress_sent);
		if (done || mono_s() > end)
			r->stop = 2;
		pthread_mutex_unlock(&r->lock);
		if (done || mono_s() > end)
			break;
		nanosleep(&(struct timespec){.tv_nsec = 50 * 1000 * 1000}, NULL);
	}
	pthread_mutex_lock(&r->lock);
	pthread_cond_signal(&r->wake);
	pthread_mutex_unlock(&r->lock);
	pthread_join(r->thread, NULL);
	int rc = files && r->summary_sent && r->count == 0 ? 0 : -ETIMEDOUT;
	if (rc < 0)
		fprintf(stderr,
			"trainerd run: %s%zu metric points and %s were not reported to the daemon (%s); the files "
			"have them\n",
			files ? "" : "the final weights, ", r->count, r->summary_sent ? "no summary" : "the summary",
			r->last_error[0] ? r->last_error : "timed out");
	if (r->dropped)
		fprintf(stderr, "trainerd run: the report queue dropped %llu metric points; metrics.jsonl has them\n",
			(unsigned long long)r->dropped);
	explicit_bzero(r->auth, sizeof r->auth);
	pthread_mutex_destroy(&r->lock);
	pthread_cond_destroy(&r->wake);
	free(r->summary);
	free(r->ckpt_path);
	free(r->url);
	free(r->q);
	free(r);
	return rc;
}
