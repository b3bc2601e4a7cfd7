/* Fixtures shared by the engine's data and image tests (test_data.c,
 * test_images.c, test_trainer_images.c, test_examples_images.c): a fresh
 * mkdtemp folder for each test, paths in it, the files a test writes into
 * it itself (bytes, big-endian words, 8-bit PNG images with libpng), and
 * the reader calls those tests assert on.  Each test file declares
 *
 *   TestSuite(name, .init = fixture_setup, .fini = fixture_teardown);
 *
 * so every test starts in an empty folder that is removed after it.
 */
#ifndef TR_TEST_ENGINE_FIXTURES_H
#define TR_TEST_ENGINE_FIXTURES_H

#include <stddef.h>
#include <stdint.h>

#include "engine/data/reader.h"

extern char tmp_dir[256]; /* this test's folder */
/* The error the reader helpers below fill; cleared at setup. */
extern struct tr_error err;

/* Makes tmp_dir under $TMPDIR (else /tmp); removes it with its contents. */
void fixture_setup(void);
void fixture_teardown(void);

/* A path inside tmp_dir, valid for the next 63 calls. */
const char *tmp_path(const char *name);
void mkdir_in(const char *name);
/* Writes len bytes to tmp_path(name); returns that path. */
const char *write_file(const char *name, const void *data, size_t len);
const char *write_text(const char *name, const char *text);
/* An 8-bit PNG of w x h with `channels` (1-4) from interleaved px. */
void write_png(const char *name, int w, int h, int channels, const unsigned char *px);
void put_be32(unsigned char *p, uint32_t v);

/* tr_reader_open asserting success; asserting failure with a message in
 * err (returns the code); err's message contains needle. */
tr_reader_t *open_ok(const struct tr_source_spec *s);
int open_fail(const struct tr_source_spec *s);
void expect_err(const char *needle);

#endif
