/**
 * @file colibri_qinline_q4.h
 * @brief Shape-specialised int4 x int8 kernel for generated code (issue 11), included by
 *        colibri_qinline.h: colibri_qi_q4_q8 returns what colibri_matvec_q4_q8 returns, bit for
 *        bit, on the same row-major colibri_block_q4_32 matrix (no other layout).
 *
 * Static and always inlined: a generated expert kernel calls it with its dimensions as
 * constants, so there is no call per row or per 32-weight block. Four output rows per pass, so
 * each activation block is loaded and unpacked once for four rows. The nibbles are unsigned
 * (q in 0..15, weight q - 8): the integer block sum is computed as sum q * x - 8 * sum x, the
 * activation sum taken once per block and pass (integer sums do not depend on their order).
 *  - Cortex-M4 / M7 (32-bit SIMD): per row and 4 bytes of nibbles (8 weights) one LDR, two
 *    ANDs with 0x0F0F0F0F (low nibbles, and the high nibbles shifted down), four UXTB16 and four
 *    SMLAD against the activation pairs that SXTB16 unpacked once for the four rows.
 *  - Helium: per row and block one 16-byte load, VAND / VSHR for the two nibble halves and two
 *    VMLADAVA (16 MACs each), started at -8 * sum x; generated kernels read layout Q4H4 below
 *    (colibri_qi_q4_q8_q4h4: the 4 rows' blocks contiguous, one assembly statement per block).
 * The float update per block is the library's, in its order: acc += (float)isum * (d * sx[b]),
 * in scalar FPU instructions written out (colibri_qi_mul, colibri_qi_mla: not fused, and not
 * left to the vectoriser, since Helium's vector float flushes subnormals and makes default NaNs).
 * The fp16 scale d is converted with VCVTB where the FPU has it, which equals the library's
 * conversion for every finite d, subnormals included (the cores run with flush-to-zero off), and
 * for infinities; a NaN d gives a NaN either way once it is multiplied by sx[b]. Elsewhere (other
 * cores) the library is called: one call per matrix, whose loops are the core's path of
 * kernels_q.c (on the ESP32-S3 the MAC16 matvec of runtime_c/arch/xtensa/kernels_mac16_q4.h,
 * activations expanded once for all rows, 1.75 instructions per MAC in its inner loop).
 */
#ifndef COLIBRI_QINLINE_Q4_H
#define COLIBRI_QINLINE_Q4_H

#include "colibri_qi_common.h" /* COLIBRI_QI_INLINE, the ISA, colibri_qi_word, colibri_qi_mla */

#ifdef __cplusplus
extern "C" {
#endif

/** Output rows per pass of colibri_qi_q4_q8. */
#define COLIBRI_Q4I_ROWS 4

#if defined(COLIBRI_QI_MVE) || defined(COLIBRI_QI_SIMD32)
/** The fp16 scale of a block as fp32: colibri_f16_to_f32's value (see the file comment). */
COLIBRI_QI_INLINE float colibri_qi_f16(uint16_t h)
{
#if defined(__ARM_FP) && (__ARM_FP & 4) && defined(__ARM_ARCH_PROFILE) && __ARM_ARCH_PROFILE == 'M'
    float s;
    float r;
    __asm__("vmov %0, %1" : "=t"(s) : "r"((uint32_t)h));
    __asm__("vcvtb.f32.f16 %0, %1" : "=t"(r) : "t"(s));
    return r;
#else
    return colibri_f16_to_f32(h);
#endif
}
#endif

/** b * c in one scalar VMUL: four rows' independent products are otherwise open to the
 *  compiler's vectoriser, and Helium's vector float differs from the scalar FPU (it flushes
 *  subnormals and makes default NaNs). */
COLIBRI_QI_INLINE float colibri_qi_mul(float b, float c)
{
#if (defined(COLIBRI_QI_MVE) || defined(COLIBRI_QI_SIMD32)) && defined(__ARM_FP) && (__ARM_FP & 4)
    float r;
    __asm__("vmul.f32 %0, %1, %2" : "=t"(r) : "t"(b), "t"(c));
    return r;
#else
    return b * c;
#endif
}

#if defined(COLIBRI_QI_SIMD32)
/** Four nibble bytes or activation codes as one word, at any alignment (LDR allows it). */
typedef uint32_t __attribute__((may_alias, aligned(1))) colibri_q4i_word;

/* One step's activations: the words of 4 codes at lo and hi, unpacked by SXTB16 into the pairs
 * xe0 / xo0 (lo's even / odd codes) and xe1 / xo1 (hi's), declared here; their sum is added to
 * the two halfword lanes of xsum. */
#define COLIBRI_Q4I_X(lo, hi)                                                                      \
    uint32_t xe0, xo0, xe1, xo1;                                                                   \
    __asm__(                                                                                       \
        "ldr %[o0], %[l]\n"                                                                        \
        "ldr %[o1], %[h]\n"                                                                        \
        "sxtb16 %[e0], %[o0]\n"                                                                    \
        "sxtb16 %[o0], %[o0], ror #8\n"                                                            \
        "sxtb16 %[e1], %[o1]\n"                                                                    \
        "sxtb16 %[o1], %[o1], ror #8\n"                                                            \
        : [e0] "=&r"(xe0), [o0] "=&r"(xo0), [e1] "=&r"(xe1), [o1] "=&r"(xo1)                       \
        : [l] "m"(*(const colibri_q4i_word *)(const void *)(lo)), [h] "m"(*(                       \
                                                                      const colibri_q4i_word       \
                                                                          *)(const void *)(hi)));  \
    xsum = __sadd16(xsum, __sadd16(__sadd16(xe0, xo0), __sadd16(xe1, xo1)))

/** A block's 4 integer sums: each row's sum q * x (a0..a3, nibbles q in 0..15) less 8 * the sum
 *  of the 32 codes (xsum: in two halfword lanes). */
COLIBRI_QI_INLINE void colibri_qi_q4_sums(int32_t a0, int32_t a1, int32_t a2, int32_t a3,
                                          uint32_t xsum, int32_t s[4])
{
    const int32_t off = 8 * __smuad(xsum, 0x00010001u);
    s[0] = a0 - off;
    s[1] = a1 - off;
    s[2] = a2 - off;
    s[3] = a3 - off;
}

/* One row's 8 weights of a step: the 4 bytes of nibbles at p (loaded in the asm, so the
 * compiler cannot hoist the loads of every step and spill them), low nibbles paired with the
 * activations whose SXTB16 pairs are xe0 / xo0, high nibbles with xe1 / xo1; into acc. */
#define COLIBRI_Q4I_ROW(acc, p)                                                                    \
    __asm__("ldr %[v], %[w]\n"                                                                     \
            "and %[h], %[m], %[v], lsr #4\n"                                                       \
            "and %[v], %[v], %[m]\n"                                                               \
            "uxtb16 %[t], %[v]\n"                                                                  \
            "smlad %[a], %[t], %[e0], %[a]\n"                                                      \
            "uxtb16 %[t], %[v], ror #8\n"                                                          \
            "smlad %[a], %[t], %[o0], %[a]\n"                                                      \
            "uxtb16 %[t], %[h]\n"                                                                  \
            "smlad %[a], %[t], %[e1], %[a]\n"                                                      \
            "uxtb16 %[t], %[h], ror #8\n"                                                          \
            "smlad %[a], %[t], %[o1], %[a]\n"                                                      \
            : [a] "+r"(acc), [v] "=&r"(vv), [h] "=&r"(hh), [t] "=&r"(tt)                           \
            : [w] "m"(*(const colibri_q4i_word *)(const void *)(p)), [m] "r"(mask), [e0] "r"(xe0), \
              [o0] "r"(xo0), [e1] "r"(xe1), [o1] "r"(xo1))

/** Integer sums of 4 rows' full blocks (qs of row r at q[r]) with one block of 32 codes. */
COLIBRI_QI_INLINE void colibri_qi_q4_block4(const uint8_t *q0, const uint8_t *q1, const uint8_t *q2,
                                            const uint8_t *q3, const int8_t *x, int32_t s[4])
{
    const uint32_t mask = 0x0F0F0F0Fu;
    int32_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    uint32_t xsum = 0; /* two halfword lanes of activation sums */
#pragma GCC unroll 4
    for (int32_t j = 0; j < 16; j += 4) {
        COLIBRI_Q4I_X(x + j, x + j + 16);
        uint32_t vv, hh, tt;
        COLIBRI_Q4I_ROW(a0, q0 + j);
        COLIBRI_Q4I_ROW(a1, q1 + j);
        COLIBRI_Q4I_ROW(a2, q2 + j);
        COLIBRI_Q4I_ROW(a3, q3 + j);
    }
    colibri_qi_q4_sums(a0, a1, a2, a3, xsum, s);
}
#undef COLIBRI_Q4I_ROW
#endif

#if defined(COLIBRI_QI_MVE)
/** Integer sums of 4 rows' full blocks (qs of row r at q[r]) with one block of 32 codes. */
COLIBRI_QI_INLINE void colibri_qi_q4_block4(const uint8_t *q0, const uint8_t *q1, const uint8_t *q2,
                                            const uint8_t *q3, const int8_t *x, int32_t s[4])
{
    const int8x16_t xl = vld1q_s8(x);
    const int8x16_t xh = vld1q_s8(x + 16);
    const int32_t off = -8 * vaddvaq_s8(vaddvq_s8(xl), xh);
    /* the nibble mask made here, once per block (volatile: not hoisted out of the caller's
     * loop, where the compiler would keep it on the stack and load it for every row) */
    uint8x16_t m;
    __asm__ volatile("vmov.i8 %q0, #15" : "=w"(m));
    const uint8x16_t v0 = vld1q_u8(q0);
    const uint8x16_t v1 = vld1q_u8(q1);
    const uint8x16_t v2 = vld1q_u8(q2);
    const uint8x16_t v3 = vld1q_u8(q3);
    int32_t a0 = vmladavaq_s8(off, vreinterpretq_s8_u8(vandq_u8(v0, m)), xl);
    int32_t a1 = vmladavaq_s8(off, vreinterpretq_s8_u8(vandq_u8(v1, m)), xl);
    int32_t a2 = vmladavaq_s8(off, vreinterpretq_s8_u8(vandq_u8(v2, m)), xl);
    int32_t a3 = vmladavaq_s8(off, vreinterpretq_s8_u8(vandq_u8(v3, m)), xl);
    s[0] = vmladavaq_s8(a0, vreinterpretq_s8_u8(vshrq_n_u8(v0, 4)), xh);
    s[1] = vmladavaq_s8(a1, vreinterpretq_s8_u8(vshrq_n_u8(v1, 4)), xh);
    s[2] = vmladavaq_s8(a2, vreinterpretq_s8_u8(vshrq_n_u8(v2, 4)), xh);
    s[3] = vmladavaq_s8(a3, vreinterpretq_s8_u8(vshrq_n_u8(v3, 4)), xh);
}
#endif

/**
 * @brief colibri_matvec_q4_q8 bit for bit: y[o] = sum_b (float)isum_b * (d_b * sx[b]), blocks
 *        in order, on the row-major blocks w [n_out][COLIBRI_Q4_BLOCKS(n_in)]. Compile-time
 *        n_out / n_in at the call site resolve every loop bound and tail.
 */
COLIBRI_QI_INLINE void colibri_qi_q4_q8(const colibri_block_q4_32 *w, const int8_t *xq,
                                        const float *sx, float *y, int32_t n_out, int32_t n_in)
{
#if defined(COLIBRI_QI_MVE) || defined(COLIBRI_QI_SIMD32)
    const int32_t full = n_in / COLIBRI_QK4;
    const int32_t tail = n_in - full * COLIBRI_QK4; /* inputs of a last partial block */
    const size_t nb = COLIBRI_Q4_BLOCKS(n_in);
    const int32_t groups = n_out / COLIBRI_Q4I_ROWS;
    for (int32_t g = 0; g < groups; g++) {
        const int32_t o = g * COLIBRI_Q4I_ROWS;
        const colibri_block_q4_32 *r0 = w + (size_t)o * nb;
        const colibri_block_q4_32 *r1 = r0 + nb;
        const colibri_block_q4_32 *r2 = r1 + nb;
        const colibri_block_q4_32 *r3 = r2 + nb;
        float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
        for (int32_t b = 0; b < full; b++) {
            int32_t s[4];
            colibri_qi_q4_block4(r0[b].qs, r1[b].qs, r2[b].qs, r3[b].qs,
                                 xq + (size_t)b * COLIBRI_QK4, s);
            const float xs = sx[b];
            a0 = colibri_qi_mla(a0, (float)s[0], colibri_qi_mul(colibri_qi_f16(r0[b].d), xs));
            a1 = colibri_qi_mla(a1, (float)s[1], colibri_qi_mul(colibri_qi_f16(r1[b].d), xs));
            a2 = colibri_qi_mla(a2, (float)s[2], colibri_qi_mul(colibri_qi_f16(r2[b].d), xs));
            a3 = colibri_qi_mla(a3, (float)s[3], colibri_qi_mul(colibri_qi_f16(r3[b].d), xs));
        }
        if (tail > 0) {
            const int8_t *x = xq + (size_t)full * COLIBRI_QK4;
            const float xs = sx[full];
            a0 = colibri_qi_mla(a0, (float)colibri_dot_q4_q8(&r0[full], x, tail),
                                colibri_qi_mul(colibri_qi_f16(r0[full].d), xs));
            a1 = colibri_qi_mla(a1, (float)colibri_dot_q4_q8(&r1[full], x, tail),
                                colibri_qi_mul(colibri_qi_f16(r1[full].d), xs));
            a2 = colibri_qi_mla(a2, (float)colibri_dot_q4_q8(&r2[full], x, tail),
                                colibri_qi_mul(colibri_qi_f16(r2[full].d), xs));
            a3 = colibri_qi_mla(a3, (float)colibri_dot_q4_q8(&r3[full], x, tail),
                                colibri_qi_mul(colibri_qi_f16(r3[full].d), xs));
        }
        y[o] = a0;
        y[o + 1] = a1;
        y[o + 2] = a2;
        y[o + 3] = a3;
    }
    const int32_t o = groups * COLIBRI_Q4I_ROWS;
    if (o < n_out) { /* the last 1..3 rows */
        colibri_matvec_q4_q8(w + (size_t)o * nb, xq, sx, y + o, n_out - o, n_in);
    }
#else
    colibri_matvec_q4_q8(w, xq, sx, y, n_out, n_in);
#endif
}

/*
 * Layout Q4R4 (colibri/quant/formats.py q4r4_order), for the Cortex-M4 / M7: an int4 matrix
 * [n_out][n_in / 32 blocks], n_in a multiple of 32, stored per group of 4 output rows and per
 * block as 72 bytes: the 4 rows' fp16 scales d, then each row's 16 bytes of nibbles reordered
 * so that 32-bit word s (weights 8s..8s+7) holds in its halfword lanes k = 0..3 (bits 4k and
 * 16 + 4k) the weight pairs (8s, 8s+2), (8s+1, 8s+3), (8s+4, 8s+6), (8s+5, 8s+7): the pairs
 * SXTB16 makes of the two words of activation codes 8s..8s+7. One AND with 0x000F000F (the
 * word shifted right by 4k) per pair then feeds SMLAD. The n_out % 4 rows after the last group
 * are plain blocks.
 */
#define COLIBRI_Q4R4_BYTES 72 /* one block of a group of 4 rows */

/** Nibble slot (0..31: byte slot / 2, high half when odd) of weight i of a Q4R4 block. */
COLIBRI_QI_INLINE int32_t colibri_q4r4_slot(int32_t i)
{
    static const uint8_t k_slot[8] = {0, 1, 4, 5, 2, 3, 6, 7}; /* its own inverse */
    return (i & ~7) + (int32_t)k_slot[i & 7];
}

#if defined(COLIBRI_QI_SIMD32)
/* One row's step of 8 weights: the word of nibbles at p, its 4 pairs multiplied into acc. */
#define COLIBRI_Q4R4_ROW(acc, p)                                                                   \
    __asm__("ldr %[v], %[w]\n"                                                                     \
            "and %[t], %[v], %[m]\n"                                                               \
            "smlad %[a], %[t], %[e0], %[a]\n"                                                      \
            "and %[t], %[m], %[v], lsr #4\n"                                                       \
            "smlad %[a], %[t], %[o0], %[a]\n"                                                      \
            "and %[t], %[m], %[v], lsr #8\n"                                                       \
            "smlad %[a], %[t], %[e1], %[a]\n"                                                      \
            "and %[t], %[m], %[v], lsr #12\n"                                                      \
            "smlad %[a], %[t], %[o1], %[a]\n"                                                      \
            : [a] "+r"(acc), [v] "=&r"(vv), [t] "=&r"(tt)                                          \
            : [w] "m"(*(const colibri_qi_word *)(const void *)(p)), [m] "r"(mask), [e0] "r"(xe0),  \
              [o0] "r"(xo0), [e1] "r"(xe1), [o1] "r"(xo1))

/** Integer sums of a Q4R4 group's 4 rows (qs of row 0 at q, row r at q + 16 r) with one
 *  block of 32 codes. */
COLIBRI_QI_INLINE void colibri_qi_q4r4_block(const uint8_t *q, const int8_t *x, int32_t s[4])
{
    const uint32_t mask = 0x000F000Fu;
    int32_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    uint32_t xsum = 0; /* two halfword lanes of activation sums */
#pragma GCC unroll 4
    for (int32_t j = 0; j < 4; j++) {
        COLIBRI_Q4I_X(x + 8 * j, x + 8 * j + 4);
        uint32_t vv, tt;
        COLIBRI_Q4R4_ROW(a0, q + 4 * j);
        COLIBRI_Q4R4_ROW(a1, q + 16 + 4 * j);
        COLIBRI_Q4R4_ROW(a2, q + 32 + 4 * j);
        COLIBRI_Q4R4_ROW(a3, q + 48 + 4 * j);
    }
    colibri_qi_q4_sums(a0, a1, a2, a3, xsum, s);
}
#undef COLIBRI_Q4R4_ROW
#else
/** Integer sums of a Q4R4 group's 4 rows with one block of 32 codes (portable). */
COLIBRI_QI_INLINE void colibri_qi_q4r4_block(const uint8_t *q, const int8_t *x, int32_t s[4])
{
    for (int32_t r = 0; r < 4; r++) {
        int32_t acc = 0;
        for (int32_t i = 0; i < COLIBRI_QK4; i++) {
            const int32_t slot = colibri_q4r4_slot(i);
            const uint8_t byte = q[16 * r + slot / 2];
            const int32_t v = (int32_t)((slot & 1) ? (byte >> 4) : (byte & 0x0Fu)) - 8;
            acc += v * (int32_t)x[i];
        }
        s[r] = acc;
    }
}
#endif

/**
 * @brief colibri_matvec_q4_q8 bit for bit on a matrix stored in layout Q4R4 (n_in a multiple
 *        of 32): w is the stored bytes. Compile-time n_out / n_in resolve every loop bound.
 */
COLIBRI_QI_INLINE void colibri_qi_q4_q8_q4r4(const uint8_t *w, const int8_t *xq, const float *sx,
                                             float *y, int32_t n_out, int32_t n_in)
{
    const int32_t nb = n_in / COLIBRI_QK4;
    const int32_t groups = n_out / COLIBRI_Q4I_ROWS;
    for (int32_t g = 0; g < groups; g++) {
        const uint8_t *wg = w + (size_t)g * (size_t)nb * COLIBRI_Q4R4_BYTES;
        float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
        for (int32_t b = 0; b < nb; b++) {
            const uint8_t *blk = wg + (size_t)b * COLIBRI_Q4R4_BYTES;
            int32_t s[4];
            colibri_qi_q4r4_block(blk + 8, xq + (size_t)b * COLIBRI_QK4, s);
            uint16_t d[4];
            memcpy(d, blk, sizeof d);
            const float xs = sx[b];
#if defined(COLIBRI_QI_MVE) || defined(COLIBRI_QI_SIMD32)
            a0 = colibri_qi_mla(a0, (float)s[0], colibri_qi_mul(colibri_qi_f16(d[0]), xs));
            a1 = colibri_qi_mla(a1, (float)s[1], colibri_qi_mul(colibri_qi_f16(d[1]), xs));
            a2 = colibri_qi_mla(a2, (float)s[2], colibri_qi_mul(colibri_qi_f16(d[2]), xs));
            a3 = colibri_qi_mla(a3, (float)s[3], colibri_qi_mul(colibri_qi_f16(d[3]), xs));
#else
            a0 += (float)s[0] * (colibri_f16_to_f32(d[0]) * xs);
            a1 += (float)s[1] * (colibri_f16_to_f32(d[1]) * xs);
            a2 += (float)s[2] * (colibri_f16_to_f32(d[2]) * xs);
            a3 += (float)s[3] * (colibri_f16_to_f32(d[3]) * xs);
#endif
        }
        const int32_t o = g * COLIBRI_Q4I_ROWS;
        y[o] = a0;
        y[o + 1] = a1;
        y[o + 2] = a2;
        y[o + 3] = a3;
    }
    const int32_t o = groups * COLIBRI_Q4I_ROWS;
    if (o < n_out) { /* the last 1..3 rows, plain blocks */
        const uint8_t *rest = w + (size_t)groups * (size_t)nb * COLIBRI_Q4R4_BYTES;
        colibri_matvec_q4_q8((const colibri_block_q4_32 *)(const void *)rest, xq, sx, y + o,
                             n_out - o, n_in);
    }
}

/*
 * Layout Q4H4 (colibri/quant/formats.py q4h4_order), for Helium: an int4 matrix [n_out][n_in /
 * 32 blocks], n_in a multiple of 32 (inputs padded with zero weights at generation time, the
 * activation row with zero codes), stored as Q4R4's groups (per group of 4 output rows and per
 * block 72 bytes: the 4 rows' fp16 scales d, then each row's 16 bytes of nibbles) with the
 * nibbles in the plain order of colibri_block_q4_32 (byte j: weight j low, weight 16 + j high).
 * The n_out % 4 rows after the last group are plain blocks. One pointer walks a group's blocks:
 * per block one 16-byte load of each row's nibbles, VAND / VSHR for the two halves, two
 * VMLADAVA (16 MACs each) started at -8 * sum x, and the 4 scales converted from two words by
 * VCVTB / VCVTT (the conversion colibri_qi_f16 makes).
 */
#if defined(COLIBRI_QI_MVE) && defined(__ARM_FP) && (__ARM_FP & 4)
/* One block of a Q4H4 group (its 72 bytes at blk) times 32 codes at x (block scale xs; x
 * advanced by 32) into the group's float sums a0..a3, in one asm statement on fixed registers
 * q0..q4 (s0..s19): q0 / q1 the codes 0..15 / 16..31, q2 the nibble mask, q3 / q4 a row's
 * nibbles and its low half. Each row's integer sum q * x takes two VMLADAVs; -8 * sum x (two
 * VMLADAVs by a vector of -8) is added to the 4 sums once they are in q0 (two VMOVs), which one
 * VCVT turns to float (integer to float: exact or rounded to nearest as the scalar VCVT rounds;
 * no subnormal or NaN can arise). The 4 scales are converted by VCVTB / VCVTT, and each row then
 * takes the scalar VMUL and VMLA of colibri_qi_mul / colibri_qi_mla. */
#define COLIBRI_Q4H_ROW(r)                                                                         \
    "vldrb.u8 q3, [%[q], #(8 + 16 * " #r ")]\n"                                                    \
    "vand q4, q3, q2\n"                                                                            \
    "vmladav.s8 %[i" #r "], q4, q0\n"                                                              \
    "vshr.u8 q3, q3, #4\n"                                                                         \
    "vmladava.s8 %[i" #r "], q3, q1\n"
/* the codes, the -8 vector, the mask and -8 * sum x */
#define COLIBRI_Q4H_HEAD                                                                           \
    "vldrb.s8 q0, [%[x]], #16\n"                                                                   \
    "vldrb.s8 q1, [%[x]], #16\n"                                                                   \
    "vmov.i8 q4, #0xf8\n"                                                                          \
    "vmov.i8 q2, #15\n"                                                                            \
    "vmladav.s8 %[off], q0, q4\n"                                                                  \
    "vmladava.s8 %[off], q1, q4\n"
/* the 4 sums to float in q0, the scales times xs in q1, into a0..a3 */
#define COLIBRI_Q4H_TAIL                                                                           \
    "vmov q0[2], q0[0], %[i0], %[i2]\n"                                                            \
    "vmov q0[3], q0[1], %[i1], %[i3]\n"                                                            \
    "vadd.i32 q0, q0, %[off]\n"                                                                    \
    "vcvt.f32.s32 q0, q0\n"                                                                        \
    "vldr s5, [%[q]]\n"                                                                            \
    "vldr s7, [%[q], #4]\n"                                                                        \
    "vcvtb.f32.f16 s4, s5\n"                                                                       \
    "vcvtt.f32.f16 s5, s5\n"                                                                       \
    "vcvtb.f32.f16 s6, s7\n"                                                                       \
    "vcvtt.f32.f16 s7, s7\n"                                                                       \
    "vmul.f32 s4, s4, %[xs]\n"                                                                     \
    "vmul.f32 s5, s5, %[xs]\n"                                                                     \
    "vmul.f32 s6, s6, %[xs]\n"                                                                     \
    "vmul.f32 s7, s7, %[xs]\n"                                                                     \
    "vmla.f32 %[a0], s0, s4\n"                                                                     \
    "vmla.f32 %[a1], s1, s5\n"                                                                     \
    "vmla.f32 %[a2], s2, s6\n"                                                                     \
    "vmla.f32 %[a3], s3, s7\n"
#define COLIBRI_Q4H_STEP(blk, x, xs)                                                               \
    __asm__(                                                                                       \
        COLIBRI_Q4H_HEAD COLIBRI_Q4H_ROW(0) COLIBRI_Q4H_ROW(1) COLIBRI_Q4H_ROW(2)                  \
            COLIBRI_Q4H_ROW(3) COLIBRI_Q4H_TAIL                                                    \
        : [a0] "+t"(a0), [a1] "+t"(a1), [a2] "+t"(a2), [a3] "+t"(a3), [x] "+r"(x),                 \
          [i0] "=&Te"(i0), [i1] "=&Te"(i1), [i2] "=&Te"(i2), [i3] "=&Te"(i3), [off] "=&Te"(off)    \
        : [q] "r"(blk), [xs] "t"(xs), "m"(*(const uint8_t(*)[72])(blk)),                           \
          "m"(*(const int8_t(*)[32])(x))                                                           \
        : "d0", "d1", "d2", "d3", "d4", "d5", "d6", "d7", "d8", "d9")
#endif

#if defined(COLIBRI_QI_MVE)
/** One plain row of whole blocks (nb of them at w) times the codes xq: the library's sum. */
COLIBRI_QI_INLINE float colibri_qi_q4_row1(const colibri_block_q4_32 *w, const int8_t *xq,
                                           const float *sx, int32_t nb)
{
    float acc = 0.0f;
    for (int32_t b = 0; b < nb; b++) {
        const int8x16_t xl = vld1q_s8(xq + (size_t)b * COLIBRI_QK4);
        const int8x16_t xh = vld1q_s8(xq + (size_t)b * COLIBRI_QK4 + 16);
        const int32_t off = -8 * vaddvaq_s8(vaddvq_s8(xl), xh);
        const uint8x16_t v = vld1q_u8(w[b].qs);
        const int32_t s =
            vmladavaq_s8(vmladavaq_s8(off, vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(15))), xl),
                         vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), xh);
        acc = colibri_qi_mla(acc, (float)s, colibri_qi_mul(colibri_qi_f16(w[b].d), sx[b]));
    }
    return acc;
}
#endif

/** Nibble q (0..15) of weight i of row r of a Q4H4 block at blk (portable). */
COLIBRI_QI_INLINE int32_t colibri_q4h4_nibble(const uint8_t *blk, int32_t r, int32_t i)
{
    const uint8_t byte = blk[8 + 16 * r + (i & 15)];
    return (int32_t)(i < 16 ? (byte & 0x0Fu) : (uint8_t)(byte >> 4));
}

/**
 * @brief colibri_matvec_q4_q8 bit for bit on a matrix stored in layout Q4H4 (n_in a multiple
 *        of 32): w is the stored bytes. Compile-time n_out / n_in resolve every loop bound.
 */
COLIBRI_QI_INLINE void colibri_qi_q4_q8_q4h4(const uint8_t *w, const int8_t *xq, const float *sx,
                                             float *y, int32_t n_out, int32_t n_in)
{
    const int32_t nb = n_in / COLIBRI_QK4;
    const int32_t groups = n_out / COLIBRI_Q4I_ROWS;
    const uint8_t *blk = w;
    for (int32_t g = 0; g < groups; g++) {
#if defined(COLIBRI_QI_MVE) && defined(__ARM_FP) && (__ARM_FP & 4)
        /* the sums in fixed registers (q5), which GCC otherwise moves through core registers at
         * every block */
        register float a0 __asm__("s20") = 0.0f;
        register float a1 __asm__("s21") = 0.0f;
        register float a2 __asm__("s22") = 0.0f;
        register float a3 __asm__("s23") = 0.0f;
#else
        float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
#endif
        const int8_t *x = xq; /* block b's codes */
        for (int32_t b = 0; b < nb; b++) {
            const float xs = sx[b];
#if defined(COLIBRI_QI_MVE) && defined(__ARM_FP) && (__ARM_FP & 4)
            int32_t i0, i1, i2, i3, off;
            COLIBRI_Q4H_STEP(blk, x, xs);
#else
            float *acc[4] = {&a0, &a1, &a2, &a3};
            for (int32_t r = 0; r < 4; r++) {
                int32_t isum = 0;
                for (int32_t i = 0; i < COLIBRI_QK4; i++) {
                    isum += (colibri_q4h4_nibble(blk, r, i) - 8) * (int32_t)x[i];
                }
                uint16_t h;
                memcpy(&h, blk + 2 * r, sizeof h);
                *acc[r] += (float)isum * (colibri_f16_to_f32(h) * xs);
            }
            x += COLIBRI_QK4;
#endif
            blk += COLIBRI_Q4R4_BYTES;
        }
        const int32_t o = g * COLIBRI_Q4I_ROWS;
        y[o] = a0;
        y[o + 1] = a1;
        y[o + 2] = a2;
        y[o + 3] = a3;
    }
    const int32_t o = groups * COLIBRI_Q4I_ROWS;
    if (o < n_out) { /* the last 1..3 rows, plain blocks */
        const colibri_block_q4_32 *rest = (const colibri_block_q4_32 *)(const void *)blk;
#if defined(COLIBRI_QI_MVE)
        for (int32_t r = 0; r < n_out - o; r++) {
            y[o + r] = colibri_qi_q4_row1(rest + (size_t)r * (size_t)nb, xq, sx, nb);
        }
#else
        colibri_matvec_q4_q8(rest, xq, sx, y + o, n_out - o, n_in);
#endif
    }
}

#ifdef COLIBRI_Q4H_STEP
#undef COLIBRI_Q4H_STEP
#undef COLIBRI_Q4H_TAIL
#undef COLIBRI_Q4H_ROW
#undef COLIBRI_Q4H_HEAD
#endif

/**
 * @brief colibri_matmul_q4_q8 bit for bit on a matrix stored in layout Q4H4 (n_in a multiple of
 *        32): row t of n_tok (codes xq + t * n_in, scales sx + t * n_in / 32) to y + t * ldy,
 *        exactly what colibri_qi_q4_q8_q4h4 writes for it, a token at a time.
 */
COLIBRI_QI_INLINE void colibri_qi_mm_q4_q8_q4h4(const uint8_t *w, const int8_t *xq, const float *sx,
                                                float *y, int32_t ldy, int32_t n_out, int32_t n_in,
                                                int32_t n_tok)
{
    const size_t nb = (size_t)(n_in / COLIBRI_QK4);
    for (int32_t t = 0; t < n_tok; t++) {
        colibri_qi_q4_q8_q4h4(w, xq + (size_t)t * (size_t)n_in, sx + (size_t)t * nb,
                              y + (size_t)t * (size_t)ldy, n_out, n_in);
    }
}

/*
 * The multi-token int4 kernels (colibri_qi_mm_q4_q8_q4r4, colibri_qi_mm_q4_q8): a group of
 * tokens over the same weights, each weight block read and unpacked once per pass over several
 * tokens instead of once per token (issue 11).
 *  - Cortex-M4 / M7 (layout Q4R4): each block of 32 codes of the pass's 8 (or 4) tokens is first
 *    unpacked by SXTB16 into halfword pairs (a 512-byte buffer on the stack, with each token's
 *    8 * sum of codes), then per row and 4 weights one LDR and three ALU instructions (four
 *    for the block's last 4) unpack the nibble pairs once, and per token one LDRD and 2 SMLAD
 *    use them. The running sums of COLIBRI_QI_RC rows stay on the stack between blocks.
 *  - Helium (plain blocks): the 4 rows of a group, 2 tokens: each row's 16 bytes of nibbles
 *    are loaded and split once per 16 codes and VMLADAVA'd with both tokens' codes (2 vector
 *    registers of codes, not 4: the rest of the FPU's registers hold the float sums).
 * Every (row, token) gets the float operations of the one-token kernel in the same order, so
 * row t of the output has the bits colibri_qi_q4_q8(_q4r4) and colibri_matvec_q4_q8 give it.
 */
#if defined(COLIBRI_QI_SIMD32)
/** Tokens per pass of colibri_qi_mm_q4_q8_q4r4 (then one pass of 4, then one at a time). */
#define COLIBRI_Q4G_MT 8

/** Block b (32 codes) of the T rows of codes at x, x + n_in, ... as SXTB16 pairs: step s (codes
 *  8s..8s+7), half h (codes 8s+4h..8s+4h+3) and token t at xu[2 ((2s + h) T + t)] (codes 0, 2 of
 *  the four) and + 1 (codes 1, 3); off[t] = 8 * the sum of token t's 32 codes. */
COLIBRI_QI_INLINE void colibri_qi_q4g_unpack(const int8_t *x, int32_t n_in, int32_t T, uint32_t *xu,
                                             int32_t *off)
{
    for (int32_t t = 0; t < T; t++) {
        const int8_t *xt = x + (size_t)t * (size_t)n_in;
        uint32_t xsum = 0; /* two halfword lanes */
#pragma GCC unroll 8
        for (int32_t k = 0; k < 8; k++) { /* k = 2s + h */
            const uint32_t v = *(const colibri_q4i_word *)(const void *)(xt + 4 * k);
            const uint32_t e = __sxtb16(v);
            const uint32_t o = __sxtb16((v >> 8) | (v << 24));
            xu[2 * (k * T + t)] = e;
            xu[2 * (k * T + t) + 1] = o;
            xsum = __sadd16(xsum, __sadd16(e, o));
        }
        off[t] = 8 * __smuad(xsum, 0x00010001u);
    }
}

/* colibri_qi_q4g_block8's assembly. COLIBRI_Q4G_W(off) loads the word of nibbles at wr + off and
 * unpacks the pairs at bits 0 and 4 of its halfwords into we and wo: at off = 4s, word s's pairs
 * 0 and 1 (weights 8s, 8s+2 into we; 8s+1, 8s+3 into wo); at 4s + 1 (an unaligned LDR, which the
 * M4 / M7 allow) its pairs 2 and 3, which sit in its bytes 1 and 3. COLIBRI_Q4G_W3 unpacks pairs
 * 2 and 3 of the last word (a load at 13 would read past the row) by shifting. COLIBRI_Q4G_T(a,
 * k, T, t) adds token t's two pairs of half k (= 2s + h; at xu + 8 (k T + t)) times we / wo
 * into a. */
#define COLIBRI_Q4G_W(off)                                                                         \
    "ldr %[wo], [%[wr], #" #off "]\n"                                                              \
    "and %[we], %[wo], #0x000F000F\n"                                                              \
    "lsr %[wo], %[wo], #4\n"                                                                       \
    "and %[wo], %[wo], #0x000F000F\n"
#define COLIBRI_Q4G_W3                                                                             \
    "ldr %[wo], [%[wr], #12]\n"                                                                    \
    "lsr %[wo], %[wo], #8\n"                                                                       \
    "and %[we], %[wo], #0x000F000F\n"                                                              \
    "lsr %[wo], %[wo], #4\n"                                                                       \
    "and %[wo], %[wo], #0x000F000F\n"
#define COLIBRI_Q4G_T(a, k, T, t)                                                                  \
    "ldrd %[xa], %[xb], [%[xp], #(8*(" #k "*" #T "+" #t "))]\n"                                    \
    "smlad %[" #a "], %[we], %[xa], %[" #a "]\n"                                                   \
    "smlad %[" #a "], %[wo], %[xb], %[" #a "]\n"
#define COLIBRI_Q4G_K8(k)                                                                          \
    COLIBRI_Q4G_T(a0, k, 8, 0)                                                                     \
    COLIBRI_Q4G_T(a1, k, 8, 1)                                                                     \
    COLIBRI_Q4G_T(a2, k, 8, 2)                                                                     \
    COLIBRI_Q4G_T(a3, k, 8, 3)                                                                     \
    COLIBRI_Q4G_T(a4, k, 8, 4)                                                                     \
    COLIBRI_Q4G_T(a5, k, 8, 5) COLIBRI_Q4G_T(a6, k, 8, 6) COLIBRI_Q4G_T(a7, k, 8, 7)
#define COLIBRI_Q4G_K4(k)                                                                          \
    COLIBRI_Q4G_T(a0, k, 4, 0)                                                                     \
    COLIBRI_Q4G_T(a1, k, 4, 1) COLIBRI_Q4G_T(a2, k, 4, 2) COLIBRI_Q4G_T(a3, k, 4, 3)

/* The row's 8 half-words k (pairs unpacked by COLIBRI_Q4G_W at 0, 1, 4, 5, ...; the last by
 * COLIBRI_Q4G_W3), each times the pass's tokens (K: COLIBRI_Q4G_K8 or _K4); its scratch
 * registers and its inputs (the row's 16 bytes, the n_words unpacked activation words). */
/* clang-format off */
#define COLIBRI_Q4G_ROW(K)                                                                         \
    COLIBRI_Q4G_W(0) K(0)                                                                          \
    COLIBRI_Q4G_W(1) K(1)                                                                          \
    COLIBRI_Q4G_W(4) K(2)                                                                          \
    COLIBRI_Q4G_W(5) K(3)                                                                          \
    COLIBRI_Q4G_W(8) K(4)                                                                          \
    COLIBRI_Q4G_W(9) K(5)                                                                          \
    COLIBRI_Q4G_W(12) K(6)                                                                         \
    COLIBRI_Q4G_W3 K(7)
/* clang-format on */
#define COLIBRI_Q4G_TEMPS [we] "=&r"(we), [wo] "=&r"(wo), [xa] "=&r"(xa), [xb] "=&r"(xb)
#define COLIBRI_Q4G_INPUTS(n_words)                                                                \
    [wr] "r"(wr), [xp] "r"(xu), "m"(*(const uint8_t(*)[16])wr), "m"(*(const uint32_t(*)[n_words])xu)

/* The sums' start values: -off[t] for each token t of the pass. */
#define COLIBRI_Q4G_START4 int32_t a0 = -off[0], a1 = -off[1], a2 = -off[2], a3 = -off[3]
#define COLIBRI_Q4G_START8                                                                         \
    COLIBRI_Q4G_START4;                                                                            \
    int32_t a4 = -off[4], a5 = -off[5], a6 = -off[6], a7 = -off[7]

/* colibri_qi_q4g_block<T>: one row of a Q4R4 group (wr = its 16 bytes of nibbles in the block)
 * times one unpacked block of T tokens (colibri_qi_q4g_unpack): s[t] = the integer block sum of
 * token t, started at -off[t]. With 8 tokens 14 registers: 8 sums, the two pointers, two
 * unpacked weight pairs, one token's two activation pairs. */
#define COLIBRI_Q4G_BLOCK(T)                                                                       \
    COLIBRI_QI_INLINE void colibri_qi_q4g_block##T(const uint8_t *wr, const uint32_t *xu,          \
                                                   const int32_t *off, int32_t s[T])               \
    {                                                                                              \
        COLIBRI_Q4G_START##T;                                                                      \
        uint32_t we, wo, xa, xb;                                                                   \
        __asm__(COLIBRI_Q4G_ROW(COLIBRI_Q4G_K##T)                                                  \
                : COLIBRI_QI_SUMS##T("+r", a), COLIBRI_Q4G_TEMPS                                   \
                : COLIBRI_Q4G_INPUTS(16 * T));                                                     \
        COLIBRI_QI_STORE##T(s, a);                                                                 \
    }
COLIBRI_Q4G_BLOCK(8)
COLIBRI_Q4G_BLOCK(4)
#undef COLIBRI_Q4G_BLOCK
#undef COLIBRI_Q4G_START8
#undef COLIBRI_Q4G_START4
#undef COLIBRI_Q4G_INPUTS
#undef COLIBRI_Q4G_TEMPS
#undef COLIBRI_Q4G_ROW
#undef COLIBRI_Q4G_K4
#undef COLIBRI_Q4G_K8
#undef COLIBRI_Q4G_T
#undef COLIBRI_Q4G_W3
#undef COLIBRI_Q4G_W

/** One pass of colibri_qi_mm_q4_q8_q4r4 over T tokens (8 or 4): the whole Q4R4 groups. */
COLIBRI_QI_INLINE void colibri_qi_q4g_pass(const uint8_t *w, const int8_t *xq, const float *sx,
                                           float *y, int32_t ldy, int32_t n_out, int32_t n_in,
                                           int32_t T)
{
    const int32_t nb = n_in / COLIBRI_QK4;
    const int32_t rows = (n_out / COLIBRI_Q4I_ROWS) * COLIBRI_Q4I_ROWS;
    for (int32_t o0 = 0; o0 < rows; o0 += COLIBRI_QI_RC) {
        const int32_t rc = (rows - o0 < COLIBRI_QI_RC) ? rows - o0 : COLIBRI_QI_RC;
        float acc[COLIBRI_QI_RC * COLIBRI_Q4G_MT]; /* row r, token t: acc[r T + t] */
        for (int32_t i = 0; i < rc * T; i++) {
            acc[i] = 0.0f;
        }
        for (int32_t b = 0; b < nb; b++) {
            uint32_t xu[2 * 8 * COLIBRI_Q4G_MT];
            int32_t off[COLIBRI_Q4G_MT];
            colibri_qi_q4g_unpack(xq + (size_t)b * COLIBRI_QK4, n_in, T, xu, off);
            float xs[COLIBRI_Q4G_MT];
            for (int32_t t = 0; t < T; t++) {
                xs[t] = sx[(size_t)t * (size_t)nb + (size_t)b];
            }
            float *ap = acc;
            const uint8_t *blk = w + ((size_t)(o0 / COLIBRI_Q4I_ROWS) * (size_t)nb + (size_t)b) *
                                         COLIBRI_Q4R4_BYTES; /* rc is a multiple of 4 */
            for (int32_t g = 0; g < rc / COLIBRI_Q4I_ROWS; g++) {
                for (int32_t rr = 0; rr < COLIBRI_Q4I_ROWS; rr++) {
                    int32_t s[COLIBRI_Q4G_MT];
                    if (T == 8) {
                        colibri_qi_q4g_block8(blk + 8 + 16 * rr, xu, off, s);
                    } else {
                        colibri_qi_q4g_block4(blk + 8 + 16 * rr, xu, off, s);
                    }
                    uint16_t h;
                    memcpy(&h, blk + 2 * rr, sizeof h);
                    const float d = colibri_qi_f16(h);
#pragma GCC unroll 8
                    for (int32_t t = 0; t < T; t++) {
                        ap[t] = colibri_qi_mla(ap[t], (float)s[t], colibri_qi_mul(d, xs[t]));
                    }
                    ap += T;
                }
                blk += (size_t)nb * COLIBRI_Q4R4_BYTES;
            }
        }
        for (int32_t r = 0; r < rc; r++) {
            for (int32_t t = 0; t < T; t++) {
                y[(size_t)t * (size_t)ldy + (size_t)(o0 + r)] = acc[r * T + t];
            }
        }
    }
    if (rows < n_out) { /* the last 1..3 rows, plain blocks */
        const uint8_t *rest =
            w + (size_t)(rows / COLIBRI_Q4I_ROWS) * (size_t)nb * COLIBRI_Q4R4_BYTES;
        colibri_matmul_q4_q8((const colibri_block_q4_32 *)(const void *)rest, xq, sx, y + rows, ldy,
                             n_out - rows, n_in, T);
    }
}
#endif

/**
 * @brief colibri_matmul_q4_q8 bit for bit on a matrix stored in layout Q4R4 (n_in a multiple of
 *        32): row t of n_tok (codes xq + t * n_in, scales sx + t * n_in / 32) to y + t * ldy,
 *        exactly what colibri_qi_q4_q8_q4r4 writes for it. Cortex-M4 / M7: passes of 8 tokens,
 *        then one of 4, the rest one token at a time; elsewhere one token at a time.
 */
COLIBRI_QI_INLINE void colibri_qi_mm_q4_q8_q4r4(const uint8_t *w, const int8_t *xq, const float *sx,
                                                float *y, int32_t ldy, int32_t n_out, int32_t n_in,
                                                int32_t n_tok)
{
    const size_t nb = (size_t)(n_in / COLIBRI_QK4);
    int32_t t0 = 0;
#if defined(COLIBRI_QI_SIMD32)
    for (; t0 + COLIBRI_Q4G_MT <= n_tok; t0 += COLIBRI_Q4G_MT) {
        colibri_qi_q4g_pass(w, xq + (size_t)t0 * (size_t)n_in, sx + (size_t)t0 * nb,
                            y + (size_t)t0 * (size_t)ldy, ldy, n_out, n_in, COLIBRI_Q4G_MT);
    }
    if (t0 + 4 <= n_tok) {
        colibri_qi_q4g_pass(w, xq + (size_t)t0 * (size_t)n_in, sx + (size_t)t0 * nb,
                            y + (size_t)t0 * (size_t)ldy, ldy, n_out, n_in, 4);
        t0 += 4;
    }
#endif
    for (; t0 < n_tok; t0++) {
        colibri_qi_q4_q8_q4r4(w, xq + (size_t)t0 * (size_t)n_in, sx + (size_t)t0 * nb,
                              y + (size_t)t0 * (size_t)ldy, n_out, n_in);
    }
}

#if defined(COLIBRI_QI_MVE)
/* colibri_qi_q4_block4x2's assembly: COLIBRI_Q4V_LO(r) adds row r's low nibbles (block at q,
 * then q += st) times both tokens' codes 0..15 (xa, xb) into s<r>, u<r>; COLIBRI_Q4V_HI(r) steps
 * q back a row and adds its high nibbles times codes 16..31. Each nibble minus 8 (e8) first. */
#define COLIBRI_Q4V_LO(r)                                                                          \
    "vldrb.u8 %q[v], [%[q]]\n"                                                                     \
    "vshl.i8 %q[v], %q[v], #4\n"                                                                   \
    "vshr.u8 %q[v], %q[v], #4\n"                                                                   \
    "vsub.i8 %q[v], %q[v], %q[e8]\n"                                                               \
    "vmladav.s8 %[s" #r "], %q[v], %q[xa]\n"                                                       \
    "vmladav.s8 %[u" #r "], %q[v], %q[xb]\n"                                                       \
    "add %[q], %[q], %[st]\n"
#define COLIBRI_Q4V_HI(r)                                                                          \
    "sub %[q], %[q], %[st]\n"                                                                      \
    "vldrb.u8 %q[v], [%[q]]\n"                                                                     \
    "vshr.u8 %q[v], %q[v], #4\n"                                                                   \
    "vsub.i8 %q[v], %q[v], %q[e8]\n"                                                               \
    "vmladava.s8 %[s" #r "], %q[v], %q[xa]\n"                                                      \
    "vmladava.s8 %[u" #r "], %q[v], %q[xb]\n"

/** The integer block sums of 4 plain rows (nibbles of row r at q + r * st) with one block of
 *  32 codes of 2 tokens (x0, x1): i[4 t + r]. Written out, in 4 vector registers, leaving
 *  the rest of the FPU's registers to the float sums. */
COLIBRI_QI_INLINE void colibri_qi_q4_block4x2(const uint8_t *q, int32_t st, const int8_t *x0,
                                              const int8_t *x1, int32_t i[8])
{
    int32_t s0, s1, s2, s3, u0, u1, u2, u3;
    int8x16_t v;
    /* four statements of 4 sums each: VMLADAV's even registers are 8 with LR, which a
     * low-overhead loop around them may hold */
    const int8x16_t e8 = vdupq_n_s8(8);
    int8x16_t xa = vld1q_s8(x0);
    int8x16_t xb = vld1q_s8(x1);
    __asm__(COLIBRI_Q4V_LO(0) COLIBRI_Q4V_LO(1)
            : [s0] "=&Te"(s0), [s1] "=&Te"(s1), [u0] "=&Te"(u0), [u1] "=&Te"(u1), [v] "=&w"(v),
              [q] "+r"(q)
            : [st] "r"(st), [xa] "w"(xa), [xb] "w"(xb), [e8] "w"(e8)
            : "memory");
    __asm__(COLIBRI_Q4V_LO(2) COLIBRI_Q4V_LO(3)
            : [s2] "=&Te"(s2), [s3] "=&Te"(s3), [u2] "=&Te"(u2), [u3] "=&Te"(u3), [v] "=&w"(v),
              [q] "+r"(q)
            : [st] "r"(st), [xa] "w"(xa), [xb] "w"(xb), [e8] "w"(e8)
            : "memory");
    xa = vld1q_s8(x0 + 16);
    xb = vld1q_s8(x1 + 16);
    __asm__(
        COLIBRI_Q4V_HI(3) COLIBRI_Q4V_HI(2)
        : [s2] "+Te"(s2), [s3] "+Te"(s3), [u2] "+Te"(u2), [u3] "+Te"(u3), [v] "=&w"(v), [q] "+r"(q)
        : [st] "r"(st), [xa] "w"(xa), [xb] "w"(xb), [e8] "w"(e8)
        : "memory");
    __asm__(
        COLIBRI_Q4V_HI(1) COLIBRI_Q4V_HI(0)
        : [s0] "+Te"(s0), [s1] "+Te"(s1), [u0] "+Te"(u0), [u1] "+Te"(u1), [v] "=&w"(v), [q] "+r"(q)
        : [st] "r"(st), [xa] "w"(xa), [xb] "w"(xb), [e8] "w"(e8)
        : "memory");
    COLIBRI_QI_STORE4(i, s);
    COLIBRI_QI_STORE4(i + 4, u);
}
#undef COLIBRI_Q4V_HI
#undef COLIBRI_Q4V_LO

/** One pass of colibri_qi_mm_q4_q8 over 2 tokens (codes x0, x1; scales s0, s1; outputs y0, y1):
 *  groups of 4 rows, each row's nibbles of a block loaded and split once for the two tokens. */
COLIBRI_QI_INLINE void colibri_qi_q4_pass2(const colibri_block_q4_32 *w, const int8_t *x0,
                                           const int8_t *x1, const float *s0, const float *s1,
                                           float *y0, float *y1, int32_t n_out, int32_t n_in)
{
    const int32_t full = n_in / COLIBRI_QK4;
    const int32_t tail = n_in - full * COLIBRI_QK4;
    const size_t nb = COLIBRI_Q4_BLOCKS(n_in);
    const int32_t st = (int32_t)(nb * sizeof(colibri_block_q4_32)); /* bytes from row to row */
    const int32_t groups = n_out / COLIBRI_Q4I_ROWS;
    for (int32_t g = 0; g < groups; g++) {
        const int32_t o = g * COLIBRI_Q4I_ROWS;
        const colibri_block_q4_32 *r0 = w + (size_t)o * nb;
        float a[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f}; /* a[4 t + r] */
        for (int32_t b = 0; b < full; b++) {
            int32_t i[8];
            colibri_qi_q4_block4x2(r0[b].qs, st, x0 + (size_t)b * COLIBRI_QK4,
                                   x1 + (size_t)b * COLIBRI_QK4, i);
            const float xs0 = s0[b];
            const float xs1 = s1[b];
#pragma GCC unroll 4
            for (int32_t r = 0; r < 4; r++) {
                const float d = colibri_qi_f16(r0[(size_t)r * nb + (size_t)b].d);
                a[r] = colibri_qi_mla(a[r], (float)i[r], colibri_qi_mul(d, xs0));
                a[4 + r] = colibri_qi_mla(a[4 + r], (float)i[4 + r], colibri_qi_mul(d, xs1));
            }
        }
        if (tail > 0) {
            const size_t i0 = (size_t)full * COLIBRI_QK4;
#pragma GCC unroll 4
            for (int32_t r = 0; r < 4; r++) {
                const colibri_block_q4_32 *blk = r0 + (size_t)r * nb + (size_t)full;
                const float d = colibri_qi_f16(blk->d);
                a[r] = colibri_qi_mla(a[r], (float)colibri_dot_q4_q8(blk, x0 + i0, tail),
                                      colibri_qi_mul(d, s0[full]));
                a[4 + r] = colibri_qi_mla(a[4 + r], (float)colibri_dot_q4_q8(blk, x1 + i0, tail),
                                          colibri_qi_mul(d, s1[full]));
            }
        }
#pragma GCC unroll 4
        for (int32_t r = 0; r < 4; r++) {
            y0[o + r] = a[r];
            y1[o + r] = a[4 + r];
        }
    }
    const int32_t o = groups * COLIBRI_Q4I_ROWS;
    if (o < n_out) { /* the last 1..3 rows */
        colibri_matvec_q4_q8(w + (size_t)o * nb, x0, s0, y0 + o, n_out - o, n_in);
        colibri_matvec_q4_q8(w + (size_t)o * nb, x1, s1, y1 + o, n_out - o, n_in);
    }
}
#endif

/**
 * @brief colibri_matmul_q4_q8 bit for bit on the row-major blocks w [n_out][COLIBRI_Q4_BLOCKS(
 *        n_in)]: row t of n_tok (codes xq + t * n_in, scales sx + t * COLIBRI_Q4_BLOCKS(n_in))
 *        to y + t * ldy. Helium: passes of 2 tokens, then one token; Cortex-M4 / M7:
 *        colibri_qi_q4_q8 a token at a time; elsewhere the library's matmul.
 */
COLIBRI_QI_INLINE void colibri_qi_mm_q4_q8(const colibri_block_q4_32 *w, const int8_t *xq,
                                           const float *sx, float *y, int32_t ldy, int32_t n_out,
                                           int32_t n_in, int32_t n_tok)
{
#if defined(COLIBRI_QI_MVE) || defined(COLIBRI_QI_SIMD32)
    const size_t nb = COLIBRI_Q4_BLOCKS(n_in);
    int32_t t0 = 0;
#if defined(COLIBRI_QI_MVE)
    for (; t0 + 2 <= n_tok; t0 += 2) {
        const int8_t *x0 = xq + (size_t)t0 * (size_t)n_in;
        const float *s0 = sx + (size_t)t0 * nb;
        float *y0 = y + (size_t)t0 * (size_t)ldy;
        colibri_qi_q4_pass2(w, x0, x0 + n_in, s0, s0 + nb, y0, y0 + ldy, n_out, n_in);
    }
#endif
    for (; t0 < n_tok; t0++) {
        colibri_qi_q4_q8(w, xq + (size_t)t0 * (size_t)n_in, sx + (size_t)t0 * nb,
                         y + (size_t)t0 * (size_t)ldy, n_out, n_in);
    }
#else
    colibri_matmul_q4_q8(w, xq, sx, y, ldy, n_out, n_in, n_tok);
#endif
}

#ifdef __cplusplus
}
#endif

#endif /* COLIBRI_QINLINE_Q4_H */
