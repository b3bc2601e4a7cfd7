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
	static const enum tr_sched_type types[] = {TR_SCHED_CONSTANT, TR_SCHED_STEP, TR_SCHED_COSINE,
						   TR_SCHED_LINEAR};
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
