/**
 * @file kernels_xtensa_f16.h
 * @brief Xtensa fp16 path of kernels_q.c (ESP32 / ESP32-S3, selected by kernels_isa.h): the
 *        fp16 -> fp32 conversion without a float multiply or a call, and colibri_matvec_f16_f32
 *        two rows at a time. Private to kernels_q.c (and kernels_mac16_q4.h, for block scales).
 *
 * The conversion is exact for every pattern and returns the portable code's bits
 * (colibri_f16_to_f32_scalar; refkernels.c checks all 65,536): the bits sign-extended and
 * shifted left by 13 put the sign in bit 31, exponent and mantissa in fp32 position; with bits
 * 28..30 cleared, + 112 << 23 re-biases a normal exponent (1..30). On that fast path: a
 * sign-extending load, a shift, an and, two adds, a test of the exponent (+ 1 in its field:
 * 2..31 for a normal value) and a WFR. Off it an infinity or NaN gets 224 << 23 instead
 * (exponent all ones, the mantissa and a NaN's payload kept as they are), and a subnormal or
 * zero gets 113 << 23, which makes the value 1.m * 2^-14, from which 2^-14 is subtracted in
 * fp32: exact (Sterbenz), m * 2^-24, +0 for m = 0 (the sign is or-ed in after). The matvec
 * keeps the library's order per row (acc += w[i] * x[i], i ascending, no fused operations), so
 * it is the portable kernel bit for bit; two rows share each load of x.
 */
#ifndef COLIBRI_KERNELS_XTENSA_F16_H
#define COLIBRI_KERNELS_XTENSA_F16_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define COLIBRI_F16_XTENSA 1

/** @brief The fp32 of the given bits (WFR on an FPU: not through memory). */
static inline __attribute__((always_inline)) float colibri_xt_bits_f32(uint32_t bits)
{
    float f;
#if !defined(__XTENSA_SOFT_FLOAT__)
    __asm__("wfr %0, %1" : "=f"(f) : "a"(bits));
#else
    memcpy(&f, &bits, sizeof f);
#endif
    return f;
}

/** @brief colibri_xt_f16_to_f32 off its fast path: bits = h's sign in bit 31, exponent 0 or 31
 *         in bits 23..27, mantissa in 13..22 (bits 28..30 clear). */
static inline __attribute__((always_inline)) float colibri_xt_f16_to_f32_rare(uint32_t bits)
{
    if ((bits & 0x0F800000u) != 0u) {
        return colibri_xt_bits_f32(bits + 0x70000000u); /* infinity, NaN: exponent all ones */
    }
    /* 1.m * 2^-14 - 2^-14 = m * 2^-24, exact; the sign after */
    const float f = colibri_xt_bits_f32((bits & 0x0FFFFFFFu) + 0x38800000u) - 6.103515625e-05f;
    uint32_t mag;
    memcpy(&mag, &f, sizeof mag);
    return colibri_xt_bits_f32(mag | (bits & 0x80000000u));
}

/** @brief fp16 bits to fp32, every pattern exact (see the file comment). */
static inline __attribute__((always_inline)) float colibri_xt_f16_to_f32(uint16_t h)
{
    /* h sign-extended and shifted left by 13: the sign in bits 28..31, the exponent in 23..27,
     * the mantissa in 13..22; without bits 28..30, + 112 << 23 re-biases a normal exponent */
    const uint32_t bits = ((uint32_t)(int32_t)(int16_t)h << 13) & 0x8FFFFFFFu;
    /* the exponent + 1 in bits 23..27 (31 + 1 carries out of the field): 2..31 for 1..30 */
    const uint32_t next = bits + 0x00800000u;
    if (__builtin_expect((next & 0x0F000000u) == 0u, 0)) {
        return colibri_xt_f16_to_f32_rare(bits);
    }
    return colibri_xt_bits_f32(next + 0x37800000u);
}

/** @brief colibri_matvec_f16_f32 bit for bit: two rows per pass over x, each in its order. */
static inline void colibri_xt_matvec_f16_f32(const uint16_t *w, const float *x, float *y,
                                             int32_t n_out, int32_t n_in)
{
    int32_t o = 0;
    for (; o + 2 <= n_out; o += 2) {
        const uint16_t *r0 = w + (size_t)o * (size_t)n_in;
        const uint16_t *r1 = r0 + n_in;
        float a0 = 0.0f;
        float a1 = 0.0f;
        for (int32_t i = 0; i < n_in; i++) {
            const float xi = x[i];
            a0 += colibri_xt_f16_to_f32(r0[i]) * xi;
            a1 += colibri_xt_f16_to_f32(r1[i]) * xi;
        }
        y[o] = a0;
        y[o + 1] = a1;
    }
    if (o < n_out) {
        const uint16_t *r0 = w + (size_t)o * (size_t)n_in;
        float a0 = 0.0f;
        for (int32_t i = 0; i < n_in; i++) {
            a0 += colibri_xt_f16_to_f32(r0[i]) * x[i];
        }
        y[o] = a0;
    }
}

#define COLIBRI_ISA_F16_TO_F32 colibri_xt_f16_to_f32
#define COLIBRI_ISA_MATVEC_F16_F32 colibri_xt_matvec_f16_f32

#endif /* COLIBRI_KERNELS_XTENSA_F16_H */
