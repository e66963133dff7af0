#!/usr/bin/env python3
"""Instructions of top-k routing (default 64 experts, k 2): qsort + take-k + softmax, the plain
two-pass loop, and colibri_route_gate, counted between the bench markers of
benchmarks/router_bench.c.

    python benchmarks/router_table.py [--board host] [--board cortex-m4] [--tokens N]
                                      [--rounds 2] [--experts 64] [--k 2] [--seed 0] [--family]

``--experts`` and ``--k`` take comma-separated lists; every pair with k <= experts is built and
counted (a shape per build: the bench's sizes are compile-time constants), and with more than one
shape a summary per board gives min / median / max of both ratios and the worst shape.
``--family`` is ``--experts 4,7,8,13,16,64 --k 1,2``. ``--seed`` picks the logits (0: the
bench's default stream).

The host is counted with ``valgrind --tool=callgrind``, other boards with QEMU's TCG plugin
(colibri.targets.qemu); both are deterministic. The three loops are run interleaved (0, 1, 2,
0, 1, 2, ...) ``--rounds`` times and every round must give the same count. libcolibri.a is
built by the SConstruct for the board (in --workdir); router_bench.c and the board's platform
are compiled and linked here with the board's own compiler and flags. Default tokens: 1024 on
hosted boards, 256 on bare metal (the logits must fit the board's RAM).
"""

from __future__ import annotations

import argparse
import statistics
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
FAMILY_EXPERTS = (4, 7, 8, 13, 16, 64)
FAMILY_K = (1, 2)


def seed_word(seed: int) -> int:
    """The bench's xorshift state for --seed (0: its default; never the all-zero state)."""
    if seed == 0:
        return 0x2545F491
    return ((seed * 2654435761) ^ 0x2545F491) & 0xFFFFFFFF or 1


def build(
    board: Board,
    tokens: int,
    work: Path,
    experts: int = 64,
    top_k: int = 2,
    seed: int = 0,
    library: Path | None = None,
) -> Path:
    """libcolibri.a by the SConstruct (unless given), then router_bench.c + the platform linked
    against it for one shape."""
    ok, why = board.can_build()
    if not ok:
        raise SystemExit(why)
    if library is None:
        library = build_library(board, work / "lib")
    sources = [ROOT / "benchmarks" / "router_bench.c"]
    defines = [
        f"RB_TOKENS={tokens}",
        f"RB_EXPERTS={experts}",
        f"RB_TOP_K={top_k}",
        f"RB_SEED={seed_word(seed):#x}u",
    ]
    shape_dir = work / f"e{experts}_k{top_k}_s{seed}"
    return build_bench(board, sources, defines, shape_dir, "router_bench", library)


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


def table(board: Board, counts: list[int], tokens: int, experts: int = 64, top_k: int = 2) -> str:
    how = "callgrind" if board.kind == "host" else "QEMU icount"
    qsort_n, plain_n, route_n = counts
    lines = [f"{board.name} ({how}), {tokens} tokens, {experts} experts, k {top_k}", ""]
    lines.append(f"{'way':<26} {'instructions':>13} {'per token':>10} {'vs route_gate':>14}")
    for name, n in zip(WAYS, counts, strict=True):
        lines.append(f"{name:<26} {n:>13} {n / tokens:>10.1f} {n / route_n:>13.2f}x")
    lines.append("")
    lines.append(
        f"colibri_route_gate is {qsort_n / route_n:.2f}x cheaper than qsort + take-k + "
        f"softmax and {plain_n / route_n:.2f}x cheaper than the plain two-pass loop"
    )
    return "\n".join(lines)


def summary(board: Board, rows: list[tuple[int, int, list[int]]], tokens: int) -> str:
    """min / median / max of both ratios over the shapes, and the worst shape of each."""
    lines = [f"{board.name}: {len(rows)} shapes (experts x k), {tokens} tokens, per token"]
    lines.append(
        f"{'experts':>7} {'k':>2} {'qsort/token':>12} {'plain/token':>12} {'route/token':>12}"
        f" {'vs qsort':>9} {'vs plain':>9}"
    )
    for experts, top_k, (q, p, r) in rows:
        lines.append(
            f"{experts:>7} {top_k:>2} {q / tokens:>12.1f} {p / tokens:>12.1f} {r / tokens:>12.1f}"
            f" {q / r:>8.2f}x {p / r:>8.2f}x"
        )
    for i, name in ((0, "qsort"), (1, "plain")):
        ratios = [(c[i] / c[2], e, k) for e, k, c in rows]
        values = [x for x, _, _ in ratios]
        worst = min(ratios)
        lines.append(
            f"vs {name}: min {min(values):.2f}x (experts {worst[1]}, k {worst[2]}) / median "
            f"{statistics.median(values):.2f}x / max {max(values):.2f}x"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_board_argument(
        p, None, action="append", help=board_help(None, "board (repeatable; default host)")
    )
    p.add_argument("--tokens", type=int, default=0, help="0: 1024 hosted, 256 bare metal")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--experts", default="64", help="comma-separated expert counts (default 64)")
    p.add_argument("--k", default="2", help="comma-separated top-k values (default 2)")
    p.add_argument("--seed", type=int, default=0, help="logits stream (0: the bench's default)")
    p.add_argument("--family", action="store_true", help="--experts 4,7,8,13,16,64 --k 1,2")
    p.add_argument("--workdir", default=str(ROOT / "build" / "router_table"))
    a = p.parse_args(argv)
    experts_list = list(FAMILY_EXPERTS) if a.family else [int(x) for x in a.experts.split(",")]
    k_list = list(FAMILY_K) if a.family else [int(x) for x in a.k.split(",")]
    shapes = [(e, k) for e in experts_list for k in k_list if 0 < k <= e]
    if not shapes:
        p.error("no shape with 0 < k <= experts")
    for name in a.board or ["host"]:
        rows: list[tuple[int, int, list[int]]] = []
        try:
            board = load_board(name)
            tokens = a.tokens or (256 if board.is_baremetal else 1024)
            work = Path(a.workdir) / name
            library = build_library(board, work / "lib")
            for experts, top_k in shapes:
                elf = build(board, tokens, work, experts, top_k, a.seed, library)
                counts = count(board, elf, tokens, max(a.rounds, 1))
                print(table(board, counts, tokens, experts, top_k))
                print()
                rows.append((experts, top_k, counts))
        except ColibriError as exc:
            print(f"colibri: {exc}", file=sys.stderr)
            return 1
        if len(rows) > 1:
            print(summary(board, rows, tokens))
            print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
