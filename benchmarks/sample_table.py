#!/usr/bin/env python3
"""Instructions of drawing one token with colibri_sample (vocabulary 32,000 on hosted boards,
4,096 on bare metal): greedy, top-k 40 + top-p 0.95 (the k best by partial selection), and
top-k 0 + top-p 0.95 (the whole vocabulary ranked, which every sampled draw cost before),
counted between the bench markers of benchmarks/sample_bench.c.

    python benchmarks/sample_table.py [--board host] [--board cortex-m7] [--rounds 2]

The host is counted with ``valgrind --tool=callgrind``, other boards with QEMU's TCG plugin;
both are deterministic, and the settings are run interleaved ``--rounds`` times (every round
must give the same counts). That the partial selection draws the same tokens as ranking the
whole vocabulary for the same seed is tests/c/test_sample.c's job, not this table's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "codegen"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_common import build_bench, build_library, count_modes  # noqa: E402
from colibri.boards import Board, load_board  # noqa: E402
from colibri.cli.argtypes import add_board_argument, board_help  # noqa: E402
from colibri.errors import ColibriError  # noqa: E402

WAYS = ("greedy", "top-k 40, top-p 0.95", "top-k 0, top-p 0.95 (full ranking)")
MARK = "sample bench:"


def measure(board: Board, vocab: int, draws: int, rounds: int, work: Path) -> list[int]:
    """Instructions per draw of each setting, checked identical over the interleaved rounds."""
    library = build_library(board, work / "lib")
    defines = [f"SB_VOCAB={vocab}", f"SB_DRAWS={draws}"]
    elf = build_bench(
        board, [ROOT / "benchmarks" / "sample_bench.c"], defines, work, "sample_bench", library
    )
    seen: list[set[int]] = [set() for _ in WAYS]
    for _ in range(max(rounds, 1)):
        for way, (n, line) in enumerate(count_modes(board, elf, range(len(WAYS)), MARK)):
            if "ok" not in line:
                raise SystemExit(f"{board.name}: {line.strip()}")
            seen[way].add(n)
    if any(len(s) != 1 for s in seen):
        raise SystemExit(f"{board.name}: counts differ between rounds: {seen}")
    return [next(iter(s)) // draws for s in seen]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_board_argument(
        p, None, action="append", help=board_help(None, "board (repeatable; default host)")
    )
    p.add_argument("--vocab", type=int, default=0, help="0: 32000 hosted, 4096 bare metal")
    p.add_argument("--draws", type=int, default=8)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--workdir", default=str(ROOT / "build" / "sample_table"))
    a = p.parse_args(argv)
    for name in a.board or ["host"]:
        try:
            board = load_board(name)
            ok, why = board.can_build()
            if not ok:
                raise SystemExit(why)
            vocab = a.vocab or (4096 if board.is_baremetal else 32000)
            per = measure(board, vocab, a.draws, a.rounds, Path(a.workdir) / name)
        except ColibriError as exc:
            print(f"colibri: {exc}", file=sys.stderr)
            return 1
        how = "callgrind" if board.kind == "host" else "QEMU icount"
        print(f"{board.name} ({how}), vocabulary {vocab}, {a.draws} draws")
        print(f"{'setting':<38} {'instructions/draw':>18} {'vs greedy':>10}")
        for way, n in zip(WAYS, per, strict=True):
            print(f"{way:<38} {n:>18} {n / per[0]:>9.2f}x")
        print(f"top-k 40 costs {per[2] / per[1]:.1f}x fewer instructions than ranking every token")
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
