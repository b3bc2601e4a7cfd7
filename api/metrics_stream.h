/* Rendering GET /jobs/{id}/metrics answers (api/metrics_stream.c): whole
 * into a buffer, or streamed one series at a time. */
#ifndef TR_API_METRICS_STREAM_H
#define TR_API_METRICS_STREAM_H

#include <microhttpd.h>
#include <stddef.h>
#include <stdint.h>

#include "storage/store.h"

/* The whole answer, {"job", "max_points", "series"} and a newline, in
 * one read transaction; *text malloc'd.  -EFBIG when the series hold more
 * than max_points_total points together (0 = no limit): stream those. */
int tr_api_metrics_render(tr_store_t *store, int64_t job, const struct tr_metrics_query *q, size_t max_points_total,
			  char **text, size_t *len, struct tr_error *e);
/* A response that renders the same answer while it is sent, one series
 * (one read transaction) at a time; q and its names are copied.  NULL
 * without memory or when the names cannot be read (e says why).  A store failure
 * mid-way ends the response early (the client sees a cut body). */
struct MHD_Response *tr_api_metrics_stream(tr_store_t *store, int64_t job, const struct tr_metrics_query *q,
					   struct tr_error *e);

#endif
