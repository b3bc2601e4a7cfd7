/* trainerd serve's configuration: one table gives every option's name,
 * default, parser, validation and help text, used alike by the command
 * line (--name VALUE), the config file (name = value) and `--help`. */
#ifndef TR_DAEMON_CONFIG_H
#define TR_DAEMON_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

#define TR_CONFIG_MAX_ROOTS 16
#define TR_CONFIG_MAX_TOKENS 16

struct tr_config {
	char listen_host[128];
	int listen_port;
	char state_dir[1024];
	char *data_roots[TR_CONFIG_MAX_ROOTS + 1]; /* NULL-terminated */
	int n_data_roots;
	int cpu_devices;        /* 0 = one per core */
	char backend[16];       /* auto | cpu | cuda */
	char cuda_module[1024]; /* trainerd-cuda.so; "" = search (engine/cuda/module.h) */
	char cpu_conv[16];      /* auto | im2col | onednn */
	int64_t max_body;       /* bytes */
	int log_level;          /* syslog priority: 0..7 */
	int sse_heartbeat_s;
	int max_connections;            /* HTTP connections, all clients */
	int max_connections_per_client; /* of one client address */
	int connection_reserve;         /* slots kept for addresses holding few connections */
	int request_timeout_s;          /* a request's headers and body must arrive within this */
	int max_streams;                /* open event streams, all clients */
	int max_streams_per_client;     /* of one client address */
	int64_t sse_buffer;             /* event bytes one stream holds at a time */
	int max_queued_jobs;            /* queued jobs at once; 0 = no limit */
	int sse_stall_s;                /* a stream whose client reads nothing for this long is closed; 0 = auto */
	int shutdown_grace_s;           /* SIGTERM: stop jobs at a step boundary within this */
	int64_t metrics_queue;          /* points buffered before drops */
	int64_t state_max_bytes;        /* database size cap, 0 = none */
	int64_t datasets_max_bytes;     /* uploaded datasets together, 0 = none */
	int64_t datasets_max_files;     /* uploaded files together, 0 = none */
	int64_t image_max_pixels;       /* width x height one image may decode to */
	int max_job_crashes;            /* daemon deaths a job may be running at before it fails; 0 = no limit */
	int64_t memory_available;       /* bytes jobs may use; 0 = MemAvailable at each admission */
	bool preemption_enabled;        /* [preemption] enabled: higher priorities preempt preemptible jobs */
	int preemption_grace_s;         /* [preemption] grace: seconds to a step boundary before a hard stop */
	int preemption_min_run_s;       /* [preemption] min-run: seconds a job runs before it may be preempted */
	int allocator;                  /* jobs without "resources": 0 local, 1 slurm (daemon/slurm.c) */
	char slurm_bin_dir[1024];       /* where sbatch, squeue, scontrol, scancel are; "" = PATH */
	char report_url[1024];          /* where a Slurm job's worker reports; "" = it does not */
	char *tokens[TR_CONFIG_MAX_TOKENS + 1]; /* NULL-terminated */
	int n_tokens;
	char token_file[1024]; /* role:token lines; see daemon/tokens.c */
	char tls_cert[1024];   /* PEM; with tls_key the API serves HTTPS */
	char tls_key[1024];
	char openapi_path[1024];
	char submit_if_empty[1024]; /* a job spec submitted when the queue has never had a job */
};

/* Fills defaults. */
void tr_config_defaults(struct tr_config *c);
/* Applies argv (after "serve"); a --config FILE is read where it appears,
 * so later flags override it.  Returns 0, 1 when --help was printed, or a
 * negative errno (-EINVAL; the file's open error) with a message naming
 * the flag, file and line in err (core/error.h; pointer ""). */
int tr_config_parse_args(struct tr_config *c, int argc, char **argv, struct tr_error *err);
int tr_config_load_file(struct tr_config *c, const char *path, struct tr_error *err);
void tr_config_print_help(void);
/* Calls fn with the name of every option whose value differs between a
 * and b, and whether a running daemon applies it on reload (SIGHUP);
 * returns how many differ. */
int tr_config_diff(const struct tr_config *a, const struct tr_config *b,
		   void (*fn)(const char *name, int reloadable, void *ud), void *ud);
void tr_config_finish(struct tr_config *c);

#endif
