/* Chains of oneDNN convolutions (engine/trainer_conv_routes.c tr_trainer_conv_chains,
 * tr_cpu_conv_chain_ok; docs/design.md, "Convolution on CPU devices"): a
 * job whose conv2d layers are joined by elementwise activations keeps the
 * activations between them in oneDNN's blocked layout.  It must train to
 * the same bits as with chains off, on one device and on two, and reorder
 * fewer activations; a layer that needs positions (dropout) breaks the
 * chain, max pooling does not.  Skipped, visibly, in a build without oneDNN.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/cpu/cpu_dnnl_conv.h"
#include "engine/spec.h"
#include "engine/trainer.h"

#define MAX_STEPS 64

struct result {
	double loss[MAX_STEPS];
	int64_t nloss;
	float *params;
	size_t nparams;
	unsigned long long reorders; /* activation reorders during the run */
};

static void collect(void *ctx, const struct tr_metric_point *p)
{
	struct result *r = ctx;
	if (strcmp(p->name, "loss") == 0 && p->step >= 1 && p->step <= MAX_STEPS) {
		r->loss[p->step - 1] = p->value;
		if (p->step > r->nloss)
			r->nloss = p->step;
	}
}

/* 16 -> 16 -> 16 -> 1 channels on 6x5 images: three conv2d layers, relu
 * and tanh between them; MIDDLE is put between the first two. */
#define JOB(MIDDLE)                                                                                                  \
	"{\"seed\": 5, \"model\": {\"inputs\": [16, 6, 5], \"layers\": [{\"type\": \"conv2d\", \"filters\": 16,"     \
	" \"kernel\": 3, \"padding\": 1}, " MIDDLE ", {\"type\": \"conv2d\", \"filters\": 16, \"kernel\": 3,"        \
	" \"padding\": 1}, {\"type\": \"tanh\"}, {\"type\": \"conv2d\", \"filters\": 1, \"kernel\": 3, \"padding\":" \
	" 1}], \"loss\": \"mse\"}, \"data\": {\"train\": {\"format\": \"synthetic\", \"task\": \"regression\","      \
	" \"samples\": 45, \"shape\": [16, 6, 5], \"outputs\": 30, \"noise\": 0.1}, \"shuffle\": true},"             \
	" \"batch_size\": 10, \"epochs\": 2, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.01, \"momentum\": 0.9}}"

static const char *CHAIN_JOB = JOB("{\"type\": \"relu\"}");
/* LeNet's pattern: conv, relu, max pooling, twice, then dense layers: the
 * first chain runs through the pooling to the second conv2d layer, the
 * second ends at its pooling, which writes NCHW for the flatten. */
static const char *POOL_JOB =
	"{\"seed\": 7, \"model\": {\"inputs\": [1, 12, 12], \"layers\": [{\"type\": \"conv2d\", \"filters\": 16,"
	" \"kernel\": 3, \"padding\": 1}, {\"type\": \"relu\"}, {\"type\": \"maxpool2d\", \"kernel\": 2},"
	" {\"type\": \"conv2d\", \"filters\": 32, \"kernel\": 3, \"padding\": 1}, {\"type\": \"relu\"},"
	" {\"type\": \"maxpool2d\", \"kernel\": 2}, {\"type\": \"flatten\"}, {\"type\": \"dense\", \"units\": 5}],"
	" \"loss\": \"mse\"}, \"data\": {\"train\": {\"format\": \"synthetic\", \"task\": \"regression\","
	" \"samples\": 45, \"shape\": [1, 12, 12], \"outputs\": 5, \"noise\": 0.1}, \"shuffle\": true},"
	" \"batch_size\": 10, \"epochs\": 2, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.01, \"momentum\": 0.9}}";
static const char *BROKEN_JOB = JOB("{\"type\": \"dropout\", \"rate\": 0.2}");

static void run(const char *text, int devices, bool chains, struct result *out)
{
	memset(out, 0, sizeof *out);
	struct tr_error err;
	struct tr_spec spec;
	cr_assert_eq(tr_spec_parse_text(text, &spec, &err), 0, "spec: %s", err.message);
	tr_backend_t *be = tr_cpu_backend_create(devices, 2);
	cr_assert_not_null(be);
	cr_assert_eq(tr_cpu_backend_set_conv(be, TR_CPU_CONV_ONEDNN, &err), 0, "%s", err.message);
	tr_cpu_backend_set_conv_chains(be, chains);
	struct tr_trainer_options opt = {.spec = &spec,
					 .backend = be,
					 .devices = devices,
					 .workers = 1,
					 .hooks = {.metric = collect, .ctx = out}};
	tr_trainer_t *t = NULL;
	cr_assert_eq(tr_trainer_create(&opt, &t, &err), 0, "%s", err.message);
	unsigned long long before = tr_dnnl_conv_activation_reorders();
	cr_assert_eq(tr_trainer_run(t, &err), 0, "%s", err.message);
	out->reorders = tr_dnnl_conv_activation_reorders() - before;
	out->nparams = tr_trainer_model(t)->n_params;
	out->params = malloc(out->nparams * sizeof(float));
	cr_assert_not_null(out->params);
	cr_assert_eq(tr_trainer_copy_params(t, 0, out->params), 0);
	tr_trainer_destroy(t);
	tr_spec_finish(&spec);
	tr_backend_destroy(be);
}

static void expect_same_bits(const struct result *a, const struct result *b, const char *what)
{
	cr_assert_gt(a->nloss, 0);
	cr_assert_eq(a->nloss, b->nloss, "%s", what);
	cr_assert(!memcmp(a->loss, b->loss, (size_t)a->nloss * sizeof a->loss[0]), "%s: the losses differ", what);
	cr_assert_eq(a->nparams, b->nparams);
	for (size_t i = 0; i < a->nparams; i++)
		cr_assert(!memcmp(&a->params[i], &b->params[i], sizeof(float)), "%s: weight %zu: %.9g vs %.9g", what, i,
			  (double)a->params[i], (double)b->params[i]);
}

static void skip_without_onednn(void)
{
	if (!tr_dnnl_available())
		cr_skip_test("this build has no oneDNN route");
}

/* The geometry of a padded 3x3 convolution of n samples, c -> k channels
 * on h x w images */
static struct tr_conv2d_geom conv3x3(int n, int c, int k, int h, int w)
{
	return (struct tr_conv2d_geom){.n = n,
				       .c = c,
				       .h = h,
				       .w = w,
				       .k = k,
				       .kh = 3,
				       .kw = 3,
				       .sh = 1,
				       .sw = 1,
				       .ph = 1,
				       .pw = 1,
				       .dh = 1,
				       .dw = 1,
				       .groups = 1,
				       .oh = h,
				       .ow = w};
}

/* `job` on 1 and 2 devices, chains off and on: the same bits, and, where
 * oneDNN prefers nChw16c for g's output (and its input too, with `in`),
 * at least `saved` fewer reorders with chains on. */
static void expect_chains_alike(const char *job, struct tr_conv2d_geom g, bool in, unsigned long long saved)
{
	for (int devices = 1; devices <= 2; devices++) {
		struct result off, on;
		run(job, devices, false, &off);
		run(job, devices, true, &on);
		expect_same_bits(&off, &on, devices == 1 ? "1 device" : "2 devices");
		if (tr_dnnl_conv_prefers_blocked(&g, true) && (!in || tr_dnnl_conv_prefers_blocked(&g, false)))
			cr_assert_leq(on.reorders + saved, off.reorders, "%llu reorders with chains, %llu without",
				      on.reorders, off.reorders);
		else
			cr_log_warn("oneDNN prefers another layout on this CPU: no chain to count");
		free(off.params), free(on.params);
	}
}

Test(conv_chain, same_bits_fewer_reorders_on_one_and_two_devices)
{
	skip_without_onednn();
	/* the two tensors inside the chain are no longer reordered: at least
	 * 2 x (forward out, in; backward in twice, out) */
	expect_chains_alike(CHAIN_JOB, conv3x3(10, 16, 16, 6, 5), true, 10);
}

/* dropout's mask is keyed by each element's position, so it breaks the
 * chain: the first two layers reorder as without chains. */
Test(conv_chain, dropout_between_convolutions_breaks_the_chain)
{
	skip_without_onednn();
	struct result off, on, chained;
	run(BROKEN_JOB, 1, false, &off);
	run(BROKEN_JOB, 1, true, &on);
	run(CHAIN_JOB, 1, true, &chained);
	expect_same_bits(&off, &on, "dropout between");
	cr_assert_gt(on.reorders, chained.reorders, "the second and third layers still chain, the first not");
	free(off.params), free(on.params), free(chained.params);
}

/* Chains through max pooling (cpu_pool_blocked.c): the same bits as
 * without chains, on one device and on two, and fewer reorders: at least
 * the first layer's output (forward out, backward in) and the second's
 * (forward out, backward in twice). */
Test(conv_chain, max_pooling_inside_a_chain_gives_the_same_bits)
{
	skip_without_onednn();
	expect_chains_alike(POOL_JOB, conv3x3(10, 1, 16, 12, 12), false, 5);
}
