/* The job spec's "resources" section (spec_resources.c), for spec.c's
 * table. */
#ifndef TR_ENGINE_SPEC_RESOURCES_H
#define TR_ENGINE_SPEC_RESOURCES_H

#include "engine/comm.h"
#include "engine/spec_fields.h"

#define TR_SPEC_MAX_NODES 1024
#define TR_SPEC_MAX_TASKS_PER_NODE 64
/* Tasks (ranks) a Slurm job may have: a job's processes at most.  More
 * than one needs exact mode (spec.c's checks across fields). */
#define TR_SLURM_MAX_TASKS TR_MAX_PROCESSES

int tr_spec_parse_resources(struct tr_fields_ctx *c, const json_t *v, void *base);
int tr_spec_emit_resources(const void *base, json_t *obj, const char *key);

#endif
