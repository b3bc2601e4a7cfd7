/* Exact mode's sum (engine/exact.h, the CPU backend's exact_sum): shard
 * partials spread over 1 to 4 ranks in every way the trainer spreads them
 * give the bits of one serial fold in shard order; the path built from
 * allreduce_sum and add (what backends without exact_sum, such as CUDA,
 * use) gives the same bits; and a batchnorm2d job trained through that
 * path on 3 devices ends with the weights of the CPU collective on 1.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/data/plan.h"
#include "engine/exact.h"
#include "engine/rng.h"
#include "engine/trainer.h"

#define S 7
#define N 3001

static float parts[S][N];
static float ref[N];

/* Values over many magnitudes, so that another order of additions gives
 * other bits; element 5 is -0.0 in one part and +0.0 in the others (the
 * sum from +0.0 is +0.0 on any split). */
static void fill(void)
{
	uint64_t st = 0x1234;
	for (int k = 0; k < S; k++) {
		for (int i = 0; i < N; i++) {
			st = tr_mix64(st);
			double u = (double)(st >> 11) * 0x1p-53 - 0.5;
			parts[k][i] = (float)ldexp(u, (int)(st % 40) - 20);
		}
		parts[k][5] = k == 2 ? -0.0f : 0.0f;
	}
	for (int i = 0; i < N; i++) {
		float acc = 0.0f;
		for (int k = 0; k < S; k++)
			acc += parts[k][i];
		ref[i] = acc;
	}
}

struct rank_arg {
	tr_backend_t *be;
	tr_comm_t *comm;
	int rank, ndev;
	float *out;
	float *slots; /* the generic path's */
	int rc;
};

static void *rank_main(void *p)
{
	struct rank_arg *a = p;
	int k0, m;
	tr_plan_share(S, a->ndev, a->rank, &k0, &m);
	const float *mine[S];
	for (int k = 0; k < m; k++)
		mine[k] = parts[k0 + k];
	struct tr_exact_ctx x = {.be = a->be,
				 .comm = a->comm,
				 .rank = a->rank,
				 .dev = a->rank,
				 .ndev = a->ndev,
				 .shards = S,
				 .first = k0,
				 .slots = a->slots,
				 .slot_floats = N};
	a->rc = tr_exact_sum(&x, mine, m, a->out, N);
	return NULL;
}

/* Runs the sum on ndev ranks of be; generic: without the backend's
 * exact_sum (its table is the backend's own, so this backend alone). */
static void sum_on(int ndev, bool generic)
{
	tr_backend_t *be = tr_cpu_backend_create(ndev, 1);
	cr_assert(be);
	if (generic)
		((tr_backend_i *)be->i)->exact_sum = NULL;
	tr_comm_t *comm = be->i->comm_create(be, ndev, NULL);
	cr_assert(comm);
	struct rank_arg args[4];
	pthread_t th[4];
	for (int r = 0; r < ndev; r++) {
		args[r] = (struct rank_arg){.be = be, .comm = comm, .rank = r, .ndev = ndev};
		args[r].out = calloc(N, sizeof(float));
		args[r].slots = calloc((size_t)S * N, sizeof(float));
		cr_assert(pthread_create(&th[r], NULL, rank_main, &args[r]) == 0);
	}
	for (int r = 0; r < ndev; r++) {
		pthread_join(th[r], NULL);
		cr_assert_eq(args[r].rc, 0, "rank %d of %d: %s", r, ndev, be->i->last_error(be));
		cr_assert_eq(memcmp(args[r].out, ref, sizeof ref), 0, "%s path, %d ranks: rank %d differs",
			     generic ? "generic" : "exact_sum", ndev, r);
		free(args[r].out);
		free(args[r].slots);
	}
	be->i->comm_destroy(comm);
	tr_backend_destroy(be);
}

Test(exact, order_matters_for_these_values)
{
	fill();
	int differ = 0;
	for (int i = 0; i < N; i++) {
		float back = 0.0f;
		for (int k = S - 1; k >= 0; k--)
			back += parts[k][i];
		differ += back != ref[i];
	}
	cr_assert_gt(differ, 100, "the data cannot tell one order of additions from another");
	cr_assert(!signbit(ref[5]), "the sum of -0.0 and +0.0 parts must be +0.0");
}

Test(exact, cpu_collective_same_bits_on_1_to_4_ranks)
{
	fill();
	for (int d = 1; d <= 4; d++)
		sum_on(d, false);
}

Test(exact, generic_path_same_bits_on_1_to_4_ranks)
{
	fill();
	for (int d = 1; d <= 4; d++)
		sum_on(d, true);
}

/* A batchnorm2d net (one inside a residual block) with dropout and a
 * short last batch: 3 devices through the generic sum end with the bits
 * of 1 device through the CPU collective. */
static const char *BN_JOB =
	"{\"seed\": 9, \"exact\": true, \"model\": {\"inputs\": [2, 5, 5], \"layers\": ["
	"{\"type\": \"conv2d\", \"filters\": 3, \"kernel\": 3, \"padding\": 1}, {\"type\": \"batchnorm2d\"},"
	" {\"type\": \"relu\"}, {\"type\": \"residual\", \"layers\": [{\"type\": \"conv2d\", \"filters\": 3,"
	" \"kernel\": 3, \"padding\": 1}, {\"type\": \"batchnorm2d\"}]}, {\"type\": \"flatten\"},"
	" {\"type\": \"dropout\", \"rate\": 0.2}, {\"type\": \"dense\", \"units\": 3}]},"
	" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 35, \"shape\": [2, 5, 5], \"classes\": 3}},"
	" \"batch_size\": 8, \"epochs\": 2, \"optimizer\": {\"type\": \"adamw\", \"lr\": 0.01}}";

/* Dense layers only (two inside a residual block), a short last batch:
 * the device holding the first shards folds their gradients in the gemm
 * (model.h, grad_sum). */
static const char *DENSE_JOB =
	"{\"seed\": 4, \"exact\": true, \"model\": {\"inputs\": 6, \"layers\": ["
	"{\"type\": \"dense\", \"units\": 16}, {\"type\": \"relu\"}, {\"type\": \"residual\", \"layers\": ["
	"{\"type\": \"dense\", \"units\": 16}, {\"type\": \"gelu\"}, {\"type\": \"dense\", \"units\": 16}]},"
	" {\"type\": \"dense\", \"units\": 3}]},"
	" \"data\": {\"train\": {\"format\": \"synthetic\", \"task\": \"classification\", \"samples\": 150,"
	" \"features\": 6, \"classes\": 3}},"
	" \"batch_size\": 64, \"epochs\": 2, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.05, \"momentum\": 0.9}}";

/* no_fold: without the backend's gemm_accumulate_max_k, so every shard
 * goes through a gradient buffer of its own and `add`. */
static float *train_job(const char *job, int devices, bool generic, bool no_fold, size_t *n)
{
	struct tr_spec spec;
	struct tr_error err;
	cr_assert_eq(tr_spec_parse_text(job, &spec, &err), 0, "%s", err.message);
	tr_backend_t *be = tr_cpu_backend_create(devices, 1);
	if (generic)
		((tr_backend_i *)be->i)->exact_sum = NULL;
	if (no_fold)
		((tr_backend_i *)be->i)->gemm_accumulate_max_k = NULL;
	struct tr_trainer_options opt = {.spec = &spec, .backend = be, .devices = devices};
	tr_trainer_t *t;
	cr_assert_eq(tr_trainer_create(&opt, &t, &err), 0, "%s", err.message);
	cr_assert_eq(tr_trainer_run(t, &err), 0, "%s", err.message);
	*n = tr_trainer_model(t)->n_params;
	float *w = malloc(*n * sizeof(float));
	cr_assert_eq(tr_trainer_copy_params(t, 0, w), 0);
	tr_trainer_destroy(t);
	tr_backend_destroy(be);
	tr_spec_finish(&spec);
	return w;
}

static float *train(int devices, bool generic, size_t *n)
{
	return train_job(BN_JOB, devices, generic, false, n);
}

Test(exact, dense_fold_in_gemm_same_bits_as_shard_buffers)
{
	size_t n1, n2, n3;
	float *fold = train_job(DENSE_JOB, 1, false, false, &n1), *buffers = train_job(DENSE_JOB, 1, false, true, &n2);
	float *three = train_job(DENSE_JOB, 3, true, false, &n3);
	cr_assert(n1 == n2 && n1 == n3);
	cr_assert_eq(memcmp(fold, buffers, n1 * sizeof(float)), 0, "the fold in gemm differs from shard buffers");
	cr_assert_eq(memcmp(fold, three, n1 * sizeof(float)), 0, "3 devices (generic sum) differ from 1");
	free(fold);
	free(buffers);
	free(three);
}

Test(exact, batchnorm_job_through_generic_path)
{
	size_t n1, n3;
	float *one = train(1, false, &n1), *three = train(3, true, &n3);
	cr_assert_eq(n1, n3);
	cr_assert_eq(memcmp(one, three, n1 * sizeof(float)), 0, "3 devices (generic sum) differ from 1");
	free(one);
	free(three);
}
