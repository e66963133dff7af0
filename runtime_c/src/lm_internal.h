/**
 * @file lm_internal.h
 * @brief Private to the whole-model runtime (lm_*.c, colibri_lm.h): the container's constants,
 *        the parsed model, its expert cache and scratch, and the functions the files share.
 *        Host only (COLIBRI_NO_FILESYSTEM leaves every lm_*.c empty).
 */
#ifndef COLIBRI_LM_INTERNAL_H
#define COLIBRI_LM_INTERNAL_H

#include "colibri_lm.h"

#include "clb_format.h"
#include "colibri.h"
#include "colibri_internal.h"
#include "colibri_math.h"
#include "colibri_quant.h"
#include "colibri_transformer.h"
#include "kernels_x86.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define LM_HEADER_BYTES CLB_HEADER_BYTES
#define LM_ENTRY_BYTES CLB_ENTRY_BYTES
#define LM_ALIGN CLB_ALIGNMENT
#define LM_VERSION 2u
#define LM_KIND_DECODER 1u
#define LM_MAX_DIM (1u << 24)
#define LM_MAX_EXPERTS 65535u
#define LM_DESC_FIELDS 10u
#define LM_EXPERT_COLUMNS 3u
#define LM_FLAG_TIED 0x1u
#define LM_FLAG_QK_NORM 0x2u
#define LM_FLAG_CLIP 0x4u
#define LM_FLAGS_KNOWN 0x7u

#define LM_MAX_THREADS 256
/* An expert's read is split in chunks of this many bytes of a part (lm_cache.c, lm_reader.c;
 * COLIBRI_LM_READ_CHUNK in the environment replaces it). */
#define LM_READ_CHUNK ((uint64_t)1u << 19)
#define LM_PARTS 6             /* stored parts of an expert: w1, w2, w3 and their int8 scales */
#define LM_PAR_MIN_WORK 32768u /* lm_run_sized */
#define LM_DEFAULT_BATCH 64
#define LM_MAX_BATCH 4096

/* Table dtypes. */
/* Table dtypes; DT_OLD_Q4K / DT_OLD_Q5K were q4k / q5k with each row its own super-blocks, a
 * layout no longer read (a file holding one is refused: COLIBRI_ERR_FORMAT), DT_Q4K / DT_Q5K
 * their matrices' streams of super-blocks across rows (COLIBRI_Q4K / Q5K_BYTES). */
enum {
    DT_F32 = 0,
    DT_F16 = 1,
    DT_I8 = 2,
    DT_Q4 = 3,
    DT_I32 = 4,
    DT_OLD_Q4K = 5,
    DT_OLD_Q5K = 6,
    DT_Q4K = 7,
    DT_Q5K = 8
};

/* ------------------------------------------------------------------------------------------ */
/* Parsed file                                                                                 */

typedef struct {
    uint32_t version, alignment, kind, n_tensors, meta_bytes, n_layers;
    uint64_t table_offset, meta_offset, data_offset, file_size;
    uint32_t vocab, d_model, n_heads, n_kv_heads, head_dim, max_context, flags;
    float eps, clip;
    uint32_t window;
    uint32_t dense_scheme, dense_act;
} lm_header;

typedef clb_entry lm_entry;

/** A stored matrix [n_out][n_in] (packed: the copy colibri_x86_pack made at init). */
typedef colibri_tf_mat_t lm_mat;

typedef struct {
    int32_t owner, scheme, act;
    colibri_expert_weights_t fw; /* fp32 experts: the MoE IR layout, colibri_expert_ffn_f32 */
    lm_mat w[3];                 /* quantised experts: w1, w2, w3 */
    uint32_t crc[LM_PARTS];      /* CRC-32 of each stored part, in lm_cache.c's part order */
} lm_expert;

typedef struct {
    colibri_tf_layer_t tf; /* what tf_step.c reads: norms, attention, FFN kind */
    int32_t top_k;
    int32_t first_expert; /* index of its expert 0 in the model's expert array */
    colibri_model_t moe;  /* dims, flags and router for colibri_route / colibri_expert_ffn_f32 */
    lm_expert *experts;
    int32_t ffn_scheme, ffn_act;
    lm_mat ffn[3];     /* w1 gate [f][d], w2 down [d][f], w3 up [f][d] */
    const float *heat; /* [n_experts] calibration heat (layer.{i}.heat), NULL when absent */
} lm_layer;

/** An expert slot (expert_ram_budget > 0): a copy of one expert's stored bytes. */
typedef struct {
    int32_t expert;  /* model-wide expert index, -1 when free */
    int32_t ahead;   /* filled by the prefetch, not yet used by the layer it was predicted for */
    int32_t pinned;  /* filled at init with a hot expert: never evicted */
    int32_t queued;  /* handed to the reader thread, completion not yet seen by the caller */
    uint64_t qepoch; /* lm_cache.epoch when it was queued (lm_cache.c, slot_held) */
    uint64_t used;   /* use clock of its last use or fill (LRU; 0: a prefetch never used) */
    uint64_t pin;    /* == lm_cache.epoch: the prefetch may not evict it */
    lm_expert e;     /* the expert's descriptor, pointers into data */
    unsigned char *data;
    /* the reader thread's job (set before it is queued, read-only while queued) */
    const lm_layer *src_layer;
    const lm_expert *src;
    int32_t state;      /* LM_SLOT_READY / _LOADING / _FAILED, under the reader's mutex */
    colibri_status got; /* the read's status (LM_SLOT_FAILED) */
    /* a queued read in lm_cache.chunk pieces, which the reader and a thread waiting for the
     * slot take in turn (lm_reader.c); under the reader's mutex while LM_SLOT_LOADING */
    uint32_t n_chunks;  /* the read's chunks (clb_lm_slot_chunks) */
    uint32_t next;      /* the first chunk no thread has taken yet */
    uint32_t left;      /* chunks not yet read */
    colibri_status err; /* the first failed chunk's status, COLIBRI_OK while none */
    uint64_t seq;       /* when it was queued: the reader takes the oldest read first */
    uint32_t *crcs;     /* [lm_cache.max_chunks] each chunk's CRC-32, combined at the end */
    int32_t whole;      /* its chunks are taken and read together (clb_lm_slot_whole) */
} lm_slot;

enum { LM_SLOT_READY = 0, LM_SLOT_LOADING = 1, LM_SLOT_FAILED = 2 };

typedef struct lm_reader lm_reader;

/** Per MoE layer: how the prediction of its experts fares (the prefetch into it is on or off on
 *  this: lm_cache.c, clb_lm_prefetch). */
typedef struct {
    uint32_t issued;   /* experts predicted, not resident, in the current window */
    uint32_t used;     /* of which the layer used (misses a prefetch saves) */
    uint32_t restored; /* experts its read-aheads displaced and ref_restore read back */
    uint32_t gain;     /* of used: hits the run without prefetch misses (hits it gains) */
    uint32_t lost;     /* misses of uses the run without prefetch hits (hits it loses) */
    uint32_t live;     /* 1: predicted experts are read ahead; 0: only counted (shadow) */
    uint32_t backoff;  /* live windows that failed in a row (at most LM_PREDICT_BACKOFF): the
                        * shadow predicts once every 2^backoff of its chances */
    uint32_t tick;     /* the shadow's chances since the window began */
    int32_t n_pending; /* shadow: the last prediction's experts not resident */
    int32_t pending[COLIBRI_MAX_TOP_K]; /* ... their model-wide indices */
} lm_predict;

/** The routed-expert cache of a handle with a budget (one allocation each, host only). */
typedef struct {
    int fd;       /* the model file, for pread */
    int prefetch; /* COLIBRI_LM_NO_PREFETCH clear */
    int always;   /* COLIBRI_LM_PREFETCH_ALWAYS: every layer's prefetch live, never judged */
    uint32_t n_slots;
    lm_slot *slots;
    unsigned char *data;                 /* n_slots * stats.slot_bytes, 64-aligned */
    int32_t *resident;                   /* [n_experts]: slot or -1 */
    uint64_t clock;                      /* LRU use clock */
    uint64_t epoch;                      /* prefetch round (lm_slot.pin) */
    int32_t pred_ids[COLIBRI_MAX_TOP_K]; /* the next layer's predicted experts */
    float pred_gates[COLIBRI_MAX_TOP_K];
    int check_crc;               /* COLIBRI_LOAD_SKIP_CHECKSUM clear: each read is verified */
    colibri_crc32_tables tables; /* for the reads' CRC-32 */
    lm_reader *reader;           /* the thread that reads the experts (NULL: inline) */
    uint32_t max_chunks;         /* chunks of a slot's read at most (lm_slot.crcs) */
    uint64_t chunk;              /* bytes of a read's chunk (LM_READ_CHUNK; the environment's
                                    COLIBRI_LM_READ_CHUNK) */
    uint32_t chunk_op;           /* colibri_crc32_shift(chunk), for the combining */
    uint32_t *crcs;              /* [n_slots][max_chunks] the slots' lm_slot.crcs */
    lm_predict *predict;         /* [n_layers] */
    int32_t *evictor;            /* [n_experts]: 1 + the layer whose prefetch evicted it, or 0 */
    /* With prefetch: the slots of the same handle without it (an LRU of the same slots less the
     * pinned ones over the same uses, experts' ids and use clocks only), so that no read ahead
     * keeps out an expert the run without prefetch holds (lm_cache.c, ref_use / ref_restore). */
    uint64_t *ref_used; /* [n_experts]: its use clock there, 0 when not there (NULL: no prefetch) */
    uint64_t *ref_pin;  /* [n_experts]: the epoch of its last use (the current uses: not victims) */
    uint32_t ref_n;     /* experts there */
    uint32_t ref_cap;   /* its slots: n_slots - n_pinned */
} lm_cache;

/** One thread's scratch (arena): a gathered group of an expert's tokens and its FFN. */
typedef struct {
    float *xin;    /* [batch][d_model] the group's input rows */
    float *yout;   /* [batch][d_model] its output rows */
    float *hh;     /* [batch][2 * max_ff] FFN hidden (gate rows, then up rows) */
    float *sx;     /* [batch][COLIBRI_Q8_BLOCKS(act_n)] int8 activation scales */
    int8_t *xq;    /* [batch][act_n] int8 activation codes */
    float *scores; /* [max_context] attention scores */
} lm_scratch;

typedef struct lm_pool lm_pool;

struct colibri_lm {
    void *map;
    size_t map_size;
    int fd;              /* the model file: pread of budgeted experts, the change check */
    struct stat at_load; /* its fstat at load: size, inode, mtime (lm_step.c lm_file_check) */
    int32_t n_pos;       /* KV cache positions 0 .. n_pos - 1 hold the current sequence */
    int budgeted;        /* expert_ram_budget > 0: routed experts live in slots */
    lm_header h;
    int32_t max_context, hq, hkv, max_ff, act_n;
    int32_t n_threads; /* >= 1: the caller's thread and n_threads - 1 pool workers */
    int32_t batch;     /* token rows of the activations: prefill chunk (decode uses row 0) */
    int32_t max_k;     /* largest top_k of the model's MoE layers (at least 1) */
    int32_t max_e;     /* most experts of the model's MoE layers (at least 1) */
    lm_mat embed, lm_head;
    const float *final_norm, *rope_cos, *rope_sin;
    lm_layer *layers;
    /* the arena: activations of `batch` token rows ([batch][n] each; a decode step is row 0) */
    float *x, *hbuf, *q, *k, *v, *att, *proj, *shared, *ffn_scratch, *y_expert;
    float *gates, *route_temp, *logits, *kv, *sxq;
    int32_t *ids;          /* [batch][top_k] a layer's routed experts, gates alongside */
    int32_t *perm;         /* [batch * max_k] the (row, slot) pairs by expert (clb_moe_group) */
    int32_t *offsets;      /* [2 max_experts + 1] clb_moe_group's offsets, then its cursor */
    int32_t *groups;       /* [batch * max_k + 1] start of each used expert's run in perm */
    int32_t *owner;        /* [batch * max_k] the thread that runs each run */
    int64_t *load;         /* [n_threads] rows assigned to each thread (owner's balance) */
    int8_t *xq;            /* [batch][act_n] int8 activation rows of the dense matrices */
    lm_scratch *scratch;   /* [n_threads] */
    lm_pool *pool;         /* NULL: n_threads == 1 */
    uint64_t par_min_work; /* LM_PAR_MIN_WORK, or COLIBRI_LM_PAR_MIN_WORK from the environment */
    void *sample_ws;
    unsigned char *arena_mem; /* the arena's allocation (clb_lm_arena_layout carves it) */
    size_t arena_bytes;
    lm_expert *experts; /* every layer's, in order */
    int32_t n_experts;
    lm_cache *cache;     /* NULL: all experts read in place from the mapping */
    uint64_t read_chunk; /* a miss's chunk bytes, read once by clb_lm_cache_plan */
    void *packed;        /* the packed matrices (lm_pack), NULL: none */
    size_t packed_bytes;
    colibri_lm_stats_t stats;
    colibri_tf_model_t tf; /* the view tf_step.c's step functions run (clb_lm_view) */
};

/* ------------------------------------------------------------------------------------------ */
/* Helpers                                                                                     */

/* a * b saturating at UINT64_MAX. */
static inline uint64_t mul64(uint64_t a, uint64_t b)
{
    return (a != 0u && b > UINT64_MAX / a) ? UINT64_MAX : a * b;
}

static inline uint64_t add64(uint64_t a, uint64_t b)
{
    return (b > UINT64_MAX - a) ? UINT64_MAX : a + b;
}

static inline uint64_t al16(uint64_t n)
{
    return (n > UINT64_MAX - 15u) ? UINT64_MAX : ((n + 15u) & ~(uint64_t)15u);
}

static inline int in_range(uint32_t v, uint32_t lo, uint32_t hi)
{
    return v >= lo && v <= hi;
}

/* A job: every thread (the caller as tid 0, the workers 1 .. nt - 1) runs fn(lm, arg, tid, nt)
 * once; what each one computes is fixed by (tid, nt) alone, never by timing. */
typedef colibri_status (*lm_job_fn)(colibri_lm_t *lm, void *arg, int32_t tid, int32_t nt);

/* lm_parse.c */

/** @brief Drop a blob's pages from the mapping (they leave the process's resident set). */
void clb_lm_drop_pages(const unsigned char *p, uint64_t len);

/* lm_pack.c */

/** @brief The arena's bytes for lm's dims; carves it into lm's regions when arena != NULL. */
uint64_t clb_lm_arena_layout(colibri_lm_t *lm, unsigned char *arena);

/**
 * @brief The prefill chunk (prefill_batch 0) under an expert RAM budget: a chunk reads each expert
 *        it routes to once per layer, so the longer the chunk the fewer the reads. As many rows
 *        (at most max_context and LM_MAX_BATCH) as keep the chunk's activations within a quarter
 *        of the budget, at least LM_DEFAULT_BATCH as without a budget; with ceiling > 0 never
 *        more than keep other + the arena within it (fewer than LM_DEFAULT_BATCH rather than a
 *        model over max_memory; at least 1). lm's dims but batch must be set.
 */
int32_t clb_lm_budget_chunk(colibri_lm_t *lm, uint64_t budget, uint64_t ceiling, uint64_t other);

/** @brief Bytes clb_lm_pack will allocate for lm (0: nothing to pack on this CPU). */
uint64_t clb_lm_pack_bytes(colibri_lm_t *lm);

/** @brief Pack the matrices the CPU has packed kernels for; COLIBRI_ERR_NOMEM on failure. */
colibri_status clb_lm_pack(colibri_lm_t *lm);

/* lm_cache.c */

/** @brief With a budget, after init: the kernel's readahead off where the reads are scattered,
 *         and the small fp32 tensors every step reads locked in (lm_cache.c); entries: the
 *         file's tensor table. */
void clb_lm_cache_advise(colibri_lm_t *lm, const lm_entry *entries, uint32_t n_entries);

/** @brief Free an expert cache (NULL: nothing). */
void clb_lm_cache_free(lm_cache *c);

/**
 * @brief The routed experts' sizes (stats.expert_bytes, .slot_bytes) and, with a budget, the
 *        bytes clb_lm_cache_setup will allocate (*bytes; 0 without a budget).
 *        COLIBRI_ERR_BUDGET when the slots cannot hold top_k experts of a layer.
 */
colibri_status clb_lm_cache_plan(colibri_lm_t *lm, const colibri_lm_config_t *config,
                                 uint64_t *bytes);

/** @brief With a budget, the slots (reading lm->fd) and the pinned experts (after the plan). */
colibri_status clb_lm_cache_setup(colibri_lm_t *lm, const colibri_lm_config_t *config);

/** @brief Start a set of uses that must not evict one another (a layer's top_k for a token, a
 *         wave of a prefill chunk): clb_lm_expert_pin each, then clb_lm_expert_use each. */
void clb_lm_uses_begin(colibri_lm_t *lm);

/** @brief Expert `id` of layer ly, if resident, kept until the current uses are done. */
void clb_lm_expert_pin(colibri_lm_t *lm, const lm_layer *ly, int32_t id);

/** @brief A use of expert `id` of layer ly (budget only): a hit, or a read into a slot. */
colibri_status clb_lm_expert_use(colibri_lm_t *lm, const lm_layer *ly, int32_t id);

/** @brief Expert `id` of layer ly: in place in the mapping, or its slot. */
const lm_expert *clb_lm_expert_at(const colibri_lm_t *lm, const lm_layer *ly, int32_t id);

/** @brief The next layer's predicted experts read into slots ahead of use (budget only). */
void clb_lm_prefetch(colibri_lm_t *lm, const lm_layer *next);

/** @brief After layer ly ran: its unused prefetches go cold, its prediction is judged. */
void clb_lm_layer_done(colibri_lm_t *lm, const lm_layer *ly);

/** @brief Read expert e's stored parts into a slot's data, CRC-checked (see lm_cache.c);
 *         touches only what init made immutable (the reader thread calls it too). */
colibri_status clb_lm_slot_read(const colibri_lm_t *lm, const lm_layer *ly, const lm_expert *e,
                                unsigned char *data);

/** @brief The chunks slot sl's read is split in (its expert and layer set: queued). */
uint32_t clb_lm_slot_chunks(const lm_cache *c, const lm_slot *sl);

/** @brief Read chunk i of slot sl's expert into its data, its CRC-32 in *crc (0 unchecked);
 *         touches only what init made immutable and that chunk (any thread). */
colibri_status clb_lm_chunk_read(const colibri_lm_t *lm, const lm_slot *sl, uint32_t i,
                                 uint32_t *crc);

/** @brief Whether slot sl's queued read is read whole, with one system call (its expert's parts
 *         lie together in the file, a chunk each). */
int clb_lm_slot_whole(const lm_cache *c, const lm_slot *sl);

/** @brief Slot sl's whole read (clb_lm_slot_whole): every chunk read, their CRC-32s in sl->crcs
 *         (0 unchecked); touches only what init made immutable and that slot (any thread). */
colibri_status clb_lm_slot_read_whole(const colibri_lm_t *lm, const lm_slot *sl);

/** @brief Slot sl's parts checked against the file's CRC-32s from its chunks' sl->crcs. */
colibri_status clb_lm_slot_verify(const colibri_lm_t *lm, const lm_slot *sl);

/** @brief Whether the expert `id` of layer ly is in its slot (*busy = 1 while being read; with
 *         `wait`, helping with its read until it is): a failed read is returned. */
colibri_status clb_lm_expert_wait(colibri_lm_t *lm, const lm_layer *ly, int32_t id, int wait,
                                  int *busy);

/** @brief One chunk of the read of expert `id` of layer ly that no thread has taken, read on
 *         this thread: 1, or 0 when there is none. */
int clb_lm_expert_help(colibri_lm_t *lm, const lm_layer *ly, int32_t id);

/** @brief Free slot s (after a failed read). */
void clb_lm_slot_clear(lm_cache *c, uint32_t s);

/* lm_reader.c */

/** Bytes clb_lm_reader_start allocates (at least sizeof(lm_reader)). */
#define LM_READER_BYTES 512u

/** @brief The reader thread for lm's cache (none when the system gives no thread). */
colibri_status clb_lm_reader_start(colibri_lm_t *lm);

/** @brief Stop and join the reader, free it (none: nothing). */
void clb_lm_reader_stop(lm_cache *c);

/** @brief Hand slot s (assigned, its bytes not yet read) to the reader; a reader blocked
 *         in its wait is woken only with `wake` (else the read waits for the reader's next
 *         wake-up, or for the thread that needs it: clb_lm_reader_reap / _cancel). */
void clb_lm_reader_queue(lm_cache *c, uint32_t s, int wake);

/** @brief Slot s's queued read dropped if no thread has taken a chunk of it yet (its slot is
 *         about to hold another expert): 1, else 0. */
int clb_lm_reader_cancel(lm_cache *c, uint32_t s);

/** @brief One chunk of slot s's queued read that no thread has taken, read on this thread: 1,
 *         or 0 when there is none. */
int clb_lm_reader_help(lm_cache *c, uint32_t s);

/** @brief Slot s's read seen finished (waiting for it with `wait`; *busy = 1 when it is still
 *         being read): a failed read frees the slot and is returned. */
colibri_status clb_lm_reader_reap(lm_cache *c, uint32_t s, int wait, int *busy);

/* lm_step.c */

/** @brief Fill lm->tf, the view of the bound, packed model the step functions run. */
void clb_lm_view(colibri_lm_t *lm);

/* lm_pool.c */

/** @brief Bytes clb_lm_pool_create allocates for n_threads (0 for one thread). */
uint64_t clb_lm_pool_bytes(int32_t n_threads);

/** @brief Stop and join the workers, free the pool (NULL: nothing). */
void clb_lm_pool_free(lm_pool *pool);

#ifndef COLIBRI_NO_THREADS
/** @brief n_threads - 1 workers, blocked until the first job. */
colibri_status clb_lm_pool_create(colibri_lm_t *lm, lm_pool **out);
#endif

#ifndef COLIBRI_NO_THREADS
/** @brief Spin until ready(obj, seen) (C11 atomics read without a mutex), at most LM_SPIN_NS
 *         of the clock, yielding the core after LM_SPIN_YIELD polls: 1 if it came true, 0 when
 *         the time ran out (the caller then blocks on its condition variable). The pool's
 *         waits and the expert reader's (lm_reader.c) both spin so. */
int clb_lm_spin(int (*ready)(const void *, uint64_t), const void *obj, uint64_t seen);
#endif

/** @brief Run a job on every thread; the first failing status in thread order, else OK. */
colibri_status clb_lm_run(colibri_lm_t *lm, lm_job_fn fn, void *arg);

#endif /* COLIBRI_LM_INTERNAL_H */
