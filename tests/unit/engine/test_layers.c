/* Image layers' kernels against a double-precision reference.
 *
 * The reference (naive loops, in double) is itself checked against central
 * finite differences of its own forward pass; the CPU backend's forward and
 * backward (im2col + sgemm over sample chunks, col2im, pooling loops) are
 * then compared with it on ordinary and odd shapes: 1x1 images, a kernel
 * the size of the image, stride larger than the kernel, padding larger
 * than half the kernel, dilation, groups, and batches that span several
 * GEMM chunks. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/rng.h"

/* ---- double reference ---- */

static double ref_x_at(const struct tr_conv2d_desc *d, const double *x, int n, int c, int ih, int iw)
{
	if (ih < 0 || ih >= d->h || iw < 0 || iw >= d->w)
		return 0;
	return x[(((size_t)n * d->c + c) * d->h + ih) * d->w + iw];
}

static void ref_conv_forward(const struct tr_conv2d_desc *d, int rows, const double *x, const double *w,
			     const double *b, double *y)
{
	int cg = d->c / d->groups, fg = d->f / d->groups;
	for (int n = 0; n < rows; n++)
		for (int f = 0; f < d->f; f++)
			for (int oh = 0; oh < d->ho; oh++)
				for (int ow = 0; ow < d->wo; ow++) {
					double s = b ? b[f] : 0;
					int g = f / fg;
					for (int c = 0; c < cg; c++)
						for (int i = 0; i < d->kh; i++)
							for (int j = 0; j < d->kw; j++)
								s += w[(((size_t)f * cg + c) * d->kh + i) * d->kw + j] *
								     ref_x_at(d, x, n, g * cg + c,
									      oh * d->sh - d->ph + i * d->dh,
									      ow * d->sw - d->pw + j * d->dw);
					y[(((size_t)n * d->f + f) * d->ho + oh) * d->wo + ow] = s;
				}
}

/* The adjoint of the loops above. */
static void ref_conv_backward(const struct tr_conv2d_desc *d, int rows, const double *x, const double *w,
			      const double *dy, double *dx, double *dw, double *db)
{
	int cg = d->c / d->groups, fg = d->f / d->groups;
	memset(dx, 0, sizeof(double) * rows * d->c * d->h * d->w);
	memset(dw, 0, sizeof(double) * d->f * cg * d->kh * d->kw);
	memset(db, 0, sizeof(double) * d->f);
	for (int n = 0; n < rows; n++)
		for (int f = 0; f < d->f; f++)
			for (int oh = 0; oh < d->ho; oh++)
				for (int ow = 0; ow < d->wo; ow++) {
					double g_ = dy[(((size_t)n * d->f + f) * d->ho + oh) * d->wo + ow];
					int g = f / fg;
					db[f] += g_;
					for (int c = 0; c < cg; c++)
						for (int i = 0; i < d->kh; i++)
							for (int j = 0; j < d->kw; j++) {
								int ih = oh * d->sh - d->ph + i * d->dh;
								int iw = ow * d->sw - d->pw + j * d->dw;
								if (ih < 0 || ih >= d->h || iw < 0 || iw >= d->w)
									continue;
								size_t xi = (((size_t)n * d->c + g * cg + c) * d->h +
									     ih) * d->w +
									    iw;
								size_t wi =
									(((size_t)f * cg + c) * d->kh + i) * d->kw + j;
								dw[wi] += g_ * x[xi];
								dx[xi] += g_ * w[wi];
							}
				}
}

static void ref_pool_forward(const struct tr_pool2d_desc *d, int rows, bool max, const double *x, double *y)
{
	for (int pl = 0; pl < rows * d->c; pl++)
		for (int oh = 0; oh < d->ho; oh++)
			for (int ow = 0; ow < d->wo; ow++) {
				double s = max ? -INFINITY : 0;
				for (int i = 0; i < d->kh; i++)
					for (int j = 0; j < d->kw; j++) {
						int ih = oh * d->sh - d->ph + i, iw = ow * d->sw - d->pw + j;
						if (ih < 0 || ih >= d->h || iw < 0 || iw >= d->w)
							continue;
						double v = x[((size_t)pl * d->h + ih) * d->w + iw];
						if (max)
							s = v > s ? v : s;
						else
							s += v;
					}
				y[((size_t)pl * d->ho + oh) * d->wo + ow] = max ? s : s / (d->kh * d->kw);
			}
}

/* ---- helpers ---- */

static double *rand_d(size_t n, uint64_t seed)
{
	double *p = malloc(n * sizeof(double));
	uint64_t key = tr_rng_key(seed, 1, 2, TR_RNG_INIT);
	for (size_t i = 0; i < n; i++)
		p[i] = 2.0 * tr_rng_uniform(key, i) - 1.0;
	return p;
}

static float *to_f(const double *p, size_t n)
{
	float *f = malloc((n ? n : 1) * sizeof(float));
	for (size_t i = 0; i < n; i++)
		f[i] = (float)p[i];
	return f;
}

/* Rounds a double array to float values, so reference and backend start
 * from the same numbers. */
static void round_f(double *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (float)p[i];
}

static double max_abs(const double *p, size_t n)
{
	double m = 0;
	for (size_t i = 0; i < n; i++)
		m = fabs(p[i]) > m ? fabs(p[i]) : m;
	return m;
}

static void expect_close(const char *what, const float *got, const double *want, size_t n, double rel)
{
	double scale = max_abs(want, n) + 1e-30;
	for (size_t i = 0; i < n; i++)
		cr_assert_leq(fabs(got[i] - want[i]), rel * scale, "%s[%zu]: got %.9g want %.9g (scale %.3g)", what, i,
			      (double)got[i], want[i], scale);
}

static void fill_conv(struct tr_conv2d_desc *d, int c, int h, int w, int f, int kh, int kw, int s, int p, int dil,
		      int groups)
{
	*d = (struct tr_conv2d_desc){.c = c,
				     .h = h,
				     .w = w,
				     .f = f,
				     .kh = kh,
				     .kw = kw,
				     .sh = s,
				     .sw = s,
				     .ph = p,
				     .pw = p,
				     .dh = dil,
				     .dw = dil,
				     .groups = groups};
	d->ho = (h + 2 * p - dil * (kh - 1) - 1) / s + 1;
	d->wo = (w + 2 * p - dil * (kw - 1) - 1) / s + 1;
}

/* The reference backward against finite differences of the reference
 * forward, for loss = sum(y * r) with a fixed random r. */
static void check_reference_conv(const struct tr_conv2d_desc *d, int rows)
{
	size_t nx = (size_t)rows * d->c * d->h * d->w, nw = (size_t)d->f * (d->c / d->groups) * d->kh * d->kw,
	       ny = (size_t)rows * d->f * d->ho * d->wo;
	double *x = rand_d(nx, 1), *w = rand_d(nw, 2), *b = rand_d(d->f, 3), *r = rand_d(ny, 4);
	double *y = malloc(ny * sizeof(double)), *dx = malloc(nx * sizeof(double)), *dw = malloc(nw * sizeof(double)),
	       *db = malloc(d->f * sizeof(double));
	ref_conv_backward(d, rows, x, w, r, dx, dw, db);
	const double h = 1e-6;
	double *vars[] = {x, w, b}, *grads[] = {dx, dw, db};
	size_t lens[] = {nx, nw, (size_t)d->f};
	for (int k = 0; k < 3; k++) {
		for (size_t i = 0; i < lens[k]; i++) {
			double orig = vars[k][i], lu = 0, ld = 0;
			vars[k][i] = orig + h;
			ref_conv_forward(d, rows, x, w, b, y);
			for (size_t j = 0; j < ny; j++)
				lu += y[j] * r[j];
			vars[k][i] = orig - h;
			ref_conv_forward(d, rows, x, w, b, y);
			for (size_t j = 0; j < ny; j++)
				ld += y[j] * r[j];
			vars[k][i] = orig;
			double num = (lu - ld) / (2 * h);
			cr_assert_leq(fabs(num - grads[k][i]), 1e-6 * (1 + fabs(num)),
				      "reference grad %d[%zu]: %g vs %g", k, i, grads[k][i], num);
		}
	}
	free(x), free(w), free(b), free(r), free(y), free(dx), free(dw), free(db);
}

/* The backend's conv2d against the reference: forward, dw, db, dx. */
static void check_backend_conv(const struct tr_conv2d_desc *d, int rows, bool bias)
{
	tr_backend_t *be = tr_cpu_backend_create(1, 1);
	cr_assert_not_null(be);
	size_t nx = (size_t)rows * d->c * d->h * d->w, nw = (size_t)d->f * (d->c / d->groups) * d->kh * d->kw,
	       ny = (size_t)rows * d->f * d->ho * d->wo;
	double *x = rand_d(nx, 11), *w = rand_d(nw, 12), *b = rand_d(d->f, 13), *r = rand_d(ny, 14);
	round_f(x, nx), round_f(w, nw), round_f(b, d->f), round_f(r, ny);
	double *y = malloc(ny * sizeof(double)), *dx = malloc(nx * sizeof(double)), *dw = malloc(nw * sizeof(double)),
	       *db = malloc(d->f * sizeof(double));
	ref_conv_forward(d, rows, x, w, bias ? b : NULL, y);
	ref_conv_backward(d, rows, x, w, r, dx, dw, db);
	float *fx = to_f(x, nx), *fw = to_f(w, nw), *fb = to_f(b, d->f), *fr = to_f(r, ny);
	float *fy = calloc(ny, sizeof(float)), *fdx = calloc(nx, sizeof(float)), *fdw = malloc(nw * sizeof(float)),
	      *fdb = malloc(d->f * sizeof(float));
	float *work = malloc(tr_conv2d_workspace(d, rows) * sizeof(float));
	/* stale values must not leak into the overwritten results */
	for (size_t i = 0; i < nw; i++)
		fdw[i] = NAN;
	for (int i = 0; i < d->f; i++)
		fdb[i] = NAN;
	cr_assert_eq(be->i->conv2d_forward(be, 0, d, rows, fx, fw, bias ? fb : NULL, fy, work), 0, "%s",
		     be->i->last_error(be));
	expect_close("y", fy, y, ny, 1e-5);
	cr_assert_eq(be->i->conv2d_backward(be, 0, d, rows, fx, fw, fr, fdx, fdw, bias ? fdb : NULL, work), 0);
	expect_close("dw", fdw, dw, nw, 1e-5);
	expect_close("dx", fdx, dx, nx, 1e-5);
	if (bias)
		expect_close("db", fdb, db, d->f, 1e-5);
	/* without dx: the parameter gradients alone, the same values */
	cr_assert_eq(be->i->conv2d_backward(be, 0, d, rows, fx, fw, fr, NULL, fdw, NULL, work), 0);
	expect_close("dw (no dx)", fdw, dw, nw, 1e-5);
	free(x), free(w), free(b), free(r), free(y), free(dx), free(dw), free(db);
	free(fx), free(fw), free(fb), free(fr), free(fy), free(fdx), free(fdw), free(fdb), free(work);
	tr_backend_destroy(be);
}

static void conv_case(int c, int h, int w, int f, int kh, int kw, int s, int p, int dil, int groups, int rows)
{
	struct tr_conv2d_desc d;
	fill_conv(&d, c, h, w, f, kh, kw, s, p, dil, groups);
	cr_assert_gt(d.ho, 0);
	cr_assert_gt(d.wo, 0);
	check_reference_conv(&d, rows < 2 ? rows : 2);
	check_backend_conv(&d, rows, true);
	check_backend_conv(&d, rows, false);
}

/* clang-format off */
Test(layers, conv2d_ordinary) { conv_case(3, 5, 4, 4, 3, 2, 1, 1, 1, 1, 3); }
Test(layers, conv2d_one_by_one_image) { conv_case(2, 1, 1, 3, 1, 1, 1, 0, 1, 1, 4); }
Test(layers, conv2d_one_by_one_image_padded) { conv_case(2, 1, 1, 3, 3, 3, 1, 1, 1, 1, 2); }
Test(layers, conv2d_kernel_is_image) { conv_case(2, 3, 3, 2, 3, 3, 1, 0, 1, 1, 3); }
Test(layers, conv2d_stride_above_kernel) { conv_case(2, 7, 7, 3, 2, 2, 3, 0, 1, 1, 2); }
Test(layers, conv2d_padding_above_half_kernel) { conv_case(1, 4, 4, 2, 3, 3, 1, 2, 1, 1, 2); }
Test(layers, conv2d_dilation_and_groups) { conv_case(4, 6, 6, 6, 3, 3, 1, 2, 2, 2, 2); }
Test(layers, conv2d_depthwise_strided) { conv_case(3, 5, 6, 3, 3, 3, 2, 1, 1, 3, 2); }
/* clang-format on */

/* A batch larger than one chunk: dw sums over chunks and the scatter
 * back to NCHW must line up at chunk edges. */
Test(layers, conv2d_batch_spans_chunks)
{
	struct tr_conv2d_desc d;
	fill_conv(&d, 32, 24, 24, 32, 3, 3, 1, 1, 1, 1);
	int rows = 2 * tr_conv2d_chunk(&d, 1 << 20) + 3;
	cr_assert_gt(rows, 5);
	cr_assert_lt(tr_conv2d_chunk(&d, rows), rows);
	check_backend_conv(&d, rows, true);
}

/* ---- pooling ---- */

static void pool_case(bool max, int c, int h, int w, int k, int s, int p, int rows)
{
	struct tr_pool2d_desc d = {.c = c, .h = h, .w = w, .kh = k, .kw = k, .sh = s, .sw = s, .ph = p, .pw = p};
	d.ho = (h + 2 * p - k) / s + 1;
	d.wo = (w + 2 * p - k) / s + 1;
	size_t nx = (size_t)rows * c * h * w, ny = (size_t)rows * c * d.ho * d.wo;
	double *x = rand_d(nx, 21), *r = rand_d(ny, 22);
	round_f(x, nx), round_f(r, ny);
	double *y = malloc(ny * sizeof(double)), *yu = malloc(ny * sizeof(double)), *num = malloc(nx * sizeof(double));
	ref_pool_forward(&d, rows, max, x, y);
	/* finite differences of the reference: dL/dx for L = sum(y * r) */
	const double hstep = 1e-7;
	for (size_t i = 0; i < nx; i++) {
		double orig = x[i], lu = 0, ld = 0;
		x[i] = orig + hstep;
		ref_pool_forward(&d, rows, max, x, yu);
		for (size_t j = 0; j < ny; j++)
			lu += yu[j] * r[j];
		x[i] = orig - hstep;
		ref_pool_forward(&d, rows, max, x, yu);
		for (size_t j = 0; j < ny; j++)
			ld += yu[j] * r[j];
		x[i] = orig;
		num[i] = (lu - ld) / (2 * hstep);
	}
	tr_backend_t *be = tr_cpu_backend_create(1, 1);
	float *fx = to_f(x, nx), *fr = to_f(r, ny), *fy = calloc(ny, sizeof(float)), *fdx = malloc(nx * sizeof(float));
	for (size_t i = 0; i < nx; i++)
		fdx[i] = NAN;
	if (max) {
		cr_assert_eq(be->i->maxpool2d_forward(be, 0, &d, rows, fx, fy), 0, "%s", be->i->last_error(be));
		cr_assert_eq(be->i->maxpool2d_backward(be, 0, &d, rows, fx, fr, fdx), 0);
	} else {
		cr_assert_eq(be->i->avgpool2d_forward(be, 0, &d, rows, fx, fy), 0, "%s", be->i->last_error(be));
		cr_assert_eq(be->i->avgpool2d_backward(be, 0, &d, rows, fr, fdx), 0);
	}
	expect_close("y", fy, y, ny, 1e-6);
	expect_close("dx", fdx, num, nx, 1e-5);
	free(x), free(r), free(y), free(yu), free(num), free(fx), free(fr), free(fy), free(fdx);
	tr_backend_destroy(be);
}

/* clang-format off */
Test(layers, maxpool2d_ordinary) { pool_case(true, 3, 6, 6, 2, 2, 0, 3); }
Test(layers, maxpool2d_overlapping_padded) { pool_case(true, 2, 5, 7, 3, 2, 1, 2); }
Test(layers, maxpool2d_stride_above_kernel) { pool_case(true, 2, 7, 7, 2, 3, 0, 2); }
Test(layers, maxpool2d_one_by_one_image) { pool_case(true, 3, 1, 1, 1, 1, 0, 2); }
Test(layers, maxpool2d_kernel_is_image) { pool_case(true, 2, 4, 4, 4, 4, 0, 2); }
Test(layers, avgpool2d_ordinary) { pool_case(false, 3, 6, 6, 2, 2, 0, 3); }
Test(layers, avgpool2d_overlapping_padded) { pool_case(false, 2, 5, 7, 3, 2, 1, 2); }
Test(layers, avgpool2d_stride_above_kernel) { pool_case(false, 2, 7, 7, 2, 3, 0, 2); }
Test(layers, avgpool2d_one_by_one_image) { pool_case(false, 3, 1, 1, 1, 1, 0, 2); }
/* global_avg_pool is the window of the whole image */
Test(layers, avgpool2d_kernel_is_image) { pool_case(false, 4, 3, 3, 3, 1, 0, 2); }
/* clang-format on */
