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
/* The default pixel budget (width x height) of one image: 4096x4096, or
 * a 24-megapixel photo cropped a little; docs/design.md, "Image data". */
#define TR_IMAGE_DEFAULT_MAX_PIXELS (16LL << 20)

/* The pixel budget (image_budget.c): every probe and decode refuses, from
 * the header and before allocating pixels, an image whose width x height
 * exceeds it (or whose side exceeds TR_IMAGE_MAX_SIDE) with -E2BIG and
 * "NAME: image too large to decode: WxH is N pixels, the budget is M".
 * set: n <= 0 restores the default. */
void tr_image_set_max_pixels(long long n);
long long tr_image_max_pixels(void);
int tr_image_check_pixels(const char *name, long long width, long long height, struct tr_error *err);

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

/* Row-by-row decoding, so that an image is never held whole (images.c
 * resizes and crops as the rows arrive).  start is called once the header
 * is read, then row for each row top to bottom (width * channels
 * interleaved bytes, borrowed until it returns); a negative return from
 * either stops the decode with that code (its message already in err).
 * Interlaced PNG files, whose rows are complete only after the last pass,
 * are decoded whole first.  fd is owned by the call. */
struct tr_image_rows {
	int (*start)(void *ctx, int width, int height, int channels, struct tr_error *err);
	int (*row)(void *ctx, const unsigned char *px, struct tr_error *err);
	void *ctx;
};
int tr_image_decode_rows(int fd, const char *name, const struct tr_image_rows *cb, struct tr_error *err);
int tr_png_decode_rows(int fd, const char *name, const struct tr_image_rows *cb, struct tr_error *err);
int tr_jpeg_decode_rows(int fd, const char *name, const struct tr_image_rows *cb, struct tr_error *err);

/* tr_image_resize over rows that arrive top to bottom: the vertical pass
 * keeps only the window of input rows its taps reach (a ring), then the
 * horizontal pass runs on the c x oh x w intermediate, with the same
 * arithmetic in the same order, so the result is bit for bit
 * tr_image_resize's.  create: 0, -ENOMEM, or -ENOTSUP where the taps'
 * windows do not move monotonically (then resize whole).  slot: where the
 * next row goes, planar [c][w] floats; push: that row is there; finish:
 * after all h rows, the result [c][oh][ow] into dst. */
typedef struct tr_resize_stream tr_resize_stream_t;
int tr_resize_stream_create(int c, int h, int w, int oh, int ow, tr_resize_stream_t **out);
float *tr_resize_stream_slot(tr_resize_stream_t *s);
void tr_resize_stream_push(tr_resize_stream_t *s);
void tr_resize_stream_finish(tr_resize_stream_t *s, float *dst);
void tr_resize_stream_destroy(tr_resize_stream_t *s);

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

/* Opens the image `name` in dir_fd (tr_data_open_in), the message naming
 * it as `shown`: an fd or a negative code. */
int tr_image_open_in(int dir_fd, const char *name, const char *shown, struct tr_error *err);

/* Decodes the image `name` in dir_fd (opened with tr_data_open_in) into
 * planar floats [channels][height][width], values 0..255 times `scale`.
 * `shown` names the file in messages.  *out is malloc'd. */
int tr_image_load(int dir_fd, const char *name, const char *shown, float scale, float **out, int *width, int *height,
		  int *channels, struct tr_error *err);
