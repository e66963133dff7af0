/**
 * @file model_file.c
 * @brief colibri_init for POSIX hosts: mmap a model file (Colibri container or the seed flat
 *        layout with config.json and router.bin beside it), validate it completely, and build
 *        the model in two allocations: the weights block (reference count, weight table,
 *        sharing map, seed router) shared by every handle on the file (colibri_init_shared),
 *        and the handle block (descriptor, arena, cache slots). The only file of the runtime
 *        that allocates; compiled out entirely with COLIBRI_NO_FILESYSTEM.
 */
#ifndef COLIBRI_NO_FILESYSTEM

#define _POSIX_C_SOURCE 200809L

#include "colibri.h"
#include "colibri_internal.h"
#include "kernels_x86.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#if defined(COLIBRI_X86_DISPATCH)
#include <cpuid.h>
#include <immintrin.h>
#endif

#define SEED_MAGIC 0x434F4C49u
#define SEED_HEADER_BYTES 12u
#define CLB_HEADER_BYTES 128u
#define CLB_ENTRY_BYTES 96u
#define CLB_ALIGNMENT 64u
#define CLB_NAME_BYTES 48u
#define CLB_DTYPE_F32 0u
#define CLB_DTYPE_I32 4u
#define CLB_MAX_EXPERTS 65535u
#define CONFIG_MAX_BYTES (1u << 20)
#define SIBLING_PATH_MAX 4096 /* config.json / router.bin paths (PATH_MAX on Linux) */

/* ------------------------------------------------------------------------------------------ */
/* Small helpers                                                                               */

static uint32_t rd_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static uint64_t rd_u64(const unsigned char *p)
{
    return (uint64_t)rd_u32(p) | ((uint64_t)rd_u32(p + 4) << 32);
}

static int host_is_little_endian(void)
{
    const uint16_t one = 1;
    unsigned char first;
    memcpy(&first, &one, 1);
    return first == 1;
}

/* "dir/of/model" + name into out[cap] (on the caller's stack: a path's length is not the
 * file's to choose, so it is never allocated); -1 when it does not fit. */
static int sibling_path(const char *model_path, const char *name, char *out, size_t cap)
{
    const char *slash = strrchr(model_path, '/');
    size_t dir_len = (slash != NULL) ? (size_t)(slash - model_path) + 1u : 0u;
    size_t name_len = strlen(name);
    if (dir_len >= cap || name_len >= cap - dir_len) {
        return -1;
    }
    memcpy(out, model_path, dir_len);
    memcpy(out + dir_len, name, name_len + 1u);
    return 0;
}

/* Read exactly n bytes from fd. */
static int read_full(int fd, void *dst, size_t n)
{
    unsigned char *p = (unsigned char *)dst;
    while (n > 0) {
        ssize_t got = read(fd, p, n);
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got <= 0) {
            return -1;
        }
        p += (size_t)got;
        n -= (size_t)got;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Integrity checks that read every weight byte (skippable for trusted files: load_flags)      */

/* zlib's CRC-32 (reflected polynomial 0xEDB88320), slicing-by-8: eight 256-entry tables. */
typedef colibri_crc32_tables crc32_tables;

static void crc32_tables_init(crc32_tables *ct)
{
    for (uint32_t i = 0; i < 256u; i++) {
        uint32_t c = i;
        for (int b = 0; b < 8; b++) {
            c = (c & 1u) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
        }
        ct->t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256u; i++) {
        for (int s = 1; s < 8; s++) {
            const uint32_t prev = ct->t[s - 1][i];
            ct->t[s][i] = (prev >> 8) ^ ct->t[0][prev & 0xFFu];
        }
    }
}

/* The register c of the CRC after n more bytes at p (no pre- or post-inversion). */
static uint32_t crc32_update(const crc32_tables *ct, uint32_t c, const unsigned char *p, uint64_t n)
{
    while (n >= 8u) {
        const uint32_t lo = c ^ rd_u32(p);
        const uint32_t hi = rd_u32(p + 4);
        c = ct->t[7][lo & 0xFFu] ^ ct->t[6][(lo >> 8) & 0xFFu] ^ ct->t[5][(lo >> 16) & 0xFFu] ^
            ct->t[4][lo >> 24] ^ ct->t[3][hi & 0xFFu] ^ ct->t[2][(hi >> 8) & 0xFFu] ^
            ct->t[1][(hi >> 16) & 0xFFu] ^ ct->t[0][hi >> 24];
        p += 8;
        n -= 8u;
    }
    while (n > 0u) {
        c = ct->t[0][(c ^ *p++) & 0xFFu] ^ (c >> 8);
        n--;
    }
    return c;
}

#if defined(COLIBRI_X86_DISPATCH)
/*
 * x86-64 with PCLMULQDQ (CPUID 1: ECX bit 1; every x86-64 CPU since about 2010): the same CRC by
 * folding. Reflected, a 16-byte block X (its first 8 bytes the low quadword) moved D bits further
 * along the message is congruent, modulo the polynomial, to clmul(X.lo, k1) ^ clmul(X.hi, k2)
 * with k1 = reflect32(x^(D + 31) mod P) and k2 = reflect32(x^(D - 33) mod P): a product of 96
 * bits that is simply xored into the block D bits on. Four blocks fold 64 bytes ahead
 * (D = 512) while at least 64 bytes are left, then into one another and the rest 16 at a time
 * (D = 128); the last 16-byte block stands for everything so far, so the tables finish it
 * (register 0) and then the under-16 tail. tests/c/test_crc.c checks it against a
 * bit-at-a-time loop and against crc32_update for every length 0..400 at every alignment.
 */
#define CRC_K512_LO 0x8F352D95u /* x^543 mod P, reflected */
#define CRC_K512_HI 0x1D9513D7u /* x^479 */
#define CRC_K128_LO 0xAE689191u /* x^159 */
#define CRC_K128_HI 0xCCAA009Eu /* x^95 */

/* CPUID once per process (a VM exit costs microseconds, and a container has a blob per
 * tensor): 0 unknown, 1 without, 2 with. Racing first calls store the same answer. */
static int crc32_have_clmul(void)
{
    static atomic_int known;
    int k = atomic_load_explicit(&known, memory_order_relaxed);
    if (k == 0) {
        unsigned a, b, c, d;
        k = (__get_cpuid(1, &a, &b, &c, &d) && ((c >> 1) & 1u)) ? 2 : 1;
        atomic_store_explicit(&known, k, memory_order_relaxed);
    }
    return k == 2;
}

__attribute__((target("pclmul"))) static __m128i crc32_fold(__m128i x, __m128i k)
{
    return _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11));
}

__attribute__((target("pclmul"))) static uint32_t crc32_clmul(const crc32_tables *ct, uint32_t c,
                                                              const unsigned char *p, uint64_t n)
{
    if (n < 64u) {
        return crc32_update(ct, c, p, n);
    }
    const __m128i k512 = _mm_set_epi64x((long long)CRC_K512_HI, (long long)CRC_K512_LO);
    const __m128i k128 = _mm_set_epi64x((long long)CRC_K128_HI, (long long)CRC_K128_LO);
    __m128i x[4];
    for (int i = 0; i < 4; i++) {
        x[i] = _mm_loadu_si128((const __m128i *)(const void *)(p + 16 * i));
    }
    x[0] = _mm_xor_si128(x[0], _mm_cvtsi32_si128((int)c));
    p += 64;
    n -= 64u;
    while (n >= 64u) {
        for (int i = 0; i < 4; i++) {
            x[i] = _mm_xor_si128(crc32_fold(x[i], k512),
                                 _mm_loadu_si128((const __m128i *)(const void *)(p + 16 * i)));
        }
        p += 64;
        n -= 64u;
    }
    __m128i a = x[0];
    for (int i = 1; i < 4; i++) {
        a = _mm_xor_si128(crc32_fold(a, k128), x[i]);
    }
    while (n >= 16u) {
        a = _mm_xor_si128(crc32_fold(a, k128), _mm_loadu_si128((const __m128i *)(const void *)p));
        p += 16;
        n -= 16u;
    }
    unsigned char last[16];
    _mm_storeu_si128((__m128i *)(void *)last, a);
    return crc32_update(ct, crc32_update(ct, 0u, last, 16u), p, n);
}
#endif

static uint32_t crc32_of(const crc32_tables *ct, const unsigned char *p, uint64_t n)
{
#if defined(COLIBRI_X86_DISPATCH)
    if (crc32_have_clmul()) {
        return crc32_clmul(ct, 0xFFFFFFFFu, p, n) ^ 0xFFFFFFFFu;
    }
#endif
    return crc32_update(ct, 0xFFFFFFFFu, p, n) ^ 0xFFFFFFFFu;
}

/* 1 when all n fp32 values (little-endian, 4-aligned) are finite: exponent bits not all set.
 * Blocks of 1024 without branches so the compiler vectorises the scan. */
static int f32_all_finite(const unsigned char *p, uint64_t n)
{
    const uint32_t *w = (const uint32_t *)(const void *)p;
    while (n > 0u) {
        const uint64_t m = n < 1024u ? n : 1024u;
        uint32_t bad = 0;
        for (uint64_t i = 0; i < m; i++) {
            bad |= (uint32_t)((w[i] & 0x7F800000u) == 0x7F800000u);
        }
        if (bad != 0u) {
            return 0;
        }
        w += m;
        n -= m;
    }
    return 1;
}

void colibri_crc32_tables_init(colibri_crc32_tables *ct)
{
    crc32_tables_init(ct);
}

uint32_t colibri_crc32(const colibri_crc32_tables *ct, const unsigned char *p, uint64_t n)
{
    return crc32_of(ct, p, n);
}

uint32_t colibri_crc32_portable(const colibri_crc32_tables *ct, const unsigned char *p, uint64_t n)
{
    return crc32_update(ct, 0xFFFFFFFFu, p, n) ^ 0xFFFFFFFFu;
}

int colibri_f32_all_finite(const unsigned char *p, uint64_t n)
{
    return f32_all_finite(p, n);
}

/* ------------------------------------------------------------------------------------------ */
/* Minimal JSON scanner for config.json: top-level integer / bool / string values.             */

typedef struct {
    const char *p;
    const char *end;
} json_cursor;

static void json_ws(json_cursor *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) {
        c->p++;
    }
}

/* A string token; s and len get its raw contents (escapes left as written). */
static int json_string(json_cursor *c, const char **s, size_t *len)
{
    json_ws(c);
    if (c->p >= c->end || *c->p != '"') {
        return -1;
    }
    c->p++;
    const char *start = c->p;
    while (c->p < c->end && *c->p != '"') {
        if (*c->p == '\\') {
            c->p++;
        }
        c->p++;
    }
    if (c->p >= c->end) {
        return -1;
    }
    *s = start;
    *len = (size_t)(c->p - start);
    c->p++;
    return 0;
}

static int json_literal(json_cursor *c, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(c->end - c->p) >= n && memcmp(c->p, word, n) == 0) {
        c->p += n;
        return 0;
    }
    return -1;
}

/* Integer value (no fraction / exponent). */
static int json_int(json_cursor *c, int64_t *out)
{
    json_ws(c);
    int neg = 0;
    if (c->p < c->end && *c->p == '-') {
        neg = 1;
        c->p++;
    }
    if (c->p >= c->end || *c->p < '0' || *c->p > '9') {
        return -1;
    }
    int64_t v = 0;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
        if (v > (INT64_MAX - 9) / 10) {
            return -1;
        }
        v = v * 10 + (*c->p - '0');
        c->p++;
    }
    if (c->p < c->end && (*c->p == '.' || *c->p == 'e' || *c->p == 'E')) {
        return -1;
    }
    *out = neg ? -v : v;
    return 0;
}

static int json_skip_value(json_cursor *c, int depth)
{
    json_ws(c);
    if (c->p >= c->end || depth > 64) {
        return -1;
    }
    const char *s;
    size_t len;
    switch (*c->p) {
    case '"':
        return json_string(c, &s, &len);
    case '{':
    case '[': {
        const char close = (*c->p == '{') ? '}' : ']';
        const int is_obj = (close == '}');
        c->p++;
        json_ws(c);
        if (c->p < c->end && *c->p == close) {
            c->p++;
            return 0;
        }
        for (;;) {
            if (is_obj) {
                if (json_string(c, &s, &len) != 0) {
                    return -1;
                }
                json_ws(c);
                if (c->p >= c->end || *c->p != ':') {
                    return -1;
                }
                c->p++;
            }
            if (json_skip_value(c, depth + 1) != 0) {
                return -1;
            }
            json_ws(c);
            if (c->p < c->end && *c->p == ',') {
                c->p++;
                continue;
            }
            if (c->p < c->end && *c->p == close) {
                c->p++;
                return 0;
            }
            return -1;
        }
    }
    default:
        /* number or literal: consume up to a delimiter */
        while (c->p < c->end && *c->p != ',' && *c->p != '}' && *c->p != ']' && *c->p != ' ' &&
               *c->p != '\n' && *c->p != '\r' && *c->p != '\t') {
            c->p++;
        }
        return 0;
    }
}

typedef struct {
    int64_t n_experts, k, hidden, inter;
    int have_n_experts, have_k, have_hidden, have_inter;
    int norm_topk;
    int gated;
    colibri_activation activation;
} seed_config;

static int key_is(const char *s, size_t len, const char *key)
{
    return strlen(key) == len && memcmp(s, key, len) == 0;
}

static colibri_status parse_activation(json_cursor *c, seed_config *cfg)
{
    static const struct {
        const char *name;
        colibri_activation act;
        int gated;
    } k_acts[] = {
        {"gelu", COLIBRI_ACT_GELU, 0},   {"gelu_tanh", COLIBRI_ACT_GELU_TANH, 0},
        {"silu", COLIBRI_ACT_SILU, 0},   {"relu", COLIBRI_ACT_RELU, 0},
        {"swiglu", COLIBRI_ACT_SILU, 1},
    };
    const char *s;
    size_t len;
    if (json_string(c, &s, &len) != 0) {
        return COLIBRI_ERR_CONFIG;
    }
    for (size_t i = 0; i < sizeof(k_acts) / sizeof(k_acts[0]); i++) {
        if (key_is(s, len, k_acts[i].name)) {
            cfg->activation = k_acts[i].act;
            cfg->gated = k_acts[i].gated;
            return COLIBRI_OK;
        }
    }
    return COLIBRI_ERR_CONFIG;
}

static colibri_status parse_config_json(const char *text, size_t n, seed_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->activation = COLIBRI_ACT_GELU;
    json_cursor c = {text, text + n};
    json_ws(&c);
    if (c.p >= c.end || *c.p != '{') {
        return COLIBRI_ERR_CONFIG;
    }
    c.p++;
    json_ws(&c);
    if (c.p < c.end && *c.p == '}') {
        return COLIBRI_ERR_CONFIG; /* empty: required fields missing */
    }
    for (;;) {
        const char *key;
        size_t key_len;
        if (json_string(&c, &key, &key_len) != 0) {
            return COLIBRI_ERR_CONFIG;
        }
        json_ws(&c);
        if (c.p >= c.end || *c.p != ':') {
            return COLIBRI_ERR_CONFIG;
        }
        c.p++;
        json_ws(&c);
        int rc = 0;
        if (key_is(key, key_len, "n_experts")) {
            rc = json_int(&c, &cfg->n_experts);
            cfg->have_n_experts = 1;
        } else if (key_is(key, key_len, "k")) {
            rc = json_int(&c, &cfg->k);
            cfg->have_k = 1;
        } else if (key_is(key, key_len, "hidden_size")) {
            rc = json_int(&c, &cfg->hidden);
            cfg->have_hidden = 1;
        } else if (key_is(key, key_len, "intermediate_size")) {
            rc = json_int(&c, &cfg->inter);
            cfg->have_inter = 1;
        } else if (key_is(key, key_len, "activation")) {
            if (parse_activation(&c, cfg) != COLIBRI_OK) {
                return COLIBRI_ERR_CONFIG;
            }
        } else if (key_is(key, key_len, "norm_topk_prob")) {
            if (json_literal(&c, "true") == 0) {
                cfg->norm_topk = 1;
            } else if (json_literal(&c, "false") == 0 || json_literal(&c, "null") == 0) {
                cfg->norm_topk = 0;
            } else {
                return COLIBRI_ERR_CONFIG;
            }
        } else {
            rc = json_skip_value(&c, 0);
        }
        if (rc != 0) {
            return COLIBRI_ERR_CONFIG;
        }
        json_ws(&c);
        if (c.p < c.end && *c.p == ',') {
            c.p++;
            continue;
        }
        if (c.p < c.end && *c.p == '}') {
            break;
        }
        return COLIBRI_ERR_CONFIG;
    }
    if (!cfg->have_n_experts || !cfg->have_k || !cfg->have_hidden || !cfg->have_inter) {
        return COLIBRI_ERR_CONFIG;
    }
    if (cfg->n_experts < 1 || cfg->n_experts > (int64_t)CLB_MAX_EXPERTS || cfg->k < 1 ||
        cfg->k > cfg->n_experts || cfg->k > COLIBRI_MAX_TOP_K || cfg->hidden < 1 ||
        cfg->hidden > COLIBRI_FILE_MAX_DIM || cfg->inter < 1 || cfg->inter > COLIBRI_FILE_MAX_DIM) {
        return COLIBRI_ERR_CONFIG;
    }
    return COLIBRI_OK;
}

/* config.json beside model_path into cfg; *bytes = its size (part of the model's files). */
static colibri_status read_config(const char *model_path, seed_config *cfg, size_t *bytes)
{
    char path[SIBLING_PATH_MAX];
    if (sibling_path(model_path, "config.json", path, sizeof(path)) != 0) {
        return COLIBRI_ERR_CONFIG;
    }
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        return COLIBRI_ERR_CONFIG;
    }
    colibri_status st = COLIBRI_ERR_CONFIG;
    struct stat sb;
    if (fstat(fd, &sb) == 0 && sb.st_size > 0 && sb.st_size <= (off_t)CONFIG_MAX_BYTES) {
        size_t n = (size_t)sb.st_size;
        *bytes = n;
        char *text = (char *)malloc(n);
        if (text == NULL) {
            st = COLIBRI_ERR_NOMEM;
        } else {
            if (read_full(fd, text, n) == 0) {
                st = parse_config_json(text, n, cfg);
            }
            free(text);
        }
    }
    close(fd);
    return st;
}

/* ------------------------------------------------------------------------------------------ */
/* Model blocks: the weights block (shared by every handle on the file) and the handle block.   */

/*
 * Head of the weights block: what the handles of one model file share (colibri.h, Thread
 * safety). refs counts the handles (colibri_init's and colibri_init_shared's); the last one to
 * be cleaned up unmaps the file and frees the block. The weight table, sharing map and the
 * seed layout's router follow it in the same allocation and are read-only after init.
 */
typedef struct {
    atomic_size_t refs;
    void *map;
    size_t map_size;
} file_shared;

typedef struct {
    size_t stored, share, router, total;
} weights_layout;

static int add_ok(size_t *acc, size_t n)
{
    n = (n > SIZE_MAX - 15u) ? SIZE_MAX : COLIBRI_ALIGN16(n);
    if (n == SIZE_MAX || n > SIZE_MAX - *acc) {
        return -1;
    }
    *acc += n;
    return 0;
}

/*
 * Token rows per chunk for a file model: COLIBRI_FILE_MAX_TOKENS, halved while the workspace
 * exceeds budget, so the arena stays proportional to the model's files (chunking gives
 * identical results). 0 when even one row does not fit (or the dims are unusable).
 */
static int32_t file_max_tokens(const colibri_model_t *dims, size_t budget)
{
    int32_t t = COLIBRI_FILE_MAX_TOKENS;
    size_t ws = colibri_workspace_size(dims, t);
    while (ws != 0 && ws > budget && t > 1) {
        t /= 2;
        ws = colibri_workspace_size(dims, t);
    }
    return (ws == 0 || ws > budget) ? 0 : t;
}

/* The handle block: the descriptor, then arena_bytes of workspace and cache slots (from
 * *arena_off). NULL on overflow or when out of memory. */
static unsigned char *handle_block_alloc(size_t arena_bytes, size_t *arena_off)
{
    size_t acc = 0;
    if (add_ok(&acc, sizeof(colibri_model_t)) != 0) {
        return NULL;
    }
    *arena_off = acc;
    if (add_ok(&acc, arena_bytes) != 0) {
        return NULL;
    }
    return (unsigned char *)malloc(acc);
}

/* Free the blocks of a model that failed to load (no other handle can share it yet). */
static void blocks_free(colibri_model_t *m)
{
    void *weights = m->shared;
    free(m->owned_slots);
    free(m->owned_arena);
    free(m->owned); /* the descriptor lives inside this block */
    free(weights);
}

/*
 * Allocate and pre-fill the blocks for dims in `dims` (router_floats = floats to copy in) and
 * set up the loader for `policy` with up to n_slots slots. Callers have validated the files
 * first, and file_bytes is the size of all of the model's files: no block may be larger (a
 * fuzzed header cannot buy memory its file does not hold). The blocks: the weights block
 * (tables every handle shares, the seed layout's router), the handle block (descriptor and
 * slot bookkeeping), the arena (fewer token rows per chunk when more would not fit: same
 * results) and the slots' weight copies (no more than the experts in the file). Tiny experts
 * whose bookkeeping outweighs them get fewer slots (same results); a model whose tables
 * outweigh its weights (d_model 1 and the like, never a real model) gets COLIBRI_ERR_SIZE.
 */
static colibri_status block_alloc(const colibri_model_t *dims, size_t router_floats,
                                  colibri_cache_policy policy, int32_t n_slots, size_t file_bytes,
                                  colibri_model_t **out, float **router_out)
{
    const size_t e = (size_t)dims->n_experts;
    const size_t desc = COLIBRI_ALIGN16(sizeof(colibri_model_t));
    weights_layout lay;
    size_t acc = 0;
    if (add_ok(&acc, sizeof(file_shared)) != 0) {
        return COLIBRI_ERR_NOMEM;
    }
    lay.stored = acc;
    if (add_ok(&acc, e * sizeof(colibri_expert_weights_t)) != 0) {
        return COLIBRI_ERR_NOMEM;
    }
    lay.share = acc;
    if (add_ok(&acc, e * sizeof(int32_t)) != 0) {
        return COLIBRI_ERR_NOMEM;
    }
    lay.router = acc;
    if (router_floats > SIZE_MAX / 4u || add_ok(&acc, router_floats * 4u) != 0) {
        return COLIBRI_ERR_NOMEM;
    }
    lay.total = acc;
    const int32_t wanted = n_slots;
    while (n_slots > 0 && colibri_slot_book_bytes(n_slots) > file_bytes - desc) {
        n_slots--; /* desc <= file_bytes: checked below before it matters */
    }
    const size_t book = colibri_slot_book_bytes(n_slots);
    const size_t copies = colibri_slot_bytes_checked(n_slots, colibri_expert_floats(dims)) - book;
    const int32_t max_tokens = file_max_tokens(dims, file_bytes);
    if (lay.total > file_bytes || desc > file_bytes || (wanted > 0 && n_slots == 0) ||
        copies > file_bytes || max_tokens == 0) {
        return COLIBRI_ERR_SIZE;
    }
    const size_t ws = colibri_workspace_size(dims, max_tokens);

    size_t book_off = 0;
    unsigned char *block = handle_block_alloc(book, &book_off);
    unsigned char *weights = (block != NULL) ? (unsigned char *)malloc(lay.total) : NULL;
    void *arena = (weights != NULL) ? malloc(ws) : NULL;
    void *slot_copies = (arena != NULL && copies > 0) ? malloc(copies) : NULL;
    if (arena == NULL || (copies > 0 && slot_copies == NULL)) {
        free(arena);
        free(weights);
        free(block);
        return COLIBRI_ERR_NOMEM;
    }
    memset(weights, 0, lay.router); /* record and tables; the router is read in */
    file_shared *shared = (file_shared *)(void *)weights;
    atomic_init(&shared->refs, 1u);
    shared->map = NULL;
    shared->map_size = 0;

    colibri_model_t *m = (colibri_model_t *)(void *)block;
    *m = *dims;
    m->stored = (colibri_expert_weights_t *)(void *)(weights + lay.stored);
    m->share = (int32_t *)(void *)(weights + lay.share);
    float *router = (router_floats > 0) ? (float *)(void *)(weights + lay.router) : NULL;
    m->router_w = router;
    if (router_out != NULL) {
        *router_out = router;
    }
    m->kernels = NULL;
    m->arena = arena;
    m->arena_size = ws;
    m->max_tokens = max_tokens;
    m->owned = block;
    m->owned_arena = arena;
    m->owned_slots = slot_copies;
    m->shared = shared;
    m->is_static = 0;
    m->share_eff = NULL;
    colibri_loader_setup_split(m, policy, n_slots, block + book_off, (float *)slot_copies);
    *out = m;
    return COLIBRI_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Seed flat layout                                                                            */

static colibri_status load_seed(const colibri_config_t *config, int32_t n_slots,
                                const unsigned char *base, size_t size, colibri_model_t **out)
{
    if (rd_u32(base + 4) != 1u) {
        return COLIBRI_ERR_VERSION;
    }
    seed_config cfg;
    size_t config_bytes = 0;
    colibri_status st = read_config(config->model_path, &cfg, &config_bytes);
    if (st != COLIBRI_OK) {
        return st;
    }
    if (cfg.gated) {
        return COLIBRI_ERR_CONFIG; /* the seed layout has no W3 */
    }
    if ((int64_t)rd_u32(base + 8) != cfg.n_experts) {
        return COLIBRI_ERR_CONFIG;
    }
    const uint64_t e = (uint64_t)cfg.n_experts;
    const uint64_t d = (uint64_t)cfg.hidden;
    const uint64_t f = (uint64_t)cfg.inter;
    /* per expert: 2*d*f + f + d floats; d, f <= 2^24 and e < 2^16, so no product overflows */
    const uint64_t per_expert = 2u * d * f + f + d;
    const uint64_t expected = SEED_HEADER_BYTES + e * per_expert * 4u;
    if ((uint64_t)size < expected) {
        return COLIBRI_ERR_TRUNCATED;
    }
    if ((uint64_t)size > expected) {
        return COLIBRI_ERR_SIZE;
    }
    const int check_finite = (config->load_flags & COLIBRI_LOAD_SKIP_FINITE) == 0u;
    if (check_finite && !f32_all_finite(base + SEED_HEADER_BYTES, e * per_expert)) {
        return COLIBRI_ERR_NONFINITE;
    }

    char rpath[SIBLING_PATH_MAX];
    if (sibling_path(config->model_path, "router.bin", rpath, sizeof(rpath)) != 0) {
        return COLIBRI_ERR_IO;
    }
    int rfd = open(rpath, O_RDONLY);
    if (rfd < 0) {
        return COLIBRI_ERR_IO;
    }
    struct stat sb;
    if (fstat(rfd, &sb) != 0) {
        close(rfd);
        return COLIBRI_ERR_IO;
    }
    const uint64_t rsize = (uint64_t)sb.st_size; /* compared below with sizes < 2^42 */
    int router_bias;
    if (rsize == e * d * 4u) {
        router_bias = 0;
    } else if (rsize == (e * d + e) * 4u) {
        router_bias = 1;
    } else {
        close(rfd);
        return COLIBRI_ERR_SIZE;
    }

    colibri_model_t dims;
    memset(&dims, 0, sizeof(dims));
    dims.n_experts = (int32_t)cfg.n_experts;
    dims.d_model = (int32_t)cfg.hidden;
    dims.d_ff = (int32_t)cfg.inter;
    dims.top_k = (int32_t)cfg.k;
    dims.activation = cfg.activation;
    dims.flags = COLIBRI_FLAG_EXPERT_BIAS | (cfg.norm_topk ? COLIBRI_FLAG_NORM_TOPK : 0u) |
                 (router_bias ? COLIBRI_FLAG_ROUTER_BIAS : 0u);
    colibri_model_t *m = NULL;
    float *router = NULL;
    /* every expert owns weights here: more LRU slots than experts would never be used */
    const int32_t slots = n_slots < dims.n_experts ? n_slots : dims.n_experts;
    /* the model's files: weights, router and config (each checked against the config) */
    const uint64_t files = (uint64_t)size + rsize + (uint64_t)config_bytes; /* < 2^44 */
    st = block_alloc(&dims, (size_t)(rsize / 4u), config->cache_policy, slots,
                     files > (uint64_t)SIZE_MAX ? SIZE_MAX : (size_t)files, &m, &router);
    if (st != COLIBRI_OK) {
        close(rfd);
        return st;
    }
    if (read_full(rfd, router, (size_t)rsize) != 0) {
        close(rfd);
        blocks_free(m);
        return COLIBRI_ERR_IO;
    }
    close(rfd);
    if (check_finite && !f32_all_finite((const unsigned char *)router, rsize / 4u)) {
        blocks_free(m);
        return COLIBRI_ERR_NONFINITE;
    }
    m->router_b = router_bias ? router + (size_t)(e * d) : NULL;

    const float *w = (const float *)(const void *)(base + SEED_HEADER_BYTES);
    for (size_t i = 0; i < (size_t)e; i++) {
        colibri_expert_weights_t *sw = &m->stored[i];
        sw->w1 = w;
        w += d * f;
        sw->b1 = w;
        w += f;
        sw->w2 = w;
        w += f * d;
        sw->b2 = w;
        w += d;
        sw->w3 = NULL;
        m->share[i] = (int32_t)i;
    }
    *out = m;
    return COLIBRI_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Colibri container                                                                           */

typedef struct {
    char name[CLB_NAME_BYTES];
    uint32_t dtype, ndim;
    uint32_t shape[4];
    uint64_t offset, nbytes;
    uint32_t expert, crc32;
} clb_entry;

/* The header's fields, checked by header_read. */
typedef struct {
    uint32_t e, k, d, f, act, flags, n_tensors, meta_bytes;
    uint64_t table_off, meta_off, data_off;
} clb_header;

/*
 * Every header field, against the file size and the limits, before anything else: the table
 * and metadata inside the file and in their documented places, and the data area large enough
 * for the smallest model the dims imply (the router and one expert's matrices; at least one
 * expert owns weights). d, f <= 2^24 and e < 2^16 keep every product below 2^53.
 */
static colibri_status header_read(const unsigned char *base, size_t size, clb_header *h)
{
    if (size < CLB_HEADER_BYTES) {
        return COLIBRI_ERR_TRUNCATED;
    }
    if (rd_u32(base + 8) != 1u) {
        return COLIBRI_ERR_VERSION;
    }
    const uint64_t file_size = rd_u64(base + 72);
    if ((uint64_t)size < file_size) {
        return COLIBRI_ERR_TRUNCATED;
    }
    if ((uint64_t)size != file_size) {
        return COLIBRI_ERR_SIZE;
    }
    if (rd_u32(base + 12) != CLB_ALIGNMENT) {
        return COLIBRI_ERR_FORMAT;
    }
    h->e = rd_u32(base + 16);
    h->k = rd_u32(base + 20);
    h->d = rd_u32(base + 24);
    h->f = rd_u32(base + 28);
    h->act = rd_u32(base + 32);
    h->flags = rd_u32(base + 36);
    h->n_tensors = rd_u32(base + 40);
    h->meta_bytes = rd_u32(base + 44);
    h->table_off = rd_u64(base + 48);
    h->meta_off = rd_u64(base + 56);
    h->data_off = rd_u64(base + 64);
    if (h->e < 1 || h->e > CLB_MAX_EXPERTS || h->k < 1 || h->k > h->e || h->k > COLIBRI_MAX_TOP_K ||
        h->d < 1 || h->d > (uint32_t)COLIBRI_FILE_MAX_DIM || h->f < 1 ||
        h->f > (uint32_t)COLIBRI_FILE_MAX_DIM || h->act > (uint32_t)COLIBRI_ACT_RELU ||
        (h->flags & ~0xFu) != 0u) {
        return COLIBRI_ERR_CONFIG;
    }
    /* n_tensors < 2^32, so meta_off < 2^39 and meta_off + meta_bytes cannot overflow */
    const uint64_t table_end = CLB_HEADER_BYTES + (uint64_t)h->n_tensors * CLB_ENTRY_BYTES;
    if (h->table_off != CLB_HEADER_BYTES || h->meta_off != table_end ||
        h->data_off % CLB_ALIGNMENT != 0u) {
        return COLIBRI_ERR_FORMAT;
    }
    if (table_end > (uint64_t)size || h->meta_off + h->meta_bytes > (uint64_t)size ||
        h->data_off > (uint64_t)size) {
        return COLIBRI_ERR_TRUNCATED;
    }
    if (h->meta_off + h->meta_bytes > h->data_off) {
        return COLIBRI_ERR_FORMAT;
    }
    const uint64_t e = h->e, d = h->d, f = h->f;
    const int gated = (h->flags & COLIBRI_FLAG_GATED) != 0u;
    /* elements, at half a byte each at least (q4_32 is the format's smallest dtype); the
     * checking pass then holds the tensors the runtime uses to their exact fp32 sizes */
    uint64_t elems = e * d + d * f * (gated ? 3u : 2u);
    elems += (h->flags & COLIBRI_FLAG_ROUTER_BIAS) ? e : 0u;
    elems += (h->flags & COLIBRI_FLAG_EXPERT_BIAS) ? d + f : 0u;
    if (elems / 2u > (uint64_t)size - h->data_off) {
        return COLIBRI_ERR_TRUNCATED; /* the file is smaller than the tensors its header implies */
    }
    return COLIBRI_OK;
}

/* One table entry: a NUL-terminated name, 1..4 dims, a 64-aligned blob inside the data area. */
static colibri_status entry_read(const unsigned char *p, const clb_header *h, size_t file_size,
                                 clb_entry *en)
{
    memcpy(en->name, p, CLB_NAME_BYTES);
    if (memchr(en->name, '\0', CLB_NAME_BYTES) == NULL) {
        return COLIBRI_ERR_FORMAT;
    }
    en->dtype = rd_u32(p + 48);
    en->ndim = rd_u32(p + 52);
    for (int i = 0; i < 4; i++) {
        en->shape[i] = rd_u32(p + 56 + 4 * i);
    }
    en->offset = rd_u64(p + 72);
    en->nbytes = rd_u64(p + 80);
    en->expert = rd_u32(p + 88);
    en->crc32 = rd_u32(p + 92);
    if (en->ndim < 1 || en->ndim > 4) {
        return COLIBRI_ERR_FORMAT;
    }
    if (en->offset > (uint64_t)file_size || en->nbytes > (uint64_t)file_size - en->offset) {
        return COLIBRI_ERR_TRUNCATED;
    }
    if (en->offset % CLB_ALIGNMENT != 0u || en->offset < h->data_off) {
        return COLIBRI_ERR_FORMAT;
    }
    return COLIBRI_OK;
}

/* Shape must be exactly (a) or (a, b), nbytes = 4 * elements (a, b <= 2^24: no overflow). */
static colibri_status entry_shape(const clb_entry *en, uint32_t ndim, uint32_t a, uint32_t b)
{
    if (en->ndim != ndim || en->shape[0] != a || (ndim == 2 && en->shape[1] != b)) {
        return COLIBRI_ERR_SIZE;
    }
    uint64_t elems = (ndim == 2) ? (uint64_t)a * b : (uint64_t)a;
    if (en->nbytes != elems * 4u) {
        return COLIBRI_ERR_SIZE;
    }
    return COLIBRI_OK;
}

/* "expert.<i>.<part>": returns 0 and sets *idx / *part, else -1. */
static int parse_expert_name(const char *name, uint32_t *idx, const char **part)
{
    if (strncmp(name, "expert.", 7) != 0) {
        return -1;
    }
    const char *p = name + 7;
    if (*p < '0' || *p > '9') {
        return -1;
    }
    uint32_t v = 0;
    while (*p >= '0' && *p <= '9') {
        if (v > 100000u) {
            return -1;
        }
        v = v * 10u + (uint32_t)(*p - '0');
        p++;
    }
    if (*p != '.') {
        return -1;
    }
    *idx = v;
    *part = p + 1;
    return 0;
}

/* Index of an expert part name in {w1, b1, w2, b2, w3}, or -1. */
static int expert_part(const char *part)
{
    static const char *const k_parts[5] = {"w1", "b1", "w2", "b2", "w3"};
    for (int i = 0; i < 5; i++) {
        if (strcmp(part, k_parts[i]) == 0) {
            return i;
        }
    }
    return -1;
}

/* The fp32 tensors the runtime computes with (those scanned for NaN / Inf). */
static int entry_is_weight(const clb_entry *en)
{
    uint32_t idx;
    const char *part;
    return strcmp(en->name, "router.weight") == 0 || strcmp(en->name, "router.bias") == 0 ||
           (parse_expert_name(en->name, &idx, &part) == 0 && expert_part(part) >= 0);
}

typedef struct {
    const clb_header *h;
    const unsigned char *base;
    colibri_model_t *m;      /* NULL in the checking pass (nothing allocated yet) */
    const int32_t *file_map; /* expert_sharing_map tensor, if any (in the mmap) */
    int have_router_w, have_router_b;
    uint32_t n_w1; /* expert w1 tensors seen (bounds the useful LRU slots) */
} clb_state;

static colibri_status set_once(const float **slot, const float *value)
{
    if (*slot != NULL) {
        return COLIBRI_ERR_FORMAT; /* duplicated tensor */
    }
    *slot = value;
    return COLIBRI_OK;
}

/*
 * One entry, checked against the header's dims (cs->m == NULL: the pass before allocation,
 * which also records the sharing map and the router tensors), or stored into the model.
 */
static colibri_status container_entry(clb_state *cs, const clb_entry *en)
{
    const clb_header *h = cs->h;
    const void *blob = cs->base + en->offset;
    colibri_status st;

    if (strcmp(en->name, "expert_sharing_map") == 0) {
        if (en->dtype != CLB_DTYPE_I32) {
            return COLIBRI_ERR_UNSUPPORTED;
        }
        if ((st = entry_shape(en, 1, h->e, 0)) != COLIBRI_OK) {
            return st;
        }
        if (cs->m == NULL) {
            if (cs->file_map != NULL) {
                return COLIBRI_ERR_FORMAT;
            }
            cs->file_map = (const int32_t *)blob;
        }
        return COLIBRI_OK;
    }
    uint32_t idx = 0;
    const char *part = NULL;
    const int is_router_w = strcmp(en->name, "router.weight") == 0;
    const int is_router_b = strcmp(en->name, "router.bias") == 0;
    const int part_id = parse_expert_name(en->name, &idx, &part) == 0 ? expert_part(part) : -1;
    if (!is_router_w && !is_router_b && part_id < 0) {
        return COLIBRI_OK; /* unknown tensors are ignored (forward compatibility) */
    }
    if (en->dtype != CLB_DTYPE_F32) {
        return COLIBRI_ERR_UNSUPPORTED;
    }
    const float *data = (const float *)blob;
    if (is_router_w || is_router_b) {
        if ((st = entry_shape(en, is_router_w ? 2u : 1u, h->e, h->d)) != COLIBRI_OK) {
            return st;
        }
        int *have = is_router_w ? &cs->have_router_w : &cs->have_router_b;
        if (cs->m == NULL) {
            if (*have) {
                return COLIBRI_ERR_FORMAT;
            }
            *have = 1;
        } else if (is_router_w) {
            cs->m->router_w = data;
        } else {
            cs->m->router_b = data;
        }
        return COLIBRI_OK;
    }
    if (idx >= h->e || en->expert != idx) {
        return COLIBRI_ERR_FORMAT;
    }
    /* w1 / w3 [d, f], b1 [f], w2 [f, d], b2 [d] */
    static const uint8_t k_ndim[5] = {2, 1, 2, 1, 2};
    const uint32_t rows[5] = {h->d, h->f, h->f, h->d, h->d};
    const uint32_t cols[5] = {h->f, 0, h->d, 0, h->f};
    if ((st = entry_shape(en, k_ndim[part_id], rows[part_id], cols[part_id])) != COLIBRI_OK) {
        return st;
    }
    if (cs->m == NULL) {
        cs->n_w1 += (part_id == 0) ? 1u : 0u;
        return COLIBRI_OK;
    }
    colibri_expert_weights_t *w = &cs->m->stored[idx];
    const float **slots[5] = {&w->w1, &w->b1, &w->w2, &w->b2, &w->w3};
    return set_once(slots[part_id], data);
}

/* CRC-32 of every blob and NaN / Inf in every weight tensor (load_flags may skip either). */
static colibri_status container_integrity(const clb_header *h, const unsigned char *base,
                                          size_t size, uint32_t load_flags)
{
    const int check_crc = (load_flags & COLIBRI_LOAD_SKIP_CHECKSUM) == 0u;
    const int check_finite = (load_flags & COLIBRI_LOAD_SKIP_FINITE) == 0u;
    if (!check_crc && !check_finite) {
        return COLIBRI_OK;
    }
    crc32_tables tables;
    if (check_crc) {
        crc32_tables_init(&tables);
    }
    for (uint32_t i = 0; i < h->n_tensors; i++) {
        clb_entry en;
        colibri_status st =
            entry_read(base + h->table_off + (uint64_t)i * CLB_ENTRY_BYTES, h, size, &en);
        if (st != COLIBRI_OK) {
            return st; /* not reached: the checking pass read every entry */
        }
        const unsigned char *blob = base + en.offset;
        if (check_crc && crc32_of(&tables, blob, en.nbytes) != en.crc32) {
            return COLIBRI_ERR_CHECKSUM;
        }
        if (check_finite && en.dtype == CLB_DTYPE_F32 && entry_is_weight(&en) &&
            !f32_all_finite(blob, en.nbytes / 4u)) {
            return COLIBRI_ERR_NONFINITE;
        }
    }
    return COLIBRI_OK;
}

static colibri_status load_container(const colibri_config_t *config, int32_t n_slots,
                                     const unsigned char *base, size_t size, colibri_model_t **out)
{
    clb_header h;
    colibri_status st = header_read(base, size, &h);
    if (st != COLIBRI_OK) {
        return st;
    }
    /* Checking pass: every entry, no allocation. Blobs lie inside the data area in table order
     * without overlapping, so their sizes add up to no more than the file. */
    clb_state cs = {&h, base, NULL, NULL, 0, 0, 0};
    uint64_t prev_end = h.data_off;
    for (uint32_t i = 0; i < h.n_tensors && st == COLIBRI_OK; i++) {
        clb_entry en;
        st = entry_read(base + h.table_off + (uint64_t)i * CLB_ENTRY_BYTES, &h, size, &en);
        if (st == COLIBRI_OK) {
            st = (en.offset < prev_end) ? COLIBRI_ERR_FORMAT : container_entry(&cs, &en);
            prev_end = en.offset + en.nbytes; /* <= size (entry_read) */
        }
    }
    /* router.weight [e, d] and an expert's w1 [d, f], both fp32 and inside the file, bound
     * every dimension the allocation depends on; without them the file is incomplete */
    if (st == COLIBRI_OK && (!cs.have_router_w || cs.n_w1 == 0u ||
                             ((h.flags & COLIBRI_FLAG_ROUTER_BIAS) && !cs.have_router_b))) {
        st = COLIBRI_ERR_FORMAT;
    }
    const int32_t *map =
        (config->expert_sharing_map != NULL) ? config->expert_sharing_map : cs.file_map;
    if (st == COLIBRI_OK) {
        st = colibri_check_sharing_map(map, (int32_t)h.e);
    }
    if (st == COLIBRI_OK) {
        st = container_integrity(&h, base, size, config->load_flags);
    }
    if (st != COLIBRI_OK) {
        return st;
    }

    /* Slots beyond the experts that own weights (each has a w1 in the file) are never used. */
    uint32_t owners = 0;
    for (uint32_t i = 0; i < h.e; i++) {
        owners += (map == NULL || map[i] == (int32_t)i) ? 1u : 0u;
    }
    owners = owners < cs.n_w1 ? owners : cs.n_w1;
    const int32_t slots = (uint32_t)n_slots < owners ? n_slots : (int32_t)owners;

    colibri_model_t dims;
    memset(&dims, 0, sizeof(dims));
    dims.n_experts = (int32_t)h.e;
    dims.d_model = (int32_t)h.d;
    dims.d_ff = (int32_t)h.f;
    dims.top_k = (int32_t)h.k;
    dims.activation = (colibri_activation)h.act;
    dims.flags = h.flags;
    colibri_model_t *m = NULL;
    st = block_alloc(&dims, 0, config->cache_policy, slots, size, &m, NULL);
    if (st != COLIBRI_OK) {
        return st;
    }
    cs.m = m;
    for (uint32_t i = 0; i < h.n_tensors && st == COLIBRI_OK; i++) {
        clb_entry en;
        st = entry_read(base + h.table_off + (uint64_t)i * CLB_ENTRY_BYTES, &h, size, &en);
        if (st == COLIBRI_OK) {
            st = container_entry(&cs, &en);
        }
    }
    if (!(h.flags & COLIBRI_FLAG_ROUTER_BIAS)) {
        m->router_b = NULL;
    }
    for (uint32_t i = 0; i < h.e; i++) {
        m->share[i] = (map != NULL) ? map[i] : (int32_t)i;
        colibri_expert_weights_t *w = &m->stored[i];
        if (!(h.flags & COLIBRI_FLAG_EXPERT_BIAS)) {
            w->b1 = NULL;
            w->b2 = NULL;
        }
        if (!(h.flags & COLIBRI_FLAG_GATED)) {
            w->w3 = NULL;
        }
    }
    m->share_eff = m->share;
    if (st == COLIBRI_OK && colibri_check_stored(m) != COLIBRI_OK) {
        st = COLIBRI_ERR_FORMAT; /* an expert owning its weights lacks a tensor */
    }
    if (st != COLIBRI_OK) {
        blocks_free(m);
        return st;
    }
    *out = m;
    return COLIBRI_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Entry points                                                                                */

static const unsigned char k_clb_magic[8] = {'C', 'L', 'B', 'R', 'M', 'O', 'E', '\0'};

colibri_status colibri_init(const colibri_config_t *config, colibri_model_t **out_model)
{
    if (out_model != NULL) {
        *out_model = NULL;
    }
    if (config == NULL || out_model == NULL || config->model_path == NULL ||
        config->num_threads < 0) {
        return COLIBRI_ERR_ARG;
    }
    const int32_t n_slots = colibri_slot_count(config);
    if (n_slots < 0) {
        return COLIBRI_ERR_ARG;
    }
    if (!host_is_little_endian()) {
        return COLIBRI_ERR_UNSUPPORTED;
    }
    int fd = open(config->model_path, O_RDONLY);
    if (fd < 0) {
        return COLIBRI_ERR_IO;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return COLIBRI_ERR_IO;
    }
    if (sb.st_size < (off_t)SEED_HEADER_BYTES) {
        close(fd);
        return COLIBRI_ERR_TRUNCATED;
    }
    if ((uint64_t)sb.st_size > (uint64_t)SIZE_MAX) {
        close(fd);
        return COLIBRI_ERR_NOMEM;
    }
    const size_t size = (size_t)sb.st_size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        return COLIBRI_ERR_IO;
    }
    const unsigned char *base = (const unsigned char *)map;
    colibri_model_t *m = NULL;
    colibri_status st;
    if (memcmp(base, k_clb_magic, sizeof(k_clb_magic)) == 0) {
        st = load_container(config, n_slots, base, size, &m);
    } else if (rd_u32(base) == SEED_MAGIC) {
        st = load_seed(config, n_slots, base, size, &m);
    } else {
        st = COLIBRI_ERR_MAGIC;
    }
    if (st == COLIBRI_OK && config->expert_sharing_map != NULL && m->share_eff == NULL) {
        /* seed layout: the config's map aliases experts that all have weights */
        st = colibri_check_sharing_map(config->expert_sharing_map, m->n_experts);
        if (st == COLIBRI_OK) {
            memcpy(m->share, config->expert_sharing_map, (size_t)m->n_experts * 4u);
            m->share_eff = m->share;
        } else {
            blocks_free(m);
        }
    }
    if (st != COLIBRI_OK) {
        munmap(map, size);
        return st;
    }
    file_shared *shared = (file_shared *)m->shared;
    shared->map = map;
    shared->map_size = size;
    m->map_base = map;
    m->map_size = size;
    *out_model = m;
    return COLIBRI_OK;
}

/* Experts that own weights (their own sharing-map entry, weights present): the most LRU slots
 * a handle on base can use. */
static int32_t weight_owners(const colibri_model_t *base)
{
    int32_t owners = 0;
    for (int32_t i = 0; i < base->n_experts; i++) {
        const int32_t used = (base->share_eff != NULL) ? base->share_eff[i] : i;
        owners += (used == i && base->stored != NULL && base->stored[i].w1 != NULL) ? 1 : 0;
    }
    return owners;
}

colibri_status colibri_init_shared(const colibri_model_t *base, const colibri_config_t *config,
                                   colibri_model_t **out_model)
{
    if (out_model != NULL) {
        *out_model = NULL;
    }
    if (base == NULL || out_model == NULL) {
        return COLIBRI_ERR_ARG;
    }
    colibri_cache_policy policy;
    int32_t n_slots;
    colibri_status st = colibri_shared_policy(base, config, &policy, &n_slots);
    if (st != COLIBRI_OK) {
        return st;
    }
    const int32_t owners = weight_owners(base);
    if (n_slots > owners && owners > 0) {
        n_slots = owners; /* as colibri_init: more LRU slots would never be used */
    }
    const size_t ws = colibri_workspace_size(base, base->max_tokens);
    const size_t slots = colibri_slot_bytes_checked(n_slots, colibri_slot_capacity(base));
    if (ws == 0 || slots == SIZE_MAX || slots > SIZE_MAX - ws) {
        return COLIBRI_ERR_NOMEM;
    }
    size_t arena_off = 0;
    unsigned char *block = handle_block_alloc(ws + slots, &arena_off);
    if (block == NULL) {
        return COLIBRI_ERR_NOMEM;
    }
    colibri_model_t *m = (colibri_model_t *)(void *)block;
    st = colibri_shared_attach(m, base, policy, n_slots, block + arena_off, ws + slots,
                               base->max_tokens);
    if (st != COLIBRI_OK) {
        free(block);
        return st;
    }
    file_shared *shared = (file_shared *)base->shared;
    if (shared != NULL) {
        /* base's own reference keeps the count >= 1 during this call: relaxed suffices */
        atomic_fetch_add_explicit(&shared->refs, 1u, memory_order_relaxed);
        m->map_base = shared->map;
        m->map_size = shared->map_size;
    }
    m->shared = shared;
    m->owned = block; /* this handle's arena and slots are part of it */
    m->owned_arena = NULL;
    m->owned_slots = NULL;
    m->is_static = 0;
    *out_model = m;
    return COLIBRI_OK;
}

void colibri_file_release(colibri_model_t *model)
{
    file_shared *shared = (file_shared *)model->shared;
    free(model->owned_slots);
    free(model->owned_arena);
    free(model->owned); /* the descriptor lives inside this block */
    /* acq_rel: every handle's use of the weights happens before the last one frees them */
    if (shared != NULL &&
        atomic_fetch_sub_explicit(&shared->refs, 1u, memory_order_acq_rel) == 1u) {
        if (shared->map != NULL) {
            munmap(shared->map, shared->map_size);
        }
        free(shared); /* the head of the weights block */
    }
}

#else
/* ISO C forbids an empty translation unit. */
typedef int colibri_model_file_unused;
#endif /* COLIBRI_NO_FILESYSTEM */
