/**
 * @file platform_posix.c
 * @brief Colibri platform for hosted boards (x86-64 host, Cortex-A Linux under qemu-user):
 *        POSIX file descriptors and stdout.
 */
#define _POSIX_C_SOURCE 200809L

#include "colibri_platform_impl.h"

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

/* One read(2) / write(2) of at most INT32_MAX bytes (the result must fit an int32_t). */
static uint32_t clb_posix_span(uint32_t n)
{
    return (n > (uint32_t)INT32_MAX) ? (uint32_t)INT32_MAX : n;
}

static int32_t clb_posix_read(int32_t fd, uintptr_t addr, uint32_t n)
{
    return (int32_t)read(fd, (void *)addr, clb_posix_span(n));
}

static int32_t clb_posix_write(int32_t fd, uintptr_t addr, uint32_t n)
{
    return (int32_t)write(fd, (const void *)addr, clb_posix_span(n));
}

int32_t clb_platform_read(int32_t fd, void *buf, uint32_t n)
{
    return clb_platform_io_all(clb_posix_read, fd, (uintptr_t)buf, n, 0);
}

int32_t clb_platform_write(int32_t fd, const void *buf, uint32_t n)
{
    return clb_platform_io_all(clb_posix_write, fd, (uintptr_t)buf, n, 1);
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

_Noreturn void clb_platform_exit(int32_t code)
{
    fflush(stdout);
    exit((int)code);
}
