/* The interface between trainerd and its CUDA module, trainerd-cuda.so.
 *
 * The CUDA backend (cuBLAS, NCCL and this project's kernels) is built as a
 * shared module, so that the trainerd executable links no CUDA library and
 * a machine without a GPU never maps one: cuBLAS alone is ~150 MB resident
 * once loaded (bench/startup).  engine/cuda/loader.c loads it with dlopen
 * when a command asks for CUDA on a machine with an NVIDIA driver, the way
 * ggml loads its backends.
 *
 * Where the loader looks, first match wins:
 *   1. the path a command gives (tr_cuda_options.module_path: the daemon's
 *      cuda-module setting), or else the TRAINERD_CUDA_MODULE environment
 *      variable: exactly that file, nothing else is tried;
 *   2. trainerd-cuda.so next to the executable (the build tree, and
 *      installs that keep both in one folder);
 *   3. TR_CUDA_MODULE_DIR/trainerd-cuda.so: <libdir>/trainerd of the
 *      install (meson sets it).
 *
 * The module exports one symbol, TR_CUDA_MODULE_ENTRY, a function that
 * returns its struct tr_cuda_module.  The loader refuses a module whose
 * abi or table_size differ from its own (a module of another build would
 * fill the table at the wrong offsets) and names both versions.
 */
#ifndef TR_CUDA_MODULE_H
#define TR_CUDA_MODULE_H

#include <stddef.h>

#include "engine/backend.h"
#include "engine/cuda/cuda.h"

#define TR_CUDA_MODULE_FILE "trainerd-cuda.so"
#define TR_CUDA_MODULE_ENTRY "tr_cuda_module_v1"
/* Raise when a struct below or the meaning of a table entry changes. */
#define TR_CUDA_MODULE_ABI 1

/* What the engine lends the module: the parts of the backend table that
 * depend on the model, which the module does not link. */
struct tr_cuda_host {
	size_t (*memory_estimate)(const struct tr_model *m, int max_rows, int label_dim, int opt_state_buffers,
				  int ndev);
	size_t memory_context_bytes;
};

struct tr_cuda_module {
	int abi;             /* TR_CUDA_MODULE_ABI */
	size_t table_size;   /* sizeof(tr_backend_i) the module was built with */
	const char *version; /* trainerd's version it was built with, for messages */
	/* Whether a GPU is usable: the device count (> 0), or a negative
	 * code with the reason in why. */
	int (*device_count)(char *why, size_t len);
	/* Fills every entry of the table (no device touched). */
	void (*fill_table)(tr_backend_i *t, const struct tr_cuda_host *host);
	tr_backend_t *(*create)(const struct tr_cuda_options *opt, const struct tr_cuda_host *host, char *err,
				size_t errlen);
};

typedef const struct tr_cuda_module *(*tr_cuda_module_entry_fn)(void);

#endif
