/**
 * @file colibri_qi_ref.c
 * @brief The portable twins of the tiles (colibri_qi_ref.h): the stored layouts are read element
 *        by element as colibri/quant/formats.py writes them, every sum is a plain loop. Built
 *        only into the self-test tests/platform/refkernels.c.
 */
#include "colibri_qi_ref.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* formats.py R4_ROWS, R4_CHUNK, C8_COLS; QK8 = QK4 = 32 */
#define REF_ROWS 4
#define REF_CHUNK 16
#define REF_QK 32
#define REF_C8 8
/* bytes of one block of a Q4R4 group: 4 fp16 scales, then 4 rows of 16 bytes of nibbles */
#define REF_Q4R4_BLOCK 72
/* bytes of a plain int4 block: fp16 d, then 16 bytes of nibbles */
#define REF_Q4_BLOCK 18

float colibri_ref_fmaf(float a, float b, float c)
{
    /* the product is exact in double (24 + 24 bits); s = p + c rounded, err its exact error
     * (two-sum). Rounding s to odd (its last bit set when err != 0) before the conversion to
     * float gives a * b + c rounded once: 53 bits are at least 24 + 2. */
    const double p = (double)a * (double)b;
    const double cd = (double)c;
    double s = p + cd;
    if (!isfinite(s)) {
        return (float)s;
    }
    const double bv = s - p;
    const double err = (p - (s - bv)) + (cd - bv);
    if (err != 0.0) {
        uint64_t bits;
        memcpy(&bits, &s, sizeof bits);
        if ((bits & 1u) == 0u) {
            /* one unit toward the exact value: up in magnitude when err has s's sign */
            bits = ((err > 0.0) == (s > 0.0)) ? bits + 1u : bits - 1u;
            memcpy(&s, &bits, sizeof s);
        }
    }
    return (float)s;
}

float colibri_ref_f16(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h >> 15) << 31;
    const uint32_t expo = (uint32_t)(h >> 10) & 31u;
    const uint32_t man = (uint32_t)h & 0x3FFu;
    if (expo == 0u) { /* zero or subnormal: man * 2^-24, exact */
        const float m = (float)man * 0x1p-24f;
        return sign ? -m : m;
    }
    const uint32_t bits =
        sign | ((expo == 31u) ? 0x7F800000u : (expo + 112u) << 23) | (man << 13); /* 127 - 15 */
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

void colibri_qi_quantize_row_ref(const float *x, int8_t *xq, float *sx, int32_t n)
{
    for (int32_t i0 = 0, b = 0; i0 < n; i0 += REF_QK, b++) {
        const int32_t m = (n - i0 < REF_QK) ? n - i0 : REF_QK;
        float amax = 0.0f;
        int nan = 0;
        for (int32_t j = 0; j < m; j++) {
            const float a = fabsf(x[i0 + j]);
            nan |= isnan(a) != 0;
            amax = (a > amax) ? a : amax;
        }
        if (nan || !(amax >= 0x1p-120f)) {
            for (int32_t j = 0; j < m; j++) {
                xq[i0 + j] = 0;
            }
            sx[b] = 0.0f;
            continue;
        }
        const float inv = 127.0f / amax;
        sx[b] = amax / 127.0f;
        for (int32_t j = 0; j < m; j++) {
            const float v = x[i0 + j] * inv;
            float a = fabsf(v);
            a = (a < 127.0f) ? a : 127.0f;
            const int32_t q = ((int32_t)(a * 65536.0f) + 32768) >> 16;
            xq[i0 + j] = (int8_t)(signbit(v) ? -q : q);
        }
    }
}

/* The code of weight (o, i) of an int8 matrix stored in layout R4 (corrected 0) or R4P
 * (corrected 1): rows of the groups chunk by chunk, the n_out % 4 rows after them row-major. */
static int32_t r4_code(const int8_t *q, int32_t o, int32_t i, int32_t n_out, int32_t n_in,
                       int corrected)
{
    const int32_t grouped = n_out / REF_ROWS * REF_ROWS;
    if (o >= grouped) {
        return q[(size_t)o * (size_t)n_in + (size_t)i];
    }
    const size_t at = (size_t)(o / REF_ROWS) * REF_ROWS * (size_t)n_in +
                      (size_t)(i / REF_CHUNK) * REF_ROWS * REF_CHUNK +
                      (size_t)(o % REF_ROWS) * REF_CHUNK + (size_t)(i % REF_CHUNK);
    int32_t c = q[at];
    if (corrected && (i & 1)) { /* stored c[2j+1] - (c[2j] < 0), c[2j] the byte before */
        c += (q[at - 1] < 0) ? 1 : 0;
    }
    return c;
}

/* One token of the int8 kernels on layout R4 / R4P: per row, blocks of 32 in order (the last
 * may be 16 long), acc = acc + (float)isum * f, f = sx[b] or scale[o][b] * sx[b]; y = acc *
 * scale[o] (per-row scales) or acc (block scales). */
static void q8_layout_ref(const int8_t *q, const float *scale, const int8_t *xq, const float *sx,
                          float *y, int32_t n_out, int32_t n_in, int blocked, int corrected)
{
    const int32_t nb = (n_in + REF_QK - 1) / REF_QK;
    for (int32_t o = 0; o < n_out; o++) {
        float acc = 0.0f;
        for (int32_t b = 0; b < nb; b++) {
            const int32_t i1 = (n_in < (b + 1) * REF_QK) ? n_in : (b + 1) * REF_QK;
            int32_t isum = 0;
            for (int32_t i = b * REF_QK; i < i1; i++) {
                isum += r4_code(q, o, i, n_out, n_in, corrected) * (int32_t)xq[i];
            }
            const float f = blocked ? scale[(size_t)o * (size_t)nb + (size_t)b] * sx[b] : sx[b];
            acc = acc + (float)isum * f;
        }
        y[o] = blocked ? acc : acc * scale[o];
    }
}

static void q8_layout_mm_ref(const int8_t *q, const float *scale, const int8_t *xq, const float *sx,
                             float *y, int32_t ldy, int32_t n_out, int32_t n_in, int32_t n_tok,
                             int blocked, int corrected)
{
    const size_t nb = (size_t)((n_in + REF_QK - 1) / REF_QK);
    for (int32_t t = 0; t < n_tok; t++) {
        q8_layout_ref(q, scale, xq + (size_t)t * (size_t)n_in, sx + (size_t)t * nb,
                      y + (size_t)t * (size_t)ldy, n_out, n_in, blocked, corrected);
    }
}

void colibri_qi_q8_q8_r4_ref(const int8_t *q, const float *scale, const int8_t *xq, const float *sx,
                             float *y, int32_t n_out, int32_t n_in, int blocked)
{
    q8_layout_ref(q, scale, xq, sx, y, n_out, n_in, blocked, 0);
}

void colibri_qi_mm_q8_q8_r4_ref(const int8_t *q, const float *scale, const int8_t *xq,
                                const float *sx, float *y, int32_t ldy, int32_t n_out, int32_t n_in,
                                int32_t n_tok, int blocked)
{
    q8_layout_mm_ref(q, scale, xq, sx, y, ldy, n_out, n_in, n_tok, blocked, 0);
}

void colibri_qi_q8_q8_r4p_ref(const int8_t *q, const float *scale, const int8_t *xq,
                              const float *sx, float *y, int32_t n_out, int32_t n_in, int blocked)
{
    q8_layout_ref(q, scale, xq, sx, y, n_out, n_in, blocked, 1);
}

void colibri_qi_mm_q8_q8_r4p_ref(const int8_t *q, const float *scale, const int8_t *xq,
                                 const float *sx, float *y, int32_t ldy, int32_t n_out,
                                 int32_t n_in, int32_t n_tok, int blocked)
{
    q8_layout_mm_ref(q, scale, xq, sx, y, ldy, n_out, n_in, n_tok, blocked, 1);
}

void colibri_qi_bias_relu_ref(float *y, int32_t o0, int32_t n, const float *bias, int relu)
{
    for (int32_t o = o0; o < n; o++) {
        float v = y[o];
        if (bias != NULL) {
            v = v + bias[o];
        }
        if (relu && !(v > 0.0f)) {
            v = 0.0f;
        }
        y[o] = v;
    }
}

void colibri_qi_mm_q8_q8_r4p_act_ref(const int8_t *q, const float *scale, const int8_t *xq,
                                     const float *sx, float *y, int32_t ldy, int32_t n_out,
                                     int32_t n_in, int32_t n_tok, const float *bias, int relu)
{
    q8_layout_mm_ref(q, scale, xq, sx, y, ldy, n_out, n_in, n_tok, 0, 1);
    for (int32_t t = 0; t < n_tok; t++) {
        colibri_qi_bias_relu_ref(y + (size_t)t * (size_t)ldy, 0, n_out, bias, relu);
    }
}

void colibri_qi_relu_row_ref(float *h, int32_t n)
{
    colibri_qi_bias_relu_ref(h, 0, n, NULL, 1);
}

/* Weight j (0..31) of the plain int4 block at p (formats.py int4_values: low nibbles of bytes
 * 0..15 are weights 0..15, high nibbles weights 16..31), as nibble - 8. */
static int32_t q4_plain_value(const uint8_t *p, int32_t j)
{
    const uint8_t byte = p[2 + (j % 16)];
    return (int32_t)((j < 16) ? (byte & 0x0Fu) : (byte >> 4)) - 8;
}

static uint16_t ref_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

/* One row of plain int4 blocks (bytes at p, REF_Q4_BLOCK each) times one token. */
static float q4_plain_row(const uint8_t *p, const int8_t *xq, const float *sx, int32_t n_in)
{
    float acc = 0.0f;
    for (int32_t b = 0, i0 = 0; i0 < n_in; b++, i0 += REF_QK) {
        const uint8_t *blk = p + (size_t)b * REF_Q4_BLOCK;
        const int32_t m = (n_in - i0 < REF_QK) ? n_in - i0 : REF_QK;
        int32_t isum = 0;
        for (int32_t j = 0; j < m; j++) {
            isum += q4_plain_value(blk, j) * (int32_t)xq[i0 + j];
        }
        acc = acc + (float)isum * (colibri_ref_f16(ref_u16(blk)) * sx[b]);
    }
    return acc;
}

void colibri_qi_q4_q8_ref(const colibri_block_q4_32 *w, const int8_t *xq, const float *sx, float *y,
                          int32_t n_out, int32_t n_in)
{
    const size_t row = (size_t)((n_in + REF_QK - 1) / REF_QK) * REF_Q4_BLOCK;
    const uint8_t *bytes = (const uint8_t *)(const void *)w;
    for (int32_t o = 0; o < n_out; o++) {
        y[o] = q4_plain_row(bytes + (size_t)o * row, xq, sx, n_in);
    }
}

void colibri_qi_mm_q4_q8_ref(const colibri_block_q4_32 *w, const int8_t *xq, const float *sx,
                             float *y, int32_t ldy, int32_t n_out, int32_t n_in, int32_t n_tok)
{
    const size_t nb = (size_t)((n_in + REF_QK - 1) / REF_QK);
    for (int32_t t = 0; t < n_tok; t++) {
        colibri_qi_q4_q8_ref(w, xq + (size_t)t * (size_t)n_in, sx + (size_t)t * nb,
                             y + (size_t)t * (size_t)ldy, n_out, n_in);
    }
}

/* The weight of each nibble slot (byte slot / 2, high half when odd) of a row's 16 bytes in a
 * grouped block: Q4R4 (formats.py Q4R4_SLOT), and Q4H4 (formats.py q4h4_order: Q4R4's groups,
 * each row's bytes in the plain order, byte j holding weight j low and 16 + j high). */
static const uint8_t k_q4r4_weight[32] = {0,  1,  4,  5,  2,  3,  6,  7,  8,  9,  12,
                                          13, 10, 11, 14, 15, 16, 17, 20, 21, 18, 19,
                                          22, 23, 24, 25, 28, 29, 26, 27, 30, 31};
static const uint8_t k_q4h4_weight[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                          21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                          11, 27, 12, 28, 13, 29, 14, 30, 15, 31};

/* Rows in groups of REF_ROWS (a block of each group: REF_ROWS fp16 scales, then each row's 16
 * bytes, nibble slots mapped to weights by slot_weight), the last n_out % REF_ROWS rows plain. */
static void q4_grouped_ref(const uint8_t *w, const int8_t *xq, const float *sx, float *y,
                           int32_t n_out, int32_t n_in, const uint8_t *slot_weight)
{
    const int32_t nb = n_in / REF_QK;
    const int32_t grouped = n_out / REF_ROWS * REF_ROWS;
    for (int32_t o = 0; o < grouped; o++) {
        const uint8_t *g = w + (size_t)(o / REF_ROWS) * (size_t)nb * REF_Q4R4_BLOCK;
        const int32_t r = o % REF_ROWS;
        float acc = 0.0f;
        for (int32_t b = 0; b < nb; b++) {
            const uint8_t *blk = g + (size_t)b * REF_Q4R4_BLOCK;
            const uint8_t *qs = blk + 8 + 16 * r;
            int32_t isum = 0;
            for (int32_t slot = 0; slot < REF_QK; slot++) {
                const uint8_t byte = qs[slot / 2];
                const int32_t v = (int32_t)((slot & 1) ? (byte >> 4) : (byte & 0x0Fu)) - 8;
                isum += v * (int32_t)xq[b * REF_QK + slot_weight[slot]];
            }
            acc = acc + (float)isum * (colibri_ref_f16(ref_u16(blk + 2 * r)) * sx[b]);
        }
        y[o] = acc;
    }
    /* the rows after the groups: plain blocks */
    const uint8_t *rest = w + (size_t)(grouped / REF_ROWS) * (size_t)nb * REF_Q4R4_BLOCK;
    for (int32_t o = grouped; o < n_out; o++) {
        y[o] = q4_plain_row(rest + (size_t)(o - grouped) * (size_t)nb * REF_Q4_BLOCK, xq, sx, n_in);
    }
}

void colibri_qi_q4_q8_q4r4_ref(const uint8_t *w, const int8_t *xq, const float *sx, float *y,
                               int32_t n_out, int32_t n_in)
{
    q4_grouped_ref(w, xq, sx, y, n_out, n_in, k_q4r4_weight);
}

void colibri_qi_mm_q4_q8_q4r4_ref(const uint8_t *w, const int8_t *xq, const float *sx, float *y,
                                  int32_t ldy, int32_t n_out, int32_t n_in, int32_t n_tok)
{
    const size_t nb = (size_t)(n_in / REF_QK);
    for (int32_t t = 0; t < n_tok; t++) {
        colibri_qi_q4_q8_q4r4_ref(w, xq + (size_t)t * (size_t)n_in, sx + (size_t)t * nb,
                                  y + (size_t)t * (size_t)ldy, n_out, n_in);
    }
}

void colibri_qi_q4_q8_q4h4_ref(const uint8_t *w, const int8_t *xq, const float *sx, float *y,
                               int32_t n_out, int32_t n_in)
{
    q4_grouped_ref(w, xq, sx, y, n_out, n_in, k_q4h4_weight);
}

void colibri_qi_mm_q4_q8_q4h4_ref(const uint8_t *w, const int8_t *xq, const float *sx, float *y,
                                  int32_t ldy, int32_t n_out, int32_t n_in, int32_t n_tok)
{
    const size_t nb = (size_t)(n_in / REF_QK);
    for (int32_t t = 0; t < n_tok; t++) {
        colibri_qi_q4_q8_q4h4_ref(w, xq + (size_t)t * (size_t)n_in, sx + (size_t)t * nb,
                                  y + (size_t)t * (size_t)ldy, n_out, n_in);
    }
}

/* acc + w * x in the order's rounding: fused or the product rounded first */
static float ref_madd(float acc, float w, float x, colibri_qf_ref_order order)
{
    return (order == COLIBRI_QF_REF_PLAIN) ? acc + w * x : colibri_ref_fmaf(w, x, acc);
}

/* Outputs in the c8 block of output o: 8, or n_out % 8 in the last block of a tail */
static size_t ref_c8_width(int32_t o, int32_t n_out)
{
    const int32_t o0 = o - o % REF_C8;
    return (size_t)((n_out - o0 < REF_C8) ? n_out - o0 : REF_C8);
}

void colibri_qf_f32_c8_ref(const float *w, const float *b, const float *x, float *y, int32_t n_out,
                           int32_t n_in, colibri_qf_ref_order order)
{
    for (int32_t o = 0; o < n_out; o++) {
        /* formats.py c8_order: block o / 8 is [n_in][width] contiguous, width 8 or, for the
           last block of n_out % 8 outputs, n_out % 8 */
        const size_t wd = ref_c8_width(o, n_out);
        const float *col = w + (size_t)(o / REF_C8) * REF_C8 * (size_t)n_in + (size_t)(o % REF_C8);
        float acc = (b != NULL) ? b[o] : 0.0f;
        for (int32_t i = 0; i < n_in; i++) {
            acc = ref_madd(acc, col[(size_t)i * wd], x[i], order);
        }
        y[o] = acc;
    }
}

void colibri_qf_f16_c8_ref(const uint16_t *w, const float *b, const float *x, float *y,
                           int32_t n_out, int32_t n_in, colibri_qf_ref_order order)
{
    for (int32_t o = 0; o < n_out; o++) {
        const size_t wd = ref_c8_width(o, n_out);
        const uint16_t *col =
            w + (size_t)(o / REF_C8) * REF_C8 * (size_t)n_in + (size_t)(o % REF_C8);
        float acc = (b != NULL) ? b[o] : 0.0f;
        for (int32_t i = 0; i < n_in; i++) {
            acc = ref_madd(acc, colibri_ref_f16(col[(size_t)i * wd]), x[i], order);
        }
        y[o] = acc;
    }
}

void colibri_qf_f16_f32_ref(const uint16_t *w, const float *x, float *y, int32_t n_out,
                            int32_t n_in, colibri_qf_ref_order order)
{
    for (int32_t o = 0; o < n_out; o++) {
        const uint16_t *row = w + (size_t)o * (size_t)n_in;
        float acc = 0.0f;
        int32_t i = 0;
        if (order == COLIBRI_QF_REF_LANES4) {
            float lane[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (; i < n_in / 4 * 4; i++) {
                lane[i % 4] = colibri_ref_fmaf(colibri_ref_f16(row[i]), x[i], lane[i % 4]);
            }
            acc = (lane[0] + lane[1]) + (lane[2] + lane[3]);
        }
        for (; i < n_in; i++) {
            acc = ref_madd(acc, colibri_ref_f16(row[i]), x[i],
                           order == COLIBRI_QF_REF_FUSED ? order : COLIBRI_QF_REF_PLAIN);
        }
        y[o] = acc;
    }
}
