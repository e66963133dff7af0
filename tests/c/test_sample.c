/**
 * @file test_sample.c
 * @brief colibri_sample's top-k by partial selection against an oracle that ranks the whole
 *        vocabulary (an insertion sort, written independently of sample.c's radix sort):
 *        the same k ids in the same order, and the same token for the same seed, over random
 *        vocabularies with many ties, every top-k from 1 to n and top-p below and at 1; and the
 *        whole-vocabulary ranking (top-k 0: sample.c's radix sort) on signed zeros, subnormals
 *        and the largest finite values.
 */
#include "colibri_internal.h"
#include "colibri_math.h"
#include "colibri_transformer.h"
#include "test_harness.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_N 1500

static float g_logits[MAX_N];
static int32_t g_rank[MAX_N];
static int32_t g_ids[MAX_N];
static float g_vals[MAX_N];
static float g_prob[MAX_N];
static unsigned char g_work[COLIBRI_SAMPLE_WORKSPACE_BYTES(MAX_N)] __attribute__((aligned(16)));

/* Every id, best first: the higher logit, ties to the lower id. */
static void oracle_rank(const float *x, int32_t n, int32_t *rank)
{
    for (int32_t i = 0; i < n; i++) {
        int32_t j = i;
        while (j > 0 && x[rank[j - 1]] < x[i]) {
            rank[j] = rank[j - 1];
            j--;
        }
        rank[j] = i;
    }
}

/* The documented sampler over the oracle's ranking. */
static int32_t oracle_sample(const float *x, int32_t n, const colibri_sampler_t *s,
                             colibri_rng_t *rng)
{
    oracle_rank(x, n, g_rank);
    const int32_t keep = (s->top_k > 0 && s->top_k < n) ? s->top_k : n;
    const float best = x[g_rank[0]];
    float total = 0.0f;
    for (int32_t j = 0; j < keep; j++) {
        g_prob[j] = colibri_expf((x[g_rank[j]] - best) * (1.0f / s->temperature));
        total += g_prob[j];
    }
    int32_t m = keep;
    if (s->top_p < 1.0f) {
        float cum = 0.0f;
        for (int32_t j = 0; j < keep; j++) {
            cum += g_prob[j];
            if (cum >= s->top_p * total) {
                m = j + 1;
                break;
            }
        }
        total = cum;
    }
    const float u = colibri_rng_uniform(rng) * total;
    float cum = 0.0f;
    for (int32_t j = 0; j < m; j++) {
        cum += g_prob[j];
        if (u < cum) {
            return g_rank[j];
        }
    }
    return g_rank[m - 1];
}

static void fill(int32_t n, int32_t levels)
{
    for (int32_t i = 0; i < n; i++) {
        /* few distinct values: ties everywhere, also across the k-th place */
        g_logits[i] = (float)(int32_t)(rng_u32() % (uint32_t)levels) * 0.25f - 3.0f;
    }
}

static void test_topk_matches_ranking(void)
{
    static const int32_t sizes[] = {1, 2, 3, 5, 8, 17, 64, 129, 255, 256, 257, 1000, MAX_N};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        const int32_t n = sizes[s];
        for (int32_t levels = 2; levels <= 4096; levels *= 8) {
            fill(n, levels);
            oracle_rank(g_logits, n, g_rank);
            for (int32_t k = 1; k <= n; k += (n < 20) ? 1 : n / 7) {
                colibri_topk_f32(g_logits, n, k, g_ids, g_vals);
                int same = memcmp(g_ids, g_rank, (size_t)k * sizeof(int32_t)) == 0;
                for (int32_t j = 0; j < k; j++) {
                    same = same && g_vals[j] == g_logits[g_rank[j]];
                }
                CHECK(same);
            }
        }
    }
}

static void test_sample_matches_oracle(void)
{
    static const int32_t sizes[] = {1, 7, 40, 41, 300, MAX_N};
    static const int32_t top_ks[] = {0, 1, 2, 40, 41, 299, MAX_N + 5};
    static const float top_ps[] = {1.0f, 0.95f, 0.5f, 0.01f};
    static const float temps[] = {0.3f, 1.0f, 2.5f};
    int32_t cases = 0;
    for (size_t a = 0; a < sizeof sizes / sizeof sizes[0]; a++) {
        const int32_t n = sizes[a];
        fill(n, (a & 1u) ? 9 : 1 << 20);
        for (size_t b = 0; b < sizeof top_ks / sizeof top_ks[0]; b++) {
            for (size_t c = 0; c < sizeof top_ps / sizeof top_ps[0]; c++) {
                for (size_t d = 0; d < sizeof temps / sizeof temps[0]; d++) {
                    const colibri_sampler_t sm = {temps[d], top_ks[b], top_ps[c]};
                    for (uint64_t seed = 0; seed < 8; seed++) {
                        colibri_rng_t r1, r2;
                        colibri_rng_seed(&r1, seed * 7919u + (uint64_t)n);
                        r2 = r1;
                        int32_t got = -1;
                        CHECK_STATUS(COLIBRI_OK,
                                     colibri_sample(g_logits, n, &sm, &r1, g_work, &got));
                        CHECK_INT(oracle_sample(g_logits, n, &sm, &r2), got);
                        CHECK(r1.state == r2.state);
                        cases++;
                    }
                }
            }
        }
    }
    CHECK_INT(6 * 7 * 4 * 3 * 8, cases);
}

/* The whole-vocabulary ranking (top-k 0) on the values a float sort gets wrong: -0.0 and +0.0
 * (equal: they tie, the lower id first), subnormals, the largest finite values of both signs and
 * long runs of ties; a temperature so high that every rank is drawn, at every top-p. */
static void test_full_ranking_edge_values(void)
{
    static const float values[] = {-0.0f, 0.0f, 1e-45f,          -1e-45f,          1.17549435e-38f,
                                   -2.5f, 2.5f, 3.40282347e+38f, -3.40282347e+38f, 1.0f,
                                   -1.0f};
    const int32_t nv = (int32_t)(sizeof values / sizeof values[0]);
    static const float top_ps[] = {1.0f, 0.999f, 0.6f};
    static const int32_t sizes[] = {2, 11, 257, MAX_N};
    for (size_t a = 0; a < sizeof sizes / sizeof sizes[0]; a++) {
        const int32_t n = sizes[a];
        for (int32_t i = 0; i < n; i++) {
            g_logits[i] = values[rng_u32() % (uint32_t)nv];
        }
        g_logits[n / 2] = 0.0f; /* not all in one byte's bucket */
        for (size_t c = 0; c < sizeof top_ps / sizeof top_ps[0]; c++) {
            const colibri_sampler_t sm = {1e38f, 0, top_ps[c]};
            for (uint64_t seed = 0; seed < 64; seed++) {
                colibri_rng_t r1, r2;
                colibri_rng_seed(&r1, seed + 1000u * (uint64_t)n);
                r2 = r1;
                int32_t got = -1;
                CHECK_STATUS(COLIBRI_OK, colibri_sample(g_logits, n, &sm, &r1, g_work, &got));
                CHECK_INT(oracle_sample(g_logits, n, &sm, &r2), got);
            }
        }
    }
}

int main(void)
{
    rng_seed(0x5A3C9E1Du);
    (void)rng_float;
    test_topk_matches_ranking();
    test_sample_matches_oracle();
    test_full_ranking_edge_values();
    return test_summary();
}
