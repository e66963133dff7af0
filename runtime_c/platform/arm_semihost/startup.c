/**
 * @file startup.c
 * @brief Cortex-M start-up for QEMU's MPS2/MPS3 machines: vector table, reset handler (FPU,
 *        .data copy, .bss zeroing, main) and fault handlers that report the faulting PC through
 *        semihosting and exit with code 99 instead of letting QEMU lock up.
 */
#include "colibri_fmt.h"
#include "colibri_platform.h"
#include "semihost.h"

#include <stdint.h>

/* Symbols of templates/linker/cortex_m.ld.j2. */
extern uint32_t __data_start[], __data_end[], __data_load[], __bss_start[], __bss_end[];
extern uint32_t _estack[];

int main(int argc, char **argv);

void clb_reset_handler(void);
void clb_fault_report(const uint32_t *frame, uint32_t exc_return);

#define CLB_SCB_CPACR (*(volatile uint32_t *)0xE000ED88u)
#define CLB_SCB_CFSR (*(volatile uint32_t *)0xE000ED28u)
#define CLB_SCB_HFSR (*(volatile uint32_t *)0xE000ED2Cu)
#define CLB_FAULT_EXIT_CODE 99

static char clb_prog_name[] = "colibri";
static char *clb_argv[] = {clb_prog_name, 0};

void clb_reset_handler(void)
{
#if defined(__ARM_FP) || defined(__ARM_FEATURE_MVE)
    /* CP10/CP11 full access first: compiled code below may already use FP/MVE registers. */
    CLB_SCB_CPACR |= 0xFu << 20;
    __asm__ volatile("dsb\n\tisb" ::: "memory");
#endif
    for (uint32_t *src = __data_load, *dst = __data_start; dst < __data_end;) {
        *dst++ = *src++;
    }
    for (uint32_t *dst = __bss_start; dst < __bss_end;) {
        *dst++ = 0u;
    }
    clb_platform_exit((int32_t)main(1, clb_argv));
}

/* Exception names by number (IPSR). */
static const char *const clb_exception_names[16] = {
    [2] = "NMI",        [3] = "HardFault",   [4] = "MemManage", [5] = "BusFault",
    [6] = "UsageFault", [7] = "SecureFault", [11] = "SVCall",   [12] = "DebugMonitor",
    [14] = "PendSV",    [15] = "SysTick",
};

/** @brief Print "colibri: <Fault> pc=... lr=... cfsr=... hfsr=..." and exit with 99. */
__attribute__((used)) void clb_fault_report(const uint32_t *frame, uint32_t exc_return)
{
    uint32_t ipsr;
    __asm__ volatile("mrs %0, ipsr" : "=r"(ipsr));
    ipsr &= 0x1FFu;
    const char *name =
        (ipsr < 16u && clb_exception_names[ipsr] != 0) ? clb_exception_names[ipsr] : "interrupt";
    char msg[160];
    char *p = clb_append(msg, "colibri: ");
    p = clb_append(p, name);
    p = clb_append(p, " pc=");
    p = clb_append_hex(p, frame[6]);
    p = clb_append(p, " lr=");
    p = clb_append_hex(p, frame[5]);
    p = clb_append(p, " exc=");
    p = clb_append_hex(p, ipsr);
    p = clb_append(p, " cfsr=");
    p = clb_append_hex(p, CLB_SCB_CFSR);
    p = clb_append(p, " hfsr=");
    p = clb_append_hex(p, CLB_SCB_HFSR);
    p = clb_append(p, " exc_return=");
    p = clb_append_hex(p, exc_return);
    p = clb_append(p, "\n");
    *p = '\0';
    clb_platform_puts(msg);
    clb_platform_exit(CLB_FAULT_EXIT_CODE);
}

/* Every exception lands here: pick the stack the frame was pushed on, then report. */
__attribute__((naked)) static void clb_fault_handler(void)
{
    __asm__ volatile("tst lr, #4\n\t"
                     "ite eq\n\t"
                     "mrseq r0, msp\n\t"
                     "mrsne r0, psp\n\t"
                     "mov r1, lr\n\t"
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
