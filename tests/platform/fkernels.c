/**
 * @file fkernels.c
 * @brief Self-test of the float kernels of colibri_qinline_f.h (what generated fp32 / fp16
 *        expert kernels call) against the runtime's kernels_q.c on a board. They use fused
 *        multiply-adds and their own summation order, so each output must be within the
 *        rounding bound of an n-term dot product: |y - y_lib| <= 2 (n + 1) 2^-23 S +
 *        2 (n + 1) 2^-126, S = |b[o]| + sum_i |w(o, i) x[i]| (the second term: Helium flushes
 *        subnormal results to zero).
 *         - colibri_qf_f32_c8 (layout c8) against colibri_matvec_f32 (+ bias) for 8 x 8 shapes
 *           (tails of outputs after the last block of 8 and of inputs after the last pass of 4
 *           included), with and without a bias, on random, wide-range and subnormal-product
 *           values;
 *         - colibri_qf_f16_f32 against colibri_matvec_f16_f32 for 8 x 7 shapes (row and input
 *           tails), random finite fp16 bit patterns (subnormals included) and small weights;
 *         - colibri_qf_f16_c8 (fp16 in layout c8) against colibri_matvec_f16_f32 (+ bias) for
 *           the 8 x 8 c8 shapes, with and without a bias, on the same two fp16 kinds.
 *        Prints one line and returns 0 when all pass. The bench markers time, by the first byte
 *        of input.bin: 0 the seed-layout fp32 loop of a generated expert (axpy form) on an
 *        [FK_N][FK_N] matrix, 1 colibri_qf_f32_c8 on it, 2 colibri_matvec_f16_f32, 3
 *        colibri_qf_f16_f32, 4 colibri_qf_f16_c8 (tests/targets/test_platforms.py turns the
 *        counts into instructions per MAC).
 */
#include "colibri_fmt.h"
#include "colibri_platform.h"
#include "colibri_qinline_f.h"
#include "colibri_quant.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#define FK_N 64
#define FK_MAXN (FK_N * FK_N)
#define FK_MAXIN 130

static float fk_w[FK_MAXN];
static float fk_c8[FK_MAXN];
static uint16_t fk_h[FK_MAXN];
static uint16_t fk_h8[FK_MAXN];
static float fk_x[FK_MAXIN];
static float fk_b[FK_N];
static float fk_y0[FK_N];
static float fk_y1[FK_N];
static uint32_t fk_state = 0x9E3779B9u;

static uint32_t fk_next(void)
{
    fk_state ^= fk_state << 13;
    fk_state ^= fk_state >> 17;
    fk_state ^= fk_state << 5;
    return fk_state;
}

static float fk_unit(void)
{
    return (float)(int32_t)fk_next() * (1.0f / 2147483648.0f);
}

/* Where layout c8 stores weight (o, i): blocks of 8 outputs, each [n_in][8], the n_out % 8
 * outputs after the last whole block a last block [n_in][n_out % 8] (formats.py c8_order). */
static size_t fk_c8_at(int32_t o, int32_t i, int32_t n_out, int32_t n_in)
{
    const int32_t o0 = o - o % 8;
    const int32_t wd = (n_out - o0 < 8) ? n_out - o0 : 8;
    return (size_t)o0 * (size_t)n_in + (size_t)i * (size_t)wd + (size_t)(o % 8);
}

/* Row-major [n_out][n_in] into layout c8. */
static void fk_to_c8(const float *src, float *dst, int32_t n_out, int32_t n_in)
{
    for (int32_t o = 0; o < n_out; o++) {
        for (int32_t i = 0; i < n_in; i++) {
            dst[fk_c8_at(o, i, n_out, n_in)] = src[(size_t)o * (size_t)n_in + (size_t)i];
        }
    }
}

/* The same for fp16 codes. */
static void fk_to_c8_h(const uint16_t *src, uint16_t *dst, int32_t n_out, int32_t n_in)
{
    for (int32_t o = 0; o < n_out; o++) {
        for (int32_t i = 0; i < n_in; i++) {
            dst[fk_c8_at(o, i, n_out, n_in)] = src[(size_t)o * (size_t)n_in + (size_t)i];
        }
    }
}

/* Whether y1 is within the dot-product rounding bound of y0 (w as floats, row-major). */
static uint32_t fk_compare(const float *w, const float *b, int32_t n_out, int32_t n_in)
{
    uint32_t failed = 0;
    for (int32_t o = 0; o < n_out; o++) {
        float s = (b != NULL) ? fabsf(b[o]) : 0.0f;
        for (int32_t i = 0; i < n_in; i++) {
            s += fabsf(w[(size_t)o * (size_t)n_in + (size_t)i] * fk_x[i]);
        }
        const float n1 = (float)(n_in + 1);
        const float bound = 2.0f * n1 * (s * 1.1920929e-7f + 1.1754944e-38f);
        const float d = fabsf(fk_y1[o] - fk_y0[o]);
        failed += !(d <= bound); /* NaN fails */
    }
    return failed != 0u;
}

/* kind 0 random in [-1, 1], 1 a wide range (2^-40 .. 2^40), 2 products near 2^-126. */
static void fk_fill_f32(int32_t kind)
{
    for (int32_t i = 0; i < FK_MAXN; i++) {
        float v = fk_unit();
        if (kind == 1) {
            v = ldexpf(v, (int32_t)(fk_next() % 81u) - 40);
        } else if (kind == 2) {
            v = ldexpf(v, -63 - (int32_t)(fk_next() % 4u));
        }
        fk_w[i] = v;
    }
    for (int32_t i = 0; i < FK_MAXIN; i++) {
        fk_x[i] = (kind == 2) ? ldexpf(fk_unit(), -62) : fk_unit() * 4.0f;
    }
    for (int32_t i = 0; i < FK_N; i++) {
        fk_b[i] = fk_unit();
    }
}

static uint32_t fk_check_c8(int32_t n_out, int32_t n_in, uint32_t *checks)
{
    uint32_t failed = 0;
    fk_to_c8(fk_w, fk_c8, n_out, n_in);
    for (int bias = 0; bias < 2; bias++) {
        const float *b = bias ? fk_b : NULL;
        colibri_matvec_f32(fk_w, fk_x, fk_y0, n_out, n_in);
        for (int32_t o = 0; bias && o < n_out; o++) {
            fk_y0[o] += fk_b[o];
        }
        colibri_qf_f32_c8(fk_c8, b, fk_x, fk_y1, n_out, n_in);
        *checks += 1u;
        failed += fk_compare(fk_w, b, n_out, n_in);
    }
    return failed;
}

/* kind 0: random finite fp16 bits (subnormals included), 1: small weights (|w| < 2^-10). */
static void fk_fill_f16(int32_t kind)
{
    for (int32_t i = 0; i < FK_MAXN; i++) {
        uint16_t h = (uint16_t)(fk_next() & 0xFFFFu);
        if ((h & 0x7C00u) == 0x7C00u) {
            h = (uint16_t)(h & 0xBFFFu); /* no inf / NaN */
        }
        if (kind == 1) {
            h = (uint16_t)(h & 0x9FFFu);
        }
        fk_h[i] = h;
        fk_w[i] = colibri_f16_to_f32(h);
    }
    for (int32_t i = 0; i < FK_MAXIN; i++) {
        fk_x[i] = fk_unit() * 2.0f;
    }
}

static uint32_t fk_check_f16(int32_t n_out, int32_t n_in, uint32_t *checks)
{
    colibri_matvec_f16_f32(fk_h, fk_x, fk_y0, n_out, n_in);
    colibri_qf_f16_f32(fk_h, fk_x, fk_y1, n_out, n_in);
    *checks += 1u;
    return fk_compare(fk_w, NULL, n_out, n_in);
}

static uint32_t fk_check_f16_c8(int32_t n_out, int32_t n_in, uint32_t *checks)
{
    uint32_t failed = 0;
    fk_to_c8_h(fk_h, fk_h8, n_out, n_in);
    for (int bias = 0; bias < 2; bias++) {
        const float *b = bias ? fk_b : NULL;
        colibri_matvec_f16_f32(fk_h, fk_x, fk_y0, n_out, n_in);
        for (int32_t o = 0; bias && o < n_out; o++) {
            fk_y0[o] += fk_b[o];
        }
        colibri_qf_f16_c8(fk_h8, b, fk_x, fk_y1, n_out, n_in);
        *checks += 1u;
        failed += fk_compare(fk_w, b, n_out, n_in);
    }
    return failed;
}

/* The bench calls, one function each (as a generated expert kernel is): constant shapes. */
__attribute__((noinline)) static void fk_bench_seed(void)
{
    /* a generated fp32 expert's x[D] * w[D][F] loop before layout c8 (axpy form) */
    for (int32_t j = 0; j < FK_N; ++j) {
        fk_y0[j] = fk_b[j];
    }
    for (int32_t i = 0; i < FK_N; ++i) {
        const float xi = fk_x[i];
        const float *row = fk_w + (size_t)i * FK_N;
        for (int32_t j = 0; j < FK_N; ++j) {
            fk_y0[j] += xi * row[j];
        }
    }
}

__attribute__((noinline)) static void fk_bench_c8(void)
{
    colibri_qf_f32_c8(fk_c8, fk_b, fk_x, fk_y1, FK_N, FK_N);
}

__attribute__((noinline)) static void fk_bench_f16_c8(void)
{
    colibri_qf_f16_c8(fk_h8, NULL, fk_x, fk_y1, FK_N, FK_N);
}

__attribute__((noinline)) static void fk_bench_f16(int inline_kernel)
{
    if (inline_kernel) {
        colibri_qf_f16_f32(fk_h, fk_x, fk_y1, FK_N, FK_N);
    } else {
        colibri_matvec_f16_f32(fk_h, fk_x, fk_y0, FK_N, FK_N);
    }
}

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    clb_platform_init();
    /* whole blocks and passes, and the tails: outputs after the last block of 8 (1, 3, 13,
       27), inputs after the last pass of 4 (1, 3, 5, 47) */
    static const int32_t c8_outs[] = {1, 3, 8, 13, 16, 24, 27, 64};
    static const int32_t c8_ins[] = {1, 3, 4, 5, 8, 12, 47, 64};
    static const int32_t f16_outs[] = {1, 2, 3, 4, 5, 7, 8, 13};
    static const int32_t f16_ins[] = {1, 7, 8, 9, 16, 64, 130};
    uint32_t checks = 0;
    uint32_t failed = 0;
    for (int32_t kind = 0; kind < 3; kind++) {
        fk_fill_f32(kind);
        for (size_t a = 0; a < sizeof c8_outs / sizeof c8_outs[0]; a++) {
            for (size_t b = 0; b < sizeof c8_ins / sizeof c8_ins[0]; b++) {
                failed += fk_check_c8(c8_outs[a], c8_ins[b], &checks);
            }
        }
    }
    for (int32_t kind = 0; kind < 2; kind++) {
        fk_fill_f16(kind);
        for (size_t a = 0; a < sizeof f16_outs / sizeof f16_outs[0]; a++) {
            for (size_t b = 0; b < sizeof f16_ins / sizeof f16_ins[0]; b++) {
                failed += fk_check_f16(f16_outs[a], f16_ins[b], &checks);
            }
        }
        for (size_t a = 0; a < sizeof c8_outs / sizeof c8_outs[0]; a++) {
            for (size_t b = 0; b < sizeof c8_ins / sizeof c8_ins[0]; b++) {
                failed += fk_check_f16_c8(c8_outs[a], c8_ins[b], &checks);
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
    fk_fill_f32(0);
    fk_to_c8(fk_w, fk_c8, FK_N, FK_N);
    fk_fill_f16(0);
    fk_to_c8_h(fk_h, fk_h8, FK_N, FK_N);
    clb_platform_bench_begin();
    if (mode == 0u) {
        fk_bench_seed();
    } else if (mode == 1u) {
        fk_bench_c8();
    } else if (mode == 2u || mode == 3u) {
        fk_bench_f16(mode == 3u);
    } else if (mode == 4u) {
        fk_bench_f16_c8();
    }
    clb_platform_bench_end();

    char line[96];
    char *p = clb_append(line, "colibri fkernels: ");
    p = clb_append_u32(p, checks);
    p = clb_append(p, " checks, ");
    p = clb_append_u32(p, failed);
    p = clb_append(p, " failed\n");
    *p = '\0';
    clb_platform_puts(line);
    return failed == 0u ? 0 : 1;
}
