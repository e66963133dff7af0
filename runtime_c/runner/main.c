/**
 * @file main.c
 * @brief The Colibri runner: runs a generated model over a token file on any board.
 *
 * Input file  (little-endian): u32 'CLBI', u32 T, u32 d_model, then float32 [T][d_model].
 * Output file (little-endian): u32 'CLBO', u32 T, u32 d_model, u32 top_k, u32 chunk, then per
 * chunk of n <= chunk tokens: float32 output[n][d_model], int32 expert_ids[n][top_k],
 * float32 gates[n][top_k].
 *
 * Paths: argv[1], argv[2] on hosted boards; "input.bin" / "output.bin" in the working
 * directory (semihosting / simcall) on bare metal. Exit status: 0 ok, 2 bad input file,
 * 3 I/O error, 10 + (-colibri_status) for a runtime error. No heap, no printf.
 */
#include <stdint.h>
#include <string.h>

#include "colibri.h"
#include "colibri_model.h"
#include "colibri_platform.h"
#include "runner_io.h"

#define RUNNER_IN_MAGIC 0x49424C43u  /* "CLBI" */
#define RUNNER_OUT_MAGIC 0x4F424C43u /* "CLBO" */

/** @brief Run the model over every chunk of the input file. */
static int run(const char *in_path, const char *out_path)
{
    colibri_model_t *model = NULL;
    colibri_gen_buffers_t buf;
    colibri_status st = colibri_gen_setup(&model, &buf);
    if (st != COLIBRI_OK) {
        clb_platform_puts("colibri: setup failed: ");
        clb_platform_puts(colibri_strerror(st));
        clb_platform_puts("\n");
        return 10 - (int)st;
    }
    const int32_t in = clb_platform_open(in_path, CLB_PLATFORM_READ);
    if (in < 0) {
        clb_platform_puts("colibri: cannot open the input file\n");
        return 3;
    }
    uint32_t hdr[3];
    if (read_all(in, hdr, sizeof hdr) != 0 || hdr[0] != RUNNER_IN_MAGIC) {
        clb_platform_puts("colibri: input file has no CLBI header\n");
        clb_platform_close(in);
        return 2;
    }
    const uint32_t tokens = hdr[1];
    if (hdr[2] != (uint32_t)COLIBRI_GEN_D_MODEL) {
        say("input d_model is ", hdr[2], ", the model's differs");
        clb_platform_close(in);
        return 10 - (int)COLIBRI_ERR_DIM;
    }
    const int32_t out = clb_platform_open(out_path, CLB_PLATFORM_WRITE);
    if (out < 0) {
        clb_platform_puts("colibri: cannot open the output file\n");
        clb_platform_close(in);
        return 3;
    }
    const uint32_t ohdr[5] = {RUNNER_OUT_MAGIC, tokens, (uint32_t)COLIBRI_GEN_D_MODEL,
                              (uint32_t)COLIBRI_GEN_TOP_K, (uint32_t)COLIBRI_GEN_MAX_TOKENS};
    int rc = write_all(out, ohdr, sizeof ohdr) != 0 ? 3 : 0;
    for (uint32_t done = 0; rc == 0 && done < tokens;) {
        uint32_t n = tokens - done;
        if (n > (uint32_t)COLIBRI_GEN_MAX_TOKENS) {
            n = (uint32_t)COLIBRI_GEN_MAX_TOKENS;
        }
        const uint32_t row = (uint32_t)COLIBRI_GEN_D_MODEL * (uint32_t)sizeof(float);
        const uint32_t krow = (uint32_t)COLIBRI_GEN_TOP_K * 4u;
        if (read_all(in, buf.input, n * row) != 0) {
            say("input file truncated after ", done, " tokens");
            rc = 2;
            break;
        }
        clb_platform_bench_begin();
        st = colibri_forward(model, buf.input, buf.output, (int32_t)n, COLIBRI_GEN_D_MODEL,
                             COLIBRI_GEN_TOP_K, buf.expert_ids, buf.gates, buf.route_temp);
        clb_platform_bench_end();
        if (st != COLIBRI_OK) {
            clb_platform_puts("colibri: forward failed: ");
            clb_platform_puts(colibri_strerror(st));
            clb_platform_puts("\n");
            rc = 10 - (int)st;
            break;
        }
        if (write_all(out, buf.output, n * row) != 0 ||
            write_all(out, buf.expert_ids, n * krow) != 0 ||
            write_all(out, buf.gates, n * krow) != 0) {
            rc = 3;
            break;
        }
        done += n;
    }
    clb_platform_close(in);
    clb_platform_close(out);
    if (rc == 0) {
        say("model " COLIBRI_GEN_NAME ": ", tokens, " tokens done");
    }
    colibri_cleanup(model);
    return rc;
}

int main(int argc, char **argv)
{
    clb_platform_init();
    const char *in_path = argc > 2 ? argv[1] : "input.bin";
    const char *out_path = argc > 2 ? argv[2] : "output.bin";
    return run(in_path, out_path);
}
