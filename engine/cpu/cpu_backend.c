/* The CPU backend: the reference implementation of engine/backend.h.
 *
 * A CPU "device" is a host thread owned by the trainer; its memory is plain
 * host memory, so copies are memcpy and sync has nothing to wait for.  This
 * file holds the backend object, memory management and error reporting;
 * the kernels live in cpu_kernels.c and the collectives in cpu_comm.c, which
 * fill their parts of the function table through tr_cpu_kernels_fill and
 * tr_cpu_comm_fill.
 *
 * Threads: OpenBLAS runs on one thread, always, and the backend splits
 * the work itself (cpu_pool.c).  OpenBLAS's sums depend on its thread
 * count (its threaded sgemm blocks K differently from its one-thread
 * path), so with its threads a job's results would depend on the host's
 * cores.  Instead each device gets budget / D threads of its own (at least
 * one), and every kernel that uses them cuts its work into tasks by shape
 * alone: gemm into column or row tiles (cpu_kernels.c), a convolution into
 * slices of samples whose weight-gradient partials are added in slice
 * order (cpu_conv.c, cpu_dnnl_conv.c).  So results are the same bits for
 * any budget and any device count's share of it.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/memory.h"
#include "engine/cpu/cpu_internal.h"
#include "engine/cpu/cpu_dnnl_conv.h"

/* Weak so that a build against a generic BLAS (no OpenBLAS extensions)
 * still links; then the BLAS library's own default applies, and results
 * are independent of the thread count only if it runs on one thread. */
extern void openblas_set_num_threads(int n) __attribute__((weak));

#define ALIGN 64
#define ERR_LEN 512

struct cpu_backend {
	struct tr_backend base; /* first: tr_backend_t * converts to this */
	tr_backend_i table;
	uint64_t id; /* never reused, unlike the address */
	int devices;
	int threads; /* per device (its pool, the device thread included) */
	pthread_mutex_t err_mu;
	char err[ERR_LEN];     /* latest error from any thread, under err_mu */
	enum tr_cpu_conv conv; /* the conv2d route (tr_cpu_backend_set_conv) */
	bool no_chains;        /* tr_cpu_backend_set_conv_chains */
	/* per device, made by its thread on first use */
	struct tr_cpu_pool *pool[TR_CPU_MAX_DEVICES];
	tr_dnnl_conv_t **dnnl[TR_CPU_MAX_DEVICES]; /* one per pool thread */
	void *scratch[TR_CPU_MAX_DEVICES];
	size_t scratch_bytes[TR_CPU_MAX_DEVICES];
};

/* Device threads fail concurrently, so each thread keeps its own latest
 * error and last_error prefers it; the shared copy serves a thread that
 * asks about an error raised elsewhere (e.g. after joining the devices). */
static atomic_uint_fast64_t next_id = 1;
static _Thread_local uint64_t tls_owner; /* id of the backend tls_err is about */
static _Thread_local char tls_err[ERR_LEN];
static _Thread_local char tls_view[ERR_LEN];

static struct cpu_backend *cpu(tr_backend_t *be)
{
	return (struct cpu_backend *)be;
}

int tr_cpu_set_error(tr_backend_t *be, int code, const char *fmt, ...)
{
	struct cpu_backend *b = cpu(be);
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(tls_err, sizeof(tls_err), fmt, ap);
	va_end(ap);
	tls_owner = b->id;
	pthread_mutex_lock(&b->err_mu);
	memcpy(b->err, tls_err, sizeof(b->err));
	pthread_mutex_unlock(&b->err_mu);
	return code;
}

int tr_cpu_check_dev(tr_backend_t *be, int dev, const char *what)
{
	if (dev < 0 || dev >= cpu(be)->devices)
		return tr_cpu_set_error(be, -EINVAL, "%s: device %d out of range [0, %d)", what, dev, cpu(be)->devices);
	return 0;
}

int tr_cpu_threads(tr_backend_t *be)
{
	return cpu(be)->threads;
}

int tr_cpu_parallel(tr_backend_t *be, int dev, int n, tr_cpu_task_fn fn, void *arg)
{
	struct cpu_backend *b = cpu(be);

	/* a pool that cannot be made runs everything on the caller: slower,
	 * the same results */
	if (!b->pool[dev] && b->threads > 1 && n > 1)
		b->pool[dev] = tr_cpu_pool_create(b->threads);
	return tr_cpu_pool_run(b->pool[dev], n, fn, arg);
}

void *tr_cpu_scratch(tr_backend_t *be, int dev, size_t bytes)
{
	struct cpu_backend *b = cpu(be);

	if (b->scratch_bytes[dev] < bytes || !b->scratch[dev]) {
		size_t sz = (bytes + 63) / 64 * 64;
		free(b->scratch[dev]);
		b->scratch[dev] = aligned_alloc(64, sz ? sz : 64);
		b->scratch_bytes[dev] = b->scratch[dev] ? bytes : 0;
		if (!b->scratch[dev])
			tr_cpu_set_error(be, -ENOMEM, "out of memory for %zu bytes of scratch on cpu%d", bytes, dev);
	}
	return b->scratch[dev];
}

/* The returned text stays valid until the calling thread's next call. */
static const char *cpu_last_error(tr_backend_t *be)
{
	struct cpu_backend *b = cpu(be);

	if (tls_owner == b->id && tls_err[0])
		return tls_err;
	pthread_mutex_lock(&b->err_mu);
	memcpy(tls_view, b->err, sizeof(tls_view));
	pthread_mutex_unlock(&b->err_mu);
	return tls_view;
}

static void cpu_destroy(tr_backend_t *be)
{
	struct cpu_backend *b = cpu(be);

	if (!b)
		return;
	for (int d = 0; d < TR_CPU_MAX_DEVICES; d++) {
		tr_cpu_pool_destroy(b->pool[d]);
		for (int t = 0; b->dnnl[d] && t < b->threads; t++)
			tr_dnnl_conv_destroy(b->dnnl[d][t]);
		free(b->dnnl[d]);
		free(b->scratch[d]);
	}
	pthread_mutex_destroy(&b->err_mu);
	free(b);
}

static int cpu_device_count(tr_backend_t *be)
{
	return cpu(be)->devices;
}

/* CPU devices share the host's memory: report it (MemAvailable, which
 * counts reclaimable cache, is what a new job can really use). */
static int cpu_memory_info(tr_backend_t *be, int dev, size_t *total, size_t *free_bytes)
{
	(void)be;
	(void)dev;
	long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
	*total = pages > 0 && size > 0 ? (size_t)pages * (size_t)size : 0;
	*free_bytes = (size_t)tr_mem_meminfo_available();
	return 0;
}

static void cpu_device_name(tr_backend_t *be, int dev, char *buf, size_t len)
{
	if (!buf || !len)
		return;
	if (dev < 0 || dev >= cpu(be)->devices)
		snprintf(buf, len, "cpu?");
	else
		snprintf(buf, len, "cpu%d", dev);
}

/* aligned_alloc wants a size that is a multiple of the alignment; a zero
 * request still returns a block so that NULL always means failure. */
static void *alloc_zeroed(size_t bytes)
{
	size_t sz;
	void *p;

	if (bytes > SIZE_MAX - ALIGN)
		return NULL;
	sz = (bytes + ALIGN - 1) / ALIGN * ALIGN;
	if (sz == 0)
		sz = ALIGN;
	p = aligned_alloc(ALIGN, sz);
	if (p)
		memset(p, 0, sz);
	return p;
}

static void *cpu_alloc(tr_backend_t *be, int dev, size_t bytes)
{
	void *p;

	if (tr_cpu_check_dev(be, dev, "alloc"))
		return NULL;
	p = alloc_zeroed(bytes);
	if (!p)
		tr_cpu_set_error(be, -ENOMEM, "alloc: out of memory allocating %zu bytes on cpu%d", bytes, dev);
	return p;
}

static void cpu_free(tr_backend_t *be, int dev, void *ptr)
{
	(void)be;
	(void)dev;
	free(ptr);
}

static void *cpu_host_alloc(tr_backend_t *be, size_t bytes)
{
	void *p = alloc_zeroed(bytes);

	if (!p)
		tr_cpu_set_error(be, -ENOMEM, "host_alloc: out of memory allocating %zu bytes", bytes);
	return p;
}

static void cpu_host_free(tr_backend_t *be, void *ptr)
{
	(void)be;
	free(ptr);
}

static int copy_bytes(tr_backend_t *be, int dev, void *dst, const void *src, size_t bytes, const char *what)
{
	int rc = tr_cpu_check_dev(be, dev, what);

	if (rc)
		return rc;
	if (!bytes)
		return 0;
	if (!dst || !src)
		return tr_cpu_set_error(be, -EINVAL, "%s: NULL pointer for %zu bytes", what, bytes);
	/* memmove: the interface does not promise disjoint ranges for copy */
	if (dst != src)
		memmove(dst, src, bytes);
	return 0;
}

static int cpu_to_device(tr_backend_t *be, int dev, void *dst, const void *src, size_t bytes)
{
	return copy_bytes(be, dev, dst, src, bytes, "to_device");
}

/* There is no copy stream: the copy is done when this returns, so the
 * trainer's upload-ahead path runs on CPU devices too (and every test
 * exercises it) with exactly the data the synchronous path would copy. */
static int cpu_to_device_async(tr_backend_t *be, int dev, void *dst, const void *src, size_t bytes)
{
	return copy_bytes(be, dev, dst, src, bytes, "to_device_async");
}

/* Every copy has already finished. */
static int cpu_copies_fence(tr_backend_t *be, int dev)
{
	return tr_cpu_check_dev(be, dev, "copies_fence");
}

static int cpu_to_host(tr_backend_t *be, int dev, void *dst, const void *src, size_t bytes)
{
	return copy_bytes(be, dev, dst, src, bytes, "to_host");
}

static int cpu_copy(tr_backend_t *be, int dev, void *dst, const void *src, size_t bytes)
{
	return copy_bytes(be, dev, dst, src, bytes, "copy");
}

static int cpu_memset0(tr_backend_t *be, int dev, void *dst, size_t bytes)
{
	int rc = tr_cpu_check_dev(be, dev, "memset0");

	if (rc)
		return rc;
	if (!bytes)
		return 0;
	if (!dst)
		return tr_cpu_set_error(be, -EINVAL, "memset0: NULL pointer for %zu bytes", bytes);
	memset(dst, 0, bytes);
	return 0;
}

/* Kernels run synchronously on the calling thread. */
static int cpu_sync(tr_backend_t *be, int dev)
{
	return tr_cpu_check_dev(be, dev, "sync");
}

/* cblas_sgemm has no TF32 mode: FP32 is the only answer. */
static int cpu_set_tf32(tr_backend_t *be, int dev, bool allow)
{
	int rc = tr_cpu_check_dev(be, dev, "set_tf32");

	if (rc == 0 && allow)
		rc = tr_cpu_set_error(be, -ENOTSUP, "set_tf32: CPU devices compute matrix products in FP32 only");
	return rc;
}

/* Cores this process may run on (affinity/cpuset aware), at least 1. */
static int usable_cores(void)
{
	cpu_set_t set;
	long n;

	if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
		return CPU_COUNT(&set);
	n = sysconf(_SC_NPROCESSORS_ONLN);
	return n > 0 ? (int)n : 1;
}

/* oneDNN's state for one thread of a device's pool, one OpenMP thread
 * each (the pool splits the work, cpu_dnnl_conv.c).  The device's thread
 * asks for its slot 0 before it starts a parallel run, which makes the
 * slot array; every entry is made on first use by the only thread that
 * runs that slot. */
tr_dnnl_conv_t *tr_cpu_dnnl_for(tr_backend_t *be, int dev, int slot)
{
	struct cpu_backend *b = (struct cpu_backend *)be;
	struct tr_error why;

	if (!b->dnnl[dev]) {
		b->dnnl[dev] = calloc((size_t)b->threads, sizeof *b->dnnl[dev]);
		if (!b->dnnl[dev]) {
			tr_cpu_set_error(be, -ENOMEM, "conv2d: out of memory");
			return NULL;
		}
	}
	if (!b->dnnl[dev][slot]) {
		b->dnnl[dev][slot] = tr_dnnl_conv_create(1, &why);
		if (!b->dnnl[dev][slot])
			tr_cpu_set_error(be, -EIO, "conv2d: %s", why.message);
	}
	return b->dnnl[dev][slot];
}

int tr_cpu_backend_set_conv(tr_backend_t *be, enum tr_cpu_conv route, struct tr_error *err)
{
	struct cpu_backend *b = (struct cpu_backend *)be;

	if (route == TR_CPU_CONV_AUTO && !tr_dnnl_available())
		route = TR_CPU_CONV_IM2COL;
	if (route == TR_CPU_CONV_ONEDNN && !tr_dnnl_available()) {
		tr_error_set(err, 0, 0, NULL,
			     "this build has no oneDNN convolutions (install libdnnl-dev and rebuild)");
		return -ENOTSUP;
	}
	b->conv = route;
	return 0;
}

enum tr_cpu_conv tr_cpu_backend_conv(tr_backend_t *be)
{
	return cpu(be)->conv;
}

void tr_cpu_backend_set_conv_chains(tr_backend_t *be, bool on)
{
	cpu(be)->no_chains = !on;
}

bool tr_cpu_backend_conv_chains(tr_backend_t *be)
{
	return !cpu(be)->no_chains;
}

const char *tr_cpu_backend_conv_name(const tr_backend_t *be)
{
	const struct cpu_backend *b = (const struct cpu_backend *)be;
	return b->conv == TR_CPU_CONV_ONEDNN ? "onednn" : b->conv == TR_CPU_CONV_AUTO ? "auto" : "im2col";
}

tr_backend_t *tr_cpu_backend_create(int devices, int blas_threads)
{
	struct cpu_backend *b;
	int budget;

	if (devices < 1 || devices > TR_CPU_MAX_DEVICES || blas_threads < 0)
		return NULL;
	b = calloc(1, sizeof(*b));
	if (!b)
		return NULL;
	if (pthread_mutex_init(&b->err_mu, NULL) != 0)
		goto fail_mutex;

	b->table = (tr_backend_i){
		.name = "cpu",
		.kind = TR_BACKEND_KIND_CPU,
		.memory_is_host = true,
		.destroy = cpu_destroy,
		.device_count = cpu_device_count,
		.device_name = cpu_device_name,
		.memory_info = cpu_memory_info,
		.last_error = cpu_last_error,
		.alloc = cpu_alloc,
		.free = cpu_free,
		.host_alloc = cpu_host_alloc,
		.host_free = cpu_host_free,
		.to_device = cpu_to_device,
		.to_host = cpu_to_host,
		.copy = cpu_copy,
		.memset0 = cpu_memset0,
		.sync = cpu_sync,
		.to_device_async = cpu_to_device_async,
		.copies_fence = cpu_copies_fence,
		.set_tf32 = cpu_set_tf32,
	};
	tr_cpu_kernels_fill(&b->table);
	tr_cpu_conv_fill(&b->table);
	tr_cpu_conv_route_fill(&b->table);
	tr_cpu_comm_fill(&b->table);
	tr_cpu_norm2d_fill(&b->table);
	b->conv = TR_CPU_CONV_IM2COL;
	const char *chains = getenv("TRAINERD_CPU_CONV_CHAINS");
	b->no_chains = chains && !strcmp(chains, "0");
	b->base.i = &b->table;
	b->devices = devices;
	b->id = atomic_fetch_add(&next_id, 1);

	budget = blas_threads > 0 ? blas_threads : usable_cores();
	b->threads = budget / devices > 1 ? budget / devices : 1;
	if (openblas_set_num_threads)
		openblas_set_num_threads(1);
	return &b->base;

fail_mutex:
	free(b);
	return NULL;
}
