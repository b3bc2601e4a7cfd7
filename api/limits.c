/* Connection limits: who may connect, how long a request may take to
 * arrive, and how many event streams may be open (docs/design.md,
 * "Connection limits").
 *
 * Every accepted connection has a record here, kept from MHD's "started"
 * to its "closed" notification, with the client's address, its socket
 * and where it is in its request.  The accept policy counts records: an
 * address may hold max_connections_per_client, and once fewer than
 * connection_reserve slots are free only addresses that hold a handful
 * of connections get one, so a single client (or a few) cannot lock
 * everyone else out.  MHD's own timeout is an idle timeout, which a
 * client sending one byte every few seconds never trips; so a request's
 * headers and body must arrive within request_timeout_s of the
 * connection opening (or of the previous response on a kept-alive
 * connection), and a reaper thread shuts the socket of any request that
 * has not.  Shutting down (not closing) the socket is safe from another
 * thread: MHD's thread sees end-of-file and closes it itself, and MHD
 * closes a socket only after the "closed" notification has removed the
 * record, under the same lock the reaper holds.
 */
#include "api/api_internal.h"

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

/* Once the reserve is reached, an address holding fewer connections than
 * this still gets one: a browser tab with its dashboard and event stream
 * opens up to six. */
#define FEW_CONNECTIONS 8
/* How often the reaper looks for requests past their deadline. */
#define REAP_INTERVAL_MS 200

struct tr_api_conn {
	struct tr_api_conn *prev, *next;
	struct sockaddr_storage addr;
	int fd;
	bool reading;    /* between connection start (or the last response) and a complete request */
	bool streaming;  /* an event stream is open on it */
	bool cut;        /* shut down by the reaper */
	double deadline; /* monotonic seconds; while reading */
};

static double mono_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Same host: IPv4 or IPv6 address, ports ignored. */
static bool same_host(const struct sockaddr_storage *a, const struct sockaddr *b)
{
	if (a->ss_family != b->sa_family)
		return false;
	if (b->sa_family == AF_INET)
		return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
		       ((const struct sockaddr_in *)b)->sin_addr.s_addr;
	if (b->sa_family == AF_INET6)
		return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
			      &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr)) == 0;
	return false;
}

static void copy_addr(struct sockaddr_storage *to, const struct sockaddr *from)
{
	memset(to, 0, sizeof(*to));
	if (from->sa_family == AF_INET)
		memcpy(to, from, sizeof(struct sockaddr_in));
	else if (from->sa_family == AF_INET6)
		memcpy(to, from, sizeof(struct sockaddr_in6));
	else
		to->ss_family = from->sa_family;
}

/* Connections of addr; under the lock. */
static int count_host(const struct tr_api_limits *l, const struct sockaddr *addr)
{
	int n = 0;

	for (const struct tr_api_conn *c = l->head; c; c = c->next)
		if (same_host(&c->addr, addr))
			n++;
	return n;
}

enum MHD_Result tr_api_limits_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen)
{
	tr_api_t *api = cls;
	struct tr_api_limits *l = &api->limits;
	const struct tr_api_config *cfg = &api->cfg;
	bool ok;

	(void)addrlen;
	pthread_mutex_lock(&l->lock);
	int same = count_host(l, addr);
	ok = same < cfg->max_connections_per_client &&
	     (l->count < cfg->max_connections - cfg->connection_reserve || same < FEW_CONNECTIONS);
	pthread_mutex_unlock(&l->lock);
	if (!ok)
		atomic_fetch_add(&l->refused, 1);
	return ok ? MHD_YES : MHD_NO;
}

void tr_api_limits_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
			  enum MHD_ConnectionNotificationCode code)
{
	tr_api_t *api = cls;
	struct tr_api_limits *l = &api->limits;
	struct tr_api_conn *c = *socket_context;

	if (code == MHD_CONNECTION_NOTIFY_STARTED) {
		/* An accepted connection is the HTTP side's watchdog check-in. */
		tr_api_stamp(api);
		const union MHD_ConnectionInfo *addr =
			MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
		const union MHD_ConnectionInfo *fd = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);

		/* Without a record the connection is merely not limited. */
		c = calloc(1, sizeof(*c));
		if (!c)
			return;
		if (addr && addr->client_addr)
			copy_addr(&c->addr, addr->client_addr);
		c->fd = fd ? fd->connect_fd : -1;
		c->reading = true;
		c->deadline = mono_now() + api->cfg.request_timeout_s;
		pthread_mutex_lock(&l->lock);
		c->next = l->head;
		if (l->head)
			l->head->prev = c;
		l->head = c;
		l->count++;
		pthread_mutex_unlock(&l->lock);
		*socket_context = c;
		return;
	}
	if (!c)
		return;
	pthread_mutex_lock(&l->lock);
	if (c->prev)
		c->prev->next = c->next;
	else
		l->head = c->next;
	if (c->next)
		c->next->prev = c->prev;
	l->count--;
	pthread_mutex_unlock(&l->lock);
	free(c);
	*socket_context = NULL;
}

static struct tr_api_conn *conn_of(struct MHD_Connection *conn)
{
	const union MHD_ConnectionInfo *info = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);

	return info ? info->socket_context : NULL;
}

void tr_api_limits_request_read(struct tr_api_request *rq)
{
	struct tr_api_conn *c = conn_of(rq->conn);

	if (!c)
		return;
	pthread_mutex_lock(&rq->api->limits.lock);
	c->reading = false;
	pthread_mutex_unlock(&rq->api->limits.lock);
}

void tr_api_limits_request_done(tr_api_t *api, struct MHD_Connection *conn)
{
	struct tr_api_conn *c = conn_of(conn);

	if (!c)
		return;
	pthread_mutex_lock(&api->limits.lock);
	c->reading = true;
	c->streaming = false;
	c->deadline = mono_now() + api->cfg.request_timeout_s;
	pthread_mutex_unlock(&api->limits.lock);
}

bool tr_api_peer_gone(int fd)
{
	struct pollfd p = {.fd = fd, .events = POLLRDHUP};

	return fd >= 0 && poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/* Open streams, all and of addr's host; under the lock.  With live_only,
 * a stream whose client has gone is not counted. */
static void count_streams(const struct tr_api_limits *l, const struct sockaddr *addr, bool live_only, int *total,
			  int *mine)
{
	*total = *mine = 0;
	for (const struct tr_api_conn *o = l->head; o; o = o->next) {
		/* Under the lock: the socket stays open while its record is
		 * in the list (see the top of this file). */
		if (!o->streaming || (live_only && tr_api_peer_gone(o->fd)))
			continue;
		(*total)++;
		*mine += same_host(&o->addr, addr);
	}
}

int tr_api_limits_stream_open(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	tr_api_t *api = rq->api;
	struct tr_api_limits *l = &api->limits;
	struct tr_api_conn *c = conn_of(rq->conn);
	const struct sockaddr *addr;
	int total, mine;

	if (!c)
		return 0;
	addr = (const struct sockaddr *)&c->addr;
	pthread_mutex_lock(&l->lock);
	count_streams(l, addr, false, &total, &mine);
	bool ok = total < api->cfg.max_streams && mine < api->cfg.max_streams_per_client;
	/* A stream whose client has gone still counts until its own thread
	 * notices (it looks about once a second, later on a loaded machine)
	 * and MHD closes it; a client that reconnects at once, as an
	 * EventSource does after a reset, would be refused for its own dead
	 * stream.  So at a cap the streams are counted again without the
	 * gone ones (a poll each, only then). */
	if (!ok) {
		count_streams(l, addr, true, &total, &mine);
		ok = total < api->cfg.max_streams && mine < api->cfg.max_streams_per_client;
	}
	if (ok)
		c->streaming = true;
	pthread_mutex_unlock(&l->lock);
	if (ok)
		return 0;
	if (mine >= api->cfg.max_streams_per_client)
		tr_api_fail(rp, 503, "too_many_streams", NULL,
			    "this client already has %d open event streams, the most one client may have; close one "
			    "and retry",
			    mine);
	else
		tr_api_fail(rp, 503, "too_many_streams", NULL,
			    "the daemon already serves %d event streams, the most it allows; retry later", total);
	tr_api_reply_header(rp, MHD_HTTP_HEADER_RETRY_AFTER, "5");
	return -1;
}

static void *reaper_main(void *cls)
{
	tr_api_t *api = cls;
	struct tr_api_limits *l = &api->limits;

	pthread_mutex_lock(&l->lock);
	while (!l->stop) {
		struct timespec ts;
		double now = mono_now();

		for (struct tr_api_conn *c = l->head; c; c = c->next) {
			if (!c->reading || c->cut || c->fd < 0 || now < c->deadline)
				continue;
			/* MHD's thread wakes up to end-of-file and closes the
			 * connection; the client sees it closed. */
			shutdown(c->fd, SHUT_RDWR);
			c->cut = true;
			atomic_fetch_add(&l->cut, 1);
		}
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_nsec += REAP_INTERVAL_MS * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&l->wake, &l->lock, &ts);
	}
	pthread_mutex_unlock(&l->lock);
	return NULL;
}

int tr_api_limits_init(tr_api_t *api, struct tr_error *e)
{
	struct tr_api_limits *l = &api->limits;
	pthread_condattr_t attr;
	int rc;

	pthread_mutex_init(&l->lock, NULL);
	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	pthread_cond_init(&l->wake, &attr);
	pthread_condattr_destroy(&attr);
	l->initialized = true;
	rc = pthread_create(&l->reaper, NULL, reaper_main, api);
	if (rc != 0) {
		tr_error_set(e, 0, 0, NULL, "cannot start the request deadline thread: %s", strerror(rc));
		return -1;
	}
	l->reaper_started = true;
	return 0;
}

void tr_api_limits_finish(tr_api_t *api)
{
	struct tr_api_limits *l = &api->limits;

	if (!l->initialized)
		return;
	if (l->reaper_started) {
		pthread_mutex_lock(&l->lock);
		l->stop = true;
		pthread_cond_signal(&l->wake);
		pthread_mutex_unlock(&l->lock);
		pthread_join(l->reaper, NULL);
	}
	pthread_cond_destroy(&l->wake);
	pthread_mutex_destroy(&l->lock);
	l->initialized = false;
}
