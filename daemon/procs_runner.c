/* The runner of a job of several processes (docs/design.md,
 * "Multi-process jobs"): the job runs as `mpirun -n N trainerd run` (or
 * TRAINERD_MPIRUN's launcher) in its folder STATE_DIR/procs/job-ID, never
 * in the daemon, which does not load the MPI module and so cannot hang in
 * a collective.  The launcher leads a session of its own: Open MPI puts
 * each rank in a process group of its own, but all stay in that session,
 * so "every process of the group" is every process of the session, found
 * in /proc and ended by pid.  The runner tails the worker's metrics into
 * the store, maps cancel (the session killed) and stop or pause (SIGUSR1
 * to the launcher, which passes it to every rank: they agree on a step
 * and rank 0 writes the checkpoint), restarts a failed group from its
 * checkpoint up to max_restarts times, and stores the final checkpoint as
 * the job's. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "daemon/log.h"
#include "daemon/scheduler_internal.h"
#include "daemon/worker_job.h"

#define POLL_MS 100
/* How long a group asked to stop at a daemon shutdown may take to write
 * its checkpoint before it is killed. */
#define SHUTDOWN_WAIT_S 10

struct pjob {
	struct tr_worker_job w; /* the job, its folder and metrics tail */
	char worker[PATH_MAX];
	int nproc, devices; /* ranks, devices per rank */
	pid_t launcher;     /* also the session id of the group; 0 = none */
	off_t out_from;     /* where this start's output begins in launcher.out */
	int restarts;
	bool stop_sent;
};

static void folder_path(const struct pjob *pj, const char *name, char *buf, size_t n)
{
	snprintf(buf, n, "%s/%s", pj->w.dir, name);
}

static bool file_exists(const struct pjob *pj, const char *name)
{
	char path[1200];
	folder_path(pj, name, path, sizeof path);
	return access(path, F_OK) == 0;
}

/* The session of process `pid` from /proc/PID/stat, -1 when it is gone
 * or a zombie (already dead, waiting to be reaped). */
static pid_t session_of(pid_t pid)
{
	char path[64], buf[512];
	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = 0;
	/* "PID (COMM) STATE PPID PGRP SESSION ...": COMM may hold spaces. */
	char *p = strrchr(buf, ')');
	char state;
	int ppid, pgrp, session;
	if (!p || sscanf(p + 1, " %c %d %d %d", &state, &ppid, &pgrp, &session) != 4 || state == 'Z')
		return -1;
	return session;
}

/* Whether process pid's command line holds `text` (the job's folder). */
static bool cmdline_holds(pid_t pid, const char *text)
{
	char path[64], buf[8192];
	snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return false;
	for (ssize_t i = 0; i < n; i++)
		if (!buf[i])
			buf[i] = ' ';
	buf[n] = 0;
	return strstr(buf, text) != NULL;
}

/* Sends sig to every live process of session sid (whose command line
 * holds `only`, when not NULL); returns how many. */
static int signal_session(pid_t sid, int sig, const char *only)
{
	DIR *d = opendir("/proc");
	if (!d)
		return 0;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		char *end;
		long pid = strtol(e->d_name, &end, 10);
		if (*end || pid <= 1 || session_of((pid_t)pid) != sid || (only && !cmdline_holds((pid_t)pid, only)))
			continue;
		if (kill((pid_t)pid, sig) == 0)
			n++;
	}
	closedir(d);
	return n;
}

/* Kills every process left in session sid (see signal_session for
 * `only`) and waits (bounded) until none is alive.  Returns how many were
 * still alive at the end. */
static int end_session(pid_t sid, const char *only)
{
	int left = 0;
	for (int round = 0; round < 100; round++) {
		if ((left = signal_session(sid, SIGKILL, only)) == 0)
			return 0;
		struct timespec ts = {.tv_sec = 0, .tv_nsec = 20 * 1000000L};
		nanosleep(&ts, NULL);
	}
	return left;
}

/* A daemon that died under a running group (kill -9, a crash) left its
 * session behind: its id is in the folder, and the next runner ends it
 * before it starts the group again. */
static void end_leftover_group(struct pjob *pj)
{
	char path[1200];
	folder_path(pj, "launcher.pid", path, sizeof path);
	FILE *f = fopen(path, "r");
	int sid = 0;
	if (!f)
		return;
	bool ok = fscanf(f, "%d", &sid) == 1 && sid > 1;
	fclose(f);
	unlink(path);
	/* Only the processes of this job's group, whose command lines name
	 * its folder: after a reboot the id may name someone else's session. */
	if (!ok || sid == getsid(0))
		return;
	int n = signal_session(sid, 0, pj->w.dir);
	if (n > 0) {
		tr_wjob_log(&pj->w, TR_LOG_NOTICE,
			    "%d process(es) of the group started before the daemon restarted were still running "
			    "(session %d); ended",
			    n, sid);
		end_session(sid, pj->w.dir);
	}
}

/* Starts the group: fresh, or from the folder's checkpoint when there is
 * one (a restart after a failure, a resume after pause or stop, a daemon
 * restart).  0, or -errno with msg saying why. */
static int start_group(struct pjob *pj, char *msg, size_t msglen)
{
	struct tr_error err = {0};
	if (tr_wjob_write_spec(&pj->w, &err) < 0) {
		snprintf(msg, msglen, "%s", err.message);
		return -EIO;
	}
	bool resume = file_exists(pj, "checkpoint.safetensors") && file_exists(pj, "spec.json");
	char spec[1200], out[1200], count[16], devices[16], summary[1200];
	folder_path(pj, "job.json", spec, sizeof spec);
	folder_path(pj, "launcher.out", out, sizeof out);
	folder_path(pj, "summary.json", summary, sizeof summary);
	unlink(summary); /* a previous start's: this one writes its own */
	snprintf(count, sizeof count, "%d", pj->nproc);
	snprintf(devices, sizeof devices, "%d", pj->devices);
	const char *mpirun = getenv("TRAINERD_MPIRUN");
	if (!mpirun || !*mpirun)
		mpirun = "mpirun";
	char *argv[] = {
		(char *)mpirun, "-n",        count,   pj->worker,  "run", spec,      resume ? "--resume" : "--out",
		pj->w.dir,      "--devices", devices, "--backend", "cpu", "--quiet", NULL};
	int fd = open(out, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	if (fd < 0) {
		snprintf(msg, msglen, "cannot open %.900s: %s", out, strerror(errno));
		return -errno;
	}
	struct stat sb;
	pj->out_from = fstat(fd, &sb) == 0 ? sb.st_size : 0;
	dprintf(fd, "trainerd: job %lld start %d: %s -n %s %s run %s %s %s\n", (long long)pj->w.j->id, pj->restarts,
		mpirun, count, pj->worker, spec, resume ? "--resume" : "--out", pj->w.dir);
	int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
	pid_t parent = getpid();
	pid_t pid = fork();
	if (pid == 0) {
		/* Only async-signal-safe calls until exec. */
		setsid();
		/* The daemon dying (the thread that forked, in fact) ends the
		 * launcher, which ends its ranks. */
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		if (getppid() != parent)
			_exit(127);
		if (devnull >= 0)
			dup2(devnull, 0);
		dup2(fd, 1);
		dup2(fd, 2);
		sigset_t all;
		sigemptyset(&all);
		sigprocmask(SIG_SETMASK, &all, NULL);
		execvp(mpirun, argv);
		static const char text[] = "trainerd: cannot start the launcher (install openmpi-bin, or set "
					   "TRAINERD_MPIRUN)\n";
		(void)!write(2, text, sizeof text - 1);
		_exit(127);
	}
	int e = errno;
	close(fd);
	if (devnull >= 0)
		close(devnull);
	if (pid < 0) {
		snprintf(msg, msglen, "fork: %s", strerror(e));
		return -e;
	}
	pj->launcher = pid;
	pj->stop_sent = false;
	char path[1200], text[32];
	folder_path(pj, "launcher.pid", path, sizeof path);
	snprintf(text, sizeof text, "%d\n", (int)pid);
	if (tr_wjob_write_text(path, text) < 0)
		tr_wjob_log(&pj->w, TR_LOG_WARN, "cannot write %s: a daemon killed now would leave the group running",
			    path);
	tr_wjob_log(&pj->w, TR_LOG_INF, "%s %d process(es) of %d device(s) (launcher pid %d, folder %s)",
		    resume ? "resumed from its checkpoint as" : "started as", pj->nproc, pj->devices, (int)pid,
		    pj->w.dir);
	return 0;
}

/* Ends whatever is left of the group (a rank the launcher did not end)
 * and forgets it.  status: the launcher's, when it was reaped. */
static void group_gone(struct pjob *pj)
{
	int left = end_session(pj->launcher, NULL);
	if (left)
		tr_wjob_log(&pj->w, TR_LOG_WARN, "%d process(es) of session %d did not end after SIGKILL", left,
			    (int)pj->launcher);
	char path[1200];
	folder_path(pj, "launcher.pid", path, sizeof path);
	unlink(path);
	pj->launcher = 0;
}

/* Kills the group now and reaps the launcher. */
static void kill_group(struct pjob *pj)
{
	if (pj->launcher <= 0)
		return;
	end_session(pj->launcher, NULL);
	while (waitpid(pj->launcher, NULL, 0) < 0 && errno == EINTR)
		;
	group_gone(pj);
}

/* Which rank failed and how, from this start's output: the rank's own
 * last words (a failed step, the collective_timeout_s watchdog), else
 * mpirun's report of a rank it saw die or fail. */
static void failure_cause(struct pjob *pj, int status, char *buf, size_t n)
{
	char path[1200];
	folder_path(pj, "launcher.out", path, sizeof path);
	FILE *f = fopen(path, "r");
	char line[1024], own[1024] = "", noticed[1024] = "", name[64] = "", code[32] = "";
	const char *refusal = NULL; /* mpirun's own refusal to start, in words a user can act on */
	if (f) {
		fseeko(f, pj->out_from, SEEK_SET);
		for (int i = 0; i < 100000 && fgets(line, sizeof line, f); i++) {
			line[strcspn(line, "\n")] = 0;
			const char *t = line + strspn(line, " ");
			if (!own[0] && !strncmp(t, "trainerd run: process ", 22))
				snprintf(own, sizeof own, "%s", t + 14);
			else if (!noticed[0] && strstr(t, "noticed that process rank"))
				snprintf(noticed, sizeof noticed, "%s", t);
			else if (!name[0] && !strncmp(t, "Process name:", 13))
				snprintf(name, sizeof name, "%s", t + 13 + strspn(t + 13, " "));
			else if (!code[0] && !strncmp(t, "Exit code:", 10))
				snprintf(code, sizeof code, "%s", t + 10 + strspn(t + 10, " "));
			else if (!refusal && strstr(t, "attempt to run as root"))
				refusal = "mpirun refuses to run as root: set OMPI_ALLOW_RUN_AS_ROOT=1 and "
					  "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 in the daemon's environment, or run "
					  "the daemon as another user";
			else if (!refusal && strstr(t, "not enough slots available"))
				refusal = "mpirun found fewer slots (cores) than processes: set "
					  "OMPI_MCA_rmaps_base_oversubscribe=1 in the daemon's environment, or "
					  "ask for fewer processes";
		}
		fclose(f);
	}
	/* "Process name: [[JOB,1],RANK]" */
	const char *rank = strrchr(name, ',');
	if (refusal)
		snprintf(buf, n, "%s (see %.900s)", refusal, path);
	else if (own[0])
		snprintf(buf, n, "%s", own);
	else if (noticed[0])
		snprintf(buf, n, "%s", noticed);
	else if (rank && code[0])
		snprintf(buf, n, "process rank %.*s exited with code %s", (int)strcspn(rank + 1, "]"), rank + 1, code);
	else if (WIFSIGNALED(status))
		snprintf(buf, n, "the launcher died of signal %d (see %.900s)", WTERMSIG(status), path);
	else
		snprintf(buf, n, "the launcher exited with status %d (see %.900s)", WEXITSTATUS(status), path);
}

static void set_restarts(struct pjob *pj)
{
	char text[16];
	snprintf(text, sizeof text, "%d", pj->restarts);
	tr_wjob_set_info(&pj->w, "process_restarts", json_string(text)); /* info fields are strings */
}

/* The launcher has exited with status: the job's end, or a restart. */
static bool launcher_ended(struct pjob *pj, int status)
{
	struct running_job *j = pj->w.j;
	group_gone(pj);
	tr_wjob_tail_metrics(&pj->w);
	char state[32] = "", error[512] = "", msg[1400];
	int64_t steps = 0, step = 0;
	bool have = tr_wjob_read_summary(&pj->w, state, sizeof state, error, sizeof error, &steps);
	if (atomic_load(&j->cancel_requested)) {
		tr_runner_finish(j, TR_JOB_CANCELLED, "cancelled", "cancelled by request", steps);
		return true;
	}
	bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
	if (clean && have && strcmp(state, "failed") != 0) {
		struct tr_error e = {0};
		if (tr_wjob_store_checkpoint(&pj->w, &step, &e) < 0) {
			snprintf(msg, sizeof msg,
				 "training ended at step %lld, but its final weights could not be stored: %s",
				 (long long)steps, e.message);
			tr_runner_finish(j, TR_JOB_FAILED, "checkpoint_failed", msg, steps);
			return true;
		}
		/* Where it ended, not its last logged loss. */
		tr_wjob_final_progress(&pj->w);
		bool stopped = !strcmp(state, "stopped");
		bool paused = stopped && atomic_load(&j->pause_requested);
		/* Preempted (daemon/preemption.c) at a step boundary: a
		 * client's pause or stop meanwhile wins. */
		bool preempted = stopped && !paused && atomic_load(&j->preempt_requested);
		tr_wjob_log(&pj->w, TR_LOG_NOTICE, "its %d processes %s at step %lld; the checkpoint is stored",
			    pj->nproc,
			    paused      ? "paused"
			    : preempted ? "were preempted"
			    : stopped   ? "stopped"
					: "completed",
			    (long long)step);
		if (preempted)
			tr_preempt_record(j, step);
		tr_runner_finish(j,
				 paused      ? TR_JOB_PAUSED
				 : preempted ? TR_JOB_PREEMPTED
				 : stopped   ? TR_JOB_STOPPED
					     : TR_JOB_COMPLETED,
				 NULL, NULL, step);
		return true;
	}
	char cause[1100];
	if (have && !strcmp(state, "failed"))
		snprintf(cause, sizeof cause, "training failed: %s", error);
	else
		failure_cause(pj, status, cause, sizeof cause);
	/* A failure of the training itself (bad data, NaN) fails again the
	 * same way: only a group that broke is restarted. */
	bool retry = !(have && !strcmp(state, "failed")) && pj->restarts < j->spec.max_restarts &&
		     !atomic_load(&j->stop_requested);
	if (!retry) {
		snprintf(msg, sizeof msg, "the group of %d processes failed%s: %s", pj->nproc,
			 pj->restarts ? " after its restarts (max_restarts)" : "", cause);
		tr_runner_finish(j, TR_JOB_FAILED, have ? "training_failed" : "process_failed", msg, steps);
		return true;
	}
	pj->restarts++;
	set_restarts(pj);
	bool from_ckpt = file_exists(pj, "checkpoint.safetensors") && file_exists(pj, "spec.json");
	tr_wjob_log(&pj->w, TR_LOG_WARN, "the group failed (%s); restart %d of %d from %s", cause, pj->restarts,
		    j->spec.max_restarts, from_ckpt ? "its last checkpoint" : "the start");
	if (start_group(pj, msg, sizeof msg) < 0) {
		tr_runner_finish(j, TR_JOB_FAILED, "start_failed", msg, steps);
		return true;
	}
	return false;
}

/* The step the tailed metrics have reached. */
static int64_t live_step(struct running_job *j)
{
	pthread_mutex_lock(&j->sched->lock);
	int64_t step = j->progress.step;
	pthread_mutex_unlock(&j->sched->lock);
	return step;
}

/* The restarts an earlier run of the job made (its info field), so that
 * a daemon restart neither shows them as 0 nor grants max_restarts anew. */
static int stored_restarts(struct running_job *j)
{
	struct tr_job_row row = {0};
	int n = 0;
	if (tr_store_job_get(j->sched->cfg.store, j->id, &row, NULL) == 0) {
		json_t *info = json_loads(row.info ? row.info : "{}", 0, NULL);
		const char *v = json_string_value(json_object_get(info, "process_restarts"));
		n = v ? atoi(v) : 0;
		json_decref(info);
		tr_job_row_finish(&row);
	}
	return n > 0 ? n : 0;
}

static void *procs_runner_main(void *arg)
{
	struct pjob pj = {.w.j = arg};
	struct running_job *j = pj.w.j;
	struct tr_scheduler *s = j->sched;
	struct tr_error err = {0};
	char name[16], msg[1400];
	snprintf(name, sizeof name, "tr-procs%lld", (long long)j->id);
	pthread_setname_np(pthread_self(), name);
	pj.nproc = j->spec.processes;
	pj.devices = j->ndev / pj.nproc;
	if (tr_wjob_make_dir(&pj.w, "procs", msg, sizeof msg) < 0) {
		tr_runner_finish(j, TR_JOB_FAILED, "start_failed", msg, 0);
		return NULL;
	}
	if (tr_wjob_worker_path(pj.worker, sizeof pj.worker, &err) < 0) {
		tr_runner_finish(j, TR_JOB_FAILED, "start_failed", err.message, 0);
		return NULL;
	}
	end_leftover_group(&pj);
	pj.restarts = stored_restarts(j);
	set_restarts(&pj);
	if (start_group(&pj, msg, sizeof msg) < 0) {
		tr_runner_finish(j, TR_JOB_FAILED, "start_failed", msg, 0);
		return NULL;
	}
	double shutdown_at = 0;
	for (;;) {
		pthread_mutex_lock(&s->lock);
		bool shutdown = s->shutting_down;
		pthread_mutex_unlock(&s->lock);
		if (atomic_load(&j->cancel_requested)) {
			kill_group(&pj);
			tr_wjob_tail_metrics(&pj.w);
			tr_wjob_log(&pj.w, TR_LOG_NOTICE, "cancelled: its %d processes were killed", pj.nproc);
			tr_runner_finish(j, TR_JOB_CANCELLED, "cancelled", "cancelled by request", live_step(j));
			return NULL;
		}
		if ((atomic_load(&j->stop_requested) || shutdown) && !pj.stop_sent) {
			/* mpirun passes USR1 on to every rank: they agree on a
			 * step, rank 0 writes the checkpoint, and all exit 0. */
			pj.stop_sent = true;
			kill(pj.launcher, SIGUSR1);
			if (shutdown)
				shutdown_at = tr_wjob_mono_s();
		}
		if (shutdown && tr_wjob_mono_s() - shutdown_at > SHUTDOWN_WAIT_S)
			kill_group(&pj);
		tr_wjob_tail_metrics(&pj.w);
		int status = 0;
		pid_t got = pj.launcher > 0 ? waitpid(pj.launcher, &status, WNOHANG) : -1;
		if (got < 0 && pj.launcher > 0 && errno == ECHILD) {
			/* Reaped elsewhere: its status is lost. */
			got = pj.launcher;
			status = 255 << 8;
		}
		if (shutdown && (got != 0)) {
			/* The next daemon resumes it from the folder's checkpoint. */
			if (pj.launcher > 0)
				group_gone(&pj);
			tr_wjob_tail_metrics(&pj.w);
			tr_wjob_log(&pj.w, TR_LOG_NOTICE,
				    "the daemon stops; its processes ended, and it resumes from its checkpoint at "
				    "restart");
			tr_runner_finish(j, TR_JOB_INTERRUPTED, NULL, NULL, live_step(j));
			return NULL;
		}
		if (got == pj.launcher && launcher_ended(&pj, status))
			return NULL;
		struct timespec ts = {.tv_sec = 0, .tv_nsec = POLL_MS * 1000000L};
		nanosleep(&ts, NULL);
	}
}

int tr_procs_runner_start(struct running_job *j, struct tr_error *err)
{
	if (pthread_create(&j->thread, NULL, procs_runner_main, j) != 0)
		return tr_error_set(err, -EAGAIN, 0, NULL, "cannot start the job's thread");
	return 0;
}
