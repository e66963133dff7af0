/**
 * @file fuzz_shared.c
 * @brief libFuzzer harness of colibri_init_shared: the input is a Colibri container (.clb,
 *        version 1) or, when it does not start with the container's magic, a seed flat layout
 *        model packed as fuzz_seed.c's input. colibri_init loads it (cache policy, slots and load
 * flags derived from the input's size), then colibri_init_shared makes a second handle on its
 * weights (NULL config, or another policy and up to 8 LRU slots); a forward pass over a few tokens
 * on both, whose outputs must be bit-identical (colibri.h); cleanup in both orders, the shared
 * handle running once more after base is gone when base goes first.
 *
 * Bounds checked with fuzz_live.h's live-bytes hook (F = the input's bytes, the model's file):
 * no single allocation larger than F, colibri_init holding at most 4 F at once and
 * colibri_init_shared with the shared handle's forward pass at most 3 F (colibri.h, "Memory"). The
 * largest ratios are reported at exit. The custom mutator fixes file_size and the CRC-32s as
 * fuzz_lm.c's does (one input in 8 left unfixed).
 */
#include "fuzz_live.h" /* first: it defines _POSIX_C_SOURCE */

#include "colibri.h"

#define FUZZ_TOKENS 3
/* colibri.h, "Memory": colibri_init <= 4 F, colibri_init_shared <= 3 F. */
#define FUZZ_SHARED_RATIO 3u

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed);

static double g_init_ratio; /* largest colibri_init peak / input */
static size_t g_init_peak, g_init_input;
static unsigned long long g_shared_ok; /* inputs colibri_init_shared accepted */

static void fuzz_shared_report(void)
{
    fprintf(stderr,
            "colibri fuzz: colibri_init largest live peak %zu bytes (input %zu bytes, ratio "
            "%.3f); %llu shared handles made\n",
            g_init_peak, g_init_input, g_init_ratio, g_shared_ok);
    fuzz_live_report(); /* the shared handles' peak */
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_live_setup(fuzz_shared_report);
    return 0;
}

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed)
{
    return fuzz_mutate_fixed(data, size, max_size, seed);
}

/* A forward pass over FUZZ_TOKENS rows of x into y; ids checked in range. */
static colibri_status forward(colibri_model_t *m, const float *x, float *y, int32_t *ids,
                              float *gates)
{
    float temp[FUZZ_TOKENS];
    const colibri_status st =
        colibri_forward(m, x, y, FUZZ_TOKENS, m->d_model, m->top_k, ids, gates, temp);
    fuzz_check_status(st);
    if (st == COLIBRI_OK) {
        for (size_t i = 0; i < (size_t)FUZZ_TOKENS * (size_t)m->top_k; i++) {
            if (ids[i] < 0 || ids[i] >= m->n_experts) {
                fuzz_fail(); /* routing must stay in range */
            }
        }
    }
    return st;
}

/* fuzz_seed.c's input: u16 config_len, u16 router_len, config.json, router.bin, model.bin. */
static int write_seed(const uint8_t *data, size_t size, char *path, size_t n)
{
    if (size < 4u) {
        return 0;
    }
    size_t config_len = (size_t)data[0] | ((size_t)data[1] << 8);
    size_t router_len = (size_t)data[2] | ((size_t)data[3] << 8);
    const uint8_t *p = data + 4;
    size_t left = size - 4u;
    config_len = config_len < left ? config_len : left;
    fuzz_live_write("config.json", p, config_len);
    p += config_len;
    left -= config_len;
    router_len = router_len < left ? router_len : left;
    fuzz_live_write("router.bin", p, router_len);
    p += router_len;
    left -= router_len;
    fuzz_live_write("model.bin", p, left);
    fuzz_live_path(path, n, "model.bin");
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0) {
        return 0;
    }
    char path[128];
    if (size >= 8u && memcmp(data, "CLBRMOE", 8) == 0) {
        fuzz_live_path(path, sizeof(path), "model.clb");
        fuzz_live_write("model.clb", data, size);
    } else if (!write_seed(data, size, path, sizeof(path))) {
        return 0;
    }
    const uint32_t h = ((uint32_t)size * 2654435761u) ^ ((uint32_t)data[size - 1] * 40503u);
    static const colibri_cache_policy k_policies[4] = {COLIBRI_CACHE_PINNED, COLIBRI_CACHE_LRU,
                                                       COLIBRI_CACHE_NONE, COLIBRI_CACHE_LRU};
    static const uint32_t k_flags[4] = {0u, COLIBRI_LOAD_SKIP_CHECKSUM, COLIBRI_LOAD_SKIP_FINITE,
                                        COLIBRI_LOAD_SKIP_CHECKSUM | COLIBRI_LOAD_SKIP_FINITE};
    colibri_config_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.model_path = path;
    cfg.cache_policy = k_policies[h & 3u];
    cfg.lru_cache_size = 1 + (int32_t)(h >> 2 & 3u);
    cfg.num_threads = 1;
    cfg.load_flags = k_flags[h >> 4 & 3u];

    colibri_model_t *base = (colibri_model_t *)(uintptr_t)1u; /* must become NULL on error */
    fuzz_live_arm((unsigned long long)FUZZ_INIT_RATIO * size, "4 x the file (colibri_init)", size);
    const double keep_ratio = g_live_ratio; /* fuzz_live's report is the shared handles' */
    const size_t keep_peak = g_live_ratio_peak, keep_input = g_live_ratio_input;
    colibri_status st = colibri_init(&cfg, &base);
    const size_t init_peak = fuzz_live_disarm();
    g_live_ratio = keep_ratio;
    g_live_ratio_peak = keep_peak;
    g_live_ratio_input = keep_input;
    fuzz_check_status(st);
    if (st != COLIBRI_OK) {
        if (base != NULL) {
            fuzz_fail(); /* contract: *out_model NULL on error */
        }
        return 0;
    }
    const double ratio = (double)init_peak / (double)size;
    if (ratio > g_init_ratio) {
        g_init_ratio = ratio;
        g_init_peak = init_peak;
        g_init_input = size;
    }
    const size_t d = (size_t)base->d_model, k = (size_t)base->top_k;
    float *x = malloc(sizeof(float) * FUZZ_TOKENS * d);
    float *y0 = calloc(FUZZ_TOKENS * d, sizeof(float));
    float *y1 = calloc(FUZZ_TOKENS * d, sizeof(float));
    float *gates = malloc(sizeof(float) * FUZZ_TOKENS * k);
    int32_t *ids = malloc(sizeof(int32_t) * FUZZ_TOKENS * k);
    if (x == NULL || y0 == NULL || y1 == NULL || gates == NULL || ids == NULL) {
        fuzz_fail();
    }
    for (size_t i = 0; i < FUZZ_TOKENS * d; i++) {
        x[i] = (float)((int)((i * 7u + size) % 17u) - 8) * 0.125f;
    }
    const colibri_status st0 = forward(base, x, y0, ids, gates);

    /* The shared handle: base's policy (NULL config) or another one. */
    colibri_config_t scfg;
    memset(&scfg, 0, sizeof scfg);
    scfg.cache_policy = k_policies[h >> 6 & 3u];
    scfg.lru_cache_size = 1 + (int32_t)(h >> 8 & 7u);
    scfg.num_threads = 1;
    const colibri_config_t *sc = (h >> 11 & 1u) ? &scfg : NULL;
    colibri_model_t *shared = (colibri_model_t *)(uintptr_t)1u;
    fuzz_live_arm2((unsigned long long)FUZZ_SHARED_RATIO * size, size,
                   "3 x the file (colibri_init_shared)", size);
    st = colibri_init_shared(base, sc, &shared);
    fuzz_check_status(st);
    colibri_status st1 = COLIBRI_ERR_ARG;
    if (st == COLIBRI_OK) {
        st1 = forward(shared, x, y1, ids, gates);
    }
    fuzz_live_disarm();
    if (st != COLIBRI_OK) {
        if (shared != NULL) {
            fuzz_fail();
        }
    } else {
        g_shared_ok++;
        if (st0 != st1 || (st0 == COLIBRI_OK && memcmp(y0, y1, sizeof(float) * FUZZ_TOKENS * d))) {
            fprintf(stderr, "colibri fuzz: shared handle differs from base (%s / %s)\n",
                    colibri_strerror(st0), colibri_strerror(st1));
            fuzz_fail(); /* bit-identical outputs (colibri.h) */
        }
    }
    if (shared != NULL && (h >> 12 & 1u)) {
        colibri_cleanup(base); /* base first: the weights stay mapped for the shared handle */
        base = NULL;
        if (forward(shared, x, y1, ids, gates) != st0) {
            fuzz_fail();
        }
    }
    colibri_cleanup(shared);
    colibri_cleanup(base);
    free(x);
    free(y0);
    free(y1);
    free(gates);
    free(ids);
    return 0;
}
