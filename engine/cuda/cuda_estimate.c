/* How much device memory one device of a job needs (engine/cuda/cuda.h).
 *
 * Plain C and host arithmetic only, so that a daemon can size jobs (or a
 * test can check the arithmetic) in any build.  The replica part mirrors
 * tr_replica_init allocation by allocation, plus the second input and
 * label buffers tr_trainer_create allocates for upload-ahead: keep them in
 * step.
 */
#include <stddef.h>
#include <stdint.h>

#include "engine/cuda/cuda.h"
#include "engine/model/model.h"

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

	total += 2 * block(m->n_params); /* params, grads */
	if (opt_state_buffers >= 1)
		total += block(m->n_params);
	if (opt_state_buffers >= 2)
		total += block(m->n_params);
	/* Two of each: the replica's input and label buffers, and the pair
	 * the trainer adds for upload-ahead (the next step's share arrives
	 * there while this step computes). */
	total += 2 * block(rows * (size_t)label_dim);
	total += 2 * block(rows * (size_t)m->inputs);
	for (int i = 0; i < m->n_layers; i++) {
		const struct tr_layer *l = &m->layers[i];
		total += block(rows * (size_t)l->out);
		if (l->type == TR_LAYER_DROPOUT)
			total += block(rows * (size_t)l->out);
		if (l->type == TR_LAYER_LAYERNORM)
			total += 2 * block(rows);
	}
	total += 2 * block(rows * (size_t)m->max_width); /* dbuf[0], dbuf[1] */

	total += BACKEND_SCRATCH + CUBLAS_WORKSPACE + TR_CUDA_CONTEXT_BYTES;
	if (ndev > 1)
		total += NCCL_ALLOWANCE;
	return total;
}
