/* What the runners of jobs run by worker processes share
 * (daemon/worker_job.h): moved out of daemon/slurm_runner.c so that the
 * multi-process runner (daemon/procs_runner.c) uses the same code. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "daemon/log.h"
#include "daemon/scheduler_internal.h"
#include "daemon/worker_job.h"
#include "storage/checkpoints.h"

double tr_wjob_mono_s(void)
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

void tr_wjob_log(struct tr_worker_job *w, int level, const char *fmt, ...)
{
	char line[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	tr_store_log_append(w->j->sched->cfg.store, w->j->id, level, line, NULL);
	tr_log_job(level <= TR_LOG_WARN ? TR_LOG_WARN : TR_LOG_INF, (long long)w->j->id, "%s", line);
}

void tr_wjob_set_info(struct tr_worker_job *w, const char *key, json_t *value)
{
	json_t *o = json_object();
	json_object_set_new(o, key, value);
	char *text = json_dumps(o, JSON_COMPACT);
	struct tr_error e = {0};
	if (text && tr_store_job_info_merge(w->j->sched->cfg.store, w->j->id, text,
					    TR_INFO_MAX_FIELDS + TR_INFO_ENGINE_FIELDS, &e) < 0)
		tr_log(TR_LOG_DBG, "job %lld: info %s not stored: %s", (long long)w->j->id, key, e.message);
	free(text);
	json_decref(o);
}

int tr_wjob_write_file(const char *path, const void *data, size_t len, mode_t mode)
{
	char tmp[PATH_MAX + 8];
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	unlink(tmp);
	/* Created with its mode (a private file is never readable by others,
	 * not even briefly), never through a link. */
	int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
	if (fd < 0)
		return -errno;
	int rc = write(fd, data, len) == (ssize_t)len ? 0 : -EIO;
	if (rc == 0 && fsync(fd) != 0)
		rc = -EIO;
	if (close(fd) != 0 && rc == 0)
		rc = -EIO;
	if (rc == 0 && rename(tmp, path) < 0)
		rc = -errno;
	if (rc < 0)
		unlink(tmp);
	return rc;
}

int tr_wjob_write_text(const char *path, const char *text)
{
	return tr_wjob_write_file(path, text, strlen(text), 0666);
}

static int mkdir_one(const char *path)
{
	return mkdir(path, 0700) < 0 && errno != EEXIST ? -errno : 0;
}

int tr_wjob_make_dir(struct tr_worker_job *w, const char *kind, char *msg, size_t msglen)
{
	const char *state_dir = w->j->sched->cfg.state_dir;
	char path[1024];
	snprintf(path, sizeof path, "%s/%s", state_dir ? state_dir : ".", kind);
	int rc = mkdir_one(path);
	snprintf(w->dir, sizeof w->dir, "%s/job-%lld", path, (long long)w->j->id);
	if (rc == 0)
		rc = mkdir_one(w->dir);
	if (rc < 0)
		snprintf(msg, msglen, "cannot make the job's folder %s: %s", w->dir, strerror(-rc));
	return rc;
}

int tr_wjob_write_spec(struct tr_worker_job *w, struct tr_error *err)
{
	struct tr_job_row row = {0};
	char path[PATH_MAX + 16];
	int rc = tr_store_job_get(w->j->sched->cfg.store, w->j->id, &row, err);
	if (rc < 0)
		return rc;
	snprintf(path, sizeof path, "%s/job.json", w->dir);
	rc = tr_wjob_write_text(path, row.normalized);
	tr_job_row_finish(&row);
	if (rc < 0)
		return tr_error_set(err, rc, 0, NULL, "cannot write %s: %s", path, strerror(-rc));
	return 0;
}

int tr_wjob_worker_path(char *worker, size_t len, struct tr_error *err)
{
	ssize_t n = readlink("/proc/self/exe", worker, len - 1);
	if (n <= 0)
		return tr_error_set(err, -errno, 0, NULL, "cannot find the trainerd executable: %s", strerror(errno));
	worker[n] = 0;
	/* An executable replaced since the daemon started (an upgrade): its
	 * successor at the same path is the one to run. */
	size_t wl = strlen(worker);
	if (wl > 10 && !strcmp(worker + wl - 10, " (deleted)"))
		worker[wl - 10] = 0;
	return 0;
}

/* Reads the worker's new metric points (the tail of metrics.jsonl) into
 * the store.  A resumed worker rewrites the file without the points after
 * its checkpoint (a new file): the store's points are dropped and the
 * file read again from its start. */
static void tail_file(struct tr_worker_job *w);

void tr_wjob_tail_metrics(struct tr_worker_job *w)
{
	struct running_job *j = w->j;
	char path[PATH_MAX + 16];
	/* A worker that reports over the API (daemon/report.c) is the
	 * source of its points: its file, where the daemon sees one, is not
	 * read too (after a restart, the folder's mark says so). */
	snprintf(path, sizeof path, "%s/%s", w->dir, TR_WJOB_REPORTED_FILE);
	if (!atomic_load(&j->reported) && access(path, F_OK) == 0)
		atomic_store(&j->reported, true);
	/* Busy first, then the flag (both sequentially consistent): a first
	 * report either stops this round here or waits for its end. */
	atomic_store(&j->tailing, true);
	if (atomic_load(&j->reported)) {
		atomic_store(&j->tailing, false);
		return;
	}
	tail_file(w);
	atomic_store(&j->tailing, false);
}

/* How many steps the worker makes in all, from its plan.json; 0 when
 * it has not said. */
static int64_t plan_total_steps(struct tr_worker_job *w)
{
	char path[PATH_MAX + 16];
	snprintf(path, sizeof path, "%s/plan.json", w->dir);
	json_t *plan = json_load_file(path, 0, NULL);
	int64_t total = json_integer_value(json_object_get(plan, "total_steps"));
	json_decref(plan);
	return total;
}

/* One round of the tail (tr_wjob_tail_metrics). */
static void tail_file(struct tr_worker_job *w)
{
	struct running_job *j = w->j;
	tr_store_t *st = j->sched->cfg.store;
	char path[PATH_MAX + 16];
	snprintf(path, sizeof path, "%s/metrics.jsonl", w->dir);
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
	if (sb.st_ino != w->metrics_ino || sb.st_size < w->metrics_off) {
		tr_store_metrics_truncate(st, j->id, 0, NULL);
		w->metrics_ino = sb.st_ino;
		w->metrics_off = 0;
	}
	FILE *f = fdopen(fd, "r");
	if (!f) {
		close(fd);
		return;
	}
	fseeko(f, w->metrics_off, SEEK_SET);
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
		w->metrics_off += (off_t)len;
	}
	fclose(f);
	/* The points are in; the rest takes the scheduler's lock, which a
	 * first report holds while it waits for this (daemon/report.c). */
	atomic_store(&j->tailing, false);
	if (!have || !any_loss)
		return;
	int64_t total = plan_total_steps(w);
	struct tr_scheduler *s = j->sched;
	pthread_mutex_lock(&s->lock);
	p.total_steps = total > 0 ? total : j->progress.total_steps;
	j->progress = p;
	j->have_progress = true;
	pthread_mutex_unlock(&s->lock);
	if (!j->crashes_cleared) {
		j->crashes_cleared = true;
		tr_store_job_set_crashes(st, j->id, 0, NULL);
	}
	double now = tr_wjob_mono_s();
	if (now - w->last_progress_store >= 1.0) {
		w->last_progress_store = now;
		tr_store_job_set_progress(st, j->id, p.step, p.total_steps, p.epoch, p.loss, NULL);
	}
}

/* The summary.json the worker wrote as it ended: its state and, for a
 * failure, the error.  False when there is none. */
bool tr_wjob_read_summary(struct tr_worker_job *w, char *state, size_t n, char *error, size_t en, int64_t *steps)
{
	char path[PATH_MAX + 16];
	snprintf(path, sizeof path, "%s/summary.json", w->dir);
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

void tr_wjob_final_progress(struct tr_worker_job *w)
{
	char path[PATH_MAX + 16];
	snprintf(path, sizeof path, "%s/summary.json", w->dir);
	json_t *sum = json_load_file(path, 0, NULL);
	json_t *steps = json_object_get(sum, "steps"), *loss = json_object_get(sum, "final_loss");
	int64_t epochs = json_integer_value(json_object_get(sum, "epochs"));
	if (!json_is_integer(steps) || json_integer_value(steps) < 0) {
		json_decref(sum);
		return;
	}
	int64_t total = plan_total_steps(w);
	struct running_job *j = w->j;
	pthread_mutex_lock(&j->sched->lock);
	struct tr_progress p = j->progress;
	p.step = json_integer_value(steps);
	/* A run that made no step of its own (resumed at its end) says
	 * nothing of the epoch or the loss: the tail's stand. */
	if (epochs > 0) {
		p.epoch = epochs - 1; /* "epochs" counts the one under way */
		if (json_is_number(loss))
			p.loss = json_number_value(loss);
	}
	if (total > 0)
		p.total_steps = total;
	j->progress = p;
	j->have_progress = true;
	pthread_mutex_unlock(&j->sched->lock);
	json_decref(sum);
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
int tr_wjob_store_checkpoint(struct tr_worker_job *w, int64_t *step, struct tr_error *err)
{
	char cpath[PATH_MAX + 32], mpath[PATH_MAX + 32];
	snprintf(cpath, sizeof cpath, "%s/checkpoint.safetensors", w->dir);
	snprintf(mpath, sizeof mpath, "%s/model.safetensors", w->dir);
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
		tr_ckpt_writer_t *cw = NULL;
		tr_store_t *store = w->j->sched->cfg.store;
		rc = tr_store_ckpt_begin(store, w->j->id, *step, strtoll(ep, NULL, 10), meta_text, &cw, err);
		free(meta_text);
		if (rc == 0)
			rc = tr_store_ckpt_write(cw, c, clen, err);
		if (rc == 0 && (rc = tr_store_flush(store, err)) == 0) {
			rc = tr_store_ckpt_commit(cw, m, mh, (int64_t)ch, (int64_t)(mlen - mh),
						  w->j->spec.checkpoint_keep, NULL, err);
			cw = NULL;
		}
		tr_store_ckpt_abort(cw);
	}
	json_decref(head);
	free(c);
	free(m);
	return rc;
}
