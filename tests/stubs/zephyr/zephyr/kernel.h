/**
 * @file kernel.h
 * @brief Test stub of <zephyr/kernel.h>: the part examples/zephyr_app uses (see ../../README.md).
 */
#ifndef COLIBRI_STUB_ZEPHYR_KERNEL_H
#define COLIBRI_STUB_ZEPHYR_KERNEL_H

#include <stdint.h>

/** @brief Hardware cycle counter (32 bits, wraps). */
uint32_t k_cycle_get_32(void);

#endif /* COLIBRI_STUB_ZEPHYR_KERNEL_H */
