/* `trainerd serve`: the daemon.
 *
 * Start-up order: block the termination signals (every thread inherits
 * the mask, so only the main loop ever sees them), open the store, pick the
 * devices, start the scheduler (which queues interrupted jobs again) and
 * the API (on the socket systemd passed, if any), announce the address,
 * and only then tell systemd READY=1.  The main thread then waits for a
 * signal: SIGHUP re-reads the configuration and applies what can change
 * at run time; SIGTERM shuts down in reverse: stop serving, stop jobs at a
 * step boundary (recorded as interrupted), close the database.
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "api/api.h"
#include "daemon/backend_open.h"
#include "daemon/cli.h"
#include "daemon/config.h"
#include "daemon/experiments.h"
#include "daemon/log.h"
#include "daemon/scheduler.h"
#include "daemon/service.h"
#include "daemon/state_dir.h"
#include "daemon/tokens.h"
#include "engine/backend.h"
#include "engine/data/image.h"
#include "engine/memory.h"
#include "storage/store.h"

/* OpenBLAS's; weak, as in daemon/main.c. */
extern int openblas_thread_timeout(void) __attribute__((weak));

/* One backend for every job: CUDA over all visible GPUs, else CPU
 * devices (daemon/backend_open.c says so when it falls back).  Per-job
 * settings such as the gemm precision are applied by each job's runner on
 * its own devices. */
static tr_backend_t *pick_backend(const struct tr_config *c, char *fallback, size_t fblen, char *err, size_t errlen)
{
	struct tr_backend_options o = {.cpu_devices = c->cpu_devices, .cuda_module = c->cuda_module};
	o.cpu_conv = strcmp(c->cpu_conv, "im2col") == 0   ? TR_CPU_CONV_IM2COL
		     : strcmp(c->cpu_conv, "onednn") == 0 ? TR_CPU_CONV_ONEDNN
							  : TR_CPU_CONV_AUTO;
	if (tr_backend_kind_parse(c->backend, &o.kind) < 0) {
		snprintf(err, errlen, "--backend: '%s' is not auto, cpu or cuda", c->backend);
		return NULL;
	}
	struct tr_error why;
	tr_backend_t *be = tr_daemon_backend_open(&o, false, fallback, fblen, &why);
	if (!be)
		snprintf(err, errlen, "--backend %s: %s", c->backend, why.message);
	return be;
}

/* listen.addr, for clients that find the port there (a test's harness,
 * trainctl).  Made beneath the directory's descriptor without following
 * a link (daemon/state_dir.h). */
static int write_listen_file(const struct tr_state_dir *sd, bool tls, const char *host, int port)
{
	char line[256];
	bool v6 = strchr(host, ':') != NULL;
	snprintf(line, sizeof line, "%s://%s%s%s:%d\n", tls ? "https" : "http", v6 ? "[" : "", host, v6 ? "]" : "",
		 port);
	return tr_state_dir_write_file(sd, "listen.addr", line);
}

/* The tokens in force: --token (admin) and the token file's. */
struct auth_state {
	struct tr_token_list file;
	int n_plain;
};

static int load_tokens(const struct tr_config *c, struct tr_token_list *out, struct tr_error *err)
{
	out->v = NULL;
	out->n = 0;
	if (!c->token_file[0])
		return 0;
	return tr_tokens_load(c->token_file, out, err);
}

/* Where a passed socket is bound, for the log and listen.addr. */
static void socket_host(int fd, char *host, size_t len)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof ss;
	snprintf(host, len, "127.0.0.1");
	if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0)
		return;
	if (ss.ss_family == AF_INET)
		inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, host, (socklen_t)len);
	else if (ss.ss_family == AF_INET6)
		inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, host, (socklen_t)len);
}

struct reload_log {
	char changed[512];
	char restart[512];
};

static void note_change(const char *name, int reloadable, void *ud)
{
	struct reload_log *rl = ud;
	char *buf = reloadable ? rl->changed : rl->restart;
	size_t used = strlen(buf);
	snprintf(buf + used, sizeof rl->changed - used, "%s%s", used ? ", " : "", name);
}

/* SIGHUP (systemctl reload) and POST /reload: re-reads the command line's
 * configuration (and so its --config file) and the token file, applies
 * what can change at run time and logs what changed; tokens by count and
 * role only.  A configuration that does not parse, or tokens that do not
 * load, leave everything as it was. */
static void reload(int argc, char **argv, struct tr_config *cur, struct auth_state *auth, tr_api_t *api)
{
	struct tr_config next;
	struct tr_token_list tokens = {0};
	struct reload_log rl = {"", ""};
	struct tr_error cerr = {0};
	tr_config_defaults(&next);
	if (tr_config_parse_args(&next, argc - 1, argv + 1, &cerr) != 0 || load_tokens(&next, &tokens, &cerr) < 0) {
		tr_log(TR_LOG_ERR, "reload failed, the running configuration stays: %s", cerr.message);
		goto out;
	}
	tr_config_diff(cur, &next, note_change, &rl);
	bool tokens_changed = !tr_tokens_equal(&tokens, &auth->file) || strstr(rl.changed, "token");
	if (tokens_changed) {
		if (tr_api_set_tokens(api, next.n_tokens ? (const char *const *)next.tokens : NULL, tokens.v, tokens.n,
				      &cerr) < 0) {
			tr_log(TR_LOG_ERR, "reload failed, the running configuration stays: %s", cerr.message);
			goto out;
		}
		char desc[128];
		tr_tokens_describe(&tokens, (size_t)next.n_tokens, desc, sizeof desc);
		tr_log(TR_LOG_NOTICE, "reload: tokens now %s", desc);
		tr_tokens_finish(&auth->file);
		auth->file = tokens;
		tokens = (struct tr_token_list){0};
		/* The lists move into cur below with the rest. */
		for (int i = 0; i < cur->n_tokens; i++)
			free(cur->tokens[i]);
		for (int i = 0; i <= next.n_tokens; i++)
			cur->tokens[i] = next.tokens[i];
		cur->n_tokens = next.n_tokens;
		auth->n_plain = next.n_tokens;
		next.n_tokens = 0;
		next.tokens[0] = NULL;
		snprintf(cur->token_file, sizeof cur->token_file, "%s", next.token_file);
	}
	if (cur->log_level != next.log_level) {
		tr_log(TR_LOG_NOTICE, "reload: log-level %d -> %d", cur->log_level, next.log_level);
		cur->log_level = next.log_level;
		tr_log_set_level(cur->log_level);
	}
	if (cur->max_body != next.max_body) {
		tr_log(TR_LOG_NOTICE, "reload: max-body %lld -> %lld bytes", (long long)cur->max_body,
		       (long long)next.max_body);
		cur->max_body = next.max_body;
		tr_api_set_max_body(api, (size_t)cur->max_body);
	}
	if (cur->shutdown_grace_s != next.shutdown_grace_s) {
		tr_log(TR_LOG_NOTICE, "reload: shutdown-grace %d -> %d s", cur->shutdown_grace_s,
		       next.shutdown_grace_s);
		cur->shutdown_grace_s = next.shutdown_grace_s;
	}
	if (rl.restart[0])
		tr_log(TR_LOG_WARN, "reload: %s changed; that takes a restart (systemctl restart trainerd)",
		       rl.restart);
	if (!rl.changed[0] && !tokens_changed)
		tr_log(TR_LOG_NOTICE, "reload: nothing that can change at run time changed");
out:
	tr_tokens_finish(&tokens);
	tr_config_finish(&next);
}

/* POST /reload: the same as SIGHUP, handled by the main loop. */
static int reload_op(void *ctx, struct tr_error *err)
{
	(void)ctx;
	if (kill(getpid(), SIGHUP) < 0)
		return tr_job_fail(err, TR_JOB_E_INTERNAL, NULL, "cannot signal the daemon: %s", strerror(errno));
	return 0;
}

int tr_cmd_serve(int argc, char **argv)
{
	struct tr_config cfg;
	char err[1024];
	struct tr_error cerr;
	tr_config_defaults(&cfg);
	int rc = tr_config_parse_args(&cfg, argc - 1, argv + 1, &cerr);
	if (rc != 0) {
		if (rc < 0)
			fprintf(stderr, "trainerd serve: %s\n", cerr.message);
		tr_config_finish(&cfg);
		return rc < 0 ? 2 : 0;
	}
	tr_log_init();
	tr_log_set_times(true);
	tr_log_set_level(cfg.log_level);

	sigset_t sigs;
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);

	int exit_code = 1;
	tr_store_t *store = NULL;
	tr_backend_t *be = NULL;
	tr_scheduler_t *sched = NULL;
	tr_api_t *api = NULL;
	tr_experiments_t *experiments = NULL;
	tr_datasets_t *datasets = NULL;
	tr_service_t *svc = tr_service_create();
	struct auth_state auth = {.n_plain = cfg.n_tokens};
	char fallback[600] = "";

	struct tr_error serr;
	/* First: another daemon's state must not be touched, not even read. */
	struct tr_state_dir sd;
	if (tr_state_dir_open(cfg.state_dir, &sd, &serr) < 0) {
		tr_log(TR_LOG_ERR, "%s", serr.message);
		goto out;
	}
	int listen_fd = tr_service_listen_fd(&serr);
	if (listen_fd == -2) {
		tr_log(TR_LOG_ERR, "%s", serr.message);
		goto out;
	}
	if (load_tokens(&cfg, &auth.file, &serr) < 0) {
		tr_log(TR_LOG_ERR, "%s", serr.message);
		goto out;
	}
	char db[1200];
	/* the measured conv2d routes of this machine (docs/design.md,
	 * "Convolution on CPU devices") */
	char routes[1100];
	snprintf(routes, sizeof routes, "%s/conv_routes.json", cfg.state_dir);
	tr_cpu_conv_cache_open(routes);
	snprintf(db, sizeof db, "%s/trainerd.db", cfg.state_dir);
	struct tr_store_options sopt = {.metrics_queue_max = (size_t)cfg.metrics_queue,
					.max_bytes = (int64_t)cfg.state_max_bytes};
	if (tr_store_open(db, &sopt, &store, &serr) < 0) {
		tr_log(TR_LOG_ERR, "%s", serr.message);
		goto out;
	}
	if (!(be = pick_backend(&cfg, fallback, sizeof fallback, err, sizeof err))) {
		tr_log(TR_LOG_ERR, "%s", err);
		goto out;
	}
	char dsdir[PATH_MAX + 16];
	if (!realpath(cfg.state_dir, dsdir)) {
		tr_log(TR_LOG_ERR, "--state-dir %s: %s", cfg.state_dir, strerror(errno));
		goto out;
	}
	strcat(dsdir, "/datasets");
	if (tr_datasets_create(dsdir, (int64_t)cfg.datasets_max_bytes, &datasets, &serr) < 0) {
		tr_log(TR_LOG_ERR, "datasets: %s", serr.message);
		goto out;
	}
	tr_datasets_set_max_files(datasets, cfg.datasets_max_files);
	/* What daemon/main.c set, as OpenBLAS read it back. */
	if (be->i->kind == TR_BACKEND_KIND_CPU && openblas_thread_timeout && openblas_thread_timeout() > 0)
		tr_log(TR_LOG_INF, "BLAS workers sleep after 2^%d cycles without work (OPENBLAS_THREAD_TIMEOUT)",
		       openblas_thread_timeout());
	tr_image_set_max_pixels(cfg.image_max_pixels);
	tr_mem_set_available((uint64_t)cfg.memory_available);
	struct tr_scheduler_config scfg = {
		.store = store,
		.backend = be,
		.data_roots = (const char *const *)cfg.data_roots,
		.datasets_dir = tr_datasets_dir(datasets),
		.max_queued = cfg.max_queued_jobs,
		.max_job_crashes = cfg.max_job_crashes,
		.preemption = {.enabled = cfg.preemption_enabled,
			       .grace_s = cfg.preemption_grace_s,
			       .min_run_s = cfg.preemption_min_run_s},
		.allocator_slurm = cfg.allocator == 1,
		.slurm_bin_dir = cfg.slurm_bin_dir,
		.report_url = cfg.report_url,
		.state_dir = cfg.state_dir,
	};
	struct tr_error scerr = {0};
	if (tr_scheduler_create(&scfg, &sched, &scerr) < 0 || tr_scheduler_start(sched, &scerr) < 0) {
		tr_log(TR_LOG_ERR, "%s", scerr.message);
		goto out;
	}
	/* The passed socket's address, for the log and listen.addr; cfg keeps
	 * the configured one, so a reload does not see it as changed. */
	char host[128];
	snprintf(host, sizeof host, "%s", cfg.listen_host);
	if (listen_fd >= 0)
		socket_host(listen_fd, host, sizeof host);
	struct tr_api_config acfg = {
		.listen_host = host,
		.port = cfg.listen_port,
		.use_listen_fd = listen_fd >= 0,
		.listen_fd = listen_fd,
		.max_body = (size_t)cfg.max_body,
		.sse_heartbeat_s = cfg.sse_heartbeat_s,
		.max_connections = cfg.max_connections,
		.max_connections_per_client = cfg.max_connections_per_client,
		.connection_reserve = cfg.connection_reserve,
		.request_timeout_s = cfg.request_timeout_s,
		.max_streams = cfg.max_streams,
		.max_streams_per_client = cfg.max_streams_per_client,
		.sse_buffer_bytes = (size_t)cfg.sse_buffer,
		.sse_stall_s = cfg.sse_stall_s,
		.tokens = cfg.n_tokens ? (const char *const *)cfg.tokens : NULL,
		.role_tokens = auth.file.v,
		.n_role_tokens = auth.file.n,
		.tls_cert_path = cfg.tls_cert[0] ? cfg.tls_cert : NULL,
		.tls_key_path = cfg.tls_key[0] ? cfg.tls_key : NULL,
		.openapi_path = cfg.openapi_path[0] ? cfg.openapi_path : NULL,
		.version = TR_VERSION,
		.store = store,
		.datasets = datasets,
	};
	tr_scheduler_api_ops(sched, &acfg.ops, &acfg.ctx);
	acfg.ops.reload = reload_op;
	if (!(experiments = tr_experiments_start(sched, &scerr))) {
		tr_log(TR_LOG_ERR, "%s", scerr.message);
		goto out;
	}
	tr_experiments_api_ops(&acfg.ops);
	struct tr_error aerr;
	if (!(api = tr_api_start(&acfg, &aerr))) {
		tr_log(TR_LOG_ERR, "%s", aerr.message);
		goto out;
	}
	int port = tr_api_port(api);
	bool tls = tr_api_is_tls(api);
	int wrc = write_listen_file(&sd, tls, host, port);
	if (wrc < 0)
		tr_log(TR_LOG_WARN, "cannot write %s/listen.addr: %s", cfg.state_dir, strerror(-wrc));
	bool v6 = strchr(host, ':') != NULL;
	int ndev = be->i->device_count(be);
	tr_log(TR_LOG_NOTICE, "listening on %s://%s%s%s:%d%s (%d %s devices, state in %s)", tls ? "https" : "http",
	       v6 ? "[" : "", host, v6 ? "]" : "", port, listen_fd >= 0 ? ", socket from systemd" : "", ndev,
	       be->i->name, cfg.state_dir);
	if (cfg.submit_if_empty[0] && tr_scheduler_submit_if_empty(sched, cfg.submit_if_empty, &scerr) < 0)
		tr_log(TR_LOG_WARN, "--submit-if-empty: %s", scerr.message);
	char devices[700];
	snprintf(devices, sizeof devices, "%d %s device%s%s%s%s", ndev, be->i->name, ndev == 1 ? "" : "s",
		 fallback[0] ? " (" : "", fallback, fallback[0] ? ")" : "");
	tr_service_ready(svc, api, sched, devices);

	for (;;) {
		int sig = sigwaitinfo(&sigs, NULL);
		if (sig < 0 && errno == EINTR)
			continue;
		if (sig == SIGHUP) {
			tr_log(TR_LOG_NOTICE, "reloading the configuration");
			tr_service_reloading(svc, 0);
			reload(argc, argv, &cfg, &auth, api);
			tr_service_reloading(svc, 1);
			continue;
		}
		tr_log(TR_LOG_NOTICE, "%s received: stopping jobs at a step boundary",
		       sig == SIGTERM ? "SIGTERM" : "SIGINT");
		break;
	}
	exit_code = 0;
out:
	/* STOPPING=1, then more stop time while jobs write their final
	 * checkpoints (the service thread renews it). */
	tr_service_stopping(svc);
	tr_api_stop(api);
	tr_experiments_stop(experiments);
	if (sched)
		tr_scheduler_shutdown(sched, cfg.shutdown_grace_s);
	tr_service_destroy(svc);
	tr_scheduler_destroy(sched);
	tr_datasets_destroy(datasets);
	if (store) {
		/* State changes storage refused until now (docs/design.md,
		 * "Storage failures"): saved beside the database for the next
		 * start, or, when even that fails, named here as lost. */
		char msg[2048];
		int n = tr_store_job_states_save(store, msg, sizeof msg);
		if (n > 0)
			tr_log(TR_LOG_WARN, "%s", msg);
		else if (n < 0)
			tr_log(TR_LOG_ERR,
			       "%s after a restart these jobs show their last written state; one "
			       "written as running is queued again and resumes from its newest checkpoint",
			       msg);
	}
	tr_store_close(store);
	tr_backend_destroy(be);
	tr_tokens_finish(&auth.file);
	tr_state_dir_close(&sd);
	tr_config_finish(&cfg);
	if (exit_code == 0)
		tr_log(TR_LOG_NOTICE, "stopped");
	return exit_code;
}
