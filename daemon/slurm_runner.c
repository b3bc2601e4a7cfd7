/* The runner of a job the Slurm allocator runs (daemon/slurm.h): submits
 * it with sbatch (or finds the Slurm job it submitted before a restart),
 * follows it with scontrol, tails the worker's metrics into the store,
 * maps cancel, stop and pause onto scancel, and records how it ended. */
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "api/prometheus.h"
#include "core/rfc3339.h"
#include "daemon/job_token.h"
#include "daemon/log.h"
#include "daemon/scheduler_internal.h"
#include "daemon/slurm.h"
#include "daemon/worker_job.h"
#include "storage/checkpoints.h"

#define POLL_MS 500
#define CMD_TIMEOUT_S 30
/* A Slurm job asked to end (scancel) that is still not over after this
 * long is recorded as ended anyway, with a log line naming it. */
#define END_WAIT_S 60
/* Slurm's --output for a job whose node may not see its folder (a
 * report URL): a path every node has.  %j is Slurm's job id. */
#define NODE_OUTPUT "/tmp/trainerd-job-%lld-slurm-%%j.out"

struct sjob {
	struct tr_worker_job w; /* the job, its folder and metrics tail */
	const char *bin;
	char id[32]; /* the Slurm job id */
	struct tr_slurm_job_state st;
	int restarts_seen;
	bool cancel_sent, stop_sent;
	bool withdrawn; /* stopped or paused before Slurm started it: scancel'd while held */
	bool requeued;  /* info slurm_requeued */
	bool preempted; /* the job shows `preempted` (Slurm holds it after a requeue) */
	double end_asked_at;
};

/* The Slurm job id this job's folder names (written right after sbatch),
 * so a restarted daemon follows the job it submitted instead of
 * submitting it again. */
static bool read_slurm_id(struct sjob *sj)
{
	char path[PATH_MAX + 16];
	snprintf(path, sizeof path, "%s/slurm_job_id", sj->w.dir);
	FILE *f = fopen(path, "r");
	if (!f)
		return false;
	bool ok = fscanf(f, "%31[0-9]", sj->id) == 1;
	fclose(f);
	return ok;
}

static void forget_slurm_id(struct sjob *sj)
{
	char path[PATH_MAX + 16];
	snprintf(path, sizeof path, "%s/slurm_job_id", sj->w.dir);
	unlink(path);
}

static int submit(struct sjob *sj, struct tr_error *err)
{
	struct running_job *j = sj->w.j;
	char path[PATH_MAX + 16], worker[PATH_MAX];
	int rc = tr_wjob_write_spec(&sj->w, err);
	if (rc < 0 || (rc = tr_wjob_worker_path(worker, sizeof worker, err)) < 0)
		return rc;
	/* A new token for each submission: the worker reports with it
	 * (daemon/job_token.h); revoked as the job ends. */
	if ((rc = tr_job_token_issue(j->sched->cfg.store, j->id, sj->w.dir, err)) < 0)
		return rc;
	snprintf(path, sizeof path, "%s/job.sh", sj->w.dir);
	if ((rc = tr_slurm_write_script(path, j->id, sj->w.dir, worker, sj->bin, j->sched->cfg.report_url)) < 0)
		return tr_error_set(err, rc, 0, NULL, "cannot write %s: %s", path, strerror(-rc));

	const struct tr_resources *r = &j->spec.resources;
	char name[32], signal[32], out[1200], nodes[32], tasks[40], limit[32], part[80];
	snprintf(name, sizeof name, "--job-name=trainerd-%lld", (long long)j->id);
	snprintf(signal, sizeof signal, "--signal=B:USR1@%d", tr_slurm_signal_lead_s(r));
	/* Slurm's output where the node writes it: with a report URL the
	 * node need not see the job's folder, so on the node's /tmp (the
	 * failure message names it); else in the folder. */
	if (j->sched->cfg.report_url && j->sched->cfg.report_url[0])
		snprintf(out, sizeof out, "--output=" NODE_OUTPUT, (long long)j->id);
	else
		snprintf(out, sizeof out, "--output=%s/slurm-%%j.out", sj->w.dir);
	snprintf(nodes, sizeof nodes, "--nodes=%d", r->nodes > 0 ? r->nodes : 1);
	/* A spec of P processes without tasks of its own (a job of a daemon
	 * started with --allocator slurm) runs as P tasks on one node. */
	int per_node = r->tasks_per_node > 0 ? r->tasks_per_node : 1;
	if (r->nodes <= 1 && per_node == 1 && j->spec.processes > 1)
		per_node = j->spec.processes;
	snprintf(tasks, sizeof tasks, "--ntasks-per-node=%d", per_node);
	/* --open-mode=append: the output of every start, not only the last. */
	char *argv[16] = {"sbatch", "--parsable", "--requeue", "--open-mode=append", signal, name, out, nodes, tasks};
	int argc = 9;
	if (r->time_limit_s > 0) {
		snprintf(limit, sizeof limit, "--time=%d", (r->time_limit_s + 59) / 60); /* minutes */
		argv[argc++] = limit;
	}
	if (r->partition[0]) {
		snprintf(part, sizeof part, "--partition=%s", r->partition);
		argv[argc++] = part;
	}
	argv[argc++] = path;
	argv[argc] = NULL;
	char reply[1024];
	rc = tr_slurm_command(sj->bin, argv, reply, sizeof reply, CMD_TIMEOUT_S);
	/* --parsable: "ID" or "ID;CLUSTER". */
	size_t idlen = strspn(reply, "0123456789");
	if (rc != 0 || idlen == 0 || idlen >= sizeof sj->id) {
		reply[strcspn(reply, "\n")] = 0;
		return tr_error_set(err, -EIO, 0, NULL, "sbatch failed (%d): %s", rc, reply);
	}
	memcpy(sj->id, reply, idlen);
	sj->id[idlen] = 0;
	snprintf(path, sizeof path, "%s/slurm_job_id", sj->w.dir);
	if ((rc = tr_wjob_write_text(path, sj->id)) < 0)
		tr_wjob_log(&sj->w, TR_LOG_WARN, "cannot write %s (a restarted daemon will not find Slurm job %s): %s",
			    path, sj->id, strerror(-rc));
	return 0;
}

/* Slurm holds the job back after a requeue: it is `preempted`, with a
 * preemption record naming Slurm (written first: the state event carries
 * it), until Slurm starts it again.  Its runner follows it meanwhile, so
 * the dispatcher leaves it be (scheduler.c). */
static void show_preempted(struct sjob *sj, const struct tr_slurm_job_state *st)
{
	struct running_job *j = sj->w.j;
	tr_store_t *store = j->sched->cfg.store;
	char at[40] = "";
	tr_rfc3339_format((double)time(NULL), at, sizeof at);
	pthread_mutex_lock(&j->sched->lock);
	int priority = j->priority;
	pthread_mutex_unlock(&j->sched->lock);
	int64_t step = tr_slurm_checkpoint_step(sj->w.dir);
	char *record = tr_slurm_preemption_json(sj->id, st, priority, step, at);
	json_t *parsed = record ? json_loads(record, 0, NULL) : NULL;
	const char *message = json_string_value(json_object_get(parsed, "message"));
	struct tr_error e = {0};
	if (!record || tr_store_job_set_preemption(store, j->id, record, &e) < 0)
		tr_wjob_log(&sj->w, TR_LOG_WARN, "its preemption record is not stored: %s",
			    record ? e.message : "out of memory");
	if (tr_store_job_set_state(store, j->id, TR_JOB_PREEMPTED, NULL, NULL, &e) < 0)
		tr_wjob_log(&sj->w, TR_LOG_WARN, "cannot show it preempted: %s", e.message);
	tr_wjob_log(&sj->w, TR_LOG_NOTICE, "%s", message ? message : "preempted by Slurm");
	tr_prom_preemption(step < 0);
	json_decref(parsed);
	free(record);
	sj->preempted = true;
}

static void show_running_again(struct sjob *sj, const struct tr_slurm_job_state *st)
{
	struct tr_error e = {0};
	if (tr_store_job_set_state(sj->w.j->sched->cfg.store, sj->w.j->id, TR_JOB_RUNNING, NULL, NULL, &e) < 0)
		tr_wjob_log(&sj->w, TR_LOG_WARN, "cannot show it running again: %s", e.message);
	tr_wjob_log(&sj->w, TR_LOG_NOTICE, "Slurm started job %s again (restart %d): running, from its checkpoint",
		    sj->id, st->restarts);
	sj->preempted = false;
}

/* Asks Slurm for the job's state; false when it does not answer or no
 * longer knows the job (purged after MinJobAge). */
static bool poll_state(struct sjob *sj, char *why, size_t whylen)
{
	char out[4096];
	char *argv[] = {"scontrol", "show", "job", "-o", sj->id, NULL};
	int rc = tr_slurm_command(sj->bin, argv, out, sizeof out, CMD_TIMEOUT_S);
	struct tr_slurm_job_state st;
	if (rc != 0 || tr_slurm_parse_job(out, &st) < 0) {
		out[strcspn(out, "\n")] = 0;
		snprintf(why, whylen, "scontrol show job %s: %.400s", sj->id, out);
		return false;
	}
	if (strcmp(st.state, sj->st.state))
		tr_wjob_set_info(&sj->w, "slurm_state", json_string(st.state));
	/* Requeued and not running again yet: preempted, as far as the job
	 * is concerned (it resumes from its checkpoint when Slurm starts it). */
	bool requeued = st.restarts > 0 && strcmp(st.state, "RUNNING") != 0 && !tr_slurm_state_final(st.state);
	if (requeued != sj->requeued || !sj->st.state[0]) {
		sj->requeued = requeued;
		tr_wjob_set_info(&sj->w, "slurm_requeued", json_string(requeued ? "true" : "false"));
	}
	if (st.restarts != sj->st.restarts) {
		char n[16];
		snprintf(n, sizeof n, "%d", st.restarts);
		tr_wjob_set_info(&sj->w, "slurm_restarts", json_string(n)); /* info fields are strings */
		tr_wjob_log(&sj->w, TR_LOG_NOTICE,
			    "Slurm job %s was requeued (restart %d); it resumes from its checkpoint", sj->id,
			    st.restarts);
	}
	if (!sj->preempted && tr_slurm_held_after_requeue(&st))
		show_preempted(sj, &st);
	else if (sj->preempted && !strcmp(st.state, "RUNNING"))
		show_running_again(sj, &st);
	sj->st = st;
	return true;
}

static void scancel(struct sjob *sj, const char *signal)
{
	char out[512], sig[32];
	char *argv[6] = {"scancel", sj->id, NULL};
	if (signal) {
		snprintf(sig, sizeof sig, "--signal=%s", signal);
		/* Without --batch or --full: the steps (the worker), not the
		 * batch shell, which would die of TERM before its worker. */
		argv[1] = sig;
		argv[2] = sj->id;
		argv[3] = NULL;
	}
	int rc = tr_slurm_command(sj->bin, argv, out, sizeof out, CMD_TIMEOUT_S);
	if (rc != 0) {
		out[strcspn(out, "\n")] = 0;
		tr_wjob_log(&sj->w, TR_LOG_WARN, "scancel %s%s failed (%d): %s", signal ? "--signal " : "", sj->id, rc,
			    out);
	}
}

/* A stop or pause of a job Slurm has not started (PENDING, no worker to
 * checkpoint): `scontrol hold` first, so that it cannot start meanwhile,
 * then, if it is still PENDING, scancel; true then.  A job that runs
 * (a hold does not stop it) is released again: the worker is there to
 * get TERM. */
static bool withdraw_pending(struct sjob *sj)
{
	char out[512], why[512];
	char *hold[] = {"scontrol", "hold", sj->id, NULL};
	int rc = tr_slurm_command(sj->bin, hold, out, sizeof out, CMD_TIMEOUT_S);
	if (rc != 0)
		return false;
	if (poll_state(sj, why, sizeof why) && !strcmp(sj->st.state, "PENDING")) {
		sj->withdrawn = true;
		scancel(sj, NULL);
		tr_wjob_log(&sj->w, TR_LOG_NOTICE, "Slurm had not started job %s: held and cancelled (scancel)",
			    sj->id);
		return true;
	}
	char *release[] = {"scontrol", "release", sj->id, NULL};
	rc = tr_slurm_command(sj->bin, release, out, sizeof out, CMD_TIMEOUT_S);
	if (rc != 0) {
		out[strcspn(out, "\n")] = 0;
		tr_wjob_log(&sj->w, TR_LOG_WARN, "scontrol release %s failed (%d): %s", sj->id, rc, out);
	}
	return false;
}

/* The last lines of the Slurm job's output file, for a failure's message;
 * where the node wrote it, when it is not in the folder. */
static void output_tail(struct sjob *sj, char *buf, size_t n)
{
	char path[PATH_MAX + 64];
	snprintf(path, sizeof path, "%s/slurm-%s.out", sj->w.dir, sj->id);
	buf[0] = 0;
	FILE *f = fopen(path, "r");
	if (!f) {
		char node[96];
		snprintf(node, sizeof node, NODE_OUTPUT, (long long)sj->w.j->id);
		char *pct = strstr(node, "%j");
		if (pct)
			snprintf(pct, sizeof node - (size_t)(pct - node), "%s.out", sj->id);
		snprintf(buf, n, "; its output is %s on the node that ran it", node);
		return;
	}
	fseek(f, 0, SEEK_END);
	long size = ftell(f);
	long from = size > (long)n - 1 ? size - ((long)n - 1) : 0;
	fseek(f, from, SEEK_SET);
	size_t got = fread(buf, 1, n - 1, f);
	buf[got] = 0;
	fclose(f);
	for (char *p = buf; *p; p++)
		if (*p == '\n')
			*p = ' ';
	if (got > 0) {
		char *text = strdup(buf);
		snprintf(buf, n, "; its output ends: %s", text ? text : "");
		free(text);
	}
}

/* The Slurm job has ended (or Slurm no longer knows it): record the job's
 * end from Slurm's state and the worker's summary. */
static void ended(struct sjob *sj, const char *slurm_state)
{
	struct running_job *j = sj->w.j;
	tr_wjob_tail_metrics(&sj->w);
	/* Its worker reports nothing more. */
	tr_job_token_revoke(j->sched->cfg.store, j->id, sj->w.dir);
	char state[32], error[512], msg[1024], tail[400];
	int64_t steps = 0, step = 0;
	bool have = tr_wjob_read_summary(&sj->w, state, sizeof state, error, sizeof error, &steps);
	struct tr_error e = {0};
	forget_slurm_id(sj);
	tr_wjob_set_info(&sj->w, "slurm_state", json_string(slurm_state));
	if (sj->withdrawn && !atomic_load(&j->cancel_requested)) {
		/* As for a job in the local queue: a pause keeps its place to
		 * resume from (the folder's checkpoint, if an earlier start
		 * left one; a resume submits a new Slurm job), a stop of a job
		 * that never ran cancels it. */
		if (atomic_load(&j->pause_requested)) {
			int64_t at = tr_slurm_checkpoint_step(sj->w.dir);
			tr_wjob_log(&sj->w, TR_LOG_NOTICE,
				    "paused before Slurm started job %s; a resume submits it again", sj->id);
			tr_runner_finish(j, TR_JOB_PAUSED, NULL, NULL, at > 0 ? at : 0);
		} else {
			tr_runner_finish(
				j, TR_JOB_CANCELLED, "cancelled",
				"stopped before Slurm started it: the pending Slurm job was cancelled (scancel)",
				steps);
		}
		return;
	}
	if (!strcmp(slurm_state, "CANCELLED") || atomic_load(&j->cancel_requested)) {
		tr_runner_finish(j, TR_JOB_CANCELLED, "cancelled",
				 atomic_load(&j->cancel_requested) ? "cancelled by request (scancel)"
								   : "the Slurm job was cancelled (scancel)",
				 steps);
		return;
	}
	if (!strcmp(slurm_state, "COMPLETED") && have && strcmp(state, "failed") != 0) {
		if (tr_wjob_store_checkpoint(&sj->w, &step, &e) < 0) {
			snprintf(msg, sizeof msg,
				 "training ended at step %lld, but its final weights could not be stored: %s",
				 (long long)steps, e.message);
			tr_runner_finish(j, TR_JOB_FAILED, "checkpoint_failed", msg, steps);
			return;
		}
		/* Where it ended, not its last logged loss. */
		tr_wjob_final_progress(&sj->w);
		bool stopped = !strcmp(state, "stopped");
		bool paused = stopped && atomic_load(&j->pause_requested);
		tr_wjob_log(&sj->w, TR_LOG_NOTICE, "Slurm job %s %s at step %lld; its checkpoint is stored", sj->id,
			    paused    ? "paused"
			    : stopped ? "stopped"
				      : "completed",
			    (long long)step);
		tr_runner_finish(j,
				 paused    ? TR_JOB_PAUSED
				 : stopped ? TR_JOB_STOPPED
					   : TR_JOB_COMPLETED,
				 NULL, NULL, step);
		return;
	}
	output_tail(sj, tail, sizeof tail);
	if (have && !strcmp(state, "failed"))
		snprintf(msg, sizeof msg, "the worker failed in Slurm job %s: %s", sj->id, error);
	else
		snprintf(msg, sizeof msg, "Slurm job %s ended %s (exit code %d, signal %d)%s", sj->id, slurm_state,
			 sj->st.exit_code, sj->st.exit_signal, tail);
	tr_runner_finish(j, TR_JOB_FAILED, have && !strcmp(state, "failed") ? "training_failed" : "slurm_failed", msg,
			 steps);
}

static void *slurm_runner_main(void *arg)
{
	struct sjob sj = {.w.j = arg};
	struct running_job *j = sj.w.j;
	struct tr_scheduler *s = j->sched;
	struct tr_error err = {0};
	char name[16], msg[1400];
	snprintf(name, sizeof name, "tr-slurm%lld", (long long)j->id);
	pthread_setname_np(pthread_self(), name);
	sj.bin = s->cfg.slurm_bin_dir;
	if (tr_wjob_make_dir(&sj.w, "slurm", msg, sizeof msg) < 0) {
		tr_runner_finish(j, TR_JOB_FAILED, "start_failed", msg, 0);
		return NULL;
	}
	if (read_slurm_id(&sj)) {
		tr_wjob_log(&sj.w, TR_LOG_NOTICE,
			    "following Slurm job %s again (submitted before the daemon restarted)", sj.id);
	} else if (submit(&sj, &err) < 0) {
		tr_job_token_revoke(s->cfg.store, j->id, sj.w.dir);
		tr_runner_finish(j, TR_JOB_FAILED, "slurm_submit_failed", err.message, 0);
		return NULL;
	} else {
		tr_wjob_log(&sj.w, TR_LOG_INF, "submitted to Slurm as job %s (folder %s)", sj.id, sj.w.dir);
	}
	tr_wjob_set_info(&sj.w, "slurm_job_id", json_string(sj.id));
	char why[512] = "";
	int unknown = 0;
	for (;;) {
		pthread_mutex_lock(&s->lock);
		bool shutdown = s->shutting_down;
		pthread_mutex_unlock(&s->lock);
		if (shutdown) {
			/* The Slurm job runs on; the next daemon follows it. */
			tr_wjob_log(&sj.w, TR_LOG_NOTICE,
				    "the daemon stops; Slurm job %s runs on and is followed again at restart", sj.id);
			pthread_mutex_lock(&s->lock);
			int64_t step = j->progress.step;
			pthread_mutex_unlock(&s->lock);
			tr_runner_finish(j, TR_JOB_INTERRUPTED, NULL, NULL, step);
			return NULL;
		}
		if (atomic_load(&j->cancel_requested) && !sj.cancel_sent) {
			sj.cancel_sent = true;
			sj.end_asked_at = tr_wjob_mono_s();
			scancel(&sj, NULL);
		} else if (atomic_load(&j->stop_requested) && !sj.stop_sent && !sj.cancel_sent) {
			/* TERM: the worker checkpoints at its next step and ends "stopped". */
			sj.stop_sent = true;
			sj.end_asked_at = tr_wjob_mono_s();
			if (!withdraw_pending(&sj))
				scancel(&sj, "TERM");
		}
		tr_wjob_tail_metrics(&sj.w);
		if (poll_state(&sj, why, sizeof why)) {
			unknown = 0;
			if (tr_slurm_state_final(sj.st.state)) {
				ended(&sj, sj.st.state);
				return NULL;
			}
		} else if (++unknown * POLL_MS >= CMD_TIMEOUT_S * 1000) {
			/* Slurm has forgotten the job (or does not answer): the
			 * worker's summary says how it ended, if it did. */
			char state[32], error[8];
			int64_t steps;
			bool done = tr_wjob_read_summary(&sj.w, state, sizeof state, error, sizeof error, &steps);
			tr_wjob_log(&sj.w, TR_LOG_WARN, "%s", why);
			ended(&sj, done ? "COMPLETED" : "UNKNOWN");
			return NULL;
		}
		if (sj.end_asked_at > 0 && tr_wjob_mono_s() - sj.end_asked_at > END_WAIT_S) {
			tr_wjob_log(&sj.w, TR_LOG_WARN, "Slurm job %s did not end within %d s of scancel", sj.id,
				    END_WAIT_S);
			ended(&sj, sj.cancel_sent ? "CANCELLED" : "UNKNOWN");
			return NULL;
		}
		struct timespec ts = {.tv_sec = 0, .tv_nsec = POLL_MS * 1000000L};
		nanosleep(&ts, NULL);
	}
}

int tr_slurm_runner_start(struct running_job *j, struct tr_error *err)
{
	if (pthread_create(&j->thread, NULL, slurm_runner_main, j) != 0)
		return tr_error_set(err, -EAGAIN, 0, NULL, "cannot start the job's thread");
	return 0;
}
