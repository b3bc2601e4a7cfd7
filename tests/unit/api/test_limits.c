/* Unit tests of api/limits.c: the accept policy (connections per client
 * address, the reserve kept for addresses holding few), the request
 * deadline the reaper enforces on a request that trickles in, and the
 * event-stream caps (per client and for the daemon) answered 503
 * too_many_streams with Retry-After.  Over real HTTP and raw loopback
 * sockets against the in-process API of tests/unit/api/fixture.h, with
 * small limits; clients of different addresses bind 127.0.0.x sources.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "api/api_internal.h"
#include "tests/unit/api/fixture.h"

TestSuite(api, .init = api_fixture_setup, .fini = api_fixture_teardown, .timeout = 60);

static struct tr_api_config limits;

static void apply_limits(struct tr_api_config *cfg)
{
	cfg->max_connections = limits.max_connections;
	cfg->max_connections_per_client = limits.max_connections_per_client;
	cfg->connection_reserve = limits.connection_reserve;
	cfg->request_timeout_s = limits.request_timeout_s;
	cfg->max_streams = limits.max_streams;
	cfg->max_streams_per_client = limits.max_streams_per_client;
}

static void restart_with(struct tr_api_config l)
{
	struct start_opts o = {.tweak = apply_limits};

	limits = l;
	restart(&o);
}

/* A TCP connection to the API from source address src ("127.0.0.2"),
 * reads bounded by 10 s. */
static int connect_from(const char *src)
{
	struct sockaddr_in a = {.sin_family = AF_INET}, to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	struct timeval tv = {.tv_sec = 10};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	cr_assert_geq(fd, 0);
	inet_pton(AF_INET, src, &a.sin_addr);
	cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0, "bind %s: %s", src, strerror(errno));
	inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
	cr_assert_eq(connect(fd, (struct sockaddr *)&to, sizeof to), 0, "connect: %s", strerror(errno));
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	return fd;
}

static void send_text(int fd, const char *s)
{
	(void)send(fd, s, strlen(s), MSG_NOSIGNAL);
}

/* Reads until the end of the response headers; the status, 0 when the
 * server closed (or reset) first, -1 on the read timeout. */
static int read_status(int fd, char *got, size_t len)
{
	size_t n = 0;

	got[0] = '\0';
	while (n + 1 < len && !strstr(got, "\r\n\r\n")) {
		ssize_t k = recv(fd, got + n, len - n - 1, 0);

		if (k == 0 || (k < 0 && errno == ECONNRESET))
			return 0;
		if (k < 0)
			return -1;
		n += (size_t)k;
		got[n] = '\0';
	}
	return strncmp(got, "HTTP/1.1 ", 9) == 0 ? atoi(got + 9) : -1;
}

/* One request on fd, kept alive; its status (0: closed by the server). */
static int ask(int fd, const char *path)
{
	char req[256], got[4096];

	snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", path);
	send_text(fd, req);
	return read_status(fd, got, sizeof got);
}

/* A connection from src that the API served (so it is counted). */
static int served_from(const char *src)
{
	int fd = connect_from(src);

	cr_assert_eq(ask(fd, "/healthz"), 200, "a connection from %s is served", src);
	return fd;
}

Test(api, connections_per_client_are_capped)
{
	int fds[3], extra;
	unsigned long refused0;

	restart_with((struct tr_api_config){.max_connections_per_client = 3});
	for (int i = 0; i < 3; i++)
		fds[i] = served_from("127.0.0.2");
	refused0 = atomic_load(&api->limits.refused);
	extra = connect_from("127.0.0.2");
	cr_assert_eq(ask(extra, "/healthz"), 0, "the 4th connection of one address is closed unanswered");
	close(extra);
	cr_assert_eq(atomic_load(&api->limits.refused), refused0 + 1, "and counted as refused");
	/* Another address is not affected. */
	extra = served_from("127.0.0.3");
	close(extra);
	/* A closed connection frees its place (once MHD has seen it go). */
	close(fds[0]);
	int st = 0;
	for (int tries = 0; tries < 100 && st != 200; tries++) {
		extra = connect_from("127.0.0.2");
		st = ask(extra, "/healthz");
		close(extra);
		if (st != 200)
			usleep(20000);
	}
	cr_assert_eq(st, 200, "a place freed by a closed connection is given again");
	close(fds[1]);
	close(fds[2]);
}

Test(api, the_reserve_is_for_addresses_holding_few)
{
	/* 12 slots, 4 reserved: once 8 are taken, only an address holding
	 * fewer than 8 gets one. */
	int a[9], b, n = 0;

	restart_with((struct tr_api_config){.max_connections = 12, .connection_reserve = 4});
	for (; n < 8; n++)
		a[n] = served_from("127.0.0.2");
	a[n] = connect_from("127.0.0.2");
	cr_assert_eq(ask(a[n], "/healthz"), 0, "a 9th connection of the big client goes into the reserve: refused");
	close(a[n]);
	b = served_from("127.0.0.3");
	close(b);
	for (int i = 0; i < n; i++)
		close(a[i]);
}

Test(api, a_trickling_request_is_cut_at_its_deadline)
{
	char got[256];
	int fd, ok;
	unsigned long cut0;

	restart_with((struct tr_api_config){.request_timeout_s = 1});
	cut0 = atomic_load(&api->limits.cut);
	fd = connect_from("127.0.0.2");
	send_text(fd, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n");
	/* The headers never end: the reaper shuts the socket (within the
	 * 10 s read bound) and counts it. */
	cr_assert_eq(read_status(fd, got, sizeof got), 0, "the connection is closed: %s", got);
	close(fd);
	/* Counted just after the shutdown the client saw. */
	for (int i = 0; i < 200 && atomic_load(&api->limits.cut) == cut0; i++)
		usleep(10000);
	cr_assert_eq(atomic_load(&api->limits.cut), cut0 + 1);

	/* A request that arrives in time is served, and the kept-alive
	 * connection has a fresh deadline for its next request. */
	fd = connect_from("127.0.0.2");
	ok = ask(fd, "/healthz");
	cr_assert_eq(ok, 200);
	cr_assert_eq(ask(fd, "/version"), 200, "a second request on the connection");
	close(fd);
}

/* Opens an event stream on a raw connection from src: the status. */
static int open_stream(const char *src, int64_t job, int *fd_out, char *got, size_t len)
{
	char req[256];
	int fd = connect_from(src);

	snprintf(req, sizeof req, "GET /jobs/%" PRId64 "/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", job);
	send_text(fd, req);
	*fd_out = fd;
	return read_status(fd, got, len);
}

Test(api, stream_caps_answer_503_with_retry_after)
{
	int64_t id = submit("streams");
	int s1, s2, s3, other;
	char got[4096], h[64];
	struct tr_test_reply r;

	cr_assert_eq(tr_store_job_set_state(store, id, TR_JOB_RUNNING, NULL, NULL, NULL), 0);
	restart_with((struct tr_api_config){.max_streams = 3, .max_streams_per_client = 2});
	cr_assert_eq(open_stream("127.0.0.2", id, &s1, got, sizeof got), 200, "%s", got);
	cr_assert_eq(open_stream("127.0.0.2", id, &s2, got, sizeof got), 200, "%s", got);
	cr_assert_eq(open_stream("127.0.0.2", id, &s3, got, sizeof got), 503, "a client's third stream: %s", got);
	cr_assert_not_null(strstr(got, "Retry-After: 5"), "%s", got);
	close(s3);

	/* Through the shared client (127.0.0.1, another address): the
	 * body names the cap that was hit. */
	cr_assert_eq(open_stream("127.0.0.3", id, &other, got, sizeof got), 200, "%s", got);
	char path[64];
	snprintf(path, sizeof path, "/jobs/%" PRId64 "/events", id);
	r = http("GET", path, NULL);
	expect_status(&r, 503, "the daemon's 4th stream");
	cr_assert_str_eq(jstr(r.json, "error.code"), "too_many_streams");
	cr_assert_not_null(strstr(jstr(r.json, "error.message"), "already serves 3 event streams"), "%s", r.body.data);
	cr_assert_str_eq(header(&r, "Retry-After", h, sizeof h), "5");
	resp_free(&r);
	close(other);
	close(s1);
	close(s2);
	/* Ordinary requests are not streams: never capped by them. */
	r = http("GET", "/healthz", NULL);
	expect_status(&r, 200, "healthz");
	resp_free(&r);
}

Test(api, the_per_client_stream_message_names_the_cap)
{
	int64_t id = submit("streams");
	int s1;
	char got[4096], path[64];
	struct tr_test_reply r;

	cr_assert_eq(tr_store_job_set_state(store, id, TR_JOB_RUNNING, NULL, NULL, NULL), 0);
	restart_with((struct tr_api_config){.max_streams_per_client = 1});
	cr_assert_eq(open_stream("127.0.0.1", id, &s1, got, sizeof got), 200, "%s", got);
	snprintf(path, sizeof path, "/jobs/%" PRId64 "/events", id);
	r = http("GET", path, NULL);
	expect_status(&r, 503, "the client's 2nd stream");
	cr_assert_str_eq(jstr(r.json, "error.code"), "too_many_streams");
	cr_assert_not_null(strstr(jstr(r.json, "error.message"), "already has 1 open event streams"), "%s",
			   r.body.data);
	resp_free(&r);
	close(s1);
}

/* A client whose stream went away (a reset, or a close) and that comes
 * back at once, as an EventSource does, gets its place: the cap does not
 * count a stream whose client has gone, though the stream's own thread
 * notices it only about once a second (later on a loaded machine). */
Test(api, a_client_that_comes_back_is_not_refused_for_its_dead_stream)
{
	int64_t id = submit("streams");
	int s1, s2;
	char got[4096];

	cr_assert_eq(tr_store_job_set_state(store, id, TR_JOB_RUNNING, NULL, NULL, NULL), 0);
	restart_with((struct tr_api_config){.max_streams_per_client = 1});
	cr_assert_eq(open_stream("127.0.0.2", id, &s1, got, sizeof got), 200, "%s", got);
	for (int round = 0; round < 4; round++) {
		if (round % 2 == 0) { /* a reset */
			struct linger lg = {.l_onoff = 1, .l_linger = 0};

			setsockopt(s1, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
		}
		close(s1);
		cr_assert_eq(open_stream("127.0.0.2", id, &s1, got, sizeof got), 200,
			     "round %d: the client is back at once after a %s: %s", round,
			     round % 2 ? "close" : "reset", got);
	}
	/* The live stream still counts. */
	cr_assert_eq(open_stream("127.0.0.2", id, &s2, got, sizeof got), 503, "%s", got);
	close(s2);
	close(s1);
}
