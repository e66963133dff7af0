/**
 * @file clb_format.h
 * @brief Internal: what both readers of the Colibri container share (colibri_init's version 1,
 *        model_container.c; the whole-model version 2, lm_parse.c): the layout's constants,
 *        little-endian reads and the tensor table's 96-byte entry, decoded and checked once.
 *        Byte layout: docs/format.md.
 */
#ifndef COLIBRI_CLB_FORMAT_H
#define COLIBRI_CLB_FORMAT_H

#include "colibri.h"

#include <stdint.h>
#include <string.h>

#define CLB_HEADER_BYTES 128u
#define CLB_ENTRY_BYTES 96u
#define CLB_ALIGNMENT 64u
#define CLB_NAME_BYTES 48u

static inline uint32_t rd_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static inline uint64_t rd_u64(const unsigned char *p)
{
    return (uint64_t)rd_u32(p) | ((uint64_t)rd_u32(p + 4) << 32);
}

static inline float rd_f32(const unsigned char *p)
{
    const uint32_t b = rd_u32(p);
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* One tensor table entry; name points into the mapped file (NUL-terminated, checked). */
typedef struct {
    const char *name;
    uint32_t dtype, ndim;
    uint32_t shape[4];
    uint64_t offset, nbytes;
    uint32_t expert, crc;
} clb_entry;

/*
 * Decode the entry at p (CLB_ENTRY_BYTES of the mapped file): name (NUL within its 48 bytes),
 * dtype, ndim, shape, offset, nbytes, expert, CRC-32; then what every version requires: 1..4
 * dims (COLIBRI_ERR_FORMAT), the blob inside the file (COLIBRI_ERR_TRUNCATED), 64-aligned and
 * not before the data area at data_off (COLIBRI_ERR_FORMAT). Each reader adds its own checks
 * (dtypes, table order, sizes).
 */
static inline colibri_status clb_entry_read(const unsigned char *p, uint64_t file_size,
                                            uint64_t data_off, clb_entry *en)
{
    if (memchr(p, '\0', CLB_NAME_BYTES) == NULL) {
        return COLIBRI_ERR_FORMAT;
    }
    en->name = (const char *)p;
    en->dtype = rd_u32(p + 48);
    en->ndim = rd_u32(p + 52);
    for (int i = 0; i < 4; i++) {
        en->shape[i] = rd_u32(p + 56 + 4 * i);
    }
    en->offset = rd_u64(p + 72);
    en->nbytes = rd_u64(p + 80);
    en->expert = rd_u32(p + 88);
    en->crc = rd_u32(p + 92);
    if (en->ndim < 1u || en->ndim > 4u) {
        return COLIBRI_ERR_FORMAT;
    }
    if (en->offset > file_size || en->nbytes > file_size - en->offset) {
        return COLIBRI_ERR_TRUNCATED;
    }
    if (en->offset % CLB_ALIGNMENT != 0u || en->offset < data_off) {
        return COLIBRI_ERR_FORMAT;
    }
    return COLIBRI_OK;
}

#endif /* COLIBRI_CLB_FORMAT_H */
