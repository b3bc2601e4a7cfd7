/* CUDA kernels, reductions: the second pass every reduction shares, the
 * sum of squares (grad_norm, clipping, stop_on_nan), the per-range sums
 * of squares (per-layer norms, one pass for every layer), clipping with
 * its coefficient formed on the device, and the probe that
 * proves at creation that a device can run this module's kernels
 * (engine/cuda/kernels_common.cuh).
 */
#include <string.h>

#include "engine/cuda/kernels_common.cuh"

/* ==== kernels ============================================================ */

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
 * index order within each thread, then as a tree, into dst[0..nout). */
__global__ void k_finish(int nparts, const double *partials, double *dst, int nout, int add)
{
	double a = 0.0, b = 0.0;

	for (int i = threadIdx.x; i < nparts; i += blockDim.x) {
		a += partials[i];
		b += partials[TR_CUDA_RED_SLOTS + i];
	}
	block_sum2(&a, &b);
	if (threadIdx.x == 0 && dst) {
		dst[0] = add ? dst[0] + a : a;
		if (nout > 1)
			dst[1] = add ? dst[1] + b : b;
	}
}

/* The ranges of one sumsq_ranges call, by value (about 2 KiB of kernel
 * parameters, within the 4 KiB every device takes). */
struct sumsq_ranges_arg {
	int n;
	unsigned long long off[TR_SUMSQ_MAX_RANGES], len[TR_SUMSQ_MAX_RANGES];
};
/* Blocks per range of k_sumsq_ranges: RANGE_BLOCKS x TR_SUMSQ_MAX_RANGES
 * partials fit d->partials' 2 x TR_CUDA_RED_SLOTS. */
#define RANGE_BLOCKS 16u

/* First pass: block (x, y) strides over range y with RANGE_BLOCKS blocks,
 * one partial each at partials[y * RANGE_BLOCKS + x]. */
__global__ void k_sumsq_ranges(struct sumsq_ranges_arg a, const float *x, double *partials)
{
	double acc = 0.0, unused = 0.0;
	const float *r = x + a.off[blockIdx.y];
	size_t n = (size_t)a.len[blockIdx.y];

	GRID_STRIDE(i, n)
	acc += (double)r[i] * (double)r[i];
	block_sum2(&acc, &unused);
	if (threadIdx.x == 0)
		partials[blockIdx.y * RANGE_BLOCKS + blockIdx.x] = acc;
}

/* Second pass: block k adds range k's partials in index order. */
__global__ void k_finish_ranges(const double *partials, double *out)
{
	if (threadIdx.x == 0) {
		double s = 0.0;
		for (unsigned i = 0; i < RANGE_BLOCKS; i++)
			s += partials[blockIdx.x * RANGE_BLOCKS + i];
		out[blockIdx.x] = s;
	}
}

/* torch's clip_grad_norm_ coefficient, in double as the CPU forms it, read
 * by every thread from the device: no host decision. */
__global__ void k_clip_scale(size_t n, float *x, float max_norm, const double *sumsq)
{
	double coef = max_norm / (sqrt(*sumsq) + 1e-6);
	if (!(coef < 1.0))
		return; /* the same for every thread */
	float c = (float)coef;
	GRID_STRIDE(i, n)
	x[i] *= c;
}

/* ==== host launchers ===================================================== */

int tr_cuda_finish_sums(tr_backend_t *be, cudaStream_t s, struct cuda_dev *d, unsigned nparts, double *dst, int nout,
			bool add)
{
	assert(nparts <= TR_CUDA_RED_SLOTS && nout >= 1 && nout <= 2);
	k_finish<<<1, BLOCK, 0, s>>>((int)nparts, d->partials, dst, nout, add ? 1 : 0);
	LAUNCH_CHECK(be, "k_finish");
	return 0;
}

/* Both passes of sumsq; the total lands in out[0] (device). */
static int launch_sumsq(tr_backend_t *be, cudaStream_t s, struct cuda_dev *d, size_t n, const float *x, double *out)
{
	assert(n > 0 && x);
	/* >= 8 elements per thread before a block gets its own slot */
	size_t g = (n + BLOCK * 8 - 1) / (BLOCK * 8);
	unsigned grid = g > TR_CUDA_RED_SLOTS ? TR_CUDA_RED_SLOTS : (unsigned)g;
	k_sumsq<<<grid, BLOCK, 0, s>>>(n, x, d->partials);
	LAUNCH_CHECK(be, "k_sumsq");
	return tr_cuda_finish_sums(be, s, d, grid, out, 1, false);
}

static int launch_sumsq_ranges(tr_backend_t *be, cudaStream_t s, struct cuda_dev *d, const struct sumsq_ranges_arg *a,
			       const float *x, double *out)
{
	assert(a->n > 0 && a->n <= TR_SUMSQ_MAX_RANGES && x && out);
	static_assert(RANGE_BLOCKS * TR_SUMSQ_MAX_RANGES <= 2 * TR_CUDA_RED_SLOTS, "partials too small");
	k_sumsq_ranges<<<dim3(RANGE_BLOCKS, (unsigned)a->n), BLOCK, 0, s>>>(*a, x, d->partials);
	LAUNCH_CHECK(be, "k_sumsq_ranges");
	k_finish_ranges<<<(unsigned)a->n, 32, 0, s>>>(d->partials, out);
	LAUNCH_CHECK(be, "k_finish_ranges");
	return 0;
}

static int launch_clip_scale(tr_backend_t *be, cudaStream_t s, size_t n, float *x, float max_norm, const double *sumsq)
{
	assert(n > 0 && x && sumsq);
	k_clip_scale<<<grid_for(n), BLOCK, 0, s>>>(n, x, max_norm, sumsq);
	LAUNCH_CHECK(be, "k_clip_scale");
	return 0;
}

/* ==== backend functions ================================================== */

/* out is device memory: nothing waits. */
static int cuda_sumsq(tr_backend_t *be, int dev, size_t n, const float *x, double *out)
{
	ENSURE_DEV("sumsq");
	ENSURE(out, "sumsq: NULL output");
	struct cuda_dev *d = &cuda_be(be)->dev[dev];
	if (n == 0) {
		CUDA_CHECK(be, cudaMemsetAsync(out, 0, sizeof(double), d->stream));
		return 0;
	}
	ENSURE(x, "sumsq: NULL input");
	return launch_sumsq(be, d->stream, d, n, x, out);
}

static int cuda_sumsq_ranges(tr_backend_t *be, int dev, int nranges, const size_t *off, const size_t *len,
			     const float *x, double *out)
{
	ENSURE_DEV("sumsq_ranges");
	ENSURE(nranges > 0 && nranges <= TR_SUMSQ_MAX_RANGES, "sumsq_ranges: %d ranges (1 to %d)", nranges,
	       TR_SUMSQ_MAX_RANGES);
	ENSURE(off && len && out && x, "sumsq_ranges: NULL pointer");
	struct sumsq_ranges_arg a;
	memset(&a, 0, sizeof a);
	a.n = nranges;
	for (int k = 0; k < nranges; k++) {
		a.off[k] = off[k];
		a.len[k] = len[k];
	}
	struct cuda_dev *d = &cuda_be(be)->dev[dev];
	return launch_sumsq_ranges(be, d->stream, d, &a, x, out);
}

static int cuda_clip_scale(tr_backend_t *be, int dev, size_t n, float *x, float max_norm, const double *sumsq)
{
	ENSURE_DEV("clip_scale");
	ENSURE(sumsq, "clip_scale: NULL sum of squares");
	if (n == 0)
		return 0;
	ENSURE(x, "clip_scale: NULL input");
	return launch_clip_scale(be, stream_of(be, dev), n, x, max_norm, sumsq);
}

/* Runs the smallest kernel to completion: a device this build has no image
 * for (or whose driver cannot JIT the PTX) fails here, at creation, rather
 * than in the middle of a job. */
int tr_cuda_kernels_probe(tr_backend_t *be, int dev)
{
	struct cuda_dev *d = &cuda_be(be)->dev[dev];

	k_finish<<<1, BLOCK, 0, d->stream>>>(0, d->partials, (double *)d->partials, 1, 0);
	cudaError_t e = cudaGetLastError();
	if (e == cudaSuccess)
		e = cudaStreamSynchronize(d->stream);
	tr_cuda_count_wait(be);
	if (e != cudaSuccess) {
		(void)cudaGetLastError();
		return tr_cuda_set_error(be, -ENODEV,
					 "%s (compute capability %d.%d) cannot run this build's kernels (built for "
					 "sm_80, sm_90 and compute_90 PTX): %s: %s",
					 d->name, d->cc_major, d->cc_minor, cudaGetErrorName(e), cudaGetErrorString(e));
	}
	return 0;
}

void tr_cuda_reduce_fill(tr_backend_i *t)
{
	t->sumsq = cuda_sumsq;
	t->sumsq_ranges = cuda_sumsq_ranges;
	t->clip_scale = cuda_clip_scale;
}
