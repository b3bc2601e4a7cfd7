/* CPU kernels for image layers: 2-D convolution, pooling, the residual sum.
 *
 * Convolution is im2col + sgemm (docs/design.md, "Convolution and pooling
 * on the CPU"): a chunk of samples (tr_conv2d_chunk) is cut into slices of
 * a few samples, each unfolded into one [c*kh*kw, slice*ho*wo] matrix so
 * that each group's product is one wide GEMM even for small images, and
 * the result is scattered back to NCHW.  The backward pass gathers dy into
 * the same column order, takes each slice's dW = dY col^T and adds the
 * slices' partials in slice order, and dcol = W^T dY, folded back with
 * col2im.  The device's threads take the slices; every GEMM is one
 * single-threaded sgemm call and every cut follows from the shapes, so the
 * results are the same bits for any thread count.  Pooling is plain loops.
 */
#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "engine/cpu/cpu_internal.h"

static int cpu_add(tr_backend_t *be, int dev, size_t n, const float *a, const float *b, float *out)
{
	ENSURE_DEV("add");
	for (size_t i = 0; i < n; i++)
		out[i] = a[i] + b[i];
	return 0;
}

static bool conv_ok(const struct tr_conv2d_desc *d)
{
	return d && d->c > 0 && d->h > 0 && d->w > 0 && d->f > 0 && d->ho > 0 && d->wo > 0 && d->kh > 0 && d->kw > 0 &&
	       d->sh > 0 && d->sw > 0 && d->ph >= 0 && d->pw >= 0 && d->dh > 0 && d->dw > 0 && d->groups > 0 &&
	       d->c % d->groups == 0 && d->f % d->groups == 0;
}

/* col[(ci*kh + i)*kw + j][b*P + oh*wo + ow] = x[b][ci][oh*sh - ph + i*dh][ow*sw - pw + j*dw], 0 outside. */
static void im2col(const struct tr_conv2d_desc *d, int nb, const float *x, float *col)
{
	size_t P = (size_t)d->ho * d->wo, BP = (size_t)nb * P, hw = (size_t)d->h * d->w;
	for (int ci = 0; ci < d->c; ci++) {
		for (int i = 0; i < d->kh; i++) {
			for (int j = 0; j < d->kw; j++) {
				float *row = col + ((size_t)(ci * d->kh + i) * d->kw + j) * BP;
				for (int b = 0; b < nb; b++) {
					const float *xc = x + ((size_t)b * d->c + ci) * hw;
					float *rb = row + (size_t)b * P;
					for (int oh = 0; oh < d->ho; oh++) {
						int ih = oh * d->sh - d->ph + i * d->dh;
						float *ro = rb + (size_t)oh * d->wo;
						if (ih < 0 || ih >= d->h) {
							memset(ro, 0, (size_t)d->wo * sizeof(float));
							continue;
						}
						const float *xr = xc + (size_t)ih * d->w;
						for (int ow = 0; ow < d->wo; ow++) {
							int iw = ow * d->sw - d->pw + j * d->dw;
							ro[ow] = iw >= 0 && iw < d->w ? xr[iw] : 0.0f;
						}
					}
				}
			}
		}
	}
}

/* The adjoint of im2col: dx[b][ci][ih][iw] += every col entry read from it.
 * dx must be cleared first; entries are added in (ci, i, j, b, oh, ow)
 * order, a fixed order. */
static void col2im(const struct tr_conv2d_desc *d, int nb, const float *col, float *dx)
{
	size_t P = (size_t)d->ho * d->wo, BP = (size_t)nb * P, hw = (size_t)d->h * d->w;
	for (int ci = 0; ci < d->c; ci++) {
		for (int i = 0; i < d->kh; i++) {
			for (int j = 0; j < d->kw; j++) {
				const float *row = col + ((size_t)(ci * d->kh + i) * d->kw + j) * BP;
				for (int b = 0; b < nb; b++) {
					float *xc = dx + ((size_t)b * d->c + ci) * hw;
					const float *rb = row + (size_t)b * P;
					for (int oh = 0; oh < d->ho; oh++) {
						int ih = oh * d->sh - d->ph + i * d->dh;
						if (ih < 0 || ih >= d->h)
							continue;
						const float *ro = rb + (size_t)oh * d->wo;
						float *xr = xc + (size_t)ih * d->w;
						for (int ow = 0; ow < d->wo; ow++) {
							int iw = ow * d->sw - d->pw + j * d->dw;
							if (iw >= 0 && iw < d->w)
								xr[iw] += ro[ow];
						}
					}
				}
			}
		}
	}
}

/* Each chunk is cut into slices of samples, as many as make about
 * SLICE_COLS GEMM columns (at least one sample), and the device's threads
 * take the slices (cpu_pool.c).  A slice has its own stretch of the
 * workspace: its im2col matrix [c*kh*kw, slice*ho*wo] at col + c*kh*kw *
 * s0*ho*wo and its GEMM result [f, slice*ho*wo] at tmp + f * s0*ho*wo, so
 * slices never share a byte.  Its GEMMs are single-threaded sgemm calls,
 * and its weight and bias gradients are partial sums of its own that are
 * added in slice order afterwards, so the results follow from the shapes
 * alone, whatever the thread count (docs/design.md, "Convolution and
 * pooling on the CPU"). */
#define SLICE_COLS 2048

static int slice_samples(const struct tr_conv2d_desc *d)
{
	size_t P = (size_t)d->ho * d->wo;
	return P >= SLICE_COLS ? 1 : (int)((SLICE_COLS + P - 1) / P);
}

struct conv_job {
	const struct tr_conv2d_desc *d;
	int n0, nb, sb; /* chunk's first sample, its samples, samples per slice */
	const float *x, *w, *bias, *dy;
	float *y, *dx, *work;
	float *dw_part;  /* per slice: f * c/groups * kh * kw */
	double *db_part; /* per slice: f */
};

/* Slice t of the chunk: its first sample (within the chunk) and count. */
static int slice_of(const struct conv_job *j, int t, int *s0)
{
	*s0 = t * j->sb;
	return j->nb - *s0 < j->sb ? j->nb - *s0 : j->sb;
}

static int forward_slice(void *arg, int t, int slot)
{
	const struct conv_job *j = arg;
	const struct tr_conv2d_desc *d = j->d;
	int s0, bs = slice_of(j, t, &s0), G = d->groups, fg = d->f / G;
	size_t P = (size_t)d->ho * d->wo, ckk = (size_t)d->c * d->kh * d->kw, cgkk = ckk / (size_t)G;
	size_t in_sz = (size_t)d->c * d->h * d->w, out_sz = (size_t)d->f * P, BP = (size_t)bs * P;
	float *col = j->work + ckk * (size_t)s0 * P, *tmp = j->work + ckk * (size_t)j->nb * P + (size_t)d->f * s0 * P;

	(void)slot;
	im2col(d, bs, j->x + (size_t)(j->n0 + s0) * in_sz, col);
	for (int g = 0; g < G; g++)
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, fg, (int)BP, (int)cgkk, 1.0f,
			    j->w + (size_t)g * fg * cgkk, (int)cgkk, col + (size_t)g * cgkk * BP, (int)BP, 0.0f,
			    tmp + (size_t)g * fg * BP, (int)BP);
	for (int b = 0; b < bs; b++) {
		float *yb = j->y + (size_t)(j->n0 + s0 + b) * out_sz;
		for (int f = 0; f < d->f; f++) {
			const float *src = tmp + (size_t)f * BP + (size_t)b * P;
			float *dst = yb + (size_t)f * P;
			float bv = j->bias ? j->bias[f] : 0.0f;
			if (j->bias)
				for (size_t p = 0; p < P; p++)
					dst[p] = src[p] + bv;
			else
				memcpy(dst, src, P * sizeof(float));
		}
	}
	return 0;
}

int tr_cpu_im2col_conv2d_forward(tr_backend_t *be, int dev, const struct tr_conv2d_desc *d, int rows, const float *x,
				 const float *w, const float *bias, float *y, float *work)
{
	ENSURE_DEV("conv2d_forward");
	ENSURE(conv_ok(d) && rows >= 0, "conv2d_forward: bad shape");
	ENSURE(rows == 0 || (x && w && y && work), "conv2d_forward: NULL buffer");
	int chunk = tr_conv2d_chunk(d, rows);
	struct conv_job j = {.d = d, .sb = slice_samples(d), .x = x, .w = w, .bias = bias, .y = y, .work = work};
	for (j.n0 = 0; j.n0 < rows; j.n0 += chunk) {
		j.nb = rows - j.n0 < chunk ? rows - j.n0 : chunk;
		int rc = tr_cpu_parallel(be, dev, (j.nb + j.sb - 1) / j.sb, forward_slice, &j);
		if (rc < 0)
			return rc;
	}
	return 0;
}

static int backward_slice(void *arg, int t, int slot)
{
	const struct conv_job *j = arg;
	const struct tr_conv2d_desc *d = j->d;
	int s0, bs = slice_of(j, t, &s0), G = d->groups, fg = d->f / G;
	size_t P = (size_t)d->ho * d->wo, ckk = (size_t)d->c * d->kh * d->kw, cgkk = ckk / (size_t)G;
	size_t in_sz = (size_t)d->c * d->h * d->w, out_sz = (size_t)d->f * P, BP = (size_t)bs * P;
	float *col = j->work + ckk * (size_t)s0 * P, *tmp = j->work + ckk * (size_t)j->nb * P + (size_t)d->f * s0 * P;
	float *dw = j->dw_part + (size_t)t * d->f * cgkk;

	(void)slot;
	for (int b = 0; b < bs; b++) {
		const float *yb = j->dy + (size_t)(j->n0 + s0 + b) * out_sz;
		for (int f = 0; f < d->f; f++)
			memcpy(tmp + (size_t)f * BP + (size_t)b * P, yb + (size_t)f * P, P * sizeof(float));
	}
	if (j->db_part) {
		/* in double, samples in order within the slice */
		for (int f = 0; f < d->f; f++) {
			double s = 0;
			for (int b = 0; b < bs; b++) {
				const float *p = j->dy + (size_t)(j->n0 + s0 + b) * out_sz + (size_t)f * P;
				for (size_t k = 0; k < P; k++)
					s += p[k];
			}
			j->db_part[(size_t)t * d->f + f] = s;
		}
	}
	im2col(d, bs, j->x + (size_t)(j->n0 + s0) * in_sz, col);
	memset(dw, 0, (size_t)d->f * cgkk * sizeof(float));
	for (int g = 0; g < G; g++)
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, fg, (int)cgkk, (int)BP, 1.0f,
			    tmp + (size_t)g * fg * BP, (int)BP, col + (size_t)g * cgkk * BP, (int)BP, 1.0f,
			    dw + (size_t)g * fg * cgkk, (int)cgkk);
	if (!j->dx)
		return 0;
	memset(col, 0, ckk * BP * sizeof(float));
	for (int g = 0; g < G; g++)
		cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)cgkk, (int)BP, fg, 1.0f,
			    j->w + (size_t)g * fg * cgkk, (int)cgkk, tmp + (size_t)g * fg * BP, (int)BP, 1.0f,
			    col + (size_t)g * cgkk * BP, (int)BP);
	float *dxs = j->dx + (size_t)(j->n0 + s0) * in_sz;
	memset(dxs, 0, (size_t)bs * in_sz * sizeof(float));
	col2im(d, bs, col, dxs);
	return 0;
}

int tr_cpu_im2col_conv2d_backward(tr_backend_t *be, int dev, const struct tr_conv2d_desc *d, int rows, const float *x,
				  const float *w, const float *dy, float *dx, float *dw, float *dbias, float *work)
{
	ENSURE_DEV("conv2d_backward");
	ENSURE(conv_ok(d) && rows >= 0, "conv2d_backward: bad shape");
	ENSURE(rows == 0 || (x && w && dy && dw && work), "conv2d_backward: NULL buffer");
	int chunk = tr_conv2d_chunk(d, rows), sb = slice_samples(d), slices = (chunk + sb - 1) / sb;
	size_t nw = (size_t)d->f * (d->c / d->groups) * d->kh * d->kw;
	/* scratch: the slices' dW partials, their bias partials and the bias
	 * sums over chunks */
	size_t wbytes = ((size_t)slices * nw * sizeof(float) + 7) / 8 * 8;
	char *scr = tr_cpu_scratch(be, dev, wbytes + ((size_t)slices + 1) * d->f * sizeof(double));
	if (!scr)
		return -ENOMEM;
	struct conv_job j = {.d = d,
			     .sb = sb,
			     .x = x,
			     .w = w,
			     .dy = dy,
			     .dx = dx,
			     .work = work,
			     .dw_part = (float *)scr,
			     .db_part = dbias ? (double *)(scr + wbytes) : NULL};
	double *db_sum = (double *)(scr + wbytes) + (size_t)slices * d->f;

	memset(dw, 0, nw * sizeof(float));
	memset(db_sum, 0, (size_t)d->f * sizeof(double));
	for (j.n0 = 0; j.n0 < rows; j.n0 += chunk) {
		j.nb = rows - j.n0 < chunk ? rows - j.n0 : chunk;
		int ns = (j.nb + sb - 1) / sb;
		int rc = tr_cpu_parallel(be, dev, ns, backward_slice, &j);
		if (rc < 0)
			return rc;
		/* partial sums in slice order, chunk after chunk */
		for (int t = 0; t < ns; t++) {
			const float *p = j.dw_part + (size_t)t * nw;
			for (size_t e = 0; e < nw; e++)
				dw[e] += p[e];
			if (dbias)
				for (int f = 0; f < d->f; f++)
					db_sum[f] += j.db_part[(size_t)t * d->f + f];
		}
	}
	if (dbias)
		for (int f = 0; f < d->f; f++)
			dbias[f] = (float)db_sum[f];
	return 0;
}

static bool pool_ok(const struct tr_pool2d_desc *d)
{
	return d && d->c > 0 && d->h > 0 && d->w > 0 && d->ho > 0 && d->wo > 0 && d->kh > 0 && d->kw > 0 && d->sh > 0 &&
	       d->sw > 0 && d->ph >= 0 && d->pw >= 0 && 2 * d->ph <= d->kh && 2 * d->pw <= d->kw;
}

/* Index (into one channel plane) of window (oh, ow)'s maximum: the first
 * in row-major order, NaN winning as in PyTorch's CPU kernel. */
static size_t window_argmax(const struct tr_pool2d_desc *d, const float *xc, int oh, int ow, float *val)
{
	int i0, i1, j0, j1;
	size_t best = SIZE_MAX;
	float m = -INFINITY;
	tr_cpu_pool_window(d, oh, ow, &i0, &i1, &j0, &j1);
	for (int i = i0; i < i1; i++) {
		for (int j = j0; j < j1; j++) {
			float v = xc[(size_t)i * d->w + j];
			if (best == SIZE_MAX || v > m || isnan(v)) {
				m = v;
				best = (size_t)i * d->w + j;
			}
		}
	}
	*val = m;
	return best;
}

/* The same for a window inside the plane, without the bounds checks and
 * without branches (pooling random data mispredicts half of them): the
 * same comparisons in the same order. */
static inline void take_if(float v, size_t k, float *m, size_t *best)
{
	uint32_t vb, mb, take = (uint32_t)((v > *m) | (v != v)); /* v != v: NaN wins */
	memcpy(&vb, &v, sizeof vb);
	memcpy(&mb, m, sizeof mb);
	/* masks, not a conditional: the compiler keeps a ternary as a branch */
	uint32_t mask = 0u - take;
	mb = (vb & mask) | (mb & ~mask);
	memcpy(m, &mb, sizeof mb);
	size_t wide = (size_t)0 - take;
	*best = (k & wide) | (*best & ~wide);
}

static inline size_t window_argmax_inside(const struct tr_pool2d_desc *d, const float *xc, size_t at, float *val)
{
	size_t best = at;
	float m = xc[at];
	if (d->kh == 2 && d->kw == 2) {
		take_if(xc[at + 1], at + 1, &m, &best);
		take_if(xc[at + (size_t)d->w], at + (size_t)d->w, &m, &best);
		take_if(xc[at + (size_t)d->w + 1], at + (size_t)d->w + 1, &m, &best);
	} else {
		for (int i = 0; i < d->kh; i++)
			for (int j = i ? 0 : 1; j < d->kw; j++)
				take_if(xc[at + (size_t)i * d->w + j], at + (size_t)i * d->w + j, &m, &best);
	}
	*val = m;
	return best;
}

/* Windows of output row oh whose columns lie inside the plane: [*lo, *hi). */
static bool row_inside(const struct tr_pool2d_desc *d, int oh, int *lo, int *hi)
{
	int h0 = oh * d->sh - d->ph;
	if (h0 < 0 || h0 + d->kh > d->h)
		return false;
	*lo = (d->pw + d->sw - 1) / d->sw;
	*hi = d->w - d->kw + d->pw < 0 ? 0 : (d->w - d->kw + d->pw) / d->sw + 1;
	if (*hi > d->wo)
		*hi = d->wo;
	return *lo < *hi;
}

/* Max pooling of one plane: y[P] (forward), or dx[hw] += dy at each
 * window's maximum (backward, when dy is given). */
static void maxpool_plane(const struct tr_pool2d_desc *d, const float *xc, float *y, const float *dy, float *dx)
{
	for (int oh = 0; oh < d->ho; oh++) {
		int lo = 0, hi = 0;
		bool inside = row_inside(d, oh, &lo, &hi);
		for (int ow = 0; ow < d->wo; ow++) {
			float v;
			size_t k;
			if (inside && ow >= lo && ow < hi)
				k = window_argmax_inside(
					d, xc, (size_t)(oh * d->sh - d->ph) * d->w + (size_t)(ow * d->sw - d->pw), &v);
			else
				k = window_argmax(d, xc, oh, ow, &v);
			size_t o = (size_t)oh * d->wo + ow;
			if (dy)
				dx[k] += dy[o];
			else
				y[o] = v;
		}
	}
}

/* Planes (sample x channel) are independent, so the device's threads take
 * runs of them; no sum crosses a plane, so any split gives the same bits. */
#define POOL_TASKS 64

struct maxpool_job {
	const struct tr_pool2d_desc *d;
	size_t planes;
	const float *x, *dy;
	float *y, *dx;
};

static int maxpool_task(void *arg, int t, int slot)
{
	const struct maxpool_job *j = arg;
	const struct tr_pool2d_desc *d = j->d;
	size_t hw = (size_t)d->h * d->w, P = (size_t)d->ho * d->wo;
	size_t per = (j->planes + POOL_TASKS - 1) / POOL_TASKS, p0 = (size_t)t * per;
	(void)slot;
	for (size_t pl = p0; pl < p0 + per && pl < j->planes; pl++) {
		if (j->dy) {
			memset(j->dx + pl * hw, 0, hw * sizeof(float));
			maxpool_plane(d, j->x + pl * hw, NULL, j->dy + pl * P, j->dx + pl * hw);
		} else {
			maxpool_plane(d, j->x + pl * hw, j->y + pl * P, NULL, NULL);
		}
	}
	return 0;
}

static int maxpool_run(tr_backend_t *be, int dev, struct maxpool_job *j)
{
	size_t per = (j->planes + POOL_TASKS - 1) / POOL_TASKS;
	if (j->planes == 0)
		return 0;
	return tr_cpu_parallel(be, dev, (int)((j->planes + per - 1) / per), maxpool_task, j);
}

static int cpu_maxpool2d_forward(tr_backend_t *be, int dev, const struct tr_pool2d_desc *d, int rows, const float *x,
				 float *y)
{
	ENSURE_DEV("maxpool2d_forward");
	ENSURE(pool_ok(d) && rows >= 0, "maxpool2d_forward: bad shape");
	ENSURE(d->x_blocked || !d->y_blocked, "maxpool2d_forward: a blocked output needs a blocked input");
	if (d->x_blocked)
		return tr_cpu_maxpool_blocked(be, dev, d, rows, x, y, NULL, NULL);
	struct maxpool_job j = {.d = d, .planes = (size_t)rows * d->c, .x = x, .y = y};
	return maxpool_run(be, dev, &j);
}

static int cpu_maxpool2d_backward(tr_backend_t *be, int dev, const struct tr_pool2d_desc *d, int rows, const float *x,
				  const float *dy, float *dx)
{
	ENSURE_DEV("maxpool2d_backward");
	ENSURE(pool_ok(d) && rows >= 0, "maxpool2d_backward: bad shape");
	ENSURE(d->x_blocked || !d->y_blocked, "maxpool2d_backward: a blocked output needs a blocked input");
	if (d->x_blocked)
		return tr_cpu_maxpool_blocked(be, dev, d, rows, x, NULL, dy, dx);
	struct maxpool_job j = {.d = d, .planes = (size_t)rows * d->c, .x = x, .dy = dy, .dx = dx};
	return maxpool_run(be, dev, &j);
}

static int cpu_avgpool2d_forward(tr_backend_t *be, int dev, const struct tr_pool2d_desc *d, int rows, const float *x,
				 float *y)
{
	ENSURE_DEV("avgpool2d_forward");
	ENSURE(pool_ok(d) && rows >= 0, "avgpool2d_forward: bad shape");
	size_t hw = (size_t)d->h * d->w, P = (size_t)d->ho * d->wo, planes = (size_t)rows * d->c;
	float div = (float)(d->kh * d->kw);
	for (size_t pl = 0; pl < planes; pl++) {
		const float *xc = x + pl * hw;
		for (int oh = 0; oh < d->ho; oh++) {
			for (int ow = 0; ow < d->wo; ow++) {
				int i0, i1, j0, j1;
				float s = 0.0f;
				tr_cpu_pool_window(d, oh, ow, &i0, &i1, &j0, &j1);
				for (int i = i0; i < i1; i++)
					for (int j = j0; j < j1; j++)
						s += xc[(size_t)i * d->w + j];
				y[pl * P + (size_t)oh * d->wo + ow] = s / div;
			}
		}
	}
	return 0;
}

static int cpu_avgpool2d_backward(tr_backend_t *be, int dev, const struct tr_pool2d_desc *d, int rows, const float *dy,
				  float *dx)
{
	ENSURE_DEV("avgpool2d_backward");
	ENSURE(pool_ok(d) && rows >= 0, "avgpool2d_backward: bad shape");
	size_t hw = (size_t)d->h * d->w, P = (size_t)d->ho * d->wo, planes = (size_t)rows * d->c;
	float div = (float)(d->kh * d->kw);
	memset(dx, 0, planes * hw * sizeof(float));
	for (size_t pl = 0; pl < planes; pl++) {
		float *xc = dx + pl * hw;
		for (int oh = 0; oh < d->ho; oh++) {
			for (int ow = 0; ow < d->wo; ow++) {
				int i0, i1, j0, j1;
				float g = dy[pl * P + (size_t)oh * d->wo + ow] / div;
				tr_cpu_pool_window(d, oh, ow, &i0, &i1, &j0, &j1);
				for (int i = i0; i < i1; i++)
					for (int j = j0; j < j1; j++)
						xc[(size_t)i * d->w + j] += g;
			}
		}
	}
	return 0;
}

void tr_cpu_conv_fill(tr_backend_i *t)
{
	t->add = cpu_add;
	t->maxpool2d_forward = cpu_maxpool2d_forward;
	t->maxpool2d_backward = cpu_maxpool2d_backward;
	t->avgpool2d_forward = cpu_avgpool2d_forward;
	t->avgpool2d_backward = cpu_avgpool2d_backward;
}
