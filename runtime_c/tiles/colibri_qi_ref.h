/**
 * @file colibri_qi_ref.h
 * @brief The portable twins (suffix _ref) of the shape-specialised kernels of this directory
 *        (colibri_qi_common.h, colibri_qi_r4.h, colibri_qi_r4p.h, colibri_qinline_q4.h,
 *        colibri_qinline_f.h): every function generated expert kernels call, as plain C loops
 *        that read the stored layouts as colibri/quant/formats.py defines them (r4_order,
 *        r4p_order, q4r4_order, q4h4_order, c8_order) and do the float operations of the numpy
 *        mirror (colibri/reference/kernels.py) in its order; no ISA conditionals, no call into the
 *        library or the tiles. Each returns the bits its tile must return on every board.
 *
 * The integer tiles are exact against the library's order: per output row, blocks in order,
 * acc = acc + (float)(exact block sum) * (block factor), the same for every board. The float
 * tiles of colibri_qinline_f.h sum in their own order, which depends on the core: the twins take
 * it as an argument (enum colibri_qf_ref_order), and the multiply-adds that the tiles fuse are
 * computed here as exactly rounded a * b + c in double precision (no fmaf from a libm, no
 * hardware FMA).
 *
 * Test-only: defined in colibri_qi_ref.c, which only the self-test tests/platform/refkernels.c
 * builds (scons selftest=refkernels); generated code and libcolibri.a never include them.
 */
#ifndef COLIBRI_QI_REF_H
#define COLIBRI_QI_REF_H

#include <stddef.h>
#include <stdint.h>

#include "colibri_quant.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The summation order of a float tile (colibri_qinline_f.h) on a given core. */
typedef enum {
    /** acc = acc + w * x, inputs in order, the product rounded first (the library's order). */
    COLIBRI_QF_REF_PLAIN = 0,
    /** acc = fma(w, x, acc), inputs in order (VFMA on the Cortex-M4 / M7 and Helium, MADD.S on
     *  Xtensa FPUs). */
    COLIBRI_QF_REF_FUSED = 1,
    /** Four fused partial sums, input i into lane i % 4 for i < 4 * (n_in / 4), then (l0 + l1) +
     *  (l2 + l3), then acc = acc + w * x for the last n_in % 4 inputs (Helium's fp16 matvec). */
    COLIBRI_QF_REF_LANES4 = 2
} colibri_qf_ref_order;

/** a * b + c rounded once (round to nearest even), for finite results. */
float colibri_ref_fmaf(float a, float b, float c);

/** The fp32 value of fp16 bits h (every pattern). */
float colibri_ref_f16(uint16_t h);

/** colibri_qi_quantize_row: per block of COLIBRI_QK8 values (the last may be shorter), amax =
 *  max |x| (a NaN anywhere, or amax below 2^-120: codes 0, scale 0), else sx = amax / 127, v =
 *  x * (127 / amax), code = round half away from zero of min(|v|, 127) with v's sign. */
void colibri_qi_quantize_row_ref(const float *x, int8_t *xq, float *sx, int32_t n);

/** colibri_qi_q8_q8_r4 (blocked 0: per-row scales, colibri_matvec_q8_q8; 1: block scales
 *  [n_out][nb], colibri_matvec_q8b_q8) on a matrix stored in layout R4, n_in % 16 == 0. */
void colibri_qi_q8_q8_r4_ref(const int8_t *q, const float *scale, const int8_t *xq, const float *sx,
                             float *y, int32_t n_out, int32_t n_in, int blocked);

/** colibri_qi_mm_q8_q8_r4: row t of n_tok (codes xq + t * n_in, scales sx + t * nb) to
 *  y + t * ldy. */
void colibri_qi_mm_q8_q8_r4_ref(const int8_t *q, const float *scale, const int8_t *xq,
                                const float *sx, float *y, int32_t ldy, int32_t n_out, int32_t n_in,
                                int32_t n_tok, int blocked);

/** colibri_qi_q8_q8_r4p: colibri_qi_q8_q8_r4_ref on a matrix stored in layout R4P
 *  (n_in % 32 == 0, codes in [-127, 127]). */
void colibri_qi_q8_q8_r4p_ref(const int8_t *q, const float *scale, const int8_t *xq,
                              const float *sx, float *y, int32_t n_out, int32_t n_in, int blocked);

/** colibri_qi_mm_q8_q8_r4p: colibri_qi_mm_q8_q8_r4_ref on layout R4P. */
void colibri_qi_mm_q8_q8_r4p_ref(const int8_t *q, const float *scale, const int8_t *xq,
                                 const float *sx, float *y, int32_t ldy, int32_t n_out,
                                 int32_t n_in, int32_t n_tok, int blocked);

/** colibri_qi_mm_q8_q8_r4p_act: the R4P matmul with per-row scales, then on each output row
 *  colibri_qi_bias_relu_ref(row, 0, n_out, bias, relu). */
void colibri_qi_mm_q8_q8_r4p_act_ref(const int8_t *q, const float *scale, const int8_t *xq,
                                     const float *sx, float *y, int32_t ldy, int32_t n_out,
                                     int32_t n_in, int32_t n_tok, const float *bias, int relu);

/** colibri_qi_bias_relu: for o0 <= o < n, y[o] = y[o] + bias[o] (bias not NULL), then
 *  y[o] = y[o] > 0 ? y[o] : +0 (relu != 0). */
void colibri_qi_bias_relu_ref(float *y, int32_t o0, int32_t n, const float *bias, int relu);

/** colibri_qi_relu_row: h[j] = h[j] > 0 ? h[j] : +0 (a NaN gives +0). */
void colibri_qi_relu_row_ref(float *h, int32_t n);

/** colibri_qi_q4_q8: colibri_matvec_q4_q8 on row-major blocks [n_out][COLIBRI_Q4_BLOCKS(n_in)]:
 *  acc = acc + (float)(block sum of (nibble - 8) * code) * (d * sx[b]), blocks in order. */
void colibri_qi_q4_q8_ref(const colibri_block_q4_32 *w, const int8_t *xq, const float *sx, float *y,
                          int32_t n_out, int32_t n_in);

/** colibri_qi_mm_q4_q8: colibri_qi_q4_q8_ref per token (rows of y at stride ldy). */
void colibri_qi_mm_q4_q8_ref(const colibri_block_q4_32 *w, const int8_t *xq, const float *sx,
                             float *y, int32_t ldy, int32_t n_out, int32_t n_in, int32_t n_tok);

/** colibri_qi_q4_q8_q4r4: colibri_qi_q4_q8_ref on the bytes of layout Q4R4 (n_in % 32 == 0). */
void colibri_qi_q4_q8_q4r4_ref(const uint8_t *w, const int8_t *xq, const float *sx, float *y,
                               int32_t n_out, int32_t n_in);

/** colibri_qi_mm_q4_q8_q4r4: colibri_qi_q4_q8_q4r4_ref per token. */
void colibri_qi_mm_q4_q8_q4r4_ref(const uint8_t *w, const int8_t *xq, const float *sx, float *y,
                                  int32_t ldy, int32_t n_out, int32_t n_in, int32_t n_tok);

/** colibri_qi_q4_q8_q4h4: colibri_qi_q4_q8_ref on the bytes of layout Q4H4 (n_in % 32 == 0). */
void colibri_qi_q4_q8_q4h4_ref(const uint8_t *w, const int8_t *xq, const float *sx, float *y,
                               int32_t n_out, int32_t n_in);

/** colibri_qi_mm_q4_q8_q4h4: colibri_qi_q4_q8_q4h4_ref per token. */
void colibri_qi_mm_q4_q8_q4h4_ref(const uint8_t *w, const int8_t *xq, const float *sx, float *y,
                                  int32_t ldy, int32_t n_out, int32_t n_in, int32_t n_tok);

/** colibri_qf_f32_c8: y[o] = b[o] (or 0), then plus w(o, i) * x[i] for i in order, on fp32
 *  weights in layout c8 (any n_out, n_in > 0: the last block n_out % 8 wide); order PLAIN or
 *  FUSED. */
void colibri_qf_f32_c8_ref(const float *w, const float *b, const float *x, float *y, int32_t n_out,
                           int32_t n_in, colibri_qf_ref_order order);

/** colibri_qf_f16_c8: colibri_qf_f32_c8_ref on fp16 weights in layout c8. */
void colibri_qf_f16_c8_ref(const uint16_t *w, const float *b, const float *x, float *y,
                           int32_t n_out, int32_t n_in, colibri_qf_ref_order order);

/** colibri_qf_f16_f32: y[o] = sum_i w[o][i] * x[i] (fp16 weights [n_out][n_in]) in the given
 *  order, from 0. */
void colibri_qf_f16_f32_ref(const uint16_t *w, const float *x, float *y, int32_t n_out,
                            int32_t n_in, colibri_qf_ref_order order);

#ifdef __cplusplus
}
#endif

#endif /* COLIBRI_QI_REF_H */
