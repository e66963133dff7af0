/**
 * @file test_runtime.c
 * @brief Runtime tests: sparse forward vs a naive per-token loop (bit-exact), chunking,
 *        cache policies and their counters, static-model validation, colibri_forward
 *        argument checks, colibri_strerror, and colibri_init on seed-layout and container
 *        files written here (valid files and every error path, including hostile headers,
 *        overlapping tensors, flipped bits (CRC-32) and NaN / Inf weights).
 */
#define _POSIX_C_SOURCE 200809L

#include "colibri.h"
#include "test_harness.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------------ */
/* Random test models                                                                          */

typedef struct {
    colibri_model_t base; /* descriptor before colibri_init_static */
    float *buf;
    colibri_expert_weights_t *stored;
    float *router_w;
    float *router_b;
} test_model;

static void tm_make(test_model *tm, int32_t e, int32_t k, int32_t d, int32_t f,
                    colibri_activation act, uint32_t flags, uint32_t seed)
{
    const size_t per = (size_t)d * (size_t)f * 3u + (size_t)f + (size_t)d;
    const size_t n = (size_t)e * per + (size_t)e * (size_t)d + (size_t)e;
    rng_seed(seed);
    memset(tm, 0, sizeof(*tm));
    tm->buf = malloc(n * sizeof(float));
    tm->stored = calloc((size_t)e, sizeof(colibri_expert_weights_t));
    const float scale = 1.0f / sqrtf((float)d);
    for (size_t i = 0; i < n; i++) {
        tm->buf[i] = rng_float(-1.5f, 1.5f) * scale;
    }
    tm->router_w = tm->buf + (size_t)e * per;
    tm->router_b = tm->router_w + (size_t)e * (size_t)d;
    for (int32_t i = 0; i < e; i++) {
        float *p = tm->buf + (size_t)i * per;
        colibri_expert_weights_t *w = &tm->stored[i];
        w->w1 = p;
        p += (size_t)d * (size_t)f;
        w->w2 = p;
        p += (size_t)d * (size_t)f;
        w->w3 = (flags & COLIBRI_FLAG_GATED) ? p : NULL;
        p += (size_t)d * (size_t)f;
        w->b1 = (flags & COLIBRI_FLAG_EXPERT_BIAS) ? p : NULL;
        p += f;
        w->b2 = (flags & COLIBRI_FLAG_EXPERT_BIAS) ? p : NULL;
    }
    colibri_model_t *m = &tm->base;
    m->n_experts = e;
    m->d_model = d;
    m->d_ff = f;
    m->top_k = k;
    m->activation = act;
    m->flags = flags;
    m->router_w = tm->router_w;
    m->router_b = (flags & COLIBRI_FLAG_ROUTER_BIAS) ? tm->router_b : NULL;
    m->stored = tm->stored;
}

static void tm_free(test_model *tm)
{
    free(tm->buf);
    free(tm->stored);
}

static size_t arena_bytes(const colibri_model_t *m, int32_t n_slots, int32_t max_tokens)
{
    return colibri_workspace_size(m, max_tokens) +
           COLIBRI_SLOT_BYTES(
               n_slots, COLIBRI_EXPERT_FLOATS(m->d_model, m->d_ff, (m->flags & COLIBRI_FLAG_GATED),
                                              (m->flags & COLIBRI_FLAG_EXPERT_BIAS)));
}

/* Static model with an arena of exactly the documented size (ASan catches any overrun). */
static colibri_status tm_init(const test_model *tm, colibri_model_t *m, void **arena,
                              colibri_cache_policy policy, int32_t slots, const int32_t *map,
                              int32_t max_tokens)
{
    colibri_config_t cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.cache_policy = policy;
    cfg.lru_cache_size = slots;
    cfg.expert_sharing_map = map;
    *m = tm->base;
    int32_t n_slots = policy == COLIBRI_CACHE_LRU ? slots : policy == COLIBRI_CACHE_NONE;
    size_t bytes = arena_bytes(m, n_slots, max_tokens);
    *arena = malloc(bytes);
    return colibri_init_static(m, &cfg, *arena, bytes, max_tokens);
}

/* Per token: experts in ascending id order (slot order for repeats), out = sum g * FFN(x). */
static void naive_forward(const colibri_model_t *m, const int32_t *map, const float *x,
                          int32_t t_count, int32_t k, const int32_t *ids, const float *gates,
                          float *out)
{
    const int32_t d = m->d_model;
    float *y = malloc(sizeof(float) * (size_t)d);
    float *scratch = malloc(sizeof(float) * (size_t)m->d_ff * 2u);
    for (int32_t t = 0; t < t_count; t++) {
        float *o = out + (size_t)t * (size_t)d;
        for (int32_t i = 0; i < d; i++) {
            o[i] = 0.0f;
        }
        for (int32_t e = 0; e < m->n_experts; e++) {
            for (int32_t s = 0; s < k; s++) {
                if (ids[t * k + s] != e) {
                    continue;
                }
                const colibri_expert_weights_t *w = &m->stored[map ? map[e] : e];
                colibri_expert_ffn_f32(m, w, x + (size_t)t * (size_t)d, y, 1, scratch);
                for (int32_t i = 0; i < d; i++) {
                    o[i] += gates[t * k + s] * y[i];
                }
            }
        }
    }
    free(y);
    free(scratch);
}

static void random_map(int32_t *map, int32_t e)
{
    for (int32_t i = 0; i < e; i++) {
        map[i] = (i > 0 && rng_u32() % 3u == 0u) ? map[rng_u32() % (uint32_t)i] : i;
    }
}

typedef struct {
    int32_t e, k, d, f;
    colibri_activation act;
    uint32_t flags;
    int32_t t, max_tokens, k_run;
    int use_map;
} fwd_case;

static void check_forward_case(const fwd_case *c, uint32_t seed)
{
    test_model tm;
    tm_make(&tm, c->e, c->k, c->d, c->f, c->act, c->flags, seed);
    int32_t map[64];
    if (c->use_map) {
        random_map(map, c->e);
        for (int32_t i = 0; i < c->e; i++) {
            if (map[i] != i) {
                memset(&tm.stored[i], 0, sizeof(tm.stored[i])); /* must never be read */
            }
        }
    }
    const size_t nx = (size_t)c->t * (size_t)c->d;
    const size_t nk = (size_t)c->t * (size_t)c->k_run;
    float *x = malloc(sizeof(float) * nx);
    float *ref = malloc(sizeof(float) * nx);
    float *out = malloc(sizeof(float) * nx);
    int32_t *ids = malloc(sizeof(int32_t) * nk);
    int32_t *ids0 = malloc(sizeof(int32_t) * nk);
    float *gates = malloc(sizeof(float) * nk);
    float *temp = malloc(sizeof(float) * (size_t)c->t);
    for (size_t i = 0; i < nx; i++) {
        x[i] = rng_float(-2.0f, 2.0f);
    }
    const struct {
        colibri_cache_policy policy;
        int32_t slots;
    } runs[] = {{COLIBRI_CACHE_PINNED, 0},
                {COLIBRI_CACHE_LRU, 1},
                {COLIBRI_CACHE_LRU, 2},
                {COLIBRI_CACHE_LRU, c->e},
                {COLIBRI_CACHE_NONE, 0}};
    for (size_t r = 0; r < sizeof(runs) / sizeof(runs[0]); r++) {
        colibri_model_t m;
        void *arena = NULL;
        colibri_status st = tm_init(&tm, &m, &arena, runs[r].policy, runs[r].slots,
                                    c->use_map ? map : NULL, c->max_tokens);
        CHECK_STATUS(COLIBRI_OK, st);
        if (st == COLIBRI_OK) {
            st = colibri_forward(&m, x, out, c->t, c->d, c->k_run, ids, gates, temp);
            CHECK_STATUS(COLIBRI_OK, st);
            if (r == 0) {
                naive_forward(&m, c->use_map ? map : NULL, x, c->t, c->k_run, ids, gates, ref);
                memcpy(ids0, ids, sizeof(int32_t) * nk);
            }
            CHECK(memcmp(ids0, ids, sizeof(int32_t) * nk) == 0);
            CHECK_FLOATS_EQ(ref, out, nx);
            colibri_stats_t stats;
            CHECK_STATUS(COLIBRI_OK, colibri_get_stats(&m, &stats));
            CHECK_INT(stats.loads, stats.hits + stats.misses);
            if (runs[r].policy == COLIBRI_CACHE_PINNED) {
                CHECK_INT(0, stats.misses + stats.evictions);
            } else if (runs[r].policy == COLIBRI_CACHE_NONE) {
                CHECK_INT(0, stats.hits);
            }
            colibri_cleanup(&m); /* no-op for static models */
        }
        free(arena);
    }
    free(x);
    free(ref);
    free(out);
    free(ids);
    free(ids0);
    free(gates);
    free(temp);
    tm_free(&tm);
}

static void test_sparse_forward_random(void)
{
    const colibri_activation acts[] = {COLIBRI_ACT_GELU, COLIBRI_ACT_GELU_TANH, COLIBRI_ACT_SILU,
                                       COLIBRI_ACT_RELU};
    const fwd_case fixed[] = {
        /* e, k, d, f, act, flags, t, max_tokens, k_run, map */
        {4, 1, 8, 16, COLIBRI_ACT_GELU, COLIBRI_FLAG_EXPERT_BIAS, 1, 4, 1, 0},
        {6, 2, 5, 7, COLIBRI_ACT_SILU, COLIBRI_FLAG_GATED, 11, 4, 2, 0},
        {6, 2, 5, 7, COLIBRI_ACT_SILU, COLIBRI_FLAG_GATED | COLIBRI_FLAG_EXPERT_BIAS, 13, 5, 2, 1},
        {8, 3, 6, 9, COLIBRI_ACT_RELU, COLIBRI_FLAG_NORM_TOPK | COLIBRI_FLAG_ROUTER_BIAS, 17, 4, 3,
         1},
        {8, 2, 6, 9, COLIBRI_ACT_GELU_TANH, COLIBRI_FLAG_EXPERT_BIAS, 10, 3, 5, 0}, /* k>K */
        {5, 5, 4, 3, COLIBRI_ACT_GELU, COLIBRI_FLAG_EXPERT_BIAS, 7, 2, 5, 1},       /* k=E */
        {16, 4, 3, 5, COLIBRI_ACT_SILU, 0u, 33, 7, 4, 1},
    };
    for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++) {
        check_forward_case(&fixed[i], 1000u + (uint32_t)i);
    }
    rng_seed(2024);
    for (uint32_t i = 0; i < 24; i++) {
        fwd_case c;
        c.e = 2 + (int32_t)(rng_u32() % 12u);
        c.k = 1 + (int32_t)(rng_u32() % (uint32_t)(c.e < 4 ? c.e : 4));
        c.d = 1 + (int32_t)(rng_u32() % 9u);
        c.f = 1 + (int32_t)(rng_u32() % 12u);
        c.act = acts[i % 4u];
        c.flags = rng_u32() & 0xFu;
        c.t = 1 + (int32_t)(rng_u32() % 20u);
        c.max_tokens = 1 + (int32_t)(rng_u32() % 8u);
        c.k_run = c.k;
        c.use_map = (int)(i % 2u);
        uint32_t seed = rng_u32();
        check_forward_case(&c, seed);
        rng_seed(seed);
    }
}

/* Generated kernels are used when present. */
static const colibri_model_t *g_kernel_model;
static int g_kernel_calls;

static void counting_kernel(const colibri_expert_weights_t *w, const float *x, float *y, int32_t n,
                            float *scratch)
{
    g_kernel_calls++;
    colibri_expert_ffn_f32(g_kernel_model, w, x, y, n, scratch);
}

static void test_generated_kernels(void)
{
    test_model tm;
    tm_make(&tm, 5, 2, 6, 8, COLIBRI_ACT_GELU, COLIBRI_FLAG_EXPERT_BIAS, 77);
    colibri_expert_kernel_fn kernels[5] = {counting_kernel, NULL, counting_kernel, counting_kernel,
                                           NULL};
    tm.base.kernels = kernels;
    colibri_model_t m;
    void *arena;
    CHECK_STATUS(COLIBRI_OK, tm_init(&tm, &m, &arena, COLIBRI_CACHE_PINNED, 0, NULL, 16));
    g_kernel_model = &m;
    g_kernel_calls = 0;
    enum { T = 12, D = 6, K = 2 };
    float x[T * D], out[T * D], ref[T * D], gates[T * K];
    int32_t ids[T * K];
    rng_seed(5);
    for (int i = 0; i < T * D; i++) {
        x[i] = rng_float(-1.0f, 1.0f);
    }
    CHECK_STATUS(COLIBRI_OK, colibri_forward(&m, x, out, T, D, K, ids, gates, NULL));
    naive_forward(&m, NULL, x, T, K, ids, gates, ref);
    CHECK_FLOATS_EQ(ref, out, T * D);
    int expected_calls = 0;
    for (int e = 0; e < 5; e++) {
        int used = 0;
        for (int p = 0; p < T * K; p++) {
            used |= ids[p] == e;
        }
        expected_calls += used && kernels[e] != NULL;
    }
    /* one chunk (T <= max_tokens): each active expert with a kernel runs exactly once */
    CHECK_INT(expected_calls, g_kernel_calls);

    /* weights baked in: stored may be NULL when every expert has a kernel (PINNED only) */
    colibri_expert_kernel_fn all[5] = {counting_kernel, counting_kernel, counting_kernel,
                                       counting_kernel, counting_kernel};
    colibri_model_t baked = tm.base;
    baked.stored = NULL;
    baked.kernels = all;
    size_t bytes = colibri_workspace_size(&baked, 8);
    CHECK_STATUS(COLIBRI_OK, colibri_init_static(&baked, NULL, arena, bytes, 8));
    colibri_model_t baked_bad = tm.base;
    baked_bad.stored = NULL;
    baked_bad.kernels = kernels;
    CHECK_STATUS(COLIBRI_ERR_ARG, colibri_init_static(&baked_bad, NULL, arena, bytes, 8));
    free(arena);
    tm_free(&tm);
}

/* ------------------------------------------------------------------------------------------ */
/* Loader                                                                                      */

static colibri_stats_t stats_of(const colibri_model_t *m)
{
    colibri_stats_t s;
    colibri_get_stats(m, &s);
    return s;
}

static int weights_equal(const colibri_model_t *m, const colibri_expert_weights_t *a,
                         const colibri_expert_weights_t *b)
{
    size_t df = (size_t)m->d_model * (size_t)m->d_ff;
    return memcmp(a->w1, b->w1, df * 4u) == 0 && memcmp(a->w2, b->w2, df * 4u) == 0 &&
           (a->b1 == NULL) == (b->b1 == NULL) && (a->w3 == NULL) == (b->w3 == NULL) &&
           (a->b1 == NULL || memcmp(a->b1, b->b1, (size_t)m->d_ff * 4u) == 0) &&
           (a->b2 == NULL || memcmp(a->b2, b->b2, (size_t)m->d_model * 4u) == 0) &&
           (a->w3 == NULL || memcmp(a->w3, b->w3, df * 4u) == 0);
}

static void test_lru(void)
{
    test_model tm;
    tm_make(&tm, 4, 2, 3, 5, COLIBRI_ACT_GELU, COLIBRI_FLAG_EXPERT_BIAS | COLIBRI_FLAG_GATED, 11);
    colibri_model_t m;
    void *arena;
    const colibri_expert_weights_t *w = NULL;
    CHECK_STATUS(COLIBRI_OK, tm_init(&tm, &m, &arena, COLIBRI_CACHE_LRU, 2, NULL, 4));
    const int32_t seq[4] = {0, 1, 0, 2};
    for (int i = 0; i < 4; i++) {
        CHECK_STATUS(COLIBRI_OK, colibri_load_expert(&m, seq[i], &w));
        CHECK(w != NULL && weights_equal(&m, w, &tm.stored[seq[i]]));
        CHECK(w != &tm.stored[seq[i]]); /* a copy in a slot */
    }
    colibri_stats_t s = stats_of(&m);
    CHECK_INT(4, s.loads);
    CHECK_INT(1, s.hits);
    CHECK_INT(3, s.misses);
    CHECK_INT(1, s.evictions);
    /* expert 1 was evicted, 0 and 2 resident */
    CHECK_STATUS(COLIBRI_OK, colibri_load_expert(&m, 0, &w));
    CHECK_STATUS(COLIBRI_OK, colibri_load_expert(&m, 2, &w));
    s = stats_of(&m);
    CHECK_INT(3, s.hits);
    CHECK_INT(3, s.misses);
    CHECK_STATUS(COLIBRI_OK, colibri_load_expert(&m, 1, &w)); /* evicts 0 (LRU) */
    CHECK(weights_equal(&m, w, &tm.stored[1]));
    CHECK_STATUS(COLIBRI_OK, colibri_load_expert(&m, 2, &w)); /* hit */
    CHECK_STATUS(COLIBRI_OK, colibri_load_expert(&m, 0, &w)); /* miss, evicts 1 */
    s = stats_of(&m);
    CHECK_INT(9, s.loads);
    CHECK_INT(4, s.hits);
    CHECK_INT(5, s.misses);
    CHECK_INT(3, s.evictions);
    CHECK_STATUS(COLIBRI_OK, colibri_reset_stats(&m));
    s = stats_of(&m);
    CHECK_INT(0, s.loads + s.hits + s.misses + s.evictions);
    CHECK_STATUS(COLIBRI_ERR_EXPERT, colibri_load_expert(&m, 4, &w));
    CHECK_STATUS(COLIBRI_ERR_EXPERT, colibri_load_expert(&m, -1, &w));
    CHECK_STATUS(COLIBRI_ERR_ARG, colibri_load_expert(&m, 0, NULL));
    CHECK_STATUS(COLIBRI_ERR_ARG, colibri_load_expert(NULL, 0, &w));
    CHECK_STATUS(COLIBRI_ERR_ARG, colibri_get_stats(&m, NULL));
    free(arena);

    /* PINNED: zero-copy, never evicts */
    CHECK_STATUS(COLIBRI_OK, tm_init(&tm, &m, &arena, COLIBRI_CACHE_PINNED, 0, NULL, 4));
    for (int i = 0; i < 20; i++) {
        CHECK_STATUS(COLIBRI_OK, colibri_load_expert(&m, i % 4, &w));
    }
    CHECK(w == &tm.stored[3]);
    s = stats_of(&m);
    CHECK_INT(20, s.loads);
    CHECK_INT(20, s.hits);
    CHECK_INT(0, s.misses);
    CHECK_INT(0, s.evictions);
    free(arena);

    /* NONE: one slot, always a miss */
    CHECK_STATUS(COLIBRI_OK, tm_init(&tm, &m, &arena, COLIBRI_CACHE_NONE, 0, NULL, 4));
    for (int i = 0; i < 3; i++) {
        CHECK_STATUS(COLIBRI_OK, colibri_load_expert(&m, 0, &w));
    }
    CHECK_STATUS(COLIBRI_OK, colibri_load_expert(&m, 3, &w));
    CHECK(weights_equal(&m, w, &tm.stored[3]));
    s = stats_of(&m);
    CHECK_INT(4, s.loads);
    CHECK_INT(0, s.hits);
    CHECK_INT(4, s.misses);
    free(arena);

    /* sharing map applied by the loader: 3 -> 1, 2 -> 0 */
    const int32_t map[4] = {0, 1, 0, 1};
    CHECK_STATUS(COLIBRI_OK, tm_init(&tm, &m, &arena, COLIBRI_CACHE_LRU, 2, map, 4));
    CHECK_STATUS(COLIBRI_OK, colibri_load_expert(&m, 3, &w));
    CHECK(weights_equal(&m, w, &tm.stored[1]));
    CHECK_STATUS(COLIBRI_OK, colibri_load_expert(&m, 1, &w)); /* same stored expert: hit */
    CHECK_INT(1, stats_of(&m).hits);
    free(arena);
    tm_free(&tm);
}

/* ------------------------------------------------------------------------------------------ */
/* Static init, forward argument checks, strerror                                              */

static void test_init_static(void)
{
    test_model tm;
    tm_make(&tm, 6, 2, 4, 5, COLIBRI_ACT_RELU, COLIBRI_FLAG_EXPERT_BIAS, 3);
    colibri_model_t m = tm.base;
    CHECK_INT(COLIBRI_WORKSPACE_BYTES(6, 2, 4, 5, 0, 10), colibri_workspace_size(&m, 10));
    m.flags |= COLIBRI_FLAG_GATED;
    CHECK_INT(COLIBRI_WORKSPACE_BYTES(6, 2, 4, 5, 1, 10), colibri_workspace_size(&m, 10));
    CHECK_INT(0, colibri_workspace_size(NULL, 10));

    static _Alignas(16) unsigned char arena[65536];
    colibri_config_t cfg;
    memset(&cfg, 0, sizeof(cfg));
    const size_t ws = COLIBRI_WORKSPACE_BYTES(6, 2, 4, 5, 0, 10);
    const size_t ef = COLIBRI_EXPERT_FLOATS(4, 5, 0, 1);
    CHECK_INT(4 * 5 * 2 + 4 + 5, ef);

    m = tm.base;
    CHECK_STATUS(COLIBRI_OK, colibri_init_static(&m, NULL, arena, ws, 10));
    m = tm.base;
    CHECK_STATUS(COLIBRI_ERR_NOMEM, colibri_init_static(&m, NULL, arena, ws - 1, 10));
    cfg.cache_policy = COLIBRI_CACHE_LRU;
    cfg.lru_cache_size = 3;
    m = tm.base;
    CHECK_STATUS(COLIBRI_OK,
                 colibri_init_static(&m, &cfg, arena, ws + COLIBRI_SLOT_BYTES(3, ef), 10));
    m = tm.base;
    CHECK_STATUS(COLIBRI_ERR_NOMEM,
                 colibri_init_static(&m, &cfg, arena, ws + COLIBRI_SLOT_BYTES(3, ef) - 1, 10));
    cfg.cache_policy = COLIBRI_CACHE_NONE;
    m = tm.base;
    CHECK_STATUS(COLIBRI_ERR_NOMEM,
                 colibri_init_static(&m, &cfg, arena, ws + COLIBRI_SLOT_BYTES(1, ef) - 1, 10));
    m = tm.base;
    CHECK_STATUS(COLIBRI_OK,
                 colibri_init_static(&m, &cfg, arena, ws + COLIBRI_SLOT_BYTES(1, ef), 10));
    cfg.cache_policy = COLIBRI_CACHE_LRU;
    cfg.lru_cache_size = 0;
    m = tm.base;
    CHECK_STATUS(COLIBRI_ERR_ARG, colibri_init_static(&m, &cfg, arena, sizeof(arena), 10));
    cfg.lru_cache_size = COLIBRI_MAX_LRU_SLOTS + 1;
    m = tm.base;
    CHECK_STATUS(COLIBRI_ERR_ARG, colibri_init_static(&m, &cfg, arena, sizeof(arena), 10));
    cfg.cache_policy = (colibri_cache_policy)7;
    cfg.lru_cache_size = 2;
    m = tm.base;
    CHECK_STATUS(COLIBRI_ERR_ARG, colibri_init_static(&m, &cfg, arena, sizeof(arena), 10));
    m = tm.base;
    CHECK_STATUS(COLIBRI_ERR_ARG, colibri_init_static(&m, NULL, arena + 4, 1000, 10));
    CHECK_STATUS(COLIBRI_ERR_ARG, colibri_init_static(NULL, NULL, arena, sizeof(arena), 10));
    m = tm.base;
    CHECK_STATUS(COLIBRI_ERR_ARG, colibri_init_static(&m, NULL, NULL, sizeof(arena), 10));
    m = tm.base;
    CHECK_STATUS(COLIBRI_ERR_ARG, colibri_init_static(&m, NULL, arena, sizeof(arena), 0));

    /* sharing maps */
    memset(&cfg, 0, sizeof(cfg));
    const int32_t out_of_range[6] = {0, 1, 2, 3, 4, 6};
    const int32_t chained[6] = {0, 0, 1, 3, 4, 5}; /* 2 -> 1 -> 0: map[map[2]] != map[2] */
    const int32_t negative[6] = {0, -1, 2, 3, 4, 5};
    cfg.expert_sharing_map = out_of_range;
    m = tm.base;
    CHECK_STATUS(COLIBRI_ERR_EXPERT, colibri_init_static(&m, &cfg, arena, sizeof(arena), 10));
    cfg.expert_sharing_map = chained;
    m = tm.base;
    CHECK_STATUS(COLIBRI_ERR_EXPERT, colibri_init_static(&m, &cfg, arena, sizeof(arena), 10));
    cfg.expert_sharing_map = negative;
    m = tm.base;
    CHECK_STATUS(COLIBRI_ERR_EXPERT, colibri_init_static(&m, &cfg, arena, sizeof(arena), 10));
    int32_t share[6] = {0, 0, 1, 3, 4, 5};
    m = tm.base;
    m.share = share; /* model's own map is validated too */
    CHECK_STATUS(COLIBRI_ERR_EXPERT, colibri_init_static(&m, NULL, arena, sizeof(arena), 10));
    share[2] = 0;
    m = tm.base;
    m.share = share;
    CHECK_STATUS(COLIBRI_OK, colibri_init_static(&m, NULL, arena, sizeof(arena), 10));

    /* descriptor validation */
    m = tm.base;
    m.top_k = 7;
    CHECK_STATUS(COLIBRI_ERR_TOPK, colibri_init_static(&m, NULL, arena, sizeof(arena), 10));
    m = tm.base;
    m.d_model = 0;
    CHECK_STATUS(COLIBRI_ERR_ARG, colibri_init_static(&m, NULL, arena, sizeof(arena), 10));
    m = tm.base;
    m.activation = (colibri_activation)9;
    CHECK_STATUS(COLIBRI_ERR_ARG, colibri_init_static(&m, NULL, arena, sizeof(arena), 10));
    m = tm.base;
    m.flags |= COLIBRI_FLAG_ROUTER_BIAS;
    m.router_b = NULL;
    CHECK_STATUS(COLIBRI_ERR_ARG, colibri_init_static(&m, NULL, arena, sizeof(arena), 10));
    m = tm.base;
    m.flags |= COLIBRI_FLAG_GATED; /* w3 missing */
    CHECK_STATUS(COLIBRI_ERR_ARG, colibri_init_static(&m, NULL, arena, sizeof(arena), 10));
    tm_free(&tm);
}

static void test_forward_errors(void)
{
    test_model tm;
    tm_make(&tm, 4, 2, 3, 4, COLIBRI_ACT_GELU, 0u, 9);
    colibri_model_t m;
    void *arena;
    CHECK_STATUS(COLIBRI_OK, tm_init(&tm, &m, &arena, COLIBRI_CACHE_PINNED, 0, NULL, 2));
    float x[6] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f}, out[6], gates[8], temp[2];
    int32_t ids[8];
    CHECK_STATUS(COLIBRI_ERR_DIM, colibri_forward(&m, x, out, 2, 4, 2, ids, gates, temp));
    CHECK_STATUS(COLIBRI_ERR_TOPK, colibri_forward(&m, x, out, 2, 3, 0, ids, gates, temp));
    CHECK_STATUS(COLIBRI_ERR_TOPK, colibri_forward(&m, x, out, 2, 3, -2, ids, gates, temp));
    CHECK_STATUS(COLIBRI_ERR_TOPK, colibri_forward(&m, x, out, 2, 3, 5, ids, gates, temp));
    CHECK_STATUS(COLIBRI_ERR_ARG, colibri_forward(NULL, x, out, 2, 3, 2, ids, gates, temp));
    CHECK_STATUS(COLIBRI_ERR_ARG, colibri_forward(&m, NULL, out, 2, 3, 2, ids, gates, temp));
    CHECK_STATUS(COLIBRI_ERR_ARG, colibri_forward(&m, x, NULL, 2, 3, 2, ids, gates, temp));
    CHECK_STATUS(COLIBRI_OK, colibri_forward(&m, x, out, 2, 3, 2, ids, gates, temp));
    CHECK_STATUS(COLIBRI_OK, colibri_forward(&m, x, out, 0, 3, 2, ids, gates, temp));
    x[4] = NAN;
    CHECK_STATUS(COLIBRI_ERR_NAN, colibri_forward(&m, x, out, 2, 3, 2, ids, gates, temp));

    int32_t bad_ids[4] = {0, 1, 2, 4};
    float g4[4] = {0.5f, 0.5f, 0.5f, 0.5f};
    x[4] = 0.0f;
    CHECK_STATUS(COLIBRI_ERR_EXPERT, colibri_sparse_forward(&m, x, out, 2, 2, bad_ids, g4));
    bad_ids[3] = -1;
    CHECK_STATUS(COLIBRI_ERR_EXPERT, colibri_sparse_forward(&m, x, out, 2, 2, bad_ids, g4));
    bad_ids[3] = 3;
    CHECK_STATUS(COLIBRI_OK, colibri_sparse_forward(&m, x, out, 2, 2, bad_ids, g4));
    CHECK_STATUS(COLIBRI_ERR_TOPK, colibri_sparse_forward(&m, x, out, 2, 0, bad_ids, g4));
    free(arena);

    /* k larger than the arena can chunk: max_tokens 1, model top_k 1, k = 2 */
    test_model tm1;
    tm_make(&tm1, 4, 1, 3, 4, COLIBRI_ACT_GELU, 0u, 10);
    CHECK_STATUS(COLIBRI_OK, tm_init(&tm1, &m, &arena, COLIBRI_CACHE_PINNED, 0, NULL, 1));
    CHECK_STATUS(COLIBRI_ERR_NOMEM, colibri_forward(&m, x, out, 2, 3, 2, ids, gates, temp));
    CHECK_STATUS(COLIBRI_OK, colibri_forward(&m, x, out, 2, 3, 1, ids, gates, temp));
    free(arena);
    tm_free(&tm1);
    tm_free(&tm);
}

static void test_strerror(void)
{
    const int codes[] = {COLIBRI_OK,           COLIBRI_ERR_ARG,         COLIBRI_ERR_IO,
                         COLIBRI_ERR_MAGIC,    COLIBRI_ERR_VERSION,     COLIBRI_ERR_TRUNCATED,
                         COLIBRI_ERR_SIZE,     COLIBRI_ERR_CONFIG,      COLIBRI_ERR_TOPK,
                         COLIBRI_ERR_DIM,      COLIBRI_ERR_NAN,         COLIBRI_ERR_NOMEM,
                         COLIBRI_ERR_EXPERT,   COLIBRI_ERR_UNSUPPORTED, COLIBRI_ERR_FORMAT,
                         COLIBRI_ERR_CHECKSUM, COLIBRI_ERR_NONFINITE,   COLIBRI_ERR_BUDGET,
                         COLIBRI_ERR_MEMORY,   COLIBRI_ERR_POSITION,    COLIBRI_ERR_CHANGED};
    const size_t n = sizeof(codes) / sizeof(codes[0]);
    int ok = 1;
    for (size_t i = 0; i < n; i++) {
        const char *a = colibri_strerror(codes[i]);
        if (a == NULL || a[0] == '\0') {
            ok = 0;
            continue;
        }
        for (size_t j = 0; j < i; j++) {
            if (strcmp(a, colibri_strerror(codes[j])) == 0) {
                ok = 0;
            }
        }
    }
    CHECK(ok);
    const char *unknown = colibri_strerror(-99);
    CHECK(unknown != NULL && unknown[0] != '\0');
    CHECK(colibri_strerror(5) != NULL);
    CHECK(strcmp(colibri_strerror(-99), colibri_strerror(COLIBRI_ERR_ARG)) != 0);
}

/* ------------------------------------------------------------------------------------------ */
/* Model files                                                                                 */

static char g_dir[64];
static uint32_t g_load_flags; /* colibri_config_t.load_flags of init_file / init_clb */

static void path_in_dir(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", g_dir, name);
}

static void write_bytes(const char *name, const void *data, size_t n)
{
    char path[128];
    path_in_dir(path, sizeof(path), name);
    FILE *fp = fopen(path, "wb");
    if (fp == NULL) {
        fprintf(stderr, "cannot write %s\n", path);
        return;
    }
    if (n > 0) {
        fwrite(data, 1, n, fp);
    }
    fclose(fp);
}

static void remove_file(const char *name)
{
    char path[128];
    path_in_dir(path, sizeof(path), name);
    unlink(path);
}

typedef struct {
    unsigned char *p;
    size_t n, cap;
} bytebuf;

static void bb_put(bytebuf *b, const void *data, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2u + 64u;
        b->p = realloc(b->p, b->cap);
    }
    if (data != NULL) {
        memcpy(b->p + b->n, data, n);
    } else {
        memset(b->p + b->n, 0, n);
    }
    b->n += n;
}

static void bb_u32(bytebuf *b, uint32_t v)
{
    bb_put(b, &v, 4); /* little-endian host */
}

static void bb_u64(bytebuf *b, uint64_t v)
{
    bb_put(b, &v, 8);
}

/* Seed flat layout of a test model (needs COLIBRI_FLAG_EXPERT_BIAS, not gated). */
static void write_seed(const test_model *tm, uint32_t magic, uint32_t version, uint32_t n_exp,
                       long size_delta, int router_bias)
{
    const colibri_model_t *m = &tm->base;
    const size_t d = (size_t)m->d_model, f = (size_t)m->d_ff;
    bytebuf b = {NULL, 0, 0};
    bb_u32(&b, magic);
    bb_u32(&b, version);
    bb_u32(&b, n_exp);
    for (int32_t i = 0; i < m->n_experts; i++) {
        bb_put(&b, tm->stored[i].w1, d * f * 4u);
        bb_put(&b, tm->stored[i].b1, f * 4u);
        bb_put(&b, tm->stored[i].w2, f * d * 4u);
        bb_put(&b, tm->stored[i].b2, d * 4u);
    }
    if (size_delta > 0) {
        bb_put(&b, NULL, (size_t)size_delta);
    } else {
        b.n -= (size_t)(-size_delta);
    }
    write_bytes("model.bin", b.p, b.n);
    b.n = 0;
    bb_put(&b, tm->router_w, (size_t)m->n_experts * d * 4u);
    if (router_bias) {
        bb_put(&b, tm->router_b, (size_t)m->n_experts * 4u);
    }
    write_bytes("router.bin", b.p, b.n);
    free(b.p);
}

static void write_config(const char *text)
{
    write_bytes("config.json", text, strlen(text));
}

static colibri_status init_file(colibri_cache_policy policy, int32_t slots, const int32_t *map,
                                colibri_model_t **out)
{
    char path[128];
    path_in_dir(path, sizeof(path), "model.bin");
    colibri_config_t cfg = {.model_path = path,
                            .cache_policy = policy,
                            .lru_cache_size = slots,
                            .num_threads = 1,
                            .load_flags = g_load_flags,
                            .expert_sharing_map = map};
    return colibri_init(&cfg, out);
}

/* Forward through a file model and through the static model of the same weights. */
static void check_file_matches(const test_model *tm, const int32_t *map,
                               colibri_cache_policy policy, int32_t slots)
{
    colibri_model_t *fm = NULL;
    colibri_status st = init_file(policy, slots, map, &fm);
    CHECK_STATUS(COLIBRI_OK, st);
    if (st != COLIBRI_OK) {
        return;
    }
    CHECK_INT(tm->base.n_experts, fm->n_experts);
    CHECK_INT(tm->base.d_model, fm->d_model);
    CHECK_INT(tm->base.d_ff, fm->d_ff);
    CHECK_INT(tm->base.top_k, fm->top_k);
    CHECK_INT(tm->base.flags, fm->flags);
    CHECK_INT(tm->base.activation, fm->activation);
    colibri_model_t sm;
    void *arena;
    CHECK_STATUS(COLIBRI_OK, tm_init(tm, &sm, &arena, COLIBRI_CACHE_PINNED, 0, map, 8));
    enum { T = 21 };
    const int32_t d = fm->d_model, k = fm->top_k;
    float *x = malloc(sizeof(float) * T * (size_t)d);
    float *o1 = malloc(sizeof(float) * T * (size_t)d);
    float *o2 = malloc(sizeof(float) * T * (size_t)d);
    float *g1 = malloc(sizeof(float) * T * (size_t)k);
    float *g2 = malloc(sizeof(float) * T * (size_t)k);
    int32_t *i1 = malloc(sizeof(int32_t) * T * (size_t)k);
    int32_t *i2 = malloc(sizeof(int32_t) * T * (size_t)k);
    float temp[T];
    for (int i = 0; i < T * d; i++) {
        x[i] = rng_float(-1.0f, 1.0f);
    }
    CHECK_STATUS(COLIBRI_OK, colibri_forward(fm, x, o1, T, d, k, i1, g1, temp));
    CHECK_STATUS(COLIBRI_OK, colibri_forward(&sm, x, o2, T, d, k, i2, g2, temp));
    CHECK(memcmp(i1, i2, sizeof(int32_t) * T * (size_t)k) == 0);
    CHECK_FLOATS_EQ(g2, g1, T * k);
    CHECK_FLOATS_EQ(o2, o1, T * d);
    colibri_stats_t s;
    CHECK_STATUS(COLIBRI_OK, colibri_get_stats(fm, &s));
    CHECK(s.loads > 0);
    colibri_cleanup(fm);
    free(arena);
    free(x);
    free(o1);
    free(o2);
    free(g1);
    free(g2);
    free(i1);
    free(i2);
}

static void expect_init(colibri_status expected, int line)
{
    colibri_model_t *fm = (colibri_model_t *)&fm; /* must be reset to NULL on error */
    colibri_status st = init_file(COLIBRI_CACHE_LRU, 2, NULL, &fm);
    if (st == expected && (st == COLIBRI_OK || fm == NULL)) {
        g_passed++;
    } else {
        g_failed++;
        fprintf(stderr, "%s:%d: colibri_init: expected %d (%s), actual %d (%s)%s\n", __FILE__, line,
                (int)expected, colibri_strerror(expected), (int)st, colibri_strerror(st),
                (st != COLIBRI_OK && fm != NULL) ? ", *out_model not NULL" : "");
    }
    if (st == COLIBRI_OK) {
        colibri_cleanup(fm);
    }
}
#define EXPECT_INIT(status) expect_init((status), __LINE__)

static const char *k_config =
    "{\"n_experts\": 5, \"k\": 2, \"hidden_size\": 6, \"intermediate_size\": 7,\n"
    " \"vocab_size\": 100, \"extra\": {\"a\": [1, 2.5e3, {\"b\": \"x\\\"y\"}], \"c\": null},\n"
    " \"activation\": \"gelu\", \"norm_topk_prob\": false}\n";

static void test_seed_files(void)
{
    test_model tm;
    tm_make(&tm, 5, 2, 6, 7, COLIBRI_ACT_GELU, COLIBRI_FLAG_EXPERT_BIAS, 31);
    write_config(k_config);
    write_seed(&tm, 0x434F4C49u, 1, 5, 0, 0);
    check_file_matches(&tm, NULL, COLIBRI_CACHE_LRU, 2);
    check_file_matches(&tm, NULL, COLIBRI_CACHE_PINNED, 0);
    check_file_matches(&tm, NULL, COLIBRI_CACHE_NONE, 0);
    const int32_t map[5] = {0, 1, 1, 3, 0};
    check_file_matches(&tm, map, COLIBRI_CACHE_LRU, 1);
    colibri_model_t *fm = NULL;
    const int32_t bad_map[5] = {0, 2, 1, 3, 4};
    CHECK_STATUS(COLIBRI_ERR_EXPERT, init_file(COLIBRI_CACHE_LRU, 2, bad_map, &fm));
    CHECK(fm == NULL);
    CHECK_STATUS(COLIBRI_ERR_ARG, init_file(COLIBRI_CACHE_LRU, 0, NULL, &fm));
    CHECK_STATUS(COLIBRI_ERR_ARG, colibri_init(NULL, &fm));
    colibri_cleanup(NULL);

    /* router bias, gate renormalisation, other activation */
    test_model tb;
    tm_make(&tb, 5, 2, 6, 7, COLIBRI_ACT_SILU,
            COLIBRI_FLAG_EXPERT_BIAS | COLIBRI_FLAG_ROUTER_BIAS | COLIBRI_FLAG_NORM_TOPK, 32);
    write_config("{\"n_experts\":5,\"k\":2,\"hidden_size\":6,\"intermediate_size\":7,"
                 "\"activation\":\"silu\",\"norm_topk_prob\":true}");
    write_seed(&tb, 0x434F4C49u, 1, 5, 0, 1);
    check_file_matches(&tb, NULL, COLIBRI_CACHE_LRU, 3);
    tm_free(&tb);

    write_config(k_config);
    write_seed(&tm, 0x12345678u, 1, 5, 0, 0);
    EXPECT_INIT(COLIBRI_ERR_MAGIC);
    write_seed(&tm, 0x434F4C49u, 2, 5, 0, 0);
    EXPECT_INIT(COLIBRI_ERR_VERSION);
    write_seed(&tm, 0x434F4C49u, 1, 5, -4, 0);
    EXPECT_INIT(COLIBRI_ERR_TRUNCATED);
    write_seed(&tm, 0x434F4C49u, 1, 5, 4, 0);
    EXPECT_INIT(COLIBRI_ERR_SIZE);
    write_seed(&tm, 0x434F4C49u, 1, 4, 0, 0);
    EXPECT_INIT(COLIBRI_ERR_CONFIG); /* num_experts differs from config */
    write_bytes("model.bin", "COLI\1\0\0", 7);
    EXPECT_INIT(COLIBRI_ERR_TRUNCATED); /* shorter than the 12-byte header */
    write_bytes("model.bin", "", 0);
    EXPECT_INIT(COLIBRI_ERR_TRUNCATED);

    write_seed(&tm, 0x434F4C49u, 1, 5, 0, 0);
    write_config("{\"n_experts\": 5, \"hidden_size\": 6, \"intermediate_size\": 7}");
    EXPECT_INIT(COLIBRI_ERR_CONFIG); /* k missing */
    write_config("{\"n_experts\": 5, \"k\": 2, \"hidden_size\": 6, \"intermediate_size\": 7, "
                 "\"activation\": \"tanh\"}");
    EXPECT_INIT(COLIBRI_ERR_CONFIG);
    write_config("{\"n_experts\": 5, \"k\": 2, \"hidden_size\": 6, \"intermediate_size\": 7, "
                 "\"activation\": \"swiglu\"}");
    EXPECT_INIT(COLIBRI_ERR_CONFIG);
    write_config("{\"n_experts\": 5, \"k\": 2, \"hidden_size\": 6.5, \"intermediate_size\": 7}");
    EXPECT_INIT(COLIBRI_ERR_CONFIG);
    write_config("{\"n_experts\": 5, \"k\": 9, \"hidden_size\": 6, \"intermediate_size\": 7}");
    EXPECT_INIT(COLIBRI_ERR_CONFIG);
    write_config("{\"n_experts\": 5, \"k\": 2, \"hidden_size\": 6, \"intermediate_size\": 7");
    EXPECT_INIT(COLIBRI_ERR_CONFIG); /* unterminated */
    write_config("[1, 2]");
    EXPECT_INIT(COLIBRI_ERR_CONFIG);
    write_config("{\"n_experts\": 5, \"k\": 2, \"hidden_size\": 8, \"intermediate_size\": 7}");
    EXPECT_INIT(COLIBRI_ERR_TRUNCATED); /* the file is smaller than this config says */
    write_config("{\"n_experts\": 5, \"k\": 2, \"hidden_size\": 6, \"intermediate_size\": 5}");
    EXPECT_INIT(COLIBRI_ERR_SIZE); /* and larger than this one */
    remove_file("config.json");
    EXPECT_INIT(COLIBRI_ERR_CONFIG);

    write_config(k_config);
    write_bytes("router.bin", tm.router_w, 5u * 6u * 4u - 4u);
    EXPECT_INIT(COLIBRI_ERR_SIZE);
    remove_file("router.bin");
    EXPECT_INIT(COLIBRI_ERR_IO);
    remove_file("model.bin");
    EXPECT_INIT(COLIBRI_ERR_IO);
    remove_file("config.json");
    tm_free(&tm);
}

/* ---- Colibri container ---- */

typedef struct {
    uint32_t version;
    int skip_router;
    const char *mutate_name; /* tensor to corrupt */
    int mutate_dtype;        /* set its dtype (>= 0) */
    int mutate_shape;        /* add 1 to its first dim (and its nbytes) */
    int misalign;            /* add 4 to its offset */
    int past_end;            /* move its offset to the end of the file */
    const int32_t *map;      /* write expert_sharing_map and skip non-owner experts */
    int skip_expert;         /* drop the tensors of this expert (-1: none) */
    long size_delta;         /* bytes appended (>0) or cut (<0) after writing */
    uint32_t n_experts_override;
    uint32_t d_ff_override; /* header d_ff (0: the model's) */
    int flip_bit;           /* flip one bit in the blob of mutate_name (after its CRC) */
    int bad_crc;            /* store the complement of its CRC-32 */
    int overlap;            /* point its blob at the previous tensor's blob */
    int64_t meta_off_delta; /* added to the header's meta_offset */
    int data_off_meta;      /* header data_offset = meta_offset (data overlaps the metadata) */
} clb_opts;

/* zlib CRC-32, bit by bit (independent of the runtime's table-driven one). */
static uint32_t test_crc32(const void *data, size_t n)
{
    const unsigned char *p = data;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int b = 0; b < 8; b++) {
            c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
        }
    }
    return ~c;
}

typedef struct {
    char name[48];
    uint32_t dtype, ndim, shape[4];
    const void *data;
    uint64_t nbytes, offset;
    uint32_t expert;
} clb_tensor;

static void add_tensor(clb_tensor *t, size_t *n, const char *name, const void *data, uint32_t ndim,
                       uint32_t a, uint32_t b, uint32_t expert, uint32_t dtype)
{
    clb_tensor *x = &t[(*n)++];
    memset(x, 0, sizeof(*x));
    snprintf(x->name, sizeof(x->name), "%s", name);
    x->dtype = dtype;
    x->ndim = ndim;
    x->shape[0] = a;
    x->shape[1] = ndim == 2 ? b : 0u;
    x->data = data;
    x->nbytes = 4u * (uint64_t)a * (ndim == 2 ? b : 1u);
    x->expert = expert;
}

static void write_container(const test_model *tm, const clb_opts *o)
{
    const colibri_model_t *m = &tm->base;
    const uint32_t e = (uint32_t)m->n_experts, d = (uint32_t)m->d_model, f = (uint32_t)m->d_ff;
    clb_tensor *t = calloc(8u + 5u * e, sizeof(clb_tensor));
    size_t n = 0;
    char name[48];
    if (!o->skip_router) {
        add_tensor(t, &n, "router.weight", tm->router_w, 2, e, d, 0xFFFFFFFFu, 0);
    }
    if (m->flags & COLIBRI_FLAG_ROUTER_BIAS) {
        add_tensor(t, &n, "router.bias", tm->router_b, 1, e, 0, 0xFFFFFFFFu, 0);
    }
    for (uint32_t i = 0; i < e; i++) {
        if ((o->map != NULL && o->map[i] != (int32_t)i) || (int)i == o->skip_expert) {
            continue;
        }
        const colibri_expert_weights_t *w = &tm->stored[i];
        snprintf(name, sizeof(name), "expert.%u.w1", (unsigned)i);
        add_tensor(t, &n, name, w->w1, 2, d, f, i, 0);
        if (m->flags & COLIBRI_FLAG_EXPERT_BIAS) {
            snprintf(name, sizeof(name), "expert.%u.b1", (unsigned)i);
            add_tensor(t, &n, name, w->b1, 1, f, 0, i, 0);
        }
        snprintf(name, sizeof(name), "expert.%u.w2", (unsigned)i);
        add_tensor(t, &n, name, w->w2, 2, f, d, i, 0);
        if (m->flags & COLIBRI_FLAG_EXPERT_BIAS) {
            snprintf(name, sizeof(name), "expert.%u.b2", (unsigned)i);
            add_tensor(t, &n, name, w->b2, 1, d, 0, i, 0);
        }
        if (m->flags & COLIBRI_FLAG_GATED) {
            snprintf(name, sizeof(name), "expert.%u.w3", (unsigned)i);
            add_tensor(t, &n, name, w->w3, 2, d, f, i, 0);
        }
    }
    if (o->map != NULL) {
        add_tensor(t, &n, "expert_sharing_map", o->map, 1, e, 0, 0xFFFFFFFFu, 4);
    }
    const char *meta = "{\"config\": {}, \"producer\": \"colibri test\"}";
    const uint64_t meta_off = 128u + 96u * (uint64_t)n;
    uint64_t off = (meta_off + strlen(meta) + 63u) & ~(uint64_t)63u;
    const uint64_t data_off = off;
    for (size_t i = 0; i < n; i++) {
        t[i].offset = off;
        off = (off + t[i].nbytes + 63u) & ~(uint64_t)63u;
    }
    const uint64_t file_size = t[n - 1].offset + t[n - 1].nbytes;
    bytebuf b = {NULL, 0, 0};
    bb_put(&b, "CLBRMOE", 8);
    bb_u32(&b, o->version);
    bb_u32(&b, 64);
    bb_u32(&b, o->n_experts_override ? o->n_experts_override : e);
    bb_u32(&b, (uint32_t)m->top_k);
    bb_u32(&b, d);
    bb_u32(&b, o->d_ff_override ? o->d_ff_override : f);
    bb_u32(&b, (uint32_t)m->activation);
    bb_u32(&b, m->flags);
    bb_u32(&b, (uint32_t)n);
    bb_u32(&b, (uint32_t)strlen(meta));
    bb_u64(&b, 128);
    bb_u64(&b, meta_off + (uint64_t)o->meta_off_delta);
    bb_u64(&b, o->data_off_meta ? meta_off : data_off);
    bb_u64(&b, file_size);
    bb_u32(&b, 0);
    bb_put(&b, NULL, 44);
    size_t flip_at = 0;
    for (size_t i = 0; i < n; i++) {
        clb_tensor x = t[i];
        uint32_t dtype = x.dtype;
        uint32_t crc = test_crc32(x.data, (size_t)x.nbytes);
        if (o->mutate_name != NULL && strcmp(o->mutate_name, x.name) == 0) {
            flip_at = (size_t)x.offset + (size_t)x.nbytes / 2u;
            if (o->bad_crc) {
                crc = ~crc;
            }
            if (o->overlap && i > 0) {
                x.offset = t[i - 1].offset;
            }
            if (o->mutate_dtype >= 0) {
                dtype = (uint32_t)o->mutate_dtype;
            }
            if (o->mutate_shape) {
                x.nbytes = x.nbytes / x.shape[0] * (x.shape[0] + 1u);
                x.shape[0]++;
            }
            if (o->misalign) {
                x.offset += 4u;
            }
            if (o->past_end) {
                x.offset = (file_size + 63u) & ~(uint64_t)63u;
            }
        }
        bb_put(&b, x.name, 48);
        bb_u32(&b, dtype);
        bb_u32(&b, x.ndim);
        for (int j = 0; j < 4; j++) {
            bb_u32(&b, x.shape[j]);
        }
        bb_u64(&b, x.offset);
        bb_u64(&b, x.nbytes);
        bb_u32(&b, x.expert);
        bb_u32(&b, crc);
    }
    bb_put(&b, meta, strlen(meta));
    for (size_t i = 0; i < n; i++) {
        bb_put(&b, NULL, (size_t)(t[i].offset - b.n));
        bb_put(&b, t[i].data, (size_t)t[i].nbytes);
    }
    if (o->flip_bit && flip_at > 0) {
        b.p[flip_at] ^= 0x01u; /* lowest bit of a byte of the blob: a finite float stays finite */
    }
    if (o->size_delta > 0) {
        bb_put(&b, NULL, (size_t)o->size_delta);
    } else {
        b.n -= (size_t)(-o->size_delta);
    }
    write_bytes("model.clb", b.p, b.n);
    free(b.p);
    free(t);
}

static colibri_status init_clb(colibri_cache_policy policy, int32_t slots, colibri_model_t **m)
{
    char path[128];
    path_in_dir(path, sizeof(path), "model.clb");
    colibri_config_t cfg = {.model_path = path,
                            .cache_policy = policy,
                            .lru_cache_size = slots,
                            .load_flags = g_load_flags};
    return colibri_init(&cfg, m);
}

static void expect_clb(const test_model *tm, const clb_opts *o, colibri_status expected, int line)
{
    write_container(tm, o);
    colibri_model_t *fm = (colibri_model_t *)&fm;
    colibri_status st = init_clb(COLIBRI_CACHE_LRU, 2, &fm);
    if (st == expected && (st == COLIBRI_OK || fm == NULL)) {
        g_passed++;
    } else {
        g_failed++;
        fprintf(stderr, "%s:%d: colibri_init(container): expected %d (%s), actual %d (%s)\n",
                __FILE__, line, (int)expected, colibri_strerror(expected), (int)st,
                colibri_strerror(st));
    }
    if (st == COLIBRI_OK) {
        colibri_cleanup(fm);
    }
}
#define EXPECT_CLB(tm, opts, status) expect_clb((tm), (opts), (status), __LINE__)

static clb_opts clb_default(void)
{
    clb_opts o;
    memset(&o, 0, sizeof(o));
    o.version = 1;
    o.mutate_dtype = -1;
    o.skip_expert = -1;
    return o;
}

/* A container model compared with the static model of the same weights. */
static void check_clb_matches(const test_model *tm, const clb_opts *o)
{
    write_container(tm, o);
    const colibri_cache_policy policies[3] = {COLIBRI_CACHE_PINNED, COLIBRI_CACHE_LRU,
                                              COLIBRI_CACHE_NONE};
    for (int p = 0; p < 3; p++) {
        colibri_model_t *fm = NULL;
        colibri_status st = init_clb(policies[p], 2, &fm);
        CHECK_STATUS(COLIBRI_OK, st);
        if (st != COLIBRI_OK) {
            continue;
        }
        colibri_model_t sm;
        void *arena;
        CHECK_STATUS(COLIBRI_OK, tm_init(tm, &sm, &arena, COLIBRI_CACHE_PINNED, 0, o->map, 4));
        enum { T = 9 };
        const int32_t d = fm->d_model, k = fm->top_k;
        float x[T * 16], o1[T * 16], o2[T * 16], g[T * 8];
        int32_t ids[T * 8];
        for (int i = 0; i < T * d; i++) {
            x[i] = rng_float(-1.0f, 1.0f);
        }
        CHECK_STATUS(COLIBRI_OK, colibri_forward(fm, x, o1, T, d, k, ids, g, NULL));
        CHECK_STATUS(COLIBRI_OK, colibri_forward(&sm, x, o2, T, d, k, ids, g, NULL));
        CHECK_FLOATS_EQ(o2, o1, T * d);
        if (p == 0) {
            const colibri_expert_weights_t *w = NULL;
            CHECK_STATUS(COLIBRI_OK, colibri_load_expert(fm, 0, &w));
            /* zero-copy: PINNED weights point into the mapping */
            CHECK(w != NULL && (const void *)w->w1 >= fm->map_base &&
                  (const unsigned char *)w->w1 <
                      (const unsigned char *)fm->map_base + fm->map_size);
        }
        colibri_cleanup(fm);
        free(arena);
    }
}

static void test_container_files(void)
{
    test_model tm;
    tm_make(&tm, 6, 2, 5, 8, COLIBRI_ACT_GELU_TANH,
            COLIBRI_FLAG_EXPERT_BIAS | COLIBRI_FLAG_ROUTER_BIAS, 51);
    clb_opts o = clb_default();
    check_clb_matches(&tm, &o);

    const int32_t map[6] = {0, 1, 0, 3, 1, 5};
    o.map = map;
    check_clb_matches(&tm, &o);
    const int32_t bad_map[6] = {0, 2, 1, 3, 4, 5}; /* 1 -> 2 -> 1 */
    o.map = bad_map;
    EXPECT_CLB(&tm, &o, COLIBRI_ERR_EXPERT);

    test_model tg;
    tm_make(&tg, 4, 2, 6, 5, COLIBRI_ACT_SILU, COLIBRI_FLAG_GATED | COLIBRI_FLAG_NORM_TOPK, 52);
    o = clb_default();
    check_clb_matches(&tg, &o);
    tm_free(&tg);

    o = clb_default();
    o.version = 2;
    EXPECT_CLB(&tm, &o, COLIBRI_ERR_VERSION);
    o = clb_default();
    o.size_delta = -10;
    EXPECT_CLB(&tm, &o, COLIBRI_ERR_TRUNCATED);
    o.size_delta = 64;
    EXPECT_CLB(&tm, &o, COLIBRI_ERR_SIZE);
    o = clb_default();
    o.mutate_name = "expert.2.w2";
    o.past_end = 1;
    EXPECT_CLB(&tm, &o, COLIBRI_ERR_TRUNCATED);
    o = clb_default();
    o.mutate_name = "expert.1.w1";
    o.mutate_shape = 1;
    EXPECT_CLB(&tm, &o, COLIBRI_ERR_SIZE);
    o = clb_default();
    o.mutate_name = "expert.1.b1";
    o.mutate_dtype = 1; /* f16 */
    EXPECT_CLB(&tm, &o, COLIBRI_ERR_UNSUPPORTED);
    o = clb_default();
    o.mutate_name = "router.weight";
    o.misalign = 1;
    EXPECT_CLB(&tm, &o, COLIBRI_ERR_FORMAT);
    o = clb_default();
    o.skip_router = 1;
    EXPECT_CLB(&tm, &o, COLIBRI_ERR_FORMAT);
    o = clb_default();
    o.skip_expert = 4; /* no tensors and no sharing map */
    EXPECT_CLB(&tm, &o, COLIBRI_ERR_FORMAT);
    o = clb_default();
    o.n_experts_override = 0xFFFFFu; /* header dims invalid */
    EXPECT_CLB(&tm, &o, COLIBRI_ERR_CONFIG);

    write_bytes("model.clb", "CLBRMOE\0\1\0\0\0\100\0\0\0", 16);
    colibri_model_t *fm = NULL;
    CHECK_STATUS(COLIBRI_ERR_TRUNCATED, init_clb(COLIBRI_CACHE_LRU, 2, &fm));
    CHECK(fm == NULL);
    remove_file("model.clb");
    tm_free(&tm);
}

/* ---- hostile and corrupt files: header fields, overlaps, CRC-32, NaN / Inf ---- */

static void test_hostile_container(void)
{
    test_model tm;
    tm_make(&tm, 6, 2, 5, 8, COLIBRI_ACT_GELU, COLIBRI_FLAG_EXPERT_BIAS | COLIBRI_FLAG_ROUTER_BIAS,
            61);
    clb_opts o = clb_default();
    EXPECT_CLB(&tm, &o, COLIBRI_OK);

    /* the case: a small file whose header says d_ff = 2^26 (64 GiB of workspace
     * before this check); the tensors it implies do not fit, so nothing is allocated */
    o.d_ff_override = 1u << 26;
    EXPECT_CLB(&tm, &o, COLIBRI_ERR_CONFIG); /* above COLIBRI_FILE_MAX_DIM */
    o.d_ff_override = 1u << 20;
    EXPECT_CLB(&tm, &o, COLIBRI_ERR_TRUNCATED); /* allowed dim, but 2 * 4 * d * f > file */
    o.d_ff_override = 9;
    EXPECT_CLB(&tm, &o, COLIBRI_ERR_SIZE); /* fits, but the tensors' shapes say 8 */
    o = clb_default();
    o.meta_off_delta = 96;
    EXPECT_CLB(&tm, &o, COLIBRI_ERR_FORMAT);
    o.meta_off_delta = -96; /* inside the tensor table */
    EXPECT_CLB(&tm, &o, COLIBRI_ERR_FORMAT);
    o = clb_default();
    o.data_off_meta = 1; /* data area starts inside the metadata */
    EXPECT_CLB(&tm, &o, COLIBRI_ERR_FORMAT);
    o = clb_default();
    o.mutate_name = "expert.3.w2";
    o.overlap = 1; /* shares its blob with expert.3.b1 */
    EXPECT_CLB(&tm, &o, COLIBRI_ERR_FORMAT);

    /* flipped bits and wrong checksums */
    o = clb_default();
    o.mutate_name = "expert.4.w1";
    o.flip_bit = 1;
    EXPECT_CLB(&tm, &o, COLIBRI_ERR_CHECKSUM);
    g_load_flags = COLIBRI_LOAD_SKIP_CHECKSUM; /* a trusted file: the flip goes unnoticed */
    EXPECT_CLB(&tm, &o, COLIBRI_OK);
    g_load_flags = 0;
    o = clb_default();
    o.mutate_name = "router.bias";
    o.bad_crc = 1;
    EXPECT_CLB(&tm, &o, COLIBRI_ERR_CHECKSUM);
    o = clb_default();
    o.mutate_name = "router.weight";
    o.flip_bit = 1;
    EXPECT_CLB(&tm, &o, COLIBRI_ERR_CHECKSUM);

    /* NaN / Inf weights (with valid CRCs) */
    const struct {
        float *at;
        float value;
    } poison[] = {
        {(float *)tm.stored[2].w2 + 7, NAN},
        {(float *)tm.stored[0].b1, INFINITY},
        {(float *)tm.stored[5].w1 + 39, -INFINITY},
        {tm.router_w + 3, NAN},
        {tm.router_b + 5, INFINITY},
    };
    for (size_t i = 0; i < sizeof(poison) / sizeof(poison[0]); i++) {
        const float saved = *poison[i].at;
        *poison[i].at = poison[i].value;
        o = clb_default();
        EXPECT_CLB(&tm, &o, COLIBRI_ERR_NONFINITE);
        g_load_flags = COLIBRI_LOAD_SKIP_CHECKSUM; /* the scan does not depend on the CRC */
        EXPECT_CLB(&tm, &o, COLIBRI_ERR_NONFINITE);
        g_load_flags = COLIBRI_LOAD_SKIP_FINITE;
        EXPECT_CLB(&tm, &o, COLIBRI_OK);
        g_load_flags = 0;
        *poison[i].at = saved;
    }
    EXPECT_CLB(&tm, &o, COLIBRI_OK);

    /* LRU slots beyond the experts are not allocated (ASan checks the carving) */
    write_container(&tm, &o);
    colibri_model_t *fm = NULL;
    CHECK_STATUS(COLIBRI_OK, init_clb(COLIBRI_CACHE_LRU, COLIBRI_MAX_LRU_SLOTS, &fm));
    if (fm != NULL) {
        CHECK_INT(6, fm->n_slots);
        colibri_cleanup(fm);
    }
    remove_file("model.clb");
    tm_free(&tm);
}

static void test_hostile_seed(void)
{
    test_model tm;
    tm_make(&tm, 5, 2, 6, 7, COLIBRI_ACT_GELU, COLIBRI_FLAG_EXPERT_BIAS, 62);
    write_config("{\"n_experts\": 5, \"k\": 2, \"hidden_size\": 6, \"intermediate_size\": "
                 "67108864}");
    write_seed(&tm, 0x434F4C49u, 1, 5, 0, 0);
    EXPECT_INIT(COLIBRI_ERR_CONFIG); /* d_ff 2^26 > COLIBRI_FILE_MAX_DIM */
    write_config("{\"n_experts\": 65535, \"k\": 2, \"hidden_size\": 16777216, "
                 "\"intermediate_size\": 16777216}");
    write_seed(&tm, 0x434F4C49u, 1, 65535, 0, 0);
    EXPECT_INIT(COLIBRI_ERR_TRUNCATED); /* largest dims: 2^16 * 2^50 bytes, no overflow */
    write_config(k_config);
    write_seed(&tm, 0x434F4C49u, 1, 5, 0, 0);
    EXPECT_INIT(COLIBRI_OK);

    float *const poison[] = {(float *)tm.stored[1].w1 + 5, (float *)tm.stored[4].b2 + 1,
                             tm.router_w + 29};
    const float values[] = {NAN, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof(poison) / sizeof(poison[0]); i++) {
        const float saved = *poison[i];
        *poison[i] = values[i];
        write_seed(&tm, 0x434F4C49u, 1, 5, 0, 0);
        EXPECT_INIT(COLIBRI_ERR_NONFINITE);
        g_load_flags = COLIBRI_LOAD_SKIP_FINITE;
        EXPECT_INIT(COLIBRI_OK);
        g_load_flags = 0;
        *poison[i] = saved;
    }
    remove_file("model.bin");
    remove_file("router.bin");
    remove_file("config.json");
    tm_free(&tm);
}

/*
 * No block colibri_init allocates is larger than the model's files (issue 14): a real-sized
 * toy keeps all its LRU slots and the usual chunk; tiny experts whose slot bookkeeping
 * outweighs them get fewer slots with the same outputs; a model whose tables outweigh its
 * weights (d_model = d_ff = 1) is refused with COLIBRI_ERR_SIZE.
 */
static void test_blocks_bounded_by_files(void)
{
    test_model tm;
    tm_make(&tm, 5, 2, 6, 7, COLIBRI_ACT_GELU, COLIBRI_FLAG_EXPERT_BIAS, 33);
    write_config(k_config);
    write_seed(&tm, 0x434F4C49u, 1, 5, 0, 0);
    colibri_model_t *fm = NULL;
    CHECK_STATUS(COLIBRI_OK, init_file(COLIBRI_CACHE_LRU, 5, NULL, &fm));
    if (fm != NULL) {
        CHECK_INT(5, fm->n_slots);
        CHECK(fm->max_tokens >= 16);
        colibri_cleanup(fm);
    }
    tm_free(&tm);

    tm_make(&tm, 2, 1, 4, 4, COLIBRI_ACT_RELU, COLIBRI_FLAG_EXPERT_BIAS, 34);
    write_config("{\"n_experts\": 2, \"k\": 1, \"hidden_size\": 4, \"intermediate_size\": 4, "
                 "\"activation\": \"relu\"}");
    write_seed(&tm, 0x434F4C49u, 1, 2, 0, 0);
    CHECK_STATUS(COLIBRI_OK, init_file(COLIBRI_CACHE_LRU, 2, NULL, &fm));
    if (fm != NULL) {
        CHECK(fm->n_slots >= 1 && fm->n_slots <= 2);
        colibri_cleanup(fm);
    }
    check_file_matches(&tm, NULL, COLIBRI_CACHE_LRU, 2);
    tm_free(&tm);

    tm_make(&tm, 8, 2, 1, 1, COLIBRI_ACT_RELU, COLIBRI_FLAG_EXPERT_BIAS, 35);
    write_config("{\"n_experts\": 8, \"k\": 2, \"hidden_size\": 1, \"intermediate_size\": 1, "
                 "\"activation\": \"relu\"}");
    write_seed(&tm, 0x434F4C49u, 1, 8, 0, 0);
    CHECK_STATUS(COLIBRI_ERR_SIZE, init_file(COLIBRI_CACHE_PINNED, 0, NULL, &fm));
    CHECK(fm == NULL);
    tm_free(&tm);
    remove_file("model.bin");
    remove_file("router.bin");
    remove_file("config.json");
}

int main(void)
{
    snprintf(g_dir, sizeof(g_dir), "%s", "/tmp/colibri_rt_XXXXXX");
    if (mkdtemp(g_dir) == NULL) {
        fprintf(stderr, "mkdtemp failed\n");
        return 2;
    }
    test_sparse_forward_random();
    test_generated_kernels();
    test_lru();
    test_init_static();
    test_forward_errors();
    test_strerror();
    test_seed_files();
    test_container_files();
    test_hostile_container();
    test_hostile_seed();
    test_blocks_bounded_by_files();
    rmdir(g_dir);
    return test_summary();
}
