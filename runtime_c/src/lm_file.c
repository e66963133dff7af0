/**
 * @file lm_file.c
 * @brief Whole models from a version-2 Colibri container (colibri_lm.h): mmap, validate
 *        everything before allocating, one allocation for the tables and the arena, and a
 *        token step that repeats templates/transformer/transformer_model.c.j2 operation for
 *        operation (same kernels, same order), so its logits equal the generated C's bit for
 *        bit. Byte layout: docs/format.md section 1b. With an expert RAM budget the routed
 *        experts are read from the file into LRU slots (docs/transformer.md, "Experts beyond
 *        RAM"). Compiled out with COLIBRI_NO_FILESYSTEM: MCUs run the generated C.
 */
#ifndef COLIBRI_NO_FILESYSTEM

#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* madvise (MADV_DONTNEED: glibc's posix_madvise ignores it) */

#include "colibri_lm.h"

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

#ifndef COLIBRI_NO_THREADS
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
#endif

#define LM_HEADER_BYTES 128u
#define LM_ENTRY_BYTES 96u
#define LM_ALIGN 64u
#define LM_NAME_BYTES 48u
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
#define LM_PAR_MIN_WORK 32768u /* lm_run_sized */
#define LM_DEFAULT_BATCH 64
#define LM_MAX_BATCH 4096

/* Table dtypes. */
enum { DT_F32 = 0, DT_F16 = 1, DT_I8 = 2, DT_Q4 = 3, DT_I32 = 4 };

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

typedef struct {
    const char *name;
    uint32_t dtype, ndim;
    uint32_t shape[4];
    uint64_t offset, nbytes;
    uint32_t crc;
} lm_entry;

/** A stored matrix [n_out][n_in] in a colibri_quant_scheme. */
typedef struct {
    int32_t scheme;
    int32_t blocked; /* int8: one scale per block of 32 inputs (colibri_matvec_q8b_*) */
    int32_t n_out, n_in;
    const void *w;
    const float *scale;
    const void *packed; /* NULL, or the copy colibri_x86_pack made at init (int8 activations) */
    int32_t pack_kind;  /* COLIBRI_X86_PACK_* of packed */
} lm_mat;

typedef struct {
    int32_t owner, scheme, act;
    colibri_expert_weights_t fw; /* fp32 experts: the MoE IR layout, colibri_expert_ffn_f32 */
    lm_mat w[3];                 /* quantised experts: w1, w2, w3 */
} lm_expert;

typedef struct {
    const float *input_norm, *post_norm;
    lm_mat wq, wk, wv, wo;
    const float *bq, *bk, *bv, *bo, *q_norm, *k_norm;
    int32_t is_moe, top_k;
    int32_t first_expert; /* index of its expert 0 in the model's expert array */
    colibri_model_t moe;  /* dims, flags and router for colibri_route / colibri_expert_ffn_f32 */
    lm_expert *experts;
    int32_t ffn_d_ff, ffn_scheme, ffn_act;
    lm_mat ffn[3]; /* w1 gate [f][d], w2 down [d][f], w3 up [f][d] */
    const float *shared_gate;
    const float *heat; /* [n_experts] calibration heat (layer.{i}.heat), NULL when absent */
} lm_layer;

/** An expert slot (expert_ram_budget > 0): a copy of one expert's stored bytes. */
typedef struct {
    int32_t expert; /* model-wide expert index, -1 when free */
    int32_t ahead;  /* filled by the prefetch, not yet used by the layer it was predicted for */
    int32_t pinned; /* filled at init with a hot expert: never evicted */
    uint64_t used;  /* use clock of its last use or fill (LRU) */
    uint64_t pin;   /* == lm_cache.epoch: the prefetch may not evict it */
    lm_expert e;    /* the expert's descriptor, pointers into data */
    unsigned char *data;
} lm_slot;

/** The routed-expert cache of a handle with a budget (one allocation each, host only). */
typedef struct {
    int fd;       /* the model file, for pread */
    int prefetch; /* COLIBRI_LM_NO_PREFETCH clear */
    uint32_t n_slots;
    lm_slot *slots;
    unsigned char *data;                 /* n_slots * stats.slot_bytes, 64-aligned */
    int32_t *resident;                   /* [n_experts]: slot or -1 */
    uint64_t clock;                      /* LRU use clock */
    uint64_t epoch;                      /* prefetch round (lm_slot.pin) */
    int32_t pred_ids[COLIBRI_MAX_TOP_K]; /* the next layer's predicted experts */
    float pred_gates[COLIBRI_MAX_TOP_K];
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
    lm_header h;
    int32_t max_context, hq, hkv, max_ff, act_n;
    int32_t n_threads; /* >= 1: the caller's thread and n_threads - 1 pool workers */
    int32_t batch;     /* token rows of the activations: prefill chunk (decode uses row 0) */
    int32_t max_k;     /* largest top_k of the model's MoE layers (at least 1) */
    lm_mat embed, lm_head;
    const float *final_norm, *rope_cos, *rope_sin;
    lm_layer *layers;
    /* the arena: activations of `batch` token rows ([batch][n] each; a decode step is row 0) */
    float *x, *hbuf, *q, *k, *v, *att, *proj, *shared, *ffn_scratch, *y_expert;
    float *gates, *route_temp, *logits, *kv, *sxq;
    int32_t *ids;          /* [batch][max_k] routed experts (sorted by id), gates alongside */
    int32_t *keys;         /* [batch * max_k] (expert, token, slot) keys grouping a layer's uses */
    int32_t *groups;       /* [batch * max_k + 1] start of each expert's run in keys */
    int32_t *owner;        /* [batch * max_k] the thread that runs each run */
    int64_t *load;         /* [n_threads] rows assigned to each thread (owner's balance) */
    int8_t *xq;            /* [batch][act_n] int8 activation rows of the dense matrices */
    lm_scratch *scratch;   /* [n_threads] */
    lm_pool *pool;         /* NULL: n_threads == 1 */
    uint64_t par_min_work; /* LM_PAR_MIN_WORK, or COLIBRI_LM_PAR_MIN_WORK from the environment */
    void *sample_ws;
    size_t arena_bytes;
    lm_expert *experts; /* every layer's, in order */
    int32_t n_experts;
    lm_cache *cache; /* NULL: all experts read in place from the mapping */
    void *packed;    /* the packed matrices (lm_pack), NULL: none */
    size_t packed_bytes;
    colibri_lm_stats_t stats;
};

/* ------------------------------------------------------------------------------------------ */
/* Helpers                                                                                     */

static uint32_t rd_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static uint64_t rd_u64(const unsigned char *p)
{
    return (uint64_t)rd_u32(p) | ((uint64_t)rd_u32(p + 4) << 32);
}

static float rd_f32(const unsigned char *p)
{
    const uint32_t b = rd_u32(p);
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* a * b saturating at UINT64_MAX. */
static uint64_t mul64(uint64_t a, uint64_t b)
{
    return (a != 0u && b > UINT64_MAX / a) ? UINT64_MAX : a * b;
}

static uint64_t add64(uint64_t a, uint64_t b)
{
    return (b > UINT64_MAX - a) ? UINT64_MAX : a + b;
}

static uint64_t al16(uint64_t n)
{
    return (n > UINT64_MAX - 15u) ? UINT64_MAX : ((n + 15u) & ~(uint64_t)15u);
}

static int in_range(uint32_t v, uint32_t lo, uint32_t hi)
{
    return v >= lo && v <= hi;
}

/* ------------------------------------------------------------------------------------------ */
/* Header and table                                                                            */

static colibri_status header_read(const unsigned char *b, size_t size, lm_header *h)
{
    if (size < LM_HEADER_BYTES) {
        return COLIBRI_ERR_TRUNCATED;
    }
    if (memcmp(b, "CLBRMOE\0", 8) != 0) {
        return COLIBRI_ERR_MAGIC;
    }
    h->version = rd_u32(b + 8);
    if (h->version != LM_VERSION) {
        return COLIBRI_ERR_VERSION; /* version 1: one MoE block, colibri_init */
    }
    h->alignment = rd_u32(b + 12);
    h->kind = rd_u32(b + 16);
    h->n_tensors = rd_u32(b + 20);
    h->meta_bytes = rd_u32(b + 24);
    h->n_layers = rd_u32(b + 28);
    h->table_offset = rd_u64(b + 32);
    h->meta_offset = rd_u64(b + 40);
    h->data_offset = rd_u64(b + 48);
    h->file_size = rd_u64(b + 56);
    h->vocab = rd_u32(b + 64);
    h->d_model = rd_u32(b + 68);
    h->n_heads = rd_u32(b + 72);
    h->n_kv_heads = rd_u32(b + 76);
    h->head_dim = rd_u32(b + 80);
    h->max_context = rd_u32(b + 84);
    h->flags = rd_u32(b + 88);
    h->eps = rd_f32(b + 92);
    h->clip = rd_f32(b + 96);
    h->window = rd_u32(b + 100);
    h->dense_scheme = rd_u32(b + 112);
    h->dense_act = rd_u32(b + 116);
    if (h->file_size > (uint64_t)size) {
        return COLIBRI_ERR_TRUNCATED;
    }
    if (h->file_size != (uint64_t)size) {
        return COLIBRI_ERR_SIZE;
    }
    if (h->alignment != LM_ALIGN || h->kind != LM_KIND_DECODER) {
        return COLIBRI_ERR_FORMAT;
    }
    if (!in_range(h->n_layers, 1u, COLIBRI_LM_MAX_LAYERS) || !in_range(h->vocab, 1u, LM_MAX_DIM) ||
        !in_range(h->d_model, 1u, LM_MAX_DIM) || !in_range(h->n_heads, 1u, COLIBRI_LM_MAX_HEADS) ||
        !in_range(h->n_kv_heads, 1u, h->n_heads) || h->n_heads % h->n_kv_heads != 0u ||
        !in_range(h->head_dim, 2u, 65536u) || h->head_dim % 2u != 0u ||
        (uint64_t)h->n_heads * h->head_dim > LM_MAX_DIM ||
        !in_range(h->max_context, 1u, LM_MAX_DIM) || (h->flags & ~LM_FLAGS_KNOWN) != 0u ||
        !(h->eps > 0.0f) || !isfinite(h->eps) || !(h->clip >= 0.0f) || !isfinite(h->clip) ||
        ((h->flags & LM_FLAG_CLIP) != 0u) != (h->clip > 0.0f) || h->window > (uint32_t)INT32_MAX ||
        h->dense_scheme > (uint32_t)COLIBRI_QUANT_Q8 || h->dense_act > 1u ||
        (h->dense_act == 1u && h->dense_scheme != (uint32_t)COLIBRI_QUANT_Q8)) {
        return COLIBRI_ERR_CONFIG;
    }
    if (h->n_layers > h->n_tensors) {
        return COLIBRI_ERR_FORMAT; /* every layer has at least its descriptor tensor */
    }
    if (h->table_offset != LM_HEADER_BYTES ||
        h->meta_offset != LM_HEADER_BYTES + (uint64_t)LM_ENTRY_BYTES * h->n_tensors ||
        h->data_offset % LM_ALIGN != 0u || h->n_tensors == 0u) {
        return COLIBRI_ERR_FORMAT;
    }
    if (h->meta_offset > h->file_size || h->data_offset > h->file_size) {
        return COLIBRI_ERR_TRUNCATED;
    }
    if (h->meta_offset + h->meta_bytes > h->data_offset) {
        return COLIBRI_ERR_FORMAT;
    }
    /* The data must at least hold the embedding (one byte a weight) and the RoPE tables the
     * header implies (all values bounded above, so no product overflows 64 bits). */
    const uint64_t need =
        (uint64_t)h->vocab * h->d_model + 2u * 4u * (uint64_t)h->max_context * (h->head_dim / 2u);
    if (need > h->file_size - h->data_offset) {
        return COLIBRI_ERR_TRUNCATED;
    }
    return COLIBRI_OK;
}

/* Bytes a tensor of this dtype and shape holds; UINT64_MAX when unknown or absurd. */
static uint64_t entry_bytes(uint32_t dtype, uint32_t ndim, const uint32_t *shape)
{
    if (dtype == DT_Q4) {
        if (ndim != 2u) {
            return UINT64_MAX;
        }
        const uint64_t nb = ((uint64_t)shape[1] + 31u) / 32u;
        return mul64(mul64(shape[0], nb), 18u);
    }
    uint64_t n = (dtype == DT_F32 || dtype == DT_I32) ? 4u : (dtype == DT_F16) ? 2u : 1u;
    if (dtype > DT_I32) {
        return UINT64_MAX;
    }
    for (uint32_t i = 0; i < ndim; i++) {
        n = mul64(n, shape[i]);
    }
    return n;
}

static colibri_status table_read(const unsigned char *base, const lm_header *h, lm_entry *out)
{
    uint64_t end = h->data_offset;
    for (uint32_t i = 0; i < h->n_tensors; i++) {
        const unsigned char *p = base + LM_HEADER_BYTES + (size_t)i * LM_ENTRY_BYTES;
        lm_entry *e = &out[i];
        if (memchr(p, 0, LM_NAME_BYTES) == NULL || p[0] == 0) {
            return COLIBRI_ERR_FORMAT;
        }
        e->name = (const char *)p;
        e->dtype = rd_u32(p + 48);
        e->ndim = rd_u32(p + 52);
        for (int d = 0; d < 4; d++) {
            e->shape[d] = rd_u32(p + 56 + 4 * d);
        }
        e->offset = rd_u64(p + 72);
        e->nbytes = rd_u64(p + 80);
        e->crc = rd_u32(p + 92);
        if (!in_range(e->ndim, 1u, 4u) || e->dtype > DT_I32) {
            return COLIBRI_ERR_FORMAT;
        }
        if (e->offset > h->file_size || e->nbytes > h->file_size - e->offset) {
            return COLIBRI_ERR_TRUNCATED;
        }
        if (e->offset % LM_ALIGN != 0u || e->offset < end) {
            return COLIBRI_ERR_FORMAT;
        }
        if (entry_bytes(e->dtype, e->ndim, e->shape) != e->nbytes) {
            return COLIBRI_ERR_SIZE;
        }
        end = e->offset + e->nbytes;
    }
    return COLIBRI_OK;
}

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const lm_entry *)a)->name, ((const lm_entry *)b)->name);
}

/* ------------------------------------------------------------------------------------------ */
/* Tensor lookup (entries sorted by name)                                                      */

typedef struct {
    const unsigned char *base;
    const lm_entry *sorted;
    uint32_t n;
    char name[96];
} lm_ctx;

static const lm_entry *find(const lm_ctx *c, const char *name)
{
    lm_entry key;
    memset(&key, 0, sizeof key);
    key.name = name;
    return (const lm_entry *)bsearch(&key, c->sorted, c->n, sizeof(lm_entry), cmp_entry);
}

/* The tensor c->name: dtype and shape exact (d1 = 0: 1-D). NULL and COLIBRI_OK when absent
 * and optional. */
static colibri_status need(const lm_ctx *c, int required, uint32_t dtype, uint32_t d0, uint32_t d1,
                           const void **out)
{
    *out = NULL;
    const lm_entry *e = find(c, c->name);
    if (e == NULL) {
        return required ? COLIBRI_ERR_FORMAT : COLIBRI_OK;
    }
    if (e->dtype != dtype) {
        return COLIBRI_ERR_UNSUPPORTED;
    }
    const uint32_t ndim = d1 == 0u ? 1u : 2u;
    if (e->ndim != ndim || e->shape[0] != d0 || (ndim == 2u && e->shape[1] != d1)) {
        return COLIBRI_ERR_SIZE;
    }
    *out = c->base + e->offset;
    return COLIBRI_OK;
}

static colibri_status need_f32(lm_ctx *c, int required, uint32_t d0, uint32_t d1, const float **out,
                               const char *fmt, ...) __attribute__((format(printf, 6, 7)));

static colibri_status need_f32(lm_ctx *c, int required, uint32_t d0, uint32_t d1, const float **out,
                               const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->name, sizeof c->name, fmt, ap);
    va_end(ap);
    const void *p = NULL;
    const colibri_status st = need(c, required, DT_F32, d0, d1, &p);
    *out = (const float *)p;
    return st;
}

/* A matrix [n_out][n_in] in `scheme` named by c->name (+ ".scale" for int8). */
static colibri_status need_mat(lm_ctx *c, int32_t scheme, int blocked, uint32_t n_out,
                               uint32_t n_in, lm_mat *m)
{
    static const uint32_t dtypes[4] = {DT_F32, DT_F16, DT_I8, DT_Q4};
    m->scheme = scheme;
    m->blocked = blocked;
    m->n_out = (int32_t)n_out;
    m->n_in = (int32_t)n_in;
    m->scale = NULL;
    colibri_status st = need(c, 1, dtypes[scheme], n_out, n_in, &m->w);
    if (st != COLIBRI_OK || scheme != COLIBRI_QUANT_Q8) {
        return st;
    }
    const size_t len = strlen(c->name);
    if (len + 7u > sizeof c->name) {
        return COLIBRI_ERR_FORMAT;
    }
    memcpy(c->name + len, ".scale", 7u);
    const void *s = NULL;
    st = need(c, 1, DT_F32, n_out, blocked ? (uint32_t)COLIBRI_Q8_BLOCKS(n_in) : 0u, &s);
    m->scale = (const float *)s;
    return st;
}

static void set_name(lm_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void set_name(lm_ctx *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->name, sizeof c->name, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------------------------------ */
/* Layer descriptors (read before the allocation: they size it)                               */

typedef struct {
    int32_t v[LM_DESC_FIELDS]; /* is_moe, n_experts, top_k, d_ff, moe_flags, router_scheme,
                                  ffn_d_ff, ffn_scheme, ffn_act, has_shared_gate */
} lm_desc;

static colibri_status read_desc(lm_ctx *c, const lm_header *h, uint32_t l, lm_desc *d)
{
    const void *p = NULL;
    set_name(c, "layer.%u.desc", (unsigned)l);
    colibri_status st = need(c, 1, DT_I32, LM_DESC_FIELDS, 0u, &p);
    if (st != COLIBRI_OK) {
        return st;
    }
    for (uint32_t i = 0; i < LM_DESC_FIELDS; i++) {
        d->v[i] = (int32_t)rd_u32((const unsigned char *)p + 4u * i);
    }
    const int32_t *v = d->v;
    const int32_t max_dim = (int32_t)LM_MAX_DIM;
    if (v[0] != 0 && v[0] != 1) {
        return COLIBRI_ERR_CONFIG;
    }
    if (v[0] == 1) {
        if (v[1] < 1 || v[1] > (int32_t)LM_MAX_EXPERTS || v[2] < 1 || v[2] > v[1] ||
            v[2] > COLIBRI_MAX_TOP_K || v[3] < 1 || v[3] > max_dim ||
            (v[4] & ~(int32_t)(COLIBRI_FLAG_NORM_TOPK | COLIBRI_FLAG_GATED)) != 0 ||
            (v[4] & (int32_t)COLIBRI_FLAG_GATED) == 0 || v[5] < 0 || v[5] > 2) {
            return COLIBRI_ERR_CONFIG;
        }
        /* the expert table is in the file: it bounds the expert descriptors allocated below */
        set_name(c, "layer.%u.experts", (unsigned)l);
        st = need(c, 1, DT_I32, (uint32_t)v[1], LM_EXPERT_COLUMNS, &p);
        if (st != COLIBRI_OK) {
            return st;
        }
    } else if (v[6] < 1) {
        return COLIBRI_ERR_CONFIG; /* a dense layer needs its MLP */
    }
    if (v[6] < 0 || v[6] > max_dim ||
        (v[6] > 0 && (v[7] != (int32_t)h->dense_scheme || v[8] != (int32_t)h->dense_act)) ||
        v[9] < 0 || v[9] > 1 || (v[9] == 1 && (v[0] != 1 || v[6] == 0))) {
        return COLIBRI_ERR_CONFIG;
    }
    return COLIBRI_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Building the model                                                                          */

/* A layer's calibration heat (optional): every value finite (_NONFINITE) and >= 0 (_CONFIG),
 * checked whatever the load flags, since the expert pinning ranks experts by it. */
static colibri_status heat_check(const float *heat, uint32_t n)
{
    for (uint32_t j = 0; heat != NULL && j < n; j++) {
        if (!isfinite(heat[j])) {
            return COLIBRI_ERR_NONFINITE;
        }
        if (heat[j] < 0.0f) {
            return COLIBRI_ERR_CONFIG;
        }
    }
    return COLIBRI_OK;
}

static colibri_status bind_layer(lm_ctx *c, colibri_lm_t *lm, uint32_t l, const lm_desc *d,
                                 lm_expert *experts)
{
    const lm_header *h = &lm->h;
    lm_layer *ly = &lm->layers[l];
    const uint32_t dm = h->d_model;
    const uint32_t hq = (uint32_t)lm->hq;
    const uint32_t hkv = (uint32_t)lm->hkv;
    const int32_t ds = (int32_t)h->dense_scheme;
    const int blocked = ds == COLIBRI_QUANT_Q8;
    colibri_status st;
    memset(ly, 0, sizeof *ly);
#define LM_TRY(expr)                                                                               \
    do {                                                                                           \
        st = (expr);                                                                               \
        if (st != COLIBRI_OK) {                                                                    \
            return st;                                                                             \
        }                                                                                          \
    } while (0)
    LM_TRY(need_f32(c, 1, dm, 0u, &ly->input_norm, "layer.%u.input_norm", (unsigned)l));
    LM_TRY(need_f32(c, 1, dm, 0u, &ly->post_norm, "layer.%u.post_norm", (unsigned)l));
    set_name(c, "layer.%u.attn.q", (unsigned)l);
    LM_TRY(need_mat(c, ds, blocked, hq, dm, &ly->wq));
    set_name(c, "layer.%u.attn.k", (unsigned)l);
    LM_TRY(need_mat(c, ds, blocked, hkv, dm, &ly->wk));
    set_name(c, "layer.%u.attn.v", (unsigned)l);
    LM_TRY(need_mat(c, ds, blocked, hkv, dm, &ly->wv));
    set_name(c, "layer.%u.attn.o", (unsigned)l);
    LM_TRY(need_mat(c, ds, blocked, dm, hq, &ly->wo));
    LM_TRY(need_f32(c, 0, hq, 0u, &ly->bq, "layer.%u.attn.q_bias", (unsigned)l));
    LM_TRY(need_f32(c, 0, hkv, 0u, &ly->bk, "layer.%u.attn.k_bias", (unsigned)l));
    LM_TRY(need_f32(c, 0, hkv, 0u, &ly->bv, "layer.%u.attn.v_bias", (unsigned)l));
    LM_TRY(need_f32(c, 0, dm, 0u, &ly->bo, "layer.%u.attn.o_bias", (unsigned)l));
    const int qk = (h->flags & LM_FLAG_QK_NORM) != 0u;
    LM_TRY(need_f32(c, qk, hq, 0u, &ly->q_norm, "layer.%u.attn.q_norm", (unsigned)l));
    LM_TRY(need_f32(c, qk, hkv, 0u, &ly->k_norm, "layer.%u.attn.k_norm", (unsigned)l));
    if (!qk) {
        ly->q_norm = NULL;
        ly->k_norm = NULL;
    }
    ly->is_moe = d->v[0];
    ly->ffn_d_ff = d->v[6];
    ly->ffn_scheme = d->v[7];
    ly->ffn_act = d->v[8];
    if (ly->is_moe) {
        const uint32_t ne = (uint32_t)d->v[1];
        const uint32_t f = (uint32_t)d->v[3];
        colibri_model_t *m = &ly->moe;
        m->n_experts = (int32_t)ne;
        m->d_model = (int32_t)dm;
        m->d_ff = (int32_t)f;
        m->top_k = d->v[2];
        m->activation = COLIBRI_ACT_SILU;
        m->flags = (uint32_t)d->v[4];
        m->router_scheme = d->v[5];
        m->cache_policy = COLIBRI_CACHE_PINNED;
        m->is_static = 1;
        ly->top_k = d->v[2];
        lm_mat r;
        set_name(c, "layer.%u.router", (unsigned)l);
        LM_TRY(need_mat(c, d->v[5], 0, ne, dm, &r));
        if (d->v[5] == 0) {
            m->router_w = (const float *)r.w;
        } else {
            m->router_wq = r.w;
            m->router_scale = r.scale;
        }
        const void *tab = NULL;
        set_name(c, "layer.%u.experts", (unsigned)l);
        LM_TRY(need(c, 1, DT_I32, ne, LM_EXPERT_COLUMNS, &tab));
        const unsigned char *t = (const unsigned char *)tab;
        for (uint32_t j = 0; j < ne; j++) {
            lm_expert *e = &experts[j];
            memset(e, 0, sizeof *e);
            e->owner = (int32_t)rd_u32(t + 12u * j);
            e->scheme = (int32_t)rd_u32(t + 12u * j + 4u);
            e->act = (int32_t)rd_u32(t + 12u * j + 8u);
            if (e->owner < 0 || (uint32_t)e->owner >= ne || e->scheme < 0 || e->scheme > 3 ||
                e->act < 0 || e->act > 1 || (e->act == 1 && e->scheme < COLIBRI_QUANT_Q8)) {
                return COLIBRI_ERR_EXPERT;
            }
        }
        for (uint32_t j = 0; j < ne; j++) {
            lm_expert *e = &experts[j];
            if ((uint32_t)experts[e->owner].owner != (uint32_t)e->owner) {
                return COLIBRI_ERR_EXPERT;
            }
            if ((uint32_t)e->owner != j) {
                continue;
            }
            if (e->scheme == COLIBRI_QUANT_F32) { /* the MoE IR layout [in][out] */
                LM_TRY(need_f32(c, 1, dm, f, &e->fw.w1, "layer.%u.expert.%u.w1", (unsigned)l,
                                (unsigned)j));
                LM_TRY(need_f32(c, 1, f, dm, &e->fw.w2, "layer.%u.expert.%u.w2", (unsigned)l,
                                (unsigned)j));
                LM_TRY(need_f32(c, 1, dm, f, &e->fw.w3, "layer.%u.expert.%u.w3", (unsigned)l,
                                (unsigned)j));
                continue;
            }
            set_name(c, "layer.%u.expert.%u.w1", (unsigned)l, (unsigned)j);
            LM_TRY(need_mat(c, e->scheme, 0, f, dm, &e->w[0]));
            set_name(c, "layer.%u.expert.%u.w2", (unsigned)l, (unsigned)j);
            LM_TRY(need_mat(c, e->scheme, 0, dm, f, &e->w[1]));
            set_name(c, "layer.%u.expert.%u.w3", (unsigned)l, (unsigned)j);
            LM_TRY(need_mat(c, e->scheme, 0, f, dm, &e->w[2]));
        }
        ly->experts = experts;
        LM_TRY(need_f32(c, 0, ne, 0u, &ly->heat, "layer.%u.heat", (unsigned)l));
        LM_TRY(heat_check(ly->heat, ne));
        if (d->v[9] == 1) {
            LM_TRY(need_f32(c, 1, dm, 0u, &ly->shared_gate, "layer.%u.shared_gate", (unsigned)l));
        }
    }
    if (ly->ffn_d_ff > 0) {
        const uint32_t f = (uint32_t)ly->ffn_d_ff;
        set_name(c, "layer.%u.ffn.w1", (unsigned)l);
        LM_TRY(need_mat(c, ly->ffn_scheme, 0, f, dm, &ly->ffn[0]));
        set_name(c, "layer.%u.ffn.w2", (unsigned)l);
        LM_TRY(need_mat(c, ly->ffn_scheme, 0, dm, f, &ly->ffn[1]));
        set_name(c, "layer.%u.ffn.w3", (unsigned)l);
        LM_TRY(need_mat(c, ly->ffn_scheme, 0, f, dm, &ly->ffn[2]));
    }
#undef LM_TRY
    return COLIBRI_OK;
}

/* Drop a blob's pages from the mapping (read only, never written: they come back from the
 * file if touched again), so they leave the process's resident set. */
static void drop_pages(const unsigned char *p, uint64_t len)
{
    const long page = sysconf(_SC_PAGESIZE);
    if (page <= 0 || len == 0u) {
        return;
    }
    const uintptr_t a = (uintptr_t)p & ~((uintptr_t)page - 1u);
    (void)madvise((void *)a, (size_t)((uintptr_t)p + len - a), MADV_DONTNEED);
}

/* CRC-32 and NaN / Inf checks; drop_experts (a RAM budget): each routed expert's blob leaves
 * the resident set once checked, so the checks' peak stays the dense weights plus one blob. */
static colibri_status integrity(const unsigned char *base, const lm_entry *entries, uint32_t n,
                                uint32_t load_flags, int drop_experts)
{
    const int check_crc = (load_flags & COLIBRI_LOAD_SKIP_CHECKSUM) == 0u;
    const int check_finite = (load_flags & COLIBRI_LOAD_SKIP_FINITE) == 0u;
    if (!check_crc && !check_finite) {
        return COLIBRI_OK;
    }
    colibri_crc32_tables tables; /* 8 KiB on the stack, as colibri_init */
    if (check_crc) {
        colibri_crc32_tables_init(&tables);
    }
    colibri_status st = COLIBRI_OK;
    for (uint32_t i = 0; i < n && st == COLIBRI_OK; i++) {
        const unsigned char *blob = base + entries[i].offset;
        if (check_crc && colibri_crc32(&tables, blob, entries[i].nbytes) != entries[i].crc) {
            st = COLIBRI_ERR_CHECKSUM;
        } else if (check_finite && entries[i].dtype == DT_F32 &&
                   !colibri_f32_all_finite(blob, entries[i].nbytes / 4u)) {
            st = COLIBRI_ERR_NONFINITE;
        }
        if (drop_experts && strstr(entries[i].name, ".expert.") != NULL) {
            drop_pages(blob, entries[i].nbytes);
        }
    }
    return st;
}

/* Bytes of the arena for the model's dims at max_context positions, `batch` token rows and
 * n_threads scratches, carving it when lm has a block (arena == NULL on the sizing pass: only
 * the size is returned). UINT64_MAX: too big. */
static uint64_t arena_layout(colibri_lm_t *lm, unsigned char *arena)
{
    const lm_header *h = &lm->h;
    const uint64_t d = h->d_model;
    const uint64_t ctx = (uint64_t)lm->max_context;
    const uint64_t ff = (uint64_t)lm->max_ff;
    const uint64_t nact = (uint64_t)lm->act_n;
    const uint64_t b = (uint64_t)lm->batch;
    const uint64_t kk = (uint64_t)lm->max_k;
    const uint64_t nt = (uint64_t)lm->n_threads;
    uint64_t off = 0;
    unsigned char *p = arena;
#define LM_AT(dst, type, bytes)                                                                    \
    do {                                                                                           \
        if (arena != NULL) {                                                                       \
            (dst) = (type *)(void *)(p + off);                                                     \
        }                                                                                          \
        off = add64(off, al16(bytes));                                                             \
    } while (0)
#define LM_REGION(field, type, bytes) LM_AT(lm->field, type, bytes)
    LM_REGION(x, float, mul64(4u * b, d));
    LM_REGION(hbuf, float, mul64(4u * b, d));
    LM_REGION(q, float, mul64(4u * b, (uint64_t)lm->hq));
    LM_REGION(k, float, mul64(4u * b, (uint64_t)lm->hkv));
    LM_REGION(v, float, mul64(4u * b, (uint64_t)lm->hkv));
    LM_REGION(att, float, mul64(4u * b, (uint64_t)lm->hq));
    LM_REGION(proj, float, mul64(4u * b, d));
    LM_REGION(shared, float, mul64(4u * b, d));
    LM_REGION(y_expert, float, mul64(mul64(4u * b, kk), d));
    LM_REGION(ffn_scratch, float, mul64(8u * b, ff));
    LM_REGION(ids, int32_t, mul64(4u * b, kk));
    LM_REGION(gates, float, mul64(4u * b, kk));
    LM_REGION(keys, int32_t, mul64(4u * b, kk));
    LM_REGION(groups, int32_t, add64(mul64(4u * b, kk), 4u));
    LM_REGION(owner, int32_t, mul64(4u * b, kk));
    LM_REGION(load, int64_t, mul64(8u, nt));
    LM_REGION(route_temp, float, 16u);
    LM_REGION(sxq, float, mul64(4u * b, COLIBRI_Q8_BLOCKS(nact)));
    LM_REGION(xq, int8_t, mul64(b, nact));
    LM_REGION(logits, float, 4u * (uint64_t)h->vocab);
    LM_REGION(sample_ws, void, 2u * al16(4u * (uint64_t)h->vocab));
    LM_REGION(kv, float,
              mul64(mul64(mul64(8u, h->n_layers), (uint64_t)lm->hkv), ctx)); /* K and V */
    LM_REGION(scratch, lm_scratch, mul64(nt, sizeof(lm_scratch)));
    for (uint64_t t = 0; t < nt; t++) {
        lm_scratch dummy;
        lm_scratch *sc = arena != NULL ? &lm->scratch[t] : &dummy;
        LM_AT(sc->xin, float, mul64(4u * b, d));
        LM_AT(sc->yout, float, mul64(4u * b, d));
        LM_AT(sc->hh, float, mul64(8u * b, ff));
        LM_AT(sc->sx, float, mul64(4u * b, COLIBRI_Q8_BLOCKS(nact)));
        LM_AT(sc->xq, int8_t, mul64(b, nact));
        LM_AT(sc->scores, float, 4u * ctx);
    }
#undef LM_REGION
#undef LM_AT
    return off;
}

/* ------------------------------------------------------------------------------------------ */
/* Routed experts beyond RAM: slots filled with pread, LRU, prefetch (expert_ram_budget > 0)  */

#define LM_PARTS 6
#define LM_SLOT_ALIGN 64u

typedef struct {
    const unsigned char *src; /* in the mapping: the file offset is src - map */
    uint64_t len;
} lm_part;

static uint64_t mat_w_bytes(const lm_mat *m)
{
    const uint64_t n_out = (uint64_t)m->n_out;
    const uint64_t n_in = (uint64_t)m->n_in;
    switch (m->scheme) {
    case COLIBRI_QUANT_F16:
        return 2u * n_out * n_in;
    case COLIBRI_QUANT_Q8:
        return n_out * n_in;
    case COLIBRI_QUANT_Q4:
        return n_out * ((n_in + 31u) / 32u) * 18u;
    default:
        return 4u * n_out * n_in;
    }
}

/* The stored parts of an expert in a fixed order (expert_rebase sets them in the same one). */
static int expert_parts(const lm_layer *ly, const lm_expert *e, lm_part *p)
{
    int n = 0;
    if (e->scheme == COLIBRI_QUANT_F32) {
        const uint64_t b = 4u * (uint64_t)ly->moe.d_model * (uint64_t)ly->moe.d_ff;
        p[n++] = (lm_part){(const unsigned char *)e->fw.w1, b};
        p[n++] = (lm_part){(const unsigned char *)e->fw.w2, b};
        p[n++] = (lm_part){(const unsigned char *)e->fw.w3, b};
        return n;
    }
    for (int i = 0; i < 3; i++) {
        p[n++] = (lm_part){(const unsigned char *)e->w[i].w, mat_w_bytes(&e->w[i])};
        if (e->w[i].scale != NULL) {
            p[n++] = (lm_part){(const unsigned char *)e->w[i].scale, 4u * (uint64_t)e->w[i].n_out};
        }
    }
    return n;
}

/* Point a copy of an expert's descriptor at dst[i] for part i (expert_parts' order). */
static void expert_rebase(lm_expert *e, unsigned char *const *dst)
{
    if (e->scheme == COLIBRI_QUANT_F32) {
        e->fw.w1 = (const float *)(void *)dst[0];
        e->fw.w2 = (const float *)(void *)dst[1];
        e->fw.w3 = (const float *)(void *)dst[2];
        return;
    }
    int n = 0;
    for (int i = 0; i < 3; i++) {
        e->w[i].w = dst[n++];
        if (e->w[i].scale != NULL) {
            e->w[i].scale = (const float *)(void *)dst[n++];
        }
    }
}

static uint64_t al_slot(uint64_t n)
{
    return (n + (LM_SLOT_ALIGN - 1u)) & ~(uint64_t)(LM_SLOT_ALIGN - 1u);
}

static void cache_free(lm_cache *c)
{
    if (c == NULL) {
        return;
    }
    if (c->fd >= 0) {
        close(c->fd);
    }
    free(c->slots);
    free(c->data);
    free(c->resident);
    free(c);
}

static colibri_status pin_hot(colibri_lm_t *lm, const colibri_lm_config_t *config, int32_t max_k);

/* Sizes of the routed experts (stats.expert_bytes, .slot_bytes); with a budget, the slots
 * (taking fd), the mapping's expert pages dropped and the hottest experts pinned. */
static colibri_status cache_setup(colibri_lm_t *lm, const colibri_lm_config_t *config, int *fd)
{
    uint64_t total = 0, slot = 0, n_owners = 0;
    int32_t max_k = 0;
    lm_part p[LM_PARTS];
    for (uint32_t l = 0; l < lm->h.n_layers; l++) {
        const lm_layer *ly = &lm->layers[l];
        if (!ly->is_moe) {
            continue;
        }
        max_k = ly->top_k > max_k ? ly->top_k : max_k;
        for (int32_t j = 0; j < ly->moe.n_experts; j++) {
            if (ly->experts[j].owner != j) {
                continue;
            }
            const int n = expert_parts(ly, &ly->experts[j], p);
            uint64_t span = 0;
            for (int i = 0; i < n; i++) {
                total += p[i].len;
                span += al_slot(p[i].len);
            }
            slot = span > slot ? span : slot;
            n_owners++;
        }
    }
    lm->stats.expert_bytes = total;
    if (config->expert_ram_budget == 0u || n_owners == 0u) {
        return COLIBRI_OK;
    }
    lm->stats.slot_bytes = slot;
    uint64_t n_slots = config->expert_ram_budget / slot;
    n_slots = n_slots < n_owners ? n_slots : n_owners;
    if (n_slots < (uint64_t)max_k) {
        return COLIBRI_ERR_BUDGET;
    }
    if (mul64(n_slots, slot) >= (uint64_t)SIZE_MAX) {
        return COLIBRI_ERR_NOMEM;
    }
    lm_cache *c = (lm_cache *)calloc(1u, sizeof *c);
    if (c == NULL) {
        return COLIBRI_ERR_NOMEM;
    }
    c->fd = -1;
    c->n_slots = (uint32_t)n_slots;
    c->prefetch = (config->expert_flags & COLIBRI_LM_NO_PREFETCH) == 0u;
    void *data = NULL;
    c->slots = (lm_slot *)calloc((size_t)n_slots, sizeof *c->slots);
    c->resident = (int32_t *)malloc((size_t)lm->n_experts * sizeof *c->resident);
    if (c->slots == NULL || c->resident == NULL ||
        posix_memalign(&data, LM_SLOT_ALIGN, (size_t)(n_slots * slot)) != 0) {
        cache_free(c);
        return COLIBRI_ERR_NOMEM;
    }
    c->data = (unsigned char *)data;
    for (uint64_t s = 0; s < n_slots; s++) {
        c->slots[s].expert = -1;
        c->slots[s].data = c->data + s * slot;
    }
    for (int32_t g = 0; g < lm->n_experts; g++) {
        c->resident[g] = -1;
    }
    /* Nothing reads the experts through the mapping any more: drop any of their pages still
     * there (the checks dropped those they read), so only the slots hold expert bytes. */
    for (uint32_t l = 0; l < lm->h.n_layers; l++) {
        const lm_layer *ly = &lm->layers[l];
        for (int32_t j = 0; ly->is_moe && j < ly->moe.n_experts; j++) {
            if (ly->experts[j].owner != j) {
                continue;
            }
            const int n = expert_parts(ly, &ly->experts[j], p);
            for (int i = 0; i < n; i++) {
                drop_pages(p[i].src, p[i].len);
            }
        }
    }
    lm->stats.n_slots = c->n_slots;
    c->fd = *fd;
    *fd = -1;
    lm->cache = c;
    const colibri_status st = pin_hot(lm, config, max_k);
    if (st != COLIBRI_OK) {
        cache_free(c); /* closes the file */
        lm->cache = NULL;
    }
    return st;
}

/* pread exactly len bytes at off; 0 on success. */
static int pread_all(int fd, unsigned char *dst, uint64_t len, uint64_t off)
{
    while (len > 0u) {
        const size_t chunk = len > (uint64_t)(1u << 30) ? (size_t)(1u << 30) : (size_t)len;
        const ssize_t got = pread(fd, dst, chunk, (off_t)off);
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got <= 0) {
            return -1;
        }
        dst += got;
        len -= (uint64_t)got;
        off += (uint64_t)got;
    }
    return 0;
}

/* Read expert e of layer ly (model-wide index g) from the file into slot s, evicting what it
 * held; bytes_read and evictions counted. */
static colibri_status slot_fill(colibri_lm_t *lm, const lm_layer *ly, const lm_expert *e, int32_t g,
                                uint32_t s)
{
    lm_cache *c = lm->cache;
    lm_slot *sl = &c->slots[s];
    if (sl->expert >= 0) {
        lm->stats.evictions++;
        c->resident[sl->expert] = -1;
        sl->expert = -1;
    }
    sl->ahead = 0;
    lm_part p[LM_PARTS];
    unsigned char *dst[LM_PARTS];
    const int n = expert_parts(ly, e, p);
    uint64_t off = 0;
    const unsigned char *base = (const unsigned char *)lm->map;
    for (int i = 0; i < n; i++) {
        dst[i] = sl->data + off;
        if (pread_all(c->fd, dst[i], p[i].len, (uint64_t)(p[i].src - base)) != 0) {
            return COLIBRI_ERR_IO;
        }
        lm->stats.bytes_read += p[i].len;
        off += al_slot(p[i].len);
    }
    sl->e = *e;
    expert_rebase(&sl->e, dst);
    sl->expert = g;
    sl->used = c->clock;
    c->resident[g] = (int32_t)s;
    return COLIBRI_OK;
}

/* The least recently used slot (a free one first), never a pinned one nor one whose pin is
 * `pin` (0: any); n_slots when there is none. */
static uint32_t slot_victim(const lm_cache *c, uint64_t pin)
{
    uint32_t best = c->n_slots;
    for (uint32_t s = 0; s < c->n_slots; s++) {
        const lm_slot *sl = &c->slots[s];
        if (sl->pinned || (pin != 0u && sl->pin == pin)) {
            continue;
        }
        if (sl->expert < 0) {
            return s;
        }
        if (best == c->n_slots || sl->used < c->slots[best].used) {
            best = s;
        }
    }
    return best;
}

/* A stored expert ranked by its calibration heat (pin_hot). */
typedef struct {
    float heat;
    int32_t layer, owner;
} lm_hot;

/* Hotter first; equal heat: the earlier layer, then the lower expert (a total order). */
static int cmp_hot(const void *a, const void *b)
{
    const lm_hot *x = (const lm_hot *)a;
    const lm_hot *y = (const lm_hot *)b;
    if (x->heat != y->heat) {
        return x->heat > y->heat ? -1 : 1;
    }
    if (x->layer != y->layer) {
        return x->layer < y->layer ? -1 : 1;
    }
    return (x->owner > y->owner) - (x->owner < y->owner);
}

/* Pin the hottest stored experts (calibration heat > 0; a stored expert's heat is the sum over
 * the experts that use its weights) into the first slots, read now and never evicted. How
 * many: none with COLIBRI_LM_NO_PIN or a file without heat; config->pinned_slots 0 (auto):
 * up to half the slots, leaving 2 max_k LRU slots (prefetch) or the sum of top_k (no prefetch);
 * N > 0: up to N (_ARG when the file has no heat).
 * Never more than n_slots - max_k (_BUDGET when N asks for more), so top_k experts of any layer
 * still fit in the LRU slots. */
static colibri_status pin_hot(colibri_lm_t *lm, const colibri_lm_config_t *config, int32_t max_k)
{
    lm_cache *c = lm->cache;
    const uint32_t room = c->n_slots - (uint32_t)max_k; /* cache_setup: n_slots >= max_k */
    const uint32_t asked = (uint32_t)config->pinned_slots;
    if ((config->expert_flags & COLIBRI_LM_NO_PIN) != 0u) {
        return COLIBRI_OK;
    }
    if (asked > room) {
        return COLIBRI_ERR_BUDGET;
    }
    int has_heat = 0;
    uint32_t n_hot = 0;
    for (uint32_t l = 0; l < lm->h.n_layers; l++) {
        const lm_layer *ly = &lm->layers[l];
        for (int32_t j = 0; ly->is_moe && ly->heat != NULL && j < ly->moe.n_experts; j++) {
            has_heat = 1;
            n_hot += ly->experts[j].owner == j ? 1u : 0u;
        }
    }
    if (!has_heat) {
        return asked > 0u ? COLIBRI_ERR_ARG : COLIBRI_OK;
    }
    lm_hot *hot = (lm_hot *)malloc((size_t)n_hot * sizeof *hot); /* bounded by the experts */
    if (hot == NULL) {
        return COLIBRI_ERR_NOMEM;
    }
    uint32_t n = 0;
    for (uint32_t l = 0; l < lm->h.n_layers; l++) {
        const lm_layer *ly = &lm->layers[l];
        for (int32_t j = 0; ly->is_moe && ly->heat != NULL && j < ly->moe.n_experts; j++) {
            if (ly->experts[j].owner != j) {
                continue;
            }
            float h = 0.0f;
            for (int32_t i = 0; i < ly->moe.n_experts; i++) {
                h += ly->experts[i].owner == j ? ly->heat[i] : 0.0f;
            }
            if (h > 0.0f && isfinite(h)) {
                hot[n++] = (lm_hot){h, (int32_t)l, j};
            }
        }
    }
    qsort(hot, n, sizeof *hot, cmp_hot);
    /* auto: half the slots, leaving the LRU slots what their hits come from: with prefetch a
     * layer's top_k experts and the next layer's predicted ones (2 max_k), without it one
     * token's experts of every layer (the sum of top_k), for the next token's reuse. Fewer LRU
     * slots lost more hits than the pinned experts gave (docs/transformer.md). */
    uint32_t keep = 0;
    for (uint32_t l = 0; l < lm->h.n_layers; l++) {
        keep += lm->layers[l].is_moe ? (uint32_t)lm->layers[l].top_k : 0u;
    }
    keep = c->prefetch ? 2u * (uint32_t)max_k : keep;
    uint32_t want = c->n_slots / 2u;
    want = c->n_slots < keep ? 0u : (want < c->n_slots - keep ? want : c->n_slots - keep);
    want = asked > 0u ? asked : want;
    want = want < room ? want : room;
    want = want < n ? want : n;
    colibri_status st = COLIBRI_OK;
    for (uint32_t s = 0; s < want && st == COLIBRI_OK; s++) {
        const lm_layer *ly = &lm->layers[hot[s].layer];
        st = slot_fill(lm, ly, &ly->experts[hot[s].owner], ly->first_expert + hot[s].owner, s);
        c->slots[s].pinned = 1;
        lm->stats.n_pinned = s + 1u;
    }
    free(hot);
    return st;
}

/* A use of the expert a layer routes to as `id` (budget only): a hit when it is in a slot
 * (a prefetch hit when the prefetch put it there for this layer), else a miss that reads it
 * from the file into the least recently used slot. */
static colibri_status expert_use(colibri_lm_t *lm, const lm_layer *ly, int32_t id)
{
    const int32_t owner = ly->experts[id].owner;
    const int32_t g = ly->first_expert + owner;
    lm_cache *c = lm->cache;
    colibri_lm_stats_t *st = &lm->stats;
    c->clock++;
    st->loads++;
    if (c->resident[g] >= 0) {
        lm_slot *sl = &c->slots[c->resident[g]];
        st->hits++;
        st->pinned_hits += sl->pinned ? 1u : 0u;
        if (sl->ahead) {
            st->prefetch_hits++;
            sl->ahead = 0;
        }
        sl->used = c->clock;
        return COLIBRI_OK;
    }
    st->misses++;
    return slot_fill(lm, ly, &ly->experts[owner], g, slot_victim(c, 0u));
}

/* The expert a layer routes to as `id`: in place in the mapping (no budget), else its slot
 * (expert_use made it resident). */
static const lm_expert *expert_at(const colibri_lm_t *lm, const lm_layer *ly, int32_t id)
{
    const int32_t owner = ly->experts[id].owner;
    if (lm->cache == NULL) {
        return &ly->experts[owner];
    }
    const int32_t s = lm->cache->resident[ly->first_expert + owner];
    return s >= 0 ? &lm->cache->slots[s].e : NULL;
}

/* After layer ly made its top_k experts resident, before they compute: the next layer's
 * router on the current hidden state (lm->hbuf) predicts its experts, and those not resident
 * are read into slots now (prefetch loads), so that the next layer finds them there. A
 * prefetch never evicts a slot of this layer's experts nor of another predicted expert (they
 * are pinned for this round); when no other slot is left the rest is not prefetched. The
 * predicted experts already resident are left in their LRU place. No output or status
 * changes: the prediction has its own ids / gates, a slot's bytes are the file's, and a failed
 * read ends the round. */
static void lm_prefetch(colibri_lm_t *lm, const lm_layer *ly, const lm_layer *next)
{
    lm_cache *c = lm->cache;
    if (c == NULL || !c->prefetch || !next->is_moe) {
        return;
    }
    const int32_t k = next->top_k;
    if (k > COLIBRI_MAX_TOP_K || colibri_route(&next->moe, lm->hbuf, 1, k, c->pred_ids,
                                               c->pred_gates, lm->route_temp) != COLIBRI_OK) {
        return;
    }
    const uint64_t pin = ++c->epoch;
    for (int32_t i = 0; ly->is_moe && i < ly->top_k; i++) {
        c->slots[c->resident[ly->first_expert + ly->experts[lm->ids[i]].owner]].pin = pin;
    }
    for (int32_t i = 0; i < k; i++) {
        const int32_t id = c->pred_ids[i];
        if (id < 0 || id >= next->moe.n_experts) {
            c->pred_ids[i] = -1;
            continue;
        }
        const int32_t r = c->resident[next->first_expert + next->experts[id].owner];
        if (r >= 0) {
            c->slots[r].pin = pin;
            c->pred_ids[i] = -1; /* resident: nothing to read */
        }
    }
    for (int32_t i = 0; i < k; i++) {
        const int32_t id = c->pred_ids[i];
        if (id < 0) {
            continue;
        }
        const int32_t owner = next->experts[id].owner;
        const int32_t g = next->first_expert + owner;
        if (c->resident[g] >= 0) {
            continue; /* two ids of one stored expert */
        }
        const uint32_t s = slot_victim(c, pin);
        if (s == c->n_slots) {
            break; /* every slot is pinned */
        }
        c->clock++;
        if (slot_fill(lm, next, &next->experts[owner], g, s) != COLIBRI_OK) {
            break; /* the slot is left free; a use of the expert reads it (and reports) */
        }
        lm->stats.prefetches++;
        c->slots[s].ahead = 1;
        c->slots[s].pin = pin;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Thread pool (num_threads > 1): persistent workers, a short spin, then condition variables */

/* A job: every thread (the caller as tid 0, the workers 1 .. nt - 1) runs fn(lm, arg, tid, nt)
 * once; what each one computes is fixed by (tid, nt) alone, never by timing. */
typedef colibri_status (*lm_job_fn)(colibri_lm_t *lm, void *arg, int32_t tid, int32_t nt);

#ifndef COLIBRI_NO_THREADS
/*
 * A token step hands the pool about twenty jobs (the matrices of each layer, its experts, the LM
 * head), each a few hundred microseconds, separated by short single-threaded steps (norms,
 * routing, attention). A thread blocked in a condition variable takes tens of microseconds to
 * run again once signalled (more on a virtual machine, where an idle vCPU halts), so between
 * the jobs of a step each waiting thread (a worker for the next job, the caller for the
 * workers to finish) first spins on the job counter for up to LM_SPIN_NS, checking the clock
 * every LM_SPIN_CHECK polls (after LM_SPIN_YIELD polls each one yields the core, so that with
 * more threads than free cores the spinning does not hold back the thread still working), and
 * only then blocks on the condition variable. An idle pool (no
 * step running) therefore spins at most LM_SPIN_NS once, then sleeps: no busy waiting when
 * idle. The counters are C11 atomics so the spin may read them without the mutex; every
 * change still happens under the mutex, so the condition-variable protocol is the usual one.
 */
#define LM_SPIN_NS 200000L
#define LM_SPIN_CHECK 64
#define LM_SPIN_YIELD 1024 /* polls with PAUSE / YIELD before each poll yields the core instead */

struct lm_pool {
    colibri_lm_t *lm;
    pthread_mutex_t mu;
    pthread_cond_t wake; /* a new job (gen changed) or stop */
    pthread_cond_t done; /* pending reached 0 */
    lm_job_fn fn;
    void *arg;
    _Atomic uint64_t gen;    /* job counter */
    _Atomic int32_t pending; /* workers still running the current job */
    _Atomic int32_t stop;    /* colibri_lm_free: workers return */
    int32_t n_workers;       /* started */
    colibri_status *status;  /* [n_threads] each thread's status of the current job */
    pthread_t *threads;      /* [n_workers] */
    void *args;              /* [n_workers] lm_worker_arg */
};

typedef struct {
    lm_pool *pool;
    int32_t tid;
} lm_worker_arg;

static void spin_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__) || (defined(__ARM_ARCH) && __ARM_ARCH >= 7)
    __asm__ volatile("yield");
#endif
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + (int64_t)ts.tv_nsec;
}

/* A new job was posted (or the pool stops) since generation `seen`: a worker's wait. */
static int job_posted(lm_pool *pool, uint64_t seen)
{
    return atomic_load_explicit(&pool->gen, memory_order_acquire) != seen ||
           atomic_load_explicit(&pool->stop, memory_order_relaxed) != 0;
}

/* Every worker finished the current job: the caller's wait. */
static int jobs_done(lm_pool *pool, uint64_t seen)
{
    (void)seen;
    return atomic_load_explicit(&pool->pending, memory_order_acquire) == 0;
}

/* Spin until ready(pool, seen), at most LM_SPIN_NS; 1 if it came true while spinning (the
 * caller then takes the mutex without waiting). */
static int pool_spin(lm_pool *pool, int (*ready)(lm_pool *, uint64_t), uint64_t seen)
{
    int64_t start = -1;
    for (int32_t i = 1;; i++) {
        if (ready(pool, seen)) {
            return 1;
        }
        if (i > LM_SPIN_YIELD) {
            sched_yield(); /* more threads than free cores: let the one still working run */
        } else {
            spin_pause();
        }
        if (i % LM_SPIN_CHECK == 0) {
            const int64_t t = now_ns();
            if (start < 0) {
                start = t;
            } else if (t - start > LM_SPIN_NS) {
                return 0;
            }
        }
    }
}

static void *lm_worker(void *p)
{
    lm_pool *pool = ((lm_worker_arg *)p)->pool;
    const int32_t tid = ((lm_worker_arg *)p)->tid;
    uint64_t seen = 0;
    for (;;) {
        (void)pool_spin(pool, job_posted, seen);
        pthread_mutex_lock(&pool->mu);
        while (!pool->stop && pool->gen == seen) {
            pthread_cond_wait(&pool->wake, &pool->mu); /* idle past the spin: blocked */
        }
        if (pool->stop) {
            break;
        }
        seen = pool->gen;
        const lm_job_fn fn = pool->fn;
        void *arg = pool->arg;
        const int32_t nt = pool->n_workers + 1;
        pthread_mutex_unlock(&pool->mu);
        const colibri_status st = fn(pool->lm, arg, tid, nt);
        pthread_mutex_lock(&pool->mu);
        pool->status[tid] = st;
        if (atomic_fetch_sub(&pool->pending, 1) == 1) {
            pthread_cond_signal(&pool->done);
        }
        pthread_mutex_unlock(&pool->mu);
    }
    pthread_mutex_unlock(&pool->mu);
    return NULL;
}

static void pool_free(lm_pool *pool)
{
    if (pool == NULL) {
        return;
    }
    pthread_mutex_lock(&pool->mu);
    pool->stop = 1;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mu);
    for (int32_t i = 0; i < pool->n_workers; i++) {
        pthread_join(pool->threads[i], NULL);
    }
    pthread_cond_destroy(&pool->wake);
    pthread_cond_destroy(&pool->done);
    pthread_mutex_destroy(&pool->mu);
    free(pool->threads);
    free(pool->status);
    free(pool->args);
    free(pool);
}

/* n_threads - 1 workers, blocked until the first job. */
static colibri_status pool_create(colibri_lm_t *lm, lm_pool **out)
{
    *out = NULL;
    const int32_t nw = lm->n_threads - 1;
    lm_pool *pool = (lm_pool *)calloc(1u, sizeof *pool);
    if (pool == NULL) {
        return COLIBRI_ERR_NOMEM;
    }
    pool->lm = lm;
    pool->threads = (pthread_t *)calloc((size_t)nw, sizeof *pool->threads);
    pool->status = (colibri_status *)calloc((size_t)nw + 1u, sizeof *pool->status);
    lm_worker_arg *args = (lm_worker_arg *)calloc((size_t)nw, sizeof *args);
    /* how far the set-up got: 1 mutex, 2 + the wake condition, 3 + the done condition */
    int made = 0;
    if (pool->threads != NULL && pool->status != NULL && args != NULL &&
        pthread_mutex_init(&pool->mu, NULL) == 0) {
        made = 1;
        if (pthread_cond_init(&pool->wake, NULL) == 0) {
            made = 2;
            made += pthread_cond_init(&pool->done, NULL) == 0;
        }
    }
    if (made < 3) {
        if (made == 2) {
            pthread_cond_destroy(&pool->wake);
        }
        if (made >= 1) {
            pthread_mutex_destroy(&pool->mu);
        }
        free(pool->threads);
        free(pool->status);
        free(args);
        free(pool);
        return COLIBRI_ERR_NOMEM;
    }
    pool->args = args; /* freed with the pool */
    for (int32_t i = 0; i < nw; i++) {
        args[i].pool = pool;
        args[i].tid = i + 1;
        if (pthread_create(&pool->threads[i], NULL, lm_worker, &args[i]) != 0) {
            pool_free(pool); /* joins the ones started */
            return COLIBRI_ERR_NOMEM;
        }
        pool->n_workers = i + 1;
    }
    *out = pool;
    return COLIBRI_OK;
}
#else
struct lm_pool {
    int32_t unused;
};

static void pool_free(lm_pool *pool)
{
    (void)pool;
}
#endif /* COLIBRI_NO_THREADS */

/* Run a job on every thread; the first failing status in thread order, else COLIBRI_OK. */
static colibri_status lm_run(colibri_lm_t *lm, lm_job_fn fn, void *arg)
{
#ifndef COLIBRI_NO_THREADS
    lm_pool *pool = lm->pool;
    if (pool != NULL) {
        pthread_mutex_lock(&pool->mu);
        pool->fn = fn;
        pool->arg = arg;
        pool->pending = pool->n_workers;
        pool->gen++;
        pthread_cond_broadcast(&pool->wake);
        pthread_mutex_unlock(&pool->mu);
        colibri_status st = fn(lm, arg, 0, pool->n_workers + 1);
        (void)pool_spin(pool, jobs_done, 0);
        pthread_mutex_lock(&pool->mu);
        while (pool->pending > 0) {
            pthread_cond_wait(&pool->done, &pool->mu);
        }
        for (int32_t i = 1; i <= pool->n_workers && st == COLIBRI_OK; i++) {
            st = pool->status[i];
        }
        pthread_mutex_unlock(&pool->mu);
        return st;
    }
#endif
    return fn(lm, arg, 0, 1);
}

colibri_status colibri_lm_get_stats(const colibri_lm_t *lm, colibri_lm_stats_t *stats)
{
    if (lm == NULL || stats == NULL) {
        return COLIBRI_ERR_ARG;
    }
    *stats = lm->stats;
    return COLIBRI_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Packed matrices: the int8 / int4 matrices that run with int8 activations, copied at init into
 * the layout of the CPU's packed kernels (colibri_x86_pack: x86-64 with AVX-512 VNNI), in one
 * allocation on huge pages where the kernel gives them (a token's matvec streams its matrix from
 * memory; the file's 4 KiB pages cost a TLB miss every 4 KiB: measured on Zen 4, a plain read
 * of 69 MB ran at 17 GB/s from 4 KiB pages and 27 GB/s from 2 MiB ones). The mapped codes are
 * dropped from the resident set once copied (they come back from the file if read again, e.g.
 * the embedding rows of a tied LM head). Routed experts are packed only without a RAM budget
 * (with one they live in slots filled at run time). COLIBRI_LM_PACK=0 in the environment turns
 * it off; every output has the same bits either way. */

#if defined(COLIBRI_X86_DISPATCH)
#define LM_PACK_ALIGN ((size_t)2 << 20)

/* m's packed bytes at *off (64-aligned), packed there when base is not NULL. */
static void pack_mat(lm_mat *m, int32_t act, unsigned char *base, size_t *off)
{
    if (act != 1 || (m->scheme != COLIBRI_QUANT_Q8 && m->scheme != COLIBRI_QUANT_Q4)) {
        return;
    }
    const int32_t kind = (m->scheme == COLIBRI_QUANT_Q4) ? COLIBRI_X86_PACK_Q4
                         : m->blocked                    ? COLIBRI_X86_PACK_Q8B
                                                         : COLIBRI_X86_PACK_Q8;
    const size_t n = colibri_x86_packed_bytes(kind, m->n_out, m->n_in);
    if (n == 0u) {
        return;
    }
    *off = (*off + 63u) & ~(size_t)63u;
    if (base != NULL) {
        colibri_x86_pack(kind, m->w, m->scale, m->n_out, m->n_in, base + *off);
        m->packed = base + *off;
        m->pack_kind = kind;
        const size_t row = (m->scheme == COLIBRI_QUANT_Q4)
                               ? COLIBRI_Q4_BLOCKS(m->n_in) * sizeof(colibri_block_q4_32)
                               : (size_t)m->n_in;
        drop_pages((const unsigned char *)m->w, (uint64_t)row * (uint64_t)m->n_out);
    }
    *off += n;
}

/* Every packable matrix of the model in a fixed order: the bytes (base NULL), or pack them. */
static size_t pack_all(colibri_lm_t *lm, unsigned char *base)
{
    size_t off = 0;
    const int32_t dact =
        (lm->h.dense_scheme == (uint32_t)COLIBRI_QUANT_Q8 && lm->h.dense_act == 1u);
    pack_mat(&lm->lm_head, dact, base, &off);
    for (uint32_t l = 0; l < lm->h.n_layers; l++) {
        lm_layer *ly = &lm->layers[l];
        lm_mat *att[4] = {&ly->wq, &ly->wk, &ly->wv, &ly->wo};
        for (int i = 0; i < 4; i++) {
            pack_mat(att[i], dact, base, &off);
        }
        if (ly->ffn_d_ff > 0) {
            for (int i = 0; i < 3; i++) {
                pack_mat(&ly->ffn[i], ly->ffn_act, base, &off);
            }
        }
        if (ly->is_moe && lm->cache == NULL) {
            for (int32_t j = 0; j < ly->moe.n_experts; j++) {
                lm_expert *e = &ly->experts[j];
                if (e->owner != j || e->scheme == COLIBRI_QUANT_F32) {
                    continue;
                }
                for (int i = 0; i < 3; i++) {
                    pack_mat(&e->w[i], e->act, base, &off);
                }
            }
        }
    }
    return off;
}
#endif

/* Pack what the CPU has packed kernels for (see above); COLIBRI_ERR_NOMEM when it cannot
 * allocate them. */
static colibri_status lm_pack(colibri_lm_t *lm)
{
#if defined(COLIBRI_X86_DISPATCH)
    const char *env = getenv("COLIBRI_LM_PACK");
    if (env != NULL && strcmp(env, "0") == 0) {
        return COLIBRI_OK;
    }
    const size_t bytes = pack_all(lm, NULL);
    if (bytes == 0u) {
        return COLIBRI_OK;
    }
    const size_t total = (bytes + LM_PACK_ALIGN - 1u) & ~(LM_PACK_ALIGN - 1u);
    unsigned char *base = (unsigned char *)aligned_alloc(LM_PACK_ALIGN, total);
    if (base == NULL) {
        return COLIBRI_ERR_NOMEM;
    }
#if defined(MADV_HUGEPAGE)
    (void)madvise(base, total, MADV_HUGEPAGE); /* before the first write; a hint */
#endif
    (void)pack_all(lm, base);
    lm->packed = base;
    lm->packed_bytes = total;
#else
    (void)lm;
#endif
    return COLIBRI_OK;
}

colibri_status colibri_lm_init(const colibri_lm_config_t *config, colibri_lm_t **out)
{
    if (out == NULL) {
        return COLIBRI_ERR_ARG;
    }
    *out = NULL;
    if (config == NULL || config->model_path == NULL || config->max_context < 0 ||
        config->num_threads < 0 || config->num_threads > LM_MAX_THREADS ||
        config->prefill_batch < 0 || config->prefill_batch > LM_MAX_BATCH ||
        config->pinned_slots < 0) {
        return COLIBRI_ERR_ARG;
    }
#ifdef COLIBRI_NO_THREADS
    if (config->num_threads > 1) {
        return COLIBRI_ERR_UNSUPPORTED;
    }
#endif
    int fd = open(config->model_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return COLIBRI_ERR_IO;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size < 0 ||
        (uint64_t)sb.st_size > (uint64_t)SIZE_MAX) {
        close(fd);
        return COLIBRI_ERR_IO;
    }
    const size_t size = (size_t)sb.st_size;
    if (size < LM_HEADER_BYTES) {
        close(fd);
        return COLIBRI_ERR_TRUNCATED;
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        close(fd);
        return COLIBRI_ERR_IO;
    }
    const unsigned char *base = (const unsigned char *)map;
    colibri_lm_t tmp;
    memset(&tmp, 0, sizeof tmp);
    lm_entry *entries = NULL;
    unsigned char *block = NULL;
    lm_desc *descs = NULL;
    colibri_status st = header_read(base, size, &tmp.h);
    if (st != COLIBRI_OK) {
        goto fail;
    }
    const lm_header *h = &tmp.h;
    if (config->max_context > (int32_t)h->max_context) {
        st = COLIBRI_ERR_ARG; /* the RoPE tables end at the file's max_context */
        goto fail;
    }
    /* Entries and descriptors are bounded by the file (96 and 40 bytes of it each). */
    entries = (lm_entry *)malloc((size_t)h->n_tensors * sizeof *entries);
    descs = (lm_desc *)malloc((size_t)h->n_layers * sizeof *descs);
    if (entries == NULL || descs == NULL) {
        st = COLIBRI_ERR_NOMEM;
        goto fail;
    }
    st = table_read(base, h, entries);
    if (st != COLIBRI_OK) {
        goto fail;
    }
    qsort(entries, h->n_tensors, sizeof *entries, cmp_entry);
    for (uint32_t i = 1; i < h->n_tensors; i++) {
        if (strcmp(entries[i - 1].name, entries[i].name) == 0) {
            st = COLIBRI_ERR_FORMAT; /* duplicated tensor */
            goto fail;
        }
    }
    lm_ctx c = {base, entries, h->n_tensors, {0}};
    tmp.hq = (int32_t)(h->n_heads * h->head_dim);
    tmp.hkv = (int32_t)(h->n_kv_heads * h->head_dim);
    tmp.max_context = config->max_context > 0 ? config->max_context : (int32_t)h->max_context;
    uint64_t n_experts = 0;
    int32_t max_ff = 1;
    int32_t max_k = 1;
    for (uint32_t l = 0; l < h->n_layers; l++) {
        st = read_desc(&c, h, l, &descs[l]);
        if (st != COLIBRI_OK) {
            goto fail;
        }
        if (descs[l].v[0] == 1) {
            n_experts += (uint64_t)descs[l].v[1];
            max_ff = descs[l].v[3] > max_ff ? descs[l].v[3] : max_ff;
            max_k = descs[l].v[2] > max_k ? descs[l].v[2] : max_k;
        }
        max_ff = descs[l].v[6] > max_ff ? descs[l].v[6] : max_ff;
    }
    tmp.max_ff = max_ff;
    tmp.max_k = max_k;
    tmp.n_threads = config->num_threads > 1 ? config->num_threads : 1;
    tmp.par_min_work = LM_PAR_MIN_WORK;
    const char *min_work = getenv("COLIBRI_LM_PAR_MIN_WORK");
    if (min_work != NULL && min_work[0] >= '0' && min_work[0] <= '9') {
        tmp.par_min_work = strtoull(min_work, NULL, 10);
    }
    tmp.batch = config->prefill_batch > 0 ? config->prefill_batch : LM_DEFAULT_BATCH;
    tmp.batch = tmp.batch < tmp.max_context ? tmp.batch : tmp.max_context;
    int32_t act_n = (int32_t)h->d_model > tmp.hq ? (int32_t)h->d_model : tmp.hq;
    tmp.act_n = act_n > max_ff ? act_n : max_ff;
    /* One block: descriptor, layers, experts, arena (16-aligned regions). */
    const uint64_t head = al16(sizeof(colibri_lm_t));
    const uint64_t layers_bytes = al16(mul64(h->n_layers, sizeof(lm_layer)));
    const uint64_t experts_bytes = al16(mul64(n_experts, sizeof(lm_expert)));
    const uint64_t arena = arena_layout(&tmp, NULL);
    const uint64_t total = add64(add64(add64(head, layers_bytes), experts_bytes), arena);
    if (total >= (uint64_t)SIZE_MAX || arena == UINT64_MAX) {
        st = COLIBRI_ERR_NOMEM;
        goto fail;
    }
    block = (unsigned char *)malloc((size_t)total); /* 16-aligned regions: malloc's alignment */
    if (block == NULL) {
        st = COLIBRI_ERR_NOMEM;
        goto fail;
    }
    colibri_lm_t *lm = (colibri_lm_t *)(void *)block;
    *lm = tmp;
    lm->map = map;
    lm->map_size = size;
    lm->layers = (lm_layer *)(void *)(block + head);
    lm_expert *experts = (lm_expert *)(void *)(block + head + layers_bytes);
    lm->arena_bytes = (size_t)arena;
    lm->experts = experts;
    lm->n_experts = (int32_t)n_experts;
    arena_layout(lm, block + head + layers_bytes + experts_bytes);
    /* Global tensors. */
    const int32_t ds = (int32_t)h->dense_scheme;
    set_name(&c, "embed");
    st = need_mat(&c, ds, ds == COLIBRI_QUANT_Q8, h->vocab, h->d_model, &lm->embed);
    if (st == COLIBRI_OK && (h->flags & LM_FLAG_TIED) == 0u) {
        set_name(&c, "lm_head");
        st = need_mat(&c, ds, ds == COLIBRI_QUANT_Q8, h->vocab, h->d_model, &lm->lm_head);
    } else {
        lm->lm_head = lm->embed;
    }
    if (st == COLIBRI_OK) {
        st = need_f32(&c, 1, h->d_model, 0u, &lm->final_norm, "final_norm");
    }
    if (st == COLIBRI_OK) {
        st = need_f32(&c, 1, h->max_context, h->head_dim / 2u, &lm->rope_cos, "rope.cos");
    }
    if (st == COLIBRI_OK) {
        st = need_f32(&c, 1, h->max_context, h->head_dim / 2u, &lm->rope_sin, "rope.sin");
    }
    for (uint32_t l = 0; l < h->n_layers && st == COLIBRI_OK; l++) {
        st = bind_layer(&c, lm, l, &descs[l], experts);
        lm->layers[l].first_expert = (int32_t)(experts - lm->experts);
        if (descs[l].v[0] == 1) {
            experts += descs[l].v[1];
        }
    }
    if (st == COLIBRI_OK) {
        st = integrity(base, entries, h->n_tensors, config->load_flags,
                       config->expert_ram_budget > 0u);
    }
    if (st == COLIBRI_OK) {
        st = cache_setup(lm, config, &fd); /* takes fd with a budget */
    }
    if (st == COLIBRI_OK) {
        st = lm_pack(lm);
    }
#ifndef COLIBRI_NO_THREADS
    if (st == COLIBRI_OK && lm->n_threads > 1) {
        st = pool_create(lm, &lm->pool); /* last: nothing after it can fail */
    }
#endif
    if (st != COLIBRI_OK) {
        goto fail;
    }
    if (fd >= 0) {
        close(fd);
    }
    free(entries);
    free(descs);
    *out = lm;
    return COLIBRI_OK;
fail:
    close(fd);
    if (block != NULL) {
        cache_free(((colibri_lm_t *)(void *)block)->cache);
        free(((colibri_lm_t *)(void *)block)->packed);
    }
    free(block);
    free(entries);
    free(descs);
    munmap(map, size);
    return st;
}

void colibri_lm_free(colibri_lm_t *lm)
{
    if (lm == NULL) {
        return;
    }
    pool_free(lm->pool); /* wakes the idle workers, joins them */
    cache_free(lm->cache);
    free(lm->packed);
    munmap(lm->map, lm->map_size);
    free(lm);
}

colibri_status colibri_lm_info(const colibri_lm_t *lm, colibri_lm_info_t *info)
{
    if (lm == NULL || info == NULL) {
        return COLIBRI_ERR_ARG;
    }
    info->vocab_size = (int32_t)lm->h.vocab;
    info->d_model = (int32_t)lm->h.d_model;
    info->n_layers = (int32_t)lm->h.n_layers;
    info->max_context = lm->max_context;
    info->arena_bytes = lm->arena_bytes;
    info->weight_bytes = lm->map_size;
    info->packed_bytes = lm->packed_bytes;
    return COLIBRI_OK;
}

void *colibri_lm_sampler_workspace(colibri_lm_t *lm)
{
    return lm != NULL ? lm->sample_ws : NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* The token step: transformer_model.c.j2, operation for operation, on n token rows           */

/* Below lm->par_min_work multiply-adds (LM_PAR_MIN_WORK; the environment variable
 * COLIBRI_LM_PAR_MIN_WORK, read by colibri_lm_init, replaces it: 0 splits every job, which the
 * tests use so that tiny models exercise every split) a job runs on the calling thread alone
 * (same bits: what a row computes never depends on the split). */
static colibri_status lm_run_sized(colibri_lm_t *lm, lm_job_fn fn, void *arg, uint64_t work)
{
    if (work < lm->par_min_work) {
        return fn(lm, arg, 0, 1);
    }
    return lm_run(lm, fn, arg);
}

/* Rows [*r0, *r1) of n for thread tid of nt: contiguous ranges, a multiple of 32 rows each
 * (the last shorter), fixed by (n, tid, nt). */
static void lm_rows(int32_t n, int32_t tid, int32_t nt, int32_t *r0, int32_t *r1)
{
    int32_t per = (n + nt - 1) / nt;
    per = (per + 31) & ~31;
    const int64_t a = (int64_t)tid * per;
    *r0 = a < n ? (int32_t)a : n;
    *r1 = (int64_t)*r0 + per < (int64_t)n ? *r0 + per : n;
}

/* Rows [r0, r1) of y = W x (+ b) for n_tok activation rows of m->n_in values (x fp32; xq / sx
 * their int8 rows when act == 1), output row t at y + t * ldy. Each output is what the token
 * step's kernel (colibri_matvec_*, colibri_matmul_* row t, colibri_linear_f32) gives it, so
 * the result does not depend on the row split nor on n_tok. */
static void mat_rows(const lm_mat *m, int32_t act, const float *b, const float *x, const int8_t *xq,
                     const float *sx, float *y, int32_t ldy, int32_t r0, int32_t r1, int32_t n_tok)
{
    const int32_t n_in = m->n_in;
    const int32_t cnt = r1 - r0;
    if (cnt <= 0 || n_tok <= 0) {
        return;
    }
    const size_t ro = (size_t)r0;
    const size_t ni = (size_t)n_in;
    float *yo = y + ro;
#if defined(COLIBRI_X86_DISPATCH)
    if (m->packed != NULL && act == 1) { /* r0: a multiple of 32 (lm_rows) */
        const float *rs = (m->pack_kind == COLIBRI_X86_PACK_Q8) ? m->scale + ro : NULL;
        colibri_x86_matmul_packed(m->pack_kind, m->packed, rs, m->n_out, n_in, r0, r1, xq, sx, yo,
                                  ldy, n_tok);
        goto bias;
    }
#endif
    switch (m->scheme) {
    case COLIBRI_QUANT_F32: {
        const float *w = (const float *)m->w + ro * ni;
        for (int32_t t = 0; t < n_tok; t++) {
            colibri_linear_f32(x + (size_t)t * ni, w, b != NULL ? b + ro : NULL,
                               yo + (size_t)t * (size_t)ldy, n_in, cnt);
        }
        return;
    }
    case COLIBRI_QUANT_F16: {
        const uint16_t *w = (const uint16_t *)m->w + ro * ni;
        if (n_tok == 1) {
            colibri_matvec_f16_f32(w, x, yo, cnt, n_in);
        } else {
            colibri_matmul_f16_f32(w, x, yo, ldy, cnt, n_in, n_tok);
        }
        break;
    }
    case COLIBRI_QUANT_Q8: {
        const int8_t *w = (const int8_t *)m->w + ro * ni;
        if (m->blocked) {
            const float *sc = m->scale + ro * COLIBRI_Q8_BLOCKS(n_in);
            if (act == 1 && n_tok == 1) {
                colibri_matvec_q8b_q8(w, sc, xq, sx, yo, cnt, n_in);
            } else if (act == 1) {
                colibri_matmul_q8b_q8(w, sc, xq, sx, yo, ldy, cnt, n_in, n_tok);
            } else if (n_tok == 1) {
                colibri_matvec_q8b_f32(w, sc, x, yo, cnt, n_in);
            } else {
                colibri_matmul_q8b_f32(w, sc, x, yo, ldy, cnt, n_in, n_tok);
            }
        } else {
            const float *sc = m->scale + ro;
            if (act == 1 && n_tok == 1) {
                colibri_matvec_q8_q8(w, sc, xq, sx, yo, cnt, n_in);
            } else if (act == 1) {
                colibri_matmul_q8_q8(w, sc, xq, sx, yo, ldy, cnt, n_in, n_tok);
            } else if (n_tok == 1) {
                colibri_matvec_q8_f32(w, sc, x, yo, cnt, n_in);
            } else {
                colibri_matmul_q8_f32(w, sc, x, yo, ldy, cnt, n_in, n_tok);
            }
        }
        break;
    }
    default: {
        const colibri_block_q4_32 *w =
            (const colibri_block_q4_32 *)m->w + ro * COLIBRI_Q4_BLOCKS(n_in);
        if (act == 1 && n_tok == 1) {
            colibri_matvec_q4_q8(w, xq, sx, yo, cnt, n_in);
        } else if (act == 1) {
            colibri_matmul_q4_q8(w, xq, sx, yo, ldy, cnt, n_in, n_tok);
        } else if (n_tok == 1) {
            colibri_matvec_q4_f32(w, x, yo, cnt, n_in);
        } else {
            colibri_matmul_q4_f32(w, x, yo, ldy, cnt, n_in, n_tok);
        }
        break;
    }
    }
#if defined(COLIBRI_X86_DISPATCH)
bias:
#endif
    if (b != NULL) {
        for (int32_t t = 0; t < n_tok; t++) {
            float *yt = y + (size_t)t * (size_t)ldy;
            for (int32_t o = r0; o < r1; ++o) {
                yt[o] += b[o];
            }
        }
    }
}

/* Quantise n rows of n_in values (row stride n_in) to int8 rows (codes stride n_in, scales
 * stride COLIBRI_Q8_BLOCKS(n_in)). */
static void quantize_rows(const float *x, int8_t *xq, float *sx, int32_t n_in, int32_t n)
{
    for (int32_t t = 0; t < n; t++) {
        colibri_quantize_row_q8(x + (size_t)t * (size_t)n_in, xq + (size_t)t * (size_t)n_in,
                                sx + (size_t)t * COLIBRI_Q8_BLOCKS(n_in), n_in);
    }
}

/* Up to three matrices with the same input rows, each one's output rows split over the
 * threads. */
typedef struct {
    const lm_mat *m[3];
    const float *b[3];
    float *y[3];
    int32_t n_mats, act, n_tok;
    const float *x;
    const int8_t *xq;
    const float *sx;
} lm_lin_job;

static colibri_status job_lin(colibri_lm_t *lm, void *arg, int32_t tid, int32_t nt)
{
    (void)lm;
    const lm_lin_job *j = (const lm_lin_job *)arg;
    for (int32_t i = 0; i < j->n_mats; i++) {
        int32_t r0, r1;
        lm_rows(j->m[i]->n_out, tid, nt, &r0, &r1);
        mat_rows(j->m[i], j->act, j->b[i], j->x, j->xq, j->sx, j->y[i], j->m[i]->n_out, r0, r1,
                 j->n_tok);
    }
    return COLIBRI_OK;
}

static colibri_status lin_run(colibri_lm_t *lm, lm_lin_job *j)
{
    uint64_t work = 0;
    for (int32_t i = 0; i < j->n_mats; i++) {
        work += (uint64_t)j->m[i]->n_out * (uint64_t)j->m[i]->n_in * (uint64_t)j->n_tok;
    }
    return lm_run_sized(lm, job_lin, j, work);
}

/* The dense matrices (attention, LM head) on n rows of x: the generated <name>_linear, or
 * colibri_linear_f32 for fp32 models; int8 activations quantised once for all threads. */
static colibri_status lm_linear(colibri_lm_t *lm, int32_t n_mats, const lm_mat *const *m,
                                const float *const *b, float *const *y, const float *x,
                                int32_t n_tok)
{
    lm_lin_job j;
    memset(&j, 0, sizeof j);
    j.n_mats = n_mats;
    for (int32_t i = 0; i < n_mats; i++) {
        j.m[i] = m[i];
        j.b[i] = b[i];
        j.y[i] = y[i];
    }
    j.n_tok = n_tok;
    j.x = x;
    j.act = (m[0]->scheme == COLIBRI_QUANT_Q8 && lm->h.dense_act == 1u) ? 1 : 0;
    if (j.act == 1) {
        quantize_rows(x, lm->xq, lm->sxq, m[0]->n_in, n_tok);
    }
    j.xq = lm->xq;
    j.sx = lm->sxq;
    return lin_run(lm, &j);
}

/* SwiGLU of n rows with w1 / w2 / w3 [out][in] in any scheme (fp32: colibri_swiglu_f32's
 * operations; else the generated <name>_ffn_<scheme>_<act>_f<d_ff> kernel), on the calling
 * thread: hh holds 2 * n * d_ff floats, xq / sx n int8 rows of max(d, d_ff). */
static void ffn_rows(const lm_mat *w, int32_t act, const float *x, float *y, int32_t n, float *hh,
                     int8_t *xq, float *sx)
{
    const int32_t d = w[0].n_in;
    const int32_t f = w[0].n_out;
    float *g = hh + (size_t)n * (size_t)f;
    if (act == 1) {
        quantize_rows(x, xq, sx, d, n);
    }
    mat_rows(&w[0], act, NULL, x, xq, sx, hh, f, 0, f, n);
    mat_rows(&w[2], act, NULL, x, xq, sx, g, f, 0, f, n);
    colibri_silu_mul_f32(hh, g, (size_t)n * (size_t)f);
    if (act == 1) {
        quantize_rows(hh, xq, sx, f, n);
    }
    mat_rows(&w[1], act, NULL, hh, xq, sx, y, d, 0, d, n);
}

/* Dense MLP / shared expert on n rows, every matrix's output rows split over the threads. */
static colibri_status lm_dense_ffn(colibri_lm_t *lm, const lm_layer *ly, const float *x, float *y,
                                   int32_t n)
{
    const int32_t f = ly->ffn_d_ff;
    const int32_t d = (int32_t)lm->h.d_model;
    const int32_t act = ly->ffn_scheme == COLIBRI_QUANT_F32 ? 0 : ly->ffn_act;
    float *hh = lm->ffn_scratch;
    float *g = hh + (size_t)n * (size_t)f;
    lm_lin_job j;
    memset(&j, 0, sizeof j);
    j.act = act;
    j.n_tok = n;
    j.xq = lm->xq;
    j.sx = lm->sxq;
    if (act == 1) {
        quantize_rows(x, lm->xq, lm->sxq, d, n);
    }
    j.n_mats = 2;
    j.m[0] = &ly->ffn[0];
    j.m[1] = &ly->ffn[2];
    j.y[0] = hh;
    j.y[1] = g;
    j.x = x;
    colibri_status st = lin_run(lm, &j);
    if (st != COLIBRI_OK) {
        return st;
    }
    colibri_silu_mul_f32(hh, g, (size_t)n * (size_t)f);
    if (act == 1) {
        quantize_rows(hh, lm->xq, lm->sxq, f, n);
    }
    j.n_mats = 1;
    j.m[0] = &ly->ffn[1];
    j.y[0] = y;
    j.x = hh;
    return lin_run(lm, &j);
}

/* The attention proper of n rows (q / k / v already normed, clipped and rotated), split over
 * the threads by KV head: the cache is [kv head][position][head_dim], so a range of KV heads
 * and their query heads is an attention of its own, with its own part of the cache; each
 * thread runs its range for the n rows in order (row t writes its K / V row, then attends to
 * the rows before it), with its own scores. The same operations per head as one thread. */
typedef struct {
    const colibri_attention_shape_t *shape;
    float *kc, *vc;
    int32_t pos0, n;
} lm_att_job;

static colibri_status job_att(colibri_lm_t *lm, void *arg, int32_t tid, int32_t nt)
{
    const lm_att_job *j = (const lm_att_job *)arg;
    const int32_t n_kv = j->shape->n_kv_heads;
    const int32_t g0 = (int32_t)((int64_t)n_kv * tid / nt);
    const int32_t g1 = (int32_t)((int64_t)n_kv * (tid + 1) / nt);
    if (g1 <= g0) {
        return COLIBRI_OK;
    }
    const int32_t group = j->shape->n_heads / n_kv;
    colibri_attention_shape_t part = *j->shape;
    part.n_kv_heads = g1 - g0;
    part.n_heads = (g1 - g0) * group;
    const size_t hd = (size_t)part.head_dim;
    const size_t qo = (size_t)g0 * (size_t)group * hd; /* first query head's offset */
    const size_t ko = (size_t)g0 * hd;
    const size_t co = (size_t)g0 * (size_t)part.max_context * hd;
    for (int32_t t = 0; t < j->n; t++) {
        const colibri_status st = colibri_attention_f32(
            &part, j->pos0 + t, lm->q + (size_t)t * (size_t)lm->hq + qo,
            lm->k + (size_t)t * (size_t)lm->hkv + ko, lm->v + (size_t)t * (size_t)lm->hkv + ko,
            j->kc + co, j->vc + co, lm->scratch[tid].scores,
            lm->att + (size_t)t * (size_t)lm->hq + qo);
        if (st != COLIBRI_OK) {
            return st;
        }
    }
    return COLIBRI_OK;
}

/* Attention of n rows at positions pos0 .. pos0 + n - 1, one after the other: each writes its
 * K / V row and attends to the rows before it, as n token steps would. */
static colibri_status lm_attention(colibri_lm_t *lm, const lm_layer *ly, int32_t l, int32_t pos0,
                                   int32_t n)
{
    const lm_header *h = &lm->h;
    const colibri_attention_shape_t shape = {
        .n_heads = (int32_t)h->n_heads,
        .n_kv_heads = (int32_t)h->n_kv_heads,
        .head_dim = (int32_t)h->head_dim,
        .max_context = lm->max_context,
        .window = (int32_t)h->window,
    };
    const size_t kv_floats = (size_t)lm->hkv * (size_t)lm->max_context;
    float *kc = lm->kv + (size_t)l * 2u * kv_floats;
    const lm_mat *m[3] = {&ly->wq, &ly->wk, &ly->wv};
    const float *b[3] = {ly->bq, ly->bk, ly->bv};
    float *y[3] = {lm->q, lm->k, lm->v};
    colibri_status st = lm_linear(lm, 3, m, b, y, lm->hbuf, n);
    if (st != COLIBRI_OK) {
        return st;
    }
    const size_t half = h->head_dim / 2u;
    for (int32_t t = 0; t < n; t++) {
        float *q = lm->q + (size_t)t * (size_t)lm->hq;
        float *k = lm->k + (size_t)t * (size_t)lm->hkv;
        float *v = lm->v + (size_t)t * (size_t)lm->hkv;
        const int32_t pos = pos0 + t;
        if (ly->q_norm != NULL) {
            colibri_rmsnorm_f32(q, ly->q_norm, q, lm->hq, h->eps);
            colibri_rmsnorm_f32(k, ly->k_norm, k, lm->hkv, h->eps);
        }
        if ((h->flags & LM_FLAG_CLIP) != 0u) {
            colibri_clip_f32(q, lm->hq, h->clip);
            colibri_clip_f32(k, lm->hkv, h->clip);
            colibri_clip_f32(v, lm->hkv, h->clip);
        }
        const float *cs = lm->rope_cos + (size_t)pos * half;
        const float *sn = lm->rope_sin + (size_t)pos * half;
        colibri_rope_f32(q, (int32_t)h->n_heads, (int32_t)h->head_dim, cs, sn);
        colibri_rope_f32(k, (int32_t)h->n_kv_heads, (int32_t)h->head_dim, cs, sn);
    }
    lm_att_job j = {&shape, kc, kc + kv_floats, pos0, n};
    /* multiply-adds: q.k and p.v over the rows attended to, per query head */
    const uint64_t work = 2u * (uint64_t)n * (uint64_t)lm->hq * (uint64_t)(pos0 + n);
    st = lm_run_sized(lm, job_att, &j, work);
    if (st != COLIBRI_OK) {
        return st;
    }
    const lm_mat *mo[1] = {&ly->wo};
    const float *bo[1] = {ly->bo};
    float *yo[1] = {lm->proj};
    return lm_linear(lm, 1, mo, bo, yo, lm->att, n);
}

/* The routed experts of a layer for n rows, grouped by expert: lm->keys (id * n + row, sorted)
 * in runs lm->groups[g] .. lm->groups[g + 1]; each expert runs once on its rows (one GEMM per
 * matrix), and its output row for (row, slot) goes to y_expert[row][slot]. */
typedef struct {
    const lm_layer *ly;
    const float *x;
    int32_t n, n_groups;
} lm_moe_job;

static colibri_status job_moe(colibri_lm_t *lm, void *arg, int32_t tid, int32_t nt)
{
    const lm_moe_job *j = (const lm_moe_job *)arg;
    const lm_layer *ly = j->ly;
    const int32_t n = j->n;
    const size_t d = (size_t)lm->h.d_model;
    const int32_t kk = lm->max_k;
    lm_scratch *sc = &lm->scratch[tid];
    for (int32_t g = 0; g < j->n_groups; g++) {
        if ((nt > 1 ? lm->owner[g] : 0) != tid) {
            continue;
        }
        const int32_t first = lm->groups[g];
        const int32_t cnt = lm->groups[g + 1] - first;
        const int32_t id = lm->keys[first] / n;
        const lm_expert *e = expert_at(lm, ly, id);
        if (e == NULL) {
            return COLIBRI_ERR_EXPERT; /* not reached: expert_use made it resident */
        }
        for (int32_t r = 0; r < cnt; r++) {
            const int32_t t = lm->keys[first + r] % n;
            memcpy(sc->xin + (size_t)r * d, j->x + (size_t)t * d, d * sizeof(float));
        }
        if (e->scheme == COLIBRI_QUANT_F32) {
            colibri_expert_ffn_f32(&ly->moe, &e->fw, sc->xin, sc->yout, cnt, sc->hh);
        } else {
            ffn_rows(e->w, e->act, sc->xin, sc->yout, cnt, sc->hh, sc->xq, sc->sx);
        }
        for (int32_t r = 0; r < cnt; r++) {
            const int32_t t = lm->keys[first + r] % n;
            const int32_t *ids = lm->ids + (size_t)t * (size_t)kk;
            int32_t slot = 0;
            while (slot < ly->top_k - 1 && ids[slot] != id) {
                slot++;
            }
            memcpy(lm->y_expert + ((size_t)t * (size_t)kk + (size_t)slot) * d,
                   sc->yout + (size_t)r * d, d * sizeof(float));
        }
    }
    return COLIBRI_OK;
}

static int cmp_i32(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a;
    const int32_t y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* The MoE block for n rows: colibri_route per row, then colibri_sparse_forward's order per row
 * (experts in ascending id, out = 0 + sum g * y). With a budget n is 1. */
static colibri_status lm_moe(colibri_lm_t *lm, lm_layer *ly, const lm_layer *next, const float *x,
                             float *out, int32_t n)
{
    const int32_t k = ly->top_k;
    const int32_t d = (int32_t)lm->h.d_model;
    const int32_t kk = lm->max_k;
    colibri_status st;
    for (int32_t t = 0; t < n; t++) {
        int32_t *ids = lm->ids + (size_t)t * (size_t)kk;
        float *gates = lm->gates + (size_t)t * (size_t)kk;
        st = colibri_route(&ly->moe, x + (size_t)t * (size_t)d, 1, k, ids, gates, lm->route_temp);
        if (st != COLIBRI_OK) {
            return st;
        }
        for (int32_t i = 1; i < k; ++i) { /* insertion sort by expert id, gates along */
            const int32_t id = ids[i];
            const float g = gates[i];
            int32_t j = i - 1;
            for (; j >= 0 && ids[j] > id; --j) {
                ids[j + 1] = ids[j];
                gates[j + 1] = gates[j];
            }
            ids[j + 1] = id;
            gates[j + 1] = g;
        }
        for (int32_t i = 0; i < k; ++i) {
            if (ids[i] < 0 || ids[i] >= ly->moe.n_experts || (i > 0 && ids[i] == ids[i - 1])) {
                return COLIBRI_ERR_EXPERT;
            }
        }
    }
    if (lm->cache != NULL) {
        /* all top_k resident first (n_slots >= top_k and LRU: none evicts another of them),
         * then the next layer's prefetch, which leaves them in place */
        for (int32_t i = 0; i < k; ++i) {
            st = expert_use(lm, ly, lm->ids[i]);
            if (st != COLIBRI_OK) {
                return st;
            }
        }
        if (next != NULL) {
            lm_prefetch(lm, ly, next);
        }
    }
    int32_t nk = 0;
    for (int32_t t = 0; t < n; t++) {
        for (int32_t i = 0; i < k; ++i) {
            lm->keys[nk++] = lm->ids[(size_t)t * (size_t)kk + (size_t)i] * n + t;
        }
    }
    qsort(lm->keys, (size_t)nk, sizeof *lm->keys, cmp_i32);
    int32_t ng = 0;
    for (int32_t i = 0; i < nk; i++) {
        if (i == 0 || lm->keys[i] / n != lm->keys[i - 1] / n) {
            lm->groups[ng++] = i;
        }
    }
    lm->groups[ng] = nk;
    /* Each run to a thread, largest first, to the least loaded (lowest tid on ties): fixed
     * by the routing alone (and which thread runs an expert never changes its output). */
    const int32_t nt = lm->pool != NULL ? lm->n_threads : 1;
    for (int32_t t = 0; t < nt; t++) {
        lm->load[t] = 0;
    }
    for (int32_t g = 0; g < ng; g++) {
        lm->owner[g] = -1;
    }
    for (int32_t left = ng; left > 0; left--) {
        int32_t best = -1;
        for (int32_t g = 0; g < ng; g++) {
            if (lm->owner[g] < 0 && (best < 0 || lm->groups[g + 1] - lm->groups[g] >
                                                     lm->groups[best + 1] - lm->groups[best])) {
                best = g;
            }
        }
        int32_t to = 0;
        for (int32_t t = 1; t < nt; t++) {
            to = lm->load[t] < lm->load[to] ? t : to;
        }
        lm->owner[best] = to;
        lm->load[to] += lm->groups[best + 1] - lm->groups[best];
    }
    lm_moe_job j = {ly, x, n, ng};
    st = ng > 1 ? lm_run(lm, job_moe, &j) : job_moe(lm, &j, 0, 1);
    if (st != COLIBRI_OK) {
        return st;
    }
    for (int32_t t = 0; t < n; t++) {
        float *o = out + (size_t)t * (size_t)d;
        const float *gates = lm->gates + (size_t)t * (size_t)kk;
        for (int32_t i = 0; i < d; ++i) {
            o[i] = 0.0f;
        }
        for (int32_t s = 0; s < k; ++s) {
            const float g = gates[s];
            const float *ye = lm->y_expert + ((size_t)t * (size_t)kk + (size_t)s) * (size_t)d;
            for (int32_t i = 0; i < d; ++i) {
                o[i] += g * ye[i];
            }
        }
    }
    if (lm->cache != NULL) { /* prefetches not used by this layer count no more */
        const lm_cache *c = lm->cache;
        for (uint32_t s = 0; s < c->n_slots; s++) {
            lm_slot *sl = &c->slots[s];
            if (sl->ahead && sl->expert >= ly->first_expert &&
                sl->expert < ly->first_expert + ly->moe.n_experts) {
                sl->ahead = 0;
            }
        }
    }
    return COLIBRI_OK;
}

static colibri_status lm_ffn(colibri_lm_t *lm, lm_layer *ly, const lm_layer *next, int32_t n)
{
    const int32_t d = (int32_t)lm->h.d_model;
    const size_t nd = (size_t)n * (size_t)d;
    float *x = lm->x;
    float *proj = lm->proj;
    colibri_status st;
    if (!ly->is_moe) {
        if (next != NULL) {
            lm_prefetch(lm, ly, next);
        }
        st = lm_dense_ffn(lm, ly, lm->hbuf, proj, n);
        for (size_t i = 0; i < nd; ++i) {
            x[i] += proj[i];
        }
        return st;
    }
    st = lm_moe(lm, ly, next, lm->hbuf, proj, n);
    if (st != COLIBRI_OK) {
        return st;
    }
    if (ly->ffn_d_ff == 0) {
        for (size_t i = 0; i < nd; ++i) {
            x[i] += proj[i];
        }
        return COLIBRI_OK;
    }
    st = lm_dense_ffn(lm, ly, lm->hbuf, lm->shared, n);
    if (st != COLIBRI_OK) {
        return st;
    }
    for (int32_t t = 0; t < n; t++) {
        const size_t r = (size_t)t * (size_t)d;
        float scale = 1.0f;
        if (ly->shared_gate != NULL) {
            float g = 0.0f;
            for (int32_t i = 0; i < d; ++i) {
                g += lm->hbuf[r + (size_t)i] * ly->shared_gate[i];
            }
            scale = 1.0f / (1.0f + colibri_expf(-g));
        }
        for (int32_t i = 0; i < d; ++i) {
            x[r + (size_t)i] += proj[r + (size_t)i] + scale * lm->shared[r + (size_t)i];
        }
    }
    return COLIBRI_OK;
}

static void embed_row(const colibri_lm_t *lm, int32_t token, float *x)
{
    const int32_t d = (int32_t)lm->h.d_model;
    const lm_mat *em = &lm->embed;
    if (em->scheme == COLIBRI_QUANT_Q8) {
        const int8_t *row = (const int8_t *)em->w + (size_t)token * (size_t)d;
        const float *rs = em->scale + (size_t)token * COLIBRI_Q8_BLOCKS(d);
        for (int32_t i = 0; i < d; ++i) {
            x[i] = (float)row[i] * rs[i / COLIBRI_QK8];
        }
    } else if (em->scheme == COLIBRI_QUANT_F16) {
        const uint16_t *row = (const uint16_t *)em->w + (size_t)token * (size_t)d;
        for (int32_t i = 0; i < d; ++i) {
            x[i] = colibri_f16_to_f32(row[i]);
        }
    } else {
        const float *row = (const float *)em->w + (size_t)token * (size_t)d;
        for (int32_t i = 0; i < d; ++i) {
            x[i] = row[i];
        }
    }
}

/* n <= lm->batch tokens at positions pos0 ..: every layer on all n rows, then the logits of
 * the last one. n = 1 is the token step. */
static colibri_status lm_step(colibri_lm_t *lm, const int32_t *tokens, int32_t n, int32_t pos0,
                              const float **logits)
{
    const lm_header *h = &lm->h;
    const int32_t d = (int32_t)h->d_model;
    const size_t nd = (size_t)n * (size_t)d;
    float *x = lm->x;
    for (int32_t t = 0; t < n; t++) {
        embed_row(lm, tokens[t], x + (size_t)t * (size_t)d);
    }
    for (int32_t l = 0; l < (int32_t)h->n_layers; ++l) {
        lm_layer *ly = &lm->layers[l];
        for (int32_t t = 0; t < n; t++) {
            const size_t r = (size_t)t * (size_t)d;
            colibri_rmsnorm_f32(x + r, ly->input_norm, lm->hbuf + r, d, h->eps);
        }
        colibri_status st = lm_attention(lm, ly, l, pos0, n);
        if (st != COLIBRI_OK) {
            return st;
        }
        for (size_t i = 0; i < nd; ++i) {
            x[i] += lm->proj[i];
        }
        for (int32_t t = 0; t < n; t++) {
            const size_t r = (size_t)t * (size_t)d;
            colibri_rmsnorm_f32(x + r, ly->post_norm, lm->hbuf + r, d, h->eps);
        }
        st = lm_ffn(lm, ly, l + 1 < (int32_t)h->n_layers ? &lm->layers[l + 1] : NULL, n);
        if (st != COLIBRI_OK) {
            return st;
        }
    }
    colibri_rmsnorm_f32(x + (size_t)(n - 1) * (size_t)d, lm->final_norm, lm->hbuf, d, h->eps);
    const lm_mat *m[1] = {&lm->lm_head};
    const float *b[1] = {NULL};
    float *y[1] = {lm->logits};
    const colibri_status st = lm_linear(lm, 1, m, b, y, lm->hbuf, 1);
    if (st != COLIBRI_OK) {
        return st;
    }
    *logits = lm->logits;
    return COLIBRI_OK;
}

colibri_status colibri_lm_forward(colibri_lm_t *lm, int32_t token, int32_t pos,
                                  const float **logits)
{
    if (lm == NULL || logits == NULL || token < 0 || token >= (int32_t)lm->h.vocab) {
        return COLIBRI_ERR_ARG;
    }
    if (pos < 0 || pos >= lm->max_context) {
        return COLIBRI_ERR_NOMEM; /* context overflow: the KV cache has no row for pos */
    }
    return lm_step(lm, &token, 1, pos, logits);
}

colibri_status colibri_lm_prefill(colibri_lm_t *lm, const int32_t *tokens, int32_t n, int32_t pos0,
                                  const float **logits)
{
    if (lm == NULL || tokens == NULL || logits == NULL || n < 1) {
        return COLIBRI_ERR_ARG;
    }
    for (int32_t t = 0; t < n; t++) {
        if (tokens[t] < 0 || tokens[t] >= (int32_t)lm->h.vocab) {
            return COLIBRI_ERR_ARG;
        }
    }
    if (pos0 < 0 || pos0 >= lm->max_context || n > lm->max_context - pos0) {
        return COLIBRI_ERR_NOMEM; /* context overflow */
    }
    /* With a budget the expert slots hold top_k experts of one token at a time: token steps. */
    const int32_t chunk = lm->cache != NULL ? 1 : lm->batch;
    for (int32_t t = 0; t < n; t += chunk) {
        const int32_t m = n - t < chunk ? n - t : chunk;
        const colibri_status st = lm_step(lm, tokens + t, m, pos0 + t, logits);
        if (st != COLIBRI_OK) {
            return st;
        }
    }
    return COLIBRI_OK;
}

#else
/* ISO C forbids an empty translation unit. */
typedef int colibri_lm_file_unused;
#endif /* COLIBRI_NO_FILESYSTEM */
