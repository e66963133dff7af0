/**
 * @file fuzz_lm.c
 * @brief libFuzzer harness: the input is a version-2 whole-model container (.clb). A config is
 *        derived from the input (its size and last byte): expert RAM budget 0 or a few KB,
 *        1 or 2 threads, max_context 0 (the default) or 1..16 (at most the file's), prefill
 *        batch 0..4, load flags with or without the checksums and the NaN / Inf scan, prefetch
 *        and pinning on or off. Then colibri_lm_measure, colibri_lm_init with max_memory =
 *        the measured total, and on success a prefill of 2-3 tokens, 2-3 forward steps, one
 *        call at a position past those run (COLIBRI_ERR_POSITION), a greedy sample of the
 *        logits, info, stats and free. COLIBRI_FUZZ_LM_CONTEXT=N in the environment sets
 *        max_context to N for every input (0: the default; for tests of one file).
 *
 * Checked (abort on violation): *out is NULL on error and every status has a message; a file
 * colibri_lm_measure refuses is refused by colibri_lm_init too, and one it measures is never
 * COLIBRI_ERR_MEMORY under its own total; the measured table_bytes are at most 24 x the file
 * (colibri_lm.h); the live bytes colibri_lm_measure holds stay within that table bound; the
 * live bytes from colibri_lm_init to colibri_lm_free (forward passes included) stay within
 * the measured total_bytes + FUZZ_LM_THREAD_SLACK per worker thread (fuzz_live.h); a skipped
 * position is COLIBRI_ERR_POSITION; sampled ids are in the vocabulary. The logits are not required
 * to be finite (the weights are fuzzed).
 *
 * The custom mutator fixes each mutated input's file_size and CRC-32s (fuzz_live.h,
 * fuzz_fix_container), so most inputs pass the checksums and reach the shape checks and the
 * forward pass; one mutation in 8 is left unfixed so the checksum refusals are fuzzed too.
 */
#include "fuzz_live.h" /* first: it defines _POSIX_C_SOURCE */

#include "colibri_lm.h"
#include "colibri_transformer.h"

/*
 * Bytes allowed above colibri_lm_measure's total_bytes per worker thread (num_threads - 1):
 * the C library's, which the runtime does not count (colibri_lm.h's pool term: "thread stacks
 * are the system's") and the file does not size. glibc's pthread_create allocates the new
 * thread's dynamic thread vector through the process's malloc (elf/dl-tls.c, allocate_dtv:
 * calloc of 16 x (TLS modules + 16) bytes; ASan's calloc, so the hook sees it): 304 bytes per
 * thread in this harness; and ASan's set-up of the new thread calls pthread_getattr_np, whose
 * CPU set is reallocated (grown in steps) and freed while the creating thread goes on: up to
 * 520 bytes over the total were seen with one worker on this 2-CPU machine. 1024 leaves room
 * for more TLS modules and CPUs.
 */
#define FUZZ_LM_THREAD_SLACK 1024u
/* colibri_lm.h: the tables colibri_lm_init allocates are at most 24 x the file's bytes. */
#define FUZZ_LM_TABLE_RATIO 24u

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed);

static double g_table_ratio; /* largest measured table_bytes / input */
static size_t g_table_ratio_bytes, g_table_ratio_input;
static unsigned long long g_loaded;  /* inputs colibri_lm_init accepted */
static int32_t g_force_context = -1; /* COLIBRI_FUZZ_LM_CONTEXT: max_context of every run */

static void fuzz_lm_report(void)
{
    fprintf(stderr,
            "colibri fuzz: largest table_bytes %zu bytes (input %zu bytes, ratio %.3f); "
            "%llu inputs loaded\n",
            g_table_ratio_bytes, g_table_ratio_input, g_table_ratio, g_loaded);
    fuzz_live_report();
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_live_setup(fuzz_lm_report);
    const char *ctx = getenv("COLIBRI_FUZZ_LM_CONTEXT");
    if (ctx != NULL && ctx[0] >= '0' && ctx[0] <= '9') {
        g_force_context = (int32_t)strtol(ctx, NULL, 10);
    }
    return 0;
}

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed)
{
    return fuzz_mutate_fixed(data, size, max_size, seed);
}

/* Greedy sample of the logits: a token id inside the vocabulary, or COLIBRI_ERR_NAN. */
static void check_sample(colibri_lm_t *lm, const float *logits, int32_t vocab)
{
    if (logits == NULL) {
        fuzz_fail(); /* contract: logits set on COLIBRI_OK */
    }
    const colibri_sampler_t greedy = {0.0f, 0, 1.0f};
    colibri_rng_t rng;
    colibri_rng_seed(&rng, 1u);
    int32_t token = -1;
    const colibri_status st =
        colibri_sample(logits, vocab, &greedy, &rng, colibri_lm_sampler_workspace(lm), &token);
    fuzz_check_status(st);
    if (st == COLIBRI_OK && (token < 0 || token >= vocab)) {
        fuzz_fail(); /* ids in range */
    }
}

/* Prefill 2-3 tokens, 2-3 steps, a skipped position; the handle's run positions tracked. */
static void run_model(colibri_lm_t *lm, const uint8_t *data, size_t size, uint32_t h)
{
    colibri_lm_info_t info;
    if (colibri_lm_info(lm, &info) != COLIBRI_OK || info.vocab_size < 1 || info.max_context < 1) {
        fuzz_fail();
    }
    const int32_t vocab = info.vocab_size, ctx = info.max_context;
    int32_t tokens[3];
    for (int i = 0; i < 3; i++) {
        tokens[i] = (int32_t)(data[(size_t)i * 131u % size] % (uint32_t)vocab);
    }
    int32_t run = 0; /* positions 0 .. run - 1 hold KV rows */
    const float *logits = NULL;
    const int32_t n = 2 + (int32_t)(h >> 20 & 1u);
    colibri_status st = colibri_lm_prefill(lm, tokens, n, 0, &logits);
    fuzz_check_status(st);
    if (st == COLIBRI_OK) {
        run = n;
        check_sample(lm, logits, vocab);
    } else if (n <= ctx && st != COLIBRI_ERR_NAN && st != COLIBRI_ERR_CHECKSUM &&
               st != COLIBRI_ERR_CHANGED) {
        fprintf(stderr, "colibri fuzz: prefill of %d tokens in a %d-position cache: %s\n", n, ctx,
                colibri_strerror(st));
        fuzz_fail(); /* valid tokens and positions: only the weights' or the file's fault */
    }
    const int32_t steps = 2 + (int32_t)(h >> 21 & 1u);
    for (int32_t s = 0; s < steps; s++) {
        const int32_t pos = run;
        st = colibri_lm_forward(lm, tokens[s % 3], pos, &logits);
        fuzz_check_status(st);
        if (st == COLIBRI_OK) {
            run = pos + 1;
            check_sample(lm, logits, vocab);
        } else {
            run = pos; /* a failed call forgets the positions from pos on */
        }
    }
    if (run + 1 < ctx) {
        st = colibri_lm_forward(lm, tokens[0], run + 1, &logits);
        if (st != COLIBRI_ERR_POSITION) {
            fprintf(stderr, "colibri fuzz: position %d after %d run: %s\n", run + 1, run,
                    colibri_strerror(st));
            fuzz_fail(); /* a skipped position reads KV rows never written */
        }
        st = colibri_lm_prefill(lm, &tokens[1], 1, run + 1, &logits);
        if (st != COLIBRI_ERR_POSITION) {
            fprintf(stderr, "colibri fuzz: prefill at position %d after %d run: %s\n", run + 1, run,
                    colibri_strerror(st));
            fuzz_fail();
        }
    }
    colibri_lm_stats_t stats;
    if (colibri_lm_get_stats(lm, &stats) != COLIBRI_OK || stats.hits > stats.loads ||
        stats.misses > stats.loads) {
        fuzz_fail();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0) {
        return 0;
    }
    char path[128];
    fuzz_live_path(path, sizeof(path), "model.clb");
    fuzz_live_write("model.clb", data, size);

    /* The config, from the size and the last byte (a hash, so one mutation moves it). */
    const uint32_t h = ((uint32_t)size * 2654435761u) ^ ((uint32_t)data[size - 1] * 40503u);
    static const uint64_t k_budgets[8] = {0, 0, 0, 0, 1024, 3072, 8192, 32768};
    static const uint32_t k_flags[4] = {0u, COLIBRI_LOAD_SKIP_CHECKSUM, COLIBRI_LOAD_SKIP_FINITE,
                                        COLIBRI_LOAD_SKIP_CHECKSUM | COLIBRI_LOAD_SKIP_FINITE};
    const uint32_t file_ctx = size >= 128u ? fuzz_rd32(data + 84) : 0u;
    int32_t ctx_cap = file_ctx >= 1u && file_ctx < 16u ? (int32_t)file_ctx : 16;
    colibri_lm_config_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.model_path = path;
    cfg.expert_ram_budget = k_budgets[h & 7u];
    cfg.num_threads = 1 + (int32_t)(h >> 3 & 1u);
    cfg.max_context = (h >> 4 & 7u) == 0u ? 0 : 1 + (int32_t)((h >> 7) % (uint32_t)ctx_cap);
    if (g_force_context >= 0) {
        cfg.max_context = g_force_context; /* tests/runtime/test_fuzz.py: 0 = the default */
    }
    cfg.prefill_batch = (int32_t)(h >> 12 & 3u);
    cfg.load_flags = k_flags[h >> 14 & 3u];
    cfg.expert_flags = h >> 16 & 3u;

    colibri_lm_memory_t mem;
    fuzz_live_arm((unsigned long long)FUZZ_LM_TABLE_RATIO * size, "24 x the file (measure)", size);
    const colibri_status measured = colibri_lm_measure(&cfg, &mem);
    fuzz_live_disarm();
    fuzz_check_status(measured);
    if (measured == COLIBRI_OK) {
        if (mem.table_bytes > (uint64_t)FUZZ_LM_TABLE_RATIO * size ||
            mem.total_bytes < mem.table_bytes) {
            fprintf(stderr, "colibri fuzz: table_bytes %llu for a %zu-byte file\n",
                    (unsigned long long)mem.table_bytes, size);
            fuzz_fail();
        }
        const double ratio = (double)mem.table_bytes / (double)size;
        if (ratio > g_table_ratio) {
            g_table_ratio = ratio;
            g_table_ratio_bytes = (size_t)mem.table_bytes;
            g_table_ratio_input = size;
        }
        cfg.max_memory = mem.total_bytes;
    }

    colibri_lm_t *lm = (colibri_lm_t *)(uintptr_t)1u; /* must become NULL on error */
    const unsigned long long bound =
        measured == COLIBRI_OK ? (unsigned long long)mem.total_bytes +
                                     FUZZ_LM_THREAD_SLACK * (unsigned)(cfg.num_threads - 1)
                               : (unsigned long long)FUZZ_LM_TABLE_RATIO * size;
    fuzz_live_arm(bound, measured == COLIBRI_OK ? "the measured total" : "24 x the file", size);
    const colibri_status st = colibri_lm_init(&cfg, &lm);
    fuzz_check_status(st);
    if (st != COLIBRI_OK) {
        fuzz_live_disarm();
        if (lm != NULL) {
            fuzz_fail(); /* contract: *out NULL on error */
        }
        if (measured == COLIBRI_OK && st == COLIBRI_ERR_MEMORY) {
            fuzz_fail(); /* measure's total is enough for init */
        }
        return 0;
    }
    if (measured != COLIBRI_OK) {
        fprintf(stderr, "colibri fuzz: init loaded a file measure refused (%s)\n",
                colibri_strerror(measured));
        fuzz_fail();
    }
    g_loaded++;
    run_model(lm, data, size, h);
    colibri_lm_free(lm);
    fuzz_live_disarm();
    return 0;
}
