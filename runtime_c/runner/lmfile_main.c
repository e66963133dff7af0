/**
 * @file lmfile_main.c
 * @brief The model-file text-generation runner: one binary per board (host and Linux boards),
 *        built once, runs any whole model stored in a version-2 container (colibri_lm.h)
 *        without compiling anything per model. `colibri run model.clb --prompt-ids ...` uses it.
 *
 * Paths argv[1..3], else "model.clb", "input.bin", "output.bin" in the working directory; the
 * request and output files, exit statuses and bench markers are lm_runner.h's (a model file
 * the runtime refuses: 10 + (-colibri_status), printed on one line). An optional argv[4] sets
 * the KV cache positions (0 = COLIBRI_LM_DEFAULT_CONTEXT or the file's, if fewer). An optional
 * argv[5] is the expert RAM budget in bytes (colibri_lm_config_t.expert_ram_budget; 0 = every
 * expert resident), argv[6] its expert_flags (colibri_lm.h: 1 no prefetch, 2 no pinning, 4 no
 * read check, 8 prefetch always), argv[7] is num_threads (0 or 1: one thread), argv[8]
 * prefill_batch (0 = 64), argv[9] pinned_slots (0 = auto) and argv[10] max_memory (0 = no
 * ceiling). A model over the ceiling prints, before the status line (colibri_lm_measure),
 *   colibri: memory needed: T bytes (KV cache K for C positions, arena A, tables B, expert
 *   slots S, packed P)
 * and exits 10 + 18.
 * Unless the prompt's logits are asked for, the prompt is prefilled in batches
 * (colibri_lm_prefill). With a budget the runner prints, after the generation, one line:
 *   colibri: expert slots: S x B bytes, loads L hits H misses M evictions E prefetches P
 *   prefetch hits Q bytes read R pinned N pinned hits Z bytes ahead A skipped K
 * With COLIBRI_TIMING=1 in the environment it also prints the wall times of the prompt and of
 * the decode loop (lm_runner.h lm_timing; benchmarks/host_table.py reads it):
 *   colibri: timing: prefill P tokens S ns, decode D tokens T ns
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "colibri.h"
#include "colibri_lm.h"
#include "colibri_platform.h"

static colibri_lm_t *g_lm; /* the model the steps run on */

/* Print `tmpl` with each '%' replaced by the next of values[] in decimal (no printf); line
 * holds the result (the callers size it). */
static void put_line(char *line, const char *tmpl, const uint64_t *values)
{
    char *p = line;
    for (; *tmpl != '\0'; tmpl++) {
        if (*tmpl != '%') {
            *p++ = *tmpl;
            continue;
        }
        uint64_t v = *values++;
        char tmp[21];
        int k = 0;
        do {
            tmp[k++] = (char)('0' + (int)(v % 10u));
            v /= 10u;
        } while (v != 0u);
        while (k > 0) {
            *p++ = tmp[--k];
        }
    }
    *p = '\0';
    clb_platform_puts(line);
}

static void print_stats(void)
{
    colibri_lm_stats_t s;
    colibri_lm_get_stats(g_lm, &s);
    const uint64_t v[] = {s.n_slots,          s.slot_bytes, s.loads,       s.hits,
                          s.misses,           s.evictions,  s.prefetches,  s.prefetch_hits,
                          s.bytes_read,       s.n_pinned,   s.pinned_hits, s.bytes_prefetched,
                          s.prefetch_skipped, s.restores};
    char line[512];
    put_line(line,
             "colibri: expert slots: % x % bytes, loads % hits % misses % evictions % "
             "prefetches % prefetch hits % bytes read % pinned % pinned hits % bytes ahead % "
             "skipped % restores %\n",
             v);
}

/* The bytes the model needs (after COLIBRI_ERR_MEMORY), one line. */
static void print_memory(const colibri_lm_config_t *config)
{
    colibri_lm_memory_t m;
    if (colibri_lm_measure(config, &m) != COLIBRI_OK) {
        return;
    }
    const uint64_t v[] = {
        m.total_bytes, m.kv_bytes,   (uint64_t)m.max_context, m.arena_bytes - m.kv_bytes,
        m.table_bytes, m.slot_bytes, m.packed_bytes};
    char line[400];
    put_line(line,
             "colibri: memory needed: % bytes (KV cache % for % positions, arena %, tables %, "
             "expert slots %, packed %)\n",
             v);
}

/* CLOCK_MONOTONIC in ns, for lm_runner.h's timing (COLIBRI_TIMING=1). */
static uint64_t lm_clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#define LM_STEP(id, pos, logits) colibri_lm_forward(g_lm, (id), (pos), (logits))
#define LM_SAMPLE_WORKSPACE colibri_lm_sampler_workspace(g_lm)
#define LM_PREFILL(ids, n, pos, logits) colibri_lm_prefill(g_lm, (ids), (n), (pos), (logits))
#define LM_PREFILL_IDS 256
#define LM_CLOCK_NS() lm_clock_ns()
#include "lm_runner.h"

/* With COLIBRI_TIMING set in the environment: one line of the generation's wall times. */
static void print_timing(void)
{
    const char *on = getenv("COLIBRI_TIMING");
    if (on == NULL || on[0] == '\0' || strcmp(on, "0") == 0) {
        return;
    }
    const uint64_t v[] = {lm_timing.prompt_tokens, lm_timing.prefill_ns, lm_timing.decode_steps,
                          lm_timing.decode_ns};
    char line[200];
    put_line(line, "colibri: timing: prefill % tokens % ns, decode % tokens % ns\n", v);
}

/* The C type of a numeric command-line argument's field. */
typedef enum { ARG_I32, ARG_U32, ARG_U64 } arg_kind;

/* Parse s (decimal) into the field of that kind. */
static void set_number(void *field, arg_kind kind, const char *s)
{
    switch (kind) {
    case ARG_I32:
        *(int32_t *)field = (int32_t)strtol(s, NULL, 10);
        break;
    case ARG_U32:
        *(uint32_t *)field = (uint32_t)strtoul(s, NULL, 10);
        break;
    case ARG_U64:
        *(uint64_t *)field = (uint64_t)strtoull(s, NULL, 10);
        break;
    }
}

int main(int argc, char **argv)
{
    clb_platform_init();
    colibri_lm_config_t config;
    memset(&config, 0, sizeof config);
    config.model_path = argc > 1 ? argv[1] : "model.clb";
    /* argv[4..10]: optional decimal numbers, in this order */
    const struct {
        void *field;
        arg_kind kind;
    } numbers[] = {
        {&config.max_context, ARG_I32},   {&config.expert_ram_budget, ARG_U64},
        {&config.expert_flags, ARG_U32},  {&config.num_threads, ARG_I32},
        {&config.prefill_batch, ARG_I32}, {&config.pinned_slots, ARG_I32},
        {&config.max_memory, ARG_U64},
    };
    for (int i = 0; i < (int)(sizeof numbers / sizeof numbers[0]) && 4 + i < argc; i++) {
        set_number(numbers[i].field, numbers[i].kind, argv[4 + i]);
    }
    const colibri_status st = colibri_lm_init(&config, &g_lm);
    if (st == COLIBRI_ERR_MEMORY) {
        print_memory(&config);
    }
    if (st != COLIBRI_OK) {
        return lm_fail("loading the model file", st);
    }
    colibri_lm_info_t info;
    colibri_lm_info(g_lm, &info);
    uint32_t generated = 0;
    const int rc = lm_serve(argc > 2 ? argv[2] : "input.bin", argc > 3 ? argv[3] : "output.bin",
                            info.vocab_size, (uint32_t)info.max_context, &generated);
    if (rc == 0) {
        say("model file: ", generated, " tokens generated");
        if (config.expert_ram_budget > 0u) {
            print_stats();
        }
        print_timing();
    }
    colibri_lm_free(g_lm);
    return rc;
}
