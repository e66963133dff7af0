/**
 * @file tf_mat.c
 * @brief The generic matrix product of the decoder step (colibri_transformer.h): a stored
 *        matrix in any scheme (fp32, fp16, int8 per row or per block of 32, int4) against fp32
 *        or int8 activation rows, one token or many, and the SwiGLU built on it. What the
 *        model-file runtime (lm_step.c) runs; kept apart from tf_step.c because it references
 *        every kernel: a generated model runs its own colibri_tf_mat_rows_fn, and neither this
 *        file nor the kernels it alone calls end up in its image. No heap, no state.
 */
#include "colibri_math.h"
#include "colibri_quant.h"
#include "colibri_transformer.h"
#include "kernels_x86.h"

#include <stddef.h>
#include <stdint.h>

colibri_status colibri_tf_mat_rows(const colibri_tf_mat_t *m, int32_t act, const float *b,
                                   const float *x, const int8_t *xq, const float *sx, float *y,
                                   int32_t ldy, int32_t r0, int32_t r1, int32_t n_tok)
{
    const int32_t n_in = m->n_in;
    const int32_t cnt = r1 - r0;
    if (cnt <= 0 || n_tok <= 0) {
        return COLIBRI_OK;
    }
    const size_t ro = (size_t)r0;
    const size_t ni = (size_t)n_in;
    float *yo = y + ro;
#if defined(COLIBRI_X86_PACKED)
    if (m->packed != NULL && act == 1) { /* r0: a multiple of 32 (the caller's split) */
        const float *rs = (m->pack_kind == COLIBRI_X86_PACK_Q8) ? m->scale + ro : NULL;
        colibri_x86_matmul_packed(m->pack_kind, m->packed, rs, m->n_out, n_in, r0, r1, xq, sx, yo,
                                  ldy, n_tok);
        goto bias;
    }
#endif
    switch (m->scheme) {
    case COLIBRI_QUANT_F32: {
        const float *w = (const float *)m->w + ro * ni;
        for (int32_t t = 0; t < n_tok; t++) {
            colibri_linear_f32(x + (size_t)t * ni, w, b != NULL ? b + ro : NULL,
                               yo + (size_t)t * (size_t)ldy, n_in, cnt);
        }
        return COLIBRI_OK;
    }
    case COLIBRI_QUANT_F16: {
        const uint16_t *w = (const uint16_t *)m->w + ro * ni;
        if (n_tok == 1) {
            colibri_matvec_f16_f32(w, x, yo, cnt, n_in);
        } else {
            colibri_matmul_f16_f32(w, x, yo, ldy, cnt, n_in, n_tok);
        }
        break;
    }
    case COLIBRI_QUANT_Q8: {
        const int8_t *w = (const int8_t *)m->w + ro * ni;
        if (m->blocked) {
            const float *sc = m->scale + ro * COLIBRI_Q8_BLOCKS(n_in);
            if (act == 1 && n_tok == 1) {
                colibri_matvec_q8b_q8(w, sc, xq, sx, yo, cnt, n_in);
            } else if (act == 1) {
                colibri_matmul_q8b_q8(w, sc, xq, sx, yo, ldy, cnt, n_in, n_tok);
            } else if (n_tok == 1) {
                colibri_matvec_q8b_f32(w, sc, x, yo, cnt, n_in);
            } else {
                colibri_matmul_q8b_f32(w, sc, x, yo, ldy, cnt, n_in, n_tok);
            }
        } else {
            const float *sc = m->scale + ro;
            if (act == 1 && n_tok == 1) {
                colibri_matvec_q8_q8(w, sc, xq, sx, yo, cnt, n_in);
            } else if (act == 1) {
                colibri_matmul_q8_q8(w, sc, xq, sx, yo, ldy, cnt, n_in, n_tok);
            } else if (n_tok == 1) {
                colibri_matvec_q8_f32(w, sc, x, yo, cnt, n_in);
            } else {
                colibri_matmul_q8_f32(w, sc, x, yo, ldy, cnt, n_in, n_tok);
            }
        }
        break;
    }
    case COLIBRI_QUANT_Q4: {
        const colibri_block_q4_32 *w =
            (const colibri_block_q4_32 *)m->w + ro * COLIBRI_Q4_BLOCKS(n_in);
        if (act == 1 && n_tok == 1) {
            colibri_matvec_q4_q8(w, xq, sx, yo, cnt, n_in);
        } else if (act == 1) {
            colibri_matmul_q4_q8(w, xq, sx, yo, ldy, cnt, n_in, n_tok);
        } else if (n_tok == 1) {
            colibri_matvec_q4_f32(w, x, yo, cnt, n_in);
        } else {
            colibri_matmul_q4_f32(w, x, yo, ldy, cnt, n_in, n_tok);
        }
        break;
    }
    case COLIBRI_QUANT_Q4K: { /* int8 activations only (the loader refuses act 0) */
        const uint8_t *w = (const uint8_t *)m->w + COLIBRI_Q4K_BYTES(ro, n_in);
        if (act != 1 || ro % COLIBRI_KQ_GROUP_ROWS(n_in) != 0u) { /* r0 must start a super-block */
            return COLIBRI_ERR_UNSUPPORTED;
        }
        if (n_tok == 1) {
            colibri_matvec_q4k_q8(w, xq, sx, yo, cnt, n_in);
        } else {
            colibri_matmul_q4k_q8(w, xq, sx, yo, ldy, cnt, n_in, n_tok);
        }
        break;
    }
    case COLIBRI_QUANT_Q5K: { /* int8 activations only (the loader refuses act 0) */
        const uint8_t *w = (const uint8_t *)m->w + COLIBRI_Q5K_BYTES(ro, n_in);
        if (act != 1 || ro % COLIBRI_KQ_GROUP_ROWS(n_in) != 0u) { /* r0 must start a super-block */
            return COLIBRI_ERR_UNSUPPORTED;
        }
        if (n_tok == 1) {
            colibri_matvec_q5k_q8(w, xq, sx, yo, cnt, n_in);
        } else {
            colibri_matmul_q5k_q8(w, xq, sx, yo, ldy, cnt, n_in, n_tok);
        }
        break;
    }
    default:
        return COLIBRI_ERR_UNSUPPORTED;
    }
#if defined(COLIBRI_X86_DISPATCH)
bias:
#endif
    if (b != NULL) {
        for (int32_t t = 0; t < n_tok; t++) {
            float *yt = y + (size_t)t * (size_t)ldy;
            for (int32_t o = r0; o < r1; ++o) {
                yt[o] += b[o];
            }
        }
    }
    return COLIBRI_OK;
}

colibri_status colibri_tf_swiglu_rows(const colibri_tf_mat_t *w, int32_t act, const float *x,
                                      float *y, int32_t n, float *hh, int8_t *xq, float *sx)
{
    const int32_t d = w[0].n_in;
    const int32_t f = w[0].n_out;
    float *g = hh + (size_t)n * (size_t)f;
    if (act == 1) {
        colibri_tf_quantize_rows(x, xq, sx, d, n);
    }
    colibri_status st = colibri_tf_mat_rows(&w[0], act, NULL, x, xq, sx, hh, f, 0, f, n);
    if (st == COLIBRI_OK) {
        st = colibri_tf_mat_rows(&w[2], act, NULL, x, xq, sx, g, f, 0, f, n);
    }
    if (st != COLIBRI_OK) {
        return st;
    }
    colibri_silu_mul_f32(hh, g, (size_t)n * (size_t)f);
    if (act == 1) {
        colibri_tf_quantize_rows(hh, xq, sx, f, n);
    }
    return colibri_tf_mat_rows(&w[1], act, NULL, hh, xq, sx, y, d, 0, d, n);
}
