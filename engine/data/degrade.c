/* The built-in degradations (degrade.h). */
#include "engine/data/degrade.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/data/image.h"
#include "engine/rng.h"

void tr_degrade_add_noise(float sigma, uint64_t key, float *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		x[i] += sigma * tr_rng_normal(key, i);
}

int tr_degrade_apply(const struct tr_degrade *d, const float *src, int c, int h, int w, uint64_t key, float *dst)
{
	size_t n = (size_t)c * (size_t)h * (size_t)w;
	if (d->type != TR_DEGRADE_DOWNSCALE) {
		memcpy(dst, src, n * sizeof(float));
		if (d->type == TR_DEGRADE_NOISE)
			tr_degrade_add_noise(d->sigma, key, dst, n);
		return 0;
	}
	int dh = (h + d->factor - 1) / d->factor, dw = (w + d->factor - 1) / d->factor;
	float *small = malloc((size_t)c * (size_t)dh * (size_t)dw * sizeof(float));
	int rc = -ENOMEM;
	if (small && tr_image_resize(src, c, h, w, small, dh, dw) == 0 &&
	    tr_image_resize(small, c, dh, dw, dst, h, w) == 0)
		rc = 0;
	free(small);
	return rc;
}

json_t *tr_degrade_to_json(const struct tr_degrade *d)
{
	if (d->type == TR_DEGRADE_DOWNSCALE)
		return json_pack("{sssi}", "type", "downscale", "factor", d->factor);
	if (d->type == TR_DEGRADE_NOISE)
		return json_pack("{sssf}", "type", "noise", "sigma", (double)d->sigma);
	return NULL;
}

int tr_degrade_from_json(const json_t *v, struct tr_degrade *d, const char **field, char *msg, size_t len)
{
	*field = NULL;
	const char *key;
	json_t *val;
	memset(d, 0, sizeof *d);
	if (!json_is_object(v)) {
		snprintf(msg, len,
			 "must be an object such as {\"type\": \"downscale\", \"factor\": 2} or {\"type\": \"noise\", "
			 "\"sigma\": 0.1}");
		return -EINVAL;
	}
	const char *type = json_string_value(json_object_get(v, "type"));
	if (!type || (strcmp(type, "downscale") != 0 && strcmp(type, "noise") != 0)) {
		*field = "type";
		snprintf(msg, len, "must be \"downscale\" or \"noise\"");
		return -EINVAL;
	}
	bool noise = strcmp(type, "noise") == 0;
	json_object_foreach((json_t *)v, key, val) {
		if (strcmp(key, "type") != 0 && strcmp(key, noise ? "sigma" : "factor") != 0) {
			*field = key;
			snprintf(msg, len, "unknown key '%.64s' for a %s degradation", key, type);
			return -EINVAL;
		}
	}
	if (noise) {
		val = json_object_get(v, "sigma");
		double s = json_number_value(val);
		if (!json_is_number(val) || !(s > 0.0) || s > 1.0) {
			*field = "sigma";
			snprintf(msg, len, "is required, a number in (0, 1] (the images' scale is 0..1)");
			return -EINVAL;
		}
		d->type = TR_DEGRADE_NOISE;
		d->sigma = (float)s;
		return 0;
	}
	val = json_object_get(v, "factor");
	d->type = TR_DEGRADE_DOWNSCALE;
	d->factor = 2;
	if (val) {
		if (!json_is_integer(val) || json_integer_value(val) < 2 ||
		    json_integer_value(val) > TR_DEGRADE_MAX_FACTOR) {
			*field = "factor";
			snprintf(msg, len, "must be an integer in [2, %d]", TR_DEGRADE_MAX_FACTOR);
			return -EINVAL;
		}
		d->factor = (int)json_integer_value(val);
	}
	return 0;
}
