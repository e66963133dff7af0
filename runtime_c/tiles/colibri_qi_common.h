/**
 * @file colibri_qi_common.h
 * @brief Generated-code support (runtime_c/tiles): what every shape-specialised kernel of this
 *        directory shares: the core's ISA (COLIBRI_QI_MVE / COLIBRI_QI_SIMD32), COLIBRI_QI_INLINE,
 *        the non-fused multiply-add and the activation quantiser colibri_qi_quantize_row.
 */
#ifndef COLIBRI_QI_COMMON_H
#define COLIBRI_QI_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "colibri_quant.h"

#if defined(__ARM_FEATURE_MVE) && (__ARM_FEATURE_MVE & 1)
#include <arm_mve.h>
#define COLIBRI_QI_MVE 1
#elif defined(__ARM_FEATURE_SIMD32) && !defined(__ARM_NEON)
#include <arm_acle.h>
#define COLIBRI_QI_SIMD32 1
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define COLIBRI_QI_INLINE static inline __attribute__((always_inline))
/* A kernel of one out-of-line copy per translation unit (issue 40: code per expert kind): the
 * shared activation quantiser (colibri_qi_shared.h) and the cold paths of the inline kernels
 * (Helium's scalar fallbacks), whose shapes are run-time arguments. noinline / noclone: one
 * copy in a translation unit that calls it (GCC would otherwise clone it per set of constant
 * arguments); unused: none, and no warning, in one that does not once optimised (GCC keeps an
 * unused static function at -O0: there plain static inline, neither inlined nor kept unused). */
#if !defined(__OPTIMIZE__)
#define COLIBRI_QI_SHARED static inline
#elif defined(__clang__)
#define COLIBRI_QI_SHARED static __attribute__((noinline, unused))
#else
#define COLIBRI_QI_SHARED static __attribute__((noinline, noclone, unused))
#endif

/* The sums of the written-out kernels (4 or 8 rows or tokens, named p0, p1, ...): as asm output
 * operands [p0] c(p0), ... with constraint c ("=&r": started by the asm, "+r": added to), and
 * stored to dst[0], dst[1], ... afterwards. */
#define COLIBRI_QI_SUMS4(c, p) [p##0] c(p##0), [p##1] c(p##1), [p##2] c(p##2), [p##3] c(p##3)
#define COLIBRI_QI_SUMS8(c, p)                                                                     \
    COLIBRI_QI_SUMS4(c, p), [p##4] c(p##4), [p##5] c(p##5), [p##6] c(p##6), [p##7] c(p##7)
#define COLIBRI_QI_STORE4(dst, p)                                                                  \
    do {                                                                                           \
        (dst)[0] = p##0;                                                                           \
        (dst)[1] = p##1;                                                                           \
        (dst)[2] = p##2;                                                                           \
        (dst)[3] = p##3;                                                                           \
    } while (0)
#define COLIBRI_QI_STORE8(dst, p)                                                                  \
    do {                                                                                           \
        COLIBRI_QI_STORE4(dst, p);                                                                 \
        (dst)[4] = p##4;                                                                           \
        (dst)[5] = p##5;                                                                           \
        (dst)[6] = p##6;                                                                           \
        (dst)[7] = p##7;                                                                           \
    } while (0)

#if defined(COLIBRI_QI_SIMD32)
/** Four int8 codes as one word; may alias the int8 arrays it reads. */
typedef uint32_t __attribute__((may_alias, aligned(4))) colibri_qi_word;
#endif

/** a + b * c with the product rounded before the addition (VMLA is not fused: one
 *  instruction for the two that -ffp-contract=off leaves), as the library's acc += b * c. */
COLIBRI_QI_INLINE float colibri_qi_mla(float a, float b, float c)
{
#if (defined(COLIBRI_QI_MVE) || defined(COLIBRI_QI_SIMD32)) && defined(__ARM_FP) && (__ARM_FP & 4)
    __asm__("vmla.f32 %0, %1, %2" : "+t"(a) : "t"(b), "t"(c));
    return a;
#else
    return a + b * c;
#endif
}

#if defined(COLIBRI_QI_SIMD32) && defined(__ARM_FP) && (__ARM_FP & 4)
/** The Cortex-M4 / M7 with a single-precision FPU: colibri_qi_quantize_row's passes in
 *  assembly. */
#define COLIBRI_QI_VFP 1

/* one instruction per line: clang-format would reflow the string concatenation */
/* clang-format off */
/* one value's bits in v: m = max(m, v << 1) (the bits of |x|, shifted left by one) */
#define COLIBRI_QI_AMAX(v)                                                                         \
    "cmp %[m], %[" #v "], lsl #1\n"                                                                \
    "it lo\n"                                                                                      \
    "lsllo %[m], %[" #v "], #1\n"
#define COLIBRI_QI_AMAX2                                                                           \
    "ldrd %[a], %[b], [%[p]], #8\n"                                                                \
    COLIBRI_QI_AMAX(a)                                                                             \
    COLIBRI_QI_AMAX(b)
#define COLIBRI_QI_AMAX8 COLIBRI_QI_AMAX2 COLIBRI_QI_AMAX2 COLIBRI_QI_AMAX2 COLIBRI_QI_AMAX2
/* four values: t = (int32_t)(x * inv16) (VMUL, VCVT toward zero), u = t + (t >> 31) + k with
 * k = 2^15 + 2^23: bits 16..23 of u are code + 128 (colibri_qi_quantize_row's (t + 2^15 +
 * (t >> 31)) >> 16, plus 128) and bits 24..31 are 0 (|t| < 2^23); PKHTB packs values 0 and 2
 * (then 1 and 3) as bytes 0 and 2 of a word, the ORR both words into one, the EOR takes the
 * 128 away from each byte */
#define COLIBRI_QI_CODE(s)                                                                         \
    "vmul.f32 " s ", " s ", %[inv]\n"                                                              \
    "vcvt.s32.f32 " s ", " s "\n"
#define COLIBRI_QI_U(r)                                                                            \
    "add %[" #r "], %[" #r "], %[" #r "], asr #31\n"                                              \
    "add %[" #r "], %[" #r "], %[k]\n"
#define COLIBRI_QI_CODES4                                                                          \
    "vldmia %[p]!, {s0-s3}\n"                                                                      \
    COLIBRI_QI_CODE("s0")                                                                          \
    COLIBRI_QI_CODE("s1")                                                                          \
    COLIBRI_QI_CODE("s2")                                                                          \
    COLIBRI_QI_CODE("s3")                                                                          \
    "vmov %[a], %[b], s0, s1\n"                                                                    \
    "vmov %[c], %[d], s2, s3\n"                                                                    \
    COLIBRI_QI_U(a)                                                                                \
    COLIBRI_QI_U(b)                                                                                \
    COLIBRI_QI_U(c)                                                                                \
    COLIBRI_QI_U(d)                                                                                \
    "pkhtb %[a], %[c], %[a], asr #16\n"                                                            \
    "pkhtb %[b], %[d], %[b], asr #16\n"                                                            \
    "orr %[a], %[a], %[b], lsl #8\n"                                                               \
    "eor %[a], %[a], #0x80808080\n"                                                                \
    "str %[a], [%[q]], #4\n"
/* clang-format on */

/** The bits of max |x| over the 32 floats at x: the largest of the bits shifted left by one
 *  (the sign bit gone), shifted back. Per two values one LDRD, then per value a CMP with the
 *  shifted bits and a conditional LSL. */
COLIBRI_QI_INLINE uint32_t colibri_qi_absmax32(const float *x)
{
    uint32_t m = 0, a, b;
    const float *p = x;
    __asm__(COLIBRI_QI_AMAX8 COLIBRI_QI_AMAX8 COLIBRI_QI_AMAX8 COLIBRI_QI_AMAX8
            : [m] "+r"(m), [a] "=&r"(a), [b] "=&r"(b), [p] "+r"(p)
            : "m"(*(const float(*)[32])x)
            : "cc");
    return m >> 1;
}

/** colibri_qi_quantize_row's codes of one block: the 32 floats at x times inv16 to the 32 codes
 *  at xq (both 4-byte aligned). Per four values: one VLDM, 4 VMUL, 4 VCVT, 2 VMOV, 8 ADD, 2
 *  PKHTB, ORR, EOR, STR. */
COLIBRI_QI_INLINE void colibri_qi_codes32(const float *x, int8_t *xq, float inv16)
{
    const float *p = x;
    int8_t *q = xq;
    uint32_t a, b, c, d;
    const uint32_t k = 0x00808000u;
    __asm__(COLIBRI_QI_CODES4 COLIBRI_QI_CODES4 COLIBRI_QI_CODES4 COLIBRI_QI_CODES4
                COLIBRI_QI_CODES4 COLIBRI_QI_CODES4 COLIBRI_QI_CODES4 COLIBRI_QI_CODES4
            : [a] "=&r"(a), [b] "=&r"(b), [c] "=&r"(c), [d] "=&r"(d), [p] "+r"(p), [q] "+r"(q),
              "=m"(*(int8_t(*)[32])xq)
            : [inv] "t"(inv16), [k] "r"(k), "m"(*(const float(*)[32])x)
            : "s0", "s1", "s2", "s3");
}
#endif

/** Blocks whose max |x| is below this take the library's quantiser (see below). */
#define COLIBRI_QI_TINY_BITS 0x0D800000u /* 2^-100 */

/**
 * @brief colibri_quantize_row_q8, bit for bit, faster on the M-profile cores. A block with a
 *        finite max |x| of at least 2^-100 is quantised as t = (int32_t)(v * 2^16) (exact
 *        fixed point, truncated), code = (t + 2^15 + (t >> 31)) >>
 *        16, which is round(v) half away from zero without a branch or fabs, |v| <= 127 *
 *        (1 + 2^-23) needing no clamp; Helium does four lanes at a time. Helium's float
 *        operations flush subnormals to zero: with max |x| >= 2^-100 a subnormal x or v
 *        quantises to 0 either way. The last partial block (n not a multiple of 32) takes the
 *        same arithmetic over its r values (Helium: predicated lanes; the Cortex-M4 / M7: a
 *        scalar loop, no call), a small expert's whole row. Other blocks (zeros, tiny, NaN,
 *        infinity) go through the library. The Cortex-M4 / M7 with an FPU run both passes of a
 *        block as assembly (colibri_qi_absmax32, colibri_qi_codes32): 3.5 instructions a value
 *        for max |x|, 6 for the codes, packed four to a word (GCC's code: 5 and 8).
 */
COLIBRI_QI_INLINE void colibri_qi_quantize_row(const float *x, int8_t *xq, float *sx, int32_t n)
{
#if defined(COLIBRI_QI_MVE) || defined(COLIBRI_QI_SIMD32)
    int32_t i0 = 0;
    int32_t b = 0;
    for (; i0 + COLIBRI_QK8 <= n; i0 += COLIBRI_QK8, b++) {
        const float *xb = x + i0;
        uint32_t abits = 0;
#if defined(COLIBRI_QI_MVE)
        uint32x4_t m = vdupq_n_u32(0);
        for (int32_t j = 0; j < COLIBRI_QK8; j += 4) {
            const uint32x4_t bits = vreinterpretq_u32_f32(vld1q_f32(xb + j));
            m = vmaxq_u32(m, vandq_u32(bits, vdupq_n_u32(0x7FFFFFFFu)));
        }
        abits = vmaxvq_u32(0u, m);
#elif defined(COLIBRI_QI_VFP)
        abits = colibri_qi_absmax32(xb);
#else
#pragma GCC unroll 32
        for (int32_t j = 0; j < COLIBRI_QK8; j++) {
            uint32_t bits;
            memcpy(&bits, &xb[j], sizeof bits);
            bits &= 0x7FFFFFFFu;
            abits = (bits > abits) ? bits : abits;
        }
#endif
        if (abits < COLIBRI_QI_TINY_BITS || abits >= 0x7F800000u) {
            colibri_quantize_row_q8(xb, xq + i0, sx + b, COLIBRI_QK8);
            continue;
        }
        float amax;
        memcpy(&amax, &abits, sizeof amax);
        /* x * (inv * 2^16) == (x * inv) * 2^16 exactly: scaling by a power of two commutes
         * with rounding (a product below 2^-126 gives t = 0 either way) */
        const float inv16 = ((float)COLIBRI_Q8_MAX / amax) * 65536.0f;
        sx[b] = amax / (float)COLIBRI_Q8_MAX;
#if defined(COLIBRI_QI_MVE)
        for (int32_t j = 0; j < COLIBRI_QK8; j += 4) {
            const int32x4_t t = vcvtq_s32_f32(vmulq_n_f32(vld1q_f32(xb + j), inv16));
            const int32x4_t r = vaddq_s32(vaddq_n_s32(t, 32768), vshrq_n_s32(t, 31));
            vstrbq_s32(xq + i0 + j, vshrq_n_s32(r, 16));
        }
#elif defined(COLIBRI_QI_VFP)
        colibri_qi_codes32(xb, xq + i0, inv16);
#else
#pragma GCC unroll 32
        for (int32_t j = 0; j < COLIBRI_QK8; j++) {
            const int32_t t = (int32_t)(xb[j] * inv16);
            xq[i0 + j] = (int8_t)((t + 32768 + (t >> 31)) >> 16);
        }
#endif
    }
    if (i0 < n) { /* the last partial block: the same arithmetic, r < 32 values */
        const int32_t r = n - i0;
        const float *xb = x + i0;
        uint32_t abits = 0;
#if defined(COLIBRI_QI_MVE)
        uint32x4_t m = vdupq_n_u32(0);
        for (int32_t j = 0; j < r; j += 4) { /* lanes past r read as zero: no max */
            const mve_pred16_t p = vctp32q((uint32_t)(r - j));
            const uint32x4_t bits = vreinterpretq_u32_f32(vldrwq_z_f32(xb + j, p));
            m = vmaxq_u32(m, vandq_u32(bits, vdupq_n_u32(0x7FFFFFFFu)));
        }
        abits = vmaxvq_u32(0u, m);
#elif defined(COLIBRI_QI_VFP)
        uint32_t m2 = 0; /* colibri_qi_absmax32's max of the bits shifted left by one */
        const float *p = xb;
        for (int32_t j = 0; j + 2 <= r; j += 2) {
            uint32_t a, c;
            __asm__(COLIBRI_QI_AMAX2
                    : [m] "+r"(m2), [a] "=&r"(a), [b] "=&r"(c), [p] "+r"(p)
                    : "m"(*(const float(*)[2])p)
                    : "cc");
        }
        if (r & 1) {
            uint32_t bits;
            memcpy(&bits, &xb[r - 1], sizeof bits);
            bits <<= 1;
            m2 = (bits > m2) ? bits : m2;
        }
        abits = m2 >> 1;
#else
        for (int32_t j = 0; j < r; j++) {
            uint32_t bits;
            memcpy(&bits, &xb[j], sizeof bits);
            bits &= 0x7FFFFFFFu;
            abits = (bits > abits) ? bits : abits;
        }
#endif
        if (abits < COLIBRI_QI_TINY_BITS || abits >= 0x7F800000u) {
            colibri_quantize_row_q8(xb, xq + i0, sx + b, r);
            return;
        }
        float amax;
        memcpy(&amax, &abits, sizeof amax);
        const float inv16 = ((float)COLIBRI_Q8_MAX / amax) * 65536.0f;
        sx[b] = amax / (float)COLIBRI_Q8_MAX;
#if defined(COLIBRI_QI_MVE)
        for (int32_t j = 0; j < r; j += 4) {
            const mve_pred16_t p = vctp32q((uint32_t)(r - j));
            const int32x4_t t = vcvtq_s32_f32(vmulq_n_f32(vldrwq_z_f32(xb + j, p), inv16));
            const int32x4_t q = vaddq_s32(vaddq_n_s32(t, 32768), vshrq_n_s32(t, 31));
            vstrbq_p_s32(xq + i0 + j, vshrq_n_s32(q, 16), p);
        }
#else
        int32_t j0 = 0; /* the first value of the scalar loop */
#if defined(COLIBRI_QI_VFP)
        /* four at a time as colibri_qi_codes32 (one word stored: xq + i0 is 4-byte aligned,
         * and the Cortex-M4 / M7 store an unaligned word anyway) */
        const float *pc = xb;
        int8_t *qc = xq + i0;
        j0 = r & ~3;
        for (int32_t j = 0; j < j0; j += 4) {
            uint32_t a, c, d, e;
            const uint32_t k = 0x00808000u;
            __asm__(COLIBRI_QI_CODES4
                    : [a] "=&r"(a), [b] "=&r"(c), [c] "=&r"(d), [d] "=&r"(e), [p] "+r"(pc),
                      [q] "+r"(qc), "=m"(*(int8_t(*)[4])qc)
                    : [inv] "t"(inv16), [k] "r"(k), "m"(*(const float(*)[4])pc)
                    : "s0", "s1", "s2", "s3");
        }
#endif
        for (int32_t j = j0; j < r; j++) {
            const int32_t t = (int32_t)(xb[j] * inv16);
            xq[i0 + j] = (int8_t)((t + 32768 + (t >> 31)) >> 16);
        }
#endif
    }
#else
    colibri_quantize_row_q8(x, xq, sx, n);
#endif
}

/**
 * @brief colibri_qi_quantize_row of the n values at x, then width - n zero codes after the n
 *        codes: the activation row of matrices whose rows are stored padded to width inputs with
 *        zero columns (layouts r4 / r4p / q4r4, colibri/quant/layouts.py). The zero codes add
 *        nothing to a block's integer sum and no block scale sees them (sx as for n values), so
 *        a kernel run over width inputs gives the bits of the n-input matvec.
 */
COLIBRI_QI_INLINE void colibri_qi_quantize_row_pad(const float *x, int8_t *xq, float *sx, int32_t n,
                                                   int32_t width)
{
    colibri_qi_quantize_row(x, xq, sx, n);
    for (int32_t j = n; j < width; j++) {
        xq[j] = 0;
    }
}

#ifdef __cplusplus
}
#endif

#endif /* COLIBRI_QI_COMMON_H */
