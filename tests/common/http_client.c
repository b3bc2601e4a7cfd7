/* The tests' HTTP client (tests/common/http_client.h). */
#include "http_client.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <ftw.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

double tr_test_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(path);
}

void tr_test_rmtree(const char *dir)
{
	if (dir && dir[0])
		nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

size_t tr_test_curl_write(char *p, size_t size, size_t n, void *cls)
{
	struct tr_test_buf *b = cls;
	size_t len = size * n;
	/* Doubling: a download of megabytes comes in 16 KiB pieces, and a
	 * realloc for each piece copied the whole body every time (minutes
	 * under ThreadSanitizer, whose realloc always moves). */
	if (b->len + len + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 4096;
		while (cap < b->len + len + 1)
			cap *= 2;
		char *nb = realloc(b->data, cap);
		if (!nb)
			return 0;
		b->data = nb;
		b->cap = cap;
	}
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

/* ---- recording for the OpenAPI response check ----
 *
 * Criterion runs each test in its own process and some tests send
 * requests from many threads, so a file is named by pid and a
 * per-process counter, and written under a temporary name first. */

static json_t *string_or_null(const char *s, size_t len)
{
	json_t *j = s ? json_stringn(s, len) : NULL; /* NULL too when not UTF-8 */
	return j ? j : json_null();
}

static void record_exchange(const struct tr_test_request *rq, const struct tr_test_reply *r)
{
	static atomic_ulong seq;
	const char *dir = getenv("TR_RECORD_DIR");
	if (!dir || !*dir)
		return;
	const char *content_type = "application/json";
	json_t *hdrs = json_array();
	for (size_t i = 0; rq->headers && rq->headers[i]; i++) {
		if (!strncasecmp(rq->headers[i], "Content-Type:", 13)) {
			content_type = rq->headers[i] + 13;
			while (*content_type == ' ')
				content_type++;
			continue;
		}
		json_array_append_new(hdrs, json_string(rq->headers[i]));
	}
	const char *body = rq->body;
	size_t blen = body ? strlen(body) : 0;
	const char *resp_type = r->content_type[0] ? r->content_type : NULL;
	json_t *o = json_pack("{s:s, s:s, s:o, s:o, s:o, s:I, s:i, s:o, s:o, s:o}", "method", rq->method, "path",
			      rq->path, "request_headers", hdrs, "request_content_type",
			      body ? json_string(content_type) : json_null(),
			      /* Big bodies (the 413 case) are left out; their length is kept. */
			      "request_body", blen <= 65536 ? string_or_null(body, blen) : json_null(),
			      "request_body_len", (json_int_t)blen, "status", (int)r->status, "content_type",
			      string_or_null(resp_type, resp_type ? strlen(resp_type) : 0), "headers",
			      string_or_null(r->headers.data ? r->headers.data : "", r->headers.len), "body",
			      /* No body (HEAD, 204) is "", as the validator expects. */
			      string_or_null(r->body.data ? r->body.data : "", r->body.len));
	cr_assert_not_null(o, "cannot build the recording of %s %s", rq->method, rq->path);
	/* A binary body (a download) is recorded as null; its length is kept. */
	json_object_set_new(o, "body_len", json_integer((json_int_t)r->body.len));
	mkdir(dir, 0755); /* EEXIST is fine; a real failure shows at the write */
	char tmp[4200], final[4096];
	unsigned long n = atomic_fetch_add(&seq, 1);
	snprintf(final, sizeof final, "%s/%ld-%06lu.json", dir, (long)getpid(), n);
	snprintf(tmp, sizeof tmp, "%s.tmp", final);
	cr_assert_eq(json_dump_file(o, tmp, JSON_COMPACT), 0, "cannot write %s", tmp);
	cr_assert_eq(rename(tmp, final), 0, "cannot rename %s: %s", tmp, strerror(errno));
	json_decref(o);
}

void tr_test_http(const struct tr_test_request *rq, struct tr_test_reply *r)
{
	struct curl_slist *list = NULL;
	struct upload up = {rq->chunked_size, has_header(rq->headers, "Content-Length:")};
	char url[1024], auth[256];
	CURL *c = curl_easy_init();

	memset(r, 0, sizeof *r);
	cr_assert_not_null(c);
	snprintf(url, sizeof url, "%s%s", rq->base_url, rq->path);
	curl_easy_setopt(c, CURLOPT_URL, url);
	if (rq->path_as_is)
		curl_easy_setopt(c, CURLOPT_PATH_AS_IS, 1L);
	if (rq->ca_file)
		curl_easy_setopt(c, CURLOPT_CAINFO, rq->ca_file);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, rq->recv_fn ? rq->recv_fn : tr_test_curl_write);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, rq->recv_fn ? rq->recv_cls : &r->body);
	curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, tr_test_curl_write);
	curl_easy_setopt(c, CURLOPT_HEADERDATA, &r->headers);
	if (rq->timeout_ms > 0)
		curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, rq->timeout_ms);
	else
		curl_easy_setopt(c, CURLOPT_TIMEOUT, rq->timeout_s > 0 ? rq->timeout_s : 30L);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	/* HEAD must not wait for a body: curl's own HEAD (CURLOPT_NOBODY). */
	if (strcmp(rq->method, "HEAD") == 0)
		curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
	else if (strcmp(rq->method, "GET") != 0 && !(rq->send_fn && strcmp(rq->method, "PUT") == 0))
		curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, rq->method);
	if (rq->send_fn) {
		curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
		curl_easy_setopt(c, CURLOPT_READFUNCTION, rq->send_fn);
		curl_easy_setopt(c, CURLOPT_READDATA, rq->send_cls);
		if (rq->send_size >= 0)
			curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, rq->send_size);
		else
			list = curl_slist_append(list, "Transfer-Encoding: chunked");
	} else if (rq->chunked_size) {
		curl_easy_setopt(c, CURLOPT_POST, 1L);
		curl_easy_setopt(c, CURLOPT_READFUNCTION, on_read);
		curl_easy_setopt(c, CURLOPT_READDATA, &up);
		/* A declared length sends the same spaces slowly instead. */
		if (up.slow)
			curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)rq->chunked_size);
		else
			list = curl_slist_append(list, "Transfer-Encoding: chunked");
	} else if (rq->body) {
		curl_easy_setopt(c, CURLOPT_POSTFIELDS, rq->body);
		curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(rq->body));
	}
	if ((rq->body || rq->chunked_size || rq->send_fn) && !has_header(rq->headers, "Content-Type:"))
		list = curl_slist_append(list, "Content-Type: application/json");
	if (rq->token && !has_header(rq->headers, "Authorization:")) {
		snprintf(auth, sizeof auth, "Authorization: Bearer %s", rq->token);
		list = curl_slist_append(list, auth);
	}
	for (size_t i = 0; rq->headers && rq->headers[i]; i++)
		list = curl_slist_append(list, rq->headers[i]);
	if (rq->no_expect)
		list = curl_slist_append(list, "Expect:");
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, list);
	CURLcode rc = curl_easy_perform(c);
	if (rq->result)
		*rq->result = rc;
	else
		cr_assert_eq(rc, CURLE_OK, "%s %s: %s", rq->method, rq->path, curl_easy_strerror(rc));
	curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
	curl_easy_getinfo(c, CURLINFO_SIZE_UPLOAD_T, &r->uploaded);
	char *ctype = NULL;
	curl_easy_getinfo(c, CURLINFO_CONTENT_TYPE, &ctype);
	if (ctype)
		snprintf(r->content_type, sizeof r->content_type, "%s", ctype);
	curl_slist_free_all(list);
	curl_easy_cleanup(c);
	if (r->body.len)
		r->json = json_loadb(r->body.data, r->body.len, JSON_DECODE_ANY, NULL);
	/* A body that went to a callback is not here to be recorded. */
	if (!rq->no_record && !rq->send_fn && !rq->recv_fn && rc == CURLE_OK)
		record_exchange(rq, r);
}

void tr_test_reply_free(struct tr_test_reply *r)
{
	free(r->body.data);
	free(r->headers.data);
	json_decref(r->json);
	memset(r, 0, sizeof *r);
}

const char *tr_test_header(const struct tr_test_reply *r, const char *name, char *out, size_t len)
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
