/* Background checkpoint writer (see checkpointer.h). */
#include "daemon/checkpointer.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/prometheus.h"
#include "core/bytes.h"
#include "daemon/log.h"
#include "storage/checkpoints.h"

struct item {
	int64_t job_id;
	tr_model_t model;
	enum tr_optim_type opt;
	int keep;
	struct tr_snapshot *snap;
	bool wait, done;
	int result;
	struct item *next;
};

struct tr_checkpointer {
	tr_store_t *store;
	pthread_mutex_t lock;
	pthread_cond_t work, finished;
	struct item *head, *tail;
	struct item *current;
	bool stopping;
	pthread_t thread;
};

static double mono_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* *written receives the bytes of the stored blob (for /metrics). */
static int write_one(struct tr_checkpointer *cp, struct item *it, uint64_t *written, struct tr_error *err)
{
	struct tr_checkpoint_layout l;
	int rc = tr_checkpoint_layout(&it->model, it->opt, it->snap, &l, err);
	if (rc < 0)
		return rc;
	char *meta = json_dumps(it->snap->meta, JSON_COMPACT);
	tr_ckpt_writer_t *w = NULL;
	struct tr_error ce = {0}; /* the checkpoint store's */
	rc = tr_store_ckpt_begin(cp->store, it->job_id, it->snap->step, it->snap->epoch, meta, &w, &ce);
	free(meta);
	*written = 0;
	if (rc == 0)
		rc = tr_store_ckpt_write(w, l.header, l.header_len, &ce);
	if (rc == 0)
		*written += l.header_len;
	for (int k = 0; rc == 0 && k < l.nseg; k++) {
		rc = tr_store_ckpt_write(w, l.seg[k], l.seg_len[k], &ce);
		*written += l.seg_len[k];
	}
	/* Every point of steps up to this one was queued before the snapshot
	 * was taken: make them durable before the checkpoint becomes visible,
	 * so a crash can never leave a resumable checkpoint ahead of its
	 * metrics (the resumed run replays only the steps after it).  While
	 * storage refuses them they are held, not written: no checkpoint
	 * then (the next one tries again). */
	struct tr_error fe = {0}; /* the flush's; the checkpoint's own is in ce */
	if (rc == 0)
		rc = tr_store_flush(cp->store, &fe);
	if (rc == 0) {
		rc = tr_store_ckpt_commit(w, l.model_header, l.model_header_len, (int64_t)l.header_len,
					  (int64_t)l.params_bytes, it->keep, NULL, &ce);
		w = NULL; /* commit frees the writer, also on failure */
	}
	if (rc < 0) {
		tr_error_set(err, 0, 0, NULL, "%s",
			     rc == -ENOSPC   ? "the database is full (disk or size limit)"
			     : fe.message[0] ? fe.message
					     : ce.message);
		tr_store_ckpt_abort(w);
	}
	tr_checkpoint_layout_finish(&l);
	return rc;
}

static void *writer_main(void *arg)
{
	struct tr_checkpointer *cp = arg;
	pthread_setname_np(pthread_self(), "tr-ckpt-write");
	pthread_mutex_lock(&cp->lock);
	for (;;) {
		while (!cp->head && !cp->stopping)
			pthread_cond_wait(&cp->work, &cp->lock);
		struct item *it = cp->head;
		if (!it)
			break;
		cp->head = it->next;
		if (!cp->head)
			cp->tail = NULL;
		cp->current = it;
		pthread_mutex_unlock(&cp->lock);

		struct tr_error err = {0};
		char line[1024];
		double t0 = mono_s();
		uint64_t written = 0;
		int rc = write_one(cp, it, &written, &err);
		double took = mono_s() - t0;
		if (rc == 0)
			tr_prom_checkpoint_written(took, written);
		if (rc == 0) {
			/* the bytes the files took (weights, optimizer state,
			 * headers), in the units trainctl shows them in */
			double bytes = written ? (double)written
					       : (double)it->snap->n_params * sizeof(float) * (1 + it->snap->n_state);
			char size[TR_BYTES_LEN], rate[TR_BYTES_LEN];
			tr_fmt_bytes(size, sizeof size, bytes);
			tr_fmt_bytes(rate, sizeof rate, took > 0 ? bytes / took : 0.0);
			const char *reason = json_string_value(json_object_get(it->snap->meta, "reason"));
			snprintf(line, sizeof line, "checkpoint at step %lld (%s): %s in %.0f ms (%s/s)",
				 (long long)it->snap->step, reason ? reason : "?", size, took * 1e3, rate);
			tr_store_log_append(cp->store, it->job_id, TR_LOG_INF, line, NULL);
		} else {
			struct tr_ckpt_row prev = {0};
			char kept[96] = "no earlier checkpoint exists";
			if (tr_store_ckpt_get(cp->store, it->job_id, -1, &prev, NULL) == 0)
				snprintf(kept, sizeof kept, "the checkpoint at step %lld stays valid",
					 (long long)prev.step);
			tr_ckpt_row_finish(&prev);
			snprintf(line, sizeof line,
				 "checkpoint at step %lld failed: %s; %s; the next checkpoint will be tried as planned",
				 (long long)it->snap->step, err.message, kept);
			tr_store_log_append(cp->store, it->job_id, TR_LOG_WARN, line, NULL);
			tr_log(TR_LOG_WARN, "job %lld: %s", (long long)it->job_id, line);
		}
		tr_snapshot_free(it->snap);
		it->snap = NULL;

		pthread_mutex_lock(&cp->lock);
		cp->current = NULL;
		it->result = rc;
		it->done = true;
		/* Waiters for their own item and for a job going idle. */
		pthread_cond_broadcast(&cp->finished);
		if (!it->wait)
			free(it);
	}
	pthread_mutex_unlock(&cp->lock);
	return NULL;
}

tr_checkpointer_t *tr_checkpointer_create(tr_store_t *store)
{
	struct tr_checkpointer *cp = calloc(1, sizeof *cp);
	if (!cp)
		return NULL;
	cp->store = store;
	pthread_mutex_init(&cp->lock, NULL);
	pthread_cond_init(&cp->work, NULL);
	pthread_cond_init(&cp->finished, NULL);
	if (pthread_create(&cp->thread, NULL, writer_main, cp) != 0) {
		pthread_cond_destroy(&cp->work);
		pthread_cond_destroy(&cp->finished);
		pthread_mutex_destroy(&cp->lock);
		free(cp);
		return NULL;
	}
	return cp;
}

static bool job_busy(struct tr_checkpointer *cp, int64_t job_id)
{
	if (cp->current && cp->current->job_id == job_id)
		return true;
	for (struct item *it = cp->head; it; it = it->next)
		if (it->job_id == job_id)
			return true;
	return false;
}

int tr_checkpointer_submit(tr_checkpointer_t *cp, int64_t job_id, const tr_model_t *model, enum tr_optim_type opt,
			   int keep, struct tr_snapshot *snap, bool wait)
{
	struct item *it = calloc(1, sizeof *it);
	if (!it) {
		if (wait)
			tr_snapshot_free(snap);
		return -ENOMEM;
	}
	*it = (struct item){.job_id = job_id, .model = *model, .opt = opt, .keep = keep, .snap = snap, .wait = wait};
	pthread_mutex_lock(&cp->lock);
	if (!wait && job_busy(cp, job_id)) {
		pthread_mutex_unlock(&cp->lock);
		free(it);
		return -EBUSY; /* the caller still owns snap */
	}
	if (cp->tail)
		cp->tail->next = it;
	else
		cp->head = it;
	cp->tail = it;
	pthread_cond_signal(&cp->work);
	int rc = 0;
	if (wait) {
		while (!it->done)
			pthread_cond_wait(&cp->finished, &cp->lock);
		rc = it->result;
		free(it);
	}
	pthread_mutex_unlock(&cp->lock);
	return rc;
}

bool tr_checkpointer_busy(tr_checkpointer_t *cp, int64_t job_id)
{
	pthread_mutex_lock(&cp->lock);
	bool busy = job_busy(cp, job_id);
	pthread_mutex_unlock(&cp->lock);
	return busy;
}

void tr_checkpointer_wait_idle(tr_checkpointer_t *cp, int64_t job_id)
{
	pthread_mutex_lock(&cp->lock);
	while (job_busy(cp, job_id))
		pthread_cond_wait(&cp->finished, &cp->lock);
	bool idle = !cp->head && !cp->current;
	pthread_mutex_unlock(&cp->lock);
	/* The snapshot buffers kept for reuse (tr_snapshot_free) serve a
	 * running job's next checkpoint; with nothing left to write they
	 * would only hold memory (up to a model and its optimizer state).
	 * Likewise the spare checkpoint file, on disk. */
	if (idle) {
		tr_snapshot_trim();
		tr_store_ckpt_drop_spare(cp->store);
	}
}

void tr_checkpointer_destroy(tr_checkpointer_t *cp)
{
	if (!cp)
		return;
	pthread_mutex_lock(&cp->lock);
	cp->stopping = true;
	pthread_cond_signal(&cp->work);
	pthread_mutex_unlock(&cp->lock);
	pthread_join(cp->thread, NULL);
	pthread_cond_destroy(&cp->work);
	pthread_cond_destroy(&cp->finished);
	pthread_mutex_destroy(&cp->lock);
	free(cp);
}
