/**
 * @file sample.c
 * @brief The token sampler of colibri_transformer.h: a seeded xorshift64 generator, and
 *        colibri_sample (greedy, temperature, top-k, top-p). With top-k the k best tokens are
 *        chosen by the router's partial selection (colibri_topk_f32, O(n) plus the insertions)
 *        instead of sorting the whole vocabulary; without top-k every token is ranked by a heap
 *        sort, since top-p then needs the whole distribution in rank order. No heap, no static
 *        state.
 */
#include "colibri_internal.h"
#include "colibri_math.h"
#include "colibri_quant.h"
#include "colibri_transformer.h"

#include <stddef.h>
#include <stdint.h>

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
    const int32_t keep = (sampler->top_k > 0 && sampler->top_k < n) ? sampler->top_k : n;
    if (keep < n) {
        /* the keep best, best first: the same ids in the same order as the full sort gives */
        colibri_topk_f32(logits, n, keep, idx, prob);
    } else {
        for (int32_t i = 0; i < n; i++) {
            idx[i] = i;
        }
        sort_by_rank(logits, idx, n);
    }
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
