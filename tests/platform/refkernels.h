/**
 * @file refkernels.h
 * @brief What the two files of the refkernels self-test share: refkernels.c (the library's
 *        kernels against kernels_q_ref.c, the result line) and refkernels_tiles.c (the tiles of
 *        runtime_c/tiles against colibri_qi_ref.c).
 */
#ifndef COLIBRI_REFKERNELS_H
#define COLIBRI_REFKERNELS_H

#include <stdint.h>

/** Checks made and failed so far, the kernel level running, the shape shown on a failure. */
extern uint32_t rk_checks;
extern uint32_t rk_failed;
extern const char *rk_level;
extern int32_t rk_shape[3];

/** The seeded generator (xorshift32) and a float uniform in [-1, 1) from it. */
uint32_t rk_next(void);
float rk_float(void);
/** The bits of f. */
uint32_t rk_bits(float f);
/** One integer check (kernel, index, actual, expected). */
void rk_int(const char *kernel, int32_t index, int32_t got, int32_t want);
/** n floats, bit for bit (any NaN equals any NaN of the same sign). */
void rk_floats(const char *kernel, const float *got, const float *want, int32_t n);

/** Tiles compared by rk_tiles (the result line's count). */
#define RK_TILES 15
/** Every tile against its twin on the shapes of the current kernel level, the checks made. */
uint32_t rk_tiles(void);
/** The tiles' paths on this core, e.g. "int simd32, float vfp". */
const char *rk_tiles_paths(void);

#endif /* COLIBRI_REFKERNELS_H */
