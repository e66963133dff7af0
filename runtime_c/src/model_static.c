/**
 * @file model_static.c
 * @brief colibri_init_static: a model whose weights are already addressable (generated const
 *        data on an MCU) with a caller-provided arena. Validates everything once so the hot
 *        path needs no checks. Also the allocation-free part of the life cycle (cleanup, and
 *        colibri_init's stub when the build has no filesystem).
 */
#include "colibri.h"
#include "colibri_internal.h"

#include <stddef.h>
#include <stdint.h>

colibri_status colibri_check_dims(const colibri_model_t *model)
{
    if (model->n_experts <= 0 || model->d_model <= 0 || model->d_ff <= 0) {
        return COLIBRI_ERR_ARG;
    }
    if (model->top_k <= 0 || model->top_k > model->n_experts || model->top_k > COLIBRI_MAX_TOP_K) {
        return COLIBRI_ERR_TOPK;
    }
    switch (model->activation) {
    case COLIBRI_ACT_GELU:
    case COLIBRI_ACT_GELU_TANH:
    case COLIBRI_ACT_SILU:
    case COLIBRI_ACT_RELU:
        break;
    default:
        return COLIBRI_ERR_ARG;
    }
    if (!colibri_router_weights_ok(model) ||
        ((model->flags & COLIBRI_FLAG_ROUTER_BIAS) && model->router_b == NULL)) {
        return COLIBRI_ERR_ARG;
    }
    return COLIBRI_OK;
}

colibri_status colibri_check_stored(const colibri_model_t *model)
{
    const int bias = (model->flags & COLIBRI_FLAG_EXPERT_BIAS) != 0;
    const int gated = (model->flags & COLIBRI_FLAG_GATED) != 0;
    if (model->stored == NULL) {
        /* Weights baked into generated kernels: every expert needs its kernel. */
        if (model->kernels == NULL) {
            return COLIBRI_ERR_ARG;
        }
        for (int32_t i = 0; i < model->n_experts; i++) {
            if (model->kernels[i] == NULL) {
                return COLIBRI_ERR_ARG;
            }
        }
        return COLIBRI_OK;
    }
    for (int32_t i = 0; i < model->n_experts; i++) {
        const int32_t owner = (model->share_eff != NULL) ? model->share_eff[i] : i;
        if (owner != i) {
            continue;
        }
        const colibri_expert_weights_t *w = &model->stored[i];
        if (w->w1 == NULL || w->w2 == NULL || (gated && w->w3 == NULL) ||
            (bias && (w->b1 == NULL || w->b2 == NULL))) {
            return COLIBRI_ERR_ARG;
        }
    }
    return COLIBRI_OK;
}

colibri_status colibri_init_static(colibri_model_t *model, const colibri_config_t *config,
                                   void *arena, size_t arena_size, int32_t max_tokens)
{
    if (model == NULL || arena == NULL || max_tokens <= 0 || ((uintptr_t)arena % 8u) != 0u) {
        return COLIBRI_ERR_ARG;
    }
    colibri_status st = colibri_check_dims(model);
    if (st != COLIBRI_OK) {
        return st;
    }
    const int32_t n_slots = colibri_slot_count(config);
    if (n_slots < 0 || (config != NULL && config->num_threads < 0)) {
        return COLIBRI_ERR_ARG;
    }
    const colibri_cache_policy policy =
        (config != NULL) ? config->cache_policy : COLIBRI_CACHE_PINNED;
    const int32_t *map = (config != NULL && config->expert_sharing_map != NULL)
                             ? config->expert_sharing_map
                             : model->share;
    st = colibri_check_sharing_map(map, model->n_experts);
    if (st != COLIBRI_OK) {
        return st;
    }
    model->share_eff = map;
    st = colibri_check_stored(model);
    if (st != COLIBRI_OK) {
        return st;
    }
    if (model->stored == NULL && n_slots > 0) {
        return COLIBRI_ERR_ARG; /* nothing to copy into a slot */
    }
    if (max_tokens > INT32_MAX / model->top_k) { /* perm indices stay in int32_t */
        return COLIBRI_ERR_NOMEM;
    }
    const size_t ws = colibri_workspace_size(model, max_tokens);
    const size_t slots = colibri_slot_bytes_checked(n_slots, colibri_slot_capacity(model));
    if (ws == 0 || slots == SIZE_MAX || slots > SIZE_MAX - ws || arena_size < ws + slots) {
        return COLIBRI_ERR_NOMEM;
    }
    model->arena = arena;
    model->arena_size = arena_size;
    model->max_tokens = max_tokens;
    model->map_base = NULL;
    model->map_size = 0;
    model->owned = NULL;
    model->is_static = 1;
    colibri_loader_setup(model, policy, n_slots, (unsigned char *)arena + ws);
    return COLIBRI_OK;
}

void colibri_cleanup(colibri_model_t *model)
{
    if (model == NULL || model->is_static) {
        return; /* static models own nothing */
    }
#ifndef COLIBRI_NO_FILESYSTEM
    colibri_file_release(model);
#endif
}

#ifdef COLIBRI_NO_FILESYSTEM
colibri_status colibri_init(const colibri_config_t *config, colibri_model_t **out_model)
{
    (void)config;
    if (out_model != NULL) {
        *out_model = NULL;
    }
    return COLIBRI_ERR_UNSUPPORTED;
}
#endif
