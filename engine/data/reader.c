/* Reader dispatch, slices and path resolution.
 *
 * tr_reader_open picks the format's opener and resolves relative paths
 * against base_dir, so the format files only ever see the path they open
 * (and name in their messages).  Slices are the one reader type that owns
 * no data: they borrow a base reader and shift indices, which is all that
 * validation_split needs.  The helpers every reader shares (the error
 * formatter and the read-only file mapping, see reader_internal.h) live
 * here too.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/data/reader_internal.h"

void tr_data_errorf(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (!err || errlen == 0)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

int tr_data_map_file(const char *path, size_t min_size, const char *kind, const void **map, size_t *len,
		     char *err, size_t errlen)
{
	struct stat st;
	void *m;
	int fd, ret;

	fd = tr_data_open(path, err, errlen);
	if (fd < 0)
		return fd;
	if (fstat(fd, &st) < 0) {
		ret = -errno;
		tr_data_errorf(err, errlen, "%s: %s", path, strerror(errno));
		close(fd);
		return ret;
	}
	if (!S_ISREG(st.st_mode) || st.st_size < (off_t)min_size) {
		tr_data_errorf(err, errlen, "%s: not %s (%s)", path, kind,
			       S_ISREG(st.st_mode) ? "too short" : "not a regular file");
		close(fd);
		return -EINVAL;
	}
	m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	ret = -errno;
	close(fd);
	if (m == MAP_FAILED) {
		tr_data_errorf(err, errlen, "%s: mmap: %s", path, strerror(-ret));
		return ret;
	}
	*map = m;
	*len = (size_t)st.st_size;
	return 0;
}

void tr_data_unmap_file(const void *map, size_t len)
{
	if (map)
		munmap((void *)map, len);
}

/* Joins `path` to base_dir unless it is absolute; *out is a new string
 * the caller frees.  `what` names the missing path in the message. */
static int resolve(const char *base_dir, const char *path, const char *what, char **out, char *err,
		   size_t errlen)
{
	*out = NULL;
	if (!path || !*path) {
		tr_data_errorf(err, errlen, "data source has no %s path", what);
		return -EINVAL;
	}
	if (path[0] == '/' || !base_dir || !*base_dir) {
		*out = strdup(path);
	} else {
		size_t bl = strlen(base_dir);
		int slash = base_dir[bl - 1] != '/';

		if (asprintf(out, "%s%s%s", base_dir, slash ? "/" : "", path) < 0)
			*out = NULL;
	}
	if (!*out) {
		tr_data_errorf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	return 0;
}

int tr_reader_open(const struct tr_source_spec *src, uint64_t job_seed, const char *base_dir,
		   tr_reader_t **out, char *err, size_t errlen)
{
	char *a = NULL, *b = NULL;
	int ret;

	if (!src || !out) {
		tr_data_errorf(err, errlen, "no data source");
		return -EINVAL;
	}
	*out = NULL;
	switch (src->format) {
	case TR_DATA_CSV:
		ret = resolve(base_dir, src->path, "csv", &a, err, errlen);
		if (ret == 0)
			ret = tr_csv_open(src, a, out, err, errlen);
		break;
	case TR_DATA_NPY:
		ret = resolve(base_dir, src->x_path, "npy x", &a, err, errlen);
		if (ret == 0)
			ret = resolve(base_dir, src->y_path, "npy y", &b, err, errlen);
		if (ret == 0)
			ret = tr_npy_open(a, b, out, err, errlen);
		break;
	case TR_DATA_IDX:
		ret = resolve(base_dir, src->images_path, "idx images", &a, err, errlen);
		if (ret == 0)
			ret = resolve(base_dir, src->labels_path, "idx labels", &b, err, errlen);
		if (ret == 0)
			ret = tr_idx_open(a, b, out, err, errlen);
		break;
	case TR_DATA_SYNTHETIC:
		(void)job_seed; /* the spec parser fills data_seed (default: the job seed) */
		ret = tr_synthetic_open(src, src->data_seed, out, err, errlen);
		break;
	default:
		tr_data_errorf(err, errlen, "unknown data format %d", (int)src->format);
		ret = -EINVAL;
		break;
	}
	free(a);
	free(b);
	return ret;
}

void tr_reader_destroy(tr_reader_t *r)
{
	if (r)
		r->i->destroy(r);
}

struct slice {
	tr_reader_t base;
	tr_reader_t *src;
	int64_t begin;
};

static int slice_get(tr_reader_t *r, int64_t index, float *x, float *y, char *err, size_t errlen)
{
	struct slice *s = (struct slice *)r;

	if (index < 0 || index >= r->info.samples) {
		tr_data_errorf(err, errlen, "%s: sample %lld out of range (slice of %lld samples)", r->name,
			       (long long)index, (long long)r->info.samples);
		return -ERANGE;
	}
	return tr_reader_get(s->src, s->begin + index, x, y, err, errlen);
}

static void slice_destroy(tr_reader_t *r)
{
	free(r);
}

static const struct tr_reader_i slice_i = {
	.get = slice_get,
	.destroy = slice_destroy,
};

tr_reader_t *tr_reader_slice(tr_reader_t *base, int64_t begin, int64_t end)
{
	struct slice *s;

	if (!base || begin < 0 || end < begin || end > base->info.samples)
		return NULL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	s->base.i = &slice_i;
	s->base.info = base->info;
	s->base.info.samples = end - begin;
	memcpy(s->base.name, base->name, sizeof(s->base.name));
	s->src = base;
	s->begin = begin;
	return &s->base;
}
