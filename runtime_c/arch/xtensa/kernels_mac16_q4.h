/**
 * @file kernels_mac16_q4.h
 * @brief Xtensa MAC16 int4 x int8 path of kernels_q.c (ESP32 / ESP32-S3: COLIBRI_XTENSA_MAC16),
 *        selected by kernels_isa.h: the matvec colibri_matvec_q4_q8 (which colibri_matmul_q4_q8
 *        and the generated int4 expert kernels run on these cores) on the 40-bit accumulator,
 *        and the one-block colibri_dot_q4_q8 (unexpanded activations, nibbles offset in place).
 *        Private to kernels_q.c.
 *
 * What it computes: for a block of 32 nibbles q_j (0..15; byte j of qs holds q_j in its low and
 * q_{j+16} in its high nibble) and 32 int8 codes x_j, isum = sum_j (q_j - 8) x_j, the integer the
 * portable loop returns, as sum_j q_j x_j - 8 sum_j x_j.
 *
 * How: MULA.AA adds the product of a signed 16-bit half of an address register and one of
 * another to ACC. Each word of 4 nibble bytes w = [b3 b2 b1 b0] gives four registers of
 * two nibbles each, in 5 instructions (three masks in registers):
 *   w & 0x000F000F         = (q_{j+2},        q_j)          x 1
 *   w & 0x0F000F00         = (q_{j+3},        q_{j+1})      x 256
 *   w & 0x00F000F0         = (q_{j+18},       q_{j+16})     x 16
 *   (w >> 4) & 0x0F000F00  = (q_{j+19},       q_{j+17})     x 256
 * and the activations are expanded once per block (for every row of the matrix) into the matching
 * words of 16-bit halves scaled so that every product is 256 q x: (256 x_{j+2}, 256 x_j),
 * (x_{j+3}, x_{j+1}), (16 x_{j+18}, 16 x_{j+16}), (x_{j+19}, x_{j+17}). All halves are exact
 * int16 (|256 x| <= 32768, 256 q <= 3840). A word of nibbles costs one load, five unpacking
 * instructions, four loads of activation words and eight MULA.AA: 2.25 instructions per MAC
 * (2.4 with the funnel shifts of a 2-byte aligned block, below). ACC starts at
 * -2048 sum x (the -8 offset, summed once per block of activations) and ends at 256 isum:
 * |256 isum| <= 256 * 32 * 8 * 128 = 2^23, so ACCLO alone holds it (ACC's bits above 31 are
 * never read; additions carry upwards only) and isum = ACCLO >> 8 exactly. Integer sums do not
 * depend on their order: the result is the portable code's bit for bit, and the matvec keeps
 * the library's float steps (acc += (float)isum * (d * sx[b]), blocks in order).
 *
 * qs sits at offset 2 of an 18-byte block, so every other block's nibbles are only 2-byte
 * aligned: those are read as aligned words and joined by the funnel shifter (SSAI 16, SRC), the
 * last two bytes by L16UI so that nothing past the block is read. Activations may have any
 * alignment (the expansion reads bytes). A last block of fewer than 32 inputs is expanded with
 * zero activations past n_in, which multiply its padding nibbles by 0 (its -8 offset sums only
 * the codes present): the portable partial-block sum; one of fewer than COLIBRI_MAC16_Q4_SHORT
 * inputs runs the portable loop itself (cheaper than a whole block on MAC16).
 *
 * The matvec expands COLIBRI_MAC16_Q4_CHUNK blocks of activations at a time into a stack buffer
 * (no heap; 264 bytes), runs every row over those blocks (a whole chunk unrolled) and keeps each
 * row's running float sum in y between chunks (the same additions in the same order; ADD.S with
 * the running sum first, so that NaN + NaN keeps its NaN as the C order does). ACC is the core's
 * MAC16 state (ESP-IDF saves it with a task's context); each block's assembly sets it first.
 */
#ifndef COLIBRI_KERNELS_MAC16_Q4_H
#define COLIBRI_KERNELS_MAC16_Q4_H

#include "colibri_quant.h"
#include "kernels_xtensa_f16.h" /* colibri_xt_f16_to_f32 */

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/** Blocks of activations expanded per pass of the matvec. */
#define COLIBRI_MAC16_Q4_CHUNK 4
/** Last blocks shorter than this many inputs take the portable loop in the matvec (a MAC16 block
 *  costs as much as about 13 portable MACs). */
#define COLIBRI_MAC16_Q4_SHORT 12
/** Words of one expanded block of activations. */
#define COLIBRI_MAC16_Q4_WORDS 16

/** Two signed 16-bit values as the halves of a word (hi in bits 16..31). */
static inline uint32_t colibri_mac16_halves(int32_t hi, int32_t lo)
{
    return ((uint32_t)hi << 16) | ((uint32_t)lo & 0xFFFFu);
}

/**
 * @brief Expands the n (1..32) codes at x (any alignment; codes from n on taken as 0) into the
 *        16 words xe of the block kernel (file comment) and returns ACC's start, -2048 * the sum
 *        of the codes.
 */
static inline int32_t colibri_mac16_q4_expand(const int8_t *x, int32_t n, uint32_t *xe)
{
    int8_t pad[COLIBRI_QK4];
    const int8_t *p = x;
    if (n < COLIBRI_QK4) {
        for (int32_t j = 0; j < COLIBRI_QK4; j++) {
            pad[j] = (j < n) ? x[j] : (int8_t)0;
        }
        p = pad;
    }
    int32_t sum = 0;
    for (int32_t j = 0; j < COLIBRI_QK4; j++) {
        sum += p[j];
    }
    for (int32_t s = 0; s < 4; s++) {
        const int8_t *v = p + 4 * s;
        xe[4 * s] = colibri_mac16_halves(256 * v[2], 256 * v[0]);
        xe[4 * s + 1] = colibri_mac16_halves(v[3], v[1]);
        xe[4 * s + 2] = colibri_mac16_halves(16 * v[18], 16 * v[16]);
        xe[4 * s + 3] = colibri_mac16_halves(v[19], v[17]);
    }
    return -2048 * sum;
}

/* Word s of a block: the four nibble registers of the word in W (W is overwritten), then their
 * eight MULA.AA against the activation words xe[4s .. 4s + 3], loaded into X0 / X1 (the same
 * register twice where registers are short). Not MULA.DA with the MAC16 registers m0 / m1 loaded
 * by LDINC, which counts the same: QEMU's esp32s3 core (the test and count platform) multiplies
 * an m register's value from before an LDINC when a MULA read it earlier in the block. */
#define CLB_Q4_WORD(W, s, X0, X1)                                                                  \
    "l32i   " X0 ", %[xe], " #s "*16\n\t"                                                          \
    "and    %[ta], " W ", %[k1]\n\t"                                                               \
    "and    %[tb], " W ", %[k2]\n\t"                                                               \
    "and    %[tc], " W ", %[k3]\n\t"                                                               \
    "srli   " W ", " W ", 4\n\t"                                                                   \
    "and    " W ", " W ", %[k2]\n\t"                                                               \
    "mula.aa.hh " X0 ", %[ta]\n\t"                                                                 \
    "mula.aa.ll " X0 ", %[ta]\n\t"                                                                 \
    "l32i   " X1 ", %[xe], " #s "*16+4\n\t"                                                        \
    "mula.aa.hh " X1 ", %[tb]\n\t"                                                                 \
    "mula.aa.ll " X1 ", %[tb]\n\t"                                                                 \
    "l32i   " X0 ", %[xe], " #s "*16+8\n\t"                                                        \
    "mula.aa.hh " X0 ", %[tc]\n\t"                                                                 \
    "mula.aa.ll " X0 ", %[tc]\n\t"                                                                 \
    "l32i   " X1 ", %[xe], " #s "*16+12\n\t"                                                       \
    "mula.aa.hh " X1 ", " W "\n\t"                                                                 \
    "mula.aa.ll " X1 ", " W "\n\t"

/* one instruction per line: clang-format would reflow the string concatenation */
/* clang-format off */
/* A 4-byte aligned block: its words at qs. */
#define CLB_Q4_ALIGNED                                                                             \
    "wsr    %[acc], acclo\n\t"                                                                      \
    "l32i   %[w], %[q], 0\n\t"                                                                      \
    CLB_Q4_WORD("%[w]", 0, "%[x0]", "%[x1]")                                                       \
    "l32i   %[w], %[q], 4\n\t"                                                                      \
    CLB_Q4_WORD("%[w]", 1, "%[x0]", "%[x1]")                                                       \
    "l32i   %[w], %[q], 8\n\t"                                                                      \
    CLB_Q4_WORD("%[w]", 2, "%[x0]", "%[x1]")                                                       \
    "l32i   %[w], %[q], 12\n\t"                                                                     \
    CLB_Q4_WORD("%[w]", 3, "%[x0]", "%[x1]")                                                       \
    "rsr    %[acc], acclo"
/* A 2-byte aligned block: the aligned words from qa = qs - 2 joined pairwise by SRC (SAR = 16),
 * the last two bytes by L16UI; one activation register (the address registers run short). */
#define CLB_Q4_UNALIGNED                                                                           \
    "wsr    %[acc], acclo\n\t"                                                                      \
    "ssai   16\n\t"                                                                                 \
    "l32i   %[u], %[qa], 0\n\t"                                                                     \
    "l32i   %[v], %[qa], 4\n\t"                                                                     \
    "src    %[w], %[v], %[u]\n\t"                                                                   \
    CLB_Q4_WORD("%[w]", 0, "%[x0]", "%[x0]")                                                       \
    "l32i   %[u], %[qa], 8\n\t"                                                                     \
    "src    %[w], %[u], %[v]\n\t"                                                                   \
    CLB_Q4_WORD("%[w]", 1, "%[x0]", "%[x0]")                                                       \
    "l32i   %[v], %[qa], 12\n\t"                                                                    \
    "src    %[w], %[v], %[u]\n\t"                                                                   \
    CLB_Q4_WORD("%[w]", 2, "%[x0]", "%[x0]")                                                       \
    "l16ui  %[u], %[qa], 16\n\t"                                                                    \
    "src    %[w], %[u], %[v]\n\t"                                                                   \
    CLB_Q4_WORD("%[w]", 3, "%[x0]", "%[x0]")                                                       \
    "rsr    %[acc], acclo"
/* clang-format on */

/**
 * @brief The integer sum of one block: nibbles at qs (2-byte aligned), activations expanded by
 *        colibri_mac16_q4_expand into xe with start value start.
 */
static inline __attribute__((always_inline)) int32_t
colibri_mac16_q4_isum(const uint8_t *qs, const uint32_t *xe, int32_t start)
{
    const uint32_t k1 = 0x000F000Fu;
    const uint32_t k2 = 0x0F000F00u;
    const uint32_t k3 = 0x00F000F0u;
    uint32_t acc = (uint32_t)start;
    uint32_t w;
    uint32_t ta;
    uint32_t tb;
    uint32_t tc;
    uint32_t x0;
    if (((uintptr_t)qs & 3u) == 0u) {
        uint32_t x1;
        __asm__ volatile(CLB_Q4_ALIGNED
                         : [acc] "+a"(acc), [w] "=&a"(w), [ta] "=&a"(ta), [tb] "=&a"(tb),
                           [tc] "=&a"(tc), [x0] "=&a"(x0), [x1] "=&a"(x1)
                         : [q] "a"(qs), [xe] "a"(xe), [k1] "a"(k1), [k2] "a"(k2), [k3] "a"(k3)
                         : "memory");
    } else {
        const uint8_t *qa = qs - 2;
        uint32_t u;
        uint32_t v;
        __asm__ volatile(CLB_Q4_UNALIGNED
                         : [acc] "+a"(acc), [w] "=&a"(w), [ta] "=&a"(ta), [tb] "=&a"(tb),
                           [tc] "=&a"(tc), [x0] "=&a"(x0), [u] "=&a"(u), [v] "=&a"(v)
                         : [qa] "a"(qa), [xe] "a"(xe), [k1] "a"(k1), [k2] "a"(k2), [k3] "a"(k3)
                         : "memory");
    }
    return (int32_t)acc >> 8; /* ACC = 256 isum */
}
#undef CLB_Q4_UNALIGNED
#undef CLB_Q4_ALIGNED
#undef CLB_Q4_WORD

/* One word s of nibbles in W and of activations at xq for colibri_mac16_q4_block: W ^ 0x88...
 * turns each nibble q into the 4-bit two's complement of q - 8, which a mask with 0xF000F000
 * (after shifts by 0, 4, 8, 12) puts at the top of both 16-bit halves: 4096 (q - 8), exact;
 * the activation words masked with 0xFF00FF00 (before and after a shift by 8) hold 256 x. */
#define CLB_Q4B_WORD(s)                                                                            \
    "l32i   %[w], %[q], " #s "*4\n\t"                                                              \
    "l32i   %[xl], %[x], " #s "*4\n\t"                                                             \
    "l32i   %[xh], %[x], " #s "*4+16\n\t"                                                          \
    "xor    %[w], %[w], %[k8]\n\t"                                                                 \
    "and    %[td], %[w], %[kf]\n\t"                                                                \
    "slli   %[w], %[w], 4\n\t"                                                                     \
    "and    %[tc], %[w], %[kf]\n\t"                                                                \
    "slli   %[w], %[w], 4\n\t"                                                                     \
    "and    %[tb], %[w], %[kf]\n\t"                                                                \
    "slli   %[w], %[w], 4\n\t"                                                                     \
    "and    %[w], %[w], %[kf]\n\t"                                                                 \
    "and    %[xo], %[xl], %[m]\n\t"                                                                \
    "slli   %[xl], %[xl], 8\n\t"                                                                   \
    "and    %[xl], %[xl], %[m]\n\t"                                                                \
    "mula.aa.hh %[xl], %[w]\n\t"                                                                   \
    "mula.aa.ll %[xl], %[w]\n\t"                                                                   \
    "mula.aa.hh %[xo], %[tc]\n\t"                                                                  \
    "mula.aa.ll %[xo], %[tc]\n\t"                                                                  \
    "and    %[xo], %[xh], %[m]\n\t"                                                                \
    "slli   %[xh], %[xh], 8\n\t"                                                                   \
    "and    %[xh], %[xh], %[m]\n\t"                                                                \
    "mula.aa.hh %[xh], %[tb]\n\t"                                                                  \
    "mula.aa.ll %[xh], %[tb]\n\t"                                                                  \
    "mula.aa.hh %[xo], %[td]\n\t"                                                                  \
    "mula.aa.ll %[xo], %[td]\n\t"

/**
 * @brief The int8 dot product of a full int4 block (32 values) with xq, for colibri_dot_q4_q8:
 *        on MAC16 when xq is 4-byte aligned (nibbles turned into q - 8 in place: no activation
 *        expansion, which would not pay for one block; ACC = 2^20 isum, read from ACCHI and
 *        ACCLO), else the portable loop.
 */
static inline int32_t colibri_mac16_q4_block(const colibri_block_q4_32 *blk, const int8_t *xq)
{
    if (((uintptr_t)xq & 3u) != 0u) {
        int32_t acc = 0;
        for (int32_t j = 0; j < 16; j++) {
            const int32_t lo = (int32_t)(blk->qs[j] & 0x0Fu) - 8;
            const int32_t hi = (int32_t)(blk->qs[j] >> 4) - 8;
            acc += lo * (int32_t)xq[j] + hi * (int32_t)xq[j + 16];
        }
        return acc;
    }
    uint32_t qw[4]; /* the nibbles 4-byte aligned (qs is at offset 2 of the block) */
    const uint8_t *q = blk->qs;
    if (((uintptr_t)q & 3u) != 0u) {
        memcpy(qw, q, sizeof qw);
        q = (const uint8_t *)qw;
    }
    const uint32_t k8 = 0x88888888u;
    const uint32_t kf = 0xF000F000u;
    const uint32_t m = 0xFF00FF00u;
    uint32_t w, tb, tc, td, xl, xh, xo;
    uint32_t lo;
    uint32_t hi;
    __asm__ volatile("wsr    %[z], acclo\n\t"
                     "wsr    %[z], acchi\n\t" CLB_Q4B_WORD(0) CLB_Q4B_WORD(1) CLB_Q4B_WORD(2)
                         CLB_Q4B_WORD(3) "rsr    %[w], acclo\n\t"
                                         "rsr    %[tb], acchi"
                     : [w] "=&a"(w), [tb] "=&a"(tb), [tc] "=&a"(tc), [td] "=&a"(td), [xl] "=&a"(xl),
                       [xh] "=&a"(xh), [xo] "=&a"(xo)
                     : [q] "a"(q), [x] "a"(xq), [k8] "a"(k8), [kf] "a"(kf), [m] "a"(m), [z] "a"(0)
                     : "memory");
    lo = w;
    hi = tb;
    /* ACC / 2^20: bits 39..20, a 20-bit two's complement value */
    return (int32_t)(((hi & 0xFFu) << 24) | ((lo >> 20) << 12)) >> 12;
}
#undef CLB_Q4B_WORD

/** @brief acc + p in that operand order (ADD.S): when both are NaNs the result is acc's, as
 *         where the compiler writes the C expression's order, whatever registers it picks. */
static inline __attribute__((always_inline)) float colibri_xt_add(float acc, float p)
{
#if !defined(__XTENSA_SOFT_FLOAT__)
    __asm__("add.s %0, %0, %1" : "+f"(acc) : "f"(p));
    return acc;
#else
    return acc + p;
#endif
}

/**
 * @brief colibri_matvec_q4_q8 bit for bit: y[o] = sum_b (float)isum_b * (d_b * sx[b]), blocks in
 *        order, the last block partial when n_in is not a multiple of 32.
 */
static inline void colibri_mac16_matvec_q4_q8(const colibri_block_q4_32 *w, const int8_t *xq,
                                              const float *sx, float *y, int32_t n_out,
                                              int32_t n_in)
{
    uint32_t xe[COLIBRI_MAC16_Q4_CHUNK * COLIBRI_MAC16_Q4_WORDS];
    int32_t start[COLIBRI_MAC16_Q4_CHUNK];
    const size_t nb = COLIBRI_Q4_BLOCKS(n_in);
    if (nb == 0u) {
        for (int32_t o = 0; o < n_out; o++) {
            y[o] = 0.0f;
        }
        return;
    }
    /* a last block of fewer than COLIBRI_MAC16_Q4_SHORT inputs: the portable loop (after) */
    const int32_t tail = n_in % COLIBRI_QK4;
    const size_t nbm = (tail > 0 && tail < COLIBRI_MAC16_Q4_SHORT) ? nb - 1u : nb;
    for (size_t b0 = 0; b0 < nbm; b0 += COLIBRI_MAC16_Q4_CHUNK) {
        const size_t nc = (nbm - b0 < COLIBRI_MAC16_Q4_CHUNK) ? nbm - b0 : COLIBRI_MAC16_Q4_CHUNK;
        for (size_t c = 0; c < nc; c++) {
            const int32_t i0 = (int32_t)((b0 + c) * COLIBRI_QK4);
            const int32_t n = (n_in - i0 < COLIBRI_QK4) ? n_in - i0 : COLIBRI_QK4;
            start[c] = colibri_mac16_q4_expand(xq + i0, n, xe + c * COLIBRI_MAC16_Q4_WORDS);
        }
        const float *xs = sx + b0;
        for (int32_t o = 0; o < n_out; o++) {
            const colibri_block_q4_32 *blk = w + (size_t)o * nb + b0;
            float acc = (b0 == 0u) ? 0.0f : y[o];
            if (nc == COLIBRI_MAC16_Q4_CHUNK) { /* a whole chunk: unrolled, no loop counter */
#pragma GCC unroll 4
                for (size_t c = 0; c < COLIBRI_MAC16_Q4_CHUNK; c++) {
                    const int32_t s =
                        colibri_mac16_q4_isum(blk[c].qs, xe + c * COLIBRI_MAC16_Q4_WORDS, start[c]);
                    acc = colibri_xt_add(acc, (float)s * (colibri_xt_f16_to_f32(blk[c].d) * xs[c]));
                }
            } else {
                for (size_t c = 0; c < nc; c++) {
                    const int32_t s =
                        colibri_mac16_q4_isum(blk[c].qs, xe + c * COLIBRI_MAC16_Q4_WORDS, start[c]);
                    acc = colibri_xt_add(acc, (float)s * (colibri_xt_f16_to_f32(blk[c].d) * xs[c]));
                }
            }
            y[o] = acc;
        }
    }
    if (nbm < nb) {
        const int8_t *x = xq + nbm * COLIBRI_QK4;
        const float xs = sx[nbm];
        for (int32_t o = 0; o < n_out; o++) {
            const colibri_block_q4_32 *blk = w + (size_t)o * nb + nbm;
            int32_t s = 0;
            for (int32_t j = 0; j < tail; j++) {
                s += ((int32_t)(blk->qs[j] & 0x0Fu) - 8) * (int32_t)x[j]; /* j < 16 */
            }
            float acc = (nbm == 0u) ? 0.0f : y[o];
            acc = colibri_xt_add(acc, (float)s * (colibri_xt_f16_to_f32(blk->d) * xs));
            y[o] = acc;
        }
    }
}

#define COLIBRI_ISA_DOT_Q4_BLOCK colibri_mac16_q4_block
#define COLIBRI_ISA_MATVEC_Q4_Q8 colibri_mac16_matvec_q4_q8

#endif /* COLIBRI_KERNELS_MAC16_Q4_H */
