/* The device interface every compute backend implements.
 *
 * The trainer drives one host thread per device; every kernel below is
 * called from the thread that owns `dev`, on that device's compute stream,
 * and takes device pointers of that device.  The CPU backend is the
 * reference: its devices are plain host memory and its kernels run on the
 * calling thread (BLAS may use more threads).  A CUDA backend enqueues the
 * same calls on a stream and only blocks in `sync`.
 *
 * Results a kernel computes (loss sums, sums of squares) stay in device
 * memory: the caller brings them to the host with to_host into host_alloc
 * memory and reads them after the next `sync` (docs/design.md, "Host
 * waits").  No call in the middle of a step needs the host to wait.
 *
 * Matrices are row-major.  Every function returns 0 or a negative errno-style
 * code; the backend records a human-readable reason retrievable with
 * `last_error`.  Nothing here logs or exits.
 */
#ifndef TR_BACKEND_H
#define TR_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

typedef struct tr_backend tr_backend_t;
typedef struct tr_comm tr_comm_t;
struct tr_model; /* engine/model/model.h */

/* Which backend: a job spec's "backend", the daemon's --backend, and the
 * `kind` of an open backend (never AUTO there). */
enum tr_backend_kind { TR_BACKEND_KIND_AUTO, TR_BACKEND_KIND_CPU, TR_BACKEND_KIND_CUDA };

/* Ranges one sumsq_ranges call takes: two per layer (weight, bias). */
#define TR_SUMSQ_MAX_RANGES 128

/* CPU devices one backend can have. */
#define TR_CPU_MAX_DEVICES 64

enum tr_act {
	TR_ACT_RELU,
	TR_ACT_GELU,      /* exact, erf form */
	TR_ACT_GELU_TANH, /* tanh approximation */
	TR_ACT_TANH,
	TR_ACT_SIGMOID,
};

/* Shapes of one 2-D convolution, per sample, NCHW (docs/design.md, "Layer
 * registry").  Input x is [rows, c, h, w], output y [rows, f, ho, wo],
 * weight [f, c / groups, kh, kw] and bias [f], all contiguous, as PyTorch's
 * nn.Conv2d lays them out.  The layer fills every field, output size
 * included: ho = (h + 2 ph - dh (kh - 1) - 1) / sh + 1, likewise wo. */
struct tr_conv2d_desc {
	int c, h, w;   /* input channels, height, width */
	int f, ho, wo; /* filters (output channels), output height, width */
	int kh, kw;    /* kernel */
	int sh, sw;    /* stride */
	int ph, pw;    /* zero padding on each side */
	int dh, dw;    /* dilation */
	int groups;    /* divides c and f */
	/* CPU devices: the route this layer takes (enum tr_cpu_conv; AUTO =
	 * the backend's setting).  Set by the job from its spec's cpu_conv and
	 * the measured choice (tr_cpu_conv_route); other backends ignore it. */
	int route;
	/* CPU devices, route ONEDNN only: 1 when x and dx (x_blocked), or y
	 * and dy (y_blocked), lie in oneDNN's blocked layout nChw16c instead
	 * of NCHW, so that a chain of convolutions (with elementwise
	 * activations between them) needs no reorder between its layers.  Set
	 * by the job where tr_cpu_conv_chain_ok says so; 0 everywhere else. */
	int x_blocked, y_blocked;
};

/* Shapes of one 2-D pooling window sweep, NCHW, per sample: x [rows, c, h,
 * w], y [rows, c, ho, wo], ho = (h + 2 ph - kh) / sh + 1 (PyTorch's
 * floor mode).  Max pooling pads with -inf (ph <= kh / 2, as PyTorch
 * requires); average pooling counts the zero padding in the divisor
 * (count_include_pad), so every window divides by kh * kw. */
struct tr_pool2d_desc {
	int c, h, w;
	int ho, wo;
	int kh, kw;
	int sh, sw;
	int ph, pw;
	/* CPU devices, max pooling only: 1 when x and dx (x_blocked), or y
	 * and dy (y_blocked), lie in oneDNN's blocked layout nChw16c (c a
	 * multiple of 16), inside a chain of oneDNN convolutions; y_blocked
	 * only with x_blocked.  Set by the job where the chain allows
	 * (tr_trainer_conv_chains); 0 everywhere else, and on other
	 * backends. */
	int x_blocked, y_blocked;
};

/* The convolution kernels work on chunks of samples at once: one GEMM per
 * group and chunk, over chunk * ho * wo output columns, so small images
 * still give the GEMM a wide matrix.  A chunk's im2col matrix and GEMM
 * result live in a workspace the caller provides; the chunk is as many
 * samples as fit TR_CONV2D_WORKSPACE_CAP floats (at least one), so that the
 * workspace is bounded however large the batch.  Both the model (which
 * allocates the workspace) and every backend use these two functions, so
 * they agree on its size; the chunk depends on shapes only, never on
 * threads or timing, and so does the summation order of the results. */
#define TR_CONV2D_WORKSPACE_CAP ((size_t)1 << 22)
static inline int tr_conv2d_chunk(const struct tr_conv2d_desc *d, int rows)
{
	size_t per = ((size_t)d->c * d->kh * d->kw + (size_t)d->f) * (size_t)d->ho * (size_t)d->wo;
	size_t fit = per ? TR_CONV2D_WORKSPACE_CAP / per : 1;
	if (fit < 1)
		fit = 1;
	if (rows < 1)
		return 1;
	return (size_t)rows < fit ? rows : (int)fit;
}
/* Workspace floats conv2d_forward/backward need for `rows` samples. */
static inline size_t tr_conv2d_workspace(const struct tr_conv2d_desc *d, int rows)
{
	size_t chunk = (size_t)tr_conv2d_chunk(d, rows);
	return ((size_t)d->c * d->kh * d->kw + (size_t)d->f) * (size_t)d->ho * (size_t)d->wo * chunk;
}

/* Hyper-parameters of one optimizer update; the same for every element. */
struct tr_optim_hp {
	float lr;
	float weight_decay;
	/* sgd */
	float momentum;
	float dampening;
	bool nesterov;
	/* adam / adamw */
	float beta1, beta2, eps;
	bool decoupled; /* adamw: decay the weights, not the gradient */
	int64_t step;   /* 1-based update count, for bias correction and
			   for sgd's "first step copies the gradient" rule */
	/* stop_on_nan on the device: NULL, or device memory holding one
	 * double (the gradient's sum of squares); when it is not finite the
	 * update leaves param and state as they were (an _into update copies
	 * them to its outputs), so that no host decision is needed before
	 * the update is enqueued. */
	const double *skip_unless_finite;
};

/* A backend is its function table: the operations below and the
 * capabilities code may ask about (kind, memory_is_host, memory_estimate,
 * the optional pairs).  `name` is for people (logs, /devices); no code
 * compares it. */
typedef struct tr_backend_i {
	const char *name;
	enum tr_backend_kind kind;
	void (*destroy)(tr_backend_t *be);
	int (*device_count)(tr_backend_t *be);
	/* Writes a short description ("cpu0", "NVIDIA H200") into buf. */
	void (*device_name)(tr_backend_t *be, int dev, char *buf, size_t len);
	const char *(*last_error)(tr_backend_t *be);
	/* Memory of device dev in bytes (host RAM for CPU devices, which share
	 * it).  May be NULL when a backend cannot tell. */
	int (*memory_info)(tr_backend_t *be, int dev, size_t *total, size_t *free_bytes);

	/* Memory.  alloc returns zeroed device memory or NULL. */
	void *(*alloc)(tr_backend_t *be, int dev, size_t bytes);
	void (*free)(tr_backend_t *be, int dev, void *ptr);
	/* Host memory suitable for fast async copies (pinned on CUDA). */
	void *(*host_alloc)(tr_backend_t *be, size_t bytes);
	void (*host_free)(tr_backend_t *be, void *ptr);
	/* Copies; may be asynchronous with respect to the host until `sync`. */
	int (*to_device)(tr_backend_t *be, int dev, void *dst, const void *src, size_t bytes);
	int (*to_host)(tr_backend_t *be, int dev, void *dst, const void *src, size_t bytes);
	int (*copy)(tr_backend_t *be, int dev, void *dst, const void *src, size_t bytes);
	int (*memset0)(tr_backend_t *be, int dev, void *dst, size_t bytes);
	/* Waits until everything enqueued on dev has finished, on its compute
	 * stream and on its copy stream (to_device_async). */
	int (*sync)(tr_backend_t *be, int dev);
	/* Upload-ahead, optional: both NULL (the trainer then uploads each
	 * step's share on the compute stream right before using it) or both
	 * set.  to_device_async enqueues a host-to-device copy on dev's copy
	 * stream, which runs beside the compute stream, so that the next
	 * step's inputs travel while this step computes.  src must stay valid
	 * and unchanged until the next `sync` of dev returns; it overlaps only
	 * from host_alloc memory (pinned on CUDA).  The two streams are ordered
	 * only by copies_fence and sync, so dst must not be used by compute
	 * work that has not finished (alloc's zeroing included: sync once
	 * after alloc).  copies_fence makes work enqueued afterwards on the
	 * compute stream wait for every copy enqueued so far on the copy
	 * stream; it does not block the host. */
	int (*to_device_async)(tr_backend_t *be, int dev, void *dst, const void *src, size_t bytes);
	int (*copies_fence)(tr_backend_t *be, int dev);
	/* Whether gemm on dev may round its inputs to TF32 (tensor cores,
	 * relative error ~1e-3) or must stay FP32, the default.  Devices belong
	 * to one job at a time, which sets this on its devices before it
	 * starts, so the choice holds for that job alone.  allow = false
	 * always succeeds; allow = true is -ENOTSUP where gemm is FP32 only
	 * (the CPU backend).  May be NULL: the same as FP32 only. */
	int (*set_tf32)(tr_backend_t *be, int dev, bool allow);

	/* C[m,n] = alpha * op(A) op(B) + beta * C; op(A) is m x k. */
	int (*gemm)(tr_backend_t *be, int dev, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
		    const float *a, const float *b, float beta, float *c);
	/* Optional: C[m,n] = op(A) op(B) + bias[j] on every row of C, with the
	 * bits of gemm (alpha 1, beta 0) followed by add_bias, in one call
	 * (a dense layer's forward: the CPU backend adds the bias while each
	 * tile of C is in cache).  NULL: the caller makes the two calls. */
	int (*gemm_bias)(tr_backend_t *be, int dev, bool trans_a, bool trans_b, int m, int n, int k, const float *a,
			 const float *b, const float *bias, float *c);
	/* Optional (CPU devices): gemm_bias's product (bias may be NULL)
	 * through `route`, enum tr_cpu_gemm: OPENBLAS, gemm_bias's bits, or
	 * ONEDNN (a dense layer's route, tr_cpu_dense_route).  NULL: the
	 * caller takes gemm_bias or gemm. */
	int (*gemm_route)(tr_backend_t *be, int dev, int route, bool trans_a, bool trans_b, int m, int n, int k,
			  const float *a, const float *b, const float *bias, float *c);
	/* Optional: the largest k for which gemm with alpha = 1 and beta = 1
	 * adds each element of the product to C in one rounding, C + P, P
	 * being what gemm with beta = 0 writes at the same shape: the bits of
	 * gemm into a zeroed buffer followed by `add`, without the buffer.
	 * Exact mode folds the first shards' dense weight gradients into
	 * their running sum this way (docs/design.md, "Exact mode").  NULL
	 * or 0: never relied on. */
	int (*gemm_accumulate_max_k)(tr_backend_t *be);
	/* y[r,c] += bias[c] */
	int (*add_bias)(tr_backend_t *be, int dev, int rows, int cols, float *y, const float *bias);
	/* out[c] = sum_r x[r,c] (overwrites out) */
	int (*col_sum)(tr_backend_t *be, int dev, int rows, int cols, const float *x, float *out);
	int (*act_forward)(tr_backend_t *be, int dev, enum tr_act act, size_t n, const float *x, float *y);
	/* dx = dy * act'(x); y is the forward output (cheaper derivative for tanh/sigmoid). */
	int (*act_backward)(tr_backend_t *be, int dev, enum tr_act act, size_t n, const float *x, const float *y,
			    const float *dy, float *dx);
	/* Inverted dropout.  Element (r, c) is kept when
	 * tr_rng_uniform(key, (row0 + r) * cols + c) >= rate; mask receives 0 or
	 * 1/(1-rate).  row0 is the row's position in the step's global sample
	 * list, so the mask does not depend on how the step was split. */
	int (*dropout_forward)(tr_backend_t *be, int dev, int rows, int cols, float rate, uint64_t key, int64_t row0,
			       const float *x, float *y, float *mask);
	int (*mul)(tr_backend_t *be, int dev, size_t n, const float *a, const float *b, float *out);
	/* out = a + b, elementwise; out may be a or b (a residual block's sum). */
	int (*add)(tr_backend_t *be, int dev, size_t n, const float *a, const float *b, float *out);
	/* 2-D convolution over `rows` samples (struct tr_conv2d_desc): y = conv(x,
	 * w) + bias; bias may be NULL.  work holds tr_conv2d_workspace(d, rows)
	 * floats and is clobbered.  Overwrites y. */
	int (*conv2d_forward)(tr_backend_t *be, int dev, const struct tr_conv2d_desc *d, int rows, const float *x,
			      const float *w, const float *bias, float *y, float *work);
	/* Its gradients from dy: OVERWRITES dw (and dbias when not NULL) with
	 * the sums over the rows, and writes dx unless it is NULL.  work as in
	 * conv2d_forward.  Sums run over samples in order, chunk by chunk
	 * (tr_conv2d_chunk), so they depend on the shapes only. */
	int (*conv2d_backward)(tr_backend_t *be, int dev, const struct tr_conv2d_desc *d, int rows, const float *x,
			       const float *w, const float *dy, float *dx, float *dw, float *dbias, float *work);
	/* Max pooling; backward routes each dy to its window's first maximum
	 * (the first in row-major order, as PyTorch's CPU kernel picks), found
	 * again from x, and overwrites dx (sums where windows overlap). */
	int (*maxpool2d_forward)(tr_backend_t *be, int dev, const struct tr_pool2d_desc *d, int rows, const float *x,
				 float *y);
	int (*maxpool2d_backward)(tr_backend_t *be, int dev, const struct tr_pool2d_desc *d, int rows, const float *x,
				  const float *dy, float *dx);
	/* Average pooling, divisor kh * kw; a global average pool is the
	 * window of the whole image.  Backward overwrites dx. */
	int (*avgpool2d_forward)(tr_backend_t *be, int dev, const struct tr_pool2d_desc *d, int rows, const float *x,
				 float *y);
	int (*avgpool2d_backward)(tr_backend_t *be, int dev, const struct tr_pool2d_desc *d, int rows, const float *dy,
				  float *dx);
	/* LayerNorm over the last dim; mean/rstd have `rows` entries. */
	int (*layernorm_forward)(tr_backend_t *be, int dev, int rows, int cols, float eps, const float *x,
				 const float *gamma, const float *beta, float *y, float *mean, float *rstd);
	/* Writes dx and ADDS into dgamma/dbeta. */
	int (*layernorm_backward)(tr_backend_t *be, int dev, int rows, int cols, const float *x, const float *gamma,
				  const float *mean, const float *rstd, const float *dy, float *dx, float *dgamma,
				  float *dbeta);
	/* Softmax cross-entropy with integer class labels stored as floats.
	 * dlogits = scale * (softmax - onehot); out[0] += sum of per-sample
	 * losses (unscaled), out[1] += number of correct argmax predictions;
	 * out is DEVICE memory (two doubles), added to on the device.
	 * A label outside [0, classes) is an error (-EINVAL), returned by this
	 * call or, where finding it would make the host wait (CUDA), by the
	 * next `sync` of dev; out and dlogits are then left as they were. */
	int (*softmax_ce)(tr_backend_t *be, int dev, int rows, int classes, const float *logits, const float *labels,
			  float scale, float *dlogits, double *out);
	/* Mean squared error per sample = mean over cols of (p - t)^2.
	 * dpred = scale * 2 (p - t) / cols; out[0] += sum of per-sample losses
	 * (out: DEVICE memory, one double). */
	int (*mse)(tr_backend_t *be, int dev, int rows, int cols, const float *pred, const float *target, float scale,
		   float *dpred, double *out);
	int (*scale)(tr_backend_t *be, int dev, size_t n, float *x, float alpha);
	/* Sum of squares, accumulated in double, written to *out: DEVICE
	 * memory (one double), overwritten. */
	int (*sumsq)(tr_backend_t *be, int dev, size_t n, const float *x, double *out);
	/* The sums of squares of nranges ranges of x in one pass (per-layer
	 * norms): out[k] = sum of x[off[k] + i]^2, i < len[k], in double;
	 * out is DEVICE memory (nranges doubles), off and len host arrays
	 * read during the call; 0 < nranges <= TR_SUMSQ_MAX_RANGES. */
	int (*sumsq_ranges)(tr_backend_t *be, int dev, int nranges, const size_t *off, const size_t *len,
			    const float *x, double *out);
	/* Gradient clipping decided on the device, as
	 * torch.nn.utils.clip_grad_norm_: coef = max_norm / (sqrt(*sumsq) +
	 * 1e-6), computed in double; when coef < 1, x *= (float)coef (a
	 * sum that is not finite never scales).  sumsq: DEVICE memory, one
	 * double, written by earlier work on dev (sumsq). */
	int (*clip_scale)(tr_backend_t *be, int dev, size_t n, float *x, float max_norm, const double *sumsq);
	/* One optimizer update of n parameters.  state1/state2: momentum buffer
	 * (sgd) or first/second moments (adam); sgd ignores state2. */
	int (*sgd_step)(tr_backend_t *be, int dev, size_t n, float *param, const float *grad, float *state1,
			const struct tr_optim_hp *hp);
	int (*adam_step)(tr_backend_t *be, int dev, size_t n, float *param, const float *grad, float *m, float *v,
			 const struct tr_optim_hp *hp);
	/* Optional (both NULL or both set): the same updates, bit for bit,
	 * reading param and state from one set of buffers and writing the
	 * results to another that does not overlap it; the inputs are left
	 * as they were.  With memory_is_host, this lets a checkpoint take
	 * rank 0's buffers as its snapshot instead of copying them: the next
	 * update writes elsewhere (engine/checkpoint.h, snapshot leases). */
	int (*sgd_step_into)(tr_backend_t *be, int dev, size_t n, const float *param, const float *grad,
			     const float *state1, float *param_out, float *state1_out, const struct tr_optim_hp *hp);
	int (*adam_step_into)(tr_backend_t *be, int dev, size_t n, const float *param, const float *grad,
			      const float *m, const float *v, float *param_out, float *m_out, float *v_out,
			      const struct tr_optim_hp *hp);
	/* Normalisation over NCHW batches: n samples of c channels of hw
	 * positions.  Required (tr_backend_check_ops): every backend has
	 * them.  batchnorm2d's statistics span the whole
	 * step on every device: the bn_* kernels work on this device's n
	 * samples (n may be 0 on a device without rows: zero sums) and the
	 * layer allreduces their sums between the job's devices
	 * (engine/model/norm2d.c).  Sums are taken in double, stored as float.
	 *
	 * bn_sums: out[ch] = sum over samples and positions of x, or of
	 * (x - mean[ch])^2 when mean is not NULL (overwrites out). */
	int (*bn_sums)(tr_backend_t *be, int dev, int n, int c, int hw, const float *x, const float *mean, float *out);
	/* y = (x - mean) / sqrt(var + eps) * gamma + beta, per channel. */
	int (*bn_apply)(tr_backend_t *be, int dev, int n, int c, int hw, float eps, const float *x, const float *mean,
			const float *var, const float *gamma, const float *beta, float *y);
	/* run = (1 - momentum) run + momentum stat, the variance unbiased by
	 * count / (count - 1) (count: values per channel in the step, > 1);
	 * batches[0] += 1. */
	int (*bn_running_update)(tr_backend_t *be, int dev, int c, float momentum, double count, const float *mean,
				 const float *var, float *run_mean, float *run_var, float *batches);
	/* This device's sums[ch] = sum dy and sums[c + ch] = sum dy (x - mean);
	 * dbeta = the first, dgamma = the second / sqrt(var + eps), both
	 * overwritten when not NULL. */
	int (*bn_backward_sums)(tr_backend_t *be, int dev, int n, int c, int hw, float eps, const float *x,
				const float *mean, const float *var, const float *dy, float *sums, float *dgamma,
				float *dbeta);
	/* dx from the step's sums (allreduced) over count values per channel:
	 * dx = (dy - S1/count - (x - mean) S2/count / (var + eps)) gamma / sqrt(var + eps). */
	int (*bn_backward_apply)(tr_backend_t *be, int dev, int n, int c, int hw, float eps, double count,
				 const float *x, const float *mean, const float *var, const float *gamma,
				 const float *sums, const float *dy, float *dx);
	/* GroupNorm per sample over groups of c/groups channels; mean/rstd hold
	 * n x groups entries.  backward overwrites dgamma/dbeta; dx may be
	 * NULL (first layer). */
	int (*groupnorm_forward)(tr_backend_t *be, int dev, int n, int c, int hw, int groups, float eps, const float *x,
				 const float *gamma, const float *beta, float *y, float *mean, float *rstd);
	int (*groupnorm_backward)(tr_backend_t *be, int dev, int n, int c, int hw, int groups, const float *x,
				  const float *gamma, const float *mean, const float *rstd, const float *dy, float *dx,
				  float *dgamma, float *dbeta);

	/* Device memory is host memory: pointers from alloc are plain host
	 * pointers, 64-byte aligned, released with free() (the backend's own
	 * free does exactly that), readable from any thread, and they stay
	 * valid after the backend is destroyed; and every call has finished
	 * with its buffers when it returns.  The CPU backend. */
	bool memory_is_host;
	/* Device memory is the backend's own and limited (a GPU's): before a
	 * job allocates anything the trainer asks this estimate for the bytes
	 * one device needs and refuses a job that cannot fit, naming both
	 * figures.  The estimate includes memory_context_bytes (the runtime's
	 * context, outside alloc), which a device in use already holds, so it
	 * is compared with memory_info's free bytes plus that.  NULL where
	 * devices share host memory (CPU): nothing is checked. */
	size_t (*memory_estimate)(const struct tr_model *m, int max_rows, int label_dim, int opt_state_buffers,
				  int ndev);
	size_t memory_context_bytes;
	/* Optional (NULL: not counted): how many times the host has waited
	 * for a device of this backend so far (every stream or device
	 * synchronisation: `sync` and any hidden one, such as a copy into
	 * pageable memory; not the frees), for the GPU check's host-waits
	 * figure. */
	uint64_t (*host_waits)(tr_backend_t *be);

	/* Collectives over a job's devices.  comm_create is called once by the
	 * job; every rank then calls allreduce_sum from its own thread with its
	 * own buffer.  The sum is taken in rank order, so results are
	 * deterministic for a given device count.  comm_abort wakes every
	 * waiting rank with -ECANCELED. */
	tr_comm_t *(*comm_create)(tr_backend_t *be, int ndev, const int *devs);
	int (*allreduce_sum)(tr_comm_t *comm, int rank, float *buf, size_t n);
	void (*comm_abort)(tr_comm_t *comm);
	void (*comm_destroy)(tr_comm_t *comm);
	/* Optional: the exact sum of exact mode (docs/design.md, "Exact
	 * mode").  Every rank passes its nparts buffers of n floats (0 or
	 * more; rank r's follow rank r-1's in one global order) and out; each
	 * element of every rank's out becomes ((0 + p0) + p1) + ... over all
	 * ranks' parts in that order, in float, so the bits depend on the
	 * parts alone, never on how they are spread over ranks.  ndev may be
	 * 1.  NULL: the engine builds the same sum from allreduce_sum over
	 * disjoint slots and `add` (engine/exact.c). */
	int (*exact_sum)(tr_comm_t *comm, int rank, const float *const *parts, int nparts, float *out, size_t n);
	/* Optional, both or neither: a communicator whose ranks span the
	 * job's processes (docs/design.md, "Processes and the
	 * communicator"): the CUDA module's, through NCCL.  One process fills
	 * id (TR_COMM_GROUP_ID_BYTES) with comm_group_id; every process passes
	 * those bytes to comm_group_create with its ndev devices as ranks
	 * first_rank .. first_rank + ndev - 1 of nranks.  allreduce_sum,
	 * comm_abort and comm_destroy then work on it as on comm_create's
	 * (rank is the process's own index, 0 .. ndev - 1), and the sum is
	 * over every process's ranks. */
	int (*comm_group_id)(tr_backend_t *be, void *id);
	tr_comm_t *(*comm_group_create)(tr_backend_t *be, int ndev, const int *devs, const void *id, int nranks,
					int first_rank);
} tr_backend_i;

/* The bytes of a group communicator's id (NCCL's ncclUniqueId). */
#define TR_COMM_GROUP_ID_BYTES 128

struct tr_backend {
	const tr_backend_i *i;
};

/* How CPU devices compute conv2d (docs/design.md, "Convolution on CPU
 * devices"): im2col + OpenBLAS sgemm, oneDNN's convolution primitives
 * where the build has them, or AUTO: per layer, whichever measured faster
 * at the layer's shape (tr_cpu_conv_route; im2col alone in a build
 * without oneDNN).  A job's spec may name its own (cpu_conv).  Set once, right after creation, before any job runs;
 * -ENOTSUP (with a reason in err) for ONEDNN in a build without it.  A new
 * backend starts with im2col; the daemon and `trainerd run` set AUTO
 * unless told otherwise. */
enum tr_cpu_conv { TR_CPU_CONV_AUTO, TR_CPU_CONV_IM2COL, TR_CPU_CONV_ONEDNN };

/* How CPU devices compute a dense layer's products (docs/design.md,
 * "Dense layers on CPU devices"): OpenBLAS sgemm tiles, oneDNN matmul
 * tiles where the build has them, or AUTO: per layer shape, whichever
 * measured faster (tr_cpu_dense_route).  The values of OPENBLAS and
 * ONEDNN match tr_cpu_conv's IM2COL and ONEDNN (one file keeps both
 * choices). */
enum tr_cpu_gemm { TR_CPU_GEMM_AUTO, TR_CPU_GEMM_OPENBLAS, TR_CPU_GEMM_ONEDNN };

/* How a command asks for its devices (tr_backend_open). */
struct tr_backend_options {
	enum tr_backend_kind kind; /* AUTO: CUDA when a GPU is usable, else CPU */
	/* CUDA: use at most this many GPUs.  CPU: this many devices.  0 = all
	 * GPUs, or one CPU device per online core, at most TR_CPU_MAX_DEVICES. */
	int devices;
	/* When > 0, the CPU device count instead of `devices` (the daemon's
	 * --cpu-devices, which must not limit its GPUs). */
	int cpu_devices;
	int blas_threads;          /* CPU: the total compute thread budget, 0 = all cores */
	bool tf32;                 /* CUDA: every device starts with TF32 gemm allowed */
	const char *cuda_module;   /* trainerd-cuda.so to load; NULL or "" = search (engine/cuda/module.h) */
	enum tr_cpu_conv cpu_conv; /* CPU: how conv2d is computed (default AUTO) */
};

/* The one way trainerd opens a backend, for `serve`, `run`, `eval` and
 * `predict` alike.
 * CUDA is tried for kinds AUTO and CUDA (its module is loaded only when
 * the machine has an NVIDIA driver); AUTO falls back to CPU devices and
 * then writes the reason into fallback ("" when there was no fallback),
 * for the caller's one log line.  The table of what opens is checked with
 * tr_backend_check_ops.  Returns 0 and *out, or a negative errno-style
 * code with the reason in err (CUDA asked for and unusable, a bad count). */
int tr_backend_open(const struct tr_backend_options *opt, tr_backend_t **out, char *fallback, size_t fblen,
		    struct tr_error *err);

/* "auto", "cpu" or "cuda" (the spelling of specs, the daemon's --backend
 * and `trainerd run --backend`) into *out: 0, or -EINVAL. */
int tr_backend_kind_parse(const char *name, enum tr_backend_kind *out);

/* 0 when every required operation of the table is set and each optional
 * pair is set together (to_device_async and copies_fence, sgd_step_into
 * and adam_step_into); otherwise -ENOSYS with the first missing one
 * named in err.  tr_backend_open refuses a backend that fails it (a CUDA
 * module from another build, say). */
int tr_backend_check_ops(const tr_backend_i *t, struct tr_error *err);

/* Creates the CPU backend with `devices` devices (1..TR_CPU_MAX_DEVICES).
 * `blas_threads` is the total compute thread budget (0 = all cores), split
 * over the devices; results do not depend on it (OpenBLAS runs on one
 * thread, the backend splits the work in pieces cut by shape).  NULL on
 * bad input.  Commands use tr_backend_open; tests create it directly. */
tr_backend_t *tr_cpu_backend_create(int devices, int blas_threads);

int tr_cpu_backend_set_conv(tr_backend_t *be, enum tr_cpu_conv route, struct tr_error *err);

/* The route a CPU device takes for the conv2d layer d when its job asks
 * for `want`.  AUTO is measured: both routes' forward and backward at `rows` samples, once
 * per layer shape and process, kept by shape for the whole process and in
 * the per-machine file of tr_cpu_conv_cache_open (engine/cpu/
 * cpu_conv_choice.c), so repeats on one machine decide alike whatever the
 * device count.  Runs on device dev (the caller must own it).  0 and *out
 * (route IM2COL or ONEDNN), or a negative errno with the reason in err
 * (ONEDNN in a build without oneDNN). */
struct tr_conv_choice {
	enum tr_cpu_conv route;
	bool measured;               /* measured by this call, not remembered */
	double im2col_ms, onednn_ms; /* forward + backward, when measured (now or before) */
};
int tr_cpu_conv_route(tr_backend_t *be, int dev, const struct tr_conv2d_desc *d, int rows, enum tr_cpu_conv want,
		      struct tr_conv_choice *out, struct tr_error *err);
/* Two conv2d layers in a row (only elementwise activations between them)
 * whose routes, each chosen alone, differ: one im2col, one oneDNN.  Alone,
 * a layer's measurement leaves out the reorders at the break between
 * them, which both on oneDNN would not need (tr_cpu_conv_chain_ok), so
 * the pair is measured as it would run both ways, and `join` says
 * whether both should take oneDNN.  Like a layer's choice, the decision
 * is kept per process and in the machine's file, keyed by both shapes
 * and routes.  Nothing is measured (join false, chainable false) where
 * the routes agree or oneDNN could not chain the two. */
struct tr_conv_pair_choice {
	bool chainable, join, measured;
	double split_ms, chain_ms; /* both layers' forward + backward, each way */
};
int tr_cpu_conv_pair_route(tr_backend_t *be, int dev, const struct tr_conv2d_desc *a, const struct tr_conv2d_desc *b,
			   int rows, struct tr_conv_pair_choice *out, struct tr_error *err);
/* "im2col", "onednn" or "auto". */
const char *tr_cpu_conv_route_name(enum tr_cpu_conv route);
/* Keeps the measured choices in `path` too (JSON, keyed by CPU model and
 * shape; the daemon's is STATE_DIR/conv_routes.json), loading what it
 * holds for this CPU.  Up to two files: the first opened wins where both
 * hold a shape, and new choices are written to both.  NULL: nothing. */
void tr_cpu_conv_cache_open(const char *path);
/* The route a CPU device takes for a dense layer when its job asks for
 * `want`: AUTO is oneDNN's matmul tiles where the build has oneDNN,
 * OpenBLAS's otherwise (a fixed rule: the routes' bits differ, so the
 * choice must not depend on a measurement).  0 and *out (OPENBLAS or
 * ONEDNN), or -ENOTSUP with the reason in err (ONEDNN without oneDNN). */
struct tr_dense_choice {
	enum tr_cpu_gemm route;
	bool asked; /* the job named it */
};
int tr_cpu_dense_route(tr_backend_t *be, enum tr_cpu_gemm want, struct tr_dense_choice *choice, struct tr_error *err);
/* "openblas", "onednn" or "auto". */
const char *tr_cpu_dense_route_name(enum tr_cpu_gemm route);
/* Forgets every choice (tests). */
void tr_cpu_conv_choices_forget(void);
/* "im2col", "onednn" or "auto". */
const char *tr_cpu_backend_conv_name(const tr_backend_t *be);
/* The setting itself (the route of a job whose spec names none). */
enum tr_cpu_conv tr_cpu_backend_conv(tr_backend_t *be);
/* Whether the activation between conv2d layers a and b (b reads a's
 * output, through elementwise activations only) may stay in oneDNN's
 * blocked layout (tr_conv2d_desc.x_blocked, y_blocked) on this CPU backend
 * at `rows` samples per device: both layers take the ONEDNN route, have no
 * groups, the channels are a multiple of 16, oneDNN prefers that layout on
 * both sides, and the backend's chains are on.  Values are the same bits
 * either way; only reorders are saved (docs/design.md, "Convolution on
 * CPU devices"). */
bool tr_cpu_conv_chain_ok(tr_backend_t *be, const struct tr_conv2d_desc *a, const struct tr_conv2d_desc *b, int rows);
/* The two halves of that: whether layer a's output (y, dy), or layer b's
 * input (x, dx), may lie in nChw16c, whatever is between them (a chain
 * through max pooling, which keeps the channels). */
bool tr_cpu_conv_blocked_out_ok(tr_backend_t *be, const struct tr_conv2d_desc *a, int rows);
bool tr_cpu_conv_blocked_in_ok(tr_backend_t *be, const struct tr_conv2d_desc *b, int rows);
/* Chains are on unless turned off here or by TRAINERD_CPU_CONV_CHAINS=0 in
 * the environment when the backend is created (to compare the two). */
void tr_cpu_backend_set_conv_chains(tr_backend_t *be, bool on);
bool tr_cpu_backend_conv_chains(tr_backend_t *be);

/* Creates the CUDA backend (engine/cuda/cuda.h has the options); NULL
 * with a reason in err when no GPU is usable or the module is missing. */
tr_backend_t *tr_cuda_backend_create(struct tr_error *err);
/* Whether a GPU is usable: false without loading anything on a machine
 * with no NVIDIA driver. */
bool tr_cuda_available(void);

static inline void tr_backend_destroy(tr_backend_t *be)
{
	if (be)
		be->i->destroy(be);
}

#endif
