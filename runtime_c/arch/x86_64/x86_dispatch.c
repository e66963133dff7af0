/**
 * @file x86_dispatch.c
 * @brief x86-64 kernels chosen at run time by CPUID, so one binary built for the baseline ISA
 *        (-march=x86-64) uses AVX2 / F16C / AVX-VNNI / AVX-512 VNNI where the CPU has them.
 *
 * Each level is a table of function pointers (kernels_x86.h); the public kernels of
 * kernels_q.c call the level's function when the table has one, else run their own code (the
 * base level: kernels_q.c as the board's flags compile it, SSE2 dot products on x86-64). The
 * level is chosen on the first call by any thread (CPUID; the environment
 * variable COLIBRI_X86_LEVEL=base|avx2|avxvnni|avx512vnni caps it) and kept in a C11 atomic,
 * so it is also right when generated code calls the kernels before any init.
 *
 * This file holds the levels' tables (designated initialisers, one field per kernel of
 * colibri_x86_kernels_t), the CPUID choice and the public entry points; the kernels are in one
 * file per operation family and register width: x86_float.c (fp32 / fp16 matvecs, SiLU, axpy,
 * argmax), x86_matvec.c (one-token int8 / int4, 256-bit), x86_matvec_avx512.c (the same on
 * 512-bit registers), x86_matmul.c (multi-token, AVX2 and AVX-VNNI), x86_matmul_avx512.c
 * (multi-token and packed matrices, AVX-512 VNNI); x86_internal.h has what they share.
 *
 * Every path returns the bits of the base code. The integer kernels (int8 x int8, int4 x int8)
 * compute each block's int32 sum in any order (exact), then do the float steps of
 * colibri_quant.h lane by lane: eight output rows per AVX register, each lane one row, blocks in
 * order, a separate multiply and add (no FMA: these functions are not compiled for FMA). The
 * fp32 / fp16 matvecs also run eight rows per register: an 8 x 8 tile of weights is transposed
 * so each lane adds its own row's products in ascending i, as the scalar loop does.
 *
 *  - AVX2: int8 lanes sign-extended to int16 and multiplied in pairs (VPMADDWD); int4 nibbles
 *    (0..15, unsigned) times int8 with VPMADDUBSW (no saturation: 2 * 15 * 128 < 32767), summed
 *    in int16 by a VPHADDW tree (the matvec), minus 8 * sum(x) per block.
 *  - AVX-VNNI / AVX-512 VNNI (256-bit EVEX): VPDPBUSD multiplies unsigned by signed bytes, so
 *    int8 weights go in as w + 128 (w ^ 0x80) and the accumulator starts at -128 * sum(x) of
 *    each 4-byte group; int4 nibbles are already unsigned (accumulator starts at -8 * sum(x)).
 *    Exact for every int8 value, -128 included. The AVX-512 VNNI level's one-token matvecs
 *    (int8, block-scaled int8, int4) use 512-bit registers (colibri_x86_matvec_*_avx512z below: two
 * or four blocks a step, sixteen or 32 (row, block) sums per reduction); below eight rows it runs
 * the 256-bit code of AVX-VNNI.
 *
 * The multi-token kernels (colibri_matmul_q8_q8 / q8b_q8 / q4_q8, from two tokens) add blocking
 * over tokens: each block of eight rows' weights unpacked once per tile of tokens (AVX2: 2..8
 * tokens, a single token left over runs the matvec; AVX-VNNI: tiles of KX_TOK_TILE (4), the 1-3
 * left run the matvec; AVX-512 VNNI: sixteen rows per ZMM register, one lane per row, the
 * weights repacked once per 32 blocks for all the tokens, tiles of 1..8 tokens, see
 * kx_mm512_matmul; fewer than 4 tokens run the 512-bit matvec token by token); per token the same
 * float steps as the matvec, so the same bits.
 *
 * Packed matrices (AVX-512 VNNI; kernels_x86.h colibri_x86_pack / colibri_x86_matmul_packed):
 * whole models (lm_file.c) copy their int8 / int4 matrices once at load into kx_mm512_matmul's
 * sixteen-rows-per-register layout, so one token's matvec streams one contiguous run per matrix
 * with no horizontal reductions and no repacking; see colibri_x86_matmul_packed_avx512
 * (x86_matmul_avx512.c).
 */
#include "x86_internal.h"

#if defined(COLIBRI_X86_DISPATCH)

/* -- the levels and the choice ------------------------------------------------------------- */

/* The float kernels and element-wise operations are AVX2 code at every level above base. */
#define KX_FLOAT_KERNELS                                                                           \
    .matvec_f32 = colibri_x86_matvec_f32_avx2, .matvec_f16_f32 = colibri_x86_matvec_f16_f32_avx2,  \
    .silu_mul_f32 = colibri_x86_silu_mul_f32_avx2,                                                 \
    .exp_shift_f32 = colibri_x86_exp_shift_f32_avx2, .axpy_f32 = colibri_x86_axpy_f32_avx2,        \
    .wsum_f32 = colibri_x86_wsum_f32_avx2, .argmax_f32 = colibri_x86_argmax_f32_avx2,              \
    .first_above_f32 = colibri_x86_first_above_f32_avx2

/* The int8 / int4 kernels of a level: its one-token matvecs (suffix MV) and multi-token matmuls
 * (suffix MM). */
#define KX_INT_KERNELS(MV, MM)                                                                     \
    .matvec_q8_q8 = colibri_x86_matvec_q8_q8_##MV,                                                 \
    .matvec_q8b_q8 = colibri_x86_matvec_q8b_q8_##MV,                                               \
    .matvec_q4_q8 = colibri_x86_matvec_q4_q8_##MV, .matmul_q8_q8 = colibri_x86_matmul_q8_q8_##MM,  \
    .matmul_q8b_q8 = colibri_x86_matmul_q8b_q8_##MM, .matmul_q4_q8 = colibri_x86_matmul_q4_q8_##MM

/* The base level leaves every field NULL: kernels_q.c's own code runs. */
static const colibri_x86_kernels_t kx_levels[4] = {
    [COLIBRI_KERNEL_BASE] = {.matvec_f32 = NULL},
    [COLIBRI_KERNEL_AVX2] = {KX_FLOAT_KERNELS, KX_INT_KERNELS(avx2, avx2)},
#if defined(KX_HAVE_VNNI)
    [COLIBRI_KERNEL_AVX_VNNI] = {KX_FLOAT_KERNELS, KX_INT_KERNELS(avxvnni, avxvnni)},
    [COLIBRI_KERNEL_AVX512_VNNI] = {KX_FLOAT_KERNELS, KX_INT_KERNELS(avx512z, avx512),
                                    .quantize_row_q8 = colibri_x86_quantize_row_q8_avx512},
#endif
};

static const char *const kx_names[4] = {"base", "avx2", "avxvnni", "avx512vnni"};

/* -1 until the first call has chosen. */
static atomic_int kx_level = -1;

/* CPU features, from CPUID and XGETBV (the OS must save the YMM / ZMM registers): read here
 * rather than with __builtin_cpu_supports, whose feature names differ between compilers. */
enum { KX_HAS_AVX2 = 1, KX_HAS_AVXVNNI = 2, KX_HAS_AVX512VNNI = 4 };

static unsigned kx_features(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) {
        return 0u;
    }
    const int osxsave = (c >> 27) & 1u;
    const int avx = (c >> 28) & 1u;
    const int f16c = (c >> 29) & 1u;
    if (!osxsave || !avx || !f16c || (unsigned)__get_cpuid_max(0, NULL) < 7u) {
        return 0u;
    }
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0u));
    (void)hi;
    if ((lo & 0x6u) != 0x6u) { /* XMM and YMM state */
        return 0u;
    }
    const int zmm = (lo & 0xE6u) == 0xE6u; /* and opmask, ZMM_Hi256, Hi16_ZMM */
    __cpuid_count(7, 0, a, b, c, d);
    unsigned features = 0u;
    if ((b >> 5) & 1u) {
        features |= KX_HAS_AVX2;
    }
    const int avx512 = zmm && ((b >> 16) & 1u) && ((b >> 30) & 1u) && ((b >> 31) & 1u);
    if (avx512 && ((c >> 11) & 1u)) { /* F, BW, VL and VNNI */
        features |= KX_HAS_AVX512VNNI;
    }
    __cpuid_count(7, 1, a, b, c, d);
    if ((a >> 4) & 1u) {
        features |= KX_HAS_AVXVNNI;
    }
    return features;
}

static int kx_cpu_has(int32_t level)
{
    const unsigned f = kx_features();
    const int avx2 = (f & KX_HAS_AVX2) != 0u;
    switch (level) {
    case COLIBRI_KERNEL_BASE:
        return 1;
    case COLIBRI_KERNEL_AVX2:
        return avx2;
#if defined(KX_HAVE_VNNI)
    case COLIBRI_KERNEL_AVX_VNNI:
        return avx2 && (f & KX_HAS_AVXVNNI) != 0u;
    case COLIBRI_KERNEL_AVX512_VNNI:
        return avx2 && (f & KX_HAS_AVX512VNNI) != 0u;
#endif
    default:
        return 0;
    }
}

/* The highest level the CPU has at or below `cap`. */
static int32_t kx_best(int32_t cap)
{
    int32_t level = (cap > COLIBRI_KERNEL_AVX512_VNNI) ? COLIBRI_KERNEL_AVX512_VNNI : cap;
    while (level > COLIBRI_KERNEL_BASE && !kx_cpu_has(level)) {
        level--;
    }
    return (level < COLIBRI_KERNEL_BASE) ? COLIBRI_KERNEL_BASE : level;
}

static int32_t kx_choose(void)
{
    int32_t cap = COLIBRI_KERNEL_AVX512_VNNI;
    const char *env = getenv("COLIBRI_X86_LEVEL");
    if (env != NULL && env[0] != '\0') {
        if (strcmp(env, "portable") == 0 || strcmp(env, "sse2") == 0) {
            cap = COLIBRI_KERNEL_BASE;
        } else if (strcmp(env, "vnni") == 0) {
            cap = COLIBRI_KERNEL_AVX512_VNNI;
        } else {
            for (int32_t l = 0; l < 4; l++) {
                if (strcmp(env, kx_names[l]) == 0) {
                    cap = l;
                }
            }
        }
    }
    return kx_best(cap);
}

const colibri_x86_kernels_t *colibri_x86_kernels(void)
{
    int level = atomic_load_explicit(&kx_level, memory_order_relaxed);
    if (level < 0) { /* every racing thread computes the same value */
        level = kx_choose();
        atomic_store_explicit(&kx_level, level, memory_order_relaxed);
    }
    return &kx_levels[level];
}

int32_t colibri_kernel_level(void)
{
    (void)colibri_x86_kernels();
    return atomic_load_explicit(&kx_level, memory_order_relaxed);
}

int32_t colibri_kernel_set_level(int32_t level)
{
    const int32_t chosen = kx_best(level);
    atomic_store_explicit(&kx_level, chosen, memory_order_relaxed);
    return chosen;
}

const char *colibri_kernel_level_name(int32_t level)
{
    return (level >= 0 && level < 4) ? kx_names[level] : "unknown";
}

size_t colibri_x86_packed_bytes(int32_t kind, int32_t n_out, int32_t n_in)
{
#if defined(KX_HAVE_VNNI)
    if (colibri_kernel_level() != COLIBRI_KERNEL_AVX512_VNNI || kind < COLIBRI_X86_PACK_Q8 ||
        kind > COLIBRI_X86_PACK_Q4 || n_out < 16 || n_in <= 0 || n_in % COLIBRI_QK8 != 0) {
        return 0u;
    }
    return colibri_x86_packed_bytes_avx512(kind, n_out, n_in);
#else
    (void)kind;
    (void)n_out;
    (void)n_in;
    return 0u;
#endif
}

void colibri_x86_pack(int32_t kind, const void *w, const float *scale, int32_t n_out, int32_t n_in,
                      void *dst)
{
#if defined(KX_HAVE_VNNI)
    colibri_x86_pack_avx512(kind, w, scale, n_out, n_in, dst);
#else
    (void)kind;
    (void)w;
    (void)scale;
    (void)n_out;
    (void)n_in;
    (void)dst;
#endif
}

#if defined(KX_HAVE_VNNI)
void colibri_x86_matmul_packed(int32_t kind, const void *packed, const float *rscale, int32_t n_out,
                               int32_t n_in, int32_t r0, int32_t r1, const int8_t *xq,
                               const float *sx, float *y, int32_t ldy, int32_t n_tok)
{
    colibri_x86_matmul_packed_avx512(kind, packed, rscale, n_out, n_in, r0, r1, xq, sx, y, ldy,
                                     n_tok);
}
#endif

#else
/* Not x86-64 (or COLIBRI_NO_X86_DISPATCH): kernels_q.c is the only path. ISO C wants a
 * declaration in every translation unit. */
typedef int colibri_kernels_x86_unused;
#endif
