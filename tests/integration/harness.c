/* Integration test harness (see harness.h). */
#include "harness.h"

#include <criterion/criterion.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void spawn(struct daemon *d, int cpu_devices, const char *const *extra)
{
	const char *bin = getenv("TR_TRAINERD");
	cr_assert_not_null(bin, "TR_TRAINERD is not set (run through meson test)");
	char addr_file[192];
	snprintf(addr_file, sizeof addr_file, "%s/listen.addr", d->dir);
	unlink(addr_file);
	char devs[16];
	snprintf(devs, sizeof devs, "%d", cpu_devices);
	const char *argv[64] = {bin, "serve", "--listen", "127.0.0.1:0", "--state-dir", d->dir, "--data-root", d->dir,
				"--cpu-devices", devs, "--backend", "cpu", "--log-level", "debug"};
	int argc = 14;
	for (int i = 0; extra && extra[i] && argc < 62; i++)
		argv[argc++] = extra[i];
	argv[argc] = NULL;
	pid_t pid = fork();
	cr_assert_neq(pid, -1);
	if (pid == 0) {
		int fd = open(d->log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		execv(bin, (char *const *)argv);
		_exit(127);
	}
	d->pid = pid;
	double deadline = now_s() + 15;
	while (now_s() < deadline) {
		FILE *f = fopen(addr_file, "r");
		if (f) {
			char line[128] = "";
			if (fgets(line, sizeof line, f)) {
				line[strcspn(line, "\n")] = 0;
				snprintf(d->base_url, sizeof d->base_url, "%s", line);
			}
			fclose(f);
			if (d->base_url[0])
				return;
		}
		int st;
		if (waitpid(pid, &st, WNOHANG) == pid) {
			daemon_dump_log(d);
			cr_assert_fail("trainerd exited during start-up (status %d)", st);
		}
		usleep(20000);
	}
	daemon_dump_log(d);
	cr_assert_fail("trainerd did not write %s within 15 s", addr_file);
}

void daemon_start(struct daemon *d, int cpu_devices, const char *const *extra)
{
	memset(d, 0, sizeof *d);
	snprintf(d->dir, sizeof d->dir, "/tmp/trainerd-it-XXXXXX");
	cr_assert_not_null(mkdtemp(d->dir));
	snprintf(d->log_path, sizeof d->log_path, "%s/daemon.log", d->dir);
	spawn(d, cpu_devices, extra);
}

void daemon_restart(struct daemon *d, int cpu_devices, const char *const *extra)
{
	d->base_url[0] = 0;
	spawn(d, cpu_devices, extra);
}

double daemon_stop(struct daemon *d, int *status)
{
	double t0 = now_s();
	if (d->pid <= 0)
		return 0;
	kill(d->pid, SIGTERM);
	int st = 0;
	/* Bounded: after 20 s the test fails rather than hangs. */
	while (waitpid(d->pid, &st, WNOHANG) == 0) {
		if (now_s() - t0 > 20) {
			kill(d->pid, SIGKILL);
			waitpid(d->pid, &st, 0);
			break;
		}
		usleep(10000);
	}
	d->pid = 0;
	if (status)
		*status = st;
	return now_s() - t0;
}

void daemon_kill(struct daemon *d)
{
	if (d->pid > 0) {
		kill(d->pid, SIGKILL);
		waitpid(d->pid, NULL, 0);
	}
	d->pid = 0;
}

void daemon_cleanup(struct daemon *d)
{
	if (d->pid > 0)
		daemon_stop(d, NULL);
	if (d->dir[0]) {
		char cmd[256];
		snprintf(cmd, sizeof cmd, "rm -rf '%s'", d->dir);
		if (system(cmd) != 0)
			fprintf(stderr, "cannot remove %s\n", d->dir);
	}
}

void daemon_dump_log(const struct daemon *d)
{
	FILE *f = fopen(d->log_path, "r");
	if (!f)
		return;
	char line[1024];
	fprintf(stderr, "---- daemon log (%s) ----\n", d->log_path);
	while (fgets(line, sizeof line, f))
		fputs(line, stderr);
	fclose(f);
}

static size_t on_body(char *p, size_t size, size_t n, void *ud)
{
	struct http_reply *r = ud;
	size_t len = size * n;
	char *nb = realloc(r->body, r->len + len + 1);
	if (!nb)
		return 0;
	r->body = nb;
	memcpy(r->body + r->len, p, len);
	r->len += len;
	r->body[r->len] = 0;
	return len;
}

static size_t on_header(char *p, size_t size, size_t n, void *ud)
{
	struct http_reply *r = ud;
	size_t len = size * n, used = strlen(r->headers);
	if (used + len < sizeof r->headers) {
		memcpy(r->headers + used, p, len);
		r->headers[used + len] = 0;
	}
	return len;
}

/* With TR_RECORD_DIR set, writes each exchange to a JSON file there for
 * tests/openapi/validate_responses.py, which checks every response against
 * openapi/openapi.yaml.  Criterion runs each test in its own process and
 * some tests call http() from many threads, so a file is named by pid and
 * a per-process counter, and written under a temporary name first. */
static json_t *string_or_null(const char *s, size_t len)
{
	json_t *j = s ? json_stringn(s, len) : NULL; /* NULL too when not UTF-8 */
	return j ? j : json_null();
}

static void record_exchange(const char *method, const char *path, const char *body, const char *content_type,
			    const char *extra_header, const char *resp_type, const struct http_reply *r)
{
	static atomic_ulong seq;
	const char *dir = getenv("TR_RECORD_DIR");
	if (!dir || !*dir)
		return;
	size_t blen = body ? strlen(body) : 0;
	json_t *o = json_pack("{s:s, s:s, s:o, s:o, s:o, s:I, s:i, s:o, s:o, s:o}", "method", method, "path", path,
			      "request_headers", extra_header ? json_pack("[s]", extra_header) : json_array(),
			      "request_content_type",
			      body ? json_string(content_type ? content_type : "application/json") : json_null(),
			      /* Big bodies (the 413 case) are left out; their length is kept. */
			      "request_body", blen <= 65536 ? string_or_null(body, blen) : json_null(),
			      "request_body_len", (json_int_t)blen, "status", (int)r->status, "content_type",
			      string_or_null(resp_type, resp_type ? strlen(resp_type) : 0), "headers",
			      string_or_null(r->headers, strlen(r->headers)), "body", string_or_null(r->body, r->len));
	cr_assert_not_null(o, "cannot build the recording of %s %s", method, path);
	/* A binary body (a download) is recorded as null; its length is kept. */
	json_object_set_new(o, "body_len", json_integer((json_int_t)r->len));
	mkdir(dir, 0755); /* EEXIST is fine; a real failure shows at the write */
	char tmp[4200], final[4096];
	unsigned long n = atomic_fetch_add(&seq, 1);
	snprintf(final, sizeof final, "%s/%ld-%06lu.json", dir, (long)getpid(), n);
	snprintf(tmp, sizeof tmp, "%s.tmp", final);
	cr_assert_eq(json_dump_file(o, tmp, JSON_COMPACT), 0, "cannot write %s", tmp);
	cr_assert_eq(rename(tmp, final), 0, "cannot rename %s: %s", tmp, strerror(errno));
	json_decref(o);
}

void http(const struct daemon *d, const char *method, const char *path, const char *body, const char *content_type,
	  const char *extra_header, struct http_reply *r)
{
	memset(r, 0, sizeof *r);
	CURL *c = curl_easy_init();
	cr_assert_not_null(c);
	char url[512];
	snprintf(url, sizeof url, "%s%s", d->base_url, path);
	struct curl_slist *h = NULL;
	char ct[128];
	if (body) {
		snprintf(ct, sizeof ct, "Content-Type: %s", content_type ? content_type : "application/json");
		h = curl_slist_append(h, ct);
	}
	if (extra_header)
		h = curl_slist_append(h, extra_header);
	h = curl_slist_append(h, "Expect:");
	curl_easy_setopt(c, CURLOPT_URL, url);
	/* HEAD must not wait for a body: curl's own HEAD (CURLOPT_NOBODY). */
	if (strcmp(method, "HEAD") == 0)
		curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
	else
		curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
	if (body) {
		curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
		curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
	}
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
	curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(c, CURLOPT_HEADERDATA, r);
	curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	CURLcode rc = curl_easy_perform(c);
	cr_assert_eq(rc, CURLE_OK, "%s %s: %s", method, path, curl_easy_strerror(rc));
	curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
	char *ctype = NULL, resp_type[256] = "";
	curl_easy_getinfo(c, CURLINFO_CONTENT_TYPE, &ctype);
	if (ctype)
		snprintf(resp_type, sizeof resp_type, "%s", ctype);
	curl_slist_free_all(h);
	curl_easy_cleanup(c);
	if (!r->body)
		r->body = calloc(1, 1);
	r->json = json_loads(r->body, JSON_DECODE_ANY, NULL);
	record_exchange(method, path, body, content_type, extra_header, resp_type[0] ? resp_type : NULL, r);
}

void http_free(struct http_reply *r)
{
	free(r->body);
	json_decref(r->json);
	memset(r, 0, sizeof *r);
}

long http_download(const struct daemon *d, const char *path, const char *file, size_t *len)
{
	struct http_reply r;
	http(d, "GET", path, NULL, NULL, NULL, &r);
	long status = r.status;
	if (len)
		*len = r.len;
	if (status == 200) {
		FILE *f = fopen(file, "wb");
		cr_assert_not_null(f, "cannot create %s: %s", file, strerror(errno));
		cr_assert_eq(fwrite(r.body, 1, r.len, f), r.len, "cannot write %s", file);
		cr_assert_eq(fclose(f), 0, "cannot write %s", file);
	}
	http_free(&r);
	return status;
}

long long submit_job(const struct daemon *d, const char *spec_json)
{
	struct http_reply r;
	http(d, "POST", "/jobs", spec_json, NULL, NULL, &r);
	cr_assert_eq(r.status, 201, "POST /jobs: %ld %s", r.status, r.body);
	long long id = json_integer_value(json_object_get(r.json, "id"));
	cr_assert_gt(id, 0);
	http_free(&r);
	return id;
}

const char *wait_state(const struct daemon *d, long long id, const char *states, double timeout_s)
{
	static char state[32];
	char path[64];
	snprintf(path, sizeof path, "/jobs/%lld", id);
	double deadline = now_s() + timeout_s;
	for (;;) {
		struct http_reply r;
		http(d, "GET", path, NULL, NULL, NULL, &r);
		const char *s = json_string_value(json_object_get(r.json, "state"));
		snprintf(state, sizeof state, "%s", s ? s : "?");
		http_free(&r);
		char want[256];
		snprintf(want, sizeof want, "|%s|", states);
		char probe[40];
		snprintf(probe, sizeof probe, "|%s|", state);
		if (strstr(want, probe) || now_s() > deadline)
			return state;
		usleep(20000);
	}
}
