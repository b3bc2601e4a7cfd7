/* GET / and GET /ui/{asset}: the dashboard (docs/design.md §10).  Its
 * files are compiled in (api/ui_assets.h), so serving one is a lookup.
 * Both routes are open without a token: the files hold no data, and the
 * page has to load before it can ask the user for the token that its API
 * calls then carry.  Every answer has a strong ETag (a conditional request
 * is answered 304), Cache-Control: no-cache, so a browser revalidates and
 * a new build is seen at once, and a Content-Security-Policy that lets the
 * page talk to this daemon only.
 */
#include "api/api_internal.h"
#include "api/ui_assets.h"

#include <stdlib.h>
#include <string.h>

#define CSP                                                                                                      \
	"default-src 'self'; connect-src 'self'; img-src 'self' data: blob:; style-src 'self' 'unsafe-inline'; " \
	"object-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"

static const struct tr_ui_asset *find_asset(const char *name)
{
	for (size_t i = 0; i < tr_ui_asset_count; i++)
		if (strcmp(tr_ui_assets[i].name, name) == 0)
			return &tr_ui_assets[i];
	return NULL;
}

/* True when the If-None-Match header lists etag (or is "*"). */
static bool etag_matches(const struct tr_api_request *rq, const char *etag)
{
	const char *h = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_IF_NONE_MATCH);
	size_t n = strlen(etag);

	if (!h)
		return false;
	if (strcmp(h, "*") == 0)
		return true;
	for (const char *p = strstr(h, etag); p; p = strstr(p + 1, etag)) {
		char after = p[n];

		if (after == '\0' || after == ',' || after == ' ')
			return true;
	}
	return false;
}

static void serve(struct tr_api_request *rq, struct tr_api_reply *rp, const char *name)
{
	const struct tr_ui_asset *a = find_asset(name);

	if (!a) {
		tr_api_fail(rp, 404, "not_found", NULL, "the dashboard has no file %s", name);
		return;
	}
	tr_api_reply_header(rp, MHD_HTTP_HEADER_ETAG, a->etag);
	tr_api_reply_header(rp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
	tr_api_reply_header(rp, "X-Content-Type-Options", "nosniff");
	tr_api_reply_header(rp, MHD_HTTP_HEADER_CONTENT_SECURITY_POLICY, CSP);
	if (etag_matches(rq, a->etag)) {
		rp->status = 304;
		return;
	}
	/* The reply owns its text; a copy of a few hundred kilobytes costs
	 * far less than the request around it. */
	rp->text = malloc(a->len);
	if (!rp->text) {
		tr_api_reply_finish(rp);
		tr_api_fail(rp, 500, "internal", NULL, "out of memory");
		return;
	}
	memcpy(rp->text, a->data, a->len);
	rp->text_len = a->len;
	rp->content_type = a->content_type;
	rp->status = 200;
}

void tr_api_ui_index(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	serve(rq, rp, "index.html");
}

void tr_api_ui_asset(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	/* index.html is the page at "/", not a second address for it. */
	if (rq->nparams < 1 || strcmp(rq->params[0], "index.html") == 0) {
		tr_api_fail(rp, 404, "not_found", NULL, "the dashboard has no such file");
		return;
	}
	serve(rq, rp, rq->params[0]);
}
