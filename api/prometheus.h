/* Prometheus counters that other parts of the daemon feed: the server
 * reports each answered request, the checkpoint writer each checkpoint.
 * They are process-wide (as the process_* metrics are): one process runs
 * one daemon, and a counter must survive whatever the caller recreates.
 * GET /metrics (api/prometheus.c) renders them with the store's and the
 * scheduler's live numbers in the text exposition format 0.0.4.
 * Every function is thread-safe and cheap (one short lock, no I/O).
 */
#ifndef TR_API_PROMETHEUS_H
#define TR_API_PROMETHEUS_H

#include <stdbool.h>
#include <stdint.h>

struct tr_api_route;

/* Monotonic seconds, for timing a request from its headers. */
double tr_prom_clock(void);
/* One answered request: route is the matched table entry, NULL when no
 * route matched (404, 405), counted as route "unmatched". */
void tr_prom_request_done(const struct tr_api_route *route, int status, double seconds);
/* One checkpoint written and committed: its write time and size. */
void tr_prom_checkpoint_written(double seconds, uint64_t bytes);
/* One job preempted for a higher-priority one (daemon/preemption.c): hard
 * when its grace expired before a step boundary and it was cancelled back
 * to its newest checkpoint, else it checkpointed at a step boundary. */
void tr_prom_preemption(bool hard);

#endif
