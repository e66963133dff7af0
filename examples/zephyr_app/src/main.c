/**
 * @file main.c
 * @brief Colibri on Zephyr: set up the model generated into ../model by `colibri generate`
 *        (const weights, static arena, no heap), run one MoE layer over a few fixed tokens
 *        with colibri_forward and print the outputs, the chosen experts and their gates.
 */
#include <stdint.h>

#include <zephyr/kernel.h>
#include <zephyr/sys/printk.h>

#include "colibri.h"
#include "colibri_model.h"

/** Tokens of the demo input (at most one chunk of the generated buffers). */
#define DEMO_TOKENS 2

/** The token of examples/c_api/infer.c; token t is this pattern rotated by t. */
static const float demo_pattern[8] = {1.0f, 0.5f, 0.2f, 0.8f, 0.1f, 0.9f, 0.4f, 0.6f};

/** @brief Print n floats after a label, one line. */
static void print_floats(const char *label, int32_t t, const float *v, int32_t n)
{
    printk("%s[%d]:", label, (int)t);
    for (int32_t i = 0; i < n; i++) {
        printk(" %.6f", (double)v[i]);
    }
    printk("\n");
}

int main(void)
{
    colibri_model_t *model = NULL;
    colibri_gen_buffers_t buf;
    colibri_status st = colibri_gen_setup(&model, &buf);
    if (st != COLIBRI_OK) {
        printk("colibri: setup failed: %s\n", colibri_strerror(st));
        return 1;
    }
    const int32_t d = COLIBRI_GEN_D_MODEL;
    const int32_t k = COLIBRI_GEN_TOP_K;
    const int32_t n = DEMO_TOKENS < COLIBRI_GEN_MAX_TOKENS ? DEMO_TOKENS : COLIBRI_GEN_MAX_TOKENS;
    for (int32_t t = 0; t < n; t++) {
        for (int32_t i = 0; i < d; i++) {
            buf.input[t * d + i] = demo_pattern[(i + t) % 8];
        }
    }
    printk("colibri: model %s, %d experts, top-%d, d_model %d, %d tokens\n", COLIBRI_GEN_NAME,
           (int)COLIBRI_GEN_N_EXPERTS, (int)k, (int)d, (int)n);

    const uint32_t start = k_cycle_get_32();
    st = colibri_forward(model, buf.input, buf.output, n, d, k, buf.expert_ids, buf.gates,
                         buf.route_temp);
    const uint32_t cycles = k_cycle_get_32() - start;
    if (st != COLIBRI_OK) {
        printk("colibri: forward failed: %s\n", colibri_strerror(st));
        return 1;
    }
    for (int32_t t = 0; t < n; t++) {
        printk("experts[%d]:", (int)t);
        for (int32_t j = 0; j < k; j++) {
            printk(" %d", (int)buf.expert_ids[t * k + j]);
        }
        printk("\n");
        print_floats("gates", t, buf.gates + t * k, k);
        print_floats("output", t, buf.output + t * d, d);
    }
    colibri_stats_t stats;
    if (colibri_get_stats(model, &stats) == COLIBRI_OK) {
        printk("colibri: %u loads, %u hits, %u misses, %u evictions, %u cycles\n",
               (unsigned)stats.loads, (unsigned)stats.hits, (unsigned)stats.misses,
               (unsigned)stats.evictions, (unsigned)cycles);
    }
    printk("colibri: done\n");
    return 0;
}
