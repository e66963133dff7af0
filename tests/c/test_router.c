/**
 * @file test_router.c
 * @brief Router tests: top-k order and ties, the blocked softmax vs a two-pass softmax in
 *        double, the log-sum-exp in route_temp, rows of several blocks, NaN/Inf and top-k
 *        validation, the model router.
 */
#include "colibri.h"
#include "test_harness.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Brute force: index of the j-th best (descending, ties lower index first) by selection. */
static void brute_topk(const float *logits, int32_t n, int32_t k, int32_t *ids)
{
    unsigned char used[1024];
    memset(used, 0, sizeof(used));
    for (int32_t j = 0; j < k; j++) {
        int32_t best = -1;
        for (int32_t e = 0; e < n; e++) {
            if (!used[e] && (best < 0 || logits[e] > logits[best])) {
                best = e;
            }
        }
        used[best] = 1;
        ids[j] = best;
    }
}

/* Two-pass softmax probability of expert e and log-sum-exp, in double. */
static double softmax_ref(const float *logits, int32_t n, int32_t e, double *lse)
{
    double m = logits[0];
    for (int32_t i = 1; i < n; i++) {
        m = logits[i] > m ? logits[i] : m;
    }
    double s = 0.0;
    for (int32_t i = 0; i < n; i++) {
        s += exp((double)logits[i] - m);
    }
    if (lse != NULL) {
        *lse = m + log(s);
    }
    return exp((double)logits[e] - m) / s;
}

static void check_tokens(const float *logits, int32_t t, int32_t n, int32_t k)
{
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(t * k));
    float *gates = malloc(sizeof(float) * (size_t)(t * k));
    float *temp = malloc(sizeof(float) * (size_t)t);
    int32_t ref[1024];
    CHECK_STATUS(COLIBRI_OK, colibri_route_gate(logits, t, n, k, ids, gates, temp));
    int ids_ok = 1, gates_ok = 1, lse_ok = 1;
    for (int32_t i = 0; i < t; i++) {
        const float *row = logits + (size_t)i * (size_t)n;
        brute_topk(row, n, k, ref);
        double lse = 0.0;
        for (int32_t j = 0; j < k; j++) {
            if (ids[i * k + j] != ref[j]) {
                ids_ok = 0;
            }
            double g = softmax_ref(row, n, ref[j], &lse);
            if (fabs(g - gates[i * k + j]) > 1e-6) {
                gates_ok = 0;
            }
        }
        if (fabs(lse - temp[i]) > 1e-5 * (1.0 + fabs(lse))) {
            lse_ok = 0;
        }
    }
    CHECK(ids_ok);
    CHECK(gates_ok);
    CHECK(lse_ok);
    free(ids);
    free(gates);
    free(temp);
}

static void test_ties(void)
{
    const float equal[5] = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
    int32_t ids[5];
    float gates[5];
    float temp[1];
    CHECK_STATUS(COLIBRI_OK, colibri_route_gate(equal, 1, 5, 3, ids, gates, temp));
    CHECK_INT(0, ids[0]);
    CHECK_INT(1, ids[1]);
    CHECK_INT(2, ids[2]);
    CHECK_NEAR(0.2, gates[0], 1e-6);
    CHECK_NEAR(0.2, gates[2], 1e-6);
    CHECK_NEAR(0.5 + log(5.0), temp[0], 1e-6);

    const float partial[6] = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f, 3.0f};
    CHECK_STATUS(COLIBRI_OK, colibri_route_gate(partial, 1, 6, 4, ids, gates, temp));
    CHECK_INT(1, ids[0]);
    CHECK_INT(3, ids[1]);
    CHECK_INT(5, ids[2]);
    CHECK_INT(2, ids[3]);
    CHECK(gates[0] == gates[1] && gates[1] == gates[2] && gates[2] > gates[3]);
}

static void test_k_extremes(void)
{
    float logits[3 * 7];
    rng_seed(7);
    for (int i = 0; i < 3 * 7; i++) {
        logits[i] = rng_float(-3.0f, 3.0f);
    }
    logits[4] = logits[2];         /* a tie inside a full sort */
    check_tokens(logits, 3, 7, 7); /* k = E */
    check_tokens(logits, 3, 7, 1); /* k = 1 */

    int32_t ids[7];
    float gates[7];
    CHECK_STATUS(COLIBRI_OK, colibri_route_gate(logits, 1, 7, 7, ids, gates, NULL));
    float total = 0.0f;
    for (int j = 0; j < 7; j++) {
        total += gates[j];
    }
    CHECK_NEAR(1.0, total, 1e-6); /* k = E: all the probability mass */
}

static void test_large(void)
{
    enum { T = 16, E = 256, K = 8 };
    static float logits[T * E];
    rng_seed(42);
    for (int i = 0; i < T * E; i++) {
        logits[i] = rng_float(-8.0f, 8.0f);
    }
    /* quantised values make ties frequent in one token */
    for (int e = 0; e < E; e++) {
        logits[3 * E + e] = (float)(int)rng_float(0.0f, 6.0f);
    }
    check_tokens(logits, T, E, K);
    check_tokens(logits, T, E, COLIBRI_MAX_TOP_K);
}

/* Rows longer than the router's block of 64 logits: the max rising in a later block (the sum
 * is rescaled), ties across a block boundary, and colibri_route (logits computed block by block
 * on the stack) returning the same bits as colibri_route_gate. */
static void test_blocks(void)
{
    enum { T = 4, E = 150, D = 3, K = 5 };
    static float logits[T * E], wg[E * D], x[T * D];
    rng_seed(1234);
    for (int i = 0; i < T * E; i++) {
        logits[i] = rng_float(-4.0f, 4.0f);
    }
    for (int e = 0; e < E; e++) {
        logits[e] = -4.0f + 0.05f * (float)e; /* token 0: every block raises the max */
        logits[E + e] = (e == 63 || e == 64 || e == 128) ? 5.0f : logits[E + e];
    }
    check_tokens(logits, T, E, K);
    check_tokens(logits, T, E, 1);
    int32_t ids[K];
    float gates[K];
    CHECK_STATUS(COLIBRI_OK, colibri_route_gate(logits + E, 1, E, K, ids, gates, NULL));
    CHECK_INT(63, ids[0]);
    CHECK_INT(64, ids[1]);
    CHECK_INT(128, ids[2]);
    logits[2 * E + 140] = NAN; /* in the last block */
    CHECK_STATUS(COLIBRI_ERR_NAN, colibri_route_gate(logits + 2 * E, 1, E, K, ids, gates, NULL));

    for (int i = 0; i < E * D; i++) {
        wg[i] = rng_float(-1.0f, 1.0f);
    }
    for (int i = 0; i < T * D; i++) {
        x[i] = rng_float(-1.0f, 1.0f);
    }
    for (int t = 0; t < T; t++) {
        for (int e = 0; e < E; e++) {
            float acc = 0.0f;
            for (int i = 0; i < D; i++) {
                acc += x[t * D + i] * wg[e * D + i];
            }
            logits[t * E + e] = acc;
        }
    }
    colibri_model_t m;
    memset(&m, 0, sizeof(m));
    m.n_experts = E;
    m.d_model = D;
    m.d_ff = 4;
    m.top_k = K;
    m.router_w = wg;
    int32_t ids_a[T * K], ids_b[T * K];
    float gates_a[T * K], gates_b[T * K], temp_a[T], temp_b[T];
    CHECK_STATUS(COLIBRI_OK, colibri_route_gate(logits, T, E, K, ids_a, gates_a, temp_a));
    CHECK_STATUS(COLIBRI_OK, colibri_route(&m, x, T, K, ids_b, gates_b, temp_b));
    int same_ids = memcmp(ids_a, ids_b, sizeof(ids_a)) == 0;
    CHECK(same_ids);
    CHECK_FLOATS_EQ(gates_a, gates_b, T * K);
    CHECK_FLOATS_EQ(temp_a, temp_b, T);
}

static void test_errors(void)
{
    float logits[4] = {0.1f, 0.2f, 0.3f, 0.4f};
    int32_t ids[8];
    float gates[8];
    float temp[2];
    CHECK_STATUS(COLIBRI_ERR_TOPK, colibri_route_gate(logits, 1, 4, 0, ids, gates, temp));
    CHECK_STATUS(COLIBRI_ERR_TOPK, colibri_route_gate(logits, 1, 4, -1, ids, gates, temp));
    CHECK_STATUS(COLIBRI_ERR_TOPK, colibri_route_gate(logits, 1, 4, 5, ids, gates, temp));
    static float wide[100];
    int32_t wide_ids[100];
    float wide_gates[100];
    CHECK_STATUS(COLIBRI_ERR_TOPK, colibri_route_gate(wide, 1, 100, COLIBRI_MAX_TOP_K + 1, wide_ids,
                                                      wide_gates, NULL));
    CHECK_STATUS(COLIBRI_ERR_ARG, colibri_route_gate(NULL, 1, 4, 2, ids, gates, temp));
    CHECK_STATUS(COLIBRI_ERR_ARG, colibri_route_gate(logits, 1, 4, 2, NULL, gates, temp));
    CHECK_STATUS(COLIBRI_ERR_ARG, colibri_route_gate(logits, -1, 4, 2, ids, gates, temp));
    CHECK_STATUS(COLIBRI_OK, colibri_route_gate(logits, 0, 4, 2, ids, gates, temp));

    logits[2] = NAN;
    CHECK_STATUS(COLIBRI_ERR_NAN, colibri_route_gate(logits, 1, 4, 2, ids, gates, temp));
    logits[2] = INFINITY;
    CHECK_STATUS(COLIBRI_ERR_NAN, colibri_route_gate(logits, 1, 4, 2, ids, gates, temp));
    logits[2] = -INFINITY;
    CHECK_STATUS(COLIBRI_ERR_NAN, colibri_route_gate(logits, 1, 4, 2, ids, gates, temp));
}

/* The model router: logits computed here in the documented order must give identical
 * choices and gates through colibri_route_gate. */
static void test_model_router(uint32_t flags)
{
    enum { T = 9, E = 12, D = 10, K = 3 };
    static float wg[E * D], bias[E], x[T * D], logits[T * E];
    rng_seed(99u + flags);
    for (int i = 0; i < E * D; i++) {
        wg[i] = rng_float(-1.0f, 1.0f);
    }
    for (int i = 0; i < E; i++) {
        bias[i] = rng_float(-0.5f, 0.5f);
    }
    for (int i = 0; i < T * D; i++) {
        x[i] = rng_float(-1.0f, 1.0f);
    }
    colibri_model_t m;
    memset(&m, 0, sizeof(m));
    m.n_experts = E;
    m.d_model = D;
    m.d_ff = 4;
    m.top_k = K;
    m.flags = flags;
    m.router_w = wg;
    m.router_b = bias;
    for (int t = 0; t < T; t++) {
        for (int e = 0; e < E; e++) {
            float acc = 0.0f;
            for (int i = 0; i < D; i++) {
                acc += x[t * D + i] * wg[e * D + i];
            }
            logits[t * E + e] = (flags & COLIBRI_FLAG_ROUTER_BIAS) ? acc + bias[e] : acc;
        }
    }
    int32_t ids_a[T * K], ids_b[T * K];
    float gates_a[T * K], gates_b[T * K], temp_a[T], temp_b[T];
    CHECK_STATUS(COLIBRI_OK, colibri_route_gate(logits, T, E, K, ids_a, gates_a, temp_a));
    CHECK_STATUS(COLIBRI_OK, colibri_route(&m, x, T, K, ids_b, gates_b, temp_b));
    int same_ids = memcmp(ids_a, ids_b, sizeof(ids_a)) == 0;
    CHECK(same_ids);
    CHECK_FLOATS_EQ(temp_a, temp_b, T);
    if (flags & COLIBRI_FLAG_NORM_TOPK) {
        int ok = 1;
        for (int t = 0; t < T; t++) {
            float s = 0.0f;
            for (int j = 0; j < K; j++) {
                s += gates_a[t * K + j];
            }
            for (int j = 0; j < K; j++) {
                if (gates_b[t * K + j] != gates_a[t * K + j] / s) {
                    ok = 0;
                }
            }
        }
        CHECK(ok);
    } else {
        CHECK_FLOATS_EQ(gates_a, gates_b, T * K);
    }
    x[5] = NAN;
    CHECK_STATUS(COLIBRI_ERR_NAN, colibri_route(&m, x, T, K, ids_b, gates_b, temp_b));
    x[5] = -INFINITY;
    CHECK_STATUS(COLIBRI_ERR_NAN, colibri_route(&m, x, T, K, ids_b, gates_b, temp_b));
    x[5] = 0.0f;
    CHECK_STATUS(COLIBRI_ERR_TOPK, colibri_route(&m, x, T, 0, ids_b, gates_b, temp_b));
    CHECK_STATUS(COLIBRI_ERR_TOPK, colibri_route(&m, x, T, E + 1, ids_b, gates_b, temp_b));
    CHECK_STATUS(COLIBRI_ERR_ARG, colibri_route(NULL, x, T, K, ids_b, gates_b, temp_b));

    /* overflowing logits are caught too */
    x[0] = 3e38f;
    x[1] = 3e38f;
    wg[0] = 10.0f;
    wg[1] = 10.0f;
    CHECK_STATUS(COLIBRI_ERR_NAN, colibri_route(&m, x, T, K, ids_b, gates_b, temp_b));
}

/* A NaN, +inf or -inf logit is refused wherever it sits: among the first k, in a group of four,
 * in the last 1..3 of a block, in the second block (the softmax sum finds NaN and +inf, the
 * rare x < -87 branch -inf); a finite logit 87 or more below the max (l - m overflowing to
 * -inf included) is not an error and gets no weight. */
static void test_nonfinite_everywhere(void)
{
    enum { E = 71 };
    static float row[E];
    int32_t ids[3];
    float gates[3];
    float lse;
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    rng_seed(7u);
    for (int32_t k = 1; k <= 3; k++) {
        for (int32_t at = 0; at < E; at++) {
            for (int32_t b = 0; b < 3; b++) {
                for (int32_t e = 0; e < E; e++) {
                    row[e] = rng_float(-3.0f, 3.0f);
                }
                row[at] = bad[b];
                CHECK_STATUS(COLIBRI_ERR_NAN, colibri_route_gate(row, 1, E, k, ids, gates, &lse));
            }
        }
        for (int32_t e = 0; e < E; e++) {
            row[e] = rng_float(-3.0f, 3.0f);
        }
        row[E - 1] = 3e38f;
        row[5] = -3e38f; /* l - m = -inf: finite logits, weight 0 */
        row[40] = -100.0f;
        CHECK_STATUS(COLIBRI_OK, colibri_route_gate(row, 1, E, k, ids, gates, &lse));
        CHECK_INT(E - 1, ids[0]);
        CHECK(gates[0] == 1.0f);
        CHECK(lse == 3e38f);
    }
}

int main(void)
{
    test_ties();
    test_k_extremes();
    test_large();
    test_blocks();
    test_errors();
    test_nonfinite_everywhere();
    test_model_router(0u);
    test_model_router(COLIBRI_FLAG_ROUTER_BIAS);
    test_model_router(COLIBRI_FLAG_NORM_TOPK | COLIBRI_FLAG_ROUTER_BIAS);
    return test_summary();
}
