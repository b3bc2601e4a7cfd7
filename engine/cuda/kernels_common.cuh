/* What every kernel file of the CUDA backend shares (CUDA C++ only).
 *
 * The kernels are grouped by op family, one file each (as llm.c keeps one
 * op per file): kernels_dense.cu (gemm, bias, column sums),
 * kernels_elementwise.cu (activations, dropout, mul, add, scale),
 * kernels_reduce.cu (the two-pass reductions, sumsq, per-range sums of
 * squares, clipping on the device, the start-up probe),
 * kernels_norm.cu (layernorm), kernels_norm2d.cu (batchnorm2d's
 * per-channel sums and groupnorm), kernels_loss.cu (softmax cross-entropy,
 * mse), kernels_optim.cu (sgd, adam), kernels_conv.cu (convolution as
 * im2col + cuBLAS, max and average pooling).  Each file has its kernels in one
 * section, its host launchers below (they take a stream, assert their
 * preconditions and check the launch), then the backend functions, which
 * validate arguments like the CPU backend and record a reason before
 * returning -EINVAL, and last the function that fills its part of the
 * table.
 *
 * Each kernel implements the formula of its CPU counterpart in
 * engine/cpu/cpu_kernels.c, in the same float operation order; the module
 * is compiled with --fmad=false so that nvcc does not contract a * b + c
 * into one rounding where the CPU rounds twice.  The elementwise kernels
 * and the optimizer updates therefore agree with the CPU bit for bit,
 * except where a libm function differs (erff, expf, tanhf: CUDA's are
 * within 2 ulp, glibc's within 1).  Dropout reimplements engine/rng.h on
 * the device and gives exactly the CPU's mask.
 *
 * Reductions accumulate in double where the CPU does (losses, layernorm,
 * batchnorm2d and groupnorm statistics, sumsq) and in float where it does (col_sum, layernorm's
 * parameter gradients), but in a tree order instead of a left-to-right
 * one.  Every grid is a function of the problem size alone and partial
 * results are combined in index order, so results are deterministic run
 * to run and identical on every replica.  Row-wise kernels give each row
 * one warp: rows are at most a few thousand wide here, and a warp needs no
 * block-level synchronisation.
 *
 * Without relocatable device code a kernel is visible in its own file
 * only, so what several families need on the device is inline here, and
 * the second pass of a reduction is reached through a host function
 * (tr_cuda_finish_sums).
 */
#ifndef TR_CUDA_KERNELS_COMMON_CUH
#define TR_CUDA_KERNELS_COMMON_CUH

#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "engine/cuda/cuda_internal.h"

#define BLOCK 256u
#define WARPS_PER_BLOCK (BLOCK / 32u)
#define MAX_GRID 32768u /* elementwise kernels stride beyond this */
#define COL_TILE 32u    /* columns per block in the column reductions */
#define COL_ROWS 8u     /* row stripes per block in the column reductions */
#define FULL_MASK 0xffffffffu

/* ==== device helpers ===================================================== */

/* engine/rng.h on the device: SplitMix64's finaliser, bit for bit. */
__device__ __forceinline__ uint64_t d_mix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ULL;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

__device__ __forceinline__ uint64_t d_rng_u64(uint64_t key, uint64_t counter)
{
	return d_mix64(key ^ d_mix64(counter));
}

/* 24 random bits times 2^-24: exact in float, as tr_rng_uniform. */
__device__ __forceinline__ float d_rng_uniform(uint64_t key, uint64_t counter)
{
	return (float)(d_rng_u64(key, counter) >> 40) * 5.9604644775390625e-08f;
}

/* Butterfly sum: a + b == b + a, so every lane ends with the same bits. */
__device__ __forceinline__ double warp_sum(double v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(FULL_MASK, v, o);
	return v;
}

/* Sums two quantities over a 1-D block; the totals are valid in thread 0.
 * Every thread of the block must call it. */
static __device__ __forceinline__ void block_sum2(double *a, double *b)
{
	__shared__ double sa[32], sb[32];
	unsigned lane = threadIdx.x & 31u, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
	double x = warp_sum(*a), y = warp_sum(*b);

	if (lane == 0) {
		sa[w] = x;
		sb[w] = y;
	}
	__syncthreads();
	if (w == 0) {
		x = warp_sum(lane < nw ? sa[lane] : 0.0);
		y = warp_sum(lane < nw ? sb[lane] : 0.0);
	}
	*a = x;
	*b = y;
}

#define GRID_STRIDE(i, n) \
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)
/* The same with an index of type I: kernels whose index math divides
 * (row = i / cols) are instantiated for uint32_t, used when index32_ok,
 * since 64-bit / and % cost several times the 32-bit ones. */
#define GRID_STRIDE_T(I, i, n) \
	for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (I)gridDim.x * blockDim.x)

/* ==== host helpers ======================================================= */

static inline unsigned grid_for(size_t n)
{
	size_t g = (n + BLOCK - 1) / BLOCK;
	return g > MAX_GRID ? MAX_GRID : (unsigned)g;
}

/* 32-bit indices are safe when n plus one grid-stride step (at most
 * MAX_GRID x BLOCK threads) stays below 2^32: i += step cannot wrap. */
static inline bool index32_ok(size_t n)
{
	return n <= (size_t)UINT32_MAX - (size_t)MAX_GRID * BLOCK;
}

/* Blocks for a warp-per-row reduction over `rows`: at most one slot each. */
static inline unsigned row_grid(int rows)
{
	size_t g = ((size_t)rows + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK;
	return g > TR_CUDA_RED_SLOTS ? TR_CUDA_RED_SLOTS : (unsigned)g;
}

static inline cudaStream_t stream_of(tr_backend_t *be, int dev)
{
	return cuda_be(be)->dev[dev].stream;
}

#define ENSURE(cond, ...)                                                   \
	do {                                                                \
		if (!(cond))                                                \
			return tr_cuda_set_error(be, -EINVAL, __VA_ARGS__); \
	} while (0)

#define ENSURE_DEV(what)                              \
	do {                                          \
		int rc_ = tr_cuda_use(be, dev, what); \
		if (rc_)                              \
			return rc_;                   \
	} while (0)

/* kernels_reduce.cu: the second pass of every reduction.  nparts blocks
 * of the first pass left partials of two quantities in d->partials (at i
 * and TR_CUDA_RED_SLOTS + i); the first nout (1 or 2) sums are written
 * to, or with `add` added to, dst[0..nout): device memory, never read on
 * the host here. */
int tr_cuda_finish_sums(tr_backend_t *be, cudaStream_t s, struct cuda_dev *d, unsigned nparts, double *dst, int nout,
			bool add);

#endif
