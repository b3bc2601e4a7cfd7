/* Host memory: what a job will take, and what the machine has for it
 * (docs/design.md, "Memory admission").
 *
 * CPU devices allocate from the host's memory, as do every backend's
 * data readers and prefetch ring, and nothing stops a job whose every
 * allocation fits but whose total does not: the kernel's OOM killer then
 * takes the whole daemon.  A job's estimate is formed before its
 * parameters, replicas and ring are allocated and admitted against the
 * memory available, so such a job is refused (or waits) with both
 * figures instead.
 */
#ifndef TR_ENGINE_MEMORY_H
#define TR_ENGINE_MEMORY_H

#include <stdint.h>

#include "core/error.h"

/* One job's estimate in bytes, by part; total is their sum. */
struct tr_mem_estimate {
	uint64_t model;       /* parameters, gradients and optimizer state, every replica */
	uint64_t activations; /* the forward's outputs and saved tensors at the batch per device, every replica */
	uint64_t ring;        /* the prefetch ring: depth batches of inputs and labels */
	uint64_t loaders;     /* each loader thread's decoding scratch (an image decoded and resized) */
	uint64_t data;        /* data held in memory: parsed CSV, inflated gzip IDX, decoded patches images */
	uint64_t scratch;     /* set-up and checkpoint copies of the parameters, backend workspaces, stacks */
	uint64_t total;
};

/* The bytes new allocations may take: the override when one is set
 * (tr_mem_set_available: the daemon's memory-available option, or the
 * environment's TRAINERD_MEMORY_AVAILABLE, in bytes), else
 * /proc/meminfo's MemAvailable (free memory plus the cache the kernel can
 * reclaim), or less where the process's limits leave less: RLIMIT_AS
 * less the address space in use, a cgroup v2 memory.max less
 * memory.current.  *source (may be NULL) says which (enum tr_mem_source). */
enum tr_mem_source { TR_MEM_MEMINFO, TR_MEM_OVERRIDE, TR_MEM_LIMIT };
uint64_t tr_mem_available(int *source);
/* The source's name for messages: "MemAvailable", "memory-available",
 * "the process's memory limit". */
const char *tr_mem_source_name(int source);
/* /proc/meminfo's MemAvailable alone (the free pages where it is missing). */
uint64_t tr_mem_meminfo_available(void);
/* Sets the override; 0 clears it (the environment's applies again). */
void tr_mem_set_available(uint64_t bytes);

/* "1234 MiB (model 10, activations 800, ring 4, loaders 0, data 400,
 * scratch 20)" into buf. */
void tr_mem_describe(const struct tr_mem_estimate *e, char *buf, size_t len);

/* Checks a job alone against tr_mem_available (trainerd run, which has
 * no other jobs): its data is already in memory, so it counts as
 * available unless the figure is an override.  0, or -ENOMEM with both
 * figures in err. */
int tr_mem_admit_alone(const struct tr_mem_estimate *e, struct tr_error *err);

#endif
