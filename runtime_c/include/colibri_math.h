/**
 * @file colibri_math.h
 * @brief The runtime's own exp, SiLU, erf, tanh and the two GELUs, the same bits on every board.
 *
 * libm's expf (and erff, tanhf) differs between C libraries (glibc, newlib, picolibc,
 * ESP-IDF's) by an ulp here and there, and an ulp in a softmax or an activation can flip an
 * int8 activation code downstream, so two boards (or C and the numpy mirror) would drift apart
 * over a long generation. Every exp of the runtime and of the generated code (router softmax,
 * attention softmax, SiLU, the GELUs, the shared expert's sigmoid gate) is therefore
 * colibri_expf below: IEEE fp32 adds and multiplies only (no fused multiply-add: every board
 * builds with -ffp-contract=off), so it gives the same bits everywhere, and
 * colibri/reference/f32.py repeats it exactly in numpy.
 *
 * exp(x) = 2^n * exp(r): n = round(x / ln 2) by the 1.5 * 2^23 trick, r = x - n ln 2 in two
 * steps (Cody-Waite), exp(r) by the Cephes expf polynomial; about 1 ulp from the true value on
 * [-87, 88.72]. Below -87 it returns 0 (the true value is under 1.7e-38); above
 * COLIBRI_EXP_MAX (ln FLT_MAX) +inf; NaN gives NaN.
 *
 * The GELUs (and the erf and tanh they need) are built the same way, from fp32 + - * / and
 * colibri_expf only, with polynomials fitted for Colibri (weighted least squares iterated
 * towards minimax on float64 erf / erfc / tanh, coefficients rounded to float):
 * - colibri_erff: |x| < 0.875: x + x P(x^2) (P of degree 5); |x| < 4: 1 - exp(-x^2) R(t),
 *   t = 1 / (1 + x / 2), R of degree 7 (R(x) ~ erfc(x) exp(x^2)), sign restored; |x| >= 4:
 *   +-1 (1 - erf(4) = 1.5e-8 is below half an ulp of 1).
 * - colibri_tanhf: |x| < 0.625: x + x (x^2 Q(x^2)) (Q of degree 4); above: 1 - 2 / (exp(2|x|)
 *   + 1), sign restored (exp overflows to inf from |x| = 44.4 on, giving exactly 1).
 * - colibri_gelu: 0.5 x (1 + colibri_erff(x / sqrt 2)), the usual form (for x below -5.66 the
 *   erf is -1 and the result -0, as with libm's erff).
 * - colibri_gelu_tanh: x / (1 + exp(-2u)), u = sqrt(2 / pi) (x + 0.044715 x^3): the tanh form
 *   0.5 x (1 + tanh u) rewritten as a sigmoid, which keeps its relative accuracy for negative x
 *   where 1 + tanh u cancels.
 * Both GELUs return -0 below COLIBRI_GELU_ZERO_BELOW (-11), where the formulas already give -0
 * for finite x; it makes GELU(-inf) = -0 instead of inf * 0 = NaN. NaN gives NaN everywhere.
 * Measured against float64 (math.erf, numpy.tanh, the float64 GELUs) on every float32 multiple
 * of 2^-15 in [-10, 10] plus 2 million random finite bit patterns (tests/reference/
 * test_f32_ops.py repeats it): erf at most 1.41 ulp (8.4e-8 absolute), tanh at most 1.22 ulp
 * (7.25e-8); gelu at most 4.47e-7 absolute on [-10, 10] (1.03e-7 * max(|x|, 1)), 2.64 ulp for
 * x >= -1; gelu_tanh at most 5.16e-7 (1.17e-7 * max(|x|, 1)), 2.33 ulp for x >= -1. +-inf give
 * erf / tanh +-1, gelu(+inf) = +inf, gelu(-inf) = -0; signed zeros are kept (erf(-0) = -0).
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

/* colibri_erff: below ERF_SMALL x + x P(x^2), P = S0 + S1 s + ... + S5 s^5 */
#define COLIBRI_ERF_SMALL 0.875f
#define COLIBRI_ERF_S0 0.128379151f
#define COLIBRI_ERF_S1 (-0.376125574f)
#define COLIBRI_ERF_S2 0.112825252f
#define COLIBRI_ERF_S3 (-0.0267939754f)
#define COLIBRI_ERF_S4 0.00503589865f
#define COLIBRI_ERF_S5 (-0.000622254738f)
/* below ERF_ONE 1 - exp(-x^2) R(t), t = 1 / (1 + ERF_T |x|), R = R0 + R1 t + ... + R7 t^7 */
#define COLIBRI_ERF_ONE 4.0f
#define COLIBRI_ERF_T 0.5f
#define COLIBRI_ERF_R0 (-0.00015567732f)
#define COLIBRI_ERF_R1 0.284934789f
#define COLIBRI_ERF_R2 0.259548396f
#define COLIBRI_ERF_R3 0.34827745f
#define COLIBRI_ERF_R4 (-0.104563706f)
#define COLIBRI_ERF_R5 0.564393222f
#define COLIBRI_ERF_R6 (-0.47192499f)
#define COLIBRI_ERF_R7 0.119545832f
/* colibri_tanhf: below TANH_SMALL x + x (s Q(s)), s = x^2, Q = Q0 + Q1 s + ... + Q4 s^4 */
#define COLIBRI_TANH_SMALL 0.625f
#define COLIBRI_TANH_Q0 (-0.333333284f)
#define COLIBRI_TANH_Q1 0.133327946f
#define COLIBRI_TANH_Q2 (-0.0538541153f)
#define COLIBRI_TANH_Q3 0.0210102368f
#define COLIBRI_TANH_Q4 (-0.00611336716f)
/* the GELUs: 1 / sqrt 2, sqrt(2 / pi), the cubic's coefficient, -0 below ZERO_BELOW */
#define COLIBRI_GELU_INV_SQRT2 0.70710678f
#define COLIBRI_GELU_TANH_K 0.7978845608f
#define COLIBRI_GELU_TANH_C 0.044715f
#define COLIBRI_GELU_ZERO_BELOW (-11.0f)

/** @brief erf(x) in fp32 from + - * / and colibri_expf (see the file comment). */
static inline float colibri_erff(float x)
{
    const float a = x < 0.0f ? -x : x;
    if (a < COLIBRI_ERF_SMALL) {
        const float s = x * x;
        float p = COLIBRI_ERF_S5;
        p = p * s + COLIBRI_ERF_S4;
        p = p * s + COLIBRI_ERF_S3;
        p = p * s + COLIBRI_ERF_S2;
        p = p * s + COLIBRI_ERF_S1;
        p = p * s + COLIBRI_ERF_S0;
        return x + x * p;
    }
    if (a < COLIBRI_ERF_ONE) {
        const float t = 1.0f / (1.0f + COLIBRI_ERF_T * a);
        float r = COLIBRI_ERF_R7;
        r = r * t + COLIBRI_ERF_R6;
        r = r * t + COLIBRI_ERF_R5;
        r = r * t + COLIBRI_ERF_R4;
        r = r * t + COLIBRI_ERF_R3;
        r = r * t + COLIBRI_ERF_R2;
        r = r * t + COLIBRI_ERF_R1;
        r = r * t + COLIBRI_ERF_R0;
        const float e = 1.0f - colibri_expf(-(a * a)) * r;
        return x < 0.0f ? -e : e;
    }
    if (a >= COLIBRI_ERF_ONE) {
        return x < 0.0f ? -1.0f : 1.0f;
    }
    return x + x; /* NaN */
}

/** @brief tanh(x) in fp32 from + - * / and colibri_expf (see the file comment). */
static inline float colibri_tanhf(float x)
{
    const float a = x < 0.0f ? -x : x;
    if (a < COLIBRI_TANH_SMALL) {
        const float s = x * x;
        float q = COLIBRI_TANH_Q4;
        q = q * s + COLIBRI_TANH_Q3;
        q = q * s + COLIBRI_TANH_Q2;
        q = q * s + COLIBRI_TANH_Q1;
        q = q * s + COLIBRI_TANH_Q0;
        const float w = x * (s * q);
        return w == 0.0f ? x : x + w; /* x + w would turn -0 into +0 */
    }
    const float r = 1.0f - 2.0f / (colibri_expf(a + a) + 1.0f);
    return x < 0.0f ? -r : r;
}

/** @brief Exact (erf) GELU 0.5 x (1 + erf(x / sqrt 2)), with colibri_erff. */
static inline float colibri_gelu(float x)
{
    if (x < COLIBRI_GELU_ZERO_BELOW) {
        return -0.0f;
    }
    return 0.5f * x * (1.0f + colibri_erff(x * COLIBRI_GELU_INV_SQRT2));
}

/** @brief tanh GELU 0.5 x (1 + tanh u), u = sqrt(2 / pi) (x + 0.044715 x^3), computed as
 *         x / (1 + exp(-2u)) with colibri_expf. */
static inline float colibri_gelu_tanh(float x)
{
    if (x < COLIBRI_GELU_ZERO_BELOW) {
        return -0.0f;
    }
    const float u = COLIBRI_GELU_TANH_K * (x + COLIBRI_GELU_TANH_C * x * x * x);
    return x / (1.0f + colibri_expf(-(u + u)));
}

#ifdef __cplusplus
}
#endif

#endif /* COLIBRI_MATH_H */
