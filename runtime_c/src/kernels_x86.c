/**
 * @file kernels_x86.c
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
 *    (int8, block-scaled int8, int4) use 512-bit registers (kx_matvec_*_avx512z below: two or
 *    four blocks a step, sixteen or 32 (row, block) sums per reduction); below eight rows it
 *    runs the 256-bit code of AVX-VNNI.
 *
 * The multi-token kernels (colibri_matmul_q8_q8 / q8b_q8 / q4_q8, from two tokens) add blocking
 * over tokens: each block of eight rows' weights unpacked once per tile of tokens (AVX2: 2..8
 * tokens, a single token left over runs the matvec; AVX-VNNI: tiles of KX_TOK_TILE (4), the 1-3
 * left run the matvec; AVX-512 VNNI: sixteen rows per ZMM register, one lane per row, the
 * weights repacked once per 32 blocks for all the tokens, tiles of 1..8 tokens, see kx5_matmul;
 * fewer than 4 tokens run the 512-bit matvec token by token);
 * per token the same float steps as the matvec, so the same bits.
 *
 * Packed matrices (AVX-512 VNNI; kernels_x86.h colibri_x86_pack / colibri_x86_matmul_packed):
 * whole models (lm_file.c) copy their int8 / int4 matrices once at load into kx5_matmul's
 * sixteen-rows-per-register layout, so one token's matvec streams one contiguous run per matrix
 * with no horizontal reductions and no repacking; see kxp_matmul.
 */
#include "kernels_x86.h"

#include "colibri_math.h"
#include "colibri_quant.h"

#include <stddef.h>
#include <stdint.h>

#if defined(COLIBRI_X86_DISPATCH)
#include <cpuid.h>
#include <immintrin.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define KX_AVX2 __attribute__((target("avx2,f16c")))
/* AVX-VNNI / AVX-512 VNNI need GCC 11 or clang 12 (target names and intrinsics); older compilers
 * build the base and AVX2 levels only. */
#if (defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11)
#define KX_HAVE_VNNI 1
#endif
#define KX_AVXVNNI __attribute__((target("avx2,f16c,avxvnni")))
#define KX_AVX512VNNI __attribute__((target("avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define KX_INLINE static inline __attribute__((always_inline))
/* the int8 / int4 matvecs stay functions of their own where the multi-token kernels call them */
#define KX_NOINLINE __attribute__((noinline))
/* the loops over the eight rows of a group, whole (their values stay in registers) */
#define KX_UNROLL _Pragma("GCC unroll 8")

/* -- shared pieces (AVX2) -------------------------------------------------------------------- */

/* Lane r = the sum of the eight int32 lanes of p[r]. */
KX_INLINE KX_AVX2 __m256i kx_hsum8(const __m256i p[8])
{
    const __m256i s01 = _mm256_hadd_epi32(p[0], p[1]);
    const __m256i s23 = _mm256_hadd_epi32(p[2], p[3]);
    const __m256i s45 = _mm256_hadd_epi32(p[4], p[5]);
    const __m256i s67 = _mm256_hadd_epi32(p[6], p[7]);
    const __m256i s0123 = _mm256_hadd_epi32(s01, s23);
    const __m256i s4567 = _mm256_hadd_epi32(s45, s67);
    return _mm256_add_epi32(_mm256_permute2x128_si256(s0123, s4567, 0x20),
                            _mm256_permute2x128_si256(s0123, s4567, 0x31));
}

/* c[j] lane r = r[r][j]: the transpose of an 8 x 8 tile of floats. */
KX_INLINE KX_AVX2 void kx_transpose8(__m256 r[8])
{
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]);
    const __m256 t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]);
    const __m256 t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]);
    const __m256 t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]);
    const __m256 t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44);
    const __m256 s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44);
    const __m256 s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44);
    const __m256 s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44);
    const __m256 s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
    r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
    r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

/* y[0..nr) = the first nr lanes of v. */
KX_INLINE KX_AVX2 void kx_store_rows(float *y, __m256 v, int32_t nr)
{
    if (nr == 8) {
        _mm256_storeu_ps(y, v);
    } else {
        float tmp[8];
        _mm256_storeu_ps(tmp, v);
        memcpy(y, tmp, (size_t)nr * sizeof(float));
    }
}

/* Software prefetch of n lines from p on (48 bytes apart: every 64-byte line of a run of
 * 48 * n bytes, or 64 * n when n = 4): the matvecs read eight rows at once, short streams
 * (1 KB to a few KB) the hardware prefetchers barely learn before they end, so each block step
 * prefetches its share of the next group of eight rows, which is contiguous. A prefetch never
 * faults, and past the end of the weights it reads what follows them, or nothing. The
 * addresses are integers (uintptr_t): a pointer past the end of the weights would be undefined
 * behaviour in C, an address handed to the prefetch hint is not. */
KX_INLINE void kx_prefetch(uintptr_t p, int n)
{
    const uintptr_t step = (n == 4) ? 64u : 48u;
    for (int k = 0; k < n; k++) {
        _mm_prefetch((const char *)(p + (uintptr_t)k * step), _MM_HINT_T0);
    }
}

#if defined(KX_HAVE_VNNI)
/* How many bytes ahead of the packed matrices' stream their kernels prefetch into L2 (0: none):
 * COLIBRI_X86_PREFETCH=<bytes> in the environment (0 turns it off; at most 1 MiB), else 8192 on
 * Intel CPUs and 0 elsewhere, chosen on the first call. On a Xeon (Sapphire Rapids family, one
 * core) the hardware prefetchers alone streamed a packed int8 model at 14.6 GB/s, the speed of a
 * plain read loop; 8 KB ahead into L2 took issue 13's int8 decode from 121-134 to 135-157
 * tokens/s and int4 from 142-152 to 217-234 (interleaved runs); into L1 int8 reached only
 * 137-149. On a Zen 4 every distance tried into L1 was slower than none (see the packed
 * matrices' comment), so AMD CPUs keep the hardware's stream alone. Outputs do not depend on
 * it. */
static atomic_int kx_ahead_bytes = -1;

static int32_t kx_ahead(void)
{
    int v = atomic_load_explicit(&kx_ahead_bytes, memory_order_relaxed);
    if (v < 0) { /* every racing thread computes the same value */
        const char *env = getenv("COLIBRI_X86_PREFETCH");
        if (env != NULL && env[0] != '\0') {
            const long n = strtol(env, NULL, 10);
            v = (n <= 0) ? 0 : (n > (1L << 20)) ? (1 << 20) : (int)n;
        } else {
            unsigned a = 0u, b = 0u, c = 0u, d = 0u;
            /* vendor "GenuineIntel": EBX, EDX, ECX of leaf 0 */
            const int intel = __get_cpuid(0, &a, &b, &c, &d) && b == 0x756E6547u &&
                              d == 0x49656E69u && c == 0x6C65746Eu;
            v = intel ? 8192 : 0;
        }
        atomic_store_explicit(&kx_ahead_bytes, v, memory_order_relaxed);
    }
    return v;
}
#endif

/* -- fp32 and fp16 weights x fp32: eight rows per register, each lane in i order ------------- */

/* Rows beyond n_out read row 0 of the group again (valid memory); their lanes are not stored. */
#define KX_FLOAT_MATVEC(NAME, TARGET, WTYPE, LOAD8, SCALAR)                                        \
    static TARGET void NAME(const WTYPE *w, const float *x, float *y, int32_t n_out, int32_t n_in) \
    {                                                                                              \
        for (int32_t o0 = 0; o0 < n_out; o0 += 8) {                                                \
            const int32_t nr = (n_out - o0 < 8) ? n_out - o0 : 8;                                  \
            const WTYPE *row[8];                                                                   \
            KX_UNROLL for (int32_t r = 0; r < 8; r++)                                              \
            {                                                                                      \
                row[r] = w + (size_t)(o0 + (r < nr ? r : 0)) * (size_t)n_in;                       \
            }                                                                                      \
            __m256 acc = _mm256_setzero_ps();                                                      \
            int32_t i = 0;                                                                         \
            for (; i + 8 <= n_in; i += 8) {                                                        \
                __m256 c[8];                                                                       \
                KX_UNROLL for (int32_t r = 0; r < 8; r++)                                          \
                {                                                                                  \
                    c[r] = LOAD8(row[r] + i);                                                      \
                }                                                                                  \
                kx_transpose8(c);                                                                  \
                KX_UNROLL for (int32_t j = 0; j < 8; j++)                                          \
                {                                                                                  \
                    acc = _mm256_add_ps(acc, _mm256_mul_ps(c[j], _mm256_set1_ps(x[i + j])));       \
                }                                                                                  \
            }                                                                                      \
            for (; i < n_in; i++) {                                                                \
                const __m256 c = _mm256_setr_ps(                                                   \
                    SCALAR(row[0][i]), SCALAR(row[1][i]), SCALAR(row[2][i]), SCALAR(row[3][i]),    \
                    SCALAR(row[4][i]), SCALAR(row[5][i]), SCALAR(row[6][i]), SCALAR(row[7][i]));   \
                acc = _mm256_add_ps(acc, _mm256_mul_ps(c, _mm256_set1_ps(x[i])));                  \
            }                                                                                      \
            kx_store_rows(y + o0, acc, nr);                                                        \
        }                                                                                          \
    }

#define KX_LOAD_F32(p) _mm256_loadu_ps(p)
#define KX_LOAD_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p)))
#define KX_SCALAR_F32(v) (v)
#define KX_SCALAR_F16(v) colibri_f16_to_f32(v)

KX_FLOAT_MATVEC(kx_matvec_f32_avx2, KX_AVX2, float, KX_LOAD_F32, KX_SCALAR_F32)

/* colibri_expf (colibri_math.h) on eight lanes, operation for operation: the same bits. */
KX_INLINE KX_AVX2 __m256 kx_expf8(__m256 x)
{
    const __m256 t = _mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(COLIBRI_EXP_LOG2E)),
                                   _mm256_set1_ps(COLIBRI_EXP_ROUND));
    const __m256 n = _mm256_sub_ps(t, _mm256_set1_ps(COLIBRI_EXP_ROUND));
    const __m256 r =
        _mm256_sub_ps(_mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(COLIBRI_EXP_LN2_HI))),
                      _mm256_mul_ps(n, _mm256_set1_ps(COLIBRI_EXP_LN2_LO)));
    const __m256 z = _mm256_mul_ps(r, r);
    __m256 p = _mm256_set1_ps(COLIBRI_EXP_P0);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(COLIBRI_EXP_P1));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(COLIBRI_EXP_P2));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(COLIBRI_EXP_P3));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(COLIBRI_EXP_P4));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(COLIBRI_EXP_P5));
    const __m256 y = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(p, z), r), _mm256_set1_ps(1.0f));
    const __m256 top = _mm256_cmp_ps(n, _mm256_set1_ps(127.0f), _CMP_GT_OQ);
    /* bits - top + (127 - ROUND_BITS), shifted: top is all ones (-1) where n > 127 */
    const __m256i bits = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(_mm256_castps_si256(t), _mm256_castps_si256(top)),
                         _mm256_set1_epi32((int32_t)(127u - COLIBRI_EXP_ROUND_BITS))),
        23);
    const __m256 ys = _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
    __m256 e = _mm256_blendv_ps(ys, _mm256_mul_ps(ys, _mm256_set1_ps(2.0f)), top);
    e = _mm256_blendv_ps(e, _mm256_set1_ps(INFINITY),
                         _mm256_cmp_ps(x, _mm256_set1_ps(COLIBRI_EXP_MAX), _CMP_GT_OQ));
    return _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(COLIBRI_EXP_MIN), _CMP_LT_OQ), e);
}

static KX_AVX2 void kx_silu_mul_f32_avx2(float *h, const float *g, size_t n)
{
    size_t j = 0;
    for (; j + 8u <= n; j += 8u) {
        const __m256 v = _mm256_loadu_ps(h + j);
        const __m256 e = kx_expf8(_mm256_sub_ps(_mm256_setzero_ps(), v));
        const __m256 s = _mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
        _mm256_storeu_ps(h + j, _mm256_mul_ps(s, _mm256_loadu_ps(g + j)));
    }
    for (; j < n; ++j) {
        h[j] = colibri_silu(h[j]) * g[j];
    }
}

/* Two passes over x (in cache for a vocabulary of logits): the largest value and whether any
 * is NaN / infinite (exponent all ones), then the first index holding it. */
static KX_AVX2 int32_t kx_argmax_f32_avx2(const float *x, int32_t n)
{
    const __m256i expo = _mm256_set1_epi32(0x7F800000);
    __m256 mx = _mm256_set1_ps(-INFINITY);
    __m256i bad = _mm256_setzero_si256();
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256i e = _mm256_and_si256(_mm256_castps_si256(v), expo);
        bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(e, expo));
        mx = _mm256_max_ps(mx, v);
    }
    float m[8];
    _mm256_storeu_ps(m, mx);
    float best = m[0];
    for (int k = 1; k < 8; k++) {
        best = (m[k] > best) ? m[k] : best;
    }
    if (!_mm256_testz_si256(bad, bad)) {
        return -1;
    }
    for (int32_t j = i; j < n; j++) {
        if (!isfinite(x[j])) {
            return -1;
        }
        best = (x[j] > best) ? x[j] : best;
    }
    const __m256 bv = _mm256_set1_ps(best);
    for (i = 0; i + 8 <= n; i += 8) {
        const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), bv, _CMP_EQ_OQ));
        if (hit != 0) {
            return i + __builtin_ctz((unsigned)hit);
        }
    }
    for (; i < n; i++) {
        if (x[i] == best) {
            break;
        }
    }
    return i;
}

static KX_AVX2 void kx_axpy_f32_avx2(float *y, float a, const float *x, int32_t n)
{
    const __m256 av = _mm256_set1_ps(a);
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i),
                                              _mm256_mul_ps(av, _mm256_loadu_ps(x + i))));
    }
    for (; i < n; i++) {
        y[i] += a * x[i];
    }
}
KX_FLOAT_MATVEC(kx_matvec_f16_f32_avx2, KX_AVX2, uint16_t, KX_LOAD_F16, KX_SCALAR_F16)

/* -- int8 weights x int8 activations ------------------------------------------------------- */

/* One block of 32 products per row, lanes of p[r] summing to row r's int32 block sum. */
KX_INLINE KX_AVX2 void kx_q8_block_avx2(const int8_t *const row[8], size_t i0, const int8_t *x,
                                        __m256i p[8])
{
    const __m256i xlo = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)x));
    const __m256i xhi =
        _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(x + 16)));
    KX_UNROLL for (int32_t r = 0; r < 8; r++)
    {
        const int8_t *wr = row[r] + i0;
        const __m256i wlo =
            _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)wr));
        const __m256i whi =
            _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(wr + 16)));
        p[r] = _mm256_add_epi32(_mm256_madd_epi16(wlo, xlo), _mm256_madd_epi16(whi, xhi));
    }
}

#if defined(KX_HAVE_VNNI)
#define KX_Q8_BLOCK_VNNI(NAME, TARGET, DPBUSD)                                                     \
    KX_INLINE TARGET void NAME(const int8_t *const row[8], size_t i0, const int8_t *x,             \
                               __m256i p[8])                                                       \
    {                                                                                              \
        const __m256i k80 = _mm256_set1_epi8((char)0x80);                                          \
        const __m256i xv = _mm256_loadu_si256((const __m256i *)(const void *)x);                   \
        /* -128 * (sum of each 4 x), so that adding (w + 128) * x leaves w * x */                  \
        const __m256i corr =                                                                       \
            _mm256_sub_epi32(_mm256_setzero_si256(), DPBUSD(_mm256_setzero_si256(), k80, xv));     \
        KX_UNROLL for (int32_t r = 0; r < 8; r++)                                                  \
        {                                                                                          \
            const __m256i wv = _mm256_xor_si256(                                                   \
                _mm256_loadu_si256((const __m256i *)(const void *)(row[r] + i0)), k80);            \
            p[r] = DPBUSD(corr, wv, xv);                                                           \
        }                                                                                          \
    }

#define KX_DPBUSD_AVX(a, b, c) _mm256_dpbusd_avx_epi32(a, b, c)
#define KX_DPBUSD_512(a, b, c) _mm256_dpbusd_epi32(a, b, c)
KX_Q8_BLOCK_VNNI(kx_q8_block_avxvnni, KX_AVXVNNI, KX_DPBUSD_AVX)
KX_Q8_BLOCK_VNNI(kx_q8_block_avx512vnni, KX_AVX512VNNI, KX_DPBUSD_512)
#endif

/*
 * int8 weights, int8 activations, eight rows at a time. BLOCKED 0: colibri_matvec_q8_q8
 * (acc += (float)isum_b * sx[b]; y = acc * scale[o]); 1: colibri_matvec_q8b_q8
 * (acc += (float)isum_b * (scale[o][b] * sx[b]); y = acc). A partial last block is computed on
 * zero-padded copies (zeros add nothing to an integer sum).
 */
#define KX_Q8_MATVEC(NAME, TARGET, BLOCK, BLOCKED)                                                 \
    static KX_NOINLINE TARGET void NAME(const int8_t *q, const float *scale, const int8_t *xq,     \
                                        const float *sx, float *y, int32_t n_out, int32_t n_in)    \
    {                                                                                              \
        const int32_t full = n_in / COLIBRI_QK8;                                                   \
        const int32_t tail = n_in - full * COLIBRI_QK8;                                            \
        const int32_t nb = (int32_t)COLIBRI_Q8_BLOCKS(n_in);                                       \
        int8_t xpad[COLIBRI_QK8];                                                                  \
        if (tail > 0) {                                                                            \
            memset(xpad, 0, sizeof xpad);                                                          \
            memcpy(xpad, xq + (size_t)full * COLIBRI_QK8, (size_t)tail);                           \
        }                                                                                          \
        for (int32_t o0 = 0; o0 < n_out; o0 += 8) {                                                \
            const int32_t nr = (n_out - o0 < 8) ? n_out - o0 : 8;                                  \
            const int8_t *row[8];                                                                  \
            int32_t sidx[8];                                                                       \
            KX_UNROLL for (int32_t r = 0; r < 8; r++)                                              \
            {                                                                                      \
                const int32_t o = o0 + (r < nr ? r : 0);                                           \
                row[r] = q + (size_t)o * (size_t)n_in;                                             \
                sidx[r] = (BLOCKED) ? o * nb : o;                                                  \
            }                                                                                      \
            const __m256i vidx = _mm256_loadu_si256((const __m256i *)(const void *)sidx);          \
            /* the next group of rows (contiguous), 256 bytes per block; q8b: and its scales */    \
            const uintptr_t pf = (uintptr_t)q + (size_t)(o0 + 8) * (size_t)n_in;                   \
            const uintptr_t pfs =                                                                  \
                (uintptr_t)scale + (size_t)(o0 + 8) * (size_t)nb * sizeof *scale;                  \
            __m256 acc = _mm256_setzero_ps();                                                      \
            __m256i p[8];                                                                          \
            for (int32_t b = 0; b < nb; b++) {                                                     \
                kx_prefetch(pf + (size_t)b * 256u, 4);                                             \
                if (BLOCKED) {                                                                     \
                    _mm_prefetch((const char *)(pfs + (size_t)b * 32u), _MM_HINT_T0);              \
                }                                                                                  \
                if (b < full) {                                                                    \
                    BLOCK(row, (size_t)b *COLIBRI_QK8, xq + (size_t)b * COLIBRI_QK8, p);           \
                } else {                                                                           \
                    int8_t wpad[8][COLIBRI_QK8];                                                   \
                    const int8_t *prow[8];                                                         \
                    memset(wpad, 0, sizeof wpad);                                                  \
                    KX_UNROLL for (int32_t r = 0; r < 8; r++)                                      \
                    {                                                                              \
                        memcpy(wpad[r], row[r] + (size_t)full * COLIBRI_QK8, (size_t)tail);        \
                        prow[r] = wpad[r];                                                         \
                    }                                                                              \
                    BLOCK(prow, 0, xpad, p);                                                       \
                }                                                                                  \
                const __m256 f = _mm256_cvtepi32_ps(kx_hsum8(p));                                  \
                if (BLOCKED) {                                                                     \
                    const __m256 ws = _mm256_i32gather_ps(scale + b, vidx, 4);                     \
                    acc = _mm256_add_ps(                                                           \
                        acc, _mm256_mul_ps(f, _mm256_mul_ps(ws, _mm256_set1_ps(sx[b]))));          \
                } else {                                                                           \
                    acc = _mm256_add_ps(acc, _mm256_mul_ps(f, _mm256_set1_ps(sx[b])));             \
                }                                                                                  \
            }                                                                                      \
            if (!(BLOCKED)) {                                                                      \
                acc = _mm256_mul_ps(acc, _mm256_i32gather_ps(scale, vidx, 4));                     \
            }                                                                                      \
            kx_store_rows(y + o0, acc, nr);                                                        \
        }                                                                                          \
    }

KX_Q8_MATVEC(kx_matvec_q8_q8_avx2, KX_AVX2, kx_q8_block_avx2, 0)
KX_Q8_MATVEC(kx_matvec_q8b_q8_avx2, KX_AVX2, kx_q8_block_avx2, 1)
#if defined(KX_HAVE_VNNI)
KX_Q8_MATVEC(kx_matvec_q8_q8_avxvnni, KX_AVXVNNI, kx_q8_block_avxvnni, 0)
KX_Q8_MATVEC(kx_matvec_q8b_q8_avxvnni, KX_AVXVNNI, kx_q8_block_avxvnni, 1)
KX_Q8_MATVEC(kx_matvec_q8_q8_avx512vnni, KX_AVX512VNNI, kx_q8_block_avx512vnni, 0)
KX_Q8_MATVEC(kx_matvec_q8b_q8_avx512vnni, KX_AVX512VNNI, kx_q8_block_avx512vnni, 1)
#endif

/* -- int4 blocks x int8 activations -------------------------------------------------------- */

/* The 32 nibbles of a block as unsigned bytes 0..15, in the order of x (low halves first). */
KX_INLINE KX_AVX2 __m256i kx_nibbles(const colibri_block_q4_32 *blk)
{
    const __m128i v = _mm_loadu_si128((const __m128i *)(const void *)blk->qs);
    const __m128i m = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}

#if defined(KX_HAVE_VNNI)
#define KX_Q4_BLOCK_VNNI(NAME, TARGET, DPBUSD)                                                     \
    KX_INLINE TARGET void NAME(const colibri_block_q4_32 *const blk[8], const int8_t *x,           \
                               __m256i p[8])                                                       \
    {                                                                                              \
        const __m256i xv = _mm256_loadu_si256((const __m256i *)(const void *)x);                   \
        const __m256i corr = _mm256_sub_epi32(                                                     \
            _mm256_setzero_si256(), DPBUSD(_mm256_setzero_si256(), _mm256_set1_epi8(8), xv));      \
        KX_UNROLL for (int32_t r = 0; r < 8; r++)                                                  \
        {                                                                                          \
            p[r] = DPBUSD(corr, kx_nibbles(blk[r]), xv);                                           \
        }                                                                                          \
    }

KX_Q4_BLOCK_VNNI(kx_q4_block_avxvnni, KX_AVXVNNI, KX_DPBUSD_AVX)
KX_Q4_BLOCK_VNNI(kx_q4_block_avx512vnni, KX_AVX512VNNI, KX_DPBUSD_512)
#endif

/* colibri_matvec_q4_q8: acc += (float)isum_b * (d_b * sx[b]) per row, blocks in order; a
 * partial last block reads x from a zero-padded copy, so its unused nibbles add nothing. */
#define KX_Q4_MATVEC(NAME, TARGET, BLOCK)                                                          \
    static KX_NOINLINE TARGET void NAME(const colibri_block_q4_32 *w, const int8_t *xq,            \
                                        const float *sx, float *y, int32_t n_out, int32_t n_in)    \
    {                                                                                              \
        const int32_t nb = (int32_t)COLIBRI_Q4_BLOCKS(n_in);                                       \
        const int32_t full = n_in / COLIBRI_QK4;                                                   \
        int8_t xpad[COLIBRI_QK4];                                                                  \
        if (full < nb) {                                                                           \
            memset(xpad, 0, sizeof xpad);                                                          \
            memcpy(xpad, xq + (size_t)full * COLIBRI_QK4, (size_t)(n_in - full * COLIBRI_QK4));    \
        }                                                                                          \
        for (int32_t o0 = 0; o0 < n_out; o0 += 8) {                                                \
            const int32_t nr = (n_out - o0 < 8) ? n_out - o0 : 8;                                  \
            const colibri_block_q4_32 *row[8];                                                     \
            KX_UNROLL for (int32_t r = 0; r < 8; r++)                                              \
            {                                                                                      \
                row[r] = w + (size_t)(o0 + (r < nr ? r : 0)) * (size_t)nb;                         \
            }                                                                                      \
            __m256 acc = _mm256_setzero_ps();                                                      \
            __m256i p[8];                                                                          \
            for (int32_t b = 0; b < nb; b++) {                                                     \
                const colibri_block_q4_32 *blk[8];                                                 \
                KX_UNROLL for (int32_t r = 0; r < 8; r++)                                          \
                {                                                                                  \
                    blk[r] = row[r] + b;                                                           \
                }                                                                                  \
                BLOCK(blk, (b < full) ? xq + (size_t)b *COLIBRI_QK4 : xpad, p);                    \
                const __m128i dh = _mm_setr_epi16(                                                 \
                    (short)blk[0]->d, (short)blk[1]->d, (short)blk[2]->d, (short)blk[3]->d,        \
                    (short)blk[4]->d, (short)blk[5]->d, (short)blk[6]->d, (short)blk[7]->d);       \
                const __m256 ds = _mm256_mul_ps(_mm256_cvtph_ps(dh), _mm256_set1_ps(sx[b]));       \
                acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_cvtepi32_ps(kx_hsum8(p)), ds));      \
            }                                                                                      \
            kx_store_rows(y + o0, acc, nr);                                                        \
        }                                                                                          \
    }

/*
 * colibri_matvec_q4_q8, AVX2: the float steps of KX_Q4_MATVEC (eight rows, one per lane, blocks
 * in order), fewer integer instructions per block. A row's 16 bytes are loaded into both halves
 * of a register and the high half shifted right by 4 (VPSRLVD), one AND leaving the low nibbles
 * below the high ones, in the order of x; VPMADDUBSW gives 16 int16 pair sums per row, which three
 * levels of VPHADDW reduce to one int16 per row and half (16 products of |nibble * x| <= 15 * 128:
 * |sum| <= 30720, no wrap), widened and added to int32; the -8 offset is -8 * sum(x) per block,
 * the same for every row, computed once per call (KX_Q4_CORR blocks at a time).
 */
#define KX_Q4_CORR 256

/* c[k] = -8 * sum of the 32 codes of block k (k < n), x zero-padded past n_in. */
KX_INLINE KX_AVX2 void kx_q4_corr_avx2(const int8_t *xq, int32_t n_in, int32_t b0, int32_t n,
                                       int32_t *c)
{
    const __m256i ones8 = _mm256_set1_epi8(1);
    const __m256i ones16 = _mm256_set1_epi16(1);
    for (int32_t k = 0; k < n; k++) {
        const int32_t i0 = (b0 + k) * COLIBRI_QK4;
        const int32_t m = (n_in - i0 < COLIBRI_QK4) ? n_in - i0 : COLIBRI_QK4;
        int8_t pad[COLIBRI_QK4];
        const int8_t *xb = xq + i0;
        if (m < COLIBRI_QK4) {
            memset(pad, 0, sizeof pad);
            memcpy(pad, xb, (size_t)m);
            xb = pad;
        }
        const __m256i xv = _mm256_loadu_si256((const __m256i *)(const void *)xb);
        const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, xv), ones16);
        __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xB1));
        c[k] = -8 * _mm_cvtsi128_si32(h);
    }
}

/* Lane r = the int32 dot product of block row[r] + b (nibbles, unsigned) with the 32 codes at x.
 * Rows r and r + 4 share a register (one in each half): one shift and two ANDs give their low
 * nibbles (times x[0..15] in both halves) and high nibbles (times x[16..31]); VPMADDUBSW of
 * each, added in int16, then VPHADDW twice and VPMADDWD with ones leave lane r = row r. Each
 * int16 holds at most 16 products of |nibble * x| <= 15 * 128 (30720: no wrap). */
KX_INLINE KX_AVX2 __m256i kx_q4_sums8_avx2(const colibri_block_q4_32 *const row[8], size_t b,
                                           const int8_t *x)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i xlo =
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)x));
    const __m256i xhi =
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(x + 16)));
    __m256i p[4];
    KX_UNROLL for (int32_t r = 0; r < 4; r++)
    {
        const __m256i v = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)row[r][b].qs)),
            _mm_loadu_si128((const __m128i *)(const void *)row[r + 4][b].qs), 1);
        p[r] = _mm256_add_epi16(
            _mm256_maddubs_epi16(_mm256_and_si256(v, m4), xlo),
            _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), xhi));
    }
    const __m256i h =
        _mm256_hadd_epi16(_mm256_hadd_epi16(p[0], p[1]), _mm256_hadd_epi16(p[2], p[3]));
    return _mm256_madd_epi16(h, _mm256_set1_epi16(1));
}

static KX_NOINLINE KX_AVX2 void kx_matvec_q4_q8_avx2(const colibri_block_q4_32 *w, const int8_t *xq,
                                                     const float *sx, float *y, int32_t n_out,
                                                     int32_t n_in)
{
    const int32_t nb = (int32_t)COLIBRI_Q4_BLOCKS(n_in);
    const int32_t full = n_in / COLIBRI_QK4;
    int8_t xpad[COLIBRI_QK4];
    if (full < nb) {
        memset(xpad, 0, sizeof xpad);
        memcpy(xpad, xq + (size_t)full * COLIBRI_QK4, (size_t)(n_in - full * COLIBRI_QK4));
    }
    int32_t corr[KX_Q4_CORR];
    const int32_t ncorr = (nb <= KX_Q4_CORR) ? nb : 0; /* else per chunk inside the loop */
    kx_q4_corr_avx2(xq, n_in, 0, ncorr, corr);
    for (int32_t o0 = 0; o0 < n_out; o0 += 8) {
        const int32_t nr = (n_out - o0 < 8) ? n_out - o0 : 8;
        const colibri_block_q4_32 *row[8];
        KX_UNROLL for (int32_t r = 0; r < 8; r++) /* rows past n_out: row o0 again */
        {
            row[r] = w + (size_t)(o0 + (r < nr ? r : 0)) * (size_t)nb;
        }
        /* the next group of rows, 8 blocks (144 bytes) ahead per block */
        const uintptr_t pf = (uintptr_t)w + (size_t)(o0 + 8) * (size_t)nb * sizeof *w;
        __m256 acc = _mm256_setzero_ps();
        for (int32_t b0 = 0; b0 < nb; b0 += KX_Q4_CORR) {
            const int32_t b1 = (nb - b0 < KX_Q4_CORR) ? nb : b0 + KX_Q4_CORR;
            if (ncorr == 0) {
                kx_q4_corr_avx2(xq, n_in, b0, b1 - b0, corr);
            }
            for (int32_t b = b0; b < b1; b++) {
                kx_prefetch(pf + (size_t)b * (8u * sizeof *w), 3);
                const int8_t *xb = (b < full) ? xq + (size_t)b * COLIBRI_QK4 : xpad;
                const __m256i isum = _mm256_add_epi32(kx_q4_sums8_avx2(row, (size_t)b, xb),
                                                      _mm256_set1_epi32(corr[b - b0]));
                const __m128i dh = _mm_setr_epi16(
                    (short)row[0][b].d, (short)row[1][b].d, (short)row[2][b].d, (short)row[3][b].d,
                    (short)row[4][b].d, (short)row[5][b].d, (short)row[6][b].d, (short)row[7][b].d);
                const __m256 ds = _mm256_mul_ps(_mm256_cvtph_ps(dh), _mm256_set1_ps(sx[b]));
                acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_cvtepi32_ps(isum), ds));
            }
        }
        kx_store_rows(y + o0, acc, nr);
    }
}
#if defined(KX_HAVE_VNNI)
KX_Q4_MATVEC(kx_matvec_q4_q8_avxvnni, KX_AVXVNNI, kx_q4_block_avxvnni)
KX_Q4_MATVEC(kx_matvec_q4_q8_avx512vnni, KX_AVX512VNNI, kx_q4_block_avx512vnni)
#endif

#if defined(KX_HAVE_VNNI)
/*
 * colibri_matvec_q8_q8 / q8b_q8 / q4_q8, AVX-512 VNNI on 512-bit registers: the float steps of
 * KX_Q8_MATVEC / KX_Q4_MATVEC (per row: blocks in order, a separate multiply and add), fewer
 * instructions per block.
 *  - Groups of eight rows at one base pointer and the row stride (no row pointers to spill); when
 *    n_out is not a multiple of eight the last group is rows n_out - 8 .. n_out - 1, overlapping
 *    the one before (a row's result does not depend on the others: the same bits written twice).
 *    n_out < 8 runs the 256-bit matvecs above.
 *  - int8: a step is two blocks (64 bytes of a row, one load, one VPDPBUSD); the eight rows'
 *    16 x 16 int32 lanes are reduced to the 16 (row, block) sums by unpacks within 128-bit lanes
 *    and one cross-lane shuffle.
 *  - int4: a step is four blocks: each row's four 16-byte nibble arrays in the four 128-bit lanes,
 *    low nibbles times the blocks' x[0..15] and high nibbles times x[16..31] (two VPDPBUSD into
 *    one accumulator), reduced to [rows 0-3] / [rows 4-7] per block lane; the 32 fp16 scales
 *    from one 64-byte read per row (block j's d is word 9j), placed by four VPERMT2W and two
 *    blends (no gathers: these were ~40% of the time).
 *  - q8b: the block scales of a step by one 8-byte read per row and one VPERMPS (no gather).
 *  - What does not depend on the row is prepared once per call (chunks of KX_Z_STEPS steps): the
 *    codes (int4: rearranged to the nibble order), zero past n_in (masked loads), the correction
 *    (-128 resp. -8 times the sum of each four codes the lane's products take, the initial value
 *    of every row's accumulator) and the activation scales spread over the lanes.
 *  - A step past the last block (nb odd for int8, not a multiple of four for int4) reads no
 *    weight byte beyond the row (masked loads) and adds nothing to the float sums.
 *  - Each step prefetches its share of a later group of rows (contiguous) into L2
 *    (_MM_HINT_T1): int8 the next group, int4 the fourth one on; from DRAM measured faster than
 *    into L1, and for int4 than the next group.
 */
#define KX_Z_STEPS 64
/* Prefetch into L2 of n lines from p on (the next group of rows, one step's share: L2 rather
 * than L1, measured faster from DRAM than _MM_HINT_T0 at the same distance). */
KX_INLINE void kx_z_prefetch(uintptr_t p, int n)
{
    _Pragma("GCC unroll 16") for (int k = 0; k < n; k++)
    {
        _mm_prefetch((const char *)(p + (uintptr_t)k * 64u), _MM_HINT_T1);
    }
}
#define KX_Z512 KX_AVX512VNNI

typedef struct {
    __m512i x;    /* int8: the codes of two blocks; int4: x[0..15] of four blocks */
    __m512i xh;   /* int4: x[16..31] of four blocks */
    __m512i corr; /* initial accumulator of every row */
    __m512 s;     /* the activation scale of each lane's block */
} kx_zprep;

/* lanes [a0 + a2, b0 + b2, a1 + a3, b1 + b3] per 128-bit lane */
KX_INLINE KX_Z512 __m512i kx_z_pair(__m512i a, __m512i b)
{
    return _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
}

/* a = kx_z_pair(r0, r1), b = kx_z_pair(r2, r3): lane k of each 128-bit lane = row k's sum */
KX_INLINE KX_Z512 __m512i kx_z_quad(__m512i a, __m512i b)
{
    return _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
}

/* The 128-bit lanes of p[0..3] / p[4..7] reduced: lane k of 128-bit lane j of *lo = the sum of
 * row k's four lanes j, of *hi the same for row 4 + k. */
KX_INLINE KX_Z512 void kx_z_reduce8(const __m512i p[8], __m512i *lo, __m512i *hi)
{
    *lo = kx_z_quad(kx_z_pair(p[0], p[1]), kx_z_pair(p[2], p[3]));
    *hi = kx_z_quad(kx_z_pair(p[4], p[5]), kx_z_pair(p[6], p[7]));
}

/* bytes [0, n) of p (n <= 64), zero after */
KX_INLINE KX_Z512 __m512i kx_z_load(const int8_t *p, int32_t n)
{
    const __mmask64 m = (n >= 64) ? ~(__mmask64)0 : (((__mmask64)1 << n) - 1u);
    return _mm512_maskz_loadu_epi8(m, p);
}

/* int8 steps k0 .. k0 + n - 1 (step k: blocks 2k, 2k + 1, inputs 64k ..) */
KX_INLINE KX_Z512 void kx_z_prep_q8(const int8_t *xq, const float *sx, int32_t n_in, int32_t nb,
                                    int32_t k0, int32_t n, kx_zprep *z)
{
    const __m512i k80 = _mm512_set1_epi8((char)0x80);
    for (int32_t k = 0; k < n; k++) {
        const int32_t i0 = 64 * (k0 + k);
        const int32_t b = 2 * (k0 + k);
        z[k].x = kx_z_load(xq + i0, n_in - i0);
        z[k].corr = _mm512_sub_epi32(_mm512_setzero_si512(),
                                     _mm512_dpbusd_epi32(_mm512_setzero_si512(), k80, z[k].x));
        const __m128 s0 = _mm_set1_ps(sx[b]);
        const __m128 s1 = (b + 1 < nb) ? _mm_set1_ps(sx[b + 1]) : _mm_setzero_ps();
        const __m256 s01 = _mm256_insertf128_ps(_mm256_castps128_ps256(s0), s1, 1);
        z[k].s = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(s01)),
                                                     _mm256_castps_pd(s01), 1));
        z[k].xh = z[k].x;
    }
}

/* Lanes [rows 0-3 of block 2k, rows 0-3 of 2k + 1, rows 4-7 of 2k, rows 4-7 of 2k + 1]: the
 * int32 sums of the eight rows at g (stride s, bytes from the step's first) with the step's
 * codes; MASKED: only the step's first n bytes of each row are read. */
KX_INLINE KX_Z512 __m512i kx_z_q8_sums(const int8_t *g, size_t s, const kx_zprep *z, int masked,
                                       int32_t n)
{
    const __m512i k80 = _mm512_set1_epi8((char)0x80);
    __m512i p[8];
    KX_UNROLL for (int32_t r = 0; r < 8; r++)
    {
        const int8_t *w = g + (size_t)r * s;
        const __m512i wv = masked ? kx_z_load(w, n) : _mm512_loadu_si512((const void *)w);
        p[r] = _mm512_dpbusd_epi32(z->corr, _mm512_xor_si512(wv, k80), z->x);
    }
    __m512i lo, hi;
    kx_z_reduce8(p, &lo, &hi);
    return _mm512_add_epi32(_mm512_shuffle_i32x4(lo, hi, _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_i32x4(lo, hi, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* q8b: lanes [rows 0-3 of block b, rows 0-3 of b + 1, rows 4-7 of b, rows 4-7 of b + 1] of the
 * block scales at gs (row r at gs + r * nb); TWO 0: block b only (lanes of b + 1 zero). */
KX_INLINE KX_Z512 __m512 kx_z_q8b_scales(const float *gs, int32_t nb, int two)
{
    __m128 v[4]; /* [row 2m, b; row 2m, b + 1; row 2m + 1, b; row 2m + 1, b + 1] */
    KX_UNROLL for (int32_t m = 0; m < 4; m++)
    {
        const float *r0 = gs + (size_t)(2 * m) * (size_t)nb;
        const float *r1 = r0 + nb;
        if (two) {
            v[m] = _mm_castsi128_ps(
                _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(const void *)r0),
                                   _mm_loadl_epi64((const __m128i *)(const void *)r1)));
        } else {
            v[m] = _mm_unpacklo_ps(_mm_load_ss(r0), _mm_setzero_ps());
            v[m] = _mm_movelh_ps(v[m], _mm_unpacklo_ps(_mm_load_ss(r1), _mm_setzero_ps()));
        }
    }
    const __m512 all = _mm512_insertf32x4(
        _mm512_insertf32x4(_mm512_insertf32x4(_mm512_castps128_ps512(v[0]), v[1], 1), v[2], 2),
        v[3], 3);
    return _mm512_permutexvar_ps(
        _mm512_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15), all);
}

/* The int8 matvecs; BLOCKED as in KX_Q8_MATVEC. */
KX_INLINE KX_Z512 void kx_z_q8_matvec(const int8_t *q, const float *scale, const int8_t *xq,
                                      const float *sx, float *y, int32_t n_out, int32_t n_in,
                                      int blocked)
{
    const int32_t nb = (int32_t)COLIBRI_Q8_BLOCKS(n_in);
    const int32_t nsteps = (nb + 1) / 2;
    const int32_t fsteps = n_in / 64; /* steps whose 64 bytes are all inside the row */
    kx_zprep z[KX_Z_STEPS];
    const int one_chunk = nsteps <= KX_Z_STEPS;
    if (one_chunk) {
        kx_z_prep_q8(xq, sx, n_in, nb, 0, nsteps, z);
    }
    const size_t s = (size_t)n_in;
    for (int32_t g0 = 0; g0 < n_out; g0 += 8) {
        const int32_t o0 = (g0 + 8 <= n_out) ? g0 : n_out - 8;
        const int8_t *g = q + (size_t)o0 * s;
        const float *gs = scale + (size_t)o0 * (size_t)nb;
        __m512 acc = _mm512_setzero_ps();
        for (int32_t c0 = 0; c0 < nsteps; c0 += KX_Z_STEPS) {
            const int32_t c1 = (nsteps - c0 < KX_Z_STEPS) ? nsteps : c0 + KX_Z_STEPS;
            if (!one_chunk) {
                kx_z_prep_q8(xq, sx, n_in, nb, c0, c1 - c0, z);
            }
            /* the steps whose 64 bytes are inside the row */
            const int32_t kf = (c1 < fsteps) ? c1 : fsteps;
            const int8_t *gk = g + (size_t)c0 * 64u;
            const float *gsk = gs + 2 * (size_t)c0;
            const kx_zprep *zk = z;
            for (int32_t k = c0; k < kf; k++, gk += 64, gsk += 2, zk++) {
                kx_z_prefetch((uintptr_t)(g + 8 * s) + (size_t)k * 512u, 8);
                if (blocked) {
                    kx_z_prefetch((uintptr_t)(gsk + 8 * (size_t)nb), 1);
                }
                const __m512i isum = kx_z_q8_sums(gk, s, zk, 0, 64);
                const __m512 f =
                    blocked ? _mm512_mul_ps(kx_z_q8b_scales(gsk, nb, 1), zk->s) : zk->s;
                const __m512 pr = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), f);
                acc = _mm512_add_ps(acc, pr);
                acc = _mm512_add_ps(acc, _mm512_shuffle_f32x4(pr, pr, _MM_SHUFFLE(3, 3, 1, 1)));
            }
            for (int32_t k = (kf > c0) ? kf : c0; k < c1; k++) { /* the last, partial step */
                zk = &z[k - c0];
                gk = g + (size_t)k * 64u;
                const __m512i isum = kx_z_q8_sums(gk, s, zk, 1, n_in - 64 * k);
                const int two = 2 * k + 1 < nb;
                const __m512 f =
                    blocked ? _mm512_mul_ps(kx_z_q8b_scales(gs + 2 * (size_t)k, nb, two), zk->s)
                            : zk->s;
                const __m512 pr = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), f);
                acc = _mm512_add_ps(acc, pr);
                if (two) {
                    acc = _mm512_add_ps(acc, _mm512_shuffle_f32x4(pr, pr, _MM_SHUFFLE(3, 3, 1, 1)));
                }
            }
        }
        __m256 y8 = _mm512_castps512_ps256(_mm512_shuffle_f32x4(acc, acc, _MM_SHUFFLE(2, 0, 2, 0)));
        if (!blocked) {
            y8 = _mm256_mul_ps(y8, _mm256_loadu_ps(scale + o0));
        }
        _mm256_storeu_ps(y + o0, y8);
    }
}

static KX_NOINLINE KX_Z512 void kx_matvec_q8_q8_avx512z(const int8_t *q, const float *scale,
                                                        const int8_t *xq, const float *sx, float *y,
                                                        int32_t n_out, int32_t n_in)
{
    if (n_out < 8) {
        kx_matvec_q8_q8_avx512vnni(q, scale, xq, sx, y, n_out, n_in);
        return;
    }
    kx_z_q8_matvec(q, scale, xq, sx, y, n_out, n_in, 0);
}

static KX_NOINLINE KX_Z512 void kx_matvec_q8b_q8_avx512z(const int8_t *q, const float *scale,
                                                         const int8_t *xq, const float *sx,
                                                         float *y, int32_t n_out, int32_t n_in)
{
    if (n_out < 8) {
        kx_matvec_q8b_q8_avx512vnni(q, scale, xq, sx, y, n_out, n_in);
        return;
    }
    kx_z_q8_matvec(q, scale, xq, sx, y, n_out, n_in, 1);
}

/* int4 steps k0 .. k0 + n - 1 (step k: blocks 4k .. 4k + 3, inputs 128k ..) */
KX_INLINE KX_Z512 void kx_z_prep_q4(const int8_t *xq, const float *sx, int32_t n_in, int32_t nb,
                                    int32_t k0, int32_t n, kx_zprep *z)
{
    const __m512i k8 = _mm512_set1_epi8(8);
    const __m512i ilo = _mm512_setr_epi64(0, 1, 4, 5, 8, 9, 12, 13);
    const __m512i ihi = _mm512_setr_epi64(2, 3, 6, 7, 10, 11, 14, 15);
    for (int32_t k = 0; k < n; k++) {
        const int32_t i0 = 128 * (k0 + k);
        const int32_t b = 4 * (k0 + k);
        const __m512i xa = kx_z_load(xq + i0, n_in - i0);
        const __m512i xb =
            (n_in - i0 > 64) ? kx_z_load(xq + i0 + 64, n_in - i0 - 64) : _mm512_setzero_si512();
        z[k].x = _mm512_permutex2var_epi64(xa, ilo, xb);
        z[k].xh = _mm512_permutex2var_epi64(xa, ihi, xb);
        z[k].corr = _mm512_sub_epi32(
            _mm512_setzero_si512(),
            _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), k8, z[k].x), k8,
                                z[k].xh));
        float sv[16];
        for (int32_t j = 0; j < 4; j++) {
            const float v = (b + j < nb) ? sx[b + j] : 0.0f;
            sv[4 * j] = sv[4 * j + 1] = sv[4 * j + 2] = sv[4 * j + 3] = v;
        }
        z[k].s = _mm512_loadu_ps(sv);
    }
}

/* The nibbles of blocks b .. b + nblk - 1 (nblk <= 4) of a row, block j in 128-bit lane j
 * (zero for j >= nblk). */
KX_INLINE KX_Z512 __m512i kx_z_q4_load(const colibri_block_q4_32 *blk, int32_t nblk)
{
    const __m128i z = _mm_setzero_si128();
    const __m128i a = _mm_loadu_si128((const __m128i *)(const void *)blk[0].qs);
    const __m128i b1 = nblk > 1 ? _mm_loadu_si128((const __m128i *)(const void *)blk[1].qs) : z;
    const __m128i b2 = nblk > 2 ? _mm_loadu_si128((const __m128i *)(const void *)blk[2].qs) : z;
    const __m128i b3 = nblk > 3 ? _mm_loadu_si128((const __m128i *)(const void *)blk[3].qs) : z;
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(b1, a)),
                              _mm256_set_m128i(b3, b2), 1);
}

/* The float steps of up to four blocks for four rows: acc (lane k: row k) += lane k of 128-bit
 * lane j of pr, j = 0 .. nblk - 1 in order. */
KX_INLINE KX_Z512 __m128 kx_z_add4(__m128 acc, __m512 pr, int32_t nblk)
{
    acc = _mm_add_ps(acc, _mm512_castps512_ps128(pr));
    if (nblk > 1) {
        acc = _mm_add_ps(acc, _mm512_extractf32x4_ps(pr, 1));
    }
    if (nblk > 2) {
        acc = _mm_add_ps(acc, _mm512_extractf32x4_ps(pr, 2));
    }
    if (nblk > 3) {
        acc = _mm_add_ps(acc, _mm512_extractf32x4_ps(pr, 3));
    }
    return acc;
}

/* Word indices for _mm512_permutex2var_epi16 taking the fp16 scales of four blocks of rows
 * (2m, 2m + 1) from 64-byte reads at each row's first block (d of block j is word 9j) to their
 * places: word 16h + 4j + k = row 4h + k, block j (other words: don't care). */
static const uint16_t kx_z_didx[4][32]
    __attribute__((aligned(64))) = {{0, 32, 0, 0, 9, 41, 0, 0, 18, 50, 0, 0, 27, 59, 0, 0,
                                     0, 0,  0, 0, 0, 0,  0, 0, 0,  0,  0, 0, 0,  0,  0, 0},
                                    {0, 0, 0, 32, 0, 0, 9, 41, 0, 0, 18, 50, 0, 0, 27, 59,
                                     0, 0, 0, 0,  0, 0, 0, 0,  0, 0, 0,  0,  0, 0, 0,  0},
                                    {0, 0,  0, 0, 0, 0,  0, 0, 0,  0,  0, 0, 0,  0,  0, 0,
                                     0, 32, 0, 0, 9, 41, 0, 0, 18, 50, 0, 0, 27, 59, 0, 0},
                                    {0, 0, 0, 0,  0, 0, 0, 0,  0, 0, 0,  0,  0, 0, 0,  0,
                                     0, 0, 0, 32, 0, 0, 9, 41, 0, 0, 18, 50, 0, 0, 27, 59}};

/* One int4 step of eight rows (row r's blocks at blk + r * nb), nblk blocks. */
KX_INLINE KX_Z512 void kx_z_q4_step(const colibri_block_q4_32 *blk, size_t nb, const kx_zprep *z,
                                    int32_t nblk, __m128 *acc_lo, __m128 *acc_hi)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512i p[8];
    __m512i dw[8];
    KX_UNROLL for (int32_t r = 0; r < 8; r++)
    {
        const colibri_block_q4_32 *br = blk + (size_t)r * nb;
        const __m512i v = kx_z_q4_load(br, nblk);
        const __m512i lo = _mm512_and_si512(v, m4);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        p[r] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z->corr, lo, z->x), hi, z->xh);
        /* the blocks' scales: bytes up to the last block's d, inside the row */
        dw[r] = (nblk == 4) ? _mm512_loadu_si512((const void *)br)
                            : kx_z_load((const int8_t *)(const void *)br, 18 * (nblk - 1) + 2);
    }
    __m512i lo, hi;
    kx_z_reduce8(p, &lo, &hi);
    /* 32 fp16 scales: word 16h + 4j + k = row 4h + k, block j */
    __m512i dp[4];
    KX_UNROLL for (int32_t m = 0; m < 4; m++)
    {
        dp[m] = _mm512_permutex2var_epi16(dw[2 * m], _mm512_load_si512((const void *)kx_z_didx[m]),
                                          dw[2 * m + 1]);
    }
    const __m512i d = _mm512_mask_blend_epi16(
        (__mmask32)0xFFFF0000u, _mm512_mask_blend_epi16((__mmask32)0xCCCCCCCCu, dp[0], dp[1]),
        _mm512_mask_blend_epi16((__mmask32)0xCCCCCCCCu, dp[2], dp[3]));
    const __m512 dslo = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(d)), z->s);
    const __m512 dshi = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(d, 1)), z->s);
    *acc_lo = kx_z_add4(*acc_lo, _mm512_mul_ps(_mm512_cvtepi32_ps(lo), dslo), nblk);
    *acc_hi = kx_z_add4(*acc_hi, _mm512_mul_ps(_mm512_cvtepi32_ps(hi), dshi), nblk);
}

static KX_NOINLINE KX_Z512 void kx_matvec_q4_q8_avx512z(const colibri_block_q4_32 *w,
                                                        const int8_t *xq, const float *sx, float *y,
                                                        int32_t n_out, int32_t n_in)
{
    if (n_out < 8) {
        kx_matvec_q4_q8_avx512vnni(w, xq, sx, y, n_out, n_in);
        return;
    }
    const int32_t nb = (int32_t)COLIBRI_Q4_BLOCKS(n_in);
    const int32_t nsteps = (nb + 3) / 4;
    kx_zprep z[KX_Z_STEPS];
    const int one_chunk = nsteps <= KX_Z_STEPS;
    if (one_chunk) {
        kx_z_prep_q4(xq, sx, n_in, nb, 0, nsteps, z);
    }
    for (int32_t g0 = 0; g0 < n_out; g0 += 8) {
        const int32_t o0 = (g0 + 8 <= n_out) ? g0 : n_out - 8;
        const colibri_block_q4_32 *g = w + (size_t)o0 * (size_t)nb;
        const uintptr_t pf = (uintptr_t)(g + 32 * (size_t)nb);
        __m128 acc_lo = _mm_setzero_ps();
        __m128 acc_hi = _mm_setzero_ps();
        for (int32_t c0 = 0; c0 < nsteps; c0 += KX_Z_STEPS) {
            const int32_t c1 = (nsteps - c0 < KX_Z_STEPS) ? nsteps : c0 + KX_Z_STEPS;
            if (!one_chunk) {
                kx_z_prep_q4(xq, sx, n_in, nb, c0, c1 - c0, z);
            }
            for (int32_t k = c0; k < c1; k++) {
                /* the group four ahead (from DRAM measured faster than one ahead), 8 rows x 4
                 * blocks = 576 bytes per step */
                kx_z_prefetch(pf + (size_t)k * 576u, 9);
                const colibri_block_q4_32 *blk = g + 4 * (size_t)k;
                if (4 * k + 4 <= nb) {
                    kx_z_q4_step(blk, (size_t)nb, &z[k - c0], 4, &acc_lo, &acc_hi);
                } else {
                    kx_z_q4_step(blk, (size_t)nb, &z[k - c0], nb - 4 * k, &acc_lo, &acc_hi);
                }
            }
        }
        _mm256_storeu_ps(y + o0, _mm256_set_m128(acc_hi, acc_lo));
    }
}
#endif

/* -- multi-token kernels: weights loaded once per group of tokens --------------------------- */

/*
 * colibri_matmul_q8_q8 / q8b_q8 / q4_q8 on one chunk of rows: tokens in tiles (AVX2: 2 to
 * KX_AVX2_TILE tokens, kx_q8_mm_tile_avx2, or KX_AVX2_Q4_TILE, kx_q4_mm_tile_avx2, below; VNNI:
 * KX_TOK_TILE, with KX_TILE_SUMS), rows in groups of eight. Each block of a group's eight rows
 * is loaded and unpacked once and multiplied against the activation codes of every token of the
 * tile. Per token and row the float steps are those of the matvec above (blocks in order, the same
 * multiplies and adds lane by lane), so row t of the result is the matvec of token t bit for bit:
 * only the order of the exact integer sums differs. The tokens after the last whole tile, and the
 * last group of rows when n_out is not a multiple of eight, run the matvec itself. One tile width
 * and one non-inlined tile function per weight format and level (q8 / q8b share theirs, BLOCKED an
 * argument) keep this file quick to compile: each width more is another copy of every tile.
 *
 * A VNNI level supplies, for one block: XPREP (a token's codes, unpacked once per block and tile),
 * WPREP (a row's weights) and PROD (their int32 products, whose eight
 * lanes sum to the block's dot product). KX_TILE_SUMS reduces eight rows x T tokens with the
 * pairwise adds of kx_hsum8, two rows at a time, so few vectors stay live.
 */
#define KX_TOK_TILE 4

/* Two vectors: the low / high halves of a block (AVX2 int8: int16 lanes), or a vector and its
 * correction (VNNI and int4: codes, and -128 or -8 times the sum of each 4 codes). */
typedef struct {
    __m256i a;
    __m256i b;
} kx_v2;

/* Row r's block at w + r * ws (ws in WTYPE elements), token t's codes at x + t * xs. */
#define KX_TILE_SUMS(NAME, TARGET, WTYPE, XPREP, WPREP, PROD)                                      \
    KX_INLINE TARGET void NAME(const WTYPE *w, size_t ws, const int8_t *x, size_t xs, const int T, \
                               __m256i hs[])                                                       \
    {                                                                                              \
        kx_v2 xv[KX_TOK_TILE];                                                                     \
        __m256i quad[2][KX_TOK_TILE];                                                              \
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++)                                        \
        {                                                                                          \
            xv[t] = XPREP(x + (size_t)t * xs);                                                     \
        }                                                                                          \
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++)                                        \
        {                                                                                          \
            __m256i pair[KX_TOK_TILE];                                                             \
            _Pragma("GCC unroll 2") for (int q = 0; q < 2; q++)                                    \
            {                                                                                      \
                const kx_v2 w0 = WPREP(w + (size_t)(4 * h + 2 * q) * ws);                          \
                const kx_v2 w1 = WPREP(w + (size_t)(4 * h + 2 * q + 1) * ws);                      \
                _Pragma("GCC unroll 8") for (int t = 0; t < T; t++)                                \
                {                                                                                  \
                    const __m256i s = _mm256_hadd_epi32(PROD(w0, xv[t]), PROD(w1, xv[t]));         \
                    pair[t] = (q == 0) ? s : _mm256_hadd_epi32(pair[t], s);                        \
                }                                                                                  \
            }                                                                                      \
            _Pragma("GCC unroll 8") for (int t = 0; t < T; t++)                                    \
            {                                                                                      \
                quad[h][t] = pair[t];                                                              \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++)                                        \
        {                                                                                          \
            hs[t] = _mm256_add_epi32(_mm256_permute2x128_si256(quad[0][t], quad[1][t], 0x20),      \
                                     _mm256_permute2x128_si256(quad[0][t], quad[1][t], 0x31));     \
        }                                                                                          \
    }

/* int4 weights for the VNNI tiles: the nibbles, unsigned. */
KX_INLINE KX_AVX2 kx_v2 kx_q4_w_avx2(const colibri_block_q4_32 *blk)
{
    kx_v2 v;
    v.a = kx_nibbles(blk);
    v.b = v.a;
    return v;
}

#if defined(KX_HAVE_VNNI)
/* VNNI: codes and the correction (-128 * sum of each 4 codes for int8 weights stored as
 * w + 128, -8 * sum for int4 nibbles); each row's product is one VPDPBUSD. */
#define KX_VNNI_PARTS(SUFFIX, TARGET, DPBUSD)                                                      \
    KX_INLINE TARGET kx_v2 kx_q8_x_##SUFFIX(const int8_t *p)                                       \
    {                                                                                              \
        kx_v2 v;                                                                                   \
        v.a = _mm256_loadu_si256((const __m256i *)(const void *)p);                                \
        v.b = _mm256_sub_epi32(_mm256_setzero_si256(),                                             \
                               DPBUSD(_mm256_setzero_si256(), _mm256_set1_epi8((char)0x80), v.a)); \
        return v;                                                                                  \
    }                                                                                              \
    KX_INLINE TARGET kx_v2 kx_q8_w_##SUFFIX(const int8_t *p)                                       \
    {                                                                                              \
        kx_v2 v;                                                                                   \
        v.a = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(const void *)p),               \
                               _mm256_set1_epi8((char)0x80));                                      \
        v.b = v.a;                                                                                 \
        return v;                                                                                  \
    }                                                                                              \
    KX_INLINE TARGET kx_v2 kx_q4_x_##SUFFIX(const int8_t *p)                                       \
    {                                                                                              \
        kx_v2 v;                                                                                   \
        v.a = _mm256_loadu_si256((const __m256i *)(const void *)p);                                \
        v.b = _mm256_sub_epi32(_mm256_setzero_si256(),                                             \
                               DPBUSD(_mm256_setzero_si256(), _mm256_set1_epi8(8), v.a));          \
        return v;                                                                                  \
    }                                                                                              \
    KX_INLINE TARGET __m256i kx_prod_##SUFFIX(kx_v2 w, kx_v2 x)                                    \
    {                                                                                              \
        return DPBUSD(x.b, w.a, x.a);                                                              \
    }                                                                                              \
    KX_TILE_SUMS(kx_q8_tile_##SUFFIX, TARGET, int8_t, kx_q8_x_##SUFFIX, kx_q8_w_##SUFFIX,          \
                 kx_prod_##SUFFIX)                                                                 \
    KX_TILE_SUMS(kx_q4_tile_##SUFFIX, TARGET, colibri_block_q4_32, kx_q4_x_##SUFFIX, kx_q4_w_avx2, \
                 kx_prod_##SUFFIX)

KX_VNNI_PARTS(avxvnni, KX_AVXVNNI, KX_DPBUSD_AVX)
#endif

/* Zero-padded copies of the partial last block of `rows` rows (n bytes from src + r * ss each,
 * into width-byte rows at dst): one plain function for every level and tile. */
static KX_NOINLINE void kx_pad_rows(int8_t *dst, size_t width, const int8_t *src, size_t ss,
                                    int rows, size_t n)
{
    memset(dst, 0, width * (size_t)rows);
    for (int r = 0; r < rows; r++) {
        memcpy(dst + (size_t)r * width, src + (size_t)r * ss, n);
    }
}

/* Tokens [t0, t0 + nt): a tile of up to MAXT tokens when at least MINT are left, else 1 (the
 * matvec). AVX2: 2..KX_AVX2_TILE tokens a tile; the VNNI levels: tiles of exactly KX_TOK_TILE. */
#define KX_TILE_NEXT(left, MAXT, MINT)                                                             \
    (((left) >= (MINT)) ? (((left) < (MAXT)) ? (left) : (MAXT)) : 1)

/*
 * AVX2 int8 tiles: 2..KX_AVX2_TILE tokens, eight rows. Per block, the eight rows' weights are
 * unpacked once into a stack buffer, then a loop over the tokens multiplies them (memory operands)
 * by the token's codes (registers) and reduces the eight rows at once, so the loop's values fit
 * the 16 YMM registers: no spills, and one tile of up to eight tokens unpacks each weight block
 * once. (int4: kx_q4_mm_tile_avx2 below, tiles of up to KX_AVX2_Q4_TILE.)
 */
#define KX_AVX2_TILE 8

/* Token x's block (codes at xt) times the eight rows' widened weights: lane r = row r's int32
 * sum, reduced with the pairwise adds of kx_hsum8, each pair of rows as soon as it is there. */
KX_INLINE KX_AVX2 __m256i kx_q8_tok_avx2(const __m256i wv[16], const int8_t *xt)
{
    const __m256i xlo = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)xt));
    const __m256i xhi =
        _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(xt + 16)));
#define KX_Q8_ROW(r)                                                                               \
    _mm256_add_epi32(_mm256_madd_epi16(_mm256_load_si256(&wv[2 * (r)]), xlo),                      \
                     _mm256_madd_epi16(_mm256_load_si256(&wv[2 * (r) + 1]), xhi))
    const __m256i s01 = _mm256_hadd_epi32(KX_Q8_ROW(0), KX_Q8_ROW(1));
    const __m256i s23 = _mm256_hadd_epi32(KX_Q8_ROW(2), KX_Q8_ROW(3));
    const __m256i s0123 = _mm256_hadd_epi32(s01, s23);
    const __m256i s45 = _mm256_hadd_epi32(KX_Q8_ROW(4), KX_Q8_ROW(5));
    const __m256i s67 = _mm256_hadd_epi32(KX_Q8_ROW(6), KX_Q8_ROW(7));
    const __m256i s4567 = _mm256_hadd_epi32(s45, s67);
#undef KX_Q8_ROW
    /* lanes 0..3: rows 0..3 (both halves of s0123), lanes 4..7: rows 4..7 */
    return _mm256_add_epi32(_mm256_permute2x128_si256(s0123, s4567, 0x21),
                            _mm256_blend_epi32(s0123, s4567, 0xF0));
}

/*
 * int8 weights x int8 codes (both widened to int16, VPMADDWD), rows [0, n_out) (a multiple of 8)
 * for nt tokens; BLOCKED as in KX_Q8_MATVEC, and per token the float steps of the matvec in its
 * order. The partial last block runs on zero-padded copies.
 */
static KX_NOINLINE KX_AVX2 void kx_q8_mm_tile_avx2(const int8_t *q, const float *scale,
                                                   const int8_t *xq, const float *sx, float *y,
                                                   int32_t ldy, int32_t n_out, int32_t n_in,
                                                   const int BLOCKED, int nt)
{
    const int32_t full = n_in / COLIBRI_QK8;
    const int32_t tail = n_in - full * COLIBRI_QK8;
    const int32_t nb = (int32_t)COLIBRI_Q8_BLOCKS(n_in);
    int8_t xpad[KX_AVX2_TILE][COLIBRI_QK8];
    int8_t wpad[8][COLIBRI_QK8];
    __m256i wv[16]; /* row r's block widened: wv[2r] elements 0..15, wv[2r + 1] 16..31 */
    __m256 acc[KX_AVX2_TILE];
    if (tail > 0) {
        kx_pad_rows(&xpad[0][0], COLIBRI_QK8, xq + (size_t)full * COLIBRI_QK8, (size_t)n_in, nt,
                    (size_t)tail);
    }
    for (int32_t o0 = 0; o0 < n_out; o0 += 8) {
        const int8_t *row = q + (size_t)o0 * (size_t)n_in;
        int32_t sidx[8];
        KX_UNROLL for (int32_t r = 0; r < 8; r++)
        {
            sidx[r] = BLOCKED ? (o0 + r) * nb : o0 + r;
        }
        const __m256i vidx = _mm256_loadu_si256((const __m256i *)(const void *)sidx);
        for (int t = 0; t < nt; t++) {
            acc[t] = _mm256_setzero_ps();
        }
        /* The next group of rows (contiguous), 256 bytes per block, as the matvec: a group's
         * rows are too short for the hardware's stream prefetch to warm up, and streaming the
         * weights from DRAM cost the tile about a sixth of its speed. */
        const uintptr_t pf = (uintptr_t)(row + 8u * (size_t)n_in);
        for (int32_t b = 0; b < nb; b++) {
            const int8_t *wb = row + (size_t)b * COLIBRI_QK8;
            size_t wstride = (size_t)n_in;
            const int8_t *xb = xq + (size_t)b * COLIBRI_QK8;
            size_t xstride = (size_t)n_in;
            if (o0 + 8 < n_out) {
                kx_prefetch(pf + (size_t)b * 256u, 4);
            }
            if (b >= full) { /* the partial last block: zero-padded copies */
                kx_pad_rows(&wpad[0][0], COLIBRI_QK8, row + (size_t)full * COLIBRI_QK8,
                            (size_t)n_in, 8, (size_t)tail);
                wb = &wpad[0][0];
                wstride = COLIBRI_QK8;
                xb = &xpad[0][0];
                xstride = COLIBRI_QK8;
            }
            const int8_t *wr = wb;
            KX_UNROLL for (int r = 0; r < 8; r++, wr += wstride)
            {
                _mm256_store_si256(&wv[2 * r], _mm256_cvtepi8_epi16(_mm_loadu_si128(
                                                   (const __m128i *)(const void *)wr)));
                _mm256_store_si256(&wv[2 * r + 1], _mm256_cvtepi8_epi16(_mm_loadu_si128(
                                                       (const __m128i *)(const void *)(wr + 16))));
            }
            /* per token: acc += (float)isum * (sx[b] (q8) or scale[o][b] * sx[b] (q8b)); four
             * tokens an iteration, and the test of BLOCKED outside the loop */
#define KX_Q8_TOKEN(S, k)                                                                          \
    acc[t + (k)] = _mm256_add_ps(                                                                  \
        acc[t + (k)], _mm256_mul_ps(_mm256_cvtepi32_ps(kx_q8_tok_avx2(wv, xt + (k)*xstride)),      \
                                    S(st[(size_t)(k) * (size_t)nb])))
#define KX_Q8_TOKENS(S)                                                                            \
    {                                                                                              \
        const int8_t *xt = xb;                                                                     \
        const float *st = sx + b;                                                                  \
        int t = 0;                                                                                 \
        for (; t + 4 <= nt; t += 4, xt += 4 * xstride, st += 4 * (size_t)nb) {                     \
            KX_Q8_TOKEN(S, 0);                                                                     \
            KX_Q8_TOKEN(S, 1);                                                                     \
            KX_Q8_TOKEN(S, 2);                                                                     \
            KX_Q8_TOKEN(S, 3);                                                                     \
        }                                                                                          \
        for (; t < nt; t++, xt += xstride, st += nb) {                                             \
            KX_Q8_TOKEN(S, 0);                                                                     \
        }                                                                                          \
    }
#define KX_S_Q8(v) _mm256_set1_ps(v)
#define KX_S_Q8B(v) _mm256_mul_ps(ws, _mm256_set1_ps(v))
            if (BLOCKED) {
                const __m256 ws = _mm256_i32gather_ps(scale + b, vidx, 4);
                KX_Q8_TOKENS(KX_S_Q8B)
            } else {
                KX_Q8_TOKENS(KX_S_Q8)
            }
#undef KX_S_Q8
#undef KX_S_Q8B
#undef KX_Q8_TOKENS
#undef KX_Q8_TOKEN
        }
        const __m256 rs = BLOCKED ? _mm256_setzero_ps() : _mm256_i32gather_ps(scale, vidx, 4);
        for (int t = 0; t < nt; t++) {
            _mm256_storeu_ps(y + (size_t)t * (size_t)ldy + (size_t)o0,
                             BLOCKED ? acc[t] : _mm256_mul_ps(acc[t], rs));
        }
    }
}

/*
 * The AVX2 int4 tile (kx_q4_mm_tile_avx2 below) transposes each block of eight rows once so that
 * no horizontal sum is left per token: register W[k] holds, in 32-bit lane r, row r's weights
 * 4k..4k+3 minus 8 (signed bytes -8..7). A token's codes go in as x + 128 (unsigned), the four
 * codes 4k..4k+3 broadcast to every lane, so VPMADDUBSW(x, W[k]) gives each row the pair sums of
 * those four products. The eight k add up in int16 (sixteen products of |(x + 128)(w - 8)| <=
 * 2040: within +-32640, no overflow), one VPMADDWD by 1 makes lane r row r's int32 sum, and
 * 128 * (sum of the row's block weights - 8), the same for every token, comes off: the exact block
 * sum of the matvec, whose float steps follow in its order.
 */
#define KX_Q4_BCH 32 /* blocks a range: the tile's biased codes (up to 16 KiB) stay in L1 */
#define KX_AVX2_Q4_TILE 16

/* Rows r and r + 4's blocks (stride rs blocks) as W[0..7] (see above); returns 128 * each
 * row's sum of its weights - 8, lane r. */
KX_INLINE KX_AVX2 __m256i kx_q4_pack8_avx2(const colibri_block_q4_32 *blk, size_t rs, __m256i W[8])
{
    __m256i a[4];
    KX_UNROLL for (int r = 0; r < 4; r++)
    {
        a[r] = _mm256_inserti128_si256(
            _mm256_castsi128_si256(
                _mm_loadu_si128((const __m128i *)(const void *)blk[(size_t)r * rs].qs)),
            _mm_loadu_si128((const __m128i *)(const void *)blk[(size_t)(r + 4) * rs].qs), 1);
    }
    /* per 128-bit half, a 4 x 4 transpose of 32-bit words: p[j] lane r = row r's bytes 4j..4j+3,
     * whose low nibbles are weights 4j..4j+3 and high nibbles weights 16 + 4j..16 + 4j + 3 */
    const __m256i t0 = _mm256_unpacklo_epi32(a[0], a[1]);
    const __m256i t1 = _mm256_unpackhi_epi32(a[0], a[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(a[2], a[3]);
    const __m256i t3 = _mm256_unpackhi_epi32(a[2], a[3]);
    const __m256i p[4] = {_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2),
                          _mm256_unpacklo_epi64(t1, t3), _mm256_unpackhi_epi64(t1, t3)};
    const __m256i m = _mm256_set1_epi8(0x0F);
    const __m256i e8 = _mm256_set1_epi8(8);
    KX_UNROLL for (int j = 0; j < 4; j++)
    {
        W[j] = _mm256_sub_epi8(_mm256_and_si256(p[j], m), e8);
        W[j + 4] = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(p[j], 4), m), e8);
    }
    /* the eight W summed bytewise: |sum| <= 64, exact in int8 */
    const __m256i s =
        _mm256_add_epi8(_mm256_add_epi8(_mm256_add_epi8(W[0], W[1]), _mm256_add_epi8(W[2], W[3])),
                        _mm256_add_epi8(_mm256_add_epi8(W[4], W[5]), _mm256_add_epi8(W[6], W[7])));
    const __m256i c =
        _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), s), _mm256_set1_epi16(1));
    return _mm256_slli_epi32(c, 7);
}

/* acc + v as VADDPS with acc the first source, as the matvec's acc += v: when both are NaN the
 * result carries acc's payload (x86 keeps the first source's). An accumulator kept in memory
 * would otherwise become the second source (only it can be a memory operand). */
KX_INLINE KX_AVX2 __m256 kx_acc_add_avx2(__m256 acc, __m256 v)
{
    __asm__("vaddps {%1, %0, %0|%0, %0, %1}" : "+x"(acc) : "x"(v));
    return acc;
}

/* A token's int32 block sums for the eight rows: xu its block's codes + 128 (32 bytes). */
KX_INLINE KX_AVX2 __m256i kx_q4_tok8_avx2(const __m256i W[8], const uint8_t *xu, __m256i corr)
{
#define KX_Q4_K(k)                                                                                 \
    _mm256_maddubs_epi16(_mm256_broadcastd_epi32(_mm_loadu_si32(xu + 4 * (k))),                    \
                         _mm256_load_si256(&W[k]))
    const __m256i s = _mm256_add_epi16(_mm256_add_epi16(_mm256_add_epi16(KX_Q4_K(0), KX_Q4_K(1)),
                                                        _mm256_add_epi16(KX_Q4_K(2), KX_Q4_K(3))),
                                       _mm256_add_epi16(_mm256_add_epi16(KX_Q4_K(4), KX_Q4_K(5)),
                                                        _mm256_add_epi16(KX_Q4_K(6), KX_Q4_K(7))));
#undef KX_Q4_K
    return _mm256_sub_epi32(_mm256_madd_epi16(s, _mm256_set1_epi16(1)), corr);
}

/*
 * int4 weights x int8 codes, rows [0, n_out) (a multiple of 8) for nt (2..KX_AVX2_Q4_TILE) tokens.
 * Blocks go in ranges of KX_Q4_BCH: the tile's codes of the range are biased (+ 128, the partial
 * last block zero-padded first) once into a stack buffer, then every group of eight rows runs
 * over it, its accumulators waiting in y between ranges (the order of the float steps is the
 * matvec's: acc += (float)isum * (d * sx[b]), blocks in order).
 */
static KX_NOINLINE KX_AVX2 void kx_q4_mm_tile_avx2(const colibri_block_q4_32 *w, const int8_t *xq,
                                                   const float *sx, float *y, int32_t ldy,
                                                   int32_t n_out, int32_t n_in, int nt)
{
    const int32_t nb = (int32_t)COLIBRI_Q4_BLOCKS(n_in);
    _Alignas(32) uint8_t xu[KX_AVX2_Q4_TILE][KX_Q4_BCH][COLIBRI_QK4];
    _Alignas(32) __m256i W[8];
    __m256 acc[KX_AVX2_Q4_TILE];
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    for (int32_t b0 = 0; b0 < nb; b0 += KX_Q4_BCH) {
        const int32_t nbr = (nb - b0 < KX_Q4_BCH) ? nb - b0 : KX_Q4_BCH;
        for (int t = 0; t < nt; t++) {
            const int8_t *src = xq + (size_t)t * (size_t)n_in + (size_t)b0 * COLIBRI_QK4;
            const int32_t n = (n_in - b0 * COLIBRI_QK4 < nbr * COLIBRI_QK4)
                                  ? n_in - b0 * COLIBRI_QK4
                                  : nbr * COLIBRI_QK4;
            for (int32_t i = 0; i < n; i += COLIBRI_QK4) {
                uint8_t *dst = &xu[t][i / COLIBRI_QK4][0];
                const void *from = src + i;
                if (n - i < COLIBRI_QK4) { /* the partial last block: zero-padded in place */
                    kx_pad_rows((int8_t *)(void *)dst, COLIBRI_QK4, src + i, 0, 1, (size_t)(n - i));
                    from = dst;
                }
                _mm256_store_si256(
                    (__m256i *)(void *)dst,
                    _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)from), bias));
            }
        }
        for (int32_t o0 = 0; o0 < n_out; o0 += 8) {
            const colibri_block_q4_32 *row = w + (size_t)o0 * (size_t)nb;
            for (int t = 0; t < nt; t++) {
                acc[t] = (b0 == 0) ? _mm256_setzero_ps()
                                   : _mm256_loadu_ps(y + (size_t)t * (size_t)ldy + (size_t)o0);
            }
            for (int32_t bi = 0; bi < nbr; bi++) {
                const int32_t b = b0 + bi;
                const colibri_block_q4_32 *blk = row + b;
                const size_t rs = (size_t)nb;
                if (bi % 3 == 0 && o0 + 8 < n_out) {
                    /* the next row group's blocks of this range (rows apart), every third
                     * block: 54 bytes apart, so every 64-byte line is asked for once or twice */
                    KX_UNROLL for (int r = 0; r < 8; r++)
                    {
                        _mm_prefetch((const char *)(blk + (size_t)(8 + r) * rs), _MM_HINT_T0);
                    }
                }
                const __m256i corr = kx_q4_pack8_avx2(blk, rs, W);
                const __m256 d = _mm256_cvtph_ps(
                    _mm_setr_epi16((short)blk[0].d, (short)blk[rs].d, (short)blk[2 * rs].d,
                                   (short)blk[3 * rs].d, (short)blk[4 * rs].d, (short)blk[5 * rs].d,
                                   (short)blk[6 * rs].d, (short)blk[7 * rs].d));
                const float *st = sx + b;
#define KX_Q4_TOKEN(k)                                                                             \
    acc[t + (k)] = kx_acc_add_avx2(                                                                \
        acc[t + (k)],                                                                              \
        _mm256_mul_ps(_mm256_cvtepi32_ps(kx_q4_tok8_avx2(W, xu[t + (k)][bi], corr)),               \
                      _mm256_mul_ps(d, _mm256_set1_ps(st[(size_t)(k) * (size_t)nb]))))
                int t = 0;
                for (; t + 4 <= nt; t += 4, st += 4 * (size_t)nb) {
                    KX_Q4_TOKEN(0);
                    KX_Q4_TOKEN(1);
                    KX_Q4_TOKEN(2);
                    KX_Q4_TOKEN(3);
                }
                for (; t < nt; t++, st += nb) {
                    KX_Q4_TOKEN(0);
                }
#undef KX_Q4_TOKEN
            }
            for (int t = 0; t < nt; t++) {
                _mm256_storeu_ps(y + (size_t)t * (size_t)ldy + (size_t)o0, acc[t]);
            }
        }
    }
}

/*
 * Full groups of eight rows of an int8-weight matmul for one tile of T tokens (BLOCKED as in
 * KX_Q8_MATVEC): n_out a multiple of 8. A partial last block is computed on zero-padded copies.
 */
#define KX_Q8_MATMUL_TILE(NAME, TARGET, TILE)                                                      \
    static KX_NOINLINE TARGET void NAME(const int8_t *q, const float *scale, const int8_t *xq,     \
                                        const float *sx, float *y, int32_t ldy, int32_t n_out,     \
                                        int32_t n_in, const int BLOCKED, int nt)                   \
    {                                                                                              \
        const int T = KX_TOK_TILE;                                                                 \
        (void)nt; /* always KX_TOK_TILE */                                                         \
        const int32_t full = n_in / COLIBRI_QK8;                                                   \
        const int32_t tail = n_in - full * COLIBRI_QK8;                                            \
        const int32_t nb = (int32_t)COLIBRI_Q8_BLOCKS(n_in);                                       \
        int8_t xpad[KX_TOK_TILE][COLIBRI_QK8];                                                     \
        if (tail > 0) {                                                                            \
            kx_pad_rows(&xpad[0][0], COLIBRI_QK8, xq + (size_t)full * COLIBRI_QK8, (size_t)n_in,   \
                        T, (size_t)tail);                                                          \
        }                                                                                          \
        for (int32_t o0 = 0; o0 < n_out; o0 += 8) {                                                \
            const int8_t *row = q + (size_t)o0 * (size_t)n_in;                                     \
            int32_t sidx[8];                                                                       \
            KX_UNROLL for (int32_t r = 0; r < 8; r++)                                              \
            {                                                                                      \
                sidx[r] = BLOCKED ? (o0 + r) * nb : o0 + r;                                        \
            }                                                                                      \
            const __m256i vidx = _mm256_loadu_si256((const __m256i *)(const void *)sidx);          \
            __m256 acc[KX_TOK_TILE];                                                               \
            _Pragma("GCC unroll 8") for (int t = 0; t < T; t++)                                    \
            {                                                                                      \
                acc[t] = _mm256_setzero_ps();                                                      \
            }                                                                                      \
            __m256i hs[KX_TOK_TILE];                                                               \
            int8_t wpad[8][COLIBRI_QK8];                                                           \
            for (int32_t b = 0; b < nb; b++) {                                                     \
                const int8_t *wb = row + (size_t)b * COLIBRI_QK8;                                  \
                size_t wstride = (size_t)n_in;                                                     \
                const int8_t *xb = xq + (size_t)b * COLIBRI_QK8;                                   \
                size_t xstride = (size_t)n_in;                                                     \
                if (b >= full) { /* the partial last block: zero-padded copies */                  \
                    kx_pad_rows(&wpad[0][0], COLIBRI_QK8, row + (size_t)full * COLIBRI_QK8,        \
                                (size_t)n_in, 8, (size_t)tail);                                    \
                    wb = &wpad[0][0];                                                              \
                    wstride = COLIBRI_QK8;                                                         \
                    xb = &xpad[0][0];                                                              \
                    xstride = COLIBRI_QK8;                                                         \
                }                                                                                  \
                TILE(wb, wstride, xb, xstride, T, hs);                                             \
                __m256 ws = _mm256_setzero_ps();                                                   \
                if (BLOCKED) {                                                                     \
                    ws = _mm256_i32gather_ps(scale + b, vidx, 4);                                  \
                }                                                                                  \
                _Pragma("GCC unroll 8") for (int t = 0; t < T; t++)                                \
                {                                                                                  \
                    const __m256 f = _mm256_cvtepi32_ps(hs[t]);                                    \
                    const __m256 s = _mm256_set1_ps(sx[(size_t)t * (size_t)nb + (size_t)b]);       \
                    acc[t] = _mm256_add_ps(acc[t],                                                 \
                                           _mm256_mul_ps(f, BLOCKED ? _mm256_mul_ps(ws, s) : s));  \
                }                                                                                  \
            }                                                                                      \
            const __m256 rs = BLOCKED ? _mm256_setzero_ps() : _mm256_i32gather_ps(scale, vidx, 4); \
            _Pragma("GCC unroll 8") for (int t = 0; t < T; t++)                                    \
            {                                                                                      \
                _mm256_storeu_ps(y + (size_t)t * (size_t)ldy + (size_t)o0,                         \
                                 BLOCKED ? acc[t] : _mm256_mul_ps(acc[t], rs));                    \
            }                                                                                      \
        }                                                                                          \
    }

#define KX_Q8_MATMUL(NAME, TARGET, TILEFN, MATVEC, BLOCKED, MAXT, MINT)                            \
    static TARGET void NAME(const int8_t *q, const float *scale, const int8_t *xq,                 \
                            const float *sx, float *y, int32_t ldy, int32_t n_out, int32_t n_in,   \
                            int32_t n_tok)                                                         \
    {                                                                                              \
        const size_t nb = COLIBRI_Q8_BLOCKS(n_in);                                                 \
        const int32_t n8 = n_out & ~7;                                                             \
        for (int32_t t0 = 0, nt = 0; t0 < n_tok; t0 += nt) {                                       \
            nt = KX_TILE_NEXT(n_tok - t0, MAXT, MINT);                                             \
            const int8_t *xt = xq + (size_t)t0 * (size_t)n_in;                                     \
            const float *st = sx + (size_t)t0 * nb;                                                \
            float *yt = y + (size_t)t0 * (size_t)ldy;                                              \
            if (nt > 1 && n8 > 0) {                                                                \
                TILEFN(q, scale, xt, st, yt, ldy, n8, n_in, BLOCKED, nt);                          \
            }                                                                                      \
            for (int32_t t = 0; t < nt; t++) { /* one token, or the rows after n8: the matvec */   \
                const int32_t o = (nt > 1) ? n8 : 0;                                               \
                if (o < n_out) {                                                                   \
                    MATVEC(q + (size_t)o * (size_t)n_in, scale + (size_t)o * ((BLOCKED) ? nb : 1), \
                           xt + (size_t)t * (size_t)n_in, st + (size_t)t * nb,                     \
                           yt + (size_t)t * (size_t)ldy + (size_t)o, n_out - o, n_in);             \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }

/* Full groups of eight rows of colibri_matmul_q4_q8 for one tile of T tokens (as KX_Q4_MATVEC,
 * lane by lane); a partial last block reads x from zero-padded copies. */
#define KX_Q4_MATMUL_TILE(NAME, TARGET, TILE)                                                      \
    static KX_NOINLINE TARGET void NAME(const colibri_block_q4_32 *w, const int8_t *xq,            \
                                        const float *sx, float *y, int32_t ldy, int32_t n_out,     \
                                        int32_t n_in, int nt)                                      \
    {                                                                                              \
        const int T = KX_TOK_TILE;                                                                 \
        (void)nt; /* always KX_TOK_TILE */                                                         \
        const int32_t nb = (int32_t)COLIBRI_Q4_BLOCKS(n_in);                                       \
        const int32_t full = n_in / COLIBRI_QK4;                                                   \
        int8_t xpad[KX_TOK_TILE][COLIBRI_QK4];                                                     \
        if (full < nb) {                                                                           \
            kx_pad_rows(&xpad[0][0], COLIBRI_QK4, xq + (size_t)full * COLIBRI_QK4, (size_t)n_in,   \
                        T, (size_t)(n_in - full * COLIBRI_QK4));                                   \
        }                                                                                          \
        for (int32_t o0 = 0; o0 < n_out; o0 += 8) {                                                \
            const colibri_block_q4_32 *row = w + (size_t)o0 * (size_t)nb;                          \
            __m256 acc[KX_TOK_TILE];                                                               \
            _Pragma("GCC unroll 8") for (int t = 0; t < T; t++)                                    \
            {                                                                                      \
                acc[t] = _mm256_setzero_ps();                                                      \
            }                                                                                      \
            __m256i hs[KX_TOK_TILE];                                                               \
            for (int32_t b = 0; b < nb; b++) {                                                     \
                const colibri_block_q4_32 *blk = row + b;                                          \
                const int pad = b >= full; /* the partial last block reads zero-padded x */        \
                TILE(blk, (size_t)nb, pad ? &xpad[0][0] : xq + (size_t)b * COLIBRI_QK4,            \
                     pad ? (size_t)COLIBRI_QK4 : (size_t)n_in, T, hs);                             \
                const __m128i dh = _mm_setr_epi16((short)blk[0].d, (short)blk[nb].d,               \
                                                  (short)blk[2 * nb].d, (short)blk[3 * nb].d,      \
                                                  (short)blk[4 * nb].d, (short)blk[5 * nb].d,      \
                                                  (short)blk[6 * nb].d, (short)blk[7 * nb].d);     \
                const __m256 d = _mm256_cvtph_ps(dh);                                              \
                _Pragma("GCC unroll 8") for (int t = 0; t < T; t++)                                \
                {                                                                                  \
                    const __m256 ds =                                                              \
                        _mm256_mul_ps(d, _mm256_set1_ps(sx[(size_t)t * (size_t)nb + (size_t)b]));  \
                    acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(_mm256_cvtepi32_ps(hs[t]), ds));  \
                }                                                                                  \
            }                                                                                      \
            _Pragma("GCC unroll 8") for (int t = 0; t < T; t++)                                    \
            {                                                                                      \
                _mm256_storeu_ps(y + (size_t)t * (size_t)ldy + (size_t)o0, acc[t]);                \
            }                                                                                      \
        }                                                                                          \
    }

#define KX_Q4_MATMUL(NAME, TARGET, TILEFN, MATVEC, MAXT, MINT)                                     \
    static TARGET void NAME(const colibri_block_q4_32 *w, const int8_t *xq, const float *sx,       \
                            float *y, int32_t ldy, int32_t n_out, int32_t n_in, int32_t n_tok)     \
    {                                                                                              \
        const size_t nb = COLIBRI_Q4_BLOCKS(n_in);                                                 \
        const int32_t n8 = n_out & ~7;                                                             \
        for (int32_t t0 = 0, nt = 0; t0 < n_tok; t0 += nt) {                                       \
            nt = KX_TILE_NEXT(n_tok - t0, MAXT, MINT);                                             \
            const int8_t *xt = xq + (size_t)t0 * (size_t)n_in;                                     \
            const float *st = sx + (size_t)t0 * nb;                                                \
            float *yt = y + (size_t)t0 * (size_t)ldy;                                              \
            if (nt > 1 && n8 > 0) {                                                                \
                TILEFN(w, xt, st, yt, ldy, n8, n_in, nt);                                          \
            }                                                                                      \
            for (int32_t t = 0; t < nt; t++) { /* one token, or the rows after n8: the matvec */   \
                const int32_t o = (nt > 1) ? n8 : 0;                                               \
                if (o < n_out) {                                                                   \
                    MATVEC(w + (size_t)o * nb, xt + (size_t)t * (size_t)n_in, st + (size_t)t * nb, \
                           yt + (size_t)t * (size_t)ldy + (size_t)o, n_out - o, n_in);             \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }

KX_Q8_MATMUL(kx_matmul_q8_q8_avx2, KX_AVX2, kx_q8_mm_tile_avx2, kx_matvec_q8_q8_avx2, 0,
             KX_AVX2_TILE, 2)
KX_Q8_MATMUL(kx_matmul_q8b_q8_avx2, KX_AVX2, kx_q8_mm_tile_avx2, kx_matvec_q8b_q8_avx2, 1,
             KX_AVX2_TILE, 2)
KX_Q4_MATMUL(kx_matmul_q4_q8_avx2, KX_AVX2, kx_q4_mm_tile_avx2, kx_matvec_q4_q8_avx2,
             KX_AVX2_Q4_TILE, 2)
#if defined(KX_HAVE_VNNI)
KX_Q8_MATMUL_TILE(kx_q8_mm_tile_avxvnni, KX_AVXVNNI, kx_q8_tile_avxvnni)
KX_Q8_MATMUL(kx_matmul_q8_q8_avxvnni, KX_AVXVNNI, kx_q8_mm_tile_avxvnni, kx_matvec_q8_q8_avxvnni, 0,
             KX_TOK_TILE, KX_TOK_TILE)
KX_Q8_MATMUL(kx_matmul_q8b_q8_avxvnni, KX_AVXVNNI, kx_q8_mm_tile_avxvnni, kx_matvec_q8b_q8_avxvnni,
             1, KX_TOK_TILE, KX_TOK_TILE)
KX_Q4_MATMUL_TILE(kx_q4_mm_tile_avxvnni, KX_AVXVNNI, kx_q4_tile_avxvnni)
KX_Q4_MATMUL(kx_matmul_q4_q8_avxvnni, KX_AVXVNNI, kx_q4_mm_tile_avxvnni, kx_matvec_q4_q8_avxvnni,
             KX_TOK_TILE, KX_TOK_TILE)

/*
 * AVX-512 VNNI multi-token kernels (colibri_matmul_q8_q8 / q8b_q8 / q4_q8): sixteen rows per ZMM
 * register, one lane per row, so a row's block sum needs no horizontal reduction. Per group of
 * sixteen rows and range of up to KX5_BCH blocks, the weights are repacked once into a stack
 * buffer: for block b, eight registers W[k] with lane r = the four bytes 4k..4k+3 of row r's block
 * as unsigned bytes (int8: w ^ 0x80 = w + 128; int4: the nibbles 0..15). Every token of the call
 * then runs over the buffer in tiles of up to KX5_TILE tokens: per token and block, eight VPDPBUSD
 * of the eight W[k] with the token's four codes 4k..4k+3 broadcast (a memory operand), starting
 * from the token's correction -128 (or -8) * the sum of the block's codes, computed once per tile
 * and block range for all sixteen rows. The lanes hold the exact int32 block sums of the matvec;
 * the float steps per lane are the matvec's (acc += (float)isum * sx[b], or * (ws[b] * sx[b]),
 * or * (d * sx[b]), blocks in order, separate multiply and add; int8: y = acc * scale[o]).
 * Between block ranges the accumulators wait in y. Rows past n_out are computed on row 0 again
 * and not stored (masked stores); a partial last block runs on zero-padded copies.
 */
#define KX5_TILE 8
#define KX5_BCH 32
#define KX5_PF 512u
#define KX512 KX_AVX512VNNI

enum { KX5_Q8 = 0, KX5_Q8B = 1, KX5_Q4 = 2, KX5_P8B = 3, KX5_P4 = 4 };

/* The weights the next pack will read (sixteen rows of len bytes, stride apart, from p),
 * prefetched while the tiles compute: `per` lines a block step, spread over all the token tiles,
 * row by row (the cursor: row r, byte off), so that memory streams while the tiles compute. Past
 * the end of the weights it reads what follows them, or nothing (addresses as integers, as
 * kx_prefetch). */
typedef struct {
    uintptr_t p;
    size_t stride;
    size_t len;
    int per;
    int r;
    size_t off;
} kx5_pf;

KX_INLINE void kx5_prefetch(kx5_pf *pf)
{
    for (int i = 0; i < pf->per && pf->r < 16; i++) {
        _mm_prefetch((const char *)(pf->p + (size_t)pf->r * pf->stride + pf->off), _MM_HINT_T0);
        pf->off += 64u;
        if (pf->off >= pf->len) {
            pf->off = 0;
            pf->r++;
        }
    }
}

/* z[r]: row r in the low 256 bits, row r + 8 in the high ones (eight dwords each); after, z[k]
 * lane r = dword k of row r (r < 16). */
KX_INLINE KX512 void kx5_transpose(__m512i z[8])
{
    __m512i t[8];
    __m512i u[8];
    KX_UNROLL for (int i = 0; i < 4; i++)
    {
        t[2 * i] = _mm512_unpacklo_epi32(z[2 * i], z[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(z[2 * i], z[2 * i + 1]);
    }
    KX_UNROLL for (int h = 0; h < 2; h++)
    {
        u[4 * h + 0] = _mm512_unpacklo_epi64(t[4 * h + 0], t[4 * h + 2]);
        u[4 * h + 1] = _mm512_unpackhi_epi64(t[4 * h + 0], t[4 * h + 2]);
        u[4 * h + 2] = _mm512_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
        u[4 * h + 3] = _mm512_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
    }
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    KX_UNROLL for (int k = 0; k < 4; k++)
    {
        z[k] = _mm512_permutex2var_epi64(u[k], lo, u[k + 4]);
        z[k + 4] = _mm512_permutex2var_epi64(u[k], hi, u[k + 4]);
    }
}

/* One block of sixteen rows (row r at p + r * rs) to dst[0..8): lane r of dst[k] = bytes
 * 4k..4k+3 of row r, plus 128. */
KX_INLINE KX512 void kx5_pack_q8_block(const int8_t *p, size_t rs, __m512i *dst)
{
    __m512i z[8];
    KX_UNROLL for (int r = 0; r < 8; r++)
    {
        z[r] = _mm512_inserti64x4(
            _mm512_castsi256_si512(
                _mm256_loadu_si256((const __m256i *)(const void *)(p + (size_t)r * rs))),
            _mm256_loadu_si256((const __m256i *)(const void *)(p + (size_t)(r + 8) * rs)), 1);
    }
    kx5_transpose(z);
    const __m512i k80 = _mm512_set1_epi8((char)0x80);
    KX_UNROLL for (int k = 0; k < 8; k++)
    {
        _mm512_store_si512(&dst[k], _mm512_xor_si512(z[k], k80));
    }
}

/* int8 rows (nr of them at q, stride n_in; the others row 0 again), blocks [b0, b1): block b's
 * eight registers at wbuf + (b - b0) * stride. */
static KX_NOINLINE KX512 void kx5_pack_q8(const int8_t *q, int32_t n_in, int32_t nr, int32_t b0,
                                          int32_t b1, __m512i *wbuf, size_t stride)
{
    const int32_t full = n_in / COLIBRI_QK8;
    const size_t rs = (size_t)n_in;
    for (int32_t b = b0; b < b1; b++) {
        const size_t off = (size_t)b * COLIBRI_QK8;
        __m512i *dst = &wbuf[(size_t)(b - b0) * stride];
        if ((b & 1) == 0) { /* sixteen streams from memory: each a line KX5_PF bytes ahead */
            KX_UNROLL for (int r = 0; r < 16; r++)
            {
                _mm_prefetch((const char *)((uintptr_t)q + (size_t)r * rs + off + KX5_PF),
                             _MM_HINT_T0);
            }
        }
        if (nr == 16 && b < full) {
            kx5_pack_q8_block(q + off, rs, dst);
        } else { /* rows past nr (row 0 again) or the partial last block: zero-padded copies */
            const size_t n = (b < full) ? COLIBRI_QK8 : (size_t)(n_in - full * COLIBRI_QK8);
            int8_t wpad[16][COLIBRI_QK8];
            memset(wpad, 0, sizeof wpad);
            for (int r = 0; r < 16; r++) {
                memcpy(wpad[r], q + (size_t)(r < nr ? r : 0) * rs + off, n);
            }
            kx5_pack_q8_block(&wpad[0][0], COLIBRI_QK8, dst);
        }
    }
}

/* Block b of sixteen int4 rows (row[r]): lane r of q[j] = bytes 4j..4j+3 of row r's nibbles.
 * Each row's 16 bytes in a 128-bit lane (rows g, g + 4, g + 8, g + 12 in a[g]), then a 4 x 4
 * transpose of dwords within the lanes. */
KX_INLINE KX512 void kx5_q4_quads(const colibri_block_q4_32 *const row[16], int32_t b, __m512i q[4])
{
    __m512i a[4];
    KX_UNROLL for (int g = 0; g < 4; g++)
    {
#define KX5_QS(r) _mm_loadu_si128((const __m128i *)(const void *)row[r][b].qs)
        a[g] = _mm512_inserti32x4(
            _mm512_inserti32x4(
                _mm512_inserti32x4(_mm512_castsi128_si512(KX5_QS(g)), KX5_QS(g + 4), 1),
                KX5_QS(g + 8), 2),
            KX5_QS(g + 12), 3);
#undef KX5_QS
    }
    const __m512i t0 = _mm512_unpacklo_epi32(a[0], a[1]);
    const __m512i t1 = _mm512_unpackhi_epi32(a[0], a[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(a[2], a[3]);
    const __m512i t3 = _mm512_unpackhi_epi32(a[2], a[3]);
    q[0] = _mm512_unpacklo_epi64(t0, t2);
    q[1] = _mm512_unpackhi_epi64(t0, t2);
    q[2] = _mm512_unpacklo_epi64(t1, t3);
    q[3] = _mm512_unpackhi_epi64(t1, t3);
}

/* int4 rows (nr of them at w, nb blocks each; the others row 0 again), blocks [b0, b1): the
 * nibbles split into eight registers (kx5_q4_quads), and d per lane as float. */
static KX_NOINLINE KX512 void kx5_pack_q4(const colibri_block_q4_32 *w, int32_t nb, int32_t nr,
                                          int32_t b0, int32_t b1, __m512i *wbuf, __m512 *sbuf)
{
    const colibri_block_q4_32 *row[16];
    int32_t idx[16];
    KX_UNROLL for (int r = 0; r < 16; r++)
    {
        row[r] = w + (size_t)(r < nr ? r : 0) * (size_t)nb;
        idx[r] = (r < nr ? r : 0) * nb * (int32_t)sizeof *w;
    }
    const __m512i vidx = _mm512_loadu_si512((const void *)idx);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int32_t b = b0; b < b1; b++) {
        __m512i q[4];
        kx5_q4_quads(row, b, q);
        __m512i *dst = &wbuf[(size_t)(b - b0) * 8u];
        KX_UNROLL for (int j = 0; j < 4; j++)
        {
            _mm512_store_si512(&dst[j], _mm512_and_si512(q[j], m4));
            _mm512_store_si512(&dst[j + 4], _mm512_and_si512(_mm512_srli_epi16(q[j], 4), m4));
        }
        const __m512i dv = _mm512_i32gather_epi32(vidx, (const void *)(w + b), 1);
        sbuf[b - b0] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dv));
    }
}

/* out[j] (j < 8) = mult * the sum of the 32 codes of block j at x (eight whole blocks). */
KX_INLINE KX512 void kx5_corr8(const int8_t *x, int32_t mult, int32_t *out)
{
    const __m512i ones = _mm512_set1_epi8(1);
    __m512i d[4];
    KX_UNROLL for (int i = 0; i < 4; i++)
    {
        d[i] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones,
                                   _mm512_loadu_si512((const void *)(x + 64 * i)));
    }
    /* 128-bit lane L of d[i] is a quarter of block 2i + (L >> 1) */
    const __m512i e0 =
        _mm512_add_epi32(_mm512_unpacklo_epi32(d[0], d[1]), _mm512_unpackhi_epi32(d[0], d[1]));
    const __m512i e1 =
        _mm512_add_epi32(_mm512_unpacklo_epi32(d[2], d[3]), _mm512_unpackhi_epi32(d[2], d[3]));
    const __m512i f =
        _mm512_add_epi32(_mm512_unpacklo_epi64(e0, e1), _mm512_unpackhi_epi64(e0, e1));
    /* lane L, dword i: the sum of lane L of d[i]; pairs of lanes L, L ^ 1 added */
    const __m512i g = _mm512_add_epi32(f, _mm512_shuffle_i32x4(f, f, 0xB1));
    /* dwords 0..3: blocks 0, 2, 4, 6; dwords 8..11: blocks 1, 3, 5, 7 */
    const __m512i order = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i s =
        _mm512_mullo_epi32(_mm512_permutexvar_epi32(order, g), _mm512_set1_epi32(mult));
    _mm256_storeu_si256((__m256i *)(void *)out, _mm512_castsi512_si256(s));
}

/* mult * the sum of the 32 codes at x. */
KX_INLINE KX512 int32_t kx5_corr1(const int8_t *x, int32_t mult)
{
    const __m256i d = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1),
                                          _mm256_loadu_si256((const __m256i *)(const void *)x));
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(d), _mm256_extracti128_si256(d, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xB1));
    return mult * _mm_cvtsi128_si32(h);
}

/* out[b - b0] = mult * the sum of the codes of whole block b at x, for b in [b0, b1). */
KX_INLINE KX512 void kx5_corrs(const int8_t *x, int32_t b0, int32_t b1, int32_t mult, int32_t *out)
{
    int32_t b = b0;
    for (; b + 8 <= b1; b += 8) {
        kx5_corr8(x + (size_t)b * COLIBRI_QK8, mult, out + (b - b0));
    }
    for (; b < b1; b++) {
        out[b - b0] = kx5_corr1(x + (size_t)b * COLIBRI_QK8, mult);
    }
}

/* nblk blocks of NT tokens: token t's codes of block j at x + t * xs + 32 j, its scale at
 * sx[t * ss + j], its correction at corr[t * cs + j]. wb: eight registers a block, sv: the row
 * scales of a block (KX5_Q8B / KX5_Q4: sixteen floats, KX5_Q8: unused); the packed layouts
 * (kxp_pack) carry their scales: KX5_P8B nine registers a block (the codes, the sixteen float
 * scales), KX5_P4 nine a pair of blocks (the two blocks' nibbles in four registers each, split
 * here, then their sixteen fp16 d each). */
KX_INLINE KX512 void kx5_blocks(const __m512i *wb, const void *sv, int32_t nblk, const int8_t *x,
                                size_t xs, const float *sx, size_t ss, const int32_t *corr,
                                size_t cs, kx5_pf *pf, uintptr_t ahead, __m512 acc[], const int NT,
                                const int MODE)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int32_t j = 0; j < nblk; j++) {
        if (pf != NULL) {
            kx5_prefetch(pf);
        }
        __m512i wk[8];
        __m512 s16 = _mm512_setzero_ps();
        if (MODE == KX5_P4) {
            const __m512i *pair = &wb[(size_t)(j >> 1) * 9u];
            const __m512i *p = pair + (size_t)(j & 1) * 4u;
            KX_UNROLL for (int k = 0; k < 4; k++)
            {
                const __m512i v = _mm512_load_si512(&p[k]);
                wk[k] = _mm512_and_si512(v, m4);
                wk[k + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            }
            s16 = _mm512_cvtph_ps(
                _mm256_load_si256((const __m256i *)(const void *)(pair + 8) + (j & 1)));
            if (ahead != 0u && (j & 1) == 0) {
                kx_z_prefetch((uintptr_t)pair + ahead, 9);
            }
        } else {
            const __m512i *p = &wb[(size_t)j * ((MODE == KX5_P8B) ? 9u : 8u)];
            if (ahead != 0u) {
                kx_z_prefetch((uintptr_t)p + ahead, (MODE == KX5_P8B) ? 9 : 8);
            }
            KX_UNROLL for (int k = 0; k < 8; k++)
            {
                wk[k] = _mm512_load_si512(&p[k]);
            }
            if (MODE == KX5_P8B) {
                s16 = _mm512_castsi512_ps(_mm512_load_si512(&p[8]));
            } else if (MODE != KX5_Q8) {
                s16 = ((const __m512 *)sv)[j];
            }
        }
        /* k outer, tokens inner: consecutive VPDPBUSD go to different tokens' sums, so the
         * NT dependency chains overlap instead of each token's eight running back to back */
        __m512i a[KX5_TILE];
        _Pragma("GCC unroll 8") for (int t = 0; t < NT; t++)
        {
            a[t] = _mm512_set1_epi32(corr[(size_t)t * cs + (size_t)j]);
        }
        KX_UNROLL for (int k = 0; k < 8; k++)
        {
            _Pragma("GCC unroll 8") for (int t = 0; t < NT; t++)
            {
                int32_t x4;
                memcpy(&x4, x + (size_t)t * xs + (size_t)j * COLIBRI_QK8 + 4u * (size_t)k,
                       sizeof x4);
                a[t] = _mm512_dpbusd_epi32(a[t], wk[k], _mm512_set1_epi32(x4));
            }
        }
        _Pragma("GCC unroll 8") for (int t = 0; t < NT; t++)
        {
            const __m512 s = _mm512_set1_ps(sx[(size_t)t * ss + (size_t)j]);
            acc[t] =
                _mm512_add_ps(acc[t], _mm512_mul_ps(_mm512_cvtepi32_ps(a[t]),
                                                    (MODE != KX5_Q8) ? _mm512_mul_ps(s16, s) : s));
        }
    }
}

/* The NT accumulators to rows y + t * ldy (the mask's lanes), times rscale (int8: the per-row
 * scales) when not NULL. */
KX_INLINE KX512 void kx5_store(const __m512 acc[], float *y, int32_t ldy, __mmask16 mask,
                               const float *rscale, const int NT)
{
    _Pragma("GCC unroll 8") for (int t = 0; t < NT; t++)
    {
        __m512 v = acc[t];
        if (rscale != NULL) {
            v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(mask, rscale));
        }
        _mm512_mask_storeu_ps(y + (size_t)t * (size_t)ldy, mask, v);
    }
}

/* One tile of NT tokens over the repacked blocks [b0, b1) of sixteen rows: x / sx / y at the
 * tile's first token, y at the group's first row; mask: the rows stored. */
KX_INLINE KX512 void kx5_tile(const __m512i *wbuf, const __m512 *sbuf, int32_t b0, int32_t b1,
                              int32_t n_in, const int8_t *x, const float *sx, float *y, int32_t ldy,
                              __mmask16 mask, int first, const float *rscale, kx5_pf *pf,
                              const int NT, const int MODE)
{
    const int32_t nb = (int32_t)COLIBRI_Q8_BLOCKS(n_in);
    const int32_t full = n_in / COLIBRI_QK8;
    const int32_t bf = (b1 < full) ? b1 : full;
    const int32_t mult = (MODE == KX5_Q4) ? -8 : -128;
    int32_t corr[KX5_TILE * KX5_BCH];
    int8_t xpad[KX5_TILE][COLIBRI_QK8];
    __m512 acc[KX5_TILE];
    _Pragma("GCC unroll 8") for (int t = 0; t < NT; t++)
    {
        const int8_t *xt = x + (size_t)t * (size_t)n_in;
        kx5_corrs(xt, b0, bf, mult, &corr[t * KX5_BCH]);
        if (bf < b1) {
            kx_pad_rows(xpad[t], COLIBRI_QK8, xt + (size_t)bf * COLIBRI_QK8, (size_t)n_in, 1,
                        (size_t)(n_in - bf * COLIBRI_QK8));
            corr[t * KX5_BCH + (bf - b0)] = kx5_corr1(xpad[t], mult);
        }
        acc[t] =
            first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask, y + (size_t)t * (size_t)ldy);
    }
    kx5_blocks(wbuf, sbuf, bf - b0, x + (size_t)b0 * COLIBRI_QK8, (size_t)n_in, sx + b0, (size_t)nb,
               corr, KX5_BCH, pf, 0u, acc, NT, MODE);
    if (bf < b1) {
        kx5_blocks(wbuf + (size_t)(bf - b0) * 8u, sbuf + (bf - b0), 1, &xpad[0][0], COLIBRI_QK8,
                   sx + bf, (size_t)nb, corr + (bf - b0), KX5_BCH, NULL, 0u, acc, NT, MODE);
    }
    kx5_store(acc, y, ldy, mask, rscale, NT);
}

#define KX5_CASE(N, MODE)                                                                          \
    case N:                                                                                        \
        kx5_tile(wbuf, sbuf, b0, b1, n_in, x, sx, y, ldy, mask, first, rscale, pf, N, MODE);       \
        break;
#define KX5_TILE_FN(NAME, MODE)                                                                    \
    static KX_NOINLINE KX512 void NAME(const __m512i *wbuf, const __m512 *sbuf, int32_t b0,        \
                                       int32_t b1, int32_t n_in, const int8_t *x, const float *sx, \
                                       float *y, int32_t ldy, __mmask16 mask, int first,           \
                                       const float *rscale, kx5_pf *pf, int nt)                    \
    {                                                                                              \
        switch (nt) {                                                                              \
            KX5_CASE(1, MODE)                                                                      \
            KX5_CASE(2, MODE)                                                                      \
            KX5_CASE(3, MODE)                                                                      \
            KX5_CASE(4, MODE)                                                                      \
            KX5_CASE(5, MODE)                                                                      \
            KX5_CASE(6, MODE)                                                                      \
            KX5_CASE(7, MODE)                                                                      \
        default:                                                                                   \
            kx5_tile(wbuf, sbuf, b0, b1, n_in, x, sx, y, ldy, mask, first, rscale, pf, 8, MODE);   \
            break;                                                                                 \
        }                                                                                          \
    }

KX5_TILE_FN(kx5_tile_q8, KX5_Q8)
KX5_TILE_FN(kx5_tile_q8b, KX5_Q8B)
KX5_TILE_FN(kx5_tile_q4, KX5_Q4)

/* MODE KX5_Q8 / KX5_Q8B: w = the int8 rows, scale per row / per row and block; KX5_Q4: w = the
 * int4 blocks (scale unused). */
static KX_NOINLINE KX512 void kx5_matmul(const void *w, const float *scale, const int8_t *xq,
                                         const float *sx, float *y, int32_t ldy, int32_t n_out,
                                         int32_t n_in, int32_t n_tok, int mode)
{
    const int32_t nb = (int32_t)COLIBRI_Q8_BLOCKS(n_in);
    __m512i wbuf[KX5_BCH * 8];
    __m512 sbuf[KX5_BCH];
    for (int32_t o0 = 0; o0 < n_out; o0 += 16) {
        const int32_t nr = (n_out - o0 < 16) ? n_out - o0 : 16;
        const __mmask16 mask = (__mmask16)((1u << nr) - 1u);
        for (int32_t b0 = 0; b0 < nb; b0 += KX5_BCH) {
            const int32_t b1 = (nb - b0 < KX5_BCH) ? nb : b0 + KX5_BCH;
            if (mode == KX5_Q4) {
                kx5_pack_q4((const colibri_block_q4_32 *)w + (size_t)o0 * (size_t)nb, nb, nr, b0,
                            b1, wbuf, sbuf);
            } else {
                kx5_pack_q8((const int8_t *)w + (size_t)o0 * (size_t)n_in, n_in, nr, b0, b1, wbuf,
                            8u);
            }
            if (mode == KX5_Q8B) {
                int32_t idx[16];
                for (int r = 0; r < 16; r++) {
                    idx[r] = (o0 + (r < nr ? r : 0)) * nb;
                }
                const __m512i vidx = _mm512_loadu_si512((const void *)idx);
                for (int32_t b = b0; b < b1; b++) {
                    sbuf[b - b0] = _mm512_i32gather_ps(vidx, scale + b, 4);
                }
            }
            /* the next pack: this group's next blocks, else the next sixteen rows' first */
            const int32_t nb0 = (b1 < nb) ? b1 : 0;
            const int32_t nb1 = (nb - nb0 < KX5_BCH) ? nb : nb0 + KX5_BCH;
            const int32_t no0 = (b1 < nb) ? o0 : o0 + 16;
            const size_t bbytes = (mode == KX5_Q4) ? sizeof(colibri_block_q4_32) : COLIBRI_QK8;
            kx5_pf pf;
            pf.stride = (mode == KX5_Q4) ? (size_t)nb * bbytes : (size_t)n_in;
            pf.p = (uintptr_t)w + (size_t)no0 * pf.stride + (size_t)nb0 * bbytes;
            pf.len = (size_t)(nb1 - nb0) * bbytes;
            pf.r = 0;
            pf.off = 0;
            { /* the lines, over (tiles x blocks) block steps */
                const size_t lines = 16u * ((pf.len + 63u) / 64u);
                const size_t steps =
                    (size_t)((n_tok + KX5_TILE - 1) / KX5_TILE) * (size_t)(b1 - b0);
                pf.per = (int)((lines + steps - 1u) / steps);
            }
            const int first = b0 == 0;
            const float *rs = (mode == KX5_Q8 && b1 == nb) ? scale + o0 : NULL;
            for (int32_t t0 = 0, nt = 0; t0 < n_tok; t0 += nt) {
                nt = (n_tok - t0 < KX5_TILE) ? n_tok - t0 : KX5_TILE;
                const int8_t *xt = xq + (size_t)t0 * (size_t)n_in;
                const float *st = sx + (size_t)t0 * (size_t)nb;
                float *yt = y + (size_t)t0 * (size_t)ldy + (size_t)o0;
                if (mode == KX5_Q8) {
                    kx5_tile_q8(wbuf, sbuf, b0, b1, n_in, xt, st, yt, ldy, mask, first, rs, &pf,
                                nt);
                } else if (mode == KX5_Q8B) {
                    kx5_tile_q8b(wbuf, sbuf, b0, b1, n_in, xt, st, yt, ldy, mask, first, NULL, &pf,
                                 nt);
                } else {
                    kx5_tile_q4(wbuf, sbuf, b0, b1, n_in, xt, st, yt, ldy, mask, first, NULL, &pf,
                                nt);
                }
            }
        }
    }
}

/* Fewer than KX5_MIN_TOK tokens run the matvec token by token: the repacking costs about as much
 * as the tile saves for two or three tokens (measured with the weights in cache). */
#define KX5_MIN_TOK 4
#define KX5_MATVECS(CALL)                                                                          \
    do {                                                                                           \
        const size_t nb = COLIBRI_Q8_BLOCKS(n_in);                                                 \
        for (int32_t t = 0; t < n_tok; t++) {                                                      \
            CALL;                                                                                  \
        }                                                                                          \
        return;                                                                                    \
    } while (0)

static KX512 void kx_matmul_q8_q8_avx512(const int8_t *q, const float *scale, const int8_t *xq,
                                         const float *sx, float *y, int32_t ldy, int32_t n_out,
                                         int32_t n_in, int32_t n_tok)
{
    if (n_tok < KX5_MIN_TOK) {
        KX5_MATVECS(kx_matvec_q8_q8_avx512z(q, scale, xq + (size_t)t * (size_t)n_in,
                                            sx + (size_t)t * nb, y + (size_t)t * (size_t)ldy, n_out,
                                            n_in));
    }
    kx5_matmul(q, scale, xq, sx, y, ldy, n_out, n_in, n_tok, KX5_Q8);
}

static KX512 void kx_matmul_q8b_q8_avx512(const int8_t *q, const float *scale, const int8_t *xq,
                                          const float *sx, float *y, int32_t ldy, int32_t n_out,
                                          int32_t n_in, int32_t n_tok)
{
    if (n_tok < KX5_MIN_TOK) {
        KX5_MATVECS(kx_matvec_q8b_q8_avx512z(q, scale, xq + (size_t)t * (size_t)n_in,
                                             sx + (size_t)t * nb, y + (size_t)t * (size_t)ldy,
                                             n_out, n_in));
    }
    kx5_matmul(q, scale, xq, sx, y, ldy, n_out, n_in, n_tok, KX5_Q8B);
}

static KX512 void kx_matmul_q4_q8_avx512(const colibri_block_q4_32 *w, const int8_t *xq,
                                         const float *sx, float *y, int32_t ldy, int32_t n_out,
                                         int32_t n_in, int32_t n_tok)
{
    if (n_tok < KX5_MIN_TOK) {
        KX5_MATVECS(kx_matvec_q4_q8_avx512z(w, xq + (size_t)t * (size_t)n_in, sx + (size_t)t * nb,
                                            y + (size_t)t * (size_t)ldy, n_out, n_in));
    }
    kx5_matmul(w, NULL, xq, sx, y, ldy, n_out, n_in, n_tok, KX5_Q4);
}

/*
 * Packed matrices (colibri_x86_pack): the layout kx5_matmul builds on the stack for each call,
 * built once when a model is loaded, so that a token's matvec streams one contiguous run of
 * weights (one stream for the hardware prefetcher instead of eight or sixteen rows) and sums each
 * (row, block) in one lane (no horizontal reductions). G = ceil(n_out / 16) groups of sixteen
 * rows (rows past n_out: the group's first row again, never stored), nb = n_in / 32 blocks, each
 * group kxp_group_regs registers of 64 bytes, block by block:
 *  - int8, a scale per row: 8 registers a block (kx5_pack_q8: lane r of register k = bytes
 *    4k..4k+3 of row r, plus 128); the per-row scales stay in the model;
 *  - int8, a scale per row and block: the same 8, then the block's sixteen float scales;
 *  - int4: 9 registers a pair of blocks: the two blocks' nibbles, unsplit (kx5_q4_quads, 4
 *    registers each; kx5_blocks splits them), then their sixteen fp16 d each (the bytes of the
 *    blocks' own d); an odd nb leaves the last pair's second half unused.
 * A block's scales sit next to its codes: as a second stream (all scales after all codes) they
 * cost a quarter of the int4 matvec's speed (26-28 against 36-39 GB/s, Zen 4, huge pages). The
 * packed matrix has the bytes of the stored one (plus the padding rows of the last group). Per
 * token and block the float steps are kx5_tile's, so every output has the bits of the matvec; the
 * tokens' corrections are computed once per call for all groups. Software prefetch into L2 some KB
 * ahead of the stream, on Intel CPUs only (kx_ahead): on Zen 4 the hardware prefetcher alone
 * streamed 32-35 GB/s from huge pages, and every prefetch distance tried (0.5-16 KB ahead, into
 * L1) was slower (16-25 GB/s); on a Xeon the hardware alone stopped at a plain loop's 14.6 GB/s
 * (figures at kx_ahead).
 */
#define KXP_CORR 4096 /* (token, block) corrections per batch of tokens: 16 KB of stack */

/* 64-byte registers of one group of sixteen rows */
KX_INLINE size_t kxp_group_regs(int32_t kind, int32_t nb)
{
    return (kind == COLIBRI_X86_PACK_Q4)    ? 9u * (size_t)((nb + 1) / 2)
           : (kind == COLIBRI_X86_PACK_Q8B) ? 9u * (size_t)nb
                                            : 8u * (size_t)nb;
}

static KX_NOINLINE KX512 void kxp_pack(int32_t kind, const void *w, const float *scale,
                                       int32_t n_out, int32_t n_in, void *dst)
{
    const int32_t nb = n_in / COLIBRI_QK8;
    const int32_t groups = (n_out + 15) / 16;
    const size_t regs = kxp_group_regs(kind, nb);
    for (int32_t g = 0; g < groups; g++) {
        const int32_t o0 = 16 * g;
        const int32_t nr = (n_out - o0 < 16) ? n_out - o0 : 16;
        __m512i *cg = (__m512i *)dst + (size_t)g * regs;
        if (kind == COLIBRI_X86_PACK_Q4) {
            const colibri_block_q4_32 *base =
                (const colibri_block_q4_32 *)w + (size_t)o0 * (size_t)nb;
            const colibri_block_q4_32 *row[16];
            int32_t idx[16];
            for (int r = 0; r < 16; r++) {
                row[r] = base + (size_t)(r < nr ? r : 0) * (size_t)nb;
                idx[r] = (r < nr ? r : 0) * nb * (int32_t)sizeof *base;
            }
            const __m512i vidx = _mm512_loadu_si512((const void *)idx);
            if (nb % 2 != 0) { /* the unused half of the last pair */
                memset(&cg[(size_t)(nb / 2) * 9u], 0, 9u * sizeof(__m512i));
            }
            for (int32_t b = 0; b < nb; b++) {
                __m512i *pair = &cg[(size_t)(b >> 1) * 9u];
                __m512i q[4];
                kx5_q4_quads(row, b, q);
                KX_UNROLL for (int j = 0; j < 4; j++)
                {
                    _mm512_store_si512(&pair[(size_t)(b & 1) * 4u + (size_t)j], q[j]);
                }
                const __m512i dv = _mm512_i32gather_epi32(vidx, (const void *)(base + b), 1);
                _mm256_store_si256((__m256i *)(void *)(pair + 8) + (b & 1),
                                   _mm512_cvtepi32_epi16(dv));
            }
        } else {
            const int blocked = kind == COLIBRI_X86_PACK_Q8B;
            kx5_pack_q8((const int8_t *)w + (size_t)o0 * (size_t)n_in, n_in, nr, 0, nb, cg,
                        blocked ? 9u : 8u);
            for (int32_t b = 0; b < nb && blocked; b++) {
                float *sb = (float *)(void *)&cg[(size_t)b * 9u + 8u];
                for (int32_t r = 0; r < 16; r++) {
                    sb[r] = scale[(size_t)(o0 + (r < nr ? r : 0)) * (size_t)nb + (size_t)b];
                }
            }
        }
    }
}

/* NT tokens (the first at x / sx / corr, strides nb * 32, nb, nb) over the nb blocks of one
 * group; y at the group's first row, mask: the rows stored. */
KX_INLINE KX512 void kxp_tile(const __m512i *cg, int32_t nb, const int8_t *x, const float *sx,
                              const int32_t *corr, float *y, int32_t ldy, __mmask16 mask,
                              const float *rscale, uintptr_t ahead, const int NT, const int MODE)
{
    __m512 acc[KX5_TILE];
    _Pragma("GCC unroll 8") for (int t = 0; t < NT; t++)
    {
        acc[t] = _mm512_setzero_ps();
    }
    kx5_blocks(cg, NULL, nb, x, (size_t)nb * COLIBRI_QK8, sx, (size_t)nb, corr, (size_t)nb, NULL,
               ahead, acc, NT, MODE);
    kx5_store(acc, y, ldy, mask, rscale, NT);
}

#define KXP_CASE(N, MODE)                                                                          \
    case N:                                                                                        \
        kxp_tile(cg, nb, x, sx, corr, y, ldy, mask, rscale, ahead, N, MODE);                       \
        break;
#define KXP_TILE_FN(NAME, MODE)                                                                    \
    static KX_NOINLINE KX512 void NAME(                                                            \
        const __m512i *cg, int32_t nb, const int8_t *x, const float *sx, const int32_t *corr,      \
        float *y, int32_t ldy, __mmask16 mask, const float *rscale, uintptr_t ahead, int nt)       \
    {                                                                                              \
        switch (nt) {                                                                              \
            KXP_CASE(1, MODE)                                                                      \
            KXP_CASE(2, MODE)                                                                      \
            KXP_CASE(3, MODE)                                                                      \
            KXP_CASE(4, MODE)                                                                      \
            KXP_CASE(5, MODE)                                                                      \
            KXP_CASE(6, MODE)                                                                      \
            KXP_CASE(7, MODE)                                                                      \
        default:                                                                                   \
            kxp_tile(cg, nb, x, sx, corr, y, ldy, mask, rscale, ahead, 8, MODE);                   \
            break;                                                                                 \
        }                                                                                          \
    }

KXP_TILE_FN(kxp_tile_q8, KX5_Q8)
KXP_TILE_FN(kxp_tile_q8b, KX5_P8B)
KXP_TILE_FN(kxp_tile_q4, KX5_P4)

static KX_NOINLINE KX512 void kxp_matmul(int32_t kind, const void *packed, const float *rscale,
                                         int32_t n_out, int32_t n_in, int32_t r0, int32_t r1,
                                         const int8_t *xq, const float *sx, float *y, int32_t ldy,
                                         int32_t n_tok)
{
    const int32_t nb = n_in / COLIBRI_QK8;
    const size_t regs = kxp_group_regs(kind, nb);
    (void)n_out;
    const int32_t mult = (kind == COLIBRI_X86_PACK_Q4) ? -8 : -128;
    const uintptr_t ahead = (uintptr_t)kx_ahead();
    int32_t corr[KXP_CORR];
    int32_t batch = KXP_CORR / nb; /* nb <= KXP_CORR: colibri_x86_packed_bytes */
    if (batch > KX5_TILE) {
        batch -= batch % KX5_TILE;
    }
    for (int32_t t0 = 0; t0 < n_tok; t0 += batch) {
        const int32_t tn = (n_tok - t0 < batch) ? n_tok - t0 : batch;
        for (int32_t t = 0; t < tn; t++) {
            kx5_corrs(xq + (size_t)(t0 + t) * (size_t)n_in, 0, nb, mult,
                      corr + (size_t)t * (size_t)nb);
        }
        for (int32_t o0 = r0; o0 < r1; o0 += 16) {
            const size_t g = (size_t)o0 / 16u;
            const int32_t nr = (r1 - o0 < 16) ? r1 - o0 : 16;
            const __mmask16 mask = (__mmask16)((1u << nr) - 1u);
            const __m512i *cg = (const __m512i *)packed + g * regs;
            for (int32_t tt = 0, nt = 0; tt < tn; tt += nt) {
                nt = (tn - tt < KX5_TILE) ? tn - tt : KX5_TILE;
                const size_t t = (size_t)(t0 + tt);
                const int8_t *x = xq + t * (size_t)n_in;
                const float *s = sx + t * (size_t)nb;
                const int32_t *c = corr + (size_t)tt * (size_t)nb;
                float *yt = y + t * (size_t)ldy + (size_t)(o0 - r0);
                if (kind == COLIBRI_X86_PACK_Q8) {
                    kxp_tile_q8(cg, nb, x, s, c, yt, ldy, mask, rscale + (o0 - r0), ahead, nt);
                } else if (kind == COLIBRI_X86_PACK_Q8B) {
                    kxp_tile_q8b(cg, nb, x, s, c, yt, ldy, mask, NULL, ahead, nt);
                } else {
                    kxp_tile_q4(cg, nb, x, s, c, yt, ldy, mask, NULL, ahead, nt);
                }
            }
        }
    }
}
#endif

/* -- the levels and the choice ------------------------------------------------------------- */

static const colibri_x86_kernels_t kx_levels[4] = {
    [COLIBRI_KERNEL_BASE] = {NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL},
    [COLIBRI_KERNEL_AVX2] = {kx_matvec_f32_avx2, kx_matvec_f16_f32_avx2, kx_matvec_q8_q8_avx2,
                             kx_matvec_q8b_q8_avx2, kx_matvec_q4_q8_avx2, kx_matmul_q8_q8_avx2,
                             kx_matmul_q8b_q8_avx2, kx_matmul_q4_q8_avx2, kx_silu_mul_f32_avx2,
                             kx_axpy_f32_avx2, kx_argmax_f32_avx2},
#if defined(KX_HAVE_VNNI)
    [COLIBRI_KERNEL_AVX_VNNI] = {kx_matvec_f32_avx2, kx_matvec_f16_f32_avx2,
                                 kx_matvec_q8_q8_avxvnni, kx_matvec_q8b_q8_avxvnni,
                                 kx_matvec_q4_q8_avxvnni, kx_matmul_q8_q8_avxvnni,
                                 kx_matmul_q8b_q8_avxvnni, kx_matmul_q4_q8_avxvnni,
                                 kx_silu_mul_f32_avx2, kx_axpy_f32_avx2, kx_argmax_f32_avx2},
    [COLIBRI_KERNEL_AVX512_VNNI] = {kx_matvec_f32_avx2, kx_matvec_f16_f32_avx2,
                                    kx_matvec_q8_q8_avx512z, kx_matvec_q8b_q8_avx512z,
                                    kx_matvec_q4_q8_avx512z, kx_matmul_q8_q8_avx512,
                                    kx_matmul_q8b_q8_avx512, kx_matmul_q4_q8_avx512,
                                    kx_silu_mul_f32_avx2, kx_axpy_f32_avx2, kx_argmax_f32_avx2},
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
        kind > COLIBRI_X86_PACK_Q4 || n_out < 16 || n_in <= 0 || n_in % COLIBRI_QK8 != 0 ||
        n_in / COLIBRI_QK8 > KXP_CORR) {
        return 0u;
    }
    return (size_t)(n_out + 15) / 16u * kxp_group_regs(kind, n_in / COLIBRI_QK8) * 64u;
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
    kxp_pack(kind, w, scale, n_out, n_in, dst);
#else
    (void)kind;
    (void)w;
    (void)scale;
    (void)n_out;
    (void)n_in;
    (void)dst;
#endif
}

void colibri_x86_matmul_packed(int32_t kind, const void *packed, const float *rscale, int32_t n_out,
                               int32_t n_in, int32_t r0, int32_t r1, const int8_t *xq,
                               const float *sx, float *y, int32_t ldy, int32_t n_tok)
{
#if defined(KX_HAVE_VNNI)
    kxp_matmul(kind, packed, rscale, n_out, n_in, r0, r1, xq, sx, y, ldy, n_tok);
#else
    (void)kind;
    (void)packed;
    (void)rscale;
    (void)n_out;
    (void)n_in;
    (void)r0;
    (void)r1;
    (void)xq;
    (void)sx;
    (void)y;
    (void)ldy;
    (void)n_tok;
#endif
}

#else
/* Not x86-64 (or COLIBRI_NO_X86_DISPATCH): kernels_q.c is the only path. ISO C wants a
 * declaration in every translation unit. */
typedef int colibri_kernels_x86_unused;
#endif
