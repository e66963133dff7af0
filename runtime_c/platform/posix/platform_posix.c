/**
 * @file platform_posix.c
 * @brief Colibri platform for hosted boards (x86-64 host, Cortex-A Linux under qemu-user):
 *        POSIX file descriptors and stdout.
 */
#define _POSIX_C_SOURCE 200809L

#include "colibri_platform.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void clb_platform_init(void)
{
}

int32_t clb_platform_open(const char *path, int32_t mode)
{
    int flags = (mode == CLB_PLATFORM_WRITE) ? (O_WRONLY | O_CREAT | O_TRUNC) : O_RDONLY;
    return (int32_t)open(path, flags, 0644);
}

int32_t clb_platform_read(int32_t fd, void *buf, uint32_t n)
{
    uint32_t done = 0;
    while (done < n) {
        ssize_t r = read(fd, (char *)buf + done, n - done);
        if (r < 0) {
            return -1;
        }
        if (r == 0) {
            break;
        }
        done += (uint32_t)r;
    }
    return (int32_t)done;
}

int32_t clb_platform_write(int32_t fd, const void *buf, uint32_t n)
{
    uint32_t done = 0;
    while (done < n) {
        ssize_t w = write(fd, (const char *)buf + done, n - done);
        if (w <= 0) {
            return -1;
        }
        done += (uint32_t)w;
    }
    return (int32_t)done;
}

int32_t clb_platform_close(int32_t fd)
{
    return (int32_t)close(fd);
}

void clb_platform_puts(const char *s)
{
    fputs(s, stdout);
    fflush(stdout);
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
}

_Noreturn void clb_platform_exit(int32_t code)
{
    fflush(stdout);
    exit((int)code);
}
