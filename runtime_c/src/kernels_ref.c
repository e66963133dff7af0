/**
 * @file kernels_ref.c
 * @brief The portable fp32 expert FFN (the reference every optimised kernel is compared with)
 *        and the activations. Rows are computed independently, so a token's result does not
 *        depend on how many tokens share the call.
 */
#include "colibri.h"
#include "colibri_internal.h"
#include "colibri_math.h"
#include "colibri_quant.h"
#include "kernels_x86.h"

#include <stddef.h>

static float act_gelu(float x)
{
    return colibri_gelu(x);
}

static float act_gelu_tanh(float x)
{
    return colibri_gelu_tanh(x);
}

static float act_silu(float x)
{
    return colibri_silu(x);
}

static float act_relu(float x)
{
    return x > 0.0f ? x : 0.0f;
}

static void apply_activation(colibri_activation act, float *h, size_t n)
{
    switch (act) {
    case COLIBRI_ACT_GELU_TANH:
        for (size_t j = 0; j < n; j++) {
            h[j] = act_gelu_tanh(h[j]);
        }
        break;
    case COLIBRI_ACT_SILU:
        for (size_t j = 0; j < n; j++) {
            h[j] = act_silu(h[j]);
        }
        break;
    case COLIBRI_ACT_RELU:
        for (size_t j = 0; j < n; j++) {
            h[j] = act_relu(h[j]);
        }
        break;
    case COLIBRI_ACT_GELU:
    default:
        for (size_t j = 0; j < n; j++) {
            h[j] = act_gelu(h[j]);
        }
        break;
    }
}

/* out[j] = bias[j] (or 0) + sum_i x[i] * w[i*cols + j]; i outer, j inner (row-major w). */
static void vec_mat(const float *x, const float *w, const float *bias, float *out, size_t rows,
                    size_t cols)
{
    for (size_t j = 0; j < cols; j++) {
        out[j] = (bias != NULL) ? bias[j] : 0.0f;
    }
    for (size_t i = 0; i < rows; i++) {
        const float xi = x[i];
        const float *wrow = w + i * cols;
#if defined(COLIBRI_X86_DISPATCH)
        /* out += xi * row i: the CPUID-dispatched colibri_axpy_f32 (the same bits) */
        colibri_axpy_f32(out, xi, wrow, (int32_t)cols);
#else
        for (size_t j = 0; j < cols; j++) { /* inline on the MCUs: no call, no extra code */
            out[j] += xi * wrow[j];
        }
#endif
    }
}

void colibri_expert_ffn_f32(const colibri_model_t *model, const colibri_expert_weights_t *w,
                            const float *x, float *y, int32_t n, float *scratch)
{
    const size_t d = (size_t)model->d_model;
    const size_t f = (size_t)model->d_ff;
    const int gated = (model->flags & COLIBRI_FLAG_GATED) != 0;

    for (int32_t r = 0; r < n; r++) {
        const float *xr = x + (size_t)r * d;
        float *yr = y + (size_t)r * d;
        float *h = scratch + (size_t)r * f;
        vec_mat(xr, w->w1, w->b1, h, d, f);
        if (gated) {
            float *u = scratch + (size_t)n * f + (size_t)r * f;
            vec_mat(xr, w->w3, NULL, u, d, f);
            for (size_t j = 0; j < f; j++) {
                h[j] = act_silu(h[j]) * u[j];
            }
        } else {
            apply_activation(model->activation, h, f);
        }
        vec_mat(h, w->w2, w->b2, yr, f, d);
    }
}
