/* Fuzz target: the job spec parser (tr_spec_parse_text), the first thing
 * every POST /jobs body reaches, and the same document parsed collecting
 * every problem (tr_spec_parse_all, as POST /jobs does), which goes on past
 * bad values.  Any input must give 0 or -1 with a message, never a crash
 * or a leak, and both must agree on the first problem. */
#include <jansson.h>
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
	int rc = tr_spec_parse_text(text, &spec, &err);
	if (rc == 0) {
		(void)tr_spec_output_dim(&spec);
		tr_spec_finish(&spec);
	}
	json_t *doc = json_loads(text, JSON_REJECT_DUPLICATES, NULL);
	struct tr_error_list *all = doc ? malloc(sizeof *all) : NULL;
	if (all) {
		struct tr_error first;
		int rc_all = tr_spec_parse_all(doc, &spec, &first, all);
		if (rc_all == 0)
			tr_spec_finish(&spec);
		if (rc_all != rc || (rc != 0 && strcmp(first.message, err.message) != 0))
			abort(); /* the list's first problem is the one a plain parse reports */
	}
	free(all);
	json_decref(doc);
	free(text);
	return 0;
}
