/* How much device memory one device of a job needs (engine/cuda/cuda.h).
 *
 * Plain C and host arithmetic only, so that a daemon can size jobs (or a
 * test can check the arithmetic) in any build.  The replica part is the
 * model's own list of its allocations (tr_replica_buffer_sizes, which
 * tr_replica_init allocates from), plus the second input and label buffers
 * tr_trainer_create allocates for upload-ahead and its step results.
 */
#include <stddef.h>
#include <stdint.h>

#include "engine/cuda/cuda.h"
#include "engine/model/model.h"
#include "engine/trainer.h"

/* cudaMalloc hands out 256-byte aligned blocks carved from larger pages;
 * rounding every request to 512 bytes covers the padding. */
#define GRANULE ((size_t)512)
/* cuBLAS's default workspace on Hopper is 32 MiB per handle and stream;
 * earlier GPUs use less. */
#define CUBLAS_WORKSPACE ((size_t)32 << 20)
/* Reduction partials and the result block (cuda_internal.h), rounded. */
#define BACKEND_SCRATCH ((size_t)64 << 10)
/* NCCL's per-peer channel buffers (NCCL_BUFFSIZE 4 MiB, several channels
 * and protocols) plus NVLS buffers on NVSwitch systems: an allowance. */
#define NCCL_ALLOWANCE ((size_t)768 << 20)

/* One dev_alloc of model.c: floats, at least 1, rounded to the granule. */
static size_t block(size_t floats)
{
	size_t bytes = (floats ? floats : 1) * sizeof(float);
	return (bytes + GRANULE - 1) / GRANULE * GRANULE;
}

size_t tr_cuda_estimate_bytes(const struct tr_model *m, int max_rows, int label_dim, int opt_state_buffers, int ndev)
{
	size_t rows = (size_t)(max_rows < 1 ? 1 : max_rows);
	size_t total = 0;

	/* Every buffer tr_replica_init allocates, from the model's own list:
	 * per node its output, what it saves for backward (saved[0] and
	 * saved[1]: dropout's mask, layernorm's and groupnorm's statistics)
	 * and its kept memory (batchnorm2d's batch statistics and backward
	 * sums), at most four, plus the replica's own (parameters, gradients,
	 * optimizer state, inputs, labels, gradient buffers, workspace).  The
	 * array holds the longest list, so no buffer goes uncounted. */
	size_t sizes[TR_MODEL_MAX_NODES * 4 + 16];
	int n = tr_replica_buffer_sizes(m, max_rows, label_dim, opt_state_buffers, sizes,
					(int)(sizeof sizes / sizeof sizes[0]));
	for (int i = 0; i < n && i < (int)(sizeof sizes / sizeof sizes[0]); i++)
		total += block(sizes[i]);
	/* The pair the trainer adds for upload-ahead (the next step's share
	 * arrives there while this step computes). */
	total += block(rows * (size_t)label_dim);
	total += block(rows * (size_t)m->inputs);
	/* The step's results, kept on the device until its sync. */
	total += block(2 * (size_t)TR_TRAINER_RESULT_DOUBLES);

	total += BACKEND_SCRATCH + CUBLAS_WORKSPACE + TR_CUDA_CONTEXT_BYTES;
	if (ndev > 1)
		total += NCCL_ALLOWANCE;
	return total;
}
