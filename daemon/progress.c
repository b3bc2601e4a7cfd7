/* Progress display for `trainerd run`.
 *
 * On a terminal the bar is redrawn in place at most ten times a second so
 * printing never costs training time; piped into a file or journal it
 * becomes one plain line every few seconds, which reads well in logs.
 * Both show the elapsed time and the latest validation figures.  When an
 * epoch ends a summary line (its mean loss, its validation figures) is
 * printed above the bar, so the history of the run stays in the
 * scrollback while the bar only shows the present.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
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
	d->val_loss = d->val_accuracy = NAN;
	d->val_epoch = -1;
	d->have_prev = 0;
	d->epoch_loss_sum = 0;
	d->epoch_loss_n = 0;
	d->last_pending = 0;
}

void tr_progress_metric(struct tr_progress_display *d, const char *name, int64_t epoch, double value)
{
	if (strcmp(name, "val_loss") == 0)
		d->val_loss = value;
	else if (strcmp(name, "val_accuracy") == 0)
		d->val_accuracy = value;
	else
		return;
	d->val_epoch = epoch;
}

static void epochs_text(char *buf, size_t len, const struct tr_progress *p)
{
	if (p->epochs > 0)
		snprintf(buf, len, "%lld/%lld", (long long)p->epoch + 1, (long long)p->epochs);
	else
		snprintf(buf, len, "%lld", (long long)p->epoch + 1);
}

/* " val_loss 0.1234 val_acc 0.9512", or "" before the first evaluation. */
static void val_text(char *buf, size_t len, const struct tr_progress_display *d, int digits)
{
	int n = 0;
	buf[0] = 0;
	if (isfinite(d->val_loss))
		n = snprintf(buf, len, " val_loss %.*f", digits, d->val_loss);
	if (isfinite(d->val_accuracy) && n >= 0 && (size_t)n < len)
		snprintf(buf + n, len - (size_t)n, " val_acc %.4f", d->val_accuracy);
}

/* The line an epoch leaves behind, from its last progress report. */
static void epoch_line(struct tr_progress_display *d)
{
	const struct tr_progress *p = &d->prev;
	char epochs[48], el[32], val[96] = "";
	epochs_text(epochs, sizeof epochs, p);
	fmt_duration(el, sizeof el, p->elapsed_s);
	if (d->val_epoch == p->epoch)
		val_text(val, sizeof val, d, 4);
	if (d->is_tty && d->printed_bar)
		fputs("\r\033[K", d->out); /* the bar's line becomes the summary */
	fprintf(d->out, "epoch %s: loss %.4f%s elapsed %s (step %lld/%lld, %.0f samples/s)\n", epochs,
		d->epoch_loss_n ? d->epoch_loss_sum / (double)d->epoch_loss_n : p->loss, val, el, (long long)p->step,
		(long long)p->total_steps, p->samples_per_sec);
	d->printed_bar = 0;
	d->epoch_loss_sum = 0;
	d->epoch_loss_n = 0;
}

void tr_progress_update(struct tr_progress_display *d, const struct tr_progress *p)
{
	double now = now_s();
	bool last = p->step == p->total_steps;
	if (d->have_prev && p->epoch != d->prev.epoch)
		epoch_line(d);
	d->prev = *p;
	d->have_prev = 1;
	d->epoch_loss_sum += p->loss;
	d->epoch_loss_n++;
	if (last) {
		/* The bar at 100% becomes the epoch's summary at finish, after
		 * the final evaluation (the trainer reports a step's progress
		 * before the evaluation that follows it). */
		d->last_pending = 1;
		return;
	}
	double interval = d->is_tty ? 0.1 : 5.0;
	if (!last && now - d->last_print < interval && d->last_print > 0)
		return;
	d->last_print = now;
	double frac = p->total_steps > 0 ? (double)p->step / (double)p->total_steps : 0;
	char eta[32], el[32], epochs[48], val[96];
	fmt_duration(eta, sizeof eta, p->eta_s);
	fmt_duration(el, sizeof el, p->elapsed_s);
	epochs_text(epochs, sizeof epochs, p);
	if (d->is_tty) {
		char bar[31];
		int filled = (int)(frac * 30);
		for (int i = 0; i < 30; i++)
			bar[i] = i < filled ? '#' : '.';
		bar[30] = 0;
		val_text(val, sizeof val, d, 4);
		fprintf(d->out,
			"\r[%s] %3d%% step %lld/%lld epoch %s loss %.4f%s %.0f samples/s wait %2.0f%% elapsed %s ETA %s\033[K",
			bar, (int)(frac * 100), (long long)p->step, (long long)p->total_steps, epochs, p->loss, val,
			p->samples_per_sec, p->data_wait_fraction * 100, el, eta);
		d->printed_bar = 1;
	} else {
		val_text(val, sizeof val, d, 6);
		fprintf(d->out,
			"step %lld/%lld (%d%%) epoch %s loss %.6f%s samples/s %.0f data_wait %.1f%% elapsed %s eta %s\n",
			(long long)p->step, (long long)p->total_steps, (int)(frac * 100), epochs, p->loss, val,
			p->samples_per_sec, p->data_wait_fraction * 100, el, eta);
	}
	fflush(d->out);
}

void tr_progress_finish(struct tr_progress_display *d)
{
	if (d->last_pending) {
		epoch_line(d);
		d->last_pending = 0;
		d->have_prev = 0;
	}
	if (d->is_tty && d->printed_bar)
		fputc('\n', d->out);
	fflush(d->out);
}
