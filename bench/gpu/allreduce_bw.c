/* Allreduce bandwidth of the CUDA backend's collectives (NCCL underneath),
 * measured through engine/backend.h exactly as the trainer drives it: one
 * host thread per device, each calling allreduce_sum on its own buffer,
 * then sync.
 *
 *     allreduce_bw [MAX_MIB]      (default 256; needs >= 2 CUDA devices)
 *
 * Prints one JSON object per size on stdout.  algbw = bytes / time; busbw
 * = algbw * 2 (n - 1) / n, the figure nccl-tests reports, comparable
 * across device counts (a ring moves 2 (n - 1) / n of the buffer over each
 * link).  Built with the CUDA module (bench/gpu/meson.build).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/backend.h"

struct rank {
	tr_backend_t *be;
	tr_comm_t *comm;
	pthread_barrier_t *bar;
	int r, iters;
	float *buf;
	size_t n;
	int rc;
	double seconds;
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *rank_main(void *p)
{
	struct rank *k = p;
	tr_backend_t *be = k->be;

	for (int i = 0; i < 3 && k->rc == 0; i++) /* warm-up: connections, clocks */
		k->rc = be->i->allreduce_sum(k->comm, k->r, k->buf, k->n);
	if (k->rc == 0)
		k->rc = be->i->sync(be, k->r);
	pthread_barrier_wait(k->bar);
	double t0 = now_s();
	for (int i = 0; i < k->iters && k->rc == 0; i++)
		k->rc = be->i->allreduce_sum(k->comm, k->r, k->buf, k->n);
	if (k->rc == 0)
		k->rc = be->i->sync(be, k->r);
	k->seconds = now_s() - t0;
	if (k->rc != 0)
		be->i->comm_abort(k->comm);
	return NULL;
}

int main(int argc, char **argv)
{
	size_t max_bytes = (size_t)(argc > 1 ? atol(argv[1]) : 256) << 20;
	struct tr_error err;
	tr_backend_t *be = tr_cuda_backend_create(&err);

	if (!be) {
		fprintf(stderr, "allreduce_bw: %s\n", err.message);
		return 2;
	}
	int nd = be->i->device_count(be);
	if (nd < 2) {
		fprintf(stderr, "allreduce_bw: needs 2 or more CUDA devices, %d visible\n", nd);
		tr_backend_destroy(be);
		return 3;
	}
	tr_comm_t *comm = be->i->comm_create(be, nd, NULL);
	if (!comm) {
		fprintf(stderr, "allreduce_bw: comm_create: %s\n", be->i->last_error(be));
		tr_backend_destroy(be);
		return 1;
	}
	struct rank *ranks = calloc((size_t)nd, sizeof(*ranks));
	pthread_t *th = calloc((size_t)nd, sizeof(*th));
	pthread_barrier_t bar;
	pthread_barrier_init(&bar, NULL, (unsigned)nd);
	for (int r = 0; r < nd; r++) {
		ranks[r] = (struct rank){.be = be, .comm = comm, .bar = &bar, .r = r};
		ranks[r].buf = be->i->alloc(be, r, max_bytes);
		if (!ranks[r].buf) {
			fprintf(stderr, "allreduce_bw: device %d: %s\n", r, be->i->last_error(be));
			return 1;
		}
	}
	int status = 0;
	for (size_t bytes = 64 << 10; bytes <= max_bytes && status == 0; bytes *= 4) {
		int iters = (int)((size_t)(4u << 30) / bytes);
		iters = iters < 5 ? 5 : iters > 200 ? 200 : iters;
		for (int r = 0; r < nd; r++) {
			ranks[r].n = bytes / sizeof(float);
			ranks[r].iters = iters;
			pthread_create(&th[r], NULL, rank_main, &ranks[r]);
		}
		double worst = 0.0;
		for (int r = 0; r < nd; r++) {
			pthread_join(th[r], NULL);
			if (ranks[r].rc != 0) {
				fprintf(stderr, "allreduce_bw: rank %d: %s\n", r, be->i->last_error(be));
				status = 1;
			}
			if (ranks[r].seconds > worst)
				worst = ranks[r].seconds;
		}
		if (status)
			break;
		double t = worst / iters;
		double algbw = (double)bytes / t / 1e9;
		printf("{\"ranks\": %d, \"bytes\": %zu, \"iters\": %d, \"time_us\": %.2f, \"algbw_gbs\": %.2f, "
		       "\"busbw_gbs\": %.2f}\n",
		       nd, bytes, iters, t * 1e6, algbw, algbw * 2.0 * (nd - 1) / nd);
		fflush(stdout);
	}
	for (int r = 0; r < nd; r++)
		be->i->free(be, r, ranks[r].buf);
	be->i->comm_destroy(comm);
	pthread_barrier_destroy(&bar);
	free(ranks);
	free(th);
	tr_backend_destroy(be);
	return status;
}
