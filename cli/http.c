/* trainctl's HTTP client (libcurl): one request at a time, the bearer
 * token on every request, and the mapping from what went wrong to an exit
 * code and one line on stderr.  A daemon that cannot be reached is exit 3
 * with the URL and the cause; an HTTP error is exit 4 with the daemon's
 * own message (the API's {"error": {"code", "message", "pointer"}}).
 * Streams (events, downloads) hand the body to a callback as it arrives.
 */
#include "cli/trainctl.h"

#include <curl/curl.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct xfer {
	CURL *curl;
	struct tr_ctl_reply *r;
	tr_ctl_sink_fn sink; /* NULL: buffer the body */
	void *ud;
	bool stopped; /* the sink asked to stop */
};

void tr_ctl_reply_finish(struct tr_ctl_reply *r)
{
	free(r->body);
	json_decref(r->json);
	memset(r, 0, sizeof(*r));
}

static bool buffer(struct tr_ctl_reply *r, const char *p, size_t n)
{
	char *nb = realloc(r->body, r->len + n + 1);

	if (!nb)
		return false;
	r->body = nb;
	memcpy(r->body + r->len, p, n);
	r->len += n;
	r->body[r->len] = '\0';
	return true;
}

static size_t on_body(char *p, size_t size, size_t n, void *ud)
{
	struct xfer *x = ud;
	size_t len = size * n;
	long code = 0;

	curl_easy_getinfo(x->curl, CURLINFO_RESPONSE_CODE, &code);
	/* An error's body is the daemon's message, never the stream. */
	if (!x->sink || code < 200 || code >= 300)
		return buffer(x->r, p, len) ? len : 0;
	if (!x->sink(p, len, x->ud)) {
		x->stopped = true;
		return 0;
	}
	return len;
}

/* Keeps the headers the commands look at. */
static size_t on_header(char *p, size_t size, size_t n, void *ud)
{
	struct xfer *x = ud;
	size_t len = size * n;
	char *dst = NULL;
	size_t cap = 0, skip = 0;

	if (len > 5 && strncmp(p, "HTTP/", 5) == 0) { /* a new response (after 100 Continue, a redirect) */
		x->r->etag[0] = x->r->content_range[0] = '\0';
	} else if (len > 5 && strncasecmp(p, "ETag:", 5) == 0) {
		dst = x->r->etag, cap = sizeof(x->r->etag), skip = 5;
	} else if (len > 14 && strncasecmp(p, "Content-Range:", 14) == 0) {
		dst = x->r->content_range, cap = sizeof(x->r->content_range), skip = 14;
	}
	if (dst) {
		size_t i = skip, j = 0;

		while (i < len && p[i] == ' ')
			i++;
		while (i < len && p[i] != '\r' && p[i] != '\n' && j + 1 < cap)
			dst[j++] = p[i++];
		dst[j] = '\0';
	}
	return len;
}

static CURL *setup(const struct tr_ctl *c, const char *method, const char *path, const char *const *headers,
		   struct curl_slist **hl, struct xfer *x)
{
	CURL *curl = curl_easy_init();
	char url[1024], auth[1100];

	if (!curl)
		return NULL;
	snprintf(url, sizeof url, "%s%s", c->url, path);
	curl_easy_setopt(curl, CURLOPT_URL, url);
	curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method);
	if (strcmp(method, "HEAD") == 0)
		curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
	curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, 5L);
	curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(curl, CURLOPT_USERAGENT, "trainctl/" TR_VERSION);
	curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(curl, CURLOPT_WRITEDATA, x);
	curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(curl, CURLOPT_HEADERDATA, x);
	/* The event stream sends a comment every 15 s; a minute without a
	 * byte means the connection is dead even if no RST came. */
	curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
	curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, 60L);
	if (c->token) {
		snprintf(auth, sizeof auth, "Authorization: Bearer %s", c->token);
		*hl = curl_slist_append(*hl, auth);
	}
	for (int i = 0; headers && headers[i]; i++)
		*hl = curl_slist_append(*hl, headers[i]);
	if (c->verbose)
		fprintf(stderr, "> %s %s\n", method, url);
	x->curl = curl;
	return curl;
}

static int perform(const struct tr_ctl *c, CURL *curl, struct curl_slist *hl, struct xfer *x, char *err, size_t errlen)
{
	char ebuf[CURL_ERROR_SIZE] = "";
	CURLcode rc;
	char *url = NULL;

	curl_easy_setopt(curl, CURLOPT_HTTPHEADER, hl);
	curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, ebuf);
	rc = curl_easy_perform(curl);
	curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &x->r->status);
	curl_easy_getinfo(curl, CURLINFO_EFFECTIVE_URL, &url);
	if (c->verbose)
		fprintf(stderr, "< %ld (%s)\n", x->r->status, rc == CURLE_OK ? "ok" : curl_easy_strerror(rc));
	if (rc == CURLE_OK || (rc == CURLE_WRITE_ERROR && x->stopped)) {
		if (x->r->body && x->r->len)
			x->r->json = json_loadb(x->r->body, x->r->len, 0, NULL);
		return 0;
	}
	snprintf(err, errlen, "%s", ebuf[0] ? ebuf : curl_easy_strerror(rc));
	return TR_CTL_UNREACHABLE;
}

int tr_ctl_request(const struct tr_ctl *c, const char *method, const char *path, const char *body,
		   const char *const *headers, struct tr_ctl_reply *r)
{
	struct curl_slist *hl = NULL;
	struct xfer x = {.r = r};
	char err[CURL_ERROR_SIZE + 64];
	CURL *curl;
	int rc;

	memset(r, 0, sizeof(*r));
	curl = setup(c, method, path, headers, &hl, &x);
	if (!curl) {
		fprintf(stderr, "trainctl: cannot start libcurl\n");
		return TR_CTL_UNREACHABLE;
	}
	if (body) {
		hl = curl_slist_append(hl, "Content-Type: application/json");
		curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body);
		curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
	}
	curl_easy_setopt(curl, CURLOPT_TIMEOUT, 120L);
	rc = perform(c, curl, hl, &x, err, sizeof err);
	if (rc)
		fprintf(stderr,
			"trainctl: cannot reach the daemon at %s: %s (is trainerd running? set --url or TRAINERD_URL)\n",
			c->url, err);
	curl_slist_free_all(hl);
	curl_easy_cleanup(curl);
	return rc;
}

int tr_ctl_http_error(const struct tr_ctl *c, const struct tr_ctl_reply *r)
{
	const json_t *e = json_object_get(r->json, "error");
	const char *msg = json_string_value(json_object_get(e, "message"));
	const char *code = json_string_value(json_object_get(e, "code"));
	const char *ptr = json_string_value(json_object_get(e, "pointer"));

	if (!msg) {
		/* Not the API's error shape (a proxy in between?): its first line. */
		msg = r->body && r->len ? r->body : "no message";
	}
	fprintf(stderr, "trainctl: HTTP %ld: %.*s", r->status, (int)strcspn(msg, "\n"), msg);
	if (ptr && *ptr)
		fprintf(stderr, " (at %s)", ptr);
	if (code)
		fprintf(stderr, " [%s]", code);
	/* One line, with what to do about a token problem. */
	if (r->status == 401)
		fprintf(stderr, "; the daemon at %s needs a token: set TRAINERD_TOKEN or --token-file", c->url);
	else if (r->status == 403 && code && strcmp(code, "forbidden") == 0)
		fprintf(stderr, "; check TRAINERD_TOKEN or --token-file");
	fputc('\n', stderr);
	/* A refused spec lists every problem found: fixing them one
	 * submission at a time is what users complained of. */
	const json_t *all = json_object_get(r->json, "errors"), *p;
	size_t i;
	if (json_array_size(all) > 1) {
		fprintf(stderr, "trainctl: all %zu problems:\n", json_array_size(all));
		json_array_foreach(all, i, p) {
			const char *m = json_string_value(json_object_get(p, "message"));
			const char *at = json_string_value(json_object_get(p, "pointer"));
			if (!m)
				continue;
			fprintf(stderr, "  %.*s", (int)strcspn(m, "\n"), m);
			if (at && *at && strncmp(m, at, strlen(at)) != 0)
				fprintf(stderr, " (at %s)", at);
			fputc('\n', stderr);
		}
	}
	return TR_CTL_HTTP;
}

int tr_ctl_call(const struct tr_ctl *c, const char *method, const char *path, const char *body, struct tr_ctl_reply *r)
{
	int rc = tr_ctl_request(c, method, path, body, NULL, r);

	if (rc)
		return rc;
	if (r->status < 200 || r->status >= 300) {
		rc = tr_ctl_http_error(c, r);
		tr_ctl_reply_finish(r);
	}
	return rc;
}

int tr_ctl_upload(const struct tr_ctl *c, const char *path, tr_ctl_source_fn source, void *ud, int64_t size,
		  struct tr_ctl_reply *r, char *err, size_t errlen)
{
	struct curl_slist *hl = NULL;
	struct xfer x = {.r = r};
	CURL *curl;
	int rc;

	memset(r, 0, sizeof(*r));
	curl = setup(c, "PUT", path, NULL, &hl, &x);
	if (!curl) {
		snprintf(err, errlen, "cannot start libcurl");
		return TR_CTL_UNREACHABLE;
	}
	hl = curl_slist_append(hl, "Content-Type: application/octet-stream");
	curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
	curl_easy_setopt(curl, CURLOPT_READFUNCTION, (curl_read_callback)source);
	curl_easy_setopt(curl, CURLOPT_READDATA, ud);
	/* With the size declared, curl sends "Expect: 100-continue" for a
	 * large file, so a refusal (quota, a file in use) comes before the
	 * bytes. */
	curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, (curl_off_t)size);
	rc = perform(c, curl, hl, &x, err, errlen);
	curl_slist_free_all(hl);
	curl_easy_cleanup(curl);
	return rc;
}

int tr_ctl_stream(const struct tr_ctl *c, const char *path, const char *const *headers, tr_ctl_sink_fn sink, void *ud,
		  struct tr_ctl_reply *r, char *err, size_t errlen)
{
	struct curl_slist *hl = NULL;
	struct xfer x = {.r = r, .sink = sink, .ud = ud};
	CURL *curl;
	int rc;

	memset(r, 0, sizeof(*r));
	curl = setup(c, "GET", path, headers, &hl, &x);
	if (!curl) {
		snprintf(err, errlen, "cannot start libcurl");
		return TR_CTL_UNREACHABLE;
	}
	rc = perform(c, curl, hl, &x, err, errlen);
	curl_slist_free_all(hl);
	curl_easy_cleanup(curl);
	return rc;
}
