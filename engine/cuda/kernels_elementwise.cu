/* CUDA kernels, elementwise family: activations forward and backward,
 * dropout (engine/rng.h on the device), mul, add and scale
 * (engine/cuda/kernels_common.cuh).  One float operation order per
 * element, the CPU's: these agree with it bit for bit.
 */
#include "engine/cuda/kernels_common.cuh"

/* Constants as PyTorch's GeluKernel spells them (as cpu_kernels.c). */
#define GELU_ALPHA 0.70710678118654752440f /* 1/sqrt(2) */
#define GELU_PDF 0.39894228040143267794f   /* 1/sqrt(2 pi) */
#define GELU_BETA 0.79788456080286535588f  /* sqrt(2/pi) */
#define GELU_KAPPA 0.044715f

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

template <typename I>
__global__ void k_dropout(I n, I cols, float rate, float keep_scale, uint64_t key, int64_t row0, const float *x,
			  float *y, float *mask)
{
	GRID_STRIDE_T(I, i, n)
	{
		uint64_t r = i / cols, c = i % cols;
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

/* out may be a or b (a residual block's sum). */
__global__ void k_add(size_t n, const float *a, const float *b, float *out)
{
	GRID_STRIDE(i, n)
	out[i] = a[i] + b[i];
}

__global__ void k_scale(size_t n, float *x, float alpha)
{
	GRID_STRIDE(i, n)
	x[i] *= alpha;
}

/* ==== host launchers ===================================================== */

#define ACT_CASES(X) X(TR_ACT_RELU) X(TR_ACT_GELU) X(TR_ACT_GELU_TANH) X(TR_ACT_TANH) X(TR_ACT_SIGMOID)

static int launch_act_forward(tr_backend_t *be, cudaStream_t s, enum tr_act act, size_t n, const float *x, float *y)
{
	assert(n > 0 && x && y);
	switch (act) {
#define FWD(A)                                                           \
	case A:                                                          \
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
#define BWD(A)                                                                    \
	case A:                                                                   \
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

static int launch_dropout(tr_backend_t *be, cudaStream_t s, int rows, int cols, float rate, uint64_t key, int64_t row0,
			  const float *x, float *y, float *mask)
{
	size_t n = (size_t)rows * cols;
	assert(rows > 0 && cols > 0 && row0 >= 0 && rate >= 0.0f && rate < 1.0f && x && y && mask);
	/* the CPU's expression, evaluated on the host: the same float */
	float keep_scale = 1.0f / (1.0f - rate);
	if (index32_ok(n))
		k_dropout<uint32_t><<<grid_for(n), BLOCK, 0, s>>>((uint32_t)n, (uint32_t)cols, rate, keep_scale, key,
								  row0, x, y, mask);
	else
		k_dropout<uint64_t><<<grid_for(n), BLOCK, 0, s>>>((uint64_t)n, (uint64_t)cols, rate, keep_scale, key,
								  row0, x, y, mask);
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

static int launch_add(tr_backend_t *be, cudaStream_t s, size_t n, const float *a, const float *b, float *out)
{
	assert(n > 0 && a && b && out);
	k_add<<<grid_for(n), BLOCK, 0, s>>>(n, a, b, out);
	LAUNCH_CHECK(be, "k_add");
	return 0;
}

static int launch_scale(tr_backend_t *be, cudaStream_t s, size_t n, float *x, float alpha)
{
	assert(n > 0 && x);
	k_scale<<<grid_for(n), BLOCK, 0, s>>>(n, x, alpha);
	LAUNCH_CHECK(be, "k_scale");
	return 0;
}

/* ==== backend functions ================================================== */

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

static int cuda_dropout_forward(tr_backend_t *be, int dev, int rows, int cols, float rate, uint64_t key, int64_t row0,
				const float *x, float *y, float *mask)
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

static int cuda_add(tr_backend_t *be, int dev, size_t n, const float *a, const float *b, float *out)
{
	ENSURE_DEV("add");
	if (n == 0)
		return 0;
	ENSURE(a && b && out, "add: NULL pointer");
	return launch_add(be, stream_of(be, dev), n, a, b, out);
}

static int cuda_scale(tr_backend_t *be, int dev, size_t n, float *x, float alpha)
{
	ENSURE_DEV("scale");
	if (n == 0)
		return 0;
	ENSURE(x, "scale: NULL pointer");
	return launch_scale(be, stream_of(be, dev), n, x, alpha);
}

void tr_cuda_elementwise_fill(tr_backend_i *t)
{
	t->act_forward = cuda_act_forward;
	t->act_backward = cuda_act_backward;
	t->dropout_forward = cuda_dropout_forward;
	t->mul = cuda_mul;
	t->add = cuda_add;
	t->scale = cuda_scale;
}
