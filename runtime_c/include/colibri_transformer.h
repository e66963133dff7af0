/**
 * @file colibri_transformer.h
 * @brief Dense operators of a decoder-only transformer around the MoE runtime (colibri.h):
 *        RMSNorm, linear layers, rotary embeddings, causal grouped-query attention over a KV
 *        cache, the SwiGLU MLP (Qwen2-MoE's shared expert, dense layers) and token sampling
 *        (greedy, seeded temperature / top-k / top-p).
 *
 * Every function works on caller memory (the generated model's static arena); none allocates,
 * none keeps state except the RNG the caller owns. Weights of linear layers are stored one
 * row per output: w[n_out][n_in] (the Hugging Face layout).
 */
#ifndef COLIBRI_TRANSFORMER_H
#define COLIBRI_TRANSFORMER_H

#include <stddef.h>
#include <stdint.h>

#include "colibri.h"

#ifdef __cplusplus
extern "C" {
#endif

/** @brief y[n] = w * x / sqrt(mean(x^2) + eps); y may alias x. */
void colibri_rmsnorm_f32(const float *x, const float *w, float *y, int32_t n, float eps);

/** @brief y[n_out] = w[n_out][n_in] x[n_in] (+ b[n_out] when b != NULL); y must not alias x. */
void colibri_linear_f32(const float *x, const float *w, const float *b, float *y, int32_t n_in,
                        int32_t n_out);

/** @brief Clamp every x[i] to [-limit, limit] (OLMoE's clip_qkv). */
void colibri_clip_f32(float *x, int32_t n, float limit);

/**
 * @brief Rotary embedding in the rotate-half layout, in place, on n_heads rows of head_dim:
 *        x[i] = x[i] cos[i] - x[i + half] sin[i], x[i + half] = x[i + half] cos[i] + x[i] sin[i]
 *        for i < half = head_dim / 2; cos/sin hold the position's half angles.
 */
void colibri_rope_f32(float *x, int32_t n_heads, int32_t head_dim, const float *cos,
                      const float *sin);

/** Shape of a causal grouped-query attention with a static KV cache. */
typedef struct {
    int32_t n_heads;     /**< query heads */
    int32_t n_kv_heads;  /**< key/value heads (divides n_heads) */
    int32_t head_dim;    /**< dimension of one head */
    int32_t max_context; /**< positions the cache holds */
    int32_t window;      /**< sliding window (keys at pos - window + 1 ..), 0 = none */
} colibri_attention_shape_t;

/**
 * @brief Attention of one query token at position pos: stores k, v (after RoPE) into the cache
 *        at pos, then out[h] = softmax(q[h] K^T / sqrt(head_dim)) V over keys 0..pos of head h's
 *        key/value group.
 * @param q       [n_heads][head_dim]
 * @param k, v    [n_kv_heads][head_dim] of this token
 * @param k_cache [n_kv_heads][max_context][head_dim], v_cache likewise
 * @param scores  workspace of max_context floats
 * @param out     [n_heads][head_dim]
 * @return COLIBRI_ERR_NOMEM when pos is outside the cache (context overflow), else COLIBRI_OK.
 */
colibri_status colibri_attention_f32(const colibri_attention_shape_t *shape, int32_t pos,
                                     const float *q, const float *k, const float *v, float *k_cache,
                                     float *v_cache, float *scores, float *out);

/**
 * @brief SwiGLU MLP y[d] = w_down (silu(w_gate x) * (w_up x)), weights [f][d], [f][d], [d][f].
 * @param scratch 2 * f floats
 */
void colibri_swiglu_f32(const float *x, const float *w_gate, const float *w_up, const float *w_down,
                        float *y, int32_t d, int32_t f, float *scratch);

/** @brief Random generator of the sampler (xorshift64); seed with colibri_rng_seed. */
typedef struct {
    uint64_t state;
} colibri_rng_t;

/** @brief Seed the generator (any seed, 0 included, gives a valid non-zero state). */
void colibri_rng_seed(colibri_rng_t *rng, uint64_t seed);

/** @brief A uniform float in [0, 1) (24 random bits). */
float colibri_rng_uniform(colibri_rng_t *rng);

/** Sampling options: temperature 0 = greedy; top_k 0 = all tokens; top_p 1 = no cut. */
typedef struct {
    float temperature;
    int32_t top_k;
    float top_p;
} colibri_sampler_t;

/** @brief Bytes of the workspace colibri_sample needs for a vocabulary of n tokens. */
#define COLIBRI_SAMPLE_WORKSPACE_BYTES(N) (COLIBRI_ALIGN16(4u * (size_t)(N)) * 2u)

/**
 * @brief The next token from logits[n]: greedy (argmax, ties to the lower id) when temperature
 *        is 0, else softmax(logits / temperature) restricted to the top_k best tokens and to
 *        the smallest prefix (best first) whose probability reaches top_p, drawn with rng.
 * @param workspace COLIBRI_SAMPLE_WORKSPACE_BYTES(n) bytes, 4-byte aligned
 * @return COLIBRI_ERR_ARG for bad options, COLIBRI_ERR_NAN for non-finite logits.
 */
colibri_status colibri_sample(const float *logits, int32_t n, const colibri_sampler_t *sampler,
                              colibri_rng_t *rng, void *workspace, int32_t *out_token);

#ifdef __cplusplus
}
#endif

#endif /* COLIBRI_TRANSFORMER_H */
