/**
 * @file zephyr_host.c
 * @brief Host implementations of the Zephyr stubs, so examples/zephyr_app runs on the build
 *        machine in tests (see README.md).
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include <zephyr/kernel.h>
#include <zephyr/sys/printk.h>

uint32_t k_cycle_get_32(void)
{
    static uint32_t cycles;
    cycles += 1000u;
    return cycles;
}

void printk(const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    vprintf(fmt, args);
    va_end(args);
}
