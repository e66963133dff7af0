/**
 * @file status.c
 * @brief colibri_strerror: one message per status code (designated-initialiser table).
 */
#include "colibri.h"

#include <stddef.h>

/* Indexed by -status; designated initialisers keep the table and the enum in step. */
static const char *const k_messages[] = {
    [-COLIBRI_OK] = "ok",
    [-COLIBRI_ERR_ARG] = "invalid argument (NULL pointer or value out of range)",
    [-COLIBRI_ERR_IO] = "model file cannot be opened, read or mapped",
    [-COLIBRI_ERR_MAGIC] = "not a Colibri model file (bad magic)",
    [-COLIBRI_ERR_VERSION] = "unsupported model format version",
    [-COLIBRI_ERR_TRUNCATED] = "model file is truncated (shorter than its header says)",
    [-COLIBRI_ERR_SIZE] = "model file size or tensor shape inconsistent with the config",
    [-COLIBRI_ERR_CONFIG] = "config.json missing, or a field missing or invalid",
    [-COLIBRI_ERR_TOPK] = "top_k must be in 1..num_experts and <= COLIBRI_MAX_TOP_K",
    [-COLIBRI_ERR_DIM] = "d_model differs from the model's hidden size",
    [-COLIBRI_ERR_NAN] = "NaN or Inf in router input or logits",
    [-COLIBRI_ERR_NOMEM] = "out of memory or static arena too small",
    [-COLIBRI_ERR_EXPERT] = "expert id out of range or invalid expert sharing map",
    [-COLIBRI_ERR_UNSUPPORTED] = "dtype or feature not supported by this build",
    [-COLIBRI_ERR_FORMAT] = "malformed container: tensor missing, duplicated or misplaced",
    [-COLIBRI_ERR_CHECKSUM] = "model file is corrupt: a tensor fails its CRC-32 check",
    [-COLIBRI_ERR_NONFINITE] = "model weights contain NaN or Inf",
    [-COLIBRI_ERR_BUDGET] = "expert RAM budget too small: it must hold top_k experts of a layer",
    [-COLIBRI_ERR_MEMORY] = "the model needs more memory than the memory ceiling allows",
    [-COLIBRI_ERR_POSITION] = "position past the tokens run so far (the KV cache has no row there)",
    [-COLIBRI_ERR_CHANGED] = "model file changed on disk (truncated or rewritten) after loading",
};

#define K_N_MESSAGES ((int)(sizeof(k_messages) / sizeof(k_messages[0])))

const char *colibri_strerror(int status)
{
    if (status <= 0 && status > -K_N_MESSAGES && k_messages[-status] != NULL) {
        return k_messages[-status];
    }
    return "unknown colibri status";
}
