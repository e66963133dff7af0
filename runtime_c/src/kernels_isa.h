/**
 * @file kernels_isa.h
 * @brief Internal: the one compile-time choice of kernels_q.c's per-ISA paths (as CMSIS-NN, by
 *        the compiler's feature macros), each in runtime_c/arch/<isa>/. A path header defines
 *        COLIBRI_DOT_<ISA> and the hooks it has; kernels_q.c runs a hook where it is defined and
 *        its portable code elsewhere:
 *          - COLIBRI_ISA_DOT_Q8(a, b, n, &i): the int8 dot product of the ISA's whole vectors
 *            (kernels_q.c adds the products from i on);
 *          - COLIBRI_ISA_DOT_Q8_BLOCK(a, b): one full block of COLIBRI_QK8;
 *          - COLIBRI_ISA_DOT_Q4_BLOCK(blk, xq): a full int4 block against int8 codes;
 *          - COLIBRI_ISA_MATVEC_Q4_Q8(w, xq, sx, y, n_out, n_in): the whole int4 x int8 matvec
 *            (Xtensa MAC16: the activations expanded once for all rows);
 *          - COLIBRI_ISA_F16_TO_F32(h) and COLIBRI_ISA_MATVEC_F16_F32(w, x, y, n_out, n_in): the
 *            fp16 conversion and the fp16 matvec (Xtensa);
 *          - COLIBRI_ISA_QUANTIZE_BLOCK_Q8(x, xq, sx): a full block of the activation quantiser,
 *            0 when the block needs the scalar code;
 *          - Neon also: COLIBRI_F16_NEON and the fp16 / int4 x fp32 kernels of kernels_neon.h.
 *        Every hook returns exactly what the portable code returns (kernels_q_ref.c;
 *        tests/platform/refkernels.c checks it on every board).
 */
#ifndef COLIBRI_KERNELS_ISA_H
#define COLIBRI_KERNELS_ISA_H

#if defined(__ARM_FEATURE_MVE) && (__ARM_FEATURE_MVE & 1)
#include "../arch/arm_mve/kernels_mve.h" /* Cortex-M55 */
#elif defined(__ARM_NEON)
#include "../arch/arm_neon/kernels_neon.h" /* Cortex-A (includes arm_neon.h) */
#elif defined(__SSE2__)
#include "../arch/x86_64/kernels_sse2.h" /* x86-64 base level */
#endif
#if defined(COLIBRI_XTENSA_MAC16) && defined(__XTENSA__)
#include "../arch/xtensa/kernels_mac16.h"    /* ESP32-S3: int8 */
#include "../arch/xtensa/kernels_mac16_q4.h" /* int4 */
#endif
#if defined(__XTENSA__) && (defined(COLIBRI_XTENSA_MAC16) || !defined(__XTENSA_SOFT_FLOAT__))
#include "../arch/xtensa/kernels_xtensa_f16.h" /* fp16 (MAC16 or FPU cores: not the LX106) */
#endif
#if defined(__ARM_FEATURE_SIMD32) && !defined(COLIBRI_DOT_NEON)
/* Cortex-M4 / M7 (and int4 blocks on M55); on Neon cores GCC vectorises the portable loops. */
#include "../arch/arm_simd32/kernels_simd32.h"
#endif

#endif /* COLIBRI_KERNELS_ISA_H */
