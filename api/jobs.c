/* The /jobs resource: submit, list, read, control, reprioritize, delete.
 * Reads come from the store; every change goes through the daemon's ops,
 * which own the queue and the state machine, and the answer is the job as
 * the store holds it afterwards (plus live progress), so a client never
 * sees a state the daemon did not commit.
 */
#include "api/api_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PRIORITY_MIN -1000
#define PRIORITY_MAX 1000
#define LIST_DEFAULT 100
#define LIST_MAX 1000

static bool ops_missing(struct tr_api_reply *rp, bool present)
{
	if (present)
		return false;
	tr_api_fail_kind(rp, TR_JOB_E_UNSUPPORTED, NULL, "the daemon does not offer this operation");
	return true;
}

int tr_api_query_queue_place(const struct tr_api_request *rq, struct tr_api_reply *rp, int64_t *priority,
			     bool *preemptible)
{
	if (tr_api_query_int(rq, rp, "priority", PRIORITY_MIN, PRIORITY_MAX, 0, priority) < 0 ||
	    tr_api_query_bool(rq, rp, "preemptible", false, preemptible) < 0)
		return -1;
	return 0;
}

/* Printable ASCII, 1..255 characters: keys are echoed into logs and
 * compared byte for byte, so nothing invisible or multi-byte. */
static bool valid_idempotency_key(const char *key)
{
	size_t n = strlen(key);

	if (n < 1 || n > 255)
		return false;
	for (size_t i = 0; i < n; i++)
		if (key[i] < 0x20 || key[i] > 0x7e)
			return false;
	return true;
}

void tr_api_jobs_submit(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	tr_api_t *api = rq->api;
	struct tr_error err = {0};
	struct tr_api_submit req = {0};
	bool replayed = false;
	int64_t priority, id = 0;
	const char *key;
	json_t *spec;
	char location[64];
	int rc;

	if (tr_api_query_queue_place(rq, rp, &priority, &req.preemptible) < 0)
		return;
	key = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, "Idempotency-Key");
	if (key && !valid_idempotency_key(key)) {
		tr_api_fail(rp, 400, "invalid_parameter", NULL,
			    "Idempotency-Key: must be 1 to 255 printable ASCII characters");
		return;
	}
	if (ops_missing(rp, api->cfg.ops.submit != NULL))
		return;
	if (tr_api_body_object(rq, rp, &spec) < 0)
		return;
	req.spec = spec;
	req.body = rq->body ? rq->body : "";
	req.body_len = rq->body_len;
	req.idempotency_key = key;
	req.priority = (int)priority;
	/* Without memory for the list, the first problem is still told. */
	req.problems = calloc(1, sizeof *req.problems);
	rc = api->cfg.ops.submit(api->cfg.ctx, &req, &id, &replayed, &err);
	json_decref(spec);
	if (rc < 0) {
		tr_api_fail_problems(rp, &err, req.problems);
		free(req.problems);
		return;
	}
	free(req.problems);
	tr_api_reply_job(api, rp, replayed ? 200 : 201, id);
	if (rp->status >= 300)
		return;
	snprintf(location, sizeof(location), "/jobs/%" PRId64, id);
	tr_api_reply_header(rp, MHD_HTTP_HEADER_LOCATION, location);
	if (replayed)
		tr_api_reply_header(rp, "Idempotent-Replayed", "true");
}

/* The keys fields= may name: every top-level key of the job object (so
 * keys added to it later are accepted without a change here) and
 * "summary", which lists carry only when asked, as it costs store reads
 * per job. */
static bool job_key_known(const char *key, size_t len)
{
	struct tr_job_row zero = {0};
	json_t *ref = tr_api_job_json(&zero, NULL);
	const char *k;
	json_t *v;
	bool known = len == strlen("summary") && strncmp(key, "summary", len) == 0;
	/* A trial's keys, absent from a plain job (the reference above). */
	known |= (len == strlen("experiment") && strncmp(key, "experiment", len) == 0) ||
		 (len == strlen("trial") && strncmp(key, "trial", len) == 0);

	json_object_foreach(ref, k, v)
		known |= strlen(k) == len && strncmp(k, key, len) == 0;
	json_decref(ref);
	return known;
}

/* Checks fields= ("a,b,c"); -1 with 400 naming the parameter. */
static int check_fields(const char *fields, struct tr_api_reply *rp)
{
	const char *p = fields;

	for (;;) {
		size_t len = strcspn(p, ",");

		if (len == 0 || !job_key_known(p, len)) {
			tr_api_fail(rp, 400, "invalid_parameter", NULL,
				    "fields: \"%.*s\" is not a key of a job (id, name, state, priority, spec, devices, "
				    "progress, error, submitted_at, started_at, finished_at, summary, ...)",
				    (int)(len > 64 ? 64 : len), p);
			return -1;
		}
		if (!p[len])
			return 0;
		p += len + 1;
	}
}

static bool field_wanted(const char *fields, const char *key)
{
	size_t klen = strlen(key);

	for (const char *p = fields;;) {
		size_t len = strcspn(p, ",");

		if (len == klen && strncmp(p, key, len) == 0)
			return true;
		if (!p[len])
			return false;
		p += len + 1;
	}
}

/* The job as a list shows it: every key but the summary, or with fields=
 * just those named (and the id). */
static json_t *list_entry(tr_api_t *api, const struct tr_job_row *row, const json_t *live, const char *fields)
{
	json_t *job = tr_api_job_json(row, live), *out;
	const char *key;
	json_t *v;

	if (!job || !fields)
		return job;
	out = json_object();
	json_object_foreach(job, key, v)
		if (strcmp(key, "id") == 0 || field_wanted(fields, key))
			json_object_set(out, key, v);
	if (field_wanted(fields, "summary"))
		json_object_set_new(out, "summary", tr_api_job_summary(api, row, live));
	json_decref(job);
	return out;
}

void tr_api_jobs_list(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	tr_api_t *api = rq->api;
	struct tr_job_row *rows = NULL;
	const char *state = tr_api_query(rq, "state");
	const char *fields = tr_api_query(rq, "fields");
	int64_t limit, after;
	json_t *jobs, *next;
	int count = 0, rc;
	struct tr_error e = {0};
	/* Parsed once: the store takes the enum. */
	int filter = state ? tr_job_state_parse(state) : -1;
	enum tr_job_state want = filter < 0 ? TR_JOB_QUEUED : (enum tr_job_state)filter;

	if (state && filter < 0) {
		tr_api_fail(rp, 400, "invalid_parameter", NULL, "state: must be one of %s", tr_job_state_list());
		return;
	}
	if (tr_api_query_int(rq, rp, "limit", 1, LIST_MAX, LIST_DEFAULT, &limit) < 0 ||
	    tr_api_query_int(rq, rp, "after", 0, INT64_MAX, 0, &after) < 0)
		return;
	if (fields && check_fields(fields, rp) < 0)
		return;
	rc = tr_store_job_list(api->cfg.store, state ? &want : NULL, after, (int)limit, &rows, &count, &e);
	if (rc < 0) {
		tr_api_fail_store_err(rp, &e, "listing jobs");
		return;
	}
	jobs = json_array();
	for (int i = 0; i < count; i++) {
		json_t *live = NULL;

		live = tr_api_live_json(api, &rows[i]);
		json_array_append_new(jobs, list_entry(api, &rows[i], live, fields));
		json_decref(live);
	}
	/* A string, so clients in languages without 64-bit integers pass
	 * the cursor back unchanged. */
	if (count == (int)limit && count > 0) {
		char buf[32];

		snprintf(buf, sizeof(buf), "%" PRId64, rows[count - 1].id);
		next = json_string(buf);
	} else {
		next = json_null();
	}
	for (int i = 0; i < count; i++)
		tr_job_row_finish(&rows[i]);
	free(rows);
	tr_api_reply_json(rp, 200, json_pack("{s:o, s:o}", "jobs", jobs, "next", next));
}

void tr_api_jobs_get(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	int64_t id;

	if (tr_api_path_id(rq, rp, &id) < 0)
		return;
	tr_api_reply_job(rq->api, rp, 200, id);
}

/* Answers 404 for an unknown job before asking the daemon, so the
 * message is the same on every route whatever the daemon would say. */
static int job_exists(struct tr_api_request *rq, struct tr_api_reply *rp, int64_t id)
{
	struct tr_job_row row;

	if (tr_api_load_job(rq->api, rp, id, &row) < 0)
		return -1;
	tr_job_row_finish(&row);
	return 0;
}

static void control(struct tr_api_request *rq, struct tr_api_reply *rp, const struct tr_api_control *req)
{
	tr_api_t *api = rq->api;
	struct tr_error err = {0};
	int64_t id;

	if (tr_api_path_id(rq, rp, &id) < 0 || job_exists(rq, rp, id) < 0)
		return;
	if (ops_missing(rp, api->cfg.ops.control != NULL))
		return;
	if (api->cfg.ops.control(api->cfg.ctx, id, req, &err) < 0) {
		tr_api_fail_op(rp, &err);
		return;
	}
	tr_api_reply_job(api, rp, 202, id);
}

void tr_api_jobs_cancel(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	control(rq, rp, &(struct tr_api_control){.op = TR_JOB_CANCEL});
}

void tr_api_jobs_stop(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	control(rq, rp, &(struct tr_api_control){.op = TR_JOB_STOP});
}

void tr_api_jobs_pause(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	control(rq, rp, &(struct tr_api_control){.op = TR_JOB_PAUSE});
}

/* The same bounds as the spec's fields (engine/spec.h). */
#define RESUME_MAX_STEPS (INT64_C(1) << 40)
#define RESUME_MAX_EPOCHS (INT64_C(1) << 20)

/* An optional body: {} or {"max_steps": N} or {"epochs": N}, the job's
 * new end (a stopped job may be given more than its spec had). */
void tr_api_jobs_resume(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	struct tr_api_control req = {.op = TR_JOB_RESUME};
	json_t *body = NULL, *value;
	const char *key;

	if (rq->body_len > 0) {
		if (tr_api_body_object(rq, rp, &body) < 0)
			return;
		json_object_foreach(body, key, value) {
			int64_t max = strcmp(key, "epochs") == 0 ? RESUME_MAX_EPOCHS : RESUME_MAX_STEPS;
			char ptr[256];

			tr_api_pointer(ptr, sizeof(ptr), "", key);
			if (strcmp(key, "max_steps") != 0 && strcmp(key, "epochs") != 0) {
				tr_api_fail_kind(rp, TR_JOB_E_INVALID_REQUEST, ptr,
						 "%s: unknown key (a resume takes \"max_steps\" or \"epochs\")", ptr);
				goto cleanup;
			}
			if (!json_is_integer(value) || json_integer_value(value) < 1 ||
			    json_integer_value(value) > max) {
				tr_api_fail_kind(rp, TR_JOB_E_INVALID_REQUEST, ptr,
						 "%s: must be an integer in [1, %" PRId64 "]", ptr, max);
				goto cleanup;
			}
			*(strcmp(key, "epochs") == 0 ? &req.epochs : &req.max_steps) = json_integer_value(value);
		}
		if (req.epochs && req.max_steps) {
			tr_api_fail_kind(rp, TR_JOB_E_INVALID_REQUEST, "/epochs",
					 "/epochs: give either max_steps or epochs, not both");
			goto cleanup;
		}
	}
	control(rq, rp, &req);
cleanup:
	json_decref(body);
}

void tr_api_jobs_patch(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	tr_api_t *api = rq->api;
	struct tr_error err = {0};
	json_t *body = NULL, *value;
	const char *key;
	int64_t id;
	json_int_t priority;

	if (tr_api_path_id(rq, rp, &id) < 0 || job_exists(rq, rp, id) < 0)
		return;
	if (tr_api_body_object(rq, rp, &body) < 0)
		return;
	json_object_foreach(body, key, value) {
		if (strcmp(key, "priority") != 0) {
			char ptr[256];

			tr_api_pointer(ptr, sizeof(ptr), "", key);
			tr_api_fail(rp, 400, "invalid_request", ptr,
				    "unknown key \"%s\" (only \"priority\" can change)", key);
			goto cleanup;
		}
	}
	value = json_object_get(body, "priority");
	if (!value) {
		tr_api_fail(rp, 400, "invalid_request", "/priority", "priority: required");
		goto cleanup;
	}
	priority = json_is_integer(value) ? json_integer_value(value) : PRIORITY_MAX + 1;
	if (priority < PRIORITY_MIN || priority > PRIORITY_MAX) {
		tr_api_fail(rp, 400, "invalid_request", "/priority", "priority: must be an integer in [%d, %d]",
			    PRIORITY_MIN, PRIORITY_MAX);
		goto cleanup;
	}
	if (ops_missing(rp, api->cfg.ops.set_priority != NULL))
		goto cleanup;
	if (api->cfg.ops.set_priority(api->cfg.ctx, id, (int)priority, &err) < 0) {
		tr_api_fail_op(rp, &err);
		goto cleanup;
	}
	tr_api_reply_job(api, rp, 200, id);
cleanup:
	json_decref(body);
}

void tr_api_jobs_delete(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	tr_api_t *api = rq->api;
	struct tr_error err = {0};
	int64_t id;

	if (tr_api_path_id(rq, rp, &id) < 0 || job_exists(rq, rp, id) < 0)
		return;
	if (ops_missing(rp, api->cfg.ops.remove != NULL))
		return;
	if (api->cfg.ops.remove(api->cfg.ctx, id, &err) < 0) {
		tr_api_fail_op(rp, &err);
		return;
	}
	rp->status = 204;
}
