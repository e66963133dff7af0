/**
 * @file lmfile_main.c
 * @brief The model-file text-generation runner: one binary per board (host and Linux boards),
 *        built once, runs any whole model stored in a version-2 container (colibri_lm.h)
 *        without compiling anything per model. `colibri run model.clb --prompt-ids ...` uses it.
 *
 * Paths argv[1..3], else "model.clb", "input.bin", "output.bin" in the working directory; the
 * request and output files, exit statuses and bench markers are lm_runner.h's (a model file
 * the runtime refuses: 10 + (-colibri_status), printed on one line). An optional argv[4] sets
 * the KV cache positions (default: the file's).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "colibri.h"
#include "colibri_lm.h"

static colibri_lm_t *g_lm; /* the model the steps run on */

#define LM_STEP(id, pos, logits) colibri_lm_forward(g_lm, (id), (pos), (logits))
#define LM_SAMPLE_WORKSPACE colibri_lm_sampler_workspace(g_lm)
#include "lm_runner.h"

int main(int argc, char **argv)
{
    clb_platform_init();
    colibri_lm_config_t config;
    memset(&config, 0, sizeof config);
    config.model_path = argc > 1 ? argv[1] : "model.clb";
    if (argc > 4) {
        config.max_context = (int32_t)strtol(argv[4], NULL, 10);
    }
    const colibri_status st = colibri_lm_init(&config, &g_lm);
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
    }
    colibri_lm_free(g_lm);
    return rc;
}
