/**
 * @file model_file.h
 * @brief Internal: what the file-model loaders share (POSIX only): the file layouts' constants,
 *        (the container's in clb_format.h), the weights block's head and the block allocation
 *        (model_file.c), the two layouts' loaders (model_seed.c, model_container.c). The CRC-32
 *        and finiteness checks are colibri_internal.h's (crc32.c).
 */
#ifndef COLIBRI_MODEL_FILE_H
#define COLIBRI_MODEL_FILE_H

#include "clb_format.h"
#include "colibri.h"
#include "colibri_internal.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define SEED_MAGIC 0x434F4C49u
#define SEED_HEADER_BYTES 12u
#define CLB_DTYPE_F32 0u
#define CLB_DTYPE_I32 4u
#define CLB_MAX_EXPERTS 65535u
#define CONFIG_MAX_BYTES (1u << 20)
#define SIBLING_PATH_MAX 4096 /* config.json / router.bin paths (PATH_MAX on Linux) */

/*
 * Head of the weights block: what the handles of one model file share (colibri.h, Thread
 * safety). refs counts the handles (colibri_init's and colibri_init_shared's); the last one to
 * be cleaned up unmaps the file and frees the block. The weight table, sharing map and the
 * seed layout's router follow it in the same allocation and are read-only after init.
 */
typedef struct {
    atomic_size_t refs;
    void *map;
    size_t map_size;
    size_t file_bytes; /* the model's files (every block of a handle on them is at most this) */
} file_shared;

/**
 * @brief Allocate and pre-fill the weights block and the handle block of a validated model
 *        (model_file.c, where the bounds are documented); *router_out: the seed router's floats.
 */
colibri_status colibri_file_block_alloc(const colibri_model_t *dims, size_t router_floats,
                                        colibri_cache_policy policy, int32_t n_slots,
                                        size_t file_bytes, colibri_model_t **out,
                                        float **router_out);

/** @brief Free the blocks of a model that failed to load (no other handle shares it yet). */
void colibri_file_blocks_free(colibri_model_t *m);

/** @brief Load the seed flat layout mapped at base[size] (config.json, router.bin beside it). */
colibri_status colibri_file_load_seed(const colibri_config_t *config, int32_t n_slots,
                                      const unsigned char *base, size_t size,
                                      colibri_model_t **out);

/** @brief Load a Colibri container mapped at base[size]. */
colibri_status colibri_file_load_container(const colibri_config_t *config, int32_t n_slots,
                                           const unsigned char *base, size_t size,
                                           colibri_model_t **out);

#endif /* COLIBRI_MODEL_FILE_H */
