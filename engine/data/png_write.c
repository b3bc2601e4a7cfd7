/* PNG encoding through libpng, for images trainerd writes (predict's image
 * outputs, `trainerd degrade`): planar floats on a model's pixel scale back
 * to 8-bit samples, rounded and clipped to 0..255 (image.h). */
#include <errno.h>
#include <math.h>
#include <png.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/data/image.h"

static void on_error(png_structp png, png_const_charp msg)
{
	char *e = png_get_error_ptr(png);
	snprintf(e, 200, "%s", msg ? msg : "error");
	png_longjmp(png, 1);
}

static void on_warning(png_structp png, png_const_charp msg)
{
	(void)png;
	(void)msg;
}

void tr_image_to_bytes(const float *src, int c, int h, int w, float scale, unsigned char *dst)
{
	size_t plane = (size_t)h * (size_t)w;
	for (int ch = 0; ch < c; ch++)
		for (size_t i = 0; i < plane; i++) {
			float v = src[(size_t)ch * plane + i] / scale;
			/* NaN is 0: a broken model's output is still a valid file */
			dst[i * (size_t)c + (size_t)ch] = !(v > 0.0f)   ? 0
							  : v >= 255.0f ? 255
									: (unsigned char)lrintf(v);
		}
}

int tr_png_write(FILE *f, const char *name, const float *src, int c, int h, int w, float scale, struct tr_error *err)
{
	static const int color[] = {0, PNG_COLOR_TYPE_GRAY, PNG_COLOR_TYPE_GRAY_ALPHA, PNG_COLOR_TYPE_RGB,
				    PNG_COLOR_TYPE_RGB_ALPHA};
	char msg[200] = "";
	unsigned char *px = NULL;
	png_bytep *rows = NULL;
	png_structp png = NULL;
	png_infop info = NULL;
	int rc = -ENOMEM;

	if (c < 1 || c > 4) {
		tr_error_set(err, 0, 0, NULL, "%s: %d channels cannot be a PNG (1 to 4)", name, c);
		return -EINVAL;
	}
	px = malloc((size_t)c * (size_t)h * (size_t)w);
	rows = malloc((size_t)h * sizeof *rows);
	png = png_create_write_struct(PNG_LIBPNG_VER_STRING, msg, on_error, on_warning);
	info = png ? png_create_info_struct(png) : NULL;
	if (!px || !rows || !info) {
		tr_error_set(err, 0, 0, NULL, "%s: out of memory", name);
		goto out;
	}
	tr_image_to_bytes(src, c, h, w, scale, px);
	for (int y = 0; y < h; y++)
		rows[y] = px + (size_t)y * (size_t)w * (size_t)c;
	if (setjmp(png_jmpbuf(png))) {
		tr_error_set(err, 0, 0, NULL, "%s: writing the PNG failed: %s", name, msg);
		rc = -EIO;
		goto out;
	}
	png_init_io(png, f);
	png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, 8, color[c], PNG_INTERLACE_NONE,
		     PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
	png_write_info(png, info);
	png_write_image(png, rows);
	png_write_end(png, NULL);
	rc = 0;
out:
	png_destroy_write_struct(png ? &png : NULL, info ? &info : NULL);
	free(rows);
	free(px);
	return rc;
}
