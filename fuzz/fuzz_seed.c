/**
 * @file fuzz_seed.c
 * @brief libFuzzer harness for the seed flat layout (COLI magic), whose dimensions come from
 *        config.json and whose router is router.bin beside the model file. The input packs all
 *        three so that the fuzzer mutates each:
 *
 *            u16 config_len, u16 router_len (little-endian), config.json bytes, router.bin
 *            bytes, then model.bin (the rest)
 *
 *        (lengths beyond the input are clamped). colibri_init runs with the NaN / Inf scan
 *        and PINNED experts, then without the scan and with an LRU cache (NONE for odd
 *        sizes); each successful load runs a forward pass and cleanup. fuzz/make_corpus.py
 *        packs model directories written by `colibri make-toy`.
 */
#include "fuzz_common.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_setup();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 4) {
        return 0;
    }
    size_t config_len = (size_t)data[0] | ((size_t)data[1] << 8);
    size_t router_len = (size_t)data[2] | ((size_t)data[3] << 8);
    const uint8_t *p = data + 4;
    size_t left = size - 4;
    config_len = config_len < left ? config_len : left;
    fuzz_live_write("config.json", p, config_len);
    p += config_len;
    left -= config_len;
    router_len = router_len < left ? router_len : left;
    fuzz_live_write("router.bin", p, router_len);
    p += router_len;
    left -= router_len;
    fuzz_live_write("model.bin", p, left);

    char path[128];
    fuzz_live_path(path, sizeof(path), "model.bin");
    const size_t files = size - 4u; /* F: config.json + router.bin + model.bin */
    fuzz_run(path, COLIBRI_CACHE_PINNED, 0, 0u, files);
    fuzz_run(path, (size & 1u) ? COLIBRI_CACHE_NONE : COLIBRI_CACHE_LRU, 2,
             COLIBRI_LOAD_SKIP_FINITE, files);
    return 0;
}
