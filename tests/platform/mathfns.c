/**
 * @file mathfns.c
 * @brief Self-test of colibri_math.h's erf, tanh, GELUs and SiLU on a board, with no libm:
 *        writes colibri_erff, colibri_tanhf, colibri_gelu, colibri_gelu_tanh and colibri_silu
 *        of a fixed set of inputs, then the row functions colibri_silu_row, colibri_gelu_row,
 *        colibri_gelu_tanh_row and colibri_swiglu_row (its gate the row reversed) run over rows of
 *        MF_CHUNK
 *        inputs (the last row shorter: a tail), to output.bin (MF_COLS float32 values per input,
 *        in that order, little-endian as the board stores them), for
 *        tests/targets/test_platforms.py to compare with colibri.reference.f32 bit for bit.
 *        The inputs, made here and repeated by the test: i * 2^-13 for i in -MF_GRID..MF_GRID
 *        (every such value in [-10, 10]), then +-(86 + i * 2^-9) for i in 0..MF_EXP-1 (exp's
 *        range ends), then the bit patterns i * 0x9E3779B1 (mod 2^32) for i in
 *        0..MF_SCATTER-1 (every exponent: subnormals, huge values, NaNs), then the MF_EDGES
 *        values below. Prints "colibri mathfns: N values" and returns 0.
 */
#include "colibri_fmt.h"
#include "colibri_math.h"
#include "colibri_platform.h"

#include <stdint.h>
#include <string.h>

#define MF_GRID 81920
#define MF_EXP 1792
#define MF_SCATTER 65536
#define MF_CHUNK 256
#define MF_COLS 9

static const uint32_t mf_edges[] = {
    0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00000u,
    0x00000001u, 0x80000001u, 0x007FFFFFu, 0x00800000u, 0x7F7FFFFFu, 0xFF7FFFFFu,
    0x3F600000u, 0x3F5FFFFFu, 0xBF600000u, 0x40800000u, 0x407FFFFFu, 0xC0800000u,
    0x3F200000u, 0x3F1FFFFFu, 0xBF200000u, 0xC1300000u, 0xC12FFFFFu, 0xC1300001u,
    0x42AE0000u, 0xC2AE0000u, 0x42B17218u, 0xC2B17218u, 0x42B17217u, 0xC2B17217u,
};
#define MF_EDGES (sizeof mf_edges / sizeof mf_edges[0])

static float mf_out[MF_CHUNK * MF_COLS];
static float mf_row[4][MF_CHUNK];
static float mf_gate[MF_CHUNK];

static float mf_input(uint32_t k)
{
    if (k < 2u * MF_GRID + 1u) {
        return (float)((int32_t)k - MF_GRID) * (1.0f / 8192.0f);
    }
    k -= 2u * MF_GRID + 1u;
    if (k < 2u * MF_EXP) {
        const float a = 86.0f + (float)(k >> 1) * (1.0f / 512.0f);
        return (k & 1u) ? -a : a;
    }
    k -= 2u * MF_EXP;
    uint32_t bits = k < MF_SCATTER ? k * 0x9E3779B1u : mf_edges[k - MF_SCATTER];
    float x;
    memcpy(&x, &bits, sizeof x);
    return x;
}

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    clb_platform_init();
    const uint32_t total = 2u * MF_GRID + 1u + 2u * MF_EXP + MF_SCATTER + (uint32_t)MF_EDGES;
    int32_t fd = clb_platform_open("output.bin", CLB_PLATFORM_WRITE);
    if (fd < 0) {
        clb_platform_puts("mathfns: cannot create output.bin\n");
        return 12;
    }
    for (uint32_t k0 = 0; k0 < total; k0 += MF_CHUNK) {
        uint32_t n = total - k0 < MF_CHUNK ? total - k0 : MF_CHUNK;
        for (uint32_t j = 0; j < n; j++) {
            /* volatile: one value at a time, as the activation loops see them */
            volatile float x = mf_input(k0 + j);
            mf_out[MF_COLS * j] = colibri_erff(x);
            mf_out[MF_COLS * j + 1] = colibri_tanhf(x);
            mf_out[MF_COLS * j + 2] = colibri_gelu(x);
            mf_out[MF_COLS * j + 3] = colibri_gelu_tanh(x);
            mf_out[MF_COLS * j + 4] = colibri_silu(x);
            for (uint32_t r = 0; r < 4; r++) {
                mf_row[r][j] = x;
            }
            mf_gate[n - 1u - j] = x; /* the gate: the row reversed */
        }
        colibri_silu_row(mf_row[0], (int32_t)n);
        colibri_gelu_row(mf_row[1], (int32_t)n);
        colibri_gelu_tanh_row(mf_row[2], (int32_t)n);
        colibri_swiglu_row(mf_row[3], mf_gate, (int32_t)n);
        for (uint32_t j = 0; j < n; j++) {
            for (uint32_t r = 0; r < 4; r++) {
                mf_out[MF_COLS * j + 5 + r] = mf_row[r][j];
            }
        }
        uint32_t bytes = n * (uint32_t)MF_COLS * (uint32_t)sizeof(float);
        if (clb_platform_write(fd, mf_out, bytes) != (int32_t)bytes) {
            (void)clb_platform_close(fd);
            clb_platform_puts("mathfns: cannot write output.bin\n");
            return 13;
        }
    }
    (void)clb_platform_close(fd);
    char line[64];
    char *p = clb_append(line, "colibri mathfns: ");
    p = clb_append_u32(p, total);
    p = clb_append(p, " values\n");
    *p = '\0';
    clb_platform_puts(line);
    return 0;
}
