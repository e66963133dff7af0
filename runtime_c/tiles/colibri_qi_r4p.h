/**
 * @file colibri_qi_r4p.h
 * @brief Generated-code support (runtime_c/tiles): int8 x int8 kernels on layout R4P (Cortex-M4 /
 *        M7: pre-corrected codes, one SXTB16 per four weights) and the relu row, see
 *        colibri_qinline.h.
 */
#ifndef COLIBRI_QI_R4P_H
#define COLIBRI_QI_R4P_H

#include "colibri_qi_r4.h"

#ifdef __cplusplus
extern "C" {
#endif

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
#define COLIBRI_QI_PROW0(s, off) COLIBRI_QI_HEAD0(s, off, ya) COLIBRI_QI_PROW_TAIL(s)
#define COLIBRI_QI_PROW(s, off) COLIBRI_QI_HEAD(s, off, ya) COLIBRI_QI_PROW_TAIL(s)
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
            : COLIBRI_QI_SUMS4("=&r", s), [ya] "=&r"(ya), [oa] "=&r"(oa), [yb] "=&r"(yb),
              [ob] "=&r"(ob), [wa] "=&r"(wa), [wb] "=&r"(wb), [t] "=&r"(t)
            : [w] "r"(wg), [x] "r"(xu), "m"(*(const int8_t(*)[128])wg),
              "m"(*(const uint32_t(*)[16])xu));
    COLIBRI_QI_STORE4(s, s);
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

/** colibri_qi_r4p_block over the block's first 8 * steps inputs only (steps 1..3): the last
 *  block of a row whose live inputs end there (the rest are zero codes on both sides, adding
 *  nothing: the same sums). */
COLIBRI_QI_INLINE void colibri_qi_r4p_block_part(const int8_t *wg, const uint32_t *xu, int32_t s[4],
                                                 int32_t steps)
{
#if defined(COLIBRI_QI_SIMD32)
    int32_t s0, s1, s2, s3;
    uint32_t ya, oa, yb, ob, wa, wb, t;
#define COLIBRI_QI_PSTEP0                                                                          \
    COLIBRI_QI_PX(0)                                                                               \
    COLIBRI_QI_PROW0(s0, 0)                                                                        \
    COLIBRI_QI_PROW0(s1, 16) COLIBRI_QI_PROW0(s2, 32) COLIBRI_QI_PROW0(s3, 48)
#define COLIBRI_QI_PSTEP1                                                                          \
    COLIBRI_QI_PX(16)                                                                              \
    COLIBRI_QI_PROW(s0, 8) COLIBRI_QI_PROW(s1, 24) COLIBRI_QI_PROW(s2, 40) COLIBRI_QI_PROW(s3, 56)
#define COLIBRI_QI_PSTEP2                                                                          \
    COLIBRI_QI_PX(32)                                                                              \
    COLIBRI_QI_PROW(s0, 64) COLIBRI_QI_PROW(s1, 80) COLIBRI_QI_PROW(s2, 96) COLIBRI_QI_PROW(s3, 112)
#define COLIBRI_QI_POPS                                                                            \
    : COLIBRI_QI_SUMS4("=&r", s), [ya] "=&r"(ya), [oa] "=&r"(oa), [yb] "=&r"(yb), [ob] "=&r"(ob), \
      [wa] "=&r"(wa), [wb] "=&r"(wb), [t] "=&r"(t)                                                 \
    : [w] "r"(wg), [x] "r"(xu), "m"(*(const int8_t(*)[128])wg), "m"(*(const uint32_t(*)[16])xu)
    if (steps == 1) {
        __asm__(COLIBRI_QI_PSTEP0 COLIBRI_QI_POPS);
    } else if (steps == 2) {
        __asm__(COLIBRI_QI_PSTEP0 COLIBRI_QI_PSTEP1 COLIBRI_QI_POPS);
    } else {
        __asm__(COLIBRI_QI_PSTEP0 COLIBRI_QI_PSTEP1 COLIBRI_QI_PSTEP2 COLIBRI_QI_POPS);
    }
#undef COLIBRI_QI_PSTEP0
#undef COLIBRI_QI_PSTEP1
#undef COLIBRI_QI_PSTEP2
#undef COLIBRI_QI_POPS
    COLIBRI_QI_STORE4(s, s);
#else
    (void)steps;
    colibri_qi_r4p_block(wg, xu, s);
#endif
}

#define COLIBRI_QI_R4P_FLOAT(r) colibri_qi_r4p_float(s[r])

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

/**
 * @brief colibri_qi_q8_q8_r4p, then (per-row scales only) a relu expert kernel's steps on each
 *        output as it is stored: + bias (when not NULL), then relu (when relu != 0), the same
 *        operations in the same order as colibri_qi_bias_relu after it (no second pass over
 *        the row).
 */
COLIBRI_QI_INLINE void colibri_qi_q8_q8_r4p_br(const int8_t *q, const float *scale,
                                               const int8_t *xq, const float *sx, float *y,
                                               int32_t n_out, int32_t n_in, int blocked,
                                               const float *bias, int relu, int32_t n_live)
{
    const size_t nb = COLIBRI_Q8_BLOCKS(n_in);
    const int32_t groups = n_out / COLIBRI_R4_ROWS;
    /* steps of 8 inputs that the last block has live (1..4) */
    const int32_t last_steps = (n_live - ((int32_t)nb - 1) * COLIBRI_QK8 + 7) / 8;
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
            /* the full blocks, then the row's last block when it has fewer live steps (out of
             * the loop: a test in it made GCC spill the block's float step) */
            const int32_t part = c0 + cn >= n_in && last_steps < 4;
            for (int32_t b = 0; b < cn / COLIBRI_QK8 - part; b++) {
                int32_t s[4];
                colibri_qi_r4p_block(wg + (size_t)b * 128u, xu + 16 * b, s);
                const size_t bb = (size_t)(b0 + b);
                const float xs = sx[bb];
                COLIBRI_QI_R4_MLA4(COLIBRI_QI_R4P_FLOAT, s0p, bb, nb, xs, blocked);
            }
            if (part) {
                const int32_t b = cn / COLIBRI_QK8 - 1;
                int32_t s[4];
                colibri_qi_r4p_block_part(wg + (size_t)b * 128u, xu + 16 * b, s, last_steps);
                const size_t bb = (size_t)(b0 + b);
                const float xs = sx[bb];
                COLIBRI_QI_R4_MLA4(COLIBRI_QI_R4P_FLOAT, s0p, bb, nb, xs, blocked);
            }
            if (!blocked && c0 + cn >= n_in && (bias != NULL || relu)) {
                float v[4] = {a0 * scale[o], a1 * scale[o + 1], a2 * scale[o + 2],
                              a3 * scale[o + 3]};
#pragma GCC unroll 4
                for (int32_t r = 0; r < 4; r++) {
                    if (bias != NULL) {
                        v[r] = v[r] + bias[o + r];
                    }
                    if (relu) {
                        v[r] = v[r] > 0.0f ? v[r] : 0.0f;
                    }
                    y[o + r] = v[r];
                }
            } else {
                COLIBRI_QI_R4_STORE(y, o, scale, blocked || c0 + cn < n_in);
            }
        }
    }
    COLIBRI_QI_Q8_REST(groups * COLIBRI_R4_ROWS); /* row-major, uncorrected */
    if (!blocked && (bias != NULL || relu)) {
        colibri_qi_bias_relu(y, groups * COLIBRI_R4_ROWS, n_out, bias, relu);
    }
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
    colibri_qi_q8_q8_r4p_br(q, scale, xq, sx, y, n_out, n_in, blocked, NULL, 0, n_in);
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
                                           const uint32_t *xu, const int32_t steps)
{
    const uint32_t *xp = *xpp;
    int32_t a0, a1, a2, a3;
    uint32_t wa, wb;
    float f0 = f[0], f1 = f[1], f2 = f[2], f3 = f[3];
#define COLIBRI_QI_TOPS                                                                            \
    : COLIBRI_QI_SUMS4("=&r", a), [wa] "=&r"(wa), [wb] "=&r"(wb), [xp] "+r"(xp)                    \
    : [wr] "r"(wr), "m"(*(const int8_t(*)[80])wr), "m"(*(const uint32_t(*)[COLIBRI_QI_GWORDS])xu) \
    : "r0", "r1", "r2", "r3", "r4", "r5"
    /* steps < 4: the block's live inputs end after 8 * steps (the rest zero codes on both
     * sides); the pairs of the steps left out are skipped (16 words a step) */
    if (steps >= 4) {
        __asm__(COLIBRI_QI_S1(smuad, 0) COLIBRI_QI_S1(smlad, 8) COLIBRI_QI_S1(smlad, 64)
                    COLIBRI_QI_S1(smlad, 72) COLIBRI_QI_TOPS);
    } else if (steps == 3) {
        __asm__(COLIBRI_QI_S1(smuad, 0) COLIBRI_QI_S1(smlad, 8) COLIBRI_QI_S1(smlad, 64)
                    COLIBRI_QI_TOPS);
        xp += 16;
    } else if (steps == 2) {
        __asm__(COLIBRI_QI_S1(smuad, 0) COLIBRI_QI_S1(smlad, 8) COLIBRI_QI_TOPS);
        xp += 32;
    } else {
        __asm__(COLIBRI_QI_S1(smuad, 0) COLIBRI_QI_TOPS);
        xp += 48;
    }
#undef COLIBRI_QI_TOPS
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
                                            int32_t n_in, const float *bias, int relu,
                                            int32_t n_live)
{
    const size_t nb = COLIBRI_Q8_BLOCKS(n_in);
    /* steps of 8 inputs that the last block has live (1..4) */
    const int32_t last_steps = (n_live - ((int32_t)nb - 1) * COLIBRI_QK8 + 7) / 8;
    const int32_t rows = n_out / COLIBRI_R4_ROWS * COLIBRI_R4_ROWS;
    for (int32_t c0 = 0; c0 < n_in; c0 += COLIBRI_QI_R4P_GCHUNK) {
        const int32_t cn = (n_in - c0 < COLIBRI_QI_R4P_GCHUNK) ? n_in - c0 : COLIBRI_QI_R4P_GCHUNK;
        const int32_t cb = cn / COLIBRI_QK8;
        const int32_t b0 = c0 / COLIBRI_QK8;
        uint32_t xu[COLIBRI_QI_GWORDS];
        for (int32_t b = 0; b < cb; b++) {
            uint32_t *xb = xu + (size_t)b * (COLIBRI_QI_GBLOCK / 4);
#pragma GCC unroll 1
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
            /* the chunk's blocks; the row's last one may have fewer live steps */
            const int8_t *wend = wr + (size_t)(cb - (last && last_steps < 4)) * 128u;
            while (wr != wend) {
                colibri_qi_r4p_tile(wr, &xp, f, xu, 4);
                wr += 128;
            }
            if (last && last_steps < 4) {
                colibri_qi_r4p_tile(wr, &xp, f, xu, last_steps);
            }
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
 *        token at a time. n_live (n_in - 32 < n_live <= n_in): the inputs that may be nonzero,
 *        the activation codes past them being zeros (a row quantised with padding,
 *        colibri_qi_quantize_row_pad): the steps of 8 inputs of the last block past them add
 *        nothing and are skipped (issue 40: d_ff 23 stored as 32).
 */
COLIBRI_QI_INLINE void colibri_qi_mm_q8_q8_r4p_act_live(const int8_t *q, const float *scale,
                                                        const int8_t *xq, const float *sx, float *y,
                                                        int32_t ldy, int32_t n_out, int32_t n_in,
                                                        int32_t n_live, int32_t n_tok,
                                                        const float *bias, int relu)
{
    const size_t nb = COLIBRI_Q8_BLOCKS(n_in);
    int32_t t0 = 0;
#if defined(COLIBRI_QI_SIMD32)
    for (; t0 + 4 <= n_tok; t0 += 4) {
        colibri_qi_r4p_pass4(q, scale, xq + (size_t)t0 * (size_t)n_in, sx + (size_t)t0 * nb,
                             y + (size_t)t0 * (size_t)ldy, ldy, n_out, n_in, bias, relu, n_live);
    }
#endif
    for (int32_t t = t0; t < n_tok; t++) {
        float *yt = y + (size_t)t * (size_t)ldy;
        colibri_qi_q8_q8_r4p_br(q, scale, xq + (size_t)t * (size_t)n_in, sx + (size_t)t * nb, yt,
                                n_out, n_in, 0, bias, relu, n_live);
    }
}

/** colibri_qi_mm_q8_q8_r4p_act_live with every input live (n_live = n_in). */
COLIBRI_QI_INLINE void colibri_qi_mm_q8_q8_r4p_act(const int8_t *q, const float *scale,
                                                   const int8_t *xq, const float *sx, float *y,
                                                   int32_t ldy, int32_t n_out, int32_t n_in,
                                                   int32_t n_tok, const float *bias, int relu)
{
    colibri_qi_mm_q8_q8_r4p_act_live(q, scale, xq, sx, y, ldy, n_out, n_in, n_in, n_tok, bias,
                                     relu);
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

#endif /* COLIBRI_QI_R4P_H */
