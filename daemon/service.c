/* systemd integration (see service.h).
 *
 * The watchdog is only useful if it can fail: WATCHDOG=1 goes out only
 * when the scheduler's dispatcher (tr_scheduler_last_beat) and the HTTP
 * listener (tr_api_last_accept, kept fresh by a probe connection each
 * period) have both checked in within half the watchdog interval, so a
 * stalled scheduler or a wedged listener gets the service restarted
 * instead of looking healthy.  The interval comes from WATCHDOG_USEC
 * (WatchdogSec= in the unit); the thread wakes four times per interval.
 */
#include "daemon/service.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#ifdef TR_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

#include "daemon/log.h"

/* The dispatcher wakes at least once a second; a limit below a few of
 * those would flap on a busy machine. */
#define MIN_STALE_S 2.5
/* Without a watchdog the thread still refreshes STATUS= this often. */
#define STATUS_PERIOD_S 5.0
/* At shutdown: each extension, and how often it is renewed. */
#define EXTEND_USEC 10000000ULL
#define EXTEND_EVERY_S 3.0

enum phase { PHASE_STARTING, PHASE_RUNNING, PHASE_STOPPING, PHASE_DONE };

struct tr_service {
	pthread_mutex_t lock;
	pthread_cond_t wake;
	enum phase phase;
	bool thread_started;
	pthread_t thread;
	tr_api_t *api;
	tr_scheduler_t *sched;
	char devices[512];
	double watchdog_s; /* 0 = no watchdog */
	char last_status[768];
	bool warned_stale;
};

static double mono_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void send_state(const char *state)
{
#ifdef TR_HAVE_SYSTEMD
	sd_notify(0, state);
#else
	(void)state;
#endif
}

int tr_service_listen_fd(struct tr_error *err)
{
#ifdef TR_HAVE_SYSTEMD
	int n = sd_listen_fds(1);

	if (n < 0) {
		tr_error_set(err, 0, 0, NULL, "socket activation: %s", strerror(-n));
		return -2;
	}
	if (n == 0)
		return -1;
	if (n > 1) {
		tr_error_set(err, 0, 0, NULL,
			     "socket activation passed %d sockets; trainerd.socket must have exactly one "
			     "ListenStream=",
			     n);
		return -2;
	}
	if (sd_is_socket(SD_LISTEN_FDS_START, AF_UNSPEC, SOCK_STREAM, 1) <= 0) {
		tr_error_set(err, 0, 0, NULL, "socket activation: descriptor %d is not a listening stream socket",
			     SD_LISTEN_FDS_START);
		return -2;
	}
	return SD_LISTEN_FDS_START;
#else
	(void)err;
	return -1;
#endif
}

tr_service_t *tr_service_create(void)
{
#ifdef TR_HAVE_SYSTEMD
	const char *sock = getenv("NOTIFY_SOCKET");
	uint64_t usec = 0;

	if (!sock || !*sock)
		return NULL;
	tr_service_t *svc = calloc(1, sizeof(*svc));
	if (!svc)
		return NULL;
	pthread_mutex_init(&svc->lock, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&svc->wake, &ca);
	pthread_condattr_destroy(&ca);
	/* 0 keeps WATCHDOG_USEC in the environment: the process may start
	 * itself again (daemon/main.c) and must still see it. */
	if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0)
		svc->watchdog_s = (double)usec * 1e-6;
	return svc;
#else
	return NULL;
#endif
}

/* "running 1 job, 2 queued; 4 CPU devices (...)" */
static void format_status(tr_service_t *svc, char *buf, size_t len)
{
	int running = 0, queued = 0;

	tr_scheduler_counts(svc->sched, &running, &queued);
	if (svc->phase == PHASE_STOPPING)
		snprintf(buf, len, "stopping: %d job%s writing a final checkpoint", running, running == 1 ? "" : "s");
	else
		snprintf(buf, len, "running %d job%s, %d queued; %s", running, running == 1 ? "" : "s", queued,
			 svc->devices);
}

static void send_status(tr_service_t *svc, bool force)
{
	char status[768], msg[800];

	format_status(svc, status, sizeof(status));
	if (!force && strcmp(status, svc->last_status) == 0)
		return;
	snprintf(svc->last_status, sizeof(svc->last_status), "%s", status);
	snprintf(msg, sizeof(msg), "STATUS=%s", status);
	send_state(msg);
}

/* Whether both sides checked in within the limit; logs a side that did
 * not, once per episode. */
static bool healthy(tr_service_t *svc, double now)
{
	double limit = svc->watchdog_s / 2 > MIN_STALE_S ? svc->watchdog_s / 2 : MIN_STALE_S;
	double sched_age = now - tr_scheduler_last_beat(svc->sched);
	double api_age = now - tr_api_last_accept(svc->api);
	bool ok = sched_age < limit && api_age < limit;

	if (!ok && !svc->warned_stale)
		tr_log(TR_LOG_ERR, "watchdog: %s has not checked in for %.1f s; no WATCHDOG=1 until it does",
		       sched_age >= limit ? "the scheduler" : "the HTTP listener",
		       sched_age >= limit ? sched_age : api_age);
	else if (ok && svc->warned_stale)
		tr_log(TR_LOG_NOTICE, "watchdog: scheduler and HTTP listener check in again");
	svc->warned_stale = !ok;
	return ok;
}

static void *service_main(void *arg)
{
	tr_service_t *svc = arg;
	double period = svc->watchdog_s > 0 ? svc->watchdog_s / 4 : STATUS_PERIOD_S;
	double last_extend = 0;

	pthread_setname_np(pthread_self(), "tr-service");
	pthread_mutex_lock(&svc->lock);
	while (svc->phase != PHASE_DONE) {
		double now = mono_now();

		if (svc->phase == PHASE_RUNNING) {
			if (svc->watchdog_s > 0) {
				if (healthy(svc, now))
					send_state("WATCHDOG=1");
				/* Checked at the next wake-up: accepting it stamps
				 * tr_api_last_accept. */
				tr_api_probe(svc->api);
			}
			send_status(svc, false);
		} else if (svc->phase == PHASE_STOPPING) {
			int running = 0, queued = 0;

			tr_scheduler_counts(svc->sched, &running, &queued);
			send_status(svc, false);
			if (running > 0 && now - last_extend >= EXTEND_EVERY_S) {
				char msg[64];

				snprintf(msg, sizeof(msg), "EXTEND_TIMEOUT_USEC=%llu", EXTEND_USEC);
				send_state(msg);
				last_extend = now;
			}
			/* The scheduler no longer dispatches; shutdown itself is
			 * bounded by shutdown-grace. */
			if (svc->watchdog_s > 0)
				send_state("WATCHDOG=1");
			period = 0.5;
		}
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		double until = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 + period;
		ts.tv_sec = (time_t)until;
		ts.tv_nsec = (long)((until - (double)ts.tv_sec) * 1e9);
		pthread_cond_timedwait(&svc->wake, &svc->lock, &ts);
	}
	pthread_mutex_unlock(&svc->lock);
	return NULL;
}

void tr_service_ready(tr_service_t *svc, tr_api_t *api, tr_scheduler_t *sched, const char *devices)
{
	char status[768], msg[800];

	if (!svc)
		return;
	pthread_mutex_lock(&svc->lock);
	svc->api = api;
	svc->sched = sched;
	snprintf(svc->devices, sizeof(svc->devices), "%s", devices);
	svc->phase = PHASE_RUNNING;
	format_status(svc, status, sizeof(status));
	snprintf(svc->last_status, sizeof(svc->last_status), "%s", status);
	snprintf(msg, sizeof(msg), "READY=1\nSTATUS=%s", status);
	send_state(msg);
	if (pthread_create(&svc->thread, NULL, service_main, svc) == 0)
		svc->thread_started = true;
	else
		tr_log(TR_LOG_WARN, "cannot start the service thread: no STATUS updates or watchdog pings");
	pthread_mutex_unlock(&svc->lock);
	if (svc->watchdog_s > 0)
		tr_log(TR_LOG_INF, "watchdog: %.1f s; pinging while the scheduler and the listener check in",
		       svc->watchdog_s);
}

void tr_service_stopping(tr_service_t *svc)
{
	if (!svc)
		return;
	pthread_mutex_lock(&svc->lock);
	if (svc->phase == PHASE_RUNNING || svc->phase == PHASE_STARTING) {
		svc->phase = PHASE_STOPPING;
		send_state("STOPPING=1");
		if (svc->sched)
			send_status(svc, true);
	}
	pthread_cond_broadcast(&svc->wake);
	pthread_mutex_unlock(&svc->lock);
}

void tr_service_reloading(tr_service_t *svc, int done)
{
	if (!svc)
		return;
	pthread_mutex_lock(&svc->lock);
	if (svc->phase == PHASE_RUNNING) {
		if (!done) {
			char msg[96];
			struct timespec ts;

			/* systemd wants the time of the reload with it (v253+). */
			clock_gettime(CLOCK_MONOTONIC, &ts);
			snprintf(msg, sizeof(msg), "RELOADING=1\nMONOTONIC_USEC=%llu",
				 (unsigned long long)ts.tv_sec * 1000000ULL + (unsigned long long)ts.tv_nsec / 1000);
			send_state(msg);
		} else {
			send_state("READY=1");
			send_status(svc, true);
		}
	}
	pthread_mutex_unlock(&svc->lock);
}

void tr_service_destroy(tr_service_t *svc)
{
	if (!svc)
		return;
	pthread_mutex_lock(&svc->lock);
	if (svc->phase != PHASE_STOPPING)
		send_state("STOPPING=1");
	svc->phase = PHASE_DONE;
	pthread_cond_broadcast(&svc->wake);
	pthread_mutex_unlock(&svc->lock);
	if (svc->thread_started)
		pthread_join(svc->thread, NULL);
	pthread_cond_destroy(&svc->wake);
	pthread_mutex_destroy(&svc->lock);
	free(svc);
}
