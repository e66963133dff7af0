/**
 * @file kernels_q_ref.c
 * @brief The portable twins (suffix _ref, as in ggml) of every kernel of kernels_q.c that has an
 *        optimised path on some board (Helium, Neon, SIMD32, MAC16, SSE2, or an x86-64 level of
 *        runtime_c/arch/x86_64): plain C loops in the order colibri_quant.h documents, no ISA
 *        conditionals, so each is what the optimised kernel must return bit for bit (integer
 *        sums are order-free; the float steps are the same operations in the same order).
 *        tests/platform/refkernels.c compares the two on every board and every kernel level.
 *        Nothing in the runtime calls these: a static library links them only into programs
 *        that do.
 */
#include "colibri_math.h"
#include "colibri_quant.h"
#include "kernels_scalar.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>

float colibri_f16_to_f32_ref(uint16_t h)
{
    return colibri_f16_to_f32_scalar(h);
}

void colibri_quantize_row_q8_ref(const float *x, int8_t *xq, float *sx, int32_t n)
{
    for (int32_t i0 = 0, b = 0; i0 < n; i0 += COLIBRI_QK8, b++) {
        const int32_t m = (n - i0 < COLIBRI_QK8) ? n - i0 : COLIBRI_QK8;
        sx[b] = colibri_quantize_block_q8_scalar(x + i0, xq + i0, m);
    }
}

int32_t colibri_dot_q8_ref(const int8_t *a, const int8_t *b, int32_t n)
{
    int32_t acc = 0;
    for (int32_t i = 0; i < n; i++) {
        acc += (int32_t)a[i] * (int32_t)b[i];
    }
    return acc;
}

int32_t colibri_dot_q4_q8_ref(const colibri_block_q4_32 *blk, const int8_t *xq, int32_t n)
{
    int32_t acc = 0;
    for (int32_t j = 0; j < n; j++) {
        acc += colibri_q4_value(blk, j) * (int32_t)xq[j];
    }
    return acc;
}

void colibri_matvec_f32_ref(const float *w, const float *x, float *y, int32_t n_out, int32_t n_in)
{
    for (int32_t o = 0; o < n_out; o++) {
        float acc = 0.0f;
        for (int32_t i = 0; i < n_in; i++) {
            acc += w[(size_t)o * (size_t)n_in + (size_t)i] * x[i];
        }
        y[o] = acc;
    }
}

void colibri_matvec_f16_f32_ref(const uint16_t *w, const float *x, float *y, int32_t n_out,
                                int32_t n_in)
{
    for (int32_t o = 0; o < n_out; o++) {
        float acc = 0.0f;
        for (int32_t i = 0; i < n_in; i++) {
            acc += colibri_f16_to_f32_scalar(w[(size_t)o * (size_t)n_in + (size_t)i]) * x[i];
        }
        y[o] = acc;
    }
}

/* int4 weights, per row: blocks in order (the last may be partial). x != NULL (fp32
 * activations): acc += (sum of the block's (q - 8) * x[i], i ascending) * d; else (int8
 * activations xq, block scales sx): acc += (float)(exact block sum) * (d * sx[b]). */
static void matvec_q4_ref(const colibri_block_q4_32 *w, const float *x, const int8_t *xq,
                          const float *sx, float *y, int32_t n_out, int32_t n_in)
{
    const int32_t nb = (int32_t)COLIBRI_Q4_BLOCKS(n_in);
    for (int32_t o = 0; o < n_out; o++) {
        float acc = 0.0f;
        for (int32_t b = 0; b < nb; b++) {
            const colibri_block_q4_32 *blk = w + (size_t)o * (size_t)nb + (size_t)b;
            const int32_t i0 = b * COLIBRI_QK4;
            const int32_t n = (n_in - i0 < COLIBRI_QK4) ? n_in - i0 : COLIBRI_QK4;
            const float d = colibri_f16_to_f32_scalar(blk->d);
            if (x != NULL) {
                float bs = 0.0f;
                for (int32_t j = 0; j < n; j++) {
                    bs += (float)colibri_q4_value(blk, j) * x[i0 + j];
                }
                acc += bs * d;
            } else {
                acc += (float)colibri_dot_q4_q8_ref(blk, xq + i0, n) * (d * sx[b]);
            }
        }
        y[o] = acc;
    }
}

void colibri_matvec_q4_f32_ref(const colibri_block_q4_32 *w, const float *x, float *y,
                               int32_t n_out, int32_t n_in)
{
    matvec_q4_ref(w, x, NULL, NULL, y, n_out, n_in);
}

/* int8 x int8, per row: blocks in order, acc += (float)(exact block sum) * (block scale); the
 * last block may be partial. blocked 0: block scale sx[b], y = acc * scale[o] (q8); 1: block scale
 * scale[o][b] * sx[b], y = acc (q8b). */
static void matvec_q8_ref(const int8_t *q, const float *scale, const int8_t *xq, const float *sx,
                          float *y, int32_t n_out, int32_t n_in, int blocked)
{
    const int32_t nb = (int32_t)COLIBRI_Q8_BLOCKS(n_in);
    for (int32_t o = 0; o < n_out; o++) {
        const int8_t *row = q + (size_t)o * (size_t)n_in;
        float acc = 0.0f;
        for (int32_t b = 0; b < nb; b++) {
            const int32_t i0 = b * COLIBRI_QK8;
            const int32_t n = (n_in - i0 < COLIBRI_QK8) ? n_in - i0 : COLIBRI_QK8;
            const float f = (float)colibri_dot_q8_ref(row + i0, xq + i0, n);
            acc += blocked ? f * (scale[(size_t)o * (size_t)nb + (size_t)b] * sx[b]) : f * sx[b];
        }
        y[o] = blocked ? acc : acc * scale[o];
    }
}

void colibri_matvec_q8_q8_ref(const int8_t *q, const float *scale, const int8_t *xq,
                              const float *sx, float *y, int32_t n_out, int32_t n_in)
{
    matvec_q8_ref(q, scale, xq, sx, y, n_out, n_in, 0);
}

void colibri_matvec_q8b_q8_ref(const int8_t *q, const float *scale, const int8_t *xq,
                               const float *sx, float *y, int32_t n_out, int32_t n_in)
{
    matvec_q8_ref(q, scale, xq, sx, y, n_out, n_in, 1);
}

void colibri_matvec_q4_q8_ref(const colibri_block_q4_32 *w, const int8_t *xq, const float *sx,
                              float *y, int32_t n_out, int32_t n_in)
{
    matvec_q4_ref(w, NULL, xq, sx, y, n_out, n_in);
}

/* The multi-token kernels: row t is the matvec of token t (colibri_quant.h). */
static void matmul_q8_ref(const int8_t *q, const float *scale, const int8_t *xq, const float *sx,
                          float *y, int32_t ldy, int32_t n_out, int32_t n_in, int32_t n_tok,
                          int blocked)
{
    const size_t nb = COLIBRI_Q8_BLOCKS(n_in);
    for (int32_t t = 0; t < n_tok; t++) {
        matvec_q8_ref(q, scale, xq + (size_t)t * (size_t)n_in, sx + (size_t)t * nb,
                      y + (size_t)t * (size_t)ldy, n_out, n_in, blocked);
    }
}

void colibri_matmul_q8_q8_ref(const int8_t *q, const float *scale, const int8_t *xq,
                              const float *sx, float *y, int32_t ldy, int32_t n_out, int32_t n_in,
                              int32_t n_tok)
{
    matmul_q8_ref(q, scale, xq, sx, y, ldy, n_out, n_in, n_tok, 0);
}

void colibri_matmul_q8b_q8_ref(const int8_t *q, const float *scale, const int8_t *xq,
                               const float *sx, float *y, int32_t ldy, int32_t n_out, int32_t n_in,
                               int32_t n_tok)
{
    matmul_q8_ref(q, scale, xq, sx, y, ldy, n_out, n_in, n_tok, 1);
}

void colibri_matmul_q4_q8_ref(const colibri_block_q4_32 *w, const int8_t *xq, const float *sx,
                              float *y, int32_t ldy, int32_t n_out, int32_t n_in, int32_t n_tok)
{
    const size_t nb = COLIBRI_Q4_BLOCKS(n_in);
    for (int32_t t = 0; t < n_tok; t++) {
        colibri_matvec_q4_q8_ref(w, xq + (size_t)t * (size_t)n_in, sx + (size_t)t * nb,
                                 y + (size_t)t * (size_t)ldy, n_out, n_in);
    }
}

void colibri_silu_mul_f32_ref(float *h, const float *g, size_t n)
{
    for (size_t j = 0; j < n; j++) {
        h[j] = colibri_silu(h[j]) * g[j];
    }
}

void colibri_exp_shift_f32_ref(float *x, size_t n, float m)
{
    for (size_t j = 0; j < n; j++) {
        x[j] = colibri_expf(x[j] - m);
    }
}

void colibri_axpy_f32_ref(float *y, float a, const float *x, int32_t n)
{
    for (int32_t i = 0; i < n; i++) {
        y[i] += a * x[i];
    }
}

void colibri_wsum_f32_ref(float *out, const float *w, float sum, const float *v, size_t stride,
                          int32_t n, int32_t d)
{
    for (int32_t i = 0; i < d; i++) {
        out[i] = 0.0f;
    }
    for (int32_t t = 0; t < n; t++) {
        colibri_axpy_f32_ref(out, w[t] / sum, v + (size_t)t * stride, d);
    }
}

int32_t colibri_argmax_f32_ref(const float *x, int32_t n)
{
    int32_t best = 0;
    for (int32_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) {
            return -1;
        }
        best = (x[i] > x[best]) ? i : best;
    }
    return best;
}
