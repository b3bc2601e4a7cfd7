/* The route of a dense layer's products on CPU devices
 * (tr_cpu_dense_route, docs/design.md "Dense layers on CPU devices").
 *
 * A fixed rule, not a measurement: oneDNN's matmul tiles wherever the
 * build has oneDNN, OpenBLAS's otherwise, or the route the job names.
 * The routes give different bits, and dense layers are in nearly every
 * model, so the choice must not depend on how busy the machine was when a
 * job started: two daemons, a `trainerd run` and a daemon's job, or a job
 * and its repeat, all take the same route on the same build.  (Measured
 * at the bench MLP's shapes, oneDNN's tiles ran 1.6-1.9x OpenBLAS's on an
 * AVX-512 machine whose OpenBLAS is held to its AVX2 kernels, and about
 * 2-5x on a single tile; bench/README.md.)
 */
#include <errno.h>

#include "engine/cpu/cpu_internal.h"

int tr_cpu_dense_route(tr_backend_t *be, enum tr_cpu_gemm want, struct tr_dense_choice *choice, struct tr_error *err)
{
	bool have_dnnl = tr_dnnl_available() && be->i->gemm_route;
	if (want == TR_CPU_GEMM_ONEDNN && !have_dnnl) {
		tr_error_set(err, 0, 0, NULL, "this build has no oneDNN matmul (install libdnnl-dev and rebuild)");
		return -ENOTSUP;
	}
	struct tr_dense_choice c = {.route = want, .asked = want != TR_CPU_GEMM_AUTO};
	if (want == TR_CPU_GEMM_AUTO)
		c.route = have_dnnl ? TR_CPU_GEMM_ONEDNN : TR_CPU_GEMM_OPENBLAS;
	if (choice)
		*choice = c;
	return 0;
}

const char *tr_cpu_dense_route_name(enum tr_cpu_gemm route)
{
	return route == TR_CPU_GEMM_ONEDNN ? "onednn" : route == TR_CPU_GEMM_OPENBLAS ? "openblas" : "auto";
}
