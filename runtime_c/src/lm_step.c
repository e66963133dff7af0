/**
 * @file lm_step.c
 * @brief The model file's side of the token step (colibri_lm.h): the step functions of
 *        tf_step.c (the ones the generated model runs too) over a view of the mmapped container,
 *        and what only a model file has: the linear layers and the attention split over the
 *        thread pool (colibri_tf_hooks_t), the MoE block grouping n rows by expert (expert
 *        cache, prefetch), the dense MLP in any scheme; colibri_lm_forward / _prefill.
 *        Compiled out with COLIBRI_NO_FILESYSTEM (MCUs run the generated C).
 */
#ifndef COLIBRI_NO_FILESYSTEM

#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* madvise (MADV_DONTNEED: glibc's posix_madvise ignores it) */

#include "lm_internal.h"

/* ------------------------------------------------------------------------------------------ */
/* The token step on n rows: tf_step.c's step functions + the thread pool and expert cache */

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

/* A colibri_tf_lin_t's matrices, each one's output rows split over the threads. */
static colibri_status job_lin(colibri_lm_t *lm, void *arg, int32_t tid, int32_t nt)
{
    (void)lm;
    const colibri_tf_lin_t *j = (const colibri_tf_lin_t *)arg;
    colibri_status st = COLIBRI_OK;
    for (int32_t i = 0; i < j->n_mats && st == COLIBRI_OK; i++) {
        int32_t r0, r1;
        lm_rows(j->m[i]->n_out, tid, nt, &r0, &r1);
        st = j->mat_rows(j->m[i], j->act, j->b[i], j->x, j->xq, j->sx, j->y[i], j->m[i]->n_out, r0,
                         r1, j->n_tok);
    }
    return st;
}

static colibri_status lin_run(colibri_lm_t *lm, const colibri_tf_lin_t *j)
{
    uint64_t work = 0;
    for (int32_t i = 0; i < j->n_mats; i++) {
        work += (uint64_t)j->m[i]->n_out * (uint64_t)j->m[i]->n_in * (uint64_t)j->n_tok;
    }
    return lm_run_sized(lm, job_lin, (void *)(uintptr_t)j, work);
}

/* colibri_tf_hooks_t.linear: the dense matrices (attention, LM head) over the threads. */
static colibri_status hook_linear(void *ctx, const colibri_tf_lin_t *job)
{
    return lin_run((colibri_lm_t *)ctx, job);
}

/* Dense MLP / shared expert on n rows, every matrix's output rows split over the threads. */
static colibri_status lm_dense_ffn(colibri_lm_t *lm, const lm_layer *ly, const float *x, float *y,
                                   int32_t n)
{
    const int32_t f = ly->tf.ffn_d_ff;
    const int32_t d = (int32_t)lm->h.d_model;
    const int32_t act = ly->ffn_scheme == COLIBRI_QUANT_F32 ? 0 : ly->ffn_act;
    float *hh = lm->ffn_scratch;
    float *g = hh + (size_t)n * (size_t)f;
    colibri_tf_lin_t j;
    memset(&j, 0, sizeof j);
    j.mat_rows = lm->tf.mat_rows;
    j.act = act;
    j.n_tok = n;
    j.xq = lm->xq;
    j.sx = lm->sxq;
    if (act == 1) {
        colibri_tf_quantize_rows(x, lm->xq, lm->sxq, d, n);
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
        colibri_tf_quantize_rows(hh, lm->xq, lm->sxq, f, n);
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

/* colibri_tf_hooks_t.attend: the attention of n rows at positions pos0 .., split over the
 * threads by KV head (job_att). */
static colibri_status hook_attend(void *ctx, const colibri_attention_shape_t *shape, float *kc,
                                  float *vc, int32_t pos0, int32_t n)
{
    colibri_lm_t *lm = (colibri_lm_t *)ctx;
    lm_att_job j = {shape, kc, vc, pos0, n};
    /* multiply-adds: q.k and p.v over the rows attended to, per query head */
    const uint64_t work = 2u * (uint64_t)n * (uint64_t)lm->hq * (uint64_t)(pos0 + n);
    return lm_run_sized(lm, job_att, &j, work);
}

/* The routed experts of a layer for n rows, grouped by expert (clb_moe_group): lm->perm holds
 * the (row, slot) pairs (pair = row * top_k + slot) in expert order, in runs lm->groups[g] ..
 * lm->groups[g + 1] - 1; each expert runs once on its rows (one GEMM per matrix) and writes
 * its output rows in that order to y_expert[lm->groups[g] ..]. */
typedef struct {
    const lm_layer *ly;
    const float *x;
    int32_t n, g0, g1; /* the runs g0 .. g1 - 1 */
} lm_moe_job;

/* The expert id of run g. */
static int32_t run_expert_id(const colibri_lm_t *lm, int32_t g)
{
    return lm->ids[lm->perm[lm->groups[g]]];
}

static colibri_status job_moe(colibri_lm_t *lm, void *arg, int32_t tid, int32_t nt)
{
    const lm_moe_job *j = (const lm_moe_job *)arg;
    const lm_layer *ly = j->ly;
    const int32_t d = (int32_t)lm->h.d_model;
    lm_scratch *sc = &lm->scratch[tid];
    for (int32_t g = j->g0; g < j->g1; g++) {
        if ((nt > 1 ? lm->owner[g] : 0) != tid) {
            continue;
        }
        const int32_t first = lm->groups[g];
        const int32_t cnt = lm->groups[g + 1] - first;
        const lm_expert *e = clb_lm_expert_at(lm, ly, run_expert_id(lm, g));
        if (e == NULL) {
            return COLIBRI_ERR_EXPERT; /* not reached: clb_lm_expert_use made it resident */
        }
        float *y = lm->y_expert + (size_t)first * (size_t)d;
        clb_moe_gather(lm->perm + first, cnt, ly->top_k, j->x, sc->xin, d);
        if (e->scheme == COLIBRI_QUANT_F32) {
            colibri_expert_ffn_f32(&ly->moe, &e->fw, sc->xin, y, cnt, sc->hh);
        } else {
            const colibri_status st =
                colibri_tf_swiglu_rows(e->w, e->act, sc->xin, y, cnt, sc->hh, sc->xq, sc->sx);
            if (st != COLIBRI_OK) {
                return st;
            }
        }
    }
    return COLIBRI_OK;
}

/* Runs g0 .. g1 - 1 of lm_moe's grouping on the threads. */
static colibri_status lm_moe_runs(colibri_lm_t *lm, const lm_layer *ly, const float *x, int32_t n,
                                  int32_t g0, int32_t g1)
{
    lm_moe_job j = {ly, x, n, g0, g1};
    return g1 - g0 > 1 ? clb_lm_run(lm, job_moe, &j) : job_moe(lm, &j, 0, 1);
}

/* Run g's expert in its slot yet (clb_lm_expert_wait; *busy: still being read, only without
 * `wait`)? A read that failed (its slot freed) is read again once, as a miss, and waited for:
 * the status is the read's failure when that fails too (or finds no slot to read into). */
static colibri_status lm_expert_ready(colibri_lm_t *lm, const lm_layer *ly, int32_t g, int wait,
                                      int *busy)
{
    const int32_t id = run_expert_id(lm, g);
    const colibri_status st = clb_lm_expert_wait(lm, ly, id, wait, busy);
    if (st == COLIBRI_OK) {
        return st;
    }
    colibri_status again = clb_lm_expert_use(lm, ly, id);
    again = again == COLIBRI_OK ? clb_lm_expert_wait(lm, ly, id, 1, busy) : again;
    return again == COLIBRI_OK ? again : st;
}

/* Runs g0 .. g1 - 1 once their experts are in their slots. With a budget a miss is read by the
 * reader thread, and by this one when it needs the expert (clb_lm_expert_use, lm_reader.c). On
 * the pool every read is done first (this thread reading chunks alongside the reader). On one
 * thread the runs whose experts are resident go first, while the reader reads the others;
 * then, until every run is done: a run whose read is done, else a chunk of a read no thread
 * has taken yet, else a wait for the first read left. Which run goes when changes no output:
 * each writes its own rows, and the scatter adds them in expert order. */
static colibri_status lm_moe_loaded(colibri_lm_t *lm, const lm_layer *ly, const float *x, int32_t n,
                                    int32_t g0, int32_t g1)
{
    if (lm->cache == NULL) {
        return lm_moe_runs(lm, ly, x, n, g0, g1);
    }
    int busy = 0;
    colibri_status st = COLIBRI_OK;
    if (lm->pool != NULL && g1 - g0 > 1) {
        for (int32_t g = g0; g < g1 && st == COLIBRI_OK; g++) {
            st = lm_expert_ready(lm, ly, g, 1, &busy);
        }
        return st == COLIBRI_OK ? lm_moe_runs(lm, ly, x, n, g0, g1) : st;
    }
    uint64_t late[4] = {0u, 0u, 0u, 0u}; /* runs g0 + i (i < 256) still being read */
    int32_t n_late = 0;
    for (int32_t g = g0; g < g1; g++) { /* the resident ones first (past 256 runs: in order) */
        const int32_t i = g - g0;
        st = lm_expert_ready(lm, ly, g, i >= 256, &busy);
        if (st == COLIBRI_OK && busy) {
            late[i / 64] |= (uint64_t)1u << (i % 64);
            n_late++;
            continue;
        }
        st = st == COLIBRI_OK ? lm_moe_runs(lm, ly, x, n, g, g + 1) : st;
        if (st != COLIBRI_OK) {
            return st;
        }
    }
    while (n_late > 0) {
        int32_t ran = 0, first = -1;
        for (int32_t i = 0; i < g1 - g0 && i < 256; i++) { /* those read since */
            if ((late[i / 64] >> (i % 64) & 1u) == 0u) {
                continue;
            }
            st = lm_expert_ready(lm, ly, g0 + i, 0, &busy);
            first = first < 0 && st == COLIBRI_OK && busy ? i : first;
            if (st == COLIBRI_OK && busy) {
                continue;
            }
            st = st == COLIBRI_OK ? lm_moe_runs(lm, ly, x, n, g0 + i, g0 + i + 1) : st;
            if (st != COLIBRI_OK) {
                return st;
            }
            late[i / 64] &= ~((uint64_t)1u << (i % 64));
            n_late--;
            ran++;
        }
        if (ran > 0 || n_late == 0) {
            continue;
        }
        int helped = 0; /* none read: a chunk of the first read with one left, or a wait */
        for (int32_t i = first; i < g1 - g0 && i < 256 && !helped; i++) {
            helped = (late[i / 64] >> (i % 64) & 1u) != 0u &&
                     clb_lm_expert_help(lm, ly, run_expert_id(lm, g0 + i));
        }
        if (!helped) {
            st = lm_expert_ready(lm, ly, g0 + first, 1, &busy);
            if (st != COLIBRI_OK) {
                return st;
            }
        }
    }
    return COLIBRI_OK;
}

/* With a budget: the runs in waves of as many experts as the LRU slots hold, each wave's
 * experts made resident (one use each: the rows of a chunk that route to an expert share one
 * read of it), then run. */
static colibri_status lm_moe_waves(colibri_lm_t *lm, const lm_layer *ly, const float *x, int32_t n,
                                   int32_t ng)
{
    const int32_t cap = (int32_t)(lm->cache->n_slots - lm->stats.n_pinned); /* >= top_k */
    for (int32_t g0 = 0, g1 = 0; g0 < ng; g0 = g1) {
        const int32_t end = ng - g0 < cap ? ng : g0 + cap;
        clb_lm_uses_begin(lm);
        for (int32_t g = g0; g < end; g++) {
            clb_lm_expert_pin(lm, ly, run_expert_id(lm, g));
        }
        for (; g1 < end; g1++) {
            const colibri_status st = clb_lm_expert_use(lm, ly, run_expert_id(lm, g1));
            if (st != COLIBRI_OK) {
                return st;
            }
        }
        const colibri_status st = lm_moe_loaded(lm, ly, x, n, g0, g1);
        if (st != COLIBRI_OK) {
            return st;
        }
    }
    return COLIBRI_OK;
}

/* Each run to a thread, largest first, to the least loaded (lowest tid on ties): fixed by the
 * routing alone (and which thread runs an expert never changes its output). */
static void lm_moe_owners(colibri_lm_t *lm, int32_t ng)
{
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
}

/* The MoE block for n rows, as colibri_forward runs it (the generated models): colibri_route,
 * clb_moe_group, each expert once on its gathered rows, clb_moe_scatter_add (out = 0 + the
 * gated expert rows, ascending expert id per row). With a budget, one row uses its top_k
 * experts then prefetches the next layer's; several rows (a prefill chunk) go in waves. */
static colibri_status lm_moe(colibri_lm_t *lm, lm_layer *ly, const lm_layer *next, const float *x,
                             float *out, int32_t n)
{
    const int32_t k = ly->top_k;
    const int32_t d = (int32_t)lm->h.d_model;
    const int32_t nk = n * k;
    colibri_status st = colibri_route(&ly->moe, x, n, k, lm->ids, lm->gates, NULL);
    if (st != COLIBRI_OK) {
        return st;
    }
    for (int32_t p = 0; p < nk; p++) {
        if (lm->ids[p] < 0 || lm->ids[p] >= ly->moe.n_experts) {
            return COLIBRI_ERR_EXPERT;
        }
    }
    const int32_t n_exp = ly->moe.n_experts;
    clb_moe_group(lm->ids, nk, n_exp, lm->offsets, lm->offsets + n_exp + 1, lm->perm);
    int32_t ng = 0;
    for (int32_t e = 0; e < n_exp; e++) {
        if (lm->offsets[e + 1] > lm->offsets[e]) {
            lm->groups[ng++] = lm->offsets[e];
        }
    }
    lm->groups[ng] = nk;
    if (lm->cache != NULL && n == 1) {
        /* all top_k resident first, in ascending id (n_slots >= top_k and pinned for these
         * uses: none evicts another of them), then the next layer's prefetch, which leaves
         * them in place */
        clb_lm_uses_begin(lm);
        for (int32_t g = 0; g < ng; ++g) {
            clb_lm_expert_pin(lm, ly, run_expert_id(lm, g));
        }
        for (int32_t g = 0; g < ng; ++g) {
            st = clb_lm_expert_use(lm, ly, run_expert_id(lm, g));
            if (st != COLIBRI_OK) {
                return st;
            }
        }
        if (next != NULL) {
            clb_lm_prefetch(lm, next);
        }
    }
    lm_moe_owners(lm, ng);
    st = lm->cache != NULL && n > 1 ? lm_moe_waves(lm, ly, x, n, ng)
                                    : lm_moe_loaded(lm, ly, x, n, 0, ng);
    if (st != COLIBRI_OK) {
        return st;
    }
    memset(out, 0, (size_t)n * (size_t)d * sizeof(float));
    clb_moe_scatter_add(lm->perm, nk, k, lm->gates, lm->y_expert, out, d);
    clb_lm_layer_done(lm, ly); /* its unused prefetches go cold, its prediction judged */
    return COLIBRI_OK;
}

static const colibri_tf_hooks_t lm_hooks = {
    .linear = hook_linear,
    .attend = hook_attend,
};

void clb_lm_view(colibri_lm_t *lm)
{
    const lm_header *h = &lm->h;
    colibri_tf_model_t *m = &lm->tf;
    m->n_layers = (int32_t)h->n_layers;
    m->vocab = (int32_t)h->vocab;
    m->d_model = (int32_t)h->d_model;
    m->n_heads = (int32_t)h->n_heads;
    m->n_kv_heads = (int32_t)h->n_kv_heads;
    m->head_dim = (int32_t)h->head_dim;
    m->max_context = lm->max_context;
    m->window = (int32_t)h->window;
    m->clip_on = (h->flags & LM_FLAG_CLIP) != 0u;
    m->eps = h->eps;
    m->clip = h->clip;
    m->embed = lm->embed;
    m->lm_head = lm->lm_head;
    m->final_norm = lm->final_norm;
    m->rope_cos = lm->rope_cos;
    m->rope_sin = lm->rope_sin;
    m->layers = &lm->layers[0].tf;
    m->layer_stride = sizeof(lm_layer);
    m->x = lm->x;
    m->h = lm->hbuf;
    m->q = lm->q;
    m->k = lm->k;
    m->v = lm->v;
    m->att = lm->att;
    m->proj = lm->proj;
    m->shared = lm->shared;
    m->kv = lm->kv;
    m->scores = lm->scratch[0].scores;
    m->logits = lm->logits;
    m->xq = lm->xq;
    m->sxq = lm->sxq;
    m->hooks = &lm_hooks;
    m->ctx = lm;
    m->mat_rows = colibri_tf_mat_rows; /* any scheme: the container's are known at load only */
    m->quantize_rows = h->dense_act == 1u ? colibri_tf_quantize_rows : NULL;
}

/* n <= lm->batch tokens at positions pos0 ..: the step functions of tf_step.c, every layer on
 * all n rows, its FFN here (the dense MLP, or the MoE block + the shared expert; the next
 * layer's experts prefetched with a budget), then the logits of the last row. */
static colibri_status lm_step(colibri_lm_t *lm, const int32_t *tokens, int32_t n, int32_t pos0,
                              const float **logits)
{
    const colibri_tf_model_t *m = &lm->tf;
    colibri_status st = colibri_tf_embed(m, tokens, n, pos0);
    for (int32_t l = 0; l < m->n_layers && st == COLIBRI_OK; ++l) {
        st = colibri_tf_attention(m, l, pos0, n);
        if (st != COLIBRI_OK) {
            break;
        }
        lm_layer *ly = &lm->layers[l];
        const lm_layer *next = l + 1 < m->n_layers ? &lm->layers[l + 1] : NULL;
        if (!ly->tf.is_moe) {
            if (next != NULL && n == 1) {
                clb_lm_prefetch(lm, next);
            }
            st = lm_dense_ffn(lm, ly, lm->hbuf, lm->proj, n);
        } else {
            st = lm_moe(lm, ly, next, lm->hbuf, lm->proj, n);
            if (st == COLIBRI_OK && ly->tf.ffn_d_ff > 0) {
                st = lm_dense_ffn(lm, ly, lm->hbuf, lm->shared, n);
            }
        }
        if (st == COLIBRI_OK) {
            colibri_tf_ffn_residual(m, l, n);
        }
    }
    return st == COLIBRI_OK ? colibri_tf_logits(m, n, logits) : st;
}

/* COLIBRI_ERR_CHANGED when the model file is no longer the one loaded (size, inode or
 * modification time differ: truncated, grown or rewritten in place), else OK. */
static colibri_status lm_file_check(const colibri_lm_t *lm)
{
    struct stat sb;
    const struct stat *a = &lm->at_load;
    if (fstat(lm->fd, &sb) != 0) {
        return COLIBRI_ERR_IO;
    }
    if (sb.st_size != a->st_size || sb.st_ino != a->st_ino || sb.st_dev != a->st_dev ||
        sb.st_mtim.tv_sec != a->st_mtim.tv_sec || sb.st_mtim.tv_nsec != a->st_mtim.tv_nsec) {
        return COLIBRI_ERR_CHANGED;
    }
    return COLIBRI_OK;
}

colibri_status colibri_lm_forward(colibri_lm_t *lm, int32_t token, int32_t pos,
                                  const float **logits)
{
    if (lm == NULL || logits == NULL || token < 0 || token >= (int32_t)lm->h.vocab) {
        return COLIBRI_ERR_ARG;
    }
    return colibri_lm_prefill(lm, &token, 1, pos, logits);
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
        return COLIBRI_ERR_NOMEM; /* context overflow: the KV cache has no row for them */
    }
    if (pos0 > lm->n_pos) {
        return COLIBRI_ERR_POSITION; /* it would attend to KV rows never written */
    }
    colibri_status st = lm_file_check(lm);
    if (st != COLIBRI_OK) {
        return st;
    }
    const int32_t chunk = lm->batch;
    lm->n_pos = pos0; /* rewinding forgets the positions after it; each chunk adds its rows */
    for (int32_t t = 0; t < n && st == COLIBRI_OK; t += chunk) {
        const int32_t m = n - t < chunk ? n - t : chunk;
        st = lm_step(lm, tokens + t, m, pos0 + t, logits);
        lm->n_pos = st == COLIBRI_OK ? pos0 + t + m : lm->n_pos;
    }
    return st;
}

#else
/* ISO C forbids an empty translation unit. */
typedef int colibri_lm_step_unused;
#endif /* COLIBRI_NO_FILESYSTEM */
