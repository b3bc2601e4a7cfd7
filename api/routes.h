/* The API's route table: every {method, path pattern, handler} the server
 * answers, in one place, so that dispatch, the 405 Allow header and the
 * test that compares the routes with openapi/openapi.yaml all read the
 * same list.  Patterns are written as in OpenAPI ("/jobs/{id}/metrics");
 * a "{name}" segment matches one non-empty path segment.
 */
#ifndef TR_API_ROUTES_H
#define TR_API_ROUTES_H

#include <stdbool.h>
#include <stddef.h>

#include "api/api.h"
#include "storage/store.h"

struct tr_api_request;
struct tr_api_reply;

/* Every handler has this shape: read the request, fill the reply. */
typedef void (*tr_api_handler_fn)(struct tr_api_request *rq, struct tr_api_reply *rp);

enum {
	/* The route reads a JSON body: Content-Type must be
	 * application/json and the body is buffered (up to max_body). */
	TR_ROUTE_JSON_BODY = 1u << 0,
	/* Answered without a bearer token. */
	TR_ROUTE_PUBLIC = 1u << 1,
	/* The body is streamed to the route's upload functions (api/datasets.c)
	 * as it arrives, of any size: max_body and the request deadline do
	 * not apply once the upload is admitted. */
	TR_ROUTE_UPLOAD = 1u << 2,
	/* With TR_ROUTE_JSON_BODY: the body may be left out, and an empty
	 * one is taken whatever its Content-Type (clients that POST nothing
	 * often send a form type). */
	TR_ROUTE_BODY_OPTIONAL = 1u << 3,
	/* A worker report route (api/report.c): the job's own report token
	 * is accepted, besides a role token with the route's role. */
	TR_ROUTE_JOB_TOKEN = 1u << 4,
};

struct tr_api_route {
	const char *method; /* "GET", "POST", "PUT", "PATCH", "DELETE" */
	const char *path;   /* OpenAPI-style pattern */
	tr_api_handler_fn handler;
	unsigned flags;
	/* The least role a token needs (every row names one). */
	enum tr_api_role role;
};

/* The role route needs (its own, or the one its method implies). */
enum tr_api_role tr_api_route_role(const struct tr_api_route *route);

/* The table (static storage) and its length. */
const struct tr_api_route *tr_api_routes(size_t *count);

/* Finds the route for method and path.  Fills params with the "{...}"
 * segments (at most max_params, each cut to param_len - 1 bytes: longer
 * ones cannot be valid ids anyway) and *nparams.  Returns NULL when none
 * matches; then *path_known tells whether another method would. */
const struct tr_api_route *tr_api_route_match(const char *method, const char *path, char (*params)[32], int max_params,
					      int *nparams, bool *path_known);
/* Writes the methods allowed on path, ", "-separated, into buf. */
void tr_api_route_allow(const char *path, char *buf, size_t len);

/* ---- handlers (one file per resource) ---- */

/* The dashboard (api/ui.c). */
void tr_api_ui_index(struct tr_api_request *rq, struct tr_api_reply *rp);
void tr_api_ui_asset(struct tr_api_request *rq, struct tr_api_reply *rp);

void tr_api_health(struct tr_api_request *rq, struct tr_api_reply *rp);
void tr_api_ready(struct tr_api_request *rq, struct tr_api_reply *rp);
void tr_api_version(struct tr_api_request *rq, struct tr_api_reply *rp);
void tr_api_devices(struct tr_api_request *rq, struct tr_api_reply *rp);
/* GET /whoami (api/whoami.c) */
void tr_api_whoami(struct tr_api_request *rq, struct tr_api_reply *rp);
void tr_api_openapi(struct tr_api_request *rq, struct tr_api_reply *rp);
/* GET /metrics (api/prometheus.c) */
void tr_api_prometheus(struct tr_api_request *rq, struct tr_api_reply *rp);
void tr_api_reload(struct tr_api_request *rq, struct tr_api_reply *rp);

void tr_api_jobs_submit(struct tr_api_request *rq, struct tr_api_reply *rp);
void tr_api_jobs_list(struct tr_api_request *rq, struct tr_api_reply *rp);
void tr_api_jobs_get(struct tr_api_request *rq, struct tr_api_reply *rp);
void tr_api_jobs_patch(struct tr_api_request *rq, struct tr_api_reply *rp);
void tr_api_jobs_delete(struct tr_api_request *rq, struct tr_api_reply *rp);
/* PUT /jobs/{id}/info (api/info.c) */
void tr_api_jobs_info_put(struct tr_api_request *rq, struct tr_api_reply *rp);
void tr_api_jobs_evaluate(struct tr_api_request *rq, struct tr_api_reply *rp);
void tr_api_jobs_cancel(struct tr_api_request *rq, struct tr_api_reply *rp);
void tr_api_experiments_submit(struct tr_api_request *rq, struct tr_api_reply *rp);
void tr_api_experiments_list(struct tr_api_request *rq, struct tr_api_reply *rp);
void tr_api_experiments_get(struct tr_api_request *rq, struct tr_api_reply *rp);
void tr_api_experiments_pause(struct tr_api_request *rq, struct tr_api_reply *rp);
void tr_api_experiments_resume(struct tr_api_request *rq, struct tr_api_reply *rp);
void tr_api_experiments_cancel(struct tr_api_request *rq, struct tr_api_reply *rp);
void tr_api_jobs_stop(struct tr_api_request *rq, struct tr_api_reply *rp);
void tr_api_jobs_pause(struct tr_api_request *rq, struct tr_api_reply *rp);
void tr_api_jobs_resume(struct tr_api_request *rq, struct tr_api_reply *rp);

void tr_api_metrics_get(struct tr_api_request *rq, struct tr_api_reply *rp);
/* Keeps the polled metrics answers of a store's jobs current as the
 * store commits (api/rcache.h, tr_rcache_refresh). */
void tr_api_metrics_cache_start(tr_store_t *store);
/* Forgets cached metrics answers of a store that is going away, and stops
 * keeping them current. */
void tr_api_metrics_cache_forget(const tr_store_t *store);
void tr_api_metrics_push(struct tr_api_request *rq, struct tr_api_reply *rp);
/* POST /jobs/{id}/report: a worker job's rank 0 reports (api/report.c). */
void tr_api_report_post(struct tr_api_request *rq, struct tr_api_reply *rp);
/* PUT /jobs/{id}/report/{file}: its final weights and checkpoint, streamed
 * into the job's folder (api/report_upload.c). */
void tr_api_report_file_put(struct tr_api_request *rq, struct tr_api_reply *rp);
/* GET /jobs/{id}/report/{file}: the checkpoint uploaded so far, for a
 * worker that resumes on another node (api/report_download.c). */
void tr_api_report_file_get(struct tr_api_request *rq, struct tr_api_reply *rp);
/* DELETE /jobs/{id}/metrics/{name}: a pushed series, whole. */
void tr_api_metrics_delete(struct tr_api_request *rq, struct tr_api_reply *rp);
void tr_api_events_stream(struct tr_api_request *rq, struct tr_api_reply *rp);
void tr_api_logs_get(struct tr_api_request *rq, struct tr_api_reply *rp);

void tr_api_checkpoints_list(struct tr_api_request *rq, struct tr_api_reply *rp);
void tr_api_checkpoints_request(struct tr_api_request *rq, struct tr_api_reply *rp);
void tr_api_checkpoints_model(struct tr_api_request *rq, struct tr_api_reply *rp);
void tr_api_checkpoints_blob(struct tr_api_request *rq, struct tr_api_reply *rp);

/* The /datasets resource (api/datasets.c).  tr_api_datasets_put runs when
 * an upload's body is complete. */
void tr_api_datasets_list(struct tr_api_request *rq, struct tr_api_reply *rp);
void tr_api_datasets_put(struct tr_api_request *rq, struct tr_api_reply *rp);
void tr_api_datasets_delete_file(struct tr_api_request *rq, struct tr_api_reply *rp);
void tr_api_datasets_delete(struct tr_api_request *rq, struct tr_api_reply *rp);

#endif
