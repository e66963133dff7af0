/**
 * @file kernels_x86.h
 * @brief Internal: the run-time kernel table of x86-64 hosts (kernels_x86.c), consulted by the
 *        public kernels of kernels_q.c. Elsewhere COLIBRI_X86_DISPATCH is not defined and the
 *        hook below expands to nothing.
 */
#ifndef COLIBRI_KERNELS_X86_H
#define COLIBRI_KERNELS_X86_H

#include "colibri_quant.h"

#include <stddef.h>
#include <stdint.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(COLIBRI_NO_X86_DISPATCH)
#define COLIBRI_X86_DISPATCH 1
#endif

#if defined(COLIBRI_X86_DISPATCH)
/** The kernels of one level; NULL: the base code of kernels_q.c runs. */
typedef struct {
    void (*matvec_f32)(const float *w, const float *x, float *y, int32_t n_out, int32_t n_in);
    void (*matvec_f16_f32)(const uint16_t *w, const float *x, float *y, int32_t n_out,
                           int32_t n_in);
    void (*matvec_q8_q8)(const int8_t *q, const float *scale, const int8_t *xq, const float *sx,
                         float *y, int32_t n_out, int32_t n_in);
    void (*matvec_q8b_q8)(const int8_t *q, const float *scale, const int8_t *xq, const float *sx,
                          float *y, int32_t n_out, int32_t n_in);
    void (*matvec_q4_q8)(const colibri_block_q4_32 *w, const int8_t *xq, const float *sx, float *y,
                         int32_t n_out, int32_t n_in);
    /* multi-token kernels on one chunk of rows (the signatures of colibri_matmul_*) */
    void (*matmul_q8_q8)(const int8_t *q, const float *scale, const int8_t *xq, const float *sx,
                         float *y, int32_t ldy, int32_t n_out, int32_t n_in, int32_t n_tok);
    void (*matmul_q8b_q8)(const int8_t *q, const float *scale, const int8_t *xq, const float *sx,
                          float *y, int32_t ldy, int32_t n_out, int32_t n_in, int32_t n_tok);
    void (*matmul_q4_q8)(const colibri_block_q4_32 *w, const int8_t *xq, const float *sx, float *y,
                         int32_t ldy, int32_t n_out, int32_t n_in, int32_t n_tok);
} colibri_x86_kernels_t;

/** @brief The table of the level in use (chosen by CPUID on the first call; thread-safe). */
const colibri_x86_kernels_t *colibri_x86_kernels(void);

/** @brief In a public kernel of kernels_q.c: run the level's version when it has one. */
#define COLIBRI_X86_KERNEL(name, args)                                                             \
    do {                                                                                           \
        const colibri_x86_kernels_t *kx_ = colibri_x86_kernels();                                  \
        if (kx_->name != NULL) {                                                                   \
            kx_->name args;                                                                        \
            return;                                                                                \
        }                                                                                          \
    } while (0)
#else
#define COLIBRI_X86_KERNEL(name, args) ((void)0)
#endif

#endif /* COLIBRI_KERNELS_X86_H */
