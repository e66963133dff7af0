/**
 * @file hello.c
 * @brief Self-test of a board's platform layer (no model, no runtime): reads input.bin, writes
 *        its bytes reversed to output.bin, checks three libm functions, prints one line and
 *        returns 3 so that the exit-code path is tested too. The loop between the bench markers
 *        is the region whose instructions tests/targets/test_platforms.py counts.
 */
#include "colibri_fmt.h"
#include "colibri_platform.h"

#include <math.h>
#include <stdint.h>

#define HELLO_MAX_BYTES 256
#define HELLO_EXIT_CODE 3

static uint8_t hello_in[HELLO_MAX_BYTES];
static uint8_t hello_out[HELLO_MAX_BYTES];

static int hello_close_to(float got, float want)
{
    float diff = got - want;
    return diff < 1e-5f && diff > -1e-5f;
}

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    clb_platform_init();

    int32_t fd = clb_platform_open("input.bin", CLB_PLATFORM_READ);
    if (fd < 0) {
        clb_platform_puts("hello: cannot open input.bin\n");
        return 10;
    }
    int32_t n = clb_platform_read(fd, hello_in, HELLO_MAX_BYTES);
    (void)clb_platform_close(fd);
    if (n < 0) {
        clb_platform_puts("hello: cannot read input.bin\n");
        return 11;
    }

    volatile float x = 0.5f;
    clb_platform_bench_begin();
    uint32_t checksum = 0;
    for (int32_t i = 0; i < n; i++) {
        hello_out[i] = hello_in[n - 1 - i];
        checksum = checksum * 31u + hello_out[i];
    }
    float e = expf(x);
    float r = erff(x);
    float t = tanhf(x);
    clb_platform_bench_end();

    int libm_ok = hello_close_to(e, 1.64872127f) && hello_close_to(r, 0.52049988f) &&
                  hello_close_to(t, 0.46211716f);

    fd = clb_platform_open("output.bin", CLB_PLATFORM_WRITE);
    if (fd < 0) {
        clb_platform_puts("hello: cannot create output.bin\n");
        return 12;
    }
    int32_t written = clb_platform_write(fd, hello_out, (uint32_t)n);
    (void)clb_platform_close(fd);
    if (written != n) {
        clb_platform_puts("hello: cannot write output.bin\n");
        return 13;
    }

    char line[96];
    char *p = clb_append(line, "colibri hello: reversed ");
    p = clb_append_u32(p, (uint32_t)n);
    p = clb_append(p, " bytes, checksum ");
    p = clb_append_u32(p, checksum);
    p = clb_append(p, libm_ok ? ", libm ok\n" : ", libm WRONG\n");
    *p = '\0';
    clb_platform_puts(line);
    return libm_ok ? HELLO_EXIT_CODE : 14;
}
