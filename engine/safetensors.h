/* safetensors files: the weights format trainerd writes and reads.
 *
 * Layout: 8-byte little-endian header length N, N bytes of JSON header
 * ({"<name>": {"dtype": "F32", "shape": [...], "data_offsets": [b, e]},
 * "__metadata__": {"k": "v"}}), then the raw little-endian data.  The
 * header is padded with spaces to a multiple of 8 so the data is aligned.
 */
#ifndef TR_SAFETENSORS_H
#define TR_SAFETENSORS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

struct tr_st_tensor {
	const char *name;
	int ndim;
	int64_t shape[4];
	const float *data; /* F32, product(shape) elements */
};

/* Writes atomically (temporary file, fsync, rename).  metadata (borrowed,
 * may be NULL) must be an object of string values.  Returns 0 or -errno
 * with err set. */
int tr_st_write(const char *path, const struct tr_st_tensor *tensors, int n, const json_t *metadata,
		struct tr_error *err);

/* Serialises into memory instead: *out (malloc'd, caller frees), *len. */
int tr_st_serialize(const struct tr_st_tensor *tensors, int n, const json_t *metadata, uint8_t **out, size_t *len,
		    struct tr_error *err);

typedef struct tr_st_file tr_st_file_t;

/* Opens and validates a file (header JSON, offsets inside the file, no
 * overlaps).  Errors name the file. */
int tr_st_open(const char *path, tr_st_file_t **out, struct tr_error *err);
/* The same over an open descriptor, owned from the call on (closed by
 * tr_st_close, or here on error); path names it in messages. */
int tr_st_open_fd(int fd, const char *path, tr_st_file_t **out, struct tr_error *err);
/* The same over a memory image (borrowed; must outlive the handle); label
 * names it in messages. */
int tr_st_open_mem(const void *data, size_t len, const char *label, tr_st_file_t **out, struct tr_error *err);
void tr_st_close(tr_st_file_t *f); /* accepts NULL */

/* Copies tensor `name` into dst after checking dtype F32 and that its shape
 * equals shape[0..ndim).  Errors name the tensor and both shapes. */
int tr_st_read_f32(tr_st_file_t *f, const char *name, int ndim, const int64_t *shape, float *dst, struct tr_error *err);

/* Copies the scalar counter `name` (shape [] or [1]) into *dst, from
 * dtype F32 or I64: PyTorch keeps counters such as batchnorm's
 * num_batches_tracked as int64 (safetensors.torch.save_file writes I64),
 * trainerd as float.  An I64 value past 2^24 is refused (a float would not
 * hold it exactly), so is a negative one. */
int tr_st_read_count(tr_st_file_t *f, const char *name, float *dst, struct tr_error *err);

/* Borrowed: the __metadata__ object or NULL. */
const json_t *tr_st_metadata(const tr_st_file_t *f);
/* Whether the file holds a tensor of that name. */
bool tr_st_has(const tr_st_file_t *f, const char *name);
/* Number of tensors in the file. */
int tr_st_count(const tr_st_file_t *f);

#endif
