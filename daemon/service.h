/* The daemon as a systemd service: readiness, status, the watchdog and
 * socket activation (sd_notify, sd_listen_fds).  Without libsystemd, or
 * when not started by systemd (no NOTIFY_SOCKET), every call is a no-op
 * and tr_service_listen_fd finds no socket.
 */
#ifndef TR_DAEMON_SERVICE_H
#define TR_DAEMON_SERVICE_H

#include <stddef.h>

#include "api/api.h"
#include "core/error.h"
#include "daemon/scheduler.h"

typedef struct tr_service tr_service_t;

/* The socket systemd passed (trainerd.socket), or -1 when none was;
 * -2 with err (core/error.h) filled when the passed descriptors are unusable. */
int tr_service_listen_fd(struct tr_error *err);

/* NULL when there is no service manager to talk to (or out of memory:
 * the daemon runs the same without one). */
tr_service_t *tr_service_create(void);
/* READY=1 with a first STATUS=, then a thread keeps STATUS= current
 * (running and queued jobs, devices) and sends WATCHDOG=1 while both the
 * HTTP side and the scheduler have checked in recently.  devices is a
 * description such as "4 CPU devices (no usable GPU: ...)"; copied. */
void tr_service_ready(tr_service_t *svc, tr_api_t *api, tr_scheduler_t *sched, const char *devices);
/* STOPPING=1; from now on the thread leaves the API alone (it is about to
 * be stopped) and asks for more stop time (EXTEND_TIMEOUT_USEC) while jobs
 * write their final checkpoints. */
void tr_service_stopping(tr_service_t *svc);
/* RELOADING=1 ... READY=1 around a configuration reload. */
void tr_service_reloading(tr_service_t *svc, int done);
/* Joins the thread (before the scheduler goes away); accepts NULL. */
void tr_service_destroy(tr_service_t *svc);

#endif
