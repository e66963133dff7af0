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
 * - colibri_gelu: x Phi(x) with q = Phi(-|x|) = erfc(|x| / sqrt 2) / 2 from a table: for
 *   |x| < 6, k = (int)(8 |x|), u = 8 |x| - k, q = a quartic in u with piece k's coefficients
 *   (48 pieces, fitted for relative error on float64 Phi); the result x - x q for x > 0, x q
 *   otherwise, so both tails keep their relative accuracy. x itself from 6 on (q < 1e-9), -0
 *   below -6 (|GELU| < 6e-9). No erf, exp or division: the same operations on the lanes
 *   (Helium gathers the table's columns) as in the scalar loops.
 * - colibri_gelu_tanh: x / (1 + exp(-2u)), u = sqrt(2 / pi) (x + 0.044715 x^3): the tanh form
 *   0.5 x (1 + tanh u) rewritten as a sigmoid, which keeps its relative accuracy for negative x
 *   where 1 + tanh u cancels.
 * The tanh GELU returns -0 below COLIBRI_GELU_ZERO_BELOW (-11), where the formula already gives
 * -0 for finite x; it makes GELU(-inf) = -0 instead of inf * 0 = NaN. NaN gives NaN everywhere.
 * Measured against float64 (math.erf, numpy.tanh, the float64 GELUs) on every float32 multiple
 * of 2^-15 in [-10, 10] plus 2 million random finite bit patterns (tests/reference/
 * test_f32_ops.py repeats it): erf at most 1.41 ulp (8.4e-8 absolute), tanh at most 1.22 ulp
 * (7.25e-8); gelu at most 2.38e-7 absolute on [-10, 10] (6.62e-8 * max(|x|, 1)), 1.66 ulp for
 * x >= -1, relative 1.67e-7 for x >= -3, 1.38e-6 for x >= -5, 3.21e-6 down to -5.9 (the erf
 * form it replaced: 4.47e-7, 1.02e-7, 2.64 ulp, 2.47e-7 / 1.1e-5 / 4.8e-2 / 1); gelu_tanh at
 * most 5.16e-7 (1.17e-7 * max(|x|, 1)), 2.33 ulp for x >= -1. +-inf give
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
/* the tanh GELU: sqrt(2 / pi), the cubic's coefficient, -0 below ZERO_BELOW */
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

/* colibri_gelu: x Phi(x) = x (1 - q) for x > 0, x q otherwise, q = Phi(-|x|) = erfc(|x| /
 * sqrt 2) / 2 below GELU_RANGE from a table of COLIBRI_GELU_PIECES quartics: with t = |x| *
 * GELU_INV_STEP, k = (int)t and u = t - k (both exact), q = Q[0][k] + Q[1][k] u + ... + Q[4][k]
 * u^4, fitted to float64 Phi for relative error by scripts/gelu_table.py (coefficient-major:
 * Helium gathers a column) */
#define COLIBRI_GELU_RANGE 6.0f
#define COLIBRI_GELU_INV_STEP 8.0f
#define COLIBRI_GELU_PIECES 48
/* each column then a 49th piece of zeros: q = 0 where Helium's lanes clamp t to 48 */
#define COLIBRI_GELU_STRIDE (COLIBRI_GELU_PIECES + 1)
/* clang-format off */
static const float colibri_gelu_q[5][COLIBRI_GELU_STRIDE] = {
    {
        0.5f, 0.450261772f, 0.401293665f, 0.353830218f, 0.308537543f, 0.265985519f, 0.22662735f,
        0.190786958f, 0.158655256f, 0.130294517f, 0.105649777f, 0.0845657215f, 0.066807203f,
        0.0520812795f, 0.0400591567f, 0.0303963628f, 0.0227501318f, 0.0167933069f, 0.0122244731f,
        0.00877447519f, 0.00620966544f, 0.00433244836f, 0.00297976309f, 0.00202013738f,
        0.00134989794f, 0.000889025221f, 0.000577024999f, 0.000369078392f, 0.000232629041f,
        0.000144480699f, 8.84172623e-05f, 5.33123348e-05f, 3.16712285e-05f, 1.85367298e-05f,
        1.068852e-05f, 6.07162019e-06f, 3.39767053e-06f, 1.87299042e-06f, 1.01708224e-06f,
        5.44041654e-07f, 2.86651186e-07f, 1.48768649e-07f, 7.60494743e-08f, 3.82912653e-08f,
        1.89895211e-08f, 9.27537602e-09f, 4.46215997e-09f, 2.11421014e-09f, 0.0f
    },
    {
        -0.0498677529f, -0.049479682f, -0.0483334921f, -0.0464818701f, -0.0440081544f,
        -0.0410201177f, -0.0376421809f, -0.0340068862f, -0.0302463546f, -0.0264845993f,
        -0.022831155f, -0.0193765536f, -0.0161897168f, -0.0133172991f, -0.0107846772f,
        -0.00859829318f, -0.00674887653f, -0.00521512609f, -0.00396745699f, -0.00297148619f,
        -0.00219103484f, -0.0015905191f, -0.00113669143f, -0.000799761154f, -0.000553977443f,
        -0.000377779041f, -0.00025362827f, -0.000167637612f, -0.000109083543f, -6.98813092e-05f,
        -4.40734184e-05f, -2.73656915e-05f, -1.67282324e-05f, -1.0067175e-05f, -5.96456903e-06f,
        -3.47908008e-06f, -1.99785359e-06f, -1.12947544e-06f, -6.2864251e-07f, -3.44464581e-07f,
        -1.85822884e-07f, -9.86887514e-08f, -5.1600022e-08f, -2.65610893e-08f, -1.3460328e-08f,
        -6.71551259e-09f, -3.29849925e-09f, -1.59502445e-09f, 0.0f
    },
    {
        -2.40896611e-07f, 0.000386336178f, 0.000755020767f, 0.00108927593f, 0.0013751674f,
        0.00160231942f, 0.00176450447f, 0.00185982743f, 0.00189051114f, 0.00186233758f,
        0.001783835f, 0.00166532281f, 0.00151792518f, 0.00135265826f, 0.00117967033f,
        0.00100768299f, 0.000843654969f, 0.000692656729f, 0.000557927589f, 0.000441069511f,
        0.000342328713f, 0.000260918139f, 0.00019533989f, 0.000143678219f, 0.00010384382f,
        7.37610608e-05f, 5.14978965e-05f, 3.53443611e-05f, 2.3848761e-05f, 1.58222501e-05f,
        1.03220264e-05f, 6.62200864e-06f, 4.17804631e-06f, 2.59264561e-06f, 1.58243097e-06f,
        9.50038384e-07f, 5.61065292e-07f, 3.25957444e-07f, 1.86295097e-07f, 1.04749375e-07f,
        5.79463517e-08f, 3.15383843e-08f, 1.688902e-08f, 8.89883722e-09f, 4.61357086e-09f,
        2.35356734e-09f, 1.1814395e-09f, 5.83580573e-10f, 0.0f
    },
    {
        0.000130533357f, 0.000127464853f, 0.000118534947f, 0.000104428625f, 8.62045199e-05f,
        6.51843075e-05f, 4.28193161e-05f, 2.05520773e-05f, -3.11424401e-07f, -1.87035512e-05f,
        -3.38621066e-05f, -4.53585562e-05f, -5.30889702e-05f, -5.72338577e-05f, -5.81960921e-05f,
        -5.65276096e-05f, -5.28549317e-05f, -4.78121074e-05f, -4.19868957e-05f, -3.58831094e-05f,
        -2.99000621e-05f, -2.43263421e-05f, -1.93459218e-05f, -1.50521555e-05f, -1.14662553e-05f,
        -8.55697181e-06f, -6.25912571e-06f, -4.48939727e-06f, -3.15865373e-06f, -2.18068294e-06f,
        -1.47767389e-06f, -9.83024506e-07f, -6.42157488e-07f, -4.11994506e-07f, -2.596488e-07f,
        -1.60764799e-07f, -9.78055539e-08f, -5.84731481e-08f, -3.43571713e-08f, -1.98421848e-08f,
        -1.12645058e-08f, -6.28668051e-09f, -3.44945361e-09f, -1.86092675e-09f, -9.87157245e-10f,
        -5.14929099e-10f, -2.64141403e-10f, -1.33252645e-10f, 0.0f
    },
    {
        -7.61537592e-07f, -2.21821847e-06f, -3.50518417e-06f, -4.52966879e-06f, -5.22627306e-06f,
        -5.56260284e-06f, -5.54064218e-06f, -5.19401192e-06f, -4.5816746e-06f, -3.77929928e-06f,
        -2.86965451e-06f, -1.93335973e-06f, -1.04115145e-06f, -2.48435413e-07f, 4.0754918e-07f,
        9.08036384e-07f, 1.25093652e-06f, 1.44756814e-06f, 1.51863514e-06f, 1.49004075e-06f,
        1.38927192e-06f, 1.24234998e-06f, 1.07185019e-06f, 8.95780545e-07f, 7.27262545e-07f,
        5.74811509e-07f, 4.43006059e-07f, 3.3334706e-07f, 2.451483e-07f, 1.76346575e-07f,
        1.24167883e-07f, 8.56260201e-08f, 5.78586565e-08f, 3.83246892e-08f, 2.48939358e-08f,
        1.58617013e-08f, 9.91669769e-09f, 6.08487127e-09f, 3.66519171e-09f, 2.16763896e-09f,
        1.25891775e-09f, 7.1811801e-10f, 4.02386791e-10f, 2.21511753e-10f, 1.19813506e-10f,
        6.36820804e-11f, 3.32639367e-11f, 1.70771036e-11f, 0.0f
    },
};
/* clang-format on */

/* colibri_gelu's q for 0 <= a < COLIBRI_GELU_RANGE (by Horner from Q[4]) */
static inline float colibri_gelu_phi(float a)
{
    const float t = a * COLIBRI_GELU_INV_STEP;
    const int32_t k = (int32_t)t;
    const float u = t - (float)k;
    const float *c = &colibri_gelu_q[0][k];
    float q = c[4 * COLIBRI_GELU_STRIDE];
    q = q * u + c[3 * COLIBRI_GELU_STRIDE];
    q = q * u + c[2 * COLIBRI_GELU_STRIDE];
    q = q * u + c[COLIBRI_GELU_STRIDE];
    return q * u + c[0];
}

/** @brief Exact (erf) GELU x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)): x - x q for x > 0, x q
 *         below, q = Phi(-|x|) from a table of quartics (see above); x from GELU_RANGE on, -0
 *         below -GELU_RANGE (|GELU| < 6e-9 there), NaN stays NaN. */
static inline float colibri_gelu(float x)
{
    const float a = __builtin_fabsf(x); /* -0 and +0 give the same q */
    if (a < COLIBRI_GELU_RANGE) {
        const float m = x * colibri_gelu_phi(a);
        return x > 0.0f ? x - m : m;
    }
    if (x > 0.0f) {
        return x;
    }
    return x < 0.0f ? -0.0f : x + x; /* x + x: NaN */
}

#if defined(__ARM_FEATURE_MVE) && (__ARM_FEATURE_MVE & 2)
#include <arm_mve.h>
/* colibri_expf(x) on four Helium lanes when n = round(x / ln 2) is in -125..127 in every lane
 * (no special case of it applies): the same operations, so the same bits. The activation rows
 * below and the router's softmax (router.c) call it. */
static inline float32x4_t colibri_expf4_common(float32x4_t x)
{
    const float32x4_t t = vaddq_n_f32(vmulq_n_f32(x, COLIBRI_EXP_LOG2E), COLIBRI_EXP_ROUND);
    const float32x4_t n = vsubq_n_f32(t, COLIBRI_EXP_ROUND);
    const float32x4_t r = vsubq_f32(vsubq_f32(x, vmulq_n_f32(n, COLIBRI_EXP_LN2_HI)),
                                    vmulq_n_f32(n, COLIBRI_EXP_LN2_LO));
    const float32x4_t z = vmulq_f32(r, r);
    float32x4_t p = vaddq_n_f32(vmulq_n_f32(r, COLIBRI_EXP_P0), COLIBRI_EXP_P1);
    p = vaddq_n_f32(vmulq_f32(p, r), COLIBRI_EXP_P2);
    p = vaddq_n_f32(vmulq_f32(p, r), COLIBRI_EXP_P3);
    p = vaddq_n_f32(vmulq_f32(p, r), COLIBRI_EXP_P4);
    p = vaddq_n_f32(vmulq_f32(p, r), COLIBRI_EXP_P5);
    const float32x4_t y = vaddq_n_f32(vaddq_f32(vmulq_f32(p, z), r), 1.0f);
    const uint32x4_t bits = vaddq_n_u32((uint32x4_t)t, 127u - COLIBRI_EXP_ROUND_BITS);
    return vmulq_f32(y, (float32x4_t)vshlq_n_u32(bits, 23));
}
#endif

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

/*
 * The activations over a row (the expert kernels' hidden rows): the same bits as the scalar
 * functions above, element by element, but cheaper per element.
 * - Where the core has four fp32 lanes (SSE2, AArch64 Neon, Helium with floating point; GCC /
 *   clang vector extensions), colibri_expf runs on four lanes without its branches: the same
 *   IEEE operations in the same order, its three special cases (below COLIBRI_EXP_MIN, above
 *   COLIBRI_EXP_MAX, n = 128) taken as selects afterwards. The divisions stay IEEE divisions
 *   (Helium has no vector divide: four scalar VDIVs on the lanes). Helium's SiLU, SwiGLU and
 *   tanh GELU rows run only exp's common case on the lanes, its exact GELU row the table
 *   (gathered), and leave a group with an input out of range to the scalar function (below).
 *   SSE2 / Neon run the exact GELU's scalar loop (no gather).
 * - Elsewhere (Cortex-M3 / M4 / M7, Xtensa, Cortex-A7) one scalar loop whose common case runs
 *   no branch of colibri_expf: when n = round(x / ln 2) is in -125..127 (|x| below about 86.9)
 *   none of its special cases applies, which t's bits tell with one unsigned compare; any other
 *   x (NaN included) takes the scalar function. Same operations, so the same bits.
 * COLIBRI_ACT_ROW_SCALAR forces the scalar loops (to test them). The numpy mirror is
 * colibri/reference/f32.py's scalar-exact functions: nothing here changes a bit.
 */
#if defined(__GNUC__) && !defined(COLIBRI_ACT_ROW_SCALAR) &&                                       \
    (defined(__SSE2__) || defined(__aarch64__) ||                                                  \
     (defined(__ARM_FEATURE_MVE) && (__ARM_FEATURE_MVE & 2)))
#define COLIBRI_ACT_ROW_SIMD 1
typedef float colibri_v4f __attribute__((vector_size(16)));
typedef int32_t colibri_v4i __attribute__((vector_size(16)));
typedef uint32_t colibri_v4u __attribute__((vector_size(16)));

/* a < c, a > c, a >= c on four lanes against a constant: all ones where true (false for NaN).
 * On Helium through the ACLE compares (GCC 12 compiles some vector-extension float compares
 * there for the first lane only). */
#if defined(__ARM_FEATURE_MVE)
#include <arm_mve.h>
#define COLIBRI_V4_CMP(fn, a, c)                                                                   \
    ((colibri_v4i)vpselq_s32(vdupq_n_s32(-1), vdupq_n_s32(0), fn((float32x4_t)(a), (c))))
/* a < c as c > a: Helium's LT condition holds for unordered (NaN) lanes, GT and GE do not */
#define COLIBRI_V4_LT(a, c)                                                                        \
    ((colibri_v4i)vpselq_s32(vdupq_n_s32(-1), vdupq_n_s32(0),                                      \
                             vcmpgtq_f32(vdupq_n_f32(c), (float32x4_t)(a))))
#define COLIBRI_V4_GT(a, c) COLIBRI_V4_CMP(vcmpgtq_n_f32, a, c)
#define COLIBRI_V4_GE(a, c) COLIBRI_V4_CMP(vcmpgeq_n_f32, a, c)
#else
#define COLIBRI_V4_LT(a, c) ((a) < (c))
#define COLIBRI_V4_GT(a, c) ((a) > (c))
#define COLIBRI_V4_GE(a, c) ((a) >= (c))
#endif

/* Helium's vector floating point flushes subnormal inputs and results to zero (scalar VFP does
 * not): a group of four whose input or result has a lane under FLT_MIN in magnitude (zeros
 * included) is redone by the scalar function. Elsewhere nothing flushes. */
#if defined(__ARM_FEATURE_MVE)
static inline int colibri_v4_redo(colibri_v4f in, colibri_v4f out)
{
    const uint32x4_t min2 = vdupq_n_u32(0x01000000u); /* FLT_MIN's bits << 1 */
    const mve_pred16_t p = vcmphiq_u32(min2, vshlq_n_u32((uint32x4_t)in, 1)) |
                           vcmphiq_u32(min2, vshlq_n_u32((uint32x4_t)out, 1));
    return p != 0;
}
#else
#define colibri_v4_redo(in, out) 0
#endif

/** @brief Lanes of a where m is all ones, of b where it is zero. */
static inline colibri_v4f colibri_v4_select(colibri_v4i m, colibri_v4f a, colibri_v4f b)
{
    return (colibri_v4f)(((colibri_v4i)a & m) | ((colibri_v4i)b & ~m));
}

/** @brief colibri_expf on four lanes, branch-free: the same bits in every lane. */
static inline colibri_v4f colibri_expf4(colibri_v4f x)
{
    const colibri_v4f t = x * COLIBRI_EXP_LOG2E + COLIBRI_EXP_ROUND;
    const colibri_v4f n = t - COLIBRI_EXP_ROUND;
    const colibri_v4f r = (x - n * COLIBRI_EXP_LN2_HI) - n * COLIBRI_EXP_LN2_LO;
    const colibri_v4f z = r * r;
    colibri_v4f p = r * COLIBRI_EXP_P0 + COLIBRI_EXP_P1;
    p = p * r + COLIBRI_EXP_P2;
    p = p * r + COLIBRI_EXP_P3;
    p = p * r + COLIBRI_EXP_P4;
    p = p * r + COLIBRI_EXP_P5;
    const colibri_v4f y = (p * z + r) + 1.0f;
    const colibri_v4i top = COLIBRI_V4_GT(n, 127.0f); /* scale by 2^(n - 1), then by 2 */
    const colibri_v4u bits = ((colibri_v4u)t + (colibri_v4u)top + (127u - COLIBRI_EXP_ROUND_BITS))
                             << 23;
    const colibri_v4f e = y * (colibri_v4f)bits;
    colibri_v4f out = colibri_v4_select(top, e * 2.0f, e);
    out = (colibri_v4f)((colibri_v4i)out & ~COLIBRI_V4_LT(x, COLIBRI_EXP_MIN));
    const colibri_v4f inf = {INFINITY, INFINITY, INFINITY, INFINITY};
    return colibri_v4_select(COLIBRI_V4_GT(x, COLIBRI_EXP_MAX), inf, out);
}

#if defined(__ARM_FEATURE_MVE)
/* a / b lane by lane: Helium has no vector divide, but the lanes of q0 and q1 are the scalar
 * registers s0..s3 and s4..s7, which GCC 12 does not use (it moves every lane out and back) */
static inline colibri_v4f colibri_div4(colibri_v4f a, colibri_v4f b)
{
    register float32x4_t qa __asm__("q0") = (float32x4_t)a;
    register float32x4_t qb __asm__("q1") = (float32x4_t)b;
    __asm__("vdiv.f32 s0, s0, s4\n\tvdiv.f32 s1, s1, s5\n\t"
            "vdiv.f32 s2, s2, s6\n\tvdiv.f32 s3, s3, s7"
            : "+w"(qa)
            : "w"(qb));
    return (colibri_v4f)qa;
}
#else
#define colibri_div4(a, b) ((a) / (b))
#endif

/** @brief colibri_silu on four lanes. */
static inline colibri_v4f colibri_silu4(colibri_v4f v)
{
    return colibri_div4(v, 1.0f + colibri_expf4(-v));
}

/** @brief colibri_gelu_tanh on four lanes. */
static inline colibri_v4f colibri_gelu_tanh4(colibri_v4f x)
{
    const colibri_v4f u = COLIBRI_GELU_TANH_K * (x + COLIBRI_GELU_TANH_C * x * x * x);
    const colibri_v4f g = colibri_div4(x, 1.0f + colibri_expf4(-(u + u)));
    const colibri_v4f nz = {-0.0f, -0.0f, -0.0f, -0.0f};
    return colibri_v4_select(COLIBRI_V4_LT(x, COLIBRI_GELU_ZERO_BELOW), nz, g);
}

/* h[j] = F4(h[j]) four at a time, then the scalar F on the tail */
#define COLIBRI_ACT_ROW4(h, n, F4, F)                                                              \
    do {                                                                                           \
        const int32_t n4_ = (n) - ((n)&3);                                                         \
        for (int32_t j_ = 0; j_ < n4_; j_ += 4) {                                                  \
            colibri_v4f x_;                                                                        \
            memcpy(&x_, (h) + j_, sizeof x_);                                                      \
            const colibri_v4f v_ = F4(x_);                                                         \
            if (colibri_v4_redo(x_, v_)) {                                                         \
                for (int32_t i_ = 0; i_ < 4; i_++) {                                               \
                    (h)[j_ + i_] = F((h)[j_ + i_]);                                                \
                }                                                                                  \
            } else {                                                                               \
                memcpy((h) + j_, &v_, sizeof v_);                                                  \
            }                                                                                      \
        }                                                                                          \
        for (int32_t i_ = 0; i_ < ((n)&3); i_++) { /* the tail: at most three */                   \
            (h)[n4_ + i_] = F((h)[n4_ + i_]);                                                      \
        }                                                                                          \
    } while (0)

#if defined(__ARM_FEATURE_MVE)
/* Helium's rows: colibri_expf's common case on four lanes, and the row's loop as one inline
 * function (no select, no call in it, so GCC 12 keeps the constants in registers rather than
 * reload them for every group of four) that returns where a group needs the scalar function.
 * A group stays on the lanes when every x has 2^-100 <= |x| < COLIBRI_ROW_SILU_MAX (SiLU,
 * SwiGLU) or COLIBRI_ROW_GELU_MAX (tanh GELU): one unsigned compare of (x's bits << 1) - LO.
 * There exp's argument has n = round(arg / ln 2) in -124..110, so none of its special cases
 * applies (nor the tanh GELU's -0 below -11), and neither the input nor the result is
 * subnormal or zero (Helium would flush them): SiLU's result is at least min(|x| / 2,
 * 86 e^-86) in magnitude, the tanh GELU's min(|x| / 2, 9.5 e^-76.3). A subnormal intermediate
 * (x^3, r^2) is negligible beside what it is added to, as on the scalar path. SwiGLU's product
 * with the gate is checked too. Otherwise (NaN, inf, zero, huge or tiny x) the scalar function:
 * the same bits either way. */
#define COLIBRI_ROW_LO 0x1B000000u           /* 2^-100's bits << 1 */
#define COLIBRI_ROW_SILU_MAX 0x85580000u     /* 86.0f's bits << 1 */
#define COLIBRI_ROW_GELU_MAX 0x82300000u     /* 9.5f's bits << 1 */
#define COLIBRI_ROW_GELU_ERF_MAX 0xBF000000u /* 2^64's bits << 1 */
#define COLIBRI_ROW_NORMAL_MIN 0x01000000u   /* FLT_MIN's bits << 1 */

/* nonzero when a lane of x is outside 2^-100 <= |x| < the maximum (max: bits << 1) */
static inline mve_pred16_t colibri_v4_outside(float32x4_t x, uint32_t max)
{
    const uint32x4_t d = vsubq_n_u32(vshlq_n_u32((uint32x4_t)x, 1), COLIBRI_ROW_LO);
    return vcmpcsq_n_u32(d, max - COLIBRI_ROW_LO);
}

/* x / (1 + colibri_expf(-x)) on four lanes (in range) */
static inline float32x4_t colibri_silu4_common(float32x4_t x)
{
    const float32x4_t e = colibri_expf4_common(vnegq_f32(x));
    return (float32x4_t)colibri_div4((colibri_v4f)x, (colibri_v4f)vaddq_n_f32(e, 1.0f));
}

/* colibri_silu_row from j on (j, n4 multiples of four): returns n4, or the first j whose
 * group needs the scalar function */
static inline int32_t colibri_silu_run4(float *h, int32_t j, int32_t n4)
{
    float *p = h + j;
    for (float *const end = h + n4; p < end; p += 4) {
        const float32x4_t x = vld1q_f32(p);
        if (colibri_v4_outside(x, COLIBRI_ROW_SILU_MAX)) {
            break;
        }
        vst1q_f32(p, colibri_silu4_common(x));
    }
    return (int32_t)(p - h);
}

/* colibri_swiglu_row likewise (a subnormal gate gives a zero product: checked) */
static inline int32_t colibri_swiglu_run4(float *h, const float *g, int32_t j, int32_t n4)
{
    float *p = h + j;
    g += j;
    for (float *const end = h + n4; p < end; p += 4, g += 4) {
        const float32x4_t x = vld1q_f32(p);
        if (colibri_v4_outside(x, COLIBRI_ROW_SILU_MAX)) {
            break;
        }
        const float32x4_t v = vmulq_f32(colibri_silu4_common(x), vld1q_f32(g));
        /* a zero exponent field: zero or subnormal */
        if (vcmpeqq_n_u32(vshrq_n_u32(vshlq_n_u32((uint32x4_t)v, 1), 24), 0u)) {
            break;
        }
        vst1q_f32(p, v);
    }
    return (int32_t)(p - h);
}

/* colibri_gelu_tanh_row likewise */
static inline int32_t colibri_gelu_tanh_run4(float *h, int32_t j, int32_t n4)
{
    float *p = h + j;
    for (float *const end = h + n4; p < end; p += 4) {
        const float32x4_t x = vld1q_f32(p);
        if (colibri_v4_outside(x, COLIBRI_ROW_GELU_MAX)) {
            break;
        }
        const float32x4_t c = vmulq_f32(vmulq_f32(vmulq_n_f32(x, COLIBRI_GELU_TANH_C), x), x);
        const float32x4_t u = vmulq_n_f32(vaddq_f32(x, c), COLIBRI_GELU_TANH_K);
        const float32x4_t e = colibri_expf4_common(vnegq_f32(vaddq_f32(u, u)));
        vst1q_f32(p, (float32x4_t)colibri_div4((colibri_v4f)x, (colibri_v4f)vaddq_n_f32(e, 1.0f)));
    }
    return (int32_t)(p - h);
}

/* colibri_gelu_row likewise, for 2^-100 <= |x| < 2^64 (x + |x| cannot overflow): the table's
 * columns gathered at k lane by lane, t clamped to 48 (no change below COLIBRI_GELU_RANGE, where t
 * is at most 48 - 2^-18; from there on k = 48, the zero piece, so q = 0). The result is
 * -(|x q| - relu(x)), relu(x) = (x + |x|) / 2: x - x q for x > 0, x q for x < 0 (q > 0 and
 * x q is not zero there), x from RANGE on and -0 below -RANGE (q = 0), as the scalar function
 * gives. Nothing kept is subnormal: |x q| is at least min(|x| / 2, 6 q(6)) below RANGE, and
 * the Horner steps' products are above 2^-120 or zero. */
static inline int32_t colibri_gelu_run4(float *h, int32_t j, int32_t n4)
{
    float *p = h + j;
    for (float *const end = h + n4; p < end; p += 4) {
        const float32x4_t x = vld1q_f32(p);
        if (colibri_v4_outside(x, COLIBRI_ROW_GELU_ERF_MAX)) {
            break;
        }
        const float32x4_t a = vabsq_f32(x);
        const float32x4_t t8 = vmulq_n_f32(a, COLIBRI_GELU_INV_STEP);
        const float32x4_t t = vminnmq_f32(t8, vdupq_n_f32((float)COLIBRI_GELU_PIECES));
        const int32x4_t k = vcvtq_s32_f32(t); /* toward zero, as C's (int32_t) */
        const uint32x4_t o = (uint32x4_t)k;
        const float32x4_t u = vsubq_f32(t, vcvtq_f32_s32(k));
        float32x4_t q = vldrwq_gather_shifted_offset_f32(colibri_gelu_q[4], o);
        q = vaddq_f32(vmulq_f32(q, u), vldrwq_gather_shifted_offset_f32(colibri_gelu_q[3], o));
        q = vaddq_f32(vmulq_f32(q, u), vldrwq_gather_shifted_offset_f32(colibri_gelu_q[2], o));
        q = vaddq_f32(vmulq_f32(q, u), vldrwq_gather_shifted_offset_f32(colibri_gelu_q[1], o));
        q = vaddq_f32(vmulq_f32(q, u), vldrwq_gather_shifted_offset_f32(colibri_gelu_q[0], o));
        const float32x4_t relu = vmulq_n_f32(vaddq_f32(x, a), 0.5f);
        vst1q_f32(p, vnegq_f32(vsubq_f32(vabsq_f32(vmulq_f32(x, q)), relu)));
    }
    return (int32_t)(p - h);
}
#endif
#else
/* colibri_expf(x) when no special case of it applies (n in -125..127, read from t's bits with
 * one unsigned compare): sets *e and returns 1; otherwise returns 0 (the caller takes the
 * scalar function). The same operations as colibri_expf, so the same bits. c holds
 * COLIBRI_EXP_P3, P4, P5, 1.0f and the exponent bias 127 - COLIBRI_EXP_ROUND_BITS, which the
 * caller keeps in registers (COLIBRI_EXP_CONSTS). */
typedef struct {
    float p3, p4, p5, one;
    uint32_t bias;
} colibri_exp_consts;

/* GCC re-creates some constants of a loop's body in every iteration (a VLDR or VMOV each)
 * rather than keep them in registers; an empty asm that "changes" a copy makes it a value to
 * keep (ARM FPUs: "t" is a single-precision VFP register). */
#if defined(__GNUC__) && defined(__arm__) && defined(__ARM_FP) && (__ARM_FP & 4)
#define COLIBRI_IN_FREG(v) __asm__("" : "+t"(v))
#define COLIBRI_IN_REG(v) __asm__("" : "+r"(v))
#else
#define COLIBRI_IN_FREG(v) ((void)(v))
#define COLIBRI_IN_REG(v) ((void)(v))
#endif

/* colibri_exp_consts c, its members in registers */
#define COLIBRI_EXP_CONSTS(c)                                                                      \
    colibri_exp_consts c = {COLIBRI_EXP_P3, COLIBRI_EXP_P4, COLIBRI_EXP_P5, 1.0f,                  \
                            127u - COLIBRI_EXP_ROUND_BITS};                                        \
    COLIBRI_IN_FREG(c.p3);                                                                         \
    COLIBRI_IN_FREG(c.p4);                                                                         \
    COLIBRI_IN_FREG(c.p5);                                                                         \
    COLIBRI_IN_FREG(c.one);                                                                        \
    COLIBRI_IN_REG(c.bias)

static inline int colibri_expf_common(float x, float *e, const colibri_exp_consts *c)
{
    const float t = x * COLIBRI_EXP_LOG2E + COLIBRI_EXP_ROUND;
    uint32_t bits;
    memcpy(&bits, &t, sizeof bits);
    if (bits - (COLIBRI_EXP_ROUND_BITS - 125u) > 252u) {
        return 0;
    }
    const float n = t - COLIBRI_EXP_ROUND;
    const float r = (x - n * COLIBRI_EXP_LN2_HI) - n * COLIBRI_EXP_LN2_LO;
    const float z = r * r;
    float p = COLIBRI_EXP_P0;
    p = p * r + COLIBRI_EXP_P1;
    p = p * r + COLIBRI_EXP_P2;
    p = p * r + c->p3;
    p = p * r + c->p4;
    p = p * r + c->p5;
    const float y = (p * z + r) + c->one;
    bits = (bits + c->bias) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    *e = y * scale;
    return 1;
}

/* The rows' rare cases, out of line: a call in the loop keeps the common case's constants in
 * registers (GCC otherwise reloads them for the inlined rare case's sake). */
static __attribute__((noinline, unused)) float colibri_silu_rare(float v)
{
    return colibri_silu(v);
}

static __attribute__((noinline, unused)) float colibri_gelu_tanh_rare(float x)
{
    return colibri_gelu_tanh(x);
}
#endif

/* Helium's row loop: RUN4 (colibri_*_run4) takes the groups of four it can and returns where it
 * stopped; that group and the last n % 4 values take the scalar F. */
#define COLIBRI_ACT_RUN_ROW(h, n, RUN4, F)                                                         \
    do {                                                                                           \
        const int32_t n4_ = (n) - ((n)&3);                                                         \
        for (int32_t j_ = 0; (j_ = RUN4((h), j_, n4_)) < n4_; j_ += 4) {                           \
            for (int32_t i_ = 0; i_ < 4; i_++) {                                                   \
                (h)[j_ + i_] = F((h)[j_ + i_]);                                                    \
            }                                                                                      \
        }                                                                                          \
        for (int32_t i_ = 0; i_ < ((n)&3); i_++) { /* the tail: at most three */                   \
            (h)[n4_ + i_] = F((h)[n4_ + i_]);                                                      \
        }                                                                                          \
    } while (0)

/** @brief h[j] = colibri_silu(h[j]) for j < n (see above: the same bits, cheaper). */
static inline void colibri_silu_row(float *h, int32_t n)
{
#if defined(COLIBRI_ACT_ROW_SIMD) && defined(__ARM_FEATURE_MVE)
    COLIBRI_ACT_RUN_ROW(h, n, colibri_silu_run4, colibri_silu);
#elif defined(COLIBRI_ACT_ROW_SIMD)
    COLIBRI_ACT_ROW4(h, n, colibri_silu4, colibri_silu);
#else
    COLIBRI_EXP_CONSTS(c);
    for (int32_t j = 0; j < n; j++) {
        const float v = h[j];
        float e;
        h[j] = colibri_expf_common(-v, &e, &c) ? v / (c.one + e) : colibri_silu_rare(v);
    }
#endif
}

/** @brief h[j] = colibri_silu(h[j]) * g[j] for j < n: SwiGLU's gate (the same bits). */
static inline void colibri_swiglu_row(float *h, const float *g, int32_t n)
{
    int32_t j = 0;
#if defined(COLIBRI_ACT_ROW_SIMD) && defined(__ARM_FEATURE_MVE)
    const int32_t n4 = n - (n & 3);
    for (; (j = colibri_swiglu_run4(h, g, j, n4)) < n4; j += 4) {
        for (int32_t i = 0; i < 4; i++) {
            h[j + i] = colibri_silu(h[j + i]) * g[j + i];
        }
    }
    for (int32_t i = 0; i < (n & 3); i++) { /* the tail: at most three */
        h[n4 + i] = colibri_silu(h[n4 + i]) * g[n4 + i];
    }
#elif defined(COLIBRI_ACT_ROW_SIMD)
    const int32_t n4 = n - (n & 3);
    for (; j < n4; j += 4) {
        colibri_v4f x;
        colibri_v4f w;
        memcpy(&x, h + j, sizeof x);
        memcpy(&w, g + j, sizeof w);
        const colibri_v4f v = colibri_silu4(x) * w;
        if (colibri_v4_redo(x, v)) { /* a subnormal gate gives a zero v */
            for (int32_t i = 0; i < 4; i++) {
                h[j + i] = colibri_silu(h[j + i]) * g[j + i];
            }
        } else {
            memcpy(h + j, &v, sizeof v);
        }
    }
    for (int32_t i = 0; i < (n & 3); i++) { /* the tail: at most three */
        h[n4 + i] = colibri_silu(h[n4 + i]) * g[n4 + i];
    }
#else
    COLIBRI_EXP_CONSTS(c);
    for (; j < n; j++) {
        const float v = h[j];
        float e;
        h[j] = (colibri_expf_common(-v, &e, &c) ? v / (c.one + e) : colibri_silu_rare(v)) * g[j];
    }
#endif
}

/** @brief h[j] = colibri_gelu_tanh(h[j]) for j < n (the same bits). */
static inline void colibri_gelu_tanh_row(float *h, int32_t n)
{
#if defined(COLIBRI_ACT_ROW_SIMD) && defined(__ARM_FEATURE_MVE)
    COLIBRI_ACT_RUN_ROW(h, n, colibri_gelu_tanh_run4, colibri_gelu_tanh);
#elif defined(COLIBRI_ACT_ROW_SIMD)
    COLIBRI_ACT_ROW4(h, n, colibri_gelu_tanh4, colibri_gelu_tanh);
#else
    COLIBRI_EXP_CONSTS(c);
    for (int32_t j = 0; j < n; j++) {
        const float x = h[j];
        const float u = COLIBRI_GELU_TANH_K * (x + COLIBRI_GELU_TANH_C * x * x * x);
        float e;
        /* n in -125..127 means x is above -11 too (|u| >= 88 below it) */
        h[j] = colibri_expf_common(-(u + u), &e, &c) ? x / (c.one + e) : colibri_gelu_tanh_rare(x);
    }
#endif
}

/* colibri_gelu's rare cases (|x| >= COLIBRI_GELU_RANGE, NaN), out of line as above */
static __attribute__((noinline, unused)) float colibri_gelu_rare(float x)
{
    return colibri_gelu(x);
}

/** @brief h[j] = colibri_gelu(h[j]) for j < n (the same bits): on Helium four lanes, the
 *         table gathered (colibri_gelu_run4); elsewhere one scalar loop, its rare cases out of
 *         line. */
static inline void colibri_gelu_row(float *h, int32_t n)
{
#if defined(COLIBRI_ACT_ROW_SIMD) && defined(__ARM_FEATURE_MVE)
    COLIBRI_ACT_RUN_ROW(h, n, colibri_gelu_run4, colibri_gelu);
#else
    for (int32_t j = 0; j < n; j++) {
        const float x = h[j];
        const float a = __builtin_fabsf(x);
        if (a < COLIBRI_GELU_RANGE) {
            const float m = x * colibri_gelu_phi(a);
            h[j] = x > 0.0f ? x - m : m;
        } else {
            h[j] = colibri_gelu_rare(x);
        }
    }
#endif
}

#ifdef __cplusplus
}
#endif

#endif /* COLIBRI_MATH_H */
