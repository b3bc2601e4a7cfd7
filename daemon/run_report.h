/* The worker's side of worker reports (docs/design.md, "Worker reports"):
 * rank 0 of `trainerd run --report-url URL --report-token-file FILE`
 * posts its progress, metric points and, as it ends, its summary to the
 * daemon's POST /jobs/{id}/report from a background thread, so that the
 * daemon needs no view of the worker's files.
 *
 * A training step never waits for the network: the hooks only copy into
 * a bounded queue under a mutex.  A failed post is retried with backoff
 * (1 s doubling to 30 s); the local files are written as without reports,
 * so a point the queue had to drop (more than TR_RUN_REPORT_QUEUE unsent)
 * is still in metrics.jsonl.  HTTPS checks the daemon's certificate
 * against the system's CAs, or the file CURL_CA_BUNDLE names (as trainctl
 * and curl do). */
#ifndef TR_DAEMON_RUN_REPORT_H
#define TR_DAEMON_RUN_REPORT_H

#include <stdint.h>

#include "core/error.h"
#include "engine/trainer.h"

#define TR_RUN_REPORT_QUEUE 50000

typedef struct tr_run_report tr_run_report_t;

/* Reads the token (the file must be private: no group or other access)
 * and starts the thread.  NULL with err filled. */
tr_run_report_t *tr_run_report_start(const char *url, const char *token_file, struct tr_error *err);
/* Hooks' halves: never block on the network. */
void tr_run_report_metric(tr_run_report_t *r, const struct tr_metric_point *p);
void tr_run_report_progress(tr_run_report_t *r, const struct tr_progress *p);
/* A periodic checkpoint was written to OUT_DIR/checkpoint.safetensors:
 * the thread uploads it (PUT .../checkpoint.safetensors) when it can, so
 * that a requeue on a node without this one's files loses little. */
void tr_run_report_checkpoint(tr_run_report_t *r, const char *out_dir);
/* Uploads DIR/model.safetensors and DIR/checkpoint.safetensors (out_dir
 * may be NULL: none), then sends the summary (the summary.json text) and
 * what is still queued, waiting at most timeout_s in all, then stops the
 * thread and frees.  0 when everything was delivered, -ETIMEDOUT
 * otherwise (a line on stderr says so; the files have it all). */
int tr_run_report_finish(tr_run_report_t *r, const char *out_dir, const char *summary_json, double timeout_s);

#endif
