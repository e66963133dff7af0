/**
 * @file kernels_q.c
 * @brief Kernels of the quantised formats (colibri_quant.h): fp16 / int8 / int4 weights against
 *        fp32 or per-token int8 activations. The order of every float operation is the one
 *        documented in colibri_quant.h; colibri/reference/kernels.py mirrors it.
 *
 * The integer dot products have per-ISA paths chosen by the compiler's ACLE feature macros
 * (as CMSIS-NN does): Helium / MVE (Cortex-M55: VMLADAVA, 16 MACs), Neon (Cortex-A: VMULL +
 * VPADAL, 16 MACs; SDOT where the core has the dot-product extension, __ARM_FEATURE_DOTPROD),
 * SSE2 on x86-64 hosts (PMADDWD, 16 MACs), the 32-bit SIMD / DSP extension (Cortex-M4 / M7, and
 * int4 blocks on the M55: SXTB16 + SMLAD, 2 MACs), the Xtensa MAC16 option where the board says
 * the core has it (COLIBRI_XTENSA_MAC16: ESP32-S3; 40-bit accumulator, 16 x 16-bit MULA), else
 * portable C. Integer sums do not depend on
 * their order, so every path returns exactly what the portable loop returns (tests/platform/
 * kernels.c checks it on every board). On Neon cores kernels_neon.h adds the int4 blocks, the
 * hardware fp16 conversion, and the fp16 and int4 x fp32 matvecs (four rows per register on
 * aarch64), each bit-identical to the portable C (the same float operations in the same order per
 * row); a signalling-NaN fp16 converts to a quiet NaN there (the portable code keeps its bits).
 */
#include "colibri_math.h"
#include "colibri_quant.h"
#include "kernels_scalar.h"
#include "kernels_x86.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__ARM_FEATURE_MVE) && (__ARM_FEATURE_MVE & 1)
#include <arm_mve.h>
#define COLIBRI_DOT_MVE 1
#elif defined(__ARM_NEON)
#include "kernels_neon.h" /* int4 blocks, fp16 conversion and matvec (includes arm_neon.h) */
#define COLIBRI_DOT_NEON 1
#elif defined(__SSE2__)
#include <emmintrin.h>
#define COLIBRI_DOT_SSE2 1
#endif
#if defined(COLIBRI_XTENSA_MAC16) && defined(__XTENSA__)
#define COLIBRI_DOT_MAC16 1
#endif
#if defined(__ARM_FEATURE_SIMD32) && !defined(COLIBRI_DOT_NEON)
/* Cortex-M4 / M7 (and int4 blocks on M55); on Neon cores GCC vectorises the portable loops. */
#include <arm_acle.h>
#define COLIBRI_HAVE_SIMD32 1
#endif

float colibri_f16_to_f32(uint16_t h)
{
#if defined(COLIBRI_F16_NEON)
    return colibri_neon_f16_to_f32(h);
#else
    return colibri_f16_to_f32_scalar(h);
#endif
}

void colibri_matvec_f16_f32(const uint16_t *w, const float *x, float *y, int32_t n_out,
                            int32_t n_in)
{
    COLIBRI_X86_KERNEL(matvec_f16_f32, (w, x, y, n_out, n_in));
#if defined(COLIBRI_F16_NEON)
    colibri_neon_matvec_f16_f32(w, x, y, n_out, n_in);
    return;
#endif
    for (int32_t o = 0; o < n_out; o++) {
        const uint16_t *row = w + (size_t)o * (size_t)n_in;
        float acc = 0.0f;
        for (int32_t i = 0; i < n_in; i++) {
            acc += colibri_f16_to_f32(row[i]) * x[i];
        }
        y[o] = acc;
    }
}

void colibri_matvec_q8_f32(const int8_t *q, const float *scale, const float *x, float *y,
                           int32_t n_out, int32_t n_in)
{
    for (int32_t o = 0; o < n_out; o++) {
        const int8_t *row = q + (size_t)o * (size_t)n_in;
        float acc = 0.0f;
        for (int32_t i = 0; i < n_in; i++) {
            acc += (float)row[i] * x[i];
        }
        y[o] = acc * scale[o];
    }
}

/* sum_j (float)(q_j - 8) * x[j] over the first n weights of a block, j ascending. */
static inline float q4_block_dot_f32(const colibri_block_q4_32 *blk, const float *x, int32_t n)
{
    float bs = 0.0f;
    if (n == COLIBRI_QK4) {
#if defined(COLIBRI_DOT_NEON)
        return colibri_neon_q4_block_f32(blk, x);
#endif
        for (int32_t j = 0; j < 16; j++) {
            bs += (float)((int32_t)(blk->qs[j] & 0x0Fu) - 8) * x[j];
        }
        for (int32_t j = 0; j < 16; j++) {
            bs += (float)((int32_t)(blk->qs[j] >> 4) - 8) * x[j + 16];
        }
        return bs;
    }
    for (int32_t j = 0; j < n; j++) {
        bs += (float)colibri_q4_value(blk, j) * x[j];
    }
    return bs;
}

void colibri_matvec_q4_f32(const colibri_block_q4_32 *w, const float *x, float *y, int32_t n_out,
                           int32_t n_in)
{
    const size_t nb = COLIBRI_Q4_BLOCKS(n_in);
    int32_t o = 0;
#if defined(COLIBRI_F16_NEON) && defined(__aarch64__)
    for (; o + 4 <= n_out; o += 4) { /* four rows per register, each lane in the order below */
        colibri_neon_q4_f32_rows4(w + (size_t)o * nb, nb, x, y + o, n_in);
    }
#endif
    for (; o < n_out; o++) {
        const colibri_block_q4_32 *row = w + (size_t)o * nb;
        float acc = 0.0f;
        for (size_t b = 0; b < nb; b++) {
            const int32_t i0 = (int32_t)(b * COLIBRI_QK4);
            const int32_t n = (n_in - i0 < COLIBRI_QK4) ? n_in - i0 : COLIBRI_QK4;
            acc += q4_block_dot_f32(&row[b], x + i0, n) * colibri_f16_to_f32(row[b].d);
        }
        y[o] = acc;
    }
}

#if defined(COLIBRI_DOT_SSE2)
/* Lane-wise maximum of two vectors of non-negative int32 (SSE2 has no PMAXSD). */
static inline __m128i colibri_max_epi32_sse2(__m128i a, __m128i b)
{
    const __m128i gt = _mm_cmpgt_epi32(a, b);
    return _mm_or_si128(_mm_and_si128(gt, a), _mm_andnot_si128(gt, b));
}

/*
 * A whole block, SSE2, bit for bit colibri_quantize_block_q8_scalar when its max |x| is finite and
 * at least 2^-100 (returns 0, writing nothing, otherwise): as colibri_qi_quantize_row, t =
 * (int32_t)(x * (inv * 2^16)) (x * inv16 == (x * inv) * 2^16 exactly: scaling by a power of two
 * commutes with rounding, and a product below 2^-126 truncates to t = 0 either way) and code = (t +
 * 2^15 + (t >> 31)) >> 16, round(x * inv) half away from zero; |x * inv| <= 127 * (1 + 2^-23) needs
 * no clamp, and the codes fit the saturating packs unchanged.
 */
static int quantize_block_q8_sse2(const float *x, int8_t *xq, float *sx)
{
    const __m128i abs_mask = _mm_set1_epi32(0x7FFFFFFF);
    __m128i m = _mm_setzero_si128();
#pragma GCC unroll 8
    for (int32_t i = 0; i < COLIBRI_QK8; i += 4) {
        const __m128i bits = _mm_loadu_si128((const __m128i *)(const void *)(x + i));
        m = colibri_max_epi32_sse2(m, _mm_and_si128(bits, abs_mask));
    }
    m = colibri_max_epi32_sse2(m, _mm_shuffle_epi32(m, 0x4E));
    m = colibri_max_epi32_sse2(m, _mm_shuffle_epi32(m, 0xB1));
    const uint32_t abits = (uint32_t)_mm_cvtsi128_si32(m);
    if (abits < 0x0D800000u || abits >= 0x7F800000u) { /* below 2^-100, infinity or NaN */
        return 0;
    }
    float amax;
    memcpy(&amax, &abits, sizeof amax);
    const __m128 inv16 = _mm_set1_ps(((float)COLIBRI_Q8_MAX / amax) * 65536.0f);
    const __m128i half = _mm_set1_epi32(32768);
#pragma GCC unroll 2
    for (int32_t i = 0; i < COLIBRI_QK8; i += 16) {
        __m128i c[4];
#pragma GCC unroll 4
        for (int32_t j = 0; j < 4; j++) {
            const __m128i t = _mm_cvttps_epi32(_mm_mul_ps(_mm_loadu_ps(x + i + 4 * j), inv16));
            c[j] = _mm_srai_epi32(_mm_add_epi32(_mm_add_epi32(t, half), _mm_srai_epi32(t, 31)), 16);
        }
        const __m128i codes =
            _mm_packs_epi16(_mm_packs_epi32(c[0], c[1]), _mm_packs_epi32(c[2], c[3]));
        _mm_storeu_si128((__m128i *)(void *)(xq + i), codes);
    }
    *sx = amax / (float)COLIBRI_Q8_MAX;
    return 1;
}
#endif

void colibri_quantize_row_q8(const float *x, int8_t *xq, float *sx, int32_t n)
{
    for (int32_t i0 = 0, b = 0; i0 < n; i0 += COLIBRI_QK8, b++) {
        const int32_t m = (n - i0 < COLIBRI_QK8) ? n - i0 : COLIBRI_QK8;
#if defined(COLIBRI_DOT_SSE2)
        if (m == COLIBRI_QK8 && quantize_block_q8_sse2(x + i0, xq + i0, sx + b)) {
            continue;
        }
#endif
        sx[b] = colibri_quantize_block_q8_scalar(x + i0, xq + i0, m);
    }
}

#if defined(COLIBRI_HAVE_SIMD32)
/** @brief Four bytes from any address (LDR: unaligned loads are fine on ARMv7-M / v7-A). */
static inline uint32_t colibri_load4(const void *p)
{
    uint32_t w;
    memcpy(&w, p, sizeof w);
    return w;
}

/** @brief SXTB16 of x rotated right by 8 (bytes 1 and 3): one instruction, which ACLE lacks. */
static inline uint32_t colibri_sxtb16_ror8(uint32_t x)
{
    uint32_t r;
    __asm__("sxtb16 %0, %1, ror #8" : "=r"(r) : "r"(x));
    return r;
}

/** @brief acc + the dot product of four int8 lanes of wa and wb (two SMLADs). */
static inline int32_t colibri_dot4_simd32(uint32_t wa, uint32_t wb, int32_t acc)
{
    /* SXTB16 sign-extends bytes 0 and 2 into two halfwords; rotated by 8, bytes 1 and 3. */
    acc = __smlad(__sxtb16(wa), __sxtb16(wb), acc);
    return __smlad(colibri_sxtb16_ror8(wa), colibri_sxtb16_ror8(wb), acc);
}
#endif

#if defined(COLIBRI_DOT_MAC16)
/* Xtensa MAC16: MULA.AA.HH / .LL add the product of the high (low) signed 16-bit halves of two
 * address registers to the 40-bit accumulator ACC. A word of four int8 codes [c3 c2 c1 c0] masked
 * with 0xFF00FF00 holds 256*c3 and 256*c1 in its halves, and shifted left by 8 first, 256*c2 and
 * 256*c0: exact 16-bit values, so four MULAs add 65536 times the four products, for 3 instructions
 * of unpacking per operand word. |65536 a b| <= 2^30, so ACC (2^39) holds 256 of them: each piece
 * of at most 256 codes is read out (ACC / 65536, exact) and ACC cleared. a and b are 4-byte
 * aligned and n a multiple of 4. ACC is the core's (ESP-IDF saves it with a task's context). */
/* One word of each operand: unpack both into masked halves, four MULAs. */
#define CLB_MAC16_WORD(off)                                                                        \
    "l32i   %[x], %[pa], " #off "\n\t"                                                             \
    "l32i   %[y], %[pb], " #off "\n\t"                                                             \
    "and    %[xh], %[x], %[m]\n\t"                                                                 \
    "and    %[yh], %[y], %[m]\n\t"                                                                 \
    "slli   %[x], %[x], 8\n\t"                                                                     \
    "slli   %[y], %[y], 8\n\t"                                                                     \
    "and    %[x], %[x], %[m]\n\t"                                                                  \
    "and    %[y], %[y], %[m]\n\t"                                                                  \
    "mula.aa.hh %[xh], %[yh]\n\t"                                                                  \
    "mula.aa.ll %[xh], %[yh]\n\t"                                                                  \
    "mula.aa.hh %[x], %[y]\n\t"                                                                    \
    "mula.aa.ll %[x], %[y]\n\t"

static inline __attribute__((always_inline)) int32_t dot_q8_mac16(const int8_t *a, const int8_t *b,
                                                                  int32_t n)
{
    const int8_t *pa = a;
    const int8_t *pb = b;
    const uint32_t mask = 0xFF00FF00u;
    int32_t acc = 0;
    for (int32_t left = n; left > 0;) {
        const int32_t words = (left < 256 ? left : 256) / 4;
        int32_t quads = words / 4;
        uint32_t x;
        uint32_t y;
        uint32_t xh;
        uint32_t yh;
        __asm__ volatile("wsr %0, acclo\n\twsr %0, acchi" ::"a"(0) : "memory");
        /* A branch loop, not the zero-overhead LOOP: GCC may turn an enclosing loop into one,
         * and LOOP registers do not nest. */
        if (quads > 0) {
            __asm__ volatile("1:\n\t" CLB_MAC16_WORD(0) CLB_MAC16_WORD(4) CLB_MAC16_WORD(8)
                                 CLB_MAC16_WORD(12) "addi   %[pa], %[pa], 16\n\t"
                                                    "addi   %[pb], %[pb], 16\n\t"
                                                    "addi   %[q], %[q], -1\n\t"
                                                    "bnez   %[q], 1b"
                             : [pa] "+a"(pa), [pb] "+a"(pb), [q] "+a"(quads), [x] "=&a"(x),
                               [y] "=&a"(y), [xh] "=&a"(xh), [yh] "=&a"(yh)
                             : [m] "a"(mask)
                             : "memory");
        }
        for (int32_t j = 0; j < words % 4; j++) {
            __asm__ volatile(CLB_MAC16_WORD(0) "addi   %[pa], %[pa], 4\n\t"
                                               "addi   %[pb], %[pb], 4"
                             : [pa] "+a"(pa), [pb] "+a"(pb), [x] "=&a"(x), [y] "=&a"(y),
                               [xh] "=&a"(xh), [yh] "=&a"(yh)
                             : [m] "a"(mask)
                             : "memory");
        }
        uint32_t lo;
        uint32_t hi;
        __asm__ volatile("rsr %0, acclo\n\trsr %1, acchi" : "=a"(lo), "=a"(hi));
        /* ACC / 65536: bits 39..16, a 24-bit two's complement value */
        const uint32_t piece = ((hi & 0xFFu) << 16) | (lo >> 16);
        acc += (int32_t)(piece << 8) >> 8;
        left -= words * 4;
    }
    return acc;
}
#undef CLB_MAC16_WORD
#endif

/* The integer dot product, inlined where n is a constant (full blocks of COLIBRI_QK8), so the
 * compiler drops the loops that cannot run. */
static inline __attribute__((always_inline)) int32_t dot_q8(const int8_t *a, const int8_t *b,
                                                            int32_t n)
{
    int32_t acc = 0;
    int32_t i = 0;
#if defined(COLIBRI_DOT_MVE)
    for (; i + 16 <= n; i += 16) {
        acc = vmladavaq_s8(acc, vld1q_s8(a + i), vld1q_s8(b + i));
    }
#elif defined(COLIBRI_DOT_NEON)
    int32x4_t acc4 = vdupq_n_s32(0);
    for (; i + 16 <= n; i += 16) {
        const int8x16_t va = vld1q_s8(a + i);
        const int8x16_t vb = vld1q_s8(b + i);
#if defined(__ARM_FEATURE_DOTPROD)
        /* Armv8.2-A SDOT: 16 MACs into four int32 lanes */
        acc4 = vdotq_s32(acc4, va, vb);
#else
        /* int8 x int8 products fit int16: widen, then pair-add */
        acc4 = vpadalq_s16(acc4, vmull_s8(vget_low_s8(va), vget_low_s8(vb)));
#if defined(__aarch64__)
        acc4 = vpadalq_s16(acc4, vmull_high_s8(va, vb));
#else
        acc4 = vpadalq_s16(acc4, vmull_s8(vget_high_s8(va), vget_high_s8(vb)));
#endif
#endif
    }
    for (; i + 8 <= n; i += 8) {
        acc4 = vpadalq_s16(acc4, vmull_s8(vld1_s8(a + i), vld1_s8(b + i)));
    }
    acc = colibri_neon_hsum_s32(acc4);
#elif defined(COLIBRI_DOT_SSE2)
    __m128i acc4 = _mm_setzero_si128();
    const __m128i zero = _mm_setzero_si128();
    for (; i + 16 <= n; i += 16) { /* sign-extend to int16, then PMADDWD pairs into int32 */
        const __m128i va = _mm_loadu_si128((const __m128i *)(const void *)(a + i));
        const __m128i vb = _mm_loadu_si128((const __m128i *)(const void *)(b + i));
        const __m128i sa = _mm_cmpgt_epi8(zero, va);
        const __m128i sb = _mm_cmpgt_epi8(zero, vb);
        acc4 = _mm_add_epi32(acc4,
                             _mm_madd_epi16(_mm_unpacklo_epi8(va, sa), _mm_unpacklo_epi8(vb, sb)));
        acc4 = _mm_add_epi32(acc4,
                             _mm_madd_epi16(_mm_unpackhi_epi8(va, sa), _mm_unpackhi_epi8(vb, sb)));
    }
    int32_t lanes[4];
    _mm_storeu_si128((__m128i *)(void *)lanes, acc4);
    acc = lanes[0] + lanes[1] + lanes[2] + lanes[3];
#elif defined(COLIBRI_DOT_MAC16)
    if ((((uintptr_t)a | (uintptr_t)b) & 3u) == 0) {
        acc = dot_q8_mac16(a, b, n & ~3);
        i = n & ~3;
    }
#elif defined(COLIBRI_HAVE_SIMD32)
    for (; i + 8 <= n; i += 8) {
        acc = colibri_dot4_simd32(colibri_load4(a + i), colibri_load4(b + i), acc);
        acc = colibri_dot4_simd32(colibri_load4(a + i + 4), colibri_load4(b + i + 4), acc);
    }
    for (; i + 4 <= n; i += 4) {
        acc = colibri_dot4_simd32(colibri_load4(a + i), colibri_load4(b + i), acc);
    }
#endif
    for (; i < n; i++) {
        acc += (int32_t)a[i] * (int32_t)b[i];
    }
    return acc;
}

int32_t colibri_dot_q8(const int8_t *a, const int8_t *b, int32_t n)
{
    return dot_q8(a, b, n);
}

/* One full block of COLIBRI_QK8 int8 products. On the 32-bit SIMD cores it is unrolled whole
 * (16 SXTB16 pairs, 16 SMLADs, no loop counter), which pays for the block's scale multiply. */
static inline __attribute__((always_inline)) int32_t dot_q8_block(const int8_t *a, const int8_t *b)
{
#if defined(COLIBRI_HAVE_SIMD32) && !defined(COLIBRI_DOT_MVE)
    int32_t acc = 0;
#pragma GCC unroll 8
    for (int32_t j = 0; j < COLIBRI_QK8; j += 4) {
        acc = colibri_dot4_simd32(colibri_load4(a + j), colibri_load4(b + j), acc);
    }
    return acc;
#else
    return dot_q8(a, b, COLIBRI_QK8);
#endif
}

int32_t colibri_dot_q4_q8(const colibri_block_q4_32 *blk, const int8_t *xq, int32_t n)
{
    int32_t acc = 0;
    if (n == COLIBRI_QK4) { /* integer sums: any order gives the same result */
#if defined(COLIBRI_HAVE_SIMD32)
        /* sum (q - 8) x = sum q x - 8 sum x, the nibbles q in 0..15 as int8 lanes. */
        int32_t sum_x = 0;
        for (int32_t j = 0; j < 16; j += 4) {
            const uint32_t w = colibri_load4(blk->qs + j);
            const uint32_t x_lo = colibri_load4(xq + j);
            const uint32_t x_hi = colibri_load4(xq + j + 16);
            acc = colibri_dot4_simd32(w & 0x0F0F0F0Fu, x_lo, acc);
            acc = colibri_dot4_simd32((w >> 4) & 0x0F0F0F0Fu, x_hi, acc);
            sum_x = colibri_dot4_simd32(0x01010101u, x_lo, sum_x);
            sum_x = colibri_dot4_simd32(0x01010101u, x_hi, sum_x);
        }
        return acc - 8 * sum_x;
#elif defined(COLIBRI_DOT_NEON)
        return colibri_neon_q4_block(blk, xq);
#else
        for (int32_t j = 0; j < 16; j++) {
            const int32_t lo = (int32_t)(blk->qs[j] & 0x0Fu) - 8;
            const int32_t hi = (int32_t)(blk->qs[j] >> 4) - 8;
            acc += lo * (int32_t)xq[j] + hi * (int32_t)xq[j + 16];
        }
        return acc;
#endif
    }
    for (int32_t j = 0; j < n; j++) {
        acc += colibri_q4_value(blk, j) * (int32_t)xq[j];
    }
    return acc;
}

void colibri_matvec_q8_q8(const int8_t *q, const float *scale, const int8_t *xq, const float *sx,
                          float *y, int32_t n_out, int32_t n_in)
{
    COLIBRI_X86_KERNEL(matvec_q8_q8, (q, scale, xq, sx, y, n_out, n_in));
    const int32_t full = n_in / COLIBRI_QK8;
    const int32_t tail = n_in - full * COLIBRI_QK8;
    for (int32_t o = 0; o < n_out; o++) {
        const int8_t *row = q + (size_t)o * (size_t)n_in;
        float acc = 0.0f;
        int32_t b = 0;
        for (; b < full; b++) {
            const size_t i0 = (size_t)b * COLIBRI_QK8;
            acc += (float)dot_q8_block(row + i0, xq + i0) * sx[b];
        }
        if (tail > 0) {
            const size_t i0 = (size_t)b * COLIBRI_QK8;
            acc += (float)dot_q8(row + i0, xq + i0, tail) * sx[b];
        }
        y[o] = acc * scale[o];
    }
}

void colibri_matvec_q4_q8(const colibri_block_q4_32 *w, const int8_t *xq, const float *sx, float *y,
                          int32_t n_out, int32_t n_in)
{
    COLIBRI_X86_KERNEL(matvec_q4_q8, (w, xq, sx, y, n_out, n_in));
    const size_t nb = COLIBRI_Q4_BLOCKS(n_in);
    for (int32_t o = 0; o < n_out; o++) {
        const colibri_block_q4_32 *row = w + (size_t)o * nb;
        float acc = 0.0f;
        for (size_t b = 0; b < nb; b++) {
            const int32_t i0 = (int32_t)(b * COLIBRI_QK4);
            const int32_t n = (n_in - i0 < COLIBRI_QK4) ? n_in - i0 : COLIBRI_QK4;
            const float d = colibri_f16_to_f32(row[b].d);
#if defined(COLIBRI_DOT_NEON)
            if (n == COLIBRI_QK4) { /* the block's integer sum, inlined */
                acc += (float)colibri_neon_q4_block(&row[b], xq + i0) * (d * sx[b]);
                continue;
            }
#endif
            acc += (float)colibri_dot_q4_q8(&row[b], xq + i0, n) * (d * sx[b]);
        }
        y[o] = acc;
    }
}

void colibri_matvec_q8b_q8(const int8_t *q, const float *scale, const int8_t *xq, const float *sx,
                           float *y, int32_t n_out, int32_t n_in)
{
    COLIBRI_X86_KERNEL(matvec_q8b_q8, (q, scale, xq, sx, y, n_out, n_in));
    const int32_t full = n_in / COLIBRI_QK8;
    const int32_t tail = n_in - full * COLIBRI_QK8;
    const size_t nb = COLIBRI_Q8_BLOCKS(n_in);
    for (int32_t o = 0; o < n_out; o++) {
        const int8_t *row = q + (size_t)o * (size_t)n_in;
        const float *ws = scale + (size_t)o * nb;
        float acc = 0.0f;
        int32_t b = 0;
        for (; b < full; b++) {
            const size_t i0 = (size_t)b * COLIBRI_QK8;
            acc += (float)dot_q8_block(row + i0, xq + i0) * (ws[b] * sx[b]);
        }
        if (tail > 0) {
            const size_t i0 = (size_t)b * COLIBRI_QK8;
            acc += (float)dot_q8(row + i0, xq + i0, tail) * (ws[b] * sx[b]);
        }
        y[o] = acc;
    }
}

void colibri_matvec_q8b_f32(const int8_t *q, const float *scale, const float *x, float *y,
                            int32_t n_out, int32_t n_in)
{
    const size_t nb = COLIBRI_Q8_BLOCKS(n_in);
    for (int32_t o = 0; o < n_out; o++) {
        const int8_t *row = q + (size_t)o * (size_t)n_in;
        const float *ws = scale + (size_t)o * nb;
        float acc = 0.0f;
        for (size_t b = 0; b < nb; b++) {
            const int32_t i0 = (int32_t)(b * COLIBRI_QK8);
            const int32_t i1 =
                (n_in - i0 < (int32_t)COLIBRI_QK8) ? n_in : i0 + (int32_t)COLIBRI_QK8;
            float s = 0.0f;
            for (int32_t i = i0; i < i1; i++) {
                s += (float)row[i] * x[i];
            }
            acc += s * ws[b];
        }
        y[o] = acc;
    }
}

void colibri_matvec_f32(const float *w, const float *x, float *y, int32_t n_out, int32_t n_in)
{
    COLIBRI_X86_KERNEL(matvec_f32, (w, x, y, n_out, n_in));
    for (int32_t o = 0; o < n_out; o++) {
        const float *row = w + (size_t)o * (size_t)n_in;
        float acc = 0.0f;
        for (int32_t i = 0; i < n_in; i++) {
            acc += row[i] * x[i];
        }
        y[o] = acc;
    }
}

void colibri_silu_mul_f32(float *h, const float *g, size_t n)
{
    COLIBRI_X86_KERNEL(silu_mul_f32, (h, g, n));
    for (size_t j = 0; j < n; ++j) {
        h[j] = colibri_silu(h[j]) * g[j];
    }
}

void colibri_axpy_f32(float *y, float a, const float *x, int32_t n)
{
    COLIBRI_X86_KERNEL(axpy_f32, (y, a, x, n));
    for (int32_t i = 0; i < n; i++) {
        y[i] += a * x[i];
    }
}

int32_t colibri_argmax_f32(const float *x, int32_t n)
{
#if defined(COLIBRI_X86_DISPATCH)
    const colibri_x86_kernels_t *kx = colibri_x86_kernels();
    if (kx->argmax_f32 != NULL) {
        return kx->argmax_f32(x, n);
    }
#endif
    int32_t best = 0;
    for (int32_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) {
            return -1;
        }
        if (x[i] > x[best]) {
            best = i;
        }
    }
    return best;
}

/* -- multi-token kernels ------------------------------------------------------------------- */

/* Rows per chunk of the multi-token kernels: about COLIBRI_MATMUL_CHUNK bytes of weights (a
 * multiple of 16 rows, at least 16: the AVX-512 kernels take rows sixteen at a time), which every
 * token of the group runs over while they are in cache. Each chunk is an ordinary matvec over a
 * subset of rows, so row t of the result is the matvec of row t bit for bit, on every kernel path.
 */
#define COLIBRI_MATMUL_CHUNK 16384u

static int32_t matmul_chunk_rows(size_t row_bytes, int32_t n_out)
{
    size_t rows = (row_bytes > 0u) ? COLIBRI_MATMUL_CHUNK / row_bytes : (size_t)n_out;
    rows = (rows < 16u) ? 16u : rows & ~(size_t)15u;
    return (rows >= (size_t)n_out) ? n_out : (int32_t)rows;
}

void colibri_matmul_q8_q8(const int8_t *q, const float *scale, const int8_t *xq, const float *sx,
                          float *y, int32_t ldy, int32_t n_out, int32_t n_in, int32_t n_tok)
{
#if defined(COLIBRI_X86_DISPATCH)
    const colibri_x86_kernels_t *kx = colibri_x86_kernels();
#endif
    const size_t nb = COLIBRI_Q8_BLOCKS(n_in);
    const int32_t step = matmul_chunk_rows((size_t)n_in, n_out);
    for (int32_t o0 = 0; o0 < n_out; o0 += step) {
        const int32_t m = (n_out - o0 < step) ? n_out - o0 : step;
#if defined(COLIBRI_X86_DISPATCH)
        if (kx->matmul_q8_q8 != NULL && n_tok > 1) { /* register-blocked over tokens */
            kx->matmul_q8_q8(q + (size_t)o0 * (size_t)n_in, scale + o0, xq, sx, y + o0, ldy, m,
                             n_in, n_tok);
            continue;
        }
#endif
        for (int32_t t = 0; t < n_tok; t++) {
            colibri_matvec_q8_q8(q + (size_t)o0 * (size_t)n_in, scale + o0,
                                 xq + (size_t)t * (size_t)n_in, sx + (size_t)t * nb,
                                 y + (size_t)t * (size_t)ldy + (size_t)o0, m, n_in);
        }
    }
}

void colibri_matmul_q8b_q8(const int8_t *q, const float *scale, const int8_t *xq, const float *sx,
                           float *y, int32_t ldy, int32_t n_out, int32_t n_in, int32_t n_tok)
{
#if defined(COLIBRI_X86_DISPATCH)
    const colibri_x86_kernels_t *kx = colibri_x86_kernels();
#endif
    const size_t nb = COLIBRI_Q8_BLOCKS(n_in);
    const int32_t step = matmul_chunk_rows((size_t)n_in + 4u * nb, n_out);
    for (int32_t o0 = 0; o0 < n_out; o0 += step) {
        const int32_t m = (n_out - o0 < step) ? n_out - o0 : step;
#if defined(COLIBRI_X86_DISPATCH)
        if (kx->matmul_q8b_q8 != NULL && n_tok > 1) { /* register-blocked over tokens */
            kx->matmul_q8b_q8(q + (size_t)o0 * (size_t)n_in, scale + (size_t)o0 * nb, xq, sx,
                              y + o0, ldy, m, n_in, n_tok);
            continue;
        }
#endif
        for (int32_t t = 0; t < n_tok; t++) {
            colibri_matvec_q8b_q8(q + (size_t)o0 * (size_t)n_in, scale + (size_t)o0 * nb,
                                  xq + (size_t)t * (size_t)n_in, sx + (size_t)t * nb,
                                  y + (size_t)t * (size_t)ldy + (size_t)o0, m, n_in);
        }
    }
}

void colibri_matmul_q4_q8(const colibri_block_q4_32 *w, const int8_t *xq, const float *sx, float *y,
                          int32_t ldy, int32_t n_out, int32_t n_in, int32_t n_tok)
{
#if defined(COLIBRI_X86_DISPATCH)
    const colibri_x86_kernels_t *kx = colibri_x86_kernels();
#endif
    const size_t nb = COLIBRI_Q4_BLOCKS(n_in);
    const int32_t step = matmul_chunk_rows(nb * sizeof(colibri_block_q4_32), n_out);
    for (int32_t o0 = 0; o0 < n_out; o0 += step) {
        const int32_t m = (n_out - o0 < step) ? n_out - o0 : step;
#if defined(COLIBRI_X86_DISPATCH)
        if (kx->matmul_q4_q8 != NULL && n_tok > 1) { /* register-blocked over tokens */
            kx->matmul_q4_q8(w + (size_t)o0 * nb, xq, sx, y + o0, ldy, m, n_in, n_tok);
            continue;
        }
#endif
        for (int32_t t = 0; t < n_tok; t++) {
            colibri_matvec_q4_q8(w + (size_t)o0 * nb, xq + (size_t)t * (size_t)n_in,
                                 sx + (size_t)t * nb, y + (size_t)t * (size_t)ldy + (size_t)o0, m,
                                 n_in);
        }
    }
}

void colibri_matmul_f16_f32(const uint16_t *w, const float *x, float *y, int32_t ldy, int32_t n_out,
                            int32_t n_in, int32_t n_tok)
{
    const int32_t step = matmul_chunk_rows(2u * (size_t)n_in, n_out);
    for (int32_t o0 = 0; o0 < n_out; o0 += step) {
        const int32_t m = (n_out - o0 < step) ? n_out - o0 : step;
        for (int32_t t = 0; t < n_tok; t++) {
            colibri_matvec_f16_f32(w + (size_t)o0 * (size_t)n_in, x + (size_t)t * (size_t)n_in,
                                   y + (size_t)t * (size_t)ldy + (size_t)o0, m, n_in);
        }
    }
}

void colibri_matmul_q8_f32(const int8_t *q, const float *scale, const float *x, float *y,
                           int32_t ldy, int32_t n_out, int32_t n_in, int32_t n_tok)
{
    const int32_t step = matmul_chunk_rows((size_t)n_in, n_out);
    for (int32_t o0 = 0; o0 < n_out; o0 += step) {
        const int32_t m = (n_out - o0 < step) ? n_out - o0 : step;
        for (int32_t t = 0; t < n_tok; t++) {
            colibri_matvec_q8_f32(q + (size_t)o0 * (size_t)n_in, scale + o0,
                                  x + (size_t)t * (size_t)n_in,
                                  y + (size_t)t * (size_t)ldy + (size_t)o0, m, n_in);
        }
    }
}

void colibri_matmul_q4_f32(const colibri_block_q4_32 *w, const float *x, float *y, int32_t ldy,
                           int32_t n_out, int32_t n_in, int32_t n_tok)
{
    const size_t nb = COLIBRI_Q4_BLOCKS(n_in);
    const int32_t step = matmul_chunk_rows(nb * sizeof(colibri_block_q4_32), n_out);
    for (int32_t o0 = 0; o0 < n_out; o0 += step) {
        const int32_t m = (n_out - o0 < step) ? n_out - o0 : step;
        for (int32_t t = 0; t < n_tok; t++) {
            colibri_matvec_q4_f32(w + (size_t)o0 * nb, x + (size_t)t * (size_t)n_in,
                                  y + (size_t)t * (size_t)ldy + (size_t)o0, m, n_in);
        }
    }
}

void colibri_matmul_q8b_f32(const int8_t *q, const float *scale, const float *x, float *y,
                            int32_t ldy, int32_t n_out, int32_t n_in, int32_t n_tok)
{
    const size_t nb = COLIBRI_Q8_BLOCKS(n_in);
    const int32_t step = matmul_chunk_rows((size_t)n_in + 4u * nb, n_out);
    for (int32_t o0 = 0; o0 < n_out; o0 += step) {
        const int32_t m = (n_out - o0 < step) ? n_out - o0 : step;
        for (int32_t t = 0; t < n_tok; t++) {
            colibri_matvec_q8b_f32(q + (size_t)o0 * (size_t)n_in, scale + (size_t)o0 * nb,
                                   x + (size_t)t * (size_t)n_in,
                                   y + (size_t)t * (size_t)ldy + (size_t)o0, m, n_in);
        }
    }
}

void colibri_matmul_f32(const float *w, const float *b, const float *x, float *y, int32_t ldy,
                        int32_t n_out, int32_t n_in, int32_t n_tok)
{
    const int32_t step = matmul_chunk_rows(4u * (size_t)n_in, n_out);
    for (int32_t o0 = 0; o0 < n_out; o0 += step) {
        const int32_t m = (n_out - o0 < step) ? n_out - o0 : step;
        for (int32_t t = 0; t < n_tok; t++) {
            float *yt = y + (size_t)t * (size_t)ldy + (size_t)o0;
            colibri_matvec_f32(w + (size_t)o0 * (size_t)n_in, x + (size_t)t * (size_t)n_in, yt, m,
                               n_in);
            if (b != NULL) {
                for (int32_t o = 0; o < m; o++) {
                    yt[o] = yt[o] + b[o0 + o];
                }
            }
        }
    }
}

#if !defined(COLIBRI_X86_DISPATCH)
/* One kernel path, chosen by the compiler (runtime_c/arch/x86_64: the x86-64 run-time choice). */
int32_t colibri_kernel_level(void)
{
    return COLIBRI_KERNEL_BASE;
}

int32_t colibri_kernel_set_level(int32_t level)
{
    (void)level;
    return COLIBRI_KERNEL_BASE;
}

const char *colibri_kernel_level_name(int32_t level)
{
    (void)level;
    return "base";
}
#endif
