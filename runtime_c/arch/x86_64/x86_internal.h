/**
 * @file x86_internal.h
 * @brief Internal to runtime_c/arch/x86_64: the target attributes of the levels, the small
 *        inline pieces several kernel files share, and the level kernels' declarations (defined
 *        in x86_float.c, x86_matvec.c, x86_matvec_avx512.c, x86_matmul.c, x86_matmul_avx512.c;
 *        collected into the levels' tables by x86_dispatch.c). Only for x86-64 builds with
 *        COLIBRI_X86_DISPATCH (kernels_x86.h); every file that includes it compiles to nothing
 *        elsewhere.
 */
#ifndef COLIBRI_X86_INTERNAL_H
#define COLIBRI_X86_INTERNAL_H

#include "../../src/kernels_x86.h"

#include "colibri_math.h"
#include "colibri_quant.h"

#include <stddef.h>
#include <stdint.h>

#if defined(COLIBRI_X86_DISPATCH)
#include <cpuid.h>
#include <immintrin.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define KX_AVX2 __attribute__((target("avx2,f16c")))
/* AVX-VNNI / AVX-512 VNNI: with the compilers that have them (kernels_x86.h) */
#if defined(COLIBRI_X86_PACKED)
#define KX_HAVE_VNNI 1
#endif
#define KX_AVXVNNI __attribute__((target("avx2,f16c,avxvnni")))
#define KX_AVX512VNNI __attribute__((target("avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define KX_INLINE static inline __attribute__((always_inline))
/* the int8 / int4 matvecs stay functions of their own where the multi-token kernels call them */
#define KX_NOINLINE __attribute__((noinline))
/* the loops over the eight rows of a group, whole (their values stay in registers) */
#define KX_UNROLL _Pragma("GCC unroll 8")

/* -- shared pieces (AVX2) -------------------------------------------------------------------- */

/* The group of eight rows from o0 of a matrix w of n_out rows, stride elements apart: declares
 * nr (the rows that exist, <= 8) and row[8]; rows past n_out point at row o0 again (valid
 * memory; their lanes are never stored). */
#define KX_ROWS8(TYPE, row, nr, w, o0, n_out, stride)                                              \
    const int32_t nr = ((n_out) - (o0) < 8) ? (n_out) - (o0) : 8;                                  \
    const TYPE *row[8];                                                                            \
    KX_UNROLL for (int32_t r_ = 0; r_ < 8; r_++)                                                   \
    {                                                                                              \
        row[r_] = (w) + (size_t)((o0) + (r_ < nr ? r_ : 0)) * (size_t)(stride);                    \
    }

/* Lane r = the sum of the eight int32 lanes of p[r]. */
KX_INLINE KX_AVX2 __m256i kx_hsum8(const __m256i p[8])
{
    const __m256i s01 = _mm256_hadd_epi32(p[0], p[1]);
    const __m256i s23 = _mm256_hadd_epi32(p[2], p[3]);
    const __m256i s45 = _mm256_hadd_epi32(p[4], p[5]);
    const __m256i s67 = _mm256_hadd_epi32(p[6], p[7]);
    const __m256i s0123 = _mm256_hadd_epi32(s01, s23);
    const __m256i s4567 = _mm256_hadd_epi32(s45, s67);
    return _mm256_add_epi32(_mm256_permute2x128_si256(s0123, s4567, 0x20),
                            _mm256_permute2x128_si256(s0123, s4567, 0x31));
}

/* c[j] lane r = r[r][j]: the transpose of an 8 x 8 tile of floats. */
KX_INLINE KX_AVX2 void kx_transpose8(__m256 r[8])
{
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]);
    const __m256 t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]);
    const __m256 t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]);
    const __m256 t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]);
    const __m256 t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44);
    const __m256 s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44);
    const __m256 s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44);
    const __m256 s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44);
    const __m256 s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
    r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
    r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

/* y[0..nr) = the first nr lanes of v. */
KX_INLINE KX_AVX2 void kx_store_rows(float *y, __m256 v, int32_t nr)
{
    if (nr == 8) {
        _mm256_storeu_ps(y, v);
    } else {
        float tmp[8];
        _mm256_storeu_ps(tmp, v);
        memcpy(y, tmp, (size_t)nr * sizeof(float));
    }
}

/* Software prefetch of n lines from p on (48 bytes apart: every 64-byte line of a run of
 * 48 * n bytes, or 64 * n when n = 4): the matvecs read eight rows at once, short streams
 * (1 KB to a few KB) the hardware prefetchers barely learn before they end, so each block step
 * prefetches its share of the next group of eight rows, which is contiguous. A prefetch never
 * faults, and past the end of the weights it reads what follows them, or nothing. The
 * addresses are integers (uintptr_t): a pointer past the end of the weights would be undefined
 * behaviour in C, an address handed to the prefetch hint is not. */
KX_INLINE void kx_prefetch(uintptr_t p, int n)
{
    const uintptr_t step = (n == 4) ? 64u : 48u;
    for (int k = 0; k < n; k++) {
        _mm_prefetch((const char *)(p + (uintptr_t)k * step), _MM_HINT_T0);
    }
}

/* The 32 nibbles of a block as unsigned bytes 0..15, in the order of x (low halves first). */
KX_INLINE KX_AVX2 __m256i kx_nibbles(const colibri_block_q4_32 *blk)
{
    const __m128i v = _mm_loadu_si128((const __m128i *)(const void *)blk->qs);
    const __m128i m = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}

#if defined(KX_HAVE_VNNI)
#define KX_DPBUSD_AVX(a, b, c) _mm256_dpbusd_avx_epi32(a, b, c)
#define KX_DPBUSD_512(a, b, c) _mm256_dpbusd_epi32(a, b, c)
/* Prefetch into L2 of n lines from p on (the next group of rows, one step's share: L2 rather
 * than L1, measured faster from DRAM than _MM_HINT_T0 at the same distance). */
KX_INLINE void kx_mv512_prefetch(uintptr_t p, int n)
{
    _Pragma("GCC unroll 16") for (int k = 0; k < n; k++)
    {
        _mm_prefetch((const char *)(p + (uintptr_t)k * 64u), _MM_HINT_T1);
    }
}
#endif

/* -- the level kernels (external only so that the dispatch table can name them) ------------- */

/* x86_float.c */
void colibri_x86_matvec_f32_avx2(const float *w, const float *x, float *y, int32_t n_out,
                                 int32_t n_in);
void colibri_x86_matvec_f16_f32_avx2(const uint16_t *w, const float *x, float *y, int32_t n_out,
                                     int32_t n_in);
void colibri_x86_silu_mul_f32_avx2(float *h, const float *g, size_t n);
void colibri_x86_exp_shift_f32_avx2(float *x, size_t n, float m);
int32_t colibri_x86_argmax_f32_avx2(const float *x, int32_t n);
int32_t colibri_x86_first_above_f32_avx2(const float *x, int32_t n, float thr);
void colibri_x86_axpy_f32_avx2(float *y, float a, const float *x, int32_t n);
void colibri_x86_wsum_f32_avx2(float *out, const float *w, float sum, const float *v, size_t stride,
                               int32_t n, int32_t d);

/* x86_matvec.c (the VNNI levels' and x86_matvec_avx512.c's too) */
#define KX_DECLARE_MATVECS(LEVEL)                                                                  \
    void colibri_x86_matvec_q8_q8_##LEVEL(const int8_t *q, const float *scale, const int8_t *xq,   \
                                          const float *sx, float *y, int32_t n_out, int32_t n_in); \
    void colibri_x86_matvec_q8b_q8_##LEVEL(const int8_t *q, const float *scale, const int8_t *xq,  \
                                           const float *sx, float *y, int32_t n_out,               \
                                           int32_t n_in);                                          \
    void colibri_x86_matvec_q4_q8_##LEVEL(const colibri_block_q4_32 *w, const int8_t *xq,          \
                                          const float *sx, float *y, int32_t n_out, int32_t n_in)
/* x86_matmul.c, x86_matmul_avx512.c */
#define KX_DECLARE_MATMULS(LEVEL)                                                                  \
    void colibri_x86_matmul_q8_q8_##LEVEL(const int8_t *q, const float *scale, const int8_t *xq,   \
                                          const float *sx, float *y, int32_t ldy, int32_t n_out,   \
                                          int32_t n_in, int32_t n_tok);                            \
    void colibri_x86_matmul_q8b_q8_##LEVEL(const int8_t *q, const float *scale, const int8_t *xq,  \
                                           const float *sx, float *y, int32_t ldy, int32_t n_out,  \
                                           int32_t n_in, int32_t n_tok);                           \
    void colibri_x86_matmul_q4_q8_##LEVEL(const colibri_block_q4_32 *w, const int8_t *xq,          \
                                          const float *sx, float *y, int32_t ldy, int32_t n_out,   \
                                          int32_t n_in, int32_t n_tok)

KX_DECLARE_MATVECS(avx2);
KX_DECLARE_MATMULS(avx2);
#if defined(KX_HAVE_VNNI)
KX_DECLARE_MATVECS(avxvnni);
KX_DECLARE_MATMULS(avxvnni);
KX_DECLARE_MATVECS(avx512vnni); /* 256-bit, below eight rows of the 512-bit ones */
KX_DECLARE_MATVECS(avx512z);
KX_DECLARE_MATMULS(avx512);
/* x86_matvec_avx512.c: colibri_quantize_row_q8 at the AVX-512 VNNI level */
void colibri_x86_quantize_row_q8_avx512(const float *x, int8_t *xq, float *sx, int32_t n);
#endif

#if defined(KX_HAVE_VNNI)
/* x86_matmul_avx512.c: the packed matrices of kernels_x86.h at the AVX-512 VNNI level (the
 * arguments checked by x86_dispatch.c's public functions; n_in a multiple of 32). */
size_t colibri_x86_packed_bytes_avx512(int32_t kind, int32_t n_out, int32_t n_in);
void colibri_x86_pack_avx512(int32_t kind, const void *w, const float *scale, int32_t n_out,
                             int32_t n_in, void *dst);
void colibri_x86_matmul_packed_avx512(int32_t kind, const void *packed, const float *rscale,
                                      int32_t n_out, int32_t n_in, int32_t r0, int32_t r1,
                                      const int8_t *xq, const float *sx, float *y, int32_t ldy,
                                      int32_t n_tok);
#endif

/* x86_matmul.c: zero-padded copies of the partial last block of `rows` rows (n bytes from
 * src + r * ss each, into width-byte rows at dst): one plain function for every level and tile. */
void colibri_x86_pad_rows(int8_t *dst, size_t width, const int8_t *src, size_t ss, int rows,
                          size_t n);

#endif /* COLIBRI_X86_DISPATCH */

#endif /* COLIBRI_X86_INTERNAL_H */
