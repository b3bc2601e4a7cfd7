/* PNG decoding through libpng (see image.h for the contract).
 *
 * libpng reports errors by longjmp to a jump buffer of ours; the message
 * is kept so the caller's error names the file and what libpng found
 * ("IDAT: CRC error", "Read Error" for a truncated file).  Warnings are
 * dropped: a file libpng can decode is accepted.  The same expansions are
 * set up for the probe and the decode, so the channel count the probe
 * reports at open is the one the loader threads later decode.
 */
#include <errno.h>
#include <png.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/data/image.h"
#include "engine/data/reader_internal.h"

struct png_err {
	char msg[200];
};

static void on_error(png_structp png, png_const_charp msg)
{
	struct png_err *e = png_get_error_ptr(png);

	snprintf(e->msg, sizeof e->msg, "%s", msg ? msg : "error");
	png_longjmp(png, 1);
}

static void on_warning(png_structp png, png_const_charp msg)
{
	(void)png;
	(void)msg;
}

/* A clean decoder on fd: checks the signature first so that a file that
 * is not a PNG gets that message rather than libpng's. */
static int start(int fd, const char *name, FILE **fp, png_structp *png, png_infop *info, struct png_err *e,
		 struct tr_error *err)
{
	unsigned char sig[8];
	size_t n;

	*fp = fdopen(fd, "rb");
	if (!*fp) {
		int ret = -errno;

		tr_error_set(err, 0, 0, NULL, "%s: %s", name, strerror(errno));
		close(fd);
		return ret;
	}
	n = fread(sig, 1, sizeof sig, *fp);
	if (n < sizeof sig || png_sig_cmp(sig, 0, sizeof sig) != 0) {
		tr_error_set(err, 0, 0, NULL, "%s: not a PNG file%s", name, n < sizeof sig ? " (too short)" : "");
		fclose(*fp);
		return -EINVAL;
	}
	*png = png_create_read_struct(PNG_LIBPNG_VER_STRING, e, on_error, on_warning);
	*info = *png ? png_create_info_struct(*png) : NULL;
	if (!*info) {
		png_destroy_read_struct(png, NULL, NULL);
		fclose(*fp);
		tr_error_set(err, 0, 0, NULL, "%s: out of memory", name);
		return -ENOMEM;
	}
	/* libpng's own limit is left wide: the pixel budget is checked on the
	 * header's figures (header_fits) so the message says which budget. */
	png_set_user_limits(*png, 0x7fffffff, 0x7fffffff);
	png_init_io(*png, *fp);
	png_set_sig_bytes(*png, (int)sizeof sig);
	return 0;
}

/* After png_read_info: the header's size against the pixel budget. */
static int header_fits(png_structp png, png_infop info, const char *name, struct tr_error *err)
{
	return tr_image_check_pixels(name, png_get_image_width(png, info), png_get_image_height(png, info), err);
}

/* After png_read_info: the expansions of image.h. */
static void set_expansions(png_structp png, png_infop info)
{
	int type = png_get_color_type(png, info), depth = png_get_bit_depth(png, info);

	if (type == PNG_COLOR_TYPE_PALETTE)
		png_set_palette_to_rgb(png);
	if (type == PNG_COLOR_TYPE_GRAY && depth < 8)
		png_set_expand_gray_1_2_4_to_8(png);
	if (png_get_valid(png, info, PNG_INFO_tRNS))
		png_set_tRNS_to_alpha(png);
	if (depth == 16)
		png_set_strip_16(png);
	if (png_get_interlace_type(png, info) != PNG_INTERLACE_NONE)
		png_set_interlace_handling(png);
	png_read_update_info(png, info);
}

int tr_png_probe(int fd, const char *name, int *width, int *height, int *channels, struct tr_error *err)
{
	struct png_err e = {{0}};
	png_structp png = NULL;
	png_infop info = NULL;
	FILE *fp;
	volatile int ret = start(fd, name, &fp, &png, &info, &e, err);

	if (ret)
		return ret;
	if (setjmp(png_jmpbuf(png))) {
		tr_error_set(err, 0, 0, NULL, "%s: corrupt PNG header (%s)", name, e.msg);
		ret = -EINVAL;
		goto out;
	}
	png_read_info(png, info);
	if ((ret = header_fits(png, info, name, err)) < 0)
		goto out;
	set_expansions(png, info);
	*width = (int)png_get_image_width(png, info);
	*height = (int)png_get_image_height(png, info);
	*channels = png_get_channels(png, info);
out:
	png_destroy_read_struct(&png, &info, NULL);
	fclose(fp);
	return ret;
}

int tr_png_decode(int fd, const char *name, struct tr_image *img, struct tr_error *err)
{
	struct png_err e = {{0}};
	png_structp png = NULL;
	png_infop info = NULL;
	png_bytep *volatile rows = NULL;
	unsigned char *volatile px = NULL;
	FILE *fp;
	volatile int ret = start(fd, name, &fp, &png, &info, &e, err);

	memset(img, 0, sizeof(*img));
	if (ret)
		return ret;
	if (setjmp(png_jmpbuf(png))) {
		tr_error_set(err, 0, 0, NULL, "%s: corrupt or truncated PNG (%s)", name, e.msg);
		ret = -EINVAL;
		goto out;
	}
	png_read_info(png, info);
	if ((ret = header_fits(png, info, name, err)) < 0)
		goto out;
	set_expansions(png, info);
	{
		size_t w = png_get_image_width(png, info), h = png_get_image_height(png, info);
		size_t rowbytes = png_get_rowbytes(png, info);

		px = malloc(h * rowbytes);
		rows = malloc(h * sizeof(*rows));
		if (!px || !rows) {
			tr_error_set(err, 0, 0, NULL, "%s: out of memory for a %zux%zu image", name, w, h);
			ret = -ENOMEM;
			goto out;
		}
		for (size_t y = 0; y < h; y++)
			rows[y] = px + y * rowbytes;
		png_read_image(png, rows);
		png_read_end(png, NULL);
		img->width = (int)w;
		img->height = (int)h;
		img->channels = png_get_channels(png, info);
		img->px = px;
		px = NULL;
	}
out:
	png_destroy_read_struct(&png, &info, NULL);
	fclose(fp);
	free(rows);
	free(px);
	return ret;
}

int tr_png_decode_rows(int fd, const char *name, const struct tr_image_rows *cb, struct tr_error *err)
{
	struct png_err e = {{0}};
	png_structp png = NULL;
	png_infop info = NULL;
	unsigned char *volatile row = NULL;
	FILE *fp;
	volatile int ret = start(fd, name, &fp, &png, &info, &e, err);

	if (ret)
		return ret;
	if (setjmp(png_jmpbuf(png))) {
		tr_error_set(err, 0, 0, NULL, "%s: corrupt or truncated PNG (%s)", name, e.msg);
		ret = -EINVAL;
		goto out;
	}
	png_read_info(png, info);
	if ((ret = header_fits(png, info, name, err)) < 0)
		goto out;
	if (png_get_interlace_type(png, info) != PNG_INTERLACE_NONE) {
		/* Rows are complete only after the last pass: whole, then fed. */
		png_destroy_read_struct(&png, &info, NULL);
		if (fseek(fp, 0, SEEK_SET) != 0) {
			tr_error_set(err, 0, 0, NULL, "%s: %s", name, strerror(errno));
			ret = -EIO;
			fclose(fp);
			return ret;
		}
		struct tr_image img;
		ret = tr_png_decode(dup(fileno(fp)), name, &img, err);
		fclose(fp);
		if (ret == 0)
			ret = cb->start(cb->ctx, img.width, img.height, img.channels, err);
		for (int y = 0; ret == 0 && y < img.height; y++)
			ret = cb->row(cb->ctx, img.px + (size_t)y * img.width * img.channels, err);
		free(img.px);
		return ret;
	}
	set_expansions(png, info);
	{
		int w = (int)png_get_image_width(png, info), h = (int)png_get_image_height(png, info);
		int c = png_get_channels(png, info);

		row = malloc(png_get_rowbytes(png, info));
		if (!row) {
			tr_error_set(err, 0, 0, NULL, "%s: out of memory", name);
			ret = -ENOMEM;
			goto out;
		}
		if ((ret = cb->start(cb->ctx, w, h, c, err)) < 0)
			goto out;
		for (int y = 0; y < h; y++) {
			png_read_row(png, row, NULL);
			if ((ret = cb->row(cb->ctx, row, err)) < 0)
				goto out;
		}
		png_read_end(png, NULL);
	}
out:
	png_destroy_read_struct(&png, &info, NULL);
	fclose(fp);
	free(row);
	return ret;
}
