/* gemm tiles through oneDNN's matmul primitive (cpu_dnnl_gemm.h). */
#include "engine/cpu/cpu_dnnl_gemm.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static atomic_ullong primitives_made;

unsigned long long tr_dnnl_gemm_primitives_made(void)
{
	return atomic_load(&primitives_made);
}

#ifdef TR_HAVE_DNNL
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include "engine/cpu/cpu_dnnl_check.h"

/* per thread: a dense layer's three products at two tile sizes each, for
 * the training, last and validation batch sizes of a few layers */
#define CACHE 64

struct key {
	int ta, tb, m, n, k, lda, ldb, ldc; /* ints: compared with memcmp */
};

struct entry {
	struct key key;
	uint64_t last; /* the thread's clock at its last use; 0: empty */
	dnnl_primitive_t prim;
	dnnl_memory_t a, b, c;
};

struct thread_state {
	dnnl_stream_t strm;
	uint64_t clock;
	struct entry cache[CACHE];
};

static dnnl_engine_t engine;
static dnnl_status_t engine_status = dnnl_runtime_error;
static pthread_once_t engine_once = PTHREAD_ONCE_INIT;
static pthread_key_t state_key;

static void entry_clear(struct entry *e)
{
	if (e->prim)
		dnnl_primitive_destroy(e->prim);
	if (e->a)
		dnnl_memory_destroy(e->a);
	if (e->b)
		dnnl_memory_destroy(e->b);
	if (e->c)
		dnnl_memory_destroy(e->c);
	memset(e, 0, sizeof *e);
}

/* A thread's primitives go with it (the device pools' threads end with
 * their backend). */
static void state_free(void *p)
{
	struct thread_state *s = p;
	for (int i = 0; i < CACHE; i++)
		entry_clear(&s->cache[i]);
	if (s->strm)
		dnnl_stream_destroy(s->strm);
	free(s);
}

/* One engine for the process: oneDNN's CPU engine holds no per-thread
 * state. */
static void engine_start(void)
{
	engine_status = dnnl_engine_create(&engine, dnnl_cpu, 0);
	if (pthread_key_create(&state_key, state_free) != 0 && engine_status == dnnl_success)
		engine_status = dnnl_out_of_memory;
}

static struct thread_state *thread_state(struct tr_error *err)
{
	pthread_once(&engine_once, engine_start);
	if (engine_status != dnnl_success) {
		tr_error_set(err, 0, 0, NULL, "oneDNN: engine_create failed (status %d)", (int)engine_status);
		return NULL;
	}
	struct thread_state *s = pthread_getspecific(state_key);
	if (s)
		return s;
	s = calloc(1, sizeof *s);
	if (!s) {
		tr_error_set(err, 0, 0, NULL, "out of memory");
		return NULL;
	}
	DN(dnnl_stream_create(&s->strm, engine, dnnl_stream_default_flags), "stream_create");
	if (pthread_setspecific(state_key, s) != 0) {
		tr_error_set(err, 0, 0, NULL, "out of memory");
		goto fail;
	}
	return s;
fail:
	state_free(s);
	return NULL;
}

/* An r x c matrix: row-major with row stride ld, or (trans) its transpose
 * stored so, as cblas_sgemm reads it. */
static void matrix_desc(dnnl_memory_desc_t *md, int r, int c, int ld, bool trans)
{
	dnnl_dims_t dims = {r, c};
	dnnl_dims_t strides = {trans ? 1 : ld, trans ? ld : 1};
	dnnl_memory_desc_init_by_strides(md, 2, dims, dnnl_f32, strides);
}

static int entry_make(struct entry *e, const struct key *k, struct tr_error *err)
{
	dnnl_memory_desc_t a, b, c;
	dnnl_matmul_desc_t md;
	dnnl_primitive_desc_t pd = NULL;
	dnnl_primitive_attr_t attr = NULL;

	matrix_desc(&a, k->m, k->k, k->lda, k->ta);
	matrix_desc(&b, k->k, k->n, k->ldb, k->tb);
	matrix_desc(&c, k->m, k->n, k->ldc, false);
	DN(dnnl_matmul_desc_init(&md, &a, &b, NULL, &c), "matmul_desc_init");
	DN(dnnl_primitive_attr_create(&attr), "primitive_attr_create");
	/* the primitive's scratch stays inside the primitive: a thread's
	 * primitives run one at a time */
	DN(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_library), "set_scratchpad_mode");
	/* the team size it runs with: it can change oneDNN's pick */
	omp_set_num_threads(1);
	DN(dnnl_primitive_desc_create(&pd, &md, attr, engine, NULL), "matmul primitive_desc_create");
	DN(dnnl_primitive_create(&e->prim, pd), "matmul primitive_create");
	atomic_fetch_add(&primitives_made, 1);
	DN(dnnl_memory_create(&e->a, &a, engine, DNNL_MEMORY_NONE), "memory_create");
	DN(dnnl_memory_create(&e->b, &b, engine, DNNL_MEMORY_NONE), "memory_create");
	DN(dnnl_memory_create(&e->c, &c, engine, DNNL_MEMORY_NONE), "memory_create");
	dnnl_primitive_desc_destroy(pd);
	dnnl_primitive_attr_destroy(attr);
	e->key = *k;
	return 0;
fail:
	if (pd)
		dnnl_primitive_desc_destroy(pd);
	if (attr)
		dnnl_primitive_attr_destroy(attr);
	entry_clear(e);
	return -ENOTSUP;
}

/* The thread's primitive for k, made on first use; the least recently
 * used one makes room. */
static struct entry *entry_for(struct thread_state *s, const struct key *k, struct tr_error *err)
{
	struct entry *victim = &s->cache[0];
	for (int i = 0; i < CACHE; i++) {
		struct entry *e = &s->cache[i];
		if (e->last && !memcmp(&e->key, k, sizeof *k)) {
			e->last = ++s->clock;
			return e;
		}
		if (e->last < victim->last)
			victim = e;
	}
	entry_clear(victim);
	if (entry_make(victim, k, err) < 0)
		return NULL;
	victim->last = ++s->clock;
	return victim;
}

int tr_dnnl_gemm(bool trans_a, bool trans_b, int m, int n, int k, const float *a, int lda, const float *b, int ldb,
		 float *c, int ldc, struct tr_error *err)
{
	struct thread_state *s = thread_state(err);
	if (!s)
		return -ENOTSUP;
	struct key key = {trans_a, trans_b, m, n, k, lda, ldb, ldc};
	struct entry *e = entry_for(s, &key, err);
	if (!e)
		return -ENOTSUP;
	DN(dnnl_memory_set_data_handle(e->a, (void *)a), "memory_set_data_handle");
	DN(dnnl_memory_set_data_handle(e->b, (void *)b), "memory_set_data_handle");
	DN(dnnl_memory_set_data_handle(e->c, c), "memory_set_data_handle");
	dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, e->a}, {DNNL_ARG_WEIGHTS, e->b}, {DNNL_ARG_DST, e->c}};
	/* one thread: the calling one (another call on this thread may have
	 * set a larger team for oneDNN's convolutions) */
	omp_set_num_threads(1);
	DN(dnnl_primitive_execute(e->prim, s->strm, 3, args), "matmul execute");
	DN(dnnl_stream_wait(s->strm), "stream_wait");
	return 0;
fail:
	return -EIO;
}

#else

int tr_dnnl_gemm(bool trans_a, bool trans_b, int m, int n, int k, const float *a, int lda, const float *b, int ldb,
		 float *c, int ldc, struct tr_error *err)
{
	(void)trans_a, (void)trans_b, (void)m, (void)n, (void)k, (void)a, (void)lda, (void)b, (void)ldb, (void)c,
		(void)ldc;
	tr_error_set(err, 0, 0, NULL, "this build has no oneDNN (install libdnnl-dev and rebuild)");
	return -ENOTSUP;
}

#endif
