/* Tests of the optimizer glue and the learning-rate schedules.
 *
 * The update kernels are checked for three steps against double-precision
 * references written here from the PyTorch documentation's formulas (not
 * from the kernels' operation order), plus one step against literal numbers
 * worked out separately with python3.  Schedules are checked at warmup
 * boundaries and along the decay.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/optim/optimizer.h"
#include "engine/optim/schedule.h"

#define N 5

static tr_backend_t *be;

static void setup(void)
{
	be = tr_cpu_backend_create(1, 1);
	cr_assert(be);
}

static void teardown(void)
{
	tr_backend_destroy(be);
}

TestSuite(optim, .init = setup, .fini = teardown);

static const double p_init[N] = {1.0, -2.0, 0.5, 0.0, 3.25};
static const double grads[3][N] = {
	{0.1, -0.3, 2.0, 0.0, -1.5},
	{-0.2, 0.25, 1.0, 0.5, 0.75},
	{0.05, -0.6, -0.4, 1e-4, 0.0},
};

static struct tr_spec make_spec(enum tr_optim_type type, float lr)
{
	struct tr_spec s;
	memset(&s, 0, sizeof(s));
	s.optimizer.type = type;
	s.optimizer.lr = lr;
	s.optimizer.beta1 = 0.9f;
	s.optimizer.beta2 = 0.999f;
	s.optimizer.eps = 1e-8f;
	return s;
}

/* Reference state, in double. */
struct ref {
	double p[N], s1[N], s2[N];
};

/* torch.optim.SGD documentation, with the hyper-parameters as the float
 * values the kernel receives. */
static void ref_sgd(struct ref *r, const double *g_in, const struct tr_optim_hp *hp)
{
	for (int i = 0; i < N; i++) {
		double g = g_in[i] + (double)hp->weight_decay * r->p[i];
		if (hp->momentum != 0.0f) {
			if (hp->step == 1)
				r->s1[i] = g;
			else
				r->s1[i] = hp->momentum * r->s1[i] + (1.0 - hp->dampening) * g;
			g = hp->nesterov ? g + hp->momentum * r->s1[i] : r->s1[i];
		}
		r->p[i] -= hp->lr * g;
	}
}

/* torch.optim.Adam / AdamW documentation (bias-corrected moments). */
static void ref_adam(struct ref *r, const double *g_in, const struct tr_optim_hp *hp)
{
	double b1 = hp->beta1, b2 = hp->beta2, t = (double)hp->step;
	for (int i = 0; i < N; i++) {
		double g = g_in[i];
		if (hp->decoupled)
			r->p[i] -= (double)hp->lr * hp->weight_decay * r->p[i];
		else
			g += (double)hp->weight_decay * r->p[i];
		r->s1[i] = b1 * r->s1[i] + (1 - b1) * g;
		r->s2[i] = b2 * r->s2[i] + (1 - b2) * g * g;
		double mhat = r->s1[i] / (1 - pow(b1, t));
		double vhat = r->s2[i] / (1 - pow(b2, t));
		r->p[i] -= hp->lr * mhat / (sqrt(vhat) + hp->eps);
	}
}

static void run_three_steps(const char *what, const struct tr_spec *spec)
{
	enum tr_optim_type type = spec->optimizer.type;
	int nstate = tr_optim_state_buffers(type, spec);
	float *p = be->i->alloc(be, 0, N * sizeof(float));
	float *g = be->i->alloc(be, 0, N * sizeof(float));
	float *s1 = nstate >= 1 ? be->i->alloc(be, 0, N * sizeof(float)) : NULL;
	float *s2 = nstate >= 2 ? be->i->alloc(be, 0, N * sizeof(float)) : NULL;
	struct ref r;

	memset(&r, 0, sizeof(r));
	for (int i = 0; i < N; i++) {
		p[i] = (float)p_init[i];
		r.p[i] = p[i];
	}
	for (int step = 1; step <= 3; step++) {
		/* a different rate each step, as a schedule would give */
		float lr = spec->optimizer.lr * (1.0f - 0.25f * (float)(step - 1));
		struct tr_optim_hp hp = tr_optim_hp_from_spec(spec, lr, step);
		for (int i = 0; i < N; i++)
			g[i] = (float)grads[step - 1][i];
		double gd[N];
		for (int i = 0; i < N; i++)
			gd[i] = g[i];
		cr_assert_eq(tr_optim_apply(be, 0, type, N, p, g, s1, s2, &hp), 0, "%s: %s", what,
			     be->i->last_error(be));
		if (type == TR_OPT_SGD)
			ref_sgd(&r, gd, &hp);
		else
			ref_adam(&r, gd, &hp);
		for (int i = 0; i < N; i++) {
			cr_assert(fabs(p[i] - r.p[i]) <= 2e-6 * fabs(r.p[i]) + 1e-7,
				  "%s step %d param %d: %.9g vs reference %.9g", what, step, i, (double)p[i], r.p[i]);
			if (s1)
				cr_assert(fabs(s1[i] - r.s1[i]) <= 1e-5 * fabs(r.s1[i]) + 1e-9,
					  "%s step %d state1 %d: %.9g vs %.9g", what, step, i, (double)s1[i], r.s1[i]);
			if (s2)
				cr_assert(fabs(s2[i] - r.s2[i]) <= 1e-5 * fabs(r.s2[i]) + 1e-12,
					  "%s step %d state2 %d: %.9g vs %.9g", what, step, i, (double)s2[i], r.s2[i]);
		}
	}
	be->i->free(be, 0, p);
	be->i->free(be, 0, g);
	be->i->free(be, 0, s1);
	be->i->free(be, 0, s2);
}

Test(optim, sgd_plain)
{
	struct tr_spec s = make_spec(TR_OPT_SGD, 0.1f);
	cr_assert_eq(tr_optim_state_buffers(TR_OPT_SGD, &s), 0);
	run_three_steps("sgd", &s);
}

Test(optim, sgd_momentum_dampening)
{
	struct tr_spec s = make_spec(TR_OPT_SGD, 0.1f);
	s.optimizer.momentum = 0.9f;
	s.optimizer.dampening = 0.3f;
	cr_assert_eq(tr_optim_state_buffers(TR_OPT_SGD, &s), 1);
	run_three_steps("sgd momentum", &s);
}

Test(optim, sgd_nesterov)
{
	struct tr_spec s = make_spec(TR_OPT_SGD, 0.05f);
	s.optimizer.momentum = 0.8f;
	s.optimizer.nesterov = true;
	run_three_steps("sgd nesterov", &s);
}

Test(optim, sgd_weight_decay)
{
	struct tr_spec s = make_spec(TR_OPT_SGD, 0.1f);
	s.optimizer.weight_decay = 0.05f;
	run_three_steps("sgd weight decay", &s);
	s.optimizer.momentum = 0.5f;
	s.optimizer.nesterov = true;
	run_three_steps("sgd nesterov weight decay", &s);
}

Test(optim, adam)
{
	struct tr_spec s = make_spec(TR_OPT_ADAM, 0.01f);
	cr_assert_eq(tr_optim_state_buffers(TR_OPT_ADAM, &s), 2);
	run_three_steps("adam", &s);
	s.optimizer.weight_decay = 0.1f;
	s.optimizer.beta1 = 0.8f;
	s.optimizer.beta2 = 0.99f;
	s.optimizer.eps = 1e-3f;
	run_three_steps("adam weight decay", &s);
}

Test(optim, adamw)
{
	struct tr_spec s = make_spec(TR_OPT_ADAMW, 0.01f);
	s.optimizer.weight_decay = 0.01f;
	cr_assert_eq(tr_optim_state_buffers(TR_OPT_ADAMW, &s), 2);
	struct tr_optim_hp hp = tr_optim_hp_from_spec(&s, 0.01f, 1);
	cr_assert(hp.decoupled);
	run_three_steps("adamw", &s);
	s.optimizer.weight_decay = 0.5f;
	run_three_steps("adamw strong decay", &s);
}

/* One step on p = {1, -2, 0.5}, g = {0.1, -0.3, 2}, values from python3. */
static void one_step_literal(enum tr_optim_type type, float lr, float wd, float momentum, bool nesterov,
			     const double want[3])
{
	struct tr_spec s = make_spec(type, lr);
	s.optimizer.weight_decay = wd;
	s.optimizer.momentum = momentum;
	s.optimizer.nesterov = nesterov;
	float p[3] = {1.0f, -2.0f, 0.5f}, g[3] = {0.1f, -0.3f, 2.0f}, s1[3] = {0}, s2[3] = {0};
	struct tr_optim_hp hp = tr_optim_hp_from_spec(&s, lr, 1);
	cr_assert_eq(tr_optim_apply(be, 0, type, 3, p, g, s1, s2, &hp), 0);
	for (int i = 0; i < 3; i++)
		cr_assert(fabs(p[i] - want[i]) <= 1e-6 * fabs(want[i]), "type %d [%d]: %.9g vs %.9g", type, i,
			  (double)p[i], want[i]);
}

Test(optim, literal_one_step)
{
	/* p *= 1 - lr*wd; p -= lr * g / (|g| + eps) on the first step */
	static const double adamw[3] = {0.9890000009999999, -1.9880000003333334, 0.48950000005};
	/* g += wd * p first */
	static const double adam[3] = {0.9900000004999999, -1.9900000002, 0.49000000004878047};
	/* g += wd*p; buf = g; g += momentum * buf; p -= lr * g */
	static const double nesterov[3] = {0.9791, -1.9392, 0.11904999999999999};
	one_step_literal(TR_OPT_ADAMW, 0.01f, 0.1f, 0, false, adamw);
	one_step_literal(TR_OPT_ADAM, 0.01f, 0.1f, 0, false, adam);
	one_step_literal(TR_OPT_SGD, 0.1f, 0.01f, 0.9f, true, nesterov);
}

Test(optim, bad_arguments)
{
	struct tr_spec s = make_spec(TR_OPT_SGD, 0.1f);
	s.optimizer.momentum = 0.9f;
	float p[2] = {0}, g[2] = {0}, m[2] = {0};
	struct tr_optim_hp hp = tr_optim_hp_from_spec(&s, 0.1f, 1);
	cr_assert_eq(tr_optim_apply(be, 0, TR_OPT_SGD, 2, p, g, NULL, NULL, &hp), -EINVAL);
	hp.step = 0;
	cr_assert_eq(tr_optim_apply(be, 0, TR_OPT_SGD, 2, p, g, m, NULL, &hp), -EINVAL);
	cr_assert_eq(tr_optim_apply(be, 0, TR_OPT_ADAM, 2, p, g, m, NULL, &hp), -EINVAL);
	cr_assert_eq(tr_optim_apply(be, 0, (enum tr_optim_type)42, 2, p, g, m, NULL, &hp), -EINVAL);
	cr_assert_eq(tr_optim_state_buffers((enum tr_optim_type)42, &s), -EINVAL);
}

/* The out-of-place kernels (zero-copy snapshots) must give the in-place
 * results bit for bit, leave their inputs as they were, and refuse outputs
 * that overlap the inputs.  1031 elements: the vectorised body and its
 * remainder both run. */
#define M 1031

static void fill(float *x, size_t n, uint64_t seed, float scale)
{
	for (size_t i = 0; i < n; i++) {
		seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
		x[i] = scale * ((float)(seed >> 40) / (float)(1 << 24) - 0.5f);
	}
}

static void into_matches_in_place(const char *what, const struct tr_spec *spec)
{
	enum tr_optim_type type = spec->optimizer.type;
	size_t bytes = M * sizeof(float);
	/* set 0: updated in place; sets 1 and 2: updated from one into the
	 * other, alternately; 3: copy of the inputs of the latest update */
	float *buf[4][3];
	for (int k = 0; k < 4; k++)
		for (int b = 0; b < 3; b++)
			buf[k][b] = be->i->alloc(be, 0, bytes);
	float *g = be->i->alloc(be, 0, bytes);
	fill(buf[0][0], M, 1, 4.0f);
	fill(buf[0][1], M, 2, 0.5f);
	fill(buf[0][2], M, 3, 0.0f); /* second moments start at zero */
	for (int b = 0; b < 3; b++)
		memcpy(buf[1][b], buf[0][b], bytes);
	int from = 1;
	for (int step = 1; step <= 3; step++) {
		fill(g, M, 10 + (uint64_t)step, 2.0f);
		struct tr_optim_hp hp = tr_optim_hp_from_spec(spec, spec->optimizer.lr, step);
		int to = 3 - from;
		for (int b = 0; b < 3; b++)
			memcpy(buf[3][b], buf[from][b], bytes);
		cr_assert_eq(tr_optim_apply(be, 0, type, M, buf[0][0], g, buf[0][1], buf[0][2], &hp), 0, "%s: %s", what,
			     be->i->last_error(be));
		cr_assert_eq(tr_optim_apply_into(be, 0, type, M, buf[from][0], g, buf[from][1], buf[from][2],
						 buf[to][0], buf[to][1], buf[to][2], &hp),
			     0, "%s: %s", what, be->i->last_error(be));
		for (int b = 0; b < 3; b++) {
			cr_assert_eq(memcmp(buf[from][b], buf[3][b], bytes), 0,
				     "%s step %d: buffer %d of the inputs changed", what, step, b);
			if (b == 0 || (b == 1 && tr_optim_state_buffers(type, spec) >= 1) ||
			    tr_optim_state_buffers(type, spec) == 2)
				cr_assert_eq(memcmp(buf[to][b], buf[0][b], bytes), 0,
					     "%s step %d: buffer %d differs from the in-place update", what, step, b);
		}
		from = to;
	}
	for (int k = 0; k < 4; k++)
		for (int b = 0; b < 3; b++)
			be->i->free(be, 0, buf[k][b]);
	be->i->free(be, 0, g);
}

/* Updates of many parameters are cut into chunks the device's threads
 * take: every element, chunk edges and the tail included, must get the
 * same bits as when it is updated alone. */
Test(optim, chunked_updates_match_one_element_at_a_time)
{
	enum { MANY = 3 * 65536 + 77 };
	tr_backend_t *two = tr_cpu_backend_create(1, 2);
	cr_assert(two);
	float *p = malloc(4 * MANY * sizeof(float)), *g = p + MANY, *s1 = p + 2 * MANY, *s2 = p + 3 * MANY;
	float *q = malloc(4 * MANY * sizeof(float)), *t1 = q + 2 * MANY, *t2 = q + 3 * MANY;
	cr_assert(p && q);
	for (size_t i = 0; i < 4 * (size_t)MANY; i++)
		p[i] = (float)sin((double)i * 0.001) * 0.5f;
	for (size_t i = 0; i < MANY; i++) /* Adam's second moment is never negative */
		s2[i] = fabsf(s2[i]);
	memcpy(q, p, 4 * MANY * sizeof(float));
	struct tr_spec sgd = make_spec(TR_OPT_SGD, 0.05f), adam = make_spec(TR_OPT_ADAMW, 0.01f);
	sgd.optimizer.momentum = 0.9f;
	sgd.optimizer.weight_decay = 0.01f;
	adam.optimizer.weight_decay = 0.02f;
	for (int step = 1; step <= 2; step++) {
		const struct tr_spec *spec = step == 1 ? &sgd : &adam;
		struct tr_optim_hp hp = tr_optim_hp_from_spec(spec, spec->optimizer.lr, step);
		cr_assert_eq(tr_optim_apply(two, 0, spec->optimizer.type, MANY, p, g, s1, s2, &hp), 0, "%s",
			     two->i->last_error(two));
		for (size_t i = 0; i < MANY; i++)
			cr_assert_eq(tr_optim_apply(be, 0, spec->optimizer.type, 1, q + i, g + i, t1 + i, t2 + i, &hp),
				     0);
		cr_assert(!memcmp(p, q, MANY * sizeof(float)), "step %d: parameters differ", step);
		cr_assert(!memcmp(s1, t1, MANY * sizeof(float)), "step %d: first state differs", step);
		if (step == 2)
			cr_assert(!memcmp(s2, t2, MANY * sizeof(float)), "second state differs");
	}
	free(p);
	free(q);
	tr_backend_destroy(two);
}

Test(optim, into_matches_in_place)
{
	struct tr_spec s = make_spec(TR_OPT_SGD, 0.1f);
	into_matches_in_place("sgd", &s);
	s.optimizer.momentum = 0.9f;
	s.optimizer.dampening = 0.1f;
	s.optimizer.weight_decay = 0.01f;
	into_matches_in_place("sgd momentum", &s);
	s.optimizer.dampening = 0.0f;
	s.optimizer.nesterov = true;
	into_matches_in_place("sgd nesterov", &s);
	s = make_spec(TR_OPT_ADAM, 0.01f);
	s.optimizer.weight_decay = 0.01f;
	into_matches_in_place("adam", &s);
	s.optimizer.type = TR_OPT_ADAMW;
	into_matches_in_place("adamw", &s);
}

Test(optim, into_refuses_overlapping_outputs)
{
	struct tr_spec s = make_spec(TR_OPT_ADAM, 0.01f);
	float a[16] = {0}, b[16] = {0}, g[8] = {0};
	struct tr_optim_hp hp = tr_optim_hp_from_spec(&s, 0.01f, 1);
	/* param written over itself, or over half of the first moments */
	cr_assert_eq(tr_optim_apply_into(be, 0, TR_OPT_ADAM, 8, a, g, b, b + 8, a, a + 8, b + 4, &hp), -EINVAL);
	cr_assert_eq(tr_optim_apply_into(be, 0, TR_OPT_ADAM, 8, a, g, b, b + 8, a + 8, b + 4, a + 4, &hp), -EINVAL);
	cr_assert(strstr(be->i->last_error(be), "overlap"), "%s", be->i->last_error(be));
	s = make_spec(TR_OPT_SGD, 0.1f);
	s.optimizer.momentum = 0.9f;
	hp = tr_optim_hp_from_spec(&s, 0.1f, 2);
	cr_assert_eq(tr_optim_apply_into(be, 0, TR_OPT_SGD, 8, a, g, b, NULL, a + 2, b + 8, NULL, &hp), -EINVAL);
	cr_assert_eq(tr_optim_apply_into(be, 0, TR_OPT_SGD, 8, a, g, b, NULL, a + 8, b, NULL, &hp), -EINVAL);
	/* an output over the gradient, or two outputs over each other */
	cr_assert_eq(tr_optim_apply_into(be, 0, TR_OPT_SGD, 8, a, g, b, NULL, g, b + 8, NULL, &hp), -EINVAL);
	cr_assert_eq(tr_optim_apply_into(be, 0, TR_OPT_SGD, 8, a, g, b, NULL, a + 8, a + 12, NULL, &hp), -EINVAL);
	/* disjoint: fine */
	cr_assert_eq(tr_optim_apply_into(be, 0, TR_OPT_SGD, 8, a, g, b, NULL, a + 8, b + 8, NULL, &hp), 0, "%s",
		     be->i->last_error(be));
}

/* ---- schedules ------------------------------------------------------------- */

static struct tr_spec sched_spec(enum tr_sched_type type, int64_t warmup)
{
	struct tr_spec s = make_spec(TR_OPT_SGD, 0.1f);
	s.schedule.type = type;
	s.schedule.warmup_steps = warmup;
	s.schedule.step_size = 10;
	s.schedule.gamma = 0.5f;
	s.schedule.min_lr = 0.01f;
	return s;
}

static void expect_lr(const struct tr_spec *s, int64_t step, int64_t total, double want)
{
	float got = tr_schedule_lr(s, step, total);
	cr_assert(fabs(got - want) <= 1e-6 * fabs(want) + 1e-9, "schedule %d step %lld of %lld: %.9g vs %.9g",
		  s->schedule.type, (long long)step, (long long)total, (double)got, want);
}

Test(schedule, warmup_boundaries)
{
	static const enum tr_sched_type types[] = {TR_SCHED_CONSTANT, TR_SCHED_STEP, TR_SCHED_COSINE, TR_SCHED_LINEAR};
	const double base = (double)0.1f;
	for (int k = 0; k < 4; k++) {
		struct tr_spec s = sched_spec(types[k], 4);
		expect_lr(&s, 0, 100, base * 0.25);
		expect_lr(&s, 1, 100, base * 0.5);
		expect_lr(&s, 3, 100, base);
		expect_lr(&s, 4, 100, base); /* first post-warmup step: t = 0 */
	}
}

Test(schedule, constant_and_step)
{
	const double base = (double)0.1f, gamma = (double)0.5f;
	struct tr_spec s = sched_spec(TR_SCHED_CONSTANT, 0);
	expect_lr(&s, 0, 10, base);
	expect_lr(&s, 9, 10, base);
	expect_lr(&s, 1000, 10, base);

	s = sched_spec(TR_SCHED_STEP, 0);
	expect_lr(&s, 0, 100, base);
	expect_lr(&s, 9, 100, base);
	expect_lr(&s, 10, 100, base * gamma);
	expect_lr(&s, 25, 100, base * gamma * gamma);
	s = sched_spec(TR_SCHED_STEP, 5);
	expect_lr(&s, 14, 100, base);
	expect_lr(&s, 15, 100, base * gamma);
	expect_lr(&s, 34, 100, base * gamma * gamma);
	s.schedule.step_size = 0;
	expect_lr(&s, 50, 100, base);
}

Test(schedule, cosine)
{
	const double base = (double)0.1f, mn = (double)0.01f;
	struct tr_spec s = sched_spec(TR_SCHED_COSINE, 0);
	expect_lr(&s, 0, 100, base);
	expect_lr(&s, 50, 100, (base + mn) / 2);
	expect_lr(&s, 25, 100, mn + (base - mn) * (1 + cos(M_PI / 4)) / 2);
	expect_lr(&s, 100, 100, mn);
	expect_lr(&s, 150, 100, mn);
	/* with warmup: t and T both exclude the warmup steps */
	s = sched_spec(TR_SCHED_COSINE, 10);
	expect_lr(&s, 9, 110, base);
	expect_lr(&s, 60, 110, (base + mn) / 2);
	expect_lr(&s, 109, 110, mn + (base - mn) * (1 + cos(M_PI * 99 / 100)) / 2);
	/* a run no longer than its warmup stays at base afterwards */
	expect_lr(&s, 12, 10, base);
	/* literal: min 0, base 1, T = 3, t = 1 -> (1 + cos(pi/3)) / 2 = 0.75 */
	s.optimizer.lr = 1.0f;
	s.schedule.min_lr = 0.0f;
	s.schedule.warmup_steps = 0;
	expect_lr(&s, 1, 3, 0.75);
}

Test(schedule, linear)
{
	const double base = (double)0.1f, mn = (double)0.01f;
	struct tr_spec s = sched_spec(TR_SCHED_LINEAR, 0);
	expect_lr(&s, 0, 10, base);
	expect_lr(&s, 5, 10, (base + mn) / 2);
	expect_lr(&s, 10, 10, mn);
	expect_lr(&s, 20, 10, mn);
	s = sched_spec(TR_SCHED_LINEAR, 2);
	expect_lr(&s, 0, 12, base / 2);
	expect_lr(&s, 2, 12, base);
	expect_lr(&s, 7, 12, (base + mn) / 2);
	expect_lr(&s, 11, 12, base + (mn - base) * 0.9);
}
