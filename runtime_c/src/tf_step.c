/**
 * @file tf_step.c
 * @brief The token step of a whole decoder-only transformer (colibri_transformer.h) as library
 *        functions, for the model-file runtime (lm_step.c: the mmapped container, threads,
 *        expert cache): each is the inline one of runtime_c/tiles/colibri_tf_step.h, which the
 *        generated model compiles in itself. No heap, no state.
 */
#include "../tiles/colibri_tf_step.h"

#include <stddef.h>
#include <stdint.h>

#include "colibri_transformer.h"

void colibri_tf_quantize_rows(const float *x, int8_t *xq, float *sx, int32_t n_in, int32_t n)
{
    colibri_tfi_quantize_rows(x, xq, sx, n_in, n);
}

colibri_status colibri_tf_embed(const colibri_tf_model_t *m, const int32_t *tokens, int32_t n,
                                int32_t pos0)
{
    return colibri_tfi_embed(m, tokens, n, pos0);
}

colibri_status colibri_tf_attention(const colibri_tf_model_t *m, int32_t l, int32_t pos0, int32_t n)
{
    return colibri_tfi_attention(m, l, pos0, n);
}

void colibri_tf_ffn_residual(const colibri_tf_model_t *m, int32_t l, int32_t n)
{
    colibri_tfi_ffn_residual(m, l, n);
}

colibri_status colibri_tf_logits(const colibri_tf_model_t *m, int32_t n, const float **logits)
{
    return colibri_tfi_logits(m, n, logits);
}
