/* The configuration table of trainerd serve (see config.h).
 *
 * Adding an option means adding one row: the parser, the file reader,
 * validation and the --help text all come from it.
 */
#include "daemon/config.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum opt_kind { OPT_STRING, OPT_INT, OPT_LONG, OPT_LLONG, OPT_LIST, OPT_LISTEN, OPT_LEVEL, OPT_CHOICE };

struct option_row {
	const char *name;
	enum opt_kind kind;
	size_t offset;
	size_t size;       /* string buffer size */
	long lo, hi;       /* integer range */
	const char *choices; /* OPT_CHOICE: '|'-separated */
	const char *def;     /* default, as text */
	const char *help;
};

#define OFF(f) offsetof(struct tr_config, f)
#define SZ(f) sizeof(((struct tr_config *)0)->f)

static const struct option_row options[] = {
	{"listen", OPT_LISTEN, 0, 0, 0, 0, NULL, "127.0.0.1:8080",
	 "HOST:PORT to serve the API on (port 0 = any free port; ignored under socket activation); a non-loopback host needs tokens"},
	{"state-dir", OPT_STRING, OFF(state_dir), SZ(state_dir), 0, 0, NULL, "./var",
	 "directory for the SQLite database and the listen address file"},
	{"data-root", OPT_LIST, OFF(data_roots), 0, 0, TR_CONFIG_MAX_ROOTS, NULL, NULL,
	 "directory job data paths resolve against (repeatable; default: the working directory)"},
	{"cpu-devices", OPT_INT, OFF(cpu_devices), 0, 0, 64, NULL, "0",
	 "number of CPU devices when no GPU is used (0 = one per core)"},
	{"backend", OPT_CHOICE, OFF(backend), SZ(backend), 0, 0, "auto|cpu|cuda", "auto",
	 "device backend: auto uses CUDA when a GPU is present"},
	{"cpu-conv", OPT_CHOICE, OFF(cpu_conv), SZ(cpu_conv), 0, 0, "auto|im2col|onednn", "auto",
	 "how CPU devices compute conv2d: im2col (OpenBLAS sgemm), onednn (oneDNN's primitives), or auto: per layer, "
	 "oneDNN for large convolutions where the build has it, im2col for small ones"},
	{"max-body", OPT_LONG, OFF(max_body), 0, 1024, 64L << 20, NULL, "1048576",
	 "largest accepted request body in bytes"},
	{"log-level", OPT_LEVEL, OFF(log_level), 0, 0, 7, NULL, "info",
	 "least important messages logged: error, warning, notice, info or debug"},
	{"sse-heartbeat", OPT_INT, OFF(sse_heartbeat_s), 0, 1, 3600, NULL, "15",
	 "seconds between heartbeat comments on event streams"},
	{"max-connections", OPT_INT, OFF(max_connections), 0, 8, 100000, NULL, "512",
	 "HTTP connections served at once (each holds a thread)"},
	{"max-connections-per-client", OPT_INT, OFF(max_connections_per_client), 0, 1, 100000, NULL, "64",
	 "connections one client address may hold; more are closed at once"},
	{"connection-reserve", OPT_INT, OFF(connection_reserve), 0, 1, 100000, NULL, "64",
	 "the last connection slots, kept for addresses that hold fewer than 8 connections"},
	{"request-timeout", OPT_INT, OFF(request_timeout_s), 0, 1, 3600, NULL, "30",
	 "seconds a request's headers and body may take to arrive (a total, not an idle time); idle kept-alive "
	 "connections close after it too"},
	{"max-queued-jobs", OPT_INT, OFF(max_queued_jobs), 0, 0, 10000000, NULL, "10000",
	 "jobs that may wait in the queue at once (0 = no limit); a submit past it is answered 503"},
	{"max-streams", OPT_INT, OFF(max_streams), 0, 1, 100000, NULL, "256",
	 "event streams (GET /jobs/{id}/events) open at once; more are answered 503"},
	{"max-streams-per-client", OPT_INT, OFF(max_streams_per_client), 0, 1, 100000, NULL, "16",
	 "event streams one client address may hold open; more are answered 503"},
	{"sse-buffer", OPT_LONG, OFF(sse_buffer), 0, 4096, 64L << 20, NULL, "262144",
	 "bytes of events one stream reads from the database at a time (its memory bound)"},
	{"sse-stall-timeout", OPT_INT, OFF(sse_stall_s), 0, 0, 86400, NULL, "0",
	 "seconds an event stream may go without the client reading before it is closed (the client resumes "
	 "with Last-Event-ID; 0 = 60 or 4 heartbeats, whichever is longer)"},
	{"shutdown-grace", OPT_INT, OFF(shutdown_grace_s), 0, 1, 3600, NULL, "30",
	 "seconds running jobs get on SIGTERM to stop at a step boundary and write their checkpoint before they are cancelled"},
	{"metrics-queue", OPT_LONG, OFF(metrics_queue), 0, 1000, 100000000L, NULL, "1000000",
	 "metric points buffered for the database writer before points are dropped"},
	{"state-max-bytes", OPT_LLONG, OFF(state_max_bytes), 0, 0, 0x7fffffffffffffffLL, NULL, "0",
	 "cap on the database size in bytes (0 = none); a checkpoint that does not fit fails cleanly"},
	{"token", OPT_LIST, OFF(tokens), 0, 0, TR_CONFIG_MAX_TOKENS, NULL, NULL,
	 "bearer token with the admin role (repeatable); visible to every user in the process list when given on "
	 "the command line: prefer token-file"},
	{"token-file", OPT_STRING, OFF(token_file), SZ(token_file), 0, 0, NULL, "",
	 "file of 'role:token' lines (roles read, write, admin), readable by its owner only; tokens (or --token) "
	 "are required for a non-loopback listen address"},
	{"tls-cert", OPT_STRING, OFF(tls_cert), SZ(tls_cert), 0, 0, NULL, "",
	 "PEM certificate (chain); with tls-key the API serves HTTPS only"},
	{"tls-key", OPT_STRING, OFF(tls_key), SZ(tls_key), 0, 0, NULL, "", "PEM private key of tls-cert"},
	{"openapi", OPT_STRING, OFF(openapi_path), SZ(openapi_path), 0, 0, NULL, "openapi/openapi.yaml",
	 "OpenAPI document served at GET /openapi.yaml (empty = none)"},
	{"submit-if-empty", OPT_STRING, OFF(submit_if_empty), SZ(submit_if_empty), 0, 0, NULL, "",
	 "job spec file to submit when the database has no job yet (make run uses the quickstart)"},
};

#define N_OPTIONS (sizeof options / sizeof options[0])

static const char *levels[] = {"emerg", "alert", "crit", "error", "warning", "notice", "info", "debug"};

static int set_value(struct tr_config *c, const struct option_row *o, const char *v, const char *where, char *err,
		     size_t errlen)
{
	char *base = (char *)c;
	char *end;
	switch (o->kind) {
	case OPT_STRING:
	case OPT_CHOICE:
		if (strlen(v) >= o->size) {
			snprintf(err, errlen, "%s%s: value longer than %zu characters", where, o->name, o->size - 1);
			return -1;
		}
		if (o->kind == OPT_CHOICE) {
			const char *p = o->choices;
			size_t n = strlen(v);
			bool ok = false;
			while (p && *p) {
				const char *bar = strchr(p, '|');
				size_t len = bar ? (size_t)(bar - p) : strlen(p);
				ok |= len == n && strncmp(p, v, n) == 0;
				p = bar ? bar + 1 : NULL;
			}
			if (!ok) {
				snprintf(err, errlen, "%s%s: must be one of %s, got '%s'", where, o->name, o->choices, v);
				return -1;
			}
		}
		snprintf(base + o->offset, o->size, "%s", v);
		return 0;
	case OPT_LLONG: {
		errno = 0;
		long long n = strtoll(v, &end, 10);
		if (errno || !*v || *end || n < 0) {
			snprintf(err, errlen, "%s%s: must be a non-negative integer, got '%s'", where, o->name, v);
			return -1;
		}
		*(long long *)(base + o->offset) = n;
		return 0;
	}
	case OPT_INT:
	case OPT_LONG: {
		errno = 0;
		long n = strtol(v, &end, 10);
		if (errno || !*v || *end || n < o->lo || n > o->hi) {
			snprintf(err, errlen, "%s%s: must be an integer in [%ld, %ld], got '%s'", where, o->name, o->lo,
				 o->hi, v);
			return -1;
		}
		if (o->kind == OPT_INT)
			*(int *)(base + o->offset) = (int)n;
		else
			*(long *)(base + o->offset) = n;
		return 0;
	}
	case OPT_LEVEL:
		for (int i = 0; i < 8; i++) {
			if (strcmp(v, levels[i]) == 0) {
				c->log_level = i;
				return 0;
			}
		}
		snprintf(err, errlen, "%s%s: must be error, warning, notice, info or debug, got '%s'", where, o->name,
			 v);
		return -1;
	case OPT_LIST: {
		char **list = (char **)(base + o->offset);
		int *count = o->offset == OFF(tokens) ? &c->n_tokens : &c->n_data_roots;
		if (*count >= o->hi) {
			snprintf(err, errlen, "%s%s: at most %ld values", where, o->name, o->hi);
			return -1;
		}
		if (!*v) {
			snprintf(err, errlen, "%s%s: must not be empty", where, o->name);
			return -1;
		}
		list[(*count)++] = strdup(v);
		list[*count] = NULL;
		return 0;
	}
	case OPT_LISTEN: {
		const char *colon = strrchr(v, ':');
		if (!colon || colon == v) {
			snprintf(err, errlen, "%s%s: expected HOST:PORT, got '%s'", where, o->name, v);
			return -1;
		}
		errno = 0;
		long port = strtol(colon + 1, &end, 10);
		size_t hlen = (size_t)(colon - v);
		if (errno || !colon[1] || *end || port < 0 || port > 65535 || hlen >= sizeof c->listen_host) {
			snprintf(err, errlen, "%s%s: expected HOST:PORT with a port in [0, 65535], got '%s'", where,
				 o->name, v);
			return -1;
		}
		/* Accept "[::1]:8080" as well as "::1:8080"-free forms. */
		const char *h = v;
		if (h[0] == '[' && colon[-1] == ']') {
			h++;
			hlen -= 2;
		}
		memcpy(c->listen_host, h, hlen);
		c->listen_host[hlen] = 0;
		c->listen_port = (int)port;
		return 0;
	}
	}
	return -1;
}

/* What a reload (SIGHUP, POST /reload) applies; the rest needs a restart
 * (the listener, the store, the devices are set up once). */
static const char *const reloadable[] = {"log-level", "max-body", "token", "token-file", "shutdown-grace", NULL};

static bool same_value(const struct tr_config *a, const struct tr_config *b, const struct option_row *o)
{
	const char *pa = (const char *)a + o->offset, *pb = (const char *)b + o->offset;
	switch (o->kind) {
	case OPT_STRING:
	case OPT_CHOICE:
		return strcmp(pa, pb) == 0;
	case OPT_INT:
		return *(const int *)pa == *(const int *)pb;
	case OPT_LONG:
		return *(const long *)pa == *(const long *)pb;
	case OPT_LLONG:
		return *(const long long *)pa == *(const long long *)pb;
	case OPT_LEVEL:
		return a->log_level == b->log_level;
	case OPT_LISTEN:
		return strcmp(a->listen_host, b->listen_host) == 0 && a->listen_port == b->listen_port;
	case OPT_LIST: {
		char *const *la = (char *const *)pa, *const *lb = (char *const *)pb;
		int i = 0;
		for (; la[i] && lb[i]; i++)
			if (strcmp(la[i], lb[i]) != 0)
				return false;
		return !la[i] && !lb[i];
	}
	}
	return false;
}

int tr_config_diff(const struct tr_config *a, const struct tr_config *b,
		   void (*fn)(const char *name, int reloadable, void *ud), void *ud)
{
	int n = 0;
	for (size_t i = 0; i < N_OPTIONS; i++) {
		if (same_value(a, b, &options[i]))
			continue;
		bool r = false;
		for (int k = 0; reloadable[k]; k++)
			r |= strcmp(reloadable[k], options[i].name) == 0;
		fn(options[i].name, r, ud);
		n++;
	}
	return n;
}

static const struct option_row *find(const char *name)
{
	for (size_t i = 0; i < N_OPTIONS; i++)
		if (strcmp(options[i].name, name) == 0)
			return &options[i];
	return NULL;
}

void tr_config_defaults(struct tr_config *c)
{
	memset(c, 0, sizeof *c);
	char err[256];
	for (size_t i = 0; i < N_OPTIONS; i++)
		if (options[i].def)
			set_value(c, &options[i], options[i].def, "", err, sizeof err);
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

static char *trim(char *s)
{
	while (*s == ' ' || *s == '\t')
		s++;
	char *e = s + strlen(s);
	while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r'))
		*--e = 0;
	return s;
}

int tr_config_load_file(struct tr_config *c, const char *path, char *err, size_t errlen)
{
	FILE *f = fopen(path, "r");
	if (!f) {
		snprintf(err, errlen, "--config %s: %s", path, strerror(errno));
		return -1;
	}
	char line[4096], where[1200];
	int lineno = 0, rc = 0;
	while (rc == 0 && fgets(line, sizeof line, f)) {
		lineno++;
		char *s = trim(line);
		if (!*s || *s == '#')
			continue;
		char *eq = strchr(s, '=');
		snprintf(where, sizeof where, "%s:%d: ", path, lineno);
		if (!eq) {
			snprintf(err, errlen, "%sexpected 'name = value'", where);
			rc = -1;
			break;
		}
		*eq = 0;
		char *name = trim(s), *value = trim(eq + 1);
		const struct option_row *o = find(name);
		if (!o) {
			snprintf(err, errlen, "%sunknown option '%s'", where, name);
			rc = -1;
			break;
		}
		rc = set_value(c, o, value, where, err, errlen);
	}
	fclose(f);
	return rc;
}

void tr_config_print_help(void)
{
	printf("usage: trainerd serve [--config FILE] [--OPTION VALUE]...\n\n"
	       "Options (also accepted in the config file as 'option = value'):\n");
	for (size_t i = 0; i < N_OPTIONS; i++) {
		const struct option_row *o = &options[i];
		printf("  --%-18s %s", o->name, o->help);
		if (o->def && *o->def)
			printf(" (default %s)", o->def);
		printf("\n");
	}
}

int tr_config_parse_args(struct tr_config *c, int argc, char **argv, char *err, size_t errlen)
{
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i];
		if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
			tr_config_print_help();
			return 1;
		}
		if (strncmp(a, "--", 2) != 0) {
			snprintf(err, errlen, "unexpected argument '%s'", a);
			return -1;
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
			snprintf(err, errlen, "--%s needs a value", name);
			return -1;
		}
		if (strcmp(name, "config") == 0) {
			if (tr_config_load_file(c, value, err, errlen) < 0)
				return -1;
			continue;
		}
		const struct option_row *o = find(name);
		if (!o) {
			snprintf(err, errlen, "unknown option '--%s' (see trainerd serve --help)", name);
			return -1;
		}
		if (set_value(c, o, value, "--", err, errlen) < 0)
			return -1;
	}
	return 0;
}
