#!/usr/bin/env python3
"""Guest instructions per multiply-accumulate of the quantised matvecs (fp16 x fp32, int4 x int8,
int4 x fp32, int8 x int8) for given shapes, counted between the bench markers of
benchmarks/matvec_bench.c with QEMU's TCG plugin (callgrind on the host), optionally beside the
same kernels at another git revision (``--rev``), whose outputs must agree bit for bit.

    python benchmarks/matvec_table.py [--board cortex-a53] [--shape 512x128] [--rev d3ac41a]

Defaults: boards cortex-a53, cortex-a7, cortex-a76; shapes 512x128 and 1024x2816 (out x in).
matvec_bench.c, runtime_c/src/kernels_q.c (with its per-ISA headers of runtime_c/arch),
runtime_c/arch/x86_64/*.c (with kernels_x86.h: the x86-64 levels, empty elsewhere; kernels_x86.c
at older revisions) and the board's platform are compiled with
the board's own compiler and flags; with --rev the kernel files are taken from that revision
(``git show``; a file the revision lacks is left out), everything else from the work tree.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "codegen"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_common import build_bench, count_modes  # noqa: E402
from colibri.boards import Board, load_board  # noqa: E402
from colibri.cli.argtypes import add_board_argument, board_help  # noqa: E402

KERNELS = ("fp16 x fp32", "int4 x int8", "int4 x fp32", "int8 x int8")
KERNEL_FILES = (
    "kernels_q.c",
    "kernels_isa.h",
    "kernels_scalar.h",
    "kernels_neon.h",
    "kernels_x86.c",
    "kernels_x86.h",
)
#: The per-ISA kernel files (runtime_c/arch/<isa>/ since issue 36; kernels_neon.h and
#: kernels_x86.c in runtime_c/src before).
ARCH_DIR = "runtime_c/arch"


def kernel_dir(rev: str | None, work: Path) -> Path:
    """runtime_c/src of the work tree, or the kernel files of `rev` copied into work/rev-REV/src
    (and its runtime_c/arch into work/rev-REV/arch, the same relative place)."""
    if rev is None:
        return ROOT / "runtime_c" / "src"
    out = work / f"rev-{rev}" / "src"
    out.mkdir(parents=True, exist_ok=True)
    names = [f"runtime_c/src/{name}" for name in KERNEL_FILES]
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-tree", "-r", "--name-only", rev, ARCH_DIR + "/"],
        capture_output=True,
        text=True,
        check=False,
    )
    names += listed.stdout.split() if listed.returncode == 0 else []
    for name in names:
        proc = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{rev}:{name}"],
            capture_output=True,
            check=False,
        )
        if proc.returncode == 0:
            dest = out.parent / Path(name).relative_to("runtime_c")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(proc.stdout)
    return out


def build(board: Board, shape: tuple[int, int], src: Path, work: Path) -> Path:
    sources = [ROOT / "benchmarks" / "matvec_bench.c", src / "kernels_q.c"]
    # the x86-64 levels kernels_q.c dispatches to (they compile to nothing on other boards)
    if (src / "kernels_x86.c").exists():
        sources.append(src / "kernels_x86.c")
    sources += sorted((src.parent / "arch" / "x86_64").glob("*.c"))
    defines = [f"MB_OUT={shape[0]}", f"MB_IN={shape[1]}"]
    return build_bench(board, sources, defines, work, "matvec_bench")


def count(board: Board, elf: Path) -> list[tuple[int, str]]:
    """(instructions, output hash) of each kernel."""
    out = []
    for n, line in count_modes(board, elf, range(len(KERNELS)), "matvec bench:"):
        found = re.search(r"matvec bench: (\d+)", line)
        if found is None:
            raise SystemExit(f"{board.name}: no result in {line!r}")
        out.append((n, found.group(1)))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_board_argument(
        p,
        None,
        action="append",
        help=board_help(None, "board (repeatable; default the Cortex-A boards)"),
    )
    p.add_argument("--shape", action="append", help="OUTxIN (repeatable)")
    p.add_argument("--rev", help="also count the kernels of this git revision")
    p.add_argument("--workdir", default=str(ROOT / "build" / "matvec_table"))
    a = p.parse_args(argv)
    boards = a.board or ["cortex-a53", "cortex-a7", "cortex-a76"]
    shapes: list[tuple[int, int]] = []
    for text in a.shape or []:
        n_out, n_in = text.lower().split("x")
        shapes.append((int(n_out), int(n_in)))
    shapes = shapes or [(512, 128), (1024, 2816)]
    head = f"{'board':11} {'shape':>10} {'kernel':12} {'instr/MAC':>10}"
    if a.rev:
        head += f" {a.rev + ' instr/MAC':>22} {'ratio':>6}  outputs"
    print(head)
    failed = False
    for name in boards:
        board = load_board(name)
        for shape in shapes:
            tag = f"{shape[0]}x{shape[1]}"
            work = Path(a.workdir) / name / tag
            now = count(board, build(board, shape, kernel_dir(None, work), work / "now"))
            before = None
            if a.rev:
                src = kernel_dir(a.rev, work)
                before = count(board, build(board, shape, src, work / "rev"))
            macs = shape[0] * shape[1]
            for k, kernel in enumerate(KERNELS):
                row = f"{name:11} {tag:>10} {kernel:12} {now[k][0] / macs:>10.2f}"
                if before is not None:
                    same = before[k][1] == now[k][1]
                    failed |= not same
                    row += f" {before[k][0] / macs:>22.2f} {before[k][0] / now[k][0]:>5.2f}x"
                    row += "  identical" if same else "  DIFFER"
                print(row, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
