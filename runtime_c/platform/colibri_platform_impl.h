/**
 * @file colibri_platform_impl.h
 * @brief What the platform implementations (posix/, arm_semihost/, xtensa_sim/) share: the bench
 *        markers, a string length without libc and the loop that repeats a partial read or
 *        write until it is done. Included by exactly one file of each platform (it defines the
 *        markers and their state).
 *
 *        Before including it, a platform may define CLB_PLATFORM_BENCH_END_HOOK() (default:
 *        nothing): what the end marker runs after the marker itself (arm_semihost: the stack
 *        guard check, which instruction counts do not see: they stop on entering the marker).
 */
#ifndef COLIBRI_PLATFORM_IMPL_H
#define COLIBRI_PLATFORM_IMPL_H

#include "colibri_platform.h"

#include <stdint.h>

#ifndef CLB_PLATFORM_BENCH_END_HOOK
#define CLB_PLATFORM_BENCH_END_HOOK() ((void)0)
#endif

/** @brief The length of a NUL-terminated string (bare-metal platforms have no libc to ask). */
static inline uint32_t clb_platform_strlen(const char *s)
{
    uint32_t n = 0;
    while (s[n] != '\0') {
        n++;
    }
    return n;
}

/** @brief One partial read or write of the platform: at most n bytes at addr; returns the bytes
 *         moved, 0 (read: end of file) or < 0 on error. */
typedef int32_t (*clb_platform_io_fn)(int32_t fd, uintptr_t addr, uint32_t n);

/** @brief Repeat io until n bytes are moved: returns n, or fewer when a read meets the end of
 *         the file, or -1 on an error (and on a write that moves nothing). */
static inline int32_t clb_platform_io_all(clb_platform_io_fn io, int32_t fd, uintptr_t addr,
                                          uint32_t n, int writing)
{
    uint32_t done = 0;
    while (done < n) {
        const int32_t r = io(fd, addr + done, n - done);
        if (r < 0 || (r == 0 && writing)) {
            return -1;
        }
        if (r == 0) {
            break;
        }
        done += (uint32_t)r;
    }
    return (int32_t)done;
}

/* Distinct bodies (and CLB_PLATFORM_MARKER) so that identical-code folding cannot merge them. */
volatile int32_t clb_platform_bench_state;

CLB_PLATFORM_MARKER void clb_platform_bench_begin(void)
{
    __asm__ volatile("" ::: "memory");
    clb_platform_bench_state = 1;
}

CLB_PLATFORM_MARKER void clb_platform_bench_end(void)
{
    clb_platform_bench_state = 2;
    __asm__ volatile("" ::: "memory");
    CLB_PLATFORM_BENCH_END_HOOK();
}

#endif /* COLIBRI_PLATFORM_IMPL_H */
