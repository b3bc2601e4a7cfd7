/* Job commands: submit, ls, show, and the controls (stop, cancel, pause,
 * resume, delete, priority).
 *
 * submit sends an Idempotency-Key (random, or --idempotency-key) and
 * retries a request whose answer was lost, so a flaky network never makes
 * two jobs: the daemon answers a repeated key with the first job.
 */
#include "cli/trainctl.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SUBMIT_TRIES 3

char *tr_ctl_read_all(FILE *f, size_t *len)
{
	size_t cap = 65536, n = 0, got;
	char *buf = malloc(cap + 1), *nb;

	while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
		n += got;
		if (n == cap) {
			nb = realloc(buf, cap * 2 + 1);
			if (!nb) {
				free(buf);
				return NULL;
			}
			buf = nb;
			cap *= 2;
		}
	}
	if (buf)
		buf[n] = '\0';
	*len = n;
	return buf;
}

int tr_ctl_read_input(const char *arg, char **body, size_t *len)
{
	FILE *f = strcmp(arg, "-") == 0 ? stdin : fopen(arg, "rb");

	if (!f) {
		fprintf(stderr, "trainctl: %s: %s\n", arg, strerror(errno));
		return TR_CTL_LOCAL;
	}
	*body = tr_ctl_read_all(f, len);
	if (f != stdin)
		fclose(f);
	if (!*body) {
		fprintf(stderr, "trainctl: cannot read %s\n", arg);
		return TR_CTL_LOCAL;
	}
	return 0;
}

static int random_key(char *out, size_t len)
{
	unsigned char b[16];
	int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
	ssize_t n = fd >= 0 ? read(fd, b, sizeof b) : -1;

	if (fd >= 0)
		close(fd);
	if (n != (ssize_t)sizeof b || len < 33)
		return -1;
	for (size_t i = 0; i < sizeof b; i++)
		snprintf(out + 2 * i, 3, "%02x", b[i]);
	return 0;
}

int tr_cmd_submit(struct tr_ctl *c, int argc, char **argv)
{
	static const struct option opts[] = {{"wait", no_argument, NULL, 'w'},
					     {"priority", required_argument, NULL, 'p'},
					     {"preemptible", no_argument, NULL, 'P'},
					     {"idempotency-key", required_argument, NULL, 'k'},
					     {"help", no_argument, NULL, 'h'},
					     {NULL, 0, NULL, 0}};
	bool wait = false, preemptible = false;
	const char *prio = NULL, *key = NULL;
	char keybuf[40], path[96], header[300];
	struct tr_ctl_reply r = {0};
	char *body = NULL;
	size_t len;
	int ch, rc;

	while ((ch = getopt_long(argc, argv, "wp:k:h", opts, NULL)) != -1) {
		switch (ch) {
		case 'w':
			wait = true;
			break;
		case 'P':
			preemptible = true;
			break;
		case 'p':
			prio = optarg;
			break;
		case 'k':
			key = optarg;
			break;
		case 'h':
			return tr_ctl_help("submit");
		default:
			return tr_ctl_usage("submit", "unknown option");
		}
	}
	if (argc - optind != 1)
		return tr_ctl_usage("submit", "expects one job spec file (or - for standard input)");
	if (prio) {
		char *end;
		long v = strtol(prio, &end, 10);

		if (*end || !*prio || v < -1000000 || v > 1000000)
			return tr_ctl_usage("submit", "--priority: not an integer: %s", prio);
	}
	if ((rc = tr_ctl_read_input(argv[optind], &body, &len)) != 0)
		return rc;
	if (!key) {
		if (random_key(keybuf, sizeof keybuf) < 0) {
			fprintf(stderr, "trainctl: cannot read /dev/urandom for an idempotency key\n");
			free(body);
			return TR_CTL_LOCAL;
		}
		key = keybuf;
	}
	snprintf(header, sizeof header, "Idempotency-Key: %s", key);
	snprintf(path, sizeof path, "/jobs%s%s%s", prio ? "?priority=" : "", prio ? prio : "",
		 !preemptible ? ""
		 : prio       ? "&preemptible=true"
			      : "?preemptible=true");
	const char *hdrs[] = {header, NULL};

	/* The same key on every try: a job the first try made (its answer
	 * lost) comes back instead of a second one. */
	for (int t = 1;; t++) {
		rc = tr_ctl_request(c, "POST", path, body, hdrs, &r);
		if (rc == 0 || t == SUBMIT_TRIES)
			break;
		fprintf(stderr, "trainctl: retrying the submission (%d of %d) with the same idempotency key\n", t + 1,
			SUBMIT_TRIES);
		sleep(1);
	}
	free(body);
	if (rc)
		return rc;
	if (r.status != 200 && r.status != 201) {
		rc = tr_ctl_http_error(c, &r);
		tr_ctl_reply_finish(&r);
		return rc;
	}
	int64_t id = json_integer_value(json_object_get(r.json, "id"));

	tr_ctl_reply_finish(&r);
	printf("%" PRId64 "\n", id);
	fflush(stdout);
	if (!wait)
		return TR_CTL_OK;
	return tr_ctl_follow(c, id, false, 300);
}

/* ---- ls ---- */

/* A number with fmt, or "-" when it is not one (null: not known). */
static void number_cell(char *buf, size_t len, const json_t *v, const char *fmt)
{
	if (json_is_number(v))
		snprintf(buf, len, fmt, json_number_value(v));
	else
		snprintf(buf, len, "-");
}

static void progress_cells(const json_t *job, char *step, size_t slen, char *pct, size_t plen, char *loss, size_t llen)
{
	const json_t *p = json_object_get(job, "progress");
	json_int_t s = json_integer_value(json_object_get(p, "step"));
	json_int_t total = json_integer_value(json_object_get(p, "total_steps"));
	const json_t *l = json_object_get(p, "loss");

	snprintf(step, slen, "%lld/%lld", (long long)s, (long long)total);
	if (total > 0)
		snprintf(pct, plen, "%d%%", (int)(100.0 * (double)s / (double)total));
	else
		snprintf(pct, plen, "-");
	number_cell(loss, llen, l, "%.4f");
}

/* The state, and for a preempted job who preempted it ("preempted by 5",
 * or "preempted by slurm" for a Slurm job that Slurm requeued). */
static const char *state_cell(const json_t *job, char *buf)
{
	const char *st = json_string_value(json_object_get(job, "state"));
	const json_t *by = json_object_get(json_object_get(job, "preemption"), "by");

	if (!st || strcmp(st, "preempted") != 0)
		return st;
	if (json_is_integer(by))
		snprintf(buf, 48, "preempted by %lld", (long long)json_integer_value(by));
	else if (json_is_string(by))
		snprintf(buf, 48, "preempted by %.20s", json_string_value(by));
	else
		return st;
	return buf;
}

int tr_cmd_ls(struct tr_ctl *c, int argc, char **argv)
{
	static const struct option opts[] = {{"state", required_argument, NULL, 's'},
					     {"json", no_argument, NULL, 'j'},
					     {"help", no_argument, NULL, 'h'},
					     {NULL, 0, NULL, 0}};
	/* The summary's whole-run figures: the newest epoch's mean loss and
	 * samples/s over the run, not the last step's (one batch, maybe of
	 * 2 samples, listed 604 samples/s for a job running at 30,000). */
	static const char *heads[] = {"ID",   "NAME",       "STATE",     "PRIO",     "STEP",
				      "DONE", "EPOCH LOSS", "SAMPLES/S", "SUBMITTED"};
	static const bool right[] = {true, false, false, true, true, true, true, true, false};
	const char *state = NULL;
	bool as_json = false;
	json_t *all = json_array();
	char path[256], after[32] = "";
	int ch, rc = 0;

	while ((ch = getopt_long(argc, argv, "s:jh", opts, NULL)) != -1) {
		switch (ch) {
		case 's':
			state = optarg;
			break;
		case 'j':
			as_json = true;
			break;
		case 'h':
			json_decref(all);
			return tr_ctl_help("ls");
		default:
			json_decref(all);
			return tr_ctl_usage("ls", "unknown option");
		}
	}
	if (argc != optind) {
		json_decref(all);
		return tr_ctl_usage("ls", "takes no arguments");
	}
	if (state && strspn(state, "abcdefghijklmnopqrstuvwxyz") != strlen(state)) {
		json_decref(all);
		return tr_ctl_usage("ls", "--state: not a job state: %s", state);
	}
	/* Every page: the API's cursor until it says there is no more. */
	for (;;) {
		struct tr_ctl_reply r;
		const char *next;

		/* The table needs the summary, which lists leave out unless
		 * fields= names it; --json keeps every other key as before. */
		snprintf(path, sizeof path, "/jobs?limit=1000%s%s%s%s%s", state ? "&state=" : "", state ? state : "",
			 after[0] ? "&after=" : "", after,
			 as_json ? "" : "&fields=id,name,state,priority,progress,summary,submitted_at,preemption");
		rc = tr_ctl_call(c, "GET", path, NULL, &r);
		if (rc)
			break;
		json_array_extend(all, json_object_get(r.json, "jobs"));
		next = json_string_value(json_object_get(r.json, "next"));
		if (next)
			snprintf(after, sizeof after, "%s", next);
		tr_ctl_reply_finish(&r);
		if (!next)
			break;
	}
	if (rc) {
		json_decref(all);
		return rc;
	}
	if (as_json) {
		tr_print_json(all, stdout);
	} else {
		struct tr_table t;
		size_t i;
		json_t *job;

		tr_table_init(&t, 9, heads, right);
		json_array_foreach(all, i, job) {
			char id[24], prio[16], step[48], pct[16], loss[32], sps[32], when[32], state[48];
			const json_t *sum = json_object_get(job, "summary");

			snprintf(id, sizeof id, "%lld", (long long)json_integer_value(json_object_get(job, "id")));
			snprintf(prio, sizeof prio, "%lld",
				 (long long)json_integer_value(json_object_get(job, "priority")));
			progress_cells(job, step, sizeof step, pct, sizeof pct, loss, sizeof loss);
			number_cell(loss, sizeof loss, json_object_get(sum, "epoch_loss"), "%.4f");
			number_cell(sps, sizeof sps, json_object_get(sum, "samples_per_sec"), "%.0f");
			tr_fmt_time(when, sizeof when, json_string_value(json_object_get(job, "submitted_at")));
			tr_table_add(&t, id, json_string_value(json_object_get(job, "name")), state_cell(job, state),
				     prio, step, pct, loss, sps, when);
		}
		tr_table_print(&t, stdout);
		tr_table_finish(&t);
	}
	json_decref(all);
	return TR_CTL_OK;
}

/* ---- show ---- */

static void field(const char *name, const char *value)
{
	printf("%-12s %s\n", name, value && *value ? value : "-");
}

int tr_cmd_show(struct tr_ctl *c, int argc, char **argv)
{
	bool as_json = false;
	struct tr_ctl_reply r;
	char path[64], buf[256], a[48], b[48];
	int rc;
	int64_t id = tr_ctl_parse_id_args("show", argc, argv, "json", 'j', &as_json);

	if (id <= 0)
		return (int)-id;
	snprintf(path, sizeof path, "/jobs/%" PRId64, id);
	rc = tr_ctl_call(c, "GET", path, NULL, &r);
	if (rc)
		return rc;
	if (as_json) {
		tr_print_json(r.json, stdout);
		tr_ctl_reply_finish(&r);
		return TR_CTL_OK;
	}
	const json_t *j = r.json, *p = json_object_get(j, "progress"), *e = json_object_get(j, "error");
	char step[48], pct[16], loss[32];

	snprintf(buf, sizeof buf, "%" PRId64, id);
	field("id", buf);
	field("name", json_string_value(json_object_get(j, "name")));
	field("state", json_string_value(json_object_get(j, "state")));
	snprintf(buf, sizeof buf, "%lld%s", (long long)json_integer_value(json_object_get(j, "priority")),
		 json_is_true(json_object_get(j, "preemptible")) ? ", preemptible" : "");
	field("priority", buf);
	/* Its newest preemption: who, when, how (daemon/preemption.c). */
	field("preempted", json_string_value(json_object_get(json_object_get(j, "preemption"), "message")));
	progress_cells(j, step, sizeof step, pct, sizeof pct, loss, sizeof loss);
	snprintf(buf, sizeof buf, "%s (%s)", step, pct);
	field("step", buf);
	/* epochs: in the live progress, else in the spec (a max_steps job has none) */
	const json_t *epochs = json_object_get(p, "epochs");

	if (!json_is_integer(epochs))
		epochs = json_object_get(json_object_get(j, "spec"), "epochs");
	if (json_is_integer(epochs))
		snprintf(buf, sizeof buf, "%lld/%lld", (long long)json_integer_value(json_object_get(p, "epoch")) + 1,
			 (long long)json_integer_value(epochs));
	else
		snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(json_object_get(p, "epoch")) + 1);
	field("epoch", buf);
	field("loss", loss); /* the last step's */
	const json_t *sum = json_object_get(j, "summary");
	number_cell(buf, sizeof buf, json_object_get(sum, "epoch_loss"), "%.4f");
	field("epoch loss", buf); /* the newest epoch's mean */
	/* Over the whole run: the trainer's while it runs, else the store's. */
	const json_t *sps = json_object_get(p, "samples_per_sec");
	if (!json_is_number(sps))
		sps = json_object_get(sum, "samples_per_sec");
	if (json_is_number(sps)) {
		snprintf(buf, sizeof buf, "%.0f", json_number_value(sps));
		field("samples/s", buf);
	}
	if (json_is_number(json_object_get(p, "data_wait_fraction"))) {
		snprintf(buf, sizeof buf, "%.1f%%", 100 * json_number_value(json_object_get(p, "data_wait_fraction")));
		field("data wait", buf);
	}
	if (json_is_number(json_object_get(p, "eta_s"))) {
		tr_fmt_duration(a, sizeof a, json_number_value(json_object_get(p, "eta_s")));
		field("eta", a);
	}
	char *devs = json_dumps(json_object_get(j, "devices"), JSON_COMPACT);

	field("devices", devs);
	free(devs);
	tr_fmt_time(a, sizeof a, json_string_value(json_object_get(j, "submitted_at")));
	field("submitted", a);
	tr_fmt_time(a, sizeof a, json_string_value(json_object_get(j, "started_at")));
	tr_fmt_time(b, sizeof b, json_string_value(json_object_get(j, "finished_at")));
	field("started", a);
	field("finished", b);
	if (json_is_object(e)) {
		snprintf(buf, sizeof buf, "%s (%s)", json_string_value(json_object_get(e, "message")) ?: "",
			 json_string_value(json_object_get(e, "code")) ?: "?");
		field("error", buf);
	}
	const json_t *info = json_object_get(j, "info");
	const char *k;
	json_t *v;

	json_object_foreach((json_t *)info, k, v) {
		snprintf(buf, sizeof buf, "info.%s", k);
		field(buf, json_string_value(v));
	}
	tr_ctl_reply_finish(&r);
	return TR_CTL_OK;
}

/* ---- controls ---- */

int tr_cmd_control(struct tr_ctl *c, int argc, char **argv)
{
	const char *cmd = argv[0];
	struct tr_ctl_reply r;
	char path[96], body[64] = "";
	int rc;

	if (tr_ctl_wants_help(argc, argv))
		return tr_ctl_help(cmd);
	/* resume [--epochs N | --max-steps N] ID: the job's new end. */
	if (strcmp(cmd, "resume") == 0 && argc == 4 &&
	    (strcmp(argv[1], "--epochs") == 0 || strcmp(argv[1], "--max-steps") == 0)) {
		char *end;
		long long n = strtoll(argv[2], &end, 10);

		if (*end || !*argv[2] || n < 1)
			return tr_ctl_usage(cmd, "%s: not a positive integer: %s", argv[1], argv[2]);
		snprintf(body, sizeof body, "{\"%s\": %lld}", strcmp(argv[1], "--epochs") == 0 ? "epochs" : "max_steps",
			 n);
		argv += 2;
		argc -= 2;
	}
	if (argc != 2)
		return tr_ctl_usage(cmd, "expects one job id");
	int64_t id = tr_ctl_job_id(cmd, argv[1]);

	if (id < 0)
		return TR_CTL_USAGE;
	snprintf(path, sizeof path, "/jobs/%" PRId64 "/%s", id, cmd);
	rc = tr_ctl_call(c, "POST", path, body[0] ? body : "", &r);
	if (rc)
		return rc;
	printf("job %" PRId64 ": %s requested (state %s)\n", id, cmd,
	       json_string_value(json_object_get(r.json, "state")) ?: "?");
	tr_ctl_reply_finish(&r);
	return TR_CTL_OK;
}

int tr_cmd_delete(struct tr_ctl *c, int argc, char **argv)
{
	struct tr_ctl_reply r;
	char path[64];
	int rc;

	if (tr_ctl_wants_help(argc, argv))
		return tr_ctl_help("delete");
	if (argc != 2)
		return tr_ctl_usage("delete", "expects one job id");
	int64_t id = tr_ctl_job_id("delete", argv[1]);

	if (id < 0)
		return TR_CTL_USAGE;
	snprintf(path, sizeof path, "/jobs/%" PRId64, id);
	rc = tr_ctl_call(c, "DELETE", path, NULL, &r);
	if (rc)
		return rc;
	printf("job %" PRId64 " deleted\n", id);
	tr_ctl_reply_finish(&r);
	return TR_CTL_OK;
}

int tr_cmd_priority(struct tr_ctl *c, int argc, char **argv)
{
	struct tr_ctl_reply r;
	char path[64], body[64], *end;
	long prio;
	int rc;

	if (tr_ctl_wants_help(argc, argv))
		return tr_ctl_help("priority");
	if (argc != 3)
		return tr_ctl_usage("priority", "expects a job id and a priority");
	int64_t id = tr_ctl_job_id("priority", argv[1]);

	if (id < 0)
		return TR_CTL_USAGE;
	prio = strtol(argv[2], &end, 10);
	if (*end || !*argv[2])
		return tr_ctl_usage("priority", "not an integer priority: %s", argv[2]);
	snprintf(path, sizeof path, "/jobs/%" PRId64, id);
	snprintf(body, sizeof body, "{\"priority\": %ld}", prio);
	rc = tr_ctl_call(c, "PATCH", path, body, &r);
	if (rc)
		return rc;
	printf("job %" PRId64 ": priority %lld\n", id,
	       (long long)json_integer_value(json_object_get(r.json, "priority")));
	tr_ctl_reply_finish(&r);
	return TR_CTL_OK;
}
