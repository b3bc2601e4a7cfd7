/* The /jobs/{id}/checkpoints resource: the list, a request for a
 * checkpoint now, and the two downloads of one checkpoint.
 *
 * checkpoint.safetensors is the stored blob as it is (parameters,
 * optimizer state, resume position): what resuming or fine-tuning needs.
 * model.safetensors is the weights only: the checkpoint's model_header
 * followed by the parameter bytes of the blob, which the engine lays out
 * as one contiguous run so that nothing has to be rewritten
 * (storage/checkpoints.h).  Both are streamed from the store a block at a
 * time by an MHD callback response: a checkpoint may be gigabytes, and a
 * few parallel downloads must not hold copies of it in memory.  The
 * length is known up front, so clients get a Content-Length (and HEAD
 * answers with it without reading the blob).  The store's reader keeps a
 * read transaction for the whole download, so a checkpoint pruned
 * meanwhile still downloads whole.  A single byte range ("Range:
 * bytes=A-B", "bytes=A-", "bytes=-N") is answered with 206, so an
 * interrupted download resumes where it stopped; If-Range with the
 * checkpoint's ETag guards a resume against a different file under the
 * same URL (latest moved on).
 */
#include "api/api_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What one callback may hand MHD; the store reads 4 MiB chunks and keeps
 * the current one, so smaller blocks cost no extra queries. */
#define BLOCK_SIZE (256 * 1024)

/* ---- list and request ---- */

static json_t *ckpt_json(const struct tr_ckpt_row *c)
{
	return json_pack("{s:I, s:I, s:o, s:I, s:s, s:b}", "step", (json_int_t)c->step, "epoch", (json_int_t)c->epoch,
			 "created_at", tr_api_time_json(c->created_at), "bytes", (json_int_t)c->bytes, "sha256",
			 c->sha256, "best", c->best);
}

void tr_api_checkpoints_list(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	tr_api_t *api = rq->api;
	struct tr_ckpt_row *rows = NULL;
	struct tr_job_row job;
	struct tr_error e = {0};
	json_t *list;
	int64_t id;
	int count = 0;

	if (tr_api_path_id(rq, rp, &id) < 0 || tr_api_load_job(api, rp, id, &job) < 0)
		return;
	tr_job_row_finish(&job);
	if (tr_store_ckpt_list(api->cfg.store, id, &rows, &count, &e) < 0) {
		tr_api_fail_store_err(rp, &e, "listing checkpoints");
		return;
	}
	list = json_array();
	for (int i = 0; i < count && list; i++) {
		json_t *c = ckpt_json(&rows[i]);

		if (!c || json_array_append_new(list, c) < 0) {
			json_decref(list);
			list = NULL;
		}
	}
	tr_ckpt_rows_free(rows, count);
	if (!list) {
		tr_api_fail(rp, 500, "internal", NULL, "the checkpoints of job %" PRId64 " cannot be rendered", id);
		return;
	}
	tr_api_reply_json(rp, 200, json_pack("{s:o}", "checkpoints", list));
}

void tr_api_checkpoints_request(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	tr_api_t *api = rq->api;
	struct tr_error err = {0};
	struct tr_job_row job;
	int64_t id;

	/* 404 from the store first, as the control routes do, so an unknown
	 * job reads the same whatever the daemon would say. */
	if (tr_api_path_id(rq, rp, &id) < 0 || tr_api_load_job(api, rp, id, &job) < 0)
		return;
	tr_job_row_finish(&job);
	if (!api->cfg.ops.checkpoint_now) {
		tr_api_fail_kind(rp, TR_JOB_E_UNSUPPORTED, NULL, "the daemon does not offer this operation");
		return;
	}
	if (api->cfg.ops.checkpoint_now(api->cfg.ctx, id, &err) < 0) {
		tr_api_fail_op(rp, &err);
		return;
	}
	tr_api_reply_json(rp, 202, json_pack("{s:b, s:I}", "requested", 1, "job", (json_int_t)id));
}

/* ---- downloads ---- */

/* One download: an optional header from memory, then a byte range of the
 * blob. */
struct download {
	tr_ckpt_reader_t *reader;
	unsigned char *head; /* model.safetensors' header, or NULL */
	uint64_t head_len;
	uint64_t offset; /* where the file's parameter part starts in the blob */
	uint64_t skip;   /* the file offset the response starts at (a Range) */
	uint64_t total;  /* the file offset the response ends at (exclusive) */
};

static void free_download(void *cls)
{
	struct download *d = cls;

	tr_store_ckpt_close(d->reader);
	free(d->head);
	free(d);
}

static ssize_t fill(void *cls, uint64_t pos, char *out, size_t max)
{
	struct download *d = cls;
	ssize_t n;

	pos += d->skip;
	if (pos >= d->total)
		return MHD_CONTENT_READER_END_OF_STREAM;
	if (max > d->total - pos)
		max = (size_t)(d->total - pos);
	if (pos < d->head_len) {
		size_t left = (size_t)(d->head_len - pos);

		n = (ssize_t)(left < max ? left : max);
		memcpy(out, d->head + pos, (size_t)n);
		return n;
	}
	n = tr_store_ckpt_read(d->reader, d->offset + (pos - d->head_len), out, max, NULL);
	/* The reader sees the checkpoint as it was at open, so pruning
	 * cannot cut a download short; a blob shorter than its row says (a
	 * damaged store) can.  Then MHD closes the connection, and the
	 * client sees fewer bytes than Content-Length rather than a file
	 * that looks whole.  0 must not reach MHD here: it would mean
	 * "nothing yet, call again". */
	if (n <= 0)
		return MHD_CONTENT_READER_END_WITH_ERROR;
	return n;
}

/* The "{step}" path segment: a step (no sign, no leading zeros),
 * "latest" (-1) or "best" (TR_CKPT_BEST: early stopping's best
 * evaluation).  -1 with 400 in rp otherwise. */
static int path_step(const struct tr_api_request *rq, struct tr_api_reply *rp, int64_t *step)
{
	const char *text = rq->nparams > 1 ? rq->params[1] : "";

	if (strcmp(text, "latest") == 0) {
		*step = -1;
		return 0;
	}
	if (strcmp(text, "best") == 0) {
		*step = TR_CKPT_BEST;
		return 0;
	}
	if (text[0] != '-' && (text[0] != '0' || text[1] == '\0') && tr_api_parse_int(text, 0, INT64_MAX, step) == 0)
		return 0;
	tr_api_fail(rp, 400, "invalid_parameter", NULL, "step: must be an integer >= 0, \"latest\" or \"best\"");
	return -1;
}

/* Finds the checkpoint a download names; -1 with rp filled otherwise.
 * The caller finishes *row. */
static int load_ckpt(struct tr_api_request *rq, struct tr_api_reply *rp, int64_t *job_id, struct tr_ckpt_row *row)
{
	tr_api_t *api = rq->api;
	struct tr_job_row job;
	struct tr_error e = {0};
	int64_t step;
	int rc;

	memset(row, 0, sizeof(*row));
	if (tr_api_path_id(rq, rp, job_id) < 0 || tr_api_load_job(api, rp, *job_id, &job) < 0)
		return -1;
	tr_job_row_finish(&job);
	if (path_step(rq, rp, &step) < 0)
		return -1;
	rc = tr_store_ckpt_get(api->cfg.store, *job_id, step, row, &e);
	if (rc == 0)
		return 0;
	tr_ckpt_row_finish(row);
	memset(row, 0, sizeof(*row));
	if (rc != -ENOENT)
		tr_api_fail_store_err(rp, &e, "reading the checkpoint");
	else if (step == TR_CKPT_BEST)
		tr_api_fail(rp, 404, "not_found", NULL,
			    "job %" PRId64 " has no best checkpoint (it needs early_stopping and one evaluation)",
			    *job_id);
	else if (step < 0)
		tr_api_fail(rp, 404, "not_found", NULL, "job %" PRId64 " has no checkpoint", *job_id);
	else
		tr_api_fail(rp, 404, "not_found", NULL, "job %" PRId64 " has no checkpoint at step %" PRId64, *job_id,
			    step);
	return -1;
}

/* Reads a Range header against a file of size bytes: 1 with [*start,
 * *end) set for one satisfiable range, 0 to send the whole file (no
 * header, several ranges, a syntax this server does not take; RFC 9110
 * lets a server ignore Range), -1 for a range past the end (416). */
static int parse_range(const char *h, uint64_t size, uint64_t *start, uint64_t *end)
{
	int64_t a = -1, b = -1;
	const char *dash;
	char num[24];

	if (!h || strncmp(h, "bytes=", 6) != 0 || strchr(h, ','))
		return 0;
	h += 6;
	dash = strchr(h, '-');
	if (!dash || (size_t)(dash - h) >= sizeof(num))
		return 0;
	memcpy(num, h, (size_t)(dash - h));
	num[dash - h] = '\0';
	if (num[0] && tr_api_parse_int(num, 0, INT64_MAX, &a) < 0)
		return 0;
	if (dash[1] && tr_api_parse_int(dash + 1, 0, INT64_MAX, &b) < 0)
		return 0;
	if (a < 0) { /* "-N": the last N bytes */
		if (b <= 0)
			return b == 0 ? -1 : 0;
		*start = (uint64_t)b >= size ? 0 : size - (uint64_t)b;
		*end = size;
		return 1;
	}
	if (b >= 0 && b < a)
		return 0;
	if ((uint64_t)a >= size)
		return -1;
	*start = (uint64_t)a;
	*end = b >= 0 && (uint64_t)b < size ? (uint64_t)b + 1 : size;
	return 1;
}

/* Builds the streaming response over d (taken: freed on failure too),
 * the whole file or the range the request asks for. */
static void reply_download(struct tr_api_request *rq, struct tr_api_reply *rp, struct download *d, const char *filename,
			   const char *etag)
{
	struct MHD_Response *resp;
	char disposition[160], range[96];
	const char *h = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_RANGE);
	const char *if_range = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_IF_RANGE);
	uint64_t size = d->total, start = 0, end = size;
	int ranged = 0;

	/* If-Range names the file the client holds a part of; another file
	 * (or a date, which this server does not compare) gets it whole. */
	if (!if_range || (etag && strcmp(if_range, etag) == 0))
		ranged = parse_range(h, size, &start, &end);
	if (ranged < 0) {
		free_download(d);
		tr_api_fail(rp, 416, "range_not_satisfiable", NULL,
			    "the range %s starts past the end of the %" PRIu64 "-byte file", h, size);
		snprintf(range, sizeof(range), "bytes */%" PRIu64, size);
		tr_api_reply_header(rp, MHD_HTTP_HEADER_CONTENT_RANGE, range);
		return;
	}
	d->skip = start;
	d->total = end;
	resp = MHD_create_response_from_callback(end - start, BLOCK_SIZE, fill, d, free_download);
	if (!resp) {
		free_download(d);
		tr_api_fail(rp, 500, "internal", NULL, "cannot create the download");
		return;
	}
	snprintf(disposition, sizeof(disposition), "attachment; filename=\"%s\"", filename);
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/octet-stream");
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_DISPOSITION, disposition);
	if (etag)
		MHD_add_response_header(resp, MHD_HTTP_HEADER_ETAG, etag);
	MHD_add_response_header(resp, MHD_HTTP_HEADER_ACCEPT_RANGES, "bytes");
	if (ranged) {
		snprintf(range, sizeof(range), "bytes %" PRIu64 "-%" PRIu64 "/%" PRIu64, start, end - 1, size);
		MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_RANGE, range);
	}
	/* The connection keeps its idle timeout (it counts from the last
	 * byte sent, so a slow download goes on): a client that stops
	 * reading is dropped, and with it the reader's read transaction,
	 * which would otherwise keep the WAL from being recycled. */
	rp->stream = resp;
	rp->status = ranged ? 206 : 200;
}

/* Opens the blob for d; -1 with rp filled otherwise. */
static int open_blob(tr_api_t *api, struct tr_api_reply *rp, const struct tr_ckpt_row *row, struct download *d)
{
	struct tr_error e = {0};
	int rc = tr_store_ckpt_open(api->cfg.store, row->id, &d->reader, &e);

	if (rc == 0)
		return 0;
	d->reader = NULL;
	if (rc == -ENOENT) /* pruned since the lookup */
		tr_api_fail(rp, 404, "not_found", NULL, "job %" PRId64 " has no checkpoint at step %" PRId64,
			    row->job_id, row->step);
	else
		tr_api_fail_store_err(rp, &e, "opening the checkpoint");
	return -1;
}

void tr_api_checkpoints_blob(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	struct tr_ckpt_row row;
	struct download *d = NULL;
	char filename[96], etag[68];
	int64_t id;

	if (load_ckpt(rq, rp, &id, &row) < 0)
		return;
	d = calloc(1, sizeof(*d));
	if (!d) {
		tr_api_fail(rp, 500, "internal", NULL, "out of memory");
		goto cleanup;
	}
	if (open_blob(rq->api, rp, &row, d) < 0)
		goto cleanup;
	d->total = (uint64_t)row.bytes;
	snprintf(filename, sizeof(filename), "job-%" PRId64 "-step-%" PRId64 "-checkpoint.safetensors", id, row.step);
	/* The blob's SHA-256 is its identity: strong, and the same on every
	 * daemon that holds these bytes. */
	snprintf(etag, sizeof(etag), "\"%s\"", row.sha256);
	reply_download(rq, rp, d, filename, etag);
	d = NULL;
cleanup:
	if (d)
		free_download(d);
	tr_ckpt_row_finish(&row);
}

void tr_api_checkpoints_model(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	tr_api_t *api = rq->api;
	struct tr_ckpt_row row;
	struct download *d = NULL;
	void *head = NULL;
	size_t head_len = 0;
	struct tr_error e = {0};
	char filename[96];
	int64_t id;
	int rc;

	if (load_ckpt(rq, rp, &id, &row) < 0)
		return;
	/* The engine always writes a weights-only header; a row without one
	 * (or with a range outside the blob) did not come from it. */
	if (row.model_header_len <= 0 || row.params_offset < 0 || row.params_bytes < 0 ||
	    row.params_offset > row.bytes || row.params_bytes > row.bytes - row.params_offset) {
		tr_api_fail(rp, 404, "not_found", NULL,
			    "job %" PRId64 "'s checkpoint at step %" PRId64 " has no weights-only form", id, row.step);
		goto cleanup;
	}
	rc = tr_store_ckpt_model_header(api->cfg.store, row.id, &head, &head_len, &e);
	if (rc < 0) {
		if (rc == -ENOENT)
			tr_api_fail(rp, 404, "not_found", NULL, "job %" PRId64 " has no checkpoint at step %" PRId64,
				    id, row.step);
		else
			tr_api_fail_store_err(rp, &e, "reading the checkpoint's model header");
		goto cleanup;
	}
	d = calloc(1, sizeof(*d));
	if (!d) {
		free(head);
		tr_api_fail(rp, 500, "internal", NULL, "out of memory");
		goto cleanup;
	}
	d->head = head;
	d->head_len = head_len;
	if (open_blob(api, rp, &row, d) < 0)
		goto cleanup;
	d->offset = (uint64_t)row.params_offset;
	d->total = (uint64_t)head_len + (uint64_t)row.params_bytes;
	snprintf(filename, sizeof(filename), "job-%" PRId64 "-step-%" PRId64 "-model.safetensors", id, row.step);
	reply_download(rq, rp, d, filename, NULL);
	d = NULL;
cleanup:
	if (d)
		free_download(d);
	tr_ckpt_row_finish(&row);
}
