/**
 * @file colibri.h
 * @brief Public C API of the Colibri MoE runtime (libcolibri.a).
 *
 * Three modules that can be used on their own (router, expert loader, sparse forward) plus a
 * convenience entry point (colibri_forward) that chains them. Every function returns a
 * colibri_status (0 = OK, negative = error); nothing here calls exit() or abort().
 *
 * Memory: on the MCU path (COLIBRI_NO_FILESYSTEM defined) the runtime never allocates; the
 * generated model provides a static arena. The POSIX build (model files, mmap) is marked.
 * There, with F = the bytes of the model's files (the container, or model.bin + router.bin +
 * config.json), every block is sized from validated fields and none is larger than F:
 *
 *   colibri_init        = W + D + A + S <= 4 F      colibri_init_shared = D + A + S <= 3 F
 *   W = 16 + 16-aligned (E x sizeof(colibri_expert_weights_t)) + 16-aligned (4 E)
 *       (+ 4 E d router floats, seed layout): the weight tables every handle on the file shares
 *   D = 16-aligned sizeof(colibri_model_t) + the slots' bookkeeping of COLIBRI_SLOT_BYTES
 *       (fewer slots when it would exceed F - the descriptor: same results)
 *   A = colibri_workspace_size(model, T): T = 256 token rows per chunk, halved until A <= F
 *       (a shared handle keeps base's T)
 *   S = n slots x the largest expert's bytes: n = the LRU / NONE slots, capped at the experts
 *       that own weights (S > F: COLIBRI_ERR_SIZE)
 *
 * (E experts, d = d_model; colibri_init also holds config.json's text while it parses a seed
 * layout.) A handle made by colibri_init_shared from a colibri_init_static base has no files:
 * its D, A and S are the same terms, bounded only by the caller's config. fuzz/fuzz_shared.c
 * checks both bounds on the live bytes.
 *
 * Thread safety
 * -------------
 * A handle (colibri_model_t) is NOT safe to use from two threads at once: a forward pass
 * writes the handle's workspace (arena), its expert cache slots, LRU clock and counters. The
 * runtime has no locks, no global mutable state and no thread-local state, so:
 *   - Different handles may be used concurrently without any synchronisation.
 *   - To run N threads on one model, give each thread its own handle made with
 *     colibri_init_shared (POSIX, allocates only the new handle's workspace and cache slots)
 *     or colibri_init_shared_static (caller's arena, no allocation). The handles share the
 *     read-only weights (the mmap'ed file, the router, the weight table, the sharing map, or
 *     the generated const data) and give bit-identical outputs to the handle they came from;
 *     each has its own workspace, cache slots and colibri_stats_t. Generated kernels keep
 *     all their scratch in the workspace of the handle that calls them (the int8 activation
 *     row of quantised kernels included: colibri_model_t.kernel_scratch_bytes), so every
 *     generated lone layer can be shared, whatever its weight and activation schemes. A
 *     generated whole transformer (transformer_model.c) has one static KV cache and arena:
 *     one thread.
 *   - Calls that only read a handle's immutable part may run concurrently with each other and
 *     with a forward pass on that handle: colibri_route, colibri_workspace_size,
 *     colibri_arena_size, and colibri_init_shared / colibri_init_shared_static with it as
 *     base. Everything else that takes a handle (colibri_forward, colibri_sparse_forward,
 *     colibri_load_expert, colibri_get_stats, colibri_reset_stats, colibri_cleanup) needs
 *     exclusive use of that handle: one thread at a time, or the caller's own lock.
 *   - Handles made by colibri_init / colibri_init_shared hold a reference on the shared
 *     weights (atomic count): clean them up in any order, from any thread (each one once).
 *     colibri_init_shared_static takes no reference: its base must outlive it.
 *   - Functions without a handle (colibri_route_gate, colibri_strerror, colibri_expert_ffn_f32
 *     with a const model, colibri_transformer.h, colibri_quant.h) keep no state and are
 *     reentrant when their output buffers are not shared.
 *   - colibri_config_t.num_threads is reserved: a value > 1 runs single-threaded and does not
 *     make a handle shareable.
 * tests/runtime/test_threads.py runs 4 threads (one handle each, shared weights) under
 * ThreadSanitizer (scons board=host sanitize=thread) and checks the outputs bit for bit.
 */
#ifndef COLIBRI_H
#define COLIBRI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define COLIBRI_VERSION_MAJOR 0
#define COLIBRI_VERSION_MINOR 1
#define COLIBRI_VERSION_PATCH 0

/** Largest top-k the router accepts. */
#define COLIBRI_MAX_TOP_K 64

/** Status codes. Keep in sync with colibri_strerror() (designated-initialiser table). */
typedef enum {
    COLIBRI_OK = 0,
    COLIBRI_ERR_ARG = -1,          /**< NULL pointer or invalid argument */
    COLIBRI_ERR_IO = -2,           /**< file cannot be opened / read / mapped */
    COLIBRI_ERR_MAGIC = -3,        /**< not a Colibri model file (bad magic) */
    COLIBRI_ERR_VERSION = -4,      /**< unsupported format version */
    COLIBRI_ERR_TRUNCATED = -5,    /**< file shorter than its header / config says */
    COLIBRI_ERR_SIZE = -6,         /**< file size inconsistent with the config, or too small
                                        for the runtime's tables for it */
    COLIBRI_ERR_CONFIG = -7,       /**< config.json missing or a field missing/invalid */
    COLIBRI_ERR_TOPK = -8,         /**< top_k <= 0, > num_experts or > COLIBRI_MAX_TOP_K */
    COLIBRI_ERR_DIM = -9,          /**< d_model passed to forward differs from the model's */
    COLIBRI_ERR_NAN = -10,         /**< NaN / Inf in router input or logits */
    COLIBRI_ERR_NOMEM = -11,       /**< allocation failed / static arena too small */
    COLIBRI_ERR_EXPERT = -12,      /**< expert id out of range or sharing map invalid */
    COLIBRI_ERR_UNSUPPORTED = -13, /**< dtype / feature not supported by this build */
    COLIBRI_ERR_FORMAT = -14,      /**< container malformed: tensor missing/duplicated/misplaced */
    COLIBRI_ERR_CHECKSUM = -15,    /**< a container tensor fails its CRC-32 (corrupt file) */
    COLIBRI_ERR_NONFINITE = -16,   /**< NaN or Inf in the model's fp32 weights (refused at load) */
    COLIBRI_ERR_BUDGET = -17,      /**< expert RAM budget below top_k experts of a layer */
    COLIBRI_ERR_MEMORY = -18,      /**< the model needs more memory than the caller's ceiling
                                        (colibri_lm_config_t.max_memory; colibri_lm_measure) */
    COLIBRI_ERR_POSITION = -19,    /**< a position past the ones run so far (colibri_lm.h) */
    COLIBRI_ERR_CHANGED = -20      /**< the model file changed on disk after it was loaded */
} colibri_status;

/** Expert weight residency policy (the seeds' cache_policy). */
typedef enum {
    COLIBRI_CACHE_NONE = 0,  /**< fetch the expert every time it is used */
    COLIBRI_CACHE_LRU = 1,   /**< lru_cache_size slots, least recently used evicted */
    COLIBRI_CACHE_PINNED = 2 /**< every expert resident, never evicted */
} colibri_cache_policy;

/** Expert activation (applied between the two projections). */
typedef enum {
    COLIBRI_ACT_GELU = 0,      /**< exact gelu, 0.5*x*(1+erf(x/sqrt(2))) (default) */
    COLIBRI_ACT_GELU_TANH = 1, /**< tanh approximation of gelu */
    COLIBRI_ACT_SILU = 2,      /**< x*sigmoid(x) */
    COLIBRI_ACT_RELU = 3       /**< max(x, 0) */
} colibri_activation;

/** Model flags. */
#define COLIBRI_FLAG_NORM_TOPK 0x1u   /**< renormalise the k gates to sum to 1 */
#define COLIBRI_FLAG_GATED 0x2u       /**< SwiGLU experts: (silu(x W1) * (x W3)) W2 */
#define COLIBRI_FLAG_ROUTER_BIAS 0x4u /**< router has a bias [n_experts] */
#define COLIBRI_FLAG_EXPERT_BIAS 0x8u /**< experts have b1 / b2 */

/**
 * colibri_config_t.load_flags (colibri_init): checks a trusted file may skip. 0 = verify all.
 * Without them colibri_init still validates the header and tensor table completely; it only
 * stops reading every weight byte (a container's per-tensor CRC-32, the NaN / Inf scan).
 */
#define COLIBRI_LOAD_SKIP_CHECKSUM 0x1u /**< do not verify the container's per-tensor CRC-32 */
#define COLIBRI_LOAD_SKIP_FINITE 0x2u   /**< do not scan fp32 weights for NaN / Inf */

/**
 * Run-time configuration (the seeds' colibri_config_t). Zero-initialise unused fields (use
 * designated initialisers). load_flags sits in what was padding after num_threads on LP64
 * hosts, so sizeof and every other field's offset are unchanged there; a zeroed struct from
 * an older caller (e.g. a ctypes mirror of the four original fields) means "verify all".
 */
typedef struct {
    const char *model_path;            /**< Colibri container or seed flat file (POSIX) */
    colibri_cache_policy cache_policy; /**< NONE / LRU / PINNED */
    int32_t lru_cache_size;            /**< number of LRU slots (LRU only, >= 1) */
    int32_t num_threads; /**< reserved (>= 0, runs single-threaded; see Thread safety) */
    uint32_t load_flags; /**< COLIBRI_LOAD_* bits; 0 = verify everything */
    const int32_t *expert_sharing_map; /**< NULL or [num_experts]: expert i uses j's weights */
} colibri_config_t;

/** Weights of one expert, fp32, row-major. b1/b2/w3 may be NULL (see flags). */
typedef struct {
    const float *w1; /**< [d_model][d_ff] */
    const float *b1; /**< [d_ff] or NULL */
    const float *w2; /**< [d_ff][d_model] */
    const float *b2; /**< [d_model] or NULL */
    const float *w3; /**< [d_model][d_ff], gated experts only, else NULL */
    /**
     * Stored bytes of w1, b1, w2, b2, w3 when a tensor is not plain fp32 (quantised experts:
     * the pointers then address colibri_quant.h data and only the expert's kernel reads them);
     * 0 = the fp32 size from the model's dims. A cache slot copies exactly these bytes, each
     * part at a 16-byte aligned offset.
     */
    uint32_t part_bytes[5];
} colibri_expert_weights_t;

/**
 * @brief Expert kernel: y[n][d_model] = FFN(x[n][d_model]) for n tokens.
 * @param w       the expert's weights (NULL for generated kernels with weights baked in)
 * @param scratch at least n * d_ff * (gated ? 2 : 1) floats, then the model's
 *                kernel_scratch_bytes (the workspace's hidden region; 4-byte aligned)
 */
typedef void (*colibri_expert_kernel_fn)(const colibri_expert_weights_t *w, const float *x,
                                         float *y, int32_t n, float *scratch);

/**
 * @brief Shared expert (Qwen2-MoE): y[n][d_model] += sigmoid(x . g) * FFN_shared(x[n][d_model])
 *        (scale 1 without a gate), run on every token after the routed experts.
 * @param tmp     n * d_model floats (the shared expert's output before it is added)
 * @param scratch the workspace's hidden region and kernel_scratch_bytes (the planner sizes
 *                kernel_scratch_bytes so the shared expert's n hidden rows fit)
 */
typedef void (*colibri_shared_expert_fn)(const float *x, float *y, int32_t n, float *tmp,
                                         float *scratch);

/** Loader counters (colibri_get_stats). */
typedef struct {
    uint64_t loads;     /**< calls to colibri_load_expert */
    uint64_t hits;      /**< expert already resident */
    uint64_t misses;    /**< expert fetched from storage */
    uint64_t evictions; /**< LRU slot reused */
} colibri_stats_t;

/** Largest d_model / d_ff a model file may declare (a sanity limit checked before any
 *  allocation; the tensors must also fit in the file). */
#define COLIBRI_FILE_MAX_DIM (1 << 24)

/** Maximum number of LRU slots. */
#define COLIBRI_MAX_LRU_SLOTS 256

/**
 * Model state. Complete type so that MCU code can allocate it statically; fields are private
 * to the runtime and the generated code.
 */
typedef struct colibri_model {
    int32_t n_experts;
    int32_t d_model;
    int32_t d_ff;
    int32_t top_k; /**< model default top-k (config) */
    colibri_activation activation;
    uint32_t flags;
    const float *router_w; /**< [n_experts][d_model] */
    const float *router_b; /**< [n_experts] or NULL */
    /** Weights as stored (before the sharing map), [n_experts]. */
    colibri_expert_weights_t *stored;
    /** Expert i uses weights of stored[share[i]]; [n_experts]. */
    int32_t *share;
    /** Optional per-expert kernels (generated code); NULL = portable kernel. */
    const colibri_expert_kernel_fn *kernels;
    /** Workspace (arena) and the largest token chunk it can hold. */
    void *arena;
    size_t arena_size;
    int32_t max_tokens;
    /** Loader state. */
    colibri_cache_policy cache_policy;
    int32_t n_slots;
    float *slot_mem;      /**< n_slots * expert_floats (LRU/NONE on copy-based storage) */
    int32_t *slot_expert; /**< [n_slots] stored expert in slot, -1 = empty */
    uint64_t *slot_stamp; /**< [n_slots] last use */
    uint64_t clock;
    colibri_expert_weights_t *slot_weights; /**< [n_slots] pointers into slot_mem */
    colibri_stats_t stats;
    /** Backing storage (POSIX builds): mapping of the model file and owned allocations. */
    void *map_base;
    size_t map_size;
    void *owned; /**< allocation holding this descriptor, arena and slots (POSIX), freed by
                      cleanup; the weight tables live in `shared` */
    int is_static;
    /** Effective sharing map used by the loader (set by init: the config's map, else share;
     *  NULL = identity). Private. */
    const int32_t *share_eff;
    /** Capacity of one cache slot in floats; 0 = COLIBRI_EXPERT_FLOATS of the dims. Generated
     *  code sets it when quantised experts (part_bytes) need a different size. */
    int32_t slot_floats;
    /** Router weight storage (the router stays fp32 unless codegen is asked otherwise):
     *  0 = fp32 router_w; 1 = fp16 bits in router_wq; 2 = int8 in router_wq with one fp32
     *  scale per expert in router_scale (values as colibri_quant_scheme). Each weight is
     *  dequantised to fp32 before the same sequential fp32 accumulation as the fp32 router. */
    int32_t router_scheme;
    const void *router_wq;
    const float *router_scale;
    /** Reference-counted weights shared by the handles of one model file (colibri_init,
     *  colibri_init_shared); NULL for static models. Private. */
    void *shared;
    /** Bytes the expert kernels use in their scratch after the n hidden rows (generated
     *  kernels with int8 activations: the quantised rows of a group of up to max_tokens
     *  tokens, max_tokens * COLIBRI_Q8_ROW_BYTES(max(d_model, d_ff)) of colibri_quant.h).
     *  Part of every handle's workspace (colibri_workspace_size adds COLIBRI_ALIGN16 of it),
     *  so handles sharing the kernels never share this buffer. 0 for model files and fp32
     *  kernels; set by generated code before colibri_init_static. */
    size_t kernel_scratch_bytes;
    /** colibri_init's separate allocations of this handle's arena and cache slot copies (freed
     *  by cleanup); NULL otherwise. Private. */
    void *owned_arena;
    void *owned_slots;
    /** Generated shared expert added to every token's output (colibri_shared_expert_fn); NULL
     *  for none (model files never have one). Set by generated code before init. */
    colibri_shared_expert_fn shared_expert;
} colibri_model_t;

/* ------------------------------------------------------------------------------------------ */
/* Life cycle                                                                                  */

/**
 * @brief Load a model file (POSIX only): a Colibri container, or the seed flat layout with
 *        config.json and router.bin beside it. The file is mmap'ed; weights are used in place.
 *
 * Everything is validated before anything is allocated: every header field or config.json
 * value (overflow-safe, against the file size and the limits COLIBRI_FILE_MAX_DIM, 65535
 * experts, top-k COLIBRI_MAX_TOP_K), every tensor entry (inside the file, after the metadata,
 * 64-aligned, in table order without overlapping, dtype and shape as the header says), the
 * sharing map; then, unless config->load_flags skips them, each container tensor's CRC-32
 * (COLIBRI_ERR_CHECKSUM) and the fp32 weights for NaN / Inf (COLIBRI_ERR_NONFINITE; the seed
 * layout has no checksums). Only then is the model allocated, in at most four blocks, none
 * larger than the model's files (the container, or model.bin + router.bin + config.json): the
 * weight tables handles share; this handle's descriptor (with its slots' bookkeeping); its
 * arena, which holds up to 256 token rows per chunk, fewer when more would not fit (same
 * results); its LRU / NONE cache slots, capped at the number of experts that own weights
 * (the file comment's "Memory" gives each block's formula). A model too small for that (its
 * tables outweigh its weights: d_model 1 and the like) gets COLIBRI_ERR_SIZE. Details and
 * costs: docs/format.md.
 * @return COLIBRI_OK and *out_model set, or a negative status (*out_model = NULL).
 */
colibri_status colibri_init(const colibri_config_t *config, colibri_model_t **out_model);

/**
 * @brief Initialise a model whose weights are already in memory (generated code, MCU path).
 *        No allocation: arena/arena_size must hold colibri_workspace_size(model, max_tokens)
 *        plus COLIBRI_SLOT_BYTES for LRU/NONE (slots live at the end of the arena); the
 *        arena must be 8-byte aligned. A config sharing map overrides model->share.
 *        model must have n_experts, d_model, d_ff, top_k, activation, flags, router_w/b,
 *        stored, share, kernels and kernel_scratch_bytes (0 unless the kernels need it) filled
 *        in. config may be NULL (PINNED, no sharing).
 */
colibri_status colibri_init_static(colibri_model_t *model, const colibri_config_t *config,
                                   void *arena, size_t arena_size, int32_t max_tokens);

/**
 * @brief Another handle on base's model, for another thread (POSIX; see Thread safety). It
 *        shares base's read-only weights and allocates only its own descriptor, workspace and
 *        cache slots (three blocks: D, A and S of the file comment's "Memory", each at most
 *        the model's files for a file model; too many slots for that are fewer slots or
 *        COLIBRI_ERR_SIZE, as colibri_init), so N threads cost N workspaces, not N copies of
 *        the model. Outputs
 *        are bit-identical to base's. The weights stay mapped until the last handle sharing
 *        them is cleaned up: release base and its siblings in any order. Safe to call while
 *        another thread runs a forward pass on base.
 * @param base   a handle from colibri_init, colibri_init_shared or colibri_init_static
 * @param config NULL = base's cache policy and slot count. Otherwise cache_policy,
 *               lru_cache_size and num_threads apply to the new handle (LRU slots are capped at
 *               the experts that own weights, as colibri_init does); model_path and load_flags
 *               are ignored (the weights were loaded and checked with base), and a non-NULL
 *               expert_sharing_map must equal the map base uses (COLIBRI_ERR_ARG otherwise).
 * @return COLIBRI_OK and *out_model set (free with colibri_cleanup), or a negative status
 *         (*out_model = NULL). COLIBRI_ERR_UNSUPPORTED on COLIBRI_NO_FILESYSTEM builds.
 */
colibri_status colibri_init_shared(const colibri_model_t *base, const colibri_config_t *config,
                                   colibri_model_t **out_model);

/**
 * @brief colibri_init_shared without allocation (MCU path, or a host that owns its memory):
 *        model becomes a handle on base's weights with arena as its workspace and cache slots.
 *        arena must hold colibri_arena_size(base, config, max_tokens) bytes, 8-byte aligned
 *        (generated code: <NAME>_WORKSPACE_BYTES + <NAME>_SLOTS_BYTES for the same cache and
 *        <NAME>_MAX_TOKENS). config as colibri_init_shared (slots not capped). No reference is
 *        taken: base (and, for a file model, its weights) must outlive model; colibri_cleanup
 *        on model is a no-op. Any max_tokens >= 1 gives the same outputs (chunking only).
 */
colibri_status colibri_init_shared_static(colibri_model_t *model, const colibri_model_t *base,
                                          const colibri_config_t *config, void *arena,
                                          size_t arena_size, int32_t max_tokens);

/**
 * @brief Arena bytes colibri_init_shared_static (or colibri_init_static with model's weights)
 *        needs for chunks of max_tokens tokens: the workspace plus the cache slots of config's
 *        policy (NULL config: model's own policy and slot count). 0 when the arguments are
 *        invalid or the size does not fit in size_t.
 */
size_t colibri_arena_size(const colibri_model_t *model, const colibri_config_t *config,
                          int32_t max_tokens);

/** @brief Release a model (unmaps / frees what colibri_init took). Safe on NULL. */
void colibri_cleanup(colibri_model_t *model);

/** @brief Human-readable message for a status code (never NULL). */
const char *colibri_strerror(int status);

/* ------------------------------------------------------------------------------------------ */
/* Router                                                                                      */

/**
 * @brief Top-k routing over precomputed gate logits, with an online softmax.
 * @param gate_logits [batch_seq_len][num_experts]
 * @param expert_ids  out [batch_seq_len][top_k], best first (ties: lower expert index first)
 * @param gates       out [batch_seq_len][top_k], softmax probabilities over all experts
 * @param route_temp  workspace of batch_seq_len floats (out: per-token log-sum-exp)
 * No allocation; memory independent of num_experts. NaN/Inf logits -> COLIBRI_ERR_NAN.
 */
colibri_status colibri_route_gate(const float *gate_logits, int32_t batch_seq_len,
                                  int32_t num_experts, int32_t top_k, int32_t *expert_ids,
                                  float *gates, float *route_temp);

/**
 * @brief Full router of a model: logits = x Wg^T (+b) fused with the online softmax/top-k,
 *        then the model's gate renormalisation (COLIBRI_FLAG_NORM_TOPK).
 */
colibri_status colibri_route(const colibri_model_t *model, const float *input,
                             int32_t batch_seq_len, int32_t top_k, int32_t *expert_ids,
                             float *gates, float *route_temp);

/* ------------------------------------------------------------------------------------------ */
/* Expert loader                                                                               */

/**
 * @brief Pointer to an expert's weights under the model's cache policy (sharing map applied).
 *        Zero-copy where the weights are addressable (flash, mmap); otherwise a cache slot.
 */
colibri_status colibri_load_expert(colibri_model_t *model, int32_t expert_id,
                                   const colibri_expert_weights_t **out_weights);

/** @brief Loader counters since init (or the last reset). */
colibri_status colibri_get_stats(const colibri_model_t *model, colibri_stats_t *out_stats);

/** @brief Zero the loader counters. */
colibri_status colibri_reset_stats(colibri_model_t *model);

/* ------------------------------------------------------------------------------------------ */
/* Sparse forward                                                                              */

/** Round a byte count up to 16. */
#define COLIBRI_ALIGN16(n) ((((size_t)(n)) + 15u) & ~(size_t)15u)

/**
 * Workspace bytes of colibri_sparse_forward for chunks of T tokens (E experts, top-k K,
 * d_model D, d_ff F, GATED 0/1): grouping counters, token permutation, gathered inputs,
 * expert outputs and the hidden activations. A compile-time constant for generated code;
 * colibri/plan/memory.py computes the same number and a test checks that they agree. A model
 * whose kernels need scratch after the hidden rows (colibri_model_t.kernel_scratch_bytes KS)
 * has COLIBRI_WORKSPACE_BYTES(...) + COLIBRI_ALIGN16(KS) (colibri_workspace_size), the extra
 * bytes following the hidden region at the end of the workspace.
 */
#define COLIBRI_WORKSPACE_BYTES(E, K, D, F, GATED, T)                                              \
    (COLIBRI_ALIGN16(4u * (2u * (size_t)(E) + 2u)) +                                               \
     COLIBRI_ALIGN16(4u * (size_t)(T) * (size_t)(K)) +                                             \
     2u * COLIBRI_ALIGN16(4u * (size_t)(T) * (size_t)(D)) +                                        \
     COLIBRI_ALIGN16(4u * (size_t)(T) * (size_t)(F) * ((GATED) ? 2u : 1u)))

/** Floats of one expert's weights as held in a cache slot: w1, (b1), w2, (b2), (w3). */
#define COLIBRI_EXPERT_FLOATS(D, F, GATED, BIAS)                                                   \
    ((size_t)(D) * (size_t)(F) * ((GATED) ? 3u : 2u) + ((BIAS) ? (size_t)(D) + (size_t)(F) : 0u))

/**
 * Extra arena bytes a static model (colibri_init_static) needs after the workspace for its
 * cache slots: N = lru_cache_size for COLIBRI_CACHE_LRU, 1 for COLIBRI_CACHE_NONE, 0 for
 * COLIBRI_CACHE_PINNED; EF = COLIBRI_EXPERT_FLOATS(...). The static arena must hold
 * COLIBRI_WORKSPACE_BYTES(...) + COLIBRI_SLOT_BYTES(N, EF) bytes and be 8-byte aligned
 * (16 recommended).
 */
#define COLIBRI_SLOT_BYTES(N, EF)                                                                  \
    ((size_t)(N) == 0u                                                                             \
         ? (size_t)0u                                                                              \
         : (COLIBRI_ALIGN16(8u * (size_t)(N)) +                                                    \
            COLIBRI_ALIGN16((size_t)(N) * sizeof(colibri_expert_weights_t)) +                      \
            COLIBRI_ALIGN16(4u * (size_t)(N)) + COLIBRI_ALIGN16(4u * (size_t)(N) * (size_t)(EF))))

/** @brief Bytes of workspace colibri_sparse_forward needs for chunks of max_tokens tokens
 *         (COLIBRI_WORKSPACE_BYTES for the model's dims and default top-k, plus
 *         COLIBRI_ALIGN16(model->kernel_scratch_bytes)); 0 if it does not fit in size_t. */
size_t colibri_workspace_size(const colibri_model_t *model, int32_t max_tokens);

/**
 * @brief Expert computation for routed tokens: counting-sort grouping of tokens by expert,
 *        each active expert run once over its contiguous mini-batch, gate-weighted
 *        scatter-add back in token order. Tokens are processed in chunks of model->max_tokens.
 */
colibri_status colibri_sparse_forward(colibri_model_t *model, const float *input, float *output,
                                      int32_t batch_seq_len, int32_t top_k,
                                      const int32_t *expert_ids, const float *gates);

/**
 * @brief The whole MoE layer: route then sparse forward (the seeds' entry point).
 * @param input       [batch_seq_len][d_model]
 * @param output      [batch_seq_len][d_model]
 * @param d_model     must equal the model's d_model (COLIBRI_ERR_DIM otherwise)
 * @param expert_ids  out [batch_seq_len][top_k]
 * @param gates       out [batch_seq_len][top_k] (after renormalisation if the model asks)
 * @param route_temp  workspace of batch_seq_len floats
 */
colibri_status colibri_forward(colibri_model_t *model, const float *input, float *output,
                               int32_t batch_seq_len, int32_t d_model, int32_t top_k,
                               int32_t *expert_ids, float *gates, float *route_temp);

/** @brief The portable fp32 expert FFN (reference kernel, used when no kernel is generated). */
void colibri_expert_ffn_f32(const colibri_model_t *model, const colibri_expert_weights_t *w,
                            const float *x, float *y, int32_t n, float *scratch);

#ifdef __cplusplus
}
#endif

#endif /* COLIBRI_H */
