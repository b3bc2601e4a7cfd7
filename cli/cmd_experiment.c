/* trainctl experiment: submit, list, show, cancel, pause and resume
 * experiments (docs/experiments.md).  `submit --wait` and `show --wait`
 * poll the experiment until it ends; the exit code is as for a job: 0
 * completed, 1 failed or cancelled.
 */
#include "cli/trainctl.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define POLL_MS 500
/* The most a --wait polls an unreachable daemon before giving up. */
#define UNREACHABLE_S 300

static int usage(const char *fmt, const char *arg)
{
	char msg[256];
	snprintf(msg, sizeof msg, fmt, arg ? arg : "");
	return tr_ctl_usage("experiment", "%s", msg);
}

static void print_metric(const json_t *m)
{
	if (json_is_number(m))
		printf("%-12.6g", json_number_value(m));
	else
		printf("%-12s", "-");
}

static void print_experiment(const json_t *e)
{
	const json_t *best = json_object_get(e, "best"), *search = json_object_get(e, "search");
	printf("id          %" JSON_INTEGER_FORMAT "\n", json_integer_value(json_object_get(e, "id")));
	printf("name        %s\n", json_string_value(json_object_get(e, "name")));
	printf("state       %s\n", json_string_value(json_object_get(e, "state")));
	printf("priority    %" JSON_INTEGER_FORMAT "%s\n", json_integer_value(json_object_get(e, "priority")),
	       json_is_true(json_object_get(e, "preemptible")) ? ", preemptible" : "");
	printf("search      %s, %s %s\n", json_string_value(json_object_get(search, "method")),
	       json_string_value(json_object_get(search, "goal")),
	       json_string_value(json_object_get(search, "metric")));
	printf("steps       %" JSON_INTEGER_FORMAT "\n", json_integer_value(json_object_get(e, "steps")));
	if (json_is_object(best)) {
		const json_t *ck = json_object_get(best, "checkpoint");
		printf("best        trial %" JSON_INTEGER_FORMAT " (job %" JSON_INTEGER_FORMAT "), %s %.6g\n",
		       json_integer_value(json_object_get(best, "trial")),
		       json_integer_value(json_object_get(best, "job")),
		       json_string_value(json_object_get(search, "metric")),
		       json_number_value(json_object_get(best, "metric")));
		if (json_is_object(ck))
			printf("checkpoint  trainctl download %" JSON_INTEGER_FORMAT " %" JSON_INTEGER_FORMAT "\n",
			       json_integer_value(json_object_get(ck, "job")),
			       json_integer_value(json_object_get(ck, "step")));
	}
	const json_t *error = json_object_get(e, "error");
	if (json_is_object(error))
		printf("error       %s\n", json_string_value(json_object_get(error, "message")));
	printf("\n%-6s %-6s %-10s %-5s %-12s %-8s %s\n", "TRIAL", "JOB", "STATE", "RUNG", "METRIC", "STEPS",
	       "PARAMETERS");
	size_t i;
	json_t *t;
	json_array_foreach(json_object_get(e, "trials"), i, t) {
		const json_t *job = json_object_get(t, "job"), *rung = json_object_get(t, "rung");
		char jb[24] = "-", rb[24] = "-";
		if (json_is_integer(job))
			snprintf(jb, sizeof jb, "%" JSON_INTEGER_FORMAT, json_integer_value(job));
		if (json_is_integer(rung))
			snprintf(rb, sizeof rb, "%" JSON_INTEGER_FORMAT, json_integer_value(rung));
		printf("%-6zu %-6s %-10s %-5s ", i, jb, json_string_value(json_object_get(t, "state")), rb);
		print_metric(json_object_get(t, "metric"));
		char *params = json_dumps(json_object_get(t, "parameters"),
					  JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(6));
		printf(" %-8" JSON_INTEGER_FORMAT " %s\n", json_integer_value(json_object_get(t, "steps")),
		       params ? params : "");
		free(params);
	}
}

static int exit_code_of(const json_t *e)
{
	const char *state = json_string_value(json_object_get(e, "state"));
	return state && strcmp(state, "completed") == 0 ? TR_CTL_OK : TR_CTL_JOB_FAILED;
}

/* Polls until the experiment ends; prints it then.  A daemon that does
 * not answer is asked again (it may be restarting) for up to
 * UNREACHABLE_S. */
static int wait_for(struct tr_ctl *c, int64_t id, bool json)
{
	char path[64];
	double unreachable_since = 0;
	snprintf(path, sizeof path, "/experiments/%" PRId64, id);
	for (;;) {
		struct tr_ctl_reply r = {0};
		int rc = tr_ctl_request(c, "GET", path, NULL, NULL, &r);
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		double now = (double)ts.tv_sec + ts.tv_nsec / 1e9;
		if (rc == TR_CTL_UNREACHABLE) {
			if (unreachable_since == 0)
				unreachable_since = now;
			if (now - unreachable_since > UNREACHABLE_S)
				return rc;
		} else if (rc) {
			return rc;
		} else if (r.status != 200) {
			rc = tr_ctl_http_error(c, &r);
			tr_ctl_reply_finish(&r);
			return rc;
		} else {
			unreachable_since = 0;
			if (json_is_true(json_object_get(r.json, "terminal"))) {
				if (json)
					printf("%s\n", r.body);
				else
					print_experiment(r.json);
				rc = exit_code_of(r.json);
				tr_ctl_reply_finish(&r);
				return rc;
			}
		}
		tr_ctl_reply_finish(&r);
		usleep(POLL_MS * 1000);
	}
}

static int submit(struct tr_ctl *c, int argc, char **argv)
{
	static const struct option opts[] = {{"wait", no_argument, NULL, 'w'},
					     {"priority", required_argument, NULL, 'p'},
					     {"preemptible", no_argument, NULL, 'P'},
					     {NULL, 0, NULL, 0}};
	bool wait = false, preemptible = false;
	const char *prio = NULL;
	int ch;
	while ((ch = getopt_long(argc, argv, "wp:P", opts, NULL)) != -1) {
		if (ch == 'w')
			wait = true;
		else if (ch == 'p')
			prio = optarg;
		else if (ch == 'P')
			preemptible = true;
		else
			return usage("submit: unknown option", NULL);
	}
	if (argc - optind != 1)
		return usage("submit: expects one experiment file (or - for standard input)", NULL);
	if (prio) {
		char *end;
		long v = strtol(prio, &end, 10);
		if (*end || !*prio || v < -1000 || v > 1000)
			return usage("--priority: not an integer in [-1000, 1000]: %s", prio);
	}
	size_t len;
	char *body = NULL;
	int rc = tr_ctl_read_input(argv[optind], &body, &len);
	if (rc)
		return rc;
	char path[96];
	struct tr_ctl_reply r = {0};
	snprintf(path, sizeof path, "/experiments%s%s%s", prio ? "?priority=" : "", prio ? prio : "",
		 !preemptible ? ""
		 : prio       ? "&preemptible=true"
			      : "?preemptible=true");
	rc = tr_ctl_call(c, "POST", path, body, &r);
	free(body);
	if (rc)
		return rc;
	int64_t id = json_integer_value(json_object_get(r.json, "id"));
	tr_ctl_reply_finish(&r);
	printf("%" PRId64 "\n", id);
	fflush(stdout);
	return wait ? wait_for(c, id, false) : TR_CTL_OK;
}

static int list(struct tr_ctl *c, int argc, char **argv)
{
	static const struct option opts[] = {{"state", required_argument, NULL, 's'},
					     {"json", no_argument, NULL, 'j'},
					     {NULL, 0, NULL, 0}};
	const char *state = NULL;
	bool json = false;
	int ch;
	while ((ch = getopt_long(argc, argv, "s:j", opts, NULL)) != -1) {
		if (ch == 's')
			state = optarg;
		else if (ch == 'j')
			json = true;
		else
			return usage("ls: unknown option", NULL);
	}
	if (optind != argc)
		return usage("ls: takes no arguments", NULL);
	char path[128];
	struct tr_ctl_reply r = {0};
	snprintf(path, sizeof path, "/experiments?limit=1000%s%.64s", state ? "&state=" : "", state ? state : "");
	int rc = tr_ctl_call(c, "GET", path, NULL, &r);
	if (rc)
		return rc;
	if (json) {
		printf("%s", r.body);
	} else {
		printf("%-6s %-10s %-7s %-7s %-12s %s\n", "ID", "STATE", "METHOD", "TRIALS", "BEST", "NAME");
		size_t i;
		json_t *e;
		json_array_foreach(json_object_get(r.json, "experiments"), i, e) {
			printf("%-6" JSON_INTEGER_FORMAT " %-10s %-7s %-7zu ",
			       json_integer_value(json_object_get(e, "id")),
			       json_string_value(json_object_get(e, "state")),
			       json_string_value(json_object_get(json_object_get(e, "search"), "method")),
			       json_array_size(json_object_get(e, "trials")));
			print_metric(json_object_get(json_object_get(e, "best"), "metric"));
			printf(" %s\n", json_string_value(json_object_get(e, "name")));
		}
	}
	tr_ctl_reply_finish(&r);
	return TR_CTL_OK;
}

static int show(struct tr_ctl *c, int argc, char **argv)
{
	static const struct option opts[] = {{"json", no_argument, NULL, 'j'},
					     {"wait", no_argument, NULL, 'w'},
					     {NULL, 0, NULL, 0}};
	bool json = false, wait = false;
	int ch;
	while ((ch = getopt_long(argc, argv, "jw", opts, NULL)) != -1) {
		if (ch == 'j')
			json = true;
		else if (ch == 'w')
			wait = true;
		else
			return usage("show: unknown option", NULL);
	}
	if (argc - optind != 1)
		return usage("show: expects one experiment id", NULL);
	int64_t id = tr_ctl_job_id("experiment", argv[optind]);
	if (id < 0)
		return TR_CTL_USAGE;
	if (wait)
		return wait_for(c, id, json);
	char path[64];
	struct tr_ctl_reply r = {0};
	snprintf(path, sizeof path, "/experiments/%" PRId64, id);
	int rc = tr_ctl_call(c, "GET", path, NULL, &r);
	if (rc)
		return rc;
	if (json)
		printf("%s", r.body);
	else
		print_experiment(r.json);
	tr_ctl_reply_finish(&r);
	return TR_CTL_OK;
}

static int control(struct tr_ctl *c, const char *what, int argc, char **argv)
{
	if (argc != 2)
		return usage("%s: expects one experiment id", what);
	int64_t id = tr_ctl_job_id("experiment", argv[1]);
	if (id < 0)
		return TR_CTL_USAGE;
	char path[96];
	struct tr_ctl_reply r = {0};
	snprintf(path, sizeof path, "/experiments/%" PRId64 "/%s", id, what);
	int rc = tr_ctl_call(c, "POST", path, NULL, &r);
	if (rc == 0)
		printf("experiment %" PRId64 ": %s\n", id, json_string_value(json_object_get(r.json, "state")));
	tr_ctl_reply_finish(&r);
	return rc;
}

int tr_cmd_experiment(struct tr_ctl *c, int argc, char **argv)
{
	if (argc < 2)
		return usage("expects a subcommand: submit, ls, show, cancel, pause or resume", NULL);
	if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)
		return tr_ctl_help("experiment");
	const char *sub = argv[1];
	/* The subcommand's options and arguments come after its name. */
	argc--;
	argv++;
	optind = 0;
	if (strcmp(sub, "submit") == 0)
		return submit(c, argc, argv);
	if (strcmp(sub, "ls") == 0)
		return list(c, argc, argv);
	if (strcmp(sub, "show") == 0)
		return show(c, argc, argv);
	if (strcmp(sub, "cancel") == 0 || strcmp(sub, "pause") == 0 || strcmp(sub, "resume") == 0)
		return control(c, sub, argc, argv);
	return usage("unknown subcommand %s (submit, ls, show, cancel, pause or resume)", sub);
}
