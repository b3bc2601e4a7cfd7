/* trainerd as a systemd service, without systemd: the test plays the
 * service manager.  It owns the notify socket (NOTIFY_SOCKET) and reads
 * what the daemon says there, passes a listening socket the way socket
 * activation does (LISTEN_FDS, LISTEN_PID), makes stderr look like the
 * journal (JOURNAL_STREAM), and sends SIGHUP as `systemctl reload` does.
 * Also: the token file and HTTPS with a certificate made here.
 */
#include <criterion/criterion.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define JOB(load_us) JOB_ON(load_us, "1")
#define JOB_ON(load_us, devices)                                                                               \
	"{\"name\": \"svc\", \"seed\": 3, \"devices\": " devices                                               \
	", \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 16},"                                     \
	" {\"type\": \"relu\"}, {\"type\": \"dense\", \"units\": 3}]}, \"data\": {\"train\": {\"format\":"     \
	" \"synthetic\", \"samples\": 640, \"features\": 6, \"classes\": 3, \"load_cost_us\": " #load_us "}}," \
	" \"batch_size\": 32, \"epochs\": 20, \"optimizer\": {\"type\": \"adam\", \"lr\": 0.01}}"

static bool have_systemd(void)
{
	const char *v = getenv("TR_HAVE_SYSTEMD");
	return v && strcmp(v, "1") == 0;
}

/* ---- a daemon started the way systemd would ---- */

struct svc {
	struct daemon d;
	int notify_fd; /* our end of NOTIFY_SOCKET, or -1 */
	char notify_path[100];
	char msgs[64][512]; /* every datagram, in order */
	int nmsgs;
};

/* Starts trainerd serve with env (NAME=VALUE, NULL-terminated) added,
 * args after "serve", and listen_fd (>= 0) passed as descriptor 3 with
 * LISTEN_FDS/LISTEN_PID.  When wait_addr, waits for listen.addr. */
static pid_t spawn_env(struct svc *s, const char *const *env, const char *const *args, int listen_fd, bool wait_addr)
{
	const char *bin = getenv("TR_TRAINERD");
	cr_assert_not_null(bin);
	char addr_file[192];
	snprintf(addr_file, sizeof addr_file, "%s/listen.addr", s->d.dir);
	unlink(addr_file);
	const char *argv[48] = {bin,      "serve",     "--state-dir", s->d.dir,        "--data-root",
				s->d.dir, "--backend", "cpu",         "--cpu-devices", "2"};
	int argc = 10;
	for (int i = 0; args && args[i] && argc < 46; i++)
		argv[argc++] = args[i];
	argv[argc] = NULL;
	pid_t pid = fork();
	cr_assert_neq(pid, -1);
	if (pid == 0) {
		int fd = open(s->d.log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		for (int i = 0; env && env[i]; i++)
			putenv((char *)env[i]);
		if (s->notify_fd >= 0)
			setenv("NOTIFY_SOCKET", s->notify_path, 1);
		if (listen_fd >= 0) {
			char pidtext[32];
			if (listen_fd != 3) {
				dup2(listen_fd, 3);
				close(listen_fd);
			}
			fcntl(3, F_SETFD, 0);
			snprintf(pidtext, sizeof pidtext, "%d", (int)getpid());
			setenv("LISTEN_PID", pidtext, 1);
			setenv("LISTEN_FDS", "1", 1);
		}
		execv(bin, (char *const *)argv);
		_exit(127);
	}
	s->d.pid = pid;
	if (!wait_addr)
		return pid;
	double deadline = now_s() + 30;
	while (now_s() < deadline) {
		FILE *f = fopen(addr_file, "r");
		if (f) {
			char line[128] = "";
			if (fgets(line, sizeof line, f))
				line[strcspn(line, "\n")] = 0;
			fclose(f);
			if (line[0]) {
				snprintf(s->d.base_url, sizeof s->d.base_url, "%s", line);
				return pid;
			}
		}
		int st;
		if (waitpid(pid, &st, WNOHANG) == pid) {
			s->d.pid = 0;
			daemon_dump_log(&s->d);
			cr_assert_fail("trainerd exited during start-up (status %d)", st);
		}
		usleep(20000);
	}
	daemon_dump_log(&s->d);
	cr_assert_fail("no listen.addr within 30 s");
	return pid;
}

static void svc_init(struct svc *s, bool notify)
{
	memset(s, 0, sizeof *s);
	s->notify_fd = -1;
	snprintf(s->d.dir, sizeof s->d.dir, "/tmp/trainerd-svc-XXXXXX");
	cr_assert_not_null(mkdtemp(s->d.dir));
	snprintf(s->d.log_path, sizeof s->d.log_path, "%s/daemon.log", s->d.dir);
	if (!notify)
		return;
	struct sockaddr_un un = {.sun_family = AF_UNIX};
	snprintf(s->notify_path, sizeof s->notify_path, "%.90s/notify", s->d.dir);
	memcpy(un.sun_path, s->notify_path, sizeof s->notify_path);
	s->notify_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	cr_assert_geq(s->notify_fd, 0);
	cr_assert_eq(bind(s->notify_fd, (struct sockaddr *)&un, sizeof un), 0, "%s", strerror(errno));
}

static void svc_cleanup(struct svc *s)
{
	daemon_cleanup(&s->d);
	if (s->notify_fd >= 0)
		close(s->notify_fd);
}

/* Reads datagrams for up to timeout_s, until one holds `until` (a line
 * prefix; NULL = read for the whole time).  Returns whether it came. */
static bool read_notify(struct svc *s, const char *until, double timeout_s)
{
	double deadline = now_s() + timeout_s;
	while (now_s() < deadline) {
		struct timeval tv = {.tv_usec = 100000};
		setsockopt(s->notify_fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
		char buf[4096];
		ssize_t n = recv(s->notify_fd, buf, sizeof buf - 1, 0);
		if (n <= 0)
			continue;
		buf[n] = 0;
		bool hit = false;
		/* One entry per line, so READY=1\nSTATUS=... counts as both, in
		 * that order. */
		for (char *save = NULL, *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
			if (s->nmsgs < 64)
				snprintf(s->msgs[s->nmsgs++], sizeof s->msgs[0], "%s", line);
			hit |= until && strncmp(line, until, strlen(until)) == 0;
		}
		if (hit)
			return true;
	}
	return false;
}

/* Index of the first message starting with prefix at or after from, -1. */
static int find_msg(const struct svc *s, const char *prefix, int from)
{
	for (int i = from; i < s->nmsgs; i++)
		if (strncmp(s->msgs[i], prefix, strlen(prefix)) == 0)
			return i;
	return -1;
}

static void dump_msgs(const struct svc *s)
{
	for (int i = 0; i < s->nmsgs; i++)
		fprintf(stderr, "notify[%d] %s\n", i, s->msgs[i]);
}

static bool log_has(const struct daemon *d, const char *needle)
{
	FILE *f = fopen(d->log_path, "r");
	if (!f)
		return false;
	char line[2048];
	bool found = false;
	while (!found && fgets(line, sizeof line, f))
		found = strstr(line, needle) != NULL;
	fclose(f);
	return found;
}

static bool wait_log(const struct daemon *d, const char *needle, double timeout_s)
{
	double deadline = now_s() + timeout_s;
	while (now_s() < deadline) {
		if (log_has(d, needle))
			return true;
		usleep(50000);
	}
	return false;
}

/* ---- notify protocol ---- */

Test(service, notify_ready_status_watchdog_stopping_in_order, .timeout = 120)
{
	if (!have_systemd())
		cr_skip_test("built without libsystemd (-Dsystemd=disabled)");
	struct svc s;
	svc_init(&s, true);
	const char *env[] = {"WATCHDOG_USEC=1000000", NULL};
	/* auto: a GPU if there is one; here, usually, CPU devices instead,
	 * which STATUS= must admit. */
	const char *args[] = {"--listen", "127.0.0.1:0", "--backend", "auto", NULL};
	spawn_env(&s, env, args, -1, true);
	cr_assert(read_notify(&s, "WATCHDOG=1", 30), "no WATCHDOG=1 within 30 s");
	int ready = find_msg(&s, "READY=1", 0), status = find_msg(&s, "STATUS=", 0), wd = find_msg(&s, "WATCHDOG=1", 0);
	cr_assert(ready >= 0 && status > ready && wd > status, "READY, STATUS, WATCHDOG out of order");
	if (strstr(s.msgs[status], "cpu device")) {
		cr_assert(strstr(s.msgs[status],
				 "running 0 jobs, 0 queued; 2 cpu devices (CPU fallback, no usable GPU: "),
			  "%s", s.msgs[status]);
	} else {
		cr_assert(strstr(s.msgs[status], "running 0 jobs, 0 queued; "), "%s", s.msgs[status]);
		cr_assert(strstr(s.msgs[status], "cuda device"), "%s", s.msgs[status]);
	}

	/* STATUS= follows the queue: a job running shows up. */
	long long id = submit_job(&s.d, JOB(3000));
	cr_assert_str_eq(wait_state(&s.d, id, "running", 30), "running");
	bool seen = false;
	double deadline = now_s() + 15;
	while (!seen && now_s() < deadline) {
		int from = s.nmsgs;
		read_notify(&s, "STATUS=", 1);
		for (int i = find_msg(&s, "STATUS=", from); i >= 0 && !seen; i = find_msg(&s, "STATUS=", i + 1))
			seen = strstr(s.msgs[i], "running 1 job,") != NULL;
	}
	cr_assert(seen, "no STATUS= with the running job");

	/* SIGTERM while the job runs: STOPPING=1, then more stop time while
	 * it writes its final checkpoint. */
	kill(s.d.pid, SIGTERM);
	cr_assert(read_notify(&s, "STOPPING=1", 30), "no STOPPING=1");
	int stopping = find_msg(&s, "STOPPING=1", 0);
	cr_assert_gt(stopping, wd);
	int st = 0;
	waitpid(s.d.pid, &st, 0);
	s.d.pid = 0;
	read_notify(&s, NULL, 0.3);
	int extend = find_msg(&s, "EXTEND_TIMEOUT_USEC=", stopping);
	if (extend < 0)
		dump_msgs(&s);
	cr_assert_gt(extend, stopping, "no EXTEND_TIMEOUT_USEC= after STOPPING=1 with a job running");
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exit status %d", st);
	/* STOPPING=1 comes after the last WATCHDOG=1 of the running phase and
	 * READY=1 only once. */
	cr_assert_eq(find_msg(&s, "READY=1", ready + 1), -1);
	svc_cleanup(&s);
}

Test(service, stalled_scheduler_stops_watchdog_pings, .timeout = 120)
{
	if (!have_systemd())
		cr_skip_test("built without libsystemd (-Dsystemd=disabled)");
	struct svc s;
	svc_init(&s, true);
	char stall_env[256], stall[200];
	snprintf(stall, sizeof stall, "%s/stall", s.d.dir);
	snprintf(stall_env, sizeof stall_env, "TRAINERD_TEST_STALL_FILE=%s", stall);
	const char *env[] = {"WATCHDOG_USEC=1000000", stall_env, NULL};
	const char *args[] = {"--listen", "127.0.0.1:0", NULL};
	spawn_env(&s, env, args, -1, true);
	cr_assert(read_notify(&s, "WATCHDOG=1", 30), "no WATCHDOG=1 before the stall");

	int fd = open(stall, O_CREAT | O_WRONLY, 0600);
	cr_assert_geq(fd, 0);
	close(fd);
	cr_assert(wait_log(&s.d, "test hook: the dispatcher stalls", 10), "the stall hook did not fire");
	/* The last check-in may still count for up to 2.5 s (service.c's
	 * MIN_STALE_S); then nothing, for as long as the stall lasts. */
	read_notify(&s, NULL, 4);
	int before = s.nmsgs;
	read_notify(&s, NULL, 3);
	cr_assert_eq(find_msg(&s, "WATCHDOG=1", before), -1, "WATCHDOG=1 while the scheduler stalls");
	cr_assert(wait_log(&s.d, "watchdog: the scheduler has not checked in", 5));
	/* The HTTP side still answers: it is the scheduler that stalls. */
	struct http_reply r;
	http(&s.d, "GET", "/healthz", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200);
	http_free(&r);

	/* Once the scheduler moves again, so does the watchdog. */
	unlink(stall);
	cr_assert(read_notify(&s, "WATCHDOG=1", 10), "no WATCHDOG=1 after the stall ended");
	svc_cleanup(&s);
}

/* ---- socket activation ---- */

static int listening_socket(const char *ip, int *port)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	cr_assert_geq(fd, 0);
	struct sockaddr_in in = {.sin_family = AF_INET};
	inet_pton(AF_INET, ip, &in.sin_addr);
	cr_assert_eq(bind(fd, (struct sockaddr *)&in, sizeof in), 0, "%s", strerror(errno));
	cr_assert_eq(listen(fd, 16), 0);
	socklen_t len = sizeof in;
	getsockname(fd, (struct sockaddr *)&in, &len);
	*port = ntohs(in.sin_port);
	return fd;
}

Test(service, socket_activation_serves_on_the_passed_socket, .timeout = 120)
{
	if (!have_systemd())
		cr_skip_test("built without libsystemd (-Dsystemd=disabled)");
	struct svc s;
	svc_init(&s, false);
	int port;
	int fd = listening_socket("127.0.0.1", &port);
	/* An address the daemon could not listen on itself (TEST-NET-1, and
	 * without tokens): it must not try. */
	const char *args[] = {"--listen", "192.0.2.1:9", NULL};
	spawn_env(&s, NULL, args, fd, true);
	char want[64];
	snprintf(want, sizeof want, "http://127.0.0.1:%d", port);
	cr_assert_str_eq(s.d.base_url, want);
	close(fd); /* the daemon holds its own copy */
	struct http_reply r;
	http(&s.d, "GET", "/version", NULL, NULL, NULL, &r);
	cr_assert_eq(r.status, 200);
	http_free(&r);
	cr_assert(log_has(&s.d, "socket from systemd"));
	/* A reload does not take the socket's address for a changed listen. */
	kill(s.d.pid, SIGHUP);
	cr_assert(wait_log(&s.d, "reload: nothing that can change at run time changed", 10));
	cr_assert(!log_has(&s.d, "listen changed"));
	svc_cleanup(&s);

	/* A passed socket on a non-loopback address without tokens is
	 * refused, as a listen address would be. */
	svc_init(&s, false);
	fd = listening_socket("0.0.0.0", &port);
	spawn_env(&s, NULL, NULL, fd, false);
	close(fd);
	int st = 0;
	waitpid(s.d.pid, &st, 0);
	s.d.pid = 0;
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) != 0, "started on 0.0.0.0 without tokens");
	cr_assert(log_has(&s.d, "needs bearer tokens"));
	svc_cleanup(&s);
}

/* ---- logging: priority prefixes only for the journal ---- */

Test(service, priority_prefix_only_when_stderr_is_the_journal, .timeout = 120)
{
	struct svc s;
	svc_init(&s, false);
	const char *args[] = {"--listen", "127.0.0.1:0", NULL};
	/* JOURNAL_STREAM set, but for another file (as a child of a service
	 * whose output a person redirected): no prefix. */
	const char *env_other[] = {"JOURNAL_STREAM=1:1", NULL};
	spawn_env(&s, env_other, args, -1, true);
	daemon_stop(&s.d, NULL);
	cr_assert(log_has(&s.d, "trainerd: listening on"));
	cr_assert(!log_has(&s.d, "<5>"), "a priority prefix outside the journal");

	/* stderr is "the journal": the log file's own device and inode. */
	unlink(s.d.log_path);
	int fd = open(s.d.log_path, O_CREAT | O_WRONLY, 0644);
	struct stat st;
	fstat(fd, &st);
	close(fd);
	char env_journal[96];
	snprintf(env_journal, sizeof env_journal, "JOURNAL_STREAM=%llu:%llu", (unsigned long long)st.st_dev,
		 (unsigned long long)st.st_ino);
	const char *env[] = {env_journal, NULL};
	spawn_env(&s, env, args, -1, true);
	daemon_stop(&s.d, NULL);
	cr_assert(log_has(&s.d, "<5>listening on"), "no <5> prefix in the journal");
	cr_assert(!log_has(&s.d, "trainerd: listening"));
	svc_cleanup(&s);
}

/* ---- token file and reload ---- */

static void write_file(const char *path, const char *text, mode_t mode)
{
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f);
	fputs(text, f);
	fclose(f);
	chmod(path, mode);
}

static long get_with_token(const struct daemon *d, const char *method, const char *path, const char *token)
{
	char h[256];
	struct http_reply r;
	snprintf(h, sizeof h, "Authorization: Bearer %s", token);
	http(d, method, path, NULL, NULL, h, &r);
	long status = r.status;
	http_free(&r);
	return status;
}

Test(service, token_file_roles_and_reload, .timeout = 120)
{
	struct svc s;
	svc_init(&s, false);
	char tokens[200], conf[200], conf_arg[220];
	snprintf(tokens, sizeof tokens, "%s/tokens", s.d.dir);
	snprintf(conf, sizeof conf, "%s/trainerd.conf", s.d.dir);
	write_file(tokens, "# readers\nread:reader-secret-1\nadmin:admin-secret-1\n", 0644);
	char text[512];
	snprintf(text, sizeof text, "listen = 127.0.0.1:0\nlog-level = info\ntoken-file = %s\n", tokens);
	write_file(conf, text, 0644);
	snprintf(conf_arg, sizeof conf_arg, "--config=%s", conf);
	const char *args[] = {conf_arg, NULL};

	/* Group- or world-readable: refused, naming the file, not a token. */
	spawn_env(&s, NULL, args, -1, false);
	int st = 0;
	waitpid(s.d.pid, &st, 0);
	s.d.pid = 0;
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) != 0);
	cr_assert(log_has(&s.d, "chmod 600"));
	cr_assert(!log_has(&s.d, "secret"));

	chmod(tokens, 0600);
	spawn_env(&s, NULL, args, -1, true);
	cr_assert_eq(get_with_token(&s.d, "GET", "/jobs", "reader-secret-1"), 200);
	cr_assert_eq(get_with_token(&s.d, "POST", "/jobs/1/cancel", "reader-secret-1"), 403);
	cr_assert_eq(get_with_token(&s.d, "GET", "/jobs", "writer-secret-2"), 403);

	/* systemctl reload: a new token, a new log level. */
	write_file(tokens, "read:reader-secret-1\nwrite:writer-secret-2\nadmin:admin-secret-1\n", 0600);
	snprintf(text, sizeof text, "listen = 127.0.0.1:0\nlog-level = debug\ntoken-file = %s\n", tokens);
	write_file(conf, text, 0644);
	kill(s.d.pid, SIGHUP);
	cr_assert(wait_log(&s.d, "reload: tokens now 1 read, 1 write, 1 admin", 10));
	cr_assert(wait_log(&s.d, "reload: log-level 6 -> 7", 5));
	cr_assert_eq(get_with_token(&s.d, "GET", "/jobs", "writer-secret-2"), 200);
	/* 404: the write token got past auth to a job that does not exist. */
	cr_assert_eq(get_with_token(&s.d, "POST", "/jobs/99/cancel", "writer-secret-2"), 404);
	cr_assert_eq(get_with_token(&s.d, "DELETE", "/jobs/99", "writer-secret-2"), 403);

	/* A broken token file on reload keeps the tokens in force. */
	write_file(tokens, "reader:oops\n", 0600);
	cr_assert_eq(get_with_token(&s.d, "POST", "/reload", "writer-secret-2"), 403);
	cr_assert_eq(get_with_token(&s.d, "POST", "/reload", "admin-secret-1"), 202);
	cr_assert(wait_log(&s.d, "unknown role 'reader'", 10));
	cr_assert_eq(get_with_token(&s.d, "GET", "/jobs", "writer-secret-2"), 200);

	/* A restart-only option changed: said so. */
	snprintf(text, sizeof text, "listen = 127.0.0.1:1\nlog-level = debug\ntoken-file = %s\n", tokens);
	write_file(conf, text, 0644);
	write_file(tokens, "write:writer-secret-2\n", 0600);
	kill(s.d.pid, SIGHUP);
	cr_assert(wait_log(&s.d, "reload: listen changed; that takes a restart", 10));
	daemon_stop(&s.d, NULL);
	cr_assert(!log_has(&s.d, "secret"), "a token in the log");
	svc_cleanup(&s);
}

/* What the revoked stream's callback needs: when its first bytes came,
 * the tokens are rewritten without its own and the daemon reloads. */
struct revoke {
	const struct daemon *d;
	const char *tokens;
	double reloaded; /* 0 until then */
	size_t bytes;
};

static size_t revoke_on_first_bytes(char *p, size_t size, size_t n, void *cls)
{
	struct revoke *rv = cls;
	(void)p;
	rv->bytes += size * n;
	if (!rv->reloaded) {
		write_file(rv->tokens, "admin:admin-secret-1\n", 0600);
		kill(rv->d->pid, SIGHUP);
		rv->reloaded = now_s();
	}
	return size * n;
}

/* A token revoked by a reload kept its open event stream, which went on
 * delivering (207 MB in 10 s); the stream now ends within about a second. */
Test(service, revoked_token_ends_its_event_stream, .timeout = 120)
{
	struct svc s;
	svc_init(&s, false);
	char tokens[200], arg[220];
	snprintf(tokens, sizeof tokens, "%s/tokens", s.d.dir);
	write_file(tokens, "read:reader-secret-1\nadmin:admin-secret-1\n", 0600);
	snprintf(arg, sizeof arg, "--token-file=%s", tokens);
	const char *args[] = {"--listen=127.0.0.1:0", arg, NULL};
	spawn_env(&s, NULL, args, -1, true);

	struct http_reply r;
	http(&s.d, "POST", "/jobs",
	     "{\"name\": \"long\", \"seed\": 1, \"model\": {\"inputs\": 4, \"layers\": [{\"type\": \"dense\", "
	     "\"units\": 2}]}, \"data\": {\"train\": {\"format\": \"synthetic\", \"task\": \"classification\", "
	     "\"samples\": 64, \"features\": 4, \"classes\": 2}}, \"batch_size\": 16, \"epochs\": 1000000, "
	     "\"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}, \"devices\": 1}",
	     NULL, "Authorization: Bearer admin-secret-1", &r);
	cr_assert_eq(r.status, 201, "%s", r.body);
	long long id = json_integer_value(json_object_get(r.json, "id"));
	http_free(&r);

	char path[64];
	snprintf(path, sizeof path, "/jobs/%lld/events", id);
	struct revoke rv = {.d = &s.d, .tokens = tokens};
	CURLcode res;
	struct tr_test_request rq = {.base_url = s.d.base_url,
				     .method = "GET",
				     .path = path,
				     .token = "reader-secret-1",
				     .recv_fn = revoke_on_first_bytes,
				     .recv_cls = &rv,
				     .timeout_ms = 15000,
				     .result = &res};
	struct tr_test_reply tr;
	tr_test_http(&rq, &tr);
	double ended = now_s();
	tr_test_reply_free(&tr);
	cr_assert_gt(rv.reloaded, 0, "the stream delivered nothing");
	cr_assert(wait_log(&s.d, "reload: tokens now 0 read, 0 write, 1 admin", 10));
	cr_assert_lt(ended - rv.reloaded, 6 * TR_TEST_SLOW,
		     "the stream ran on for %.1f s after its token was revoked (%zu bytes)", ended - rv.reloaded,
		     rv.bytes);
	/* The admin token, still in force, streams on. */
	cr_assert_eq(get_with_token(&s.d, "GET", "/jobs", "admin-secret-1"), 200);
	cr_assert_eq(get_with_token(&s.d, "GET", "/jobs", "reader-secret-1"), 403);
	svc_cleanup(&s);
}

/* ---- HTTPS ---- */

/* GET base/healthz through the shared client, trusting the CA file ca
 * (NULL: the system's); the transfer's result, which may fail (an
 * untrusted certificate, plain HTTP to an HTTPS port). */
static CURLcode tls_get(const char *base, const char *ca, long *status)
{
	CURLcode rc;
	struct tr_test_reply r;
	struct tr_test_request rq = {
		.base_url = base, .method = "GET", .path = "/healthz", .ca_file = ca, .timeout_s = 20, .result = &rc};

	tr_test_http(&rq, &r);
	*status = r.status;
	tr_test_reply_free(&r);
	return rc;
}

Test(service, https_with_a_test_ca, .timeout = 120)
{
	if (system("command -v openssl >/dev/null") != 0)
		cr_skip_test("openssl (the CLI) is not installed");
	struct svc s;
	svc_init(&s, false);
	char cmd[2048];
	/* A CA, and a server certificate for 127.0.0.1 signed by it. */
	snprintf(
		cmd, sizeof cmd,
		"cd '%s' && openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 "
		"-subj /CN=trainerd-test-ca >/dev/null 2>&1 && "
		"openssl req -newkey rsa:2048 -nodes -keyout tls.key -out tls.csr -subj /CN=127.0.0.1 >/dev/null 2>&1 && "
		"printf 'subjectAltName=IP:127.0.0.1\\n' > ext.cnf && "
		"openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out tls.crt -days 2 "
		"-extfile ext.cnf >/dev/null 2>&1 && chmod 600 tls.key",
		s.d.dir);
	cr_assert_eq(system(cmd), 0, "openssl failed");
	char cert[200], key[200], ca[200];
	snprintf(cert, sizeof cert, "%s/tls.crt", s.d.dir);
	snprintf(key, sizeof key, "%s/tls.key", s.d.dir);
	snprintf(ca, sizeof ca, "%s/ca.crt", s.d.dir);
	const char *args[] = {"--listen", "127.0.0.1:0", "--tls-cert", cert, "--tls-key", key, NULL};
	spawn_env(&s, NULL, args, -1, true);
	cr_assert(!strncmp(s.d.base_url, "https://127.0.0.1:", 18), "%s", s.d.base_url);

	char url[256];
	long status;
	snprintf(url, sizeof url, "%s/healthz", s.d.base_url);
	CURLcode rc = tls_get(s.d.base_url, ca, &status);
	cr_assert_eq(rc, CURLE_OK, "%s", curl_easy_strerror(rc));
	cr_assert_eq(status, 200);
	/* The curl command line agrees. */
	snprintf(cmd, sizeof cmd, "curl -sf --cacert '%s' '%s' >/dev/null", ca, url);
	cr_assert_eq(system(cmd), 0, "curl --cacert failed");
	/* Without the CA the certificate is not trusted; plain HTTP gets no
	 * answer. */
	cr_assert_neq(tls_get(s.d.base_url, "/dev/null", &status), CURLE_OK);
	snprintf(url, sizeof url, "http://%.100s", s.d.base_url + strlen("https://"));
	rc = tls_get(url, NULL, &status);
	cr_assert(rc != CURLE_OK || status != 200, "plain HTTP was answered");
	svc_cleanup(&s);

	/* Half a configuration is refused. */
	svc_init(&s, false);
	const char *half[] = {"--listen", "127.0.0.1:0", "--tls-cert", "/nonexistent.crt", NULL};
	spawn_env(&s, NULL, half, -1, false);
	int st;
	waitpid(s.d.pid, &st, 0);
	s.d.pid = 0;
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) != 0);
	cr_assert(log_has(&s.d, "needs both tls-cert and tls-key"));
	svc_cleanup(&s);
}

/* ---- data roots: escapes at submit and after it ---- */

#define CSV_JOB(path)                                                                                               \
	"{\"name\": \"csv\", \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 2}]}, \"data\": {\"train\":" \
	" {\"format\": \"csv\", \"path\": \"" path "\"}}, \"batch_size\": 4, \"epochs\": 1, \"optimizer\":"         \
	" {\"type\": \"sgd\", \"lr\": 0.1}}"

static void write_csv(const char *path)
{
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f, "%s", path);
	for (int i = 0; i < 32; i++)
		fprintf(f, "%d.5,%d,%d\n", i % 7, i % 3, i % 2);
	fclose(f);
}

Test(service, data_paths_stay_inside_the_data_roots, .timeout = 180)
{
	struct svc s;
	char outside[64], path[256], target[256];
	svc_init(&s, false);
	snprintf(outside, sizeof outside, "/tmp/trainerd-outside-XXXXXX");
	cr_assert_not_null(mkdtemp(outside));
	snprintf(path, sizeof path, "%s/train.csv", outside);
	write_csv(path);
	snprintf(path, sizeof path, "%s/data", s.d.dir);
	mkdir(path, 0755);
	snprintf(path, sizeof path, "%s/data/train.csv", s.d.dir);
	write_csv(path);
	/* A symlink in the root pointing out of it. */
	snprintf(path, sizeof path, "%s/link.csv", s.d.dir);
	snprintf(target, sizeof target, "%s/train.csv", outside);
	cr_assert_eq(symlink(target, path), 0);

	const char *args[] = {"--listen", "127.0.0.1:0", NULL};
	spawn_env(&s, NULL, args, -1, true);

	/* At submit: "..", an absolute path, a symlink out: each 422. */
	char spec[1024];
	const char *escapes[] = {"../../etc/passwd", "/etc/passwd", "link.csv", NULL};
	for (int i = 0; escapes[i]; i++) {
		struct http_reply r;
		snprintf(spec, sizeof spec,
			 "{\"name\": \"csv\", \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 2}]}, \"data\":"
			 " {\"train\": {\"format\": \"csv\", \"path\": \"%s\"}}, \"batch_size\": 4, \"epochs\": 1,"
			 " \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}",
			 escapes[i]);
		http(&s.d, "POST", "/jobs", spec, NULL, NULL, &r);
		cr_assert_eq(r.status, 422, "%s: %ld %s", escapes[i], r.status, r.body);
		cr_assert(strstr(r.body, "invalid_path"), "%s", r.body);
		http_free(&r);
	}

	/* After submit: the job waits behind one that holds every device;
	 * meanwhile its data directory becomes a symlink out of the root.
	 * (The runner opens the files beneath the roots again at start; the
	 * confined open itself is tested in tests/unit/engine/test_roots.c
	 * and the swap race in tests/integration/test_datafiles.c.) */
	long long blocker = submit_job(&s.d, JOB_ON(3000, "\"all\""));
	cr_assert_str_eq(wait_state(&s.d, blocker, "running", 30), "running");
	long long id = submit_job(&s.d, CSV_JOB("data/train.csv"));
	cr_assert_str_eq(wait_state(&s.d, id, "queued", 5), "queued");
	char moved[256];
	snprintf(path, sizeof path, "%s/data", s.d.dir);
	snprintf(moved, sizeof moved, "%s/data.real", s.d.dir);
	cr_assert_eq(rename(path, moved), 0);
	cr_assert_eq(symlink(outside, path), 0);
	struct http_reply r;
	char url[64];
	snprintf(url, sizeof url, "/jobs/%lld/cancel", blocker);
	http(&s.d, "POST", url, NULL, NULL, NULL, &r);
	http_free(&r);
	const char *state = wait_state(&s.d, id, "failed|completed|cancelled", 60);
	snprintf(url, sizeof url, "/jobs/%lld", id);
	http(&s.d, "GET", url, NULL, NULL, NULL, &r);
	cr_assert_str_eq(state, "failed", "%s", r.body);
	/* One answer for paths that lead out and files that are missing. */
	cr_assert(strstr(r.body, "invalid_path") && strstr(r.body, "in the daemon's data roots"), "%s", r.body);
	http_free(&r);

	/* Swapped back, the same file is fine. */
	unlink(path);
	cr_assert_eq(rename(moved, path), 0);
	id = submit_job(&s.d, CSV_JOB("data/train.csv"));
	cr_assert_str_eq(wait_state(&s.d, id, "completed|failed", 60), "completed");
	svc_cleanup(&s);
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", outside);
	cr_assert_eq(system(cmd), 0);
}
