"""benchmarks/cache_bound.py: its replacement policies replayed on small use sequences, OPT
against an exhaustive search of every eviction choice, and the script on the committed trained
model (tests/data/trained_moe)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from functools import cache
from pathlib import Path

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import cache_bound  # noqa: E402

Use = tuple[int, int]


def best_hits(seq: list[Use], slots: int) -> int:
    """The most hits any eviction choices give (every choice tried)."""

    @cache
    def go(j: int, held: frozenset[Use]) -> int:
        if j == len(seq):
            return 0
        u = seq[j]
        if u in held:
            return 1 + go(j + 1, held)
        if len(held) < slots:
            return go(j + 1, held | {u})
        return max(go(j + 1, (held - {v}) | {u}) for v in held)

    return go(0, frozenset())


def test_opt_is_optimal_and_bounds_the_others() -> None:
    rng = random.Random(41)
    for _ in range(60):
        n_experts = rng.randint(2, 5)
        slots = rng.randint(1, n_experts)
        seq = [
            (rng.randint(0, 1), rng.randint(0, n_experts - 1)) for _ in range(rng.randint(1, 12))
        ]
        best = best_hits(seq, slots)
        assert cache_bound.opt(seq, slots) == best, (seq, slots)
        assert cache_bound.lru(seq, slots) <= best and cache_bound.lfu(seq, slots) <= best
        for pins in range(1, slots):
            top = frozenset(seq[:pins])
            # pinned experts are loaded at the start (as --pin's are): their first use is a hit
            assert cache_bound.lru(seq, slots, top) <= best + pins


def test_lru_and_lfu_by_hand() -> None:
    a, b, c = (0, 0), (0, 1), (0, 2)
    # 2 slots: a b a c b -> LRU evicts b for c (a was used last): hits a; LFU evicts b too
    assert cache_bound.lru([a, b, a, c, b], 2) == 1
    assert cache_bound.lfu([a, b, a, c, b], 2) == 1
    # a a b c a: LRU keeps b, c at the last a (a evicted); LFU keeps a (used twice)
    assert cache_bound.lru([a, a, b, c, a], 2) == 1
    assert cache_bound.lfu([a, a, b, c, a], 2) == 2


def test_script_on_the_committed_trained_model(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "cache_bound.py"), "--ckpt",
         str(ROOT / "tests" / "data" / "trained_moe"), "--tokens", "300", "--shares", "0.25",
         "--miss-us", "6", "--step-us", "29", "--json", str(out)],
        capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(out.read_text())
    assert row["slots"] == 4 and row["uses"] == 300 * 2 * 2
    rates = row["hit_rate"]
    assert all(0.0 <= v <= rates["OPT"] for v in rates.values())
    assert rates["OPT"] > rates["LRU"] > 0.25
    assert "<= 0." in proc.stdout
