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
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "codegen"))

from colibri.boards import Board, load_board, render_linker_script  # noqa: E402
from colibri.errors import ColibriError  # noqa: E402
from colibri.targets.qemu import run_elf  # noqa: E402

WAYS = ("qsort + take-k + softmax", "plain two-pass loop", "colibri_route_gate")
RESULT_MARK = "router bench:"


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")


def build(board: Board, tokens: int, work: Path) -> Path:
    """libcolibri.a by the SConstruct, then router_bench.c + the platform linked against it."""
    ok, why = board.can_build()
    if not ok:
        raise SystemExit(why)
    lib_dir = work / "lib"
    _run(
        [
            sys.executable,
            "-m",
            "SCons",
            "-Q",
            "-C",
            str(ROOT),
            f"board={board.name}",
            f"build_dir={lib_dir}",
        ]
    )
    rt = ROOT / "runtime_c"
    includes = [f"-I{rt / 'include'}", f"-I{rt / 'platform'}"]
    defines = [f"-D{d}" for d in board.all_defines()] + [f"-DRB_TOKENS={tokens}"]
    cc = [board.compiler, *board.compile_flags(), *defines, *includes]
    pdir = rt / "platform" / board.platform
    sources = [ROOT / "benchmarks" / "router_bench.c"]
    sources += sorted(p for p in pdir.iterdir() if p.suffix in (".c", ".S"))
    objs = []
    for src in sources:
        obj = work / "obj" / f"{src.stem}.o"
        obj.parent.mkdir(parents=True, exist_ok=True)
        _run([*cc, "-c", str(src), "-o", str(obj)])
        objs.append(str(obj))
    elf = work / f"router_bench{board.elf_suffix}"
    link = [board.compiler, *board.link_flags()]
    if board.is_baremetal:
        link += ["-T", str(render_linker_script(board, work / f"{board.name}.ld"))]
    libs = [f"-l{lib}" for lib in board.libs] + [str(p) for p in board.tool_lib_paths()]
    link += ["-o", str(elf), *objs, str(lib_dir / "libcolibri.a")]
    _run([*link, "-Wl,--start-group", *libs, "-Wl,--end-group"])
    return elf


def count(board: Board, elf: Path, tokens: int, rounds: int) -> list[int]:
    """Instructions of each way, checked identical over the interleaved rounds."""
    seen: list[list[int]] = [[] for _ in WAYS]
    line = ""
    with tempfile.TemporaryDirectory(prefix="colibri-router-") as tmp:
        cwd = Path(tmp)
        for _ in range(rounds):
            for way in range(len(WAYS)):
                (cwd / "input.bin").write_bytes(bytes([way]))
                result = run_elf(board, elf, cwd, count_instructions=True)
                found = [s for s in result.stdout.splitlines() if RESULT_MARK in s]
                if not found or result.instructions is None:
                    raise SystemExit(f"{board.name}: no result:\n{result.stdout}{result.stderr}")
                seen[way].append(result.instructions)
                line = found[0]
    print(f"{board.name}: {line.strip()}")
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
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--board", action="append", help="board name (repeatable; default host)")
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
