/* The CPU conv2d route of a job against a real daemon (docs/design.md,
 * "Convolution on CPU devices"): a job's spec names its own route
 * (cpu_conv) or takes the daemon's, auto; the route of each conv layer is
 * the job's info field conv_routes; auto's measured choice lands in the
 * state directory's conv_routes.json, and a repeat of the job after a
 * restart decides the same way and trains to the same loss bits.
 */
#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

TestSuite(convroutes, .init = start, .fini = stop, .timeout = 240);

/* two conv layers of different shapes; a few steps */
static char *conv_job(const char *cpu_conv)
{
	static char spec[1536];
	char field[64] = "";
	if (cpu_conv)
		snprintf(field, sizeof field, "\"cpu_conv\": \"%s\", ", cpu_conv);
	snprintf(spec, sizeof spec,
		 "{\"name\": \"convroutes\", \"seed\": 3, %s"
		 "\"model\": {\"inputs\": [1, 12, 12], \"layers\": ["
		 "{\"type\": \"conv2d\", \"filters\": 4, \"kernel\": 3}, {\"type\": \"relu\"},"
		 "{\"type\": \"conv2d\", \"filters\": 6, \"kernel\": 3, \"padding\": 1}, {\"type\": \"relu\"},"
		 "{\"type\": \"flatten\"}, {\"type\": \"dense\", \"units\": 3}],"
		 " \"loss\": \"softmax_cross_entropy\"},"
		 "\"data\": {\"train\": {\"format\": \"synthetic\", \"task\": \"classification\", \"samples\": 64,"
		 " \"shape\": [1, 12, 12], \"classes\": 3}},"
		 "\"batch_size\": 16, \"max_steps\": 4, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.05}}",
		 field);
	return spec;
}

/* The finished job's info.conv_routes and its final loss (bits). */
static void job_result(long long id, char routes[64], double *loss)
{
	job_info_and_loss(&d, id, "conv_routes", routes, 64, loss);
}

static bool is_route_list(const char *s)
{
	char a[16], b[16];
	if (sscanf(s, "%15[a-z0-9],%15[a-z0-9]", a, b) != 2)
		return false;
	return (!strcmp(a, "im2col") || !strcmp(a, "onednn")) && (!strcmp(b, "im2col") || !strcmp(b, "onednn"));
}

Test(convroutes, a_jobs_route_and_autos_remembered_choice)
{
	char routes[64], again[64];
	double loss, loss2;

	job_result(submit_job(&d, conv_job("im2col")), routes, &loss);
	cr_expect_str_eq(routes, "im2col,im2col", "the spec's route");

	job_result(submit_job(&d, conv_job(NULL)), routes, &loss);
	cr_expect(is_route_list(routes), "auto's choice per layer: '%s'", routes);
	char file[256];
	snprintf(file, sizeof file, "%s/conv_routes.json", d.dir);
	cr_expect_eq(access(file, R_OK), 0, "%s not written", file);

	/* a repeat after a restart: the file decides, same choice, same bits */
	daemon_stop(&d, NULL);
	daemon_restart(&d, 1, NULL);
	job_result(submit_job(&d, conv_job("auto")), again, &loss2);
	cr_expect_str_eq(again, routes);
	cr_expect(memcmp(&loss, &loss2, sizeof loss) == 0, "final loss %.9g then %.9g", loss, loss2);

	/* a bad route is refused at submit, naming the field */
	struct http_reply r;
	char *bad = conv_job("fastest");
	http(&d, "POST", "/jobs", bad, "application/json", NULL, &r);
	cr_expect(r.status == 400 || r.status == 422, "status %ld", r.status);
	cr_expect(r.body && strstr(r.body, "/cpu_conv"), "%s", r.body ? r.body : "");
	http_free(&r);
}
