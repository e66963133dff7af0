/**
 * @file test_crc.c
 * @brief The containers' CRC-32 (crc32.c colibri_crc32): on x86-64 with PCLMULQDQ the
 *        folding path, elsewhere the tables. Checked against a bit-at-a-time loop written here
 *        (zlib's reflected polynomial 0xEDB88320) and the check value of "123456789", then
 *        against the tables alone (colibri_crc32_portable) for every length 0..400 at every
 *        alignment 0..15 and for a few larger sizes, so both paths return the same bits; with
 *        VPCLMULQDQ (512-bit folding from 256 bytes on) every length 0..1100 at a few
 *        alignments; and colibri_crc32_update over any split of a blob (the expert reads check
 *        a chunk at a time) against the whole blob's CRC, and colibri_crc32_combine of
 *        the chunks' own CRCs (two threads share an expert's read) likewise.
 */
#include "colibri_internal.h"
#include "test_harness.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BUF_BYTES ((1u << 20) + 64u)

static uint32_t crc_bitwise(const unsigned char *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int b = 0; b < 8; b++) {
            c = (c & 1u) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
        }
    }
    return c ^ 0xFFFFFFFFu;
}

int main(void)
{
    static colibri_crc32_tables ct;
    colibri_crc32_tables_init(&ct);
    unsigned char *buf = (unsigned char *)malloc(BUF_BYTES);
    CHECK(buf != NULL);
    if (buf == NULL) {
        return 1;
    }
    rng_seed(0x2545F491u);
    for (size_t i = 0; i < BUF_BYTES; i++) {
        buf[i] = (unsigned char)(rng_u32() >> 24);
    }
    (void)rng_float; /* the harness's, unused here */

    const unsigned char check[] = "123456789";
    CHECK_INT(0xCBF43926u, colibri_crc32(&ct, check, 9u));
    CHECK_INT(0xCBF43926u, colibri_crc32_portable(&ct, check, 9u));
    CHECK_INT(0u, colibri_crc32(&ct, check, 0u));

    /* the bit-at-a-time reference on the lengths around the folding path's edges */
    const size_t edges[] = {1, 15, 16, 17, 63, 64, 65, 79, 80, 127, 128, 129, 191, 192, 1000, 4099};
    for (size_t e = 0; e < sizeof edges / sizeof edges[0]; e++) {
        CHECK_INT(crc_bitwise(buf + 5, edges[e]), colibri_crc32(&ct, buf + 5, edges[e]));
    }

    /* every length 0..400 at every alignment: one count per length, failures printed */
    for (size_t n = 0; n <= 400u; n++) {
        int same = 1;
        for (size_t off = 0; off < 16u; off++) {
            const uint32_t got = colibri_crc32(&ct, buf + off, n);
            const uint32_t want = colibri_crc32_portable(&ct, buf + off, n);
            if (got != want) {
                fprintf(stderr, "crc32 of %zu bytes at offset %zu: %08x, tables %08x\n", n, off,
                        (unsigned)got, (unsigned)want);
                same = 0;
            }
        }
        CHECK(same);
    }
    /* the 512-bit folding's edges (256 bytes a round, 64 more at a time, the 16-byte tail) */
    for (size_t n = 401u; n <= 1100u; n++) {
        int same = 1;
        for (size_t off = 0; off < 4u; off++) {
            same &= colibri_crc32(&ct, buf + off, n) == colibri_crc32_portable(&ct, buf + off, n);
        }
        CHECK(same);
    }
    /* a blob checked a chunk at a time: zlib's crc32(crc, p, n) chaining, uneven splits */
    const size_t total = 300000u;
    const uint32_t whole = colibri_crc32_portable(&ct, buf + 1, total);
    const size_t steps[] = {1u, 7u, 64u, 255u, 256u, 4099u, 65536u, 262144u};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        uint32_t c = 0;
        for (size_t done = 0; done < total; done += steps[i]) {
            const size_t n = total - done < steps[i] ? total - done : steps[i];
            c = colibri_crc32_update(&ct, c, buf + 1 + done, n);
        }
        CHECK_INT(whole, c);
    }
    CHECK_INT(colibri_crc32(&ct, check, 9u), colibri_crc32_update(&ct, 0u, check, 9u));
    /* chunks checked apart (the expert reads share a read between two threads): each chunk's
     * own CRC-32, combined in order, is the whole blob's; empty chunks and a 0 CRC included */
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        uint32_t c = 0;
        for (size_t done = 0; done < total; done += steps[i]) {
            const size_t n = total - done < steps[i] ? total - done : steps[i];
            c = colibri_crc32_combine(c, colibri_crc32(&ct, buf + 1 + done, n), n);
        }
        CHECK_INT(whole, c);
    }
    CHECK_INT(whole, colibri_crc32_combine(whole, 0u, 0u));
    CHECK_INT(whole, colibri_crc32_combine(0u, whole, total));
    CHECK_INT(0xCBF43926u, colibri_crc32_combine(colibri_crc32(&ct, check, 4u),
                                                 colibri_crc32(&ct, check + 4, 5u), 5u));

    const size_t big[] = {4096u, 65536u + 13u, (1u << 20) + 7u};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        CHECK_INT(colibri_crc32_portable(&ct, buf + 3, big[i]),
                  colibri_crc32(&ct, buf + 3, big[i]));
    }
    /* one flipped bit anywhere changes it */
    const uint32_t before = colibri_crc32(&ct, buf, 4096u);
    buf[2049] ^= 0x10u;
    CHECK(colibri_crc32(&ct, buf, 4096u) != before);

    free(buf);
    return test_summary();
}
