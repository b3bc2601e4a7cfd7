/* PUT /jobs/{id}/report/{file} (docs/design.md, "Worker reports"): rank 0
 * of a worker job uploads its final model.safetensors and
 * checkpoint.safetensors into the job's folder on the daemon's side,
 * where the runner stores them as the job's checkpoint when the job ends
 * (daemon/worker_job.c), as it does with files a shared file system
 * brings.  Streamed into a temporary file and renamed over the file at
 * the end, so a broken upload leaves the folder as it was and a retried
 * one replaces the file with the same bytes.  Authenticated as the report
 * route (api/report.c). */
#include "api/api_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct report_upload {
	int fd;
	int64_t bytes;
	char tmp[PATH_MAX], path[PATH_MAX];
};

static int begin(struct tr_api_request *rq, struct tr_api_reply *rp, int64_t declared)
{
	tr_api_t *api = rq->api;
	const char *file = rq->params[1];
	struct tr_error err = {0};
	char dir[PATH_MAX - 64];
	int64_t id;
	(void)declared;
	if (tr_api_path_id(rq, rp, &id) < 0)
		return -1;
	if (strcmp(file, "model.safetensors") && strcmp(file, "checkpoint.safetensors")) {
		tr_api_fail(rp, 400, "invalid_parameter", NULL,
			    "file: must be model.safetensors or checkpoint.safetensors, not \"%s\"", file);
		return -1;
	}
	if (!api->cfg.ops.report_folder) {
		tr_api_fail(rp, 503, "unavailable", NULL, "this daemon takes no worker reports");
		return -1;
	}
	if (api->cfg.ops.report_folder(api->cfg.ctx, id, dir, sizeof dir, &err) < 0) {
		tr_api_fail_op(rp, &err);
		return -1;
	}
	struct report_upload *up = calloc(1, sizeof *up);
	if (!up) {
		tr_api_fail(rp, 500, "internal", NULL, "out of memory");
		return -1;
	}
	snprintf(up->path, sizeof up->path, "%s/%s", dir, file);
	snprintf(up->tmp, sizeof up->tmp, "%s/%s.upload", dir, file);
	up->fd = open(up->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (up->fd < 0) {
		tr_api_fail(rp, 500, "internal", NULL, "cannot write %s: %s", up->tmp, strerror(errno));
		free(up);
		return -1;
	}
	rq->upload = up;
	return 0;
}

static void cleanup(struct tr_api_request *rq)
{
	struct report_upload *up = rq->upload;
	if (!up)
		return;
	close(up->fd);
	unlink(up->tmp);
	free(up);
	rq->upload = NULL;
}

static int data(struct tr_api_request *rq, struct tr_api_reply *rp, const char *buf, size_t size)
{
	struct report_upload *up = rq->upload;
	while (size > 0) {
		ssize_t n = write(up->fd, buf, size);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			int e = n < 0 ? errno : EIO;
			tr_api_fail(rp, e == ENOSPC ? 507 : 500, e == ENOSPC ? "insufficient_storage" : "internal",
				    NULL, "cannot write %s: %s", up->tmp, strerror(e));
			cleanup(rq);
			return -1;
		}
		buf += n;
		size -= (size_t)n;
		up->bytes += n;
	}
	return 0;
}

const struct tr_api_upload_ops tr_api_report_upload_ops = {.begin = begin, .data = data, .cleanup = cleanup};

void tr_api_report_file_put(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	struct report_upload *up = rq->upload;
	if (!up) {
		tr_api_fail(rp, 500, "internal", NULL, "the upload was not started");
		return;
	}
	if (fsync(up->fd) < 0 || rename(up->tmp, up->path) < 0) {
		tr_api_fail(rp, 500, "internal", NULL, "cannot store %s: %s", up->path, strerror(errno));
		cleanup(rq);
		return;
	}
	int64_t bytes = up->bytes;
	close(up->fd);
	free(up);
	rq->upload = NULL;
	tr_api_reply_json(rp, 200, json_pack("{s:I}", "bytes", (json_int_t)bytes));
}
