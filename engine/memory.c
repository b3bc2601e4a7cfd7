/* Host memory figures (see memory.h). */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "engine/memory.h"

static _Atomic uint64_t override_bytes;

void tr_mem_set_available(uint64_t bytes)
{
	atomic_store(&override_bytes, bytes);
}

static uint64_t meminfo_available(void)
{
	uint64_t bytes = 0;
	FILE *f = fopen("/proc/meminfo", "r");
	if (f) {
		char line[128];
		unsigned long long kb;
		while (fgets(line, sizeof line, f))
			if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
				bytes = (uint64_t)kb * 1024;
		fclose(f);
	}
	if (bytes == 0) {
		long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGESIZE);
		bytes = pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : 0;
	}
	return bytes;
}

uint64_t tr_mem_available(int *overridden)
{
	uint64_t o = atomic_load(&override_bytes);
	if (!o) {
		const char *env = getenv("TRAINERD_MEMORY_AVAILABLE");
		o = env && *env ? strtoull(env, NULL, 10) : 0;
	}
	if (overridden)
		*overridden = o != 0;
	return o ? o : meminfo_available();
}

static double mib(uint64_t b)
{
	return (double)b / 1048576.0;
}

void tr_mem_describe(const struct tr_mem_estimate *e, char *buf, size_t len)
{
	snprintf(buf, len,
		 "%.0f MiB (model %.0f, activations %.0f, prefetch ring %.0f, loaders %.0f, data %.0f, scratch %.0f)",
		 mib(e->total), mib(e->model), mib(e->activations), mib(e->ring), mib(e->loaders), mib(e->data),
		 mib(e->scratch));
}

int tr_mem_admit_alone(const struct tr_mem_estimate *e, struct tr_error *err)
{
	int overridden;
	uint64_t avail = tr_mem_available(&overridden);
	if (!overridden)
		avail += e->data; /* already read in, so already out of MemAvailable */
	if (e->total <= avail)
		return 0;
	char what[256];
	tr_mem_describe(e, what, sizeof what);
	tr_error_set(err, 0, 0, NULL, "this job needs an estimated %s of memory, %.0f MiB is available (%s)", what,
		     mib(avail), overridden ? "memory-available" : "MemAvailable");
	return -ENOMEM;
}
