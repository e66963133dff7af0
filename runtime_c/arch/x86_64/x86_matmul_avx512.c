/**
 * @file x86_matmul_avx512.c
 * @brief x86-64 AVX-512 VNNI multi-token kernels (sixteen rows per ZMM register, weights repacked
 *        once per range of blocks) and the packed matrices of whole models built on them
 *        (colibri_x86_pack / colibri_x86_matmul_packed).
 */
#include "x86_internal.h"

#if defined(COLIBRI_X86_DISPATCH) && defined(KX_HAVE_VNNI)
/*
 * AVX-512 VNNI multi-token kernels (colibri_matmul_q8_q8 / q8b_q8 / q4_q8): sixteen rows per ZMM
 * register, one lane per row, so a row's block sum needs no horizontal reduction. Per group of
 * sixteen rows and range of up to KX_MM512_BCH blocks, the weights are repacked once into a stack
 * buffer: for block b, eight registers W[k] with lane r = the four bytes 4k..4k+3 of row r's block
 * as unsigned bytes (int8: w ^ 0x80 = w + 128; int4: the nibbles 0..15). Every token of the call
 * then runs over the buffer in tiles of up to KX_MM512_TILE tokens: per token and block, eight
 * VPDPBUSD of the eight W[k] with the token's four codes 4k..4k+3 broadcast (a memory operand),
 * starting from the token's correction -128 (or -8) * the sum of the block's codes, computed once
 * per tile and block range for all sixteen rows. The lanes hold the exact int32 block sums of the
 * matvec; the float steps per lane are the matvec's (acc += (float)isum * sx[b], or * (ws[b] *
 * sx[b]), or * (d * sx[b]), blocks in order, separate multiply and add; int8: y = acc * scale[o]).
 * Between block ranges the accumulators wait in y. Rows past n_out are computed on row 0 again
 * and not stored (masked stores); a partial last block runs on zero-padded copies.
 */
#define KX_MM512_TILE 8
#define KX_MM512_BCH 32
#define KX_MM512_PF 512u

enum { KX_MM512_Q8 = 0, KX_MM512_Q8B = 1, KX_MM512_Q4 = 2, KX_MM512_P8B = 3, KX_MM512_P4 = 4 };

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
} kx_mm512_pf;

KX_INLINE void kx_mm512_prefetch(kx_mm512_pf *pf)
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
KX_INLINE KX_AVX512VNNI void kx_mm512_transpose(__m512i z[8])
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
KX_INLINE KX_AVX512VNNI void kx_mm512_pack_q8_block(const int8_t *p, size_t rs, __m512i *dst)
{
    __m512i z[8];
    KX_UNROLL for (int r = 0; r < 8; r++)
    {
        z[r] = _mm512_inserti64x4(
            _mm512_castsi256_si512(
                _mm256_loadu_si256((const __m256i *)(const void *)(p + (size_t)r * rs))),
            _mm256_loadu_si256((const __m256i *)(const void *)(p + (size_t)(r + 8) * rs)), 1);
    }
    kx_mm512_transpose(z);
    const __m512i k80 = _mm512_set1_epi8((char)0x80);
    KX_UNROLL for (int k = 0; k < 8; k++)
    {
        _mm512_store_si512(&dst[k], _mm512_xor_si512(z[k], k80));
    }
}

/* int8 rows (nr of them at q, stride n_in; the others row 0 again), blocks [b0, b1): block b's
 * eight registers at wbuf + (b - b0) * stride. */
static KX_NOINLINE KX_AVX512VNNI void kx_mm512_pack_q8(const int8_t *q, int32_t n_in, int32_t nr,
                                                       int32_t b0, int32_t b1, __m512i *wbuf,
                                                       size_t stride)
{
    const int32_t full = n_in / COLIBRI_QK8;
    const size_t rs = (size_t)n_in;
    for (int32_t b = b0; b < b1; b++) {
        const size_t off = (size_t)b * COLIBRI_QK8;
        __m512i *dst = &wbuf[(size_t)(b - b0) * stride];
        if ((b & 1) == 0) { /* sixteen streams from memory: each a line KX_MM512_PF bytes ahead */
            KX_UNROLL for (int r = 0; r < 16; r++)
            {
                _mm_prefetch((const char *)((uintptr_t)q + (size_t)r * rs + off + KX_MM512_PF),
                             _MM_HINT_T0);
            }
        }
        if (nr == 16 && b < full) {
            kx_mm512_pack_q8_block(q + off, rs, dst);
        } else { /* rows past nr (row 0 again) or the partial last block: zero-padded copies */
            const size_t n = (b < full) ? COLIBRI_QK8 : (size_t)(n_in - full * COLIBRI_QK8);
            int8_t wpad[16][COLIBRI_QK8];
            memset(wpad, 0, sizeof wpad);
            for (int r = 0; r < 16; r++) {
                memcpy(wpad[r], q + (size_t)(r < nr ? r : 0) * rs + off, n);
            }
            kx_mm512_pack_q8_block(&wpad[0][0], COLIBRI_QK8, dst);
        }
    }
}

/* Block b of sixteen int4 rows (row[r]): lane r of q[j] = bytes 4j..4j+3 of row r's nibbles.
 * Each row's 16 bytes in a 128-bit lane (rows g, g + 4, g + 8, g + 12 in a[g]), then a 4 x 4
 * transpose of dwords within the lanes. */
KX_INLINE KX_AVX512VNNI void kx_mm512_q4_quads(const colibri_block_q4_32 *const row[16], int32_t b,
                                               __m512i q[4])
{
    __m512i a[4];
    KX_UNROLL for (int g = 0; g < 4; g++)
    {
#define KX_MM512_QS(r) _mm_loadu_si128((const __m128i *)(const void *)row[r][b].qs)
        a[g] = _mm512_inserti32x4(
            _mm512_inserti32x4(
                _mm512_inserti32x4(_mm512_castsi128_si512(KX_MM512_QS(g)), KX_MM512_QS(g + 4), 1),
                KX_MM512_QS(g + 8), 2),
            KX_MM512_QS(g + 12), 3);
#undef KX_MM512_QS
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
 * nibbles split into eight registers (kx_mm512_q4_quads), and d per lane as float. */
static KX_NOINLINE KX_AVX512VNNI void kx_mm512_pack_q4(const colibri_block_q4_32 *w, int32_t nb,
                                                       int32_t nr, int32_t b0, int32_t b1,
                                                       __m512i *wbuf, __m512 *sbuf)
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
        kx_mm512_q4_quads(row, b, q);
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
KX_INLINE KX_AVX512VNNI void kx_mm512_corr8(const int8_t *x, int32_t mult, int32_t *out)
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
KX_INLINE KX_AVX512VNNI int32_t kx_mm512_corr1(const int8_t *x, int32_t mult)
{
    const __m256i d = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1),
                                          _mm256_loadu_si256((const __m256i *)(const void *)x));
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(d), _mm256_extracti128_si256(d, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xB1));
    return mult * _mm_cvtsi128_si32(h);
}

/* out[b - b0] = mult * the sum of the codes of whole block b at x, for b in [b0, b1). */
KX_INLINE KX_AVX512VNNI void kx_mm512_corrs(const int8_t *x, int32_t b0, int32_t b1, int32_t mult,
                                            int32_t *out)
{
    int32_t b = b0;
    for (; b + 8 <= b1; b += 8) {
        kx_mm512_corr8(x + (size_t)b * COLIBRI_QK8, mult, out + (b - b0));
    }
    for (; b < b1; b++) {
        out[b - b0] = kx_mm512_corr1(x + (size_t)b * COLIBRI_QK8, mult);
    }
}

/* nblk blocks of NT tokens: token t's codes of block j at x + t * xs + 32 j, its scale at
 * sx[t * ss + j], its correction at corr[t * cs + j]. wb: eight registers a block, sv: the row
 * scales of a block (KX_MM512_Q8B / KX_MM512_Q4: sixteen floats, KX_MM512_Q8: unused); the packed
 * layouts (colibri_x86_pack_avx512) carry their scales: KX_MM512_P8B nine registers a block (the
 * codes, the sixteen float scales), KX_MM512_P4 nine a pair of blocks (the two blocks' nibbles in
 * four registers each, split here, then their sixteen fp16 d each). */
KX_INLINE KX_AVX512VNNI void kx_mm512_blocks(const __m512i *wb, const void *sv, int32_t nblk,
                                             const int8_t *x, size_t xs, const float *sx, size_t ss,
                                             const int32_t *corr, size_t cs, kx_mm512_pf *pf,
                                             uintptr_t ahead, __m512 acc[], const int NT,
                                             const int MODE)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int32_t j = 0; j < nblk; j++) {
        if (pf != NULL) {
            kx_mm512_prefetch(pf);
        }
        __m512i wk[8];
        __m512 s16 = _mm512_setzero_ps();
        if (MODE == KX_MM512_P4) {
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
                kx_mv512_prefetch((uintptr_t)pair + ahead, 9);
            }
        } else {
            const __m512i *p = &wb[(size_t)j * ((MODE == KX_MM512_P8B) ? 9u : 8u)];
            if (ahead != 0u) {
                kx_mv512_prefetch((uintptr_t)p + ahead, (MODE == KX_MM512_P8B) ? 9 : 8);
            }
            KX_UNROLL for (int k = 0; k < 8; k++)
            {
                wk[k] = _mm512_load_si512(&p[k]);
            }
            if (MODE == KX_MM512_P8B) {
                s16 = _mm512_castsi512_ps(_mm512_load_si512(&p[8]));
            } else if (MODE != KX_MM512_Q8) {
                s16 = ((const __m512 *)sv)[j];
            }
        }
        /* k outer, tokens inner: consecutive VPDPBUSD go to different tokens' sums, so the
         * NT dependency chains overlap instead of each token's eight running back to back */
        __m512i a[KX_MM512_TILE];
        _Pragma("GCC unroll 8") for (int t = 0; t < NT; t++)
        {
            a[t] = _mm512_set1_epi32(corr[(size_t)t * cs + (size_t)j]);
        }
        if (NT == 1) {
            /* one token (decode): its eight in two chains of four, added (int32 sums: the same
             * bits in any order). With one chain of eight the int4 matvec was bound by their
             * latency: a 1024 x 2816 int4 matrix from DRAM 0.088-0.094 -> 0.073-0.078 ms,
             * 32000 x 1024 0.90 -> 0.82-0.88 ms (Zen 4); four chains of two were slower. */
            __m512i b = _mm512_setzero_si512();
            KX_UNROLL for (int k = 0; k < 8; k += 2)
            {
                int32_t x4, y4;
                memcpy(&x4, x + (size_t)j * COLIBRI_QK8 + 4u * (size_t)k, sizeof x4);
                memcpy(&y4, x + (size_t)j * COLIBRI_QK8 + 4u * (size_t)k + 4u, sizeof y4);
                a[0] = _mm512_dpbusd_epi32(a[0], wk[k], _mm512_set1_epi32(x4));
                b = _mm512_dpbusd_epi32(b, wk[k + 1], _mm512_set1_epi32(y4));
            }
            a[0] = _mm512_add_epi32(a[0], b);
        } else {
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
        }
        _Pragma("GCC unroll 8") for (int t = 0; t < NT; t++)
        {
            const __m512 s = _mm512_set1_ps(sx[(size_t)t * ss + (size_t)j]);
            acc[t] = _mm512_add_ps(
                acc[t], _mm512_mul_ps(_mm512_cvtepi32_ps(a[t]),
                                      (MODE != KX_MM512_Q8) ? _mm512_mul_ps(s16, s) : s));
        }
    }
}

/* The NT accumulators to rows y + t * ldy (the mask's lanes), times rscale (int8: the per-row
 * scales) when not NULL. */
KX_INLINE KX_AVX512VNNI void kx_mm512_store(const __m512 acc[], float *y, int32_t ldy,
                                            __mmask16 mask, const float *rscale, const int NT)
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
KX_INLINE KX_AVX512VNNI void kx_mm512_tile(const __m512i *wbuf, const __m512 *sbuf, int32_t b0,
                                           int32_t b1, int32_t n_in, const int8_t *x,
                                           const float *sx, float *y, int32_t ldy, __mmask16 mask,
                                           int first, const float *rscale, kx_mm512_pf *pf,
                                           const int NT, const int MODE)
{
    const int32_t nb = (int32_t)COLIBRI_Q8_BLOCKS(n_in);
    const int32_t full = n_in / COLIBRI_QK8;
    const int32_t bf = (b1 < full) ? b1 : full;
    const int32_t mult = (MODE == KX_MM512_Q4) ? -8 : -128;
    int32_t corr[KX_MM512_TILE * KX_MM512_BCH];
    int8_t xpad[KX_MM512_TILE][COLIBRI_QK8];
    __m512 acc[KX_MM512_TILE];
    _Pragma("GCC unroll 8") for (int t = 0; t < NT; t++)
    {
        const int8_t *xt = x + (size_t)t * (size_t)n_in;
        kx_mm512_corrs(xt, b0, bf, mult, &corr[t * KX_MM512_BCH]);
        if (bf < b1) {
            colibri_x86_pad_rows(xpad[t], COLIBRI_QK8, xt + (size_t)bf * COLIBRI_QK8, (size_t)n_in,
                                 1, (size_t)(n_in - bf * COLIBRI_QK8));
            corr[t * KX_MM512_BCH + (bf - b0)] = kx_mm512_corr1(xpad[t], mult);
        }
        acc[t] =
            first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask, y + (size_t)t * (size_t)ldy);
    }
    kx_mm512_blocks(wbuf, sbuf, bf - b0, x + (size_t)b0 * COLIBRI_QK8, (size_t)n_in, sx + b0,
                    (size_t)nb, corr, KX_MM512_BCH, pf, 0u, acc, NT, MODE);
    if (bf < b1) {
        kx_mm512_blocks(wbuf + (size_t)(bf - b0) * 8u, sbuf + (bf - b0), 1, &xpad[0][0],
                        COLIBRI_QK8, sx + bf, (size_t)nb, corr + (bf - b0), KX_MM512_BCH, NULL, 0u,
                        acc, NT, MODE);
    }
    kx_mm512_store(acc, y, ldy, mask, rscale, NT);
}

#define KX_MM512_CASE(N, MODE)                                                                     \
    case N:                                                                                        \
        kx_mm512_tile(wbuf, sbuf, b0, b1, n_in, x, sx, y, ldy, mask, first, rscale, pf, N, MODE);  \
        break;
#define KX_MM512_TILE_FN(NAME, MODE)                                                               \
    static KX_NOINLINE KX_AVX512VNNI void NAME(                                                    \
        const __m512i *wbuf, const __m512 *sbuf, int32_t b0, int32_t b1, int32_t n_in,             \
        const int8_t *x, const float *sx, float *y, int32_t ldy, __mmask16 mask, int first,        \
        const float *rscale, kx_mm512_pf *pf, int nt)                                              \
    {                                                                                              \
        switch (nt) {                                                                              \
            KX_MM512_CASE(1, MODE)                                                                 \
            KX_MM512_CASE(2, MODE)                                                                 \
            KX_MM512_CASE(3, MODE)                                                                 \
            KX_MM512_CASE(4, MODE)                                                                 \
            KX_MM512_CASE(5, MODE)                                                                 \
            KX_MM512_CASE(6, MODE)                                                                 \
            KX_MM512_CASE(7, MODE)                                                                 \
        default:                                                                                   \
            kx_mm512_tile(wbuf, sbuf, b0, b1, n_in, x, sx, y, ldy, mask, first, rscale, pf, 8,     \
                          MODE);                                                                   \
            break;                                                                                 \
        }                                                                                          \
    }

KX_MM512_TILE_FN(kx_mm512_tile_q8, KX_MM512_Q8)
KX_MM512_TILE_FN(kx_mm512_tile_q8b, KX_MM512_Q8B)
KX_MM512_TILE_FN(kx_mm512_tile_q4, KX_MM512_Q4)

/* MODE KX_MM512_Q8 / KX_MM512_Q8B: w = the int8 rows, scale per row / per row and block;
 * KX_MM512_Q4: w = the int4 blocks (scale unused). */
static KX_NOINLINE KX_AVX512VNNI void kx_mm512_matmul(const void *w, const float *scale,
                                                      const int8_t *xq, const float *sx, float *y,
                                                      int32_t ldy, int32_t n_out, int32_t n_in,
                                                      int32_t n_tok, int mode)
{
    const int32_t nb = (int32_t)COLIBRI_Q8_BLOCKS(n_in);
    __m512i wbuf[KX_MM512_BCH * 8];
    __m512 sbuf[KX_MM512_BCH];
    for (int32_t o0 = 0; o0 < n_out; o0 += 16) {
        const int32_t nr = (n_out - o0 < 16) ? n_out - o0 : 16;
        const __mmask16 mask = (__mmask16)((1u << nr) - 1u);
        for (int32_t b0 = 0; b0 < nb; b0 += KX_MM512_BCH) {
            const int32_t b1 = (nb - b0 < KX_MM512_BCH) ? nb : b0 + KX_MM512_BCH;
            if (mode == KX_MM512_Q4) {
                kx_mm512_pack_q4((const colibri_block_q4_32 *)w + (size_t)o0 * (size_t)nb, nb, nr,
                                 b0, b1, wbuf, sbuf);
            } else {
                kx_mm512_pack_q8((const int8_t *)w + (size_t)o0 * (size_t)n_in, n_in, nr, b0, b1,
                                 wbuf, 8u);
            }
            if (mode == KX_MM512_Q8B) {
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
            const int32_t nb1 = (nb - nb0 < KX_MM512_BCH) ? nb : nb0 + KX_MM512_BCH;
            const int32_t no0 = (b1 < nb) ? o0 : o0 + 16;
            const size_t bbytes = (mode == KX_MM512_Q4) ? sizeof(colibri_block_q4_32) : COLIBRI_QK8;
            kx_mm512_pf pf;
            pf.stride = (mode == KX_MM512_Q4) ? (size_t)nb * bbytes : (size_t)n_in;
            pf.p = (uintptr_t)w + (size_t)no0 * pf.stride + (size_t)nb0 * bbytes;
            pf.len = (size_t)(nb1 - nb0) * bbytes;
            pf.r = 0;
            pf.off = 0;
            { /* the lines, over (tiles x blocks) block steps */
                const size_t lines = 16u * ((pf.len + 63u) / 64u);
                const size_t steps =
                    (size_t)((n_tok + KX_MM512_TILE - 1) / KX_MM512_TILE) * (size_t)(b1 - b0);
                pf.per = (int)((lines + steps - 1u) / steps);
            }
            const int first = b0 == 0;
            const float *rs = (mode == KX_MM512_Q8 && b1 == nb) ? scale + o0 : NULL;
            for (int32_t t0 = 0, nt = 0; t0 < n_tok; t0 += nt) {
                nt = (n_tok - t0 < KX_MM512_TILE) ? n_tok - t0 : KX_MM512_TILE;
                const int8_t *xt = xq + (size_t)t0 * (size_t)n_in;
                const float *st = sx + (size_t)t0 * (size_t)nb;
                float *yt = y + (size_t)t0 * (size_t)ldy + (size_t)o0;
                if (mode == KX_MM512_Q8) {
                    kx_mm512_tile_q8(wbuf, sbuf, b0, b1, n_in, xt, st, yt, ldy, mask, first, rs,
                                     &pf, nt);
                } else if (mode == KX_MM512_Q8B) {
                    kx_mm512_tile_q8b(wbuf, sbuf, b0, b1, n_in, xt, st, yt, ldy, mask, first, NULL,
                                      &pf, nt);
                } else {
                    kx_mm512_tile_q4(wbuf, sbuf, b0, b1, n_in, xt, st, yt, ldy, mask, first, NULL,
                                     &pf, nt);
                }
            }
        }
    }
}

/* Fewer than KX_MM512_MIN_TOK tokens run the matvec token by token: the repacking costs about as
 * much as the tile saves for two or three tokens (measured with the weights in cache). */
#define KX_MM512_MIN_TOK 4
#define KX_MM512_MATVECS(CALL)                                                                     \
    do {                                                                                           \
        const size_t nb = COLIBRI_Q8_BLOCKS(n_in);                                                 \
        for (int32_t t = 0; t < n_tok; t++) {                                                      \
            CALL;                                                                                  \
        }                                                                                          \
        return;                                                                                    \
    } while (0)

/* The int8 ones (MODE KX_MM512_Q8: a scale per row, KX_MM512_Q8B: per row and block). */
#define KX_MM512_MATMUL_Q8(NAME, MATVEC, MODE)                                                     \
    KX_AVX512VNNI void NAME(const int8_t *q, const float *scale, const int8_t *xq,                 \
                            const float *sx, float *y, int32_t ldy, int32_t n_out, int32_t n_in,   \
                            int32_t n_tok)                                                         \
    {                                                                                              \
        if (n_tok < KX_MM512_MIN_TOK) {                                                            \
            KX_MM512_MATVECS(MATVEC(q, scale, xq + (size_t)t * (size_t)n_in, sx + (size_t)t * nb,  \
                                    y + (size_t)t * (size_t)ldy, n_out, n_in));                    \
        }                                                                                          \
        kx_mm512_matmul(q, scale, xq, sx, y, ldy, n_out, n_in, n_tok, MODE);                       \
    }

KX_MM512_MATMUL_Q8(colibri_x86_matmul_q8_q8_avx512, colibri_x86_matvec_q8_q8_avx512z, KX_MM512_Q8)
KX_MM512_MATMUL_Q8(colibri_x86_matmul_q8b_q8_avx512, colibri_x86_matvec_q8b_q8_avx512z,
                   KX_MM512_Q8B)

KX_AVX512VNNI void colibri_x86_matmul_q4_q8_avx512(const colibri_block_q4_32 *w, const int8_t *xq,
                                                   const float *sx, float *y, int32_t ldy,
                                                   int32_t n_out, int32_t n_in, int32_t n_tok)
{
    if (n_tok < KX_MM512_MIN_TOK) {
        KX_MM512_MATVECS(
            colibri_x86_matvec_q4_q8_avx512z(w, xq + (size_t)t * (size_t)n_in, sx + (size_t)t * nb,
                                             y + (size_t)t * (size_t)ldy, n_out, n_in));
    }
    kx_mm512_matmul(w, NULL, xq, sx, y, ldy, n_out, n_in, n_tok, KX_MM512_Q4);
}

/*
 * Packed matrices (colibri_x86_pack): the layout kx_mm512_matmul builds on the stack for each call,
 * built once when a model is loaded, so that a token's matvec streams one contiguous run of
 * weights (one stream for the hardware prefetcher instead of eight or sixteen rows) and sums each
 * (row, block) in one lane (no horizontal reductions). G = ceil(n_out / 16) groups of sixteen
 * rows (rows past n_out: the group's first row again, never stored), nb = n_in / 32 blocks, each
 * group kx_pk512_group_regs registers of 64 bytes, block by block:
 *  - int8, a scale per row: 8 registers a block (kx_mm512_pack_q8: lane r of register k = bytes
 *    4k..4k+3 of row r, plus 128); the per-row scales stay in the model;
 *  - int8, a scale per row and block: the same 8, then the block's sixteen float scales;
 *  - int4: 9 registers a pair of blocks: the two blocks' nibbles, unsplit (kx_mm512_q4_quads, 4
 *    registers each; kx_mm512_blocks splits them), then their sixteen fp16 d each (the bytes of the
 *    blocks' own d); an odd nb leaves the last pair's second half unused.
 * A block's scales sit next to its codes: as a second stream (all scales after all codes) they
 * cost a quarter of the int4 matvec's speed (26-28 against 36-39 GB/s, Zen 4, huge pages). The
 * packed matrix has the bytes of the stored one (plus the padding rows of the last group). Per
 * token and block the float steps are kx_mm512_tile's, so every output has the bits of the matvec;
 * the tokens' corrections are computed once per call for all groups. Software prefetch into L2 some
 * KB ahead of the stream, on Intel CPUs only (kx_ahead): on Zen 4 the hardware prefetcher alone
 * streamed 32-35 GB/s from huge pages, and every prefetch distance tried (0.5-16 KB ahead, into
 * L1) was slower (16-25 GB/s); on a Xeon the hardware alone stopped at a plain loop's 14.6 GB/s
 * (figures at kx_ahead).
 */
/* How many bytes ahead of the packed matrices' stream their kernels prefetch into L2 (0: none),
 * for one token (decode) and for several (prefill, the experts' groups of tokens).
 * COLIBRI_X86_PREFETCH=<bytes> in the environment sets both (0 turns it off; at most 1 MiB).
 * Else, chosen on the first call: one token 8192 on Intel CPUs and 0 elsewhere, several tokens
 * 8192 on every CPU.
 * One token: on a Xeon (Sapphire Rapids family, one core) the hardware prefetchers alone
 * streamed a packed int8 model at 14.6 GB/s, the speed of a plain read loop; 8 KB ahead into L2
 * took issue 13's int8 decode from 121-134 to 135-157 tokens/s and int4 from 142-152 to 217-234
 * (interleaved runs); into L1 int8 reached only 137-149. On a Zen 4 every distance tried into L1
 * was slower than none (see the packed matrices' comment), and 8 KB into L2 too (issue 13's int8
 * decode 177-228 -> 139-163 tokens/s), so AMD CPUs keep the hardware's stream alone.
 * Several tokens: the tiles compute long enough on each group of sixteen rows for the hardware
 * stream to stall between groups; on the Zen 4, a 1024 x 2816 int4 matrix streamed from DRAM
 * with 8 / 16 tokens took 0.354 / 0.484 ms without and 0.175 / 0.318 ms with 8 KB into L2
 * (0.257 / 0.462 -> 0.168 / 0.312 at 2816 x 1024; int8 alike). Outputs do not depend on it. */
static atomic_int kx_ahead_bytes = -1;       /* one token */
static atomic_int kx_ahead_multi_bytes = -1; /* several */

static void kx_ahead_choose(void)
{
    /* every racing thread computes the same values */
    int one, multi;
    const char *env = getenv("COLIBRI_X86_PREFETCH");
    if (env != NULL && env[0] != '\0') {
        const long n = strtol(env, NULL, 10);
        one = multi = (n <= 0) ? 0 : (n > (1L << 20)) ? (1 << 20) : (int)n;
    } else {
        unsigned a = 0u, b = 0u, c = 0u, d = 0u;
        /* vendor "GenuineIntel": EBX, EDX, ECX of leaf 0 */
        const int intel = __get_cpuid(0, &a, &b, &c, &d) && b == 0x756E6547u && d == 0x49656E69u &&
                          c == 0x6C65746Eu;
        one = intel ? 8192 : 0;
        multi = 8192;
    }
    atomic_store_explicit(&kx_ahead_multi_bytes, multi, memory_order_relaxed);
    atomic_store_explicit(&kx_ahead_bytes, one, memory_order_relaxed);
}

static int32_t kx_ahead(int32_t n_tok)
{
    atomic_int *v = n_tok > 1 ? &kx_ahead_multi_bytes : &kx_ahead_bytes;
    if (atomic_load_explicit(v, memory_order_relaxed) < 0) {
        kx_ahead_choose();
    }
    return atomic_load_explicit(v, memory_order_relaxed);
}

#define KX_PK512_CORR 4096 /* (token, block) corrections per batch of tokens: 16 KB of stack */

/* 64-byte registers of one group of sixteen rows */
KX_INLINE size_t kx_pk512_group_regs(int32_t kind, int32_t nb)
{
    return (kind == COLIBRI_X86_PACK_Q4)    ? 9u * (size_t)((nb + 1) / 2)
           : (kind == COLIBRI_X86_PACK_Q8B) ? 9u * (size_t)nb
                                            : 8u * (size_t)nb;
}

size_t colibri_x86_packed_bytes_avx512(int32_t kind, int32_t n_out, int32_t n_in)
{
    if (n_in / COLIBRI_QK8 > KX_PK512_CORR) {
        return 0u;
    }
    return (size_t)(n_out + 15) / 16u * kx_pk512_group_regs(kind, n_in / COLIBRI_QK8) * 64u;
}

KX_NOINLINE KX_AVX512VNNI void colibri_x86_pack_avx512(int32_t kind, const void *w,
                                                       const float *scale, int32_t n_out,
                                                       int32_t n_in, void *dst)
{
    const int32_t nb = n_in / COLIBRI_QK8;
    const int32_t groups = (n_out + 15) / 16;
    const size_t regs = kx_pk512_group_regs(kind, nb);
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
                kx_mm512_q4_quads(row, b, q);
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
            kx_mm512_pack_q8((const int8_t *)w + (size_t)o0 * (size_t)n_in, n_in, nr, 0, nb, cg,
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
KX_INLINE KX_AVX512VNNI void kx_pk512_tile(const __m512i *cg, int32_t nb, const int8_t *x,
                                           const float *sx, const int32_t *corr, float *y,
                                           int32_t ldy, __mmask16 mask, const float *rscale,
                                           uintptr_t ahead, const int NT, const int MODE)
{
    __m512 acc[KX_MM512_TILE];
    _Pragma("GCC unroll 8") for (int t = 0; t < NT; t++)
    {
        acc[t] = _mm512_setzero_ps();
    }
    kx_mm512_blocks(cg, NULL, nb, x, (size_t)nb * COLIBRI_QK8, sx, (size_t)nb, corr, (size_t)nb,
                    NULL, ahead, acc, NT, MODE);
    kx_mm512_store(acc, y, ldy, mask, rscale, NT);
}

#define KX_PK512_CASE(N, MODE)                                                                     \
    case N:                                                                                        \
        kx_pk512_tile(cg, nb, x, sx, corr, y, ldy, mask, rscale, ahead, N, MODE);                  \
        break;
#define KX_PK512_TILE_FN(NAME, MODE)                                                               \
    static KX_NOINLINE KX_AVX512VNNI void NAME(                                                    \
        const __m512i *cg, int32_t nb, const int8_t *x, const float *sx, const int32_t *corr,      \
        float *y, int32_t ldy, __mmask16 mask, const float *rscale, uintptr_t ahead, int nt)       \
    {                                                                                              \
        switch (nt) {                                                                              \
            KX_PK512_CASE(1, MODE)                                                                 \
            KX_PK512_CASE(2, MODE)                                                                 \
            KX_PK512_CASE(3, MODE)                                                                 \
            KX_PK512_CASE(4, MODE)                                                                 \
            KX_PK512_CASE(5, MODE)                                                                 \
            KX_PK512_CASE(6, MODE)                                                                 \
            KX_PK512_CASE(7, MODE)                                                                 \
        default:                                                                                   \
            kx_pk512_tile(cg, nb, x, sx, corr, y, ldy, mask, rscale, ahead, 8, MODE);              \
            break;                                                                                 \
        }                                                                                          \
    }

KX_PK512_TILE_FN(kx_pk512_tile_q8, KX_MM512_Q8)
KX_PK512_TILE_FN(kx_pk512_tile_q8b, KX_MM512_P8B)
KX_PK512_TILE_FN(kx_pk512_tile_q4, KX_MM512_P4)

KX_NOINLINE KX_AVX512VNNI void colibri_x86_matmul_packed_avx512(
    int32_t kind, const void *packed, const float *rscale, int32_t n_out, int32_t n_in, int32_t r0,
    int32_t r1, const int8_t *xq, const float *sx, float *y, int32_t ldy, int32_t n_tok)
{
    const int32_t nb = n_in / COLIBRI_QK8;
    const size_t regs = kx_pk512_group_regs(kind, nb);
    (void)n_out;
    const int32_t mult = (kind == COLIBRI_X86_PACK_Q4) ? -8 : -128;
    const uintptr_t ahead = (uintptr_t)kx_ahead(n_tok);
    int32_t corr[KX_PK512_CORR];
    int32_t batch = KX_PK512_CORR / nb; /* nb <= KX_PK512_CORR: colibri_x86_packed_bytes */
    if (batch > KX_MM512_TILE) {
        batch -= batch % KX_MM512_TILE;
    }
    for (int32_t t0 = 0; t0 < n_tok; t0 += batch) {
        const int32_t tn = (n_tok - t0 < batch) ? n_tok - t0 : batch;
        for (int32_t t = 0; t < tn; t++) {
            kx_mm512_corrs(xq + (size_t)(t0 + t) * (size_t)n_in, 0, nb, mult,
                           corr + (size_t)t * (size_t)nb);
        }
        for (int32_t o0 = r0; o0 < r1; o0 += 16) {
            const size_t g = (size_t)o0 / 16u;
            const int32_t nr = (r1 - o0 < 16) ? r1 - o0 : 16;
            const __mmask16 mask = (__mmask16)((1u << nr) - 1u);
            const __m512i *cg = (const __m512i *)packed + g * regs;
            for (int32_t tt = 0, nt = 0; tt < tn; tt += nt) {
                nt = (tn - tt < KX_MM512_TILE) ? tn - tt : KX_MM512_TILE;
                const size_t t = (size_t)(t0 + tt);
                const int8_t *x = xq + t * (size_t)n_in;
                const float *s = sx + t * (size_t)nb;
                const int32_t *c = corr + (size_t)tt * (size_t)nb;
                float *yt = y + t * (size_t)ldy + (size_t)(o0 - r0);
                if (kind == COLIBRI_X86_PACK_Q8) {
                    kx_pk512_tile_q8(cg, nb, x, s, c, yt, ldy, mask, rscale + (o0 - r0), ahead, nt);
                } else if (kind == COLIBRI_X86_PACK_Q8B) {
                    kx_pk512_tile_q8b(cg, nb, x, s, c, yt, ldy, mask, NULL, ahead, nt);
                } else {
                    kx_pk512_tile_q4(cg, nb, x, s, c, yt, ldy, mask, NULL, ahead, nt);
                }
            }
        }
    }
}
#else
/* ISO C wants a declaration in every translation unit. */
typedef int x86_matmul_avx512_unused;
#endif
