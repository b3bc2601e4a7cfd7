/* Byte counts for people: "812 B", "29.3 kB", "1.2 GB" (powers of 1000,
 * one decimal above bytes).  One formatter for the daemon's log lines and
 * trainctl's tables and progress bars, so both show a size the same way. */
#ifndef TR_CORE_BYTES_H
#define TR_CORE_BYTES_H

#include <stddef.h>

/* Writes bytes (>= 0) into buf; TR_BYTES_LEN fits any count below
 * 10^18 bytes (longer text is cut, as snprintf cuts). */
void tr_fmt_bytes(char *buf, size_t len, double bytes);

#define TR_BYTES_LEN 24

#endif
