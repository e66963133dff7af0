/**
 * @file colibri_tf_step.h
 * @brief The token step of a whole decoder-only transformer, as static inline functions: the
 *        one implementation both the generated model (templates/transformer/transformer_model.c.j2
 *        compiles them in, over its static const colibri_tf_model_t) and the library
 *        (tf_step.c: colibri_tf_embed / _attention / _ffn_residual / _logits, what the
 *        model-file runtime lm_step.c calls) run: embedding, RMSNorm, attention with QK-norm /
 *        clipping / RoPE / the KV cache, the feed-forward residual with the gated shared expert,
 *        final norm and LM head; every matrix product by the model's mat_rows. No heap, no
 *        state. Inline so that the generated model's compiler sees its constant view: it drops
 *        what the model does not have (clipping, QK-norm, the thread-pool hooks, other schemes'
 *        embedding rows, rows beyond one) and calls its mat_rows directly (issue 36: flash).
 *
 * Generated-code support (runtime_c/tiles), not public API: the contracts are those of the
 * colibri_tf_* functions in colibri_transformer.h.
 */
#ifndef COLIBRI_TF_STEP_H
#define COLIBRI_TF_STEP_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "colibri_math.h"
#include "colibri_quant.h"
#include "colibri_transformer.h"

/* colibri_tf_quantize_rows: n rows of n_in floats to int8 rows (codes stride n_in, scales
 * stride COLIBRI_Q8_BLOCKS(n_in)). */
static inline void colibri_tfi_quantize_rows(const float *x, int8_t *xq, float *sx, int32_t n_in,
                                             int32_t n)
{
    for (int32_t t = 0; t < n; t++) {
        colibri_quantize_row_q8(x + (size_t)t * (size_t)n_in, xq + (size_t)t * (size_t)n_in,
                                sx + (size_t)t * COLIBRI_Q8_BLOCKS(n_in), n_in);
    }
}

/* Up to three dense matrices (attention, LM head) on n rows of x: int8 activations (Q8, Q4,
 * Q4K or Q5K with m->quantize_rows) quantised once for all of them, then the hook's split or the
 * calling thread, each by m->mat_rows (never colibri_tf_mat_rows itself: a generated model links
 * only the kernels it calls). */
static inline colibri_status colibri_tfi_linear(const colibri_tf_model_t *m, int32_t n_mats,
                                                const colibri_tf_mat_t *const *w,
                                                const float *const *b, float *const *y,
                                                const float *x, int32_t n)
{
    colibri_tf_lin_t j = {
        .mat_rows = m->mat_rows, .n_mats = n_mats, .n_tok = n, .x = x, .xq = m->xq, .sx = m->sxq};
    for (int32_t i = 0; i < n_mats; i++) {
        j.m[i] = w[i];
        j.b[i] = b[i];
        j.y[i] = y[i];
    }
    j.act = (w[0]->scheme >= COLIBRI_QUANT_Q8 && m->quantize_rows != NULL) ? 1 : 0;
    if (j.act == 1) {
        m->quantize_rows(x, m->xq, m->sxq, w[0]->n_in, n);
    }
    if (m->hooks != NULL && m->hooks->linear != NULL) {
        return m->hooks->linear(m->ctx, &j);
    }
    colibri_status st = COLIBRI_OK;
    for (int32_t i = 0; i < n_mats && st == COLIBRI_OK; i++) {
        st = m->mat_rows(w[i], j.act, b[i], x, m->xq, m->sxq, y[i], w[i]->n_out, 0, w[i]->n_out, n);
    }
    return st;
}

static inline const colibri_tf_layer_t *colibri_tfi_layer(const colibri_tf_model_t *m, int32_t l)
{
    return (const colibri_tf_layer_t *)(const void *)((const unsigned char *)m->layers +
                                                      (size_t)l * m->layer_stride);
}

/* proj = o_proj(attention(h)) of n rows at positions pos0 .. pos0 + n - 1, one after the other
 * (each writes its K / V row and attends to the rows before it, as n token steps would). */
static inline colibri_status colibri_tfi_attend(const colibri_tf_model_t *m,
                                                const colibri_tf_layer_t *ly, int32_t l,
                                                int32_t pos0, int32_t n)
{
    const colibri_attention_shape_t shape = {
        .n_heads = m->n_heads,
        .n_kv_heads = m->n_kv_heads,
        .head_dim = m->head_dim,
        .max_context = m->max_context,
        .window = m->window,
    };
    const int32_t hq = m->n_heads * m->head_dim;
    const int32_t hkv = m->n_kv_heads * m->head_dim;
    const size_t kv_floats = (size_t)hkv * (size_t)m->max_context;
    float *kc = m->kv + (size_t)l * 2u * kv_floats;
    const colibri_tf_mat_t *w[3] = {&ly->wq, &ly->wk, &ly->wv};
    const float *b[3] = {ly->bq, ly->bk, ly->bv};
    float *y[3] = {m->q, m->k, m->v};
    colibri_status st = colibri_tfi_linear(m, 3, w, b, y, m->h, n);
    if (st != COLIBRI_OK) {
        return st;
    }
    const size_t half = (size_t)m->head_dim / 2u;
    for (int32_t t = 0; t < n; t++) {
        float *q = m->q + (size_t)t * (size_t)hq;
        float *k = m->k + (size_t)t * (size_t)hkv;
        float *v = m->v + (size_t)t * (size_t)hkv;
        if (ly->q_norm != NULL) {
            colibri_rmsnorm_f32(q, ly->q_norm, q, hq, m->eps);
            colibri_rmsnorm_f32(k, ly->k_norm, k, hkv, m->eps);
        }
        if (m->clip_on) {
            colibri_clip_f32(q, hq, m->clip);
            colibri_clip_f32(k, hkv, m->clip);
            colibri_clip_f32(v, hkv, m->clip);
        }
        const float *cs = m->rope_cos + (size_t)(pos0 + t) * half;
        const float *sn = m->rope_sin + (size_t)(pos0 + t) * half;
        colibri_rope_f32(q, m->n_heads, m->head_dim, cs, sn);
        colibri_rope_f32(k, m->n_kv_heads, m->head_dim, cs, sn);
    }
    if (m->hooks != NULL && m->hooks->attend != NULL) {
        st = m->hooks->attend(m->ctx, &shape, kc, kc + kv_floats, pos0, n);
    } else {
        for (int32_t t = 0; t < n && st == COLIBRI_OK; t++) {
            st = colibri_attention_f32(&shape, pos0 + t, m->q + (size_t)t * (size_t)hq,
                                       m->k + (size_t)t * (size_t)hkv,
                                       m->v + (size_t)t * (size_t)hkv, kc, kc + kv_floats,
                                       m->scores, m->att + (size_t)t * (size_t)hq);
        }
    }
    if (st != COLIBRI_OK) {
        return st;
    }
    const colibri_tf_mat_t *wo[1] = {&ly->wo};
    const float *bo[1] = {ly->bo};
    float *yo[1] = {m->proj};
    return colibri_tfi_linear(m, 1, wo, bo, yo, m->att, n);
}

static inline colibri_status colibri_tfi_attention(const colibri_tf_model_t *m, int32_t l,
                                                   int32_t pos0, int32_t n)
{
    const int32_t d = m->d_model;
    const size_t nd = (size_t)n * (size_t)d;
    const colibri_tf_layer_t *ly = colibri_tfi_layer(m, l);
    float *x = m->x;
    colibri_rmsnorm_rows_f32(x, ly->input_norm, m->h, n, d, (size_t)d, m->eps);
    const colibri_status st = colibri_tfi_attend(m, ly, l, pos0, n);
    if (st != COLIBRI_OK) {
        return st;
    }
    for (size_t i = 0; i < nd; ++i) {
        x[i] += m->proj[i];
    }
    colibri_rmsnorm_rows_f32(x, ly->post_norm, m->h, n, d, (size_t)d, m->eps);
    return COLIBRI_OK;
}

static inline void colibri_tfi_ffn_residual(const colibri_tf_model_t *m, int32_t l, int32_t n)
{
    const colibri_tf_layer_t *ly = colibri_tfi_layer(m, l);
    const int32_t d = m->d_model;
    float *x = m->x;
    const float *proj = m->proj;
    if (!ly->is_moe || ly->ffn_d_ff == 0) {
        const size_t nd = (size_t)n * (size_t)d;
        for (size_t i = 0; i < nd; ++i) {
            x[i] += proj[i];
        }
        return;
    }
    for (int32_t t = 0; t < n; t++) {
        const size_t r = (size_t)t * (size_t)d;
        float scale = 1.0f;
        if (ly->shared_gate != NULL) {
            float g = 0.0f;
            for (int32_t i = 0; i < d; ++i) {
                g += m->h[r + (size_t)i] * ly->shared_gate[i];
            }
            scale = 1.0f / (1.0f + colibri_expf(-g));
        }
        for (int32_t i = 0; i < d; ++i) {
            x[r + (size_t)i] += proj[r + (size_t)i] + scale * m->shared[r + (size_t)i];
        }
    }
}

/* Row `token` of the embedding, dequantised into x[d_model]. */
static inline void colibri_tfi_embed_row(const colibri_tf_mat_t *em, int32_t token, int32_t d,
                                         float *x)
{
    if (em->scheme == COLIBRI_QUANT_Q8) {
        const int8_t *row = (const int8_t *)em->w + (size_t)token * (size_t)d;
        const float *rs = em->scale + (size_t)token * COLIBRI_Q8_BLOCKS(d);
        for (int32_t i = 0; i < d; ++i) {
            x[i] = (float)row[i] * rs[i / COLIBRI_QK8];
        }
    } else if (em->scheme == COLIBRI_QUANT_Q4) {
        const colibri_block_q4_32 *row =
            (const colibri_block_q4_32 *)em->w + (size_t)token * COLIBRI_Q4_BLOCKS(d);
        for (int32_t i = 0; i < d; ++i) {
            const colibri_block_q4_32 *blk = &row[i / COLIBRI_QK4];
            const int32_t j = i % COLIBRI_QK4;
            const uint32_t nib = j < 16 ? (blk->qs[j] & 0x0Fu) : (uint32_t)(blk->qs[j - 16] >> 4);
            x[i] = (float)((int32_t)nib - 8) * colibri_f16_to_f32(blk->d);
        }
    } else if (em->scheme == COLIBRI_QUANT_Q4K) {
        colibri_dequantize_row_kq(em->w, token, d, 4, x);
    } else if (em->scheme == COLIBRI_QUANT_Q5K) {
        colibri_dequantize_row_kq(em->w, token, d, 5, x);
    } else if (em->scheme == COLIBRI_QUANT_F16) {
        const uint16_t *row = (const uint16_t *)em->w + (size_t)token * (size_t)d;
        for (int32_t i = 0; i < d; ++i) {
            x[i] = colibri_f16_to_f32(row[i]);
        }
    } else {
        const float *row = (const float *)em->w + (size_t)token * (size_t)d;
        for (int32_t i = 0; i < d; ++i) {
            x[i] = row[i];
        }
    }
}

static inline colibri_status colibri_tfi_embed(const colibri_tf_model_t *m, const int32_t *tokens,
                                               int32_t n, int32_t pos0)
{
    if (pos0 < 0 || n > m->max_context - pos0) {
        return COLIBRI_ERR_NOMEM; /* context overflow: the KV cache has no row for pos */
    }
    for (int32_t t = 0; t < n; t++) {
        colibri_tfi_embed_row(&m->embed, tokens[t], m->d_model,
                              m->x + (size_t)t * (size_t)m->d_model);
    }
    return COLIBRI_OK;
}

static inline colibri_status colibri_tfi_logits(const colibri_tf_model_t *m, int32_t n,
                                                const float **logits)
{
    const int32_t d = m->d_model;
    colibri_rmsnorm_f32(m->x + (size_t)(n - 1) * (size_t)d, m->final_norm, m->h, d, m->eps);
    const colibri_tf_mat_t *w[1] = {&m->lm_head};
    const float *b[1] = {NULL};
    float *y[1] = {m->logits};
    const colibri_status st = colibri_tfi_linear(m, 1, w, b, y, m->h, 1);
    if (st != COLIBRI_OK) {
        return st;
    }
    /* a NaN or Inf logit (fp32 overflowed on the way, or a NaN weight the load did not scan)
     * is an error, not an answer. Exponent bits + 2^23 carry into bit 31 only from an all-ones
     * exponent; four independent ORs (9 us for 32000 logits on the host, 0.3 % of a decode
     * step; a compare per logit took twice that) */
    uint32_t any[4] = {0u, 0u, 0u, 0u};
    const size_t vocab = (size_t)m->vocab;
    const size_t whole = vocab - vocab % 4u;
    for (size_t i = 0; i < whole; i += 4u) {
        uint32_t bits[4];
        memcpy(bits, &m->logits[i], sizeof bits);
        for (size_t j = 0; j < 4u; j++) {
            any[j] |= (bits[j] & 0x7f800000u) + 0x00800000u;
        }
    }
    for (size_t i = whole; i < vocab; i++) {
        uint32_t bits;
        memcpy(&bits, &m->logits[i], sizeof bits);
        any[0] |= (bits & 0x7f800000u) + 0x00800000u;
    }
    if (((any[0] | any[1] | any[2] | any[3]) & 0x80000000u) != 0u) {
        return COLIBRI_ERR_NAN;
    }
    *logits = m->logits;
    return COLIBRI_OK;
}

#endif /* COLIBRI_TF_STEP_H */
