/* Tests for the data readers (csv, npy, idx, synthetic), slices and
 * transforms.  Every file is written by the test itself into a fresh
 * mkdtemp directory, so the expected bytes sit next to the assertions;
 * the npy and idx writers here are deliberately independent of the
 * reader code they check.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine/data/reader.h"
#include "engine/rng.h"
#include "tests/unit/engine/fixtures.h"

TestSuite(data, .init = fixture_setup, .fini = fixture_teardown);

static struct tr_source_spec csv_src(const char *path)
{
	struct tr_source_spec s;

	memset(&s, 0, sizeof(s));
	s.present = true;
	s.format = TR_DATA_CSV;
	s.path = (char *)path;
	return s;
}

static void get_ok(tr_reader_t *r, int64_t i, float *x, float *y)
{
	int ret = tr_reader_get(r, i, x, y, &err);

	cr_assert_eq(ret, 0, "get %lld: %d %s", (long long)i, ret, err.message);
}

/* ---- CSV ---- */

Test(data, csv_values_exact)
{
	struct tr_source_spec s = csv_src(write_text("a.csv", "0.1,-3.5e-2,7\n1e10, 2.5 ,0\n-0,123456.789,9\n"));
	tr_reader_t *r = open_ok(&s);
	float x[2], y[1];

	cr_assert_eq(r->info.samples, 3);
	cr_assert_eq(r->info.features, 2);
	cr_assert_eq(r->info.label_dim, 1);
	cr_assert_not_null(strstr(r->name, "a.csv"));
	get_ok(r, 0, x, y);
	cr_assert(x[0] == 0.1f && x[1] == -3.5e-2f && y[0] == 7.0f);
	get_ok(r, 1, x, y);
	cr_assert(x[0] == 1e10f && x[1] == 2.5f && y[0] == 0.0f);
	get_ok(r, 2, x, y);
	cr_assert(x[0] == 0.0f && signbit(x[0]) && x[1] == 123456.789f && y[0] == 9.0f);
	cr_assert_eq(tr_reader_get(r, 3, x, y, &err), -ERANGE);
	expect_err("a.csv");
	cr_assert_eq(tr_reader_get(r, -1, x, y, &err), -ERANGE);
	tr_reader_destroy(r);
}

Test(data, csv_header_crlf_and_blank_lines)
{
	struct tr_source_spec s = csv_src(write_text("h.csv", "\xEF\xBB\xBF"
							      "f1,f2,label\r\n1,2,3\r\n4,5,6\r\n\r\n\n  \n"));
	tr_reader_t *r;
	float x[2], y[1];

	s.header = true;
	r = open_ok(&s);
	cr_assert_eq(r->info.samples, 2);
	get_ok(r, 1, x, y);
	cr_assert(x[0] == 4.0f && x[1] == 5.0f && y[0] == 6.0f);
	tr_reader_destroy(r);

	/* Without header=true the header is a bad value on line 1. */
	s.header = false;
	open_fail(&s);
	expect_err("h.csv:1:");
	expect_err("column 1");
}

Test(data, csv_label_columns)
{
	const char *p = write_text("l.csv", "1,2,3,4\n5,6,7,8\n");
	struct tr_source_spec s = csv_src(p);
	tr_reader_t *r;
	float x[4], y[4];

	/* Negative counts from the end. */
	s.label_cols[0] = -2;
	s.n_label_cols = 1;
	r = open_ok(&s);
	cr_assert_eq(r->info.features, 3);
	get_ok(r, 1, x, y);
	cr_assert(x[0] == 5 && x[1] == 6 && x[2] == 8 && y[0] == 7);
	tr_reader_destroy(r);

	/* First column. */
	s.label_cols[0] = 0;
	r = open_ok(&s);
	get_ok(r, 0, x, y);
	cr_assert(x[0] == 2 && x[1] == 3 && x[2] == 4 && y[0] == 1);
	tr_reader_destroy(r);

	/* Several labels, in the order given; features keep file order. */
	s.label_cols[0] = -1;
	s.label_cols[1] = 1;
	s.n_label_cols = 2;
	r = open_ok(&s);
	cr_assert_eq(r->info.features, 2);
	cr_assert_eq(r->info.label_dim, 2);
	get_ok(r, 0, x, y);
	cr_assert(x[0] == 1 && x[1] == 3 && y[0] == 4 && y[1] == 2);
	tr_reader_destroy(r);

	/* Out of range, either way, names the column. */
	s.n_label_cols = 1;
	s.label_cols[0] = 4;
	open_fail(&s);
	expect_err("l.csv");
	expect_err("label column 4");
	s.label_cols[0] = -5;
	open_fail(&s);
	expect_err("label column -5");

	/* The same column twice. */
	s.label_cols[0] = 3;
	s.label_cols[1] = -1;
	s.n_label_cols = 2;
	open_fail(&s);
	expect_err("twice");

	/* Nothing left for features. */
	s.label_cols[0] = 0;
	s.label_cols[1] = 1;
	s.label_cols[2] = 2;
	s.label_cols[3] = 3;
	s.n_label_cols = 4;
	open_fail(&s);
	expect_err("no feature columns");
}

/* A file with good rows and `bad` as line L (1-based, header included). */
static void check_bad_line(int L, bool header, const char *bad, const char *needle)
{
	char *text = NULL, name[64], want[64];
	size_t len = 0;
	FILE *m = open_memstream(&text, &len);
	struct tr_source_spec s;

	cr_assert_not_null(m);
	for (int line = 1; line < L + 3; line++) {
		if (line == L)
			fprintf(m, "%s\n", bad);
		else if (line == 1 && header)
			fprintf(m, "a,b,c\n");
		else
			fprintf(m, "%d,%d.5,%d\n", line, line, line % 3);
	}
	fclose(m);
	snprintf(name, sizeof(name), "bad%d.csv", L);
	s = csv_src(write_text(name, text));
	s.header = header;
	free(text);
	cr_assert_eq(open_fail(&s), -EINVAL);
	snprintf(want, sizeof(want), "bad%d.csv:%d:", L, L);
	expect_err(want);
	expect_err(needle);
}

Test(data, csv_errors_name_file_and_line)
{
	int lines[] = {1, 2, 3, 17, 100, 1000};

	for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++) {
		check_bad_line(lines[i], false, "1,abc,3", "column 2: 'abc' is not a number");
		/* The first data line sets the column count. */
		if (lines[i] > 1)
			check_bad_line(lines[i], false, "1,2", "expected 3 columns, found 2");
	}
	check_bad_line(5, true, "1,2,3,4", "expected 3 columns, found 4");
	check_bad_line(2, true, "1,,3", "column 2: empty value");
	check_bad_line(9, true, "1,2,3x", "column 3: '3x'");
	check_bad_line(4, false, "1,2 3,3", "column 2");
	check_bad_line(6, false, "nan,2,3", "not a finite number");
	check_bad_line(7, false, "1,2,1e999", "column 3");
}

Test(data, csv_empty_and_missing)
{
	struct tr_source_spec s = csv_src(write_text("empty.csv", ""));

	open_fail(&s);
	expect_err("empty.csv:1:");
	expect_err("no data rows");

	s = csv_src(write_text("blank.csv", "\n\n"));
	open_fail(&s);
	expect_err("blank.csv:3:");

	s = csv_src(write_text("hdr.csv", "a,b\n"));
	s.header = true;
	open_fail(&s);
	expect_err("hdr.csv:2:");

	s = csv_src(tmp_path("nope.csv"));
	cr_assert_eq(open_fail(&s), -ENOENT);
	expect_err("nope.csv");

	s = csv_src(NULL);
	cr_assert_eq(open_fail(&s), -EINVAL);
}

Test(data, relative_paths_resolve_against_the_roots)
{
	struct tr_source_spec s = csv_src("rel.csv");
	tr_reader_t *r = NULL;
	tr_data_roots_t *roots = NULL;
	char slash[300];
	const char *dirs[] = {"/nonexistent-root-for-test", NULL};

	write_text("rel.csv", "1,2\n");
	cr_assert_lt(tr_data_roots_create(dirs, &roots, &err), 0);
	expect_err("/nonexistent-root-for-test");
	snprintf(slash, sizeof(slash), "%s/", tmp_dir);
	dirs[0] = slash;
	cr_assert_eq(tr_data_roots_create(dirs, &roots, &err), 0, "%s", err.message);
	cr_assert_eq(tr_reader_open(&s, 0, roots, NULL, &r, &err), 0, "%s", err.message);
	cr_assert(strstr(r->name, "/rel.csv") && r->name[0] == '/', "%s", r->name);
	tr_reader_destroy(r);
	/* An absolute path inside a root opens beneath it. */
	s = csv_src(tmp_path("rel.csv"));
	cr_assert_eq(tr_reader_open(&s, 0, roots, NULL, &r, &err), 0, "%s", err.message);
	tr_reader_destroy(r);
	/* Without roots, paths open as written. */
	cr_assert_eq(tr_reader_open(&s, 0, NULL, NULL, &r, &err), 0, "%s", err.message);
	tr_reader_destroy(r);
	tr_reader_destroy(NULL);
	tr_data_roots_destroy(roots);
}

/* ---- npy ---- */

/* Writes a .npy the way numpy does: header padded with spaces and a
 * newline so the data starts on a 64-byte boundary. */
static const char *write_npy(const char *name, int major, const char *descr, bool fortran, const long *shape, int ndim,
			     const void *data, size_t nbytes)
{
	char dict[512];
	char shp[128] = "";
	size_t pre = major == 1 ? 10 : 12, hl, total;
	unsigned char *buf;
	const char *p;
	int n = 0;

	for (int d = 0; d < ndim; d++)
		n += snprintf(shp + n, sizeof(shp) - (size_t)n, "%ld,%s", shape[d], d + 1 < ndim ? " " : "");
	if (ndim > 1)
		shp[strlen(shp) - 1] = '\0'; /* numpy writes (3, 2) but (3,) */
	hl = (size_t)snprintf(dict, sizeof(dict), "{'descr': '%s', 'fortran_order': %s, 'shape': (%s), }", descr,
			      fortran ? "True" : "False", shp);
	while ((pre + hl + 1) % 64)
		dict[hl++] = ' ';
	dict[hl++] = '\n';
	total = pre + hl + nbytes;
	buf = malloc(total);
	cr_assert_not_null(buf);
	memcpy(buf, "\x93NUMPY", 6);
	buf[6] = (unsigned char)major;
	buf[7] = 0;
	buf[8] = hl & 0xff;
	buf[9] = (hl >> 8) & 0xff;
	if (major > 1) {
		buf[10] = 0;
		buf[11] = 0;
	}
	memcpy(buf + pre, dict, hl);
	if (nbytes)
		memcpy(buf + pre + hl, data, nbytes);
	p = write_file(name, buf, total);
	free(buf);
	return p;
}

static struct tr_source_spec npy_src(const char *x, const char *y)
{
	struct tr_source_spec s;

	memset(&s, 0, sizeof(s));
	s.format = TR_DATA_NPY;
	s.x_path = (char *)x;
	s.y_path = (char *)y;
	return s;
}

Test(data, npy_each_dtype)
{
	float f4[6] = {0.1f, -2.5f, 3e7f, 4, 5, -6};
	double f8[6] = {0.1, -2.5, 3e7, 4, 5, -6};
	int32_t i4[6] = {-7, 2, 2147483, 4, 5, 6};
	int64_t i8[6] = {-7, 2, 1LL << 40, 4, 5, 6};
	uint8_t u1[6] = {0, 255, 7, 8, 9, 10};
	int8_t i1[6] = {-128, 127, -1, 0, 1, 2};
	struct {
		const char *descr;
		const void *data;
		size_t size;
		float want[6];
	} cases[] = {
		{"<f4", f4, sizeof(f4), {0.1f, -2.5f, 3e7f, 4, 5, -6}},
		{"<f8", f8, sizeof(f8), {(float)0.1, -2.5f, 3e7f, 4, 5, -6}},
		{"<i4", i4, sizeof(i4), {-7, 2, 2147483, 4, 5, 6}},
		{"<i8", i8, sizeof(i8), {-7, 2, (float)(1LL << 40), 4, 5, 6}},
		{"|u1", u1, sizeof(u1), {0, 255, 7, 8, 9, 10}},
		{"|i1", i1, sizeof(i1), {-128, 127, -1, 0, 1, 2}},
	};
	long xs[2] = {3, 2}, ys[1] = {3};

	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		for (int major = 1; major <= 3; major++) {
			/* The same dtype for x and, on the first three values, y. */
			const char *xp =
				write_npy("x.npy", major, cases[c].descr, false, xs, 2, cases[c].data, cases[c].size);
			const char *yp = write_npy("y.npy", major, cases[c].descr, false, ys, 1, cases[c].data,
						   cases[c].size / 2);
			struct tr_source_spec s = npy_src(xp, yp);
			tr_reader_t *r = open_ok(&s);
			float x[2], y[1];

			cr_assert_eq(r->info.samples, 3);
			cr_assert_eq(r->info.features, 2);
			cr_assert_eq(r->info.label_dim, 1);
			for (int i = 0; i < 3; i++) {
				get_ok(r, i, x, y);
				cr_assert(x[0] == cases[c].want[2 * i] && x[1] == cases[c].want[2 * i + 1],
					  "%s v%d row %d: %g %g", cases[c].descr, major, i, x[0], x[1]);
				cr_assert(y[0] == cases[c].want[i], "%s y %d", cases[c].descr, i);
			}
			tr_reader_destroy(r);
		}
	}
}

Test(data, npy_shapes)
{
	float data[24];
	long x3[3] = {2, 3, 4}, y2[2] = {2, 3}, x1[1] = {24}, y3[3] = {2, 3, 4};
	float x[12], y[3];
	struct tr_source_spec s;
	tr_reader_t *r;

	for (int i = 0; i < 24; i++)
		data[i] = (float)i;
	/* 3-D x flattens; 2-D y gives a label row. */
	s = npy_src(write_npy("x3.npy", 1, "<f4", false, x3, 3, data, sizeof(data)),
		    write_npy("y2.npy", 1, "<f4", false, y2, 2, data, 6 * sizeof(float)));
	r = open_ok(&s);
	cr_assert_eq(r->info.features, 12);
	cr_assert_eq(r->info.label_dim, 3);
	get_ok(r, 1, x, y);
	for (int j = 0; j < 12; j++)
		cr_assert_eq(x[j], 12 + j);
	cr_assert(y[0] == 3 && y[1] == 4 && y[2] == 5);
	tr_reader_destroy(r);

	s = npy_src(write_npy("x1.npy", 1, "<f4", false, x1, 1, data, sizeof(data)), tmp_path("y2.npy"));
	open_fail(&s);
	expect_err("x1.npy");
	expect_err("2 dimensions");

	s = npy_src(tmp_path("x3.npy"), write_npy("y3.npy", 1, "<f4", false, y3, 3, data, sizeof(data)));
	open_fail(&s);
	expect_err("y3.npy");
}

Test(data, npy_rejects)
{
	float data[6] = {0};
	long xs[2] = {3, 2}, ys[1] = {3}, ys4[1] = {4};
	const char *yp = write_npy("y.npy", 1, "<f4", false, ys, 1, data, 3 * sizeof(float));
	struct tr_source_spec s;

	s = npy_src(write_npy("fx.npy", 1, "<f4", true, xs, 2, data, sizeof(data)), yp);
	open_fail(&s);
	expect_err("fx.npy");
	expect_err("Fortran");

	s = npy_src(write_npy("hx.npy", 1, "<f2", false, xs, 2, data, 12), yp);
	open_fail(&s);
	expect_err("unsupported dtype '<f2'");

	s = npy_src(write_npy("bx.npy", 1, ">f4", false, xs, 2, data, sizeof(data)), yp);
	open_fail(&s);
	expect_err("'>f4'");

	/* Sample counts differ: both files named. */
	s = npy_src(write_npy("nx.npy", 2, "<f4", false, xs, 2, data, sizeof(data)),
		    write_npy("ny.npy", 1, "<f4", false, ys4, 1, data, 4 * sizeof(float)));
	open_fail(&s);
	expect_err("nx.npy");
	expect_err("ny.npy");

	/* Data shorter than the shape promises. */
	s = npy_src(write_npy("tx.npy", 1, "<f4", false, xs, 2, data, sizeof(data) - 1), yp);
	open_fail(&s);
	expect_err("truncated");

	s = npy_src(write_file("mx.npy", "\x93NUMPX\x01\x00\x04\x00{}  ", 14), yp);
	open_fail(&s);
	expect_err("mx.npy: not a .npy file (bad magic)");

	s = npy_src(write_file("gx.npy", "\x93NUMPY\x01\x00\x0a\x00{'descr': ", 20), yp);
	open_fail(&s);
	expect_err("malformed");

	s = npy_src(tmp_path("y.npy"), NULL);
	cr_assert_eq(open_fail(&s), -EINVAL);
}

/* ---- IDX ---- */

static const char *write_idx_images(const char *name, uint32_t n, uint32_t rows, uint32_t cols)
{
	size_t len = 16 + (size_t)n * rows * cols;
	unsigned char *b = malloc(len);
	const char *p;

	put_be32(b, 0x803);
	put_be32(b + 4, n);
	put_be32(b + 8, rows);
	put_be32(b + 12, cols);
	for (size_t i = 16; i < len; i++)
		b[i] = (unsigned char)(i * 7);
	p = write_file(name, b, len);
	free(b);
	return p;
}

static const char *write_idx_labels(const char *name, uint32_t n)
{
	unsigned char *b = malloc(8 + n);
	const char *p;

	put_be32(b, 0x801);
	put_be32(b + 4, n);
	for (uint32_t i = 0; i < n; i++)
		b[8 + i] = (unsigned char)(i % 10);
	p = write_file(name, b, 8 + n);
	free(b);
	return p;
}

static struct tr_source_spec idx_src(const char *images, const char *labels)
{
	struct tr_source_spec s;

	memset(&s, 0, sizeof(s));
	s.format = TR_DATA_IDX;
	s.images_path = (char *)images;
	s.labels_path = (char *)labels;
	return s;
}

Test(data, idx_round_trip)
{
	struct tr_source_spec s = idx_src(write_idx_images("img", 5, 4, 3), write_idx_labels("lab", 5));
	tr_reader_t *r = open_ok(&s);
	float x[12], y[1];

	cr_assert_eq(r->info.samples, 5);
	cr_assert_eq(r->info.features, 12);
	cr_assert_eq(r->info.label_dim, 1);
	for (int i = 0; i < 5; i++) {
		get_ok(r, i, x, y);
		for (int j = 0; j < 12; j++)
			cr_assert_eq(x[j], (float)(unsigned char)((16 + i * 12 + j) * 7));
		cr_assert_eq(y[0], (float)i);
	}
	tr_reader_destroy(r);
}

Test(data, idx_rejects)
{
	struct tr_source_spec s;
	unsigned char gz[16] = {0x1f, 0x8b, 8, 0};

	s = idx_src(write_idx_images("img", 5, 2, 2), write_idx_labels("lab6", 6));
	open_fail(&s);
	expect_err("img");
	expect_err("lab6");

	/* Labels where images are expected and the other way round. */
	s = idx_src(tmp_path("lab6"), tmp_path("img"));
	open_fail(&s);
	expect_err("lab6");
	s = idx_src(tmp_path("img"), tmp_path("img"));
	open_fail(&s);
	expect_err("labels");

	s = idx_src(write_file("img.gz", gz, sizeof(gz)), tmp_path("lab6"));
	open_fail(&s);
	expect_err("gzip");

	/* Truncated: the header says 5 images of 2x2 but there are fewer. */
	s = idx_src(write_file("short", "\0\0\x08\x03\0\0\0\x05\0\0\0\x02\0\0\0\x02\x01", 17), tmp_path("lab6"));
	open_fail(&s);
	expect_err("truncated");
}

/* ---- synthetic ---- */

static struct tr_source_spec synth_src(enum tr_synth_task task, int64_t n, int features, int classes, float noise,
				       uint64_t seed)
{
	struct tr_source_spec s;

	memset(&s, 0, sizeof(s));
	s.format = TR_DATA_SYNTHETIC;
	s.task = task;
	s.samples = n;
	s.features = features;
	s.classes = classes;
	s.noise = noise;
	s.data_seed = seed;
	return s;
}

Test(data, synthetic_deterministic_any_order)
{
	struct tr_source_spec s = synth_src(TR_SYNTH_CLASSIFICATION, 200, 5, 4, 0.1f, 42);
	tr_reader_t *a = open_ok(&s), *b = open_ok(&s), *c;
	float xa[5], ya[1], xb[5], yb[1];
	int differ = 0;

	cr_assert_str_eq(a->name, "synthetic");
	/* b reads backwards and twice. */
	for (int i = 0; i < 200; i++) {
		get_ok(a, i, xa, ya);
		get_ok(b, 199 - i, xb, yb);
		get_ok(b, i, xb, yb);
		cr_assert_arr_eq(xa, xb, sizeof(xa));
		cr_assert_eq(ya[0], yb[0]);
	}
	/* Another seed, other data. */
	s.data_seed = 43;
	c = open_ok(&s);
	for (int i = 0; i < 50; i++) {
		get_ok(a, i, xa, ya);
		get_ok(c, i, xb, yb);
		differ += memcmp(xa, xb, sizeof(xa)) != 0;
	}
	cr_assert_eq(differ, 50);
	tr_reader_destroy(a);
	tr_reader_destroy(b);
	tr_reader_destroy(c);

	/* The source's data_seed decides, whatever the job seed (the spec
	 * parser defaults it to the job seed), and 0 is a seed like any other. */
	s.data_seed = 0;
	cr_assert_eq(tr_reader_open(&s, 43, NULL, NULL, &a, &err), 0);
	cr_assert_eq(tr_reader_open(&s, 7, NULL, NULL, &b, &err), 0);
	get_ok(a, 3, xa, ya);
	get_ok(b, 3, xb, yb);
	cr_assert_arr_eq(xa, xb, sizeof(xa));
	tr_reader_destroy(a);
	tr_reader_destroy(b);
}

/* Classes are spread and separable: nearest class mean classifies the
 * training data, the cheapest stand-in for "an MLP can learn it". */
Test(data, synthetic_classification_learnable)
{
	enum { N = 3000, F = 8, C = 6 };
	struct tr_source_spec s = synth_src(TR_SYNTH_CLASSIFICATION, N, F, C, 0.1f, 7);
	tr_reader_t *r = open_ok(&s);
	static float xs[N][F];
	double mean[C][F] = {{0}};
	int count[C] = {0}, correct = 0;
	float y[1];

	for (int i = 0; i < N; i++) {
		int c;

		get_ok(r, i, xs[i], y);
		c = (int)y[0];
		cr_assert(y[0] == (float)c && c >= 0 && c < C);
		count[c]++;
		for (int j = 0; j < F; j++) {
			cr_assert(fabsf(xs[i][j]) < 2.0f);
			mean[c][j] += xs[i][j];
		}
	}
	for (int c = 0; c < C; c++) {
		cr_assert_gt(count[c], N / C / 2, "class %d has %d samples", c, count[c]);
		for (int j = 0; j < F; j++)
			mean[c][j] /= count[c];
	}
	for (int i = 0; i < N; i++) {
		int best = 0;
		double bd = INFINITY;

		get_ok(r, i, xs[i], y);
		for (int c = 0; c < C; c++) {
			double d = 0;

			for (int j = 0; j < F; j++)
				d += (xs[i][j] - mean[c][j]) * (xs[i][j] - mean[c][j]);
			if (d < bd) {
				bd = d;
				best = c;
			}
		}
		correct += best == (int)y[0];
	}
	cr_assert_gt(correct, N * 9 / 10, "nearest-mean accuracy %d/%d", correct, N);
	tr_reader_destroy(r);
}

/* Least-squares fit of y[o] on x over the reader; returns the RMS residual
 * of output o.  Normal equations with Gauss-Jordan: 16 unknowns. */
static double linear_residual(tr_reader_t *r, int o)
{
	enum { F = 16 };
	double A[F][F + 1] = {{0}}, w[F], rss = 0;
	float x[F], y[4];
	int64_t n = r->info.samples;

	cr_assert_eq(r->info.features, F);
	for (int64_t i = 0; i < n; i++) {
		get_ok(r, i, x, y);
		for (int a = 0; a < F; a++) {
			for (int b = 0; b < F; b++)
				A[a][b] += (double)x[a] * x[b];
			A[a][F] += (double)x[a] * y[o];
		}
	}
	for (int c = 0; c < F; c++) {
		for (int rr = 0; rr < F; rr++) {
			double f;

			if (rr == c)
				continue;
			f = A[rr][c] / A[c][c];
			for (int k = c; k <= F; k++)
				A[rr][k] -= f * A[c][k];
		}
	}
	for (int c = 0; c < F; c++)
		w[c] = A[c][F] / A[c][c];
	for (int64_t i = 0; i < n; i++) {
		double e;

		get_ok(r, i, x, y);
		e = y[o];
		for (int j = 0; j < F; j++)
			e -= w[j] * x[j];
		rss += e * e;
	}
	return sqrt(rss / (double)n);
}

Test(data, synthetic_regression)
{
	struct tr_source_spec s = synth_src(TR_SYNTH_REGRESSION, 2000, 16, 0, 0.0f, 5);
	tr_reader_t *r, *r2;
	float x[16], y[3], x2[16], y2[3];
	double var = 0, res;

	s.outputs = 3;
	r = open_ok(&s);
	cr_assert_eq(r->info.label_dim, 3);
	cr_assert_eq(r->info.features, 16);
	r2 = open_ok(&s);
	for (int i = 1999; i >= 0; i--) {
		get_ok(r, i, x, y);
		get_ok(r2, 1999 - i, x2, y2);
		get_ok(r2, i, x2, y2);
		cr_assert_arr_eq(x, x2, sizeof(x));
		cr_assert_arr_eq(y, y2, sizeof(y));
		var += (double)y[0] * y[0];
	}
	var /= 2000;
	cr_assert(var > 0.3 && var < 3.0, "target variance %g", var);
	/* Without noise the targets are exactly linear in x... */
	for (int o = 0; o < 3; o++)
		cr_assert_lt(linear_residual(r, o), 1e-4);
	tr_reader_destroy(r);
	tr_reader_destroy(r2);
	/* ...and with noise the residual is the noise. */
	s.noise = 0.1f;
	r = open_ok(&s);
	res = linear_residual(r, 2);
	cr_assert(res > 0.09 && res < 0.11, "residual %g", res);
	tr_reader_destroy(r);

	/* outputs 0 means 1. */
	s.outputs = 0;
	r = open_ok(&s);
	cr_assert_eq(r->info.label_dim, 1);
	tr_reader_destroy(r);
}

/* The targets are the definition's: W's entry [o][j] is draw o * features
 * + j of the weight stream (scaled by 1/sqrt(features)), and each target
 * is summed in double over j in order, so the same data set has the same
 * bits in every version, however the sums are arranged (synth_targets sums
 * a block of outputs side by side).  70 outputs: one full block and a
 * partial one. */
Test(data, synthetic_regression_targets_are_the_definitions_bits)
{
	enum { F = 37, O = 70, SEED = 9 };
	struct tr_source_spec s = synth_src(TR_SYNTH_REGRESSION, 12, F, 0, 0.0f, SEED);
	float x[F], y[O], ref[O];
	uint64_t wkey = tr_rng_key(SEED, 0, 2 /* the weight stream */, TR_RNG_SYNTH);
	float gain = 1.0f / sqrtf((float)F);

	s.outputs = O;
	tr_reader_t *r = open_ok(&s);
	for (int i = 0; i < 12; i++) {
		get_ok(r, i, x, y);
		for (int o = 0; o < O; o++) {
			double acc = 0.0;
			for (int j = 0; j < F; j++)
				acc += (double)(gain * tr_rng_normal(wkey, (uint64_t)o * F + (uint64_t)j)) * x[j];
			ref[o] = (float)acc;
		}
		cr_assert_arr_eq(y, ref, sizeof(y), "sample %d", i);
	}
	tr_reader_destroy(r);
}

/* Feature noise: zero mean, unit variance, bounded tails (four-uniform
 * Irwin-Hall); centers at 0 noise reproduce the class center exactly. */
Test(data, synthetic_noise_is_unit_normal_like)
{
	enum { N = 4000, F = 16 };
	struct tr_source_spec s = synth_src(TR_SYNTH_REGRESSION, N, F, 0, 0.0f, 3);
	tr_reader_t *r = open_ok(&s);
	float x[F], y[1];
	double sum = 0, sumsq = 0, big = 0;

	for (int i = 0; i < N; i++) {
		get_ok(r, i, x, y);
		for (int j = 0; j < F; j++) {
			sum += x[j];
			sumsq += (double)x[j] * x[j];
			big += fabsf(x[j]) > 2.0f;
			cr_assert_lt(fabsf(x[j]), 3.47f);
		}
	}
	sum /= N * F;
	sumsq /= N * F;
	cr_assert_lt(fabs(sum), 0.03, "mean %g", sum);
	cr_assert(sumsq > 0.96 && sumsq < 1.04, "variance %g", sumsq);
	/* a normal has 4.6% beyond 2 sigma; the approximation ~4.0% */
	cr_assert(big / (N * F) > 0.03 && big / (N * F) < 0.06, "beyond 2: %g", big / (N * F));
	tr_reader_destroy(r);
}

/* Class centers are cached up to a size and recomputed per sample beyond
 * it; both give the same values (a center's feature j does not depend on
 * the width), and so does the noise. */
Test(data, synthetic_wide_samples_match_cached_centers)
{
	enum { WIDE = (1 << 22) + 1 };
	struct tr_source_spec s = synth_src(TR_SYNTH_CLASSIFICATION, 4, 8, 1, 0.3f, 11);
	tr_reader_t *narrow = open_ok(&s), *wide;
	float *xw = malloc(WIDE * sizeof(float)), x[8], y[1], yw[1];

	cr_assert(xw);
	s.features = WIDE;
	wide = open_ok(&s);
	for (int i = 0; i < 4; i++) {
		get_ok(narrow, i, x, y);
		get_ok(wide, i, xw, yw);
		cr_assert_arr_eq(x, xw, sizeof(x));
		cr_assert_eq(y[0], yw[0]);
	}
	free(xw);
	tr_reader_destroy(narrow);
	tr_reader_destroy(wide);
}

Test(data, synthetic_invalid)
{
	struct tr_source_spec s = synth_src(TR_SYNTH_CLASSIFICATION, 0, 4, 2, 0.1f, 1);

	cr_assert_eq(open_fail(&s), -EINVAL);
	s.samples = 10;
	s.features = 0;
	cr_assert_eq(open_fail(&s), -EINVAL);
	s.features = 4;
	s.classes = 0;
	cr_assert_eq(open_fail(&s), -EINVAL);
	s.classes = 2;
	s.noise = -1;
	cr_assert_eq(open_fail(&s), -EINVAL);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

Test(data, synthetic_load_cost)
{
	struct tr_source_spec s = synth_src(TR_SYNTH_CLASSIFICATION, 10, 4, 2, 0.1f, 1);
	tr_reader_t *r;
	float x[4], y[1];
	double t0;

	/* 4 x 5 ms: slept by the reads themselves once a 20 ms slice is owed. */
	s.load_cost_us = 5000;
	r = open_ok(&s);
	t0 = now_s();
	for (int i = 0; i < 4; i++)
		get_ok(r, i, x, y);
	cr_assert_geq(now_s() - t0, 0.019);
	tr_reader_destroy(r);
}

/* Below a slice the cost is owed, not lost: paying it sleeps it all. */
Test(data, synthetic_load_cost_below_a_slice_is_paid_at_the_end)
{
	struct tr_source_spec s = synth_src(TR_SYNTH_CLASSIFICATION, 10, 4, 2, 0.1f, 1);
	float x[4], y[1];

	s.load_cost_us = 1500;
	tr_reader_t *r = open_ok(&s);
	double t0 = now_s();
	for (int i = 0; i < 6; i++)
		get_ok(r, i, x, y);
	tr_data_pay_deferred_wait();
	cr_assert_geq(now_s() - t0, 0.0089);
	/* Paid once: nothing is owed after it. */
	t0 = now_s();
	tr_data_pay_deferred_wait();
	cr_assert_lt(now_s() - t0, 0.0089);
	tr_reader_destroy(r);
}

/* ---- concurrency ---- */

struct hammer {
	tr_reader_t *r;
	int stride;
	float (*want)[5];
	int bad;
};

static void *hammer_run(void *arg)
{
	struct hammer *h = arg;
	int64_t n = h->r->info.samples;
	struct tr_error e;

	/* Each thread walks the samples in its own order. */
	for (int64_t k = 0; k < n; k++) {
		int64_t i = (k * h->stride) % n;
		float x[4], y[1];

		if (tr_reader_get(h->r, i, x, y, &e) || memcmp(x, h->want[i], sizeof(x)) || y[0] != h->want[i][4])
			h->bad++;
	}
	return NULL;
}

Test(data, concurrent_gets_match_sequential)
{
	enum { N = 997 };
	static float want[N][5];
	float xs[N * 4], ys[N];
	long xshape[2] = {N, 4}, yshape[1] = {N};
	struct tr_source_spec specs[2];
	pthread_t th[4];
	struct hammer h[4];
	int strides[4] = {1, 7, 31, 500};

	for (int i = 0; i < N * 4; i++)
		xs[i] = (float)i * 0.25f;
	for (int i = 0; i < N; i++)
		ys[i] = (float)(i % 10);
	specs[0] = synth_src(TR_SYNTH_CLASSIFICATION, N, 4, 3, 0.1f, 9);
	specs[1] = npy_src(write_npy("cx.npy", 1, "<f4", false, xshape, 2, xs, sizeof(xs)),
			   write_npy("cy.npy", 1, "<f4", false, yshape, 1, ys, sizeof(ys)));
	for (int k = 0; k < 2; k++) {
		tr_reader_t *r = open_ok(&specs[k]);

		for (int i = 0; i < N; i++)
			get_ok(r, i, want[i], &want[i][4]);
		for (int t = 0; t < 4; t++) {
			h[t] = (struct hammer){.r = r, .stride = strides[t], .want = want};
			cr_assert_eq(pthread_create(&th[t], NULL, hammer_run, &h[t]), 0);
		}
		for (int t = 0; t < 4; t++) {
			pthread_join(th[t], NULL);
			cr_assert_eq(h[t].bad, 0, "reader %d thread %d: %d mismatches", k, t, h[t].bad);
		}
		tr_reader_destroy(r);
	}
}

/* ---- slices ---- */

Test(data, slice)
{
	struct tr_source_spec s = csv_src(write_text("s.csv", "0,0\n1,10\n2,20\n3,30\n4,40\n5,50\n"));
	tr_reader_t *base = open_ok(&s), *sl;
	float x[1], y[1];

	cr_assert_null(tr_reader_slice(base, 4, 3));
	cr_assert_null(tr_reader_slice(base, -1, 3));
	cr_assert_null(tr_reader_slice(base, 0, 7));
	sl = tr_reader_slice(base, 2, 5);
	cr_assert_not_null(sl);
	cr_assert_eq(sl->info.samples, 3);
	cr_assert_eq(sl->info.features, 1);
	cr_assert_str_eq(sl->name, base->name);
	for (int i = 0; i < 3; i++) {
		get_ok(sl, i, x, y);
		cr_assert(x[0] == 2 + i && y[0] == 10 * (2 + i));
	}
	cr_assert_eq(tr_reader_get(sl, 3, x, y, &err), -ERANGE);
	expect_err("s.csv");
	tr_reader_destroy(sl);
	sl = tr_reader_slice(base, 6, 6);
	cr_assert_not_null(sl);
	cr_assert_eq(sl->info.samples, 0);
	tr_reader_destroy(sl);
	tr_reader_destroy(base);
}

/* ---- transforms ---- */

static void set_transforms(struct tr_spec *spec, int n, const struct tr_transform_spec *t)
{
	memset(spec, 0, sizeof(*spec));
	spec->seed = 11;
	spec->n_transforms = n;
	memcpy(spec->transforms, t, (size_t)n * sizeof(*t));
}

Test(data, transform_scale)
{
	struct tr_spec spec;
	struct tr_transform_spec t[] = {{.type = TR_TF_SCALE, .factor = 0.0625f}};
	tr_transforms_t *tf;
	float x[3] = {16, -32, 255};

	set_transforms(&spec, 1, t);
	cr_assert_eq(tr_transforms_create(&spec, NULL, &tf, &err), 0, "%s", err.message);
	tr_transforms_apply(tf, x, 3, 1, 0, 0, 1);
	cr_assert(x[0] == 1 && x[1] == -2 && x[2] == 255 * 0.0625f);
	tr_transforms_destroy(tf);
	tr_transforms_destroy(NULL);

	/* No transforms at all is a valid, do-nothing list. */
	set_transforms(&spec, 0, t);
	cr_assert_eq(tr_transforms_create(&spec, NULL, &tf, &err), 0);
	tr_transforms_apply(tf, x, 3, 1, 0, 0, 1);
	cr_assert(x[0] == 1);
	tr_transforms_destroy(tf);
}

/* Mean and std of every feature of `r` after the transforms, with
 * training off so noise does not count. */
static void moments(tr_reader_t *r, const tr_transforms_t *tf, double *mean, double *sd)
{
	int nf = r->info.features;
	float x[16], y[4];

	for (int j = 0; j < nf; j++)
		mean[j] = sd[j] = 0;
	for (int64_t i = 0; i < r->info.samples; i++) {
		get_ok(r, i, x, y);
		tr_transforms_apply(tf, x, nf, 3, 0, i, 0);
		for (int j = 0; j < nf; j++) {
			mean[j] += x[j];
			sd[j] += (double)x[j] * x[j];
		}
	}
	for (int j = 0; j < nf; j++) {
		mean[j] /= r->info.samples;
		sd[j] = sqrt(sd[j] / r->info.samples - mean[j] * mean[j]);
	}
}

Test(data, transform_standardize)
{
	struct tr_source_spec s = synth_src(TR_SYNTH_REGRESSION, 1000, 6, 0, 0.1f, 3);
	struct tr_spec spec;
	struct tr_transform_spec t[] = {
		{.type = TR_TF_GAUSSIAN_NOISE, .std = 5.0f},
		{.type = TR_TF_SCALE, .factor = 100.0f},
		{.type = TR_TF_STANDARDIZE},
		{.type = TR_TF_SCALE, .factor = 2.0f},
	};
	tr_reader_t *r = open_ok(&s);
	tr_transforms_t *tf;
	double mean[16], sd[16];

	/* Noise before standardize must not enter the statistics, and scale
	 * before it must: the result is still mean 0, std 1, then x2. */
	set_transforms(&spec, 4, t);
	cr_assert_eq(tr_transforms_create(&spec, r, &tf, &err), 0, "%s", err.message);
	moments(r, tf, mean, sd);
	for (int j = 0; j < 6; j++) {
		cr_assert_lt(fabs(mean[j]), 1e-4, "feature %d mean %g", j, mean[j]);
		cr_assert_lt(fabs(sd[j] - 2.0), 1e-4, "feature %d std %g", j, sd[j]);
	}
	tr_transforms_destroy(tf);

	set_transforms(&spec, 1, &t[2]);
	cr_assert_eq(tr_transforms_create(&spec, r, &tf, &err), 0, "%s", err.message);
	moments(r, tf, mean, sd);
	for (int j = 0; j < 6; j++) {
		cr_assert_lt(fabs(mean[j]), 1e-5);
		cr_assert_lt(fabs(sd[j] - 1.0), 1e-4);
	}
	tr_transforms_destroy(tf);

	/* Needs a training reader. */
	cr_assert_eq(tr_transforms_create(&spec, NULL, &tf, &err), -EINVAL);
	cr_assert_null(tf);
	tr_reader_destroy(r);
}

Test(data, transform_standardize_constant_and_offset)
{
	/* A constant column keeps std 1 (x - mean = 0, no division by 0);
	 * a large offset does not cost precision. */
	struct tr_source_spec s =
		csv_src(write_text("c.csv", "5,100000.5,0\n5,100001.5,0\n5,100000.5,0\n5,100001.5,0\n"));
	struct tr_spec spec;
	struct tr_transform_spec t[] = {{.type = TR_TF_STANDARDIZE}};
	tr_reader_t *r = open_ok(&s);
	tr_transforms_t *tf;
	float x[2], y[1];

	set_transforms(&spec, 1, t);
	cr_assert_eq(tr_transforms_create(&spec, r, &tf, &err), 0, "%s", err.message);
	for (int i = 0; i < 4; i++) {
		get_ok(r, i, x, y);
		tr_transforms_apply(tf, x, 2, 0, 0, i, 1);
		cr_assert_eq(x[0], 0.0f);
		cr_assert_eq(x[1], i % 2 ? 1.0f : -1.0f);
	}
	tr_transforms_destroy(tf);
	tr_reader_destroy(r);
}

Test(data, transform_noise)
{
	struct tr_spec spec;
	struct tr_transform_spec t[] = {{.type = TR_TF_GAUSSIAN_NOISE, .std = 0.5f}};
	tr_transforms_t *tf;
	float a[8], b[8], zero[8] = {0};
	double sum2 = 0;

	set_transforms(&spec, 1, t);
	cr_assert_eq(tr_transforms_create(&spec, NULL, &tf, &err), 0, "%s", err.message);

	memset(a, 0, sizeof(a));
	tr_transforms_apply(tf, a, 8, 9, 2, 100, 0);
	cr_assert_arr_eq(a, zero, sizeof(a), "noise applied with training=0");

	memset(a, 0, sizeof(a));
	memset(b, 0, sizeof(b));
	tr_transforms_apply(tf, a, 8, 9, 2, 100, 1);
	tr_transforms_apply(tf, b, 8, 9, 2, 100, 1);
	cr_assert_arr_eq(a, b, sizeof(a), "same (seed, epoch, index) must give the same noise");
	cr_assert(memcmp(a, zero, sizeof(a)) != 0);
	for (int j = 0; j < 8; j++)
		cr_assert_neq(a[j], a[(j + 1) % 8]);

	memset(b, 0, sizeof(b));
	tr_transforms_apply(tf, b, 8, 9, 3, 100, 1);
	cr_assert(memcmp(a, b, sizeof(a)) != 0, "next epoch must differ");
	memset(b, 0, sizeof(b));
	tr_transforms_apply(tf, b, 8, 9, 2, 101, 1);
	cr_assert(memcmp(a, b, sizeof(a)) != 0, "next sample must differ");
	memset(b, 0, sizeof(b));
	tr_transforms_apply(tf, b, 8, 10, 2, 100, 1);
	cr_assert(memcmp(a, b, sizeof(a)) != 0, "another seed must differ");

	/* Its scale is std. */
	for (int i = 0; i < 2000; i++) {
		memset(a, 0, sizeof(a));
		tr_transforms_apply(tf, a, 8, 9, 0, i, 1);
		for (int j = 0; j < 8; j++)
			sum2 += (double)a[j] * a[j];
	}
	cr_assert_lt(fabs(sqrt(sum2 / 16000) - 0.5), 0.02);
	tr_transforms_destroy(tf);
}

/* A reader that fails at sample 3, as the header promises tests can do. */
static int failing_get(tr_reader_t *r, int64_t index, float *x, float *y, struct tr_error *e)
{
	(void)r;
	if (index == 3) {
		tr_error_set(e, 0, 0, NULL, "broken.bin: sample 3: checksum mismatch");
		return -EIO;
	}
	x[0] = (float)index;
	y[0] = 0;
	return 0;
}

static void failing_destroy(tr_reader_t *r)
{
	(void)r;
}

Test(data, transform_standardize_reader_error)
{
	static const struct tr_reader_i fi = {.get = failing_get, .destroy = failing_destroy};
	tr_reader_t fr = {.i = &fi, .info = {.samples = 10, .features = 1, .label_dim = 1}, .name = "broken.bin"};
	struct tr_spec spec;
	struct tr_transform_spec t[] = {{.type = TR_TF_SCALE, .factor = 2}, {.type = TR_TF_STANDARDIZE}};
	tr_transforms_t *tf = NULL;

	set_transforms(&spec, 2, t);
	cr_assert_eq(tr_transforms_create(&spec, &fr, &tf, &err), -EIO);
	cr_assert_null(tf);
	expect_err("broken.bin: sample 3");
}

/* ---- files that change under a reader, and what errors quote ---- */

/* x: 4096 rows of 64 f4 (1 MiB, many pages), y: 4096 i8. */
static tr_reader_t *open_big_npy(const char **xp_out)
{
	static float xs[4096 * 64];
	static int64_t ys[4096];
	long xshape[2] = {4096, 64}, yshape[1] = {4096};

	for (int i = 0; i < 4096 * 64; i++)
		xs[i] = (float)i;
	for (int i = 0; i < 4096; i++)
		ys[i] = i % 10;
	const char *xp = write_npy("big_x.npy", 1, "<f4", false, xshape, 2, xs, sizeof xs);
	const char *yp = write_npy("big_y.npy", 1, "<i8", false, yshape, 1, ys, sizeof ys);
	struct tr_source_spec s = npy_src(xp, yp);
	*xp_out = xp;
	return open_ok(&s);
}

Test(data, npy_truncated_under_the_reader_fails_the_read_not_the_process)
{
	const char *xp;
	tr_reader_t *r = open_big_npy(&xp);
	float x[64], y[1];

	get_ok(r, 4095, x, y);
	cr_assert_eq(x[0], 4095.0f * 64);
	/* The pages past the new end are gone: reading them raises SIGBUS,
	 * which used to end the process. */
	cr_assert_eq(truncate(xp, 128), 0);
	err.message[0] = 0;
	cr_assert_eq(tr_reader_get(r, 4000, x, y, &err), -ESTALE);
	expect_err("big_x.npy: the file changed while the job was reading it (truncated; now 128 bytes");
	/* The thread's guard is cleared: a fault outside a guarded read would
	 * still be a fault, and the next guarded read works the same. */
	cr_assert_eq(tr_reader_get(r, 4001, x, y, &err), -ESTALE);
	cr_assert_eq(tr_reader_check(r, &err), -ESTALE);
	expect_err("its size changed");
	tr_reader_destroy(r);
}

Test(data, npy_rewritten_in_place_fails_the_check)
{
	const char *xp;
	tr_reader_t *r = open_big_npy(&xp);
	float x[64], y[1];

	cr_assert_eq(tr_reader_check(r, &err), 0, "%s", err.message);
	/* File times tick at the kernel's coarse clock (<= 10 ms): let one
	 * pass, then rewrite the same bytes in place, as np.save over the
	 * file does with an array of the same shape. */
	usleep(30 * 1000);
	FILE *f = fopen(xp, "r+b");
	cr_assert_not_null(f);
	cr_assert_eq(fseek(f, 4000, SEEK_SET), 0);
	cr_assert_eq(fwrite("zz", 1, 2, f), 2);
	cr_assert_eq(fclose(f), 0);
	get_ok(r, 1, x, y);
	cr_assert_eq(tr_reader_check(r, &err), -ESTALE);
	expect_err("big_x.npy: the file changed while the job was reading it (it was written to)");
	/* A slice checks its base. */
	tr_reader_t *sl = tr_reader_slice(r, 0, 10);
	cr_assert_eq(tr_reader_check(sl, &err), -ESTALE);
	tr_reader_destroy(sl);
	tr_reader_destroy(r);
}

Test(data, idx_truncated_under_the_reader_fails_the_read)
{
	static unsigned char img[16 + 2000 * 28 * 28];
	unsigned char lab[8 + 2000];

	memcpy(img, "\x00\x00\x08\x03\x00\x00\x07\xd0\x00\x00\x00\x1c\x00\x00\x00\x1c", 16);
	memcpy(lab, "\x00\x00\x08\x01\x00\x00\x07\xd0", 8);
	memset(lab + 8, 3, 2000);
	const char *ip = write_file("img.idx", img, sizeof img);
	const char *lp = write_file("lab.idx", lab, sizeof lab);
	struct tr_source_spec s;
	memset(&s, 0, sizeof s);
	s.format = TR_DATA_IDX;
	s.images_path = (char *)ip;
	s.labels_path = (char *)lp;
	tr_reader_t *r = open_ok(&s);
	float x[28 * 28], y[1];

	cr_assert_eq(truncate(ip, 16), 0);
	cr_assert_eq(tr_reader_get(r, 1999, x, y, &err), -ESTALE);
	expect_err("img.idx: the file changed");
	tr_reader_destroy(r);
}

Test(data, fifo_and_directory_are_refused_without_blocking)
{
	const char *p = tmp_path("pipe.csv");
	cr_assert_eq(mkfifo(p, 0600), 0);
	struct tr_source_spec s = csv_src(p);
	/* No writer: a blocking open would wait for one for good. */
	cr_assert_eq(open_fail(&s), -EINVAL);
	expect_err("is a FIFO, not a regular file");
	s = npy_src(tmp_dir, tmp_dir);
	cr_assert_eq(open_fail(&s), -EINVAL);
	expect_err("is a directory");
}

Test(data, a_cancelled_open_gives_up)
{
	atomic_bool cancel = true;
	struct tr_source_spec s = csv_src(write_text("c.csv", "1,2\n"));
	tr_reader_t *r = NULL;

	cr_assert_eq(tr_reader_open(&s, 0, NULL, &cancel, &r, &err), -ECANCELED);
	cr_assert_null(r);
}

Test(data, csv_errors_quote_only_a_few_sanitized_bytes)
{
	char line[300];
	snprintf(line, sizeof line, "1,%s,3\n", "secret-password-1234567890-do-not-show");
	write_text("q.csv", line);
	struct tr_source_spec s = csv_src(tmp_path("q.csv"));
	cr_assert_eq(open_fail(&s), -EINVAL);
	expect_err("column 2: 'secret-passw...' is not a number");
	cr_assert_null(strstr(err.message, "1234567890"), "%s", err.message);
	write_text("q2.csv", "1,\x01\x02x\xff,3\n");
	s = csv_src(tmp_path("q2.csv"));
	cr_assert_eq(open_fail(&s), -EINVAL);
	expect_err("column 2: '??x?' is not a number");
}

/* ---- label checks (tr_data_check_labels) ---- */

/* Checks r's labels expecting failure; err.message must equal `want` exactly. */
static void labels_fail(tr_reader_t *r, const char *pointer, int classes, const char *want)
{
	char warn[256];
	int ret = tr_data_check_labels(r, pointer, classes, warn, sizeof warn, &err);

	cr_assert_eq(ret, -EINVAL, "check gave %d (%s)", ret, err.message);
	cr_assert_str_eq(err.message, want);
}

static void labels_ok(tr_reader_t *r, const char *pointer, int classes, char *warn, size_t warnlen)
{
	int ret = tr_data_check_labels(r, pointer, classes, warn, warnlen, &err);

	cr_assert_eq(ret, 0, "check gave %d (%s)", ret, err.message);
}

Test(data, labels_csv_out_of_range_names_file_line_and_pointer)
{
	/* The header and a blank line shift the lines: row 3 is on line 6. */
	const char *p = write_text("l.csv", "a,b,y\n1,2,0\n\n3,4,9\n5,6,1\n7,8,16\n9,9,2\n");
	struct tr_source_spec s = csv_src(p);
	char want[1024];

	s.header = true;
	tr_reader_t *r = open_ok(&s);
	snprintf(want, sizeof want, "/data/train: %s:6: label 16 is out of range: the model has 10 classes, 0 to 9", p);
	labels_fail(r, "/data/train", 10, want);
	tr_reader_destroy(r);
}

Test(data, labels_csv_negative_and_non_integer)
{
	const char *p = write_text("n.csv", "1,0\n2,1.5\n");
	struct tr_source_spec s = csv_src(p);
	tr_reader_t *r = open_ok(&s);
	char want[1024];

	snprintf(want, sizeof want,
		 "/data/validation: %s:2: label 1.5 is not an integer class index (the model has 3 classes, 0 to 2)",
		 p);
	labels_fail(r, "/data/validation", 3, want);
	tr_reader_destroy(r);

	p = write_text("m.csv", "1,2\n2,-1\n");
	s = csv_src(p);
	r = open_ok(&s);
	snprintf(want, sizeof want, "/data/train: %s:2: label -1 is out of range: the model has 3 classes, 0 to 2", p);
	labels_fail(r, "/data/train", 3, want);
	tr_reader_destroy(r);
}

Test(data, labels_slice_names_the_line_in_the_file)
{
	const char *p = write_text("s.csv", "1,0\n2,1\n3,2\n4,7\n");
	struct tr_source_spec s = csv_src(p);
	tr_reader_t *r = open_ok(&s);
	tr_reader_t *head = tr_reader_slice(r, 0, 2), *tail = tr_reader_slice(r, 2, 4);
	char want[1024];
	char warn[256];

	labels_ok(head, "/data/train", 3, warn, sizeof warn);
	cr_assert_str_eq(warn, "");
	snprintf(want, sizeof want,
		 "/data/validation_split: %s:4: label 7 is out of range: the model has 3 classes, 0 to 2", p);
	labels_fail(tail, "/data/validation_split", 3, want);
	tr_reader_destroy(head);
	tr_reader_destroy(tail);
	tr_reader_destroy(r);
}

Test(data, labels_npy_non_finite_target_and_bad_class)
{
	float x[6] = {1, 2, 3, 4, 5, 6};
	float y[3] = {0.5f, NAN, 1};
	long xs[2] = {3, 2}, ys[1] = {3};
	const char *yp = write_npy("y.npy", 1, "<f4", false, ys, 1, y, sizeof y);
	struct tr_source_spec s = npy_src(write_npy("x.npy", 1, "<f4", false, xs, 2, x, sizeof x), yp);
	tr_reader_t *r = open_ok(&s);
	char want[1024];

	snprintf(want, sizeof want, "/data/train: %s: record 1: target nan is not a finite number", yp);
	labels_fail(r, "/data/train", 0, want);
	tr_reader_destroy(r);

	/* Two targets per sample: the message says which. */
	float y2[6] = {0, 1, 2, 3, INFINITY, 5};
	long ys2[2] = {3, 2};
	yp = write_npy("y2.npy", 1, "<f4", false, ys2, 2, y2, sizeof y2);
	s = npy_src(tmp_path("x.npy"), yp);
	r = open_ok(&s);
	snprintf(want, sizeof want, "/data/train: %s: record 2: target 1 of 2 is inf, not a finite number", yp);
	labels_fail(r, "/data/train", 0, want);
	tr_reader_destroy(r);

	/* Integer labels as a classification target. */
	int64_t yi[3] = {0, 1, 12};
	yp = write_npy("yi.npy", 1, "<i8", false, ys, 1, yi, sizeof yi);
	s = npy_src(tmp_path("x.npy"), yp);
	r = open_ok(&s);
	snprintf(want, sizeof want,
		 "/data/train: %s: record 2: label 12 is out of range: the model has 10 classes, 0 to 9", yp);
	labels_fail(r, "/data/train", 10, want);
	tr_reader_destroy(r);
}

Test(data, labels_idx_out_of_range)
{
	/* write_idx_labels writes i % 10: record 9 holds 9. */
	const char *lp = write_idx_labels("lab", 12);
	struct tr_source_spec s = idx_src(write_idx_images("img", 12, 2, 2), lp);
	tr_reader_t *r = open_ok(&s);
	char want[1024];
	char warn[256];

	snprintf(want, sizeof want,
		 "/data/train: %s: record 8: label 8 is out of range: the model has 8 classes, 0 to 7", lp);
	labels_fail(r, "/data/train", 8, want);
	labels_ok(r, "/data/train", 10, warn, sizeof warn);
	cr_assert_str_eq(warn, "");
	tr_reader_destroy(r);
}

Test(data, labels_single_value_warns)
{
	const char *p = write_text("c.csv", "1,3\n2,3\n3,3\n");
	struct tr_source_spec s = csv_src(p);
	tr_reader_t *r = open_ok(&s);
	char warn[256];

	labels_ok(r, "/data/train", 10, warn, sizeof warn);
	cr_assert_str_eq(warn, "/data/train: all 3 labels are 3: a label column with a single value teaches nothing; "
			       "is it the right column?");
	tr_reader_destroy(r);

	p = write_text("r.csv", "1,0.5,2\n2,0.25,2\n");
	s = csv_src(p);
	s.label_cols[0] = 1;
	s.label_cols[1] = 2;
	s.n_label_cols = 2;
	r = open_ok(&s);
	labels_ok(r, "/data/train", 0, warn, sizeof warn);
	cr_assert_str_eq(warn, "/data/train: target 2 of 2 is 2 in all 2 samples: a label column with a single value "
			       "teaches nothing; is it the right column?");
	tr_reader_destroy(r);
}

Test(data, labels_unchecked_for_readers_without_label_access)
{
	struct tr_source_spec s = synth_src(TR_SYNTH_CLASSIFICATION, 20, 3, 4, 0.1f, 1);
	tr_reader_t *r = open_ok(&s);
	char warn[256];

	/* Synthetic labels are in range by construction. */
	labels_ok(r, "/data/train", 2, warn, sizeof warn);
	tr_reader_destroy(r);
}
