/**
 * @file colibri_qinline_f.h
 * @brief Shape-specialised float kernels for generated expert code (issue 11): static and always
 *        inlined, so a generated expert kernel that calls them with its dimensions as constants
 *        gets a body specialised to its shape.
 *
 * Unlike colibri_qinline.h these are float paths with fused multiply-adds and their own
 * summation order: their results are not bit-exact against the library kernels or the numpy
 * mirror, only within the fp32 tolerance (colibri.reference.moe.FP32_TOLERANCE, the fp16 / fp32
 * entries of colibri.quant.formats.LAYER_TOLERANCE). They are only used by the expert kernels:
 * the router keeps its contraction-free order (every board compiles with -ffp-contract=off; the
 * fused operations here are explicit, inline assembly or Helium intrinsics), so the expert
 * choices stay bit-exact.
 *
 *  - colibri_qf_f32_c8: y = b + W x for an fp32 matrix stored in layout c8 (docs/format.md
 *    section 6): blocks of 8 outputs, each block [n_in][8] contiguous. Eight outputs per pass,
 *    so each x[i] is loaded once for eight rows and the block's weights stream from one pointer.
 *    Cortex-M4 / M7 (FPv4-SP / FPv5): eight accumulators in s0-s7, per four inputs one VLDM of
 *    x, four VLDM of eight weights and 32 VFMA. Helium: two vector accumulators, VFMA by the
 *    scalar x[i]. Elsewhere (the emitter only chooses c8 for those cores) portable C in the
 *    library's order (acc = b; acc += w * x).
 *  - colibri_qf_f16_c8: the same for fp16 weights in layout c8 (blocks of 8 outputs, each
 *    [n_in][8] fp16, as fp32 layout c8 with 2-byte elements). Cortex-M4 / M7: per four inputs
 *    one VLDM of x and one VLDM of the block's 32 fp16 weights (16 words), each converted by
 *    VCVTB / VCVTT.F32.F16 (exact, fp16 subnormals included: the FPU keeps fp32 subnormals)
 *    and 32 VFMA into s0-s7. Elsewhere portable C (the emitter only chooses it for those cores).
 *  - colibri_qf_f16_f32: colibri_matvec_f16_f32 (weights fp16 [n_out][n_in], unchanged layout).
 *    Helium with floating point: four rows per pass, one VLDRW of four x values shared by the
 *    four rows, per row a widening VLDRH.U32 of four fp16 weights, VCVTB.F32.F16 (exact, fp16
 *    subnormals included) and a VFMA in fp32 lanes, so each row sums in four partial sums; the
 *    last n_in % 4 inputs and n_out % 4 rows in C. Helium flushes subnormal fp32 values to zero
 *    (products and sums below 2^-126 are lost): within the tolerance, which is relative to the
 *    largest output. Xtensa cores with an FPU (ESP32-S3): four rows per pass, one LSI of x[i]
 *    for the four, each weight converted by colibri_qf_xt_f16 (exact: the steps of
 *    runtime_c/arch/xtensa/kernels_xtensa_f16.h, a sign-extending load, a shift, an and, an add
 *    and two tests on the fast path) and added by MADD.S (fused), one sum per row in input
 *    order. Other cores call the library (exact portable conversion).
 *    Any shape (c8 tails): the n_in % 4 inputs after the last pass of four are added in C per
 *    block, and the n_out % 8 outputs after the last whole block, stored as a narrower last
 *    block [n_in][n_out % 8] (colibri.quant.formats.c8_order), are summed in C.
 * Preconditions: y does not overlap x or w; for c8 (fp32 or fp16), n_out > 0 and n_in > 0
 * (colibri.quant.formats.c8_fits), and an fp16 c8 matrix is 4-byte aligned (the weight blob
 * aligns every tensor to 16; each whole block is 16 * n_in bytes).
 */
#ifndef COLIBRI_QINLINE_F_H
#define COLIBRI_QINLINE_F_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "colibri_quant.h"

#if defined(__ARM_FEATURE_MVE) && (__ARM_FEATURE_MVE & 2)
#include <arm_mve.h>
#define COLIBRI_QF_MVE 1
#elif defined(__ARM_ARCH_7EM__) && defined(__ARM_FP) && (__ARM_FP & 4) &&                          \
    defined(__ARM_FEATURE_FMA) && !defined(__ARM_NEON)
#define COLIBRI_QF_VFP 1
#elif defined(__XTENSA__) && !defined(__XTENSA_SOFT_FLOAT__)
#define COLIBRI_QF_XTENSA 1
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define COLIBRI_QF_INLINE static inline __attribute__((always_inline))

/** Outputs per block and the input multiple of layout c8. */
#define COLIBRI_QF_C8_COLS 8
#define COLIBRI_QF_C8_CHUNK 4

#if defined(COLIBRI_QF_VFP)
/** acc[0..7] += sum over n_in inputs (n4 = n_in / 4 passes) of w[i][0..7] * x[i], fused. */
COLIBRI_QF_INLINE void colibri_qf_c8_vfp(const float *w, const float *x, float *acc, int32_t n4)
{
    __asm__ volatile("vldmia %[acc], {s0-s7}\n"
                     "1:\n"
                     "vldmia %[x]!, {s16-s19}\n"
                     "vldmia %[w]!, {s8-s15}\n"
                     "vfma.f32 s0, s8, s16\n"
                     "vfma.f32 s1, s9, s16\n"
                     "vfma.f32 s2, s10, s16\n"
                     "vfma.f32 s3, s11, s16\n"
                     "vfma.f32 s4, s12, s16\n"
                     "vfma.f32 s5, s13, s16\n"
                     "vfma.f32 s6, s14, s16\n"
                     "vfma.f32 s7, s15, s16\n"
                     "vldmia %[w]!, {s8-s15}\n"
                     "vfma.f32 s0, s8, s17\n"
                     "vfma.f32 s1, s9, s17\n"
                     "vfma.f32 s2, s10, s17\n"
                     "vfma.f32 s3, s11, s17\n"
                     "vfma.f32 s4, s12, s17\n"
                     "vfma.f32 s5, s13, s17\n"
                     "vfma.f32 s6, s14, s17\n"
                     "vfma.f32 s7, s15, s17\n"
                     "vldmia %[w]!, {s8-s15}\n"
                     "vfma.f32 s0, s8, s18\n"
                     "vfma.f32 s1, s9, s18\n"
                     "vfma.f32 s2, s10, s18\n"
                     "vfma.f32 s3, s11, s18\n"
                     "vfma.f32 s4, s12, s18\n"
                     "vfma.f32 s5, s13, s18\n"
                     "vfma.f32 s6, s14, s18\n"
                     "vfma.f32 s7, s15, s18\n"
                     "vldmia %[w]!, {s8-s15}\n"
                     "vfma.f32 s0, s8, s19\n"
                     "vfma.f32 s1, s9, s19\n"
                     "vfma.f32 s2, s10, s19\n"
                     "vfma.f32 s3, s11, s19\n"
                     "vfma.f32 s4, s12, s19\n"
                     "vfma.f32 s5, s13, s19\n"
                     "vfma.f32 s6, s14, s19\n"
                     "vfma.f32 s7, s15, s19\n"
                     "subs %[n], %[n], #1\n"
                     "bne 1b\n"
                     "vstmia %[acc], {s0-s7}\n"
                     : [w] "+r"(w), [x] "+r"(x), [n] "+r"(n4)
                     : [acc] "r"(acc)
                     : "s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9", "s10", "s11",
                       "s12", "s13", "s14", "s15", "s16", "s17", "s18", "s19", "cc", "memory");
}
#endif

#if defined(COLIBRI_QF_VFP) || defined(COLIBRI_QF_MVE)
/** acc + w * x rounded once (VFMA.F32): the c8 kernels' tails sum as their passes do, so each
 *  output is the fused sum over its inputs in order (colibri_qi_ref.c's FUSED twins). */
COLIBRI_QF_INLINE float colibri_qf_fma(float acc, float w, float x)
{
    __asm__("vfma.f32 %[a], %[w], %[x]" : [a] "+t"(acc) : [w] "t"(w), [x] "t"(x));
    return acc;
}
#define COLIBRI_QF_MADD(acc, w, x) colibri_qf_fma((acc), (w), (x))
#else
#define COLIBRI_QF_MADD(acc, w, x) ((acc) + (w) * (x))
#endif

/* The bodies the fp32 and fp16 c8 kernels share (their parameters w, b, x, y, n_out, n_in in
 * scope). COLIBRI_QF_C8_PASSES(T, load, pass): per whole block of 8 outputs, y = the bias (or
 * 0), the assembly pass adds the products of the inputs in whole passes of four, C the
 * n_in % 4 after them; then COLIBRI_QF_C8_TAIL. COLIBRI_QF_C8_TAIL(T, load): the n_out % 8
 * outputs after the last whole block, their block [n_in][n_out % 8], in C. Both sum with
 * COLIBRI_QF_MADD (fused where the passes are).
 * COLIBRI_QF_C8_REF(T, load): the portable loop. Weights of type T are read as floats by load. */
#define COLIBRI_QF_C8_PASSES(T, load, pass)                                                        \
    for (int32_t o = 0; o + COLIBRI_QF_C8_COLS <= n_out; o += COLIBRI_QF_C8_COLS) {                \
        const T *wb = w + (size_t)o * (size_t)n_in;                                                \
        for (int32_t r = 0; r < COLIBRI_QF_C8_COLS; r++) {                                         \
            y[o + r] = (b != NULL) ? b[o + r] : 0.0f;                                              \
        }                                                                                          \
        if (n_in >= COLIBRI_QF_C8_CHUNK) {                                                         \
            pass(wb, x, y + o, n_in / COLIBRI_QF_C8_CHUNK);                                        \
        }                                                                                          \
        for (int32_t i = n_in - n_in % COLIBRI_QF_C8_CHUNK; i < n_in; i++) {                       \
            for (int32_t r = 0; r < COLIBRI_QF_C8_COLS; r++) {                                     \
                y[o + r] = COLIBRI_QF_MADD(                                                        \
                    y[o + r], load(wb[(size_t)i * COLIBRI_QF_C8_COLS + (size_t)r]), x[i]);         \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    COLIBRI_QF_C8_TAIL(T, load)
#define COLIBRI_QF_C8_TAIL(T, load)                                                                \
    for (int32_t o = n_out - n_out % COLIBRI_QF_C8_COLS; o < n_out; o++) {                         \
        const int32_t wd = n_out % COLIBRI_QF_C8_COLS;                                             \
        const T *wb = w + (size_t)(n_out - wd) * (size_t)n_in + (size_t)(o % COLIBRI_QF_C8_COLS);  \
        float acc = (b != NULL) ? b[o] : 0.0f;                                                     \
        for (int32_t i = 0; i < n_in; i++) {                                                       \
            acc = COLIBRI_QF_MADD(acc, load(wb[(size_t)i * (size_t)wd]), x[i]);                    \
        }                                                                                          \
        y[o] = acc;                                                                                \
    }
#define COLIBRI_QF_C8_REF(T, load)                                                                 \
    for (int32_t o = 0; o < n_out; o++) {                                                          \
        const int32_t o0 = o - o % COLIBRI_QF_C8_COLS;                                             \
        const int32_t wd = (n_out - o0 < COLIBRI_QF_C8_COLS) ? n_out - o0 : COLIBRI_QF_C8_COLS;    \
        const T *wb = w + (size_t)o0 * (size_t)n_in + (size_t)(o % COLIBRI_QF_C8_COLS);            \
        float acc = (b != NULL) ? b[o] : 0.0f;                                                     \
        for (int32_t i = 0; i < n_in; i++) {                                                       \
            acc += load(wb[(size_t)i * (size_t)wd]) * x[i];                                        \
        }                                                                                          \
        y[o] = acc;                                                                                \
    }
#define COLIBRI_QF_AS_F32(v) (v)

/**
 * @brief y[o] = (b ? b[o] : 0) + sum_i w(o, i) * x[i] for W [n_out][n_in] stored in layout c8
 *        (w + (o / 8) * 8 * n_in + i * width + o % 8, width 8 or, in the last block of
 *        n_out % 8 outputs, n_out % 8), fused multiply-adds on the M4 / M7 and Helium (the
 *        tails in C). n_out > 0 and n_in > 0; y must not overlap x or w.
 */
COLIBRI_QF_INLINE void colibri_qf_f32_c8(const float *w, const float *b, const float *x, float *y,
                                         int32_t n_out, int32_t n_in)
{
#if defined(COLIBRI_QF_MVE)
    for (int32_t o = 0; o + COLIBRI_QF_C8_COLS <= n_out; o += COLIBRI_QF_C8_COLS) {
        const float *wb = w + (size_t)o * (size_t)n_in;
        float32x4_t a0 = vdupq_n_f32(0.0f);
        float32x4_t a1 = vdupq_n_f32(0.0f);
        if (b != NULL) {
            a0 = vld1q_f32(b + o);
            a1 = vld1q_f32(b + o + 4);
        }
        for (int32_t i = 0; i < n_in; i++) {
            const float xi = x[i];
            a0 = vfmaq_n_f32(a0, vld1q_f32(wb), xi);
            a1 = vfmaq_n_f32(a1, vld1q_f32(wb + 4), xi);
            wb += COLIBRI_QF_C8_COLS;
        }
        vst1q_f32(y + o, a0);
        vst1q_f32(y + o + 4, a1);
    }
    COLIBRI_QF_C8_TAIL(float, COLIBRI_QF_AS_F32);
#elif defined(COLIBRI_QF_VFP)
    COLIBRI_QF_C8_PASSES(float, COLIBRI_QF_AS_F32, colibri_qf_c8_vfp);
#else
    COLIBRI_QF_C8_REF(float, COLIBRI_QF_AS_F32);
#endif
}

#if defined(COLIBRI_QF_VFP)
/* One input i of an fp16 c8 pass: its 8 weights in words W0, W1, W2, W3 (outputs 0..7, two per
 * word, the even output in the bottom half), converted into s28-s31 and fused into s0-s7 by
 * x[i] in X. */
#define COLIBRI_QF_H8(W0, W1, W2, W3, X)                                                           \
    "vcvtb.f32.f16 s28, " W0 "\n"                                                                  \
    "vcvtt.f32.f16 s29, " W0 "\n"                                                                  \
    "vcvtb.f32.f16 s30, " W1 "\n"                                                                  \
    "vcvtt.f32.f16 s31, " W1 "\n"                                                                  \
    "vfma.f32 s0, s28, " X "\n"                                                                    \
    "vfma.f32 s1, s29, " X "\n"                                                                    \
    "vfma.f32 s2, s30, " X "\n"                                                                    \
    "vfma.f32 s3, s31, " X "\n"                                                                    \
    "vcvtb.f32.f16 s28, " W2 "\n"                                                                  \
    "vcvtt.f32.f16 s29, " W2 "\n"                                                                  \
    "vcvtb.f32.f16 s30, " W3 "\n"                                                                  \
    "vcvtt.f32.f16 s31, " W3 "\n"                                                                  \
    "vfma.f32 s4, s28, " X "\n"                                                                    \
    "vfma.f32 s5, s29, " X "\n"                                                                    \
    "vfma.f32 s6, s30, " X "\n"                                                                    \
    "vfma.f32 s7, s31, " X "\n"

/** acc[0..7] += sum over n_in inputs (n4 = n_in / 4 passes) of w[i][0..7] * x[i] for fp16 w in
 *  layout c8 (4-byte aligned), converted by VCVTB / VCVTT, fused. */
COLIBRI_QF_INLINE void colibri_qf_h8_vfp(const uint16_t *w, const float *x, float *acc, int32_t n4)
{
    __asm__ volatile(
        "vldmia %[acc], {s0-s7}\n"
        "1:\n"
        "vldmia %[x]!, {s24-s27}\n"
        "vldmia %[w]!, {s8-s23}\n" COLIBRI_QF_H8("s8", "s9", "s10", "s11", "s24")
            COLIBRI_QF_H8("s12", "s13", "s14", "s15", "s25")
                COLIBRI_QF_H8("s16", "s17", "s18", "s19", "s26")
                    COLIBRI_QF_H8("s20", "s21", "s22", "s23", "s27") "subs %[n], %[n], #1\n"
                                                                     "bne 1b\n"
                                                                     "vstmia %[acc], {s0-s7}\n"
        : [w] "+r"(w), [x] "+r"(x), [n] "+r"(n4)
        : [acc] "r"(acc)
        : "s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9", "s10", "s11", "s12", "s13",
          "s14", "s15", "s16", "s17", "s18", "s19", "s20", "s21", "s22", "s23", "s24", "s25", "s26",
          "s27", "s28", "s29", "s30", "s31", "cc", "memory");
}
#undef COLIBRI_QF_H8
#endif

/**
 * @brief y[o] = (b ? b[o] : 0) + sum_i w(o, i) * x[i] for fp16 W [n_out][n_in] stored in layout
 *        c8 (as colibri_qf_f32_c8's, 4-byte aligned): on the M4 / M7 hardware conversion
 *        (VCVTB / VCVTT) and fused multiply-adds (the tails in C, the portable conversion).
 *        n_out > 0 and n_in > 0; y must not overlap x or w.
 */
COLIBRI_QF_INLINE void colibri_qf_f16_c8(const uint16_t *w, const float *b, const float *x,
                                         float *y, int32_t n_out, int32_t n_in)
{
#if defined(COLIBRI_QF_VFP)
    COLIBRI_QF_C8_PASSES(uint16_t, colibri_f16_to_f32, colibri_qf_h8_vfp);
#else
    COLIBRI_QF_C8_REF(uint16_t, colibri_f16_to_f32);
#endif
}

#if defined(COLIBRI_QF_MVE)
/** Sum of the four lanes. */
COLIBRI_QF_INLINE float colibri_qf_hsum(float32x4_t v)
{
    return (vgetq_lane_f32(v, 0) + vgetq_lane_f32(v, 1)) +
           (vgetq_lane_f32(v, 2) + vgetq_lane_f32(v, 3));
}

/* GNU as 2.40 encodes the register fields of MVE VCVTB.F32.F16 Qd, Qm wrongly (q1 as q2 and so
 * on; only q0, q0 comes out right), which makes vcvtbq_f32_f16 unusable: the kernels below use
 * q0 with the mnemonic and give other registers as the instruction's encoding, 0xFE3F0E01 |
 * Qd << 13 | Qm << 1 (Arm ARM, VCVTB T1, op = 1: F32 from the bottom F16 halves). */
#define COLIBRI_QF_VCVTB_Q1 ".inst.w 0xfe3f2e03\n" /* vcvtb.f32.f16 q1, q1 */
#define COLIBRI_QF_VCVTB_Q2 ".inst.w 0xfe3f4e05\n" /* vcvtb.f32.f16 q2, q2 */

/** Four fp16 weights from w (any 2-byte alignment) as fp32: a widening VLDRH.U32 puts each in
 *  the bottom half of its lane, VCVTB converts the bottom halves. */
COLIBRI_QF_INLINE float32x4_t colibri_qf_h4(const uint16_t *w)
{
    float32x4_t v;
    __asm__("vldrh.u32 q0, [%[w]]\n"
            "vcvtb.f32.f16 q0, q0\n"
            "vmov %q[v], q0\n"
            : [v] "=w"(v)
            : [w] "l"(w), "m"(*(const uint16_t(*)[4])w)
            : "q0");
    return v;
}

/** acc0..3 (q4..q7) += four rows (from w, stride n_in) times x, four inputs per pass, n4
 *  passes (the widening VLDRH takes its base from r0-r7: constraint "l"). */
COLIBRI_QF_INLINE void colibri_qf_f16_loop4(const uint16_t *w, const float *x, int32_t n_in,
                                            int32_t n4, float *acc)
{
    const uint16_t *w1 = w + (size_t)n_in;
    const uint16_t *w2 = w1 + (size_t)n_in;
    const uint16_t *w3 = w2 + (size_t)n_in;
    __asm__ volatile(
        "vldrw.32 q4, [%[acc]]\n"
        "vldrw.32 q5, [%[acc], #16]\n"
        "vldrw.32 q6, [%[acc], #32]\n"
        "vldrw.32 q7, [%[acc], #48]\n"
        "1:\n"
        "vldrw.32 q3, [%[x]], #16\n"
        "vldrh.u32 q1, [%[w0]], #8\n"
        "vldrh.u32 q2, [%[w1]], #8\n" COLIBRI_QF_VCVTB_Q1 COLIBRI_QF_VCVTB_Q2
        "vfma.f32 q4, q1, q3\n"
        "vfma.f32 q5, q2, q3\n"
        "vldrh.u32 q1, [%[w2]], #8\n"
        "vldrh.u32 q2, [%[w3]], #8\n" COLIBRI_QF_VCVTB_Q1 COLIBRI_QF_VCVTB_Q2
        "vfma.f32 q6, q1, q3\n"
        "vfma.f32 q7, q2, q3\n"
        "subs %[n], %[n], #1\n"
        "bne 1b\n"
        "vstrw.32 q4, [%[acc]]\n"
        "vstrw.32 q5, [%[acc], #16]\n"
        "vstrw.32 q6, [%[acc], #32]\n"
        "vstrw.32 q7, [%[acc], #48]\n"
        : [w0] "+l"(w), [w1] "+l"(w1), [w2] "+l"(w2), [w3] "+l"(w3), [x] "+r"(x), [n] "+r"(n4)
        : [acc] "r"(acc)
        : "q1", "q2", "q3", "q4", "q5", "q6", "q7", "cc", "memory");
}

/** The rest of a row from input i on (fewer than 4 inputs), then the lanes' sum. */
COLIBRI_QF_INLINE float colibri_qf_f16_finish(float32x4_t acc, const uint16_t *row, const float *x,
                                              int32_t i, int32_t n_in)
{
    float s = colibri_qf_hsum(acc);
    for (; i < n_in; i++) {
        s += colibri_f16_to_f32(row[i]) * x[i];
    }
    return s;
}

/** Four rows of colibri_qf_f16_f32 from row pointer w. */
COLIBRI_QF_INLINE void colibri_qf_f16_rows4(const uint16_t *w, const float *x, float *y,
                                            int32_t n_in)
{
    float acc[16] __attribute__((aligned(16))) = {0};
    const int32_t n4 = n_in / 4;
    if (n4 > 0) {
        colibri_qf_f16_loop4(w, x, n_in, n4, acc);
    }
    for (int32_t r = 0; r < 4; r++) {
        y[r] = colibri_qf_f16_finish(vld1q_f32(acc + 4 * r), w + (size_t)r * (size_t)n_in, x,
                                     4 * n4, n_in);
    }
}

/** One row of colibri_qf_f16_f32. */
COLIBRI_QF_INLINE float colibri_qf_f16_row(const uint16_t *w, const float *x, int32_t n_in)
{
    float32x4_t a0 = vdupq_n_f32(0.0f);
    int32_t i = 0;
    for (; i + 4 <= n_in; i += 4) {
        a0 = vfmaq_f32(a0, colibri_qf_h4(w + i), vld1q_f32(x + i));
    }
    return colibri_qf_f16_finish(a0, w, x, i, n_in);
}
#endif

#if defined(COLIBRI_QF_XTENSA)
/** The fp32 of the given bits (WFR: not through memory). */
COLIBRI_QF_INLINE float colibri_qf_xt_bits(uint32_t bits)
{
    float f;
    __asm__("wfr %0, %1" : "=f"(f) : "a"(bits));
    return f;
}

/** fp16 bits to fp32, exact for every pattern (kernels_xtensa_f16.h's colibri_xt_f16_to_f32:
 *  the sign-extended bits shifted left by 13, bits 28..30 cleared, + 112 << 23 for a normal
 *  exponent, tested as exponent + 1 in 2..31; infinities and NaNs + 224 << 23, subnormals and
 *  zeros 1.m * 2^-14 - 2^-14, the sign or-ed in after). */
COLIBRI_QF_INLINE float colibri_qf_xt_f16(uint16_t h)
{
    const uint32_t bits = ((uint32_t)(int32_t)(int16_t)h << 13) & 0x8FFFFFFFu;
    const uint32_t next = bits + 0x00800000u;
    if (__builtin_expect((next & 0x0F000000u) == 0u, 0)) {
        if ((bits & 0x0F800000u) != 0u) {
            return colibri_qf_xt_bits(bits + 0x70000000u); /* infinity, NaN */
        }
        const float f = colibri_qf_xt_bits((bits & 0x0FFFFFFFu) + 0x38800000u) - 6.103515625e-05f;
        uint32_t mag;
        memcpy(&mag, &f, sizeof mag);
        return colibri_qf_xt_bits(mag | (bits & 0x80000000u));
    }
    return colibri_qf_xt_bits(next + 0x37800000u);
}

/** acc + a * b, fused (MADD.S). */
COLIBRI_QF_INLINE float colibri_qf_xt_madd(float acc, float a, float b)
{
    __asm__("madd.s %0, %1, %2" : "+f"(acc) : "f"(a), "f"(b));
    return acc;
}

/** Four rows of colibri_qf_f16_f32 from row pointer w (stride n_in), one x load for the four. */
COLIBRI_QF_INLINE void colibri_qf_xt_rows4(const uint16_t *w, const float *x, float *y,
                                           int32_t n_in)
{
    const uint16_t *w1 = w + (size_t)n_in;
    const uint16_t *w2 = w1 + (size_t)n_in;
    const uint16_t *w3 = w2 + (size_t)n_in;
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
    for (int32_t i = 0; i < n_in; i++) {
        const float xi = x[i];
        a0 = colibri_qf_xt_madd(a0, colibri_qf_xt_f16(w[i]), xi);
        a1 = colibri_qf_xt_madd(a1, colibri_qf_xt_f16(w1[i]), xi);
        a2 = colibri_qf_xt_madd(a2, colibri_qf_xt_f16(w2[i]), xi);
        a3 = colibri_qf_xt_madd(a3, colibri_qf_xt_f16(w3[i]), xi);
    }
    y[0] = a0;
    y[1] = a1;
    y[2] = a2;
    y[3] = a3;
}
#endif

/**
 * @brief colibri_matvec_f16_f32 (y[o] = sum_i (float)w[o][i] * x[i], w fp16 [n_out][n_in]),
 *        within the fp32 tolerance: on Helium with hardware conversion and fused multiply-adds,
 *        on Xtensa FPUs with MADD.S, elsewhere the library itself.
 */
COLIBRI_QF_INLINE void colibri_qf_f16_f32(const uint16_t *w, const float *x, float *y,
                                          int32_t n_out, int32_t n_in)
{
#if defined(COLIBRI_QF_MVE)
    const int32_t full = n_out / 4 * 4;
    for (int32_t o = 0; o < full; o += 4) {
        colibri_qf_f16_rows4(w + (size_t)o * (size_t)n_in, x, y + o, n_in);
    }
    for (int32_t o = full; o < n_out; o++) { /* the last 1..3 rows */
        y[o] = colibri_qf_f16_row(w + (size_t)o * (size_t)n_in, x, n_in);
    }
#elif defined(COLIBRI_QF_XTENSA)
    const int32_t full = n_out / 4 * 4;
    for (int32_t o = 0; o < full; o += 4) {
        colibri_qf_xt_rows4(w + (size_t)o * (size_t)n_in, x, y + o, n_in);
    }
    for (int32_t o = full; o < n_out; o++) { /* the last 1..3 rows */
        const uint16_t *row = w + (size_t)o * (size_t)n_in;
        float a0 = 0.0f;
        for (int32_t i = 0; i < n_in; i++) {
            a0 = colibri_qf_xt_madd(a0, colibri_qf_xt_f16(row[i]), x[i]);
        }
        y[o] = a0;
    }
#else
    colibri_matvec_f16_f32(w, x, y, n_out, n_in);
#endif
}

#ifdef __cplusplus
}
#endif

#endif /* COLIBRI_QINLINE_F_H */
