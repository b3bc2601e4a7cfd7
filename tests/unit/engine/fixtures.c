/* The engine tests' shared fixtures (fixtures.h): one temporary folder per
 * test and the files written into it, so the expected bytes sit next to
 * the assertions; the writers are deliberately independent of the reader
 * code they check.
 */
#include "tests/unit/engine/fixtures.h"

#include <criterion/criterion.h>
#include <ftw.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

char tmp_dir[256];
struct tr_error err;

void fixture_setup(void)
{
	snprintf(tmp_dir, sizeof(tmp_dir), "%s/tr_test_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	cr_assert_not_null(mkdtemp(tmp_dir));
	err.message[0] = '\0';
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(path);
}

void fixture_teardown(void)
{
	nftw(tmp_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

const char *tmp_path(const char *name)
{
	static char bufs[64][512];
	static int next;
	char *b = bufs[next++ % 64];

	snprintf(b, 512, "%s/%s", tmp_dir, name);
	return b;
}

void mkdir_in(const char *name)
{
	cr_assert_eq(mkdir(tmp_path(name), 0755), 0, "mkdir %s", name);
}

const char *write_file(const char *name, const void *data, size_t len)
{
	const char *p = tmp_path(name);
	FILE *f = fopen(p, "wb");

	cr_assert_not_null(f, "fopen %s", p);
	cr_assert_eq(fwrite(data, 1, len, f), len);
	cr_assert_eq(fclose(f), 0);
	return p;
}

const char *write_text(const char *name, const char *text)
{
	return write_file(name, text, strlen(text));
}

void write_png(const char *name, int w, int h, int channels, const unsigned char *px)
{
	static const int types[] = {0, PNG_COLOR_TYPE_GRAY, PNG_COLOR_TYPE_GRAY_ALPHA, PNG_COLOR_TYPE_RGB,
				    PNG_COLOR_TYPE_RGB_ALPHA};
	FILE *f = fopen(tmp_path(name), "wb");
	png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
	png_infop info = png_create_info_struct(png);

	cr_assert(f && png && info);
	cr_assert_eq(setjmp(png_jmpbuf(png)), 0);
	png_init_io(png, f);
	png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, 8, types[channels], PNG_INTERLACE_NONE,
		     PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
	png_write_info(png, info);
	for (int y = 0; y < h; y++)
		png_write_row(png, (png_const_bytep)(px + (size_t)y * w * channels));
	png_write_end(png, NULL);
	png_destroy_write_struct(&png, &info);
	cr_assert_eq(fclose(f), 0);
}

void put_be32(unsigned char *p, uint32_t v)
{
	p[0] = v >> 24;
	p[1] = v >> 16;
	p[2] = v >> 8;
	p[3] = v;
}

tr_reader_t *open_ok(const struct tr_source_spec *s)
{
	tr_reader_t *r = NULL;
	int ret = tr_reader_open(s, 0, NULL, NULL, &r, &err);

	cr_assert_eq(ret, 0, "open failed: %d %s", ret, err.message);
	cr_assert_not_null(r);
	return r;
}

int open_fail(const struct tr_source_spec *s)
{
	tr_reader_t *r = NULL;
	int ret;

	err.message[0] = '\0';
	ret = tr_reader_open(s, 0, NULL, NULL, &r, &err);
	cr_assert_lt(ret, 0, "open unexpectedly succeeded");
	cr_assert_null(r);
	cr_assert_neq(err.message[0], '\0', "no error message");
	return ret;
}

void expect_err(const char *needle)
{
	cr_assert_not_null(strstr(err.message, needle), "error '%s' lacks '%s'", err.message, needle);
}
