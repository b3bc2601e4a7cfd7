/* The HTTP API against a real store in a temporary directory and fake
 * daemon ops (below), over real HTTP with libcurl: every route's success
 * path, a table of bad requests with their status and error code, bearer
 * auth, body limits, the SSE stream (history, live events, resume by
 * Last-Event-ID without duplicates, prompt end on tr_api_stop), and
 * checkpoints written through the store's real writer, listed and
 * downloaded whole and as weights only.
 *
 * The fake ops keep the daemon's rules small but real: submit inserts a
 * row and honours Idempotency-Key by comparing request hashes; control
 * moves the state with the store (cancel of a finished job is 409);
 * remove only deletes finished jobs; checkpoint_now counts requests for
 * running jobs and refuses others with 409.
 */
#include <criterion/criterion.h>
#include <curl/curl.h>
#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <regex.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "api/api.h"
#include "api/rcache.h"
#include "api/routes.h"
#include "engine/safetensors.h"

static char dir[PATH_MAX];
static tr_store_t *store;
static tr_api_t *api;
static int port;
static const char *token; /* sent as Bearer when set */
static atomic_bool daemon_ready = true;
static atomic_int checkpoint_requests;

/* ---- fake daemon ---- */

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

static double now_s(void)
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
	rc = tr_store_job_insert(store, &row, &existing);
	if (rc == -EEXIST) {
		tr_store_job_get(store, existing, &old);
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
		set_err(err, TR_JOB_E_INTERNAL, NULL, tr_store_error(store));
	}
	tr_job_row_finish(&row);
	return rc;
}

static bool terminal(const char *s)
{
	return tr_job_state_name_terminal(s);
}

/* The daemon's rule, from the job module's table; a running job's signal
 * takes effect at once here (there is no runner). */
static int fake_control(void *ctx, int64_t id, const struct tr_api_control *req, struct tr_error *err)
{
	struct tr_job_row row = {0};
	struct tr_job_transition t;
	int rc;

	(void)ctx;
	if (tr_store_job_get(store, id, &row) < 0) {
		set_err(err, TR_JOB_E_NOT_FOUND, NULL, "no such job");
		return -ENOENT;
	}
	rc = tr_job_check(id, row.state, req->op, &t, err);
	tr_job_row_finish(&row);
	if (rc < 0 || t.action == TR_JOB_KEEP)
		return rc;
	rc = tr_store_job_set_state(store, id, tr_job_state_name(t.action == TR_JOB_SIGNAL && req->op == TR_JOB_PAUSE
									 ? TR_JOB_PAUSED
									 : t.action == TR_JOB_SIGNAL && req->op == TR_JOB_CANCEL
										   ? TR_JOB_CANCELLED
										   : t.to),
				    NULL, NULL);
	if (rc < 0)
		set_err(err, TR_JOB_E_INTERNAL, NULL, tr_store_error(store));
	return rc;
}

static int fake_set_priority(void *ctx, int64_t id, int priority, struct tr_error *err)
{
	(void)ctx;
	if (tr_store_job_set_priority(store, id, priority) < 0) {
		set_err(err, TR_JOB_E_INTERNAL, NULL, tr_store_error(store));
		return -EIO;
	}
	return 0;
}

static int fake_remove(void *ctx, int64_t id, struct tr_error *err)
{
	struct tr_job_row row = {0};
	bool done;

	(void)ctx;
	if (tr_store_job_get(store, id, &row) < 0) {
		set_err(err, TR_JOB_E_NOT_FOUND, NULL, "no such job");
		return -ENOENT;
	}
	done = terminal(row.state);
	tr_job_row_finish(&row);
	if (!done) {
		set_err(err, TR_JOB_E_ILLEGAL, NULL, "the job is not finished");
		return -EBUSY;
	}
	return tr_store_job_delete(store, id);
}

static json_t *fake_devices(void *ctx)
{
	(void)ctx;
	return json_pack("[{s:i, s:s, s:s, s:i, s:i, s:n}]", "id", 0, "name", "cpu0", "kind", "cpu", "memory_total",
			 1024, "memory_free", 512, "job");
}

/* A running job's figures: the row's, with an ETA only the daemon knows. */
static bool fake_live(void *ctx, int64_t id, struct tr_api_live *out)
{
	struct tr_job_row row = {0};
	bool running;

	(void)ctx;
	running = tr_store_job_get(store, id, &row) == 0 && !strcmp(row.state, "running");
	if (running)
		*out = (struct tr_api_live){.step = row.step, .total_steps = row.total_steps, .epoch = row.epoch,
					    .eta_s = 12.5, .loss = row.loss};
	tr_job_row_finish(&row);
	return running;
}

static int fake_checkpoint_now(void *ctx, int64_t id, struct tr_error *err)
{
	struct tr_job_row row = {0};
	bool running;

	(void)ctx;
	if (tr_store_job_get(store, id, &row) < 0) {
		set_err(err, TR_JOB_E_NOT_FOUND, NULL, "no such job");
		return -ENOENT;
	}
	running = !strcmp(row.state, "running");
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

/* ---- server lifecycle ---- */

struct start_opts {
	const char *const *tokens;
	const struct tr_api_token *role_tokens;
	size_t n_role_tokens;
	int heartbeat_s;
	const char *openapi;
	const char *host;
	int port;
};

static tr_api_t *start_with(const struct start_opts *o, char *err, size_t errlen)
{
	struct tr_api_config cfg = {
		.listen_host = o->host,
		.port = o->port,
		.sse_heartbeat_s = o->heartbeat_s,
		.tokens = o->tokens,
		.role_tokens = o->role_tokens,
		.n_role_tokens = o->n_role_tokens,
		.openapi_path = o->openapi,
		.version = "1.2.3-test",
		.store = store,
		.ops = {.submit = fake_submit,
			.control = fake_control,
			.set_priority = fake_set_priority,
			.remove = fake_remove,
			.devices = fake_devices,
			.live_progress = fake_live,
			.checkpoint_now = fake_checkpoint_now,
			.ready = fake_ready},
	};

	return tr_api_start(&cfg, err, errlen);
}

static void restart(const struct start_opts *o)
{
	char err[256] = "";

	tr_api_stop(api);
	api = start_with(o, err, sizeof(err));
	cr_assert_not_null(api, "tr_api_start: %s", err);
	port = tr_api_port(api);
}

static void setup(void)
{
	char path[PATH_MAX + 16], err[256] = "";
	struct start_opts o = {0};

	curl_global_init(CURL_GLOBAL_DEFAULT);
	snprintf(dir, sizeof(dir), "/tmp/tr-api-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/state.db", dir);
	cr_assert_eq(tr_store_open(path, NULL, &store, err, sizeof(err)), 0, "tr_store_open: %s", err);
	api = NULL;
	token = NULL;
	restart(&o);
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(path);
}

static void teardown(void)
{
	tr_api_stop(api);
	api = NULL;
	tr_store_close(store);
	store = NULL;
	nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
	curl_global_cleanup();
}

TestSuite(api, .init = setup, .fini = teardown, .timeout = 60);

/* ---- HTTP client ---- */

struct buf {
	char *data;
	size_t len;
};

struct resp {
	long status;
	struct buf body, headers;
	json_t *json;
	curl_off_t uploaded; /* body bytes curl sent */
};

static size_t on_data(char *p, size_t size, size_t n, void *cls)
{
	struct buf *b = cls;
	size_t len = size * n;

	b->data = realloc(b->data, b->len + len + 1);
	memcpy(b->data + b->len, p, len);
	b->len += len;
	b->data[b->len] = '\0';
	return len;
}

struct upload {
	size_t left;
	bool slow; /* 16 KiB a millisecond: still sending when a reply comes */
};

/* A body of spaces: with chunked encoding nobody declares its size. */
static size_t on_read(char *p, size_t size, size_t n, void *cls)
{
	struct upload *u = cls;
	size_t len = size * n < u->left ? size * n : u->left;

	if (u->slow) {
		len = len < 16384 ? len : 16384;
		usleep(1000);
	}
	memset(p, ' ', len);
	u->left -= len;
	return len;
}

static bool has_header(const char *const *hdrs, const char *prefix)
{
	for (size_t i = 0; hdrs && hdrs[i]; i++)
		if (!strncasecmp(hdrs[i], prefix, strlen(prefix)))
			return true;
	return false;
}

/* method, path, body (NULL for none), NULL-terminated extra headers.  A
 * body gets Content-Type: application/json unless hdrs set one.
 * chunked_size > 0 sends that many bytes chunked instead of body, or,
 * when hdrs has a Content-Length (curl then sends its own, of that size),
 * slowly with that length. */
static struct resp http_full(const char *method, const char *path, const char *body, const char *const *hdrs,
			     size_t chunked_size)
{
	struct resp r = {0};
	struct curl_slist *list = NULL;
	struct upload up = {chunked_size, has_header(hdrs, "Content-Length:")};
	char url[512], auth[256];
	CURL *c = curl_easy_init();

	snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", port, path);
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, &r.body);
	curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_data);
	curl_easy_setopt(c, CURLOPT_HEADERDATA, &r.headers);
	curl_easy_setopt(c, CURLOPT_TIMEOUT, 20L);
	if (strcmp(method, "HEAD") == 0)
		curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
	else if (strcmp(method, "GET") != 0)
		curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
	if (chunked_size) {
		curl_easy_setopt(c, CURLOPT_POST, 1L);
		curl_easy_setopt(c, CURLOPT_READFUNCTION, on_read);
		curl_easy_setopt(c, CURLOPT_READDATA, &up);
		/* A declared length (hdrs) sends the same spaces slowly instead. */
		if (up.slow)
			curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)chunked_size);
		else
			list = curl_slist_append(list, "Transfer-Encoding: chunked");
	} else if (body) {
		curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
		curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
	}
	if ((body || chunked_size) && !has_header(hdrs, "Content-Type:"))
		list = curl_slist_append(list, "Content-Type: application/json");
	if (token && !has_header(hdrs, "Authorization:")) {
		snprintf(auth, sizeof(auth), "Authorization: Bearer %s", token);
		list = curl_slist_append(list, auth);
	}
	for (size_t i = 0; hdrs && hdrs[i]; i++)
		list = curl_slist_append(list, hdrs[i]);
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, list);
	CURLcode rc = curl_easy_perform(c);

	cr_assert_eq(rc, CURLE_OK, "%s %s: %s", method, path, curl_easy_strerror(rc));
	curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
	curl_easy_getinfo(c, CURLINFO_SIZE_UPLOAD_T, &r.uploaded);
	curl_slist_free_all(list);
	curl_easy_cleanup(c);
	if (r.body.len)
		r.json = json_loadb(r.body.data, r.body.len, 0, NULL);
	return r;
}

static struct resp http(const char *method, const char *path, const char *body)
{
	return http_full(method, path, body, NULL, 0);
}

static void resp_free(struct resp *r)
{
	free(r->body.data);
	free(r->headers.data);
	json_decref(r->json);
	memset(r, 0, sizeof(*r));
}

/* The last value of a response header, copied into out ("" if none). */
static const char *header(const struct resp *r, const char *name, char *out, size_t len)
{
	const char *p = r->headers.data;
	size_t n = strlen(name);

	out[0] = '\0';
	while (p && *p) {
		const char *eol = strstr(p, "\r\n");
		size_t line = eol ? (size_t)(eol - p) : strlen(p);

		if (line > n && !strncasecmp(p, name, n) && p[n] == ':') {
			const char *v = p + n + 1;

			while (*v == ' ')
				v++;
			snprintf(out, len, "%.*s", (int)(line - (size_t)(v - p)), v);
		}
		p = eol ? eol + 2 : p + line;
	}
	return out;
}

static const char *jstr(const json_t *j, const char *path)
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

static json_int_t jint(const json_t *j, const char *key)
{
	return json_integer_value(json_object_get(j, key));
}

/* Submits a job and returns its id. */
static int64_t submit(const char *name)
{
	char body[256];
	struct resp r;
	int64_t id;

	snprintf(body, sizeof(body), "{\"name\": \"%s\", \"epochs\": 1}", name);
	r = http("POST", "/jobs", body);
	cr_assert_eq(r.status, 201, "submit: %ld %s", r.status, r.body.data);
	id = jint(r.json, "id");
	resp_free(&r);
	return id;
}

static void expect_status(struct resp *r, long status, const char *what)
{
	cr_assert_eq(r->status, status, "%s: got %ld %s", what, r->status, r->body.data ? r->body.data : "");
	if (r->body.len) {
		cr_assert_eq(r->body.data[r->body.len - 1], '\n', "%s: body must end with a newline", what);
		cr_assert_not_null(r->json, "%s: body is not JSON: %s", what, r->body.data);
	}
}

/* ---- small routes ---- */

Test(api, health_ready_version_devices)
{
	struct resp r = http("GET", "/healthz", NULL);
	char h[128];

	expect_status(&r, 200, "healthz");
	cr_assert_str_eq(jstr(r.json, "status"), "ok");
	cr_assert_str_eq(header(&r, "Content-Type", h, sizeof(h)), "application/json");
	resp_free(&r);

	/* HEAD works where GET does, for probes; the body is dropped. */
	r = http_full("HEAD", "/healthz", NULL, NULL, 0);
	cr_assert_eq(r.status, 200);
	cr_assert_eq(r.body.len, 0);
	resp_free(&r);

	r = http("GET", "/readyz", NULL);
	expect_status(&r, 200, "readyz");
	cr_assert(json_is_true(json_object_get(r.json, "ready")));
	resp_free(&r);

	atomic_store(&daemon_ready, false);
	r = http("GET", "/readyz", NULL);
	atomic_store(&daemon_ready, true);
	expect_status(&r, 503, "readyz while not ready");
	cr_assert_str_eq(jstr(r.json, "error.code"), "not_ready");
	resp_free(&r);

	r = http("GET", "/version", NULL);
	expect_status(&r, 200, "version");
	cr_assert_str_eq(jstr(r.json, "version"), "1.2.3-test");
	cr_assert_eq(jint(r.json, "api"), 1);
	resp_free(&r);

	r = http("GET", "/devices", NULL);
	expect_status(&r, 200, "devices");
	cr_assert_eq(json_array_size(json_object_get(r.json, "devices")), 1);
	cr_assert_str_eq(jstr(json_array_get(json_object_get(r.json, "devices"), 0), "name"), "cpu0");
	resp_free(&r);

	/* No document configured. */
	r = http("GET", "/openapi.yaml", NULL);
	expect_status(&r, 404, "openapi.yaml unset");
	resp_free(&r);
}

Test(api, openapi_document)
{
	char path[PATH_MAX + 16], h[128];
	const char *text = "openapi: 3.0.3\ninfo:\n  title: trainerd\n";
	struct start_opts o = {0};
	FILE *f;

	snprintf(path, sizeof(path), "%s/openapi.yaml", dir);
	f = fopen(path, "w");
	fputs(text, f);
	fclose(f);
	o.openapi = path;
	restart(&o);

	struct resp r = http("GET", "/openapi.yaml", NULL);

	cr_assert_eq(r.status, 200);
	cr_assert_str_eq(r.body.data, text);
	cr_assert_str_eq(header(&r, "Content-Type", h, sizeof(h)), "application/yaml");
	resp_free(&r);
}

/* ---- jobs ---- */

Test(api, submit_returns_job_with_location)
{
	regex_t re;
	char h[128];
	struct resp r = http_full("POST", "/jobs?priority=5", "{\"name\": \"mlp\", \"epochs\": 3}",
				  (const char *const[]){"Content-Type: application/json; charset=utf-8", NULL}, 0);

	expect_status(&r, 201, "submit");
	int64_t id = jint(r.json, "id");

	cr_assert_gt(id, 0);
	snprintf(h, sizeof(h), "/jobs/%" PRId64, id);
	char loc[128];

	cr_assert_str_eq(header(&r, "Location", loc, sizeof(loc)), h);
	cr_assert_str_eq(jstr(r.json, "name"), "mlp");
	cr_assert_str_eq(jstr(r.json, "state"), "queued");
	cr_assert_eq(jint(r.json, "priority"), 5);
	cr_assert_eq(jint(json_object_get(r.json, "spec"), "epochs"), 3);
	cr_assert(json_is_array(json_object_get(r.json, "devices")));
	cr_assert(json_is_null(json_object_get(r.json, "error")));
	json_t *progress = json_object_get(r.json, "progress");

	cr_assert(json_is_object(progress));
	cr_assert(json_is_integer(json_object_get(progress, "step")));
	cr_assert(json_is_null(json_object_get(progress, "loss")), "loss is null before any step");
	cr_assert_eq(regcomp(&re, "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z$",
			     REG_EXTENDED | REG_NOSUB),
		     0);
	cr_assert_eq(regexec(&re, jstr(r.json, "submitted_at"), 0, NULL, 0), 0, "%s", jstr(r.json, "submitted_at"));
	regfree(&re);
	cr_assert(json_is_null(json_object_get(r.json, "started_at")));
	cr_assert(json_is_null(json_object_get(r.json, "finished_at")));
	resp_free(&r);
}

Test(api, idempotency_key_replays_and_conflicts)
{
	const char *const key[] = {"Idempotency-Key: abc-123", NULL};
	struct resp a = http_full("POST", "/jobs", "{\"name\": \"x\"}", key, 0);
	struct resp b = http_full("POST", "/jobs", "{\"name\": \"x\"}", key, 0);
	struct resp c = http_full("POST", "/jobs", "{\"name\": \"y\"}", key, 0);
	char h[64];

	expect_status(&a, 201, "first");
	expect_status(&b, 200, "replay");
	cr_assert_str_eq(header(&b, "Idempotent-Replayed", h, sizeof(h)), "true");
	cr_assert_eq(jint(a.json, "id"), jint(b.json, "id"));
	cr_assert_str_eq(header(&a, "Idempotent-Replayed", h, sizeof(h)), "");
	expect_status(&c, 409, "same key, other body");
	cr_assert_str_eq(jstr(c.json, "error.code"), "idempotency_conflict");
	resp_free(&a);
	resp_free(&b);
	resp_free(&c);
}

Test(api, list_paginates_and_filters)
{
	int64_t ids[5];
	char path[128];
	struct resp r;

	for (int i = 0; i < 5; i++)
		ids[i] = submit("j");
	cr_assert_eq(tr_store_job_set_state(store, ids[3], "cancelled", NULL, NULL), 0);

	r = http("GET", "/jobs?limit=2", NULL);
	expect_status(&r, 200, "page 1");
	cr_assert_eq(json_array_size(json_object_get(r.json, "jobs")), 2);
	cr_assert_eq(jint(json_array_get(json_object_get(r.json, "jobs"), 0), "id"), ids[0]);
	cr_assert(json_is_string(json_object_get(r.json, "next")));
	snprintf(path, sizeof(path), "/jobs?limit=2&after=%s", jstr(r.json, "next"));
	resp_free(&r);

	r = http("GET", path, NULL);
	expect_status(&r, 200, "page 2");
	cr_assert_eq(jint(json_array_get(json_object_get(r.json, "jobs"), 0), "id"), ids[2]);
	resp_free(&r);

	r = http("GET", "/jobs", NULL);
	expect_status(&r, 200, "all");
	cr_assert_eq(json_array_size(json_object_get(r.json, "jobs")), 5);
	cr_assert(json_is_null(json_object_get(r.json, "next")), "fewer than limit: no next page");
	resp_free(&r);

	r = http("GET", "/jobs?state=cancelled", NULL);
	expect_status(&r, 200, "by state");
	cr_assert_eq(json_array_size(json_object_get(r.json, "jobs")), 1);
	cr_assert_eq(jint(json_array_get(json_object_get(r.json, "jobs"), 0), "id"), ids[3]);
	resp_free(&r);
}

Test(api, get_merges_live_progress)
{
	int64_t id = submit("live");
	char path[64];
	struct resp r;

	cr_assert_eq(tr_store_job_set_state(store, id, "running", NULL, "[0]"), 0);
	cr_assert_eq(tr_store_job_set_progress(store, id, 40, 100, 1, 0.25), 0);
	snprintf(path, sizeof(path), "/jobs/%" PRId64, id);
	r = http("GET", path, NULL);
	expect_status(&r, 200, "get");
	json_t *p = json_object_get(r.json, "progress");

	cr_assert_str_eq(jstr(r.json, "state"), "running");
	cr_assert_eq(jint(p, "step"), 40);
	cr_assert_eq(jint(p, "total_steps"), 100);
	cr_assert_eq(jint(p, "epoch"), 1);
	cr_assert_float_eq(json_real_value(json_object_get(p, "loss")), 0.25, 1e-12);
	cr_assert_float_eq(json_real_value(json_object_get(p, "eta_s")), 12.5, 1e-12);
	cr_assert_eq(json_integer_value(json_array_get(json_object_get(r.json, "devices"), 0)), 0);
	cr_assert(json_is_string(json_object_get(r.json, "started_at")));
	resp_free(&r);
}

Test(api, control_patch_delete)
{
	int64_t id = submit("ctl"), other = submit("other");
	char path[64];
	struct resp r;

	snprintf(path, sizeof(path), "/jobs/%" PRId64 "/pause", id);
	r = http("POST", path, NULL);
	expect_status(&r, 202, "pause");
	cr_assert_str_eq(jstr(r.json, "state"), "paused");
	resp_free(&r);

	snprintf(path, sizeof(path), "/jobs/%" PRId64 "/resume", id);
	r = http("POST", path, NULL);
	expect_status(&r, 202, "resume");
	cr_assert_str_eq(jstr(r.json, "state"), "queued");
	resp_free(&r);

	cr_assert_eq(tr_store_job_set_state(store, other, "running", NULL, NULL), 0);
	snprintf(path, sizeof(path), "/jobs/%" PRId64 "/stop", other);
	r = http("POST", path, NULL);
	expect_status(&r, 202, "stop");
	cr_assert_str_eq(jstr(r.json, "state"), "stopping");
	resp_free(&r);

	snprintf(path, sizeof(path), "/jobs/%" PRId64, id);
	r = http("PATCH", path, "{\"priority\": -7}");
	expect_status(&r, 200, "patch");
	cr_assert_eq(jint(r.json, "priority"), -7);
	resp_free(&r);

	snprintf(path, sizeof(path), "/jobs/%" PRId64 "/cancel", id);
	r = http("POST", path, NULL);
	expect_status(&r, 202, "cancel");
	cr_assert_str_eq(jstr(r.json, "state"), "cancelled");
	cr_assert(json_is_string(json_object_get(r.json, "finished_at")));
	resp_free(&r);

	snprintf(path, sizeof(path), "/jobs/%" PRId64, id);
	r = http("DELETE", path, NULL);
	cr_assert_eq(r.status, 204);
	cr_assert_eq(r.body.len, 0);
	resp_free(&r);

	r = http("GET", path, NULL);
	expect_status(&r, 404, "deleted");
	resp_free(&r);
}

static void *submit_many(void *cls)
{
	int64_t *ids = cls;

	for (int i = 0; i < 10; i++)
		ids[i] = submit("concurrent");
	return NULL;
}

Test(api, concurrent_submits)
{
	pthread_t th[8];
	int64_t ids[80];
	struct resp r;

	for (int t = 0; t < 8; t++)
		pthread_create(&th[t], NULL, submit_many, ids + 10 * t);
	for (int t = 0; t < 8; t++)
		pthread_join(th[t], NULL);
	for (int i = 0; i < 80; i++)
		for (int j = 0; j < i; j++)
			cr_assert_neq(ids[i], ids[j]);
	r = http("GET", "/jobs?limit=1000", NULL);
	expect_status(&r, 200, "list");
	cr_assert_eq(json_array_size(json_object_get(r.json, "jobs")), 80);
	resp_free(&r);
}

/* ---- metrics and logs ---- */

Test(api, metrics_push_and_query)
{
	int64_t id = submit("m");
	char path[128];
	struct resp r;

	snprintf(path, sizeof(path), "/jobs/%" PRId64 "/metrics", id);
	r = http("POST", path,
		 "{\"points\": [{\"name\": \"eval/bleu\", \"step\": 1, \"value\": 0.5, \"epoch\": 0},"
		 " {\"name\": \"eval/bleu\", \"step\": 2, \"value\": 0.75},"
		 " {\"name\": \"gpu:temp\", \"step\": 2, \"value\": 61}]}");
	expect_status(&r, 202, "push");
	cr_assert_eq(jint(r.json, "accepted"), 3);
	resp_free(&r);
	for (int s = 1; s <= 50; s++)
		tr_store_metric_append(store, id, "loss", s, 0, now_s(), 1.0 / s);
	cr_assert_eq(tr_store_flush(store), 0);

	snprintf(path, sizeof(path), "/jobs/%" PRId64 "/metrics?names=eval/bleu&epochs=true&times=true", id);
	r = http("GET", path, NULL);
	expect_status(&r, 200, "query");
	cr_assert_eq(jint(r.json, "job"), id);
	json_t *series = json_object_get(r.json, "series");
	json_t *bleu = json_object_get(series, "eval/bleu");

	cr_assert_eq(json_object_size(series), 1);
	cr_assert_eq(json_array_size(json_object_get(bleu, "steps")), 2);
	cr_assert_float_eq(json_number_value(json_array_get(json_object_get(bleu, "values"), 1)), 0.75, 1e-12);
	cr_assert_eq(json_array_size(json_object_get(bleu, "epochs")), 2);
	cr_assert_eq(json_array_size(json_object_get(bleu, "times")), 2);
	resp_free(&r);

	snprintf(path, sizeof(path), "/jobs/%" PRId64 "/metrics?names=loss&from_step=10&to_step=19", id);
	r = http("GET", path, NULL);
	expect_status(&r, 200, "range");
	json_t *loss = json_object_get(json_object_get(r.json, "series"), "loss");

	cr_assert_eq(json_array_size(json_object_get(loss, "steps")), 10);
	cr_assert_eq(json_integer_value(json_array_get(json_object_get(loss, "steps"), 0)), 10);
	cr_assert_null(json_object_get(loss, "epochs"));
	resp_free(&r);

	snprintf(path, sizeof(path), "/jobs/%" PRId64 "/metrics?names=loss&max_points=10", id);
	r = http("GET", path, NULL);
	expect_status(&r, 200, "downsampled");
	loss = json_object_get(json_object_get(r.json, "series"), "loss");
	cr_assert_leq(json_array_size(json_object_get(loss, "steps")), 10);
	cr_assert_gt(json_array_size(json_object_get(loss, "steps")), 0);
	resp_free(&r);

	/* All names, in name order. */
	snprintf(path, sizeof(path), "/jobs/%" PRId64 "/metrics", id);
	r = http("GET", path, NULL);
	expect_status(&r, 200, "all");
	cr_assert_eq(json_object_size(json_object_get(r.json, "series")), 3);
	resp_free(&r);

	/* Late monitors: pushing to a finished job is fine. */
	cr_assert_eq(tr_store_job_set_state(store, id, "completed", NULL, NULL), 0);
	snprintf(path, sizeof(path), "/jobs/%" PRId64 "/metrics", id);
	r = http("POST", path, "{\"points\": [{\"name\": \"late\", \"step\": 3, \"value\": 1e-3}]}");
	expect_status(&r, 202, "push to finished job");
	resp_free(&r);
}

/* ---- the metrics response cache ---- */

/* The last step of a series in a metrics answer, -1 when absent. */
static int64_t last_step(const json_t *answer, const char *name)
{
	json_t *steps = json_object_get(json_object_get(json_object_get(answer, "series"), name), "steps");
	size_t n = json_array_size(steps);

	return n ? json_integer_value(json_array_get(steps, n - 1)) : -1;
}

/* A point is in the first answer after the flush that wrote it, however
 * often the query was answered before; another job's flushes do not make
 * a finished job's cached answer be computed again. */
Test(api, metrics_cache_fresh_and_per_job)
{
	int64_t done = submit("finished"), live = submit("running");
	char pd[128], pl[128];
	struct tr_rcache_stats s0, s1;

	for (int i = 0; i < 2000; i++)
		cr_assert_eq(tr_store_metric_append(store, done, "x", i, 0, now_s(), sin(i * 0.01)), 0);
	cr_assert_eq(tr_store_flush(store), 0);
	cr_assert_eq(tr_store_job_set_state(store, done, "completed", NULL, NULL), 0);
	cr_assert_eq(tr_store_job_set_state(store, live, "running", NULL, NULL), 0);
	snprintf(pd, sizeof(pd), "/jobs/%" PRId64 "/metrics?max_points=100", done);
	snprintf(pl, sizeof(pl), "/jobs/%" PRId64 "/metrics?names=loss&max_points=100", live);
	struct resp first = http("GET", pd, NULL);
	expect_status(&first, 200, "finished job");
	cr_assert_eq(last_step(first.json, "x"), 1999);

	for (int step = 0; step < 20; step++) {
		cr_assert_eq(tr_store_metric_append(store, live, "loss", step, 0, now_s(), 1.0 / (step + 1)), 0);
		cr_assert_eq(tr_store_flush(store), 0);
		/* The second answer comes from the cache. */
		for (int k = 0; k < 2; k++) {
			struct resp r = http("GET", pl, NULL);

			expect_status(&r, 200, "running job");
			cr_assert_eq(last_step(r.json, "loss"), step, "answer %d after the flush of step %d is stale",
				     k, step);
			resp_free(&r);
		}
		tr_rcache_stats(&s0);
		struct resp r = http("GET", pd, NULL);
		tr_rcache_stats(&s1);
		expect_status(&r, 200, "finished job");
		cr_assert_str_eq(r.body.data, first.body.data);
		cr_assert_eq(s1.computed, s0.computed, "the flush of step %d made the finished job's answer recomputed",
			     step);
		cr_assert_eq(s1.hits, s0.hits + 1);
		resp_free(&r);
	}
	/* A resume from an earlier checkpoint truncates: also seen at once. */
	cr_assert_eq(tr_store_metrics_truncate(store, live, 9), 0);
	struct resp r = http("GET", pl, NULL);
	expect_status(&r, 200, "truncated");
	cr_assert_eq(last_step(r.json, "loss"), 9, "a cached answer outlived the truncation");
	resp_free(&r);
	resp_free(&first);
}

struct poller {
	const char *path;
	atomic_bool *stop;
	int64_t max_written; /* read after the join */
	int bad, answers;
	int64_t highest;
};

static void *poll_metrics(void *cls)
{
	struct poller *p = cls;

	while (!atomic_load(p->stop)) {
		struct resp r = http("GET", p->path, NULL);

		if (r.status != 200 || !r.json)
			p->bad++;
		else if (last_step(r.json, "loss") > p->highest)
			p->highest = last_step(r.json, "loss");
		p->answers++;
		resp_free(&r);
	}
	return NULL;
}

/* The same, with other clients asking the same query all the time, so
 * the writer's flushes race cache fills and shared computations. */
Test(api, metrics_cache_fresh_under_concurrent_polling)
{
	int64_t id = submit("polled");
	char path[128];
	atomic_bool stop = false;
	struct poller p[4];
	pthread_t th[4];

	/* Enough points that a computation takes a while. */
	for (int i = 0; i < 20000; i++)
		cr_assert_eq(tr_store_metric_append(store, id, "loss", i, 0, now_s(), cos(i * 0.001)), 0);
	cr_assert_eq(tr_store_flush(store), 0);
	snprintf(path, sizeof(path), "/jobs/%" PRId64 "/metrics?names=loss&max_points=500", id);
	for (int t = 0; t < 4; t++) {
		p[t] = (struct poller){.path = path, .stop = &stop, .highest = -1};
		pthread_create(&th[t], NULL, poll_metrics, &p[t]);
	}
	/* Each new point is the largest value so far, so it is the maximum
	 * of the last bucket and must be in the downsampled answer. */
	int64_t stale = -1, seen = -1;
	for (int step = 20000; step < 20030 && stale < 0; step++) {
		int rc = tr_store_metric_append(store, id, "loss", step, 0, now_s(), 2.0 + step);

		if (rc == 0)
			rc = tr_store_flush(store);
		struct resp r = http("GET", path, NULL);

		seen = r.status == 200 && r.json ? last_step(r.json, "loss") : -2;
		if (rc != 0 || seen != step)
			stale = step;
		resp_free(&r);
	}
	atomic_store(&stop, true);
	for (int t = 0; t < 4; t++)
		pthread_join(th[t], NULL);
	cr_assert_lt(stale, 0, "the answer after the flush of step %" PRId64 " ends at step %" PRId64, stale, seen);
	for (int t = 0; t < 4; t++) {
		cr_assert_eq(p[t].bad, 0);
		cr_assert_gt(p[t].answers, 0);
		cr_assert_leq(p[t].highest, 20029);
	}
}

/* A computation for tr_rcache_get that the test steers: the first call
 * waits until `expect` callers have arrived (and a little longer, so they
 * reach their wait), then until `release` when `hold` is set, then fails
 * when `fail_first` is set. */
struct steered {
	atomic_int calls, arrived;
	int expect;
	bool hold, fail_first;
	atomic_bool release;
};

static int steered_answer(void *ctx, char **body, size_t *len)
{
	struct steered *sc = ctx;
	double t0 = now_s();

	if (atomic_fetch_add(&sc->calls, 1) == 0) {
		while (atomic_load(&sc->arrived) < sc->expect && now_s() - t0 < 10)
			usleep(1000);
		usleep(200000);
		while (sc->hold && !atomic_load(&sc->release) && now_s() - t0 < 10)
			usleep(1000);
		if (sc->fail_first)
			return -EIO;
	}
	*body = strdup("answer\n");
	*len = 7;
	return 0;
}

struct asker {
	const struct tr_rcache_key *key;
	int wait_ms;
	struct steered *sc;
	int rc;
	char *body;
	size_t len;
};

static void *ask(void *cls)
{
	struct asker *a = cls;

	atomic_fetch_add(&a->sc->arrived, 1);
	a->rc = tr_rcache_get(a->key, a->wait_ms, steered_answer, a->sc, &a->body, &a->len);
	return NULL;
}

/* Asks key from n threads at once; returns the stats' change. */
static struct tr_rcache_stats ask_together(const struct tr_rcache_key *key, int wait_ms, struct steered *sc,
					   struct asker *a, int n)
{
	pthread_t th[8];
	struct tr_rcache_stats s0, s1;

	tr_rcache_stats(&s0);
	for (int i = 0; i < n; i++) {
		a[i] = (struct asker){.key = key, .wait_ms = wait_ms, .sc = sc};
		pthread_create(&th[i], NULL, ask, &a[i]);
	}
	for (int i = 0; i < n; i++)
		pthread_join(th[i], NULL);
	tr_rcache_stats(&s1);
	return (struct tr_rcache_stats){s1.hits - s0.hits, s1.shared - s0.shared, s1.computed - s0.computed,
					s1.wait_timeouts - s0.wait_timeouts};
}

Test(api, rcache_computes_once_for_concurrent_misses)
{
	static const char owner[] = "once";
	struct tr_rcache_key key = {owner, 1, "q", 5};
	struct steered sc = {.expect = 8};
	struct asker a[8];
	struct tr_rcache_stats d = ask_together(&key, 5000, &sc, a, 8);

	cr_assert_eq(atomic_load(&sc.calls), 1, "%d computations", atomic_load(&sc.calls));
	cr_assert_eq(d.computed, 1);
	cr_assert_eq(d.shared, 7);
	cr_assert_eq(d.wait_timeouts, 0);
	for (int i = 0; i < 8; i++) {
		cr_assert_eq(a[i].rc, 0);
		cr_assert_eq(a[i].len, 7);
		cr_assert_eq(memcmp(a[i].body, "answer\n", 7), 0);
		free(a[i].body);
	}
	tr_rcache_forget(owner);
}

Test(api, rcache_serves_its_generation_and_newer)
{
	static const char owner[] = "gens";
	struct tr_rcache_key key = {owner, 1, "q", 5};
	struct steered sc = {0};
	char *body;
	size_t len;

	for (int i = 0; i < 2; i++) {
		cr_assert_eq(tr_rcache_get(&key, 100, steered_answer, &sc, &body, &len), 0);
		free(body);
	}
	cr_assert_eq(atomic_load(&sc.calls), 1, "the same generation was computed again");
	key.gen = 4; /* asked by someone who read an older generation */
	cr_assert_eq(tr_rcache_get(&key, 100, steered_answer, &sc, &body, &len), 0);
	free(body);
	cr_assert_eq(atomic_load(&sc.calls), 1);
	key.gen = 6;
	cr_assert_eq(tr_rcache_get(&key, 100, steered_answer, &sc, &body, &len), 0);
	free(body);
	cr_assert_eq(atomic_load(&sc.calls), 2, "a newer generation was served an older answer");
	key.job = 2;
	cr_assert_eq(tr_rcache_get(&key, 100, steered_answer, &sc, &body, &len), 0);
	free(body);
	cr_assert_eq(atomic_load(&sc.calls), 3, "another job was served this job's answer");
	tr_rcache_forget(owner);
	cr_assert_eq(tr_rcache_get(&key, 100, steered_answer, &sc, &body, &len), 0);
	free(body);
	cr_assert_eq(atomic_load(&sc.calls), 4, "forgotten entries were served");
	tr_rcache_forget(owner);
}

/* A failing computation hands its waiters no answer and no long wait:
 * each computes on its own at once. */
Test(api, rcache_failed_computation_releases_its_waiters)
{
	static const char owner[] = "fail";
	struct tr_rcache_key key = {owner, 1, "q", 5};
	struct steered sc = {.expect = 4, .fail_first = true};
	struct asker a[4];
	double t0 = now_s();
	struct tr_rcache_stats d = ask_together(&key, 5000, &sc, a, 4);
	int failed = 0;

	cr_assert_lt(now_s() - t0, 4.0, "waiters sat out their wait bound");
	cr_assert_eq(d.wait_timeouts, 0);
	for (int i = 0; i < 4; i++) {
		if (a[i].rc == -EIO)
			failed++;
		else
			cr_assert(a[i].rc == 0 && a[i].len == 7 && memcmp(a[i].body, "answer\n", 7) == 0);
		free(a[i].body);
	}
	cr_assert_eq(failed, 1, "%d callers saw the failure", failed);
	tr_rcache_forget(owner);
}

/* A stuck computation holds the others for wait_ms at most. */
Test(api, rcache_wait_is_bounded)
{
	static const char owner[] = "stuck";
	struct tr_rcache_key key = {owner, 1, "q", 5};
	struct steered sc = {.expect = 1, .hold = true};
	struct asker leader = {.key = &key, .wait_ms = 5000, .sc = &sc}, late;
	pthread_t th;
	struct tr_rcache_stats s0, s1;

	pthread_create(&th, NULL, ask, &leader);
	while (atomic_load(&sc.calls) == 0)
		usleep(1000);
	tr_rcache_stats(&s0);
	late = (struct asker){.key = &key, .wait_ms = 100, .sc = &sc};
	double t0 = now_s();
	ask(&late);
	double waited = now_s() - t0;
	tr_rcache_stats(&s1);
	cr_assert_eq(late.rc, 0);
	cr_assert_geq(waited, 0.09, "did not wait for the computation (%.3f s)", waited);
	cr_assert_lt(waited, 3.0, "waited %.3f s", waited);
	cr_assert_eq(s1.wait_timeouts, s0.wait_timeouts + 1);
	atomic_store(&sc.release, true);
	pthread_join(th, NULL);
	cr_assert_eq(leader.rc, 0);
	free(leader.body);
	free(late.body);
	tr_rcache_forget(owner);
}

Test(api, logs_paginate)
{
	int64_t id = submit("l");
	char path[128];
	struct resp r;

	for (int i = 0; i < 5; i++) {
		char msg[32];

		snprintf(msg, sizeof(msg), "line %d", i);
		cr_assert_eq(tr_store_log_append(store, id, 6, msg), 0);
	}
	cr_assert_eq(tr_store_flush(store), 0);
	snprintf(path, sizeof(path), "/jobs/%" PRId64 "/logs?limit=3", id);
	r = http("GET", path, NULL);
	expect_status(&r, 200, "logs");
	cr_assert_eq(json_array_size(json_object_get(r.json, "logs")), 3);
	cr_assert_str_eq(jstr(json_array_get(json_object_get(r.json, "logs"), 0), "message"), "line 0");
	cr_assert(json_is_string(json_object_get(r.json, "next")));
	snprintf(path, sizeof(path), "/jobs/%" PRId64 "/logs?after=%s", id, jstr(r.json, "next"));
	resp_free(&r);

	r = http("GET", path, NULL);
	expect_status(&r, 200, "logs page 2");
	cr_assert_eq(json_array_size(json_object_get(r.json, "logs")), 2);
	cr_assert_str_eq(jstr(json_array_get(json_object_get(r.json, "logs"), 0), "message"), "line 3");
	cr_assert(json_is_null(json_object_get(r.json, "next")));
	resp_free(&r);
}

/* ---- bad requests ---- */

struct bad {
	const char *method, *path, *body;
	const char *hdr; /* one extra header or NULL */
	long status;
	const char *code;
	const char *pointer;     /* expected error.pointer, or NULL for none */
	const char *msg_prefix;  /* expected start of error.message, or NULL */
};

static char *points_json(int n)
{
	size_t cap = (size_t)n * 48 + 32, len = 0;
	char *s = malloc(cap);

	len += (size_t)snprintf(s + len, cap - len, "{\"points\": [");
	for (int i = 0; i < n; i++)
		len += (size_t)snprintf(s + len, cap - len, "%s{\"name\": \"m\", \"step\": %d, \"value\": 1}",
					i ? "," : "", i);
	snprintf(s + len, cap - len, "]}");
	return s;
}

Test(api, bad_requests)
{
	int64_t id = submit("victim"), running = submit("busy");
	char *too_many = points_json(10001);
	char long_key[300] = "Idempotency-Key: ";

	memset(long_key + strlen(long_key), 'k', 256);
	cr_assert_eq(tr_store_job_set_state(store, id, "cancelled", NULL, NULL), 0);
	cr_assert_eq(tr_store_job_set_state(store, running, "running", NULL, NULL), 0);
	cr_assert_eq(id, 1, "the table below uses job 1 (cancelled) and 2 (running)");
	/* Burn an idempotency key so the conflict case has one. */
	struct resp k = http_full("POST", "/jobs", "{\"name\":\"a\"}",
				  (const char *const[]){"Idempotency-Key: K", NULL}, 0);

	resp_free(&k);

	const struct bad cases[] = {
		{"POST", "/jobs", "{\"name\": ", NULL, 400, "invalid_json", NULL, "line 1, column"},
		{"POST", "/jobs", "", NULL, 400, "invalid_json", NULL, "line 1, column"},
		{"POST", "/jobs", "[1, 2]", NULL, 400, "invalid_request", NULL, NULL},
		{"POST", "/jobs", "\"spec\"", NULL, 400, "invalid_request", NULL, NULL},
		{"POST", "/jobs", "{\"a\": 1, \"a\": 2}", NULL, 400, "invalid_json", NULL, NULL},
		{"POST", "/jobs", "{}", "Content-Type: text/plain", 415, "unsupported_media_type", NULL, NULL},
		{"POST", "/jobs", "{}", "Content-Type: application/jsonx", 415, "unsupported_media_type", NULL, NULL},
		{"POST", "/jobs", "{}", "Content-Type:", 415, "unsupported_media_type", NULL, NULL},
		{"POST", "/jobs?priority=2000", "{}", NULL, 400, "invalid_parameter", NULL, "priority:"},
		{"POST", "/jobs?priority=x", "{}", NULL, 400, "invalid_parameter", NULL, "priority:"},
		{"POST", "/jobs", "{\"bad\": 1}", NULL, 400, "invalid_spec", "/bad", NULL},
		{"POST", "/jobs", "{\"name\":\"b\"}", "Idempotency-Key: K", 409, "idempotency_conflict", NULL, NULL},
		{"POST", "/jobs", "{}", long_key, 400, "invalid_parameter", NULL, "Idempotency-Key"},
		{"POST", "/jobs", "{}", "Idempotency-Key: caf\xc3\xa9", 400, "invalid_parameter", NULL, NULL},
		{"GET", "/jobs/999", NULL, NULL, 404, "not_found", NULL, "job 999 not found"},
		{"GET", "/jobs/abc", NULL, NULL, 400, "invalid_parameter", NULL, "id:"},
		{"GET", "/jobs/0", NULL, NULL, 400, "invalid_parameter", NULL, NULL},
		{"GET", "/jobs/-1", NULL, NULL, 400, "invalid_parameter", NULL, NULL},
		{"GET", "/jobs/99999999999999999999", NULL, NULL, 400, "invalid_parameter", NULL, NULL},
		{"GET", "/jobs?limit=0", NULL, NULL, 400, "invalid_parameter", NULL,
		 "limit: must be an integer in [1, 1000]"},
		{"GET", "/jobs?limit=abc", NULL, NULL, 400, "invalid_parameter", NULL, "limit:"},
		{"GET", "/jobs?limit=1001", NULL, NULL, 400, "invalid_parameter", NULL, "limit:"},
		{"GET", "/jobs?after=-5", NULL, NULL, 400, "invalid_parameter", NULL, "after:"},
		{"GET", "/jobs?state=done", NULL, NULL, 400, "invalid_parameter", NULL, "state:"},
		{"GET", "/jobs/1/metrics?max_points=-1", NULL, NULL, 400, "invalid_parameter", NULL,
		 "max_points: must be an integer in [0, 100000]"},
		{"GET", "/jobs/1/metrics?max_points=100001", NULL, NULL, 400, "invalid_parameter", NULL, "max_points:"},
		{"GET", "/jobs/1/metrics?from_step=10&to_step=5", NULL, NULL, 400, "invalid_parameter", NULL,
		 "from_step:"},
		{"GET", "/jobs/1/metrics?epochs=yes", NULL, NULL, 400, "invalid_parameter", NULL, "epochs:"},
		{"GET", "/jobs/1/metrics?names=a,,b", NULL, NULL, 400, "invalid_parameter", NULL, "names:"},
		{"GET", "/jobs/77/metrics", NULL, NULL, 404, "not_found", NULL, NULL},
		{"POST", "/jobs/1/cancel", NULL, NULL, 409, "conflict", NULL, NULL},
		{"POST", "/jobs/1/resume", NULL, NULL, 409, "conflict", NULL, NULL},
		{"POST", "/jobs/42/cancel", NULL, NULL, 404, "not_found", NULL, "job 42 not found"},
		{"DELETE", "/jobs/2", NULL, NULL, 409, "conflict", NULL, NULL},
		{"PATCH", "/jobs/1", "{\"colour\": \"red\"}", NULL, 400, "invalid_request", "/colour", NULL},
		{"PATCH", "/jobs/1", "{\"a/b\": 1}", NULL, 400, "invalid_request", "/a~1b", NULL},
		{"PATCH", "/jobs/1", "{\"priority\": 5000}", NULL, 400, "invalid_request", "/priority", NULL},
		{"PATCH", "/jobs/1", "{\"priority\": \"high\"}", NULL, 400, "invalid_request", "/priority", NULL},
		{"PATCH", "/jobs/1", "{\"priority\": 1.5}", NULL, 400, "invalid_request", "/priority", NULL},
		{"PATCH", "/jobs/1", "{}", NULL, 400, "invalid_request", "/priority", NULL},
		{"PATCH", "/jobs/1", "{\"priority\": 1}", "Content-Type: text/json", 415, "unsupported_media_type",
		 NULL, NULL},
		{"POST", "/jobs/1/metrics", "{\"points\": [{\"name\": \"loss\", \"step\": 1, \"value\": 1}]}",
		 NULL, 400, "invalid_request", "/points/0/name", NULL},
		{"POST", "/jobs/1/metrics",
		 "{\"points\": [{\"name\": \"device3_step_ms\", \"step\": 1, \"value\": 1}]}", NULL,
		 400, "invalid_request", "/points/0/name", NULL},
		{"POST", "/jobs/1/metrics",
		 "{\"points\": [{\"name\":\"a\",\"step\":1,\"value\":1}, {\"name\":\"b\",\"step\":1,\"value\":1},"
		 " {\"name\": \"bad name!\", \"step\": 1, \"value\": 1}]}",
		 NULL, 400, "invalid_request", "/points/2/name", NULL},
		{"POST", "/jobs/1/metrics",
		 "{\"points\": [{\"name\": \"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\", "
		 "\"step\": 1, \"value\": 1}]}",
		 NULL, 400, "invalid_request", "/points/0/name", NULL},
		{"POST", "/jobs/1/metrics", "{\"points\": [{\"name\": \"a\", \"step\": 1, \"value\": \"1\"}]}",
		 NULL, 400, "invalid_request", "/points/0/value", NULL},
		{"POST", "/jobs/1/metrics", "{\"points\": [{\"name\": \"a\", \"step\": -1, \"value\": 1}]}", NULL, 400,
		 "invalid_request", "/points/0/step", NULL},
		{"POST", "/jobs/1/metrics",
		 "{\"points\": [{\"name\": \"a\", \"step\": 1, \"value\": 1, \"epoch\": -2}]}",
		 NULL, 400, "invalid_request", "/points/0/epoch", NULL},
		{"POST", "/jobs/1/metrics", "{\"points\": [{\"name\": \"a\", \"step\": 1, \"value\": 1, \"x\": 0}]}",
		 NULL, 400, "invalid_request", "/points/0/x", NULL},
		{"POST", "/jobs/1/metrics", "{\"points\": []}", NULL, 400, "invalid_request", "/points", NULL},
		{"POST", "/jobs/1/metrics", "{\"points\": 3}", NULL, 400, "invalid_request", "/points", NULL},
		{"POST", "/jobs/1/metrics", too_many, NULL, 400, "invalid_request", "/points", NULL},
		{"POST", "/jobs/1/metrics", "{\"pts\": []}", NULL, 400, "invalid_request", "/pts", NULL},
		{"POST", "/jobs/77/metrics", "{\"points\": [{\"name\": \"a\", \"step\": 1, \"value\": 1}]}", NULL, 404,
		 "not_found", NULL, NULL},
		{"GET", "/jobs/1/events", NULL, "Last-Event-ID: x", 400, "invalid_parameter", NULL, "Last-Event-ID:"},
		{"GET", "/jobs/1/events?last_event_id=-1", NULL,
		 NULL, 400, "invalid_parameter", NULL, "last_event_id:"},
		{"GET", "/jobs/1/logs?limit=10001", NULL, NULL, 400, "invalid_parameter", NULL, "limit:"},
		{"GET", "/jobs/1/logs?after=z", NULL, NULL, 400, "invalid_parameter", NULL, "after:"},
		{"GET", "/jobs/77/checkpoints", NULL, NULL, 404, "not_found", NULL, "job 77 not found"},
		{"GET", "/jobs/x/checkpoints", NULL, NULL, 400, "invalid_parameter", NULL, "id:"},
		{"POST", "/jobs/77/checkpoints", NULL, NULL, 404, "not_found", NULL, "job 77 not found"},
		{"POST", "/jobs/1/checkpoints", NULL, NULL, 409, "conflict", NULL, NULL},
		{"GET", "/jobs/1/checkpoints/latest/model.safetensors", NULL, NULL, 404, "not_found", NULL,
		 "job 1 has no checkpoint"},
		{"GET", "/jobs/1/checkpoints/5/checkpoint.safetensors", NULL, NULL, 404, "not_found", NULL,
		 "job 1 has no checkpoint at step 5"},
		{"GET", "/jobs/77/checkpoints/5/checkpoint.safetensors", NULL, NULL, 404, "not_found", NULL,
		 "job 77 not found"},
		{"GET", "/jobs/1/checkpoints/abc/model.safetensors", NULL, NULL, 400, "invalid_parameter", NULL,
		 "step:"},
		{"GET", "/jobs/1/checkpoints/-1/model.safetensors", NULL, NULL, 400, "invalid_parameter", NULL,
		 "step:"},
		{"GET", "/jobs/1/checkpoints/05/model.safetensors", NULL, NULL, 400, "invalid_parameter", NULL,
		 "step:"},
		{"GET", "/jobs/1/checkpoints/LATEST/model.safetensors", NULL, NULL, 400, "invalid_parameter", NULL,
		 "step:"},
		{"GET", "/jobs/1/checkpoints/99999999999999999999/model.safetensors", NULL, NULL, 400,
		 "invalid_parameter", NULL, "step:"},
		{"GET", "/jobs/1/checkpoints/0000000000000000000000000000000000000001/model.safetensors", NULL, NULL,
		 400, "invalid_parameter", NULL, "step:"},
		{"GET", "/jobs/1/checkpoints/5/weights.bin", NULL, NULL, 404, "not_found", NULL, NULL},
		{"GET", "/jobs/1/checkpoints/5", NULL, NULL, 404, "not_found", NULL, NULL},
		{"POST", "/jobs/1/checkpoints/5/model.safetensors", NULL, NULL, 405, "method_not_allowed", NULL, NULL},
		{"DELETE", "/jobs/1/checkpoints", NULL, NULL, 405, "method_not_allowed", NULL, NULL},
		{"GET", "/nope", NULL, NULL, 404, "not_found", NULL, NULL},
		{"GET", "/jobs/1/nope", NULL, NULL, 404, "not_found", NULL, NULL},
		{"GET", "/jobs/", NULL, NULL, 404, "not_found", NULL, NULL},
		{"DELETE", "/jobs", NULL, NULL, 405, "method_not_allowed", NULL, NULL},
		{"PUT", "/jobs/1", "{}", NULL, 405, "method_not_allowed", NULL, NULL},
		{"GET", "/jobs/1/cancel", NULL, NULL, 405, "method_not_allowed", NULL, NULL},
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct bad *c = &cases[i];
		const char *hdrs[] = {c->hdr, NULL};
		struct resp r = http_full(c->method, c->path, c->body, hdrs, 0);
		char what[160];

		snprintf(what, sizeof(what), "case %zu: %s %s", i, c->method, c->path);
		expect_status(&r, c->status, what);
		cr_assert_str_eq(jstr(r.json, "error.code"), c->code, "%s: %s", what, r.body.data);
		cr_assert(json_is_string(json_object_get(json_object_get(r.json, "error"), "message")), "%s", what);
		if (c->pointer)
			cr_assert_str_eq(jstr(r.json, "error.pointer"), c->pointer, "%s: %s", what, r.body.data);
		else
			cr_assert_null(json_object_get(json_object_get(r.json, "error"), "pointer"), "%s: %s", what,
				       r.body.data);
		if (c->msg_prefix)
			cr_assert(!strncmp(jstr(r.json, "error.message"), c->msg_prefix, strlen(c->msg_prefix)),
				  "%s: message %s", what, jstr(r.json, "error.message"));
		resp_free(&r);
	}
	free(too_many);

	/* 405 names what is allowed. */
	struct resp r = http("DELETE", "/jobs", NULL);
	char allow[64];

	header(&r, "Allow", allow, sizeof(allow));
	cr_assert(strstr(allow, "GET") && strstr(allow, "POST"), "Allow: %s", allow);
	resp_free(&r);

	r = http("GET", "/healthz", NULL);
	expect_status(&r, 200, "healthz after the abuse");
	resp_free(&r);
}

Test(api, body_limits)
{
	size_t big = (size_t)2 << 20;
	char *body = malloc(big + 1);
	struct resp r;

	memset(body, ' ', big);
	body[0] = '{';
	body[big - 1] = '}';
	body[big] = '\0';
	r = http("POST", "/jobs", body);
	expect_status(&r, 413, "declared Content-Length over the cap");
	cr_assert_str_eq(jstr(r.json, "error.code"), "payload_too_large");
	resp_free(&r);

	/* A client that sends at once, without waiting for "100 Continue",
	 * and slowly: answered after its body is read, not with the
	 * connection closed under it mid-upload (curl: "Failed sending data
	 * to the peer").  The message names the size. */
	const char *no_expect[] = {"Expect:", "Content-Length: 2097152", NULL};
	r = http_full("POST", "/jobs", NULL, no_expect, big);
	expect_status(&r, 413, "declared Content-Length over the cap, no Expect, slow");
	cr_assert_str_eq(jstr(r.json, "error.code"), "payload_too_large");
	cr_assert(strstr(jstr(r.json, "error.message"), "2097152 bytes"), "%s", jstr(r.json, "error.message"));
	cr_assert_eq(r.uploaded, (curl_off_t)big, "the 413 came after %lld of %zu bytes: the rest would be reset",
		     (long long)r.uploaded, big);
	resp_free(&r);

	r = http_full("POST", "/jobs", NULL, NULL, big);
	expect_status(&r, 413, "chunked body over the cap");
	cr_assert_str_eq(jstr(r.json, "error.code"), "payload_too_large");
	resp_free(&r);

	/* Just under the cap is fine (a spec padded with whitespace). */
	memset(body, ' ', (size_t)1 << 20);
	memcpy(body, "{\"name\": \"pad\"}", 15);
	body[(size_t)1 << 20] = '\0';
	r = http("POST", "/jobs", body);
	expect_status(&r, 201, "body at the cap");
	resp_free(&r);
	free(body);

	r = http("GET", "/healthz", NULL);
	expect_status(&r, 200, "healthz after big bodies");
	resp_free(&r);
}

/* ---- auth and start ---- */

Test(api, bearer_tokens)
{
	const char *const tokens[] = {"s3cret", "other-token", NULL};
	struct start_opts o = {.tokens = tokens};
	char h[128];
	struct resp r;

	restart(&o);
	r = http("GET", "/healthz", NULL);
	expect_status(&r, 200, "healthz needs no token");
	resp_free(&r);

	r = http("GET", "/version", NULL);
	expect_status(&r, 401, "no token");
	cr_assert_str_eq(jstr(r.json, "error.code"), "unauthorized");
	cr_assert(!strncmp(header(&r, "WWW-Authenticate", h, sizeof(h)), "Bearer", 6), "%s", h);
	resp_free(&r);

	r = http("GET", "/nope", NULL);
	expect_status(&r, 401, "unknown route without a token");
	resp_free(&r);

	r = http_full("GET", "/jobs", NULL, (const char *const[]){"Authorization: Basic dXNlcjpwdw==", NULL}, 0);
	expect_status(&r, 401, "not a bearer token");
	resp_free(&r);

	token = "s3cre";
	r = http("GET", "/jobs", NULL);
	expect_status(&r, 403, "wrong token");
	cr_assert_str_eq(jstr(r.json, "error.code"), "forbidden");
	resp_free(&r);

	token = "s3cret!";
	r = http("GET", "/jobs", NULL);
	expect_status(&r, 403, "longer token");
	resp_free(&r);

	token = "other-token";
	r = http("GET", "/jobs", NULL);
	expect_status(&r, 200, "second token");
	resp_free(&r);
	token = "s3cret";
	r = http("POST", "/jobs", "{\"name\": \"authed\"}");
	expect_status(&r, 201, "submit with token");
	resp_free(&r);
}

/* The role each route needs, as the design gives it: read = every GET,
 * write = submitting, controlling jobs and pushing metrics, admin =
 * DELETE and /reload. */
Test(api, route_roles_follow_the_design)
{
	size_t n;
	const struct tr_api_route *routes = tr_api_routes(&n);

	for (size_t i = 0; i < n; i++) {
		const struct tr_api_route *rt = &routes[i];
		enum tr_api_role want = TR_ROLE_WRITE;

		if (!strcmp(rt->method, "GET"))
			want = TR_ROLE_READ;
		else if (!strcmp(rt->method, "DELETE") || !strcmp(rt->path, "/reload"))
			want = TR_ROLE_ADMIN;
		cr_assert_eq(tr_api_route_role(rt), want, "%s %s needs %s, the table says %s", rt->method, rt->path,
			     tr_api_role_name(want), tr_api_role_name(tr_api_route_role(rt)));
	}
}

/* Every route of the table against a token of every role: a role at or
 * above the route's passes auth (whatever the handler then says), a role
 * below is 403 with a message naming both roles; no token is 401. */
Test(api, every_route_against_every_role)
{
	const struct tr_api_token rt[] = {
		{TR_ROLE_READ, "token-read"}, {TR_ROLE_WRITE, "token-write"}, {TR_ROLE_ADMIN, "token-admin"}};
	struct start_opts o = {.role_tokens = rt, .n_role_tokens = 3};
	size_t n;
	const struct tr_api_route *routes = tr_api_routes(&n);
	int refused = 0, allowed = 0;

	restart(&o);
	for (size_t i = 0; i < n; i++) {
		const struct tr_api_route *route = &routes[i];
		char path[256] = "";
		const char *p = route->path;

		/* {id} -> a job that does not exist, {step} -> 1. */
		while (*p) {
			if (*p == '{') {
				strcat(path, strncmp(p, "{id}", 4) == 0 ? "987654" : "1");
				p = strchr(p, '}') + 1;
			} else {
				strncat(path, p++, 1);
			}
		}
		const char *body = (route->flags & TR_ROUTE_JSON_BODY) ? "{}" : NULL;
		enum tr_api_role need = tr_api_route_role(route);

		for (int role = TR_ROLE_READ; role <= TR_ROLE_ADMIN; role++) {
			token = rt[role - 1].token;
			struct resp r = http(route->method, path, body);
			bool public = route->flags & TR_ROUTE_PUBLIC;

			if (public || role >= (int)need) {
				cr_assert(r.status != 401 && r.status != 403, "%s %s with a %s token: %ld", route->method,
					  path, tr_api_role_name(role), r.status);
				allowed++;
			} else {
				char want[128];

				expect_status(&r, 403, path);
				cr_assert_str_eq(jstr(r.json, "error.code"), "forbidden");
				snprintf(want, sizeof(want), "needs a token with the %s role; this token has the %s role",
					 tr_api_role_name(need), tr_api_role_name(role));
				cr_assert(strstr(jstr(r.json, "error.message"), want), "%s %s: %s", route->method, path,
					  jstr(r.json, "error.message"));
				/* The token itself is never echoed. */
				cr_assert(!strstr(r.body.data, "token-"), "%s", r.body.data);
				refused++;
			}
			resp_free(&r);
		}
		token = NULL;
		struct resp r = http(route->method, path, body);
		if (!(route->flags & TR_ROUTE_PUBLIC))
			expect_status(&r, 401, path);
		resp_free(&r);
	}
	cr_assert_gt(refused, 0);
	cr_assert_gt(allowed, 0);
}

Test(api, tokens_swap_at_run_time)
{
	const struct tr_api_token before[] = {{TR_ROLE_WRITE, "old-token"}};
	const struct tr_api_token after[] = {{TR_ROLE_READ, "new-token"}};
	struct start_opts o = {.role_tokens = before, .n_role_tokens = 1};
	char err[256] = "";
	struct resp r;

	restart(&o);
	token = "old-token";
	r = http("POST", "/jobs/5/cancel", NULL);
	cr_assert_neq(r.status, 403);
	resp_free(&r);
	cr_assert_eq(tr_api_set_tokens(api, NULL, after, 1, err, sizeof(err)), 0, "%s", err);
	r = http("GET", "/jobs", NULL);
	expect_status(&r, 403, "the old token after the swap");
	resp_free(&r);
	token = "new-token";
	r = http("GET", "/jobs", NULL);
	expect_status(&r, 200, "the new token");
	resp_free(&r);
	r = http("POST", "/jobs/5/cancel", NULL);
	expect_status(&r, 403, "a read token on a control route");
	resp_free(&r);
	/* An empty token is refused and changes nothing. */
	const struct tr_api_token empty[] = {{TR_ROLE_ADMIN, ""}};
	cr_assert_lt(tr_api_set_tokens(api, NULL, empty, 1, err, sizeof(err)), 0);
	r = http("GET", "/jobs", NULL);
	expect_status(&r, 200, "after a refused swap");
	resp_free(&r);
	token = NULL;
}

Test(api, start_refuses_bad_configs)
{
	char err[256] = "";
	struct start_opts o = {.host = "0.0.0.0"};
	const char *const empty[] = {NULL};

	cr_assert_null(start_with(&o, err, sizeof(err)));
	cr_assert(strstr(err, "token"), "%s", err);

	o = (struct start_opts){.tokens = empty};
	err[0] = '\0';
	cr_assert_null(start_with(&o, err, sizeof(err)));
	cr_assert(strstr(err, "empty"), "%s", err);

	o = (struct start_opts){.port = port};
	err[0] = '\0';
	cr_assert_null(start_with(&o, err, sizeof(err)));
	cr_assert(strstr(err, "in use"), "%s", err);

	o = (struct start_opts){.host = "not-an-address.invalid"};
	err[0] = '\0';
	cr_assert_null(start_with(&o, err, sizeof(err)));
	cr_assert_neq(err[0], '\0');

	/* Loopback IPv6 without tokens is fine (when the host has IPv6). */
	o = (struct start_opts){.host = "::1"};
	tr_api_t *v6 = start_with(&o, err, sizeof(err));

	if (v6)
		cr_assert_gt(tr_api_port(v6), 0);
	tr_api_stop(v6);
	tr_api_stop(NULL);
}

/* ---- routes and job JSON ---- */

Test(api, route_table)
{
	size_t n;
	const struct tr_api_route *routes = tr_api_routes(&n);
	char params[2][32], allow[64];
	int np = 0;
	bool known;

	cr_assert_geq(n, 18);
	for (size_t i = 0; i < n; i++) {
		cr_assert_not_null(routes[i].handler);
		cr_assert_eq(routes[i].path[0], '/');
		for (size_t j = 0; j < i; j++)
			cr_assert(strcmp(routes[i].method, routes[j].method) || strcmp(routes[i].path, routes[j].path),
				  "duplicate %s %s", routes[i].method, routes[i].path);
	}
	const struct tr_api_route *r = tr_api_route_match("GET", "/jobs/17/metrics", params, 2, &np, &known);

	cr_assert_not_null(r);
	cr_assert_str_eq(r->path, "/jobs/{id}/metrics");
	cr_assert_eq(np, 1);
	cr_assert_str_eq(params[0], "17");
	cr_assert_null(tr_api_route_match("PUT", "/jobs/17", params, 2, &np, &known));
	cr_assert(known);
	cr_assert_null(tr_api_route_match("GET", "/jobs/17/x", params, 2, &np, &known));
	cr_assert(!known);
	tr_api_route_allow("/jobs/{x}", allow, sizeof(allow));
	cr_assert_str_eq(allow, "GET, PATCH, DELETE");
}

Test(api, job_json_from_row)
{
	struct tr_job_row row = {
		.id = 9,
		.name = "n",
		.state = "failed",
		.priority = 3,
		.spec = "{\"epochs\": 2}",
		.devices = "[0, 1]",
		.error = "{\"code\": \"loader\", \"message\": \"x.csv line 3\", \"step\": 7}",
		.submitted_at = 1700000000.1234,
		.started_at = 1700000001.9996,
		.finished_at = 0,
		.step = 7,
		.total_steps = 10,
		.epoch = 0,
		.loss = NAN,
	};
	json_t *live = json_pack("{s:I, s:f}", "step", (json_int_t)8, "eta_s", 3.0);
	json_t *j = tr_api_job_json(&row, live);

	cr_assert_not_null(j);
	cr_assert_eq(jint(j, "id"), 9);
	cr_assert_str_eq(jstr(j, "state"), "failed");
	cr_assert_eq(jint(json_object_get(j, "spec"), "epochs"), 2);
	cr_assert_eq(json_array_size(json_object_get(j, "devices")), 2);
	cr_assert_str_eq(jstr(j, "error.code"), "loader");
	cr_assert_str_eq(jstr(j, "submitted_at"), "2023-11-14T22:13:20.123Z");
	cr_assert_str_eq(jstr(j, "started_at"), "2023-11-14T22:13:22.000Z");
	cr_assert(json_is_null(json_object_get(j, "finished_at")));
	cr_assert_eq(jint(json_object_get(j, "progress"), "step"), 8, "live values win");
	cr_assert(json_is_null(json_object_get(json_object_get(j, "progress"), "loss")));
	json_decref(j);
	json_decref(live);
}

/* ---- checkpoints ---- */

/* A checkpoint laid out as the engine writes one: the parameters first,
 * in one run, then an optimizer state buffer per parameter; the
 * weights-only file is the parameters alone, so its header plus the
 * blob's parameter bytes must give exactly `model`. */
struct fake_ckpt {
	uint8_t *blob, *model;
	size_t len, model_len;
	size_t model_header_len, params_offset, params_bytes;
	char sha256[65];
	float *buf;
};

static uint64_t le64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static void make_ckpt(int64_t rows, int64_t cols, int64_t step, struct fake_ckpt *c)
{
	size_t nw = (size_t)(rows * cols), nb = (size_t)rows;
	char err[256] = "", stepstr[32];
	json_t *meta, *model_meta;

	memset(c, 0, sizeof(*c));
	c->buf = malloc(2 * (nw + nb) * sizeof(float));
	cr_assert_not_null(c->buf);
	for (size_t i = 0; i < 2 * (nw + nb); i++)
		c->buf[i] = (float)step + (float)(i % 1000) * 0.001f;
	const float *w = c->buf, *b = w + nw, *mw = b + nb, *mb = mw + nw;
	struct tr_st_tensor ts[4] = {
		{.name = "0.weight", .ndim = 2, .shape = {rows, cols}, .data = w},
		{.name = "0.bias", .ndim = 1, .shape = {rows}, .data = b},
		{.name = "optimizer.momentum_buffer.0.weight", .ndim = 2, .shape = {rows, cols}, .data = mw},
		{.name = "optimizer.momentum_buffer.0.bias", .ndim = 1, .shape = {rows}, .data = mb},
	};

	snprintf(stepstr, sizeof(stepstr), "%" PRId64, step);
	meta = json_pack("{s:s}", "step", stepstr);
	model_meta = json_pack("{s:s, s:s}", "step", stepstr, "kind", "model");
	cr_assert_eq(tr_st_serialize(ts, 4, meta, &c->blob, &c->len, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(tr_st_serialize(ts, 2, model_meta, &c->model, &c->model_len, err, sizeof(err)), 0, "%s", err);
	json_decref(meta);
	json_decref(model_meta);
	c->params_offset = 8 + (size_t)le64(c->blob);
	c->model_header_len = 8 + (size_t)le64(c->model);
	c->params_bytes = (nw + nb) * sizeof(float);
	cr_assert_eq(c->model_len, c->model_header_len + c->params_bytes);
	cr_assert(!memcmp(c->blob + c->params_offset, c->model + c->model_header_len, c->params_bytes));
	tr_sha256_hex(c->blob, c->len, c->sha256);
}

static void free_ckpt(struct fake_ckpt *c)
{
	free(c->blob);
	free(c->model);
	free(c->buf);
}

/* Stores c through the real writer, in uneven pieces so the store's
 * chunking is exercised. */
static void store_ckpt(int64_t job, int64_t step, int64_t epoch, const struct fake_ckpt *c)
{
	tr_ckpt_writer_t *w = NULL;
	struct tr_ckpt_row row = {0};
	size_t piece = 1000003;

	cr_assert_eq(tr_store_ckpt_begin(store, job, step, epoch, "{\"reason\":\"test\"}", &w), 0, "begin: %s",
		     tr_store_error(store));
	for (size_t off = 0; off < c->len; off += piece)
		cr_assert_eq(tr_store_ckpt_write(w, c->blob + off, c->len - off < piece ? c->len - off : piece), 0);
	cr_assert_eq(tr_store_ckpt_commit(w, c->model, c->model_header_len, (int64_t)c->params_offset,
					  (int64_t)c->params_bytes, 3, &row),
		     0, "commit: %s", tr_store_error(store));
	cr_assert_eq(row.bytes, (int64_t)c->len);
	cr_assert_str_eq(row.sha256, c->sha256);
	tr_ckpt_row_finish(&row);
}

/* What a client does with a downloaded model.safetensors: frame, header
 * JSON, offsets that cover the data exactly, and the values. */
static void check_model_file(const uint8_t *data, size_t len, const struct fake_ckpt *c, int64_t rows,
			     int64_t cols)
{
	uint64_t n;
	json_t *h, *t;
	const char *key;
	uint64_t end = 0;
	tr_st_file_t *f = NULL;
	char err[256] = "";
	float *got;

	cr_assert_geq(len, 8);
	n = le64(data);
	cr_assert_leq(n, len - 8, "header length %" PRIu64 " past the file (%zu bytes)", n, len);
	h = json_loadb((const char *)data + 8, (size_t)n, 0, NULL);
	cr_assert(json_is_object(h), "the header is not a JSON object");
	json_object_foreach(h, key, t) {
		if (!strcmp(key, "__metadata__")) {
			cr_assert_str_eq(json_string_value(json_object_get(t, "kind")), "model");
			continue;
		}
		cr_assert(strncmp(key, "optimizer.", 10), "the weights carry optimizer state: %s", key);
		cr_assert_str_eq(json_string_value(json_object_get(t, "dtype")), "F32");
		json_int_t e = json_integer_value(json_array_get(json_object_get(t, "data_offsets"), 1));

		if ((uint64_t)e > end)
			end = (uint64_t)e;
	}
	cr_assert_eq(json_object_size(h), 3, "0.weight, 0.bias and __metadata__");
	json_decref(h);
	cr_assert_eq(8 + n + end, len, "the data region is %zu bytes, the offsets cover %" PRIu64, len - 8 - n, end);

	cr_assert_eq(tr_st_open_mem(data, len, "model.safetensors", &f, err, sizeof(err)), 0, "%s", err);
	got = malloc((size_t)(rows * cols) * sizeof(float));
	cr_assert_eq(tr_st_read_f32(f, "0.weight", 2, (const int64_t[]){rows, cols}, got, err, sizeof(err)), 0, "%s",
		     err);
	cr_assert(!memcmp(got, c->buf, (size_t)(rows * cols) * sizeof(float)));
	cr_assert_eq(tr_st_read_f32(f, "0.bias", 1, (const int64_t[]){rows}, got, err, sizeof(err)), 0, "%s", err);
	cr_assert(!memcmp(got, c->buf + rows * cols, (size_t)rows * sizeof(float)));
	free(got);
	tr_st_close(f);
}

Test(api, checkpoint_list_and_request)
{
	int64_t id = submit("ckpt"), other = submit("other");
	struct fake_ckpt a, b;
	struct resp r;
	json_t *list;
	regex_t rfc3339;

	r = http("GET", "/jobs/1/checkpoints", NULL);
	expect_status(&r, 200, "list without checkpoints");
	cr_assert_eq(json_array_size(json_object_get(r.json, "checkpoints")), 0);
	cr_assert_eq(json_object_size(r.json), 1);
	resp_free(&r);

	make_ckpt(4, 3, 100, &a);
	make_ckpt(4, 3, 200, &b);
	store_ckpt(id, 100, 1, &a);
	store_ckpt(id, 200, 2, &b);
	store_ckpt(other, 7, 0, &a);

	r = http("GET", "/jobs/1/checkpoints", NULL);
	expect_status(&r, 200, "list");
	list = json_object_get(r.json, "checkpoints");
	cr_assert_eq(json_array_size(list), 2, "only job 1's: %s", r.body.data);
	cr_assert_eq(regcomp(&rfc3339, "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z$",
			     REG_EXTENDED | REG_NOSUB),
		     0);
	for (size_t i = 0; i < 2; i++) {
		const json_t *c = json_array_get(list, i);
		const struct fake_ckpt *want = i == 0 ? &b : &a;

		cr_assert_eq(json_object_size(c), 6, "step, epoch, created_at, bytes, sha256, best: %s", r.body.data);
		cr_assert(json_is_false(json_object_get(c, "best")), "%s", r.body.data);
		cr_assert_eq(jint(c, "step"), i == 0 ? 200 : 100, "newest first");
		cr_assert_eq(jint(c, "epoch"), i == 0 ? 2 : 1);
		cr_assert_eq(jint(c, "bytes"), (json_int_t)want->len);
		cr_assert_str_eq(jstr(c, "sha256"), want->sha256);
		cr_assert_eq(regexec(&rfc3339, jstr(c, "created_at"), 0, NULL, 0), 0, "created_at %s",
			     jstr(c, "created_at"));
	}
	regfree(&rfc3339);
	resp_free(&r);

	/* A checkpoint on request: refused unless running, passed on then. */
	atomic_store(&checkpoint_requests, 0);
	r = http("POST", "/jobs/1/checkpoints", NULL);
	expect_status(&r, 409, "checkpoint of a queued job");
	cr_assert_str_eq(jstr(r.json, "error.code"), "conflict");
	resp_free(&r);
	cr_assert_eq(tr_store_job_set_state(store, id, "running", NULL, NULL), 0);
	r = http("POST", "/jobs/1/checkpoints", NULL);
	expect_status(&r, 202, "checkpoint of a running job");
	cr_assert(json_is_true(json_object_get(r.json, "requested")));
	cr_assert_eq(jint(r.json, "job"), 1);
	cr_assert_eq(json_object_size(r.json), 2);
	resp_free(&r);
	cr_assert_eq(atomic_load(&checkpoint_requests), 1);
	free_ckpt(&a);
	free_ckpt(&b);
}

Test(api, checkpoint_downloads_stream_both_files)
{
	/* Several 4 MiB store chunks, so both downloads cross chunk
	 * boundaries at offsets that are not aligned to anything. */
	const int64_t rows = 1000, cols = 1100;
	int64_t id = submit("big");
	struct fake_ckpt small, big;
	char h[256], want[256];
	struct resp r;

	make_ckpt(4, 3, 100, &small);
	make_ckpt(rows, cols, 200, &big);
	cr_assert_gt(big.len, (size_t)8 << 20);
	store_ckpt(id, 100, 0, &small);
	store_ckpt(id, 200, 1, &big);

	/* checkpoint.safetensors: the blob, byte for byte. */
	r = http("GET", "/jobs/1/checkpoints/200/checkpoint.safetensors", NULL);
	cr_assert_eq(r.status, 200, "%s", r.body.data);
	cr_assert_eq(r.body.len, big.len);
	cr_assert(!memcmp(r.body.data, big.blob, big.len));
	cr_assert_str_eq(header(&r, "Content-Type", h, sizeof(h)), "application/octet-stream");
	snprintf(want, sizeof(want), "%zu", big.len);
	cr_assert_str_eq(header(&r, "Content-Length", h, sizeof(h)), want);
	snprintf(want, sizeof(want), "\"%s\"", big.sha256);
	cr_assert_str_eq(header(&r, "ETag", h, sizeof(h)), want);
	cr_assert_str_eq(header(&r, "Content-Disposition", h, sizeof(h)),
			 "attachment; filename=\"job-1-step-200-checkpoint.safetensors\"");
	resp_free(&r);

	/* model.safetensors: the stored header, then the parameter bytes. */
	r = http("GET", "/jobs/1/checkpoints/200/model.safetensors", NULL);
	cr_assert_eq(r.status, 200, "%s", r.body.data);
	cr_assert_eq(r.body.len, big.model_len);
	cr_assert(!memcmp(r.body.data, big.model, big.model_len));
	check_model_file((const uint8_t *)r.body.data, r.body.len, &big, rows, cols);
	snprintf(want, sizeof(want), "%zu", big.model_len);
	cr_assert_str_eq(header(&r, "Content-Length", h, sizeof(h)), want);
	cr_assert_str_eq(header(&r, "Content-Type", h, sizeof(h)), "application/octet-stream");
	cr_assert_str_eq(header(&r, "Content-Disposition", h, sizeof(h)),
			 "attachment; filename=\"job-1-step-200-model.safetensors\"");
	resp_free(&r);

	/* "latest" is the newest; the file name has its real step. */
	r = http("GET", "/jobs/1/checkpoints/latest/model.safetensors", NULL);
	cr_assert_eq(r.status, 200);
	cr_assert_eq(r.body.len, big.model_len);
	cr_assert_str_eq(header(&r, "Content-Disposition", h, sizeof(h)),
			 "attachment; filename=\"job-1-step-200-model.safetensors\"");
	resp_free(&r);

	/* An older one by its step, both files. */
	r = http("GET", "/jobs/1/checkpoints/100/checkpoint.safetensors", NULL);
	cr_assert_eq(r.status, 200);
	cr_assert_eq(r.body.len, small.len);
	cr_assert(!memcmp(r.body.data, small.blob, small.len));
	resp_free(&r);
	r = http("GET", "/jobs/1/checkpoints/100/model.safetensors", NULL);
	cr_assert_eq(r.status, 200);
	cr_assert_eq(r.body.len, small.model_len);
	cr_assert(!memcmp(r.body.data, small.model, small.model_len));
	check_model_file((const uint8_t *)r.body.data, r.body.len, &small, 4, 3);
	resp_free(&r);

	/* HEAD: the same headers, no body. */
	r = http_full("HEAD", "/jobs/1/checkpoints/latest/checkpoint.safetensors", NULL, NULL, 0);
	cr_assert_eq(r.status, 200);
	cr_assert_eq(r.body.len, 0);
	snprintf(want, sizeof(want), "%zu", big.len);
	cr_assert_str_eq(header(&r, "Content-Length", h, sizeof(h)), want);
	snprintf(want, sizeof(want), "\"%s\"", big.sha256);
	cr_assert_str_eq(header(&r, "ETag", h, sizeof(h)), want);
	resp_free(&r);
	r = http_full("HEAD", "/jobs/1/checkpoints/7/model.safetensors", NULL, NULL, 0);
	cr_assert_eq(r.status, 404);
	resp_free(&r);

	r = http("GET", "/jobs/1/checkpoints/150/model.safetensors", NULL);
	expect_status(&r, 404, "a step without a checkpoint");
	cr_assert_str_eq(jstr(r.json, "error.message"), "job 1 has no checkpoint at step 150");
	resp_free(&r);

	free_ckpt(&small);
	free_ckpt(&big);
}

struct fetch {
	const char *path;
	size_t len;
	char sha256[65];
	long status;
};

static void *fetch_run(void *cls)
{
	struct fetch *f = cls;
	struct resp r = http("GET", f->path, NULL);

	f->status = r.status;
	f->len = r.body.len;
	tr_sha256_hex(r.body.data ? r.body.data : "", r.body.len, f->sha256);
	resp_free(&r);
	return NULL;
}

Test(api, checkpoint_downloads_in_parallel)
{
	int64_t id = submit("par");
	struct fake_ckpt c;
	pthread_t t[6];
	struct fetch f[6];

	make_ckpt(600, 1000, 5, &c);
	store_ckpt(id, 5, 0, &c);
	for (int i = 0; i < 6; i++) {
		f[i] = (struct fetch){.path = i % 2 ? "/jobs/1/checkpoints/5/model.safetensors"
						    : "/jobs/1/checkpoints/latest/checkpoint.safetensors"};
		cr_assert_eq(pthread_create(&t[i], NULL, fetch_run, &f[i]), 0);
	}
	char model_sha[65];

	tr_sha256_hex(c.model, c.model_len, model_sha);
	for (int i = 0; i < 6; i++) {
		pthread_join(t[i], NULL);
		cr_assert_eq(f[i].status, 200, "%s", f[i].path);
		cr_assert_eq(f[i].len, i % 2 ? c.model_len : c.len, "%s", f[i].path);
		cr_assert_str_eq(f[i].sha256, i % 2 ? model_sha : c.sha256, "%s", f[i].path);
	}
	free_ckpt(&c);
}

/* ---- SSE ---- */

struct frame {
	int64_t id;
	char type[32];
	char *data;
};

struct sse_client {
	char path[256];
	char last_event_id[32];
	struct buf got;
	pthread_mutex_t lock;
	long status;
	CURLcode rc;
	char content_type[128];
	double elapsed;
};

static size_t sse_on_data(char *p, size_t size, size_t n, void *cls)
{
	struct sse_client *c = cls;
	size_t rc;

	pthread_mutex_lock(&c->lock);
	rc = on_data(p, size, n, &c->got);
	pthread_mutex_unlock(&c->lock);
	return rc;
}

static void *sse_run(void *cls)
{
	struct sse_client *c = cls;
	struct curl_slist *list = NULL;
	char url[512], h[64], *ct = NULL;
	double t0 = now_s();
	CURL *e = curl_easy_init();

	snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", port, c->path);
	curl_easy_setopt(e, CURLOPT_URL, url);
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, sse_on_data);
	curl_easy_setopt(e, CURLOPT_WRITEDATA, c);
	curl_easy_setopt(e, CURLOPT_TIMEOUT, 30L);
	if (c->last_event_id[0]) {
		snprintf(h, sizeof(h), "Last-Event-ID: %s", c->last_event_id);
		list = curl_slist_append(list, h);
	}
	curl_easy_setopt(e, CURLOPT_HTTPHEADER, list);
	c->rc = curl_easy_perform(e);
	curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &c->status);
	curl_easy_getinfo(e, CURLINFO_CONTENT_TYPE, &ct);
	snprintf(c->content_type, sizeof(c->content_type), "%s", ct ? ct : "");
	c->elapsed = now_s() - t0;
	curl_slist_free_all(list);
	curl_easy_cleanup(e);
	return NULL;
}

static void sse_init(struct sse_client *c, int64_t job, const char *last_id)
{
	memset(c, 0, sizeof(*c));
	snprintf(c->path, sizeof(c->path), "/jobs/%" PRId64 "/events", job);
	snprintf(c->last_event_id, sizeof(c->last_event_id), "%s", last_id ? last_id : "");
	pthread_mutex_init(&c->lock, NULL);
}

/* Parses "id:/event:/data:" frames; comments and retry lines are skipped. */
static int parse_frames(const char *text, struct frame *out, int max)
{
	int n = 0;
	const char *p = text;

	while (p && *p && n < max) {
		const char *end = strstr(p, "\n\n");
		size_t len = end ? (size_t)(end - p) : strlen(p);
		char *blk = strndup(p, len), *save = NULL;
		struct frame f = {0};
		bool any = false;

		for (char *line = strtok_r(blk, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
			if (!strncmp(line, "id: ", 4)) {
				f.id = strtoll(line + 4, NULL, 10);
				any = true;
			} else if (!strncmp(line, "event: ", 7)) {
				snprintf(f.type, sizeof(f.type), "%s", line + 7);
			} else if (!strncmp(line, "data: ", 6)) {
				f.data = strdup(line + 6);
			}
		}
		free(blk);
		if (any)
			out[n++] = f;
		else
			free(f.data);
		p = end ? end + 2 : NULL;
	}
	return n;
}

static void frames_free(struct frame *f, int n)
{
	for (int i = 0; i < n; i++)
		free(f[i].data);
}

static bool wait_for(struct sse_client *c, const char *needle, double seconds)
{
	double until = now_s() + seconds;

	while (now_s() < until) {
		bool found;

		pthread_mutex_lock(&c->lock);
		found = c->got.data && strstr(c->got.data, needle);
		pthread_mutex_unlock(&c->lock);
		if (found)
			return true;
		usleep(10000);
	}
	return false;
}

static int count_type(const struct frame *f, int n, const char *type)
{
	int k = 0;

	for (int i = 0; i < n; i++)
		k += !strcmp(f[i].type, type);
	return k;
}

Test(api, sse_live_then_resume_without_duplicates)
{
	int64_t id = submit("sse");
	struct sse_client c, again;
	struct frame f[64], g[64];
	pthread_t th;
	int n, m;
	char last[32];

	sse_init(&c, id, NULL);
	pthread_create(&th, NULL, sse_run, &c);
	cr_assert(wait_for(&c, "retry:", 5), "stream opened");
	cr_assert_eq(tr_store_job_set_state(store, id, "running", NULL, NULL), 0);
	cr_assert_eq(tr_store_metric_append(store, id, "loss", 1, 0, now_s(), 0.5), 0);
	cr_assert_eq(tr_store_log_append(store, id, 6, "step 1 done"), 0);
	cr_assert_eq(tr_store_flush(store), 0);
	cr_assert(wait_for(&c, "step 1 done", 5), "live log event arrives");
	cr_assert_eq(tr_store_job_set_state(store, id, "completed", NULL, NULL), 0);
	pthread_join(th, NULL);

	cr_assert_eq(c.rc, CURLE_OK, "%s", curl_easy_strerror(c.rc));
	cr_assert_eq(c.status, 200);
	cr_assert_str_eq(c.content_type, "text/event-stream");
	n = parse_frames(c.got.data, f, 64);
	cr_assert_geq(count_type(f, n, "state"), 2, "%s", c.got.data);
	cr_assert_eq(count_type(f, n, "metrics"), 1, "%s", c.got.data);
	cr_assert_eq(count_type(f, n, "log"), 1, "%s", c.got.data);
	cr_assert_str_eq(f[n - 1].type, "state", "the stream ends on the terminal state");
	json_t *d = json_loads(f[n - 1].data, 0, NULL);

	cr_assert_str_eq(jstr(d, "state"), "completed");
	json_decref(d);
	for (int i = 1; i < n; i++)
		cr_assert_gt(f[i].id, f[i - 1].id, "ids increase");

	/* Monitors may arrive after the end; a reconnect picks them up,
	 * and only them. */
	cr_assert_eq(tr_store_metric_append(store, id, "late", 5, 0, now_s(), 1.0), 0);
	cr_assert_eq(tr_store_flush(store), 0);
	snprintf(last, sizeof(last), "%" PRId64, f[n - 1].id);
	sse_init(&again, id, last);
	sse_run(&again);
	m = parse_frames(again.got.data, g, 64);
	cr_assert_eq(m, 1, "%s", again.got.data);
	cr_assert_str_eq(g[0].type, "metrics");
	cr_assert(strstr(g[0].data, "late"));

	/* Resuming from the middle of the history gives exactly the rest. */
	int k = n / 2;

	frames_free(g, m);
	free(again.got.data);
	snprintf(last, sizeof(last), "%" PRId64, f[k].id);
	sse_init(&again, id, last);
	sse_run(&again);
	m = parse_frames(again.got.data, g, 64);
	cr_assert_eq(m, n - k - 1 + 1, "rest of history plus the late metrics: %s", again.got.data);
	for (int i = 0; i < n - k - 1; i++) {
		cr_assert_eq(g[i].id, f[k + 1 + i].id);
		cr_assert_str_eq(g[i].data, f[k + 1 + i].data);
	}
	frames_free(g, m);
	free(again.got.data);

	/* The query parameter works like the header. */
	char path[128];
	struct resp r;

	snprintf(path, sizeof(path), "/jobs/%" PRId64 "/events?last_event_id=%" PRId64, id, f[n - 2].id);
	r = http("GET", path, NULL);
	cr_assert_eq(r.status, 200);
	m = parse_frames(r.body.data, g, 64);
	cr_assert_eq(m, 2, "%s", r.body.data);
	cr_assert_eq(g[0].id, f[n - 1].id);
	frames_free(g, m);
	resp_free(&r);

	frames_free(f, n);
	free(c.got.data);
}

Test(api, sse_heartbeat)
{
	struct start_opts o = {.heartbeat_s = 1};
	int64_t id;
	struct sse_client c;
	pthread_t th;

	restart(&o);
	id = submit("hb");
	cr_assert_eq(tr_store_job_set_state(store, id, "running", NULL, NULL), 0);
	sse_init(&c, id, NULL);
	pthread_create(&th, NULL, sse_run, &c);
	cr_assert(wait_for(&c, ": keepalive\n\n", 5), "a keepalive comment within the heartbeat");
	cr_assert_eq(tr_store_job_set_state(store, id, "failed", "{\"code\":\"x\",\"message\":\"y\"}", NULL), 0);
	pthread_join(th, NULL);
	cr_assert_eq(c.rc, CURLE_OK);
	free(c.got.data);
}

Test(api, sse_ends_when_job_is_deleted)
{
	struct start_opts o = {.heartbeat_s = 1};
	struct sse_client c;
	pthread_t th;
	int64_t id;

	restart(&o);
	id = submit("gone");
	struct resp r = http("GET", "/jobs/999/events", NULL);

	expect_status(&r, 404, "events of an unknown job");
	resp_free(&r);
	cr_assert_eq(tr_store_job_set_state(store, id, "running", NULL, NULL), 0);
	sse_init(&c, id, NULL);
	pthread_create(&th, NULL, sse_run, &c);
	cr_assert(wait_for(&c, "event: state", 5));
	cr_assert_eq(tr_store_job_delete(store, id), 0);
	pthread_join(th, NULL);
	cr_assert_eq(c.rc, CURLE_OK);
	cr_assert_lt(c.elapsed, 5.0);
	free(c.got.data);
}

Test(api, stop_ends_open_streams_promptly)
{
	int64_t id = submit("long");
	struct sse_client c;
	pthread_t th;
	double t0;

	cr_assert_eq(tr_store_job_set_state(store, id, "running", NULL, NULL), 0);
	sse_init(&c, id, NULL);
	pthread_create(&th, NULL, sse_run, &c);
	cr_assert(wait_for(&c, "event: state", 5), "history replayed: %s", c.got.data ? c.got.data : "");
	t0 = now_s();
	tr_api_stop(api);
	api = NULL;
	cr_assert_lt(now_s() - t0, 2.0, "tr_api_stop took %.2f s", now_s() - t0);
	pthread_join(th, NULL);
	cr_assert_lt(c.elapsed, 10.0);
	free(c.got.data);
}

/* POST /jobs/{id}/resume: the body is optional (an empty one is taken
 * whatever its Content-Type), and when given it is {"epochs": N} or
 * {"max_steps": N}, refused with its pointer otherwise. */
Test(api, resume_takes_an_optional_new_end)
{
	int64_t id = submit("resumable");
	char path[64];
	struct resp r;
	static const char *const form[] = {"Content-Type: application/x-www-form-urlencoded", NULL};
	static const struct {
		const char *body, *pointer;
	} bad[] = {
		{"{\"epochs\": 0}", "/epochs"},
		{"{\"epochs\": \"4\"}", "/epochs"},
		{"{\"max_steps\": -3}", "/max_steps"},
		{"{\"epochs\": 2, \"max_steps\": 10}", "/epochs"},
		{"{\"epoch\": 2}", "/epoch"},
		{"{\"epochs\": 2000000}", "/epochs"},
	};

	snprintf(path, sizeof(path), "/jobs/%" PRId64 "/resume", id);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		r = http("POST", path, bad[i].body);
		expect_status(&r, 400, bad[i].body);
		cr_assert_str_eq(jstr(json_object_get(r.json, "error"), "code"), "invalid_request", "%s", bad[i].body);
		cr_assert_str_eq(jstr(json_object_get(r.json, "error"), "pointer"), bad[i].pointer, "%s", bad[i].body);
		resp_free(&r);
	}
	/* A body that is not JSON, with a JSON type or without. */
	r = http("POST", path, "epochs=4");
	expect_status(&r, 400, "not JSON");
	resp_free(&r);
	r = http_full("POST", path, "{\"epochs\": 4}", form, 0);
	expect_status(&r, 415, "a form body");
	resp_free(&r);
	/* Legal bodies reach the daemon, whose table refuses a queued job. */
	r = http("POST", path, "{\"epochs\": 4}");
	expect_status(&r, 409, "queued");
	cr_assert(strstr(jstr(json_object_get(r.json, "error"), "message"), "only a paused or stopped job can be resumed"),
		  "%s", r.body);
	resp_free(&r);
	cr_assert_eq(tr_store_job_set_state(store, id, "stopped", NULL, NULL), 0);
	r = http_full("POST", path, "", form, 0); /* empty, with a form type: no body */
	expect_status(&r, 202, "stopped, empty body");
	cr_assert_str_eq(jstr(r.json, "state"), "queued");
	resp_free(&r);
	cr_assert_eq(tr_store_job_set_state(store, id, "stopped", NULL, NULL), 0);
	r = http("POST", path, "{\"max_steps\": 500}");
	expect_status(&r, 202, "stopped, new end");
	resp_free(&r);
}
