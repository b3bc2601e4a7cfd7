/* Tests for the image data: gzip IDX files and their [1, H, W] shape, the
 * "images" folder reader, the "patches" reader, the image transforms, the
 * bicubic resampling, and bit-identical batches for any loader count.
 * PNG files are written by the test itself with libpng into a fresh
 * mkdtemp directory; IDX files with zlib.  Fashion-MNIST (Debian's
 * dataset-fashion-mnist) is read when installed, else that test skips
 * with a message.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <jpeglib.h>

#include "engine/data/image.h"
#include "engine/data/prefetch.h"
#include "engine/data/reader.h"
#include "engine/memory.h"
#include "engine/spec.h"
#include "tests/unit/engine/fixtures.h"

TestSuite(images, .init = fixture_setup, .fini = fixture_teardown);
TestSuite(patches, .init = fixture_setup, .fini = fixture_teardown);

/* A w x h image whose pixel (y, x, c) is (seed + 7y + 3x + 50c) mod 256. */
static void write_pattern(const char *name, int w, int h, int channels, int seed)
{
	unsigned char *px = malloc((size_t)w * h * channels);

	for (int y = 0; y < h; y++)
		for (int x = 0; x < w; x++)
			for (int c = 0; c < channels; c++)
				px[((size_t)y * w + x) * channels + c] = (unsigned char)(seed + 7 * y + 3 * x + 50 * c);
	write_png(name, w, h, channels, px);
	free(px);
}

static float pattern(int seed, int y, int x, int c)
{
	return (float)(unsigned char)(seed + 7 * y + 3 * x + 50 * c);
}

static int file_size(const char *path)
{
	struct stat st;

	cr_assert_eq(stat(path, &st), 0);
	return (int)st.st_size;
}

static void truncate_file(const char *name, int keep)
{
	cr_assert_eq(truncate(tmp_path(name), keep), 0);
}

/* ---- gzip IDX ---- */

/* Writes an IDX images file [n, rows, cols] (plain and .gz), or a labels
 * file when rows == 0.  gz_cut > 0 cuts the gzip file to that size. */
static void write_idx(const char *name, uint32_t n, uint32_t rows, uint32_t cols, int gz_cut)
{
	size_t hdr = rows ? 16 : 8, len = hdr + (size_t)n * (rows ? rows * cols : 1);
	unsigned char *b = malloc(len);
	char gzname[256];
	gzFile g;

	put_be32(b, rows ? 0x803 : 0x801);
	put_be32(b + 4, n);
	if (rows) {
		put_be32(b + 8, rows);
		put_be32(b + 12, cols);
	}
	for (size_t i = hdr; i < len; i++)
		b[i] = rows ? (unsigned char)(i * 13 + 5) : (unsigned char)((i - hdr) % 10);
	write_file(name, b, len);
	snprintf(gzname, sizeof gzname, "%s.gz", name);
	g = gzopen(tmp_path(gzname), "wb");
	cr_assert_not_null(g);
	cr_assert_eq(gzwrite(g, b, (unsigned)len), (int)len);
	gzclose(g);
	if (gz_cut)
		truncate_file(gzname, gz_cut);
	free(b);
}

static struct tr_source_spec idx_src(const char *images, const char *labels)
{
	struct tr_source_spec s;

	memset(&s, 0, sizeof(s));
	s.present = true;
	s.format = TR_DATA_IDX;
	s.images_path = (char *)images;
	s.labels_path = (char *)labels;
	return s;
}

Test(images, idx_gzip_reads_the_same_samples_as_plain)
{
	write_idx("img", 9, 5, 4, 0);
	write_idx("lab", 9, 0, 0, 0);
	struct tr_source_spec sp = idx_src(tmp_path("img"), tmp_path("lab"));
	struct tr_source_spec sg = idx_src(tmp_path("img.gz"), tmp_path("lab.gz"));
	struct tr_source_spec smix = idx_src(tmp_path("img.gz"), tmp_path("lab"));
	tr_reader_t *p = open_ok(&sp), *g = open_ok(&sg), *m = open_ok(&smix);
	float xp[20], xg[20], yp, yg;

	cr_assert_eq(g->info.samples, 9);
	cr_assert_eq(g->info.features, 20);
	/* [N, rows, cols] gives one grey channel of rows x cols. */
	cr_assert_eq(g->info.shape[0], 1);
	cr_assert_eq(g->info.shape[1], 5);
	cr_assert_eq(g->info.shape[2], 4);
	cr_assert_eq(p->info.shape[1], 5);
	for (int i = 0; i < 9; i++) {
		cr_assert_eq(tr_reader_get(p, i, xp, &yp, &err), 0, "%s", err.message);
		cr_assert_eq(tr_reader_get(g, i, xg, &yg, &err), 0, "%s", err.message);
		cr_assert_arr_eq(xp, xg, sizeof xp);
		cr_assert_eq(yp, yg);
		cr_assert_eq(yg, (float)(i % 10));
		cr_assert_eq(tr_reader_get(m, i, xg, &yg, &err), 0, "%s", err.message);
		cr_assert_arr_eq(xp, xg, sizeof xp);
	}
	tr_reader_destroy(p);
	tr_reader_destroy(g);
	tr_reader_destroy(m);
}

Test(images, idx_gzip_rejects_truncated_and_corrupt_files)
{
	unsigned char junk[64];
	FILE *f;

	/* Cut inside the deflate stream: fewer bytes than the header promises. */
	write_idx("img", 50, 10, 10, 0);
	write_idx("lab", 50, 0, 0, 0);
	write_idx("cut", 50, 10, 10, file_size(tmp_path("img.gz")) / 2);
	struct tr_source_spec s = idx_src(tmp_path("cut.gz"), tmp_path("lab.gz"));
	open_fail(&s);
	expect_err("cut.gz");
	expect_err("truncated");

	/* A gzip magic followed by garbage. */
	memset(junk, 0x5a, sizeof junk);
	junk[0] = 0x1f;
	junk[1] = 0x8b;
	junk[2] = 8;
	junk[3] = 0;
	f = fopen(tmp_path("bad.gz"), "wb");
	fwrite(junk, 1, sizeof junk, f);
	fclose(f);
	s = idx_src(tmp_path("img.gz"), tmp_path("bad.gz"));
	open_fail(&s);
	expect_err("bad.gz");

	/* A header promising more than a compressed file may hold is refused
	 * before anything is allocated. */
	{
		unsigned char h[16];
		gzFile g = gzopen(tmp_path("huge.gz"), "wb");

		put_be32(h, 0x803);
		put_be32(h + 4, 0xffffffffu);
		put_be32(h + 8, 1000);
		put_be32(h + 12, 1000);
		gzwrite(g, h, sizeof h);
		gzclose(g);
	}
	s = idx_src(tmp_path("huge.gz"), tmp_path("lab.gz"));
	cr_assert_eq(open_fail(&s), -ENOMEM);
	expect_err("huge.gz");

	/* Below that, the memory available decides (not a fixed 16 GiB):
	 * 4 MB promised against an override of 1 MiB. */
	{
		unsigned char h[16];
		gzFile g = gzopen(tmp_path("big.gz"), "wb");

		put_be32(h, 0x803);
		put_be32(h + 4, 4);
		put_be32(h + 8, 1000);
		put_be32(h + 12, 1000);
		gzwrite(g, h, sizeof h);
		gzclose(g);
	}
	s = idx_src(tmp_path("big.gz"), tmp_path("lab.gz"));
	tr_mem_set_available(1 << 20);
	cr_assert_eq(open_fail(&s), -ENOMEM);
	tr_mem_set_available(0);
	expect_err("big.gz: the IDX header promises 4000000 bytes of data inflated, more than the 1048576 bytes of "
		   "memory available (memory-available)");
}

/* Debian's dataset-fashion-mnist: gzipped IDX, 60000 + 10000 images. */
#define FASHION_DIR "/usr/share/datasets/fashion-mnist"

Test(images, fashion_mnist_gz)
{
	struct stat st;

	if (stat(FASHION_DIR "/train-images-idx3-ubyte.gz", &st) != 0) {
		fprintf(stderr,
			"SKIP: Fashion-MNIST is not installed (Debian package dataset-fashion-mnist): skipped\n");
		cr_skip_test("Fashion-MNIST is not installed (Debian package dataset-fashion-mnist): skipped");
	}
	struct tr_source_spec s =
		idx_src(FASHION_DIR "/train-images-idx3-ubyte.gz", FASHION_DIR "/train-labels-idx1-ubyte.gz");
	tr_reader_t *r = open_ok(&s);
	float x[784], y;
	int counts[10] = {0};

	cr_assert_eq(r->info.samples, 60000);
	cr_assert_eq(r->info.features, 784);
	cr_assert_eq(r->info.shape[0], 1);
	cr_assert_eq(r->info.shape[1], 28);
	cr_assert_eq(r->info.shape[2], 28);
	for (int i = 0; i < 60000; i += 7) {
		cr_assert_eq(tr_reader_get(r, i, x, &y, &err), 0, "%s", err.message);
		cr_assert(y >= 0 && y < 10);
		counts[(int)y]++;
	}
	for (int k = 0; k < 10; k++)
		cr_assert_gt(counts[k], 700, "class %d: %d", k, counts[k]);
	tr_reader_destroy(r);
}

/* ---- images ---- */

static struct tr_source_spec images_src(const char *dir)
{
	struct tr_source_spec s;

	memset(&s, 0, sizeof(s));
	s.present = true;
	s.format = TR_DATA_IMAGES;
	s.path = (char *)tmp_path(dir);
	return s;
}

/* Two classes in sorted order ("ant" before "bee"), files sorted within. */
static void write_two_classes(int w, int h, int channels)
{
	mkdir_in("set");
	mkdir_in("set/bee");
	mkdir_in("set/ant");
	write_pattern("set/bee/b.png", w, h, channels, 30);
	write_pattern("set/bee/a.png", w, h, channels, 20);
	write_pattern("set/ant/z.PNG", w, h, channels, 10);
	/* Not images: skipped as torchvision's ImageFolder skips them. */
	FILE *f = fopen(tmp_path("set/ant/notes.txt"), "w");
	fputs("hello", f);
	fclose(f);
	f = fopen(tmp_path("set/README"), "w");
	fputs("hello", f);
	fclose(f);
}

Test(images, folders_give_classes_shape_and_planar_pixels)
{
	write_two_classes(5, 4, 3);
	struct tr_source_spec s = images_src("set");
	tr_reader_t *r = open_ok(&s);
	float x[60], y;
	const int seeds[] = {10, 20, 30}, labels[] = {0, 1, 1};

	cr_assert_eq(r->info.samples, 3);
	cr_assert_eq(r->info.features, 60);
	cr_assert_eq(r->info.label_dim, 1);
	cr_assert_eq(r->info.shape[0], 3);
	cr_assert_eq(r->info.shape[1], 4);
	cr_assert_eq(r->info.shape[2], 5);
	cr_assert_str_eq(tr_images_class_name(r, 0), "ant");
	cr_assert_str_eq(tr_images_class_name(r, 1), "bee");
	cr_assert_null(tr_images_class_name(r, 2));
	for (int i = 0; i < 3; i++) {
		cr_assert_eq(tr_reader_get(r, i, x, &y, &err), 0, "%s", err.message);
		cr_assert_eq(y, (float)labels[i]);
		for (int c = 0; c < 3; c++)
			for (int yy = 0; yy < 4; yy++)
				for (int xx = 0; xx < 5; xx++)
					cr_assert_eq(x[(c * 4 + yy) * 5 + xx], pattern(seeds[i], yy, xx, c),
						     "sample %d c%d y%d x%d", i, c, yy, xx);
	}
	{
		float lab[3];

		cr_assert_eq(r->i->labels(r, 0, 3, lab, &err), 0);
		cr_assert_eq(lab[0], 0.0f);
		cr_assert_eq(lab[2], 1.0f);
	}
	tr_reader_destroy(r);
}

/* Prediction inputs: a flat folder in sorted name order, named samples,
 * no labels; class folders lose their labels; files beside subfolders
 * are refused. */
Test(images, unlabeled_flat_and_class_folders)
{
	write_two_classes(5, 4, 3);
	mkdir_in("flat");
	write_pattern("flat/b.png", 5, 4, 3, 30);
	write_pattern("flat/a.jpg.png", 5, 4, 3, 20);
	write_pattern("flat/C.png", 5, 4, 3, 10); /* strcmp: capitals first */
	struct tr_source_spec s = images_src("flat");
	s.unlabeled = true;
	tr_reader_t *r = open_ok(&s);
	float x[60];
	char name[64];
	const int seeds[] = {10, 20, 30};
	const char *names[] = {"C.png", "a.jpg.png", "b.png"};

	cr_assert_eq(r->info.samples, 3);
	cr_assert_eq(r->info.features, 60);
	cr_assert_eq(r->info.label_dim, 0);
	cr_assert_null(tr_images_class_name(r, 0));
	for (int i = 0; i < 3; i++) {
		cr_assert_eq(tr_reader_get(r, i, x, NULL, &err), 0, "%s", err.message);
		cr_assert_eq(x[0], pattern(seeds[i], 0, 0, 0), "sample %d", i);
		cr_assert_eq(r->i->sample_name(r, i, name, sizeof name), 0);
		cr_assert_str_eq(name, names[i]);
	}
	tr_reader_destroy(r);

	s = images_src("set");
	s.unlabeled = true;
	r = open_ok(&s);
	cr_assert_eq(r->info.samples, 3);
	cr_assert_eq(r->info.label_dim, 0);
	cr_assert_eq(r->i->sample_name(r, 2, name, sizeof name), 0);
	cr_assert_str_eq(name, "bee/b.png");
	tr_reader_destroy(r);

	write_pattern("set/loose.png", 5, 4, 3, 1);
	s = images_src("set");
	s.unlabeled = true;
	cr_assert_eq(open_fail(&s), -EINVAL);
	expect_err("has both image files (loose.png) and subfolders (ant)");
	s.unlabeled = false; /* a labelled source ignores loose files, as before */
	r = open_ok(&s);
	cr_assert_eq(r->info.samples, 3);
	tr_reader_destroy(r);
}

/* want_shape (a model's input): every image must come out as it, and the
 * message names the file and both shapes, the first image included. */
Test(images, want_shape_names_file_and_both_shapes)
{
	mkdir_in("flat");
	write_pattern("flat/a.png", 5, 4, 1, 0);
	write_pattern("flat/b.png", 5, 4, 1, 0);
	struct tr_source_spec s = images_src("flat");
	s.unlabeled = true;
	s.want_shape[0] = 1;
	s.want_shape[1] = 4;
	s.want_shape[2] = 5;
	tr_reader_t *r = open_ok(&s);
	cr_assert_eq(r->info.shape[1], 4);
	tr_reader_destroy(r);

	s.want_shape[1] = 6;
	cr_assert_eq(open_fail(&s), -EINVAL);
	expect_err("flat/a.png: [1, 4, 5], the model takes [1, 6, 5]");
	s.want_shape[1] = 2;
	s.want_shape[2] = 2;
	s.center_crop[0] = 2;
	s.center_crop[1] = 2;
	r = open_ok(&s);
	cr_assert_eq(r->info.features, 4);
	tr_reader_destroy(r);
	s.center_crop[0] = 3;
	cr_assert_eq(open_fail(&s), -EINVAL);
	expect_err("center_crop [3, 2] does not give the model's [1, 2, 2]");
}

Test(images, resize_and_center_crop)
{
	mkdir_in("set");
	mkdir_in("set/a");
	write_pattern("set/a/1.png", 12, 8, 1, 0);
	write_pattern("set/a/2.png", 9, 10, 1, 5);
	struct tr_source_spec s = images_src("set");
	/* Different sizes without resize or crop: refused, naming the file. */
	open_fail(&s);
	expect_err("set/a/2.png");
	expect_err("resize");

	/* The crop alone, centred (torchvision rounds the offsets). */
	s.center_crop[0] = 6;
	s.center_crop[1] = 4;
	tr_reader_t *r = open_ok(&s);
	float x[24], y;

	cr_assert_eq(r->info.shape[1], 6);
	cr_assert_eq(r->info.shape[2], 4);
	cr_assert_eq(tr_reader_get(r, 0, x, &y, &err), 0, "%s", err.message);
	for (int yy = 0; yy < 6; yy++)
		for (int xx = 0; xx < 4; xx++)
			cr_assert_eq(x[yy * 4 + xx], pattern(0, yy + 1, xx + 4, 0));
	tr_reader_destroy(r);

	/* resize [h, w] then crop. */
	s.resize[0] = 16;
	s.resize[1] = 16;
	s.center_crop[0] = 8;
	s.center_crop[1] = 8;
	r = open_ok(&s);
	cr_assert_eq(r->info.features, 64);
	{
		float big[64];

		cr_assert_eq(tr_reader_get(r, 1, big, &y, &err), 0, "%s", err.message);
		for (int j = 0; j < 64; j++)
			cr_assert(isfinite(big[j]));
	}
	tr_reader_destroy(r);
}

Test(images, bad_images_are_named)
{
	struct tr_source_spec s = images_src("set");
	tr_reader_t *r;
	float x[60], y;

	/* Wrong channel count: the first image fixes it. */
	write_two_classes(5, 4, 3);
	write_pattern("set/bee/c.png", 5, 4, 1, 0);
	open_fail(&s);
	expect_err("set/bee/c.png");
	expect_err("1 channel");
	expect_err("set/ant/z.PNG has 3"); /* both images named */
	remove(tmp_path("set/bee/c.png"));

	/* Not a PNG at all. */
	{
		FILE *f = fopen(tmp_path("set/bee/c.png"), "w");

		fputs("GIF89a, not what the name says", f);
		fclose(f);
	}
	open_fail(&s);
	expect_err("set/bee/c.png");
	expect_err("not a PNG");
	remove(tmp_path("set/bee/c.png"));

	/* Truncated after open: the header was fine, the pixels are not.  The
	 * loader's read fails with the file named, the reader goes on. */
	r = open_ok(&s);
	truncate_file("set/bee/a.png", file_size(tmp_path("set/bee/a.png")) - 20);
	cr_assert_lt(tr_reader_get(r, 1, x, &y, &err), 0);
	expect_err("set/bee/a.png");
	cr_assert_eq(tr_reader_get(r, 0, x, &y, &err), 0, "%s", err.message);
	tr_reader_destroy(r);

	/* Truncated before open, inside the header. */
	truncate_file("set/bee/a.png", 20);
	open_fail(&s);
	expect_err("set/bee/a.png");

	/* No classes. */
	mkdir_in("empty");
	s = images_src("empty");
	open_fail(&s);
	expect_err("no class subfolders");

	/* A file where a folder is expected. */
	s = images_src("set/README");
	open_fail(&s);
	expect_err("ot a directory");
}

/* ---- patches ---- */

static struct tr_source_spec patches_src(const char *dir, int size, int per_image)
{
	struct tr_source_spec s;

	memset(&s, 0, sizeof(s));
	s.present = true;
	s.format = TR_DATA_PATCHES;
	s.path = (char *)tmp_path(dir);
	s.patch_size[0] = s.patch_size[1] = size;
	s.patches_per_image = per_image;
	s.degrade = (struct tr_degrade){.type = TR_DEGRADE_DOWNSCALE, .factor = 2};
	s.data_seed = 42;
	return s;
}

/* Finds where patch (ph x pw, one channel, values v/255) sits in the
 * pattern image `seed` of width w, height h; -1 when it is nowhere. */
static int locate(const float *p, int ph, int pw, int w, int h, int seed)
{
	for (int top = 0; top + ph <= h; top++)
		for (int left = 0; left + pw <= w; left++) {
			int ok = 1;

			for (int y = 0; y < ph && ok; y++)
				for (int x = 0; x < pw && ok; x++)
					ok = fabsf(p[y * pw + x] - pattern(seed, top + y, left + x, 0) / 255.0f) <
					     1e-6f;
			if (ok)
				return top * w + left;
		}
	return -1;
}

Test(patches, clean_response_is_a_window_drawn_per_epoch)
{
	mkdir_in("pics");
	write_pattern("pics/a.png", 20, 16, 1, 3);
	write_pattern("pics/b.png", 18, 18, 1, 90);
	struct tr_source_spec s = patches_src("pics", 6, 4);
	tr_reader_t *r = open_ok(&s);
	float x[36], y[36], x2[36], y2[36];
	int moved = 0;

	cr_assert_eq(r->info.samples, 8);
	cr_assert_eq(r->info.features, 36);
	cr_assert_eq(r->info.label_dim, 36);
	cr_assert_eq(r->info.shape[1], 6);
	cr_assert_eq(r->info.label_shape[2], 6);
	for (int i = 0; i < 8; i++) {
		for (int epoch = 0; epoch < 3; epoch++) {
			cr_assert_eq(tr_reader_get_epoch(r, i, epoch, x, y, &err), 0, "%s", err.message);
			/* Samples 0-3 come from a.png, 4-7 from b.png. */
			int at = locate(y, 6, 6, i < 4 ? 20 : 18, i < 4 ? 16 : 18, i < 4 ? 3 : 90);
			cr_assert_geq(at, 0, "sample %d epoch %d is no window of its image", i, epoch);
			/* A pure function of (seed, epoch, index). */
			cr_assert_eq(tr_reader_get_epoch(r, i, epoch, x2, y2, &err), 0);
			cr_assert_arr_eq(x, x2, sizeof x);
			cr_assert_arr_eq(y, y2, sizeof y);
			if (epoch > 0) {
				float y0[36];

				tr_reader_get_epoch(r, i, 0, x2, y0, &err);
				moved += memcmp(y0, y, sizeof y) != 0;
			}
		}
		/* get is epoch 0 */
		cr_assert_eq(tr_reader_get(r, i, x2, y2, &err), 0);
		tr_reader_get_epoch(r, i, 0, x, y, &err);
		cr_assert_arr_eq(y, y2, sizeof y);
	}
	cr_assert_gt(moved, 8, "patches hardly move between epochs (%d of 16)", moved);
	tr_reader_destroy(r);
}

Test(patches, residual_of_a_flat_image_is_zero)
{
	mkdir_in("flat");
	{
		unsigned char px[24 * 24];

		memset(px, 77, sizeof px);
		write_png("flat/f.png", 24, 24, 1, px);
	}
	struct tr_source_spec s = patches_src("flat", 8, 2);
	s.residual = true;
	tr_reader_t *r = open_ok(&s);
	float x[64], y[64];

	for (int i = 0; i < 2; i++) {
		cr_assert_eq(tr_reader_get_epoch(r, i, 5, x, y, &err), 0, "%s", err.message);
		/* Bicubic weights sum to 1: a constant survives down and up. */
		for (int j = 0; j < 64; j++) {
			cr_assert_float_eq(x[j], 77.0f / 255.0f, 1e-5f);
			cr_assert_float_eq(y[j], 0.0f, 1e-5f);
		}
	}
	tr_reader_destroy(r);
}

Test(patches, degraded_input_plus_residual_is_the_clean_patch)
{
	mkdir_in("pics");
	write_pattern("pics/a.png", 32, 32, 1, 3);
	struct tr_source_spec s = patches_src("pics", 10, 3);
	tr_reader_t *clean = open_ok(&s);
	s.residual = true;
	tr_reader_t *res = open_ok(&s);
	float xc[100], yc[100], xr[100], yr[100];
	double diff = 0;

	for (int i = 0; i < 3; i++) {
		tr_reader_get_epoch(clean, i, 1, xc, yc, &err);
		tr_reader_get_epoch(res, i, 1, xr, yr, &err);
		cr_assert_arr_eq(xc, xr, sizeof xc);
		for (int j = 0; j < 100; j++) {
			cr_assert_float_eq(xr[j] + yr[j], yc[j], 1e-6f);
			diff += fabs(xc[j] - yc[j]);
		}
	}
	/* The pattern has edges (it wraps mod 256): the degradation shows. */
	cr_assert_gt(diff / 300, 0.01, "mean |degraded - clean| %g", diff / 300);
	tr_reader_destroy(clean);
	tr_reader_destroy(res);
}

Test(patches, noise_is_drawn_per_patch_and_epoch_with_its_sigma)
{
	mkdir_in("pics");
	write_pattern("pics/a.png", 32, 32, 1, 3);
	struct tr_source_spec s = patches_src("pics", 10, 40);
	s.degrade = (struct tr_degrade){.type = TR_DEGRADE_NOISE, .sigma = 0.1f};
	s.residual = true;
	tr_reader_t *r = open_ok(&s);
	float x[100], y[100], x2[100], y2[100];
	double sum = 0, sq = 0;

	for (int i = 0; i < 40; i++) {
		cr_assert_eq(tr_reader_get_epoch(r, i, 1, x, y, &err), 0, "%s", err.message);
		cr_assert_eq(tr_reader_get_epoch(r, i, 1, x2, y2, &err), 0);
		cr_assert_arr_eq(x, x2, sizeof x, "the same noise for the same (epoch, sample)");
		cr_assert_eq(tr_reader_get_epoch(r, i, 2, x2, y2, &err), 0);
		for (int j = 0; j < 100; j++) {
			/* the residual is minus the noise: clean - (clean + n) */
			sum += -y[j];
			sq += (double)y[j] * y[j];
		}
		cr_assert(memcmp(y, y2, sizeof y) != 0, "epoch 2 draws new noise (or a new place)");
	}
	double mean = sum / 4000, sd = sqrt(sq / 4000 - mean * mean);
	cr_assert_lt(fabs(mean), 0.01, "noise mean %g", mean);
	cr_assert_float_eq(sd, 0.1, 0.01, "noise sd %g, sigma 0.1", sd);
	tr_reader_destroy(r);
}

Test(patches, input_and_response_folders_pair_by_name)
{
	mkdir_in("in");
	mkdir_in("out");
	write_pattern("in/a.png", 12, 12, 1, 1);
	write_pattern("out/a.png", 12, 12, 1, 2);
	struct tr_source_spec s = patches_src("in", 5, 2);
	s.path = NULL;
	s.input_path = (char *)tmp_path("in");
	s.response_path = (char *)tmp_path("out");
	tr_reader_t *r = open_ok(&s);
	float x[25], y[25];

	cr_assert_eq(tr_reader_get_epoch(r, 1, 3, x, y, &err), 0, "%s", err.message);
	int at = locate(x, 5, 5, 12, 12, 1);
	cr_assert_geq(at, 0);
	/* The response is cut at the same place. */
	cr_assert_eq(locate(y, 5, 5, 12, 12, 2), at);
	tr_reader_destroy(r);

	/* A file without its partner. */
	write_pattern("in/b.png", 12, 12, 1, 1);
	open_fail(&s);
	expect_err("in/b.png");
	remove(tmp_path("in/b.png"));
	/* Sizes that differ. */
	write_pattern("out/a.png", 13, 12, 1, 2);
	open_fail(&s);
	expect_err("in/a.png");
}

Test(patches, bad_images_are_named)
{
	mkdir_in("pics");
	write_pattern("pics/a.png", 12, 12, 1, 1);
	write_pattern("pics/b.png", 7, 12, 1, 1);
	struct tr_source_spec s = patches_src("pics", 8, 2);

	/* Smaller than the patch. */
	open_fail(&s);
	expect_err("pics/b.png");
	expect_err("smaller than the 8x8 patch_size");
	/* Another channel count. */
	write_pattern("pics/b.png", 12, 12, 3, 1);
	open_fail(&s);
	expect_err("pics/b.png");
	expect_err("3 channels");
	/* Truncated: decoded at open, so open fails. */
	write_pattern("pics/b.png", 12, 12, 1, 1);
	truncate_file("pics/b.png", file_size(tmp_path("pics/b.png")) - 16);
	open_fail(&s);
	expect_err("pics/b.png");
	/* Not a PNG. */
	{
		FILE *f = fopen(tmp_path("pics/b.png"), "w");

		fputs("\xff\xd8\xff\xe0 a JPEG, say", f);
		fclose(f);
	}
	open_fail(&s);
	/* Told apart by content, not name: a broken JPEG whatever it is called. */
	expect_err("pics/b.png: corrupt or truncated JPEG");
	{
		FILE *f = fopen(tmp_path("pics/b.png"), "w");

		fputs("GIF89a and more", f);
		fclose(f);
	}
	open_fail(&s);
	expect_err("pics/b.png: not a PNG");
	/* No images at all. */
	mkdir_in("none");
	s = patches_src("none", 8, 2);
	open_fail(&s);
	expect_err("no .png or .jpg files");
}

/* ---- resampling ---- */

Test(resize, keeps_constants_and_identity_and_ramps)
{
	float src[6 * 8], dst[12 * 16], back[6 * 8];

	for (int i = 0; i < 48; i++)
		src[i] = 0.25f;
	cr_assert_eq(tr_image_resize(src, 1, 6, 8, dst, 12, 16), 0);
	for (int i = 0; i < 192; i++)
		cr_assert_float_eq(dst[i], 0.25f, 1e-6f);
	/* Same size: the kernel's taps fall on integers, weight 1 at 0. */
	for (int i = 0; i < 48; i++)
		src[i] = (float)(i * 37 % 11);
	cr_assert_eq(tr_image_resize(src, 1, 6, 8, back, 6, 8), 0);
	for (int i = 0; i < 48; i++)
		cr_assert_float_eq(back[i], src[i], 1e-5f);
	/* Halving a horizontal ramp x gives a ramp 2x + 0.5 away from the
	 * mirrored edges (pixel centres: out x covers in 2x, 2x + 1). */
	{
		float ramp[16 * 32], half[8 * 16];

		for (int y = 0; y < 16; y++)
			for (int x = 0; x < 32; x++)
				ramp[y * 32 + x] = (float)x;
		cr_assert_eq(tr_image_resize(ramp, 1, 16, 32, half, 8, 16), 0);
		for (int x = 3; x < 13; x++)
			cr_assert_float_eq(half[4 * 16 + x], 2.0f * x + 0.5f, 1e-4f, "x %d: %g", x, half[4 * 16 + x]);
	}
}

/* ---- transforms ---- */

static struct tr_spec *spec_with(int n, const enum tr_transform_type *types)
{
	struct tr_spec *s = calloc(1, sizeof(*s));

	cr_assert_not_null(s);
	s->n_transforms = n;
	for (int k = 0; k < n; k++)
		s->transforms[k].type = types[k];
	return s;
}

/* The square n x n plane p turned k quarter turns counterclockwise, at (y, x). */
static float rot_at(const float *p, int n, int k, int y, int x)
{
	for (; k > 0; k--) {
		/* out(y, x) = in(x, n-1-y) for one counterclockwise turn */
		int ny = x, nx = n - 1 - y;

		y = ny;
		x = nx;
	}
	return p[y * n + x];
}

Test(patches, augmentations_move_input_and_response_together)
{
	mkdir_in("pics");
	write_pattern("pics/a.png", 16, 16, 1, 3);
	struct tr_source_spec src = patches_src("pics", 7, 64);
	tr_reader_t *r = open_ok(&src);
	enum tr_transform_type types[] = {TR_TF_FLIP, TR_TF_ROT90};
	struct tr_spec *spec = spec_with(2, types);
	tr_transforms_t *t;
	int seen[2][4] = {{0}};

	spec->transforms[0].vertical = false;
	cr_assert_eq(tr_transforms_create(spec, r, &t, &err), 0, "%s", err.message);
	for (int i = 0; i < 64; i++) {
		float x0[49], y0[49], x[49], y[49];
		int found = 0;

		tr_reader_get_epoch(r, i, 2, x0, y0, &err);
		memcpy(x, x0, sizeof x);
		memcpy(y, y0, sizeof y);
		tr_transforms_apply_pair(t, x, 49, y, 9, 2, i, 1);
		/* Which of the 8 (flip, turns) it is; the response matches. */
		for (int f = 0; f < 2 && !found; f++)
			for (int k = 0; k < 4 && !found; k++) {
				float fx[49], fy[49];
				int ok = 1;

				for (int yy = 0; yy < 7; yy++)
					for (int xx = 0; xx < 7; xx++) {
						fx[yy * 7 + xx] = x0[yy * 7 + (f ? 6 - xx : xx)];
						fy[yy * 7 + xx] = y0[yy * 7 + (f ? 6 - xx : xx)];
					}
				for (int j = 0; j < 49 && ok; j++)
					ok = x[j] == rot_at(fx, 7, k, j / 7, j % 7) &&
					     y[j] == rot_at(fy, 7, k, j / 7, j % 7);
				if (ok) {
					seen[f][k]++;
					found = 1;
				}
			}
		cr_assert(found, "sample %d: not a flip/rotation of its patch, or the response moved differently", i);
		/* Evaluation: no augmentation. */
		memcpy(x, x0, sizeof x);
		tr_transforms_apply(t, x, 49, 9, 2, i, 0);
		cr_assert_arr_eq(x, x0, sizeof x);
	}
	for (int f = 0; f < 2; f++)
		for (int k = 0; k < 4; k++)
			cr_assert_gt(seen[f][k], 0, "flip %d turns %d never drawn in 64 samples", f, k);
	tr_transforms_destroy(t);
	free(spec);
	tr_reader_destroy(r);
}

Test(images, normalize_and_random_crop)
{
	write_two_classes(5, 4, 3);
	struct tr_source_spec src = images_src("set");
	tr_reader_t *r = open_ok(&src);
	enum tr_transform_type types[] = {TR_TF_NORMALIZE, TR_TF_RANDOM_CROP};
	struct tr_spec *spec = spec_with(2, types);
	tr_transforms_t *t;
	float x0[60], x[60], y;
	int shifted = 0;

	spec->transforms[0].n_channels = 3;
	for (int c = 0; c < 3; c++) {
		spec->transforms[0].mean_c[c] = 10.0f * (float)c;
		spec->transforms[0].std_c[c] = 2.0f + (float)c;
	}
	spec->transforms[1].padding = 2;
	cr_assert_eq(tr_transforms_create(spec, r, &t, &err), 0, "%s", err.message);
	cr_assert_eq(tr_reader_get(r, 0, x0, &y, &err), 0);
	memcpy(x, x0, sizeof x);
	tr_transforms_apply(t, x, 60, 1, 0, 0, 0);
	for (int c = 0; c < 3; c++)
		for (int j = 0; j < 20; j++)
			cr_assert_float_eq(x[c * 20 + j], (x0[c * 20 + j] - 10.0f * c) / (2.0f + c), 1e-5f);
	for (int64_t i = 0; i < 40; i++) {
		float n[60];
		int dy_ok = 0;

		memcpy(n, x0, sizeof n);
		tr_transforms_apply(t, n, 60, 1, 0, 0, 0); /* normalized, uncropped */
		memcpy(x, x0, sizeof x);
		tr_transforms_apply(t, x, 60, 1, 3, i, 1);
		for (int dy = -2; dy <= 2 && !dy_ok; dy++)
			for (int dx = -2; dx <= 2 && !dy_ok; dx++) {
				int ok = 1;

				for (int c = 0; c < 3 && ok; c++)
					for (int yy = 0; yy < 4 && ok; yy++)
						for (int xx = 0; xx < 5 && ok; xx++) {
							int sy = yy + dy, sx = xx + dx;
							float want = sy >= 0 && sy < 4 && sx >= 0 && sx < 5
									     ? n[(c * 4 + sy) * 5 + sx]
									     : 0.0f;

							ok = x[(c * 4 + yy) * 5 + xx] == want;
						}
				if (ok) {
					dy_ok = 1;
					shifted += dy || dx;
				}
			}
		cr_assert(dy_ok, "draw %lld is no crop of the padded image", (long long)i);
	}
	cr_assert_gt(shifted, 20);
	tr_transforms_destroy(t);

	/* Wrong number of channels, rot90 on a non-square image, and image
	 * transforms on flat data are refused, naming the transform. */
	spec->transforms[0].n_channels = 1;
	cr_assert_lt(tr_transforms_create(spec, r, &t, &err), 0);
	expect_err("/data/transforms/0");
	expect_err("3 channels");
	spec->n_transforms = 1;
	spec->transforms[0].type = TR_TF_ROT90;
	cr_assert_lt(tr_transforms_create(spec, r, &t, &err), 0);
	expect_err("square");
	free(spec);
	tr_reader_destroy(r);
}

/* ---- loader-count bit-identity ---- */

/* All batches of `epochs` epochs through a pool of `workers` loaders. */
static float *all_batches(tr_reader_t *r, const tr_transforms_t *t, int workers, int epochs, size_t *len)
{
	struct tr_plan plan;
	tr_prefetch_t *pf;
	size_t F = (size_t)r->info.features, L = (size_t)r->info.label_dim, at = 0;
	float *out;

	cr_assert_eq(tr_plan_init(&plan, r->info.samples, 5, TR_LAST_PARTIAL, true, 11, epochs, 0, &err), 0, "%s",
		     err.message);
	out = malloc((size_t)epochs * (size_t)r->info.samples * (F + L) * sizeof(float));
	struct tr_prefetch_config cfg = {.reader = r,
					 .transforms = t,
					 .plan = &plan,
					 .seed = 5,
					 .workers = workers,
					 .depth = 3,
					 .end_step = plan.total_steps};
	cr_assert_eq(tr_prefetch_create(&cfg, &pf, &err), 0, "%s", err.message);
	for (int64_t s = 0; s < plan.total_steps; s++) {
		const struct tr_batch *b;

		cr_assert_eq(tr_prefetch_next(pf, s, &b, NULL), 0, "%s", tr_prefetch_error(pf));
		memcpy(out + at, b->x, (size_t)b->count * F * sizeof(float));
		at += (size_t)b->count * F;
		memcpy(out + at, b->y, (size_t)b->count * L * sizeof(float));
		at += (size_t)b->count * L;
		tr_prefetch_release(pf, s);
	}
	tr_prefetch_destroy(pf);
	*len = at;
	return out;
}

static void same_batches_for_1_and_4_loaders(tr_reader_t *r, const tr_transforms_t *t)
{
	size_t n1, n4;
	float *a = all_batches(r, t, 1, 3, &n1), *b = all_batches(r, t, 4, 3, &n4);

	cr_assert_eq(n1, n4);
	cr_assert_eq(memcmp(a, b, n1 * sizeof(float)), 0, "batches differ between 1 and 4 loader threads");
	free(a);
	free(b);
}

Test(images, same_batches_for_any_loader_count)
{
	mkdir_in("set");
	mkdir_in("set/a");
	mkdir_in("set/b");
	for (int i = 0; i < 23; i++) {
		char name[64];

		snprintf(name, sizeof name, "set/%c/%02d.png", i % 2 ? 'a' : 'b', i);
		write_pattern(name, 10, 9 + i % 3, 3, i * 11);
	}
	struct tr_source_spec src = images_src("set");
	src.resize[0] = 12;
	src.resize[1] = 12;
	src.center_crop[0] = 8;
	src.center_crop[1] = 8;
	tr_reader_t *r = open_ok(&src);
	enum tr_transform_type types[] = {TR_TF_RANDOM_CROP, TR_TF_FLIP, TR_TF_ROT90, TR_TF_NORMALIZE};
	struct tr_spec *spec = spec_with(4, types);
	tr_transforms_t *t;

	spec->transforms[0].padding = 2;
	spec->transforms[1].vertical = true;
	spec->transforms[3].n_channels = 3;
	for (int c = 0; c < 3; c++) {
		spec->transforms[3].mean_c[c] = 100.0f;
		spec->transforms[3].std_c[c] = 60.0f;
	}
	cr_assert_eq(tr_transforms_create(spec, r, &t, &err), 0, "%s", err.message);
	same_batches_for_1_and_4_loaders(r, t);
	tr_transforms_destroy(t);
	free(spec);
	tr_reader_destroy(r);
}

Test(patches, same_batches_for_any_loader_count)
{
	mkdir_in("pics");
	write_pattern("pics/a.png", 40, 33, 1, 3);
	write_pattern("pics/b.png", 35, 35, 1, 99);
	write_pattern("pics/c.png", 50, 20, 1, 7);
	struct tr_source_spec src = patches_src("pics", 9, 7);
	src.residual = true;
	tr_reader_t *r = open_ok(&src);
	enum tr_transform_type types[] = {TR_TF_FLIP, TR_TF_ROT90};
	struct tr_spec *spec = spec_with(2, types);
	tr_transforms_t *t;

	cr_assert_eq(tr_transforms_create(spec, r, &t, &err), 0, "%s", err.message);
	same_batches_for_1_and_4_loaders(r, t);
	tr_transforms_destroy(t);
	free(spec);
	tr_reader_destroy(r);
}

/* Real files of many kinds (palette, grey, RGB, RGBA, 16-bit, odd sizes,
 * JPEG): every image that Debian's python3-skimage ships decodes, with the size and
 * channel count its header promised. */
#define SKIMAGE_DATA "/usr/lib/python3/dist-packages/skimage/data"

Test(images, decodes_every_skimage_png)
{
	struct stat st;
	int fd, dfd, n, decoded = 0;
	char **names;

	if (stat(SKIMAGE_DATA "/camera.png", &st) != 0) {
		fprintf(stderr, "SKIP: python3-skimage's images are not installed: skipped\n");
		cr_skip_test("python3-skimage's images are not installed: skipped");
	}
	dfd = tr_data_open_dir(NULL, SKIMAGE_DATA, NULL, 0, &err);
	cr_assert_geq(dfd, 0, "%s", err.message);
	cr_assert_eq(tr_image_list(dfd, SKIMAGE_DATA, 0, &names, &n, &err), 0, "%s", err.message);
	cr_assert_gt(n, 10);
	for (int i = 0; i < n; i++) {
		int w, h, c, w2, h2, c2;
		float *px;

		fd = tr_data_open_in(dfd, names[i], 0, NULL, &err);
		cr_assert_geq(fd, 0, "%s", err.message);
		if (tr_image_probe(fd, names[i], &w, &h, &c, &err) != 0) {
			/* A file that is not a PNG despite its name is refused by
			 * name, and that is all. */
			cr_assert_not_null(strstr(err.message, names[i]));
			continue;
		}
		cr_assert_eq(tr_image_load(dfd, names[i], names[i], 1.0f, &px, &w2, &h2, &c2, &err), 0, "%s",
			     err.message);
		cr_assert_eq(w2, w, "%s", names[i]);
		cr_assert_eq(h2, h, "%s", names[i]);
		cr_assert_eq(c2, c, "%s", names[i]);
		cr_assert(c >= 1 && c <= 4);
		free(px);
		decoded++;
	}
	cr_assert_gt(decoded, 10);
	if (stat(SKIMAGE_DATA "/camera.png", &st) == 0) {
		int w, h, c;

		fd = tr_data_open_in(dfd, "camera.png", 0, NULL, &err);
		cr_assert_eq(tr_png_probe(fd, "camera.png", &w, &h, &c, &err), 0);
		cr_assert_eq(w, 512);
		cr_assert_eq(h, 512);
		cr_assert_eq(c, 1);
	}
	tr_image_names_free(names, n);
	close(dfd);
}

/* Image folders are confined like files: a folder outside the roots is
 * "not in the data roots", and a symlink inside a folder is neither listed
 * nor opened. */
Test(images, folders_stay_inside_the_data_roots)
{
	const char *dirs[2];
	tr_data_roots_t *roots;
	char **names;
	int n, dfd;

	mkdir_in("root");
	mkdir_in("root/set");
	mkdir_in("root/set/a");
	mkdir_in("outside");
	write_pattern("root/set/a/in.png", 4, 4, 1, 0);
	write_pattern("outside/secret.png", 4, 4, 1, 0);
	cr_assert_eq(symlink(tmp_path("outside/secret.png"), tmp_path("root/set/a/link.png")), 0);
	cr_assert_eq(symlink("../../../outside", tmp_path("root/set/b")), 0);
	dirs[0] = tmp_path("root");
	dirs[1] = NULL;
	cr_assert_eq(tr_data_roots_create(dirs, &roots, &err), 0, "%s", err.message);

	cr_assert_eq(tr_data_open_dir(roots, "../outside", NULL, 0, &err), -ENOENT);
	expect_err("not a directory in the data roots");
	cr_assert_eq(tr_data_open_dir(roots, tmp_path("outside"), NULL, 0, &err), -ENOENT);
	cr_assert_eq(tr_data_open_dir(roots, "set/b", NULL, 0, &err), -ENOENT);
	dfd = tr_data_open_dir(roots, "set/", NULL, 0, &err);
	cr_assert_geq(dfd, 0, "%s", err.message);
	/* The symlinked class folder is not a class. */
	cr_assert_eq(tr_image_list(dfd, "set", 1, &names, &n, &err), 0);
	cr_assert_eq(n, 1);
	cr_assert_str_eq(names[0], "a");
	tr_image_names_free(names, n);
	cr_assert_lt(tr_data_open_in(dfd, "b", 1, NULL, &err), 0);
	{
		int cfd = tr_data_open_in(dfd, "a", 1, NULL, &err);

		cr_assert_geq(cfd, 0, "%s", err.message);
		cr_assert_eq(tr_image_list(cfd, "a", 0, &names, &n, &err), 0);
		cr_assert_eq(n, 1, "the symlinked file is listed");
		cr_assert_str_eq(names[0], "in.png");
		tr_image_names_free(names, n);
		cr_assert_lt(tr_data_open_in(cfd, "link.png", 0, NULL, &err), 0);
		expect_err("symbolic link");
		cr_assert_lt(tr_data_open_in(cfd, "../a/in.png", 0, NULL, &err), 0);
		close(cfd);
	}
	close(dfd);
	/* The same through the walk used where openat2 is missing. */
	tr_data_open_force_walk(1);
	dfd = tr_data_open_dir(roots, "set", NULL, 0, &err);
	cr_assert_geq(dfd, 0, "%s", err.message);
	close(dfd);
	dfd = tr_data_open_dir(roots, tmp_path("root"), NULL, 0, &err);
	cr_assert_geq(dfd, 0, "the root itself: %s", err.message);
	close(dfd);
	cr_assert_eq(tr_data_open_dir(roots, "../outside", NULL, 0, &err), -ENOENT);
	cr_assert_eq(tr_data_open_dir(roots, "set/b", NULL, 0, &err), -ENOENT);
	tr_data_open_force_walk(0);
	tr_data_roots_destroy(roots);
}

/* ---- JPEG ---- */

/* Writes a w x h JPEG (quality 95) of the pattern image `seed`. */
static void write_jpeg(const char *name, int w, int h, int channels, int seed)
{
	struct jpeg_compress_struct c;
	struct jpeg_error_mgr e;
	FILE *f = fopen(tmp_path(name), "wb");
	unsigned char *row = malloc((size_t)w * channels);

	cr_assert(f && row);
	c.err = jpeg_std_error(&e);
	jpeg_create_compress(&c);
	jpeg_stdio_dest(&c, f);
	c.image_width = (JDIMENSION)w;
	c.image_height = (JDIMENSION)h;
	c.input_components = channels;
	c.in_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
	jpeg_set_defaults(&c);
	jpeg_set_quality(&c, 95, TRUE);
	jpeg_start_compress(&c, TRUE);
	for (int y = 0; y < h; y++) {
		JSAMPROW r = row;

		for (int x = 0; x < w; x++)
			for (int k = 0; k < channels; k++)
				row[x * channels + k] = (unsigned char)(seed + 2 * y + x + 40 * k); /* smooth */
		jpeg_write_scanlines(&c, &r, 1);
	}
	jpeg_finish_compress(&c);
	jpeg_destroy_compress(&c);
	free(row);
	cr_assert_eq(fclose(f), 0);
}

Test(images, jpeg_files_read_like_png_and_bad_ones_are_named)
{
	float x[3 * 16 * 24], y;

	mkdir_in("set");
	mkdir_in("set/a");
	mkdir_in("set/b");
	write_jpeg("set/a/1.jpg", 24, 16, 3, 10);
	write_pattern("set/a/2.png", 24, 16, 3, 10);
	write_jpeg("set/b/3.JPEG", 24, 16, 3, 60);
	struct tr_source_spec s = images_src("set");
	tr_reader_t *r = open_ok(&s);

	cr_assert_eq(r->info.samples, 3);
	cr_assert_eq(r->info.shape[0], 3);
	cr_assert_eq(r->info.shape[1], 16);
	cr_assert_eq(r->info.shape[2], 24);
	cr_assert_eq(tr_reader_get(r, 0, x, &y, &err), 0, "%s", err.message);
	/* Lossy, but close to what was written. */
	for (int k = 0; k < 3; k++)
		for (int yy = 0; yy < 16; yy++)
			for (int xx = 0; xx < 24; xx++)
				cr_assert_float_eq(x[(k * 16 + yy) * 24 + xx], (float)(10 + 2 * yy + xx + 40 * k), 6.0f,
						   "c%d y%d x%d: %g", k, yy, xx, x[(k * 16 + yy) * 24 + xx]);
	cr_assert_eq(tr_reader_get(r, 2, x, &y, &err), 0, "%s", err.message);
	cr_assert_eq(y, 1.0f);
	tr_reader_destroy(r);

	/* A grey JPEG among RGB ones: named at open. */
	write_jpeg("set/b/4.jpg", 24, 16, 1, 0);
	open_fail(&s);
	expect_err("set/b/4.jpg: 1 channel");
	remove(tmp_path("set/b/4.jpg"));

	/* Truncated: libjpeg would fill the rest with grey; the job fails. */
	r = open_ok(&s);
	truncate_file("set/b/3.JPEG", file_size(tmp_path("set/b/3.JPEG")) / 2);
	cr_assert_lt(tr_reader_get(r, 2, x, &y, &err), 0);
	expect_err("set/b/3.JPEG: corrupt or truncated JPEG");
	tr_reader_destroy(r);

	/* A .jpg that is neither. */
	{
		FILE *f = fopen(tmp_path("set/a/0.jpg"), "w");

		fputs("plain text", f);
		fclose(f);
	}
	open_fail(&s);
	expect_err("set/a/0.jpg: not a PNG or JPEG file");
}

/* A model's [C, H, W] inputs against the data: an image reader's own
 * shape must match; flat data must hold C * H * W values. */
Test(images, model_input_shape_is_checked_against_the_data)
{
	const int mnist[3] = {1, 5, 4}, wrong[3] = {1, 4, 5}, flat[3] = {2, 2, 5};

	write_idx("img", 3, 5, 4, 0);
	write_idx("lab", 3, 0, 0, 0);
	struct tr_source_spec s = idx_src(tmp_path("img"), tmp_path("lab"));
	tr_reader_t *r = open_ok(&s);

	cr_assert_eq(tr_reader_check_shape(r, mnist, &err), 0, "%s", err.message);
	cr_assert_eq(tr_reader_check_shape(r, wrong, &err), -EINVAL);
	expect_err("/model/inputs: [1, 4, 5] does not match the [1, 5, 4] images of");
	/* Flat data (here: a slice keeps the shape, so fake a flat reader's
	 * info) is read as [C, H, W] when the counts agree. */
	r->info.shape[0] = r->info.shape[1] = r->info.shape[2] = 0;
	cr_assert_eq(tr_reader_check_shape(r, flat, &err), 0, "%s", err.message);
	cr_assert_eq(tr_reader_check_shape(r, wrong, &err), 0, "%s", err.message);
	{
		const int big[3] = {3, 5, 4};

		cr_assert_eq(tr_reader_check_shape(r, big, &err), -EINVAL);
		expect_err("(60 values) does not match the 20 features");
	}
	tr_reader_destroy(r);
}

/* A model file's user rebuilds the transforms without the training data:
 * normalize comes from the spec (its channels split the input width into
 * planes), and the augmentations are training-only. */
Test(images, recorded_normalize_applies_per_channel)
{
	enum tr_transform_type types[] = {TR_TF_NORMALIZE, TR_TF_FLIP};
	struct tr_spec *spec = spec_with(2, types);
	tr_transforms_t *t;
	float x[12];

	spec->transforms[0].n_channels = 3;
	for (int c = 0; c < 3; c++) {
		spec->transforms[0].mean_c[c] = (float)c;
		spec->transforms[0].std_c[c] = 2.0f;
	}
	cr_assert_eq(tr_transforms_create_recorded(spec, NULL, 12, &t, &err), 0, "%s", err.message);
	for (int j = 0; j < 12; j++)
		x[j] = (float)j;
	tr_transforms_apply(t, x, 12, 1, 0, 0, 0);
	for (int j = 0; j < 12; j++)
		cr_assert_float_eq(x[j], ((float)j - (float)(j / 4)) / 2.0f, 1e-6f, "value %d: %g", j, x[j]);
	tr_transforms_destroy(t);
	cr_assert(tr_transforms_train_only(TR_TF_FLIP));
	cr_assert(tr_transforms_train_only(TR_TF_ROT90));
	cr_assert(tr_transforms_train_only(TR_TF_RANDOM_CROP));
	cr_assert_not(tr_transforms_train_only(TR_TF_NORMALIZE));
	/* Channels that do not divide the width are refused. */
	cr_assert_lt(tr_transforms_create_recorded(spec, NULL, 13, &t, &err), 0);
	expect_err("transforms/0");
	free(spec);
}

/* ---- the pixel budget (decompression bombs) ---- */

/* One PNG chunk: length, type, data, CRC over type and data. */
static size_t png_chunk(unsigned char *out, const char *type, const unsigned char *data, uint32_t len)
{
	put_be32(out, len);
	memcpy(out + 4, type, 4);
	if (len)
		memcpy(out + 8, data, len);
	put_be32(out + 8 + len, (uint32_t)crc32(0, out + 4, 4 + len));
	return 12 + len;
}

/* A PNG whose IHDR says w x h grey (8 bits), with one row of zeros of
 * image data: what a decompression bomb's header looks like, without
 * its megabytes. */
static void write_png_header_claiming(const char *name, uint32_t w, uint32_t h)
{
	unsigned char ihdr[13] = {0}, buf[512], row[64] = {0}, z[128];
	uLongf zlen = sizeof z;
	size_t n = 8;

	memcpy(buf, "\x89PNG\r\n\x1a\n", 8);
	put_be32(ihdr, w);
	put_be32(ihdr + 4, h);
	ihdr[8] = 8; /* bit depth; colour type 0 (grey), no interlace */
	n += png_chunk(buf + n, "IHDR", ihdr, sizeof ihdr);
	cr_assert_eq(compress(z, &zlen, row, sizeof row), Z_OK);
	n += png_chunk(buf + n, "IDAT", z, (uint32_t)zlen);
	n += png_chunk(buf + n, "IEND", NULL, 0);
	write_file(name, buf, n);
}

/* The JPEG `name` rewritten to claim w x h in its SOF marker. */
static void jpeg_claim(const char *name, uint16_t w, uint16_t h)
{
	FILE *f = fopen(tmp_path(name), "r+b");
	unsigned char b[4096];
	size_t n;

	cr_assert_not_null(f);
	n = fread(b, 1, sizeof b, f);
	for (size_t i = 2; i + 9 < n; i++)
		if (b[i] == 0xff && b[i + 1] == 0xc0) {
			b[i + 5] = (unsigned char)(h >> 8), b[i + 6] = (unsigned char)h;
			b[i + 7] = (unsigned char)(w >> 8), b[i + 8] = (unsigned char)w;
			cr_assert_eq(fseek(f, 0, SEEK_SET), 0);
			cr_assert_eq(fwrite(b, 1, n, f), n);
			cr_assert_eq(fclose(f), 0);
			return;
		}
	cr_assert_fail("%s: no SOF0 marker", name);
}

static int probe_file(const char *name, struct tr_image *img, bool decode)
{
	int fd = open(tmp_path(name), O_RDONLY), w, h, c;

	cr_assert_geq(fd, 0);
	memset(&err, 0, sizeof err);
	return decode ? tr_image_decode(fd, name, img, &err) : tr_image_probe(fd, name, &w, &h, &c, &err);
}

Test(images, headers_over_the_pixel_budget_are_refused_before_decoding)
{
	struct tr_image img;
	struct tr_source_spec s = images_src("bomb");

	/* 16384 x 16384 is 256 Mi pixels: over the default budget of 16 Mi,
	 * though within the old 16384-a-side limit. */
	write_png_header_claiming("bomb.png", 16384, 16384);
	for (int decode = 0; decode < 2; decode++) {
		cr_assert_eq(probe_file("bomb.png", &img, decode), -E2BIG, "%s", err.message);
		expect_err("bomb.png: image too large to decode");
		expect_err("16384x16384 is 268435456 pixels");
		expect_err("the budget is 16777216 pixels");
	}
	write_jpeg("bomb.jpg", 16, 16, 3, 0);
	jpeg_claim("bomb.jpg", 16000, 12000);
	for (int decode = 0; decode < 2; decode++) {
		cr_assert_eq(probe_file("bomb.jpg", &img, decode), -E2BIG, "%s", err.message);
		expect_err("bomb.jpg: image too large to decode: 16000x12000 is 192000000 pixels");
	}

	/* In a folder, the reader refuses at open, naming the file. */
	mkdir_in("bomb");
	mkdir_in("bomb/a");
	write_pattern("bomb/a/fine.png", 8, 8, 3, 1);
	write_png_header_claiming("bomb/a/huge.png", 8192, 8192);
	open_fail(&s);
	expect_err("bomb/a/huge.png: image too large to decode");

	/* The budget is the process's setting: a lower one refuses a small
	 * image, and the default comes back. */
	tr_image_set_max_pixels(63);
	cr_assert_eq(probe_file("bomb/a/fine.png", &img, true), -E2BIG);
	expect_err("8x8 is 64 pixels, the budget is 63 pixels");
	tr_image_set_max_pixels(0);
	cr_assert_eq(tr_image_max_pixels(), TR_IMAGE_DEFAULT_MAX_PIXELS);
	cr_assert_eq(probe_file("bomb/a/fine.png", &img, true), 0, "%s", err.message);
	cr_assert_eq(img.width * img.height * img.channels, 8 * 8 * 3);
	free(img.px);
}

/* The streaming resampler (rows top to bottom, a ring of the rows the taps
 * reach) gives tr_image_resize's result bit for bit: shrinking by large
 * and small factors, enlarging, one side only. */
Test(resize, streaming_rows_match_the_whole_image_bit_for_bit)
{
	static const int sizes[][4] = {{300, 200, 17, 23}, {64, 48, 64, 24},  {40, 30, 97, 61},
				       {9, 500, 9, 7},     {128, 96, 32, 32}, {5, 5, 3, 8}};

	for (size_t t = 0; t < sizeof sizes / sizeof sizes[0]; t++) {
		int h = sizes[t][0], w = sizes[t][1], oh = sizes[t][2], ow = sizes[t][3], c = 2;
		float *src = malloc((size_t)c * h * w * sizeof(float));
		float *whole = malloc((size_t)c * oh * ow * sizeof(float));
		float *rows = malloc((size_t)c * oh * ow * sizeof(float));
		tr_resize_stream_t *s;

		for (int i = 0; i < c * h * w; i++)
			src[i] = (float)((i * 37 + i / 7) % 251);
		cr_assert_eq(tr_image_resize(src, c, h, w, whole, oh, ow), 0);
		cr_assert_eq(tr_resize_stream_create(c, h, w, oh, ow, &s), 0, "%dx%d -> %dx%d", w, h, ow, oh);
		for (int y = 0; y < h; y++) {
			float *slot = tr_resize_stream_slot(s);

			for (int ch = 0; ch < c; ch++)
				memcpy(slot + (size_t)ch * w, src + ((size_t)ch * h + y) * w,
				       (size_t)w * sizeof(float));
			tr_resize_stream_push(s);
		}
		tr_resize_stream_finish(s, rows);
		tr_resize_stream_destroy(s);
		cr_assert_eq(memcmp(whole, rows, (size_t)c * oh * ow * sizeof(float)), 0, "%dx%d -> %dx%d differs", w,
			     h, ow, oh);
		free(src);
		free(whole);
		free(rows);
	}
}
