/* trainctl: the command-line client of trainerd.
 *
 * Global options come before the command (--url, --token-file, -v); each
 * command parses its own.  The daemon's address is --url, else
 * $TRAINERD_URL, else http://127.0.0.1:8080; the bearer token is
 * $TRAINERD_TOKEN, else the first line of --token-file (or
 * $TRAINERD_TOKEN_FILE).  The help texts here are the manual: every
 * command, option and exit code is described by `trainctl --help` and
 * `trainctl COMMAND --help`.
 */
#include "cli/trainctl.h"

#include <curl/curl.h>
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

struct command {
	const char *name;
	int (*run)(struct tr_ctl *c, int argc, char **argv);
	const char *usage;
	const char *summary;
	const char *help; /* details after the usage line */
};

static const struct command commands[] = {
	{"submit", tr_cmd_submit, "submit [--wait] [--priority N] [--preemptible] [--idempotency-key KEY] FILE|-",
	 "submit a job spec; prints the job's id",
	 "Sends the job spec (a JSON file, or standard input for -) to POST /jobs and\n"
	 "prints the new job's id.  An Idempotency-Key is sent (a random one unless\n"
	 "--idempotency-key gives it) and the request is retried up to 3 times when\n"
	 "the answer is lost, so a retry never makes a second job.\n"
	 "  --wait            follow the job like `watch` and exit with its outcome\n"
	 "  --priority N      queue priority (higher runs first; default 0)\n"
	 "  --preemptible     a job of higher priority may preempt it: it checkpoints,\n"
	 "                    waits as 'preempted' and resumes on its own\n"
	 "  --idempotency-key KEY  use KEY: the same KEY and spec always give the same job\n"},
	{"ls", tr_cmd_ls, "ls [--state STATE] [--json]", "list jobs",
	 "Lists jobs as a table: id, name, state, priority, step/total, done, latest\n"
	 "loss and submit time (local).\n"
	 "  --state STATE  only jobs in STATE: queued running stopping paused stopped\n"
	 "                 completed failed cancelled interrupted preempted\n"
	 "                 (a preempted job shows who preempted it: 'preempted by 5')\n"
	 "  --json         the jobs as a JSON array, as the API returns them\n"},
	{"show", tr_cmd_show, "show [--json] ID", "show one job",
	 "Shows a job's state, progress (step, epoch, loss, throughput, data wait,\n"
	 "ETA), devices, times, error and info fields.\n"
	 "  --json  the job object as the API returns it, spec included\n"},
	{"watch", tr_cmd_watch, "watch [--reconnect-timeout S] ID", "follow a job live until it ends",
	 "Follows the job's event stream.  On a terminal: a progress bar with step,\n"
	 "epoch, loss, samples/s, the share of time spent waiting for data and the\n"
	 "ETA, redrawn in place; piped: a plain progress line every 5 s.  State\n"
	 "changes, log lines and validation results are printed as they come.\n"
	 "A dropped connection or a daemon restart is bridged by reconnecting with\n"
	 "Last-Event-ID: no event is lost or repeated.\n"
	 "  --reconnect-timeout S  give up (exit 3) when the daemon stays away\n"
	 "                         longer than S seconds (default 300)\n"
	 "Exit: 0 when the job completes or is stopped, 1 when it fails or is\n"
	 "cancelled.\n"},
	{"stop", tr_cmd_control, "stop ID", "stop a job gracefully (final checkpoint, stopped)",
	 "Asks a running job to stop at the next step boundary; it takes a final\n"
	 "checkpoint and ends as stopped (completed if that was its last step).\n"
	 "`resume` continues it later, with more epochs or steps if asked.\n"},
	{"cancel", tr_cmd_control, "cancel ID", "cancel a job now", "Cancels a queued, running or paused job.\n"},
	{"pause", tr_cmd_control, "pause ID", "pause a running job (checkpoint, devices freed)",
	 "Pauses a running job at the next step boundary after a checkpoint; `resume`\n"
	 "queues it again.\n"},
	{"resume", tr_cmd_control, "resume [--epochs N | --max-steps N] ID", "queue a paused or stopped job again",
	 "Queues a paused or stopped job again; it continues from its newest\n"
	 "checkpoint.\n"
	 "  --epochs N      the job's new end: N epochs in all (not N more)\n"
	 "  --max-steps N   the job's new end: N steps in all\n"},
	{"delete", tr_cmd_delete, "delete ID", "delete a finished job and its data",
	 "Deletes a stopped, completed, failed or cancelled job with its metrics, logs and\n"
	 "checkpoints.\n"},
	{"priority", tr_cmd_priority, "priority ID N", "set a job's queue priority",
	 "Sets the queue priority of a job (higher runs first).\n"},
	{"metrics", tr_cmd_metrics,
	 "metrics [--names A,B] [--max-points N] [--from-step S] [--to-step S] [--format csv|json] ID",
	 "print a job's metric series",
	 "Prints the job's metric series: CSV (name,step,epoch,value, one point a\n"
	 "line; the default) or the API's JSON.\n"
	 "  --names A,B       only these series (loss, val_loss, lr, samples_per_sec, ...)\n"
	 "  --max-points N    downsample each series to about N points (min and max\n"
	 "                    of each bucket are kept, so spikes survive)\n"
	 "  --from-step S, --to-step S  a step range (inclusive)\n"
	 "  --format csv|json\n"},
	{"logs", tr_cmd_logs, "logs [-f] ID", "print a job's log",
	 "Prints the job's log lines with local times.\n"
	 "  -f, --follow  keep printing new lines until the job ends\n"},
	{"checkpoints", tr_cmd_checkpoints, "checkpoints [--json] ID", "list a job's checkpoints",
	 "Lists the job's checkpoints: step, epoch, size, time and SHA-256.\n"},
	{"download", tr_cmd_download, "download [-o FILE] [--weights] ID [STEP|latest|best]",
	 "download a checkpoint, verified and resumable",
	 "Downloads a checkpoint (default: latest) to FILE (default:\n"
	 "job-ID-step-STEP-checkpoint.safetensors) and checks it against the SHA-256\n"
	 "the daemon lists; a file that does not match is deleted (exit 5).  Bytes\n"
	 "go to FILE.part first: an interrupted download is resumed where it\n"
	 "stopped, automatically (3 tries) or by running the command again.\n"
	 "  -o, --output FILE  where to write\n"
	 "  --weights          the weights-only model.safetensors instead (no listed\n"
	 "                     hash to check; fetched whole)\n"},
	{"upload", tr_cmd_upload, "upload [--as FILE] PATH DATASET", "upload a data file to the daemon",
	 "Streams the local file PATH to the daemon as dataset DATASET, file FILE\n"
	 "(default: PATH's base name), and prints the name a job spec uses for it\n"
	 "(\"path\": \"dataset:DATASET/FILE\"), its size and SHA-256.  The SHA-256 the\n"
	 "daemon computed is checked against the local file's (exit 5 on a\n"
	 "mismatch).  A transfer that breaks leaves nothing on the daemon and is\n"
	 "started again (3 tries); an existing file of that name is replaced.  On\n"
	 "a terminal the progress is shown on stderr.\n"
	 "  --as FILE  the file's name in the dataset\n"},
	{"datasets", tr_cmd_datasets, "datasets [--json]", "list the uploaded datasets",
	 "Lists the uploaded files: the path a job spec uses, size, upload time and\n"
	 "SHA-256, then the space used against the daemon's quota.\n"
	 "  --json  the API's answer\n"},
	{"rm-dataset", tr_cmd_dataset_rm, "rm-dataset DATASET[/FILE]", "delete an uploaded dataset or one file",
	 "Deletes one file of a dataset, or the whole dataset (an admin token).  A\n"
	 "file that a job which has not ended uses is refused (exit 4).\n"},
	{"devices", tr_cmd_devices, "devices [--json]", "list the daemon's devices",
	 "Lists devices: id, name, kind, memory, free memory and the job holding it.\n"},
	{"experiment", tr_cmd_experiment,
	 "experiment submit [--wait] [--priority N] [--preemptible] FILE|- |\n"
	 "                  ls [--state STATE] [--json] |\n"
	 "                  show [--json] [--wait] ID | cancel ID | pause ID | resume ID",
	 "submit, list, show or control hyperparameter sweeps",
	 "Experiments (docs/experiments.md): `submit` prints the new experiment's\n"
	 "id; with --wait (and `show --wait`) it waits for the experiment to end and\n"
	 "prints its trials, best trial and checkpoint; exit code 0 when it\n"
	 "completed, 1 when it failed or was cancelled.  --priority and --preemptible\n"
	 "are those of `submit`, for every trial: a preemptible trial that a job of\n"
	 "higher priority preempts resumes from its checkpoint, bit-identically.\n"},
	{"manifest", tr_cmd_manifest,
	 "manifest --kubernetes [--name NAME] [--namespace NS] [--image IMAGE] [--gpus-per-pod N]\n"
	 "                  [--data-volume PVC] [--ssh-secret SECRET] [--format yaml|json] FILE|-",
	 "print a job spec as Kubernetes objects (offline)",
	 "Prints the job spec FILE (or standard input for -) as Kubernetes objects for\n"
	 "`kubectl apply -f`: a ConfigMap (the spec and the pods' script), a headless\n"
	 "Service and an Indexed Job of one pod per process (the spec's \"processes\",\n"
	 "required).  Pod 0 runs `trainerd run`; with several processes its mpirun\n"
	 "reaches the other pods over ssh.  The spec is checked as the daemon checks\n"
	 "it; no daemon or cluster is asked.  Details: docs/clusters.md.\n"
	 "  --kubernetes        the kind of manifest (the only one so far; required)\n"
	 "  --name NAME         the objects' name and the pods' DNS subdomain (default:\n"
	 "                      the spec's name, lowercased, other characters as '-')\n"
	 "  --namespace NS      default: default\n"
	 "  --image IMAGE       an image with trainerd, Open MPI and OpenSSH (default:\n"
	 "                      trainerd:VERSION)\n"
	 "  --gpus-per-pod N    nvidia.com/gpu per pod (default 0: CPU devices)\n"
	 "  --data-volume PVC   the PersistentVolumeClaim the pods work in, mounted at\n"
	 "                      /data: the spec's relative paths and the outputs\n"
	 "                      (/data/trainerd/NAME); ReadWriteMany for several pods\n"
	 "                      (default: trainerd-data)\n"
	 "  --ssh-secret SECRET several processes: the Secret with id_ed25519 and\n"
	 "                      authorized_keys for mpirun's ssh (default: trainerd-ssh)\n"
	 "  --format yaml|json  YAML documents (default), or one JSON List\n"
	 "Exit: 2 for a bad option or spec (the option or the spec's JSON pointer is\n"
	 "named), 5 when FILE cannot be read.\n"},
	{"version", tr_cmd_version, "version", "print trainctl's and the daemon's version",
	 "Prints the client's version, then asks the daemon for its own.\n"},
};
#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

static const char exit_codes[] = "Exit codes:\n"
				 "  0  success (watch, submit --wait: the job completed)\n"
				 "  1  the job failed or was cancelled (watch, submit --wait)\n"
				 "  2  usage error\n"
				 "  3  the daemon cannot be reached\n"
				 "  4  the daemon answered with an error (its message is printed)\n"
				 "  5  a local failure: a file cannot be read or written, or a\n"
				 "     download does not match its SHA-256\n";

static const struct command *find(const char *name)
{
	for (size_t i = 0; i < NCOMMANDS; i++)
		if (strcmp(commands[i].name, name) == 0)
			return &commands[i];
	return NULL;
}

static void usage_all(FILE *out)
{
	fprintf(out, "usage: trainctl [--url URL] [--token-file FILE] [-v] COMMAND [ARGS]\n\n"
		     "The command-line client of trainerd, the training daemon.\n\nCommands:\n");
	for (size_t i = 0; i < NCOMMANDS; i++)
		fprintf(out, "  %-12s %s\n", commands[i].name, commands[i].summary);
	fprintf(out,
		"\nOptions:\n"
		"  --url URL          the daemon (default $TRAINERD_URL, else http://127.0.0.1:8080)\n"
		"  --token-file FILE  read the bearer token from FILE's first line (default\n"
		"                     $TRAINERD_TOKEN_FILE); $TRAINERD_TOKEN wins over both\n"
		"  -v, --verbose      print each request and its status on stderr\n"
		"  -h, --help         this help; `trainctl COMMAND --help` for a command\n"
		"  --version          the client's version\n\n%s",
		exit_codes);
}

int tr_ctl_help(const char *cmd)
{
	const struct command *c = find(cmd);

	if (!c)
		return TR_CTL_USAGE;
	printf("usage: trainctl [global options] %s\n\n%s\n%s", c->usage, c->help, exit_codes);
	return TR_CTL_OK;
}

int tr_ctl_usage(const char *cmd, const char *fmt, ...)
{
	const struct command *c = find(cmd);
	va_list ap;

	fprintf(stderr, "trainctl %s: ", cmd);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nusage: trainctl %s\n", c ? c->usage : cmd);
	return TR_CTL_USAGE;
}

int64_t tr_ctl_job_id(const char *cmd, const char *arg)
{
	char *end;
	long long v;

	errno = 0;
	v = strtoll(arg, &end, 10);
	if (*end || !*arg || v <= 0 || errno) {
		tr_ctl_usage(cmd, "not a job id: %s", arg);
		return -1;
	}
	return v;
}

bool tr_ctl_wants_help(int argc, char **argv)
{
	return argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0);
}

int64_t tr_ctl_parse_id_args(const char *cmd, int argc, char **argv, const char *flag, int letter, bool *set)
{
	const struct option opts[] = {{flag, no_argument, NULL, letter},
				      {"help", no_argument, NULL, 'h'},
				      {NULL, 0, NULL, 0}};
	const char shorts[] = {(char)letter, 'h', '\0'};
	int ch;

	while ((ch = getopt_long(argc, argv, shorts, opts, NULL)) != -1) {
		if (ch == letter)
			*set = true;
		else if (ch == 'h')
			return -tr_ctl_help(cmd);
		else
			return -tr_ctl_usage(cmd, "unknown option");
	}
	if (argc - optind != 1)
		return -tr_ctl_usage(cmd, "expects one job id");
	int64_t id = tr_ctl_job_id(cmd, argv[optind]);

	return id < 0 ? -TR_CTL_USAGE : id;
}

/* The token: $TRAINERD_TOKEN, else the file's first line, trimmed. */
static int load_token(struct tr_ctl *c, const char *file)
{
	const char *env = getenv("TRAINERD_TOKEN");
	char line[1024];
	FILE *f;

	if (env && *env) {
		c->token = strdup(env);
		return c->token ? 0 : TR_CTL_LOCAL;
	}
	if (!file)
		file = getenv("TRAINERD_TOKEN_FILE");
	if (!file || !*file)
		return 0;
	f = fopen(file, "r");
	if (!f) {
		fprintf(stderr, "trainctl: token file %s: %s\n", file, strerror(errno));
		return TR_CTL_LOCAL;
	}
	if (!fgets(line, sizeof line, f))
		line[0] = '\0';
	fclose(f);
	line[strcspn(line, "\r\n")] = '\0';
	char *t = line + strspn(line, " \t");
	size_t n = strlen(t);

	while (n && (t[n - 1] == ' ' || t[n - 1] == '\t'))
		t[--n] = '\0';
	if (!*t) {
		fprintf(stderr, "trainctl: token file %s: the first line is empty\n", file);
		return TR_CTL_LOCAL;
	}
	c->token = strdup(t);
	return c->token ? 0 : TR_CTL_LOCAL;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {{"url", required_argument, NULL, 'u'},
					     {"token-file", required_argument, NULL, 't'},
					     {"verbose", no_argument, NULL, 'v'},
					     {"help", no_argument, NULL, 'h'},
					     {"version", no_argument, NULL, 'V'},
					     {NULL, 0, NULL, 0}};
	struct tr_ctl c = {0};
	const char *url = getenv("TRAINERD_URL"), *token_file = NULL;
	const struct command *cmd;
	int ch, rc;

	while ((ch = getopt_long(argc, argv, "+vh", opts, NULL)) != -1) {
		switch (ch) {
		case 'u':
			url = optarg;
			break;
		case 't':
			token_file = optarg;
			break;
		case 'v':
			c.verbose = true;
			break;
		case 'h':
			usage_all(stdout);
			return TR_CTL_OK;
		case 'V':
			printf("trainctl %s\n", TR_VERSION);
			return TR_CTL_OK;
		default:
			usage_all(stderr);
			return TR_CTL_USAGE;
		}
	}
	if (optind >= argc) {
		usage_all(stderr);
		return TR_CTL_USAGE;
	}
	cmd = find(argv[optind]);
	if (!cmd) {
		fprintf(stderr, "trainctl: unknown command %s (see trainctl --help)\n", argv[optind]);
		return TR_CTL_USAGE;
	}
	if (!url || !*url)
		url = "http://127.0.0.1:8080";
	if (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0) {
		fprintf(stderr, "trainctl: --url: %s is not an http:// or https:// URL\n", url);
		return TR_CTL_USAGE;
	}
	snprintf(c.url, sizeof c.url, "%s", url);
	while (strlen(c.url) > 8 && c.url[strlen(c.url) - 1] == '/')
		c.url[strlen(c.url) - 1] = '\0';
	rc = load_token(&c, token_file);
	if (rc)
		return rc;
	curl_global_init(CURL_GLOBAL_DEFAULT);
	/* Each command parses argv from its own name on; optind = 0 makes
	 * glibc's getopt start over. */
	int first = optind;

	optind = 0;
	rc = cmd->run(&c, argc - first, argv + first);
	curl_global_cleanup();
	free(c.token);
	return rc;
}
