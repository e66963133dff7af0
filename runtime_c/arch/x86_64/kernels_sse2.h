/**
 * @file kernels_sse2.h
 * @brief SSE2 path of kernels_q.c (the base level of x86-64 hosts), selected by kernels_isa.h: the
 * int8 dot product (PMADDWD, 16 MACs) and the activation quantiser on whole blocks. The levels
 * above base are the files beside this one (x86_dispatch.c). Private to kernels_q.c.
 */
#ifndef COLIBRI_KERNELS_SSE2_H
#define COLIBRI_KERNELS_SSE2_H

#include "colibri_quant.h"

#include <emmintrin.h>
#include <stdint.h>
#include <string.h>

#define COLIBRI_DOT_SSE2 1

/* Lane-wise maximum of two vectors of non-negative int32 (SSE2 has no PMAXSD). */
static inline __m128i colibri_max_epi32_sse2(__m128i a, __m128i b)
{
    const __m128i gt = _mm_cmpgt_epi32(a, b);
    return _mm_or_si128(_mm_and_si128(gt, a), _mm_andnot_si128(gt, b));
}

/*
 * A whole block, SSE2, bit for bit colibri_quantize_block_q8_scalar when its max |x| is finite and
 * at least 2^-100 (returns 0, writing nothing, otherwise): as colibri_qi_quantize_row, t =
 * (int32_t)(x * (inv * 2^16)) (x * inv16 == (x * inv) * 2^16 exactly: scaling by a power of two
 * commutes with rounding, and a product below 2^-126 truncates to t = 0 either way) and code = (t +
 * 2^15 + (t >> 31)) >> 16, round(x * inv) half away from zero; |x * inv| <= 127 * (1 + 2^-23) needs
 * no clamp, and the codes fit the saturating packs unchanged.
 */
static int quantize_block_q8_sse2(const float *x, int8_t *xq, float *sx)
{
    const __m128i abs_mask = _mm_set1_epi32(0x7FFFFFFF);
    __m128i m = _mm_setzero_si128();
#pragma GCC unroll 8
    for (int32_t i = 0; i < COLIBRI_QK8; i += 4) {
        const __m128i bits = _mm_loadu_si128((const __m128i *)(const void *)(x + i));
        m = colibri_max_epi32_sse2(m, _mm_and_si128(bits, abs_mask));
    }
    m = colibri_max_epi32_sse2(m, _mm_shuffle_epi32(m, 0x4E));
    m = colibri_max_epi32_sse2(m, _mm_shuffle_epi32(m, 0xB1));
    const uint32_t abits = (uint32_t)_mm_cvtsi128_si32(m);
    if (abits < 0x0D800000u || abits >= 0x7F800000u) { /* below 2^-100, infinity or NaN */
        return 0;
    }
    float amax;
    memcpy(&amax, &abits, sizeof amax);
    const __m128 inv16 = _mm_set1_ps(((float)COLIBRI_Q8_MAX / amax) * 65536.0f);
    const __m128i half = _mm_set1_epi32(32768);
#pragma GCC unroll 2
    for (int32_t i = 0; i < COLIBRI_QK8; i += 16) {
        __m128i c[4];
#pragma GCC unroll 4
        for (int32_t j = 0; j < 4; j++) {
            const __m128i t = _mm_cvttps_epi32(_mm_mul_ps(_mm_loadu_ps(x + i + 4 * j), inv16));
            c[j] = _mm_srai_epi32(_mm_add_epi32(_mm_add_epi32(t, half), _mm_srai_epi32(t, 31)), 16);
        }
        const __m128i codes =
            _mm_packs_epi16(_mm_packs_epi32(c[0], c[1]), _mm_packs_epi32(c[2], c[3]));
        _mm_storeu_si128((__m128i *)(void *)(xq + i), codes);
    }
    *sx = amax / (float)COLIBRI_Q8_MAX;
    return 1;
}

/** @brief acc of a[0..i) . b[0..i) for the whole 16-byte vectors of n (*pi = i). */
static inline __attribute__((always_inline)) int32_t
colibri_sse2_dot_q8(const int8_t *a, const int8_t *b, int32_t n, int32_t *pi)
{
    int32_t acc = 0;
    int32_t i = 0;
    __m128i acc4 = _mm_setzero_si128();
    const __m128i zero = _mm_setzero_si128();
    for (; i + 16 <= n; i += 16) { /* sign-extend to int16, then PMADDWD pairs into int32 */
        const __m128i va = _mm_loadu_si128((const __m128i *)(const void *)(a + i));
        const __m128i vb = _mm_loadu_si128((const __m128i *)(const void *)(b + i));
        const __m128i sa = _mm_cmpgt_epi8(zero, va);
        const __m128i sb = _mm_cmpgt_epi8(zero, vb);
        acc4 = _mm_add_epi32(acc4,
                             _mm_madd_epi16(_mm_unpacklo_epi8(va, sa), _mm_unpacklo_epi8(vb, sb)));
        acc4 = _mm_add_epi32(acc4,
                             _mm_madd_epi16(_mm_unpackhi_epi8(va, sa), _mm_unpackhi_epi8(vb, sb)));
    }
    int32_t lanes[4];
    _mm_storeu_si128((__m128i *)(void *)lanes, acc4);
    acc = lanes[0] + lanes[1] + lanes[2] + lanes[3];
    *pi = i;
    return acc;
}
#define COLIBRI_ISA_DOT_Q8 colibri_sse2_dot_q8
#define COLIBRI_ISA_QUANTIZE_BLOCK_Q8 quantize_block_q8_sse2

#endif /* COLIBRI_KERNELS_SSE2_H */
