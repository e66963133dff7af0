/**
 * @file lm_parse.c
 * @brief Whole models from a version-2 Colibri container (colibri_lm.h): mmap, validate
 *        everything before allocating (header, table, tensor lookup, layer descriptors), one
 *        allocation for the tables and the arena; colibri_lm_init / _free / _info. Byte layout:
 *        docs/format.md section 1b.
 *        Compiled out with COLIBRI_NO_FILESYSTEM (MCUs run the generated C).
 */
#ifndef COLIBRI_NO_FILESYSTEM

#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* madvise (MADV_DONTNEED: glibc's posix_madvise ignores it) */

#include "lm_internal.h"

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
        h->dense_scheme > (uint32_t)COLIBRI_QUANT_Q5K || h->dense_act > 1u ||
        (h->dense_act == 1u && h->dense_scheme < (uint32_t)COLIBRI_QUANT_Q8) ||
        (h->dense_act != 1u && h->dense_scheme >= (uint32_t)COLIBRI_QUANT_Q4K)) {
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
    /* The data must at least hold the embedding (one byte a weight; half a byte in the 4- / 5-bit
     * dense schemes) and the RoPE tables the header implies (all values bounded above, so no
     * product overflows 64 bits). */
    const uint64_t embed = (uint64_t)h->vocab * h->d_model;
    const uint64_t need = (h->dense_scheme >= (uint32_t)COLIBRI_QUANT_Q4 ? embed / 2u : embed) +
                          2u * 4u * (uint64_t)h->max_context * (h->head_dim / 2u);
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
    if (dtype == DT_Q4K || dtype == DT_Q5K) { /* COLIBRI_Q4K / Q5K_BYTES(n_out, n_in) bytes */
        if (ndim != 2u) {
            return UINT64_MAX;
        }
        const uint64_t subs = mul64(shape[0], ((uint64_t)shape[1] + 31u) / 32u);
        const uint64_t sub = (dtype == DT_Q4K) ? 16u : 20u;
        const uint64_t sb = 16u + 8u * sub;
        const uint64_t tail = (subs % 8u != 0u) ? 16u + sub * (subs % 8u) : 0u;
        return mul64(subs / 8u, sb) + tail;
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
        lm_entry *e = &out[i];
        const unsigned char *p = base + LM_HEADER_BYTES + (size_t)i * LM_ENTRY_BYTES;
        const colibri_status st = clb_entry_read(p, h->file_size, h->data_offset, e);
        if (st != COLIBRI_OK) {
            return st;
        }
        if (e->name[0] == '\0' || e->dtype > DT_Q5K || e->dtype == DT_OLD_Q4K ||
            e->dtype == DT_OLD_Q5K || e->offset < end) {
            return COLIBRI_ERR_FORMAT; /* a name, a known dtype (not the old q4k rows), order */
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
    uint32_t crc; /* the CRC-32 of the tensor `need` found last */
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
static colibri_status need(lm_ctx *c, int required, uint32_t dtype, uint32_t d0, uint32_t d1,
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
    c->crc = e->crc;
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

/* A matrix [n_out][n_in] in `scheme` named by c->name (+ ".scale" for int8); crc (NULL: not
 * wanted) gets the CRC-32 of its codes, then of its scales, at *n_crc (advanced). */
static colibri_status need_mat_crc(lm_ctx *c, int32_t scheme, int blocked, uint32_t n_out,
                                   uint32_t n_in, lm_mat *m, uint32_t *crc, int *n_crc)
{
    static const uint32_t dtypes[6] = {DT_F32, DT_F16, DT_I8, DT_Q4, DT_Q4K, DT_Q5K};
    m->scheme = scheme;
    m->blocked = blocked;
    m->n_out = (int32_t)n_out;
    m->n_in = (int32_t)n_in;
    m->scale = NULL;
    colibri_status st = need(c, 1, dtypes[scheme], n_out, n_in, &m->w);
    if (st == COLIBRI_OK && crc != NULL) {
        crc[(*n_crc)++] = c->crc;
    }
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
    if (st == COLIBRI_OK && crc != NULL) {
        crc[(*n_crc)++] = c->crc;
    }
    return st;
}

static colibri_status need_mat(lm_ctx *c, int32_t scheme, int blocked, uint32_t n_out,
                               uint32_t n_in, lm_mat *m)
{
    return need_mat_crc(c, scheme, blocked, n_out, n_in, m, NULL, NULL);
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
    LM_TRY(need_f32(c, 1, dm, 0u, &ly->tf.input_norm, "layer.%u.input_norm", (unsigned)l));
    LM_TRY(need_f32(c, 1, dm, 0u, &ly->tf.post_norm, "layer.%u.post_norm", (unsigned)l));
    set_name(c, "layer.%u.attn.q", (unsigned)l);
    LM_TRY(need_mat(c, ds, blocked, hq, dm, &ly->tf.wq));
    set_name(c, "layer.%u.attn.k", (unsigned)l);
    LM_TRY(need_mat(c, ds, blocked, hkv, dm, &ly->tf.wk));
    set_name(c, "layer.%u.attn.v", (unsigned)l);
    LM_TRY(need_mat(c, ds, blocked, hkv, dm, &ly->tf.wv));
    set_name(c, "layer.%u.attn.o", (unsigned)l);
    LM_TRY(need_mat(c, ds, blocked, dm, hq, &ly->tf.wo));
    LM_TRY(need_f32(c, 0, hq, 0u, &ly->tf.bq, "layer.%u.attn.q_bias", (unsigned)l));
    LM_TRY(need_f32(c, 0, hkv, 0u, &ly->tf.bk, "layer.%u.attn.k_bias", (unsigned)l));
    LM_TRY(need_f32(c, 0, hkv, 0u, &ly->tf.bv, "layer.%u.attn.v_bias", (unsigned)l));
    LM_TRY(need_f32(c, 0, dm, 0u, &ly->tf.bo, "layer.%u.attn.o_bias", (unsigned)l));
    const int qk = (h->flags & LM_FLAG_QK_NORM) != 0u;
    LM_TRY(need_f32(c, qk, hq, 0u, &ly->tf.q_norm, "layer.%u.attn.q_norm", (unsigned)l));
    LM_TRY(need_f32(c, qk, hkv, 0u, &ly->tf.k_norm, "layer.%u.attn.k_norm", (unsigned)l));
    if (!qk) {
        ly->tf.q_norm = NULL;
        ly->tf.k_norm = NULL;
    }
    ly->tf.is_moe = d->v[0];
    ly->tf.ffn_d_ff = d->v[6];
    ly->ffn_scheme = d->v[7];
    ly->ffn_act = d->v[8];
    if (ly->tf.is_moe) {
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
            if (e->owner < 0 || (uint32_t)e->owner >= ne || e->scheme < 0 ||
                e->scheme > COLIBRI_QUANT_Q5K || e->act < 0 || e->act > 1 ||
                (e->act == 1 && e->scheme < COLIBRI_QUANT_Q8) ||
                (e->act != 1 && e->scheme >= COLIBRI_QUANT_Q4K)) { /* q4k / q5k: int8 acts */
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
            /* each part's CRC-32 in lm_cache.c's part order, for the reads of a RAM budget */
            if (e->scheme == COLIBRI_QUANT_F32) { /* the MoE IR layout [in][out] */
                LM_TRY(need_f32(c, 1, dm, f, &e->fw.w1, "layer.%u.expert.%u.w1", (unsigned)l,
                                (unsigned)j));
                e->crc[0] = c->crc;
                LM_TRY(need_f32(c, 1, f, dm, &e->fw.w2, "layer.%u.expert.%u.w2", (unsigned)l,
                                (unsigned)j));
                e->crc[1] = c->crc;
                LM_TRY(need_f32(c, 1, dm, f, &e->fw.w3, "layer.%u.expert.%u.w3", (unsigned)l,
                                (unsigned)j));
                e->crc[2] = c->crc;
                continue;
            }
            int n_crc = 0;
            set_name(c, "layer.%u.expert.%u.w1", (unsigned)l, (unsigned)j);
            LM_TRY(need_mat_crc(c, e->scheme, 0, f, dm, &e->w[0], e->crc, &n_crc));
            set_name(c, "layer.%u.expert.%u.w2", (unsigned)l, (unsigned)j);
            LM_TRY(need_mat_crc(c, e->scheme, 0, dm, f, &e->w[1], e->crc, &n_crc));
            set_name(c, "layer.%u.expert.%u.w3", (unsigned)l, (unsigned)j);
            LM_TRY(need_mat_crc(c, e->scheme, 0, f, dm, &e->w[2], e->crc, &n_crc));
        }
        ly->experts = experts;
        LM_TRY(need_f32(c, 0, ne, 0u, &ly->heat, "layer.%u.heat", (unsigned)l));
        LM_TRY(heat_check(ly->heat, ne));
        if (d->v[9] == 1) {
            LM_TRY(
                need_f32(c, 1, dm, 0u, &ly->tf.shared_gate, "layer.%u.shared_gate", (unsigned)l));
        }
    }
    if (ly->tf.ffn_d_ff > 0) {
        const uint32_t f = (uint32_t)ly->tf.ffn_d_ff;
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
            clb_lm_drop_pages(blob, entries[i].nbytes);
        }
    }
    return st;
}

/* Free what a (partly) opened model holds; lm may be a block whose later parts are NULL. */
static void lm_release(colibri_lm_t *lm)
{
    clb_lm_pool_free(lm->pool); /* wakes the idle workers, joins them */
    clb_lm_cache_free(lm->cache);
    free(lm->packed);
    free(lm->arena_mem);
}

/*
 * colibri_lm_init (out != NULL) and colibri_lm_measure (out == NULL: sizes only, into mem).
 * Every size comes from the header and from tensor shapes checked against the file before it
 * is used: the parse tables (bounded by the file's own table), then the layer and expert
 * tables (bounded by the descriptors and the experts' table in the file), then, once every
 * tensor the model needs is found with its exact dtype and shape, the arena, the slots, the
 * packed copies and the pool, whose sizes depend on the caller's config (context, batch,
 * threads, budget). With config->max_memory > 0 each step is checked against the ceiling
 * before it is allocated: over it is COLIBRI_ERR_MEMORY, nothing more allocated.
 */
static colibri_status lm_open(const colibri_lm_config_t *config, colibri_lm_memory_t *mem,
                              colibri_lm_t **out)
{
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
    tmp.fd = fd;
    tmp.at_load = sb;
    lm_entry *entries = NULL;
    unsigned char *block = NULL;
    lm_desc *descs = NULL;
    const uint64_t ceiling = out != NULL ? config->max_memory : 0u;
    colibri_status st = header_read(base, size, &tmp.h);
    if (st != COLIBRI_OK) {
        goto fail;
    }
    const lm_header *h = &tmp.h;
    if (config->max_context > (int32_t)h->max_context) {
        st = COLIBRI_ERR_ARG; /* the RoPE tables end at the file's max_context */
        goto fail;
    }
    tmp.max_context = config->max_context > 0 ? config->max_context
                      : h->max_context < (uint32_t)COLIBRI_LM_DEFAULT_CONTEXT
                          ? (int32_t)h->max_context
                          : COLIBRI_LM_DEFAULT_CONTEXT;
    /* Entries and descriptors are bounded by the file (96 and 40 bytes of it each). */
    const uint64_t parse_bytes =
        (uint64_t)h->n_tensors * sizeof *entries + (uint64_t)h->n_layers * sizeof *descs;
    if (ceiling > 0u && parse_bytes > ceiling) {
        st = COLIBRI_ERR_MEMORY;
        goto fail;
    }
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
    lm_ctx c = {base, entries, h->n_tensors, 0u, {0}};
    tmp.hq = (int32_t)(h->n_heads * h->head_dim);
    tmp.hkv = (int32_t)(h->n_kv_heads * h->head_dim);
    uint64_t n_experts = 0;
    for (uint32_t l = 0; l < h->n_layers; l++) {
        st = read_desc(&c, h, l, &descs[l]); /* n_experts: the layer's experts table holds it */
        if (st != COLIBRI_OK) {
            goto fail;
        }
        n_experts += descs[l].v[0] == 1 ? (uint64_t)descs[l].v[1] : 0u;
    }
    /* One block: descriptor, layers, experts (16-aligned regions). */
    const uint64_t head = al16(sizeof(colibri_lm_t));
    const uint64_t layers_bytes = al16(mul64(h->n_layers, sizeof(lm_layer)));
    const uint64_t experts_bytes = al16(mul64(n_experts, sizeof(lm_expert)));
    const uint64_t table_bytes = add64(add64(head, layers_bytes), experts_bytes);
    if (ceiling > 0u && add64(parse_bytes, table_bytes) > ceiling) {
        st = COLIBRI_ERR_MEMORY;
        goto fail;
    }
    if (table_bytes >= (uint64_t)SIZE_MAX) {
        st = COLIBRI_ERR_NOMEM;
        goto fail;
    }
    block = (unsigned char *)malloc((size_t)table_bytes); /* 16-aligned: malloc's alignment */
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
    lm->experts = experts;
    lm->n_experts = (int32_t)n_experts;
    /* Global tensors, then every layer's: each one's dtype and exact shape checked. */
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
    if (st != COLIBRI_OK) {
        goto fail;
    }
    /* The dims that size the arena, now that the tensors have confirmed them: a descriptor's
     * d_ff is the shape of its experts' (or dense MLP's) matrices in the file. */
    int32_t max_ff = 1;
    int32_t max_k = 1;
    int32_t max_e = 1;
    for (uint32_t l = 0; l < h->n_layers; l++) {
        if (descs[l].v[0] == 1) {
            max_ff = descs[l].v[3] > max_ff ? descs[l].v[3] : max_ff;
            max_k = descs[l].v[2] > max_k ? descs[l].v[2] : max_k;
            max_e = descs[l].v[1] > max_e ? descs[l].v[1] : max_e;
        }
        max_ff = descs[l].v[6] > max_ff ? descs[l].v[6] : max_ff;
    }
    lm->max_ff = max_ff;
    lm->max_k = max_k;
    lm->max_e = max_e;
    lm->n_threads = config->num_threads > 1 ? config->num_threads : 1;
    lm->par_min_work = LM_PAR_MIN_WORK;
    const char *min_work = getenv("COLIBRI_LM_PAR_MIN_WORK");
    if (min_work != NULL && min_work[0] >= '0' && min_work[0] <= '9') {
        lm->par_min_work = strtoull(min_work, NULL, 10);
    }
    lm->batch = config->prefill_batch > 0 ? config->prefill_batch : LM_DEFAULT_BATCH;
    lm->batch = lm->batch < lm->max_context ? lm->batch : lm->max_context;
    const int32_t act_n = (int32_t)h->d_model > lm->hq ? (int32_t)h->d_model : lm->hq;
    lm->act_n = act_n > max_ff ? act_n : max_ff;
    lm->budgeted = config->expert_ram_budget > 0u;
    if (out != NULL) {
        st = integrity(base, entries, h->n_tensors, config->load_flags, lm->budgeted);
        if (st != COLIBRI_OK) {
            goto fail;
        }
    }
    /* What the caller's config costs, every part sized before any is allocated. */
    uint64_t slot_bytes = 0;
    st = clb_lm_cache_plan(lm, config, &slot_bytes);
    if (st != COLIBRI_OK) {
        goto fail;
    }
    const uint64_t packed = clb_lm_pack_bytes(lm);
    const uint64_t pool = clb_lm_pool_bytes(lm->n_threads);
    if (config->prefill_batch == 0 && lm->budgeted) {
        const uint64_t other =
            add64(add64(add64(parse_bytes, table_bytes), slot_bytes), add64(packed, pool));
        lm->batch = clb_lm_budget_chunk(lm, config->expert_ram_budget, config->max_memory, other);
    }
    const uint64_t arena = clb_lm_arena_layout(lm, NULL);
    const uint64_t total = add64(add64(add64(parse_bytes, table_bytes), add64(arena, slot_bytes)),
                                 add64(packed, pool));
    if (mem != NULL) {
        mem->table_bytes = add64(parse_bytes, table_bytes);
        mem->arena_bytes = arena;
        mem->kv_bytes =
            mul64(mul64(8u, h->n_layers), mul64((uint64_t)lm->hkv, (uint64_t)lm->max_context));
        mem->slot_bytes = slot_bytes;
        mem->packed_bytes = packed;
        mem->pool_bytes = pool;
        mem->total_bytes = total;
        mem->max_context = lm->max_context;
    }
    if (out == NULL) {
        goto fail; /* colibri_lm_measure: st is COLIBRI_OK, everything is released */
    }
    if (ceiling > 0u && total > ceiling) {
        st = COLIBRI_ERR_MEMORY;
        goto fail;
    }
    if (arena >= (uint64_t)SIZE_MAX) {
        st = COLIBRI_ERR_NOMEM;
        goto fail;
    }
    lm->arena_mem = (unsigned char *)malloc((size_t)arena); /* 16-aligned regions */
    if (lm->arena_mem == NULL) {
        st = COLIBRI_ERR_NOMEM;
        goto fail;
    }
    lm->arena_bytes = (size_t)arena;
    clb_lm_arena_layout(lm, lm->arena_mem);
    st = clb_lm_cache_setup(lm, config);
    if (st == COLIBRI_OK) {
        st = clb_lm_pack(lm);
    }
    if (st == COLIBRI_OK) {
        clb_lm_view(lm);
        clb_lm_cache_advise(lm, entries, lm->h.n_tensors);
    }
#ifndef COLIBRI_NO_THREADS
    if (st == COLIBRI_OK && lm->n_threads > 1) {
        st = clb_lm_pool_create(lm, &lm->pool); /* last: nothing after it can fail */
    }
#endif
    if (st != COLIBRI_OK) {
        goto fail;
    }
    free(entries);
    free(descs);
    *out = lm;
    return COLIBRI_OK;
fail:
    close(fd);
    if (block != NULL) {
        lm_release((colibri_lm_t *)(void *)block);
    }
    free(block);
    free(entries);
    free(descs);
    munmap(map, size);
    return st;
}

colibri_status colibri_lm_init(const colibri_lm_config_t *config, colibri_lm_t **out)
{
    if (out == NULL) {
        return COLIBRI_ERR_ARG;
    }
    *out = NULL;
    return lm_open(config, NULL, out);
}

colibri_status colibri_lm_measure(const colibri_lm_config_t *config, colibri_lm_memory_t *mem)
{
    if (mem == NULL) {
        return COLIBRI_ERR_ARG;
    }
    memset(mem, 0, sizeof *mem);
    return lm_open(config, mem, NULL);
}

void colibri_lm_free(colibri_lm_t *lm)
{
    if (lm == NULL) {
        return;
    }
    lm_release(lm);
    close(lm->fd);
    munmap(lm->map, lm->map_size);
    free(lm);
}

#else
/* ISO C forbids an empty translation unit. */
typedef int colibri_lm_parse_unused;
#endif /* COLIBRI_NO_FILESYSTEM */
