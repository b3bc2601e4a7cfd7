/* The built-in degradations of image-to-image training, as one function
 * that the patches reader, `trainerd degrade` and `trainerd predict
 * --degrade` all call, so a test input made by hand is degraded exactly
 * as the training inputs were (docs/design.md, "Degradations").
 *
 * Images are planar float [C, H, W] on the patches reader's scale, 0..1.
 *   downscale, factor f: bicubic down to ceil(H / f) x ceil(W / f) and back
 *     up to H x W with tr_image_resize (MATLAB's imresize: Keys' cubic,
 *     a = -0.5, antialiased when shrinking, mirrored edges); not clipped.
 *   noise, sigma s: x + s * N(0, 1) per value, not clipped, the normal
 *     draws keyed by (key, value index) so the same key gives the same
 *     noise on any thread.
 */
#ifndef TR_DATA_DEGRADE_H
#define TR_DATA_DEGRADE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/spec.h"

/* dst (c * h * w floats, not src) receives the degraded src.  Returns 0
 * or -ENOMEM. */
int tr_degrade_apply(const struct tr_degrade *d, const float *src, int c, int h, int w, uint64_t key, float *dst);

/* Adds the noise of "noise" degradation to n values in place, value i
 * drawn with counter i. */
void tr_degrade_add_noise(float sigma, uint64_t key, float *x, size_t n);

/* {"type": "downscale", "factor": F} or {"type": "noise", "sigma": S}, as
 * a job spec writes it; NULL for none. */
json_t *tr_degrade_to_json(const struct tr_degrade *d);
/* The reverse: 0, or -EINVAL with the message in msg ("must be an integer
 * in [2, 16]") and the key it is about in *field (NULL: the object). */
int tr_degrade_from_json(const json_t *v, struct tr_degrade *d, const char **field, char *msg, size_t len);

#endif
