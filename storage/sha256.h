/* Incremental SHA-256 (FIPS 180-4), private to the storage library: the
 * checkpoint writer hashes a blob as it streams in and the reader as it
 * streams out, so neither needs the whole blob in memory.  The one-shot
 * tr_sha256_hex is declared in storage/checkpoints.h.
 *
 * Two implementations of the block function: the x86 SHA extensions
 * (SHA-NI, ~6x faster), chosen at init when the CPU has them, and portable
 * C everywhere else.  Both give the same digests (tests check them against
 * each other and against the FIPS vectors).
 */
#ifndef TR_STORE_SHA256_H
#define TR_STORE_SHA256_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum tr_sha256_impl {
	TR_SHA256_AUTO,     /* SHA-NI when the CPU has it, else portable */
	TR_SHA256_PORTABLE, /* always the C code (tests, comparisons) */
};

struct tr_sha256 {
	uint32_t h[8];
	uint64_t bytes;          /* message length so far */
	unsigned char buf[64];   /* a partial block */
	size_t nbuf;
	/* Compresses n whole 64-byte blocks into h. */
	void (*blocks)(uint32_t h[8], const unsigned char *p, size_t n);
};

void tr_sha256_init(struct tr_sha256 *c); /* TR_SHA256_AUTO */
void tr_sha256_init_impl(struct tr_sha256 *c, enum tr_sha256_impl impl);
/* Whether TR_SHA256_AUTO uses the SHA extensions on this CPU. */
bool tr_sha256_accelerated(void);
void tr_sha256_update(struct tr_sha256 *c, const void *data, size_t len);
/* Pads and writes the digest; c must be initialized again before reuse. */
void tr_sha256_final(struct tr_sha256 *c, unsigned char digest[32]);
void tr_sha256_final_hex(struct tr_sha256 *c, char out[65]); /* lowercase */

#endif
