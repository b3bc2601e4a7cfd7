/* CPU kernels for normalisation over image batches: batchnorm2d's
 * per-channel pieces and groupnorm (engine/backend.h, "norm2d").
 *
 * Tensors are NCHW: n samples of c channels of hw positions, so a channel
 * of one sample is a contiguous run of hw floats.  batchnorm2d's statistics
 * span the whole step, which may be split over devices: these kernels only
 * sum over this device's samples, the layer allreduces the sums between the
 * devices and hands the global sums back (docs/design.md, "Normalisation
 * over the global batch").  Sums accumulate in double per device, as the
 * layernorm kernels do, so the float allreduce of a few partial sums is the
 * only rounding that depends on the device count.  Loops are plain and run
 * on the calling device thread: results do not depend on the BLAS thread
 * count.
 */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "engine/cpu/cpu_internal.h"

#define ENSURE_SHAPE(what) ENSURE(n >= 0 && c >= 1 && hw >= 1, what ": bad shape n=%d c=%d hw=%d", n, c, hw)

/* ---- batchnorm2d -------------------------------------------------------- */

static int cpu_bn_sums(tr_backend_t *be, int dev, int n, int c, int hw, const float *x, const float *mean, float *out)
{
	ENSURE_DEV("bn_sums");
	ENSURE_SHAPE("bn_sums");
	for (int ch = 0; ch < c; ch++) {
		double s = 0.0;
		float mu = mean ? mean[ch] : 0.0f;
		for (int i = 0; i < n; i++) {
			const float *p = x + ((size_t)i * c + ch) * hw;
			if (mean) {
				for (int k = 0; k < hw; k++) {
					double d = (double)p[k] - mu;
					s += d * d;
				}
			} else {
				for (int k = 0; k < hw; k++)
					s += p[k];
			}
		}
		out[ch] = (float)s;
	}
	return 0;
}

static int cpu_bn_apply(tr_backend_t *be, int dev, int n, int c, int hw, float eps, const float *x, const float *mean,
			const float *var, const float *gamma, const float *beta, float *y)
{
	ENSURE_DEV("bn_apply");
	ENSURE_SHAPE("bn_apply");
	for (int ch = 0; ch < c; ch++) {
		float mu = mean[ch];
		float is = (float)(1.0 / sqrt((double)var[ch] + eps));
		float g = gamma[ch], b = beta[ch];
		for (int i = 0; i < n; i++) {
			size_t o = ((size_t)i * c + ch) * hw;
			for (int k = 0; k < hw; k++)
				y[o + k] = (x[o + k] - mu) * is * g + b;
		}
	}
	return 0;
}

static int cpu_bn_running_update(tr_backend_t *be, int dev, int c, float momentum, double count, const float *mean,
				 const float *var, float *run_mean, float *run_var, float *batches)
{
	ENSURE_DEV("bn_running_update");
	ENSURE(c >= 1, "bn_running_update: bad shape c=%d", c);
	ENSURE(count > 1.0,
	       "batchnorm2d: this step has %g value(s) per channel, and the variance of one value is undefined "
	       "(PyTorch refuses it too); use a larger batch or last_batch \"drop\"",
	       count);
	/* torch.nn.BatchNorm2d: the running variance is the unbiased one */
	float unbias = (float)(count / (count - 1.0));
	for (int ch = 0; ch < c; ch++) {
		run_mean[ch] = (1.0f - momentum) * run_mean[ch] + momentum * mean[ch];
		run_var[ch] = (1.0f - momentum) * run_var[ch] + momentum * var[ch] * unbias;
	}
	batches[0] += 1.0f;
	return 0;
}

static int cpu_bn_backward_sums(tr_backend_t *be, int dev, int n, int c, int hw, float eps, const float *x,
				const float *mean, const float *var, const float *dy, float *sums, float *dgamma,
				float *dbeta)
{
	ENSURE_DEV("bn_backward_sums");
	ENSURE_SHAPE("bn_backward_sums");
	for (int ch = 0; ch < c; ch++) {
		double sdy = 0.0, sdyx = 0.0;
		float mu = mean[ch];
		for (int i = 0; i < n; i++) {
			size_t o = ((size_t)i * c + ch) * hw;
			for (int k = 0; k < hw; k++) {
				sdy += dy[o + k];
				sdyx += (double)dy[o + k] * ((double)x[o + k] - mu);
			}
		}
		sums[ch] = (float)sdy;
		sums[c + ch] = (float)sdyx;
		if (dbeta)
			dbeta[ch] = (float)sdy;
		if (dgamma)
			dgamma[ch] = (float)(sdyx / sqrt((double)var[ch] + eps));
	}
	return 0;
}

/* torch's batch_norm_backward_elemt: dx = (dy - mean(dy) - (x - mean)
 * invstd^2 mean(dy (x - mean))) invstd gamma, the means over the step. */
static int cpu_bn_backward_apply(tr_backend_t *be, int dev, int n, int c, int hw, float eps, double count,
				 const float *x, const float *mean, const float *var, const float *gamma,
				 const float *sums, const float *dy, float *dx)
{
	ENSURE_DEV("bn_backward_apply");
	ENSURE_SHAPE("bn_backward_apply");
	ENSURE(count > 0.0, "bn_backward_apply: count %g", count);
	for (int ch = 0; ch < c; ch++) {
		double is = 1.0 / sqrt((double)var[ch] + eps);
		float mdy = (float)(sums[ch] / count);
		float k = (float)(is * is * (sums[c + ch] / count));
		float mu = mean[ch];
		float gs = (float)(is * gamma[ch]);
		for (int i = 0; i < n; i++) {
			size_t o = ((size_t)i * c + ch) * hw;
			for (int j = 0; j < hw; j++)
				dx[o + j] = (dy[o + j] - mdy - (x[o + j] - mu) * k) * gs;
		}
	}
	return 0;
}

/* ---- groupnorm ---------------------------------------------------------- */

/* torch.nn.GroupNorm: per sample and group of c/groups channels, biased
 * variance, eps inside the square root, then a per-channel affine.  Two
 * passes in double, as layernorm. */
static int cpu_groupnorm_forward(tr_backend_t *be, int dev, int n, int c, int hw, int groups, float eps, const float *x,
				 const float *gamma, const float *beta, float *y, float *mean, float *rstd)
{
	ENSURE_DEV("groupnorm_forward");
	ENSURE_SHAPE("groupnorm_forward");
	ENSURE(groups >= 1 && c % groups == 0, "groupnorm_forward: %d channels in %d groups", c, groups);
	int cg = c / groups;
	size_t len = (size_t)cg * hw;
	for (int i = 0; i < n; i++) {
		for (int g = 0; g < groups; g++) {
			size_t o = ((size_t)i * c + (size_t)g * cg) * hw;
			double s = 0.0, ss = 0.0;
			for (size_t k = 0; k < len; k++)
				s += x[o + k];
			double mu = s / (double)len;
			for (size_t k = 0; k < len; k++) {
				double d = x[o + k] - mu;
				ss += d * d;
			}
			float m = (float)mu;
			float rs = (float)(1.0 / sqrt(ss / (double)len + eps));
			for (int cc = 0; cc < cg; cc++) {
				int ch = g * cg + cc;
				size_t oc = o + (size_t)cc * hw;
				for (int k = 0; k < hw; k++)
					y[oc + k] = (x[oc + k] - m) * rs * gamma[ch] + beta[ch];
			}
			mean[(size_t)i * groups + g] = m;
			rstd[(size_t)i * groups + g] = rs;
		}
	}
	return 0;
}

/* Per sample and group, with g = dy * gamma and xh the normalised input:
 * dx = rstd (g - mean(g) - xh mean(g xh)); dgamma, dbeta summed over
 * samples and positions (overwritten). */
static int cpu_groupnorm_backward(tr_backend_t *be, int dev, int n, int c, int hw, int groups, const float *x,
				  const float *gamma, const float *mean, const float *rstd, const float *dy, float *dx,
				  float *dgamma, float *dbeta)
{
	ENSURE_DEV("groupnorm_backward");
	ENSURE_SHAPE("groupnorm_backward");
	ENSURE(groups >= 1 && c % groups == 0, "groupnorm_backward: %d channels in %d groups", c, groups);
	int cg = c / groups;
	double len = (double)cg * hw;
	for (int ch = 0; ch < c; ch++) {
		double sg = 0.0, sb = 0.0;
		int g = ch / cg;
		for (int i = 0; i < n; i++) {
			size_t o = ((size_t)i * c + ch) * hw;
			float m = mean[(size_t)i * groups + g], rs = rstd[(size_t)i * groups + g];
			for (int k = 0; k < hw; k++) {
				sg += (double)dy[o + k] * ((x[o + k] - m) * rs);
				sb += dy[o + k];
			}
		}
		dgamma[ch] = (float)sg;
		dbeta[ch] = (float)sb;
	}
	if (!dx)
		return 0;
	for (int i = 0; i < n; i++) {
		for (int g = 0; g < groups; g++) {
			float m = mean[(size_t)i * groups + g], rs = rstd[(size_t)i * groups + g];
			double s1 = 0.0, s2 = 0.0;
			for (int cc = 0; cc < cg; cc++) {
				int ch = g * cg + cc;
				size_t o = ((size_t)i * c + ch) * hw;
				for (int k = 0; k < hw; k++) {
					float gv = dy[o + k] * gamma[ch];
					s1 += gv;
					s2 += (double)gv * ((x[o + k] - m) * rs);
				}
			}
			float a = (float)(s1 / len), b = (float)(s2 / len);
			for (int cc = 0; cc < cg; cc++) {
				int ch = g * cg + cc;
				size_t o = ((size_t)i * c + ch) * hw;
				for (int k = 0; k < hw; k++) {
					float xh = (x[o + k] - m) * rs;
					dx[o + k] = rs * (dy[o + k] * gamma[ch] - a - xh * b);
				}
			}
		}
	}
	return 0;
}

void tr_cpu_norm2d_fill(tr_backend_i *t)
{
	t->bn_sums = cpu_bn_sums;
	t->bn_apply = cpu_bn_apply;
	t->bn_running_update = cpu_bn_running_update;
	t->bn_backward_sums = cpu_bn_backward_sums;
	t->bn_backward_apply = cpu_bn_backward_apply;
	t->groupnorm_forward = cpu_groupnorm_forward;
	t->groupnorm_backward = cpu_groupnorm_backward;
}
