/**
 * @file colibri_lm.h
 * @brief Whole models from a file: a version-2 Colibri container (`colibri convert CKPT --out
 *        model.clb`: embedding, attention, norms, routers, experts in any scheme, shared
 *        experts, LM head, RoPE tables) mmap'ed and run one token at a time, with no code
 *        generated or compiled per model. POSIX hosts and Linux boards only (the file is
 *        compiled out with COLIBRI_NO_FILESYSTEM); the MCU path is the generated C
 *        (transformer_model.h), and on integer schemes the two give the same logits bit for bit.
 *
 * The names avoid colibri_lm_setup / colibri_lm_step / colibri_lm_sample_workspace, which a
 * generated transformer_model.h defines as macros, so both headers can be included together.
 *
 * Every bad file is a negative colibri_status from colibri_lm_init, never a crash: the header
 * is validated field by field (overflow-safe, against the file size) before anything is
 * allocated, then the tensor table (inside the file, 64-aligned, in order, no overlap, unique
 * NUL-terminated names), every tensor the model needs (dtype, exact shape and size), every
 * CRC-32 and the NaN / Inf scan of fp32 tensors (each skippable by load_flags, as colibri_init).
 * A handle is used by one thread at a time; handles are independent (a handle's own pool of
 * num_threads - 1 workers only ever runs inside its calls).
 *
 * Memory. Validate, then allocate: every size comes from the header and from tensor shapes
 * checked against the file, and the parts the caller's config sizes are computed before any of
 * them is allocated. colibri_lm_init allocates at most (colibri_lm_measure gives each term)
 *
 *   total = table + arena + slots + packed + pool, where
 *   table  = 72 n_tensors + 40 n_layers + sizeof(handle) + ~600 n_layers + ~250 n_experts
 *            (bounded by the file: each tensor has a 96-byte table entry, each layer at least
 *            8 tensors, each routed expert a 12-byte row of its layer's experts table:
 *            table <= 24 x file bytes),
 *   arena  = 8 L H C                                  (KV cache: L layers, H = n_kv_heads x
 *                                                      head_dim, C = max_context positions)
 *          + 4 B (4 d + 2 Q + 2 H + k d + 2 F + 5 k) + B A + 4 V x 3   (activations, logits,
 *                                                      sampler; B = prefill_batch rows, d =
 *                                                      d_model, Q = n_heads x head_dim, F = the
 *                                                      largest d_ff, k = the largest top_k,
 *                                                      A = max(d, Q, F), V = vocab)
 *          + T (4 B (2 d + 2 F) + B A + 4 C)          (each of T = num_threads's scratch)
 *          (+ 16 bytes of alignment per region),
 *   slots  = budget rounded down to whole slots, + their tables (expert_ram_budget > 0 only),
 *   packed = a copy of the int8 / int4 matrices run with int8 activations on x86-64 with
 *            AVX-512 VNNI, rounded up to 2 MiB (0 elsewhere, or with COLIBRI_LM_PACK=0),
 *   pool   = a few hundred bytes for num_threads > 1 (thread stacks are the system's).
 * With max_memory > 0, each part is checked against it before it is allocated; a model over
 * it is COLIBRI_ERR_MEMORY with nothing left allocated. The mapping of the file is not counted:
 * its pages are the file's (read only, dropped from the resident set where noted below).
 *
 * The file after load. The handle keeps the file open. Each colibri_lm_forward /
 * colibri_lm_prefill first checks that it is still the file that was loaded (size, inode and
 * modification time): a file truncated, grown or rewritten in place since is
 * COLIBRI_ERR_CHANGED before any of its bytes is read (replace a model by writing a new file
 * and renaming it over the old name, as `colibri convert` does: a loaded handle keeps the old
 * one). Experts read into slots (expert_ram_budget) are checked against their CRC-32 at every
 * read unless COLIBRI_LOAD_SKIP_CHECKSUM or COLIBRI_LM_NO_READ_CHECK (COLIBRI_ERR_CHECKSUM, the
 * slot left free), and a read
 * that meets the end of the file is COLIBRI_ERR_CHANGED. A truncation between that check and
 * the kernels' reads of the mapping can still end the process with SIGBUS: POSIX gives a
 * library no way to read a mapping safely under a concurrent truncation. With a budget, after
 * load, the kernel reads no further ahead than asked where the reads scatter (the expert preads,
 * the mapping except the matrices still streamed from it) and the small fp32 tensors every step
 * reads (norms, routers, scale rows) are locked in (mlock, best effort): under a memory cap that
 * charges the page cache, readahead and their eviction tripled the bytes read
 * (benchmarks/beyond_ram.py). COLIBRI_LM_READAHEAD=1 in the environment keeps the defaults.
 */
#ifndef COLIBRI_LM_H
#define COLIBRI_LM_H

#include <stddef.h>
#include <stdint.h>

#include "colibri.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Opaque whole-model handle (colibri_lm_init). */
typedef struct colibri_lm colibri_lm_t;

/** Options of colibri_lm_init. Zero-initialise what you do not set. */
typedef struct {
    const char *model_path; /**< version-2 container (.clb) */
    /**
     * KV cache positions (the arena grows 8 x n_layers x n_kv_heads x head_dim bytes each):
     * 0 = COLIBRI_LM_DEFAULT_CONTEXT, or the file's max_context (its RoPE table rows) when
     * that is smaller; above the file's: COLIBRI_ERR_ARG.
     */
    int32_t max_context;
    uint32_t load_flags; /**< COLIBRI_LOAD_SKIP_CHECKSUM / _SKIP_FINITE; 0 = verify all */
    /**
     * Bytes of routed-expert weights that may be resident (0 = all: every expert is read in
     * place from the mapping). With a budget the experts stay in the file: the handle keeps
     * budget / colibri_lm_stats_t.slot_bytes expert slots (at most one per expert), fills a
     * slot with pread() on a miss and evicts the least recently used one. The file's pages
     * of the routed experts are dropped from the mapping after the load-time checks
     * (madvise MADV_DONTNEED), so they do not count in the process's resident set; dense
     * weights, routers and shared experts stay mapped. COLIBRI_ERR_BUDGET when the slots
     * cannot hold top_k experts of a layer. Logits are bit-identical to budget 0. Unless
     * COLIBRI_LM_NO_PREFETCH, the next layer's predicted experts are loaded into slots ahead.
     * Unless COLIBRI_LM_NO_PIN, when the file has calibration heat (layer.{i}.heat, written by
     * `colibri convert --calib`) the hottest experts are read at init into pinned slots that
     * are never evicted (pinned_slots).
     */
    uint64_t expert_ram_budget;
    uint32_t expert_flags; /**< COLIBRI_LM_NO_PREFETCH | _NO_PIN | _NO_READ_CHECK |
                                _PREFETCH_ALWAYS; 0 = the defaults */
    /**
     * Threads (host and Linux boards): 0 or 1 = the caller's only; N > 1 = the caller plus a
     * pool of N - 1 workers created here and joined by colibri_lm_free (blocked on a condition
     * variable when idle). The output rows of the large matrices (attention, dense MLP, LM
     * head) and the routed experts of a layer are split over them in a fixed partition, so
     * logits are bit-identical for every thread count. Negative or above 256:
     * COLIBRI_ERR_ARG; built with COLIBRI_NO_THREADS, above 1: COLIBRI_ERR_UNSUPPORTED.
     */
    int32_t num_threads;
    /**
     * Tokens colibri_lm_prefill runs through each layer together (0 = 64, at most 4096,
     * clamped to max_context): the activations are sized for this many rows. 0 with an expert
     * RAM budget sizes the chunk to the budget: a chunk reads each expert it routes to once per
     * layer, so it takes as many rows as keep its activations within a quarter of the budget
     * (at least 64), and never more than max_memory (when set) leaves room for.
     */
    int32_t prefill_batch;
    /**
     * Pinned expert slots, with a budget and a file with heat (ignored without a budget):
     * 0 = auto (up to half the slots, leaving at least 2 x top_k LRU slots with prefetch, the sum
     * of the layers' top_k without), N > 0 = up to N; only experts the calibration routed to are
     * pinned (hottest first: heat = the share of calibration tokens routed to the expert,
     * comparable across layers), and never so many that fewer than the largest top_k slots stay
     * LRU: N above n_slots - top_k is COLIBRI_ERR_BUDGET, N > 0 on a file without heat
     * COLIBRI_ERR_ARG, N < 0 COLIBRI_ERR_ARG. COLIBRI_LM_NO_PIN pins nothing.
     */
    int32_t pinned_slots;
    /**
     * Ceiling on the bytes colibri_lm_init allocates (the `total` of the file comment:
     * tables, arena with the KV cache, expert slots, packed copies, pool); 0 = none. A model
     * that needs more is COLIBRI_ERR_MEMORY before the part that would cross it is allocated;
     * colibri_lm_measure with the same config gives the bytes it needs.
     */
    uint64_t max_memory;
} colibri_lm_config_t;

/** KV cache positions when colibri_lm_config_t.max_context is 0 (or the file's, if fewer). */
#define COLIBRI_LM_DEFAULT_CONTEXT 2048

/** What colibri_lm_init allocates for a file and config (colibri_lm_measure); bytes. */
typedef struct {
    uint64_t table_bytes;  /**< tensor table and descriptors while parsing, layer and expert
                                tables (bounded by the file) */
    uint64_t arena_bytes;  /**< activations, KV cache, scratch, logits, sampler workspace */
    uint64_t kv_bytes;     /**< of which the KV cache */
    uint64_t slot_bytes;   /**< expert slots and their tables (expert_ram_budget > 0) */
    uint64_t packed_bytes; /**< matrices repacked for the CPU's kernels (0: none) */
    uint64_t pool_bytes;   /**< the worker pool's tables (num_threads > 1) */
    uint64_t total_bytes;  /**< the sum: at most what colibri_lm_init allocates */
    int32_t max_context;   /**< the KV cache positions these figures are for */
} colibri_lm_memory_t;

/**
 * Expert prefetch off: no prediction at all. By default, with a budget, once a layer's top_k
 * experts are in their slots (before they compute) the next layer's router is applied to the
 * current hidden state. Each layer's prediction starts in the shadow: the predicted experts that
 * are not resident are only counted (prefetch_skipped), with whether the layer uses them. When
 * at least half are used (judged every 16), its prefetch goes live: they are read into slots
 * ahead (prefetch loads) by a reader thread of the handle while the current layer computes
 * (inline where threads are not available); a use waits for its read. The slots of the same
 * handle without prefetch are tracked alongside (expert ids and use clocks: an LRU over the
 * same uses), and no read-ahead keeps out an expert that run holds: a prefetched expert takes
 * a free slot, else one whose expert that run no longer holds, else the least recently used
 * expert of a layer other than the one predicted for (its uses cannot name it), which is read
 * back after that layer's uses unless that run evicted it meanwhile (restores); only when no
 * such slot is left, one of the predicted layer's own experts. It never evicts a slot of the
 * current layer's experts, another predicted one, a pinned one or one being read (no slot
 * left: the rest is not prefetched). Misses take a free or spare slot first (a wrong
 * read-ahead's), then the slot of the expert the run without prefetch evicts. A live layer
 * returns to the shadow when fewer than half the experts read ahead for it are used, or when
 * they gained fewer hits than they lost against the run without prefetch (at once when 4
 * fewer). Outputs never change; the next layer's uses of correctly predicted experts become
 * hits instead of misses.
 */
#define COLIBRI_LM_NO_PREFETCH 0x1u

/**
 * Expert pinning off: every slot is LRU. By default, with a budget and a file that holds the
 * calibration heat, the hottest experts are read at init into slots that are never evicted
 * (neither by a miss nor by a prefetch); their uses are hits (and pinned hits). Outputs never
 * change.
 */
#define COLIBRI_LM_NO_PIN 0x2u

/**
 * No CRC-32 check of the experts read into slots after the load (expert_ram_budget > 0). By
 * default each read part is checked against the CRC-32 the file's table gives it, so a file
 * changed in place after the load (size and times kept) never reaches the kernels
 * (COLIBRI_ERR_CHECKSUM). The load-time checks are not affected (COLIBRI_LOAD_SKIP_CHECKSUM
 * turns both off). Cost: benchmarks/budget_table.py.
 */
#define COLIBRI_LM_NO_READ_CHECK 0x4u

/**
 * Prefetch live from the first token and never returned to the shadow: every prediction is
 * read ahead, whether or not it pays (for measurements and tests of the prefetch itself).
 * Ignored with COLIBRI_LM_NO_PREFETCH.
 */
#define COLIBRI_LM_PREFETCH_ALWAYS 0x8u

/**
 * Expert-slot counters (colibri_lm_get_stats); all 0 but expert_bytes without a budget.
 * loads = hits + misses (the layers' uses; the hit rate is hits / loads, prefetched experts
 * included); a slot is filled by each miss, each prefetch and each restore, so bytes_read = the
 * sum of the filled experts' stored bytes and evictions = misses + prefetches + restores -
 * n_slots once the slots are full (they fill first; n_slots - n_pinned with pinned slots, whose
 * init reads count in bytes_read but not in misses); pinned_hits <= hits; prefetch_hits <=
 * min(prefetches, hits), and prefetch_hits / prefetches is the prediction's accuracy;
 * bytes_prefetched are the bytes read ahead. With COLIBRI_LM_NO_PREFETCH prefetches =
 * prefetch_hits = bytes_prefetched = prefetch_skipped = restores = 0.
 */
typedef struct {
    uint64_t loads;            /**< routed-expert uses (hits + misses) */
    uint64_t hits;             /**< uses whose expert was in a slot (prefetched or not) */
    uint64_t misses;           /**< uses that read the expert from the file into a slot */
    uint64_t evictions;        /**< slot fills (misses, prefetches, restores) that replaced one */
    uint64_t prefetches;       /**< predicted experts, not resident, read into a slot ahead */
    uint64_t prefetch_hits;    /**< prefetched experts used by the layer they were predicted for */
    uint64_t bytes_read;       /**< bytes pread() from the file into slots (misses + prefetches) */
    uint64_t expert_bytes;     /**< stored bytes of all routed experts in the file */
    uint64_t slot_bytes;       /**< bytes of one slot (the largest expert, parts 64-aligned) */
    uint32_t n_slots;          /**< expert slots (0: no budget) */
    uint32_t n_pinned;         /**< of which pinned at init with the hottest experts */
    uint64_t pinned_hits;      /**< uses whose expert was in a pinned slot */
    uint64_t bytes_prefetched; /**< of bytes_read, those read ahead by the prefetch */
    uint64_t prefetch_skipped; /**< experts predicted but not read ahead: their layer's
                                    prefetch in the shadow (counting its accuracy) */
    uint64_t restores;         /**< experts read back into a slot after a wrong read-ahead took
                                    theirs (in bytes_read and evictions, not in misses) */
} colibri_lm_stats_t;

/** What a loaded model is (colibri_lm_info). */
typedef struct {
    int32_t vocab_size;
    int32_t d_model;
    int32_t n_layers;
    int32_t max_context; /**< positions this handle's KV cache holds */
    size_t arena_bytes;  /**< bytes allocated for activations, KV cache and sampler */
    size_t weight_bytes; /**< bytes of the mapped file */
    size_t packed_bytes; /**< bytes allocated at init for the matrices repacked for the CPU's
                              kernels (x86-64 with AVX-512 VNNI; 0: none) */
} colibri_lm_info_t;

/** Largest n_layers / heads a file may declare (sanity limits checked before allocation). */
#define COLIBRI_LM_MAX_LAYERS 4096
#define COLIBRI_LM_MAX_HEADS 4096

/**
 * @brief Map and validate a version-2 container, then allocate the model (see the file
 *        comment). COLIBRI_ERR_VERSION for a version-1 file (one MoE block: colibri_init).
 * @return COLIBRI_OK and *out set (release with colibri_lm_free), or a negative status with
 *         *out = NULL.
 */
colibri_status colibri_lm_init(const colibri_lm_config_t *config, colibri_lm_t **out);

/**
 * @brief The bytes colibri_lm_init would allocate for this config (see the file comment),
 *        without allocating them: the file is mapped and validated as by colibri_lm_init
 *        except the CRC-32 and NaN / Inf scans, and config->max_memory is ignored. For
 *        a caller choosing max_context, threads or a budget, and for the message of a
 *        COLIBRI_ERR_MEMORY.
 * @return COLIBRI_OK and *mem filled, or colibri_lm_init's status for the file and config.
 */
colibri_status colibri_lm_measure(const colibri_lm_config_t *config, colibri_lm_memory_t *mem);

/**
 * @brief Run one token at position pos: the same operations in the same order as a generated
 *        transformer_model.c. Positions run in order, 0, 1, 2, ... (the KV cache keeps the
 *        past); pos may also go back to any position already run, which rewinds: positions
 *        from pos on are forgotten and recomputed. A position past the ones run so far would
 *        attend to KV rows never written: COLIBRI_ERR_POSITION, nothing runs. A failed call
 *        forgets the positions from pos on (the layers it ran wrote their rows).
 * @param logits out: the next-token logits [vocab], inside the handle (valid until the next
 *               call)
 * @return COLIBRI_ERR_ARG for a token outside the vocabulary, COLIBRI_ERR_NOMEM when pos is
 *         outside the KV cache (context overflow), COLIBRI_ERR_POSITION (above),
 *         COLIBRI_ERR_CHANGED when the file changed since the load, COLIBRI_ERR_NAN when a
 *         router input or a logit is NaN or Inf (fp32 overflowed: weights far out of range),
 *         else the MoE runtime's status.
 */
colibri_status colibri_lm_forward(colibri_lm_t *lm, int32_t token, int32_t pos,
                                  const float **logits);

/**
 * @brief Run n prompt tokens at positions pos0 .. pos0 + n - 1 (the KV cache keeps the past)
 *        in chunks of prefill_batch tokens: each chunk goes through every layer as one batch
 *        (the routed experts grouped, one multi-token product per expert and matrix), the
 *        attention causal within the chunk. The KV cache and the logits are bit-identical to
 *        n colibri_lm_forward calls. With an expert RAM budget each chunk's routed experts
 *        are made resident in waves of as many as the LRU slots hold, so a layer reads each
 *        expert a chunk uses once (not once per token); its uses count once in the stats.
 *        pos0 follows colibri_lm_forward's rule (at most the positions run so far).
 * @param logits out: the next-token logits [vocab] after the last token, inside the handle
 * @return COLIBRI_ERR_ARG for n < 1 or a token outside the vocabulary (nothing runs),
 *         COLIBRI_ERR_NOMEM when the positions leave the KV cache, else as colibri_lm_forward.
 */
colibri_status colibri_lm_prefill(colibri_lm_t *lm, const int32_t *tokens, int32_t n, int32_t pos0,
                                  const float **logits);

/** @brief Dimensions and sizes of a loaded model. */
colibri_status colibri_lm_info(const colibri_lm_t *lm, colibri_lm_info_t *info);

/** @brief Expert-slot counters since colibri_lm_init (see colibri_lm_stats_t). */
colibri_status colibri_lm_get_stats(const colibri_lm_t *lm, colibri_lm_stats_t *stats);

/** @brief The handle's sampler workspace (COLIBRI_SAMPLE_WORKSPACE_BYTES(vocab) bytes). */
void *colibri_lm_sampler_workspace(colibri_lm_t *lm);

/** @brief Unmap and free a model. Safe on NULL. */
void colibri_lm_free(colibri_lm_t *lm);

#ifdef __cplusplus
}
#endif

#endif /* COLIBRI_LM_H */
