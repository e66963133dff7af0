/**
 * @file x86_matvec.c
 * @brief x86-64 one-token int8 x int8 and int4 x int8 matvecs on 256-bit registers (AVX2, AVX-VNNI,
 *        and AVX-512 VNNI's 256-bit EVEX form), eight rows per register.
 */
#include "x86_internal.h"

#if defined(COLIBRI_X86_DISPATCH)
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
    KX_NOINLINE TARGET void NAME(const int8_t *q, const float *scale, const int8_t *xq,            \
                                 const float *sx, float *y, int32_t n_out, int32_t n_in)           \
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

KX_Q8_MATVEC(colibri_x86_matvec_q8_q8_avx2, KX_AVX2, kx_q8_block_avx2, 0)
KX_Q8_MATVEC(colibri_x86_matvec_q8b_q8_avx2, KX_AVX2, kx_q8_block_avx2, 1)
#if defined(KX_HAVE_VNNI)
KX_Q8_MATVEC(colibri_x86_matvec_q8_q8_avxvnni, KX_AVXVNNI, kx_q8_block_avxvnni, 0)
KX_Q8_MATVEC(colibri_x86_matvec_q8b_q8_avxvnni, KX_AVXVNNI, kx_q8_block_avxvnni, 1)
KX_Q8_MATVEC(colibri_x86_matvec_q8_q8_avx512vnni, KX_AVX512VNNI, kx_q8_block_avx512vnni, 0)
KX_Q8_MATVEC(colibri_x86_matvec_q8b_q8_avx512vnni, KX_AVX512VNNI, kx_q8_block_avx512vnni, 1)
#endif

/* -- int4 blocks x int8 activations -------------------------------------------------------- */

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
    KX_NOINLINE TARGET void NAME(const colibri_block_q4_32 *w, const int8_t *xq, const float *sx,  \
                                 float *y, int32_t n_out, int32_t n_in)                            \
    {                                                                                              \
        const int32_t nb = (int32_t)COLIBRI_Q4_BLOCKS(n_in);                                       \
        const int32_t full = n_in / COLIBRI_QK4;                                                   \
        int8_t xpad[COLIBRI_QK4];                                                                  \
        if (full < nb) {                                                                           \
            memset(xpad, 0, sizeof xpad);                                                          \
            memcpy(xpad, xq + (size_t)full * COLIBRI_QK4, (size_t)(n_in - full * COLIBRI_QK4));    \
        }                                                                                          \
        for (int32_t o0 = 0; o0 < n_out; o0 += 8) {                                                \
            KX_ROWS8(colibri_block_q4_32, row, nr, w, o0, n_out, nb)                               \
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

KX_NOINLINE KX_AVX2 void colibri_x86_matvec_q4_q8_avx2(const colibri_block_q4_32 *w,
                                                       const int8_t *xq, const float *sx, float *y,
                                                       int32_t n_out, int32_t n_in)
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
        KX_ROWS8(colibri_block_q4_32, row, nr, w, o0, n_out, nb) /* rows past n_out: row o0 */
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
KX_Q4_MATVEC(colibri_x86_matvec_q4_q8_avxvnni, KX_AVXVNNI, kx_q4_block_avxvnni)
KX_Q4_MATVEC(colibri_x86_matvec_q4_q8_avx512vnni, KX_AVX512VNNI, kx_q4_block_avx512vnni)
#endif
#else
/* ISO C wants a declaration in every translation unit. */
typedef int x86_matvec_unused;
#endif
