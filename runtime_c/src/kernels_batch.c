/**
 * @file kernels_batch.c
 * @brief Portable multi-token kernels (colibri_quant.h colibri_matmul_*): row t is the matvec
 *        of activation row t, so every row is bit-identical to colibri_matvec_* by construction.
 *        A placeholder for the SIMD versions (weights read once per batch) in kernels_q.c.
 */
#include "colibri_quant.h"

#include <stddef.h>
#include <stdint.h>

void colibri_matmul_q8_q8(const int8_t *q, const float *scale, const int8_t *xq, const float *sx,
                          float *y, int32_t ldy, int32_t n_out, int32_t n_in, int32_t n_tok)
{
    const size_t nb = COLIBRI_Q8_BLOCKS(n_in);
    for (int32_t t = 0; t < n_tok; t++) {
        colibri_matvec_q8_q8(q, scale, xq + (size_t)t * (size_t)n_in, sx + (size_t)t * nb,
                             y + (size_t)t * (size_t)ldy, n_out, n_in);
    }
}

void colibri_matmul_q8b_q8(const int8_t *q, const float *scale, const int8_t *xq, const float *sx,
                           float *y, int32_t ldy, int32_t n_out, int32_t n_in, int32_t n_tok)
{
    const size_t nb = COLIBRI_Q8_BLOCKS(n_in);
    for (int32_t t = 0; t < n_tok; t++) {
        colibri_matvec_q8b_q8(q, scale, xq + (size_t)t * (size_t)n_in, sx + (size_t)t * nb,
                              y + (size_t)t * (size_t)ldy, n_out, n_in);
    }
}

void colibri_matmul_q4_q8(const colibri_block_q4_32 *w, const int8_t *xq, const float *sx, float *y,
                          int32_t ldy, int32_t n_out, int32_t n_in, int32_t n_tok)
{
    const size_t nb = COLIBRI_Q8_BLOCKS(n_in);
    for (int32_t t = 0; t < n_tok; t++) {
        colibri_matvec_q4_q8(w, xq + (size_t)t * (size_t)n_in, sx + (size_t)t * nb,
                             y + (size_t)t * (size_t)ldy, n_out, n_in);
    }
}

void colibri_matmul_f16_f32(const uint16_t *w, const float *x, float *y, int32_t ldy, int32_t n_out,
                            int32_t n_in, int32_t n_tok)
{
    for (int32_t t = 0; t < n_tok; t++) {
        colibri_matvec_f16_f32(w, x + (size_t)t * (size_t)n_in, y + (size_t)t * (size_t)ldy, n_out,
                               n_in);
    }
}

void colibri_matmul_q8_f32(const int8_t *q, const float *scale, const float *x, float *y,
                           int32_t ldy, int32_t n_out, int32_t n_in, int32_t n_tok)
{
    for (int32_t t = 0; t < n_tok; t++) {
        colibri_matvec_q8_f32(q, scale, x + (size_t)t * (size_t)n_in, y + (size_t)t * (size_t)ldy,
                              n_out, n_in);
    }
}

void colibri_matmul_q4_f32(const colibri_block_q4_32 *w, const float *x, float *y, int32_t ldy,
                           int32_t n_out, int32_t n_in, int32_t n_tok)
{
    for (int32_t t = 0; t < n_tok; t++) {
        colibri_matvec_q4_f32(w, x + (size_t)t * (size_t)n_in, y + (size_t)t * (size_t)ldy, n_out,
                              n_in);
    }
}

void colibri_matmul_q8b_f32(const int8_t *q, const float *scale, const float *x, float *y,
                            int32_t ldy, int32_t n_out, int32_t n_in, int32_t n_tok)
{
    for (int32_t t = 0; t < n_tok; t++) {
        colibri_matvec_q8b_f32(q, scale, x + (size_t)t * (size_t)n_in, y + (size_t)t * (size_t)ldy,
                               n_out, n_in);
    }
}
