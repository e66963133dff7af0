#!/usr/bin/env python3
"""Instructions of top-k routing (64 experts, k 2): qsort + take-k + softmax, the plain two-pass
loop, and colibri_route_gate, counted between the bench markers of benchmarks/router_bench.c.

    python benchmarks/router_table.py [--board host] [--board cortex-m4] [--tokens N]
                                      [--rounds 2]

The host is counted with ``valgrind --tool=callgrind``, other boards with QEMU's TCG plugin
(colibri.targets.qemu); both are deterministic. The three loops are run interleaved (0, 1, 2,
0, 1, 2, ...) ``--rounds`` times and every round must give the same count. libcolibri.a is
built by the SConstruct for the board (in --workdir); router_bench.c and the board's platform
are compiled and linked here with the board's own compiler and flags. Default tokens: 1024 on
hosted boards, 256 on bare metal (the logits must fit the board's RAM).
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

WAYS = ("qsort + take-k + softmax", "plain two-pass loop", "colibri_route_gate")
RESULT_MARK = "router bench:"


def build(board: Board, tokens: int, work: Path) -> Path:
    """libcolibri.a by the SConstruct, then router_bench.c + the platform linked against it."""
    ok, why = board.can_build()
    if not ok:
        raise SystemExit(why)
    library = build_library(board, work / "lib")
    sources = [ROOT / "benchmarks" / "router_bench.c"]
    return build_bench(board, sources, [f"RB_TOKENS={tokens}"], work, "router_bench", library)


def count(board: Board, elf: Path, tokens: int, rounds: int) -> list[int]:
    """Instructions of each way, checked identical over the interleaved rounds."""
    seen: list[list[int]] = [[] for _ in WAYS]
    results: list[tuple[int, str]] = []
    for _ in range(rounds):
        results = count_modes(board, elf, range(len(WAYS)), RESULT_MARK)
        for way, (n, _line) in enumerate(results):
            seen[way].append(n)
    print(f"{board.name}: {results[-1][1].strip()}")
    for way, counts in enumerate(seen):
        if len(set(counts)) != 1:
            raise SystemExit(f"{board.name}: {WAYS[way]}: counts differ between rounds: {counts}")
    return [counts[0] for counts in seen]


def table(board: Board, counts: list[int], tokens: int) -> str:
    how = "callgrind" if board.kind == "host" else "QEMU icount"
    qsort_n, plain_n, route_n = counts
    lines = [f"{board.name} ({how}), {tokens} tokens, 64 experts, k 2", ""]
    lines.append(f"{'way':<26} {'instructions':>13} {'per token':>10} {'vs route_gate':>14}")
    for name, n in zip(WAYS, counts, strict=True):
        lines.append(f"{name:<26} {n:>13} {n / tokens:>10.1f} {n / route_n:>13.2f}x")
    lines.append("")
    lines.append(
        f"colibri_route_gate is {qsort_n / route_n:.2f}x cheaper than qsort + take-k + "
        f"softmax and {plain_n / route_n:.2f}x cheaper than the plain two-pass loop"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_board_argument(
        p, None, action="append", help=board_help(None, "board (repeatable; default host)")
    )
    p.add_argument("--tokens", type=int, default=0, help="0: 1024 hosted, 256 bare metal")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--workdir", default=str(ROOT / "build" / "router_table"))
    a = p.parse_args(argv)
    for name in a.board or ["host"]:
        try:
            board = load_board(name)
            tokens = a.tokens or (256 if board.is_baremetal else 1024)
            elf = build(board, tokens, Path(a.workdir) / name)
            counts = count(board, elf, tokens, max(a.rounds, 1))
        except ColibriError as exc:
            print(f"colibri: {exc}", file=sys.stderr)
            return 1
        print(table(board, counts, tokens))
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
