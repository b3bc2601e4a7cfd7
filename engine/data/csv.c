/* CSV reader: numeric, comma separated, parsed once at open.
 *
 * The whole file is parsed into two dense float arrays (features, labels)
 * when the job starts, so a bad value fails the job before the first step
 * with "file:line: column c: ..." instead of failing a loader thread an
 * hour in, and `get` is a bounds check and two memcpys, trivially
 * thread-safe.  Blank lines are skipped wherever they appear (editors and
 * exporters leave them at the end); a UTF-8 byte order mark is ignored.
 * Quoting is not supported: the format is for numeric tables.  Numbers
 * are parsed in the C locale whatever the process locale is, so "0.5"
 * never depends on LC_NUMERIC.
 */
#include <errno.h>
#include <locale.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/data/reader_internal.h"

/* The most of a bad field an error quotes. */
#define QUOTE_MAX 12

struct csv_reader {
	tr_reader_t base;
	float *x; /* [samples, features] */
	float *y; /* [samples, label_dim] */
	/* The file line of each row, for messages after the parse: row r is
	 * on line brk_line[k] + (r - brk_row[k]) for the last k with
	 * brk_row[k] <= r.  A break is recorded only where lines were skipped
	 * (the header, blank lines), so this is a handful of entries. */
	int64_t *brk_row, *brk_line;
	size_t n_brk, brk_cap;
};

static int csv_get(tr_reader_t *r, int64_t index, float *x, float *y, struct tr_error *err)
{
	struct csv_reader *c = (struct csv_reader *)r;
	size_t f = (size_t)r->info.features, l = (size_t)r->info.label_dim;

	if (index < 0 || index >= r->info.samples) {
		tr_error_set(err, 0, 0, NULL, "%s: sample %lld out of range (%lld samples)", r->name, (long long)index,
			     (long long)r->info.samples);
		return -ERANGE;
	}
	memcpy(x, c->x + (size_t)index * f, f * sizeof(float));
	if (l > 0)
		memcpy(y, c->y + (size_t)index * l, l * sizeof(float));
	return 0;
}

static int csv_labels(tr_reader_t *r, int64_t begin, int64_t count, float *y, struct tr_error *err)
{
	struct csv_reader *c = (struct csv_reader *)r;
	size_t l = (size_t)r->info.label_dim;

	if (begin < 0 || count < 0 || begin + count > r->info.samples) {
		tr_error_set(err, 0, 0, NULL, "%s: samples %lld+%lld out of range (%lld samples)", r->name,
			     (long long)begin, (long long)count, (long long)r->info.samples);
		return -ERANGE;
	}
	memcpy(y, c->y + (size_t)begin * l, (size_t)count * l * sizeof(float));
	return 0;
}

static void csv_where(tr_reader_t *r, int64_t index, char *buf, size_t len)
{
	struct csv_reader *c = (struct csv_reader *)r;
	size_t lo = 0, hi = c->n_brk;

	while (hi - lo > 1) { /* the last break at or before index */
		size_t mid = lo + (hi - lo) / 2;

		if (c->brk_row[mid] <= index)
			lo = mid;
		else
			hi = mid;
	}
	snprintf(buf, len, "%s:%lld", r->name,
		 c->n_brk ? (long long)(c->brk_line[lo] + (index - c->brk_row[lo])) : (long long)index + 1);
}

/* Records that row `row` is on line `line` when that breaks the run of
 * consecutive lines. */
static int note_line(struct csv_reader *c, int64_t row, int64_t line)
{
	if (c->n_brk && c->brk_line[c->n_brk - 1] + (row - c->brk_row[c->n_brk - 1]) == line)
		return 0;
	if (c->n_brk == c->brk_cap) {
		size_t nc = c->brk_cap ? c->brk_cap * 2 : 8;
		int64_t *a = realloc(c->brk_row, nc * sizeof(*a)), *b;

		if (!a)
			return -ENOMEM;
		c->brk_row = a;
		b = realloc(c->brk_line, nc * sizeof(*b));
		if (!b)
			return -ENOMEM;
		c->brk_line = b;
		c->brk_cap = nc;
	}
	c->brk_row[c->n_brk] = row;
	c->brk_line[c->n_brk++] = line;
	return 0;
}

static void csv_destroy(tr_reader_t *r)
{
	struct csv_reader *c = (struct csv_reader *)r;

	free(c->x);
	free(c->y);
	free(c->brk_row);
	free(c->brk_line);
	free(c);
}

static const struct tr_reader_i csv_i = {
	.get = csv_get,
	.destroy = csv_destroy,
	.labels = csv_labels,
	.where = csv_where,
};

/* Reads the whole of fd (owned: closed here), NUL terminated.  *len
 * excludes the terminator.  Checks `cancel` between reads, so a huge file
 * on slow storage does not hold a cancelled job. */
static int slurp(int fd, const char *path, const atomic_bool *cancel, char **buf, size_t *len, struct tr_error *err)
{
	size_t cap = 0, n = 0;
	char *b = NULL, *nb;
	int ret;

	for (;;) {
		ssize_t got;

		if (cancel && atomic_load(cancel)) {
			ret = -ECANCELED;
			tr_error_set(err, 0, 0, NULL, "cancelled");
			goto fail;
		}
		if (cap - n < 2) {
			size_t nc = cap ? cap * 2 : (size_t)1 << 16;

			nb = realloc(b, nc);
			if (!nb) {
				ret = -ENOMEM;
				tr_error_set(err, 0, 0, NULL, "%s: out of memory", path);
				goto fail;
			}
			b = nb;
			cap = nc;
		}
		got = read(fd, b + n, cap - n - 1);
		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0) {
			ret = -errno;
			tr_error_set(err, 0, 0, NULL, "%s: %s", path, strerror(errno));
			goto fail;
		}
		if (got == 0)
			break;
		n += (size_t)got;
	}
	b[n] = '\0';
	close(fd);
	*buf = b;
	*len = n;
	return 0;
fail:
	free(b);
	close(fd);
	return ret;
}

static int is_blank(const char *s, const char *e)
{
	for (; s < e; s++)
		if (*s != ' ' && *s != '\t' && *s != '\r')
			return 0;
	return 1;
}

/* Appends one row's worth of space to a growing array; rows counts the
 * rows already stored. */
static int grow(float **a, size_t *cap_rows, size_t rows, size_t width)
{
	size_t nc;
	float *na;

	if (rows < *cap_rows)
		return 0;
	nc = *cap_rows ? *cap_rows * 2 : 1024;
	if (width && nc > SIZE_MAX / sizeof(float) / width)
		return -ENOMEM;
	/* Never realloc to 0 bytes (prediction inputs have no labels): that
	 * frees the array and returns NULL. */
	na = realloc(*a, nc * (width ? width : 1) * sizeof(float));
	if (!na)
		return -ENOMEM;
	*a = na;
	*cap_rows = nc;
	return 0;
}

/* Maps each column to its destination: >= 0 a feature index, < 0 label
 * -(k + 1).  Fails when a label column is out of range or repeated. */
static int map_columns(const struct tr_source_spec *src, const char *path, long long line, int ncols, int *dest,
		       int *n_labels, struct tr_error *err)
{
	int nl = src->unlabeled ? 0 : src->n_label_cols > 0 ? src->n_label_cols : 1;
	int f = 0;

	if (src->n_label_cols > TR_SPEC_MAX_LABEL_COLS) {
		tr_error_set(err, 0, 0, NULL, "%s: too many label columns (%d)", path, src->n_label_cols);
		return -EINVAL;
	}
	for (int c = 0; c < ncols; c++)
		dest[c] = 0;
	for (int k = 0; k < nl; k++) {
		int want = src->n_label_cols > 0 ? src->label_cols[k] : -1;
		int c = want < 0 ? ncols + want : want;

		if (c < 0 || c >= ncols) {
			tr_error_set(err, 0, 0, NULL, "%s:%lld: label column %d out of range (the file has %d columns)",
				     path, line, want, ncols);
			return -EINVAL;
		}
		if (dest[c] < 0) {
			tr_error_set(err, 0, 0, NULL, "%s: label column %d given twice", path, want);
			return -EINVAL;
		}
		dest[c] = -(k + 1);
	}
	for (int c = 0; c < ncols; c++)
		if (dest[c] == 0)
			dest[c] = f++;
	if (f == 0) {
		tr_error_set(err, 0, 0, NULL, "%s:%lld: no feature columns (all %d columns are labels)", path, line,
			     ncols);
		return -EINVAL;
	}
	*n_labels = nl;
	return 0;
}

int tr_csv_open(const struct tr_source_spec *src, int fd, const char *path, const atomic_bool *cancel,
		tr_reader_t **out, struct tr_error *err)
{
	struct csv_reader *c = NULL;
	char *buf = NULL, *p, *end;
	size_t len = 0, rows = 0, xcap = 0, ycap = 0;
	int *dest = NULL, ncols = 0, nf = 0, nl = 0, ret;
	long long line = 0;
	locale_t cloc;

	ret = slurp(fd, path, cancel, &buf, &len, err);
	if (ret)
		return ret;
	cloc = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
	if (cloc == (locale_t)0) {
		free(buf);
		tr_error_set(err, 0, 0, NULL, "%s: cannot create the C locale", path);
		return -ENOMEM;
	}
	c = calloc(1, sizeof(*c));
	if (!c)
		goto oom;
	p = buf;
	end = buf + len;
	if (len >= 3 && memcmp(p, "\xEF\xBB\xBF", 3) == 0)
		p += 3;
	while (p < end) {
		char *e = memchr(p, '\n', (size_t)(end - p));
		char *q;
		long long cols = 1;

		if (!e)
			e = end;
		line++;
		if ((line & 0xfff) == 0 && cancel && atomic_load(cancel)) {
			tr_error_set(err, 0, 0, NULL, "cancelled");
			ret = -ECANCELED;
			goto fail;
		}
		if ((line == 1 && src->header) || is_blank(p, e))
			goto next;
		for (q = p; q < e; q++)
			cols += *q == ',';
		if (cols > (1 << 24)) {
			tr_error_set(err, 0, 0, NULL, "%s:%lld: too many columns (%lld)", path, line, cols);
			ret = -EINVAL;
			goto fail;
		}
		if (!dest) {
			ncols = (int)cols;
			dest = malloc((size_t)ncols * sizeof(*dest));
			if (!dest)
				goto oom;
			ret = map_columns(src, path, line, ncols, dest, &nl, err);
			if (ret)
				goto fail;
			nf = ncols - nl;
		} else if (cols != ncols) {
			tr_error_set(err, 0, 0, NULL, "%s:%lld: expected %d columns, found %lld", path, line, ncols,
				     cols);
			ret = -EINVAL;
			goto fail;
		}
		if (grow(&c->x, &xcap, rows, (size_t)nf) || grow(&c->y, &ycap, rows, (size_t)nl) ||
		    note_line(c, (int64_t)rows, line))
			goto oom;
		q = p;
		for (int col = 0; col < ncols; col++) {
			char *fe = memchr(q, ',', (size_t)(e - q));
			char *te, *ne;
			float v;

			if (!fe)
				fe = e;
			te = fe;
			while (te > q && (te[-1] == ' ' || te[-1] == '\t' || te[-1] == '\r'))
				te--;
			if (is_blank(q, te)) {
				tr_error_set(err, 0, 0, NULL, "%s:%lld: column %d: empty value", path, line, col + 1);
				ret = -EINVAL;
				goto fail;
			}
			/* The byte at te is a delimiter or blank, so strtof
			 * cannot run past the field. */
			v = strtof_l(q, &ne, cloc);
			if (ne != te || !isfinite(v)) {
				/* Enough of the field to recognise it, no more: an
				 * error is no way to read a file's contents. */
				char shown[QUOTE_MAX + 1];
				size_t w = (size_t)(te - q) > QUOTE_MAX ? QUOTE_MAX : (size_t)(te - q);

				memcpy(shown, q, w);
				shown[w] = '\0';
				tr_data_sanitize(shown);
				tr_error_set(err, 0, 0, NULL, "%s:%lld: column %d: '%s%s' is not a %snumber", path,
					     line, col + 1, shown, (size_t)(te - q) > QUOTE_MAX ? "..." : "",
					     ne == te ? "finite " : "");
				ret = -EINVAL;
				goto fail;
			}
			if (dest[col] >= 0)
				c->x[rows * (size_t)nf + (size_t)dest[col]] = v;
			else
				c->y[rows * (size_t)nl + (size_t)(-dest[col] - 1)] = v;
			q = fe + 1;
		}
		rows++;
	next:
		p = e + 1;
	}
	if (rows == 0) {
		tr_error_set(err, 0, 0, NULL, "%s:%lld: no data rows%s", path, line + 1,
			     src->header && line > 0 ? " after the header" : "");
		ret = -EINVAL;
		goto fail;
	}
	c->base.i = &csv_i;
	c->base.info.samples = (int64_t)rows;
	c->base.info.features = nf;
	c->base.info.label_dim = nl;
	/* The parsed values and the two break arrays per row. */
	c->base.resident_bytes = (int64_t)rows * ((int64_t)(nf + nl) * (int64_t)sizeof(float) + 16);
	snprintf(c->base.name, sizeof(c->base.name), "%s", path);
	free(dest);
	free(buf);
	freelocale(cloc);
	*out = &c->base;
	return 0;
oom:
	ret = -ENOMEM;
	tr_error_set(err, 0, 0, NULL, "%s: out of memory", path);
fail:
	free(dest);
	free(buf);
	freelocale(cloc);
	if (c)
		csv_destroy(&c->base);
	return ret;
}
