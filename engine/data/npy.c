/* NumPy .npy reader: an x array [N, ...] and a y array [N] or [N, L].
 *
 * Both files are memory-mapped read-only and converted to float one row
 * at a time in `get`, so a dataset larger than memory costs only page
 * cache and several loader threads can read it without locks.  Every read
 * of the mappings runs under the SIGBUS guard and `check` compares the
 * files with what was mapped (reader_internal.h), so a file truncated or
 * rewritten under the job fails the job, not the process: a pread per
 * sample instead costs two system calls per sample, 4x the whole step of
 * a small model (bench/README.md).  Only the
 * header is parsed at open (versions 1.0, 2.0 and 3.0; the dict literal
 * numpy writes), which is where every shape, dtype and size problem is
 * reported.  Loads go through memcpy because nothing forces a writer
 * other than numpy to align the data.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/data/reader_internal.h"

enum dtype { DT_F4, DT_F8, DT_I4, DT_I8, DT_U1, DT_I1 };

#define MAX_DIMS 32

struct npy_array {
	struct tr_data_map map;
	const unsigned char *data;
	enum dtype dtype;
	size_t itemsize;
	int64_t rows;  /* shape[0] */
	int64_t width; /* product of the other dimensions, 1 for 1-D */
	int ndim;
};

struct npy_reader {
	tr_reader_t base;
	_Atomic int64_t last_check; /* tr_data_check_due */
	struct npy_array x, y;
};

static void convert(const struct npy_array *a, int64_t row, float *dst)
{
	const unsigned char *p = a->data + (size_t)row * (size_t)a->width * a->itemsize;
	size_t n = (size_t)a->width;

	switch (a->dtype) {
	case DT_F4:
		memcpy(dst, p, n * sizeof(float));
		break;
	case DT_F8:
		for (size_t i = 0; i < n; i++) {
			double v;

			memcpy(&v, p + i * 8, 8);
			dst[i] = (float)v;
		}
		break;
	case DT_I4:
		for (size_t i = 0; i < n; i++) {
			int32_t v;

			memcpy(&v, p + i * 4, 4);
			dst[i] = (float)v;
		}
		break;
	case DT_I8:
		for (size_t i = 0; i < n; i++) {
			int64_t v;

			memcpy(&v, p + i * 8, 8);
			dst[i] = (float)v;
		}
		break;
	case DT_U1:
		for (size_t i = 0; i < n; i++)
			dst[i] = (float)p[i];
		break;
	case DT_I1:
		for (size_t i = 0; i < n; i++)
			dst[i] = (float)(int8_t)p[i];
		break;
	}
}

static int npy_get(tr_reader_t *r, int64_t index, float *x, float *y, struct tr_error *err)
{
	struct npy_reader *n = (struct npy_reader *)r;

	if (index < 0 || index >= r->info.samples) {
		tr_error_set(err, 0, 0, NULL, "%s: sample %lld out of range (%lld samples)", r->name, (long long)index,
			     (long long)r->info.samples);
		return -ERANGE;
	}
	const struct tr_data_map *maps[] = {&n->x.map, &n->y.map};
	sigjmp_buf jb;
	if (sigsetjmp(jb, 0))
		return tr_data_guard_failed(err);
	tr_data_guard_begin(&jb, maps, 2);
	convert(&n->x, index, x);
	if (n->y.data) /* prediction inputs have no y */
		convert(&n->y, index, y);
	tr_data_guard_end();
	return 0;
}

static int npy_labels(tr_reader_t *r, int64_t begin, int64_t count, float *y, struct tr_error *err)
{
	struct npy_reader *n = (struct npy_reader *)r;

	if (begin < 0 || count < 0 || begin + count > r->info.samples) {
		tr_error_set(err, 0, 0, NULL, "%s: samples %lld+%lld out of range (%lld samples)", r->name,
			     (long long)begin, (long long)count, (long long)r->info.samples);
		return -ERANGE;
	}
	const struct tr_data_map *maps[] = {&n->y.map};
	sigjmp_buf jb;
	if (sigsetjmp(jb, 0))
		return tr_data_guard_failed(err);
	tr_data_guard_begin(&jb, maps, 1);
	for (int64_t i = 0; i < count; i++)
		convert(&n->y, begin + i, y + (size_t)i * (size_t)n->y.width);
	tr_data_guard_end();
	return 0;
}

/* npy records are numbered from 0, as numpy indexes them. */
static void npy_where(tr_reader_t *r, int64_t index, char *buf, size_t len)
{
	snprintf(buf, len, "%s: record %lld", ((struct npy_reader *)r)->y.map.name, (long long)index);
}

static int npy_check(tr_reader_t *r, struct tr_error *err)
{
	struct npy_reader *n = (struct npy_reader *)r;
	int rc;

	if (!tr_data_check_due(&n->last_check))
		return 0;
	rc = tr_data_map_check(&n->x.map, err);

	if (rc == 0)
		rc = tr_data_map_check(&n->y.map, err);
	if (rc)
		atomic_store(&n->last_check, -1);
	return rc;
}

static void array_unmap(struct npy_array *a)
{
	tr_data_map_release(&a->map);
}

static void npy_destroy(tr_reader_t *r)
{
	struct npy_reader *n = (struct npy_reader *)r;

	array_unmap(&n->x);
	array_unmap(&n->y);
	free(n);
}

static const struct tr_reader_i npy_i = {
	.get = npy_get,
	.destroy = npy_destroy,
	.labels = npy_labels,
	.where = npy_where,
	.check = npy_check,
};

/* A cursor over the header's Python dict literal. */
struct lexer {
	const char *p, *end;
};

static void skip_ws(struct lexer *lx)
{
	while (lx->p < lx->end && (*lx->p == ' ' || *lx->p == '\t' || *lx->p == '\n' || *lx->p == '\r'))
		lx->p++;
}

static int accept(struct lexer *lx, char ch)
{
	skip_ws(lx);
	if (lx->p < lx->end && *lx->p == ch) {
		lx->p++;
		return 1;
	}
	return 0;
}

/* A quoted string into buf; 0 or -1. */
static int lex_string(struct lexer *lx, char *buf, size_t cap)
{
	char q;
	size_t n = 0;

	skip_ws(lx);
	if (lx->p >= lx->end || (*lx->p != '\'' && *lx->p != '"'))
		return -1;
	q = *lx->p++;
	while (lx->p < lx->end && *lx->p != q) {
		if (n + 1 >= cap)
			return -1;
		buf[n++] = *lx->p++;
	}
	if (lx->p >= lx->end)
		return -1;
	lx->p++;
	buf[n] = '\0';
	return 0;
}

static int lex_word(struct lexer *lx, const char *w)
{
	size_t n = strlen(w);

	skip_ws(lx);
	if ((size_t)(lx->end - lx->p) >= n && memcmp(lx->p, w, n) == 0) {
		lx->p += n;
		return 1;
	}
	return 0;
}

/* "(3, 4)", "(3,)" or "()"; dims >= 0. */
static int lex_shape(struct lexer *lx, int64_t *dims, int *ndim)
{
	*ndim = 0;
	if (!accept(lx, '('))
		return -1;
	for (;;) {
		int64_t v = 0;
		int digits = 0;

		if (accept(lx, ')'))
			return 0;
		skip_ws(lx);
		while (lx->p < lx->end && *lx->p >= '0' && *lx->p <= '9') {
			if (v > (INT64_MAX - 9) / 10)
				return -1;
			v = v * 10 + (*lx->p++ - '0');
			digits++;
		}
		if (!digits || *ndim >= MAX_DIMS)
			return -1;
		accept(lx, 'L'); /* Python 2 longs */
		dims[(*ndim)++] = v;
		if (accept(lx, ')'))
			return 0;
		if (!accept(lx, ','))
			return -1;
	}
}

static int parse_descr(const char *d, enum dtype *dt, size_t *itemsize)
{
	static const struct {
		const char *code;
		enum dtype dt;
		size_t size;
	} table[] = {
		{"f4", DT_F4, 4}, {"f8", DT_F8, 8}, {"i4", DT_I4, 4},
		{"i8", DT_I8, 8}, {"u1", DT_U1, 1}, {"i1", DT_I1, 1},
	};

	if (d[0] != '<' && d[0] != '|' && d[0] != '=' && d[0] != '>')
		return -1;
	for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
		if (strcmp(d + 1, table[i].code) != 0)
			continue;
		/* '=' is native order; '>' is fine only for single bytes. */
		if (table[i].size > 1 && (d[0] == '|' || d[0] == '>'))
			return -1;
		*dt = table[i].dt;
		*itemsize = table[i].size;
		return 0;
	}
	return -1;
}

/* Maps fd (owned from here on) and parses its header; is_x selects the
 * shape rules.  Runs under the caller's SIGBUS guard. */
static int array_open(int fd, const char *path, int is_x, struct npy_array *a, struct tr_error *err)
{
	const unsigned char *m;
	struct lexer lx;
	char key[32], descr[32] = "";
	int64_t dims[MAX_DIMS];
	int ndim = -1, fortran = -1, ret;
	size_t hoff, hlen, data_off;
	uint64_t count = 1;

	ret = tr_data_map_open(fd, path, 10, "a .npy file", &a->map, err);
	if (ret)
		return ret;
	m = a->map.base;
	if (memcmp(m, "\x93NUMPY", 6) != 0) {
		tr_error_set(err, 0, 0, NULL, "%s: not a .npy file (bad magic)", path);
		goto invalid;
	}
	if (m[6] == 1) {
		hoff = 10;
		hlen = (size_t)m[8] | (size_t)m[9] << 8;
	} else if ((m[6] == 2 || m[6] == 3) && a->map.len >= 12) {
		hoff = 12;
		hlen = (size_t)m[8] | (size_t)m[9] << 8 | (size_t)m[10] << 16 | (size_t)m[11] << 24;
	} else {
		tr_error_set(err, 0, 0, NULL, "%s: unsupported .npy format version %d.%d", path, m[6], m[7]);
		goto invalid;
	}
	if (hlen > a->map.len - hoff) {
		tr_error_set(err, 0, 0, NULL, "%s: truncated .npy header", path);
		goto invalid;
	}
	data_off = hoff + hlen;
	lx.p = (const char *)m + hoff;
	lx.end = lx.p + hlen;
	if (!accept(&lx, '{'))
		goto bad_header;
	while (!accept(&lx, '}')) {
		if (lex_string(&lx, key, sizeof(key)) || !accept(&lx, ':'))
			goto bad_header;
		if (strcmp(key, "descr") == 0) {
			if (accept(&lx, '[')) {
				tr_error_set(err, 0, 0, NULL, "%s: structured dtypes are not supported", path);
				goto invalid;
			}
			if (lex_string(&lx, descr, sizeof(descr)))
				goto bad_header;
		} else if (strcmp(key, "fortran_order") == 0) {
			if (lex_word(&lx, "True"))
				fortran = 1;
			else if (lex_word(&lx, "False"))
				fortran = 0;
			else
				goto bad_header;
		} else if (strcmp(key, "shape") == 0) {
			if (lex_shape(&lx, dims, &ndim))
				goto bad_header;
		} else {
			goto bad_header;
		}
		if (!accept(&lx, ',')) {
			if (!accept(&lx, '}'))
				goto bad_header;
			break;
		}
	}
	if (!descr[0] || fortran < 0 || ndim < 0)
		goto bad_header;
	if (fortran) {
		tr_error_set(err, 0, 0, NULL,
			     "%s: Fortran-order arrays are not supported; save with np.ascontiguousarray", path);
		goto invalid;
	}
	if (parse_descr(descr, &a->dtype, &a->itemsize)) {
		tr_data_sanitize(descr);
		tr_error_set(err, 0, 0, NULL, "%s: unsupported dtype '%.8s' (use <f4, <f8, <i4, <i8, |u1 or |i1)", path,
			     descr);
		goto invalid;
	}
	if (is_x && ndim < 2) {
		tr_error_set(err, 0, 0, NULL, "%s: x must have at least 2 dimensions [samples, features], got %d", path,
			     ndim);
		goto invalid;
	}
	if (!is_x && (ndim < 1 || ndim > 2)) {
		tr_error_set(err, 0, 0, NULL,
			     "%s: y must be 1-D [samples] or 2-D [samples, outputs], got %d dimensions", path, ndim);
		goto invalid;
	}
	a->ndim = ndim;
	a->rows = dims[0];
	a->width = 1;
	for (int d = 1; d < ndim; d++) {
		if (dims[d] > 0 && a->width > INT32_MAX / dims[d]) {
			tr_error_set(err, 0, 0, NULL, "%s: too many values per sample", path);
			goto invalid;
		}
		a->width *= dims[d];
	}
	if (a->rows == 0 || a->width == 0) {
		tr_error_set(err, 0, 0, NULL, "%s: array is empty", path);
		goto invalid;
	}
	for (int d = 0; d < ndim; d++) {
		if ((uint64_t)dims[d] > UINT64_MAX / a->itemsize / count) {
			tr_error_set(err, 0, 0, NULL, "%s: shape too large", path);
			goto invalid;
		}
		count *= (uint64_t)dims[d];
	}
	if (count * a->itemsize > a->map.len - data_off) {
		tr_error_set(err, 0, 0, NULL,
			     "%s: truncated: the header promises %llu bytes of data, the file has %llu", path,
			     (unsigned long long)(count * a->itemsize), (unsigned long long)(a->map.len - data_off));
		goto invalid;
	}
	a->data = m + data_off;
	return 0;
bad_header:
	tr_error_set(err, 0, 0, NULL, "%s: malformed .npy header", path);
invalid:
	array_unmap(a);
	return -EINVAL;
}

int tr_npy_open(int x_fd, const char *x_path, int y_fd, const char *y_path, tr_reader_t **out, struct tr_error *err)
{
	struct npy_reader *n;
	volatile int y_owned = 1; /* y_fd not yet handed on */
	int ret;

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
	tr_error_set(err, 0, 0, NULL, "%s: .npy files are only supported on little-endian hosts", x_path);
	close(x_fd);
	close(y_fd);
	return -ENOTSUP;
#endif
	n = calloc(1, sizeof(*n));
	if (!n) {
		tr_error_set(err, 0, 0, NULL, "%s: out of memory", x_path);
		close(x_fd);
		close(y_fd);
		return -ENOMEM;
	}
	/* The headers are read from the mappings too: a file cut short while
	 * they are parsed must fail the open, not the process. */
	const struct tr_data_map *maps[] = {&n->x.map, &n->y.map};
	sigjmp_buf jb;
	if (sigsetjmp(jb, 0)) {
		ret = tr_data_guard_failed(err);
		goto fail;
	}
	tr_data_guard_begin(&jb, maps, 2);
	ret = array_open(x_fd, x_path, 1, &n->x, err);
	if (ret == 0 && y_fd >= 0) {
		y_owned = 0;
		ret = array_open(y_fd, y_path, 0, &n->y, err);
	}
	tr_data_guard_end();
	if (ret)
		goto fail;
	if (y_fd >= 0 && n->x.rows != n->y.rows) {
		tr_error_set(err, 0, 0, NULL, "%s has %lld samples but %s has %lld", x_path, (long long)n->x.rows,
			     y_path, (long long)n->y.rows);
		ret = -EINVAL;
		goto fail;
	}
	n->base.i = &npy_i;
	n->base.info.samples = n->x.rows;
	n->base.info.features = (int)n->x.width;
	n->base.info.label_dim = y_fd >= 0 ? (int)n->y.width : 0;
	snprintf(n->base.name, sizeof(n->base.name), "%s", x_path);
	*out = &n->base;
	return 0;
fail:
	if (y_owned)
		close(y_fd);
	npy_destroy(&n->base);
	return ret;
}
