/* Unit tests of api/routes.c: the route table.
 * Over real HTTP against the in-process API of tests/unit/api/fixture.h.
 */
#include <criterion/criterion.h>
#include <curl/curl.h>
#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <regex.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "api/rcache.h"
#include "api/routes.h"
#include "engine/safetensors.h"
#include "tests/unit/api/fixture.h"

TestSuite(api, .init = api_fixture_setup, .fini = api_fixture_teardown, .timeout = 60);

Test(api, route_table)
{
	size_t n;
	const struct tr_api_route *routes = tr_api_routes(&n);
	char params[2][32], allow[64];
	int np = 0;
	bool known;

	cr_assert_geq(n, 18);
	for (size_t i = 0; i < n; i++) {
		cr_assert_not_null(routes[i].handler);
		cr_assert_eq(routes[i].path[0], '/');
		for (size_t j = 0; j < i; j++)
			cr_assert(strcmp(routes[i].method, routes[j].method) || strcmp(routes[i].path, routes[j].path),
				  "duplicate %s %s", routes[i].method, routes[i].path);
	}
	const struct tr_api_route *r = tr_api_route_match("GET", "/jobs/17/metrics", params, 2, &np, &known);

	cr_assert_not_null(r);
	cr_assert_str_eq(r->path, "/jobs/{id}/metrics");
	cr_assert_eq(np, 1);
	cr_assert_str_eq(params[0], "17");
	cr_assert_null(tr_api_route_match("PUT", "/jobs/17", params, 2, &np, &known));
	cr_assert(known);
	cr_assert_null(tr_api_route_match("GET", "/jobs/17/x", params, 2, &np, &known));
	cr_assert(!known);
	tr_api_route_allow("/jobs/{x}", allow, sizeof(allow));
	cr_assert_str_eq(allow, "GET, PATCH, DELETE");
}
