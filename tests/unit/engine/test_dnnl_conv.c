/* Tests of the oneDNN convolution route (engine/cpu/cpu_dnnl_conv.c):
 * forward, data gradient and weight/bias gradients against a direct
 * double-precision convolution, on shapes that stress the geometry
 * (stride, padding beyond half the kernel, dilation, groups, 1x1 images,
 * kernel = image, stride > kernel), the shape cache reused with other
 * buffers, and activations in the blocked layout nChw16c (the chains of
 * docs/design.md, "Convolution on CPU devices") giving the same bits as
 * NCHW without reordering them.  Skipped, visibly, in a build without oneDNN.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cpu/cpu_dnnl_conv.h"
#include "engine/cpu/cpu_internal.h"
#include "engine/rng.h"

static uint64_t rs = 0x243f6a8885a308d3ULL;

static float rndf(void)
{
	rs = tr_mix64(rs);
	return (float)((double)(rs >> 11) * 0x1p-52 - 1.0);
}

static float *frand(size_t n)
{
	float *p = malloc((n ? n : 1) * sizeof *p);
	cr_assert(p);
	for (size_t i = 0; i < n; i++)
		p[i] = rndf();
	return p;
}

static int out_size(int in, int k, int s, int p, int d)
{
	return (in + 2 * p - d * (k - 1) - 1) / s + 1;
}

/* y[n,k,p,q] = b[k] + sum_{c in group, r, s} x[n,c,p*sh-ph+r*dh, q*sw-pw+s*dw] w[k,c',r,s];
 * dx and dw, db of L = sum dy * y. */
static void reference(const struct tr_conv2d_geom *g, const float *x, const float *w, const float *b, const float *dy,
		      double *y, double *dx, double *dw, double *db)
{
	int cg = g->c / g->groups, kg = g->k / g->groups;
	size_t ny = (size_t)g->n * g->k * g->oh * g->ow;
	memset(dx, 0, (size_t)g->n * g->c * g->h * g->w * sizeof *dx);
	memset(dw, 0, (size_t)g->k * cg * g->kh * g->kw * sizeof *dw);
	memset(db, 0, (size_t)g->k * sizeof *db);
	for (size_t i = 0; i < ny; i++)
		y[i] = 0;
	for (int n = 0; n < g->n; n++)
		for (int k = 0; k < g->k; k++) {
			int grp = k / kg;
			for (int p = 0; p < g->oh; p++)
				for (int q = 0; q < g->ow; q++) {
					size_t yo = (((size_t)n * g->k + k) * g->oh + p) * g->ow + q;
					double acc = b ? b[k] : 0.0;
					double d = dy[yo];
					db[k] += d;
					for (int cc = 0; cc < cg; cc++) {
						int c = grp * cg + cc;
						for (int r = 0; r < g->kh; r++)
							for (int s = 0; s < g->kw; s++) {
								int ih = p * g->sh - g->ph + r * g->dh;
								int iw = q * g->sw - g->pw + s * g->dw;
								if (ih < 0 || ih >= g->h || iw < 0 || iw >= g->w)
									continue;
								size_t xo =
									(((size_t)n * g->c + c) * g->h + ih) * g->w +
									iw;
								size_t wo =
									(((size_t)k * cg + cc) * g->kh + r) * g->kw + s;
								acc += (double)x[xo] * w[wo];
								dx[xo] += d * w[wo];
								dw[wo] += d * x[xo];
							}
					}
					y[yo] = acc;
				}
		}
}

static void close_to(const char *what, const float *got, const double *want, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)got[i] - want[i]);
		cr_assert(d <= 1e-4 + 1e-4 * fabs(want[i]), "%s[%zu]: got %.8g want %.8g", what, i, (double)got[i],
			  want[i]);
	}
}

struct cs {
	int n, c, h, w, k, kh, kw, sh, sw, ph, pw, dh, dw, groups, bias;
};

static const struct cs cases[] = {
	{2, 3, 7, 6, 4, 3, 3, 1, 1, 0, 0, 1, 1, 1, 1},
	{3, 4, 9, 9, 6, 3, 3, 1, 1, 1, 1, 1, 1, 1, 0}, /* "same", no bias */
	{1, 1, 1, 1, 2, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1}, /* 1x1 image */
	{2, 2, 5, 4, 3, 5, 4, 1, 1, 0, 0, 1, 1, 1, 1}, /* kernel = image */
	{2, 2, 8, 7, 3, 2, 2, 3, 3, 0, 0, 1, 1, 1, 1}, /* stride > kernel */
	{1, 2, 4, 4, 2, 3, 3, 1, 1, 2, 2, 1, 1, 1, 1}, /* padding > half the kernel */
	{2, 4, 9, 8, 6, 3, 3, 2, 1, 1, 2, 2, 1, 2, 1}, /* dilation, groups, uneven stride/padding */
	{2, 6, 5, 5, 6, 3, 3, 1, 1, 1, 1, 1, 1, 6, 1}, /* depthwise */
};

Test(dnnl_conv, matches_direct_convolution)
{
	if (!tr_dnnl_available())
		cr_skip_test("this build has no oneDNN (libdnnl-dev)");
	struct tr_error err;
	tr_dnnl_conv_t *dc = tr_dnnl_conv_create(2, &err);
	cr_assert(dc, "%s", err.message);
	for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
		const struct cs *c = &cases[ci];
		struct tr_conv2d_geom g = {c->n,  c->c,  c->h,  c->w,  c->k,      c->kh, c->kw, c->sh, c->sw,
					   c->ph, c->pw, c->dh, c->dw, c->groups, 0,     0,     0,     0};
		g.oh = out_size(g.h, g.kh, g.sh, g.ph, g.dh);
		g.ow = out_size(g.w, g.kw, g.sw, g.pw, g.dw);
		size_t nx = (size_t)g.n * g.c * g.h * g.w, ny = (size_t)g.n * g.k * g.oh * g.ow;
		size_t nw = (size_t)g.k * (g.c / g.groups) * g.kh * g.kw;
		float *x = frand(nx), *w = frand(nw), *b = c->bias ? frand(g.k) : NULL, *dy = frand(ny);
		float *y = frand(ny), *dx = frand(nx), *dw = frand(nw), *db = frand(g.k);
		double *ry = malloc(ny * sizeof *ry), *rdx = malloc(nx * sizeof *rdx);
		double *rdw = malloc(nw * sizeof *rdw), *rdb = malloc(g.k * sizeof *rdb);
		reference(&g, x, w, b, dy, ry, rdx, rdw, rdb);
		/* twice: the second call takes the cached primitives */
		for (int rep = 0; rep < 2; rep++) {
			cr_assert_eq(tr_dnnl_conv_forward(dc, &g, x, w, b, y, &err), 0, "case %zu: %s", ci,
				     err.message);
			close_to("y", y, ry, ny);
			cr_assert_eq(tr_dnnl_conv_backward_data(dc, &g, w, dy, dx, &err), 0, "case %zu: %s", ci,
				     err.message);
			close_to("dx", dx, rdx, nx);
			cr_assert_eq(tr_dnnl_conv_backward_weights(dc, &g, x, dy, dw, c->bias ? db : NULL, &err), 0,
				     "case %zu: %s", ci, err.message);
			close_to("dw", dw, rdw, nw);
			if (c->bias)
				close_to("db", db, rdb, g.k);
			memset(y, 0xff, ny * sizeof *y); /* NaN: must be overwritten */
			memset(dx, 0xff, nx * sizeof *dx);
			memset(dw, 0xff, nw * sizeof *dw);
		}
		free(x), free(w), free(b), free(dy), free(y), free(dx), free(dw), free(db);
		free(ry), free(rdx), free(rdw), free(rdb);
	}
	tr_dnnl_conv_destroy(dc);
}

/* NCHW <-> nChw16c (c a multiple of 16): [n][c/16][h][w][16] */
static size_t blocked_at(int n, int c, int hw, int C, int HW)
{
	return (((size_t)n * (C / 16) + c / 16) * HW + hw) * 16 + c % 16;
}

static float *to_blocked(const float *p, int N, int C, int HW)
{
	float *o = malloc((size_t)N * C * HW * sizeof *o);
	cr_assert(o);
	for (int n = 0; n < N; n++)
		for (int c = 0; c < C; c++)
			for (int i = 0; i < HW; i++)
				o[blocked_at(n, c, i, C, HW)] = p[((size_t)n * C + c) * HW + i];
	return o;
}

static void expect_same_as_blocked(const char *what, const float *plain, const float *blocked, int N, int C, int HW)
{
	for (int n = 0; n < N; n++)
		for (int c = 0; c < C; c++)
			for (int i = 0; i < HW; i++) {
				float a = plain[((size_t)n * C + c) * HW + i], b = blocked[blocked_at(n, c, i, C, HW)];
				cr_assert(!memcmp(&a, &b, sizeof a), "%s[%d,%d,%d]: NCHW %.9g, blocked %.9g", what, n,
					  c, i, (double)a, (double)b);
			}
}

/* A layer inside a chain reads x and dy and writes y and dx in nChw16c:
 * the same bits as on NCHW, and no activation is reordered where oneDNN
 * prefers that layout itself (AVX-512 machines). */
Test(dnnl_conv, blocked_activations_give_the_same_bits_without_reorders)
{
	if (!tr_dnnl_available())
		cr_skip_test("this build has no oneDNN (libdnnl-dev)");
	struct tr_error err;
	tr_dnnl_conv_t *dc = tr_dnnl_conv_create(1, &err);
	cr_assert(dc, "%s", err.message);
	struct tr_conv2d_geom g = {.n = 3,
				   .c = 16,
				   .h = 9,
				   .w = 7,
				   .k = 32,
				   .kh = 3,
				   .kw = 3,
				   .sh = 1,
				   .sw = 1,
				   .ph = 1,
				   .pw = 1,
				   .dh = 1,
				   .dw = 1,
				   .groups = 1,
				   .oh = 9,
				   .ow = 7};
	int HW = g.h * g.w, OHW = g.oh * g.ow;
	size_t nx = (size_t)g.n * g.c * HW, ny = (size_t)g.n * g.k * OHW, nw = (size_t)g.k * g.c * g.kh * g.kw;
	float *x = frand(nx), *w = frand(nw), *b = frand(g.k), *dy = frand(ny);
	float *y = frand(ny), *dx = frand(nx), *dw = frand(nw), *db = frand(g.k);
	float *by = frand(ny), *bdx = frand(nx), *bdw = frand(nw), *bdb = frand(g.k);
	float *bx = to_blocked(x, g.n, g.c, HW), *bdy = to_blocked(dy, g.n, g.k, OHW);
	cr_assert_eq(tr_dnnl_conv_forward(dc, &g, x, w, b, y, &err), 0, "%s", err.message);
	cr_assert_eq(tr_dnnl_conv_backward_data(dc, &g, w, dy, dx, &err), 0, "%s", err.message);
	cr_assert_eq(tr_dnnl_conv_backward_weights(dc, &g, x, dy, dw, db, &err), 0, "%s", err.message);

	struct tr_conv2d_geom bg = g;
	bg.x_blocked = bg.y_blocked = 1;
	bool native = tr_dnnl_conv_prefers_blocked(&g, false) && tr_dnnl_conv_prefers_blocked(&g, true);
	unsigned long long before = tr_dnnl_conv_activation_reorders();
	cr_assert_eq(tr_dnnl_conv_forward(dc, &bg, bx, w, b, by, &err), 0, "%s", err.message);
	cr_assert_eq(tr_dnnl_conv_backward_data(dc, &bg, w, bdy, bdx, &err), 0, "%s", err.message);
	cr_assert_eq(tr_dnnl_conv_backward_weights(dc, &bg, bx, bdy, bdw, bdb, &err), 0, "%s", err.message);
	unsigned long long reorders = tr_dnnl_conv_activation_reorders() - before;
	expect_same_as_blocked("y", y, by, g.n, g.k, OHW);
	expect_same_as_blocked("dx", dx, bdx, g.n, g.c, HW);
	cr_assert(!memcmp(dw, bdw, nw * sizeof *dw), "dw differs between the layouts");
	cr_assert(!memcmp(db, bdb, g.k * sizeof *db), "db differs between the layouts");
	if (native)
		cr_assert_eq(reorders, 0, "%llu activation reorders in a chain oneDNN lays out itself", reorders);
	else
		cr_log_warn("oneDNN prefers another layout on this CPU: reorders not checked");
	/* the plain calls reorder every activation */
	before = tr_dnnl_conv_activation_reorders();
	cr_assert_eq(tr_dnnl_conv_forward(dc, &g, x, w, b, y, &err), 0, "%s", err.message);
	if (native)
		cr_assert_eq(tr_dnnl_conv_activation_reorders() - before, 2, "x in and y out");
	free(x), free(w), free(b), free(dy), free(y), free(dx), free(dw), free(db);
	free(by), free(bdx), free(bdw), free(bdb), free(bx), free(bdy);
	tr_dnnl_conv_destroy(dc);
}

/* The slices the device's threads share (cpu_dnnl_conv.c): exact mode's
 * shards (docs/design.md, "Exact mode") are small batches, which the
 * rule of about 4,096 output positions per slice alone left to one thread
 * or cut 3 + 1; they get an even count of slices of even sizes.  Larger
 * batches get that rule's count rounded down to a multiple of 4, of even
 * sizes, so that 2 or 4 threads take equal shares (VDSR's batch of 32 was
 * 10 slices of 3 and one of 2: 17 and 15 samples on two threads). */
Test(dnnl_conv, batches_are_cut_into_even_slices)
{
	/* VDSR's 3x3 convolutions on 41x41, LeNet's on 28x28 and 13x13 */
	static const struct tr_conv2d_desc vdsr = {.c = 64,
						   .h = 41,
						   .w = 41,
						   .f = 64,
						   .ho = 41,
						   .wo = 41,
						   .kh = 3,
						   .kw = 3,
						   .sh = 1,
						   .sw = 1,
						   .ph = 1,
						   .pw = 1,
						   .dh = 1,
						   .dw = 1,
						   .groups = 1};
	static const struct tr_conv2d_desc lenet1 = {.c = 1,
						     .h = 28,
						     .w = 28,
						     .f = 32,
						     .ho = 26,
						     .wo = 26,
						     .kh = 3,
						     .kw = 3,
						     .sh = 1,
						     .sw = 1,
						     .dh = 1,
						     .dw = 1,
						     .groups = 1};
	static const struct tr_conv2d_desc lenet2 = {.c = 32,
						     .h = 13,
						     .w = 13,
						     .f = 64,
						     .ho = 11,
						     .wo = 11,
						     .kh = 3,
						     .kw = 3,
						     .sh = 1,
						     .sw = 1,
						     .dh = 1,
						     .dw = 1,
						     .groups = 1};
	const struct {
		const struct tr_conv2d_desc *d;
		int rows, slices, largest;
	} cases[] = {
		{&vdsr, 4, 2, 2},      /* a shard of batch 32: was 3 + 1 */
		{&vdsr, 3, 2, 2},      /* one slice of the first rule: two */
		{&vdsr, 1, 1, 1},      /* one sample */
		{&lenet1, 16, 4, 4},   /* three slices of 7 samples: four of 4 */
		{&lenet2, 16, 2, 8},   /* a shard of batch 128: was one slice */
		{&lenet2, 17, 2, 9},   /* sizes differ by at most one */
		{&vdsr, 32, 8, 4},     /* the float path's batch: 11 slices of 4,096 positions, 8 of 4 samples */
		{&vdsr, 30, 8, 4},     /* 10 slices of 3: 8 of 3 or 4 */
		{&lenet1, 128, 16, 8}, /* 19 slices of 7: 16 of 8 */
		{&lenet2, 128, 4, 32}  /* exactly MIN_SLICES of the first rule, even sizes */
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		int largest = 0, n = tr_cpu_dnnl_slices(cases[i].d, cases[i].rows, &largest);
		cr_expect_eq(n, cases[i].slices, "case %zu, %d rows: %d slices, want %d", i, cases[i].rows, n,
			     cases[i].slices);
		cr_expect_eq(largest, cases[i].largest, "case %zu, %d rows: largest slice %d, want %d", i,
			     cases[i].rows, largest, cases[i].largest);
	}
	/* Every batch: at most one slice per sample, a multiple of 4 slices
	 * from 4 on (equal shares for 1, 2 or 4 threads), sizes that differ
	 * by at most one. */
	const struct tr_conv2d_desc *shapes[] = {&vdsr, &lenet1, &lenet2};
	for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
		for (int rows = 1; rows <= 256; rows++) {
			int largest = 0, n = tr_cpu_dnnl_slices(shapes[i], rows, &largest);
			cr_assert(n >= 1 && n <= rows, "shape %zu, %d rows: %d slices", i, rows, n);
			cr_assert(n < 4 || n % 4 == 0, "shape %zu, %d rows: %d slices", i, rows, n);
			cr_assert_eq(largest, (rows + n - 1) / n, "shape %zu, %d rows: largest %d of %d slices", i,
				     rows, largest, n);
		}
}
