/* Image decoding, resampling and PNG writing shared by the image readers
 * (images.c, patches.c), the degradations (degrade.c) and the commands
 * that read and write whole images (`trainerd predict` with image outputs,
 * `trainerd degrade`).
 *
 * PNG (libpng) and JPEG (libjpeg-turbo) files are told apart by their
 * first bytes, not their names.
 * Decoding gives 8-bit samples, interleaved as the file stores them
 * (height x width x channels): palettes and grey levels under 8 bits are
 * expanded, a transparency chunk becomes an alpha channel and 16-bit
 * samples are cut to their high byte, so the channel count of a file is
 * 1 (grey), 2 (grey + alpha), 3 (RGB) or 4 (RGBA).  Every error is a
 * message naming the file, never a crash: libpng's own errors are caught
 * and passed on.
 */
#ifndef TR_DATA_IMAGE_H
#define TR_DATA_IMAGE_H

#include <stddef.h>
#include <stdio.h>

#include "core/error.h"

/* Images larger than this on either side are refused at the header, so a
 * hostile header cannot make the decoder allocate gigabytes. */
#define TR_IMAGE_MAX_SIDE 16384

struct tr_image {
	int width, height, channels;
	unsigned char *px; /* height * width * channels, interleaved; malloc'd */
};

/* Reads a PNG file's header from fd (owned by the call, closed on return):
 * its size and channel count after the expansions above.  Returns 0 or
 * -EINVAL with a message naming `name` (not a PNG, a corrupt header). */
int tr_png_probe(int fd, const char *name, int *width, int *height, int *channels, struct tr_error *err);

/* Decodes the whole PNG file fd (owned by the call) into img (free
 * img->px).  Returns 0, -EINVAL (not a PNG, truncated or corrupt data,
 * with the message naming `name`) or -ENOMEM. */
int tr_png_decode(int fd, const char *name, struct tr_image *img, struct tr_error *err);

/* The same for JPEG files (1 channel for grey, else 3). */
int tr_jpeg_probe(int fd, const char *name, int *width, int *height, int *channels, struct tr_error *err);
int tr_jpeg_decode(int fd, const char *name, struct tr_image *img, struct tr_error *err);

/* Either format, by the file's first bytes; anything else is refused
 * ("not a PNG or JPEG file").  fd is owned by the call. */
int tr_image_probe(int fd, const char *name, int *width, int *height, int *channels, struct tr_error *err);
int tr_image_decode(int fd, const char *name, struct tr_image *img, struct tr_error *err);

/* Resamples the planar float image src [c][h][w] to dst [c][oh][ow] with
 * the bicubic kernel (a = -0.5) as MATLAB's imresize does: pixel centres
 * map by x_in = (x_out + 0.5) * in / out - 0.5, edges are mirrored, and
 * when shrinking the kernel is stretched by the factor (antialiasing).
 * Pure arithmetic on the inputs: the same bytes on every thread.  Returns
 * 0 or -ENOMEM. */
int tr_image_resize(const float *src, int c, int h, int w, float *dst, int oh, int ow);

#endif

/* Planar floats [c][h][w] on a pixel scale (value = sample * scale) back
 * to interleaved 8-bit samples (h * w * c bytes): divided by scale,
 * rounded to nearest, clipped to 0..255, NaN as 0. */
void tr_image_to_bytes(const float *src, int c, int h, int w, float scale, unsigned char *dst);
/* Writes them as an 8-bit PNG (1: grey, 2: grey + alpha, 3: RGB, 4: RGBA)
 * to f; `name` names it in messages.  Returns 0, -EINVAL, -ENOMEM or -EIO. */
int tr_png_write(FILE *f, const char *name, const float *src, int c, int h, int w, float scale, struct tr_error *err);

/* The entries of the directory dir_fd (not consumed) that are
 * subdirectories (want_dirs) or files named *.png, *.jpg or *.jpeg, any
 * case (else), in
 * strcmp order; hidden entries (".x") are skipped, as are symbolic links
 * (they are not followed inside a data directory).  *names is an array of
 * *n malloc'd strings; free with tr_image_names_free.  `dir_name` names
 * the directory in messages.  Returns 0 or a negative errno. */
int tr_image_list(int dir_fd, const char *dir_name, int want_dirs, char ***names, int *n, struct tr_error *err);
void tr_image_names_free(char **names, int n);

/* Decodes the image `name` in dir_fd (opened with tr_data_open_in) into
 * planar floats [channels][height][width], values 0..255 times `scale`.
 * `shown` names the file in messages.  *out is malloc'd. */
int tr_image_load(int dir_fd, const char *name, const char *shown, float scale, float **out, int *width, int *height,
		  int *channels, struct tr_error *err);
