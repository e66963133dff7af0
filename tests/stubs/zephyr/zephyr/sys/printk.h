/**
 * @file printk.h
 * @brief Test stub of <zephyr/sys/printk.h> (see ../../../README.md).
 */
#ifndef COLIBRI_STUB_ZEPHYR_PRINTK_H
#define COLIBRI_STUB_ZEPHYR_PRINTK_H

/** @brief Kernel console print, printf formats (floats need CONFIG_CBPRINTF_FP_SUPPORT). */
void printk(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif /* COLIBRI_STUB_ZEPHYR_PRINTK_H */
