/* The "patches" reader: random patches of images for image-to-image
 * regression, as MATLAB's randomPatchExtractionDatastore.
 *
 * Pairs come from two folders (input_path, response_path: files of the
 * same names and sizes) or from one folder and a built-in degradation
 * (degrade.h): "downscale" by a factor, bicubic down and up again, or
 * "noise", Gaussian noise of a given sigma, the input
 * being the degraded image and the response the clean one, or the
 * residual (response minus input) with "response": "residual", as VDSR
 * learns it.  Values are scaled to [0, 1], input and response alike, so no
 * transform has to reach the target.
 *
 * Every image is decoded (and degraded) once at open, into memory: the
 * data sets this is for are tens of large images, and a patch cut from a
 * 512x512 image would otherwise cost a decode of the whole file.  The
 * loader threads then only cut: sample s is a patch of image
 * s / patches_per_image, at a position drawn from the counter-based
 * generator keyed by (seed, epoch, s), so an epoch's batches are the same
 * bytes for any number of loaders or devices and after a resume, and every
 * epoch sees new positions.  Evaluation reads epoch 0's positions.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/data/degrade.h"
#include "engine/data/image.h"
#include "engine/data/reader_internal.h"
#include "engine/memory.h"
#include "engine/rng.h"

/* Decoded images held in memory, input and response together. */
#define MAX_FLOATS ((int64_t)1 << 30) /* 4 GiB */

struct pimage {
	int w, h;
	float *input, *response; /* planar [c][h][w] in [0, 1] */
};

struct patches_reader {
	tr_reader_t base;
	uint64_t seed;
	int c, ph, pw, per_image;
	bool residual;
	float noise; /* "noise" degradation's sigma, 0 without */
	int n;
	struct pimage *img;
	uint64_t mem_available;     /* at open: what the decoded images may take */
	char first[PATH_MAX + 256]; /* the first image, named beside an odd one */
};

static int patches_get_epoch(tr_reader_t *r, int64_t index, int64_t epoch, float *x, float *y, struct tr_error *err)
{
	struct patches_reader *d = (struct patches_reader *)r;
	const struct pimage *im;
	uint64_t key;
	int top, left;

	if (index < 0 || index >= r->info.samples) {
		tr_error_set(err, 0, 0, NULL, "%s: sample %lld out of range (%lld samples)", r->name, (long long)index,
			     (long long)r->info.samples);
		return -ERANGE;
	}
	im = &d->img[index / d->per_image];
	key = tr_rng_key(d->seed, (uint64_t)epoch, (uint64_t)index, TR_RNG_PATCH);
	top = (int)tr_rng_below(key, 0, (uint64_t)(im->h - d->ph + 1));
	left = (int)tr_rng_below(key, 1, (uint64_t)(im->w - d->pw + 1));
	for (int c = 0; c < d->c; c++) {
		for (int yy = 0; yy < d->ph; yy++) {
			size_t from = ((size_t)c * im->h + (size_t)(top + yy)) * im->w + (size_t)left;
			size_t to = ((size_t)c * d->ph + yy) * d->pw;

			memcpy(x + to, im->input + from, (size_t)d->pw * sizeof(float));
			if (y)
				memcpy(y + to, im->response + from, (size_t)d->pw * sizeof(float));
		}
	}
	size_t n = (size_t)d->c * (size_t)d->ph * (size_t)d->pw;
	if (d->noise > 0.0f)
		tr_degrade_add_noise(d->noise, tr_rng_key(d->seed, (uint64_t)epoch, (uint64_t)index, TR_RNG_NOISE), x,
				     n);
	for (size_t k = 0; y && d->residual && k < n; k++)
		y[k] -= x[k];
	return 0;
}

static int patches_get(tr_reader_t *r, int64_t index, float *x, float *y, struct tr_error *err)
{
	return patches_get_epoch(r, index, 0, x, y, err);
}

static void patches_destroy(tr_reader_t *r)
{
	struct patches_reader *d = (struct patches_reader *)r;

	for (int i = 0; d->img && i < d->n; i++) {
		if (d->img[i].response != d->img[i].input)
			free(d->img[i].response);
		free(d->img[i].input);
	}
	free(d->img);
	free(d);
}

static const struct tr_reader_i patches_i = {
	.get = patches_get,
	.destroy = patches_destroy,
	.get_epoch = patches_get_epoch,
};

/* The built-in downscale of one clean image, as its input; noise is drawn
 * per patch (patches_get_epoch), so its input is the clean image. */
static int degrade(struct pimage *im, int c, const struct tr_degrade *how, const char *shown, struct tr_error *err)
{
	if (how->type != TR_DEGRADE_DOWNSCALE) {
		im->input = im->response;
		return 0;
	}
	im->input = malloc((size_t)c * im->h * im->w * sizeof(float));
	if (!im->input || tr_degrade_apply(how, im->response, c, im->h, im->w, 0, im->input) < 0) {
		tr_error_set(err, 0, 0, NULL, "%s: out of memory", shown);
		return -ENOMEM;
	}
	return 0;
}

/* Loads image i (file `name`) into d->img[i]. */
static int load_one(struct patches_reader *d, const struct tr_source_spec *src, int i, const char *name, int in_fd,
		    const char *in_dir, int resp_fd, const char *resp_dir, int64_t *floats, struct tr_error *err)
{
	struct pimage *im = &d->img[i];
	char shown[PATH_MAX + 256];
	int w, h, c, ret;

	snprintf(shown, sizeof shown, "%s/%s", resp_fd >= 0 ? resp_dir : in_dir, name);
	ret = tr_image_load(resp_fd >= 0 ? resp_fd : in_fd, name, shown, 1.0f / 255.0f, &im->response, &im->w, &im->h,
			    &c, err);
	if (ret)
		return ret;
	if (i == 0) {
		d->c = c;
		snprintf(d->first, sizeof d->first, "%s", shown);
	}
	if (c != d->c) {
		tr_error_set(err, 0, 0, NULL,
			     "%s: %d channel%s, the first image %s has %d (grey and colour images cannot be mixed: "
			     "convert them to one kind)",
			     shown, c, c == 1 ? "" : "s", d->first, d->c);
		return -EINVAL;
	}
	if (im->h < d->ph || im->w < d->pw) {
		tr_error_set(err, 0, 0, NULL, "%s: %dx%d is smaller than the %dx%d patch_size", shown, im->w, im->h,
			     d->pw, d->ph);
		return -EINVAL;
	}
	*floats += 2 * (int64_t)c * im->h * im->w;
	/* The decoded images stay in memory: admitted against the memory
	 * there was at open (engine/memory.h) as they are decoded. */
	if ((uint64_t)*floats * sizeof(float) > d->mem_available) {
		tr_error_set(err, 0, 0, NULL,
			     "%s: the images decoded so far need %lld MiB, more than the %llu MiB of memory available "
			     "(patches holds them in memory)",
			     shown, (long long)(*floats * 4 >> 20), (unsigned long long)(d->mem_available >> 20));
		return -ENOMEM;
	}
	if (*floats > MAX_FLOATS) {
		tr_error_set(err, 0, 0, NULL,
			     "%s: the images decoded so far exceed %lld MiB (patches holds them in memory)", shown,
			     (long long)(MAX_FLOATS * 4 >> 20));
		return -E2BIG;
	}
	if (resp_fd < 0)
		return degrade(im, c, &src->degrade, shown, err);
	snprintf(shown, sizeof shown, "%s/%s", in_dir, name);
	ret = tr_image_load(in_fd, name, shown, 1.0f / 255.0f, &im->input, &w, &h, &c, err);
	if (ret)
		return ret;
	if (w != im->w || h != im->h || c != d->c) {
		tr_error_set(err, 0, 0, NULL, "%s: %dx%d with %d channel%s, its response %s/%s is %dx%d with %d", shown,
			     w, h, c, c == 1 ? "" : "s", resp_dir, name, im->w, im->h, d->c);
		return -EINVAL;
	}
	return 0;
}

int tr_patches_open(const struct tr_source_spec *src, int input_fd, const char *input_name, int response_fd,
		    const char *response_name, const atomic_bool *cancel, tr_reader_t **out, struct tr_error *err)
{
	struct patches_reader *d = calloc(1, sizeof(*d));
	char **names = NULL, **rnames = NULL;
	int n = 0, rn = 0, ret;
	int64_t floats = 0;

	if (!d) {
		tr_error_set(err, 0, 0, NULL, "%s: out of memory", input_name);
		ret = -ENOMEM;
		goto fail;
	}
	d->base.i = &patches_i;
	d->mem_available = tr_mem_available(NULL);
	snprintf(d->base.name, sizeof d->base.name, "%s", input_name);
	d->seed = src->data_seed;
	d->ph = src->patch_size[0];
	d->pw = src->patch_size[1] ? src->patch_size[1] : src->patch_size[0];
	d->per_image = src->patches_per_image > 0 ? src->patches_per_image : 1;
	d->residual = src->residual;
	d->noise = response_fd < 0 && src->degrade.type == TR_DEGRADE_NOISE ? src->degrade.sigma : 0.0f;
	if (d->ph < 1 || d->pw < 1 || (response_fd < 0 && src->degrade.type == TR_DEGRADE_NONE)) {
		tr_error_set(err, 0, 0, NULL,
			     "%s: patches needs a patch_size (and a degrade factor without "
			     "response_path)",
			     input_name);
		ret = -EINVAL;
		goto fail;
	}
	ret = tr_image_list(input_fd, input_name, 0, &names, &n, err);
	if (ret)
		goto fail;
	if (n == 0) {
		tr_error_set(err, 0, 0, NULL, "%s: no .png or .jpg files", input_name);
		ret = -EINVAL;
		goto fail;
	}
	if (response_fd >= 0) {
		ret = tr_image_list(response_fd, response_name, 0, &rnames, &rn, err);
		if (ret)
			goto fail;
		for (int i = 0; i < n || i < rn; i++) {
			if (i >= n || i >= rn || strcmp(names[i], rnames[i]) != 0) {
				tr_error_set(err, 0, 0, NULL,
					     "%s/%s has no file of the same name in %s (input and response files "
					     "pair by name)",
					     i < n ? input_name : response_name, i < n ? names[i] : rnames[i],
					     i < n ? response_name : input_name);
				ret = -EINVAL;
				goto fail;
			}
		}
	}
	d->img = calloc((size_t)(unsigned)n, sizeof(*d->img));
	if (!d->img) {
		tr_error_set(err, 0, 0, NULL, "%s: out of memory", input_name);
		ret = -ENOMEM;
		goto fail;
	}
	d->n = n;
	for (int i = 0; i < n; i++) {
		if (cancel && atomic_load_explicit(cancel, memory_order_relaxed)) {
			tr_error_set(err, 0, 0, NULL, "cancelled");
			ret = -ECANCELED;
			goto fail;
		}
		ret = load_one(d, src, i, names[i], input_fd, input_name, response_fd, response_name, &floats, err);
		if (ret)
			goto fail;
	}
	if ((int64_t)d->c * d->ph * d->pw > TR_SPEC_MAX_WIDTH) {
		tr_error_set(err, 0, 0, NULL, "%s: %dx%dx%d values per patch, at most %d", input_name, d->c, d->ph,
			     d->pw, TR_SPEC_MAX_WIDTH);
		ret = -E2BIG;
		goto fail;
	}
	if ((int64_t)n * d->per_image > TR_SPEC_MAX_SAMPLES) {
		tr_error_set(err, 0, 0, NULL, "%s: %d images x %d patches_per_image is too many samples", input_name, n,
			     d->per_image);
		ret = -E2BIG;
		goto fail;
	}
	d->base.info.samples = (int64_t)n * d->per_image;
	d->base.resident_bytes = floats * (int64_t)sizeof(float);
	d->base.info.features = d->c * d->ph * d->pw;
	d->base.info.label_dim = d->base.info.features;
	d->base.info.shape[0] = d->base.info.label_shape[0] = d->c;
	d->base.info.shape[1] = d->base.info.label_shape[1] = d->ph;
	d->base.info.shape[2] = d->base.info.label_shape[2] = d->pw;
	tr_image_names_free(names, n);
	tr_image_names_free(rnames, rn);
	close(input_fd);
	if (response_fd >= 0)
		close(response_fd);
	*out = &d->base;
	return 0;
fail:
	tr_image_names_free(names, n);
	tr_image_names_free(rnames, rn);
	close(input_fd);
	if (response_fd >= 0)
		close(response_fd);
	if (d)
		patches_destroy(&d->base);
	return ret;
}
