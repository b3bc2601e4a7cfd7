/* POST /jobs/{id}/evaluate: evaluates one of a job's checkpoints (latest,
 * best or a step) on a data source, as a short job of its own kind
 * ("kind": "evaluate").  The answer is 202 with that job (Location
 * /jobs/{new id}); once it completed, GET /jobs/{new id} holds the figures
 * under "result" (docs/model-format.md, trainerd eval's names).  The body
 * is checked by the daemon (api.h, tr_api_ops.evaluate), which owns the
 * queue. */
#include "api/api_internal.h"

#include <inttypes.h>
#include <stdio.h>

void tr_api_jobs_evaluate(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	tr_api_t *api = rq->api;
	struct tr_error err = {0};
	struct tr_job_row row;
	json_t *body = NULL;
	int64_t id, eval_id = 0;
	char location[64];

	if (tr_api_path_id(rq, rp, &id) < 0 || tr_api_load_job(api, rp, id, &row) < 0)
		return;
	tr_job_row_finish(&row);
	if (!api->cfg.ops.evaluate) {
		tr_api_fail_kind(rp, TR_JOB_E_UNSUPPORTED, NULL, "the daemon does not offer this operation");
		return;
	}
	if (tr_api_body_object(rq, rp, &body) < 0)
		return;
	int rc = api->cfg.ops.evaluate(api->cfg.ctx, id, body, &eval_id, &err);
	json_decref(body);
	if (rc < 0) {
		tr_api_fail_op(rp, &err);
		return;
	}
	tr_api_reply_job(api, rp, 202, eval_id);
	if (rp->status >= 300)
		return;
	snprintf(location, sizeof(location), "/jobs/%" PRId64, eval_id);
	tr_api_reply_header(rp, MHD_HTTP_HEADER_LOCATION, location);
}
