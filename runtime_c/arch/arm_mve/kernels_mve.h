/**
 * @file kernels_mve.h
 * @brief Helium / MVE (Cortex-M55) path of kernels_q.c, selected by kernels_isa.h: the int8 dot
 *        product, VMLADAVA, 16 MACs an instruction. Private to kernels_q.c.
 */
#ifndef COLIBRI_KERNELS_MVE_H
#define COLIBRI_KERNELS_MVE_H

#include <arm_mve.h>
#include <stdint.h>

#define COLIBRI_DOT_MVE 1

/** @brief acc of a[0..i) . b[0..i) for the whole 16-byte vectors of n (*pi = i). */
static inline __attribute__((always_inline)) int32_t
colibri_mve_dot_q8(const int8_t *a, const int8_t *b, int32_t n, int32_t *pi)
{
    int32_t acc = 0;
    int32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc = vmladavaq_s8(acc, vld1q_s8(a + i), vld1q_s8(b + i));
    }
    *pi = i;
    return acc;
}
#define COLIBRI_ISA_DOT_Q8 colibri_mve_dot_q8

#endif /* COLIBRI_KERNELS_MVE_H */
