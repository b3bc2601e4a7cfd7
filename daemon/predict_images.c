/* `trainerd predict MODEL IN --out DIR/`: an image-to-image model's
 * outputs as images, one file per input image (docs/design.md,
 * "Image-to-image models").
 *
 * Each image is decoded on the model's recorded pixel scale, checked for
 * its channel count, degraded as in training when asked (--degrade), run
 * whole through the fully convolutional model in tiles (tr_infer_tiled),
 * added back to its input when the model learned the residual, and
 * written under its own name: a PNG of the input's size, 8-bit, values
 * rounded and clipped to 0..255, or with --format npy the float32
 * [K, H, W] on the model's scale, neither rounded nor clipped.  Every file
 * is written under a temporary name and renamed when complete.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/cli.h"
#include "engine/data/degrade.h"
#include "engine/data/image.h"
#include "engine/data/roots.h"
#include "engine/infer_tiled.h"
#include "engine/rng.h"

/* The output file's name: the input's, with .png or .npy for its
 * extension. */
static void out_name(const char *in, bool npy, char *buf, size_t len)
{
	const char *dot = strrchr(in, '.');
	int stem = dot ? (int)(dot - in) : (int)strlen(in);
	snprintf(buf, len, "%.*s.%s", stem, in, npy ? "npy" : "png");
}

static int write_one(const struct tr_predict_images *o, int dir_fd, const char *name, const float *px, int k, int h,
		     int w)
{
	char file[NAME_MAX + 8], tmp[NAME_MAX + 16], shown[PATH_MAX + NAME_MAX + 2];
	struct tr_error err;
	out_name(name, o->npy, file, sizeof file);
	snprintf(tmp, sizeof tmp, ".%s.tmp", file);
	snprintf(shown, sizeof shown, "%s/%s", o->out_dir, file);
	int fd = openat(dir_fd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
	if (!f) {
		fprintf(stderr, "trainerd predict: %s: %s\n", shown, strerror(errno));
		if (fd >= 0)
			close(fd);
		return 1;
	}
	int rc;
	if (o->npy) {
		int64_t shape[3] = {k, h, w};
		size_t n = (size_t)k * (size_t)h * (size_t)w;
		rc = tr_npy_write_header(f, shape, 3) < 0 || fwrite(px, sizeof(float), n, f) != n ? -EIO : 0;
		if (rc < 0)
			snprintf(err.message, sizeof err.message, "%s", strerror(errno));
	} else {
		rc = tr_png_write(f, shown, px, k, h, w, o->desc->pixels.scale, &err);
	}
	if (fclose(f) != 0 && rc == 0) {
		rc = -EIO;
		snprintf(err.message, sizeof err.message, "%s", strerror(errno));
	}
	if (rc == 0 && renameat(dir_fd, tmp, dir_fd, file) < 0) {
		rc = -EIO;
		snprintf(err.message, sizeof err.message, "%s", strerror(errno));
	}
	if (rc < 0) {
		unlinkat(dir_fd, tmp, 0);
		/* tr_png_write's message names the file already */
		fprintf(stderr, "trainerd predict: %s%s%s\n", strstr(err.message, shown) ? "" : shown,
			strstr(err.message, shown) ? "" : ": ", err.message);
		return 1;
	}
	return 0;
}

/* One image: decode, degrade, run, add back, write.  Returns the exit
 * status. */
static int predict_one(const struct tr_predict_images *o, int in_fd, int out_fd, const char *name, int index)
{
	const struct tr_model_desc *d = o->desc;
	char shown[PATH_MAX + NAME_MAX + 2];
	struct tr_error err;
	float *img = NULL, *in = NULL, *out = NULL;
	int w, h, c, status = 2;
	snprintf(shown, sizeof shown, "%s/%s", o->in_dir, name);
	if (tr_image_load(in_fd, name, shown, d->pixels.scale, &img, &w, &h, &c, &err) < 0) {
		fprintf(stderr, "trainerd predict: %s\n", err.message);
		goto out;
	}
	if (c != d->pixels.channels) {
		fprintf(stderr, "trainerd predict: %s: %d channel%s, the model takes %d\n", shown, c, c == 1 ? "" : "s",
			d->pixels.channels);
		goto out;
	}
	int k = tr_infer_tiled_out_channels(d);
	size_t n = (size_t)c * (size_t)h * (size_t)w;
	in = img;
	if (o->degrade) {
		/* The noise of image `index`, the same on every run. */
		in = malloc(n * sizeof(float));
		if (!in || tr_degrade_apply(&d->pixels.degrade, img, c, h, w,
					    tr_rng_key(d->spec.seed, 0, (uint64_t)index, TR_RNG_NOISE), in) < 0) {
			fprintf(stderr, "trainerd predict: %s: out of memory\n", shown);
			status = 1;
			goto out;
		}
	}
	out = malloc((size_t)k * (size_t)h * (size_t)w * sizeof(float));
	if (!out) {
		fprintf(stderr, "trainerd predict: %s: out of memory\n", shown);
		status = 1;
		goto out;
	}
	struct tr_tiled_options to = {.desc = d,
				      .backend = o->backend,
				      .count = o->devices,
				      .tile = o->tile,
				      .batch = o->batch,
				      .workers = o->workers};
	int rc = tr_infer_tiled(&to, in, h, w, out, &err);
	if (rc < 0) {
		fprintf(stderr, "trainerd predict: %s: %s\n", shown, err.message);
		status = rc == -EINVAL ? 2 : 1;
		goto out;
	}
	if (d->pixels.residual) /* k == c, checked before the first image */
		for (size_t i = 0; i < n; i++)
			out[i] += in[i];
	status = write_one(o, out_fd, name, out, k, h, w);
out:
	if (in != img)
		free(in);
	free(img);
	free(out);
	return status;
}

int tr_predict_images_run(const struct tr_predict_images *o)
{
	const struct tr_model_desc *d = o->desc;
	struct tr_error err;
	int k = tr_infer_tiled_out_channels(d);
	if (d->pixels.residual && k != d->pixels.channels) {
		fprintf(stderr,
			"trainerd predict: the model gives %d channels, its %d-channel input cannot be added back\n", k,
			d->pixels.channels);
		return 2;
	}
	if (o->degrade && d->pixels.degrade.type == TR_DEGRADE_NONE) {
		fprintf(stderr, "trainerd predict: --degrade: the model records no degradation (it was trained on "
				"input_path and response_path pairs)\n");
		return 2;
	}
	int in_fd = open(o->in_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (in_fd < 0) {
		fprintf(stderr, "trainerd predict: %s: %s\n", o->in_dir, strerror(errno));
		return 2;
	}
	char **names = NULL;
	int n = 0, status = 2;
	if (o->one_file) {
		names = malloc(sizeof *names);
		if (names && (names[0] = strdup(o->one_file)))
			n = 1;
	} else if (tr_image_list(in_fd, o->in_dir, 0, &names, &n, &err) < 0) {
		fprintf(stderr, "trainerd predict: %s\n", err.message);
		goto out;
	}
	if (n == 0) {
		fprintf(stderr, "trainerd predict: %s: no .png or .jpg files\n", o->in_dir);
		goto out;
	}
	if (mkdir(o->out_dir, 0755) < 0 && errno != EEXIST) {
		fprintf(stderr, "trainerd predict: --out %s: %s\n", o->out_dir, strerror(errno));
		goto out;
	}
	int out_fd = open(o->out_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	struct stat a, b;
	if (out_fd < 0) {
		fprintf(stderr, "trainerd predict: --out %s: %s\n", o->out_dir, strerror(errno));
		goto out;
	}
	if (fstat(in_fd, &a) == 0 && fstat(out_fd, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
		fprintf(stderr,
			"trainerd predict: --out %s is the input folder: the outputs would replace the inputs\n",
			o->out_dir);
		close(out_fd);
		goto out;
	}
	status = 0;
	for (int i = 0; i < n && status == 0; i++)
		status = predict_one(o, in_fd, out_fd, names[i], i);
	close(out_fd);
out:
	tr_image_names_free(names, n);
	close(in_fd);
	return status;
}
