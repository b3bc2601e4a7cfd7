/* CUDA kernels: the compute half of the backend table.
 *
 * Each kernel implements the formula of its CPU counterpart in
 * engine/cpu/cpu_kernels.c, in the same float operation order; this file
 * is compiled with --fmad=false so that nvcc does not contract a * b + c
 * into one rounding where the CPU rounds twice.  The elementwise kernels
 * and the optimizer updates therefore agree with the CPU bit for bit,
 * except where a libm function differs (erff, expf, tanhf: CUDA's are
 * within 2 ulp, glibc's within 1).  Dropout reimplements engine/rng.h on
 * the device and gives exactly the CPU's mask.
 *
 * Reductions accumulate in double where the CPU does (losses, layernorm
 * statistics, sumsq) and in float where it does (col_sum, layernorm's
 * parameter gradients), but in a tree order instead of a left-to-right
 * one.  Every grid is a function of the problem size alone and partial
 * results are combined in index order, so results are deterministic run
 * to run and identical on every replica.  Row-wise kernels give each row
 * one warp: rows are at most a few thousand wide here, and a warp needs no
 * block-level synchronisation.
 *
 * Layout: device helpers, kernels, then host launchers (which take a
 * stream, assert their preconditions and check the launch), then the
 * backend functions, which validate arguments like the CPU backend and
 * record a reason before returning -EINVAL.
 */
#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "engine/cuda/cuda_internal.h"

#define BLOCK 256u
#define WARPS_PER_BLOCK (BLOCK / 32u)
#define MAX_GRID 32768u /* elementwise kernels stride beyond this */
#define COL_TILE 32u    /* columns per block in the column reductions */
#define COL_ROWS 8u     /* row stripes per block in the column reductions */
#define FULL_MASK 0xffffffffu

/* Constants as PyTorch's GeluKernel spells them (as cpu_kernels.c). */
#define GELU_ALPHA 0.70710678118654752440f /* 1/sqrt(2) */
#define GELU_PDF 0.39894228040143267794f   /* 1/sqrt(2 pi) */
#define GELU_BETA 0.79788456080286535588f  /* sqrt(2/pi) */
#define GELU_KAPPA 0.044715f

/* ==== device helpers ===================================================== */

/* engine/rng.h on the device: SplitMix64's finaliser, bit for bit. */
__device__ __forceinline__ uint64_t d_mix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ULL;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

__device__ __forceinline__ uint64_t d_rng_u64(uint64_t key, uint64_t counter)
{
	return d_mix64(key ^ d_mix64(counter));
}

/* 24 random bits times 2^-24: exact in float, as tr_rng_uniform. */
__device__ __forceinline__ float d_rng_uniform(uint64_t key, uint64_t counter)
{
	return (float)(d_rng_u64(key, counter) >> 40) * 5.9604644775390625e-08f;
}

/* Butterfly sum: a + b == b + a, so every lane ends with the same bits. */
__device__ __forceinline__ double warp_sum(double v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(FULL_MASK, v, o);
	return v;
}

/* Sums two quantities over a 1-D block; the totals are valid in thread 0.
 * Every thread of the block must call it. */
__device__ void block_sum2(double *a, double *b)
{
	__shared__ double sa[32], sb[32];
	unsigned lane = threadIdx.x & 31u, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
	double x = warp_sum(*a), y = warp_sum(*b);

	if (lane == 0) {
		sa[w] = x;
		sb[w] = y;
	}
	__syncthreads();
	if (w == 0) {
		x = warp_sum(lane < nw ? sa[lane] : 0.0);
		y = warp_sum(lane < nw ? sb[lane] : 0.0);
	}
	*a = x;
	*b = y;
}

template <enum tr_act A> __device__ __forceinline__ float act_fwd(float v)
{
	switch (A) {
	case TR_ACT_RELU:
		return v <= 0.0f ? 0.0f : v; /* NaN propagates, as torch.relu */
	case TR_ACT_GELU:
		return v * 0.5f * (1.0f + erff(v * GELU_ALPHA));
	case TR_ACT_GELU_TANH: {
		float inner = GELU_BETA * (v + GELU_KAPPA * (v * v * v));
		return 0.5f * v * (1.0f + tanhf(inner));
	}
	case TR_ACT_TANH:
		return tanhf(v);
	case TR_ACT_SIGMOID:
		return 1.0f / (1.0f + expf(-v));
	}
	return 0.0f;
}

template <enum tr_act A> __device__ __forceinline__ float act_bwd(float v, float y, float dy)
{
	switch (A) {
	case TR_ACT_RELU:
		return v > 0.0f ? dy : 0.0f;
	case TR_ACT_GELU: {
		float cdf = 0.5f * (1.0f + erff(v * GELU_ALPHA));
		float pdf = expf(-0.5f * v * v) * GELU_PDF;
		return dy * (cdf + v * pdf);
	}
	case TR_ACT_GELU_TANH: {
		float v2 = v * v;
		float t = tanhf(GELU_BETA * (v + GELU_KAPPA * (v2 * v)));
		float left = 0.5f * v;
		float dleft = 0.5f * (1.0f + t);
		float dright = left * (1.0f - t * t) * GELU_BETA * (1.0f + 3.0f * GELU_KAPPA * v2);
		return dy * (dleft + dright);
	}
	case TR_ACT_TANH:
		return dy * (1.0f - y * y);
	case TR_ACT_SIGMOID:
		return dy * (1.0f - y) * y;
	}
	return 0.0f;
}

/* ==== kernels ============================================================ */

#define GRID_STRIDE(i, n)                                                           \
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
	     i += (size_t)gridDim.x * blockDim.x)

/* gemm with k == 0: C = beta * C, and beta == 0 must not read C. */
__global__ void k_scale_or_zero(size_t n, float *c, float beta)
{
	GRID_STRIDE(i, n)
	c[i] = beta == 0.0f ? 0.0f : beta * c[i];
}

__global__ void k_add_bias(size_t n, int cols, float *y, const float *bias)
{
	GRID_STRIDE(i, n)
	y[i] += bias[i % (size_t)cols];
}

/* Block (COL_TILE, COL_ROWS): thread (x, y) sums rows y, y + COL_ROWS, ...
 * of column x in row order, then the stripes are added in order. */
__global__ void k_col_sum(int rows, int cols, const float *x, float *out)
{
	__shared__ float part[COL_ROWS][COL_TILE + 1];
	/* unsigned: the last tile may reach past INT_MAX */
	unsigned c = blockIdx.x * COL_TILE + threadIdx.x;
	float acc = 0.0f;

	if (c < (unsigned)cols)
		for (int r = threadIdx.y; r < rows; r += COL_ROWS)
			acc += x[(size_t)r * cols + c];
	part[threadIdx.y][threadIdx.x] = acc;
	__syncthreads();
	if (threadIdx.y == 0 && c < (unsigned)cols) {
		float s = part[0][threadIdx.x];
		for (unsigned k = 1; k < COL_ROWS; k++)
			s += part[k][threadIdx.x];
		out[c] = s;
	}
}

template <enum tr_act A> __global__ void k_act_forward(size_t n, const float *x, float *y)
{
	GRID_STRIDE(i, n)
	y[i] = act_fwd<A>(x[i]);
}

/* y is only read by tanh and sigmoid (their derivative uses the output). */
template <enum tr_act A>
__global__ void k_act_backward(size_t n, const float *x, const float *y, const float *dy, float *dx)
{
	GRID_STRIDE(i, n)
	dx[i] = act_bwd<A>(x[i], (A == TR_ACT_TANH || A == TR_ACT_SIGMOID) ? y[i] : 0.0f, dy[i]);
}

__global__ void k_dropout(size_t n, int cols, float rate, float keep_scale, uint64_t key, int64_t row0,
			  const float *x, float *y, float *mask)
{
	GRID_STRIDE(i, n)
	{
		uint64_t r = i / (uint64_t)cols, c = i % (uint64_t)cols;
		uint64_t counter = ((uint64_t)row0 + r) * (uint64_t)cols + c;
		float mk = d_rng_uniform(key, counter) >= rate ? keep_scale : 0.0f;
		float v = x[i]; /* before the stores: y may be x */
		mask[i] = mk;
		y[i] = v * mk;
	}
}

__global__ void k_mul(size_t n, const float *a, const float *b, float *out)
{
	GRID_STRIDE(i, n)
	out[i] = a[i] * b[i];
}

__global__ void k_scale(size_t n, float *x, float alpha)
{
	GRID_STRIDE(i, n)
	x[i] *= alpha;
}

/* First pass of sumsq: one double partial per block. */
__global__ void k_sumsq(size_t n, const float *x, double *partials)
{
	double acc = 0.0, unused = 0.0;

	GRID_STRIDE(i, n)
	acc += (double)x[i] * (double)x[i];
	block_sum2(&acc, &unused);
	if (threadIdx.x == 0) {
		partials[blockIdx.x] = acc;
		partials[TR_CUDA_RED_SLOTS + blockIdx.x] = 0.0;
	}
}

/* Second pass of every reduction: one block adds the partials of both
 * quantities (at partials[i] and partials[TR_CUDA_RED_SLOTS + i]) in
 * index order within each thread, then as a tree. */
__global__ void k_finish(int nparts, const double *partials, struct cuda_result *res)
{
	double a = 0.0, b = 0.0;

	for (int i = threadIdx.x; i < nparts; i += blockDim.x) {
		a += partials[i];
		b += partials[TR_CUDA_RED_SLOTS + i];
	}
	block_sum2(&a, &b);
	if (threadIdx.x == 0) {
		res->sum[0] = a;
		res->sum[1] = b;
	}
}

/* One warp per row.  Two passes in double (mean, then squared deviations),
 * y from the float statistics, as the CPU. */
__global__ void k_layernorm_forward(int rows, int cols, float eps, const float *x, const float *gamma,
				    const float *beta, float *y, float *mean, float *rstd)
{
	int row = blockIdx.x * WARPS_PER_BLOCK + (threadIdx.x >> 5);
	int lane = threadIdx.x & 31;

	if (row >= rows)
		return;
	const float *xr = x + (size_t)row * cols;
	float *yr = y + (size_t)row * cols;
	double s = 0.0, ss = 0.0;
	for (int c = lane; c < cols; c += 32)
		s += xr[c];
	double mu = warp_sum(s) / cols;
	for (int c = lane; c < cols; c += 32) {
		double d = xr[c] - mu;
		ss += d * d;
	}
	ss = warp_sum(ss);
	float m = (float)mu;
	float rs = (float)(1.0 / sqrt(ss / cols + (double)eps));
	for (int c = lane; c < cols; c += 32)
		yr[c] = (xr[c] - m) * rs * gamma[c] + beta[c];
	if (lane == 0) {
		mean[row] = m;
		rstd[row] = rs;
	}
}

/* dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma; one
 * warp per row. */
__global__ void k_layernorm_backward_dx(int rows, int cols, const float *x, const float *gamma, const float *mean,
					const float *rstd, const float *dy, float *dx)
{
	int row = blockIdx.x * WARPS_PER_BLOCK + (threadIdx.x >> 5);
	int lane = threadIdx.x & 31;

	if (row >= rows)
		return;
	const float *xr = x + (size_t)row * cols;
	const float *dyr = dy + (size_t)row * cols;
	float *dxr = dx + (size_t)row * cols;
	float m = mean[row], rs = rstd[row];
	double sg = 0.0, sgx = 0.0;
	for (int c = lane; c < cols; c += 32) {
		float xh = (xr[c] - m) * rs;
		float g = dyr[c] * gamma[c];
		sg += g;
		sgx += (double)g * xh;
	}
	sg = warp_sum(sg);
	sgx = warp_sum(sgx);
	float a = (float)(sg / cols), b = (float)(sgx / cols);
	for (int c = lane; c < cols; c += 32) {
		float xh = (xr[c] - m) * rs;
		dxr[c] = rs * (dyr[c] * gamma[c] - a - xh * b);
	}
}

/* dgamma[c] += sum_r dy * xhat, dbeta[c] += sum_r dy: laid out as k_col_sum. */
__global__ void k_layernorm_backward_params(int rows, int cols, const float *x, const float *mean, const float *rstd,
					    const float *dy, float *dgamma, float *dbeta)
{
	__shared__ float pg[COL_ROWS][COL_TILE + 1], pb[COL_ROWS][COL_TILE + 1];
	unsigned c = blockIdx.x * COL_TILE + threadIdx.x;
	float ag = 0.0f, ab = 0.0f;

	if (c < (unsigned)cols) {
		for (int r = threadIdx.y; r < rows; r += COL_ROWS) {
			size_t i = (size_t)r * cols + c;
			float xh = (x[i] - mean[r]) * rstd[r];
			ag += dy[i] * xh;
			ab += dy[i];
		}
	}
	pg[threadIdx.y][threadIdx.x] = ag;
	pb[threadIdx.y][threadIdx.x] = ab;
	__syncthreads();
	if (threadIdx.y == 0 && c < (unsigned)cols) {
		float sg = pg[0][threadIdx.x], sb = pb[0][threadIdx.x];
		for (unsigned k = 1; k < COL_ROWS; k++) {
			sg += pg[k][threadIdx.x];
			sb += pb[k][threadIdx.x];
		}
		dgamma[c] += sg;
		dbeta[c] += sb;
	}
}

/* Records the first row whose label is not an integer class. */
__global__ void k_check_labels(int rows, int classes, const float *labels, int *bad_row)
{
	GRID_STRIDE(i, (size_t)rows)
	{
		float l = labels[i];
		if (!(l >= 0.0f && l < (float)classes) || l != floorf(l))
			atomicMin(bad_row, (int)i);
	}
}

/* One warp per row, rows strided over a fixed grid; per-block partials of
 * the loss sum and the correct count.  Does nothing when k_check_labels
 * found a bad label, so that dlogits stays untouched (as on the CPU). */
__global__ void k_softmax_ce(int rows, int classes, const float *logits, const float *labels, float scale,
			     float *dlogits, const int *bad_row, double *partials)
{
	if (*bad_row != TR_CUDA_NO_BAD_ROW)
		return; /* the same answer for every thread: no barrier is skipped */
	int lane = threadIdx.x & 31;
	double loss = 0.0, correct = 0.0;

	for (int64_t r = blockIdx.x * WARPS_PER_BLOCK + (threadIdx.x >> 5); r < rows;
	     r += gridDim.x * WARPS_PER_BLOCK) {
		const float *z = logits + (size_t)r * classes;
		int label = (int)labels[r];
		float zl = z[label]; /* before dlogits is written: it may be logits */
		/* argmax: the first index of the largest value, as the CPU */
		float best = -INFINITY;
		int arg = INT_MAX;
		for (int c = lane; c < classes; c += 32) {
			float v = z[c];
			if (arg == INT_MAX || v > best) {
				best = v;
				arg = c;
			}
		}
		for (int o = 16; o > 0; o >>= 1) {
			float ob = __shfl_xor_sync(FULL_MASK, best, o);
			int oa = __shfl_xor_sync(FULL_MASK, arg, o);
			if (ob > best || (ob == best && oa < arg)) {
				best = ob;
				arg = oa;
			}
		}
		/* NaN makes the selection order-dependent: take lane 0's */
		best = __shfl_sync(FULL_MASK, best, 0);
		arg = __shfl_sync(FULL_MASK, arg, 0);

		double sum = 0.0;
		for (int c = lane; c < classes; c += 32)
			sum += expf(z[c] - best);
		sum = warp_sum(sum);
		if (dlogits) {
			float *d = dlogits + (size_t)r * classes;
			float inv = (float)(1.0 / sum);
			for (int c = lane; c < classes; c += 32) {
				float p = scale * (expf(z[c] - best) * inv);
				d[c] = c == label ? p - scale : p;
			}
		}
		if (lane == 0) {
			loss += (double)best + log(sum) - (double)zl;
			correct += arg == label ? 1.0 : 0.0;
		}
	}
	block_sum2(&loss, &correct);
	if (threadIdx.x == 0) {
		partials[blockIdx.x] = loss;
		partials[TR_CUDA_RED_SLOTS + blockIdx.x] = correct;
	}
}

/* One warp per row: mean over cols of (p - t)^2 in double. */
__global__ void k_mse(int rows, int cols, const float *pred, const float *target, float coef, float *dpred,
		      double *partials)
{
	int lane = threadIdx.x & 31;
	double loss = 0.0, unused = 0.0;

	for (int64_t r = blockIdx.x * WARPS_PER_BLOCK + (threadIdx.x >> 5); r < rows;
	     r += gridDim.x * WARPS_PER_BLOCK) {
		const float *p = pred + (size_t)r * cols;
		const float *t = target + (size_t)r * cols;
		double s = 0.0;
		for (int c = lane; c < cols; c += 32) {
			double d = (double)p[c] - (double)t[c];
			s += d * d;
		}
		s = warp_sum(s);
		if (dpred) {
			float *d = dpred + (size_t)r * cols;
			for (int c = lane; c < cols; c += 32)
				d[c] = coef * (p[c] - t[c]);
		}
		if (lane == 0)
			loss += s / cols;
	}
	block_sum2(&loss, &unused);
	if (threadIdx.x == 0) {
		partials[blockIdx.x] = loss;
		partials[TR_CUDA_RED_SLOTS + blockIdx.x] = 0.0;
	}
}

/* torch.optim.SGD (see cpu_sgd_step); the branch is uniform per launch. */
enum sgd_mode { SGD_PLAIN, SGD_FIRST, SGD_NESTEROV, SGD_MOMENTUM };

__global__ void k_sgd(size_t n, float *p, const float *grad, float *buf, float lr, float wd, float mom, float damp1,
		      int mode, bool nesterov)
{
	GRID_STRIDE(i, n)
	{
		float g = grad[i] + wd * p[i];
		switch (mode) {
		case SGD_PLAIN:
			p[i] = p[i] + -lr * g;
			break;
		case SGD_FIRST:
			buf[i] = g;
			g = nesterov ? g + mom * g : g;
			p[i] = p[i] + -lr * g;
			break;
		case SGD_NESTEROV: {
			float b = buf[i] * mom + damp1 * g;
			buf[i] = b;
			p[i] = p[i] + -lr * (g + mom * b);
			break;
		}
		default: {
			float b = buf[i] * mom + damp1 * g;
			buf[i] = b;
			p[i] = p[i] + -lr * b;
			break;
		}
		}
	}
}

/* torch.optim.Adam / AdamW (see cpu_adam_step); scalars come from the host. */
__global__ void k_adam(size_t n, float *p, const float *grad, float *m, float *v, float p_keep, float wd_g, float w1,
		       float beta2, float w2, float neg_step, float bc2_sqrt, float eps)
{
	GRID_STRIDE(i, n)
	{
		float pi = p[i] * p_keep;
		float g = grad[i] + wd_g * pi;
		float mi = m[i] + w1 * (g - m[i]);
		float vi = v[i] * beta2 + w2 * g * g;
		float denom = sqrtf(vi) / bc2_sqrt + eps;
		m[i] = mi;
		v[i] = vi;
		p[i] = pi + neg_step * (mi / denom);
	}
}

/* ==== host launchers ===================================================== */

static unsigned grid_for(size_t n)
{
	size_t g = (n + BLOCK - 1) / BLOCK;
	return g > MAX_GRID ? MAX_GRID : (unsigned)g;
}

/* Blocks for a warp-per-row reduction over `rows`: at most one slot each. */
static unsigned row_grid(int rows)
{
	size_t g = ((size_t)rows + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK;
	return g > TR_CUDA_RED_SLOTS ? TR_CUDA_RED_SLOTS : (unsigned)g;
}

static int launch_scale_or_zero(tr_backend_t *be, cudaStream_t s, size_t n, float *c, float beta)
{
	assert(n > 0 && c);
	k_scale_or_zero<<<grid_for(n), BLOCK, 0, s>>>(n, c, beta);
	LAUNCH_CHECK(be, "k_scale_or_zero");
	return 0;
}

static int launch_add_bias(tr_backend_t *be, cudaStream_t s, int rows, int cols, float *y, const float *bias)
{
	size_t n = (size_t)rows * cols;
	assert(rows > 0 && cols > 0 && y && bias);
	k_add_bias<<<grid_for(n), BLOCK, 0, s>>>(n, cols, y, bias);
	LAUNCH_CHECK(be, "k_add_bias");
	return 0;
}

static int launch_col_sum(tr_backend_t *be, cudaStream_t s, int rows, int cols, const float *x, float *out)
{
	assert(rows >= 0 && cols > 0 && out && (rows == 0 || x));
	dim3 grid((cols + COL_TILE - 1) / COL_TILE), block(COL_TILE, COL_ROWS);
	k_col_sum<<<grid, block, 0, s>>>(rows, cols, x, out);
	LAUNCH_CHECK(be, "k_col_sum");
	return 0;
}

#define ACT_CASES(X) X(TR_ACT_RELU) X(TR_ACT_GELU) X(TR_ACT_GELU_TANH) X(TR_ACT_TANH) X(TR_ACT_SIGMOID)

static int launch_act_forward(tr_backend_t *be, cudaStream_t s, enum tr_act act, size_t n, const float *x, float *y)
{
	assert(n > 0 && x && y);
	switch (act) {
#define FWD(A)                                                         \
	case A:                                                        \
		k_act_forward<A><<<grid_for(n), BLOCK, 0, s>>>(n, x, y); \
		break;
		ACT_CASES(FWD)
#undef FWD
	default:
		assert(!"unknown activation");
		return -EINVAL;
	}
	LAUNCH_CHECK(be, "k_act_forward");
	return 0;
}

static int launch_act_backward(tr_backend_t *be, cudaStream_t s, enum tr_act act, size_t n, const float *x,
			       const float *y, const float *dy, float *dx)
{
	assert(n > 0 && x && dy && dx);
	assert(y || (act != TR_ACT_TANH && act != TR_ACT_SIGMOID));
	switch (act) {
#define BWD(A)                                                                   \
	case A:                                                                  \
		k_act_backward<A><<<grid_for(n), BLOCK, 0, s>>>(n, x, y, dy, dx); \
		break;
		ACT_CASES(BWD)
#undef BWD
	default:
		assert(!"unknown activation");
		return -EINVAL;
	}
	LAUNCH_CHECK(be, "k_act_backward");
	return 0;
}

static int launch_dropout(tr_backend_t *be, cudaStream_t s, int rows, int cols, float rate, uint64_t key,
			  int64_t row0, const float *x, float *y, float *mask)
{
	size_t n = (size_t)rows * cols;
	assert(rows > 0 && cols > 0 && row0 >= 0 && rate >= 0.0f && rate < 1.0f && x && y && mask);
	/* the CPU's expression, evaluated on the host: the same float */
	float keep_scale = 1.0f / (1.0f - rate);
	k_dropout<<<grid_for(n), BLOCK, 0, s>>>(n, cols, rate, keep_scale, key, row0, x, y, mask);
	LAUNCH_CHECK(be, "k_dropout");
	return 0;
}

static int launch_mul(tr_backend_t *be, cudaStream_t s, size_t n, const float *a, const float *b, float *out)
{
	assert(n > 0 && a && b && out);
	k_mul<<<grid_for(n), BLOCK, 0, s>>>(n, a, b, out);
	LAUNCH_CHECK(be, "k_mul");
	return 0;
}

static int launch_scale(tr_backend_t *be, cudaStream_t s, size_t n, float *x, float alpha)
{
	assert(n > 0 && x);
	k_scale<<<grid_for(n), BLOCK, 0, s>>>(n, x, alpha);
	LAUNCH_CHECK(be, "k_scale");
	return 0;
}

/* Both passes of sumsq; the total lands in d->result->sum[0]. */
static int launch_sumsq(tr_backend_t *be, cudaStream_t s, struct cuda_dev *d, size_t n, const float *x)
{
	assert(n > 0 && x);
	/* >= 8 elements per thread before a block gets its own slot */
	size_t g = (n + BLOCK * 8 - 1) / (BLOCK * 8);
	unsigned grid = g > TR_CUDA_RED_SLOTS ? TR_CUDA_RED_SLOTS : (unsigned)g;
	k_sumsq<<<grid, BLOCK, 0, s>>>(n, x, d->partials);
	LAUNCH_CHECK(be, "k_sumsq");
	k_finish<<<1, BLOCK, 0, s>>>((int)grid, d->partials, d->result);
	LAUNCH_CHECK(be, "k_finish");
	return 0;
}

static int launch_layernorm_forward(tr_backend_t *be, cudaStream_t s, int rows, int cols, float eps,
				    const float *x, const float *gamma, const float *beta, float *y, float *mean,
				    float *rstd)
{
	assert(rows > 0 && cols > 0 && x && gamma && beta && y && mean && rstd);
	unsigned grid = (unsigned)(((size_t)rows + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK);
	k_layernorm_forward<<<grid, BLOCK, 0, s>>>(rows, cols, eps, x, gamma, beta, y, mean, rstd);
	LAUNCH_CHECK(be, "k_layernorm_forward");
	return 0;
}

/* The parameter gradients first: they read dy, and dx may be dy. */
static int launch_layernorm_backward(tr_backend_t *be, cudaStream_t s, int rows, int cols, const float *x,
				     const float *gamma, const float *mean, const float *rstd, const float *dy,
				     float *dx, float *dgamma, float *dbeta)
{
	assert(rows > 0 && cols > 0 && x && gamma && mean && rstd && dy && dx && dgamma && dbeta);
	dim3 pgrid((cols + COL_TILE - 1) / COL_TILE), pblock(COL_TILE, COL_ROWS);
	k_layernorm_backward_params<<<pgrid, pblock, 0, s>>>(rows, cols, x, mean, rstd, dy, dgamma, dbeta);
	LAUNCH_CHECK(be, "k_layernorm_backward_params");
	unsigned grid = (unsigned)(((size_t)rows + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK);
	k_layernorm_backward_dx<<<grid, BLOCK, 0, s>>>(rows, cols, x, gamma, mean, rstd, dy, dx);
	LAUNCH_CHECK(be, "k_layernorm_backward_dx");
	return 0;
}

/* Label check, loss and gradient, and the final sum into d->result. */
static int launch_softmax_ce(tr_backend_t *be, cudaStream_t s, struct cuda_dev *d, int rows, int classes,
			     const float *logits, const float *labels, float scale, float *dlogits)
{
	assert(rows > 0 && classes > 0 && logits && labels);
	int *bad = &d->result->bad_row;
	CUDA_CHECK(be, cudaMemsetAsync(bad, 0x7f, sizeof(*bad), s)); /* TR_CUDA_NO_BAD_ROW */
	k_check_labels<<<grid_for((size_t)rows), BLOCK, 0, s>>>(rows, classes, labels, bad);
	LAUNCH_CHECK(be, "k_check_labels");
	unsigned grid = row_grid(rows);
	k_softmax_ce<<<grid, BLOCK, 0, s>>>(rows, classes, logits, labels, scale, dlogits, bad, d->partials);
	LAUNCH_CHECK(be, "k_softmax_ce");
	k_finish<<<1, BLOCK, 0, s>>>((int)grid, d->partials, d->result);
	LAUNCH_CHECK(be, "k_finish");
	return 0;
}

static int launch_mse(tr_backend_t *be, cudaStream_t s, struct cuda_dev *d, int rows, int cols, const float *pred,
		      const float *target, float coef, float *dpred)
{
	assert(rows > 0 && cols > 0 && pred && target);
	unsigned grid = row_grid(rows);
	k_mse<<<grid, BLOCK, 0, s>>>(rows, cols, pred, target, coef, dpred, d->partials);
	LAUNCH_CHECK(be, "k_mse");
	k_finish<<<1, BLOCK, 0, s>>>((int)grid, d->partials, d->result);
	LAUNCH_CHECK(be, "k_finish");
	return 0;
}

static int launch_sgd(tr_backend_t *be, cudaStream_t s, size_t n, float *p, const float *g, float *buf,
		      const struct tr_optim_hp *hp)
{
	assert(n > 0 && p && g && hp && hp->step >= 1 && (hp->momentum == 0.0f || buf));
	int mode = hp->momentum == 0.0f ? SGD_PLAIN
		   : hp->step == 1      ? SGD_FIRST
		   : hp->nesterov       ? SGD_NESTEROV
					: SGD_MOMENTUM;
	float damp1 = (float)(1.0 - (double)hp->dampening);
	k_sgd<<<grid_for(n), BLOCK, 0, s>>>(n, p, g, buf, hp->lr, hp->weight_decay, hp->momentum, damp1, mode,
					    hp->nesterov);
	LAUNCH_CHECK(be, "k_sgd");
	return 0;
}

/* The scalars exactly as cpu_adam_step forms them: in double, then float. */
static int launch_adam(tr_backend_t *be, cudaStream_t s, size_t n, float *p, const float *g, float *m, float *v,
		       const struct tr_optim_hp *hp)
{
	assert(n > 0 && p && g && m && v && hp && hp->step >= 1);
	const double b1 = hp->beta1, b2 = hp->beta2, lr = hp->lr, wd = hp->weight_decay;
	const float wd_g = hp->decoupled ? 0.0f : (float)wd;
	const float p_keep = hp->decoupled ? (float)(1.0 - lr * wd) : 1.0f;
	const float w1 = (float)(1.0 - b1), beta2 = (float)b2, w2 = (float)(1.0 - b2);
	const float neg_step = (float)(-(lr / (1.0 - pow(b1, (double)hp->step))));
	const float bc2_sqrt = (float)sqrt(1.0 - pow(b2, (double)hp->step));
	k_adam<<<grid_for(n), BLOCK, 0, s>>>(n, p, g, m, v, p_keep, wd_g, w1, beta2, w2, neg_step, bc2_sqrt, hp->eps);
	LAUNCH_CHECK(be, "k_adam");
	return 0;
}

/* ==== backend functions ================================================== */

#define ENSURE(cond, ...)                                                    \
	do {                                                                 \
		if (!(cond))                                                 \
			return tr_cuda_set_error(be, -EINVAL, __VA_ARGS__);  \
	} while (0)

#define ENSURE_DEV(what)                                   \
	do {                                               \
		int rc_ = tr_cuda_use(be, dev, what);      \
		if (rc_)                                   \
			return rc_;                        \
	} while (0)

static cudaStream_t stream_of(tr_backend_t *be, int dev)
{
	return cuda_be(be)->dev[dev].stream;
}

/* Brings d->result to the host; the one place a kernel call waits. */
static int read_result(tr_backend_t *be, struct cuda_dev *d)
{
	CUDA_CHECK(be, cudaMemcpyAsync(d->host_res, d->result, sizeof(*d->result), cudaMemcpyDeviceToHost, d->stream));
	CUDA_CHECK(be, cudaStreamSynchronize(d->stream));
	return 0;
}

/* Row-major C = alpha op(A) op(B) + beta C is, read column-major, C^T =
 * alpha op(B)^T op(A)^T + beta C^T: swap the operands, keep the flags. */
static int cuda_gemm(tr_backend_t *be, int dev, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
		     const float *a, const float *b, float beta, float *c)
{
	ENSURE_DEV("gemm");
	ENSURE(m >= 0 && n >= 0 && k >= 0, "gemm: negative size m=%d n=%d k=%d", m, n, k);
	if (m == 0 || n == 0)
		return 0;
	ENSURE(c && (k == 0 || (a && b)), "gemm: NULL matrix");
	if (k == 0) /* cuBLAS rejects a zero leading dimension */
		return launch_scale_or_zero(be, stream_of(be, dev), (size_t)m * n, c, beta);
	CUBLAS_CHECK(be, cublasSgemm(cuda_be(be)->dev[dev].blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
				     trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, trans_b ? k : n, a,
				     trans_a ? m : k, &beta, c, n));
	return 0;
}

static int cuda_add_bias(tr_backend_t *be, int dev, int rows, int cols, float *y, const float *bias)
{
	ENSURE_DEV("add_bias");
	ENSURE(rows >= 0 && cols >= 0, "add_bias: negative size %dx%d", rows, cols);
	if (rows == 0 || cols == 0)
		return 0;
	ENSURE(y && bias, "add_bias: NULL pointer");
	return launch_add_bias(be, stream_of(be, dev), rows, cols, y, bias);
}

static int cuda_col_sum(tr_backend_t *be, int dev, int rows, int cols, const float *x, float *out)
{
	ENSURE_DEV("col_sum");
	ENSURE(rows >= 0 && cols >= 0, "col_sum: negative size %dx%d", rows, cols);
	if (cols == 0)
		return 0;
	ENSURE(out && (rows == 0 || x), "col_sum: NULL pointer");
	return launch_col_sum(be, stream_of(be, dev), rows, cols, x, out);
}

static bool act_known(enum tr_act act)
{
	return act == TR_ACT_RELU || act == TR_ACT_GELU || act == TR_ACT_GELU_TANH || act == TR_ACT_TANH ||
	       act == TR_ACT_SIGMOID;
}

static int cuda_act_forward(tr_backend_t *be, int dev, enum tr_act act, size_t n, const float *x, float *y)
{
	ENSURE_DEV("act_forward");
	ENSURE(act_known(act), "act_forward: unknown activation %d", (int)act);
	if (n == 0)
		return 0;
	ENSURE(x && y, "act_forward: NULL pointer");
	return launch_act_forward(be, stream_of(be, dev), act, n, x, y);
}

static int cuda_act_backward(tr_backend_t *be, int dev, enum tr_act act, size_t n, const float *x, const float *y,
			     const float *dy, float *dx)
{
	ENSURE_DEV("act_backward");
	ENSURE(act_known(act), "act_backward: unknown activation %d", (int)act);
	if (n == 0)
		return 0;
	ENSURE(x && dy && dx && (y || (act != TR_ACT_TANH && act != TR_ACT_SIGMOID)), "act_backward: NULL pointer");
	return launch_act_backward(be, stream_of(be, dev), act, n, x, y, dy, dx);
}

static int cuda_dropout_forward(tr_backend_t *be, int dev, int rows, int cols, float rate, uint64_t key,
				int64_t row0, const float *x, float *y, float *mask)
{
	ENSURE_DEV("dropout_forward");
	ENSURE(rows >= 0 && cols >= 0 && row0 >= 0, "dropout_forward: bad shape %dx%d at row %lld", rows, cols,
	       (long long)row0);
	ENSURE(rate >= 0.0f && rate < 1.0f, "dropout_forward: rate %g outside [0, 1)", (double)rate);
	if (rows == 0 || cols == 0)
		return 0;
	ENSURE(x && y && mask, "dropout_forward: NULL pointer");
	return launch_dropout(be, stream_of(be, dev), rows, cols, rate, key, row0, x, y, mask);
}

static int cuda_mul(tr_backend_t *be, int dev, size_t n, const float *a, const float *b, float *out)
{
	ENSURE_DEV("mul");
	if (n == 0)
		return 0;
	ENSURE(a && b && out, "mul: NULL pointer");
	return launch_mul(be, stream_of(be, dev), n, a, b, out);
}

static int cuda_scale(tr_backend_t *be, int dev, size_t n, float *x, float alpha)
{
	ENSURE_DEV("scale");
	if (n == 0)
		return 0;
	ENSURE(x, "scale: NULL pointer");
	return launch_scale(be, stream_of(be, dev), n, x, alpha);
}

/* The result goes to a host pointer, so this waits for the device. */
static int cuda_sumsq(tr_backend_t *be, int dev, size_t n, const float *x, double *out)
{
	ENSURE_DEV("sumsq");
	ENSURE(out, "sumsq: NULL output");
	if (n == 0) {
		*out = 0.0;
		return 0;
	}
	ENSURE(x, "sumsq: NULL input");
	struct cuda_dev *d = &cuda_be(be)->dev[dev];
	int rc = launch_sumsq(be, d->stream, d, n, x);
	if (rc == 0)
		rc = read_result(be, d);
	if (rc == 0)
		*out = d->host_res->sum[0];
	return rc;
}

static int cuda_layernorm_forward(tr_backend_t *be, int dev, int rows, int cols, float eps, const float *x,
				  const float *gamma, const float *beta, float *y, float *mean, float *rstd)
{
	ENSURE_DEV("layernorm_forward");
	ENSURE(rows >= 0 && cols >= 1, "layernorm_forward: bad shape %dx%d", rows, cols);
	ENSURE(gamma && beta, "layernorm_forward: gamma and beta are required");
	if (rows == 0)
		return 0;
	ENSURE(x && y && mean && rstd, "layernorm_forward: NULL pointer");
	return launch_layernorm_forward(be, stream_of(be, dev), rows, cols, eps, x, gamma, beta, y, mean, rstd);
}

static int cuda_layernorm_backward(tr_backend_t *be, int dev, int rows, int cols, const float *x, const float *gamma,
				   const float *mean, const float *rstd, const float *dy, float *dx, float *dgamma,
				   float *dbeta)
{
	ENSURE_DEV("layernorm_backward");
	ENSURE(rows >= 0 && cols >= 1, "layernorm_backward: bad shape %dx%d", rows, cols);
	ENSURE(gamma && dgamma && dbeta, "layernorm_backward: gamma, dgamma and dbeta are required");
	if (rows == 0)
		return 0;
	ENSURE(x && mean && rstd && dy && dx, "layernorm_backward: NULL pointer");
	return launch_layernorm_backward(be, stream_of(be, dev), rows, cols, x, gamma, mean, rstd, dy, dx, dgamma,
					 dbeta);
}

/* Waits for the device (out is a host pointer).  A bad label is found on
 * the device before anything is written, so out and dlogits stay as they
 * were; only then is the label itself fetched, for the message. */
static int cuda_softmax_ce(tr_backend_t *be, int dev, int rows, int classes, const float *logits,
			   const float *labels, float scale, float *dlogits, double *out)
{
	ENSURE_DEV("softmax_ce");
	ENSURE(rows >= 0 && classes >= 1, "softmax_ce: bad shape %dx%d", rows, classes);
	if (rows == 0)
		return 0;
	ENSURE(logits && labels, "softmax_ce: NULL pointer");
	struct cuda_dev *d = &cuda_be(be)->dev[dev];
	int rc = launch_softmax_ce(be, d->stream, d, rows, classes, logits, labels, scale, dlogits);
	if (rc == 0)
		rc = read_result(be, d);
	if (rc)
		return rc;
	if (d->host_res->bad_row != TR_CUDA_NO_BAD_ROW) {
		int r = d->host_res->bad_row;
		float l = NAN;
		CUDA_CHECK(be, cudaMemcpy(&l, labels + r, sizeof(l), cudaMemcpyDeviceToHost));
		return tr_cuda_set_error(be, -EINVAL, "softmax_ce: row %d: label %g is not an integer class in [0, %d)",
					 r, (double)l, classes);
	}
	if (out) {
		out[0] += d->host_res->sum[0];
		out[1] += d->host_res->sum[1];
	}
	return 0;
}

static int cuda_mse(tr_backend_t *be, int dev, int rows, int cols, const float *pred, const float *target,
		    float scale, float *dpred, double *out)
{
	ENSURE_DEV("mse");
	ENSURE(rows >= 0 && cols >= 1, "mse: bad shape %dx%d", rows, cols);
	if (rows == 0)
		return 0;
	ENSURE(pred && target, "mse: NULL pointer");
	struct cuda_dev *d = &cuda_be(be)->dev[dev];
	float coef = scale * 2.0f / (float)cols; /* as the CPU, left to right */
	int rc = launch_mse(be, d->stream, d, rows, cols, pred, target, coef, dpred);
	if (rc == 0)
		rc = read_result(be, d);
	if (rc == 0 && out)
		out[0] += d->host_res->sum[0];
	return rc;
}

static int cuda_sgd_step(tr_backend_t *be, int dev, size_t n, float *param, const float *grad, float *state1,
			 const struct tr_optim_hp *hp)
{
	ENSURE_DEV("sgd_step");
	ENSURE(hp && hp->step >= 1, "sgd_step: step must be >= 1");
	ENSURE(hp->momentum == 0.0f || state1, "sgd_step: momentum needs a state buffer");
	if (n == 0)
		return 0;
	ENSURE(param && grad, "sgd_step: NULL pointer");
	return launch_sgd(be, stream_of(be, dev), n, param, grad, state1, hp);
}

static int cuda_adam_step(tr_backend_t *be, int dev, size_t n, float *param, const float *grad, float *m, float *v,
			  const struct tr_optim_hp *hp)
{
	ENSURE_DEV("adam_step");
	ENSURE(hp && hp->step >= 1, "adam_step: step must be >= 1");
	ENSURE(n == 0 || (m && v), "adam_step: needs two state buffers");
	if (n == 0)
		return 0;
	ENSURE(param && grad, "adam_step: NULL pointer");
	return launch_adam(be, stream_of(be, dev), n, param, grad, m, v, hp);
}

/* Runs the smallest kernel to completion: a device this build has no image
 * for (or whose driver cannot JIT the PTX) fails here, at creation, rather
 * than in the middle of a job. */
int tr_cuda_kernels_probe(tr_backend_t *be, int dev)
{
	struct cuda_dev *d = &cuda_be(be)->dev[dev];

	k_finish<<<1, BLOCK, 0, d->stream>>>(0, d->partials, d->result);
	cudaError_t e = cudaGetLastError();
	if (e == cudaSuccess)
		e = cudaStreamSynchronize(d->stream);
	if (e != cudaSuccess) {
		(void)cudaGetLastError();
		return tr_cuda_set_error(be, -ENODEV,
					 "%s (compute capability %d.%d) cannot run this build's kernels (built for "
					 "sm_80, sm_90 and compute_90 PTX): %s: %s",
					 d->name, d->cc_major, d->cc_minor, cudaGetErrorName(e), cudaGetErrorString(e));
	}
	return 0;
}

void tr_cuda_kernels_fill(tr_backend_i *t)
{
	t->gemm = cuda_gemm;
	t->add_bias = cuda_add_bias;
	t->col_sum = cuda_col_sum;
	t->act_forward = cuda_act_forward;
	t->act_backward = cuda_act_backward;
	t->dropout_forward = cuda_dropout_forward;
	t->mul = cuda_mul;
	t->layernorm_forward = cuda_layernorm_forward;
	t->layernorm_backward = cuda_layernorm_backward;
	t->softmax_ce = cuda_softmax_ce;
	t->mse = cuda_mse;
	t->scale = cuda_scale;
	t->sumsq = cuda_sumsq;
	t->sgd_step = cuda_sgd_step;
	t->adam_step = cuda_adam_step;
}
