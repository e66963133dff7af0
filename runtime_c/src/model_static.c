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
#include <string.h>

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

/* The arena a handle on dims needs for chunks of max_tokens tokens and n_slots slots: its
 * workspace (*ws bytes, at its start) and the slots after it, or COLIBRI_ERR_NOMEM when that
 * is more than arena_size (or than the size types hold). */
static colibri_status arena_check(const colibri_model_t *dims, int32_t n_slots, size_t arena_size,
                                  int32_t max_tokens, size_t *ws)
{
    if (max_tokens > INT32_MAX / dims->top_k) { /* perm indices stay in int32_t */
        return COLIBRI_ERR_NOMEM;
    }
    *ws = colibri_workspace_size(dims, max_tokens);
    const size_t slots = colibri_slot_bytes_checked(n_slots, colibri_slot_capacity(dims));
    if (*ws == 0 || slots == SIZE_MAX || slots > SIZE_MAX - *ws || arena_size < *ws + slots) {
        return COLIBRI_ERR_NOMEM;
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
    size_t ws;
    st = arena_check(model, n_slots, arena_size, max_tokens, &ws);
    if (st != COLIBRI_OK) {
        return st;
    }
    model->map_base = NULL;
    model->map_size = 0;
    model->owned = NULL;
    colibri_model_set_arena(model, arena, arena_size, max_tokens, 1);
    colibri_loader_setup(model, policy, n_slots, (unsigned char *)arena + ws);
    return COLIBRI_OK;
}

colibri_status colibri_shared_policy(const colibri_model_t *base, const colibri_config_t *config,
                                     colibri_cache_policy *policy, int32_t *n_slots)
{
    if (base == NULL || base->arena == NULL || base->max_tokens <= 0) {
        return COLIBRI_ERR_ARG; /* not an initialised handle */
    }
    if (config == NULL) {
        *policy = base->cache_policy;
        *n_slots = base->n_slots;
        return COLIBRI_OK;
    }
    const int32_t slots = colibri_slot_count(config);
    if (slots < 0 || config->num_threads < 0) {
        return COLIBRI_ERR_ARG;
    }
    if (config->expert_sharing_map != NULL) {
        /* the map is part of the model: a handle on the same weights cannot change it */
        for (int32_t i = 0; i < base->n_experts; i++) {
            const int32_t used = (base->share_eff != NULL) ? base->share_eff[i] : i;
            if (config->expert_sharing_map[i] != used) {
                return COLIBRI_ERR_ARG;
            }
        }
    }
    if (base->stored == NULL && slots > 0) {
        return COLIBRI_ERR_ARG; /* weights baked into kernels: nothing to copy into a slot */
    }
    *policy = config->cache_policy;
    *n_slots = slots;
    return COLIBRI_OK;
}

colibri_status colibri_shared_attach(colibri_model_t *model, const colibri_model_t *base,
                                     colibri_cache_policy policy, int32_t n_slots, void *arena,
                                     size_t arena_size, int32_t max_tokens)
{
    if (model == NULL || model == base || arena == NULL || max_tokens <= 0 ||
        ((uintptr_t)arena % 8u) != 0u) {
        return COLIBRI_ERR_ARG;
    }
    size_t ws;
    const colibri_status st = arena_check(base, n_slots, arena_size, max_tokens, &ws);
    if (st != COLIBRI_OK) {
        return st;
    }
    /* Field by field, only what init made read-only: base's counters, clock and slot arrays
     * may be changing under a forward pass in another thread. */
    memset(model, 0, sizeof(*model));
    model->n_experts = base->n_experts;
    model->d_model = base->d_model;
    model->d_ff = base->d_ff;
    model->top_k = base->top_k;
    model->activation = base->activation;
    model->flags = base->flags;
    model->router_w = base->router_w;
    model->router_b = base->router_b;
    model->stored = base->stored;
    model->share = base->share;
    model->kernels = base->kernels;
    model->shared_expert = base->shared_expert;
    model->kernel_scratch_bytes = base->kernel_scratch_bytes; /* in this handle's workspace */
    model->share_eff = base->share_eff;
    model->slot_floats = base->slot_floats;
    model->router_scheme = base->router_scheme;
    model->router_wq = base->router_wq;
    model->router_scale = base->router_scale;
    /* owns nothing; colibri_init_shared takes ownership afterwards */
    colibri_model_set_arena(model, arena, arena_size, max_tokens, 1);
    colibri_loader_setup(model, policy, n_slots, (unsigned char *)arena + ws);
    return COLIBRI_OK;
}

colibri_status colibri_init_shared_static(colibri_model_t *model, const colibri_model_t *base,
                                          const colibri_config_t *config, void *arena,
                                          size_t arena_size, int32_t max_tokens)
{
    colibri_cache_policy policy;
    int32_t n_slots;
    if (model == NULL) {
        return COLIBRI_ERR_ARG;
    }
    colibri_status st = colibri_shared_policy(base, config, &policy, &n_slots);
    if (st != COLIBRI_OK) {
        return st;
    }
    return colibri_shared_attach(model, base, policy, n_slots, arena, arena_size, max_tokens);
}

size_t colibri_arena_size(const colibri_model_t *model, const colibri_config_t *config,
                          int32_t max_tokens)
{
    int32_t n_slots;
    if (model == NULL) {
        return 0;
    }
    if (config != NULL) {
        n_slots = colibri_slot_count(config);
    } else {
        n_slots = (model->arena != NULL) ? model->n_slots : 0;
    }
    const size_t ws = colibri_workspace_size(model, max_tokens);
    const size_t slots = colibri_slot_bytes_checked(n_slots, colibri_slot_capacity(model));
    if (n_slots < 0 || ws == 0 || slots == SIZE_MAX || slots > SIZE_MAX - ws) {
        return 0;
    }
    return ws + slots;
}

#ifdef COLIBRI_NO_FILESYSTEM
/* Without a file system every model is static and owns nothing (model_file.c has the POSIX
 * colibri_init, colibri_init_shared and colibri_cleanup). */
void colibri_cleanup(colibri_model_t *model)
{
    (void)model;
}

colibri_status colibri_init(const colibri_config_t *config, colibri_model_t **out_model)
{
    (void)config;
    if (out_model != NULL) {
        *out_model = NULL;
    }
    return COLIBRI_ERR_UNSUPPORTED;
}

colibri_status colibri_init_shared(const colibri_model_t *base, const colibri_config_t *config,
                                   colibri_model_t **out_model)
{
    (void)base;
    (void)config;
    if (out_model != NULL) {
        *out_model = NULL;
    }
    return COLIBRI_ERR_UNSUPPORTED;
}
#endif
