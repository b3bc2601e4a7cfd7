/* CUDA kernels, optimizer family: torch.optim's SGD (momentum, dampening,
 * Nesterov) and Adam/AdamW updates (engine/cuda/kernels_common.cuh).  The
 * scalars are formed on the host exactly as the CPU forms them, so the
 * updates agree with it bit for bit.
 */
#include "engine/cuda/kernels_common.cuh"

/* ==== kernels ============================================================ */

/* stop_on_nan's gate (struct tr_optim_hp): read by every thread, the same
 * answer for all, so a skipped update writes nothing. */
__device__ __forceinline__ bool d_update_skipped(const double *gate)
{
	return gate && !isfinite(*gate);
}

/* torch.optim.SGD (see cpu_sgd_step); the branch is uniform per launch. */
enum sgd_mode { SGD_PLAIN, SGD_FIRST, SGD_NESTEROV, SGD_MOMENTUM };

__global__ void k_sgd(size_t n, float *p, const float *grad, float *buf, float lr, float wd, float mom, float damp1,
		      int mode, bool nesterov, const double *gate)
{
	if (d_update_skipped(gate))
		return;
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
		       float beta2, float w2, float neg_step, float bc2_sqrt, float eps, const double *gate)
{
	if (d_update_skipped(gate))
		return;
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
					    hp->nesterov, hp->skip_unless_finite);
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
	k_adam<<<grid_for(n), BLOCK, 0, s>>>(n, p, g, m, v, p_keep, wd_g, w1, beta2, w2, neg_step, bc2_sqrt, hp->eps,
					     hp->skip_unless_finite);
	LAUNCH_CHECK(be, "k_adam");
	return 0;
}

/* ==== backend functions ================================================== */

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

void tr_cuda_optim_fill(tr_backend_i *t)
{
	t->sgd_step = cuda_sgd_step;
	t->adam_step = cuda_adam_step;
}
