/**
 * @file refkernels_tiles.c
 * @brief The refkernels self-test's second half: every tile of runtime_c/tiles that generated
 *        expert kernels call (the inline-assembly, Helium and SIMD32 paths of colibri_qi_*.h,
 *        colibri_qinline_q4.h and colibri_qinline_f.h as this board compiles them, or their C
 *        paths) against its portable twin of colibri_qi_ref.c, bit for bit, on seeded random
 *        shapes: n_out 1..RT_OUT (tails of 1..3 rows after the groups of 4, several row chunks
 *        of the multi-token passes on the larger boards), 1..9 tokens, every n_in the layout
 *        allows (R4: each multiple of 16 up to RT_IN; R4P and Q4R4: each multiple of 32, two
 *        chunks of 256 at the largest; plain int4: any n_in; c8: n_out 1..16 and n_in 1..60, tails
 * included), extreme codes (-128 / 127 for R4, -127 / 127 for R4P and the activations, nibbles 0
 *        and 15, subnormal and large fp16 scales), activation scales on both sides of Helium's
 *        guard (colibri_qi_mve_scales_ok) and zero or tiny weight scales, + bias and relu
 *        rows with NaNs, infinities and signed zeros, and the quantiser on zero, tiny,
 *        subnormal, exact-half, NaN and infinite blocks. The twins are also checked against
 *        the library's portable kernels (kernels_q_ref.c) on the row-major matrix, so the
 *        twins, the test's own layout packing and the library agree.
 */
#include "colibri_qi_ref.h"
#include "colibri_qinline.h"
#include "colibri_qinline_f.h"
#include "colibri_quant.h"
#include "refkernels.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__ARM_ARCH_7M__) /* the Cortex-M3's 64 KB of RAM: fewer rows */
#define RT_OUT 13
#else
#define RT_OUT 37 /* more than COLIBRI_QI_RC (32) rows: two row chunks of the M4's passes */
#endif
#define RT_IN 288 /* R4P: two chunks (COLIBRI_QI_R4P_CHUNK 256) */
#define RT_TOK 9
#define RT_SHAPES 18
#define RT_NB ((RT_IN + 31) / 32)
#define RT_LDY (RT_OUT + 2)
#define RT_FOUT 16 /* the float tiles */
#define RT_FIN 64

static _Alignas(16) int8_t rt_wq[RT_OUT * RT_IN];
static _Alignas(16) uint8_t rt_stored[RT_OUT * RT_IN];
static colibri_block_q4_32 rt_w4[RT_OUT * RT_NB];
static float rt_scale[RT_OUT * RT_NB];
static float rt_bias[RT_OUT + RT_FOUT]; /* the int and the float tiles' rows */
static _Alignas(16) int8_t rt_xq[RT_TOK * RT_IN];
static int8_t rt_xq2[RT_IN];
static float rt_sx[RT_TOK * RT_NB];
static float rt_sx2[RT_NB];
static float rt_x[RT_IN];
static float rt_y[RT_TOK * RT_LDY];
static float rt_yref[RT_TOK * RT_LDY];
static float rt_wf[RT_FOUT * RT_FIN];
static _Alignas(16) float rt_wc[RT_FOUT * RT_FIN];
static _Alignas(16) uint16_t rt_wh[RT_FOUT * RT_FIN];
static _Alignas(16) uint16_t rt_whc[RT_FOUT * RT_FIN];

/* The summation orders of colibri_qinline_f.h on this core. */
#if defined(COLIBRI_QF_MVE) || defined(COLIBRI_QF_VFP)
#define RT_C8_ORDER COLIBRI_QF_REF_FUSED
#else
#define RT_C8_ORDER COLIBRI_QF_REF_PLAIN
#endif
#if defined(COLIBRI_QF_VFP) /* fp16 c8: fused on the M4 / M7 only (Helium runs the C loop) */
#define RT_C8H_ORDER COLIBRI_QF_REF_FUSED
#else
#define RT_C8H_ORDER COLIBRI_QF_REF_PLAIN
#endif
#if defined(COLIBRI_QF_MVE)
#define RT_F16_ORDER COLIBRI_QF_REF_LANES4
#elif defined(COLIBRI_QF_XTENSA)
#define RT_F16_ORDER COLIBRI_QF_REF_FUSED
#else
#define RT_F16_ORDER COLIBRI_QF_REF_PLAIN
#endif

const char *rk_tiles_paths(void)
{
#if defined(COLIBRI_QI_MVE)
#define RT_INT "int helium"
#elif defined(COLIBRI_QI_SIMD32) && defined(COLIBRI_QI_VFP)
#define RT_INT "int simd32+vfp"
#elif defined(COLIBRI_QI_SIMD32)
#define RT_INT "int simd32"
#else
#define RT_INT "int c"
#endif
#if defined(COLIBRI_QF_MVE)
#define RT_FLOAT "float helium"
#elif defined(COLIBRI_QF_VFP)
#define RT_FLOAT "float vfp"
#elif defined(COLIBRI_QF_XTENSA)
#define RT_FLOAT "float xtensa-fpu"
#else
#define RT_FLOAT "float c"
#endif
    return RT_INT ", " RT_FLOAT;
}

static float rt_from_bits(uint32_t b)
{
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* Tokens' output rows at stride RT_LDY: both buffers to the same filler first. */
static void rt_clear(void)
{
    for (int32_t i = 0; i < RT_TOK * RT_LDY; i++) {
        rt_y[i] = -7.0f;
        rt_yref[i] = -7.0f;
    }
}

static void rt_rows(const char *tile, int32_t n_out, int32_t n_tok)
{
    for (int32_t t = 0; t < n_tok; t++) {
        rk_floats(tile, rt_y + (size_t)t * RT_LDY, rt_yref + (size_t)t * RT_LDY, n_out);
    }
}

/* An activation scale: kind 2 mixes values outside Helium's guard [2^-60, 2^60] (and at its
 * bounds) among normal ones; else 0.001 .. 0.05, now and then 0. */
static float rt_act_scale(int32_t kind)
{
    static const uint32_t edge[] = {0x21800000u, 0x5D800000u, 0x217FFFFFu,
                                    0x5D800001u, 0x1F000000u, 0x5E000000u};
    const uint32_t r = rk_next();
    if (kind == 2 && r % 4u == 0u) {
        return rt_from_bits(edge[(r >> 8) % (sizeof edge / sizeof edge[0])]);
    }
    return (r % 29u == 0u) ? 0.0f : 0.001f + 0.0245f * (rk_float() + 1.0f);
}

/* Operands of one shape (kind 0 random, 1 extreme codes, 2 extreme scales). */
static void rt_fill(int32_t n_out, int32_t n_in, int32_t n_tok, int32_t kind)
{
    for (int32_t i = 0; i < n_out * n_in; i++) {
        const uint32_t r = rk_next();
        rt_wq[i] = (kind == 1) ? (int8_t)((r & 1u) ? 127 : ((r & 2u) ? -128 : -127))
                               : (int8_t)((int32_t)(r % 255u) - 127);
    }
    for (int32_t i = 0; i < n_tok * n_in; i++) {
        const uint32_t r = rk_next();
        rt_xq[i] =
            (kind == 1) ? (int8_t)((r & 1u) ? 127 : -127) : (int8_t)((int32_t)(r % 255u) - 127);
    }
    const int32_t nb = (n_in + 31) / 32;
    for (int32_t i = 0; i < n_tok * nb; i++) {
        rt_sx[i] = rt_act_scale(kind);
    }
    static const uint32_t wedge[] = {0x00000000u, 0x0D800000u, 0x3F800000u};
    for (int32_t i = 0; i < n_out * nb; i++) {
        const uint32_t r = rk_next();
        rt_scale[i] = (kind == 2 && r % 4u == 0u) ? rt_from_bits(wedge[(r >> 8) % 3u])
                                                  : 0.002f + 0.009f * (rk_float() + 1.0f);
    }
    for (int32_t o = 0; o < RT_OUT + RT_FOUT; o++) {
        rt_bias[o] = 0.05f * rk_float();
    }
    /* int4 blocks: random bytes, or nibbles all 0 / all 15 / mixed; fp16 scales ~2^-7, or
     * (extremes) subnormal, 1.0 and 1024 */
    static const uint8_t nib[4] = {0x00u, 0xFFu, 0x0Fu, 0xF0u};
    static const uint16_t dedge[4] = {0x0001u, 0x03FFu, 0x3C00u, 0x6400u};
    for (int32_t i = 0; i < n_out * nb; i++) {
        const uint32_t r = rk_next();
        for (int32_t j = 0; j < 16; j++) {
            rt_w4[i].qs[j] =
                (kind == 1) ? nib[(r + (uint32_t)j / 4u) % 4u] : (uint8_t)(rk_next() >> 24);
        }
        rt_w4[i].d = (kind != 0 && (r >> 8) % 3u == 0u) ? dedge[(r >> 12) % 4u]
                                                        : (uint16_t)(0x2000u + (rk_next() >> 22));
    }
}

/* Row-major codes [n_out][n_in] into layout R4 (formats.py r4_order) or R4P (r4p_order: the odd
 * codes of the grouped rows less (even code < 0)) at rt_stored. */
static void rt_pack_r4(int32_t n_out, int32_t n_in, int corrected)
{
    int8_t *dst = (int8_t *)(void *)rt_stored;
    const int32_t grouped = n_out / 4 * 4;
    size_t k = 0;
    for (int32_t g = 0; g < grouped; g += 4) {
        for (int32_t c = 0; c < n_in; c += 16) {
            for (int32_t r = 0; r < 4; r++) {
                const int8_t *row = rt_wq + (size_t)(g + r) * (size_t)n_in + (size_t)c;
                for (int32_t j = 0; j < 16; j++) {
                    int32_t v = row[j];
                    if (corrected && (j & 1) && row[j - 1] < 0) {
                        v -= 1;
                    }
                    dst[k++] = (int8_t)v;
                }
            }
        }
    }
    memcpy(dst + k, rt_wq + k, (size_t)(n_out - grouped) * (size_t)n_in);
}

/* Plain int4 blocks [n_out][n_in / 32] into layout Q4R4 (formats.py q4r4_order) at rt_stored. */
static void rt_pack_q4r4(int32_t n_out, int32_t n_in)
{
    static const uint8_t weight_of_slot[8] = {0, 1, 4, 5, 2, 3, 6, 7};
    const int32_t nb = n_in / 32;
    const int32_t grouped = n_out / 4 * 4;
    uint8_t *d = rt_stored;
    for (int32_t g = 0; g < grouped; g += 4) {
        for (int32_t b = 0; b < nb; b++) {
            for (int32_t r = 0; r < 4; r++) {
                const colibri_block_q4_32 *blk = &rt_w4[(size_t)(g + r) * (size_t)nb + (size_t)b];
                d[2 * r] = (uint8_t)(blk->d & 0xFFu);
                d[2 * r + 1] = (uint8_t)(blk->d >> 8);
                uint8_t *qs = d + 8 + 16 * r;
                memset(qs, 0, 16);
                for (int32_t slot = 0; slot < 32; slot++) {
                    const int32_t wi = (slot & ~7) + weight_of_slot[slot & 7];
                    const uint8_t byte = blk->qs[wi % 16];
                    const uint8_t v = (wi < 16) ? (byte & 0x0Fu) : (uint8_t)(byte >> 4);
                    qs[slot / 2] |= (uint8_t)((slot & 1) ? v << 4 : v);
                }
            }
            d += 72;
        }
    }
    memcpy(d, &rt_w4[(size_t)grouped * (size_t)nb],
           (size_t)(n_out - grouped) * (size_t)nb * sizeof(colibri_block_q4_32));
}

/* Plain int4 blocks [n_out][n_in / 32] into layout Q4H4 (formats.py q4h4_order) at rt_stored:
 * Q4R4's groups with each row's 16 bytes of nibbles as they are. */
static void rt_pack_q4h4(int32_t n_out, int32_t n_in)
{
    const int32_t nb = n_in / 32;
    const int32_t grouped = n_out / 4 * 4;
    uint8_t *d = rt_stored;
    for (int32_t g = 0; g < grouped; g += 4) {
        for (int32_t b = 0; b < nb; b++) {
            for (int32_t r = 0; r < 4; r++) {
                const colibri_block_q4_32 *blk = &rt_w4[(size_t)(g + r) * (size_t)nb + (size_t)b];
                d[2 * r] = (uint8_t)(blk->d & 0xFFu);
                d[2 * r + 1] = (uint8_t)(blk->d >> 8);
                memcpy(d + 8 + 16 * r, blk->qs, 16);
            }
            d += 72;
        }
    }
    memcpy(d, &rt_w4[(size_t)grouped * (size_t)nb],
           (size_t)(n_out - grouped) * (size_t)nb * sizeof(colibri_block_q4_32));
}

/* The quantiser on rt_x (n values), tile, twin and library. */
static void rt_quantize(int32_t n)
{
    const int32_t nb = (n + 31) / 32;
    colibri_qi_quantize_row(rt_x, rt_xq2, rt_sx2, n);
    colibri_qi_quantize_row_ref(rt_x, rt_xq, rt_sx, n);
    for (int32_t i = 0; i < n; i++) {
        rk_int("qi_quantize_row codes", i, rt_xq2[i], rt_xq[i]);
    }
    rk_floats("qi_quantize_row scales", rt_sx2, rt_sx, nb);
    /* the out-of-line copy generated kernels call (colibri_qi_shared.h), padded with zero codes
     * to the next multiple of 32 (rt_xq2 first filled with nonzero codes) */
    const int32_t width = 32 * nb;
    memset(rt_xq2, 0x55, sizeof rt_xq2);
    colibri_qs_quantize_row_pad(rt_x, rt_xq2, rt_sx2, n, width);
    for (int32_t i = 0; i < width; i++) {
        rk_int("qs_quantize_row_pad codes", i, rt_xq2[i], i < n ? rt_xq[i] : 0);
    }
    rk_floats("qs_quantize_row_pad scales", rt_sx2, rt_sx, nb);
    colibri_quantize_row_q8_ref(rt_x, rt_xq2, rt_sx2, n);
    for (int32_t i = 0; i < n; i++) {
        rk_int("qi_quantize_row_ref vs library codes", i, rt_xq[i], rt_xq2[i]);
    }
    rk_floats("qi_quantize_row_ref vs library scales", rt_sx, rt_sx2, nb);
}

/* Rows for the quantiser: random, or per block one kind of extreme (zeros, tiny, subnormals
 * beside a normal value, exact halves, a NaN, an infinity, huge values). */
static void rt_check_quantiser(int32_t n, int32_t kind)
{
    for (int32_t i = 0; i < n; i++) {
        rt_x[i] = 4.0f * rk_float();
        if (kind == 0) {
            continue;
        }
        const int32_t b = i / 32;
        switch ((b + kind) % 8) {
        case 0:
            rt_x[i] = 0.0f;
            break;
        case 1:
            rt_x[i] *= 0x1p-110f;
            break;
        case 2:
            rt_x[i] = (i % 32 == 5) ? 1.0f : rt_from_bits(rk_next() & 0x807FFFFFu);
            break;
        case 3:
            rt_x[i] = (i % 32 == 0) ? 127.0f : (float)((int32_t)(rk_next() % 254u) - 127) + 0.5f;
            break;
        case 4:
            rt_x[i] = (i % 32 == 7) ? NAN : rt_x[i];
            break;
        case 5:
            rt_x[i] = (i % 32 == 3) ? -INFINITY : rt_x[i];
            break;
        case 6:
            rt_x[i] *= 0x1p100f;
            break;
        default:
            break;
        }
    }
    rt_quantize(n);
}

/* The R4 and R4P tiles on codes rt_wq (R4P: -128 made -127 first). */
static void rt_check_q8(int32_t n_out, int32_t n_in, int32_t n_tok, int r4p)
{
    if (r4p) {
        for (int32_t i = 0; i < n_out * n_in; i++) {
            rt_wq[i] = (rt_wq[i] == -128) ? (int8_t)-127 : rt_wq[i];
        }
    }
    rt_pack_r4(n_out, n_in, r4p);
    const int8_t *q = (const int8_t *)(const void *)rt_stored;
    for (int blocked = 0; blocked < 2; blocked++) {
        rt_clear();
        if (r4p) {
            colibri_qi_q8_q8_r4p(q, rt_scale, rt_xq, rt_sx, rt_y, n_out, n_in, blocked);
            colibri_qi_q8_q8_r4p_ref(q, rt_scale, rt_xq, rt_sx, rt_yref, n_out, n_in, blocked);
        } else {
            colibri_qi_q8_q8_r4(q, rt_scale, rt_xq, rt_sx, rt_y, n_out, n_in, blocked);
            colibri_qi_q8_q8_r4_ref(q, rt_scale, rt_xq, rt_sx, rt_yref, n_out, n_in, blocked);
        }
        rk_floats(r4p ? "qi_q8_q8_r4p" : "qi_q8_q8_r4", rt_y, rt_yref, n_out);
        /* the twin against the library's portable kernel on the row-major codes */
        if (blocked) {
            colibri_matvec_q8b_q8_ref(rt_wq, rt_scale, rt_xq, rt_sx, rt_y, n_out, n_in);
        } else {
            colibri_matvec_q8_q8_ref(rt_wq, rt_scale, rt_xq, rt_sx, rt_y, n_out, n_in);
        }
        rk_floats("q8 twin vs library", rt_yref, rt_y, n_out);
        rt_clear();
        if (r4p) {
            colibri_qi_mm_q8_q8_r4p(q, rt_scale, rt_xq, rt_sx, rt_y, RT_LDY, n_out, n_in, n_tok,
                                    blocked);
            colibri_qi_mm_q8_q8_r4p_ref(q, rt_scale, rt_xq, rt_sx, rt_yref, RT_LDY, n_out, n_in,
                                        n_tok, blocked);
        } else {
            colibri_qi_mm_q8_q8_r4(q, rt_scale, rt_xq, rt_sx, rt_y, RT_LDY, n_out, n_in, n_tok,
                                   blocked);
            colibri_qi_mm_q8_q8_r4_ref(q, rt_scale, rt_xq, rt_sx, rt_yref, RT_LDY, n_out, n_in,
                                       n_tok, blocked);
        }
        rt_rows(r4p ? "qi_mm_q8_q8_r4p" : "qi_mm_q8_q8_r4", n_out, n_tok);
    }
    if (r4p) { /* + bias (or none), relu (or none) */
        for (int32_t k = 0; k < 4; k++) {
            const float *bias = (k & 1) ? rt_bias : NULL;
            rt_clear();
            colibri_qi_mm_q8_q8_r4p_act(q, rt_scale, rt_xq, rt_sx, rt_y, RT_LDY, n_out, n_in, n_tok,
                                        bias, k >> 1);
            colibri_qi_mm_q8_q8_r4p_act_ref(q, rt_scale, rt_xq, rt_sx, rt_yref, RT_LDY, n_out, n_in,
                                            n_tok, bias, k >> 1);
            rt_rows("qi_mm_q8_q8_r4p_act", n_out, n_tok);
        }
    }
}

/* The int4 tiles: plain blocks at any n_in, Q4R4 and Q4H4 at n_in32. */
static void rt_check_q4(int32_t n_out, int32_t n_in, int32_t n_in32, int32_t n_tok)
{
    rt_clear();
    colibri_qi_q4_q8(rt_w4, rt_xq, rt_sx, rt_y, n_out, n_in);
    colibri_qi_q4_q8_ref(rt_w4, rt_xq, rt_sx, rt_yref, n_out, n_in);
    rk_floats("qi_q4_q8", rt_y, rt_yref, n_out);
    colibri_matvec_q4_q8_ref(rt_w4, rt_xq, rt_sx, rt_y, n_out, n_in);
    rk_floats("q4 twin vs library", rt_yref, rt_y, n_out);
    rt_clear();
    colibri_qi_mm_q4_q8(rt_w4, rt_xq, rt_sx, rt_y, RT_LDY, n_out, n_in, n_tok);
    colibri_qi_mm_q4_q8_ref(rt_w4, rt_xq, rt_sx, rt_yref, RT_LDY, n_out, n_in, n_tok);
    rt_rows("qi_mm_q4_q8", n_out, n_tok);
    /* Q4R4: the same blocks read as [n_out][n_in32 / 32] */
    rk_shape[1] = n_in32;
    rt_pack_q4r4(n_out, n_in32);
    rt_clear();
    colibri_qi_q4_q8_q4r4(rt_stored, rt_xq, rt_sx, rt_y, n_out, n_in32);
    colibri_qi_q4_q8_q4r4_ref(rt_stored, rt_xq, rt_sx, rt_yref, n_out, n_in32);
    rk_floats("qi_q4_q8_q4r4", rt_y, rt_yref, n_out);
    colibri_matvec_q4_q8_ref(rt_w4, rt_xq, rt_sx, rt_y, n_out, n_in32);
    rk_floats("q4r4 twin vs library", rt_yref, rt_y, n_out);
    rt_clear();
    colibri_qi_mm_q4_q8_q4r4(rt_stored, rt_xq, rt_sx, rt_y, RT_LDY, n_out, n_in32, n_tok);
    colibri_qi_mm_q4_q8_q4r4_ref(rt_stored, rt_xq, rt_sx, rt_yref, RT_LDY, n_out, n_in32, n_tok);
    rt_rows("qi_mm_q4_q8_q4r4", n_out, n_tok);
    /* Q4H4: the same blocks, grouped in the plain nibble order */
    rt_pack_q4h4(n_out, n_in32);
    rt_clear();
    colibri_qi_q4_q8_q4h4(rt_stored, rt_xq, rt_sx, rt_y, n_out, n_in32);
    colibri_qi_q4_q8_q4h4_ref(rt_stored, rt_xq, rt_sx, rt_yref, n_out, n_in32);
    rk_floats("qi_q4_q8_q4h4", rt_y, rt_yref, n_out);
    colibri_matvec_q4_q8_ref(rt_w4, rt_xq, rt_sx, rt_y, n_out, n_in32);
    rk_floats("q4h4 twin vs library", rt_yref, rt_y, n_out);
    rt_clear();
    colibri_qi_mm_q4_q8_q4h4(rt_stored, rt_xq, rt_sx, rt_y, RT_LDY, n_out, n_in32, n_tok);
    colibri_qi_mm_q4_q8_q4h4_ref(rt_stored, rt_xq, rt_sx, rt_yref, RT_LDY, n_out, n_in32, n_tok);
    rt_rows("qi_mm_q4_q8_q4h4", n_out, n_tok);
}

/* relu and bias + relu on rows with special values (NaNs of both signs, a signalling NaN,
 * infinities, signed zeros, the smallest subnormal) among random ones. */
static void rt_check_relu(int32_t n)
{
    static const uint32_t special[] = {0xFFC00000u, 0x7FC00001u, 0x7F800001u, 0x7F800000u,
                                       0xFF800000u, 0x80000000u, 0x00000000u, 0x00000001u};
    for (int32_t i = 0; i < n; i++) {
        const uint32_t r = rk_next();
        rt_y[i] = (r % 5u == 0u) ? rt_from_bits(special[(r >> 8) % 8u]) : rk_float();
        rt_yref[i] = rt_y[i];
    }
    colibri_qi_relu_row(rt_y, n);
    colibri_qi_relu_row_ref(rt_yref, n);
    rk_floats("qi_relu_row", rt_y, rt_yref, n);
    for (int32_t k = 0; k < 4; k++) {
        const int32_t o0 = (int32_t)(rk_next() % (uint32_t)n);
        for (int32_t i = 0; i < n; i++) {
            rt_y[i] = rt_yref[i] = rk_float();
        }
        const float *bias = (k & 1) ? rt_bias : NULL;
        colibri_qi_bias_relu(rt_y, o0, n, bias, k >> 1);
        colibri_qi_bias_relu_ref(rt_yref, o0, n, bias, k >> 1);
        rk_floats("qi_bias_relu", rt_y, rt_yref, n);
    }
}

/* The float tiles: c8 at n_out8 x n_in4 (fp32 and fp16; any shape, tails of outputs after the
 * last block of 8 and of inputs after the last pass of 4 included), the fp16 matvec at any
 * shape. */
static void rt_check_float(int32_t n_out8, int32_t n_in4, int32_t n_outf, int32_t n_inf)
{
    for (int32_t i = 0; i < RT_FOUT * RT_FIN; i++) {
        rt_wf[i] = rk_float();
        const uint32_t r = rk_next(); /* normal fp16 of both signs, exponents 2^-14 .. 2^1, and
                                         subnormals */
        const uint32_t expo = (r & 7u) == 0u ? 0u : 1u + (r >> 8) % 16u;
        rt_wh[i] = (uint16_t)(((r >> 31) << 15) | (expo << 10) | ((r >> 12) & 0x3FFu));
    }
    for (int32_t i = 0; i < RT_FIN; i++) {
        rt_x[i] = 4.0f * rk_float();
    }
    for (int32_t o = 0; o < n_out8; o++) { /* row-major [n_out8][n_in4] into layout c8 */
        const int32_t o0 = o - o % 8;
        const int32_t wd = (n_out8 - o0 < 8) ? n_out8 - o0 : 8; /* the last block's width */
        for (int32_t i = 0; i < n_in4; i++) {
            const size_t at = (size_t)o0 * (size_t)n_in4 + (size_t)i * (size_t)wd + (size_t)(o % 8);
            rt_wc[at] = rt_wf[(size_t)o * (size_t)n_in4 + (size_t)i];
            rt_whc[at] = rt_wh[(size_t)o * (size_t)n_in4 + (size_t)i];
        }
    }
    for (int32_t k = 0; k < 2; k++) {
        const float *b = k ? rt_bias : NULL;
        rt_clear();
        colibri_qf_f32_c8(rt_wc, b, rt_x, rt_y, n_out8, n_in4);
        colibri_qf_f32_c8_ref(rt_wc, b, rt_x, rt_yref, n_out8, n_in4, RT_C8_ORDER);
        rk_floats("qf_f32_c8", rt_y, rt_yref, n_out8);
        colibri_qf_f16_c8(rt_whc, b, rt_x, rt_y, n_out8, n_in4);
        colibri_qf_f16_c8_ref(rt_whc, b, rt_x, rt_yref, n_out8, n_in4, RT_C8H_ORDER);
        rk_floats("qf_f16_c8", rt_y, rt_yref, n_out8);
    }
    rt_clear();
    colibri_qf_f16_f32(rt_wh, rt_x, rt_y, n_outf, n_inf);
    colibri_qf_f16_f32_ref(rt_wh, rt_x, rt_yref, n_outf, n_inf, RT_F16_ORDER);
    rk_floats("qf_f16_f32", rt_y, rt_yref, n_outf);
    colibri_qf_f16_f32_ref(rt_wh, rt_x, rt_yref, n_outf, n_inf, COLIBRI_QF_REF_PLAIN);
    colibri_matvec_f16_f32_ref(rt_wh, rt_x, rt_y, n_outf, n_inf);
    rk_floats("f16 twin vs library", rt_yref, rt_y, n_outf);
}

uint32_t rk_tiles(void)
{
    const uint32_t before = rk_checks;
    for (int32_t s = 0; s < RT_SHAPES; s++) {
        const int32_t kind = s % 3;
        const int32_t n_tok = 1 + s % RT_TOK;
        /* n_out: 1..RT_OUT, all of them on the larger boards at some shape; tails of 0..3 rows */
        int32_t n_out = 1 + (int32_t)(rk_next() % RT_OUT);
        if (s % 4 == 3) {
            n_out = RT_OUT - (s / 4) % 4;
        }
        const int32_t n_in16 = 16 * (1 + s % (RT_IN / 16));    /* every multiple of 16 */
        const int32_t n_in32 = 32 * (1 + s % (RT_IN / 32));    /* every multiple of 32 */
        const int32_t n_in = 1 + (int32_t)(rk_next() % RT_IN); /* plain int4, quantiser */
        rk_shape[0] = n_out;
        rk_shape[1] = n_in16;
        rk_shape[2] = n_tok;
        rt_fill(n_out, RT_IN, n_tok, kind);
        rt_check_q8(n_out, n_in16, n_tok, 0);
        rk_shape[1] = n_in32;
        rt_check_q8(n_out, n_in32, n_tok, 1);
        rk_shape[1] = n_in;
        rt_check_q4(n_out, n_in, n_in32, n_tok);
        rt_check_relu(n_out);
        rt_check_quantiser(n_in, kind);
        rt_check_quantiser(n_in32, s % 8);
        /* c8: every n_out 1..16 and n_in 1, 3, 5, .. 60 over the shapes (whole blocks of 8
           and passes of 4, and their tails) */
        const int32_t n_out8 = 1 + (s * 7) % RT_FOUT;
        const int32_t n_in4 = 1 + (s * 11) % RT_FIN;
        const int32_t n_outf = 1 + (int32_t)(rk_next() % RT_FOUT);
        const int32_t n_inf = 1 + (int32_t)(rk_next() % RT_FIN);
        rk_shape[0] = n_out8;
        rk_shape[1] = n_in4;
        rk_shape[2] = 1;
        rt_check_float(n_out8, n_in4, n_outf, n_inf);
    }
    return rk_checks - before;
}
