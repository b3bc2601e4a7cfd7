/* GET /jobs/{id}/report/checkpoint.safetensors (docs/design.md, "Worker
 * reports"): a worker job's rank 0, starting again after a requeue on a
 * node that does not mount the daemon's folder, fetches the checkpoint it
 * (or its earlier start) uploaded into the job's folder, and resumes from
 * it.  Authenticated as the report routes (api/report.c): the job's own
 * token, which is another job's 403, or a role token with the read role.
 * 404 while the folder holds no checkpoint: the worker then starts from
 * the beginning. */
#include "api/api_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void tr_api_report_file_get(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	tr_api_t *api = rq->api;
	const char *file = rq->params[1];
	struct tr_error err = {0};
	char dir[PATH_MAX - 64], path[PATH_MAX];
	int64_t id;
	if (tr_api_path_id(rq, rp, &id) < 0)
		return;
	if (strcmp(file, "checkpoint.safetensors") != 0) {
		tr_api_fail(rp, 400, "invalid_parameter", NULL, "file: must be checkpoint.safetensors, not \"%s\"",
			    file);
		return;
	}
	if (!api->cfg.ops.report_folder) {
		tr_api_fail(rp, 503, "unavailable", NULL, "this daemon takes no worker reports");
		return;
	}
	if (api->cfg.ops.report_folder(api->cfg.ctx, id, dir, sizeof dir, &err) < 0) {
		tr_api_fail_op(rp, &err);
		return;
	}
	snprintf(path, sizeof path, "%s/%s", dir, file);
	/* The upload renames its file over this one: an open fd keeps the
	 * checkpoint it opened whole. */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	struct stat sb;
	if (fd < 0 || fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
		int e = fd < 0 ? errno : EINVAL;
		if (fd >= 0)
			close(fd);
		if (e == ENOENT)
			tr_api_fail(rp, 404, "not_found", NULL,
				    "job %lld has no checkpoint uploaded yet: its worker starts from the beginning",
				    (long long)id);
		else
			tr_api_fail(rp, 500, "internal", NULL, "cannot read %s: %s", path, strerror(e));
		return;
	}
	struct MHD_Response *resp = MHD_create_response_from_fd((uint64_t)sb.st_size, fd);
	if (!resp) {
		close(fd);
		tr_api_fail(rp, 500, "internal", NULL, "cannot create the download");
		return;
	}
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/octet-stream");
	rp->stream = resp;
	rp->status = 200;
}
