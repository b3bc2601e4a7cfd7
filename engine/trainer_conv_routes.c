/* Each conv2d layer's route on CPU devices and the chains of oneDNN
 * layers between them (docs/design.md, "Convolution on CPU devices"):
 * chosen when a job starts, kept in its checkpoints, and taken from the
 * checkpoint when a job resumes, so that a resumed run computes as the
 * first did even where this process would have decided otherwise.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "engine/cpu/cpu_dnnl_conv.h"
#include "engine/trainer_internal.h"

/* Activations that need no layout: elementwise, whatever the order of the
 * elements (dropout's mask is keyed by position, so it is not one). */
static bool layout_free(enum tr_layer_type type)
{
	return type == TR_LAYER_RELU || type == TR_LAYER_GELU || type == TR_LAYER_TANH || type == TR_LAYER_SIGMOID;
}

/* The top-level conv2d layer that takes layer i's output with only
 * elementwise activations between them, when layer i is a conv2d: its
 * index, else -1.  Such pairs can chain (tr_trainer_conv_chains). */
static int next_conv(const tr_model_t *m, int i)
{
	int j = i + 1;
	while (j < m->n_layers && layout_free(m->layers[j].type))
		j++;
	if (m->layers[i].type != TR_LAYER_CONV2D || j >= m->n_layers || m->layers[j].type != TR_LAYER_CONV2D)
		return -1;
	return j;
}

/* Under "auto": two neighbours that chose different routes alone are
 * measured as a pair, because the reorders at the break between them
 * count against the pair and neither layer's own measurement sees them
 * (VDSR's first layer, 1 channel in, measured faster on im2col alone,
 * and its 64-channel output then cost the next layer a reorder each
 * way).  Left to right, so a layer moved to oneDNN is then weighed with
 * its other neighbour as it now stands. */
static int join_conv_pairs(struct tr_trainer *t, int rows, struct tr_error *err)
{
	tr_model_t *m = &t->model;
	for (int i = 0; i < m->n_layers; i++) {
		int j = next_conv(m, i);
		if (j < 0)
			continue;
		struct tr_layer *a = &m->layers[i], *b = &m->layers[j];
		struct tr_conv_pair_choice c;
		int rc = tr_cpu_conv_pair_route(t->be, t->devs[0], &a->conv, &b->conv, rows, &c, err);
		if (rc < 0)
			return rc;
		if (!c.chainable)
			continue;
		struct tr_layer *moved = a->conv.route == TR_CPU_CONV_IM2COL ? a : b;
		tr_trainer_logf(t, TR_LOG_INFO,
				"conv2d layers %s and %s as a pair (%s; forward + backward: as chosen alone %.2f ms, "
				"both oneDNN with its blocked layout between them %.2f ms): layer %s takes %s",
				a->path, b->path,
				c.measured ? "measured now at this job's rows per device"
					   : "measured before on this machine",
				c.split_ms, c.chain_ms, moved->path, c.join ? "onednn" : "im2col as before");
		if (c.join)
			moved->conv.route = TR_CPU_CONV_ONEDNN;
	}
	return 0;
}

/* Each conv2d layer's route on CPU devices (docs/design.md, "Convolution
 * on CPU devices"): the spec's cpu_conv, else the backend's setting; "auto"
 * is measured at this job's rows per device (or taken from what this
 * machine measured before), per layer and then per pair of neighbours
 * (join_conv_pairs), logged, shown as the info field conv_routes and kept
 * in checkpoints (tr_trainer_routes_text).
 * The layers keep it, so every device and every step of the job takes
 * the same route. */
int tr_trainer_conv_routes(struct tr_trainer *t, int rows, struct tr_error *err)
{
	static const enum tr_cpu_conv want_of[] = {[TR_SPEC_CONV_AUTO] = TR_CPU_CONV_AUTO,
						   [TR_SPEC_CONV_IM2COL] = TR_CPU_CONV_IM2COL,
						   [TR_SPEC_CONV_ONEDNN] = TR_CPU_CONV_ONEDNN};
	if (t->be->i->kind != TR_BACKEND_KIND_CPU)
		return 0;
	/* no cpu_conv in the spec: the daemon's setting */
	enum tr_cpu_conv want = t->spec->cpu_conv == TR_SPEC_CONV_DEFAULT ? tr_cpu_backend_conv(t->be)
									  : want_of[t->spec->cpu_conv];
	for (int i = 0; i < t->model.n_nodes; i++) {
		struct tr_layer *l = &t->model.layers[i];
		if (l->type != TR_LAYER_CONV2D)
			continue;
		struct tr_conv_choice c;
		l->conv.route = TR_CPU_CONV_AUTO;
		int rc = tr_cpu_conv_route(t->be, t->devs[0], &l->conv, rows, want, &c, err);
		if (rc == -ENOTSUP)
			tr_trainer_error_at(err, "/cpu_conv");
		if (rc < 0)
			return rc;
		l->conv.route = c.route;
		const char *name = tr_cpu_conv_route_name(c.route);
		if (c.im2col_ms > 0 || c.onednn_ms > 0)
			tr_trainer_logf(t, TR_LOG_INFO,
					"conv2d layer %s: %s (%s; forward + backward: im2col %.2f ms, oneDNN %.2f ms)",
					l->path, name,
					c.measured ? "measured now at this job's rows per device"
						   : "measured before on this machine",
					c.im2col_ms, c.onednn_ms);
		else
			tr_trainer_logf(t, TR_LOG_INFO, "conv2d layer %s: %s (as the job or daemon asks)", l->path,
					name);
	}
	int rc = want == TR_CPU_CONV_AUTO ? join_conv_pairs(t, rows, err) : 0;
	if (rc < 0)
		return rc;
	tr_trainer_show_routes(t, TR_LAYER_CONV2D, "conv_routes");
	return 0;
}

/* Layers a chain of oneDNN layers in its blocked layout runs through:
 * elementwise activations, and max pooling, which keeps the channels and
 * has a kernel for that layout (tr_cpu_maxpool_blocked). */
static bool chain_through(enum tr_layer_type type)
{
	return layout_free(type) || type == TR_LAYER_MAXPOOL2D;
}

/* Chains of top-level layers from a conv2d layer through elementwise
 * activations and max pooling keep the activations in oneDNN's blocked
 * layout where the backend allows (tr_cpu_conv_blocked_out_ok, _in_ok),
 * so only the chain's ends are reordered (docs/design.md, "Convolution on
 * CPU devices"): up to the next conv2d layer, or, where none follows, up
 * to the last max pooling, which writes NCHW itself.  After the routes:
 * only oneDNN layers chain.  The same bits either way. */
void tr_trainer_conv_chains(struct tr_trainer *t, int rows)
{
	tr_model_t *m = &t->model;
	if (t->be->i->kind != TR_BACKEND_KIND_CPU)
		return;
	for (int i = 0; i < m->n_layers; i++) {
		struct tr_layer *a = &m->layers[i];
		if (a->type != TR_LAYER_CONV2D)
			continue;
		int j = i + 1, last_pool = -1;
		for (; j < m->n_layers && chain_through(m->layers[j].type); j++)
			if (m->layers[j].type == TR_LAYER_MAXPOOL2D)
				last_pool = j;
		struct tr_layer *b = j < m->n_layers && m->layers[j].type == TR_LAYER_CONV2D ? &m->layers[j] : NULL;
		if (!tr_cpu_conv_blocked_out_ok(t->be, &a->conv, rows))
			continue;
		/* the layers between keep the channels, and the model the sizes */
		bool to_b = b && b->conv.c == a->conv.f && tr_cpu_conv_blocked_in_ok(t->be, &b->conv, rows);
		if (!to_b && last_pool < 0)
			continue;
		a->conv.y_blocked = 1;
		for (int k = i + 1; k < j; k++) {
			struct tr_layer *p = &m->layers[k];
			if (p->type == TR_LAYER_MAXPOOL2D) {
				p->pool.x_blocked = 1;
				p->pool.y_blocked = to_b || k != last_pool;
			}
		}
		if (to_b) {
			b->conv.x_blocked = 1;
			tr_trainer_logf(t, TR_LOG_INFO, "conv2d layers %s and %s: oneDNN's blocked layout between them",
					a->path, b->path);
		} else {
			tr_trainer_logf(
				t, TR_LOG_INFO,
				"conv2d layer %s: oneDNN's blocked layout up to maxpool2d layer %s, which writes "
				"NCHW",
				a->path, m->layers[last_pool].path);
		}
	}
}

/* The routes a checkpoint names, one per conv2d layer in node order, into
 * routes[]: their count, or -1 where the text is not such a list. */
static int parse_routes(const char *text, enum tr_cpu_conv *routes, int max)
{
	int n = 0;
	for (const char *p = text; *p;) {
		size_t len = strcspn(p, ",");
		if (n == max)
			return -1;
		if (len == 6 && !strncmp(p, "im2col", 6))
			routes[n++] = TR_CPU_CONV_IM2COL;
		else if (len == 6 && !strncmp(p, "onednn", 6))
			routes[n++] = TR_CPU_CONV_ONEDNN;
		else
			return -1;
		p += len;
		if (*p == ',' && *++p == 0)
			return -1;
	}
	return n;
}

void tr_trainer_conv_routes_adopt(struct tr_trainer *t, const char *text)
{
	tr_model_t *m = &t->model;
	char now[TR_ROUTES_TEXT];
	if (t->be->i->kind != TR_BACKEND_KIND_CPU || !text || !text[0])
		return; /* a checkpoint of another backend or an older build */
	tr_trainer_routes_text(t, TR_LAYER_CONV2D, now, sizeof now);
	if (!strcmp(now, text))
		return;
	int convs = 0;
	for (int i = 0; i < m->n_nodes; i++)
		convs += m->layers[i].type == TR_LAYER_CONV2D;
	enum tr_cpu_conv *routes = calloc((size_t)convs + 1, sizeof *routes);
	int n = routes ? parse_routes(text, routes, convs) : -1;
	bool need_dnnl = false;
	for (int i = 0; i < n; i++)
		need_dnnl = need_dnnl || routes[i] == TR_CPU_CONV_ONEDNN;
	if (n != convs || (need_dnnl && !tr_dnnl_available())) {
		tr_trainer_logf(t, TR_LOG_WARNING,
				"the checkpoint's conv2d routes (%s) %s: the resumed run keeps %s, so its results "
				"differ from an uninterrupted run's",
				text, n != convs ? "do not fit this model" : "need oneDNN, which this build lacks",
				now);
		free(routes);
		return;
	}
	for (int i = 0, k = 0; i < m->n_nodes; i++) {
		struct tr_layer *l = &m->layers[i];
		if (l->type != TR_LAYER_CONV2D)
			continue;
		l->conv.route = routes[k++];
	}
	for (int i = 0; i < m->n_nodes; i++) { /* chained as the routes now allow */
		struct tr_layer *l = &m->layers[i];
		if (l->type == TR_LAYER_CONV2D)
			l->conv.x_blocked = l->conv.y_blocked = 0;
		if (l->type == TR_LAYER_MAXPOOL2D)
			l->pool.x_blocked = l->pool.y_blocked = 0;
	}
	free(routes);
	tr_trainer_logf(t, TR_LOG_INFO, "conv2d routes from the checkpoint: %s (this process chose %s)", text, now);
	tr_trainer_conv_chains(t, tr_trainer_max_rows(t->spec, t->gdev));
	tr_trainer_show_routes(t, TR_LAYER_CONV2D, "conv_routes");
}
