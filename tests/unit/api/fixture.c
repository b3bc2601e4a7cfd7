/* The API's unit-test fixture (tests/unit/api/fixture.h): a real store in
 * a temporary directory, the API started in-process on a loopback port
 * with fake daemon ops, and the tests' shared HTTP client
 * (tests/common/http_client.h) pointed at it.
 *
 * The fake ops keep the daemon's rules small but real: submit inserts a
 * row and honours Idempotency-Key by comparing request hashes; control
 * moves the state with the store (cancel of a finished job is 409);
 * remove only deletes finished jobs; checkpoint_now counts requests for
 * running jobs and refuses others with 409.
 */
#include "tests/unit/api/fixture.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

char dir[PATH_MAX];
tr_store_t *store;
tr_api_t *api;
int port;
const char *token; /* sent as Bearer when set */
atomic_bool daemon_ready = true;
atomic_int checkpoint_requests;

static void set_err(struct tr_error *err, enum tr_job_err kind, const char *pointer, const char *msg)
{
	tr_job_fail(err, kind, pointer, "%s", msg);
}

static char *body_hash(const char *body, size_t len, const char *key)
{
	uint64_t h = 1469598103934665603ull;
	char *out = malloc(17);

	for (size_t i = 0; i < len; i++)
		h = (h ^ (unsigned char)body[i]) * 1099511628211ull;
	for (const char *k = key ? key : ""; *k; k++)
		h = (h ^ (unsigned char)*k) * 1099511628211ull;
	snprintf(out, 17, "%016" PRIx64, h);
	return out;
}

double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int fake_submit(void *ctx, const struct tr_api_submit *req, int64_t *job_id, bool *replayed,
		       struct tr_error *err)
{
	struct tr_job_row row = {0}, old = {0};
	const char *name = json_string_value(json_object_get(req->spec, "name"));
	int64_t existing = 0;
	int rc;

	(void)ctx;
	if (json_object_get(req->spec, "bad")) {
		set_err(err, TR_JOB_E_INVALID_SPEC, "/bad", "/bad: unknown key");
		return -EINVAL;
	}
	row.name = strdup(name ? name : "job");
	row.priority = req->priority;
	row.spec = strndup(req->body, req->body_len);
	row.normalized = strdup(row.spec);
	row.devices = strdup("[]");
	row.idempotency_key = req->idempotency_key ? strdup(req->idempotency_key) : NULL;
	row.request_hash = body_hash(req->body, req->body_len, req->idempotency_key);
	row.submitted_at = now_s();
	row.loss = NAN;
	rc = tr_store_job_insert(store, &row, &existing, err);
	if (rc == -EEXIST) {
		tr_store_job_get(store, existing, &old, NULL);
		if (old.request_hash && strcmp(old.request_hash, row.request_hash) == 0) {
			*job_id = existing;
			*replayed = true;
			rc = 0;
		} else {
			set_err(err, TR_JOB_E_CONFLICT, NULL, "the key was used with another body");
		}
		tr_job_row_finish(&old);
	} else if (rc == 0) {
		*job_id = row.id;
	} else {
		err->kind = TR_JOB_E_INTERNAL; /* the store's message is in err */
	}
	tr_job_row_finish(&row);
	return rc;
}

static bool terminal(enum tr_job_state s)
{
	return tr_job_state_terminal(s);
}

/* The daemon's rule, from the job module's table; a running job's signal
 * takes effect at once here (there is no runner). */
static int fake_control(void *ctx, int64_t id, const struct tr_api_control *req, struct tr_error *err)
{
	struct tr_job_row row = {0};
	struct tr_job_transition t;
	int rc;

	(void)ctx;
	if (tr_store_job_get(store, id, &row, NULL) < 0) {
		set_err(err, TR_JOB_E_NOT_FOUND, NULL, "no such job");
		return -ENOENT;
	}
	rc = tr_job_check(id, row.state, req->op, &t, err);
	tr_job_row_finish(&row);
	if (rc < 0 || t.action == TR_JOB_KEEP)
		return rc;
	rc = tr_store_job_set_state(store, id,
				    t.action == TR_JOB_SIGNAL && req->op == TR_JOB_PAUSE    ? TR_JOB_PAUSED
				    : t.action == TR_JOB_SIGNAL && req->op == TR_JOB_CANCEL ? TR_JOB_CANCELLED
											    : t.to,
				    NULL, NULL, err);
	if (rc < 0)
		err->kind = TR_JOB_E_INTERNAL;
	return rc;
}

static int fake_set_priority(void *ctx, int64_t id, int priority, struct tr_error *err)
{
	(void)ctx;
	if (tr_store_job_set_priority(store, id, priority, err) < 0) {
		err->kind = TR_JOB_E_INTERNAL;
		return -EIO;
	}
	return 0;
}

static int fake_remove(void *ctx, int64_t id, struct tr_error *err)
{
	struct tr_job_row row = {0};
	bool done;

	(void)ctx;
	if (tr_store_job_get(store, id, &row, NULL) < 0) {
		set_err(err, TR_JOB_E_NOT_FOUND, NULL, "no such job");
		return -ENOENT;
	}
	done = terminal(row.state);
	tr_job_row_finish(&row);
	if (!done) {
		set_err(err, TR_JOB_E_ILLEGAL, NULL, "the job is not finished");
		return -EBUSY;
	}
	return tr_store_job_delete(store, id, NULL);
}

static int fake_devices(void *ctx, struct tr_api_device *out, int max)
{
	(void)ctx;
	if (max < 1)
		return 0;
	out[0] = (struct tr_api_device){
		.id = 0, .name = "cpu0", .kind = "cpu", .have_memory = true, .memory_total = 1024, .memory_free = 512};
	return 1;
}

/* A running job's figures: the row's, with an ETA only the daemon knows. */
static bool fake_live(void *ctx, int64_t id, struct tr_api_live *out)
{
	struct tr_job_row row = {0};
	bool running;

	(void)ctx;
	running = tr_store_job_get(store, id, &row, NULL) == 0 && row.state == TR_JOB_RUNNING;
	if (running)
		*out = (struct tr_api_live){.step = row.step,
					    .total_steps = row.total_steps,
					    .epoch = row.epoch,
					    .eta_s = 12.5,
					    .loss = row.loss};
	tr_job_row_finish(&row);
	return running;
}

static int fake_checkpoint_now(void *ctx, int64_t id, struct tr_error *err)
{
	struct tr_job_row row = {0};
	bool running;

	(void)ctx;
	if (tr_store_job_get(store, id, &row, NULL) < 0) {
		set_err(err, TR_JOB_E_NOT_FOUND, NULL, "no such job");
		return -ENOENT;
	}
	running = row.state == TR_JOB_RUNNING;
	tr_job_row_finish(&row);
	if (!running) {
		set_err(err, TR_JOB_E_ILLEGAL, NULL, "only a running job can take a checkpoint");
		return -EBUSY;
	}
	atomic_fetch_add(&checkpoint_requests, 1);
	return 0;
}

static bool fake_ready(void *ctx)
{
	(void)ctx;
	return atomic_load(&daemon_ready);
}

tr_api_t *start_with(const struct start_opts *o, struct tr_error *e)
{
	struct tr_api_config cfg = {
		.listen_host = o->host,
		.port = o->port,
		.sse_heartbeat_s = o->heartbeat_s,
		.tokens = o->tokens,
		.role_tokens = o->role_tokens,
		.n_role_tokens = o->n_role_tokens,
		.openapi_path = o->openapi,
		.version = o->version ? o->version : "1.2.3-test",
		.store = store,
		.datasets = o->datasets,
		.ops = {.submit = fake_submit,
			.control = fake_control,
			.set_priority = fake_set_priority,
			.remove = fake_remove,
			.devices = fake_devices,
			.live_progress = fake_live,
			.checkpoint_now = fake_checkpoint_now,
			.evaluate = o->evaluate,
			.ready = fake_ready},
	};

	if (o->tweak)
		o->tweak(&cfg);
	return tr_api_start(&cfg, e);
}

void restart(const struct start_opts *o)
{
	struct tr_error e = {0};

	tr_api_stop(api);
	api = start_with(o, &e);
	cr_assert_not_null(api, "tr_api_start: %s", e.message);
	port = tr_api_port(api);
}

void api_fixture_setup(void)
{
	char path[PATH_MAX + 16];
	struct start_opts o = {0};

	curl_global_init(CURL_GLOBAL_DEFAULT);
	snprintf(dir, sizeof(dir), "/tmp/tr-api-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/state.db", dir);
	struct tr_error oerr = {0};
	cr_assert_eq(tr_store_open(path, NULL, &store, &oerr), 0, "tr_store_open: %s", oerr.message);
	api = NULL;
	token = NULL;
	restart(&o);
}

void api_fixture_teardown(void)
{
	tr_api_stop(api);
	api = NULL;
	tr_store_close(store);
	store = NULL;
	tr_test_rmtree(dir);
	curl_global_cleanup();
}

const char *jstr(const json_t *j, const char *path)
{
	/* "a.b.c" into nested objects */
	char key[64];
	const char *dot;

	while ((dot = strchr(path, '.'))) {
		snprintf(key, sizeof(key), "%.*s", (int)(dot - path), path);
		j = json_object_get(j, key);
		path = dot + 1;
	}
	return json_string_value(json_object_get(j, path));
}

json_int_t jint(const json_t *j, const char *key)
{
	return json_integer_value(json_object_get(j, key));
}

/* Submits a job and returns its id. */
int64_t submit(const char *name)
{
	char body[256];
	struct tr_test_reply r;
	int64_t id;

	snprintf(body, sizeof(body), "{\"name\": \"%s\", \"epochs\": 1}", name);
	r = http("POST", "/jobs", body);
	cr_assert_eq(r.status, 201, "submit: %ld %s", r.status, r.body.data);
	id = jint(r.json, "id");
	tr_test_reply_free(&r);
	return id;
}

void expect_status(struct tr_test_reply *r, long status, const char *what)
{
	cr_assert_eq(r->status, status, "%s: got %ld %s", what, r->status, r->body.data ? r->body.data : "");
	if (r->body.len) {
		cr_assert_eq(r->body.data[r->body.len - 1], '\n', "%s: body must end with a newline", what);
		cr_assert_not_null(r->json, "%s: body is not JSON: %s", what, r->body.data);
	}
}

/* ---- HTTP through the shared client ---- */

struct tr_test_reply http_full(const char *method, const char *path, const char *body, const char *const *hdrs,
			       size_t chunked_size)
{
	char base[64];
	struct tr_test_reply r;

	snprintf(base, sizeof(base), "http://127.0.0.1:%d", port);
	struct tr_test_request rq = {.base_url = base,
				     .method = method,
				     .path = path,
				     .body = body,
				     .headers = hdrs,
				     .token = token,
				     .chunked_size = chunked_size,
				     .timeout_s = 20};
	tr_test_http(&rq, &r);
	return r;
}

struct tr_test_reply http(const char *method, const char *path, const char *body)
{
	return http_full(method, path, body, NULL, 0);
}

void resp_free(struct tr_test_reply *r)
{
	tr_test_reply_free(r);
}

const char *header(const struct tr_test_reply *r, const char *name, char *out, size_t len)
{
	return tr_test_header(r, name, out, len);
}
