/* `trainerd serve`: the daemon.
 *
 * Start-up order: block the termination signals (every thread inherits
 * the mask, so only the main loop ever sees them), open the store, pick the
 * devices, start the scheduler and the API, announce the address.  The
 * main thread then just waits for a signal; shutdown runs in reverse: stop
 * serving, stop jobs at a step boundary (recorded as interrupted), close
 * the database.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifdef TR_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

#include "api/api.h"
#include "daemon/cli.h"
#include "daemon/config.h"
#include "daemon/log.h"
#include "daemon/scheduler.h"
#include "engine/backend.h"
#include "storage/store.h"

static void notify(const char *state)
{
#ifdef TR_HAVE_SYSTEMD
	sd_notify(0, state);
#else
	(void)state;
#endif
}

/* One backend for every job: CUDA over all visible GPUs, else CPU
 * devices.  Falling back is worth one notice-level line with the reason
 * (no driver, no device, a build without CUDA): it is the difference
 * between a GPU machine and a slow one.  Per-job settings such as the
 * gemm precision are applied by each job's runner on its own devices. */
static tr_backend_t *pick_backend(const struct tr_config *c, char *err, size_t errlen)
{
	tr_backend_t *be = NULL;
	char why[512] = "";
	if (strcmp(c->backend, "cpu") != 0) {
		be = tr_cuda_backend_create(why, sizeof why);
		if (!be && strcmp(c->backend, "cuda") == 0) {
			snprintf(err, errlen, "--backend cuda: %s", why);
			return NULL;
		}
	}
	if (!be) {
		int n = c->cpu_devices;
		if (n == 0) {
			long cores = sysconf(_SC_NPROCESSORS_ONLN);
			n = cores > 0 ? (int)(cores < 64 ? cores : 64) : 1;
		}
		be = tr_cpu_backend_create(n, 0);
		if (!be)
			snprintf(err, errlen, "cannot create %d CPU devices", n);
		else if (why[0])
			tr_log(TR_LOG_NOTICE, "no usable GPU: %s; using %d CPU devices", why, n);
	}
	return be;
}

static int write_listen_file(const char *dir, const char *host, int port)
{
	char path[1200], tmp[1300];
	snprintf(path, sizeof path, "%s/listen.addr", dir);
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	FILE *f = fopen(tmp, "w");
	if (!f)
		return -errno;
	bool v6 = strchr(host, ':') != NULL;
	fprintf(f, "http://%s%s%s:%d\n", v6 ? "[" : "", host, v6 ? "]" : "", port);
	if (fclose(f) != 0 || rename(tmp, path) != 0)
		return -errno;
	return 0;
}

int tr_cmd_serve(int argc, char **argv)
{
	struct tr_config cfg;
	char err[1024];
	tr_config_defaults(&cfg);
	int rc = tr_config_parse_args(&cfg, argc - 1, argv + 1, err, sizeof err);
	if (rc != 0) {
		if (rc < 0)
			fprintf(stderr, "trainerd serve: %s\n", err);
		tr_config_finish(&cfg);
		return rc < 0 ? 2 : 0;
	}
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

	if (mkdir(cfg.state_dir, 0750) < 0 && errno != EEXIST) {
		tr_log(TR_LOG_ERR, "--state-dir %s: %s", cfg.state_dir, strerror(errno));
		goto out;
	}
	char db[1200];
	snprintf(db, sizeof db, "%s/trainerd.db", cfg.state_dir);
	struct tr_store_options sopt = {.metrics_queue_max = (size_t)cfg.metrics_queue,
					.max_bytes = (int64_t)cfg.state_max_bytes};
	if (tr_store_open(db, &sopt, &store, err, sizeof err) < 0) {
		tr_log(TR_LOG_ERR, "%s", err);
		goto out;
	}
	if (!(be = pick_backend(&cfg, err, sizeof err))) {
		tr_log(TR_LOG_ERR, "%s", err);
		goto out;
	}
	struct tr_scheduler_config scfg = {
		.store = store,
		.backend = be,
		.data_roots = (const char *const *)cfg.data_roots,
	};
	if (tr_scheduler_create(&scfg, &sched, err, sizeof err) < 0 || tr_scheduler_start(sched, err, sizeof err) < 0) {
		tr_log(TR_LOG_ERR, "%s", err);
		goto out;
	}
	struct tr_api_config acfg = {
		.listen_host = cfg.listen_host,
		.port = cfg.listen_port,
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
		.openapi_path = cfg.openapi_path[0] ? cfg.openapi_path : NULL,
		.version = TR_VERSION,
		.store = store,
	};
	tr_scheduler_api_ops(sched, &acfg.ops, &acfg.ctx);
	if (!(api = tr_api_start(&acfg, err, sizeof err))) {
		tr_log(TR_LOG_ERR, "%s", err);
		goto out;
	}
	int port = tr_api_port(api);
	if (write_listen_file(cfg.state_dir, cfg.listen_host, port) < 0)
		tr_log(TR_LOG_WARN, "cannot write %s/listen.addr: %s", cfg.state_dir, strerror(errno));
	bool v6 = strchr(cfg.listen_host, ':') != NULL;
	tr_log(TR_LOG_NOTICE, "listening on http://%s%s%s:%d (%d %s devices, state in %s)", v6 ? "[" : "",
	       cfg.listen_host, v6 ? "]" : "", port, be->i->device_count(be), be->i->name, cfg.state_dir);
	if (cfg.submit_if_empty[0] && tr_scheduler_submit_if_empty(sched, cfg.submit_if_empty, err, sizeof err) < 0)
		tr_log(TR_LOG_WARN, "--submit-if-empty: %s", err);
	notify("READY=1");

	for (;;) {
		int sig = sigwaitinfo(&sigs, NULL);
		if (sig < 0 && errno == EINTR)
			continue;
		if (sig == SIGHUP) {
			tr_log(TR_LOG_INF, "SIGHUP ignored: restart the daemon to change its configuration");
			continue;
		}
		tr_log(TR_LOG_NOTICE, "%s received: stopping jobs at a step boundary",
		       sig == SIGTERM ? "SIGTERM" : "SIGINT");
		break;
	}
	notify("STOPPING=1");
#ifdef TR_HAVE_SYSTEMD
	/* Jobs write a final checkpoint before they stop: ask systemd for the
	 * grace period rather than be killed in the middle of it. */
	sd_notifyf(0, "EXTEND_TIMEOUT_USEC=%llu", (unsigned long long)(cfg.shutdown_grace_s + 10) * 1000000ULL);
#endif
	exit_code = 0;
out:
	tr_api_stop(api);
	if (sched)
		tr_scheduler_shutdown(sched, cfg.shutdown_grace_s);
	tr_scheduler_destroy(sched);
	if (store) {
		/* State changes storage refused until now (docs/design.md,
		 * "Storage failures"): saved beside the database for the next
		 * start, or, when even that fails, named here as lost. */
		char msg[2048];
		int n = tr_store_job_states_save(store, msg, sizeof msg);
		if (n > 0)
			tr_log(TR_LOG_WARN, "%s", msg);
		else if (n < 0)
			tr_log(TR_LOG_ERR, "%s after a restart these jobs show their last written state; one "
					   "written as running is queued again and resumes from its newest checkpoint",
			       msg);
	}
	tr_store_close(store);
	tr_backend_destroy(be);
	tr_config_finish(&cfg);
	if (exit_code == 0)
		tr_log(TR_LOG_NOTICE, "stopped");
	return exit_code;
}
