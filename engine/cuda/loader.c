/* Loads the CUDA backend, a module (engine/cuda/module.h), on demand.
 *
 * Plain C in every build.  Nothing is loaded until a command asks for a
 * GPU, and then only on a machine with an NVIDIA driver: the probe looks
 * for the driver's control device first, so a machine without a GPU never
 * maps cuBLAS (its libraries cost ~150 MB of resident memory and most of
 * a start-up, bench/startup/RESULTS.md).  A module, once loaded, stays
 * loaded for the life of the process: CUDA's libraries are not made to be
 * unloaded, and a daemon asks again on every refused submit.
 */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/backend.h"
#include "engine/cuda/cuda.h"
#include "engine/cuda/module.h"

#ifndef TR_CUDA_MODULE_DIR
#define TR_CUDA_MODULE_DIR "/usr/local/lib/trainerd"
#endif

static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;
static const struct tr_cuda_module *loaded; /* under load_mu; never unloaded */

static const struct tr_cuda_host host = {
	.memory_estimate = tr_cuda_estimate_bytes,
	.memory_context_bytes = TR_CUDA_CONTEXT_BYTES,
};

/* The NVIDIA kernel driver creates /dev/nvidiactl (GPU containers get it
 * passed in); WSL's GPU paravirtualisation is /dev/dxg.  Without either,
 * CUDA cannot find a device, and loading the module would only cost
 * memory and time to say so. */
static bool driver_present(char *why, size_t len)
{
	if (access("/dev/nvidiactl", F_OK) == 0 || access("/dev/dxg", F_OK) == 0)
		return true;
	snprintf(why, len, "no NVIDIA driver found (no /dev/nvidiactl: no GPU here, or its driver is not loaded)");
	return false;
}

/* Opens one candidate file; 1 when it is not there (try the next), 0 when
 * loaded, negative when it is there but unusable (stop: a broken module
 * must be reported, not skipped in favour of another). */
static int try_load(const char *path, struct tr_error *err)
{
	if (access(path, F_OK) != 0)
		return 1;
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		tr_error_set(err, 0, 0, NULL, "cannot load the CUDA module %s: %s", path, dlerror());
		return -ELIBACC;
	}
	tr_cuda_module_entry_fn entry;
	*(void **)&entry = dlsym(h, TR_CUDA_MODULE_ENTRY);
	const struct tr_cuda_module *m = entry ? entry() : NULL;
	if (!m) {
		tr_error_set(err, 0, 0, NULL, "%s is not a trainerd CUDA module (no %s)", path, TR_CUDA_MODULE_ENTRY);
		dlclose(h);
		return -ELIBBAD;
	}
	if (m->abi != TR_CUDA_MODULE_ABI || m->table_size != sizeof(tr_backend_i)) {
		tr_error_set(
			err, 0, 0, NULL,
			"the CUDA module %s was built for trainerd %s (interface %d, table %zu bytes); this is trainerd %s "
			"(interface %d, table %zu bytes): install the module of this build",
			path, m->version ? m->version : "?", m->abi, m->table_size, TR_VERSION, TR_CUDA_MODULE_ABI,
			sizeof(tr_backend_i));
		dlclose(h);
		return -ELIBBAD;
	}
	loaded = m;
	return 0;
}

/* The loaded module in *out, loading it on first use: 0, or -ENOENT when
 * there is none to load, another negative code when one is there but
 * unusable; the reason in err. */
static int module(const char *path, const struct tr_cuda_module **out, struct tr_error *err)
{
	char cand[PATH_MAX + 64], self[PATH_MAX];
	int rc = 0;

	pthread_mutex_lock(&load_mu);
	if (loaded)
		goto out;
	if (!path || !path[0])
		path = getenv("TRAINERD_CUDA_MODULE");
	if (path && path[0]) {
		rc = try_load(path, err);
		if (rc > 0)
			tr_error_set(err, 0, 0, NULL, "the CUDA module %s does not exist", path);
		goto out;
	}
#ifndef TR_HAVE_CUDA
	(void)cand;
	(void)self;
	tr_error_set(err, 0, 0, NULL, "this trainerd was built without CUDA support (-Dcuda=disabled or no toolkit)");
	rc = 1;
#else
	ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
	if (n > 0) {
		self[n] = '\0';
		char *slash = strrchr(self, '/');
		if (slash)
			*slash = '\0';
		snprintf(cand, sizeof cand, "%s/%s", self, TR_CUDA_MODULE_FILE);
		rc = try_load(cand, err);
		if (rc <= 0)
			goto out;
	} else {
		snprintf(self, sizeof self, "(unknown: no /proc/self/exe)");
	}
	snprintf(cand, sizeof cand, "%s/%s", TR_CUDA_MODULE_DIR, TR_CUDA_MODULE_FILE);
	rc = try_load(cand, err);
	if (rc > 0)
		tr_error_set(
			err, 0, 0, NULL,
			"the CUDA module %s is in neither %s (beside the executable) nor %s; set TRAINERD_CUDA_MODULE "
			"or cuda-module to its path",
			TR_CUDA_MODULE_FILE, self, TR_CUDA_MODULE_DIR);
#endif
out:
	*out = loaded;
	pthread_mutex_unlock(&load_mu);
	return *out ? 0 : rc > 0 ? -ENOENT : rc;
}

tr_backend_t *tr_cuda_backend_create_opts(const struct tr_cuda_options *opt, struct tr_error *err)
{
	char why[512];
	if (opt && opt->max_devices < 0) {
		tr_error_set(err, 0, 0, NULL, "max_devices must be >= 0, got %d", opt->max_devices);
		return NULL;
	}
	if (!driver_present(why, sizeof why)) {
		tr_error_set(err, 0, 0, NULL, "%s", why);
		return NULL;
	}
	const struct tr_cuda_module *m;
	if (module(opt ? opt->module_path : NULL, &m, err) < 0)
		return NULL;
	struct tr_cuda_options defaults = {0};
	/* The module's interface (module.h) keeps a plain buffer: it is a
	 * binary boundary, and the module links nothing of the host's. */
	why[0] = '\0';
	tr_backend_t *be = m->create(opt ? opt : &defaults, &host, why, sizeof why);
	if (!be)
		tr_error_set(err, 0, 0, NULL, "%s", why);
	return be;
}

tr_backend_t *tr_cuda_backend_create(struct tr_error *err)
{
	return tr_cuda_backend_create_opts(NULL, err);
}

bool tr_cuda_available(void)
{
	char why[512];
	if (!driver_present(why, sizeof why))
		return false;
	const struct tr_cuda_module *m;
	return module(NULL, &m, NULL) == 0 && m->device_count(why, sizeof why) > 0;
}

int tr_cuda_module_table(const char *path, tr_backend_i *t, struct tr_error *err)
{
	const struct tr_cuda_module *m;
	int rc = module(path, &m, err);
	if (rc < 0)
		return rc;
	memset(t, 0, sizeof *t);
	m->fill_table(t, &host);
	return 0;
}
