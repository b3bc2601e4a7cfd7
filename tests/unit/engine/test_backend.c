/* Tests of what every backend shares: the table of required operations
 * (tr_backend_check_ops) for the CPU backend and, when it was built, the
 * CUDA module's table (no GPU needed: the module fills a table without
 * touching a device); tr_backend_open, the one way both commands open
 * their devices (kinds, counts, the CPU cap, the fallback); and the CUDA
 * module loader's answers for a missing, foreign or mismatched module.
 *
 * The CUDA module's path comes from TRAINERD_CUDA_MODULE (tests/meson.build
 * sets it when the module is built); without it the CUDA table test is
 * skipped and says why.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/backend.h"
#include "engine/cuda/cuda.h"
#include "engine/cuda/module.h"

/* Skips visibly: Criterion shows skips only with --verbose. */
#define SKIP(...)                                         \
	do {                                              \
		fprintf(stderr, "[SKIP] %s: ", __func__); \
		fprintf(stderr, __VA_ARGS__);             \
		fprintf(stderr, "\n");                    \
		cr_skip_test(__VA_ARGS__);                \
	} while (0)

/* ---- required operations -------------------------------------------------- */

Test(backend_ops, cpu_table_has_every_required_op)
{
	tr_backend_t *be = tr_cpu_backend_create(2, 1);
	cr_assert_not_null(be);
	struct tr_error err = {0};
	cr_assert_eq(tr_backend_check_ops(be->i, &err), 0, "%s", err.message);
	cr_assert_eq(be->i->kind, TR_BACKEND_KIND_CPU);
	cr_assert(be->i->memory_is_host);
	cr_assert_null(be->i->memory_estimate, "CPU devices share host memory: nothing to estimate");
	tr_backend_destroy(be);
}

/* Each required operation, removed in turn, is named; the optional pairs
 * must come together. */
Test(backend_ops, a_missing_op_is_named)
{
	tr_backend_t *be = tr_cpu_backend_create(1, 1);
	cr_assert_not_null(be);
	struct tr_error err;
	tr_backend_i t;

	t = *be->i;
	t.softmax_ce = NULL;
	cr_assert_eq(tr_backend_check_ops(&t, &err), -ENOSYS);
	cr_assert_not_null(strstr(err.message, "softmax_ce"), "%s", err.message);

	/* the image normalisation kernels, which every backend has */
	t = *be->i;
	t.bn_backward_apply = NULL;
	cr_assert_eq(tr_backend_check_ops(&t, &err), -ENOSYS);
	cr_assert_not_null(strstr(err.message, "bn_backward_apply"), "%s", err.message);
	t = *be->i;
	t.groupnorm_forward = NULL;
	cr_assert_eq(tr_backend_check_ops(&t, &err), -ENOSYS);
	cr_assert_not_null(strstr(err.message, "groupnorm_forward"), "%s", err.message);

	t = *be->i;
	t.comm_destroy = NULL;
	cr_assert_eq(tr_backend_check_ops(&t, &err), -ENOSYS);
	cr_assert_not_null(strstr(err.message, "comm_destroy"), "%s", err.message);

	t = *be->i;
	t.copies_fence = NULL;
	cr_assert_eq(tr_backend_check_ops(&t, &err), -ENOSYS);
	cr_assert_not_null(strstr(err.message, "copies_fence"), "%s", err.message);
	t.to_device_async = NULL; /* neither: allowed */
	cr_assert_eq(tr_backend_check_ops(&t, &err), 0, "%s", err.message);

	t = *be->i;
	t.adam_step_into = NULL;
	cr_assert_eq(tr_backend_check_ops(&t, &err), -ENOSYS);
	cr_assert_not_null(strstr(err.message, "adam_step_into"), "%s", err.message);

	t = *be->i;
	t.set_tf32 = NULL;
	t.memory_info = NULL;
	t.gemm_accumulate_max_k = NULL;
	cr_assert_eq(tr_backend_check_ops(&t, &err), 0, "optional ops: %s", err.message);

	t = *be->i;
	t.kind = TR_BACKEND_KIND_AUTO;
	cr_assert_eq(tr_backend_check_ops(&t, &err), -ENOSYS, "an open backend is never AUTO");
	tr_backend_destroy(be);
}

/* The CUDA module's table, read without a GPU: every op of the CPU
 * reference is there too, and the memory check is on. */
Test(backend_ops, cuda_module_table_has_every_required_op)
{
	struct tr_error err = {0};
	tr_backend_i t;
	int rc = tr_cuda_module_table(NULL, &t, &err);
	if (rc == -ENOENT)
		SKIP("no CUDA module to check: %s", err.message);
	cr_assert_eq(rc, 0, "%s", err.message);
	cr_assert_eq(tr_backend_check_ops(&t, &err), 0, "%s", err.message);
	cr_assert_eq(t.kind, TR_BACKEND_KIND_CUDA);
	cr_assert_str_eq(t.name, "cuda");
	cr_assert(!t.memory_is_host);
	cr_assert_eq((void *)t.memory_estimate, (void *)tr_cuda_estimate_bytes);
	cr_assert_eq(t.memory_context_bytes, TR_CUDA_CONTEXT_BYTES);
	cr_assert_not_null(t.memory_info);
	cr_assert_not_null(t.set_tf32);
	/* GPU ranks across processes (engine/comm_group.h) */
	cr_assert_not_null(t.comm_group_id);
	cr_assert_not_null(t.comm_group_create);
}

/* ---- tr_backend_open ---------------------------------------------------- */

static int devices_of(tr_backend_t *be)
{
	return be->i->device_count(be);
}

Test(backend_open, cpu_counts_and_the_cap)
{
	tr_backend_t *be = NULL;
	char fb[512];
	struct tr_error err;

	struct tr_backend_options o = {.kind = TR_BACKEND_KIND_CPU, .devices = 3, .blas_threads = 1};
	cr_assert_eq(tr_backend_open(&o, &be, fb, sizeof fb, &err), 0, "%s", err.message);
	cr_assert_eq(devices_of(be), 3);
	cr_assert_eq(be->i->kind, TR_BACKEND_KIND_CPU);
	cr_assert_str_eq(fb, "", "asked for CPU: no fallback to report");
	tr_backend_destroy(be);

	/* the daemon's --cpu-devices wins over the device count */
	o.cpu_devices = 2;
	cr_assert_eq(tr_backend_open(&o, &be, fb, sizeof fb, &err), 0, "%s", err.message);
	cr_assert_eq(devices_of(be), 2);
	tr_backend_destroy(be);

	/* 0: one per online core, never more than the backend takes */
	o.cpu_devices = 0;
	o.devices = 0;
	cr_assert_eq(tr_backend_open(&o, &be, fb, sizeof fb, &err), 0, "%s", err.message);
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	cr_assert_eq(devices_of(be), cores > TR_CPU_MAX_DEVICES ? TR_CPU_MAX_DEVICES : (int)cores);
	tr_backend_destroy(be);

	o.devices = TR_CPU_MAX_DEVICES + 1;
	be = (tr_backend_t *)&o; /* must be reset */
	cr_assert_eq(tr_backend_open(&o, &be, fb, sizeof fb, &err), -EINVAL);
	cr_assert_null(be);
	cr_assert_not_null(strstr(err.message, "at most 64"), "%s", err.message);

	o.devices = -1;
	cr_assert_eq(tr_backend_open(&o, &be, fb, sizeof fb, &err), -EINVAL);
}

/* Without a usable GPU: auto falls back with the reason, cuda is an
 * error naming it.  On a GPU machine, both open CUDA. */
Test(backend_open, auto_falls_back_and_cuda_insists)
{
	tr_backend_t *be = NULL;
	char fb[512] = "x";
	struct tr_error err = {0};
	struct tr_backend_options o = {.kind = TR_BACKEND_KIND_AUTO, .devices = 2, .blas_threads = 1};

	cr_assert_eq(tr_backend_open(&o, &be, fb, sizeof fb, &err), 0, "%s", err.message);
	if (be->i->kind == TR_BACKEND_KIND_CUDA) {
		cr_assert_str_eq(fb, "");
		tr_backend_destroy(be);
		SKIP("this machine has a usable GPU: the fallback is not exercised");
	}
	cr_assert_eq(devices_of(be), 2);
	cr_assert(strlen(fb) > 0, "a fallback must say why");
	tr_backend_destroy(be);

	o.kind = TR_BACKEND_KIND_CUDA;
	be = NULL;
	cr_assert_eq(tr_backend_open(&o, &be, fb, sizeof fb, &err), -ENODEV);
	cr_assert_null(be);
	cr_assert_not_null(strstr(err.message, "cuda requested but unavailable: "), "%s", err.message);
}

Test(backend_open, kind_names)
{
	enum tr_backend_kind k;
	cr_assert_eq(tr_backend_kind_parse("auto", &k), 0);
	cr_assert_eq(k, TR_BACKEND_KIND_AUTO);
	cr_assert_eq(tr_backend_kind_parse("cpu", &k), 0);
	cr_assert_eq(k, TR_BACKEND_KIND_CPU);
	cr_assert_eq(tr_backend_kind_parse("cuda", &k), 0);
	cr_assert_eq(k, TR_BACKEND_KIND_CUDA);
	cr_assert_eq(tr_backend_kind_parse("CUDA", &k), -EINVAL);
	cr_assert_eq(tr_backend_kind_parse(NULL, &k), -EINVAL);
}

/* ---- the module loader -------------------------------------------------- */

/* Each test runs in its own process, so no module is loaded yet and the
 * path given is the one tried. */
Test(cuda_loader, a_missing_module_is_named)
{
	struct tr_error err = {0};
	tr_backend_i t;
	cr_assert_eq(tr_cuda_module_table("/nonexistent/trainerd-cuda.so", &t, &err), -ENOENT);
	cr_assert_not_null(strstr(err.message, "/nonexistent/trainerd-cuda.so"), "%s", err.message);
}

/* A module built for another table layout would write its entries at the
 * wrong offsets: refused, with both builds named. */
Test(cuda_loader, a_mismatched_module_is_refused)
{
	const char *fake = getenv("TR_FAKE_CUDA_MODULE");
	if (!fake || !fake[0])
		SKIP("TR_FAKE_CUDA_MODULE is not set (tests/meson.build sets it)");
	struct tr_error err = {0};
	tr_backend_i t;
	cr_assert_eq(tr_cuda_module_table(fake, &t, &err), -ELIBBAD);
	cr_assert_not_null(strstr(err.message, "was built for trainerd 0.0-other"), "%s", err.message);
	cr_assert_not_null(strstr(err.message, "install the module of this build"), "%s", err.message);
}

/* Any other shared object is not a module. */
Test(cuda_loader, a_library_that_is_not_a_module_is_refused)
{
	const char *fake = getenv("TR_FAKE_CUDA_MODULE");
	if (!fake || !fake[0])
		SKIP("TR_FAKE_CUDA_MODULE is not set (tests/meson.build sets it)");
	char path[4096];
	snprintf(path, sizeof path, "%s", fake);
	char *slash = strrchr(path, '/');
	cr_assert_not_null(slash);
	/* the fake's directory holds test executables, not shared objects: use
	 * a test helper library built beside it instead */
	snprintf(slash + 1, sizeof path - (size_t)(slash + 1 - path), "not_a_cuda_module.so");
	struct tr_error err = {0};
	tr_backend_i t;
	cr_assert_eq(tr_cuda_module_table(path, &t, &err), -ELIBBAD, "%s", err.message);
	cr_assert_not_null(strstr(err.message, "is not a trainerd CUDA module"), "%s", err.message);
}
