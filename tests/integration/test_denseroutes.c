/* The CPU route of a job's dense layers against a real daemon
 * (docs/design.md, "Dense layers on CPU devices"): each dense layer's
 * route (OpenBLAS or oneDNN tiles; oneDNN's where the build has it) is the
 * job's info field dense_routes, and a repeat of the job after a restart
 * takes the same routes and trains to the same loss bits.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static struct daemon d;

static void start(void)
{
	daemon_start(&d, 1, NULL);
}

static void stop(void)
{
	daemon_cleanup(&d);
}

TestSuite(denseroutes, .init = start, .fini = stop, .timeout = 240);

/* two dense layers of different shapes; a few steps; FIELD: the spec's
 * cpu_dense, if any */
#define JOB_WITH(FIELD)                                                                                        \
	"{\"name\": \"denseroutes\", \"seed\": 5," FIELD                                                       \
	"\"model\": {\"inputs\": 20, \"layers\": [{\"type\": \"dense\", \"units\": 16}, {\"type\": \"relu\"}," \
	" {\"type\": \"dense\", \"units\": 3}], \"loss\": \"softmax_cross_entropy\"},"                         \
	"\"data\": {\"train\": {\"format\": \"synthetic\", \"task\": \"classification\", \"samples\": 64,"     \
	" \"features\": 20, \"classes\": 3}},"                                                                 \
	"\"batch_size\": 16, \"max_steps\": 4, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.05}}"
static const char *const JOB = JOB_WITH("");

/* The finished job's info.dense_routes and its final loss (bits). */
static void job_result(long long id, char routes[64], double *loss)
{
	job_info_and_loss(&d, id, "dense_routes", routes, 64, loss);
}

static bool is_route(const char *s)
{
	return !strcmp(s, "openblas") || !strcmp(s, "onednn");
}

Test(denseroutes, each_layers_route_is_shown_and_kept)
{
	char routes[64], again[64], first[16], second[16];
	double loss, loss2;

	job_result(submit_job(&d, JOB), routes, &loss);
	cr_assert_eq(sscanf(routes, "%15[a-z],%15[a-z]", first, second), 2, "one route per dense layer: '%s'", routes);
	cr_expect(is_route(first) && is_route(second), "'%s'", routes);
	/* the default: oneDNN's tiles for every layer where the build has
	 * oneDNN (the job's other route names show which one this is) */
	cr_expect_str_eq(first, second, "'%s'", routes);

	/* a repeat after a restart: the same routes, the same bits */
	daemon_stop(&d, NULL);
	daemon_restart(&d, 1, NULL);
	job_result(submit_job(&d, JOB), again, &loss2);
	cr_expect_str_eq(again, routes);
	cr_expect(memcmp(&loss, &loss2, sizeof loss) == 0, "final loss %.9g then %.9g", loss, loss2);
}

/* A job's spec may name the route (cpu_dense); a bad name is refused at
 * submit, naming the field. */
Test(denseroutes, the_spec_names_the_route)
{
	char routes[64];
	double loss;
	job_result(submit_job(&d, JOB_WITH("\"cpu_dense\": \"openblas\",")), routes, &loss);
	cr_expect_str_eq(routes, "openblas,openblas");
	/* onednn: taken, or (a build without oneDNN) the job fails naming
	 * the field */
	long long id = submit_job(&d, JOB_WITH("\"cpu_dense\": \"onednn\","));
	if (!strcmp(wait_state(&d, id, "completed|failed|cancelled", 120), "failed")) {
		char path[64];
		struct http_reply f;
		snprintf(path, sizeof path, "/jobs/%lld", id);
		http(&d, "GET", path, NULL, NULL, NULL, &f);
		const char *msg = json_string_value(json_object_get(json_object_get(f.json, "error"), "message"));
		cr_expect(msg && strstr(msg, "/cpu_dense") && strstr(msg, "oneDNN"), "%s", msg ? msg : "(none)");
		http_free(&f);
	} else {
		job_result(id, routes, &loss);
		cr_expect_str_eq(routes, "onednn,onednn");
	}

	struct http_reply r;
	http(&d, "POST", "/jobs", JOB_WITH("\"cpu_dense\": \"fastest\","), "application/json", NULL, &r);
	cr_expect(r.status == 400 || r.status == 422, "status %ld", r.status);
	cr_expect(r.body && strstr(r.body, "/cpu_dense"), "%s", r.body ? r.body : "");
	http_free(&r);
}
