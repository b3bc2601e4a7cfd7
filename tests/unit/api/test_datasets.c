/* Unit tests of api/datasets.c: the /datasets routes over a real datasets
 * directory (storage/datasets.h): uploads answered 201 then 200 with the
 * file's size, SHA-256 and reference; the list grouped by dataset with
 * the sums and the quota; names checked in the URL (percent-decoded
 * slashes included) with 400 invalid_parameter; a file or dataset that a
 * live job names (by reference or resolved path) refused 409 for upload
 * and delete; quota refusals 413 from the declared size and while the
 * body streams, leaving nothing; a daemon without datasets answers 404.
 * Over real HTTP against the in-process API of tests/unit/api/fixture.h.
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage/datasets.h"
#include "tests/unit/api/fixture.h"

static tr_datasets_t *ds;

/* The fixture's API, restarted with a datasets directory of quota bytes
 * (0: none). */
static void with_datasets(int64_t quota)
{
	char path[PATH_MAX + 16];
	struct tr_error e = {0};
	struct start_opts o = {0};

	tr_datasets_destroy(ds);
	ds = NULL;
	snprintf(path, sizeof path, "%s/datasets-%" PRId64, dir, quota);
	cr_assert_eq(tr_datasets_create(path, quota, &ds, &e), 0, "tr_datasets_create: %s", e.message);
	o.datasets = ds;
	restart(&o);
}

static void setup(void)
{
	api_fixture_setup();
	with_datasets(0);
}

static void teardown(void)
{
	api_fixture_teardown(); /* the API first: it borrows ds */
	tr_datasets_destroy(ds);
	ds = NULL;
}

TestSuite(api, .init = setup, .fini = teardown, .timeout = 60);

static struct tr_test_reply put(const char *path, const char *data)
{
	const char *hdrs[] = {"Content-Type: application/octet-stream", NULL};

	return http_full("PUT", path, data, hdrs, 0);
}

static void expect_error(struct tr_test_reply *r, long status, const char *code, const char *in_message,
			 const char *what)
{
	expect_status(r, status, what);
	cr_assert_str_eq(jstr(r->json, "error.code"), code, "%s: %s", what, r->body.data);
	if (in_message)
		cr_assert_not_null(strstr(jstr(r->json, "error.message"), in_message), "%s: '%s' not in %s", what,
				   in_message, r->body.data);
}

static int64_t used_bytes(void)
{
	struct tr_test_reply r = http("GET", "/datasets", NULL);
	int64_t n;

	expect_status(&r, 200, "list");
	n = jint(r.json, "used_bytes");
	resp_free(&r);
	return n;
}

Test(api, upload_replace_and_list)
{
	struct tr_test_reply r;
	json_t *list, *d, *files;

	r = put("/datasets/iris/train.csv", "hello");
	expect_status(&r, 201, "first upload");
	cr_assert_str_eq(jstr(r.json, "name"), "iris");
	cr_assert_str_eq(jstr(r.json, "file"), "train.csv");
	cr_assert_str_eq(jstr(r.json, "path"), "dataset:iris/train.csv");
	cr_assert_eq(jint(r.json, "bytes"), 5);
	cr_assert_str_eq(jstr(r.json, "sha256"), "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824");
	cr_assert_not_null(jstr(r.json, "uploaded_at"), "%s", r.body.data);
	resp_free(&r);
	r = put("/datasets/iris/train.csv", "hello\n");
	expect_status(&r, 200, "a replacement is 200");
	cr_assert_eq(jint(r.json, "bytes"), 6);
	cr_assert_str_eq(jstr(r.json, "sha256"), "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03");
	resp_free(&r);
	r = put("/datasets/iris/test.csv", "abc");
	expect_status(&r, 201, "second file");
	resp_free(&r);
	r = put("/datasets/digits/all.bin", "0123456789");
	expect_status(&r, 201, "second dataset");
	resp_free(&r);

	r = http("GET", "/datasets", NULL);
	expect_status(&r, 200, "list");
	list = json_object_get(r.json, "datasets");
	cr_assert_eq(json_array_size(list), 2, "%s", r.body.data);
	d = json_array_get(list, 0);
	cr_assert_str_eq(jstr(d, "name"), "digits", "by name: %s", r.body.data);
	cr_assert_eq(jint(d, "bytes"), 10);
	d = json_array_get(list, 1);
	cr_assert_str_eq(jstr(d, "name"), "iris");
	cr_assert_eq(jint(d, "bytes"), 9, "the dataset's bytes are its files' sum: %s", r.body.data);
	files = json_object_get(d, "files");
	cr_assert_eq(json_array_size(files), 2);
	cr_assert_str_eq(jstr(json_array_get(files, 0), "file"), "test.csv");
	cr_assert_str_eq(jstr(json_array_get(files, 1), "path"), "dataset:iris/train.csv");
	cr_assert_eq(jint(r.json, "used_bytes"), 19);
	cr_assert(json_is_null(json_object_get(r.json, "max_bytes")), "no quota: null: %s", r.body.data);
	resp_free(&r);
}

Test(api, names_are_checked_in_the_url)
{
	struct tr_test_reply r;
	char path[512], longname[TR_DATASET_NAME_MAX + 2];

	r = put("/datasets/.hidden/a.csv", "x");
	expect_error(&r, 400, "invalid_parameter", "dataset name", ".hidden");
	resp_free(&r);
	r = put("/datasets/ok/.a.csv", "x");
	expect_error(&r, 400, "invalid_parameter", "file name", ".a.csv");
	resp_free(&r);
	r = put("/datasets/a%20b/f.csv", "x");
	expect_error(&r, 400, "invalid_parameter", "dataset name", "space");
	resp_free(&r);
	r = put("/datasets/ok/a%3Bb.csv", "x");
	expect_error(&r, 400, "invalid_parameter", "file name", "';'");
	resp_free(&r);
	/* A percent-encoded slash is decoded before routing: more segments
	 * than the route has, so it cannot name another directory. */
	r = put("/datasets/ok/..%2F..%2Fstate.db", "x");
	expect_error(&r, 404, "not_found", NULL, "encoded slash");
	resp_free(&r);
	memset(longname, 'n', sizeof longname - 1);
	longname[sizeof longname - 1] = '\0';
	snprintf(path, sizeof path, "/datasets/%s/f.csv", longname);
	r = put(path, "x");
	expect_error(&r, 400, "invalid_parameter", "128", "long dataset name");
	resp_free(&r);
	snprintf(path, sizeof path, "/datasets/ok/%s", longname);
	r = put(path, "x");
	expect_error(&r, 400, "invalid_parameter", "128", "long file name");
	resp_free(&r);
	snprintf(path, sizeof path, "/datasets/%s", longname);
	r = http("DELETE", path, NULL);
	expect_error(&r, 400, "invalid_parameter", "128", "delete a long name");
	resp_free(&r);
	cr_assert_eq(used_bytes(), 0, "nothing was written");
}

static int64_t submit_spec(const char *data_path)
{
	char body[1024];
	struct tr_test_reply r;
	int64_t id;

	snprintf(body, sizeof body, "{\"name\": \"uses\", \"data\": {\"train\": {\"path\": \"%s\"}}}", data_path);
	r = http("POST", "/jobs", body);
	cr_assert_eq(r.status, 201, "submit: %ld %s", r.status, r.body.data);
	id = jint(r.json, "id");
	resp_free(&r);
	return id;
}

Test(api, files_a_live_job_names_are_kept)
{
	struct tr_test_reply r;
	char abs[PATH_MAX], msg[64];
	int64_t id;

	r = put("/datasets/d/train.csv", "1,2\n");
	expect_status(&r, 201, "upload");
	resp_free(&r);
	r = put("/datasets/d/other.csv", "3,4\n");
	expect_status(&r, 201, "upload");
	resp_free(&r);
	id = submit_spec("dataset:d/train.csv");
	snprintf(msg, sizeof msg, "job %" PRId64 " (queued)", id);

	r = put("/datasets/d/train.csv", "5,6\n");
	expect_error(&r, 409, "dataset_in_use", msg, "replace a used file");
	resp_free(&r);
	r = http("DELETE", "/datasets/d/train.csv", NULL);
	expect_error(&r, 409, "dataset_in_use", msg, "delete a used file");
	resp_free(&r);
	r = http("DELETE", "/datasets/d", NULL);
	expect_error(&r, 409, "dataset_in_use", msg, "delete the dataset of a used file");
	resp_free(&r);
	/* Another file of the dataset is free. */
	r = put("/datasets/d/other.csv", "7,8\n");
	expect_status(&r, 200, "replace an unused file");
	resp_free(&r);

	/* A stopped job can be resumed: it still holds its file. */
	cr_assert_eq(tr_store_job_set_state(store, id, TR_JOB_STOPPED, NULL, NULL, NULL), 0);
	r = http("DELETE", "/datasets/d/train.csv", NULL);
	expect_error(&r, 409, "dataset_in_use", "stopped", "stopped job");
	resp_free(&r);
	/* A job that ended for good holds nothing. */
	cr_assert_eq(tr_store_job_set_state(store, id, TR_JOB_CANCELLED, NULL, NULL, NULL), 0);
	r = http("DELETE", "/datasets/d/train.csv", NULL);
	expect_status(&r, 200, "delete once the job ended");
	cr_assert_eq(jint(r.json, "freed_bytes"), 4);
	resp_free(&r);

	/* The resolved path counts as the reference does. */
	cr_assert_eq(tr_datasets_path(ds, "d", "other.csv", abs, sizeof abs), 0);
	id = submit_spec(abs);
	r = http("DELETE", "/datasets/d/other.csv", NULL);
	expect_error(&r, 409, "dataset_in_use", "other.csv", "resolved path");
	resp_free(&r);
	cr_assert_eq(tr_store_job_set_state(store, id, TR_JOB_FAILED, NULL, NULL, NULL), 0);

	/* A dataset whose name starts like another's is not held by it. */
	r = put("/datasets/dd/x.csv", "9\n");
	expect_status(&r, 201, "upload dd");
	resp_free(&r);
	submit_spec("dataset:dd/x.csv");
	r = http("DELETE", "/datasets/d", NULL);
	expect_status(&r, 200, "delete d while dd is used");
	cr_assert_eq(jint(r.json, "freed_bytes"), 4);
	resp_free(&r);
	r = http("DELETE", "/datasets/dd", NULL);
	expect_error(&r, 409, "dataset_in_use", "dd", "dd is used");
	resp_free(&r);
}

Test(api, delete_unknown_is_404)
{
	struct tr_test_reply r = http("DELETE", "/datasets/none", NULL);

	expect_error(&r, 404, "not_found", NULL, "unknown dataset");
	resp_free(&r);
	r = put("/datasets/some/a.csv", "x");
	expect_status(&r, 201, "upload");
	resp_free(&r);
	r = http("DELETE", "/datasets/some/b.csv", NULL);
	expect_error(&r, 404, "not_found", NULL, "unknown file");
	resp_free(&r);
}

Test(api, quota_from_the_declared_size_and_while_streaming)
{
	struct tr_test_reply r;
	const char *hdrs[] = {"Content-Type: application/octet-stream", NULL};

	with_datasets(10);
	r = http("GET", "/datasets", NULL);
	expect_status(&r, 200, "list");
	cr_assert_eq(jint(r.json, "max_bytes"), 10, "%s", r.body.data);
	resp_free(&r);
	r = put("/datasets/q/big.bin", "0123456789a");
	expect_error(&r, 413, "payload_too_large", NULL, "declared past the quota");
	resp_free(&r);
	/* Chunked: no size up front, refused once the bytes pass the quota. */
	r = http_full("PUT", "/datasets/q/chunked.bin", NULL, hdrs, 64);
	expect_error(&r, 413, "payload_too_large", NULL, "streamed past the quota");
	resp_free(&r);
	cr_assert_eq(used_bytes(), 0, "no partial file is kept");
	r = put("/datasets/q/fits.bin", "0123456789");
	expect_status(&r, 201, "exactly the quota");
	resp_free(&r);
	r = put("/datasets/q/more.bin", "x");
	expect_error(&r, 413, "payload_too_large", NULL, "the quota is used up");
	resp_free(&r);
	cr_assert_eq(used_bytes(), 10);
}

Test(api, without_datasets_the_routes_are_404)
{
	struct start_opts o = {0};
	struct tr_test_reply r;

	restart(&o);
	r = http("GET", "/datasets", NULL);
	expect_error(&r, 404, "not_found", "no datasets", "list");
	resp_free(&r);
	r = put("/datasets/a/b.csv", "x");
	expect_error(&r, 404, "not_found", "no datasets", "upload");
	resp_free(&r);
	r = http("DELETE", "/datasets/a", NULL);
	expect_error(&r, 404, "not_found", "no datasets", "delete");
	resp_free(&r);
}
