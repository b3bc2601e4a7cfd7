/* Read-only commands: metrics, logs, checkpoints, devices, version. */
#include "cli/trainctl.h"

#include <curl/curl.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- metrics ---- */

/* Long CSV: one point a line, name,step,epoch,value (epoch when asked). */
static void metrics_csv(const json_t *series)
{
	const char *name;
	json_t *s;

	printf("name,step,epoch,value\n");
	json_object_foreach((json_t *)series, name, s) {
		const json_t *steps = json_object_get(s, "steps"), *vals = json_object_get(s, "values");
		const json_t *epochs = json_object_get(s, "epochs");

		for (size_t i = 0; i < json_array_size(steps); i++) {
			const json_t *v = json_array_get(vals, i);

			printf("%s,%lld,", name, (long long)json_integer_value(json_array_get(steps, i)));
			if (epochs)
				printf("%lld", (long long)json_integer_value(json_array_get(epochs, i)));
			if (json_is_number(v))
				printf(",%.9g\n", json_number_value(v));
			else
				printf(",nan\n");
		}
	}
}

int tr_cmd_metrics(struct tr_ctl *c, int argc, char **argv)
{
	static const struct option opts[] = {{"names", required_argument, NULL, 'n'},
					     {"max-points", required_argument, NULL, 'm'},
					     {"format", required_argument, NULL, 'f'},
					     {"from-step", required_argument, NULL, 'F'},
					     {"to-step", required_argument, NULL, 'T'},
					     {"help", no_argument, NULL, 'h'},
					     {NULL, 0, NULL, 0}};
	const char *names = NULL, *max_points = NULL, *format = "csv", *from = NULL, *to = NULL;
	struct tr_ctl_reply r;
	char path[1024];
	int ch, rc;

	while ((ch = getopt_long(argc, argv, "n:m:f:h", opts, NULL)) != -1) {
		switch (ch) {
		case 'n':
			names = optarg;
			break;
		case 'm':
			max_points = optarg;
			break;
		case 'f':
			format = optarg;
			break;
		case 'F':
			from = optarg;
			break;
		case 'T':
			to = optarg;
			break;
		case 'h':
			return tr_ctl_help("metrics");
		default:
			return tr_ctl_usage("metrics", "unknown option");
		}
	}
	if (strcmp(format, "csv") != 0 && strcmp(format, "json") != 0)
		return tr_ctl_usage("metrics", "--format: csv or json, not %s", format);
	if (argc - optind != 1)
		return tr_ctl_usage("metrics", "expects one job id");
	int64_t id = tr_ctl_job_id("metrics", argv[optind]);

	if (id < 0)
		return TR_CTL_USAGE;
	/* Query values go through as given, escaped: the daemon checks them
	 * and names the parameter in its error. */
	char *en = names ? curl_easy_escape(NULL, names, 0) : NULL;
	char *em = max_points ? curl_easy_escape(NULL, max_points, 0) : NULL;
	char *ef = from ? curl_easy_escape(NULL, from, 0) : NULL;
	char *et = to ? curl_easy_escape(NULL, to, 0) : NULL;

	snprintf(path, sizeof path, "/jobs/%" PRId64 "/metrics?epochs=true%s%.300s%s%.30s%s%.30s%s%.30s", id,
		 en ? "&names=" : "", en ? en : "", em ? "&max_points=" : "", em ? em : "", ef ? "&from_step=" : "",
		 ef ? ef : "", et ? "&to_step=" : "", et ? et : "");
	curl_free(en);
	curl_free(em);
	curl_free(ef);
	curl_free(et);
	rc = tr_ctl_call(c, "GET", path, NULL, &r);
	if (rc)
		return rc;
	if (strcmp(format, "json") == 0)
		tr_print_json(r.json, stdout);
	else
		metrics_csv(json_object_get(r.json, "series"));
	tr_ctl_reply_finish(&r);
	return TR_CTL_OK;
}

/* ---- logs ---- */

static void print_log(const json_t *l)
{
	int level = (int)json_integer_value(json_object_get(l, "level"));
	char when[32];

	tr_fmt_time(when, sizeof when, json_string_value(json_object_get(l, "time")));
	printf("%s %s%s\n", when,
	       level <= 3   ? "error: "
	       : level == 4 ? "warning: "
			    : "",
	       json_string_value(json_object_get(l, "message")) ?: "");
}

int tr_cmd_logs(struct tr_ctl *c, int argc, char **argv)
{
	bool follow = false;
	char path[128], after[32] = "";
	int rc;
	int64_t id = tr_ctl_parse_id_args("logs", argc, argv, "follow", 'f', &follow);

	if (id <= 0)
		return (int)-id;
	/* The event stream replays every log line from the start, then
	 * follows: -f needs no separate first read. */
	if (follow)
		return tr_ctl_follow(c, id, true, 300);
	for (;;) {
		struct tr_ctl_reply r;
		const json_t *logs;
		const char *next;
		size_t i;
		json_t *l;

		snprintf(path, sizeof path, "/jobs/%" PRId64 "/logs?limit=1000%s%s", id, after[0] ? "&after=" : "",
			 after);
		rc = tr_ctl_call(c, "GET", path, NULL, &r);
		if (rc)
			return rc;
		logs = json_object_get(r.json, "logs");
		json_array_foreach(logs, i, l)
			print_log(l);
		next = json_is_string(json_object_get(r.json, "next"))
			       ? json_string_value(json_object_get(r.json, "next"))
			       : NULL;
		if (!next && json_is_integer(json_object_get(r.json, "next")))
			snprintf(after, sizeof after, "%lld",
				 (long long)json_integer_value(json_object_get(r.json, "next")));
		else if (next)
			snprintf(after, sizeof after, "%s", next);
		bool more = json_array_size(logs) > 0 && !json_is_null(json_object_get(r.json, "next"));

		tr_ctl_reply_finish(&r);
		if (!more)
			break;
	}
	return TR_CTL_OK;
}

/* ---- checkpoints ---- */

int tr_cmd_checkpoints(struct tr_ctl *c, int argc, char **argv)
{
	static const char *heads[] = {"STEP", "EPOCH", "SIZE", "CREATED", "SHA256"};
	static const bool right[] = {true, true, true, false, false};
	bool as_json = false;
	struct tr_ctl_reply r;
	struct tr_table t;
	char path[96];
	int rc;
	int64_t id = tr_ctl_parse_id_args("checkpoints", argc, argv, "json", 'j', &as_json);

	if (id <= 0)
		return (int)-id;
	snprintf(path, sizeof path, "/jobs/%" PRId64 "/checkpoints", id);
	rc = tr_ctl_call(c, "GET", path, NULL, &r);
	if (rc)
		return rc;
	if (as_json) {
		tr_print_json(r.json, stdout);
		tr_ctl_reply_finish(&r);
		return TR_CTL_OK;
	}
	tr_table_init(&t, 5, heads, right);
	size_t i;
	json_t *ck;

	json_array_foreach(json_object_get(r.json, "checkpoints"), i, ck) {
		char step[24], epoch[24], size[32], when[32];

		snprintf(step, sizeof step, "%lld", (long long)json_integer_value(json_object_get(ck, "step")));
		snprintf(epoch, sizeof epoch, "%lld", (long long)json_integer_value(json_object_get(ck, "epoch")) + 1);
		tr_fmt_bytes(size, sizeof size, (double)json_integer_value(json_object_get(ck, "bytes")));
		tr_fmt_time(when, sizeof when, json_string_value(json_object_get(ck, "created_at")));
		tr_table_add(&t, step, epoch, size, when, json_string_value(json_object_get(ck, "sha256")));
	}
	tr_table_print(&t, stdout);
	tr_table_finish(&t);
	tr_ctl_reply_finish(&r);
	return TR_CTL_OK;
}

/* ---- devices, version ---- */

int tr_cmd_devices(struct tr_ctl *c, int argc, char **argv)
{
	static const char *heads[] = {"ID", "NAME", "KIND", "MEMORY", "FREE", "JOB"};
	static const bool right[] = {true, false, false, true, true, true};
	struct tr_ctl_reply r;
	struct tr_table t;
	size_t i;
	json_t *d;
	int rc;

	if (tr_ctl_wants_help(argc, argv))
		return tr_ctl_help("devices");
	if (argc >= 2 && strcmp(argv[1], "--json") != 0)
		return tr_ctl_usage("devices", "takes no arguments");
	rc = tr_ctl_call(c, "GET", "/devices", NULL, &r);
	if (rc)
		return rc;
	if (argc >= 2) {
		tr_print_json(r.json, stdout);
		tr_ctl_reply_finish(&r);
		return TR_CTL_OK;
	}
	tr_table_init(&t, 6, heads, right);
	json_array_foreach(json_object_get(r.json, "devices"), i, d) {
		char id[16], mem[32] = "-", fr[32] = "-", job[24] = "-";
		const json_t *m = json_object_get(d, "memory_total"), *f = json_object_get(d, "memory_free");

		snprintf(id, sizeof id, "%lld", (long long)json_integer_value(json_object_get(d, "id")));
		if (json_is_integer(m))
			tr_fmt_bytes(mem, sizeof mem, (double)json_integer_value(m));
		if (json_is_integer(f))
			tr_fmt_bytes(fr, sizeof fr, (double)json_integer_value(f));
		if (json_is_integer(json_object_get(d, "job")))
			snprintf(job, sizeof job, "%lld", (long long)json_integer_value(json_object_get(d, "job")));
		tr_table_add(&t, id, json_string_value(json_object_get(d, "name")),
			     json_string_value(json_object_get(d, "kind")), mem, fr, job);
	}
	tr_table_print(&t, stdout);
	tr_table_finish(&t);
	tr_ctl_reply_finish(&r);
	return TR_CTL_OK;
}

int tr_cmd_version(struct tr_ctl *c, int argc, char **argv)
{
	struct tr_ctl_reply r;
	int rc;

	if (tr_ctl_wants_help(argc, argv))
		return tr_ctl_help("version");
	if (argc >= 2)
		return tr_ctl_usage("version", "takes no arguments");
	printf("trainctl %s (libcurl %s)\n", TR_VERSION, curl_version_info(CURLVERSION_NOW)->version);
	rc = tr_ctl_call(c, "GET", "/version", NULL, &r);
	if (rc)
		return rc;
	printf("trainerd %s at %s (API %lld)\n", json_string_value(json_object_get(r.json, "version")) ?: "?", c->url,
	       (long long)json_integer_value(json_object_get(r.json, "api")));
	tr_ctl_reply_finish(&r);
	return TR_CTL_OK;
}
