/* SHA-256 as specified in FIPS 180-4 (sections 4.1.2, 4.2.2, 5.1.1, 5.3.3
 * and 6.2), written from the standard in portable C: checkpoints carry a
 * digest so that a damaged blob is refused at load instead of resuming a
 * job from silently corrupted weights.  Words are read big-endian byte by
 * byte, so the code needs no knowledge of the host's byte order.
 *
 * The portable block function runs at ~275 MB/s on the machines trainerd
 * is benchmarked on, which made hashing the slowest part of writing a
 * checkpoint; on x86 CPUs with the SHA extensions (Intel since Ice Lake /
 * Goldmont, AMD since Zen) a second block function uses them (~1.7 GB/s).
 * It is chosen at run time (CPUID), so one binary runs everywhere.
 */
#include "storage/sha256.h"

#include <stdatomic.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_SHA_NI 1
#include <cpuid.h>
#include <immintrin.h>
#endif

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
static void compress_one(uint32_t h[8], const unsigned char *p)
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

static void portable_blocks(uint32_t h[8], const unsigned char *p, size_t n)
{
	for (; n; n--, p += 64)
		compress_one(h, p);
}

#ifdef HAVE_SHA_NI
/* The same 64 rounds with the SHA extensions.  SHA256RNDS2 does two rounds
 * on the working variables packed as {A,B,E,F} and {C,D,G,H} (high lane
 * first), taking W[t] + K[t] for its two rounds from the low 64 bits of a
 * third operand; SHA256MSG1 and SHA256MSG2 compute the sigma0 and sigma1
 * halves of the message schedule (6.2.2 step 1) four words at a time.
 * Words are byte-swapped with PSHUFB, as the text reads them big-endian. */
__attribute__((target("sha,sse4.1,ssse3"))) static void sha_ni_blocks(uint32_t h[8], const unsigned char *p,
									size_t n)
{
	const __m128i bswap = _mm_set_epi8(12, 13, 14, 15, 8, 9, 10, 11, 4, 5, 6, 7, 0, 1, 2, 3);
	/* h[0..3] = {a,b,c,d} and h[4..7] = {e,f,g,h}, lane 0 first. */
	__m128i abcd = _mm_loadu_si128((const __m128i *)&h[0]);
	__m128i efgh = _mm_loadu_si128((const __m128i *)&h[4]);
	__m128i badc = _mm_shuffle_epi32(abcd, 0xB1);     /* lanes b,a,d,c */
	__m128i hgfe = _mm_shuffle_epi32(efgh, 0x1B);     /* lanes h,g,f,e */
	__m128i abef = _mm_alignr_epi8(badc, hgfe, 8);    /* lanes f,e,b,a */
	__m128i cdgh = _mm_blend_epi16(hgfe, badc, 0xF0); /* lanes h,g,d,c */
	for (; n; n--, p += 64) {
		__m128i abef0 = abef, cdgh0 = cdgh;
		__m128i w[4]; /* W[4i..4i+3] of the last four groups, a ring */
#pragma GCC unroll 16
		for (int i = 0; i < 16; i++) {
			__m128i *x = &w[i & 3];
			if (i < 4) {
				*x = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16 * i)), bswap);
			} else {
				/* W[t] = s1(W[t-2]) + W[t-7] + s0(W[t-15]) + W[t-16]: MSG1
				 * adds s0 to the oldest group, the W[t-7] come from the
				 * two newest, MSG2 adds s1 (of words it has just made, for
				 * the upper two lanes). */
				const __m128i newest = w[(i + 3) & 3], older = w[(i + 2) & 3];
				__m128i t = _mm_sha256msg1_epu32(*x, w[(i + 1) & 3]);
				t = _mm_add_epi32(t, _mm_alignr_epi8(newest, older, 4));
				*x = _mm_sha256msg2_epu32(t, newest);
			}
			__m128i wk = _mm_add_epi32(*x, _mm_loadu_si128((const __m128i *)&K[4 * i]));
			/* Two rounds turn {A,B,E,F} into the next {C,D,G,H}. */
			cdgh = _mm_sha256rnds2_epu32(cdgh, abef, wk);
			abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(wk, 0x0E));
		}
		abef = _mm_add_epi32(abef, abef0);
		cdgh = _mm_add_epi32(cdgh, cdgh0);
	}
	__m128i feba = _mm_shuffle_epi32(abef, 0x1B); /* lanes a,b,e,f */
	__m128i dchg = _mm_shuffle_epi32(cdgh, 0xB1); /* lanes g,h,c,d */
	_mm_storeu_si128((__m128i *)&h[0], _mm_blend_epi16(feba, dchg, 0xF0));
	_mm_storeu_si128((__m128i *)&h[4], _mm_alignr_epi8(dchg, feba, 8));
}

static bool cpu_has_sha_ni(void)
{
	unsigned a, b, c, d;
	if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_SSSE3) || !(c & bit_SSE4_1))
		return false;
	return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & bit_SHA);
}
#endif

bool tr_sha256_accelerated(void)
{
#ifdef HAVE_SHA_NI
	/* CPUID traps to the hypervisor in a VM: ask once. 0 = not yet. */
	static atomic_int known;
	int v = atomic_load_explicit(&known, memory_order_relaxed);
	if (v == 0) {
		v = cpu_has_sha_ni() ? 2 : 1;
		atomic_store_explicit(&known, v, memory_order_relaxed);
	}
	return v == 2;
#else
	return false;
#endif
}

void tr_sha256_init(struct tr_sha256 *c)
{
	tr_sha256_init_impl(c, TR_SHA256_AUTO);
}

void tr_sha256_init_impl(struct tr_sha256 *c, enum tr_sha256_impl impl)
{
	/* 5.3.3: the first 32 bits of the fractional parts of the square
	 * roots of the first 8 primes. */
	static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
				       0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
	memcpy(c->h, h0, sizeof h0);
	c->bytes = 0;
	c->nbuf = 0;
	c->blocks = portable_blocks;
#ifdef HAVE_SHA_NI
	if (impl == TR_SHA256_AUTO && tr_sha256_accelerated())
		c->blocks = sha_ni_blocks;
#else
	(void)impl;
#endif
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
		c->blocks(c->h, c->buf, 1);
		c->nbuf = 0;
	}
	/* Whole blocks straight from the caller's memory: no copy. */
	if (len >= 64) {
		c->blocks(c->h, p, len / 64);
		p += len / 64 * 64;
		len %= 64;
	}
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
