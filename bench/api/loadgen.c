/* loadgen: a small open-loop HTTP/1.1 load generator with a fixed request
 * rate, for bench/api/ (Debian has wrk but not wrk2, and wrk is closed-loop:
 * it cannot hold a rate, and its latencies leave out the time a request
 * waited behind a slow one).
 *
 *   loadgen -a 127.0.0.1:8080 -r 1000 -d 10 -c 32 -u /path [-u /other]...
 *           [-w 2] [-o raw.tsv] [-l label]
 *
 * Request i is due at t0 + i / rate (CLOCK_MONOTONIC, timerfd, so no
 * millisecond rounding).  It goes out on an idle keep-alive connection as
 * soon as one is free; with none free it waits in a queue.  Latency is
 * measured from the due time to the last byte of the response (the
 * "corrected" figure, like wrk2's), and also from the moment the request
 * was written ("service" latency).  URLs are used in turn.  A URL may
 * contain {step}: it is replaced by the last "progress":{"step":N seen in
 * any response (0 before the first), so a dashboard-like client can poll
 * GET /jobs/ID and then ask for metrics from_step={step}.
 *
 * Bounded: it stops issuing after -d seconds, waits at most -w seconds
 * (default 2) for answers still outstanding (counted as unfinished), and
 * never opens more than -c connections.  One line of JSON on stdout:
 * counts, achieved rate, and latency percentiles in milliseconds.
 * -o writes one line per request: due offset s, latency ms, service ms,
 * status, url index.  Single-threaded (epoll).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define MAX_URLS 16
#define MAX_CONNS 1024
#define RBUF (1 << 22)

struct req {
	double due, sent, done; /* seconds from t0; done < 0 = unfinished */
	int status, url;
};

struct conn {
	int fd;
	bool busy;
	long req; /* index into reqs */
	char *rbuf;
	size_t rlen;
	long need;  /* total bytes of the response once headers are parsed, -1 = unknown */
	int status; /* of the response being read, once its header is parsed */
	char wbuf[2048];
	size_t wlen, woff;
};

static struct sockaddr_in addr;
static char host[128];
static const char *urls[MAX_URLS];
static int nurls;
static long long last_step;
static double t0;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char *what)
{
	fprintf(stderr, "loadgen: %s: %s\n", what, strerror(errno));
	exit(2);
}

static int open_conn(int ep, struct conn *c, int idx)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		die("socket");
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	if (connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0 && errno != EINPROGRESS)
		die("connect");
	c->fd = fd;
	c->busy = false;
	c->rlen = 0;
	c->need = -1;
	struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLET, .data.u32 = (uint32_t)idx};
	if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0)
		die("epoll_ctl");
	return 0;
}

static void build_request(struct conn *c, int url)
{
	char path[1024];
	const char *u = urls[url], *p = strstr(u, "{step}");
	if (p)
		snprintf(path, sizeof path, "%.*s%lld%s", (int)(p - u), u, last_step, p + 6);
	else
		snprintf(path, sizeof path, "%s", u);
	c->wlen = (size_t)snprintf(c->wbuf, sizeof c->wbuf, "GET %s HTTP/1.1\r\nHost: %s\r\nAccept: */*\r\n\r\n", path,
				   host);
	c->woff = 0;
}

static int flush_write(struct conn *c)
{
	while (c->woff < c->wlen) {
		ssize_t n = write(c->fd, c->wbuf + c->woff, c->wlen - c->woff);
		if (n < 0) {
			if (errno == EAGAIN || errno == ENOTCONN)
				return 0;
			return -1;
		}
		c->woff += (size_t)n;
	}
	return 0;
}

/* Parses the header once it is complete; returns 1 when the whole
 * response is in, 0 when more is needed, -1 on a protocol problem. */
static int check_response(struct conn *c)
{
	if (c->need < 0) {
		char *end = memmem(c->rbuf, c->rlen, "\r\n\r\n", 4);
		if (!end)
			return 0;
		size_t hlen = (size_t)(end - c->rbuf) + 4;
		if (sscanf(c->rbuf, "HTTP/1.%*d %d", &c->status) != 1)
			return -1;
		long clen = -1;
		for (char *p = c->rbuf; p && p < end; p = memmem(p, (size_t)(end - p), "\r\n", 2)) {
			if (p[0] == '\r')
				p += 2;
			if (strncasecmp(p, "Content-Length:", 15) == 0)
				clen = strtol(p + 15, NULL, 10);
			else if (strncasecmp(p, "Transfer-Encoding:", 18) == 0)
				return -1; /* chunked: not needed for these benchmarks */
		}
		if (clen < 0)
			return -1;
		c->need = (long)hlen + clen;
	}
	return (long)c->rlen >= c->need ? 1 : 0;
}

static void note_step(const char *buf, size_t len)
{
	const char *p = memmem(buf, len, "\"progress\":{\"step\":", 19);
	if (p)
		last_step = strtoll(p + 19, NULL, 10);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double pct(const double *v, long n, double p)
{
	if (n == 0)
		return -1;
	long i = (long)(p / 100.0 * (double)n);
	if (i >= n)
		i = n - 1;
	return v[i];
}

int main(int argc, char **argv)
{
	const char *target = NULL, *raw = NULL, *label = "";
	double rate = 100, duration = 10, drain = 2;
	int nconn = 16, opt;
	while ((opt = getopt(argc, argv, "a:r:d:c:u:w:o:l:")) != -1) {
		switch (opt) {
		case 'a':
			target = optarg;
			break;
		case 'r':
			rate = atof(optarg);
			break;
		case 'd':
			duration = atof(optarg);
			break;
		case 'c':
			nconn = atoi(optarg);
			break;
		case 'u':
			if (nurls == MAX_URLS) {
				fprintf(stderr, "loadgen: at most %d URLs\n", MAX_URLS);
				return 2;
			}
			urls[nurls++] = optarg;
			break;
		case 'w':
			drain = atof(optarg);
			break;
		case 'o':
			raw = optarg;
			break;
		case 'l':
			label = optarg;
			break;
		default:
			fprintf(stderr,
				"usage: loadgen -a HOST:PORT -r RATE -d SECONDS -c CONNS -u PATH [-u PATH]... [-w DRAIN_S] [-o FILE] [-l LABEL]\n");
			return 2;
		}
	}
	if (!target || !nurls || rate <= 0 || duration <= 0 || duration > 600 || nconn < 1 || nconn > MAX_CONNS) {
		fprintf(stderr, "loadgen: need -a, -u, 0 < -r, 0 < -d <= 600, 1 <= -c <= %d\n", MAX_CONNS);
		return 2;
	}
	const char *colon = strrchr(target, ':');
	if (!colon || (size_t)(colon - target) >= sizeof host) {
		fprintf(stderr, "loadgen: -a HOST:PORT\n");
		return 2;
	}
	snprintf(host, sizeof host, "%s", target);
	memcpy(host, target, (size_t)(colon - target));
	host[colon - target] = '\0';
	addr.sin_family = AF_INET;
	addr.sin_port = htons((uint16_t)atoi(colon + 1));
	if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) {
		fprintf(stderr, "loadgen: %s is not an IPv4 address\n", host);
		return 2;
	}
	snprintf(host, sizeof host, "%s", target);

	long total = (long)(rate * duration);
	struct req *reqs = calloc((size_t)total + 1, sizeof *reqs);
	struct conn *conns = calloc((size_t)nconn, sizeof *conns);
	if (!reqs || !conns)
		die("calloc");
	int ep = epoll_create1(EPOLL_CLOEXEC);
	if (ep < 0)
		die("epoll_create1");
	for (int i = 0; i < nconn; i++) {
		if (!(conns[i].rbuf = malloc(RBUF)))
			die("malloc");
		open_conn(ep, &conns[i], i);
	}
	int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	if (tfd < 0)
		die("timerfd_create");
	struct epoll_event tev = {.events = EPOLLIN, .data.u32 = UINT32_MAX};
	epoll_ctl(ep, EPOLL_CTL_ADD, tfd, &tev);

	usleep(100000); /* let the connections establish */
	t0 = now_s();
	long next = 0;   /* next request to become due */
	long queued = 0; /* first due request not yet sent (they are sent in order) */
	long completed = 0, errors = 0, reconnects = 0;
	double end_issue = duration, hard_end = duration + drain;
	int idle = nconn;
	struct epoll_event evs[64];
	for (;;) {
		double t = now_s() - t0;
		while (next < total && (double)next / rate <= t) {
			reqs[next].due = (double)next / rate;
			reqs[next].done = -1;
			reqs[next].url = (int)(next % nurls);
			next++;
		}
		/* Hand due requests to idle connections. */
		for (int i = 0; i < nconn && queued < next && idle > 0; i++) {
			struct conn *c = &conns[i];
			if (c->busy || c->fd < 0)
				continue;
			c->busy = true;
			idle--;
			c->req = queued++;
			c->rlen = 0;
			c->need = -1;
			build_request(c, reqs[c->req].url);
			reqs[c->req].sent = now_s() - t0;
			if (flush_write(c) < 0) {
				reqs[c->req].status = -1;
				reqs[c->req].done = now_s() - t0;
				errors++;
				completed++;
				epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
				close(c->fd);
				open_conn(ep, c, i);
				reconnects++;
				idle++;
			}
		}
		if (next >= total && queued >= next && idle == nconn)
			break;
		if (t >= hard_end)
			break;
		/* Sleep until the next due time or an event. */
		if (next < total) {
			double due = (double)next / rate + t0;
			struct itimerspec its = {0};
			its.it_value.tv_sec = (time_t)due;
			its.it_value.tv_nsec = (long)((due - (double)(time_t)due) * 1e9);
			if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0)
				its.it_value.tv_nsec = 1;
			timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, NULL);
		}
		int timeout_ms = next < total ? -1 : (int)((hard_end - t) * 1000) + 1;
		int n = epoll_wait(ep, evs, 64, timeout_ms);
		if (n < 0 && errno != EINTR)
			die("epoll_wait");
		for (int k = 0; k < n; k++) {
			if (evs[k].data.u32 == UINT32_MAX) {
				uint64_t x;
				while (read(tfd, &x, sizeof x) > 0)
					;
				continue;
			}
			struct conn *c = &conns[evs[k].data.u32];
			if (evs[k].events & EPOLLOUT && c->busy)
				flush_write(c);
			if (!(evs[k].events & (EPOLLIN | EPOLLERR | EPOLLHUP)))
				continue;
			bool closed = false;
			for (;;) {
				if (c->rlen == RBUF) {
					closed = true; /* response too large for this tool */
					break;
				}
				ssize_t r = read(c->fd, c->rbuf + c->rlen, RBUF - c->rlen);
				if (r > 0) {
					c->rlen += (size_t)r;
					continue;
				}
				if (r == 0 || (errno != EAGAIN && errno != EINTR))
					closed = true;
				break;
			}
			int rc = c->busy ? check_response(c) : 0;
			if (c->busy && rc == 1) {
				struct req *q = &reqs[c->req];
				q->done = now_s() - t0;
				q->status = c->status;
				if (c->status < 200 || c->status >= 300)
					errors++;
				note_step(c->rbuf, c->rlen);
				completed++;
				c->busy = false;
				idle++;
				c->rlen = 0;
				c->need = -1;
			}
			if (closed || rc < 0) {
				if (c->busy) {
					reqs[c->req].status = -1;
					reqs[c->req].done = now_s() - t0;
					errors++;
					completed++;
					c->busy = false;
					idle++;
				}
				epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
				close(c->fd);
				open_conn(ep, c, (int)(c - conns));
				reconnects++;
			}
		}
	}
	double elapsed = now_s() - t0;
	(void)end_issue;

	/* Percentiles over every request that was due; unfinished ones count
	 * as infinitely slow (they sort last). */
	double *lat = malloc((size_t)(next + 1) * sizeof *lat), *svc = malloc((size_t)(next + 1) * sizeof *svc);
	long nl = 0, ns = 0, unfinished = 0;
	double last_done = 0;
	for (long i = 0; i < next; i++) {
		if (reqs[i].done < 0) {
			lat[nl++] = 1e300;
			unfinished++;
			continue;
		}
		lat[nl++] = (reqs[i].done - reqs[i].due) * 1e3;
		svc[ns++] = (reqs[i].done - reqs[i].sent) * 1e3;
		if (reqs[i].done > last_done)
			last_done = reqs[i].done;
	}
	if (raw) {
		FILE *f = fopen(raw, "w");
		if (!f)
			die(raw);
		fprintf(f, "due_s\tlatency_ms\tservice_ms\tstatus\turl\n");
		for (long i = 0; i < next; i++)
			fprintf(f, "%.6f\t%.3f\t%.3f\t%d\t%d\n", reqs[i].due,
				reqs[i].done < 0 ? -1.0 : (reqs[i].done - reqs[i].due) * 1e3,
				reqs[i].done < 0 ? -1.0 : (reqs[i].done - reqs[i].sent) * 1e3, reqs[i].status,
				reqs[i].url);
		fclose(f);
	}
	qsort(lat, (size_t)nl, sizeof *lat, cmp_double);
	qsort(svc, (size_t)ns, sizeof *svc, cmp_double);
	long ok = completed - errors;
	double span = last_done > 0 ? last_done : elapsed;
	printf("{\"label\":\"%s\",\"target_rate\":%.1f,\"duration_s\":%.1f,\"connections\":%d,\"due\":%ld,"
	       "\"completed\":%ld,\"ok\":%ld,\"errors\":%ld,\"unfinished\":%ld,\"reconnects\":%ld,"
	       "\"achieved_rate\":%.1f,",
	       label, rate, duration, nconn, next, completed, ok, errors, unfinished, reconnects,
	       span > 0 ? (double)ok / span : 0.0);
	const double ps[] = {50, 90, 99, 99.9};
	const char *names[] = {"p50", "p90", "p99", "p999"};
	printf("\"latency_ms\":{");
	for (int i = 0; i < 4; i++) {
		double v = pct(lat, nl, ps[i]);
		printf(v >= 1e299 ? "\"%s\":null," : "\"%s\":%.3f,", names[i], v);
	}
	double mx = nl ? lat[nl - 1] : -1;
	printf(mx >= 1e299 ? "\"max\":null}," : "\"max\":%.3f},", mx);
	printf("\"service_ms\":{");
	for (int i = 0; i < 4; i++)
		printf("\"%s\":%.3f,", names[i], pct(svc, ns, ps[i]));
	printf("\"max\":%.3f}}\n", ns ? svc[ns - 1] : -1.0);
	return 0;
}
