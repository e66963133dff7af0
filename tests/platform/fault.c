/**
 * @file fault.c
 * @brief Deliberately faulting program: calls through an invalid function pointer, which must be
 *        reported as a fault (exit code 99, "colibri: HardFault ...") rather than a QEMU lockup.
 */
#include "colibri_platform.h"

#include <stdint.h>

typedef void (*fault_fn)(void);

int main(int argc, char **argv)
{
    (void)argv;
    clb_platform_init();
    clb_platform_puts("fault: calling through an invalid pointer\n");
    /* Even address (Thumb bit clear) in a region with no code: INVSTATE usage fault. */
    volatile uintptr_t target = 0xFFFFFFF0u - (uintptr_t)argc * 0u;
    ((fault_fn)target)();
    clb_platform_puts("fault: still alive\n");
    return 0;
}
