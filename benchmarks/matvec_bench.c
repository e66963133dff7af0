/**
 * @file matvec_bench.c
 * @brief Instruction cost of one quantised matvec of MB_OUT x MB_IN weights (kernels_q.c as the
 *        board's flags build it). The first byte of input.bin picks the kernel run between the
 *        bench markers: 0 colibri_matvec_f16_f32, 1 colibri_matvec_q4_q8 (the activation row
 *        quantised outside the markers), 2 colibri_matvec_q4_f32, 3 colibri_matvec_q8_q8.
 *        Weights and inputs are seeded pseudo-random (finite fp16 values, random nibbles and
 *        int8 codes). Prints "matvec bench: <hash>", an FNV-1a hash of the output bits, so two
 *        builds of the kernels (before / after a change) can be checked to agree bit for bit
 *        (benchmarks/matvec_table.py).
 */
#include "bench_io.h"
#include "colibri_fmt.h"
#include "colibri_platform.h"
#include "colibri_quant.h"

#include <stdint.h>
#include <string.h>

#ifndef MB_OUT
#define MB_OUT 512
#endif
#ifndef MB_IN
#define MB_IN 128
#endif
#define MB_BLOCKS COLIBRI_Q4_BLOCKS(MB_IN)

static uint16_t mb_w16[(size_t)MB_OUT * MB_IN];
static colibri_block_q4_32 mb_w4[(size_t)MB_OUT * MB_BLOCKS];
static int8_t mb_w8[(size_t)MB_OUT * MB_IN];
static float mb_s8[MB_OUT];
static float mb_x[MB_IN];
static int8_t mb_xq[MB_IN];
static float mb_sx[MB_BLOCKS];
static float mb_y[MB_OUT];
static uint32_t mb_state = 0x9E3779B9u;

/** @brief A random finite fp16 of magnitude below 2 (exponent field below 16). */
static uint16_t mb_f16(void)
{
    const uint32_t r = bench_next(&mb_state);
    return (uint16_t)((r & 0x83FFu) | (((r >> 16) % 16u) << 10));
}

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    clb_platform_init();
    const uint8_t mode = bench_mode(0);
    for (size_t i = 0; i < (size_t)MB_OUT * MB_IN; i++) {
        mb_w16[i] = mb_f16();
        mb_w8[i] = (int8_t)(bench_next(&mb_state) >> 24);
    }
    for (size_t k = 0; k < (size_t)MB_OUT * MB_BLOCKS; k++) {
        mb_w4[k].d = mb_f16();
        for (int32_t j = 0; j < 16; j++) {
            mb_w4[k].qs[j] = (uint8_t)bench_next(&mb_state);
        }
    }
    for (int32_t o = 0; o < MB_OUT; o++) {
        mb_s8[o] = (float)(bench_next(&mb_state) >> 8) * 0x1p-30f;
    }
    for (int32_t i = 0; i < MB_IN; i++) {
        mb_x[i] = (float)(int32_t)bench_next(&mb_state) * 0x1p-31f;
    }
    colibri_quantize_row_q8(mb_x, mb_xq, mb_sx, MB_IN);
    clb_platform_bench_begin();
    if (mode == 0u) {
        colibri_matvec_f16_f32(mb_w16, mb_x, mb_y, MB_OUT, MB_IN);
    } else if (mode == 1u) {
        colibri_matvec_q4_q8(mb_w4, mb_xq, mb_sx, mb_y, MB_OUT, MB_IN);
    } else if (mode == 2u) {
        colibri_matvec_q4_f32(mb_w4, mb_x, mb_y, MB_OUT, MB_IN);
    } else {
        colibri_matvec_q8_q8(mb_w8, mb_s8, mb_xq, mb_sx, mb_y, MB_OUT, MB_IN);
    }
    clb_platform_bench_end();
    uint32_t hash = 2166136261u;
    for (int32_t o = 0; o < MB_OUT; o++) {
        uint32_t bits;
        memcpy(&bits, &mb_y[o], sizeof bits);
        for (int32_t b = 0; b < 4; b++) {
            hash = (hash ^ ((bits >> (8 * b)) & 0xFFu)) * 16777619u;
        }
    }
    char line[64];
    char *p = clb_append(line, "matvec bench: ");
    p = clb_append_u32(p, hash);
    p = clb_append(p, "\n");
    *p = '\0';
    clb_platform_puts(line);
    return 0;
}
