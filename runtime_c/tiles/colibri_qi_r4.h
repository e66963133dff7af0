/**
 * @file colibri_qi_r4.h
 * @brief Generated-code support (runtime_c/tiles): int8 x int8 kernels on layout R4 (four output
 *        rows per pass; colibri_qi_q8_q8_r4, colibri_qi_mm_q8_q8_r4), see colibri_qinline.h.
 */
#ifndef COLIBRI_QI_R4_H
#define COLIBRI_QI_R4_H

#include "colibri_qi_common.h"

#ifdef __cplusplus
extern "C" {
#endif

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
/* The head of a row (layouts R4 and R4P): its 8 weights at w + off (one LDRD), the first word's
 * bytes 0 and 2 (SXTB16) times the activation pair register xa, starting the row's sum (SMUAD,
 * HEAD0) or adding to it (SMLAD, HEAD). */
#define COLIBRI_QI_HEAD0(s, off, xa)                                                               \
    "ldrd %[wa], %[wb], [%[w], #" #off "]\n"                                                       \
    "sxtb16 %[t], %[wa]\n"                                                                         \
    "smuad %[" #s "], %[t], %[" #xa "]\n"
#define COLIBRI_QI_HEAD(s, off, xa)                                                                \
    "ldrd %[wa], %[wb], [%[w], #" #off "]\n"                                                       \
    "sxtb16 %[t], %[wa]\n"                                                                         \
    "smlad %[" #s "], %[t], %[" #xa "], %[" #s "]\n"
#define COLIBRI_QI_ROW0(s, off) COLIBRI_QI_HEAD0(s, off, xa) COLIBRI_QI_ROW_TAIL(s)
#define COLIBRI_QI_ROW(s, off) COLIBRI_QI_HEAD(s, off, xa) COLIBRI_QI_ROW_TAIL(s)
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
    COLIBRI_QI_STORE4(s, s);
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
        : COLIBRI_QI_SUMS4("=&r", s), [xa] "=&r"(xa), [xb] "=&r"(xb), [x1] "=&r"(x1),
          [x3] "=&r"(x3), [wa] "=&r"(wa), [wb] "=&r"(wb), [t] "=&r"(t)
        : [w] "r"(wg), [x] "r"(x), "m"(*(const int8_t(*)[128])wg), "m"(*(const int8_t(*)[32])x));
    COLIBRI_QI_STORE4(s, s);
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

/* colibri_qi_r4_group_mve's assembly (one instruction per line: clang-format would reflow the
 * string concatenation). The loop over the whole blocks (WLS: none when nb is 0); the last half
 * block of 16 codes (a chunk: the 4 rows' 16 weights each at w, w + 16, w + 32, w + 48); the
 * epilogue. */
/* clang-format off */
#define COLIBRI_QI_G1_LOOP                                                                         \
    "vmov.i32 q0, #0\n"                                                                            \
    "wls lr, %[nb], 2f\n"                                                                          \
    "1:\n"                                                                                         \
    "vldrb.8 q3, [%[x], #16]\n"                                                                    \
    "vldrb.8 q2, [%[x]], #32\n"                                                                    \
    "vldrb.8 q4, [%[w]], #64\n"                                                                    \
    "vmladav.s8 %[s0], q4, q2\n"                                                                   \
    "vldrb.8 q4, [%[w], #-48]\n"                                                                   \
    "vmladav.s8 %[s1], q4, q2\n"                                                                   \
    "vldrb.8 q4, [%[w], #-32]\n"                                                                   \
    "vmladav.s8 %[s2], q4, q2\n"                                                                   \
    "vldrb.8 q4, [%[w], #-16]\n"                                                                   \
    "vmladav.s8 %[s3], q4, q2\n"                                                                   \
    "vldrb.8 q4, [%[w]], #64\n"                                                                    \
    "vmladava.s8 %[s0], q4, q3\n"                                                                  \
    "vldrb.8 q4, [%[w], #-48]\n"                                                                   \
    "vmladava.s8 %[s1], q4, q3\n"                                                                  \
    "vldrb.8 q4, [%[w], #-32]\n"                                                                   \
    "vmladava.s8 %[s2], q4, q3\n"                                                                  \
    "vldrb.8 q4, [%[w], #-16]\n"                                                                   \
    "vmladava.s8 %[s3], q4, q3\n"                                                                  \
    "vmov q1[2], q1[0], %[s0], %[s2]\n"                                                            \
    "vmov q1[3], q1[1], %[s1], %[s3]\n"                                                            \
    "ldr %[s0], [%[sp]], #4\n"                                                                     \
    "vcvt.f32.s32 q1, q1\n"                                                                        \
    "vmul.f32 q1, q1, %[s0]\n"                                                                     \
    "vadd.f32 q0, q0, q1\n"                                                                        \
    "le lr, 1b\n"                                                                                  \
    "2:\n"
#define COLIBRI_QI_G1_HALF                                                                         \
    "vldrb.8 q2, [%[x]]\n"                                                                         \
    "vldrb.8 q4, [%[w]]\n"                                                                         \
    "vmladav.s8 %[s0], q4, q2\n"                                                                   \
    "vldrb.8 q4, [%[w], #16]\n"                                                                    \
    "vmladav.s8 %[s1], q4, q2\n"                                                                   \
    "vldrb.8 q4, [%[w], #32]\n"                                                                    \
    "vmladav.s8 %[s2], q4, q2\n"                                                                   \
    "vldrb.8 q4, [%[w], #48]\n"                                                                    \
    "vmladav.s8 %[s3], q4, q2\n"                                                                   \
    "vmov q1[2], q1[0], %[s0], %[s2]\n"                                                            \
    "vmov q1[3], q1[1], %[s1], %[s3]\n"                                                            \
    "ldr %[s0], [%[sp]]\n"                                                                         \
    "vcvt.f32.s32 q1, q1\n"                                                                        \
    "vmul.f32 q1, q1, %[s0]\n"                                                                     \
    "vadd.f32 q0, q0, q1\n"
#define COLIBRI_QI_G1_END                                                                          \
    "vmov %[s0], %[s2], q0[2], q0[0]\n"                                                            \
    "vmov %[s1], %[s3], q0[3], q0[1]\n"                                                            \
    "vmov s4, s5, %[s0], %[s1]\n"                                                                  \
    "vmov s6, s7, %[s2], %[s3]\n"                                                                  \
    "vldmia %[sc], {s8-s11}\n"                                                                     \
    "vmul.f32 s4, s4, s8\n"                                                                        \
    "vmul.f32 s5, s5, s9\n"                                                                        \
    "vmul.f32 s6, s6, s10\n"                                                                       \
    "vmul.f32 s7, s7, s11\n"                                                                       \
    "vstmia %[y], {s4-s7}\n"
/* clang-format on */
/* the operands: reads wg, xq, sx and scale's 4 floats, writes y's 4 */
#define COLIBRI_QI_G1_OPERANDS                                                                     \
    : [w] "+r"(w), [x] "+r"(x), [sp] "+r"(sp), COLIBRI_QI_SUMS4("=&Te", s)                         \
    : [nb] "r"(nb), [sc] "r"(scale), [y] "r"(y)                                                    \
    : "memory", "lr", "d0", "d1", "d2", "d3", "d4", "d5", "d6", "d7", "d8", "d9"

/** colibri_qi_q8_q8_r4's 4 outputs of one R4 group over nb (>= 0) whole blocks of 32 codes and,
 *  when half, a last block of 16 (nb + half >= 1; Helium, per-row scales, block scales checked
 *  by colibri_qi_mve_scales_ok): y[r] = a_r * scale[r]. Per block: 2 vector loads of codes, per
 *  row one of weights and a VMLADAV(A), then the 4 sums moved into one vector (two lane-pair
 *  moves), converted, times the block's scale and added to the running sums, 4 lanes at a time
 *  (the scalar operations, same order: the half block's a += (float)dot * xs is the same
 *  multiply and add). The sums come back to core registers through the inverse lane-pair moves
 *  (so the rows' lanes do not depend on how the pair move orders its lanes) and take the last
 *  product in scalar float: a weight scale may be subnormal. Registers q0..q4 are fixed (q0 =
 *  the running sums, q1 = the block's products then the outputs, q2 / q3 = the codes then the
 *  weight scales, q4 = weights). */
COLIBRI_QI_INLINE void colibri_qi_r4_group_mve(const int8_t *wg, const int8_t *xq, const float *sx,
                                               int32_t nb, int half, const float *scale, float *y)
{
    const int8_t *w = wg;
    const int8_t *x = xq;
    const float *sp = sx;
    int32_t s0, s1, s2, s3;
    if (half) {
        __asm__ volatile(
            COLIBRI_QI_G1_LOOP COLIBRI_QI_G1_HALF COLIBRI_QI_G1_END COLIBRI_QI_G1_OPERANDS);
    } else {
        __asm__ volatile(COLIBRI_QI_G1_LOOP COLIBRI_QI_G1_END COLIBRI_QI_G1_OPERANDS);
    }
}
#endif

/* What the one-token R4 and R4P kernels share, on the running sums a0..a3 of a group's 4 rows
 * (macros: the same statements in both, so the same instructions).
 * COLIBRI_QI_R4_MLA4: after one block, a_r += V(r) * (blocked ? sp[r * nb + bb] * xs : xs)
 * (colibri_qi_mla), V(r) = row r's integer dot product s[r] as a float.
 * COLIBRI_QI_R4_STORE: y[o + r] = a_r (plain), else a_r * scale[o + r].
 * COLIBRI_QI_Q8_REST(o0): rows o0..n_out - 1 (after the last group: row-major) by the library,
 * colibri_matvec_q8b_q8 (blocked) or colibri_matvec_q8_q8 (inlined on the Cortex-M4 / M7:
 * colibri_qi_q8_rest_rows; the kernel's parameters in scope). */
#define COLIBRI_QI_R4_INT(r) ((float)s[r])
#define COLIBRI_QI_R4_MLA4(V, sp, bb, nb, xs, blocked)                                             \
    if (blocked) {                                                                                 \
        a0 = colibri_qi_mla(a0, V(0), sp[bb] * xs);                                                \
        a1 = colibri_qi_mla(a1, V(1), sp[nb + bb] * xs);                                           \
        a2 = colibri_qi_mla(a2, V(2), sp[2u * nb + bb] * xs);                                      \
        a3 = colibri_qi_mla(a3, V(3), sp[3u * nb + bb] * xs);                                      \
    } else {                                                                                       \
        a0 = colibri_qi_mla(a0, V(0), xs);                                                         \
        a1 = colibri_qi_mla(a1, V(1), xs);                                                         \
        a2 = colibri_qi_mla(a2, V(2), xs);                                                         \
        a3 = colibri_qi_mla(a3, V(3), xs);                                                         \
    }
#define COLIBRI_QI_R4_STORE(y, o, scale, plain)                                                    \
    if (plain) {                                                                                   \
        y[o] = a0;                                                                                 \
        y[o + 1] = a1;                                                                             \
        y[o + 2] = a2;                                                                             \
        y[o + 3] = a3;                                                                             \
    } else {                                                                                       \
        y[o] = a0 * scale[o];                                                                      \
        y[o + 1] = a1 * scale[o + 1];                                                              \
        y[o + 2] = a2 * scale[o + 2];                                                              \
        y[o + 3] = a3 * scale[o + 3];                                                              \
    }
#if defined(COLIBRI_QI_SIMD32)
/** Integer dot products of the 4 rows of an R4 group with a half block of 16 codes (the group's
 *  last chunk: wg = its 64 bytes, x = the 16 codes): colibri_qi_r4_block's first two steps. */
COLIBRI_QI_INLINE void colibri_qi_r4_half(const int8_t *wg, const int8_t *x, int32_t s[4])
{
    int32_t s0, s1, s2, s3;
    uint32_t xa, xb, x1, x3, wa, wb, t;
    __asm__(COLIBRI_QI_X(0) COLIBRI_QI_ROW0(s0, 0) COLIBRI_QI_ROW0(s1, 16) COLIBRI_QI_ROW0(s2, 32)
                COLIBRI_QI_ROW0(s3, 48) COLIBRI_QI_X(8) COLIBRI_QI_ROW(s0, 8) COLIBRI_QI_ROW(s1, 24)
                    COLIBRI_QI_ROW(s2, 40) COLIBRI_QI_ROW(s3, 56)
            : COLIBRI_QI_SUMS4("=&r", s), [xa] "=&r"(xa), [xb] "=&r"(xb), [x1] "=&r"(x1),
              [x3] "=&r"(x3), [wa] "=&r"(wa), [wb] "=&r"(wb), [t] "=&r"(t)
            : [w] "r"(wg), [x] "r"(x), "m"(*(const int8_t(*)[64])wg), "m"(*(const int8_t(*)[16])x));
    COLIBRI_QI_STORE4(s, s);
}
#endif

/** colibri_dot_q8(w, x, 16): the integer dot product of a half block (16 codes each, 4-byte
 *  aligned), inlined on the Cortex-M4 / M7 (per word two SXTB16 of each side and two SMLAD)
 *  instead of a library call per row; the library elsewhere. */
COLIBRI_QI_INLINE int32_t colibri_qi_dot16(const int8_t *w, const int8_t *x)
{
#if defined(COLIBRI_QI_SIMD32)
    const colibri_qi_word *ww = (const colibri_qi_word *)(const void *)w;
    const colibri_qi_word *xw = (const colibri_qi_word *)(const void *)x;
    int32_t s = 0;
#pragma GCC unroll 4
    for (int32_t k = 0; k < 4; k++) {
        const uint32_t a = ww[k];
        const uint32_t b = xw[k];
        s = __smlad(__sxtb16(a), __sxtb16(b), s);
        s = __smlad(__sxtb16((a >> 8) | (a << 24)), __sxtb16((b >> 8) | (b << 24)), s);
    }
    return s;
#else
    return colibri_dot_q8(w, x, 16);
#endif
}

#if defined(COLIBRI_QI_SIMD32)
/** colibri_matvec_q8_q8 on the n (1..3) row-major rows at q after the last R4 / R4P group,
 *  inlined (Cortex-M4 / M7; n_in a multiple of 16, rows and codes 4-byte aligned): per word of 4
 *  codes, the activations unpacked once (two SXTB16) for the rows, each row's word by two SXTB16
 *  and two SMLAD; per block a += (float)dot * sx[b], then y[r] = a * scale[r], the library's
 *  operations in its order (the integer block sums do not depend on theirs). */
COLIBRI_QI_INLINE void colibri_qi_q8_rest_rows(const int8_t *q, const float *scale,
                                               const int8_t *xq, const float *sx, float *y,
                                               int32_t n, int32_t n_in)
{
    const colibri_qi_word *xw = (const colibri_qi_word *)(const void *)xq;
    const colibri_qi_word *w0 = (const colibri_qi_word *)(const void *)q;
    const colibri_qi_word *w1 = w0 + n_in / 4;
    const colibri_qi_word *w2 = w1 + n_in / 4;
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f;
    for (int32_t i0 = 0, b = 0; i0 < n_in; i0 += COLIBRI_QK8, b++) {
        const int32_t k1 = (i0 + COLIBRI_QK8 <= n_in ? i0 + COLIBRI_QK8 : n_in) / 4;
        int32_t s0 = 0, s1 = 0, s2 = 0;
        for (int32_t k = i0 / 4; k < k1; k++) {
            const uint32_t v = xw[k];
            const uint32_t xe = __sxtb16(v);
            const uint32_t xo = __sxtb16((v >> 8) | (v << 24));
            uint32_t wv = w0[k];
            s0 = __smlad(__sxtb16(wv), xe, s0);
            s0 = __smlad(__sxtb16((wv >> 8) | (wv << 24)), xo, s0);
            if (n > 1) {
                wv = w1[k];
                s1 = __smlad(__sxtb16(wv), xe, s1);
                s1 = __smlad(__sxtb16((wv >> 8) | (wv << 24)), xo, s1);
            }
            if (n > 2) {
                wv = w2[k];
                s2 = __smlad(__sxtb16(wv), xe, s2);
                s2 = __smlad(__sxtb16((wv >> 8) | (wv << 24)), xo, s2);
            }
        }
        const float xs = sx[b];
        a0 += (float)s0 * xs;
        a1 += (float)s1 * xs;
        a2 += (float)s2 * xs;
    }
    y[0] = a0 * scale[0];
    if (n > 1) {
        y[1] = a1 * scale[1];
    }
    if (n > 2) {
        y[2] = a2 * scale[2];
    }
}
#endif

#if defined(COLIBRI_QI_SIMD32)
#define COLIBRI_QI_REST_ROWS(rest, o)                                                              \
    colibri_qi_q8_rest_rows(rest, scale + o, xq, sx, y + o, n_out - o, n_in)
#else
#define COLIBRI_QI_REST_ROWS(rest, o)                                                              \
    colibri_matvec_q8_q8(rest, scale + o, xq, sx, y + o, n_out - o, n_in)
#endif
#define COLIBRI_QI_Q8_REST(o0)                                                                     \
    do {                                                                                           \
        const int32_t o = (o0);                                                                    \
        if (o < n_out) {                                                                           \
            const int8_t *rest = q + (size_t)o * (size_t)n_in;                                     \
            if (blocked) {                                                                         \
                colibri_matvec_q8b_q8(rest, scale + (size_t)o * nb, xq, sx, y + o, n_out - o,      \
                                      n_in);                                                       \
            } else {                                                                               \
                COLIBRI_QI_REST_ROWS(rest, o);                                                     \
            }                                                                                      \
        }                                                                                          \
    } while (0)

/** colibri_qi_q8_q8_r4's groups g0..groups - 1 (4 rows each) one block at a time, the same
 *  arithmetic (its arguments; full / half / nb from n_in). */
COLIBRI_QI_INLINE void colibri_qi_r4_groups(const int8_t *q, const float *scale, const int8_t *xq,
                                            const float *sx, float *y, int32_t n_in, int32_t g0,
                                            int32_t groups, int blocked)
{
    const int32_t full = n_in / COLIBRI_QK8;
    const int32_t half = (n_in % COLIBRI_QK8) != 0; /* a last block of 16 inputs */
    const size_t nb = COLIBRI_Q8_BLOCKS(n_in);
    for (int32_t g = g0; g < groups; g++) {
        const int8_t *wg = q + (size_t)g * COLIBRI_R4_ROWS * (size_t)n_in;
        const int32_t o = g * COLIBRI_R4_ROWS;
        float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
        const float *s0p = scale + (size_t)o * nb; /* blocked: row o's block scales */
        for (int32_t b = 0; b < full; b++) {
            int32_t s[4];
            colibri_qi_r4_block(wg + (size_t)b * 128u, xq + (size_t)b * COLIBRI_QK8, s);
            const float xs = sx[b];
            COLIBRI_QI_R4_MLA4(COLIBRI_QI_R4_INT, s0p, (size_t)b, nb, xs, blocked);
        }
        if (half) {
            const int8_t *w = wg + (size_t)full * 128u;
            const int8_t *x = xq + (size_t)full * COLIBRI_QK8;
            const float xs = sx[full];
            const float f0 = blocked ? s0p[full] * xs : xs;
            const float f1 = blocked ? s0p[nb + (size_t)full] * xs : xs;
            const float f2 = blocked ? s0p[2u * nb + (size_t)full] * xs : xs;
            const float f3 = blocked ? s0p[3u * nb + (size_t)full] * xs : xs;
#if defined(COLIBRI_QI_SIMD32)
            int32_t s[4];
            colibri_qi_r4_half(w, x, s);
#else
            const int32_t s[4] = {colibri_qi_dot16(w, x), colibri_qi_dot16(w + 16, x),
                                  colibri_qi_dot16(w + 32, x), colibri_qi_dot16(w + 48, x)};
#endif
            a0 += (float)s[0] * f0;
            a1 += (float)s[1] * f1;
            a2 += (float)s[2] * f2;
            a3 += (float)s[3] * f3;
        }
        COLIBRI_QI_R4_STORE(y, o, scale, blocked);
    }
}

#if defined(COLIBRI_QI_MVE)
/** colibri_qi_r4_groups out of line: on Helium the fallback of colibri_qi_q8_q8_r4's fast path
 *  (block scales outside its guard, blocked scales), cold, so one copy serves every matrix. */
COLIBRI_QI_SHARED void colibri_qi_r4_groups_cold(const int8_t *q, const float *scale,
                                                 const int8_t *xq, const float *sx, float *y,
                                                 int32_t n_in, int32_t g0, int32_t groups,
                                                 int blocked)
{
    colibri_qi_r4_groups(q, scale, xq, sx, y, n_in, g0, groups, blocked);
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
    const size_t nb = COLIBRI_Q8_BLOCKS(n_in);
    const int32_t groups = n_out / COLIBRI_R4_ROWS;
#if defined(COLIBRI_QI_MVE)
    int32_t g0 = 0; /* the groups done by the fast path */
    if (!blocked && colibri_qi_mve_scales_ok(sx, (int32_t)nb)) {
        const int32_t full = n_in / COLIBRI_QK8;
        const int32_t half = (n_in % COLIBRI_QK8) != 0; /* a last block of 16 inputs */
        for (; g0 < groups; g0++) {
            const int32_t o = g0 * COLIBRI_R4_ROWS;
            colibri_qi_r4_group_mve(q + (size_t)o * (size_t)n_in, xq, sx, full, half, scale + o,
                                    y + o);
        }
    }
    if (g0 < groups) {
        colibri_qi_r4_groups_cold(q, scale, xq, sx, y, n_in, g0, groups, blocked);
    }
#else
    colibri_qi_r4_groups(q, scale, xq, sx, y, n_in, 0, groups, blocked);
#endif
    COLIBRI_QI_Q8_REST(groups * COLIBRI_R4_ROWS); /* row-major */
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
    __asm__(
        COLIBRI_QI_W(0) COLIBRI_QI_T0(a0, 0) COLIBRI_QI_T0(a1, 8) COLIBRI_QI_T0(a2, 16)
            COLIBRI_QI_T0(a3, 24) COLIBRI_QI_T0(a4, 32) COLIBRI_QI_T0(a5, 40) COLIBRI_QI_T0(
                a6, 48) COLIBRI_QI_T0(a7, 56) COLIBRI_QI_K(4, 64, 72, 80, 88, 96, 104, 112, 120)
                COLIBRI_QI_K(8, 128, 136, 144, 152, 160, 168, 176,
                             184) COLIBRI_QI_K(12, 192, 200, 208, 216, 224, 232, 240, 248)
                    COLIBRI_QI_K(64, 256, 264, 272, 280, 288, 296, 304, 312) COLIBRI_QI_K(
                        68, 320, 328, 336, 344, 352,
                        360, 368, 376) COLIBRI_QI_K(72, 384, 392, 400, 408, 416, 424, 432, 440)
                        COLIBRI_QI_K(76, 448, 456, 464, 472, 480, 488, 496, 504)
        : COLIBRI_QI_SUMS8("=&r", a), [we] "=&r"(we), [wo] "=&r"(wo), [xa] "=&r"(xa), [xb] "=&r"(xb)
        : [wr] "r"(wr), [xp] "r"(xu), "m"(*(const int8_t(*)[80])wr),
          "m"(*(const uint32_t(*)[128])xu));
    COLIBRI_QI_STORE8(s, a);
}

#define COLIBRI_QI_K4(woff, x0, x1, x2, x3)                                                        \
    COLIBRI_QI_W(woff)                                                                             \
    COLIBRI_QI_T(a0, x0) COLIBRI_QI_T(a1, x1) COLIBRI_QI_T(a2, x2) COLIBRI_QI_T(a3, x3)

/** colibri_qi_r1_block8 for a pass of 4 tokens (pairs of word k, token t at xu + k * 32 + 8 t). */
COLIBRI_QI_INLINE void colibri_qi_r1_block4(const int8_t *wr, const uint32_t *xu, int32_t s[4])
{
    int32_t a0, a1, a2, a3;
    uint32_t we, wo, xa, xb;
    __asm__(
        COLIBRI_QI_W(0) COLIBRI_QI_T0(a0, 0) COLIBRI_QI_T0(a1, 8) COLIBRI_QI_T0(a2, 16)
            COLIBRI_QI_T0(a3, 24) COLIBRI_QI_K4(4, 32, 40, 48, 56) COLIBRI_QI_K4(8, 64, 72, 80, 88)
                COLIBRI_QI_K4(12, 96, 104, 112, 120) COLIBRI_QI_K4(64, 128, 136, 144, 152)
                    COLIBRI_QI_K4(68, 160, 168, 176, 184) COLIBRI_QI_K4(72, 192, 200, 208, 216)
                        COLIBRI_QI_K4(76, 224, 232, 240, 248)
        : COLIBRI_QI_SUMS4("=&r", a), [we] "=&r"(we), [wo] "=&r"(wo), [xa] "=&r"(xa), [xb] "=&r"(xb)
        : [wr] "r"(wr), [xp] "r"(xu), "m"(*(const int8_t(*)[80])wr),
          "m"(*(const uint32_t(*)[64])xu));
    COLIBRI_QI_STORE4(s, a);
}
#endif

#if defined(COLIBRI_QI_MVE)
/* colibri_qi_r4_block2's assembly: COLIBRI_QI_V(op, r, woff, ca, cb) loads row r's 16 weights of
 * a chunk at w + woff once and multiplies them with both tokens' codes of that chunk (vector
 * operands ca, cb) into s<r>, u<r>; COLIBRI_QI_PAIR does it for rows r and r1 (weights at woff and
 * woff + 16); COLIBRI_QI_ROWS2(r, r1, woff) does rows r and r1 over both chunks (codes xa / xb,
 * then xc / xd; weights 64 bytes on). */
#define COLIBRI_QI_V(op, r, woff, ca, cb)                                                          \
    "vldrb.8 %q[wv], [%[w], #" #woff "]\n" #op ".s8 %[s" #r "], %q[wv], %q[" #ca "]\n" #op         \
    ".s8 %[u" #r "], %q[wv], %q[" #cb "]\n"
#define COLIBRI_QI_PAIR(op, r, r1, woff, ca, cb)                                                   \
    COLIBRI_QI_V(op, r, woff, ca, cb) COLIBRI_QI_V(op, r1, woff + 16, ca, cb)
#define COLIBRI_QI_ROWS2(r, r1, woff)                                                              \
    COLIBRI_QI_PAIR(vmladav, r, r1, woff, xa, xb)                                                  \
    COLIBRI_QI_PAIR(vmladava, r, r1, woff + 64, xc, xd)

/** The 4 rows of an R4 group times one block of 32 codes of 2 tokens (x0, x1): the integer dot
 *  products as floats (exact: |sum| < 2^24), f[4 t + r] for token t and row r. Per 16 inputs: 2
 *  vector loads of codes, then per row one of weights and 2 VMLADAV(A). Written out in two
 *  statements of 2 rows (4 sums) each: VMLADAV accumulates in even core registers, which are 8
 *  with LR, and a low-overhead loop around the kernel holds LR (8 sums in one statement were
 *  impossible constraints, issue 40: d_model 48 on the Cortex-M55). The codes are loaded once,
 *  before both. */
COLIBRI_QI_INLINE void colibri_qi_r4_block2(const int8_t *wg, const int8_t *x0, const int8_t *x1,
                                            float f[8])
{
    int32_t s0, s1, s2, s3, u0, u1, u2, u3;
    int8x16_t wv;
    const int8x16_t xa = vld1q_s8(x0);
    const int8x16_t xb = vld1q_s8(x1);
    const int8x16_t xc = vld1q_s8(x0 + 16);
    const int8x16_t xd = vld1q_s8(x1 + 16);
    __asm__(COLIBRI_QI_ROWS2(0, 1, 0)
            : [s0] "=&Te"(s0), [s1] "=&Te"(s1), [u0] "=&Te"(u0), [u1] "=&Te"(u1), [wv] "=&w"(wv)
            : [w] "r"(wg), [xa] "w"(xa), [xb] "w"(xb), [xc] "w"(xc), [xd] "w"(xd),
              "m"(*(const int8_t(*)[128])wg));
    __asm__(COLIBRI_QI_ROWS2(2, 3, 32)
            : [s2] "=&Te"(s2), [s3] "=&Te"(s3), [u2] "=&Te"(u2), [u3] "=&Te"(u3), [wv] "=&w"(wv)
            : [w] "r"(wg), [xa] "w"(xa), [xb] "w"(xb), [xc] "w"(xc), [xd] "w"(xd),
              "m"(*(const int8_t(*)[128])wg));
    f[0] = (float)s0;
    f[1] = (float)s1;
    f[2] = (float)s2;
    f[3] = (float)s3;
    f[4] = (float)u0;
    f[5] = (float)u1;
    f[6] = (float)u2;
    f[7] = (float)u3;
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

/* colibri_qi_r4_group2_mve's assembly (one instruction per line: clang-format would reflow
 * the string concatenation): the loop over the whole blocks (WLS: none when nb is 0); the last
 * half block of 16 codes (one chunk: the 4 rows' 16 weights at w, w + 16, w + 32, w + 48, the
 * loop body's first chunk); the epilogue. */
/* clang-format off */
/* a block step's end: the two tokens' four int32 sums to fp32, times the block's scale pair
 * (ldrd from the pairs, post-incremented), added into q0 (token 0) and q5 (token 1) */
#define COLIBRI_QI_G2_SCALE                                                                        \
    "vmov q1[2], q1[0], %[e0], %[e1]\n"                                                            \
    "ldrd %[e0], %[e1], [%[sp]], #8\n"                                                             \
    "vcvt.f32.s32 q1, q1\n"                                                                        \
    "vmul.f32 q1, q1, %[e0]\n"                                                                     \
    "vadd.f32 q0, q0, q1\n"                                                                        \
    "vmov q1[2], q1[0], %[e4], %[e5]\n"                                                            \
    "vmov q1[3], q1[1], %[e2], %[e3]\n"                                                            \
    "vcvt.f32.s32 q1, q1\n"                                                                        \
    "vmul.f32 q1, q1, %[e1]\n"                                                                     \
    "vadd.f32 q5, q5, q1\n"
#define COLIBRI_QI_G2_LOOP                                                                         \
    "vmov.i32 q0, #0\n"                                                                            \
    "vmov.i32 q5, #0\n"                                                                            \
    "wls lr, %[nb], 2f\n"                                                                          \
    "1:\n"                                                                                         \
    "vldrb.8 q3, [%[xa], #16]\n"                                                                   \
    "vldrb.8 q2, [%[xa]], #32\n"                                                                   \
    "vldrb.8 q7, [%[xb], #16]\n"                                                                   \
    "vldrb.8 q6, [%[xb]], #32\n"                                                                   \
    /* rows 1 and 3 (chunk 0 at w + 16 / 48, chunk 1 at w + 80 / 112) */                           \
    "vldrb.8 q4, [%[w], #16]\n"                                                                    \
    "vmladav.s8 %[e0], q4, q2\n"                                                                   \
    "vmladav.s8 %[e2], q4, q6\n"                                                                   \
    "vldrb.8 q4, [%[w], #48]\n"                                                                    \
    "vmladav.s8 %[e1], q4, q2\n"                                                                   \
    "vmladav.s8 %[e3], q4, q6\n"                                                                   \
    "vldrb.8 q4, [%[w], #80]\n"                                                                    \
    "vmladava.s8 %[e0], q4, q3\n"                                                                  \
    "vmladava.s8 %[e2], q4, q7\n"                                                                  \
    "vldrb.8 q4, [%[w], #112]\n"                                                                   \
    "vmladava.s8 %[e1], q4, q3\n"                                                                  \
    "vmladava.s8 %[e3], q4, q7\n"                                                                  \
    "vmov q1[3], q1[1], %[e0], %[e1]\n"                                                            \
    /* rows 0 and 2 (w, w + 32, then w + 96, w + 64; w ends 128 on) */                             \
    "vldrb.8 q4, [%[w]], #64\n"                                                                    \
    "vmladav.s8 %[e0], q4, q2\n"                                                                   \
    "vmladav.s8 %[e4], q4, q6\n"                                                                   \
    "vldrb.8 q4, [%[w], #-32]\n"                                                                   \
    "vmladav.s8 %[e1], q4, q2\n"                                                                   \
    "vmladav.s8 %[e5], q4, q6\n"                                                                   \
    "vldrb.8 q4, [%[w], #32]\n"                                                                    \
    "vmladava.s8 %[e1], q4, q3\n"                                                                  \
    "vmladava.s8 %[e5], q4, q7\n"                                                                  \
    "vldrb.8 q4, [%[w]], #64\n"                                                                    \
    "vmladava.s8 %[e0], q4, q3\n"                                                                  \
    "vmladava.s8 %[e4], q4, q7\n"                                                                  \
    COLIBRI_QI_G2_SCALE                                                                            \
    "le lr, 1b\n"                                                                                  \
    "2:\n"
#define COLIBRI_QI_G2_HALF                                                                         \
    "vldrb.8 q2, [%[xa]]\n"                                                                        \
    "vldrb.8 q6, [%[xb]]\n"                                                                        \
    /* rows 1 and 3 (at w + 16 / 48) */                                                            \
    "vldrb.8 q4, [%[w], #16]\n"                                                                    \
    "vmladav.s8 %[e0], q4, q2\n"                                                                   \
    "vmladav.s8 %[e2], q4, q6\n"                                                                   \
    "vldrb.8 q4, [%[w], #48]\n"                                                                    \
    "vmladav.s8 %[e1], q4, q2\n"                                                                   \
    "vmladav.s8 %[e3], q4, q6\n"                                                                   \
    "vmov q1[3], q1[1], %[e0], %[e1]\n"                                                            \
    /* rows 0 and 2 (at w, w + 32) */                                                              \
    "vldrb.8 q4, [%[w]]\n"                                                                         \
    "vmladav.s8 %[e0], q4, q2\n"                                                                   \
    "vmladav.s8 %[e4], q4, q6\n"                                                                   \
    "vldrb.8 q4, [%[w], #32]\n"                                                                    \
    "vmladav.s8 %[e1], q4, q2\n"                                                                   \
    "vmladav.s8 %[e5], q4, q6\n"                                                                   \
    COLIBRI_QI_G2_SCALE
#define COLIBRI_QI_G2_END                                                                          \
    "ldr %[xa], [%[sp]]\n"                                                                         \
    "ldr %[xb], [%[sp], #4]\n"                                                                     \
    "ldr %[w], [%[sp], #8]\n"                                                                      \
    "vmov %[e0], %[e1], q0[2], q0[0]\n" /* rows 0, 2 */                                            \
    "vmov %[e2], %[e3], q0[3], q0[1]\n" /* rows 1, 3 */                                            \
    "vmov s4, s5, %[e0], %[e2]\n"                                                                  \
    "vmov s6, s7, %[e1], %[e3]\n"                                                                  \
    "vmov %[e0], %[e1], q5[2], q5[0]\n"                                                            \
    "vmov %[e2], %[e3], q5[3], q5[1]\n"                                                            \
    "vmov s12, s13, %[e0], %[e2]\n"                                                                \
    "vmov s14, s15, %[e1], %[e3]\n"                                                                \
    "vldmia %[xa], {s8-s11}\n"                                                                     \
    "vmul.f32 s4, s4, s8\n"                                                                        \
    "vmul.f32 s5, s5, s9\n"                                                                        \
    "vmul.f32 s6, s6, s10\n"                                                                       \
    "vmul.f32 s7, s7, s11\n"                                                                       \
    "vmul.f32 s12, s12, s8\n"                                                                      \
    "vmul.f32 s13, s13, s9\n"                                                                      \
    "vmul.f32 s14, s14, s10\n"                                                                     \
    "vmul.f32 s15, s15, s11\n"                                                                     \
    "vstmia %[xb], {s4-s7}\n"                                                                      \
    "vstmia %[w], {s12-s15}\n"
/* clang-format on */
/* the operands: reads wg, x0, x1, *sxp and scale's 4 floats, writes y0's and y1's 4 */
#define COLIBRI_QI_G2_OPERANDS                                                                     \
    : [w] "+r"(w), [xa] "+r"(xa), [xb] "+r"(xb), [sp] "+r"(sp), [e0] "=&Te"(e0),                   \
    [e1] "=&Te"(e1), [e2] "=&Te"(e2), [e3] "=&Te"(e3), [e4] "=&Te"(e4), [e5] "=&Te"(e5)            \
    : [nb] "r"(nb)                                                                                 \
    : "memory", "lr", "d0", "d1", "d2", "d3", "d4", "d5", "d6", "d7", "d8", "d9", "d10", "d11",    \
    "d12", "d13", "d14", "d15"

/** colibri_qi_r4_group_mve for 2 tokens (codes x0 and x1, block scales interleaved in sxp: x0's
 *  then x1's of each of the nb whole blocks and, when half, of the last half block): each weight
 *  vector is loaded once and VMLADAV'd with both tokens' codes; y0 / y1 = the 4 outputs of each.
 * Registers q0..q7 are fixed (q0 / q5 = the running sums of token 0 / 1, q1 = products, q2 q3 / q6
 * q7 = the codes, q4 = weights). */
COLIBRI_QI_INLINE void colibri_qi_r4_group2_mve(const int8_t *wg, const int8_t *x0,
                                                const int8_t *x1, colibri_qi_pairs *sxp, int32_t nb,
                                                int half, const float *scale, float *y0, float *y1)
{
    /* the epilogue's pointers right after the nb + half pairs, where the scale pointer ends up:
     * the loop needs every other register */
    const int32_t np = nb + (half ? 1 : 0);
    sxp->p[2 * np] = (uintptr_t)scale;
    sxp->p[2 * np + 1] = (uintptr_t)y0;
    sxp->p[2 * np + 2] = (uintptr_t)y1;
    const int8_t *w = wg;
    const int8_t *xa = x0;
    const int8_t *xb = x1;
    const float *sp = sxp->f;
    int32_t e0, e1, e2, e3, e4, e5; /* sums: rows 1, 3 then 0, 2 of x0 in e0 e1; x1's in e2..e5 */
    if (half) {
        __asm__ volatile(
            COLIBRI_QI_G2_LOOP COLIBRI_QI_G2_HALF COLIBRI_QI_G2_END COLIBRI_QI_G2_OPERANDS);
    } else {
        __asm__ volatile(COLIBRI_QI_G2_LOOP COLIBRI_QI_G2_END COLIBRI_QI_G2_OPERANDS);
    }
}
#endif

#if defined(COLIBRI_QI_MVE)
/** colibri_qi_r4_pass's Helium fallback (block scales outside the fast path's guard, blocked
 *  scales, n_in over 32 * COLIBRI_QI_MVE_NB): groups g0..groups - 1 of 2 tokens, the float steps
 *  in scalar code. Cold, so out of line: one copy serves every matrix. */
COLIBRI_QI_SHARED void colibri_qi_r4_groups2_cold(const int8_t *q, const float *scale,
                                                  const int8_t *xq, const float *sx, float *y,
                                                  int32_t ldy, int32_t n_in, int32_t g0,
                                                  int32_t groups, int blocked)
{
    const int32_t full = n_in / COLIBRI_QK8;
    const int32_t half = (n_in % COLIBRI_QK8) != 0;
    const size_t nb = COLIBRI_Q8_BLOCKS(n_in);
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
                        (float)colibri_qi_dot16(wg + (size_t)full * 128u + 16 * r, x) * f;
                }
            }
#pragma GCC unroll 8
            for (int32_t r = 0; r < 4; r++) {
                y[(size_t)t * (size_t)ldy + (size_t)(o + r)] =
                    blocked ? a[4 * t + r] : a[4 * t + r] * scale[o + r];
            }
        }
    }
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
                    a += (float)colibri_qi_dot16(wr, xq + (size_t)t * (size_t)n_in +
                                                         (size_t)full * COLIBRI_QK8) *
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
    if (!blocked && nb <= COLIBRI_QI_MVE_NB && colibri_qi_mve_scales_ok(sx, (int32_t)nb) &&
        colibri_qi_mve_scales_ok(sx + nb, (int32_t)nb)) {
        colibri_qi_pairs sxp; /* the two tokens' block scales in pairs */
        for (size_t b = 0; b < nb; b++) {
            sxp.f[2 * b] = sx[b];
            sxp.f[2 * b + 1] = sx[nb + b];
        }
        for (; g0 < groups; g0++) {
            const int32_t o = g0 * COLIBRI_R4_ROWS;
            colibri_qi_r4_group2_mve(q + (size_t)o * (size_t)n_in, xq, xq + n_in, &sxp, full, half,
                                     scale + o, y + o, y + (size_t)ldy + (size_t)o);
        }
    }
    if (g0 < groups) {
        colibri_qi_r4_groups2_cold(q, scale, xq, sx, y, ldy, n_in, g0, groups, blocked);
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

#ifdef __cplusplus
}
#endif

#endif /* COLIBRI_QI_R4_H */
