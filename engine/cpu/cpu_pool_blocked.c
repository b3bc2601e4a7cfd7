/* Max pooling of activations in oneDNN's blocked layout nChw16c, inside a
 * chain of oneDNN convolutions (docs/design.md, "Convolution on CPU
 * devices": chains through max pooling).
 *
 * x (and dx) are nChw16c: per sample, C / 16 blocks of h x w positions of
 * 16 channels each.  y (and dy) are nChw16c too when the chain goes on to
 * another convolution, or NCHW where it ends at this layer (a flatten or
 * dense layer reads NCHW), so the pooling itself puts the smaller tensor
 * back into trainerd's layout and no reorder runs.
 *
 * Each channel takes the same comparisons in the same order as the NCHW
 * kernel (cpu_conv.c: the window's first element, then row-major, a
 * greater value or NaN taking over), and its gradient adds dy to dx in
 * the same order of windows, so both give the same bits; the 16 channels
 * of a block run side by side, which the compiler vectorises.  Blocks
 * (sample x channel block) are independent, so the device's threads take
 * runs of them and any split gives the same bits.
 */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "engine/cpu/cpu_internal.h"

enum { LANES = 16, BLOCK_TASKS = 64 };

struct block_job {
	const struct tr_pool2d_desc *d;
	size_t blocks; /* rows x c / 16 */
	const float *x, *dy;
	float *y, *dx;
};

/* Where output position o of channel lane l of block b lies in y or dy */
static size_t out_at(const struct tr_pool2d_desc *d, size_t b, size_t o, int l)
{
	size_t P = (size_t)d->ho * d->wo;
	return d->y_blocked ? (b * P + o) * LANES + (size_t)l : (b * LANES + (size_t)l) * P + o;
}

/* One block: y (forward), or dx += dy at each window's maximum (backward,
 * when dy is given; dx zeroed first). */
static void pool_block(const struct block_job *j, size_t b)
{
	const struct tr_pool2d_desc *d = j->d;
	size_t hw = (size_t)d->h * d->w;
	const float *xb = j->x + b * hw * LANES;
	float *dxb = j->dx ? j->dx + b * hw * LANES : NULL;
	if (dxb)
		memset(dxb, 0, hw * LANES * sizeof(float));
	for (int oh = 0; oh < d->ho; oh++) {
		for (int ow = 0; ow < d->wo; ow++) {
			int i0, i1, j0, j1;
			size_t o = (size_t)oh * d->wo + ow;
			float m[LANES];
			size_t best[LANES];
			if (!tr_cpu_pool_window(d, oh, ow, &i0, &i1, &j0, &j1)) { /* all padding: -inf, no gradient */
				for (int l = 0; l < LANES && !j->dy; l++)
					j->y[out_at(d, b, o, l)] = -__builtin_inff();
				continue;
			}
			size_t k0 = (size_t)i0 * d->w + j0;
			for (int l = 0; l < LANES; l++) {
				m[l] = xb[k0 * LANES + l];
				best[l] = k0;
			}
			for (int i = i0; i < i1; i++) {
				for (int c = i == i0 ? j0 + 1 : j0; c < j1; c++) {
					size_t k = (size_t)i * d->w + c;
					const float *v = xb + k * LANES;
					for (int l = 0; l < LANES; l++) {
						bool take = v[l] > m[l] || v[l] != v[l]; /* NaN wins */
						m[l] = take ? v[l] : m[l];
						best[l] = take ? k : best[l];
					}
				}
			}
			if (j->dy)
				for (int l = 0; l < LANES; l++)
					dxb[best[l] * LANES + l] += j->dy[out_at(d, b, o, l)];
			else
				for (int l = 0; l < LANES; l++)
					j->y[out_at(d, b, o, l)] = m[l];
		}
	}
}

static int block_task(void *arg, int t, int slot)
{
	const struct block_job *j = arg;
	size_t per = (j->blocks + BLOCK_TASKS - 1) / BLOCK_TASKS;
	(void)slot;
	for (size_t b = (size_t)t * per; b < ((size_t)t + 1) * per && b < j->blocks; b++)
		pool_block(j, b);
	return 0;
}

int tr_cpu_maxpool_blocked(tr_backend_t *be, int dev, const struct tr_pool2d_desc *d, int rows, const float *x,
			   float *y, const float *dy, float *dx)
{
	if (d->c % LANES)
		return tr_cpu_set_error(be, -EINVAL, "maxpool2d: %d channels cannot lie in 16-channel blocks", d->c);
	struct block_job j = {
		.d = d, .blocks = (size_t)rows * (size_t)(d->c / LANES), .x = x, .y = y, .dy = dy, .dx = dx};
	if (j.blocks == 0)
		return 0;
	size_t per = (j.blocks + BLOCK_TASKS - 1) / BLOCK_TASKS;
	return tr_cpu_parallel(be, dev, (int)((j.blocks + per - 1) / per), block_task, &j);
}
