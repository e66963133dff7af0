/**
 * @file transformer_ops.c
 * @brief Portable fp32 transformer operators (colibri_transformer.h): RMSNorm, linear, RoPE,
 *        causal GQA attention over a static KV cache, SwiGLU (the token sampler is in
 *        sample.c). No heap, no static state: everything lives in caller memory.
 */
#include "colibri_math.h"
#include "colibri_quant.h"
#include "colibri_transformer.h"

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* 1 / rms(x) when the sum of squares overflowed fp32: the same sum over x * 2^-e, where 2^e is
 * max |x| rounded up to a power of two (an exact scaling), so no square overflows; the result is
 * 2^-e / sqrt(ss' / n + eps 2^-2e). NaN when x holds NaN or Inf (as the plain sum gives). */
static float rmsnorm_inv_scaled(const float *x, int32_t n, float eps)
{
    float m = 0.0f;
    for (int32_t i = 0; i < n; i++) {
        const float a = fabsf(x[i]);
        if (!(a <= FLT_MAX)) {
            return NAN;
        }
        m = a > m ? a : m;
    }
    int e = 0;
    (void)frexpf(m, &e); /* m < 2^e */
    const float s = ldexpf(1.0f, -e);
    float ss = 0.0f;
    for (int32_t i = 0; i < n; i++) {
        const float v = x[i] * s;
        ss += v * v;
    }
    return s / sqrtf(ss / (float)n + eps * s * s);
}

/* y = w * (x * inv), inv from the row's sum of squares ss. A sum past FLT_MAX (activations
 * above about 1.8e19) is redone scaled: 1 / sqrt(Inf) would make the whole row 0 without a
 * trace. */
static void rmsnorm_apply(const float *x, const float *w, float *y, int32_t n, float eps, float ss)
{
    const float inv =
        (ss <= FLT_MAX) ? 1.0f / sqrtf(ss / (float)n + eps) : rmsnorm_inv_scaled(x, n, eps);
    for (int32_t i = 0; i < n; i++) {
        y[i] = w[i] * (x[i] * inv);
    }
}

void colibri_rmsnorm_f32(const float *x, const float *w, float *y, int32_t n, float eps)
{
    float ss = 0.0f;
    for (int32_t i = 0; i < n; i++) {
        ss += x[i] * x[i];
    }
    rmsnorm_apply(x, w, y, n, eps, ss);
}

/* Four rows' sums of squares side by side: each row's sum is still one chain of adds in
 * ascending i (colibri_rmsnorm_f32's bits), but four chains overlap where one row waited on
 * each add's latency (a 1024-wide row: 1,024 dependent adds). */
void colibri_rmsnorm_rows_f32(const float *x, const float *w, float *y, int32_t n_rows, int32_t n,
                              size_t stride, float eps)
{
    int32_t r = 0;
    for (; r + 4 <= n_rows; r += 4) {
        const float *x0 = x + (size_t)r * stride;
        const float *x1 = x0 + stride;
        const float *x2 = x1 + stride;
        const float *x3 = x2 + stride;
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
        for (int32_t i = 0; i < n; i++) {
            s0 += x0[i] * x0[i];
            s1 += x1[i] * x1[i];
            s2 += x2[i] * x2[i];
            s3 += x3[i] * x3[i];
        }
        float *y0 = y + (size_t)r * stride;
        rmsnorm_apply(x0, w, y0, n, eps, s0);
        rmsnorm_apply(x1, w, y0 + stride, n, eps, s1);
        rmsnorm_apply(x2, w, y0 + 2u * stride, n, eps, s2);
        rmsnorm_apply(x3, w, y0 + 3u * stride, n, eps, s3);
    }
    for (; r < n_rows; r++) {
        colibri_rmsnorm_f32(x + (size_t)r * stride, w, y + (size_t)r * stride, n, eps);
    }
}

void colibri_linear_f32(const float *x, const float *w, const float *b, float *y, int32_t n_in,
                        int32_t n_out)
{
    /* colibri_matvec_f32 (kernels_q.c, per-ISA paths): acc += w * x in i order, then + b */
    colibri_matvec_f32(w, x, y, n_out, n_in);
    if (b != NULL) {
        for (int32_t o = 0; o < n_out; o++) {
            y[o] = y[o] + b[o];
        }
    }
}

void colibri_clip_f32(float *x, int32_t n, float limit)
{
    for (int32_t i = 0; i < n; i++) {
        if (x[i] > limit) {
            x[i] = limit;
        } else if (x[i] < -limit) {
            x[i] = -limit;
        }
    }
}

void colibri_rope_f32(float *x, int32_t n_heads, int32_t head_dim, const float *cos,
                      const float *sin)
{
    const int32_t half = head_dim / 2;
    for (int32_t h = 0; h < n_heads; h++) {
        float *r = x + (size_t)h * (size_t)head_dim;
        for (int32_t i = 0; i < half; i++) {
            const float a = r[i];
            const float b = r[i + half];
            r[i] = a * cos[i] - b * sin[i];
            r[i + half] = b * cos[i] + a * sin[i];
        }
    }
}

colibri_status colibri_attention_f32(const colibri_attention_shape_t *shape, int32_t pos,
                                     const float *q, const float *k, const float *v, float *k_cache,
                                     float *v_cache, float *scores, float *out)
{
    const int32_t hd = shape->head_dim;
    const int32_t ctx = shape->max_context;
    if (pos < 0 || pos >= ctx) {
        return COLIBRI_ERR_NOMEM; /* context overflow: the cache has no row for pos */
    }
    for (int32_t g = 0; g < shape->n_kv_heads; g++) {
        float *kc = k_cache + ((size_t)g * (size_t)ctx + (size_t)pos) * (size_t)hd;
        float *vc = v_cache + ((size_t)g * (size_t)ctx + (size_t)pos) * (size_t)hd;
        for (int32_t i = 0; i < hd; i++) {
            kc[i] = k[(size_t)g * (size_t)hd + (size_t)i];
            vc[i] = v[(size_t)g * (size_t)hd + (size_t)i];
        }
    }
    const int32_t first =
        (shape->window > 0 && pos - shape->window + 1 > 0) ? pos - shape->window + 1 : 0;
    const int32_t group = shape->n_heads / shape->n_kv_heads;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int32_t h = 0; h < shape->n_heads; h++) {
        const float *qh = q + (size_t)h * (size_t)hd;
        const size_t base = (size_t)(h / group) * (size_t)ctx;
        float max = -INFINITY;
        /* q . k_t for every t: each a sum in ascending i from 0.0f (colibri_matvec_f32's bits on
         * every kernel path), the positions side by side in SIMD lanes where the CPU has them */
        colibri_matvec_f32(k_cache + (base + (size_t)first) * (size_t)hd, qh, scores + first,
                           pos - first + 1, hd);
        for (int32_t t = first; t <= pos; t++) {
            scores[t] = scores[t] * scale;
            max = scores[t] > max ? scores[t] : max;
        }
        /* the numerators side by side where the CPU has lanes, their sum in ascending t */
        colibri_exp_shift_f32(scores + first, (size_t)(pos - first + 1), max);
        float sum = 0.0f;
        for (int32_t t = first; t <= pos; t++) {
            sum += scores[t];
        }
        colibri_wsum_f32(out + (size_t)h * (size_t)hd, scores + first, sum,
                         v_cache + (base + (size_t)first) * (size_t)hd, (size_t)hd, pos - first + 1,
                         hd);
    }
    return COLIBRI_OK;
}

void colibri_swiglu_f32(const float *x, const float *w_gate, const float *w_up, const float *w_down,
                        float *y, int32_t d, int32_t f, float *scratch)
{
    float *g = scratch;
    float *u = scratch + f;
    colibri_linear_f32(x, w_gate, NULL, g, d, f);
    colibri_linear_f32(x, w_up, NULL, u, d, f);
    colibri_silu_mul_f32(g, u, (size_t)f);
    colibri_linear_f32(g, w_down, NULL, y, f, d);
}
