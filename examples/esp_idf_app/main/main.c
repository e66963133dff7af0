/**
 * @file main.c
 * @brief Colibri on ESP-IDF (esp32s3): set up the model generated into ../model by
 *        `colibri generate --board esp32s3` (const weights in flash, static arena, no heap),
 *        run one MoE layer over a few fixed tokens with colibri_forward and print the outputs,
 *        the chosen experts and their gates.
 */
#include <stdint.h>
#include <stdio.h>

#include "esp_log.h"
#include "esp_timer.h"

#include "colibri.h"
#include "colibri_model.h"

/** Tokens of the demo input (at most one chunk of the generated buffers). */
#define DEMO_TOKENS 2

static const char *TAG = "colibri";

/** The token of examples/c_api/infer.c; token t is this pattern rotated by t. */
static const float demo_pattern[8] = {1.0f, 0.5f, 0.2f, 0.8f, 0.1f, 0.9f, 0.4f, 0.6f};

/** @brief Print n floats after a label, one line. */
static void print_floats(const char *label, int32_t t, const float *v, int32_t n)
{
    printf("%s[%d]:", label, (int)t);
    for (int32_t i = 0; i < n; i++) {
        printf(" %.6f", (double)v[i]);
    }
    printf("\n");
}

void app_main(void)
{
    colibri_model_t *model = NULL;
    colibri_gen_buffers_t buf;
    colibri_status st = colibri_gen_setup(&model, &buf);
    if (st != COLIBRI_OK) {
        ESP_LOGE(TAG, "setup failed: %s", colibri_strerror(st));
        return;
    }
    const int32_t d = COLIBRI_GEN_D_MODEL;
    const int32_t k = COLIBRI_GEN_TOP_K;
    const int32_t n = DEMO_TOKENS < COLIBRI_GEN_MAX_TOKENS ? DEMO_TOKENS : COLIBRI_GEN_MAX_TOKENS;
    for (int32_t t = 0; t < n; t++) {
        for (int32_t i = 0; i < d; i++) {
            buf.input[t * d + i] = demo_pattern[(i + t) % 8];
        }
    }
    ESP_LOGI(TAG, "model %s, %d experts, top-%d, d_model %d, %d tokens", COLIBRI_GEN_NAME,
             (int)COLIBRI_GEN_N_EXPERTS, (int)k, (int)d, (int)n);

    const int64_t start = esp_timer_get_time();
    st = colibri_forward(model, buf.input, buf.output, n, d, k, buf.expert_ids, buf.gates,
                         buf.route_temp);
    const int64_t elapsed_us = esp_timer_get_time() - start;
    if (st != COLIBRI_OK) {
        ESP_LOGE(TAG, "forward failed: %s", colibri_strerror(st));
        return;
    }
    for (int32_t t = 0; t < n; t++) {
        printf("experts[%d]:", (int)t);
        for (int32_t j = 0; j < k; j++) {
            printf(" %d", (int)buf.expert_ids[t * k + j]);
        }
        printf("\n");
        print_floats("gates", t, buf.gates + t * k, k);
        print_floats("output", t, buf.output + t * d, d);
    }
    colibri_stats_t stats;
    if (colibri_get_stats(model, &stats) == COLIBRI_OK) {
        ESP_LOGI(TAG, "%u loads, %u hits, %u misses, %u evictions, forward %lld us",
                 (unsigned)stats.loads, (unsigned)stats.hits, (unsigned)stats.misses,
                 (unsigned)stats.evictions, (long long)elapsed_us);
    }
    ESP_LOGI(TAG, "done");
}
