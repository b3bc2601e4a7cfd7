/* The exact sum of exact mode (docs/design.md, "Exact mode").
 *
 * Shard partials (gradients, batchnorm2d's sums) are combined in shard
 * order, element by element, ((0 + s0) + s1) + ..., in float: the same
 * chain of additions whichever device computed which shard, so the result
 * has the same bits on any device count.  A backend with an exact_sum
 * collective (the CPU's, over shared memory) does it in one exchange;
 * elsewhere the sum is built from operations every backend has: each rank
 * writes its parts into their slots of an all-shards buffer that is zero
 * elsewhere, allreduce_sum adds the ranks' buffers (each slot has one
 * non-zero contributor, so the float sum is exact), and every rank folds
 * the slots in order with `add`.  Across processes (engine/comm.h) the
 * same slots travel: each process's ranks fill its own shards' slots,
 * its rank 0 gathers every process's (MPI_Allgatherv: the bytes as
 * written), and every rank folds all S slots in order, so the chain of
 * additions is again the one of a single device.
 */
#ifndef TR_ENGINE_EXACT_H
#define TR_ENGINE_EXACT_H

#include <stdbool.h>
#include <stddef.h>

#include "engine/backend.h"
#include "engine/comm.h"
#include "engine/spec.h"

/* The job's processes, when it has several (engine/comm.h): process p
 * holds shards first[p] .. first[p] + count[p] - 1. */
struct tr_exact_procs {
	tr_pcomm_t *pcomm;
	int proc, nproc;
	int first[TR_MAX_PROCESSES], count[TR_MAX_PROCESSES];
};

/* Overlap (docs/design.md, "Processes and the communicator"): with one
 * device per process, the cross-process gather goes in buckets, one per
 * top-level layer with parameters, started as the backward pass of the
 * process's last shard finishes that layer (tr_replica_t.layer_done) and
 * waited for before the fold, bucket by bucket.  The slots receive the
 * same bytes as the whole gather's (laid out by bucket), and each element
 * the same chain of additions, so the sum has the same bits. */
struct tr_exact_overlap {
	/* per top-level layer i: the lowest offset of the parameters of
	 * layers i .. n_layers - 1 (each layer's lie below the next one's,
	 * else the trainer does not overlap); params_end: the end of the
	 * last layer's */
	const size_t *lo_of;
	size_t params_end;
	int n_layers;
	/* this step: this rank's parts (as tr_exact_sum's), the last shard's
	 * gradient to add into parts[0] bucket by bucket (a prefix folded
	 * without the gemm, else NULL), floats [hi, params_end) under way,
	 * the next layer the pass will finish */
	const float *parts[TR_SPEC_MAX_SHARDS];
	int nparts;
	const float *add;
	size_t n, hi;
	int next;
	/* the buckets started: floats [lo, lo + len) of the sum, whose S
	 * slots lie together at slots + S * lo (len floats each), so that
	 * each process's part of a bucket is one contiguous block */
	size_t b_lo[TR_SPEC_MAX_LAYERS + 2], b_len[TR_SPEC_MAX_LAYERS + 2];
	int nb;
};

/* One rank's side of the sum; filled by the trainer. */
struct tr_exact_ctx {
	tr_backend_t *be;
	tr_comm_t *comm; /* NULL only with one device and no exact_sum */
	int rank, dev, ndev;
	int shards; /* of a step */
	int first;  /* this rank's first shard, the global index of parts[0] */
	/* Without the backend's exact_sum and with several devices: shards x
	 * slot_floats floats of device memory, for sums of up to slot_floats
	 * floats. */
	float *slots;
	size_t slot_floats;
	/* Several processes (procs->nproc > 1; NULL otherwise): the process's
	 * rank 0 gathers every process's slots into its own, which the other
	 * ranks read (host memory) through leader_slots. */
	const struct tr_exact_procs *procs;
	float *const *leader_slots;
	struct tr_exact_overlap ov;
	/* Several processes: milliseconds this step inside the process
	 * communicator's gathers (comm_ms) and, of those, waiting for them to
	 * end (wait_ms: all of a blocking gather); the trainer clears them. */
	double comm_ms, wait_ms;
	/* comm is a group communicator over every process's devices
	 * (engine/comm_group.h): the slots and allreduce_sum carry the sum
	 * across processes, also with one device here; procs is NULL. */
	bool group;
};

/* Floats of slots a rank needs for sums of up to n floats (0 when the
 * backend's own collective does the work). */
size_t tr_exact_slot_floats(const tr_backend_t *be, int ndev, int nproc, int shards, size_t n);

/* tr_shard_set.sum: parts are this rank's nparts shards from ctx->first
 * on; out receives the sum over every rank's shards on every rank.
 * Returns 0 or a negative errno-style code (-ECANCELED after an abort). */
int tr_exact_sum(void *ctx, const float *const *parts, int nparts, float *out, size_t n);

/* Overlap, one device per process (x->procs set, x->ov.lo_of filled):
 * begin before the backward passes, with the parts tr_exact_sum would
 * get (their contents may still be computing) and `add` as in
 * tr_exact_overlap; tr_exact_overlap_layer is the last shard's
 * layer_done; end sends what is left, waits and folds into out as
 * tr_exact_sum does.  Every process calls the same sequence, whether or
 * not it has rows this step. */
void tr_exact_overlap_begin(struct tr_exact_ctx *x, const float *const *parts, int nparts, const float *add, size_t n);
int tr_exact_overlap_layer(void *ctx, int layer);
int tr_exact_overlap_end(struct tr_exact_ctx *x, float *out);

#endif
