/**
 * @file test_harness.h
 * @brief A tiny test harness for the C runtime tests: CHECK macros that print file:line with
 *        expected / actual values, and a summary line "N passed, M failed".
 */
#ifndef COLIBRI_TEST_HARNESS_H
#define COLIBRI_TEST_HARNESS_H

#include "colibri.h"

#include <math.h>
#include <stdio.h>

static int g_passed;
static int g_failed;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (cond) {                                                                                \
            g_passed++;                                                                            \
        } else {                                                                                   \
            g_failed++;                                                                            \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
        }                                                                                          \
    } while (0)

#define CHECK_INT(expected, actual)                                                                \
    do {                                                                                           \
        long long e_ = (long long)(expected), a_ = (long long)(actual);                            \
        if (e_ == a_) {                                                                            \
            g_passed++;                                                                            \
        } else {                                                                                   \
            g_failed++;                                                                            \
            fprintf(stderr, "%s:%d: %s: expected %lld, actual %lld\n", __FILE__, __LINE__,         \
                    #actual, e_, a_);                                                              \
        }                                                                                          \
    } while (0)

#define CHECK_STATUS(expected, actual)                                                             \
    do {                                                                                           \
        int e_ = (int)(expected), a_ = (int)(actual);                                              \
        if (e_ == a_) {                                                                            \
            g_passed++;                                                                            \
        } else {                                                                                   \
            g_failed++;                                                                            \
            fprintf(stderr, "%s:%d: %s: expected status %d (%s), actual %d (%s)\n", __FILE__,      \
                    __LINE__, #actual, e_, colibri_strerror(e_), a_, colibri_strerror(a_));        \
        }                                                                                          \
    } while (0)

#define CHECK_NEAR(expected, actual, tol)                                                          \
    do {                                                                                           \
        double e_ = (double)(expected), a_ = (double)(actual);                                     \
        if (fabs(e_ - a_) <= (tol)) {                                                              \
            g_passed++;                                                                            \
        } else {                                                                                   \
            g_failed++;                                                                            \
            fprintf(stderr, "%s:%d: %s: expected %.9g, actual %.9g (tol %g)\n", __FILE__,          \
                    __LINE__, #actual, e_, a_, (double)(tol));                                     \
        }                                                                                          \
    } while (0)

/** Bit-exact float array comparison; prints the first mismatch and the mismatch count. */
#define CHECK_FLOATS_EQ(expected, actual, n)                                                       \
    do {                                                                                           \
        size_t bad_ = 0, first_ = 0;                                                               \
        for (size_t i_ = 0; i_ < (size_t)(n); i_++) {                                              \
            if ((expected)[i_] != (actual)[i_]) {                                                  \
                if (bad_++ == 0) {                                                                 \
                    first_ = i_;                                                                   \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        if (bad_ == 0) {                                                                           \
            g_passed++;                                                                            \
        } else {                                                                                   \
            g_failed++;                                                                            \
            fprintf(stderr,                                                                        \
                    "%s:%d: %s: %zu of %zu differ; first at [%zu]: expected %.9g, "                \
                    "actual %.9g\n",                                                               \
                    __FILE__, __LINE__, #actual, bad_, (size_t)(n), first_,                        \
                    (double)(expected)[first_], (double)(actual)[first_]);                         \
        }                                                                                          \
    } while (0)

static int test_summary(void)
{
    printf("%d passed, %d failed\n", g_passed, g_failed);
    return g_failed == 0 ? 0 : 1;
}

/* xorshift32: deterministic, seeded randomness. */
static uint32_t g_rng = 0x12345678u;

static void rng_seed(uint32_t s)
{
    g_rng = s ? s : 0x12345678u;
}

static uint32_t rng_u32(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 17;
    g_rng ^= g_rng << 5;
    return g_rng;
}

/** Uniform float in [lo, hi). */
static float rng_float(float lo, float hi)
{
    return lo + (hi - lo) * (float)(rng_u32() >> 8) * (1.0f / 16777216.0f);
}

#endif /* COLIBRI_TEST_HARNESS_H */
