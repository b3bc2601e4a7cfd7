/* A fully convolutional model (tr_model_fully_conv) on a whole image of
 * any size, in tiles.
 *
 * The image is cut into tiles of at most `tile` x `tile` pixels that
 * overlap by the model's radius on each side: every output pixel is taken
 * from the one tile whose core holds it, at least `radius` pixels from
 * that tile's edges unless the edge is the image's own, so it sees exactly
 * the pixels (and the image edge's zero padding) a whole-image run would
 * show it, and the seams cannot be seen.  Memory is one batch of tiles,
 * whatever the image's size.  The tiles go through tr_infer_run (the
 * recorded transforms, the devices, the loader threads) with a model built
 * for the tile's shape on the same weights.
 */
#ifndef TR_INFER_TILED_H
#define TR_INFER_TILED_H

#include "core/error.h"
#include "engine/backend.h"
#include "engine/model_meta.h"

#define TR_TILE_DEFAULT 128 /* tile side, overlap included */

struct tr_tiled_options {
	const struct tr_model_desc *desc; /* borrowed: free_hw, with its weights */
	tr_backend_t *backend;            /* borrowed */
	int count;                        /* devices, 0 = all */
	int tile;                         /* tile side, 0 = TR_TILE_DEFAULT; raised to 2 * radius + 16 */
	int batch;                        /* tiles per batch, 0 = 8 */
	int workers;                      /* loader threads, 0 = 2 */
};

/* Runs the model over img, planar [C][h][w] as the model's input before
 * its transforms (C = the model's channels), into out, [K][h][w] (K the
 * model's output channels).  The image must be at least the receptive
 * field (2 * radius + 1) on each side.  Returns 0, -EINVAL (err: the
 * size), or tr_infer_run's error. */
int tr_infer_tiled(const struct tr_tiled_options *o, const float *img, int h, int w, float *out, struct tr_error *err);

/* K of the above: the output channels of a model taking images. */
int tr_infer_tiled_out_channels(const struct tr_model_desc *d);

#endif
