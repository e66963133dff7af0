#!/usr/bin/env bash
# Long fuzzing runs of the harnesses, one harness at a time (one core each).
#
#   fuzz/run_long.sh [--runs N] [--seconds S] [--out DIR]
#                    [fuzz_container|fuzz_seed|fuzz_lm|fuzz_shared ...]
#
#   --runs N     executions per harness (default 10000000, the issue's goal)
#   --seconds S  stop a harness after S seconds even if N is not reached (default: no limit)
#   --out DIR    binaries, corpus, crash artifacts and logs (default build/fuzz)
#
# Builds the harnesses with fuzz/build.sh (clang, -fsanitize=fuzzer,address,undefined), makes
# the seed corpus with fuzz/make_corpus.py (Colibri CLI; PYTHON, default .venv/bin/python) on
# first use and keeps what libFuzzer adds to it, then prints per harness: executions, exec/s,
# crashes (crash-, leak-, oom- and timeout- artifacts written), slow units (slow-unit-
# artifacts: inputs slower than libFuzzer's report threshold, not failures) and the largest
# allocation colibri_init made (fuzz_container, fuzz_seed) or the largest live-bytes peak and
# table ratios (fuzz_lm, fuzz_shared: fuzz_live.h). Exit status 1 when any harness crashed,
# leaked, hit a sanitizer report, the allocation limit (fuzz_common.h) or a live-bytes bound.
# The whole-model corpus needs torch and transformers in PYTHON (fuzz/make_corpus.py).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUNS=10000000
SECONDS_LIMIT=0
OUT="$ROOT/build/fuzz"
HARNESSES=()
while (($# > 0)); do
    case "$1" in
    --runs) RUNS="$2"; shift 2 ;;
    --seconds) SECONDS_LIMIT="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    fuzz_container | fuzz_seed | fuzz_lm | fuzz_shared) HARNESSES+=("$1"); shift ;;
    -h | --help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "run_long.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
((${#HARNESSES[@]} > 0)) || HARNESSES=(fuzz_container fuzz_seed fuzz_lm fuzz_shared)
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"

"$ROOT/fuzz/build.sh" "$OUT/bin" >/dev/null
if [[ ! -d "$OUT/corpus/container" || ! -d "$OUT/corpus/seed" || ! -d "$OUT/corpus/lm" ]]; then
    "$PYTHON" "$ROOT/fuzz/make_corpus.py" "$OUT/corpus" --python "$PYTHON" >/dev/null
fi

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:allocator_may_return_null=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
# Artifacts of one kind (crash / slow) in a directory.
failures() { find "$1" -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'oom-*' -o -name 'timeout-*' \) | wc -l; }
slow_units() { find "$1" -type f -name 'slow-unit-*' | wc -l; }
status=0
for harness in "${HARNESSES[@]}"; do
    max_len=8192
    case "$harness" in
    fuzz_container) corpus="$OUT/corpus/container" dict="$ROOT/fuzz/container.dict" ;;
    fuzz_seed) corpus="$OUT/corpus/seed" dict="$ROOT/fuzz/seed.dict" ;;
    fuzz_lm) corpus="$OUT/corpus/lm" dict="$ROOT/fuzz/lm.dict" max_len=16384 ;;
    fuzz_shared)
        # containers and packed seed models together, in a corpus of its own
        corpus="$OUT/corpus/shared" dict="$ROOT/fuzz/container.dict"
        if [[ ! -d "$corpus" ]]; then
            mkdir -p "$corpus"
            # an input both corpora hold (the same content hash) is copied once
            for f in "$OUT/corpus/container/"* "$OUT/corpus/seed/"*; do
                [[ -e "$corpus/${f##*/}" ]] || cp "$f" "$corpus/"
            done
        fi
        ;;
    esac
    if [[ ! -d "$corpus" ]]; then
        echo "==> $harness: no corpus at $corpus (fuzz/make_corpus.py needs torch for it)" >&2
        status=1
        continue
    fi
    artifacts="$OUT/artifacts/$harness"
    log="$OUT/$harness.log"
    mkdir -p "$artifacts"
    before=$(failures "$artifacts")
    slow_before=$(slow_units "$artifacts")
    echo "==> $harness: up to $RUNS executions$( ((SECONDS_LIMIT > 0)) && echo ", at most ${SECONDS_LIMIT} s")"
    rc=0
    "$OUT/bin/$harness" -runs="$RUNS" -max_total_time="$SECONDS_LIMIT" -dict="$dict" \
        -max_len="$max_len" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=64 \
        -print_final_stats=1 -artifact_prefix="$artifacts/" "$corpus" >"$log" 2>&1 || rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n1)
    largest=$(grep -oE 'largest (runtime allocation|live peak|table_bytes).*|colibri_init largest.*' "$log" | tail -n3 || true)
    crashes=$(($(failures "$artifacts") - before))
    slow=$(($(slow_units "$artifacts") - slow_before))
    echo "    executions: ${execs:-?}  exec/s: ${rate:-?}  crashes: $crashes  slow units: $slow  exit: $rc"
    echo "${largest:-largest runtime allocation: not reported}" | sed 's/^/    /'
    echo "    corpus: $(find "$corpus" -type f | wc -l) inputs; log: $log"
    if ((rc != 0 || crashes > 0)); then
        status=1
        grep -E 'ERROR|runtime error|colibri fuzz: (allocation|.* live bytes)|SUMMARY' "$log" | head -n 5 | sed 's/^/    /'
    fi
done
exit "$status"
