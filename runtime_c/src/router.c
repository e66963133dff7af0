/**
 * @file router.c
 * @brief Top-k routing with an online softmax: one pass over the experts per token keeps a
 *        running max M, a running sum S (rescaled when M grows) and the k best logits in the
 *        caller's output row (insertion into a sorted k-array). No allocation; memory does not
 *        depend on the number of experts.
 */
#include "colibri.h"
#include "colibri_internal.h"
#include "colibri_quant.h"

#include <math.h>
#include <stddef.h>

/** Per-token routing state: the online softmax and the k-sized sorted selection. */
typedef struct {
    float max;      /* running max M */
    float sum;      /* running sum S of expf(l - M) */
    int32_t n_kept; /* entries of ids/vals filled so far (<= k) */
    int32_t k;
    int32_t *ids; /* caller's expert_ids row */
    float *vals;  /* caller's gates row, holds logits until finished */
} route_state;

static void route_begin(route_state *st, int32_t k, int32_t *ids, float *vals)
{
    st->max = 0.0f;
    st->sum = 0.0f;
    st->n_kept = 0;
    st->k = k;
    st->ids = ids;
    st->vals = vals;
}

/* Experts arrive in ascending index order, so a later expert with an equal logit never
 * overtakes an earlier one: ties resolve to the lower index. */
static void route_push(route_state *st, int32_t expert, float logit)
{
    if (expert == 0) {
        st->max = logit;
        st->sum = 1.0f;
    } else if (logit > st->max) {
        st->sum = st->sum * expf(st->max - logit) + 1.0f;
        st->max = logit;
    } else {
        st->sum += expf(logit - st->max);
    }

    int32_t pos;
    if (st->n_kept < st->k) {
        pos = st->n_kept;
        st->n_kept++;
    } else if (logit > st->vals[st->k - 1]) {
        pos = st->k - 1;
    } else {
        return;
    }
    while (pos > 0 && st->vals[pos - 1] < logit) {
        st->vals[pos] = st->vals[pos - 1];
        st->ids[pos] = st->ids[pos - 1];
        pos--;
    }
    st->vals[pos] = logit;
    st->ids[pos] = expert;
}

/* Turn the kept logits into softmax probabilities; returns the log-sum-exp. */
static float route_finish(const route_state *st)
{
    for (int32_t j = 0; j < st->k; j++) {
        st->vals[j] = expf(st->vals[j] - st->max) / st->sum;
    }
    return st->max + logf(st->sum);
}

static colibri_status check_topk(int32_t num_experts, int32_t top_k)
{
    if (top_k <= 0 || top_k > num_experts || top_k > COLIBRI_MAX_TOP_K) {
        return COLIBRI_ERR_TOPK;
    }
    return COLIBRI_OK;
}

colibri_status colibri_route_gate(const float *gate_logits, int32_t batch_seq_len,
                                  int32_t num_experts, int32_t top_k, int32_t *expert_ids,
                                  float *gates, float *route_temp)
{
    if (gate_logits == NULL || expert_ids == NULL || gates == NULL || batch_seq_len < 0 ||
        num_experts <= 0) {
        return COLIBRI_ERR_ARG;
    }
    colibri_status st = check_topk(num_experts, top_k);
    if (st != COLIBRI_OK) {
        return st;
    }
    for (int32_t t = 0; t < batch_seq_len; t++) {
        const float *row = gate_logits + (size_t)t * (size_t)num_experts;
        route_state rs;
        route_begin(&rs, top_k, expert_ids + (size_t)t * (size_t)top_k,
                    gates + (size_t)t * (size_t)top_k);
        for (int32_t e = 0; e < num_experts; e++) {
            if (!isfinite(row[e])) {
                return COLIBRI_ERR_NAN;
            }
            route_push(&rs, e, row[e]);
        }
        float lse = route_finish(&rs);
        if (route_temp != NULL) {
            route_temp[t] = lse;
        }
    }
    return COLIBRI_OK;
}

int colibri_router_weights_ok(const colibri_model_t *model)
{
    switch (model->router_scheme) {
    case COLIBRI_QUANT_F32:
        return model->router_w != NULL;
    case COLIBRI_QUANT_F16:
        return model->router_wq != NULL;
    case COLIBRI_QUANT_Q8:
        return model->router_wq != NULL && model->router_scale != NULL;
    default:
        return 0;
    }
}

/* x . Wg[e] accumulated in fp32 in index order; quantised weights are dequantised to fp32
 * first (fp16 exactly; int8 as (float)q * scale[e]), which colibri/reference/moe.py mirrors. */
static float router_dot(const colibri_model_t *model, int32_t e, const float *x, size_t d)
{
    float acc = 0.0f;
    if (model->router_scheme == COLIBRI_QUANT_F16) {
        const uint16_t *wq = (const uint16_t *)model->router_wq + (size_t)e * d;
        for (size_t i = 0; i < d; i++) {
            acc += x[i] * colibri_f16_to_f32(wq[i]);
        }
    } else if (model->router_scheme == COLIBRI_QUANT_Q8) {
        const int8_t *wq = (const int8_t *)model->router_wq + (size_t)e * d;
        const float s = model->router_scale[e];
        for (size_t i = 0; i < d; i++) {
            acc += x[i] * ((float)wq[i] * s);
        }
    } else {
        const float *wg = model->router_w + (size_t)e * d;
        for (size_t i = 0; i < d; i++) {
            acc += x[i] * wg[i];
        }
    }
    return acc;
}

colibri_status colibri_route(const colibri_model_t *model, const float *input,
                             int32_t batch_seq_len, int32_t top_k, int32_t *expert_ids,
                             float *gates, float *route_temp)
{
    if (model == NULL || input == NULL || expert_ids == NULL || gates == NULL ||
        batch_seq_len < 0 || !colibri_router_weights_ok(model)) {
        return COLIBRI_ERR_ARG;
    }
    colibri_status st = check_topk(model->n_experts, top_k);
    if (st != COLIBRI_OK) {
        return st;
    }
    const int32_t n_exp = model->n_experts;
    const size_t d = (size_t)model->d_model;
    const float *bias = (model->flags & COLIBRI_FLAG_ROUTER_BIAS) ? model->router_b : NULL;

    for (int32_t t = 0; t < batch_seq_len; t++) {
        const float *x = input + (size_t)t * d;
        for (size_t i = 0; i < d; i++) {
            if (!isfinite(x[i])) {
                return COLIBRI_ERR_NAN;
            }
        }
        int32_t *ids = expert_ids + (size_t)t * (size_t)top_k;
        float *g = gates + (size_t)t * (size_t)top_k;
        route_state rs;
        route_begin(&rs, top_k, ids, g);
        for (int32_t e = 0; e < n_exp; e++) {
            const float acc = router_dot(model, e, x, d);
            float logit = (bias != NULL) ? acc + bias[e] : acc;
            if (!isfinite(logit)) {
                return COLIBRI_ERR_NAN;
            }
            route_push(&rs, e, logit);
        }
        float lse = route_finish(&rs);
        if (route_temp != NULL) {
            route_temp[t] = lse;
        }
        if (model->flags & COLIBRI_FLAG_NORM_TOPK) {
            float total = 0.0f;
            for (int32_t j = 0; j < top_k; j++) {
                total += g[j];
            }
            for (int32_t j = 0; j < top_k; j++) {
                g[j] /= total;
            }
        }
    }
    return COLIBRI_OK;
}
