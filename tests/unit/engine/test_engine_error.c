/* Engine errors reach their caller through struct tr_error (core/error.h,
 * docs/design.md "Errors"): a reader's bad file, a model's shape and a
 * trainer's set-up check each arrive with the message a person reads and,
 * where the engine knows it, the JSON pointer into the spec.  Built against
 * the engine alone (tests/meson.build): the engine is a library that needs
 * no daemon, only core below it. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "engine/backend.h"
#include "engine/data/reader.h"
#include "engine/data/roots.h"
#include "engine/model/model.h"
#include "engine/spec.h"
#include "engine/trainer.h"

static char dir[256];

static void make_dir(void)
{
	snprintf(dir, sizeof dir, "%s/tr_engine_error_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	cr_assert_not_null(mkdtemp(dir));
}

static void remove_dir(void)
{
	char cmd[300];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	cr_assert_eq(system(cmd), 0);
}

TestSuite(engine_error, .init = make_dir, .fini = remove_dir);

/* What a caller's struct held before: every field must be replaced. */
static void stale(struct tr_error *e)
{
	e->kind = 7;
	snprintf(e->pointer, sizeof e->pointer, "/stale");
	snprintf(e->message, sizeof e->message, "stale");
}

static const char *write_text(const char *name, const char *text)
{
	static char path[400];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f);
	cr_assert_eq(fputs(text, f) >= 0, true);
	cr_assert_eq(fclose(f), 0);
	return path;
}

static void parse(const char *text, struct tr_spec *spec)
{
	struct tr_error se;
	cr_assert_eq(tr_spec_parse_text(text, spec, &se), 0, "%s: %s", se.pointer, se.message);
}

Test(engine_error, missing_data_file_is_named)
{
	char path[400];
	struct tr_error e;
	stale(&e);
	snprintf(path, sizeof path, "%s/no-such.csv", dir);
	cr_assert_eq(tr_data_open(NULL, path, NULL, NULL, 0, &e), -ENOENT);
	cr_assert_not_null(strstr(e.message, "no-such.csv"), "%s", e.message);
	cr_assert_str_eq(e.pointer, "");
	cr_assert_eq(e.kind, 0);
}

Test(engine_error, reader_bad_value_names_file_and_line)
{
	struct tr_source_spec src = {.present = true, .format = TR_DATA_CSV};
	src.path = (char *)write_text("bad.csv", "1,2,0\n3,abc,1\n");
	tr_reader_t *r = NULL;
	struct tr_error e;
	stale(&e);
	cr_assert_eq(tr_reader_open(&src, 0, NULL, NULL, &r, &e), -EINVAL);
	cr_assert_null(r);
	cr_assert_not_null(strstr(e.message, "bad.csv:2: column 2: 'abc' is not a number"), "%s", e.message);
	cr_assert_str_eq(e.pointer, "");
}

/* A layer's own check, raised in tr_model_init: the message keeps its
 * pointer prefix and the pointer travels beside it. */
Test(engine_error, model_shape_error_carries_its_pointer)
{
	struct tr_spec spec;
	parse("{\"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 4},"
	      " {\"type\": \"conv2d\", \"filters\": 2, \"kernel\": 3}], \"loss\": \"mse\"},"
	      " \"data\": {\"train\": {\"format\": \"csv\", \"path\": \"x.csv\"}},"
	      " \"batch_size\": 2, \"epochs\": 1, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}",
	      &spec);
	tr_model_t m;
	struct tr_error e;
	stale(&e);
	cr_assert_eq(tr_model_init(&m, &spec, 6, &e), -EINVAL);
	cr_assert_str_eq(e.pointer, "/model/layers/1");
	cr_assert_eq(strncmp(e.message, "/model/layers/1: conv2d takes an image [C, H, W]", 48), 0, "%s", e.message);
	tr_spec_finish(&spec);
}

/* A trainer's set-up check against the data. */
Test(engine_error, trainer_input_mismatch_carries_its_pointer)
{
	char text[1024];
	struct tr_spec spec;
	snprintf(text, sizeof text,
		 "{\"model\": {\"inputs\": 5, \"layers\": [{\"type\": \"dense\", \"units\": 1}], \"loss\": \"mse\"},"
		 " \"data\": {\"train\": {\"format\": \"csv\", \"path\": \"%s\"}},"
		 " \"batch_size\": 2, \"epochs\": 1, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}",
		 write_text("two.csv", "1,2,0\n3,4,1\n5,6,0\n"));
	parse(text, &spec);
	tr_backend_t *be = tr_cpu_backend_create(1, 1);
	struct tr_trainer_options opt = {.spec = &spec, .backend = be, .devices = 1, .workers = 1};
	tr_trainer_t *t = NULL;
	struct tr_error e;
	stale(&e);
	cr_assert_eq(tr_trainer_create(&opt, &t, &e), -EINVAL);
	cr_assert_null(t);
	cr_assert_str_eq(e.pointer, "/model/inputs");
	cr_assert_not_null(strstr(e.message, "/model/inputs: 5 does not match the 2 features of "), "%s", e.message);
	cr_assert_not_null(strstr(e.message, "two.csv"), "%s", e.message);
	tr_backend_destroy(be);
	tr_spec_finish(&spec);
}

/* A caller that does not want the message passes NULL. */
Test(engine_error, null_is_accepted)
{
	cr_assert_eq(tr_data_open(NULL, "/nonexistent/x.csv", NULL, NULL, 0, NULL), -ENOENT);
}
