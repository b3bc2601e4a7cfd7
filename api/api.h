/* The HTTP/JSON API server (libmicrohttpd + jansson).
 *
 * The API reads jobs, metrics, events and logs straight from the store and
 * asks the daemon, through a table of operations, for anything that
 * changes the queue or needs live state (submit, control, devices).  It
 * knows nothing of the scheduler's internals: the daemon fills
 * tr_api_ops and owns every decision; the API owns HTTP (routing, limits,
 * content types, error bodies, SSE framing).
 *
 * Errors are JSON: {"error": {"code": "...", "message": "...",
 * "pointer": "/json/pointer"}} with a fitting status (docs/design.md, API).
 */
#ifndef TR_API_H
#define TR_API_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "core/experiment.h"
#include "core/job.h"
#include "storage/checkpoints.h"
#include "storage/datasets.h"
#include "storage/store.h"

/* A daemon operation that refuses fills a struct tr_error
 * (core/error.h): a domain error kind (enum tr_job_err, core/job.h), the
 * message and the JSON pointer.  The API alone turns the kind into an
 * HTTP status and code (api/errors.c), so the daemon knows nothing of
 * HTTP and every route answers a kind the same way. */

/* A running job's figures from the daemon's memory, fresher than the
 * stored row (which the runner writes about once a second). */
struct tr_api_live {
	int64_t step, total_steps;
	int64_t epoch;  /* 0-based epoch of the last step */
	int64_t epochs; /* the run's epochs; 0 when only max_steps bounds it */
	double samples_per_sec, elapsed_s, eta_s, data_wait_fraction;
	double loss; /* NAN when there is none yet */
};

/* The most devices the API lists (the daemon's pool holds at most 64). */
#define TR_API_MAX_DEVICES 64

/* One training device as the daemon sees it (GET /devices, /metrics). */
struct tr_api_device {
	int id;
	char name[128];
	const char *kind;    /* the backend's name ("cpu", "cuda"); static */
	bool have_memory;    /* false when the backend cannot say */
	size_t memory_total; /* bytes */
	size_t memory_free;  /* bytes */
	int64_t job;         /* the job holding the device, 0 when free */
};

/* A control request: POST /jobs/{id}/cancel, /stop, /pause, /resume. */
struct tr_api_control {
	enum tr_job_request op; /* TR_JOB_CANCEL, _STOP, _PAUSE or _RESUME */
	/* resume only: the job's new end, as the spec fields of those names
	 * (0 = unchanged; at most one is set).  A stopped job may be given
	 * more steps than its spec had. */
	int64_t max_steps;
	int64_t epochs;
};

struct tr_api_submit {
	const json_t *spec; /* borrowed: the request body's job spec */
	const char *body;   /* the raw body text, for the idempotency hash */
	size_t body_len;
	const char *idempotency_key; /* or NULL */
	int priority;                /* from "?priority=" or 0 */
	bool preemptible;            /* from "?preemptible=true": a higher priority may preempt it */
	/* Out (may be NULL): every problem of a refused spec, the first of
	 * which the op's struct tr_error reports (docs/design.md §8). */
	struct tr_error_list *problems;
};

/* Implemented by the daemon.  Every function is called from API threads,
 * concurrently; each returns 0 or fills *err (and returns negative). */
/* One report of a worker job's rank 0 (POST /jobs/{id}/report), checked
 * by the API; its metric points the API stores itself. */
struct tr_api_report {
	bool have_progress;
	int64_t step, total_steps, epoch;
	double loss;         /* NAN when the report has none */
	const char *summary; /* the worker's summary, a JSON object text, or NULL */
};

struct tr_api_ops {
	/* Validates and queues a job; *job_id receives its id.  When the
	 * idempotency key matches an earlier request with the same body,
	 * returns 0 with that job's id and *replayed = true. */
	int (*submit)(void *ctx, const struct tr_api_submit *req, int64_t *job_id, bool *replayed,
		      struct tr_error *err);
	/* What the request does in the job's state is core/job.h's
	 * transition table; refusals are TR_JOB_E_ILLEGAL. */
	int (*control)(void *ctx, int64_t job_id, const struct tr_api_control *req, struct tr_error *err);
	int (*set_priority)(void *ctx, int64_t job_id, int priority, struct tr_error *err);
	/* Deletes a job in a terminal state with all its data (409 otherwise). */
	int (*remove)(void *ctx, int64_t job_id, struct tr_error *err);
	/* Fills out[0..max) with the daemon's devices and returns how many
	 * (never more than max); the API renders them (api/misc.c). */
	int (*devices)(void *ctx, struct tr_api_device *out, int max);
	/* A running job's live figures (data; the API renders them into the
	 * job's "progress"): true with *out filled when the job runs here and
	 * has made progress, false otherwise. */
	bool (*live_progress)(void *ctx, int64_t job_id, struct tr_api_live *out);
	/* Asks a running job for a checkpoint at its next step boundary
	 * (202); 404 unknown job, 409 when it is not running. */
	int (*checkpoint_now)(void *ctx, int64_t job_id, struct tr_error *err);
	/* Queues an evaluate job (POST /jobs/{id}/evaluate) for a checkpoint
	 * of job_id, the request body (borrowed) saying which and on what data:
	 * {"data": SOURCE, "checkpoint": "latest"|"best"|STEP, "devices": N,
	 * "batch_size": B}; *eval_id receives the new job's id.  400 with a
	 * pointer for a bad body, 404/409 when there is no such checkpoint,
	 * 422 for a path outside the data roots. */
	int (*evaluate)(void *ctx, int64_t job_id, const json_t *body, int64_t *eval_id, struct tr_error *err);
	/* Readiness: false while starting up or shutting down. */
	bool (*ready)(void *ctx);
	/* Asks the daemon to re-read its configuration (POST /reload, 202);
	 * NULL = 501. */
	int (*reload)(void *ctx, struct tr_error *err);
	/* Experiments (docs/experiments.md); NULL = 503 unavailable.
	 * experiment_submit validates the request body (borrowed) and stores
	 * the experiment with its priority and preemptible flag (which every
	 * trial job carries) (*id receives its id); problems (may be NULL) gets
	 * every problem of a refused one.  experiment_get renders one
	 * experiment as the API shows it (*out: new reference; 404 unknown).
	 * experiment_list renders a page of them in ascending id after
	 * `after`, of one state (NULL: any) (*out: a new array).
	 * experiment_control pauses (TR_JOB_PAUSE), resumes (TR_JOB_RESUME)
	 * or cancels (TR_JOB_CANCEL) a whole experiment; 409 when its state
	 * does not allow it. */
	int (*experiment_submit)(void *ctx, const json_t *body, int priority, bool preemptible, int64_t *id,
				 struct tr_error_list *problems, struct tr_error *err);
	int (*experiment_get)(void *ctx, int64_t id, json_t **out, struct tr_error *err);
	int (*experiment_list)(void *ctx, const char *state, int64_t after, int limit, json_t **out,
			       struct tr_error *err);
	int (*experiment_control)(void *ctx, int64_t id, enum tr_job_request op, struct tr_error *err);
	/* Experiments by state, counts[TR_EXP_NSTATES] indexed by enum
	 * tr_experiment_state, for GET /metrics (trainerd_experiments);
	 * NULL: that family is left out.  0, or -1 with err (the scrape
	 * is then 500, as when the job counts cannot be read). */
	int (*experiment_counts)(void *ctx, int64_t *counts, struct tr_error *err);
	/* A report of a worker job's rank 0 (docs/design.md, "Worker
	 * reports"): the job's live progress and, as it ends, its summary;
	 * from then on the API, not the file tail, is the job's source.  409
	 * when the job is not a worker job running here; NULL = 503. */
	int (*report)(void *ctx, int64_t job_id, const struct tr_api_report *r, struct tr_error *err);
	/* The folder of a worker job running here, where its uploaded files
	 * go (PUT /jobs/{id}/report/{file}); 409 otherwise, NULL = 503. */
	int (*report_folder)(void *ctx, int64_t job_id, char *dir, size_t n, struct tr_error *err);
};

/* Access roles, each including the ones below it (docs/design.md, API):
 * read = GET routes, event streams; write = submitting and controlling
 * jobs, pushing metrics; admin = deleting jobs, reloading the
 * configuration. */
enum tr_api_role { TR_ROLE_NONE = 0, TR_ROLE_READ = 1, TR_ROLE_WRITE = 2, TR_ROLE_ADMIN = 3 };

struct tr_api_token {
	enum tr_api_role role;
	const char *token; /* non-empty */
};

/* "read", "write", "admin"; "none" for anything else. */
const char *tr_api_role_name(enum tr_api_role role);
/* The role named by text[0..len), or TR_ROLE_NONE. */
enum tr_api_role tr_api_role_parse(const char *text, size_t len);

struct tr_api_config {
	const char *listen_host; /* "127.0.0.1" (default), "::1", "0.0.0.0" */
	int port;                /* 0 = ephemeral; see tr_api_port */
	size_t max_body;         /* default 1 MiB */
	int sse_heartbeat_s;     /* default 15 */
	int sse_max_idle_s;      /* a stream with no client activity ends after this; default 3600 */
	/* Connection and stream limits (docs/design.md, "Connection limits");
	 * 0 takes the default. */
	int max_connections;            /* all clients together; default 512 */
	int max_connections_per_client; /* one client address; default 64 */
	int connection_reserve;         /* slots kept for addresses holding few connections; default 64 */
	int request_timeout_s;          /* a request's headers and body must arrive within this; default 30 */
	int max_streams;                /* open event streams, all clients; default 256 */
	int max_streams_per_client;     /* open event streams of one client address; default 16 */
	size_t sse_buffer_bytes;        /* event bytes one stream holds at a time; default 256 KiB */
	int sse_stall_s;                /* a stream whose client reads nothing for this long is closed; default 60 */
	const char *const *tokens;      /* NULL-terminated bearer tokens; NULL = no auth
				      (refused by tr_api_start for a non-loopback host) */
	/* Tokens with roles (from a token file); with tokens above (all admin)
	 * they make up the accepted set.  Copied. */
	const struct tr_api_token *role_tokens;
	size_t n_role_tokens;
	/* A socket already bound and listening (socket activation), used
	 * instead of listen_host/port when use_listen_fd is set; the API owns
	 * it from then on. */
	bool use_listen_fd;
	int listen_fd;
	/* PEM files: both set = HTTPS only.  NULL = plain HTTP. */
	const char *tls_cert_path;
	const char *tls_key_path;
	const char *openapi_path; /* file served at GET /openapi.yaml, or NULL */
	const char *version;      /* for GET /version */
	tr_store_t *store;        /* borrowed */
	tr_datasets_t *datasets;  /* borrowed; NULL = no /datasets (404) */
	struct tr_api_ops ops;
	void *ctx; /* passed to every op */
};

typedef struct tr_api tr_api_t;

/* Binds and starts serving.  NULL with e's message filled (e.g. address in
 * use). */
tr_api_t *tr_api_start(const struct tr_api_config *cfg, struct tr_error *e);
/* The bound port (useful with port 0). */
int tr_api_port(const tr_api_t *api);
/* Whether the API serves HTTPS. */
bool tr_api_is_tls(const tr_api_t *api);
/* Replaces the accepted tokens (a configuration reload); same rules as at
 * start: both lists empty turns auth off, which is refused (-EINVAL, err
 * filled) when the listener is not on loopback. */
int tr_api_set_tokens(tr_api_t *api, const char *const *tokens, const struct tr_api_token *role_tokens,
		      size_t n_role_tokens, struct tr_error *err);
/* Changes the body size cap for requests that arrive from now on. */
void tr_api_set_max_body(tr_api_t *api, size_t max_body);
/* Liveness of the HTTP side, for the service watchdog: the monotonic time
 * (seconds) the listener last accepted a connection, and a probe that
 * opens (and drops) one connection to the listener so an idle daemon
 * still checks in.  0 or a negative errno. */
double tr_api_last_accept(const tr_api_t *api);
int tr_api_probe(const tr_api_t *api);
/* Stops accepting, ends every SSE stream, waits for in-flight requests,
 * frees.  Accepts NULL. */
void tr_api_stop(tr_api_t *api);

/* Renders a job row (plus live progress, borrowed, may be NULL) as the
 * API's job object; new reference.  Exposed for the daemon's tests. */
json_t *tr_api_job_json(const struct tr_job_row *row, const json_t *live);

#endif
