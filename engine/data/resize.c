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

int tr_image_resize(const float *src, int c, int h, int w, float *dst, int oh, int ow)
{
	struct taps th = {0}, tw = {0};
	float *mid = malloc((size_t)c * (size_t)oh * (size_t)w * sizeof(float));
	int ret = -ENOMEM;

	if (!mid || make_taps(h, oh, &th) || make_taps(w, ow, &tw))
		goto out;
	for (int ch = 0; ch < c; ch++) {
		const float *s = src + (size_t)ch * h * w;
		float *m = mid + (size_t)ch * oh * w;
		float *d = dst + (size_t)ch * oh * ow;

		for (int y = 0; y < oh; y++) {
			const int *ix = th.idx + y * th.n;
			const double *wt = th.w + y * th.n;

			for (int x = 0; x < w; x++) {
				double acc = 0.0;

				for (int k = 0; k < th.n; k++)
					acc += wt[k] * s[(size_t)ix[k] * w + x];
				m[(size_t)y * w + x] = (float)acc;
			}
		}
		for (int y = 0; y < oh; y++) {
			for (int x = 0; x < ow; x++) {
				const int *ix = tw.idx + x * tw.n;
				const double *wt = tw.w + x * tw.n;
				double acc = 0.0;

				for (int k = 0; k < tw.n; k++)
					acc += wt[k] * m[(size_t)y * w + ix[k]];
				d[(size_t)y * ow + x] = (float)acc;
			}
		}
	}
	ret = 0;
out:
	free_taps(&th);
	free_taps(&tw);
	free(mid);
	return ret;
}
