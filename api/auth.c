/* Bearer tokens with roles (docs/design.md, API).
 *
 * The accepted tokens live in one table behind a read-write lock, so a
 * configuration reload can swap them while requests are being admitted.
 * A token grants its role and every role below it (admin > write > read);
 * each route names the least role it needs (api/routes.c).  Tokens are
 * compared in constant time and never appear in a reply or a log line:
 * a refusal names the roles, not the token.
 */
#include "api/api_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *const role_names[] = {"none", "read", "write", "admin"};

const char *tr_api_role_name(enum tr_api_role role)
{
	return role >= TR_ROLE_READ && role <= TR_ROLE_ADMIN ? role_names[role] : "none";
}

enum tr_api_role tr_api_role_parse(const char *text, size_t len)
{
	for (int r = TR_ROLE_READ; r <= TR_ROLE_ADMIN; r++)
		if (strlen(role_names[r]) == len && strncmp(role_names[r], text, len) == 0)
			return (enum tr_api_role)r;
	return TR_ROLE_NONE;
}

/* Compares in time that depends only on the presented token's length, so
 * response timing does not reveal how much of a token was right. */
static unsigned token_equal(const char *given, size_t glen, const char *want, size_t wlen)
{
	unsigned char diff = glen != wlen;

	for (size_t i = 0; i < glen; i++)
		diff |= (unsigned char)given[i] ^ (unsigned char)(i < wlen ? want[i] : 0);
	return diff == 0;
}

static void free_entries(struct tr_api_auth_entry *v, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (v[i].token) {
			/* Not left behind in freed memory. */
			explicit_bzero(v[i].token, v[i].len);
			free(v[i].token);
		}
	}
	free(v);
}

static int add_entry(struct tr_api_auth_entry *v, size_t *n, enum tr_api_role role, const char *token, const char *what,
		     size_t index, struct tr_error *err)
{
	if (!token || !token[0]) {
		tr_error_set(err, 0, 0, NULL, "%s %zu is empty", what, index + 1);
		return -EINVAL;
	}
	if (role < TR_ROLE_READ || role > TR_ROLE_ADMIN) {
		tr_error_set(err, 0, 0, NULL, "%s %zu has no valid role", what, index + 1);
		return -EINVAL;
	}
	v[*n].role = role;
	v[*n].len = strlen(token);
	if (!(v[*n].token = strdup(token))) {
		tr_error_set(err, 0, 0, NULL, "out of memory");
		return -ENOMEM;
	}
	(*n)++;
	return 0;
}

int tr_api_auth_build(const char *const *tokens, const struct tr_api_token *role_tokens, size_t n_role,
		      struct tr_api_auth_entry **out, size_t *count, struct tr_error *err)
{
	size_t n_plain = 0, n = 0;
	struct tr_api_auth_entry *v;
	int rc = 0;

	*out = NULL;
	*count = 0;
	while (tokens && tokens[n_plain])
		n_plain++;
	if (tokens && n_plain == 0 && n_role == 0) {
		tr_error_set(err, 0, 0, NULL, "the bearer token list is empty; pass NULL to turn auth off");
		return -EINVAL;
	}
	if (n_plain + n_role == 0)
		return 0;
	v = calloc(n_plain + n_role, sizeof(*v));
	if (!v) {
		tr_error_set(err, 0, 0, NULL, "out of memory");
		return -ENOMEM;
	}
	/* Plain tokens (--token) predate roles and could do everything. */
	for (size_t i = 0; i < n_plain && rc == 0; i++)
		rc = add_entry(v, &n, TR_ROLE_ADMIN, tokens[i], "bearer token", i, err);
	for (size_t i = 0; i < n_role && rc == 0; i++)
		rc = add_entry(v, &n, role_tokens[i].role, role_tokens[i].token, "role token", i, err);
	if (rc < 0) {
		free_entries(v, n);
		return rc;
	}
	*out = v;
	*count = n;
	return 0;
}

void tr_api_auth_free(struct tr_api_auth_entry *v, size_t n)
{
	free_entries(v, n);
}

bool tr_api_auth_enabled(tr_api_t *api)
{
	bool on;

	pthread_rwlock_rdlock(&api->auth_lock);
	on = api->n_auth > 0;
	pthread_rwlock_unlock(&api->auth_lock);
	return on;
}

int tr_api_set_tokens(tr_api_t *api, const char *const *tokens, const struct tr_api_token *role_tokens,
		      size_t n_role_tokens, struct tr_error *err)
{
	struct tr_api_auth_entry *v, *old;
	size_t n, old_n;
	int rc = tr_api_auth_build(tokens, role_tokens, n_role_tokens, &v, &n, err);

	if (rc < 0)
		return rc;
	if (n == 0 && !api->loopback) {
		tr_error_set(err, 0, 0, NULL, "the listener is not on loopback: it cannot run without tokens");
		return -EINVAL;
	}
	pthread_rwlock_wrlock(&api->auth_lock);
	old = api->auth;
	old_n = api->n_auth;
	api->auth = v;
	api->n_auth = n;
	/* Open event streams check their token again (api/events.c). */
	atomic_fetch_add(&api->auth_gen, 1);
	pthread_rwlock_unlock(&api->auth_lock);
	free_entries(old, old_n);
	return 0;
}

/* The role the Authorization header value h grants: TR_ROLE_NONE when it
 * is no bearer token or not one of ours.  Called under auth_lock (read). */
static enum tr_api_role role_of_locked(const tr_api_t *api, const char *h)
{
	enum tr_api_role have = TR_ROLE_NONE;
	size_t len;

	if (!h || strncasecmp(h, "Bearer ", 7) != 0)
		return TR_ROLE_NONE;
	h += 7;
	while (*h == ' ')
		h++;
	len = strlen(h);
	/* No early exit and no branch on a match: every token is compared
	 * and the best role kept. */
	for (size_t i = 0; i < api->n_auth; i++) {
		unsigned mask = 0u - token_equal(h, len, api->auth[i].token, api->auth[i].len);
		unsigned role = (unsigned)api->auth[i].role & mask;

		have = (enum tr_api_role)(role > (unsigned)have ? role : (unsigned)have);
	}
	return have;
}

int tr_api_auth_check(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	tr_api_t *api = rq->api;
	enum tr_api_role need = TR_ROLE_READ, have;
	const char *h;

	/* Unknown paths need a token too (read), so the route list does not
	 * leak to unauthenticated clients. */
	if (rq->route) {
		if (rq->route->flags & TR_ROUTE_PUBLIC)
			return 0;
		/* Checked with or without role tokens: a worker always
		 * reports with its job's token (api/report.c). */
		if (rq->route->flags & TR_ROUTE_JOB_TOKEN)
			return tr_api_report_auth(rq, rp);
		need = tr_api_route_role(rq->route);
	}
	pthread_rwlock_rdlock(&api->auth_lock);
	if (api->n_auth == 0) {
		pthread_rwlock_unlock(&api->auth_lock);
		return 0;
	}
	h = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
	if (!h || strncasecmp(h, "Bearer ", 7) != 0) {
		pthread_rwlock_unlock(&api->auth_lock);
		tr_api_fail(rp, 401, "unauthorized", NULL, "this route needs an Authorization: Bearer token");
		tr_api_reply_header(rp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"trainerd\"");
		return -1;
	}
	have = role_of_locked(api, h);
	pthread_rwlock_unlock(&api->auth_lock);
	if (have == TR_ROLE_NONE) {
		tr_api_fail(rp, 403, "forbidden", NULL, "the bearer token is not valid");
		return -1;
	}
	if (have < need) {
		tr_api_fail(rp, 403, "forbidden", NULL,
			    "%s %s needs a token with the %s role; this token has the %s role", rq->method,
			    rq->route ? rq->route->path : rq->url, tr_api_role_name(need), tr_api_role_name(have));
		return -1;
	}
	return 0;
}

enum tr_api_role tr_api_auth_role(struct tr_api_request *rq, bool *tokens)
{
	tr_api_t *api = rq->api;
	enum tr_api_role have;

	pthread_rwlock_rdlock(&api->auth_lock);
	*tokens = api->n_auth > 0;
	have = api->n_auth == 0 ? TR_ROLE_ADMIN
				: role_of_locked(api, MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND,
										  MHD_HTTP_HEADER_AUTHORIZATION));
	pthread_rwlock_unlock(&api->auth_lock);
	return have;
}

unsigned tr_api_auth_generation(tr_api_t *api)
{
	return atomic_load(&api->auth_gen);
}

bool tr_api_auth_still_allows(tr_api_t *api, const char *authorization, enum tr_api_role need)
{
	pthread_rwlock_rdlock(&api->auth_lock);
	bool ok = api->n_auth == 0 || role_of_locked(api, authorization) >= need;
	pthread_rwlock_unlock(&api->auth_lock);
	return ok;
}
