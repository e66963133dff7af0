/**
 * @file lmfile_main.c
 * @brief The model-file text-generation runner: one binary per board (host and Linux boards),
 *        built once, runs any whole model stored in a version-2 container (colibri_lm.h)
 *        without compiling anything per model. `colibri run model.clb --prompt-ids ...` uses it.
 *
 * Files (paths argv[1..3], else "model.clb", "input.bin", "output.bin" in the working
 * directory); input and output as lm_main.c (docs/transformer.md "Runner protocol"): u32
 * 'CLBL', n_prompt, max_new, flags (bit 0: the prompt's logits), f32 temperature, i32 top_k,
 * f32 top_p, u32 seed_lo, seed_hi, i32 ids[n_prompt]; out: u32 'CLBG', vocab, n_prompt, logit
 * rows, f32 logits [rows][vocab], one i32 per generated token. An optional argv[4] sets the
 * KV cache positions (default: the file's). Exit status: 0 ok, 2 bad input, 3 I/O, 4 context
 * overflow, 10 + (-colibri_status) for a model file or runtime error (printed on one line).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "colibri.h"
#include "colibri_lm.h"
#include "colibri_platform.h"
#include "colibri_transformer.h"
#include "runner_io.h"

#define LM_IN_MAGIC 0x4C424C43u  /* "CLBL" */
#define LM_OUT_MAGIC 0x47424C43u /* "CLBG" */
#define LM_FLAG_LOGITS 0x1u

/** @brief Print a runtime failure on one line and map it to the exit status. */
static int fail(const char *what, colibri_status st)
{
    clb_platform_puts("colibri: ");
    clb_platform_puts(what);
    clb_platform_puts(" failed: ");
    clb_platform_puts(colibri_strerror(st));
    clb_platform_puts("\n");
    return 10 - (int)st;
}

typedef struct {
    uint32_t n_prompt;
    uint32_t max_new;
    uint32_t flags;
    colibri_sampler_t sampler;
    uint64_t seed;
} lm_request;

static int read_request(int32_t in, uint32_t ctx, lm_request *req)
{
    uint32_t hdr[9];
    if (read_all(in, hdr, sizeof hdr) != 0 || hdr[0] != LM_IN_MAGIC) {
        clb_platform_puts("colibri: input file has no CLBL header\n");
        return 2;
    }
    req->n_prompt = hdr[1];
    req->max_new = hdr[2];
    req->flags = hdr[3];
    memcpy(&req->sampler.temperature, &hdr[4], 4u);
    memcpy(&req->sampler.top_k, &hdr[5], 4u);
    memcpy(&req->sampler.top_p, &hdr[6], 4u);
    req->seed = (uint64_t)hdr[7] | ((uint64_t)hdr[8] << 32);
    if (req->n_prompt == 0u) {
        clb_platform_puts("colibri: the prompt is empty\n");
        return 2;
    }
    if (req->n_prompt > ctx || req->max_new > ctx - req->n_prompt) {
        say("context overflow: prompt + new tokens exceed the KV cache of ", ctx, " positions");
        return 4;
    }
    return 0;
}

static int generate(colibri_lm_t *lm, int32_t vocab, int32_t in, int32_t out, const lm_request *req)
{
    const uint32_t row = (uint32_t)vocab * (uint32_t)sizeof(float);
    const float *logits = NULL;
    int32_t pos = 0;
    for (uint32_t i = 0; i < req->n_prompt; ++i) {
        int32_t id;
        if (read_all(in, &id, 4u) != 0) {
            say("input file truncated after ", i, " prompt ids");
            return 2;
        }
        if (id < 0 || id >= vocab) {
            say("prompt id out of the vocabulary at position ", i, "");
            return 2;
        }
        const colibri_status st = colibri_lm_forward(lm, id, pos++, &logits);
        if (st != COLIBRI_OK) {
            return fail("prefill", st);
        }
        if ((req->flags & LM_FLAG_LOGITS) != 0u && write_all(out, logits, row) != 0) {
            return 3;
        }
    }
    colibri_rng_t rng;
    colibri_rng_seed(&rng, req->seed);
    for (uint32_t i = 0; i < req->max_new; ++i) {
        int32_t next;
        colibri_status st = colibri_sample(logits, vocab, &req->sampler, &rng,
                                           colibri_lm_sampler_workspace(lm), &next);
        if (st != COLIBRI_OK) {
            return fail("sampling", st);
        }
        if (write_all(out, &next, 4u) != 0) {
            return 3;
        }
        if (i + 1u < req->max_new) {
            clb_platform_bench_begin();
            st = colibri_lm_forward(lm, next, pos++, &logits);
            clb_platform_bench_end();
            if (st != COLIBRI_OK) {
                return fail("decode step", st);
            }
        }
    }
    return 0;
}

static int run(colibri_lm_t *lm, const char *in_path, const char *out_path)
{
    colibri_lm_info_t info;
    colibri_lm_info(lm, &info);
    const int32_t in = clb_platform_open(in_path, CLB_PLATFORM_READ);
    if (in < 0) {
        clb_platform_puts("colibri: cannot open the input file\n");
        return 3;
    }
    lm_request req;
    int rc = read_request(in, (uint32_t)info.max_context, &req);
    if (rc != 0) {
        clb_platform_close(in);
        return rc;
    }
    const int32_t out = clb_platform_open(out_path, CLB_PLATFORM_WRITE);
    if (out < 0) {
        clb_platform_puts("colibri: cannot open the output file\n");
        clb_platform_close(in);
        return 3;
    }
    const uint32_t rows = (req.flags & LM_FLAG_LOGITS) != 0u ? req.n_prompt : 0u;
    const uint32_t ohdr[4] = {LM_OUT_MAGIC, (uint32_t)info.vocab_size, req.n_prompt, rows};
    rc = write_all(out, ohdr, sizeof ohdr) != 0 ? 3 : generate(lm, info.vocab_size, in, out, &req);
    clb_platform_close(in);
    clb_platform_close(out);
    if (rc == 0) {
        say("model file: ", req.max_new, " tokens generated");
    }
    return rc;
}

int main(int argc, char **argv)
{
    clb_platform_init();
    colibri_lm_config_t config;
    memset(&config, 0, sizeof config);
    config.model_path = argc > 1 ? argv[1] : "model.clb";
    if (argc > 4) {
        config.max_context = (int32_t)strtol(argv[4], NULL, 10);
    }
    colibri_lm_t *lm = NULL;
    const colibri_status st = colibri_lm_init(&config, &lm);
    if (st != COLIBRI_OK) {
        return fail("loading the model file", st);
    }
    const int rc = run(lm, argc > 2 ? argv[2] : "input.bin", argc > 3 ? argv[3] : "output.bin");
    colibri_lm_free(lm);
    return rc;
}
