/* Incremental SHA-256 for the storage library and trainctl: the checkpoint
 * writer hashes a blob as it streams in, the reader as it streams out, and
 * trainctl checks a download, so none needs the whole blob in memory.
 *
 * A thin layer over nettle's sha256 (Debian's libnettle is built "fat":
 * it picks the x86 SHA extensions at run time where the CPU has them).
 * nettle rather than OpenSSL's libcrypto, which hashed ~12% faster here
 * (bench/checkpoint/RESULTS.md): the daemon already maps nettle through
 * libmicrohttpd's GnuTLS, so it costs no library, no start-up time and no
 * resident memory (bench/startup).
 */
#ifndef TR_STORE_SHA256_H
#define TR_STORE_SHA256_H

#include <nettle/sha2.h>
#include <stddef.h>

struct tr_sha256 {
	struct sha256_ctx ctx;
};

static inline void tr_sha256_init(struct tr_sha256 *c)
{
	sha256_init(&c->ctx);
}

static inline void tr_sha256_update(struct tr_sha256 *c, const void *data, size_t len)
{
	sha256_update(&c->ctx, len, (const uint8_t *)data);
}

/* Writes the digest; c must be initialized again before reuse. */
static inline void tr_sha256_final(struct tr_sha256 *c, unsigned char digest[32])
{
	sha256_digest(&c->ctx, SHA256_DIGEST_SIZE, digest);
}

/* The digest as 64 lowercase hex digits and a NUL. */
static inline void tr_sha256_final_hex(struct tr_sha256 *c, char out[65])
{
	static const char hex[] = "0123456789abcdef";
	unsigned char d[32];
	tr_sha256_final(c, d);
	for (int i = 0; i < 32; i++) {
		out[2 * i] = hex[d[i] >> 4];
		out[2 * i + 1] = hex[d[i] & 15];
	}
	out[64] = '\0';
}

/* One-shot: the hex digest of data[0..len). */
static inline void tr_sha256_hex(const void *data, size_t len, char out[65])
{
	struct tr_sha256 c;
	tr_sha256_init(&c);
	tr_sha256_update(&c, data, len);
	tr_sha256_final_hex(&c, out);
}

#endif
