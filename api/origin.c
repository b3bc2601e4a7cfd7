/* Requests a browser may have sent on another site's behalf.
 *
 * A page from any origin can make a browser send requests to the daemon:
 * a no-cors fetch or an auto-submitted form is a POST without a body, and
 * such a POST cancels, stops, pauses or resumes a job.  And by DNS
 * rebinding (a name of the attacker's that resolves to 127.0.0.1) a page
 * is even same-origin with the daemon, so it reads the answers too; its
 * requests still carry the attacker's name in Host.  Without tokens, the
 * browser's ambient reach is all the access there is, so:
 *  - without tokens, only Host values that name loopback (localhost,
 *    127.0.0.0/8, ::1) are answered;
 *  - a request that changes something (any method but GET and HEAD) is
 *    refused when its Origin is not the daemon's own origin (scheme and
 *    the Host it was sent to) or when the browser says it comes from
 *    another site (Sec-Fetch-Site: cross-site).  Clients other than
 *    browsers (curl, trainctl) send neither header.
 * Both are 403 `forbidden`, with a message saying which. */
#include "api/api_internal.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* Whether a Host value ("name", "name:port", "[v6]:port") names loopback. */
static bool host_is_loopback(const char *host)
{
	char name[256];
	const char *end;

	if (host[0] == '[') {
		end = strchr(host, ']');
		if (!end)
			return false;
		host++;
	} else {
		end = strchr(host, ':');
		if (!end)
			end = host + strlen(host);
	}
	if ((size_t)(end - host) >= sizeof name)
		return false;
	memcpy(name, host, (size_t)(end - host));
	name[end - host] = '\0';
	if (strcasecmp(name, "localhost") == 0)
		return true;
	struct in_addr a4;
	struct in6_addr a6;
	if (inet_pton(AF_INET, name, &a4) == 1)
		return (ntohl(a4.s_addr) >> 24) == 127;
	if (inet_pton(AF_INET6, name, &a6) == 1)
		return IN6_IS_ADDR_LOOPBACK(&a6) || (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
	return false;
}

/* Whether origin is scheme://host exactly (ports included as sent). */
static bool same_origin(const char *origin, bool tls, const char *host)
{
	const char *scheme = tls ? "https://" : "http://";
	size_t n = strlen(scheme);

	return host && strncasecmp(origin, scheme, n) == 0 && strcasecmp(origin + n, host) == 0;
}

int tr_api_origin_check(struct tr_api_request *rq, struct tr_api_reply *rp)
{
	tr_api_t *api = rq->api;
	const char *host = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);

	pthread_rwlock_rdlock(&api->auth_lock);
	bool open = api->n_auth == 0;
	pthread_rwlock_unlock(&api->auth_lock);
	if (open && host && !host_is_loopback(host)) {
		tr_api_fail(rp, 403, "forbidden", NULL,
			    "Host '%.100s' is not a loopback name: without tokens the daemon answers only requests "
			    "addressed to localhost, 127.0.0.1 or [::1] (a foreign name is how DNS rebinding reaches "
			    "it)",
			    host);
		return -1;
	}
	if (strcmp(rq->method, MHD_HTTP_METHOD_GET) == 0 || strcmp(rq->method, MHD_HTTP_METHOD_HEAD) == 0)
		return 0;
	const char *site = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, "Sec-Fetch-Site");
	if (site && strcasecmp(site, "cross-site") == 0) {
		tr_api_fail(rp, 403, "forbidden", NULL,
			    "%s from a page of another site (Sec-Fetch-Site: cross-site) is refused", rq->method);
		return -1;
	}
	const char *origin = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, "Origin");
	if (origin && !same_origin(origin, tr_api_is_tls(api), host)) {
		tr_api_fail(rp, 403, "forbidden", NULL,
			    "%s from the origin '%.100s' is refused: only the daemon's own pages (%s://%.100s) may "
			    "change anything",
			    rq->method, origin, tr_api_is_tls(api) ? "https" : "http", host ? host : "?");
		return -1;
	}
	return 0;
}
