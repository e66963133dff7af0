/**
 * @file colibri_qi_shared.h
 * @brief Generated-code support (runtime_c/tiles): one out-of-line copy of the activation
 *        quantiser that generated expert kernels call (issue 40: code per expert kind).
 *
 * colibri_qi_quantize_row(_pad) is always inlined: a generated kernel quantising its input row
 * (d_model values) and its hidden row (d_ff values) got two copies of it, up to 1.5 KB each on
 * the Cortex-M4 (its blocks of 32 written out in assembly), specialised to two lengths that
 * only change its loop count and whether a last partial block follows. The function here is the
 * same quantiser behind a real call, never inlined nor cloned per call site (noclone: GCC would
 * otherwise make a constant-propagated copy per length), so a translation unit (one generated
 * model) holds one copy of it, whatever the number of rows and expert kinds quantised (but on
 * Helium, below). Its results are colibri_qi_quantize_row_pad's, bit for bit (the same function,
 * the same arguments). The matrix kernels stay inline: their loops specialised to the shape are
 * worth up to 10 % of an expert's instructions at small shapes (measured on the Cortex-M4 with one
 * out-of-line copy of the R4P kernels for every matrix: 693x23 relu, one block per row of w2).
 */
#ifndef COLIBRI_QI_SHARED_H
#define COLIBRI_QI_SHARED_H

#include "colibri_qi_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/** colibri_qi_quantize_row_pad out of line (width == n: colibri_qi_quantize_row); inline on
 *  Helium, whose four-lane quantiser is short (about 600 bytes out of line) and where the call
 *  and the run-time length cost up to 2.3 % of an expert's instructions at d_ff 25 (seed 49's
 *  133x25 gelu_tanh, int8 and int4). */
#if defined(COLIBRI_QI_MVE)
#define COLIBRI_QS_QUANTISER COLIBRI_QI_INLINE
#else
#define COLIBRI_QS_QUANTISER COLIBRI_QI_SHARED
#endif
COLIBRI_QS_QUANTISER void colibri_qs_quantize_row_pad(const float *x, int8_t *xq, float *sx,
                                                      int32_t n, int32_t width)
{
    colibri_qi_quantize_row_pad(x, xq, sx, n, width);
}

#ifdef __cplusplus
}
#endif

#endif /* COLIBRI_QI_SHARED_H */
