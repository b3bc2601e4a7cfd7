/* sgemm_rate: the OpenBLAS ceiling for one training step of a dense MLP.
 *
 * trainerd's dense layers are three cblas_sgemm calls each (engine/model/
 * model.c): forward y = x W^T, backward dW += dy^T x and dx = dy W (skipped
 * for the first layer, whose input needs no gradient).  This program times
 * exactly those calls, with the same transposes, leading dimensions, beta
 * and thread count, on warm buffers, and prints the median time and GFLOP/s
 * of each shape plus their sum: the step time a framework would need if it
 * did nothing but these gemms back to back.  The trainer's achieved FLOP
 * rate divided by the rate printed here is its "% of sgemm".
 *
 * usage: sgemm_rate BATCH IN H1 ... OUT [--threads N] [--reps R]
 * Output: one JSON object on stdout.
 *
 * Build: cc -O2 -o sgemm_rate sgemm_rate.c $(pkg-config --cflags --libs openblas)
 */
#define _POSIX_C_SOURCE 200809L
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

extern void openblas_set_num_threads(int n);

#define MAX_DIMS 32

struct shape {
	char what[48];
	int layer;
	int trans_a, trans_b, m, n, k;
	float beta;
	double med_s;
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static float *randbuf(size_t n, unsigned *seed)
{
	float *p = aligned_alloc(64, ((n * sizeof(float) + 63) / 64) * 64);
	if (!p) {
		fprintf(stderr, "sgemm_rate: out of memory\n");
		exit(1);
	}
	for (size_t i = 0; i < n; i++) {
		*seed = *seed * 1664525u + 1013904223u;
		p[i] = ((float)(*seed >> 8) / 16777216.0f - 0.5f) * 0.1f;
	}
	return p;
}

/* Same call form as engine/cpu/cpu_kernels.c cpu_gemm. */
static void gemm(const struct shape *s, const float *a, const float *b, float *c)
{
	cblas_sgemm(CblasRowMajor, s->trans_a ? CblasTrans : CblasNoTrans, s->trans_b ? CblasTrans : CblasNoTrans, s->m,
		    s->n, s->k, 1.0f, a, s->trans_a ? s->m : s->k, b, s->trans_b ? s->k : s->n, s->beta, c, s->n);
}

int main(int argc, char **argv)
{
	int dims[MAX_DIMS], nd = 0, batch = 0, threads = 0, reps = 30;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--threads") && i + 1 < argc)
			threads = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
			reps = atoi(argv[++i]);
		else if (batch == 0)
			batch = atoi(argv[i]);
		else if (nd < MAX_DIMS)
			dims[nd++] = atoi(argv[i]);
	}
	if (batch <= 0 || nd < 2 || reps < 1) {
		fprintf(stderr, "usage: sgemm_rate BATCH IN H1 ... OUT [--threads N] [--reps R]\n");
		return 2;
	}
	if (threads > 0)
		openblas_set_num_threads(threads);

	struct shape sh[3 * MAX_DIMS];
	int ns = 0;
	for (int l = 0; l + 1 < nd; l++) {
		int in = dims[l], out = dims[l + 1];
		sh[ns++] = (struct shape){
			.layer = l, .trans_a = 0, .trans_b = 1, .m = batch, .n = out, .k = in, .beta = 0.0f};
		snprintf(sh[ns - 1].what, sizeof sh[0].what, "fwd y=xW^T");
		sh[ns++] = (struct shape){
			.layer = l, .trans_a = 1, .trans_b = 0, .m = out, .n = in, .k = batch, .beta = 1.0f};
		snprintf(sh[ns - 1].what, sizeof sh[0].what, "bwd dW+=dy^T x");
		if (l > 0) {
			sh[ns++] = (struct shape){
				.layer = l, .trans_a = 0, .trans_b = 0, .m = batch, .n = in, .k = out, .beta = 0.0f};
			snprintf(sh[ns - 1].what, sizeof sh[0].what, "bwd dx=dy W");
		}
	}

	unsigned seed = 12345;
	double *t = malloc(sizeof(double) * (size_t)reps);
	double total_s = 0, total_flop = 0;
	printf("{\n  \"batch\": %d,\n  \"dims\": [", batch);
	for (int i = 0; i < nd; i++)
		printf("%s%d", i ? ", " : "", dims[i]);
	printf("],\n  \"threads\": %d,\n  \"reps\": %d,\n  \"gemms\": [\n", threads, reps);
	for (int i = 0; i < ns; i++) {
		struct shape *s = &sh[i];
		/* A is m x k (or k x m transposed), B is k x n (or n x k), C m x n. */
		float *a = randbuf((size_t)s->m * s->k, &seed);
		float *b = randbuf((size_t)s->k * s->n, &seed);
		float *c = randbuf((size_t)s->m * s->n, &seed);
		for (int w = 0; w < 3; w++)
			gemm(s, a, b, c);
		for (int r = 0; r < reps; r++) {
			double t0 = now_s();
			gemm(s, a, b, c);
			t[r] = now_s() - t0;
		}
		qsort(t, (size_t)reps, sizeof(double), cmp_double);
		s->med_s = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
		double flop = 2.0 * s->m * s->n * s->k;
		total_s += s->med_s;
		total_flop += flop;
		printf("    {\"layer\": %d, \"op\": \"%s\", \"trans_a\": %d, \"trans_b\": %d, \"m\": %d, \"n\": %d, "
		       "\"k\": %d, \"flop\": %.0f, \"median_ms\": %.4f, \"gflops\": %.2f}%s\n",
		       s->layer, s->what, s->trans_a, s->trans_b, s->m, s->n, s->k, flop, s->med_s * 1e3,
		       flop / s->med_s * 1e-9, i + 1 < ns ? "," : "");
		free(a);
		free(b);
		free(c);
	}
	printf("  ],\n  \"step_flop\": %.0f,\n  \"ideal_step_ms\": %.4f,\n  \"gflops\": %.2f\n}\n", total_flop,
	       total_s * 1e3, total_flop / total_s * 1e-9);
	free(t);
	return 0;
}
