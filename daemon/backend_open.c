/* One way for every command to open its devices, with one log line.
 *
 * The choice itself (CUDA when a GPU is usable, else CPU devices, and how
 * many) is the engine's tr_backend_open; this file only says it, at
 * warning level, because falling back is the difference between a GPU
 * machine and a slow one (docs/design.md, "Backends").
 */
#include <stdio.h>

#include "daemon/backend_open.h"
#include "daemon/log.h"

tr_backend_t *tr_daemon_backend_open(const struct tr_backend_options *opt, bool quiet, char *status, size_t slen,
				     struct tr_error *err)
{
	char why[600] = "";
	tr_backend_t *be = NULL;

	if (status && slen)
		status[0] = '\0';
	if (tr_backend_open(opt, &be, why, sizeof why, err) < 0)
		return NULL;
	if (why[0]) {
		if (!quiet)
			tr_log(TR_LOG_WARN, "no usable GPU: %s; using %d CPU devices", why, be->i->device_count(be));
		if (status && slen)
			snprintf(status, slen, "CPU fallback, no usable GPU: %s", why);
	}
	return be;
}
