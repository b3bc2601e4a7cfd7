/* The /experiments resource (docs/experiments.md): submit, list, read,
 * and pause, resume or cancel a whole experiment.  The daemon owns
 * experiments (their driver submits the trials as jobs), so every route
 * asks it through the ops table; the API parses the request and renders
 * what the daemon answers.
 */
#include "api/api_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LIST_DEFAULT 100
#define LIST_MAX 1000

static bool ops_missing(struct tr_api_reply *rp, bool present)
{
	if (present)
		return false;
	tr_api_fail_kind(rp, TR_JOB_E_UNSUPPORTED, NULL, "the daemon does not offer experiments");
	return true;
}

/* Answers with experiment `id` as the daemon shows it now. */
static void reply_experiment(tr_api_t *api, struct tr_api_reply *rp, int status, int64_t id)
{
	struct tr_error err = {0};
	json_t *exp = NULL;

	if (api->cfg.ops.experiment_get(api->cfg.ctx, id, &exp, &err) < 0) {
		tr_api_fail_op(rp, &err);
		return;
	}
	tr_api_reply_json(rp, status, exp);
}

void tr_api_experiments_submit(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	tr_api_t *api = rq->api;
	struct tr_error err = {0};
	struct tr_error_list *problems;
	int64_t priority, id = 0;
	bool preemptible = false;
	json_t *body;
	char location[64];
	int rc;

	/* The same parameters as POST /jobs: the trials are jobs
	 * (docs/experiments.md, "Priority and preemption"). */
	if (tr_api_query_queue_place(rq, rp, &priority, &preemptible) < 0)
		return;
	if (ops_missing(rp, api->cfg.ops.experiment_submit && api->cfg.ops.experiment_get))
		return;
	if (tr_api_body_object(rq, rp, &body) < 0)
		return;
	problems = calloc(1, sizeof *problems);
	rc = api->cfg.ops.experiment_submit(api->cfg.ctx, body, (int)priority, preemptible, &id, problems, &err);
	json_decref(body);
	if (rc < 0) {
		tr_api_fail_problems(rp, &err, problems);
		free(problems);
		return;
	}
	free(problems);
	reply_experiment(api, rp, 201, id);
	if (rp->status >= 300)
		return;
	snprintf(location, sizeof(location), "/experiments/%" PRId64, id);
	tr_api_reply_header(rp, MHD_HTTP_HEADER_LOCATION, location);
}

void tr_api_experiments_list(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	tr_api_t *api = rq->api;
	struct tr_error err = {0};
	const char *state = tr_api_query(rq, "state");
	int64_t limit, after, last = 0;
	json_t *list = NULL, *next;

	if (state && tr_experiment_state_parse(state) < 0) {
		tr_api_fail(rp, 400, "invalid_parameter", NULL, "state: must be one of %s", tr_experiment_state_list());
		return;
	}
	if (tr_api_query_int(rq, rp, "limit", 1, LIST_MAX, LIST_DEFAULT, &limit) < 0 ||
	    tr_api_query_int(rq, rp, "after", 0, INT64_MAX, 0, &after) < 0)
		return;
	if (ops_missing(rp, api->cfg.ops.experiment_list != NULL))
		return;
	if (api->cfg.ops.experiment_list(api->cfg.ctx, state, after, (int)limit, &list, &err) < 0) {
		tr_api_fail_op(rp, &err);
		return;
	}
	/* A full page may have more after it (as GET /jobs). */
	if (json_array_size(list) == (size_t)limit && limit > 0) {
		char buf[32];

		last = json_integer_value(json_object_get(json_array_get(list, json_array_size(list) - 1), "id"));
		snprintf(buf, sizeof(buf), "%" PRId64, last);
		next = json_string(buf);
	} else {
		next = json_null();
	}
	tr_api_reply_json(rp, 200, json_pack("{s:o, s:o}", "experiments", list, "next", next));
}

void tr_api_experiments_get(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	int64_t id;

	if (tr_api_path_id(rq, rp, &id) < 0)
		return;
	if (ops_missing(rp, rq->api->cfg.ops.experiment_get != NULL))
		return;
	reply_experiment(rq->api, rp, 200, id);
}

static void control(struct tr_api_request *rq, struct tr_api_reply *rp, enum tr_job_request op)
{
	tr_api_t *api = rq->api;
	struct tr_error err = {0};
	int64_t id;

	if (tr_api_path_id(rq, rp, &id) < 0)
		return;
	if (ops_missing(rp, api->cfg.ops.experiment_control && api->cfg.ops.experiment_get))
		return;
	if (api->cfg.ops.experiment_control(api->cfg.ctx, id, op, &err) < 0) {
		tr_api_fail_op(rp, &err);
		return;
	}
	reply_experiment(api, rp, 202, id);
}

void tr_api_experiments_pause(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	control(rq, rp, TR_JOB_PAUSE);
}

void tr_api_experiments_resume(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	control(rq, rp, TR_JOB_RESUME);
}

void tr_api_experiments_cancel(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	control(rq, rp, TR_JOB_CANCEL);
}
