/* CUDA kernels, image family: 2-D convolution as im2col + cuBLAS, and max
 * and average pooling (engine/cuda/kernels_common.cuh).
 *
 * The convolution follows the CPU backend's algorithm step for step
 * (engine/cpu/cpu_conv.c): the same chunks of samples (tr_conv2d_chunk),
 * the same im2col matrix [c*kh*kw, chunk*ho*wo] and GEMM-result layout in
 * the caller's workspace, the same GEMMs (through the table's gemm, so on
 * this device's stream and cuBLAS handle), dW accumulated over chunks in
 * sample order.  So the results differ from the CPU only by the GEMMs'
 * summation order, as dense layers do.
 *
 * Nothing here uses atomics: every backward pass that the CPU writes as a
 * scatter (col2im, the pooling gradients) is a gather here, one thread per
 * input element, which visits the contributions in the order the CPU adds
 * them ((i, j) kernel offsets for col2im, windows in row-major order for
 * pooling) starting from zero, so those sums are the CPU's bit for bit and
 * repeat run to run.  The bias gradient is a fixed-shape tree in double,
 * deterministic but summed in another order than the CPU's loop.
 */
#include "engine/cuda/kernels_common.cuh"

/* ==== kernels ============================================================ */

/* col[(ci*kh + i)*kw + j][b*P + oh*wo + ow] = x[b][ci][oh*sh - ph + i*dh][ow*sw - pw + j*dw], 0 outside. */
__global__ void k_im2col(struct tr_conv2d_desc d, int nb, const float *x, float *col)
{
	size_t P = (size_t)d.ho * d.wo, BP = (size_t)nb * P, hw = (size_t)d.h * d.w;
	size_t total = (size_t)d.c * d.kh * d.kw * BP;

	GRID_STRIDE(idx, total)
	{
		size_t r = idx / BP, q = idx % BP;
		size_t b = q / P, p = q % P;
		int oh = (int)(p / (size_t)d.wo), ow = (int)(p % (size_t)d.wo);
		int j = (int)(r % (size_t)d.kw), i = (int)(r / (size_t)d.kw % (size_t)d.kh);
		size_t ci = r / ((size_t)d.kw * d.kh);
		int ih = oh * d.sh - d.ph + i * d.dh, iw = ow * d.sw - d.pw + j * d.dw;
		col[idx] = ih >= 0 && ih < d.h && iw >= 0 && iw < d.w ? x[(b * d.c + ci) * hw + (size_t)ih * d.w + iw]
								      : 0.0f;
	}
}

/* The adjoint of im2col, gathered: dx[b][ci][ih][iw] = the sum of every col
 * entry read from it, over kernel offsets (i, j) in order (the CPU's
 * col2im adds them in that order into a cleared dx).  Every element of the
 * chunk is written, zero where nothing reads it. */
__global__ void k_col2im(struct tr_conv2d_desc d, int nb, const float *col, float *dx)
{
	size_t P = (size_t)d.ho * d.wo, BP = (size_t)nb * P, hw = (size_t)d.h * d.w;
	size_t total = (size_t)nb * d.c * hw;

	GRID_STRIDE(idx, total)
	{
		size_t b = idx / ((size_t)d.c * hw), rem = idx % ((size_t)d.c * hw);
		size_t ci = rem / hw, pix = rem % hw;
		int ih = (int)(pix / (size_t)d.w), iw = (int)(pix % (size_t)d.w);
		float s = 0.0f;
		for (int i = 0; i < d.kh; i++) {
			int th = ih + d.ph - i * d.dh;
			if (th < 0 || th % d.sh)
				continue;
			int oh = th / d.sh;
			if (oh >= d.ho)
				continue;
			for (int j = 0; j < d.kw; j++) {
				int tw = iw + d.pw - j * d.dw;
				if (tw < 0 || tw % d.sw)
					continue;
				int ow = tw / d.sw;
				if (ow >= d.wo)
					continue;
				size_t r = (ci * d.kh + (size_t)i) * d.kw + (size_t)j;
				s += col[r * BP + b * P + (size_t)oh * d.wo + ow];
			}
		}
		dx[idx] = s;
	}
}

/* y[n0 + b][f][p] = tmp[f][b*P + p] (+ bias[f]): the GEMM's [f, chunk*P]
 * result back to NCHW. */
__global__ void k_conv_scatter(size_t P, int f, int nb, const float *tmp, const float *bias, float *y)
{
	size_t BP = (size_t)nb * P, total = (size_t)f * BP;

	GRID_STRIDE(idx, total)
	{
		size_t b = idx / ((size_t)f * P), rem = idx % ((size_t)f * P);
		size_t fi = rem / P, p = rem % P;
		float v = tmp[fi * BP + b * P + p];
		y[idx] = bias ? v + bias[fi] : v;
	}
}

/* tmp[f][b*P + p] = dy[n0 + b][f][p]: dy in the GEMM's column order. */
__global__ void k_conv_gather_dy(size_t P, int f, int nb, const float *dy, float *tmp)
{
	size_t BP = (size_t)nb * P, total = (size_t)f * BP;

	GRID_STRIDE(idx, total)
	{
		size_t b = idx / ((size_t)f * P), rem = idx % ((size_t)f * P);
		size_t fi = rem / P, p = rem % P;
		tmp[fi * BP + b * P + p] = dy[idx];
	}
}

/* dbias[f] = sum over rows and pixels of dy[n][f][.], in double: one block
 * per filter, each thread a fixed stride of the (n, p) pairs, then the
 * block's tree. */
__global__ void k_conv_dbias(int rows, int f, size_t P, const float *dy, float *dbias)
{
	size_t total = (size_t)rows * P;
	double s = 0.0, unused = 0.0;

	for (size_t k = threadIdx.x; k < total; k += blockDim.x) {
		size_t n = k / P, p = k % P;
		s += dy[(n * (size_t)f + blockIdx.x) * P + p];
	}
	block_sum2(&s, &unused);
	if (threadIdx.x == 0)
		dbias[blockIdx.x] = (float)s;
}

/* Window (oh, ow)'s maximum in one channel plane: the first in row-major
 * order, a NaN winning (and a later NaN over an earlier one), exactly as
 * the CPU's window_argmax.  Returns the index in the plane, -1 for an
 * empty window. */
__device__ __forceinline__ long long window_argmax(const struct tr_pool2d_desc &d, const float *xc, int oh, int ow,
						   float *val)
{
	int h0 = oh * d.sh - d.ph, w0 = ow * d.sw - d.pw;
	long long best = -1;
	float m = -INFINITY;
	for (int i = h0 < 0 ? 0 : h0; i < h0 + d.kh && i < d.h; i++) {
		for (int j = w0 < 0 ? 0 : w0; j < w0 + d.kw && j < d.w; j++) {
			float v = xc[(size_t)i * d.w + j];
			if (best < 0 || v > m || isnan(v)) {
				m = v;
				best = (long long)i * d.w + j;
			}
		}
	}
	*val = m;
	return best;
}

/* The windows (oh, ow) that contain input row ih: [lo, hi], empty when lo > hi. */
__device__ __forceinline__ void windows_over(int ih, int k, int s, int p, int n_out, int *lo, int *hi)
{
	int first = ih + p - k + 1; /* h0 + k > ih  <=>  oh * s > ih + p - k */
	*lo = first <= 0 ? 0 : (first + s - 1) / s;
	int last = (ih + p) / s; /* h0 <= ih */
	*hi = last < n_out - 1 ? last : n_out - 1;
}

__global__ void k_maxpool_forward(struct tr_pool2d_desc d, size_t planes, const float *x, float *y)
{
	size_t P = (size_t)d.ho * d.wo, hw = (size_t)d.h * d.w;

	GRID_STRIDE(idx, planes * P)
	{
		size_t pl = idx / P, p = idx % P;
		float v;
		window_argmax(d, x + pl * hw, (int)(p / (size_t)d.wo), (int)(p % (size_t)d.wo), &v);
		y[idx] = v;
	}
}

/* dx[k] = the sum of dy over the windows whose maximum is k, in row-major
 * window order (the CPU adds them in that order into a cleared dx). */
__global__ void k_maxpool_backward(struct tr_pool2d_desc d, size_t planes, const float *x, const float *dy, float *dx)
{
	size_t P = (size_t)d.ho * d.wo, hw = (size_t)d.h * d.w;

	GRID_STRIDE(idx, planes * hw)
	{
		size_t pl = idx / hw, pix = idx % hw;
		int ih = (int)(pix / (size_t)d.w), iw = (int)(pix % (size_t)d.w);
		int oh0, oh1, ow0, ow1;
		windows_over(ih, d.kh, d.sh, d.ph, d.ho, &oh0, &oh1);
		windows_over(iw, d.kw, d.sw, d.pw, d.wo, &ow0, &ow1);
		const float *xc = x + pl * hw;
		float s = 0.0f, v;
		for (int oh = oh0; oh <= oh1; oh++)
			for (int ow = ow0; ow <= ow1; ow++)
				if (window_argmax(d, xc, oh, ow, &v) == (long long)pix)
					s += dy[pl * P + (size_t)oh * d.wo + ow];
		dx[idx] = s;
	}
}

/* Sum over the window's pixels inside the image, row-major, divided by
 * kh * kw (padding counts in the divisor): the CPU's loop. */
__global__ void k_avgpool_forward(struct tr_pool2d_desc d, size_t planes, const float *x, float *y)
{
	size_t P = (size_t)d.ho * d.wo, hw = (size_t)d.h * d.w;
	float div = (float)(d.kh * d.kw);

	GRID_STRIDE(idx, planes * P)
	{
		size_t pl = idx / P, p = idx % P;
		int oh = (int)(p / (size_t)d.wo), ow = (int)(p % (size_t)d.wo);
		int h0 = oh * d.sh - d.ph, w0 = ow * d.sw - d.pw;
		const float *xc = x + pl * hw;
		float s = 0.0f;
		for (int i = h0 < 0 ? 0 : h0; i < h0 + d.kh && i < d.h; i++)
			for (int j = w0 < 0 ? 0 : w0; j < w0 + d.kw && j < d.w; j++)
				s += xc[(size_t)i * d.w + j];
		y[idx] = s / div;
	}
}

/* dx[k] = the sum of dy / (kh * kw) over the windows containing k, in
 * row-major window order. */
__global__ void k_avgpool_backward(struct tr_pool2d_desc d, size_t planes, const float *dy, float *dx)
{
	size_t P = (size_t)d.ho * d.wo, hw = (size_t)d.h * d.w;
	float div = (float)(d.kh * d.kw);

	GRID_STRIDE(idx, planes * hw)
	{
		size_t pl = idx / hw, pix = idx % hw;
		int ih = (int)(pix / (size_t)d.w), iw = (int)(pix % (size_t)d.w);
		int oh0, oh1, ow0, ow1;
		windows_over(ih, d.kh, d.sh, d.ph, d.ho, &oh0, &oh1);
		windows_over(iw, d.kw, d.sw, d.pw, d.wo, &ow0, &ow1);
		float s = 0.0f;
		for (int oh = oh0; oh <= oh1; oh++)
			for (int ow = ow0; ow <= ow1; ow++)
				s += dy[pl * P + (size_t)oh * d.wo + ow] / div;
		dx[idx] = s;
	}
}

/* ==== host launchers ===================================================== */

static int launch_im2col(tr_backend_t *be, cudaStream_t s, const struct tr_conv2d_desc *d, int nb, const float *x,
			 float *col)
{
	size_t n = (size_t)d->c * d->kh * d->kw * nb * d->ho * d->wo;
	assert(nb > 0 && x && col && n > 0);
	k_im2col<<<grid_for(n), BLOCK, 0, s>>>(*d, nb, x, col);
	LAUNCH_CHECK(be, "k_im2col");
	return 0;
}

static int launch_col2im(tr_backend_t *be, cudaStream_t s, const struct tr_conv2d_desc *d, int nb, const float *col,
			 float *dx)
{
	size_t n = (size_t)nb * d->c * d->h * d->w;
	assert(nb > 0 && col && dx && n > 0);
	k_col2im<<<grid_for(n), BLOCK, 0, s>>>(*d, nb, col, dx);
	LAUNCH_CHECK(be, "k_col2im");
	return 0;
}

static int launch_scatter(tr_backend_t *be, cudaStream_t s, size_t P, int f, int nb, const float *tmp,
			  const float *bias, float *y)
{
	size_t n = (size_t)f * nb * P;
	assert(n > 0 && tmp && y);
	k_conv_scatter<<<grid_for(n), BLOCK, 0, s>>>(P, f, nb, tmp, bias, y);
	LAUNCH_CHECK(be, "k_conv_scatter");
	return 0;
}

static int launch_gather_dy(tr_backend_t *be, cudaStream_t s, size_t P, int f, int nb, const float *dy, float *tmp)
{
	size_t n = (size_t)f * nb * P;
	assert(n > 0 && dy && tmp);
	k_conv_gather_dy<<<grid_for(n), BLOCK, 0, s>>>(P, f, nb, dy, tmp);
	LAUNCH_CHECK(be, "k_conv_gather_dy");
	return 0;
}

static int launch_dbias(tr_backend_t *be, cudaStream_t s, int rows, int f, size_t P, const float *dy, float *dbias)
{
	assert(rows >= 0 && f > 0 && P > 0 && dbias && (rows == 0 || dy));
	k_conv_dbias<<<(unsigned)f, BLOCK, 0, s>>>(rows, f, P, dy, dbias);
	LAUNCH_CHECK(be, "k_conv_dbias");
	return 0;
}

static int launch_pool(tr_backend_t *be, cudaStream_t s, bool max, bool forward, const struct tr_pool2d_desc *d,
		       size_t planes, const float *x, const float *dy, float *out)
{
	size_t n = planes * (forward ? (size_t)d->ho * d->wo : (size_t)d->h * d->w);
	assert(n > 0 && out);
	if (max && forward) {
		k_maxpool_forward<<<grid_for(n), BLOCK, 0, s>>>(*d, planes, x, out);
		LAUNCH_CHECK(be, "k_maxpool_forward");
	} else if (max) {
		k_maxpool_backward<<<grid_for(n), BLOCK, 0, s>>>(*d, planes, x, dy, out);
		LAUNCH_CHECK(be, "k_maxpool_backward");
	} else if (forward) {
		k_avgpool_forward<<<grid_for(n), BLOCK, 0, s>>>(*d, planes, x, out);
		LAUNCH_CHECK(be, "k_avgpool_forward");
	} else {
		k_avgpool_backward<<<grid_for(n), BLOCK, 0, s>>>(*d, planes, dy, out);
		LAUNCH_CHECK(be, "k_avgpool_backward");
	}
	return 0;
}

/* ==== backend functions ================================================== */

static bool conv_ok(const struct tr_conv2d_desc *d)
{
	return d && d->c > 0 && d->h > 0 && d->w > 0 && d->f > 0 && d->ho > 0 && d->wo > 0 && d->kh > 0 && d->kw > 0 &&
	       d->sh > 0 && d->sw > 0 && d->ph >= 0 && d->pw >= 0 && d->dh > 0 && d->dw > 0 && d->groups > 0 &&
	       d->c % d->groups == 0 && d->f % d->groups == 0;
}

/* The sizes both convolution passes walk by, as the CPU's (cpu_conv.c):
 * samples in chunks of tr_conv2d_chunk, G groups of fg filters, P output
 * pixels, the im2col matrix's ckk rows (cgkk per group), one sample's
 * input and output sizes. */
struct conv_shape {
	int chunk, G, fg;
	size_t P, ckk, cgkk, in_sz, out_sz;
};

static struct conv_shape conv_shape_of(const struct tr_conv2d_desc *d, int rows)
{
	struct conv_shape sh;
	sh.chunk = tr_conv2d_chunk(d, rows);
	sh.G = d->groups;
	sh.fg = d->f / sh.G;
	sh.P = (size_t)d->ho * d->wo;
	sh.ckk = (size_t)d->c * d->kh * d->kw;
	sh.cgkk = sh.ckk / (size_t)sh.G;
	sh.in_sz = (size_t)d->c * d->h * d->w;
	sh.out_sz = (size_t)d->f * sh.P;
	return sh;
}

/* The chunk of samples starting at n0: nb samples, BP GEMM columns, and
 * where its im2col matrix (col) and GEMM result (tmp) lie in the
 * workspace. */
struct conv_chunk {
	int nb;
	size_t BP;
	float *col, *tmp;
};

static struct conv_chunk conv_chunk_at(const struct conv_shape *sh, int rows, int n0, float *work)
{
	struct conv_chunk k;
	k.nb = rows - n0 < sh->chunk ? rows - n0 : sh->chunk;
	k.BP = (size_t)k.nb * sh->P;
	k.col = work;
	k.tmp = work + sh->ckk * k.BP;
	return k;
}

static int cuda_conv2d_forward(tr_backend_t *be, int dev, const struct tr_conv2d_desc *d, int rows, const float *x,
			       const float *w, const float *bias, float *y, float *work)
{
	ENSURE_DEV("conv2d_forward");
	ENSURE(conv_ok(d) && rows >= 0, "conv2d_forward: bad shape");
	ENSURE(rows == 0 || (x && w && y && work), "conv2d_forward: NULL buffer");
	cudaStream_t s = stream_of(be, dev);
	const struct conv_shape sh = conv_shape_of(d, rows);
	for (int n0 = 0; n0 < rows; n0 += sh.chunk) {
		const struct conv_chunk k = conv_chunk_at(&sh, rows, n0, work);
		int rc = launch_im2col(be, s, d, k.nb, x + (size_t)n0 * sh.in_sz, k.col);
		for (int g = 0; g < sh.G && rc == 0; g++)
			rc = be->i->gemm(be, dev, false, false, sh.fg, (int)k.BP, (int)sh.cgkk, 1.0f,
					 w + (size_t)g * sh.fg * sh.cgkk, k.col + (size_t)g * sh.cgkk * k.BP, 0.0f,
					 k.tmp + (size_t)g * sh.fg * k.BP);
		if (rc == 0)
			rc = launch_scatter(be, s, sh.P, d->f, k.nb, k.tmp, bias, y + (size_t)n0 * sh.out_sz);
		if (rc)
			return rc;
	}
	return 0;
}

static int cuda_conv2d_backward(tr_backend_t *be, int dev, const struct tr_conv2d_desc *d, int rows, const float *x,
				const float *w, const float *dy, float *dx, float *dw, float *dbias, float *work)
{
	ENSURE_DEV("conv2d_backward");
	ENSURE(conv_ok(d) && rows >= 0, "conv2d_backward: bad shape");
	ENSURE(dw && (rows == 0 || (x && w && dy && work)), "conv2d_backward: NULL buffer");
	cudaStream_t s = stream_of(be, dev);
	const struct conv_shape sh = conv_shape_of(d, rows);
	int rc = 0;
	if (rows == 0)
		CUDA_CHECK(be, cudaMemsetAsync(dw, 0, (size_t)d->f * sh.cgkk * sizeof(float), s));
	if (dbias && (rc = launch_dbias(be, s, rows, d->f, sh.P, dy, dbias)))
		return rc;
	for (int n0 = 0; n0 < rows; n0 += sh.chunk) {
		const struct conv_chunk k = conv_chunk_at(&sh, rows, n0, work);
		rc = launch_gather_dy(be, s, sh.P, d->f, k.nb, dy + (size_t)n0 * sh.out_sz, k.tmp);
		if (rc == 0)
			rc = launch_im2col(be, s, d, k.nb, x + (size_t)n0 * sh.in_sz, k.col);
		for (int g = 0; g < sh.G && rc == 0; g++)
			rc = be->i->gemm(be, dev, false, true, sh.fg, (int)sh.cgkk, (int)k.BP, 1.0f,
					 k.tmp + (size_t)g * sh.fg * k.BP, k.col + (size_t)g * sh.cgkk * k.BP,
					 n0 == 0 ? 0.0f : 1.0f, dw + (size_t)g * sh.fg * sh.cgkk);
		if (rc || !dx) {
			if (rc)
				return rc;
			continue;
		}
		for (int g = 0; g < sh.G && rc == 0; g++)
			rc = be->i->gemm(be, dev, true, false, (int)sh.cgkk, (int)k.BP, sh.fg, 1.0f,
					 w + (size_t)g * sh.fg * sh.cgkk, k.tmp + (size_t)g * sh.fg * k.BP, 0.0f,
					 k.col + (size_t)g * sh.cgkk * k.BP);
		if (rc == 0)
			rc = launch_col2im(be, s, d, k.nb, k.col, dx + (size_t)n0 * sh.in_sz);
		if (rc)
			return rc;
	}
	return 0;
}

static bool pool_ok(const struct tr_pool2d_desc *d)
{
	return d && d->c > 0 && d->h > 0 && d->w > 0 && d->ho > 0 && d->wo > 0 && d->kh > 0 && d->kw > 0 && d->sh > 0 &&
	       d->sw > 0 && d->ph >= 0 && d->pw >= 0 && 2 * d->ph <= d->kh && 2 * d->pw <= d->kw;
}

/* The four pooling passes, over rows * c planes: x is read by all but
 * the average's backward pass, dy by the backward passes. */
static int pool_pass(tr_backend_t *be, int dev, const char *op, bool max, bool forward, const struct tr_pool2d_desc *d,
		     int rows, const float *x, const float *dy, float *out)
{
	ENSURE_DEV(op);
	ENSURE(pool_ok(d) && rows >= 0, "%s: bad shape", op);
	if (rows == 0)
		return 0;
	ENSURE((x || (!max && !forward)) && (dy || forward) && out, "%s: NULL buffer", op);
	return launch_pool(be, stream_of(be, dev), max, forward, d, (size_t)rows * d->c, x, dy, out);
}

static int cuda_maxpool2d_forward(tr_backend_t *be, int dev, const struct tr_pool2d_desc *d, int rows, const float *x,
				  float *y)
{
	return pool_pass(be, dev, "maxpool2d_forward", true, true, d, rows, x, NULL, y);
}

static int cuda_maxpool2d_backward(tr_backend_t *be, int dev, const struct tr_pool2d_desc *d, int rows, const float *x,
				   const float *dy, float *dx)
{
	return pool_pass(be, dev, "maxpool2d_backward", true, false, d, rows, x, dy, dx);
}

static int cuda_avgpool2d_forward(tr_backend_t *be, int dev, const struct tr_pool2d_desc *d, int rows, const float *x,
				  float *y)
{
	return pool_pass(be, dev, "avgpool2d_forward", false, true, d, rows, x, NULL, y);
}

static int cuda_avgpool2d_backward(tr_backend_t *be, int dev, const struct tr_pool2d_desc *d, int rows, const float *dy,
				   float *dx)
{
	return pool_pass(be, dev, "avgpool2d_backward", false, false, d, rows, NULL, dy, dx);
}

void tr_cuda_conv_fill(tr_backend_i *t)
{
	t->conv2d_forward = cuda_conv2d_forward;
	t->conv2d_backward = cuda_conv2d_backward;
	t->maxpool2d_forward = cuda_maxpool2d_forward;
	t->maxpool2d_backward = cuda_maxpool2d_backward;
	t->avgpool2d_forward = cuda_avgpool2d_forward;
	t->avgpool2d_backward = cuda_avgpool2d_backward;
}
