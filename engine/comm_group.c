/* GPU ranks: the device communicator of a job's processes (comm_group.h). */
#include "engine/comm_group.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool tr_comm_group_used(const tr_backend_t *be, int nproc)
{
	const char *forced = getenv("TRAINERD_COMM_GROUP");
	if (!be->i->comm_group_create)
		return false;
	return nproc > 1 || (forced && strcmp(forced, "1") == 0);
}

int tr_comm_group_first_device(int local_rank, int ndev, int avail, struct tr_error *err)
{
	if (avail == ndev)
		return 0;
	if (local_rank >= 0 && (local_rank + 1) * ndev <= avail)
		return local_rank * ndev;
	tr_error_set(err, 0, 0, "/devices",
		     "/devices: the process of local rank %d on this machine needs devices %d .. %d (%d per "
		     "process), but sees %d: start fewer processes per machine, or give each its own GPUs "
		     "(CUDA_VISIBLE_DEVICES)",
		     local_rank, local_rank * ndev, (local_rank + 1) * ndev - 1, ndev, avail);
	return -EINVAL;
}

tr_comm_t *tr_comm_group_open(tr_backend_t *be, tr_pcomm_t *pc, int ndev, const int *devs, struct tr_error *err)
{
	const tr_backend_i *bi = be->i;
	const int proc = pc->i->rank(pc), nproc = pc->i->size(pc);
	/* byte 0 says whether process 0 made the id */
	unsigned char msg[1 + TR_COMM_GROUP_ID_BYTES];
	char why[512] = "";
	memset(msg, 0, sizeof msg);
	if (!bi->comm_group_create) {
		tr_error_set(err, 0, 0, "/processes",
			     "/processes: backend %s has no communicator across processes (the CUDA module's NCCL)",
			     bi->name);
		return NULL;
	}
	if (proc == 0) {
		msg[0] = bi->comm_group_id(be, msg + 1) == 0;
		if (!msg[0])
			snprintf(why, sizeof why, "%s", bi->last_error(be));
	}
	if (pc->i->bcast(pc, msg, sizeof msg, 0) < 0) {
		tr_error_set(err, 0, 0, NULL, "processes: the id of the %s devices' group: %s", bi->name,
			     pc->i->last_error(pc));
		return NULL;
	}
	if (!msg[0]) {
		if (proc == 0)
			tr_error_set(err, 0, 0, NULL, "processes: cannot make the id of the %s devices' group: %s",
				     bi->name, why);
		else
			tr_error_set(err, 0, 0, NULL,
				     "processes: process 0 could not make the id of the %s devices' group (its "
				     "error names the cause)",
				     bi->name);
		return NULL;
	}
	tr_comm_t *c = bi->comm_group_create(be, ndev, devs, msg + 1, nproc * ndev, proc * ndev);
	if (!c)
		tr_error_set(err, 0, 0, NULL,
			     "processes: process %d cannot join the %s devices' group as ranks %d .. %d of %d: %s",
			     proc, bi->name, proc * ndev, proc * ndev + ndev - 1, nproc * ndev, bi->last_error(be));
	return c;
}
