/* The HTTP client every test that talks to trainerd uses: the unit tests
 * of api/ against an API started in-process (tests/unit/api/fixture.h)
 * and the integration tests against a spawned daemon
 * (tests/integration/harness.h).  One exchange per call over libcurl,
 * loopback only, bounded by a timeout; a failed transfer fails the test.
 * With TR_RECORD_DIR set, each exchange is also written there for the
 * OpenAPI response check (tests/openapi/validate_responses.py).
 */
#ifndef TR_TEST_HTTP_CLIENT_H
#define TR_TEST_HTTP_CLIENT_H

#include <curl/curl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

struct tr_test_buf {
	char *data; /* NUL-terminated, malloc'd; NULL when nothing came */
	size_t len;
	size_t cap; /* bytes allocated at data */
};

struct tr_test_reply {
	long status;
	struct tr_test_buf body, headers; /* headers: the raw header lines */
	json_t *json;                     /* the parsed body, or NULL */
	curl_off_t uploaded;              /* body bytes curl sent */
	char content_type[256];           /* of the response, "" when none */
};

struct tr_test_request {
	const char *base_url; /* http://127.0.0.1:PORT */
	const char *method;   /* GET HEAD POST PUT PATCH DELETE; HEAD reads no body */
	const char *path;
	const char *body; /* NULL: none */
	/* NULL-terminated extra header lines, or NULL.  A body gets
	 * Content-Type: application/json unless one of them sets it. */
	const char *const *headers;
	/* Sent as "Authorization: Bearer" unless headers carry one; NULL: none. */
	const char *token;
	/* > 0: that many bytes (spaces) sent chunked instead of body, or, when
	 * headers carry a Content-Length, slowly (16 KiB a millisecond) with
	 * that declared length. */
	size_t chunked_size;
	bool no_expect;  /* no "Expect: 100-continue" */
	long timeout_s;  /* 0: 30 s */
	long timeout_ms; /* > 0: this instead of timeout_s */
	/* The body from a libcurl read callback (send_fn, called with
	 * send_cls) instead of body: send_size bytes declared, or chunked when
	 * send_size < 0.  Sent as curl sends an upload (PUT unless method says
	 * otherwise, "Expect: 100-continue" unless no_expect). */
	size_t (*send_fn)(char *p, size_t size, size_t n, void *cls);
	void *send_cls;
	curl_off_t send_size;
	/* The response body to a libcurl write callback (recv_fn, called with
	 * recv_cls) instead of r->body: a download kept out of memory, an event
	 * stream read while it arrives.  r->json stays NULL then. */
	size_t (*recv_fn)(char *p, size_t size, size_t n, void *cls);
	void *recv_cls;
	bool path_as_is;     /* the path exactly as written, dot segments too (tests of path escapes) */
	const char *ca_file; /* for an https:// base_url: the CA certificate to trust */
	bool no_record;      /* not written to TR_RECORD_DIR (bodies not worth keeping) */
	/* Where the transfer's result goes when the test allows it to fail (a
	 * stream read until a timeout, a request from a thread of its own,
	 * where an assertion cannot stop the test); NULL: anything but
	 * CURLE_OK fails the test. */
	CURLcode *result;
};

/* Performs the exchange; asserts the transfer itself succeeded (unless
 * rq->result takes its result).  Recorded unless no_record, a callback
 * took a body, or the transfer failed. */
void tr_test_http(const struct tr_test_request *rq, struct tr_test_reply *r);
void tr_test_reply_free(struct tr_test_reply *r);
/* The last value of a response header, copied into out ("" if none). */
const char *tr_test_header(const struct tr_test_reply *r, const char *name, char *out, size_t len);

/* A libcurl write callback appending to the struct tr_test_buf at cls
 * (for clients of their own, e.g. a stream read while it arrives). */
size_t tr_test_curl_write(char *p, size_t size, size_t n, void *cls);

/* CLOCK_MONOTONIC seconds. */
double tr_test_now(void);
/* Removes a directory tree (best effort, for teardowns). */
void tr_test_rmtree(const char *dir);

#endif
