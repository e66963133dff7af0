/**
 * @file kernels.c
 * @brief Self-test of the runtime's integer dot products on a board (kernels_q.c: its Helium,
 *        Neon, SIMD32 or portable path, whichever the board's flags select) against the plain
 *        loops below, for every length 0..140, unaligned pointers and extreme values; then the
 *        int4 block dot product for full and partial blocks; then (bench mode 0, or without
 *        input.bin) bit for bit the fp16 conversion of all 65536 bit patterns (a NaN only has to
 *        stay a NaN of the same sign) and the fp16 x fp32, int4 x int8 and int4 x fp32 matvecs
 *        for shapes with row and column tails, products and sums in the fp32 subnormal range
 *        included, against the portable C of kernels_q.c copied below. Prints one line and
 *        returns 0 when every result is identical. The bench markers time one of twelve loops,
 *        chosen by the first byte of input.bin: 0 the runtime's int8 dot (128 values, 8 times),
 *        1 the plain loop, 2 the runtime's int4 block dot (4 blocks, 8 times), 3 its portable
 *        loop (tests/targets/test_platforms.py prints the instruction counts side by side), 4 the
 *        runtime's activation quantiser on KT_QUANT values (a scale per block of 32), 5 the
 *        per-row roundf-and-divide loop it replaced (the same values; outside the checks),
 *        6 / 7 the runtime's / the portable fp16 x fp32 matvec (KT_BO x KT_BI), 8 / 9 the int4 x
 *        int8 matvecs, 10 / 11 the int4 x fp32 matvecs.
 */
#include "colibri_fmt.h"
#include "colibri_platform.h"
#include "colibri_quant.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#define KT_MAX 160
#define KT_BLOCKS 4
#define KT_QUANT 640
/* matvec checks: up to KT_MO rows of up to KT_MI inputs; the bench shape KT_BO x KT_BI */
#define KT_MO 9
#define KT_MI 97
#define KT_BO 8
#define KT_BI 64

static int8_t kt_a[KT_MAX + 4];
static int8_t kt_b[KT_MAX + 4];
static colibri_block_q4_32 kt_blk[KT_BLOCKS];
static float kt_x[KT_QUANT];
static int8_t kt_xq[KT_QUANT];
static float kt_sx[COLIBRI_Q8_BLOCKS(KT_QUANT)];
static uint32_t kt_state = 0x9E3779B9u;
static uint16_t kt_w16[KT_MO * KT_MI];
static colibri_block_q4_32 kt_w4[KT_MO * COLIBRI_Q4_BLOCKS(KT_MI)];
static float kt_xf[KT_MI];
static float kt_y[KT_MO];
static float kt_yref[KT_MO];

static uint32_t kt_next(void)
{
    kt_state ^= kt_state << 13;
    kt_state ^= kt_state >> 17;
    kt_state ^= kt_state << 5;
    return kt_state;
}

/* noinline: the baselines pay a call, as the runtime's kernels do */
__attribute__((noinline)) static int32_t kt_dot_q8(const int8_t *a, const int8_t *b, int32_t n)
{
    int32_t acc = 0;
    for (int32_t i = 0; i < n; i++) {
        acc += (int32_t)a[i] * (int32_t)b[i];
    }
    return acc;
}

static int32_t kt_dot_q4(const colibri_block_q4_32 *blk, const int8_t *x, int32_t n)
{
    int32_t acc = 0;
    for (int32_t j = 0; j < n; j++) {
        const uint32_t byte = blk->qs[j % 16];
        const int32_t q = (int32_t)(j < 16 ? (byte & 0x0Fu) : (byte >> 4)) - 8;
        acc += q * (int32_t)x[j];
    }
    return acc;
}

/** @brief The portable full-block loop of kernels_q.c (the baseline of bench mode 3). */
__attribute__((noinline)) static int32_t kt_dot_q4_block(const colibri_block_q4_32 *blk,
                                                         const int8_t *x)
{
    int32_t acc = 0;
    for (int32_t j = 0; j < 16; j++) {
        const int32_t lo = (int32_t)(blk->qs[j] & 0x0Fu) - 8;
        const int32_t hi = (int32_t)(blk->qs[j] >> 4) - 8;
        acc += lo * (int32_t)x[j] + hi * (int32_t)x[j + 16];
    }
    return acc;
}

/** @brief The portable fp16 conversion of kernels_q.c (the reference of the hardware ones). */
static float kt_f16_to_f32(uint16_t h)
{
    const uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    const uint32_t em = (uint32_t)h & 0x7FFFu;
    uint32_t bits;
    float f;
    if (em >= 0x7C00u) {
        bits = sign | 0x7F800000u | ((em & 0x3FFu) << 13);
        memcpy(&f, &bits, sizeof f);
        return f;
    }
    bits = em << 13;
    memcpy(&f, &bits, sizeof f);
    f *= 5.192296858534828e33f; /* 2^112 */
    memcpy(&bits, &f, sizeof f);
    bits |= sign;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/** @brief The portable fp16 x fp32 matvec (colibri_quant.h order; bench mode 7). */
__attribute__((noinline)) static void kt_matvec_f16(const uint16_t *w, const float *x, float *y,
                                                    int32_t n_out, int32_t n_in)
{
    for (int32_t o = 0; o < n_out; o++) {
        float acc = 0.0f;
        for (int32_t i = 0; i < n_in; i++) {
            acc += kt_f16_to_f32(w[(size_t)o * (size_t)n_in + (size_t)i]) * x[i];
        }
        y[o] = acc;
    }
}

/** @brief The portable int4 x int8 matvec (colibri_quant.h order; bench mode 9). */
__attribute__((noinline)) static void kt_matvec_q4(const colibri_block_q4_32 *w, const int8_t *xq,
                                                   const float *sx, float *y, int32_t n_out,
                                                   int32_t n_in)
{
    const int32_t nb = (int32_t)COLIBRI_Q4_BLOCKS(n_in);
    for (int32_t o = 0; o < n_out; o++) {
        float acc = 0.0f;
        for (int32_t b = 0; b < nb; b++) {
            const colibri_block_q4_32 *blk = &w[o * nb + b];
            const int32_t n = (n_in - b * 32 < 32) ? n_in - b * 32 : 32;
            const int32_t isum =
                (n == 32) ? kt_dot_q4_block(blk, xq + b * 32) : kt_dot_q4(blk, xq + b * 32, n);
            acc += (float)isum * (kt_f16_to_f32(blk->d) * sx[b]);
        }
        y[o] = acc;
    }
}

/** @brief The portable int4 x fp32 matvec (colibri_quant.h order). */
__attribute__((noinline)) static void kt_matvec_q4_f32(const colibri_block_q4_32 *w, const float *x,
                                                       float *y, int32_t n_out, int32_t n_in)
{
    const int32_t nb = (int32_t)COLIBRI_Q4_BLOCKS(n_in);
    for (int32_t o = 0; o < n_out; o++) {
        float acc = 0.0f;
        for (int32_t b = 0; b < nb; b++) {
            const colibri_block_q4_32 *blk = &w[o * nb + b];
            const int32_t n = (n_in - b * 32 < 32) ? n_in - b * 32 : 32;
            float bs = 0.0f;
            for (int32_t j = 0; j < n; j++) {
                const uint32_t byte = blk->qs[j % 16];
                const int32_t q = (int32_t)(j < 16 ? (byte & 0x0Fu) : (byte >> 4)) - 8;
                bs += (float)q * x[b * 32 + j];
            }
            acc += bs * kt_f16_to_f32(blk->d);
        }
        y[o] = acc;
    }
}

/** @brief A random finite fp16 (normals, subnormals and zeros of both signs). */
static uint16_t kt_f16(void)
{
    uint16_t h = (uint16_t)(kt_next() >> 16);
    return ((h & 0x7C00u) == 0x7C00u) ? (uint16_t)(h ^ 0x4000u) : h;
}

/** @brief One matvec check: 1 when y and kt_yref differ in any bit. */
static uint32_t kt_differs(int32_t n_out)
{
    return memcmp(kt_y, kt_yref, (size_t)n_out * sizeof(float)) != 0 ? 1u : 0u;
}

/** @brief The activation quantiser before issue 11: roundf(x / sx) per element (bench mode 5). */
__attribute__((noinline)) static float kt_quantize_roundf(const float *x, int8_t *xq, int32_t n)
{
    float amax = 0.0f;
    for (int32_t i = 0; i < n; i++) {
        const float a = fabsf(x[i]);
        amax = (a > amax) ? a : amax;
    }
    if (amax == 0.0f) {
        for (int32_t i = 0; i < n; i++) {
            xq[i] = 0;
        }
        return 0.0f;
    }
    const float sx = amax / (float)COLIBRI_Q8_MAX;
    for (int32_t i = 0; i < n; i++) {
        float v = roundf(x[i] / sx);
        v = (v > (float)COLIBRI_Q8_MAX) ? (float)COLIBRI_Q8_MAX : v;
        v = (v < -(float)COLIBRI_Q8_MAX) ? -(float)COLIBRI_Q8_MAX : v;
        xq[i] = (int8_t)v;
    }
    return sx;
}

/* -- matvec / matmul paths: every kernel level the CPU has (x86-64: base, AVX2, AVX-VNNI,
 * AVX-512 VNNI; elsewhere the one compiled path) against the base level, row by row, and each
 * multi-token kernel against the matvec of the same row. Shapes with n_in not a multiple of
 * 8 / 32 / 64 and n_out not a multiple of 8; matmuls of KM_TOK, 7, 3 and 1 tokens (x86 AVX2
 * runs tiles of 2..8 tokens and the matvec for one left: 9 = 8 + 1; the VNNI levels tiles of 4
 * and the matvec for the 1-3 left: 9 = 4 + 4 + 1, 7 = 4 + 3). */
#define KM_OUT 17
#define KM_IN 72
#define KM_TOK 9
#define KM_NB ((KM_IN + 31) / 32)
#define KM_KERNELS 8

static float km_wf[KM_OUT * KM_IN];
static uint16_t km_wh[KM_OUT * KM_IN];
static int8_t km_wq[KM_OUT * KM_IN];
static float km_sc[KM_OUT * KM_NB];
static colibri_block_q4_32 km_w4[KM_OUT * KM_NB];
static float km_x[KM_TOK * KM_IN];
static int8_t km_xq[KM_TOK * KM_IN];
static float km_sx[KM_TOK * KM_NB];
static float km_ref[KM_KERNELS][KM_TOK][KM_OUT];
static float km_y[KM_TOK * (KM_OUT + 1)];

static float km_float(void)
{
    return (float)(int32_t)kt_next() * (2.0f / 2147483648.0f);
}

/* Kernel k on token t (matvec) into y. */
static void km_matvec(int32_t k, int32_t t, float *y, int32_t n_out, int32_t n_in)
{
    const int32_t nb = (n_in + 31) / 32;
    const float *x = km_x + t * n_in;
    const int8_t *xq = km_xq + t * n_in;
    const float *sx = km_sx + t * nb;
    switch (k) {
    case 0:
        colibri_matvec_f32(km_wf, x, y, n_out, n_in);
        break;
    case 1:
        colibri_matvec_f16_f32(km_wh, x, y, n_out, n_in);
        break;
    case 2:
        colibri_matvec_q8_f32(km_wq, km_sc, x, y, n_out, n_in);
        break;
    case 3:
        colibri_matvec_q4_f32(km_w4, x, y, n_out, n_in);
        break;
    case 4:
        colibri_matvec_q8b_f32(km_wq, km_sc, x, y, n_out, n_in);
        break;
    case 5:
        colibri_matvec_q8_q8(km_wq, km_sc, xq, sx, y, n_out, n_in);
        break;
    case 6:
        colibri_matvec_q8b_q8(km_wq, km_sc, xq, sx, y, n_out, n_in);
        break;
    default:
        colibri_matvec_q4_q8(km_w4, xq, sx, y, n_out, n_in);
        break;
    }
}

/* Kernel k on the first n_tok tokens (matmul, ldy = n_out + 1) into km_y. */
static void km_matmul(int32_t k, int32_t n_out, int32_t n_in, int32_t n_tok)
{
    const int32_t ldy = n_out + 1;
    switch (k) {
    case 0:
        colibri_matmul_f32(km_wf, NULL, km_x, km_y, ldy, n_out, n_in, n_tok);
        break;
    case 1:
        colibri_matmul_f16_f32(km_wh, km_x, km_y, ldy, n_out, n_in, n_tok);
        break;
    case 2:
        colibri_matmul_q8_f32(km_wq, km_sc, km_x, km_y, ldy, n_out, n_in, n_tok);
        break;
    case 3:
        colibri_matmul_q4_f32(km_w4, km_x, km_y, ldy, n_out, n_in, n_tok);
        break;
    case 4:
        colibri_matmul_q8b_f32(km_wq, km_sc, km_x, km_y, ldy, n_out, n_in, n_tok);
        break;
    case 5:
        colibri_matmul_q8_q8(km_wq, km_sc, km_xq, km_sx, km_y, ldy, n_out, n_in, n_tok);
        break;
    case 6:
        colibri_matmul_q8b_q8(km_wq, km_sc, km_xq, km_sx, km_y, ldy, n_out, n_in, n_tok);
        break;
    default:
        colibri_matmul_q4_q8(km_w4, km_xq, km_sx, km_y, ldy, n_out, n_in, n_tok);
        break;
    }
}

static int km_same(float a, float b)
{
    uint32_t ua;
    uint32_t ub;
    memcpy(&ua, &a, sizeof ua);
    memcpy(&ub, &b, sizeof ub);
    return ua == ub;
}

/* Checks of one shape at every level; the level names that ran are appended to *names. */
static void km_check_shape(int32_t n_out, int32_t n_in, int32_t extremes, uint32_t *checks,
                           uint32_t *failed, uint32_t *levels)
{
    const int32_t nb = (n_in + 31) / 32;
    for (int32_t i = 0; i < n_out * n_in; i++) {
        km_wf[i] = km_float();
        km_wh[i] = (uint16_t)(kt_next() & 0xBBFFu); /* finite, |w| < 1 */
        km_wq[i] = extremes ? (int8_t)((i % 3 == 0) ? 127 : -128) : (int8_t)(kt_next() >> 24);
    }
    for (int32_t i = 0; i < n_out * nb; i++) {
        km_sc[i] = km_float();
        km_w4[i].d = (uint16_t)(kt_next() & 0xBBFFu);
        for (int32_t j = 0; j < 16; j++) {
            km_w4[i].qs[j] = extremes ? (uint8_t)0xF0u : (uint8_t)kt_next();
        }
    }
    for (int32_t i = 0; i < KM_TOK * n_in; i++) {
        km_x[i] = km_float();
        km_xq[i] = extremes ? (int8_t)-128 : (int8_t)(kt_next() >> 24);
    }
    for (int32_t i = 0; i < KM_TOK * nb; i++) {
        km_sx[i] = km_float();
    }
    (void)colibri_kernel_set_level(COLIBRI_KERNEL_BASE);
    for (int32_t k = 0; k < KM_KERNELS; k++) {
        for (int32_t t = 0; t < KM_TOK; t++) {
            km_matvec(k, t, km_ref[k][t], n_out, n_in);
        }
    }
    for (int32_t level = COLIBRI_KERNEL_BASE; level <= COLIBRI_KERNEL_AVX512_VNNI; level++) {
        if (colibri_kernel_set_level(level) != level) {
            continue;
        }
        *levels |= 1u << level;
        for (int32_t k = 0; k < KM_KERNELS; k++) {
            for (int32_t t = 0; t < KM_TOK; t++) {
                float y[KM_OUT];
                km_matvec(k, t, y, n_out, n_in);
                for (int32_t o = 0; o < n_out; o++) {
                    (*checks)++;
                    *failed += km_same(y[o], km_ref[k][t][o]) ? 0u : 1u;
                }
            }
            static const int32_t n_toks[] = {KM_TOK, 7, 3, 1};
            for (uint32_t nt = 0; nt < sizeof n_toks / sizeof n_toks[0]; nt++) {
                const int32_t n_tok = n_toks[nt];
                for (int32_t i = 0; i < KM_TOK * (KM_OUT + 1); i++) {
                    km_y[i] = -1.0f; /* the gap column (ldy > n_out) must stay untouched */
                }
                km_matmul(k, n_out, n_in, n_tok);
                for (int32_t t = 0; t <= n_tok && t < KM_TOK; t++) {
                    for (int32_t o = 0; o <= n_out; o++) {
                        (*checks)++;
                        const float want = (o < n_out && t < n_tok) ? km_ref[k][t][o] : -1.0f;
                        *failed += km_same(km_y[t * (n_out + 1) + o], want) ? 0u : 1u;
                    }
                }
            }
        }
    }
    (void)colibri_kernel_set_level(COLIBRI_KERNEL_AVX512_VNNI); /* back to the best */
}

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    clb_platform_init();
    uint32_t checks = 0;
    uint32_t failed = 0;
    for (int32_t round = 0; round < 3; round++) {
        for (int32_t i = 0; i < KT_MAX + 4; i++) {
            kt_a[i] = (int8_t)(kt_next() >> 24);
            kt_b[i] = (int8_t)(kt_next() >> 24);
            if (round == 2) { /* the extremes: -128 * -128 and 127 * -128 */
                kt_a[i] = (i % 3 == 0) ? (int8_t)127 : (int8_t)-128;
                kt_b[i] = (int8_t)-128;
            }
        }
        for (int32_t n = 0; n <= 140; n++) {
            for (int32_t oa = 0; oa < 4; oa++) {
                for (int32_t ob = 0; ob < 4; ob += 3) {
                    checks++;
                    if (colibri_dot_q8(kt_a + oa, kt_b + ob, n) !=
                        kt_dot_q8(kt_a + oa, kt_b + ob, n)) {
                        failed++;
                    }
                }
            }
        }
        for (int32_t k = 0; k < KT_BLOCKS; k++) {
            kt_blk[k].d = 0x3C00u;
            for (int32_t j = 0; j < 16; j++) {
                kt_blk[k].qs[j] = (uint8_t)(round == 2 ? 0x0Fu * (uint32_t)(j & 1) : kt_next());
            }
            for (int32_t n = 1; n <= COLIBRI_QK4; n++) {
                for (int32_t ox = 0; ox < 4; ox++) {
                    checks++;
                    const int32_t want = kt_dot_q4(&kt_blk[k], kt_b + ox + k, n);
                    if (colibri_dot_q4_q8(&kt_blk[k], kt_b + ox + k, n) != want ||
                        (n == COLIBRI_QK4 && kt_dot_q4_block(&kt_blk[k], kt_b + ox + k) != want)) {
                        failed++;
                    }
                }
            }
        }
    }
    uint8_t mode = 0xFFu;
    const int32_t fd = clb_platform_open("input.bin", CLB_PLATFORM_READ);
    if (fd >= 0) {
        if (clb_platform_read(fd, &mode, 1) != 1) {
            mode = 0xFFu;
        }
        (void)clb_platform_close(fd);
    }
    /* the fp16 and matvec comparisons run with mode 0 (or no input.bin) only: the other bench
     * runs need their inputs, not the comparisons again (CI time on soft-float boards) */
    const int32_t compare = (mode == 0u || mode == 0xFFu);
    for (uint32_t h = 0; h < (compare ? 65536u : 0u); h++) { /* every fp16 bit pattern */
        const float got = colibri_f16_to_f32((uint16_t)h);
        const float want = kt_f16_to_f32((uint16_t)h);
        checks++;
        if (isnan(want) ? !isnan(got) || signbit(got) != signbit(want)
                        : memcmp(&got, &want, sizeof got) != 0) {
            failed++;
        }
    }
    static const int32_t kt_ins[] = {1, 4, 7, 8, 9, 16, 31, 32, 33, 40, 64, 65, 97};
    for (int32_t round = 0; round < 2; round++) {
        /* round 1: x and sx so small that many products and partial sums are fp32 subnormals */
        const float xs = round == 0 ? 0x1p-31f : 0x1p-31f * 0x1p-115f;
        for (int32_t i = 0; i < KT_MI; i++) {
            kt_xf[i] = (float)(int32_t)kt_next() * xs;
            kt_b[i] = (int8_t)(kt_next() >> 24);
        }
        for (int32_t i = 0; i < KT_MO * KT_MI; i++) {
            kt_w16[i] = kt_f16();
        }
        for (size_t k = 0; k < sizeof kt_w4 / sizeof kt_w4[0]; k++) {
            kt_w4[k].d = kt_f16();
            for (int32_t j = 0; j < 16; j++) {
                kt_w4[k].qs[j] = (uint8_t)kt_next();
            }
        }
        for (int32_t b = 0; b < (int32_t)COLIBRI_Q4_BLOCKS(KT_MI); b++) {
            kt_sx[b] = (float)(kt_next() >> 8) * (round == 0 ? 0x1p-30f : 0x1p-24f * 0x1p-100f);
        }
        for (int32_t n_out = 1; n_out <= KT_MO; n_out++) {
            for (size_t k = 0; compare && k < sizeof kt_ins / sizeof kt_ins[0]; k++) {
                const int32_t n_in = kt_ins[k];
                checks += 3;
                colibri_matvec_f16_f32(kt_w16, kt_xf, kt_y, n_out, n_in);
                kt_matvec_f16(kt_w16, kt_xf, kt_yref, n_out, n_in);
                failed += kt_differs(n_out);
                colibri_matvec_q4_q8(kt_w4, kt_b, kt_sx, kt_y, n_out, n_in);
                kt_matvec_q4(kt_w4, kt_b, kt_sx, kt_yref, n_out, n_in);
                failed += kt_differs(n_out);
                colibri_matvec_q4_f32(kt_w4, kt_xf, kt_y, n_out, n_in);
                kt_matvec_q4_f32(kt_w4, kt_xf, kt_yref, n_out, n_in);
                failed += kt_differs(n_out);
            }
        }
    }
    for (int32_t i = 0; i < KT_QUANT; i++) {
        kt_x[i] = (float)(int32_t)kt_next() * (4.0f / 2147483648.0f);
    }
    volatile int32_t sink = 0;
    volatile float fsink = 0.0f;
    const int32_t n_bench = 128;
    clb_platform_bench_begin();
    if (mode == 4u) {
        colibri_quantize_row_q8(kt_x, kt_xq, kt_sx, KT_QUANT);
        fsink += kt_sx[0];
    } else if (mode == 5u) {
        fsink += kt_quantize_roundf(kt_x, kt_xq, KT_QUANT);
    } else if (mode == 6u) {
        colibri_matvec_f16_f32(kt_w16, kt_xf, kt_y, KT_BO, KT_BI);
    } else if (mode == 7u) {
        kt_matvec_f16(kt_w16, kt_xf, kt_y, KT_BO, KT_BI);
    } else if (mode == 8u) {
        colibri_matvec_q4_q8(kt_w4, kt_b, kt_sx, kt_y, KT_BO, KT_BI);
    } else if (mode == 9u) {
        kt_matvec_q4(kt_w4, kt_b, kt_sx, kt_y, KT_BO, KT_BI);
    } else if (mode == 10u) {
        colibri_matvec_q4_f32(kt_w4, kt_xf, kt_y, KT_BO, KT_BI);
    } else if (mode == 11u) {
        kt_matvec_q4_f32(kt_w4, kt_xf, kt_y, KT_BO, KT_BI);
    }
    for (int32_t rep = 0; rep < 8; rep++) {
        if (mode == 0u) {
            sink += colibri_dot_q8(kt_a, kt_b, n_bench);
        } else if (mode == 1u) {
            sink += kt_dot_q8(kt_a, kt_b, n_bench);
        } else if (mode == 2u) {
            for (int32_t k = 0; k < KT_BLOCKS; k++) {
                sink += colibri_dot_q4_q8(&kt_blk[k], kt_b + 32 * k, COLIBRI_QK4);
            }
        } else if (mode == 3u) {
            for (int32_t k = 0; k < KT_BLOCKS; k++) {
                sink += kt_dot_q4_block(&kt_blk[k], kt_b + 32 * k);
            }
        }
    }
    clb_platform_bench_end();
    fsink += kt_y[0];
    (void)sink;
    (void)fsink;

    /* matvec / matmul levels (a line of their own: the dot-product line above keeps its count) */
    static const int32_t shapes[][2] = {{1, 1},   {3, 7},  {8, 8},   {9, 31}, {16, 32},
                                        {17, 33}, {5, 64}, {12, 65}, {17, 72}};
    uint32_t mchecks = 0;
    uint32_t mfailed = 0;
    uint32_t levels = 0;
    for (uint32_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        for (int32_t extremes = 0; extremes < 2; extremes++) {
            km_check_shape(shapes[s][0], shapes[s][1], extremes, &mchecks, &mfailed, &levels);
        }
    }
    char mline[160];
    char *m = clb_append(mline, "colibri matvec: ");
    m = clb_append_u32(m, mchecks);
    m = clb_append(m, " checks, ");
    m = clb_append_u32(m, mfailed);
    m = clb_append(m, " failed, levels");
    for (int32_t level = 0; level < 4; level++) {
        if (levels & (1u << level)) {
            m = clb_append(m, " ");
            m = clb_append(m, colibri_kernel_level_name(level));
        }
    }
    m = clb_append(m, "\n");
    *m = '\0';
    clb_platform_puts(mline);
    failed += mfailed;

    char line[96];
    char *p = clb_append(line, "colibri kernels: ");
    p = clb_append_u32(p, checks);
    p = clb_append(p, " checks, ");
    p = clb_append_u32(p, failed);
    p = clb_append(p, " failed\n");
    *p = '\0';
    clb_platform_puts(line);
    return failed == 0u ? 0 : 1;
}
