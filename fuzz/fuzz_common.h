/**
 * @file fuzz_common.h
 * @brief Shared part of the colibri_init harnesses (fuzz_container.c, fuzz_seed.c): one load,
 *        a forward pass over a few tokens, the counters and cleanup, with fuzz_live.h's hooks
 *        enforcing the bounds colibri.h documents for colibri_init.
 *
 * Bounds checked (F = the bytes of the model's files the harness writes from its input):
 *   - no single allocation larger than F (issue 14's rule: every block is sized from a
 *     validated field, so a header cannot buy memory its file does not hold);
 *   - the live bytes over init, forward and cleanup at most FUZZ_INIT_RATIO x F (colibri.h's
 *     "colibri_init = W + D + A + S <= 4 F"; the forward pass allocates nothing).
 * The harness's own buffers are allocated with the count paused (fuzz_live_pause): their
 * sizes come from the model, which init has bounded by the file. The exit report gives the
 * largest single allocation and the largest live peak, each with its input size.
 * Build with -fsanitize=fuzzer,address,undefined (the hooks are ASan's allocator hooks).
 */
#ifndef COLIBRI_FUZZ_COMMON_H
#define COLIBRI_FUZZ_COMMON_H

#include "fuzz_live.h" /* first: it defines _POSIX_C_SOURCE */

#define FUZZ_TOKENS 5

static void fuzz_common_report(void)
{
    fprintf(stderr, "colibri fuzz: largest runtime allocation %zu bytes (input %zu bytes)\n",
            g_live_largest, g_live_largest_input);
    fuzz_live_report();
}

/* A private directory on tmpfs when there is one, and the hooks. */
static inline void fuzz_setup(void)
{
    fuzz_live_setup(fuzz_common_report);
}

/*
 * colibri_init on `path` with the given policy / flags, then (if it loaded) a forward pass over
 * FUZZ_TOKENS tokens, the loader counters and cleanup; `files` = F, the bytes of the model's
 * files.
 */
static inline void fuzz_run(const char *path, colibri_cache_policy policy, int32_t slots,
                            uint32_t load_flags, size_t files)
{
    colibri_config_t cfg = {.model_path = path,
                            .cache_policy = policy,
                            .lru_cache_size = slots,
                            .num_threads = 1,
                            .load_flags = load_flags};
    colibri_model_t *model = (colibri_model_t *)(uintptr_t)1u; /* must become NULL on error */
    const size_t f = files > 0u ? files : 1u;
    fuzz_live_arm2((unsigned long long)FUZZ_INIT_RATIO * f, f, "4 x the files (colibri_init)", f);
    colibri_status st = colibri_init(&cfg, &model);
    fuzz_live_pause();
    fuzz_check_status(st);
    if (st != COLIBRI_OK) {
        fuzz_live_disarm();
        if (model != NULL) {
            fuzz_fail(); /* contract: *out_model is NULL on error */
        }
        return;
    }
    const size_t d = (size_t)model->d_model, k = (size_t)model->top_k;
    float *x = malloc(sizeof(float) * FUZZ_TOKENS * d);
    float *y = malloc(sizeof(float) * FUZZ_TOKENS * d);
    float *gates = malloc(sizeof(float) * FUZZ_TOKENS * k);
    int32_t *ids = malloc(sizeof(int32_t) * FUZZ_TOKENS * k);
    float temp[FUZZ_TOKENS];
    if (x == NULL || y == NULL || gates == NULL || ids == NULL) {
        abort();
    }
    for (size_t i = 0; i < FUZZ_TOKENS * d; i++) {
        x[i] = (float)((int)((i * 7u) % 17u) - 8) * 0.125f;
    }
    fuzz_live_resume();
    st = colibri_forward(model, x, y, FUZZ_TOKENS, model->d_model, model->top_k, ids, gates, temp);
    fuzz_check_status(st);
    if (st == COLIBRI_OK) {
        for (size_t i = 0; i < FUZZ_TOKENS * k; i++) {
            if (ids[i] < 0 || ids[i] >= model->n_experts) {
                fuzz_fail(); /* routing must stay in range */
            }
        }
    }
    colibri_stats_t stats;
    if (colibri_get_stats(model, &stats) != COLIBRI_OK) {
        fuzz_fail();
    }
    colibri_cleanup(model);
    fuzz_live_disarm();
    free(x);
    free(y);
    free(gates);
    free(ids);
}

#endif /* COLIBRI_FUZZ_COMMON_H */
