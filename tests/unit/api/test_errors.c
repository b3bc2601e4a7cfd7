/* Unit tests of api/errors.c: the one table from a job operation's
 * domain error (core/job.h, enum tr_job_err) to an HTTP status and code,
 * and the error body every failure leaves with.  In-process, on a reply
 * struct: no fixture, no HTTP (tests/unit/api/test_request.c checks the
 * same shape over the wire).
 *
 * The table is indexed by kind, so a kind added to core/job.h without its
 * row here would answer status 0 with no code; the first test walks every
 * kind to catch that.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_internal.h"
#include "core/job.h"

static const char *code_of(const struct tr_api_reply *rp)
{
	return json_string_value(json_object_get(json_object_get(rp->json, "error"), "code"));
}

static const char *field_of(const struct tr_api_reply *rp, const char *key)
{
	return json_string_value(json_object_get(json_object_get(rp->json, "error"), key));
}

static void reply_finish(struct tr_api_reply *rp)
{
	json_decref(rp->json);
	free(rp->text);
	memset(rp, 0, sizeof(*rp));
}

/* Every kind a job operation can fail with has an error status, a code,
 * and a code of its own (clients branch on codes, not messages). */
Test(api_errors, every_kind_has_a_status_and_a_code_of_its_own)
{
	const char *codes[TR_JOB_NERRS] = {0};

	for (int k = TR_JOB_OK + 1; k < TR_JOB_NERRS; k++) {
		struct tr_error e = {.kind = k};
		struct tr_api_reply rp = {0};

		snprintf(e.message, sizeof(e.message), "kind %d", k);
		int status = tr_api_status_of((enum tr_job_err)k);
		cr_assert(status >= 400 && status <= 599, "kind %d answers status %d", k, status);
		tr_api_fail_op(&rp, &e);
		cr_assert_eq(rp.status, status, "kind %d: fail_op says %d, status_of %d", k, rp.status, status);
		cr_assert_not_null(code_of(&rp), "kind %d has no code", k);
		cr_assert_str_eq(field_of(&rp, "message"), e.message);
		codes[k] = strdup(code_of(&rp));
		for (int j = TR_JOB_OK + 1; j < k; j++)
			cr_assert_str_neq(codes[j], codes[k], "kinds %d and %d share the code %s", j, k, codes[k]);
		reply_finish(&rp);
	}
	for (int k = 0; k < TR_JOB_NERRS; k++)
		free((char *)codes[k]);
}

/* The statuses the API contract promises for the refusals clients act on
 * (docs/design.md, "The job"; openapi/openapi.yaml). */
Test(api_errors, refusals_answer_the_documented_statuses)
{
	static const struct {
		enum tr_job_err kind;
		int status;
		const char *code;
	} want[] = {
		{TR_JOB_E_INVALID_SPEC, 400, "invalid_spec"},     {TR_JOB_E_CANNOT_FIT, 422, "unsatisfiable"},
		{TR_JOB_E_NOT_FOUND, 404, "not_found"},           {TR_JOB_E_ILLEGAL, 409, "conflict"},
		{TR_JOB_E_CONFLICT, 409, "idempotency_conflict"}, {TR_JOB_E_QUEUE_FULL, 503, "queue_full"},
		{TR_JOB_E_STORAGE, 503, "storage_unavailable"},   {TR_JOB_E_INTERNAL, 500, "internal"},
	};

	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		struct tr_api_reply rp = {0};

		tr_api_fail_kind(&rp, want[i].kind, NULL, "why");
		cr_assert_eq(rp.status, want[i].status, "kind %d", (int)want[i].kind);
		cr_assert_str_eq(code_of(&rp), want[i].code);
		reply_finish(&rp);
	}
}

/* An op that failed without naming its kind, or with one out of range,
 * is a 500 that still carries the message. */
Test(api_errors, an_unnamed_or_unknown_kind_is_internal)
{
	struct tr_error e = {.kind = TR_JOB_OK, .message = "disk on fire"};
	struct tr_api_reply rp = {0};

	tr_api_fail_op(&rp, &e);
	cr_assert_eq(rp.status, 500);
	cr_assert_str_eq(code_of(&rp), "internal");
	cr_assert_str_eq(field_of(&rp, "message"), "disk on fire");
	reply_finish(&rp);

	e.kind = TR_JOB_NERRS + 3;
	e.message[0] = '\0';
	tr_api_fail_op(&rp, &e);
	cr_assert_eq(rp.status, 500);
	cr_assert_str_eq(code_of(&rp), "internal");
	cr_assert_str_eq(field_of(&rp, "message"), "the daemon refused without saying why");
	cr_assert_eq(tr_api_status_of(TR_JOB_NERRS + 3), 500);
	reply_finish(&rp);
}

/* The body: {"error": {"code", "message"[, "pointer"]}}, the pointer only
 * when there is one; a later failure replaces an earlier one whole. */
Test(api_errors, the_body_carries_the_pointer_only_when_set)
{
	struct tr_error e = {.kind = TR_JOB_E_INVALID_SPEC, .pointer = "/model/layers/2", .message = "bad units"};
	struct tr_api_reply rp = {0};

	tr_api_fail_op(&rp, &e);
	cr_assert_eq(rp.status, 400);
	cr_assert_str_eq(field_of(&rp, "pointer"), "/model/layers/2");
	cr_assert_eq(json_object_size(json_object_get(rp.json, "error")), 3);
	cr_assert_eq(json_object_size(rp.json), 1);

	tr_api_fail(&rp, 404, "not_found", "", "job %d not found", 7);
	cr_assert_eq(rp.status, 404);
	cr_assert_null(json_object_get(json_object_get(rp.json, "error"), "pointer"));
	cr_assert_str_eq(field_of(&rp, "message"), "job 7 not found");
	cr_assert_eq(json_object_size(json_object_get(rp.json, "error")), 2);
	reply_finish(&rp);
}

/* A message that is not UTF-8 (a store's text, a parameter) still gives
 * a body: trimmed where a cut sequence ends it, replaced where it is
 * malformed inside. */
Test(api_errors, a_message_that_is_not_utf8_still_gives_a_body)
{
	struct tr_api_reply rp = {0};

	tr_api_fail(&rp, 400, "invalid_parameter", NULL, "name %s", "caf\xc3");
	cr_assert_not_null(rp.json);
	cr_assert_str_eq(field_of(&rp, "message"), "name caf");
	tr_api_fail(&rp, 400, "invalid_parameter", "\xff", "x\xffy");
	cr_assert_not_null(rp.json);
	cr_assert_str_eq(field_of(&rp, "message"), "(message is not valid UTF-8)");
	cr_assert_str_eq(field_of(&rp, "pointer"), "(not valid UTF-8)");
	reply_finish(&rp);
}

/* A refused spec carries every problem ("errors"), the first being the
 * one "error" reports; with none listed (found before the field checks),
 * the one error is the list; other refusals have no list. */
Test(api_errors, an_invalid_spec_lists_every_problem)
{
	struct tr_error e = {.kind = TR_JOB_E_INVALID_SPEC, .pointer = "/a", .message = "/a: bad"};
	struct tr_error_list *all = calloc(1, sizeof *all);
	struct tr_api_reply rp = {0};

	cr_assert_not_null(all);
	all->e[0] = e;
	all->e[1] = (struct tr_error){.pointer = "/b/0", .message = "/b/0: worse"};
	all->e[2] = (struct tr_error){.pointer = "", .message = "no place"};
	all->n = 3;
	tr_api_fail_problems(&rp, &e, all);
	cr_assert_eq(rp.status, 400);
	cr_assert_str_eq(field_of(&rp, "pointer"), "/a");
	json_t *list = json_object_get(rp.json, "errors");
	cr_assert_eq(json_array_size(list), 3);
	cr_expect_str_eq(json_string_value(json_object_get(json_array_get(list, 1), "pointer")), "/b/0");
	cr_expect_str_eq(json_string_value(json_object_get(json_array_get(list, 1), "message")), "/b/0: worse");
	cr_expect_null(json_object_get(json_array_get(list, 2), "pointer"), "no pointer when there is none");
	reply_finish(&rp);

	all->n = 0;
	tr_api_fail_problems(&rp, &e, all);
	list = json_object_get(rp.json, "errors");
	cr_assert_eq(json_array_size(list), 1);
	cr_expect_str_eq(json_string_value(json_object_get(json_array_get(list, 0), "pointer")), "/a");
	reply_finish(&rp);

	struct tr_error fit = {.kind = TR_JOB_E_CANNOT_FIT, .pointer = "/devices", .message = "/devices: 3"};
	tr_api_fail_problems(&rp, &fit, all);
	cr_assert_eq(rp.status, 422);
	cr_expect_null(json_object_get(rp.json, "errors"));
	reply_finish(&rp);
	free(all);
}
