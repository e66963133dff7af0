/**
 * @file kernels_x86.h
 * @brief Internal: the run-time kernel table of x86-64 hosts (runtime_c/arch/x86_64: one file
 *        per operation family, the table and its one entry point colibri_x86_kernels in
 *        x86_dispatch.c), consulted by the public kernels of kernels_q.c. Elsewhere
 *        COLIBRI_X86_DISPATCH is not defined and the hook below expands to nothing.
 */
#ifndef COLIBRI_KERNELS_X86_H
#define COLIBRI_KERNELS_X86_H

#include "colibri_quant.h"

#include <stddef.h>
#include <stdint.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(COLIBRI_NO_X86_DISPATCH)
#define COLIBRI_X86_DISPATCH 1
/* AVX-VNNI / AVX-512 VNNI (and the packed kernels, AVX-512 VNNI's) need GCC 11 or clang 12
 * (target names and intrinsics); older compilers build the base and AVX2 levels only. */
#if (defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11)
#define COLIBRI_X86_PACKED 1
#endif
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
    /* element-wise (colibri_silu_mul_f32, colibri_exp_shift_f32, colibri_axpy_f32,
     * colibri_wsum_f32) */
    void (*silu_mul_f32)(float *h, const float *g, size_t n);
    void (*exp_shift_f32)(float *x, size_t n, float m);
    void (*axpy_f32)(float *y, float a, const float *x, int32_t n);
    void (*wsum_f32)(float *out, const float *w, float sum, const float *v, size_t stride,
                     int32_t n, int32_t d);
    int32_t (*argmax_f32)(const float *x, int32_t n);
    /* colibri_topk_f32's scan: the start of the first group of 32 of x[0..n) holding a value
     * above thr, or of the last 1..31 (n if none and n % 32 == 0) */
    int32_t (*first_above_f32)(const float *x, int32_t n, float thr);
    /* colibri_quantize_row_q8 (NULL: kernels_q.c's blocks, SSE2 on x86-64) */
    void (*quantize_row_q8)(const float *x, int8_t *xq, float *sx, int32_t n);
} colibri_x86_kernels_t;

/** @brief The table of the level in use (chosen by CPUID on the first call; thread-safe). */
const colibri_x86_kernels_t *colibri_x86_kernels(void);

/** Packed matrices: a layout of a quantised matrix built once (when a model is loaded) for the
 *  level's kernels, see runtime_c/arch/x86_64/x86_matmul_avx512.c. */
enum { COLIBRI_X86_PACK_Q8 = 0, COLIBRI_X86_PACK_Q8B = 1, COLIBRI_X86_PACK_Q4 = 2 };

/** @brief Bytes of the packed copy of an int8 (scale per row: PACK_Q8; per row and block:
 *         PACK_Q8B) or int4 (PACK_Q4) matrix [n_out][n_in] for the level in use; 0 when the level
 *         has no packed kernels (only AVX-512 VNNI has) or the shape does not pack (n_out < 16,
 *         n_in not a multiple of 32). */
size_t colibri_x86_packed_bytes(int32_t kind, int32_t n_out, int32_t n_in);

/** @brief Write the packed copy of w (int8 codes or int4 blocks; scale: the PACK_Q8B block
 *         scales, else unused) to dst: colibri_x86_packed_bytes of it, 64-byte aligned. */
void colibri_x86_pack(int32_t kind, const void *w, const float *scale, int32_t n_out, int32_t n_in,
                      void *dst);

/** @brief Alignment of a block of packed copies: a huge page, so madvise(MADV_HUGEPAGE) can
 *         back it. */
#define CLB_PACK_ALIGN ((size_t)2 << 20)

/** @brief A block of `bytes` (a multiple of CLB_PACK_ALIGN) for packed copies, aligned to
 *         CLB_PACK_ALIGN and advised for huge pages before its first write (mat_pack.c; NULL:
 *         no memory). The generated models' colibri_pack_matrices and the model-file runtime's
 *         clb_lm_pack take theirs here; free() releases it. */
void *clb_pack_alloc(size_t bytes);

#if defined(COLIBRI_X86_PACKED)
/** @brief Rows [r0, r1) (r0 a multiple of 16) of W x for n_tok int8 activation rows (xq / sx as
 *         colibri_matmul_q8_q8's): output row t at y + t * ldy, y and rscale (PACK_Q8: the per-row
 *         scales) at row r0. Every value has the bits colibri_matvec_* gives it. */
void colibri_x86_matmul_packed(int32_t kind, const void *packed, const float *rscale, int32_t n_out,
                               int32_t n_in, int32_t r0, int32_t r1, const int8_t *xq,
                               const float *sx, float *y, int32_t ldy, int32_t n_tok);
#endif

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
