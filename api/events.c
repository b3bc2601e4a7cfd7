/* GET /jobs/{id}/events: Server-Sent Events from the store's event table.
 *
 * The response is an MHD callback response; with one thread per
 * connection the callback may block, so it simply loops: send what the
 * store has after the last sent id, else wait on the store (a second at a
 * time, so tr_api_stop is noticed), else send a keepalive comment.
 * Event ids are the store's, so a client that reconnects with
 * Last-Event-ID resumes exactly after the last frame it saw.
 *
 * Memory is bounded per stream, whatever the client does: the store is
 * read cfg.sse_buffer_bytes of event data at a time (one event, itself
 * bounded by the store, when a single one is larger), the next read only
 * happens once MHD has taken all of it, which it does only as the socket
 * drains, and a buffer grown by a burst is freed once sent; the socket's
 * send buffer is set to the same size.  A client that
 * reads nothing for cfg.sse_stall_s is disconnected (MHD's connection
 * timeout, which counts only successful reads and writes; a healthy
 * stream writes at least a heartbeat); its events stay in the store, so
 * it loses nothing when it reconnects with Last-Event-ID.
 *
 * The stream ends once the job is over: when it was already terminal at
 * connect, after replaying its history; otherwise after the terminal
 * "state" event and whatever the store had already written behind it
 * (the final metrics flush may land just after the state change).  It
 * also ends when the job is deleted, after sse_max_idle_s without an
 * event, and on shutdown.
 */
#include "api/api_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#define BATCH 256
#define BLOCK_SIZE (16 * 1024)
/* A buffer grown past this by a burst is freed once it is sent. */
#define KEEP_CAP (64 * 1024)
/* Tells EventSource clients how soon to reconnect, and gets the response
 * headers and a first byte out before the job has anything to say. */
#define PREAMBLE "retry: 3000\n\n"

struct stream {
	tr_api_t *api;
	int64_t job_id;
	int64_t last_id;
	char *buf;
	size_t len, off, cap;
	bool started;
	bool end_when_drained; /* the job is over: stop at the first empty read */
	bool done;
	unsigned types;                /* TR_EVENT_* mask (types=) */
	double last_write, last_event; /* monotonic seconds */
	int fd;                        /* the connection's socket, -1 when unknown */
	/* The request's Authorization value and the role the route needs:
	 * a stream outlives its admission, so when the tokens change (a
	 * reload) it checks again, and one whose token was revoked ends. */
	char *authorization;
	enum tr_api_role need;
	unsigned auth_gen;
};

static double mono_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int append(struct stream *s, const char *data, size_t len)
{
	if (s->len + len > s->cap) {
		size_t ncap = s->cap ? s->cap : 4096;
		char *nb;

		while (ncap < s->len + len)
			ncap *= 2;
		nb = realloc(s->buf, ncap);
		if (!nb)
			return -ENOMEM;
		s->buf = nb;
		s->cap = ncap;
	}
	memcpy(s->buf + s->len, data, len);
	s->len += len;
	return 0;
}

static int append_str(struct stream *s, const char *str)
{
	return append(s, str, strlen(str));
}

/* One SSE frame.  Data with newlines (the store writes compact JSON, but
 * nothing promises it) is split into several "data:" lines, which the
 * client joins back with "\n". */
static int append_frame(struct stream *s, const struct tr_event *ev)
{
	char head[128];
	const char *line = ev->data ? ev->data : "null";
	int rc;

	snprintf(head, sizeof(head), "id: %" PRId64 "\nevent: %s\n", ev->id, ev->type ? ev->type : "message");
	rc = append_str(s, head);
	for (;;) {
		size_t n = strcspn(line, "\n");

		rc = rc ? rc : append_str(s, "data: ");
		rc = rc ? rc : append(s, line, n);
		rc = rc ? rc : append_str(s, "\n");
		if (!line[n])
			break;
		line += n + 1;
	}
	return rc ? rc : append_str(s, "\n");
}

static bool terminal_event(const struct tr_event *ev)
{
	json_t *data;
	bool terminal;

	if (!ev->type || strcmp(ev->type, "state") != 0 || !ev->data)
		return false;
	data = json_loads(ev->data, 0, NULL);
	terminal = tr_job_state_name_terminal(json_string_value(json_object_get(data, "state")));
	json_decref(data);
	return terminal;
}

/* Reads the job before any event: a job found terminal here already has
 * its terminal event in the table (both are written in one
 * transaction), so replaying history cannot miss it. */
static int start(struct stream *s)
{
	struct tr_job_row row = {0};
	int rc = tr_store_job_get(s->api->cfg.store, s->job_id, &row, NULL);

	s->started = true;
	if (rc == -ENOENT) {
		s->done = true;
		return 0;
	}
	if (rc < 0)
		return rc;
	s->end_when_drained = tr_job_state_terminal(row.state);
	tr_job_row_finish(&row);
	s->last_write = s->last_event = mono_now();
	return append_str(s, PREAMBLE);
}

/* Appends the next batch of events; returns how many, or < 0. */
static int next_events(struct stream *s)
{
	struct tr_event *ev = NULL;
	int n = 0, rc;

	int64_t scanned;
	/* A stream without metrics events, when only metrics events came
	 * since its last look (a training job between log lines), has
	 * nothing to read: the reads are skipped, at each of the writer's
	 * five commits a second, and the stream moves past what was
	 * committed.  The committed id is read first: an event committed by
	 * then was inserted, and counted in the other id, before it. */
	if (!(s->types & TR_EVENT_METRICS)) {
		int64_t committed = tr_store_last_event_id(s->api->cfg.store);
		if (tr_store_last_other_event_id(s->api->cfg.store) <= s->last_id) {
			if (committed > s->last_id)
				s->last_id = committed;
			return 0;
		}
	}
	rc = tr_store_events_read(s->api->cfg.store, s->job_id, s->last_id, BATCH, s->api->cfg.sse_buffer_bytes,
				  s->types, &ev, &n, &scanned, NULL);
	if (rc < 0)
		return rc;
	for (int i = 0; i < n && rc == 0; i++) {
		rc = append_frame(s, &ev[i]);
		s->last_id = ev[i].id;
		if (terminal_event(&ev[i]))
			s->end_when_drained = true;
	}
	tr_events_free(ev, n);
	if (rc < 0)
		return rc;
	/* Events left out by types= are not looked at again. */
	if (scanned > s->last_id)
		s->last_id = scanned;
	if (n > 0)
		s->last_write = s->last_event = mono_now();
	return n;
}

/* A deleted job's stream would otherwise idle until sse_max_idle_s. */
static bool job_gone(struct stream *s)
{
	struct tr_job_row row = {0};
	int rc = tr_store_job_get(s->api->cfg.store, s->job_id, &row, NULL);

	tr_job_row_finish(&row);
	return rc == -ENOENT;
}

static ssize_t fill(void *cls, uint64_t pos, char *out, size_t max)
{
	struct stream *s = cls;
	tr_api_t *api = s->api;
	double now, heartbeat = api->cfg.sse_heartbeat_s;
	int rc;

	(void)pos;
	for (;;) {
		unsigned gen = tr_api_auth_generation(api);
		if (gen != s->auth_gen) {
			s->auth_gen = gen;
			if (!tr_api_auth_still_allows(api, s->authorization, s->need))
				return MHD_CONTENT_READER_END_WITH_ERROR;
		}
		if (s->off < s->len) {
			size_t n = s->len - s->off < max ? s->len - s->off : max;

			memcpy(out, s->buf + s->off, n);
			s->off += n;
			return (ssize_t)n;
		}
		s->off = s->len = 0;
		if (s->cap > KEEP_CAP) {
			free(s->buf);
			s->buf = NULL;
			s->cap = 0;
		}
		if (s->done || atomic_load(&api->stopping))
			return MHD_CONTENT_READER_END_OF_STREAM;
		if (!s->started) {
			if (start(s) < 0)
				return MHD_CONTENT_READER_END_WITH_ERROR;
			continue;
		}
		rc = next_events(s);
		if (rc < 0)
			return MHD_CONTENT_READER_END_WITH_ERROR;
		if (rc > 0)
			continue;
		if (s->end_when_drained) {
			s->done = true;
			continue;
		}
		now = mono_now();
		if (now - s->last_event >= api->cfg.sse_max_idle_s) {
			s->done = true;
			continue;
		}
		if (now - s->last_write >= heartbeat) {
			if (job_gone(s)) {
				s->done = true;
				continue;
			}
			if (append_str(s, ": keepalive\n\n") < 0)
				return MHD_CONTENT_READER_END_WITH_ERROR;
			s->last_write = now;
			continue;
		}
		/* A client that went away (closed or reset) is otherwise noticed
		 * only by the next write, up to a heartbeat later on a quiet job,
		 * and its stream counts against max-streams(-per-client) until
		 * then: a client that reconnects was refused 503 for up to 15 s
		 * (the caps now skip a gone client's stream themselves,
		 * api/limits.c; this frees the stream's thread and socket).
		 * A half-close (the client shuts down its sending side) ends the
		 * stream too; an event-stream client has nothing left to send
		 * but does not do that while it still reads. */
		if (tr_api_peer_gone(s->fd))
			return MHD_CONTENT_READER_END_WITH_ERROR;
		double left_ms = (heartbeat - (now - s->last_write)) * 1000.0;
		int wait_ms = left_ms < 1000.0 ? (int)left_ms + 1 : 1000;

		tr_store_wait_events_types(api->cfg.store, s->job_id, s->last_id, s->types, wait_ms);
	}
}

static void free_stream(void *cls)
{
	struct stream *s = cls;

	free(s->buf);
	free(s->authorization);
	free(s);
}

/* types=: "state,log" and the like; state events are always sent, since
 * the terminal one ends the stream.  -1 with 400 naming the word. */
static int parse_types(const char *text, unsigned *mask, struct tr_api_reply *rp)
{
	static const struct {
		const char *name;
		unsigned bit;
	} known[] = {{"state", TR_EVENT_STATE}, {"log", TR_EVENT_LOG}, {"metrics", TR_EVENT_METRICS}};
	*mask = TR_EVENT_STATE;
	for (const char *p = text;;) {
		size_t n = strcspn(p, ","), k;
		for (k = 0; k < sizeof known / sizeof known[0]; k++)
			if (strlen(known[k].name) == n && strncmp(p, known[k].name, n) == 0)
				break;
		if (k == sizeof known / sizeof known[0]) {
			tr_api_fail(rp, 400, "invalid_parameter", NULL,
				    "types: \"%.*s\" is not an event type (state, log, metrics, comma-separated)",
				    (int)(n > 64 ? 64 : n), p);
			return -1;
		}
		*mask |= known[k].bit;
		if (!p[n])
			return 0;
		p += n + 1;
	}
}

void tr_api_events_stream(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	tr_api_t *api = rq->api;
	struct tr_job_row row;
	struct MHD_Response *resp;
	struct stream *s;
	const char *from, *what = "Last-Event-ID";
	int64_t id, after = 0;

	if (tr_api_path_id(rq, rp, &id) < 0)
		return;
	if (tr_api_load_job(api, rp, id, &row) < 0)
		return;
	tr_job_row_finish(&row);
	from = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, "Last-Event-ID");
	if (!from) {
		from = tr_api_query(rq, "last_event_id");
		what = "last_event_id";
	}
	if (from && tr_api_parse_int(from, 0, INT64_MAX, &after) < 0) {
		tr_api_fail(rp, 400, "invalid_parameter", NULL, "%s: must be an integer >= 0", what);
		return;
	}
	const char *types_text = tr_api_query(rq, "types");
	unsigned types = TR_EVENT_ALL;
	if (types_text && parse_types(types_text, &types, rp) < 0)
		return;
	if (tr_api_limits_stream_open(rq, rp) < 0)
		return;
	s = calloc(1, sizeof(*s));
	if (!s) {
		tr_api_fail(rp, 500, "internal", NULL, "out of memory");
		return;
	}
	s->api = api;
	s->job_id = id;
	s->last_id = after;
	s->types = types;
	s->fd = -1;
	s->need = tr_api_route_role(rq->route);
	s->auth_gen = tr_api_auth_generation(api);
	const char *authorization =
		MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
	if (authorization && !(s->authorization = strdup(authorization))) {
		free_stream(s);
		tr_api_fail(rp, 500, "internal", NULL, "out of memory");
		return;
	}
	resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, BLOCK_SIZE, fill, s, free_stream);
	if (!resp) {
		free_stream(s);
		tr_api_fail(rp, 500, "internal", NULL, "cannot create the event stream");
		return;
	}
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
	/* Reverse proxies (nginx) would otherwise hold frames back. */
	MHD_add_response_header(resp, "X-Accel-Buffering", "no");
	/* The stream is quiet between heartbeats by design, so the idle
	 * timeout for ordinary requests does not fit; the stall limit does
	 * (see the top of this file). */
	MHD_set_connection_option(rq->conn, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned int)api->cfg.sse_stall_s);
	/* The kernel's send buffer grows to megabytes for a client that does
	 * not read; the stream's own bound fits it as well. */
	const union MHD_ConnectionInfo *fd = MHD_get_connection_info(rq->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
	if (fd) {
		int sndbuf = (int)api->cfg.sse_buffer_bytes;

		setsockopt(fd->connect_fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
		s->fd = fd->connect_fd;
	}
	rp->stream = resp;
	rp->status = 200;
}
