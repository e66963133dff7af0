/**
 * @file fuzz_common.h
 * @brief Shared part of the libFuzzer harnesses (fuzz_container.c, fuzz_seed.c): a private
 *        temporary directory for the model files colibri_init reads, a malloc hook that fails
 *        the run when colibri_init / forward / cleanup allocate more than the input justifies,
 *        and one forward pass over a few tokens.
 *
 * Allocation rule checked here (issue 14's goal): while the runtime runs, no single allocation
 * may be larger than the input, i.e. than the model's files the harness writes from it.
 * colibri_init sizes every block from the files it has validated (runtime_c/src/model_file.c,
 * colibri_file_block_alloc), so a header field cannot buy memory its file does not hold. Build with
 * -fsanitize=fuzzer,address,undefined (the hook is ASan's allocator hook).
 */
#ifndef COLIBRI_FUZZ_COMMON_H
#define COLIBRI_FUZZ_COMMON_H

#define _POSIX_C_SOURCE 200809L

#include "colibri.h"

#include <fcntl.h>
#include <sanitizer/allocator_interface.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FUZZ_TOKENS 5

static char g_fuzz_dir[64];
static volatile size_t g_alloc_limit; /* 0 = not armed (allocations outside the runtime) */
static size_t g_alloc_largest;        /* largest armed allocation seen */
static size_t g_alloc_largest_input;  /* input size that caused it */
static size_t g_input_size;

static void fuzz_malloc_hook(const volatile void *ptr, size_t size)
{
    (void)ptr;
    const size_t limit = g_alloc_limit;
    if (limit == 0) {
        return;
    }
    if (size > g_alloc_largest) {
        g_alloc_largest = size;
        g_alloc_largest_input = g_input_size;
    }
    if (size > limit) {
        fprintf(stderr, "colibri fuzz: allocation of %zu bytes for a %zu-byte input (limit %zu)\n",
                size, g_input_size, limit);
        abort(); /* libFuzzer reports the input as a crash */
    }
}

static void fuzz_free_hook(const volatile void *ptr)
{
    (void)ptr; /* the sanitizer only installs a malloc hook together with a free hook */
}

static void fuzz_report(void)
{
    fprintf(stderr, "colibri fuzz: largest runtime allocation %zu bytes (input %zu bytes)\n",
            g_alloc_largest, g_alloc_largest_input);
    char path[128];
    static const char *const k_files[] = {"model.clb", "model.bin", "config.json", "router.bin"};
    for (size_t i = 0; i < sizeof(k_files) / sizeof(k_files[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", g_fuzz_dir, k_files[i]);
        unlink(path);
    }
    rmdir(g_fuzz_dir);
}

/* A private directory on tmpfs when there is one (the files are rewritten every run). */
static inline void fuzz_setup(void)
{
    const char *base = (access("/dev/shm", W_OK) == 0) ? "/dev/shm" : "/tmp";
    snprintf(g_fuzz_dir, sizeof(g_fuzz_dir), "%s/colibri_fuzz_XXXXXX", base);
    if (mkdtemp(g_fuzz_dir) == NULL) {
        perror("mkdtemp");
        abort();
    }
    if (__sanitizer_install_malloc_and_free_hooks(fuzz_malloc_hook, fuzz_free_hook) == 0) {
        fprintf(stderr, "colibri fuzz: cannot install the malloc hook (build with ASan)\n");
        abort();
    }
    atexit(fuzz_report);
}

static inline void fuzz_path(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", g_fuzz_dir, name);
}

static inline void fuzz_write(const char *name, const uint8_t *data, size_t n)
{
    char path[128];
    fuzz_path(path, sizeof(path), name);
    const int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || (n > 0 && write(fd, data, n) != (ssize_t)n) || close(fd) != 0) {
        perror(path);
        abort();
    }
}

static inline void fuzz_arm(size_t input_size)
{
    g_input_size = input_size;
    g_alloc_limit = input_size > 0 ? input_size : 1u; /* 0 would mean "not armed" */
}

static inline void fuzz_disarm(void)
{
    g_alloc_limit = 0;
}

/*
 * colibri_init on `path` with the given policy / flags, then (if it loaded) a forward pass over
 * FUZZ_TOKENS tokens, the loader counters and cleanup. Buffers are allocated outside the armed
 * window: their sizes come from the model, which init has bounded by the file.
 */
static inline void fuzz_run(const char *path, colibri_cache_policy policy, int32_t slots,
                            uint32_t load_flags, size_t input_size)
{
    colibri_config_t cfg = {.model_path = path,
                            .cache_policy = policy,
                            .lru_cache_size = slots,
                            .num_threads = 1,
                            .load_flags = load_flags};
    colibri_model_t *model = NULL;
    fuzz_arm(input_size);
    colibri_status st = colibri_init(&cfg, &model);
    fuzz_disarm();
    if (st != COLIBRI_OK) {
        if (model != NULL || colibri_strerror(st)[0] == '\0') {
            abort(); /* contract: *out_model is NULL on error, every status has a message */
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
    fuzz_arm(input_size);
    st = colibri_forward(model, x, y, FUZZ_TOKENS, model->d_model, model->top_k, ids, gates, temp);
    if (st == COLIBRI_OK) {
        for (size_t i = 0; i < FUZZ_TOKENS * k; i++) {
            if (ids[i] < 0 || ids[i] >= model->n_experts) {
                abort(); /* routing must stay in range */
            }
        }
    }
    colibri_stats_t stats;
    if (colibri_get_stats(model, &stats) != COLIBRI_OK) {
        abort();
    }
    colibri_cleanup(model);
    fuzz_disarm();
    free(x);
    free(y);
    free(gates);
    free(ids);
}

#endif /* COLIBRI_FUZZ_COMMON_H */
