/* IDX reader (the MNIST file format): an images file and a labels file.
 *
 * Plain files are memory-mapped read-only, read under the SIGBUS guard and
 * checked for changes like .npy files (npy.c); `get` widens one image's bytes to
 * floats 0..255 (scaling is left to a "scale" transform so the reader stays
 * a plain view of the file).  Only unsigned-byte files are accepted, which
 * is what MNIST, Fashion-MNIST and EMNIST ship.
 *
 * The downloads (and Debian's dataset packages) are gzip files: a file
 * that starts with the gzip magic is inflated once at open into memory,
 * exactly as many bytes as its IDX header promises, so a file that
 * inflates to more (a "zip bomb") costs no more than its header says, and
 * the header itself is held to the same limits as a plain file's.  Memory
 * cannot change under the job, so those files need no guard or check.
 *
 * A 3-dimensional images file [N, rows, cols] gives its samples the shape
 * [1, rows, cols] (one grey channel), which image layers read as C, H, W;
 * other ranks stay flat.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "engine/data/reader_internal.h"
#include "engine/memory.h"

/* An inflated file larger than this is refused before any allocation
 * whatever the memory (the plain file's own bound, count < 2^32 and
 * width < 2^31, would allow far more than any machine holds); below it,
 * the memory available decides (inflate_file). */
#define IDX_MAX_INFLATED ((uint64_t)1 << 40)

struct idx_file {
	struct tr_data_map map;  /* plain files */
	unsigned char *inflated; /* gzip files: the whole file, inflated */
	int64_t inflated_bytes;
	const unsigned char *data;
	int64_t count; /* first dimension */
	int64_t width; /* product of the others */
	int ndims;
	uint32_t dims[3]; /* the first three dimensions, for the shape */
};

struct idx_reader {
	tr_reader_t base;
	_Atomic int64_t last_check; /* tr_data_check_due */
	struct idx_file images, labels;
};

static int idx_get(tr_reader_t *r, int64_t index, float *x, float *y, struct tr_error *err)
{
	struct idx_reader *d = (struct idx_reader *)r;
	const unsigned char *p;

	if (index < 0 || index >= r->info.samples) {
		tr_error_set(err, 0, 0, NULL, "%s: sample %lld out of range (%lld samples)", r->name, (long long)index,
			     (long long)r->info.samples);
		return -ERANGE;
	}
	const struct tr_data_map *maps[] = {&d->images.map, &d->labels.map};
	sigjmp_buf jb;
	if (sigsetjmp(jb, 0))
		return tr_data_guard_failed(err);
	tr_data_guard_begin(&jb, maps, 2);
	p = d->images.data + (size_t)index * (size_t)d->images.width;
	for (int64_t i = 0; i < d->images.width; i++)
		x[i] = (float)p[i];
	if (d->labels.data) /* prediction inputs have no labels */
		y[0] = (float)d->labels.data[index];
	tr_data_guard_end();
	return 0;
}

static int idx_labels(tr_reader_t *r, int64_t begin, int64_t count, float *y, struct tr_error *err)
{
	struct idx_reader *d = (struct idx_reader *)r;

	if (begin < 0 || count < 0 || begin + count > r->info.samples) {
		tr_error_set(err, 0, 0, NULL, "%s: samples %lld+%lld out of range (%lld samples)", r->name,
			     (long long)begin, (long long)count, (long long)r->info.samples);
		return -ERANGE;
	}
	const struct tr_data_map *maps[] = {&d->labels.map};
	sigjmp_buf jb;
	if (sigsetjmp(jb, 0))
		return tr_data_guard_failed(err);
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

static int idx_check(tr_reader_t *r, struct tr_error *err)
{
	struct idx_reader *d = (struct idx_reader *)r;
	int rc;

	if (!tr_data_check_due(&d->last_check))
		return 0;
	rc = tr_data_map_check(&d->images.map, err);

	if (rc == 0)
		rc = tr_data_map_check(&d->labels.map, err);
	if (rc)
		atomic_store(&d->last_check, -1);
	return rc;
}

static void file_unmap(struct idx_file *f)
{
	tr_data_map_release(&f->map);
	free(f->inflated);
	f->inflated = NULL;
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

/* Checks an IDX header of unsigned bytes at m (len bytes available, at
 * least 4); images need >= 2 dimensions (0x00000803 is [N, rows, cols]),
 * labels exactly 1 (0x00000801).  Sets f's count, width and dims and
 * *hdr, the header's size.  With need_all, len must also hold the data.
 * Returns 0, -EAGAIN when len is short of the header (gzip: inflate more),
 * or -EINVAL with a message. */
static int parse_header(const unsigned char *m, size_t len, const char *path, int images, int need_all,
			struct idx_file *f, size_t *hdr, struct tr_error *err)
{
	int ndims;
	uint64_t total;

	if (m[0] != 0 || m[1] != 0) {
		tr_error_set(err, 0, 0, NULL, "%s: not an IDX file (bad magic 0x%08x)", path, be32(m));
		return -EINVAL;
	}
	if (m[2] != 0x08) {
		tr_error_set(err, 0, 0, NULL, "%s: IDX element type 0x%02x is not supported (only unsigned byte, 0x08)",
			     path, m[2]);
		return -EINVAL;
	}
	ndims = m[3];
	if (images ? ndims < 2 : ndims != 1) {
		tr_error_set(err, 0, 0, NULL,
			     "%s: expected an IDX %s file (magic 0x%08x), found %d dimensions (magic 0x%08x)", path,
			     images ? "images" : "labels", images ? 0x803u : 0x801u, ndims, be32(m));
		return -EINVAL;
	}
	*hdr = 4 + 4 * (size_t)ndims;
	if (len < *hdr) {
		if (!need_all)
			return -EAGAIN;
		tr_error_set(err, 0, 0, NULL, "%s: truncated IDX header", path);
		return -EINVAL;
	}
	f->ndims = ndims;
	f->count = be32(m + 4);
	f->width = 1;
	for (int d = 0; d < ndims; d++) {
		uint64_t v = be32(m + 4 + 4 * d);

		if (d < 3)
			f->dims[d] = (uint32_t)v;
		if (d > 0) {
			/* A zero dimension makes width 0 (refused below as no
			 * data); dividing by it would trap. */
			if (f->width != 0 && v > INT32_MAX / (uint64_t)f->width) {
				tr_error_set(err, 0, 0, NULL, "%s: too many values per sample", path);
				return -EINVAL;
			}
			f->width *= (int64_t)v;
		}
	}
	if (f->count == 0 || f->width == 0) {
		tr_error_set(err, 0, 0, NULL, "%s: IDX file holds no data", path);
		return -EINVAL;
	}
	/* count < 2^32 and width < 2^31, so the product cannot overflow. */
	total = (uint64_t)f->count * (uint64_t)f->width;
	if (need_all && total > len - *hdr) {
		tr_error_set(err, 0, 0, NULL,
			     "%s: truncated: the header promises %llu bytes of data, the file has %llu", path,
			     (unsigned long long)total, (unsigned long long)(len - *hdr));
		return -EINVAL;
	}
	return 0;
}

/* Inflates the gzip file fd (owned by the call) into f->inflated: first
 * the IDX header, then exactly the bytes it promises.  Not mapped, so no
 * SIGBUS can come from it. */
static int inflate_file(int fd, const char *path, int images, struct idx_file *f, struct tr_error *err)
{
	unsigned char in[65536], head[4 + 4 * 255];
	z_stream z;
	size_t hdr = 0, want, have = 0;
	uint64_t total = 0, avail;
	int source;
	unsigned char *out = head;
	int ret = 0, zr = Z_OK, in_eof = 0;

	memset(&z, 0, sizeof(z));
	/* 15 + 16: a gzip wrapper only; members concatenated by `cat a.gz
	 * b.gz` are followed below with inflateReset. */
	if (inflateInit2(&z, 15 + 16) != Z_OK) {
		tr_error_set(err, 0, 0, NULL, "%s: out of memory", path);
		close(fd);
		return -ENOMEM;
	}
	want = 4;
	for (;;) {
		if (have == want) {
			if (out != head)
				break; /* all the data the header promises */
			ret = parse_header(head, have, path, images, 0, f, &hdr, err);
			if (ret == -EAGAIN) {
				want = 4 + 4 * (size_t)head[3];
				continue;
			}
			if (ret)
				goto out;
			total = (uint64_t)f->count * (uint64_t)f->width;
			/* Admitted against the memory there is, not a fixed size:
			 * the header's promise is checked before any of it is
			 * allocated (engine/memory.h). */
			avail = tr_mem_available(&source);
			if (total > IDX_MAX_INFLATED - hdr || hdr + total > avail) {
				tr_error_set(err, 0, 0, NULL,
					     "%s: the IDX header promises %llu bytes of data inflated, more than the "
					     "%llu bytes of memory available (%s)",
					     path, (unsigned long long)total, (unsigned long long)avail,
					     tr_mem_source_name(source));
				ret = -ENOMEM;
				goto out;
			}
			f->inflated_bytes = (int64_t)(hdr + total);
			f->inflated = malloc(hdr + (size_t)total);
			if (!f->inflated) {
				tr_error_set(err, 0, 0, NULL, "%s: out of memory for %llu inflated bytes", path,
					     (unsigned long long)(hdr + total));
				ret = -ENOMEM;
				goto out;
			}
			memcpy(f->inflated, head, hdr);
			out = f->inflated;
			want = hdr + (size_t)total;
			continue;
		}
		if (zr == Z_STREAM_END) {
			/* Another gzip member may follow. */
			if (z.avail_in == 0 && in_eof)
				break;
			if (inflateReset(&z) != Z_OK)
				break;
		}
		if (z.avail_in == 0 && !in_eof) {
			ssize_t n = read(fd, in, sizeof(in));

			if (n < 0) {
				ret = -errno;
				tr_error_set(err, 0, 0, NULL, "%s: %s", path, strerror(errno));
				goto out;
			}
			if (n == 0)
				in_eof = 1;
			z.next_in = in;
			z.avail_in = (uInt)n;
		}
		z.next_out = out + have;
		z.avail_out = (uInt)(want - have > (1u << 30) ? (1u << 30) : want - have);
		{
			uInt before = z.avail_out;

			zr = inflate(&z, Z_NO_FLUSH);
			have += before - z.avail_out;
		}
		if (zr == Z_BUF_ERROR && in_eof && z.avail_in == 0)
			break; /* the file ends inside the stream */
		if (zr != Z_OK && zr != Z_STREAM_END && zr != Z_BUF_ERROR) {
			tr_error_set(err, 0, 0, NULL, "%s: corrupt gzip data (%s)", path,
				     z.msg ? z.msg : "inflate failed");
			ret = -EINVAL;
			goto out;
		}
	}
	if (have < want) {
		if (out == head)
			tr_error_set(err, 0, 0, NULL, "%s: truncated IDX header (after gunzip)", path);
		else
			tr_error_set(err, 0, 0, NULL,
				     "%s: truncated: the header promises %llu bytes of data, the file inflates "
				     "to %llu",
				     path, (unsigned long long)total, (unsigned long long)(have - hdr));
		ret = -EINVAL;
		goto out;
	}
	f->data = f->inflated + hdr;
out:
	inflateEnd(&z);
	close(fd);
	return ret;
}

/* Opens an IDX file of unsigned bytes (fd is owned from here on): plain
 * files are mapped, gzip files inflated.  Runs under the caller's SIGBUS
 * guard. */
static int file_open(int fd, const char *path, int images, struct idx_file *f, struct tr_error *err)
{
	size_t hdr;
	int ret;

	ret = tr_data_map_open(fd, path, 4, "an IDX file", &f->map, err);
	if (ret)
		return ret;
	if (f->map.base[0] == 0x1f && f->map.base[1] == 0x8b) {
		/* The map was only for the magic: the descriptor goes to zlib. */
		int dup_fd = dup(f->map.fd);

		if (dup_fd < 0) {
			ret = -errno;
			tr_error_set(err, 0, 0, NULL, "%s: %s", path, strerror(errno));
			file_unmap(f);
			return ret;
		}
		file_unmap(f);
		ret = inflate_file(dup_fd, path, images, f, err);
		if (ret)
			file_unmap(f);
		return ret;
	}
	ret = parse_header(f->map.base, f->map.len, path, images, 1, f, &hdr, err);
	if (ret) {
		file_unmap(f);
		return -EINVAL;
	}
	f->data = f->map.base + hdr;
	return 0;
}

int tr_idx_open(int images_fd, const char *images_path, int labels_fd, const char *labels_path, tr_reader_t **out,
		struct tr_error *err)
{
	struct idx_reader *d = calloc(1, sizeof(*d));
	volatile int labels_owned = 1; /* labels_fd not yet handed on */
	int ret;

	if (!d) {
		tr_error_set(err, 0, 0, NULL, "%s: out of memory", images_path);
		close(images_fd);
		close(labels_fd);
		return -ENOMEM;
	}
	const struct tr_data_map *maps[] = {&d->images.map, &d->labels.map};
	sigjmp_buf jb;
	if (sigsetjmp(jb, 0)) {
		ret = tr_data_guard_failed(err);
		goto fail;
	}
	tr_data_guard_begin(&jb, maps, 2);
	ret = file_open(images_fd, images_path, 1, &d->images, err);
	if (ret == 0 && labels_fd >= 0) {
		labels_owned = 0;
		ret = file_open(labels_fd, labels_path, 0, &d->labels, err);
	}
	tr_data_guard_end();
	if (ret)
		goto fail;
	if (labels_fd >= 0 && d->images.count != d->labels.count) {
		tr_error_set(err, 0, 0, NULL, "%s has %lld images but %s has %lld labels", images_path,
			     (long long)d->images.count, labels_path, (long long)d->labels.count);
		ret = -EINVAL;
		goto fail;
	}
	d->base.i = &idx_i;
	d->base.info.samples = d->images.count;
	d->base.info.features = (int)d->images.width;
	d->base.info.label_dim = labels_fd >= 0 ? 1 : 0;
	d->base.resident_bytes = d->images.inflated_bytes + d->labels.inflated_bytes;
	if (d->images.ndims == 3) {
		d->base.info.shape[0] = 1;
		d->base.info.shape[1] = (int)d->images.dims[1];
		d->base.info.shape[2] = (int)d->images.dims[2];
	}
	snprintf(d->base.name, sizeof(d->base.name), "%s", images_path);
	*out = &d->base;
	return 0;
fail:
	if (labels_owned)
		close(labels_fd);
	idx_destroy(&d->base);
	return ret;
}
