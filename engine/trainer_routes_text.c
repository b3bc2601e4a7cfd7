/* The CPU routes of a model's conv2d or dense layers as one line of text,
 * "onednn,im2col", one name per layer in node order: the info fields
 * conv_routes and dense_routes, and a checkpoint's conv_routes
 * (trainer_conv_routes.c, trainer_dense_routes.c).
 */
#include <stdio.h>

#include "engine/trainer_internal.h"

static const char *route_name(const struct tr_layer *l)
{
	return l->type == TR_LAYER_CONV2D ? tr_cpu_conv_route_name((enum tr_cpu_conv)l->conv.route)
					  : tr_cpu_dense_route_name(l->gemm_route);
}

void tr_trainer_routes_text(const struct tr_trainer *t, enum tr_layer_type type, char *buf, size_t n)
{
	size_t used = 0;
	buf[0] = 0;
	if (t->be->i->kind != TR_BACKEND_KIND_CPU)
		return;
	for (int i = 0; i < t->model.n_nodes; i++) {
		const struct tr_layer *l = &t->model.layers[i];
		if (l->type != type)
			continue;
		int w = snprintf(buf + used, n - used, "%s%s", used ? "," : "", route_name(l));
		if (w < 0 || (size_t)w >= n - used) { /* a list cut short would name the wrong layers: none */
			buf[0] = 0;
			return;
		}
		used += (size_t)w;
	}
}

void tr_trainer_show_routes(struct tr_trainer *t, enum tr_layer_type type, const char *key)
{
	char routes[TR_ROUTES_TEXT];
	tr_trainer_routes_text(t, type, routes, sizeof routes);
	if (routes[0] && t->opt.hooks.info)
		t->opt.hooks.info(t->opt.hooks.ctx, key, routes);
}
