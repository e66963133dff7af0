/**
 * @file lm_cache.c
 * @brief Routed experts beyond RAM (colibri_lm.h, expert_ram_budget > 0): slots filled
 *        from the model file with pread, LRU, pinned hot experts and the next layer's prefetch
 *        (docs/transformer.md, "Experts beyond RAM").
 *        Compiled out with COLIBRI_NO_FILESYSTEM (MCUs run the generated C).
 */
#ifndef COLIBRI_NO_FILESYSTEM

#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* madvise (MADV_DONTNEED: glibc's posix_madvise ignores it) */

#include "lm_internal.h"

#include <sys/uio.h>

/* Drop a blob's pages from the mapping (read only, never written: they come back from the
 * file if touched again), so they leave the process's resident set. */
void clb_lm_drop_pages(const unsigned char *p, uint64_t len)
{
    const long page = sysconf(_SC_PAGESIZE);
    if (page <= 0 || len == 0u) {
        return;
    }
    const uintptr_t a = (uintptr_t)p & ~((uintptr_t)page - 1u);
    (void)madvise((void *)a, (size_t)((uintptr_t)p + len - a), MADV_DONTNEED);
}

/* madvise `advice` over the pages holding [p, p + len). */
static void advise_pages(const void *p, uint64_t len, int advice)
{
    const long page = sysconf(_SC_PAGESIZE);
    if (page <= 0 || len == 0u) {
        return;
    }
    const uintptr_t a = (uintptr_t)p & ~((uintptr_t)page - 1u);
    (void)madvise((void *)a, (size_t)((uintptr_t)p + len - a), advice);
}

/* Bytes of m's weights (codes, and a block format's scales) as the file stores them. */
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
    case COLIBRI_QUANT_Q4K:
        return (uint64_t)COLIBRI_Q4K_BYTES(n_out, n_in);
    case COLIBRI_QUANT_Q5K:
        return (uint64_t)COLIBRI_Q5K_BYTES(n_out, n_in);
    default:
        return 4u * n_out * n_in;
    }
}

/* Bytes of m's codes the kernels read through the mapping: 0 when packed (or absent). */
static uint64_t mapped_codes(const lm_mat *m)
{
    return (m->w == NULL || m->packed != NULL) ? 0u : mat_w_bytes(m);
}

/* With a budget: every step reads the fp32 tensors of up to LM_LOCK_MAX bytes other than the
 * routed experts' (norms, routers, scale rows, RoPE rows) through the mapping. The expert reads
 * stream through the page cache, and under a memory cap they evicted these pages every token: some
 * 40 synchronous 4 KiB reads a token on the 353 M model. They are locked in (best effort: a
 * refused mlock, e.g. over RLIMIT_MEMLOCK, leaves them to the page cache); under a megabyte on
 * that model. COLIBRI_LM_READAHEAD=1 turns this off too. */
#define LM_LOCK_MAX (1u << 20)
static void lock_small(const unsigned char *base, const lm_entry *entries, uint32_t n)
{
    const long page = sysconf(_SC_PAGESIZE);
    for (uint32_t i = 0; i < n && page > 0; i++) {
        if (entries[i].dtype != DT_F32 || entries[i].nbytes > LM_LOCK_MAX ||
            entries[i].nbytes == 0u || strstr(entries[i].name, ".expert.") != NULL) {
            continue;
        }
        const uintptr_t p = (uintptr_t)(base + entries[i].offset);
        const uintptr_t a = p & ~((uintptr_t)page - 1u);
        (void)mlock((const void *)a, (size_t)(p + entries[i].nbytes - a));
    }
}

/* With a budget, after init (its checks and the packing read the file sequentially, with the
 * kernel's readahead): no readahead any more where the reads are scattered. The kernel reads
 * ahead of a pread and around a fault of the mapping by the device's read_ahead_kb (8 MiB on
 * some virtual disks): an expert's pread also read the next expert, and each fault on a norm,
 * a router, a scale row or an embedding row read 8 MiB around it. Under a memory cap (page
 * cache charged to the process's cgroup) that evicted what the next token needed and read it
 * again: at a quarter of a 353 M model's file, 5.6 GB read for 40 tokens instead of 2.7 GB.
 * So: POSIX_FADV_RANDOM on the file (a pread reads what it asks for), MADV_RANDOM on the
 * mapping except the matrices still streamed from it each token (not packed: lm_head,
 * attention, dense FFN), which keep the default. COLIBRI_LM_READAHEAD=1 in the environment
 * leaves the kernel's defaults. Hints only: the logits are the same either way. */
void clb_lm_cache_advise(colibri_lm_t *lm, const lm_entry *entries, uint32_t n_entries)
{
    const char *keep = getenv("COLIBRI_LM_READAHEAD");
    if (lm->cache == NULL || (keep != NULL && keep[0] != '\0' && strcmp(keep, "0") != 0)) {
        return;
    }
    (void)posix_fadvise(lm->cache->fd, 0, 0, POSIX_FADV_RANDOM);
    advise_pages(lm->map, lm->map_size, MADV_RANDOM);
    advise_pages(lm->lm_head.w, mapped_codes(&lm->lm_head), MADV_NORMAL);
    for (uint32_t l = 0; l < lm->h.n_layers; l++) {
        const lm_layer *ly = &lm->layers[l];
        const lm_mat *m[7] = {&ly->tf.wq,  &ly->tf.wk,  &ly->tf.wv, &ly->tf.wo,
                              &ly->ffn[0], &ly->ffn[1], &ly->ffn[2]};
        for (int i = 0; i < 7; i++) {
            advise_pages(m[i]->w, mapped_codes(m[i]), MADV_NORMAL);
        }
    }
    lock_small((const unsigned char *)lm->map, entries, n_entries);
}

/* ------------------------------------------------------------------------------------------ */
/* Routed experts beyond RAM: slots filled with pread, LRU, prefetch (expert_ram_budget > 0)  */

#define LM_SLOT_ALIGN 64u

/* The slots' block: aligned to a huge page and advised for huge pages before its first write,
 * as the packed matrices are (lm_pack.c). A miss's read writes the whole expert and every
 * token's kernels stream the experts it routes to from their slots: from 4 KiB pages that is a
 * TLB miss every 4 KiB of both (benchmarks/budget_table.py's 353 M model, int8, a quarter
 * budget: decode 49.8 -> 62.7 tokens/s, medians of 3 interleaved runs at load 8 on 2 CPUs).
 * A hint: the kernel may refuse it. */
#define LM_SLOT_BLOCK ((uint64_t)2u << 20)

static uint64_t slot_block_bytes(uint64_t bytes)
{
    return add64(bytes, LM_SLOT_BLOCK - 1u) & ~(LM_SLOT_BLOCK - 1u);
}

typedef struct {
    const unsigned char *src; /* in the mapping: the file offset is src - map */
    uint64_t len;
} lm_part;

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

/* The bytes of a read's chunks: LM_READ_CHUNK, or COLIBRI_LM_READ_CHUNK from the environment
 * (at least 64; the tests' small experts are read in many chunks with a few KiB), read once by
 * clb_lm_cache_plan for colibri_lm_init. */
static uint64_t read_chunk_bytes(void)
{
    const char *v = getenv("COLIBRI_LM_READ_CHUNK");
    const uint64_t b =
        v != NULL && v[0] >= '0' && v[0] <= '9' ? strtoull(v, NULL, 10) : LM_READ_CHUNK;
    return b < 64u ? 64u : b;
}

/* The chunks of a read into a slot of `slot` bytes at most: each part's in `chunk`-byte
 * pieces, the last of a part shorter. */
static uint64_t slot_max_chunks(uint64_t slot, uint64_t chunk)
{
    return slot / chunk + LM_PARTS;
}

void clb_lm_cache_free(lm_cache *c)
{
    if (c == NULL) {
        return;
    }
    clb_lm_reader_stop(c); /* joins the reader: nothing writes the slots any more */
    free(c->predict);
    free(c->crcs);
    free(c->evictor);
    free(c->ref_used);
    free(c->ref_pin);
    free(c->slots);
    free(c->data);
    free(c->resident);
    free(c);
}

static colibri_status pin_hot(colibri_lm_t *lm, const colibri_lm_config_t *config, int32_t max_k);

/* A layer's largest top_k over the MoE layers, and the stored (owner) experts' count. */
static int32_t moe_max_k(const colibri_lm_t *lm, uint64_t *n_owners)
{
    int32_t max_k = 0;
    *n_owners = 0;
    for (uint32_t l = 0; l < lm->h.n_layers; l++) {
        const lm_layer *ly = &lm->layers[l];
        if (!ly->tf.is_moe) {
            continue;
        }
        max_k = ly->top_k > max_k ? ly->top_k : max_k;
        for (int32_t j = 0; j < ly->moe.n_experts; j++) {
            *n_owners += ly->experts[j].owner == j ? 1u : 0u;
        }
    }
    return max_k;
}

/* Every stored (owner) expert's parts: their bytes summed into *total, the largest expert's
 * slot span returned; with drop, each part's pages dropped from the mapping as well. */
static uint64_t owner_parts(const colibri_lm_t *lm, int drop, uint64_t *total)
{
    uint64_t slot = 0;
    lm_part p[LM_PARTS];
    *total = 0;
    for (uint32_t l = 0; l < lm->h.n_layers; l++) {
        const lm_layer *ly = &lm->layers[l];
        for (int32_t j = 0; ly->tf.is_moe && j < ly->moe.n_experts; j++) {
            if (ly->experts[j].owner != j) {
                continue;
            }
            const int n = expert_parts(ly, &ly->experts[j], p);
            uint64_t span = 0;
            for (int i = 0; i < n; i++) {
                *total += p[i].len;
                span += al_slot(p[i].len);
                if (drop) {
                    clb_lm_drop_pages(p[i].src, p[i].len);
                }
            }
            slot = span > slot ? span : slot;
        }
    }
    return slot;
}

/* Sizes of the routed experts (stats.expert_bytes, .slot_bytes) and, with a budget, the bytes
 * of the slots, their table, the residency map and pin_hot's ranking; the slot count in
 * stats.n_slots (set for clb_lm_cache_setup, which keeps it). */
colibri_status clb_lm_cache_plan(colibri_lm_t *lm, const colibri_lm_config_t *config,
                                 uint64_t *bytes)
{
    uint64_t total = 0, n_owners = 0;
    *bytes = 0;
    const int32_t max_k = moe_max_k(lm, &n_owners);
    const uint64_t slot = owner_parts(lm, 0, &total);
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
    lm->stats.n_slots = (uint32_t)n_slots; /* <= n_owners <= n_experts < 2^31 */
    *bytes = add64(add64(sizeof(lm_cache), mul64(n_slots, sizeof(lm_slot))),
                   add64(slot_block_bytes(mul64(n_slots, slot)), 8u * (uint64_t)lm->n_experts));
    *bytes = add64(*bytes, mul64(n_owners, 12u)); /* pin_hot's ranking (lm_hot) */
    *bytes = add64(*bytes, mul64(lm->h.n_layers, sizeof(lm_predict)));
    /* the reader and the slots' chunk CRC-32s (lm_slot.crcs) */
    lm->read_chunk = read_chunk_bytes(); /* once: setup allocates what this counts */
    *bytes = add64(
        *bytes, add64(LM_READER_BYTES, mul64(4u * n_slots, slot_max_chunks(slot, lm->read_chunk))));
    if ((config->expert_flags & COLIBRI_LM_NO_PREFETCH) == 0u) {
        *bytes = add64(*bytes, 16u * (uint64_t)lm->n_experts); /* ref_used, ref_pin */
    }
    return *bytes >= (uint64_t)SIZE_MAX ? COLIBRI_ERR_NOMEM : COLIBRI_OK;
}

/* With a budget (clb_lm_cache_plan set stats.n_slots): the slots, the mapping's expert pages
 * dropped and the hottest experts pinned. */
colibri_status clb_lm_cache_setup(colibri_lm_t *lm, const colibri_lm_config_t *config)
{
    const uint64_t n_slots = lm->stats.n_slots;
    const uint64_t slot = lm->stats.slot_bytes;
    uint64_t n_owners = 0, total = 0;
    const int32_t max_k = moe_max_k(lm, &n_owners);
    if (config->expert_ram_budget == 0u || n_slots == 0u) {
        return COLIBRI_OK;
    }
    lm_cache *c = (lm_cache *)calloc(1u, sizeof *c);
    if (c == NULL) {
        return COLIBRI_ERR_NOMEM;
    }
    c->fd = lm->fd;
    c->n_slots = (uint32_t)n_slots;
    c->prefetch = (config->expert_flags & COLIBRI_LM_NO_PREFETCH) == 0u;
    c->always = (config->expert_flags & COLIBRI_LM_PREFETCH_ALWAYS) != 0u;
    c->check_crc = (config->load_flags & COLIBRI_LOAD_SKIP_CHECKSUM) == 0u &&
                   (config->expert_flags & COLIBRI_LM_NO_READ_CHECK) == 0u;
    if (c->check_crc) {
        colibri_crc32_tables_init(&c->tables);
    }
    const size_t block = (size_t)slot_block_bytes(n_slots * slot); /* plan checked its size */
    void *data = aligned_alloc((size_t)LM_SLOT_BLOCK, block);
#if defined(MADV_HUGEPAGE)
    if (data != NULL) {
        (void)madvise(data, block, MADV_HUGEPAGE); /* before the first write */
    }
#endif
    c->slots = (lm_slot *)calloc((size_t)n_slots, sizeof *c->slots);
    c->resident = (int32_t *)malloc((size_t)lm->n_experts * sizeof *c->resident);
    c->predict = (lm_predict *)calloc(lm->h.n_layers, sizeof *c->predict);
    c->evictor = (int32_t *)calloc((size_t)lm->n_experts, sizeof *c->evictor);
    c->chunk = lm->read_chunk;
    c->max_chunks = (uint32_t)slot_max_chunks(slot, c->chunk); /* plan counted n_slots of them */
    c->chunk_op = colibri_crc32_shift(c->chunk);
    c->crcs = (uint32_t *)malloc((size_t)n_slots * c->max_chunks * sizeof *c->crcs);
    if (c->prefetch) {
        c->ref_used = (uint64_t *)calloc((size_t)lm->n_experts, sizeof *c->ref_used);
        c->ref_pin = (uint64_t *)calloc((size_t)lm->n_experts, sizeof *c->ref_pin);
    }
    if (c->slots == NULL || c->resident == NULL || c->predict == NULL || c->evictor == NULL ||
        c->crcs == NULL || data == NULL ||
        (c->prefetch && (c->ref_used == NULL || c->ref_pin == NULL))) {
        free(data);
        clb_lm_cache_free(c);
        return COLIBRI_ERR_NOMEM;
    }
    c->data = (unsigned char *)data;
    for (uint64_t s = 0; s < n_slots; s++) {
        c->slots[s].expert = -1;
        c->slots[s].data = c->data + s * slot;
        c->slots[s].crcs = c->crcs + s * c->max_chunks;
    }
    for (int32_t g = 0; g < lm->n_experts; g++) {
        c->resident[g] = -1;
    }
    /* Nothing reads the experts through the mapping any more: drop any of their pages still
     * there (the checks dropped those they read), so only the slots hold expert bytes. */
    (void)owner_parts(lm, 1, &total);
    lm->cache = c;
    colibri_status st = pin_hot(lm, config, max_k);
    c->ref_cap = c->n_slots - lm->stats.n_pinned;
    if (st == COLIBRI_OK) {
        /* after pin_hot's reads: the slots are the caller's until now */
        st = clb_lm_reader_start(lm);
    }
    if (st != COLIBRI_OK) {
        clb_lm_cache_free(c);
        lm->cache = NULL;
    }
    return st;
}

/* Where expert e's parts go in a slot's data (expert_parts' order, each 64-aligned). */
static int slot_layout(const lm_layer *ly, const lm_expert *e, unsigned char *data, lm_part *p,
                       unsigned char **dst)
{
    const int n = expert_parts(ly, e, p);
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        dst[i] = data + off;
        off += al_slot(p[i].len);
    }
    return n;
}

/* A part is read a chunk at a time, each chunk's CRC-32 taken right after its read
 * while the chunk is still in the core's cache, not the whole part (megabytes) read and then
 * brought back from memory for the check. With the 512-bit CRC fold (crc32.c) the difference
 * was within the noise on the 353 M model (int8, quarter budget, decode at load 8.5 on 2 CPUs:
 * chunks of 256 KiB 49.5 / 49.7 tokens/s, 1 MiB 50.8 / 52.4, whole parts 51.0 / 51.5). The
 * chunks are lm_cache.chunk (LM_READ_CHUNK, 512 KiB): the reader thread and a thread waiting
 * for the slot share a read chunk by chunk (lm_reader.c, clb_lm_chunk_read). */

/* File gaps between an expert's parts (alignment padding) that one read still spans, read into
 * a scratch buffer of this size and dropped. */
#define LM_GAP_MAX 4096u

/* One preadv, continued after a short read or EINTR: iov (n of them, at most LM_PARTS * 2)
 * filled from the file's bytes at off on. */
static colibri_status preadv_all(int fd, struct iovec *iov, int n, uint64_t off)
{
    int i = 0;
    while (i < n) {
        const ssize_t got = preadv(fd, iov + i, n - i, (off_t)off);
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got == 0) {
            return COLIBRI_ERR_CHANGED;
        }
        if (got < 0) {
            return COLIBRI_ERR_IO;
        }
        off += (uint64_t)got;
        size_t left = (size_t)got;
        while (i < n && left >= iov[i].iov_len) { /* the iovecs filled */
            left -= iov[i].iov_len;
            i++;
        }
        if (i < n) { /* one filled in part: the rest of it next */
            iov[i].iov_base = (unsigned char *)iov[i].iov_base + left;
            iov[i].iov_len -= left;
        }
    }
    return COLIBRI_OK;
}

/* Read exactly len bytes at off into dst (preadv_all of one iovec, a GiB at a time):
 * COLIBRI_ERR_IO on a read error, COLIBRI_ERR_CHANGED when the file ends before them
 * (truncated since the load, which checked every tensor's extent). */
static colibri_status pread_all(int fd, unsigned char *dst, uint64_t len, uint64_t off)
{
    colibri_status st = COLIBRI_OK;
    while (len > 0u && st == COLIBRI_OK) {
        const size_t chunk = len > (uint64_t)(1u << 30) ? (size_t)(1u << 30) : (size_t)len;
        struct iovec v = {dst, chunk};
        st = preadv_all(fd, &v, 1, off);
        dst += chunk;
        len -= (uint64_t)chunk;
        off += (uint64_t)chunk;
    }
    return st;
}

/* Whether an expert's parts (n, p) lie in the file in increasing order with gaps of at most
 * LM_GAP_MAX bytes between them (the container's layout), none empty, lm_cache.chunk bytes or
 * less in all: then one preadv reads them (read_parts_at_once). */
static int parts_together(const lm_cache *c, const lm_part *p, int n)
{
    uint64_t bytes = 0;
    for (int i = 0; i < n; i++) {
        if (p[i].len == 0u) {
            return 0;
        }
        if (i > 0) {
            const unsigned char *end = p[i - 1].src + p[i - 1].len;
            if (p[i].src < end || (uint64_t)(p[i].src - end) > LM_GAP_MAX) {
                return 0;
            }
        }
        bytes += p[i].len;
    }
    return n > 0 && bytes <= c->chunk;
}

/* Parts that lie together (parts_together) read into dst with one preadv (1 system call for a
 * miss instead of one per part), the gaps between them into a scratch buffer. */
static colibri_status read_parts_at_once(const colibri_lm_t *lm, const lm_part *p,
                                         unsigned char *const *dst, int n)
{
    const unsigned char *base = (const unsigned char *)lm->map;
    unsigned char gap[LM_GAP_MAX];
    struct iovec iov[2 * LM_PARTS];
    int k = 0;
    for (int i = 0; i < n; i++) {
        const unsigned char *end = i > 0 ? p[i - 1].src + p[i - 1].len : p[i].src;
        if (p[i].src > end) {
            iov[k++] = (struct iovec){gap, (size_t)(p[i].src - end)};
        }
        iov[k++] = (struct iovec){dst[i], (size_t)p[i].len};
    }
    return preadv_all(lm->cache->fd, iov, k, (uint64_t)(p[0].src - base));
}

/* Read expert e's stored parts from the file into data. Unless COLIBRI_LOAD_SKIP_CHECKSUM or
 * COLIBRI_LM_NO_READ_CHECK, every part read is checked against the CRC-32 the file's table gave
 * it at load: bytes changed in the file since are COLIBRI_ERR_CHECKSUM, never kernel input.
 * Every read is checked, not only an expert's first: the check guards against the file
 * changing under a running handle (rewritten in place, truncated and refilled, a bad block of
 * a disk or a network file system), and a verdict kept from an earlier read says nothing about
 * the bytes this read returned. Reads only what init made immutable (safe on the reader
 * thread). An expert of one chunk or less (lm_cache.chunk) whose parts lie together in the
 * file is read with one system call and then checked (stdlib-small-s1's 38 KB int8 experts: 6
 * preads a miss before); a larger one a chunk at a time, each chunk checked right after its
 * read. */
colibri_status clb_lm_slot_read(const colibri_lm_t *lm, const lm_layer *ly, const lm_expert *e,
                                unsigned char *data)
{
    const lm_cache *c = lm->cache;
    lm_part p[LM_PARTS];
    unsigned char *dst[LM_PARTS] = {NULL}; /* set by slot_layout */
    const int n = slot_layout(ly, e, data, p, dst);
    const unsigned char *base = (const unsigned char *)lm->map;
    colibri_status st = COLIBRI_OK;
    if (parts_together(c, p, n)) {
        st = read_parts_at_once(lm, p, dst, n);
        if (st != COLIBRI_OK) {
            return st;
        }
        for (int i = 0; i < n && c->check_crc; i++) {
            if (colibri_crc32(&c->tables, dst[i], p[i].len) != e->crc[i]) {
                return COLIBRI_ERR_CHECKSUM;
            }
        }
        return COLIBRI_OK;
    }
    for (int i = 0; i < n; i++) {
        const uint64_t off = (uint64_t)(p[i].src - base);
        uint32_t crc = 0;
        for (uint64_t done = 0; done < p[i].len; done += c->chunk) {
            const uint64_t len = p[i].len - done < c->chunk ? p[i].len - done : c->chunk;
            st = pread_all(c->fd, dst[i] + done, len, off + done);
            if (st != COLIBRI_OK) {
                return st;
            }
            crc = c->check_crc ? colibri_crc32_update(&c->tables, crc, dst[i] + done, len) : 0u;
        }
        if (c->check_crc && crc != e->crc[i]) {
            return COLIBRI_ERR_CHECKSUM;
        }
    }
    return COLIBRI_OK;
}

/* Chunk i of the read of expert e into data (slot_layout): its part in p[*part] / dst[*part],
 * its bytes at [*off, *off + *len) of the part; 0 when there is no chunk i. */
static int slot_chunk(const lm_cache *c, const lm_slot *sl, uint32_t i, lm_part *p,
                      unsigned char **dst, int *part, uint64_t *off, uint64_t *len)
{
    const uint64_t chunk = c->chunk;
    const int n = slot_layout(sl->src_layer, sl->src, sl->data, p, dst);
    uint64_t k = i;
    for (int j = 0; j < n; j++) {
        const uint64_t nc = (p[j].len + chunk - 1u) / chunk;
        if (k < nc) {
            *part = j;
            *off = k * chunk;
            *len = p[j].len - *off < chunk ? p[j].len - *off : chunk;
            return 1;
        }
        k -= nc;
    }
    return 0;
}

uint32_t clb_lm_slot_chunks(const lm_cache *c, const lm_slot *sl)
{
    lm_part p[LM_PARTS];
    unsigned char *dst[LM_PARTS];
    const int n = slot_layout(sl->src_layer, sl->src, sl->data, p, dst);
    uint64_t k = 0;
    for (int j = 0; j < n; j++) {
        k += (p[j].len + c->chunk - 1u) / c->chunk;
    }
    return (uint32_t)k; /* <= max_chunks (slot_max_chunks) */
}

colibri_status clb_lm_chunk_read(const colibri_lm_t *lm, const lm_slot *sl, uint32_t i,
                                 uint32_t *crc)
{
    const lm_cache *c = lm->cache;
    lm_part p[LM_PARTS];
    unsigned char *dst[LM_PARTS];
    int j = 0;
    uint64_t off = 0, len = 0;
    *crc = 0;
    if (!slot_chunk(c, sl, i, p, dst, &j, &off, &len)) {
        return COLIBRI_ERR_EXPERT; /* not reached: i < clb_lm_slot_chunks */
    }
    const uint64_t at = (uint64_t)(p[j].src - (const unsigned char *)lm->map) + off;
    const colibri_status st = pread_all(c->fd, dst[j] + off, len, at);
    if (st == COLIBRI_OK && c->check_crc) {
        *crc = colibri_crc32(&c->tables, dst[j] + off, len);
    }
    return st;
}

/* Whether the reader reads slot sl's expert in one go (parts_together: each part one chunk). */
int clb_lm_slot_whole(const lm_cache *c, const lm_slot *sl)
{
    lm_part p[LM_PARTS];
    unsigned char *dst[LM_PARTS];
    const int n = slot_layout(sl->src_layer, sl->src, sl->data, p, dst);
    return parts_together(c, p, n);
}

colibri_status clb_lm_slot_read_whole(const colibri_lm_t *lm, const lm_slot *sl)
{
    const lm_cache *c = lm->cache;
    lm_part p[LM_PARTS];
    unsigned char *dst[LM_PARTS] = {NULL}; /* set by slot_layout */
    const int n = slot_layout(sl->src_layer, sl->src, sl->data, p, dst);
    const colibri_status st = read_parts_at_once(lm, p, dst, n);
    for (int i = 0; i < n; i++) { /* part i is chunk i (parts_together) */
        sl->crcs[i] =
            st == COLIBRI_OK && c->check_crc ? colibri_crc32(&c->tables, dst[i], p[i].len) : 0u;
    }
    return st;
}

/* Every part's CRC-32 from its chunks' (in order: CRC(A B) from CRC(A), CRC(B) and |B|), the
 * same check as clb_lm_slot_read's. */
colibri_status clb_lm_slot_verify(const colibri_lm_t *lm, const lm_slot *sl)
{
    const lm_cache *c = lm->cache;
    if (!c->check_crc) {
        return COLIBRI_OK;
    }
    lm_part p[LM_PARTS];
    unsigned char *dst[LM_PARTS];
    const int n = slot_layout(sl->src_layer, sl->src, sl->data, p, dst);
    uint32_t k = 0;
    for (int j = 0; j < n; j++) {
        /* the first chunk's CRC alone (combined with nothing before it); an empty part's is 0 */
        uint32_t crc = p[j].len > 0u ? sl->crcs[k++] : 0u;
        for (uint64_t off = c->chunk; off < p[j].len; off += c->chunk) {
            const uint64_t len = p[j].len - off < c->chunk ? p[j].len - off : c->chunk;
            /* x^(8 len) mod P: precomputed for whole chunks; the last chunk's costs a few
             * hundred carry-less steps, so a part of one chunk (every part of a small expert)
             * computes none */
            const uint32_t op = len == c->chunk ? c->chunk_op : colibri_crc32_shift(len);
            crc = colibri_crc32_combine_op(crc, sl->crcs[k++], op);
        }
        if (crc != sl->src->crc[j]) {
            return COLIBRI_ERR_CHECKSUM;
        }
    }
    return COLIBRI_OK;
}

/* Slot s made ready for expert e of layer ly (model-wide index g), evicting what it held:
 * its descriptor pointed at its data, counted in bytes_read; used = the clock (0: enters at
 * the cold end, as a prefetch does). The bytes are read by the caller (slot_fill) or the
 * reader thread. */
static void slot_assign(colibri_lm_t *lm, const lm_layer *ly, const lm_expert *e, int32_t g,
                        uint32_t s, uint64_t used)
{
    lm_cache *c = lm->cache;
    lm_slot *sl = &c->slots[s];
    if (sl->expert >= 0) {
        lm->stats.evictions++;
        c->resident[sl->expert] = -1;
    }
    lm_part p[LM_PARTS];
    unsigned char *dst[LM_PARTS];
    const int n = slot_layout(ly, e, sl->data, p, dst);
    for (int i = 0; i < n; i++) {
        lm->stats.bytes_read += p[i].len;
    }
    sl->e = *e;
    expert_rebase(&sl->e, dst);
    sl->ahead = 0;
    sl->expert = g;
    sl->used = used;
    sl->src_layer = ly;
    sl->src = e;
    c->resident[g] = (int32_t)s;
}

/* Free slot s (a failed read). */
void clb_lm_slot_clear(lm_cache *c, uint32_t s)
{
    lm_slot *sl = &c->slots[s];
    if (sl->expert >= 0) {
        c->resident[sl->expert] = -1;
    }
    sl->expert = -1;
    sl->ahead = 0;
}

/* Read expert e of layer ly (model-wide index g) from the file into slot s now, evicting what
 * it held; on a failed read the slot is left free. */
static colibri_status slot_fill(colibri_lm_t *lm, const lm_layer *ly, const lm_expert *e, int32_t g,
                                uint32_t s)
{
    slot_assign(lm, ly, e, g, s, lm->cache->clock);
    const colibri_status st = clb_lm_slot_read(lm, ly, e, lm->cache->slots[s].data);
    if (st != COLIBRI_OK) {
        clb_lm_slot_clear(lm->cache, s);
    }
    return st;
}

/* Every queued read waited for and seen finished. */
static void reader_reap_all(lm_cache *c)
{
    int busy = 0;
    for (uint32_t s = 0; c->reader != NULL && s < c->n_slots; s++) {
        (void)clb_lm_reader_reap(c, s, 1, &busy);
    }
}

/* Whether slot sl holds no expert of the run without prefetch (free, or an expert that run
 * does not hold: a read ahead not yet used, or one its LRU evicted since). */
static int slot_spare(const lm_cache *c, const lm_slot *sl)
{
    return sl->expert < 0 || c->ref_used[sl->expert] == 0u;
}

/* A read handed to the reader thread is waited for lazily: by the run of the expert it holds
 * (clb_lm_expert_wait), or when its slot is chosen as a victim (slot_settle). So that which
 * slot is chosen never depends on the reader's timing (the counters are the same on every
 * run), the choice looks at when a read was queued, never at whether it has finished: a slot
 * queued during the current set of uses (clb_lm_uses_begin) is held, as one being read; one
 * queued before them is a candidate like any other. Reads nobody waits for finish on the
 * reader's thread while the caller computes. */
static int slot_held(const lm_cache *c, const lm_slot *sl)
{
    return sl->queued && sl->qepoch == c->epoch;
}

/* Slot s chosen as a victim: its read, if one is still queued, dropped when no thread has
 * started it (its bytes are about to be replaced), else waited for (a failed read frees the
 * slot). Returns s. */
static uint32_t slot_settle(lm_cache *c, uint32_t s)
{
    int busy = 0;
    if (s < c->n_slots && c->slots[s].queued && !clb_lm_reader_cancel(c, s)) {
        (void)clb_lm_reader_reap(c, s, 1, &busy);
    }
    return s;
}

/* Bytes of expert e's stored parts (what a read of it reads). */
static uint64_t expert_bytes(const lm_layer *ly, const lm_expert *e)
{
    lm_part p[LM_PARTS];
    const int n = expert_parts(ly, e, p);
    uint64_t bytes = 0;
    for (int i = 0; i < n; i++) {
        bytes += p[i].len;
    }
    return bytes;
}

/* Whether a read of `bytes` is two chunks or more: it goes to the reader thread at once (a
 * smaller one costs the caller more to hand over than to read). */
static int read_big(const lm_cache *c, uint64_t bytes)
{
    return bytes >= 2u * c->chunk;
}

/* The least recently used slot (a free one first, then a prefetch never used: used 0), never
 * a pinned one, one being read (slot_held), one read ahead for a layer that has not run yet,
 * nor one whose pin is `pin` (0: any); with `spare_only` (prefetch on) only a slot that holds
 * no expert of the run without prefetch (slot_spare). n_slots when there is none. */
static uint32_t slot_victim(const lm_cache *c, uint64_t pin, int spare_only)
{
    uint32_t best = c->n_slots;
    for (uint32_t s = 0; s < c->n_slots; s++) {
        const lm_slot *sl = &c->slots[s];
        if (sl->pinned || slot_held(c, sl) || sl->ahead || (pin != 0u && sl->pin == pin) ||
            (spare_only && !slot_spare(c, sl))) {
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

/* The run without prefetch (lm_cache.ref_used), for a use of expert g (not pinned): a hit
 * there moves it to the hot end; a miss takes a free slot of that run or evicts its least
 * recently used expert that the current uses do not name, as slot_victim would. Returns the
 * expert it evicted, or -1. Only ids and clocks: it reads nothing. */
static int32_t ref_use(const colibri_lm_t *lm, int32_t g)
{
    lm_cache *c = lm->cache;
    int32_t w = -1;
    if (c->ref_used[g] == 0u) {
        if (c->ref_n < c->ref_cap) {
            c->ref_n++;
        } else {
            for (int32_t x = 0; x < lm->n_experts; x++) {
                if (c->ref_used[x] != 0u && c->ref_pin[x] != c->epoch &&
                    (w < 0 || c->ref_used[x] < c->ref_used[w])) {
                    w = x;
                }
            }
            if (w >= 0) {
                c->ref_used[w] = 0u;
                c->evictor[w] = 0; /* displaced by a read ahead: that run evicts it too */
            }
        }
    }
    c->ref_used[g] = c->clock;
    return w;
}

/* The slot for a miss of layer ly, never a slot of an expert of the current uses (pin ==
 * epoch: clb_lm_expert_pin). The prefetches for ly that these uses do not ask for were wrong:
 * they go cold first. With prefetch, a free slot, else one the run without prefetch does not
 * hold (a wrong read ahead first), else the slot of `ref_victim`, the expert that run evicts
 * for this miss: so every expert that run holds stays (ref_restore). Without prefetch the LRU
 * slot (slot_victim). When no slot is left, the slots still being read are waited for. */
static uint32_t demand_victim(const colibri_lm_t *lm, const lm_layer *ly, int32_t ref_victim)
{
    lm_cache *c = lm->cache;
    for (uint32_t i = 0; i < c->n_slots; i++) {
        lm_slot *sl = &c->slots[i];
        if (sl->ahead && sl->pin != c->epoch && sl->expert >= ly->first_expert &&
            sl->expert < ly->first_expert + ly->moe.n_experts) {
            sl->ahead = 0;
            sl->used = 0;
        }
    }
    if (c->ref_used != NULL) {
        uint32_t s = slot_victim(c, c->epoch, 1);
        if (s == c->n_slots && ref_victim >= 0 && c->resident[ref_victim] >= 0) {
            s = (uint32_t)c->resident[ref_victim];
            int busy = 0;
            (void)clb_lm_reader_reap(c, s, 1, &busy); /* a restore still being read */
            s = c->slots[s].expert == ref_victim && !c->slots[s].pinned ? s : c->n_slots;
        }
        if (s != c->n_slots) {
            return slot_settle(c, s);
        }
    }
    uint32_t s = slot_victim(c, c->epoch, 0);
    if (s == c->n_slots) {
        reader_reap_all(c);
        s = slot_victim(c, c->epoch, 0);
    }
    return slot_settle(c, s);
}

void clb_lm_uses_begin(colibri_lm_t *lm)
{
    lm->cache->epoch++;
}

void clb_lm_expert_pin(colibri_lm_t *lm, const lm_layer *ly, int32_t id)
{
    lm_cache *c = lm->cache;
    const int32_t g = ly->first_expert + ly->experts[id].owner;
    const int32_t r = c->resident[g];
    if (r >= 0) {
        c->slots[r].pin = c->epoch;
    }
    if (c->ref_pin != NULL) {
        c->ref_pin[g] = c->epoch;
    }
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
    const uint32_t room = c->n_slots - (uint32_t)max_k; /* clb_lm_cache_setup: n_slots >= max_k */
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
        for (int32_t j = 0; ly->tf.is_moe && ly->heat != NULL && j < ly->moe.n_experts; j++) {
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
        for (int32_t j = 0; ly->tf.is_moe && ly->heat != NULL && j < ly->moe.n_experts; j++) {
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
        keep += lm->layers[l].tf.is_moe ? (uint32_t)lm->layers[l].top_k : 0u;
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
colibri_status clb_lm_expert_use(colibri_lm_t *lm, const lm_layer *ly, int32_t id)
{
    const int32_t owner = ly->experts[id].owner;
    const int32_t g = ly->first_expert + owner;
    lm_cache *c = lm->cache;
    colibri_lm_stats_t *st = &lm->stats;
    lm_predict *pr = &c->predict[ly - lm->layers];
    c->clock++;
    st->loads++;
    for (int32_t i = 0; i < pr->n_pending; i++) { /* a shadow prediction that was right */
        if (pr->pending[i] == g) {
            pr->used++;
            pr->pending[i] = pr->pending[--pr->n_pending];
            break;
        }
    }
    /* a prefetch still being read is a hit here; its run waits for it (clb_lm_expert_wait)
     * and reads the expert again if the read failed (lm_step.c, lm_expert_ready) */
    const int pinned = c->resident[g] >= 0 && c->slots[c->resident[g]].pinned;
    const int ref_hit = c->ref_used != NULL && !pinned && c->ref_used[g] != 0u;
    const int32_t ref_victim = c->ref_used != NULL && !pinned ? ref_use(lm, g) : -1;
    if (c->resident[g] >= 0) {
        lm_slot *sl = &c->slots[c->resident[g]];
        st->hits++;
        st->pinned_hits += sl->pinned ? 1u : 0u;
        if (sl->ahead) {
            st->prefetch_hits++;
            pr->used++;
            pr->gain += ref_hit ? 0u : 1u;
            sl->ahead = 0;
        }
        sl->used = c->clock;
        sl->pin = c->epoch;
        return COLIBRI_OK;
    }
    st->misses++;
    pr->lost += ref_hit ? 1u : 0u; /* a read ahead for ly took its slot */
    c->evictor[g] = 0;             /* read again by this miss: nothing to read back */
    const uint32_t s = demand_victim(lm, ly, ref_victim);
    if (s == c->n_slots) {
        return COLIBRI_ERR_BUDGET; /* not reached: the LRU slots hold top_k (setup, pin_hot) */
    }
    c->slots[s].pin = c->epoch;
    /* an expert of two chunks or more (a smaller one is read on the caller's thread at once:
     * handing it over costs more than it saves, a waking thread takes tens of microseconds;
     * stdlib-small-s1's 19 KB experts decoded at 0.28x all-resident instead of 0.48x when every
     * miss went to the reader) */
    if (c->reader != NULL && read_big(c, expert_bytes(ly, &ly->experts[owner]))) {
        /* read by the reader thread while the caller computes what is resident, and by the
         * caller once it needs the expert (clb_lm_expert_wait): chunk by chunk, both at once */
        slot_assign(lm, ly, &ly->experts[owner], g, s, c->clock);
        clb_lm_reader_queue(c, s, 1);
        return COLIBRI_OK;
    }
    return slot_fill(lm, ly, &ly->experts[owner], g, s);
}

colibri_status clb_lm_expert_wait(colibri_lm_t *lm, const lm_layer *ly, int32_t id, int wait,
                                  int *busy)
{
    lm_cache *c = lm->cache;
    *busy = 0;
    if (c == NULL) {
        return COLIBRI_OK;
    }
    const int32_t s = c->resident[ly->first_expert + ly->experts[id].owner];
    return s < 0 ? COLIBRI_ERR_EXPERT /* not reached: clb_lm_expert_use made it resident */
                 : clb_lm_reader_reap(c, (uint32_t)s, wait, busy);
}

int clb_lm_expert_help(colibri_lm_t *lm, const lm_layer *ly, int32_t id)
{
    lm_cache *c = lm->cache;
    const int32_t s = c == NULL ? -1 : c->resident[ly->first_expert + ly->experts[id].owner];
    return s >= 0 && c->reader != NULL && clb_lm_reader_help(c, (uint32_t)s);
}

/* The expert a layer routes to as `id`: in place in the mapping (no budget), else its slot
 * (clb_lm_expert_use made it resident). */
const lm_expert *clb_lm_expert_at(const colibri_lm_t *lm, const lm_layer *ly, int32_t id)
{
    const int32_t owner = ly->experts[id].owner;
    if (lm->cache == NULL) {
        return &ly->experts[owner];
    }
    const int32_t s = lm->cache->resident[ly->first_expert + owner];
    return s >= 0 ? &lm->cache->slots[s].e : NULL;
}

/* The read-aheads for ly that ly did not use (its uses are over): not ahead any more, at the
 * cold end (used 0), the first victims. */
static void ahead_cold(lm_cache *c, const lm_layer *ly)
{
    for (uint32_t s = 0; s < c->n_slots; s++) {
        lm_slot *sl = &c->slots[s];
        if (sl->ahead && sl->expert >= ly->first_expert &&
            sl->expert < ly->first_expert + ly->moe.n_experts) {
            sl->ahead = 0;
            sl->used = 0;
        }
    }
}

/* The MoE layer that holds model-wide expert g. */
static const lm_layer *expert_layer(const colibri_lm_t *lm, int32_t g)
{
    for (uint32_t l = 0; l < lm->h.n_layers; l++) {
        const lm_layer *ly = &lm->layers[l];
        if (ly->tf.is_moe && g >= ly->first_expert && g < ly->first_expert + ly->moe.n_experts) {
            return ly;
        }
    }
    return NULL;
}

/* After layer `done`'s uses (with prefetch): every expert that a read ahead for `done`
 * displaced (ahead_victim) and that the run without prefetch still holds is read back, by the
 * reader thread, into a spare slot (a wrong read-ahead's; there is one for each: the slots
 * are as many) with its use clock there. So after each layer the slots hold every expert the
 * run without prefetch holds, in the same LRU order: a use can miss where that run hits only
 * when a read-ahead took an expert of its own layer (ahead_victim's last resort;
 * lm_predict.lost counts those). Counted in stats.restores and lm_predict.restored. */
static void ref_restore(colibri_lm_t *lm, int32_t done)
{
    lm_cache *c = lm->cache;
    if (done < 0 || !lm->layers[done].tf.is_moe) {
        return;
    }
    ahead_cold(c, &lm->layers[done]);
    for (int32_t g = 0; g < lm->n_experts; g++) {
        if (c->evictor[g] != done + 1 || c->ref_used[g] == 0u || c->resident[g] >= 0) {
            continue;
        }
        uint32_t s = slot_victim(c, c->epoch, 1);
        if (s == c->n_slots) {
            reader_reap_all(c);
            s = slot_victim(c, c->epoch, 1);
        }
        const lm_layer *ly = expert_layer(lm, g);
        if (s == c->n_slots || ly == NULL) {
            break; /* not reached: as many spare slots as displaced experts */
        }
        s = slot_settle(c, s);
        c->evictor[g] = 0;
        c->predict[done].restored++;
        slot_assign(lm, ly, &ly->experts[g - ly->first_expert], g, s, c->ref_used[g]);
        lm->stats.restores++;
        lm_slot *sl = &c->slots[s];
        if (c->reader != NULL) {
            clb_lm_reader_queue(c, s, read_big(c, expert_bytes(ly, sl->src)));
        } else if (clb_lm_slot_read(lm, ly, sl->src, sl->data) != COLIBRI_OK) {
            clb_lm_slot_clear(c, s); /* a use of the expert reads it again (and reports) */
        }
    }
}

/* The slot a read ahead for layer `next` takes: a free one, else the coldest spare one (its
 * expert not held by the run without prefetch: evicting it costs that run nothing), else the
 * least recently used expert of a layer other than `next` (next's uses cannot name it, and
 * ref_restore reads it back after them unless the run without prefetch evicts it meanwhile);
 * never one of next's experts (a wrong read-ahead evicting the expert its layer then used was
 * how prefetch lost hits on the 353 M random model), a pinned slot, one being read, one read
 * ahead, nor one whose pin is `pin` (the current layer's experts, the predicted resident ones).
 * n_slots when there is none. */
static uint32_t ahead_victim(const lm_cache *c, const lm_layer *next, uint64_t pin)
{
    uint32_t spare = c->n_slots, other = c->n_slots, own = c->n_slots;
    for (uint32_t s = 0; s < c->n_slots; s++) {
        const lm_slot *sl = &c->slots[s];
        if (sl->pinned || slot_held(c, sl) || sl->ahead || sl->pin == pin) {
            continue;
        }
        if (sl->expert < 0) {
            return s;
        }
        if (slot_spare(c, sl)) {
            spare = spare == c->n_slots || sl->used < c->slots[spare].used ? s : spare;
        } else if (sl->expert < next->first_expert ||
                   sl->expert >= next->first_expert + next->moe.n_experts) {
            other = other == c->n_slots || sl->used < c->slots[other].used ? s : other;
        } else {
            own = own == c->n_slots || sl->used < c->slots[own].used ? s : own;
        }
    }
    return spare != c->n_slots ? spare : other != c->n_slots ? other : own;
}

/* A layer's prediction is judged every LM_PREDICT_WINDOW experts predicted for it (not
 * resident at the time): see clb_lm_layer_done. A live layer whose wasted reads (wrong
 * read-aheads and reads back) outnumber its right read-aheads by LM_PREDICT_QUIT, or whose
 * read-aheads lost LM_PREDICT_QUIT more hits than they gained, goes back to the shadow at
 * once, without waiting for the window's end. */
#define LM_PREDICT_WINDOW 16u
#define LM_PREDICT_QUIT 4u
/* A live window that fails sends the layer back to a shadow that predicts once every 2, 4, 8
 * then 16 chances (a prediction is a router pass; on a small model, whose steps take tens of
 * microseconds, the shadow's predictions and the failed windows' reads cost several percent
 * of the time); a live window that holds resets it. */
#define LM_PREDICT_BACKOFF 4u

/* After the current layer made its top_k experts resident, before they compute: the next
 * layer's router on the current hidden state (lm->hbuf) predicts its experts. A layer's
 * prediction starts in the shadow: the experts it names that are not resident are only
 * counted (prefetch_skipped), and whether the layer then uses them. Once at least half of
 * them are used (judged every LM_PREDICT_WINDOW), the prefetch into the layer is live: those
 * experts are handed to the reader thread (read inline without one), so that the next layer
 * finds them in their slots while this one computes. A prefetched expert enters at the cold
 * end of the LRU order (the first victim once its layer has run without using it) and takes
 * the slot ahead_victim gives: no expert the run without prefetch holds is kept out by it
 * (ref_restore reads back what it displaced), and the predicted layer's own experts are taken
 * only when no other slot is left. It never evicts a slot of this layer's experts, another
 * predicted one, a pinned one or one still being read; when no slot is left the rest is not
 * prefetched. The next layer's misses take its wrong predictions' slots first (demand_victim).
 * A live layer goes back to the shadow when fewer than half its experts read ahead are used,
 * or they gained fewer hits than they lost against the run without prefetch (lm_predict.gain /
 * .lost: misses of experts that run holds, i.e. the layer's own experts a read-ahead took). No
 * output or status changes: the prediction has its own ids / gates, a slot's bytes are the
 * file's, and a failed read frees the slot for the use to read again. */
void clb_lm_prefetch(colibri_lm_t *lm, const lm_layer *next)
{
    lm_cache *c = lm->cache;
    if (c == NULL || !c->prefetch) {
        return;
    }
    ref_restore(lm, (int32_t)(next - lm->layers) - 1); /* the current layer's uses are over */
    if (!next->tf.is_moe) {
        return;
    }
    lm_predict *pr = &c->predict[next - lm->layers];
    const int32_t k = next->top_k;
    if (!pr->live && !c->always && (pr->tick++ & ((1u << pr->backoff) - 1u)) != 0u) {
        pr->n_pending = 0; /* a shadow backing off: no prediction this time */
        return;
    }
    if (k > COLIBRI_MAX_TOP_K || colibri_route(&next->moe, lm->hbuf, 1, k, c->pred_ids,
                                               c->pred_gates, lm->route_temp) != COLIBRI_OK) {
        return;
    }
    const uint64_t pin = c->epoch; /* the current layer's experts hold it (clb_lm_expert_use) */
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
    if (!pr->live && !c->always) { /* shadow: count what a prefetch would read, read nothing */
        pr->n_pending = 0;
        for (int32_t i = 0; i < k; i++) {
            const int32_t id = c->pred_ids[i];
            const int32_t g = id < 0 ? -1 : next->first_expert + next->experts[id].owner;
            int32_t seen = g < 0;
            for (int32_t j = 0; j < pr->n_pending && !seen; j++) {
                seen = pr->pending[j] == g;
            }
            if (!seen) {
                pr->pending[pr->n_pending++] = g;
                pr->issued++;
                lm->stats.prefetch_skipped++;
            }
        }
        return;
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
        const uint32_t s = slot_settle(c, ahead_victim(c, next, pin));
        if (s == c->n_slots) {
            break; /* every other slot is pinned, protected, being read or next's */
        }
        if (c->slots[s].expert >= 0 && !slot_spare(c, &c->slots[s])) {
            c->evictor[c->slots[s].expert] = (int32_t)(next - lm->layers) + 1; /* ref_restore */
        }
        slot_assign(lm, next, &next->experts[owner], g, s, 0u);
        c->evictor[g] = 0;
        lm_slot *sl = &c->slots[s];
        const uint64_t bytes = expert_bytes(next, sl->src);
        lm->stats.bytes_prefetched += bytes;
        if (c->reader != NULL) {
            /* a small expert wakes a blocked reader only while the layer's read-aheads are
             * mostly used: a wrong one is then dropped unread when its slot is taken */
            clb_lm_reader_queue(c, s, read_big(c, bytes) || 4u * pr->used >= 3u * pr->issued);
        } else if (clb_lm_slot_read(lm, next, sl->src, sl->data) != COLIBRI_OK) {
            clb_lm_slot_clear(c, s); /* a use of the expert reads it again (and reports) */
            break;
        }
        lm->stats.prefetches++;
        pr->issued++;
        sl->ahead = 1;
        sl->pin = pin;
    }
}

void clb_lm_layer_done(colibri_lm_t *lm, const lm_layer *ly)
{
    lm_cache *c = lm->cache;
    if (c == NULL) {
        return;
    }
    ahead_cold(c, ly); /* read ahead for ly and not used: cold */
    if (c->ref_used != NULL) {
        ref_restore(lm, (int32_t)(ly - lm->layers)); /* when no prefetch followed ly's uses */
    }
    lm_predict *pr = &c->predict[ly - lm->layers];
    pr->n_pending = 0;
    if (pr->live && (pr->issued + pr->restored >= 2u * pr->used + LM_PREDICT_QUIT ||
                     pr->lost >= pr->gain + LM_PREDICT_QUIT)) {
        /* the reads wasted (wrong read-aheads and reads back) outnumber the misses saved by
         * LM_PREDICT_QUIT, or the read-aheads lost LM_PREDICT_QUIT more hits than they gained:
         * the shadow again, a new window, backing off */
        const uint32_t b = pr->backoff < LM_PREDICT_BACKOFF ? pr->backoff + 1u : pr->backoff;
        *pr = (lm_predict){0};
        pr->backoff = b;
    } else if (pr->issued >= LM_PREDICT_WINDOW) {
        /* on once half the experts predicted are used, and while at least half are and they
         * gain at least the hits they lose (the run without prefetch counted alongside). The
         * reads back (ref_restore) are not held against it: judging on them as well kept
         * live layers in the shadow that gained hits (issue 41 item 1) */
        const uint32_t live = pr->live ? 2u * pr->used >= pr->issued && pr->gain >= pr->lost
                                       : 2u * pr->used >= pr->issued;
        uint32_t b = pr->backoff;
        if (pr->live) {
            b = live ? 0u : b < LM_PREDICT_BACKOFF ? b + 1u : b;
        }
        *pr = (lm_predict){0};
        pr->live = live;
        pr->backoff = b;
    }
}

#else
/* ISO C forbids an empty translation unit. */
typedef int colibri_lm_cache_unused;
#endif /* COLIBRI_NO_FILESYSTEM */
