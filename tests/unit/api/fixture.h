/* The fixture of the API's unit tests (tests/unit/api/test_*.c, one file
 * per file of api/): a real store in a temporary directory and the API
 * started in-process on a loopback port with fake daemon ops, reached over
 * real HTTP through the tests' shared client (tests/common/http_client.h,
 * which the integration harness uses too).  Each test file declares
 *
 *   TestSuite(api, .init = api_fixture_setup, .fini = api_fixture_teardown, .timeout = 60);
 *
 * so every test starts on an empty store and a fresh API.
 */
#ifndef TR_TEST_API_FIXTURE_H
#define TR_TEST_API_FIXTURE_H

#include <limits.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/api.h"
#include "storage/store.h"
#include "tests/common/http_client.h"

extern char dir[PATH_MAX]; /* the temporary directory (state.db in it) */
extern tr_store_t *store;
extern tr_api_t *api;
extern int port;
extern const char *token; /* sent as Bearer when set */
/* What the fake ready op answers. */
extern atomic_bool daemon_ready;
/* Requests the fake checkpoint_now op accepted. */
extern atomic_int checkpoint_requests;

void api_fixture_setup(void);
void api_fixture_teardown(void);

/* How restart and start_with start the API (zero: the defaults). */
struct start_opts {
	const char *const *tokens;
	const struct tr_api_token *role_tokens;
	size_t n_role_tokens;
	int heartbeat_s;
	const char *openapi;
	const char *host;
	int port;
	const char *version;     /* NULL: "1.2.3-test" */
	tr_datasets_t *datasets; /* NULL: no /datasets */
	/* The evaluate op (NULL: the daemon offers none). */
	int (*evaluate)(void *ctx, int64_t job_id, const json_t *body, int64_t *eval_id, struct tr_error *err);
	/* Called on the config last, for what the fields above do not set
	 * (limits, caps). */
	void (*tweak)(struct tr_api_config *cfg);
};
/* tr_api_start with the fake ops; NULL and e filled on failure. */
tr_api_t *start_with(const struct start_opts *o, struct tr_error *e);
/* Stops the API and starts it again with o (asserts it started). */
void restart(const struct start_opts *o);

/* Wall-clock seconds (CLOCK_REALTIME), as the store's times are. */
double now_s(void);

/* method, path, body (NULL for none), NULL-terminated extra headers.  A
 * body gets Content-Type: application/json unless hdrs set one.
 * chunked_size > 0 sends that many bytes chunked instead of body, or,
 * when hdrs has a Content-Length (curl then sends its own, of that size),
 * slowly with that length.  The token, when set, goes as Bearer. */
struct tr_test_reply http_full(const char *method, const char *path, const char *body, const char *const *hdrs,
			       size_t chunked_size);
struct tr_test_reply http(const char *method, const char *path, const char *body);
void resp_free(struct tr_test_reply *r);
/* The last value of a response header, copied into out ("" if none). */
const char *header(const struct tr_test_reply *r, const char *name, char *out, size_t len);
/* "a.b.c" into nested objects: the string there, or NULL. */
const char *jstr(const json_t *j, const char *path);
json_int_t jint(const json_t *j, const char *key);
/* Submits a job and returns its id. */
int64_t submit(const char *name);
/* Asserts the status, and that a body is JSON ending with a newline. */
void expect_status(struct tr_test_reply *r, long status, const char *what);

#endif
