/**
 * @file bench_io.h
 * @brief What the instruction-count benchmarks (router_bench.c, sample_bench.c, matvec_bench.c)
 *        share: a seeded xorshift32 for their inputs, and the first byte of input.bin, which
 *        picks the way run between the bench markers.
 */
#ifndef COLIBRI_BENCH_IO_H
#define COLIBRI_BENCH_IO_H

#include "colibri_platform.h"

#include <stdint.h>

/** @brief xorshift32 (13, 17, 5): the next value of *state. */
static inline uint32_t bench_next(uint32_t *state)
{
    uint32_t s = *state;
    s ^= s << 13;
    s ^= s >> 17;
    s ^= s << 5;
    *state = s;
    return s;
}

/** @brief The first byte of input.bin, or `fallback` when there is none. */
static inline uint8_t bench_mode(uint8_t fallback)
{
    uint8_t mode = fallback;
    const int32_t fd = clb_platform_open("input.bin", CLB_PLATFORM_READ);
    if (fd >= 0) {
        if (clb_platform_read(fd, &mode, 1) != 1) {
            mode = fallback;
        }
        (void)clb_platform_close(fd);
    }
    return mode;
}

#endif /* COLIBRI_BENCH_IO_H */
