#!/usr/bin/env bash
# Build the libFuzzer harnesses with ASan + UBSan (clang from Debian: apt-get install clang
# libclang-rt-14-dev). Used by tests/runtime/test_fuzz.py and fuzz/run_long.sh.
#
#   fuzz/build.sh OUT_DIR [EXTRA_SOURCE.c ...]
#
# Writes OUT_DIR/fuzz_container, fuzz_seed, fuzz_lm and fuzz_shared (each: harness + runtime_c/src/*.c and
# runtime_c/arch/x86_64/*.c, the host ISA's kernel levels, empty on other machines).
# With extra sources, builds only those, one program each, with the same flags (tests use
# this for a harness that must trip the allocation limit). CC overrides the compiler.
# The runtime is compiled once into OUT_DIR/obj and linked into every program (under the
# sanitizers the x86-64 kernel levels alone take minutes); FUZZ_OBJ_DIR names a directory of objects an
# earlier run of this script made, to link against instead of compiling again.
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
if [[ -n "${FUZZ_OBJ_DIR:-}" ]]; then
    objs=("$FUZZ_OBJ_DIR"/*.o)
    [[ -f "${objs[0]}" ]] || {
        echo "fuzz/build.sh: FUZZ_OBJ_DIR=$FUZZ_OBJ_DIR holds no objects" >&2
        exit 2
    }
else
    mkdir -p "$OUT/obj"
    objs=()
    for src in "$ROOT"/runtime_c/src/*.c "$ROOT"/runtime_c/arch/x86_64/*.c; do
        obj="$OUT/obj/$(basename "$src" .c).o"
        "$CC" "${CFLAGS[@]}" -c "$src" -o "$obj"
        objs+=("$obj")
    done
fi
if (($# > 0)); then
    sources=("$@")
else
    sources=("$ROOT/fuzz/fuzz_container.c" "$ROOT/fuzz/fuzz_seed.c" "$ROOT/fuzz/fuzz_lm.c"
        "$ROOT/fuzz/fuzz_shared.c")
fi
for src in "${sources[@]}"; do
    name="$(basename "$src" .c)"
    "$CC" "${CFLAGS[@]}" "$src" "${objs[@]}" -lm -o "$OUT/$name"
    echo "built $OUT/$name"
done
