/* The text of a GET /jobs/{id}/metrics answer, buffered or streamed.
 *
 * Answers are written as JSON text straight from the store's compact
 * series (a json_t per number would cost ten times the text).  A small
 * answer is rendered whole, for the response cache; a large one (an
 * undownsampled range, a high max_points, many series) is streamed: the
 * response's callback reads and renders one series at a time, each in a
 * read transaction of its own, so a request holds at most one series in
 * memory and no store connection while the client reads (docs/design.md,
 * "Storage").
 */
#include "api/metrics_stream.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- buffered ---- */

struct textbuf {
	char *p;
	size_t len, cap;
	bool oom;
};

static void put(struct textbuf *b, const char *s, size_t n)
{
	if (b->oom)
		return;
	if (b->len + n > b->cap) {
		size_t cap = b->cap ? b->cap : 4096;
		while (cap < b->len + n)
			cap *= 2;
		char *p = realloc(b->p, cap);
		if (!p) {
			b->oom = true;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
}

static void put_head(struct textbuf *b, int64_t job, int max_points)
{
	char head[96];
	int n = snprintf(head, sizeof head, "{\"job\":%" PRId64 ",\"max_points\":%d,\"series\":{", job, max_points);
	put(b, head, (size_t)n);
}

struct render {
	struct textbuf b;
	const struct tr_metrics_query *q;
	size_t points, max_points_total;
	int nseries;
	struct tr_error *e;
};

/* Positive "too large": tr_store_metrics_read passes it back. */
#define RENDER_TOO_LARGE 1

static int render_series(void *ctx, const struct tr_metrics_series *s)
{
	struct render *r = ctx;
	char *text;
	size_t len;

	r->points += s->n;
	if (r->max_points_total && r->points > r->max_points_total)
		return RENDER_TOO_LARGE;
	if (tr_metrics_series_text(s, r->q->with_epochs, r->q->with_times, &text, &len, r->e) < 0)
		return -ENOMEM;
	if (r->nseries++)
		put(&r->b, ",", 1);
	put(&r->b, text, len);
	free(text);
	return r->b.oom ? -ENOMEM : 0;
}

int tr_api_metrics_render(tr_store_t *store, int64_t job, const struct tr_metrics_query *q, size_t max_points_total,
			  char **text, size_t *len, struct tr_error *e)
{
	struct render r = {.q = q, .max_points_total = max_points_total, .e = e};

	put_head(&r.b, job, q->max_points);
	int rc = tr_store_metrics_read(store, job, q, render_series, &r, e);
	put(&r.b, "}}\n", 3);
	if (rc == 0 && r.b.oom)
		rc = tr_error_set(e, -ENOMEM, 0, NULL, "out of memory");
	if (rc != 0) {
		free(r.b.p);
		return rc == RENDER_TOO_LARGE ? -EFBIG : rc;
	}
	*text = r.b.p;
	*len = r.b.len;
	return 0;
}

/* ---- streamed ---- */

/* Reading a series holds its points (48 bytes each, up to 100,000 per
 * series without downsampling) until they are rendered; a few readers at
 * a time bound that memory whatever the number of clients.  The rendered
 * text of each stream stays until its client has read it. */
#define READERS_MAX 2

static pthread_mutex_t readers_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t readers_cond = PTHREAD_COND_INITIALIZER;
static int readers;

static void reader_enter(void)
{
	pthread_mutex_lock(&readers_lock);
	while (readers >= READERS_MAX)
		pthread_cond_wait(&readers_cond, &readers_lock);
	readers++;
	pthread_mutex_unlock(&readers_lock);
}

static void reader_leave(void)
{
	pthread_mutex_lock(&readers_lock);
	readers--;
	pthread_cond_signal(&readers_cond);
	pthread_mutex_unlock(&readers_lock);
}

struct stream {
	tr_store_t *store;
	int64_t job;
	struct tr_metrics_query q;
	char **names;
	size_t nnames, next; /* the next name to read */
	struct textbuf b;    /* rendered, not yet sent from off */
	size_t off;
	bool comma; /* a ',' goes out before b */
	int nseries;
	bool done;
};

static void stream_free(void *cls)
{
	struct stream *st = cls;

	if (!st)
		return;
	for (size_t i = 0; i < st->nnames; i++)
		free(st->names[i]);
	free(st->names);
	free(st->b.p);
	free(st);
}

static int stream_series(void *ctx, const struct tr_metrics_series *s)
{
	struct stream *st = ctx;
	char *text;
	size_t len;

	if (tr_metrics_series_text(s, st->q.with_epochs, st->q.with_times, &text, &len, NULL) < 0)
		return -ENOMEM;
	/* The text becomes the buffer (no copy); the comma goes out first. */
	st->comma = st->nseries++ > 0;
	free(st->b.p);
	st->b = (struct textbuf){text, len, len, false};
	return 0;
}

/* Refills the buffer with the next series (or the end); false on error. */
static bool stream_refill(struct stream *st)
{
	free(st->b.p);
	st->b = (struct textbuf){0};
	st->off = 0;
	while (st->b.len == 0 && st->next < st->nnames) {
		const char *one[2] = {st->names[st->next++], NULL};
		struct tr_metrics_query q = st->q;

		q.names = one;
		reader_enter();
		int rc = tr_store_metrics_read(st->store, st->job, &q, stream_series, st, NULL); /* cuts the body */
		reader_leave();
		if (rc != 0)
			return false;
	}
	if (st->b.len == 0 && !st->done) {
		put(&st->b, "}}\n", 3);
		st->done = true;
	}
	return !st->b.oom;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct stream *st = cls;

	(void)pos;
	if (st->off == st->b.len) {
		if (st->done)
			return MHD_CONTENT_READER_END_OF_STREAM;
		if (!stream_refill(st))
			return MHD_CONTENT_READER_END_WITH_ERROR;
		if (st->off == st->b.len)
			return MHD_CONTENT_READER_END_OF_STREAM;
	}
	if (st->comma && max > 0) {
		st->comma = false;
		buf[0] = ',';
		return 1;
	}
	size_t n = st->b.len - st->off;
	if (n > max)
		n = max;
	memcpy(buf, st->b.p + st->off, n);
	st->off += n;
	return (ssize_t)n;
}

static int copy_names(struct stream *st, const char *const *names, tr_store_t *store, struct tr_error *e)
{
	json_t *all = NULL;
	size_t n = 0;

	if (names) {
		while (names[n])
			n++;
	} else {
		all = tr_store_metric_names(store, st->job, e);
		if (!all)
			return -EIO;
		n = json_array_size(all);
	}
	st->names = calloc(n ? n : 1, sizeof *st->names);
	if (!st->names)
		goto oom;
	for (size_t i = 0; i < n; i++) {
		const char *name = names ? names[i] : json_string_value(json_array_get(all, i));
		if (!(st->names[i] = strdup(name)))
			goto oom;
		st->nnames++;
	}
	json_decref(all);
	return 0;
oom:
	json_decref(all);
	return -ENOMEM;
}

static int cmp_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

struct MHD_Response *tr_api_metrics_stream(tr_store_t *store, int64_t job, const struct tr_metrics_query *q,
					   struct tr_error *e)
{
	struct stream *st = calloc(1, sizeof *st);
	struct MHD_Response *resp;

	if (!st)
		return NULL;
	st->store = store;
	st->job = job;
	st->q = *q;
	st->q.names = NULL;
	if (copy_names(st, q->names, store, e) < 0)
		goto fail;
	/* Name order, one series per name, as the buffered answer has. */
	qsort(st->names, st->nnames, sizeof *st->names, cmp_name);
	size_t m = 0;
	for (size_t i = 0; i < st->nnames; i++) {
		if (m > 0 && strcmp(st->names[i], st->names[m - 1]) == 0) {
			free(st->names[i]);
			continue;
		}
		st->names[m++] = st->names[i];
	}
	st->nnames = m;
	put_head(&st->b, job, q->max_points);
	if (st->b.oom)
		goto fail;
	resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024, stream_read, st, stream_free);
	if (!resp)
		goto fail;
	return resp;
fail:
	stream_free(st);
	return NULL;
}
