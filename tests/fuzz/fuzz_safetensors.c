/* Fuzz target: the safetensors reader over a memory image (checkpoints,
 * `init.from` weights).  After a successful open every tensor the header
 * lists is read back with the shape the header gives, so the offset and
 * size checks are exercised, not just the header parse. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Larger tensors are skipped: the point is the checks, not the copy. */
#define MAX_ELEMS ((int64_t)1 << 20)

static void read_all(tr_st_file_t *f, const uint8_t *data, size_t size)
{
	uint64_t hlen = 0;
	struct tr_error err;

	if (size < 8)
		return;
	for (int i = 7; i >= 0; i--)
		hlen = (hlen << 8) | data[i];
	if (hlen > size - 8)
		return;
	json_t *header = json_loadb((const char *)data + 8, (size_t)hlen, 0, NULL);
	const char *name;
	json_t *t;

	json_object_foreach(header, name, t) {
		json_t *shape = json_object_get(t, "shape");
		int64_t dims[8], elems = 1;
		size_t nd = json_array_size(shape);

		if (!json_is_array(shape) || nd > 8)
			continue;
		for (size_t d = 0; d < nd; d++) {
			json_t *v = json_array_get(shape, d);
			dims[d] = json_is_integer(v) ? json_integer_value(v) : -1;
			if (dims[d] < 0 || dims[d] > MAX_ELEMS || (elems *= dims[d]) > MAX_ELEMS)
				elems = MAX_ELEMS + 1;
		}
		if (elems > MAX_ELEMS)
			continue;
		float *dst = malloc((size_t)(elems ? elems : 1) * sizeof(float));
		if (dst)
			(void)tr_st_read_f32(f, name, (int)nd, dims, dst, &err);
		free(dst);
	}
	json_decref(header);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	tr_st_file_t *f = NULL;
	struct tr_error err;

	if (tr_st_open_mem(data, size, "fuzz", &f, &err) == 0) {
		(void)tr_st_metadata(f);
		(void)tr_st_count(f);
		read_all(f, data, size);
	}
	tr_st_close(f);
	return 0;
}
