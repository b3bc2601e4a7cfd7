/* /jobs/{id}/metrics: reading series (name filter, step range, min/max
 * downsampling done by the store, 2,000 points per series unless asked
 * otherwise) and pushing custom monitor points.
 * Pushed names may not shadow the engine's own metrics (docs/design.md §6):
 * a monitor writing "loss" would silently corrupt the curve everyone
 * reads.  A push is validated whole before any point is queued, so a bad
 * point 9000 does not leave 8999 points behind.  A pushed point replaces
 * the series' point at its step, and a pushed series can be deleted whole
 * (docs/design.md, "Pushed metrics").
 */
#include "api/api_internal.h"
#include "api/metrics_stream.h"
#include "api/rcache.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NAME_MAX_LEN 64
#define MAX_NAMES 256
/* Every answer is bounded: a series comes downsampled to max_points
 * (default MAX_POINTS_DEFAULT), and max_points=0 ("every point") is only
 * answered while each series has at most MAX_POINTS_PARAM points in range
 * (400 otherwise: the client narrows from_step/to_step). */
#define MAX_POINTS_PARAM 100000
#define MAX_POINTS_DEFAULT 2000
/* Answers with more points than this, or that may have more (above this
 * max_points, or undownsampled), are streamed instead of cached. */
#define CACHED_POINTS_MAX 100000
#define PUSH_MAX 10000

static const char *const engine_names[] = {
	"loss",     "lr",           "samples_per_sec", "step_ms",     "data_wait_ms",
	"val_loss", "val_accuracy", "grad_norm",       "weight_norm",
};

static bool valid_name(const char *s, size_t len)
{
	if (len < 1 || len > NAME_MAX_LEN)
		return false;
	for (size_t i = 0; i < len; i++) {
		char c = s[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
		      c == '.' || c == ':' || c == '/' || c == '-'))
			return false;
	}
	return true;
}

static bool engine_name(const char *s)
{
	size_t n = strlen(s), digits;

	for (size_t i = 0; i < sizeof(engine_names) / sizeof(engine_names[0]); i++)
		if (strcmp(s, engine_names[i]) == 0)
			return true;
	/* grad_norm.<layer>, weight_norm.<layer> (per_layer) and update_ratio.<layer> */
	for (size_t i = 0; i < 3; i++) {
		const char *base = i == 0 ? "grad_norm." : i == 1 ? "weight_norm." : "update_ratio.";
		size_t len = strlen(base);

		if (strncmp(s, base, len) == 0 && n > len && strspn(s + len, "0123456789") == n - len)
			return true;
	}
	/* device<k>_step_ms */
	if (n < strlen("device0_step_ms") || strncmp(s, "device", 6) != 0)
		return false;
	digits = strspn(s + 6, "0123456789");
	return digits > 0 && strcmp(s + 6 + digits, "_step_ms") == 0;
}

/* ---- response cache ------------------------------------------------------
 *
 * Dashboards poll the same downsampled series again and again, and a
 * series only changes when the store commits that job's data (at most
 * every 200 ms while it runs, never once it ended), while each answer
 * costs milliseconds of SQLite reads.  Rendered answers are kept with the
 * job's data generation (api/rcache.h): another job's commits leave them
 * valid, concurrent misses of one answer compute it once, and a hit is a
 * copy of the bytes rather than another rendering of the JSON. */

/* Far above a query's usual milliseconds: only a stuck computation makes
 * its waiters compute on their own. */
#define CACHE_WAIT_MS 2000

void tr_api_metrics_cache_forget(const tr_store_t *store)
{
	tr_store_set_commit_hook((tr_store_t *)store, NULL, NULL);
	tr_rcache_forget(store);
}

/* The cache key: the names as asked ("*" for all), the range, max_points
 * and the flags.  Names cannot hold '|' (valid_name), so the key can be
 * read back (refresh_answer). */
#define KEY_FMT "%s|%" PRId64 "|%" PRId64 "|%d|%d|%d"

/* tr_rcache_refresh's way to an answer: the query read back from its key. */
static int refresh_answer(const void *owner, int64_t job, const char *query, char **body, size_t *len)
{
	struct tr_metrics_query q = {.want_text = true};
	const char *bar = strchr(query, '|');
	int max_points, epochs, times, rc = -EINVAL;
	if (!bar || sscanf(bar, "|%" SCNd64 "|%" SCNd64 "|%d|%d|%d", &q.from_step, &q.to_step, &max_points, &epochs,
			   &times) != 5)
		return -EINVAL;
	q.max_points = max_points;
	q.with_epochs = epochs;
	q.with_times = times;
	char *copy = strndup(query, (size_t)(bar - query));
	const char **names = NULL;
	size_t n = 1;
	if (!copy)
		return -ENOMEM;
	if (strcmp(copy, "*") != 0) {
		for (const char *t = copy; *t; t++)
			n += *t == ',';
		if (!(names = calloc(n + 1, sizeof *names)))
			goto cleanup;
		char *p = copy;
		for (size_t i = 0; i < n; i++) {
			char *comma = strchr(p, ',');
			if (comma)
				*comma = '\0';
			names[i] = p;
			p = comma ? comma + 1 : p;
		}
		q.names = names;
	}
	rc = tr_api_metrics_render((tr_store_t *)owner, job, &q, CACHED_POINTS_MAX, body, len, NULL);
cleanup:
	free(names);
	free(copy);
	return rc;
}

/* The store's commit hook (tr_store_set_commit_hook): the polled answers
 * of the job just written are computed before its new generation shows. */
static void on_commit(void *ctx, tr_store_t *s, int64_t job_id, uint64_t gen)
{
	(void)ctx;
	tr_rcache_refresh(s, job_id, gen);
}

void tr_api_metrics_cache_start(tr_store_t *store)
{
	tr_store_set_commit_hook(store, on_commit, NULL);
}

struct metrics_compute {
	tr_store_t *store;
	int64_t job;
	const struct tr_metrics_query *q;
	struct tr_api_reply *rp; /* receives the error of a failed query */
};

static int compute_answer(void *ctx, char **out, size_t *len)
{
	struct metrics_compute *mc = ctx;
	struct tr_error e = {0};
	int rc = tr_api_metrics_render(mc->store, mc->job, mc->q, CACHED_POINTS_MAX, out, len, &e);

	/* Too large to cache: the caller streams it. */
	if (rc < 0 && rc != -EFBIG)
		tr_api_fail_store_err(mc->rp, &e, "reading metrics");
	return rc;
}

/* max_points=0 asks for every point: refused, naming the series, when one
 * has more than the cap in range. */
static int check_raw_cap(tr_store_t *store, int64_t id, const struct tr_metrics_query *q, struct tr_api_reply *rp)
{
	struct tr_metrics_query cq = *q;
	int rc;
	struct tr_error e = {0};

	cq.max_raw = MAX_POINTS_PARAM;
	cq.count_only = true;
	rc = tr_store_metrics_read(store, id, &cq, NULL, NULL, &e);
	if (rc == -E2BIG) {
		tr_api_fail(rp, 400, "invalid_parameter", NULL,
			    "max_points: 0 (every point) is limited to %d points per series: %s; ask for a "
			    "narrower from_step/to_step, or downsample with max_points of at most %d",
			    MAX_POINTS_PARAM, e.message, MAX_POINTS_PARAM);
		return -1;
	}
	if (rc < 0) {
		tr_api_fail_store_err(rp, &e, "reading metrics");
		return -1;
	}
	return 0;
}

static void reply_stream(tr_api_t *api, int64_t id, const struct tr_metrics_query *q, struct tr_api_reply *rp)
{
	struct tr_error e = {0};
	struct MHD_Response *resp = tr_api_metrics_stream(api->cfg.store, id, q, &e);

	if (!resp) {
		tr_api_fail_store_err(rp, &e, "reading metric names");
		return;
	}
	tr_api_reply_finish(rp);
	rp->status = 200;
	rp->stream = resp;
	tr_api_reply_header(rp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
}

/* Splits "a,b" into a NULL-terminated array pointing into *copy. */
static int split_names(const char *text, char **copy, const char ***names, struct tr_api_reply *rp)
{
	size_t n = 1, i = 0;
	char *p;

	for (const char *t = text; *t; t++)
		n += *t == ',';
	if (n > MAX_NAMES) {
		tr_api_fail(rp, 400, "invalid_parameter", NULL, "names: at most %d names", MAX_NAMES);
		return -1;
	}
	*copy = strdup(text);
	*names = calloc(n + 1, sizeof(**names));
	if (!*copy || !*names) {
		tr_api_fail(rp, 500, "internal", NULL, "out of memory");
		return -1;
	}
	p = *copy;
	for (;;) {
		char *comma = strchr(p, ',');

		if (comma)
			*comma = '\0';
		if (!valid_name(p, strlen(p))) {
			tr_api_fail(rp, 400, "invalid_parameter", NULL,
				    "names: \"%s\" is not a metric name (1 to %d of A-Z a-z 0-9 _ . : / -)", p,
				    NAME_MAX_LEN);
			return -1;
		}
		(*names)[i++] = p;
		if (!comma)
			break;
		p = comma + 1;
	}
	return 0;
}

void tr_api_metrics_get(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	tr_api_t *api = rq->api;
	struct tr_metrics_query q = {0};
	struct tr_job_row row;
	const char *names_text = tr_api_query(rq, "names");
	const char **names = NULL;
	char *copy = NULL;
	int64_t id, from, to, max_points;
	char *key = NULL;

	if (tr_api_path_id(rq, rp, &id) < 0)
		return;
	if (tr_api_load_job(api, rp, id, &row) < 0)
		return;
	tr_job_row_finish(&row);
	if (tr_api_query_int(rq, rp, "from_step", 0, INT64_MAX, 0, &from) < 0 ||
	    tr_api_query_int(rq, rp, "to_step", 0, INT64_MAX, INT64_MAX, &to) < 0 ||
	    tr_api_query_int(rq, rp, "max_points", 0, MAX_POINTS_PARAM, MAX_POINTS_DEFAULT, &max_points) < 0 ||
	    tr_api_query_bool(rq, rp, "epochs", false, &q.with_epochs) < 0 ||
	    tr_api_query_bool(rq, rp, "times", false, &q.with_times) < 0)
		goto cleanup;
	if (from > to) {
		tr_api_fail(rp, 400, "invalid_parameter", NULL,
			    "from_step: %" PRId64 " is greater than to_step %" PRId64, from, to);
		goto cleanup;
	}
	if (names_text && split_names(names_text, &copy, &names, rp) < 0)
		goto cleanup;
	q.names = names;
	q.from_step = from;
	q.to_step = to;
	q.max_points = (int)max_points;
	q.want_text = true;
	if (max_points == 0) {
		if (check_raw_cap(api->cfg.store, id, &q, rp) == 0)
			reply_stream(api, id, &q, rp);
		goto cleanup;
	}
	if (max_points > CACHED_POINTS_MAX / 10) {
		reply_stream(api, id, &q, rp);
		goto cleanup;
	}
	/* Sized to fit: a cut key would give two queries one answer. */
#define KEY_ARGS names_text ? names_text : "*", from, to, (int)max_points, (int)q.with_epochs, (int)q.with_times
	size_t key_len = (size_t)snprintf(NULL, 0, KEY_FMT, KEY_ARGS) + 1;
	key = malloc(key_len);
	if (!key) {
		tr_api_fail(rp, 500, "internal", NULL, "out of memory");
		goto cleanup;
	}
	snprintf(key, key_len, KEY_FMT, KEY_ARGS);
#undef KEY_ARGS
	/* Read before the query, so a commit racing the query changes it and
	 * the answer is not kept as current past that commit. */
	struct tr_rcache_key ck = {api->cfg.store, id, key, tr_store_job_data_generation(api->cfg.store, id)};
	struct metrics_compute mc = {api->cfg.store, id, &q, rp};
	char *text;
	size_t len;
	/* Only whole curves are recomputed at commit for their pollers: an
	 * incremental poll's from_step moves with every poll, so its answer is
	 * not asked again once the job commits (pages that poll at the same
	 * moment share it from the cache, which made it look polled and cost
	 * the metrics writer a recomputation per commit for nobody). */
	tr_rcache_refresh_fn refresh = from == 0 ? refresh_answer : NULL;
	int rc = tr_rcache_get_refreshable(&ck, refresh, CACHE_WAIT_MS, compute_answer, &mc, &text, &len);
	if (rc == -EFBIG) {
		reply_stream(api, id, &q, rp);
		goto cleanup;
	}
	if (rc == -ENOMEM)
		tr_api_fail(rp, 500, "internal", NULL, "out of memory");
	if (rc < 0)
		goto cleanup;
	tr_api_reply_finish(rp);
	rp->status = 200;
	rp->text = text;
	rp->text_len = len;
	rp->content_type = "application/json";
cleanup:
	free(key);
	free(names);
	free(copy);
}

/* Checks one pushed point; fills rp (with a pointer into the body) and
 * returns -1 when it is not acceptable. */
static int check_point(json_t *p, size_t i, struct tr_api_reply *rp)
{
	char ptr[128];
	const char *key;
	json_t *v;

	if (!json_is_object(p)) {
		snprintf(ptr, sizeof(ptr), "/points/%zu", i);
		tr_api_fail(rp, 400, "invalid_request", ptr, "a point must be an object");
		return -1;
	}
	json_object_foreach(p, key, v) {
		if (strcmp(key, "name") && strcmp(key, "step") && strcmp(key, "value") && strcmp(key, "epoch")) {
			char prefix[32];

			snprintf(prefix, sizeof(prefix), "/points/%zu", i);
			tr_api_pointer(ptr, sizeof(ptr), prefix, key);
			tr_api_fail(rp, 400, "invalid_request", ptr,
				    "unknown key \"%s\" (a point has name, step, value and epoch)", key);
			return -1;
		}
	}
	v = json_object_get(p, "name");
	snprintf(ptr, sizeof(ptr), "/points/%zu/name", i);
	if (!json_is_string(v) || !valid_name(json_string_value(v), json_string_length(v))) {
		tr_api_fail(rp, 400, "invalid_request", ptr,
			    "name: must be 1 to %d characters of A-Z a-z 0-9 _ . : / -", NAME_MAX_LEN);
		return -1;
	}
	if (engine_name(json_string_value(v))) {
		tr_api_fail(rp, 400, "invalid_request", ptr, "name: \"%s\" is recorded by the engine itself",
			    json_string_value(v));
		return -1;
	}
	/* The store keeps steps within 2^62 and would drop a point beyond
	 * (storage/store.h): refused here, by name, instead. */
	v = json_object_get(p, "step");
	if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > TR_STORE_STEP_LIMIT) {
		snprintf(ptr, sizeof(ptr), "/points/%zu/step", i);
		tr_api_fail(rp, 400, "invalid_request", ptr, "step: must be an integer in [0, %" PRId64 "]",
			    TR_STORE_STEP_LIMIT);
		return -1;
	}
	v = json_object_get(p, "value");
	if (!json_is_number(v) || !isfinite(json_number_value(v))) {
		snprintf(ptr, sizeof(ptr), "/points/%zu/value", i);
		tr_api_fail(rp, 400, "invalid_request", ptr, "value: must be a finite number");
		return -1;
	}
	v = json_object_get(p, "epoch");
	if (v && (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > TR_STORE_STEP_LIMIT)) {
		snprintf(ptr, sizeof(ptr), "/points/%zu/epoch", i);
		tr_api_fail(rp, 400, "invalid_request", ptr, "epoch: must be an integer in [0, %" PRId64 "]",
			    TR_STORE_STEP_LIMIT);
		return -1;
	}
	return 0;
}

void tr_api_metrics_push(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	tr_api_t *api = rq->api;
	struct tr_job_row row;
	json_t *body = NULL, *points, *p, *v;
	const char *key;
	int64_t id, job_epoch;
	size_t i, n, accepted = 0;
	int rc, first_error = 0;
	double wall;
	struct tr_error me = {0};

	if (tr_api_path_id(rq, rp, &id) < 0)
		return;
	if (tr_api_load_job(api, rp, id, &row) < 0)
		return;
	job_epoch = row.epoch;
	tr_job_row_finish(&row);
	if (tr_api_body_object(rq, rp, &body) < 0)
		return;
	json_object_foreach(body, key, v) {
		if (strcmp(key, "points") != 0) {
			char ptr[128];

			tr_api_pointer(ptr, sizeof(ptr), "", key);
			tr_api_fail(rp, 400, "invalid_request", ptr, "unknown key \"%s\" (the body has \"points\")",
				    key);
			goto cleanup;
		}
	}
	points = json_object_get(body, "points");
	n = json_array_size(points);
	if (!json_is_array(points) || n < 1 || n > PUSH_MAX) {
		tr_api_fail(rp, 400, "invalid_request", "/points", "points: must be an array of 1 to %d points",
			    PUSH_MAX);
		goto cleanup;
	}
	json_array_foreach(points, i, p)
		if (check_point(p, i, rp) < 0)
			goto cleanup;

	wall = tr_api_now();
	json_array_foreach(points, i, p) {
		v = json_object_get(p, "epoch");
		/* Without an epoch the point belongs to the job's current one. */
		/* A point for a step the series has replaces it: a client
		 * that re-posts after a lost answer makes no duplicate. */
		rc = tr_store_metric_put(api->cfg.store, id, json_string_value(json_object_get(p, "name")),
					 json_integer_value(json_object_get(p, "step")),
					 v ? json_integer_value(v) : job_epoch, wall,
					 json_number_value(json_object_get(p, "value")), &me);
		if (rc == 0)
			accepted++;
		else if (rc != -ENOBUFS && !first_error)
			first_error = rc;
	}
	/* Every point was checked above, so only a full queue or a closing
	 * store can refuse one; anything else is the daemon's fault, said so. */
	if (accepted < n) {
		if (first_error == -ESHUTDOWN)
			tr_api_fail(rp, 503, "unavailable", NULL,
				    "the daemon is shutting down: accepted %zu of %zu points", accepted, n);
		else if (first_error)
			tr_api_fail(rp, 500, "internal", NULL, "accepted %zu of %zu points: %s", accepted, n,
				    me.message);
		else
			tr_api_fail(rp, 503, "queue_full", NULL,
				    "the metrics queue is full: accepted %zu of %zu points", accepted, n);
		goto cleanup;
	}
	tr_api_reply_json(rp, 202, json_pack("{s:I}", "accepted", (json_int_t)accepted));
cleanup:
	json_decref(body);
}

void tr_api_metrics_delete(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	tr_api_t *api = rq->api;
	struct tr_job_row row;
	struct tr_error me = {0};
	int64_t id, deleted;
	/* The name from the URL itself: path parameters are cut to 31 bytes
	 * and names may have 64.  The route matched, so it follows the last
	 * '/'. */
	const char *name = strrchr(rq->url, '/') + 1;

	if (tr_api_path_id(rq, rp, &id) < 0)
		return;
	if (!valid_name(name, strlen(name))) {
		tr_api_fail(rp, 400, "invalid_parameter", NULL,
			    "name: must be 1 to %d characters of A-Z a-z 0-9 _ . : -", NAME_MAX_LEN);
		return;
	}
	if (engine_name(name)) {
		tr_api_fail(rp, 400, "invalid_parameter", NULL,
			    "name: \"%s\" is recorded by the engine itself; only pushed series can be deleted", name);
		return;
	}
	if (tr_api_load_job(api, rp, id, &row) < 0)
		return;
	tr_job_row_finish(&row);
	if (tr_store_metric_series_delete(api->cfg.store, id, name, &deleted, &me) < 0) {
		tr_api_fail_store_err(rp, &me, "deleting a metric series");
		return;
	}
	if (deleted == 0) {
		tr_api_fail(rp, 404, "not_found", NULL, "job %" PRId64 " has no series \"%s\"", id, name);
		return;
	}
	rp->status = 204;
}
