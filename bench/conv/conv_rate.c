/* conv_rate: the ceilings for bench/conv (RESULTS.md).
 *
 * For each convolution of a workload (LeNet-style or VDSR-style, batch B),
 * times on warm buffers, median of R calls:
 *   - the sgemm calls of the im2col route alone (cblas_sgemm, the shapes a
 *     per-sample im2col + gemm makes: forward W[K, CRS] x col[CRS, PQ];
 *     weight gradient dY[K, PQ] x col^T; data gradient W^T x dY), no im2col
 *     or col2im: the "same sgemm" peak of that route;
 *   - oneDNN's convolution primitives (forward training, backward data,
 *     backward weights with bias) on plain NCHW / OIHW memory, which is how
 *     trainerd stores tensors, and with the layouts oneDNN prefers
 *     (format "any", blocked) for context, reorders not counted;
 *   - one large square sgemm, the machine's sgemm peak.
 * Prints one JSON object.  Threads: OpenBLAS and OpenMP (oneDNN) both get
 * the count given with -t.
 *
 *   conv_rate lenet|vdsr [-b BATCH] [-t THREADS] [-r REPS] [-c cpu]
 *
 * -c cpu times with the calling thread's CPU time instead of the wall
 * clock: with -t 1 (the calling thread does all the work) a figure that a
 * loaded machine disturbs less, to compare shapes (oneDNN's cost per
 * sample for the batch slices of trainerd's oneDNN route, bench/README.md).
 */
#define _POSIX_C_SOURCE 200809L
#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

extern void openblas_set_num_threads(int n);

struct conv {
	int c, h, w, k, r, s, pad;
};

static clockid_t clock_id = CLOCK_MONOTONIC;

static double now(void)
{
	struct timespec ts;
	clock_gettime(clock_id, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmpd(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, n, sizeof *v, cmpd);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static float *buf(size_t n)
{
	float *p = aligned_alloc(64, ((n * sizeof(float) + 63) / 64) * 64);
	for (size_t i = 0; i < n; i++)
		p[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
	return p;
}

#define CHECK(x)                                                                                     \
	do {                                                                                         \
		dnnl_status_t st_ = (x);                                                             \
		if (st_ != dnnl_success) {                                                           \
			fprintf(stderr, "%s:%d: %s: status %d\n", __FILE__, __LINE__, #x, (int)st_); \
			exit(1);                                                                     \
		}                                                                                    \
	} while (0)

static dnnl_engine_t eng;
static dnnl_stream_t strm;

/* Times the im2col route's gemms for one conv over a batch: per sample,
 * forward, weight gradient (beta 1) and data gradient. */
static double gemm_time(const struct conv *cv, int batch, int reps, double *flop)
{
	int P = cv->h + 2 * cv->pad - cv->r + 1, Q = cv->w + 2 * cv->pad - cv->s + 1;
	int CRS = cv->c * cv->r * cv->s, PQ = P * Q, K = cv->k;
	float *W = buf((size_t)K * CRS), *col = buf((size_t)CRS * PQ), *y = buf((size_t)K * PQ);
	float *dW = buf((size_t)K * CRS), *dcol = buf((size_t)CRS * PQ);
	double *t = malloc(reps * sizeof *t);
	for (int i = -2; i < reps; i++) {
		double t0 = now();
		for (int b = 0; b < batch; b++) {
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, K, PQ, CRS, 1.0f, W, CRS, col, PQ, 0.0f,
				    y, PQ);
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, K, CRS, PQ, 1.0f, y, PQ, col, PQ, 1.0f, dW,
				    CRS);
			cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, CRS, PQ, K, 1.0f, W, CRS, y, PQ, 0.0f,
				    dcol, PQ);
		}
		if (i >= 0)
			t[i] = now() - t0;
	}
	*flop = 3.0 * 2.0 * K * (double)CRS * PQ * batch;
	double m = median(t, reps);
	free(W), free(col), free(y), free(dW), free(dcol), free(t);
	return m;
}

static void md4(dnnl_memory_desc_t *md, int a, int b, int c, int d, dnnl_format_tag_t tag)
{
	dnnl_dims_t dims = {a, b, c, d};
	CHECK(dnnl_memory_desc_init_by_tag(md, 4, dims, dnnl_f32, tag));
}

static dnnl_memory_t mem(const dnnl_primitive_desc_t pd, dnnl_query_t what)
{
	const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, what, 0);
	size_t bytes = dnnl_memory_desc_get_size(md);
	dnnl_memory_t m;
	CHECK(dnnl_memory_create(&m, md, eng, buf(bytes / sizeof(float) + 16)));
	return m;
}

static const char *impl(const_dnnl_primitive_desc_t pd)
{
	const char *s = NULL;
	dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &s);
	return s ? s : "?";
}

/* forward training + backward data + backward weights (with bias) */
static double dnnl_time(const struct conv *cv, int batch, int reps, int plain, char *impls, size_t ilen)
{
	int P = cv->h + 2 * cv->pad - cv->r + 1, Q = cv->w + 2 * cv->pad - cv->s + 1;
	dnnl_memory_desc_t src, wei, bia, dst;
	dnnl_format_tag_t act = plain ? dnnl_nchw : dnnl_format_tag_any;
	dnnl_format_tag_t wt = plain ? dnnl_oihw : dnnl_format_tag_any;
	md4(&src, batch, cv->c, cv->h, cv->w, act);
	md4(&wei, cv->k, cv->c, cv->r, cv->s, wt);
	md4(&dst, batch, cv->k, P, Q, act);
	dnnl_dims_t bd = {cv->k};
	CHECK(dnnl_memory_desc_init_by_tag(&bia, 1, bd, dnnl_f32, dnnl_a));
	dnnl_dims_t strides = {1, 1}, dil = {0, 0}, pad = {cv->pad, cv->pad};
	dnnl_convolution_desc_t fd, bdd, bwd;
	CHECK(dnnl_dilated_convolution_forward_desc_init(&fd, dnnl_forward_training, dnnl_convolution_direct, &src,
							 &wei, &bia, &dst, strides, dil, pad, pad));
	dnnl_primitive_desc_t fpd, dpd, wpd;
	CHECK(dnnl_primitive_desc_create(&fpd, &fd, NULL, eng, NULL));
	CHECK(dnnl_dilated_convolution_backward_data_desc_init(&bdd, dnnl_convolution_direct, &src, &wei, &dst, strides,
							       dil, pad, pad));
	CHECK(dnnl_primitive_desc_create(&dpd, &bdd, NULL, eng, fpd));
	CHECK(dnnl_dilated_convolution_backward_weights_desc_init(&bwd, dnnl_convolution_direct, &src, &wei, &bia, &dst,
								  strides, dil, pad, pad));
	CHECK(dnnl_primitive_desc_create(&wpd, &bwd, NULL, eng, fpd));
	snprintf(impls, ilen, "%s / %s / %s", impl(fpd), impl(dpd), impl(wpd));
	dnnl_primitive_t fp, dp, wp;
	CHECK(dnnl_primitive_create(&fp, fpd));
	CHECK(dnnl_primitive_create(&dp, dpd));
	CHECK(dnnl_primitive_create(&wp, wpd));
	dnnl_memory_t msrc = mem(fpd, dnnl_query_src_md), mwei = mem(fpd, dnnl_query_weights_md);
	dnnl_memory_t mbia, mdst = mem(fpd, dnnl_query_dst_md);
	{
		dnnl_memory_desc_t bmd;
		dnnl_dims_t d1 = {cv->k};
		CHECK(dnnl_memory_desc_init_by_tag(&bmd, 1, d1, dnnl_f32, dnnl_a));
		CHECK(dnnl_memory_create(&mbia, &bmd, eng, buf(cv->k)));
	}
	dnnl_memory_t mdsrc = mem(dpd, dnnl_query_diff_src_md), mddst = mem(wpd, dnnl_query_diff_dst_md);
	dnnl_memory_t mdwei = mem(wpd, dnnl_query_diff_weights_md), mdbia;
	{
		dnnl_memory_desc_t bmd;
		dnnl_dims_t d1 = {cv->k};
		CHECK(dnnl_memory_desc_init_by_tag(&bmd, 1, d1, dnnl_f32, dnnl_a));
		CHECK(dnnl_memory_create(&mdbia, &bmd, eng, buf(cv->k)));
	}
	dnnl_memory_t mddst_d = mem(dpd, dnnl_query_diff_dst_md), mwei_d = mem(dpd, dnnl_query_weights_md);
	dnnl_exec_arg_t fa[] = {{DNNL_ARG_SRC, msrc},
				{DNNL_ARG_WEIGHTS, mwei},
				{DNNL_ARG_BIAS, mbia},
				{DNNL_ARG_DST, mdst}};
	dnnl_exec_arg_t da[] = {{DNNL_ARG_DIFF_DST, mddst_d}, {DNNL_ARG_WEIGHTS, mwei_d}, {DNNL_ARG_DIFF_SRC, mdsrc}};
	dnnl_exec_arg_t wa[] = {{DNNL_ARG_SRC, msrc},
				{DNNL_ARG_DIFF_DST, mddst},
				{DNNL_ARG_DIFF_WEIGHTS, mdwei},
				{DNNL_ARG_DIFF_BIAS, mdbia}};
	double *t = malloc(reps * sizeof *t);
	for (int i = -2; i < reps; i++) {
		double t0 = now();
		CHECK(dnnl_primitive_execute(fp, strm, 4, fa));
		CHECK(dnnl_primitive_execute(dp, strm, 3, da));
		CHECK(dnnl_primitive_execute(wp, strm, 4, wa));
		CHECK(dnnl_stream_wait(strm));
		if (i >= 0)
			t[i] = now() - t0;
	}
	double m = median(t, reps);
	free(t);
	dnnl_primitive_destroy(fp), dnnl_primitive_destroy(dp), dnnl_primitive_destroy(wp);
	dnnl_primitive_desc_destroy(fpd), dnnl_primitive_desc_destroy(dpd), dnnl_primitive_desc_destroy(wpd);
	return m; /* buffers are left to the process's end */
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: conv_rate lenet|vdsr [-b BATCH] [-t THREADS] [-r REPS] [-c cpu]\n");
		return 2;
	}
	const char *wl = argv[1];
	int batch = 0, threads = 2, reps = 9;
	for (int i = 2; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "-b"))
			batch = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "-t"))
			threads = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "-r"))
			reps = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "-c") && !strcmp(argv[i + 1], "cpu"))
			clock_id = CLOCK_THREAD_CPUTIME_ID;
	}
	static const struct conv lenet[] = {{1, 28, 28, 32, 3, 3, 0}, {32, 13, 13, 64, 3, 3, 0}};
	static const struct conv vdsr[] = {{1, 41, 41, 64, 3, 3, 1},
					   {64, 41, 41, 64, 3, 3, 1},
					   {64, 41, 41, 1, 3, 3, 1}};
	const struct conv *cv;
	int n, mult[3] = {1, 1, 1};
	if (!strcmp(wl, "lenet")) {
		cv = lenet, n = 2;
		if (!batch)
			batch = 128;
	} else {
		cv = vdsr, n = 3, mult[1] = 8;
		if (!batch)
			batch = 32;
	}
	openblas_set_num_threads(threads);
	omp_set_num_threads(threads);
	CHECK(dnnl_engine_create(&eng, dnnl_cpu, 0));
	CHECK(dnnl_stream_create(&strm, eng, dnnl_stream_default_flags));

	printf("{\"workload\": \"%s\", \"batch\": %d, \"threads\": %d, \"reps\": %d, \"layers\": [", wl, batch, threads,
	       reps);
	double tg = 0, tdp = 0, tda = 0, fl = 0;
	for (int i = 0; i < n; i++) {
		double f;
		double g = gemm_time(&cv[i], batch, reps, &f);
		char ip[512], ia[512];
		double dp = dnnl_time(&cv[i], batch, reps, 1, ip, sizeof ip);
		double da = dnnl_time(&cv[i], batch, reps, 0, ia, sizeof ia);
		printf("%s{\"c\": %d, \"hw\": %d, \"k\": %d, \"count\": %d, \"gflop\": %.4f, \"sgemm_ms\": %.3f, "
		       "\"dnnl_plain_ms\": %.3f, \"dnnl_any_ms\": %.3f, \"dnnl_plain_impl\": \"%s\", "
		       "\"dnnl_any_impl\": \"%s\"}",
		       i ? ", " : "", cv[i].c, cv[i].h, cv[i].k, mult[i], f / 1e9, g * 1e3, dp * 1e3, da * 1e3, ip, ia);
		tg += g * mult[i], tdp += dp * mult[i], tda += da * mult[i], fl += f * mult[i];
	}
	/* a large square sgemm: the machine's sgemm peak */
	int N = 1024;
	float *A = buf((size_t)N * N), *B = buf((size_t)N * N), *C = buf((size_t)N * N);
	double t[9];
	for (int i = -1; i < 9; i++) {
		double t0 = now();
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, N, N, 1.0f, A, N, B, N, 0.0f, C, N);
		if (i >= 0)
			t[i] = now() - t0;
	}
	double peak = 2.0 * N * N * N / median(t, 9) / 1e9;
	printf("], \"conv_gflop\": %.4f, \"sgemm_ms\": %.3f, \"dnnl_plain_ms\": %.3f, \"dnnl_any_ms\": %.3f, "
	       "\"sgemm_gflops\": %.2f, \"dnnl_plain_gflops\": %.2f, \"dnnl_any_gflops\": %.2f, "
	       "\"sgemm_1024_gflops\": %.2f}\n",
	       fl / 1e9, tg * 1e3, tdp * 1e3, tda * 1e3, fl / tg / 1e9, fl / tdp / 1e9, fl / tda / 1e9, peak);
	return 0;
}
