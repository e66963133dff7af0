/**
 * @file spin.c
 * @brief A guest that never exits: `colibri run` must stop it at the timeout and say so,
 *        rather than hang.
 */
#include "colibri_platform.h"

int main(void)
{
    clb_platform_init();
    clb_platform_puts("spin: looping forever\n");
    for (;;) {
        __asm__ volatile("" ::: "memory");
    }
}
