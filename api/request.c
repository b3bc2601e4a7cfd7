/* Reading requests and building replies: query and path parameters with
 * range checks whose messages name the parameter, the JSON body with the
 * parser's line and column, and the small reply helpers handlers share.
 * Parsing is strict (no spaces, no "+", no trailing junk) because a
 * silently misread limit or step range is worse than a 400.
 */
#include "api/api_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

void tr_api_reply_header(struct tr_api_reply *rp, const char *name, const char *value)
{
	if (rp->nheaders >= TR_API_MAX_HEADERS)
		return;
	rp->headers[rp->nheaders].name = name;
	rp->headers[rp->nheaders].value = strdup(value);
	if (rp->headers[rp->nheaders].value)
		rp->nheaders++;
}

void tr_api_reply_json(struct tr_api_reply *rp, int status, json_t *body)
{
	json_decref(rp->json);
	rp->json = body;
	rp->status = status;
}

int tr_api_render_json(const json_t *body, char **out, size_t *len)
{
	size_t n = json_dumpb(body, NULL, 0, JSON_COMPACT | JSON_REAL_PRECISION(15));
	char *buf = n ? malloc(n + 1) : NULL;

	if (!buf || json_dumpb(body, buf, n, JSON_COMPACT | JSON_REAL_PRECISION(15)) != n) {
		free(buf);
		return -1;
	}
	/* Every JSON body ends with a newline so `curl` output and
	 * line-oriented tools behave. */
	buf[n] = '\n';
	*out = buf;
	*len = n + 1;
	return 0;
}

void tr_api_reply_finish(struct tr_api_reply *rp)
{
	json_decref(rp->json);
	free(rp->text);
	if (rp->stream)
		MHD_destroy_response(rp->stream);
	for (int i = 0; i < rp->nheaders; i++)
		free(rp->headers[i].value);
	memset(rp, 0, sizeof(*rp));
}

const char *tr_api_query(const struct tr_api_request *rq, const char *name)
{
	return MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, name);
}

int tr_api_parse_int(const char *text, int64_t min, int64_t max, int64_t *out)
{
	const char *p = text;
	char *end;
	long long v;

	if (!text)
		return -1;
	if (*p == '-')
		p++;
	if (*p < '0' || *p > '9')
		return -1;
	errno = 0;
	v = strtoll(text, &end, 10);
	if (errno || *end || v < min || v > max)
		return -1;
	*out = (int64_t)v;
	return 0;
}

int tr_api_query_int(const struct tr_api_request *rq, struct tr_api_reply *rp, const char *name, int64_t min,
		     int64_t max, int64_t def, int64_t *out)
{
	const char *v = tr_api_query(rq, name);

	if (!v) {
		*out = def;
		return 0;
	}
	if (tr_api_parse_int(v, min, max, out) == 0)
		return 0;
	if (max == INT64_MAX)
		tr_api_fail(rp, 400, "invalid_parameter", NULL, "%s: must be an integer >= %" PRId64, name, min);
	else
		tr_api_fail(rp, 400, "invalid_parameter", NULL, "%s: must be an integer in [%" PRId64 ", %" PRId64 "]",
			    name, min, max);
	return -1;
}

int tr_api_query_bool(const struct tr_api_request *rq, struct tr_api_reply *rp, const char *name, bool def, bool *out)
{
	const char *v = tr_api_query(rq, name);

	if (!v) {
		*out = def;
		return 0;
	}
	if (strcmp(v, "true") == 0 || strcmp(v, "false") == 0) {
		*out = v[0] == 't';
		return 0;
	}
	tr_api_fail(rp, 400, "invalid_parameter", NULL, "%s: must be true or false", name);
	return -1;
}

int tr_api_path_id(const struct tr_api_request *rq, struct tr_api_reply *rp, int64_t *id)
{
	const char *text = rq->nparams > 0 ? rq->params[0] : "";

	/* A leading '-' or '0' would make several spellings name one job. */
	if (text[0] != '-' && text[0] != '0' && tr_api_parse_int(text, 1, INT64_MAX, id) == 0)
		return 0;
	tr_api_fail(rp, 400, "invalid_parameter", NULL, "id: must be a positive integer");
	return -1;
}

int tr_api_body_object(const struct tr_api_request *rq, struct tr_api_reply *rp, json_t **out)
{
	json_error_t je;
	json_t *j;

	*out = NULL;
	/* Duplicate keys are refused: which one wins is a guess. */
	j = json_loadb(rq->body ? rq->body : "", rq->body_len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
	if (!j) {
		tr_api_fail(rp, 400, "invalid_json", NULL, "line %d, column %d: %s", je.line, je.column, je.text);
		return -1;
	}
	if (!json_is_object(j)) {
		json_decref(j);
		tr_api_fail(rp, 400, "invalid_request", NULL, "the request body must be a JSON object");
		return -1;
	}
	*out = j;
	return 0;
}

void tr_api_pointer(char *buf, size_t len, const char *prefix, const char *key)
{
	size_t n = 0;

	if (len == 0)
		return;
	for (const char *p = prefix; *p && n + 1 < len; p++)
		buf[n++] = *p;
	if (n + 1 < len)
		buf[n++] = '/';
	for (const char *k = key; *k && n + 3 < len; k++) {
		if (*k == '~' || *k == '/') {
			buf[n++] = '~';
			buf[n++] = *k == '~' ? '0' : '1';
		} else {
			buf[n++] = *k;
		}
	}
	buf[n] = '\0';
}
