/**
 * @file kernels_neon.h
 * @brief The Neon paths of kernels_q.c (Cortex-A: aarch64 and Armv7-A with Neon), selected by
 *        kernels_isa.h when the compiler targets Neon. Private to kernels_q.c.
 *
 *  - int8 dot product: VMULL + VPADAL (16 MACs), or SDOT where the core has it.
 *
 *  - int4 x int8 block: the nibbles unpacked with VAND / VSRA and 8 subtracted (int8 lanes
 *    -8..7), then widening multiply-accumulates into int16 (VMULL + 3 VMLAL) and one widening
 *    horizontal add, or two SDOTs where the core has the dot-product extension
 *    (__ARM_FEATURE_DOTPROD: Armv8.2-A, cortex-a76). Integer sums, so exactly the portable
 *    loop's result.
 *  - fp16 -> fp32: the hardware conversion (aarch64 FCVT / FCVTL; Armv7 VCVTB / VCVT.F32.F16,
 *    which needs -mfp16-format=ieee and an FPU with the half-precision extension, as neon-vfpv4
 *    has). Exact for every finite value, subnormals included (half-precision inputs are never
 *    flushed); a NaN stays a NaN of the same sign (a signalling NaN comes back quiet).
 *  - fp16 x fp32 matvec, aarch64: four output rows per q register, each lane summing its own row
 *    for i ascending with a separate multiply and add (FMUL by element, FADD: no fusion), tiles of
 *    4 rows x 8 inputs transposed with TRN1 / TRN2 after the load. Lane r does exactly the scalar
 *    loop's operations for row o + r, so the result is bit-identical to the portable kernel and
 *    to the numpy mirror (AArch64 Neon honours FPCR: IEEE subnormals, round to nearest).
 *  - int4 x fp32 matvec, aarch64: the same four-rows-per-register scheme; the nibbles of four
 *    rows' blocks are unpacked, transposed with ZIP1 / ZIP2 and widened to exact fp32, and lane r
 *    sums bs += (q - 8) * x for j ascending, then acc += bs * d, as the scalar loop does.
 *    Elsewhere (Armv7, and the last n_out % 4 rows on aarch64) a full int4 block's weights are
 *    unpacked and converted to fp32 with Neon (exact) and summed in scalar order.
 *    Armv7 Neon float arithmetic always flushes subnormals to zero (the "standard FPSCR value"),
 *    which would break that identity, so on Armv7 only the conversion is vectorised: blocks of a
 *    row are converted into a small fp32 buffer with Neon (exact), and the sums stay in scalar
 *    VFP arithmetic in the documented order.
 */
#ifndef COLIBRI_KERNELS_NEON_H
#define COLIBRI_KERNELS_NEON_H

#include <arm_neon.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "colibri_quant.h"

#if defined(__aarch64__) || (defined(__ARM_FP16_FORMAT_IEEE) && (__ARM_FP & 2))
/** The core converts fp16 to fp32 in hardware (aarch64; Armv7 with -mfp16-format=ieee). */
#define COLIBRI_F16_NEON 1
#endif

/** @brief The sum of the four int32 lanes. */
static inline __attribute__((always_inline)) int32_t colibri_neon_hsum_s32(int32x4_t v)
{
#if defined(__aarch64__)
    return vaddvq_s32(v);
#else
    const int32x2_t pair = vadd_s32(vget_low_s32(v), vget_high_s32(v));
    return vget_lane_s32(vpadd_s32(pair, pair), 0);
#endif
}

/** @brief The integer sum of the 32 products of one full int4 block with int8 xq[32]. */
static inline __attribute__((always_inline)) int32_t
colibri_neon_q4_block(const colibri_block_q4_32 *blk, const int8_t *xq)
{
    const uint8x16_t q = vld1q_u8(blk->qs);
    const uint8x16_t minus8 = vdupq_n_u8(0xF8u); /* -8 as an int8 lane, added modulo 256 */
    const int8x16_t lo = vreinterpretq_s8_u8(vaddq_u8(vandq_u8(q, vdupq_n_u8(0x0Fu)), minus8));
    const int8x16_t hi = vreinterpretq_s8_u8(vsraq_n_u8(minus8, q, 4)); /* (q >> 4) - 8 */
    const int8x16_t x_lo = vld1q_s8(xq);
    const int8x16_t x_hi = vld1q_s8(xq + 16);
#if defined(__ARM_FEATURE_DOTPROD)
    return vaddvq_s32(vdotq_s32(vdotq_s32(vdupq_n_s32(0), lo, x_lo), hi, x_hi));
#else
    /* |(q - 8) * x| <= 8 * 128, so four products per int16 lane sum to at most 4096: multiply
     * and accumulate in int16, widen once */
    int16x8_t p = vmull_s8(vget_low_s8(lo), vget_low_s8(x_lo));
    p = vmlal_s8(p, vget_high_s8(lo), vget_high_s8(x_lo));
    p = vmlal_s8(p, vget_low_s8(hi), vget_low_s8(x_hi));
    p = vmlal_s8(p, vget_high_s8(hi), vget_high_s8(x_hi));
#if defined(__aarch64__)
    return vaddlvq_s16(p);
#else
    return colibri_neon_hsum_s32(vpaddlq_s16(p));
#endif
#endif
}

/** @brief Four int16 lanes to exact fp32. */
static inline __attribute__((always_inline)) float32x4_t colibri_neon_s16x4_f32(int16x4_t v)
{
    return vcvtq_f32_s32(vmovl_s16(v));
}

/** @brief sum_j (q_j - 8) * x[j] over one full int4 block, j ascending, in scalar arithmetic:
 *         the 32 weights unpacked and converted to fp32 with Neon (exact), then bs += w * x. */
static inline float colibri_neon_q4_block_f32(const colibri_block_q4_32 *blk, const float *x)
{
    float wf[COLIBRI_QK4];
    const uint8x16_t q = vld1q_u8(blk->qs);
    const int8x16_t minus8 = vdupq_n_s8(-8);
    const int8x16_t lo = vaddq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0Fu))), minus8);
    const int8x16_t hi = vaddq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), minus8);
    const int16x8_t w[4] = {vmovl_s8(vget_low_s8(lo)), vmovl_s8(vget_high_s8(lo)),
                            vmovl_s8(vget_low_s8(hi)), vmovl_s8(vget_high_s8(hi))};
    for (int32_t k = 0; k < 4; k++) {
        vst1q_f32(wf + 8 * k, colibri_neon_s16x4_f32(vget_low_s16(w[k])));
        vst1q_f32(wf + 8 * k + 4, colibri_neon_s16x4_f32(vget_high_s16(w[k])));
    }
    float bs = 0.0f;
#pragma GCC unroll 32
    for (int32_t j = 0; j < COLIBRI_QK4; j++) {
        bs += wf[j] * x[j];
    }
    return bs;
}

#if defined(COLIBRI_F16_NEON)
/** @brief Exact fp16 -> fp32 by the hardware (scalar FCVT / VCVTB). */
static inline float colibri_neon_f16_to_f32(uint16_t h)
{
    __fp16 v;
    memcpy(&v, &h, sizeof v);
    return (float)v;
}

#if defined(__aarch64__)
/** @brief Rows o..o+3 of an fp16 matvec: lane r sums row o + r for i ascending (mul, then add). */
static inline void colibri_neon_f16_rows4(const uint16_t *w, const float *x, float *y, int32_t n_in)
{
    const uint16_t *r0 = w;
    const uint16_t *r1 = r0 + n_in;
    const uint16_t *r2 = r1 + n_in;
    const uint16_t *r3 = r2 + n_in;
    float32x4_t acc = vdupq_n_f32(0.0f);
    int32_t i = 0;
    for (; i + 8 <= n_in; i += 8) {
        /* transpose the 4 x 8 tile: t*.val[*] hold inputs (i, i+4), (i+1, i+5), ... of 4 rows */
        const uint16x8x2_t ab = vtrnq_u16(vld1q_u16(r0 + i), vld1q_u16(r1 + i));
        const uint16x8x2_t cd = vtrnq_u16(vld1q_u16(r2 + i), vld1q_u16(r3 + i));
        const uint32x4x2_t t0 =
            vtrnq_u32(vreinterpretq_u32_u16(ab.val[0]), vreinterpretq_u32_u16(cd.val[0]));
        const uint32x4x2_t t1 =
            vtrnq_u32(vreinterpretq_u32_u16(ab.val[1]), vreinterpretq_u32_u16(cd.val[1]));
        const float16x8_t c04 = vreinterpretq_f16_u32(t0.val[0]); /* columns i, i + 4 */
        const float16x8_t c15 = vreinterpretq_f16_u32(t1.val[0]);
        const float16x8_t c26 = vreinterpretq_f16_u32(t0.val[1]);
        const float16x8_t c37 = vreinterpretq_f16_u32(t1.val[1]);
        const float32x4_t x0 = vld1q_f32(x + i);
        const float32x4_t x1 = vld1q_f32(x + i + 4);
        acc = vaddq_f32(acc, vmulq_laneq_f32(vcvt_f32_f16(vget_low_f16(c04)), x0, 0));
        acc = vaddq_f32(acc, vmulq_laneq_f32(vcvt_f32_f16(vget_low_f16(c15)), x0, 1));
        acc = vaddq_f32(acc, vmulq_laneq_f32(vcvt_f32_f16(vget_low_f16(c26)), x0, 2));
        acc = vaddq_f32(acc, vmulq_laneq_f32(vcvt_f32_f16(vget_low_f16(c37)), x0, 3));
        acc = vaddq_f32(acc, vmulq_laneq_f32(vcvt_high_f32_f16(c04), x1, 0));
        acc = vaddq_f32(acc, vmulq_laneq_f32(vcvt_high_f32_f16(c15), x1, 1));
        acc = vaddq_f32(acc, vmulq_laneq_f32(vcvt_high_f32_f16(c26), x1, 2));
        acc = vaddq_f32(acc, vmulq_laneq_f32(vcvt_high_f32_f16(c37), x1, 3));
    }
    if (i == n_in) {
        vst1q_f32(y, acc);
        return;
    }
    float a[4];
    vst1q_f32(a, acc);
    for (; i < n_in; i++) {
        a[0] += colibri_neon_f16_to_f32(r0[i]) * x[i];
        a[1] += colibri_neon_f16_to_f32(r1[i]) * x[i];
        a[2] += colibri_neon_f16_to_f32(r2[i]) * x[i];
        a[3] += colibri_neon_f16_to_f32(r3[i]) * x[i];
    }
    memcpy(y, a, sizeof a);
}
#endif

/** @brief y[o] = sum_i w[o][i] * x[i] in the documented order, hardware fp16 conversion. */
static inline void colibri_neon_matvec_f16_f32(const uint16_t *w, const float *x, float *y,
                                               int32_t n_out, int32_t n_in)
{
    int32_t o = 0;
#if defined(__aarch64__)
    for (; o + 4 <= n_out; o += 4) {
        colibri_neon_f16_rows4(w + (size_t)o * (size_t)n_in, x, y + o, n_in);
    }
#endif
    for (; o < n_out; o++) {
        const uint16_t *row = w + (size_t)o * (size_t)n_in;
        float acc = 0.0f;
        int32_t i = 0;
#if !defined(__aarch64__)
        float buf[32];
        for (; i + 32 <= n_in; i += 32) { /* convert 32 with Neon (exact), sum in scalar VFP */
            for (int32_t j = 0; j < 32; j += 8) {
                const uint16x8_t h = vld1q_u16(row + i + j);
                vst1q_f32(buf + j, vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(h))));
                vst1q_f32(buf + j + 4, vcvt_f32_f16(vreinterpret_f16_u16(vget_high_u16(h))));
            }
#pragma GCC unroll 32
            for (int32_t j = 0; j < 32; j++) { /* unrolled: 3 instructions per MAC */
                acc += buf[j] * x[i + j];
            }
        }
#endif
        for (; i < n_in; i++) {
            acc += colibri_neon_f16_to_f32(row[i]) * x[i];
        }
        y[o] = acc;
    }
}
#if defined(__aarch64__)
/** @brief Four int8 lanes (rows 0..3 of one input j) widened and converted to fp32 (exact). */
static inline __attribute__((always_inline)) float32x4_t colibri_neon_s16_lo_f32(int16x8_t v)
{
    return vcvtq_f32_s32(vmovl_s16(vget_low_s16(v)));
}

static inline __attribute__((always_inline)) float32x4_t colibri_neon_s16_hi_f32(int16x8_t v)
{
    return vcvtq_f32_s32(vmovl_high_s16(v));
}

/** @brief bs + the products of 16 inputs x[0..15] with t = 4 x 16 int8 (4 inputs per vector,
 *         each as 4 row lanes), inputs ascending: bs += w * x per input, multiply then add. */
static inline __attribute__((always_inline)) float32x4_t
colibri_neon_q4_cols16(const int8x16_t t[4], const float *x, float32x4_t bs)
{
    for (int32_t k = 0; k < 4; k++) {
        const float32x4_t xv = vld1q_f32(x + 4 * k);
        const int16x8_t w01 = vmovl_s8(vget_low_s8(t[k])); /* inputs 4k, 4k + 1 */
        const int16x8_t w23 = vmovl_high_s8(t[k]);         /* inputs 4k + 2, 4k + 3 */
        bs = vaddq_f32(bs, vmulq_laneq_f32(colibri_neon_s16_lo_f32(w01), xv, 0));
        bs = vaddq_f32(bs, vmulq_laneq_f32(colibri_neon_s16_hi_f32(w01), xv, 1));
        bs = vaddq_f32(bs, vmulq_laneq_f32(colibri_neon_s16_lo_f32(w23), xv, 2));
        bs = vaddq_f32(bs, vmulq_laneq_f32(colibri_neon_s16_hi_f32(w23), xv, 3));
    }
    return bs;
}

/** @brief Transpose 4 rows of 16 int8 into t[k] = inputs 4k..4k+3, each as 4 row lanes. */
static inline __attribute__((always_inline)) void
colibri_neon_t4x16(int8x16_t r0, int8x16_t r1, int8x16_t r2, int8x16_t r3, int8x16_t t[4])
{
    const int8x16x2_t ab = vzipq_s8(r0, r1); /* a0 b0 a1 b1 ... */
    const int8x16x2_t cd = vzipq_s8(r2, r3);
    const int16x8x2_t lo =
        vzipq_s16(vreinterpretq_s16_s8(ab.val[0]), vreinterpretq_s16_s8(cd.val[0]));
    const int16x8x2_t hi =
        vzipq_s16(vreinterpretq_s16_s8(ab.val[1]), vreinterpretq_s16_s8(cd.val[1]));
    t[0] = vreinterpretq_s8_s16(lo.val[0]);
    t[1] = vreinterpretq_s8_s16(lo.val[1]);
    t[2] = vreinterpretq_s8_s16(hi.val[0]);
    t[3] = vreinterpretq_s8_s16(hi.val[1]);
}

/** @brief Rows o..o+3 of colibri_matvec_q4_f32: lane r follows row o + r's scalar order. */
static inline void colibri_neon_q4_f32_rows4(const colibri_block_q4_32 *w, size_t nb,
                                             const float *x, float *y, int32_t n_in)
{
    const int8x16_t minus8 = vdupq_n_s8(-8);
    const uint8x16_t m0f = vdupq_n_u8(0x0Fu);
    const size_t full = (size_t)n_in / COLIBRI_QK4;
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (size_t b = 0; b < full; b++) {
        int8x16_t lo[4];
        int8x16_t hi[4];
        uint16x4_t d16 = vdup_n_u16(0);
        for (int32_t r = 0; r < 4; r++) {
            const colibri_block_q4_32 *blk = &w[(size_t)r * nb + b];
            const uint8x16_t q = vld1q_u8(blk->qs);
            lo[r] = vaddq_s8(vreinterpretq_s8_u8(vandq_u8(q, m0f)), minus8);
            hi[r] = vaddq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), minus8);
            d16 = vld1_lane_u16(&blk->d, d16, 0);
            d16 = vext_u16(d16, d16, 1); /* rotate: after four loads lane r holds row r */
        }
        int8x16_t t[4];
        const float *xb = x + b * COLIBRI_QK4;
        float32x4_t bs = vdupq_n_f32(0.0f);
        colibri_neon_t4x16(lo[0], lo[1], lo[2], lo[3], t);
        bs = colibri_neon_q4_cols16(t, xb, bs);
        colibri_neon_t4x16(hi[0], hi[1], hi[2], hi[3], t);
        bs = colibri_neon_q4_cols16(t, xb + 16, bs);
        const float32x4_t d = vcvt_f32_f16(vreinterpret_f16_u16(d16));
        acc = vaddq_f32(acc, vmulq_f32(bs, d));
    }
    if (full * COLIBRI_QK4 == (size_t)n_in) {
        vst1q_f32(y, acc);
        return;
    }
    float a[4];
    vst1q_f32(a, acc);
    const int32_t i0 = (int32_t)(full * COLIBRI_QK4);
    for (int32_t r = 0; r < 4; r++) { /* the partial last block, in the scalar order */
        const colibri_block_q4_32 *blk = &w[(size_t)r * nb + full];
        float bs = 0.0f;
        for (int32_t j = 0; j < n_in - i0; j++) {
            const uint8_t byte = blk->qs[j & 15];
            const int32_t q = (int32_t)((j < 16) ? (byte & 0x0Fu) : (byte >> 4)) - 8;
            bs += (float)q * x[i0 + j];
        }
        a[r] += bs * colibri_neon_f16_to_f32(blk->d);
    }
    memcpy(y, a, sizeof a);
}
#endif /* __aarch64__ */
#endif /* COLIBRI_F16_NEON */

#define COLIBRI_DOT_NEON 1

/** @brief acc of a[0..i) . b[0..i) for the whole 16- and 8-byte vectors of n (*pi = i). */
static inline __attribute__((always_inline)) int32_t
colibri_neon_dot_q8(const int8_t *a, const int8_t *b, int32_t n, int32_t *pi)
{
    int32_t acc = 0;
    int32_t i = 0;
    int32x4_t acc4 = vdupq_n_s32(0);
    for (; i + 16 <= n; i += 16) {
        const int8x16_t va = vld1q_s8(a + i);
        const int8x16_t vb = vld1q_s8(b + i);
#if defined(__ARM_FEATURE_DOTPROD)
        /* Armv8.2-A SDOT: 16 MACs into four int32 lanes */
        acc4 = vdotq_s32(acc4, va, vb);
#else
        /* int8 x int8 products fit int16: widen, then pair-add */
        acc4 = vpadalq_s16(acc4, vmull_s8(vget_low_s8(va), vget_low_s8(vb)));
#if defined(__aarch64__)
        acc4 = vpadalq_s16(acc4, vmull_high_s8(va, vb));
#else
        acc4 = vpadalq_s16(acc4, vmull_s8(vget_high_s8(va), vget_high_s8(vb)));
#endif
#endif
    }
    for (; i + 8 <= n; i += 8) {
        acc4 = vpadalq_s16(acc4, vmull_s8(vld1_s8(a + i), vld1_s8(b + i)));
    }
    acc = colibri_neon_hsum_s32(acc4);
    *pi = i;
    return acc;
}
#define COLIBRI_ISA_DOT_Q8 colibri_neon_dot_q8
#define COLIBRI_ISA_DOT_Q4_BLOCK colibri_neon_q4_block

#endif /* COLIBRI_KERNELS_NEON_H */
