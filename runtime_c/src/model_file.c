/**
 * @file model_file.c
 * @brief colibri_init for POSIX hosts: mmap a model file (Colibri container or the seed flat
 *        layout with config.json and router.bin beside it), validate it completely (model_seed.c,
 * model_container.c), and build the model in two allocations: the weights block (reference count,
 * weight table, sharing map, seed router) shared by every handle on the file (colibri_init_shared),
 *        and the handle block (descriptor, arena, cache slots). The layer model's allocations are
 *        here (and config.json's text in model_seed.c); compiled out with COLIBRI_NO_FILESYSTEM.
 */
#ifndef COLIBRI_NO_FILESYSTEM

#define _POSIX_C_SOURCE 200809L

#include "model_file.h"
#include "colibri.h"
#include "colibri_internal.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------------ */
/* Small helpers                                                                               */

static int host_is_little_endian(void)
{
    const uint16_t one = 1;
    unsigned char first;
    memcpy(&first, &one, 1);
    return first == 1;
}

/* ------------------------------------------------------------------------------------------ */
/* Model blocks: the weights block (shared by every handle on the file) and the handle block.   */

typedef struct {
    size_t stored, share, router, total;
} weights_layout;

static int add_ok(size_t *acc, size_t n)
{
    n = (n > SIZE_MAX - 15u) ? SIZE_MAX : COLIBRI_ALIGN16(n);
    if (n == SIZE_MAX || n > SIZE_MAX - *acc) {
        return -1;
    }
    *acc += n;
    return 0;
}

/*
 * Token rows per chunk for a file model: COLIBRI_FILE_MAX_TOKENS, halved while the workspace
 * exceeds budget, so the arena stays proportional to the model's files (chunking gives
 * identical results). 0 when even one row does not fit (or the dims are unusable).
 */
static int32_t file_max_tokens(const colibri_model_t *dims, size_t budget)
{
    int32_t t = COLIBRI_FILE_MAX_TOKENS;
    size_t ws = colibri_workspace_size(dims, t);
    while (ws != 0 && ws > budget && t > 1) {
        t /= 2;
        ws = colibri_workspace_size(dims, t);
    }
    return (ws == 0 || ws > budget) ? 0 : t;
}

/* The handle block: the descriptor, then arena_bytes of workspace and cache slots (from
 * *arena_off). NULL on overflow or when out of memory. */
static unsigned char *handle_block_alloc(size_t arena_bytes, size_t *arena_off)
{
    size_t acc = 0;
    if (add_ok(&acc, sizeof(colibri_model_t)) != 0) {
        return NULL;
    }
    *arena_off = acc;
    if (add_ok(&acc, arena_bytes) != 0) {
        return NULL;
    }
    return (unsigned char *)malloc(acc);
}

/* Free the blocks of a model that failed to load (no other handle can share it yet). */
void colibri_file_blocks_free(colibri_model_t *m)
{
    void *weights = m->shared;
    free(m->owned_slots);
    free(m->owned_arena);
    free(m->owned); /* the descriptor lives inside this block */
    free(weights);
}

/*
 * Allocate and pre-fill the blocks for dims in `dims` (router_floats = floats to copy in) and
 * set up the loader for `policy` with up to n_slots slots. Callers have validated the files
 * first, and file_bytes is the size of all of the model's files: no block may be larger (a
 * fuzzed header cannot buy memory its file does not hold). The blocks: the weights block
 * (tables every handle shares, the seed layout's router), the handle block (descriptor and
 * slot bookkeeping), the arena (fewer token rows per chunk when more would not fit: same
 * results) and the slots' weight copies (no more than the experts in the file). Tiny experts
 * whose bookkeeping outweighs them get fewer slots (same results); a model whose tables
 * outweigh its weights (d_model 1 and the like, never a real model) gets COLIBRI_ERR_SIZE.
 */
colibri_status colibri_file_block_alloc(const colibri_model_t *dims, size_t router_floats,
                                        colibri_cache_policy policy, int32_t n_slots,
                                        size_t file_bytes, colibri_model_t **out,
                                        float **router_out)
{
    const size_t e = (size_t)dims->n_experts;
    const size_t desc = COLIBRI_ALIGN16(sizeof(colibri_model_t));
    weights_layout lay;
    size_t acc = 0;
    if (add_ok(&acc, sizeof(file_shared)) != 0) {
        return COLIBRI_ERR_NOMEM;
    }
    lay.stored = acc;
    if (add_ok(&acc, e * sizeof(colibri_expert_weights_t)) != 0) {
        return COLIBRI_ERR_NOMEM;
    }
    lay.share = acc;
    if (add_ok(&acc, e * sizeof(int32_t)) != 0) {
        return COLIBRI_ERR_NOMEM;
    }
    lay.router = acc;
    if (router_floats > SIZE_MAX / 4u || add_ok(&acc, router_floats * 4u) != 0) {
        return COLIBRI_ERR_NOMEM;
    }
    lay.total = acc;
    const int32_t wanted = n_slots;
    while (n_slots > 0 && colibri_slot_book_bytes(n_slots) > file_bytes - desc) {
        n_slots--; /* desc <= file_bytes: checked below before it matters */
    }
    const size_t book = colibri_slot_book_bytes(n_slots);
    const size_t copies = colibri_slot_bytes_checked(n_slots, colibri_expert_floats(dims)) - book;
    const int32_t max_tokens = file_max_tokens(dims, file_bytes);
    if (lay.total > file_bytes || desc > file_bytes || (wanted > 0 && n_slots == 0) ||
        copies > file_bytes || max_tokens == 0) {
        return COLIBRI_ERR_SIZE;
    }
    const size_t ws = colibri_workspace_size(dims, max_tokens);

    size_t book_off = 0;
    unsigned char *block = handle_block_alloc(book, &book_off);
    unsigned char *weights = (block != NULL) ? (unsigned char *)malloc(lay.total) : NULL;
    void *arena = (weights != NULL) ? malloc(ws) : NULL;
    void *slot_copies = (arena != NULL && copies > 0) ? malloc(copies) : NULL;
    if (arena == NULL || (copies > 0 && slot_copies == NULL)) {
        free(arena);
        free(weights);
        free(block);
        return COLIBRI_ERR_NOMEM;
    }
    memset(weights, 0, lay.router); /* record and tables; the router is read in */
    file_shared *shared = (file_shared *)(void *)weights;
    atomic_init(&shared->refs, 1u);
    shared->map = NULL;
    shared->map_size = 0;
    shared->file_bytes = file_bytes;

    colibri_model_t *m = (colibri_model_t *)(void *)block;
    *m = *dims;
    m->stored = (colibri_expert_weights_t *)(void *)(weights + lay.stored);
    m->share = (int32_t *)(void *)(weights + lay.share);
    float *router = (router_floats > 0) ? (float *)(void *)(weights + lay.router) : NULL;
    m->router_w = router;
    if (router_out != NULL) {
        *router_out = router;
    }
    m->kernels = NULL;
    colibri_model_set_arena(m, arena, ws, max_tokens, 0);
    m->owned = block;
    m->owned_arena = arena;
    m->owned_slots = slot_copies;
    m->shared = shared;
    m->share_eff = NULL;
    colibri_loader_setup_split(m, policy, n_slots, block + book_off, (float *)slot_copies);
    *out = m;
    return COLIBRI_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Entry points                                                                                */

static const unsigned char k_clb_magic[8] = {'C', 'L', 'B', 'R', 'M', 'O', 'E', '\0'};

colibri_status colibri_init(const colibri_config_t *config, colibri_model_t **out_model)
{
    if (out_model != NULL) {
        *out_model = NULL;
    }
    if (config == NULL || out_model == NULL || config->model_path == NULL ||
        config->num_threads < 0) {
        return COLIBRI_ERR_ARG;
    }
    const int32_t n_slots = colibri_slot_count(config);
    if (n_slots < 0) {
        return COLIBRI_ERR_ARG;
    }
    if (!host_is_little_endian()) {
        return COLIBRI_ERR_UNSUPPORTED;
    }
    int fd = open(config->model_path, O_RDONLY);
    if (fd < 0) {
        return COLIBRI_ERR_IO;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return COLIBRI_ERR_IO;
    }
    if (sb.st_size < (off_t)SEED_HEADER_BYTES) {
        close(fd);
        return COLIBRI_ERR_TRUNCATED;
    }
    if ((uint64_t)sb.st_size > (uint64_t)SIZE_MAX) {
        close(fd);
        return COLIBRI_ERR_NOMEM;
    }
    const size_t size = (size_t)sb.st_size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        return COLIBRI_ERR_IO;
    }
    const unsigned char *base = (const unsigned char *)map;
    colibri_model_t *m = NULL;
    colibri_status st;
    if (memcmp(base, k_clb_magic, sizeof(k_clb_magic)) == 0) {
        st = colibri_file_load_container(config, n_slots, base, size, &m);
    } else if (rd_u32(base) == SEED_MAGIC) {
        st = colibri_file_load_seed(config, n_slots, base, size, &m);
    } else {
        st = COLIBRI_ERR_MAGIC;
    }
    if (st == COLIBRI_OK && config->expert_sharing_map != NULL && m->share_eff == NULL) {
        /* seed layout: the config's map aliases experts that all have weights */
        st = colibri_check_sharing_map(config->expert_sharing_map, m->n_experts);
        if (st == COLIBRI_OK) {
            memcpy(m->share, config->expert_sharing_map, (size_t)m->n_experts * 4u);
            m->share_eff = m->share;
        } else {
            colibri_file_blocks_free(m);
        }
    }
    if (st != COLIBRI_OK) {
        munmap(map, size);
        return st;
    }
    file_shared *shared = (file_shared *)m->shared;
    shared->map = map;
    shared->map_size = size;
    m->map_base = map;
    m->map_size = size;
    *out_model = m;
    return COLIBRI_OK;
}

/* Experts that own weights (their own sharing-map entry, weights present): the most LRU slots
 * a handle on base can use. */
static int32_t weight_owners(const colibri_model_t *base)
{
    int32_t owners = 0;
    for (int32_t i = 0; i < base->n_experts; i++) {
        const int32_t used = (base->share_eff != NULL) ? base->share_eff[i] : i;
        owners += (used == i && base->stored != NULL && base->stored[i].w1 != NULL) ? 1 : 0;
    }
    return owners;
}

colibri_status colibri_init_shared(const colibri_model_t *base, const colibri_config_t *config,
                                   colibri_model_t **out_model)
{
    if (out_model != NULL) {
        *out_model = NULL;
    }
    if (base == NULL || out_model == NULL) {
        return COLIBRI_ERR_ARG;
    }
    colibri_cache_policy policy;
    int32_t n_slots;
    colibri_status st = colibri_shared_policy(base, config, &policy, &n_slots);
    if (st != COLIBRI_OK) {
        return st;
    }
    const int32_t owners = weight_owners(base);
    if (n_slots > owners && owners > 0) {
        n_slots = owners; /* as colibri_init: more LRU slots would never be used */
    }
    /* Three blocks, as colibri_init's handle (colibri.h, "Memory"): the descriptor with the
     * slots' bookkeeping, the workspace (base's chunk, sized by colibri_init within the files)
     * and the slots' weight copies; on a file model each is at most the model's files. */
    const file_shared *fs = (const file_shared *)base->shared;
    const size_t file_bytes = fs != NULL ? fs->file_bytes : SIZE_MAX;
    const size_t desc = COLIBRI_ALIGN16(sizeof(colibri_model_t));
    const int32_t wanted = n_slots;
    while (n_slots > 0 &&
           (desc > file_bytes || colibri_slot_book_bytes(n_slots) > file_bytes - desc)) {
        n_slots--; /* tiny experts: fewer slots (same results), as colibri_init */
    }
    const size_t ws = colibri_workspace_size(base, base->max_tokens);
    const size_t book = colibri_slot_book_bytes(n_slots);
    const size_t slots = colibri_slot_bytes_checked(n_slots, colibri_slot_capacity(base));
    if (ws == 0 || slots == SIZE_MAX) {
        return COLIBRI_ERR_NOMEM;
    }
    const size_t copies = slots - book;
    if ((wanted > 0 && n_slots == 0) || copies > file_bytes || ws > file_bytes ||
        desc > file_bytes) {
        return COLIBRI_ERR_SIZE; /* what colibri_init refuses for the same slots */
    }
    size_t book_off = 0;
    unsigned char *block = handle_block_alloc(book, &book_off);
    void *arena = (block != NULL) ? malloc(ws) : NULL;
    void *slot_copies = (arena != NULL && copies > 0) ? malloc(copies) : NULL;
    if (arena == NULL || (copies > 0 && slot_copies == NULL)) {
        free(arena);
        free(block);
        return COLIBRI_ERR_NOMEM;
    }
    colibri_model_t *m = (colibri_model_t *)(void *)block;
    st = colibri_shared_attach(m, base, policy, 0, arena, ws, base->max_tokens);
    if (st != COLIBRI_OK) {
        free(slot_copies);
        free(arena);
        free(block);
        return st;
    }
    colibri_loader_setup_split(m, policy, n_slots, block + book_off, (float *)slot_copies);
    file_shared *shared = (file_shared *)base->shared;
    if (shared != NULL) {
        /* base's own reference keeps the count >= 1 during this call: relaxed suffices */
        atomic_fetch_add_explicit(&shared->refs, 1u, memory_order_relaxed);
        m->map_base = shared->map;
        m->map_size = shared->map_size;
    }
    m->shared = shared;
    m->owned = block; /* the descriptor and the slots' bookkeeping */
    m->owned_arena = arena;
    m->owned_slots = slot_copies;
    m->is_static = 0;
    *out_model = m;
    return COLIBRI_OK;
}

void colibri_cleanup(colibri_model_t *model)
{
    if (model == NULL || model->is_static) {
        return; /* static models own nothing */
    }
    file_shared *shared = (file_shared *)model->shared;
    free(model->owned_slots);
    free(model->owned_arena);
    free(model->owned); /* the descriptor lives inside this block */
    /* acq_rel: every handle's use of the weights happens before the last one frees them */
    if (shared != NULL &&
        atomic_fetch_sub_explicit(&shared->refs, 1u, memory_order_acq_rel) == 1u) {
        if (shared->map != NULL) {
            munmap(shared->map, shared->map_size);
        }
        free(shared); /* the head of the weights block */
    }
}

#else
/* ISO C forbids an empty translation unit. */
typedef int colibri_model_file_unused;
#endif /* COLIBRI_NO_FILESYSTEM */
