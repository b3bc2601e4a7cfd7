/* CUDA kernels, normalisation over image batches: batchnorm2d's
 * per-channel pieces (bn_*) and groupnorm (engine/backend.h, "norm2d";
 * engine/cuda/kernels_common.cuh).
 *
 * The CPU's kernels (engine/cpu/cpu_norm2d.c) step for step.  Tensors are
 * NCHW: n samples of c channels of hw positions.  batchnorm2d's
 * statistics span the step on every device: these kernels only sum over
 * this device's samples and the layer allreduces the sums through the
 * backend's collective, NCCL here (engine/model/norm2d.c, docs/design.md
 * "Normalisation over the global batch"), so the contract, and what
 * rounding depends on the device count, is the CPU's.
 *
 * Every sum accumulates in double, as the CPU's, in a fixed tree: a
 * per-channel sum spreads the channel's n x hw values over `slices` blocks
 * (a function of the shape alone, at most TR_CUDA_RED_SLOTS blocks in
 * all), whose double partials one thread per channel adds in slice order;
 * a groupnorm statistic is one block's.  No atomics, so results repeat run
 * to run.  The float formulas after the sums are the CPU's in its
 * operation order (--fmad=false), so with the same statistics bn_apply,
 * bn_backward_apply and bn_running_update give the CPU's bits.
 */
#include "engine/cuda/kernels_common.cuh"

/* Values one thread sums before a channel gets another block. */
#define PER_THREAD 8u

/* ==== kernels ============================================================ */

/* What a per-channel sum adds for the value at o (sample i, channel ch):
 * two quantities, a and b. */
struct sum_x { /* bn_sums without a mean */
	const float *x;
	__device__ void operator()(size_t o, size_t, int, double *a, double *) const
	{
		*a += x[o];
	}
};

struct sum_sq_dev { /* bn_sums with a mean: (x - mean)^2 */
	const float *x, *mean;
	__device__ void operator()(size_t o, size_t, int ch, double *a, double *) const
	{
		double d = (double)x[o] - mean[ch];
		*a += d * d;
	}
};

struct sum_bn_backward { /* dy and dy (x - mean) */
	const float *x, *mean, *dy;
	__device__ void operator()(size_t o, size_t, int ch, double *a, double *b) const
	{
		*a += dy[o];
		*b += (double)dy[o] * ((double)x[o] - mean[ch]);
	}
};

struct sum_gn_params { /* dy xhat and dy, xhat from sample i's group statistics */
	const float *x, *mean, *rstd, *dy;
	int groups, cg;
	__device__ void operator()(size_t o, size_t i, int ch, double *a, double *b) const
	{
		size_t s = i * groups + ch / cg;
		float m = mean[s], rs = rstd[s];
		*a += (double)dy[o] * ((x[o] - m) * rs);
		*b += dy[o];
	}
};

/* What a channel's totals become. */
struct put_sum { /* bn_sums */
	float *out;
	__device__ void operator()(int ch, double a, double) const
	{
		out[ch] = (float)a;
	}
};

struct put_bn_backward {
	int c;
	float eps;
	const float *var;
	float *sums, *dgamma, *dbeta;
	__device__ void operator()(int ch, double a, double b) const
	{
		sums[ch] = (float)a;
		sums[c + ch] = (float)b;
		if (dbeta)
			dbeta[ch] = (float)a;
		if (dgamma)
			dgamma[ch] = (float)(b / sqrt((double)var[ch] + eps));
	}
};

struct put_gn_params {
	float *dgamma, *dbeta;
	__device__ void operator()(int ch, double a, double b) const
	{
		dgamma[ch] = (float)a;
		dbeta[ch] = (float)b;
	}
};

/* First pass of a per-channel sum: block (ch, s) of c x slices sums the
 * channel's values j = s BLOCK + t, stepping slices x BLOCK, over the n
 * samples' runs of hw.  With one slice the block's totals are final. */
template <class F, class W>
__global__ void k_channel_sums(int n, int c, int hw, unsigned slices, F f, W w, double *partials)
{
	int ch = (int)(blockIdx.x / slices);
	unsigned s = blockIdx.x % slices;
	size_t per = (size_t)n * hw;
	double a = 0.0, b = 0.0;

	for (size_t j = (size_t)s * blockDim.x + threadIdx.x; j < per; j += (size_t)slices * blockDim.x) {
		size_t i = j / (size_t)hw;
		size_t o = (i * c + ch) * hw + (j - i * hw);
		f(o, i, ch, &a, &b);
	}
	block_sum2(&a, &b);
	if (threadIdx.x == 0) {
		if (slices == 1) {
			w(ch, a, b);
		} else {
			partials[blockIdx.x] = a;
			partials[TR_CUDA_RED_SLOTS + blockIdx.x] = b;
		}
	}
}

/* Second pass: one thread per channel adds its slices in order. */
template <class W> __global__ void k_channel_finish(int c, unsigned slices, const double *partials, W w)
{
	GRID_STRIDE(ch, (size_t)c)
	{
		double a = 0.0, b = 0.0;
		for (unsigned s = 0; s < slices; s++) {
			a += partials[ch * slices + s];
			b += partials[TR_CUDA_RED_SLOTS + ch * slices + s];
		}
		w((int)ch, a, b);
	}
}

/* y = (x - mean) / sqrt(var + eps) * gamma + beta, the CPU's float order. */
/* Instantiated for uint32_t below 2^32 elements (index32_ok): the
 * channel's / and % are the cost of these elementwise passes. */
template <typename I>
__global__ void k_bn_apply(I total, I c, I hw, float eps, const float *x, const float *mean, const float *var,
			   const float *gamma, const float *beta, float *y)
{
	GRID_STRIDE_T(I, o, total)
	{
		int ch = (int)((o / hw) % c);
		float is = (float)(1.0 / sqrt((double)var[ch] + eps));
		y[o] = (x[o] - mean[ch]) * is * gamma[ch] + beta[ch];
	}
}

__global__ void k_bn_running_update(int c, float momentum, float unbias, const float *mean, const float *var,
				    float *run_mean, float *run_var, float *batches)
{
	GRID_STRIDE(ch, (size_t)c)
	{
		run_mean[ch] = (1.0f - momentum) * run_mean[ch] + momentum * mean[ch];
		run_var[ch] = (1.0f - momentum) * run_var[ch] + momentum * var[ch] * unbias;
		if (ch == 0)
			batches[0] += 1.0f;
	}
}

/* torch's batch_norm_backward_elemt, as cpu_bn_backward_apply. */
template <typename I>
__global__ void k_bn_backward_apply(I total, I c, I hw, float eps, double count, const float *x, const float *mean,
				    const float *var, const float *gamma, const float *sums, const float *dy, float *dx)
{
	GRID_STRIDE_T(I, o, total)
	{
		int ch = (int)((o / hw) % c);
		double is = 1.0 / sqrt((double)var[ch] + eps);
		float mdy = (float)(sums[ch] / count);
		float k = (float)(is * is * (sums[c + ch] / count));
		float gs = (float)(is * gamma[ch]);
		dx[o] = (dy[o] - mdy - (x[o] - mean[ch]) * k) * gs;
	}
}

/* One block per (sample, group), strided over a fixed grid: two passes in
 * double over the group's cg x hw contiguous values, then y. */
__global__ void k_groupnorm_forward(int n, int c, int hw, int groups, float eps, const float *x, const float *gamma,
				    const float *beta, float *y, float *mean, float *rstd)
{
	__shared__ double s_mu;
	__shared__ float s_m, s_rs;
	int cg = c / groups;
	size_t len = (size_t)cg * hw, pairs = (size_t)n * groups;

	for (size_t p = blockIdx.x; p < pairs; p += gridDim.x) {
		size_t i = p / (size_t)groups;
		int g = (int)(p - i * groups);
		size_t base = (i * c + (size_t)g * cg) * hw;
		const float *xp = x + base;
		float *yp = y + base;
		double s = 0.0, unused = 0.0;
		for (size_t k = threadIdx.x; k < len; k += blockDim.x)
			s += xp[k];
		block_sum2(&s, &unused);
		if (threadIdx.x == 0)
			s_mu = s / (double)len;
		__syncthreads();
		double mu = s_mu, ss = 0.0;
		unused = 0.0;
		for (size_t k = threadIdx.x; k < len; k += blockDim.x) {
			double d = xp[k] - mu;
			ss += d * d;
		}
		block_sum2(&ss, &unused);
		if (threadIdx.x == 0) {
			s_m = (float)mu;
			s_rs = (float)(1.0 / sqrt(ss / (double)len + eps));
			mean[p] = s_m;
			rstd[p] = s_rs;
		}
		__syncthreads();
		float m = s_m, rs = s_rs;
		for (size_t k = threadIdx.x; k < len; k += blockDim.x) {
			int ch = g * cg + (int)(k / (size_t)hw);
			yp[k] = (xp[k] - m) * rs * gamma[ch] + beta[ch];
		}
		__syncthreads(); /* the shared statistics are rewritten next round */
	}
}

/* dx = rstd (g - mean(g) - xh mean(g xh)), g = dy gamma, per (sample,
 * group) as k_groupnorm_forward.  Each thread reads dy before writing the
 * same element of dx, so dx may be dy. */
__global__ void k_groupnorm_backward_dx(int n, int c, int hw, int groups, const float *x, const float *gamma,
					const float *mean, const float *rstd, const float *dy, float *dx)
{
	__shared__ float s_a, s_b;
	int cg = c / groups;
	size_t len = (size_t)cg * hw, pairs = (size_t)n * groups;

	for (size_t p = blockIdx.x; p < pairs; p += gridDim.x) {
		size_t i = p / (size_t)groups;
		int g = (int)(p - i * groups);
		size_t base = (i * c + (size_t)g * cg) * hw;
		float m = mean[p], rs = rstd[p];
		double s1 = 0.0, s2 = 0.0;
		for (size_t k = threadIdx.x; k < len; k += blockDim.x) {
			int ch = g * cg + (int)(k / (size_t)hw);
			float gv = dy[base + k] * gamma[ch];
			s1 += gv;
			s2 += (double)gv * ((x[base + k] - m) * rs);
		}
		block_sum2(&s1, &s2);
		if (threadIdx.x == 0) {
			s_a = (float)(s1 / (double)len);
			s_b = (float)(s2 / (double)len);
		}
		__syncthreads();
		float a = s_a, b = s_b;
		for (size_t k = threadIdx.x; k < len; k += blockDim.x) {
			int ch = g * cg + (int)(k / (size_t)hw);
			float xh = (x[base + k] - m) * rs;
			dx[base + k] = rs * (dy[base + k] * gamma[ch] - a - xh * b);
		}
		__syncthreads();
	}
}

/* ==== host launchers ===================================================== */

/* Both passes of a per-channel sum over this device's samples; n may be 0
 * (zero totals).  The partials are the device's reduction scratch, free
 * between calls on its one compute stream. */
template <class F, class W>
static int launch_channel_sums(tr_backend_t *be, cudaStream_t s, struct cuda_dev *d, int n, int c, int hw, F f, W w)
{
	assert(n >= 0 && c > 0 && hw > 0);
	size_t per = (size_t)n * hw;
	size_t want = (per + BLOCK * PER_THREAD - 1) / (BLOCK * PER_THREAD);
	size_t cap = (size_t)c <= TR_CUDA_RED_SLOTS ? TR_CUDA_RED_SLOTS / (size_t)c : 1;
	unsigned slices = (unsigned)(want < 1 ? 1 : want > cap ? cap : want);
	/* at most max(c, TR_CUDA_RED_SLOTS) blocks */
	unsigned blocks = (unsigned)c * slices;
	k_channel_sums<<<blocks, BLOCK, 0, s>>>(n, c, hw, slices, f, w, d->partials);
	LAUNCH_CHECK(be, "k_channel_sums");
	if (slices > 1) {
		k_channel_finish<<<grid_for((size_t)c), BLOCK, 0, s>>>(c, slices, d->partials, w);
		LAUNCH_CHECK(be, "k_channel_finish");
	}
	return 0;
}

static int launch_bn_apply(tr_backend_t *be, cudaStream_t s, size_t total, int c, int hw, float eps, const float *x,
			   const float *mean, const float *var, const float *gamma, const float *beta, float *y)
{
	assert(total > 0 && c > 0 && hw > 0 && x && mean && var && gamma && beta && y);
	if (index32_ok(total))
		k_bn_apply<uint32_t><<<grid_for(total), BLOCK, 0, s>>>((uint32_t)total, (uint32_t)c, (uint32_t)hw, eps,
								       x, mean, var, gamma, beta, y);
	else
		k_bn_apply<uint64_t><<<grid_for(total), BLOCK, 0, s>>>((uint64_t)total, (uint64_t)c, (uint64_t)hw, eps,
								       x, mean, var, gamma, beta, y);
	LAUNCH_CHECK(be, "k_bn_apply");
	return 0;
}

static int launch_bn_running_update(tr_backend_t *be, cudaStream_t s, int c, float momentum, float unbias,
				    const float *mean, const float *var, float *run_mean, float *run_var,
				    float *batches)
{
	assert(c > 0 && mean && var && run_mean && run_var && batches);
	k_bn_running_update<<<grid_for((size_t)c), BLOCK, 0, s>>>(c, momentum, unbias, mean, var, run_mean, run_var,
								  batches);
	LAUNCH_CHECK(be, "k_bn_running_update");
	return 0;
}

static int launch_bn_backward_apply(tr_backend_t *be, cudaStream_t s, size_t total, int c, int hw, float eps,
				    double count, const float *x, const float *mean, const float *var,
				    const float *gamma, const float *sums, const float *dy, float *dx)
{
	assert(total > 0 && c > 0 && hw > 0 && count > 0.0 && x && mean && var && gamma && sums && dy && dx);
	if (index32_ok(total))
		k_bn_backward_apply<uint32_t><<<grid_for(total), BLOCK, 0, s>>>((uint32_t)total, (uint32_t)c,
										(uint32_t)hw, eps, count, x, mean, var,
										gamma, sums, dy, dx);
	else
		k_bn_backward_apply<uint64_t><<<grid_for(total), BLOCK, 0, s>>>((uint64_t)total, (uint64_t)c,
										(uint64_t)hw, eps, count, x, mean, var,
										gamma, sums, dy, dx);
	LAUNCH_CHECK(be, "k_bn_backward_apply");
	return 0;
}

/* Blocks for the (sample, group) kernels: one each, strided beyond MAX_GRID. */
static unsigned group_grid(int n, int groups)
{
	size_t g = (size_t)n * groups;
	return g > MAX_GRID ? MAX_GRID : (unsigned)g;
}

static int launch_groupnorm_forward(tr_backend_t *be, cudaStream_t s, int n, int c, int hw, int groups, float eps,
				    const float *x, const float *gamma, const float *beta, float *y, float *mean,
				    float *rstd)
{
	assert(n > 0 && c > 0 && hw > 0 && groups > 0 && c % groups == 0 && x && gamma && beta && y && mean && rstd);
	k_groupnorm_forward<<<group_grid(n, groups), BLOCK, 0, s>>>(n, c, hw, groups, eps, x, gamma, beta, y, mean,
								    rstd);
	LAUNCH_CHECK(be, "k_groupnorm_forward");
	return 0;
}

static int launch_groupnorm_backward_dx(tr_backend_t *be, cudaStream_t s, int n, int c, int hw, int groups,
					const float *x, const float *gamma, const float *mean, const float *rstd,
					const float *dy, float *dx)
{
	assert(n > 0 && c > 0 && hw > 0 && groups > 0 && c % groups == 0 && x && gamma && mean && rstd && dy && dx);
	k_groupnorm_backward_dx<<<group_grid(n, groups), BLOCK, 0, s>>>(n, c, hw, groups, x, gamma, mean, rstd, dy, dx);
	LAUNCH_CHECK(be, "k_groupnorm_backward_dx");
	return 0;
}

/* ==== backend functions ================================================== */

#define ENSURE_SHAPE(what) ENSURE(n >= 0 && c >= 1 && hw >= 1, what ": bad shape n=%d c=%d hw=%d", n, c, hw)

static struct cuda_dev *dev_of(tr_backend_t *be, int dev)
{
	return &cuda_be(be)->dev[dev];
}

static int cuda_bn_sums(tr_backend_t *be, int dev, int n, int c, int hw, const float *x, const float *mean, float *out)
{
	ENSURE_DEV("bn_sums");
	ENSURE_SHAPE("bn_sums");
	ENSURE(out && (n == 0 || x), "bn_sums: NULL pointer");
	struct cuda_dev *d = dev_of(be, dev);
	if (mean)
		return launch_channel_sums(be, d->stream, d, n, c, hw, sum_sq_dev{x, mean}, put_sum{out});
	return launch_channel_sums(be, d->stream, d, n, c, hw, sum_x{x}, put_sum{out});
}

static int cuda_bn_apply(tr_backend_t *be, int dev, int n, int c, int hw, float eps, const float *x, const float *mean,
			 const float *var, const float *gamma, const float *beta, float *y)
{
	ENSURE_DEV("bn_apply");
	ENSURE_SHAPE("bn_apply");
	ENSURE(mean && var && gamma && beta, "bn_apply: NULL statistics or parameters");
	size_t total = (size_t)n * c * hw;
	if (total == 0)
		return 0;
	ENSURE(x && y, "bn_apply: NULL pointer");
	return launch_bn_apply(be, stream_of(be, dev), total, c, hw, eps, x, mean, var, gamma, beta, y);
}

static int cuda_bn_running_update(tr_backend_t *be, int dev, int c, float momentum, double count, const float *mean,
				  const float *var, float *run_mean, float *run_var, float *batches)
{
	ENSURE_DEV("bn_running_update");
	ENSURE(c >= 1, "bn_running_update: bad shape c=%d", c);
	ENSURE(count > 1.0,
	       "batchnorm2d: this step has %g value(s) per channel, and the variance of one value is undefined "
	       "(PyTorch refuses it too); use a larger batch or last_batch \"drop\"",
	       count);
	ENSURE(mean && var && run_mean && run_var && batches, "bn_running_update: NULL pointer");
	/* torch.nn.BatchNorm2d: the running variance is the unbiased one */
	float unbias = (float)(count / (count - 1.0));
	return launch_bn_running_update(be, stream_of(be, dev), c, momentum, unbias, mean, var, run_mean, run_var,
					batches);
}

static int cuda_bn_backward_sums(tr_backend_t *be, int dev, int n, int c, int hw, float eps, const float *x,
				 const float *mean, const float *var, const float *dy, float *sums, float *dgamma,
				 float *dbeta)
{
	ENSURE_DEV("bn_backward_sums");
	ENSURE_SHAPE("bn_backward_sums");
	ENSURE(mean && var && sums, "bn_backward_sums: NULL statistics or sums");
	ENSURE(n == 0 || (x && dy), "bn_backward_sums: NULL pointer");
	struct cuda_dev *d = dev_of(be, dev);
	return launch_channel_sums(be, d->stream, d, n, c, hw, sum_bn_backward{x, mean, dy},
				   put_bn_backward{c, eps, var, sums, dgamma, dbeta});
}

static int cuda_bn_backward_apply(tr_backend_t *be, int dev, int n, int c, int hw, float eps, double count,
				  const float *x, const float *mean, const float *var, const float *gamma,
				  const float *sums, const float *dy, float *dx)
{
	ENSURE_DEV("bn_backward_apply");
	ENSURE_SHAPE("bn_backward_apply");
	ENSURE(count > 0.0, "bn_backward_apply: count %g", count);
	ENSURE(mean && var && gamma && sums, "bn_backward_apply: NULL statistics or sums");
	size_t total = (size_t)n * c * hw;
	if (total == 0)
		return 0;
	ENSURE(x && dy && dx, "bn_backward_apply: NULL pointer");
	return launch_bn_backward_apply(be, stream_of(be, dev), total, c, hw, eps, count, x, mean, var, gamma, sums, dy,
					dx);
}

static int cuda_groupnorm_forward(tr_backend_t *be, int dev, int n, int c, int hw, int groups, float eps,
				  const float *x, const float *gamma, const float *beta, float *y, float *mean,
				  float *rstd)
{
	ENSURE_DEV("groupnorm_forward");
	ENSURE_SHAPE("groupnorm_forward");
	ENSURE(groups >= 1 && c % groups == 0, "groupnorm_forward: %d channels in %d groups", c, groups);
	ENSURE(gamma && beta, "groupnorm_forward: gamma and beta are required");
	if (n == 0)
		return 0;
	ENSURE(x && y && mean && rstd, "groupnorm_forward: NULL pointer");
	return launch_groupnorm_forward(be, stream_of(be, dev), n, c, hw, groups, eps, x, gamma, beta, y, mean, rstd);
}

/* The parameter gradients first: they read dy, and dx may be dy. */
static int cuda_groupnorm_backward(tr_backend_t *be, int dev, int n, int c, int hw, int groups, const float *x,
				   const float *gamma, const float *mean, const float *rstd, const float *dy, float *dx,
				   float *dgamma, float *dbeta)
{
	ENSURE_DEV("groupnorm_backward");
	ENSURE_SHAPE("groupnorm_backward");
	ENSURE(groups >= 1 && c % groups == 0, "groupnorm_backward: %d channels in %d groups", c, groups);
	ENSURE(gamma && dgamma && dbeta, "groupnorm_backward: gamma, dgamma and dbeta are required");
	ENSURE(n == 0 || (x && mean && rstd && dy), "groupnorm_backward: NULL pointer");
	struct cuda_dev *d = dev_of(be, dev);
	int rc = launch_channel_sums(be, d->stream, d, n, c, hw, sum_gn_params{x, mean, rstd, dy, groups, c / groups},
				     put_gn_params{dgamma, dbeta});
	if (rc || n == 0 || !dx)
		return rc;
	return launch_groupnorm_backward_dx(be, d->stream, n, c, hw, groups, x, gamma, mean, rstd, dy, dx);
}

void tr_cuda_norm2d_fill(tr_backend_i *t)
{
	t->bn_sums = cuda_bn_sums;
	t->bn_apply = cuda_bn_apply;
	t->bn_running_update = cuda_bn_running_update;
	t->bn_backward_sums = cuda_bn_backward_sums;
	t->bn_backward_apply = cuda_bn_backward_apply;
	t->groupnorm_forward = cuda_groupnorm_forward;
	t->groupnorm_backward = cuda_groupnorm_backward;
}
