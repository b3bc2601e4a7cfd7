/* The files and folders a spec's data sources name (engine/spec.h,
 * tr_spec_paths): one list, so that resolving them against the daemon's
 * roots, opening them before a run and checking where a manifest's pods
 * will find them see the same keys and pointers. */
#include <stdio.h>

#include "engine/spec.h"

int tr_spec_paths(struct tr_spec *spec, struct tr_spec_path out[TR_SPEC_MAX_PATHS])
{
	struct {
		struct tr_source_spec *src;
		const char *base;
	} srcs[] = {{&spec->train, "/data/train"},
		    {&spec->validation, "/data/validation"},
		    {&spec->test, "/data/test"}};
	int n = 0;
	for (size_t i = 0; i < sizeof srcs / sizeof srcs[0]; i++) {
		struct tr_source_spec *s = srcs[i].src;
		if (!s->present)
			continue;
		struct {
			char **field;
			const char *key;
		} fields[] = {{&s->path, "path"},
			      {&s->x_path, "x"},
			      {&s->y_path, "y"},
			      {&s->images_path, "images"},
			      {&s->labels_path, "labels"},
			      {&s->input_path, "input_path"},
			      {&s->response_path, "response_path"}};
		for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++) {
			if (!*fields[f].field)
				continue;
			out[n].field = fields[f].field;
			snprintf(out[n].pointer, sizeof out[n].pointer, "%s/%s", srcs[i].base, fields[f].key);
			/* image sources name folders */
			out[n].dir = s->format == TR_DATA_IMAGES || s->format == TR_DATA_PATCHES;
			n++;
		}
	}
	return n;
}
