/* Stand-ins for a CUDA module, for the loader's tests
 * (tests/unit/engine/test_backend.c).  Built twice: as fake_cuda_module.so,
 * a module of "another build" whose interface and table size differ from
 * this one's, and with NOT_A_MODULE as not_a_cuda_module.so, a shared
 * object without the entry point. */
#include <stddef.h>

#include "engine/cuda/module.h"

#ifndef NOT_A_MODULE
static const struct tr_cuda_module other = {
	.abi = TR_CUDA_MODULE_ABI + 1,
	.table_size = sizeof(tr_backend_i) + 8,
	.version = "0.0-other",
};

__attribute__((visibility("default"))) const struct tr_cuda_module *tr_cuda_module_v1(void)
{
	return &other;
}
#else
__attribute__((visibility("default"))) int not_a_cuda_module(void)
{
	return 0;
}
#endif
