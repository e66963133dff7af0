/**
 * @file kernels_q.c
 * @brief Kernels of the quantised formats (colibri_quant.h): fp16 / int8 / int4 / q4k / q5k weights
 * against fp32 or per-token int8 activations. The order of every float operation is the one
 *        documented in colibri_quant.h; colibri/reference/kernels.py mirrors it.
 *
 * The integer dot products have per-ISA paths chosen by the compiler's ACLE feature macros
 * (as CMSIS-NN does): Helium / MVE (Cortex-M55: VMLADAVA, 16 MACs), Neon (Cortex-A: VMULL +
 * VPADAL, 16 MACs; SDOT where the core has the dot-product extension, __ARM_FEATURE_DOTPROD),
 * SSE2 on x86-64 hosts (PMADDWD, 16 MACs), the 32-bit SIMD / DSP extension (Cortex-M4 / M7, and
 * int4 blocks on the M55: SXTB16 + SMLAD, 2 MACs), the Xtensa MAC16 option where the board says
 * the core has it (COLIBRI_XTENSA_MAC16: ESP32-S3; 40-bit accumulator, 16 x 16-bit MULA: int8
 * dot products, and int4 blocks against activations expanded once per matvec), else portable C
 * (on Xtensa cores with an FPU with a faster exact fp16 conversion); each path is a header of
 * runtime_c/arch/<isa>/ (arm_mve, arm_neon, arm_simd32, xtensa, x86_64), chosen once by
 * kernels_isa.h, and runs through the hooks it defines. Integer sums do not depend on their order,
 * so every path returns exactly what the portable loop returns (tests/platform/kernels.c and
 * refkernels.c check it on every board). On Neon cores kernels_neon.h adds the int4 blocks, the
 * hardware fp16 conversion, and the fp16 and int4 x fp32 matvecs (four rows per register on
 * aarch64), each bit-identical to the portable C (the same float operations in the same order per
 * row); a signalling-NaN fp16 converts to a quiet NaN there (the portable code keeps its bits).
 */
#include "colibri_math.h"
#include "colibri_quant.h"
#include "kernels_isa.h"
#include "kernels_scalar.h"
#include "kernels_x86.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

float colibri_f16_to_f32(uint16_t h)
{
#if defined(COLIBRI_F16_NEON)
    return colibri_neon_f16_to_f32(h);
#elif defined(COLIBRI_ISA_F16_TO_F32)
    return COLIBRI_ISA_F16_TO_F32(h);
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
#elif defined(COLIBRI_ISA_MATVEC_F16_F32)
    COLIBRI_ISA_MATVEC_F16_F32(w, x, y, n_out, n_in);
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

void colibri_quantize_row_q8(const float *x, int8_t *xq, float *sx, int32_t n)
{
    COLIBRI_X86_KERNEL(quantize_row_q8, (x, xq, sx, n));
    for (int32_t i0 = 0, b = 0; i0 < n; i0 += COLIBRI_QK8, b++) {
        const int32_t m = (n - i0 < COLIBRI_QK8) ? n - i0 : COLIBRI_QK8;
#if defined(COLIBRI_ISA_QUANTIZE_BLOCK_Q8) /* 0: the block needs the scalar code */
        if (m == COLIBRI_QK8 && COLIBRI_ISA_QUANTIZE_BLOCK_Q8(x + i0, xq + i0, sx + b)) {
            continue;
        }
#endif
        sx[b] = colibri_quantize_block_q8_scalar(x + i0, xq + i0, m);
    }
}

/* The integer dot product, inlined where n is a constant (full blocks of COLIBRI_QK8), so the
 * compiler drops the loops that cannot run. */
static inline __attribute__((always_inline)) int32_t dot_q8(const int8_t *a, const int8_t *b,
                                                            int32_t n)
{
    int32_t acc = 0;
    int32_t i = 0;
#if defined(COLIBRI_ISA_DOT_Q8)
    acc = COLIBRI_ISA_DOT_Q8(a, b, n, &i); /* the ISA's whole vectors; i: where they end */
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

/* One full block of COLIBRI_QK8 int8 products (the 32-bit SIMD cores: unrolled whole). */
static inline __attribute__((always_inline)) int32_t dot_q8_block(const int8_t *a, const int8_t *b)
{
#if defined(COLIBRI_ISA_DOT_Q8_BLOCK)
    return COLIBRI_ISA_DOT_Q8_BLOCK(a, b);
#else
    return dot_q8(a, b, COLIBRI_QK8);
#endif
}

int32_t colibri_dot_q4_q8(const colibri_block_q4_32 *blk, const int8_t *xq, int32_t n)
{
    int32_t acc = 0;
    if (n == COLIBRI_QK4) { /* integer sums: any order gives the same result */
#if defined(COLIBRI_ISA_DOT_Q4_BLOCK)
        return COLIBRI_ISA_DOT_Q4_BLOCK(blk, xq);
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
#if defined(COLIBRI_ISA_MATVEC_Q4_Q8)
    COLIBRI_ISA_MATVEC_Q4_Q8(w, xq, sx, y, n_out, n_in);
    return;
#endif
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

/* sc_j and m_j, 6 bits each, of sub-block j of a q4k super-block's scale bytes. */
static inline void q4k_scale_min(const uint8_t *s, int32_t j, int32_t *sc, int32_t *m)
{
    const uint32_t hi = (uint32_t)s[8 + (j >> 1)] >> (4u * (uint32_t)(j & 1));
    *sc = (int32_t)(((uint32_t)s[j] & 0x0Fu) | ((hi & 3u) << 4));
    *m = (int32_t)(((uint32_t)s[j] >> 4) | (((hi >> 2) & 3u) << 4));
}

/* The codes of the sub-block in slot j of a q4k / q5k super-block at base: their low nibbles
 * (code k < 16 in qs[k]'s low half, k >= 16 in qs[k - 16]'s high half) and, q5k, their fifth
 * bits (bit k of the returned word; 0 for q4k). sub_bytes: 16 (q4k) or 20 (q5k). */
static inline uint32_t kq_codes(const uint8_t *base, int32_t j, int32_t sub_bytes,
                                const uint8_t **qs)
{
    *qs = base + 16 + (size_t)sub_bytes * (size_t)j;
    const uint8_t *h = *qs + 16;
    return (sub_bytes == 20) ? ((uint32_t)h[0] | ((uint32_t)h[1] << 8) | ((uint32_t)h[2] << 16) |
                                ((uint32_t)h[3] << 24))
                             : 0u;
}

/* The q4k / q5k matvec (colibri_quant.h): w the matrix's stream of super-blocks of sb bytes from
 * a row that starts one, sub_bytes (16 or 20) per sub-block of codes. The rows' sub-blocks follow
 * each other in the stream (slot j of the super-block at base, the next after slot 7 at base +
 * sb), whatever the row width. Heads are read by bytes (little-endian, as every supported core),
 * so nothing needs alignment; only the used sub-blocks of a cut last super-block are read. q4k
 * has no fifth bits (hb = 0), so one loop serves both. */
static inline void kq_matvec(const void *w, const int8_t *xq, const float *sx, float *y,
                             int32_t n_out, int32_t n_in, size_t sb, int32_t sub_bytes)
{
    const int32_t nb = (int32_t)COLIBRI_Q8_BLOCKS(n_in);
    const uint8_t *base = (const uint8_t *)w;
    int32_t j = 0;
    for (int32_t o = 0; o < n_out; o++) {
        float acc = 0.0f;
        for (int32_t b = 0; b < nb; b++) {
            const uint8_t *qs;
            const uint32_t hb = kq_codes(base, j, sub_bytes, &qs);
            const int32_t i0 = b * COLIBRI_QK8;
            const int32_t n = (n_in - i0 < COLIBRI_QK8) ? n_in - i0 : COLIBRI_QK8;
            const int8_t *xb = xq + i0;
            int32_t isum = 0;
            int32_t xsum = 0;
            if (n == COLIBRI_QK8) { /* integer sums: any order gives the same result */
                for (int32_t k = 0; k < 16; k++) {
                    const uint32_t lo = (qs[k] & 0x0Fu) | (((hb >> k) & 1u) << 4);
                    const uint32_t hi = (uint32_t)(qs[k] >> 4) | (((hb >> (k + 16)) & 1u) << 4);
                    isum += (int32_t)lo * (int32_t)xb[k] + (int32_t)hi * (int32_t)xb[k + 16];
                    xsum += (int32_t)xb[k] + (int32_t)xb[k + 16];
                }
            } else {
                for (int32_t k = 0; k < n; k++) {
                    const uint32_t q4 = k < 16 ? (qs[k] & 0x0Fu) : (uint32_t)(qs[k - 16] >> 4);
                    const uint32_t q = q4 | (((hb >> k) & 1u) << 4);
                    isum += (int32_t)q * (int32_t)xb[k];
                    xsum += (int32_t)xb[k];
                }
            }
            int32_t sc;
            int32_t m;
            q4k_scale_min(base + 4, j, &sc, &m);
            const float d = colibri_f16_to_f32((uint16_t)(base[0] | (base[1] << 8)));
            const float dmin = colibri_f16_to_f32((uint16_t)(base[2] | (base[3] << 8)));
            acc += (float)(sc * isum) * (d * sx[b]);
            acc -= (float)(m * xsum) * (dmin * sx[b]);
            if (++j == 8) { /* the stream's next super-block */
                j = 0;
                base += sb;
            }
        }
        y[o] = acc;
    }
}

void colibri_dequantize_row_kq(const void *w, int32_t row, int32_t n_in, int32_t bits, float *x)
{
    const int32_t sub_bytes = (bits == 5) ? 20 : 16;
    const size_t sb = (bits == 5) ? sizeof(colibri_block_q5k) : sizeof(colibri_block_q4k);
    const int32_t nb = (int32_t)COLIBRI_Q8_BLOCKS(n_in);
    const size_t k0 = (size_t)row * (size_t)nb; /* the row's first sub-block in the stream */
    const uint8_t *base = (const uint8_t *)w + k0 / 8u * sb;
    int32_t j = (int32_t)(k0 % 8u);
    for (int32_t b = 0; b < nb; b++) {
        const uint8_t *qs;
        const uint32_t hb = kq_codes(base, j, sub_bytes, &qs);
        const int32_t i0 = b * COLIBRI_QK8;
        const int32_t n = (n_in - i0 < COLIBRI_QK8) ? n_in - i0 : COLIBRI_QK8;
        int32_t sc;
        int32_t m;
        q4k_scale_min(base + 4, j, &sc, &m);
        const float step = colibri_f16_to_f32((uint16_t)(base[0] | (base[1] << 8))) * (float)sc;
        const float low = colibri_f16_to_f32((uint16_t)(base[2] | (base[3] << 8))) * (float)m;
        for (int32_t k = 0; k < n; k++) {
            const uint32_t q4 = k < 16 ? (qs[k] & 0x0Fu) : (uint32_t)(qs[k - 16] >> 4);
            const uint32_t q = q4 | (((hb >> k) & 1u) << 4);
            x[i0 + k] = (float)q * step - low;
        }
        if (++j == 8) {
            j = 0;
            base += sb;
        }
    }
}

void colibri_matvec_q4k_q8(const void *w, const int8_t *xq, const float *sx, float *y,
                           int32_t n_out, int32_t n_in)
{
    kq_matvec(w, xq, sx, y, n_out, n_in, sizeof(colibri_block_q4k), 16);
}

void colibri_matvec_q5k_q8(const void *w, const int8_t *xq, const float *sx, float *y,
                           int32_t n_out, int32_t n_in)
{
    kq_matvec(w, xq, sx, y, n_out, n_in, sizeof(colibri_block_q5k), 20);
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

void colibri_exp_shift_f32(float *x, size_t n, float m)
{
    COLIBRI_X86_KERNEL(exp_shift_f32, (x, n, m));
    for (size_t j = 0; j < n; ++j) {
        x[j] = colibri_expf(x[j] - m);
    }
}

void colibri_axpy_f32(float *y, float a, const float *x, int32_t n)
{
    COLIBRI_X86_KERNEL(axpy_f32, (y, a, x, n));
    for (int32_t i = 0; i < n; i++) {
        y[i] += a * x[i];
    }
}

void colibri_wsum_f32(float *out, const float *w, float sum, const float *v, size_t stride,
                      int32_t n, int32_t d)
{
    COLIBRI_X86_KERNEL(wsum_f32, (out, w, sum, v, stride, n, d));
    for (int32_t i = 0; i < d; i++) {
        out[i] = 0.0f;
    }
    for (int32_t t = 0; t < n; t++) {
        colibri_axpy_f32(out, w[t] / sum, v + (size_t)t * stride, d);
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

/* The int8 x int8 ones: blocked 0, a scale per row (colibri_matmul_q8_q8); 1, a scale per row
 * and block (colibri_matmul_q8b_q8). */
static void matmul_q8(const int8_t *q, const float *scale, const int8_t *xq, const float *sx,
                      float *y, int32_t ldy, int32_t n_out, int32_t n_in, int32_t n_tok,
                      int blocked)
{
    const size_t nb = COLIBRI_Q8_BLOCKS(n_in);
    const size_t spr = blocked ? nb : 1u; /* scales per row */
#if defined(COLIBRI_X86_DISPATCH)
    const colibri_x86_kernels_t *kx = colibri_x86_kernels();
    void (*const tiled)(const int8_t *, const float *, const int8_t *, const float *, float *,
                        int32_t, int32_t, int32_t, int32_t) =
        blocked ? kx->matmul_q8b_q8 : kx->matmul_q8_q8;
#endif
    const int32_t step = matmul_chunk_rows((size_t)n_in + (blocked ? 4u * nb : 0u), n_out);
    for (int32_t o0 = 0; o0 < n_out; o0 += step) {
        const int32_t m = (n_out - o0 < step) ? n_out - o0 : step;
        const int8_t *qo = q + (size_t)o0 * (size_t)n_in;
        const float *so = scale + (size_t)o0 * spr;
#if defined(COLIBRI_X86_DISPATCH)
        if (tiled != NULL && n_tok > 1) { /* register-blocked over tokens */
            tiled(qo, so, xq, sx, y + o0, ldy, m, n_in, n_tok);
            continue;
        }
#endif
        for (int32_t t = 0; t < n_tok; t++) {
            const int8_t *xt = xq + (size_t)t * (size_t)n_in;
            float *yt = y + (size_t)t * (size_t)ldy + (size_t)o0;
            if (blocked) { /* direct calls: the stack check follows them */
                colibri_matvec_q8b_q8(qo, so, xt, sx + (size_t)t * nb, yt, m, n_in);
            } else {
                colibri_matvec_q8_q8(qo, so, xt, sx + (size_t)t * nb, yt, m, n_in);
            }
        }
    }
}

void colibri_matmul_q8_q8(const int8_t *q, const float *scale, const int8_t *xq, const float *sx,
                          float *y, int32_t ldy, int32_t n_out, int32_t n_in, int32_t n_tok)
{
    matmul_q8(q, scale, xq, sx, y, ldy, n_out, n_in, n_tok, 0);
}

void colibri_matmul_q8b_q8(const int8_t *q, const float *scale, const int8_t *xq, const float *sx,
                           float *y, int32_t ldy, int32_t n_out, int32_t n_in, int32_t n_tok)
{
    matmul_q8(q, scale, xq, sx, y, ldy, n_out, n_in, n_tok, 1);
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

/* The q4k / q5k matmul: chunks of whole groups of rows (matmul_chunk_rows gives multiples of 16,
 * every COLIBRI_KQ_GROUP_ROWS divides 16, so each chunk starts a super-block), each token's
 * matvec over a chunk. bits: 4 (q4k) or 5 (q5k), a constant in each caller (inlined, so each
 * matmul calls only its own matvec, directly: the stack check sees the call). */
static inline __attribute__((always_inline)) void kq_matmul(const void *w, const int8_t *xq,
                                                            const float *sx, float *y, int32_t ldy,
                                                            int32_t n_out, int32_t n_in,
                                                            int32_t n_tok, int32_t bits)
{
    const size_t sb = (bits == 5) ? sizeof(colibri_block_q5k) : sizeof(colibri_block_q4k);
    const size_t sub = (bits == 5) ? 20u : 16u;
    const size_t nb = COLIBRI_Q8_BLOCKS(n_in);
    const size_t g = COLIBRI_KQ_GROUP_ROWS(n_in);
    const int32_t step = matmul_chunk_rows(COLIBRI_KQ_STREAM_BYTES(g * nb, sb, sub) / g, n_out);
    for (int32_t o0 = 0; o0 < n_out; o0 += step) {
        const int32_t m = (n_out - o0 < step) ? n_out - o0 : step;
        const uint8_t *wo = (const uint8_t *)w + COLIBRI_KQ_STREAM_BYTES((size_t)o0 * nb, sb, sub);
        for (int32_t t = 0; t < n_tok; t++) {
            const int8_t *xt = xq + (size_t)t * (size_t)n_in;
            const float *st = sx + (size_t)t * nb;
            float *yt = y + (size_t)t * (size_t)ldy + (size_t)o0;
            if (bits == 5) {
                colibri_matvec_q5k_q8(wo, xt, st, yt, m, n_in);
            } else {
                colibri_matvec_q4k_q8(wo, xt, st, yt, m, n_in);
            }
        }
    }
}

void colibri_matmul_q4k_q8(const void *w, const int8_t *xq, const float *sx, float *y, int32_t ldy,
                           int32_t n_out, int32_t n_in, int32_t n_tok)
{
    kq_matmul(w, xq, sx, y, ldy, n_out, n_in, n_tok, 4);
}

void colibri_matmul_q5k_q8(const void *w, const int8_t *xq, const float *sx, float *y, int32_t ldy,
                           int32_t n_out, int32_t n_in, int32_t n_tok)
{
    kq_matmul(w, xq, sx, y, ldy, n_out, n_in, n_tok, 5);
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
