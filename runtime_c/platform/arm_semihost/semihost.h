/**
 * @file semihost.h
 * @brief Arm semihosting calls (bkpt 0xab) used by the arm_semihost platform.
 */
#ifndef CLB_SEMIHOST_H
#define CLB_SEMIHOST_H

#include <stdint.h>

#define CLB_SH_SYS_OPEN 0x01
#define CLB_SH_SYS_CLOSE 0x02
#define CLB_SH_SYS_WRITE0 0x04
#define CLB_SH_SYS_WRITE 0x05
#define CLB_SH_SYS_READ 0x06
#define CLB_SH_SYS_EXIT 0x18
#define CLB_SH_SYS_EXIT_EXTENDED 0x20
#define CLB_SH_ADP_STOPPED_APPLICATION_EXIT 0x20026

/** @brief One semihosting call: r0 = operation, r1 = argument (block); returns r0. */
static inline int32_t clb_semihost_call(int32_t op, const void *arg)
{
    register int32_t r0 __asm__("r0") = op;
    register const void *r1 __asm__("r1") = arg;
    __asm__ volatile("bkpt 0xab" : "+r"(r0) : "r"(r1) : "memory");
    return r0;
}

/** @brief Exit code of a detected stack overflow (guard overwritten, or MSPLIM hit on v8-M). */
#define CLB_STACK_OVERFLOW_EXIT_CODE 98

/** @brief Check the painted guard below the stack (startup.c); on damage print
 *         "colibri: stack overflow: N bytes used of M ..." and exit with
 *         CLB_STACK_OVERFLOW_EXIT_CODE. Called after each forward pass and at exit. */
void clb_stack_guard_check(void);

#endif /* CLB_SEMIHOST_H */
