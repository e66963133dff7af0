/**
 * @file esp_log.h
 * @brief Test stub of ESP-IDF's esp_log.h: ESP_LOGE/W/I with printf format checking (see
 *        README.md).
 */
#ifndef COLIBRI_STUB_ESP_LOG_H
#define COLIBRI_STUB_ESP_LOG_H

/** @brief One log line: level letter, tag, message. */
void esp_log_stub_write(char level, const char *tag, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define ESP_LOGE(tag, fmt, ...) esp_log_stub_write('E', tag, fmt, ##__VA_ARGS__)
#define ESP_LOGW(tag, fmt, ...) esp_log_stub_write('W', tag, fmt, ##__VA_ARGS__)
#define ESP_LOGI(tag, fmt, ...) esp_log_stub_write('I', tag, fmt, ##__VA_ARGS__)

#endif /* COLIBRI_STUB_ESP_LOG_H */
