/**
 * @file lm_main.c
 * @brief The Colibri text-generation runner: a generated transformer (transformer_model.h) runs
 *        a prompt and generates tokens on any board.
 *
 * The request and output files, exit statuses and bench markers are lm_runner.h's; the KV
 * cache holds COLIBRI_LM_MAX_CONTEXT positions. Paths: argv[1], argv[2] on hosted boards;
 * "input.bin" / "output.bin" on bare metal. No heap, no printf.
 */
#include <stdint.h>

#include "colibri.h"
#include "transformer_model.h"

#define LM_STEP(id, pos, logits) colibri_lm_step((id), (pos), (logits))
#define LM_SAMPLE_WORKSPACE colibri_lm_sample_workspace()
#include "lm_runner.h"

int main(int argc, char **argv)
{
    clb_platform_init();
    const colibri_status st = colibri_lm_setup();
    if (st != COLIBRI_OK) {
        return lm_fail("setup", st);
    }
    uint32_t generated = 0;
    const int rc = lm_serve(argc > 2 ? argv[1] : "input.bin", argc > 2 ? argv[2] : "output.bin",
                            COLIBRI_LM_VOCAB, (uint32_t)COLIBRI_LM_MAX_CONTEXT, &generated);
    if (rc == 0) {
        say("model " COLIBRI_LM_NAME ": ", generated, " tokens generated");
    }
    return rc;
}
