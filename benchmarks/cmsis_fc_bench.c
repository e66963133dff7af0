/**
 * @file cmsis_fc_bench.c
 * @brief CMSIS-NN's fully-connected pair, counted the way benchmarks/kernels_table.py counts a
 *        generated expert: w1 [FC_F][FC_D] with a ReLU clamp, then w2 [FC_D][FC_F], on n int8
 *        token rows (n = the first byte of input.bin), by arm_fully_connected_s8 (FC_S4 0) or
 *        arm_fully_connected_s4 (FC_S4 1: two weights a byte), per-tensor requantisation.
 *        Only the pair runs between the bench markers (cmsis_fc_pair, the function whose
 *        reachable code and stack kernels_table.py reads from the ELF); the Helium s8 path's
 *        kernel sums (arm_vector_sum_s8) are computed before, as a TFLM Prepare does.
 *        Built by kernels_table.py --cmsis-nn DIR against that CMSIS-NN checkout; not part of
 *        the library or of CI.
 */
#include "arm_nnfunctions.h"
#include "bench_io.h"
#include "colibri_fmt.h"
#include "colibri_platform.h"

#include <stdint.h>

#ifndef FC_D
#define FC_D 128
#endif
#ifndef FC_F
#define FC_F 512
#endif
#ifndef FC_S4
#define FC_S4 0
#endif
#define FC_MAX_TOKENS 9
/* bytes of a [rows][cols] weight matrix */
#if FC_S4
#define FC_BYTES(rows, cols) (((rows) * (cols) + 1) / 2)
#else
#define FC_BYTES(rows, cols) ((rows) * (cols))
#endif

static int8_t fc_w1[FC_BYTES(FC_F, FC_D)];
static int8_t fc_w2[FC_BYTES(FC_D, FC_F)];
static int32_t fc_b1[FC_F];
static int32_t fc_b2[FC_D];
static int32_t fc_sum1[FC_F]; /* the Helium s8 kernel sums (ctx.buf) */
static int32_t fc_sum2[FC_D];
static int8_t fc_x[FC_MAX_TOKENS * FC_D];
static int8_t fc_h[FC_MAX_TOKENS * FC_F];
static int8_t fc_y[FC_MAX_TOKENS * FC_D];
static uint32_t fc_state = 0x9E3779B9u;

static void fc_fill(int8_t *p, int32_t n, int32_t span)
{
    for (int32_t i = 0; i < n; i++) {
        p[i] = (int8_t)((int32_t)(bench_next(&fc_state) % (uint32_t)(2 * span + 1)) - span);
    }
}

/* One fully-connected layer: n rows of `in` features to `out` features. */
static arm_cmsis_nn_status fc_layer(const int8_t *x, const int8_t *w, const int32_t *b,
                                    int32_t *sums, int8_t *y, int32_t n, int32_t in, int32_t out,
                                    int32_t act_min)
{
    const cmsis_nn_context ctx = {sums, out * (int32_t)sizeof(int32_t)};
    const cmsis_nn_fc_params fc = {0, 0, 0, {act_min, 127}};
    const cmsis_nn_per_tensor_quant_params q = {1518500250, -9};
    const cmsis_nn_dims in_dims = {n, 1, 1, in};
    const cmsis_nn_dims w_dims = {in, 1, 1, out};
    const cmsis_nn_dims b_dims = {1, 1, 1, out};
    const cmsis_nn_dims out_dims = {n, 1, 1, out};
#if FC_S4
    return arm_fully_connected_s4(&ctx, &fc, &q, &in_dims, x, &w_dims, w, &b_dims, b, &out_dims, y);
#else
    return arm_fully_connected_s8(&ctx, &fc, &q, &in_dims, x, &w_dims, w, &b_dims, b, &out_dims, y);
#endif
}

/** The pair on n rows: up with the ReLU clamp (output zero point 0), then down. */
__attribute__((noinline)) int32_t cmsis_fc_pair(int32_t n)
{
    arm_cmsis_nn_status st = fc_layer(fc_x, fc_w1, fc_b1, fc_sum1, fc_h, n, FC_D, FC_F, 0);
    if (st == ARM_CMSIS_NN_SUCCESS) {
        st = fc_layer(fc_h, fc_w2, fc_b2, fc_sum2, fc_y, n, FC_F, FC_D, -128);
    }
    return (int32_t)st;
}

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fc_fill(fc_w1, (int32_t)sizeof fc_w1, 127);
    fc_fill(fc_w2, (int32_t)sizeof fc_w2, 127);
    fc_fill(fc_x, (int32_t)sizeof fc_x, 100);
    for (int32_t i = 0; i < FC_F; i++) {
        fc_b1[i] = (int32_t)(bench_next(&fc_state) % 2001u) - 1000;
    }
    for (int32_t i = 0; i < FC_D; i++) {
        fc_b2[i] = (int32_t)(bench_next(&fc_state) % 2001u) - 1000;
    }
#if !FC_S4
    (void)arm_vector_sum_s8(fc_sum1, FC_D, FC_F, fc_w1, 0, 0, fc_b1);
    (void)arm_vector_sum_s8(fc_sum2, FC_F, FC_D, fc_w2, 0, 0, fc_b2);
#endif
    uint8_t n = bench_mode(1u);
    n = (n >= 1u && n <= FC_MAX_TOKENS) ? n : 1u;
    clb_platform_bench_begin();
    const int32_t st = cmsis_fc_pair((int32_t)n);
    clb_platform_bench_end();
    uint32_t sum = 0;
    for (int32_t i = 0; i < (int32_t)n * FC_D; i++) {
        sum = sum * 31u + (uint32_t)(uint8_t)fc_y[i];
    }
    char line[96];
    char *p = clb_append(line, "cmsis-fc: status ");
    p = clb_append(p, st == 0 ? "ok" : "error");
    p = clb_append(p, ", tokens ");
    p = clb_append_u32(p, n);
    p = clb_append(p, ", checksum ");
    p = clb_append_u32(p, sum);
    p = clb_append(p, "\n");
    *p = '\0';
    clb_platform_puts(line);
    return st == 0 ? 0 : 1;
}
