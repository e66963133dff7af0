/**
 * @file refkernels.c
 * @brief Self-test on a board: every optimised kernel of the runtime (kernels_q.c as the board's
 *        flags compile it: Helium, Neon, SIMD32, MAC16, SSE2 or portable; on x86-64 also every
 *        CPUID level of runtime_c/arch/x86_64 the CPU has, and the packed AVX-512 VNNI matrices)
 *        against its portable twin of kernels_q_ref.c, on seeded random shapes with tails:
 *        n_in not a multiple of the block (or of the tiles), odd n_out, 1..9 tokens, a row stride
 *        wider than n_out; and the int4 x int8 block sum and matvec on extreme values: nibbles all
 *        0, all 15 or mixed, codes all -128, all 127 or alternating, every block alignment (qs at
 *        2 or 0 mod 4), activations at every byte offset, every partial block length 1..32.
 *        Integer and float kernels alike must match bit for bit (the float
 *        kernels keep the documented order of operations; a NaN need only stay a NaN). Then, at
 *        every level, the tiles of generated code against their twins (refkernels_tiles.c).
 *        Prints "colibri refkernels: N checks, M failed, K kernels, T tiles, levels ...; tiles
 *        C checks, int P, float Q" (C of the N checks are the tiles', P and Q their paths on this
 *        core) and returns 0 when nothing failed; the first mismatches are printed with kernel,
 *        level, shape, index, actual and expected bits.
 */
#include "refkernels.h"
#include "colibri_fmt.h"
#include "colibri_platform.h"
#include "colibri_quant.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)
#include "../../runtime_c/src/kernels_x86.h"
/* a host: larger shapes (the AVX-512 kernels take sixteen rows, ZMM steps of up to 64 blocks) */
#define RK_OUT 40
#define RK_IN 320
#define RK_SHAPES 48
#else
#define RK_OUT 13
#define RK_IN 100
#define RK_SHAPES 24
#endif
#define RK_TOK 9
#define RK_NB8 ((RK_IN + COLIBRI_QK8 - 1) / COLIBRI_QK8)
#define RK_NB4 ((RK_IN + COLIBRI_QK4 - 1) / COLIBRI_QK4)
#define RK_LDY (RK_OUT + 1)
/* Kernels compared (the line's count): quantise, dot q8, dot q4, 6 matvecs, 3 matmuls, silu-mul,
 * axpy, wsum, argmax, fp16 conversion, the x86 packed matmul. */
#define RK_KERNELS 17

static float rk_wf[RK_OUT * RK_IN];
static uint16_t rk_wh[RK_OUT * RK_IN];
static int8_t rk_wq[RK_OUT * RK_IN];
static float rk_ws[RK_OUT * RK_NB8]; /* q8b: a scale per row and block */
static float rk_rs[RK_OUT];          /* q8: a scale per row */
static colibri_block_q4_32 rk_w4[RK_OUT * RK_NB4];
static float rk_x[RK_TOK * RK_IN];
static int8_t rk_xq[RK_TOK * RK_IN];
static float rk_sx[RK_TOK * RK_NB8];
static int8_t rk_xq2[RK_TOK * RK_IN];
static float rk_sx2[RK_TOK * RK_NB8];
static float rk_y[RK_TOK * RK_LDY];
static float rk_yref[RK_TOK * RK_LDY];
#if defined(COLIBRI_X86_DISPATCH)
static _Alignas(64) uint8_t rk_packed[64u * 9u * ((RK_OUT + 15) / 16) * (RK_NB8 + 1)];
#endif

static uint32_t rk_state = 0x2545F491u;
uint32_t rk_checks;
uint32_t rk_failed;
const char *rk_level = "base";
int32_t rk_shape[3];

uint32_t rk_next(void)
{
    uint32_t s = rk_state; /* xorshift32 */
    s ^= s << 13;
    s ^= s >> 17;
    s ^= s << 5;
    rk_state = s;
    return s;
}

float rk_float(void)
{
    return (float)((int32_t)(rk_next() >> 8) - (1 << 23)) * (1.0f / 8388608.0f);
}

uint32_t rk_bits(float f)
{
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

static void rk_fail(const char *kernel, int32_t index, uint32_t got, uint32_t want)
{
    rk_failed++;
    if (rk_failed > 8u) {
        return;
    }
    char line[200];
    char *p = clb_append(line, "refkernels: ");
    p = clb_append(p, kernel);
    p = clb_append(p, " level ");
    p = clb_append(p, rk_level);
    p = clb_append(p, " n_out ");
    p = clb_append_u32(p, (uint32_t)rk_shape[0]);
    p = clb_append(p, " n_in ");
    p = clb_append_u32(p, (uint32_t)rk_shape[1]);
    p = clb_append(p, " n_tok ");
    p = clb_append_u32(p, (uint32_t)rk_shape[2]);
    p = clb_append(p, " index ");
    p = clb_append_u32(p, (uint32_t)index);
    p = clb_append(p, ": ");
    p = clb_append_hex(p, got);
    p = clb_append(p, " expected ");
    p = clb_append_hex(p, want);
    p = clb_append(p, "\n");
    *p = '\0';
    clb_platform_puts(line);
}

void rk_int(const char *kernel, int32_t index, int32_t got, int32_t want)
{
    rk_checks++;
    if (got != want) {
        rk_fail(kernel, index, (uint32_t)got, (uint32_t)want);
    }
}

void rk_floats(const char *kernel, const float *got, const float *want, int32_t n)
{
    for (int32_t i = 0; i < n; i++) {
        const uint32_t a = rk_bits(got[i]);
        const uint32_t b = rk_bits(want[i]);
        rk_checks++;
        if (a != b && !(isnan(got[i]) && isnan(want[i]) && (a >> 31) == (b >> 31))) {
            rk_fail(kernel, i, a, b);
        }
    }
}

/* The token rows of y (stride RK_LDY), n_out values each. */
static void rk_rows(const char *kernel, int32_t n_out, int32_t n_tok)
{
    for (int32_t t = 0; t < n_tok; t++) {
        rk_floats(kernel, rk_y + (size_t)t * RK_LDY, rk_yref + (size_t)t * RK_LDY, n_out);
    }
}

static void rk_clear(void)
{
    for (int32_t i = 0; i < RK_TOK * RK_LDY; i++) {
        rk_y[i] = -7.0f;
        rk_yref[i] = -7.0f;
    }
}

/* Random operands of one shape; extremes: int8 codes at -128 / 127, a zero block of x. */
static void rk_fill(int32_t n_out, int32_t n_in, int32_t n_tok, int32_t extremes)
{
    const int32_t nb8 = (int32_t)COLIBRI_Q8_BLOCKS(n_in);
    const int32_t nb4 = (int32_t)COLIBRI_Q4_BLOCKS(n_in);
    for (int32_t i = 0; i < n_out * n_in; i++) {
        rk_wf[i] = rk_float();
        /* normal fp16 values of both signs, exponents 2^-14 .. 2^1, and some subnormals */
        const uint32_t r = rk_next();
        const uint32_t expo = (r & 7u) == 0u ? 0u : 1u + (r >> 8) % 16u;
        rk_wh[i] = (uint16_t)(((r >> 31) << 15) | (expo << 10) | ((r >> 12) & 0x3FFu));
        rk_wq[i] = extremes ? (int8_t)((r & 1u) ? 127 : -128) : (int8_t)(r >> 24);
    }
    for (int32_t i = 0; i < n_out * nb8; i++) {
        rk_ws[i] = 0.001f + 0.01f * (rk_float() + 1.0f);
    }
    for (int32_t o = 0; o < n_out; o++) {
        rk_rs[o] = 0.002f + 0.02f * (rk_float() + 1.0f);
    }
    for (int32_t i = 0; i < n_out * nb4; i++) {
        for (int32_t j = 0; j < COLIBRI_QK4 / 2; j++) {
            rk_w4[i].qs[j] = (uint8_t)(rk_next() >> 24);
        }
        rk_w4[i].d = (uint16_t)(0x2000u + (rk_next() >> 22)); /* fp16 ~ 2^-7 .. 2^-6 */
    }
    for (int32_t i = 0; i < n_tok * n_in; i++) {
        rk_x[i] = 4.0f * rk_float();
    }
    if (extremes) {
        for (int32_t i = 0; i < n_in && i < COLIBRI_QK8; i++) {
            rk_x[i] = 0.0f; /* token 0's first block: all zero (scale 0) */
        }
    }
    for (int32_t t = 0; t < n_tok; t++) {
        colibri_quantize_row_q8_ref(rk_x + (size_t)t * (size_t)n_in,
                                    rk_xq + (size_t)t * (size_t)n_in,
                                    rk_sx + (size_t)t * (size_t)nb8, n_in);
    }
}

/* Every kernel at the current level against its twin. */
static void rk_compare(int32_t n_out, int32_t n_in, int32_t n_tok)
{
    const size_t nb8 = COLIBRI_Q8_BLOCKS(n_in);
    const size_t nb4 = COLIBRI_Q4_BLOCKS(n_in);
    for (int32_t t = 0; t < n_tok; t++) {
        colibri_quantize_row_q8(rk_x + (size_t)t * (size_t)n_in, rk_xq2 + (size_t)t * (size_t)n_in,
                                rk_sx2 + (size_t)t * nb8, n_in);
    }
    for (int32_t i = 0; i < n_tok * n_in; i++) {
        rk_int("quantize_row_q8 codes", i, rk_xq2[i], rk_xq[i]);
    }
    rk_floats("quantize_row_q8 scales", rk_sx2, rk_sx, n_tok * (int32_t)nb8);
    for (int32_t o = 0; o < n_out; o++) {
        const int8_t *row = rk_wq + (size_t)o * (size_t)n_in;
        rk_int("dot_q8", o, colibri_dot_q8(row, rk_xq, n_in), colibri_dot_q8_ref(row, rk_xq, n_in));
        for (size_t b = 0; b < nb4; b++) {
            const int32_t i0 = (int32_t)b * COLIBRI_QK4;
            const int32_t n = (n_in - i0 < COLIBRI_QK4) ? n_in - i0 : COLIBRI_QK4;
            const colibri_block_q4_32 *blk = rk_w4 + (size_t)o * nb4 + b;
            rk_int("dot_q4_q8", (int32_t)b, colibri_dot_q4_q8(blk, rk_xq + i0, n),
                   colibri_dot_q4_q8_ref(blk, rk_xq + i0, n));
        }
    }
    /* one-token kernels on the last token (its own codes and scales) */
    const size_t tl = (size_t)(n_tok - 1);
    const float *xl = rk_x + tl * (size_t)n_in;
    const int8_t *xql = rk_xq + tl * (size_t)n_in;
    const float *sxl = rk_sx + tl * nb8;
    rk_clear();
    colibri_matvec_f32(rk_wf, xl, rk_y, n_out, n_in);
    colibri_matvec_f32_ref(rk_wf, xl, rk_yref, n_out, n_in);
    rk_floats("matvec_f32", rk_y, rk_yref, n_out);
    colibri_matvec_f16_f32(rk_wh, xl, rk_y, n_out, n_in);
    colibri_matvec_f16_f32_ref(rk_wh, xl, rk_yref, n_out, n_in);
    rk_floats("matvec_f16_f32", rk_y, rk_yref, n_out);
    colibri_matvec_q4_f32(rk_w4, xl, rk_y, n_out, n_in);
    colibri_matvec_q4_f32_ref(rk_w4, xl, rk_yref, n_out, n_in);
    rk_floats("matvec_q4_f32", rk_y, rk_yref, n_out);
    colibri_matvec_q8_q8(rk_wq, rk_rs, xql, sxl, rk_y, n_out, n_in);
    colibri_matvec_q8_q8_ref(rk_wq, rk_rs, xql, sxl, rk_yref, n_out, n_in);
    rk_floats("matvec_q8_q8", rk_y, rk_yref, n_out);
    colibri_matvec_q8b_q8(rk_wq, rk_ws, xql, sxl, rk_y, n_out, n_in);
    colibri_matvec_q8b_q8_ref(rk_wq, rk_ws, xql, sxl, rk_yref, n_out, n_in);
    rk_floats("matvec_q8b_q8", rk_y, rk_yref, n_out);
    colibri_matvec_q4_q8(rk_w4, xql, sxl, rk_y, n_out, n_in);
    colibri_matvec_q4_q8_ref(rk_w4, xql, sxl, rk_yref, n_out, n_in);
    rk_floats("matvec_q4_q8", rk_y, rk_yref, n_out);
    /* multi-token kernels, row stride RK_LDY */
    rk_clear();
    colibri_matmul_q8_q8(rk_wq, rk_rs, rk_xq, rk_sx, rk_y, RK_LDY, n_out, n_in, n_tok);
    colibri_matmul_q8_q8_ref(rk_wq, rk_rs, rk_xq, rk_sx, rk_yref, RK_LDY, n_out, n_in, n_tok);
    rk_rows("matmul_q8_q8", n_out, n_tok);
    colibri_matmul_q8b_q8(rk_wq, rk_ws, rk_xq, rk_sx, rk_y, RK_LDY, n_out, n_in, n_tok);
    colibri_matmul_q8b_q8_ref(rk_wq, rk_ws, rk_xq, rk_sx, rk_yref, RK_LDY, n_out, n_in, n_tok);
    rk_rows("matmul_q8b_q8", n_out, n_tok);
    colibri_matmul_q4_q8(rk_w4, rk_xq, rk_sx, rk_y, RK_LDY, n_out, n_in, n_tok);
    colibri_matmul_q4_q8_ref(rk_w4, rk_xq, rk_sx, rk_yref, RK_LDY, n_out, n_in, n_tok);
    rk_rows("matmul_q4_q8", n_out, n_tok);
#if defined(COLIBRI_X86_DISPATCH)
    /* packed matrices (AVX-512 VNNI level; 0 bytes elsewhere or for shapes that do not pack) */
    static const int32_t kinds[3] = {COLIBRI_X86_PACK_Q8, COLIBRI_X86_PACK_Q8B,
                                     COLIBRI_X86_PACK_Q4};
    static const char *const names[3] = {"packed q8", "packed q8b", "packed q4"};
    for (int32_t k = 0; k < 3; k++) {
        const size_t bytes = colibri_x86_packed_bytes(kinds[k], n_out, n_in);
        if (bytes == 0u || bytes > sizeof rk_packed) {
            continue;
        }
        const void *w =
            (kinds[k] == COLIBRI_X86_PACK_Q4) ? (const void *)rk_w4 : (const void *)rk_wq;
        colibri_x86_pack(kinds[k], w, rk_ws, n_out, n_in, rk_packed);
        rk_clear();
        colibri_x86_matmul_packed(kinds[k], rk_packed,
                                  (kinds[k] == COLIBRI_X86_PACK_Q8) ? rk_rs : NULL, n_out, n_in, 0,
                                  n_out, rk_xq, rk_sx, rk_y, RK_LDY, n_tok);
        if (kinds[k] == COLIBRI_X86_PACK_Q8) {
            colibri_matmul_q8_q8_ref(rk_wq, rk_rs, rk_xq, rk_sx, rk_yref, RK_LDY, n_out, n_in,
                                     n_tok);
        } else if (kinds[k] == COLIBRI_X86_PACK_Q8B) {
            colibri_matmul_q8b_q8_ref(rk_wq, rk_ws, rk_xq, rk_sx, rk_yref, RK_LDY, n_out, n_in,
                                      n_tok);
        } else {
            colibri_matmul_q4_q8_ref(rk_w4, rk_xq, rk_sx, rk_yref, RK_LDY, n_out, n_in, n_tok);
        }
        rk_rows(names[k], n_out, n_tok);
    }
#endif
    /* element-wise: over all tokens' activations (rk_y / rk_yref as scratch) */
    const int32_t n = n_tok * n_in < RK_TOK * RK_LDY ? n_tok * n_in : RK_TOK * RK_LDY;
    for (int32_t i = 0; i < n; i++) {
        rk_y[i] = rk_yref[i] = 3.0f * rk_x[i];
    }
    colibri_silu_mul_f32(rk_y, rk_x + (n_tok * n_in - n), (size_t)n);
    colibri_silu_mul_f32_ref(rk_yref, rk_x + (n_tok * n_in - n), (size_t)n);
    rk_floats("silu_mul_f32", rk_y, rk_yref, n);
    for (int32_t i = 0; i < n; i++) {
        rk_y[i] = rk_yref[i] = 40.0f * rk_x[i]; /* x - m in about -207..113: both ends */
    }
    colibri_exp_shift_f32(rk_y, (size_t)n, 47.0f);
    colibri_exp_shift_f32_ref(rk_yref, (size_t)n, 47.0f);
    rk_floats("exp_shift_f32", rk_y, rk_yref, n);
    colibri_axpy_f32(rk_y, 0.37f, rk_x, n);
    colibri_axpy_f32_ref(rk_yref, 0.37f, rk_x, n);
    rk_floats("axpy_f32", rk_y, rk_yref, n);
    /* the attention's weighted sum: n_tok value rows of n_in, weights from the inputs */
    float w[RK_TOK];
    float wsum = 0.0f;
    for (int32_t t = 0; t < n_tok; t++) {
        w[t] = rk_x[t] * rk_x[t] + 0.5f;
        wsum += w[t];
    }
    colibri_wsum_f32(rk_y, w, wsum, rk_x, (size_t)n_in, n_tok, n_in);
    colibri_wsum_f32_ref(rk_yref, w, wsum, rk_x, (size_t)n_in, n_tok, n_in);
    rk_floats("wsum_f32", rk_y, rk_yref, n_in);
    rk_int("argmax_f32", n, colibri_argmax_f32(rk_x, n), colibri_argmax_f32_ref(rk_x, n));
    rk_x[n / 2] = INFINITY;
    rk_int("argmax_f32 inf", n, colibri_argmax_f32(rk_x, n), colibri_argmax_f32_ref(rk_x, n));
}

/* The int4 x int8 kernels on extreme operands (the MAC16 path's halves at their limits): the
 * matrix rk_w4 [RK_OUT][RK_NB4] with nibble pattern kind (0: all 0, 1: all 15, 2: 0 / 15 by
 * byte, 3: 0x0F / 0xF0 by byte), the codes rk_xq2 with pattern xk (0: -128, 1: 127, 2: -128 /
 * 127 alternating, 3: 127 / -128 / -128 / 127), read from byte offset off; and the int8 dot
 * product of those codes at offset off (a row at any alignment) with the aligned ones. */
static void rk_q4_extremes(void)
{
    static const uint8_t nib[4][2] = {
        {0x00u, 0x00u}, {0xFFu, 0xFFu}, {0x00u, 0xFFu}, {0x0Fu, 0xF0u}};
    static const int8_t codes[4][4] = {{-128, -128, -128, -128},
                                       {127, 127, 127, 127},
                                       {-128, 127, -128, 127},
                                       {127, -128, -128, 127}};
    for (int32_t kind = 0; kind < 4; kind++) {
        for (int32_t i = 0; i < RK_OUT * RK_NB4; i++) {
            for (int32_t j = 0; j < COLIBRI_QK4 / 2; j++) {
                rk_w4[i].qs[j] = nib[kind][(i + j) & 1];
            }
            rk_w4[i].d = (uint16_t)(0x3C00u + (uint32_t)i % 64u); /* 1.0 .. 1.06 */
        }
        for (int32_t xk = 0; xk < 4; xk++) {
            for (int32_t i = 0; i < RK_TOK * RK_IN; i++) {
                rk_xq2[i] = codes[xk][i & 3];
            }
            for (int32_t i = 0; i < RK_TOK * RK_NB8; i++) {
                rk_sx[i] = 0.001f * (float)(1 + i % 7);
            }
            for (int32_t off = 0; off < 4; off++) {
                const int8_t *xq = rk_xq2 + off;
                rk_shape[0] = kind;
                rk_shape[1] = xk;
                rk_shape[2] = off;
                if (kind == 0) { /* int8 rows at every byte offset against aligned codes */
                    for (int32_t n = 1; n <= RK_IN - 4; n++) {
                        rk_int("dot_q8 extremes", n, colibri_dot_q8(xq, rk_xq2, n),
                               colibri_dot_q8_ref(xq, rk_xq2, n));
                        rk_int("dot_q8 extremes, swapped", n, colibri_dot_q8(rk_xq2, xq, n),
                               colibri_dot_q8_ref(rk_xq2, xq, n));
                        /* against codes at offset 1: both misaligned (same or other offsets) */
                        rk_int("dot_q8 extremes, both", n, colibri_dot_q8(xq, rk_xq2 + 5, n),
                               colibri_dot_q8_ref(xq, rk_xq2 + 5, n));
                    }
                }
                /* blocks 0 and 1: qs 2-byte and 4-byte aligned (18-byte blocks), every length */
                for (int32_t b = 0; b < 2; b++) {
                    for (int32_t n = 1; n <= COLIBRI_QK4; n++) {
                        rk_int("dot_q4_q8 extremes", n, colibri_dot_q4_q8(rk_w4 + b, xq, n),
                               colibri_dot_q4_q8_ref(rk_w4 + b, xq, n));
                    }
                }
                /* matvecs: a short last block (n_in 99: 3 inputs), whole blocks (96; 128 and
                 * 256: one and two whole chunks of the MAC16 matvec), longer last blocks (84,
                 * 148: 20 inputs), odd row counts, as many rows as rk_w4 holds */
                static const int32_t n_ins[6] = {
                    RK_IN - 1,       3 * COLIBRI_QK4,      2 * COLIBRI_QK4 + 20,
                    4 * COLIBRI_QK4, 4 * COLIBRI_QK4 + 20, 8 * COLIBRI_QK4};
                for (int32_t k = 0; k < 6; k++) {
                    const int32_t n_in = n_ins[k];
                    const int32_t nb = (int32_t)COLIBRI_Q4_BLOCKS(n_in);
                    const int32_t n_out = RK_OUT * RK_NB4 / nb - k;
                    rk_clear();
                    colibri_matvec_q4_q8(rk_w4, xq, rk_sx, rk_y, n_out, n_in);
                    colibri_matvec_q4_q8_ref(rk_w4, xq, rk_sx, rk_yref, n_out, n_in);
                    rk_floats("matvec_q4_q8 extremes", rk_y, rk_yref, n_out);
                }
            }
        }
    }
}

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    clb_platform_init();
    /* the fp16 conversion: every bit pattern */
    for (uint32_t h = 0; h < 65536u; h++) {
        const float got = colibri_f16_to_f32((uint16_t)h);
        const float want = colibri_f16_to_f32_ref((uint16_t)h);
        rk_floats("f16_to_f32", &got, &want, 1);
    }
    rk_q4_extremes();
    uint32_t levels = 0;
    const int32_t start = colibri_kernel_level();
    for (int32_t s = 0; s < RK_SHAPES; s++) {
        int32_t n_out = 1 + (int32_t)(rk_next() % RK_OUT);
        int32_t n_in = 1 + (int32_t)(rk_next() % RK_IN);
        if (s % 4 == 1) { /* whole blocks (the packed layout, the AVX-512 ZMM steps) */
            n_in = COLIBRI_QK8 * (1 + (int32_t)(rk_next() % (RK_IN / COLIBRI_QK8)));
        }
        if (s % 4 != 0 && n_out < 16 && RK_OUT >= 17) { /* sixteen rows and more */
            n_out += 16;
        }
        const int32_t n_tok = 1 + s % RK_TOK;
        rk_shape[0] = n_out;
        rk_shape[1] = n_in;
        rk_shape[2] = n_tok;
        const uint32_t seed = rk_state;
        for (int32_t level = COLIBRI_KERNEL_BASE; level <= COLIBRI_KERNEL_AVX512_VNNI; level++) {
            if (colibri_kernel_set_level(level) != level) {
                continue;
            }
            levels |= 1u << level;
            rk_level = colibri_kernel_level_name(level);
            rk_state = seed; /* the same operands at every level */
            rk_fill(n_out, n_in, n_tok, s % 3 == 2);
            rk_compare(n_out, n_in, n_tok);
        }
    }
    /* the tiles of generated code against their twins (refkernels_tiles.c), at every level:
     * their fallbacks and tails call the library */
    uint32_t tile_checks = 0;
    for (int32_t level = COLIBRI_KERNEL_BASE; level <= COLIBRI_KERNEL_AVX512_VNNI; level++) {
        if (colibri_kernel_set_level(level) != level) {
            continue;
        }
        rk_level = colibri_kernel_level_name(level);
        rk_state = 0x9E3779B9u; /* the same operands at every level */
        tile_checks += rk_tiles();
    }
    (void)colibri_kernel_set_level(start);
    char line[200];
    char *p = clb_append(line, "colibri refkernels: ");
    p = clb_append_u32(p, rk_checks);
    p = clb_append(p, " checks, ");
    p = clb_append_u32(p, rk_failed);
    p = clb_append(p, " failed, ");
    p = clb_append_u32(p, RK_KERNELS);
    p = clb_append(p, " kernels, ");
    p = clb_append_u32(p, RK_TILES);
    p = clb_append(p, " tiles, levels");
    for (int32_t level = 0; level < 4; level++) {
        if (levels & (1u << level)) {
            p = clb_append(p, " ");
            p = clb_append(p, colibri_kernel_level_name(level));
        }
    }
    p = clb_append(p, "; tiles ");
    p = clb_append_u32(p, tile_checks);
    p = clb_append(p, " checks, ");
    p = clb_append(p, rk_tiles_paths());
    p = clb_append(p, "\n");
    *p = '\0';
    clb_platform_puts(line);
    return rk_failed == 0u ? 0 : 1;
}
