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

/** @brief colibri_rmsnorm_f32 of n_rows rows of n, stride floats apart in x and in y (the same
 *         bits row by row, several rows' sums interleaved); y may alias x. */
void colibri_rmsnorm_rows_f32(const float *x, const float *w, float *y, int32_t n_rows, int32_t n,
                              size_t stride, float eps);

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

/* -- the decoder step ---------------------------------------------------------------------
 * One implementation of a whole decoder-only transformer's token step (runtime_c/tiles/
 * colibri_tf_step.h: static inline; tf_step.c makes the functions below of it), run by both
 * the generated model (compiled in, over a static const colibri_tf_model_t of its const tables
 * and its arena) and the model-file runtime (colibri_lm.h: a view of the mmapped container).
 * Each runs the same loop of step functions: colibri_tf_embed, then per layer
 * colibri_tf_attention, its own
 * MoE block / dense MLP into proj (and shared) from h, colibri_tf_ffn_residual; at the end
 * colibri_tf_logits. What differs is only that FFN (the generated per-expert kernels, or the
 * container's matrices and expert cache), the matrix product (colibri_tf_model_t.mat_rows: the
 * generic colibri_tf_mat_rows, or the generated model's, which links only its schemes'
 * kernels) and, optionally, a parallel-for of the linear layers and of the attention
 * (colibri_tf_hooks_t: the container's thread pool; NULL on MCUs, where every call is
 * direct). No allocation: every buffer is the caller's. */

/** A stored matrix W [n_out][n_in] (one row per output) in a colibri_quant_scheme. */
typedef struct {
    int32_t scheme;      /**< colibri_quant_scheme: F32, F16, Q8, Q4, Q4K or Q5K */
    int32_t blocked;     /**< Q8: one scale per block of 32 inputs (colibri_matvec_q8b_*) */
    int32_t n_out, n_in; /**< rows, columns */
    const void *w;       /**< values / codes (Q4: colibri_block_q4_32 rows) */
    const float *scale;  /**< Q8 scales; NULL otherwise */
    const void *packed;  /**< NULL, or a packed copy (colibri_pack_matrices, kernels_x86.h) */
    int32_t pack_kind;   /**< COLIBRI_PACK_* of packed */
} colibri_tf_mat_t;

/* -- Packed copies (hosts only) ------------------------------------------------------------- */

/** Kinds of packed copy: an int8 matrix with a scale per row (PACK_Q8: colibri_matvec_q8_q8's),
 *  per row and block of 32 inputs (PACK_Q8B: colibri_matvec_q8b_q8's), or int4 blocks
 *  (PACK_Q4: colibri_matvec_q4_q8's), all against int8 activation rows. */
enum { COLIBRI_PACK_Q8 = 0, COLIBRI_PACK_Q8B = 1, COLIBRI_PACK_Q4 = 2 };

/** One matrix to pack (colibri_pack_matrices): what it is, and where its copy goes. */
typedef struct {
    int32_t kind;        /**< COLIBRI_PACK_* */
    int32_t n_out, n_in; /**< rows, columns */
    const void *w;       /**< int8 codes [n_out][n_in] or int4 blocks (colibri_block_q4_32) */
    const float *scale;  /**< PACK_Q8B: the block scales (needed to pack); else unused */
    const void **packed; /**< out: *packed = the copy, or NULL (not packed); NULL: not written */
} colibri_pack_item_t;

/**
 * @brief Copy the matrices the CPU has packed kernels for (x86-64 with AVX-512 VNNI, chosen by
 *        CPUID; shapes with n_out >= 16 and n_in a multiple of 32) into the layout of those
 *        kernels, in one allocation (2 MiB aligned, huge pages where the kernel gives them), for
 *        a host that runs a generated model (the model-file runtime does the same at load,
 *        lm_pack.c). Every other item gets *packed = NULL and keeps its plain kernel; on any
 *        other CPU or build (MCUs), or with COLIBRI_LM_PACK=0 in the environment (as the
 *        model-file runtime), nothing is allocated and every *packed is NULL. Hosts only:
 *        it allocates (aligned_alloc); an MCU build never calls it.
 * @param items        the matrices; each item's packed pointer is written
 * @param drop_originals 1: the pages wholly inside each packed original leave the resident set
 *        (madvise MADV_DONTNEED); only for const weights in a file-backed mapping (a generated
 *        model's .rodata), which come back from the file if read again; 0: left alone
 * @param block        out: the allocation (NULL when nothing packs), for colibri_pack_free
 * @param bytes        out: its size in bytes (0 when nothing packs)
 * @return COLIBRI_ERR_ARG for NULL block / bytes or n < 0, COLIBRI_ERR_NOMEM when it cannot
 *         allocate (every *packed NULL: the plain kernels run), else COLIBRI_OK.
 */
colibri_status colibri_pack_matrices(colibri_pack_item_t *items, int32_t n, int32_t drop_originals,
                                     void **block, size_t *bytes);

/** @brief Free colibri_pack_matrices' block (NULL: nothing). The packed pointers it handed out
 *         are dangling afterwards: reset them (to NULL) before the next matrix product. */
void colibri_pack_free(void *block);

/**
 * @brief Rows [r0, r1) (r0 a multiple of 16) of W x for n_tok int8 activation rows (xq / sx as
 *        colibri_matmul_q8_q8's) from a packed copy of colibri_pack_matrices: output row t at
 *        y + t * ldy, y and rscale (PACK_Q8: the matrix's per-row scales; else unused) at row
 *        r0. Every value has the bits colibri_matvec_q8_q8 / _q8b_q8 / _q4_q8 gives it.
 */
void colibri_matmul_packed(int32_t kind, const void *packed, const float *rscale, int32_t n_out,
                           int32_t n_in, int32_t r0, int32_t r1, const int8_t *xq, const float *sx,
                           float *y, int32_t ldy, int32_t n_tok);

/** @brief colibri_tf_mat_t initialisers for the generated model's const tables: an fp32, fp16,
 *         int4 (colibri_block_q4_32 rows), q4k or q5k (COLIBRI_Q4K / Q5K_BYTES: one stream of
 * super-blocks) matrix w_ [o_][i_], or an int8 one whose generated struct *s_ holds the codes q and
 * one scale per block of 32 inputs. */
#define COLIBRI_TF_MAT_F32(w_, o_, i_)                                                             \
    {                                                                                              \
        .scheme = COLIBRI_QUANT_F32, .n_out = (o_), .n_in = (i_), .w = (w_)                        \
    }
#define COLIBRI_TF_MAT_F16(w_, o_, i_)                                                             \
    {                                                                                              \
        .scheme = COLIBRI_QUANT_F16, .n_out = (o_), .n_in = (i_), .w = (w_)                        \
    }
#define COLIBRI_TF_MAT_Q4(w_, o_, i_)                                                              \
    {                                                                                              \
        .scheme = COLIBRI_QUANT_Q4, .n_out = (o_), .n_in = (i_), .w = (w_)                         \
    }
#define COLIBRI_TF_MAT_Q4K(w_, o_, i_)                                                             \
    {                                                                                              \
        .scheme = COLIBRI_QUANT_Q4K, .n_out = (o_), .n_in = (i_), .w = (w_)                        \
    }
#define COLIBRI_TF_MAT_Q5K(w_, o_, i_)                                                             \
    {                                                                                              \
        .scheme = COLIBRI_QUANT_Q5K, .n_out = (o_), .n_in = (i_), .w = (w_)                        \
    }
#define COLIBRI_TF_MAT_Q8B(s_, o_, i_)                                                             \
    {                                                                                              \
        .scheme = COLIBRI_QUANT_Q8, .blocked = 1, .n_out = (o_), .n_in = (i_), .w = (s_)->q,       \
        .scale = (s_)->scale                                                                       \
    }

/**
 * @brief Rows [r0, r1) of y = W x (+ b) for n_tok activation rows of m->n_in values (x fp32;
 *        xq / sx their int8 rows when act == 1), output row t at y + t * ldy. Every output is
 *        what the one-token kernel (colibri_matvec_*, colibri_linear_f32) gives it, so it does
 *        not depend on the row split nor on n_tok. r0: a multiple of 32 when m->packed is set,
 *        of COLIBRI_KQ_GROUP_ROWS(m->n_in) for q4k / q5k (a row that starts a super-block).
 *        Every scheme, so it links every kernel: what the model-file runtime runs. A generated
 *        model runs its own colibri_tf_mat_rows_fn instead, with only the kernels it calls.
 * @return COLIBRI_ERR_UNSUPPORTED for a scheme it does not know or a q4k / q5k r0 that does
 *         not start a super-block (nothing written), else COLIBRI_OK.
 */
colibri_status colibri_tf_mat_rows(const colibri_tf_mat_t *m, int32_t act, const float *b,
                                   const float *x, const int8_t *xq, const float *sx, float *y,
                                   int32_t ldy, int32_t r0, int32_t r1, int32_t n_tok);

/** The matrix product the step runs (colibri_tf_model_t.mat_rows): colibri_tf_mat_rows's
 *  contract, for the (scheme, blocked, act) combinations it handles; any other gets
 *  COLIBRI_ERR_UNSUPPORTED (nothing written), never a wrong result. */
typedef colibri_status (*colibri_tf_mat_rows_fn)(const colibri_tf_mat_t *m, int32_t act,
                                                 const float *b, const float *x, const int8_t *xq,
                                                 const float *sx, float *y, int32_t ldy, int32_t r0,
                                                 int32_t r1, int32_t n_tok);

/** @brief Quantise n rows of n_in floats to int8 rows (codes stride n_in, scales stride
 *         COLIBRI_Q8_BLOCKS(n_in)): colibri_quantize_row_q8 on each. */
void colibri_tf_quantize_rows(const float *x, int8_t *xq, float *sx, int32_t n_in, int32_t n);

/**
 * @brief SwiGLU of n rows, y = w[1] (silu(w[0] x) * (w[2] x)), matrices in any scheme, on the
 *        calling thread (act 1: int8 activations, quantised here), by colibri_tf_mat_rows.
 * @param hh 2 * n * w[0].n_out floats; xq / sx n int8 rows of max(d, d_ff) (act 1)
 * @return colibri_tf_mat_rows's status.
 */
colibri_status colibri_tf_swiglu_rows(const colibri_tf_mat_t *w, int32_t act, const float *x,
                                      float *y, int32_t n, float *hh, int8_t *xq, float *sx);

/** Up to three matrices over the same n_tok input rows (int8 rows xq / sx when act == 1),
 *  each run by mat_rows (the model's). */
typedef struct {
    colibri_tf_mat_rows_fn mat_rows;
    const colibri_tf_mat_t *m[3];
    const float *b[3]; /**< biases or NULL */
    float *y[3];       /**< outputs [n_tok][m[i]->n_out] */
    int32_t n_mats, act, n_tok;
    const float *x;
    const int8_t *xq;
    const float *sx;
} colibri_tf_lin_t;

/** Weights of one decoder layer as the step reads them (NULL: absent). */
typedef struct {
    const float *input_norm, *post_norm;
    colibri_tf_mat_t wq, wk, wv, wo;
    const float *bq, *bk, *bv, *bo;
    const float *q_norm, *k_norm; /**< QK-norm over the whole q / k projections */
    int32_t is_moe;               /**< routed MoE block (hooks->moe), else a dense MLP */
    int32_t ffn_d_ff;             /**< dense MLP / shared expert width (hooks->mlp), 0: none */
    const float *shared_gate;     /**< [d_model]: sigmoid(x . g) scales the shared expert */
} colibri_tf_layer_t;

/** A parallel-for of the container's thread pool (ctx: the model's); NULL: one thread. */
typedef struct {
    /** The matrices of a colibri_tf_lin_t (job->mat_rows on rows split as it likes); NULL:
     *  all rows of each on the calling thread. */
    colibri_status (*linear)(void *ctx, const colibri_tf_lin_t *job);
    /** Attention of rows q / k / v [n] at pos0 .. (written to kc / vc); NULL: one thread. */
    colibri_status (*attend)(void *ctx, const colibri_attention_shape_t *shape, float *kc,
                             float *vc, int32_t pos0, int32_t n);
} colibri_tf_hooks_t;

/** A whole decoder-only model for the step functions: dims, weights and buffers. */
typedef struct {
    int32_t n_layers, vocab, d_model, n_heads, n_kv_heads, head_dim, max_context;
    int32_t window;  /**< sliding window, 0 = none */
    int32_t clip_on; /**< clamp q / k / v to [-clip, clip] */
    float eps, clip;
    colibri_tf_mat_t embed, lm_head;
    const float *final_norm;
    const float *rope_cos, *rope_sin; /**< [max_context][head_dim / 2] */
    const colibri_tf_layer_t *layers; /**< layer l at (char *)layers + l * layer_stride */
    size_t layer_stride;
    /* buffers of `rows` token rows each ([rows][n]); the generated model has one row */
    float *x, *h, *q, *k, *v, *att, *proj, *shared;
    float *kv;                       /**< [n_layers][2][n_kv_heads][max_context][head_dim] */
    float *scores;                   /**< [max_context] (hooks->attend NULL) */
    float *logits;                   /**< [vocab] */
    int8_t *xq;                      /**< [rows][max(d_model, n_heads * head_dim)] (int8 act) */
    float *sxq;                      /**< their scales */
    const colibri_tf_hooks_t *hooks; /**< NULL: everything on the calling thread */
    void *ctx;
    /** Every matrix product of the step (attention, LM head): colibri_tf_mat_rows (the model
     *  file: any scheme), or the generated model's own, which calls only the kernels of its
     *  schemes, so that the linker drops the others. */
    colibri_tf_mat_rows_fn mat_rows;
    /** int8 activations for Q8 dense matrices: their input rows quantised into xq / sxq by this
     *  (colibri_tf_quantize_rows); NULL: fp32 activations (and the quantiser not linked). */
    void (*quantize_rows)(const float *x, int8_t *xq, float *sx, int32_t n_in, int32_t n);
} colibri_tf_model_t;

/**
 * @brief Start a step of n tokens at positions pos0 .. pos0 + n - 1 (n <= the buffers' rows):
 *        their embedding rows into m->x.
 * @return COLIBRI_ERR_NOMEM when a position is outside the KV cache (context overflow).
 */
colibri_status colibri_tf_embed(const colibri_tf_model_t *m, const int32_t *tokens, int32_t n,
                                int32_t pos0);

/**
 * @brief Attention sub-layer of layer l on the n rows: h = RMSNorm(x), q / k / v projections,
 *        QK-norm, clip, RoPE, causal attention over the KV cache (rows in order, each attending
 *        to the ones before it), x += o_proj(...), then h = RMSNorm(x) with the post-attention
 *        norm: the input of the layer's feed-forward sub-layer.
 */
colibri_status colibri_tf_attention(const colibri_tf_model_t *m, int32_t l, int32_t pos0,
                                    int32_t n);

/**
 * @brief The feed-forward residual of layer l, after the caller's FFN of h: x += proj (the MoE
 *        block or dense MLP), plus sigmoid(h . shared_gate) * shared (the shared expert) when
 *        a MoE layer has one.
 */
void colibri_tf_ffn_residual(const colibri_tf_model_t *m, int32_t l, int32_t n);

/**
 * @brief End of the step: the final RMSNorm and the LM head of the last of the n rows.
 * @param logits out: m->logits
 */
colibri_status colibri_tf_logits(const colibri_tf_model_t *m, int32_t n, const float **logits);

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
