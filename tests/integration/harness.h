/* Integration test harness: starts a real `trainerd serve` on an ephemeral
 * loopback port with a temporary state directory and talks HTTP to it
 * through the tests' shared client (tests/common/http_client.h, which the
 * API's unit tests use too: tr_test_http with d->base_url reaches every
 * option, e.g. chunked bodies).  The binary comes from $TR_TRAINERD.
 * A daemon started here never outlives its test process: one a failed
 * assertion left running is ended (by pid) when the process exits, its
 * state dir removed, and one whose test process was killed (a timeout)
 * gets SIGKILL from the kernel (PR_SET_PDEATHSIG). */
#ifndef TR_TEST_HARNESS_H
#define TR_TEST_HARNESS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "tests/common/http_client.h"

/* How many times longer the daemon may take under ThreadSanitizer, which
 * checks every memory access of instrumented code (5-15 times slower):
 * the tests' bounds on how long a job or a flush takes are multiplied by
 * it there and stay as they are in every other build. */
#ifdef __SANITIZE_THREAD__
#define TR_TEST_SLOW 5
#else
#define TR_TEST_SLOW 1
#endif

struct daemon {
	pid_t pid;
	char dir[128];      /* state dir, also the data root */
	char base_url[128]; /* http://127.0.0.1:PORT */
	char log_path[192];
};

struct http_reply {
	long status;
	char *body; /* NUL-terminated, malloc'd */
	size_t len;
	char headers[4096];
	json_t *json; /* parsed body or NULL */
};

/* Starts the daemon with extra flags (NULL-terminated, may be NULL). */
void daemon_start(struct daemon *d, int cpu_devices, const char *const *extra);
/* Restarts on the same state dir (after daemon_stop/daemon_kill). */
void daemon_restart(struct daemon *d, int cpu_devices, const char *const *extra);
/* SIGTERM and wait; returns seconds taken and the exit status. */
double daemon_stop(struct daemon *d, int *status);
void daemon_kill(struct daemon *d);    /* SIGKILL */
void daemon_cleanup(struct daemon *d); /* removes the state dir */
void daemon_dump_log(const struct daemon *d);

/* method: GET HEAD POST PATCH DELETE (HEAD reads no body); body may be NULL; content_type NULL =
 * application/json when there is a body.  extra_header may be NULL. */
void http(const struct daemon *d, const char *method, const char *path, const char *body, const char *content_type,
	  const char *extra_header, struct http_reply *r);
/* Moves the shared client's reply into r (for tests that build their own
 * tr_test_request: an upload from a callback, say). */
void http_reply_take(struct http_reply *r, struct tr_test_reply *tr);
void http_free(struct http_reply *r);
/* GET path and, when the answer is 200, write its body (binary-safe) to
 * file.  Returns the status; *len (may be NULL) gets the body's length. */
long http_download(const struct daemon *d, const char *path, const char *file, size_t *len);
/* Convenience: returns a job id from POST /jobs (asserts 201). */
long long submit_job(const struct daemon *d, const char *spec_json);
/* GET /jobs/{id} as JSON (asserts 200; the caller decrefs). */
json_t *get_job_json(const struct daemon *d, long long id);
/* Waits (120 s) for the job to complete (asserts "completed"), then gives
 * its info field `key` (asserted present) in out (n bytes) and its final
 * loss, bit for bit (summary.loss, asserted a number). */
void job_info_and_loss(const struct daemon *d, long long id, const char *key, char *out, size_t n, double *loss);
/* trainctl's output (stdout and stderr) for args against daemon d
 * (malloc'd; asserts that it exits 0). */
char *trainctl_output(const struct daemon *d, const char *args);
/* Polls GET /jobs/{id} until the state is one of `states` ('|'-separated)
 * or timeout_s passes; returns the final state (static buffer). */
const char *wait_state(const struct daemon *d, long long id, const char *states, double timeout_s);
double now_s(void);

#endif
