/**
 * @file test_shared.c
 * @brief Handles that share one model's weights (colibri.h, Thread safety), single-threaded:
 *        colibri_init_shared / colibri_init_shared_static give bit-identical outputs, keep
 *        their own counters and cache, take their policy from base or the config, refuse bad
 *        arguments, and (file models) keep the weights mapped until the last handle is
 *        cleaned up, in any order. The 4-thread TSan run is tests/c/threads/test_threads.c.
 */
#define _POSIX_C_SOURCE 200809L

#include "colibri.h"
#include "test_harness.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define E 6
#define K 2
#define D 8
#define F 12
#define T 20 /* tokens per forward */

static float g_w[E][2 * D * F + F + D];
static float g_router[E * D];
static colibri_expert_weights_t g_stored[E];
static float g_x[T * D];

static void make_weights(void)
{
    rng_seed(0x5A4Eu);
    for (int32_t i = 0; i < E; i++) {
        for (size_t j = 0; j < sizeof(g_w[i]) / sizeof(float); j++) {
            g_w[i][j] = rng_float(-0.5f, 0.5f);
        }
        g_stored[i].w1 = g_w[i];
        g_stored[i].b1 = g_w[i] + D * F;
        g_stored[i].w2 = g_w[i] + D * F + F;
        g_stored[i].b2 = g_w[i] + 2 * D * F + F;
    }
    for (size_t j = 0; j < E * D; j++) {
        g_router[j] = rng_float(-1.0f, 1.0f);
    }
    for (size_t j = 0; j < T * D; j++) {
        g_x[j] = rng_float(-2.0f, 2.0f);
    }
}

static void describe(colibri_model_t *m)
{
    memset(m, 0, sizeof(*m));
    m->n_experts = E;
    m->d_model = D;
    m->d_ff = F;
    m->top_k = K;
    m->activation = COLIBRI_ACT_GELU;
    m->flags = COLIBRI_FLAG_EXPERT_BIAS;
    m->router_w = g_router;
    m->stored = g_stored;
}

static colibri_status forward(colibri_model_t *m, float *y)
{
    int32_t ids[T * K];
    float gates[T * K], temp[T];
    return colibri_forward(m, g_x, y, T, D, K, ids, gates, temp);
}

static colibri_stats_t stats(const colibri_model_t *m)
{
    colibri_stats_t s;
    memset(&s, 0, sizeof(s));
    colibri_get_stats(m, &s);
    return s;
}

/* Static base (LRU 2) and a colibri_init_shared_static handle in an exactly-sized arena. */
static void test_shared_static(void)
{
    const colibri_config_t lru = {.cache_policy = COLIBRI_CACHE_LRU, .lru_cache_size = 2};
    colibri_model_t base, h;
    const size_t ef = COLIBRI_EXPERT_FLOATS(D, F, 0, 1);
    const size_t need = COLIBRI_WORKSPACE_BYTES(E, K, D, F, 0, 5) + COLIBRI_SLOT_BYTES(2, ef);
    describe(&base);
    CHECK_INT(need, colibri_arena_size(&base, &lru, 5));
    CHECK_INT(COLIBRI_WORKSPACE_BYTES(E, K, D, F, 0, 5), colibri_arena_size(&base, NULL, 5));
    void *arena_b = malloc(need);
    CHECK_STATUS(COLIBRI_OK, colibri_init_static(&base, &lru, arena_b, need, 5));
    CHECK_INT(need, colibri_arena_size(&base, NULL, 5)); /* base's own policy */

    const size_t need_h = colibri_arena_size(&base, NULL, 5);
    void *arena_h = malloc(need_h);
    CHECK_STATUS(COLIBRI_ERR_NOMEM,
                 colibri_init_shared_static(&h, &base, NULL, arena_h, need_h - 1, 5));
    CHECK_STATUS(COLIBRI_OK, colibri_init_shared_static(&h, &base, NULL, arena_h, need_h, 5));
    float y_b[T * D], y_h[T * D];
    CHECK_STATUS(COLIBRI_OK, forward(&base, y_b));
    CHECK_STATUS(COLIBRI_OK, forward(&base, y_b));
    CHECK_STATUS(COLIBRI_OK, forward(&h, y_h));
    CHECK_FLOATS_EQ(y_b, y_h, T * D);

    /* own counters: base ran twice, h once; resetting h leaves base alone */
    const colibri_stats_t sb = stats(&base), sh = stats(&h);
    CHECK(sh.loads > 0);
    CHECK(sh.misses > 0);
    CHECK_INT(2 * sh.loads, sb.loads); /* the same input twice: twice the loads */
    CHECK_STATUS(COLIBRI_OK, colibri_reset_stats(&h));
    CHECK_INT(0, stats(&h).loads);
    CHECK_INT(sb.loads, stats(&base).loads);
    colibri_cleanup(&h); /* no-op: owns nothing */

    /* a config overrides the policy (PINNED needs no slots); another chunk size (max_tokens
     * 3 < T), same outputs */
    const colibri_config_t pinned = {.cache_policy = COLIBRI_CACHE_PINNED};
    const size_t ws3 = colibri_arena_size(&base, &pinned, 3);
    CHECK_INT(COLIBRI_WORKSPACE_BYTES(E, K, D, F, 0, 3), ws3);
    CHECK_STATUS(COLIBRI_OK, colibri_init_shared_static(&h, &base, &pinned, arena_h, ws3, 3));
    CHECK_STATUS(COLIBRI_OK, forward(&h, y_h));
    CHECK_FLOATS_EQ(y_b, y_h, T * D);
    CHECK_INT(stats(&h).loads, stats(&h).hits);

    /* the sharing map belongs to the model: the same map is accepted, another refused */
    const int32_t ident[E] = {0, 1, 2, 3, 4, 5}, other[E] = {0, 0, 2, 3, 4, 5};
    colibri_config_t with_map = pinned;
    with_map.expert_sharing_map = ident;
    CHECK_STATUS(COLIBRI_OK, colibri_init_shared_static(&h, &base, &with_map, arena_h, ws3, 3));
    with_map.expert_sharing_map = other;
    CHECK_STATUS(COLIBRI_ERR_ARG,
                 colibri_init_shared_static(&h, &base, &with_map, arena_h, ws3, 3));

    /* arguments */
    colibri_model_t blank;
    describe(&blank); /* a descriptor, never initialised */
    const colibri_config_t bad_lru = {.cache_policy = COLIBRI_CACHE_LRU, .lru_cache_size = 0};
    const colibri_config_t bad_threads = {.cache_policy = COLIBRI_CACHE_PINNED, .num_threads = -1};
    CHECK_STATUS(COLIBRI_ERR_ARG,
                 colibri_init_shared_static(NULL, &base, NULL, arena_h, need_h, 3));
    CHECK_STATUS(COLIBRI_ERR_ARG, colibri_init_shared_static(&h, NULL, NULL, arena_h, need_h, 3));
    CHECK_STATUS(COLIBRI_ERR_ARG, colibri_init_shared_static(&h, &blank, NULL, arena_h, need_h, 3));
    CHECK_STATUS(COLIBRI_ERR_ARG,
                 colibri_init_shared_static(&base, &base, NULL, arena_h, need_h, 3));
    CHECK_STATUS(COLIBRI_ERR_ARG, colibri_init_shared_static(&h, &base, NULL, NULL, need_h, 3));
    CHECK_STATUS(COLIBRI_ERR_ARG,
                 colibri_init_shared_static(&h, &base, NULL, (char *)arena_h + 4, need_h - 4, 3));
    CHECK_STATUS(COLIBRI_ERR_ARG, colibri_init_shared_static(&h, &base, NULL, arena_h, need_h, 0));
    CHECK_STATUS(COLIBRI_ERR_ARG,
                 colibri_init_shared_static(&h, &base, &bad_lru, arena_h, need_h, 3));
    CHECK_STATUS(COLIBRI_ERR_ARG,
                 colibri_init_shared_static(&h, &base, &bad_threads, arena_h, need_h, 3));
    CHECK_INT(0, colibri_arena_size(NULL, NULL, 3));
    CHECK_INT(0, colibri_arena_size(&base, &bad_lru, 3));
    CHECK_INT(0, colibri_arena_size(&base, NULL, 0));

    /* POSIX: an allocated handle on a static base (nothing to reference-count) */
    colibri_model_t *a = NULL;
    CHECK_STATUS(COLIBRI_OK, colibri_init_shared(&base, NULL, &a));
    if (a != NULL) {
        CHECK_STATUS(COLIBRI_OK, forward(a, y_h));
        CHECK_FLOATS_EQ(y_b, y_h, T * D);
        CHECK_INT(sh.loads, stats(a).loads);
        CHECK_INT(sh.misses, stats(a).misses);
        colibri_cleanup(a);
    }
    CHECK_STATUS(COLIBRI_ERR_ARG, colibri_init_shared(NULL, NULL, &a));
    CHECK(a == NULL);
    CHECK_STATUS(COLIBRI_ERR_ARG, colibri_init_shared(&base, NULL, NULL));
    free(arena_h);
    free(arena_b);
}

/* Bytes of the test kernel's own scratch after its hidden rows (as generated kernels with
 * int8 activations keep their quantised row there). */
#define KS 20

static const colibri_model_t *g_ks_model;

/* The fp32 FFN, then the KS bytes after its n hidden rows scribbled: they are this kernel's
 * (colibri_model_t.kernel_scratch_bytes), not the cache slots' that follow the workspace. */
static void scratch_kernel(const colibri_expert_weights_t *w, const float *x, float *y, int32_t n,
                           float *scratch)
{
    colibri_expert_ffn_f32(g_ks_model, w, x, y, n, scratch);
    memset(scratch + (size_t)n * F, 0xA5, KS);
}

/* kernel_scratch_bytes is part of every handle's workspace (before its cache slots): sized by
 * colibri_workspace_size / colibri_arena_size, checked by init, inherited by shared handles. */
static void test_kernel_scratch(void)
{
    static const colibri_expert_kernel_fn kernels[E] = {scratch_kernel, scratch_kernel,
                                                        scratch_kernel, scratch_kernel,
                                                        scratch_kernel, scratch_kernel};
    const colibri_config_t lru = {.cache_policy = COLIBRI_CACHE_LRU, .lru_cache_size = 2};
    const size_t plain_ws = COLIBRI_WORKSPACE_BYTES(E, K, D, F, 0, 5);
    const size_t ws = plain_ws + COLIBRI_ALIGN16(KS);
    const size_t need = ws + COLIBRI_SLOT_BYTES(2, COLIBRI_EXPERT_FLOATS(D, F, 0, 1));
    colibri_model_t plain, base, h;
    float y_ref[T * D], y[T * D];
    describe(&plain);
    void *arena_p = malloc(plain_ws);
    CHECK_STATUS(COLIBRI_OK, colibri_init_static(&plain, NULL, arena_p, plain_ws, 5));
    CHECK_STATUS(COLIBRI_OK, forward(&plain, y_ref));

    describe(&base);
    base.kernels = kernels;
    base.kernel_scratch_bytes = KS;
    g_ks_model = &base;
    CHECK_INT(ws, colibri_workspace_size(&base, 5));
    CHECK_INT(need, colibri_arena_size(&base, &lru, 5));
    void *arena_b = malloc(need);
    CHECK_STATUS(COLIBRI_ERR_NOMEM, colibri_init_static(&base, &lru, arena_b, need - 1, 5));
    CHECK_STATUS(COLIBRI_OK, colibri_init_static(&base, &lru, arena_b, need, 5));
    for (int r = 0; r < 3; r++) { /* the slots survive the scribbles: same outputs */
        CHECK_STATUS(COLIBRI_OK, forward(&base, y));
        CHECK_FLOATS_EQ(y_ref, y, T * D);
    }

    /* a handle on base: its own kernel scratch, in its own arena */
    CHECK_INT(need, colibri_arena_size(&base, NULL, 5));
    void *arena_h = malloc(need);
    CHECK_STATUS(COLIBRI_OK, colibri_init_shared_static(&h, &base, NULL, arena_h, need, 5));
    CHECK_INT(KS, h.kernel_scratch_bytes);
    CHECK_STATUS(COLIBRI_OK, forward(&h, y));
    CHECK_FLOATS_EQ(y_ref, y, T * D);
    colibri_model_t *a = NULL;
    CHECK_STATUS(COLIBRI_OK, colibri_init_shared(&base, NULL, &a));
    if (a != NULL) {
        CHECK_INT(KS, a->kernel_scratch_bytes);
        CHECK_INT(need, colibri_arena_size(a, NULL, 5));
        CHECK_STATUS(COLIBRI_OK, forward(a, y));
        CHECK_FLOATS_EQ(y_ref, y, T * D);
        colibri_cleanup(a);
    }

    /* a size that does not fit: 0 bytes, and init says so */
    colibri_model_t huge;
    describe(&huge);
    huge.kernel_scratch_bytes = SIZE_MAX - 8u;
    CHECK_INT(0, colibri_workspace_size(&huge, 5));
    CHECK_INT(0, colibri_arena_size(&huge, NULL, 5));
    CHECK_STATUS(COLIBRI_ERR_NOMEM, colibri_init_static(&huge, NULL, arena_b, need, 5));
    free(arena_h);
    free(arena_b);
    free(arena_p);
}

/* A seed-layout file written here; handles cleaned up in every order (ASan: no use after
 * free, no leak). */
static char g_dir[64];

static void write_file(const char *name, const void *data, size_t n)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/%s", g_dir, name);
    FILE *fp = fopen(path, "wb");
    if (fp == NULL) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
    }
    fwrite(data, 1, n, fp);
    fclose(fp);
}

static void remove_file(const char *name)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/%s", g_dir, name);
    unlink(path);
}

static void test_shared_file(void)
{
    char config[160], path[128];
    const uint32_t header[3] = {0x434F4C49u, 1u, E};
    unsigned char *bin = malloc(sizeof(header) + sizeof(g_w));
    memcpy(bin, header, sizeof(header));
    for (int32_t i = 0; i < E; i++) { /* seed layout: w1, b1, w2, b2 */
        memcpy(bin + sizeof(header) + (size_t)i * sizeof(g_w[i]), g_w[i], sizeof(g_w[i]));
    }
    write_file("model.bin", bin, sizeof(header) + sizeof(g_w));
    free(bin);
    write_file("router.bin", g_router, sizeof(g_router));
    snprintf(config, sizeof(config),
             "{\"n_experts\": %d, \"k\": %d, \"hidden_size\": %d, \"intermediate_size\": %d}", E, K,
             D, F);
    write_file("config.json", config, strlen(config));
    snprintf(path, sizeof(path), "%s/model.bin", g_dir);

    colibri_model_t stat;
    describe(&stat);
    void *arena = malloc(colibri_arena_size(&stat, NULL, 8));
    CHECK_STATUS(COLIBRI_OK,
                 colibri_init_static(&stat, NULL, arena, colibri_arena_size(&stat, NULL, 8), 8));
    float y_ref[T * D], y[T * D];
    CHECK_STATUS(COLIBRI_OK, forward(&stat, y_ref));

    const colibri_config_t cfg = {
        .model_path = path, .cache_policy = COLIBRI_CACHE_LRU, .lru_cache_size = 99};
    for (int order = 0; order < 3; order++) {
        colibri_model_t *base = NULL, *h1 = NULL, *h2 = NULL;
        CHECK_STATUS(COLIBRI_OK, colibri_init(&cfg, &base));
        if (base == NULL) {
            return;
        }
        CHECK_STATUS(COLIBRI_OK, colibri_init_shared(base, NULL, &h1));
        CHECK_STATUS(COLIBRI_OK, colibri_init_shared(base, &cfg, &h2)); /* init's own config */
        if (h1 == NULL || h2 == NULL) {
            colibri_cleanup(h1);
            colibri_cleanup(base);
            return;
        }
        CHECK_INT(E, h1->n_slots); /* LRU slots capped at the experts, as colibri_init does */
        CHECK_INT(E, h2->n_slots);
        CHECK(h1->arena != base->arena && h1->slot_mem != base->slot_mem);
        CHECK(h1->stored == base->stored && h1->router_w == base->router_w);
        colibri_model_t *all[3] = {base, h1, h2};
        /* order 0: base first; 1: base last; 2: base in the middle */
        const int seq[3][3] = {{0, 1, 2}, {2, 1, 0}, {1, 0, 2}};
        CHECK_STATUS(COLIBRI_OK, forward(h2, y));
        CHECK_FLOATS_EQ(y_ref, y, T * D);
        CHECK_INT(0, stats(base).loads + stats(h1).loads);
        for (int j = 0; j < 3; j++) {
            colibri_cleanup(all[seq[order][j]]);
            all[seq[order][j]] = NULL;
            for (int r = 0; r < 3; r++) { /* the remaining handles still run on the weights */
                if (all[r] != NULL) {
                    CHECK_STATUS(COLIBRI_OK, forward(all[r], y));
                    CHECK_FLOATS_EQ(y_ref, y, T * D);
                }
            }
        }
    }
    free(arena);
    remove_file("model.bin");
    remove_file("router.bin");
    remove_file("config.json");
}

int main(void)
{
    snprintf(g_dir, sizeof(g_dir), "%s", "/tmp/colibri_shared_XXXXXX");
    if (mkdtemp(g_dir) == NULL) {
        fprintf(stderr, "mkdtemp failed\n");
        return 2;
    }
    make_weights();
    test_shared_static();
    test_kernel_scratch();
    test_shared_file();
    rmdir(g_dir);
    return test_summary();
}
