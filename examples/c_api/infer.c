/**
 * @file infer.c
 * @brief Colibri C API example: load a model file (seed flat layout or Colibri container),
 *        route one token through the MoE layer and print what happened.
 *
 * Build against the installed runtime (`scons install`; see README.md):
 *   cc -std=c11 -O2 infer.c $(pkg-config --cflags --libs colibri) -o infer
 * Run:
 *   ./infer path/to/toy_moe.bin
 */
#include "colibri.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    colibri_config_t config = {
        .model_path = argc > 1 ? argv[1] : "toy_moe.bin",
        .cache_policy = COLIBRI_CACHE_LRU,
        .lru_cache_size = 2,
        .num_threads = 1,
    };
    colibri_model_t *model = NULL;
    colibri_status st = colibri_init(&config, &model);
    if (st != COLIBRI_OK) {
        fprintf(stderr, "colibri_init(%s): %s\n", config.model_path, colibri_strerror(st));
        return 1;
    }

    static const float demo[8] = {1.0f, 0.5f, 0.2f, 0.8f, 0.1f, 0.9f, 0.4f, 0.6f};
    const int32_t d_model = model->d_model;
    float *input = malloc(sizeof(float) * (size_t)d_model);
    float *output = malloc(sizeof(float) * (size_t)d_model);
    if (input == NULL || output == NULL) {
        fprintf(stderr, "out of memory\n");
        free(input);
        free(output);
        colibri_cleanup(model);
        return 1;
    }
    if (d_model != 8) {
        printf("Note: model d_model is %d, not 8; using a repeating input pattern.\n",
               (int)d_model);
    }
    for (int32_t i = 0; i < d_model; i++) {
        input[i] = demo[i % 8];
    }

    int32_t expert_id = -1;
    float gate = 0.0f;
    float route_temp = 0.0f;
    st = colibri_forward(model, input, output, 1, d_model, 1, &expert_id, &gate, &route_temp);
    if (st != COLIBRI_OK) {
        fprintf(stderr, "colibri_forward: %s\n", colibri_strerror(st));
        free(input);
        free(output);
        colibri_cleanup(model);
        return 1;
    }

    printf("Input:");
    for (int32_t i = 0; i < d_model; i++) {
        printf(" %.6f", (double)input[i]);
    }
    printf("\nOutput:");
    for (int32_t i = 0; i < d_model; i++) {
        printf(" %.9g", (double)output[i]);
    }
    printf("\nExpert chosen: %d, Gate weight: %.3f\n", (int)expert_id, (double)gate);

    colibri_stats_t stats;
    if (colibri_get_stats(model, &stats) == COLIBRI_OK) {
        printf("Loader: %llu loads, %llu hits, %llu misses, %llu evictions\n",
               (unsigned long long)stats.loads, (unsigned long long)stats.hits,
               (unsigned long long)stats.misses, (unsigned long long)stats.evictions);
    }
    free(input);
    free(output);
    colibri_cleanup(model);
    return 0;
}
