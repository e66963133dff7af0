/**
 * @file kernels_scalar.h
 * @brief Internal: the scalar pieces that the optimised kernels (kernels_q.c, where the board has
 *        no faster path) and their portable twins (kernels_q_ref.c) share, written once so the
 *        two cannot drift: the fp16 conversion, one block of the int8 quantiser, an int4 weight.
 */
#ifndef COLIBRI_KERNELS_SCALAR_H
#define COLIBRI_KERNELS_SCALAR_H

#include "colibri_quant.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/** @brief fp16 bits to fp32, every pattern exact (an fp16 NaN keeps its payload and sign). */
static inline float colibri_f16_to_f32_scalar(uint16_t h)
{
    const uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    const uint32_t em = (uint32_t)h & 0x7FFFu; /* exponent and mantissa */
    uint32_t bits;
    float f;
    if (em >= 0x7C00u) {
        bits = sign | 0x7F800000u | ((em & 0x3FFu) << 13); /* inf / NaN */
        memcpy(&f, &bits, sizeof f);
        return f;
    }
    /* Shifted into fp32 position the value is h * 2^-112 (normal, or an fp32 subnormal for
     * an fp16 subnormal); multiplying by 2^112 is exact. */
    bits = em << 13;
    memcpy(&f, &bits, sizeof f);
    f *= 5.192296858534828e33f; /* 2^112 */
    memcpy(&bits, &f, sizeof f);
    bits |= sign;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/** @brief Weight j (0..31) of an int4 block, as a signed value -8..7. */
static inline int32_t colibri_q4_value(const colibri_block_q4_32 *blk, int32_t j)
{
    const uint8_t byte = blk->qs[j & 15];
    return (int32_t)((j < 16) ? (byte & 0x0Fu) : (byte >> 4)) - 8;
}

/** @brief One block of n <= COLIBRI_QK8 values: codes into xq, returns the block's scale. */
static inline float colibri_quantize_block_q8_scalar(const float *x, int8_t *xq, int32_t n)
{
    /* max |x| on the bits: for non-negative floats the integer order is the float order (a NaN
     * is above every number, so a block holding one quantises to zero below) */
    uint32_t abits = 0;
    for (int32_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, &x[i], sizeof b);
        b &= 0x7FFFFFFFu;
        abits = (b > abits) ? b : abits;
    }
    float amax;
    memcpy(&amax, &abits, sizeof amax);
    if (!(amax >= 0x1p-120f)) { /* all zero, NaN, or so small that 127 / amax would overflow */
        for (int32_t i = 0; i < n; i++) {
            xq[i] = 0;
        }
        return 0.0f;
    }
    /* One division per block. |v| <= 127 * (1 + 2^-23) < 127.5, so the clamp below changes no
     * rounded value; it also keeps the conversion defined when x holds an infinity. */
    const float inv = (float)COLIBRI_Q8_MAX / amax;
    for (int32_t i = 0; i < n; i++) {
        const float v = x[i] * inv;
        uint32_t vb;
        memcpy(&vb, &v, sizeof vb);
        const int32_t neg = -(int32_t)(vb >> 31); /* -1 when v's sign bit is set, else 0 */
        float a = fabsf(v);
        a = (a < (float)COLIBRI_Q8_MAX) ? a : (float)COLIBRI_Q8_MAX;
        /* round half away from zero in fixed point: a * 2^16 is exact and truncating it keeps
         * the bits that decide floor(a + 0.5) */
        const int32_t q = ((int32_t)(a * 65536.0f) + 32768) >> 16;
        xq[i] = (int8_t)((q ^ neg) - neg);
    }
    return amax / (float)COLIBRI_Q8_MAX;
}

#endif /* COLIBRI_KERNELS_SCALAR_H */
