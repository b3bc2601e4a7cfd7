/* trainctl's shared declarations: exit codes, the client connection, and
 * the entry point of each command.  The tool is split by concern:
 * http.c (libcurl requests, errors and exit codes), sse.c (the event
 * stream parser), output.c (tables, units, the progress bar), one file
 * per group of commands, and main.c (global options and dispatch).
 */
#ifndef TR_CTL_H
#define TR_CTL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/bytes.h"
#include "core/job.h"
#include "core/rfc3339.h"

/* Exit codes (docs/design.md, trainctl): documented in --help. */
enum {
	TR_CTL_OK = 0,
	TR_CTL_JOB_FAILED = 1,  /* the job failed or was cancelled */
	TR_CTL_USAGE = 2,       /* bad command line */
	TR_CTL_UNREACHABLE = 3, /* no answer from the daemon */
	TR_CTL_HTTP = 4,        /* the daemon answered with an error */
	TR_CTL_LOCAL = 5,       /* a local failure: a file, or a download that fails its checksum */
};

struct tr_ctl {
	char url[512]; /* base URL without a trailing slash */
	char *token;   /* bearer token or NULL */
	bool verbose;  /* -v: requests on stderr */
};

/* ---- http.c ---- */

struct tr_ctl_reply {
	long status;
	char *body; /* NUL-terminated */
	size_t len;
	json_t *json; /* parsed body when it is JSON, else NULL */
	char etag[80];
	char content_range[96];
};

void tr_ctl_reply_finish(struct tr_ctl_reply *r);
/* One request.  body may be NULL (then no Content-Type); headers is a
 * NULL-terminated list of extra "Name: value" lines or NULL.  Returns 0
 * with r filled (whatever the status), or TR_CTL_UNREACHABLE after
 * printing one line naming the URL and the cause. */
int tr_ctl_request(const struct tr_ctl *c, const char *method, const char *path, const char *body,
		   const char *const *headers, struct tr_ctl_reply *r);
/* A request that must succeed (2xx): returns 0 with r filled, or the exit
 * code after printing the error (the daemon's message for an HTTP error,
 * with a hint for 401/403). */
int tr_ctl_call(const struct tr_ctl *c, const char *method, const char *path, const char *body, struct tr_ctl_reply *r);
/* Prints the daemon's error in r and returns TR_CTL_HTTP. */
int tr_ctl_http_error(const struct tr_ctl *c, const struct tr_ctl_reply *r);

/* Streams a response body to a callback (return false to stop).  Returns
 * 0 when the transfer ended (check *status), TR_CTL_UNREACHABLE when the
 * connection could not be made or broke (no message printed: callers
 * that retry decide).  err receives the cause. */
typedef bool (*tr_ctl_sink_fn)(const char *data, size_t len, void *ud);
int tr_ctl_stream(const struct tr_ctl *c, const char *path, const char *const *headers, tr_ctl_sink_fn sink, void *ud,
		  struct tr_ctl_reply *r, char *err, size_t errlen);

/* PUTs a body read from source (curl's read callback: fill buf with up to
 * size * n bytes, return the count, 0 at the end) of `size` bytes to
 * path.  Returns like tr_ctl_stream. */
typedef size_t (*tr_ctl_source_fn)(char *buf, size_t size, size_t n, void *ud);
int tr_ctl_upload(const struct tr_ctl *c, const char *path, tr_ctl_source_fn source, void *ud, int64_t size,
		  struct tr_ctl_reply *r, char *err, size_t errlen);

/* ---- sse.c ---- */

/* An incremental Server-Sent Events parser: feed it bytes as they come,
 * it calls on_event for each complete event.  last_id keeps the last id
 * seen, for Last-Event-ID on reconnect. */
struct tr_sse {
	char *line;
	size_t len, cap;
	char *data;
	size_t dlen, dcap;
	char event[64];
	char id[32];      /* of the frame being read */
	char last_id[32]; /* of the last whole frame */
	bool (*on_event)(const char *event, const char *id, const char *data, void *ud);
	void *ud;
	bool stop;
	bool after_cr; /* the last byte fed was a CR: a LF next ends nothing */
};
void tr_sse_init(struct tr_sse *p, bool (*on_event)(const char *, const char *, const char *, void *), void *ud);
/* false when on_event asked to stop (or out of memory). */
bool tr_sse_feed(struct tr_sse *p, const char *buf, size_t len);
void tr_sse_finish(struct tr_sse *p);

/* ---- output.c ---- */

/* A table printed with aligned columns (two spaces between). */
struct tr_table {
	int ncols, nrows, cap;
	const char **heads;
	char **cells; /* nrows * ncols, owned */
	bool *right;  /* right-aligned columns (numbers) */
};
void tr_table_init(struct tr_table *t, int ncols, const char **heads, const bool *right);
void tr_table_add(struct tr_table *t, ...); /* ncols strings (NULL = "-") */
void tr_table_print(struct tr_table *t, FILE *out);
void tr_table_finish(struct tr_table *t);

void tr_fmt_duration(char *buf, size_t len, double s); /* 1:02:03, 4:05 */
/* An RFC 3339 time from the API as local "YYYY-MM-DD HH:MM:SS", or "-". */
void tr_fmt_time(char *buf, size_t len, const char *rfc3339);
/* Prints JSON indented, with a newline. */
void tr_print_json(const json_t *j, FILE *out);

/* The live line of `watch`: a bar redrawn in place on a terminal; plain
 * lines at most every few seconds otherwise. */
struct tr_bar {
	FILE *out;
	bool tty;
	bool drawn;  /* a bar is on the current line */
	double last; /* when it was last printed */
	double interval;
	int64_t printed_step; /* the step of the last progress printed */
};
struct tr_bar_state {
	int64_t step, total_steps, epoch, epochs;
	double loss, samples_per_sec, data_wait, eta_s;
};
void tr_bar_init(struct tr_bar *b, FILE *out, bool tty);
/* Prints the progress (rate-limited unless force). */
void tr_bar_update(struct tr_bar *b, const struct tr_bar_state *s, bool force);
/* Prints a whole line above the bar (the bar is redrawn by the next update). */
void tr_bar_line(struct tr_bar *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void tr_bar_finish(struct tr_bar *b);
double tr_mono_now(void);

/* ---- commands: argc/argv start at the command's name ---- */

int tr_cmd_submit(struct tr_ctl *c, int argc, char **argv);
int tr_cmd_ls(struct tr_ctl *c, int argc, char **argv);
int tr_cmd_show(struct tr_ctl *c, int argc, char **argv);
int tr_cmd_control(struct tr_ctl *c, int argc, char **argv); /* stop cancel pause resume */
int tr_cmd_delete(struct tr_ctl *c, int argc, char **argv);
int tr_cmd_priority(struct tr_ctl *c, int argc, char **argv);
int tr_cmd_watch(struct tr_ctl *c, int argc, char **argv);
int tr_cmd_metrics(struct tr_ctl *c, int argc, char **argv);
int tr_cmd_logs(struct tr_ctl *c, int argc, char **argv);
int tr_cmd_checkpoints(struct tr_ctl *c, int argc, char **argv);
int tr_cmd_download(struct tr_ctl *c, int argc, char **argv);
int tr_cmd_devices(struct tr_ctl *c, int argc, char **argv);
int tr_cmd_upload(struct tr_ctl *c, int argc, char **argv);
int tr_cmd_datasets(struct tr_ctl *c, int argc, char **argv);
int tr_cmd_dataset_rm(struct tr_ctl *c, int argc, char **argv);
int tr_cmd_version(struct tr_ctl *c, int argc, char **argv);
int tr_cmd_experiment(struct tr_ctl *c, int argc, char **argv); /* submit ls show cancel pause resume */
int tr_cmd_manifest(struct tr_ctl *c, int argc, char **argv);   /* offline: a spec as cluster objects */
/* All of f (a spec file, standard input), NUL-terminated; *len its
 * length.  malloc'd; NULL when out of memory. */
char *tr_ctl_read_all(FILE *f, size_t *len);
/* Reads the file named arg ("-": standard input) into *body (malloc'd);
 * 0, or TR_CTL_LOCAL after printing why. */
int tr_ctl_read_input(const char *arg, char **body, size_t *len);

/* Follows a job's events until it ends (watch, submit --wait): exit code
 * 0 completed, 1 failed or cancelled, 3 when the daemon stays away past
 * the reconnect timeout. */
int tr_ctl_follow(struct tr_ctl *c, int64_t id, bool logs_only, double reconnect_timeout_s);

/* ---- main.c helpers for commands ---- */

/* Prints "trainctl CMD: message" and the command's usage line; returns
 * TR_CTL_USAGE. */
int tr_ctl_usage(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prints the help of cmd and returns 0. */
int tr_ctl_help(const char *cmd);
/* A job id argument: a positive integer; -1 after printing a usage error. */
int64_t tr_ctl_job_id(const char *cmd, const char *arg);
/* argv[1] is --help or -h. */
bool tr_ctl_wants_help(int argc, char **argv);
/* The arguments of a command that takes one job id and one option without
 * a value (--flag or -letter: sets *set) besides --help: the job id (> 0);
 * 0 after printing the help, -TR_CTL_USAGE after a usage error (the
 * command returns the negation). */
int64_t tr_ctl_parse_id_args(const char *cmd, int argc, char **argv, const char *flag, int letter, bool *set);

#endif
