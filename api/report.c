/* Worker reports (docs/design.md, "Worker reports"): rank 0 of a Slurm
 * job's worker posts its progress, metric points and summary to
 * POST /jobs/{id}/report, authenticated with the job's own token
 * (daemon/job_token.h) or a role token with the write role.
 *
 * A job token is no role token: it is looked up here, by its SHA-256, for
 * the report routes alone (api/auth.c refuses it everywhere else, as it
 * refuses any token it does not know).  The job's stored hash is compared
 * in constant time; a token that is not the job's is 401, one of another
 * job 403.  Points replace the series' point at their step, so a retried
 * report (its reply lost) stores nothing twice. */
#include "api/api_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "storage/sha256.h"

#define REPORT_POINTS_MAX 10000
#define NAME_MAX_LEN 64

static unsigned equal_32(const unsigned char *a, const unsigned char *b, size_t n)
{
	unsigned char diff = 0;
	for (size_t i = 0; i < n; i++)
		diff |= a[i] ^ b[i];
	return diff == 0;
}

static void fail_401(struct tr_api_reply *rp, const char *why)
{
	tr_api_fail(rp, 401, "unauthorized", NULL, "%s", why);
	tr_api_reply_header(rp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"trainerd\"");
}

int tr_api_report_auth(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	tr_api_t *api = rq->api;
	const char *h = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
	if (!h || strncasecmp(h, "Bearer ", 7) != 0) {
		fail_401(rp, "a report needs an Authorization: Bearer token: the job's report token");
		return -1;
	}
	bool tokens;
	enum tr_api_role role = tr_api_auth_role(rq, &tokens);
	if (tokens && role >= tr_api_route_role(rq->route))
		return 0;
	if (tokens && role != TR_ROLE_NONE) {
		tr_api_fail(rp, 403, "forbidden", NULL,
			    "%s %s needs a token with the %s role; this token has the %s role (or the job's report "
			    "token)",
			    rq->method, rq->route->path, tr_api_role_name(tr_api_route_role(rq->route)),
			    tr_api_role_name(role));
		return -1;
	}
	const char *token = h + 7;
	while (*token == ' ')
		token++;
	struct tr_sha256 c;
	unsigned char given[32], want[32];
	char given_hex[65], want_hex[65];
	tr_sha256_init(&c);
	tr_sha256_update(&c, token, strlen(token));
	tr_sha256_final(&c, given);
	for (int i = 0; i < 32; i++)
		snprintf(given_hex + 2 * i, 3, "%02x", given[i]);
	int64_t id = 0, owner = 0;
	struct tr_error e = {0};
	bool mine = false;
	if (!api->cfg.store) { /* an API without a store (tests) has no job tokens */
		fail_401(rp, "the bearer token is not this job's report token");
		return -1;
	}
	if (tr_api_parse_int(rq->params[0], 1, INT64_MAX, &id) == 0 &&
	    tr_store_job_token_hash_of(api->cfg.store, id, want_hex, &e) == 0 && strlen(want_hex) == 64) {
		for (int i = 0; i < 32; i++)
			want[i] = (unsigned char)strtoul((char[3]){want_hex[2 * i], want_hex[2 * i + 1], 0}, NULL, 16);
		mine = equal_32(given, want, 32);
	}
	if (mine)
		return 0;
	if (tr_store_job_token_job_of(api->cfg.store, given_hex, &owner, &e) == 0 && owner != id) {
		tr_api_fail(rp, 403, "forbidden", NULL,
			    "this report token is another job's: it reports only for that job");
		return -1;
	}
	fail_401(rp, "the bearer token is not this job's report token (or the job has ended: its token is revoked)");
	return -1;
}

static int fail_at(struct tr_api_reply *rp, const char *ptr, const char *fmt, const char *what)
{
	tr_api_fail(rp, 400, "invalid_request", ptr, fmt, what);
	return -1;
}

/* An integer field of obj in [0, 2^62]; absent is def (or an error when
 * def < 0). */
static int get_count(json_t *obj, const char *key, const char *prefix, int64_t def, int64_t *out,
		     struct tr_api_reply *rp)
{
	char ptr[128];
	json_t *v = json_object_get(obj, key);
	snprintf(ptr, sizeof ptr, "%s/%s", prefix, key);
	if (!v && def >= 0) {
		*out = def;
		return 0;
	}
	if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > TR_STORE_STEP_LIMIT)
		return fail_at(rp, ptr, "%s: must be an integer in [0, 2^62]", key);
	*out = json_integer_value(v);
	return 0;
}

static bool only_keys(json_t *obj, const char *const *keys, const char *prefix, struct tr_api_reply *rp)
{
	const char *key;
	json_t *v;
	json_object_foreach(obj, key, v) {
		bool known = false;
		for (const char *const *k = keys; *k; k++)
			known |= !strcmp(key, *k);
		if (!known) {
			char ptr[128];
			tr_api_pointer(ptr, sizeof ptr, prefix, key);
			tr_api_fail(rp, 400, "invalid_request", ptr, "unknown key \"%s\"", key);
			return false;
		}
	}
	return true;
}

static int check_progress(json_t *p, struct tr_api_report *r, struct tr_api_reply *rp)
{
	static const char *const keys[] = {"step", "total_steps", "epoch", "loss", NULL};
	if (!json_is_object(p))
		return fail_at(rp, "/progress", "%s: must be an object {step, total_steps, epoch, loss}", "progress");
	if (!only_keys(p, keys, "/progress", rp) || get_count(p, "step", "/progress", -1, &r->step, rp) < 0 ||
	    get_count(p, "total_steps", "/progress", 0, &r->total_steps, rp) < 0 ||
	    get_count(p, "epoch", "/progress", 0, &r->epoch, rp) < 0)
		return -1;
	json_t *loss = json_object_get(p, "loss");
	if (loss && (!json_is_number(loss) || !isfinite(json_number_value(loss))))
		return fail_at(rp, "/progress/loss", "%s: must be a finite number", "loss");
	r->loss = loss ? json_number_value(loss) : NAN;
	r->have_progress = true;
	return 0;
}

static bool valid_name(const char *s)
{
	size_t n = strlen(s);
	return n >= 1 && n <= NAME_MAX_LEN &&
	       strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:/-") == n;
}

static int check_points(json_t *points, struct tr_api_reply *rp)
{
	static const char *const keys[] = {"name", "step", "epoch", "value", NULL};
	size_t i;
	json_t *p;
	char prefix[64], ptr[128];
	if (!json_is_array(points) || json_array_size(points) > REPORT_POINTS_MAX) {
		tr_api_fail(rp, 400, "invalid_request", "/points", "points: must be an array of at most %d points",
			    REPORT_POINTS_MAX);
		return -1;
	}
	json_array_foreach(points, i, p) {
		int64_t n;
		snprintf(prefix, sizeof prefix, "/points/%zu", i);
		if (!json_is_object(p))
			return fail_at(rp, prefix, "%s: must be an object {name, step, epoch, value}", "a point");
		if (!only_keys(p, keys, prefix, rp) || get_count(p, "step", prefix, -1, &n, rp) < 0 ||
		    get_count(p, "epoch", prefix, 0, &n, rp) < 0)
			return -1;
		json_t *v = json_object_get(p, "name");
		snprintf(ptr, sizeof ptr, "%s/name", prefix);
		if (!json_is_string(v) || !valid_name(json_string_value(v)))
			return fail_at(rp, ptr, "%s: must be 1 to 64 characters of A-Z a-z 0-9 _ . : / -", "name");
		v = json_object_get(p, "value");
		snprintf(ptr, sizeof ptr, "%s/value", prefix);
		if (!json_is_number(v) || !isfinite(json_number_value(v)))
			return fail_at(rp, ptr, "%s: must be a finite number", "value");
	}
	return 0;
}

static int check_summary(json_t *s, struct tr_api_reply *rp)
{
	if (!json_is_object(s))
		return fail_at(rp, "/summary", "%s: must be the worker's summary object", "summary");
	const char *state = json_string_value(json_object_get(s, "state"));
	if (!state || (strcmp(state, "completed") && strcmp(state, "stopped") && strcmp(state, "failed")))
		return fail_at(rp, "/summary/state", "%s: must be \"completed\", \"stopped\" or \"failed\"", "state");
	json_t *steps = json_object_get(s, "steps");
	if (steps && (!json_is_integer(steps) || json_integer_value(steps) < 0))
		return fail_at(rp, "/summary/steps", "%s: must be an integer >= 0", "steps");
	return 0;
}

void tr_api_report_post(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	static const char *const keys[] = {"progress", "points", "summary", NULL};
	tr_api_t *api = rq->api;
	struct tr_job_row row;
	struct tr_api_report r = {.loss = NAN};
	struct tr_error err = {0};
	json_t *body = NULL;
	char *summary = NULL;
	int64_t id;
	if (tr_api_path_id(rq, rp, &id) < 0 || tr_api_load_job(api, rp, id, &row) < 0)
		return;
	tr_job_row_finish(&row);
	if (tr_api_body_object(rq, rp, &body) < 0)
		return;
	json_t *progress = json_object_get(body, "progress"), *points = json_object_get(body, "points"),
	       *sum = json_object_get(body, "summary");
	if (!only_keys(body, keys, "", rp) || (progress && check_progress(progress, &r, rp) < 0) ||
	    (points && check_points(points, rp) < 0) || (sum && check_summary(sum, rp) < 0))
		goto cleanup;
	if (!progress && !points && !sum) {
		tr_api_fail(rp, 400, "invalid_request", "", "a report has progress, points or a summary");
		goto cleanup;
	}
	if (sum && !(r.summary = summary = json_dumps(sum, JSON_COMPACT))) {
		tr_api_fail(rp, 500, "internal", NULL, "out of memory");
		goto cleanup;
	}
	if (!api->cfg.ops.report) {
		tr_api_fail(rp, 503, "unavailable", NULL, "this daemon takes no worker reports");
		goto cleanup;
	}
	/* The job first (409 when it is no worker job running here), so that
	 * points of a job that cannot report are not stored. */
	if (api->cfg.ops.report(api->cfg.ctx, id, &r, &err) < 0) {
		tr_api_fail_op(rp, &err);
		goto cleanup;
	}
	size_t i, accepted = 0;
	json_t *p;
	double wall = tr_api_now();
	json_array_foreach(points, i, p) {
		struct tr_error me = {0};
		if (tr_store_metric_put(api->cfg.store, id, json_string_value(json_object_get(p, "name")),
					json_integer_value(json_object_get(p, "step")),
					json_integer_value(json_object_get(p, "epoch")), wall,
					json_number_value(json_object_get(p, "value")), &me) == 0)
			accepted++;
	}
	if (accepted < json_array_size(points)) {
		/* Only a full queue or a closing store refuses a checked point:
		 * the worker sends the report again (nothing is stored twice). */
		tr_api_fail(rp, 503, "queue_full", NULL, "stored %zu of %zu points: send the report again", accepted,
			    json_array_size(points));
		tr_api_reply_header(rp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
		goto cleanup;
	}
	tr_api_reply_json(rp, 200, json_pack("{s:I}", "accepted", (json_int_t)accepted));
cleanup:
	free(summary);
	json_decref(body);
}
