/* JPEG decoding through libjpeg-turbo (see image.h for the contract).
 *
 * libjpeg ends on an error by calling error_exit, which here longjmps
 * back with the message.  A truncated or damaged file is only a warning
 * to libjpeg (it fills the rest with grey and goes on), so any warning
 * fails the decode too: a job must not train on made-up pixels.  Grey
 * files decode to one channel, everything else to RGB; CMYK files are
 * refused.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jpeglib.h>

#include "engine/data/image.h"
#include "engine/data/reader_internal.h"

struct jerr {
	struct jpeg_error_mgr pub;
	jmp_buf jb;
	char msg[JMSG_LENGTH_MAX];
};

static void on_error(j_common_ptr cinfo)
{
	struct jerr *e = (struct jerr *)cinfo->err;

	cinfo->err->format_message(cinfo, e->msg);
	longjmp(e->jb, 1);
}

/* Keeps the first warning's text; num_warnings counts them. */
static void on_output(j_common_ptr cinfo)
{
	struct jerr *e = (struct jerr *)cinfo->err;

	if (!e->msg[0])
		cinfo->err->format_message(cinfo, e->msg);
}

/* Reads the header of fd (owned) and sets up the output colour space.
 * With px != NULL also decodes into *px; with cb != NULL hands it the
 * rows instead. */
static int run(int fd, const char *name, int *width, int *height, int *channels, unsigned char **px,
	       const struct tr_image_rows *cb, struct tr_error *err)
{
	struct jpeg_decompress_struct cinfo;
	struct jerr e;
	FILE *fp = fdopen(fd, "rb");
	unsigned char *volatile out = NULL;
	volatile int ret = 0;

	if (!fp) {
		ret = -errno;
		tr_error_set(err, 0, 0, NULL, "%s: %s", name, strerror(errno));
		close(fd);
		return ret;
	}
	memset(&e, 0, sizeof e);
	cinfo.err = jpeg_std_error(&e.pub);
	e.pub.error_exit = on_error;
	e.pub.output_message = on_output;
	if (setjmp(e.jb)) {
		tr_error_set(err, 0, 0, NULL, "%s: corrupt or truncated JPEG (%s)", name, e.msg);
		ret = -EINVAL;
		goto out;
	}
	jpeg_create_decompress(&cinfo);
	jpeg_stdio_src(&cinfo, fp);
	jpeg_read_header(&cinfo, TRUE);
	/* The SOF's size against the pixel budget, before any pixel buffer. */
	if ((ret = tr_image_check_pixels(name, cinfo.image_width, cinfo.image_height, err)) < 0)
		goto out;
	if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
		tr_error_set(err, 0, 0, NULL, "%s: CMYK JPEG files are not supported", name);
		ret = -EINVAL;
		goto out;
	}
	cinfo.out_color_space = cinfo.num_components == 1 ? JCS_GRAYSCALE : JCS_RGB;
	*width = (int)cinfo.image_width;
	*height = (int)cinfo.image_height;
	*channels = cinfo.num_components == 1 ? 1 : 3;
	if (cb) {
		size_t row = (size_t)*width * (size_t)*channels;

		jpeg_start_decompress(&cinfo);
		out = malloc(row);
		if (!out) {
			tr_error_set(err, 0, 0, NULL, "%s: out of memory", name);
			ret = -ENOMEM;
			goto out;
		}
		if ((ret = cb->start(cb->ctx, *width, *height, *channels, err)) < 0)
			goto out;
		while (cinfo.output_scanline < cinfo.output_height) {
			JSAMPROW r = out;

			jpeg_read_scanlines(&cinfo, &r, 1);
			if ((ret = cb->row(cb->ctx, out, err)) < 0)
				goto out;
		}
		jpeg_finish_decompress(&cinfo);
		/* The rows went out already: the caller drops what it made of
		 * them on this error. */
		if (e.pub.num_warnings) {
			tr_error_set(err, 0, 0, NULL, "%s: corrupt or truncated JPEG (%s)", name, e.msg);
			ret = -EINVAL;
			goto out;
		}
	} else if (px) {
		size_t row = (size_t)*width * (size_t)*channels;

		jpeg_start_decompress(&cinfo);
		out = malloc(row * (size_t)*height);
		if (!out) {
			tr_error_set(err, 0, 0, NULL, "%s: out of memory for a %dx%d image", name, *width, *height);
			ret = -ENOMEM;
			goto out;
		}
		while (cinfo.output_scanline < cinfo.output_height) {
			JSAMPROW r = out + row * cinfo.output_scanline;

			jpeg_read_scanlines(&cinfo, &r, 1);
		}
		jpeg_finish_decompress(&cinfo);
		if (e.pub.num_warnings) {
			tr_error_set(err, 0, 0, NULL, "%s: corrupt or truncated JPEG (%s)", name, e.msg);
			ret = -EINVAL;
			goto out;
		}
		*px = out;
		out = NULL;
	}
out:
	jpeg_destroy_decompress(&cinfo);
	fclose(fp);
	free(out);
	return ret;
}

int tr_jpeg_probe(int fd, const char *name, int *width, int *height, int *channels, struct tr_error *err)
{
	return run(fd, name, width, height, channels, NULL, NULL, err);
}

int tr_jpeg_decode(int fd, const char *name, struct tr_image *img, struct tr_error *err)
{
	memset(img, 0, sizeof(*img));
	return run(fd, name, &img->width, &img->height, &img->channels, &img->px, NULL, err);
}

int tr_jpeg_decode_rows(int fd, const char *name, const struct tr_image_rows *cb, struct tr_error *err)
{
	int w, h, c;

	return run(fd, name, &w, &h, &c, NULL, cb, err);
}
