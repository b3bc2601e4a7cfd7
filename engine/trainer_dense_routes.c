/* Each dense layer's route on CPU devices (docs/design.md, "Dense layers
 * on CPU devices"): OpenBLAS or oneDNN tiles, by tr_cpu_dense_route's
 * fixed rule or as the job names it.  The layers keep it, so every device
 * and every step of the job takes the same route (with several processes,
 * process 0's: share_routes in trainer_setup.c). */
#include <errno.h>
#include <stdio.h>

#include "engine/trainer_internal.h"

int tr_trainer_dense_routes(struct tr_trainer *t, struct tr_error *err)
{
	if (t->be->i->kind != TR_BACKEND_KIND_CPU)
		return 0;
	for (int i = 0; i < t->model.n_nodes; i++) {
		struct tr_layer *l = &t->model.layers[i];
		if (l->type != TR_LAYER_DENSE)
			continue;
		struct tr_dense_choice c;
		/* the spec's names follow enum tr_cpu_gemm */
		int rc = tr_cpu_dense_route(t->be, (enum tr_cpu_gemm)t->spec->cpu_dense, &c, err);
		if (rc == -ENOTSUP)
			tr_trainer_error_at(err, "/cpu_dense");
		if (rc < 0)
			return rc;
		l->gemm_route = c.route;
		const char *name = tr_cpu_dense_route_name(c.route);
		tr_trainer_logf(t, TR_LOG_INFO, "dense layer %s: %s (%s)", l->path, name,
				c.asked                         ? "as the job asks"
				: c.route == TR_CPU_GEMM_ONEDNN ? "oneDNN's matmul tiles, this build's default"
								: "this build has no oneDNN");
	}
	tr_trainer_show_routes(t, TR_LAYER_DENSE, "dense_routes");
	return 0;
}
