/* The configuration table of trainerd serve (see config.h).
 *
 * Adding an option means adding one row.  The rows are read by the same
 * field-table interpreter as the job spec (engine/spec_fields.h), so the
 * command line, the config file, defaults, range checks, their messages,
 * the reload diff and --help all come from the one table.  Values arrive
 * as text and are typed by the row (tr_fields_parse_text).
 */
#include "daemon/config.h"
#include "daemon/tokens.h"

#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/spec_fields.h"

#define DEFAULT_LISTEN "127.0.0.1:8080"

/* Syslog priorities by name: the index is the level. */
static const char *const level_names[] = {"emerg",  "alert", "crit",  "error", "warning",
					  "notice", "info",  "debug", NULL};
static const char *const backend_names[] = {"auto", "cpu", "cuda", NULL};
static const char *const cpu_conv_names[] = {"auto", "im2col", "onednn", NULL};
static const char *const off_on_names[] = {"off", "on", NULL};

/* ---- custom rows ---- */

static int parse_listen(struct tr_fields_ctx *ctx, const json_t *v, void *base)
{
	struct tr_config *c = base;
	const char *text = v ? json_string_value(v) : DEFAULT_LISTEN;
	const char *colon, *h;
	char *end;
	long port;
	size_t hlen;

	if (!text)
		return tr_fields_fail(ctx, NULL, "expected HOST:PORT");
	colon = strrchr(text, ':');
	if (!colon || colon == text)
		return tr_fields_fail(ctx, NULL, "expected HOST:PORT");
	errno = 0;
	port = strtol(colon + 1, &end, 10);
	hlen = (size_t)(colon - text);
	if (errno || !colon[1] || *end || port < 0 || port > 65535 || hlen >= sizeof c->listen_host)
		return tr_fields_fail(ctx, NULL, "expected HOST:PORT with a port in [0, 65535]");
	/* "[::1]:8080" names an IPv6 host. */
	h = text;
	if (h[0] == '[' && colon[-1] == ']') {
		h++;
		hlen -= 2;
	}
	memcpy(c->listen_host, h, hlen);
	c->listen_host[hlen] = 0;
	c->listen_port = (int)port;
	return 0;
}

static int emit_listen(const void *base, json_t *obj, const char *key)
{
	const struct tr_config *c = base;
	bool v6 = strchr(c->listen_host, ':') != NULL;

	return json_object_set_new(obj, key, json_sprintf(v6 ? "[%s]:%d" : "%s:%d", c->listen_host, c->listen_port));
}

/* A repeatable option: v NULL (the default) empties the list, a value is
 * appended. */
static int parse_list(struct tr_fields_ctx *ctx, const json_t *v, char **list, int *count, int max)
{
	const char *text;

	if (!v) {
		for (int i = 0; i < *count; i++)
			free(list[i]);
		*count = 0;
		list[0] = NULL;
		return 0;
	}
	text = json_string_value(v);
	if (!text || !*text)
		return tr_fields_fail(ctx, NULL, "must not be empty");
	if (*count >= max)
		return tr_fields_fail(ctx, NULL, "at most %d values", max);
	if (!(list[*count] = strdup(text)))
		return tr_fields_fail_oom(ctx);
	list[++*count] = NULL;
	return 0;
}

static int emit_list(char *const *list, json_t *obj, const char *key)
{
	json_t *a = json_array();

	for (int i = 0; a && list[i]; i++)
		if (json_array_append_new(a, json_string(list[i]))) {
			json_decref(a);
			return -1;
		}
	return a ? json_object_set_new(obj, key, a) : -1;
}

static int parse_data_root(struct tr_fields_ctx *ctx, const json_t *v, void *base)
{
	struct tr_config *c = base;

	return parse_list(ctx, v, c->data_roots, &c->n_data_roots, TR_CONFIG_MAX_ROOTS);
}

static int emit_data_roots(const void *base, json_t *obj, const char *key)
{
	return emit_list(((const struct tr_config *)base)->data_roots, obj, key);
}

static int parse_token(struct tr_fields_ctx *ctx, const json_t *v, void *base)
{
	struct tr_config *c = base;

	return parse_list(ctx, v, c->tokens, &c->n_tokens, TR_CONFIG_MAX_TOKENS);
}

static int emit_tokens(const void *base, json_t *obj, const char *key)
{
	return emit_list(((const struct tr_config *)base)->tokens, obj, key);
}

static const char *const allocator_names[] = {"local", "slurm", NULL};

/* ---- the table ---- */

#define CFG(m) offsetof(struct tr_config, m)
#define TEXT(m) .kind = K_TEXT, .off = CFG(m), .size = sizeof(((struct tr_config *)0)->m)
#define INT_IN(m, lo_, hi_) .kind = K_INT, .off = CFG(m), .flags = F_LO | F_HI, .lo = (lo_), .hi = (hi_)
#define I64_IN(m, lo_, hi_) .kind = K_I64, .off = CFG(m), .flags = F_LO | F_HI, .lo = (lo_), .hi = (hi_)

/* clang-format off */
static const struct tr_field options[] = {
	{.key = "listen", .kind = K_CUSTOM, .parse = parse_listen, .emit = emit_listen, .defstr = DEFAULT_LISTEN,
	 .help = "HOST:PORT to serve the API on (port 0 = any free port; ignored under socket activation); a "
		 "non-loopback host needs tokens"},
	{.key = "state-dir", TEXT(state_dir), .defstr = "./var",
	 .help = "directory for the SQLite database and the listen address file"},
	{.key = "data-root", .kind = K_CUSTOM, .parse = parse_data_root, .emit = emit_data_roots,
	 .help = "directory job data paths resolve against (repeatable; default: the working directory)"},
	{.key = "cpu-devices", INT_IN(cpu_devices, 0, 64), .def = 0,
	 .help = "number of CPU devices when no GPU is used (0 = one per core)"},
	{.key = "backend", .kind = K_NAME, .off = CFG(backend), .size = sizeof(((struct tr_config *)0)->backend),
	 .names = backend_names, .defstr = "auto", .help = "device backend: auto uses CUDA when a GPU is present"},
	{.key = "cuda-module", TEXT(cuda_module), .defstr = "",
	 .help = "the CUDA backend module, trainerd-cuda.so (default: TRAINERD_CUDA_MODULE, else beside the executable, "
		 "else the install's libdir)"},
	{.key = "cpu-conv", .kind = K_NAME, .off = CFG(cpu_conv), .size = sizeof(((struct tr_config *)0)->cpu_conv),
	 .names = cpu_conv_names, .defstr = "auto",
	 .help = "how CPU devices compute conv2d: im2col (OpenBLAS sgemm), onednn (oneDNN's primitives), or auto: per "
		 "layer, whichever measured faster at the job's shapes (remembered in STATE_DIR/conv_routes.json); a "
		 "job's spec may name its own (cpu_conv)"},
	{.key = "max-body", I64_IN(max_body, 1024, 64 << 20), .def = 1048576,
	 .help = "largest accepted request body in bytes"},
	{.key = "log-level", .kind = K_ENUM, .off = CFG(log_level), .names = level_names, .def = 6,
	 .help = "least important messages logged: error, warning, notice, info or debug"},
	{.key = "sse-heartbeat", INT_IN(sse_heartbeat_s, 1, 3600), .def = 15,
	 .help = "seconds between heartbeat comments on event streams"},
	{.key = "max-connections", INT_IN(max_connections, 8, 100000), .def = 512,
	 .help = "HTTP connections served at once (each holds a thread)"},
	{.key = "max-connections-per-client", INT_IN(max_connections_per_client, 1, 100000), .def = 64,
	 .help = "connections one client address may hold; more are closed at once"},
	{.key = "connection-reserve", INT_IN(connection_reserve, 1, 100000), .def = 64,
	 .help = "the last connection slots, kept for addresses that hold fewer than 8 connections"},
	{.key = "request-timeout", INT_IN(request_timeout_s, 1, 3600), .def = 30,
	 .help = "seconds a request's headers and body may take to arrive (a total, not an idle time); idle "
		 "kept-alive connections close after it too"},
	{.key = "max-queued-jobs", INT_IN(max_queued_jobs, 0, 10000000), .def = 10000,
	 .help = "jobs that may wait in the queue at once (0 = no limit); a submit past it is answered 503"},
	{.key = "max-streams", INT_IN(max_streams, 1, 100000), .def = 256,
	 .help = "event streams (GET /jobs/{id}/events) open at once; more are answered 503"},
	{.key = "max-streams-per-client", INT_IN(max_streams_per_client, 1, 100000), .def = 16,
	 .help = "event streams one client address may hold open; more are answered 503"},
	{.key = "sse-buffer", I64_IN(sse_buffer, 4096, 64 << 20), .def = 262144,
	 .help = "bytes of events one stream reads from the database at a time (its memory bound)"},
	{.key = "sse-stall-timeout", INT_IN(sse_stall_s, 0, 86400), .def = 0,
	 .help = "seconds an event stream may go without the client reading before it is closed (the client "
		 "resumes with Last-Event-ID; 0 = 60 or 4 heartbeats, whichever is longer)"},
	{.key = "shutdown-grace", INT_IN(shutdown_grace_s, 1, 3600), .def = 30,
	 .help = "seconds running jobs get on SIGTERM to stop at a step boundary and write their checkpoint "
		 "before they are cancelled"},
	{.key = "metrics-queue", I64_IN(metrics_queue, 1000, 100000000), .def = 1000000,
	 .help = "metric points buffered for the database writer before points are dropped"},
	{.key = "state-max-bytes", .kind = K_I64, .off = CFG(state_max_bytes), .flags = F_LO, .lo = 0, .def = 0,
	 .help = "cap on the database size in bytes (0 = none); a checkpoint that does not fit fails cleanly"},
	{.key = "datasets-max-bytes", .kind = K_I64, .off = CFG(datasets_max_bytes), .flags = F_LO, .lo = 0,
	 .def = 10737418240.0,
	 .help = "quota in bytes for the files uploaded with PUT /datasets/NAME/FILE, all together (0 = none); an "
		 "upload past it is answered 413"},
	{.key = "datasets-max-files", .kind = K_I64, .off = CFG(datasets_max_files), .flags = F_LO, .lo = 0,
	 .def = 10000,
	 .help = "most files uploaded with PUT /datasets/NAME/FILE, all datasets together (0 = none); an upload of "
		 "a new file past it is answered 413 (empty files take no quota bytes but an inode each)"},
	{.key = "image-max-pixels", I64_IN(image_max_pixels, 1, 268435456), .def = 16777216,
	 .help = "largest image (width x height) the image readers decode; a larger one is refused from its header "
		 "with 'image too large to decode'"},
	{.key = "max-job-crashes", INT_IN(max_job_crashes, 0, 1000), .def = 2,
	 .help = "times the daemon may die while a job runs without the job making a step before the job is "
		 "failed with crashed_daemon instead of queued again (0 = no limit)"},
	{.key = "memory-available", .kind = K_I64, .off = CFG(memory_available), .flags = F_LO, .lo = 0, .def = 0,
	 .help = "bytes of memory jobs may use together, in place of /proc/meminfo's MemAvailable (0 = read "
		 "MemAvailable at each admission)"},
	/* The [preemption] section of the config file (its keys are these
	 * without the prefix; docs/design.md, "Preemption"). */
	{.key = "preemption-enabled", .kind = K_BOOLENUM, .off = CFG(preemption_enabled), .names = off_on_names,
	 .def = 1, .defstr = "on",
	 .help = "on: a queued job that lower-priority preemptible jobs keep from starting preempts the fewest of "
		 "them (off: jobs only wait)"},
	{.key = "preemption-grace", INT_IN(preemption_grace_s, 0, 86400), .def = 60,
	 .help = "seconds a preempted job has to reach a step boundary and checkpoint; past it the job is cancelled "
		 "and resumes from its newest earlier checkpoint (the steps since are done again)"},
	{.key = "preemption-min-run", INT_IN(preemption_min_run_s, 0, 86400), .def = 60,
	 .help = "seconds a job must have run since it (re)started before it may be preempted (again)"},
	{.key = "allocator", .kind = K_ENUM, .off = CFG(allocator), .names = allocator_names, .def = 0,
	 .help = "where a job without a \"resources\" section runs: local (this daemon's devices) or slurm (submitted "
		 "to the Slurm cluster with sbatch; docs/slurm.md)"},
	{.key = "slurm-bin-dir", TEXT(slurm_bin_dir), .defstr = "",
	 .help = "directory of Slurm's commands (sbatch, squeue, scontrol, scancel, srun); empty: found on PATH"},
	{.key = "report-url", TEXT(report_url), .defstr = "",
	 .help = "this daemon's URL as the Slurm nodes reach it (https://head:8443): a Slurm job's worker reports "
		 "its progress, metrics and summary there with its job's token (docs/slurm.md); empty: the daemon "
		 "reads them from the worker's files"},
	{.key = "token", .kind = K_CUSTOM, .parse = parse_token, .emit = emit_tokens,
	 .help = "bearer token with the admin role (repeatable); visible to every user in the process list when "
		 "given on the command line: prefer token-file"},
	{.key = "token-file", TEXT(token_file), .defstr = "",
	 .help = "file of 'role:token' lines (roles read, write, admin), readable by its owner only; tokens (or "
		 "--token) are required for a non-loopback listen address"},
	{.key = "tls-cert", TEXT(tls_cert), .defstr = "",
	 .help = "PEM certificate (chain); with tls-key the API serves HTTPS only"},
	{.key = "tls-key", TEXT(tls_key), .defstr = "", .help = "PEM private key of tls-cert"},
	{.key = "openapi", TEXT(openapi_path), .defstr = "openapi/openapi.yaml",
	 .help = "OpenAPI document served at GET /openapi.yaml (empty = none)"},
	{.key = "submit-if-empty", TEXT(submit_if_empty), .defstr = "",
	 .help = "job spec file to submit when the database has no job yet (make run uses the quickstart)"},
	{0},
};
/* clang-format on */

/* What a reload (SIGHUP, POST /reload) applies; the rest needs a restart
 * (the listener, the store, the devices are set up once). */
static const char *const reloadable[] = {"log-level", "max-body", "token", "token-file", "shutdown-grace", NULL};

/* Sets one option from text; `where` prefixes the message ("--", or
 * "FILE:LINE: "). */
static int set_option(struct tr_config *c, const struct tr_field *o, const char *value, const char *where,
		      struct tr_error *err)
{
	struct tr_error e;
	struct tr_fields_ctx ctx = {.err = &e, .user = c};

	memset(&e, 0, sizeof(e));
	if (tr_fields_parse_text(&ctx, o, value, c) == 0)
		return 0;
	/* The message starts with the pointer ("/max-body: "); the flag or
	 * line names the option the way the user wrote it instead. */
	const char *text = e.message;
	size_t plen = strlen(e.pointer);

	if (plen && strncmp(text, e.pointer, plen) == 0 && strncmp(text + plen, ": ", 2) == 0)
		text += plen + 2;
	return tr_error_set(err, -EINVAL, 0, NULL, "%s%s: %s, got '%.200s'", where, o->key, text, value);
}

void tr_config_defaults(struct tr_config *c)
{
	struct tr_error e;
	struct tr_fields_ctx ctx = {.err = &e, .user = c};

	memset(c, 0, sizeof *c);
	/* Absent object: every row takes its default; the rows' defaults are
	 * valid, so this cannot fail but for memory. */
	(void)tr_fields_parse_object(&ctx, NULL, options, c);
}

void tr_config_finish(struct tr_config *c)
{
	for (int i = 0; i < c->n_data_roots; i++)
		free(c->data_roots[i]);
	for (int i = 0; i < c->n_tokens; i++)
		free(c->tokens[i]);
	c->n_data_roots = c->n_tokens = 0;
	c->data_roots[0] = c->tokens[0] = NULL;
}

int tr_config_diff(const struct tr_config *a, const struct tr_config *b,
		   void (*fn)(const char *name, int reloadable, void *ud), void *ud)
{
	json_t *ja = tr_fields_emit_object(options, a, 0), *jb = tr_fields_emit_object(options, b, 0);
	int n = 0;

	for (const struct tr_field *o = options; o->key; o++) {
		bool r = false;

		if (ja && jb && json_equal(json_object_get(ja, o->key), json_object_get(jb, o->key)))
			continue;
		for (int k = 0; reloadable[k]; k++)
			r |= strcmp(reloadable[k], o->key) == 0;
		fn(o->key, r, ud);
		n++;
	}
	json_decref(ja);
	json_decref(jb);
	return n;
}

static char *trim(char *s)
{
	while (*s == ' ' || *s == '\t')
		s++;
	char *e = s + strlen(s);
	while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r'))
		*--e = 0;
	return s;
}

/* The config file's sections: after "[name]" a line "KEY = value" sets
 * the option "name-KEY" (the command line spells it --name-KEY). */
static const char *const sections[] = {"preemption", NULL};

static int enter_section(const char *line, char *section, size_t size, const char *where, struct tr_error *err)
{
	size_t n = strlen(line);

	for (int i = 0; line[n - 1] == ']' && sections[i]; i++) {
		if (n - 2 == strlen(sections[i]) && strncmp(line + 1, sections[i], n - 2) == 0) {
			snprintf(section, size, "%s", sections[i]);
			return 0;
		}
	}
	return tr_error_set(err, -EINVAL, 0, NULL, "%sunknown section %.64s (the file has one: [preemption])", where,
			    line);
}

int tr_config_load_file(struct tr_config *c, const char *path, struct tr_error *err)
{
	FILE *f = fopen(path, "re");
	if (!f) {
		int rc = -errno;
		return tr_error_set(err, rc, 0, NULL, "--config %s: %s", path, strerror(-rc));
	}
	char line[4096], where[1200], section[32] = "";
	int lineno = 0, rc = 0;
	bool has_token = false;
	while (rc == 0 && fgets(line, sizeof line, f)) {
		lineno++;
		char *s = trim(line);
		if (!*s || *s == '#')
			continue;
		char *eq = strchr(s, '=');
		snprintf(where, sizeof where, "%s:%d: ", path, lineno);
		if (*s == '[') {
			rc = enter_section(s, section, sizeof section, where, err);
			continue;
		}
		if (!eq) {
			rc = tr_error_set(err, -EINVAL, 0, NULL, "%sexpected 'name = value'", where);
			break;
		}
		*eq = 0;
		char *name = trim(s), *value = trim(eq + 1), full[128];
		snprintf(full, sizeof full, "%s%s%.64s", section, *section ? "-" : "", name);
		const struct tr_field *o = tr_fields_find_field(options, full);
		if (!o) {
			rc = tr_error_set(err, -EINVAL, 0, NULL, "%sunknown option '%s'%s%s%s", where, name,
					  *section ? " in section [" : "", section, *section ? "]" : "");
			break;
		}
		has_token |= strcmp(o->key, "token") == 0;
		rc = set_option(c, o, value, where, err);
	}
	/* A file with tokens in it follows the token file's rules (checked on
	 * the descriptor read, so the file checked is the file read). */
	struct stat st;
	if (rc == 0 && has_token) {
		if (fstat(fileno(f), &st) < 0)
			rc = tr_error_set(err, -errno, 0, NULL, "--config %s: %s", path, strerror(errno));
		else
			rc = tr_secret_file_check("--config", path, &st, err);
	}
	fclose(f);
	return rc;
}

/* The default as --help shows it, or "" for none. */
static void default_text(const struct tr_field *o, char *buf, size_t n)
{
	switch (o->kind) {
	case K_INT:
	case K_I64:
		snprintf(buf, n, "%lld", (long long)o->def);
		return;
	case K_ENUM:
		snprintf(buf, n, "%s", o->names[(int)o->def]);
		return;
	default:
		snprintf(buf, n, "%s", o->defstr ? o->defstr : "");
		return;
	}
}

void tr_config_print_help(void)
{
	printf("usage: trainerd serve [--config FILE] [--OPTION VALUE]...\n\n"
	       "Options (also accepted in the config file as 'option = value'):\n");
	for (const struct tr_field *o = options; o->key; o++) {
		char def[64];

		default_text(o, def, sizeof def);
		printf("  --%-18s %s", o->key, o->help);
		if (*def)
			printf(" (default %s)", def);
		printf("\n");
	}
}

int tr_config_parse_args(struct tr_config *c, int argc, char **argv, struct tr_error *err)
{
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i];
		if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
			tr_config_print_help();
			return 1;
		}
		if (strncmp(a, "--", 2) != 0) {
			return tr_error_set(err, -EINVAL, 0, NULL, "unexpected argument '%s'", a);
		}
		const char *name = a + 2, *value = NULL;
		char namebuf[64];
		const char *eq = strchr(name, '=');
		if (eq) {
			snprintf(namebuf, sizeof namebuf, "%.*s", (int)(eq - name), name);
			name = namebuf;
			value = eq + 1;
		} else if (i + 1 < argc) {
			value = argv[++i];
		}
		if (!value) {
			return tr_error_set(err, -EINVAL, 0, NULL, "--%s needs a value", name);
		}
		if (strcmp(name, "config") == 0) {
			int rc = tr_config_load_file(c, value, err);
			if (rc < 0)
				return rc;
			continue;
		}
		const struct tr_field *o = tr_fields_find_field(options, name);
		if (!o) {
			return tr_error_set(err, -EINVAL, 0, NULL, "unknown option '--%s' (see trainerd serve --help)",
					    name);
		}
		int rc = set_option(c, o, value, "--", err);
		if (rc < 0)
			return rc;
	}
	return 0;
}
