/* Job state changes the state database could not take yet.
 *
 * A change that has happened (a job ended, was cancelled) must not be lost
 * because the disk is full or the state directory read-only: it is held
 * here, in the order the changes happened, written by the metrics writer
 * as soon as storage works (storage/metrics_queue.c), and shown by every job query
 * meanwhile (tr_store_job_overlay), so the API tells the truth and the
 * scheduler never starts a job whose cancellation is still unwritten.
 * st_lock orders every state write, held or direct, so a job's changes
 * reach the database in the order they were made.
 *
 * At shutdown what still cannot be written goes to a side file beside the
 * database, one JSON object per line, which the next open applies; when
 * even that cannot be written the changes are lost, and the caller is
 * told which (docs/design.md, "Storage failures").
 */
#include "storage/internal.h"

#include "core/job.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void entry_free(struct pending_state *p)
{
	free(p->error);
	free(p->devices);
}

static void remove_at(tr_store_t *s, size_t i)
{
	entry_free(&s->pst[i]);
	memmove(&s->pst[i], &s->pst[i + 1], (s->npst - i - 1) * sizeof *s->pst);
	s->npst--;
	atomic_store(&s->pst_count, s->npst);
}

/* With st_lock held.  Copies the strings. */
static int append_locked(tr_store_t *s, int64_t id, enum tr_job_state state, const char *error, const char *devices,
			 double at, struct tr_error *e)
{
	if (s->npst >= STORE_PENDING_STATES_MAX)
		return tr_error_set(e, -ENOBUFS, 0, NULL, "%d job state changes are already waiting for storage",
				    STORE_PENDING_STATES_MAX);
	if (s->npst == s->cappst) {
		size_t cap = s->cappst ? 2 * s->cappst : 16;
		struct pending_state *n = realloc(s->pst, cap * sizeof *n);
		if (!n)
			return tr_error_set(e, -ENOMEM, 0, NULL, "out of memory");
		s->pst = n;
		s->cappst = cap;
	}
	struct pending_state p = {.job_id = id, .state = state, .at = at};
	p.error = error ? strdup(error) : NULL;
	p.devices = devices ? strdup(devices) : NULL;
	if ((error && !p.error) || (devices && !p.devices)) {
		entry_free(&p);
		return tr_error_set(e, -ENOMEM, 0, NULL, "out of memory");
	}
	s->pst[s->npst++] = p;
	atomic_store(&s->pst_count, s->npst);
	return 0;
}

static char *side_path(tr_store_t *s)
{
	size_t n = strlen(s->path) + sizeof "-unrecorded-states";
	char *p = malloc(n);
	if (p)
		snprintf(p, n, "%s-unrecorded-states", s->path);
	return p;
}

int tr_store_states_drain_locked(tr_store_t *s, struct conn *c)
{
	int err = 0;
	while (s->npst > 0) {
		struct pending_state *p = &s->pst[0];
		int64_t event_id = 0, id = p->job_id;
		err = tr_store_job_write_state(c, id, p->state, p->error, p->devices, p->at, &event_id);
		if (err < 0 && tr_store_err_transient(err))
			break;
		/* Written, or never can be (the job was deleted meanwhile). */
		remove_at(s, 0);
		if (err == 0)
			tr_store_events_committed(s, event_id, &id, 1);
		else
			tr_store_job_data_changed(s, id);
		err = 0;
	}
	if (err == 0 && s->pst_saved) {
		/* The side file's changes are all written now. */
		char *side = side_path(s);
		if (side)
			unlink(side);
		free(side);
		s->pst_saved = false;
	}
	return err;
}

int tr_store_states_retry(tr_store_t *s, struct conn *c)
{
	pthread_mutex_lock(&s->st_lock);
	int err = s->npst ? tr_store_states_drain_locked(s, c) : 0;
	pthread_mutex_unlock(&s->st_lock);
	return err;
}

size_t tr_store_states_pending(tr_store_t *s)
{
	return atomic_load(&s->pst_count);
}

size_t tr_store_job_states_pending(tr_store_t *s)
{
	return tr_store_states_pending(s);
}

void tr_store_states_forget(tr_store_t *s, int64_t job_id)
{
	pthread_mutex_lock(&s->st_lock);
	for (size_t i = 0; i < s->npst;)
		if (s->pst[i].job_id == job_id)
			remove_at(s, i);
		else
			i++;
	pthread_mutex_unlock(&s->st_lock);
}

static int replace(char **dst, const char *src)
{
	char *n = src ? strdup(src) : NULL;
	if (src && !n)
		return -ENOMEM;
	free(*dst);
	*dst = n;
	return 0;
}

void tr_store_job_overlay(tr_store_t *s, struct tr_job_row *row)
{
	/* st_lock is held across state writes: readers skip it when nothing
	 * is held, so a slow write never delays a GET. */
	if (atomic_load(&s->pst_count) == 0)
		return;
	pthread_mutex_lock(&s->st_lock);
	for (size_t i = 0; i < s->npst; i++) {
		const struct pending_state *p = &s->pst[i];
		if (p->job_id != row->id)
			continue;
		bool was_terminal = tr_job_state_terminal(row->state);
		/* The same stamps tr_store_job_write_state will give it. */
		if (replace(&row->error, p->error) < 0 || (p->devices && replace(&row->devices, p->devices) < 0))
			break; /* out of memory: shows what the database has */
		row->state = p->state;
		if (p->state == TR_JOB_RUNNING && row->started_at == 0)
			row->started_at = p->at;
		if (!tr_job_state_terminal(p->state))
			row->finished_at = 0;
		else if (!was_terminal || row->finished_at == 0)
			row->finished_at = p->at;
		row->state_pending = true;
	}
	pthread_mutex_unlock(&s->st_lock);
}

int tr_store_job_record_state(tr_store_t *s, int64_t id, enum tr_job_state state, const char *error_json,
			      const char *devices_json, struct tr_error *e)
{
	int err = tr_store_job_set_state(s, id, state, error_json, devices_json, e);
	if (err == 0 || !tr_store_err_transient(err))
		return err;
	/* The write failed for want of storage: hold it.  A change made in
	 * between (another thread) went behind ours in the queue or failed
	 * too; either way the order holds, since every state write takes
	 * st_lock and drains first. */
	pthread_mutex_lock(&s->st_lock);
	err = append_locked(s, id, state, error_json, devices_json, tr_store_now(), e);
	pthread_mutex_unlock(&s->st_lock);
	if (err < 0)
		return err;
	tr_store_job_data_changed(s, id);
	pthread_mutex_lock(&s->q_lock); /* the writer tries it again */
	pthread_cond_signal(&s->q_work);
	pthread_mutex_unlock(&s->q_lock);
	/* e keeps the write's message: the caller may log why it is held. */
	return 1;
}

/* ---- the side file ------------------------------------------------------------ */

static json_t *entry_json(const struct pending_state *p)
{
	return json_pack("{s:I, s:s, s:s*, s:s*, s:f}", "job", (json_int_t)p->job_id, "state",
			 tr_job_state_name(p->state), "error", p->error, "devices", p->devices, "at", p->at);
}

/* Writes the held changes to path (a temporary name, synced, renamed). */
static int write_side(tr_store_t *s, const char *path, struct tr_error *e)
{
	size_t n = strlen(path) + 5;
	char *tmp = malloc(n);
	if (!tmp)
		return tr_error_set(e, -ENOMEM, 0, NULL, "out of memory");
	snprintf(tmp, n, "%s.tmp", path);
	int err = 0;
	FILE *f = fopen(tmp, "w");
	if (!f) {
		err = tr_error_set(e, -errno, 0, NULL, "%s: %s", tmp, strerror(errno));
		goto cleanup;
	}
	for (size_t i = 0; i < s->npst && !err; i++) {
		json_t *j = entry_json(&s->pst[i]);
		char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
		if (!text || fprintf(f, "%s\n", text) < 0)
			err = tr_error_set(e, text ? -errno : -ENOMEM, 0, NULL, "%s: cannot write", tmp);
		free(text);
		json_decref(j);
	}
	if (!err && (fflush(f) != 0 || fdatasync(fileno(f)) != 0))
		err = tr_error_set(e, -errno, 0, NULL, "%s: %s", tmp, strerror(errno));
	if (fclose(f) != 0 && !err)
		err = tr_error_set(e, -errno, 0, NULL, "%s: %s", tmp, strerror(errno));
	if (!err && rename(tmp, path) != 0)
		err = tr_error_set(e, -errno, 0, NULL, "%s: %s", path, strerror(errno));
	if (err)
		unlink(tmp);
cleanup:
	free(tmp);
	return err;
}

int tr_store_job_states_save(tr_store_t *s, char *msg, size_t msglen)
{
	if (msg && msglen)
		msg[0] = '\0';
	pthread_mutex_lock(&s->st_lock);
	if (s->npst) {
		/* A pooled connection: the writer may still be running.  What
		 * still fails is held, and reported as such below. */
		struct conn *c = tr_store_conn_lend(s, NULL);
		tr_store_states_drain_locked(s, c);
		tr_store_conn_put(s, c);
	}
	int n = (int)s->npst, err = 0;
	struct tr_error we = {0}; /* why the side file could not be written */
	char *side = n ? side_path(s) : NULL;
	if (n && !side)
		err = tr_error_set(&we, -ENOMEM, 0, NULL, "out of memory");
	if (n && side)
		err = write_side(s, side, &we);
	if (n && !err) {
		s->pst_saved = true;
		if (msg && msglen)
			snprintf(msg, msglen,
				 "%d job state change(s) could not be written to the state database; "
				 "saved to %s, written at the next start",
				 n, side);
	} else if (n) {
		/* Say exactly what is lost: the jobs and the states. */
		int len = snprintf(msg ? msg : NULL, msg ? msglen : 0,
				   "%d job state change(s) could not be written and are lost (%s):", n, we.message);
		for (size_t i = 0; msg && i < s->npst && len > 0 && (size_t)len < msglen; i++)
			len += snprintf(msg + len, msglen - (size_t)len, " job %lld %s;", (long long)s->pst[i].job_id,
					tr_job_state_name(s->pst[i].state));
	}
	pthread_mutex_unlock(&s->st_lock);
	free(side);
	return err < 0 ? err : n;
}

int tr_store_states_load(tr_store_t *s, struct tr_error *e)
{
	char *side = side_path(s);
	if (!side)
		return tr_error_set(e, -ENOMEM, 0, NULL, "out of memory");
	FILE *f = fopen(side, "r");
	int err = 0;
	if (!f) {
		if (errno != ENOENT)
			err = tr_error_set(e, -errno, 0, NULL, "%s: %s", side, strerror(errno));
		free(side);
		return err;
	}
	char *line = NULL;
	size_t cap = 0;
	int lineno = 0;
	pthread_mutex_lock(&s->st_lock);
	while (getline(&line, &cap, f) > 0 && !err) {
		lineno++;
		json_error_t jerr;
		json_t *j = json_loads(line, 0, &jerr);
		json_int_t id = 0;
		const char *state = NULL, *error = NULL, *devices = NULL;
		double at = 0;
		int st = -1;
		if (!j || json_unpack(j, "{s:I, s:s, s?s, s?s, s:F}", "job", &id, "state", &state, "error", &error,
				      "devices", &devices, "at", &at) != 0)
			/* A torn last line cannot happen (written whole, then
			 * renamed); anything else is not ours to guess at. */
			err = tr_error_set(e, -EINVAL, 0, NULL, "%s:%d: not a state change: %s", side, lineno,
					   j ? "wrong fields" : jerr.text);
		else if ((st = tr_job_state_parse(state)) < 0)
			err = tr_error_set(e, -EINVAL, 0, NULL, "%s:%d: not a state change: unknown state \"%s\"", side,
					   lineno, state);
		else
			err = append_locked(s, id, (enum tr_job_state)st, error, devices, at,
					    e); /* tr_store_open reports it */
		json_decref(j);
	}
	fclose(f);
	free(line);
	if (!err) {
		s->pst_saved = true; /* deleted once every change is written */
		/* Written now if storage allows; else they stay held, shown,
		 * and the writer tries again. */
		tr_store_states_drain_locked(s, &s->wconn);
	}
	pthread_mutex_unlock(&s->st_lock);
	free(side);
	return err;
}

void tr_store_states_free(tr_store_t *s)
{
	for (size_t i = 0; i < s->npst; i++)
		entry_free(&s->pst[i]);
	free(s->pst);
	s->pst = NULL;
	s->npst = s->cappst = 0;
	atomic_store(&s->pst_count, 0);
}
