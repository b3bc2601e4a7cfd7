/* A Slurm job's report token (docs/design.md, "Worker reports"): made
 * when the daemon hands the job to Slurm, given to its worker in a 0600
 * file in the job's folder, kept in the store only as its SHA-256, and
 * revoked when the job ends.  It authorises only that job's report routes
 * (api/report.c). */
#ifndef TR_DAEMON_JOB_TOKEN_H
#define TR_DAEMON_JOB_TOKEN_H

#include <stdint.h>

#include "core/error.h"
#include "storage/store.h"

/* The file in the job's folder that holds the token. */
#define TR_JOB_TOKEN_FILE "report.token"

/* Makes a new token for job id (256 bits from getrandom), writes it to
 * DIR/report.token (mode 0600, through a temporary and a rename) and
 * stores its hash, replacing any earlier one.  0 or -errno with err. */
int tr_job_token_issue(tr_store_t *st, int64_t id, const char *dir, struct tr_error *err);
/* Revokes the job's token: clears its row and removes the file. */
void tr_job_token_revoke(tr_store_t *st, int64_t id, const char *dir);

#endif
