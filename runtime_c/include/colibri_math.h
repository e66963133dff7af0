/**
 * @file colibri_math.h
 * @brief The runtime's own exp and SiLU, the same bits on every board.
 *
 * libm's expf differs between C libraries (glibc, newlib, picolibc, ESP-IDF's) by an ulp here
 * and there, and an ulp in a softmax or a SiLU can flip an int8 activation code downstream, so
 * two boards (or C and the numpy mirror) would drift apart over a long generation. Every exp
 * of the runtime and of the generated code (router softmax, attention softmax, SiLU, the
 * shared expert's sigmoid gate) is therefore colibri_expf below: IEEE fp32 adds and multiplies
 * only (no fused multiply-add: every board builds with -ffp-contract=off), so it gives the
 * same bits everywhere, and colibri/reference/f32.py repeats it exactly in numpy.
 *
 * exp(x) = 2^n * exp(r): n = round(x / ln 2) by the 1.5 * 2^23 trick, r = x - n ln 2 in two
 * steps (Cody-Waite), exp(r) by the Cephes expf polynomial; about 1 ulp from the true value on
 * [-87, 88.72]. Below -87 it returns 0 (the true value is under 1.7e-38); above
 * COLIBRI_EXP_MAX (ln FLT_MAX) +inf; NaN gives NaN.
 */
#ifndef COLIBRI_MATH_H
#define COLIBRI_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#define COLIBRI_EXP_MIN (-87.0f)
#define COLIBRI_EXP_MAX 88.7228394f
#define COLIBRI_EXP_LOG2E 1.44269504088896341f
/* 1.5 * 2^23: t = y + ROUND holds round(y) in its low bits */
#define COLIBRI_EXP_ROUND 12582912.0f
#define COLIBRI_EXP_ROUND_BITS 0x4B400000u
#define COLIBRI_EXP_LN2_HI 0.693359375f
#define COLIBRI_EXP_LN2_LO (-2.12194440e-4f)
#define COLIBRI_EXP_P0 1.9875691500e-4f
#define COLIBRI_EXP_P1 1.3981999507e-3f
#define COLIBRI_EXP_P2 8.3334519073e-3f
#define COLIBRI_EXP_P3 4.1665795894e-2f
#define COLIBRI_EXP_P4 1.6666665459e-1f
#define COLIBRI_EXP_P5 5.0000001201e-1f

/** @brief exp(x) in fp32, the same bits on every board (see the file comment). */
static inline float colibri_expf(float x)
{
    if (x < COLIBRI_EXP_MIN) {
        return 0.0f;
    }
    if (x > COLIBRI_EXP_MAX) {
        return INFINITY;
    }
    const float t = x * COLIBRI_EXP_LOG2E + COLIBRI_EXP_ROUND;
    const float n = t - COLIBRI_EXP_ROUND;
    const float r = (x - n * COLIBRI_EXP_LN2_HI) - n * COLIBRI_EXP_LN2_LO;
    const float z = r * r;
    float p = COLIBRI_EXP_P0;
    p = p * r + COLIBRI_EXP_P1;
    p = p * r + COLIBRI_EXP_P2;
    p = p * r + COLIBRI_EXP_P3;
    p = p * r + COLIBRI_EXP_P4;
    p = p * r + COLIBRI_EXP_P5;
    const float y = (p * z + r) + 1.0f;
    uint32_t bits;
    memcpy(&bits, &t, sizeof bits);
    /* n is in -125..128; 2^128 is not a float, so n = 128 scales by 2^127, then by 2 */
    const int top = (n > 127.0f);
    bits = (bits - (uint32_t)top + (127u - COLIBRI_EXP_ROUND_BITS)) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return top ? (y * scale) * 2.0f : y * scale;
}

/** @brief SiLU v * sigmoid(v) = v / (1 + exp(-v)), with colibri_expf. */
static inline float colibri_silu(float v)
{
    return v / (1.0f + colibri_expf(-v));
}

#ifdef __cplusplus
}
#endif

#endif /* COLIBRI_MATH_H */
