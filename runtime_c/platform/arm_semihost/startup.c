/**
 * @file startup.c
 * @brief Cortex-M start-up for QEMU's MPS2/MPS3 machines: vector table, reset handler (FPU,
 *        stack painting and guard, .data copy, .bss zeroing, main) and fault handlers that report
 *        the faulting PC through semihosting and exit with code 99 instead of letting QEMU lock
 *        up.
 *
 * Stack guard: the reset handler paints the stack and the guard below it
 * (templates/linker/cortex_m.ld.j2) with CLB_STACK_PAINT; at a normal exit the high-water mark
 * is printed ("stack high-water: N of M bytes"). Three mechanisms report an overflow as
 * "colibri: stack overflow: ..." with exit code 98:
 * - ARMv7-M (Cortex-M3/M4/M7) with an MPU: the guard (a power of two >= 512 bytes aligned to
 *   its size, holding the program's two largest frames + 8: templates/linker/cortex_m.ld.j2) is
 *   made no-access, execute-never MPU memory (MPU region 0, no subregions; default memory map
 *   elsewhere, MemManage enabled), so the first store into it faults and no frame can step over
 *   it.
 * - v8-M mainline (Cortex-M33/M55): MSPLIM = __stack_limit; the first push below the stack
 *   faults (UsageFault STKOF).
 * - Everywhere (the only guard when MPU_TYPE reports no MPU regions): the painted guard is
 *   checked by clb_stack_guard_check() after each forward pass and at exit.
 * The fault handler never runs on the overflowed stack, nor in the guard: it disables the MPU,
 * lifts MSPLIM and moves SP to a fault stack of its own above the stack (__fault_stack_top; the
 * build checks that the handler's worst case fits it) before calling C, so the report and the exit
 * work at every stack size. The semihosting calls (semihost.h) turn the MPU off while the host
 * serves them: QEMU could not read their blocks in the guard's 1 KB page otherwise.
 */
#include "colibri_fmt.h"
#include "colibri_platform.h"
#include "colibri_stack_guard.h"
#include "semihost.h"

#include <stdint.h>

/* Symbols of templates/linker/cortex_m.ld.j2 (the stack's: colibri_stack_guard.h). */
extern uint32_t __data_start[], __data_end[], __data_load[], __bss_start[], __bss_end[];
extern uint32_t __fault_stack_top[];

int main(int argc, char **argv);

void clb_reset_handler(void);
void clb_fault_report(uint32_t sp, uint32_t exc_return);

#define CLB_SCB_CPACR (*(volatile uint32_t *)0xE000ED88u)
#define CLB_SCB_CFSR (*(volatile uint32_t *)0xE000ED28u)
#define CLB_SCB_HFSR (*(volatile uint32_t *)0xE000ED2Cu)
#define CLB_SCB_SHCSR (*(volatile uint32_t *)0xE000ED24u)
#define CLB_SCB_MMFAR (*(volatile uint32_t *)0xE000ED34u)
#define CLB_SCB_SHCSR_MEMFAULTENA (1u << 16)
#define CLB_SCB_CFSR_MMARVALID (1u << 7)
#define CLB_SCB_CFSR_STKOF (1u << 20)
/* PMSAv7 MPU (ARMv7-M ARM, B3.5). */
#define CLB_MPU_TYPE (*(volatile uint32_t *)0xE000ED90u)
#define CLB_MPU_CTRL (*(volatile uint32_t *)0xE000ED94u)
#define CLB_MPU_RNR (*(volatile uint32_t *)0xE000ED98u)
#define CLB_MPU_RBAR (*(volatile uint32_t *)0xE000ED9Cu)
#define CLB_MPU_RASR (*(volatile uint32_t *)0xE000EDA0u)
#define CLB_MPU_CTRL_ENABLE (1u << 0)
#define CLB_MPU_CTRL_PRIVDEFENA (1u << 2)
#define CLB_MPU_RASR_XN (1u << 28) /* AP (bits 26:24) = 000: no access, privileged or not */
#define CLB_MPU_RASR_ENABLE (1u << 0)
#define CLB_FAULT_EXIT_CODE 99

#if defined(__ARM_ARCH_8M_MAIN__) || defined(__ARM_ARCH_8_1M_MAIN__)
#define CLB_HAS_MSPLIM 1
#else
#define CLB_HAS_MSPLIM 0
#endif
#if defined(__ARM_ARCH_7M__) || defined(__ARM_ARCH_7EM__)
#define CLB_HAS_PMSAV7 1
#else
#define CLB_HAS_PMSAV7 0
#endif

/* Nonzero once the MPU guards the region below the stack (the painted guard is then unreadable
 * and needs no check: nothing can write it without faulting). */
static uint32_t clb_mpu_guard_on;

static char clb_prog_name[] = "colibri";
static char *clb_argv[] = {clb_prog_name, 0};

void clb_stack_guard_check(void)
{
    if (clb_mpu_guard_on == 0u) {
        clb_stack_guard_painted_check();
    }
}

/** @brief ARMv7-M: make the guard below the stack no-access, execute-never MPU memory and enable
 *         the MPU with the default memory map elsewhere and MemManage faults. The guard is one
 *         MPU region (region 0): its size G a power of two >= 32 and its base aligned to G (the
 *         linker script sees to both). No subregions: QEMU (7.2 here, and its source today)
 *         maps a whole 1 KB page through the background region when an access falls in a
 *         disabled subregion of a region smaller than a page, after which stores to the enabled
 *         subregions of that page no longer fault (the two 512-byte regions with subregions used
 *         before missed overflows on cortex-m3). Nothing happens without an MPU
 *         (MPU_TYPE.DREGION == 0) or with a guard the MPU cannot cover. */
static void clb_stack_guard_mpu(void)
{
#if CLB_HAS_PMSAV7
    const uint32_t guard = (uint32_t)(uintptr_t)__stack_guard;
    const uint32_t size = (uint32_t)((uintptr_t)__stack_limit - (uintptr_t)__stack_guard);
    if (((CLB_MPU_TYPE >> 8) & 0xFFu) < 1u || size < 32u || (size & (size - 1u)) != 0u ||
        (guard & (size - 1u)) != 0u) {
        return;
    }
    uint32_t log2 = 0u;
    while ((1u << log2) < size) {
        ++log2;
    }
    CLB_MPU_CTRL = 0u;
    CLB_MPU_RNR = 0u;
    CLB_MPU_RBAR = guard;
    CLB_MPU_RASR = CLB_MPU_RASR_XN | ((log2 - 1u) << 1) | CLB_MPU_RASR_ENABLE;
    CLB_SCB_SHCSR |= CLB_SCB_SHCSR_MEMFAULTENA;
    CLB_MPU_CTRL = CLB_MPU_CTRL_PRIVDEFENA | CLB_MPU_CTRL_ENABLE;
    __asm__ volatile("dsb\n\tisb" ::: "memory");
    clb_mpu_guard_on = 1u;
#endif
}

void clb_reset_handler(void)
{
#if defined(__ARM_FP) || defined(__ARM_FEATURE_MVE)
    /* CP10/CP11 full access first: compiled code below may already use FP/MVE registers. */
    CLB_SCB_CPACR |= 0xFu << 20;
    __asm__ volatile("dsb\n\tisb" ::: "memory");
#endif
    /* Paint from the guard up to the current stack pointer (this frame is above it). */
    uint32_t *sp;
    __asm__ volatile("mov %0, sp" : "=r"(sp));
    for (uint32_t *p = __stack_guard; p < sp;) {
        *p++ = CLB_STACK_PAINT;
    }
#if CLB_HAS_MSPLIM
    __asm__ volatile("msr msplim, %0" ::"r"(__stack_limit) : "memory");
#endif
    for (uint32_t *src = __data_load, *dst = __data_start; dst < __data_end;) {
        *dst++ = *src++;
    }
    for (uint32_t *dst = __bss_start; dst < __bss_end;) {
        *dst++ = 0u;
    }
    clb_stack_guard_mpu(); /* after .bss: it sets clb_mpu_guard_on */
    const int32_t code = (int32_t)main(1, clb_argv);
    clb_stack_guard_check();
    clb_stack_report_high_water();
    clb_platform_exit(code);
}

/* Exception names by number (IPSR). */
static const char *const clb_exception_names[16] = {
    [2] = "NMI",        [3] = "HardFault",   [4] = "MemManage", [5] = "BusFault",
    [6] = "UsageFault", [7] = "SecureFault", [11] = "SVCall",   [12] = "DebugMonitor",
    [14] = "PendSV",    [15] = "SysTick",
};

/** @brief Report a fault as a stack overflow when it is one: MSPLIM hit (v8-M), a store into
 *         the MPU guard, or an exception frame below the stack. `stacked`: the exception frame
 *         lies inside the stack (pc was read from it). */
static void clb_fault_stack_check(uint32_t sp, uint32_t cfsr, uint32_t pc, int stacked)
{
    if ((cfsr & CLB_SCB_CFSR_STKOF) != 0u) {
        clb_stack_overflow(0u, "MSPLIM stack limit hit");
    }
    const uint32_t guard = (uint32_t)(uintptr_t)__stack_guard;
    const uint32_t limit = (uint32_t)(uintptr_t)__stack_limit;
    const uint32_t addr = CLB_SCB_MMFAR;
    const int in_guard = (cfsr & CLB_SCB_CFSR_MMARVALID) != 0u && addr >= guard && addr < limit;
    if (!in_guard && sp >= limit) {
        return;
    }
    char how[96];
    char *p = clb_append(how, clb_mpu_guard_on != 0u ? "MPU guard below the stack hit"
                                                     : "exception frame below the stack");
    if (in_guard) {
        p = clb_append_field(p, " at ", addr);
    }
    p = clb_append_field(p, ", sp=", sp);
    if (stacked) {
        p = clb_append_field(p, " pc=", pc);
    }
    *p = '\0';
    clb_stack_overflow(0u, how);
}

/** @brief Print "colibri: <Fault> pc=... lr=... cfsr=... hfsr=..." and exit with 99 (98 and
 *         "colibri: stack overflow: ..." for a stack overflow). Runs on the fault stack with the
 *         MPU off and MSPLIM lifted: sp is where the exception frame was pushed. pc and lr are
 *         read from that frame only when it lies inside the stack (a frame in the guard or below
 *         was not stacked; a wild sp could fault again); else they print as 0. */
__attribute__((used)) void clb_fault_report(uint32_t sp, uint32_t exc_return)
{
    uint32_t ipsr;
    __asm__ volatile("mrs %0, ipsr" : "=r"(ipsr));
    ipsr &= 0x1FFu;
    const uint32_t cfsr = CLB_SCB_CFSR;
    const int stacked = sp >= (uint32_t)(uintptr_t)__stack_limit && (sp & 3u) == 0u &&
                        sp + 32u <= (uint32_t)(uintptr_t)_estack;
    const uint32_t pc = stacked ? ((const uint32_t *)(uintptr_t)sp)[6] : 0u;
    const uint32_t lr = stacked ? ((const uint32_t *)(uintptr_t)sp)[5] : 0u;
    clb_fault_stack_check(sp, cfsr, pc, stacked);
    const char *name =
        (ipsr < 16u && clb_exception_names[ipsr] != 0) ? clb_exception_names[ipsr] : "interrupt";
    char msg[160];
    char *p = clb_append(clb_append(msg, "colibri: "), name);
    p = clb_append_field(p, " pc=", pc);
    p = clb_append_field(p, " lr=", lr);
    p = clb_append_field(p, " exc=", ipsr);
    p = clb_append_field(p, " cfsr=", cfsr);
    p = clb_append_field(p, " hfsr=", CLB_SCB_HFSR);
    p = clb_append_field(p, " exc_return=", exc_return);
    p = clb_append(p, "\n");
    *p = '\0';
    clb_platform_puts(msg);
    clb_platform_exit(CLB_FAULT_EXIT_CODE);
}

/* Every exception lands here. The stack it was taken on may have overflowed (its frame may sit
 * in the MPU guard or below the stack), so before any C: lift MSPLIM (v8-M), disable the MPU
 * (v7-M) and move SP to the fault stack above the main stack (templates/linker/cortex_m.ld.j2),
 * which an overflow of the main stack cannot reach; the guard is not touched. */
__attribute__((naked)) static void clb_fault_handler(void)
{
#if CLB_HAS_MSPLIM
    __asm__ volatile("movs r0, #0\n\t"
                     "msr msplim, r0\n\t");
#endif
#if CLB_HAS_PMSAV7
    __asm__ volatile("movw r0, #0xED94\n\t" /* MPU_CTRL = 0 */
                     "movt r0, #0xE000\n\t"
                     "movs r1, #0\n\t"
                     "str r1, [r0]\n\t"
                     "dsb\n\t"
                     "isb\n\t");
#endif
    __asm__ volatile("tst lr, #4\n\t"
                     "ite eq\n\t"
                     "mrseq r0, msp\n\t"
                     "mrsne r0, psp\n\t"
                     "mov r1, lr\n\t"
                     "movw r12, #:lower16:__fault_stack_top\n\t"
                     "movt r12, #:upper16:__fault_stack_top\n\t"
                     "mov sp, r12\n\t"
                     "b clb_fault_report\n\t");
}

typedef void (*clb_vector_fn)(void);

__attribute__((section(".isr_vector"), used)) const clb_vector_fn clb_vector_table[16] = {
    (clb_vector_fn)(uintptr_t)_estack, /* 0: initial main stack pointer */
    clb_reset_handler,                 /* 1: reset */
    clb_fault_handler,                 /* 2: NMI */
    clb_fault_handler,                 /* 3: HardFault */
    clb_fault_handler,                 /* 4: MemManage */
    clb_fault_handler,                 /* 5: BusFault */
    clb_fault_handler,                 /* 6: UsageFault */
    clb_fault_handler,                 /* 7: SecureFault (v8-M) */
    0,
    0,
    0,
    clb_fault_handler, /* 11: SVCall */
    clb_fault_handler, /* 12: DebugMonitor */
    0,
    clb_fault_handler, /* 14: PendSV */
    clb_fault_handler, /* 15: SysTick */
};
