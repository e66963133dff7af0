/**
 * @file icount.c
 * @brief QEMU TCG plugin: counts guest instructions executed between entering the function at
 *        `begin` and entering the function at `end` (the platform's bench markers), summed over
 *        every begin/end pair. Deterministic: every translated instruction adds one with an
 *        inline counter, and the snapshots are taken by callbacks on the two marker addresses.
 *
 * Arguments (-plugin libicount.so,begin=0x...,end=0x...[,begin_sym=NAME,end_sym=NAME][,out=F]):
 *   begin/end          guest virtual addresses of the markers' first instruction
 *   begin_sym/end_sym  marker symbol names, matched instead of addresses when QEMU knows the
 *                      guest's symbols (position-independent executables under qemu-user)
 *   out                file for the result line (default: QEMU's log, -d plugin)
 *   sub_prefix         (repeatable, up to 16) the functions whose names start with it are counted
 *                      inclusively, their callees included, while inside a begin..end pair: a call
 *                      starts at the first translation block of such a function entered from
 *                      another function and ends at the first block executed again in that
 *                      calling function (the return). Needs QEMU to know the guest's symbols;
 *                      the per-block callbacks make the run slower, so only when asked for.
 * Result: "icount region=<n> pairs=<k> total=<t>", then " sub=<s> calls=<c>" with sub_prefix.
 *
 * Debian ships no qemu-plugin.h, so the few declarations of QEMU's plugin API (version 1, as in
 * QEMU 7.2) that this file needs are written out below.
 */
#define _POSIX_C_SOURCE 200809L

#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- QEMU plugin API (subset of include/qemu/qemu-plugin.h, QEMU 7.2) ---------------------- */
#define QEMU_PLUGIN_EXPORT __attribute__((visibility("default")))
#define QEMU_PLUGIN_VERSION 1

typedef uint64_t qemu_plugin_id_t;
typedef struct qemu_info_t qemu_info_t; /* only passed through */
struct qemu_plugin_tb;
struct qemu_plugin_insn;

enum qemu_plugin_cb_flags { QEMU_PLUGIN_CB_NO_REGS, QEMU_PLUGIN_CB_R_REGS, QEMU_PLUGIN_CB_RW_REGS };
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };

typedef void (*qemu_plugin_vcpu_tb_trans_cb_t)(qemu_plugin_id_t id, struct qemu_plugin_tb *tb);
typedef void (*qemu_plugin_vcpu_udata_cb_t)(unsigned int vcpu_index, void *userdata);
typedef void (*qemu_plugin_udata_cb_t)(qemu_plugin_id_t id, void *userdata);

void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_tb_trans_cb_t cb);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
struct qemu_plugin_insn *qemu_plugin_tb_get_insn(const struct qemu_plugin_tb *tb, size_t idx);
uint64_t qemu_plugin_insn_vaddr(const struct qemu_plugin_insn *insn);
const char *qemu_plugin_insn_symbol(const struct qemu_plugin_insn *insn);
void qemu_plugin_register_vcpu_insn_exec_cb(struct qemu_plugin_insn *insn,
                                            qemu_plugin_vcpu_udata_cb_t cb,
                                            enum qemu_plugin_cb_flags flags, void *userdata);
void qemu_plugin_register_vcpu_tb_exec_cb(struct qemu_plugin_tb *tb, qemu_plugin_vcpu_udata_cb_t cb,
                                          enum qemu_plugin_cb_flags flags, void *userdata);
void qemu_plugin_register_vcpu_insn_exec_inline(struct qemu_plugin_insn *insn,
                                                enum qemu_plugin_op op, void *ptr, uint64_t imm);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, qemu_plugin_udata_cb_t cb, void *userdata);
void qemu_plugin_outs(const char *string);

QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc,
                                           char **argv);
/* -------------------------------------------------------------------------------------------- */

QEMU_PLUGIN_EXPORT int qemu_plugin_version = QEMU_PLUGIN_VERSION;

enum { MARK_BEGIN = 1, MARK_END = 2 };

static uint64_t begin_addr = UINT64_MAX;
static uint64_t end_addr = UINT64_MAX;
static char *begin_sym;
static char *end_sym;
static char *out_path;

static uint64_t total;      /* instructions executed so far (inline counter) */
static uint64_t region;     /* instructions inside completed begin..end pairs */
static uint64_t pairs;      /* completed pairs */
static uint64_t started_at; /* total when the open pair began */
static bool inside;

enum { MAX_SUB = 16 };
static char *sub_syms[MAX_SUB];
static int n_sub;
static uint64_t sub;           /* instructions inside completed sub_prefix calls */
static uint64_t sub_calls;     /* completed sub_prefix calls */
static uint64_t sub_start;     /* total when the open call began */
static const char *sub_caller; /* the function the open call was entered from, NULL if none */
static const char *prev_sym;   /* the function of the block executed last */

/** What a translated block is, for the sub_prefix callbacks. */
typedef struct {
    const char *sym; /* the function of its first instruction (QEMU's symbol table) or NULL */
    bool is_sub;     /* that function's name starts with a sub_prefix */
} block_info;

static void on_marker(unsigned int vcpu_index, void *userdata)
{
    (void)vcpu_index;
    if ((uintptr_t)userdata == MARK_BEGIN) {
        if (!inside) {
            inside = true;
            started_at = total;
        }
    } else if (inside) {
        inside = false;
        region += total - started_at;
        pairs++;
    }
}

static bool same_sym(const char *a, const char *b)
{
    return a != NULL && b != NULL && (a == b || strcmp(a, b) == 0);
}

static void on_block(unsigned int vcpu_index, void *userdata)
{
    (void)vcpu_index;
    const block_info *b = userdata;
    if (sub_caller != NULL) {
        if (!b->is_sub && same_sym(b->sym, sub_caller)) { /* returned to the caller */
            sub += total - sub_start;
            sub_calls++;
            sub_caller = NULL;
        }
    } else if (b->is_sub && inside && prev_sym != NULL && !same_sym(prev_sym, b->sym)) {
        sub_caller = prev_sym;
        sub_start = total;
    }
    prev_sym = b->sym;
}

static int marker_of(const struct qemu_plugin_insn *insn)
{
    uint64_t vaddr = qemu_plugin_insn_vaddr(insn);
    if (vaddr == begin_addr) {
        return MARK_BEGIN;
    }
    if (vaddr == end_addr) {
        return MARK_END;
    }
    if (begin_sym != NULL || end_sym != NULL) {
        const char *sym = qemu_plugin_insn_symbol(insn);
        /* QEMU names the function containing the instruction: every instruction of a marker
         * function matches, and on_marker only acts on the first one of each pair. */
        if (sym != NULL) {
            if (begin_sym != NULL && strcmp(sym, begin_sym) == 0) {
                return MARK_BEGIN;
            }
            if (end_sym != NULL && strcmp(sym, end_sym) == 0) {
                return MARK_END;
            }
        }
    }
    return 0;
}

static void on_translate(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    (void)id;
    size_t n = qemu_plugin_tb_n_insns(tb);
    if (n_sub > 0 && n > 0) {
        block_info *b = calloc(1, sizeof *b); /* lives as long as the translation: never freed */
        if (b != NULL) {
            b->sym = qemu_plugin_insn_symbol(qemu_plugin_tb_get_insn(tb, 0));
            for (int i = 0; i < n_sub && b->sym != NULL; i++) {
                b->is_sub = b->is_sub || strncmp(b->sym, sub_syms[i], strlen(sub_syms[i])) == 0;
            }
            qemu_plugin_register_vcpu_tb_exec_cb(tb, on_block, QEMU_PLUGIN_CB_NO_REGS, b);
        }
    }
    for (size_t i = 0; i < n; i++) {
        struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        int mark = marker_of(insn);
        if (mark != 0) {
            /* Registered before the increment: the marker's own instruction counts inside. */
            qemu_plugin_register_vcpu_insn_exec_cb(insn, on_marker, QEMU_PLUGIN_CB_NO_REGS,
                                                   (void *)(uintptr_t)mark);
        }
        qemu_plugin_register_vcpu_insn_exec_inline(insn, QEMU_PLUGIN_INLINE_ADD_U64, &total, 1);
    }
}

static void on_plugin_exit(qemu_plugin_id_t id, void *userdata)
{
    (void)id;
    (void)userdata;
    char line[224];
    int len =
        snprintf(line, sizeof line, "icount region=%" PRIu64 " pairs=%" PRIu64 " total=%" PRIu64,
                 region, pairs, total);
    if (n_sub > 0 && len > 0 && (size_t)len < sizeof line) {
        len += snprintf(line + len, sizeof line - (size_t)len, " sub=%" PRIu64 " calls=%" PRIu64,
                        sub, sub_calls);
    }
    if (len > 0 && (size_t)len < sizeof line - 1) {
        line[len] = '\n';
        line[len + 1] = '\0';
    }
    if (out_path != NULL) {
        FILE *f = fopen(out_path, "w");
        if (f != NULL) {
            fputs(line, f);
            fclose(f);
            return;
        }
    }
    qemu_plugin_outs(line);
}

static bool parse_u64(const char *text, uint64_t *out)
{
    char *end = NULL;
    unsigned long long v = strtoull(text, &end, 0);
    if (end == text || *end != '\0') {
        return false;
    }
    *out = (uint64_t)v;
    return true;
}

QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc,
                                           char **argv)
{
    (void)info;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        bool ok = true;
        if (strncmp(arg, "begin=", 6) == 0) {
            ok = parse_u64(arg + 6, &begin_addr);
        } else if (strncmp(arg, "end=", 4) == 0) {
            ok = parse_u64(arg + 4, &end_addr);
        } else if (strncmp(arg, "begin_sym=", 10) == 0) {
            begin_sym = strdup(arg + 10);
        } else if (strncmp(arg, "end_sym=", 8) == 0) {
            end_sym = strdup(arg + 8);
        } else if (strncmp(arg, "sub_prefix=", 11) == 0) {
            ok = n_sub < MAX_SUB && arg[11] != '\0';
            if (ok) {
                sub_syms[n_sub++] = strdup(arg + 11);
            }
        } else if (strncmp(arg, "out=", 4) == 0) {
            out_path = strdup(arg + 4);
        } else {
            ok = false;
        }
        if (!ok) {
            fprintf(stderr, "icount: bad argument '%s'\n", arg);
            return -1;
        }
    }
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate);
    qemu_plugin_register_atexit_cb(id, on_plugin_exit, NULL);
    return 0;
}
