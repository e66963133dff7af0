/**
 * @file int64.c
 * @brief 64-bit integer multiply / divide helpers that Debian's xtensa-lx106 libgcc leaves out
 *        (on an ESP8266 the ROM provides them). Written with 32-bit operations, shifts and
 *        compares only, so that GCC cannot turn them back into calls to themselves. Built by
 *        scripts/setup.sh into build/tools/xtensa-lx106/libgcc-extra.a together with the
 *        Xtensa assembly helpers of libgcc (lib1funcs.S).
 */
#include <stdint.h>

uint64_t __udivdi3(uint64_t n, uint64_t d);
uint64_t __umoddi3(uint64_t n, uint64_t d);
int64_t __divdi3(int64_t n, int64_t d);
int64_t __moddi3(int64_t n, int64_t d);
uint64_t __udivmoddi4(uint64_t n, uint64_t d, uint64_t *rem);
int64_t __muldi3(int64_t a, int64_t b);

/* Restoring shift-subtract division; division by zero gives all ones (no trap). */
uint64_t __udivmoddi4(uint64_t n, uint64_t d, uint64_t *rem)
{
    uint64_t q = 0;
    uint64_t r = 0;
    if (d == 0) {
        if (rem != 0) {
            *rem = n;
        }
        return ~(uint64_t)0;
    }
    for (int bit = 63; bit >= 0; bit--) {
        r = (r << 1) | ((n >> bit) & 1u);
        if (r >= d) {
            r -= d;
            q |= (uint64_t)1 << bit;
        }
    }
    if (rem != 0) {
        *rem = r;
    }
    return q;
}

uint64_t __udivdi3(uint64_t n, uint64_t d)
{
    return __udivmoddi4(n, d, 0);
}

uint64_t __umoddi3(uint64_t n, uint64_t d)
{
    uint64_t r;
    (void)__udivmoddi4(n, d, &r);
    return r;
}

static uint64_t int64_magnitude(int64_t v)
{
    return v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
}

int64_t __divdi3(int64_t n, int64_t d)
{
    uint64_t q = __udivmoddi4(int64_magnitude(n), int64_magnitude(d), 0);
    return (int64_t)(((n < 0) != (d < 0)) ? (uint64_t)0 - q : q);
}

int64_t __moddi3(int64_t n, int64_t d)
{
    uint64_t r;
    (void)__udivmoddi4(int64_magnitude(n), int64_magnitude(d), &r);
    return (int64_t)((n < 0) ? (uint64_t)0 - r : r);
}

int64_t __muldi3(int64_t a, int64_t b)
{
    uint32_t a_lo = (uint32_t)a, a_hi = (uint32_t)((uint64_t)a >> 32);
    uint32_t b_lo = (uint32_t)b, b_hi = (uint32_t)((uint64_t)b >> 32);
    uint64_t low = (uint64_t)a_lo * b_lo; /* __umulsidi3 */
    uint32_t cross = a_lo * b_hi + a_hi * b_lo;
    return (int64_t)(low + ((uint64_t)cross << 32));
}
