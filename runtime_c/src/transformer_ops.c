/**
 * @file transformer_ops.c
 * @brief Portable fp32 transformer operators (colibri_transformer.h): RMSNorm, linear, RoPE,
 *        causal GQA attention over a static KV cache, SwiGLU, and the token sampler. No heap,
 *        no static state: everything lives in caller memory.
 */
#include "colibri_math.h"
#include "colibri_quant.h"
#include "colibri_transformer.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>

void colibri_rmsnorm_f32(const float *x, const float *w, float *y, int32_t n, float eps)
{
    float ss = 0.0f;
    for (int32_t i = 0; i < n; i++) {
        ss += x[i] * x[i];
    }
    const float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int32_t i = 0; i < n; i++) {
        y[i] = w[i] * (x[i] * inv);
    }
}

void colibri_linear_f32(const float *x, const float *w, const float *b, float *y, int32_t n_in,
                        int32_t n_out)
{
    /* colibri_matvec_f32 (kernels_q.c, per-ISA paths): acc += w * x in i order, then + b */
    colibri_matvec_f32(w, x, y, n_out, n_in);
    if (b != NULL) {
        for (int32_t o = 0; o < n_out; o++) {
            y[o] = y[o] + b[o];
        }
    }
}

void colibri_clip_f32(float *x, int32_t n, float limit)
{
    for (int32_t i = 0; i < n; i++) {
        if (x[i] > limit) {
            x[i] = limit;
        } else if (x[i] < -limit) {
            x[i] = -limit;
        }
    }
}

void colibri_rope_f32(float *x, int32_t n_heads, int32_t head_dim, const float *cos,
                      const float *sin)
{
    const int32_t half = head_dim / 2;
    for (int32_t h = 0; h < n_heads; h++) {
        float *r = x + (size_t)h * (size_t)head_dim;
        for (int32_t i = 0; i < half; i++) {
            const float a = r[i];
            const float b = r[i + half];
            r[i] = a * cos[i] - b * sin[i];
            r[i + half] = b * cos[i] + a * sin[i];
        }
    }
}

colibri_status colibri_attention_f32(const colibri_attention_shape_t *shape, int32_t pos,
                                     const float *q, const float *k, const float *v, float *k_cache,
                                     float *v_cache, float *scores, float *out)
{
    const int32_t hd = shape->head_dim;
    const int32_t ctx = shape->max_context;
    if (pos < 0 || pos >= ctx) {
        return COLIBRI_ERR_NOMEM; /* context overflow: the cache has no row for pos */
    }
    for (int32_t g = 0; g < shape->n_kv_heads; g++) {
        float *kc = k_cache + ((size_t)g * (size_t)ctx + (size_t)pos) * (size_t)hd;
        float *vc = v_cache + ((size_t)g * (size_t)ctx + (size_t)pos) * (size_t)hd;
        for (int32_t i = 0; i < hd; i++) {
            kc[i] = k[(size_t)g * (size_t)hd + (size_t)i];
            vc[i] = v[(size_t)g * (size_t)hd + (size_t)i];
        }
    }
    const int32_t first =
        (shape->window > 0 && pos - shape->window + 1 > 0) ? pos - shape->window + 1 : 0;
    const int32_t group = shape->n_heads / shape->n_kv_heads;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int32_t h = 0; h < shape->n_heads; h++) {
        const float *qh = q + (size_t)h * (size_t)hd;
        const size_t base = (size_t)(h / group) * (size_t)ctx;
        float max = -INFINITY;
        /* q . k_t for every t: each a sum in ascending i from 0.0f (colibri_matvec_f32's bits on
         * every kernel path), the positions side by side in SIMD lanes where the CPU has them */
        colibri_matvec_f32(k_cache + (base + (size_t)first) * (size_t)hd, qh, scores + first,
                           pos - first + 1, hd);
        for (int32_t t = first; t <= pos; t++) {
            scores[t] = scores[t] * scale;
            max = scores[t] > max ? scores[t] : max;
        }
        float sum = 0.0f;
        for (int32_t t = first; t <= pos; t++) {
            scores[t] = colibri_expf(scores[t] - max);
            sum += scores[t];
        }
        float *oh = out + (size_t)h * (size_t)hd;
        for (int32_t i = 0; i < hd; i++) {
            oh[i] = 0.0f;
        }
        for (int32_t t = first; t <= pos; t++) {
            colibri_axpy_f32(oh, scores[t] / sum, v_cache + (base + (size_t)t) * (size_t)hd, hd);
        }
    }
    return COLIBRI_OK;
}

void colibri_swiglu_f32(const float *x, const float *w_gate, const float *w_up, const float *w_down,
                        float *y, int32_t d, int32_t f, float *scratch)
{
    float *g = scratch;
    float *u = scratch + f;
    colibri_linear_f32(x, w_gate, NULL, g, d, f);
    colibri_linear_f32(x, w_up, NULL, u, d, f);
    colibri_silu_mul_f32(g, u, (size_t)f);
    colibri_linear_f32(g, w_down, NULL, y, f, d);
}

/* -- sampling ----------------------------------------------------------------------------- */

/* murmur3's 32-bit finaliser: a bijective mix using 32-bit multiplies only (some cores, the
 * LX106 among them, have no usable 64-bit multiply). */
static uint32_t mix32(uint32_t h)
{
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    h ^= h >> 16;
    return h;
}

void colibri_rng_seed(colibri_rng_t *rng, uint64_t seed)
{
    const uint32_t lo = mix32((uint32_t)seed ^ 0x9E3779B9u);
    const uint32_t hi = mix32((uint32_t)(seed >> 32) ^ lo ^ 0x7F4A7C15u);
    const uint64_t z = ((uint64_t)hi << 32) | (uint64_t)lo;
    rng->state = (z != 0u) ? z : 0x2545F4914F6CDD1Dull; /* xorshift needs a non-zero state */
}

float colibri_rng_uniform(colibri_rng_t *rng)
{
    /* xorshift64 (13, 7, 17): shifts and xors only; the top 24 bits give the float */
    uint64_t x = rng->state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    rng->state = x;
    return (float)(uint32_t)(x >> 40) * (1.0f / 16777216.0f);
}

/* "a ranks before b": the higher logit first, ties to the lower token id. */
static int ranks_before(const float *logits, int32_t a, int32_t b)
{
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
}

static void sift_down(const float *logits, int32_t *idx, int32_t root, int32_t n)
{
    for (;;) {
        int32_t child = 2 * root + 1;
        if (child >= n) {
            return;
        }
        /* min-heap on rank: the worst-ranked token at the root, so the sort ends best first */
        if (child + 1 < n && ranks_before(logits, idx[child], idx[child + 1])) {
            child++;
        }
        if (!ranks_before(logits, idx[root], idx[child])) {
            return;
        }
        const int32_t t = idx[root];
        idx[root] = idx[child];
        idx[child] = t;
        root = child;
    }
}

/* Heap sort of token ids, best first (in place, O(n log n), no allocation). */
static void sort_by_rank(const float *logits, int32_t *idx, int32_t n)
{
    for (int32_t i = n / 2 - 1; i >= 0; i--) {
        sift_down(logits, idx, i, n);
    }
    for (int32_t end = n - 1; end > 0; end--) {
        const int32_t t = idx[0];
        idx[0] = idx[end];
        idx[end] = t;
        sift_down(logits, idx, 0, end);
    }
}

colibri_status colibri_sample(const float *logits, int32_t n, const colibri_sampler_t *sampler,
                              colibri_rng_t *rng, void *workspace, int32_t *out_token)
{
    if (logits == NULL || sampler == NULL || out_token == NULL || n <= 0 ||
        !(sampler->temperature >= 0.0f) || sampler->top_k < 0 || !(sampler->top_p > 0.0f) ||
        sampler->top_p > 1.0f) {
        return COLIBRI_ERR_ARG;
    }
    const int32_t best = colibri_argmax_f32(logits, n);
    if (best < 0) {
        return COLIBRI_ERR_NAN;
    }
    if (sampler->temperature == 0.0f) {
        *out_token = best;
        return COLIBRI_OK;
    }
    if (rng == NULL || workspace == NULL) {
        return COLIBRI_ERR_ARG;
    }
    int32_t *idx = (int32_t *)workspace;
    float *prob = (float *)(void *)((unsigned char *)workspace + COLIBRI_ALIGN16(4u * (size_t)n));
    for (int32_t i = 0; i < n; i++) {
        idx[i] = i;
    }
    sort_by_rank(logits, idx, n);
    const int32_t keep = (sampler->top_k > 0 && sampler->top_k < n) ? sampler->top_k : n;
    const float inv_t = 1.0f / sampler->temperature;
    float total = 0.0f;
    for (int32_t j = 0; j < keep; j++) {
        prob[j] = colibri_expf((logits[idx[j]] - logits[best]) * inv_t);
        total += prob[j];
    }
    int32_t m = keep;
    if (sampler->top_p < 1.0f) {
        float cum = 0.0f;
        for (int32_t j = 0; j < keep; j++) {
            cum += prob[j];
            if (cum >= sampler->top_p * total) {
                m = j + 1;
                break;
            }
        }
        total = cum;
    }
    const float u = colibri_rng_uniform(rng) * total;
    float cum = 0.0f;
    int32_t pick = m - 1;
    for (int32_t j = 0; j < m; j++) {
        cum += prob[j];
        if (u < cum) {
            pick = j;
            break;
        }
    }
    *out_token = idx[pick];
    return COLIBRI_OK;
}
