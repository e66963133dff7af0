/**
 * @file x86_matvec_avx512.c
 * @brief x86-64 AVX-512 VNNI one-token matvecs on 512-bit registers (int8, block-scaled int8,
 *        int4).
 */
#include "x86_internal.h"

#include "../../src/kernels_scalar.h"

#if defined(COLIBRI_X86_DISPATCH) && defined(KX_HAVE_VNNI)
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
 *  - What does not depend on the row is prepared once per call (chunks of KX_MV512_STEPS steps):
 * the codes (int4: rearranged to the nibble order), zero past n_in (masked loads), the correction
 *    (-128 resp. -8 times the sum of each four codes the lane's products take, the initial value
 *    of every row's accumulator) and the activation scales spread over the lanes.
 *  - A step past the last block (nb odd for int8, not a multiple of four for int4) reads no
 *    weight byte beyond the row (masked loads) and adds nothing to the float sums.
 *  - Each step prefetches its share of a later group of rows (contiguous) into L2
 *    (_MM_HINT_T1): int8 the next group, int4 the fourth one on; from DRAM measured faster than
 *    into L1, and for int4 than the next group.
 */
#define KX_MV512_STEPS 64

typedef struct {
    __m512i x;    /* int8: the codes of two blocks; int4: x[0..15] of four blocks */
    __m512i xh;   /* int4: x[16..31] of four blocks */
    __m512i corr; /* initial accumulator of every row */
    __m512 s;     /* the activation scale of each lane's block */
} kx_mv512_prep;

/* lanes [a0 + a2, b0 + b2, a1 + a3, b1 + b3] per 128-bit lane */
KX_INLINE KX_AVX512VNNI __m512i kx_mv512_pair(__m512i a, __m512i b)
{
    return _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
}

/* a = kx_mv512_pair(r0, r1), b = kx_mv512_pair(r2, r3): lane k of each 128-bit lane = row k's sum
 */
KX_INLINE KX_AVX512VNNI __m512i kx_mv512_quad(__m512i a, __m512i b)
{
    return _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
}

/* The 128-bit lanes of p[0..3] / p[4..7] reduced: lane k of 128-bit lane j of *lo = the sum of
 * row k's four lanes j, of *hi the same for row 4 + k. */
KX_INLINE KX_AVX512VNNI void kx_mv512_reduce8(const __m512i p[8], __m512i *lo, __m512i *hi)
{
    *lo = kx_mv512_quad(kx_mv512_pair(p[0], p[1]), kx_mv512_pair(p[2], p[3]));
    *hi = kx_mv512_quad(kx_mv512_pair(p[4], p[5]), kx_mv512_pair(p[6], p[7]));
}

/* bytes [0, n) of p (n <= 64), zero after */
KX_INLINE KX_AVX512VNNI __m512i kx_mv512_load(const int8_t *p, int32_t n)
{
    const __mmask64 m = (n >= 64) ? ~(__mmask64)0 : (((__mmask64)1 << n) - 1u);
    return _mm512_maskz_loadu_epi8(m, p);
}

/* int8 steps k0 .. k0 + n - 1 (step k: blocks 2k, 2k + 1, inputs 64k ..) */
KX_INLINE KX_AVX512VNNI void kx_mv512_prep_q8(const int8_t *xq, const float *sx, int32_t n_in,
                                              int32_t nb, int32_t k0, int32_t n, kx_mv512_prep *z)
{
    const __m512i k80 = _mm512_set1_epi8((char)0x80);
    for (int32_t k = 0; k < n; k++) {
        const int32_t i0 = 64 * (k0 + k);
        const int32_t b = 2 * (k0 + k);
        z[k].x = kx_mv512_load(xq + i0, n_in - i0);
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
KX_INLINE KX_AVX512VNNI __m512i kx_mv512_q8_sums(const int8_t *g, size_t s, const kx_mv512_prep *z,
                                                 int masked, int32_t n)
{
    const __m512i k80 = _mm512_set1_epi8((char)0x80);
    __m512i p[8];
    KX_UNROLL for (int32_t r = 0; r < 8; r++)
    {
        const int8_t *w = g + (size_t)r * s;
        const __m512i wv = masked ? kx_mv512_load(w, n) : _mm512_loadu_si512((const void *)w);
        p[r] = _mm512_dpbusd_epi32(z->corr, _mm512_xor_si512(wv, k80), z->x);
    }
    __m512i lo, hi;
    kx_mv512_reduce8(p, &lo, &hi);
    return _mm512_add_epi32(_mm512_shuffle_i32x4(lo, hi, _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_i32x4(lo, hi, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* q8b: lanes [rows 0-3 of block b, rows 0-3 of b + 1, rows 4-7 of b, rows 4-7 of b + 1] of the
 * block scales at gs (row r at gs + r * nb); TWO 0: block b only (lanes of b + 1 zero). */
KX_INLINE KX_AVX512VNNI __m512 kx_mv512_q8b_scales(const float *gs, int32_t nb, int two)
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
KX_INLINE KX_AVX512VNNI void kx_mv512_q8_matvec(const int8_t *q, const float *scale,
                                                const int8_t *xq, const float *sx, float *y,
                                                int32_t n_out, int32_t n_in, int blocked)
{
    const int32_t nb = (int32_t)COLIBRI_Q8_BLOCKS(n_in);
    const int32_t nsteps = (nb + 1) / 2;
    const int32_t fsteps = n_in / 64; /* steps whose 64 bytes are all inside the row */
    kx_mv512_prep z[KX_MV512_STEPS];
    const int one_chunk = nsteps <= KX_MV512_STEPS;
    if (one_chunk) {
        kx_mv512_prep_q8(xq, sx, n_in, nb, 0, nsteps, z);
    }
    const size_t s = (size_t)n_in;
    for (int32_t g0 = 0; g0 < n_out; g0 += 8) {
        const int32_t o0 = (g0 + 8 <= n_out) ? g0 : n_out - 8;
        const int8_t *g = q + (size_t)o0 * s;
        const float *gs = scale + (size_t)o0 * (size_t)nb;
        __m512 acc = _mm512_setzero_ps();
        for (int32_t c0 = 0; c0 < nsteps; c0 += KX_MV512_STEPS) {
            const int32_t c1 = (nsteps - c0 < KX_MV512_STEPS) ? nsteps : c0 + KX_MV512_STEPS;
            if (!one_chunk) {
                kx_mv512_prep_q8(xq, sx, n_in, nb, c0, c1 - c0, z);
            }
            /* the steps whose 64 bytes are inside the row */
            const int32_t kf = (c1 < fsteps) ? c1 : fsteps;
            const int8_t *gk = g + (size_t)c0 * 64u;
            const float *gsk = gs + 2 * (size_t)c0;
            const kx_mv512_prep *zk = z;
            for (int32_t k = c0; k < kf; k++, gk += 64, gsk += 2, zk++) {
                kx_mv512_prefetch((uintptr_t)(g + 8 * s) + (size_t)k * 512u, 8);
                if (blocked) {
                    kx_mv512_prefetch((uintptr_t)(gsk + 8 * (size_t)nb), 1);
                }
                const __m512i isum = kx_mv512_q8_sums(gk, s, zk, 0, 64);
                const __m512 f =
                    blocked ? _mm512_mul_ps(kx_mv512_q8b_scales(gsk, nb, 1), zk->s) : zk->s;
                const __m512 pr = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), f);
                acc = _mm512_add_ps(acc, pr);
                acc = _mm512_add_ps(acc, _mm512_shuffle_f32x4(pr, pr, _MM_SHUFFLE(3, 3, 1, 1)));
            }
            for (int32_t k = (kf > c0) ? kf : c0; k < c1; k++) { /* the last, partial step */
                zk = &z[k - c0];
                gk = g + (size_t)k * 64u;
                const __m512i isum = kx_mv512_q8_sums(gk, s, zk, 1, n_in - 64 * k);
                const int two = 2 * k + 1 < nb;
                const __m512 f =
                    blocked ? _mm512_mul_ps(kx_mv512_q8b_scales(gs + 2 * (size_t)k, nb, two), zk->s)
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

KX_NOINLINE KX_AVX512VNNI void colibri_x86_matvec_q8_q8_avx512z(const int8_t *q, const float *scale,
                                                                const int8_t *xq, const float *sx,
                                                                float *y, int32_t n_out,
                                                                int32_t n_in)
{
    if (n_out < 8) {
        colibri_x86_matvec_q8_q8_avx512vnni(q, scale, xq, sx, y, n_out, n_in);
        return;
    }
    kx_mv512_q8_matvec(q, scale, xq, sx, y, n_out, n_in, 0);
}

KX_NOINLINE KX_AVX512VNNI void
colibri_x86_matvec_q8b_q8_avx512z(const int8_t *q, const float *scale, const int8_t *xq,
                                  const float *sx, float *y, int32_t n_out, int32_t n_in)
{
    if (n_out < 8) {
        colibri_x86_matvec_q8b_q8_avx512vnni(q, scale, xq, sx, y, n_out, n_in);
        return;
    }
    kx_mv512_q8_matvec(q, scale, xq, sx, y, n_out, n_in, 1);
}

/* int4 steps k0 .. k0 + n - 1 (step k: blocks 4k .. 4k + 3, inputs 128k ..) */
KX_INLINE KX_AVX512VNNI void kx_mv512_prep_q4(const int8_t *xq, const float *sx, int32_t n_in,
                                              int32_t nb, int32_t k0, int32_t n, kx_mv512_prep *z)
{
    const __m512i k8 = _mm512_set1_epi8(8);
    const __m512i ilo = _mm512_setr_epi64(0, 1, 4, 5, 8, 9, 12, 13);
    const __m512i ihi = _mm512_setr_epi64(2, 3, 6, 7, 10, 11, 14, 15);
    for (int32_t k = 0; k < n; k++) {
        const int32_t i0 = 128 * (k0 + k);
        const int32_t b = 4 * (k0 + k);
        const __m512i xa = kx_mv512_load(xq + i0, n_in - i0);
        const __m512i xb =
            (n_in - i0 > 64) ? kx_mv512_load(xq + i0 + 64, n_in - i0 - 64) : _mm512_setzero_si512();
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
KX_INLINE KX_AVX512VNNI __m512i kx_mv512_q4_load(const colibri_block_q4_32 *blk, int32_t nblk)
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
KX_INLINE KX_AVX512VNNI __m128 kx_mv512_add4(__m128 acc, __m512 pr, int32_t nblk)
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
static const uint16_t kx_mv512_didx[4][32]
    __attribute__((aligned(64))) = {{0, 32, 0, 0, 9, 41, 0, 0, 18, 50, 0, 0, 27, 59, 0, 0,
                                     0, 0,  0, 0, 0, 0,  0, 0, 0,  0,  0, 0, 0,  0,  0, 0},
                                    {0, 0, 0, 32, 0, 0, 9, 41, 0, 0, 18, 50, 0, 0, 27, 59,
                                     0, 0, 0, 0,  0, 0, 0, 0,  0, 0, 0,  0,  0, 0, 0,  0},
                                    {0, 0,  0, 0, 0, 0,  0, 0, 0,  0,  0, 0, 0,  0,  0, 0,
                                     0, 32, 0, 0, 9, 41, 0, 0, 18, 50, 0, 0, 27, 59, 0, 0},
                                    {0, 0, 0, 0,  0, 0, 0, 0,  0, 0, 0,  0,  0, 0, 0,  0,
                                     0, 0, 0, 32, 0, 0, 9, 41, 0, 0, 18, 50, 0, 0, 27, 59}};

/* One int4 step of eight rows (row r's blocks at blk + r * nb), nblk blocks. */
KX_INLINE KX_AVX512VNNI void kx_mv512_q4_step(const colibri_block_q4_32 *blk, size_t nb,
                                              const kx_mv512_prep *z, int32_t nblk, __m128 *acc_lo,
                                              __m128 *acc_hi)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512i p[8];
    __m512i dw[8];
    KX_UNROLL for (int32_t r = 0; r < 8; r++)
    {
        const colibri_block_q4_32 *br = blk + (size_t)r * nb;
        const __m512i v = kx_mv512_q4_load(br, nblk);
        const __m512i lo = _mm512_and_si512(v, m4);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        p[r] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z->corr, lo, z->x), hi, z->xh);
        /* the blocks' scales: bytes up to the last block's d, inside the row */
        dw[r] = (nblk == 4) ? _mm512_loadu_si512((const void *)br)
                            : kx_mv512_load((const int8_t *)(const void *)br, 18 * (nblk - 1) + 2);
    }
    __m512i lo, hi;
    kx_mv512_reduce8(p, &lo, &hi);
    /* 32 fp16 scales: word 16h + 4j + k = row 4h + k, block j */
    __m512i dp[4];
    KX_UNROLL for (int32_t m = 0; m < 4; m++)
    {
        dp[m] = _mm512_permutex2var_epi16(
            dw[2 * m], _mm512_load_si512((const void *)kx_mv512_didx[m]), dw[2 * m + 1]);
    }
    const __m512i d = _mm512_mask_blend_epi16(
        (__mmask32)0xFFFF0000u, _mm512_mask_blend_epi16((__mmask32)0xCCCCCCCCu, dp[0], dp[1]),
        _mm512_mask_blend_epi16((__mmask32)0xCCCCCCCCu, dp[2], dp[3]));
    const __m512 dslo = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(d)), z->s);
    const __m512 dshi = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(d, 1)), z->s);
    *acc_lo = kx_mv512_add4(*acc_lo, _mm512_mul_ps(_mm512_cvtepi32_ps(lo), dslo), nblk);
    *acc_hi = kx_mv512_add4(*acc_hi, _mm512_mul_ps(_mm512_cvtepi32_ps(hi), dshi), nblk);
}

KX_NOINLINE KX_AVX512VNNI void colibri_x86_matvec_q4_q8_avx512z(const colibri_block_q4_32 *w,
                                                                const int8_t *xq, const float *sx,
                                                                float *y, int32_t n_out,
                                                                int32_t n_in)
{
    if (n_out < 8) {
        colibri_x86_matvec_q4_q8_avx512vnni(w, xq, sx, y, n_out, n_in);
        return;
    }
    const int32_t nb = (int32_t)COLIBRI_Q4_BLOCKS(n_in);
    const int32_t nsteps = (nb + 3) / 4;
    kx_mv512_prep z[KX_MV512_STEPS];
    const int one_chunk = nsteps <= KX_MV512_STEPS;
    if (one_chunk) {
        kx_mv512_prep_q4(xq, sx, n_in, nb, 0, nsteps, z);
    }
    for (int32_t g0 = 0; g0 < n_out; g0 += 8) {
        const int32_t o0 = (g0 + 8 <= n_out) ? g0 : n_out - 8;
        const colibri_block_q4_32 *g = w + (size_t)o0 * (size_t)nb;
        const uintptr_t pf = (uintptr_t)(g + 32 * (size_t)nb);
        __m128 acc_lo = _mm_setzero_ps();
        __m128 acc_hi = _mm_setzero_ps();
        for (int32_t c0 = 0; c0 < nsteps; c0 += KX_MV512_STEPS) {
            const int32_t c1 = (nsteps - c0 < KX_MV512_STEPS) ? nsteps : c0 + KX_MV512_STEPS;
            if (!one_chunk) {
                kx_mv512_prep_q4(xq, sx, n_in, nb, c0, c1 - c0, z);
            }
            for (int32_t k = c0; k < c1; k++) {
                /* the group four ahead (from DRAM measured faster than one ahead), 8 rows x 4
                 * blocks = 576 bytes per step */
                kx_mv512_prefetch(pf + (size_t)k * 576u, 9);
                const colibri_block_q4_32 *blk = g + 4 * (size_t)k;
                if (4 * k + 4 <= nb) {
                    kx_mv512_q4_step(blk, (size_t)nb, &z[k - c0], 4, &acc_lo, &acc_hi);
                } else {
                    kx_mv512_q4_step(blk, (size_t)nb, &z[k - c0], nb - 4 * k, &acc_lo, &acc_hi);
                }
            }
        }
        _mm256_storeu_ps(y + o0, _mm256_set_m128(acc_hi, acc_lo));
    }
}

/*
 * colibri_quantize_row_q8 on AVX-512 (every matrix's input, per token): a whole block of 32 in
 * two registers, the SSE2 block's steps (kernels_sse2.h) on sixteen lanes: max |x| on the
 * bits, one division, the codes by truncating x * (127 / amax * 65536) and rounding half away
 * from zero in fixed point, packed with saturation (which changes none: |code| <= 127). Blocks
 * below 2^-100, with an infinity or a NaN, and a partial last block take the scalar block
 * (kernels_scalar.h), as the SSE2 path does: the same bits on every path.
 */
KX_AVX512VNNI void colibri_x86_quantize_row_q8_avx512(const float *x, int8_t *xq, float *sx,
                                                      int32_t n)
{
    const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF);
    const __m512i half = _mm512_set1_epi32(32768);
    int32_t i0 = 0, b = 0;
    for (; i0 + COLIBRI_QK8 <= n; i0 += COLIBRI_QK8, b++) {
        const __m512 x0 = _mm512_loadu_ps(x + i0);
        const __m512 x1 = _mm512_loadu_ps(x + i0 + 16);
        const __m512i a = _mm512_max_epu32(_mm512_and_si512(_mm512_castps_si512(x0), abs_mask),
                                           _mm512_and_si512(_mm512_castps_si512(x1), abs_mask));
        const uint32_t abits = _mm512_reduce_max_epu32(a);
        if (abits < 0x0D800000u || abits >= 0x7F800000u) { /* below 2^-100, infinity or NaN */
            sx[b] = colibri_quantize_block_q8_scalar(x + i0, xq + i0, COLIBRI_QK8);
            continue;
        }
        float amax;
        memcpy(&amax, &abits, sizeof amax);
        const __m512 inv16 = _mm512_set1_ps(((float)COLIBRI_Q8_MAX / amax) * 65536.0f);
        const __m512i t0 = _mm512_cvttps_epi32(_mm512_mul_ps(x0, inv16));
        const __m512i t1 = _mm512_cvttps_epi32(_mm512_mul_ps(x1, inv16));
        const __m512i c0 = _mm512_srai_epi32(
            _mm512_add_epi32(_mm512_add_epi32(t0, half), _mm512_srai_epi32(t0, 31)), 16);
        const __m512i c1 = _mm512_srai_epi32(
            _mm512_add_epi32(_mm512_add_epi32(t1, half), _mm512_srai_epi32(t1, 31)), 16);
        _mm_storeu_si128((__m128i *)(void *)(xq + i0), _mm512_cvtsepi32_epi8(c0));
        _mm_storeu_si128((__m128i *)(void *)(xq + i0 + 16), _mm512_cvtsepi32_epi8(c1));
        sx[b] = amax / (float)COLIBRI_Q8_MAX;
    }
    if (i0 < n) {
        sx[b] = colibri_quantize_block_q8_scalar(x + i0, xq + i0, n - i0);
    }
}
#else
/* ISO C wants a declaration in every translation unit. */
typedef int x86_matvec_avx512_unused;
#endif
