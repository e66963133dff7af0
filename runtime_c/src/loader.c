/**
 * @file loader.c
 * @brief Expert loader: hands out a pointer to an expert's weights under the model's cache
 *        policy. PINNED is zero-copy (flash const data or the mmap'ed file); LRU keeps
 *        n_slots copies, evicting the least recently used (monotonic clock stamps); NONE has
 *        one slot refilled on every load. The sharing map is applied first.
 */
#include "colibri.h"
#include "colibri_internal.h"

#include <stdint.h>
#include <string.h>

size_t colibri_expert_floats(const colibri_model_t *model)
{
    return COLIBRI_EXPERT_FLOATS(model->d_model, model->d_ff,
                                 (model->flags & COLIBRI_FLAG_GATED) != 0,
                                 (model->flags & COLIBRI_FLAG_EXPERT_BIAS) != 0);
}

size_t colibri_slot_capacity(const colibri_model_t *model)
{
    return model->slot_floats > 0 ? (size_t)model->slot_floats : colibri_expert_floats(model);
}

int32_t colibri_slot_count(const colibri_config_t *config)
{
    if (config == NULL) {
        return 0;
    }
    switch (config->cache_policy) {
    case COLIBRI_CACHE_PINNED:
        return 0;
    case COLIBRI_CACHE_NONE:
        return 1;
    case COLIBRI_CACHE_LRU:
        if (config->lru_cache_size < 1 || config->lru_cache_size > COLIBRI_MAX_LRU_SLOTS) {
            return -1;
        }
        return config->lru_cache_size;
    default:
        return -1;
    }
}

/* a * b, or SIZE_MAX when it overflows. */
static size_t mul_sat(size_t a, size_t b)
{
    if (a != 0u && b > SIZE_MAX / a) {
        return SIZE_MAX;
    }
    return a * b;
}

static size_t add_sat(size_t a, size_t b)
{
    return (b > SIZE_MAX - a) ? SIZE_MAX : a + b;
}

static size_t align16_sat(size_t n)
{
    return (n > SIZE_MAX - 15u) ? SIZE_MAX : COLIBRI_ALIGN16(n);
}

size_t colibri_slot_book_bytes(int32_t n_slots)
{
    if (n_slots <= 0) {
        return 0;
    }
    size_t n = (size_t)n_slots;
    size_t total = align16_sat(mul_sat(8u, n));
    total = add_sat(total, align16_sat(mul_sat(n, sizeof(colibri_expert_weights_t))));
    return add_sat(total, align16_sat(mul_sat(4u, n)));
}

size_t colibri_slot_bytes_checked(int32_t n_slots, size_t expert_floats)
{
    if (n_slots <= 0) {
        return 0;
    }
    const size_t n = (size_t)n_slots;
    return add_sat(colibri_slot_book_bytes(n_slots),
                   align16_sat(mul_sat(mul_sat(4u, n), expert_floats)));
}

size_t colibri_workspace_bytes_checked(int32_t n_experts, int32_t top_k, int32_t d_model,
                                       int32_t d_ff, int gated, int32_t max_tokens)
{
    if (n_experts <= 0 || top_k <= 0 || d_model <= 0 || d_ff <= 0 || max_tokens <= 0) {
        return 0;
    }
    size_t t = (size_t)max_tokens;
    size_t total = align16_sat(mul_sat(4u, add_sat(mul_sat(2u, (size_t)n_experts), 2u)));
    total = add_sat(total, align16_sat(mul_sat(mul_sat(4u, t), (size_t)top_k)));
    total = add_sat(total, mul_sat(2u, align16_sat(mul_sat(mul_sat(4u, t), (size_t)d_model))));
    total = add_sat(total,
                    align16_sat(mul_sat(mul_sat(mul_sat(4u, t), (size_t)d_ff), gated ? 2u : 1u)));
    return (total == SIZE_MAX) ? 0 : total;
}

colibri_status colibri_check_sharing_map(const int32_t *map, int32_t n_experts)
{
    if (map == NULL) {
        return COLIBRI_OK;
    }
    for (int32_t i = 0; i < n_experts; i++) {
        if (map[i] < 0 || map[i] >= n_experts || map[map[i]] != map[i]) {
            return COLIBRI_ERR_EXPERT;
        }
    }
    return COLIBRI_OK;
}

void colibri_loader_setup_split(colibri_model_t *model, colibri_cache_policy policy,
                                int32_t n_slots, void *book_area, float *slot_mem)
{
    model->cache_policy = policy;
    model->n_slots = n_slots;
    model->clock = 0;
    memset(&model->stats, 0, sizeof(model->stats));
    model->slot_mem = NULL;
    model->slot_expert = NULL;
    model->slot_stamp = NULL;
    model->slot_weights = NULL;
    if (n_slots <= 0) {
        return;
    }
    /* Same order and rounding as COLIBRI_SLOT_BYTES. */
    const size_t n = (size_t)n_slots;
    unsigned char *p = (unsigned char *)book_area;
    model->slot_stamp = (uint64_t *)(void *)p;
    p += COLIBRI_ALIGN16(8u * n);
    model->slot_weights = (colibri_expert_weights_t *)(void *)p;
    p += COLIBRI_ALIGN16(n * sizeof(colibri_expert_weights_t));
    model->slot_expert = (int32_t *)(void *)p;
    model->slot_mem = slot_mem;

    for (size_t s = 0; s < n; s++) {
        memset(&model->slot_weights[s], 0, sizeof(model->slot_weights[s]));
        model->slot_expert[s] = -1;
        model->slot_stamp[s] = 0;
    }
}

void colibri_loader_setup(colibri_model_t *model, colibri_cache_policy policy, int32_t n_slots,
                          void *slot_area)
{
    unsigned char *mem = (unsigned char *)slot_area + colibri_slot_book_bytes(n_slots);
    colibri_loader_setup_split(model, policy, n_slots, slot_area,
                               n_slots > 0 ? (float *)(void *)mem : NULL);
}

/*
 * Fill slot s with the weights of stored expert e and point slot_weights[s] at the copy.
 * fp32 experts: w1, b1, w2, b2, w3 packed back to back (COLIBRI_EXPERT_FLOATS). Experts with
 * part_bytes (quantised): each present part at a 16-byte aligned offset, exactly part_bytes
 * long; codegen sizes slot_floats for the largest such expert.
 */
static void slot_fill(colibri_model_t *model, int32_t s, int32_t e)
{
    const size_t d = (size_t)model->d_model;
    const size_t f = (size_t)model->d_ff;
    const int bias = (model->flags & COLIBRI_FLAG_EXPERT_BIAS) != 0;
    const int gated = (model->flags & COLIBRI_FLAG_GATED) != 0;
    const colibri_expert_weights_t *src = &model->stored[e];
    colibri_expert_weights_t *dst = &model->slot_weights[s];
    const float *parts[5] = {src->w1, src->b1, src->w2, src->b2, src->w3};
    const int present[5] = {1, bias, 1, bias, gated};
    const size_t floats[5] = {d * f, f, f * d, d, d * f};
    const float **out[5] = {&dst->w1, &dst->b1, &dst->w2, &dst->b2, &dst->w3};
    const int packed = (src->part_bytes[0] | src->part_bytes[1] | src->part_bytes[2] |
                        src->part_bytes[3] | src->part_bytes[4]) != 0u;
    unsigned char *base =
        (unsigned char *)(model->slot_mem + (size_t)s * colibri_slot_capacity(model));
    size_t off = 0;
    for (int i = 0; i < 5; i++) {
        *out[i] = NULL;
        dst->part_bytes[i] = src->part_bytes[i];
        if (!present[i] || (packed && parts[i] == NULL)) {
            continue;
        }
        const size_t nbytes =
            src->part_bytes[i] != 0u ? (size_t)src->part_bytes[i] : floats[i] * sizeof(float);
        if (packed) {
            off = COLIBRI_ALIGN16(off);
        }
        if (parts[i] != NULL) {
            memcpy(base + off, parts[i], nbytes);
        }
        *out[i] = (const float *)(const void *)(base + off);
        off += nbytes;
    }
    model->slot_expert[s] = e;
}

colibri_status colibri_load_expert(colibri_model_t *model, int32_t expert_id,
                                   const colibri_expert_weights_t **out_weights)
{
    if (model == NULL || out_weights == NULL) {
        return COLIBRI_ERR_ARG;
    }
    *out_weights = NULL;
    if (expert_id < 0 || expert_id >= model->n_experts) {
        return COLIBRI_ERR_EXPERT;
    }
    const int32_t e = (model->share_eff != NULL) ? model->share_eff[expert_id] : expert_id;
    model->stats.loads++;
    model->clock++;

    if (model->cache_policy == COLIBRI_CACHE_PINNED || model->n_slots <= 0) {
        model->stats.hits++;
        *out_weights = (model->stored != NULL) ? &model->stored[e] : NULL;
        return COLIBRI_OK;
    }
    if (model->cache_policy == COLIBRI_CACHE_NONE) {
        model->stats.misses++;
        slot_fill(model, 0, e);
        model->slot_stamp[0] = model->clock;
        *out_weights = &model->slot_weights[0];
        return COLIBRI_OK;
    }

    /* LRU: a hit refreshes the stamp; a miss takes an empty slot, else the oldest one. */
    int32_t victim = 0;
    for (int32_t s = 0; s < model->n_slots; s++) {
        if (model->slot_expert[s] == e) {
            model->stats.hits++;
            model->slot_stamp[s] = model->clock;
            *out_weights = &model->slot_weights[s];
            return COLIBRI_OK;
        }
        if (model->slot_expert[victim] >= 0 &&
            (model->slot_expert[s] < 0 || model->slot_stamp[s] < model->slot_stamp[victim])) {
            victim = s;
        }
    }
    model->stats.misses++;
    if (model->slot_expert[victim] >= 0) {
        model->stats.evictions++;
    }
    slot_fill(model, victim, e);
    model->slot_stamp[victim] = model->clock;
    *out_weights = &model->slot_weights[victim];
    return COLIBRI_OK;
}

colibri_status colibri_get_stats(const colibri_model_t *model, colibri_stats_t *out_stats)
{
    if (model == NULL || out_stats == NULL) {
        return COLIBRI_ERR_ARG;
    }
    *out_stats = model->stats;
    return COLIBRI_OK;
}

colibri_status colibri_reset_stats(colibri_model_t *model)
{
    if (model == NULL) {
        return COLIBRI_ERR_ARG;
    }
    memset(&model->stats, 0, sizeof(model->stats));
    return COLIBRI_OK;
}
