/**
 * @file model_file.c
 * @brief colibri_init for POSIX hosts: mmap a model file (Colibri container or the seed flat
 *        layout with config.json and router.bin beside it), validate it completely, and build
 *        the model in one allocation (descriptor, weight table, sharing map, arena, cache
 *        slots). The only file of the runtime that allocates; compiled out entirely with
 *        COLIBRI_NO_FILESYSTEM.
 */
#ifndef COLIBRI_NO_FILESYSTEM

#define _POSIX_C_SOURCE 200809L

#include "colibri.h"
#include "colibri_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* "dir/of/model" + name, malloc'd; NULL when out of memory. */
static char *sibling_path(const char *model_path, const char *name)
{
    const char *slash = strrchr(model_path, '/');
    size_t dir_len = (slash != NULL) ? (size_t)(slash - model_path) + 1u : 0u;
    size_t name_len = strlen(name);
    char *out = (char *)malloc(dir_len + name_len + 1u);
    if (out != NULL) {
        memcpy(out, model_path, dir_len);
        memcpy(out + dir_len, name, name_len + 1u);
    }
    return out;
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
        cfg->hidden > INT32_MAX || cfg->inter < 1 || cfg->inter > INT32_MAX) {
        return COLIBRI_ERR_CONFIG;
    }
    return COLIBRI_OK;
}

static colibri_status read_config(const char *model_path, seed_config *cfg)
{
    char *path = sibling_path(model_path, "config.json");
    if (path == NULL) {
        return COLIBRI_ERR_NOMEM;
    }
    int fd = open(path, O_RDONLY);
    free(path);
    if (fd < 0) {
        return COLIBRI_ERR_CONFIG;
    }
    colibri_status st = COLIBRI_ERR_CONFIG;
    struct stat sb;
    if (fstat(fd, &sb) == 0 && sb.st_size > 0 && sb.st_size <= (off_t)CONFIG_MAX_BYTES) {
        size_t n = (size_t)sb.st_size;
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
/* Model block: one allocation for the descriptor and everything it points to.                 */

typedef struct {
    size_t stored, share, router, arena, slots, total;
} block_layout;

static int add_ok(size_t *acc, size_t n)
{
    n = (n > SIZE_MAX - 15u) ? SIZE_MAX : COLIBRI_ALIGN16(n);
    if (n == SIZE_MAX || n > SIZE_MAX - *acc) {
        return -1;
    }
    *acc += n;
    return 0;
}

/* Allocate and pre-fill the block for dims in `dims` (router_floats = floats to copy in). */
static colibri_status block_alloc(const colibri_model_t *dims, size_t router_floats,
                                  int32_t n_slots, colibri_model_t **out, float **router_out)
{
    const size_t e = (size_t)dims->n_experts;
    const size_t ws = colibri_workspace_size(dims, COLIBRI_FILE_MAX_TOKENS);
    const size_t slots = colibri_slot_bytes_checked(n_slots, colibri_expert_floats(dims));
    block_layout lay;
    size_t acc = 0;
    if (ws == 0 || slots == SIZE_MAX || add_ok(&acc, sizeof(colibri_model_t)) != 0) {
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
    lay.arena = acc;
    if (add_ok(&acc, ws) != 0) {
        return COLIBRI_ERR_NOMEM;
    }
    lay.slots = acc;
    if (add_ok(&acc, slots) != 0) {
        return COLIBRI_ERR_NOMEM;
    }
    lay.total = acc;

    unsigned char *block = (unsigned char *)malloc(lay.total);
    if (block == NULL) {
        return COLIBRI_ERR_NOMEM;
    }
    memset(block, 0, lay.arena); /* descriptor and tables; arena/slots need no clearing */
    colibri_model_t *m = (colibri_model_t *)(void *)block;
    *m = *dims;
    m->stored = (colibri_expert_weights_t *)(void *)(block + lay.stored);
    m->share = (int32_t *)(void *)(block + lay.share);
    float *router = (router_floats > 0) ? (float *)(void *)(block + lay.router) : NULL;
    m->router_w = router;
    if (router_out != NULL) {
        *router_out = router;
    }
    m->kernels = NULL;
    m->arena = block + lay.arena;
    m->arena_size = ws;
    m->max_tokens = COLIBRI_FILE_MAX_TOKENS;
    m->owned = block;
    m->is_static = 0;
    m->share_eff = NULL;
    m->slot_mem = (float *)(void *)(block + lay.slots); /* carved by colibri_loader_setup */
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
    colibri_status st = read_config(config->model_path, &cfg);
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
    /* per expert: 2*d*f + f + d floats; d, f < 2^31 so 2*d*f < 2^63 */
    const uint64_t per_expert = 2u * d * f + f + d;
    if (per_expert > (UINT64_MAX - SEED_HEADER_BYTES) / 4u / e) {
        return COLIBRI_ERR_SIZE;
    }
    const uint64_t expected = SEED_HEADER_BYTES + e * per_expert * 4u;
    if ((uint64_t)size < expected) {
        return COLIBRI_ERR_TRUNCATED;
    }
    if ((uint64_t)size > expected) {
        return COLIBRI_ERR_SIZE;
    }

    char *rpath = sibling_path(config->model_path, "router.bin");
    if (rpath == NULL) {
        return COLIBRI_ERR_NOMEM;
    }
    int rfd = open(rpath, O_RDONLY);
    free(rpath);
    if (rfd < 0) {
        return COLIBRI_ERR_IO;
    }
    struct stat sb;
    if (fstat(rfd, &sb) != 0) {
        close(rfd);
        return COLIBRI_ERR_IO;
    }
    const uint64_t rsize = (uint64_t)sb.st_size;
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
    st = block_alloc(&dims, (size_t)(rsize / 4u), n_slots, &m, &router);
    if (st != COLIBRI_OK) {
        close(rfd);
        return st;
    }
    if (read_full(rfd, router, (size_t)rsize) != 0) {
        close(rfd);
        free(m->owned);
        return COLIBRI_ERR_IO;
    }
    close(rfd);
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
    uint32_t expert;
} clb_entry;

static colibri_status entry_read(const unsigned char *p, size_t file_size, clb_entry *en)
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
    if (en->ndim < 1 || en->ndim > 4) {
        return COLIBRI_ERR_FORMAT;
    }
    if (en->offset > (uint64_t)file_size || en->nbytes > (uint64_t)file_size - en->offset) {
        return COLIBRI_ERR_TRUNCATED;
    }
    if (en->offset % CLB_ALIGNMENT != 0u) {
        return COLIBRI_ERR_FORMAT;
    }
    return COLIBRI_OK;
}

/* Shape must be exactly (a) or (a, b), nbytes = 4 * elements. */
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

typedef struct {
    const colibri_model_t *dims;
    const unsigned char *base;
    colibri_model_t *m;
    const int32_t *file_map; /* expert_sharing_map tensor, if any (in the mmap) */
    int have_router_w, have_router_b;
} clb_state;

static colibri_status set_once(const float **slot, const float *value)
{
    if (*slot != NULL) {
        return COLIBRI_ERR_FORMAT; /* duplicated tensor */
    }
    *slot = value;
    return COLIBRI_OK;
}

static colibri_status container_entry(clb_state *cs, const clb_entry *en)
{
    const colibri_model_t *dm = cs->dims;
    const uint32_t e = (uint32_t)dm->n_experts;
    const uint32_t d = (uint32_t)dm->d_model;
    const uint32_t f = (uint32_t)dm->d_ff;
    const void *blob = cs->base + en->offset;
    colibri_status st;

    if (strcmp(en->name, "expert_sharing_map") == 0) {
        if (en->dtype != CLB_DTYPE_I32) {
            return COLIBRI_ERR_UNSUPPORTED;
        }
        if ((st = entry_shape(en, 1, e, 0)) != COLIBRI_OK) {
            return st;
        }
        if (cs->file_map != NULL) {
            return COLIBRI_ERR_FORMAT;
        }
        cs->file_map = (const int32_t *)blob;
        return COLIBRI_OK;
    }
    uint32_t idx = 0;
    const char *part = NULL;
    const int is_router_w = strcmp(en->name, "router.weight") == 0;
    const int is_router_b = strcmp(en->name, "router.bias") == 0;
    const int is_expert = parse_expert_name(en->name, &idx, &part) == 0;
    if (!is_router_w && !is_router_b && !is_expert) {
        return COLIBRI_OK; /* unknown tensors are ignored (forward compatibility) */
    }
    if (en->dtype != CLB_DTYPE_F32) {
        return COLIBRI_ERR_UNSUPPORTED;
    }
    const float *data = (const float *)blob;
    if (is_router_w) {
        if ((st = entry_shape(en, 2, e, d)) != COLIBRI_OK) {
            return st;
        }
        if (cs->have_router_w) {
            return COLIBRI_ERR_FORMAT;
        }
        cs->have_router_w = 1;
        cs->m->router_w = data;
        return COLIBRI_OK;
    }
    if (is_router_b) {
        if ((st = entry_shape(en, 1, e, 0)) != COLIBRI_OK) {
            return st;
        }
        if (cs->have_router_b) {
            return COLIBRI_ERR_FORMAT;
        }
        cs->have_router_b = 1;
        cs->m->router_b = data;
        return COLIBRI_OK;
    }
    if (idx >= e || en->expert != idx) {
        return COLIBRI_ERR_FORMAT;
    }
    colibri_expert_weights_t *w = &cs->m->stored[idx];
    if (strcmp(part, "w1") == 0 || strcmp(part, "w3") == 0) {
        if ((st = entry_shape(en, 2, d, f)) != COLIBRI_OK) {
            return st;
        }
        return set_once(part[1] == '1' ? &w->w1 : &w->w3, data);
    }
    if (strcmp(part, "w2") == 0) {
        if ((st = entry_shape(en, 2, f, d)) != COLIBRI_OK) {
            return st;
        }
        return set_once(&w->w2, data);
    }
    if (strcmp(part, "b1") == 0) {
        if ((st = entry_shape(en, 1, f, 0)) != COLIBRI_OK) {
            return st;
        }
        return set_once(&w->b1, data);
    }
    if (strcmp(part, "b2") == 0) {
        if ((st = entry_shape(en, 1, d, 0)) != COLIBRI_OK) {
            return st;
        }
        return set_once(&w->b2, data);
    }
    return COLIBRI_OK; /* unknown expert tensor */
}

static colibri_status load_container(const colibri_config_t *config, int32_t n_slots,
                                     const unsigned char *base, size_t size, colibri_model_t **out)
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
    const uint32_t e = rd_u32(base + 16), k = rd_u32(base + 20), d = rd_u32(base + 24),
                   f = rd_u32(base + 28), act = rd_u32(base + 32), flags = rd_u32(base + 36),
                   n_tensors = rd_u32(base + 40), meta_bytes = rd_u32(base + 44);
    const uint64_t table_off = rd_u64(base + 48), meta_off = rd_u64(base + 56),
                   data_off = rd_u64(base + 64);
    if (e < 1 || e > CLB_MAX_EXPERTS || k < 1 || k > e || k > COLIBRI_MAX_TOP_K || d < 1 ||
        d > (uint32_t)INT32_MAX || f < 1 || f > (uint32_t)INT32_MAX ||
        act > (uint32_t)COLIBRI_ACT_RELU || (flags & ~0xFu) != 0u) {
        return COLIBRI_ERR_CONFIG;
    }
    if (table_off < CLB_HEADER_BYTES || data_off % CLB_ALIGNMENT != 0u) {
        return COLIBRI_ERR_FORMAT;
    }
    if (table_off > (uint64_t)size ||
        (uint64_t)n_tensors * CLB_ENTRY_BYTES > (uint64_t)size - table_off ||
        meta_off > (uint64_t)size || (uint64_t)meta_bytes > (uint64_t)size - meta_off ||
        data_off > (uint64_t)size) {
        return COLIBRI_ERR_TRUNCATED;
    }

    colibri_model_t dims;
    memset(&dims, 0, sizeof(dims));
    dims.n_experts = (int32_t)e;
    dims.d_model = (int32_t)d;
    dims.d_ff = (int32_t)f;
    dims.top_k = (int32_t)k;
    dims.activation = (colibri_activation)act;
    dims.flags = flags;
    colibri_model_t *m = NULL;
    colibri_status st = block_alloc(&dims, 0, n_slots, &m, NULL);
    if (st != COLIBRI_OK) {
        return st;
    }
    clb_state cs = {&dims, base, m, NULL, 0, 0};
    for (uint32_t i = 0; i < n_tensors && st == COLIBRI_OK; i++) {
        clb_entry en;
        st = entry_read(base + table_off + (uint64_t)i * CLB_ENTRY_BYTES, size, &en);
        if (st == COLIBRI_OK) {
            st = container_entry(&cs, &en);
        }
    }
    if (st == COLIBRI_OK &&
        (!cs.have_router_w || ((flags & COLIBRI_FLAG_ROUTER_BIAS) && !cs.have_router_b))) {
        st = COLIBRI_ERR_FORMAT;
    }
    if (!(flags & COLIBRI_FLAG_ROUTER_BIAS)) {
        m->router_b = NULL;
    }
    const int32_t *map =
        (config->expert_sharing_map != NULL) ? config->expert_sharing_map : cs.file_map;
    if (st == COLIBRI_OK) {
        st = colibri_check_sharing_map(map, (int32_t)e);
    }
    for (uint32_t i = 0; i < e && st == COLIBRI_OK; i++) {
        m->share[i] = (map != NULL) ? map[i] : (int32_t)i;
        colibri_expert_weights_t *w = &m->stored[i];
        if (!(flags & COLIBRI_FLAG_EXPERT_BIAS)) {
            w->b1 = NULL;
            w->b2 = NULL;
        }
        if (!(flags & COLIBRI_FLAG_GATED)) {
            w->w3 = NULL;
        }
    }
    if (st != COLIBRI_OK) {
        free(m->owned);
        return st;
    }
    m->share_eff = m->share;
    if (colibri_check_stored(m) != COLIBRI_OK) {
        free(m->owned);
        return COLIBRI_ERR_FORMAT; /* an expert owning its weights lacks a tensor */
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
            free(m->owned);
        }
    }
    if (st != COLIBRI_OK) {
        munmap(map, size);
        return st;
    }
    m->map_base = map;
    m->map_size = size;
    colibri_loader_setup(m, config->cache_policy, n_slots,
                         (void *)m->slot_mem /* start of the slot area */);
    *out_model = m;
    return COLIBRI_OK;
}

void colibri_file_release(colibri_model_t *model)
{
    void *map = model->map_base;
    size_t size = model->map_size;
    void *owned = model->owned;
    if (map != NULL) {
        munmap(map, size);
    }
    free(owned); /* the descriptor lives inside this block */
}

#else
/* ISO C forbids an empty translation unit. */
typedef int colibri_model_file_unused;
#endif /* COLIBRI_NO_FILESYSTEM */
