/* Max pooling in oneDNN's blocked layout (engine/cpu/cpu_pool_blocked.c):
 * with x in nChw16c and y in nChw16c or NCHW, forward and backward give
 * the same bits as the NCHW kernel, element for element (ties, NaN,
 * padding, overlapping windows), on any thread count; what it cannot
 * take is refused with a message.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/rng.h"

#define ROWS 3

/* plain NCHW [ROWS, c, h, w] <-> nChw16c */
static size_t blocked_at(int c, int h, int w, int n, int ch, int i, int j)
{
	return ((((size_t)n * (c / 16) + ch / 16) * h + i) * w + j) * 16 + ch % 16;
}

static float *to_blocked(const float *p, int c, int h, int w)
{
	float *b = malloc((size_t)ROWS * c * h * w * sizeof *b);
	cr_assert(b);
	for (int n = 0; n < ROWS; n++)
		for (int ch = 0; ch < c; ch++)
			for (int i = 0; i < h; i++)
				for (int j = 0; j < w; j++)
					b[blocked_at(c, h, w, n, ch, i, j)] = p[(((size_t)n * c + ch) * h + i) * w + j];
	return b;
}

static float *to_plain(const float *b, int c, int h, int w)
{
	float *p = malloc((size_t)ROWS * c * h * w * sizeof *p);
	cr_assert(p);
	for (int n = 0; n < ROWS; n++)
		for (int ch = 0; ch < c; ch++)
			for (int i = 0; i < h; i++)
				for (int j = 0; j < w; j++)
					p[(((size_t)n * c + ch) * h + i) * w + j] = b[blocked_at(c, h, w, n, ch, i, j)];
	return p;
}

/* values from a small set, so that windows hold ties, and a few NaNs */
static float *data(size_t n, uint64_t seed, bool nans)
{
	float *p = malloc(n * sizeof *p);
	cr_assert(p);
	for (size_t i = 0; i < n; i++) {
		seed = tr_mix64(seed + i);
		p[i] = nans && seed % 97 == 0 ? NAN : (float)((int)(seed % 7) - 3) * 0.5f;
	}
	return p;
}

static void expect_same_bits(const float *a, const float *b, size_t n, const char *what)
{
	for (size_t i = 0; i < n; i++)
		cr_assert(!memcmp(&a[i], &b[i], sizeof *a), "%s: element %zu: %g vs %g", what, i, (double)a[i],
			  (double)b[i]);
}

static struct tr_pool2d_desc window(int c, int h, int w, int k, int s, int p)
{
	return (struct tr_pool2d_desc){.c = c,
				       .h = h,
				       .w = w,
				       .ho = (h + 2 * p - k) / s + 1,
				       .wo = (w + 2 * p - k) / s + 1,
				       .kh = k,
				       .kw = k,
				       .sh = s,
				       .sw = s,
				       .ph = p,
				       .pw = p};
}

/* d in both layouts (y blocked or NCHW), on a backend of `threads` */
static void check(struct tr_pool2d_desc d, int threads, bool y_blocked)
{
	tr_backend_t *be = tr_cpu_backend_create(1, threads);
	cr_assert(be);
	size_t nx = (size_t)ROWS * d.c * d.h * d.w, ny = (size_t)ROWS * d.c * d.ho * d.wo;
	float *x = data(nx, 11, true), *dy = data(ny, 12, false);
	float *y = malloc(ny * sizeof *y), *dx = malloc(nx * sizeof *dx);
	float *yb = malloc(ny * sizeof *yb), *dxb = malloc(nx * sizeof *dxb);
	cr_assert(y && dx && yb && dxb);
	cr_assert_eq(be->i->maxpool2d_forward(be, 0, &d, ROWS, x, y), 0, "%s", be->i->last_error(be));
	cr_assert_eq(be->i->maxpool2d_backward(be, 0, &d, ROWS, x, dy, dx), 0, "%s", be->i->last_error(be));

	struct tr_pool2d_desc b = d;
	b.x_blocked = 1;
	b.y_blocked = y_blocked;
	float *xb = to_blocked(x, d.c, d.h, d.w);
	float *dyb = y_blocked ? to_blocked(dy, d.c, d.ho, d.wo) : dy;
	cr_assert_eq(be->i->maxpool2d_forward(be, 0, &b, ROWS, xb, yb), 0, "%s", be->i->last_error(be));
	cr_assert_eq(be->i->maxpool2d_backward(be, 0, &b, ROWS, xb, dyb, dxb), 0, "%s", be->i->last_error(be));
	float *y_back = y_blocked ? to_plain(yb, d.c, d.ho, d.wo) : yb;
	float *dx_back = to_plain(dxb, d.c, d.h, d.w);
	expect_same_bits(y, y_back, ny, "forward");
	expect_same_bits(dx, dx_back, nx, "backward");

	free(x), free(dy), free(y), free(dx), free(xb), free(dxb), free(dx_back);
	if (y_blocked)
		free(dyb), free(y_back);
	free(yb);
	tr_backend_destroy(be);
}

Test(pool_blocked, same_bits_as_nchw_for_every_window)
{
	const struct tr_pool2d_desc shapes[] = {
		window(32, 8, 6, 2, 2, 0), /* LeNet's */
		window(16, 7, 9, 3, 2, 1), /* padding, an odd edge */
		window(32, 6, 5, 3, 1, 1), /* overlapping windows: dx sums */
		window(16, 5, 5, 5, 1, 2), /* windows mostly padding */
	};
	for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
		for (int yb = 0; yb <= 1; yb++)
			for (int threads = 1; threads <= 3; threads += 2)
				check(shapes[i], threads, yb);
}

Test(pool_blocked, what_it_cannot_take_is_refused)
{
	tr_backend_t *be = tr_cpu_backend_create(1, 1);
	cr_assert(be);
	float x[ROWS * 8 * 4 * 4] = {0}, y[ROWS * 8 * 2 * 2];
	struct tr_pool2d_desc d = window(8, 4, 4, 2, 2, 0);
	d.x_blocked = 1;
	cr_expect_lt(be->i->maxpool2d_forward(be, 0, &d, ROWS, x, y), 0, "8 channels are no 16-channel block");
	cr_expect(strstr(be->i->last_error(be), "16-channel"), "%s", be->i->last_error(be));
	d.x_blocked = 0;
	d.y_blocked = 1;
	cr_expect_lt(be->i->maxpool2d_forward(be, 0, &d, ROWS, x, y), 0, "a blocked output needs a blocked input");
	cr_expect(strstr(be->i->last_error(be), "blocked input"), "%s", be->i->last_error(be));
	tr_backend_destroy(be);
}
