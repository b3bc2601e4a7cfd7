/* Image folders: listing a folder's images or class subfolders, telling
 * PNG from JPEG, and loading one image as planar floats (see image.h).
 *
 * Names are sorted with strcmp so that sample i is the same file on every
 * machine and every run (readdir's order is the file system's), which the
 * batch plan and resume rely on.  Files are opened by name beneath the
 * folder's descriptor without following symbolic links (roots.h,
 * tr_data_open_in), so a folder opened inside the data roots cannot lead
 * out of them.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/data/image.h"
#include "engine/data/reader_internal.h"

/* Folders with more entries than this are refused (a plan indexes
 * samples with int64, but a list of names this long is a mistake). */
#define MAX_ENTRIES (1 << 24)

static int by_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int is_image_name(const char *s)
{
	size_t n = strlen(s);

	return (n > 4 && (strcasecmp(s + n - 4, ".png") == 0 || strcasecmp(s + n - 4, ".jpg") == 0)) ||
	       (n > 5 && strcasecmp(s + n - 5, ".jpeg") == 0);
}

enum kind { NOT_AN_IMAGE, PNG, JPEG };

static enum kind sniff(int fd)
{
	unsigned char b[8];

	if (pread(fd, b, sizeof b, 0) != (ssize_t)sizeof b)
		return NOT_AN_IMAGE;
	if (memcmp(b, "\x89PNG\r\n\x1a\n", 8) == 0)
		return PNG;
	if (b[0] == 0xff && b[1] == 0xd8 && b[2] == 0xff)
		return JPEG;
	return NOT_AN_IMAGE;
}

int tr_image_probe(int fd, const char *name, int *width, int *height, int *channels, struct tr_error *err)
{
	switch (sniff(fd)) {
	case PNG:
		return tr_png_probe(fd, name, width, height, channels, err);
	case JPEG:
		return tr_jpeg_probe(fd, name, width, height, channels, err);
	default:
		close(fd);
		tr_error_set(err, 0, 0, NULL, "%s: not a PNG or JPEG file", name);
		return -EINVAL;
	}
}

int tr_image_decode(int fd, const char *name, struct tr_image *img, struct tr_error *err)
{
	memset(img, 0, sizeof(*img));
	switch (sniff(fd)) {
	case PNG:
		return tr_png_decode(fd, name, img, err);
	case JPEG:
		return tr_jpeg_decode(fd, name, img, err);
	default:
		close(fd);
		tr_error_set(err, 0, 0, NULL, "%s: not a PNG or JPEG file", name);
		return -EINVAL;
	}
}

int tr_image_decode_rows(int fd, const char *name, const struct tr_image_rows *cb, struct tr_error *err)
{
	switch (sniff(fd)) {
	case PNG:
		return tr_png_decode_rows(fd, name, cb, err);
	case JPEG:
		return tr_jpeg_decode_rows(fd, name, cb, err);
	default:
		close(fd);
		tr_error_set(err, 0, 0, NULL, "%s: not a PNG or JPEG file", name);
		return -EINVAL;
	}
}

void tr_image_names_free(char **names, int n)
{
	for (int i = 0; names && i < n; i++)
		free(names[i]);
	free(names);
}

int tr_image_list(int dir_fd, const char *dir_name, int want_dirs, char ***names, int *n, struct tr_error *err)
{
	int fd = dup(dir_fd), cap = 0, ret = 0;
	DIR *d;
	struct dirent *e;
	char **v = NULL;

	*names = NULL;
	*n = 0;
	if (fd < 0 || lseek(fd, 0, SEEK_SET) < 0 || !(d = fdopendir(fd))) {
		ret = -errno;
		tr_error_set(err, 0, 0, NULL, "%s: %s", dir_name, strerror(errno));
		if (fd >= 0)
			close(fd);
		return ret;
	}
	errno = 0;
	while ((e = readdir(d))) {
		struct stat st;
		char **nv;

		if (e->d_name[0] == '.')
			continue;
		if (fstatat(dir_fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			continue; /* gone since readdir: as if it never was */
		if (want_dirs ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode) || !is_image_name(e->d_name))
			continue;
		if (*n == MAX_ENTRIES) {
			tr_error_set(err, 0, 0, NULL, "%s: more than %d entries", dir_name, MAX_ENTRIES);
			ret = -E2BIG;
			goto out;
		}
		if (*n == cap) {
			cap = cap ? 2 * cap : 64;
			nv = realloc(v, (size_t)cap * sizeof(*v));
			if (!nv)
				goto oom;
			v = nv;
		}
		v[*n] = strdup(e->d_name);
		if (!v[*n])
			goto oom;
		(*n)++;
	}
	if (errno) {
		ret = -errno;
		tr_error_set(err, 0, 0, NULL, "%s: %s", dir_name, strerror(errno));
		goto out;
	}
	if (*n > 1)
		qsort(v, (size_t)*n, sizeof(*v), by_name);
	goto out;
oom:
	tr_error_set(err, 0, 0, NULL, "%s: out of memory", dir_name);
	ret = -ENOMEM;
out:
	closedir(d);
	if (ret) {
		tr_image_names_free(v, *n);
		*n = 0;
		v = NULL;
	}
	*names = v;
	return ret;
}

int tr_image_open_in(int dir_fd, const char *name, const char *shown, struct tr_error *err)
{
	struct tr_error msg;
	int fd = tr_data_open_in(dir_fd, name, 0, NULL, &msg);

	if (fd < 0) {
		/* msg.message is "'name': why"; the message names the whole path instead. */
		const char *why = strstr(msg.message, "': ");

		tr_error_set(err, 0, 0, NULL, "%s: %s", shown, why ? why + 3 : msg.message);
	}
	return fd;
}

int tr_image_load(int dir_fd, const char *name, const char *shown, float scale, float **out, int *width, int *height,
		  int *channels, struct tr_error *err)
{
	struct tr_image img;
	size_t plane;
	float *f;
	int fd, ret;

	*out = NULL;
	fd = tr_image_open_in(dir_fd, name, shown, err);
	if (fd < 0)
		return fd;
	ret = tr_image_decode(fd, shown, &img, err);
	if (ret)
		return ret;
	plane = (size_t)img.width * (size_t)img.height;
	f = malloc(plane * (size_t)img.channels * sizeof(float));
	if (!f) {
		free(img.px);
		tr_error_set(err, 0, 0, NULL, "%s: out of memory", shown);
		return -ENOMEM;
	}
	for (int c = 0; c < img.channels; c++)
		for (size_t i = 0; i < plane; i++)
			f[(size_t)c * plane + i] = (float)img.px[i * (size_t)img.channels + (size_t)c] * scale;
	free(img.px);
	*out = f;
	*width = img.width;
	*height = img.height;
	*channels = img.channels;
	return 0;
}
