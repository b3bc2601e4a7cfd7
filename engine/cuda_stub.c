/* Stand-in for the CUDA backend when trainerd is built without CUDA: the
 * rest of the engine can ask for it and gets a clear "not built" answer. */
#include <stdio.h>

#include "engine/backend.h"
#include "engine/cuda/cuda.h"

tr_backend_t *tr_cuda_backend_create_opts(const struct tr_cuda_options *opt, char *err, size_t errlen)
{
	(void)opt;
	if (err && errlen)
		snprintf(err, errlen, "this trainerd was built without CUDA support (-Dcuda=disabled or no toolkit)");
	return NULL;
}

tr_backend_t *tr_cuda_backend_create(char *err, size_t errlen)
{
	return tr_cuda_backend_create_opts(NULL, err, errlen);
}

bool tr_cuda_available(void)
{
	return false;
}
