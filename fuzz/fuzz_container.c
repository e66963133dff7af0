/**
 * @file fuzz_container.c
 * @brief libFuzzer harness: the input is a Colibri container (.clb). colibri_init loads it
 *        with every check on (CRC-32, NaN / Inf scan) and PINNED experts; then again as a
 *        trusted file (checksums skipped, so mutated blobs reach the forward pass; odd-sized
 *        inputs also skip the NaN / Inf scan) with an LRU cache of 1-3 slots. Each successful
 *        load runs a forward pass over a few tokens and cleanup. See fuzz_common.h for the
 *        bounds. Mutations keep the checksums right (fuzz_mutate_fixed) except one in 8, so
 *        the checked load gets past its CRCs.
 */
#include "fuzz_common.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_setup();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[128];
    fuzz_live_path(path, sizeof(path), "model.clb");
    fuzz_live_write("model.clb", data, size);
    fuzz_run(path, COLIBRI_CACHE_PINNED, 0, 0u, size);
    const uint32_t trusted =
        COLIBRI_LOAD_SKIP_CHECKSUM | ((size & 1u) ? COLIBRI_LOAD_SKIP_FINITE : 0u);
    fuzz_run(path, COLIBRI_CACHE_LRU, 1 + (int32_t)(size % 3u), trusted, size);
    return 0;
}

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed)
{
    return fuzz_mutate_fixed(data, size, max_size, seed);
}
