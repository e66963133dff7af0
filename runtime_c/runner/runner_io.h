/**
 * @file runner_io.h
 * @brief Console and whole-file I/O helpers shared by the runners (main.c, lm_runner.h):
 *        no heap, no printf, only colibri_platform.h services.
 */
#ifndef COLIBRI_RUNNER_IO_H
#define COLIBRI_RUNNER_IO_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "colibri_platform.h"

/** @brief Append the decimal form of v to buf (NUL-terminated, buf >= 12 bytes free). */
static inline char *fmt_u32(char *buf, uint32_t v)
{
    char tmp[12];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + (v % 10u));
        v /= 10u;
    } while (v != 0u);
    while (n > 0) {
        *buf++ = tmp[--n];
    }
    *buf = '\0';
    return buf;
}

/** @brief Print "colibri: <a><num><b>" on the console. */
static inline void say(const char *a, uint32_t num, const char *b)
{
    char line[168]; /* 9 + 70 + 10 + 70 + 2 */
    char *p = line;
    const char *parts[2] = {"colibri: ", a};
    for (int i = 0; i < 2; ++i) {
        size_t len = strlen(parts[i]);
        if (len > 70u) {
            len = 70u;
        }
        memcpy(p, parts[i], len);
        p += len;
    }
    p = fmt_u32(p, num);
    size_t blen = strlen(b);
    if (blen > 70u) {
        blen = 70u;
    }
    memcpy(p, b, blen);
    p[blen] = '\n';
    p[blen + 1u] = '\0';
    clb_platform_puts(line);
}

/** @brief Read (writing 0) or write (1) exactly n bytes at addr; 0 on success. */
static inline int runner_io_exact(int32_t fd, uintptr_t addr, uint32_t n, int writing)
{
    while (n > 0u) {
        const int32_t done = writing ? clb_platform_write(fd, (const void *)addr, n)
                                     : clb_platform_read(fd, (void *)addr, n);
        if (done <= 0) {
            return -1;
        }
        addr += (uint32_t)done;
        n -= (uint32_t)done;
    }
    return 0;
}

/** @brief Read exactly n bytes; 0 on success. */
static inline int read_all(int32_t fd, void *buf, uint32_t n)
{
    return runner_io_exact(fd, (uintptr_t)buf, n, 0);
}

/** @brief Write exactly n bytes; 0 on success. */
static inline int write_all(int32_t fd, const void *buf, uint32_t n)
{
    return runner_io_exact(fd, (uintptr_t)buf, n, 1);
}

#endif /* COLIBRI_RUNNER_IO_H */
