/* JSON text of a document whose numbers read back exactly and read well:
 * each real as the shortest of %.15g, %.16g and %.17g that reads back as
 * the same double ("0.1", not jansson's 17-digit "0.10000000000000001";
 * a value that needs 17 digits keeps them).  One helper for every stored
 * spec text and every document printed for people (trainctl's JSON, the
 * spec files `trainerd run` writes), so that none is shown the long way
 * and none loses a bit. */
#ifndef TR_CORE_JSON_TEXT_H
#define TR_CORE_JSON_TEXT_H

#include <jansson.h>
#include <stddef.h>

/* As json_dumps(j, flags) (its JSON_REAL_PRECISION is ignored), with each
 * real in its shortest exact form; still a real (1.0 stays "1.0").
 * malloc'd, or NULL as json_dumps gives it. */
char *tr_json_dumps(const json_t *j, size_t flags);

/* The same written to f followed by nothing.  0, or -1 when it could not be
 * made or written. */
int tr_json_dumpf(const json_t *j, FILE *f, size_t flags);

#endif
