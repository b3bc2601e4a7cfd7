/* The pixel budget of the image decoders (see image.h).
 *
 * A PNG or JPEG file states its size in its header (IHDR, SOF), and a
 * small file may claim a huge one: 16384x16384 of zeros compresses to a
 * megabyte or two and decodes to a gigabyte of bytes and four of floats.
 * Every decode and probe checks the header's figures against this budget
 * before anything is allocated for pixels, so such a file costs a message,
 * not the process.  One value for the process: the daemon and `trainerd
 * run` set it from their configuration before any job starts.
 */
#include <errno.h>
#include <stdatomic.h>

#include "engine/data/image.h"

static _Atomic long long max_pixels = TR_IMAGE_DEFAULT_MAX_PIXELS;

void tr_image_set_max_pixels(long long n)
{
	atomic_store(&max_pixels, n > 0 ? n : TR_IMAGE_DEFAULT_MAX_PIXELS);
}

long long tr_image_max_pixels(void)
{
	return atomic_load(&max_pixels);
}

int tr_image_check_pixels(const char *name, long long width, long long height, struct tr_error *err)
{
	long long budget = tr_image_max_pixels();

	if (width > 0 && height > 0 && width <= TR_IMAGE_MAX_SIDE && height <= TR_IMAGE_MAX_SIDE &&
	    width * height <= budget)
		return 0;
	tr_error_set(err, 0, 0, NULL,
		     "%s: image too large to decode: %lldx%lld is %lld pixels, the budget is %lld pixels "
		     "(image-max-pixels) and %d on a side",
		     name, width, height, width * height, budget, TR_IMAGE_MAX_SIDE);
	return -E2BIG;
}
