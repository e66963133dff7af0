/**
 * @file lm_step.c
 * @brief The token step of a whole model (colibri_lm.h): transformer_model.c.j2,
 *        operation for operation (same kernels, same order), on n token rows, so its logits
 *        equal the generated C's bit for bit; colibri_lm_forward / _prefill.
 *        Compiled out with COLIBRI_NO_FILESYSTEM (MCUs run the generated C).
 */
#ifndef COLIBRI_NO_FILESYSTEM

#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* madvise (MADV_DONTNEED: glibc's posix_madvise ignores it) */

#include "lm_internal.h"

/* ------------------------------------------------------------------------------------------ */
/* The token step: transformer_model.c.j2, operation for operation, on n token rows           */

/* Below lm->par_min_work multiply-adds (LM_PAR_MIN_WORK; the environment variable
 * COLIBRI_LM_PAR_MIN_WORK, read by colibri_lm_init, replaces it: 0 splits every job, which the
 * tests use so that tiny models exercise every split) a job runs on the calling thread alone
 * (same bits: what a row computes never depends on the split). */
static colibri_status lm_run_sized(colibri_lm_t *lm, lm_job_fn fn, void *arg, uint64_t work)
{
    if (work < lm->par_min_work) {
        return fn(lm, arg, 0, 1);
    }
    return clb_lm_run(lm, fn, arg);
}

/* Rows [*r0, *r1) of n for thread tid of nt: contiguous ranges, a multiple of 32 rows each
 * (the last shorter), fixed by (n, tid, nt). */
static void lm_rows(int32_t n, int32_t tid, int32_t nt, int32_t *r0, int32_t *r1)
{
    int32_t per = (n + nt - 1) / nt;
    per = (per + 31) & ~31;
    const int64_t a = (int64_t)tid * per;
    *r0 = a < n ? (int32_t)a : n;
    *r1 = (int64_t)*r0 + per < (int64_t)n ? *r0 + per : n;
}

/* Rows [r0, r1) of y = W x (+ b) for n_tok activation rows of m->n_in values (x fp32; xq / sx
 * their int8 rows when act == 1), output row t at y + t * ldy. Each output is what the token
 * step's kernel (colibri_matvec_*, colibri_matmul_* row t, colibri_linear_f32) gives it, so
 * the result does not depend on the row split nor on n_tok. */
static void mat_rows(const lm_mat *m, int32_t act, const float *b, const float *x, const int8_t *xq,
                     const float *sx, float *y, int32_t ldy, int32_t r0, int32_t r1, int32_t n_tok)
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
    if (m->packed != NULL && act == 1) { /* r0: a multiple of 32 (lm_rows) */
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

/* Quantise n rows of n_in values (row stride n_in) to int8 rows (codes stride n_in, scales
 * stride COLIBRI_Q8_BLOCKS(n_in)). */
static void quantize_rows(const float *x, int8_t *xq, float *sx, int32_t n_in, int32_t n)
{
    for (int32_t t = 0; t < n; t++) {
        colibri_quantize_row_q8(x + (size_t)t * (size_t)n_in, xq + (size_t)t * (size_t)n_in,
                                sx + (size_t)t * COLIBRI_Q8_BLOCKS(n_in), n_in);
    }
}

/* Up to three matrices with the same input rows, each one's output rows split over the
 * threads. */
typedef struct {
    const lm_mat *m[3];
    const float *b[3];
    float *y[3];
    int32_t n_mats, act, n_tok;
    const float *x;
    const int8_t *xq;
    const float *sx;
} lm_lin_job;

static colibri_status job_lin(colibri_lm_t *lm, void *arg, int32_t tid, int32_t nt)
{
    (void)lm;
    const lm_lin_job *j = (const lm_lin_job *)arg;
    for (int32_t i = 0; i < j->n_mats; i++) {
        int32_t r0, r1;
        lm_rows(j->m[i]->n_out, tid, nt, &r0, &r1);
        mat_rows(j->m[i], j->act, j->b[i], j->x, j->xq, j->sx, j->y[i], j->m[i]->n_out, r0, r1,
                 j->n_tok);
    }
    return COLIBRI_OK;
}

static colibri_status lin_run(colibri_lm_t *lm, lm_lin_job *j)
{
    uint64_t work = 0;
    for (int32_t i = 0; i < j->n_mats; i++) {
        work += (uint64_t)j->m[i]->n_out * (uint64_t)j->m[i]->n_in * (uint64_t)j->n_tok;
    }
    return lm_run_sized(lm, job_lin, j, work);
}

/* The dense matrices (attention, LM head) on n rows of x: the generated <name>_linear, or
 * colibri_linear_f32 for fp32 models; int8 activations quantised once for all threads. */
static colibri_status lm_linear(colibri_lm_t *lm, int32_t n_mats, const lm_mat *const *m,
                                const float *const *b, float *const *y, const float *x,
                                int32_t n_tok)
{
    lm_lin_job j;
    memset(&j, 0, sizeof j);
    j.n_mats = n_mats;
    for (int32_t i = 0; i < n_mats; i++) {
        j.m[i] = m[i];
        j.b[i] = b[i];
        j.y[i] = y[i];
    }
    j.n_tok = n_tok;
    j.x = x;
    j.act = (m[0]->scheme == COLIBRI_QUANT_Q8 && lm->h.dense_act == 1u) ? 1 : 0;
    if (j.act == 1) {
        quantize_rows(x, lm->xq, lm->sxq, m[0]->n_in, n_tok);
    }
    j.xq = lm->xq;
    j.sx = lm->sxq;
    return lin_run(lm, &j);
}

/* SwiGLU of n rows with w1 / w2 / w3 [out][in] in any scheme (fp32: colibri_swiglu_f32's
 * operations; else the generated <name>_ffn_<scheme>_<act>_f<d_ff> kernel), on the calling
 * thread: hh holds 2 * n * d_ff floats, xq / sx n int8 rows of max(d, d_ff). */
static void ffn_rows(const lm_mat *w, int32_t act, const float *x, float *y, int32_t n, float *hh,
                     int8_t *xq, float *sx)
{
    const int32_t d = w[0].n_in;
    const int32_t f = w[0].n_out;
    float *g = hh + (size_t)n * (size_t)f;
    if (act == 1) {
        quantize_rows(x, xq, sx, d, n);
    }
    mat_rows(&w[0], act, NULL, x, xq, sx, hh, f, 0, f, n);
    mat_rows(&w[2], act, NULL, x, xq, sx, g, f, 0, f, n);
    colibri_silu_mul_f32(hh, g, (size_t)n * (size_t)f);
    if (act == 1) {
        quantize_rows(hh, xq, sx, f, n);
    }
    mat_rows(&w[1], act, NULL, hh, xq, sx, y, d, 0, d, n);
}

/* Dense MLP / shared expert on n rows, every matrix's output rows split over the threads. */
static colibri_status lm_dense_ffn(colibri_lm_t *lm, const lm_layer *ly, const float *x, float *y,
                                   int32_t n)
{
    const int32_t f = ly->ffn_d_ff;
    const int32_t d = (int32_t)lm->h.d_model;
    const int32_t act = ly->ffn_scheme == COLIBRI_QUANT_F32 ? 0 : ly->ffn_act;
    float *hh = lm->ffn_scratch;
    float *g = hh + (size_t)n * (size_t)f;
    lm_lin_job j;
    memset(&j, 0, sizeof j);
    j.act = act;
    j.n_tok = n;
    j.xq = lm->xq;
    j.sx = lm->sxq;
    if (act == 1) {
        quantize_rows(x, lm->xq, lm->sxq, d, n);
    }
    j.n_mats = 2;
    j.m[0] = &ly->ffn[0];
    j.m[1] = &ly->ffn[2];
    j.y[0] = hh;
    j.y[1] = g;
    j.x = x;
    colibri_status st = lin_run(lm, &j);
    if (st != COLIBRI_OK) {
        return st;
    }
    colibri_silu_mul_f32(hh, g, (size_t)n * (size_t)f);
    if (act == 1) {
        quantize_rows(hh, lm->xq, lm->sxq, f, n);
    }
    j.n_mats = 1;
    j.m[0] = &ly->ffn[1];
    j.y[0] = y;
    j.x = hh;
    return lin_run(lm, &j);
}

/* The attention proper of n rows (q / k / v already normed, clipped and rotated), split over
 * the threads by KV head: the cache is [kv head][position][head_dim], so a range of KV heads
 * and their query heads is an attention of its own, with its own part of the cache; each
 * thread runs its range for the n rows in order (row t writes its K / V row, then attends to
 * the rows before it), with its own scores. The same operations per head as one thread. */
typedef struct {
    const colibri_attention_shape_t *shape;
    float *kc, *vc;
    int32_t pos0, n;
} lm_att_job;

static colibri_status job_att(colibri_lm_t *lm, void *arg, int32_t tid, int32_t nt)
{
    const lm_att_job *j = (const lm_att_job *)arg;
    const int32_t n_kv = j->shape->n_kv_heads;
    const int32_t g0 = (int32_t)((int64_t)n_kv * tid / nt);
    const int32_t g1 = (int32_t)((int64_t)n_kv * (tid + 1) / nt);
    if (g1 <= g0) {
        return COLIBRI_OK;
    }
    const int32_t group = j->shape->n_heads / n_kv;
    colibri_attention_shape_t part = *j->shape;
    part.n_kv_heads = g1 - g0;
    part.n_heads = (g1 - g0) * group;
    const size_t hd = (size_t)part.head_dim;
    const size_t qo = (size_t)g0 * (size_t)group * hd; /* first query head's offset */
    const size_t ko = (size_t)g0 * hd;
    const size_t co = (size_t)g0 * (size_t)part.max_context * hd;
    for (int32_t t = 0; t < j->n; t++) {
        const colibri_status st = colibri_attention_f32(
            &part, j->pos0 + t, lm->q + (size_t)t * (size_t)lm->hq + qo,
            lm->k + (size_t)t * (size_t)lm->hkv + ko, lm->v + (size_t)t * (size_t)lm->hkv + ko,
            j->kc + co, j->vc + co, lm->scratch[tid].scores,
            lm->att + (size_t)t * (size_t)lm->hq + qo);
        if (st != COLIBRI_OK) {
            return st;
        }
    }
    return COLIBRI_OK;
}

/* Attention of n rows at positions pos0 .. pos0 + n - 1, one after the other: each writes its
 * K / V row and attends to the rows before it, as n token steps would. */
static colibri_status lm_attention(colibri_lm_t *lm, const lm_layer *ly, int32_t l, int32_t pos0,
                                   int32_t n)
{
    const lm_header *h = &lm->h;
    const colibri_attention_shape_t shape = {
        .n_heads = (int32_t)h->n_heads,
        .n_kv_heads = (int32_t)h->n_kv_heads,
        .head_dim = (int32_t)h->head_dim,
        .max_context = lm->max_context,
        .window = (int32_t)h->window,
    };
    const size_t kv_floats = (size_t)lm->hkv * (size_t)lm->max_context;
    float *kc = lm->kv + (size_t)l * 2u * kv_floats;
    const lm_mat *m[3] = {&ly->wq, &ly->wk, &ly->wv};
    const float *b[3] = {ly->bq, ly->bk, ly->bv};
    float *y[3] = {lm->q, lm->k, lm->v};
    colibri_status st = lm_linear(lm, 3, m, b, y, lm->hbuf, n);
    if (st != COLIBRI_OK) {
        return st;
    }
    const size_t half = h->head_dim / 2u;
    for (int32_t t = 0; t < n; t++) {
        float *q = lm->q + (size_t)t * (size_t)lm->hq;
        float *k = lm->k + (size_t)t * (size_t)lm->hkv;
        float *v = lm->v + (size_t)t * (size_t)lm->hkv;
        const int32_t pos = pos0 + t;
        if (ly->q_norm != NULL) {
            colibri_rmsnorm_f32(q, ly->q_norm, q, lm->hq, h->eps);
            colibri_rmsnorm_f32(k, ly->k_norm, k, lm->hkv, h->eps);
        }
        if ((h->flags & LM_FLAG_CLIP) != 0u) {
            colibri_clip_f32(q, lm->hq, h->clip);
            colibri_clip_f32(k, lm->hkv, h->clip);
            colibri_clip_f32(v, lm->hkv, h->clip);
        }
        const float *cs = lm->rope_cos + (size_t)pos * half;
        const float *sn = lm->rope_sin + (size_t)pos * half;
        colibri_rope_f32(q, (int32_t)h->n_heads, (int32_t)h->head_dim, cs, sn);
        colibri_rope_f32(k, (int32_t)h->n_kv_heads, (int32_t)h->head_dim, cs, sn);
    }
    lm_att_job j = {&shape, kc, kc + kv_floats, pos0, n};
    /* multiply-adds: q.k and p.v over the rows attended to, per query head */
    const uint64_t work = 2u * (uint64_t)n * (uint64_t)lm->hq * (uint64_t)(pos0 + n);
    st = lm_run_sized(lm, job_att, &j, work);
    if (st != COLIBRI_OK) {
        return st;
    }
    const lm_mat *mo[1] = {&ly->wo};
    const float *bo[1] = {ly->bo};
    float *yo[1] = {lm->proj};
    return lm_linear(lm, 1, mo, bo, yo, lm->att, n);
}

/* The routed experts of a layer for n rows, grouped by expert: lm->keys (id * n + row, sorted)
 * in runs lm->groups[g] .. lm->groups[g + 1]; each expert runs once on its rows (one GEMM per
 * matrix), and its output row for (row, slot) goes to y_expert[row][slot]. */
typedef struct {
    const lm_layer *ly;
    const float *x;
    int32_t n, n_groups;
} lm_moe_job;

static colibri_status job_moe(colibri_lm_t *lm, void *arg, int32_t tid, int32_t nt)
{
    const lm_moe_job *j = (const lm_moe_job *)arg;
    const lm_layer *ly = j->ly;
    const int32_t n = j->n;
    const size_t d = (size_t)lm->h.d_model;
    const int32_t kk = lm->max_k;
    lm_scratch *sc = &lm->scratch[tid];
    for (int32_t g = 0; g < j->n_groups; g++) {
        if ((nt > 1 ? lm->owner[g] : 0) != tid) {
            continue;
        }
        const int32_t first = lm->groups[g];
        const int32_t cnt = lm->groups[g + 1] - first;
        const int32_t id = lm->keys[first] / n;
        const lm_expert *e = clb_lm_expert_at(lm, ly, id);
        if (e == NULL) {
            return COLIBRI_ERR_EXPERT; /* not reached: clb_lm_expert_use made it resident */
        }
        for (int32_t r = 0; r < cnt; r++) {
            const int32_t t = lm->keys[first + r] % n;
            memcpy(sc->xin + (size_t)r * d, j->x + (size_t)t * d, d * sizeof(float));
        }
        if (e->scheme == COLIBRI_QUANT_F32) {
            colibri_expert_ffn_f32(&ly->moe, &e->fw, sc->xin, sc->yout, cnt, sc->hh);
        } else {
            ffn_rows(e->w, e->act, sc->xin, sc->yout, cnt, sc->hh, sc->xq, sc->sx);
        }
        for (int32_t r = 0; r < cnt; r++) {
            const int32_t t = lm->keys[first + r] % n;
            const int32_t *ids = lm->ids + (size_t)t * (size_t)kk;
            int32_t slot = 0;
            while (slot < ly->top_k - 1 && ids[slot] != id) {
                slot++;
            }
            memcpy(lm->y_expert + ((size_t)t * (size_t)kk + (size_t)slot) * d,
                   sc->yout + (size_t)r * d, d * sizeof(float));
        }
    }
    return COLIBRI_OK;
}

static int cmp_i32(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a;
    const int32_t y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* The MoE block for n rows: colibri_route per row, then colibri_sparse_forward's order per row
 * (experts in ascending id, out = 0 + sum g * y). With a budget n is 1. */
static colibri_status lm_moe(colibri_lm_t *lm, lm_layer *ly, const lm_layer *next, const float *x,
                             float *out, int32_t n)
{
    const int32_t k = ly->top_k;
    const int32_t d = (int32_t)lm->h.d_model;
    const int32_t kk = lm->max_k;
    colibri_status st;
    for (int32_t t = 0; t < n; t++) {
        int32_t *ids = lm->ids + (size_t)t * (size_t)kk;
        float *gates = lm->gates + (size_t)t * (size_t)kk;
        st = colibri_route(&ly->moe, x + (size_t)t * (size_t)d, 1, k, ids, gates, lm->route_temp);
        if (st != COLIBRI_OK) {
            return st;
        }
        for (int32_t i = 1; i < k; ++i) { /* insertion sort by expert id, gates along */
            const int32_t id = ids[i];
            const float g = gates[i];
            int32_t j = i - 1;
            for (; j >= 0 && ids[j] > id; --j) {
                ids[j + 1] = ids[j];
                gates[j + 1] = gates[j];
            }
            ids[j + 1] = id;
            gates[j + 1] = g;
        }
        for (int32_t i = 0; i < k; ++i) {
            if (ids[i] < 0 || ids[i] >= ly->moe.n_experts || (i > 0 && ids[i] == ids[i - 1])) {
                return COLIBRI_ERR_EXPERT;
            }
        }
    }
    if (lm->cache != NULL) {
        /* all top_k resident first (n_slots >= top_k and LRU: none evicts another of them),
         * then the next layer's prefetch, which leaves them in place */
        for (int32_t i = 0; i < k; ++i) {
            st = clb_lm_expert_use(lm, ly, lm->ids[i]);
            if (st != COLIBRI_OK) {
                return st;
            }
        }
        if (next != NULL) {
            clb_lm_prefetch(lm, ly, next);
        }
    }
    int32_t nk = 0;
    for (int32_t t = 0; t < n; t++) {
        for (int32_t i = 0; i < k; ++i) {
            lm->keys[nk++] = lm->ids[(size_t)t * (size_t)kk + (size_t)i] * n + t;
        }
    }
    qsort(lm->keys, (size_t)nk, sizeof *lm->keys, cmp_i32);
    int32_t ng = 0;
    for (int32_t i = 0; i < nk; i++) {
        if (i == 0 || lm->keys[i] / n != lm->keys[i - 1] / n) {
            lm->groups[ng++] = i;
        }
    }
    lm->groups[ng] = nk;
    /* Each run to a thread, largest first, to the least loaded (lowest tid on ties): fixed
     * by the routing alone (and which thread runs an expert never changes its output). */
    const int32_t nt = lm->pool != NULL ? lm->n_threads : 1;
    for (int32_t t = 0; t < nt; t++) {
        lm->load[t] = 0;
    }
    for (int32_t g = 0; g < ng; g++) {
        lm->owner[g] = -1;
    }
    for (int32_t left = ng; left > 0; left--) {
        int32_t best = -1;
        for (int32_t g = 0; g < ng; g++) {
            if (lm->owner[g] < 0 && (best < 0 || lm->groups[g + 1] - lm->groups[g] >
                                                     lm->groups[best + 1] - lm->groups[best])) {
                best = g;
            }
        }
        int32_t to = 0;
        for (int32_t t = 1; t < nt; t++) {
            to = lm->load[t] < lm->load[to] ? t : to;
        }
        lm->owner[best] = to;
        lm->load[to] += lm->groups[best + 1] - lm->groups[best];
    }
    lm_moe_job j = {ly, x, n, ng};
    st = ng > 1 ? clb_lm_run(lm, job_moe, &j) : job_moe(lm, &j, 0, 1);
    if (st != COLIBRI_OK) {
        return st;
    }
    for (int32_t t = 0; t < n; t++) {
        float *o = out + (size_t)t * (size_t)d;
        const float *gates = lm->gates + (size_t)t * (size_t)kk;
        for (int32_t i = 0; i < d; ++i) {
            o[i] = 0.0f;
        }
        for (int32_t s = 0; s < k; ++s) {
            const float g = gates[s];
            const float *ye = lm->y_expert + ((size_t)t * (size_t)kk + (size_t)s) * (size_t)d;
            for (int32_t i = 0; i < d; ++i) {
                o[i] += g * ye[i];
            }
        }
    }
    if (lm->cache != NULL) { /* prefetches not used by this layer count no more */
        const lm_cache *c = lm->cache;
        for (uint32_t s = 0; s < c->n_slots; s++) {
            lm_slot *sl = &c->slots[s];
            if (sl->ahead && sl->expert >= ly->first_expert &&
                sl->expert < ly->first_expert + ly->moe.n_experts) {
                sl->ahead = 0;
            }
        }
    }
    return COLIBRI_OK;
}

static colibri_status lm_ffn(colibri_lm_t *lm, lm_layer *ly, const lm_layer *next, int32_t n)
{
    const int32_t d = (int32_t)lm->h.d_model;
    const size_t nd = (size_t)n * (size_t)d;
    float *x = lm->x;
    float *proj = lm->proj;
    colibri_status st;
    if (!ly->is_moe) {
        if (next != NULL) {
            clb_lm_prefetch(lm, ly, next);
        }
        st = lm_dense_ffn(lm, ly, lm->hbuf, proj, n);
        for (size_t i = 0; i < nd; ++i) {
            x[i] += proj[i];
        }
        return st;
    }
    st = lm_moe(lm, ly, next, lm->hbuf, proj, n);
    if (st != COLIBRI_OK) {
        return st;
    }
    if (ly->ffn_d_ff == 0) {
        for (size_t i = 0; i < nd; ++i) {
            x[i] += proj[i];
        }
        return COLIBRI_OK;
    }
    st = lm_dense_ffn(lm, ly, lm->hbuf, lm->shared, n);
    if (st != COLIBRI_OK) {
        return st;
    }
    for (int32_t t = 0; t < n; t++) {
        const size_t r = (size_t)t * (size_t)d;
        float scale = 1.0f;
        if (ly->shared_gate != NULL) {
            float g = 0.0f;
            for (int32_t i = 0; i < d; ++i) {
                g += lm->hbuf[r + (size_t)i] * ly->shared_gate[i];
            }
            scale = 1.0f / (1.0f + colibri_expf(-g));
        }
        for (int32_t i = 0; i < d; ++i) {
            x[r + (size_t)i] += proj[r + (size_t)i] + scale * lm->shared[r + (size_t)i];
        }
    }
    return COLIBRI_OK;
}

static void embed_row(const colibri_lm_t *lm, int32_t token, float *x)
{
    const int32_t d = (int32_t)lm->h.d_model;
    const lm_mat *em = &lm->embed;
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

/* n <= lm->batch tokens at positions pos0 ..: every layer on all n rows, then the logits of
 * the last one. n = 1 is the token step. */
static colibri_status lm_step(colibri_lm_t *lm, const int32_t *tokens, int32_t n, int32_t pos0,
                              const float **logits)
{
    const lm_header *h = &lm->h;
    const int32_t d = (int32_t)h->d_model;
    const size_t nd = (size_t)n * (size_t)d;
    float *x = lm->x;
    for (int32_t t = 0; t < n; t++) {
        embed_row(lm, tokens[t], x + (size_t)t * (size_t)d);
    }
    for (int32_t l = 0; l < (int32_t)h->n_layers; ++l) {
        lm_layer *ly = &lm->layers[l];
        for (int32_t t = 0; t < n; t++) {
            const size_t r = (size_t)t * (size_t)d;
            colibri_rmsnorm_f32(x + r, ly->input_norm, lm->hbuf + r, d, h->eps);
        }
        colibri_status st = lm_attention(lm, ly, l, pos0, n);
        if (st != COLIBRI_OK) {
            return st;
        }
        for (size_t i = 0; i < nd; ++i) {
            x[i] += lm->proj[i];
        }
        for (int32_t t = 0; t < n; t++) {
            const size_t r = (size_t)t * (size_t)d;
            colibri_rmsnorm_f32(x + r, ly->post_norm, lm->hbuf + r, d, h->eps);
        }
        st = lm_ffn(lm, ly, l + 1 < (int32_t)h->n_layers ? &lm->layers[l + 1] : NULL, n);
        if (st != COLIBRI_OK) {
            return st;
        }
    }
    colibri_rmsnorm_f32(x + (size_t)(n - 1) * (size_t)d, lm->final_norm, lm->hbuf, d, h->eps);
    const lm_mat *m[1] = {&lm->lm_head};
    const float *b[1] = {NULL};
    float *y[1] = {lm->logits};
    const colibri_status st = lm_linear(lm, 1, m, b, y, lm->hbuf, 1);
    if (st != COLIBRI_OK) {
        return st;
    }
    *logits = lm->logits;
    return COLIBRI_OK;
}

colibri_status colibri_lm_forward(colibri_lm_t *lm, int32_t token, int32_t pos,
                                  const float **logits)
{
    if (lm == NULL || logits == NULL || token < 0 || token >= (int32_t)lm->h.vocab) {
        return COLIBRI_ERR_ARG;
    }
    if (pos < 0 || pos >= lm->max_context) {
        return COLIBRI_ERR_NOMEM; /* context overflow: the KV cache has no row for pos */
    }
    return lm_step(lm, &token, 1, pos, logits);
}

colibri_status colibri_lm_prefill(colibri_lm_t *lm, const int32_t *tokens, int32_t n, int32_t pos0,
                                  const float **logits)
{
    if (lm == NULL || tokens == NULL || logits == NULL || n < 1) {
        return COLIBRI_ERR_ARG;
    }
    for (int32_t t = 0; t < n; t++) {
        if (tokens[t] < 0 || tokens[t] >= (int32_t)lm->h.vocab) {
            return COLIBRI_ERR_ARG;
        }
    }
    if (pos0 < 0 || pos0 >= lm->max_context || n > lm->max_context - pos0) {
        return COLIBRI_ERR_NOMEM; /* context overflow */
    }
    /* With a budget the expert slots hold top_k experts of one token at a time: token steps. */
    const int32_t chunk = lm->cache != NULL ? 1 : lm->batch;
    for (int32_t t = 0; t < n; t += chunk) {
        const int32_t m = n - t < chunk ? n - t : chunk;
        const colibri_status st = lm_step(lm, tokens + t, m, pos0 + t, logits);
        if (st != COLIBRI_OK) {
            return st;
        }
    }
    return COLIBRI_OK;
}

#else
/* ISO C forbids an empty translation unit. */
typedef int colibri_lm_step_unused;
#endif /* COLIBRI_NO_FILESYSTEM */
