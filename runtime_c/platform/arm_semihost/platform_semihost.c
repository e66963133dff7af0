/**
 * @file platform_semihost.c
 * @brief Colibri platform for Cortex-M under QEMU: files and console through Arm semihosting
 *        (paths relative to QEMU's working directory), exit code through SYS_EXIT_EXTENDED.
 */
#include "semihost.h"

/* The end marker also checks the stack guard (after each forward pass); instruction counts stop
 * on entering it, so the check is not counted. */
#define CLB_PLATFORM_BENCH_END_HOOK() clb_stack_guard_check()
#include "colibri_platform_impl.h"

#include <stdint.h>

void clb_platform_init(void)
{
}

int32_t clb_platform_open(const char *path, int32_t mode)
{
    /* Semihosting fopen modes: 1 = "rb", 4 = "w" (":tt" = stdout), 5 = "wb". */
    uint32_t sh_mode = (mode == CLB_PLATFORM_WRITE) ? 5u : 1u;
    if (path[0] == ':' && path[1] == 't' && path[2] == 't' && path[3] == '\0') {
        sh_mode = (mode == CLB_PLATFORM_WRITE) ? 4u : 0u;
    }
    uint32_t block[3] = {(uint32_t)(uintptr_t)path, sh_mode, clb_platform_strlen(path)};
    return clb_semihost_call(CLB_SH_SYS_OPEN, block);
}

int32_t clb_platform_read(int32_t fd, void *buf, uint32_t n)
{
    uint32_t block[3] = {(uint32_t)fd, (uint32_t)(uintptr_t)buf, n};
    int32_t not_read = clb_semihost_call(CLB_SH_SYS_READ, block);
    if (not_read < 0 || (uint32_t)not_read > n) {
        return -1;
    }
    return (int32_t)(n - (uint32_t)not_read);
}

int32_t clb_platform_write(int32_t fd, const void *buf, uint32_t n)
{
    uint32_t block[3] = {(uint32_t)fd, (uint32_t)(uintptr_t)buf, n};
    int32_t not_written = clb_semihost_call(CLB_SH_SYS_WRITE, block);
    return (not_written == 0) ? (int32_t)n : -1;
}

int32_t clb_platform_close(int32_t fd)
{
    uint32_t block[1] = {(uint32_t)fd};
    return clb_semihost_call(CLB_SH_SYS_CLOSE, block);
}

/* Console: the semihosting file ":tt" opened for writing is the host's stdout (SYS_WRITE0 would
 * go to QEMU's stderr); SYS_WRITE0 is the fallback if it cannot be opened. */
static int32_t clb_console_fd = -2;

void clb_platform_puts(const char *s)
{
    if (clb_console_fd == -2) {
        clb_console_fd = clb_platform_open(":tt", CLB_PLATFORM_WRITE);
    }
    if (clb_console_fd < 0 || clb_platform_write(clb_console_fd, s, clb_platform_strlen(s)) < 0) {
        (void)clb_semihost_call(CLB_SH_SYS_WRITE0, s);
    }
}

/* SYS_EXIT_EXTENDED returns only when the host refuses it (e.g. it cannot read the block);
 * then SYS_EXIT, whose reason travels in r1 (no memory to read), still ends the program: exit 0
 * or 1 instead of the code, never a hang. */
_Noreturn void clb_platform_exit(int32_t code)
{
    uint32_t block[2] = {CLB_SH_ADP_STOPPED_APPLICATION_EXIT, (uint32_t)code};
    const uintptr_t reason =
        code == 0 ? CLB_SH_ADP_STOPPED_APPLICATION_EXIT : CLB_SH_ADP_STOPPED_RUN_TIME_ERROR;
    for (;;) {
        (void)clb_semihost_call(CLB_SH_SYS_EXIT_EXTENDED, block);
        (void)clb_semihost_call(CLB_SH_SYS_EXIT, (const void *)reason);
    }
}
