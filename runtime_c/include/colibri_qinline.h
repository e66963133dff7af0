/**
 * @file colibri_qinline.h
 * @brief Shape-specialised kernels for generated code (issue 11): static and always inlined, so
 *        a generated expert kernel that calls them with its dimensions as constants gets a body
 *        specialised to its shape (loop bounds and tails resolved at compile time, no call per
 *        row or per block).
 *
 * Each returns exactly what its colibri_quant.h namesake returns, bit for bit: integer block
 * sums do not depend on their order, and the float operations are the documented ones in the
 * documented order. What changes is how the work is shared:
 *  - colibri_qi_quantize_row: branch-free rounding in fixed point, four lanes on Helium;
 *  - colibri_qi_q8_q8_r4: int8 x int8 on a matrix stored in layout R4 (below), four output rows
 *    per pass, so each activation word is loaded and unpacked once for four rows and each row's
 *    weights stream from one pointer: on the Cortex-M4 / M7 one LDRD, four SXTB16 and four SMLAD
 *    per row and 8 inputs; on Helium one 16-byte load and one VMLADAVA per row and 16 inputs,
 *    and the per-block float updates of the four rows in one vector (when the activations' block
 *    scales keep Helium's vector float exact: colibri_qi_mve_scales_ok).
 * On other cores they call the library (whose Neon / SSE paths are there); the emitter
 * (colibri/emit/experts.py R4_ISAS) stores R4 only for the cores that have a fast path.
 */
#ifndef COLIBRI_QINLINE_H
#define COLIBRI_QINLINE_H

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
 *        quantises to 0 either way. Other blocks (zeros, tiny, NaN, infinity, the last partial
 *        block) go through the library. The Cortex-M4 / M7 with an FPU run both passes of a
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
    if (i0 < n) {
        colibri_quantize_row_q8(x + i0, xq + i0, sx + b, n - i0);
    }
#else
    colibri_quantize_row_q8(x, xq, sx, n);
#endif
}

/*
 * Layout R4 (colibri/quant/formats.py r4_order): an int8 matrix [n_out][n_in] with n_in a
 * multiple of COLIBRI_R4_CHUNK is stored in groups of COLIBRI_R4_ROWS output rows; inside a
 * group, for each chunk of 16 inputs, the 16 codes of row 0, then of row 1, 2 and 3 (64 bytes).
 * The n_out % 4 rows after the last group stay row-major. One pointer walks a group's weights
 * in the order the kernel reads them: one 64-bit load per row and 8 inputs on the M4, one
 * 16-byte vector per row and chunk on Helium.
 */
#define COLIBRI_R4_ROWS 4
#define COLIBRI_R4_CHUNK 16

#if defined(COLIBRI_QI_SIMD32)
/* The R4 block's assembly (colibri_qi_r4_block), by step of 8 inputs:
 * COLIBRI_QI_X(off): the 8 activation codes at x + off, unpacked by SXTB16 into the halfword
 * pairs (0, 2) -> xa, (1, 3) -> x1, (4, 6) -> xb, (5, 7) -> x3;
 * COLIBRI_QI_ROW(s, off): one row's 8 weights at w + off (one LDRD), each word unpacked the same
 * way and multiplied into the sum s with SMLAD; COLIBRI_QI_ROW0 starts s with SMUAD. */
#define COLIBRI_QI_X(off)                                                                          \
    "ldrd %[xa], %[xb], [%[x], #" #off "]\n"                                                       \
    "sxtb16 %[x1], %[xa], ror #8\n"                                                                \
    "sxtb16 %[xa], %[xa]\n"                                                                        \
    "sxtb16 %[x3], %[xb], ror #8\n"                                                                \
    "sxtb16 %[xb], %[xb]\n"
#define COLIBRI_QI_ROW_TAIL(s)                                                                     \
    "sxtb16 %[wa], %[wa], ror #8\n"                                                                \
    "smlad %[" #s "], %[wa], %[x1], %[" #s "]\n"                                                   \
    "sxtb16 %[t], %[wb]\n"                                                                         \
    "smlad %[" #s "], %[t], %[xb], %[" #s "]\n"                                                    \
    "sxtb16 %[wb], %[wb], ror #8\n"                                                                \
    "smlad %[" #s "], %[wb], %[x3], %[" #s "]\n"
#define COLIBRI_QI_ROW0(s, off)                                                                    \
    "ldrd %[wa], %[wb], [%[w], #" #off "]\n"                                                       \
    "sxtb16 %[t], %[wa]\n"                                                                         \
    "smuad %[" #s "], %[t], %[xa]\n" COLIBRI_QI_ROW_TAIL(s)
#define COLIBRI_QI_ROW(s, off)                                                                     \
    "ldrd %[wa], %[wb], [%[w], #" #off "]\n"                                                       \
    "sxtb16 %[t], %[wa]\n"                                                                         \
    "smlad %[" #s "], %[t], %[xa], %[" #s "]\n" COLIBRI_QI_ROW_TAIL(s)
#endif

/** Integer dot products of the 4 rows of an R4 group with one full block of 32 codes:
 *  wg = the group's first byte + block * 128, x = the block's activation codes. */
COLIBRI_QI_INLINE void colibri_qi_r4_block(const int8_t *wg, const int8_t *x, int32_t s[4])
{
#if defined(COLIBRI_QI_MVE)
    int32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (int32_t c = 0; c < 2; c++) {
        const int8x16_t xv = vld1q_s8(x + 16 * c);
        const int8_t *w = wg + 64 * c;
        s0 = vmladavaq_s8(s0, vld1q_s8(w), xv);
        s1 = vmladavaq_s8(s1, vld1q_s8(w + 16), xv);
        s2 = vmladavaq_s8(s2, vld1q_s8(w + 32), xv);
        s3 = vmladavaq_s8(s3, vld1q_s8(w + 48), xv);
    }
    s[0] = s0;
    s[1] = s1;
    s[2] = s2;
    s[3] = s3;
#elif defined(COLIBRI_QI_SIMD32)
    /* Written out: GCC's allocation of the intrinsics spilled. 13 registers: 4 sums, the two
     * base pointers, the 4 unpacked activation pairs and 3 for the weights. Per 8 inputs: one
     * LDRD and 4 SXTB16 for the activations, then per row one LDRD, 4 SXTB16 and 4 SMLAD. */
    int32_t s0, s1, s2, s3; /* the first step's SMUAD starts them */
    uint32_t xa, xb, x1, x3, wa, wb, t;
    __asm__(
        /* step 0: inputs 0..7 (chunk 0, first half); SMUAD starts each row's sum */
        COLIBRI_QI_X(0) COLIBRI_QI_ROW0(s0, 0) COLIBRI_QI_ROW0(s1, 16) COLIBRI_QI_ROW0(s2, 32)
            COLIBRI_QI_ROW0(s3, 48)
        /* step 1: inputs 8..15 (chunk 0, second half) */
        COLIBRI_QI_X(8) COLIBRI_QI_ROW(s0, 8) COLIBRI_QI_ROW(s1, 24) COLIBRI_QI_ROW(s2, 40)
            COLIBRI_QI_ROW(s3, 56)
        /* steps 2 and 3: inputs 16..31 (chunk 1, 64 bytes on) */
        COLIBRI_QI_X(16) COLIBRI_QI_ROW(s0, 64) COLIBRI_QI_ROW(s1, 80) COLIBRI_QI_ROW(s2, 96)
            COLIBRI_QI_ROW(s3, 112) COLIBRI_QI_X(24) COLIBRI_QI_ROW(s0, 72) COLIBRI_QI_ROW(s1, 88)
                COLIBRI_QI_ROW(s2, 104) COLIBRI_QI_ROW(s3, 120)
        : [s0] "=&r"(s0), [s1] "=&r"(s1), [s2] "=&r"(s2), [s3] "=&r"(s3), [xa] "=&r"(xa),
          [xb] "=&r"(xb), [x1] "=&r"(x1), [x3] "=&r"(x3), [wa] "=&r"(wa), [wb] "=&r"(wb),
          [t] "=&r"(t)
        : [w] "r"(wg), [x] "r"(x), "m"(*(const int8_t(*)[128])wg), "m"(*(const int8_t(*)[32])x));
    s[0] = s0;
    s[1] = s1;
    s[2] = s2;
    s[3] = s3;
#else
    for (int32_t r = 0; r < 4; r++) {
        int32_t acc = 0;
        for (int32_t i = 0; i < 32; i++) {
            acc += (int32_t)wg[64 * (i / 16) + 16 * r + (i % 16)] * (int32_t)x[i];
        }
        s[r] = acc;
    }
#endif
}

#if defined(COLIBRI_QI_MVE)
/** Block scales (activations) with which Helium's vector float gives the scalar result: each 0
 *  or of magnitude in [2^-60, 2^60]. Then every product of an integer block sum (|s| < 2^20)
 *  and such a scale, and every sum of them, is 0 or a normal float of magnitude >= 2^-83 (all
 *  are multiples of 2^-83) and far from overflow, so the vector unit's flushing of subnormals
 *  and default NaNs never come into play. */
COLIBRI_QI_INLINE int colibri_qi_mve_scales_ok(const float *sx, int32_t nb)
{
    uint32_t worst = 0;
    int32_t i = 0;
    for (; i + 4 <= nb; i += 4) {
        const uint32x4_t v =
            vandq_u32(vreinterpretq_u32_f32(vld1q_f32(sx + i)), vdupq_n_u32(0x7FFFFFFFu));
        /* 0 -> 0; else bits - 2^-60's bits, wrapping below it */
        const uint32x4_t u = vpselq_u32(v, vsubq_n_u32(v, 0x21800000u), vcmpeqq_n_u32(v, 0u));
        worst = vmaxvq_u32(worst, u);
    }
    for (; i < nb; i++) {
        uint32_t v;
        memcpy(&v, &sx[i], sizeof v);
        v &= 0x7FFFFFFFu;
        const uint32_t u = (v == 0u) ? 0u : v - 0x21800000u;
        worst = (u > worst) ? u : worst;
    }
    return worst <= 0x5D800000u - 0x21800000u;
}

/** colibri_qi_q8_q8_r4's 4 outputs of one R4 group over nb (>= 1) whole blocks of 32 codes
 *  (Helium, per-row scales, block scales checked by colibri_qi_mve_scales_ok): y[r] = a_r *
 *  scale[r]. Per block: 2 vector loads of codes, per row one of weights and a VMLADAV(A), then
 *  the 4 sums moved into one vector (two lane-pair moves), converted, times the block's scale
 *  and added to the running sums, 4 lanes at a time (the scalar operations, same order). The
 *  sums come back to core registers through the inverse lane-pair moves (so the rows' lanes do
 *  not depend on how the pair move orders its lanes) and take the last product in scalar
 *  float: a weight scale may be subnormal. Registers q0..q4 are fixed (q0 = the running sums,
 *  q1 = the block's products then the outputs, q2 / q3 = the codes then the weight scales,
 *  q4 = weights). */
COLIBRI_QI_INLINE void colibri_qi_r4_group_mve(const int8_t *wg, const int8_t *xq, const float *sx,
                                               int32_t nb, const float *scale, float *y)
{
    const int8_t *w = wg;
    const int8_t *x = xq;
    const float *sp = sx;
    int32_t s0, s1, s2, s3;
    __asm__ volatile("vmov.i32 q0, #0\n"
                     "dls lr, %[nb]\n"
                     "1:\n"
                     "vldrb.8 q3, [%[x], #16]\n"
                     "vldrb.8 q2, [%[x]], #32\n"
                     "vldrb.8 q4, [%[w]], #64\n"
                     "vmladav.s8 %[s0], q4, q2\n"
                     "vldrb.8 q4, [%[w], #-48]\n"
                     "vmladav.s8 %[s1], q4, q2\n"
                     "vldrb.8 q4, [%[w], #-32]\n"
                     "vmladav.s8 %[s2], q4, q2\n"
                     "vldrb.8 q4, [%[w], #-16]\n"
                     "vmladav.s8 %[s3], q4, q2\n"
                     "vldrb.8 q4, [%[w]], #64\n"
                     "vmladava.s8 %[s0], q4, q3\n"
                     "vldrb.8 q4, [%[w], #-48]\n"
                     "vmladava.s8 %[s1], q4, q3\n"
                     "vldrb.8 q4, [%[w], #-32]\n"
                     "vmladava.s8 %[s2], q4, q3\n"
                     "vldrb.8 q4, [%[w], #-16]\n"
                     "vmladava.s8 %[s3], q4, q3\n"
                     "vmov q1[2], q1[0], %[s0], %[s2]\n"
                     "vmov q1[3], q1[1], %[s1], %[s3]\n"
                     "ldr %[s0], [%[sp]], #4\n"
                     "vcvt.f32.s32 q1, q1\n"
                     "vmul.f32 q1, q1, %[s0]\n"
                     "vadd.f32 q0, q0, q1\n"
                     "le lr, 1b\n"
                     "vmov %[s0], %[s2], q0[2], q0[0]\n"
                     "vmov %[s1], %[s3], q0[3], q0[1]\n"
                     "vmov s4, s5, %[s0], %[s1]\n"
                     "vmov s6, s7, %[s2], %[s3]\n"
                     "vldmia %[sc], {s8-s11}\n"
                     "vmul.f32 s4, s4, s8\n"
                     "vmul.f32 s5, s5, s9\n"
                     "vmul.f32 s6, s6, s10\n"
                     "vmul.f32 s7, s7, s11\n"
                     "vstmia %[y], {s4-s7}\n"
                     : [w] "+r"(w), [x] "+r"(x), [sp] "+r"(sp), [s0] "=&Te"(s0), [s1] "=&Te"(s1),
                       [s2] "=&Te"(s2), [s3] "=&Te"(s3)
                     : [nb] "r"(nb), [sc] "r"(scale), [y] "r"(y)
                     /* reads wg, xq, sx and scale's 4 floats, writes y's 4 */
                     : "memory", "lr", "d0", "d1", "d2", "d3", "d4", "d5", "d6", "d7", "d8", "d9");
}
#endif

/**
 * @brief colibri_matvec_q8_q8 (blocked = 0) or colibri_matvec_q8b_q8 (blocked = 1) on a matrix
 *        stored in layout R4, bit for bit; n_in must be a multiple of COLIBRI_R4_CHUNK.
 *        Compile-time n_out / n_in at the call site resolve every loop bound and tail.
 */
COLIBRI_QI_INLINE void colibri_qi_q8_q8_r4(const int8_t *q, const float *scale, const int8_t *xq,
                                           const float *sx, float *y, int32_t n_out, int32_t n_in,
                                           int blocked)
{
    const int32_t full = n_in / COLIBRI_QK8;
    const int32_t half = (n_in % COLIBRI_QK8) != 0; /* a last block of 16 inputs */
    const size_t nb = COLIBRI_Q8_BLOCKS(n_in);
    const int32_t groups = n_out / COLIBRI_R4_ROWS;
    int32_t g0 = 0; /* the groups done by a fast path */
#if defined(COLIBRI_QI_MVE)
    if (!blocked && !half && full > 0 && colibri_qi_mve_scales_ok(sx, full)) {
        for (; g0 < groups; g0++) {
            const int32_t o = g0 * COLIBRI_R4_ROWS;
            colibri_qi_r4_group_mve(q + (size_t)o * (size_t)n_in, xq, sx, full, scale + o, y + o);
        }
    }
#endif
    for (int32_t g = g0; g < groups; g++) {
        const int8_t *wg = q + (size_t)g * COLIBRI_R4_ROWS * (size_t)n_in;
        const int32_t o = g * COLIBRI_R4_ROWS;
        float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
        const float *s0p = scale + (size_t)o * nb; /* blocked: row o's block scales */
        for (int32_t b = 0; b < full; b++) {
            int32_t s[4];
            colibri_qi_r4_block(wg + (size_t)b * 128u, xq + (size_t)b * COLIBRI_QK8, s);
            const float xs = sx[b];
            if (blocked) {
                a0 = colibri_qi_mla(a0, (float)s[0], s0p[b] * xs);
                a1 = colibri_qi_mla(a1, (float)s[1], s0p[nb + (size_t)b] * xs);
                a2 = colibri_qi_mla(a2, (float)s[2], s0p[2u * nb + (size_t)b] * xs);
                a3 = colibri_qi_mla(a3, (float)s[3], s0p[3u * nb + (size_t)b] * xs);
            } else {
                a0 = colibri_qi_mla(a0, (float)s[0], xs);
                a1 = colibri_qi_mla(a1, (float)s[1], xs);
                a2 = colibri_qi_mla(a2, (float)s[2], xs);
                a3 = colibri_qi_mla(a3, (float)s[3], xs);
            }
        }
        if (half) {
            const int8_t *w = wg + (size_t)full * 128u;
            const int8_t *x = xq + (size_t)full * COLIBRI_QK8;
            const float xs = sx[full];
            const float f0 = blocked ? s0p[full] * xs : xs;
            const float f1 = blocked ? s0p[nb + (size_t)full] * xs : xs;
            const float f2 = blocked ? s0p[2u * nb + (size_t)full] * xs : xs;
            const float f3 = blocked ? s0p[3u * nb + (size_t)full] * xs : xs;
            a0 += (float)colibri_dot_q8(w, x, 16) * f0;
            a1 += (float)colibri_dot_q8(w + 16, x, 16) * f1;
            a2 += (float)colibri_dot_q8(w + 32, x, 16) * f2;
            a3 += (float)colibri_dot_q8(w + 48, x, 16) * f3;
        }
        if (blocked) {
            y[o] = a0;
            y[o + 1] = a1;
            y[o + 2] = a2;
            y[o + 3] = a3;
        } else {
            y[o] = a0 * scale[o];
            y[o + 1] = a1 * scale[o + 1];
            y[o + 2] = a2 * scale[o + 2];
            y[o + 3] = a3 * scale[o + 3];
        }
    }
    const int32_t o = groups * COLIBRI_R4_ROWS;
    if (o < n_out) { /* the last 1..3 rows, row-major */
        const int8_t *rest = q + (size_t)o * (size_t)n_in;
        if (blocked) {
            colibri_matvec_q8b_q8(rest, scale + (size_t)o * nb, xq, sx, y + o, n_out - o, n_in);
        } else {
            colibri_matvec_q8_q8(rest, scale + o, xq, sx, y + o, n_out - o, n_in);
        }
    }
}

/*
 * The multi-token R4 kernel (colibri_qi_mm_q8_q8_r4): a group of tokens over the same weights,
 * each weight read once per pass over COLIBRI_QI_MT tokens instead of once per token.
 *  - Cortex-M4 / M7: each block of 32 inputs of the pass's tokens is first unpacked by SXTB16
 *    into halfword pairs (a 512-byte buffer on the stack), then every row's weight word is
 *    loaded and unpacked once and multiplied with the pairs of every token (one row, 8 tokens:
 *    per 4 inputs one LDR, 2 SXTB16, then per token one LDRD and 2 SMLAD; then a pass of 4 when
 *    4..7 tokens are left). The running sums of COLIBRI_QI_RC rows stay on the stack between
 *    blocks (a float stored and loaded back is the same float).
 *  - Helium: the 4 rows of an R4 group, 2 tokens: each weight vector is loaded once and
 *    VMLADAVA'd with both tokens' codes.
 * Every (row, token) gets the float operations of colibri_qi_q8_q8_r4 in the same order, so row
 * t of the output has the bits colibri_qi_q8_q8_r4 (and colibri_matvec_q8_q8 / q8b) gives it.
 */
#if defined(COLIBRI_QI_SIMD32)
#define COLIBRI_QI_MT 8
#elif defined(COLIBRI_QI_MVE)
#define COLIBRI_QI_MT 2
#else
#define COLIBRI_QI_MT 1
#endif
/** Rows whose running sums a pass keeps on the stack (Cortex-M4 / M7: RC * 8 floats). */
#ifndef COLIBRI_QI_RC
#define COLIBRI_QI_RC 32
#endif

#if defined(COLIBRI_QI_SIMD32)
/** The T rows of codes at x, x + n_in, ... (one block of 32 each) as SXTB16 pairs: for word k
 *  (inputs 4k..4k+3) and token t, xu[2 (k T + t)] = (4k, 4k+2), xu[2 (k T + t) + 1] = (4k+1,
 *  4k+3). */
COLIBRI_QI_INLINE void colibri_qi_unpack_block(const int8_t *x, int32_t n_in, int32_t T,
                                               uint32_t *xu)
{
    for (int32_t t = 0; t < T; t++) {
        const colibri_qi_word *xw =
            (const colibri_qi_word *)(const void *)(x + (size_t)t * (size_t)n_in);
#pragma GCC unroll 8
        for (int32_t k = 0; k < 8; k++) {
            const uint32_t v = xw[k];
            xu[2 * (k * T + t)] = __sxtb16(v);
            xu[2 * (k * T + t) + 1] = __sxtb16((v >> 8) | (v << 24));
        }
    }
}

/* colibri_qi_r1_block8's assembly, by word k of the row (4 inputs): COLIBRI_QI_W(off) loads the
 * word at wr + off and unpacks it into we (inputs 0, 2) and wo (1, 3); COLIBRI_QI_T(s, off) adds
 * token t's products (its two pairs at xu + off: k * 64 + 8 t) into s; COLIBRI_QI_T0 starts s. */
#define COLIBRI_QI_W(off)                                                                          \
    "ldr %[wo], [%[wr], #" #off "]\n"                                                              \
    "sxtb16 %[we], %[wo]\n"                                                                        \
    "sxtb16 %[wo], %[wo], ror #8\n"
#define COLIBRI_QI_T0(s, off)                                                                      \
    "ldrd %[xa], %[xb], [%[xp], #" #off "]\n"                                                      \
    "smuad %[" #s "], %[we], %[xa]\n"                                                              \
    "smlad %[" #s "], %[wo], %[xb], %[" #s "]\n"
#define COLIBRI_QI_T(s, off)                                                                       \
    "ldrd %[xa], %[xb], [%[xp], #" #off "]\n"                                                      \
    "smlad %[" #s "], %[we], %[xa], %[" #s "]\n"                                                   \
    "smlad %[" #s "], %[wo], %[xb], %[" #s "]\n"
#define COLIBRI_QI_K(woff, x0, x1, x2, x3, x4, x5, x6, x7)                                         \
    COLIBRI_QI_W(woff)                                                                             \
    COLIBRI_QI_T(a0, x0)                                                                           \
    COLIBRI_QI_T(a1, x1)                                                                           \
    COLIBRI_QI_T(a2, x2)                                                                           \
    COLIBRI_QI_T(a3, x3)                                                                           \
    COLIBRI_QI_T(a4, x4)                                                                           \
    COLIBRI_QI_T(a5, x5) COLIBRI_QI_T(a6, x6) COLIBRI_QI_T(a7, x7)

/** One row of an R4 group (wr = its first weight of the block: group + block * 128 + 16 r)
 *  times one unpacked block of 8 tokens (colibri_qi_unpack_block): s[t] = the integer dot
 *  product of token t. Written out: 14 registers (8 sums, the two pointers, the unpacked weight
 *  word and one token's two pairs); per word one LDR and 2 SXTB16, per token one LDRD, 2 SMLAD. */
COLIBRI_QI_INLINE void colibri_qi_r1_block8(const int8_t *wr, const uint32_t *xu, int32_t s[8])
{
    int32_t a0, a1, a2, a3, a4, a5, a6, a7;
    uint32_t we, wo, xa, xb;
    __asm__(COLIBRI_QI_W(0) COLIBRI_QI_T0(a0, 0) COLIBRI_QI_T0(a1, 8) COLIBRI_QI_T0(a2, 16)
                COLIBRI_QI_T0(a3, 24) COLIBRI_QI_T0(a4, 32) COLIBRI_QI_T0(a5, 40) COLIBRI_QI_T0(
                    a6, 48) COLIBRI_QI_T0(a7, 56) COLIBRI_QI_K(4, 64, 72, 80, 88, 96, 104, 112, 120)
                    COLIBRI_QI_K(8, 128, 136, 144, 152, 160, 168, 176, 184)
                        COLIBRI_QI_K(12, 192, 200, 208, 216, 224, 232, 240, 248)
                            COLIBRI_QI_K(64, 256, 264, 272, 280, 288, 296, 304, 312)
                                COLIBRI_QI_K(68, 320, 328, 336, 344, 352, 360, 368, 376)
                                    COLIBRI_QI_K(72, 384, 392, 400, 408, 416, 424, 432, 440)
                                        COLIBRI_QI_K(76, 448, 456, 464, 472, 480, 488, 496, 504)
            : [a0] "=&r"(a0), [a1] "=&r"(a1), [a2] "=&r"(a2), [a3] "=&r"(a3), [a4] "=&r"(a4),
              [a5] "=&r"(a5), [a6] "=&r"(a6), [a7] "=&r"(a7), [we] "=&r"(we), [wo] "=&r"(wo),
              [xa] "=&r"(xa), [xb] "=&r"(xb)
            : [wr] "r"(wr), [xp] "r"(xu), "m"(*(const int8_t(*)[80])wr),
              "m"(*(const uint32_t(*)[128])xu));
    s[0] = a0;
    s[1] = a1;
    s[2] = a2;
    s[3] = a3;
    s[4] = a4;
    s[5] = a5;
    s[6] = a6;
    s[7] = a7;
}

#define COLIBRI_QI_K4(woff, x0, x1, x2, x3)                                                        \
    COLIBRI_QI_W(woff)                                                                             \
    COLIBRI_QI_T(a0, x0) COLIBRI_QI_T(a1, x1) COLIBRI_QI_T(a2, x2) COLIBRI_QI_T(a3, x3)

/** colibri_qi_r1_block8 for a pass of 4 tokens (pairs of word k, token t at xu + k * 32 + 8 t). */
COLIBRI_QI_INLINE void colibri_qi_r1_block4(const int8_t *wr, const uint32_t *xu, int32_t s[4])
{
    int32_t a0, a1, a2, a3;
    uint32_t we, wo, xa, xb;
    __asm__(COLIBRI_QI_W(0) COLIBRI_QI_T0(a0, 0) COLIBRI_QI_T0(a1, 8) COLIBRI_QI_T0(a2, 16)
                COLIBRI_QI_T0(a3, 24) COLIBRI_QI_K4(4, 32, 40, 48, 56)
                    COLIBRI_QI_K4(8, 64, 72, 80, 88) COLIBRI_QI_K4(12, 96, 104, 112, 120)
                        COLIBRI_QI_K4(64, 128, 136, 144, 152) COLIBRI_QI_K4(68, 160, 168, 176, 184)
                            COLIBRI_QI_K4(72, 192, 200, 208, 216)
                                COLIBRI_QI_K4(76, 224, 232, 240, 248)
            : [a0] "=&r"(a0), [a1] "=&r"(a1), [a2] "=&r"(a2), [a3] "=&r"(a3), [we] "=&r"(we),
              [wo] "=&r"(wo), [xa] "=&r"(xa), [xb] "=&r"(xb)
            : [wr] "r"(wr), [xp] "r"(xu), "m"(*(const int8_t(*)[80])wr),
              "m"(*(const uint32_t(*)[64])xu));
    s[0] = a0;
    s[1] = a1;
    s[2] = a2;
    s[3] = a3;
}
#endif

#if defined(COLIBRI_QI_MVE)
/* colibri_qi_r4_block2's assembly: COLIBRI_QI_V(op, r, woff) loads row r's 16 weights of the
 * chunk at w + woff once and multiplies them with both tokens' codes (xa, xb) into s<r>, u<r>. */
#define COLIBRI_QI_V(op, r, woff)                                                                  \
    "vldrb.8 %q[wv], [%[w], #" #woff "]\n" #op ".s8 %[s" #r "], %q[wv], %q[xa]\n" #op ".s8 %[u" #r \
    "], %q[wv], %q[xb]\n"
#define COLIBRI_QI_CHUNK(op, xoff, woff)                                                           \
    "vldrb.8 %q[xa], [%[x0], #" #xoff "]\n"                                                        \
    "vldrb.8 %q[xb], [%[x1], #" #xoff "]\n" COLIBRI_QI_V(op, 0, woff)                              \
        COLIBRI_QI_V(op, 1, woff + 16) COLIBRI_QI_V(op, 2, woff + 32)                              \
            COLIBRI_QI_V(op, 3, woff + 48)

#define COLIBRI_QI_CVT(f, s)                                                                       \
    "vmov %[" #f "], %[" #s "]\n"                                                                  \
    "vcvt.f32.s32 %[" #f "], %[" #f "]\n"

/** The 4 rows of an R4 group times one block of 32 codes of 2 tokens (x0, x1): the integer dot
 *  products as floats (exact: |sum| < 2^24), f[4 t + r] for token t and row r. Written out:
 *  the 8 sums need the 8 even core registers VMLADAV accumulates in. Per 16 inputs: 2 vector
 *  loads of codes, then per row one of weights and 2 VMLADAV(A). */
COLIBRI_QI_INLINE void colibri_qi_r4_block2(const int8_t *wg, const int8_t *x0, const int8_t *x1,
                                            float f[8])
{
    float f0, f1, f2, f3, f4, f5, f6, f7;
    int32_t s0, s1, s2, s3, u0, u1, u2, u3;
    int8x16_t xa, xb, wv;
    __asm__(COLIBRI_QI_CHUNK(vmladav, 0, 0) COLIBRI_QI_CHUNK(vmladava, 16, 64)
                COLIBRI_QI_CVT(f0, s0) COLIBRI_QI_CVT(f1, s1) COLIBRI_QI_CVT(f2, s2)
                    COLIBRI_QI_CVT(f3, s3) COLIBRI_QI_CVT(f4, u0) COLIBRI_QI_CVT(f5, u1)
                        COLIBRI_QI_CVT(f6, u2) COLIBRI_QI_CVT(f7, u3)
            : [s0] "=&Te"(s0), [s1] "=&Te"(s1), [s2] "=&Te"(s2), [s3] "=&Te"(s3), [u0] "=&Te"(u0),
              [u1] "=&Te"(u1), [u2] "=&Te"(u2), [u3] "=&Te"(u3), [xa] "=&w"(xa), [xb] "=&w"(xb),
              [wv] "=&w"(wv), [f0] "=&t"(f0), [f1] "=&t"(f1), [f2] "=&t"(f2), [f3] "=&t"(f3),
              [f4] "=&t"(f4), [f5] "=&t"(f5), [f6] "=&t"(f6), [f7] "=&t"(f7)
            : [w] "r"(wg), [x0] "r"(x0), [x1] "r"(x1), "m"(*(const int8_t(*)[128])wg),
              "m"(*(const int8_t(*)[32])x0), "m"(*(const int8_t(*)[32])x1));
    f[0] = f0;
    f[1] = f1;
    f[2] = f2;
    f[3] = f3;
    f[4] = f4;
    f[5] = f5;
    f[6] = f6;
    f[7] = f7;
}
#endif

#if defined(COLIBRI_QI_MVE)
/** Block scales of a pass of 2 tokens that colibri_qi_r4_group2_mve takes in pairs (token 0's
 *  then token 1's of each block), for n_in up to 32 * COLIBRI_QI_MVE_NB. */
#define COLIBRI_QI_MVE_NB 64

/** Block scales in pairs, then 3 pointers (colibri_qi_r4_group2_mve). */
typedef union {
    float f[2 * COLIBRI_QI_MVE_NB + 3];
    uintptr_t p[2 * COLIBRI_QI_MVE_NB + 3];
} colibri_qi_pairs;

/** colibri_qi_r4_group_mve for 2 tokens (codes x0 and x1, block scales interleaved in sxp: x0's
 *  then x1's of each block): each weight vector is loaded once and VMLADAV'd with both tokens'
 *  codes; y0 / y1 = the 4 outputs of each. Registers q0..q7 are fixed (q0 / q5 = the running
 *  sums of token 0 / 1, q1 = products, q2 q3 / q6 q7 = the codes, q4 = weights). */
COLIBRI_QI_INLINE void colibri_qi_r4_group2_mve(const int8_t *wg, const int8_t *x0,
                                                const int8_t *x1, colibri_qi_pairs *sxp, int32_t nb,
                                                const float *scale, float *y0, float *y1)
{
    /* the epilogue's pointers right after the nb pairs, where the scale pointer ends up: the
     * loop needs every other register */
    sxp->p[2 * nb] = (uintptr_t)scale;
    sxp->p[2 * nb + 1] = (uintptr_t)y0;
    sxp->p[2 * nb + 2] = (uintptr_t)y1;
    const int8_t *w = wg;
    const int8_t *xa = x0;
    const int8_t *xb = x1;
    const float *sp = sxp->f;
    int32_t e0, e1, e2, e3, e4, e5; /* sums: rows 1, 3 then 0, 2 of x0 in e0 e1; x1's in e2..e5 */
    __asm__ volatile(
        "vmov.i32 q0, #0\n"
        "vmov.i32 q5, #0\n"
        "dls lr, %[nb]\n"
        "1:\n"
        "vldrb.8 q3, [%[xa], #16]\n"
        "vldrb.8 q2, [%[xa]], #32\n"
        "vldrb.8 q7, [%[xb], #16]\n"
        "vldrb.8 q6, [%[xb]], #32\n"
        /* rows 1 and 3 (chunk 0 at w + 16 / 48, chunk 1 at w + 80 / 112) */
        "vldrb.8 q4, [%[w], #16]\n"
        "vmladav.s8 %[e0], q4, q2\n"
        "vmladav.s8 %[e2], q4, q6\n"
        "vldrb.8 q4, [%[w], #48]\n"
        "vmladav.s8 %[e1], q4, q2\n"
        "vmladav.s8 %[e3], q4, q6\n"
        "vldrb.8 q4, [%[w], #80]\n"
        "vmladava.s8 %[e0], q4, q3\n"
        "vmladava.s8 %[e2], q4, q7\n"
        "vldrb.8 q4, [%[w], #112]\n"
        "vmladava.s8 %[e1], q4, q3\n"
        "vmladava.s8 %[e3], q4, q7\n"
        "vmov q1[3], q1[1], %[e0], %[e1]\n"
        /* rows 0 and 2 (w, w + 32, then w + 96, w + 64; w ends 128 on) */
        "vldrb.8 q4, [%[w]], #64\n"
        "vmladav.s8 %[e0], q4, q2\n"
        "vmladav.s8 %[e4], q4, q6\n"
        "vldrb.8 q4, [%[w], #-32]\n"
        "vmladav.s8 %[e1], q4, q2\n"
        "vmladav.s8 %[e5], q4, q6\n"
        "vldrb.8 q4, [%[w], #32]\n"
        "vmladava.s8 %[e1], q4, q3\n"
        "vmladava.s8 %[e5], q4, q7\n"
        "vldrb.8 q4, [%[w]], #64\n"
        "vmladava.s8 %[e0], q4, q3\n"
        "vmladava.s8 %[e4], q4, q7\n"
        "vmov q1[2], q1[0], %[e0], %[e1]\n"
        "ldrd %[e0], %[e1], [%[sp]], #8\n"
        "vcvt.f32.s32 q1, q1\n"
        "vmul.f32 q1, q1, %[e0]\n"
        "vadd.f32 q0, q0, q1\n"
        "vmov q1[2], q1[0], %[e4], %[e5]\n"
        "vmov q1[3], q1[1], %[e2], %[e3]\n"
        "vcvt.f32.s32 q1, q1\n"
        "vmul.f32 q1, q1, %[e1]\n"
        "vadd.f32 q5, q5, q1\n"
        "le lr, 1b\n"
        "ldr %[xa], [%[sp]]\n"
        "ldr %[xb], [%[sp], #4]\n"
        "ldr %[w], [%[sp], #8]\n"
        "vmov %[e0], %[e1], q0[2], q0[0]\n" /* rows 0, 2 */
        "vmov %[e2], %[e3], q0[3], q0[1]\n" /* rows 1, 3 */
        "vmov s4, s5, %[e0], %[e2]\n"
        "vmov s6, s7, %[e1], %[e3]\n"
        "vmov %[e0], %[e1], q5[2], q5[0]\n"
        "vmov %[e2], %[e3], q5[3], q5[1]\n"
        "vmov s12, s13, %[e0], %[e2]\n"
        "vmov s14, s15, %[e1], %[e3]\n"
        "vldmia %[xa], {s8-s11}\n"
        "vmul.f32 s4, s4, s8\n"
        "vmul.f32 s5, s5, s9\n"
        "vmul.f32 s6, s6, s10\n"
        "vmul.f32 s7, s7, s11\n"
        "vmul.f32 s12, s12, s8\n"
        "vmul.f32 s13, s13, s9\n"
        "vmul.f32 s14, s14, s10\n"
        "vmul.f32 s15, s15, s11\n"
        "vstmia %[xb], {s4-s7}\n"
        "vstmia %[w], {s12-s15}\n"
        : [w] "+r"(w), [xa] "+r"(xa), [xb] "+r"(xb), [sp] "+r"(sp), [e0] "=&Te"(e0),
          [e1] "=&Te"(e1), [e2] "=&Te"(e2), [e3] "=&Te"(e3), [e4] "=&Te"(e4), [e5] "=&Te"(e5)
        : [nb] "r"(nb)
        /* reads wg, x0, x1, *sxp and scale's 4 floats, writes y0's and y1's 4 */
        : "memory", "lr", "d0", "d1", "d2", "d3", "d4", "d5", "d6", "d7", "d8", "d9", "d10", "d11",
          "d12", "d13", "d14", "d15");
}
#endif

/** One pass of colibri_qi_mm_q8_q8_r4 over T == COLIBRI_QI_MT tokens (T > 1). */
COLIBRI_QI_INLINE void colibri_qi_r4_pass(const int8_t *q, const float *scale, const int8_t *xq,
                                          const float *sx, float *y, int32_t ldy, int32_t n_out,
                                          int32_t n_in, int32_t T, int blocked)
{
    const int32_t full = n_in / COLIBRI_QK8;
    const int32_t half = (n_in % COLIBRI_QK8) != 0;
    const size_t nb = COLIBRI_Q8_BLOCKS(n_in);
    const int32_t groups = n_out / COLIBRI_R4_ROWS;
#if defined(COLIBRI_QI_SIMD32)
    /* COLIBRI_QI_RC rows at a time, block by block: acc[r][t] holds the running sum a of
     * colibri_qi_q8_q8_r4 for row o0 + r and token t */
    const int32_t rows = groups * COLIBRI_R4_ROWS;
    for (int32_t o0 = 0; o0 < rows; o0 += COLIBRI_QI_RC) {
        const int32_t rc = (rows - o0 < COLIBRI_QI_RC) ? rows - o0 : COLIBRI_QI_RC;
        float acc[COLIBRI_QI_RC * COLIBRI_QI_MT];
        for (int32_t i = 0; i < rc * T; i++) {
            acc[i] = 0.0f; /* colibri_qi_q8_q8_r4's a = 0.0f */
        }
        for (int32_t b = 0; b < full; b++) {
            uint32_t xu[2 * 8 * COLIBRI_QI_MT];
            colibri_qi_unpack_block(xq + (size_t)b * COLIBRI_QK8, n_in, T, xu);
            float xs[COLIBRI_QI_MT];
            for (int32_t t = 0; t < T; t++) {
                xs[t] = sx[(size_t)t * nb + (size_t)b];
            }
            /* rc is a multiple of 4: whole R4 groups */
            const int8_t *wg = q + (size_t)o0 * (size_t)n_in + (size_t)b * 128u;
            float *ap = acc;
            for (int32_t r = 0; r < rc; r++) {
                const int8_t *wr = wg + 16u * (size_t)(r % COLIBRI_R4_ROWS);
                int32_t s[COLIBRI_QI_MT];
                if (T == 8) {
                    colibri_qi_r1_block8(wr, xu, s);
                } else {
                    colibri_qi_r1_block4(wr, xu, s);
                }
                const float ws = blocked ? scale[(size_t)(o0 + r) * nb + (size_t)b] : 1.0f;
#pragma GCC unroll 8
                for (int32_t t = 0; t < T; t++) {
                    ap[t] = colibri_qi_mla(ap[t], (float)s[t], blocked ? ws * xs[t] : xs[t]);
                }
                ap += T;
                if (r % COLIBRI_R4_ROWS == COLIBRI_R4_ROWS - 1) {
                    wg += COLIBRI_R4_ROWS * (size_t)n_in;
                }
            }
        }
        for (int32_t r = 0; r < rc; r++) {
            const int32_t o = o0 + r;
            const int8_t *wr = q + (size_t)(o / COLIBRI_R4_ROWS) * COLIBRI_R4_ROWS * (size_t)n_in +
                               (size_t)full * 128u + 16u * (size_t)(o % COLIBRI_R4_ROWS);
            for (int32_t t = 0; t < T; t++) {
                float a = acc[(size_t)r * (size_t)T + (size_t)t];
                if (half) {
                    const float xs = sx[(size_t)t * nb + (size_t)full];
                    const float f = blocked ? scale[(size_t)o * nb + (size_t)full] * xs : xs;
                    a += (float)colibri_dot_q8(
                             wr, xq + (size_t)t * (size_t)n_in + (size_t)full * COLIBRI_QK8, 16) *
                         f;
                }
                y[(size_t)t * (size_t)ldy + (size_t)o] = blocked ? a : a * scale[o];
            }
        }
    }
#elif defined(COLIBRI_QI_MVE)
    (void)T; /* 2 */
    /* g0: the groups done by the fast path */
    int32_t g0 = 0;
    if (!blocked && !half && full > 0 && full <= COLIBRI_QI_MVE_NB &&
        colibri_qi_mve_scales_ok(sx, full) && colibri_qi_mve_scales_ok(sx + nb, full)) {
        colibri_qi_pairs sxp; /* the two tokens' block scales in pairs */
        for (int32_t b = 0; b < full; b++) {
            sxp.f[2 * b] = sx[b];
            sxp.f[2 * b + 1] = sx[nb + (size_t)b];
        }
        for (; g0 < groups; g0++) {
            const int32_t o = g0 * COLIBRI_R4_ROWS;
            colibri_qi_r4_group2_mve(q + (size_t)o * (size_t)n_in, xq, xq + n_in, &sxp, full,
                                     scale + o, y + o, y + (size_t)ldy + (size_t)o);
        }
    }
    for (int32_t g = g0; g < groups; g++) {
        const int8_t *wg = q + (size_t)g * COLIBRI_R4_ROWS * (size_t)n_in;
        const int32_t o = g * COLIBRI_R4_ROWS;
        const float *s0p = scale + (size_t)o * nb;
        float a[8] = {0.0f, 0.0f, 0.0f, 0.0f,
                      0.0f, 0.0f, 0.0f, 0.0f}; /* token t, row r: a[4 t + r] */
        for (int32_t b = 0; b < full; b++) {
            float f[8];
            colibri_qi_r4_block2(wg + (size_t)b * 128u, xq + (size_t)b * COLIBRI_QK8,
                                 xq + (size_t)n_in + (size_t)b * COLIBRI_QK8, f);
            /* scalar float updates (Helium's vector float flushes subnormals) */
#pragma GCC unroll 8
            for (int32_t t = 0; t < 2; t++) {
                const float xs = sx[(size_t)t * nb + (size_t)b];
#pragma GCC unroll 8
                for (int32_t r = 0; r < 4; r++) {
                    a[4 * t + r] =
                        colibri_qi_mla(a[4 * t + r], f[4 * t + r],
                                       blocked ? s0p[(size_t)r * nb + (size_t)b] * xs : xs);
                }
            }
        }
#pragma GCC unroll 8
        for (int32_t t = 0; t < 2; t++) {
            if (half) {
                const int8_t *x = xq + (size_t)t * (size_t)n_in + (size_t)full * COLIBRI_QK8;
                const float xs = sx[(size_t)t * nb + (size_t)full];
#pragma GCC unroll 8
                for (int32_t r = 0; r < 4; r++) {
                    const float f = blocked ? s0p[(size_t)r * nb + (size_t)full] * xs : xs;
                    a[4 * t + r] +=
                        (float)colibri_dot_q8(wg + (size_t)full * 128u + 16 * r, x, 16) * f;
                }
            }
#pragma GCC unroll 8
            for (int32_t r = 0; r < 4; r++) {
                y[(size_t)t * (size_t)ldy + (size_t)(o + r)] =
                    blocked ? a[4 * t + r] : a[4 * t + r] * scale[o + r];
            }
        }
    }
#else
    (void)full;
    (void)half;
    (void)groups;
    for (int32_t t = 0; t < T; t++) {
        colibri_qi_q8_q8_r4(q, scale, xq + (size_t)t * (size_t)n_in, sx + (size_t)t * nb,
                            y + (size_t)t * (size_t)ldy, n_out, n_in, blocked);
    }
    return;
#endif
    const int32_t o = groups * COLIBRI_R4_ROWS;
    if (o < n_out) { /* the last 1..3 rows, row-major */
        const int8_t *rest = q + (size_t)o * (size_t)n_in;
        if (blocked) {
            colibri_matmul_q8b_q8(rest, scale + (size_t)o * nb, xq, sx, y + o, ldy, n_out - o, n_in,
                                  T);
        } else {
            colibri_matmul_q8_q8(rest, scale + o, xq, sx, y + o, ldy, n_out - o, n_in, T);
        }
    }
}

/**
 * @brief colibri_matmul_q8_q8 (blocked = 0) or colibri_matmul_q8b_q8 (blocked = 1) on a matrix
 *        stored in layout R4, bit for bit: row t of n_tok (codes xq + t * n_in, scales
 *        sx + t * COLIBRI_Q8_BLOCKS(n_in)) to y + t * ldy, exactly what colibri_qi_q8_q8_r4
 *        writes for it. Passes of COLIBRI_QI_MT tokens, the rest one token at a time.
 */
COLIBRI_QI_INLINE void colibri_qi_mm_q8_q8_r4(const int8_t *q, const float *scale, const int8_t *xq,
                                              const float *sx, float *y, int32_t ldy, int32_t n_out,
                                              int32_t n_in, int32_t n_tok, int blocked)
{
    const size_t nb = COLIBRI_Q8_BLOCKS(n_in);
    int32_t t0 = 0;
#if COLIBRI_QI_MT > 1
    for (; t0 + COLIBRI_QI_MT <= n_tok; t0 += COLIBRI_QI_MT) {
        colibri_qi_r4_pass(q, scale, xq + (size_t)t0 * (size_t)n_in, sx + (size_t)t0 * nb,
                           y + (size_t)t0 * (size_t)ldy, ldy, n_out, n_in, COLIBRI_QI_MT, blocked);
    }
#endif
#if defined(COLIBRI_QI_SIMD32)
    if (t0 + 4 <= n_tok) { /* then one pass of 4 */
        colibri_qi_r4_pass(q, scale, xq + (size_t)t0 * (size_t)n_in, sx + (size_t)t0 * nb,
                           y + (size_t)t0 * (size_t)ldy, ldy, n_out, n_in, 4, blocked);
        t0 += 4;
    }
#endif
    for (; t0 < n_tok; t0++) {
        colibri_qi_q8_q8_r4(q, scale, xq + (size_t)t0 * (size_t)n_in, sx + (size_t)t0 * nb,
                            y + (size_t)t0 * (size_t)ldy, n_out, n_in, blocked);
    }
}

/*
 * Layout R4P (colibri/quant/formats.py r4p_order; Cortex-M4 / M7): layout R4 (n_in a multiple
 * of COLIBRI_QK8) in which every odd-indexed code c[2j+1] of a row in the groups is stored as
 * c[2j+1] - (c[2j] < 0), so that each halfword of a stored word, read as int16, is exactly
 * 256 c[2j+1] + c[2j] (codes are in [-127, 127]: the stored byte stays in [-128, 127]). The
 * n_out % 4 rows after the last group stay row-major and uncorrected.
 *
 * One SMLAD then takes the raw word: with the activation pairs O = (x1, x3) and
 * Y = (256 x0 - x1, 256 x2 - x3) (|.| <= 32639: codes in [-127, 127]) and E = SXTB16(w) =
 * (c0, c2),  SMLAD(w, O) + SMLAD(E, Y) = 256 (c0 x0 + c1 x1 + c2 x2 + c3 x3): one SXTB16 and two
 * SMLAD per 4 inputs and row instead of two and two. A block's sum is 256 times the integer dot
 * product (|.| < 2^27), converted to float with VCVT's 8 fraction bits: the same float as the
 * dot product's. The activation pairs are made once per token (colibri_qi_r4p_unpack).
 */
/** Inputs per chunk of colibri_qi_q8_q8_r4p (its activation pairs on the stack: 2 * this
 *  bytes); a multiple of COLIBRI_QK8. */
#ifndef COLIBRI_QI_R4P_CHUNK
#define COLIBRI_QI_R4P_CHUNK 256
#endif

/** The sum of a block of layout R4P (256 times the dot product) as the dot product's float. */
COLIBRI_QI_INLINE float colibri_qi_r4p_float(int32_t s)
{
#if (defined(COLIBRI_QI_MVE) || defined(COLIBRI_QI_SIMD32)) && defined(__ARM_FP) && (__ARM_FP & 4)
    float f;
    __asm__("vmov %0, %1\n"
            "vcvt.f32.s32 %0, %0, #8"
            : "=t"(f)
            : "r"(s));
    return f;
#else
    return (float)(s / 256);
#endif
}

/** n codes at x (n % 4 == 0) as R4P activation pairs: for word k, xu[2k] = Y (256 x[4k] -
 *  x[4k+1], 256 x[4k+2] - x[4k+3]) and xu[2k + 1] = O (x[4k+1], x[4k+3]), int16 halfwords. */
COLIBRI_QI_INLINE void colibri_qi_r4p_unpack(const int8_t *x, int32_t n, uint32_t *xu)
{
    for (int32_t k = 0; k < n / 4; k++) {
#if defined(COLIBRI_QI_SIMD32)
        const uint32_t v = ((const colibri_qi_word *)(const void *)x)[k];
        const uint32_t o = __sxtb16((v >> 8) | (v << 24));
        xu[2 * k] = (uint32_t)__ssub16((v << 8) & 0xFF00FF00u, o);
        xu[2 * k + 1] = o;
#else
        const int32_t y0 = 256 * (int32_t)x[4 * k] - (int32_t)x[4 * k + 1];
        const int32_t y1 = 256 * (int32_t)x[4 * k + 2] - (int32_t)x[4 * k + 3];
        xu[2 * k] = ((uint32_t)y0 & 0xFFFFu) | ((uint32_t)y1 << 16);
        xu[2 * k + 1] =
            ((uint32_t)(int32_t)x[4 * k + 1] & 0xFFFFu) | ((uint32_t)(int32_t)x[4 * k + 3] << 16);
#endif
    }
}

#if defined(COLIBRI_QI_SIMD32)
/* colibri_qi_r4p_block's assembly, by step of 8 inputs: COLIBRI_QI_PX(off) loads the pairs Y, O
 * of the step's two words (xu + off: ya, oa, yb, ob); COLIBRI_QI_PROW(s, off) one row's 8 stored
 * codes at w + off (one LDRD), each word's even codes unpacked by one SXTB16 and the raw word
 * multiplied with O; COLIBRI_QI_PROW0 starts s with SMUAD. */
#define COLIBRI_QI_PX(off)                                                                         \
    "ldrd %[ya], %[oa], [%[x], #" #off "]\n"                                                       \
    "ldrd %[yb], %[ob], [%[x], #" #off " + 8]\n"
#define COLIBRI_QI_PROW_TAIL(s)                                                                    \
    "smlad %[" #s "], %[wa], %[oa], %[" #s "]\n"                                                   \
    "sxtb16 %[t], %[wb]\n"                                                                         \
    "smlad %[" #s "], %[t], %[yb], %[" #s "]\n"                                                    \
    "smlad %[" #s "], %[wb], %[ob], %[" #s "]\n"
#define COLIBRI_QI_PROW0(s, off)                                                                   \
    "ldrd %[wa], %[wb], [%[w], #" #off "]\n"                                                       \
    "sxtb16 %[t], %[wa]\n"                                                                         \
    "smuad %[" #s "], %[t], %[ya]\n" COLIBRI_QI_PROW_TAIL(s)
#define COLIBRI_QI_PROW(s, off)                                                                    \
    "ldrd %[wa], %[wb], [%[w], #" #off "]\n"                                                       \
    "sxtb16 %[t], %[wa]\n"                                                                         \
    "smlad %[" #s "], %[t], %[ya], %[" #s "]\n" COLIBRI_QI_PROW_TAIL(s)
#endif

/** The 4 rows of an R4P group times one block of 32 inputs: wg = the group's first byte +
 *  block * 128, xu = the block's 16 activation pairs (colibri_qi_r4p_unpack); s[r] = 256 times
 *  row r's integer dot product. */
COLIBRI_QI_INLINE void colibri_qi_r4p_block(const int8_t *wg, const uint32_t *xu, int32_t s[4])
{
#if defined(COLIBRI_QI_SIMD32)
    /* Written out: 13 registers (4 sums, the two pointers, 4 activation pairs, 3 for the
     * weights). Per 8 inputs: 2 LDRD of pairs, then per row one LDRD, 2 SXTB16 and 4 SMLAD. */
    int32_t s0, s1, s2, s3;
    uint32_t ya, oa, yb, ob, wa, wb, t;
    __asm__(COLIBRI_QI_PX(0) COLIBRI_QI_PROW0(s0, 0) COLIBRI_QI_PROW0(s1, 16)
                COLIBRI_QI_PROW0(s2, 32) COLIBRI_QI_PROW0(s3, 48) COLIBRI_QI_PX(16)
                    COLIBRI_QI_PROW(s0, 8) COLIBRI_QI_PROW(s1, 24) COLIBRI_QI_PROW(s2, 40)
                        COLIBRI_QI_PROW(s3, 56) COLIBRI_QI_PX(32) COLIBRI_QI_PROW(s0, 64)
                            COLIBRI_QI_PROW(s1, 80) COLIBRI_QI_PROW(s2, 96) COLIBRI_QI_PROW(s3, 112)
                                COLIBRI_QI_PX(48) COLIBRI_QI_PROW(s0, 72) COLIBRI_QI_PROW(s1, 88)
                                    COLIBRI_QI_PROW(s2, 104) COLIBRI_QI_PROW(s3, 120)
            : [s0] "=&r"(s0), [s1] "=&r"(s1), [s2] "=&r"(s2), [s3] "=&r"(s3), [ya] "=&r"(ya),
              [oa] "=&r"(oa), [yb] "=&r"(yb), [ob] "=&r"(ob), [wa] "=&r"(wa), [wb] "=&r"(wb),
              [t] "=&r"(t)
            : [w] "r"(wg), [x] "r"(xu), "m"(*(const int8_t(*)[128])wg),
              "m"(*(const uint32_t(*)[16])xu));
    s[0] = s0;
    s[1] = s1;
    s[2] = s2;
    s[3] = s3;
#else
    for (int32_t r = 0; r < 4; r++) {
        int32_t acc = 0;
        for (int32_t k = 0; k < 8; k++) {
            const int8_t *w = wg + 64 * (k / 4) + 16 * r + 4 * (k % 4);
            const uint32_t y = xu[2 * k], o = xu[2 * k + 1];
            acc += (int32_t)w[0] * (int32_t)(int16_t)(y & 0xFFFFu) +
                   ((int32_t)w[1] * 256 + (int32_t)(uint8_t)w[0]) * (int32_t)(int16_t)(o & 0xFFFFu);
            acc += (int32_t)w[2] * (int32_t)(int16_t)(y >> 16) +
                   ((int32_t)w[3] * 256 + (int32_t)(uint8_t)w[2]) * (int32_t)(int16_t)(o >> 16);
        }
        s[r] = acc;
    }
#endif
}

/**
 * @brief colibri_matvec_q8_q8 (blocked = 0) or colibri_matvec_q8b_q8 (blocked = 1) on a matrix
 *        stored in layout R4P, bit for bit; n_in must be a multiple of COLIBRI_QK8. The
 *        activation pairs of up to COLIBRI_QI_R4P_CHUNK inputs at a time sit on the stack; a
 *        row's running sum waits in y between chunks (a float stored and loaded back is the
 *        same float).
 */
COLIBRI_QI_INLINE void colibri_qi_q8_q8_r4p(const int8_t *q, const float *scale, const int8_t *xq,
                                            const float *sx, float *y, int32_t n_out, int32_t n_in,
                                            int blocked)
{
    const size_t nb = COLIBRI_Q8_BLOCKS(n_in);
    const int32_t groups = n_out / COLIBRI_R4_ROWS;
    for (int32_t c0 = 0; c0 < n_in; c0 += COLIBRI_QI_R4P_CHUNK) {
        const int32_t cn = (n_in - c0 < COLIBRI_QI_R4P_CHUNK) ? n_in - c0 : COLIBRI_QI_R4P_CHUNK;
        const int32_t b0 = c0 / COLIBRI_QK8;
        uint32_t xu[COLIBRI_QI_R4P_CHUNK / 2];
        colibri_qi_r4p_unpack(xq + c0, cn, xu);
        for (int32_t g = 0; g < groups; g++) {
            const int8_t *wg = q + (size_t)g * COLIBRI_R4_ROWS * (size_t)n_in + (size_t)c0 * 4u;
            const int32_t o = g * COLIBRI_R4_ROWS;
            float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
            if (c0 > 0) {
                a0 = y[o];
                a1 = y[o + 1];
                a2 = y[o + 2];
                a3 = y[o + 3];
            }
            const float *s0p = scale + (size_t)o * nb; /* blocked: row o's block scales */
            for (int32_t b = 0; b < cn / COLIBRI_QK8; b++) {
                int32_t s[4];
                colibri_qi_r4p_block(wg + (size_t)b * 128u, xu + 16 * b, s);
                const size_t bb = (size_t)(b0 + b);
                const float xs = sx[bb];
                if (blocked) {
                    a0 = colibri_qi_mla(a0, colibri_qi_r4p_float(s[0]), s0p[bb] * xs);
                    a1 = colibri_qi_mla(a1, colibri_qi_r4p_float(s[1]), s0p[nb + bb] * xs);
                    a2 = colibri_qi_mla(a2, colibri_qi_r4p_float(s[2]), s0p[2u * nb + bb] * xs);
                    a3 = colibri_qi_mla(a3, colibri_qi_r4p_float(s[3]), s0p[3u * nb + bb] * xs);
                } else {
                    a0 = colibri_qi_mla(a0, colibri_qi_r4p_float(s[0]), xs);
                    a1 = colibri_qi_mla(a1, colibri_qi_r4p_float(s[1]), xs);
                    a2 = colibri_qi_mla(a2, colibri_qi_r4p_float(s[2]), xs);
                    a3 = colibri_qi_mla(a3, colibri_qi_r4p_float(s[3]), xs);
                }
            }
            if (blocked || c0 + cn < n_in) {
                y[o] = a0;
                y[o + 1] = a1;
                y[o + 2] = a2;
                y[o + 3] = a3;
            } else {
                y[o] = a0 * scale[o];
                y[o + 1] = a1 * scale[o + 1];
                y[o + 2] = a2 * scale[o + 2];
                y[o + 3] = a3 * scale[o + 3];
            }
        }
    }
    const int32_t o = groups * COLIBRI_R4_ROWS;
    if (o < n_out) { /* the last 1..3 rows, row-major, uncorrected */
        const int8_t *rest = q + (size_t)o * (size_t)n_in;
        if (blocked) {
            colibri_matvec_q8b_q8(rest, scale + (size_t)o * nb, xq, sx, y + o, n_out - o, n_in);
        } else {
            colibri_matvec_q8_q8(rest, scale + o, xq, sx, y + o, n_out - o, n_in);
        }
    }
}

/** y[o] = y[o] + bias[o] (bias not NULL), then y[o] = y[o] > 0 ? y[o] : 0 (relu), for
 *  o0 <= o < n: a generated relu expert kernel's steps on its hidden row, in its order. */
COLIBRI_QI_INLINE void colibri_qi_bias_relu(float *y, int32_t o0, int32_t n, const float *bias,
                                            int relu)
{
    for (int32_t o = o0; o < n; o++) {
        float v = y[o];
        if (bias != NULL) {
            v = v + bias[o];
        }
        if (relu) {
            v = v > 0.0f ? v : 0.0f;
        }
        y[o] = v;
    }
}

#if defined(COLIBRI_QI_SIMD32)
/*
 * The multi-token R4P tile (Cortex-M4 / M7): one row of an R4P group times 4 tokens over one
 * block of 32 inputs. Per step of 8 inputs: one LDRD of the row's two stored words; each word
 * first multiplies (raw) the 4 tokens' O pairs, then is turned in place into its even codes (one
 * SXTB16) for their Y pairs; the step's 16 pairs come in three LDM (6, 6 and 4 registers). An LDM
 * fills registers in ascending order, so the pairs go to r0..r5 by name, clobbered (local
 * register variables made GCC 12 fail with an internal error on small shapes). 22 instructions
 * per 32 MACs, in 14 core registers (4 sums, the 2 weight words, 6 pairs and the two pointers).
 * With two rows per tile (the pairs shared by both rows) the 14 registers leave room for two
 * pairs at a time only: 24 per 32. Then the block's float steps in a second statement: the 4
 * sums to s0..s3 (one VMOV per two), VCVT with 8 fraction bits (the dot products' floats, as
 * colibri_qi_r4p_float), the 4 tokens' block scales in one VLDM and VMLA into the running sums
 * (colibri_qi_mla's operation, in the same order).
 * The activations of a chunk sit on the stack as, per block: for each word k the O pairs of
 * tokens 0..3, then their Y pairs (colibri_qi_r4p_unpack), then the 4 block scales
 * (COLIBRI_QI_GBLOCK bytes).
 */
/* one instruction per line: clang-format would reflow the string concatenation */
/* clang-format off */
#define COLIBRI_QI_ACC_smuad(i) ""
#define COLIBRI_QI_ACC_smlad(i) ", %[a" #i "]"
/* sum i += word w times the pair in register x (op smuad: sum i = ...) */
#define COLIBRI_QI_M(op, i, w, x)                                                                  \
    #op " %[a" #i "], %[" #w "], " #x COLIBRI_QI_ACC_##op(i) "\n"
/* the step of 8 inputs at wr + off (words a, b): O pairs of word a (r0..r3) and Y pairs of tokens
 * 0, 1 (r4, r5); Y of tokens 2, 3 (r0, r1) and O of word b (r2..r5); Y of word b (r0..r3) */
#define COLIBRI_QI_S1(op, off)                                                                     \
    "ldrd %[wa], %[wb], [%[wr], #" #off "]\n"                                                      \
    "ldmia %[xp]!, {r0-r5}\n"                                                                      \
    COLIBRI_QI_M(op, 0, wa, r0) COLIBRI_QI_M(op, 1, wa, r1)                                        \
    COLIBRI_QI_M(op, 2, wa, r2) COLIBRI_QI_M(op, 3, wa, r3)                                        \
    "sxtb16 %[wa], %[wa]\n"                                                                        \
    COLIBRI_QI_M(smlad, 0, wa, r4) COLIBRI_QI_M(smlad, 1, wa, r5)                                  \
    "ldmia %[xp]!, {r0-r5}\n"                                                                      \
    COLIBRI_QI_M(smlad, 2, wa, r0) COLIBRI_QI_M(smlad, 3, wa, r1)                                  \
    COLIBRI_QI_M(smlad, 0, wb, r2) COLIBRI_QI_M(smlad, 1, wb, r3)                                  \
    COLIBRI_QI_M(smlad, 2, wb, r4) COLIBRI_QI_M(smlad, 3, wb, r5)                                  \
    "sxtb16 %[wb], %[wb]\n"                                                                        \
    "ldmia %[xp]!, {r0-r3}\n"                                                                      \
    COLIBRI_QI_M(smlad, 0, wb, r0) COLIBRI_QI_M(smlad, 1, wb, r1)                                  \
    COLIBRI_QI_M(smlad, 2, wb, r2) COLIBRI_QI_M(smlad, 3, wb, r3)
/* clang-format on */
/* block sum in s<s> to its float, times the scale in s<x>, into f */
#define COLIBRI_QI_GF(f, s, x)                                                                     \
    "vcvt.f32.s32 s" #s ", s" #s ", #8\n"                                                          \
    "vmla.f32 %[" #f "], s" #s ", s" #x "\n"

/** Bytes of one block of activations of 4 tokens on the stack (pairs, then block scales). */
#define COLIBRI_QI_GBLOCK (8 * 4 * 8 + 4 * 4)

/** Inputs per chunk of a multi-token R4P pass (its activations on the stack: COLIBRI_QI_GBLOCK
 *  bytes per 32 inputs); a multiple of COLIBRI_QK8. */
#ifndef COLIBRI_QI_R4P_GCHUNK
#define COLIBRI_QI_R4P_GCHUNK 256
#endif
/** Words of a chunk's activations on the stack (xu: the tile's last argument). */
#define COLIBRI_QI_GWORDS (COLIBRI_QI_R4P_GCHUNK / COLIBRI_QK8 * COLIBRI_QI_GBLOCK / 4)

/** Row r of an R4P group (wr = group + block * 128 + 16 r) times one block of 4 tokens at *xpp
 *  (COLIBRI_QI_GBLOCK bytes of xu; *xpp is advanced past them): f[t] = mla(f[t], the row's dot
 *  product with token t, xs_t). */
COLIBRI_QI_INLINE void colibri_qi_r4p_tile(const int8_t *wr, const uint32_t **xpp, float f[4],
                                           const uint32_t *xu)
{
    const uint32_t *xp = *xpp;
    int32_t a0, a1, a2, a3;
    uint32_t wa, wb;
    float f0 = f[0], f1 = f[1], f2 = f[2], f3 = f[3];
    __asm__(COLIBRI_QI_S1(smuad, 0) COLIBRI_QI_S1(smlad, 8) COLIBRI_QI_S1(smlad, 64)
                COLIBRI_QI_S1(smlad, 72)
            : [a0] "=&r"(a0), [a1] "=&r"(a1), [a2] "=&r"(a2), [a3] "=&r"(a3), [wa] "=&r"(wa),
              [wb] "=&r"(wb), [xp] "+r"(xp)
            : [wr] "r"(wr), "m"(*(const int8_t(*)[80])wr),
              "m"(*(const uint32_t(*)[COLIBRI_QI_GWORDS])xu)
            : "r0", "r1", "r2", "r3", "r4", "r5");
    __asm__("vmov s0, s1, %[a0], %[a1]\n"
            "vmov s2, s3, %[a2], %[a3]\n"
            "vldmia %[xp]!, {s8-s11}\n" COLIBRI_QI_GF(f0, 0, 8) COLIBRI_QI_GF(f1, 1, 9)
                COLIBRI_QI_GF(f2, 2, 10) COLIBRI_QI_GF(f3, 3, 11)
            : [xp] "+r"(xp), [f0] "+t"(f0), [f1] "+t"(f1), [f2] "+t"(f2), [f3] "+t"(f3)
            : [a0] "r"(a0), [a1] "r"(a1), [a2] "r"(a2), [a3] "r"(a3),
              "m"(*(const uint32_t(*)[COLIBRI_QI_GWORDS])xu)
            : "d0", "d1", "d4", "d5");
    *xpp = xp;
    f[0] = f0;
    f[1] = f1;
    f[2] = f2;
    f[3] = f3;
}

/** One pass of colibri_qi_mm_q8_q8_r4p_act (per-row scales) over 4 tokens: per chunk of inputs,
 *  the tokens' activation pairs and block scales are laid out on the stack once, then every
 *  row of the groups runs its tiles over the chunk's blocks, the running sums waiting in y
 *  between chunks (a float stored and loaded back is the same float). */
COLIBRI_QI_INLINE void colibri_qi_r4p_pass4(const int8_t *q, const float *scale, const int8_t *xq,
                                            const float *sx, float *y, int32_t ldy, int32_t n_out,
                                            int32_t n_in, const float *bias, int relu)
{
    const size_t nb = COLIBRI_Q8_BLOCKS(n_in);
    const int32_t rows = n_out / COLIBRI_R4_ROWS * COLIBRI_R4_ROWS;
    for (int32_t c0 = 0; c0 < n_in; c0 += COLIBRI_QI_R4P_GCHUNK) {
        const int32_t cn = (n_in - c0 < COLIBRI_QI_R4P_GCHUNK) ? n_in - c0 : COLIBRI_QI_R4P_GCHUNK;
        const int32_t cb = cn / COLIBRI_QK8;
        const int32_t b0 = c0 / COLIBRI_QK8;
        uint32_t xu[COLIBRI_QI_GWORDS];
        for (int32_t b = 0; b < cb; b++) {
            uint32_t *xb = xu + (size_t)b * (COLIBRI_QI_GBLOCK / 4);
#pragma GCC unroll 4
            for (int32_t t = 0; t < 4; t++) {
                const colibri_qi_word *xw =
                    (const colibri_qi_word *)(const void *)(xq + (size_t)t * (size_t)n_in +
                                                            (size_t)(c0 + COLIBRI_QK8 * b));
#pragma GCC unroll 8
                for (int32_t k = 0; k < 8; k++) {
                    const uint32_t v = xw[k];
                    const uint32_t o = __sxtb16((v >> 8) | (v << 24));
                    xb[8 * k + t] = o;
                    xb[8 * k + 4 + t] = (uint32_t)__ssub16((v << 8) & 0xFF00FF00u, o);
                }
                memcpy(&xb[64 + t], &sx[(size_t)t * nb + (size_t)(b0 + b)], sizeof(float));
            }
        }
        /* pointers walk the rows: wr = the row's first weight of the chunk, yo = its output (a
         * tile per row: two rows per loop would need more registers than the tile leaves) */
        const int8_t *wg = q + (size_t)c0 * 4u;
        const int last = c0 + cn >= n_in;
        float *yo = y;
        for (int32_t o = 0; o < rows; o++, yo++) {
            const int8_t *wr = wg + 16u * (size_t)(o % COLIBRI_R4_ROWS);
            float f[4];
#pragma GCC unroll 4
            for (int32_t t = 0; t < 4; t++) {
                f[t] = (c0 > 0) ? yo[(size_t)t * (size_t)ldy] : 0.0f;
            }
            const uint32_t *xp = xu;
            const int8_t *wend = wr + (size_t)cb * 128u;
            do {
                colibri_qi_r4p_tile(wr, &xp, f, xu);
                wr += 128;
            } while (wr != wend);
            if (last) {
                const float sc = scale[o];
#pragma GCC unroll 4
                for (int32_t t = 0; t < 4; t++) {
                    f[t] = f[t] * sc;
                }
                if (bias != NULL) {
                    const float bb = bias[o];
#pragma GCC unroll 4
                    for (int32_t t = 0; t < 4; t++) {
                        f[t] = f[t] + bb;
                    }
                }
                if (relu) {
#pragma GCC unroll 4
                    for (int32_t t = 0; t < 4; t++) {
                        f[t] = f[t] > 0.0f ? f[t] : 0.0f;
                    }
                }
            }
#pragma GCC unroll 4
            for (int32_t t = 0; t < 4; t++) {
                yo[(size_t)t * (size_t)ldy] = f[t];
            }
            if (o % COLIBRI_R4_ROWS == 3) {
                wg += COLIBRI_R4_ROWS * (size_t)n_in;
            }
        }
    }
    if (rows < n_out) { /* the last 1..3 rows, row-major, uncorrected */
        colibri_matmul_q8_q8(q + (size_t)rows * (size_t)n_in, scale + rows, xq, sx, y + rows, ldy,
                             n_out - rows, n_in, 4);
        for (int32_t t = 0; t < 4; t++) {
            colibri_qi_bias_relu(y + (size_t)t * (size_t)ldy, rows, n_out, bias, relu);
        }
    }
}
#endif

/**
 * @brief colibri_qi_mm_q8_q8_r4p (per-row scales) followed by a relu expert kernel's steps on
 *        each output row: + bias (when not NULL), then relu (when relu != 0), bit for bit, the
 *        same operations in the same order (colibri_qi_bias_relu). On the Cortex-M4 / M7, passes
 *        of 4 tokens (colibri_qi_r4p_pass4) do them as they store each output; the rest a
 *        token at a time.
 */
COLIBRI_QI_INLINE void colibri_qi_mm_q8_q8_r4p_act(const int8_t *q, const float *scale,
                                                   const int8_t *xq, const float *sx, float *y,
                                                   int32_t ldy, int32_t n_out, int32_t n_in,
                                                   int32_t n_tok, const float *bias, int relu)
{
    const size_t nb = COLIBRI_Q8_BLOCKS(n_in);
    int32_t t0 = 0;
#if defined(COLIBRI_QI_SIMD32)
    for (; t0 + 4 <= n_tok; t0 += 4) {
        colibri_qi_r4p_pass4(q, scale, xq + (size_t)t0 * (size_t)n_in, sx + (size_t)t0 * nb,
                             y + (size_t)t0 * (size_t)ldy, ldy, n_out, n_in, bias, relu);
    }
#endif
    for (int32_t t = t0; t < n_tok; t++) {
        float *yt = y + (size_t)t * (size_t)ldy;
        colibri_qi_q8_q8_r4p(q, scale, xq + (size_t)t * (size_t)n_in, sx + (size_t)t * nb, yt,
                             n_out, n_in, 0);
        if (bias != NULL || relu) {
            colibri_qi_bias_relu(yt, 0, n_out, bias, relu);
        }
    }
}

/**
 * @brief colibri_matmul_q8_q8 (blocked = 0) or colibri_matmul_q8b_q8 (blocked = 1) on a matrix
 *        stored in layout R4P, bit for bit (the arguments of colibri_qi_mm_q8_q8_r4): with
 *        per-row scales colibri_qi_mm_q8_q8_r4p_act without bias or relu; blocked scales a
 *        token at a time.
 */
COLIBRI_QI_INLINE void colibri_qi_mm_q8_q8_r4p(const int8_t *q, const float *scale,
                                               const int8_t *xq, const float *sx, float *y,
                                               int32_t ldy, int32_t n_out, int32_t n_in,
                                               int32_t n_tok, int blocked)
{
    if (!blocked) {
        colibri_qi_mm_q8_q8_r4p_act(q, scale, xq, sx, y, ldy, n_out, n_in, n_tok, NULL, 0);
        return;
    }
    const size_t nb = COLIBRI_Q8_BLOCKS(n_in);
    for (int32_t t = 0; t < n_tok; t++) {
        colibri_qi_q8_q8_r4p(q, scale, xq + (size_t)t * (size_t)n_in, sx + (size_t)t * nb,
                             y + (size_t)t * (size_t)ldy, n_out, n_in, 1);
    }
}

/**
 * @brief h[j] = h[j] > 0.0f ? h[j] : 0.0f for j < n, bit for bit (what a generated relu expert
 *        kernel applies to its hidden row). Helium: on the bits as int32, four lanes at a time:
 *        max(bits, 0) makes every negative value and -0 +0, then bits above +infinity's (a NaN)
 *        become +0; no float operation, so nothing is flushed.
 */
COLIBRI_QI_INLINE void colibri_qi_relu_row(float *h, int32_t n)
{
    int32_t j = 0;
#if defined(COLIBRI_QI_MVE)
    for (; j + 4 <= n; j += 4) {
        int32x4_t v = vmaxq_s32(vreinterpretq_s32_f32(vld1q_f32(h + j)), vdupq_n_s32(0));
        v = vpselq_s32(vdupq_n_s32(0), v, vcmpgtq_n_s32(v, 0x7F800000));
        vst1q_f32(h + j, vreinterpretq_f32_s32(v));
    }
#endif
    for (; j < n; j++) {
        h[j] = h[j] > 0.0f ? h[j] : 0.0f;
    }
}

#ifdef __cplusplus
}
#endif

#include "colibri_qinline_q4.h" /* colibri_qi_q4_q8: int4 x int8 */

#endif /* COLIBRI_QINLINE_H */
