/**
 * @file colibri_stack_guard.h
 * @brief The painted stack guard the bare-metal platforms share (arm_semihost/startup.c,
 *        xtensa_sim/platform_sim.c): the start-up paints the guard below the stack and the stack
 *        itself with CLB_STACK_PAINT; clb_stack_guard_painted_check() (after each forward pass
 *        and at exit) reports a guard word that lost its paint as a stack overflow, and
 *        clb_stack_report_high_water() prints the measured use at a normal exit
 *        ("stack high-water: N of M bytes", read by colibri.targets.qemu).
 *
 *        The linker scripts (templates/linker/cortex_m.ld.j2, xtensa_*.ld.j2) define the
 *        symbols: the guard is [__stack_guard, __stack_limit), the stack [__stack_limit,
 *        _estack). Each platform adds what its core has for an immediate trap (an MPU region or
 *        MSPLIM on Cortex-M, data breakpoints on Xtensa) and reports a trap through
 *        clb_stack_overflow(). Static functions: include from one file per platform.
 */
#ifndef COLIBRI_STACK_GUARD_H
#define COLIBRI_STACK_GUARD_H

#include "colibri_fmt.h"
#include "colibri_platform.h"

#include <stdint.h>

/** @brief Exit code of a detected stack overflow (guard overwritten or a core's trap hit). */
#define CLB_STACK_OVERFLOW_EXIT_CODE 98
/** @brief The word the start-up writes over the guard and the stack. */
#define CLB_STACK_PAINT 0xC0C1B1A5u

extern uint32_t _estack[], __stack_limit[], __stack_guard[];

/** @brief Bytes of the stack (the board's stack_size, or the build's stack_size=N). */
static uint32_t clb_stack_size(void)
{
    return (uint32_t)((uintptr_t)_estack - (uintptr_t)__stack_limit);
}

/** @brief Bytes from the lowest word at or above `from` that lost its paint up to the top. */
static uint32_t clb_stack_used(const uint32_t *from)
{
    const uint32_t *p = from;
    while (p < _estack && *p == CLB_STACK_PAINT) {
        ++p;
    }
    return (uint32_t)((uintptr_t)_estack - (uintptr_t)p);
}

/** @brief Print "colibri: stack overflow: ..." and exit with CLB_STACK_OVERFLOW_EXIT_CODE
 *         (used = bytes known to be used, 0 if unknown; how = what caught it). */
static _Noreturn void clb_stack_overflow(uint32_t used, const char *how)
{
    char msg[200];
    char *p = clb_append(msg, "colibri: stack overflow: ");
    if (used != 0u) {
        p = clb_append_u32(p, used);
        p = clb_append(p, " bytes used of ");
    } else {
        p = clb_append(p, "more than ");
    }
    p = clb_append_u32(p, clb_stack_size());
    p = clb_append(p, used != 0u ? " (at least; " : " bytes used (");
    p = clb_append(p, how);
    p = clb_append(p, "); raise stack_size in the board file\n");
    *p = '\0';
    clb_platform_puts(msg);
    clb_platform_exit(CLB_STACK_OVERFLOW_EXIT_CODE);
}

/** @brief Report (and exit) when a word of the painted guard below the stack was written. */
static void clb_stack_guard_painted_check(void)
{
    for (const uint32_t *p = __stack_guard; p < __stack_limit; ++p) {
        if (*p != CLB_STACK_PAINT) {
            clb_stack_overflow(clb_stack_used(__stack_guard),
                               "the guard below the stack was overwritten");
        }
    }
}

/** @brief Print "stack high-water: N of M bytes" (a normal exit). */
static void clb_stack_report_high_water(void)
{
    char msg[64];
    char *p = clb_append(msg, "stack high-water: ");
    p = clb_append_u32(p, clb_stack_used(__stack_limit));
    p = clb_append(p, " of ");
    p = clb_append_u32(p, clb_stack_size());
    p = clb_append(p, " bytes\n");
    *p = '\0';
    clb_platform_puts(msg);
}

#endif /* COLIBRI_STACK_GUARD_H */
