/* Shared state of the API's source files: the server, one request, one
 * reply, and the helpers every handler uses (error replies, query and path
 * parameters, request bodies, job lookups).  Handlers never touch
 * libmicrohttpd responses directly except the SSE handler, which hands the
 * server a ready streaming response; everything else is a status, a JSON
 * body (or text) and a few headers that server.c turns into a response.
 */
#ifndef TR_API_INTERNAL_H
#define TR_API_INTERNAL_H

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/api.h"
#include "api/routes.h"

#define TR_API_DEFAULT_MAX_BODY ((size_t)1 << 20)
#define TR_API_DEFAULT_HEARTBEAT_S 15
#define TR_API_DEFAULT_SSE_IDLE_S 3600
/* Enough threads for a dashboard per user and many SSE streams, few
 * enough that a connection flood cannot exhaust the process. */
#define TR_API_DEFAULT_MAX_CONNECTIONS 512
#define TR_API_DEFAULT_MAX_CONNECTIONS_PER_CLIENT 64
#define TR_API_DEFAULT_CONNECTION_RESERVE 64
#define TR_API_DEFAULT_REQUEST_TIMEOUT_S 30
#define TR_API_DEFAULT_MAX_STREAMS 256
#define TR_API_DEFAULT_MAX_STREAMS_PER_CLIENT 16
/* Enough for a burst of events, small enough that many streams whose
 * clients do not read cannot exhaust memory. */
#define TR_API_DEFAULT_SSE_BUFFER ((size_t)256 << 10)
#define TR_API_DEFAULT_SSE_STALL_S 60
/* Idle keep-alive and slow clients are dropped after this (SSE streams
 * turn it off for themselves). */
#define TR_API_CONNECTION_TIMEOUT_S 60
#define TR_API_MAX_PARAMS 2
#define TR_API_MAX_HEADERS 4

/* limits.c's state: the accepted connections and the deadline reaper. */
struct tr_api_limits {
	pthread_mutex_t lock;
	pthread_cond_t wake;
	struct tr_api_conn *head; /* under lock */
	int count;                /* under lock */
	pthread_t reaper;
	bool initialized, reaper_started, stop;
	atomic_ulong refused; /* connections refused by the accept policy */
	atomic_ulong cut;     /* requests cut at their deadline */
};

struct tr_api {
	struct MHD_Daemon *mhd;
	/* A copy of the caller's config whose strings point into the owned
	 * copies below, so the caller may free its own after tr_api_start. */
	struct tr_api_config cfg;
	char *listen_host;
	char *version;
	char *openapi_path;
	/* Accepted tokens (api/auth.c); n_auth == 0 = no auth.  Swapped
	 * whole under the write lock by a configuration reload. */
	pthread_rwlock_t auth_lock;
	struct tr_api_auth_entry *auth;
	size_t n_auth;
	atomic_uint auth_gen; /* bumped by each swap of the table */
	bool loopback;        /* the listener is on loopback */
	char *tls_cert;       /* PEM text, or NULL for plain HTTP */
	char *tls_key;
	_Atomic size_t max_body; /* changes on reload; each request keeps its own */
	int port;
	atomic_bool stopping;
	struct tr_api_limits limits;
	/* Liveness for the service watchdog (api/listen.c). */
	atomic_llong last_accept_ns;
	struct sockaddr_storage probe_addr;
	socklen_t probe_len;
};

struct tr_api_auth_entry {
	enum tr_api_role role;
	char *token;
	size_t len;
};

/* One HTTP request, alive from its headers until MHD reports it done. */
struct tr_api_request {
	tr_api_t *api;
	struct MHD_Connection *conn;
	const char *method; /* owned by MHD, valid for the request */
	const char *url;
	const struct tr_api_route *route;
	/* Path parameters ("{id}") in pattern order, NUL-terminated copies. */
	char params[TR_API_MAX_PARAMS][32];
	int nparams;
	char *body; /* NUL-terminated; only buffered for routes that take one */
	size_t body_len, body_cap;
	size_t discarded;     /* bytes thrown away past the cap */
	bool too_large;       /* the body went past cfg.max_body */
	int64_t declared_len; /* Content-Length when it alone made the body too large */
	size_t max_body;      /* the body cap when the request arrived */
	bool answered;        /* a response was queued */
	void *upload;         /* an upload route's state (api/datasets.c), until committed or aborted */
	const struct tr_api_upload_ops *upload_ops; /* the upload route's, from its admission */
	int64_t upload_len;                         /* an upload's Content-Length; -1 when chunked */
	struct tr_api_reply *held;                  /* a refusal answered once the body has been read and dropped */
	double started;                             /* tr_prom_clock() at the headers, for /metrics */
};

struct tr_api_header {
	const char *name; /* static string */
	char *value;      /* owned */
};

/* What a handler produces.  Exactly one of json, text and stream is set,
 * or none for an empty body (204, 202 without a job). */
struct tr_api_reply {
	int status;
	json_t *json; /* owned; rendered compact plus "\n" */
	char *text;   /* owned */
	size_t text_len;
	const char *content_type;    /* for text; static string */
	struct MHD_Response *stream; /* owned until queued */
	struct tr_api_header headers[TR_API_MAX_HEADERS];
	int nheaders;
};

/* ---- auth.c ---- */

/* Builds the token table from plain tokens (all admin) and role tokens;
 * both may be empty (no auth) but a non-NULL empty plain list is refused.
 * *out is freed with tr_api_auth_free. */
int tr_api_auth_build(const char *const *tokens, const struct tr_api_token *role_tokens, size_t n_role,
		      struct tr_api_auth_entry **out, size_t *count, struct tr_error *err);
void tr_api_auth_free(struct tr_api_auth_entry *v, size_t n);
/* Checks the request's bearer token against the role its route needs.
 * 0, or -1 with 401/403 in rp. */
int tr_api_auth_check(struct tr_api_request *rq, struct tr_api_reply *rp);
/* The role the request's bearer token grants (admin when the daemon has
 * no tokens: every request may do everything); *tokens says whether it
 * has any. */
enum tr_api_role tr_api_auth_role(struct tr_api_request *rq, bool *tokens);
/* A counter that changes whenever the tokens do (a reload). */
unsigned tr_api_auth_generation(tr_api_t *api);
/* Whether the Authorization header value (may be NULL) still grants need
 * under the tokens now in force: for responses that outlive their
 * admission, such as event streams. */
bool tr_api_auth_still_allows(tr_api_t *api, const char *authorization, enum tr_api_role need);

/* ---- report.c ---- */

/* The check of a report route (TR_ROUTE_JOB_TOKEN): the job's own report
 * token, or a role token with the route's role.  0, or -1 with 401 (no
 * token, not the job's) or 403 (another job's, a role too low) in rp. */
int tr_api_report_auth(struct tr_api_request *rq, struct tr_api_reply *rp);

/* ---- url.c ---- */

/* MHD_OPTION_UNESCAPE_CALLBACK: MHD's decoding, with a decoded NUL kept
 * visible as 0x7f. */
size_t tr_api_unescape(void *cls, struct MHD_Connection *conn, char *s);
/* 400 for a path or query with a control character.  0 or -1 with rp. */
int tr_api_url_check(struct tr_api_request *rq, struct tr_api_reply *rp);

/* ---- origin.c ---- */

/* Refuses a foreign Host when no tokens are configured, and a request
 * other than GET/HEAD from another origin or site (api/origin.c).  0, or
 * -1 with 403 in rp. */
int tr_api_origin_check(struct tr_api_request *rq, struct tr_api_reply *rp);

/* ---- listen.c ---- */

bool tr_api_is_loopback(const struct sockaddr *sa);
/* Records that the HTTP side is alive (an accepted connection, a request). */
void tr_api_stamp(tr_api_t *api);
void tr_api_set_probe_addr(tr_api_t *api, int fd);
/* Checks a passed listening socket and takes its address; fd or -1. */
int tr_api_adopt_listener(tr_api_t *api, int fd, bool *ipv6, struct tr_error *e);
/* Reads cfg's tls-cert and tls-key when set.  0 or -1 with err. */
int tr_api_tls_load(tr_api_t *api, const struct tr_api_config *cfg, struct tr_error *e);

/* ---- errors.c ---- */

/* The one error helper: replaces whatever the reply held with
 * {"error": {"code", "message"[, "pointer"]}} and the status.  pointer
 * may be NULL or "". */
void tr_api_fail(struct tr_api_reply *rp, int status, const char *code, const char *pointer, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));
/* A refusal from a daemon operation: the status and code of its kind
 * from the one table in api/errors.c; a kind of 0 (the op forgot to fill
 * err) becomes 500 "internal". */
void tr_api_fail_op(struct tr_api_reply *rp, const struct tr_error *err);
/* tr_api_fail_op, and for an invalid spec the list of its problems as
 * "errors" ([{"message", "pointer"}], err's alone when `all` has none). */
void tr_api_fail_problems(struct tr_api_reply *rp, const struct tr_error *err, const struct tr_error_list *all);
/* The same for a domain error found by the API itself (an unknown job, a
 * missing operation). */
void tr_api_fail_kind(struct tr_api_reply *rp, enum tr_job_err kind, const char *pointer, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/* The HTTP status the API answers a domain error kind with. */
int tr_api_status_of(enum tr_job_err kind);
/* A store failure: 500 "internal" with the message of the struct the
 * store function filled. */
void tr_api_fail_store_err(struct tr_api_reply *rp, const struct tr_error *e, const char *what);

/* ---- request.c ---- */

/* Adds a response header; value is copied.  Silently drops headers past
 * TR_API_MAX_HEADERS, which only a programming error can reach. */
void tr_api_reply_header(struct tr_api_reply *rp, const char *name, const char *value);
/* Sets a JSON body; takes the reference. */
void tr_api_reply_json(struct tr_api_reply *rp, int status, json_t *body);
/* Drops whatever body and headers the reply holds. */
void tr_api_reply_finish(struct tr_api_reply *rp);
/* The bytes of a JSON reply: compact, then "\n".  0, or -1 out of memory. */
int tr_api_render_json(const json_t *body, char **out, size_t *len);

/* A query argument (already percent-decoded by MHD) or NULL. */
const char *tr_api_query(const struct tr_api_request *rq, const char *name);
/* Integer query argument in [min, max]; def when absent.  On error fills
 * rp with 400 "invalid_parameter" naming the parameter, returns -1. */
int tr_api_query_int(const struct tr_api_request *rq, struct tr_api_reply *rp, const char *name, int64_t min,
		     int64_t max, int64_t def, int64_t *out);
/* "true" or "false"; def when absent; -1 with rp filled otherwise. */
int tr_api_query_bool(const struct tr_api_request *rq, struct tr_api_reply *rp, const char *name, bool def, bool *out);
/* A submit's place in the queue, ?priority= (-1000..1000, default 0) and
 * ?preemptible= (default false): POST /jobs and POST /experiments take
 * the same, as an experiment's trials are jobs (api/jobs.c).  -1 with
 * the 400 written. */
int tr_api_query_queue_place(const struct tr_api_request *rq, struct tr_api_reply *rp, int64_t *priority,
			     bool *preemptible);
/* Parses text as an integer in [min, max]; 0 or -1, no reply. */
int tr_api_parse_int(const char *text, int64_t min, int64_t max, int64_t *out);
/* The "{id}" path parameter as a positive job id; -1 with 400
 * "invalid_parameter" in rp otherwise. */
int tr_api_path_id(const struct tr_api_request *rq, struct tr_api_reply *rp, int64_t *id);
/* Parses the request body as a JSON object.  New reference in *out, or
 * -1 with 400 "invalid_json" / "invalid_request" in rp. */
int tr_api_body_object(const struct tr_api_request *rq, struct tr_api_reply *rp, json_t **out);

/* Writes prefix + "/" + key, the key escaped as RFC 6901 asks ("~0",
 * "~1"); cut to len. */
void tr_api_pointer(char *buf, size_t len, const char *prefix, const char *key);

/* ---- job_json.c ---- */

/* Loads a job row; -1 with 404 "not_found" (or 500) in rp.  On success
 * the caller finishes the row with tr_job_row_finish. */
int tr_api_load_job(tr_api_t *api, struct tr_api_reply *rp, int64_t id, struct tr_job_row *row);
/* Loads a job, merges its live progress and sets it as the reply's body
 * with the given status; fills an error otherwise. */
void tr_api_reply_job(tr_api_t *api, struct tr_api_reply *rp, int status, int64_t id);
/* A job's live progress as JSON (new reference), or NULL when the job is
 * in a terminal state, not running here, or the daemon offers none: the
 * one place the daemon's figures become JSON. */
json_t *tr_api_live_json(tr_api_t *api, const struct tr_job_row *row);
/* The job's "summary": the latest loss, val_loss, val_accuracy,
 * samples_per_sec, data_wait_fraction and step, null where unknown (live
 * progress borrowed, may be NULL); new reference. */
json_t *tr_api_job_summary(tr_api_t *api, const struct tr_job_row *row, const json_t *live);
/* Formats Unix seconds as RFC 3339 UTC with milliseconds; new reference,
 * JSON null for 0 (not yet). */
json_t *tr_api_time_json(double t);

/* The daemon's devices into out[0..max) (api/misc.c); returns how many,
 * 0 when the daemon lists none.  GET /devices and /metrics both read
 * them here. */
int tr_api_devices_read(tr_api_t *api, struct tr_api_device *out, int max);

/* ---- limits.c ---- */

/* Starts the deadline reaper; -1 with err filled. */
int tr_api_limits_init(tr_api_t *api, struct tr_error *e);
/* Stops it; after MHD_stop_daemon.  Safe when init failed or never ran. */
void tr_api_limits_finish(tr_api_t *api);
/* MHD's accept policy (cls is the api): per-address cap and reserve. */
enum MHD_Result tr_api_limits_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen);
/* MHD's connection notification: adds and removes the records. */
void tr_api_limits_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
			  enum MHD_ConnectionNotificationCode code);
/* The request's headers and body are in: its deadline no longer applies. */
void tr_api_limits_request_read(struct tr_api_request *rq);
/* The response is done: the connection's next request has its deadline
 * from now, and any stream on it is closed. */
void tr_api_limits_request_done(tr_api_t *api, struct MHD_Connection *conn);
/* Admits an event stream on rq's connection: 0, or -1 with 503
 * "too_many_streams" in rp when the global or the per-address cap is
 * reached. */
int tr_api_limits_stream_open(struct tr_api_request *rq, struct tr_api_reply *rp);
/* Whether the client of a connection's socket fd closed or reset its end
 * (a poll that does not wait; false for fd < 0).  A half-close counts:
 * an event-stream client has nothing to send, but does not shut its
 * sending side down while it still reads. */
bool tr_api_peer_gone(int fd);

/* How an upload route (TR_ROUTE_UPLOAD) takes its body: begin on the
 * headers (declared is Content-Length, or -1; 0, or -1 with the refusal
 * in rp), data for each piece (0, or -1 with the refusal in rp, the
 * upload then aborted and rq->upload NULL), cleanup when the request
 * ends without the route's handler committing it (accepts rq->upload
 * NULL).  The route's handler commits. */
struct tr_api_upload_ops {
	int (*begin)(struct tr_api_request *rq, struct tr_api_reply *rp, int64_t declared);
	int (*data)(struct tr_api_request *rq, struct tr_api_reply *rp, const char *data, size_t size);
	void (*cleanup)(struct tr_api_request *rq);
};
/* PUT /datasets/{name}/{file} (datasets.c) and PUT
 * /jobs/{id}/report/{file} (report_upload.c). */
extern const struct tr_api_upload_ops tr_api_datasets_upload_ops, tr_api_report_upload_ops;

/* ---- datasets.c ---- */

/* An upload route's headers are in: checks the request and opens the
 * upload (rq->upload).  declared is Content-Length, or -1.  0, or -1 with
 * the refusal in rp. */
int tr_api_datasets_upload_begin(struct tr_api_request *rq, struct tr_api_reply *rp, int64_t declared);
/* One piece of the body.  0, or -1 with the refusal in rp (the upload is
 * then aborted and rq->upload NULL). */
int tr_api_datasets_upload_data(struct tr_api_request *rq, struct tr_api_reply *rp, const char *data, size_t size);
/* The request is over without a commit (a broken connection, a refusal):
 * deletes what was written.  Accepts rq->upload NULL. */
void tr_api_datasets_upload_cleanup(struct tr_api_request *rq);

/* ---- server.c ---- */

/* Wall-clock Unix seconds. */
double tr_api_now(void);

#endif
