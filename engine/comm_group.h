/* GPU ranks: the device communicator of a job's processes (docs/design.md,
 * "Processes and the communicator").
 *
 * A job of several processes on a backend whose memory the host cannot
 * read (CUDA) cannot gather its shard slots through the process
 * communicator (engine/comm.h), which moves host memory.  The backend's
 * group communicator (engine/backend.h, comm_group_create: NCCL in the
 * CUDA module) then spans every process's devices: process 0 makes its id,
 * the process communicator broadcasts it, and each process joins with its
 * devices as global ranks proc * ndev .. proc * ndev + ndev - 1.  The
 * exact sum goes through it as through one process's communicator of
 * several devices (engine/exact.c: disjoint slots, allreduce_sum, then the
 * fold in shard order), so its result is the one definition of exact
 * mode.  The process communicator keeps the rest: the initial weights,
 * the losses, the agreed stop.
 */
#ifndef TR_ENGINE_COMM_GROUP_H
#define TR_ENGINE_COMM_GROUP_H

#include <stdbool.h>

#include "core/error.h"
#include "engine/backend.h"
#include "engine/comm.h"

/* Whether a job of nproc processes on be sums through the backend's group
 * communicator: be has one, and nproc > 1, or TRAINERD_COMM_GROUP=1 asks
 * for it on one process too (the GPU check runs NCCL's cross-process path
 * on one GPU that way). */
bool tr_comm_group_used(const tr_backend_t *be, int nproc);

/* The first of the ndev devices of the process with local rank
 * local_rank (its index among the job's processes on this machine,
 * tr_pcomm_local_rank) out of the avail devices it sees: local_rank *
 * ndev, or 0 when it sees exactly ndev (a launcher gave each process its
 * own, through CUDA_VISIBLE_DEVICES).  Negative with the reason in err
 * when the machine has too few. */
int tr_comm_group_first_device(int local_rank, int ndev, int avail, struct tr_error *err);

/* The group communicator over this process's ndev devices devs[] (all
 * processes call it, with equal ndev): NULL with the reason in err.  A
 * process 0 that cannot make the id still broadcasts, so that the others
 * fail naming it instead of waiting for a group that never forms. */
tr_comm_t *tr_comm_group_open(tr_backend_t *be, tr_pcomm_t *pc, int ndev, const int *devs, struct tr_error *err);

#endif
