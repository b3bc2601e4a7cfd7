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
#include "daemon/log.h"
#include "daemon/scheduler_internal.h"
#include "daemon/slurm.h"
#include "storage/checkpoints.h"

#define POLL_MS 500
#define CMD_TIMEOUT_S 30
/* A Slurm job asked to end (scancel) that is still not over after this
 * long is recorded as ended anyway, with a log line naming it. */
#define END_WAIT_S 60

struct sjob {
	struct running_job *j;
	const char *bin;
	char dir[1100];
	char id[32]; /* the Slurm job id */
	struct tr_slurm_job_state st;
	/* The metrics tail. */
	ino_t metrics_ino;
	off_t metrics_off;
	int restarts_seen;
	double last_progress_store;
	bool cancel_sent, stop_sent;
	bool withdrawn; /* stopped or paused before Slurm started it: scancel'd while held */
	bool requeued;  /* info slurm_requeued */
	bool preempted; /* the job shows `preempted` (Slurm holds it after a requeue) */
	double end_asked_at;
};

static double mono_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double wall_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void job_log(struct sjob *sj, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void job_log(struct sjob *sj, int level, const char *fmt, ...)
{
	char line[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	tr_store_log_append(sj->j->sched->cfg.store, sj->j->id, level, line, NULL);
	tr_log_job(level <= TR_LOG_WARN ? TR_LOG_WARN : TR_LOG_INF, (long long)sj->j->id, "%s", line);
}

static void set_info(struct sjob *sj, const char *key, json_t *value)
{
	json_t *o = json_object();
	json_object_set_new(o, key, value);
	char *text = json_dumps(o, JSON_COMPACT);
	struct tr_error e = {0};
	if (text && tr_store_job_info_merge(sj->j->sched->cfg.store, sj->j->id, text,
					    TR_INFO_MAX_FIELDS + TR_INFO_ENGINE_FIELDS, &e) < 0)
		tr_log(TR_LOG_DBG, "job %lld: info %s not stored: %s", (long long)sj->j->id, key, e.message);
	free(text);
	json_decref(o);
}

static int write_text(const char *path, const char *text)
{
	char tmp[PATH_MAX + 8];
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	FILE *f = fopen(tmp, "w");
	if (!f)
		return -errno;
	fputs(text, f);
	int rc = ferror(f) ? -EIO : 0;
	if (fflush(f) != 0 || fsync(fileno(f)) != 0)
		rc = -EIO;
	if (fclose(f) != 0 && rc == 0)
		rc = -EIO;
	if (rc == 0 && rename(tmp, path) < 0)
		rc = -errno;
	if (rc < 0)
		unlink(tmp);
	return rc;
}

static int mkdir_one(const char *path)
{
	return mkdir(path, 0700) < 0 && errno != EEXIST ? -errno : 0;
}

/* The Slurm job id this job's folder names (written right after sbatch),
 * so a restarted daemon follows the job it submitted instead of
 * submitting it again. */
static bool read_slurm_id(struct sjob *sj)
{
	char path[PATH_MAX + 16];
	snprintf(path, sizeof path, "%s/slurm_job_id", sj->dir);
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
	snprintf(path, sizeof path, "%s/slurm_job_id", sj->dir);
	unlink(path);
}

static int submit(struct sjob *sj, struct tr_error *err)
{
	struct running_job *j = sj->j;
	tr_store_t *st = j->sched->cfg.store;
	struct tr_job_row row = {0};
	char path[PATH_MAX + 16], worker[PATH_MAX];
	int rc = tr_store_job_get(st, j->id, &row, err);
	if (rc < 0)
		return rc;
	snprintf(path, sizeof path, "%s/job.json", sj->dir);
	rc = write_text(path, row.normalized);
	tr_job_row_finish(&row);
	if (rc < 0)
		return tr_error_set(err, rc, 0, NULL, "cannot write %s: %s", path, strerror(-rc));
	ssize_t n = readlink("/proc/self/exe", worker, sizeof worker - 1);
	if (n <= 0)
		return tr_error_set(err, -errno, 0, NULL, "cannot find the trainerd executable: %s", strerror(errno));
	worker[n] = 0;
	/* An executable replaced since the daemon started (an upgrade): its
	 * successor at the same path is the one to run. */
	size_t wl = strlen(worker);
	if (wl > 10 && !strcmp(worker + wl - 10, " (deleted)"))
		worker[wl - 10] = 0;
	snprintf(path, sizeof path, "%s/job.sh", sj->dir);
	if ((rc = tr_slurm_write_script(path, j->id, sj->dir, worker, sj->bin)) < 0)
		return tr_error_set(err, rc, 0, NULL, "cannot write %s: %s", path, strerror(-rc));

	const struct tr_resources *r = &j->spec.resources;
	char name[32], signal[32], out[1200], nodes[32], tasks[40], limit[32], part[80];
	snprintf(name, sizeof name, "--job-name=trainerd-%lld", (long long)j->id);
	snprintf(signal, sizeof signal, "--signal=B:USR1@%d", tr_slurm_signal_lead_s(r));
	snprintf(out, sizeof out, "--output=%s/slurm-%%j.out", sj->dir);
	snprintf(nodes, sizeof nodes, "--nodes=%d", r->nodes > 0 ? r->nodes : 1);
	snprintf(tasks, sizeof tasks, "--ntasks-per-node=%d", r->tasks_per_node > 0 ? r->tasks_per_node : 1);
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
	snprintf(path, sizeof path, "%s/slurm_job_id", sj->dir);
	if ((rc = write_text(path, sj->id)) < 0)
		job_log(sj, TR_LOG_WARN, "cannot write %s (a restarted daemon will not find Slurm job %s): %s", path,
			sj->id, strerror(-rc));
	return 0;
}

/* Reads the worker's new metric points (the tail of metrics.jsonl) into
 * the store.  A resumed worker rewrites the file without the points after
 * its checkpoint (a new file): the store's points are dropped and the
 * file read again from its start. */
static void tail_metrics(struct sjob *sj)
{
	struct running_job *j = sj->j;
	tr_store_t *st = j->sched->cfg.store;
	char path[PATH_MAX + 16];
	snprintf(path, sizeof path, "%s/metrics.jsonl", sj->dir);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	struct stat sb;
	if (fstat(fd, &sb) < 0) {
		close(fd);
		return;
	}
	/* The first look (also after a daemon restart, whose store has the
	 * points read before) and a new file read everything again. */
	if (sb.st_ino != sj->metrics_ino || sb.st_size < sj->metrics_off) {
		tr_store_metrics_truncate(st, j->id, 0, NULL);
		sj->metrics_ino = sb.st_ino;
		sj->metrics_off = 0;
	}
	FILE *f = fdopen(fd, "r");
	if (!f) {
		close(fd);
		return;
	}
	fseeko(f, sj->metrics_off, SEEK_SET);
	char line[4096];
	struct tr_progress p = {0};
	bool have = false, any_loss = false;
	/* Bounded per round: the rest is read at the next. */
	for (int n = 0; n < 100000 && fgets(line, sizeof line, f); n++) {
		size_t len = strlen(line);
		if (len == 0 || line[len - 1] != '\n')
			break; /* a line still being written: read it whole next time */
		long long step, epoch;
		char name[64];
		double value;
		if (sscanf(line, "{\"step\":%lld,\"epoch\":%lld,\"name\":\"%63[^\"]\",\"value\":%lf", &step, &epoch,
			   name, &value) == 4) {
			tr_store_metric_append(st, j->id, name, step, epoch, wall_s(), value, NULL);
			if (!strcmp(name, "loss")) {
				p.step = step;
				p.epoch = epoch;
				p.loss = value;
				any_loss = true;
			}
			have = true;
		}
		sj->metrics_off += (off_t)len;
	}
	fclose(f);
	if (!have || !any_loss)
		return;
	struct tr_scheduler *s = j->sched;
	pthread_mutex_lock(&s->lock);
	p.total_steps = j->progress.total_steps;
	j->progress = p;
	j->have_progress = true;
	pthread_mutex_unlock(&s->lock);
	if (!j->crashes_cleared) {
		j->crashes_cleared = true;
		tr_store_job_set_crashes(st, j->id, 0, NULL);
	}
	double now = mono_s();
	if (now - sj->last_progress_store >= 1.0) {
		sj->last_progress_store = now;
		tr_store_job_set_progress(st, j->id, p.step, p.total_steps, p.epoch, p.loss, NULL);
	}
}

/* Slurm holds the job back after a requeue: it is `preempted`, with a
 * preemption record naming Slurm (written first: the state event carries
 * it), until Slurm starts it again.  Its runner follows it meanwhile, so
 * the dispatcher leaves it be (scheduler.c). */
static void show_preempted(struct sjob *sj, const struct tr_slurm_job_state *st)
{
	struct running_job *j = sj->j;
	tr_store_t *store = j->sched->cfg.store;
	char at[40] = "";
	tr_rfc3339_format((double)time(NULL), at, sizeof at);
	pthread_mutex_lock(&j->sched->lock);
	int priority = j->priority;
	pthread_mutex_unlock(&j->sched->lock);
	int64_t step = tr_slurm_checkpoint_step(sj->dir);
	char *record = tr_slurm_preemption_json(sj->id, st, priority, step, at);
	json_t *parsed = record ? json_loads(record, 0, NULL) : NULL;
	const char *message = json_string_value(json_object_get(parsed, "message"));
	struct tr_error e = {0};
	if (!record || tr_store_job_set_preemption(store, j->id, record, &e) < 0)
		job_log(sj, TR_LOG_WARN, "its preemption record is not stored: %s",
			record ? e.message : "out of memory");
	if (tr_store_job_set_state(store, j->id, TR_JOB_PREEMPTED, NULL, NULL, &e) < 0)
		job_log(sj, TR_LOG_WARN, "cannot show it preempted: %s", e.message);
	job_log(sj, TR_LOG_NOTICE, "%s", message ? message : "preempted by Slurm");
	tr_prom_preemption(step < 0);
	json_decref(parsed);
	free(record);
	sj->preempted = true;
}

static void show_running_again(struct sjob *sj, const struct tr_slurm_job_state *st)
{
	struct tr_error e = {0};
	if (tr_store_job_set_state(sj->j->sched->cfg.store, sj->j->id, TR_JOB_RUNNING, NULL, NULL, &e) < 0)
		job_log(sj, TR_LOG_WARN, "cannot show it running again: %s", e.message);
	job_log(sj, TR_LOG_NOTICE, "Slurm started job %s again (restart %d): running, from its checkpoint", sj->id,
		st->restarts);
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
		set_info(sj, "slurm_state", json_string(st.state));
	/* Requeued and not running again yet: preempted, as far as the job
	 * is concerned (it resumes from its checkpoint when Slurm starts it). */
	bool requeued = st.restarts > 0 && strcmp(st.state, "RUNNING") != 0 && !tr_slurm_state_final(st.state);
	if (requeued != sj->requeued || !sj->st.state[0]) {
		sj->requeued = requeued;
		set_info(sj, "slurm_requeued", json_string(requeued ? "true" : "false"));
	}
	if (st.restarts != sj->st.restarts) {
		char n[16];
		snprintf(n, sizeof n, "%d", st.restarts);
		set_info(sj, "slurm_restarts", json_string(n)); /* info fields are strings */
		job_log(sj, TR_LOG_NOTICE, "Slurm job %s was requeued (restart %d); it resumes from its checkpoint",
			sj->id, st.restarts);
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
		job_log(sj, TR_LOG_WARN, "scancel %s%s failed (%d): %s", signal ? "--signal " : "", sj->id, rc, out);
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
		job_log(sj, TR_LOG_NOTICE, "Slurm had not started job %s: held and cancelled (scancel)", sj->id);
		return true;
	}
	char *release[] = {"scontrol", "release", sj->id, NULL};
	rc = tr_slurm_command(sj->bin, release, out, sizeof out, CMD_TIMEOUT_S);
	if (rc != 0) {
		out[strcspn(out, "\n")] = 0;
		job_log(sj, TR_LOG_WARN, "scontrol release %s failed (%d): %s", sj->id, rc, out);
	}
	return false;
}

/* The summary.json the worker wrote as it ended: its state and, for a
 * failure, the error.  False when there is none. */
static bool read_summary(struct sjob *sj, char *state, size_t n, char *error, size_t en, int64_t *steps)
{
	char path[PATH_MAX + 16];
	snprintf(path, sizeof path, "%s/summary.json", sj->dir);
	json_t *s = json_load_file(path, 0, NULL);
	if (!s)
		return false;
	const char *st = json_string_value(json_object_get(s, "state"));
	const char *er = json_string_value(json_object_get(s, "error"));
	snprintf(state, n, "%s", st ? st : "");
	snprintf(error, en, "%s", er ? er : "");
	*steps = json_integer_value(json_object_get(s, "steps"));
	json_decref(s);
	return state[0] != 0;
}

/* Reads a whole file (malloc'd). */
static void *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	void *buf = NULL;
	struct stat sb;
	if (fstat(fileno(f), &sb) == 0 && sb.st_size > 8 && (buf = malloc((size_t)sb.st_size)) &&
	    fread(buf, 1, (size_t)sb.st_size, f) != (size_t)sb.st_size) {
		free(buf);
		buf = NULL;
	}
	*len = buf ? (size_t)sb.st_size : 0;
	fclose(f);
	return buf;
}

/* A safetensors header's length (8 + JSON), or 0 when malformed. */
static size_t st_header_len(const uint8_t *p, size_t len)
{
	uint64_t n = 0;
	for (int i = 7; i >= 0; i--)
		n = n << 8 | p[i];
	return len >= 8 && n <= len - 8 ? (size_t)(8 + n) : 0;
}

/* Stores the worker's final checkpoint (checkpoint.safetensors) as the
 * job's, so downloads, init.from and "completed means the final weights
 * are stored" work as for a local job.  Its weights-only header is that
 * of the worker's model.safetensors, whose data must be the checkpoint's
 * first bytes of data (the layout of engine/checkpoint.h). */
static int store_checkpoint(struct sjob *sj, int64_t *step, struct tr_error *err)
{
	char cpath[PATH_MAX + 32], mpath[PATH_MAX + 32];
	snprintf(cpath, sizeof cpath, "%s/checkpoint.safetensors", sj->dir);
	snprintf(mpath, sizeof mpath, "%s/model.safetensors", sj->dir);
	size_t clen = 0, mlen = 0;
	uint8_t *c = slurp(cpath, &clen), *m = slurp(mpath, &mlen);
	int rc = -EBADMSG;
	size_t ch = c ? st_header_len(c, clen) : 0, mh = m ? st_header_len(m, mlen) : 0;
	json_t *head = ch ? json_loadb((const char *)c + 8, ch - 8, 0, NULL) : NULL;
	json_t *meta = json_object_get(head, "__metadata__");
	const char *st = json_string_value(json_object_get(meta, "step"));
	const char *ep = json_string_value(json_object_get(meta, "epoch"));
	if (!c || !m) {
		tr_error_set(err, -ENOENT, 0, NULL, "the worker left no %s", !c ? cpath : mpath);
		rc = -ENOENT;
	} else if (!ch || !mh || !st || !ep) {
		tr_error_set(err, rc, 0, NULL, "%s is not a trainerd checkpoint", !ch || !st || !ep ? cpath : mpath);
	} else if (mlen - mh > clen - ch || memcmp(m + mh, c + ch, mlen - mh) != 0) {
		tr_error_set(err, rc, 0, NULL, "%s does not hold the weights of %s", cpath, mpath);
	} else {
		*step = strtoll(st, NULL, 10);
		char *meta_text = json_dumps(meta, JSON_COMPACT);
		tr_ckpt_writer_t *w = NULL;
		tr_store_t *store = sj->j->sched->cfg.store;
		rc = tr_store_ckpt_begin(store, sj->j->id, *step, strtoll(ep, NULL, 10), meta_text, &w, err);
		free(meta_text);
		if (rc == 0)
			rc = tr_store_ckpt_write(w, c, clen, err);
		if (rc == 0 && (rc = tr_store_flush(store, err)) == 0) {
			rc = tr_store_ckpt_commit(w, m, mh, (int64_t)ch, (int64_t)(mlen - mh),
						  sj->j->spec.checkpoint_keep, NULL, err);
			w = NULL;
		}
		tr_store_ckpt_abort(w);
	}
	json_decref(head);
	free(c);
	free(m);
	return rc;
}

/* The last lines of the Slurm job's output file, for a failure's message. */
static void output_tail(struct sjob *sj, char *buf, size_t n)
{
	char path[PATH_MAX + 64];
	snprintf(path, sizeof path, "%s/slurm-%s.out", sj->dir, sj->id);
	buf[0] = 0;
	FILE *f = fopen(path, "r");
	if (!f)
		return;
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
}

/* The Slurm job has ended (or Slurm no longer knows it): record the job's
 * end from Slurm's state and the worker's summary. */
static void ended(struct sjob *sj, const char *slurm_state)
{
	struct running_job *j = sj->j;
	tail_metrics(sj);
	char state[32], error[512], msg[1024], tail[400];
	int64_t steps = 0, step = 0;
	bool have = read_summary(sj, state, sizeof state, error, sizeof error, &steps);
	struct tr_error e = {0};
	forget_slurm_id(sj);
	set_info(sj, "slurm_state", json_string(slurm_state));
	if (sj->withdrawn && !atomic_load(&j->cancel_requested)) {
		/* As for a job in the local queue: a pause keeps its place to
		 * resume from (the folder's checkpoint, if an earlier start
		 * left one; a resume submits a new Slurm job), a stop of a job
		 * that never ran cancels it. */
		if (atomic_load(&j->pause_requested)) {
			int64_t at = tr_slurm_checkpoint_step(sj->dir);
			job_log(sj, TR_LOG_NOTICE, "paused before Slurm started job %s; a resume submits it again",
				sj->id);
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
		if (store_checkpoint(sj, &step, &e) < 0) {
			snprintf(msg, sizeof msg,
				 "training ended at step %lld, but its final weights could not be stored: %s",
				 (long long)steps, e.message);
			tr_runner_finish(j, TR_JOB_FAILED, "checkpoint_failed", msg, steps);
			return;
		}
		bool stopped = !strcmp(state, "stopped");
		bool paused = stopped && atomic_load(&j->pause_requested);
		job_log(sj, TR_LOG_NOTICE, "Slurm job %s %s at step %lld; its checkpoint is stored", sj->id,
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
		snprintf(msg, sizeof msg, "Slurm job %s ended %s (exit code %d, signal %d)%s%s", sj->id, slurm_state,
			 sj->st.exit_code, sj->st.exit_signal, tail[0] ? "; its output ends: " : "", tail);
	tr_runner_finish(j, TR_JOB_FAILED, have && !strcmp(state, "failed") ? "training_failed" : "slurm_failed", msg,
			 steps);
}

static void *slurm_runner_main(void *arg)
{
	struct sjob sj = {.j = arg};
	struct running_job *j = sj.j;
	struct tr_scheduler *s = j->sched;
	struct tr_error err = {0};
	char name[16], path[1024], msg[1400];
	snprintf(name, sizeof name, "tr-slurm%lld", (long long)j->id);
	pthread_setname_np(pthread_self(), name);
	sj.bin = s->cfg.slurm_bin_dir;
	snprintf(path, sizeof path, "%s/slurm", s->cfg.state_dir ? s->cfg.state_dir : ".");
	int rc = mkdir_one(path);
	snprintf(sj.dir, sizeof sj.dir, "%s/job-%lld", path, (long long)j->id);
	if (rc == 0)
		rc = mkdir_one(sj.dir);
	if (rc < 0) {
		snprintf(msg, sizeof msg, "cannot make the job's folder %s: %s", sj.dir, strerror(-rc));
		tr_runner_finish(j, TR_JOB_FAILED, "start_failed", msg, 0);
		return NULL;
	}
	if (read_slurm_id(&sj)) {
		job_log(&sj, TR_LOG_NOTICE, "following Slurm job %s again (submitted before the daemon restarted)",
			sj.id);
	} else if (submit(&sj, &err) < 0) {
		tr_runner_finish(j, TR_JOB_FAILED, "slurm_submit_failed", err.message, 0);
		return NULL;
	} else {
		job_log(&sj, TR_LOG_INF, "submitted to Slurm as job %s (folder %s)", sj.id, sj.dir);
	}
	set_info(&sj, "slurm_job_id", json_string(sj.id));
	char why[512] = "";
	int unknown = 0;
	for (;;) {
		pthread_mutex_lock(&s->lock);
		bool shutdown = s->shutting_down;
		pthread_mutex_unlock(&s->lock);
		if (shutdown) {
			/* The Slurm job runs on; the next daemon follows it. */
			job_log(&sj, TR_LOG_NOTICE,
				"the daemon stops; Slurm job %s runs on and is followed again at restart", sj.id);
			pthread_mutex_lock(&s->lock);
			int64_t step = j->progress.step;
			pthread_mutex_unlock(&s->lock);
			tr_runner_finish(j, TR_JOB_INTERRUPTED, NULL, NULL, step);
			return NULL;
		}
		if (atomic_load(&j->cancel_requested) && !sj.cancel_sent) {
			sj.cancel_sent = true;
			sj.end_asked_at = mono_s();
			scancel(&sj, NULL);
		} else if (atomic_load(&j->stop_requested) && !sj.stop_sent && !sj.cancel_sent) {
			/* TERM: the worker checkpoints at its next step and ends "stopped". */
			sj.stop_sent = true;
			sj.end_asked_at = mono_s();
			if (!withdraw_pending(&sj))
				scancel(&sj, "TERM");
		}
		tail_metrics(&sj);
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
			bool done = read_summary(&sj, state, sizeof state, error, sizeof error, &steps);
			job_log(&sj, TR_LOG_WARN, "%s", why);
			ended(&sj, done ? "COMPLETED" : "UNKNOWN");
			return NULL;
		}
		if (sj.end_asked_at > 0 && mono_s() - sj.end_asked_at > END_WAIT_S) {
			job_log(&sj, TR_LOG_WARN, "Slurm job %s did not end within %d s of scancel", sj.id, END_WAIT_S);
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
