/* Control characters in a request's URL.
 *
 * libmicrohttpd percent-decodes the path and the query in place and hands
 * them on as C strings, so "%00" ended a name early: `PUT
 * /datasets/a/b%00c` wrote `b`, and `/ui/app.js%00` served `app.js`.  Our
 * unescape callback decodes as MHD does but turns a decoded NUL into DEL
 * (0x7f), which is as much a control character and keeps the string
 * whole; admission then refuses any path or query with a control
 * character (400), so no handler sees one. */
#include "api/api_internal.h"

#include <stdio.h>
#include <string.h>

size_t tr_api_unescape(void *cls, struct MHD_Connection *conn, char *s)
{
	(void)cls;
	(void)conn;
	size_t n = MHD_http_unescape(s);

	for (size_t i = 0; i < n; i++)
		if (s[i] == '\0')
			s[i] = 0x7f;
	return n;
}

/* The position (1-based) of the first control character in s, or 0. */
static size_t control_at(const char *s)
{
	for (size_t i = 0; s && s[i]; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c < 0x20 || c == 0x7f)
			return i + 1;
	}
	return 0;
}

struct query_scan {
	const char *key; /* the first key with a control character */
};

static enum MHD_Result scan_query(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
	struct query_scan *q = cls;

	(void)kind;
	if (control_at(key) || control_at(value)) {
		q->key = key;
		return MHD_NO;
	}
	return MHD_YES;
}

int tr_api_url_check(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	size_t at = control_at(rq->url);
	struct query_scan q = {NULL};

	if (at) {
		tr_api_fail(rp, 400, "invalid_request", NULL,
			    "the URL's path has a control character (byte %zu after decoding: %%00-%%1F or %%7F); "
			    "names never hold one",
			    at);
		return -1;
	}
	MHD_get_connection_values(rq->conn, MHD_GET_ARGUMENT_KIND, scan_query, &q);
	if (q.key) {
		tr_api_fail(rp, 400, "invalid_parameter", NULL,
			    "the query parameter '%.40s' has a control character (%%00-%%1F or %%7F)",
			    control_at(q.key) ? "(its name)" : q.key);
		return -1;
	}
	return 0;
}
