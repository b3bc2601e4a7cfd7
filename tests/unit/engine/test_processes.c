/* A job of several processes (engine/comm.h, docs/design.md, "Processes
 * and the communicator") without MPI: each "process" is a thread with a
 * CPU backend and a trainer of its own, and a communicator whose
 * collectives exchange through shared memory stands in for the mpi
 * engine.  What crosses processes is then the trainer's alone: the exact
 * sum's gathered slots, batchnorm2d's statistics, the step's losses, the
 * rows each process loads, the agreed stop.  2x1, 2x2 and 3x1 processes x
 * devices end with the weights of 1x1; every process ends with the same
 * weights; a stop asked of one process stops all after the same step; and
 * several processes without exact mode are refused naming the field.
 * GPU ranks (engine/comm_group.h) are rehearsed on a CPU backend dressed
 * as one with a group communicator: the id made once and broadcast, each
 * process's ranks in the group, and the bits of 1x1 again.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/comm.h"
#include "engine/comm_group.h"
#include "engine/trainer.h"

#define MAXP 4

/* ---- a communicator of threads ---- */

struct group {
	int size;
	pthread_barrier_t bar;
	void *bufs[MAXP];
};

/* A bucket gather_start has started: exchanged only in gather_wait, as
 * an engine that makes no progress before it would. */
struct bucket {
	float *buf;
	size_t n, off, len;
	const int *first, *count;
};

struct fake {
	struct tr_pcomm base;
	struct group *g;
	int rank;
	struct bucket pending[TR_PCOMM_MAX_PENDING];
	int n_pending;
	int started; /* buckets over the whole run */
};

static struct fake *of(tr_pcomm_t *c)
{
	return (struct fake *)c;
}

static int f_rank(tr_pcomm_t *c)
{
	return of(c)->rank;
}

static int f_size(tr_pcomm_t *c)
{
	return of(c)->g->size;
}

static void publish(struct fake *f, void *buf)
{
	f->g->bufs[f->rank] = buf;
	pthread_barrier_wait(&f->g->bar);
}

static int f_gather(tr_pcomm_t *c, float *buf, size_t n, const int *first, const int *count)
{
	struct fake *f = of(c);
	publish(f, buf);
	for (int q = 0; q < f->g->size; q++)
		if (q != f->rank)
			memcpy(buf + (size_t)first[q] * n, (float *)f->g->bufs[q] + (size_t)first[q] * n,
			       (size_t)count[q] * n * sizeof(float));
	pthread_barrier_wait(&f->g->bar);
	return 0;
}

static int f_gather_start(tr_pcomm_t *c, float *buf, size_t n, size_t off, size_t len, const int *first,
			  const int *count)
{
	struct fake *f = of(c);
	cr_assert_lt(f->n_pending, TR_PCOMM_MAX_PENDING);
	cr_assert_leq(off + len, n);
	f->pending[f->n_pending++] = (struct bucket){buf, n, off, len, first, count};
	f->started++;
	return 0;
}

static int f_gather_test(tr_pcomm_t *c)
{
	(void)c;
	return 0;
}

/* Every process waits for the same buckets in the same order, or the
 * barriers pair the wrong ones (and the weights differ, or it hangs). */
static int f_gather_wait(tr_pcomm_t *c)
{
	struct fake *f = of(c);
	for (int b = 0; b < f->n_pending; b++) {
		struct bucket *k = &f->pending[b];
		publish(f, k->buf);
		for (int q = 0; q < f->g->size; q++)
			for (int s = k->first[q]; s < k->first[q] + k->count[q] && q != f->rank; s++)
				memcpy(k->buf + (size_t)s * k->n + k->off,
				       (float *)f->g->bufs[q] + (size_t)s * k->n + k->off, k->len * sizeof(float));
		pthread_barrier_wait(&f->g->bar);
	}
	f->n_pending = 0;
	return 0;
}

static int f_sum(tr_pcomm_t *c, double *buf, size_t n)
{
	struct fake *f = of(c);
	double *acc = calloc(n, sizeof *acc);
	cr_assert(acc);
	publish(f, buf);
	for (int q = 0; q < f->g->size; q++)
		for (size_t i = 0; i < n; i++)
			acc[i] += ((double *)f->g->bufs[q])[i];
	pthread_barrier_wait(&f->g->bar); /* everyone has read every buf */
	memcpy(buf, acc, n * sizeof *acc);
	free(acc);
	return 0;
}

static int f_bcast(tr_pcomm_t *c, void *buf, size_t bytes, int root)
{
	struct fake *f = of(c);
	publish(f, buf);
	if (f->rank != root)
		memcpy(buf, f->g->bufs[root], bytes);
	pthread_barrier_wait(&f->g->bar);
	return 0;
}

static int f_barrier(tr_pcomm_t *c)
{
	pthread_barrier_wait(&of(c)->g->bar);
	return 0;
}

static void f_abort(tr_pcomm_t *c, int code)
{
	(void)c;
	cr_assert_fail("a process aborted the group (%d)", code);
}

static void f_finish(tr_pcomm_t *c)
{
	(void)c;
}

static const char *f_error(tr_pcomm_t *c)
{
	(void)c;
	return "";
}

static const tr_pcomm_i fake_i = {
	.name = "threads",
	.engine = TR_PCOMM_MPI,
	.rank = f_rank,
	.size = f_size,
	.gather_shards = f_gather,
	.sum_f64 = f_sum,
	.bcast = f_bcast,
	.barrier = f_barrier,
	.abort = f_abort,
	.finish = f_finish,
	.last_error = f_error,
};

/* The same with the overlapped gather's buckets. */
static const tr_pcomm_i fake_buckets_i = {
	.name = "threads, buckets",
	.engine = TR_PCOMM_MPI,
	.rank = f_rank,
	.size = f_size,
	.gather_shards = f_gather,
	.sum_f64 = f_sum,
	.bcast = f_bcast,
	.barrier = f_barrier,
	.abort = f_abort,
	.finish = f_finish,
	.last_error = f_error,
	.gather_start = f_gather_start,
	.gather_test = f_gather_test,
	.gather_wait = f_gather_wait,
};

/* ---- processes of trainers ---- */

/* A batchnorm2d net (statistics across processes) with dropout,
 * validation and a short last batch (35 rows: 8, 8, 8, 8, 3). */
static const char *JOB =
	"{\"seed\": 9, \"exact\": {\"shards\": 6}, \"cpu_conv\": \"im2col\", \"model\": {\"inputs\": [2, 5, 5],"
	" \"layers\": [{\"type\": \"conv2d\", \"filters\": 3, \"kernel\": 3, \"padding\": 1},"
	" {\"type\": \"batchnorm2d\"}, {\"type\": \"relu\"}, {\"type\": \"flatten\"},"
	" {\"type\": \"dropout\", \"rate\": 0.2}, {\"type\": \"dense\", \"units\": 3}]},"
	" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 44, \"shape\": [2, 5, 5], \"classes\": 3},"
	" \"validation_split\": 0.2}, \"batch_size\": 8, \"epochs\": 2, \"optimizer\": {\"type\": \"adamw\", \"lr\": 0.01}}";

struct proc {
	struct fake comm;
	int devices;
	bool stop_first; /* asked to stop before its first step */
	const char *job;
	float *w;
	size_t n;
	struct tr_summary sum;
	int create_rc;
	char err[512];
	char msg[1024]; /* the error's message */
};

/* When set (before run_group), every process's CPU backend takes this
 * table: a backend dressed as another (the GPU ranks' tests below). */
static const tr_backend_i *backend_table;

static void *proc_main(void *arg)
{
	struct proc *p = arg;
	struct tr_spec spec;
	struct tr_error err;
	cr_assert_eq(tr_spec_parse_text(p->job, &spec, &err), 0, "%s", err.message);
	tr_backend_t *be = tr_cpu_backend_create(p->devices, 1);
	cr_assert(be);
	if (backend_table)
		be->i = backend_table;
	struct tr_trainer_options opt = {.spec = &spec,
					 .backend = be,
					 .devices = p->devices,
					 .pcomm = p->comm.g->size > 1 ? &p->comm.base : NULL};
	tr_trainer_t *t;
	p->create_rc = tr_trainer_create(&opt, &t, &err);
	if (p->create_rc == 0) {
		if (p->stop_first)
			tr_trainer_stop(t);
		cr_assert_eq(tr_trainer_run(t, &err), 0, "%s", err.message);
		tr_trainer_summary(t, &p->sum);
		p->n = tr_trainer_model(t)->n_params;
		p->w = malloc(p->n * sizeof(float));
		cr_assert_eq(tr_trainer_copy_params(t, 0, p->w), 0);
		tr_trainer_destroy(t);
	} else {
		snprintf(p->err, sizeof p->err, "%s", err.pointer);
		snprintf(p->msg, sizeof p->msg, "%s", err.message);
	}
	tr_backend_destroy(be);
	tr_spec_finish(&spec);
	return NULL;
}

/* Runs the job as nproc processes of `devices` devices; p[] holds each
 * one's outcome. */
static void run_group_on(const tr_pcomm_i *ci, const char *job, int nproc, int devices, int stop_rank, struct proc *p)
{
	struct group g = {.size = nproc};
	pthread_t th[MAXP];
	pthread_barrier_init(&g.bar, NULL, (unsigned)nproc);
	for (int r = 0; r < nproc; r++) {
		p[r] = (struct proc){.comm = {.base = {.i = ci}, .g = &g, .rank = r},
				     .devices = devices,
				     .stop_first = r == stop_rank,
				     .job = job};
		cr_assert_eq(pthread_create(&th[r], NULL, proc_main, &p[r]), 0);
	}
	for (int r = 0; r < nproc; r++)
		pthread_join(th[r], NULL);
	pthread_barrier_destroy(&g.bar);
}

static void run_group(const char *job, int nproc, int devices, int stop_rank, struct proc *p)
{
	run_group_on(&fake_i, job, nproc, devices, stop_rank, p);
}

static void free_group(struct proc *p, int nproc)
{
	for (int r = 0; r < nproc; r++)
		free(p[r].w);
}

Test(processes, same_weights_as_one_process_on_one_device, .timeout = 120)
{
	struct proc one[1], p[MAXP];
	run_group(JOB, 1, 1, -1, one);
	cr_assert_eq(one[0].create_rc, 0);
	static const int shapes[][2] = {{2, 1}, {2, 2}, {3, 1}, {4, 1}};
	for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
		int P = shapes[i][0], D = shapes[i][1];
		run_group(JOB, P, D, -1, p);
		for (int r = 0; r < P; r++) {
			cr_assert_eq(p[r].create_rc, 0, "%dx%d: process %d: %s", P, D, r, p[r].err);
			cr_assert_eq(p[r].n, one[0].n);
			cr_assert_eq(memcmp(p[r].w, one[0].w, one[0].n * sizeof(float)), 0,
				     "%dx%d: process %d's weights differ from 1x1's", P, D, r);
			cr_assert_eq(p[r].sum.final_loss, one[0].sum.final_loss, "%dx%d: process %d's loss", P, D, r);
			cr_assert_eq(p[r].sum.val_loss, one[0].sum.val_loss, "%dx%d: process %d's val_loss", P, D, r);
		}
		free_group(p, P);
	}
	free_group(one, 1);
}

Test(processes, a_stop_asked_of_one_process_stops_all_after_the_same_step, .timeout = 120)
{
	struct proc p[2];
	run_group(JOB, 2, 1, 1, p);
	for (int r = 0; r < 2; r++) {
		cr_assert_eq(p[r].create_rc, 0, "%s", p[r].err);
		cr_assert(p[r].sum.stopped, "process %d did not stop", r);
		cr_assert_eq(p[r].sum.steps, 1, "process %d stopped after step %lld", r, (long long)p[r].sum.steps);
	}
	cr_assert_eq(memcmp(p[0].w, p[1].w, p[0].n * sizeof(float)), 0);
	free_group(p, 2);
}

Test(processes, several_without_exact_mode_are_refused_naming_the_field, .timeout = 60)
{
	/* the spec parser refuses "processes" > 1 without exact mode; a caller
	 * that passes a communicator of several is refused by the trainer */
	const char *plain = "{\"seed\": 1, \"model\": {\"layers\": [{\"type\": \"dense\", \"units\": 3}]},"
			    " \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 20, \"features\": 4,"
			    " \"classes\": 3}}, \"batch_size\": 4, \"epochs\": 1, \"optimizer\": {\"type\": \"sgd\","
			    " \"lr\": 0.1}}";
	struct proc p[2];
	run_group(plain, 2, 1, -1, p);
	for (int r = 0; r < 2; r++) {
		cr_assert_eq(p[r].create_rc, -EINVAL);
		cr_assert_str_eq(p[r].err, "/exact");
	}
}

/* Overlap (engine/exact.h): an MLP with dropout and a short last batch
 * (35 samples: steps of 32 and 3 rows; the 3 fill shards 0-2 only, so
 * of 4 processes the last two have no rows then) whose gather goes
 * in buckets, one per layer with parameters, started during the backward
 * pass and exchanged only when waited for, ends with 1x1's weights on
 * 2x1, 3x1 and 4x1, with the expected buckets; "overlap": false gathers
 * whole, without buckets, to the same weights.  With a layernorm, the
 * first process adds its last shard into its running sum bucket by bucket
 * (its gemm cannot fold a layernorm); without, its dense layers fold. */
static const char *MLP =
	"{\"seed\": 4, \"exact\": {\"shards\": 6%s}, \"model\": {\"inputs\": 5, \"layers\": ["
	" {\"type\": \"dense\", \"units\": 7}, {\"type\": \"relu\"}, {\"type\": \"dropout\", \"rate\": 0.2},"
	" {\"type\": \"dense\", \"units\": 6}, {\"type\": \"tanh\"}%s, {\"type\": \"dense\", \"units\": 3}]},"
	" \"data\": {\"train\": {\"format\": \"synthetic\", \"samples\": 35, \"features\": 5, \"classes\": 3}},"
	" \"batch_size\": 32, \"epochs\": 3, \"optimizer\": {\"type\": \"adamw\", \"lr\": 0.01}}";

Test(processes, overlapped_buckets_give_the_weights_of_one_process, .timeout = 120)
{
	static const char *const extra[] = {"", ", {\"type\": \"layernorm\"}"};
	for (int e = 0; e < 2; e++) {
		char on[1024], off[1024];
		snprintf(on, sizeof on, MLP, "", extra[e]);
		snprintf(off, sizeof off, MLP, ", \"overlap\": false", extra[e]);
		struct proc one[1], p[MAXP];
		run_group(on, 1, 1, -1, one);
		cr_assert_eq(one[0].create_rc, 0, "%s", one[0].err);
		/* one bucket per layer with parameters */
		const int steps = (int)one[0].sum.steps, buckets = e ? 4 : 3;
		cr_assert_eq(steps, 6);
		for (int P = 2; P <= 4; P++) {
			for (int o = 0; o < 2; o++) {
				run_group_on(&fake_buckets_i, o ? off : on, P, 1, -1, p);
				for (int r = 0; r < P; r++) {
					cr_assert_eq(p[r].create_rc, 0, "%dx1: process %d: %s", P, r, p[r].err);
					cr_assert_eq(memcmp(p[r].w, one[0].w, one[0].n * sizeof(float)), 0,
						     "%s%dx1, overlap %s: process %d's weights differ from 1x1's",
						     extra[e], P, o ? "off" : "on", r);
					cr_assert_eq(p[r].sum.final_loss, one[0].sum.final_loss);
					cr_assert_eq(p[r].comm.started, o ? 0 : steps * buckets,
						     "%dx1, overlap %s: process %d started %d buckets", P,
						     o ? "off" : "on", r, p[r].comm.started);
					cr_assert(p[r].sum.comm_ms >= p[r].sum.comm_wait_ms &&
						  p[r].sum.comm_wait_ms >= 0);
				}
				free_group(p, P);
			}
		}
		free_group(one, 1);
	}
}

/* Which environments are ranks of a launcher: mpirun's, srun's (its step
 * task count), and not a batch script's (SLURM_NTASKS and SLURM_PROCID
 * without a step) nor a group of one. */
Test(processes, launcher_environments)
{
	static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "SLURM_PROCID", "SLURM_NTASKS",
					   "SLURM_STEP_NUM_TASKS"};
	static const struct {
		const char *set[5]; /* values of vars, NULL = unset */
		bool launched;
		int size;
	} cases[] = {
		{{NULL, NULL, NULL, NULL, NULL}, false, 1},
		{{"3", NULL, NULL, NULL, NULL}, true, 3},
		{{"1", NULL, NULL, NULL, NULL}, false, 1},
		{{NULL, NULL, "0", "4", "4"}, true, 4},
		{{NULL, "1", NULL, NULL, "2"}, true, 2},
		{{NULL, NULL, "0", "4", NULL}, false, 1}, /* a batch script */
		{{NULL, NULL, "0", "1", "1"}, false, 1},
		{{"x", NULL, NULL, NULL, NULL}, false, 1},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		for (int v = 0; v < 5; v++) {
			if (cases[i].set[v])
				setenv(vars[v], cases[i].set[v], 1);
			else
				unsetenv(vars[v]);
		}
		int size = -1;
		cr_assert_eq(tr_pcomm_launched(&size), cases[i].launched, "case %zu", i);
		cr_assert_eq(size, cases[i].size, "case %zu", i);
	}
	for (int v = 0; v < 5; v++)
		unsetenv(vars[v]);
}

/* ---- GPU ranks: a group communicator of threads ---- */

/* The CPU backend dressed as a backend with a group communicator, as the
 * CUDA module's NCCL one: its own exact_sum is hidden, so that the exact
 * sum takes the GPU ranks' way (disjoint slots, the group's allreduce,
 * the fold), and comm_group_* join every process's devices into one
 * sum over threads.  What the processes asked of it is recorded for the
 * tests to check. */
#define MAXR (MAXP * 2)
static const char ID_MAGIC[] = "fake-group";

static struct {
	pthread_mutex_t mu;
	int ids_made, joins, nranks;
	int first_seen[MAXR]; /* joins per first rank */
	bool id_fails;
	bool inited;
	pthread_barrier_t bar;
	float *bufs[MAXR];
} grp = {.mu = PTHREAD_MUTEX_INITIALIZER};

struct tr_comm {
	int first, ndev;
};

static tr_backend_i group_i;
static const tr_backend_i *cpu_i;

static int g_id(tr_backend_t *be, void *id)
{
	(void)be;
	pthread_mutex_lock(&grp.mu);
	grp.ids_made++;
	pthread_mutex_unlock(&grp.mu);
	if (grp.id_fails)
		return -EIO;
	memset(id, 0, TR_COMM_GROUP_ID_BYTES);
	memcpy(id, ID_MAGIC, sizeof ID_MAGIC);
	return 0;
}

static tr_comm_t *g_create(tr_backend_t *be, int ndev, const int *devs, const void *id, int nranks, int first)
{
	(void)be, (void)devs;
	cr_assert_eq(memcmp(id, ID_MAGIC, sizeof ID_MAGIC), 0, "the id process 0 made did not arrive");
	cr_assert(nranks <= MAXR && first >= 0 && first + ndev <= nranks);
	pthread_mutex_lock(&grp.mu);
	if (!grp.inited) {
		grp.nranks = nranks;
		pthread_barrier_init(&grp.bar, NULL, (unsigned)nranks);
		grp.inited = true;
	}
	cr_assert_eq(nranks, grp.nranks, "processes disagree on the group's size");
	grp.joins++;
	grp.first_seen[first]++;
	pthread_mutex_unlock(&grp.mu);
	struct tr_comm *c = calloc(1, sizeof *c);
	cr_assert(c);
	*c = (struct tr_comm){.first = first, .ndev = ndev};
	return c;
}

/* Every rank of every process: the sum in global rank order. */
static int g_allreduce(tr_comm_t *c, int rank, float *buf, size_t n)
{
	cr_assert(rank >= 0 && rank < c->ndev);
	if (n == 0)
		return 0;
	float *acc = calloc(n, sizeof *acc);
	cr_assert(acc);
	grp.bufs[c->first + rank] = buf;
	pthread_barrier_wait(&grp.bar);
	for (int q = 0; q < grp.nranks; q++)
		for (size_t i = 0; i < n; i++)
			acc[i] += grp.bufs[q][i];
	pthread_barrier_wait(&grp.bar); /* everyone has read every buf */
	memcpy(buf, acc, n * sizeof *acc);
	free(acc);
	return 0;
}

static void g_abort(tr_comm_t *c)
{
	(void)c;
	cr_assert_fail("a rank aborted the group");
}

static void g_destroy(tr_comm_t *c)
{
	free(c);
}

static const char *g_error(tr_backend_t *be)
{
	return grp.id_fails ? "no id today" : cpu_i->last_error(be);
}

/* The table of the dressed CPU backend, before any process starts. */
static void dress_cpu_backend(bool host_memory, bool with_group)
{
	tr_backend_t *be = tr_cpu_backend_create(1, 1);
	cr_assert(be);
	cpu_i = be->i;
	group_i = *be->i;
	tr_backend_destroy(be);
	group_i.memory_is_host = host_memory;
	group_i.exact_sum = NULL;
	group_i.last_error = g_error;
	if (with_group) {
		group_i.comm_group_id = g_id;
		group_i.comm_group_create = g_create;
		group_i.allreduce_sum = g_allreduce;
		group_i.comm_abort = g_abort;
		group_i.comm_destroy = g_destroy;
	}
	backend_table = &group_i;
}

static void group_reset(void)
{
	if (grp.inited)
		pthread_barrier_destroy(&grp.bar);
	grp.inited = false;
	grp.ids_made = grp.joins = grp.nranks = 0;
	memset(grp.first_seen, 0, sizeof grp.first_seen);
}

Test(gpu_ranks, the_group_sum_gives_the_weights_of_one_process_on_one_device, .timeout = 120)
{
	struct proc one[1], p[MAXP];
	run_group(JOB, 1, 1, -1, one); /* the CPU backend's own exact_sum */
	cr_assert_eq(one[0].create_rc, 0);
	dress_cpu_backend(true, true);
	/* one process through the group too, as the GPU check's one-rank run */
	setenv("TRAINERD_COMM_GROUP", "1", 1);
	run_group(JOB, 1, 1, -1, p);
	unsetenv("TRAINERD_COMM_GROUP");
	cr_assert_eq(p[0].create_rc, 0, "%s", p[0].msg);
	cr_assert_eq(grp.joins, 1, "TRAINERD_COMM_GROUP=1 did not take the group's way");
	cr_assert_eq(memcmp(p[0].w, one[0].w, one[0].n * sizeof(float)), 0, "1x1 through the group differs");
	free_group(p, 1);
	static const int shapes[][2] = {{2, 1}, {2, 2}, {3, 1}, {4, 1}};
	for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
		int P = shapes[i][0], D = shapes[i][1];
		group_reset();
		run_group(JOB, P, D, -1, p);
		cr_assert_eq(grp.ids_made, 1, "%dx%d: %d ids made: only process 0 makes one", P, D, grp.ids_made);
		cr_assert_eq(grp.joins, P, "%dx%d: %d processes joined the group", P, D, grp.joins);
		cr_assert_eq(grp.nranks, P * D);
		for (int r = 0; r < P; r++) {
			cr_assert_eq(grp.first_seen[r * D], 1, "%dx%d: process %d is not ranks %d..", P, D, r, r * D);
			cr_assert_eq(p[r].create_rc, 0, "%dx%d: process %d: %s", P, D, r, p[r].msg);
			cr_assert_eq(memcmp(p[r].w, one[0].w, one[0].n * sizeof(float)), 0,
				     "%dx%d: process %d's weights differ from 1x1's", P, D, r);
			cr_assert_eq(p[r].sum.final_loss, one[0].sum.final_loss, "%dx%d: process %d's loss", P, D, r);
		}
		free_group(p, P);
	}
	free_group(one, 1);
	group_reset();
}

Test(gpu_ranks, an_id_process_0_cannot_make_fails_every_process_naming_the_cause, .timeout = 60)
{
	struct proc p[2];
	dress_cpu_backend(true, true);
	grp.id_fails = true;
	run_group(JOB, 2, 1, -1, p);
	cr_assert_eq(grp.ids_made, 1);
	cr_assert_eq(grp.joins, 0);
	for (int r = 0; r < 2; r++)
		cr_assert_lt(p[r].create_rc, 0, "process %d", r);
	cr_assert(strstr(p[0].msg, "cannot make the id") && strstr(p[0].msg, "no id today"), "%s", p[0].msg);
	cr_assert(strstr(p[1].msg, "process 0 could not make the id"), "%s", p[1].msg);
}

Test(gpu_ranks, device_memory_without_a_group_communicator_is_refused_naming_the_field, .timeout = 60)
{
	struct proc p[2];
	dress_cpu_backend(false, false);
	run_group(JOB, 2, 1, -1, p);
	for (int r = 0; r < 2; r++) {
		cr_assert_eq(p[r].create_rc, -EINVAL);
		cr_assert_str_eq(p[r].err, "/processes");
		cr_assert(strstr(p[r].msg, "NCCL"), "%s", p[r].msg);
	}
}

/* Which GPUs are a process's own: its local rank's, or all it sees when a
 * launcher gave it exactly its own. */
Test(gpu_ranks, local_ranks_take_their_own_devices)
{
	struct tr_error err;
	cr_assert_eq(tr_comm_group_first_device(0, 1, 1, &err), 0);
	cr_assert_eq(tr_comm_group_first_device(0, 1, 4, &err), 0);
	cr_assert_eq(tr_comm_group_first_device(1, 1, 2, &err), 1);
	cr_assert_eq(tr_comm_group_first_device(3, 1, 4, &err), 3);
	cr_assert_eq(tr_comm_group_first_device(1, 2, 4, &err), 2);
	cr_assert_eq(tr_comm_group_first_device(1, 2, 2, &err), 0, "bound by the launcher");
	cr_assert_eq(tr_comm_group_first_device(2, 1, 2, &err), -EINVAL);
	cr_assert_str_eq(err.pointer, "/devices");
	cr_assert(strstr(err.message, "local rank 2") && strstr(err.message, "sees 2"), "%s", err.message);
	cr_assert_eq(tr_comm_group_first_device(1, 2, 3, &err), -EINVAL);

	static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"};
	for (int v = 0; v < 3; v++)
		unsetenv(vars[v]);
	cr_assert_eq(tr_pcomm_local_rank(), 0);
	setenv("MPI_LOCALRANKID", "1", 1);
	cr_assert_eq(tr_pcomm_local_rank(), 1);
	setenv("SLURM_LOCALID", "2", 1);
	cr_assert_eq(tr_pcomm_local_rank(), 2);
	setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3", 1);
	cr_assert_eq(tr_pcomm_local_rank(), 3);
	setenv("OMPI_COMM_WORLD_LOCAL_RANK", "x", 1);
	cr_assert_eq(tr_pcomm_local_rank(), 2);
	for (int v = 0; v < 3; v++)
		unsetenv(vars[v]);
}
