/* CUDA kernels, normalisation family: layernorm forward and backward
 * (engine/cuda/kernels_common.cuh).  Statistics in double, as the CPU.
 */
#include "engine/cuda/kernels_common.cuh"

/* ==== kernels ============================================================ */

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

/* ==== host launchers ===================================================== */

static int launch_layernorm_forward(tr_backend_t *be, cudaStream_t s, int rows, int cols, float eps, const float *x,
				    const float *gamma, const float *beta, float *y, float *mean, float *rstd)
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

/* ==== backend functions ================================================== */

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

void tr_cuda_norm_fill(tr_backend_i *t)
{
	t->layernorm_forward = cuda_layernorm_forward;
	t->layernorm_backward = cuda_layernorm_backward;
}
