/* The CPU backend's conv2d entries: which route each call takes, and the
 * measured choice of the "auto" route (docs/design.md, "Convolution on CPU
 * devices").
 *
 * A call takes its layer's route (tr_conv2d_desc.route, set by the job from
 * its spec's cpu_conv) or, when the layer names none, the backend's.  AUTO
 * is decided per layer shape by measurement: the first time a shape is
 * asked about, each route runs its forward and backward once to warm up
 * (oneDNN creates its primitives) and then three times, alternating, at
 * the rows of the asking call, and the one with the lower best time is
 * kept.  The two routes give different
 * bits, so a decision must not change from run to run: decisions are kept
 * for the whole process, keyed by shape alone (not by rows, so every
 * device count takes the same route), and in a per-machine file
 * (tr_cpu_conv_cache_open; the daemon keeps it in its state directory)
 * keyed by CPU model and shape, so that a repeat of a job on the same
 * machine decides the same way without measuring.
 */
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/cpu/cpu_internal.h"

#define MAX_CHOICES 256

/* A layer's shape key, or a pair's ("pair " A " | " B) */
#define KEY_LEN 224

/* A decision between two arms, each timed: a layer's routes (IM2COL,
 * ONEDNN), or a pair's ways (IM2COL: each layer as chosen alone; ONEDNN:
 * both on oneDNN, chained), so that one table and one file keep both. */
struct choice {
	char shape[KEY_LEN];
	enum tr_cpu_conv route;
	double im2col_ms, onednn_ms; /* arm 0's time, arm 1's */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct choice choices[MAX_CHOICES];
static int n_choices;
/* Where choices are kept: the first file opened is read first (its
 * decisions win), and every new decision is written to each. */
#define MAX_CACHE_FILES 2
static char cache_paths[MAX_CACHE_FILES][1024];
static int n_cache_paths;
static char cpu_model[128];

static void shape_key(const struct tr_conv2d_desc *d, char *out, size_t n)
{
	snprintf(out, n, "c%d h%d w%d f%d k%dx%d s%dx%d p%dx%d d%dx%d g%d", d->c, d->h, d->w, d->f, d->kh, d->kw, d->sh,
		 d->sw, d->ph, d->pw, d->dh, d->dw, d->groups);
}

/* "model name" of /proc/cpuinfo, with family/model/stepping (a guest's
 * model name can be as vague as "AMD EPYC"). */
static void read_cpu_model(void)
{
	char name[96] = "unknown", fam[16] = "?", mod[16] = "?", step[16] = "?", line[512];
	FILE *f = fopen("/proc/cpuinfo", "r");
	if (f) {
		while (fgets(line, sizeof line, f) && strcmp(line, "\n") != 0) {
			char *v = strchr(line, ':');
			if (!v)
				continue;
			v += strspn(v + 1, " \t") + 1;
			v[strcspn(v, "\n")] = 0;
			if (!strncmp(line, "model name", 10))
				snprintf(name, sizeof name, "%s", v);
			else if (!strncmp(line, "cpu family", 10))
				snprintf(fam, sizeof fam, "%s", v);
			else if (!strncmp(line, "model\t", 6))
				snprintf(mod, sizeof mod, "%s", v);
			else if (!strncmp(line, "stepping", 8))
				snprintf(step, sizeof step, "%s", v);
		}
		fclose(f);
	}
	snprintf(cpu_model, sizeof cpu_model, "%s (family %s model %s stepping %s)", name, fam, mod, step);
}

static struct choice *find(const char *shape)
{
	for (int i = 0; i < n_choices; i++)
		if (!strcmp(choices[i].shape, shape))
			return &choices[i];
	return NULL;
}

static struct choice *add(const char *shape, enum tr_cpu_conv route, double im2col_ms, double onednn_ms)
{
	if (n_choices == MAX_CHOICES) /* forget the oldest; its shape is measured again if asked */
		memmove(choices, choices + 1, --n_choices * sizeof *choices);
	struct choice *c = &choices[n_choices++];
	snprintf(c->shape, sizeof c->shape, "%s", shape);
	c->route = route;
	c->im2col_ms = im2col_ms;
	c->onednn_ms = onednn_ms;
	return c;
}

/* The file: {"entries": [{"cpu", "shape", "route", "im2col_ms",
 * "onednn_ms"}, ...]}, every machine's entries kept (a state directory
 * moved to another machine decides afresh there). Under mu. */
static void cache_save_to(const char *cache_path)
{
	json_t *doc = NULL, *entries = NULL;
	json_error_t je;
	doc = json_load_file(cache_path, 0, &je);
	if (!doc || !json_is_array(json_object_get(doc, "entries"))) {
		json_decref(doc);
		doc = json_pack("{s:[]}", "entries");
	}
	entries = json_object_get(doc, "entries");
	for (int i = 0; i < n_choices; i++) {
		size_t k;
		json_t *e;
		bool have = false;
		json_array_foreach(entries, k, e) {
			const char *cpu = json_string_value(json_object_get(e, "cpu"));
			const char *sh = json_string_value(json_object_get(e, "shape"));
			if (cpu && sh && !strcmp(cpu, cpu_model) && !strcmp(sh, choices[i].shape))
				have = true;
		}
		if (!have)
			json_array_append_new(entries,
					      json_pack("{s:s,s:s,s:s,s:f,s:f}", "cpu", cpu_model, "shape",
							choices[i].shape, "route",
							choices[i].route == TR_CPU_CONV_ONEDNN ? "onednn" : "im2col",
							"im2col_ms", choices[i].im2col_ms, "onednn_ms",
							choices[i].onednn_ms));
	}
	char tmp[1100];
	snprintf(tmp, sizeof tmp, "%s.tmp%ld", cache_path, (long)getpid());
	/* a file that cannot be written only costs a measurement next time */
	if (json_dump_file(doc, tmp, JSON_INDENT(1)) != 0 || rename(tmp, cache_path) != 0)
		unlink(tmp);
	json_decref(doc);
}

static void cache_save(void)
{
	for (int i = 0; i < n_cache_paths; i++)
		cache_save_to(cache_paths[i]);
}

void tr_cpu_conv_cache_open(const char *path)
{
	pthread_mutex_lock(&mu);
	if (!cpu_model[0])
		read_cpu_model();
	if (path && n_cache_paths < MAX_CACHE_FILES)
		snprintf(cache_paths[n_cache_paths++], sizeof cache_paths[0], "%s", path);
	json_error_t je;
	json_t *doc = path ? json_load_file(path, 0, &je) : NULL;
	size_t k;
	json_t *e;
	json_array_foreach(json_object_get(doc, "entries"), k, e) {
		const char *cpu = json_string_value(json_object_get(e, "cpu"));
		const char *sh = json_string_value(json_object_get(e, "shape"));
		const char *route = json_string_value(json_object_get(e, "route"));
		if (!cpu || !sh || !route || strcmp(cpu, cpu_model) || find(sh) ||
		    strlen(sh) >= sizeof choices[0].shape)
			continue;
		if (strcmp(route, "onednn") && strcmp(route, "im2col"))
			continue;
		add(sh, strcmp(route, "onednn") ? TR_CPU_CONV_IM2COL : TR_CPU_CONV_ONEDNN,
		    json_number_value(json_object_get(e, "im2col_ms")),
		    json_number_value(json_object_get(e, "onednn_ms")));
	}
	json_decref(doc);
	pthread_mutex_unlock(&mu);
}

void tr_cpu_conv_choices_forget(void)
{
	pthread_mutex_lock(&mu);
	n_choices = 0;
	n_cache_paths = 0;
	pthread_mutex_unlock(&mu);
}

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* One route's forward + backward on the buffers: milliseconds, or a
 * negative errno. */
static double time_route(tr_backend_t *be, int dev, enum tr_cpu_conv route, const struct tr_conv2d_desc *d, int rows,
			 float *const *buf)
{
	double t0 = now_ms();
	{
		int rc = route == TR_CPU_CONV_ONEDNN
				 ? tr_cpu_dnnl_conv2d_forward(be, dev, d, rows, buf[0], buf[1], buf[2], buf[3], buf[8])
				 : tr_cpu_im2col_conv2d_forward(be, dev, d, rows, buf[0], buf[1], buf[2], buf[3],
								buf[8]);
		if (rc == 0)
			rc = route == TR_CPU_CONV_ONEDNN
				     ? tr_cpu_dnnl_conv2d_backward(be, dev, d, rows, buf[0], buf[1], buf[4], buf[5],
								   buf[6], buf[7], buf[8])
				     : tr_cpu_im2col_conv2d_backward(be, dev, d, rows, buf[0], buf[1], buf[4], buf[5],
								     buf[6], buf[7], buf[8]);
		if (rc < 0)
			return rc;
	}
	return now_ms() - t0;
}

/* Buffers for one layer's forward and backward at `rows`: x, w, bias, y,
 * dy, dx, dw, dbias, work (a blocked activation of a chain takes as many
 * floats as its plain one: chains need channels in 16s).  0, or an error
 * set on the backend. */
#define NBUF 9
static int alloc_buffers(tr_backend_t *be, const struct tr_conv2d_desc *d, int rows, float **buf)
{
	size_t in = (size_t)rows * d->c * d->h * d->w, out = (size_t)rows * d->f * d->ho * d->wo;
	size_t nw = (size_t)d->f * (d->c / d->groups) * d->kh * d->kw;
	size_t n[NBUF] = {in, nw, (size_t)d->f, out, out, in, nw, (size_t)d->f, tr_conv2d_workspace(d, rows)};
	for (int i = 0; i < NBUF; i++) {
		buf[i] = malloc((n[i] ? n[i] : 1) * sizeof(float));
		if (!buf[i])
			return tr_cpu_set_error(be, -ENOMEM, "conv2d: out of memory to measure the routes");
		for (size_t e = 0; e < n[i]; e++) /* small values of both signs, no denormals */
			buf[i][e] = (float)((int)(e * 2654435761u % 17) - 8) * 0.01f;
	}
	return 0;
}

static void free_buffers(float **buf)
{
	for (int i = 0; i < NBUF; i++)
		free(buf[i]), buf[i] = NULL;
}

/* Runs `arms` candidates, each timed by time_arm(arm, ctx), once to warm
 * up (oneDNN creates its primitives, caches fill), then TIMED_ROUNDS
 * rounds of all of them in turn, the minimum of each kept in ms[arm], so
 * that a burst of other work on the machine hits every arm alike. */
#define TIMED_ROUNDS 3
static int race(int arms, double (*time_arm)(int arm, void *ctx), void *ctx, double *ms)
{
	for (int round = 0; round <= TIMED_ROUNDS; round++)
		for (int r = 0; r < arms; r++) {
			double t = time_arm(r, ctx);
			if (t < 0)
				return (int)t;
			if (round == 1 || (round > 1 && t < ms[r]))
				ms[r] = t;
		}
	return 0;
}

struct layer_race {
	tr_backend_t *be;
	int dev, rows;
	const struct tr_conv2d_desc *d;
	float *buf[NBUF];
};

/* arm 0: im2col, arm 1: oneDNN */
static double time_layer_arm(int arm, void *ctx)
{
	struct layer_race *lr = ctx;
	return time_route(lr->be, lr->dev, arm ? TR_CPU_CONV_ONEDNN : TR_CPU_CONV_IM2COL, lr->d, lr->rows, lr->buf);
}

/* Measures both routes of a layer_race's layer (under mu). */
static int measure_layer(void *ctx, double ms[2])
{
	struct layer_race *lr = ctx;
	int rc = alloc_buffers(lr->be, lr->d, lr->rows, lr->buf);
	if (rc == 0)
		rc = race(2, time_layer_arm, lr, ms);
	free_buffers(lr->buf);
	return rc;
}

/* The decision kept under `key` (this process's, or the machine file's),
 * or one made now by measure_arms: arm 1 (ONEDNN) where it measured
 * faster than arm 0 (IM2COL), a tie going to arm 0.  A copy in *out,
 * *measured saying which.  0, or measure_arms's negative errno. */
static int decide(const char *key, int (*measure_arms)(void *ctx, double ms[2]), void *ctx, struct choice *out,
		  bool *measured)
{
	pthread_mutex_lock(&mu);
	if (!cpu_model[0])
		read_cpu_model();
	struct choice *ch = find(key);
	int rc = 0;
	*measured = !ch;
	if (!ch) {
		double ms[2];
		if ((rc = measure_arms(ctx, ms)) == 0) {
			ch = add(key, ms[1] < ms[0] ? TR_CPU_CONV_ONEDNN : TR_CPU_CONV_IM2COL, ms[0], ms[1]);
			cache_save();
		}
	}
	if (ch)
		*out = *ch;
	pthread_mutex_unlock(&mu);
	return rc;
}

int tr_cpu_conv_route(tr_backend_t *be, int dev, const struct tr_conv2d_desc *d, int rows, enum tr_cpu_conv want,
		      struct tr_conv_choice *out, struct tr_error *err)
{
	struct tr_conv_choice c = {.route = want};
	if (want == TR_CPU_CONV_ONEDNN && !tr_dnnl_available()) {
		tr_error_set(err, 0, 0, NULL,
			     "this build has no oneDNN convolutions (install libdnnl-dev and rebuild)");
		return -ENOTSUP;
	}
	if (want == TR_CPU_CONV_AUTO && !tr_dnnl_available())
		c.route = TR_CPU_CONV_IM2COL;
	if (c.route != TR_CPU_CONV_AUTO) {
		if (out)
			*out = c;
		return 0;
	}
	char shape[KEY_LEN];
	shape_key(d, shape, sizeof shape);
	/* a tie goes to im2col: it needs no second thread pool */
	struct layer_race lr = {.be = be, .dev = dev, .rows = rows < 1 ? 1 : rows, .d = d};
	struct choice ch;
	int rc = decide(shape, measure_layer, &lr, &ch, &c.measured);
	if (rc < 0) {
		tr_error_set(err, 0, 0, NULL, "conv2d: measuring the routes failed: %s", be->i->last_error(be));
		return rc;
	}
	c.route = ch.route;
	c.im2col_ms = ch.im2col_ms;
	c.onednn_ms = ch.onednn_ms;
	if (out)
		*out = c;
	return 0;
}

/* ---- two neighbours on different routes ------------------------------------ */

struct pair_race {
	tr_backend_t *be;
	int dev, rows;
	struct tr_conv2d_desc arm[2][2]; /* [split, chain][a, b] */
	float *buf[2][NBUF];
};

/* arm 0: each layer on its own route, NCHW between them; arm 1: both on
 * oneDNN, its blocked layout between them.  Each layer's forward and
 * backward. */
static double time_pair_arm(int arm, void *ctx)
{
	struct pair_race *pr = ctx;
	double total = 0;
	for (int i = 0; i < 2; i++) {
		const struct tr_conv2d_desc *d = &pr->arm[arm][i];
		double t = time_route(pr->be, pr->dev, (enum tr_cpu_conv)d->route, d, pr->rows, pr->buf[i]);
		if (t < 0)
			return t;
		total += t;
	}
	return total;
}

/* Measures a pair_race's two ways (under mu). */
static int measure_pair(void *ctx, double ms[2])
{
	struct pair_race *pr = ctx;
	int rc = 0;
	for (int i = 0; i < 2 && rc == 0; i++)
		rc = alloc_buffers(pr->be, &pr->arm[0][i], pr->rows, pr->buf[i]);
	if (rc == 0)
		rc = race(2, time_pair_arm, pr, ms);
	for (int i = 0; i < 2; i++)
		free_buffers(pr->buf[i]);
	return rc;
}

int tr_cpu_conv_pair_route(tr_backend_t *be, int dev, const struct tr_conv2d_desc *a, const struct tr_conv2d_desc *b,
			   int rows, struct tr_conv_pair_choice *out, struct tr_error *err)
{
	struct pair_race pr = {.be = be, .dev = dev, .rows = rows < 1 ? 1 : rows};
	*out = (struct tr_conv_pair_choice){0};
	if (a->route == b->route || a->route == TR_CPU_CONV_AUTO || b->route == TR_CPU_CONV_AUTO)
		return 0;
	for (int i = 0; i < 2; i++) {
		pr.arm[i][0] = *a;
		pr.arm[i][1] = *b;
		pr.arm[i][0].y_blocked = pr.arm[i][1].x_blocked = i;
		if (i)
			pr.arm[i][0].route = pr.arm[i][1].route = TR_CPU_CONV_ONEDNN;
	}
	if (!tr_cpu_conv_chain_ok(be, &pr.arm[1][0], &pr.arm[1][1], pr.rows))
		return 0;
	out->chainable = true;
	char ka[96], kb[96], key[KEY_LEN];
	shape_key(a, ka, sizeof ka);
	shape_key(b, kb, sizeof kb);
	snprintf(key, sizeof key, "pair %s %s | %s %s", ka, tr_cpu_conv_route_name((enum tr_cpu_conv)a->route), kb,
		 tr_cpu_conv_route_name((enum tr_cpu_conv)b->route));
	/* a tie keeps the routes each layer chose alone */
	struct choice ch;
	int rc = decide(key, measure_pair, &pr, &ch, &out->measured);
	if (rc < 0) {
		tr_error_set(err, 0, 0, NULL, "conv2d: measuring a pair of layers failed: %s", be->i->last_error(be));
		return rc;
	}
	out->join = ch.route == TR_CPU_CONV_ONEDNN;
	out->split_ms = ch.im2col_ms;
	out->chain_ms = ch.onednn_ms;
	return 0;
}

const char *tr_cpu_conv_route_name(enum tr_cpu_conv route)
{
	return route == TR_CPU_CONV_ONEDNN ? "onednn" : route == TR_CPU_CONV_IM2COL ? "im2col" : "auto";
}

/* ---- the backend's entries ------------------------------------------------ */

static int route_of(tr_backend_t *be, int dev, const struct tr_conv2d_desc *d, int rows, enum tr_cpu_conv *route)
{
	struct tr_conv_choice c;
	struct tr_error err;
	enum tr_cpu_conv want = d->route != TR_CPU_CONV_AUTO ? (enum tr_cpu_conv)d->route : tr_cpu_backend_conv(be);
	int rc = tr_cpu_conv_route(be, dev, d, rows, want, &c, &err);
	if (rc < 0)
		return tr_cpu_set_error(be, rc, "%s", err.message);
	*route = c.route;
	return 0;
}

/* im2col reads NCHW only: a blocked layer on it would compute garbage */
static int not_plain(tr_backend_t *be, const char *what)
{
	return tr_cpu_set_error(be, -EINVAL, "%s: a layer in oneDNN's blocked layout cannot take the im2col route",
				what);
}

static int conv2d_forward(tr_backend_t *be, int dev, const struct tr_conv2d_desc *d, int rows, const float *x,
			  const float *w, const float *bias, float *y, float *work)
{
	enum tr_cpu_conv route;
	int rc = route_of(be, dev, d, rows, &route);
	if (rc < 0)
		return rc;
	if (route == TR_CPU_CONV_ONEDNN)
		return tr_cpu_dnnl_conv2d_forward(be, dev, d, rows, x, w, bias, y, work);
	if (d->x_blocked || d->y_blocked)
		return not_plain(be, "conv2d_forward");
	return tr_cpu_im2col_conv2d_forward(be, dev, d, rows, x, w, bias, y, work);
}

static int conv2d_backward(tr_backend_t *be, int dev, const struct tr_conv2d_desc *d, int rows, const float *x,
			   const float *w, const float *dy, float *dx, float *dw, float *dbias, float *work)
{
	enum tr_cpu_conv route;
	int rc = route_of(be, dev, d, rows, &route);
	if (rc < 0)
		return rc;
	if (route == TR_CPU_CONV_ONEDNN)
		return tr_cpu_dnnl_conv2d_backward(be, dev, d, rows, x, w, dy, dx, dw, dbias, work);
	if (d->x_blocked || d->y_blocked)
		return not_plain(be, "conv2d_backward");
	return tr_cpu_im2col_conv2d_backward(be, dev, d, rows, x, w, dy, dx, dw, dbias, work);
}

void tr_cpu_conv_route_fill(tr_backend_i *t)
{
	t->conv2d_forward = conv2d_forward;
	t->conv2d_backward = conv2d_backward;
}
