/**
 * @file qkernels.c
 * @brief Self-test of the shape-specialised kernels of colibri_qinline.h (what generated expert
 *        kernels call) against the runtime's kernels_q.c on a board: every output must have the
 *        same bits.
 *         - colibri_qi_q8_q8_r4 (per-channel and block scales) on matrices stored in layout R4,
 *           for row counts with and without a tail of 1..3 rows and inputs with and without a
 *           last half block, random and extreme codes, and scales on either side of the
 *           Helium paths' guard (colibri_qi_mve_scales_ok);
 *         - colibri_qi_q4_q8 (colibri_qinline_q4.h) on int4 matrices, row counts with and
 *           without a tail of 1..3 rows, inputs with and without a last partial block, random
 *           and extreme nibbles and activations, normal, subnormal, zero, huge, infinite and
 *           NaN block scales; colibri_qi_q4_q8_q4r4 on the same matrices stored in layout Q4R4
 *           (the shapes of whole blocks);
 *         - colibri_qi_mm_q8_q8_r4 (both scale layouts) for 1..QK_TOK tokens on the same shapes,
 *           against the library's colibri_matmul_q8_q8 / q8b_q8 (row t: the matvec's bits),
 *           output rows strided (ldy > n_out);
 *         - colibri_qi_q8_q8_r4p and colibri_qi_mm_q8_q8_r4p (1..QK_TOK tokens), both scale
 *           layouts, and colibri_qi_mm_q8_q8_r4p_act (per-row scales, + a bias then relu on
 *           each output row, against the library's rows and those loops); all on the
 *           shapes of whole blocks stored in layout R4P, inputs over several
 *           chunks (COLIBRI_QI_R4P_CHUNK and the multi-token passes' COLIBRI_QI_R4P_GCHUNK set
 *           to 64 here: passes of 4 tokens on the Cortex-M4 / M7, then one at a time);
 *         - colibri_qi_relu_row on the quantiser's rows (below) and special values;
 *         - colibri_qi_mm_q4_q8 (plain blocks) and colibri_qi_mm_q4_q8_q4r4 (Q4R4, whole
 *           blocks) for 1..QK_TOK tokens on the int4 shapes and values, against the library's
 *           colibri_matmul_q4_q8, output rows strided;
 *         - colibri_qi_quantize_row on random rows, exact halves, zeros, subnormals, tiny and
 *           huge blocks, NaN and infinity, and rows ending in a partial block.
 *        Prints one line and returns 0 when all match. The bench markers time, by the first
 *        byte of input.bin: 0 the library's colibri_matvec_q8_q8 on one expert's pair of
 *        matrices (w1 [QK_FF][QK_D], then w2 [QK_D][QK_FF]), 1 colibri_qi_q8_q8_r4 on the same,
 *        2 the library's colibri_quantize_row_q8 on QK_D + QK_FF values, 3 colibri_qi_quantize_row
 *        on them, 4 the library's colibri_matvec_q4_q8 on an int4 pair of the same shapes, 5
 *        colibri_qi_q4_q8 on it, 6 colibri_qi_q4_q8_q4r4 on the same bytes read as Q4R4, 7
 *        colibri_qi_mm_q8_q8_r4 on the int8 pair for QK_BENCH_TOK tokens, 8 colibri_qi_mm_q4_q8 on
 *        the int4 pair for QK_BENCH_TOK tokens, 9 colibri_qi_mm_q4_q8_q4r4 on the Q4R4 bytes for
 *        them (tests/targets/test_platforms.py turns the counts into instructions per MAC).
 */
#define COLIBRI_QI_R4P_CHUNK 64  /* several chunks of inputs in the R4P checks */
#define COLIBRI_QI_R4P_GCHUNK 64 /* and in its multi-token passes */
#include "colibri_fmt.h"
#include "colibri_platform.h"
#include "colibri_qinline.h"
#include "colibri_quant.h"

#include <stdint.h>
#include <string.h>

#define QK_D 128
#define QK_FF 256
#define QK_MAXN (QK_FF * QK_D)
#define QK_ROW (QK_D + QK_FF)

/* The int8 matrix, or (int4 checks and bench) the int4 blocks: one buffer for small RAMs. */
static union {
    int8_t i8[QK_MAXN];
    colibri_block_q4_32 q4[QK_MAXN / sizeof(colibri_block_q4_32)];
} qk_mem __attribute__((aligned(4)));
#define qk_w (qk_mem.i8)
#define qk_q4 (qk_mem.q4)
static int8_t qk_r4[32 * 256] __attribute__((aligned(4)));
static float qk_scale[QK_FF * COLIBRI_Q8_BLOCKS(QK_FF)];
static int8_t qk_xq[QK_ROW] __attribute__((aligned(4)));
static int8_t qk_xq2[QK_ROW] __attribute__((aligned(4)));
static float qk_x[QK_ROW];
static float qk_sx[COLIBRI_Q8_BLOCKS(QK_ROW)];
static float qk_sx2[COLIBRI_Q8_BLOCKS(QK_ROW)];
static float qk_y0[QK_FF];
static float qk_y1[QK_FF];
#define QK_TOK 9
#define QK_BENCH_TOK 8
#define QK_LDY 31 /* the widest shape checked (30 rows) + 1 */
static int8_t qk_xqm[QK_TOK * QK_FF] __attribute__((aligned(4)));
static float qk_sxm[QK_TOK * COLIBRI_Q8_BLOCKS(QK_FF)];
static float qk_ym0[QK_TOK * QK_LDY];
static float qk_ym1[QK_TOK * QK_LDY];
static uint32_t qk_state = 0x2545F491u;

static uint32_t qk_next(void)
{
    qk_state ^= qk_state << 13;
    qk_state ^= qk_state >> 17;
    qk_state ^= qk_state << 5;
    return qk_state;
}

static float qk_unit(void)
{
    return (float)(int32_t)qk_next() * (1.0f / 2147483648.0f);
}

static float qk_bits(uint32_t b)
{
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

static void qk_fill(int extremes)
{
    for (int32_t i = 0; i < QK_MAXN; i++) {
        const int32_t v =
            extremes ? ((i % 3 == 0) ? 127 : -127) : (int32_t)(qk_next() % 255u) - 127;
        qk_w[i] = (int8_t)v;
    }
    for (int32_t i = 0; i < QK_ROW; i++) {
        qk_xq[i] = extremes ? (int8_t)-127 : (int8_t)((int32_t)(qk_next() % 255u) - 127);
    }
    for (size_t i = 0; i < sizeof qk_scale / sizeof qk_scale[0]; i++) {
        qk_scale[i] = qk_unit() * 0.01f;
    }
    for (size_t i = 0; i < sizeof qk_sx / sizeof qk_sx[0]; i++) {
        qk_sx[i] = qk_unit() * 0.05f;
    }
    for (size_t i = 0; i < sizeof qk_xqm; i++) {
        qk_xqm[i] = extremes ? (int8_t)((i % 5 == 0) ? 127 : -127)
                             : (int8_t)((int32_t)(qk_next() % 255u) - 127);
    }
    for (size_t i = 0; i < sizeof qk_sxm / sizeof qk_sxm[0]; i++) {
        qk_sxm[i] = qk_unit() * 0.05f;
    }
}

/* Scales for the Helium R4 paths' guard (colibri_qi_mve_scales_ok): kind 0 keeps the block
 * scales of the activations 0 or in [2^-60, 2^60] (the vector path, at its bounds) and makes
 * some weight scales zero, tiny or 1; kind 1 mixes block scales just outside that range
 * (below 2^-60, 2^-61, 2^-65, above 2^60, 2^61) among normal ones, so rows take the scalar
 * path. (Subnormal scales are left out: the library's own Helium float flushes them.) */
static float qk_scale_kind(int kind)
{
    static const uint32_t inside[] = {0x21800000u, 0x5D800000u, 0x00000000u, 0x21C00000u,
                                      0x5D7FFFFFu, 0xA1800000u, 0x80000000u};
    static const uint32_t outside[] = {0x217FFFFFu, 0x21000000u, 0x5D800001u, 0x5E000000u,
                                       0x1F000000u};
    const uint32_t r = qk_next();
    if (kind == 0) {
        return (r % 3u == 0u) ? qk_unit() * 0.05f
                              : qk_bits(inside[(r >> 8) % (sizeof inside / sizeof inside[0])]);
    }
    return (r % 4u != 0u) ? qk_unit() * 0.05f
                          : qk_bits(outside[(r >> 8) % (sizeof outside / sizeof outside[0])]);
}

static void qk_fill_scales(int kind)
{
    static const uint32_t weight[] = {0x00000000u, 0x0D800000u, 0x3F800000u};
    for (size_t i = 0; i < sizeof qk_sx / sizeof qk_sx[0]; i++) {
        qk_sx[i] = qk_scale_kind(kind);
    }
    for (size_t i = 0; i < sizeof qk_sxm / sizeof qk_sxm[0]; i++) {
        qk_sxm[i] = qk_scale_kind(kind);
    }
    if (kind == 0) {
        for (size_t i = 0; i < sizeof qk_scale / sizeof qk_scale[0]; i++) {
            const uint32_t r = qk_next();
            if (r % 4u == 0u) {
                qk_scale[i] = qk_bits(weight[(r >> 8) % (sizeof weight / sizeof weight[0])]);
            }
        }
    }
}

/* Row-major [n_out][n_in] codes into layout R4 (colibri_qinline.h), n_in % 16 == 0. */
static void qk_to_r4(const int8_t *src, int8_t *dst, int32_t n_out, int32_t n_in)
{
    const int32_t groups = n_out / COLIBRI_R4_ROWS;
    int8_t *d = dst;
    for (int32_t g = 0; g < groups; g++) {
        for (int32_t c = 0; c < n_in / COLIBRI_R4_CHUNK; c++) {
            for (int32_t r = 0; r < COLIBRI_R4_ROWS; r++) {
                const int8_t *row = src + (size_t)(g * COLIBRI_R4_ROWS + r) * (size_t)n_in;
                memcpy(d, row + (size_t)c * COLIBRI_R4_CHUNK, COLIBRI_R4_CHUNK);
                d += COLIBRI_R4_CHUNK;
            }
        }
    }
    const size_t rest = (size_t)groups * COLIBRI_R4_ROWS * (size_t)n_in;
    memcpy(dst + rest, src + rest, (size_t)(n_out % COLIBRI_R4_ROWS) * (size_t)n_in);
}

/* One shape: the R4 kernel against the library's row-major one, both scale layouts. */
static uint32_t qk_check_r4(int32_t n_out, int32_t n_in, uint32_t *checks)
{
    uint32_t failed = 0;
    qk_to_r4(qk_w, qk_r4, n_out, n_in);
    for (int blocked = 0; blocked < 2; blocked++) {
        if (blocked) {
            colibri_matvec_q8b_q8(qk_w, qk_scale, qk_xq, qk_sx, qk_y0, n_out, n_in);
        } else {
            colibri_matvec_q8_q8(qk_w, qk_scale, qk_xq, qk_sx, qk_y0, n_out, n_in);
        }
        colibri_qi_q8_q8_r4(qk_r4, qk_scale, qk_xq, qk_sx, qk_y1, n_out, n_in, blocked);
        *checks += 1u;
        failed += memcmp(qk_y0, qk_y1, (size_t)n_out * sizeof(float)) != 0;
    }
    return failed;
}

/* Random fp16 bits of kind `kind`: 0 normal scales around 2^-6, 1 any finite value (subnormals,
 * zeros, +-65504 included), 2 the same with +-infinity and NaN (quiet and signalling). */
static uint16_t qk_f16(int kind)
{
    const uint16_t r = (uint16_t)qk_next();
    if (kind == 0) {
        return (uint16_t)((r & 0x83FFu) | 0x1800u); /* +-[2^-9, 2^-8) */
    }
    if (kind == 2 && r % 7u == 0u) {
        static const uint16_t special[] = {0x7C00u, 0xFC00u, 0x7E00u, 0x7C01u, 0xFE55u};
        return special[(r >> 8) % 5u];
    }
    if ((r & 0x7C00u) == 0x7C00u) {
        return (uint16_t)(r & 0xFBFFu); /* finite: the largest exponent */
    }
    return r;
}

/* An int4 matrix of nblocks blocks: random nibbles (or, extremes, every nibble 0 or 15) and
 * scales of qk_f16(kind). */
static void qk_fill_q4(size_t nblocks, int extremes, int kind)
{
    for (size_t b = 0; b < nblocks; b++) {
        qk_q4[b].d = qk_f16(kind);
        for (int32_t j = 0; j < COLIBRI_QK4 / 2; j++) {
            const uint32_t r = qk_next();
            qk_q4[b].qs[j] = extremes ? (uint8_t)((r & 1u) ? 0xFFu : 0x00u) : (uint8_t)r;
        }
    }
}

/* One shape: colibri_qi_q4_q8 against the library's colibri_matvec_q4_q8. */
static uint32_t qk_check_q4(int32_t n_out, int32_t n_in, uint32_t *checks)
{
    colibri_matvec_q4_q8(qk_q4, qk_xq, qk_sx, qk_y0, n_out, n_in);
    colibri_qi_q4_q8(qk_q4, qk_xq, qk_sx, qk_y1, n_out, n_in);
    *checks += 1u;
    return memcmp(qk_y0, qk_y1, (size_t)n_out * sizeof(float)) != 0;
}

/* Plain int4 blocks [n_out][n_in / 32] into layout Q4R4 (colibri_qinline_q4.h) at dst. */
static void qk_to_q4r4(const colibri_block_q4_32 *src, uint8_t *dst, int32_t n_out, int32_t n_in)
{
    const int32_t nb = n_in / COLIBRI_QK4;
    const int32_t groups = n_out / COLIBRI_Q4I_ROWS;
    uint8_t *d = dst;
    for (int32_t g = 0; g < groups; g++) {
        for (int32_t b = 0; b < nb; b++) {
            for (int32_t r = 0; r < COLIBRI_Q4I_ROWS; r++) {
                memcpy(d + 2 * r, &src[(g * COLIBRI_Q4I_ROWS + r) * nb + b].d, 2);
            }
            for (int32_t r = 0; r < COLIBRI_Q4I_ROWS; r++) {
                const colibri_block_q4_32 *blk = &src[(g * COLIBRI_Q4I_ROWS + r) * nb + b];
                uint8_t *q = d + 8 + 16 * r;
                memset(q, 0, 16);
                for (int32_t i = 0; i < COLIBRI_QK4; i++) {
                    const uint8_t byte = blk->qs[i & 15];
                    const uint8_t v = (uint8_t)((i < 16) ? (byte & 0x0Fu) : (byte >> 4));
                    const int32_t slot = colibri_q4r4_slot(i);
                    q[slot / 2] |= (uint8_t)((slot & 1) ? (v << 4) : v);
                }
            }
            d += COLIBRI_Q4R4_BYTES;
        }
    }
    const size_t rest = (size_t)groups * COLIBRI_Q4I_ROWS * (size_t)nb;
    memcpy(d, src + rest, (size_t)(n_out % COLIBRI_Q4I_ROWS) * (size_t)nb * sizeof *src);
}

/* One shape with whole blocks: colibri_qi_q4_q8_q4r4 on the Q4R4 copy against the library. */
static uint32_t qk_check_q4r4(int32_t n_out, int32_t n_in, uint32_t *checks)
{
    uint8_t *stored = (uint8_t *)(void *)qk_r4; /* 30 rows x 8 blocks fit its 8 KB */
    qk_to_q4r4(qk_q4, stored, n_out, n_in);
    colibri_matvec_q4_q8(qk_q4, qk_xq, qk_sx, qk_y0, n_out, n_in);
    colibri_qi_q4_q8_q4r4(stored, qk_xq, qk_sx, qk_y1, n_out, n_in);
    *checks += 1u;
    return memcmp(qk_y0, qk_y1, (size_t)n_out * sizeof(float)) != 0;
}

/* One shape, 1..QK_TOK tokens: the multi-token R4 kernel against the library's matmul (the R4
 * matrix already in qk_r4); rows strided by n_out + 1, the gaps must stay untouched. */
static uint32_t qk_check_mm(int32_t n_out, int32_t n_in, uint32_t *checks)
{
    uint32_t failed = 0;
    const int32_t ldy = n_out + 1;
    for (int blocked = 0; blocked < 2; blocked++) {
        for (int32_t n_tok = 1; n_tok <= QK_TOK; n_tok++) {
            for (size_t i = 0; i < sizeof qk_ym0 / sizeof qk_ym0[0]; i++) {
                qk_ym0[i] = -1.0f;
                qk_ym1[i] = -1.0f;
            }
            if (blocked) {
                colibri_matmul_q8b_q8(qk_w, qk_scale, qk_xqm, qk_sxm, qk_ym0, ldy, n_out, n_in,
                                      n_tok);
            } else {
                colibri_matmul_q8_q8(qk_w, qk_scale, qk_xqm, qk_sxm, qk_ym0, ldy, n_out, n_in,
                                     n_tok);
            }
            colibri_qi_mm_q8_q8_r4(qk_r4, qk_scale, qk_xqm, qk_sxm, qk_ym1, ldy, n_out, n_in, n_tok,
                                   blocked);
            *checks += 1u;
            failed += memcmp(qk_ym0, qk_ym1, sizeof qk_ym0) != 0;
        }
    }
    return failed;
}

/* Layout R4 in qk_r4 into layout R4P in place: in the groups, every odd-indexed code c[2j+1]
 * stored as c[2j+1] - (c[2j] < 0) (colibri_qinline.h). */
static void qk_r4_to_r4p(int32_t n_out, int32_t n_in)
{
    const size_t n = (size_t)(n_out / COLIBRI_R4_ROWS) * COLIBRI_R4_ROWS * (size_t)n_in;
    for (size_t i = 0; i < n; i += 2) {
        qk_r4[i + 1] = (int8_t)(qk_r4[i + 1] - (qk_r4[i] < 0));
    }
}

/* One shape of whole blocks: the R4P kernels (one token; 1..QK_TOK tokens, rows strided by
 * n_out + 1, the gaps untouched) against the library's, both scale layouts. */
static uint32_t qk_check_r4p(int32_t n_out, int32_t n_in, uint32_t *checks)
{
    uint32_t failed = 0;
    const int32_t ldy = n_out + 1;
    qk_to_r4(qk_w, qk_r4, n_out, n_in);
    qk_r4_to_r4p(n_out, n_in);
    for (int blocked = 0; blocked < 2; blocked++) {
        if (blocked) {
            colibri_matvec_q8b_q8(qk_w, qk_scale, qk_xq, qk_sx, qk_y0, n_out, n_in);
        } else {
            colibri_matvec_q8_q8(qk_w, qk_scale, qk_xq, qk_sx, qk_y0, n_out, n_in);
        }
        colibri_qi_q8_q8_r4p(qk_r4, qk_scale, qk_xq, qk_sx, qk_y1, n_out, n_in, blocked);
        *checks += 1u;
        failed += memcmp(qk_y0, qk_y1, (size_t)n_out * sizeof(float)) != 0;
        for (int32_t n_tok = 1; n_tok <= QK_TOK; n_tok++) {
            for (size_t i = 0; i < sizeof qk_ym0 / sizeof qk_ym0[0]; i++) {
                qk_ym0[i] = -1.0f;
                qk_ym1[i] = -1.0f;
            }
            if (blocked) {
                colibri_matmul_q8b_q8(qk_w, qk_scale, qk_xqm, qk_sxm, qk_ym0, ldy, n_out, n_in,
                                      n_tok);
            } else {
                colibri_matmul_q8_q8(qk_w, qk_scale, qk_xqm, qk_sxm, qk_ym0, ldy, n_out, n_in,
                                     n_tok);
            }
            colibri_qi_mm_q8_q8_r4p(qk_r4, qk_scale, qk_xqm, qk_sxm, qk_ym1, ldy, n_out, n_in,
                                    n_tok, blocked);
            *checks += 1u;
            failed += memcmp(qk_ym0, qk_ym1, sizeof qk_ym0) != 0;
            if (!blocked) {
                /* + bias (qk_x: both signs), then relu, on each output row: the library's rows
                 * then a generated relu kernel's loops */
                for (int32_t t = 0; t < n_tok; t++) {
                    float *yt = qk_ym0 + (size_t)t * (size_t)ldy;
                    for (int32_t o = 0; o < n_out; o++) {
                        yt[o] = yt[o] + qk_x[o];
                        yt[o] = yt[o] > 0.0f ? yt[o] : 0.0f;
                    }
                }
                colibri_qi_mm_q8_q8_r4p_act(qk_r4, qk_scale, qk_xqm, qk_sxm, qk_ym1, ldy, n_out,
                                            n_in, n_tok, qk_x, 1);
                *checks += 1u;
                failed += memcmp(qk_ym0, qk_ym1, sizeof qk_ym0) != 0;
            }
        }
    }
    return failed;
}

/* One int4 shape, 1..QK_TOK tokens: the multi-token int4 kernels against the library's
 * colibri_matmul_q4_q8, colibri_qi_mm_q4_q8 on the plain blocks and (whole blocks)
 * colibri_qi_mm_q4_q8_q4r4 on their Q4R4 copy; rows strided by n_out + 1, the gaps untouched. */
static uint32_t qk_check_mm_q4(int32_t n_out, int32_t n_in, uint32_t *checks)
{
    uint32_t failed = 0;
    const int32_t ldy = n_out + 1;
    uint8_t *stored = (uint8_t *)(void *)qk_r4;
    const int q4r4 = n_in % COLIBRI_QK4 == 0;
    if (q4r4) {
        qk_to_q4r4(qk_q4, stored, n_out, n_in);
    }
    for (int32_t n_tok = 1; n_tok <= QK_TOK; n_tok++) {
        for (int layout = 0; layout < 1 + q4r4; layout++) {
            for (size_t i = 0; i < sizeof qk_ym0 / sizeof qk_ym0[0]; i++) {
                qk_ym0[i] = -1.0f;
                qk_ym1[i] = -1.0f;
            }
            colibri_matmul_q4_q8(qk_q4, qk_xqm, qk_sxm, qk_ym0, ldy, n_out, n_in, n_tok);
            if (layout) {
                colibri_qi_mm_q4_q8_q4r4(stored, qk_xqm, qk_sxm, qk_ym1, ldy, n_out, n_in, n_tok);
            } else {
                colibri_qi_mm_q4_q8(qk_q4, qk_xqm, qk_sxm, qk_ym1, ldy, n_out, n_in, n_tok);
            }
            *checks += 1u;
            failed += memcmp(qk_ym0, qk_ym1, sizeof qk_ym0) != 0;
        }
    }
    return failed;
}

/* One row of n values: the inline quantiser against the library's. */
static uint32_t qk_check_quant(int32_t n, uint32_t *checks)
{
    colibri_quantize_row_q8(qk_x, qk_xq, qk_sx, n);
    colibri_qi_quantize_row(qk_x, qk_xq2, qk_sx2, n);
    *checks += 1u;
    return memcmp(qk_xq, qk_xq2, (size_t)n) != 0 ||
           memcmp(qk_sx, qk_sx2, COLIBRI_Q8_BLOCKS(n) * sizeof(float)) != 0;
}

/* colibri_qi_relu_row on qk_x's first n values (the first 8 replaced by NaNs of both signs, a
 * signalling NaN, infinities, zeros and the smallest subnormal) against v > 0 ? v : 0. */
static uint32_t qk_check_relu(int32_t n, uint32_t *checks)
{
    static const uint32_t special[] = {0xFFC00000u, 0x7FC00001u, 0x7F800001u, 0x7F800000u,
                                       0xFF800000u, 0x80000000u, 0x00000000u, 0x00000001u};
    for (int32_t i = 0; i < n; i++) {
        const float v = (i < 8) ? qk_bits(special[i]) : qk_x[i];
        qk_y0[i] = v > 0.0f ? v : 0.0f;
        qk_y1[i] = v;
    }
    colibri_qi_relu_row(qk_y1, n);
    *checks += 1u;
    return memcmp(qk_y0, qk_y1, (size_t)n * sizeof(float)) != 0;
}

static uint32_t qk_quant_cases(uint32_t *checks)
{
    uint32_t failed = 0;
    for (int32_t kind = 0; kind < 10; kind++) {
        for (int32_t i = 0; i < QK_ROW; i++) {
            float v = qk_unit() * 8.0f;
            if (kind == 1) { /* exact halves of the 127 / amax grid: v * 127 / 127 */
                v = ((float)(int32_t)(qk_next() % 255u) - 127.0f + 0.5f) * (1.0f / 127.0f);
            } else if (kind == 2) {
                v = (i % 5 == 0) ? 0.0f : -0.0f;
            } else if (kind == 3) { /* subnormals beside normal values */
                v = (i % 2) ? qk_bits(qk_next() & 0x807FFFFFu) : qk_unit() * 1e-30f;
            } else if (kind == 4) { /* tiny blocks: max |x| around 2^-100 and below */
                v = qk_unit() * qk_bits(0x0D800000u + (qk_next() % 3u) * 0x00800000u - 0x00800000u);
            } else if (kind == 5) {
                v = qk_unit() * 3.0e38f;
            } else if (kind == 6 && i % 37 == 0) {
                v = qk_bits(0x7FC00000u); /* NaN */
            } else if (kind == 7 && i % 41 == 0) {
                v = (i % 2) ? qk_bits(0x7F800000u) : qk_bits(0xFF800000u); /* +-inf */
            } else if (kind == 8) { /* one dominant value per block */
                v = (i % 32 == 7) ? 1000.0f : qk_unit();
            }
            qk_x[i] = v;
        }
        failed += qk_check_quant(QK_ROW, checks);
        failed += qk_check_quant(QK_ROW - 5, checks); /* a partial last block */
        failed += qk_check_quant(13, checks);
        failed += qk_check_relu(QK_FF - 3, checks); /* n <= QK_FF */
    }
    return failed;
}

/* The bench calls, one function each (as a generated expert kernel is): constant shapes. */
__attribute__((noinline)) static void qk_bench_library(void)
{
    colibri_matvec_q8_q8(qk_w, qk_scale, qk_xq, qk_sx, qk_y0, QK_FF, QK_D);
    colibri_matvec_q8_q8(qk_w, qk_scale, qk_xq, qk_sx, qk_y1, QK_D, QK_FF);
}

__attribute__((noinline)) static void qk_bench_r4(void)
{
    colibri_qi_q8_q8_r4(qk_w, qk_scale, qk_xq, qk_sx, qk_y0, QK_FF, QK_D, 0);
    colibri_qi_q8_q8_r4(qk_w, qk_scale, qk_xq, qk_sx, qk_y1, QK_D, QK_FF, 0);
}

__attribute__((noinline)) static void qk_bench_q4(int inline_kernel)
{
    const colibri_block_q4_32 *w2 = qk_q4; /* the same blocks, read as [QK_D][QK_FF] */
    if (inline_kernel) {
        colibri_qi_q4_q8(qk_q4, qk_xq, qk_sx, qk_y0, QK_FF, QK_D);
        colibri_qi_q4_q8(w2, qk_xq, qk_sx, qk_y1, QK_D, QK_FF);
    } else {
        colibri_matvec_q4_q8(qk_q4, qk_xq, qk_sx, qk_y0, QK_FF, QK_D);
        colibri_matvec_q4_q8(w2, qk_xq, qk_sx, qk_y1, QK_D, QK_FF);
    }
}

__attribute__((noinline)) static void qk_bench_q4r4(void)
{
    const uint8_t *w = (const uint8_t *)(const void *)qk_q4; /* random bytes: a Q4R4 matrix */
    colibri_qi_q4_q8_q4r4(w, qk_xq, qk_sx, qk_y0, QK_FF, QK_D);
    colibri_qi_q4_q8_q4r4(w, qk_xq, qk_sx, qk_y1, QK_D, QK_FF);
}

__attribute__((noinline)) static void qk_bench_mm(void)
{
    /* every token's output row at y (ldy 0: RAM is short on the small boards; where the
     * rows go does not change the count) */
    colibri_qi_mm_q8_q8_r4(qk_w, qk_scale, qk_xqm, qk_sxm, qk_y0, 0, QK_FF, QK_D, QK_BENCH_TOK, 0);
    colibri_qi_mm_q8_q8_r4(qk_w, qk_scale, qk_xqm, qk_sxm, qk_y1, 0, QK_D, QK_FF, QK_BENCH_TOK, 0);
}

/* The output stride of qk_bench_mm_q4: 0 (RAM is short), but unknown to the compiler, which
 * could otherwise drop all but the last token's stores and the work behind them. */
static volatile int32_t qk_ldy0 = 0;

__attribute__((noinline)) static void qk_bench_mm_q4(int q4r4)
{
    /* as qk_bench_mm: QK_BENCH_TOK tokens, every token's output row at y */
    const int32_t ldy = qk_ldy0;
    if (q4r4) {
        const uint8_t *w = (const uint8_t *)(const void *)qk_q4;
        colibri_qi_mm_q4_q8_q4r4(w, qk_xqm, qk_sxm, qk_y0, ldy, QK_FF, QK_D, QK_BENCH_TOK);
        colibri_qi_mm_q4_q8_q4r4(w, qk_xqm, qk_sxm, qk_y1, ldy, QK_D, QK_FF, QK_BENCH_TOK);
    } else {
        colibri_qi_mm_q4_q8(qk_q4, qk_xqm, qk_sxm, qk_y0, ldy, QK_FF, QK_D, QK_BENCH_TOK);
        colibri_qi_mm_q4_q8(qk_q4, qk_xqm, qk_sxm, qk_y1, ldy, QK_D, QK_FF, QK_BENCH_TOK);
    }
}

__attribute__((noinline)) static void qk_bench_quant(int inline_kernel)
{
    if (inline_kernel) {
        colibri_qi_quantize_row(qk_x, qk_xq, qk_sx, QK_D);
        colibri_qi_quantize_row(qk_x + QK_D, qk_xq + QK_D, qk_sx + QK_D / 32, QK_FF);
    } else {
        colibri_quantize_row_q8(qk_x, qk_xq, qk_sx, QK_D);
        colibri_quantize_row_q8(qk_x + QK_D, qk_xq + QK_D, qk_sx + QK_D / 32, QK_FF);
    }
}

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    clb_platform_init();
    static const int32_t outs[] = {4, 5, 6, 7, 8, 13, 30};
    static const int32_t ins[] = {16, 32, 48, 64, 128, 256};
    uint32_t checks = 0;
    uint32_t failed = 0;
    for (int round = 0; round < 5; round++) {
        qk_fill(round == 2);
        if (round >= 3) { /* the Helium paths' guard: both sides of it */
            qk_fill_scales(round - 3);
        }
        for (size_t a = 0; a < sizeof outs / sizeof outs[0]; a++) {
            for (size_t b = 0; b < sizeof ins / sizeof ins[0]; b++) {
                failed += qk_check_r4(outs[a], ins[b], &checks);
                failed += qk_check_mm(outs[a], ins[b], &checks);
                if (ins[b] % COLIBRI_QK8 == 0) {
                    failed += qk_check_r4p(outs[a], ins[b], &checks);
                }
            }
        }
    }
    static const int32_t ins4[] = {16, 32, 40, 64, 96, 100, 128, 256};
    for (int round = 0; round < 5; round++) {
        qk_fill(round == 4); /* the last round: activations all -127 */
        qk_fill_q4(sizeof qk_q4 / sizeof qk_q4[0], round >= 3, round % 3);
        for (size_t a = 0; a < sizeof outs / sizeof outs[0]; a++) {
            for (size_t b = 0; b < sizeof ins4 / sizeof ins4[0]; b++) {
                failed += qk_check_q4(outs[a], ins4[b], &checks);
                if (ins4[b] % COLIBRI_QK4 == 0) {
                    failed += qk_check_q4r4(outs[a], ins4[b], &checks);
                }
                failed += qk_check_mm_q4(outs[a], ins4[b], &checks);
            }
        }
    }
    failed += qk_quant_cases(&checks);

    uint8_t mode = 0xFFu;
    const int32_t fd = clb_platform_open("input.bin", CLB_PLATFORM_READ);
    if (fd >= 0) {
        if (clb_platform_read(fd, &mode, 1) != 1) {
            mode = 0xFFu;
        }
        (void)clb_platform_close(fd);
    }
    qk_fill(0); /* random bytes: as valid an R4 matrix as a row-major one */
    qk_fill_q4(sizeof qk_q4 / sizeof qk_q4[0], 0, 0);
    for (int32_t i = 0; i < QK_ROW; i++) {
        qk_x[i] = qk_unit() * 4.0f;
    }
    clb_platform_bench_begin();
    if (mode == 0u) {
        qk_bench_library();
    } else if (mode == 1u) {
        qk_bench_r4();
    } else if (mode == 2u || mode == 3u) {
        qk_bench_quant(mode == 3u);
    } else if (mode == 4u || mode == 5u) {
        qk_bench_q4(mode == 5u);
    } else if (mode == 6u) {
        qk_bench_q4r4();
    } else if (mode == 7u) {
        qk_bench_mm();
    } else if (mode == 8u || mode == 9u) {
        qk_bench_mm_q4(mode == 9u);
    }
    clb_platform_bench_end();

    char line[96];
    char *p = clb_append(line, "colibri qkernels: ");
    p = clb_append_u32(p, checks);
    p = clb_append(p, " checks, ");
    p = clb_append_u32(p, failed);
    p = clb_append(p, " failed\n");
    *p = '\0';
    clb_platform_puts(line);
    return failed == 0u ? 0 : 1;
}
