/**
 * @file kernels_q.c
 * @brief Portable reference kernels of the quantised formats (colibri_quant.h): fp16 / int8 /
 *        int4 weights against fp32 or per-token int8 activations. The order of every float
 *        operation is the one documented in colibri_quant.h; codegen/quantize.py mirrors it.
 */
#include "colibri_quant.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

float colibri_f16_to_f32(uint16_t h)
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

void colibri_matvec_f16_f32(const uint16_t *w, const float *x, float *y, int32_t n_out,
                            int32_t n_in)
{
    for (int32_t o = 0; o < n_out; o++) {
        const uint16_t *row = w + (size_t)o * (size_t)n_in;
        float acc = 0.0f;
        for (int32_t i = 0; i < n_in; i++) {
            acc += colibri_f16_to_f32(row[i]) * x[i];
        }
        y[o] = acc;
    }
}

void colibri_matvec_q8_f32(const int8_t *q, const float *scale, const float *x, float *y,
                           int32_t n_out, int32_t n_in)
{
    for (int32_t o = 0; o < n_out; o++) {
        const int8_t *row = q + (size_t)o * (size_t)n_in;
        float acc = 0.0f;
        for (int32_t i = 0; i < n_in; i++) {
            acc += (float)row[i] * x[i];
        }
        y[o] = acc * scale[o];
    }
}

/* Weight j (0..31) of a block, as a signed value -8..7. */
static inline int32_t q4_value(const colibri_block_q4_32 *blk, int32_t j)
{
    const uint8_t byte = blk->qs[j & 15];
    return (int32_t)((j < 16) ? (byte & 0x0Fu) : (byte >> 4)) - 8;
}

/* sum_j (float)(q_j - 8) * x[j] over the first n weights of a block, j ascending. */
static inline float q4_block_dot_f32(const colibri_block_q4_32 *blk, const float *x, int32_t n)
{
    float bs = 0.0f;
    if (n == COLIBRI_QK4) {
        for (int32_t j = 0; j < 16; j++) {
            bs += (float)((int32_t)(blk->qs[j] & 0x0Fu) - 8) * x[j];
        }
        for (int32_t j = 0; j < 16; j++) {
            bs += (float)((int32_t)(blk->qs[j] >> 4) - 8) * x[j + 16];
        }
        return bs;
    }
    for (int32_t j = 0; j < n; j++) {
        bs += (float)q4_value(blk, j) * x[j];
    }
    return bs;
}

void colibri_matvec_q4_f32(const colibri_block_q4_32 *w, const float *x, float *y, int32_t n_out,
                           int32_t n_in)
{
    const size_t nb = COLIBRI_Q4_BLOCKS(n_in);
    for (int32_t o = 0; o < n_out; o++) {
        const colibri_block_q4_32 *row = w + (size_t)o * nb;
        float acc = 0.0f;
        for (size_t b = 0; b < nb; b++) {
            const int32_t i0 = (int32_t)(b * COLIBRI_QK4);
            const int32_t n = (n_in - i0 < COLIBRI_QK4) ? n_in - i0 : COLIBRI_QK4;
            acc += q4_block_dot_f32(&row[b], x + i0, n) * colibri_f16_to_f32(row[b].d);
        }
        y[o] = acc;
    }
}

float colibri_quantize_row_q8(const float *x, int8_t *xq, int32_t n)
{
    float amax = 0.0f;
    for (int32_t i = 0; i < n; i++) {
        const float a = fabsf(x[i]);
        amax = (a > amax) ? a : amax;
    }
    if (amax == 0.0f) {
        for (int32_t i = 0; i < n; i++) {
            xq[i] = 0;
        }
        return 0.0f;
    }
    const float sx = amax / (float)COLIBRI_Q8_MAX;
    for (int32_t i = 0; i < n; i++) {
        float v = roundf(x[i] / sx);
        v = (v > (float)COLIBRI_Q8_MAX) ? (float)COLIBRI_Q8_MAX : v;
        v = (v < -(float)COLIBRI_Q8_MAX) ? -(float)COLIBRI_Q8_MAX : v;
        xq[i] = (int8_t)v;
    }
    return sx;
}

int32_t colibri_dot_q8(const int8_t *a, const int8_t *b, int32_t n)
{
    int32_t acc = 0;
    for (int32_t i = 0; i < n; i++) {
        acc += (int32_t)a[i] * (int32_t)b[i];
    }
    return acc;
}

int32_t colibri_dot_q4_q8(const colibri_block_q4_32 *blk, const int8_t *xq, int32_t n)
{
    int32_t acc = 0;
    if (n == COLIBRI_QK4) { /* integer sums: any order gives the same result */
        for (int32_t j = 0; j < 16; j++) {
            const int32_t lo = (int32_t)(blk->qs[j] & 0x0Fu) - 8;
            const int32_t hi = (int32_t)(blk->qs[j] >> 4) - 8;
            acc += lo * (int32_t)xq[j] + hi * (int32_t)xq[j + 16];
        }
        return acc;
    }
    for (int32_t j = 0; j < n; j++) {
        acc += q4_value(blk, j) * (int32_t)xq[j];
    }
    return acc;
}

void colibri_matvec_q8_q8(const int8_t *q, const float *scale, const int8_t *xq, float sx, float *y,
                          int32_t n_out, int32_t n_in)
{
    for (int32_t o = 0; o < n_out; o++) {
        const int32_t isum = colibri_dot_q8(q + (size_t)o * (size_t)n_in, xq, n_in);
        y[o] = ((float)isum * scale[o]) * sx;
    }
}

void colibri_matvec_q4_q8(const colibri_block_q4_32 *w, const int8_t *xq, float sx, float *y,
                          int32_t n_out, int32_t n_in)
{
    const size_t nb = COLIBRI_Q4_BLOCKS(n_in);
    for (int32_t o = 0; o < n_out; o++) {
        const colibri_block_q4_32 *row = w + (size_t)o * nb;
        float acc = 0.0f;
        for (size_t b = 0; b < nb; b++) {
            const int32_t i0 = (int32_t)(b * COLIBRI_QK4);
            const int32_t n = (n_in - i0 < COLIBRI_QK4) ? n_in - i0 : COLIBRI_QK4;
            acc += (float)colibri_dot_q4_q8(&row[b], xq + i0, n) * colibri_f16_to_f32(row[b].d);
        }
        y[o] = acc * sx;
    }
}
