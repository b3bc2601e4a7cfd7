/* PUT /jobs/{id}/info: merges named short strings into a job's info
 * fields, which GET /jobs/{id} shows as "info" (the engine sets some of
 * its own: phase, epoch, the best validation loss and its step).  Keys
 * and values are checked here so that a bad one is refused with its JSON
 * pointer; the merge and the key limit are one transaction in the store
 * (storage/info.c), so concurrent writers cannot overshoot it. */
#include "api/api_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>

/* Control characters would garble logs and terminals where info is shown. */
static bool printable(const char *s)
{
	for (const unsigned char *p = (const unsigned char *)s; *p; p++)
		if (*p < 0x20 || *p == 0x7f)
			return false;
	return true;
}

void tr_api_jobs_info_put(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	tr_api_t *api = rq->api;
	struct tr_job_row row;
	json_t *body = NULL, *value;
	const char *key;
	char *text = NULL;
	char ptr[256];
	int64_t id;
	int rc;
	struct tr_error e = {0};

	if (tr_api_path_id(rq, rp, &id) < 0 || tr_api_load_job(api, rp, id, &row) < 0)
		return;
	tr_job_row_finish(&row);
	if (tr_api_body_object(rq, rp, &body) < 0)
		return;
	if (json_object_size(body) > TR_INFO_MAX_FIELDS) {
		tr_api_fail(rp, 400, "invalid_request", NULL, "at most %d info fields", TR_INFO_MAX_FIELDS);
		goto cleanup;
	}
	json_object_foreach(body, key, value) {
		size_t klen = strlen(key);

		tr_api_pointer(ptr, sizeof(ptr), "", key);
		if (klen < 1 || klen > TR_INFO_MAX_KEY || !printable(key)) {
			tr_api_fail(rp, 400, "invalid_request", ptr,
				    "%s: a key must be 1 to %d bytes without control characters", ptr, TR_INFO_MAX_KEY);
			goto cleanup;
		}
		if (!json_is_string(value)) {
			tr_api_fail(rp, 400, "invalid_request", ptr, "%s: must be a string", ptr);
			goto cleanup;
		}
		if (json_string_length(value) > TR_INFO_MAX_VALUE ||
		    strlen(json_string_value(value)) != json_string_length(value) ||
		    !printable(json_string_value(value))) {
			tr_api_fail(rp, 400, "invalid_request", ptr,
				    "%s: a value must be at most %d bytes without control characters", ptr,
				    TR_INFO_MAX_VALUE);
			goto cleanup;
		}
	}
	if (!(text = json_dumps(body, JSON_COMPACT))) {
		tr_api_fail(rp, 500, "internal", NULL, "out of memory");
		goto cleanup;
	}
	rc = tr_store_job_info_merge(api->cfg.store, id, text, TR_INFO_MAX_FIELDS, &e);
	if (rc == -E2BIG) {
		tr_api_fail(rp, 409, "conflict", NULL, "job %" PRId64 " would have more than %d info fields", id,
			    TR_INFO_MAX_FIELDS);
		goto cleanup;
	}
	if (rc == -ENOENT) {
		tr_api_fail(rp, 404, "not_found", NULL, "job %" PRId64 " not found", id);
		goto cleanup;
	}
	if (rc < 0) {
		tr_api_fail_store_err(rp, &e, "storing info fields");
		goto cleanup;
	}
	tr_api_reply_job(api, rp, 200, id);
cleanup:
	free(text);
	json_decref(body);
}
