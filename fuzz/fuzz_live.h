/**
 * @file fuzz_live.h
 * @brief Shared part of the harnesses that check a documented memory bound (fuzz_lm.c,
 *        fuzz_shared.c): a private temporary directory for the files the runtime reads, and a
 *        live-bytes hook that fails the run when the bytes the runtime holds at once exceed
 *        the bound the public header documents for the input.
 *
 * fuzz_common.h's hook bounds each allocation by the input size (colibri_init's rule). The
 * whole-model runtime and colibri_init_shared document a bound on the sum instead (a formula
 * of the file and the caller's config: colibri_lm.h, colibri.h), so this hook tracks the live
 * bytes: ASan's malloc hook adds each allocation's size, its free hook subtracts
 * __sanitizer_get_allocated_size of the pointer, and only while armed (allocations made or
 * freed outside the armed window are not counted, so the harness itself allocates nothing
 * between fuzz_live_arm and fuzz_live_disarm). The peak over the window must stay at or below
 * the bound given to fuzz_live_arm; the largest peak / input ratio is reported at exit.
 * Build with -fsanitize=fuzzer,address,undefined.
 */
#ifndef COLIBRI_FUZZ_LIVE_H
#define COLIBRI_FUZZ_LIVE_H

#define _POSIX_C_SOURCE 200809L

#include "colibri.h"

#include <fcntl.h>
#include <sanitizer/allocator_interface.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char g_live_dir[64];
static atomic_int g_live_armed;          /* 1 while the runtime runs */
static atomic_llong g_live_bytes;        /* bytes allocated and not freed since fuzz_live_arm */
static atomic_llong g_live_peak;         /* largest g_live_bytes since fuzz_live_arm */
static unsigned long long g_live_bound;  /* bytes the peak may reach */
static const char *g_live_what = "";     /* what the bound is, for the message */
static unsigned long long g_live_single; /* largest single allocation allowed (0: any) */
static size_t g_live_input;              /* input size of the armed run */
static double g_live_ratio;              /* largest peak / input seen */
static size_t g_live_ratio_peak, g_live_ratio_input;
static size_t g_live_largest, g_live_largest_input; /* largest single armed allocation */

/* colibri_init's documented bound on its live bytes: 4 x the model's files (colibri.h). */
#define FUZZ_INIT_RATIO 4u

/* A contract violation: stop counting (libFuzzer's crash report allocates), then abort. */
static inline void fuzz_fail(void)
{
    atomic_store(&g_live_armed, 0);
    abort(); /* libFuzzer reports the input as a crash */
}

static void fuzz_live_malloc_hook(const volatile void *ptr, size_t size)
{
    (void)ptr;
    if (atomic_load(&g_live_armed) == 0) {
        return;
    }
    if (g_live_single > 0u && size > g_live_single) {
        fprintf(stderr, "colibri fuzz: allocation of %zu bytes for a %zu-byte input (limit %llu)\n",
                size, g_live_input, g_live_single);
        fuzz_fail();
    }
    if (size > g_live_largest) {
        g_live_largest = size;
        g_live_largest_input = g_live_input;
    }
    const long long now = atomic_fetch_add(&g_live_bytes, (long long)size) + (long long)size;
    long long peak = atomic_load(&g_live_peak);
    while (now > peak && !atomic_compare_exchange_weak(&g_live_peak, &peak, now)) {
    }
    if (now > 0 && (unsigned long long)now > g_live_bound) {
        fprintf(stderr,
                "colibri fuzz: %lld live bytes for a %zu-byte input exceed %s (%llu bytes)\n", now,
                g_live_input, g_live_what, g_live_bound);
        fuzz_fail();
    }
}

static void fuzz_live_free_hook(const volatile void *ptr)
{
    if (ptr == NULL || atomic_load(&g_live_armed) == 0) {
        return;
    }
    atomic_fetch_sub(&g_live_bytes, (long long)__sanitizer_get_allocated_size((const void *)ptr));
}

/* Count from zero with `bound` bytes allowed ("what" names the bound in the message), and
 * single allocations of at most `single` bytes (0: any). */
static inline void fuzz_live_arm2(unsigned long long bound, unsigned long long single,
                                  const char *what, size_t input_size)
{
    /* libFuzzer starts its RSS thread (-rss_limit_mb) just before the first input, and ASan's
     * set-up of a new thread allocates through the hooked malloc (glibc's pthread_getattr_np
     * reallocs a CPU set, 8 bytes here): the first window waits for it so that a thread the
     * runtime did not start is not counted. */
    static int first = 1;
    if (first) {
        first = 0;
        const struct timespec wait = {0, 200000000L};
        nanosleep(&wait, NULL);
    }
    g_live_single = single;
    g_live_bound = bound;
    g_live_what = what;
    g_live_input = input_size;
    atomic_store(&g_live_bytes, 0);
    atomic_store(&g_live_peak, 0);
    atomic_store(&g_live_armed, 1);
}

/* fuzz_live_arm2 without a limit on single allocations. */
static inline void fuzz_live_arm(unsigned long long bound, const char *what, size_t input_size)
{
    fuzz_live_arm2(bound, 0u, what, input_size);
}

/* Stop counting for a moment (the harness's own allocations), keeping the window's count. */
static inline void fuzz_live_pause(void)
{
    atomic_store(&g_live_armed, 0);
}

/* Go on counting after fuzz_live_pause; frees of blocks allocated while paused must wait for
 * fuzz_live_disarm. */
static inline void fuzz_live_resume(void)
{
    atomic_store(&g_live_armed, 1);
}

/* Stop counting; returns the peak live bytes of the window (and records its ratio). */
static inline size_t fuzz_live_disarm(void)
{
    atomic_store(&g_live_armed, 0);
    const long long peak = atomic_load(&g_live_peak);
    const size_t p = peak > 0 ? (size_t)peak : 0u;
    const double ratio = (double)p / (double)(g_live_input > 0 ? g_live_input : 1u);
    if (ratio > g_live_ratio) {
        g_live_ratio = ratio;
        g_live_ratio_peak = p;
        g_live_ratio_input = g_live_input;
    }
    return p;
}

static void fuzz_live_report(void)
{
    fprintf(stderr, "colibri fuzz: largest live peak %zu bytes (input %zu bytes, ratio %.3f)\n",
            g_live_ratio_peak, g_live_ratio_input, g_live_ratio);
    char path[128];
    static const char *const k_files[] = {"model.clb", "model.bin", "config.json", "router.bin"};
    for (size_t i = 0; i < sizeof(k_files) / sizeof(k_files[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", g_live_dir, k_files[i]);
        unlink(path);
    }
    rmdir(g_live_dir);
}

/* A private directory on tmpfs when there is one, and the hooks; `report` runs at exit. */
static inline void fuzz_live_setup(void (*report)(void))
{
    const char *base = (access("/dev/shm", W_OK) == 0) ? "/dev/shm" : "/tmp";
    snprintf(g_live_dir, sizeof(g_live_dir), "%s/colibri_fuzz_XXXXXX", base);
    if (mkdtemp(g_live_dir) == NULL) {
        perror("mkdtemp");
        abort();
    }
    if (__sanitizer_install_malloc_and_free_hooks(fuzz_live_malloc_hook, fuzz_live_free_hook) ==
        0) {
        fprintf(stderr, "colibri fuzz: cannot install the malloc hook (build with ASan)\n");
        abort();
    }
    atexit(report != NULL ? report : fuzz_live_report);
}

static inline void fuzz_live_path(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", g_live_dir, name);
}

static inline void fuzz_live_write(const char *name, const uint8_t *data, size_t n)
{
    char path[128];
    fuzz_live_path(path, sizeof(path), name);
    const int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || (n > 0 && write(fd, data, n) != (ssize_t)n) || close(fd) != 0) {
        perror(path);
        abort();
    }
}

/* zlib's CRC-32, bit by bit (the harnesses fix checksums of small inputs: speed is moot). */
static inline uint32_t fuzz_crc32(const uint8_t *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int b = 0; b < 8; b++) {
            c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
        }
    }
    return c ^ 0xFFFFFFFFu;
}

static inline uint32_t fuzz_rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t fuzz_rd64(const uint8_t *p)
{
    return (uint64_t)fuzz_rd32(p) | (uint64_t)fuzz_rd32(p + 4) << 32;
}

static inline void fuzz_wr32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

static inline void fuzz_wr64(uint8_t *p, uint64_t v)
{
    fuzz_wr32(p, (uint32_t)v);
    fuzz_wr32(p + 4, (uint32_t)(v >> 32));
}

/*
 * Make a mutated container (version 1 or 2, docs/format.md) self-consistent again: the
 * header's file_size set to the length, and the CRC-32 of every tensor entry whose table entry
 * and blob lie inside the data recomputed. Anything else is left as the mutation made it.
 */
static inline void fuzz_fix_container(uint8_t *data, size_t size)
{
    if (size < 128u || memcmp(data, "CLBRMOE", 8) != 0) {
        return;
    }
    const uint32_t version = fuzz_rd32(data + 8);
    size_t n_off, table_off, size_off;
    if (version == 1u) {
        n_off = 40u, table_off = 48u, size_off = 72u;
    } else if (version == 2u) {
        n_off = 20u, table_off = 32u, size_off = 56u;
    } else {
        return;
    }
    fuzz_wr64(data + size_off, (uint64_t)size);
    const uint32_t n = fuzz_rd32(data + n_off);
    const uint64_t table = fuzz_rd64(data + table_off);
    for (uint64_t i = 0; i < n; i++) {
        if (table > size || (size - table) / 96u <= i) {
            break; /* the entry is not inside the data */
        }
        uint8_t *e = data + table + 96u * i;
        const uint64_t off = fuzz_rd64(e + 72), nbytes = fuzz_rd64(e + 80);
        if (off <= size && nbytes <= size - off) {
            fuzz_wr32(e + 92, fuzz_crc32(data + off, (size_t)nbytes));
        }
    }
}

size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);

/* The harnesses' LLVMFuzzerCustomMutator: libFuzzer's mutation, then the container made
 * self-consistent again (fuzz_fix_container) except for one mutation in 8, so that the
 * checksum refusals are fuzzed too. */
static inline size_t fuzz_mutate_fixed(uint8_t *data, size_t size, size_t max_size,
                                       unsigned int seed)
{
    size = LLVMFuzzerMutate(data, size, max_size);
    if ((seed & 7u) != 0u) {
        fuzz_fix_container(data, size);
    }
    return size;
}

/* Contract of every entry point: each status it returns has a message. */
static inline void fuzz_check_status(colibri_status st)
{
    const char *text = colibri_strerror(st);
    if (text == NULL || text[0] == '\0') {
        fuzz_fail();
    }
}

#endif /* COLIBRI_FUZZ_LIVE_H */
