/* IDX reader (the MNIST file format): an images file and a labels file.
 *
 * Both files are memory-mapped read-only, read under the SIGBUS guard and
 * checked for changes like .npy files (npy.c); `get` widens one image's bytes to
 * floats 0..255 (scaling is left to a "scale" transform so the reader stays
 * a plain view of the file).  Only unsigned-byte files are accepted, which
 * is what MNIST, Fashion-MNIST and EMNIST ship.  The downloads are gzip
 * files, so a gzip header gets its own message rather than "bad magic".
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/data/reader_internal.h"

struct idx_file {
	struct tr_data_map map;
	const unsigned char *data;
	int64_t count; /* first dimension */
	int64_t width; /* product of the others */
};

struct idx_reader {
	tr_reader_t base;
	_Atomic int64_t last_check; /* tr_data_check_due */
	struct idx_file images, labels;
};

static int idx_get(tr_reader_t *r, int64_t index, float *x, float *y, char *err, size_t errlen)
{
	struct idx_reader *d = (struct idx_reader *)r;
	const unsigned char *p;

	if (index < 0 || index >= r->info.samples) {
		tr_data_errorf(err, errlen, "%s: sample %lld out of range (%lld samples)", r->name,
			       (long long)index, (long long)r->info.samples);
		return -ERANGE;
	}
	const struct tr_data_map *maps[] = {&d->images.map, &d->labels.map};
	sigjmp_buf jb;
	if (sigsetjmp(jb, 0))
		return tr_data_guard_failed(err, errlen);
	tr_data_guard_begin(&jb, maps, 2);
	p = d->images.data + (size_t)index * (size_t)d->images.width;
	for (int64_t i = 0; i < d->images.width; i++)
		x[i] = (float)p[i];
	if (d->labels.data) /* prediction inputs have no labels */
		y[0] = (float)d->labels.data[index];
	tr_data_guard_end();
	return 0;
}

static int idx_labels(tr_reader_t *r, int64_t begin, int64_t count, float *y, char *err, size_t errlen)
{
	struct idx_reader *d = (struct idx_reader *)r;

	if (begin < 0 || count < 0 || begin + count > r->info.samples) {
		tr_data_errorf(err, errlen, "%s: samples %lld+%lld out of range (%lld samples)", r->name,
			       (long long)begin, (long long)count, (long long)r->info.samples);
		return -ERANGE;
	}
	const struct tr_data_map *maps[] = {&d->labels.map};
	sigjmp_buf jb;
	if (sigsetjmp(jb, 0))
		return tr_data_guard_failed(err, errlen);
	tr_data_guard_begin(&jb, maps, 1);
	for (int64_t i = 0; i < count; i++)
		y[i] = (float)d->labels.data[begin + i];
	tr_data_guard_end();
	return 0;
}

/* IDX records are numbered from 0, as the MNIST tools index them. */
static void idx_where(tr_reader_t *r, int64_t index, char *buf, size_t len)
{
	snprintf(buf, len, "%s: record %lld", ((struct idx_reader *)r)->labels.map.name, (long long)index);
}

static int idx_check(tr_reader_t *r, char *err, size_t errlen)
{
	struct idx_reader *d = (struct idx_reader *)r;
	int rc;

	if (!tr_data_check_due(&d->last_check))
		return 0;
	rc = tr_data_map_check(&d->images.map, err, errlen);

	if (rc == 0)
		rc = tr_data_map_check(&d->labels.map, err, errlen);
	if (rc)
		atomic_store(&d->last_check, -1);
	return rc;
}

static void file_unmap(struct idx_file *f)
{
	tr_data_map_release(&f->map);
}

static void idx_destroy(tr_reader_t *r)
{
	struct idx_reader *d = (struct idx_reader *)r;

	file_unmap(&d->images);
	file_unmap(&d->labels);
	free(d);
}

static const struct tr_reader_i idx_i = {
	.get = idx_get,
	.destroy = idx_destroy,
	.check = idx_check,
	.labels = idx_labels,
	.where = idx_where,
};

static uint32_t be32(const unsigned char *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Maps an IDX file of unsigned bytes (fd is owned from here on); images
 * need >= 2 dimensions (0x00000803 is [N, rows, cols]), labels exactly 1
 * (0x00000801).  Runs under the caller's SIGBUS guard. */
static int file_open(int fd, const char *path, int images, struct idx_file *f, char *err, size_t errlen)
{
	const unsigned char *m;
	int ret, ndims;
	size_t hdr;
	uint64_t total;

	ret = tr_data_map_open(fd, path, 8, "an IDX file", &f->map, err, errlen);
	if (ret)
		return ret;
	m = f->map.base;
	if (m[0] == 0x1f && m[1] == 0x8b) {
		tr_data_errorf(err, errlen, "%s: file is gzip-compressed; decompress it first (gunzip)",
			       path);
		goto invalid;
	}
	if (m[0] != 0 || m[1] != 0) {
		tr_data_errorf(err, errlen, "%s: not an IDX file (bad magic 0x%08x)", path, be32(m));
		goto invalid;
	}
	if (m[2] != 0x08) {
		tr_data_errorf(err, errlen,
			       "%s: IDX element type 0x%02x is not supported (only unsigned byte, 0x08)",
			       path, m[2]);
		goto invalid;
	}
	ndims = m[3];
	if (images ? ndims < 2 : ndims != 1) {
		tr_data_errorf(err, errlen,
			       "%s: expected an IDX %s file (magic 0x%08x), found %d dimensions (magic 0x%08x)",
			       path, images ? "images" : "labels", images ? 0x803u : 0x801u, ndims, be32(m));
		goto invalid;
	}
	hdr = 4 + 4 * (size_t)ndims;
	if (f->map.len < hdr) {
		tr_data_errorf(err, errlen, "%s: truncated IDX header", path);
		goto invalid;
	}
	f->count = be32(m + 4);
	f->width = 1;
	for (int d = 0; d < ndims; d++) {
		uint64_t v = be32(m + 4 + 4 * d);

		if (d > 0) {
			/* A zero dimension makes width 0 (refused below as no
			 * data); dividing by it would trap. */
			if (f->width != 0 && v > INT32_MAX / (uint64_t)f->width) {
				tr_data_errorf(err, errlen, "%s: too many values per sample", path);
				goto invalid;
			}
			f->width *= (int64_t)v;
		}
	}
	if (f->count == 0 || f->width == 0) {
		tr_data_errorf(err, errlen, "%s: IDX file holds no data", path);
		goto invalid;
	}
	/* count < 2^32 and width < 2^31, so the product cannot overflow. */
	total = (uint64_t)f->count * (uint64_t)f->width;
	if (total > f->map.len - hdr) {
		tr_data_errorf(err, errlen,
			       "%s: truncated: the header promises %llu bytes of data, the file has %llu",
			       path, (unsigned long long)total, (unsigned long long)(f->map.len - hdr));
		goto invalid;
	}
	f->data = m + hdr;
	return 0;
invalid:
	file_unmap(f);
	return -EINVAL;
}

int tr_idx_open(int images_fd, const char *images_path, int labels_fd, const char *labels_path, tr_reader_t **out,
		char *err, size_t errlen)
{
	struct idx_reader *d = calloc(1, sizeof(*d));
	volatile int labels_owned = 1; /* labels_fd not yet handed on */
	int ret;

	if (!d) {
		tr_data_errorf(err, errlen, "%s: out of memory", images_path);
		close(images_fd);
		close(labels_fd);
		return -ENOMEM;
	}
	const struct tr_data_map *maps[] = {&d->images.map, &d->labels.map};
	sigjmp_buf jb;
	if (sigsetjmp(jb, 0)) {
		ret = tr_data_guard_failed(err, errlen);
		goto fail;
	}
	tr_data_guard_begin(&jb, maps, 2);
	ret = file_open(images_fd, images_path, 1, &d->images, err, errlen);
	if (ret == 0 && labels_fd >= 0) {
		labels_owned = 0;
		ret = file_open(labels_fd, labels_path, 0, &d->labels, err, errlen);
	}
	tr_data_guard_end();
	if (ret)
		goto fail;
	if (labels_fd >= 0 && d->images.count != d->labels.count) {
		tr_data_errorf(err, errlen, "%s has %lld images but %s has %lld labels", images_path,
			       (long long)d->images.count, labels_path, (long long)d->labels.count);
		ret = -EINVAL;
		goto fail;
	}
	d->base.i = &idx_i;
	d->base.info.samples = d->images.count;
	d->base.info.features = (int)d->images.width;
	d->base.info.label_dim = labels_fd >= 0 ? 1 : 0;
	snprintf(d->base.name, sizeof(d->base.name), "%s", images_path);
	*out = &d->base;
	return 0;
fail:
	if (labels_owned)
		close(labels_fd);
	idx_destroy(&d->base);
	return ret;
}
