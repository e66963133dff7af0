/**
 * @file sample.c
 * @brief The token sampler of colibri_transformer.h: a seeded xorshift64 generator, and
 *        colibri_sample (greedy, temperature, top-k, top-p). With top-k the k best tokens are
 *        chosen by the router's partial selection (colibri_topk_f32, O(n) plus the insertions)
 *        instead of sorting the whole vocabulary; without top-k every token is ranked, since
 *        top-p then needs the whole distribution in rank order: by an LSD radix sort on the
 *        logits' bits (six O(n) passes at most; the heap sort before took O(n log n)), the
 *        same order. No heap, no static state.
 */
#include "colibri_internal.h"
#include "colibri_math.h"
#include "colibri_quant.h"
#include "colibri_transformer.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

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

/* The rank order of a logit as an unsigned key: a higher logit gives a smaller key (IEEE bits
 * made monotonic: negatives inverted, positives with the sign bit set; then complemented), -0.0
 * the key of +0.0 (they compare equal, so they tie). Every logit is finite here. */
static uint32_t rank_key(float v)
{
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    if (b == 0x80000000u) {
        b = 0u;
    }
    b = ((b & 0x80000000u) != 0u) ? ~b : (b | 0x80000000u);
    return ~b;
}

/* Radix of sort_by_rank: 6-bit digits, 64 counts (256 bytes of stack: the sampler runs on MCUs,
 * whose stack guard holds the program's two largest frames). */
#define RANK_DIGIT_BITS 6u
#define RANK_DIGITS (1u << RANK_DIGIT_BITS)

/* Every token id, best first: the higher logit first, ties to the lower token id. An LSD radix
 * sort on rank_key, a digit per pass (stable, so ties keep ascending ids), O(n) per pass, a pass
 * skipped where every key has the same digit; tmp: n ids of scratch. No allocation. */
static void sort_by_rank(const float *logits, int32_t *idx, int32_t *tmp, int32_t n)
{
    uint32_t start[RANK_DIGITS];
    int32_t *src = idx;
    int32_t *dst = tmp;
    for (int32_t i = 0; i < n; i++) {
        idx[i] = i;
    }
    for (uint32_t shift = 0; shift < 32u; shift += RANK_DIGIT_BITS) {
        memset(start, 0, sizeof start);
        for (int32_t j = 0; j < n; j++) {
            start[(rank_key(logits[src[j]]) >> shift) & (RANK_DIGITS - 1u)]++;
        }
        if (start[(rank_key(logits[src[0]]) >> shift) & (RANK_DIGITS - 1u)] == (uint32_t)n) {
            continue; /* one bucket: this digit orders nothing */
        }
        uint32_t at = 0;
        for (uint32_t d = 0; d < RANK_DIGITS; d++) {
            const uint32_t c = start[d];
            start[d] = at;
            at += c;
        }
        for (int32_t j = 0; j < n; j++) {
            dst[start[(rank_key(logits[src[j]]) >> shift) & (RANK_DIGITS - 1u)]++] = src[j];
        }
        int32_t *const t = src;
        src = dst;
        dst = t;
    }
    if (src != idx) {
        memcpy(idx, src, sizeof(int32_t) * (size_t)n);
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
        sort_by_rank(logits, idx, (int32_t *)(void *)prob, n); /* prob: scratch until filled */
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
