/**
 * @file mat_pack.c
 * @brief Packed copies for a generated model on a host (colibri_transformer.h:
 *        colibri_pack_matrices, colibri_pack_free, colibri_matmul_packed): its int8 / int4
 *        matrices copied once at setup into the layout of the CPU's packed kernels (kernels_x86.h,
 *        x86-64 with AVX-512 VNNI), the way the model-file runtime packs at load (lm_pack.c).
 *        Elsewhere (MCUs, other hosts) nothing packs and nothing is allocated; a generated MCU
 *        model never references this file, so the linker leaves it out of its image.
 */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(COLIBRI_NO_X86_DISPATCH) &&               \
    !defined(COLIBRI_NO_FILESYSTEM)
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* madvise (MADV_DONTNEED: glibc's posix_madvise ignores it) */
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#define COLIBRI_PACK_HOST 1
#endif

#include "colibri_transformer.h"
#include "kernels_x86.h"

#include <stddef.h>
#include <stdint.h>

#if defined(COLIBRI_PACK_HOST) && defined(COLIBRI_X86_DISPATCH)
_Static_assert((int)COLIBRI_PACK_Q8 == (int)COLIBRI_X86_PACK_Q8 &&
                   (int)COLIBRI_PACK_Q8B == (int)COLIBRI_X86_PACK_Q8B &&
                   (int)COLIBRI_PACK_Q4 == (int)COLIBRI_X86_PACK_Q4,
               "colibri_transformer.h and kernels_x86.h disagree on the packed kinds");

void *clb_pack_alloc(size_t bytes)
{
    void *base = aligned_alloc(CLB_PACK_ALIGN, bytes);
#if defined(MADV_HUGEPAGE)
    if (base != NULL) {
        (void)madvise(base, bytes, MADV_HUGEPAGE); /* before the first write; a hint */
    }
#endif
    return base;
}

/* Bytes of item's packed copy (0: it does not pack). */
static size_t item_bytes(const colibri_pack_item_t *it)
{
    if (it->w == NULL || it->kind < COLIBRI_PACK_Q8 || it->kind > COLIBRI_PACK_Q4 ||
        (it->kind == COLIBRI_PACK_Q8B && it->scale == NULL)) {
        return 0u;
    }
    return colibri_x86_packed_bytes(it->kind, it->n_out, it->n_in);
}

/* The pages wholly inside [p, p + len) leave the resident set (const, file-backed: they come
 * back from the file if read again). */
static void drop_pages(const void *p, size_t len)
{
    const long page = sysconf(_SC_PAGESIZE);
    if (page <= 0) {
        return;
    }
    const uintptr_t mask = (uintptr_t)page - 1u;
    const uintptr_t a = ((uintptr_t)p + mask) & ~mask;
    const uintptr_t b = ((uintptr_t)p + len) & ~mask;
    if (b > a) {
        (void)madvise((void *)a, (size_t)(b - a), MADV_DONTNEED);
    }
}
#endif

colibri_status colibri_pack_matrices(colibri_pack_item_t *items, int32_t n, int32_t drop_originals,
                                     void **block, size_t *bytes)
{
    if (block == NULL || bytes == NULL || n < 0 || (n > 0 && items == NULL)) {
        return COLIBRI_ERR_ARG;
    }
    *block = NULL;
    *bytes = 0u;
    for (int32_t i = 0; i < n; i++) {
        if (items[i].packed != NULL) {
            *items[i].packed = NULL;
        }
    }
#if defined(COLIBRI_PACK_HOST) && defined(COLIBRI_X86_DISPATCH)
    const char *env = getenv("COLIBRI_LM_PACK"); /* "0": off, as the model-file runtime's */
    if (env != NULL && env[0] == '0' && env[1] == '\0') {
        return COLIBRI_OK;
    }
    size_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        const size_t b = item_bytes(&items[i]);
        if (b > 0u) {
            total = ((total + 63u) & ~(size_t)63u) + b;
        }
    }
    if (total == 0u) {
        return COLIBRI_OK;
    }
    total = (total + CLB_PACK_ALIGN - 1u) & ~(CLB_PACK_ALIGN - 1u);
    unsigned char *base = (unsigned char *)clb_pack_alloc(total);
    if (base == NULL) {
        return COLIBRI_ERR_NOMEM;
    }
    size_t off = 0;
    for (int32_t i = 0; i < n; i++) {
        const colibri_pack_item_t *it = &items[i];
        const size_t b = item_bytes(it);
        if (b == 0u) {
            continue;
        }
        off = (off + 63u) & ~(size_t)63u;
        colibri_x86_pack(it->kind, it->w, it->scale, it->n_out, it->n_in, base + off);
        if (it->packed != NULL) {
            *it->packed = base + off;
        }
        if (drop_originals) {
            const size_t row = (it->kind == COLIBRI_PACK_Q4)
                                   ? COLIBRI_Q4_BLOCKS(it->n_in) * sizeof(colibri_block_q4_32)
                                   : (size_t)it->n_in;
            drop_pages(it->w, row * (size_t)it->n_out);
        }
        off += b;
    }
    *block = base;
    *bytes = total;
#else
    (void)drop_originals;
#endif
    return COLIBRI_OK;
}

void colibri_pack_free(void *block)
{
#if defined(COLIBRI_PACK_HOST) && defined(COLIBRI_X86_DISPATCH)
    free(block);
#else
    (void)block; /* never allocated here */
#endif
}

void colibri_matmul_packed(int32_t kind, const void *packed, const float *rscale, int32_t n_out,
                           int32_t n_in, int32_t r0, int32_t r1, const int8_t *xq, const float *sx,
                           float *y, int32_t ldy, int32_t n_tok)
{
#if defined(COLIBRI_PACK_HOST) && defined(COLIBRI_X86_PACKED)
    colibri_x86_matmul_packed(kind, packed, rscale, n_out, n_in, r0, r1, xq, sx, y, ldy, n_tok);
#else
    /* colibri_pack_matrices packs nothing here: there is no packed copy to run */
    (void)kind;
    (void)packed;
    (void)rscale;
    (void)n_out;
    (void)n_in;
    (void)r0;
    (void)r1;
    (void)xq;
    (void)sx;
    (void)y;
    (void)ldy;
    (void)n_tok;
#endif
}
