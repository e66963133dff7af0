/**
 * @file x86_float.c
 * @brief x86-64 AVX2 float kernels (every level above base): the fp32 / fp16 matvecs (eight rows
 * per register, each lane in i order), SiLU-times-gate, axpy and argmax.
 */
#include "x86_internal.h"

#if defined(COLIBRI_X86_DISPATCH)

/* -- fp32 and fp16 weights x fp32: eight rows per register, each lane in i order ------------- */

/* Rows beyond n_out read row 0 of the group again (valid memory); their lanes are not stored. */
/* Eight rows at a time, their sums side by side in one register; each row's sum is one chain
 * of adds in ascending i (the scalar code's order), so two groups of eight run interleaved
 * while both exist: one group alone waits on its chain (n_in adds of 3-4 cycles each), e.g.
 * the attention's q . k over 64 positions of 64 values took 440 ns a head. */
#define KX_FLOAT_ROWS8_STEP(WTYPE, row, i, acc, LOAD8)                                             \
    do {                                                                                           \
        __m256 c_[8];                                                                              \
        KX_UNROLL for (int32_t r_ = 0; r_ < 8; r_++)                                               \
        {                                                                                          \
            c_[r_] = LOAD8(row[r_] + (i));                                                         \
        }                                                                                          \
        kx_transpose8(c_);                                                                         \
        KX_UNROLL for (int32_t j_ = 0; j_ < 8; j_++)                                               \
        {                                                                                          \
            acc = _mm256_add_ps(acc, _mm256_mul_ps(c_[j_], _mm256_set1_ps(x[(i) + j_])));          \
        }                                                                                          \
    } while (0)
#define KX_FLOAT_ROWS8_TAIL(row, i, acc, SCALAR)                                                   \
    for (; (i) < n_in; (i)++) {                                                                    \
        const __m256 c_ = _mm256_setr_ps(SCALAR(row[0][i]), SCALAR(row[1][i]), SCALAR(row[2][i]),  \
                                         SCALAR(row[3][i]), SCALAR(row[4][i]), SCALAR(row[5][i]),  \
                                         SCALAR(row[6][i]), SCALAR(row[7][i]));                    \
        acc = _mm256_add_ps(acc, _mm256_mul_ps(c_, _mm256_set1_ps(x[i])));                         \
    }
#define KX_FLOAT_MATVEC(NAME, TARGET, WTYPE, LOAD8, SCALAR)                                        \
    TARGET void NAME(const WTYPE *w, const float *x, float *y, int32_t n_out, int32_t n_in)        \
    {                                                                                              \
        int32_t o0 = 0;                                                                            \
        for (; o0 + 16 <= n_out; o0 += 16) {                                                       \
            KX_ROWS8(WTYPE, row, nr, w, o0, n_out, n_in)                                           \
            KX_ROWS8(WTYPE, rowb, nrb, w, o0 + 8, n_out, n_in)                                     \
            __m256 acc = _mm256_setzero_ps();                                                      \
            __m256 accb = _mm256_setzero_ps();                                                     \
            int32_t i = 0;                                                                         \
            for (; i + 8 <= n_in; i += 8) {                                                        \
                KX_FLOAT_ROWS8_STEP(WTYPE, row, i, acc, LOAD8);                                    \
                KX_FLOAT_ROWS8_STEP(WTYPE, rowb, i, accb, LOAD8);                                  \
            }                                                                                      \
            int32_t ib = i;                                                                        \
            KX_FLOAT_ROWS8_TAIL(row, i, acc, SCALAR)                                               \
            KX_FLOAT_ROWS8_TAIL(rowb, ib, accb, SCALAR)                                            \
            kx_store_rows(y + o0, acc, nr);                                                        \
            kx_store_rows(y + o0 + 8, accb, nrb);                                                  \
        }                                                                                          \
        for (; o0 < n_out; o0 += 8) {                                                              \
            KX_ROWS8(WTYPE, row, nr, w, o0, n_out, n_in)                                           \
            __m256 acc = _mm256_setzero_ps();                                                      \
            int32_t i = 0;                                                                         \
            for (; i + 8 <= n_in; i += 8) {                                                        \
                KX_FLOAT_ROWS8_STEP(WTYPE, row, i, acc, LOAD8);                                    \
            }                                                                                      \
            KX_FLOAT_ROWS8_TAIL(row, i, acc, SCALAR)                                               \
            kx_store_rows(y + o0, acc, nr);                                                        \
        }                                                                                          \
    }

#define KX_LOAD_F32(p) _mm256_loadu_ps(p)
#define KX_LOAD_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p)))
#define KX_SCALAR_F32(v) (v)
#define KX_SCALAR_F16(v) colibri_f16_to_f32(v)

KX_FLOAT_MATVEC(colibri_x86_matvec_f32_avx2, KX_AVX2, float, KX_LOAD_F32, KX_SCALAR_F32)

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

KX_AVX2 void colibri_x86_silu_mul_f32_avx2(float *h, const float *g, size_t n)
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

KX_AVX2 void colibri_x86_exp_shift_f32_avx2(float *x, size_t n, float m)
{
    const __m256 mv = _mm256_set1_ps(m);
    size_t j = 0;
    for (; j + 8u <= n; j += 8u) {
        _mm256_storeu_ps(x + j, kx_expf8(_mm256_sub_ps(_mm256_loadu_ps(x + j), mv)));
    }
    for (; j < n; ++j) {
        x[j] = colibri_expf(x[j] - m);
    }
}

/* Two passes over x (in cache for a vocabulary of logits): the largest value and whether any
 * is NaN / infinite (exponent all ones), then the first index holding it. */
KX_AVX2 int32_t colibri_x86_argmax_f32_avx2(const float *x, int32_t n)
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

KX_AVX2 void colibri_x86_axpy_f32_avx2(float *y, float a, const float *x, int32_t n)
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

/* colibri_topk_f32's scan (the sampler's top-k over a vocabulary): 32 values a step, their max
 * against thr; a NaN never counts as above (it never enters the selection either). */
KX_AVX2 int32_t colibri_x86_first_above_f32_avx2(const float *x, int32_t n, float thr)
{
    const __m256 t = _mm256_set1_ps(thr);
    int32_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m256 m =
            _mm256_max_ps(_mm256_max_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(x + i + 8)),
                          _mm256_max_ps(_mm256_loadu_ps(x + i + 16), _mm256_loadu_ps(x + i + 24)));
        if (_mm256_movemask_ps(_mm256_cmp_ps(m, t, _CMP_GT_OQ)) != 0) {
            return i;
        }
    }
    return i;
}

/* colibri_wsum_f32: 64 (then 8) of the d sums in registers across all n rows, each the
 * scalar code's steps (a = w[t] / sum, out + a * v, from 0.0f, t in order); the last d % 8 as
 * the scalar code. Per row the scalar code ran one colibri_axpy_f32 call (through the dispatch
 * table), reading and writing the sums each time. */
KX_AVX2 void colibri_x86_wsum_f32_avx2(float *out, const float *w, float sum, const float *v,
                                       size_t stride, int32_t n, int32_t d)
{
    int32_t i0 = 0;
    for (; i0 + 64 <= d; i0 += 64) {
        __m256 acc[8];
        KX_UNROLL for (int k = 0; k < 8; k++)
        {
            acc[k] = _mm256_setzero_ps();
        }
        for (int32_t t = 0; t < n; t++) {
            const __m256 a = _mm256_set1_ps(w[t] / sum);
            const float *vt = v + (size_t)t * stride + (size_t)i0;
            KX_UNROLL for (int k = 0; k < 8; k++)
            {
                acc[k] = _mm256_add_ps(acc[k], _mm256_mul_ps(a, _mm256_loadu_ps(vt + 8 * k)));
            }
        }
        KX_UNROLL for (int k = 0; k < 8; k++)
        {
            _mm256_storeu_ps(out + i0 + 8 * k, acc[k]);
        }
    }
    for (; i0 + 8 <= d; i0 += 8) {
        __m256 acc = _mm256_setzero_ps();
        for (int32_t t = 0; t < n; t++) {
            acc = _mm256_add_ps(
                acc, _mm256_mul_ps(_mm256_set1_ps(w[t] / sum),
                                   _mm256_loadu_ps(v + (size_t)t * stride + (size_t)i0)));
        }
        _mm256_storeu_ps(out + i0, acc);
    }
    for (; i0 < d; i0++) {
        float s = 0.0f;
        for (int32_t t = 0; t < n; t++) {
            s += (w[t] / sum) * v[(size_t)t * stride + (size_t)i0];
        }
        out[i0] = s;
    }
}

KX_FLOAT_MATVEC(colibri_x86_matvec_f16_f32_avx2, KX_AVX2, uint16_t, KX_LOAD_F16, KX_SCALAR_F16)
#else
/* ISO C wants a declaration in every translation unit. */
typedef int x86_float_unused;
#endif
