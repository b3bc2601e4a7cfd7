/* The daemon's connection and stream limits over raw loopback sockets
 * (docs/design.md, "Connection limits" and "Event streams"): a flood of
 * connections from one address leaves room for others, requests that
 * trickle in are cut at their deadline, the event stream caps answer 503,
 * clients that never read cannot grow the daemon's memory, a client that
 * stops reading is disconnected and resumes with Last-Event-ID without a
 * loss, and disagreeing Content-Length headers are refused.
 *
 * Several loopback addresses (127.0.0.2, ...) stand for several clients.
 * Every loop is bounded in count and time.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

/* extra: more keys of the synthetic data set. */
#define SMALL_JOB(samples, extra)                                                                           \
	"{\"name\": \"limits\", \"seed\": 3, \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 8}," \
	" {\"type\": \"relu\"}, {\"type\": \"dense\", \"units\": 3}]}, \"data\": {\"train\": {\"format\":"  \
	" \"synthetic\", \"samples\": " samples ", \"features\": 4, \"classes\": 3" extra "}},"             \
	" \"batch_size\": 32, \"epochs\": 1, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.01}}"

static struct daemon d;

static void stop1(void)
{
	daemon_cleanup(&d);
}

TestSuite(limits, .fini = stop1, .timeout = 240);

static int daemon_port(void)
{
	const char *colon = strrchr(d.base_url, ':');

	cr_assert_not_null(colon, "no port in %s", d.base_url);
	return atoi(colon + 1);
}

/* A connected socket from source address src (a loopback address), or -1
 * when the connection is not established within 2 s. */
static int connect_from(const char *src, int rcvbuf)
{
	struct sockaddr_in me = {.sin_family = AF_INET}, to = {.sin_family = AF_INET};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	cr_assert_geq(fd, 0, "socket: %s", strerror(errno));
	if (rcvbuf > 0)
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
	inet_pton(AF_INET, src, &me.sin_addr);
	cr_assert_eq(bind(fd, (struct sockaddr *)&me, sizeof(me)), 0, "bind %s: %s", src, strerror(errno));
	inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
	to.sin_port = htons((uint16_t)daemon_port());
	fcntl(fd, F_SETFL, O_NONBLOCK);
	if (connect(fd, (struct sockaddr *)&to, sizeof(to)) < 0 && errno != EINPROGRESS) {
		close(fd);
		return -1;
	}
	struct pollfd p = {.fd = fd, .events = POLLOUT};
	int err = 0;
	socklen_t len = sizeof(err);
	if (poll(&p, 1, 2000) != 1 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0 || err) {
		close(fd);
		return -1;
	}
	fcntl(fd, F_SETFL, 0);
	return fd;
}

static void send_text(int fd, const char *text)
{
	size_t n = strlen(text);

	cr_assert_eq(send(fd, text, n, MSG_NOSIGNAL), (ssize_t)n, "send: %s", strerror(errno));
}

/* True when the daemon has closed fd (end of file or reset), waiting up
 * to ms for it; data that arrives first is read and dropped. */
static bool closed_within(int fd, int ms)
{
	double deadline = now_s() + ms / 1000.0;
	char buf[4096];

	for (;;) {
		int left = (int)((deadline - now_s()) * 1000);
		struct pollfd p = {.fd = fd, .events = POLLIN};

		if (poll(&p, 1, left > 0 ? left : 0) != 1)
			return false;
		ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
			return true;
	}
}

/* Sends request on a new connection from src and reads the whole answer
 * (HTTP/1.0: the daemon closes after it), for up to timeout_s.  Returns
 * the malloc'd answer (headers and body), or NULL when none came. */
static char *exchange(const char *src, const char *request, double timeout_s)
{
	int fd = connect_from(src, 0);
	double deadline = now_s() + timeout_s;
	size_t len = 0, cap = 65536;
	char *out = malloc(cap);

	cr_assert_not_null(out);
	if (fd < 0) {
		free(out);
		return NULL;
	}
	send_text(fd, request);
	for (;;) {
		int left = (int)((deadline - now_s()) * 1000);
		struct pollfd p = {.fd = fd, .events = POLLIN};

		if (left <= 0 || poll(&p, 1, left) != 1)
			break;
		if (len + 4096 > cap) {
			cap *= 2;
			out = realloc(out, cap);
			cr_assert_not_null(out);
		}
		ssize_t n = recv(fd, out + len, cap - len - 1, 0);
		if (n <= 0)
			break;
		len += (size_t)n;
	}
	close(fd);
	out[len] = 0;
	if (len == 0) {
		free(out);
		return NULL;
	}
	return out;
}

static long status_of(const char *answer)
{
	return answer && strncmp(answer, "HTTP/1.", 7) == 0 ? strtol(answer + 9, NULL, 10) : -1;
}

/* Opens n connections from src and returns how many the daemon kept
 * (not closed within 500 ms).  fds receives them all. */
static int flood(const char *src, int *fds, int n)
{
	int kept = 0;

	for (int i = 0; i < n; i++)
		fds[i] = connect_from(src, 0);
	for (int i = 0; i < n; i++)
		if (fds[i] >= 0 && !closed_within(fds[i], i == 0 ? 500 : 1))
			kept++;
	return kept;
}

static void close_all(int *fds, int n)
{
	for (int i = 0; i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]);
}

static long long rss_kb(pid_t pid)
{
	char path[64], line[256];
	long long kb = -1;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f, "%s: %s", path, strerror(errno));
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %lld kB", &kb) == 1)
			break;
	fclose(f);
	return kb;
}

/* ---- connections ---------------------------------------------------------- */

/* 600 connections from one address take the per-client share and no more;
 * another address is still served at once.  (With one global limit of
 * 512, the first address used to take every slot.) */
Test(limits, connection_flood_leaves_room_for_other_clients)
{
	enum { N = 600 };
	static int fds[N];

	daemon_start(&d, 1, NULL);
	int kept = flood("127.0.0.1", fds, N);
	fprintf(stderr, "600 connections from 127.0.0.1: %d kept\n", kept);
	cr_expect_leq(kept, 64, "one address kept %d connections; the default per-client cap is 64", kept);
	char *a = exchange("127.0.0.2", "GET /healthz HTTP/1.0\r\n\r\n", 5);
	cr_expect_eq(status_of(a), 200, "GET /healthz from 127.0.0.2 during the flood: %s", a ? a : "(no answer)");
	free(a);
	close_all(fds, N);
	/* The flooding address is served again once it lets go. */
	double deadline = now_s() + 5;
	long st;
	do {
		a = exchange("127.0.0.1", "GET /healthz HTTP/1.0\r\n\r\n", 5);
		st = status_of(a);
		free(a);
	} while (st != 200 && now_s() < deadline && usleep(100000) == 0);
	cr_expect_eq(st, 200, "GET /healthz from 127.0.0.1 after its flood");
}

/* The last connection-reserve slots only go to addresses that hold few
 * connections. */
Test(limits, reserve_keeps_slots_for_new_clients)
{
	enum { N = 200 };
	static int one[N], two[N];
	const char *flags[] = {
		"--max-connections", "100", "--max-connections-per-client", "64", "--connection-reserve", "16", NULL};

	daemon_start(&d, 1, flags);
	int kept1 = flood("127.0.0.1", one, N);
	cr_expect_eq(kept1, 64, "the first address keeps its per-client share (kept %d)", kept1);
	int kept2 = flood("127.0.0.2", two, N);
	/* 64 + 20 = 100 - 16: the reserve starts; 127.0.0.2 already holds 8 or more. */
	cr_expect_eq(kept2, 20, "the second address fills up to the reserve (kept %d)", kept2);
	char *a = exchange("127.0.0.3", "GET /healthz HTTP/1.0\r\n\r\n", 5);
	cr_expect_eq(status_of(a), 200, "a third address gets a reserved slot: %s", a ? a : "(no answer)");
	free(a);
	close_all(one, N);
	close_all(two, N);
}

/* A request whose headers (or body) trickle in, a byte at a time well
 * inside the idle timeout, is cut at the request deadline. */
static void expect_cut(const char *start, const char *more, double timeout_s)
{
	int fd = connect_from("127.0.0.1", 0);
	double t0 = now_s();
	bool cut = false;

	cr_assert_geq(fd, 0);
	send_text(fd, start);
	/* Bounded: 40 drips of 250 ms, 10 s, far past the 2 s deadline. */
	for (int i = 0; i < 40 && !cut; i++) {
		cut = closed_within(fd, 250);
		if (!cut && send(fd, more, strlen(more), MSG_NOSIGNAL) < 0)
			cut = true;
	}
	double took = now_s() - t0;
	close(fd);
	cr_expect(cut, "a request trickling in (%s) was not cut within %.1f s", start, took);
	cr_expect_geq(took, timeout_s - 0.5, "cut after %.1f s, before the %.0f s deadline", took, timeout_s);
}

Test(limits, trickling_requests_are_cut_at_the_deadline)
{
	const char *flags[] = {"--request-timeout", "2", NULL};

	daemon_start(&d, 1, flags);
	expect_cut("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n", "X", 2);
	expect_cut(
		"POST /jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n",
		" ", 2);
	/* Ordinary requests are not affected. */
	struct http_reply r;
	http(&d, "GET", "/healthz", NULL, NULL, NULL, &r);
	cr_expect_eq(r.status, 200);
	http_free(&r);
}

/* ---- Content-Length -------------------------------------------------------- */

Test(limits, disagreeing_content_lengths_are_refused)
{
	daemon_start(&d, 1, NULL);
	char *a = exchange(
		"127.0.0.1",
		"POST /jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
		"Content-Length: 30\r\n\r\n{}",
		5);
	cr_assert_not_null(a, "no answer to a request with two Content-Length headers");
	cr_expect_eq(status_of(a), 400, "two disagreeing Content-Length headers: %s", a);
	cr_expect_not_null(strstr(a, "Content-Length headers that disagree"), "%s", a);
	free(a);
	/* Repeating the same value is harmless. */
	a = exchange("127.0.0.1",
		     "POST /jobs HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
		     "Content-Length: 2\r\n\r\n{}",
		     5);
	cr_expect_eq(status_of(a), 400, "an empty spec is refused as a spec: %s", a ? a : "(none)");
	cr_expect_null(a ? strstr(a, "disagree") : NULL, "%s", a ? a : "");
	free(a);
}

/* ---- event streams ---------------------------------------------------------- */

/* A job that stays open (paused), so its streams stay open. */
static long long paused_job(void)
{
	long long id = submit_job(&d, SMALL_JOB("100000", ", \"load_cost_us\": 2000"));
	char path[64];
	struct http_reply r;

	snprintf(path, sizeof(path), "/jobs/%lld/pause", id);
	http(&d, "POST", path, NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 202, "pause: %ld %s", r.status, r.body);
	http_free(&r);
	const char *st = wait_state(&d, id, "paused", 30);
	cr_assert_str_eq(st, "paused");
	return id;
}

/* Opens an event stream from src; returns the socket once the stream's
 * first bytes are in, or -1 with *status set when refused. */
static int open_stream(const char *src, long long job, long *status, char *body, size_t bodylen)
{
	char req[128], buf[4096];
	int fd = connect_from(src, 0);
	size_t len = 0;

	cr_assert_geq(fd, 0);
	snprintf(req, sizeof(req), "GET /jobs/%lld/events HTTP/1.0\r\n\r\n", job);
	send_text(fd, req);
	double deadline = now_s() + 5;
	while (len < sizeof(buf) - 1 && now_s() < deadline) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		if (poll(&p, 1, 200) != 1)
			continue;
		ssize_t n = recv(fd, buf + len, sizeof(buf) - 1 - len, 0);
		if (n <= 0)
			break;
		len += (size_t)n;
		buf[len] = 0;
		if (strstr(buf, "retry: 3000"))
			break;
	}
	buf[len] = 0;
	*status = status_of(buf);
	if (body)
		snprintf(body, bodylen, "%s", buf);
	if (*status == 200)
		return fd;
	close(fd);
	return -1;
}

Test(limits, stream_caps_answer_503)
{
	const char *flags[] = {"--max-streams", "3", "--max-streams-per-client", "2", "--sse-heartbeat", "1", NULL};
	char body[4096];
	long st;

	daemon_start(&d, 1, flags);
	long long job = paused_job();
	int a1 = open_stream("127.0.0.1", job, &st, NULL, 0);
	cr_assert_eq(st, 200);
	int a2 = open_stream("127.0.0.1", job, &st, NULL, 0);
	cr_assert_eq(st, 200);
	open_stream("127.0.0.1", job, &st, body, sizeof(body));
	cr_expect_eq(st, 503, "a third stream from one client: %s", body);
	cr_expect_not_null(strstr(body, "\"code\":\"too_many_streams\""), "%s", body);
	cr_expect_not_null(strstr(body, "application/json"), "%s", body);
	int b1 = open_stream("127.0.0.2", job, &st, NULL, 0);
	cr_expect_eq(st, 200, "another client still gets a stream");
	open_stream("127.0.0.3", job, &st, body, sizeof(body));
	cr_expect_eq(st, 503, "a fourth stream in all: %s", body);
	cr_expect_not_null(strstr(body, "too_many_streams"), "%s", body);
	/* A closed stream frees its place (noticed at the next heartbeat). */
	close(a1);
	int c1 = -1;
	for (int i = 0; i < 50 && c1 < 0; i++) {
		c1 = open_stream("127.0.0.3", job, &st, NULL, 0);
		if (c1 < 0)
			usleep(100000);
	}
	cr_expect_geq(c1, 0, "a stream after one was closed: %ld", st);
	if (a2 >= 0)
		close(a2);
	if (b1 >= 0)
		close(b1);
	if (c1 >= 0)
		close(c1);
}

/* A client that vanishes from a quiet stream (a paused job: no events, a
 * heartbeat only every 15 s) used to keep its place until the next
 * heartbeat's write failed, so reconnecting from the same address was
 * refused with 503 too_many_streams for up to 15 s.  Its place is free
 * within a second now, for a reset and for an ordinary close.  Found by
 * the reliability suite's load run (clients that vanish and come back). */
Test(limits, vanished_stream_frees_its_place_within_a_second)
{
	const char *flags[] = {"--max-streams-per-client", "2", NULL};
	long st;

	daemon_start(&d, 1, flags);
	long long job = paused_job();
	for (int round = 0; round < 2; round++) {
		int a = open_stream("127.0.0.1", job, &st, NULL, 0);
		cr_assert_eq(st, 200);
		int b = open_stream("127.0.0.1", job, &st, NULL, 0);
		cr_assert_eq(st, 200);
		if (round == 0) { /* a reset */
			struct linger lg = {.l_onoff = 1, .l_linger = 0};
			setsockopt(a, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
		}
		close(a);
		/* 4 s: well under the 15 s heartbeat that used to free it. */
		int c = -1;
		for (int i = 0; i < 40 && c < 0; i++) {
			c = open_stream("127.0.0.1", job, &st, NULL, 0);
			if (c < 0)
				usleep(100000);
		}
		cr_assert_geq(c, 0, "%s: the vanished stream still holds its place (status %ld)",
			      round == 0 ? "reset" : "close", st);
		close(b);
		close(c);
		usleep(1500000); /* both places free again for the next round */
	}
}

/* Submits a small job, waits for it to finish and pushes n points named
 * "m" (steps 0..n-1) to it; returns once the store has them all. */
static long long job_with_points(int n)
{
	long long id = submit_job(&d, SMALL_JOB("256", ""));
	char path[128];
	const char *st = wait_state(&d, id, "completed|failed", 60);

	cr_assert_str_eq(st, "completed");
	snprintf(path, sizeof(path), "/jobs/%lld/metrics", id);
	for (int from = 0; from < n; from += 10000) {
		int to = from + 10000 < n ? from + 10000 : n;
		size_t cap = (size_t)(to - from) * 48 + 32, len = 0;
		char *body = malloc(cap);
		cr_assert_not_null(body);
		len += (size_t)snprintf(body, cap, "{\"points\":[");
		for (int s = from; s < to; s++)
			len += (size_t)snprintf(body + len, cap - len, "%s{\"name\":\"m\",\"step\":%d,\"value\":%d.5}",
						s > from ? "," : "", s, s);
		snprintf(body + len, cap - len, "]}");
		struct http_reply r;
		http(&d, "POST", path, body, NULL, NULL, &r);
		cr_assert_eq(r.status, 202, "push: %ld %s", r.status, r.body);
		http_free(&r);
		free(body);
	}
	snprintf(path, sizeof(path), "/jobs/%lld/metrics?names=m&from_step=%d", id, n - 1);
	double deadline = now_s() + 60;
	for (;;) {
		struct http_reply r;
		http(&d, "GET", path, NULL, NULL, NULL, &r);
		json_t *steps = json_object_get(json_object_get(json_object_get(r.json, "series"), "m"), "steps");
		bool done = json_array_size(steps) > 0;
		http_free(&r);
		if (done)
			return id;
		cr_assert_lt(now_s(), deadline, "the pushed points were not stored within 60 s");
		usleep(50000);
	}
}

/* Twelve clients that never read (small receive buffers) while the job has
 * ~25 MB of events: the daemon's memory stays bounded.  (Each stream used
 * to buffer up to 256 events of up to 0.9 MB, here all 25 MB: +400 MB.
 * The bound leaves room for sanitizer builds, whose freed memory is
 * quarantined rather than reused: under 1 MB a stream in a plain build,
 * about 2 under ASan.) */
Test(limits, streams_that_never_read_keep_memory_bounded)
{
	enum { CLIENTS = 12, POINTS = 300000 };
	int fds[CLIENTS];
	char req[128];

	daemon_start(&d, 1, NULL);
	long long job = job_with_points(POINTS);
	long long before = rss_kb(d.pid);
	snprintf(req, sizeof(req), "GET /jobs/%lld/events HTTP/1.0\r\n\r\n", job);
	for (int i = 0; i < CLIENTS; i++) {
		fds[i] = connect_from("127.0.0.1", 4096);
		cr_assert_geq(fds[i], 0);
		send_text(fds[i], req);
	}
	/* The daemon reads and sends until every socket is full. */
	long long peak = before;
	for (int i = 0; i < 30; i++) {
		usleep(100000);
		long long kb = rss_kb(d.pid);
		if (kb > peak)
			peak = kb;
	}
	fprintf(stderr, "daemon RSS with %d streams that never read: %lld kB before, %lld kB peak (+%lld kB)\n",
		CLIENTS, before, peak, peak - before);
	cr_expect_lt(peak - before, 64 * 1024, "RSS grew by %lld kB with %d streams that never read", peak - before,
		     CLIENTS);
	for (int i = 0; i < CLIENTS; i++)
		close(fds[i]);
	struct http_reply r;
	http(&d, "GET", "/healthz", NULL, NULL, NULL, &r);
	cr_expect_eq(r.status, 200);
	http_free(&r);
}

/* Counts the "m" points of the complete frames in text (an SSE body);
 * marks their steps in seen, counts repeats, returns the last complete
 * frame's id. */
static long long scan_frames(const char *text, unsigned char *seen, int n, int *points, int *repeats)
{
	long long last = 0;
	const char *p = strstr(text, "\r\n\r\n");

	p = p ? p + 4 : text;
	for (;;) {
		const char *end = strstr(p, "\n\n");
		if (!end)
			break;
		long long id = 0;
		const char *idl = strstr(p, "id: ");
		if (idl && idl < end)
			id = atoll(idl + 4);
		const char *data = strstr(p, "data: ");
		if (data && data < end && strstr(p, "event: metrics") && strstr(p, "event: metrics") < end) {
			json_t *j = json_loadb(data + 6, (size_t)(end - data - 6), 0, NULL);
			json_t *pt;
			size_t i;
			json_array_foreach(json_object_get(j, "points"), i, pt) {
				const char *name = json_string_value(json_object_get(pt, "name"));
				if (!name || strcmp(name, "m") != 0)
					continue;
				json_int_t s = json_integer_value(json_object_get(pt, "step"));
				if (s < 0 || s >= n)
					continue;
				if (seen[s])
					(*repeats)++;
				seen[s] = 1;
				(*points)++;
			}
			json_decref(j);
		}
		if (id)
			last = id;
		p = end + 2;
	}
	return last;
}

/* Reads fd until the daemon closes it or timeout_s passes; returns the
 * text and whether it was closed. */
static char *read_all(int fd, double timeout_s, bool *closed)
{
	size_t len = 0, cap = 1 << 20;
	char *out = malloc(cap);
	double deadline = now_s() + timeout_s;

	cr_assert_not_null(out);
	*closed = false;
	while (now_s() < deadline) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		if (poll(&p, 1, 200) != 1)
			continue;
		if (len + 65536 > cap) {
			cap *= 2;
			out = realloc(out, cap);
			cr_assert_not_null(out);
		}
		ssize_t n = recv(fd, out + len, cap - len - 1, 0);
		if (n <= 0) {
			*closed = true;
			break;
		}
		len += (size_t)n;
	}
	out[len] = 0;
	return out;
}

/* A client that stops reading is disconnected after the stall limit; it
 * reconnects with Last-Event-ID and gets every point exactly once. */
Test(limits, stalled_reader_is_dropped_and_resumes_without_loss)
{
	enum { POINTS = 150000 };
	const char *flags[] = {"--sse-heartbeat", "1", "--sse-stall-timeout", "3", NULL};
	static unsigned char seen[POINTS];
	int points = 0, repeats = 0;
	char req[160];
	bool closed;

	daemon_start(&d, 1, flags);
	long long job = job_with_points(POINTS);
	int fd = connect_from("127.0.0.1", 4096);
	cr_assert_geq(fd, 0);
	snprintf(req, sizeof(req), "GET /jobs/%lld/events HTTP/1.0\r\n\r\n", job);
	send_text(fd, req);
	/* Not reading: the daemon's writes stall, and after 3 s it lets go. */
	sleep(6);
	char *first = read_all(fd, 30, &closed);
	close(fd);
	cr_assert(closed, "the stalled stream was not closed");
	long long last = scan_frames(first, seen, POINTS, &points, &repeats);
	free(first);
	fprintf(stderr, "stalled reader got %d of %d points before it was dropped\n", points, POINTS);
	cr_expect_lt(points, POINTS, "the stalled reader was not dropped before the end (%d points)", points);
	fd = connect_from("127.0.0.1", 0);
	cr_assert_geq(fd, 0);
	snprintf(req, sizeof(req), "GET /jobs/%lld/events HTTP/1.0\r\nLast-Event-ID: %lld\r\n\r\n", job, last);
	send_text(fd, req);
	char *rest = read_all(fd, 60, &closed);
	close(fd);
	cr_assert(closed, "the resumed stream of a finished job did not end");
	scan_frames(rest, seen, POINTS, &points, &repeats);
	free(rest);
	cr_expect_eq(repeats, 0, "%d points came twice", repeats);
	cr_expect_eq(points, POINTS, "%d of %d points arrived over both streams", points, POINTS);
}
