/* The CUDA backend: device management, memory, copies, streams, errors.
 *
 * Each device has one compute stream (non-blocking, so nothing else in the
 * process serialises with it), one cuBLAS handle bound to that stream, and
 * a little scratch for reductions whose result the host needs (losses,
 * sumsq).  Every call of engine/backend.h enqueues on the compute stream
 * and returns; only sync, the losses and sumsq wait for the device.
 * A second non-blocking stream per device carries to_device_async alone:
 * the trainer uploads step s+1's inputs there from pinned prefetch slots
 * while step s computes, and copies_fence (an event on the copy stream
 * that the compute stream waits for) orders step s+1's kernels after
 * them.  Nothing else crosses between the two streams, and sync waits for
 * both.
 *
 * Without a driver or a device nothing here crashes: the runtime answers
 * cudaErrorInsufficientDriver / cudaErrorNoDevice, which become the reason
 * tr_cuda_backend_create gives.  TF32 is off unless asked for (at
 * creation for every device, or per device with set_tf32), so gemm agrees
 * with the CPU reference to float rounding.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>

#include "engine/cuda/cuda_internal.h"

/* ---- errors ------------------------------------------------------------- */

/* As in the CPU backend: device threads fail concurrently, so each thread
 * keeps its own latest error and last_error prefers it; the shared copy
 * serves a thread asking about an error raised elsewhere. */
static std::atomic<uint64_t> next_id(1);
static thread_local uint64_t tls_owner;
static thread_local char tls_err[TR_CUDA_ERR_LEN];
static thread_local char tls_view[TR_CUDA_ERR_LEN];

int tr_cuda_set_error(tr_backend_t *be, int code, const char *fmt, ...)
{
	struct cuda_backend *b = cuda_be(be);
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

/* Errors after which the CUDA context is unusable until the process ends
 * (CUDA's documentation calls them sticky): every later call fails too. */
static bool sticky_error(cudaError_t e)
{
	switch (e) {
	case cudaErrorIllegalAddress:
	case cudaErrorLaunchFailure:
	case cudaErrorECCUncorrectable:
	case cudaErrorHardwareStackError:
	case cudaErrorIllegalInstruction:
	case cudaErrorMisalignedAddress:
	case cudaErrorInvalidAddressSpace:
	case cudaErrorInvalidPc:
	case cudaErrorAssert:
	case cudaErrorLaunchTimeout:
		return true;
	default:
		return false;
	}
}

/* Marks the current device unusable (the first reason is kept). */
static void mark_broken(struct cuda_backend *b, cudaError_t e, const char *what)
{
	int ord = -1;

	if (cudaGetDevice(&ord) != cudaSuccess)
		return;
	for (int i = 0; i < b->ndev; i++) {
		struct cuda_dev *d = &b->dev[i];
		int expected = 0;
		if (d->ordinal != ord)
			continue;
		/* claim the slot first (2: being written), then publish (1) */
		if (__atomic_compare_exchange_n(&d->broken, &expected, 2, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
			snprintf(d->broken_why, sizeof d->broken_why, "%s in %s", cudaGetErrorName(e), what);
			__atomic_store_n(&d->broken, 1, __ATOMIC_RELEASE);
		}
	}
}

int tr_cuda_check_rt(tr_backend_t *be, cudaError_t e, const char *what, const char *file, int line)
{
	if (e == cudaSuccess)
		return 0;
	/* A non-sticky error stays pending until read; clear it so that the
	 * next launch check does not report it a second time. */
	(void)cudaGetLastError();
	if (sticky_error(e)) {
		mark_broken(cuda_be(be), e, what);
		return tr_cuda_set_error(be, -EIO,
					 "%s (%s:%d): %s: %s; this device's CUDA context is broken: restart needed",
					 what, file, line, cudaGetErrorName(e), cudaGetErrorString(e));
	}
	return tr_cuda_set_error(be, e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO, "%s (%s:%d): %s: %s", what, file,
				 line, cudaGetErrorName(e), cudaGetErrorString(e));
}

int tr_cuda_launch_check(tr_backend_t *be, const char *what, const char *file, int line)
{
	int rc = tr_cuda_check_rt(be, cudaGetLastError(), what, file, line);

	if (rc || !cuda_be(be)->sync_launches)
		return rc;
	tr_cuda_count_wait(be);
	return tr_cuda_check_rt(be, cudaDeviceSynchronize(), what, file, line);
}

int tr_cuda_check_blas(tr_backend_t *be, cublasStatus_t s, const char *what, const char *file, int line)
{
	if (s == CUBLAS_STATUS_SUCCESS)
		return 0;
	(void)cudaGetLastError();
	return tr_cuda_set_error(be, s == CUBLAS_STATUS_ALLOC_FAILED ? -ENOMEM : -EIO, "%s (%s:%d): %s: %s", what, file,
				 line, cublasGetStatusName(s), cublasGetStatusString(s));
}

int tr_cuda_use(tr_backend_t *be, int dev, const char *what)
{
	struct cuda_backend *b = cuda_be(be);

	if (dev < 0 || dev >= b->ndev)
		return tr_cuda_set_error(be, -EINVAL, "%s: device %d out of range [0, %d)", what, dev, b->ndev);
	if (__atomic_load_n(&b->dev[dev].broken, __ATOMIC_ACQUIRE) == 1)
		return tr_cuda_set_error(be, -EIO, "%s: device %d (%s) is unusable after %s: restart needed", what, dev,
					 b->dev[dev].name, b->dev[dev].broken_why);
	/* cheap when dev is already current: a thread-local compare */
	return tr_cuda_check_rt(be, cudaSetDevice(b->dev[dev].ordinal), what, __FILE__, __LINE__);
}

/* The text stays valid until the calling thread's next call. */
static const char *cuda_last_error(tr_backend_t *be)
{
	struct cuda_backend *b = cuda_be(be);

	if (tls_owner == b->id && tls_err[0])
		return tls_err;
	pthread_mutex_lock(&b->err_mu);
	memcpy(tls_view, b->err, sizeof(tls_view));
	pthread_mutex_unlock(&b->err_mu);
	return tls_view;
}

/* ---- devices ------------------------------------------------------------ */

static int cuda_device_count(tr_backend_t *be)
{
	return cuda_be(be)->ndev;
}

static void cuda_device_name(tr_backend_t *be, int dev, char *buf, size_t len)
{
	struct cuda_backend *b = cuda_be(be);

	if (!buf || !len)
		return;
	if (dev < 0 || dev >= b->ndev)
		snprintf(buf, len, "cuda?");
	else
		snprintf(buf, len, "%s", b->dev[dev].name);
}

static int cuda_memory_info(tr_backend_t *be, int dev, size_t *total, size_t *free_bytes)
{
	struct cuda_backend *b = cuda_be(be);

	*total = *free_bytes = 0;
	if (dev < 0 || dev >= b->ndev)
		return -EINVAL;
	if (cudaSetDevice(b->dev[dev].ordinal) != cudaSuccess || cudaMemGetInfo(free_bytes, total) != cudaSuccess) {
		(void)cudaGetLastError();
		return -EIO;
	}
	return 0;
}

/* Releases what init_device set up; safe on a partly initialised device
 * (the backend is calloc'ed, so absent members are NULL). */
static void finish_device(struct cuda_dev *d)
{
	if (cudaSetDevice(d->ordinal) != cudaSuccess) {
		(void)cudaGetLastError();
		return;
	}
	if (d->copy_stream)
		cudaStreamSynchronize(d->copy_stream);
	if (d->stream)
		cudaStreamSynchronize(d->stream);
	if (d->blas)
		cublasDestroy(d->blas);
	if (d->copied)
		cudaEventDestroy(d->copied);
	if (d->copy_stream)
		cudaStreamDestroy(d->copy_stream);
	if (d->stream)
		cudaStreamDestroy(d->stream);
	cudaFree(d->partials);
	cudaFree(d->result);
	cudaFreeHost(d->host_res);
	(void)cudaGetLastError();
	d->blas = NULL;
	d->copied = NULL;
	d->copy_stream = NULL;
	d->stream = NULL;
	d->partials = NULL;
	d->result = NULL;
	d->host_res = NULL;
}

static int init_device(tr_backend_t *be, int idx)
{
	struct cuda_backend *b = cuda_be(be);
	struct cuda_dev *d = &b->dev[idx];
	cudaDeviceProp p;

	d->ordinal = idx;
	CUDA_CHECK(be, cudaSetDevice(d->ordinal));
	CUDA_CHECK(be, cudaGetDeviceProperties(&p, d->ordinal));
	snprintf(d->name, sizeof(d->name), "%s", p.name);
	d->total_mem = p.totalGlobalMem;
	d->cc_major = p.major;
	d->cc_minor = p.minor;
	int mode = cudaComputeModeDefault;
	CUDA_CHECK(be, cudaDeviceGetAttribute(&mode, cudaDevAttrComputeMode, d->ordinal));
	if (mode == cudaComputeModeProhibited)
		return tr_cuda_set_error(be, -EBUSY, "device %d (%s) is in compute-prohibited mode", idx, d->name);

	CUDA_CHECK(be, cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking));
	CUDA_CHECK(be, cudaStreamCreateWithFlags(&d->copy_stream, cudaStreamNonBlocking));
	/* Only ever waited on by a stream, never timed. */
	CUDA_CHECK(be, cudaEventCreateWithFlags(&d->copied, cudaEventDisableTiming));
	CUBLAS_CHECK(be, cublasCreate(&d->blas));
	CUBLAS_CHECK(be, cublasSetStream(d->blas, d->stream));
	/* CUBLAS_DEFAULT_MATH never uses TF32 for sgemm (cuBLAS >= 11). */
	CUBLAS_CHECK(be, cublasSetMathMode(d->blas, b->tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
	CUDA_CHECK(be, cudaMalloc((void **)&d->partials, 2 * TR_CUDA_RED_SLOTS * sizeof(double)));
	CUDA_CHECK(be, cudaMalloc((void **)&d->result, sizeof(struct cuda_result)));
	CUDA_CHECK(be, cudaHostAlloc((void **)&d->host_res, sizeof(struct cuda_result), cudaHostAllocPortable));
	return tr_cuda_kernels_probe(be, idx);
}

/* Turns the runtime's answer to "how many devices?" into a reason a user
 * can act on: cudaErrorInsufficientDriver also means "no driver at all". */
static void explain_no_device(cudaError_t e, char *err, size_t errlen)
{
	int drv = 0, rt = 0;

	cudaDriverGetVersion(&drv);
	cudaRuntimeGetVersion(&rt);
	(void)cudaGetLastError();
	if (e == cudaErrorInsufficientDriver && drv == 0)
		snprintf(err, errlen, "no NVIDIA driver found (libcuda.so.1 is not installed or not loadable)");
	else if (e == cudaErrorInsufficientDriver)
		snprintf(err, errlen, "the NVIDIA driver supports CUDA %d.%d, this build needs CUDA %d.%d", drv / 1000,
			 drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
	else if (e == cudaErrorNoDevice)
		snprintf(err, errlen, "no CUDA device found (check CUDA_VISIBLE_DEVICES=%s and the driver)",
			 getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "<unset>");
	else
		snprintf(err, errlen, "cannot initialise CUDA: %s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
}

/* The module's answer to "is a GPU usable?" (engine/cuda/module.h). */
static int cuda_module_device_count(char *why, size_t len)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);

	(void)cudaGetLastError();
	if (e != cudaSuccess || n <= 0) {
		explain_no_device(e == cudaSuccess ? cudaErrorNoDevice : e, why, len);
		return -ENODEV;
	}
	return n;
}

/* ---- memory ------------------------------------------------------------- */

/* cudaMalloc(0) "succeeds" with NULL; a tiny block keeps NULL meaning
 * failure, as in the CPU backend. */
static void *cuda_alloc(tr_backend_t *be, int dev, size_t bytes)
{
	struct cuda_backend *b = cuda_be(be);
	void *p = NULL;
	cudaError_t e;

	if (tr_cuda_use(be, dev, "alloc"))
		return NULL;
	e = cudaMalloc(&p, bytes ? bytes : 256);
	if (e != cudaSuccess) {
		size_t fr = 0, tot = 0;
		(void)cudaGetLastError();
		cudaMemGetInfo(&fr, &tot);
		(void)cudaGetLastError();
		tr_cuda_set_error(be, e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO,
				  "alloc: %zu bytes on device %d (%s): %s (%zu MiB free of %zu MiB)", bytes, dev,
				  b->dev[dev].name, cudaGetErrorString(e), fr >> 20, tot >> 20);
		return NULL;
	}
	/* Zeroed in stream order: everything that touches p goes through this
	 * stream (or waits on it, as the collectives do); the copy stream does
	 * not, which is why backend.h asks for a sync before to_device_async
	 * writes into a new buffer. */
	if (bytes && tr_cuda_check_rt(be, cudaMemsetAsync(p, 0, bytes, b->dev[dev].stream), "alloc: zeroing", __FILE__,
				      __LINE__)) {
		cudaFree(p);
		return NULL;
	}
	return p;
}

/* cudaFree waits for the device, so no kernel still uses ptr. */
static void cuda_free(tr_backend_t *be, int dev, void *ptr)
{
	if (!ptr || tr_cuda_use(be, dev, "free"))
		return;
	tr_cuda_check_rt(be, cudaFree(ptr), "cudaFree(ptr)", __FILE__, __LINE__);
}

/* Portable: pinned for every device's context, whichever thread asks. */
static void *cuda_host_alloc(tr_backend_t *be, size_t bytes)
{
	void *p = NULL;

	if (tr_cuda_check_rt(be, cudaHostAlloc(&p, bytes ? bytes : 64, cudaHostAllocPortable),
			     "host_alloc: cudaHostAlloc", __FILE__, __LINE__))
		return NULL;
	memset(p, 0, bytes);
	return p;
}

static void cuda_host_free(tr_backend_t *be, void *ptr)
{
	if (ptr)
		tr_cuda_check_rt(be, cudaFreeHost(ptr), "cudaFreeHost(ptr)", __FILE__, __LINE__);
}

/* ---- copies ------------------------------------------------------------- */

static int copy_args(tr_backend_t *be, int dev, void *dst, const void *src, size_t bytes, const char *what)
{
	int rc = tr_cuda_use(be, dev, what);

	if (rc)
		return rc;
	if (bytes && (!dst || !src))
		return tr_cuda_set_error(be, -EINVAL, "%s: NULL pointer for %zu bytes", what, bytes);
	return 0;
}

/* One host<->device copy enqueued on dev's compute stream or, on_copy_stream,
 * its copy stream. */
static int enqueue_copy(tr_backend_t *be, int dev, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
			bool on_copy_stream, const char *what)
{
	int rc = copy_args(be, dev, dst, src, bytes, what);

	if (rc || !bytes)
		return rc;
	struct cuda_dev *d = &cuda_be(be)->dev[dev];
	CUDA_CHECK(be, cudaMemcpyAsync(dst, src, bytes, kind, on_copy_stream ? d->copy_stream : d->stream));
	return 0;
}

/* From pageable memory the runtime stages the data before returning, so
 * src may be reused at once; from pinned memory (host_alloc) the copy is
 * truly asynchronous and src must stay untouched until sync. */
static int cuda_to_device(tr_backend_t *be, int dev, void *dst, const void *src, size_t bytes)
{
	return enqueue_copy(be, dev, dst, src, bytes, cudaMemcpyHostToDevice, false, "to_device");
}

/* The same copy on the copy stream: it overlaps the compute stream's work
 * (from pinned memory; from pageable memory the runtime stages it first).
 * Nothing orders it with the compute stream until copies_fence or sync. */
static int cuda_to_device_async(tr_backend_t *be, int dev, void *dst, const void *src, size_t bytes)
{
	return enqueue_copy(be, dev, dst, src, bytes, cudaMemcpyHostToDevice, true, "to_device_async");
}

/* A stream-side wait: the host returns at once.  The wait applies to the
 * event's latest record, so one event per device serves every step. */
static int cuda_copies_fence(tr_backend_t *be, int dev)
{
	int rc = tr_cuda_use(be, dev, "copies_fence");

	if (rc)
		return rc;
	struct cuda_dev *d = &cuda_be(be)->dev[dev];
	CUDA_CHECK(be, cudaEventRecord(d->copied, d->copy_stream));
	CUDA_CHECK(be, cudaStreamWaitEvent(d->stream, d->copied, 0));
	return 0;
}

/* Into pageable memory the runtime returns only when the data is there;
 * into pinned memory dst is valid after sync. */
static int cuda_to_host(tr_backend_t *be, int dev, void *dst, const void *src, size_t bytes)
{
	cudaPointerAttributes at;
	if (bytes && dst) {
		if (cudaPointerGetAttributes(&at, dst) != cudaSuccess)
			(void)cudaGetLastError();
		else if (at.type == cudaMemoryTypeUnregistered)
			tr_cuda_count_wait(be); /* pageable: the copy returns only when done */
	}
	return enqueue_copy(be, dev, dst, src, bytes, cudaMemcpyDeviceToHost, false, "to_host");
}

/* memmove semantics, as the CPU backend: cudaMemcpy is undefined for
 * overlapping ranges, so an overlapping copy goes through a temporary
 * from the stream-ordered allocator (rare: the model never does this). */
static int cuda_copy(tr_backend_t *be, int dev, void *dst, const void *src, size_t bytes)
{
	cudaStream_t s;
	int rc = copy_args(be, dev, dst, src, bytes, "copy");

	if (rc || !bytes || dst == src)
		return rc;
	s = cuda_be(be)->dev[dev].stream;
	uintptr_t d = (uintptr_t)dst, o = (uintptr_t)src;
	if (d + bytes <= o || o + bytes <= d) {
		CUDA_CHECK(be, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
		return 0;
	}
	void *tmp = NULL;
	CUDA_CHECK(be, cudaMallocAsync(&tmp, bytes, s));
	rc = tr_cuda_check_rt(be, cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDeviceToDevice, s), "copy: to temporary",
			      __FILE__, __LINE__);
	if (!rc)
		rc = tr_cuda_check_rt(be, cudaMemcpyAsync(dst, tmp, bytes, cudaMemcpyDeviceToDevice, s),
				      "copy: from temporary", __FILE__, __LINE__);
	int rc2 = tr_cuda_check_rt(be, cudaFreeAsync(tmp, s), "cudaFreeAsync(tmp, s)", __FILE__, __LINE__);
	return rc ? rc : rc2;
}

static int cuda_memset0(tr_backend_t *be, int dev, void *dst, size_t bytes)
{
	int rc = tr_cuda_use(be, dev, "memset0");

	if (rc || !bytes)
		return rc;
	if (!dst)
		return tr_cuda_set_error(be, -EINVAL, "memset0: NULL pointer for %zu bytes", bytes);
	CUDA_CHECK(be, cudaMemsetAsync(dst, 0, bytes, cuda_be(be)->dev[dev].stream));
	return 0;
}

/* Also where a fault inside an earlier kernel surfaces.  Both streams are
 * waited for even when the copy stream reports an error, so that after a
 * failed step no copy still reads a prefetch slot about to be freed. */
static int cuda_sync(tr_backend_t *be, int dev)
{
	int rc = tr_cuda_use(be, dev, "sync");

	if (rc)
		return rc;
	struct cuda_dev *d = &cuda_be(be)->dev[dev];
	tr_cuda_count_wait(be);
	int copy_rc = tr_cuda_check_rt(be, cudaStreamSynchronize(d->copy_stream), "cudaStreamSynchronize(copy_stream)",
				       __FILE__, __LINE__);
	CUDA_CHECK(be, cudaStreamSynchronize(d->stream));
	if (copy_rc)
		return copy_rc;
	/* softmax_ce's label check, read here rather than in the call, which
	 * would have waited (engine/backend.h) */
	if (d->label_pending) {
		unsigned long long bad = d->host_res->bad_label;
		d->label_pending = false;
		if (bad != TR_CUDA_NO_BAD_LABEL) {
			unsigned bits = (unsigned)(bad & 0xffffffffu);
			float l;
			memcpy(&l, &bits, sizeof l);
			return tr_cuda_set_error(be, -EINVAL,
						 "softmax_ce: row %d: label %g is not an integer class in [0, %d)",
						 (int)(bad >> 32), (double)l, d->label_classes);
		}
	}
	return 0;
}

static uint64_t cuda_host_waits(tr_backend_t *be)
{
	return __atomic_load_n(&cuda_be(be)->host_waits, __ATOMIC_RELAXED);
}

/* Per device, for the job that owns it (the daemon runs jobs with
 * different precisions on one backend).  The handle is only used by that
 * job's threads, which start after this call, and a math mode applies to
 * the cuBLAS calls made after it, so work already enqueued is unaffected. */
static int cuda_set_tf32(tr_backend_t *be, int dev, bool allow)
{
	int rc = tr_cuda_use(be, dev, "set_tf32");

	if (rc)
		return rc;
	CUBLAS_CHECK(be, cublasSetMathMode(cuda_be(be)->dev[dev].blas,
					   allow ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
	return 0;
}

/* ---- lifecycle ---------------------------------------------------------- */

static void cuda_destroy(tr_backend_t *be)
{
	struct cuda_backend *b = cuda_be(be);

	if (!b)
		return;
	for (int i = 0; b->dev && i < b->ndev; i++)
		finish_device(&b->dev[i]);
	free(b->dev);
	pthread_mutex_destroy(&b->err_mu);
	free(b);
}

/* Every entry of the table: this file's, the kernels' and the
 * collectives', plus what the engine lends (the memory estimate). */
static void cuda_fill_table(tr_backend_i *t, const struct tr_cuda_host *host)
{
	t->name = "cuda";
	t->kind = TR_BACKEND_KIND_CUDA;
	t->destroy = cuda_destroy;
	t->device_count = cuda_device_count;
	t->device_name = cuda_device_name;
	t->memory_info = cuda_memory_info;
	t->last_error = cuda_last_error;
	t->alloc = cuda_alloc;
	t->free = cuda_free;
	t->host_alloc = cuda_host_alloc;
	t->host_free = cuda_host_free;
	t->to_device = cuda_to_device;
	t->to_host = cuda_to_host;
	t->copy = cuda_copy;
	t->memset0 = cuda_memset0;
	t->sync = cuda_sync;
	t->host_waits = cuda_host_waits;
	t->to_device_async = cuda_to_device_async;
	t->copies_fence = cuda_copies_fence;
	t->set_tf32 = cuda_set_tf32;
	t->memory_estimate = host ? host->memory_estimate : NULL;
	t->memory_context_bytes = host ? host->memory_context_bytes : 0;
	tr_cuda_dense_fill(t);
	tr_cuda_elementwise_fill(t);
	tr_cuda_reduce_fill(t);
	tr_cuda_norm_fill(t);
	tr_cuda_norm2d_fill(t);
	tr_cuda_loss_fill(t);
	tr_cuda_optim_fill(t);
	tr_cuda_conv_fill(t);
	tr_cuda_comm_fill(t);
}

static tr_backend_t *cuda_create(const struct tr_cuda_options *opt, const struct tr_cuda_host *host, char *err,
				 size_t errlen)
{
	struct tr_cuda_options defaults = {false, 0, NULL};
	struct cuda_backend *b;
	cudaError_t e;
	int n = 0;

	if (!opt)
		opt = &defaults;
	if (!err || !errlen) {
		static thread_local char sink[TR_CUDA_ERR_LEN];
		err = sink;
		errlen = sizeof(sink);
	}
	err[0] = '\0';
	if (opt->max_devices < 0) {
		snprintf(err, errlen, "max_devices must be >= 0, got %d", opt->max_devices);
		return NULL;
	}
	e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess || n <= 0) {
		explain_no_device(e == cudaSuccess ? cudaErrorNoDevice : e, err, errlen);
		return NULL;
	}
	if (opt->max_devices > 0 && n > opt->max_devices)
		n = opt->max_devices;

	b = (struct cuda_backend *)calloc(1, sizeof(*b));
	if (!b)
		goto fail_alloc;
	if (pthread_mutex_init(&b->err_mu, NULL) != 0)
		goto fail_mutex;
	b->dev = (struct cuda_dev *)calloc((size_t)n, sizeof(*b->dev));
	if (!b->dev)
		goto fail_devs;
	b->base.i = &b->table;
	b->id = next_id.fetch_add(1);
	b->tf32 = opt->tf32;
	b->sync_launches = getenv("TRAINERD_CUDA_SYNC_LAUNCHES") &&
			   strcmp(getenv("TRAINERD_CUDA_SYNC_LAUNCHES"), "1") == 0;
	cuda_fill_table(&b->table, host);

	for (int i = 0; i < n; i++) {
		b->ndev = i + 1; /* destroy releases exactly what was set up */
		if (init_device(&b->base, i) < 0) {
			snprintf(err, errlen, "CUDA device %d: %s", i, cuda_last_error(&b->base));
			cuda_destroy(&b->base);
			return NULL;
		}
	}
	return &b->base;

fail_devs:
	pthread_mutex_destroy(&b->err_mu);
fail_mutex:
	free(b);
fail_alloc:
	snprintf(err, errlen, "out of host memory");
	return NULL;
}

/* ---- the module's entry point (engine/cuda/module.h) -------------------- */

static const struct tr_cuda_module module_desc = {
	TR_CUDA_MODULE_ABI, sizeof(tr_backend_i), TR_VERSION, cuda_module_device_count, cuda_fill_table, cuda_create,
};

extern "C" __attribute__((visibility("default"))) const struct tr_cuda_module *tr_cuda_module_v1(void)
{
	return &module_desc;
}
