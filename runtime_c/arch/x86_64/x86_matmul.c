/**
 * @file x86_matmul.c
 * @brief x86-64 multi-token int8 / int4 kernels of the AVX2 and AVX-VNNI levels: each block of
 * eight rows unpacked once per tile of tokens.
 */
#include "x86_internal.h"

#if defined(COLIBRI_X86_DISPATCH)
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
KX_NOINLINE void colibri_x86_pad_rows(int8_t *dst, size_t width, const int8_t *src, size_t ss,
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
        colibri_x86_pad_rows(&xpad[0][0], COLIBRI_QK8, xq + (size_t)full * COLIBRI_QK8,
                             (size_t)n_in, nt, (size_t)tail);
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
                colibri_x86_pad_rows(&wpad[0][0], COLIBRI_QK8, row + (size_t)full * COLIBRI_QK8,
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
                    colibri_x86_pad_rows((int8_t *)(void *)dst, COLIBRI_QK4, src + i, 0, 1,
                                         (size_t)(n - i));
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

/* A tile's accumulators: acc[KX_TOK_TILE], the first T (one per token) zeroed. */
#define KX_TILE_ACC(acc, T)                                                                        \
    __m256 acc[KX_TOK_TILE];                                                                       \
    _Pragma("GCC unroll 8") for (int t_ = 0; t_ < (T); t_++)                                       \
    {                                                                                              \
        acc[t_] = _mm256_setzero_ps();                                                             \
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
            colibri_x86_pad_rows(&xpad[0][0], COLIBRI_QK8, xq + (size_t)full * COLIBRI_QK8,        \
                                 (size_t)n_in, T, (size_t)tail);                                   \
        }                                                                                          \
        for (int32_t o0 = 0; o0 < n_out; o0 += 8) {                                                \
            const int8_t *row = q + (size_t)o0 * (size_t)n_in;                                     \
            int32_t sidx[8];                                                                       \
            KX_UNROLL for (int32_t r = 0; r < 8; r++)                                              \
            {                                                                                      \
                sidx[r] = BLOCKED ? (o0 + r) * nb : o0 + r;                                        \
            }                                                                                      \
            const __m256i vidx = _mm256_loadu_si256((const __m256i *)(const void *)sidx);          \
            KX_TILE_ACC(acc, T)                                                                    \
            __m256i hs[KX_TOK_TILE];                                                               \
            int8_t wpad[8][COLIBRI_QK8];                                                           \
            for (int32_t b = 0; b < nb; b++) {                                                     \
                const int8_t *wb = row + (size_t)b * COLIBRI_QK8;                                  \
                size_t wstride = (size_t)n_in;                                                     \
                const int8_t *xb = xq + (size_t)b * COLIBRI_QK8;                                   \
                size_t xstride = (size_t)n_in;                                                     \
                if (b >= full) { /* the partial last block: zero-padded copies */                  \
                    colibri_x86_pad_rows(&wpad[0][0], COLIBRI_QK8,                                 \
                                         row + (size_t)full * COLIBRI_QK8, (size_t)n_in, 8,        \
                                         (size_t)tail);                                            \
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

/* The token loop of a multi-token kernel (its parameters in scope, nb its blocks per row):
 * tiles of nt tokens (KX_TILE_NEXT), each through TILE_CALL for the full groups of eight rows
 * and MATVEC_CALL for one token or the rows after n8. Both calls see xt, st and yt (the tile's
 * codes, block scales and outputs), MATVEC_CALL also t (the token) and o (its first row). */
#define KX_MATMUL_TOKENS(MAXT, MINT, TILE_CALL, MATVEC_CALL)                                       \
    const int32_t n8 = n_out & ~7;                                                                 \
    for (int32_t t0 = 0, nt = 0; t0 < n_tok; t0 += nt) {                                           \
        nt = KX_TILE_NEXT(n_tok - t0, MAXT, MINT);                                                 \
        const int8_t *xt = xq + (size_t)t0 * (size_t)n_in;                                         \
        const float *st = sx + (size_t)t0 * nb;                                                    \
        float *yt = y + (size_t)t0 * (size_t)ldy;                                                  \
        if (nt > 1 && n8 > 0) {                                                                    \
            TILE_CALL;                                                                             \
        }                                                                                          \
        for (int32_t t = 0; t < nt; t++) { /* one token, or the rows after n8: the matvec */       \
            const int32_t o = (nt > 1) ? n8 : 0;                                                   \
            if (o < n_out) {                                                                       \
                MATVEC_CALL;                                                                       \
            }                                                                                      \
        }                                                                                          \
    }

#define KX_Q8_MATMUL(NAME, TARGET, TILEFN, MATVEC, BLOCKED, MAXT, MINT)                            \
    TARGET void NAME(const int8_t *q, const float *scale, const int8_t *xq, const float *sx,       \
                     float *y, int32_t ldy, int32_t n_out, int32_t n_in, int32_t n_tok)            \
    {                                                                                              \
        const size_t nb = COLIBRI_Q8_BLOCKS(n_in);                                                 \
        KX_MATMUL_TOKENS(MAXT, MINT, TILEFN(q, scale, xt, st, yt, ldy, n8, n_in, BLOCKED, nt),     \
                         MATVEC(q + (size_t)o * (size_t)n_in,                                      \
                                scale + (size_t)o * ((BLOCKED) ? nb : 1),                          \
                                xt + (size_t)t * (size_t)n_in, st + (size_t)t * nb,                \
                                yt + (size_t)t * (size_t)ldy + (size_t)o, n_out - o, n_in))        \
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
            colibri_x86_pad_rows(&xpad[0][0], COLIBRI_QK4, xq + (size_t)full * COLIBRI_QK4,        \
                                 (size_t)n_in, T, (size_t)(n_in - full * COLIBRI_QK4));            \
        }                                                                                          \
        for (int32_t o0 = 0; o0 < n_out; o0 += 8) {                                                \
            const colibri_block_q4_32 *row = w + (size_t)o0 * (size_t)nb;                          \
            KX_TILE_ACC(acc, T)                                                                    \
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
    TARGET void NAME(const colibri_block_q4_32 *w, const int8_t *xq, const float *sx, float *y,    \
                     int32_t ldy, int32_t n_out, int32_t n_in, int32_t n_tok)                      \
    {                                                                                              \
        const size_t nb = COLIBRI_Q4_BLOCKS(n_in);                                                 \
        KX_MATMUL_TOKENS(MAXT, MINT, TILEFN(w, xt, st, yt, ldy, n8, n_in, nt),                     \
                         MATVEC(w + (size_t)o * nb, xt + (size_t)t * (size_t)n_in,                 \
                                st + (size_t)t * nb, yt + (size_t)t * (size_t)ldy + (size_t)o,     \
                                n_out - o, n_in))                                                  \
    }

KX_Q8_MATMUL(colibri_x86_matmul_q8_q8_avx2, KX_AVX2, kx_q8_mm_tile_avx2,
             colibri_x86_matvec_q8_q8_avx2, 0, KX_AVX2_TILE, 2)
KX_Q8_MATMUL(colibri_x86_matmul_q8b_q8_avx2, KX_AVX2, kx_q8_mm_tile_avx2,
             colibri_x86_matvec_q8b_q8_avx2, 1, KX_AVX2_TILE, 2)
KX_Q4_MATMUL(colibri_x86_matmul_q4_q8_avx2, KX_AVX2, kx_q4_mm_tile_avx2,
             colibri_x86_matvec_q4_q8_avx2, KX_AVX2_Q4_TILE, 2)
#if defined(KX_HAVE_VNNI)
KX_Q8_MATMUL_TILE(kx_q8_mm_tile_avxvnni, KX_AVXVNNI, kx_q8_tile_avxvnni)
KX_Q8_MATMUL(colibri_x86_matmul_q8_q8_avxvnni, KX_AVXVNNI, kx_q8_mm_tile_avxvnni,
             colibri_x86_matvec_q8_q8_avxvnni, 0, KX_TOK_TILE, KX_TOK_TILE)
KX_Q8_MATMUL(colibri_x86_matmul_q8b_q8_avxvnni, KX_AVXVNNI, kx_q8_mm_tile_avxvnni,
             colibri_x86_matvec_q8b_q8_avxvnni, 1, KX_TOK_TILE, KX_TOK_TILE)
KX_Q4_MATMUL_TILE(kx_q4_mm_tile_avxvnni, KX_AVXVNNI, kx_q4_tile_avxvnni)
KX_Q4_MATMUL(colibri_x86_matmul_q4_q8_avxvnni, KX_AVXVNNI, kx_q4_mm_tile_avxvnni,
             colibri_x86_matvec_q4_q8_avxvnni, KX_TOK_TILE, KX_TOK_TILE)
#endif
#else
/* ISO C wants a declaration in every translation unit. */
typedef int x86_matmul_unused;
#endif
