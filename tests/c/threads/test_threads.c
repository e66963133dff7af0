/**
 * @file test_threads.c
 * @brief The thread-safety contract of colibri.h under ThreadSanitizer: 4 threads, one handle
 *        each, all sharing one model's weights, run many forward passes and must reproduce a
 *        single-threaded run bit for bit; each handle keeps its own counters.
 *
 * Thread 0 runs on the base handle itself while threads 1-3 make their handles from it
 * (colibri_init_shared / colibri_init_shared_static are documented as safe during a forward
 * pass on base). Built by tests/runtime/test_threads.py against libcolibri.a from
 * `scons board=host sanitize=thread`, run with TSAN_OPTIONS=halt_on_error=1: any data race
 * stops the program with a non-zero exit.
 *
 *   test_threads FILE...     each FILE a container or seed-layout model (colibri_init, LRU)
 *   test_threads --one-handle FILE   the misuse the contract forbids, as a control: all four
 *                            threads on one handle; TSan must report a race
 *   test_threads             built with -DCOLIBRI_TEST_GENERATED and a generated model's *.c:
 *                            the static model (colibri_gen_setup) and its shared handles
 *                            (int8-activation kernels: each handle's own quantised row)
 *
 * Prints "N passed, M failed" (tests/c/test_harness.h); CHECKs run on the main thread only.
 */
#define _POSIX_C_SOURCE 200809L

#include "colibri.h"
#include "test_harness.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef COLIBRI_TEST_GENERATED
#include "colibri_model.h"
#endif

#define N_THREADS 4
#define N_BATCHES 24
#define MAX_BATCH 40
#define ROUNDS 12
#define LRU_SLOTS 3

/** How thread i > 0 gets its handle. */
typedef enum {
    HANDLE_SHARED = 0,        /* colibri_init_shared (allocates, holds a reference) */
    HANDLE_SHARED_STATIC = 1, /* colibri_init_shared_static into the thread's own arena */
    HANDLE_BASE = 2           /* no handle of its own: base (the misuse, for the control run) */
} handle_kind;

/** Inputs and the single-threaded reference outputs of one model. */
typedef struct {
    int32_t d_model, top_k;
    int32_t tokens[N_BATCHES];
    float *x[N_BATCHES];
    float *y_ref[N_BATCHES];
} workload;

typedef struct {
    const workload *wl;
    colibri_model_t *base;
    colibri_model_t *own; /* set by the thread when it makes its own handle */
    handle_kind kind;
    int index;
    int32_t rounds;
    int cleanup; /* clean up `own` in the thread when done */
    /* results, read by main after join */
    colibri_status status;
    long mismatches;
    long forwards;
    colibri_stats_t stats;
} worker;

/* One forward of batch b on m into y; COLIBRI_OK or the first error. */
static colibri_status forward_batch(colibri_model_t *m, const workload *wl, int b, float *y,
                                    int32_t *ids, float *gates, float *route_temp)
{
    return colibri_forward(m, wl->x[b], y, wl->tokens[b], wl->d_model, wl->top_k, ids, gates,
                           route_temp);
}

typedef struct {
    float *y;
    int32_t *ids;
    float *gates;
    float *route_temp;
} buffers;

static int buffers_alloc(buffers *b, const workload *wl)
{
    b->y = malloc(sizeof(float) * MAX_BATCH * (size_t)wl->d_model);
    b->ids = malloc(sizeof(int32_t) * MAX_BATCH * (size_t)wl->top_k);
    b->gates = malloc(sizeof(float) * MAX_BATCH * (size_t)wl->top_k);
    b->route_temp = malloc(sizeof(float) * MAX_BATCH);
    return b->y != NULL && b->ids != NULL && b->gates != NULL && b->route_temp != NULL;
}

static void buffers_free(buffers *b)
{
    free(b->y);
    free(b->ids);
    free(b->gates);
    free(b->route_temp);
}

/* rounds passes over every batch on m, counting outputs that differ from the reference. */
static colibri_status run_rounds(colibri_model_t *m, const workload *wl, int32_t rounds,
                                 long *mismatches, long *forwards)
{
    buffers b;
    colibri_status st = COLIBRI_OK;
    if (!buffers_alloc(&b, wl)) {
        buffers_free(&b);
        return COLIBRI_ERR_NOMEM;
    }
    for (int32_t r = 0; r < rounds && st == COLIBRI_OK; r++) {
        for (int i = 0; i < N_BATCHES && st == COLIBRI_OK; i++) {
            st = forward_batch(m, wl, i, b.y, b.ids, b.gates, b.route_temp);
            const size_t n = (size_t)wl->tokens[i] * (size_t)wl->d_model;
            if (st == COLIBRI_OK && memcmp(b.y, wl->y_ref[i], n * sizeof(float)) != 0) {
                (*mismatches)++;
            }
            (*forwards)++;
        }
    }
    buffers_free(&b);
    return st;
}

/* The arena a colibri_init_shared_static handle on base needs (16-aligned, from the heap). */
static void *arena_for(const colibri_model_t *base, size_t *bytes)
{
    *bytes = colibri_arena_size(base, NULL, base->max_tokens);
    return *bytes == 0 ? NULL : aligned_alloc(16, COLIBRI_ALIGN16(*bytes));
}

static void *worker_main(void *arg)
{
    worker *w = (worker *)arg;
    colibri_model_t *m = w->base;
    colibri_model_t static_handle;
    void *arena = NULL;
    if (w->index > 0 && w->own == NULL && w->kind != HANDLE_BASE) {
        if (w->kind == HANDLE_SHARED) {
            w->status = colibri_init_shared(w->base, NULL, &w->own);
        } else {
            size_t bytes = 0;
            arena = arena_for(w->base, &bytes);
            w->status = colibri_init_shared_static(&static_handle, w->base, NULL, arena, bytes,
                                                   w->base->max_tokens);
            w->own = &static_handle;
        }
        if (w->status != COLIBRI_OK) {
            w->own = NULL;
            free(arena);
            return NULL;
        }
    }
    if (w->own != NULL) {
        m = w->own;
    }
    w->status = run_rounds(m, w->wl, w->rounds, &w->mismatches, &w->forwards);
    colibri_get_stats(m, &w->stats);
    if (w->own == &static_handle) {
        colibri_cleanup(&static_handle); /* a no-op, documented */
        w->own = NULL;
    } else if (w->cleanup && w->own != NULL) {
        colibri_cleanup(w->own);
        w->own = NULL;
    }
    free(arena);
    return NULL;
}

/* Random inputs (seeded; the harness's generator, main thread only); reference outputs from
 * `m` before any thread starts. */
static int workload_make(workload *wl, colibri_model_t *m, uint32_t seed)
{
    buffers b;
    memset(wl, 0, sizeof(*wl));
    wl->d_model = m->d_model;
    wl->top_k = m->top_k;
    if (!buffers_alloc(&b, wl)) {
        buffers_free(&b);
        return 0;
    }
    int ok = 1;
    rng_seed(seed);
    for (int i = 0; i < N_BATCHES && ok; i++) {
        wl->tokens[i] = 1 + (int32_t)(rng_u32() % MAX_BATCH);
        const size_t n = (size_t)wl->tokens[i] * (size_t)wl->d_model;
        wl->x[i] = malloc(n * sizeof(float));
        wl->y_ref[i] = malloc(n * sizeof(float));
        if (wl->x[i] == NULL || wl->y_ref[i] == NULL) {
            ok = 0;
            break;
        }
        for (size_t j = 0; j < n; j++) {
            wl->x[i][j] = rng_float(-2.0f, 2.0f);
        }
        ok = forward_batch(m, wl, i, wl->y_ref[i], b.ids, b.gates, b.route_temp) == COLIBRI_OK;
    }
    buffers_free(&b);
    return ok;
}

static void workload_free(workload *wl)
{
    for (int i = 0; i < N_BATCHES; i++) {
        free(wl->x[i]);
        free(wl->y_ref[i]);
    }
}

/* The counters a fresh handle on base reaches after `rounds` passes, single-threaded. */
static colibri_stats_t probe_stats(const colibri_model_t *base, const workload *wl, int32_t rounds)
{
    colibri_stats_t s;
    colibri_model_t *probe = NULL;
    long bad = 0, n = 0;
    memset(&s, 0, sizeof(s));
    CHECK_STATUS(COLIBRI_OK, colibri_init_shared(base, NULL, &probe));
    if (probe != NULL) {
        CHECK_STATUS(COLIBRI_OK, run_rounds(probe, wl, rounds, &bad, &n));
        CHECK_INT(0, bad);
        colibri_get_stats(probe, &s);
        colibri_cleanup(probe);
    }
    return s;
}

/*
 * The check itself: reference on base, then N_THREADS threads (0 on base, 1..3 on handles
 * they make with `kinds[i]`), outputs bit-identical, each handle's counters its own.
 */
static void check_threads(const char *label, colibri_model_t *base, const handle_kind *kinds)
{
    workload wl;
    printf("%s: ", label);
    if (!workload_make(&wl, base, 0xC011B121u)) {
        CHECK(0 && "reference run failed");
        workload_free(&wl);
        return;
    }
    colibri_stats_t base_before;
    colibri_get_stats(base, &base_before);
    const colibri_stats_t expect = probe_stats(base, &wl, ROUNDS);

    worker w[N_THREADS];
    pthread_t tid[N_THREADS];
    memset(w, 0, sizeof(w));
    for (int i = 0; i < N_THREADS; i++) {
        w[i].wl = &wl;
        w[i].base = base;
        w[i].kind = kinds[i];
        w[i].index = i;
        w[i].rounds = ROUNDS;
        w[i].cleanup = 1;
    }
    int started = 0;
    for (int i = 0; i < N_THREADS; i++) {
        if (pthread_create(&tid[i], NULL, worker_main, &w[i]) == 0) {
            started++;
        }
    }
    CHECK_INT(N_THREADS, started);
    long forwards = 0;
    for (int i = 0; i < started; i++) {
        pthread_join(tid[i], NULL);
        CHECK_STATUS(COLIBRI_OK, w[i].status);
        CHECK_INT(0, w[i].mismatches);
        CHECK_INT((long)ROUNDS * N_BATCHES, w[i].forwards);
        forwards += w[i].forwards;
        if (i > 0 && kinds[i] != HANDLE_BASE) { /* fresh handle: the probe's counters */
            CHECK_INT(expect.loads, w[i].stats.loads);
            CHECK_INT(expect.hits, w[i].stats.hits);
            CHECK_INT(expect.misses, w[i].stats.misses);
            CHECK_INT(expect.evictions, w[i].stats.evictions);
        }
    }
    /* base counted its own loads only (reference run + thread 0), none of the others' */
    CHECK_INT(base_before.loads + expect.loads, w[0].stats.loads);
    printf("%d threads, %ld forwards, %ld mismatches; per-handle loads %llu\n", started, forwards,
           w[0].mismatches + w[1].mismatches + w[2].mismatches + w[3].mismatches,
           (unsigned long long)expect.loads);
    workload_free(&wl);
}

#ifndef COLIBRI_TEST_GENERATED
/*
 * Reference counting across threads: handles made on the main thread outlive base (cleaned
 * up first), then run and are released by worker threads; the last release unmaps the file.
 */
static void check_outlive_base(const char *path)
{
    colibri_config_t cfg;
    colibri_model_t *base = NULL;
    memset(&cfg, 0, sizeof(cfg));
    cfg.model_path = path;
    cfg.cache_policy = COLIBRI_CACHE_LRU;
    cfg.lru_cache_size = LRU_SLOTS;
    CHECK_STATUS(COLIBRI_OK, colibri_init(&cfg, &base));
    if (base == NULL) {
        return;
    }
    workload wl;
    if (!workload_make(&wl, base, 0x5EEDu)) {
        CHECK(0 && "reference run failed");
        workload_free(&wl);
        colibri_cleanup(base);
        return;
    }
    worker w[N_THREADS];
    pthread_t tid[N_THREADS];
    memset(w, 0, sizeof(w));
    for (int i = 0; i < N_THREADS; i++) {
        w[i].wl = &wl;
        w[i].base = NULL;
        w[i].index = i;
        w[i].rounds = 2;
        w[i].cleanup = 1;
        CHECK_STATUS(COLIBRI_OK, colibri_init_shared(base, &cfg, &w[i].own));
    }
    colibri_cleanup(base); /* the weights stay mapped: the handles hold references */
    int started = 0;
    for (int i = 0; i < N_THREADS; i++) {
        if (w[i].own != NULL && pthread_create(&tid[i], NULL, worker_main, &w[i]) == 0) {
            started++;
        }
    }
    CHECK_INT(N_THREADS, started);
    for (int i = 0; i < started; i++) {
        pthread_join(tid[i], NULL);
        CHECK_STATUS(COLIBRI_OK, w[i].status);
        CHECK_INT(0, w[i].mismatches);
        CHECK(w[i].own == NULL); /* released by its thread */
    }
    workload_free(&wl);
}
#endif

int main(int argc, char **argv)
{
#ifdef COLIBRI_TEST_GENERATED
    (void)argc;
    (void)argv;
    colibri_model_t *base = NULL;
    CHECK_STATUS(COLIBRI_OK, colibri_gen_setup(&base, NULL));
    if (base != NULL) {
        /* int8-activation kernels quantise into each handle's own workspace */
        printf("generated static model: kernel scratch %zu bytes\n", base->kernel_scratch_bytes);
        const handle_kind a[N_THREADS] = {HANDLE_SHARED, HANDLE_SHARED_STATIC, HANDLE_SHARED_STATIC,
                                          HANDLE_SHARED_STATIC};
        const handle_kind b[N_THREADS] = {HANDLE_SHARED, HANDLE_SHARED, HANDLE_SHARED,
                                          HANDLE_SHARED_STATIC};
        check_threads("generated static model, colibri_init_shared_static", base, a);
        check_threads("generated static model, colibri_init_shared", base, b);
    }
#else
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL_FILE...\n", argv[0]);
        return 2;
    }
    if (strcmp(argv[1], "--one-handle") == 0) {
        colibri_config_t cfg;
        colibri_model_t *base = NULL;
        memset(&cfg, 0, sizeof(cfg));
        cfg.model_path = argc > 2 ? argv[2] : "";
        cfg.cache_policy = COLIBRI_CACHE_LRU;
        cfg.lru_cache_size = LRU_SLOTS;
        CHECK_STATUS(COLIBRI_OK, colibri_init(&cfg, &base));
        if (base != NULL) {
            const handle_kind one[N_THREADS] = {HANDLE_BASE, HANDLE_BASE, HANDLE_BASE, HANDLE_BASE};
            check_threads("one handle shared by 4 threads (not allowed)", base, one);
            colibri_cleanup(base);
        }
        return test_summary();
    }
    for (int f = 1; f < argc; f++) {
        colibri_config_t cfg;
        colibri_model_t *base = NULL;
        memset(&cfg, 0, sizeof(cfg));
        cfg.model_path = argv[f];
        cfg.cache_policy = COLIBRI_CACHE_LRU;
        cfg.lru_cache_size = LRU_SLOTS;
        CHECK_STATUS(COLIBRI_OK, colibri_init(&cfg, &base));
        if (base == NULL) {
            continue;
        }
        const handle_kind a[N_THREADS] = {HANDLE_SHARED, HANDLE_SHARED, HANDLE_SHARED,
                                          HANDLE_SHARED_STATIC};
        check_threads(argv[f], base, a);
        colibri_cleanup(base);
        check_outlive_base(argv[f]);
    }
#endif
    return test_summary();
}
