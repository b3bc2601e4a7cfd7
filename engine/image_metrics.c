/* PSNR and SSIM (image_metrics.h). */
#include "engine/image_metrics.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#define WIN 11
#define SIGMA 1.5

double tr_psnr(double mse, double range)
{
	return 10.0 * log10(range * range / mse);
}

double tr_ssim(const float *a, const float *b, int c, int h, int w, double range)
{
	int s = WIN < h ? WIN : h;
	s = s < w ? s : w;
	if (!(s & 1))
		s--;
	double g[WIN], sum = 0.0;
	for (int i = 0; i < s; i++) {
		double d = i - (s - 1) / 2.0;
		g[i] = exp(-d * d / (2.0 * SIGMA * SIGMA));
		sum += g[i];
	}
	for (int i = 0; i < s; i++)
		g[i] /= sum;
	const double c1 = (0.01 * range) * (0.01 * range), c2 = (0.03 * range) * (0.03 * range);
	double total = 0.0;
	int64_t count = 0;
	for (int ch = 0; ch < c; ch++) {
		const float *pa = a + (size_t)ch * h * w, *pb = b + (size_t)ch * h * w;
		for (int y = 0; y + s <= h; y++)
			for (int x = 0; x + s <= w; x++) {
				double ma = 0, mb = 0, aa = 0, bb = 0, ab = 0;
				for (int i = 0; i < s; i++)
					for (int j = 0; j < s; j++) {
						double wt = g[i] * g[j];
						double va = pa[(size_t)(y + i) * w + x + j],
						       vb = pb[(size_t)(y + i) * w + x + j];
						ma += wt * va;
						mb += wt * vb;
						aa += wt * va * va;
						bb += wt * vb * vb;
						ab += wt * va * vb;
					}
				double sa = aa - ma * ma, sb = bb - mb * mb, sab = ab - ma * mb;
				total += ((2 * ma * mb + c1) * (2 * sab + c2)) /
					 ((ma * ma + mb * mb + c1) * (sa + sb + c2));
				count++;
			}
	}
	return count ? total / (double)count : NAN;
}
