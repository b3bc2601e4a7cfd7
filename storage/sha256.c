/* SHA-256 as specified in FIPS 180-4 (sections 4.1.2, 4.2.2, 5.1.1, 5.3.3
 * and 6.2), written from the standard in portable C: checkpoints carry a
 * digest so that a damaged blob is refused at load instead of resuming a
 * job from silently corrupted weights.  Words are read big-endian byte by
 * byte, so the code needs no knowledge of the host's byte order.
 */
#include "storage/sha256.h"

#include <string.h>

#include "storage/checkpoints.h"

/* 4.2.2: the first 32 bits of the fractional parts of the cube roots of
 * the first 64 primes. */
static const uint32_t K[64] = {
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
	0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
	0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
	0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
	0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
	0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
	0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
	0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static inline uint32_t rotr(uint32_t x, unsigned n)
{
	return (x >> n) | (x << (32 - n));
}

/* 4.1.2 */
#define CH(x, y, z) (((x) & (y)) ^ (~(x) & (z)))
#define MAJ(x, y, z) (((x) & (y)) ^ ((x) & (z)) ^ ((y) & (z)))
#define BSIG0(x) (rotr((x), 2) ^ rotr((x), 13) ^ rotr((x), 22))
#define BSIG1(x) (rotr((x), 6) ^ rotr((x), 11) ^ rotr((x), 25))
#define SSIG0(x) (rotr((x), 7) ^ rotr((x), 18) ^ ((x) >> 3))
#define SSIG1(x) (rotr((x), 17) ^ rotr((x), 19) ^ ((x) >> 10))

/* 6.2.2: one 512-bit block.  The schedule is kept as a 16-word ring rather
 * than the 64-word array of the text: the same values, less stack. */
static void compress(uint32_t h[8], const unsigned char *p)
{
	uint32_t w[16];
	for (int t = 0; t < 16; t++)
		w[t] = (uint32_t)p[4 * t] << 24 | (uint32_t)p[4 * t + 1] << 16 | (uint32_t)p[4 * t + 2] << 8 |
		       (uint32_t)p[4 * t + 3];
	uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
	for (int t = 0; t < 64; t++) {
		uint32_t wt;
		if (t < 16) {
			wt = w[t];
		} else {
			wt = SSIG1(w[(t - 2) & 15]) + w[(t - 7) & 15] + SSIG0(w[(t - 15) & 15]) + w[t & 15];
			w[t & 15] = wt;
		}
		uint32_t t1 = hh + BSIG1(e) + CH(e, f, g) + K[t] + wt;
		uint32_t t2 = BSIG0(a) + MAJ(a, b, c);
		hh = g;
		g = f;
		f = e;
		e = d + t1;
		d = c;
		c = b;
		b = a;
		a = t1 + t2;
	}
	h[0] += a;
	h[1] += b;
	h[2] += c;
	h[3] += d;
	h[4] += e;
	h[5] += f;
	h[6] += g;
	h[7] += hh;
}

void tr_sha256_init(struct tr_sha256 *c)
{
	/* 5.3.3: the first 32 bits of the fractional parts of the square
	 * roots of the first 8 primes. */
	static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
				       0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
	memcpy(c->h, h0, sizeof h0);
	c->bytes = 0;
	c->nbuf = 0;
}

void tr_sha256_update(struct tr_sha256 *c, const void *data, size_t len)
{
	const unsigned char *p = data;
	c->bytes += len;
	if (c->nbuf) {
		size_t n = 64 - c->nbuf < len ? 64 - c->nbuf : len;
		memcpy(c->buf + c->nbuf, p, n);
		c->nbuf += n;
		p += n;
		len -= n;
		if (c->nbuf < 64)
			return;
		compress(c->h, c->buf);
		c->nbuf = 0;
	}
	/* Whole blocks straight from the caller's memory: no copy. */
	for (; len >= 64; p += 64, len -= 64)
		compress(c->h, p);
	if (len) {
		memcpy(c->buf, p, len);
		c->nbuf = len;
	}
}

void tr_sha256_final(struct tr_sha256 *c, unsigned char digest[32])
{
	/* 5.1.1: a 1 bit, zeros up to 448 mod 512 bits, then the message
	 * length in bits as a 64-bit big-endian integer. */
	uint64_t bits = c->bytes * 8;
	unsigned char pad[72] = {0x80};
	size_t npad = (c->nbuf < 56 ? 56 : 120) - c->nbuf;
	for (int i = 0; i < 8; i++)
		pad[npad + (size_t)i] = (unsigned char)(bits >> (56 - 8 * i));
	tr_sha256_update(c, pad, npad + 8);
	for (int i = 0; i < 8; i++) {
		digest[4 * i] = (unsigned char)(c->h[i] >> 24);
		digest[4 * i + 1] = (unsigned char)(c->h[i] >> 16);
		digest[4 * i + 2] = (unsigned char)(c->h[i] >> 8);
		digest[4 * i + 3] = (unsigned char)c->h[i];
	}
}

void tr_sha256_final_hex(struct tr_sha256 *c, char out[65])
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

void tr_sha256_hex(const void *data, size_t len, char out[65])
{
	struct tr_sha256 c;
	tr_sha256_init(&c);
	tr_sha256_update(&c, data, len);
	tr_sha256_final_hex(&c, out);
}
