/* The HTTP server: libmicrohttpd setup, request admission and dispatch.
 *
 * MHD runs one thread per connection with an internal polling thread, so
 * a handler or an SSE callback may block on the store without stalling
 * other clients; connections are capped (in all and per client address)
 * and requests have a deadline to arrive, see limits.c.  Each
 * request is admitted as soon as its headers arrive: routing (404/405),
 * a foreign Host or a cross-site origin (origin.c), bearer auth, Content-Type and a declared Content-Length over the cap
 * are answered before a byte of body is read (the last only when the
 * client waits for "100 Continue"; otherwise the body, if not huge, is
 * read and dropped first, so the client sees the 413 and not a reset).
 * Bodies of routes that take JSON are buffered up to cfg.max_body; a
 * chunked body that grows past it is discarded as it streams (MHD cannot
 * answer mid-upload) and answered with 413 at its end, or cut off if it
 * goes on far beyond the cap.
 * Upload routes (TR_ROUTE_UPLOAD) stream their body to api/datasets.c
 * instead: no cap here (the datasets quota applies) and, once admitted,
 * no request deadline (MHD's idle timeout still cuts a stalled client).
 * A refusal found before or during the body is held and answered when the
 * body is over, read and dropped up to the discard limit, as for a JSON
 * body over the cap (a full disk: up to the declared Content-Length, so
 * that the client sees the 507 rather than a broken pipe).
 * Handlers fill a struct tr_api_reply; this file turns it into a response.
 */
#include "api/api_internal.h"
#include "api/prometheus.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* A body over the cap is read and thrown away up to this far past it so
 * the client still gets its 413; beyond it the connection is closed. */
#define DISCARD_LIMIT ((size_t)16 << 20)

double tr_api_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- responses ---- */

static struct MHD_Response *json_response(json_t *json)
{
	char *buf;
	size_t len;

	if (tr_api_render_json(json, &buf, &len) < 0)
		return NULL;
	return MHD_create_response_from_buffer(len, buf, MHD_RESPMEM_MUST_FREE);
}

static enum MHD_Result send_reply(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	struct MHD_Response *resp = NULL;
	const char *type = NULL;
	enum MHD_Result ret;

	if (rp->status == 0)
		tr_api_fail(rp, 500, "internal", NULL, "the handler produced no reply");
	if (rp->stream) {
		resp = rp->stream;
		rp->stream = NULL;
	} else if (rp->json) {
		resp = json_response(rp->json);
		type = "application/json";
	} else if (rp->text) {
		resp = MHD_create_response_from_buffer(rp->text_len, rp->text, MHD_RESPMEM_MUST_FREE);
		if (resp)
			rp->text = NULL;
		type = rp->content_type ? rp->content_type : "text/plain; charset=utf-8";
	} else {
		resp = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
	}
	/* Whatever is left of the request is the client's to send at its
	 * pace now: the request deadline is for getting one in. */
	tr_api_limits_request_read(rq);
	if (!resp) {
		tr_api_reply_finish(rp);
		rq->answered = true;
		return MHD_NO;
	}
	tr_prom_request_done(rq->route, rp->status, tr_prom_clock() - rq->started);
	if (type)
		MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
	for (int i = 0; i < rp->nheaders; i++)
		MHD_add_response_header(resp, rp->headers[i].name, rp->headers[i].value);
	ret = MHD_queue_response(rq->conn, (unsigned int)rp->status, resp);
	MHD_destroy_response(resp);
	tr_api_reply_finish(rp);
	rq->answered = true;
	return ret;
}

/* ---- admission ---- */

/* application/json, with or without parameters such as charset. */
static bool is_json_type(const char *v)
{
	size_t n;

	if (!v)
		return false;
	while (*v == ' ' || *v == '\t')
		v++;
	n = strlen("application/json");
	if (strncasecmp(v, "application/json", n) != 0)
		return false;
	v += n;
	while (*v == ' ' || *v == '\t')
		v++;
	return *v == '\0' || *v == ';';
}

/* An optional body that is not there: no Content-Length or 0, and not
 * chunked. */
static bool body_left_out(const struct tr_api_request *rq)
{
	const char *len, *te;

	if (!(rq->route->flags & TR_ROUTE_BODY_OPTIONAL))
		return false;
	len = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
	te = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
	return !te && (!len || strcmp(len, "0") == 0);
}

/* The 413 for a body over the cap: with its size when the client declared
 * one (Content-Length), else (a chunked body) just the cap. */
static void fail_too_large(struct tr_api_reply *rp, size_t max_body, int64_t declared_len)
{
	if (declared_len > 0)
		tr_api_fail(rp, 413, "payload_too_large", NULL, "the request body is %lld bytes; the limit is %zu",
			    (long long)declared_len, max_body);
	else
		tr_api_fail(rp, 413, "payload_too_large", NULL, "the request body is over the limit of %zu bytes",
			    max_body);
}

struct length_scan {
	const char *first;
	bool conflict;
};

static enum MHD_Result scan_length(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
	struct length_scan *ls = cls;

	(void)kind;
	if (!key || strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) != 0)
		return MHD_YES;
	if (!ls->first)
		ls->first = value ? value : "";
	else if (strcmp(ls->first, value ? value : "") != 0)
		ls->conflict = true;
	return MHD_YES;
}

/* Two Content-Length headers that disagree leave the body's end up to
 * whoever reads the request (MHD takes the first, a proxy in front may
 * take the last): the classic request-smuggling set-up, refused with the
 * connection closed.  Repeats of one value are harmless (RFC 9110 §8.6). */
static int check_lengths(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	struct length_scan ls = {0};

	MHD_get_connection_values(rq->conn, MHD_HEADER_KIND, scan_length, &ls);
	if (!ls.conflict)
		return 0;
	tr_api_fail(rp, 400, "invalid_request", NULL, "the request has Content-Length headers that disagree");
	tr_api_reply_header(rp, MHD_HTTP_HEADER_CONNECTION, "close");
	return -1;
}

/* Keeps rp's refusal to answer once the body is over (rq->held). */
static int hold_reply(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	rq->held = malloc(sizeof(*rq->held));
	if (!rq->held)
		return -1;
	*rq->held = *rp;
	memset(rp, 0, sizeof(*rp));
	return 0;
}

/* Admits an upload: opens it, or refuses now (a client waiting for "100
 * Continue", a body too large to drop) or after its body (others, which
 * are already sending and would see a reset instead of the answer). */
static int admit_upload(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	const char *v = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
	int64_t len = -1;

	if (v && tr_api_parse_int(v, 0, INT64_MAX, &len) < 0) {
		tr_api_fail(rp, 400, "invalid_request", NULL, "Content-Length '%.40s' is not a byte count", v);
		return -1;
	}
	rq->upload_len = len;
	rq->upload_ops = rq->route->handler == tr_api_report_file_put ? &tr_api_report_upload_ops
								      : &tr_api_datasets_upload_ops;
	if (rq->upload_ops->begin(rq, rp, len) == 0) {
		tr_api_limits_request_read(rq);
		return 0;
	}
	const char *expect = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
	bool waits = expect && strcasecmp(expect, "100-continue") == 0;
	if (waits || len > (int64_t)DISCARD_LIMIT || hold_reply(rq, rp) < 0)
		return -1;
	return 0;
}

/* One piece of an upload's body.  false closes the connection. */
static bool take_upload(struct tr_api_request *rq, const char *data, size_t size)
{
	struct tr_api_reply rp = {0};

	if (!rq->held && rq->upload_ops->data(rq, &rp, data, size) < 0 && hold_reply(rq, &rp) < 0) {
		tr_api_reply_finish(&rp);
		return false;
	}
	if (!rq->held)
		return true;
	rq->discarded += size;
	/* A full disk found midway: the client is past "100 Continue" and
	 * sending, so cutting it off at the discard limit showed it a broken
	 * pipe instead of the 507.  The rest of a declared body is read and
	 * dropped (no disk, and the client sends it in any case); a chunked
	 * body, of no known end, is still cut off past the limit. */
	size_t limit = DISCARD_LIMIT;
	if (rq->held->status == 507 && rq->upload_len > (int64_t)limit)
		limit = (size_t)rq->upload_len;
	return rq->discarded <= limit;
}

/* Runs on the request's headers.  Returns -1 with rp filled when the
 * request is answered now. */
static int admit(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	tr_api_t *api = rq->api;
	const char *v;
	bool known;
	int64_t len;

	/* HEAD is GET without the body (MHD drops it), for probes that
	 * only look at the status. */
	const char *method = strcmp(rq->method, MHD_HTTP_METHOD_HEAD) == 0 ? MHD_HTTP_METHOD_GET : rq->method;

	if (check_lengths(rq, rp) < 0 || tr_api_url_check(rq, rp) < 0)
		return -1;
	rq->route = tr_api_route_match(method, rq->url, rq->params, TR_API_MAX_PARAMS, &rq->nparams, &known);
	rq->max_body = atomic_load(&api->max_body);
	if (tr_api_origin_check(rq, rp) < 0 || tr_api_auth_check(rq, rp) < 0)
		return -1;
	if (!rq->route && !known) {
		tr_api_fail(rp, 404, "not_found", NULL, "no route for %s", rq->url);
		return -1;
	}
	if (!rq->route) {
		char allow[128];

		tr_api_route_allow(rq->url, allow, sizeof(allow));
		tr_api_fail(rp, 405, "method_not_allowed", NULL, "%s is not allowed on %s (allowed: %s)", rq->method,
			    rq->url, allow);
		tr_api_reply_header(rp, MHD_HTTP_HEADER_ALLOW, allow);
		return -1;
	}
	if (rq->route->flags & TR_ROUTE_UPLOAD)
		return admit_upload(rq, rp);
	if ((rq->route->flags & TR_ROUTE_JSON_BODY) && !body_left_out(rq)) {
		v = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
		if (!is_json_type(v)) {
			tr_api_fail(rp, 415, "unsupported_media_type", NULL,
				    "Content-Type must be application/json, not %s", v ? v : "(none)");
			return -1;
		}
	}
	v = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
	if (v && tr_api_parse_int(v, 0, INT64_MAX, &len) == 0 && (uint64_t)len > rq->max_body) {
		/* A client that does not wait for "100 Continue" is already
		 * sending: answering now closes the connection under it, and it
		 * may see a reset instead of the 413.  So a body within the
		 * discard limit is read and dropped first (on_request answers at
		 * its end); one that waits, or a huge one, is answered now. */
		const char *expect = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
		bool waits = expect && strcasecmp(expect, "100-continue") == 0;
		if (!waits && (uint64_t)len - rq->max_body <= DISCARD_LIMIT) {
			rq->too_large = true;
			rq->declared_len = len;
			return 0;
		}
		fail_too_large(rp, rq->max_body, len);
		return -1;
	}
	return 0;
}

/* Buffers (or discards) one piece of body.  false closes the connection. */
static bool take_body(struct tr_api_request *rq, const char *data, size_t size)
{
	size_t cap = rq->max_body;

	if (!rq->too_large && size > cap - rq->body_len) {
		rq->too_large = true;
		free(rq->body);
		rq->body = NULL;
		rq->body_len = rq->body_cap = 0;
	}
	if (rq->too_large) {
		rq->discarded += size;
		return rq->discarded <= DISCARD_LIMIT + cap;
	}
	/* Bodies of other routes are read so the connection stays usable,
	 * but nothing looks at them. */
	if (!(rq->route->flags & TR_ROUTE_JSON_BODY)) {
		rq->body_len += size;
		return true;
	}
	if (rq->body_len + size + 1 > rq->body_cap) {
		size_t ncap = rq->body_cap ? rq->body_cap : 4096;
		char *nb;

		while (ncap < rq->body_len + size + 1)
			ncap *= 2;
		if (ncap > cap + 1)
			ncap = cap + 1;
		nb = realloc(rq->body, ncap);
		if (!nb)
			return false;
		rq->body = nb;
		rq->body_cap = ncap;
	}
	memcpy(rq->body + rq->body_len, data, size);
	rq->body_len += size;
	rq->body[rq->body_len] = '\0';
	return true;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
				  const char *version, const char *upload_data, size_t *upload_data_size,
				  void **con_cls)
{
	struct tr_api_request *rq = *con_cls;
	struct tr_api_reply rp = {0};

	(void)version;
	if (!rq) {
		rq = calloc(1, sizeof(*rq));
		if (!rq)
			return MHD_NO;
		*con_cls = rq;
		rq->api = cls;
		rq->conn = conn;
		rq->method = method;
		rq->url = url;
		rq->started = tr_prom_clock();
		tr_api_stamp(rq->api);
		if (admit(rq, &rp) < 0)
			return send_reply(rq, &rp);
		return MHD_YES;
	}
	if (*upload_data_size) {
		bool ok = rq->route && (rq->route->flags & TR_ROUTE_UPLOAD)
				  ? take_upload(rq, upload_data, *upload_data_size)
				  : take_body(rq, upload_data, *upload_data_size);

		*upload_data_size = 0;
		return ok ? MHD_YES : MHD_NO;
	}
	if (rq->answered)
		return MHD_YES;
	if (rq->held) {
		rp = *rq->held;
		free(rq->held);
		rq->held = NULL;
		if (rq->upload_ops)
			rq->upload_ops->cleanup(rq);
		return send_reply(rq, &rp);
	}
	if (rq->too_large) {
		fail_too_large(&rp, rq->max_body, rq->declared_len);
		return send_reply(rq, &rp);
	}
	rq->route->handler(rq, &rp);
	return send_reply(rq, &rp);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode why)
{
	struct tr_api_request *rq = *con_cls;

	(void)why;
	tr_api_limits_request_done(cls, conn);
	if (!rq)
		return;
	/* A broken upload's partial file goes with its request. */
	if (rq->upload_ops)
		rq->upload_ops->cleanup(rq);
	if (rq->held) {
		tr_api_reply_finish(rq->held);
		free(rq->held);
	}
	free(rq->body);
	free(rq);
	*con_cls = NULL;
}

/* ---- lifecycle ---- */

bool tr_api_is_loopback(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)sa;

		return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
	}
	if (sa->sa_family == AF_INET6) {
		const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;

		if (IN6_IS_ADDR_LOOPBACK(a))
			return true;
		return IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127;
	}
	return false;
}

static void free_api(tr_api_t *api)
{
	if (!api)
		return;
	tr_api_limits_finish(api);
	tr_api_auth_free(api->auth, api->n_auth);
	pthread_rwlock_destroy(&api->auth_lock);
	if (api->tls_key) {
		explicit_bzero(api->tls_key, strlen(api->tls_key));
		free(api->tls_key);
	}
	free(api->tls_cert);
	free(api->listen_host);
	free(api->version);
	free(api->openapi_path);
	free(api);
}

/* Fills the connection limits left at 0, fits them to each other and
 * refuses a stall limit that would cut streams that are merely quiet. */
static int limit_defaults(struct tr_api_config *c, struct tr_error *e)
{
	if (c->max_connections <= 0)
		c->max_connections = TR_API_DEFAULT_MAX_CONNECTIONS;
	if (c->max_connections_per_client <= 0)
		c->max_connections_per_client = TR_API_DEFAULT_MAX_CONNECTIONS_PER_CLIENT;
	if (c->connection_reserve <= 0)
		c->connection_reserve = TR_API_DEFAULT_CONNECTION_RESERVE;
	if (c->request_timeout_s <= 0)
		c->request_timeout_s = TR_API_DEFAULT_REQUEST_TIMEOUT_S;
	if (c->max_streams <= 0)
		c->max_streams = TR_API_DEFAULT_MAX_STREAMS;
	if (c->max_streams_per_client <= 0)
		c->max_streams_per_client = TR_API_DEFAULT_MAX_STREAMS_PER_CLIENT;
	if (!c->sse_buffer_bytes)
		c->sse_buffer_bytes = TR_API_DEFAULT_SSE_BUFFER;
	if (c->sse_stall_s <= 0)
		c->sse_stall_s = TR_API_DEFAULT_SSE_STALL_S > 4 * c->sse_heartbeat_s ? TR_API_DEFAULT_SSE_STALL_S
										     : 4 * c->sse_heartbeat_s;
	/* A per-client cap above the global one is the global one; the
	 * reserve may shrink to fit a small server, never to nothing. */
	if (c->connection_reserve >= c->max_connections)
		c->connection_reserve = c->max_connections / 4;
	if (c->sse_stall_s <= c->sse_heartbeat_s) {
		/* A healthy stream writes at least every heartbeat; a stall
		 * limit below that would cut streams that are merely quiet. */
		tr_error_set(e, 0, 0, NULL, "sse-stall-timeout (%d s) must be above sse-heartbeat (%d s)",
			     c->sse_stall_s, c->sse_heartbeat_s);
		return -1;
	}
	return 0;
}

/* Copies the caller's strings so the API does not depend on their
 * lifetime.  Refuses empty token lists and empty tokens (api/auth.c):
 * either would lock every client out (or, worse, match an empty header). */
static int copy_config(tr_api_t *api, const struct tr_api_config *cfg, struct tr_error *e)
{
	api->cfg = *cfg;
	if (!api->cfg.max_body)
		api->cfg.max_body = TR_API_DEFAULT_MAX_BODY;
	if (api->cfg.sse_heartbeat_s <= 0)
		api->cfg.sse_heartbeat_s = TR_API_DEFAULT_HEARTBEAT_S;
	if (api->cfg.sse_max_idle_s <= 0)
		api->cfg.sse_max_idle_s = TR_API_DEFAULT_SSE_IDLE_S;
	if (limit_defaults(&api->cfg, e) < 0)
		return -1;
	api->listen_host = strdup(cfg->listen_host && *cfg->listen_host ? cfg->listen_host : "127.0.0.1");
	api->version = strdup(cfg->version ? cfg->version : "unknown");
	if (!api->listen_host || !api->version)
		goto oom;
	if (cfg->openapi_path && !(api->openapi_path = strdup(cfg->openapi_path)))
		goto oom;
	if (tr_api_auth_build(cfg->tokens, cfg->role_tokens, cfg->n_role_tokens, &api->auth, &api->n_auth, e) < 0)
		return -1;
	atomic_init(&api->max_body, api->cfg.max_body);
	api->cfg.listen_host = api->listen_host;
	api->cfg.version = api->version;
	api->cfg.openapi_path = api->openapi_path;
	/* Owned by the auth table from here on (api/auth.c). */
	api->cfg.tokens = NULL;
	api->cfg.role_tokens = NULL;
	api->cfg.n_role_tokens = 0;
	api->cfg.tls_cert_path = api->cfg.tls_key_path = NULL;
	return 0;
oom:
	tr_error_set(e, 0, 0, NULL, "out of memory");
	return -1;
}

/* Binds ourselves rather than through MHD so a failure comes back with
 * its errno ("address in use") instead of a bare NULL. */
static int bind_listener(tr_api_t *api, bool *ipv6, struct tr_error *e)
{
	struct addrinfo hints = {0}, *res = NULL;
	char port[16];
	int fd = -1, one = 1, rc;

	if (api->cfg.port < 0 || api->cfg.port > 65535) {
		tr_error_set(e, 0, 0, NULL, "port %d is out of range", api->cfg.port);
		return -1;
	}
	snprintf(port, sizeof(port), "%d", api->cfg.port);
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
	rc = getaddrinfo(api->listen_host, port, &hints, &res);
	if (rc != 0) {
		tr_error_set(e, 0, 0, NULL, "listen address %s: %s", api->listen_host, gai_strerror(rc));
		return -1;
	}
	api->loopback = tr_api_is_loopback(res->ai_addr);
	if (!api->loopback && api->n_auth == 0) {
		tr_error_set(e, 0, 0, NULL,
			     "listening on %s (not loopback) needs bearer tokens: anyone who can reach the port "
			     "could submit and cancel jobs",
			     api->listen_host);
		goto fail;
	}
	*ipv6 = res->ai_family == AF_INET6;
	fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		tr_error_set(e, 0, 0, NULL, "socket: %s", strerror(errno));
		goto fail;
	}
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, res->ai_addr, res->ai_addrlen) < 0) {
		tr_error_set(e, 0, 0, NULL, "cannot listen on %s port %d: %s", api->listen_host, api->cfg.port,
			     strerror(errno));
		goto fail;
	}
	if (listen(fd, 128) < 0) {
		tr_error_set(e, 0, 0, NULL, "listen: %s", strerror(errno));
		goto fail;
	}
	freeaddrinfo(res);
	return fd;
fail:
	if (fd >= 0)
		close(fd);
	freeaddrinfo(res);
	return -1;
}

static int bound_port(int fd)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);

	if (getsockname(fd, (struct sockaddr *)&ss, &len) < 0)
		return -1;
	if (ss.ss_family == AF_INET)
		return ntohs(((struct sockaddr_in *)&ss)->sin_port);
	return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
}

tr_api_t *tr_api_start(const struct tr_api_config *cfg, struct tr_error *e)
{
	unsigned int flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
			     MHD_USE_ITC;
	tr_api_t *api;
	bool ipv6 = false;
	int fd;

	if (!cfg->store) {
		tr_error_set(e, 0, 0, NULL, "the API needs a store");
		return NULL;
	}
	api = calloc(1, sizeof(*api));
	if (!api) {
		tr_error_set(e, 0, 0, NULL, "out of memory");
		return NULL;
	}
	atomic_init(&api->stopping, false);
	atomic_init(&api->last_accept_ns, 0);
	pthread_rwlock_init(&api->auth_lock, NULL);
	if (copy_config(api, cfg, e) < 0)
		goto fail_api;
	if (tr_api_limits_init(api, e) < 0)
		goto fail_api;
	if (tr_api_tls_load(api, cfg, e) < 0)
		goto fail_api;
	if (cfg->use_listen_fd)
		fd = tr_api_adopt_listener(api, cfg->listen_fd, &ipv6, e);
	else
		fd = bind_listener(api, &ipv6, e);
	if (fd < 0)
		goto fail_api;
	api->port = bound_port(fd);
	tr_api_set_probe_addr(api, fd);
	if (ipv6)
		flags |= MHD_USE_IPv6;
	struct MHD_OptionItem tls[] = {
		{MHD_OPTION_HTTPS_MEM_CERT, 0, api->tls_cert},
		{MHD_OPTION_HTTPS_MEM_KEY, 0, api->tls_key},
		{MHD_OPTION_END, 0, NULL},
	};
	if (api->tls_cert)
		flags |= MHD_USE_TLS;
	api->mhd = MHD_start_daemon(flags, 0, tr_api_limits_accept, api, on_request, api, MHD_OPTION_LISTEN_SOCKET, fd,
				    MHD_OPTION_CONNECTION_LIMIT, (unsigned int)api->cfg.max_connections,
				    MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)TR_API_CONNECTION_TIMEOUT_S,
				    MHD_OPTION_NOTIFY_COMPLETED, on_completed, api, MHD_OPTION_UNESCAPE_CALLBACK,
				    tr_api_unescape, api, MHD_OPTION_NOTIFY_CONNECTION, tr_api_limits_notify, api,
				    MHD_OPTION_ARRAY, api->tls_cert ? tls : tls + 2, MHD_OPTION_END);
	if (!api->mhd) {
		/* The socket is not closed here: whether MHD already closed it
		 * on its failure path differs between versions, and closing a
		 * descriptor number another thread may have reused is worse
		 * than leaking one on a path that ends the daemon anyway. */
		tr_error_set(e, 0, 0, NULL, "cannot start the HTTP%s server on %s port %d%s", api->tls_cert ? "S" : "",
			     api->listen_host, api->port,
			     api->tls_cert ? " (is tls-key the key of tls-cert, both PEM?)" : "");
		goto fail_api;
	}
	tr_api_metrics_cache_start(api->cfg.store);
	return api;
fail_api:
	free_api(api);
	return NULL;
}

int tr_api_port(const tr_api_t *api)
{
	return api ? api->port : -1;
}

void tr_api_set_max_body(tr_api_t *api, size_t max_body)
{
	atomic_store(&api->max_body, max_body ? max_body : TR_API_DEFAULT_MAX_BODY);
}

void tr_api_stop(tr_api_t *api)
{
	if (!api)
		return;
	/* SSE callbacks check the flag between waits of at most a second;
	 * the wake cuts the current wait short. */
	atomic_store(&api->stopping, true);
	tr_store_wake_all(api->cfg.store);
	MHD_stop_daemon(api->mhd);
	tr_api_metrics_cache_forget(api->cfg.store);
	free_api(api);
}
