/* CUDA kernels, dense family: gemm (cuBLAS), bias rows and column sums
 * (engine/cuda/kernels_common.cuh).
 */
#include "engine/cuda/kernels_common.cuh"

/* ==== kernels ============================================================ */

/* gemm with k == 0: C = beta * C, and beta == 0 must not read C. */
__global__ void k_scale_or_zero(size_t n, float *c, float beta)
{
	GRID_STRIDE(i, n)
	c[i] = beta == 0.0f ? 0.0f : beta * c[i];
}

template <typename I> __global__ void k_add_bias(I n, I cols, float *y, const float *bias)
{
	GRID_STRIDE_T(I, i, n)
	y[i] += bias[i % cols];
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

/* ==== host launchers ===================================================== */

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
	if (index32_ok(n))
		k_add_bias<uint32_t><<<grid_for(n), BLOCK, 0, s>>>((uint32_t)n, (uint32_t)cols, y, bias);
	else
		k_add_bias<uint64_t><<<grid_for(n), BLOCK, 0, s>>>((uint64_t)n, (uint64_t)cols, y, bias);
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

/* ==== backend functions ================================================== */

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

void tr_cuda_dense_fill(tr_backend_i *t)
{
	t->gemm = cuda_gemm;
	t->add_bias = cuda_add_bias;
	t->col_sum = cuda_col_sum;
}
