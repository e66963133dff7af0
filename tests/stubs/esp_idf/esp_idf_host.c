/**
 * @file esp_idf_host.c
 * @brief Host implementations of the ESP-IDF stubs and a main() that calls app_main(), so
 *        examples/esp_idf_app runs on the build machine in tests (see README.md).
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include "esp_log.h"
#include "esp_timer.h"

void app_main(void);

int64_t esp_timer_get_time(void)
{
    static int64_t us;
    us += 10;
    return us;
}

void esp_log_stub_write(char level, const char *tag, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    printf("%c (0) %s: ", level, tag);
    vprintf(fmt, args);
    printf("\n");
    va_end(args);
}

int main(void)
{
    app_main();
    fflush(stdout);
    return 0;
}
