/* The listener's edges: a socket handed over by the service manager
 * (socket activation), the HTTPS key pair, and the liveness signal the
 * service watchdog reads.
 *
 * Liveness: every connection the listener accepts, and every request it
 * admits, stamps a monotonic time.  An idle daemon would never stamp, so
 * the watchdog calls tr_api_probe, which opens one connection to the
 * listener and drops it: if the accepting thread is alive it stamps, if
 * it is stuck the connection sits in the backlog and the stamp grows old.
 * Accepting is proof enough: it happens before TLS or HTTP, so a probe
 * needs neither.
 */
#include "api/api_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* A PEM certificate chain or key is a few kilobytes. */
#define PEM_MAX ((off_t)1 << 20)

static long long mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void tr_api_stamp(tr_api_t *api)
{
	atomic_store(&api->last_accept_ns, mono_ns());
}

double tr_api_last_accept(const tr_api_t *api)
{
	return api ? (double)atomic_load(&((tr_api_t *)api)->last_accept_ns) * 1e-9 : 0;
}

int tr_api_probe(const tr_api_t *api)
{
	struct timeval tv = {.tv_sec = 1};
	int fd, rc = 0;

	if (!api || !api->probe_len)
		return -EINVAL;
	fd = socket(api->probe_addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	/* Bounded: a listener whose backlog is full (nobody accepting) makes
	 * connect wait for retransmissions. */
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	if (connect(fd, (const struct sockaddr *)&api->probe_addr, api->probe_len) < 0)
		rc = -errno;
	close(fd);
	return rc;
}

/* Where a probe connects: the bound address, with a wildcard replaced by
 * loopback of the same family. */
void tr_api_set_probe_addr(tr_api_t *api, int fd)
{
	socklen_t len = sizeof(api->probe_addr);

	if (getsockname(fd, (struct sockaddr *)&api->probe_addr, &len) < 0) {
		api->probe_len = 0;
		return;
	}
	api->probe_len = len;
	if (api->probe_addr.ss_family == AF_INET) {
		struct sockaddr_in *in = (struct sockaddr_in *)&api->probe_addr;

		if (in->sin_addr.s_addr == htonl(INADDR_ANY))
			in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	} else if (api->probe_addr.ss_family == AF_INET6) {
		struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&api->probe_addr;

		if (IN6_IS_ADDR_UNSPECIFIED(&in6->sin6_addr))
			in6->sin6_addr = in6addr_loopback;
	}
	tr_api_stamp(api);
}

int tr_api_adopt_listener(tr_api_t *api, int fd, bool *ipv6, struct tr_error *e)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	int type = 0, listening = 0;
	socklen_t olen = sizeof(type);

	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &olen) < 0 || type != SOCK_STREAM) {
		tr_error_set(e, 0, 0, NULL, "the passed descriptor %d is not a stream socket", fd);
		return -1;
	}
	olen = sizeof(listening);
	if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &olen) < 0 || !listening) {
		tr_error_set(e, 0, 0, NULL, "the passed socket %d is not listening", fd);
		return -1;
	}
	if (getsockname(fd, (struct sockaddr *)&ss, &len) < 0 ||
	    (ss.ss_family != AF_INET && ss.ss_family != AF_INET6)) {
		tr_error_set(e, 0, 0, NULL,
			     "the passed socket %d is not an IPv4 or IPv6 socket (ListenStream= takes "
			     "ADDRESS:PORT or PORT)",
			     fd);
		return -1;
	}
	api->loopback = tr_api_is_loopback((const struct sockaddr *)&ss);
	if (!api->loopback && api->n_auth == 0) {
		tr_error_set(e, 0, 0, NULL,
			     "the passed socket is not on loopback: it needs bearer tokens (token-file or token), "
			     "anyone who can reach the port could submit and cancel jobs");
		return -1;
	}
	*ipv6 = ss.ss_family == AF_INET6;
	fcntl(fd, F_SETFD, FD_CLOEXEC);
	free(api->listen_host);
	api->listen_host = malloc(INET6_ADDRSTRLEN);
	if (!api->listen_host) {
		tr_error_set(e, 0, 0, NULL, "out of memory");
		return -1;
	}
	if (ss.ss_family == AF_INET)
		inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, api->listen_host, INET6_ADDRSTRLEN);
	else
		inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, api->listen_host, INET6_ADDRSTRLEN);
	api->cfg.listen_host = api->listen_host;
	return fd;
}

static int read_pem(const char *what, const char *path, char **out, struct tr_error *e)
{
	struct stat st;
	char *buf = NULL;
	ssize_t got;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0) {
		tr_error_set(e, 0, 0, NULL, "%s %s: %s", what, path, strerror(errno));
		return -1;
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 || st.st_size > PEM_MAX) {
		tr_error_set(e, 0, 0, NULL, "%s %s: not a PEM file of at most 1 MiB", what, path);
		goto fail;
	}
	buf = malloc((size_t)st.st_size + 1);
	if (!buf) {
		tr_error_set(e, 0, 0, NULL, "out of memory");
		goto fail;
	}
	got = read(fd, buf, (size_t)st.st_size);
	if (got != st.st_size) {
		tr_error_set(e, 0, 0, NULL, "%s %s: short read", what, path);
		goto fail;
	}
	buf[got] = '\0';
	if (!strstr(buf, "-----BEGIN ")) {
		tr_error_set(e, 0, 0, NULL, "%s %s: no PEM block in the file", what, path);
		goto fail;
	}
	close(fd);
	*out = buf;
	return 0;
fail:
	if (buf) {
		explicit_bzero(buf, (size_t)st.st_size);
		free(buf);
	}
	close(fd);
	return -1;
}

int tr_api_tls_load(tr_api_t *api, const struct tr_api_config *cfg, struct tr_error *e)
{
	bool cert = cfg->tls_cert_path && cfg->tls_cert_path[0], key = cfg->tls_key_path && cfg->tls_key_path[0];

	if (!cert && !key)
		return 0;
	if (cert != key) {
		tr_error_set(e, 0, 0, NULL, "HTTPS needs both tls-cert and tls-key (only %s is set)",
			     cert ? "tls-cert" : "tls-key");
		return -1;
	}
	if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
		tr_error_set(e, 0, 0, NULL, "tls-cert is set, but this libmicrohttpd was built without TLS (GnuTLS)");
		return -1;
	}
	if (read_pem("tls-cert", cfg->tls_cert_path, &api->tls_cert, e) < 0 ||
	    read_pem("tls-key", cfg->tls_key_path, &api->tls_key, e) < 0)
		return -1;
	return 0;
}

bool tr_api_is_tls(const tr_api_t *api)
{
	return api && api->tls_cert;
}
