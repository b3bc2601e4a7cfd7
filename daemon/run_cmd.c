/* `trainerd run JOB.json`: one job in the foreground, no daemon.
 *
 * Writes DIR/model.safetensors, DIR/metrics.jsonl, DIR/summary.json and
 * DIR/plan.json (the run's total_steps, for a daemon following the files)
 * (docs/design.md).  Ctrl-C (or TERM, or USR1: Slurm's warning before a
 * time limit) asks the trainer to stop after the current step, so the
 * outputs are still written; a second Ctrl-C kills the process.
 * `--set /POINTER=VALUE` edits the spec before it is parsed, so an
 * experiment does not need a copy of the file.  Every data file is opened
 * once before anything else, so a missing one is a spec error (exit 2)
 * naming its JSON pointer, like any other.
 * Exit status: 0 completed (or stopped by Ctrl-C), 1 the job failed,
 * 2 bad command line or spec.
 */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/json_text.h"
#include "daemon/backend_open.h"
#include "daemon/cli.h"
#include "engine/backend.h"
#include "engine/comm.h"
#include "engine/data/roots.h"
#include "daemon/run_report.h"
#include "daemon/worker_job.h"
#include "engine/spec.h"
#include "engine/trainer.h"

struct run_ctx {
	FILE *metrics;
	struct tr_progress_display progress;
	int quiet;
	int metrics_failed;
	tr_trainer_t *trainer; /* for the checkpoint hook */
	const char *out_dir;
	enum tr_optim_type optim;
	char conv_routes[TR_ROUTES_TEXT];  /* the trainer's info field: each conv2d layer's CPU route */
	char dense_routes[TR_ROUTES_TEXT]; /* and each dense layer's */
	tr_run_report_t *report;           /* rank 0 with --report-url: reports to the daemon */
	bool rank0;
	int64_t plan_written; /* the total_steps in DIR/plan.json (0: none yet) */
};

static tr_trainer_t *volatile running_trainer;

static void on_sigint(int sig)
{
	(void)sig;
	tr_trainer_t *t = running_trainer;
	if (t)
		tr_trainer_stop(t); /* only sets an atomic flag */
	signal(SIGINT, SIG_DFL);
	signal(SIGTERM, SIG_DFL);
	signal(SIGUSR1, SIG_IGN); /* one checkpoint; a second USR1 must not kill it */
}

/* A failed process ends the group (the others would wait for it in their
 * next collective); a finished one leaves it. */
static void end_processes(tr_pcomm_t *pcomm, int exit_code)
{
	if (exit_code != 0 && pcomm->i->size(pcomm) > 1) {
		fflush(NULL);
		pcomm->i->abort(pcomm, exit_code);
	}
	pcomm->i->finish(pcomm);
}

static void on_info(void *ctx, const char *key, const char *value)
{
	struct run_ctx *rc = ctx;
	if (!strcmp(key, "conv_routes"))
		snprintf(rc->conv_routes, sizeof rc->conv_routes, "%s", value);
	else if (!strcmp(key, "dense_routes"))
		snprintf(rc->dense_routes, sizeof rc->dense_routes, "%s", value);
}

static void on_metric(void *ctx, const struct tr_metric_point *p)
{
	struct run_ctx *rc = ctx;
	tr_progress_metric(&rc->progress, p->name, p->epoch, p->value);
	tr_run_report_metric(rc->report, p);
	if (!rc->metrics)
		return;
	/* %.9g keeps floats exact enough to compare runs. */
	if (fprintf(rc->metrics, "{\"step\":%lld,\"epoch\":%lld,\"name\":\"%s\",\"value\":%.9g}\n", (long long)p->step,
		    (long long)p->epoch, p->name, isfinite(p->value) ? p->value : 0.0) < 0)
		rc->metrics_failed = 1;
}

static void on_progress(void *ctx, const struct tr_progress *p)
{
	struct run_ctx *rc = ctx;
	tr_run_watchdog_beat(); /* a step finished */
	tr_run_report_progress(rc->report, p);
	/* The steps the run makes in all, which metrics.jsonl does not say:
	 * for a daemon that follows this run through its files (a worker
	 * job's total_steps, daemon/worker_job.c).  Written when it changes,
	 * so once a run. */
	if (rc->rank0 && p->total_steps > 0 && p->total_steps != rc->plan_written) {
		char path[PATH_MAX + 16], text[64];
		snprintf(path, sizeof path, "%s/plan.json", rc->out_dir);
		snprintf(text, sizeof text, "{\"total_steps\": %lld}\n", (long long)p->total_steps);
		if (tr_wjob_write_text(path, text) == 0)
			rc->plan_written = p->total_steps;
	}
	if (!rc->quiet)
		tr_progress_update(&rc->progress, p);
}

static void on_log(void *ctx, enum tr_log_level lvl, const char *msg)
{
	struct run_ctx *rc = ctx;
	if (rc->quiet && lvl > TR_LOG_WARNING)
		return;
	tr_progress_finish(&rc->progress);
	rc->progress.printed_bar = 0;
	fprintf(stderr, "trainerd: %s\n", msg);
}

/* Keeps DIR/checkpoint.safetensors current: at checkpoint.every_steps and
 * at the end (completed or stopped), for --resume; a periodic one is also
 * uploaded to the daemon when the run reports to one. */
static int on_checkpoint(void *ctx, struct tr_snapshot *snap, bool final)
{
	struct run_ctx *rc = ctx;
	struct tr_error err;
	if (tr_run_ckpt_write(rc->out_dir, tr_trainer_model(rc->trainer), rc->optim, snap, &err) < 0)
		on_log(ctx, TR_LOG_WARNING, err.message);
	else if (!final)
		tr_run_report_checkpoint(rc->report, rc->out_dir); /* the final one goes at the end */
	tr_snapshot_free(snap);
	return 0;
}

static int mkdir_p(const char *path)
{
	char buf[PATH_MAX];
	snprintf(buf, sizeof buf, "%s", path);
	for (char *p = buf + 1; *p; p++) {
		if (*p == '/') {
			*p = 0;
			if (mkdir(buf, 0755) < 0 && errno != EEXIST)
				return -errno;
			*p = '/';
		}
	}
	if (mkdir(buf, 0755) < 0 && errno != EEXIST)
		return -errno;
	return 0;
}

/* PATH = $XDG_CACHE_HOME/trainerd/NAME, else $HOME/.cache/trainerd/NAME,
 * its folders made; -1 when neither variable is set or the folder cannot
 * be made (the cache is then only the run's own). */
static int user_cache_file(char *path, size_t n, const char *name)
{
	const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
	int len;
	if (xdg && xdg[0] == '/')
		len = snprintf(path, n, "%s/trainerd", xdg);
	else if (home && home[0] == '/')
		len = snprintf(path, n, "%s/.cache/trainerd", home);
	else
		return -1;
	if (len < 0 || (size_t)len >= n || mkdir_p(path) < 0)
		return -1;
	size_t room = n - (size_t)len;
	int more = snprintf(path + len, room, "/%s", name);
	return more < 0 || (size_t)more >= room ? -1 : 0;
}

/* A route info field ("onednn,im2col") as the summary's list, as the
 * bench reads it; nothing when the job had no such layers. */
static void set_routes(json_t *j, const char *key, const char *routes)
{
	if (!routes[0])
		return;
	json_t *a = json_array();
	char buf[TR_ROUTES_TEXT], *save = NULL;
	snprintf(buf, sizeof buf, "%s", routes);
	for (char *r = strtok_r(buf, ",", &save); r; r = strtok_r(NULL, ",", &save))
		json_array_append_new(a, json_string(r));
	json_object_set_new(j, key, a);
}

static int write_summary(const char *path, const struct tr_summary *s, int ndev, int nproc, int workers,
			 const char *state, const char *conv_routes, const char *dense_routes, const char *error)
{
	json_t *j = json_pack("{s:I, s:I, s:I, s:f, s:f, s:f, s:f, s:i, s:i, s:s}", "steps", (json_int_t)s->steps,
			      "epochs", (json_int_t)s->epochs, "samples", (json_int_t)s->samples, "final_loss",
			      s->final_loss, "wall_s", s->wall_s, "samples_per_sec", s->samples_per_sec,
			      "data_wait_fraction", s->data_wait_fraction, "devices", ndev, "workers", workers, "state",
			      state);
	if (!j)
		return -ENOMEM;
	json_object_set_new(j, "processes", json_integer(nproc)); /* of ndev devices each */
	if (nproc > 1) { /* the gathers between processes: all, and waited for */
		json_object_set_new(j, "comm_ms", json_real(s->comm_ms));
		json_object_set_new(j, "comm_wait_ms", json_real(s->comm_wait_ms));
	}
	json_object_set_new(j, "val_loss", isfinite(s->val_loss) ? json_real(s->val_loss) : json_null());
	json_object_set_new(j, "val_accuracy", isfinite(s->val_accuracy) ? json_real(s->val_accuracy) : json_null());
	/* data.test's figures, only those the run has (docs/model-format.md). */
	const struct {
		const char *name;
		double v;
	} test[] = {{"test_loss", s->test_loss},
		    {"test_accuracy", s->test_accuracy},
		    {"test_mse", s->test_mse},
		    {"test_mae", s->test_mae},
		    {"test_r2", s->test_r2}};
	for (size_t i = 0; i < sizeof test / sizeof test[0]; i++)
		if (isfinite(test[i].v))
			json_object_set_new(j, test[i].name, json_real(test[i].v));
	set_routes(j, "conv_routes", conv_routes);
	set_routes(j, "dense_routes", dense_routes);
	json_object_set_new(j, "error", error ? json_string(error) : json_null());
	int rc = json_dump_file(j, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	json_decref(j);
	return rc == 0 ? 0 : -EIO;
}

static void usage(FILE *out)
{
	fprintf(out, "usage: trainerd run JOB.json [--set /POINTER=VALUE]... [--devices N] [--backend cpu|cuda]\n"
		     "                    [--processes P] [--workers W] [--cpu-conv auto|im2col|onednn]\n"
		     "                    [--out DIR] [--quiet] [--report-url URL --report-token-file FILE]\n"
		     "       trainerd run --resume DIR [--set /POINTER=VALUE]... [options]\n");
}

static void help(void)
{
	usage(stdout);
	fputs("\n"
	      "Trains the job JOB.json in the foreground, without a daemon, and writes\n"
	      "DIR/model.safetensors, DIR/metrics.jsonl and DIR/summary.json.\n"
	      "\n"
	      "  --set /POINTER=VALUE  set the spec field at a JSON pointer before the spec is\n"
	      "                        read (repeatable; VALUE is parsed as JSON, else taken\n"
	      "                        as a string): --set /epochs=20 --set /optimizer/lr=3e-4\n"
	      "  --devices N           CPU devices (default: the spec's, else one per core)\n"
	      "  --processes P         run as P processes of N devices each through mpirun\n"
	      "                        (needs \"exact\": true; the same bits as one process);\n"
	      "                        under srun or mpirun the launcher gives the count\n"
	      "  --backend cpu|cuda    override the spec's backend\n"
	      "  --workers W           data loader threads (default: the spec's, 2)\n"
	      "  --cpu-conv ROUTE      how CPU devices compute conv2d: im2col (OpenBLAS sgemm),\n"
	      "                        onednn (oneDNN's primitives) or auto (default: per\n"
	      "                        layer, whichever measured faster; remembered in\n"
	      "                        DIR/conv_routes.json and ~/.cache/trainerd/); the\n"
	      "                        spec's cpu_conv wins\n"
	      "  --out DIR             output directory (default: out/NAME)\n"
	      "  --resume DIR          continue the run whose outputs are in DIR from its\n"
	      "                        checkpoint (DIR/checkpoint.safetensors, written on\n"
	      "                        Ctrl-C, at the end and every checkpoint.every_steps),\n"
	      "                        with the spec it saved (DIR/spec.json) unless JOB.json\n"
	      "                        is given; use the same --devices for identical results\n"
	      "                        (any --devices and --processes in exact mode)\n"
	      "  -q, --quiet           no progress display, warnings and errors only\n"
	      "  --report-url URL      also report progress, metrics and the summary to a\n"
	      "                        daemon's POST /jobs/{id}/report (URL), from a background\n"
	      "                        thread (a Slurm job's worker; rank 0); HTTPS checks the\n"
	      "                        system's CAs or CURL_CA_BUNDLE's file\n"
	      "  --report-token-file FILE  the job's report token (a file only its owner reads)\n"
	      "  -h, --help            this text\n"
	      "\n"
	      "Relative data paths resolve against the working directory.  Ctrl-C stops\n"
	      "after the current step and still writes the outputs; a second Ctrl-C kills.\n"
	      "Exit status: 0 completed or stopped, 1 the job failed, 2 bad command line or spec.\n",
	      stdout);
}

/* Applies one --set: "POINTER=VALUE" into doc.  Missing objects on the
 * way are created; an array element must exist.  Returns 0, or -1 with
 * the message printed. */
static int apply_set(json_t *doc, const char *arg)
{
	const char *eq = strchr(arg, '=');
	if (!eq || arg[0] != '/' || eq == arg + 1) {
		fprintf(stderr, "trainerd run: --set '%s': expected /POINTER=VALUE, e.g. --set /epochs=20\n", arg);
		return -1;
	}
	char *ptr = strndup(arg, (size_t)(eq - arg));
	if (!ptr)
		return -1;
	json_error_t jerr;
	json_t *value = json_loads(eq + 1, JSON_DECODE_ANY, &jerr);
	if (!value)
		value = json_string(eq + 1);
	json_t *node = doc;
	int ret = -1;
	char *save = NULL, *tok = strtok_r(ptr + 1, "/", &save);
	char *end = ptr + 1;
	while (tok) {
		/* Undo the pointer escapes: ~1 is '/', ~0 is '~' (RFC 6901). */
		char key[256];
		size_t k = 0;
		for (const char *c = tok; *c && k + 1 < sizeof key; c++) {
			if (c[0] == '~' && (c[1] == '0' || c[1] == '1')) {
				key[k++] = c[1] == '0' ? '~' : '/';
				c++;
			} else {
				key[k++] = *c;
			}
		}
		key[k] = 0;
		end = tok + strlen(tok);
		char *next = strtok_r(NULL, "/", &save);
		if (json_is_object(node)) {
			if (!next) {
				ret = json_object_set(node, key, value) == 0 ? 0 : -1;
				break;
			}
			json_t *child = json_object_get(node, key);
			if (!child) {
				child = json_object();
				json_object_set_new(node, key, child);
			}
			node = child;
		} else if (json_is_array(node)) {
			char *e;
			long i = strtol(key, &e, 10);
			if (*e || !key[0] || i < 0 || (size_t)i >= json_array_size(node)) {
				fprintf(stderr, "trainerd run: --set %s: %.*s: no such element (the array has %zu)\n",
					arg, (int)(end - ptr), arg, json_array_size(node));
				goto out;
			}
			if (!next) {
				ret = json_array_set(node, (size_t)i, value) == 0 ? 0 : -1;
				break;
			}
			node = json_array_get(node, (size_t)i);
		} else {
			/* Name the part of the pointer that leads to the scalar. */
			int at = (int)(tok - 1 - ptr);
			fprintf(stderr, "trainerd run: --set %s: %.*s is %s, not an object or array\n", arg,
				at ? at : 1, arg,
				json_is_string(node)    ? "a string"
				: json_is_null(node)    ? "null"
				: json_is_boolean(node) ? "a boolean"
							: "a number");
			goto out;
		}
		tok = next;
	}
	if (ret < 0 && !tok)
		fprintf(stderr, "trainerd run: --set %s: cannot set it\n", arg);
out:
	json_decref(value);
	free(ptr);
	return ret;
}

/* Opens each data file the spec names, as the trainer will: a missing one
 * is a spec error naming its pointer (and, for a relative path, the
 * directory it was looked for in) before any device is set up. */
static int check_data_paths(struct tr_spec *spec, const char *job)
{
	struct tr_spec_path paths[TR_SPEC_MAX_PATHS];
	int n = tr_spec_paths(spec, paths);
	for (int i = 0; i < n; i++) {
		struct tr_error why;
		const char *path = *paths[i].field;
		int fd = paths[i].dir ? tr_data_open_dir(NULL, path, NULL, 0, &why)
				      : tr_data_open(NULL, path, NULL, NULL, 0, &why);
		if (fd < 0) {
			fprintf(stderr, "trainerd run: %s: %s: %s\n", job, paths[i].pointer, why.message);
			return -1;
		}
		close(fd);
	}
	if (spec->init_from) {
		struct tr_error why;
		int fd = tr_data_open(NULL, spec->init_from, NULL, NULL, 0, &why);
		if (fd < 0) {
			fprintf(stderr, "trainerd run: %s: /init/from: %s\n", job, why.message);
			return -1;
		}
		close(fd);
	}
	return 0;
}

static int parse_int_arg(const char *flag, const char *v, int lo, int hi, int *out)
{
	char *end;
	long n = v ? strtol(v, &end, 10) : 0;
	if (!v || *end || n < lo || n > hi) {
		fprintf(stderr, "trainerd run: %s needs an integer in [%d, %d], got '%s'\n", flag, lo, hi, v ? v : "");
		return -1;
	}
	*out = (int)n;
	return 0;
}

int tr_cmd_run(int argc, char **argv)
{
	const char *job = NULL, *out_dir = NULL, *backend_name = NULL, *resume = NULL;
	const char *report_url = NULL, *report_token_file = NULL;
	enum tr_cpu_conv cpu_conv = TR_CPU_CONV_AUTO;
	const char *sets[64];
	int devices = 0, workers = 0, quiet = 0, nsets = 0, processes = 0;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
			help();
			return 0;
		} else if (strcmp(a, "--set") == 0 && v) {
			if (nsets == (int)(sizeof sets / sizeof sets[0])) {
				fprintf(stderr, "trainerd run: more than %d --set options\n", nsets);
				return 2;
			}
			sets[nsets++] = v;
			i++;
		} else if (strncmp(a, "--set=", 6) == 0) {
			if (nsets == (int)(sizeof sets / sizeof sets[0])) {
				fprintf(stderr, "trainerd run: more than %d --set options\n", nsets);
				return 2;
			}
			sets[nsets++] = a + 6;
		} else if (strcmp(a, "--devices") == 0) {
			if (parse_int_arg(a, v, 1, 64, &devices) < 0)
				return 2;
			i++;
		} else if (strcmp(a, "--processes") == 0) {
			if (parse_int_arg(a, v, 1, TR_MAX_PROCESSES, &processes) < 0)
				return 2;
			i++;
		} else if (strcmp(a, "--workers") == 0) {
			if (parse_int_arg(a, v, 1, 64, &workers) < 0)
				return 2;
			i++;
		} else if (strcmp(a, "--resume") == 0 && v) {
			resume = v;
			i++;
		} else if (strcmp(a, "--report-url") == 0 && v) {
			report_url = v;
			i++;
		} else if (strcmp(a, "--report-token-file") == 0 && v) {
			report_token_file = v;
			i++;
		} else if (strcmp(a, "--out") == 0 && v) {
			out_dir = v;
			i++;
		} else if (strcmp(a, "--backend") == 0 && v) {
			backend_name = v;
			i++;
		} else if (strcmp(a, "--cpu-conv") == 0 && v) {
			if (strcmp(v, "auto") == 0)
				cpu_conv = TR_CPU_CONV_AUTO;
			else if (strcmp(v, "im2col") == 0)
				cpu_conv = TR_CPU_CONV_IM2COL;
			else if (strcmp(v, "onednn") == 0)
				cpu_conv = TR_CPU_CONV_ONEDNN;
			else {
				fprintf(stderr, "trainerd run: --cpu-conv must be auto, im2col or onednn, got '%s'\n",
					v);
				return 2;
			}
			i++;
		} else if (strcmp(a, "--quiet") == 0 || strcmp(a, "-q") == 0) {
			quiet = 1;
		} else if (a[0] == '-' || job) {
			fprintf(stderr, "trainerd run: unexpected argument '%s'\n", a);
			usage(stderr);
			return 2;
		} else {
			job = a;
		}
	}
	if (!report_url != !report_token_file) {
		fprintf(stderr, "trainerd run: --report-url and --report-token-file go together\n");
		return 2;
	}
	char saved_spec[PATH_MAX];
	if (resume) {
		if (out_dir && strcmp(out_dir, resume) != 0) {
			fprintf(stderr, "trainerd run: --resume %s writes into %s; leave out --out\n", resume, resume);
			return 2;
		}
		out_dir = resume;
		if (!job) {
			snprintf(saved_spec, sizeof saved_spec, "%s/spec.json", resume);
			job = saved_spec;
		}
	}
	if (!job) {
		usage(stderr);
		return 2;
	}

	json_error_t jerr;
	json_t *doc = json_load_file(job, 0, &jerr);
	if (!doc) {
		fprintf(stderr, "trainerd run: %s:%d:%d: %s\n", job, jerr.line, jerr.column, jerr.text);
		return 2;
	}
	if (!json_is_object(doc)) {
		fprintf(stderr, "trainerd run: %s: the spec must be a JSON object\n", job);
		json_decref(doc);
		return 2;
	}
	for (int i = 0; i < nsets; i++) {
		if (apply_set(doc, sets[i]) < 0) {
			json_decref(doc);
			return 2;
		}
	}
	struct tr_spec spec;
	struct tr_error serr;
	int rc = tr_spec_parse(doc, &spec, &serr);
	json_decref(doc);
	if (rc < 0) {
		fprintf(stderr, "trainerd run: %s: %s\n", job, serr.message);
		return 2;
	}
	if (check_data_paths(&spec, job) < 0) {
		tr_spec_finish(&spec);
		return 2;
	}
	if (spec.init_job > 0) {
		fprintf(stderr,
			"trainerd run: %s: /init/from: starting from job %lld's checkpoint needs the daemon "
			"(trainerd serve); give a safetensors file instead\n",
			job, (long long)spec.init_job);
		tr_spec_finish(&spec);
		return 2;
	}
	if (backend_name) {
		if (strcmp(backend_name, "cpu") == 0)
			spec.backend = TR_BACKEND_CPU;
		else if (strcmp(backend_name, "cuda") == 0)
			spec.backend = TR_BACKEND_CUDA;
		else {
			fprintf(stderr, "trainerd run: --backend must be cpu or cuda, got '%s'\n", backend_name);
			tr_spec_finish(&spec);
			return 2;
		}
	}

	/* Several processes (docs/design.md, "Processes and the
	 * communicator"): started here through mpirun, or already started by
	 * a launcher, which then gives the count. */
	int launched_size;
	bool launched = tr_pcomm_launched(&launched_size);
	if (processes)
		spec.processes = processes;
	int nproc = launched ? launched_size : spec.processes > 1 ? spec.processes : 1;
	if (launched && processes && processes != launched_size) {
		fprintf(stderr, "trainerd run: --processes %d, but the launcher started %d ranks\n", processes,
			launched_size);
		tr_spec_finish(&spec);
		return 2;
	}
	if (nproc > 1 && !spec.exact_shards) {
		fprintf(stderr,
			"trainerd run: %s: /processes: more than one process needs exact mode (\"exact\": true)\n",
			job);
		tr_spec_finish(&spec);
		return 2;
	}
	struct tr_error errbuf = {0};
	if (nproc > 1 && !launched) {
		tr_spec_finish(&spec);
		if (tr_pcomm_probe(&errbuf) < 0) {
			fprintf(stderr, "trainerd run: --processes %d: %s\n", nproc, errbuf.message);
			return 1;
		}
		return tr_run_launch(nproc, argc, argv);
	}
	tr_pcomm_t *pcomm = tr_pcomm_open(NULL, NULL, &errbuf);
	if (!pcomm) {
		fprintf(stderr, "trainerd run: %s\n", errbuf.message);
		tr_spec_finish(&spec);
		return 1;
	}
	if (pcomm->i->size(pcomm) != nproc) {
		fprintf(stderr, "trainerd run: the environment gives %d ranks, but MPI started %d\n", nproc,
			pcomm->i->size(pcomm));
		end_processes(pcomm, 2);
		tr_spec_finish(&spec);
		return 2;
	}
	spec.processes = nproc > 1 ? nproc : 0;
	/* Process 0 speaks and writes the outputs; the others compute. */
	int rank = pcomm->i->rank(pcomm);
	if (rank != 0)
		quiet = 1;
	/* The devices the job asks for: --devices, the spec's count, or as
	 * many as its highest device id needs; 0 = every device there is. */
	int n = devices;
	if (n == 0)
		n = spec.n_device_ids > 0 ? 0 : spec.device_count;
	if (spec.n_device_ids > 0 && devices == 0)
		for (int i = 0; i < spec.n_device_ids; i++)
			if (spec.device_ids[i] + 1 > n)
				n = spec.device_ids[i] + 1;
	/* GPU ranks (engine/comm_group.h) are asked for by name: several
	 * processes take CPU devices unless the spec or --backend says cuda.
	 * Each then sees every GPU of the machine and takes those of its
	 * local rank, one unless --devices or the spec gives a count. */
	bool gpu_ranks = nproc > 1 && spec.backend == TR_BACKEND_CUDA;
	if (gpu_ranks && devices == 0 && spec.n_device_ids == 0)
		devices = spec.device_count > 0 ? spec.device_count : 1;
	struct tr_backend_options bopt = {
		.kind = spec.backend == TR_BACKEND_CPU    ? TR_BACKEND_KIND_CPU
			: spec.backend == TR_BACKEND_CUDA ? TR_BACKEND_KIND_CUDA
			: nproc > 1                       ? TR_BACKEND_KIND_CPU
							  : TR_BACKEND_KIND_AUTO,
		.devices = gpu_ranks ? 0 : n,
		.tf32 = spec.tf32,
		.cpu_conv = cpu_conv,
	};
	tr_backend_t *be = tr_daemon_backend_open(&bopt, quiet, NULL, 0, &errbuf);
	if (!be) {
		fprintf(stderr, "trainerd run: /backend: %s\n", errbuf.message);
		tr_spec_finish(&spec);
		end_processes(pcomm, 1);
		return bopt.kind == TR_BACKEND_KIND_CUDA ? 2 : 1;
	}

	/* As in the daemon: where gemm is FP32 only, tf32 has no effect. */
	if (spec.tf32 && !quiet && (!be->i->set_tf32 || be->i->set_tf32(be, 0, true) == -ENOTSUP))
		fprintf(stderr, "trainerd: precision tf32 has no effect on %s devices: matrix products run in FP32\n",
			be->i->name);

	char out_buf[PATH_MAX];
	if (!out_dir) {
		snprintf(out_buf, sizeof out_buf, "out/%s", spec.name ? spec.name : "job");
		out_dir = out_buf;
	}
	if ((rc = mkdir_p(out_dir)) < 0) {
		fprintf(stderr, "trainerd run: --out %s: %s\n", out_dir, strerror(-rc));
		tr_backend_destroy(be);
		tr_spec_finish(&spec);
		end_processes(pcomm, 2);
		return 2;
	}
	char path[PATH_MAX + 64];
	struct run_ctx ctx = {.quiet = quiet, .out_dir = out_dir, .optim = spec.optimizer.type, .rank0 = rank == 0};
	tr_progress_init(&ctx.progress, stderr);
	/* The measured conv2d routes live with the outputs, so --resume DIR
	 * takes the same ones, and in the user's cache, so that a run into
	 * another DIR on this machine decides the same way and gives the same
	 * bits (docs/design.md, "Convolution on CPU devices"). */
	snprintf(path, sizeof path, "%s/conv_routes.json", out_dir);
	tr_cpu_conv_cache_open(path);
	if (user_cache_file(path, sizeof path, "conv_routes.json") == 0)
		tr_cpu_conv_cache_open(path);
	/* The effective spec (after --set, defaults filled in), for --resume:
	 * by process 0, once every process has read the one --resume names. */
	snprintf(path, sizeof path, "%s/spec.json", out_dir);
	json_t *effective = tr_spec_to_json(&spec);
	char *effective_text = effective ? tr_json_dumps(effective, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
	json_decref(effective);
	if (pcomm->i->barrier(pcomm) < 0 || !effective_text ||
	    (rank == 0 && tr_wjob_write_text(path, effective_text) < 0)) {
		fprintf(stderr, "trainerd run: cannot write %s\n", path);
		free(effective_text);
		tr_backend_destroy(be);
		tr_spec_finish(&spec);
		end_processes(pcomm, 2);
		return 2;
	}
	free(effective_text);
	if (rank == 0 && report_url && !(ctx.report = tr_run_report_start(report_url, report_token_file, &errbuf))) {
		fprintf(stderr, "trainerd run: %s\n", errbuf.message);
		tr_backend_destroy(be);
		tr_spec_finish(&spec);
		end_processes(pcomm, 2);
		return 2;
	}
	bool summary_written = false;

	struct tr_trainer_options opt = {
		.spec = &spec,
		.backend = be,
		.devices = devices,
		.workers = workers,
		.data_roots = NULL, /* a person's own files: paths as written */
		.hooks = {.metric = rank == 0 ? on_metric : NULL,
			  .progress = on_progress,
			  .log = rank == 0 ? on_log : NULL,
			  .checkpoint = rank == 0 ? on_checkpoint : NULL,
			  .info = on_info,
			  .ctx = &ctx},
		.pcomm = pcomm,
	};
	tr_trainer_t *t = NULL;
	int exit_code = 0;
	rc = tr_trainer_create(&opt, &t, &errbuf);
	if (rc < 0) {
		fprintf(stderr, "trainerd run: %s: %s\n", job, errbuf.message);
		exit_code = rc == -EINVAL ? 2 : 1;
		goto out;
	}
	ctx.trainer = t;
	snprintf(path, sizeof path, "%s/metrics.jsonl", out_dir);
	if (resume) {
		struct tr_snapshot *snap = NULL;
		rc = tr_run_ckpt_read(resume, tr_trainer_model(t), spec.optimizer.type, &snap, &errbuf);
		if (rc == 0)
			rc = tr_trainer_restore(t, snap, false, &errbuf);
		if (rc < 0) {
			fprintf(stderr, "trainerd run: --resume %s: %s\n", resume, errbuf.message);
			tr_snapshot_free(snap);
			exit_code = 2;
			goto out;
		}
		const char *was = json_string_value(json_object_get(snap->meta, "devices"));
		/* exact mode's result does not depend on the device count */
		if (was && atoi(was) != tr_trainer_device_count(t) && !spec.exact_shards)
			fprintf(stderr,
				"trainerd: the checkpoint was written by a run on %s devices, this one has %d: "
				"the result will differ slightly from an uninterrupted run\n",
				was, tr_trainer_device_count(t));
		if (rank == 0 && (rc = tr_run_metrics_truncate(path, snap->step)) < 0)
			fprintf(stderr, "trainerd run: %s: %s\n", path, strerror(-rc));
		tr_snapshot_free(snap);
	}
	ctx.metrics = rank == 0 ? fopen(path, resume ? "a" : "w") : NULL;
	if (rank == 0 && !ctx.metrics) {
		fprintf(stderr, "trainerd run: %s: %s\n", path, strerror(errno));
		exit_code = 2;
		goto out;
	}
	running_trainer = t;
	signal(SIGINT, on_sigint);
	signal(SIGTERM, on_sigint);
	/* USR1: Slurm's warning before a time limit (daemon/slurm.h), and
	 * how `trainerd run --processes` passes a stop on through mpirun: the
	 * same checkpoint at the next step boundary, then the run ends. */
	signal(SIGUSR1, on_sigint);
	if (nproc > 1 &&
	    tr_run_watchdog_start(spec.collective_timeout_s ? spec.collective_timeout_s : 300, rank, nproc) < 0)
		fprintf(stderr, "trainerd run: cannot start the collective_timeout_s watchdog\n");
	rc = tr_trainer_run(t, &errbuf);
	tr_run_watchdog_stop();
	signal(SIGINT, SIG_DFL);
	signal(SIGTERM, SIG_DFL);
	signal(SIGUSR1, SIG_IGN); /* the outputs are written next */
	running_trainer = NULL;
	tr_progress_finish(&ctx.progress);

	struct tr_summary sum;
	tr_trainer_summary(t, &sum);
	const char *state = rc < 0 ? "failed" : sum.stopped ? "stopped" : "completed";
	snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
	struct tr_error werr;
	if (rank == 0 && tr_trainer_save_weights(t, path, &werr) < 0) {
		fprintf(stderr, "trainerd run: %s\n", werr.message);
		exit_code = 1;
	}
	snprintf(path, sizeof path, "%s/summary.json", out_dir);
	if (rank == 0 &&
	    write_summary(path, &sum, tr_trainer_device_count(t), nproc, workers ? workers : spec.prefetch_workers,
			  state, ctx.conv_routes, ctx.dense_routes, rc < 0 ? errbuf.message : NULL) < 0) {
		fprintf(stderr, "trainerd run: cannot write %s\n", path);
		exit_code = 1;
	} else {
		summary_written = rank == 0;
	}
	if (rc < 0) {
		if (nproc > 1)
			fprintf(stderr, "trainerd run: process %d of %d failed: %s\n", rank, nproc, errbuf.message);
		else
			fprintf(stderr, "trainerd run: failed: %s\n", errbuf.message);
		exit_code = 1;
	} else if (!quiet) {
		fprintf(stderr, "trainerd: %s after %lld steps (%lld samples) in %.2f s: loss %.6f", state,
			(long long)sum.steps, (long long)sum.samples, sum.wall_s, sum.final_loss);
		if (isfinite(sum.val_loss))
			fprintf(stderr, ", val_loss %.6f", sum.val_loss);
		if (isfinite(sum.val_accuracy))
			fprintf(stderr, ", val_accuracy %.4f", sum.val_accuracy);
		if (isfinite(sum.test_loss))
			fprintf(stderr, ", test_loss %.6f", sum.test_loss);
		if (isfinite(sum.test_accuracy))
			fprintf(stderr, ", test_accuracy %.4f", sum.test_accuracy);
		fprintf(stderr, "; %.0f samples/s, data wait %.1f%%; outputs in %s/\n", sum.samples_per_sec,
			sum.data_wait_fraction * 100, out_dir);
	}
out:
	if (ctx.report) {
		/* This run's summary (not an earlier run's, left in DIR). */
		snprintf(path, sizeof path, "%s/summary.json", out_dir);
		json_t *sum = summary_written ? json_load_file(path, 0, NULL) : NULL;
		char *text = sum ? json_dumps(sum, JSON_COMPACT) : NULL;
		tr_run_report_finish(ctx.report, summary_written ? out_dir : NULL, text, 60);
		free(text);
		json_decref(sum);
	}
	if (ctx.metrics && fclose(ctx.metrics) != 0)
		ctx.metrics_failed = 1;
	if (ctx.metrics_failed) {
		fprintf(stderr, "trainerd run: writing %s/metrics.jsonl failed\n", out_dir);
		exit_code = exit_code ? exit_code : 1;
	}
	tr_trainer_destroy(t);
	tr_backend_destroy(be);
	tr_spec_finish(&spec);
	end_processes(pcomm, exit_code);
	return exit_code;
}
