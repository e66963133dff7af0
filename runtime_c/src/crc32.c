/**
 * @file crc32.c
 * @brief Integrity checks that read every weight byte, for the container readers
 *        (colibri_internal.h): zlib's CRC-32 by slicing-by-8 tables, or by PCLMULQDQ folding
 *        on x86-64 CPUs that have it, and the all-finite check of fp32 blobs. POSIX builds only
 *        (compiled out with COLIBRI_NO_FILESYSTEM).
 */
#ifndef COLIBRI_NO_FILESYSTEM

#define _POSIX_C_SOURCE 200809L

#include "colibri_internal.h"
#include "kernels_x86.h"
#include "model_file.h"

#include <stdint.h>
#if defined(COLIBRI_X86_DISPATCH)
#include <cpuid.h>
#include <immintrin.h>
#endif

/* ------------------------------------------------------------------------------------------ */
/* Integrity checks that read every weight byte (skippable for trusted files: load_flags)      */

/* zlib's CRC-32 (reflected polynomial 0xEDB88320), slicing-by-8: eight 256-entry tables. */
typedef colibri_crc32_tables crc32_tables;

static void crc32_tables_init(crc32_tables *ct)
{
    for (uint32_t i = 0; i < 256u; i++) {
        uint32_t c = i;
        for (int b = 0; b < 8; b++) {
            c = (c & 1u) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
        }
        ct->t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256u; i++) {
        for (int s = 1; s < 8; s++) {
            const uint32_t prev = ct->t[s - 1][i];
            ct->t[s][i] = (prev >> 8) ^ ct->t[0][prev & 0xFFu];
        }
    }
}

/* The register c of the CRC after n more bytes at p (no pre- or post-inversion). */
static uint32_t crc32_update(const crc32_tables *ct, uint32_t c, const unsigned char *p, uint64_t n)
{
    while (n >= 8u) {
        const uint32_t lo = c ^ rd_u32(p);
        const uint32_t hi = rd_u32(p + 4);
        c = ct->t[7][lo & 0xFFu] ^ ct->t[6][(lo >> 8) & 0xFFu] ^ ct->t[5][(lo >> 16) & 0xFFu] ^
            ct->t[4][lo >> 24] ^ ct->t[3][hi & 0xFFu] ^ ct->t[2][(hi >> 8) & 0xFFu] ^
            ct->t[1][(hi >> 16) & 0xFFu] ^ ct->t[0][hi >> 24];
        p += 8;
        n -= 8u;
    }
    while (n > 0u) {
        c = ct->t[0][(c ^ *p++) & 0xFFu] ^ (c >> 8);
        n--;
    }
    return c;
}

#if defined(COLIBRI_X86_DISPATCH)
/*
 * x86-64 with PCLMULQDQ (CPUID 1: ECX bit 1; every x86-64 CPU since about 2010): the same CRC by
 * folding. Reflected, a 16-byte block X (its first 8 bytes the low quadword) moved D bits further
 * along the message is congruent, modulo the polynomial, to clmul(X.lo, k1) ^ clmul(X.hi, k2)
 * with k1 = reflect32(x^(D + 31) mod P) and k2 = reflect32(x^(D - 33) mod P): a product of 96
 * bits that is simply xored into the block D bits on. Four blocks fold 64 bytes ahead
 * (D = 512) while at least 64 bytes are left, then into one another and the rest 16 at a time
 * (D = 128); the last 16-byte block stands for everything so far, so the tables finish it
 * (register 0) and then the under-16 tail. tests/c/test_crc.c checks it against a
 * bit-at-a-time loop and against crc32_update for every length 0..400 at every alignment.
 */
#define CRC_K512_LO 0x8F352D95u  /* x^543 mod P, reflected */
#define CRC_K512_HI 0x1D9513D7u  /* x^479 */
#define CRC_K128_LO 0xAE689191u  /* x^159 */
#define CRC_K128_HI 0xCCAA009Eu  /* x^95 */
#define CRC_K2048_LO 0xCE3371CBu /* x^2079: four 64-byte registers fold 256 bytes ahead */
#define CRC_K2048_HI 0xE95C1271u /* x^2015 */

/* CPUID once per process (a VM exit costs microseconds, and a container has a blob per
 * tensor): 0 unknown, 1 without, 2 with. Racing first calls store the same answer. */
static int crc32_have_clmul(void)
{
    static atomic_int known;
    int k = atomic_load_explicit(&known, memory_order_relaxed);
    if (k == 0) {
        unsigned a, b, c, d;
        k = (__get_cpuid(1, &a, &b, &c, &d) && ((c >> 1) & 1u)) ? 2 : 1;
        atomic_store_explicit(&known, k, memory_order_relaxed);
    }
    return k == 2;
}

/* VPCLMULQDQ on 512-bit registers (CPUID 7: ECX bit 10) where the kernels run AVX-512 (the
 * level says the OS saves the registers): 0 unknown, 1 without, 2 with. */
static int crc32_have_vpclmul(void)
{
    static atomic_int known;
    int k = atomic_load_explicit(&known, memory_order_relaxed);
    if (k == 0) {
        unsigned a, b, c, d;
        k = (colibri_kernel_level() == COLIBRI_KERNEL_AVX512_VNNI &&
             __get_cpuid_count(7, 0, &a, &b, &c, &d) && ((c >> 10) & 1u))
                ? 2
                : 1;
        atomic_store_explicit(&known, k, memory_order_relaxed);
    }
    return k == 2;
}

__attribute__((target("avx512f,vpclmulqdq"))) static __m512i crc32_fold512(__m512i x, __m512i k)
{
    return _mm512_xor_si512(_mm512_clmulepi64_epi128(x, k, 0x00),
                            _mm512_clmulepi64_epi128(x, k, 0x11));
}

/* The first n - n % 256 bytes (n >= 256) folded by four 512-bit registers (each 128-bit lane
 * folded as crc32_clmul folds one, D = 2048), then into one (D = 512): the 64-byte window
 * crc32_clmul's x[0..3] hold, its four lanes, for the bytes past it to be folded onto. c is
 * xored into the first four bytes as there. Four times the bytes a VPCLMULQDQ per instruction. */
__attribute__((target("avx512f,vpclmulqdq"))) static void
crc32_vpclmul(uint32_t c, const unsigned char *p, uint64_t n, __m128i *x)
{
    const __m512i k2048 =
        _mm512_broadcast_i32x4(_mm_set_epi64x((long long)CRC_K2048_HI, (long long)CRC_K2048_LO));
    const __m512i k512 =
        _mm512_broadcast_i32x4(_mm_set_epi64x((long long)CRC_K512_HI, (long long)CRC_K512_LO));
    __m512i z[4];
    for (int i = 0; i < 4; i++) {
        z[i] = _mm512_loadu_si512((const void *)(p + 64 * i));
    }
    z[0] = _mm512_xor_si512(z[0], _mm512_castsi128_si512(_mm_cvtsi32_si128((int)c)));
    p += 256;
    n -= 256u;
    while (n >= 256u) {
        for (int i = 0; i < 4; i++) {
            z[i] = _mm512_xor_si512(crc32_fold512(z[i], k2048),
                                    _mm512_loadu_si512((const void *)(p + 64 * i)));
        }
        p += 256;
        n -= 256u;
    }
    __m512i a = z[0];
    for (int i = 1; i < 4; i++) {
        a = _mm512_xor_si512(crc32_fold512(a, k512), z[i]);
    }
    x[0] = _mm512_extracti32x4_epi32(a, 0);
    x[1] = _mm512_extracti32x4_epi32(a, 1);
    x[2] = _mm512_extracti32x4_epi32(a, 2);
    x[3] = _mm512_extracti32x4_epi32(a, 3);
}

__attribute__((target("pclmul"))) static __m128i crc32_fold(__m128i x, __m128i k)
{
    return _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11));
}

__attribute__((target("pclmul"))) static uint32_t crc32_clmul(const crc32_tables *ct, uint32_t c,
                                                              const unsigned char *p, uint64_t n)
{
    if (n < 64u) {
        return crc32_update(ct, c, p, n);
    }
    const __m128i k512 = _mm_set_epi64x((long long)CRC_K512_HI, (long long)CRC_K512_LO);
    const __m128i k128 = _mm_set_epi64x((long long)CRC_K128_HI, (long long)CRC_K128_LO);
    __m128i x[4];
    if (n >= 256u && crc32_have_vpclmul()) { /* the window: the last 64 of the bytes folded */
        crc32_vpclmul(c, p, n, x);
        p += n - n % 256u;
        n %= 256u;
    } else {
        for (int i = 0; i < 4; i++) {
            x[i] = _mm_loadu_si128((const __m128i *)(const void *)(p + 16 * i));
        }
        x[0] = _mm_xor_si128(x[0], _mm_cvtsi32_si128((int)c));
        p += 64;
        n -= 64u;
    }
    while (n >= 64u) {
        for (int i = 0; i < 4; i++) {
            x[i] = _mm_xor_si128(crc32_fold(x[i], k512),
                                 _mm_loadu_si128((const __m128i *)(const void *)(p + 16 * i)));
        }
        p += 64;
        n -= 64u;
    }
    __m128i a = x[0];
    for (int i = 1; i < 4; i++) {
        a = _mm_xor_si128(crc32_fold(a, k128), x[i]);
    }
    while (n >= 16u) {
        a = _mm_xor_si128(crc32_fold(a, k128), _mm_loadu_si128((const __m128i *)(const void *)p));
        p += 16;
        n -= 16u;
    }
    unsigned char last[16];
    _mm_storeu_si128((__m128i *)(void *)last, a);
    return crc32_update(ct, crc32_update(ct, 0u, last, 16u), p, n);
}
#endif

/* zlib's crc32(crc, p, n): the register is the CRC's inverse between calls. */
static uint32_t crc32_more(const crc32_tables *ct, uint32_t crc, const unsigned char *p, uint64_t n)
{
#if defined(COLIBRI_X86_DISPATCH)
    if (crc32_have_clmul()) {
        return crc32_clmul(ct, crc ^ 0xFFFFFFFFu, p, n) ^ 0xFFFFFFFFu;
    }
#endif
    return crc32_update(ct, crc ^ 0xFFFFFFFFu, p, n) ^ 0xFFFFFFFFu;
}

static uint32_t crc32_of(const crc32_tables *ct, const unsigned char *p, uint64_t n)
{
    return crc32_more(ct, 0u, p, n);
}

/* 1 when all n fp32 values (little-endian, 4-aligned) are finite: exponent bits not all set.
 * Blocks of 1024 without branches so the compiler vectorises the scan. */
static int f32_all_finite(const unsigned char *p, uint64_t n)
{
    const uint32_t *w = (const uint32_t *)(const void *)p;
    while (n > 0u) {
        const uint64_t m = n < 1024u ? n : 1024u;
        uint32_t bad = 0;
        for (uint64_t i = 0; i < m; i++) {
            bad |= (uint32_t)((w[i] & 0x7F800000u) == 0x7F800000u);
        }
        if (bad != 0u) {
            return 0;
        }
        w += m;
        n -= m;
    }
    return 1;
}

void colibri_crc32_tables_init(colibri_crc32_tables *ct)
{
    crc32_tables_init(ct);
}

uint32_t colibri_crc32(const colibri_crc32_tables *ct, const unsigned char *p, uint64_t n)
{
    return crc32_of(ct, p, n);
}

uint32_t colibri_crc32_update(const colibri_crc32_tables *ct, uint32_t crc, const unsigned char *p,
                              uint64_t n)
{
    return crc32_more(ct, crc, p, n);
}

/* Polynomials over GF(2) modulo the CRC-32 polynomial, in the CRC's reflected bit order (bit
 * 31 is x^0): a times b. */
static uint32_t crc32_mulmod(uint32_t a, uint32_t b)
{
    uint32_t prod = 0;
    for (uint32_t bit = 0x80000000u; bit != 0u; bit >>= 1) {
        prod ^= (a & bit) != 0u ? b : 0u;
        b = (b & 1u) != 0u ? (b >> 1) ^ 0xEDB88320u : b >> 1; /* b times x */
    }
    return prod;
}

/* x^(8 n) modulo the polynomial: the shift n bytes appended to a message apply to its CRC. */
static uint32_t crc32_x8n(uint64_t n)
{
    uint32_t acc = 0x80000000u; /* x^0 */
    uint32_t sq = 0x00800000u;  /* x^8, squared for each bit of n */
    for (; n != 0u; n >>= 1) {
        acc = (n & 1u) != 0u ? crc32_mulmod(acc, sq) : acc;
        sq = crc32_mulmod(sq, sq);
    }
    return acc;
}

uint32_t colibri_crc32_shift(uint64_t len_b)
{
    return crc32_x8n(len_b);
}

uint32_t colibri_crc32_combine_op(uint32_t crc_a, uint32_t crc_b, uint32_t op)
{
    /* the pre- and post-inversion cancel: CRC(A B) = CRC(A) x^(8 |B|) + CRC(B) mod P */
    return crc32_mulmod(crc_a, op) ^ crc_b;
}

uint32_t colibri_crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b)
{
    return colibri_crc32_combine_op(crc_a, crc_b, crc32_x8n(len_b));
}

uint32_t colibri_crc32_portable(const colibri_crc32_tables *ct, const unsigned char *p, uint64_t n)
{
    return crc32_update(ct, 0xFFFFFFFFu, p, n) ^ 0xFFFFFFFFu;
}

int colibri_f32_all_finite(const unsigned char *p, uint64_t n)
{
    return f32_all_finite(p, n);
}

#else
/* ISO C forbids an empty translation unit. */
typedef int colibri_crc32_unused;
#endif /* COLIBRI_NO_FILESYSTEM */
