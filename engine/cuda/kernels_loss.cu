/* CUDA kernels, loss family: softmax cross-entropy (with the label check
 * that runs before anything is written) and mean squared error
 * (engine/cuda/kernels_common.cuh).  Both are reductions whose sums are
 * added into the caller's device memory: nothing waits, and a bad label
 * is reported by the next `sync` (docs/design.md, "Host waits").
 */
#include "engine/cuda/kernels_common.cuh"

/* ==== kernels ============================================================ */

/* Records the first row whose label is not an integer class, with the
 * label's bits for the message (TR_CUDA_NO_BAD_LABEL: none). */
__global__ void k_check_labels(int rows, int classes, const float *labels, unsigned long long *bad)
{
	GRID_STRIDE(i, (size_t)rows)
	{
		float l = labels[i];
		if (!(l >= 0.0f && l < (float)classes) || l != floorf(l))
			atomicMin(bad, (unsigned long long)i << 32 | __float_as_uint(l));
	}
}

/* One warp per row, rows strided over a fixed grid; per-block partials of
 * the loss sum and the correct count.  Does nothing when k_check_labels
 * found a bad label, so that dlogits stays untouched (as on the CPU). */
__global__ void k_softmax_ce(int rows, int classes, const float *logits, const float *labels, float scale,
			     float *dlogits, const unsigned long long *bad, double *partials)
{
	if (*bad != TR_CUDA_NO_BAD_LABEL)
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

/* ==== host launchers ===================================================== */

/* Label check, loss and gradient, and the sums added into out.  The check
 * is cleared by the first call after a sync, so a bad label stops every
 * later call until `sync` reports it; its pinned copy is refreshed after
 * each call, so the one sync reads the latest. */
static int launch_softmax_ce(tr_backend_t *be, cudaStream_t s, struct cuda_dev *d, int rows, int classes,
			     const float *logits, const float *labels, float scale, float *dlogits, double *out)
{
	assert(rows > 0 && classes > 0 && logits && labels);
	unsigned long long *bad = &d->result->bad_label;
	if (!d->label_pending) {
		CUDA_CHECK(be, cudaMemsetAsync(bad, 0xff, sizeof(*bad), s)); /* TR_CUDA_NO_BAD_LABEL */
		d->label_pending = true;
	}
	d->label_classes = classes;
	k_check_labels<<<grid_for((size_t)rows), BLOCK, 0, s>>>(rows, classes, labels, bad);
	LAUNCH_CHECK(be, "k_check_labels");
	unsigned grid = row_grid(rows);
	k_softmax_ce<<<grid, BLOCK, 0, s>>>(rows, classes, logits, labels, scale, dlogits, bad, d->partials);
	LAUNCH_CHECK(be, "k_softmax_ce");
	CUDA_CHECK(be, cudaMemcpyAsync(&d->host_res->bad_label, bad, sizeof(*bad), cudaMemcpyDeviceToHost, s));
	return out ? tr_cuda_finish_sums(be, s, d, grid, out, 2, true) : 0;
}

static int launch_mse(tr_backend_t *be, cudaStream_t s, struct cuda_dev *d, int rows, int cols, const float *pred,
		      const float *target, float coef, float *dpred, double *out)
{
	assert(rows > 0 && cols > 0 && pred && target);
	unsigned grid = row_grid(rows);
	k_mse<<<grid, BLOCK, 0, s>>>(rows, cols, pred, target, coef, dpred, d->partials);
	LAUNCH_CHECK(be, "k_mse");
	return out ? tr_cuda_finish_sums(be, s, d, grid, out, 1, true) : 0;
}

/* ==== backend functions ================================================== */

/* Enqueues only.  A bad label is found on the device before anything is
 * written, so out and dlogits stay as they were; `sync` reports it. */
static int cuda_softmax_ce(tr_backend_t *be, int dev, int rows, int classes, const float *logits, const float *labels,
			   float scale, float *dlogits, double *out)
{
	ENSURE_DEV("softmax_ce");
	ENSURE(rows >= 0 && classes >= 1, "softmax_ce: bad shape %dx%d", rows, classes);
	if (rows == 0)
		return 0;
	ENSURE(logits && labels, "softmax_ce: NULL pointer");
	struct cuda_dev *d = &cuda_be(be)->dev[dev];
	return launch_softmax_ce(be, d->stream, d, rows, classes, logits, labels, scale, dlogits, out);
}

static int cuda_mse(tr_backend_t *be, int dev, int rows, int cols, const float *pred, const float *target, float scale,
		    float *dpred, double *out)
{
	ENSURE_DEV("mse");
	ENSURE(rows >= 0 && cols >= 1, "mse: bad shape %dx%d", rows, cols);
	if (rows == 0)
		return 0;
	ENSURE(pred && target, "mse: NULL pointer");
	struct cuda_dev *d = &cuda_be(be)->dev[dev];
	float coef = scale * 2.0f / (float)cols; /* as the CPU, left to right */
	return launch_mse(be, d->stream, d, rows, cols, pred, target, coef, dpred, out);
}

void tr_cuda_loss_fill(tr_backend_i *t)
{
	t->softmax_ce = cuda_softmax_ce;
	t->mse = cuda_mse;
}
