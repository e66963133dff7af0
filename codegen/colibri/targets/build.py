"""Build a generated model for a board by calling the SConstruct (SCons 4)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..boards import Board, load_board
from ..emit.output import MANIFEST
from ..errors import BudgetExceeded, BuildError, ColibriError, StackUsageError, ToolchainNotFound
from ..paths import resource_dir
from ..progress import SILENT, Progress


def require_toolchain(board: Board) -> None:
    """Raise ToolchainNotFound (with the install hint) if the board cannot be built here."""
    ok, why = board.can_build()
    if not ok:
        raise ToolchainNotFound(why)


def model_name(gen_dir: Path) -> str:
    """The generated model's directory name (SConstruct names the runner after it)."""
    return gen_dir.resolve().name


def build_dir_for(gen_dir: Path, board: Board) -> Path:
    return gen_dir.resolve() / "build" / board.name


def runner_path(gen_dir: Path, board: Board) -> Path:
    suffix = ".elf" if board.kind == "baremetal" else ""
    return build_dir_for(gen_dir, board) / model_name(gen_dir) / f"colibri_runner{suffix}"


def check_generated(gen_dir: Path) -> dict:
    """Read the manifest of a generated directory, with a clear error if it is not one."""
    manifest = gen_dir / MANIFEST
    if not manifest.is_file():
        raise ColibriError(
            f"{gen_dir}: not a generated model directory (no {MANIFEST}); run "
            f"`colibri generate MODEL --out {gen_dir}` first"
        )
    data: dict = json.loads(manifest.read_text())
    return data


def scons(
    args: list[str], verbose: bool = False, progress: Progress = SILENT
) -> subprocess.CompletedProcess[str]:
    """Run SCons on the project's SConstruct with the given arguments (`progress`: a "build"
    line counting its steps)."""
    cmd = [sys.executable, "-m", "SCons", "-Q", "-C", str(resource_dir()), *args]
    env = dict(os.environ)
    with _build_dir_lock(args):
        if progress.visible and not verbose:
            proc = _scons_counted(cmd, env, progress)
        else:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if verbose:
        sys.stderr.write(proc.stdout + proc.stderr)
    return proc


@contextmanager
def _build_dir_lock(args: list[str]) -> Iterator[None]:
    """Hold an exclusive lock on the build directory named by ``build_dir=`` while SCons runs:
    two colibri commands (or two test workers) building the same library or model-file runner
    at once wait for each other instead of writing the same objects together. The lock is
    ``<build_dir>/.colibri.lock`` (flock, released with the process). No lock without
    ``build_dir=`` (every caller here names one) or without fcntl (not POSIX)."""
    named = [a.split("=", 1)[1] for a in args if a.startswith("build_dir=")]
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        named = []
    if not named:
        yield
        return
    target = Path(named[-1]).resolve()
    target.mkdir(parents=True, exist_ok=True)
    with open(target / ".colibri.lock", "a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


#: A build step as the SConstruct prints it: "CC      [host] path/to/file.o".
_STEP = re.compile(r"^([A-Z]+)\s+\[[^]]*\]\s+(\S+)")


def _scons_counted(
    cmd: list[str], env: dict[str, str], progress: Progress
) -> subprocess.CompletedProcess[str]:
    """SCons with its output read as it comes, each build step counted on the progress line
    (stderr is drained by a thread, so neither pipe can fill up)."""
    err: list[str] = []
    out: list[str] = []
    with progress.stage("build") as st:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        assert proc.stdout is not None and proc.stderr is not None
        drain = threading.Thread(target=lambda f=proc.stderr: err.extend(f), daemon=True)
        drain.start()
        steps = 0
        for line in proc.stdout:
            out.append(line)
            m = _STEP.match(line)
            if m:
                steps += 1
                st.update(steps, f"step {steps}: {m.group(1)} {Path(m.group(2)).name}")
        drain.join()
        proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode, "".join(out), "".join(err))


#: Lines of a failed build worth showing: the compiler's and linker's own diagnostics (cc1's
#: "virtual memory exhausted" has no "error" in it) and the SConstruct's colibri messages.
_DIAGNOSTIC = re.compile(
    r"error|fatal|exhausted|out of memory|killed|undefined reference|colibri", re.IGNORECASE
)


def _fail(proc: subprocess.CompletedProcess[str], what: str) -> None:
    out = (proc.stdout + proc.stderr).strip().splitlines()
    errors = [line for line in out if _DIAGNOSTIC.search(line)]
    tail = "\n".join((errors or out)[-25:])
    stack = [line for line in out if line.startswith("colibri: stack ")]
    if stack:  # the SConstruct's stack check (colibri/targets/stack.py)
        message = stack[-1][len("colibri: ") :]
        if message.startswith("stack budget exceeded"):
            raise BudgetExceeded(f"{what}: {message}")
        raise StackUsageError(f"{what}: {message}")
    overflow = [line for line in out if "overflow" in line.lower()]
    if overflow:
        raise BudgetExceeded(
            f"{what}: the firmware does not fit the board:\n"
            + "\n".join(overflow[-5:])
            + "\nRun `colibri size` on a smaller build, or reduce --max-tokens"
        )
    raise BuildError(f"{what} failed (scons exit {proc.returncode}):\n{tail}")


def build_library(
    board_name: str,
    build_dir: Path | None = None,
    verbose: bool = False,
    progress: Progress = SILENT,
) -> Path:
    """Build libcolibri.a for a board; returns its path."""
    board = load_board(board_name)
    require_toolchain(board)
    bdir = (build_dir or resource_dir() / "build" / board.name).resolve()
    proc = scons([f"board={board.name}", f"build_dir={bdir}"], verbose, progress)
    if proc.returncode != 0:
        _fail(proc, f"building libcolibri.a for {board.name}")
    return bdir / "libcolibri.a"


def build_model(
    gen_dir: str | os.PathLike[str],
    board_name: str,
    verbose: bool = False,
    *,
    stack_size: int | None = None,
    stack_check: bool = True,
    build_dir: Path | None = None,
    progress: Progress = SILENT,
) -> Path:
    """Build the runner of a generated model for a board; returns the ELF / executable.

    Bare metal: ``stack_size`` overrides the board file's stack_size; ``stack_check=False``
    keeps the worst-case stack report but does not fail on it (to exercise the run-time guard).
    ``build_dir`` replaces the default ``<gen_dir>/build/<board>``."""
    gdir = Path(gen_dir).resolve()
    check_generated(gdir)
    board = load_board(board_name)
    require_toolchain(board)
    bdir = build_dir.resolve() if build_dir else build_dir_for(gdir, board)
    args = [f"board={board.name}", f"model={gdir}", f"build_dir={bdir}"]
    if stack_size is not None:
        args.append(f"stack_size={stack_size}")
    if not stack_check:
        args.append("stack_check=0")
    proc = scons(args, verbose, progress)
    if proc.returncode != 0:
        _fail(proc, f"building {gdir.name} for {board.name}")
    exe = bdir / model_name(gdir) / runner_path(gdir, board).name
    if not exe.is_file():
        raise BuildError(f"build finished but {exe} was not produced")
    return exe
