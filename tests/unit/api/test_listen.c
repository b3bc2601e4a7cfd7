/* Unit tests of api/listen.c: which addresses are loopback; a passed
 * listening socket checked before use (a pipe, a datagram socket, a
 * socket that does not listen, a Unix socket refused, each with its
 * reason; one off loopback only with tokens) and served; the HTTPS key
 * pair's files checked (one without the other, missing, empty, not PEM,
 * over 1 MiB, each naming the option and the path); the watchdog's probe
 * stamping the liveness time, and the probe address of a wildcard
 * listener being loopback.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "api/api_internal.h"
#include "tests/unit/api/fixture.h"

TestSuite(api, .init = api_fixture_setup, .fini = api_fixture_teardown, .timeout = 60);

static bool loopback4(const char *ip)
{
	struct sockaddr_in a = {.sin_family = AF_INET};

	cr_assert_eq(inet_pton(AF_INET, ip, &a.sin_addr), 1);
	return tr_api_is_loopback((struct sockaddr *)&a);
}

static bool loopback6(const char *ip)
{
	struct sockaddr_in6 a = {.sin6_family = AF_INET6};

	cr_assert_eq(inet_pton(AF_INET6, ip, &a.sin6_addr), 1);
	return tr_api_is_loopback((struct sockaddr *)&a);
}

Test(api, loopback_addresses)
{
	struct sockaddr_un u = {.sun_family = AF_UNIX};

	cr_assert(loopback4("127.0.0.1"));
	cr_assert(loopback4("127.255.3.4"), "all of 127/8");
	cr_assert_not(loopback4("128.0.0.1"));
	cr_assert_not(loopback4("10.0.0.1"));
	cr_assert_not(loopback4("0.0.0.0"), "the wildcard is every interface");
	cr_assert(loopback6("::1"));
	cr_assert(loopback6("::ffff:127.0.0.9"), "IPv4-mapped loopback");
	cr_assert_not(loopback6("::ffff:10.0.0.1"));
	cr_assert_not(loopback6("::"));
	cr_assert_not(loopback6("fe80::1"));
	cr_assert_not(tr_api_is_loopback((struct sockaddr *)&u));
}

/* A listening TCP socket on ip, port 0. */
static int listener(const char *ip)
{
	struct sockaddr_in a = {.sin_family = AF_INET};
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	inet_pton(AF_INET, ip, &a.sin_addr);
	cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
	cr_assert_eq(listen(fd, 8), 0);
	return fd;
}

static void expect_refused(int fd, size_t n_auth, const char *needle)
{
	struct tr_api a = {.n_auth = n_auth};
	struct tr_error e = {0};
	bool v6 = true;

	cr_assert_eq(tr_api_adopt_listener(&a, fd, &v6, &e), -1, "fd %d is refused", fd);
	cr_assert_not_null(strstr(e.message, needle), "'%s' not in: %s", needle, e.message);
	free(a.listen_host);
}

Test(api, passed_sockets_are_checked)
{
	int p[2], udp, quiet, unix_fd, wild;
	struct sockaddr_un u = {.sun_family = AF_UNIX};

	cr_assert_eq(pipe(p), 0);
	expect_refused(p[0], 0, "not a stream socket");
	udp = socket(AF_INET, SOCK_DGRAM, 0);
	expect_refused(udp, 0, "not a stream socket");
	quiet = socket(AF_INET, SOCK_STREAM, 0);
	expect_refused(quiet, 0, "not listening");
	unix_fd = socket(AF_UNIX, SOCK_STREAM, 0);
	/* A short path: sun_path holds 108 bytes. */
	cr_assert_lt(strlen(dir) + 6, sizeof u.sun_path);
	memcpy(u.sun_path, dir, strlen(dir));
	memcpy(u.sun_path + strlen(dir), "/sock", 6);
	cr_assert_eq(bind(unix_fd, (struct sockaddr *)&u, sizeof u), 0);
	cr_assert_eq(listen(unix_fd, 1), 0);
	expect_refused(unix_fd, 0, "not an IPv4 or IPv6 socket");
	wild = listener("0.0.0.0");
	expect_refused(wild, 0, "needs bearer tokens");

	/* With a token the same socket is taken, and named. */
	struct tr_api a = {.n_auth = 1};
	struct tr_error e = {0};
	bool v6 = true;
	cr_assert_eq(tr_api_adopt_listener(&a, wild, &v6, &e), wild, "%s", e.message);
	cr_assert_not(v6);
	cr_assert_str_eq(a.cfg.listen_host, "0.0.0.0");
	cr_assert(fcntl(wild, F_GETFD) & FD_CLOEXEC, "not passed on to children");
	free(a.listen_host);
	close(p[0]);
	close(p[1]);
	close(udp);
	close(quiet);
	close(unix_fd);
	close(wild);
}

static void passed_socket(struct tr_api_config *cfg);
static int passed_fd = -1;

static void passed_socket(struct tr_api_config *cfg)
{
	cfg->use_listen_fd = true;
	cfg->listen_fd = passed_fd;
}

Test(api, a_passed_loopback_socket_is_served)
{
	struct sockaddr_in a;
	socklen_t len = sizeof a;
	struct start_opts o = {.tweak = passed_socket};
	struct tr_test_reply r;

	passed_fd = listener("127.0.0.1");
	cr_assert_eq(getsockname(passed_fd, (struct sockaddr *)&a, &len), 0);
	restart(&o);
	cr_assert_eq(port, ntohs(a.sin_port), "the API reports the passed socket's port");
	r = http("GET", "/healthz", NULL);
	expect_status(&r, 200, "healthz on the passed socket");
	resp_free(&r);
}

static void write_file(const char *path, const char *text, size_t len)
{
	FILE *f = fopen(path, "w");

	cr_assert_not_null(f);
	cr_assert_eq(fwrite(text, 1, len, f), len);
	fclose(f);
}

static void expect_tls_error(const char *cert, const char *key, const char *needle1, const char *needle2)
{
	struct tr_api a = {0};
	struct tr_api_config cfg = {.tls_cert_path = cert, .tls_key_path = key};
	struct tr_error e = {0};

	cr_assert_eq(tr_api_tls_load(&a, &cfg, &e), -1, "cert %s key %s is refused", cert, key);
	cr_assert_not_null(strstr(e.message, needle1), "'%s' not in: %s", needle1, e.message);
	if (needle2)
		cr_assert_not_null(strstr(e.message, needle2), "'%s' not in: %s", needle2, e.message);
	free(a.tls_cert);
	free(a.tls_key);
}

Test(api, tls_files_are_checked)
{
	char pem[PATH_MAX + 16], empty[PATH_MAX + 16], text[PATH_MAX + 16], big[PATH_MAX + 16], missing[PATH_MAX + 16];
	const char *block = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
	struct tr_api a = {0};
	struct tr_api_config none = {0};
	struct tr_error e = {0};

	/* Neither: plain HTTP. */
	cr_assert_eq(tr_api_tls_load(&a, &none, &e), 0);
	cr_assert_null(a.tls_cert);
	if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
		expect_tls_error("/x", "/y", "without TLS", NULL);
		cr_skip_test("libmicrohttpd has no TLS: the file checks are not reached");
	}
	snprintf(pem, sizeof pem, "%s/cert.pem", dir);
	snprintf(empty, sizeof empty, "%s/empty.pem", dir);
	snprintf(text, sizeof text, "%s/text.pem", dir);
	snprintf(big, sizeof big, "%s/big.pem", dir);
	snprintf(missing, sizeof missing, "%s/missing.pem", dir);
	write_file(pem, block, strlen(block));
	write_file(empty, "", 0);
	write_file(text, "just text\n", 10);
	size_t n = ((size_t)1 << 20) + 1;
	char *junk = malloc(n);
	memset(junk, 'A', n);
	memcpy(junk, block, strlen(block));
	write_file(big, junk, n);
	free(junk);

	expect_tls_error(pem, NULL, "needs both tls-cert and tls-key", "only tls-cert");
	expect_tls_error(NULL, pem, "needs both tls-cert and tls-key", "only tls-key");
	expect_tls_error(missing, pem, "tls-cert", missing);
	expect_tls_error(pem, missing, "tls-key", missing);
	expect_tls_error(empty, pem, "tls-cert", "not a PEM file");
	expect_tls_error(pem, big, "tls-key", "at most 1 MiB");
	expect_tls_error(pem, text, "tls-key", "no PEM block");
	expect_tls_error(dir, pem, "tls-cert", "not a PEM file");

	struct tr_api_config both = {.tls_cert_path = pem, .tls_key_path = pem};
	cr_assert_eq(tr_api_tls_load(&a, &both, &e), 0, "%s", e.message);
	cr_assert_str_eq(a.tls_cert, block);
	cr_assert_str_eq(a.tls_key, block);
	free(a.tls_cert);
	free(a.tls_key);
}

Test(api, the_probe_stamps_liveness)
{
	double before;

	cr_assert_eq(tr_api_probe(NULL), -EINVAL);
	before = tr_api_last_accept(api);
	cr_assert_gt(before, 0, "starting stamps");
	usleep(2000);
	/* The probe's connection is accepted on MHD's thread; wait for it
	 * (bounded). */
	cr_assert_eq(tr_api_probe(api), 0);
	for (int i = 0; i < 500 && tr_api_last_accept(api) <= before; i++)
		usleep(2000);
	cr_assert_gt(tr_api_last_accept(api), before, "the probe's connection was accepted and stamped");
}

Test(api, a_wildcard_listener_is_probed_on_loopback)
{
	struct tr_api a = {0};
	int fd = listener("0.0.0.0");
	struct sockaddr_in *in = (struct sockaddr_in *)&a.probe_addr;
	struct sockaddr_in bound;
	socklen_t len = sizeof bound;

	getsockname(fd, (struct sockaddr *)&bound, &len);
	tr_api_set_probe_addr(&a, fd);
	cr_assert_eq(a.probe_len, sizeof(struct sockaddr_in));
	cr_assert_eq(in->sin_addr.s_addr, htonl(INADDR_LOOPBACK));
	cr_assert_eq(in->sin_port, bound.sin_port);
	cr_assert_gt(tr_api_last_accept(&a), 0);
	/* A probe to it connects (the kernel accepts into the backlog). */
	cr_assert_eq(tr_api_probe(&a), 0);
	close(fd);
}
