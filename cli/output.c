/* trainctl's output: aligned tables, human units, JSON, and the live
 * progress line of `watch`.  On a terminal the bar is redrawn in place at
 * most ten times a second; piped into a file or another program, progress
 * becomes one plain line every few seconds that reads well in logs and
 * greps easily, and no control characters are written.
 */
#include "cli/trainctl.h"
#include "core/json_text.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double tr_mono_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- tables ---- */

void tr_table_init(struct tr_table *t, int ncols, const char **heads, const bool *right)
{
	memset(t, 0, sizeof(*t));
	t->ncols = ncols;
	t->heads = heads;
	t->right = calloc((size_t)ncols, sizeof(bool));
	for (int i = 0; right && t->right && i < ncols; i++)
		t->right[i] = right[i];
}

void tr_table_add(struct tr_table *t, ...)
{
	va_list ap;

	if (t->nrows == t->cap) {
		int ncap = t->cap ? t->cap * 2 : 16;
		char **nc = realloc(t->cells, (size_t)ncap * (size_t)t->ncols * sizeof(char *));

		if (!nc)
			return;
		t->cells = nc;
		t->cap = ncap;
	}
	va_start(ap, t);
	for (int i = 0; i < t->ncols; i++) {
		const char *s = va_arg(ap, const char *);

		t->cells[t->nrows * t->ncols + i] = strdup(s ? s : "-");
	}
	va_end(ap);
	t->nrows++;
}

void tr_table_print(struct tr_table *t, FILE *out)
{
	size_t *w = calloc((size_t)t->ncols, sizeof(size_t));

	if (!w)
		return;
	for (int c = 0; c < t->ncols; c++) {
		w[c] = strlen(t->heads[c]);
		for (int r = 0; r < t->nrows; r++) {
			const char *s = t->cells[r * t->ncols + c];
			size_t n = s ? strlen(s) : 0;

			if (n > w[c])
				w[c] = n;
		}
	}
	for (int r = -1; r < t->nrows; r++) {
		for (int c = 0; c < t->ncols; c++) {
			const char *s = r < 0 ? t->heads[c] : t->cells[r * t->ncols + c];
			bool last = c == t->ncols - 1;

			if (!s)
				s = "";
			if (t->right[c])
				fprintf(out, "%*s", (int)w[c], s);
			else if (last)
				fputs(s, out);
			else
				fprintf(out, "%-*s", (int)w[c], s);
			fputs(last ? "\n" : "  ", out);
		}
	}
	free(w);
}

void tr_table_finish(struct tr_table *t)
{
	for (int i = 0; i < t->nrows * t->ncols; i++)
		free(t->cells[i]);
	free(t->cells);
	free(t->right);
	memset(t, 0, sizeof(*t));
}

/* ---- units ---- */

void tr_fmt_duration(char *buf, size_t len, double s)
{
	long t;

	if (!isfinite(s) || s < 0) {
		snprintf(buf, len, "-");
		return;
	}
	t = (long)(s + 0.5);
	if (t >= 3600)
		snprintf(buf, len, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
	else
		snprintf(buf, len, "%ld:%02ld", t / 60, t % 60);
}

void tr_fmt_time(char *buf, size_t len, const char *t)
{
	struct tm tm = {0};
	double at;
	time_t when;

	if (!t || !tr_rfc3339_parse(t, &at)) {
		snprintf(buf, len, "-");
		return;
	}
	when = (time_t)at;
	localtime_r(&when, &tm);
	strftime(buf, len, "%Y-%m-%d %H:%M:%S", &tm);
}

void tr_print_json(const json_t *j, FILE *out)
{
	tr_json_dumpf(j, out, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	fputc('\n', out);
}

/* ---- the progress bar ---- */

void tr_bar_init(struct tr_bar *b, FILE *out, bool tty)
{
	memset(b, 0, sizeof(*b));
	b->out = out;
	b->tty = tty;
	b->interval = tty ? 0.1 : 5.0;
}

static void clear(struct tr_bar *b)
{
	if (b->tty && b->drawn) {
		fputs("\r\033[K", b->out);
		b->drawn = false;
	}
}

void tr_bar_update(struct tr_bar *b, const struct tr_bar_state *s, bool force)
{
	double now = tr_mono_now(), frac;
	char eta[32], epochs[48], loss[32], wait[16];

	if (!force && b->last > 0 && now - b->last < b->interval)
		return;
	b->last = now;
	b->printed_step = s->step;
	frac = s->total_steps > 0 ? (double)s->step / (double)s->total_steps : 0;
	if (frac > 1)
		frac = 1;
	tr_fmt_duration(eta, sizeof eta, s->eta_s);
	if (s->epochs > 0)
		snprintf(epochs, sizeof epochs, "%lld/%lld", (long long)s->epoch + 1, (long long)s->epochs);
	else
		snprintf(epochs, sizeof epochs, "%lld", (long long)s->epoch + 1);
	if (isfinite(s->loss))
		snprintf(loss, sizeof loss, "%.4f", s->loss);
	else
		snprintf(loss, sizeof loss, "-");
	if (isfinite(s->data_wait))
		snprintf(wait, sizeof wait, "%.0f%%", s->data_wait * 100);
	else
		snprintf(wait, sizeof wait, "-");
	if (b->tty) {
		char bar[31];
		int filled = (int)(frac * 30);

		for (int i = 0; i < 30; i++)
			bar[i] = i < filled ? '#' : '.';
		bar[30] = '\0';
		clear(b);
		fprintf(b->out, "[%s] %3d%% step %lld/%lld epoch %s loss %s %.0f samples/s wait %s ETA %s", bar,
			(int)(frac * 100), (long long)s->step, (long long)s->total_steps, epochs, loss,
			s->samples_per_sec, wait, eta);
		b->drawn = true;
	} else {
		fprintf(b->out, "step %lld/%lld (%d%%) epoch %s loss %s samples/s %.0f data_wait %s eta %s\n",
			(long long)s->step, (long long)s->total_steps, (int)(frac * 100), epochs, loss,
			s->samples_per_sec, wait, eta);
	}
	fflush(b->out);
}

void tr_bar_line(struct tr_bar *b, const char *fmt, ...)
{
	va_list ap;

	clear(b);
	va_start(ap, fmt);
	vfprintf(b->out, fmt, ap);
	va_end(ap);
	fputc('\n', b->out);
	fflush(b->out);
	/* On a terminal the next update redraws the bar at once; piped,
	 * progress lines keep their own pace. */
	if (b->tty)
		b->last = 0;
}

void tr_bar_finish(struct tr_bar *b)
{
	if (b->tty && b->drawn)
		fputc('\n', b->out);
	b->drawn = false;
	fflush(b->out);
}
