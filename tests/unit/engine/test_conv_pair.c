/* Two neighbouring conv2d layers whose "auto" routes, chosen alone,
 * differ (engine/cpu/cpu_conv_choice.c tr_cpu_conv_pair_route,
 * engine/trainer_setup.c join_conv_pairs; docs/design.md, "Convolution on
 * CPU devices"): the pair is measured as it would run both ways (each on
 * its own route with NCHW between them, or both on oneDNN with its
 * blocked layout between them), once, then remembered in the process and
 * in the machine's file; a job takes what the pair's decision says, and
 * a job that names its route is not second-guessed.  A checkpoint keeps
 * the routes, and a run resumed from it takes them even where its own
 * process decides otherwise (engine/trainer_conv_routes.c), so it ends
 * with the uninterrupted run's bits.  Skipped, visibly,
 * in a build without oneDNN or on a CPU where oneDNN would not chain the
 * two.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/backend.h"
#include "engine/checkpoint.h"
#include "engine/cpu/cpu_dnnl_conv.h"
#include "engine/spec.h"
#include "engine/trainer.h"

TestSuite(conv_pair, .timeout = 120);

/* A 3x3 convolution of c -> f channels on 12x12 images, padded to keep
 * the size: the JOB's layers below are 1 -> 16, 16 -> 16 and 16 -> 1. */
static struct tr_conv2d_desc conv3x3(int c, int f)
{
	return (struct tr_conv2d_desc){.c = c,
				       .f = f,
				       .h = 12,
				       .w = 12,
				       .ho = 12,
				       .wo = 12,
				       .kh = 3,
				       .kw = 3,
				       .sh = 1,
				       .sw = 1,
				       .ph = 1,
				       .pw = 1,
				       .dh = 1,
				       .dw = 1,
				       .groups = 1};
}

#define FIRST_KEY "c1 h12 w12 f16 k3x3 s1x1 p1x1 d1x1 g1"
#define SECOND_KEY "c16 h12 w12 f16 k3x3 s1x1 p1x1 d1x1 g1"
#define LAST_KEY "c16 h12 w12 f1 k3x3 s1x1 p1x1 d1x1 g1"

#define JOB(CPU_CONV)                                                                                                 \
	"{\"seed\": 3, " CPU_CONV "\"model\": {\"inputs\": [1, 12, 12], \"layers\": [{\"type\": \"conv2d\","          \
	" \"filters\": 16, \"kernel\": 3, \"padding\": 1}, {\"type\": \"relu\"}, {\"type\": \"conv2d\", \"filters\":" \
	" 16, \"kernel\": 3, \"padding\": 1}, {\"type\": \"relu\"}, {\"type\": \"conv2d\", \"filters\": 1,"           \
	" \"kernel\": 3, \"padding\": 1}], \"loss\": \"mse\"}, \"data\": {\"train\": {\"format\": \"synthetic\","     \
	" \"task\": \"regression\", \"samples\": 16, \"shape\": [1, 12, 12], \"outputs\": 144, \"noise\": 0.1}},"     \
	" \"batch_size\": 8, \"epochs\": 2, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.01}}"

static tr_backend_t *backend(void)
{
	struct tr_error err;
	tr_backend_t *be = tr_cpu_backend_create(1, 1);
	cr_assert(be);
	cr_assert_eq(tr_cpu_backend_set_conv(be, TR_CPU_CONV_AUTO, &err), 0, "%s", err.message);
	return be;
}

static void tmp_path(char *buf, size_t n)
{
	snprintf(buf, n, "/tmp/trainerd-conv-pair-%ld.json", (long)getpid());
	unlink(buf);
}

/* the pair, first on im2col and second on oneDNN, as a VDSR net's first
 * two layers chose alone; skips where oneDNN would not chain them */
static struct tr_conv_pair_choice ask(tr_backend_t *be, enum tr_cpu_conv a, enum tr_cpu_conv b)
{
	struct tr_conv2d_desc x = conv3x3(1, 16), y = conv3x3(16, 16);
	x.route = a;
	y.route = b;
	struct tr_conv_pair_choice c;
	struct tr_error err;
	cr_assert_eq(tr_cpu_conv_pair_route(be, 0, &x, &y, 8, &c, &err), 0, "%s", err.message);
	return c;
}

static void need_a_chain(tr_backend_t *be)
{
	if (!tr_dnnl_available())
		cr_skip_test("this build has no oneDNN (libdnnl-dev)");
	struct tr_conv2d_desc x = conv3x3(1, 16), y = conv3x3(16, 16);
	x.route = y.route = TR_CPU_CONV_ONEDNN;
	if (!tr_cpu_conv_chain_ok(be, &x, &y, 8))
		cr_skip_test("oneDNN prefers another layout for these shapes on this CPU: no chain to weigh");
}

Test(conv_pair, measured_once_as_a_pair_then_remembered)
{
	tr_cpu_conv_choices_forget();
	tr_backend_t *be = backend();
	need_a_chain(be);
	struct tr_conv_pair_choice a = ask(be, TR_CPU_CONV_IM2COL, TR_CPU_CONV_ONEDNN);
	cr_expect(a.chainable && a.measured, "the first ask measures the pair");
	cr_expect(a.split_ms > 0 && a.chain_ms > 0, "both ways timed: %g, %g", a.split_ms, a.chain_ms);
	cr_expect_eq(a.join, a.chain_ms < a.split_ms, "the faster way wins (%g split, %g chained)", a.split_ms,
		     a.chain_ms);
	struct tr_conv_pair_choice b = ask(be, TR_CPU_CONV_IM2COL, TR_CPU_CONV_ONEDNN);
	cr_expect(b.chainable && !b.measured, "the second ask remembers");
	cr_expect_eq(b.join, a.join);
	cr_expect_eq(b.split_ms, a.split_ms);
	/* the other way round is another pair */
	struct tr_conv_pair_choice c = ask(be, TR_CPU_CONV_ONEDNN, TR_CPU_CONV_IM2COL);
	cr_expect(c.chainable && c.measured, "routes are part of the pair's key");
	tr_cpu_conv_choices_forget();
	tr_backend_destroy(be);
}

Test(conv_pair, nothing_to_weigh_where_routes_agree_or_cannot_chain)
{
	tr_cpu_conv_choices_forget();
	tr_backend_t *be = backend();
	need_a_chain(be);
	struct tr_conv_pair_choice c = ask(be, TR_CPU_CONV_ONEDNN, TR_CPU_CONV_ONEDNN);
	cr_expect(!c.chainable && !c.measured && !c.join, "both on oneDNN already");
	c = ask(be, TR_CPU_CONV_IM2COL, TR_CPU_CONV_IM2COL);
	cr_expect(!c.chainable && !c.measured && !c.join, "both on im2col: no break between them to price");
	/* 15 channels between them: oneDNN's blocks are 16 wide, no chain */
	struct tr_conv2d_desc x = conv3x3(1, 16), y = conv3x3(16, 16);
	x.f = y.c = 15;
	x.route = TR_CPU_CONV_IM2COL;
	y.route = TR_CPU_CONV_ONEDNN;
	struct tr_error err;
	cr_assert_eq(tr_cpu_conv_pair_route(be, 0, &x, &y, 8, &c, &err), 0, "%s", err.message);
	cr_expect(!c.chainable && !c.measured && !c.join, "no chain possible");
	tr_backend_destroy(be);
}

static json_t *entry(const char *cpu, const char *shape, const char *route)
{
	return json_pack("{s:s,s:s,s:s,s:f,s:f}", "cpu", cpu, "shape", shape, "route", route, "im2col_ms", 1.0,
			 "onednn_ms", 2.0);
}

/* A machine file where the first layer alone chose im2col and the rest
 * oneDNN, and the pair decided `pair_route` ("onednn": join). */
static void write_file(const char *path, const char *cpu, const char *pair_route)
{
	json_t *entries = json_array();
	json_array_append_new(entries, entry(cpu, FIRST_KEY, "im2col"));
	json_array_append_new(entries, entry(cpu, SECOND_KEY, "onednn"));
	json_array_append_new(entries, entry(cpu, LAST_KEY, "onednn"));
	json_array_append_new(entries, entry(cpu, "pair " FIRST_KEY " im2col | " SECOND_KEY " onednn", pair_route));
	json_t *doc = json_pack("{s:o}", "entries", entries);
	cr_assert_eq(json_dump_file(doc, path, 0), 0);
	json_decref(doc);
}

static void keep_routes(void *ctx, const char *key, const char *value)
{
	if (!strcmp(key, "conv_routes"))
		snprintf(ctx, TR_ROUTES_TEXT, "%s", value);
}

/* The job's conv_routes, the machine file at `path` deciding. */
static void routes_of(const char *job, const char *path, char routes[TR_ROUTES_TEXT])
{
	struct tr_error err;
	struct tr_spec spec;
	routes[0] = 0;
	tr_cpu_conv_choices_forget();
	tr_cpu_conv_cache_open(path);
	cr_assert_eq(tr_spec_parse_text(job, &spec, &err), 0, "spec: %s", err.message);
	tr_backend_t *be = backend();
	struct tr_trainer_options opt = {.spec = &spec,
					 .backend = be,
					 .devices = 1,
					 .workers = 1,
					 .hooks = {.info = keep_routes, .ctx = routes}};
	tr_trainer_t *t = NULL;
	cr_assert_eq(tr_trainer_create(&opt, &t, &err), 0, "%s", err.message);
	cr_assert_eq(tr_trainer_run(t, &err), 0, "%s", err.message);
	tr_trainer_destroy(t);
	tr_spec_finish(&spec);
	tr_backend_destroy(be);
}

/* The machine's file names this CPU as the module writes it: learn the
 * spelling from an entry it wrote. */
static void this_cpu(const char *path, char *cpu, size_t n)
{
	tr_cpu_conv_choices_forget();
	tr_cpu_conv_cache_open(path);
	tr_backend_t *be = backend();
	struct tr_conv_choice c;
	struct tr_error err;
	struct tr_conv2d_desc first = conv3x3(1, 16);
	cr_assert_eq(tr_cpu_conv_route(be, 0, &first, 1, TR_CPU_CONV_AUTO, &c, &err), 0, "%s", err.message);
	tr_backend_destroy(be);
	json_error_t je;
	json_t *doc = json_load_file(path, 0, &je);
	cr_assert(doc, "%s", je.text);
	snprintf(cpu, n, "%s",
		 json_string_value(json_object_get(json_array_get(json_object_get(doc, "entries"), 0), "cpu")));
	json_decref(doc);
	unlink(path);
}

Test(conv_pair, a_job_takes_the_pairs_decision)
{
	char path[128], cpu[256], routes[TR_ROUTES_TEXT];
	tmp_path(path, sizeof path);
	tr_backend_t *be = backend();
	need_a_chain(be);
	tr_backend_destroy(be);
	this_cpu(path, cpu, sizeof cpu);

	write_file(path, cpu, "onednn");
	routes_of(JOB(""), path, routes);
	cr_expect_str_eq(routes, "onednn,onednn,onednn", "the pair joined: the first layer moves to oneDNN");

	write_file(path, cpu, "im2col");
	routes_of(JOB(""), path, routes);
	cr_expect_str_eq(routes, "im2col,onednn,onednn", "the pair kept apart: each layer as chosen alone");

	/* a job that names a route is not weighed in pairs */
	write_file(path, cpu, "onednn");
	routes_of(JOB("\"cpu_conv\": \"im2col\", "), path, routes);
	cr_expect_str_eq(routes, "im2col,im2col,im2col");
	tr_cpu_conv_choices_forget();
	unlink(path);
}

struct run {
	char routes[TR_ROUTES_TEXT]; /* the last conv_routes shown */
	struct tr_snapshot *snaps[8];
	int nsnaps;
};

static void keep_run_routes(void *ctx, const char *key, const char *value)
{
	struct run *r = ctx;
	keep_routes(r->routes, key, value);
}

static int keep_snapshot(void *ctx, struct tr_snapshot *snap, bool final)
{
	struct run *r = ctx;
	(void) final;
	if (r->nsnaps == 8)
		return -1;
	r->snaps[r->nsnaps++] = snap;
	return 0;
}

/* JOB's 4 steps (a checkpoint every 2), resumed from `from` if not NULL:
 * its final weights.  The machine file at `path` decides the routes. */
static float *train(const char *path, const struct tr_snapshot *from, struct run *r, size_t *n)
{
	struct tr_error err;
	struct tr_spec spec;
	memset(r, 0, sizeof *r);
	tr_cpu_conv_choices_forget();
	tr_cpu_conv_cache_open(path);
	cr_assert_eq(tr_spec_parse_text(JOB("\"checkpoint\": {\"every_steps\": 2}, "), &spec, &err), 0, "spec: %s",
		     err.message);
	tr_backend_t *be = backend();
	struct tr_trainer_options opt = {.spec = &spec,
					 .backend = be,
					 .devices = 1,
					 .workers = 1,
					 .hooks = {.info = keep_run_routes, .checkpoint = keep_snapshot, .ctx = r}};
	tr_trainer_t *t = NULL;
	cr_assert_eq(tr_trainer_create(&opt, &t, &err), 0, "%s", err.message);
	if (from)
		cr_assert_eq(tr_trainer_restore(t, from, false, &err), 0, "%s", err.message);
	cr_assert_eq(tr_trainer_run(t, &err), 0, "%s", err.message);
	*n = tr_trainer_model(t)->n_params;
	float *params = malloc(*n * sizeof(float));
	cr_assert(params);
	cr_assert_eq(tr_trainer_copy_params(t, 0, params), 0);
	tr_trainer_destroy(t);
	tr_spec_finish(&spec);
	tr_backend_destroy(be);
	return params;
}

static void free_run(struct run *r)
{
	for (int i = 0; i < r->nsnaps; i++)
		tr_snapshot_free(r->snaps[i]);
}

Test(conv_pair, a_resumed_run_takes_its_checkpoints_routes)
{
	char path[128], cpu[256];
	size_t n, n2, n3;
	tmp_path(path, sizeof path);
	tr_backend_t *be = backend();
	need_a_chain(be);
	tr_backend_destroy(be);
	this_cpu(path, cpu, sizeof cpu);

	struct run first_run, other, resumed;
	write_file(path, cpu, "im2col");
	float *straight = train(path, NULL, &first_run, &n);
	cr_assert_str_eq(first_run.routes, "im2col,onednn,onednn");
	cr_assert_geq(first_run.nsnaps, 2, "checkpoints at steps 2 and 4");
	const struct tr_snapshot *mid = first_run.snaps[0];
	cr_assert_eq(mid->step, 2);
	cr_expect_str_eq(json_string_value(json_object_get(mid->meta, "conv_routes")), "im2col,onednn,onednn",
			 "the checkpoint keeps the routes");

	/* this machine now decides otherwise (its file changed, or another machine) */
	write_file(path, cpu, "onednn");
	float *elsewise = train(path, NULL, &other, &n2);
	cr_assert_str_eq(other.routes, "onednn,onednn,onednn");
	cr_assert_eq(n2, n);
	if (memcmp(elsewise, straight, n * sizeof(float)) == 0) {
		free(straight), free(elsewise);
		free_run(&first_run), free_run(&other);
		tr_cpu_conv_choices_forget();
		unlink(path);
		cr_skip_test("im2col and oneDNN give the same bits for this job on this CPU: a resume could not tell "
			     "which routes it took");
	}

	float *again = train(path, mid, &resumed, &n3);
	cr_expect_str_eq(resumed.routes, "im2col,onednn,onednn", "the resumed run shows the checkpoint's routes");
	cr_expect(memcmp(again, straight, n * sizeof(float)) == 0,
		  "the resumed run ends with other bits than the uninterrupted one");
	free(straight), free(elsewise), free(again);
	free_run(&first_run), free_run(&other), free_run(&resumed);
	tr_cpu_conv_choices_forget();
	unlink(path);
}

/* 40 conv2d layers: their routes are longer than a line, and every layer
 * is listed (a list cut short would name the wrong layers). */
Test(conv_pair, every_layer_of_a_deep_net_is_listed)
{
	char path[128], routes[TR_ROUTES_TEXT], job[8192];
	size_t used = (size_t)snprintf(job, sizeof job,
				       "{\"seed\": 1, \"cpu_conv\": \"im2col\", \"model\": {\"inputs\": [1, 4, 4], "
				       "\"layers\": [");
	for (int i = 0; i < 40; i++)
		used += (size_t)snprintf(job + used, sizeof job - used,
					 "%s{\"type\": \"conv2d\", \"filters\": 1, \"kernel\": 3, \"padding\": 1}",
					 i ? ", " : "");
	snprintf(job + used, sizeof job - used,
		 "], \"loss\": \"mse\"}, \"data\": {\"train\": {\"format\": \"synthetic\", \"task\": \"regression\", "
		 "\"samples\": 4, \"shape\": [1, 4, 4], \"outputs\": 16}}, \"batch_size\": 4, \"max_steps\": 1, "
		 "\"optimizer\": {\"type\": \"sgd\", \"lr\": 0.01}}");
	tmp_path(path, sizeof path);
	routes_of(job, path, routes);
	int n = 0;
	for (const char *p = routes; (p = strstr(p, "im2col")); p += 6)
		n++;
	cr_expect_eq(n, 40, "40 layers, %d routes listed: %s", n, routes);
	tr_cpu_conv_choices_forget();
	unlink(path);
}
