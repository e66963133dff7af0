/**
 * @file colibri_lm.h
 * @brief Whole models from a file: a version-2 Colibri container (`colibri convert CKPT --out
 *        model.clb`: embedding, attention, norms, routers, experts in any scheme, shared
 *        experts, LM head, RoPE tables) mmap'ed and run one token at a time, with no code
 *        generated or compiled per model. POSIX hosts and Linux boards only (the file is
 *        compiled out with COLIBRI_NO_FILESYSTEM); the MCU path is the generated C
 *        (transformer_model.h), and on integer schemes the two give the same logits bit for bit.
 *
 * The names avoid colibri_lm_setup / colibri_lm_step / colibri_lm_sample_workspace, which a
 * generated transformer_model.h defines as macros, so both headers can be included together.
 *
 * Every bad file is a negative colibri_status from colibri_lm_init, never a crash: the header
 * is validated field by field (overflow-safe, against the file size) before anything is
 * allocated, then the tensor table (inside the file, 64-aligned, in order, no overlap, unique
 * NUL-terminated names), every tensor the model needs (dtype, exact shape and size), every
 * CRC-32 and the NaN / Inf scan of fp32 tensors (each skippable by load_flags, as colibri_init).
 * Then one allocation holds the model's tables and its arena (activations, KV cache, sampler
 * workspace). A handle is used by one thread at a time; handles are independent.
 */
#ifndef COLIBRI_LM_H
#define COLIBRI_LM_H

#include <stddef.h>
#include <stdint.h>

#include "colibri.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Opaque whole-model handle (colibri_lm_init). */
typedef struct colibri_lm colibri_lm_t;

/** Options of colibri_lm_init. Zero-initialise what you do not set. */
typedef struct {
    const char *model_path; /**< version-2 container (.clb) */
    int32_t max_context;    /**< KV cache positions; 0 = the file's (its RoPE table rows) */
    uint32_t load_flags;    /**< COLIBRI_LOAD_SKIP_CHECKSUM / _SKIP_FINITE; 0 = verify all */
} colibri_lm_config_t;

/** What a loaded model is (colibri_lm_info). */
typedef struct {
    int32_t vocab_size;
    int32_t d_model;
    int32_t n_layers;
    int32_t max_context; /**< positions this handle's KV cache holds */
    size_t arena_bytes;  /**< bytes allocated for activations, KV cache and sampler */
    size_t weight_bytes; /**< bytes of the mapped file */
} colibri_lm_info_t;

/** Largest n_layers / heads a file may declare (sanity limits checked before allocation). */
#define COLIBRI_LM_MAX_LAYERS 4096
#define COLIBRI_LM_MAX_HEADS 4096

/**
 * @brief Map and validate a version-2 container, then allocate the model (see the file
 *        comment). COLIBRI_ERR_VERSION for a version-1 file (one MoE block: colibri_init).
 * @return COLIBRI_OK and *out set (release with colibri_lm_free), or a negative status with
 *         *out = NULL.
 */
colibri_status colibri_lm_init(const colibri_lm_config_t *config, colibri_lm_t **out);

/**
 * @brief Run one token at position pos (0, 1, 2, ... in order; the KV cache keeps the past):
 *        the same operations in the same order as a generated transformer_model.c.
 * @param logits out: the next-token logits [vocab], inside the handle (valid until the next
 *               call)
 * @return COLIBRI_ERR_ARG for a token outside the vocabulary, COLIBRI_ERR_NOMEM when pos is
 *         outside the KV cache (context overflow), else the MoE runtime's status.
 */
colibri_status colibri_lm_forward(colibri_lm_t *lm, int32_t token, int32_t pos,
                                  const float **logits);

/** @brief Dimensions and sizes of a loaded model. */
colibri_status colibri_lm_info(const colibri_lm_t *lm, colibri_lm_info_t *info);

/** @brief The handle's sampler workspace (COLIBRI_SAMPLE_WORKSPACE_BYTES(vocab) bytes). */
void *colibri_lm_sampler_workspace(colibri_lm_t *lm);

/** @brief Unmap and free a model. Safe on NULL. */
void colibri_lm_free(colibri_lm_t *lm);

#ifdef __cplusplus
}
#endif

#endif /* COLIBRI_LM_H */
