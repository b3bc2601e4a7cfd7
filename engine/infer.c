/* Batched inference and evaluation figures (see infer.h).
 *
 * The calling thread is rank 0 and the coordinator: it takes each batch
 * from the prefetch ring, releases ranks 1..D-1 with a generation counter,
 * runs its own share, waits for theirs, and hands the batch's outputs to
 * the callback while the loaders fill the next slots.  A batch is split as
 * a training step is (tr_plan_share), so each rank knows its rows without
 * asking.  No gradients, no collectives: the ranks never wait on each
 * other inside a batch, so an error on one cannot block another.
 */
#include "engine/infer.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/data/plan.h"
#include "engine/data/prefetch.h"

#define MAX_RANKS 64

struct infer;

struct rank {
	struct infer *in;
	int rank;
	tr_replica_t rep;
	pthread_t thread;
	bool started;
	int rc;
	char err[256];
};

struct infer {
	const struct tr_infer_options *o;
	int ndev;
	struct rank ranks[MAX_RANKS];
	pthread_mutex_t lock;
	pthread_cond_t go, done;
	int64_t gen;
	int finished;
	bool quit;
	const struct tr_batch *batch;
	float *out; /* batch x outputs, host */
};

/* This rank's share of the current batch: upload, forward, outputs back. */
static int rank_batch(struct infer *in, struct rank *rk)
{
	const struct tr_batch *b = in->batch;
	tr_replica_t *r = &rk->rep;
	tr_backend_t *be = r->be;
	const tr_model_t *m = in->o->model;
	int off, len;
	tr_plan_share(b->count, in->ndev, rk->rank, &off, &len);
	if (len == 0)
		return 0;
	int rc = be->i->to_device(be, r->dev, r->input, b->x + (size_t)off * m->inputs,
				  (size_t)len * m->inputs * sizeof(float));
	if (rc == 0)
		rc = tr_replica_forward(r, len, 0, 0, 0);
	if (rc == 0)
		rc = be->i->to_host(be, r->dev, in->out + (size_t)off * m->outputs, r->acts[m->n_layers],
				    (size_t)len * m->outputs * sizeof(float));
	if (rc == 0)
		rc = be->i->sync(be, r->dev);
	if (rc < 0)
		snprintf(rk->err, sizeof rk->err, "device %d: %s", r->dev, be->i->last_error(be));
	return rc;
}

static void *rank_main(void *arg)
{
	struct rank *rk = arg;
	struct infer *in = rk->in;
	int64_t seen = 0;
	for (;;) {
		pthread_mutex_lock(&in->lock);
		while (in->gen == seen && !in->quit)
			pthread_cond_wait(&in->go, &in->lock);
		if (in->quit) {
			pthread_mutex_unlock(&in->lock);
			return NULL;
		}
		seen = in->gen;
		pthread_mutex_unlock(&in->lock);
		rk->rc = rank_batch(in, rk);
		pthread_mutex_lock(&in->lock);
		in->finished++;
		pthread_cond_signal(&in->done);
		pthread_mutex_unlock(&in->lock);
	}
}

static int run_batch(struct infer *in, struct tr_error *err)
{
	pthread_mutex_lock(&in->lock);
	in->finished = 0;
	in->gen++;
	pthread_cond_broadcast(&in->go);
	pthread_mutex_unlock(&in->lock);
	in->ranks[0].rc = rank_batch(in, &in->ranks[0]);
	pthread_mutex_lock(&in->lock);
	while (in->finished < in->ndev - 1)
		pthread_cond_wait(&in->done, &in->lock);
	pthread_mutex_unlock(&in->lock);
	for (int i = 0; i < in->ndev; i++) {
		if (in->ranks[i].rc < 0) {
			tr_error_set(err, 0, 0, NULL, "%s", in->ranks[i].err);
			return in->ranks[i].rc;
		}
	}
	return 0;
}

int tr_infer_run(const struct tr_infer_options *o, struct tr_error *err)
{
	struct infer *in = calloc(1, sizeof *in);
	const tr_model_t *m = o->model;
	tr_backend_t *be = o->backend;
	tr_reader_t *rd = o->reader;
	tr_prefetch_t *pf = NULL;
	int rc = -ENOMEM;
	if (!in) {
		tr_error_set(err, 0, 0, NULL, "out of memory");
		return -ENOMEM;
	}
	in->o = o;
	pthread_mutex_init(&in->lock, NULL);
	pthread_cond_init(&in->go, NULL);
	pthread_cond_init(&in->done, NULL);
	if (rd->info.features != m->inputs) {
		tr_error_set(err, 0, 0, NULL, "%s: %d features per sample, the model takes %d", rd->name,
			     rd->info.features, m->inputs);
		rc = -EINVAL;
		goto out;
	}
	int avail = be->i->device_count(be);
	in->ndev = o->n_device_ids > 0 ? o->n_device_ids : o->count > 0 ? o->count : avail;
	if (in->ndev > avail && o->n_device_ids == 0)
		in->ndev = avail;
	if (in->ndev < 1 || in->ndev > MAX_RANKS) {
		tr_error_set(err, 0, 0, NULL, "no devices to run on (%d asked, %d present)", in->ndev, avail);
		rc = -EINVAL;
		goto out;
	}
	int batch = o->batch > 0 ? o->batch : 256;
	if (rd->info.samples < 1) {
		tr_error_set(err, 0, 0, NULL, "%s: no samples", rd->name);
		rc = -EINVAL;
		goto out;
	}
	struct tr_plan plan;
	if ((rc = tr_plan_init(&plan, rd->info.samples, batch, TR_LAST_PARTIAL, false, 0, 1, 0, err)) < 0)
		goto out;
	int share = (batch + in->ndev - 1) / in->ndev;
	for (int i = 0; i < in->ndev; i++) {
		struct rank *rk = &in->ranks[i];
		int dev = o->n_device_ids > 0 ? o->device_ids[i] : i;
		rk->in = in;
		rk->rank = i;
		if (dev < 0 || dev >= avail) {
			tr_error_set(err, 0, 0, NULL, "device %d does not exist (%d present)", dev, avail);
			rc = -EINVAL;
			goto out;
		}
		/* label_dim 1: the replica's label buffer is never read here. */
		if ((rc = tr_replica_init(&rk->rep, m, be, dev, share, 1, 0, err)) < 0)
			goto out;
		if ((rc = be->i->to_device(be, dev, rk->rep.params, o->params, m->n_params * sizeof(float))) < 0 ||
		    (rc = be->i->sync(be, dev)) < 0) {
			tr_error_set(err, 0, 0, NULL, "device %d: %s", dev, be->i->last_error(be));
			goto out;
		}
	}
	in->out = malloc((size_t)batch * m->outputs * sizeof(float));
	if (!in->out) {
		tr_error_set(err, 0, 0, NULL, "out of memory for %d outputs", batch * m->outputs);
		rc = -ENOMEM;
		goto out;
	}
	struct tr_prefetch_config pc = {
		.reader = rd,
		.transforms = o->transforms,
		.plan = &plan,
		.backend = be,
		.workers = o->workers > 0 ? o->workers : 2,
		.depth = o->depth > 0 ? o->depth : 4,
		.first_step = 0,
		.end_step = plan.total_steps,
		.inference = true,
	};
	if ((rc = tr_prefetch_create(&pc, &pf, err)) < 0)
		goto out;
	for (int i = 1; i < in->ndev; i++) {
		if (pthread_create(&in->ranks[i].thread, NULL, rank_main, &in->ranks[i]) != 0) {
			tr_error_set(err, 0, 0, NULL, "cannot start a device thread");
			rc = -EAGAIN;
			goto out;
		}
		in->ranks[i].started = true;
	}
	for (int64_t s = 0; s < plan.total_steps; s++) {
		if (o->cancel && atomic_load(o->cancel)) {
			tr_error_set(err, 0, 0, NULL, "cancelled");
			rc = -ECANCELED;
			break;
		}
		const struct tr_batch *b;
		double wait;
		rc = tr_prefetch_next(pf, s, &b, &wait);
		if (rc < 0) {
			tr_error_set(err, 0, 0, NULL, "%s", rc == -EIO ? tr_prefetch_error(pf) : "cancelled");
			/* A loader error is the data's (a file truncated, unreadable
			 * or changed, named in err): callers tell it from a device's. */
			if (rc == -EIO)
				rc = -EINVAL;
			break;
		}
		in->batch = b;
		rc = run_batch(in, err);
		/* Plan order without shuffling: batch s holds samples
		 * [s * batch, s * batch + count). */
		if (rc == 0)
			rc = o->on_batch(o->ctx, s * batch, b->count, in->out, rd->info.label_dim > 0 ? b->y : NULL,
					 rd->info.label_dim);
		tr_prefetch_release(pf, s);
		if (rc != 0)
			break;
	}
out:
	pthread_mutex_lock(&in->lock);
	in->quit = true;
	pthread_cond_broadcast(&in->go);
	pthread_mutex_unlock(&in->lock);
	for (int i = 1; i < in->ndev && i < MAX_RANKS; i++)
		if (in->ranks[i].started)
			pthread_join(in->ranks[i].thread, NULL);
	tr_prefetch_destroy(pf);
	for (int i = 0; i < MAX_RANKS; i++)
		tr_replica_finish(&in->ranks[i].rep);
	free(in->out);
	pthread_cond_destroy(&in->go);
	pthread_cond_destroy(&in->done);
	pthread_mutex_destroy(&in->lock);
	free(in);
	return rc;
}

/* ---- figures ------------------------------------------------------------- */

int tr_eval_acc_init(struct tr_eval_acc *a, bool classification, int outputs)
{
	memset(a, 0, sizeof *a);
	a->classification = classification;
	a->outputs = outputs;
	size_t k = (size_t)outputs;
	if (classification) {
		a->confusion = calloc(k * k, sizeof *a->confusion);
		return a->confusion ? 0 : -ENOMEM;
	}
	a->shift = calloc(k, sizeof(double));
	a->s1 = calloc(k, sizeof(double));
	a->s2 = calloc(k, sizeof(double));
	a->se = calloc(k, sizeof(double));
	a->ae = calloc(k, sizeof(double));
	if (!a->shift || !a->s1 || !a->s2 || !a->se || !a->ae) {
		tr_eval_acc_finish(a);
		return -ENOMEM;
	}
	return 0;
}

void tr_eval_acc_finish(struct tr_eval_acc *a)
{
	free(a->confusion);
	free(a->shift);
	free(a->s1);
	free(a->s2);
	free(a->se);
	free(a->ae);
	memset(a, 0, sizeof *a);
}

int tr_eval_acc_add(struct tr_eval_acc *a, int64_t first, int rows, const float *outputs, const float *labels,
		    struct tr_error *err)
{
	const int K = a->outputs;
	for (int r = 0; r < rows; r++) {
		const float *z = outputs + (size_t)r * K;
		if (a->classification) {
			float lf = labels[r];
			int y = (int)lf;
			if (!(lf >= 0.0f && lf < (float)K) || (float)y != lf) {
				tr_error_set(err, 0, 0, NULL,
					     "sample %lld: label %g is not a class of this model (0 to %d)",
					     (long long)(first + r), (double)lf, K - 1);
				return -EINVAL;
			}
			/* As the training loss: log-sum-exp around the maximum;
			 * ties go to the lower class, as argmax does. */
			int arg = 0;
			for (int c = 1; c < K; c++)
				if (z[c] > z[arg])
					arg = c;
			double sum = 0.0;
			for (int c = 0; c < K; c++)
				sum += exp((double)z[c] - (double)z[arg]);
			a->loss_sum += (double)z[arg] + log(sum) - (double)z[y];
			a->correct += arg == y;
			a->confusion[(size_t)y * K + arg]++;
		} else {
			const float *t = labels + (size_t)r * K;
			double row = 0.0;
			for (int c = 0; c < K; c++) {
				if (a->n == 0)
					a->shift[c] = t[c];
				double d = (double)z[c] - (double)t[c], u = (double)t[c] - a->shift[c];
				row += d * d;
				a->se[c] += d * d;
				a->ae[c] += fabs(d);
				a->s1[c] += u;
				a->s2[c] += u * u;
			}
			a->loss_sum += row / K;
		}
		a->n++;
	}
	return 0;
}

/* NAN (and infinities) as null: JSON has no NaN. */
static json_t *num(double v)
{
	return isfinite(v) ? json_real(v) : json_null();
}

json_t *tr_eval_acc_json(const struct tr_eval_acc *a, const char *prefix)
{
	char key[64];
	double n = (double)a->n;
	json_t *o = json_pack("{s:I}", "samples", (json_int_t)a->n);
	if (!o)
		return NULL;
#define PUT(name, value)                                                       \
	do {                                                                   \
		snprintf(key, sizeof key, "%s%s", prefix ? prefix : "", name); \
		json_object_set_new(o, key, num(value));                       \
	} while (0)
	PUT("loss", a->n ? a->loss_sum / n : NAN);
	if (a->classification) {
		PUT("accuracy", a->n ? a->correct / n : NAN);
		json_t *cm = json_array();
		for (int i = 0; cm && i < a->outputs; i++) {
			json_t *row = json_array();
			for (int j = 0; row && j < a->outputs; j++)
				json_array_append_new(row, json_integer(a->confusion[(size_t)i * a->outputs + j]));
			json_array_append_new(cm, row);
		}
		json_object_set_new(o, "confusion_matrix", cm);
	} else {
		double se = 0, ae = 0, r2 = 0;
		bool r2_ok = a->n > 0;
		for (int c = 0; c < a->outputs; c++) {
			se += a->se[c];
			ae += a->ae[c];
			double m1 = a->s1[c] / n, ss_tot = a->s2[c] - n * m1 * m1;
			if (!(ss_tot > 0))
				r2_ok = false; /* a constant target: R^2 is undefined */
			else
				r2 += 1.0 - a->se[c] / ss_tot;
		}
		double cells = n * a->outputs;
		PUT("mse", a->n ? se / cells : NAN);
		PUT("mae", a->n ? ae / cells : NAN);
		PUT("r2", r2_ok ? r2 / a->outputs : NAN);
	}
#undef PUT
	return o;
}
