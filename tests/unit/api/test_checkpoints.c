/* Unit tests of api/checkpoints.c: checkpoints written through the store's real writer,
 * listed, requested, and downloaded whole and as weights only, also in
 * parallel.
 * Over real HTTP against the in-process API of tests/unit/api/fixture.h.
 */
#include <criterion/criterion.h>
#include <curl/curl.h>
#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <regex.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "api/rcache.h"
#include "api/routes.h"
#include "engine/safetensors.h"
#include "tests/unit/api/fixture.h"

TestSuite(api, .init = api_fixture_setup, .fini = api_fixture_teardown, .timeout = 60);

/* A checkpoint laid out as the engine writes one: the parameters first,
 * in one run, then an optimizer state buffer per parameter; the
 * weights-only file is the parameters alone, so its header plus the
 * blob's parameter bytes must give exactly `model`. */
struct fake_ckpt {
	uint8_t *blob, *model;
	size_t len, model_len;
	size_t model_header_len, params_offset, params_bytes;
	char sha256[65];
	float *buf;
};

static uint64_t le64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static void make_ckpt(int64_t rows, int64_t cols, int64_t step, struct fake_ckpt *c)
{
	size_t nw = (size_t)(rows * cols), nb = (size_t)rows;
	struct tr_error err = {0};
	char stepstr[32];
	json_t *meta, *model_meta;

	memset(c, 0, sizeof(*c));
	c->buf = malloc(2 * (nw + nb) * sizeof(float));
	cr_assert_not_null(c->buf);
	for (size_t i = 0; i < 2 * (nw + nb); i++)
		c->buf[i] = (float)step + (float)(i % 1000) * 0.001f;
	const float *w = c->buf, *b = w + nw, *mw = b + nb, *mb = mw + nw;
	struct tr_st_tensor ts[4] = {
		{.name = "0.weight", .ndim = 2, .shape = {rows, cols}, .data = w},
		{.name = "0.bias", .ndim = 1, .shape = {rows}, .data = b},
		{.name = "optimizer.momentum_buffer.0.weight", .ndim = 2, .shape = {rows, cols}, .data = mw},
		{.name = "optimizer.momentum_buffer.0.bias", .ndim = 1, .shape = {rows}, .data = mb},
	};

	snprintf(stepstr, sizeof(stepstr), "%" PRId64, step);
	meta = json_pack("{s:s}", "step", stepstr);
	model_meta = json_pack("{s:s, s:s}", "step", stepstr, "kind", "model");
	cr_assert_eq(tr_st_serialize(ts, 4, meta, &c->blob, &c->len, &err), 0, "%s", err.message);
	cr_assert_eq(tr_st_serialize(ts, 2, model_meta, &c->model, &c->model_len, &err), 0, "%s", err.message);
	json_decref(meta);
	json_decref(model_meta);
	c->params_offset = 8 + (size_t)le64(c->blob);
	c->model_header_len = 8 + (size_t)le64(c->model);
	c->params_bytes = (nw + nb) * sizeof(float);
	cr_assert_eq(c->model_len, c->model_header_len + c->params_bytes);
	cr_assert(!memcmp(c->blob + c->params_offset, c->model + c->model_header_len, c->params_bytes));
	tr_sha256_hex(c->blob, c->len, c->sha256);
}

static void free_ckpt(struct fake_ckpt *c)
{
	free(c->blob);
	free(c->model);
	free(c->buf);
}

/* Stores c through the real writer, in uneven pieces so the store's
 * chunking is exercised. */
static void store_ckpt(int64_t job, int64_t step, int64_t epoch, const struct fake_ckpt *c)
{
	tr_ckpt_writer_t *w = NULL;
	struct tr_ckpt_row row = {0};
	struct tr_error e = {0};
	size_t piece = 1000003;

	cr_assert_eq(tr_store_ckpt_begin(store, job, step, epoch, "{\"reason\":\"test\"}", &w, &e), 0, "begin: %s",
		     e.message);
	for (size_t off = 0; off < c->len; off += piece)
		cr_assert_eq(tr_store_ckpt_write(w, c->blob + off, c->len - off < piece ? c->len - off : piece, &e), 0,
			     "%s", e.message);
	cr_assert_eq(tr_store_ckpt_commit(w, c->model, c->model_header_len, (int64_t)c->params_offset,
					  (int64_t)c->params_bytes, 3, &row, &e),
		     0, "commit: %s", e.message);
	cr_assert_eq(row.bytes, (int64_t)c->len);
	cr_assert_str_eq(row.sha256, c->sha256);
	tr_ckpt_row_finish(&row);
}

/* What a client does with a downloaded model.safetensors: frame, header
 * JSON, offsets that cover the data exactly, and the values. */
static void check_model_file(const uint8_t *data, size_t len, const struct fake_ckpt *c, int64_t rows, int64_t cols)
{
	uint64_t n;
	json_t *h, *t;
	const char *key;
	uint64_t end = 0;
	tr_st_file_t *f = NULL;
	struct tr_error err = {0};
	float *got;

	cr_assert_geq(len, 8);
	n = le64(data);
	cr_assert_leq(n, len - 8, "header length %" PRIu64 " past the file (%zu bytes)", n, len);
	h = json_loadb((const char *)data + 8, (size_t)n, 0, NULL);
	cr_assert(json_is_object(h), "the header is not a JSON object");
	json_object_foreach(h, key, t) {
		if (!strcmp(key, "__metadata__")) {
			cr_assert_str_eq(json_string_value(json_object_get(t, "kind")), "model");
			continue;
		}
		cr_assert(strncmp(key, "optimizer.", 10), "the weights carry optimizer state: %s", key);
		cr_assert_str_eq(json_string_value(json_object_get(t, "dtype")), "F32");
		json_int_t e = json_integer_value(json_array_get(json_object_get(t, "data_offsets"), 1));

		if ((uint64_t)e > end)
			end = (uint64_t)e;
	}
	cr_assert_eq(json_object_size(h), 3, "0.weight, 0.bias and __metadata__");
	json_decref(h);
	cr_assert_eq(8 + n + end, len, "the data region is %zu bytes, the offsets cover %" PRIu64, len - 8 - n, end);

	cr_assert_eq(tr_st_open_mem(data, len, "model.safetensors", &f, &err), 0, "%s", err.message);
	got = malloc((size_t)(rows * cols) * sizeof(float));
	cr_assert_eq(tr_st_read_f32(f, "0.weight", 2, (const int64_t[]){rows, cols}, got, &err), 0, "%s", err.message);
	cr_assert(!memcmp(got, c->buf, (size_t)(rows * cols) * sizeof(float)));
	cr_assert_eq(tr_st_read_f32(f, "0.bias", 1, (const int64_t[]){rows}, got, &err), 0, "%s", err.message);
	cr_assert(!memcmp(got, c->buf + rows * cols, (size_t)rows * sizeof(float)));
	free(got);
	tr_st_close(f);
}

Test(api, checkpoint_list_and_request)
{
	int64_t id = submit("ckpt"), other = submit("other");
	struct fake_ckpt a, b;
	struct tr_test_reply r;
	json_t *list;
	regex_t rfc3339;

	r = http("GET", "/jobs/1/checkpoints", NULL);
	expect_status(&r, 200, "list without checkpoints");
	cr_assert_eq(json_array_size(json_object_get(r.json, "checkpoints")), 0);
	cr_assert_eq(json_object_size(r.json), 1);
	resp_free(&r);

	make_ckpt(4, 3, 100, &a);
	make_ckpt(4, 3, 200, &b);
	store_ckpt(id, 100, 1, &a);
	store_ckpt(id, 200, 2, &b);
	store_ckpt(other, 7, 0, &a);

	r = http("GET", "/jobs/1/checkpoints", NULL);
	expect_status(&r, 200, "list");
	list = json_object_get(r.json, "checkpoints");
	cr_assert_eq(json_array_size(list), 2, "only job 1's: %s", r.body.data);
	cr_assert_eq(regcomp(&rfc3339, "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z$",
			     REG_EXTENDED | REG_NOSUB),
		     0);
	for (size_t i = 0; i < 2; i++) {
		const json_t *c = json_array_get(list, i);
		const struct fake_ckpt *want = i == 0 ? &b : &a;

		cr_assert_eq(json_object_size(c), 6, "step, epoch, created_at, bytes, sha256, best: %s", r.body.data);
		cr_assert(json_is_false(json_object_get(c, "best")), "%s", r.body.data);
		cr_assert_eq(jint(c, "step"), i == 0 ? 200 : 100, "newest first");
		cr_assert_eq(jint(c, "epoch"), i == 0 ? 2 : 1);
		cr_assert_eq(jint(c, "bytes"), (json_int_t)want->len);
		cr_assert_str_eq(jstr(c, "sha256"), want->sha256);
		cr_assert_eq(regexec(&rfc3339, jstr(c, "created_at"), 0, NULL, 0), 0, "created_at %s",
			     jstr(c, "created_at"));
	}
	regfree(&rfc3339);
	resp_free(&r);

	/* A checkpoint on request: refused unless running, passed on then. */
	atomic_store(&checkpoint_requests, 0);
	r = http("POST", "/jobs/1/checkpoints", NULL);
	expect_status(&r, 409, "checkpoint of a queued job");
	cr_assert_str_eq(jstr(r.json, "error.code"), "conflict");
	resp_free(&r);
	cr_assert_eq(tr_store_job_set_state(store, id, TR_JOB_RUNNING, NULL, NULL, NULL), 0);
	r = http("POST", "/jobs/1/checkpoints", NULL);
	expect_status(&r, 202, "checkpoint of a running job");
	cr_assert(json_is_true(json_object_get(r.json, "requested")));
	cr_assert_eq(jint(r.json, "job"), 1);
	cr_assert_eq(json_object_size(r.json), 2);
	resp_free(&r);
	cr_assert_eq(atomic_load(&checkpoint_requests), 1);
	free_ckpt(&a);
	free_ckpt(&b);
}

Test(api, checkpoint_downloads_stream_both_files)
{
	/* Several 4 MiB store chunks, so both downloads cross chunk
	 * boundaries at offsets that are not aligned to anything. */
	const int64_t rows = 1000, cols = 1100;
	int64_t id = submit("big");
	struct fake_ckpt small, big;
	char h[256];
	char want[256];
	struct tr_test_reply r;

	make_ckpt(4, 3, 100, &small);
	make_ckpt(rows, cols, 200, &big);
	cr_assert_gt(big.len, (size_t)8 << 20);
	store_ckpt(id, 100, 0, &small);
	store_ckpt(id, 200, 1, &big);

	/* checkpoint.safetensors: the blob, byte for byte. */
	r = http("GET", "/jobs/1/checkpoints/200/checkpoint.safetensors", NULL);
	cr_assert_eq(r.status, 200, "%s", r.body.data);
	cr_assert_eq(r.body.len, big.len);
	cr_assert(!memcmp(r.body.data, big.blob, big.len));
	cr_assert_str_eq(header(&r, "Content-Type", h, sizeof(h)), "application/octet-stream");
	snprintf(want, sizeof(want), "%zu", big.len);
	cr_assert_str_eq(header(&r, "Content-Length", h, sizeof(h)), want);
	snprintf(want, sizeof(want), "\"%s\"", big.sha256);
	cr_assert_str_eq(header(&r, "ETag", h, sizeof(h)), want);
	cr_assert_str_eq(header(&r, "Content-Disposition", h, sizeof(h)),
			 "attachment; filename=\"job-1-step-200-checkpoint.safetensors\"");
	resp_free(&r);

	/* model.safetensors: the stored header, then the parameter bytes. */
	r = http("GET", "/jobs/1/checkpoints/200/model.safetensors", NULL);
	cr_assert_eq(r.status, 200, "%s", r.body.data);
	cr_assert_eq(r.body.len, big.model_len);
	cr_assert(!memcmp(r.body.data, big.model, big.model_len));
	check_model_file((const uint8_t *)r.body.data, r.body.len, &big, rows, cols);
	snprintf(want, sizeof(want), "%zu", big.model_len);
	cr_assert_str_eq(header(&r, "Content-Length", h, sizeof(h)), want);
	cr_assert_str_eq(header(&r, "Content-Type", h, sizeof(h)), "application/octet-stream");
	cr_assert_str_eq(header(&r, "Content-Disposition", h, sizeof(h)),
			 "attachment; filename=\"job-1-step-200-model.safetensors\"");
	resp_free(&r);

	/* "latest" is the newest; the file name has its real step. */
	r = http("GET", "/jobs/1/checkpoints/latest/model.safetensors", NULL);
	cr_assert_eq(r.status, 200);
	cr_assert_eq(r.body.len, big.model_len);
	cr_assert_str_eq(header(&r, "Content-Disposition", h, sizeof(h)),
			 "attachment; filename=\"job-1-step-200-model.safetensors\"");
	resp_free(&r);

	/* An older one by its step, both files. */
	r = http("GET", "/jobs/1/checkpoints/100/checkpoint.safetensors", NULL);
	cr_assert_eq(r.status, 200);
	cr_assert_eq(r.body.len, small.len);
	cr_assert(!memcmp(r.body.data, small.blob, small.len));
	resp_free(&r);
	r = http("GET", "/jobs/1/checkpoints/100/model.safetensors", NULL);
	cr_assert_eq(r.status, 200);
	cr_assert_eq(r.body.len, small.model_len);
	cr_assert(!memcmp(r.body.data, small.model, small.model_len));
	check_model_file((const uint8_t *)r.body.data, r.body.len, &small, 4, 3);
	resp_free(&r);

	/* HEAD: the same headers, no body. */
	r = http_full("HEAD", "/jobs/1/checkpoints/latest/checkpoint.safetensors", NULL, NULL, 0);
	cr_assert_eq(r.status, 200);
	cr_assert_eq(r.body.len, 0);
	snprintf(want, sizeof(want), "%zu", big.len);
	cr_assert_str_eq(header(&r, "Content-Length", h, sizeof(h)), want);
	snprintf(want, sizeof(want), "\"%s\"", big.sha256);
	cr_assert_str_eq(header(&r, "ETag", h, sizeof(h)), want);
	resp_free(&r);
	r = http_full("HEAD", "/jobs/1/checkpoints/7/model.safetensors", NULL, NULL, 0);
	cr_assert_eq(r.status, 404);
	resp_free(&r);

	r = http("GET", "/jobs/1/checkpoints/150/model.safetensors", NULL);
	expect_status(&r, 404, "a step without a checkpoint");
	cr_assert_str_eq(jstr(r.json, "error.message"), "job 1 has no checkpoint at step 150");
	resp_free(&r);

	free_ckpt(&small);
	free_ckpt(&big);
}

struct fetch {
	const char *path;
	size_t len;
	char sha256[65];
	long status;
};

static void *fetch_run(void *cls)
{
	struct fetch *f = cls;
	struct tr_test_reply r = http("GET", f->path, NULL);

	f->status = r.status;
	f->len = r.body.len;
	tr_sha256_hex(r.body.data ? r.body.data : "", r.body.len, f->sha256);
	resp_free(&r);
	return NULL;
}

Test(api, checkpoint_downloads_in_parallel)
{
	int64_t id = submit("par");
	struct fake_ckpt c;
	pthread_t t[6];
	struct fetch f[6];

	make_ckpt(600, 1000, 5, &c);
	store_ckpt(id, 5, 0, &c);
	for (int i = 0; i < 6; i++) {
		f[i] = (struct fetch){.path = i % 2 ? "/jobs/1/checkpoints/5/model.safetensors"
						    : "/jobs/1/checkpoints/latest/checkpoint.safetensors"};
		cr_assert_eq(pthread_create(&t[i], NULL, fetch_run, &f[i]), 0);
	}
	char model_sha[65];

	tr_sha256_hex(c.model, c.model_len, model_sha);
	for (int i = 0; i < 6; i++) {
		pthread_join(t[i], NULL);
		cr_assert_eq(f[i].status, 200, "%s", f[i].path);
		cr_assert_eq(f[i].len, i % 2 ? c.model_len : c.len, "%s", f[i].path);
		cr_assert_str_eq(f[i].sha256, i % 2 ? model_sha : c.sha256, "%s", f[i].path);
	}
	free_ckpt(&c);
}
