/**
 * @file model_container.c
 * @brief colibri_init's reader of the Colibri container (.clb, version 1): header, tensor
 *        table and every entry checked against the file and each other before anything is
 *        allocated, then the CRC-32 and finiteness of the weights (unless load_flags skip them).
 *        POSIX builds only (compiled out with COLIBRI_NO_FILESYSTEM).
 */
#ifndef COLIBRI_NO_FILESYSTEM

#define _POSIX_C_SOURCE 200809L

#include "colibri.h"
#include "colibri_internal.h"
#include "model_file.h"

#include <stdint.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* Colibri container                                                                           */

/* The header's fields, checked by header_read. */
typedef struct {
    uint32_t e, k, d, f, act, flags, n_tensors, meta_bytes;
    uint64_t table_off, meta_off, data_off;
} clb_header;

/*
 * Every header field, against the file size and the limits, before anything else: the table
 * and metadata inside the file and in their documented places, and the data area large enough
 * for the smallest model the dims imply (the router and one expert's matrices; at least one
 * expert owns weights). d, f <= 2^24 and e < 2^16 keep every product below 2^53.
 */
static colibri_status header_read(const unsigned char *base, size_t size, clb_header *h)
{
    if (size < CLB_HEADER_BYTES) {
        return COLIBRI_ERR_TRUNCATED;
    }
    if (rd_u32(base + 8) != 1u) {
        return COLIBRI_ERR_VERSION;
    }
    const uint64_t file_size = rd_u64(base + 72);
    if ((uint64_t)size < file_size) {
        return COLIBRI_ERR_TRUNCATED;
    }
    if ((uint64_t)size != file_size) {
        return COLIBRI_ERR_SIZE;
    }
    if (rd_u32(base + 12) != CLB_ALIGNMENT) {
        return COLIBRI_ERR_FORMAT;
    }
    h->e = rd_u32(base + 16);
    h->k = rd_u32(base + 20);
    h->d = rd_u32(base + 24);
    h->f = rd_u32(base + 28);
    h->act = rd_u32(base + 32);
    h->flags = rd_u32(base + 36);
    h->n_tensors = rd_u32(base + 40);
    h->meta_bytes = rd_u32(base + 44);
    h->table_off = rd_u64(base + 48);
    h->meta_off = rd_u64(base + 56);
    h->data_off = rd_u64(base + 64);
    if (h->e < 1 || h->e > CLB_MAX_EXPERTS || h->k < 1 || h->k > h->e || h->k > COLIBRI_MAX_TOP_K ||
        h->d < 1 || h->d > (uint32_t)COLIBRI_FILE_MAX_DIM || h->f < 1 ||
        h->f > (uint32_t)COLIBRI_FILE_MAX_DIM || h->act > (uint32_t)COLIBRI_ACT_RELU ||
        (h->flags & ~0xFu) != 0u) {
        return COLIBRI_ERR_CONFIG;
    }
    /* n_tensors < 2^32, so meta_off < 2^39 and meta_off + meta_bytes cannot overflow */
    const uint64_t table_end = CLB_HEADER_BYTES + (uint64_t)h->n_tensors * CLB_ENTRY_BYTES;
    if (h->table_off != CLB_HEADER_BYTES || h->meta_off != table_end ||
        h->data_off % CLB_ALIGNMENT != 0u) {
        return COLIBRI_ERR_FORMAT;
    }
    if (table_end > (uint64_t)size || h->meta_off + h->meta_bytes > (uint64_t)size ||
        h->data_off > (uint64_t)size) {
        return COLIBRI_ERR_TRUNCATED;
    }
    if (h->meta_off + h->meta_bytes > h->data_off) {
        return COLIBRI_ERR_FORMAT;
    }
    const uint64_t e = h->e, d = h->d, f = h->f;
    const int gated = (h->flags & COLIBRI_FLAG_GATED) != 0u;
    /* elements, at half a byte each at least (q4_32 is the format's smallest dtype); the
     * checking pass then holds the tensors the runtime uses to their exact fp32 sizes */
    uint64_t elems = e * d + d * f * (gated ? 3u : 2u);
    elems += (h->flags & COLIBRI_FLAG_ROUTER_BIAS) ? e : 0u;
    elems += (h->flags & COLIBRI_FLAG_EXPERT_BIAS) ? d + f : 0u;
    if (elems / 2u > (uint64_t)size - h->data_off) {
        return COLIBRI_ERR_TRUNCATED; /* the file is smaller than the tensors its header implies */
    }
    return COLIBRI_OK;
}

/* Table entry i (clb_format.h's checks; its blob starts in the data area). */
static colibri_status entry_at(const unsigned char *base, const clb_header *h, size_t file_size,
                               uint32_t i, clb_entry *en)
{
    const unsigned char *p = base + h->table_off + (uint64_t)i * CLB_ENTRY_BYTES;
    return clb_entry_read(p, (uint64_t)file_size, h->data_off, en);
}

/* Shape must be exactly (a) or (a, b), nbytes = 4 * elements (a, b <= 2^24: no overflow). */
static colibri_status entry_shape(const clb_entry *en, uint32_t ndim, uint32_t a, uint32_t b)
{
    if (en->ndim != ndim || en->shape[0] != a || (ndim == 2 && en->shape[1] != b)) {
        return COLIBRI_ERR_SIZE;
    }
    uint64_t elems = (ndim == 2) ? (uint64_t)a * b : (uint64_t)a;
    if (en->nbytes != elems * 4u) {
        return COLIBRI_ERR_SIZE;
    }
    return COLIBRI_OK;
}

/* "expert.<i>.<part>": returns 0 and sets *idx / *part, else -1. */
static int parse_expert_name(const char *name, uint32_t *idx, const char **part)
{
    if (strncmp(name, "expert.", 7) != 0) {
        return -1;
    }
    const char *p = name + 7;
    if (*p < '0' || *p > '9') {
        return -1;
    }
    uint32_t v = 0;
    while (*p >= '0' && *p <= '9') {
        if (v > 100000u) {
            return -1;
        }
        v = v * 10u + (uint32_t)(*p - '0');
        p++;
    }
    if (*p != '.') {
        return -1;
    }
    *idx = v;
    *part = p + 1;
    return 0;
}

/* Index of an expert part name in {w1, b1, w2, b2, w3}, or -1. */
static int expert_part(const char *part)
{
    static const char *const k_parts[5] = {"w1", "b1", "w2", "b2", "w3"};
    for (int i = 0; i < 5; i++) {
        if (strcmp(part, k_parts[i]) == 0) {
            return i;
        }
    }
    return -1;
}

/* The fp32 tensors the runtime computes with (those scanned for NaN / Inf). */
static int entry_is_weight(const clb_entry *en)
{
    uint32_t idx;
    const char *part;
    return strcmp(en->name, "router.weight") == 0 || strcmp(en->name, "router.bias") == 0 ||
           (parse_expert_name(en->name, &idx, &part) == 0 && expert_part(part) >= 0);
}

typedef struct {
    const clb_header *h;
    const unsigned char *base;
    colibri_model_t *m;      /* NULL in the checking pass (nothing allocated yet) */
    const int32_t *file_map; /* expert_sharing_map tensor, if any (in the mmap) */
    int have_router_w, have_router_b;
    uint32_t n_w1; /* expert w1 tensors seen (bounds the useful LRU slots) */
} clb_state;

static colibri_status set_once(const float **slot, const float *value)
{
    if (*slot != NULL) {
        return COLIBRI_ERR_FORMAT; /* duplicated tensor */
    }
    *slot = value;
    return COLIBRI_OK;
}

/*
 * One entry, checked against the header's dims (cs->m == NULL: the pass before allocation,
 * which also records the sharing map and the router tensors), or stored into the model.
 */
static colibri_status container_entry(clb_state *cs, const clb_entry *en)
{
    const clb_header *h = cs->h;
    const void *blob = cs->base + en->offset;
    colibri_status st;

    if (strcmp(en->name, "expert_sharing_map") == 0) {
        if (en->dtype != CLB_DTYPE_I32) {
            return COLIBRI_ERR_UNSUPPORTED;
        }
        if ((st = entry_shape(en, 1, h->e, 0)) != COLIBRI_OK) {
            return st;
        }
        if (cs->m == NULL) {
            if (cs->file_map != NULL) {
                return COLIBRI_ERR_FORMAT;
            }
            cs->file_map = (const int32_t *)blob;
        }
        return COLIBRI_OK;
    }
    uint32_t idx = 0;
    const char *part = NULL;
    const int is_router_w = strcmp(en->name, "router.weight") == 0;
    const int is_router_b = strcmp(en->name, "router.bias") == 0;
    const int part_id = parse_expert_name(en->name, &idx, &part) == 0 ? expert_part(part) : -1;
    if (!is_router_w && !is_router_b && part_id < 0) {
        return COLIBRI_OK; /* unknown tensors are ignored (forward compatibility) */
    }
    if (en->dtype != CLB_DTYPE_F32) {
        return COLIBRI_ERR_UNSUPPORTED;
    }
    const float *data = (const float *)blob;
    if (is_router_w || is_router_b) {
        if ((st = entry_shape(en, is_router_w ? 2u : 1u, h->e, h->d)) != COLIBRI_OK) {
            return st;
        }
        int *have = is_router_w ? &cs->have_router_w : &cs->have_router_b;
        if (cs->m == NULL) {
            if (*have) {
                return COLIBRI_ERR_FORMAT;
            }
            *have = 1;
        } else if (is_router_w) {
            cs->m->router_w = data;
        } else {
            cs->m->router_b = data;
        }
        return COLIBRI_OK;
    }
    if (idx >= h->e || en->expert != idx) {
        return COLIBRI_ERR_FORMAT;
    }
    /* w1 / w3 [d, f], b1 [f], w2 [f, d], b2 [d] */
    static const uint8_t k_ndim[5] = {2, 1, 2, 1, 2};
    const uint32_t rows[5] = {h->d, h->f, h->f, h->d, h->d};
    const uint32_t cols[5] = {h->f, 0, h->d, 0, h->f};
    if ((st = entry_shape(en, k_ndim[part_id], rows[part_id], cols[part_id])) != COLIBRI_OK) {
        return st;
    }
    if (cs->m == NULL) {
        cs->n_w1 += (part_id == 0) ? 1u : 0u;
        return COLIBRI_OK;
    }
    colibri_expert_weights_t *w = &cs->m->stored[idx];
    const float **slots[5] = {&w->w1, &w->b1, &w->w2, &w->b2, &w->w3};
    return set_once(slots[part_id], data);
}

/* CRC-32 of every blob and NaN / Inf in every weight tensor (load_flags may skip either). */
static colibri_status container_integrity(const clb_header *h, const unsigned char *base,
                                          size_t size, uint32_t load_flags)
{
    const int check_crc = (load_flags & COLIBRI_LOAD_SKIP_CHECKSUM) == 0u;
    const int check_finite = (load_flags & COLIBRI_LOAD_SKIP_FINITE) == 0u;
    if (!check_crc && !check_finite) {
        return COLIBRI_OK;
    }
    colibri_crc32_tables tables;
    if (check_crc) {
        colibri_crc32_tables_init(&tables);
    }
    for (uint32_t i = 0; i < h->n_tensors; i++) {
        clb_entry en;
        colibri_status st = entry_at(base, h, size, i, &en);
        if (st != COLIBRI_OK) {
            return st; /* not reached: the checking pass read every entry */
        }
        const unsigned char *blob = base + en.offset;
        if (check_crc && colibri_crc32(&tables, blob, en.nbytes) != en.crc) {
            return COLIBRI_ERR_CHECKSUM;
        }
        if (check_finite && en.dtype == CLB_DTYPE_F32 && entry_is_weight(&en) &&
            !colibri_f32_all_finite(blob, en.nbytes / 4u)) {
            return COLIBRI_ERR_NONFINITE;
        }
    }
    return COLIBRI_OK;
}

colibri_status colibri_file_load_container(const colibri_config_t *config, int32_t n_slots,
                                           const unsigned char *base, size_t size,
                                           colibri_model_t **out)
{
    clb_header h;
    colibri_status st = header_read(base, size, &h);
    if (st != COLIBRI_OK) {
        return st;
    }
    /* Checking pass: every entry, no allocation. Blobs lie inside the data area in table order
     * without overlapping, so their sizes add up to no more than the file. */
    clb_state cs = {&h, base, NULL, NULL, 0, 0, 0};
    uint64_t prev_end = h.data_off;
    for (uint32_t i = 0; i < h.n_tensors && st == COLIBRI_OK; i++) {
        clb_entry en;
        st = entry_at(base, &h, size, i, &en);
        if (st == COLIBRI_OK) {
            st = (en.offset < prev_end) ? COLIBRI_ERR_FORMAT : container_entry(&cs, &en);
            prev_end = en.offset + en.nbytes; /* <= size (entry_at) */
        }
    }
    /* router.weight [e, d] and an expert's w1 [d, f], both fp32 and inside the file, bound
     * every dimension the allocation depends on; without them the file is incomplete */
    if (st == COLIBRI_OK && (!cs.have_router_w || cs.n_w1 == 0u ||
                             ((h.flags & COLIBRI_FLAG_ROUTER_BIAS) && !cs.have_router_b))) {
        st = COLIBRI_ERR_FORMAT;
    }
    const int32_t *map =
        (config->expert_sharing_map != NULL) ? config->expert_sharing_map : cs.file_map;
    if (st == COLIBRI_OK) {
        st = colibri_check_sharing_map(map, (int32_t)h.e);
    }
    if (st == COLIBRI_OK) {
        st = container_integrity(&h, base, size, config->load_flags);
    }
    if (st != COLIBRI_OK) {
        return st;
    }

    /* Slots beyond the experts that own weights (each has a w1 in the file) are never used. */
    uint32_t owners = 0;
    for (uint32_t i = 0; i < h.e; i++) {
        owners += (map == NULL || map[i] == (int32_t)i) ? 1u : 0u;
    }
    owners = owners < cs.n_w1 ? owners : cs.n_w1;
    const int32_t slots = (uint32_t)n_slots < owners ? n_slots : (int32_t)owners;

    colibri_model_t dims = colibri_model_dims((int32_t)h.e, (int32_t)h.d, (int32_t)h.f,
                                              (int32_t)h.k, (colibri_activation)h.act, h.flags);
    colibri_model_t *m = NULL;
    st = colibri_file_block_alloc(&dims, 0, config->cache_policy, slots, size, &m, NULL);
    if (st != COLIBRI_OK) {
        return st;
    }
    cs.m = m;
    for (uint32_t i = 0; i < h.n_tensors && st == COLIBRI_OK; i++) {
        clb_entry en;
        st = entry_at(base, &h, size, i, &en);
        if (st == COLIBRI_OK) {
            st = container_entry(&cs, &en);
        }
    }
    if (!(h.flags & COLIBRI_FLAG_ROUTER_BIAS)) {
        m->router_b = NULL;
    }
    for (uint32_t i = 0; i < h.e; i++) {
        m->share[i] = (map != NULL) ? map[i] : (int32_t)i;
        colibri_expert_weights_t *w = &m->stored[i];
        if (!(h.flags & COLIBRI_FLAG_EXPERT_BIAS)) {
            w->b1 = NULL;
            w->b2 = NULL;
        }
        if (!(h.flags & COLIBRI_FLAG_GATED)) {
            w->w3 = NULL;
        }
    }
    m->share_eff = m->share;
    if (st == COLIBRI_OK && colibri_check_stored(m) != COLIBRI_OK) {
        st = COLIBRI_ERR_FORMAT; /* an expert owning its weights lacks a tensor */
    }
    if (st != COLIBRI_OK) {
        colibri_file_blocks_free(m);
        return st;
    }
    *out = m;
    return COLIBRI_OK;
}

#else
/* ISO C forbids an empty translation unit. */
typedef int colibri_model_container_unused;
#endif /* COLIBRI_NO_FILESYSTEM */
