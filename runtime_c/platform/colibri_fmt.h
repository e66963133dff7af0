/**
 * @file colibri_fmt.h
 * @brief Heap-free string building for fault reports and self-tests on bare-metal platforms (no
 *        printf).
 */
#ifndef COLIBRI_FMT_H
#define COLIBRI_FMT_H

#include <stdint.h>

/** @brief Copy s to p (no terminator); returns the new end. */
static inline char *clb_append(char *p, const char *s)
{
    while (*s != '\0') {
        *p++ = *s++;
    }
    return p;
}

/** @brief Append v as "0x" and eight hex digits; returns the new end. */
static inline char *clb_append_hex(char *p, uint32_t v)
{
    static const char digits[] = "0123456789abcdef";
    p = clb_append(p, "0x");
    for (int shift = 28; shift >= 0; shift -= 4) {
        *p++ = digits[(v >> shift) & 0xFu];
    }
    return p;
}

/** @brief Append name then v as clb_append_hex does (" pc=0x0800012c"); returns the new end. */
static inline char *clb_append_field(char *p, const char *name, uint32_t v)
{
    return clb_append_hex(clb_append(p, name), v);
}

/** @brief Append v in decimal; returns the new end. */
static inline char *clb_append_u32(char *p, uint32_t v)
{
    char digits[10];
    int n = 0;
    do {
        digits[n++] = (char)('0' + v % 10u);
        v /= 10u;
    } while (v != 0u);
    while (n > 0) {
        *p++ = digits[--n];
    }
    return p;
}

#endif /* COLIBRI_FMT_H */
