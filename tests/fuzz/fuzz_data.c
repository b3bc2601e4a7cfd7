/* Fuzz target: the csv, npy and idx readers (job data files) and the PNG
 * decoder of the image readers.  The first byte picks the format (and
 * csv's header flag and label column); the rest is one file, or, for the
 * two-file formats, two files separated by the first "\n@@\n".  After a
 * successful open the first samples are read back, which is where offsets
 * and row lengths are trusted.  A first file that starts with the PNG
 * or JPEG signature is also probed and decoded as an image would be by the
 * loaders (idx files that start with the gzip magic are inflated by the
 * idx case). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <fcntl.h>

#include "engine/data/image.h"
#include "engine/data/reader.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_READ 64

static int put(int *fd, const char *name, const uint8_t *p, size_t n, char *path, size_t len)
{
	if (*fd < 0 && (*fd = memfd_create(name, 0)) < 0)
		return -1;
	if (ftruncate(*fd, 0) < 0 || (n && pwrite(*fd, p, n, 0) != (ssize_t)n))
		return -1;
	snprintf(path, len, "/proc/self/fd/%d", *fd);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int fa = -1, fb = -1;
	char pa[64];
	char pb[64];
	struct tr_error err;
	struct tr_source_spec src;
	tr_reader_t *r = NULL;

	if (size < 1)
		return 0;
	uint8_t sel = data[0];
	const uint8_t *body = data + 1, *second = NULL;
	size_t n = size - 1, n2 = 0;
	const uint8_t *sep = memmem(body, n, "\n@@\n", 4);
	if (sep) {
		second = sep + 4;
		n2 = (size_t)(body + n - second);
		n = (size_t)(sep - body);
	}
	if (put(&fa, "a", body, n, pa, sizeof pa) < 0 || put(&fb, "b", second, n2, pb, sizeof pb) < 0)
		return 0;
	if (n >= 8 && (memcmp(body, "\x89PNG\r\n\x1a\n", 8) == 0 || memcmp(body, "\xff\xd8\xff", 3) == 0)) {
		struct tr_image img;
		int w, h, c, fd = open(pa, O_RDONLY | O_CLOEXEC);

		if (fd >= 0 && tr_image_probe(fd, "a.img", &w, &h, &c, &err) == 0) {
			fd = open(pa, O_RDONLY | O_CLOEXEC);
			if (fd >= 0 && tr_image_decode(fd, "a.img", &img, &err) == 0) {
				if (img.width != w || img.height != h || img.channels != c)
					abort(); /* the probe promised another image */
				free(img.px);
			}
		}
	}
	memset(&src, 0, sizeof src);
	src.present = true;
	switch (sel % 3) {
	case 0:
		src.format = TR_DATA_CSV;
		src.path = pa;
		src.header = (sel >> 2) & 1;
		src.label_cols[0] = (sel >> 3) & 1 ? 0 : -1;
		src.n_label_cols = 1;
		break;
	case 1:
		src.format = TR_DATA_NPY;
		src.x_path = pa;
		src.y_path = pb;
		break;
	default:
		src.format = TR_DATA_IDX;
		src.images_path = pa;
		src.labels_path = pb;
		break;
	}
	if (tr_reader_open(&src, 1, NULL, NULL, &r, &err) == 0) {
		int64_t count = r->info.samples < MAX_READ ? r->info.samples : MAX_READ;
		float *x = malloc(((size_t)r->info.features + 1) * sizeof(float));
		float *y = malloc(((size_t)r->info.label_dim + 1) * sizeof(float));
		for (int64_t i = 0; x && y && i < count; i++)
			(void)tr_reader_get(r, i, x, y, &err);
		/* The last sample too: offsets at the end of the file. */
		if (x && y && r->info.samples > count)
			(void)tr_reader_get(r, r->info.samples - 1, x, y, &err);
		free(x);
		free(y);
	}
	tr_reader_destroy(r);
	return 0;
}
