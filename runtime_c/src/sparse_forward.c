/**
 * @file sparse_forward.c
 * @brief Sparse MoE forward: counting-sort the (token, slot) pairs of a chunk by expert id,
 *        run each active expert once over its gathered mini-batch, scatter-add gate * y back
 *        into the token rows. All scratch lives in the model's arena, laid out exactly as
 *        COLIBRI_WORKSPACE_BYTES describes, then the kernels' kernel_scratch_bytes (reached
 *        through the hidden region they get as scratch). colibri_forward chains router and
 *        sparse forward.
 */
#include "colibri.h"
#include "colibri_internal.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

size_t colibri_workspace_size(const colibri_model_t *model, int32_t max_tokens)
{
    if (model == NULL) {
        return 0;
    }
    const size_t ws =
        colibri_workspace_bytes_checked(model->n_experts, model->top_k, model->d_model, model->d_ff,
                                        (model->flags & COLIBRI_FLAG_GATED) != 0, max_tokens);
    /* the kernels' own scratch follows the hidden rows, at the end of the workspace */
    const size_t ks = model->kernel_scratch_bytes;
    if (ws == 0 || ks > SIZE_MAX - 15u || COLIBRI_ALIGN16(ks) > SIZE_MAX - ws) {
        return 0;
    }
    return ws + COLIBRI_ALIGN16(ks);
}

/** The arena carved into the buffers of COLIBRI_WORKSPACE_BYTES (same order and rounding). */
typedef struct {
    int32_t *offsets; /* [E + 1] prefix offsets of each expert's group in perm */
    int32_t *cursor;  /* [E] placement cursors (the remaining counter is spare) */
    int32_t *perm;    /* [max_tokens * model top_k] pair index (t_local * k + slot) */
    float *x_gathered;
    float *y_expert;
    float *hidden; /* the kernels' scratch: hidden rows, then kernel_scratch_bytes */
} workspace_view;

static workspace_view workspace_carve(const colibri_model_t *model)
{
    const size_t e = (size_t)model->n_experts;
    const size_t t = (size_t)model->max_tokens;
    const size_t d = (size_t)model->d_model;
    unsigned char *p = (unsigned char *)model->arena;
    workspace_view v;
    v.offsets = (int32_t *)(void *)p;
    v.cursor = v.offsets + e + 1u;
    p += COLIBRI_ALIGN16(4u * (2u * e + 2u));
    v.perm = (int32_t *)(void *)p;
    p += COLIBRI_ALIGN16(4u * t * (size_t)model->top_k);
    v.x_gathered = (float *)(void *)p;
    p += COLIBRI_ALIGN16(4u * t * d);
    v.y_expert = (float *)(void *)p;
    p += COLIBRI_ALIGN16(4u * t * d);
    v.hidden = (float *)(void *)p;
    return v;
}

static colibri_status check_topk(const colibri_model_t *model, int32_t top_k)
{
    if (top_k <= 0 || top_k > model->n_experts || top_k > COLIBRI_MAX_TOP_K) {
        return COLIBRI_ERR_TOPK;
    }
    return COLIBRI_OK;
}

#if defined(__GNUC__) && defined(__arm__) && defined(__ARM_FP) && (__ARM_FP & 4) &&                \
    defined(__ARM_ARCH_PROFILE) && __ARM_ARCH_PROFILE == 'M'
#define SCATTER_VFP 1
#endif

/* o[i] = 0.0f + g * y[i] for i < d: the bits of clb_moe_scatter_add into a zeroed row (a -0
 * product still gives +0), four at a time on a Cortex-M VFP (M4, M7, M55: one VLDMIA and one
 * VSTMIA for four; GCC issued a VLDR and a VSTR a float). Scalar VFP on the M55 too: Helium's
 * vector floating point would flush subnormal products. volatile: the asm's outputs are only
 * the pointers, which nothing reads after the loop. */
static inline void scatter_set_row(float *o, const float *y, float g, size_t d)
{
    size_t i = 0;
#if defined(SCATTER_VFP)
    const float zero = 0.0f;
    float *op = o;
    const float *yp = y;
    for (; i + 4 <= d; i += 4) {
        __asm__ volatile("vldmia %[y]!, {s0-s3}\n\t"
                         "vmul.f32 s0, s0, %[g]\n\t"
                         "vmul.f32 s1, s1, %[g]\n\t"
                         "vmul.f32 s2, s2, %[g]\n\t"
                         "vmul.f32 s3, s3, %[g]\n\t"
                         "vadd.f32 s0, s0, %[z]\n\t"
                         "vadd.f32 s1, s1, %[z]\n\t"
                         "vadd.f32 s2, s2, %[z]\n\t"
                         "vadd.f32 s3, s3, %[z]\n\t"
                         "vstmia %[o]!, {s0-s3}"
                         : [y] "+r"(yp), [o] "+r"(op)
                         : [g] "t"(g), [z] "t"(zero)
                         : "s0", "s1", "s2", "s3", "memory");
    }
#endif
    for (; i < d; i++) {
        o[i] = 0.0f + g * y[i];
    }
}

/* out[token of pairs[r]] = 0 + gates[pairs[r]] * y[r] for r < count: a token's one pair (top_k
 * 1), its row set without zeroing it first. */
static void scatter_set(const int32_t *pairs, int32_t count, const float *gates, const float *y,
                        float *out, int32_t d_model)
{
    const size_t d = (size_t)d_model;
    for (int32_t r = 0; r < count; r++) {
        const int32_t pair = pairs[r];
        scatter_set_row(out + (size_t)pair * d, y + (size_t)r * d, gates[pair], d);
    }
}

/* Run expert e over rows [begin, end) of the chunk's sorted pairs (the chunk's first token is
 * t0: input, output and gates are offset to it). */
static colibri_status run_expert_group(colibri_model_t *model, const workspace_view *ws, int32_t e,
                                       int32_t begin, int32_t end, int32_t top_k,
                                       const float *input, float *output, const float *gates)
{
    const colibri_expert_weights_t *w = NULL;
    colibri_status st = colibri_load_expert(model, e, &w);
    if (st != COLIBRI_OK) {
        return st;
    }
    colibri_expert_kernel_fn kernel =
        (model->kernels != NULL) ? model->kernels[e] : (colibri_expert_kernel_fn)NULL;

    for (int32_t b = begin; b < end; b += model->max_tokens) {
        const int32_t m = (end - b < model->max_tokens) ? end - b : model->max_tokens;
        /* Rows of consecutive tokens (one token, or a run that all goes to e) are already
         * gathered in the input: the kernel reads them there, no copy. */
        const int32_t tok0 = ws->perm[b] / top_k;
        int32_t run = 1;
        while (run < m && ws->perm[b + run] / top_k == tok0 + run) {
            run++;
        }
        const float *xg = input + (size_t)tok0 * (size_t)model->d_model;
        if (run < m) {
            clb_moe_gather(ws->perm + b, m, top_k, input, ws->x_gathered, model->d_model);
            xg = ws->x_gathered;
        }
        if (kernel != NULL) {
            kernel(w, xg, ws->y_expert, m, ws->hidden);
        } else {
            colibri_expert_ffn_f32(model, w, xg, ws->y_expert, m, ws->hidden);
        }
        if (top_k == 1) { /* the token's one expert: its row is written once, not zeroed first */
            scatter_set(ws->perm + b, m, gates, ws->y_expert, output, model->d_model);
        } else {
            clb_moe_scatter_add(ws->perm + b, m, top_k, gates, ws->y_expert, output,
                                model->d_model);
        }
    }
    return COLIBRI_OK;
}

colibri_status colibri_sparse_forward(colibri_model_t *model, const float *input, float *output,
                                      int32_t batch_seq_len, int32_t top_k,
                                      const int32_t *expert_ids, const float *gates)
{
    if (model == NULL || input == NULL || output == NULL || expert_ids == NULL || gates == NULL ||
        batch_seq_len < 0 || model->arena == NULL || model->max_tokens <= 0) {
        return COLIBRI_ERR_ARG;
    }
    colibri_status st = check_topk(model, top_k);
    if (st != COLIBRI_OK) {
        return st;
    }
    const int32_t n_exp = model->n_experts;
    const size_t n_pairs = (size_t)batch_seq_len * (size_t)top_k;
    for (size_t p = 0; p < n_pairs; p++) {
        if (expert_ids[p] < 0 || expert_ids[p] >= n_exp) {
            return COLIBRI_ERR_EXPERT;
        }
    }
    /* A larger k than the arena was sized for means fewer tokens per chunk. */
    int32_t chunk = model->max_tokens;
    if (top_k > model->top_k) {
        /* init guarantees max_tokens * model top_k <= INT32_MAX; 32-bit maths only (no
         * 64-bit division helpers needed on small cores) */
        chunk = (int32_t)(((uint32_t)model->max_tokens * (uint32_t)model->top_k) / (uint32_t)top_k);
        if (chunk == 0) {
            return COLIBRI_ERR_NOMEM;
        }
    }
    if (top_k != 1) { /* with top_k 1 every row is set once by scatter_set */
        memset(output, 0, (size_t)batch_seq_len * (size_t)model->d_model * sizeof(float));
    }

    const workspace_view ws = workspace_carve(model);
    for (int32_t t0 = 0; t0 < batch_seq_len; t0 += chunk) {
        const int32_t n = (batch_seq_len - t0 < chunk) ? batch_seq_len - t0 : chunk;
        const int32_t chunk_pairs = n * top_k;
        const int32_t *ids = expert_ids + (size_t)t0 * (size_t)top_k;

        const size_t at = (size_t)t0 * (size_t)model->d_model;
        clb_moe_group(ids, chunk_pairs, n_exp, ws.offsets, ws.cursor, ws.perm);
        for (int32_t e = 0; e < n_exp; e++) {
            if (ws.offsets[e + 1] == ws.offsets[e]) {
                continue;
            }
            st = run_expert_group(model, &ws, e, ws.offsets[e], ws.offsets[e + 1], top_k,
                                  input + at, output + at, gates + (size_t)t0 * (size_t)top_k);
            if (st != COLIBRI_OK) {
                return st;
            }
        }
        if (model->shared_expert != NULL) { /* every token of the chunk, after its experts */
            model->shared_expert(input + at, output + at, n, ws.y_expert, ws.hidden);
        }
    }
    return COLIBRI_OK;
}

colibri_status colibri_forward(colibri_model_t *model, const float *input, float *output,
                               int32_t batch_seq_len, int32_t d_model, int32_t top_k,
                               int32_t *expert_ids, float *gates, float *route_temp)
{
    if (model == NULL || input == NULL || output == NULL || expert_ids == NULL || gates == NULL ||
        batch_seq_len < 0) {
        return COLIBRI_ERR_ARG;
    }
    if (d_model != model->d_model) {
        return COLIBRI_ERR_DIM;
    }
    colibri_status st = check_topk(model, top_k);
    if (st != COLIBRI_OK) {
        return st;
    }
    st = colibri_route(model, input, batch_seq_len, top_k, expert_ids, gates, route_temp);
    if (st != COLIBRI_OK) {
        return st;
    }
    return colibri_sparse_forward(model, input, output, batch_seq_len, top_k, expert_ids, gates);
}
