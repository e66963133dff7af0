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
#define CLB_SH_ADP_STOPPED_RUN_TIME_ERROR 0x20023

#if defined(__ARM_ARCH_7M__) || defined(__ARM_ARCH_7EM__)
/* PMSAv7 MPU_CTRL (startup.c enables the MPU for the stack guard). */
#define CLB_SH_MPU_CTRL (*(volatile uint32_t *)0xE000ED94u)
#define CLB_SH_HAS_PMSAV7 1
#else
#define CLB_SH_HAS_PMSAV7 0
#endif

/** @brief One semihosting call: r0 = operation, r1 = argument (block); returns r0.
 *
 * ARMv7-M: the MPU (the no-access stack guard, startup.c) is off during the call. The host reads
 * and writes the guest's memory as a debugger does, which on hardware bypasses the MPU; QEMU
 * instead translates the start of the 1 KB page holding each address through the MPU, so while
 * the guard is on, every semihosting block, string or buffer in the page the guard starts in
 * (the lowest bytes of the stack, up to 1 KB) was unreadable: opens failed ("cannot open the
 * input file"), console lines vanished and SYS_EXIT_EXTENDED never ended the program (a hang).
 * Nothing runs while the host serves the call, so the guard is not missed. */
static inline int32_t clb_semihost_call(int32_t op, const void *arg)
{
#if CLB_SH_HAS_PMSAV7
    const uint32_t mpu = CLB_SH_MPU_CTRL;
    if ((mpu & 1u) != 0u) {
        CLB_SH_MPU_CTRL = 0u;
        __asm__ volatile("dsb\n\tisb" ::: "memory");
    }
#endif
    register int32_t r0 __asm__("r0") = op;
    register const void *r1 __asm__("r1") = arg;
    __asm__ volatile("bkpt 0xab" : "+r"(r0) : "r"(r1) : "memory");
#if CLB_SH_HAS_PMSAV7
    if ((mpu & 1u) != 0u) {
        CLB_SH_MPU_CTRL = mpu;
        __asm__ volatile("dsb\n\tisb" ::: "memory");
    }
#endif
    return r0;
}

/** @brief Check the painted guard below the stack (startup.c); on damage print
 *         "colibri: stack overflow: N bytes used of M ..." and exit with
 *         CLB_STACK_OVERFLOW_EXIT_CODE. Called after each forward pass and at exit. */
void clb_stack_guard_check(void);

#endif /* CLB_SEMIHOST_H */
