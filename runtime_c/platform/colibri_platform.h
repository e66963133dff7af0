/**
 * @file colibri_platform.h
 * @brief The few services a Colibri runner needs from a board: files, console, exit, and
 *        markers around the measured region. One implementation per platform directory
 *        (posix/, arm_semihost/, xtensa_sim/); the build picks one from the board file.
 *        No implementation may use the heap.
 */
#ifndef COLIBRI_PLATFORM_H
#define COLIBRI_PLATFORM_H

#include <stdint.h>

/* A bench marker's attributes: not inlined and, on GCC, no inter-procedural analysis either
 * (noipa), so identical-code folding cannot merge the two markers. Clang has no noipa; its
 * noinline plus the markers' distinct bodies keep them apart. */
#if defined(__GNUC__) && !defined(__clang__)
#define CLB_PLATFORM_MARKER __attribute__((noinline, noipa))
#else
#define CLB_PLATFORM_MARKER __attribute__((noinline))
#endif

#define CLB_PLATFORM_READ 0
#define CLB_PLATFORM_WRITE 1

/** @brief Called first by the runner (bare metal: nothing left to do after start-up). */
void clb_platform_init(void);
/** @brief Open a file (host path, or relative to QEMU's working directory). <0 on error. */
int32_t clb_platform_open(const char *path, int32_t mode);
/** @brief Read up to n bytes; returns bytes read (0 at end of file) or <0. */
int32_t clb_platform_read(int32_t fd, void *buf, uint32_t n);
/** @brief Write n bytes; returns bytes written or <0. */
int32_t clb_platform_write(int32_t fd, const void *buf, uint32_t n);
/** @brief Close a file. */
int32_t clb_platform_close(int32_t fd);
/** @brief Write a NUL-terminated string to the console (stdout / semihosting / UART). */
void clb_platform_puts(const char *s);
/** @brief Markers around the measured region; never inlined, so an instruction counter can
 *         start and stop on their addresses. Implementations define them CLB_PLATFORM_MARKER. */
void clb_platform_bench_begin(void);
void clb_platform_bench_end(void);
/** @brief Terminate with an exit status that reaches the host (QEMU's exit code). */
_Noreturn void clb_platform_exit(int32_t code);

#endif /* COLIBRI_PLATFORM_H */
