/* Error replies.  Every failure the API reports, whether found by the
 * server (routing, limits, auth), a handler (parameters, bodies) or the
 * daemon (through struct tr_error), leaves through tr_api_fail, so
 * all of them share one shape: {"error": {"code", "message", "pointer"}}
 * with the pointer only when there is one (docs/design.md §8); a refused
 * job spec adds "errors", every problem found in it.
 */
#include "api/api_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tr_api_fail(struct tr_api_reply *rp, int status, const char *code, const char *pointer, const char *fmt, ...)
{
	char message[1024];
	json_t *error, *msg;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(message, sizeof(message), fmt, ap);
	va_end(ap);
	tr_error_utf8_trim(message);

	/* Text from elsewhere (a store message, a request parameter) may
	 * still not be UTF-8; a message that says so beats an empty body. */
	msg = json_string(message);
	if (!msg)
		msg = json_string("(message is not valid UTF-8)");
	error = json_pack("{s:s, s:o}", "code", code, "message", msg);
	if (error && pointer && *pointer) {
		json_t *ptr = json_string(pointer);

		json_object_set_new(error, "pointer", ptr ? ptr : json_string("(not valid UTF-8)"));
	}
	json_decref(rp->json);
	rp->json = error ? json_pack("{s:o}", "error", error) : NULL;
	free(rp->text);
	rp->text = NULL;
	rp->text_len = 0;
	if (rp->stream) {
		MHD_destroy_response(rp->stream);
		rp->stream = NULL;
	}
	rp->status = status;
}

/* The one table from domain errors (core/job.h) to HTTP: every refusal
 * of a job operation, whether the daemon or the API found it, gets its
 * status and code here. */
static const struct {
	int status;
	const char *code;
} job_errors[TR_JOB_NERRS] = {
	[TR_JOB_OK] = {500, "internal"}, /* an op that failed without saying why */
	[TR_JOB_E_INVALID_SPEC] = {400, "invalid_spec"},
	[TR_JOB_E_INVALID_REQUEST] = {400, "invalid_request"},
	[TR_JOB_E_INVALID_PATH] = {422, "invalid_path"},
	[TR_JOB_E_INVALID_INIT] = {422, "invalid_init"},
	[TR_JOB_E_CANNOT_FIT] = {422, "unsatisfiable"},
	[TR_JOB_E_NO_BACKEND] = {422, "backend_unavailable"},
	[TR_JOB_E_NOT_FOUND] = {404, "not_found"},
	[TR_JOB_E_ILLEGAL] = {409, "conflict"},
	[TR_JOB_E_NO_CHECKPOINT] = {409, "no_checkpoint"},
	[TR_JOB_E_CONFLICT] = {409, "idempotency_conflict"},
	[TR_JOB_E_QUEUE_FULL] = {503, "queue_full"},
	[TR_JOB_E_STORAGE] = {503, "storage_unavailable"},
	[TR_JOB_E_UNSUPPORTED] = {503, "unavailable"},
	[TR_JOB_E_INTERNAL] = {500, "internal"},
};

int tr_api_status_of(enum tr_job_err kind)
{
	return (unsigned)kind < TR_JOB_NERRS ? job_errors[kind].status : 500;
}

void tr_api_fail_op(struct tr_api_reply *rp, const struct tr_error *err)
{
	unsigned kind = (unsigned)err->kind;

	if (kind == TR_JOB_OK || kind >= TR_JOB_NERRS) {
		tr_api_fail(rp, 500, "internal", err->pointer, "%s",
			    err->message[0] ? err->message : "the daemon refused without saying why");
		return;
	}
	tr_api_fail(rp, job_errors[kind].status, job_errors[kind].code, err->pointer, "%s", err->message);
}

/* {"message", "pointer"} of one problem; the pointer left out when none. */
static json_t *problem_json(const struct tr_error *e)
{
	json_t *msg = json_string(e->message), *o;

	o = json_pack("{s:o}", "message", msg ? msg : json_string("(message is not valid UTF-8)"));
	if (o && e->pointer[0])
		json_object_set_new(o, "pointer", json_string(e->pointer));
	return o;
}

void tr_api_fail_problems(struct tr_api_reply *rp, const struct tr_error *err, const struct tr_error_list *all)
{
	json_t *list;

	tr_api_fail_op(rp, err);
	if (err->kind != TR_JOB_E_INVALID_SPEC || !rp->json || !(list = json_array()))
		return;
	/* A refusal found before the field checks (or after them: a path
	 * not in the data roots) is the one problem there is. */
	if (!all || all->n == 0)
		json_array_append_new(list, problem_json(err));
	for (int i = 0; all && i < all->n; i++)
		json_array_append_new(list, problem_json(&all->e[i]));
	json_object_set_new(rp->json, "errors", list);
}

void tr_api_fail_kind(struct tr_api_reply *rp, enum tr_job_err kind, const char *pointer, const char *fmt, ...)
{
	struct tr_error e = {.kind = (int)kind};
	va_list ap;

	snprintf(e.pointer, sizeof(e.pointer), "%s", pointer ? pointer : "");
	va_start(ap, fmt);
	vsnprintf(e.message, sizeof(e.message), fmt, ap);
	va_end(ap);
	tr_api_fail_op(rp, &e);
}

void tr_api_fail_store_err(struct tr_api_reply *rp, const struct tr_error *e, const char *what)
{
	tr_api_fail(rp, 500, "internal", NULL, "%s: %s", what, e->message[0] ? e->message : "storage error");
}
