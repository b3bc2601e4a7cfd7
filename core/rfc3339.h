/* Times in the API's JSON and in log lines: RFC 3339, UTC, milliseconds
 * ("2026-12-01T17:25:34.120Z"), docs/design.md §8.  The store keeps Unix
 * seconds (a double); this is the one conversion to text and back. */
#ifndef TR_CORE_RFC3339_H
#define TR_CORE_RFC3339_H

#include <stdbool.h>
#include <stddef.h>

#define TR_RFC3339_LEN 32 /* buffer size that always fits */

/* Writes t (Unix seconds) into buf; false (buf "") when t is not a
 * positive finite time or does not fit a calendar year of four digits. */
bool tr_rfc3339_format(double t, char *buf, size_t len);
/* Parses "YYYY-MM-DDTHH:MM:SS[.frac](Z|+hh:mm|-hh:mm)" (T or t or a
 * space, Z or z) into Unix seconds; false when the text is not one. */
bool tr_rfc3339_parse(const char *text, double *t);

#endif
