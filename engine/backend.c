/* Opening a backend, and what every backend's table must hold.
 *
 * `trainerd serve`, `run`, `eval` and `predict` open their devices here, so
 * that the choice (CUDA when a GPU is usable, else CPU devices), the
 * fallback and the CPU device count follow one rule (docs/design.md,
 * "Backends").  The CUDA backend is a module loaded on demand
 * (engine/cuda/loader.c); nothing here links CUDA.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "engine/backend.h"
#include "engine/cuda/cuda.h"

/* Every operation a backend must provide (engine/backend.h).  The
 * optional ones are listed apart: memory_info, set_tf32 and
 * memory_estimate may be NULL, the pairs must be set together. */
/* clang-format off */
#define REQUIRED_OPS(X)                                                                                          \
	X(destroy) X(device_count) X(device_name) X(last_error) X(alloc) X(free) X(host_alloc) X(host_free)      \
	X(to_device) X(to_host) X(copy) X(memset0) X(sync) X(gemm) X(add_bias) X(col_sum) X(act_forward)         \
	X(act_backward) X(dropout_forward) X(mul) X(add) X(conv2d_forward) X(conv2d_backward)                    \
	X(maxpool2d_forward) X(maxpool2d_backward) X(avgpool2d_forward) X(avgpool2d_backward)                  \
	X(layernorm_forward) X(layernorm_backward) X(bn_sums) X(bn_apply) X(bn_running_update)                  \
	X(bn_backward_sums) X(bn_backward_apply) X(groupnorm_forward) X(groupnorm_backward) X(softmax_ce)        \
	X(mse) X(scale) X(sumsq) X(sumsq_ranges) X(clip_scale) X(sgd_step) X(adam_step) X(comm_create)          \
	X(allreduce_sum) X(comm_abort) X(comm_destroy)
/* clang-format on */

int tr_backend_check_ops(const tr_backend_i *t, struct tr_error *err)
{
	if (!t->name || !t->name[0]) {
		tr_error_set(err, 0, 0, NULL, "backend table: no name");
		return -ENOSYS;
	}
	if (t->kind != TR_BACKEND_KIND_CPU && t->kind != TR_BACKEND_KIND_CUDA) {
		tr_error_set(err, 0, 0, NULL, "backend %s: kind %d is not a backend kind", t->name, (int)t->kind);
		return -ENOSYS;
	}
#define CHECK_OP(op)                                                                                         \
	if (!t->op) {                                                                                        \
		tr_error_set(err, 0, 0, NULL, "backend %s: required operation %s is missing", t->name, #op); \
		return -ENOSYS;                                                                              \
	}
	REQUIRED_OPS(CHECK_OP)
#undef CHECK_OP
	if (!t->to_device_async != !t->copies_fence) {
		tr_error_set(err, 0, 0, NULL, "backend %s: to_device_async and copies_fence must be set together",
			     t->name);
		return -ENOSYS;
	}
	if (!t->sgd_step_into != !t->adam_step_into) {
		tr_error_set(err, 0, 0, NULL, "backend %s: sgd_step_into and adam_step_into must be set together",
			     t->name);
		return -ENOSYS;
	}
	if (!t->comm_group_id != !t->comm_group_create) {
		tr_error_set(err, 0, 0, NULL, "backend %s: comm_group_id and comm_group_create must be set together",
			     t->name);
		return -ENOSYS;
	}
	return 0;
}

/* The CPU device count: as asked, else one per online core, capped at
 * what the backend accepts (a 96-core machine gets 64 devices rather than
 * an error). */
static int cpu_device_count(const struct tr_backend_options *opt, struct tr_error *err)
{
	int n = opt->cpu_devices > 0 ? opt->cpu_devices : opt->devices;
	if (n > TR_CPU_MAX_DEVICES) {
		tr_error_set(err, 0, 0, NULL, "%d CPU devices asked for, at most %d", n, TR_CPU_MAX_DEVICES);
		return -EINVAL;
	}
	if (n == 0) {
		long cores = sysconf(_SC_NPROCESSORS_ONLN);
		n = cores < 1 ? 1 : cores > TR_CPU_MAX_DEVICES ? TR_CPU_MAX_DEVICES : (int)cores;
	}
	return n;
}

static int opened(tr_backend_t *be, tr_backend_t **out, struct tr_error *err)
{
	int rc = tr_backend_check_ops(be->i, err);
	if (rc < 0) {
		tr_backend_destroy(be);
		return rc;
	}
	*out = be;
	return 0;
}

int tr_backend_open(const struct tr_backend_options *opt, tr_backend_t **out, char *fallback, size_t fblen,
		    struct tr_error *err)
{
	struct tr_error why = {0};
	tr_backend_t *be = NULL;

	*out = NULL;
	if (fallback && fblen)
		fallback[0] = '\0';
	if (opt->devices < 0 || opt->cpu_devices < 0 || opt->blas_threads < 0) {
		tr_error_set(err, 0, 0, NULL, "device and thread counts must be >= 0");
		return -EINVAL;
	}
	if (opt->kind != TR_BACKEND_KIND_CPU) {
		struct tr_cuda_options copt = {.tf32 = opt->tf32,
					       .max_devices = opt->devices,
					       .module_path = opt->cuda_module};
		be = tr_cuda_backend_create_opts(&copt, &why);
		if (be)
			return opened(be, out, err);
		if (opt->kind == TR_BACKEND_KIND_CUDA) {
			tr_error_set(err, 0, 0, NULL, "cuda requested but unavailable: %s", why.message);
			return -ENODEV;
		}
	}
	int n = cpu_device_count(opt, err);
	if (n < 0)
		return n;
	be = tr_cpu_backend_create(n, opt->blas_threads);
	if (!be) {
		tr_error_set(err, 0, 0, NULL, "cannot create %d CPU devices", n);
		return -ENOMEM;
	}
	int rc = tr_cpu_backend_set_conv(be, opt->cpu_conv, err);
	if (rc < 0) {
		tr_backend_destroy(be);
		return rc;
	}
	if (why.message[0] && fallback && fblen)
		snprintf(fallback, fblen, "%s", why.message);
	return opened(be, out, err);
}

int tr_backend_kind_parse(const char *name, enum tr_backend_kind *out)
{
	static const char *const names[] = {"auto", "cpu", "cuda"};
	for (int i = 0; i < 3; i++)
		if (name && strcmp(name, names[i]) == 0) {
			*out = (enum tr_backend_kind)i;
			return 0;
		}
	return -EINVAL;
}
