/**
 * @file tf_step.c
 * @brief The token step of a whole decoder-only transformer (colibri_transformer.h), the one
 *        implementation both the generated model (templates/transformer/transformer_model.c.j2:
 *        const tables, per-expert kernels, glue) and the model-file runtime (lm_step.c: the
 *        mmapped container, threads, expert cache) run: embedding, RMSNorm, attention with
 *        QK-norm / clipping / RoPE / the KV cache, the feed-forward residual with the gated
 *        shared expert, final norm and LM head; matrices in any scheme. No heap, no state.
 */
#include "colibri_math.h"
#include "colibri_quant.h"
#include "colibri_transformer.h"
#include "kernels_x86.h"

#include <stddef.h>
#include <stdint.h>

void colibri_tf_mat_rows(const colibri_tf_mat_t *m, int32_t act, const float *b, const float *x,
                         const int8_t *xq, const float *sx, float *y, int32_t ldy, int32_t r0,
                         int32_t r1, int32_t n_tok)
{
    const int32_t n_in = m->n_in;
    const int32_t cnt = r1 - r0;
    if (cnt <= 0 || n_tok <= 0) {
        return;
    }
    const size_t ro = (size_t)r0;
    const size_t ni = (size_t)n_in;
    float *yo = y + ro;
#if defined(COLIBRI_X86_DISPATCH)
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
        return;
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
    default: {
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
}

void colibri_tf_quantize_rows(const float *x, int8_t *xq, float *sx, int32_t n_in, int32_t n)
{
    for (int32_t t = 0; t < n; t++) {
        colibri_quantize_row_q8(x + (size_t)t * (size_t)n_in, xq + (size_t)t * (size_t)n_in,
                                sx + (size_t)t * COLIBRI_Q8_BLOCKS(n_in), n_in);
    }
}

void colibri_tf_swiglu_rows(const colibri_tf_mat_t *w, int32_t act, const float *x, float *y,
                            int32_t n, float *hh, int8_t *xq, float *sx)
{
    const int32_t d = w[0].n_in;
    const int32_t f = w[0].n_out;
    float *g = hh + (size_t)n * (size_t)f;
    if (act == 1) {
        colibri_tf_quantize_rows(x, xq, sx, d, n);
    }
    colibri_tf_mat_rows(&w[0], act, NULL, x, xq, sx, hh, f, 0, f, n);
    colibri_tf_mat_rows(&w[2], act, NULL, x, xq, sx, g, f, 0, f, n);
    colibri_silu_mul_f32(hh, g, (size_t)n * (size_t)f);
    if (act == 1) {
        colibri_tf_quantize_rows(hh, xq, sx, f, n);
    }
    colibri_tf_mat_rows(&w[1], act, NULL, hh, xq, sx, y, d, 0, d, n);
}

void colibri_tf_lin_run(const colibri_tf_lin_t *job)
{
    for (int32_t i = 0; i < job->n_mats; i++) {
        const colibri_tf_mat_t *w = job->m[i];
        colibri_tf_mat_rows(w, job->act, job->b[i], job->x, job->xq, job->sx, job->y[i], w->n_out,
                            0, w->n_out, job->n_tok);
    }
}

/* Up to three dense matrices (attention, LM head) on n rows of x: int8 activations (Q8 with
 * dense_act) quantised once for all of them, then the hook's split or the calling thread. */
static colibri_status tf_linear(const colibri_tf_model_t *m, int32_t n_mats,
                                const colibri_tf_mat_t *const *w, const float *const *b,
                                float *const *y, const float *x, int32_t n)
{
    colibri_tf_lin_t j = {.n_mats = n_mats, .n_tok = n, .x = x, .xq = m->xq, .sx = m->sxq};
    for (int32_t i = 0; i < n_mats; i++) {
        j.m[i] = w[i];
        j.b[i] = b[i];
        j.y[i] = y[i];
    }
    j.act = (w[0]->scheme == COLIBRI_QUANT_Q8 && m->dense_act == 1) ? 1 : 0;
    if (j.act == 1) {
        colibri_tf_quantize_rows(x, m->xq, m->sxq, w[0]->n_in, n);
    }
    if (m->hooks != NULL && m->hooks->linear != NULL) {
        return m->hooks->linear(m->ctx, &j);
    }
    colibri_tf_lin_run(&j);
    return COLIBRI_OK;
}

static const colibri_tf_layer_t *tf_layer(const colibri_tf_model_t *m, int32_t l)
{
    return (const colibri_tf_layer_t *)(const void *)((const unsigned char *)m->layers +
                                                      (size_t)l * m->layer_stride);
}

/* proj = o_proj(attention(h)) of n rows at positions pos0 .. pos0 + n - 1, one after the other
 * (each writes its K / V row and attends to the rows before it, as n token steps would). */
static colibri_status tf_attend(const colibri_tf_model_t *m, const colibri_tf_layer_t *ly,
                                int32_t l, int32_t pos0, int32_t n)
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
    colibri_status st = tf_linear(m, 3, w, b, y, m->h, n);
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
    return tf_linear(m, 1, wo, bo, yo, m->att, n);
}

colibri_status colibri_tf_attention(const colibri_tf_model_t *m, int32_t l, int32_t pos0, int32_t n)
{
    const int32_t d = m->d_model;
    const size_t nd = (size_t)n * (size_t)d;
    const colibri_tf_layer_t *ly = tf_layer(m, l);
    float *x = m->x;
    for (int32_t t = 0; t < n; t++) {
        const size_t r = (size_t)t * (size_t)d;
        colibri_rmsnorm_f32(x + r, ly->input_norm, m->h + r, d, m->eps);
    }
    const colibri_status st = tf_attend(m, ly, l, pos0, n);
    if (st != COLIBRI_OK) {
        return st;
    }
    for (size_t i = 0; i < nd; ++i) {
        x[i] += m->proj[i];
    }
    for (int32_t t = 0; t < n; t++) {
        const size_t r = (size_t)t * (size_t)d;
        colibri_rmsnorm_f32(x + r, ly->post_norm, m->h + r, d, m->eps);
    }
    return COLIBRI_OK;
}

void colibri_tf_ffn_residual(const colibri_tf_model_t *m, int32_t l, int32_t n)
{
    const colibri_tf_layer_t *ly = tf_layer(m, l);
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
static void tf_embed(const colibri_tf_mat_t *em, int32_t token, int32_t d, float *x)
{
    if (em->scheme == COLIBRI_QUANT_Q8) {
        const int8_t *row = (const int8_t *)em->w + (size_t)token * (size_t)d;
        const float *rs = em->scale + (size_t)token * COLIBRI_Q8_BLOCKS(d);
        for (int32_t i = 0; i < d; ++i) {
            x[i] = (float)row[i] * rs[i / COLIBRI_QK8];
        }
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

colibri_status colibri_tf_embed(const colibri_tf_model_t *m, const int32_t *tokens, int32_t n,
                                int32_t pos0)
{
    if (pos0 < 0 || n > m->max_context - pos0) {
        return COLIBRI_ERR_NOMEM; /* context overflow: the KV cache has no row for pos */
    }
    for (int32_t t = 0; t < n; t++) {
        tf_embed(&m->embed, tokens[t], m->d_model, m->x + (size_t)t * (size_t)m->d_model);
    }
    return COLIBRI_OK;
}

colibri_status colibri_tf_logits(const colibri_tf_model_t *m, int32_t n, const float **logits)
{
    const int32_t d = m->d_model;
    colibri_rmsnorm_f32(m->x + (size_t)(n - 1) * (size_t)d, m->final_norm, m->h, d, m->eps);
    const colibri_tf_mat_t *w[1] = {&m->lm_head};
    const float *b[1] = {NULL};
    float *y[1] = {m->logits};
    const colibri_status st = tf_linear(m, 1, w, b, y, m->h, 1);
    if (st != COLIBRI_OK) {
        return st;
    }
    *logits = m->logits;
    return COLIBRI_OK;
}
