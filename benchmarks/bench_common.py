"""What the bench scripts (router_table.py, matvec_table.py) share: compiling a bench C file with
a board's platform and linking it for that board, and running it once per mode byte with the
instruction count.

A bench reads its mode from the first byte of ``input.bin`` in its working directory, runs the
measured part between clb_platform_bench_begin() and clb_platform_bench_end() and prints a
result line; :func:`count_modes` returns, per mode, the instructions counted between the
markers (callgrind on the host, QEMU's TCG plugin elsewhere: colibri.targets.qemu) and the
result line.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "codegen"))

from colibri.boards import Board, render_linker_script  # noqa: E402
from colibri.targets.build import build_library as colibri_build_library  # noqa: E402
from colibri.targets.qemu import run_elf  # noqa: E402


def run_cmd(cmd: list[str]) -> None:
    """Run a build step; exit with its output when it fails."""
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")


def build_library(board: Board, lib_dir: Path) -> Path:
    """libcolibri.a for `board`, built by the SConstruct into lib_dir (the CLI's own build
    step, colibri.targets.build)."""
    return colibri_build_library(board.name, lib_dir)


def build_bench(
    board: Board,
    sources: Iterable[Path],
    defines: Sequence[str],
    work: Path,
    name: str,
    library: Path | None = None,
    foreign: Sequence[Path] = (),
    includes: Sequence[Path] = (),
) -> Path:
    """Compile `sources` and the board's platform with the board's compiler, flags and defines
    (plus `defines`, without -D), link them (with `library` if given, and the board's libraries;
    bare metal: the board's linker script) into work/<name><elf suffix>. `foreign`: sources of
    another project (e.g. a CMSIS-NN checkout's) compiled and linked too, with the same flags
    but their warnings not errors (-w); `includes`: more -I directories."""
    ok, why = board.can_build()
    if not ok:
        raise SystemExit(why)
    rt = ROOT / "runtime_c"
    flags = [f"-D{d}" for d in [*board.all_defines(), *defines]]
    cc = [board.compiler, *board.compile_flags(), *flags]
    cc += [f"-I{rt / 'include'}", f"-I{rt / 'tiles'}", f"-I{rt / 'platform'}"]
    cc += [f"-I{d}" for d in includes]
    pdir = rt / "platform" / board.platform
    all_sources = [*sources, *sorted(p for p in pdir.iterdir() if p.suffix in (".c", ".S"))]
    objs = []
    for src in [*all_sources, *foreign]:
        obj = work / "obj" / f"{src.stem}.o"
        obj.parent.mkdir(parents=True, exist_ok=True)
        run_cmd([*cc, *(["-w"] if src in foreign else []), "-c", str(src), "-o", str(obj)])
        objs.append(str(obj))
    elf = work / f"{name}{board.elf_suffix}"
    link = [board.compiler, *board.link_flags()]
    if board.is_baremetal:
        link += ["-T", str(render_linker_script(board, work / f"{board.name}.ld"))]
    libs = [f"-l{lib}" for lib in board.libs] + [str(p) for p in board.tool_lib_paths()]
    link += ["-o", str(elf), *objs]
    if library is not None:
        link.append(str(library))
    run_cmd([*link, "-Wl,--start-group", *libs, "-Wl,--end-group"])
    return elf


def count_modes(board: Board, elf: Path, modes: Iterable[int], mark: str) -> list[tuple[int, str]]:
    """(instructions between the bench markers, the output line containing `mark`) of one run
    of the bench per mode byte."""
    out = []
    with tempfile.TemporaryDirectory(prefix="colibri-bench-") as tmp:
        cwd = Path(tmp)
        for mode in modes:
            (cwd / "input.bin").write_bytes(bytes([mode]))
            result = run_elf(board, elf, cwd, count_instructions=True)
            found = [s for s in result.stdout.splitlines() if mark in s]
            if not found or result.instructions is None:
                raise SystemExit(f"{board.name}: no result:\n{result.stdout}{result.stderr}")
            out.append((result.instructions, found[0]))
    return out
