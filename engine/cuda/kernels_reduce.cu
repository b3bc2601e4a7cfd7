/* CUDA kernels, reductions: the second pass every reduction shares, the
 * sum of squares (grad_norm, clipping, stop_on_nan), and the probe that
 * proves at creation that a device can run this module's kernels
 * (engine/cuda/kernels_common.cuh).
 */
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

/* ==== host launchers ===================================================== */

int tr_cuda_finish_sums(tr_backend_t *be, cudaStream_t s, struct cuda_dev *d, unsigned nparts)
{
	assert(nparts <= TR_CUDA_RED_SLOTS);
	k_finish<<<1, BLOCK, 0, s>>>((int)nparts, d->partials, d->result);
	LAUNCH_CHECK(be, "k_finish");
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
	return tr_cuda_finish_sums(be, s, d, grid);
}

/* ==== backend functions ================================================== */

int tr_cuda_read_result(tr_backend_t *be, struct cuda_dev *d)
{
	CUDA_CHECK(be, cudaMemcpyAsync(d->host_res, d->result, sizeof(*d->result), cudaMemcpyDeviceToHost, d->stream));
	CUDA_CHECK(be, cudaStreamSynchronize(d->stream));
	return 0;
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
		rc = tr_cuda_read_result(be, d);
	if (rc == 0)
		*out = d->host_res->sum[0];
	return rc;
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

void tr_cuda_reduce_fill(tr_backend_i *t)
{
	t->sumsq = cuda_sumsq;
}
