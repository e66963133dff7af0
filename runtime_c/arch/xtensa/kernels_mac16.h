/**
 * @file kernels_mac16.h
 * @brief Xtensa MAC16 path of kernels_q.c (ESP32 / ESP32-S3: COLIBRI_XTENSA_MAC16), selected by
 *        kernels_isa.h: the int8 dot product on the 40-bit accumulator. Private to kernels_q.c.
 */
#ifndef COLIBRI_KERNELS_MAC16_H
#define COLIBRI_KERNELS_MAC16_H

#include <stdint.h>

#define COLIBRI_DOT_MAC16 1

/* Xtensa MAC16: MULA.AA.HH / .LL add the product of the high (low) signed 16-bit halves of two
 * address registers to the 40-bit accumulator ACC. A word of four int8 codes [c3 c2 c1 c0] masked
 * with 0xFF00FF00 holds 256*c3 and 256*c1 in its halves, and shifted left by 8 first, 256*c2 and
 * 256*c0: exact 16-bit values, so four MULAs add 65536 times the four products, for 3 instructions
 * of unpacking per operand word. |65536 a b| <= 2^30, so ACC (2^39) holds 256 of them: each piece
 * of at most 256 codes is read out (ACC / 65536, exact) and ACC cleared. a and b are 4-byte
 * aligned and n a multiple of 4. ACC is the core's (ESP-IDF saves it with a task's context). */
/* The words x and y of four codes each: both unpacked into masked halves (xh / yh: codes 3 and
 * 1, x / y: codes 2 and 0, times 256), four MULAs. */
#define CLB_MAC16_MULA4                                                                            \
    "and    %[xh], %[x], %[m]\n\t"                                                                 \
    "and    %[yh], %[y], %[m]\n\t"                                                                 \
    "slli   %[x], %[x], 8\n\t"                                                                     \
    "slli   %[y], %[y], 8\n\t"                                                                     \
    "and    %[x], %[x], %[m]\n\t"                                                                  \
    "and    %[y], %[y], %[m]\n\t"                                                                  \
    "mula.aa.hh %[xh], %[yh]\n\t"                                                                  \
    "mula.aa.ll %[xh], %[yh]\n\t"                                                                  \
    "mula.aa.hh %[x], %[y]\n\t"                                                                    \
    "mula.aa.ll %[x], %[y]\n\t"

/* ACC = 0, before a piece. */
static inline __attribute__((always_inline)) void clb_mac16_clear(void)
{
    __asm__ volatile("wsr %0, acclo\n\twsr %0, acchi" ::"a"(0) : "memory");
}

/* ACC / 65536 (bits 39..16, a 24-bit two's complement value): a piece's exact integer sum. */
static inline __attribute__((always_inline)) int32_t clb_mac16_piece(void)
{
    uint32_t lo;
    uint32_t hi;
    __asm__ volatile("rsr %0, acclo\n\trsr %1, acchi" : "=a"(lo), "=a"(hi));
    const uint32_t piece = ((hi & 0xFFu) << 16) | (lo >> 16);
    return (int32_t)(piece << 8) >> 8;
}

/* One word of each operand: loaded, then CLB_MAC16_MULA4. */
#define CLB_MAC16_WORD(off)                                                                        \
    "l32i   %[x], %[pa], " #off "\n\t"                                                             \
    "l32i   %[y], %[pb], " #off "\n\t" CLB_MAC16_MULA4

static inline __attribute__((always_inline)) int32_t dot_q8_mac16(const int8_t *a, const int8_t *b,
                                                                  int32_t n)
{
    const int8_t *pa = a;
    const int8_t *pb = b;
    const uint32_t mask = 0xFF00FF00u;
    int32_t acc = 0;
    for (int32_t left = n; left > 0;) {
        const int32_t words = (left < 256 ? left : 256) / 4;
        int32_t quads = words / 4;
        uint32_t x;
        uint32_t y;
        uint32_t xh;
        uint32_t yh;
        clb_mac16_clear();
        /* A branch loop, not the zero-overhead LOOP: GCC may turn an enclosing loop into one,
         * and LOOP registers do not nest. */
        if (quads > 0) {
            __asm__ volatile("1:\n\t" CLB_MAC16_WORD(0) CLB_MAC16_WORD(4) CLB_MAC16_WORD(8)
                                 CLB_MAC16_WORD(12) "addi   %[pa], %[pa], 16\n\t"
                                                    "addi   %[pb], %[pb], 16\n\t"
                                                    "addi   %[q], %[q], -1\n\t"
                                                    "bnez   %[q], 1b"
                             : [pa] "+a"(pa), [pb] "+a"(pb), [q] "+a"(quads), [x] "=&a"(x),
                               [y] "=&a"(y), [xh] "=&a"(xh), [yh] "=&a"(yh)
                             : [m] "a"(mask)
                             : "memory");
        }
        for (int32_t j = 0; j < words % 4; j++) {
            __asm__ volatile(CLB_MAC16_WORD(0) "addi   %[pa], %[pa], 4\n\t"
                                               "addi   %[pb], %[pb], 4"
                             : [pa] "+a"(pa), [pb] "+a"(pb), [x] "=&a"(x), [y] "=&a"(y),
                               [xh] "=&a"(xh), [yh] "=&a"(yh)
                             : [m] "a"(mask)
                             : "memory");
        }
        acc += clb_mac16_piece();
        left -= words * 4;
    }
    return acc;
}
#undef CLB_MAC16_WORD

/* The same with a not 4-byte aligned (a row of a matrix whose n_in is not a multiple of 4; b,
 * the activation row, is aligned): the funnel shifter realigns it. SSA8L sets SAR from a's
 * address, and SRC takes the four bytes at a from the aligned words around them, (hi:lo) >> SAR;
 * the aligned words read lie within the 4-byte words that hold a's bytes, so nothing outside
 * them is touched. w0 carries the aligned word before each pair, w1 and w0 alternate. SAR is set
 * in each asm statement: GCC sets it right before each shift of its own and keeps nothing in it,
 * so it needs no clobber, but its shifts between the statements change it. */
#define CLB_MAC16_UWORD(off, lo, hi)                                                               \
    "l32i   %[" #hi "], %[pa], " #off "+4\n\t"                                                     \
    "src    %[x], %[" #hi "], %[" #lo "]\n\t"                                                      \
    "l32i   %[y], %[pb], " #off "\n\t" CLB_MAC16_MULA4

static __attribute__((noinline)) int32_t dot_q8_mac16_u(const int8_t *a, const int8_t *b, int32_t n)
{
    /* pa: the aligned word holding a[0]; w0: that word */
    const int8_t *pa = (const int8_t *)((uintptr_t)a & ~(uintptr_t)3u);
    const int8_t *pb = b;
    const uint32_t mask = 0xFF00FF00u;
    const uint32_t sar = (uint32_t)(uintptr_t)a;
    uint32_t w0 = *(const uint32_t *)(const void *)pa;
    int32_t acc = 0;
    for (int32_t left = n; left > 0;) {
        const int32_t words = (left < 256 ? left : 256) / 4;
        int32_t pairs = words / 2;
        uint32_t x;
        uint32_t y;
        uint32_t xh;
        uint32_t yh;
        uint32_t w1;
        clb_mac16_clear();
        if (pairs > 0) {
            __asm__ volatile(
                "ssa8l  %[s]\n\t"
                "1:\n\t" CLB_MAC16_UWORD(0, w0, w1)
                    CLB_MAC16_UWORD(4, w1, w0) "addi   %[pa], %[pa], 8\n\t"
                                               "addi   %[pb], %[pb], 8\n\t"
                                               "addi   %[q], %[q], -1\n\t"
                                               "bnez   %[q], 1b"
                : [pa] "+a"(pa), [pb] "+a"(pb), [q] "+a"(pairs), [w0] "+a"(w0), [w1] "=&a"(w1),
                  [x] "=&a"(x), [y] "=&a"(y), [xh] "=&a"(xh), [yh] "=&a"(yh)
                : [m] "a"(mask), [s] "a"(sar)
                : "memory");
        }
        if ((words & 1) != 0) {
            __asm__ volatile(
                "ssa8l  %[s]\n\t" CLB_MAC16_UWORD(0, w0, w1) "mov    %[w0], %[w1]\n\t"
                                                             "addi   %[pa], %[pa], 4\n\t"
                                                             "addi   %[pb], %[pb], 4"
                : [pa] "+a"(pa), [pb] "+a"(pb), [w0] "+a"(w0), [w1] "=&a"(w1), [x] "=&a"(x),
                  [y] "=&a"(y), [xh] "=&a"(xh), [yh] "=&a"(yh)
                : [m] "a"(mask), [s] "a"(sar)
                : "memory");
        }
        acc += clb_mac16_piece();
        left -= words * 4;
    }
    return acc;
}
#undef CLB_MAC16_UWORD

/* Both a and b misaligned, at different offsets (a token's activations in a group against a row,
 * n_in not a multiple of 4): each realigned as in dot_q8_mac16_u, SAR switched between the two
 * (one word a step: the carried words wa / wb, the new ones loaded into xh / yh first). */
static __attribute__((noinline)) int32_t dot_q8_mac16_uu(const int8_t *a, const int8_t *b,
                                                         int32_t n)
{
    const int8_t *pa = (const int8_t *)((uintptr_t)a & ~(uintptr_t)3u);
    const int8_t *pb = (const int8_t *)((uintptr_t)b & ~(uintptr_t)3u);
    const uint32_t mask = 0xFF00FF00u;
    const uint32_t sa = (uint32_t)(uintptr_t)a;
    const uint32_t sb = (uint32_t)(uintptr_t)b;
    uint32_t wa = *(const uint32_t *)(const void *)pa;
    uint32_t wb = *(const uint32_t *)(const void *)pb;
    int32_t acc = 0;
    for (int32_t left = n; left > 0;) {
        int32_t words = (left < 256 ? left : 256) / 4;
        left -= words * 4;
        uint32_t x;
        uint32_t y;
        uint32_t xh;
        uint32_t yh;
        clb_mac16_clear();
        __asm__ volatile("1:\n\t"
                         "l32i   %[xh], %[pa], 4\n\t"
                         "ssa8l  %[sa]\n\t"
                         "src    %[x], %[xh], %[wa]\n\t"
                         "mov    %[wa], %[xh]\n\t"
                         "l32i   %[yh], %[pb], 4\n\t"
                         "ssa8l  %[sb]\n\t"
                         "src    %[y], %[yh], %[wb]\n\t"
                         "mov    %[wb], %[yh]\n\t" CLB_MAC16_MULA4 "addi   %[pa], %[pa], 4\n\t"
                         "addi   %[pb], %[pb], 4\n\t"
                         "addi   %[q], %[q], -1\n\t"
                         "bnez   %[q], 1b"
                         : [pa] "+a"(pa), [pb] "+a"(pb), [q] "+a"(words), [wa] "+a"(wa),
                           [wb] "+a"(wb), [x] "=&a"(x), [y] "=&a"(y), [xh] "=&a"(xh), [yh] "=&a"(yh)
                         : [m] "a"(mask), [sa] "a"(sa), [sb] "a"(sb)
                         : "memory");
        acc += clb_mac16_piece();
    }
    return acc;
}

/** @brief acc of a[0..i) . b[0..i): the multiple-of-4 head of n, a and b at any address (a row
 *         of a matrix, or a token's activations in a group, whose n_in is not a multiple of 4,
 *         is realigned); nothing (i = 0) when n < 4. */
static inline __attribute__((always_inline)) int32_t
colibri_mac16_dot_q8(const int8_t *a, const int8_t *b, int32_t n, int32_t *pi)
{
    int32_t acc = 0;
    int32_t i = 0;
    if ((((uintptr_t)a | (uintptr_t)b) & 3u) == 0u) { /* the common case first: one test */
        acc = dot_q8_mac16(a, b, n & ~3);
        i = n & ~3;
    } else if (n >= 4) {
        const uint32_t ma = (uint32_t)(uintptr_t)a & 3u;
        const uint32_t mb = (uint32_t)(uintptr_t)b & 3u;
        if (ma != 0u && mb != 0u) {
            acc = dot_q8_mac16_uu(a, b, n & ~3);
        } else { /* the same sum either way round: the misaligned one first */
            acc = dot_q8_mac16_u(mb == 0u ? a : b, mb == 0u ? b : a, n & ~3);
        }
        i = n & ~3;
    }
    *pi = i;
    return acc;
}
#undef CLB_MAC16_MULA4
#define COLIBRI_ISA_DOT_Q8 colibri_mac16_dot_q8

#endif /* COLIBRI_KERNELS_MAC16_H */
