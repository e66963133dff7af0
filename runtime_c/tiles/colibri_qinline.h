/**
 * @file colibri_qinline.h
 * @brief Shape-specialised kernels for generated code (issue 11): static and always inlined, so
 *        a generated expert kernel that calls them with its dimensions as constants gets a body
 *        specialised to its shape (loop bounds and tails resolved at compile time, no call per
 *        row or per block).
 *
 * Each returns exactly what its colibri_quant.h namesake returns, bit for bit: integer block
 * sums do not depend on their order, and the float operations are the documented ones in the
 * documented order. What changes is how the work is shared:
 *  - colibri_qi_quantize_row: branch-free rounding in fixed point, four lanes on Helium;
 *  - colibri_qi_q8_q8_r4: int8 x int8 on a matrix stored in layout R4 (below), four output rows
 *    per pass, so each activation word is loaded and unpacked once for four rows and each row's
 *    weights stream from one pointer: on the Cortex-M4 / M7 one LDRD, four SXTB16 and four SMLAD
 *    per row and 8 inputs; on Helium one 16-byte load and one VMLADAVA per row and 16 inputs,
 *    and the per-block float updates of the four rows in one vector (when the activations' block
 *    scales keep Helium's vector float exact: colibri_qi_mve_scales_ok).
 * On other cores they call the library (whose Neon / SSE paths are there); the emitter
 * (colibri/emit/experts.py R4_ISAS) stores R4 only for the cores that have a fast path.
 *
 * This header lives in runtime_c/tiles, the generated-code support directory (not the public
 * API of runtime_c/include): the builds add it to the include path of generated code. It is an
 * umbrella over one header per family: colibri_qi_common.h (ISA, quantiser), colibri_qi_r4.h
 * (layout R4), colibri_qi_r4p.h (layout R4P, relu row), colibri_qinline_q4.h (int4 x int8) and
 * colibri_qi_shared.h (the out-of-line activation quantiser generated expert kernels call: one
 * copy per model, shared by every row and expert kind).
 */
#ifndef COLIBRI_QINLINE_H
#define COLIBRI_QINLINE_H

#include "colibri_qi_common.h"
#include "colibri_qi_r4.h"
#include "colibri_qi_r4p.h"
#include "colibri_qi_shared.h"
#include "colibri_qinline_q4.h" /* colibri_qi_q4_q8: int4 x int8 */

#endif /* COLIBRI_QINLINE_H */
