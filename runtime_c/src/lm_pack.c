/**
 * @file lm_pack.c
 * @brief The memory of a whole model (colibri_lm.h): the arena's layout, the packed
 *        matrices (int8 / int4 weights copied at init into the CPU's packed kernel layout)
 *        and what colibri_lm_info / colibri_lm_sampler_workspace report of them.
 *        Compiled out with COLIBRI_NO_FILESYSTEM (MCUs run the generated C).
 */
#ifndef COLIBRI_NO_FILESYSTEM

#define _POSIX_C_SOURCE 200809L

#include "lm_internal.h"

/* Bytes of the arena for the model's dims at max_context positions, `batch` token rows and
 * n_threads scratches, carving it when lm has a block (arena == NULL on the sizing pass: only
 * the size is returned). UINT64_MAX: too big. */
uint64_t clb_lm_arena_layout(colibri_lm_t *lm, unsigned char *arena)
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
    LM_REGION(perm, int32_t, mul64(4u * b, kk));
    LM_REGION(offsets, int32_t, add64(mul64(8u, (uint64_t)lm->max_e), 4u));
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

/* The arena's bytes with b activation rows (lm->batch is left as it was). */
static uint64_t arena_rows(colibri_lm_t *lm, int32_t b)
{
    const int32_t keep = lm->batch;
    lm->batch = b;
    const uint64_t bytes = clb_lm_arena_layout(lm, NULL);
    lm->batch = keep;
    return bytes;
}

/* The largest b in [0, most] with base + arena(b rows) <= limit (both grow with b). */
static int32_t largest_rows(colibri_lm_t *lm, int32_t most, uint64_t base, uint64_t limit)
{
    int32_t lo = 0;
    int32_t hi = most;
    while (lo < hi) {
        const int32_t mid = lo + (hi - lo + 1) / 2;
        if (add64(base, arena_rows(lm, mid)) <= limit) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    return lo;
}

int32_t clb_lm_budget_chunk(colibri_lm_t *lm, uint64_t budget, uint64_t ceiling, uint64_t other)
{
    const int32_t most = lm->max_context < LM_MAX_BATCH ? lm->max_context : LM_MAX_BATCH;
    const int32_t least = most < LM_DEFAULT_BATCH ? most : LM_DEFAULT_BATCH;
    /* the activations (the arena's growth past no rows) within a quarter of the budget */
    int32_t rows = largest_rows(lm, most, 0u, add64(budget / 4u, arena_rows(lm, 0)));
    rows = rows > least ? rows : least;
    if (ceiling > 0u) {
        const int32_t room = largest_rows(lm, most, other, ceiling);
        rows = rows < room ? rows : room;
    }
    return rows > 1 ? rows : 1;
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
        clb_lm_drop_pages((const unsigned char *)m->w, (uint64_t)row * (uint64_t)m->n_out);
    }
    *off += n;
}

/* Every packable matrix of the model in a fixed order: the bytes (base NULL), or pack them. */
static size_t pack_all(colibri_lm_t *lm, unsigned char *base)
{
    size_t off = 0;
    const int32_t dact = lm->h.dense_act == 1u; /* Q8 / Q4 pack; pack_mat skips the others */
    pack_mat(&lm->lm_head, dact, base, &off);
    for (uint32_t l = 0; l < lm->h.n_layers; l++) {
        lm_layer *ly = &lm->layers[l];
        lm_mat *att[4] = {&ly->tf.wq, &ly->tf.wk, &ly->tf.wv, &ly->tf.wo};
        for (int i = 0; i < 4; i++) {
            pack_mat(att[i], dact, base, &off);
        }
        if (ly->tf.ffn_d_ff > 0) {
            for (int i = 0; i < 3; i++) {
                pack_mat(&ly->ffn[i], ly->ffn_act, base, &off);
            }
        }
        if (ly->tf.is_moe && !lm->budgeted) {
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

/* The bytes clb_lm_pack allocates: the packed matrices rounded up to CLB_PACK_ALIGN (0: none).
 */
uint64_t clb_lm_pack_bytes(colibri_lm_t *lm)
{
#if defined(COLIBRI_X86_DISPATCH)
    const char *env = getenv("COLIBRI_LM_PACK");
    if (env != NULL && strcmp(env, "0") == 0) {
        return 0u;
    }
    const size_t bytes = pack_all(lm, NULL);
    return bytes == 0u ? 0u : (bytes + CLB_PACK_ALIGN - 1u) & ~(CLB_PACK_ALIGN - 1u);
#else
    (void)lm;
    return 0u;
#endif
}

/* Pack what the CPU has packed kernels for (see above); COLIBRI_ERR_NOMEM when it cannot
 * allocate them. */
colibri_status clb_lm_pack(colibri_lm_t *lm)
{
#if defined(COLIBRI_X86_DISPATCH)
    const size_t total = (size_t)clb_lm_pack_bytes(lm);
    if (total == 0u) {
        return COLIBRI_OK;
    }
    unsigned char *base = (unsigned char *)clb_pack_alloc(total);
    if (base == NULL) {
        return COLIBRI_ERR_NOMEM;
    }
    (void)pack_all(lm, base); /* the same matrices in the same order as the sizing pass */
    lm->packed = base;
    lm->packed_bytes = total;
#else
    (void)lm;
#endif
    return COLIBRI_OK;
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

#else
/* ISO C forbids an empty translation unit. */
typedef int colibri_lm_pack_unused;
#endif /* COLIBRI_NO_FILESYSTEM */
