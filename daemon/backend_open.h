/* The devices `trainerd serve` and `trainerd run` train on, and `trainerd
 * eval` and `predict` run a model on. */
#ifndef TR_DAEMON_BACKEND_OPEN_H
#define TR_DAEMON_BACKEND_OPEN_H

#include <stdbool.h>
#include <stddef.h>

#include "engine/backend.h"

/* Opens the backend with tr_backend_open (engine/backend.h) and, when
 * "auto" fell back to CPU devices, logs the one warning every command
 * give: "no usable GPU: <reason>; using N CPU devices" (a GPU server
 * running on its CPUs must not look healthy).  quiet drops the warning
 * (--quiet).  status, when not NULL, receives "CPU fallback,
 * no usable GPU: <reason>" or "" (systemd's STATUS=).  NULL with the
 * reason in err. */
tr_backend_t *tr_daemon_backend_open(const struct tr_backend_options *opt, bool quiet, char *status, size_t slen,
				     struct tr_error *err);

#endif
