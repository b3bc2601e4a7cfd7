/* Host memory figures (see memory.h). */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "engine/memory.h"

static _Atomic uint64_t override_bytes;

void tr_mem_set_available(uint64_t bytes)
{
	atomic_store(&override_bytes, bytes);
}

uint64_t tr_mem_meminfo_available(void)
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

/* A number from a one-line file (cgroup v2's memory.max: "max" = none). */
static uint64_t file_number(const char *path)
{
	char buf[64] = "";
	FILE *f = fopen(path, "r");
	if (!f)
		return UINT64_MAX;
	if (!fgets(buf, sizeof buf, f))
		buf[0] = 0;
	fclose(f);
	return buf[0] >= '0' && buf[0] <= '9' ? strtoull(buf, NULL, 10) : UINT64_MAX;
}

/* What this process's limits leave, UINT64_MAX when none applies:
 * RLIMIT_AS less the address space in use (prlimit, ulimit -v), and the
 * cgroup v2 memory.max less memory.current (systemd's MemoryMax=). */
static uint64_t limits_left(void)
{
	uint64_t left = UINT64_MAX;
	struct rlimit rl;
	if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
		uint64_t used = 0;
		FILE *f = fopen("/proc/self/statm", "r");
		unsigned long long pages;
		if (f) {
			if (fscanf(f, "%llu", &pages) == 1)
				used = (uint64_t)pages * (uint64_t)sysconf(_SC_PAGESIZE);
			fclose(f);
		}
		left = rl.rlim_cur > used ? rl.rlim_cur - used : 0;
	}
	char line[512], path[600];
	FILE *f = fopen("/proc/self/cgroup", "r");
	while (f && fgets(line, sizeof line, f)) {
		if (strncmp(line, "0::", 3) != 0)
			continue;
		line[strcspn(line, "\n")] = 0;
		snprintf(path, sizeof path, "/sys/fs/cgroup%s/memory.max", line + 3);
		uint64_t max = file_number(path);
		snprintf(path, sizeof path, "/sys/fs/cgroup%s/memory.current", line + 3);
		uint64_t cur = file_number(path);
		if (max != UINT64_MAX && cur != UINT64_MAX) {
			uint64_t cg = max > cur ? max - cur : 0;
			left = cg < left ? cg : left;
		}
	}
	if (f)
		fclose(f);
	return left;
}

const char *tr_mem_source_name(int source)
{
	return source == TR_MEM_OVERRIDE ? "memory-available"
	       : source == TR_MEM_LIMIT  ? "the process's memory limit"
					 : "MemAvailable";
}

uint64_t tr_mem_available(int *source)
{
	uint64_t o = atomic_load(&override_bytes);
	if (!o) {
		const char *env = getenv("TRAINERD_MEMORY_AVAILABLE");
		o = env && *env ? strtoull(env, NULL, 10) : 0;
	}
	if (source)
		*source = o ? TR_MEM_OVERRIDE : TR_MEM_MEMINFO;
	if (o)
		return o;
	uint64_t avail = tr_mem_meminfo_available(), left = limits_left();
	if (left < avail && source)
		*source = TR_MEM_LIMIT;
	return left < avail ? left : avail;
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
	int source;
	uint64_t avail = tr_mem_available(&source);
	if (source != TR_MEM_OVERRIDE)
		avail += e->data; /* already read in, so already out of what is available */
	if (e->total <= avail)
		return 0;
	char what[256];
	tr_mem_describe(e, what, sizeof what);
	tr_error_set(err, 0, 0, NULL, "this job needs an estimated %s of memory, %.0f MiB is available (%s)", what,
		     mib(avail), tr_mem_source_name(source));
	return -ENOMEM;
}
