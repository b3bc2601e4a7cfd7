/* The metrics writer: the queue of metric points and log lines, and the
 * thread that writes it (batches in metrics_write.c).  Appends only take a mutex
 * and copy the point, so a training step never waits for the disk.  The
 * writer swaps the whole queue out at most every flush_interval_ms (or at
 * once on tr_store_flush or close) and writes it with tr_store_write_batch.
 *
 * Bounded memory: points accepted but not yet committed (queued plus the
 * batch being written or held) never exceed queue_max; beyond that appends
 * fail with -ENOBUFS and are counted per job and in total.
 *
 * Storage failures: a chunk that fails for a reason that may pass (full,
 * read-only, I/O error) is held with everything after it, in order, and
 * tried again once a second, followed by the held job state changes
 * (storage/pending.c); with nothing to write, a failing store is probed
 * at the same pace so that tr_store_health recovers.
 */
#include "storage/internal.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A batch this large keeps its array for reuse; larger ones are freed
 * after writing, so a burst does not pin its memory. */
#define KEEP_CAPACITY 65536

static int64_t *drop_slot(tr_store_t *s, int64_t job_id)
{
	for (size_t i = 0; i < s->ndrops; i++)
		if (s->drops[i].job_id == job_id)
			return &s->drops[i].count;
	if (s->ndrops == s->capdrops) {
		size_t cap = s->capdrops ? 2 * s->capdrops : 16;
		struct drop_count *n = realloc(s->drops, cap * sizeof *n);
		if (!n)
			return NULL;
		s->drops = n;
		s->capdrops = cap;
	}
	s->drops[s->ndrops] = (struct drop_count){job_id, 0};
	return &s->drops[s->ndrops++].count;
}

void tr_store_drops_add(tr_store_t *s, int64_t job_id, int64_t n)
{
	s->drops_total += n;
	int64_t *slot = drop_slot(s, job_id);
	if (slot)
		*slot += n;
}

void tr_store_drops_forget(tr_store_t *s, int64_t job_id)
{
	pthread_mutex_lock(&s->q_lock);
	for (size_t i = 0; i < s->ndrops; i++) {
		if (s->drops[i].job_id == job_id) {
			s->drops[i] = s->drops[--s->ndrops];
			break;
		}
	}
	pthread_mutex_unlock(&s->q_lock);
}

int64_t tr_store_metric_drops(tr_store_t *s, int64_t job_id)
{
	pthread_mutex_lock(&s->q_lock);
	int64_t n = 0;
	if (job_id == 0) {
		n = s->drops_total;
	} else {
		for (size_t i = 0; i < s->ndrops; i++)
			if (s->drops[i].job_id == job_id)
				n = s->drops[i].count;
	}
	pthread_mutex_unlock(&s->q_lock);
	return n;
}

/* Takes ownership of *it's text on success only. */
static int enqueue(tr_store_t *s, const struct qitem *it, struct tr_error *e)
{
	pthread_mutex_lock(&s->q_lock);
	if (s->stopping) {
		pthread_mutex_unlock(&s->q_lock);
		return tr_error_set(e, -ESHUTDOWN, 0, NULL, "store is closing");
	}
	if (s->pending.n + s->inflight >= s->queue_max) {
		tr_store_drops_add(s, it->job_id, 1);
		pthread_mutex_unlock(&s->q_lock);
		return tr_error_set(e, -ENOBUFS, 0, NULL, "metrics queue full (%zu points): point dropped",
				    s->queue_max);
	}
	if (s->pending.n == s->pending.cap) {
		size_t cap = s->pending.cap ? 2 * s->pending.cap : 1024;
		if (cap > s->queue_max)
			cap = s->queue_max;
		struct qitem *n = realloc(s->pending.v, cap * sizeof *n);
		if (!n) {
			tr_store_drops_add(s, it->job_id, 1);
			pthread_mutex_unlock(&s->q_lock);
			return tr_error_set(e, -ENOMEM, 0, NULL, "out of memory queueing a point");
		}
		s->pending.v = n;
		s->pending.cap = cap;
	}
	s->pending.v[s->pending.n++] = *it;
	s->seq_in++;
	/* The writer only needs a kick when the queue becomes non-empty; it
	 * paces itself after that. */
	if (s->pending.n == 1)
		pthread_cond_signal(&s->q_work);
	pthread_mutex_unlock(&s->q_lock);
	return 0;
}

static int set_text(struct qitem *it, const char *text, struct tr_error *e)
{
	size_t len = strlen(text);
	if (len < sizeof it->inl) {
		memcpy(it->inl, text, len + 1);
		it->heap = NULL;
		return 0;
	}
	it->heap = strdup(text);
	return it->heap ? 0 : tr_error_set(e, -ENOMEM, 0, NULL, "out of memory");
}

static int metric_enqueue(tr_store_t *s, int64_t job_id, const char *name, int64_t step, int64_t epoch, double wall,
			  double value, bool replace, struct tr_error *e)
{
	if (job_id <= 0)
		return tr_error_set(e, -EINVAL, 0, NULL, "metric point: job id must be > 0");
	if (!name || !*name)
		return tr_error_set(e, -EINVAL, 0, NULL, "metric point: name is empty");
	if (!tr_store_utf8_valid(name))
		return tr_error_set(e, -EINVAL, 0, NULL, "metric point: name is not valid UTF-8");
	if (step < -STORE_STEP_LIMIT || step > STORE_STEP_LIMIT)
		return tr_error_set(e, -EINVAL, 0, NULL, "metric point %s: step %lld out of range", name,
				    (long long)step);
	struct qitem it = {.job_id = job_id,
			   .step = step,
			   .epoch = epoch,
			   .wall = wall,
			   .value = value,
			   .level = -1,
			   .replace = replace};
	int err = set_text(&it, name, e);
	if (err < 0)
		return err;
	err = enqueue(s, &it, e);
	if (err < 0)
		free(it.heap);
	return err;
}

int tr_store_metric_append(tr_store_t *s, int64_t job_id, const char *name, int64_t step, int64_t epoch, double wall,
			   double value, struct tr_error *e)
{
	return metric_enqueue(s, job_id, name, step, epoch, wall, value, false, e);
}

int tr_store_metric_put(tr_store_t *s, int64_t job_id, const char *name, int64_t step, int64_t epoch, double wall,
			double value, struct tr_error *e)
{
	return metric_enqueue(s, job_id, name, step, epoch, wall, value, true, e);
}

int tr_store_log_append(tr_store_t *s, int64_t job_id, int level, const char *message, struct tr_error *e)
{
	if (job_id <= 0)
		return tr_error_set(e, -EINVAL, 0, NULL, "log line: job id must be > 0");
	if (level < 0 || level > 7)
		return tr_error_set(e, -EINVAL, 0, NULL, "log line: level %d is not a syslog priority (0..7)", level);
	if (!message)
		return tr_error_set(e, -EINVAL, 0, NULL, "log line: message is NULL");
	struct qitem it = {.job_id = job_id, .wall = tr_store_now(), .level = level};
	/* Control characters a data path brought in (ESC, BEL) would reach
	 * the terminal of whoever reads the log (trainctl logs). */
	size_t cap = strlen(message) * 4 + 1;
	char *escaped = malloc(cap);
	if (!escaped)
		return tr_error_set(e, -ENOMEM, 0, NULL, "log line: out of memory");
	tr_escape_controls(message, escaped, cap);
	int err = set_text(&it, escaped, e);
	free(escaped);
	if (err < 0)
		return err;
	/* A log line may quote a data file's bytes; keep it, readable. */
	tr_store_utf8_fix(it.heap ? it.heap : it.inl);
	err = enqueue(s, &it, e);
	if (err < 0)
		free(it.heap);
	return err;
}

int tr_store_flush(tr_store_t *s, struct tr_error *e)
{
	pthread_mutex_lock(&s->q_lock);
	uint64_t target = s->seq_in;
	uint64_t start = s->seq_done;
	/* Waits until everything queued now is written, or one round that
	 * begins after this call has tried it: while storage fails, points
	 * are held and tried again later, not waited for. */
	uint64_t round = s->rounds_started + 1;
	while (s->seq_done < target && s->rounds_done < round) {
		if (!s->flush_req) {
			s->flush_req = true;
			pthread_cond_signal(&s->q_work);
		}
		pthread_cond_wait(&s->q_done, &s->q_lock);
	}
	int err = 0;
	/* Report the last failure only if it held some of our points: kept
	 * for a retry (not done yet), or dropped. */
	if (s->seq_done < target || (s->err_to > start && s->err_from < target)) {
		err = s->err_code;
		tr_error_set(e, err, 0, NULL, "%s", s->err_msg);
	}
	pthread_mutex_unlock(&s->q_lock);
	return err;
}

static void deadline_after(struct timespec *t, const struct timespec *from, int ms)
{
	*t = *from;
	t->tv_sec += ms / 1000;
	t->tv_nsec += (long)(ms % 1000) * 1000000L;
	if (t->tv_nsec >= 1000000000L) {
		t->tv_sec++;
		t->tv_nsec -= 1000000000L;
	}
}

static bool reached(const struct timespec *t)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	return now.tv_sec > t->tv_sec || (now.tv_sec == t->tv_sec && now.tv_nsec >= t->tv_nsec);
}

/* A write with nothing else to write: tells whether the state database
 * takes writes again (rewrites the header's user_version as it is), so
 * that readiness recovers without other traffic. */
static int probe(tr_store_t *s)
{
	struct conn *c = &s->wconn;
	int64_t v = 0;
	char sql[64];
	int err = tr_store_begin(c, true);
	if (err == 0)
		err = tr_store_pragma_int(c, "PRAGMA user_version", &v);
	if (err == 0) {
		snprintf(sql, sizeof sql, "PRAGMA user_version=%lld", (long long)v);
		err = tr_store_exec(c, sql);
	}
	if (err == 0)
		err = tr_store_commit(c);
	if (err < 0)
		tr_store_rollback(c);
	return err;
}

/* Appends the queue to the held items (they stay first: order is kept).
 * False when memory is short; then the queue waits for the next round. */
static bool take_pending(tr_store_t *s, struct qvec *batch)
{
	if (batch->n == 0) {
		struct qvec t = s->pending;
		s->pending = *batch;
		s->pending.n = 0;
		*batch = t;
		return true;
	}
	if (s->pending.n == 0)
		return true;
	size_t need = batch->n + s->pending.n;
	if (need > batch->cap) {
		struct qitem *n = realloc(batch->v, need * sizeof *n);
		if (!n)
			return false;
		batch->v = n;
		batch->cap = need;
	}
	memcpy(batch->v + batch->n, s->pending.v, s->pending.n * sizeof *s->pending.v);
	batch->n = need;
	s->pending.n = 0;
	/* During a long failure both arrays would grow to the bound: keep
	 * one (at the default bound, 1,000,000 items of 80 bytes). */
	if (s->pending.cap > KEEP_CAPACITY) {
		free(s->pending.v);
		s->pending = (struct qvec){0};
	}
	return true;
}

static void *writer_main(void *arg)
{
	tr_store_t *s = arg;
	struct qvec batch = {0}; /* items held after a failure first, then the newest */
	bool failing = false;    /* the last round kept something back */
	bool stop_tried = false;
	pthread_setname_np(pthread_self(), "tr-metrics");
	struct timespec last, next;
	clock_gettime(CLOCK_MONOTONIC, &last);
	pthread_mutex_lock(&s->q_lock);
	for (;;) {
		bool retry = batch.n > 0 || atomic_load(&s->pst_count) > 0 || atomic_load(&s->h_failing);
		if (s->pending.n == 0 && !s->flush_req && !retry) {
			if (s->stopping)
				break;
			pthread_cond_wait(&s->q_work, &s->q_lock);
			continue;
		}
		/* Closing: one more try, then what storage refuses is lost. */
		if (s->stopping && stop_tried && (failing || (s->pending.n == 0 && batch.n == 0)))
			break;
		/* Pace: at most one flush per interval, unless asked; while
		 * storage fails (or only a probe is due), one try a second. */
		bool slow = failing || (s->pending.n == 0 && batch.n == 0);
		deadline_after(&next, &last, slow ? STORE_RETRY_MS : s->flush_ms);
		if (!s->flush_req && !s->stopping && !reached(&next)) {
			pthread_cond_timedwait(&s->q_work, &s->q_lock, &next);
			continue;
		}
		stop_tried = s->stopping;
		take_pending(s, &batch);
		uint64_t round = ++s->rounds_started;
		s->inflight = batch.n;
		s->flush_req = false;
		pthread_mutex_unlock(&s->q_lock);

		size_t done = batch.n ? tr_store_write_batch(s, batch.v, batch.n) : 0;
		bool kept = done < batch.n;
		int err = 0;
		/* Held state changes go after the points, so that a job shown
		 * finished has its metrics written, as without a failure. */
		if (!kept)
			err = tr_store_states_retry(s, &s->wconn);
		if (!kept && err == 0 && batch.n == 0 && atomic_load(&s->h_failing))
			err = probe(s);
		for (size_t i = 0; i < done; i++)
			free(batch.v[i].heap);
		if (done < batch.n)
			memmove(batch.v, batch.v + done, (batch.n - done) * sizeof *batch.v);
		batch.n -= done;
		if (batch.n == 0 && batch.cap > KEEP_CAPACITY) {
			free(batch.v);
			batch = (struct qvec){0};
		}
		clock_gettime(CLOCK_MONOTONIC, &last);

		pthread_mutex_lock(&s->q_lock);
		failing = kept || err < 0;
		s->write_failing = failing;
		s->seq_done += done;
		s->rounds_done = round;
		s->inflight = batch.n;
		pthread_cond_broadcast(&s->q_done);
	}
	/* Closing while storage fails: the held points are lost; count them. */
	for (size_t i = 0; i < batch.n; i++) {
		tr_store_drops_add(s, batch.v[i].job_id, 1);
		free(batch.v[i].heap);
	}
	s->seq_done += batch.n;
	s->rounds_done = s->rounds_started;
	s->inflight = 0;
	pthread_cond_broadcast(&s->q_done);
	pthread_mutex_unlock(&s->q_lock);
	free(batch.v);
	return NULL;
}

int tr_store_writer_start(tr_store_t *s, struct tr_error *e)
{
	int rc = pthread_create(&s->writer, NULL, writer_main, s);
	if (rc != 0)
		return tr_error_set(e, -rc, 0, NULL, "cannot start the metrics writer thread");
	s->writer_started = true;
	return 0;
}

void tr_store_writer_stop(tr_store_t *s)
{
	if (!s->writer_started)
		return;
	pthread_mutex_lock(&s->q_lock);
	s->stopping = true; /* the writer drains the queue before it exits */
	pthread_cond_signal(&s->q_work);
	pthread_mutex_unlock(&s->q_lock);
	pthread_join(s->writer, NULL);
	s->writer_started = false;
}
