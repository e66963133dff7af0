/**
 * @file esp_timer.h
 * @brief Test stub of ESP-IDF's esp_timer.h (see README.md).
 */
#ifndef COLIBRI_STUB_ESP_TIMER_H
#define COLIBRI_STUB_ESP_TIMER_H

#include <stdint.h>

/** @brief Microseconds since boot. */
int64_t esp_timer_get_time(void);

#endif /* COLIBRI_STUB_ESP_TIMER_H */
