/* Per-job report tokens (daemon/job_token.h). */
#include "daemon/job_token.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/log.h"
#include "daemon/worker_job.h"
#include "storage/sha256.h"

#define TOKEN_BYTES 32

int tr_job_token_issue(tr_store_t *st, int64_t id, const char *dir, struct tr_error *err)
{
	unsigned char raw[TOKEN_BYTES];
	char token[2 * TOKEN_BYTES + 2], hash[65], path[PATH_MAX];
	if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw)
		return tr_error_set(err, -EIO, 0, NULL, "cannot make a report token: getrandom: %s", strerror(errno));
	for (int i = 0; i < TOKEN_BYTES; i++)
		snprintf(token + 2 * i, 3, "%02x", raw[i]);
	explicit_bzero(raw, sizeof raw);
	struct tr_sha256 c;
	tr_sha256_init(&c);
	tr_sha256_update(&c, token, 2 * TOKEN_BYTES);
	tr_sha256_final_hex(&c, hash);
	snprintf(path, sizeof path, "%s/%s", dir, TR_JOB_TOKEN_FILE);
	token[2 * TOKEN_BYTES] = '\n';
	int rc = tr_wjob_write_file(path, token, 2 * TOKEN_BYTES + 1, 0600);
	explicit_bzero(token, sizeof token);
	if (rc < 0)
		return tr_error_set(err, rc, 0, NULL, "cannot write %s: %s", path, strerror(-rc));
	struct tr_error e = {0};
	if ((rc = tr_store_job_token_set(st, id, hash, &e)) < 0) {
		unlink(path);
		return tr_error_set(err, rc, 0, NULL, "cannot store the report token: %s", e.message);
	}
	return 0;
}

void tr_job_token_revoke(tr_store_t *st, int64_t id, const char *dir)
{
	char path[PATH_MAX];
	struct tr_error e = {0};
	if (tr_store_job_token_clear(st, id, &e) < 0)
		tr_log(TR_LOG_WARN, "job %lld: its report token is not revoked: %s", (long long)id, e.message);
	snprintf(path, sizeof path, "%s/%s", dir, TR_JOB_TOKEN_FILE);
	unlink(path);
}
