/* The route table and path matching.  The table is the only list of what
 * the API serves (docs/design.md, API); a unit test checks it against
 * openapi/openapi.yaml, so a route added here without the spec, or the
 * other way round, fails the build's tests.
 */
#include "api/routes.h"

#include <stdio.h>
#include <string.h>

/* More "{...}" segments than any pattern has. */
#define MAX_PARAMS 8

/* The role column (docs/design.md, API): read for everything that only
 * looks, write for submitting and controlling jobs, pushing (and deleting
 * pushed) metrics, uploading datasets and submitting and controlling
 * experiments, admin for deleting (jobs, datasets) and reloading. */
static const struct tr_api_route routes[] = {
	{"GET", "/", tr_api_ui_index, TR_ROUTE_PUBLIC, TR_ROLE_READ},
	{"GET", "/ui/{asset}", tr_api_ui_asset, TR_ROUTE_PUBLIC, TR_ROLE_READ},
	{"GET", "/healthz", tr_api_health, TR_ROUTE_PUBLIC, TR_ROLE_READ},
	{"GET", "/readyz", tr_api_ready, 0, TR_ROLE_READ},
	{"GET", "/version", tr_api_version, 0, TR_ROLE_READ},
	{"GET", "/devices", tr_api_devices, 0, TR_ROLE_READ},
	{"GET", "/whoami", tr_api_whoami, 0, TR_ROLE_READ},
	{"GET", "/openapi.yaml", tr_api_openapi, 0, TR_ROLE_READ},
	{"POST", "/reload", tr_api_reload, 0, TR_ROLE_ADMIN},
	{"GET", "/metrics", tr_api_prometheus, 0, TR_ROLE_READ},
	{"POST", "/jobs", tr_api_jobs_submit, TR_ROUTE_JSON_BODY, TR_ROLE_WRITE},
	{"GET", "/jobs", tr_api_jobs_list, 0, TR_ROLE_READ},
	{"GET", "/jobs/{id}", tr_api_jobs_get, 0, TR_ROLE_READ},
	{"PATCH", "/jobs/{id}", tr_api_jobs_patch, TR_ROUTE_JSON_BODY, TR_ROLE_WRITE},
	{"DELETE", "/jobs/{id}", tr_api_jobs_delete, 0, TR_ROLE_ADMIN},
	{"PUT", "/jobs/{id}/info", tr_api_jobs_info_put, TR_ROUTE_JSON_BODY, TR_ROLE_WRITE},
	{"POST", "/jobs/{id}/cancel", tr_api_jobs_cancel, 0, TR_ROLE_WRITE},
	{"POST", "/jobs/{id}/stop", tr_api_jobs_stop, 0, TR_ROLE_WRITE},
	{"POST", "/jobs/{id}/pause", tr_api_jobs_pause, 0, TR_ROLE_WRITE},
	{"POST", "/jobs/{id}/resume", tr_api_jobs_resume, TR_ROUTE_JSON_BODY | TR_ROUTE_BODY_OPTIONAL, TR_ROLE_WRITE},
	{"POST", "/jobs/{id}/evaluate", tr_api_jobs_evaluate, TR_ROUTE_JSON_BODY, TR_ROLE_WRITE},
	{"GET", "/jobs/{id}/metrics", tr_api_metrics_get, 0, TR_ROLE_READ},
	{"POST", "/jobs/{id}/metrics", tr_api_metrics_push, TR_ROUTE_JSON_BODY, TR_ROLE_WRITE},
	{"DELETE", "/jobs/{id}/metrics/{name}", tr_api_metrics_delete, 0, TR_ROLE_WRITE},
	{"POST", "/jobs/{id}/report", tr_api_report_post, TR_ROUTE_JSON_BODY | TR_ROUTE_JOB_TOKEN, TR_ROLE_WRITE},
	{"PUT", "/jobs/{id}/report/{file}", tr_api_report_file_put, TR_ROUTE_UPLOAD | TR_ROUTE_JOB_TOKEN,
	 TR_ROLE_WRITE},
	{"GET", "/jobs/{id}/report/{file}", tr_api_report_file_get, TR_ROUTE_JOB_TOKEN, TR_ROLE_READ},
	{"GET", "/jobs/{id}/events", tr_api_events_stream, 0, TR_ROLE_READ},
	{"GET", "/jobs/{id}/logs", tr_api_logs_get, 0, TR_ROLE_READ},
	{"GET", "/jobs/{id}/checkpoints", tr_api_checkpoints_list, 0, TR_ROLE_READ},
	{"POST", "/jobs/{id}/checkpoints", tr_api_checkpoints_request, 0, TR_ROLE_WRITE},
	{"GET", "/jobs/{id}/checkpoints/{step}/model.safetensors", tr_api_checkpoints_model, 0, TR_ROLE_READ},
	{"GET", "/jobs/{id}/checkpoints/{step}/checkpoint.safetensors", tr_api_checkpoints_blob, 0, TR_ROLE_READ},
	{"POST", "/experiments", tr_api_experiments_submit, TR_ROUTE_JSON_BODY, TR_ROLE_WRITE},
	{"GET", "/experiments", tr_api_experiments_list, 0, TR_ROLE_READ},
	{"GET", "/experiments/{id}", tr_api_experiments_get, 0, TR_ROLE_READ},
	{"POST", "/experiments/{id}/pause", tr_api_experiments_pause, 0, TR_ROLE_WRITE},
	{"POST", "/experiments/{id}/resume", tr_api_experiments_resume, 0, TR_ROLE_WRITE},
	{"POST", "/experiments/{id}/cancel", tr_api_experiments_cancel, 0, TR_ROLE_WRITE},
	{"GET", "/datasets", tr_api_datasets_list, 0, TR_ROLE_READ},
	{"PUT", "/datasets/{name}/{file}", tr_api_datasets_put, TR_ROUTE_UPLOAD, TR_ROLE_WRITE},
	{"DELETE", "/datasets/{name}/{file}", tr_api_datasets_delete_file, 0, TR_ROLE_ADMIN},
	{"DELETE", "/datasets/{name}", tr_api_datasets_delete, 0, TR_ROLE_ADMIN},
};

const struct tr_api_route *tr_api_routes(size_t *count)
{
	*count = sizeof(routes) / sizeof(routes[0]);
	return routes;
}

enum tr_api_role tr_api_route_role(const struct tr_api_route *route)
{
	/* A row without a role is a mistake; it fails closed. */
	return route->role != TR_ROLE_NONE ? route->role : TR_ROLE_ADMIN;
}

/* Matches path against one pattern segment by segment.  Captured
 * parameters go to params when it is not NULL. */
static bool path_matches(const char *pattern, const char *path, char (*params)[32], int max_params, int *nparams)
{
	const char *p = pattern, *s = path;
	int n = 0;

	while (*p && *s) {
		if (*p != '/' || *s != '/')
			return false;
		p++;
		s++;
		size_t plen = strcspn(p, "/"), slen = strcspn(s, "/");

		if (plen >= 2 && p[0] == '{' && p[plen - 1] == '}') {
			if (slen == 0 || n >= max_params)
				return false;
			if (params) {
				size_t keep = slen < 31 ? slen : 31;

				memcpy(params[n], s, keep);
				params[n][keep] = '\0';
			}
			n++;
		} else if (plen != slen || memcmp(p, s, plen) != 0) {
			return false;
		}
		p += plen;
		s += slen;
	}
	if (*p || *s)
		return false;
	if (nparams)
		*nparams = n;
	return true;
}

const struct tr_api_route *tr_api_route_match(const char *method, const char *path, char (*params)[32], int max_params,
					      int *nparams, bool *path_known)
{
	*path_known = false;
	for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
		if (!path_matches(routes[i].path, path, NULL, max_params, NULL))
			continue;
		*path_known = true;
		if (strcmp(routes[i].method, method) == 0) {
			path_matches(routes[i].path, path, params, max_params, nparams);
			return &routes[i];
		}
	}
	return NULL;
}

void tr_api_route_allow(const char *path, char *buf, size_t len)
{
	size_t used = 0;

	if (len == 0)
		return;
	buf[0] = '\0';
	for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
		if (!path_matches(routes[i].path, path, NULL, MAX_PARAMS, NULL))
			continue;
		int n = snprintf(buf + used, len - used, "%s%s", used ? ", " : "", routes[i].method);

		if (n < 0 || (size_t)n >= len - used)
			break;
		used += (size_t)n;
	}
}
