/* Fuzz target: the job spec parser (tr_spec_parse_text), the first thing
 * every POST /jobs body reaches.  Any input must give 0 or -1 with a
 * message, never a crash or a leak. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/spec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *text = malloc(size + 1);
	struct tr_spec spec;
	struct tr_error err;

	if (!text)
		return 0;
	memcpy(text, data, size);
	text[size] = '\0';
	if (tr_spec_parse_text(text, &spec, &err) == 0) {
		(void)tr_spec_output_dim(&spec);
		tr_spec_finish(&spec);
	}
	free(text);
	return 0;
}
