/**
 * @file esp_idf_sim.c
 * @brief The ESP-IDF stubs on the ESP32-S3 core under QEMU's `sim` machine, so that
 *        examples/esp_idf_app's compute path runs on the S3's own ISA in tests: console output
 *        through the platform layer (runtime_c/platform/xtensa_sim), a timer that counts calls,
 *        and the few newlib hooks its printf needs (write, a static heap for its number
 *        conversions: ESP-IDF has a heap; the Colibri runtime itself never allocates).
 */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>

#include "colibri_platform.h"
#include "esp_log.h"
#include "esp_timer.h"

void app_main(void);
int main(int argc, char **argv);
int write(int fd, const char *buf, int n);
int read(int fd, char *buf, int n);
int close(int fd);
int lseek(int fd, int offset, int whence);
int fstat(int fd, struct stat *st);
int isatty(int fd);
void *sbrk(ptrdiff_t increment);
void _exit(int code);
int kill(int pid, int sig);
int getpid(void);

int64_t esp_timer_get_time(void)
{
    static int64_t us;
    us += 10;
    return us;
}

void esp_log_stub_write(char level, const char *tag, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    printf("%c (0) %s: ", level, tag);
    vprintf(fmt, args);
    printf("\n");
    va_end(args);
}

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    app_main();
    fflush(stdout);
    return 0;
}

/* newlib's system hooks: built without its own system calls (--disable-newlib-supplied-syscalls),
 * it calls these by their POSIX names. */

int write(int fd, const char *buf, int n)
{
    return (int)clb_platform_write(fd, buf, (uint32_t)n);
}

int read(int fd, char *buf, int n)
{
    return (int)clb_platform_read(fd, buf, (uint32_t)n);
}

int close(int fd)
{
    return (int)clb_platform_close(fd);
}

int lseek(int fd, int offset, int whence)
{
    (void)fd;
    (void)offset;
    (void)whence;
    errno = ESPIPE;
    return -1;
}

int fstat(int fd, struct stat *st)
{
    (void)fd;
    st->st_mode = S_IFCHR;
    return 0;
}

int isatty(int fd)
{
    return fd <= 2;
}

void *sbrk(ptrdiff_t increment)
{
    static _Alignas(16) unsigned char heap[16384];
    static size_t used;
    if (increment < 0 || (size_t)increment > sizeof heap - used) {
        errno = ENOMEM;
        return (void *)-1;
    }
    void *start = heap + used;
    used += (size_t)increment;
    return start;
}

void _exit(int code)
{
    clb_platform_exit(code);
}

int kill(int pid, int sig)
{
    (void)pid;
    clb_platform_exit(128 + sig);
}

int getpid(void)
{
    return 1;
}
