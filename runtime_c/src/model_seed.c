/**
 * @file model_seed.c
 * @brief colibri_init's reader of the seed flat layout: the model file (magic, version, the
 *        experts' fp32 weights) with config.json (a minimal JSON scanner for its top-level
 *        values) and router.bin beside it, validated completely before the blocks are
 *        allocated. POSIX builds only (compiled out with COLIBRI_NO_FILESYSTEM).
 */
#ifndef COLIBRI_NO_FILESYSTEM

#define _POSIX_C_SOURCE 200809L

#include "colibri.h"
#include "colibri_internal.h"
#include "model_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
    /* the required integer keys */
    const struct {
        const char *key;
        int64_t *value;
        int *have;
    } ints[] = {
        {"n_experts", &cfg->n_experts, &cfg->have_n_experts},
        {"k", &cfg->k, &cfg->have_k},
        {"hidden_size", &cfg->hidden, &cfg->have_hidden},
        {"intermediate_size", &cfg->inter, &cfg->have_inter},
    };
    const size_t n_ints = sizeof(ints) / sizeof(ints[0]);
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
        size_t ki = 0; /* the integer key's index in ints, or n_ints */
        while (ki < n_ints && !key_is(key, key_len, ints[ki].key)) {
            ki++;
        }
        if (ki < n_ints) {
            rc = json_int(&c, ints[ki].value);
            *ints[ki].have = 1;
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
/* Seed flat layout                                                                            */

colibri_status colibri_file_load_seed(const colibri_config_t *config, int32_t n_slots,
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
    if (check_finite && !colibri_f32_all_finite(base + SEED_HEADER_BYTES, e * per_expert)) {
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

    colibri_model_t dims = colibri_model_dims((int32_t)cfg.n_experts, (int32_t)cfg.hidden,
                                              (int32_t)cfg.inter, (int32_t)cfg.k, cfg.activation,
                                              COLIBRI_FLAG_EXPERT_BIAS |
                                                  (cfg.norm_topk ? COLIBRI_FLAG_NORM_TOPK : 0u) |
                                                  (router_bias ? COLIBRI_FLAG_ROUTER_BIAS : 0u));
    colibri_model_t *m = NULL;
    float *router = NULL;
    /* every expert owns weights here: more LRU slots than experts would never be used */
    const int32_t slots = n_slots < dims.n_experts ? n_slots : dims.n_experts;
    /* the model's files: weights, router and config (each checked against the config) */
    const uint64_t files = (uint64_t)size + rsize + (uint64_t)config_bytes; /* < 2^44 */
    st = colibri_file_block_alloc(&dims, (size_t)(rsize / 4u), config->cache_policy, slots,
                                  files > (uint64_t)SIZE_MAX ? SIZE_MAX : (size_t)files, &m,
                                  &router);
    if (st != COLIBRI_OK) {
        close(rfd);
        return st;
    }
    if (read_full(rfd, router, (size_t)rsize) != 0) {
        close(rfd);
        colibri_file_blocks_free(m);
        return COLIBRI_ERR_IO;
    }
    close(rfd);
    if (check_finite && !colibri_f32_all_finite((const unsigned char *)router, rsize / 4u)) {
        colibri_file_blocks_free(m);
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

#else
/* ISO C forbids an empty translation unit. */
typedef int colibri_model_seed_unused;
#endif /* COLIBRI_NO_FILESYSTEM */
