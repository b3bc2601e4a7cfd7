/* /jobs/{id}/logs: a job's log lines, paged by line id the same way
 * GET /jobs pages by job id ("next" is the cursor to pass as ?after=, or
 * null on the last page).
 */
#include "api/api_internal.h"

#include <inttypes.h>
#include <stdio.h>

#define LOGS_DEFAULT 1000
#define LOGS_MAX 10000

void tr_api_logs_get(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	tr_api_t *api = rq->api;
	struct tr_job_row row;
	int64_t id, after, limit;
	json_t *logs, *next = NULL;
	struct tr_error e = {0};
	size_t n;

	if (tr_api_path_id(rq, rp, &id) < 0)
		return;
	if (tr_api_load_job(api, rp, id, &row) < 0)
		return;
	tr_job_row_finish(&row);
	if (tr_api_query_int(rq, rp, "after", 0, INT64_MAX, 0, &after) < 0 ||
	    tr_api_query_int(rq, rp, "limit", 1, LOGS_MAX, LOGS_DEFAULT, &limit) < 0)
		return;
	logs = tr_store_logs_query(api->cfg.store, id, after, (int)limit, &e);
	if (!logs) {
		tr_api_fail_store_err(rp, &e, "reading logs");
		return;
	}
	n = json_array_size(logs);
	if (n > 0 && n == (size_t)limit) {
		json_t *last = json_object_get(json_array_get(logs, n - 1), "id");
		char buf[32];

		if (json_is_integer(last)) {
			snprintf(buf, sizeof(buf), "%" JSON_INTEGER_FORMAT, json_integer_value(last));
			next = json_string(buf);
		}
	}
	tr_api_reply_json(rp, 200, json_pack("{s:o, s:o}", "logs", logs, "next", next ? next : json_null()));
}
