/* The "images" reader: a folder of PNG or JPEG files, one subfolder per class
 * (labels "folders", as torchvision's ImageFolder): class k is the k-th
 * subfolder in sorted order, and the samples are the classes' files in
 * that order.  Subfolders' names are kept (tr_images_class_name) so a job
 * can say which class an index means.
 *
 * At open every file's header is read (size and channel count), so a
 * file that is not a PNG or JPEG, a channel count unlike the others' or a size
 * the spec cannot make uniform fails the job before its first step, naming
 * the file.  The pixels are decoded later, by the loader threads, one
 * sample per get: file, decode, optional resize (bicubic, image.h) and
 * center crop, planar float [C, H, W] with values 0..255 (a "scale" or
 * "normalize" transform makes them what the model wants).  A file that is
 * truncated or changed since open fails the step, and with it the job,
 * with the file named.  Only the class folders' descriptors stay open.
 *
 * Prediction inputs (tr_source_spec.unlabeled) may also be a flat folder
 * of images, read in sorted name order; class subfolders' labels are then
 * dropped.  With want_shape (a model's input) every image must come out as
 * that shape, and the message names the file and both shapes; with
 * pixel_scale (a model's recorded scale) the values are 0..255 times it.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/data/image.h"
#include "engine/data/reader_internal.h"

#define MAX_CLASSES 65536

struct item {
	int cls;
	char *name;
};

struct images_reader {
	tr_reader_t base;
	char dir[PATH_MAX];
	int n_classes;
	char **classes;
	int *class_fd;
	struct item *items;
	int c, h, w;   /* the output shape */
	int resize[2]; /* as the spec */
	int crop[2];
	int want[3];                /* tr_source_spec.want_shape, all 0: none */
	bool flat;                  /* the images lie in the folder itself */
	int64_t max_values;         /* width x height x channels of the largest file */
	float scale;                /* tr_source_spec.pixel_scale, 1 by default */
	char first[PATH_MAX + 512]; /* the first image, named beside an odd one */
};

static void shown_name(const struct images_reader *d, const struct item *it, char *buf, size_t len)
{
	if (d->flat)
		snprintf(buf, len, "%s/%s", d->dir, it->name);
	else
		snprintf(buf, len, "%s/%s/%s", d->dir, d->classes[it->cls], it->name);
}

/* The size an image of h x w has after the resize. */
static void resized(const struct images_reader *d, int h, int w, int *oh, int *ow)
{
	if (d->resize[0] && d->resize[1]) {
		*oh = d->resize[0];
		*ow = d->resize[1];
	} else if (d->resize[0]) {
		/* The shorter side to resize[0], the other in proportion. */
		int s = d->resize[0];

		if (h <= w) {
			*oh = s;
			*ow = (int)((int64_t)w * s / h);
		} else {
			*ow = s;
			*oh = (int)((int64_t)h * s / w);
		}
		if (*oh < 1)
			*oh = 1;
		if (*ow < 1)
			*ow = 1;
	} else {
		*oh = h;
		*ow = w;
	}
}

/* Checks that an image of h x w and c channels gives the output shape. */
static int check_size(const struct images_reader *d, const char *shown, int h, int w, int c, struct tr_error *err)
{
	int oh, ow;

	if (d->want[0]) {
		int fh, fw;

		resized(d, h, w, &oh, &ow);
		if (d->crop[0] && (oh < d->crop[0] || ow < d->crop[1])) {
			tr_error_set(err, 0, 0, NULL, "%s: %dx%d (after resize) is smaller than center_crop %dx%d",
				     shown, ow, oh, d->crop[1], d->crop[0]);
			return -EINVAL;
		}
		fh = d->crop[0] ? d->crop[0] : oh;
		fw = d->crop[0] ? d->crop[1] : ow;
		if (c != d->want[0] || fh != d->want[1] || fw != d->want[2]) {
			tr_error_set(err, 0, 0, NULL, "%s: [%d, %d, %d]%s, the model takes [%d, %d, %d]", shown, c, fh,
				     fw,
				     d->crop[0]
					     ? (d->resize[0] ? " after resize and center_crop" : " after center_crop")
				     : d->resize[0] ? " after resize"
						    : "",
				     d->want[0], d->want[1], d->want[2]);
			return -EINVAL;
		}
		return 0;
	}
	if (c != d->c) {
		tr_error_set(err, 0, 0, NULL,
			     "%s: %d channel%s, the first image %s has %d (grey and colour images cannot be mixed: "
			     "convert them to one kind)",
			     shown, c, c == 1 ? "" : "s", d->first, d->c);
		return -EINVAL;
	}
	resized(d, h, w, &oh, &ow);
	if (d->crop[0]) {
		if (oh < d->crop[0] || ow < d->crop[1]) {
			tr_error_set(err, 0, 0, NULL, "%s: %dx%d (after resize) is smaller than center_crop %dx%d",
				     shown, ow, oh, d->crop[1], d->crop[0]);
			return -EINVAL;
		}
	} else if (oh != d->h || ow != d->w) {
		tr_error_set(err, 0, 0, NULL,
			     "%s: %dx%d, the first image is %dx%d (images of different sizes need resize or "
			     "center_crop)",
			     shown, ow, oh, d->w, d->h);
		return -EINVAL;
	}
	return 0;
}

/* One get as its rows arrive (tr_image_decode_rows): each row becomes
 * planar floats; with a resize they go through the streaming resampler
 * (only the window of rows its taps reach is held, never the image), else
 * the rows inside the centre crop are copied straight into the sample. */
struct get_rows {
	const struct images_reader *d;
	const char *shown;
	float *x;
	int w, h, c, oh, ow, top, left, y;
	tr_resize_stream_t *stream;
	float *full; /* [c][h][w] where the taps cannot stream (then resized whole) */
	float *row;  /* [c][w] without a resize */
};

static int get_start(void *ctx, int w, int h, int c, struct tr_error *err)
{
	struct get_rows *g = ctx;
	int ret;

	/* The file may have been replaced since open. */
	if ((ret = check_size(g->d, g->shown, h, w, c, err)) < 0)
		return ret;
	g->w = w, g->h = h, g->c = c;
	resized(g->d, h, w, &g->oh, &g->ow);
	/* torchvision's center crop: offsets rounded to nearest. */
	g->top = (int)lround((g->oh - g->d->h) / 2.0);
	g->left = (int)lround((g->ow - g->d->w) / 2.0);
	ret = 0;
	if (g->oh != h || g->ow != w) {
		ret = tr_resize_stream_create(c, h, w, g->oh, g->ow, &g->stream);
		if (ret == -ENOTSUP) {
			g->full = malloc((size_t)c * (size_t)h * (size_t)w * sizeof(float));
			ret = g->full ? 0 : -ENOMEM;
		}
	} else if (!(g->row = malloc((size_t)c * (size_t)w * sizeof(float)))) {
		ret = -ENOMEM;
	}
	if (ret < 0)
		tr_error_set(err, 0, 0, NULL, "%s: out of memory", g->shown);
	return ret;
}

static int get_row(void *ctx, const unsigned char *px, struct tr_error *err)
{
	struct get_rows *g = ctx;
	const struct images_reader *d = g->d;
	size_t w = (size_t)g->w;

	(void)err;
	for (int ch = 0; ch < g->c; ch++) {
		float *o = g->full     ? g->full + ((size_t)ch * (size_t)g->h + (size_t)g->y) * w
			   : g->stream ? tr_resize_stream_slot(g->stream) + (size_t)ch * w
				       : g->row + (size_t)ch * w;

		for (size_t i = 0; i < w; i++)
			o[i] = (float)px[i * (size_t)g->c + (size_t)ch] * d->scale;
	}
	if (g->stream) {
		tr_resize_stream_push(g->stream);
	} else if (!g->full && g->y >= g->top && g->y < g->top + d->h) {
		for (int ch = 0; ch < g->c; ch++)
			memcpy(g->x + ((size_t)ch * d->h + (size_t)(g->y - g->top)) * d->w,
			       g->row + (size_t)ch * w + g->left, (size_t)d->w * sizeof(float));
	}
	g->y++;
	return 0;
}

static int images_get(tr_reader_t *r, int64_t index, float *x, float *y, struct tr_error *err)
{
	struct images_reader *d = (struct images_reader *)r;
	const struct item *it;
	char shown[PATH_MAX + 512];
	struct get_rows g = {.d = d, .shown = shown, .x = x};
	const struct tr_image_rows cb = {.start = get_start, .row = get_row, .ctx = &g};
	float *rs = NULL;
	int fd, ret;

	if (index < 0 || index >= r->info.samples) {
		tr_error_set(err, 0, 0, NULL, "%s: sample %lld out of range (%lld samples)", r->name, (long long)index,
			     (long long)r->info.samples);
		return -ERANGE;
	}
	it = &d->items[index];
	shown_name(d, it, shown, sizeof shown);
	fd = tr_image_open_in(d->class_fd[it->cls], it->name, shown, err);
	if (fd < 0)
		return fd;
	ret = tr_image_decode_rows(fd, shown, &cb, err);
	if (ret)
		goto out;
	if (g.stream || g.full) {
		/* The resized image [c][oh][ow], then its centre crop. */
		rs = malloc((size_t)g.c * (size_t)g.oh * (size_t)g.ow * sizeof(float));
		if (!rs || (g.full && tr_image_resize(g.full, g.c, g.h, g.w, rs, g.oh, g.ow))) {
			tr_error_set(err, 0, 0, NULL, "%s: out of memory", shown);
			ret = -ENOMEM;
			goto out;
		}
		if (g.stream)
			tr_resize_stream_finish(g.stream, rs);
		for (int ch = 0; ch < g.c; ch++)
			for (int yy = 0; yy < d->h; yy++)
				memcpy(x + ((size_t)ch * d->h + yy) * d->w,
				       rs + ((size_t)ch * g.oh + g.top + yy) * g.ow + g.left,
				       (size_t)d->w * sizeof(float));
	}
	if (y && r->info.label_dim) /* prediction inputs have no labels */
		y[0] = (float)it->cls;
out:
	tr_resize_stream_destroy(g.stream);
	free(g.full);
	free(g.row);
	free(rs);
	return ret;
}

static int images_labels(tr_reader_t *r, int64_t begin, int64_t count, float *y, struct tr_error *err)
{
	struct images_reader *d = (struct images_reader *)r;

	if (begin < 0 || count < 0 || begin + count > r->info.samples) {
		tr_error_set(err, 0, 0, NULL, "%s: samples %lld+%lld out of range (%lld samples)", r->name,
			     (long long)begin, (long long)count, (long long)r->info.samples);
		return -ERANGE;
	}
	for (int64_t i = 0; i < count; i++)
		y[i] = (float)d->items[begin + i].cls;
	return 0;
}

static void images_where(tr_reader_t *r, int64_t index, char *buf, size_t len)
{
	struct images_reader *d = (struct images_reader *)r;

	if (index >= 0 && index < r->info.samples)
		shown_name(d, &d->items[index], buf, len);
	else
		snprintf(buf, len, "%s: sample %lld", r->name, (long long)index);
}

static void images_destroy(tr_reader_t *r)
{
	struct images_reader *d = (struct images_reader *)r;

	for (int k = 0; d->class_fd && k < d->n_classes; k++)
		if (d->class_fd[k] >= 0)
			close(d->class_fd[k]);
	for (int64_t i = 0; d->items && i < r->info.samples; i++)
		free(d->items[i].name);
	free(d->items);
	free(d->class_fd);
	tr_image_names_free(d->classes, d->n_classes);
	free(d);
}

static const char *images_class_name(tr_reader_t *r, int k);

static int images_sample_name(tr_reader_t *r, int64_t index, char *buf, size_t len)
{
	struct images_reader *d = (struct images_reader *)r;
	const struct item *it;

	if (index < 0 || index >= r->info.samples)
		return -1;
	it = &d->items[index];
	if (d->flat)
		snprintf(buf, len, "%s", it->name);
	else
		snprintf(buf, len, "%s/%s", d->classes[it->cls], it->name);
	return 0;
}

static const struct tr_reader_i images_i = {
	.get = images_get,
	.destroy = images_destroy,
	.labels = images_labels,
	.where = images_where,
	.class_name = images_class_name,
	.sample_name = images_sample_name,
};

static const char *images_class_name(tr_reader_t *r, int k)
{
	const struct images_reader *d = (const struct images_reader *)r;

	return !d->flat && k >= 0 && k < d->n_classes ? d->classes[k] : NULL;
}

const char *tr_images_class_name(const tr_reader_t *r, int k)
{
	return r->i->class_name ? r->i->class_name((tr_reader_t *)r, k) : NULL;
}

/* Reads the header of every file of class k, appending its items. */
static int probe_class(struct images_reader *d, int k, char **files, int n, int64_t *count, const atomic_bool *cancel,
		       struct tr_error *err)
{
	for (int i = 0; i < n; i++) {
		struct item it = {.cls = k, .name = files[i]};
		char shown[PATH_MAX + 512];
		struct tr_error msg;
		int fd, w, h, c, ret;

		if (cancel && (i & 255) == 0 && atomic_load_explicit(cancel, memory_order_relaxed)) {
			tr_error_set(err, 0, 0, NULL, "cancelled");
			return -ECANCELED;
		}
		shown_name(d, &it, shown, sizeof shown);
		fd = tr_data_open_in(d->class_fd[k], files[i], 0, NULL, &msg);
		if (fd < 0) {
			tr_error_set(err, 0, 0, NULL, "%s: %s", shown, strerror(-fd));
			return fd;
		}
		ret = tr_image_probe(fd, shown, &w, &h, &c, err);
		if (ret)
			return ret;
		if (*count == 0 && !d->want[0]) {
			/* The first image fixes the channels, and the size unless a
			 * crop or a fixed resize does. */
			d->c = c;
			snprintf(d->first, sizeof d->first, "%s", shown);
			resized(d, h, w, &d->h, &d->w);
			if (d->crop[0]) {
				d->h = d->crop[0];
				d->w = d->crop[1];
			}
		}
		ret = check_size(d, shown, h, w, c, err);
		if (ret)
			return ret;
		if ((int64_t)w * h * c > d->max_values)
			d->max_values = (int64_t)w * h * c;
		d->items[*count] = it;
		files[i] = NULL; /* the item owns it now */
		(*count)++;
	}
	return 0;
}

int tr_images_open(const struct tr_source_spec *src, int dir_fd, const char *dir_name, const atomic_bool *cancel,
		   tr_reader_t **out, struct tr_error *err)
{
	struct images_reader *d = calloc(1, sizeof(*d));
	char **files = NULL;
	int n_files = 0, ret;
	int64_t count = 0, total = 0;

	if (!d) {
		close(dir_fd);
		tr_error_set(err, 0, 0, NULL, "%s: out of memory", dir_name);
		return -ENOMEM;
	}
	d->base.i = &images_i;
	snprintf(d->dir, sizeof d->dir, "%s", dir_name);
	snprintf(d->base.name, sizeof d->base.name, "%s", dir_name);
	memcpy(d->resize, src->resize, sizeof d->resize);
	memcpy(d->crop, src->center_crop, sizeof d->crop);
	memcpy(d->want, src->want_shape, sizeof d->want);
	d->scale = src->pixel_scale > 0.0f ? src->pixel_scale : 1.0f;
	if (d->want[0]) {
		d->c = d->want[0];
		d->h = d->want[1];
		d->w = d->want[2];
		if (d->crop[0] && (d->crop[0] != d->h || d->crop[1] != d->w)) {
			tr_error_set(err, 0, 0, NULL, "%s: center_crop [%d, %d] does not give the model's [%d, %d, %d]",
				     dir_name, d->crop[0], d->crop[1], d->c, d->h, d->w);
			ret = -EINVAL;
			goto fail;
		}
	}
	if (d->resize[0] && !d->resize[1] && !d->crop[0]) {
		tr_error_set(err, 0, 0, NULL,
			     "%s: resize to a shorter side keeps each image's aspect ratio: give center_crop too, "
			     "or resize to [height, width]",
			     dir_name);
		ret = -EINVAL;
		goto fail;
	}
	ret = tr_image_list(dir_fd, dir_name, 1, &d->classes, &d->n_classes, err);
	if (ret)
		goto fail;
	if (src->unlabeled) {
		ret = tr_image_list(dir_fd, dir_name, 0, &files, &n_files, err);
		if (ret)
			goto fail;
		if (n_files > 0 && d->n_classes > 0) {
			tr_error_set(err, 0, 0, NULL,
				     "%s: has both image files (%s) and subfolders (%s): give a flat folder of images "
				     "or one subfolder per class",
				     dir_name, files[0], d->classes[0]);
			ret = -EINVAL;
			goto fail;
		}
		if (n_files > 0) {
			/* A flat folder: one unnamed "class", the folder itself. */
			tr_image_names_free(d->classes, d->n_classes);
			d->flat = true;
			d->n_classes = 1;
			d->classes = calloc(1, sizeof(*d->classes));
			d->class_fd = malloc(sizeof(int));
			if (d->class_fd)
				d->class_fd[0] = -1;
			if (!d->classes || !d->class_fd || !(d->classes[0] = strdup("")))
				goto oom;
			d->class_fd[0] = dup(dir_fd);
			if (d->class_fd[0] < 0) {
				ret = -errno;
				tr_error_set(err, 0, 0, NULL, "%s: %s", dir_name, strerror(errno));
				goto fail;
			}
			d->items = malloc((size_t)n_files * sizeof(*d->items));
			if (!d->items)
				goto oom;
			ret = probe_class(d, 0, files, n_files, &count, cancel, err);
			d->base.info.samples = count;
			tr_image_names_free(files, n_files);
			files = NULL;
			n_files = 0;
			if (ret)
				goto fail;
			goto done;
		}
		tr_image_names_free(files, n_files);
		files = NULL;
		n_files = 0;
		if (d->n_classes == 0) {
			tr_error_set(err, 0, 0, NULL, "%s: no .png or .jpg files, nor subfolders with them", dir_name);
			ret = -EINVAL;
			goto fail;
		}
	}
	if (d->n_classes == 0) {
		tr_error_set(err, 0, 0, NULL,
			     "%s: no class subfolders (labels \"folders\" takes one subfolder per class)", dir_name);
		ret = -EINVAL;
		goto fail;
	}
	if (d->n_classes > MAX_CLASSES) {
		tr_error_set(err, 0, 0, NULL, "%s: %d class subfolders, at most %d", dir_name, d->n_classes,
			     MAX_CLASSES);
		ret = -E2BIG;
		goto fail;
	}
	d->class_fd = malloc((size_t)d->n_classes * sizeof(int));
	if (!d->class_fd)
		goto oom;
	for (int k = 0; k < d->n_classes; k++)
		d->class_fd[k] = -1;
	for (int k = 0; k < d->n_classes; k++) {
		struct tr_error msg;
		struct item *ni;

		d->class_fd[k] = tr_data_open_in(dir_fd, d->classes[k], 1, NULL, &msg);
		if (d->class_fd[k] < 0) {
			ret = d->class_fd[k];
			tr_error_set(err, 0, 0, NULL, "%s/%s: %s", dir_name, d->classes[k], strerror(-ret));
			goto fail;
		}
		ret = tr_image_list(d->class_fd[k], d->classes[k], 0, &files, &n_files, err);
		if (ret)
			goto fail;
		total += n_files;
		ni = realloc(d->items, (size_t)(total ? total : 1) * sizeof(*ni));
		if (!ni)
			goto oom;
		d->items = ni;
		/* samples counts the items owned so far, for destroy. */
		ret = probe_class(d, k, files, n_files, &count, cancel, err);
		d->base.info.samples = count;
		tr_image_names_free(files, n_files);
		files = NULL;
		if (ret)
			goto fail;
	}
done:
	if (count == 0) {
		tr_error_set(err, 0, 0, NULL, "%s: no .png or .jpg files in its class subfolders", dir_name);
		ret = -EINVAL;
		goto fail;
	}
	if ((int64_t)d->c * d->h * d->w > TR_SPEC_MAX_WIDTH) {
		tr_error_set(err, 0, 0, NULL, "%s: %dx%dx%d values per image, at most %d", dir_name, d->c, d->h, d->w,
			     TR_SPEC_MAX_WIDTH);
		ret = -E2BIG;
		goto fail;
	}
	close(dir_fd);
	d->base.info.samples = count;
	d->base.info.features = d->c * d->h * d->w;
	d->base.info.label_dim = src->unlabeled ? 0 : 1;
	/* One get of the largest image (images_get): rows stream through the
	 * resize, so this is an upper bound (its float copy where the taps
	 * cannot stream, the resize's intermediate and result). */
	d->base.get_scratch_bytes = d->max_values * 13 + (int64_t)d->base.info.features * 4;
	d->base.info.shape[0] = d->c;
	d->base.info.shape[1] = d->h;
	d->base.info.shape[2] = d->w;
	*out = &d->base;
	return 0;
oom:
	tr_error_set(err, 0, 0, NULL, "%s: out of memory", dir_name);
	ret = -ENOMEM;
fail:
	tr_image_names_free(files, n_files);
	close(dir_fd);
	images_destroy(&d->base);
	return ret;
}
