/* The /datasets resource: uploading files into the daemon's state
 * directory, listing them with their sizes and SHA-256, and deleting them
 * (storage/datasets.h keeps the files; docs/design.md, "Datasets").
 *
 * An upload is streamed: the server hands each piece of the body to
 * tr_api_datasets_upload_data as libmicrohttpd reads it, which writes it to
 * the upload's temporary file, so a file of any size costs one buffer of
 * memory.  What can be refused before the body is refused from the
 * headers (a bad name, a declared size over the quota, a file a job
 * uses); what is found while it streams (more bytes than the quota
 * leaves, a full disk) ends the upload, deletes its temporary file and
 * answers when the body is over.  A connection that breaks midway leaves
 * nothing: tr_api_datasets_upload_cleanup runs when libmicrohttpd reports
 * the request over, and deletes what was written.
 *
 * A file that a queued, running, paused, interrupted or preempted job names
 * ("dataset:NAME/FILE" in its spec, or the file's path in the spec the
 * daemon resolved) is neither replaced nor deleted: 409.
 */
#include "api/api_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "storage/datasets.h"

/* Jobs that may still read their data: everything but the states a job
 * never leaves (a stopped job can be resumed). */
static const enum tr_job_state live_states[] = {TR_JOB_QUEUED,      TR_JOB_RUNNING, TR_JOB_STOPPING, TR_JOB_PAUSED,
						TR_JOB_INTERRUPTED, TR_JOB_STOPPED, TR_JOB_PREEMPTED};

/* ---- paths ---- */

/* The NAME (and FILE, when file is not NULL) segments of a /datasets URL
 * (MHD has percent-decoded it); -1 with 400 in rp when one is not a valid
 * name. */
static int url_names(const struct tr_api_request *rq, struct tr_api_reply *rp, char *name, char *file)
{
	const char *p = rq->url + strlen("/datasets/");
	const char *slash = strchr(p, '/');
	size_t nlen = slash ? (size_t)(slash - p) : strlen(p);
	struct tr_error why;

	if (nlen > TR_DATASET_NAME_MAX) {
		tr_api_fail(rp, 400, "invalid_parameter", NULL, "the dataset name is longer than %d characters",
			    TR_DATASET_NAME_MAX);
		return -1;
	}
	memcpy(name, p, nlen);
	name[nlen] = '\0';
	if (tr_datasets_check_name("dataset name", name, &why) < 0) {
		tr_api_fail(rp, 400, "invalid_parameter", NULL, "%s", why.message);
		return -1;
	}
	if (!file)
		return 0;
	if (!slash || strlen(slash + 1) > TR_DATASET_NAME_MAX) {
		tr_api_fail(rp, 400, "invalid_parameter", NULL, "the file name is empty or longer than %d characters",
			    TR_DATASET_NAME_MAX);
		return -1;
	}
	strcpy(file, slash + 1);
	if (tr_datasets_check_name("file name", file, &why) < 0) {
		tr_api_fail(rp, 400, "invalid_parameter", NULL, "%s", why.message);
		return -1;
	}
	return 0;
}

/* The datasets, or -1 with 404 in rp when this daemon has none. */
static tr_datasets_t *datasets_of(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	tr_datasets_t *d = rq->api->cfg.datasets;

	if (!d)
		tr_api_fail(rp, 404, "not_found", NULL, "this daemon keeps no datasets");
	return d;
}

/* ---- which jobs use a file ---- */

/* What a job's path must not be: the file (or the dataset's directory) by
 * identity, device and inode, so that every spelling of it counts
 * (`iu//train.csv`, `./iu/train.csv`, the path through the state
 * directory), and the directories above it, which a folder job (`images`,
 * `patches`) reads whole. */
#define MAX_ANCESTORS 64
struct target {
	const char *ref; /* "dataset:NAME/FILE" or "dataset:NAME/" */
	bool whole;      /* any file of the dataset */
	bool have_file;  /* file: it exists now */
	struct stat file;
	struct stat dir; /* the dataset's directory */
	struct stat up[MAX_ANCESTORS];
	int n_up; /* the directory itself and those above it */
};

static bool same_id(const struct stat *a, const struct stat *b)
{
	return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

static void target_init(struct target *t, const char *dirpath)
{
	char path[PATH_MAX];

	if (!realpath(dirpath, path))
		return;
	for (;;) {
		if (t->n_up < MAX_ANCESTORS && stat(path, &t->up[t->n_up]) == 0)
			t->n_up++;
		char *slash = strrchr(path, '/');
		if (!slash || slash == path) {
			if (strcmp(path, "/") != 0 && t->n_up < MAX_ANCESTORS && stat("/", &t->up[t->n_up]) == 0)
				t->n_up++;
			break;
		}
		*slash = '\0';
	}
}

/* Whether a string of a job's spec names the target: its dataset: text,
 * or, for an absolute path, what the path leads to now. */
static bool names_target(const char *text, const struct target *t)
{
	struct stat st;

	if (t->whole ? strncmp(text, t->ref, strlen(t->ref)) == 0 : strcmp(text, t->ref) == 0)
		return true;
	if (text[0] != '/' || stat(text, &st) < 0)
		return false;
	if (S_ISDIR(st.st_mode)) {
		for (int i = 0; i < t->n_up; i++)
			if (same_id(&st, &t->up[i]))
				return true;
		return false;
	}
	if (t->have_file && same_id(&st, &t->file))
		return true;
	if (t->whole && t->n_up > 0) {
		char parent[PATH_MAX];
		snprintf(parent, sizeof parent, "%s", text);
		char *slash = strrchr(parent, '/');
		if (slash)
			*(slash == parent ? slash + 1 : slash) = '\0';
		return slash && stat(parent, &st) == 0 && same_id(&st, &t->up[0]);
	}
	return false;
}

static bool json_names_target(const json_t *j, const struct target *t)
{
	const char *key;
	json_t *v;
	size_t i;

	if (json_is_string(j))
		return names_target(json_string_value(j), t);
	if (json_is_object(j)) {
		json_object_foreach((json_t *)j, key, v)
			if (json_names_target(v, t))
				return true;
	} else if (json_is_array(j)) {
		json_array_foreach(j, i, v)
			if (json_names_target(v, t))
				return true;
	}
	return false;
}

static bool spec_names_target(const char *text, const struct target *t)
{
	json_t *j = text ? json_loads(text, 0, NULL) : NULL;
	bool hit = j && json_names_target(j, t);

	json_decref(j);
	return hit;
}

/* 0 when no live job uses NAME/FILE (file NULL: any file of NAME); -1 with
 * 409 (or 500) in rp otherwise. */
static int check_unused(struct tr_api_request *rq, struct tr_api_reply *rp, tr_datasets_t *d, const char *name,
			const char *file)
{
	tr_store_t *store = rq->api->cfg.store;
	struct tr_job_row *rows = NULL;
	char ref[2 * TR_DATASET_NAME_MAX + 16], path[PATH_MAX];
	int count = 0, rc = -1;
	struct tr_error e = {0};
	struct target *t = calloc(1, sizeof(*t));

	if (!t) {
		tr_api_fail(rp, 500, "internal", NULL, "out of memory");
		return -1;
	}
	t->ref = ref;
	t->whole = !file;
	if (file) {
		snprintf(ref, sizeof(ref), TR_DATASET_REF_PREFIX "%s/%s", name, file);
		if (tr_datasets_path(d, name, file, path, sizeof(path)) == 0)
			t->have_file = stat(path, &t->file) == 0;
	} else {
		snprintf(ref, sizeof(ref), TR_DATASET_REF_PREFIX "%s/", name);
	}
	if (tr_datasets_path(d, name, NULL, path, sizeof(path)) == 0)
		target_init(t, path);
	if (tr_store_job_list_states(store, live_states, (int)(sizeof live_states / sizeof *live_states), &rows, &count,
				     &e) < 0) {
		tr_api_fail_store_err(rp, &e, "listing jobs");
		return -1;
	}
	rc = 0;
	for (int i = 0; i < count; i++) {
		if (spec_names_target(rows[i].spec, t) || spec_names_target(rows[i].normalized, t)) {
			tr_api_fail(rp, 409, "dataset_in_use", NULL,
				    "%s%s%s is used by job %" PRId64 " (%s); wait until it ends or cancel it", name,
				    file ? "/" : "", file ? file : "", rows[i].id, tr_job_state_name(rows[i].state));
			rc = -1;
			break;
		}
	}
	for (int i = 0; i < count; i++)
		tr_job_row_finish(&rows[i]);
	free(rows);
	free(t);
	return rc;
}

/* ---- JSON ---- */

static json_t *file_json(const struct tr_dataset_file *f)
{
	char ref[2 * TR_DATASET_NAME_MAX + 16];

	snprintf(ref, sizeof(ref), TR_DATASET_REF_PREFIX "%s/%s", f->name, f->file);
	return json_pack("{s:s, s:s, s:s, s:I, s:o, s:o}", "name", f->name, "file", f->file, "path", ref, "bytes",
			 (json_int_t)f->bytes, "sha256", f->sha256[0] ? json_string(f->sha256) : json_null(),
			 "uploaded_at", tr_api_time_json(f->modified));
}

/* ---- GET /datasets ---- */

/* Files per page: with tens of thousands of files one reply was megabytes
 * and tens of MB of memory per request. */
#define LIST_DEFAULT 1000
#define LIST_MAX 10000

/* Index of the first file after the cursor "NAME/FILE" in the sorted
 * files (the cursor itself may have been deleted since). */
static size_t page_start(const struct tr_dataset_file *files, size_t n, const char *after)
{
	const char *slash = after ? strchr(after, '/') : NULL;
	if (!slash)
		return 0;
	size_t nlen = (size_t)(slash - after), i = 0;
	for (; i < n; i++) {
		int c = strncmp(files[i].name, after, nlen);
		if (c == 0 && files[i].name[nlen])
			c = 1;
		if (c > 0 || (c == 0 && strcmp(files[i].file, slash + 1) > 0))
			break;
	}
	return i;
}

/* Bytes of every file of dataset name (on all pages): files are sorted,
 * so they run from i both ways. */
static json_int_t dataset_bytes(const struct tr_dataset_file *files, size_t n, size_t i)
{
	json_int_t sum = 0;
	size_t lo = i;
	while (lo > 0 && strcmp(files[lo - 1].name, files[i].name) == 0)
		lo--;
	for (; lo < n && strcmp(files[lo].name, files[i].name) == 0; lo++)
		sum += files[lo].bytes;
	return sum;
}

void tr_api_datasets_list(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	tr_datasets_t *d = datasets_of(rq, rp);
	struct tr_dataset_file *files = NULL;
	size_t n = 0;
	struct tr_error why;
	int64_t limit;
	const char *after = tr_api_query(rq, "after");

	if (!d || tr_api_query_int(rq, rp, "limit", 1, LIST_MAX, LIST_DEFAULT, &limit) < 0)
		return;
	if (after && !strchr(after, '/')) {
		tr_api_fail(rp, 400, "invalid_parameter", NULL,
			    "after: must be NAME/FILE, the \"next\" of the previous page");
		return;
	}
	if (tr_datasets_list(d, &files, &n, &why) < 0) {
		tr_api_fail(rp, 500, "internal", NULL, "listing datasets: %s", why.message);
		return;
	}
	size_t first = page_start(files, n, after), end = first + (size_t)limit < n ? first + (size_t)limit : n;
	json_t *list = json_array(), *cur = NULL, *cur_files = NULL;
	for (size_t i = first; i < end && list; i++) {
		if (!cur || strcmp(json_string_value(json_object_get(cur, "name")), files[i].name) != 0) {
			cur_files = json_array();
			cur = json_pack("{s:s, s:I, s:o}", "name", files[i].name, "bytes", dataset_bytes(files, n, i),
					"files", cur_files);
			if (!cur || json_array_append_new(list, cur) < 0) {
				json_decref(list);
				list = NULL;
				break;
			}
		}
		json_array_append_new(cur_files, file_json(&files[i]));
	}
	/* The cursor is the page's last file; null on the last page. */
	json_t *next = json_null();
	if (list && end < n && end > first) {
		char buf[2 * TR_DATASET_NAME_MAX + 2];
		snprintf(buf, sizeof buf, "%s/%s", files[end - 1].name, files[end - 1].file);
		next = json_string(buf);
	}
	free(files);
	if (!list) {
		json_decref(next);
		tr_api_fail(rp, 500, "internal", NULL, "the datasets cannot be rendered");
		return;
	}
	int64_t max = tr_datasets_max_bytes(d), max_files = tr_datasets_max_files(d);
	tr_api_reply_json(rp, 200,
			  json_pack("{s:o, s:o, s:I, s:o, s:I, s:o}", "datasets", list, "next", next, "used_bytes",
				    (json_int_t)tr_datasets_used_bytes(d), "max_bytes",
				    max > 0 ? json_integer(max) : json_null(), "files",
				    (json_int_t)tr_datasets_file_count(d), "max_files",
				    max_files > 0 ? json_integer(max_files) : json_null()));
}

/* ---- PUT /datasets/{name}/{file} ---- */

/* The status and code for a refused upload. */
static void fail_upload(struct tr_api_reply *rp, int rc, const char *why)
{
	switch (rc) {
	case -EINVAL:
		tr_api_fail(rp, 400, "invalid_parameter", NULL, "%s", why);
		break;
	case -EFBIG:
	case -EMFILE: /* the file-count limit */
		tr_api_fail(rp, 413, "payload_too_large", NULL, "%s", why);
		break;
	case -EPROTO:
		tr_api_fail(rp, 400, "invalid_request", NULL, "%s", why);
		break;
	case -ENOSPC:
		tr_api_fail(rp, 507, "insufficient_storage", NULL, "%s", why);
		break;
	default:
		tr_api_fail(rp, 500, "internal", NULL, "%s", why);
	}
}

int tr_api_datasets_upload_begin(struct tr_api_request *rq, struct tr_api_reply *rp, int64_t declared)
{
	tr_datasets_t *d = datasets_of(rq, rp);
	char name[TR_DATASET_NAME_MAX + 1], file[TR_DATASET_NAME_MAX + 1];
	struct tr_error why;
	tr_dataset_upload_t *up;

	if (!d || url_names(rq, rp, name, file) < 0 || check_unused(rq, rp, d, name, file) < 0)
		return -1;
	int rc = tr_datasets_upload_begin(d, name, file, declared, &up, &why);
	if (rc < 0) {
		fail_upload(rp, rc, why.message);
		return -1;
	}
	rq->upload = up;
	return 0;
}

int tr_api_datasets_upload_data(struct tr_api_request *rq, struct tr_api_reply *rp, const char *data, size_t size)
{
	struct tr_error why;
	int rc = tr_datasets_upload_write(rq->upload, data, size, &why);

	if (rc == 0)
		return 0;
	/* Nothing more is written: the partial file goes now, not when the
	 * client has finished sending. */
	tr_datasets_upload_abort(rq->upload);
	rq->upload = NULL;
	fail_upload(rp, rc, why.message);
	return -1;
}

void tr_api_datasets_upload_cleanup(struct tr_api_request *rq)
{
	tr_datasets_upload_abort(rq->upload);
	rq->upload = NULL;
}

const struct tr_api_upload_ops tr_api_datasets_upload_ops = {
	.begin = tr_api_datasets_upload_begin,
	.data = tr_api_datasets_upload_data,
	.cleanup = tr_api_datasets_upload_cleanup,
};

void tr_api_datasets_put(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	struct tr_dataset_file f;
	struct tr_error why;

	if (!rq->upload) {
		tr_api_fail(rp, 500, "internal", NULL, "the upload was not started");
		return;
	}
	tr_dataset_upload_t *up = rq->upload;
	rq->upload = NULL;
	tr_datasets_t *d = rq->api->cfg.datasets;
	char name[TR_DATASET_NAME_MAX + 1], file[TR_DATASET_NAME_MAX + 1];
	/* Checked again at the end: a job may have been submitted naming the
	 * file while it streamed in. */
	if (url_names(rq, rp, name, file) < 0 || check_unused(rq, rp, d, name, file) < 0) {
		tr_datasets_upload_abort(up);
		return;
	}
	struct tr_dataset_file old;
	bool existed = tr_datasets_stat(d, name, file, &old, NULL) == 0;
	int rc = tr_datasets_upload_commit(up, &f, &why);
	if (rc < 0) {
		fail_upload(rp, rc, why.message);
		return;
	}
	tr_api_reply_json(rp, existed ? 200 : 201, file_json(&f));
}

/* ---- DELETE /datasets/{name}[/{file}] ---- */

static void remove_common(struct tr_api_request *rq, struct tr_api_reply *rp, bool one_file)
{
	tr_datasets_t *d = datasets_of(rq, rp);
	char name[TR_DATASET_NAME_MAX + 1], file[TR_DATASET_NAME_MAX + 1];
	struct tr_error why;
	int64_t freed = 0;

	if (!d || url_names(rq, rp, name, one_file ? file : NULL) < 0 ||
	    check_unused(rq, rp, d, name, one_file ? file : NULL) < 0)
		return;
	int rc = tr_datasets_remove(d, name, one_file ? file : NULL, &freed, &why);
	if (rc == -ENOENT) {
		tr_api_fail(rp, 404, "not_found", NULL, "%s", why.message);
		return;
	}
	if (rc < 0) {
		fail_upload(rp, rc, why.message);
		return;
	}
	tr_api_reply_json(rp, 200, json_pack("{s:I}", "freed_bytes", (json_int_t)freed));
}

void tr_api_datasets_delete_file(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	remove_common(rq, rp, true);
}

void tr_api_datasets_delete(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	remove_common(rq, rp, false);
}
