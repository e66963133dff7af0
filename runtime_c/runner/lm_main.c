/**
 * @file lm_main.c
 * @brief The Colibri text-generation runner: a generated transformer (transformer_model.h) runs
 *        a prompt and generates tokens on any board.
 *
 * Input file (little-endian): u32 'CLBL', u32 n_prompt, u32 max_new, u32 flags (bit 0: write
 * the logits of every prompt position), f32 temperature, i32 top_k, f32 top_p, u32 seed_lo,
 * u32 seed_hi, then int32 prompt ids [n_prompt].
 * Output file: u32 'CLBG', u32 vocab, u32 n_prompt, u32 logit rows (n_prompt or 0), float32
 * logits [rows][vocab], then one int32 per generated token.
 *
 * The prompt and the generated tokens must fit the KV cache: n_prompt + max_new <=
 * COLIBRI_LM_MAX_CONTEXT, else nothing runs (exit 4, "context overflow"). Paths: argv[1],
 * argv[2] on hosted boards; "input.bin" / "output.bin" on bare metal. Exit status: 0 ok, 2 bad
 * input file, 3 I/O error, 4 context overflow, 10 + (-colibri_status) for a runtime error.
 * The bench markers bracket each decode step (one generated token after the prompt).
 * No heap, no printf.
 */
#include <stdint.h>
#include <string.h>

#include "colibri.h"
#include "colibri_platform.h"
#include "colibri_transformer.h"
#include "runner_io.h"
#include "transformer_model.h"

#define LM_IN_MAGIC 0x4C424C43u  /* "CLBL" */
#define LM_OUT_MAGIC 0x47424C43u /* "CLBG" */
#define LM_FLAG_LOGITS 0x1u

/** @brief Print a runtime failure and map it to the exit status. */
static int fail(const char *what, colibri_status st)
{
    clb_platform_puts("colibri: ");
    clb_platform_puts(what);
    clb_platform_puts(" failed: ");
    clb_platform_puts(colibri_strerror(st));
    clb_platform_puts("\n");
    return 10 - (int)st;
}

/** Parsed input header. */
typedef struct {
    uint32_t n_prompt;
    uint32_t max_new;
    uint32_t flags;
    colibri_sampler_t sampler;
    uint64_t seed;
} lm_request;

/** @brief Read and check the input header; 0 or an exit status. */
static int read_request(int32_t in, lm_request *req)
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
    if (req->n_prompt > (uint32_t)COLIBRI_LM_MAX_CONTEXT ||
        req->max_new > (uint32_t)COLIBRI_LM_MAX_CONTEXT - req->n_prompt) {
        say("context overflow: prompt + new tokens exceed the KV cache of ",
            (uint32_t)COLIBRI_LM_MAX_CONTEXT, " positions");
        return 4;
    }
    return 0;
}

/** @brief Prefill the prompt (writing its logits if asked), then generate max_new tokens. */
static int generate(int32_t in, int32_t out, const lm_request *req)
{
    const uint32_t row = (uint32_t)COLIBRI_LM_VOCAB * (uint32_t)sizeof(float);
    const float *logits = NULL;
    int32_t pos = 0;
    for (uint32_t i = 0; i < req->n_prompt; ++i) {
        int32_t id;
        if (read_all(in, &id, 4u) != 0) {
            say("input file truncated after ", i, " prompt ids");
            return 2;
        }
        if (id < 0 || id >= COLIBRI_LM_VOCAB) {
            say("prompt id out of the vocabulary at position ", i, "");
            return 2;
        }
        const colibri_status st = colibri_lm_step(id, pos++, &logits);
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
        colibri_status st = colibri_sample(logits, COLIBRI_LM_VOCAB, &req->sampler, &rng,
                                           colibri_lm_sample_workspace(), &next);
        if (st != COLIBRI_OK) {
            return fail("sampling", st);
        }
        if (write_all(out, &next, 4u) != 0) {
            return 3;
        }
        if (i + 1u < req->max_new) {
            clb_platform_bench_begin();
            st = colibri_lm_step(next, pos++, &logits);
            clb_platform_bench_end();
            if (st != COLIBRI_OK) {
                return fail("decode step", st);
            }
        }
    }
    return 0;
}

/** @brief Read the request, run it, write the output file. */
static int run(const char *in_path, const char *out_path)
{
    const colibri_status st = colibri_lm_setup();
    if (st != COLIBRI_OK) {
        return fail("setup", st);
    }
    const int32_t in = clb_platform_open(in_path, CLB_PLATFORM_READ);
    if (in < 0) {
        clb_platform_puts("colibri: cannot open the input file\n");
        return 3;
    }
    lm_request req;
    int rc = read_request(in, &req);
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
    const uint32_t ohdr[4] = {LM_OUT_MAGIC, (uint32_t)COLIBRI_LM_VOCAB, req.n_prompt, rows};
    rc = write_all(out, ohdr, sizeof ohdr) != 0 ? 3 : generate(in, out, &req);
    clb_platform_close(in);
    clb_platform_close(out);
    if (rc == 0) {
        say("model " COLIBRI_LM_NAME ": ", req.max_new, " tokens generated");
    }
    return rc;
}

int main(int argc, char **argv)
{
    clb_platform_init();
    const char *in_path = argc > 2 ? argv[1] : "input.bin";
    const char *out_path = argc > 2 ? argv[2] : "output.bin";
    return run(in_path, out_path);
}
