/* Incremental SHA-256 (FIPS 180-4), private to the storage library: the
 * checkpoint writer hashes a blob as it streams in and the reader as it
 * streams out, so neither needs the whole blob in memory.  The one-shot
 * tr_sha256_hex is declared in storage/checkpoints.h.
 */
#ifndef TR_STORE_SHA256_H
#define TR_STORE_SHA256_H

#include <stddef.h>
#include <stdint.h>

struct tr_sha256 {
	uint32_t h[8];
	uint64_t bytes;          /* message length so far */
	unsigned char buf[64];   /* a partial block */
	size_t nbuf;
};

void tr_sha256_init(struct tr_sha256 *c);
void tr_sha256_update(struct tr_sha256 *c, const void *data, size_t len);
/* Pads and writes the digest; c must be initialized again before reuse. */
void tr_sha256_final(struct tr_sha256 *c, unsigned char digest[32]);
void tr_sha256_final_hex(struct tr_sha256 *c, char out[65]); /* lowercase */

#endif
