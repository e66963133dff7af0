#!/usr/bin/env bash
# Build the libFuzzer harnesses with ASan + UBSan (clang from Debian: apt-get install clang
# libclang-rt-14-dev). Used by tests/runtime/test_fuzz.py and fuzz/run_long.sh.
#
#   fuzz/build.sh OUT_DIR [EXTRA_SOURCE.c ...]
#
# Writes OUT_DIR/fuzz_container and OUT_DIR/fuzz_seed (each: harness + runtime_c/src/*.c).
# With extra sources, builds only those, one program each, with the same flags (tests use
# this for a harness that must trip the allocation limit). CC overrides the compiler.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:?usage: fuzz/build.sh OUT_DIR [EXTRA_SOURCE.c ...]}"
shift
CC="${CC:-clang}"
command -v "$CC" >/dev/null || {
    echo "fuzz/build.sh: $CC not found; install it with: apt-get install clang libclang-rt-14-dev" >&2
    exit 2
}

CFLAGS=(
    -std=c11 -Wall -Wextra -Werror -pedantic -ffp-contract=off
    -O2 -g -fno-omit-frame-pointer
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
    -I"$ROOT/runtime_c/include" -I"$ROOT/fuzz"
)
mkdir -p "$OUT"
if (($# > 0)); then
    sources=("$@")
else
    sources=("$ROOT/fuzz/fuzz_container.c" "$ROOT/fuzz/fuzz_seed.c")
fi
for src in "${sources[@]}"; do
    name="$(basename "$src" .c)"
    "$CC" "${CFLAGS[@]}" "$src" "$ROOT"/runtime_c/src/*.c -lm -o "$OUT/$name"
    echo "built $OUT/$name"
done
