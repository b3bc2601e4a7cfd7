/* oneDNN convolution for CPU devices (cpu_dnnl_conv.h).
 *
 * A call finds or builds a cache entry for its (direction, shape, bias):
 * the primitive, created with format "any" so that oneDNN picks its
 * blocked layouts, and for each tensor whose blocked layout differs from
 * trainerd's plain one a scratch buffer and the two reorders between them.
 * The user-side memory objects are rebound to the caller's pointers on
 * every call (dnnl_memory_set_data_handle), so one entry serves any
 * buffers of that shape.  Entries are evicted least recently used; a model
 * has a few shapes per layer (training batch, last partial batch,
 * validation chunk).
 */
#include "engine/cpu/cpu_dnnl_conv.h"

#include "engine/cpu/cpu_dnnl_check.h"
#include "engine/cpu/cpu_internal.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TR_HAVE_DNNL
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

enum dir { FWD, BWD_DATA, BWD_WEIGHTS };

#define MAX_SLOTS 4
/* per pool thread: a layer has up to 3 directions x 2 slice sizes per
 * batch size (training, last batch, validation) */
#define CACHE 128

struct slot {
	int arg; /* DNNL_ARG_* of the primitive */
	bool output;
	dnnl_memory_t user, prim; /* prim == user when layouts agree */
	dnnl_primitive_t to_prim, to_user;
	void *buf; /* blocked scratch, or NULL */
};

struct entry {
	bool used;
	enum dir dir;
	bool bias;
	struct tr_conv2d_geom g;
	uint64_t last;
	dnnl_primitive_t prim;
	int nslots;
	struct slot slots[MAX_SLOTS];
};

struct tr_dnnl_conv {
	dnnl_engine_t eng;
	dnnl_stream_t strm;
	int threads;
	uint64_t clock;
	struct entry cache[CACHE];
};

bool tr_dnnl_available(void)
{
	return true;
}

tr_dnnl_conv_t *tr_dnnl_conv_create(int threads, struct tr_error *err)
{
	tr_dnnl_conv_t *dc = calloc(1, sizeof *dc);
	if (!dc) {
		tr_error_set(err, 0, 0, NULL, "out of memory");
		return NULL;
	}
	dc->threads = threads < 1 ? 1 : threads;
	DN(dnnl_engine_create(&dc->eng, dnnl_cpu, 0), "engine_create");
	DN(dnnl_stream_create(&dc->strm, dc->eng, dnnl_stream_default_flags), "stream_create");
	return dc;
fail:
	tr_dnnl_conv_destroy(dc);
	return NULL;
}

static void entry_clear(struct entry *e)
{
	for (int i = 0; i < e->nslots; i++) {
		struct slot *s = &e->slots[i];
		if (s->to_prim)
			dnnl_primitive_destroy(s->to_prim);
		if (s->to_user)
			dnnl_primitive_destroy(s->to_user);
		if (s->prim && s->prim != s->user)
			dnnl_memory_destroy(s->prim);
		if (s->user)
			dnnl_memory_destroy(s->user);
		free(s->buf);
	}
	if (e->prim)
		dnnl_primitive_destroy(e->prim);
	memset(e, 0, sizeof *e);
}

void tr_dnnl_conv_destroy(tr_dnnl_conv_t *dc)
{
	if (!dc)
		return;
	for (int i = 0; i < CACHE; i++)
		if (dc->cache[i].used)
			entry_clear(&dc->cache[i]);
	if (dc->strm)
		dnnl_stream_destroy(dc->strm);
	if (dc->eng)
		dnnl_engine_destroy(dc->eng);
	free(dc);
}

static _Atomic unsigned long long activation_reorders;

unsigned long long tr_dnnl_conv_activation_reorders(void)
{
	return atomic_load(&activation_reorders);
}

/* The caller's layout of an activation: NCHW, or nChw16c inside a chain */
static dnnl_format_tag_t act_tag(bool any, int blocked)
{
	return any ? dnnl_format_tag_any : blocked ? dnnl_nChw16c : dnnl_nchw;
}

static dnnl_status_t plain_md(dnnl_memory_desc_t *md, int which, const struct tr_conv2d_geom *g, bool any)
{
	if (which == DNNL_ARG_SRC || which == DNNL_ARG_DIFF_SRC) {
		dnnl_dims_t d = {g->n, g->c, g->h, g->w};
		return dnnl_memory_desc_init_by_tag(md, 4, d, dnnl_f32, act_tag(any, g->x_blocked));
	}
	if (which == DNNL_ARG_DST || which == DNNL_ARG_DIFF_DST) {
		dnnl_dims_t d = {g->n, g->k, g->oh, g->ow};
		return dnnl_memory_desc_init_by_tag(md, 4, d, dnnl_f32, act_tag(any, g->y_blocked));
	}
	if (which == DNNL_ARG_WEIGHTS || which == DNNL_ARG_DIFF_WEIGHTS) {
		if (g->groups > 1) {
			/* [out, in/groups, kh, kw] is goihw with out = groups x out/groups */
			dnnl_dims_t d = {g->groups, g->k / g->groups, g->c / g->groups, g->kh, g->kw};
			return dnnl_memory_desc_init_by_tag(md, 5, d, dnnl_f32, any ? dnnl_format_tag_any : dnnl_goihw);
		}
		dnnl_dims_t d = {g->k, g->c, g->kh, g->kw};
		return dnnl_memory_desc_init_by_tag(md, 4, d, dnnl_f32, any ? dnnl_format_tag_any : dnnl_oihw);
	}
	dnnl_dims_t d = {g->k};
	return dnnl_memory_desc_init_by_tag(md, 1, d, dnnl_f32, dnnl_a);
}

static dnnl_status_t fwd_desc(dnnl_convolution_desc_t *cd, const struct tr_conv2d_geom *g, bool bias)
{
	dnnl_memory_desc_t s, w, b, d;
	dnnl_status_t st;
	if ((st = plain_md(&s, DNNL_ARG_SRC, g, true)) || (st = plain_md(&w, DNNL_ARG_WEIGHTS, g, true)) ||
	    (st = plain_md(&b, DNNL_ARG_BIAS, g, false)) || (st = plain_md(&d, DNNL_ARG_DST, g, true)))
		return st;
	dnnl_dims_t strides = {g->sh, g->sw}, dil = {g->dh - 1, g->dw - 1}, pl = {g->ph, g->pw};
	/* the right/bottom padding that gives PyTorch's output size */
	dnnl_dims_t pr = {(g->oh - 1) * g->sh + (g->kh - 1) * g->dh + 1 - g->h - g->ph,
			  (g->ow - 1) * g->sw + (g->kw - 1) * g->dw + 1 - g->w - g->pw};
	return dnnl_dilated_convolution_forward_desc_init(cd, dnnl_forward_training, dnnl_convolution_direct, &s, &w,
							  bias ? &b : NULL, &d, strides, dil, pl, pr);
}

/* Binds one tensor of the primitive: a user memory of the plain layout,
 * and when the primitive wants another layout, scratch and reorders. */
static int add_slot_at(tr_dnnl_conv_t *dc, struct entry *e, const_dnnl_primitive_desc_t pd, dnnl_query_t q, int idx,
		       int arg, bool output, struct tr_error *err)
{
	struct slot *s = &e->slots[e->nslots++];
	dnnl_primitive_desc_t rpd = NULL;
	s->arg = arg;
	s->output = output;
	const dnnl_memory_desc_t *pmd = dnnl_primitive_desc_query_md(pd, q, idx);
	dnnl_memory_desc_t umd;
	DN(plain_md(&umd, arg, &e->g, false), "memory_desc_init");
	DN(dnnl_memory_create(&s->user, &umd, dc->eng, DNNL_MEMORY_NONE), "memory_create");
	if (dnnl_memory_desc_equal(&umd, pmd)) {
		s->prim = s->user;
		return 0;
	}
	size_t bytes = dnnl_memory_desc_get_size(pmd);
	s->buf = aligned_alloc(64, (bytes + 63) / 64 * 64);
	if (!s->buf) {
		tr_error_set(err, 0, 0, NULL, "out of memory for oneDNN scratch (%zu bytes)", bytes);
		return -ENOMEM;
	}
	DN(dnnl_memory_create(&s->prim, pmd, dc->eng, s->buf), "memory_create");
	if (output) {
		DN(dnnl_reorder_primitive_desc_create(&rpd, pmd, dc->eng, &umd, dc->eng, NULL), "reorder");
		DN(dnnl_primitive_create(&s->to_user, rpd), "reorder");
	} else {
		DN(dnnl_reorder_primitive_desc_create(&rpd, &umd, dc->eng, pmd, dc->eng, NULL), "reorder");
		DN(dnnl_primitive_create(&s->to_prim, rpd), "reorder");
	}
	dnnl_primitive_desc_destroy(rpd);
	return 0;
fail:
	if (rpd)
		dnnl_primitive_desc_destroy(rpd);
	return -EIO;
}

static int add_slot(tr_dnnl_conv_t *dc, struct entry *e, const_dnnl_primitive_desc_t pd, dnnl_query_t q, int arg,
		    bool output, struct tr_error *err)
{
	/* bias comes second among the (diff) weights */
	int idx = arg == DNNL_ARG_BIAS || arg == DNNL_ARG_DIFF_BIAS;
	return add_slot_at(dc, e, pd, q, idx, arg, output, err);
}

static int build(tr_dnnl_conv_t *dc, struct entry *e, struct tr_error *err)
{
	dnnl_convolution_desc_t fd, bd;
	dnnl_primitive_desc_t fpd = NULL, pd = NULL;
	const struct tr_conv2d_geom *g = &e->g;
	int rc = -EIO;
	DN(fwd_desc(&fd, g, e->bias), "convolution_forward_desc_init");
	DN(dnnl_primitive_desc_create(&fpd, &fd, NULL, dc->eng, NULL), "convolution forward");
	dnnl_dims_t strides = {g->sh, g->sw}, dil = {g->dh - 1, g->dw - 1}, pl = {g->ph, g->pw};
	dnnl_dims_t pr = {fd.padding[1][0], fd.padding[1][1]};
	dnnl_memory_desc_t s, w, b, d;
	DN(plain_md(&s, DNNL_ARG_SRC, g, true), "md");
	DN(plain_md(&w, DNNL_ARG_WEIGHTS, g, true), "md");
	DN(plain_md(&b, DNNL_ARG_BIAS, g, false), "md");
	DN(plain_md(&d, DNNL_ARG_DST, g, true), "md");
	if (e->dir == FWD) {
		pd = fpd;
		fpd = NULL;
		if ((rc = add_slot(dc, e, pd, dnnl_query_src_md, DNNL_ARG_SRC, false, err)) < 0 ||
		    (rc = add_slot(dc, e, pd, dnnl_query_weights_md, DNNL_ARG_WEIGHTS, false, err)) < 0 ||
		    (e->bias && (rc = add_slot(dc, e, pd, dnnl_query_weights_md, DNNL_ARG_BIAS, false, err)) < 0) ||
		    (rc = add_slot(dc, e, pd, dnnl_query_dst_md, DNNL_ARG_DST, true, err)) < 0)
			goto out;
	} else if (e->dir == BWD_DATA) {
		DN(dnnl_dilated_convolution_backward_data_desc_init(&bd, dnnl_convolution_direct, &s, &w, &d, strides,
								    dil, pl, pr),
		   "convolution_backward_data_desc_init");
		DN(dnnl_primitive_desc_create(&pd, &bd, NULL, dc->eng, fpd), "convolution backward data");
		if ((rc = add_slot(dc, e, pd, dnnl_query_weights_md, DNNL_ARG_WEIGHTS, false, err)) < 0 ||
		    (rc = add_slot(dc, e, pd, dnnl_query_diff_dst_md, DNNL_ARG_DIFF_DST, false, err)) < 0 ||
		    (rc = add_slot(dc, e, pd, dnnl_query_diff_src_md, DNNL_ARG_DIFF_SRC, true, err)) < 0)
			goto out;
	} else {
		DN(dnnl_dilated_convolution_backward_weights_desc_init(&bd, dnnl_convolution_direct, &s, &w,
								       e->bias ? &b : NULL, &d, strides, dil, pl, pr),
		   "convolution_backward_weights_desc_init");
		DN(dnnl_primitive_desc_create(&pd, &bd, NULL, dc->eng, fpd), "convolution backward weights");
		if ((rc = add_slot(dc, e, pd, dnnl_query_src_md, DNNL_ARG_SRC, false, err)) < 0 ||
		    (rc = add_slot(dc, e, pd, dnnl_query_diff_dst_md, DNNL_ARG_DIFF_DST, false, err)) < 0 ||
		    (rc = add_slot(dc, e, pd, dnnl_query_diff_weights_md, DNNL_ARG_DIFF_WEIGHTS, true, err)) < 0 ||
		    (e->bias &&
		     (rc = add_slot(dc, e, pd, dnnl_query_diff_weights_md, DNNL_ARG_DIFF_BIAS, true, err)) < 0))
			goto out;
	}
	DN(dnnl_primitive_create(&e->prim, pd), "primitive_create");
	rc = 0;
	goto out;
fail:
	rc = -EIO;
out:
	if (fpd)
		dnnl_primitive_desc_destroy(fpd);
	if (pd)
		dnnl_primitive_desc_destroy(pd);
	return rc;
}

static struct entry *lookup(tr_dnnl_conv_t *dc, enum dir dir, const struct tr_conv2d_geom *g, bool bias,
			    struct tr_error *err, int *rc)
{
	struct entry *victim = &dc->cache[0];
	for (int i = 0; i < CACHE; i++) {
		struct entry *e = &dc->cache[i];
		if (e->used && e->dir == dir && e->bias == bias && !memcmp(&e->g, g, sizeof *g)) {
			e->last = ++dc->clock;
			return e;
		}
		if (!e->used || (victim->used && e->last < victim->last))
			victim = e;
	}
	if (victim->used)
		entry_clear(victim);
	victim->used = true;
	victim->dir = dir;
	victim->bias = bias;
	victim->g = *g;
	victim->last = ++dc->clock;
	if ((*rc = build(dc, victim, err)) < 0) {
		entry_clear(victim);
		return NULL;
	}
	return victim;
}

static void count_reorder(const struct slot *s)
{
	if (s->arg == DNNL_ARG_SRC || s->arg == DNNL_ARG_DST || s->arg == DNNL_ARG_DIFF_SRC ||
	    s->arg == DNNL_ARG_DIFF_DST)
		atomic_fetch_add_explicit(&activation_reorders, 1, memory_order_relaxed);
}

bool tr_dnnl_conv_prefers_blocked(const struct tr_conv2d_geom *g, bool dst)
{
	struct tr_error why, *err = &why;
	tr_dnnl_conv_t *dc = tr_dnnl_conv_create(1, err);
	dnnl_primitive_desc_t pd = NULL;
	dnnl_convolution_desc_t cd;
	dnnl_memory_desc_t want;
	bool yes = false;
	if (!dc)
		return false;
	/* the team size the slices run with: it can change oneDNN's pick */
	omp_set_num_threads(1);
	struct tr_conv2d_geom b = *g;
	b.x_blocked = b.y_blocked = 1;
	DN(fwd_desc(&cd, g, true), "convolution_forward_desc_init");
	DN(dnnl_primitive_desc_create(&pd, &cd, NULL, dc->eng, NULL), "convolution forward");
	DN(plain_md(&want, dst ? DNNL_ARG_DST : DNNL_ARG_SRC, &b, false), "memory_desc_init");
	yes = dnnl_memory_desc_equal(&want,
				     dnnl_primitive_desc_query_md(pd, dst ? dnnl_query_dst_md : dnnl_query_src_md, 0));
fail:
	if (pd)
		dnnl_primitive_desc_destroy(pd);
	tr_dnnl_conv_destroy(dc);
	return yes;
}

/* ptrs[i] is the caller's buffer for slots[i] */
static int run(tr_dnnl_conv_t *dc, struct entry *e, void *const *ptrs, struct tr_error *err)
{
	dnnl_exec_arg_t args[MAX_SLOTS];
	omp_set_num_threads(dc->threads);
	for (int i = 0; i < e->nslots; i++) {
		struct slot *s = &e->slots[i];
		DN(dnnl_memory_set_data_handle(s->user, ptrs[i]), "set_data_handle");
		if (s->to_prim) {
			dnnl_exec_arg_t ra[] = {{DNNL_ARG_FROM, s->user}, {DNNL_ARG_TO, s->prim}};
			DN(dnnl_primitive_execute(s->to_prim, dc->strm, 2, ra), "reorder");
			count_reorder(s);
		}
		args[i].arg = s->arg;
		args[i].memory = s->prim;
	}
	DN(dnnl_primitive_execute(e->prim, dc->strm, e->nslots, args), "convolution");
	for (int i = 0; i < e->nslots; i++) {
		struct slot *s = &e->slots[i];
		if (s->to_user) {
			dnnl_exec_arg_t ra[] = {{DNNL_ARG_FROM, s->prim}, {DNNL_ARG_TO, s->user}};
			DN(dnnl_primitive_execute(s->to_user, dc->strm, 2, ra), "reorder");
			count_reorder(s);
		}
	}
	DN(dnnl_stream_wait(dc->strm), "stream_wait");
	return 0;
fail:
	return -EIO;
}

int tr_dnnl_conv_forward(tr_dnnl_conv_t *dc, const struct tr_conv2d_geom *g, const float *x, const float *w,
			 const float *b, float *y, struct tr_error *err)
{
	int rc = 0;
	/* before lookup: oneDNN fixes a primitive's work split by the
	 * team size when it creates it */
	omp_set_num_threads(dc->threads);
	struct entry *e = lookup(dc, FWD, g, b != NULL, err, &rc);
	if (!e)
		return rc;
	void *with_bias[] = {(void *)x, (void *)w, (void *)b, y};
	void *without[] = {(void *)x, (void *)w, y};
	return run(dc, e, b ? with_bias : without, err);
}

int tr_dnnl_conv_backward_data(tr_dnnl_conv_t *dc, const struct tr_conv2d_geom *g, const float *w, const float *dy,
			       float *dx, struct tr_error *err)
{
	int rc = 0;
	/* before lookup: oneDNN fixes a primitive's work split by the
	 * team size when it creates it */
	omp_set_num_threads(dc->threads);
	struct entry *e = lookup(dc, BWD_DATA, g, false, err, &rc);
	if (!e)
		return rc;
	void *p[] = {(void *)w, (void *)dy, dx};
	return run(dc, e, p, err);
}

int tr_dnnl_conv_backward_weights(tr_dnnl_conv_t *dc, const struct tr_conv2d_geom *g, const float *x, const float *dy,
				  float *dw, float *db, struct tr_error *err)
{
	int rc = 0;
	/* before lookup: oneDNN fixes a primitive's work split by the
	 * team size when it creates it */
	omp_set_num_threads(dc->threads);
	struct entry *e = lookup(dc, BWD_WEIGHTS, g, db != NULL, err, &rc);
	if (!e)
		return rc;
	void *p[] = {(void *)x, (void *)dy, dw, db};
	return run(dc, e, p, err);
}

#else /* !TR_HAVE_DNNL */

bool tr_dnnl_available(void)
{
	return false;
}

tr_dnnl_conv_t *tr_dnnl_conv_create(int threads, struct tr_error *err)
{
	(void)threads;
	tr_error_set(err, 0, 0, NULL, "this build has no oneDNN (libdnnl-dev; meson option dnnl)");
	return NULL;
}

void tr_dnnl_conv_destroy(tr_dnnl_conv_t *dc)
{
	(void)dc;
}

bool tr_dnnl_conv_prefers_blocked(const struct tr_conv2d_geom *g, bool dst)
{
	(void)g, (void)dst;
	return false;
}

unsigned long long tr_dnnl_conv_activation_reorders(void)
{
	return 0;
}

int tr_dnnl_conv_forward(tr_dnnl_conv_t *dc, const struct tr_conv2d_geom *g, const float *x, const float *w,
			 const float *b, float *y, struct tr_error *err)
{
	(void)dc, (void)g, (void)x, (void)w, (void)b, (void)y;
	tr_error_set(err, 0, 0, NULL, "this build has no oneDNN");
	return -ENOTSUP;
}

int tr_dnnl_conv_backward_data(tr_dnnl_conv_t *dc, const struct tr_conv2d_geom *g, const float *w, const float *dy,
			       float *dx, struct tr_error *err)
{
	(void)dc, (void)g, (void)w, (void)dy, (void)dx;
	tr_error_set(err, 0, 0, NULL, "this build has no oneDNN");
	return -ENOTSUP;
}

int tr_dnnl_conv_backward_weights(tr_dnnl_conv_t *dc, const struct tr_conv2d_geom *g, const float *x, const float *dy,
				  float *dw, float *db, struct tr_error *err)
{
	(void)dc, (void)g, (void)x, (void)dy, (void)dw, (void)db;
	tr_error_set(err, 0, 0, NULL, "this build has no oneDNN");
	return -ENOTSUP;
}

#endif

/* ---- the CPU backend's conv2d entries on this route ---------------------- */

static struct tr_conv2d_geom geom_of(const struct tr_conv2d_desc *d, int rows)
{
	return (struct tr_conv2d_geom){.n = rows,
				       .c = d->c,
				       .h = d->h,
				       .w = d->w,
				       .k = d->f,
				       .kh = d->kh,
				       .kw = d->kw,
				       .sh = d->sh,
				       .sw = d->sw,
				       .ph = d->ph,
				       .pw = d->pw,
				       .dh = d->dh,
				       .dw = d->dw,
				       .groups = d->groups,
				       .oh = d->ho,
				       .ow = d->wo,
				       .x_blocked = d->x_blocked,
				       .y_blocked = d->y_blocked};
}

/* The batch is cut into slices of about SLICE_POS output positions per
 * channel (at least one sample), and the device's threads take the slices
 * (cpu_pool.c), each running oneDNN on one OpenMP thread with its own
 * primitives (tr_cpu_dnnl_for).  The weight and bias gradients of each
 * slice are partial sums of its own, added in slice order.  oneDNN's own
 * threading splits its reductions by thread count (measured: 1, 2 and 3
 * threads gave three different dW), so this keeps the results the same
 * bits for any budget (docs/design.md, "Convolution on CPU devices").
 *
 * A batch that makes fewer than MIN_SLICES such slices is cut into as
 * many slices rounded up to an even count (at most one per sample), of
 * even sizes (sizes differ by at most one): exact mode's shards are such
 * batches, and the first rule alone gave a VDSR shard of 4 samples slices
 * of 3 and 1 and LeNet's second convolution one slice of a 16-sample
 * shard, so one thread of two did most of the work (docs/design.md,
 * "Exact mode").  Not more slices than that: oneDNN's cost per sample
 * grows as slices shrink (4 one-sample slices of a VDSR shard took 40%
 * more CPU time than 3 + 1, on a loaded machine).
 *
 * A batch of MIN_SLICES such slices or more is cut into that count
 * rounded down to a multiple of MIN_SLICES, again of even sizes, so that
 * 1, 2 or 4 threads get equal shares: the first rule alone cut VDSR's
 * batch of 32 into ten slices of 3 and one of 2, and two threads took 17
 * and 15 samples of every call, so each call took 17/16 of its balanced
 * time; now eight of 4.  Rounded down rather than up (to 12 smaller
 * slices): fewer slices mean fewer partial gradients to add and fewer
 * primitives, and bigger slices cost oneDNN no more CPU time per sample
 * (2 to 16 samples of VDSR's 64-channel layer measured alike, on a
 * loaded machine).  Either way the cut follows from the shape alone. */
#define SLICE_POS 4096
#define MIN_SLICES 4

struct dnnl_job {
	tr_backend_t *be;
	int dev;
	const struct tr_conv2d_desc *d;
	int rows, ns; /* ns slices of even sizes (differing by at most one) */
	const float *x, *w, *bias, *dy;
	float *y, *dx;
	float *dw_part, *db_part; /* per slice */
};

static int dnnl_slice(const struct dnnl_job *j, int t, int *s0)
{
	*s0 = (int)((int64_t)t * j->rows / j->ns);
	return (int)((int64_t)(t + 1) * j->rows / j->ns) - *s0;
}

static int dnnl_forward_slice(void *arg, int t, int slot)
{
	const struct dnnl_job *j = arg;
	const struct tr_conv2d_desc *d = j->d;
	int s0, bs = dnnl_slice(j, t, &s0), rc;
	size_t in_sz = (size_t)d->c * d->h * d->w, out_sz = (size_t)d->f * d->ho * d->wo;
	struct tr_error err;
	tr_dnnl_conv_t *dc = tr_cpu_dnnl_for(j->be, j->dev, slot);
	if (!dc)
		return -EIO;
	struct tr_conv2d_geom g = geom_of(d, bs);
	if ((rc = tr_dnnl_conv_forward(dc, &g, j->x + (size_t)s0 * in_sz, j->w, j->bias, j->y + (size_t)s0 * out_sz,
				       &err)) < 0)
		return tr_cpu_set_error(j->be, rc, "conv2d_forward: %s", err.message);
	return 0;
}

static int dnnl_backward_slice(void *arg, int t, int slot)
{
	const struct dnnl_job *j = arg;
	const struct tr_conv2d_desc *d = j->d;
	int s0, bs = dnnl_slice(j, t, &s0), rc;
	size_t in_sz = (size_t)d->c * d->h * d->w, out_sz = (size_t)d->f * d->ho * d->wo;
	size_t nw = (size_t)d->f * (d->c / d->groups) * d->kh * d->kw;
	struct tr_error err;
	tr_dnnl_conv_t *dc = tr_cpu_dnnl_for(j->be, j->dev, slot);
	if (!dc)
		return -EIO;
	struct tr_conv2d_geom g = geom_of(d, bs);
	const float *xs = j->x + (size_t)s0 * in_sz, *dys = j->dy + (size_t)s0 * out_sz;
	if ((rc = tr_dnnl_conv_backward_weights(dc, &g, xs, dys, j->dw_part + (size_t)t * nw,
						j->db_part ? j->db_part + (size_t)t * d->f : NULL, &err)) < 0)
		return tr_cpu_set_error(j->be, rc, "conv2d_backward: %s", err.message);
	if (j->dx && (rc = tr_dnnl_conv_backward_data(dc, &g, j->w, dys, j->dx + (size_t)s0 * in_sz, &err)) < 0)
		return tr_cpu_set_error(j->be, rc, "conv2d_backward: %s", err.message);
	return 0;
}

static int dnnl_slice_samples(const struct tr_conv2d_desc *d)
{
	size_t P = (size_t)d->ho * d->wo;
	return P >= SLICE_POS ? 1 : (int)((SLICE_POS + P - 1) / P);
}

/* The slices of a batch of rows (rows >= 1), the two rules above. */
static void dnnl_slices(struct dnnl_job *j)
{
	int sb = dnnl_slice_samples(j->d);
	j->ns = (j->rows + sb - 1) / sb;
	if (j->ns >= MIN_SLICES)
		j->ns -= j->ns % MIN_SLICES;
	else if (j->ns % 2)
		j->ns = j->ns + 1 < j->rows ? j->ns + 1 : j->rows;
}

int tr_cpu_dnnl_slices(const struct tr_conv2d_desc *d, int rows, int *largest)
{
	struct dnnl_job j = {.d = d, .rows = rows > 0 ? rows : 1};
	int s0;
	dnnl_slices(&j);
	*largest = 0;
	for (int t = 0; t < j.ns; t++) {
		int len = dnnl_slice(&j, t, &s0);
		*largest = len > *largest ? len : *largest;
	}
	return j.ns;
}

static int dnnl_largest_slice(const struct tr_conv2d_desc *d, int rows)
{
	int largest;
	tr_cpu_dnnl_slices(d, rows, &largest);
	return largest;
}

/* Whether layer d on the oneDNN route may keep its output (dst) or its
 * input (src) in nChw16c: oneDNN's forward primitive prefers that layout
 * there, at the slices' sample count, as the primitives will run. */
static bool blocked_ok(tr_backend_t *be, const struct tr_conv2d_desc *d, int rows, bool dst)
{
	if (be->i->kind != TR_BACKEND_KIND_CPU || !tr_cpu_backend_conv_chains(be) || rows < 1 ||
	    d->route != TR_CPU_CONV_ONEDNN || d->groups != 1 || (dst ? d->f : d->c) % 16)
		return false;
	struct tr_conv2d_geom g = geom_of(d, dnnl_largest_slice(d, rows));
	return tr_dnnl_conv_prefers_blocked(&g, dst);
}

bool tr_cpu_conv_blocked_out_ok(tr_backend_t *be, const struct tr_conv2d_desc *a, int rows)
{
	return blocked_ok(be, a, rows, true);
}

bool tr_cpu_conv_blocked_in_ok(tr_backend_t *be, const struct tr_conv2d_desc *b, int rows)
{
	return blocked_ok(be, b, rows, false);
}

bool tr_cpu_conv_chain_ok(tr_backend_t *be, const struct tr_conv2d_desc *a, const struct tr_conv2d_desc *b, int rows)
{
	return a->f == b->c && a->ho == b->h && a->wo == b->w && tr_cpu_conv_blocked_out_ok(be, a, rows) &&
	       tr_cpu_conv_blocked_in_ok(be, b, rows);
}

int tr_cpu_dnnl_conv2d_forward(tr_backend_t *be, int dev, const struct tr_conv2d_desc *d, int rows, const float *x,
			       const float *w, const float *bias, float *y, float *work)
{
	int rc = tr_cpu_check_dev(be, dev, "conv2d_forward");
	(void)work; /* oneDNN keeps its own scratch */
	if (rc)
		return rc;
	if (rows < 0)
		return tr_cpu_set_error(be, -EINVAL, "conv2d_forward: %d rows", rows);
	if (rows == 0)
		return 0;
	/* the device thread's state first: it makes the per-slot array */
	if (!tr_cpu_dnnl_for(be, dev, 0))
		return -EIO;
	struct dnnl_job j = {.be = be, .dev = dev, .d = d, .rows = rows, .x = x, .w = w, .bias = bias, .y = y};
	dnnl_slices(&j);
	return tr_cpu_parallel(be, dev, j.ns, dnnl_forward_slice, &j);
}

int tr_cpu_dnnl_conv2d_backward(tr_backend_t *be, int dev, const struct tr_conv2d_desc *d, int rows, const float *x,
				const float *w, const float *dy, float *dx, float *dw, float *dbias, float *work)
{
	int rc = tr_cpu_check_dev(be, dev, "conv2d_backward");
	size_t nw = (size_t)d->f * (d->c / d->groups) * d->kh * d->kw;
	(void)work;
	if (rc)
		return rc;
	if (rows < 0)
		return tr_cpu_set_error(be, -EINVAL, "conv2d_backward: %d rows", rows);
	if (rows == 0) {
		/* sums over no samples (a rank without rows in a collective
		 * model's step) */
		memset(dw, 0, nw * sizeof *dw);
		if (dbias)
			memset(dbias, 0, (size_t)d->f * sizeof *dbias);
		return 0;
	}
	if (!tr_cpu_dnnl_for(be, dev, 0))
		return -EIO;
	struct dnnl_job j = {.be = be, .dev = dev, .d = d, .rows = rows, .x = x, .w = w, .dy = dy, .dx = dx};
	dnnl_slices(&j);
	int ns = j.ns;
	float *scr = tr_cpu_scratch(be, dev, (size_t)ns * (nw + (size_t)d->f) * sizeof(float));
	if (!scr)
		return -ENOMEM;
	j.dw_part = scr;
	j.db_part = dbias ? scr + (size_t)ns * nw : NULL;
	if ((rc = tr_cpu_parallel(be, dev, ns, dnnl_backward_slice, &j)) < 0)
		return rc;
	/* the slices' partial sums, in slice order */
	memcpy(dw, j.dw_part, nw * sizeof *dw);
	for (int t = 1; t < ns; t++)
		for (size_t e = 0; e < nw; e++)
			dw[e] += j.dw_part[(size_t)t * nw + e];
	if (dbias) {
		for (int f = 0; f < d->f; f++) {
			double s = 0;
			for (int t = 0; t < ns; t++)
				s += j.db_part[(size_t)t * d->f + f];
			dbias[f] = (float)s;
		}
	}
	return 0;
}
