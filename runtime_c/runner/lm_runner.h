/**
 * @file lm_runner.h
 * @brief What the two text-generation runners share (lm_main.c: a generated transformer on any
 *        board; lmfile_main.c: any whole-model container on host and Linux boards): the
 *        request file, prefill and sampling, the output file. No heap, no printf.
 *
 * Input file (little-endian): u32 'CLBL', u32 n_prompt, u32 max_new, u32 flags (bit 0: write
 * the logits of every prompt position), f32 temperature, i32 top_k, f32 top_p, u32 seed_lo,
 * u32 seed_hi, then int32 prompt ids [n_prompt].
 * Output file: u32 'CLBG', u32 vocab, u32 n_prompt, u32 logit rows (n_prompt or 0), float32
 * logits [rows][vocab], then one int32 per generated token.
 *
 * The prompt and the generated tokens must fit the KV cache (n_prompt + max_new <= its
 * positions), else nothing runs (exit 4, "context overflow"). Exit status: 0 ok, 2 bad input
 * file, 3 I/O error, 4 context overflow, 10 + (-colibri_status) for a runtime error. The bench
 * markers bracket each decode step (one generated token after the prompt). The model-file
 * runner's own arguments (KV cache positions, expert RAM budget and flags, its "expert slots"
 * line) are lmfile_main.c's.
 *
 * Include it after defining, in the runner:
 *   LM_STEP(id, pos, logits)  a colibri_status expression: token id at pos, *logits set
 *   LM_SAMPLE_WORKSPACE       the sampler's workspace (float *)
 * and optionally
 *   LM_PREFILL(ids, n, pos, logits)  a colibri_status expression: n prompt ids at pos .. as
 *                             one batch, *logits set to the last one's; then the prompt is read
 *                             in pieces of LM_PREFILL_IDS ids and each prefilled in one call
 *                             (unless the prompt's logits are asked for: token steps)
 *   LM_CLOCK_NS()             a monotonic clock in ns (uint64_t): lm_generate then records in
 *                             lm_timing the wall time of the prompt (prefill) and of the decode
 *                             loop (each generated token's sampling and the steps between)
 * (macros rather than function pointers, so every call stays direct and the MCU stack bound,
 * colibri/targets/stack.py, resolves it).
 */
#ifndef COLIBRI_LM_RUNNER_H
#define COLIBRI_LM_RUNNER_H

#include <stdint.h>
#include <string.h>

#include "colibri.h"
#include "colibri_platform.h"
#include "colibri_transformer.h"
#include "runner_io.h"

#define LM_IN_MAGIC 0x4C424C43u  /* "CLBL" */
#define LM_OUT_MAGIC 0x47424C43u /* "CLBG" */
#define LM_FLAG_LOGITS 0x1u

/** @brief Print a runtime failure on one line and map it to the exit status. */
static int lm_fail(const char *what, colibri_status st)
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

/** @brief Read and check the input header against a KV cache of ctx positions; 0 or an exit
 *         status. */
static int lm_read_request(int32_t in, uint32_t ctx, lm_request *req)
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

/** @brief Prefill the prompt (writing its logits if asked), then generate max_new tokens. */
/** Wall time of the last lm_generate (LM_CLOCK_NS; all 0 without it). */
static struct {
    uint64_t prefill_ns;    /**< the prompt's tokens, prefilled or stepped */
    uint64_t decode_ns;     /**< sampling every generated token and the steps between them */
    uint32_t prompt_tokens; /**< tokens of the prompt */
    uint32_t decode_steps;  /**< forward steps of the decode loop: generated tokens - 1 */
} lm_timing;

#ifndef LM_CLOCK_NS
#define LM_CLOCK_NS() ((uint64_t)0u)
#endif

static int lm_generate(int32_t vocab, int32_t in, int32_t out, const lm_request *req)
{
    const uint32_t row = (uint32_t)vocab * (uint32_t)sizeof(float);
    const float *logits = NULL;
    int32_t pos = 0;
    const uint64_t t_prompt = LM_CLOCK_NS();
#ifdef LM_PREFILL
    if ((req->flags & LM_FLAG_LOGITS) == 0u) {
        int32_t ids[LM_PREFILL_IDS];
        for (uint32_t i = 0; i < req->n_prompt;) {
            const uint32_t left = req->n_prompt - i;
            const uint32_t n = left < (uint32_t)LM_PREFILL_IDS ? left : (uint32_t)LM_PREFILL_IDS;
            if (read_all(in, ids, 4u * n) != 0) {
                say("input file truncated after ", i, " prompt ids");
                return 2;
            }
            for (uint32_t j = 0; j < n; ++j) {
                if (ids[j] < 0 || ids[j] >= vocab) {
                    say("prompt id out of the vocabulary at position ", i + j, "");
                    return 2;
                }
            }
            const colibri_status st = LM_PREFILL(ids, (int32_t)n, pos, &logits);
            if (st != COLIBRI_OK) {
                return lm_fail("prefill", st);
            }
            pos += (int32_t)n;
            i += n;
        }
    }
    for (uint32_t i = (req->flags & LM_FLAG_LOGITS) == 0u ? req->n_prompt : 0u; i < req->n_prompt;
         ++i) {
#else
    for (uint32_t i = 0; i < req->n_prompt; ++i) {
#endif
        int32_t id;
        if (read_all(in, &id, 4u) != 0) {
            say("input file truncated after ", i, " prompt ids");
            return 2;
        }
        if (id < 0 || id >= vocab) {
            say("prompt id out of the vocabulary at position ", i, "");
            return 2;
        }
        const colibri_status st = LM_STEP(id, pos++, &logits);
        if (st != COLIBRI_OK) {
            return lm_fail("prefill", st);
        }
        if ((req->flags & LM_FLAG_LOGITS) != 0u && write_all(out, logits, row) != 0) {
            return 3;
        }
    }
    const uint64_t t_decode = LM_CLOCK_NS();
    lm_timing.prefill_ns = t_decode - t_prompt;
    lm_timing.prompt_tokens = req->n_prompt;
    colibri_rng_t rng;
    colibri_rng_seed(&rng, req->seed);
    for (uint32_t i = 0; i < req->max_new; ++i) {
        int32_t next;
        colibri_status st =
            colibri_sample(logits, vocab, &req->sampler, &rng, LM_SAMPLE_WORKSPACE, &next);
        if (st != COLIBRI_OK) {
            return lm_fail("sampling", st);
        }
        if (write_all(out, &next, 4u) != 0) {
            return 3;
        }
        if (i + 1u < req->max_new) {
            clb_platform_bench_begin();
            st = LM_STEP(next, pos++, &logits);
            clb_platform_bench_end();
            if (st != COLIBRI_OK) {
                return lm_fail("decode step", st);
            }
        }
    }
    lm_timing.decode_ns = LM_CLOCK_NS() - t_decode;
    lm_timing.decode_steps = req->max_new > 0u ? req->max_new - 1u : 0u;
    return 0;
}

/** @brief Read the request from in_path, run it, write out_path; 0 (and *generated) or an exit
 *         status. */
static int lm_serve(const char *in_path, const char *out_path, int32_t vocab, uint32_t ctx,
                    uint32_t *generated)
{
    const int32_t in = clb_platform_open(in_path, CLB_PLATFORM_READ);
    if (in < 0) {
        clb_platform_puts("colibri: cannot open the input file\n");
        return 3;
    }
    lm_request req;
    int rc = lm_read_request(in, ctx, &req);
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
    const uint32_t ohdr[4] = {LM_OUT_MAGIC, (uint32_t)vocab, req.n_prompt, rows};
    rc = write_all(out, ohdr, sizeof ohdr) != 0 ? 3 : lm_generate(vocab, in, out, &req);
    clb_platform_close(in);
    clb_platform_close(out);
    *generated = req.max_new;
    return rc;
}

#endif /* COLIBRI_LM_RUNNER_H */
