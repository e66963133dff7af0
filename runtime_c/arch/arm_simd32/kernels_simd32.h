/**
 * @file kernels_simd32.h
 * @brief The 32-bit SIMD / DSP extension path of kernels_q.c (Cortex-M4 / M7; int4 blocks on the
 *        M55), selected by kernels_isa.h: SXTB16 + SMLAD, two MACs an instruction. Private to
 *        kernels_q.c.
 */
#ifndef COLIBRI_KERNELS_SIMD32_H
#define COLIBRI_KERNELS_SIMD32_H

#include "colibri_quant.h"

#include <arm_acle.h>
#include <stdint.h>
#include <string.h>

#define COLIBRI_HAVE_SIMD32 1

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

/** @brief acc of a[0..i) . b[0..i) for the whole 4-byte words of n (*pi = i). */
static inline __attribute__((always_inline)) int32_t
colibri_simd32_dot_q8(const int8_t *a, const int8_t *b, int32_t n, int32_t *pi)
{
    int32_t acc = 0;
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        acc = colibri_dot4_simd32(colibri_load4(a + i), colibri_load4(b + i), acc);
        acc = colibri_dot4_simd32(colibri_load4(a + i + 4), colibri_load4(b + i + 4), acc);
    }
    for (; i + 4 <= n; i += 4) {
        acc = colibri_dot4_simd32(colibri_load4(a + i), colibri_load4(b + i), acc);
    }
    *pi = i;
    return acc;
}

/** @brief One full block of COLIBRI_QK8 int8 products, unrolled whole (16 SXTB16 pairs, 16
 *         SMLADs, no loop counter), which pays for the block's scale multiply. */
static inline __attribute__((always_inline)) int32_t colibri_simd32_dot_q8_block(const int8_t *a,
                                                                                 const int8_t *b)
{
    int32_t acc = 0;
#pragma GCC unroll 8
    for (int32_t j = 0; j < COLIBRI_QK8; j += 4) {
        acc = colibri_dot4_simd32(colibri_load4(a + j), colibri_load4(b + j), acc);
    }
    return acc;
}

/** @brief The int8 dot product of a full int4 block (32 values) with xq. */
static inline int32_t colibri_simd32_q4_block(const colibri_block_q4_32 *blk, const int8_t *xq)
{
    int32_t acc = 0;
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
}

#define COLIBRI_ISA_DOT_Q4_BLOCK colibri_simd32_q4_block
#if !defined(COLIBRI_ISA_DOT_Q8) /* the M55 takes Helium's (kernels_mve.h) */
#define COLIBRI_ISA_DOT_Q8 colibri_simd32_dot_q8
#define COLIBRI_ISA_DOT_Q8_BLOCK colibri_simd32_dot_q8_block
#endif

#endif /* COLIBRI_KERNELS_SIMD32_H */
