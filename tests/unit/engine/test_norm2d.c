/* Tests of the image normalisation layers' numerics: batchnorm2d over the
 * global batch (engine/model/norm2d.c on the CPU backend's bn_* kernels)
 * and groupnorm, against double-precision references written from
 * PyTorch's documented formulas; gradients against central finite
 * differences of those references; batchnorm2d split over three devices
 * (one of them idle) against one device.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/model/norm2d.h"
#include "engine/rng.h"

static tr_backend_t *be;

static void setup(void)
{
	be = tr_cpu_backend_create(3, 3);
	cr_assert(be, "tr_cpu_backend_create failed");
}

static void teardown(void)
{
	tr_backend_destroy(be);
	be = NULL;
}

TestSuite(norm2d, .init = setup, .fini = teardown);

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

static double rnd(void) /* uniform in [-1, 1) */
{
	rng_state = tr_mix64(rng_state);
	return (double)(rng_state >> 11) * 0x1p-52 - 1.0;
}

static float *frand(size_t n, double lo, double hi)
{
	float *p = calloc(n ? n : 1, sizeof *p);
	cr_assert(p);
	for (size_t i = 0; i < n; i++)
		p[i] = (float)(lo + (hi - lo) * (rnd() + 1.0) / 2.0);
	return p;
}

static float *fzero(size_t n)
{
	float *p = calloc(n ? n : 1, sizeof *p);
	cr_assert(p);
	return p;
}

static void check_close(const char *what, const float *got, const double *want, size_t n, double atol, double rtol)
{
	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)got[i] - want[i]);
		cr_assert(d <= atol + rtol * fabs(want[i]), "%s[%zu]: got %.9g, want %.9g (diff %.3g)", what, i,
			  (double)got[i], want[i], d);
	}
}

/* ---- references ---------------------------------------------------------- */

/* torch.nn.BatchNorm2d in training mode over all n samples: biased
 * variance for the normalisation.  Returns L = sum w * y; y may be NULL. */
static double bn_ref(int n, int c, int hw, double eps, const double *x, const double *g, const double *b,
		     const double *w, double *y, double *mean, double *var)
{
	double L = 0.0;
	double cnt = (double)n * hw;
	for (int ch = 0; ch < c; ch++) {
		double s = 0.0, ss = 0.0;
		for (int i = 0; i < n; i++)
			for (int k = 0; k < hw; k++)
				s += x[((size_t)i * c + ch) * hw + k];
		double mu = s / cnt;
		for (int i = 0; i < n; i++)
			for (int k = 0; k < hw; k++) {
				double d = x[((size_t)i * c + ch) * hw + k] - mu;
				ss += d * d;
			}
		double v = ss / cnt;
		if (mean)
			mean[ch] = mu;
		if (var)
			var[ch] = v;
		for (int i = 0; i < n; i++)
			for (int k = 0; k < hw; k++) {
				size_t o = ((size_t)i * c + ch) * hw + k;
				double yy = (x[o] - mu) / sqrt(v + eps) * g[ch] + b[ch];
				if (y)
					y[o] = yy;
				L += w[o] * yy;
			}
	}
	return L;
}

/* torch.nn.GroupNorm: per sample and group, biased variance. */
static double gn_ref(int n, int c, int hw, int groups, double eps, const double *x, const double *g, const double *b,
		     const double *w, double *y)
{
	double L = 0.0;
	int cg = c / groups;
	double cnt = (double)cg * hw;
	for (int i = 0; i < n; i++)
		for (int gr = 0; gr < groups; gr++) {
			size_t o = ((size_t)i * c + (size_t)gr * cg) * hw;
			double s = 0.0, ss = 0.0;
			for (size_t k = 0; k < (size_t)cg * hw; k++)
				s += x[o + k];
			double mu = s / cnt;
			for (size_t k = 0; k < (size_t)cg * hw; k++)
				ss += (x[o + k] - mu) * (x[o + k] - mu);
			double rs = 1.0 / sqrt(ss / cnt + eps);
			for (int cc = 0; cc < cg; cc++)
				for (int k = 0; k < hw; k++) {
					size_t oo = o + (size_t)cc * hw + k;
					int ch = gr * cg + cc;
					double yy = (x[oo] - mu) * rs * g[ch] + b[ch];
					if (y)
						y[oo] = yy;
					L += w[oo] * yy;
				}
		}
	return L;
}

static double *todouble(const float *p, size_t n)
{
	double *d = calloc(n ? n : 1, sizeof *d);
	cr_assert(d);
	for (size_t i = 0; i < n; i++)
		d[i] = p[i];
	return d;
}

enum which { BN, GN };

struct fd_case {
	enum which kind;
	int n, c, hw, groups;
	const double *x, *g, *b, *w;
};

static double eval_ref(const struct fd_case *k, const double *x, const double *g, const double *b)
{
	if (k->kind == BN)
		return bn_ref(k->n, k->c, k->hw, 1e-5, x, g, b, k->w, NULL, NULL, NULL);
	return gn_ref(k->n, k->c, k->hw, k->groups, 1e-5, x, g, b, k->w, NULL);
}

/* Central differences of the double reference with respect to v[i]. */
static double fd(const struct fd_case *k, double *v, size_t i, const double *x, const double *g, const double *b)
{
	const double h = 1e-5;
	double keep = v[i];
	v[i] = keep + h;
	double lp = eval_ref(k, x, g, b);
	v[i] = keep - h;
	double lm = eval_ref(k, x, g, b);
	v[i] = keep;
	return (lp - lm) / (2 * h);
}

static void fd_check(const char *what, const struct fd_case *k, double *v, size_t len, const float *got, double *x,
		     double *g, double *b)
{
	double *want = calloc(len, sizeof *want);
	cr_assert(want);
	for (size_t i = 0; i < len; i++)
		want[i] = fd(k, v, i, x, g, b);
	check_close(what, got, want, len, 2e-4, 2e-3);
	free(want);
}

/* ---- batchnorm2d --------------------------------------------------------- */

struct bn_case {
	int n, c, hw;
};

/* clang-format off */
static const struct bn_case bn_cases[] = {
	{2, 1, 1},  /* two values per channel: the smallest batch torch takes */
	{1, 3, 7},  /* one sample, the spatial positions are the batch */
	{3, 4, 5},
	{5, 2, 9},
	{4, 3, 1},  /* 1x1 images */
};
/* clang-format on */

Test(norm2d, batchnorm_forward_backward_against_reference)
{
	struct tr_norm_ctx nc = {.be = be, .dev = 0, .comm = NULL, .rank = 0, .ndev = 1};
	for (size_t ci = 0; ci < sizeof bn_cases / sizeof bn_cases[0]; ci++) {
		int n = bn_cases[ci].n, c = bn_cases[ci].c, hw = bn_cases[ci].hw;
		size_t len = (size_t)n * c * hw;
		/* an offset mean: the two-pass variance must keep its digits */
		float *x = frand(len, 2.0, 4.0), *gamma = frand(c, 0.5, 1.5), *beta = frand(c, -0.5, 0.5);
		float *w = frand(len, -1.0, 1.0);
		float *y = fzero(len), *dx = fzero(len), *mean = fzero(c), *var = fzero(c);
		float *rm = frand(c, -0.1, 0.1), *rv = frand(c, 0.9, 1.1), *nb = fzero(1);
		float *rm0 = fzero(c), *rv0 = fzero(c);
		memcpy(rm0, rm, c * sizeof(float));
		memcpy(rv0, rv, c * sizeof(float));
		float *dg = fzero(c), *db = fzero(c), *scratch = fzero(TR_BN_SCRATCH(c));
		cr_assert_eq(tr_bn_forward_train(&nc, n, c, hw, n, 1e-5f, 0.1f, x, gamma, beta, y, mean, var, rm, rv,
						 nb),
			     0, "case %zu: %s", ci, be->i->last_error(be));
		cr_assert_eq(tr_bn_backward(&nc, n, c, hw, n, 1e-5f, x, gamma, mean, var, w, dx, scratch, dg, db), 0);

		double *xd = todouble(x, len), *gd = todouble(gamma, c), *bd = todouble(beta, c),
		       *wd = todouble(w, len);
		double *yref = calloc(len, sizeof *yref), *mref = calloc(c, sizeof *mref),
		       *vref = calloc(c, sizeof *vref);
		bn_ref(n, c, hw, 1e-5, xd, gd, bd, wd, yref, mref, vref);
		check_close("bn y", y, yref, len, 1e-5, 1e-5);
		check_close("bn mean", mean, mref, c, 1e-6, 1e-6);
		check_close("bn var", var, vref, c, 1e-6, 1e-5);
		double cnt = (double)n * hw;
		double *rmref = calloc(c, sizeof *rmref), *rvref = calloc(c, sizeof *rvref);
		for (int ch = 0; ch < c; ch++) {
			rmref[ch] = 0.9 * rm0[ch] + 0.1 * mref[ch];
			rvref[ch] = 0.9 * rv0[ch] + 0.1 * vref[ch] * cnt / (cnt - 1.0);
		}
		check_close("bn running_mean", rm, rmref, c, 1e-6, 1e-6);
		check_close("bn running_var", rv, rvref, c, 1e-6, 1e-5);
		cr_assert_eq(nb[0], 1.0f);

		struct fd_case k = {BN, n, c, hw, 1, xd, gd, bd, wd};
		fd_check("bn dx", &k, xd, len, dx, xd, gd, bd);
		fd_check("bn dgamma", &k, gd, c, dg, xd, gd, bd);
		fd_check("bn dbeta", &k, bd, c, db, xd, gd, bd);

		/* evaluation normalises with the running statistics */
		float *ye = fzero(len);
		cr_assert_eq(tr_bn_forward_eval(&nc, n, c, hw, 1e-5f, x, gamma, beta, rm, rv, ye), 0);
		double *yeref = calloc(len, sizeof *yeref);
		for (int i = 0; i < n; i++)
			for (int ch = 0; ch < c; ch++)
				for (int q = 0; q < hw; q++) {
					size_t o = ((size_t)i * c + ch) * hw + q;
					yeref[o] = (xd[o] - rm[ch]) / sqrt((double)rv[ch] + 1e-5) * gd[ch] + bd[ch];
				}
		check_close("bn eval y", ye, yeref, len, 1e-5, 1e-5);

		free(x), free(gamma), free(beta), free(w), free(y), free(dx), free(mean), free(var), free(rm);
		free(rv), free(nb), free(rm0), free(rv0), free(dg), free(db), free(scratch), free(xd), free(gd);
		free(bd), free(wd), free(yref), free(mref), free(vref), free(rmref), free(rvref), free(ye);
		free(yeref);
	}
}

Test(norm2d, batchnorm_single_value_per_channel_is_refused)
{
	struct tr_norm_ctx nc = {.be = be, .dev = 0, .ndev = 1};
	float x[2] = {1, 2}, g[2] = {1, 1}, b[2] = {0, 0}, y[2], m[2], v[2], rm[2] = {0}, rv[2] = {1, 1}, nb = 0;
	cr_assert_eq(tr_bn_forward_train(&nc, 1, 2, 1, 1, 1e-5f, 0.1f, x, g, b, y, m, v, rm, rv, &nb), -EINVAL);
	cr_assert(strstr(be->i->last_error(be), "1 value(s) per channel"), "%s", be->i->last_error(be));
	cr_assert_eq(nb, 0.0f, "nothing is updated");
	cr_assert_eq(rm[0], 0.0f, "nothing is updated");
}

/* ---- batchnorm2d over three devices -------------------------------------- */

struct rank_job {
	struct tr_norm_ctx nc;
	int n, c, hw, step_rows;
	const float *x, *gamma, *beta, *dy;
	float *y, *dx, *mean, *var, *rm, *rv, *nb, *dg, *db, *scratch;
	int rc;
};

static void *rank_main(void *arg)
{
	struct rank_job *j = arg;
	j->rc = tr_bn_forward_train(&j->nc, j->n, j->c, j->hw, j->step_rows, 1e-5f, 0.1f, j->x, j->gamma, j->beta, j->y,
				    j->mean, j->var, j->rm, j->rv, j->nb);
	if (j->rc == 0)
		j->rc = tr_bn_backward(&j->nc, j->n, j->c, j->hw, j->step_rows, 1e-5f, j->x, j->gamma, j->mean, j->var,
				       j->dy, j->dx, j->scratch, j->dg, j->db);
	return NULL;
}

/* The split the trainer makes of a short last step: 3 + 2 + 0 samples. */
Test(norm2d, batchnorm_three_devices_one_idle_match_one_device)
{
	const int n = 5, c = 4, hw = 6, shares[3] = {3, 2, 0};
	size_t len = (size_t)n * c * hw, per = (size_t)c * hw;
	float *x = frand(len, -1.0, 3.0), *gamma = frand(c, 0.5, 1.5), *beta = frand(c, -0.5, 0.5);
	float *dy = frand(len, -1.0, 1.0);

	/* one device */
	struct rank_job one = {.nc = {be, 0, NULL, 0, 1},
			       .n = n,
			       .c = c,
			       .hw = hw,
			       .step_rows = n,
			       .x = x,
			       .gamma = gamma,
			       .beta = beta,
			       .dy = dy};
	one.y = fzero(len), one.dx = fzero(len), one.mean = fzero(c), one.var = fzero(c), one.rm = fzero(c);
	one.rv = fzero(c), one.nb = fzero(1), one.dg = fzero(c), one.db = fzero(c);
	one.scratch = fzero(TR_BN_SCRATCH(c));
	for (int ch = 0; ch < c; ch++)
		one.rv[ch] = 1.0f;
	rank_main(&one);
	cr_assert_eq(one.rc, 0);

	int devs[3] = {0, 1, 2};
	tr_comm_t *comm = be->i->comm_create(be, 3, devs);
	cr_assert(comm);
	struct rank_job jobs[3];
	pthread_t th[3];
	int off = 0;
	for (int r = 0; r < 3; r++) {
		struct rank_job *j = &jobs[r];
		memset(j, 0, sizeof *j);
		j->nc = (struct tr_norm_ctx){.be = be, .dev = r, .comm = comm, .rank = r, .ndev = 3};
		j->n = shares[r], j->c = c, j->hw = hw, j->step_rows = n;
		j->x = x + off * per, j->dy = dy + off * per, j->gamma = gamma, j->beta = beta;
		j->y = fzero(shares[r] * per), j->dx = fzero(shares[r] * per);
		j->mean = fzero(c), j->var = fzero(c), j->rm = fzero(c), j->rv = fzero(c), j->nb = fzero(1);
		j->dg = fzero(c), j->db = fzero(c), j->scratch = fzero(TR_BN_SCRATCH(c));
		for (int ch = 0; ch < c; ch++)
			j->rv[ch] = 1.0f;
		off += shares[r];
		cr_assert_eq(pthread_create(&th[r], NULL, rank_main, j), 0);
	}
	for (int r = 0; r < 3; r++)
		pthread_join(th[r], NULL);
	be->i->comm_destroy(comm);

	double *want = calloc(len, sizeof *want);
	off = 0;
	for (int r = 0; r < 3; r++) {
		struct rank_job *j = &jobs[r];
		cr_assert_eq(j->rc, 0, "rank %d: %s", r, be->i->last_error(be));
		size_t m = (size_t)j->n * per;
		for (size_t i = 0; i < m; i++)
			want[i] = one.y[off * per + i];
		check_close("y split", j->y, want, m, 1e-6, 1e-5);
		for (size_t i = 0; i < m; i++)
			want[i] = one.dx[off * per + i];
		check_close("dx split", j->dx, want, m, 1e-6, 1e-5);
		off += j->n;
		/* every replica, the idle one too, keeps the same running
		 * statistics, bit for bit (the collective hands every rank the
		 * same sums) */
		cr_assert_eq(memcmp(j->rm, jobs[0].rm, c * sizeof(float)), 0, "rank %d running_mean", r);
		cr_assert_eq(memcmp(j->rv, jobs[0].rv, c * sizeof(float)), 0, "rank %d running_var", r);
		cr_assert_eq(j->nb[0], 1.0f);
	}
	for (int ch = 0; ch < c; ch++)
		want[ch] = one.rm[ch];
	check_close("running_mean split", jobs[0].rm, want, c, 1e-7, 1e-6);
	for (int ch = 0; ch < c; ch++)
		want[ch] = one.rv[ch];
	check_close("running_var split", jobs[0].rv, want, c, 1e-7, 1e-6);
	/* weight gradients: the ranks' shares add up to one device's */
	for (int ch = 0; ch < c; ch++) {
		double g = 0, b = 0;
		for (int r = 0; r < 3; r++)
			g += jobs[r].dg[ch], b += jobs[r].db[ch];
		cr_assert(fabs(g - one.dg[ch]) <= 1e-5 + 1e-5 * fabs(one.dg[ch]), "dgamma[%d] %g vs %g", ch, g,
			  (double)one.dg[ch]);
		cr_assert(fabs(b - one.db[ch]) <= 1e-5 + 1e-5 * fabs(one.db[ch]), "dbeta[%d] %g vs %g", ch, b,
			  (double)one.db[ch]);
		cr_assert_eq(jobs[2].dg[ch], 0.0f, "the idle rank adds nothing");
		cr_assert_eq(jobs[2].db[ch], 0.0f, "the idle rank adds nothing");
	}
	for (int r = 0; r < 3; r++) {
		struct rank_job *j = &jobs[r];
		free(j->y), free(j->dx), free(j->mean), free(j->var), free(j->rm), free(j->rv), free(j->nb);
		free(j->dg), free(j->db), free(j->scratch);
	}
	free(one.y), free(one.dx), free(one.mean), free(one.var), free(one.rm), free(one.rv), free(one.nb);
	free(one.dg), free(one.db), free(one.scratch);
	free(want), free(x), free(gamma), free(beta), free(dy);
}

/* ---- groupnorm ----------------------------------------------------------- */

struct gn_case {
	int n, c, hw, groups;
};

/* clang-format off */
static const struct gn_case gn_cases[] = {
	{1, 1, 1, 1}, /* a single value: normalised to 0, the output is beta */
	{2, 6, 4, 3},
	{3, 4, 1, 2}, /* 1x1 images */
	{2, 4, 9, 1}, /* one group: LayerNorm over C, H, W */
	{1, 4, 5, 4}, /* a group per channel: InstanceNorm */
};
/* clang-format on */

Test(norm2d, groupnorm_forward_backward_against_reference)
{
	for (size_t ci = 0; ci < sizeof gn_cases / sizeof gn_cases[0]; ci++) {
		int n = gn_cases[ci].n, c = gn_cases[ci].c, hw = gn_cases[ci].hw, groups = gn_cases[ci].groups;
		size_t len = (size_t)n * c * hw;
		float *x = frand(len, 2.0, 4.0), *gamma = frand(c, 0.5, 1.5), *beta = frand(c, -0.5, 0.5);
		float *w = frand(len, -1.0, 1.0);
		float *y = fzero(len), *dx = fzero(len), *mean = fzero((size_t)n * groups);
		float *rstd = fzero((size_t)n * groups), *dg = fzero(c), *db = fzero(c);
		cr_assert_eq(be->i->groupnorm_forward(be, 0, n, c, hw, groups, 1e-5f, x, gamma, beta, y, mean, rstd), 0,
			     "%s", be->i->last_error(be));
		cr_assert_eq(be->i->groupnorm_backward(be, 0, n, c, hw, groups, x, gamma, mean, rstd, w, dx, dg, db),
			     0);
		double *xd = todouble(x, len), *gd = todouble(gamma, c), *bd = todouble(beta, c),
		       *wd = todouble(w, len), *yref = calloc(len, sizeof(double));
		gn_ref(n, c, hw, groups, 1e-5, xd, gd, bd, wd, yref);
		check_close("gn y", y, yref, len, 1e-5, 1e-5);
		struct fd_case k = {GN, n, c, hw, groups, xd, gd, bd, wd};
		fd_check("gn dx", &k, xd, len, dx, xd, gd, bd);
		fd_check("gn dgamma", &k, gd, c, dg, xd, gd, bd);
		fd_check("gn dbeta", &k, bd, c, db, xd, gd, bd);
		free(x), free(gamma), free(beta), free(w), free(y), free(dx), free(mean), free(rstd), free(dg);
		free(db), free(xd), free(gd), free(bd), free(wd), free(yref);
	}
}

Test(norm2d, groupnorm_refuses_channels_not_divisible_by_groups)
{
	float x[6] = {0}, g[3] = {1, 1, 1}, b[3] = {0}, y[6], m[2], r[2];
	cr_assert_eq(be->i->groupnorm_forward(be, 0, 1, 3, 2, 2, 1e-5f, x, g, b, y, m, r), -EINVAL);
	cr_assert(strstr(be->i->last_error(be), "3 channels in 2 groups"), "%s", be->i->last_error(be));
}
