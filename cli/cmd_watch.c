/* `watch ID` and `logs ID -f`: follow a job's event stream
 * (GET /jobs/{id}/events) to its end.
 *
 * Metrics events feed the progress line (step, loss, throughput, the
 * share of step time spent waiting for data, and an ETA from the recent
 * step time); state events and log lines are printed above it.  When the
 * connection drops or the daemon restarts, the stream is opened again
 * with Last-Event-ID, so no event is lost or shown twice; the daemon may
 * stay away for --reconnect-timeout seconds before watch gives up (exit
 * 3).  The exit code says how the job ended: 0 completed or stopped, 1 failed or
 * cancelled.
 */
#include "cli/trainctl.h"

#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define RING 256
#define RATE_WINDOW_S 20.0

struct follow {
	struct tr_ctl *c;
	int64_t id;
	bool logs_only;
	struct tr_bar bar;
	struct tr_bar_state st;
	double step_ms_ema; /* recent step time: the ETA until the window fills */
	double refreshed;   /* tr_mono_now() of the last refresh_job while the total was unknown */
	/* (wall time, step) of recent metrics events: the ETA and the
	 * throughput shown come from the steps done over the last
	 * RATE_WINDOW_S seconds, which includes every pause between steps
	 * (evaluation, checkpoints) and does not jump with one slow step. */
	struct {
		double wall;
		int64_t step;
	} ring[RING];
	int ring_n, ring_head;
	double sps_ema;
	double last_wait, last_ms; /* data_wait_ms and step_ms of the newest step */
	char state[32];
	char error[512];
	bool terminal;
	bool progressed; /* a metrics event came: the bar has something to show */
	bool got;        /* an event came since the last (re)connect */
	/* A validation result being gathered: its points may come in two
	 * events; printed once the next step's points (or the end) come. */
	int64_t val_step, val_epoch;
	double val_loss, val_acc;
	bool val_pending;
	struct tr_sse sse;
};

/* Refreshes what the event stream does not carry: total steps, epochs,
 * the daemon's ETA. */
static void refresh_job(struct follow *f, bool print_failures)
{
	struct tr_ctl_reply r;
	char path[64];
	json_t *p;
	int rc;

	snprintf(path, sizeof path, "/jobs/%" PRId64, f->id);
	rc = print_failures ? tr_ctl_call(f->c, "GET", path, NULL, &r)
			    : tr_ctl_request(f->c, "GET", path, NULL, NULL, &r);
	if (rc || r.status != 200) {
		tr_ctl_reply_finish(&r);
		return;
	}
	/* The step comes from the events only: a replayed history must
	 * count up from its start, not show the job's present step. */
	p = json_object_get(r.json, "progress");
	f->st.total_steps = json_integer_value(json_object_get(p, "total_steps"));
	f->st.epochs = json_integer_value(json_object_get(p, "epochs"));
	if (!f->st.epochs) /* live progress only; the spec says it too */
		f->st.epochs = json_integer_value(json_object_get(json_object_get(r.json, "spec"), "epochs"));
	if (json_is_number(json_object_get(p, "eta_s")))
		f->st.eta_s = json_number_value(json_object_get(p, "eta_s"));
	tr_ctl_reply_finish(&r);
}

static void flush_val(struct follow *f);

static void on_state(struct follow *f, const json_t *d)
{
	const char *state = json_string_value(json_object_get(d, "state"));
	const json_t *err = json_object_get(d, "error");

	if (!state)
		return;
	snprintf(f->state, sizeof f->state, "%s", state);
	f->terminal = tr_job_state_name_terminal(state);
	if (json_is_object(err))
		snprintf(f->error, sizeof f->error, "%s", json_string_value(json_object_get(err, "message")) ?: "");
	flush_val(f);
	if (f->logs_only)
		return;
	/* The final numbers, unless the last line already showed them. */
	if (f->terminal && f->progressed && (f->bar.tty || f->st.step != f->bar.printed_step)) {
		tr_bar_update(&f->bar, &f->st, true);
		tr_bar_finish(&f->bar); /* the final bar stays on screen */
	}
	tr_bar_line(&f->bar, "job %" PRId64 " %s%s%s", f->id, state, f->error[0] && f->terminal ? ": " : "",
		    f->terminal ? f->error : "");
	if (!f->terminal)
		refresh_job(f, false);
}

static void on_log(struct follow *f, const json_t *d)
{
	const char *msg = json_string_value(json_object_get(d, "message"));
	int level = (int)json_integer_value(json_object_get(d, "level"));
	char when[32];

	if (!msg)
		return;
	tr_fmt_time(when, sizeof when, json_string_value(json_object_get(d, "time")));
	tr_bar_line(&f->bar, "%s %s%s", when, level <= 3 ? "error: " : level == 4 ? "warning: " : "", msg);
}

/* Remaining steps over the step rate of the last RATE_WINDOW_S seconds;
 * from the recent step time while the window holds under a second. */
static double rate_eta(const struct follow *f)
{
	int newest = (f->ring_head + RING - 1) % RING, oldest = newest;
	double span;

	if (f->st.total_steps <= 0)
		return NAN;
	for (int k = 1; k < f->ring_n; k++) {
		int i = (newest + RING - k) % RING;

		if (f->ring[newest].wall - f->ring[i].wall > RATE_WINDOW_S)
			break;
		oldest = i;
	}
	span = f->ring[newest].wall - f->ring[oldest].wall;
	if (f->ring_n > 1 && span >= 1.0 && f->ring[newest].step > f->ring[oldest].step)
		return (double)(f->st.total_steps - f->st.step) * span /
		       (double)(f->ring[newest].step - f->ring[oldest].step);
	if (f->step_ms_ema > 0)
		return (double)(f->st.total_steps - f->st.step) * f->step_ms_ema / 1000.0;
	return NAN;
}

static void flush_val(struct follow *f)
{
	char loss[32] = "", acc[48] = "";

	if (!f->val_pending)
		return;
	f->val_pending = false;
	if (f->logs_only)
		return;
	if (isfinite(f->val_loss))
		snprintf(loss, sizeof loss, " val_loss %.4f", f->val_loss);
	if (isfinite(f->val_acc))
		snprintf(acc, sizeof acc, " val_accuracy %.4f", f->val_acc);
	tr_bar_line(&f->bar, "epoch %lld step %lld:%s%s", (long long)f->val_epoch + 1, (long long)f->val_step, loss,
		    acc);
}

static void on_metrics(struct follow *f, const json_t *d)
{
	const json_t *pts = json_object_get(d, "points"), *pt;
	size_t i;

	double newest_wall = 0;

	json_array_foreach(pts, i, pt) {
		const char *name = json_string_value(json_object_get(pt, "name"));
		int64_t step = json_integer_value(json_object_get(pt, "step"));
		const json_t *jv = json_object_get(pt, "value");
		double wall = json_number_value(json_object_get(pt, "wall"));
		double v = json_is_number(jv) ? json_number_value(jv) : NAN;
		bool val = name && (strcmp(name, "val_loss") == 0 || strcmp(name, "val_accuracy") == 0);

		if (!name)
			continue;
		if (f->val_pending && step != f->val_step && (val || step > f->val_step))
			flush_val(f);
		if (step > f->st.step) {
			f->st.step = step;
			newest_wall = wall;
		}
		f->st.epoch = json_integer_value(json_object_get(pt, "epoch"));
		if (val && !f->val_pending) {
			f->val_pending = true;
			f->val_step = step;
			f->val_epoch = f->st.epoch;
			f->val_loss = f->val_acc = NAN;
		}
		if (strcmp(name, "loss") == 0) {
			f->st.loss = v;
		} else if (strcmp(name, "samples_per_sec") == 0 && isfinite(v)) {
			f->sps_ema = f->sps_ema > 0 ? 0.9 * f->sps_ema + 0.1 * v : v;
			f->st.samples_per_sec = f->sps_ema;
		} else if (strcmp(name, "step_ms") == 0 && isfinite(v)) {
			f->step_ms_ema = f->step_ms_ema > 0 ? 0.9 * f->step_ms_ema + 0.1 * v : v;
			f->last_ms = v;
		} else if (strcmp(name, "data_wait_ms") == 0 && isfinite(v)) {
			f->last_wait = v;
		} else if (strcmp(name, "val_loss") == 0) {
			f->val_loss = v;
		} else if (strcmp(name, "val_accuracy") == 0) {
			f->val_acc = v;
		}
	}
	if (f->val_pending && isfinite(f->val_loss) && isfinite(f->val_acc))
		flush_val(f);
	if (f->last_ms > 0)
		f->st.data_wait = f->last_wait / f->last_ms;
	if (newest_wall > 0) {
		f->ring[f->ring_head].wall = newest_wall;
		f->ring[f->ring_head].step = f->st.step;
		f->ring_head = (f->ring_head + 1) % RING;
		if (f->ring_n < RING)
			f->ring_n++;
	}
	/* A job followed from the queue has no total until its trainer set
	 * up, after the "running" event; the first steps say it is known. */
	if (f->st.total_steps <= 0 && tr_mono_now() - f->refreshed >= 1.0) {
		f->refreshed = tr_mono_now();
		refresh_job(f, false);
	}
	f->st.eta_s = rate_eta(f);
	f->progressed = true;
	if (!f->logs_only)
		tr_bar_update(&f->bar, &f->st, false);
}

static bool on_event(const char *event, const char *id, const char *data, void *ud)
{
	struct follow *f = ud;
	json_t *d = json_loads(data, 0, NULL);

	(void)id;
	f->got = true;
	if (strcmp(event, "state") == 0)
		on_state(f, d);
	else if (strcmp(event, "log") == 0)
		on_log(f, d);
	else if (strcmp(event, "metrics") == 0)
		on_metrics(f, d);
	json_decref(d);
	return true;
}

static bool sink(const char *data, size_t len, void *ud)
{
	struct follow *f = ud;

	return tr_sse_feed(&f->sse, data, len);
}

int tr_ctl_follow(struct tr_ctl *c, int64_t id, bool logs_only, double reconnect_timeout_s)
{
	struct follow f = {.c = c, .id = id, .logs_only = logs_only};
	char path[64], err[512], header[64];
	double outage = 0, backoff = 0.25;
	bool warned = false;
	int rc = TR_CTL_OK;

	f.st.loss = NAN;
	f.st.data_wait = NAN;
	f.st.eta_s = NAN;
	tr_bar_init(&f.bar, stdout, !logs_only && isatty(STDOUT_FILENO));
	tr_sse_init(&f.sse, on_event, &f);
	/* The job's existence and shape first: a wrong id is exit 4 here. */
	{
		struct tr_ctl_reply r;

		snprintf(path, sizeof path, "/jobs/%" PRId64, id);
		rc = tr_ctl_call(c, "GET", path, NULL, &r);
		if (rc)
			return rc;
		tr_ctl_reply_finish(&r);
		refresh_job(&f, false);
	}
	snprintf(path, sizeof path, "/jobs/%" PRId64 "/events", id);
	for (;;) {
		struct tr_ctl_reply r;
		const char *hdrs[2] = {NULL, NULL};

		if (f.sse.last_id[0]) {
			snprintf(header, sizeof header, "Last-Event-ID: %s", f.sse.last_id);
			hdrs[0] = header;
		}
		/* A frame cut by a dropped connection is not dispatched: the
		 * reconnect asks for everything after the last whole one. */
		f.sse.len = f.sse.dlen = 0;
		f.sse.event[0] = '\0';
		f.sse.after_cr = false;
		memcpy(f.sse.id, f.sse.last_id, sizeof(f.sse.id));
		rc = tr_ctl_stream(c, path, hdrs, sink, &f, &r, err, sizeof err);
		if (rc == 0 && r.status != 200) {
			if (r.status != 503) { /* 503: starting up; try again */
				tr_bar_finish(&f.bar);
				rc = tr_ctl_http_error(c, &r);
				tr_ctl_reply_finish(&r);
				break;
			}
			snprintf(err, sizeof err, "HTTP 503");
			rc = TR_CTL_UNREACHABLE;
		}
		tr_ctl_reply_finish(&r);
		if (f.terminal) {
			/* Done as asked: it ran to its end, or a stop ended it. */
			int st = tr_job_state_parse(f.state);
			rc = st == TR_JOB_COMPLETED || st == TR_JOB_STOPPED ? TR_CTL_OK : TR_CTL_JOB_FAILED;
			break;
		}
		/* The stream ended with the job still going: the daemon shut
		 * down or restarts, the connection broke, or the stream idled
		 * out.  A stream that delivered events ends the outage. */
		if (rc == 0)
			snprintf(err, sizeof err, "the daemon closed the event stream");
		if (f.got) {
			outage = 0;
			backoff = 0.25;
			warned = false;
			f.got = false;
		}
		if (outage == 0)
			outage = tr_mono_now();
		if (tr_mono_now() - outage > reconnect_timeout_s) {
			tr_bar_finish(&f.bar);
			fprintf(stderr, "trainctl: lost the daemon at %s for over %.0f s (%s); giving up\n", c->url,
				reconnect_timeout_s, err);
			rc = TR_CTL_UNREACHABLE;
			break;
		}
		if (!warned) {
			tr_bar_finish(&f.bar);
			fprintf(stderr, "trainctl: %s; reconnecting after event %s\n", err,
				f.sse.last_id[0] ? f.sse.last_id : "0");
			warned = true;
		}
		usleep((useconds_t)(backoff * 1e6));
		backoff = backoff * 2 > 2 ? 2 : backoff * 2;
	}
	tr_bar_finish(&f.bar);
	tr_sse_finish(&f.sse);
	if (logs_only && (rc == TR_CTL_OK || rc == TR_CTL_JOB_FAILED))
		return TR_CTL_OK;
	return rc;
}

int tr_cmd_watch(struct tr_ctl *c, int argc, char **argv)
{
	static const struct option opts[] = {{"reconnect-timeout", required_argument, NULL, 'r'},
					     {"help", no_argument, NULL, 'h'},
					     {NULL, 0, NULL, 0}};
	double timeout = 300;
	int ch;

	while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		if (ch == 'h')
			return tr_ctl_help("watch");
		if (ch == 'r') {
			char *end;

			timeout = strtod(optarg, &end);
			if (*end || !(timeout >= 0))
				return tr_ctl_usage("watch", "--reconnect-timeout: not a number of seconds: %s",
						    optarg);
		} else {
			return tr_ctl_usage("watch", "unknown option");
		}
	}
	if (argc - optind != 1)
		return tr_ctl_usage("watch", "expects one job id");
	int64_t id = tr_ctl_job_id("watch", argv[optind]);

	if (id < 0)
		return TR_CTL_USAGE;
	return tr_ctl_follow(c, id, false, timeout);
}
