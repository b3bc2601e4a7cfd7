/* safetensors: round trip, clear errors for mismatched or damaged files,
 * and init.from loading weights into a trainer. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/safetensors.h"
#include "engine/trainer.h"

static char dir[64];

static void make_dir(void)
{
	snprintf(dir, sizeof dir, "/tmp/st-test-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
}

static void remove_dir(void)
{
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
	cr_assert_eq(system(cmd), 0);
}

TestSuite(safetensors, .init = make_dir, .fini = remove_dir);

Test(safetensors, round_trip_with_metadata)
{
	float w[6] = {1, 2, 3, 4, 5, 6.5f}, b[3] = {-1, 0, 1e-7f};
	struct tr_st_tensor ts[2] = {
		{.name = "0.weight", .ndim = 2, .shape = {3, 2}, .data = w},
		{.name = "0.bias", .ndim = 1, .shape = {3}, .data = b},
	};
	json_t *meta = json_pack("{s:s}", "step", "12");
	char path[128];
	struct tr_error err;
	snprintf(path, sizeof path, "%s/m.safetensors", dir);
	cr_assert_eq(tr_st_write(path, ts, 2, meta, &err), 0, "%s", err.message);
	json_decref(meta);

	tr_st_file_t *f;
	cr_assert_eq(tr_st_open(path, &f, &err), 0, "%s", err.message);
	cr_assert_eq(tr_st_count(f), 2);
	cr_assert_str_eq(json_string_value(json_object_get(tr_st_metadata(f), "step")), "12");
	float w2[6], b2[3];
	int64_t sw[2] = {3, 2}, sb[1] = {3};
	cr_assert_eq(tr_st_read_f32(f, "0.weight", 2, sw, w2, &err), 0, "%s", err.message);
	cr_assert_eq(tr_st_read_f32(f, "0.bias", 1, sb, b2, &err), 0, "%s", err.message);
	cr_assert_eq(memcmp(w, w2, sizeof w), 0);
	cr_assert_eq(memcmp(b, b2, sizeof b), 0);

	int64_t wrong[2] = {2, 3};
	cr_assert_eq(tr_st_read_f32(f, "0.weight", 2, wrong, w2, &err), -EINVAL);
	cr_assert_not_null(strstr(err.message, "[3, 2]"), "%s", err.message);
	cr_assert_not_null(strstr(err.message, "[2, 3]"), "%s", err.message);
	cr_assert_eq(tr_st_read_f32(f, "1.weight", 2, sw, w2, &err), -ENOENT);
	cr_assert_not_null(strstr(err.message, "1.weight"), "%s", err.message);
	tr_st_close(f);

	/* The header is padded so data starts 8-byte aligned. */
	FILE *fp = fopen(path, "rb");
	unsigned char len8[8];
	cr_assert_eq(fread(len8, 1, 8, fp), 8);
	fclose(fp);
	cr_assert_eq(len8[0] % 8, 0);
}

Test(safetensors, damaged_files_are_refused)
{
	char path[128];
	struct tr_error err;
	snprintf(path, sizeof path, "%s/bad.safetensors", dir);
	tr_st_file_t *f;
	FILE *fp = fopen(path, "wb");
	fwrite("\x05\x00", 1, 2, fp);
	fclose(fp);
	cr_assert_lt(tr_st_open(path, &f, &err), 0);
	cr_assert_not_null(strstr(err.message, path), "%s", err.message);

	/* header length larger than the file */
	fp = fopen(path, "wb");
	unsigned char len8[8] = {0xff, 0xff, 0, 0, 0, 0, 0, 0};
	fwrite(len8, 1, 8, fp);
	fwrite("{}", 1, 2, fp);
	fclose(fp);
	cr_assert_lt(tr_st_open(path, &f, &err), 0);
	cr_assert_not_null(strstr(err.message, "header length"), "%s", err.message);

	/* offsets beyond the data */
	const char *hdr = "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}";
	fp = fopen(path, "wb");
	unsigned char l2[8] = {(unsigned char)strlen(hdr), 0, 0, 0, 0, 0, 0, 0};
	fwrite(l2, 1, 8, fp);
	fwrite(hdr, 1, strlen(hdr), fp);
	fwrite("\0\0\0\0", 1, 4, fp);
	fclose(fp);
	cr_assert_lt(tr_st_open(path, &f, &err), 0);
	cr_assert_not_null(strstr(err.message, "'a'"), "%s", err.message);

	cr_assert_eq(tr_st_open("/nonexistent/x.safetensors", &f, &err), -ENOENT);
}

static const char *JOB_FMT =
	"{\"seed\": %d, \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": %d}, {\"type\": \"relu\"},"
	" {\"type\": \"dense\", \"units\": 3}]},"
	" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 40, \"features\": 4, \"classes\": 3, \"seed\": 1}},"
	" \"batch_size\": 8, \"max_steps\": %d, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}%s}";

static int train_and_save(const char *text, const char *save_path, float **params, size_t *n, struct tr_error *err)
{
	struct tr_spec spec;
	struct tr_error e;
	cr_assert_eq(tr_spec_parse_text(text, &spec, &e), 0, "%s", e.message);
	tr_backend_t *be = tr_cpu_backend_create(1, 1);
	struct tr_trainer_options opt = {.spec = &spec, .backend = be, .devices = 1};
	tr_trainer_t *t = NULL;
	int rc = tr_trainer_create(&opt, &t, err);
	if (rc == 0 && save_path)
		rc = tr_trainer_save_weights(t, save_path, err);
	if (rc == 0 && params) {
		*n = tr_trainer_model(t)->n_params;
		*params = malloc(*n * sizeof(float));
		rc = tr_trainer_copy_params(t, 0, *params);
	}
	tr_trainer_destroy(t);
	tr_backend_destroy(be);
	tr_spec_finish(&spec);
	return rc;
}

Test(safetensors, init_from_loads_weights_and_checks_shapes)
{
	char path[128];
	char text[2048];
	char init[256];
	struct tr_error err;
	snprintf(path, sizeof path, "%s/init.safetensors", dir);
	snprintf(text, sizeof text, JOB_FMT, 1, 8, 1, "");
	float *a, *b;
	size_t na, nb;
	cr_assert_eq(train_and_save(text, path, &a, &na, &err), 0, "%s", err.message);

	/* A different seed would initialise differently; init.from wins. */
	snprintf(init, sizeof init, ", \"init\": {\"from\": \"%s\"}", path);
	snprintf(text, sizeof text, JOB_FMT, 2, 8, 1, init);
	cr_assert_eq(train_and_save(text, NULL, &b, &nb, &err), 0, "%s", err.message);
	cr_assert_eq(na, nb);
	cr_assert_eq(memcmp(a, b, na * sizeof(float)), 0);
	free(a);
	free(b);

	/* Wrong width: the error names the tensor and both shapes. */
	snprintf(text, sizeof text, JOB_FMT, 2, 9, 1, init);
	cr_assert_lt(train_and_save(text, NULL, NULL, NULL, &err), 0);
	cr_assert_not_null(strstr(err.message, "0.weight"), "%s", err.message);
	cr_assert_not_null(strstr(err.message, "[8, 4]"), "%s", err.message);
	cr_assert_not_null(strstr(err.message, "[9, 4]"), "%s", err.message);
}

/* A file with one I64 tensor, as safetensors.torch.save_file writes a
 * counter (shape [] or [1], little-endian). */
static size_t i64_file(uint8_t *buf, const char *shape, int64_t value)
{
	char head[128];
	int n = snprintf(head, sizeof head, "{\"c\":{\"dtype\":\"I64\",\"shape\":%s,\"data_offsets\":[0,8]}}", shape);
	while (n % 8)
		head[n++] = ' ';
	for (int i = 0; i < 8; i++)
		buf[i] = (uint8_t)((uint64_t)n >> (8 * i));
	memcpy(buf + 8, head, (size_t)n);
	for (int i = 0; i < 8; i++)
		buf[8 + n + i] = (uint8_t)((uint64_t)value >> (8 * i));
	return 16 + (size_t)n;
}

Test(safetensors, counters_read_from_i64)
{
	uint8_t buf[256];
	const char *shapes[] = {"[]", "[1]"};
	for (int k = 0; k < 2; k++) {
		tr_st_file_t *f = NULL;
		struct tr_error err = {0};
		size_t len = i64_file(buf, shapes[k], 1364);
		cr_assert_eq(tr_st_open_mem(buf, len, "state_dict", &f, &err), 0, "%s", err.message);
		float v = -1;
		cr_assert_eq(tr_st_read_count(f, "c", &v, &err), 0, "%s", err.message);
		cr_assert_eq(v, 1364.0f);
		/* Weights stay F32 only. */
		cr_assert_eq(tr_st_read_f32(f, "c", 0, NULL, &v, &err), -EINVAL);
		tr_st_close(f);
	}
	/* A value a float cannot count exactly, or a negative one, is refused. */
	int64_t bad[] = {-1, (INT64_C(1) << 24) + 1};
	for (int k = 0; k < 2; k++) {
		tr_st_file_t *f = NULL;
		struct tr_error err = {0};
		size_t len = i64_file(buf, "[]", bad[k]);
		cr_assert_eq(tr_st_open_mem(buf, len, "state_dict", &f, &err), 0, "%s", err.message);
		float v;
		cr_assert_eq(tr_st_read_count(f, "c", &v, &err), -EINVAL);
		cr_assert(strstr(err.message, "'c'"), "%s", err.message);
		tr_st_close(f);
	}
}
