/* Progress display for `trainerd run`.
 *
 * On a terminal the bar is redrawn in place at most ten times a second so
 * printing never costs training time; piped into a file or journal it
 * becomes one plain line every few seconds, which reads well in logs.
 */
#include <math.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "daemon/cli.h"

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void fmt_duration(char *buf, size_t len, double s)
{
	if (!isfinite(s) || s < 0)
		s = 0;
	long t = (long)(s + 0.5);
	if (t >= 3600)
		snprintf(buf, len, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
	else
		snprintf(buf, len, "%ld:%02ld", t / 60, t % 60);
}

void tr_progress_init(struct tr_progress_display *d, FILE *out)
{
	d->out = out;
	d->is_tty = isatty(fileno(out));
	d->last_print = 0;
	d->printed_bar = 0;
}

void tr_progress_update(struct tr_progress_display *d, const struct tr_progress *p)
{
	double now = now_s();
	bool last = p->step == p->total_steps;
	double interval = d->is_tty ? 0.1 : 5.0;
	if (!last && now - d->last_print < interval && d->last_print > 0)
		return;
	d->last_print = now;
	double frac = p->total_steps > 0 ? (double)p->step / (double)p->total_steps : 0;
	char eta[32], el[32], epochs[48];
	fmt_duration(eta, sizeof eta, p->eta_s);
	fmt_duration(el, sizeof el, p->elapsed_s);
	if (p->epochs > 0)
		snprintf(epochs, sizeof epochs, "%lld/%lld", (long long)p->epoch + 1, (long long)p->epochs);
	else
		snprintf(epochs, sizeof epochs, "%lld", (long long)p->epoch + 1);
	if (d->is_tty) {
		char bar[31];
		int filled = (int)(frac * 30);
		for (int i = 0; i < 30; i++)
			bar[i] = i < filled ? '#' : '.';
		bar[30] = 0;
		fprintf(d->out, "\r[%s] %3d%% step %lld/%lld epoch %s loss %.4f %.0f samples/s wait %2.0f%% ETA %s ",
			bar, (int)(frac * 100), (long long)p->step, (long long)p->total_steps, epochs, p->loss,
			p->samples_per_sec, p->data_wait_fraction * 100, eta);
		d->printed_bar = 1;
	} else {
		fprintf(d->out,
			"step %lld/%lld (%d%%) epoch %s loss %.6f samples/s %.0f data_wait %.1f%% elapsed %s eta %s\n",
			(long long)p->step, (long long)p->total_steps, (int)(frac * 100), epochs, p->loss,
			p->samples_per_sec, p->data_wait_fraction * 100, el, eta);
	}
	fflush(d->out);
}

void tr_progress_finish(struct tr_progress_display *d)
{
	if (d->is_tty && d->printed_bar)
		fputc('\n', d->out);
	fflush(d->out);
}
