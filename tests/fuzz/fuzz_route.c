/* Fuzz target: request routing and query parsing as the server does them
 * on every request: the route match on method and path (with its
 * parameter capture), the Allow list for a 405, and the integer parser
 * behind every numeric query argument and Content-Length.  The input is
 * "METHOD\nPATH\nNUMBER". */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *text = malloc(size + 1), *parts[3] = {NULL, NULL, NULL};
	char params[TR_API_MAX_PARAMS][32], allow[128];
	int nparams = 0;
	bool known;
	int64_t v;

	if (!text)
		return 0;
	memcpy(text, data, size);
	text[size] = '\0';
	char *p = text;
	for (int i = 0; i < 3; i++) {
		parts[i] = p;
		p = p ? strchr(p, '\n') : NULL;
		if (p)
			*p++ = '\0';
	}
	const char *method = parts[0], *path = parts[1] ? parts[1] : "/", *number = parts[2] ? parts[2] : "";
	const struct tr_api_route *r = tr_api_route_match(method, path, params, TR_API_MAX_PARAMS, &nparams, &known);
	if (r) {
		/* Captured parameters are NUL-terminated and within bounds. */
		for (int i = 0; i < nparams; i++)
			if (strlen(params[i]) >= sizeof params[i])
				abort();
		(void)tr_api_route_role(r);
	} else if (known) {
		tr_api_route_allow(path, allow, sizeof allow);
	}
	(void)tr_api_parse_int(number, INT64_MIN, INT64_MAX, &v);
	(void)tr_api_parse_int(number, 0, 1000, &v);
	free(text);
	return 0;
}
