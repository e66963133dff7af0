/**
 * @file sample_bench.c
 * @brief Instruction cost of drawing one token with colibri_sample over a vocabulary of
 *        SB_VOCAB logits (roughly N(0, 2) on a 2^-8 grid, so ties occur), SB_DRAWS draws with
 *        fresh logits each, three settings:
 *          0  greedy (temperature 0: the argmax)
 *          1  temperature 0.8, top-k 40, top-p 0.95: the k best by partial selection
 *          2  temperature 0.8, top-k 0 (every token), top-p 0.95: the whole vocabulary ranked,
 *             which is what every sampled draw cost before top-k used partial selection
 *        The first byte of input.bin picks the setting run between the bench markers
 *        (benchmarks/sample_table.py counts its instructions with callgrind or QEMU).
 */
#include "bench_io.h"
#include "colibri.h"
#include "colibri_fmt.h"
#include "colibri_platform.h"
#include "colibri_transformer.h"

#include <stdint.h>

#ifndef SB_VOCAB
#define SB_VOCAB 32000
#endif
#ifndef SB_DRAWS
#define SB_DRAWS 8
#endif
#define SB_WAYS 3

static float sb_logits[SB_DRAWS][SB_VOCAB];
static unsigned char sb_work[COLIBRI_SAMPLE_WORKSPACE_BYTES(SB_VOCAB)] __attribute__((aligned(16)));
static uint32_t sb_state = 0x2545F491u;

static void sb_fill(void)
{
    for (int32_t d = 0; d < SB_DRAWS; d++) {
        for (int32_t i = 0; i < SB_VOCAB; i++) {
            int32_t acc = 0;
            for (int32_t j = 0; j < 4; j++) {
                acc += (int32_t)(bench_next(&sb_state) >> 20) - 2048;
            }
            sb_logits[d][i] = (float)(int32_t)((float)acc * (1.7f / 2048.0f) * 256.0f) / 256.0f;
        }
    }
}

/* Draw SB_DRAWS tokens with setting `way`; returns the sum of the tokens (checked to be in
 * range), or -1 on an error status. */
static int64_t sb_draw(int32_t way)
{
    static const colibri_sampler_t settings[SB_WAYS] = {
        {0.0f, 0, 1.0f}, {0.8f, 40, 0.95f}, {0.8f, 0, 0.95f}};
    colibri_rng_t rng;
    colibri_rng_seed(&rng, 42u);
    int64_t sum = 0;
    for (int32_t d = 0; d < SB_DRAWS; d++) {
        int32_t token = -1;
        if (colibri_sample(sb_logits[d], SB_VOCAB, &settings[way], &rng, sb_work, &token) !=
                COLIBRI_OK ||
            token < 0 || token >= SB_VOCAB) {
            return -1;
        }
        sum += token;
    }
    return sum;
}

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    clb_platform_init();
    sb_fill();
    const uint8_t mode = bench_mode(0xFFu);
    int64_t sum = 0;
    clb_platform_bench_begin();
    if (mode < SB_WAYS) {
        sum = sb_draw((int32_t)mode);
    }
    clb_platform_bench_end();

    char line[120];
    char *p = clb_append(line, "sample bench: vocab ");
    p = clb_append_u32(p, SB_VOCAB);
    p = clb_append(p, ", draws ");
    p = clb_append_u32(p, SB_DRAWS);
    p = clb_append(p, ", setting ");
    p = clb_append_u32(p, mode);
    p = clb_append(p, sum < 0 ? ", failed\n" : ", ok\n");
    *p = '\0';
    clb_platform_puts(line);
    return sum < 0 ? 1 : 0;
}
