/* Bicubic resampling as MATLAB's imresize (see image.h).
 *
 * Separable: rows first, then columns, each through a table of (source
 * index, weight) per output position computed as imresize's contributions()
 * does: the cubic of Keys with a = -0.5, stretched by 1/scale when
 * shrinking so the result is low-passed rather than aliased, weights
 * normalised to sum to 1, source indices outside the image mirrored
 * (symmetric padding).  The super-resolution degradation (patches.c) is
 * this kernel down by the factor and up again, as in MATLAB's VDSR
 * example, so a net trained here is compared with the same bicubic
 * baseline.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "engine/data/image.h"

static double cubic(double x)
{
	double a = fabs(x), a2 = a * a, a3 = a2 * a;

	if (a <= 1.0)
		return 1.5 * a3 - 2.5 * a2 + 1.0;
	if (a <= 2.0)
		return -0.5 * a3 + 2.5 * a2 - 4.0 * a + 2.0;
	return 0.0;
}

struct taps {
	int n;     /* taps per output position */
	int *idx;  /* [out][n] */
	double *w; /* [out][n] */
};

static int mirror(int i, int len)
{
	int period = 2 * len;

	i %= period;
	if (i < 0)
		i += period;
	return i < len ? i : period - 1 - i;
}

static int make_taps(int in, int out, struct taps *t)
{
	double scale = (double)out / in;
	double stretch = scale < 1.0 ? scale : 1.0;
	double width = 4.0 / stretch;

	t->n = (int)ceil(width) + 2;
	t->idx = malloc((size_t)out * (size_t)t->n * sizeof(int));
	t->w = malloc((size_t)out * (size_t)t->n * sizeof(double));
	if (!t->idx || !t->w)
		return -ENOMEM;
	for (int o = 0; o < out; o++) {
		double u = (o + 0.5) / scale - 0.5;
		int left = (int)floor(u - width / 2.0);
		double sum = 0.0;

		for (int k = 0; k < t->n; k++) {
			int i = left + k;
			double w = stretch * cubic(stretch * (u - i));

			t->idx[o * t->n + k] = mirror(i, in);
			t->w[o * t->n + k] = w;
			sum += w;
		}
		for (int k = 0; k < t->n; k++)
			t->w[o * t->n + k] /= sum;
	}
	return 0;
}

static void free_taps(struct taps *t)
{
	free(t->idx);
	free(t->w);
}

/* Row y of the vertical pass, one channel: rows[k] is the input row of
 * tap k (w floats), m receives w floats. */
static void vertical_row(const struct taps *th, int y, const float *const *rows, int w, float *m)
{
	const double *wt = th->w + y * th->n;

	for (int x = 0; x < w; x++) {
		double acc = 0.0;

		for (int k = 0; k < th->n; k++)
			acc += wt[k] * rows[k][x];
		m[x] = (float)acc;
	}
}

/* The horizontal pass of one channel: m [oh][w] to d [oh][ow]. */
static void horizontal(const struct taps *tw, const float *m, int oh, int w, int ow, float *d)
{
	for (int y = 0; y < oh; y++) {
		for (int x = 0; x < ow; x++) {
			const int *ix = tw->idx + x * tw->n;
			const double *wt = tw->w + x * tw->n;
			double acc = 0.0;

			for (int k = 0; k < tw->n; k++)
				acc += wt[k] * m[(size_t)y * w + ix[k]];
			d[(size_t)y * ow + x] = (float)acc;
		}
	}
}

int tr_image_resize(const float *src, int c, int h, int w, float *dst, int oh, int ow)
{
	struct taps th = {0}, tw = {0};
	float *mid = malloc((size_t)c * (size_t)oh * (size_t)w * sizeof(float));
	const float **rows = NULL;
	int ret = -ENOMEM;

	if (!mid || make_taps(h, oh, &th) || make_taps(w, ow, &tw) || !(rows = malloc((size_t)th.n * sizeof(*rows))))
		goto out;
	for (int ch = 0; ch < c; ch++) {
		const float *s = src + (size_t)ch * h * w;
		float *m = mid + (size_t)ch * oh * w;

		for (int y = 0; y < oh; y++) {
			for (int k = 0; k < th.n; k++)
				rows[k] = s + (size_t)th.idx[y * th.n + k] * w;
			vertical_row(&th, y, rows, w, m + (size_t)y * w);
		}
		horizontal(&tw, m, oh, w, ow, dst + (size_t)ch * oh * ow);
	}
	ret = 0;
out:
	free(rows);
	free_taps(&th);
	free_taps(&tw);
	free(mid);
	return ret;
}

/* ---- streaming ---- */

struct tr_resize_stream {
	int c, h, w, oh, ow;
	struct taps th, tw;
	int span;           /* rows the ring holds: the widest window of taps */
	float *ring;        /* span rows of [c][w] */
	float *mid;         /* [c][oh][w] */
	const float **rows; /* per tap, for vertical_row */
	int *hi;            /* per output row: the last input row its taps reach */
	int next_in, next_out;
};

int tr_resize_stream_create(int c, int h, int w, int oh, int ow, tr_resize_stream_t **out)
{
	struct tr_resize_stream *s = calloc(1, sizeof(*s));
	int ret = -ENOMEM, prev_lo = 0, prev_hi = 0;

	*out = NULL;
	if (!s || make_taps(h, oh, &s->th) || make_taps(w, ow, &s->tw) || !(s->hi = malloc((size_t)oh * sizeof(int))) ||
	    !(s->rows = malloc((size_t)s->th.n * sizeof(*s->rows))))
		goto fail;
	s->c = c, s->h = h, s->w = w, s->oh = oh, s->ow = ow;
	/* The ring works when each output row's window of input rows starts
	 * and ends no earlier than the one before (true of the mirrored
	 * bicubic taps in practice; checked, not assumed). */
	for (int y = 0; y < oh; y++) {
		int lo = h, hi = 0;

		for (int k = 0; k < s->th.n; k++) {
			int i = s->th.idx[y * s->th.n + k];

			lo = i < lo ? i : lo;
			hi = i > hi ? i : hi;
		}
		if (y > 0 && (lo < prev_lo || hi < prev_hi)) {
			ret = -ENOTSUP;
			goto fail;
		}
		s->hi[y] = hi;
		s->span = hi - lo + 1 > s->span ? hi - lo + 1 : s->span;
		prev_lo = lo, prev_hi = hi;
	}
	s->ring = malloc((size_t)s->span * (size_t)c * (size_t)w * sizeof(float));
	s->mid = malloc((size_t)c * (size_t)oh * (size_t)w * sizeof(float));
	if (!s->ring || !s->mid)
		goto fail;
	*out = s;
	return 0;
fail:
	tr_resize_stream_destroy(s);
	return ret;
}

float *tr_resize_stream_slot(tr_resize_stream_t *s)
{
	return s->ring + (size_t)(s->next_in % s->span) * s->c * s->w;
}

void tr_resize_stream_push(tr_resize_stream_t *s)
{
	int r = s->next_in++;

	/* Every output row whose taps end at this input row: its window is
	 * in the ring (it spans at most `span` rows, the newest being r). */
	while (s->next_out < s->oh && s->hi[s->next_out] <= r) {
		int y = s->next_out++;

		for (int ch = 0; ch < s->c; ch++) {
			for (int k = 0; k < s->th.n; k++) {
				int i = s->th.idx[y * s->th.n + k];

				s->rows[k] = s->ring + ((size_t)(i % s->span) * s->c + ch) * s->w;
			}
			vertical_row(&s->th, y, s->rows, s->w, s->mid + ((size_t)ch * s->oh + y) * s->w);
		}
	}
}

void tr_resize_stream_finish(tr_resize_stream_t *s, float *dst)
{
	for (int ch = 0; ch < s->c; ch++)
		horizontal(&s->tw, s->mid + (size_t)ch * s->oh * s->w, s->oh, s->w, s->ow,
			   dst + (size_t)ch * s->oh * s->ow);
}

void tr_resize_stream_destroy(tr_resize_stream_t *s)
{
	if (!s)
		return;
	free_taps(&s->th);
	free_taps(&s->tw);
	free(s->ring);
	free(s->mid);
	free(s->rows);
	free(s->hi);
	free(s);
}
