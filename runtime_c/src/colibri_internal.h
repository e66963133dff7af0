/**
 * @file colibri_internal.h
 * @brief Private helpers shared by the runtime's modules (not installed, not public API).
 */
#ifndef COLIBRI_INTERNAL_H
#define COLIBRI_INTERNAL_H

#include "colibri.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef COLIBRI_DEBUG
#include <assert.h>
#define COLIBRI_DEBUG_ASSERT(cond) assert(cond)
#else
#define COLIBRI_DEBUG_ASSERT(cond) ((void)0)
#endif

/** Number of token rows the POSIX loader sizes the arena of a file model for. */
#define COLIBRI_FILE_MAX_TOKENS 256

/** @brief Floats of one expert in a cache slot, from the model's dims and flags. */
size_t colibri_expert_floats(const colibri_model_t *model);

/** @brief Workspace bytes (COLIBRI_WORKSPACE_BYTES) computed without overflow; 0 if it
 *         does not fit in size_t or the dims are invalid. */
size_t colibri_workspace_bytes_checked(int32_t n_experts, int32_t top_k, int32_t d_model,
                                       int32_t d_ff, int gated, int32_t max_tokens);

/** @brief Slot count a policy needs (LRU: lru_cache_size, NONE: 1, PINNED: 0), or <0 when
 *         the policy / size is invalid. */
/** @brief Floats one cache slot holds: model->slot_floats, else colibri_expert_floats. */
size_t colibri_slot_capacity(const colibri_model_t *model);

/** @brief Whether the router weights the model's router_scheme needs are present. */
int colibri_router_weights_ok(const colibri_model_t *model);

int32_t colibri_slot_count(const colibri_config_t *config);

/** @brief COLIBRI_SLOT_BYTES computed without overflow; SIZE_MAX when it does not fit. */
size_t colibri_slot_bytes_checked(int32_t n_slots, size_t expert_floats);

/** @brief The slot bookkeeping at the start of COLIBRI_SLOT_BYTES (stamps, weight tables,
 *         expert ids: COLIBRI_SLOT_BYTES(n, 0)); SIZE_MAX on overflow. */
size_t colibri_slot_book_bytes(int32_t n_slots);

/**
 * @brief The k best of x[0..n) (1 <= k <= n), best first, ties to the lower index: their
 *        indices in ids[k] and values in vals[k]. The router's selection (one pass, a value
 *        enters only above the k-th kept); colibri_sample's top-k uses it.
 */
void colibri_topk_f32(const float *x, int32_t n, int32_t k, int32_t *ids, float *vals);

/*
 * The MoE block's grouping and combining, shared by colibri_sparse_forward (the generated
 * models' dispatch) and the container's lm_step.c: a chunk's (token, slot) pairs are numbered
 * pair = token * top_k + slot (ids and gates [tokens][top_k]).
 */

/**
 * @brief Counting sort of n_pairs pairs by expert id, stable in pair order: offsets[e] ..
 *        offsets[e + 1] - 1 are the positions in perm of expert e's pairs (offsets [n_experts
 *        + 1], cursor [n_experts] scratch, perm [n_pairs]).
 */
static inline void clb_moe_group(const int32_t *ids, int32_t n_pairs, int32_t n_experts,
                                 int32_t *offsets, int32_t *cursor, int32_t *perm)
{
    /* Counting sort, stable in pair order: counts -> prefix offsets -> placement. */
    memset(offsets, 0, ((size_t)n_experts + 1u) * sizeof(int32_t));
    for (int32_t p = 0; p < n_pairs; p++) {
        offsets[ids[p] + 1]++;
    }
    for (int32_t e = 0; e < n_experts; e++) {
        offsets[e + 1] += offsets[e];
        cursor[e] = offsets[e];
    }
    for (int32_t p = 0; p < n_pairs; p++) {
        perm[cursor[ids[p]]++] = p;
    }
    COLIBRI_DEBUG_ASSERT(offsets[n_experts] == n_pairs);
}

/** @brief The token rows of pairs[0 .. count) of x [tokens][d_model], in order, into xg. */
static inline void clb_moe_gather(const int32_t *pairs, int32_t count, int32_t top_k,
                                  const float *x, float *xg, int32_t d_model)
{
    const size_t d = (size_t)d_model;
    for (int32_t r = 0; r < count; r++) {
        const size_t tok = (size_t)(pairs[r] / top_k);
        memcpy(xg + (size_t)r * d, x + tok * d, d * sizeof(float));
    }
}

/**
 * @brief out[token of pairs[r]] += gates[pairs[r]] * y[r] for r = 0 .. count - 1, in that
 *        order: over an expert-sorted perm, each token adds its experts in ascending id.
 */
static inline void clb_moe_scatter_add(const int32_t *pairs, int32_t count, int32_t top_k,
                                       const float *gates, const float *y, float *out,
                                       int32_t d_model)
{
    const size_t d = (size_t)d_model;
    for (int32_t r = 0; r < count; r++) {
        const int32_t pair = pairs[r];
        const float g = gates[pair];
        const float *yr = y + (size_t)r * d;
        float *o = out + (size_t)(pair / top_k) * d;
        for (size_t i = 0; i < d; i++) {
            o[i] += g * yr[i];
        }
    }
}

/** @brief A sharing map is valid when every entry is in range and map[map[i]] == map[i]. */
colibri_status colibri_check_sharing_map(const int32_t *map, int32_t n_experts);

/**
 * @brief Set up the loader: policy, slot arrays carved from slot_area (which must hold
 *        colibri_slot_bytes_checked(n_slots, colibri_expert_floats(model)) bytes, 8-aligned),
 *        counters zeroed.
 */
void colibri_loader_setup(colibri_model_t *model, colibri_cache_policy policy, int32_t n_slots,
                          void *slot_area);

/**
 * @brief colibri_loader_setup with the slot bookkeeping (colibri_slot_book_bytes, 8-aligned)
 *        and the slots' weight copies (n_slots * capacity floats, 8-aligned) in two areas.
 */
void colibri_loader_setup_split(colibri_model_t *model, colibri_cache_policy policy,
                                int32_t n_slots, void *book_area, float *slot_mem);

/**
 * @brief A zeroed model descriptor holding only the dimensions, the activation and the flags:
 *        what colibri_file_block_alloc sizes a loaded model's block from (model_container.c,
 *        model_seed.c).
 */
static inline colibri_model_t colibri_model_dims(int32_t n_experts, int32_t d_model, int32_t d_ff,
                                                 int32_t top_k, colibri_activation activation,
                                                 uint32_t flags)
{
    colibri_model_t dims;
    memset(&dims, 0, sizeof(dims));
    dims.n_experts = n_experts;
    dims.d_model = d_model;
    dims.d_ff = d_ff;
    dims.top_k = top_k;
    dims.activation = activation;
    dims.flags = flags;
    return dims;
}

/**
 * @brief Give a handle its workspace: the arena (arena_size bytes) for chunks of max_tokens
 *        tokens. is_static: the handle owns none of its memory (colibri_init_static and the
 *        shared handles); 0: colibri_cleanup frees what it owns (colibri_init's handles).
 */
static inline void colibri_model_set_arena(colibri_model_t *m, void *arena, size_t arena_size,
                                           int32_t max_tokens, int is_static)
{
    m->arena = arena;
    m->arena_size = arena_size;
    m->max_tokens = max_tokens;
    m->is_static = is_static;
}

/** @brief Check that the dims / flags / activation of a model descriptor are usable. */
colibri_status colibri_check_dims(const colibri_model_t *model);

/** @brief Validate stored weights: every canonical expert has the tensors its flags need. */
colibri_status colibri_check_stored(const colibri_model_t *model);

/**
 * @brief Cache policy and slot count of a new handle on base's weights (colibri_init_shared*):
 *        base's own when config is NULL, else config's, validated against base.
 */
colibri_status colibri_shared_policy(const colibri_model_t *base, const colibri_config_t *config,
                                     colibri_cache_policy *policy, int32_t *n_slots);

/**
 * @brief Make model a handle on base's read-only weights with arena as its workspace and slots
 *        (copies only the fields init made immutable; no allocation). model->is_static = 1.
 */
colibri_status colibri_shared_attach(colibri_model_t *model, const colibri_model_t *base,
                                     colibri_cache_policy policy, int32_t n_slots, void *arena,
                                     size_t arena_size, int32_t max_tokens);

#ifndef COLIBRI_NO_FILESYSTEM
/** zlib's CRC-32 tables (slicing-by-8), for the container readers. */
typedef struct {
    uint32_t t[8][256];
} colibri_crc32_tables;

/** @brief Fill the CRC-32 tables. Defined in crc32.c (as the three below). */
void colibri_crc32_tables_init(colibri_crc32_tables *ct);

/** @brief zlib's CRC-32 of n bytes (PCLMULQDQ folding where an x86-64 CPU has it). */
uint32_t colibri_crc32(const colibri_crc32_tables *ct, const unsigned char *p, uint64_t n);
/** @brief zlib's crc32(crc, p, n): the CRC-32 of the bytes crc was the CRC-32 of (0: none)
 *         followed by these n, so a blob can be checked a chunk at a time as it is read. */
uint32_t colibri_crc32_update(const colibri_crc32_tables *ct, uint32_t crc, const unsigned char *p,
                              uint64_t n);
/** @brief zlib's crc32_combine: the CRC-32 of blob A followed by blob B from crc_a (A's),
 *         crc_b (B's) and len_b (B's bytes), so parts of a blob read apart can be checked. */
uint32_t colibri_crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);
/** @brief The operator colibri_crc32_combine applies for len_b bytes (x^(8 len_b) mod P). */
uint32_t colibri_crc32_shift(uint64_t len_b);
/** @brief colibri_crc32_combine with the operator colibri_crc32_shift(len_b) made once. */
uint32_t colibri_crc32_combine_op(uint32_t crc_a, uint32_t crc_b, uint32_t op);
/** colibri_crc32 by the tables alone (what it does without PCLMULQDQ): for the tests. */
uint32_t colibri_crc32_portable(const colibri_crc32_tables *ct, const unsigned char *p, uint64_t n);

/** @brief 1 when all n little-endian fp32 values at p (4-aligned) are finite. */
int colibri_f32_all_finite(const unsigned char *p, uint64_t n);
#endif

#endif /* COLIBRI_INTERNAL_H */
